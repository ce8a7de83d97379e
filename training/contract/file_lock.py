"""An exclusive lock on a file, for the processes of one node and the threads of one process: the
cache's downloads and fetches (training/data/remote.py, block_cache.py) and the eval results' merges
(validation/eval_results.py: the trainer's eval and `gristmill eval --watch` write one step's file)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

_HELD: set[int] = set()  # descriptors of the file locks this process holds (file_lock)


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` while inside: the node's processes, and this process's threads,
    take turns (flock holds per open file; the kernel releases it when its holder dies). A process
    forked meanwhile (a DataLoader worker, while the prefetcher thread holds the lock) shares the
    lock through its copy of the descriptor: the lock is released explicitly on the way out, never
    by closing (which would leave it to the copy for the child's life), and the child closes its copy."""
    with open(path, "a") as f:
        _HELD.add(f.fileno())
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield
        finally:
            _HELD.discard(f.fileno())
            fcntl.flock(f, fcntl.LOCK_UN)
