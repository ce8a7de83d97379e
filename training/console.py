"""The run's one printer: rank 0's lines on the terminal, nothing from the other ranks.

Every part of a run (setup, the loop, the checkpointer, metrics rows, the rewinder) says what it
has to say through `say`; none is handed a printer. `train()` binds the console to its rank and its
output for the run (`console.bound`); outside a run (export, eval, a test calling a component) it
prints to standard output. Its stream survives a reader that goes away (`gristmill train … | head
-3`, a closed terminal): the first BrokenPipeError, or other error of the stream (EIO from a tty
that hung up), stops the printing, never the run, which goes on writing metrics.jsonl and checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class ReaderSafeOut:
    """A text stream whose reader may go away: after the first error writing to it (BrokenPipeError;
    EIO from a terminal that hung up without a SIGHUP: a disowned job, a killed tmux pane) it drops
    what it is given, and fd 1 points at /dev/null so the interpreter's exit flush is quiet too."""

    def __init__(self, stream: Any, copy_of_stdout: bool = False):
        self.stream = stream
        self.gone = False
        self.copy_of_stdout = copy_of_stdout  # `stream` writes to a duplicate of fd 1 (Console.bound)

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except OSError as e:
                self._reader_gone(e)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except OSError as e:
                self._reader_gone(e)

    def _reader_gone(self, error: OSError) -> None:
        self.gone = True
        if error.errno not in (errno.EPIPE, errno.EIO):  # not a reader gone (a full disk under a log): say so
            with contextlib.suppress(OSError):
                line = f"note: printing stopped ({error}); the run goes on, metrics.jsonl has every row\n"
                os.write(2, line.encode())
        fds = [1] if self.copy_of_stdout else []  # fd 1 too: the interpreter's exit flush
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream without a descriptor
            fds.append(self.stream.fileno())
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in fds:
                os.dup2(devnull, fd)
            os.close(devnull)


def _stdout_copy() -> TextIO | None:
    """A stream to where file descriptor 1 points now (a duplicate of it), when sys.stdout writes
    to it; None otherwise (a test's capture)."""
    try:
        if sys.stdout.fileno() != 1:
            return None
        sys.stdout.flush()
        return open(  # noqa: SIM115  closed by `bound`
            os.dup(1), "w", encoding=sys.stdout.encoding or "utf-8",
            errors=getattr(sys.stdout, "errors", None) or "strict", buffering=1,
        )  # fmt: skip
    except (AttributeError, OSError, ValueError):  # no descriptor, or fd 1 closed (a daemon)
        return None


class Console:
    """Where `say` prints: rank 0's stream during a run, standard output otherwise."""

    def __init__(self) -> None:
        self.rank = 0
        self.stream: TextIO | ReaderSafeOut | None = None  # None: sys.stdout as it is at the call

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, file=self.stream or sys.stdout, flush=True)

    @contextlib.contextmanager
    def bound(self, rank: int, out: Any = None) -> Iterator[None]:
        """For one run: print on rank 0 only, to `out` (default: this process's stdout, made safe
        against a reader that goes away); the previous binding afterwards (a test or the demo
        runs several in one process). The default writes to a duplicate of file descriptor 1 taken
        here: an eval that points fds 1 and 2 at its eval.log (validation/eval_output.py) does not
        take the lines other threads say meanwhile (retention's "deleted checkpoint(s) N" went
        into RUN/eval/step-N/eval.log: review RV26b 3b)."""
        previous = self.rank, self.stream
        copy = _stdout_copy() if out is None else None
        if out is None:
            out = ReaderSafeOut(sys.stdout) if copy is None else ReaderSafeOut(copy, copy_of_stdout=True)
        self.rank, self.stream = rank, out
        try:
            yield
        finally:
            self.rank, self.stream = previous
            if copy is not None:
                with contextlib.suppress(OSError):
                    copy.close()


console = Console()
say = console.say


@contextlib.contextmanager
def answer_on_stdout() -> Iterator[None]:
    """For a command whose standard output is its answer, compared or parsed line by line (`data
    inspect --hash`, `data audit --format csv`): what the code under it says meanwhile (a wait for a
    bucket cache's lock, a note on the cache) goes to standard error. A "waiting for …/.lock" line
    among a bucket's hashes made them differ from the local copy's. A reader of standard error gone
    stops those lines, never the answer (review RV29c F1: exit 141, standard output empty)."""
    with console.bound(0, ReaderSafeOut(sys.stderr)):
        yield
