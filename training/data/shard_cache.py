"""Where a dataset's shards are read from: in place, or from the node's bounded, verified cache.

`shard_source(root, info, cache)` gives the reader (training/data/reader.py) one of two:

- `LocalShards`: a local dataset's shards/ directory, read in place (the trivial fetch);
- `CachedShards`: a bucket's dataset (training/data/remote.py). `path(s)` is the shard's file in the
  cache; a reader that does not find it there calls `fetch(s)`: under the node lock (so a shard is
  downloaded once however many ranks and DataLoader workers ask for it), room is made first, then
  the object is downloaded under a temporary name, checked against dataset.json's sha256 (fetched
  once more if it differs, then refused naming the shard) and renamed into place — a reader maps
  only whole, verified files. A file evicted while a process has it mapped stays readable to that
  process (the inode lives until unmapped), so eviction never tears a read; a process lets go of
  such maps after its next download, so their disk space returns.

Eviction (`make_room`) deletes only the cache's own shard files (`<fingerprint>/shards/*.tar` in a
directory with remote.ORIGIN) and the temporary files of dead processes; it spares every file in a
live loader's keep list, then goes least recently needed first, until the new shard fits
`[data] cache_gb`. With downloads one at a time and the keep lists sized to leave room for one
shard, the cache exceeds its bound by at most the shard being downloaded.

`Prefetcher` runs in each rank's loader (training/data/loader.py): it walks the plan from the step
being consumed, fetches the shards of the next steps in the order the plan first reads them, as
far as the bound allows, and publishes them (with those of the last few steps, for ranks a step
behind) as this process's keep list. Once the cache holds every shard of its datasets it stops
planning (it would cost as much as building the batches) and keeps them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import SHARDS_DIR, DatasetError
from training.contract.object_store import ObjectStore
from training.data.remote import ORIGIN, CacheSettings, fetch_verified, host, node_lock, origin

KEEP_DIR = "keep"
_DOWNLOADS = [0]  # shards this process downloaded (CachedShards.downloads)
LAG_STEPS = 2  # steps behind the consumer whose shards stay protected (ranks a step behind)
MAX_AHEAD_STEPS = 64  # how far the prefetcher plans ahead at most


class LocalShards:
    """A local dataset's shards, read in place."""

    in_place = True
    downloads = 0  # never: see CachedShards.downloads

    def __init__(self, root: Path, names: list[str]):
        self.root, self.names = root, names

    def path(self, shard: int) -> Path:
        return self.root / SHARDS_DIR / self.names[shard]

    def fetch(self, shard: int) -> bool:
        return False  # read in place: a missing shard stays missing (the reader's open says so)


class CachedShards:
    """A bucket's dataset's shards, through the node's bounded cache (the module docstring).
    `downloads` counts this process's downloads of any cache: after one (which may have evicted
    shards), a reader lets go of its maps of shards no longer in the cache."""

    in_place = False

    def __init__(self, root: Path, info: dict[str, Any], cache: CacheSettings):
        self.root, self.cache, self.url = root, cache, origin(root)
        self.names = sorted(info["shard_files"])
        self.sizes = [int(info["shard_files"][n]["bytes"]) for n in self.names]
        self.sha256 = [info["shard_files"][n]["sha256"] for n in self.names]
        self.store = ObjectStore(self.url)
        # Shards that failed their check twice: not fetched again by this process.
        self.refused: dict[int, DatasetError] = {}

    @property
    def downloads(self) -> int:
        return _DOWNLOADS[0]

    def path(self, shard: int) -> Path:
        """Where the shard's verified file is once fetched (no I/O: the reader opens it, and calls
        `fetch` when it is not there)."""
        return self.root / SHARDS_DIR / self.names[shard]

    def fetch(self, shard: int) -> bool:
        """Download the shard unless the cache has it (True if it was downloaded here)."""
        p = self.path(shard)
        if p.is_file() and shard not in self.refused:
            return False
        with node_lock(self.cache.dir):
            if shard in self.refused:  # the prefetcher's verdict: the reader gets the same line
                raise self.refused[shard]
            if p.is_file():
                return False
            p.parent.mkdir(parents=True, exist_ok=True)
            make_room(self.cache, self.sizes[shard], protect={p})
            rel = f"{SHARDS_DIR}/{self.names[shard]}"
            try:
                fetch_verified(self.store, rel, p, self.sizes[shard], self.sha256[shard])
            except DatasetError as e:
                self.refused[shard] = e
                raise
            _DOWNLOADS[0] += 1
            return True


