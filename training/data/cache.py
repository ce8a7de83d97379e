"""Tables every rank derives identically, computed once per node and memory-mapped by the rest.

At 1.5B documents the split's block table (a ~10 CPU-second scan of the index) and each epoch's
block order (~4 CPU-seconds) are the same in every rank and every DataLoader worker; 8 ranks
computing them at once on a box with few cores wait minutes. `shared()` lets the first process
(a file lock decides which) compute and save the table under the cache directory, keyed by
everything it depends on; the others wait on the lock, then memory-map the saved arrays (one
page-cache copy, like the index). Any trouble — a read-only home, a damaged entry — falls back to
computing in-process, with a warning: the cache can make an open slower, never wrong. An entry's files
are checked against the sha256 saved beside them at every load: an array's shape and its totals do not
tell a damaged entry (two blocks of an epoch's order swapped read a whole epoch in another order, exit 0:
review R30b F2).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from training.contract.config_loader import json_sha256
from training.contract.dataset_format import file_sha256
from training.contract.file_lock import file_lock
from training.contract.object_store import user_cache_dir

log = logging.getLogger("training.data.loader")
T = TypeVar("T")
MIN_DOCS = 1 << 24  # below ~16M documents the tables take < 1 s: no cache files
DIGESTS = "sha256.json"  # each file of an entry's sha256, written with it


def cache_dir() -> Path:
    """$GRISTMILL_CACHE, else $XDG_CACHE_HOME/gristmill/loader, else ~/.cache/gristmill/loader."""
    if os.environ.get("GRISTMILL_CACHE"):
        return Path(os.environ["GRISTMILL_CACHE"])
    return user_cache_dir() / "loader"


def shared(
    kind: str,
    key: dict[str, Any],
    compute: Callable[[], T],
    save: Callable[[T, Path], None],
    load: Callable[[Path], T],
    docs: int,
) -> T:
    """`load(entry)` of the cache entry for (kind, key), made by `compute` + `save` if missing.

    `save` writes into a fresh directory; it becomes the entry by an atomic rename. `load` raises
    OSError or ValueError for an entry that does not fit, which is then recomputed. Tables over
    fewer than MIN_DOCS documents are just computed.
    """
    if docs < MIN_DOCS:
        return compute()
    digest = json_sha256({"kind": kind, **key}, compact=False)[:24]
    path = cache_dir() / f"{kind}-{digest}"
    lock = contextlib.ExitStack()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.enter_context(file_lock(path.with_suffix(".lock")))
    except OSError as e:
        log.warning("loader: cannot share %s through %s (%s); computing it here", kind, path, e)
        return compute()
    with lock:
        try:
            _check(path)
            return load(path)
        except (OSError, ValueError) as e:
            if path.exists():
                log.warning("loader: recomputing the damaged cache entry %s (%s)", path, e)
                shutil.rmtree(path, ignore_errors=True)
        table = compute()  # its own errors propagate: they are not the cache's
        tmp = path.with_name(f"{path.name}.{os.uname().nodename}.{os.getpid()}.tmp")
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            save(table, tmp)
            (tmp / DIGESTS).write_text(json.dumps(_digests(tmp)))
            os.replace(tmp, path)
            return load(path)
        except (OSError, ValueError) as e:  # a full or read-only disk: keep the table computed here
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("loader: cannot save %s to %s (%s); using it unshared", kind, path, e)
            return table


def _digests(entry: Path) -> dict[str, str]:
    """{file name: sha256} of an entry's files."""
    return {f.name: file_sha256(f) for f in sorted(entry.iterdir()) if f.name != DIGESTS}


def _check(entry: Path) -> None:
    """OSError where the entry or its record is missing (an entry of an older version has none),
    ValueError where its files are not the ones saved."""
    if json.loads((entry / DIGESTS).read_text()) != _digests(entry):
        raise ValueError("its files are not the ones saved (their sha256 differ)")
