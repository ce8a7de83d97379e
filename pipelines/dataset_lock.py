"""One writer of a local dataset directory at a time: `gristmill data build` (its output),
`gristmill data index`, `gristmill data convert` (the folder NEW is written in) and `gristmill data
decontam-index` (its --out: two into one folder left one's n-grams beside the other's manifest, trial
RV60b 2) take the same lock, OUTPUT/.build.lock. Two indexes at once removed each
other's index.tmp/ (a traceback: review R17e E3); an index beside a build's finalize would derive
from a manifest being written.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from training.contract.errors import GristmillError, unwritable

LOCK = ".build.lock"


class DatasetBusyError(GristmillError):
    """Another gristmill process is writing the dataset directory."""


@contextlib.contextmanager
def dataset_lock(
    out: Path, what: str, read_only_ok: bool = False, writing: str | None = None, key: str = "output"
) -> Iterator[None]:
    """Hold `out`'s lock while `what` (e.g. "`gristmill data build`") writes it; refused in one line
    when another process holds it. `read_only_ok`: a directory nothing can write (a read-only mount)
    has no writer to exclude: `what` goes on unlocked (`data index` of an intact index writes nothing).
    `writing`: what the refusal says is being written, when not `out` (a conversion's NEW); `key`:
    the setting that named `out`."""
    f = _open(out, read_only_ok, key)
    if f is None:
        yield
        return
    with f:
        # A POSIX record lock, not flock: it belongs to this process alone, so a process forked from
        # it (datatrove's manager, a pool worker) that outlives it cannot hold the build's lock.
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise DatasetBusyError(
                "another `gristmill data build`, `data index`, `data convert` or `data decontam-index` is "
                f"writing {writing or out}; wait for it to finish, then run {what} again"
            ) from None
        yield


def _open(out: Path, read_only_ok: bool, key: str) -> IO[str] | None:
    """The lock file, opened (and `out` made); None for a read-only directory when `read_only_ok`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        return open(out / LOCK, "w")
    except (FileExistsError, NotADirectoryError):
        parent = next(p for p in (out, *out.parents) if p.exists())
        raise DatasetBusyError(
            f"{key} {out} cannot be a directory: {parent} is a file; set `{key}` to a directory path"
        ) from None
    except OSError as e:
        if read_only_ok and out.is_dir() and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return None
        raise unwritable(out, e) from None