def shard_source(root: Path, info: dict[str, Any], cache: CacheSettings | None) -> LocalShards | CachedShards:
    """The shards of the dataset opened at `root` (remote.local_root): cached for a bucket's dataset."""
    if origin(root) is None:
        return LocalShards(root, sorted(info["shard_files"]))
    return CachedShards(root, info, cache or CacheSettings.of())


# --------------------------------------------------------------------------------------------
# eviction


def cache_usage(cache_dir: Path) -> list[tuple[Path, int, float]]:
    """(file, bytes, last needed) of every shard file the cache holds (only its own: cache_files)."""
    out = []
    for path in cache_files(cache_dir):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((path, st.st_size, st.st_mtime))
    return out


def cache_files(cache_dir: Path) -> list[Path]:
    """The cache's shard files: `<dir>/shards/*.tar` of the dataset directories it made (ORIGIN inside)."""
    return [
        p
        for d in sorted(cache_dir.glob(f"*/{ORIGIN}"))
        for p in sorted((d.parent / SHARDS_DIR).glob("*.tar"))
    ]


def make_room(cache: CacheSettings, incoming: int, protect: set[Path]) -> None:
    """Evict cache shards until `incoming` more bytes fit the bound: first those no live loader keeps,
    then those only another loader on the node keeps (it fetches them again: slower, never wrong),
    least recently needed first (the prefetchers mark what their window needs); never `protect`
    nor this process's (or its parent's: a DataLoader worker's rank) keep list. The caller holds
    node_lock."""
    _remove_dead_tmp(cache.dir)
    ours, theirs = live_keep(cache.dir)
    files = cache_usage(cache.dir)
    used = sum(size for _, size, _ in files)
    hard = ours | protect
    victims = sorted((f for f in files if f[0] not in hard), key=lambda f: (f[0] in theirs, f[2]))
    for path, size, _ in victims:
        if used + incoming <= cache.max_bytes:
            break
        path.unlink(missing_ok=True)
        used -= size


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_tmp(cache_dir: Path) -> None:
    """Temporary files `.NAME.HOST.PID.tmp` of this host's dead processes (a download killed midway)."""
    here = host()
    for d in cache_dir.glob(f"*/{ORIGIN}"):
        for tmp in d.parent.rglob(".*.tmp"):
            parts = tmp.name.rsplit(".", 3)
            if len(parts) == 4 and parts[1] == here and parts[2].isdigit() and not _pid_alive(int(parts[2])):
                tmp.unlink(missing_ok=True)


def live_keep(cache_dir: Path) -> tuple[set[Path], set[Path]]:
    """The files in the keep lists of live loaders: (this process's and its parent's, the others');
    a dead process's list on this host is removed."""
    here = host()
    ours: set[Path] = set()
    theirs: set[Path] = set()
    for path in (cache_dir / KEEP_DIR).glob("*.json"):
        name_host, _, rest = path.stem.rpartition("-")
        pid = rest.partition("_")[0]
        if name_host == here and pid.isdigit() and not _pid_alive(int(pid)):
            path.unlink(missing_ok=True)
            continue
        own = name_host == here and pid in (str(os.getpid()), str(os.getppid()))
        try:
            (ours if own else theirs).update(Path(p) for p in json.loads(path.read_text())["files"])
        except (OSError, ValueError, KeyError):
            continue
    return ours, theirs


# --------------------------------------------------------------------------------------------
# prefetching in the plan's order


