"""A lock held by another process: what a running `gristmill data build`, `data index` or `data
convert` holds on its output's `.build.lock` (pipelines/dataset_lock.py). POSIX record locks belong to
a process, so the one under test could not be refused by a lock it took itself."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

_HOLD = (
    "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
    "print(1, flush=True); time.sleep(60)"
)


@contextlib.contextmanager
def held_elsewhere(path: Path) -> Iterator[None]:
    """`path` locked (lockf) by a child process while inside; the child is killed on the way out, as a
    killed writer's lock goes."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"1\n"
        yield
    finally:
        holder.kill()
        holder.wait()
