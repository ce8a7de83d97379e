"""Quiet eval output: lm-eval's, transformers' and datasets' own chatter goes to a log file.

An lm-eval run writes ~150 lines to the terminal: tqdm bars (to sys.stderr), log records of
lm-eval, transformers, datasets, accelerate and evaluate (the `Truncating …` warnings), and
`fatal: not a git repository` from the `git describe` that lm-eval runs to record the commit (a
subprocess: it writes to file descriptor 2, not to sys.stderr). Inside `eval_output(log, verbose)`
all of that is appended to `log` instead — Python's sys.stdout/sys.stderr, file descriptors 1 and 2
(for subprocesses) and those libraries' loggers — and the block gets the terminal's stream for its
own progress lines. With verbose, the terminal shows everything as before and the log records go
to the log file as well.

Used by `gristmill eval` (RUN/eval/step-N/eval.log) and the in-training eval. While the block runs,
every write of this process to stdout/stderr lands in the log, from any thread, but the run's
console's: a training run's `say` prints to a copy of fd 1 taken at its start (training/console.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

LIBRARY_LOGGERS = ("lm_eval", "lm-eval", "transformers", "datasets", "accelerate", "evaluate")
_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"


@contextmanager
def eval_output(log_file: str | Path, verbose: bool = False) -> Iterator[TextIO]:
    """Within the block, the libraries' logs, bars and subprocess output are appended to `log_file`
    (created with its parent directories); yields the stream that reaches the terminal (the
    caller's sys.stderr), for the caller's own lines. `verbose`: nothing is hidden, the log
    records also go to `log_file`."""
    log_file = Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8", errors="backslashreplace", buffering=1) as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n")
        with _library_logs(log, sys.stderr if verbose else None):
            if verbose:
                yield sys.stderr
            else:
                with _redirected(log) as terminal:
                    yield terminal


@contextmanager
def _library_logs(log: TextIO, terminal: TextIO | None) -> Iterator[None]:
    """The library loggers' records go to `log` (and `terminal` when given) only: their own handlers
    (transformers' and datasets' StreamHandlers bound to the sys.stderr of import time) are set
    aside and nothing propagates to the root logger (whose last-resort handler prints warnings).
    lm-eval logs at INFO (which requests it runs, truncations): the level it would have from its
    own CLI."""
    formatter = logging.Formatter(_FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(log)]
    if terminal is not None:
        handlers.append(logging.StreamHandler(terminal))
    for h in handlers:
        h.setFormatter(formatter)
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate, logger.level))
        logger.handlers = handlers[:]
        logger.propagate = False
        if name.startswith("lm") and logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, old_handlers, propagate, level in saved:
            logger.handlers, logger.propagate = old_handlers, propagate
            logger.setLevel(level)
        for h in handlers:
            h.flush()


def _fd_stream(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # pytest's capsys, io.StringIO, a closed stream
        return False


@contextmanager
def _redirected(log: TextIO) -> Iterator[TextIO]:
    """sys.stdout, sys.stderr and file descriptors 1 and 2 write into `log`; yields a stream to
    where sys.stderr wrote before (a duplicate of the old fd 2 when sys.stderr wrote to it)."""
    old_out, old_err = sys.stdout, sys.stderr
    for s in (old_out, old_err):
        s.flush()
    saved: dict[int, int] = {}
    for fd in (1, 2):
        try:
            saved[fd] = os.dup(fd)
        except OSError:  # closed (a daemon): nothing of it to redirect
            continue
    terminal: TextIO = old_err
    own_terminal = 2 in saved and _fd_stream(old_err, 2)
    if own_terminal:
        terminal = open(  # noqa: SIM115  closed below, after the block
            os.dup(saved[2]), "w", encoding=getattr(old_err, "encoding", None) or "utf-8",
            errors="backslashreplace", buffering=1,
        )  # fmt: skip
    try:
        for fd in saved:
            os.dup2(log.fileno(), fd)
        sys.stdout = sys.stderr = log
        yield terminal
    finally:
        log.flush()
        sys.stdout, sys.stderr = old_out, old_err
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        if own_terminal:
            terminal.close()