class Prefetcher:
    """Fetches ahead the shards the plan reads next, in the order it reads them (a thread in the
    loader's process); `needs(step)` names the (table, shard) pairs global step `step` reads. An error
    (a damaged object, an unreachable store) is kept and raised by `check()` at the next step the
    consumer takes, before any step reads the shard."""

    def __init__(
        self,
        caches: list[CachedShards | None],
        needs: Callable[[int], list[tuple[int, int]]],
        start: int,
        last_step: int | None,
    ):
        self.caches, self.needs, self.last_step = caches, needs, last_step
        self.cache = next(c for c in caches if c is not None).cache
        self._biggest = max(max(c.sizes) for c in caches if c is not None)  # room kept for one download
        self._step = start
        self._stop = False
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._memo: dict[int, list[tuple[int, int]]] = {}
        self._listed, self._complete, self._keeping_all = -1.0, False, False
        self.keep_file = self.cache.dir / KEEP_DIR / f"{host()}-{os.getpid()}_{id(self)}.json"
        self._thread = threading.Thread(target=self._run, name="gristmill-prefetch", daemon=True)
        self._thread.start()

    def advance(self, step: int) -> None:
        """The consumer's next step is `step` (0-based)."""
        with self._cond:
            self._step = step
            self._cond.notify()

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)
        self.keep_file.unlink(missing_ok=True)

    def _all_cached(self) -> bool:
        """Whether the cache holds every shard of these datasets (a listing at most once a second)."""
        now = time.monotonic()
        if now - self._listed < 1.0:
            return self._complete
        self._listed = now
        try:
            self._complete = all(
                c is None or set(c.names) <= set(os.listdir(c.root / SHARDS_DIR)) for c in self.caches
            )
        except FileNotFoundError:
            self._complete = False
        return self._complete

    def _step_needs(self, step: int) -> list[tuple[int, int]]:
        hit = self._memo.get(step)
        if hit is None:
            hit = self._memo[step] = [(t, s) for t, s in self.needs(step) if self.caches[t] is not None]
        return hit

    def window(self, step: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(to fetch: `step`'s shards and the next steps', in the order the plan first reads them; to
        keep: those and the last LAG_STEPS steps'). `step`'s own always; then the steps behind and
        ahead as far as they fit the bound with room for one more shard (the one downloading)."""
        for old in [s for s in self._memo if s < step - LAG_STEPS]:
            del self._memo[old]
        biggest = self._biggest
        budget = self.cache.max_bytes - biggest
        fetch = list(dict.fromkeys(self._step_needs(step)))
        keep = dict.fromkeys(fetch)
        used = sum(self.caches[t].sizes[k] for t, k in keep)
        if used > self.cache.max_bytes:
            raise DatasetError(
                f"step {step + 1} reads {len(keep)} shards of {used / 1e9:.3g} GB but data.cache_gb is "
                f"{self.cache.max_bytes / 1e9:.3g}: raise data.cache_gb to at least "
                f"{(used + biggest) / 1e9:.3g}"
            )

        def add(s: int) -> list[tuple[int, int]] | None:
            """Step `s`'s shards not kept yet, now kept; None (and nothing kept) if they do not fit."""
            nonlocal used
            new = [n for n in dict.fromkeys(self._step_needs(s)) if n not in keep]
            cost = sum(self.caches[t].sizes[k] for t, k in new)
            if used + cost > budget:
                return None
            keep.update(dict.fromkeys(new))
            used += cost
            return new

        for s in range(step - 1, max(0, step - LAG_STEPS) - 1, -1):  # for ranks a step behind
            if add(s) is None:
                break
        end = step + MAX_AHEAD_STEPS
        for s in range(step + 1, end if self.last_step is None else min(end, self.last_step)):
            new = add(s)
            if new is None:
                break
            fetch += new
        return fetch, list(keep)

    def _touch(self, keep: list[tuple[int, int]]) -> None:
        """Mark the cached shards of the window as just used: eviction goes least recently needed
        first (the reader's hot path touches no file; this thread runs only while the cache lacks
        shards)."""
        for t, k in keep:
            with contextlib.suppress(FileNotFoundError):
                os.utime(self.caches[t].path(k))

    def _publish(self, keep: list[tuple[int, int]]) -> None:
        files = [str(self.caches[t].path(k)) for t, k in keep]
        write_atomic(self.keep_file, json.dumps({"files": files}), fsync=False)

    def _run(self) -> None:
        try:
            self.keep_file.parent.mkdir(parents=True, exist_ok=True)
            while True:
                with self._cond:
                    if self._stop:
                        return
                    step = self._step
                if self._all_cached():  # nothing to fetch: no planning, and all of it kept
                    if not self._keeping_all:
                        self._publish(
                            [(t, k) for t, c in enumerate(self.caches) if c for k in range(len(c.names))]
                        )
                        self._keeping_all = True
                    fetch = []
                else:
                    self._keeping_all = False
                    fetch, keep = self.window(step)
                    self._publish(keep)
                    self._touch(keep)
                for t, k in fetch:
                    if self._stop or self._step > step + LAG_STEPS:
                        break  # the consumer moved on: plan again from where it is
                    self.caches[t].fetch(k)
                with self._cond:
                    if not self._stop and self._step == step:
                        self._cond.wait(timeout=1.0)
        except BaseException as e:  # kept for the consumer's next step
            self.error = e
