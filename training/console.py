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

    def __init__(self, stream: Any):
        self.stream = stream
        self.gone = False

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
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # a stream without a file descriptor
            pass


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
        runs several in one process)."""
        previous = self.rank, self.stream
        self.rank, self.stream = rank, out if out is not None else ReaderSafeOut(sys.stdout)
        try:
            yield
        finally:
            self.rank, self.stream = previous


console = Console()
say = console.say
