"""User-facing errors: every stage raises a subclass, and the CLI prints it as one line, no traceback;
the standard streams they go to, held open at each entry point (`hold_closed_streams`)."""

import atexit
import contextlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class GristmillError(ValueError):
    """Bad input or config. The message names the file or key and says how to fix it. `cause`: what
    happened, without the message's next steps for the command's user (a caller that runs the
    command itself, the mixture search, words its own); the whole message where none is given."""

    exit_code = 2  # the CLI's exit status for it

    def __init__(self, *args: Any, cause: str | None = None):
        super().__init__(*args)
        self.cause = cause if cause is not None else (str(args[0]) if args else "")


INTERRUPTED_EXIT = 130  # 128 + SIGINT: a command stopped by Ctrl-C, as a shell reports it
TERMINATED_EXIT = 143  # 128 + SIGTERM


def interrupted(by: str) -> str:
    """The line of a command stopped by `by` (Ctrl-C, SIGTERM) where no handler of its own took it."""
    return f"interrupted ({by}): nothing after the last line above was done"


INTERRUPTED = interrupted("Ctrl-C")


class Terminated(BaseException):
    """A SIGTERM that no handler of the command took (`sigterm_raises`): the command ends as a Ctrl-C
    there does, with one line, where the signal's default action ended it without a word."""


@contextlib.contextmanager
def sigterm_raises():
    """SIGTERM raises Terminated inside (the main thread only has handlers), as SIGINT raises
    KeyboardInterrupt: `gristmill train` in its own process, whose setup (a checkpoint's load, the
    model's build) a scheduler's SIGTERM ended with exit 143 and nothing said (review RV43a F6). The
    loop's own handler (training/run/shutdown.py) takes it meanwhile: it saves."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def unwritable(where: str | Path, e: OSError) -> GristmillError:
    """The one line for a directory that cannot be written (read-only, permissions, full disk)."""
    return GristmillError(
        f"cannot write {e.filename or where}: {e.strerror or e}; make {where} writable (or free space), or "
        "write somewhere else"
    )


def refuse_empty(options: dict[str, str | None], required: bool = False) -> None:
    """Options given as "" (an unset shell variable: `--db "$DB"`), each read as not given without a
    word: no file written, the hub instead of `--from`, the config's path instead of `--out`, the
    working directory (review R22a A7–A9, A11; R22d S1–S3). `options`: flag → value, None when it was
    not given; `required`: options a command cannot do without (no leaving them out: R22e 7)."""
    for flag, value in options.items():
        if value is not None and not str(value).strip():
            raise GristmillError(
                f"{flag} {json.dumps(value)}: name a path" + ("" if required else ", or leave the option out")
            )


class NonFiniteError(GristmillError):
    """Training produced a NaN or inf (loss, gradient, weights); nothing non-finite was saved.
    The CLI exits with `exit_code` so a scheduler can tell divergence from bad input."""

    exit_code = 3


def hold_closed_streams() -> None:
    """/dev/null in place of a stdout or stderr the process started without (`gristmill train … >&-`:
    a daemon, a scheduler's wrapper); called first by each entry point (the `gristmill` CLI, a torchrun
    worker's `-m training.train`), before anything opens a file. Python set sys.stdout to None, and
    the first file the run opened took descriptor 1: a print raised AttributeError before step 1
    (review R26a F5), and whatever writes to fd 1 (a child process, an eval's redirection, a
    library's C code) would have written into that file. So a closed stdout only stops the printing,
    as a reader gone does (training/console.py)."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            continue
        except OSError:  # EBADF: closed
            pass
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)  # dup2's copy is inheritable
            os.close(null)
        else:  # opened as fd itself: non-inheritable, so a child (torchrun's workers) started without it
            os.set_inheritable(fd, True)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w", closefd=False, buffering=1))  # noqa: SIM115  the process's own


def print_error(error: GristmillError) -> int:
    """`error: MESSAGE` on standard error; returns the error's exit status. A reader that went away
    (`… 2>&1 | head`, a terminal that hung up) loses the line, never the status it comes with (the
    print raised inside the caller's handler: exit 1, where a diverged run is 3); the stream's
    descriptor then points at /dev/null, so the interpreter's exit flush is quiet too."""
    try:
        print(f"error: {error}", file=sys.stderr, flush=True)
    except OSError:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
    return error.exit_code


def wrapped(error: BaseException | None) -> Iterator[BaseException]:
    """`error`, then the one it wraps (its cause, else its context), and so on, each once: where a
    library's exception hides the one that says what happened."""
    seen: list[BaseException] = []
    while error is not None and not any(error is s for s in seen):
        seen.append(error)
        yield error
        error = error.__cause__ or error.__context__


_PEER_GONE = ("Connection reset by peer", "Connection closed by peer")  # not "Broken pipe": a closed stdout


def peer_gone(error: BaseException) -> str | None:
    """The first line of `error`, or of one it wraps, when it is a collective's transport failing
    because the other end is gone (gloo's "Connection reset by peer", "Connection closed by peer"),
    else None."""
    for inner in wrapped(error):
        if any(p in str(inner) for p in _PEER_GONE):
            # gloo's "[…/pair.cc:553] Connection closed by peer [127.0.0.1]:37287. This is typically …"
            first = str(inner).strip().splitlines()[0]
            return re.sub(r"^\[[^\]]*\]\s*", "", first).split(". ")[0][:200]
    return None


def exit_on_signal_with(code: int, what: str | None) -> None:
    """From here to this process's exit, its teardown (torch's and the interpreter's: seconds), a
    SIGTERM or SIGINT ends it at once with `code`, the status already decided, not the signal's: a
    scheduler's time limit there marked a complete run failed, "killed by SIGTERM" and 143 (trial RV55b
    1). `what` (None: silent) is said in a note: `note: SIGTERM after WHAT: exiting with CODE`. Only for
    a process of its own (an in-process caller's signals are its own: review RV55e 3)."""

    def decided(signum: int, frame) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            if what is not None:
                name = signal.Signals(signum).name
                os.write(2, f"note: {name} after {what}: exiting with {code}\n".encode())
        os._exit(code)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, decided)
    _DECIDED.append(code)


_DECIDED: list[int] = []  # the status exit_on_signal_with decided, once it has


@atexit.register  # at this module's import, before torch's (training/__init__.py): the last to run
def _signals_ignored_in_the_last_teardown() -> None:
    """Python gives a signal it handles its default action back as its finalization begins, after the
    atexit callbacks and before the modules' teardown (torch's objects: up to a second), where a
    SIGTERM then killed a complete run: "killed by SIGTERM", 143 (trial RV59c 1), and a Ctrl-C just
    after the closing line 130, each rank "killed by SIGINT" (trial RV65b 2). Both ignored from here
    on, which that leaves as it is: the status decided stands (a teardown that hangs there ends with
    SIGKILL)."""
    if _DECIDED and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
