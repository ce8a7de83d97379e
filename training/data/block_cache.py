"""A bucket's dataset read by range: the build's samples, fetched as the plan's steps reach them, in
its order, into the node's bounded, verified cache (docs/object-storage.md, "Training from a bucket").

The unit is the build's sample (64 consecutive documents of a shard: dataset_format.sample_starts),
which is the training split's block in the epoch order (training/data/order.py): in a
gristmill-shards/3 shard a sample's `.docs` records (each document's tokens and sha256) lie just
before its ids, so one range GET brings all of it. The records must hash to the index's digest of the
sample (`index/sample_digest.bin`, checked whole) and add up to its total, and every document's ids
must hash to its record; a range that fails is fetched once more, then refused in one line naming the
shard, the bytes and the sample (and the bucket's object, or the transfer where the two fetches gave
different bytes). Only then is the sample written into the cache, as
`<fingerprint>/blocks/<sample>.blk`. The held-out split's documents lie one in 1/val_fraction: each is
a unit of its own (its sample's records, then its ids), `<fingerprint>/blocks/heldout/<row>.blk`.

A cached copy is a copy, not a proof, so it is checked where it is used. A unit's file holds its
identity, its sample's `.docs` records as the bucket sent them, an xxh3-64 of its ids (computed at the
fetch, from ids that had just matched their sha256s), then the ids. A reader reads the whole file into
its own memory and checks it there, once: the identity, the records against the index's digest of the
sample (so the lengths a plan reads are the index's) and the ids against their xxh3. What its steps
then read is that checked copy, which nothing on the disk can change any more (a file damaged,
rewritten or cut short later is caught at its next read from disk; a memory map would have shown such
changes to every later read, and a file cut short under a map killed the process with SIGBUS). A copy
that fails is removed and fetched again, never trained on. The check is xxh3, not sha256, because it
runs on every token the loop reads (~30× the speed); the records' sha256s are what the bucket's bytes
are held to, at the fetch. Either detects a damaged or swapped copy; neither stops someone who
rewrites a file on purpose together with its checks (a hash in the same file cannot). A group's plan
needs only its samples' lengths: it reads a file's identity and records (the first 2.4 kB), checked
the same way, and leaves the ids to the reads.

`CachedBlocks` is one split's units of one bucket dataset; a training group's plan asks for the lengths
of the documents its next steps reach (`SampleLengths`), which fetches their samples together, several
requests in flight. `Prefetcher` runs in each rank's loader, walks the plan ahead, has the next steps'
samples fetched before those steps, and publishes what its process keeps: every unit of the epoch groups its
current and next steps read (a sample is read until its group ends). Eviction (`make_room`) removes
units no live loader keeps, least recently needed first. The cache therefore holds the loader's
working set, two to three groups per source (`group_need`, checked against data.cache_gb before any
work), whatever the dataset's size.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.contract.atomic_write import move_into_place, write_atomic
from training.contract.dataset_format import (
    DOC_RECORD,
    DOC_RECORDS,
    FORMAT,
    SAMPLE_DOCS,
    SHARDS_DIR,
    DatasetError,
    dataset_files,
    layout_samples,
)
from training.contract.dataset_index import (
    HASH_BYTES,
    INDEX_DIR,
    SAMPLE_DIGEST,
    SAMPLE_TOKENS,
    DocIndex,
    sample_digest,
)
from training.contract.lifetime import host, pid_alive
from training.contract.object_store import (
    COUNTS,
    STOP_FETCHING,
    ObjectCutShort,
    ObjectMissing,
    ObjectStore,
    ObjectStoreError,
    Window,
    endpoint,
    stop_if_asked,
)
from training.contract.transfer import DamagedInTransit, damaged_in_transit
from training.data import order as epoch_order
from training.data.open_maps import OPEN_MAPS
from training.data.order import DocBlocks
from training.data.remote import (
    ORIGIN,
    CacheSettings,
    bucket_lacks,
    cache_lock,
    cache_write,
    in_the_way,
    mark_origin,
    node_lock,
    origin,
    repair_advice,
    tmp_name,
)


class _FetchThreads:
    """ThreadPoolExecutor's submit and shutdown (cancelling the queued tasks) over daemon threads, and a
    stop's rule for both waits. A stop (STOP_FETCHING) leaves a request in flight to end on its own
    (the save comes first), but Python joins every ThreadPoolExecutor thread at exit, a DataLoader
    worker's too: a store that accepts and never answers kept a stopped trainer alive for each
    request's read timeout, past a scheduler's grace period (RV44a F2). A daemon thread cut off at
    exit is a fetch killed mid-way, as by kill -9: its copy was not moved into place, and its sample's
    lock is an flock the kernel releases."""

    def __init__(self, max_workers: int, name: str):
        self._max, self._name = max_workers, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._closed:  # no thread would take it
            raise RuntimeError(f"{self._name}: cannot submit after close")
        future: Future = Future()
        self._queue.put((future, fn, args))
        if len(self._threads) < self._max:  # one more thread per task, as many as asked for at most
            t = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
            t.start()
            self._threads.append(t)
        return future

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # the caller's, as ThreadPoolExecutor gives it
                future.set_exception(e)
            else:
                future.set_result(result)

    def result(self, future: Future) -> Any:
        """`future`'s result (its error raised), or FetchStopped once the run is asked to stop: a wait
        that looks at the stop every 0.2 s."""
        while not wait([future], timeout=0.2).done:
            stop_if_asked()
        return future.result()

    def close(self) -> None:
        """The queued tasks cancelled; the threads end after their task in hand, waited for unless the
        run is asked to stop (STOP_FETCHING: then left to end on their own)."""
        self._closed = True
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if not STOP_FETCHING.is_set():
            for t in self._threads:
                t.join()


BLOCKS_DIR = "blocks"
HELDOUT_DIR = "heldout"  # under BLOCKS_DIR: the held-out split's documents, one file each
KEEP_DIR = "keep"
BLOCK_EXT = ".blk"
FAILED_EXT = ".failed"  # beside a unit's file: its node's last failed fetch (CachedBlocks._failed_meanwhile)
MAGIC = b"gristmill-sample/3\n"  # /1 (no checks), /2 (an xxh3 per document): copies to fetch again
LAG_STEPS = 2  # steps behind the consumer whose blocks stay kept (ranks a step behind)
MAX_AHEAD_STEPS = 64  # how far the prefetcher plans ahead at most
USAGE = ".usage"  # in the cache directory: the bytes of its block files (make_room)
EVICT_TO = 0.9  # a full cache is evicted down to this share of the bound
LOCK_STRIPES = 64  # lock files per split's cache directory: units fetched at once rarely share one
TOUCH_EVERY_S = 10.0  # how often a prefetcher marks the groups being read as needed again (_touch)
RELIST_EVERY_S = 10.0  # how long a prefetcher trusts its listing of the cache (_all_cached)


class _BadCopy(Exception):
    """A cached unit's copy that fails a check when it is read from disk (CachedBlocks._open, _lengths)."""

    def __init__(self, unit: int, why: str, copy: tuple[int, ...]):
        self.unit, self.why, self.copy = unit, why, copy  # copy: the file's identity (_identity)
        self.held: Any = None  # the file, open until _failed is done with it (CachedBlocks._reading)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """One cache file as written (a copy fetched again is a new file: a new inode or a later mtime)."""
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _boot_id() -> str:
    """This boot of the node (Linux), which its monotonic clock counts from; "" where unknown."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


JOB_ENV = "GRISTMILL_JOB"  # a process's job, where no torchrun names it: inherited by its workers


def _job() -> str:
    """This job: torchrun's run id with its rendezvous address (two jobs of the static rendezvous are
    both run id "none", on other ports: review R24m 1), shared by its ranks and their workers; else
    the process that opened the dataset, whose DataLoader workers inherit it (R24m 2)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return f"{env['TORCHELASTIC_RUN_ID']} {env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return env.setdefault(JOB_ENV, f"pid {os.getpid()} on {host()}")


def refuse_legacy(location: str, fmt: str) -> DatasetError:
    """Why a dataset of an older layout is not read from a bucket, and the command that fixes it."""
    return DatasetError(
        f"{location} is a {fmt} dataset, which a bucket does not serve: it reads the {FORMAT} layout, where "
        "one range request brings a sample's lengths, sha256s and ids; convert it with `gristmill data "
        f"convert {location} NEW` (same documents, same batches), then train from NEW"
    )


def _xxh3(data: Any) -> int:
    """The cache's check of a document's ids at every read (module docstring): xxh3-64, imported here
    so that the GPU image, which reads no bucket, needs no xxhash."""
    import xxhash

    global _xxh3
    _xxh3 = xxhash.xxh3_64_intdigest
    return _xxh3(data)


@dataclass
class _Loaded:
    """A cached unit's file read into this process's memory and checked (CachedBlocks._open): its
    documents' lengths and their ids, as they were when checked."""

    first: int  # its first manifest row
    lengths: np.ndarray  # per document, tokens
    start: list[int]  # per document, where its ids start (in tokens); start[k + 1] where they end
    ids: np.ndarray  # the ids (read-only, over the bytes read)
    copy: tuple[int, ...]  # the file's identity (_identity)


class CachedBlocks:
    """One split (`blocks`) of the bucket dataset opened at `root` (remote.local_root), read through the
    node's cache a sample at a time (module docstring). The cache's unit is the build's sample, for both
    splits: a training block is one sample; a held-out block's documents lie in several."""

    def __init__(
        self, root: Path, info: dict[str, Any], index: DocIndex, blocks: DocBlocks, cache: CacheSettings
    ):
        self.root, self.info, self.index, self.blocks, self.cache = root, info, index, blocks, cache
        self.url = origin(root)
        _job()  # named before any DataLoader worker forks (_failed_meanwhile)
        self.store = ObjectStore(self.url, attempts=None, within_s=cache.timeout_s)
        self.itemsize = index.itemsize
        self.dtype = np.dtype(f"<u{self.itemsize}")
        self.names = sorted(info["shard_files"])
        self._index_arrays()
        # The held-out split's documents lie one in 1/val_fraction of a sample: each is its own unit,
        # fetched as its sample's records, then its own ids (two small ranges, not the sample's bytes).
        self.per_doc = blocks.split == "val"
        self.dir = root / BLOCKS_DIR / HELDOUT_DIR if self.per_doc else root / BLOCKS_DIR
        self._val_tokens = np.asarray(blocks._val_lengths, np.int64) if self.per_doc else None
        self.nunits = blocks.n if self.per_doc else len(self.totals)
        self._ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # shard → its samples' offsets
        self._needs: dict[tuple[int, int, int], int] = {}  # group_need by (step tokens, GROUP_BLOCKS, ahead)
        self._listed = (-1.0, False)  # (when, whether every unit was cached): all_cached
        self._owner = OPEN_MAPS.register(self, descriptors=False)  # its copies (training/data/open_maps.py)
        self._failures: dict[int, set[tuple[int, ...]]] = {}  # per unit: its copies that failed lately
        self._failed_before: dict[int, set[tuple[int, ...]]] = {}  # per unit: those before its last good read
        self._dir = str(self.dir)
        self._origin = str(root / ORIGIN)
        self.refused: dict[int, DatasetError] = {}  # samples that failed their check twice
        # Keys of the units this process knows the cache holds (listed, fetched or found there), for a
        # prefetcher's walks (it starts the set, and forgets it every RELIST_EVERY_S: forget_known) and
        # a group's plan (row_lengths stats only the others); kept only by the process whose prefetcher
        # started it (a DataLoader worker's, forked with a copy, would only grow: reviews R19c 4, R19d
        # 6). A hint: a read opens the file, and fetches it when it is gone.
        self.on_disk: set[int] = set()
        self._on_disk_pid = 0  # the process keeping on_disk; 0: none
        self.lengths = SampleLengths(self)

    def _index_arrays(self) -> None:
        """Per sample, from the index (memory maps: shared page cache, never private copies): its
        first row, its tokens and the digest of its records, checked at every fetch."""
        # plain views of the maps: an np.memmap's element costs ~1 µs more, several per unit opened
        self.first = np.asarray(self.index.sample_first)
        self.totals = np.asarray(self.index.sample_tokens)
        self.digests = np.asarray(self.index.sample_digest)

    # Pickled for DataLoader workers: the units it holds are the process's own; the index's arrays travel with
    # the index (as paths) and are taken from it again.
    def __getstate__(self) -> dict[str, Any]:
        skip = ("first", "totals", "digests")
        state = {k: v for k, v in self.__dict__.items() if k not in skip}
        return {**state, "_ranges": {}, "on_disk": set(), "_on_disk_pid": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._owner = OPEN_MAPS.register(self, descriptors=False)
        self._index_arrays()

    # -- units: a training block is a sample; a held-out document is a unit of its own ----------

    def units_of_rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, np.int64)
        return self.blocks.val_docs(rows) if self.per_doc else self.index.sample_of(rows)

    def units_of_blocks(self, blocks: np.ndarray) -> np.ndarray:
        """The units of the split's blocks `blocks` (the epoch order's unit)."""
        if not self.per_doc:
            return np.asarray(blocks, np.int64)
        docs = np.asarray(blocks, np.int64)[:, None] * self.blocks.block_docs + np.arange(
            self.blocks.block_docs
        )
        return docs[docs < self.nunits]

    def _unit(self, u: int) -> tuple[int, int, int]:
        """Unit `u`'s first manifest row, its documents and its tokens."""
        if self.per_doc:
            return self.key(u), 1, int(self._val_tokens[u])
        return int(self.first[u]), int(self.first[u + 1] - self.first[u]), int(self.totals[u])

    def _in_sample(self, u: int) -> tuple[int, int]:
        """The sample holding unit `u`, and where in it the unit's first document lies (a training unit
        is its sample, from its first document)."""
        if not self.per_doc:
            return u, 0
        row = self.key(u)
        s = int(self.index.sample_of(np.array([row]))[0])
        return s, row - int(self.first[s])

    def _overhead(self, units: int) -> int:
        """The bytes of `units` cache files besides their ids: each one's header (with room for the
        numbers' digits), its sample's records (at most SAMPLE_DOCS) and the xxh3 of its ids."""
        return units * (len(self._header(None, 0, SAMPLE_DOCS)) + 24 + DOC_RECORD * SAMPLE_DOCS + 8)

    @property
    def _unit_tokens(self) -> np.ndarray:
        """Per unit, its tokens (a held-out document's, or a sample's total)."""
        return self._val_tokens if self.per_doc else self.totals

    def _file_bytes(self, tokens: int, units: int) -> int:
        """The bytes of `units` cache files holding `tokens` ids in all, at most (what the bound counts)."""
        return tokens * self.itemsize + self._overhead(units)

    def unit_bytes(self, u: int) -> int:
        """The bytes of unit `u`'s cache file, at most."""
        return self._file_bytes(self._unit(u)[2], 1)

    def units_bytes(self, units: np.ndarray) -> int:
        """unit_bytes summed over `units`, at most (vectorised: the prefetcher sums a group's)."""
        units = np.asarray(units, np.int64)
        return self._file_bytes(int(self._unit_tokens[units].sum()), len(units))

    def split_bytes(self) -> int:
        """units_bytes of every unit of the split (its tokens summed once, no array of its units: 23M
        samples at FineWeb-Edu's size)."""
        return self._file_bytes(int(self._unit_tokens.sum()), self.nunits)

    def group_need(self, step_tokens: int, ahead: int = 0) -> int:
        """The most this split's loader keeps at once over an unbounded plan reading up to
        `step_tokens` of it per step: the units of the epoch groups its last LAG_STEPS steps, the
        current one, the next and the `ahead` steps after it read (DataLoader workers build steps
        ahead of the loop: their samples evicted before they were read were fetched again, trial
        RV49b 1) (a sample is read until its group ends), each at most the GROUP_BLOCKS largest
        blocks' bytes, plus one group for an epoch's short last group; all of them when the split has
        no more blocks.
        Computed once per step size (a sort of every sample: the setup's check and each loader's
        prefetcher ask)."""
        group = epoch_order.GROUP_BLOCKS  # read now: tests shrink it to exercise many groups
        key = (step_tokens, group, ahead)
        if key not in self._needs:
            self._needs[key] = self._group_need(step_tokens, group, ahead)
        return self._needs[key]

    def _group_need(self, step_tokens: int, group: int, ahead: int) -> int:
        if self.per_doc:
            ids = np.sort(np.asarray(self.blocks.block_tokens, np.int64) * self.itemsize)
            overhead = self._overhead(self.blocks.block_docs)
        else:
            ids, overhead = np.sort(self.totals * self.itemsize), self._overhead(1)
        # The groups the steps span, counted in ids (what a step reads), never in file bytes: with the
        # files' headers and records counted, samples of a few tokens spanned a third of the groups the
        # loader kept, and the cache passed its bound 2.4× (trial RV55c 1).
        smallest = int(ids[:group].sum()) or 1  # no full group has fewer ids
        span = (LAG_STEPS + 2 + ahead) * step_tokens * self.itemsize
        groups = 2 + -(-span // smallest)
        largest = ids[::-1][: groups * group]
        return int(largest.sum()) + overhead * len(largest)

    def key(self, u: int) -> int:
        """The name of unit `u`'s cache file: a sample's number; a held-out document's manifest row (its
        number in the split depends on val_fraction, its row does not: a node's cache serves readers of
        any val_fraction, and another fraction's document n is another document)."""
        return int(self.blocks._val_rows[u]) if self.per_doc else u

    def path(self, u: int) -> Path:
        return Path(self._file(u))

    def unit_name(self, u: int) -> str:
        """Unit `u` in a message: a sample, or a held-out document (its row: its number in the split
        is no sample's)."""
        return f"held-out document (manifest row {self.key(u)})" if self.per_doc else f"sample {u}"

    def _file(self, u: int) -> str:
        """path(u) as a string (the read path opens and tests it per unit: no Path object on the way)."""
        return f"{self._dir}/{self.key(u)}{BLOCK_EXT}"

    def cached(self, u: int) -> bool:
        """Whether the cache holds a copy of unit `u` (checked when it is opened)."""
        return os.path.isfile(self._file(u))

    # -- fetching -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _unit_lock(self, u: int):
        """Unit `u` is fetched by one thread of one process on the node at a time: an flock on one of
        LOCK_STRIPES lock files (flock, unlike POSIX record locks, holds per open file, so threads of a
        process exclude each other too, and closing one file releases no other thread's lock). A wait
        for another thread of this process is not told: the loop and its prefetcher fetch side by side,
        and two samples of one stripe through a flaky store each said so at a slow fetch (the holder's
        own failure is its line). A stop (STOP_FETCHING, which only a training's stop sets) ends the
        wait as it ends the fetch's own retries (FetchStopped). The holder may be another rank whose
        main thread, blocked in a collective, has not run its signal handler yet, its fetches retrying
        on; a DataLoader worker's fetch thread waiting here kept the worker from exiting, and its
        trainer's save waited ~20 s for the worker's shutdown."""
        stripe = self.dir / f".lock-{u % LOCK_STRIPES}"
        with cache_lock(self.cache.dir, stripe, self.cache.timeout_s, say_own=False, give_up=stop_if_asked):
            yield

    def fetch(self, u: int, window: Window | None = None) -> bool:
        """Make sure the cache holds sample `u` (True if it was fetched here). Its requests retry within
        `window` (object_store.Window), by default data.fetch_timeout_s from now: from when this caller
        began to wait for the sample, not from when it got the sample's lock (each waiter took a window
        of its own after the holder's: an outage stopped the run after ~1.7 × ranks per node ×
        fetch_timeout_s, review R24c F3). A waiter whose fetch of it by another failed fetches it itself
        (checked, as any fetch) for what is left of its window; once when none is, unless the failure
        happened within that window (then it raises that failure: _failed_meanwhile). The sample fetched
        here is progress: the window runs on from now (a group's, fetch_all); one another fetch brought
        while this caller waited runs it on from when it was written (R24i 1); one found there at once
        does not (it may have come before an outage: review R24g 1)."""
        if u in self.refused:
            raise self.refused[u]
        if self.cached(u):  # there already: no progress of the window's (it may predate an outage)
            self.known(u)
            return False
        window = self.store.window() if window is None else window
        with self._unit_lock(u):
            if u in self.refused:
                raise self.refused[u]
            if self.cached(u):  # another process or thread fetched it while this one waited: data came
                self.known(u)
                if window is not None:
                    # when it was written, not when this waiter saw it: a copy written before an
                    # outage, seen after a wait on a lock another sample's failing fetch held, ran
                    # the window on by one more (review R24i 1)
                    with contextlib.suppress(OSError):
                        window.progressed(ago=time.time() - os.stat(self._file(u)).st_mtime)
                return False
            if window is not None and time.monotonic() >= window.until:
                # its window spent waiting for the lock while another process's fetch of the sample
                # failed: that failure, not one more try in turn after it (each waiter of a node's
                # ranks tried once, one after another, under the lock: ranks × a try's length past
                # fetch_timeout_s, a minute each against an endpoint that hangs: review R24i 3)
                if (failed := self._failed_meanwhile(u, window)) is not None:
                    raise ObjectStoreError(failed)
            try:
                records, check, ids = self._download(u, window)  # into memory: in flight, no disk
            except DatasetError as e:
                self.refused[u] = e
                raise
            except ObjectStoreError as e:
                # when (the node's monotonic clock: no wall clock's step), from where, and the line
                record = {
                    "job": _job(),
                    "boot": _boot_id(),
                    "at": time.monotonic(),
                    "wall": time.time(),
                    "endpoint": endpoint(),
                    "line": str(e),
                }
                with contextlib.suppress(OSError):
                    write_atomic(self._failed_file(u), json.dumps(record), fsync=False)
                raise

            def room_made_and_written() -> None:  # at once: the bound holds
                make_room(self.cache, self.unit_bytes(u))
                self._write(u, records, check, ids)
                # emptied meanwhile, perhaps after the count listed the cache but before this copy was
                # marked: marked again, and counted again whole at the next make_room (review RV27b F1)
                if not os.path.isfile(self._origin):
                    self._mark()
                    (self.cache.dir / USAGE).unlink(missing_ok=True)

            # The cache may be emptied at any time (`rm -rf` to free the disk, during this fetch too):
            # its folders are made and marked again first (unmarked, the copies written now were no
            # cache file to make_room, which went past the bound: review R19b 1); emptied again before
            # the copy is in place, they are made again and the room made anew (its count may have gone
            # too), as often as one emptying can remove what it writes (cache_write: the write stopped
            # the run, R19d 2, and under load when the emptying came after the mark: E27b)
            with node_lock(self.cache.dir, self.cache.timeout_s):
                cache_write(self.cache.dir, self._mark, room_made_and_written)
            with contextlib.suppress(OSError):
                os.unlink(self._failed_file(u))
            self.known(u)
            if window is not None:
                window.progressed()
            return True

    def _mark(self) -> None:
        """The folder of this split's units is there, in a directory marked as the cache's copy of the
        dataset (ORIGIN: the units make_room counts)."""
        os.makedirs(self._dir, exist_ok=True)
        if not os.path.isfile(self._origin):
            mark_origin(self.root, self.url)

    def _failed_file(self, u: int) -> str:
        """Beside unit `u`'s file: the line of the last fetch of it on this node that failed."""
        return self._file(u)[: -len(BLOCK_EXT)] + FAILED_EXT

    def _failed_meanwhile(self, u: int, window: Window) -> str | None:
        """The line of a fetch of unit `u` that failed on this node, in this job (another job sharing
        the cache may reach the store otherwise: reviews R24k 1, R24l 1), since this boot, against this
        endpoint, within `window` (since it began or last progressed) on the node's monotonic clock (a
        wall clock stepped back made an old failure new: R24k 2) and on the wall clock too (a time
        namespace shifts the monotonic one: R24l 2); None if none did. Missing one costs a try."""
        try:
            record = json.loads(Path(self._failed_file(u)).read_text())
            at, wall, line = float(record["at"]), float(record["wall"]), str(record["line"])
            mine = (record["job"], record["boot"], record["endpoint"]) == (_job(), _boot_id(), endpoint())
        except (OSError, ValueError, TypeError, KeyError):
            return None
        now, now_wall, elapsed = time.monotonic(), time.time(), window.elapsed()
        if mine and now - elapsed <= at <= now and now_wall - elapsed - 1 <= wall <= now_wall + 1:
            return f"another fetch of it on this node failed meanwhile (its line): {line}"
        return None

    def known(self, u: int) -> None:
        """Unit `u` was found in the cache, or written there: on_disk, where this process's prefetcher
        keeps it."""
        if self._on_disk_pid == os.getpid():
            self.on_disk.add(self.key(u))

    def forget_known(self) -> None:
        """Start on_disk again, kept by this process (a prefetcher's, every RELIST_EVERY_S)."""
        self.on_disk, self._on_disk_pid = set(), os.getpid()

    def fetch_all(self, units: Iterable[int]) -> None:
        """Make sure the cache holds every one of `units`, `data.fetch_requests` fetches in flight, each
        retrying within one window for them all: data.fetch_timeout_s from this call or from the last
        sample fetched (not from each one's turn in the queue); the first failure is raised once the
        fetches in flight end, the queued ones dropped (a group's thousands of samples each retried for
        fetch_timeout_s in turn, `requests` at a time: review R24c F3). A slow but healthy store keeps
        its retries however long the group takes (review R24f 1)."""
        window = self.store.window()
        missing = []
        for u in dict.fromkeys(int(u) for u in units):
            if self.cached(u):
                self.known(u)  # fetched by another process of the node since this one's listing
            else:
                missing.append(u)
        if not missing:
            return
        failed = threading.Event()  # the queued fetches end at the first failure, not when it is read

        def one(u: int) -> None:
            if failed.is_set():
                return
            try:
                self.fetch(u, window)
            except BaseException:
                failed.set()
                raise

        # In threads of their own, even one: the caller (the training loop) waits here, and a stop
        # (STOP_FETCHING: SIGTERM) ends its wait at once, the threads left to end their own
        pool = _FetchThreads(min(self.cache.requests, len(missing)), "gristmill-group")
        try:
            for f in [pool.submit(one, u) for u in missing]:
                pool.result(f)
        finally:
            pool.close()

    def _range(self, u: int) -> tuple[str, int, int, int]:
        """Sample `u`'s shard, and the bytes of its one range request: from its `.docs` records to the end
        of its ids (dataset_format.layout_samples), and where its ids start."""
        shard = int(self.index.shard_of(self.first[u : u + 1])[0])
        hit = self._ranges.get(shard)
        a = int(np.searchsorted(self.first, self.index.shard_rows[shard]))
        if hit is None:
            if len(self._ranges) >= 64:  # bounded: a few shards are read at a time
                self._ranges.pop(next(iter(self._ranges)))
            b = int(np.searchsorted(self.first, self.index.shard_rows[shard + 1]))
            hit = self._ranges[shard] = layout_samples(
                np.diff(self.first[a : b + 1]), self.totals[a:b] * self.itemsize
            )
        docs_at, ids_at = int(hit[0][u - a]), int(hit[1][u - a])
        return self.names[shard], docs_at, ids_at + int(self.totals[u]) * self.itemsize, ids_at

    def _download(self, u: int, window: Window | None) -> tuple[bytes, int, bytes]:
        """Unit `u`'s sample's records, the xxh3 of its ids, and its ids (requests retried until
        `window`: fetch's), every document checked: the records against the index's digest and
        sample total, each document's ids against its record's sha256; fetched once more when one
        differs, then refused naming the shard, the bytes and the sample: the bucket's object where both
        fetches gave the same bytes, the transfer where they differ (RV71a F3). A sample is one range request
        (its records, then its ids); a held-out document two (its sample's records, then its own ids,
        whose length must also be heldout.bin's)."""
        row, _, tokens = self._unit(u)
        s, k = self._in_sample(u)
        name, lo, hi, ids_at = self._range(s)
        n, total = int(self.first[s + 1] - self.first[s]), int(self.totals[s])
        fetched = []  # each attempt's bytes: two that differ are the transfer's damage (RV71a F3)
        for attempt in (1, 2):
            data = self._get_range(s, name, lo, hi if not self.per_doc else lo + n * DOC_RECORD, window)
            ids = b""
            rec = np.frombuffer(data, DOC_RECORDS, n)
            lengths = rec["n_tokens"].astype(np.int64)
            sha = rec["sha256"].tobytes()
            ends = np.cumsum(lengths) * self.itemsize
            starts = ends - lengths * self.itemsize
            docs = range(n) if not self.per_doc else [k]
            bad = None
            if sample_digest(data[: n * DOC_RECORD]) != int(self.digests[s]):
                bad = f"its .docs records are not the ones {INDEX_DIR}/{SAMPLE_DIGEST} records for it"
            elif int(lengths.sum()) != total:
                # The records are the ones the index's digest vouches for: the object is as built, and
                # the index's own two files disagree. No second fetch; the bucket's object is not blamed
                # (its repair, an upload, changed nothing: RV43a F3).
                if (changed := self._index_changed()) is not None:
                    raise changed
                raise DatasetError(
                    f"{self.url}/{INDEX_DIR}/{SAMPLE_TOKENS}: sample {s}'s total there is {total} tokens, "
                    f"but its .docs records in {name}, the ones {INDEX_DIR}/{SAMPLE_DIGEST} records for "
                    f"it, add up to {int(lengths.sum())}: the dataset's index does not match its shards, "
                    f"and nothing was trained on the sample; `gristmill data validate {self.url}` names "
                    "what to rebuild"
                )
            elif self.per_doc and int(lengths[k]) != tokens:
                bad = f"its .docs record of row {row} says {int(lengths[k])} tokens, heldout.bin {tokens}"
            else:
                if self.per_doc:
                    a = ids_at + int(starts[k])
                    ids = self._get_range(s, name, a, a + tokens * self.itemsize, window)
                    spans = [(0, len(ids))]
                else:
                    ids = data[ids_at - lo :]
                    spans = list(zip(starts.tolist(), ends.tolist()))
                for j, (a, z) in zip(docs, spans):
                    got = hashlib.sha256(ids[a:z]).digest()
                    if got != sha[j * HASH_BYTES : (j + 1) * HASH_BYTES]:
                        bad = (
                            f"manifest row {int(self.first[s]) + j}'s ids hash to {got.hex()} but its .docs "
                            f"record says {sha[j * HASH_BYTES : (j + 1) * HASH_BYTES].hex()}"
                        )
                        break
            if bad is None:
                return data[: n * DOC_RECORD], _xxh3(ids), ids
            fetched.append((data, ids))
            if attempt == 1:
                COUNTS.add("refetches")
        if (changed := self._index_changed()) is not None:
            raise changed
        where = (
            f"{self.url}/{SHARDS_DIR}/{name}: bytes {lo:,}–{hi - 1:,} (sample {s}, manifest rows "
            f"{int(self.first[s])}–{int(self.first[s + 1]) - 1}) fetched twice"
        )
        if fetched[0] != fetched[1]:
            raise DamagedInTransit(
                f"{where}, other bytes each time, neither the recorded ones (the second time {bad}): "
                + damaged_in_transit()
            )
        raise DatasetError(
            f"{where}, and each time {bad}: the object in the bucket is damaged or was replaced, and nothing "
            "was trained on it; " + repair_advice(self.store)
        )

    def _get_range(self, s: int, name: str, lo: int, hi: int, window) -> bytes:
        """Bytes `lo`–`hi` of shard `name` (sample `s`'s); an object missing or shorter than the index
        says is the bucket's dataset damaged or replaced (bucket_lacks)."""
        try:
            return self.store.get_range(f"{SHARDS_DIR}/{name}", lo, hi, window)
        except (ObjectMissing, ObjectCutShort) as e:
            if (changed := self._index_changed()) is not None:
                raise changed from None
            raise bucket_lacks(self.store, e, s) from None

    def _index_changed(self) -> DatasetError | None:
        """The checks of every fetch and read hold the bytes to the index's sample totals and digests,
        memory maps of the cache's copies, which were hashed when the dataset was opened: a copy changed
        on disk since refuses every sample. Asked (the mapped bytes hashed again) before a refusal names
        the bucket or the cache's copies of samples: an index the maps read that no longer hashes to
        dataset.json's sha256 is named instead (review R19b 3)."""
        recorded = dataset_files(self.info)
        for name, mapped in ((SAMPLE_DIGEST, self.digests), (SAMPLE_TOKENS, self.totals)):
            rel = f"{INDEX_DIR}/{name}"
            if rel in recorded and hashlib.sha256(mapped).hexdigest() != recorded[rel]["sha256"]:
                return DatasetError(
                    f"{self.root / rel}: the cache's copy of the dataset's {rel} changed on disk after "
                    "this process checked it (it no longer hashes to the sha256 "
                    f"{self.url}/dataset.json records), and every sample is checked against it: nothing "
                    "was trained on what it refused, and the bucket was not at fault; resume the run (the "
                    "copy is checked, and fetched again, when the dataset is opened)"
                )
        return None

    def _header(self, u: int | None, n: int, records: int) -> bytes:
        # A held-out document's file names its row ("row", not "unit": a file an earlier version named
        # by the document's number in its split is another document's). u None: the longest name's size.
        name = ("unit", 0) if u is None else ("row", self.key(u)) if self.per_doc else ("unit", u)
        fp = self.info["fingerprint"]
        head = f'{{"documents": {n}, "fingerprint": "{fp}", "records": {records}, "{name[0]}": {name[1]}}}'
        return MAGIC + len(head).to_bytes(4, "little") + head.encode()  # JSON (built by hand: ~6 µs less)

    def _write(self, u: int, records: bytes, check: int, ids: bytes) -> None:
        """Unit `u`'s file, written whole under a temporary name, then renamed into place (inside
        cache_write: fetch)."""
        dest = self.path(u)
        tmp = dest.with_name(tmp_name(dest.name))
        try:
            with open(tmp, "wb") as f:
                f.write(self._header(u, self._unit(u)[1], len(records) // DOC_RECORD))
                f.write(records)
                f.write(check.to_bytes(8, "little"))
                f.write(ids)
            move_into_place(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    # -- reading --------------------------------------------------------------------------------

    def _layout(self, u: int) -> tuple[int, int, int, int, int, bytes, int, int]:
        """Unit `u`'s file as it must be: the unit's first row, documents and tokens, its sample and the
        unit's first document in it, the file's header, the sample's records, and where the ids start
        (the records, then the xxh3 of the ids, come before them)."""
        row, n, tokens = self._unit(u)
        s, k = self._in_sample(u)
        records = int(self.first[s + 1] - self.first[s])
        head = self._header(u, n, records)
        return row, n, tokens, s, k, head, records, len(head) + DOC_RECORD * records + 8

    def _checked_lengths(
        self, u: int, layout: tuple, data: bytes, size: int, copy: tuple[int, ...]
    ) -> np.ndarray:
        """Unit `u`'s documents' lengths from the first bytes `data` (up to its ids at least) of its
        cache file of `size` bytes (`layout`: _layout(u)): _BadCopy unless the file is this unit's (its
        header, its size) and its records hash to the index's digest of the sample (so a plan reads the
        index's lengths)."""
        _, n, tokens, s, k, head, records, ids_at = layout
        if size != ids_at + tokens * self.itemsize or data[: len(head)] != head:
            raise _BadCopy(u, "the file is not this unit's", copy)
        if sample_digest(data[len(head) : ids_at - 8]) != int(self.digests[s]):
            raise _BadCopy(
                u, f"its records are not the ones {INDEX_DIR}/{SAMPLE_DIGEST} gives sample {s}", copy
            )
        lengths = np.frombuffer(data, DOC_RECORDS, records, len(head))["n_tokens"][k : k + n].astype(np.int64)
        if int(lengths.sum()) != tokens:
            raise _BadCopy(u, "the file is not this unit's", copy)
        return lengths

    def _open(self, u: int) -> _Loaded:
        """Unit `u`'s cache file read whole into this process's memory and checked there (module
        docstring); FileNotFoundError when the cache lacks it, _BadCopy for a file that is not this
        unit's (another unit's, another dataset's, an older version's, cut short, records that are not
        the index's) or whose ids fail their xxh3."""
        layout = self._layout(u)
        row, n, tokens, *_, ids_at = layout
        with self._reading(u) as (f, copy):
            data = f.read()  # what was read is what is checked: the file may change meanwhile
            lengths = self._checked_lengths(u, layout, data, len(data), copy)
            if _xxh3(memoryview(data)[ids_at:]) != int.from_bytes(data[ids_at - 8 : ids_at], "little"):
                raise _BadCopy(u, "its ids fail their xxh3", copy)
        start = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=start[1:])
        return _Loaded(row, lengths, start.tolist(), np.frombuffer(data, self.dtype, tokens, ids_at), copy)

    def _lengths(self, u: int) -> np.ndarray:
        """Unit `u`'s documents' lengths from its cache file's identity and records alone (a group's plan
        needs no ids), checked as _open checks them; FileNotFoundError and _BadCopy as there."""
        layout = self._layout(u)
        with self._reading(u) as (f, copy):
            return self._checked_lengths(u, layout, f.read(layout[-1]), copy[-1], copy)

    @contextlib.contextmanager
    def _reading(self, u: int):
        """Unit `u`'s cache file, open, and its identity. A _BadCopy raised inside keeps it open
        (`held`) until _failed has compared it with the cache's file: while it is open, its inode's
        number cannot be given to a copy fetched again meanwhile (which _failed would take for it)."""
        try:
            f = open(self._file(u), "rb", buffering=0)
        except IsADirectoryError:
            raise in_the_way(Path(self._file(u))) from None
        try:
            yield f, _identity(os.fstat(f.fileno()))
        except _BadCopy as bad:
            bad.held = f
            raise
        except BaseException:
            f.close()
            raise
        f.close()

    def _from_disk(self, u: int, read: Callable[[int], Any]) -> Any:
        """`read(u)` of unit `u`'s cache file (_open or _lengths), fetched first when the cache lacks it
        (or evicted it meanwhile: another loader of the node needed the room); a copy that fails its
        check is removed and fetched again."""
        for _ in range(100):
            try:
                got = read(u)
            except FileNotFoundError:
                self.fetch_all([u])  # its wait ends at a stop (STOP_FETCHING)
            except _BadCopy as bad:
                self._failed(bad)
            else:
                return got
        raise DatasetError(
            f"{self.path(u)}: {self.unit_name(u)} of {self.url} was evicted 100 times before it could be "
            "read: the loaders sharing data.cache_dir need more room; raise data.cache_gb"
        )

    def _loaded(self, u: int) -> _Loaded:
        return self._loaded_all([u])[u]

    def _loaded_all(self, units: list[int]) -> dict[int, _Loaded]:
        """Units `units` (distinct), read and checked, by unit: those this reader holds under one lookup
        (a batch reads ~70 a step), the others from disk. A reader holds an epoch group's units and a
        quarter more (the next group's first steps read while this one's last do): memory, not files
        (no descriptor: outside the process's budget of maps, training/data/open_maps.py)."""
        got = OPEN_MAPS.get_many(self._owner, units)
        group = epoch_order.GROUP_BLOCKS  # units: validation reads far fewer held-out documents
        for u in units:
            if u not in got:
                got[u] = self._from_disk(u, self._open)
                # checked whole: a good copy, so the unit's next failure is a first one
                self._failed_before.setdefault(u, set()).update(self._failures.pop(u, ()))
                OPEN_MAPS.put(self._owner, u, got[u], most=min(self.nunits, group + group // 4))
        return got

    def _failed(self, bad: _BadCopy) -> None:
        """A unit's cached copy failed its check: removed, to be fetched again; a second copy that fails
        (fetched just before) names the cache. A copy is counted once, however many threads saw it fail
        (the prefetcher's plan and the loop read the same files)."""
        u, path = bad.unit, self.path(bad.unit)
        copy, removed = bad.copy, False
        try:
            now = path.stat()
            # The same file (its inode: the failing reader holds it open, so no new file has its
            # number), perhaps written in place since it was read: that copy, as it is now. Another
            # inode is a copy fetched again meanwhile, which stays.
            if (now.st_dev, now.st_ino) == bad.copy[:2]:
                copy = _identity(now)
                path.unlink()
                removed = True
        except FileNotFoundError:
            pass  # removed by another thread or process that saw it fail
        finally:
            if bad.held is not None:
                bad.held.close()
        failed = self._failures.setdefault(u, set())
        if copy in failed or copy in self._failed_before.get(u, ()):
            return  # a copy another thread saw fail first
        failed.add(copy)
        if removed:  # counted where it is removed: once on the node, however many processes saw it
            COUNTS.add("refetches")
            # said, once a copy: repaired without a word, a cache disk that damages files went unseen,
            # its refetches counted with the transfers' (trial RV73b 6)
            print(
                f"note: {path}: the cache's copy of {self.unit_name(u)} failed its check ({bad.why}): "
                "removed and fetched again; if this repeats, check the disk of data.cache_dir",
                file=sys.stderr,
                flush=True,
            )
        if len(failed) >= 2:
            if (changed := self._index_changed()) is not None:
                raise changed
            raise DatasetError(
                f"{path}: the cache's copy of {self.unit_name(u)} of {self.url} failed its check ({bad.why}) "
                "twice, the second time just after it was fetched and checked: something damages or "
                "replaces what is written to data.cache_dir; give the run a cache directory of its own on "
                "another disk"
            )

    def read_into(
        self, docs: np.ndarray, starts: np.ndarray, counts: np.ndarray, out: np.ndarray, at: np.ndarray
    ) -> None:
        """Pieces (manifest row, first token, count) of this split's documents into `out[at[k]:]`, out of
        their units' checked copies in this process's memory (DocumentTable.read)."""
        units = self.units_of_rows(docs)
        copies = self._loaded_all(np.unique(units).tolist())
        pieces = zip(units.tolist(), docs.tolist(), starts.tolist(), counts.tolist(), at.tolist())
        for u, row, first, n, pos in pieces:
            c = copies[u]
            a = c.start[row - c.first] + first
            out[pos : pos + n] = c.ids[a : a + n]

    def row_lengths(self, rows: np.ndarray) -> np.ndarray:
        """Token counts of manifest rows `rows`, from the copies this reader holds, else from their
        samples' cached records: the samples missing are fetched first, all together (an epoch group's
        plan asks for those its next steps reach)."""
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return np.empty(0, np.int64)
        units = self.units_of_rows(rows)
        distinct = np.unique(units)
        held = OPEN_MAPS.get_many(self._owner, distinct.tolist())
        # fetched together, those not known to be cached (on_disk: a hint; one gone is fetched where
        # it is read, alone): a warm group's plan makes no stat per sample before it opens each. Only
        # the keeping process's hint: a DataLoader worker's is its fork's copy, never listed again
        # (review RV34d L2)
        known = self.on_disk if self._on_disk_pid == os.getpid() else set()
        self.fetch_all(u for u in distinct.tolist() if u not in held and self.key(u) not in known)
        # Each unit's first row and lengths, back to back in `distinct`'s order: the rows are one
        # gather out of them (a group's plan: numpy calls per sample cost ~10 µs each of 4,096)
        firsts, parts = [], []
        for u in distinct.tolist():
            hit = held.get(u)
            firsts.append(hit.first if hit else self._unit(u)[0])
            parts.append(hit.lengths if hit else self._from_disk(u, self._lengths))
        at = np.zeros(len(parts), np.int64)
        np.cumsum([len(p) for p in parts[:-1]], out=at[1:])
        k = np.searchsorted(distinct, units)
        return np.concatenate(parts)[at[k] - np.asarray(firsts, np.int64)[k] + rows]

    def locate(self, row: int) -> str:
        """Where row `row`'s ids come from, for error messages."""
        u = int(self.units_of_rows(np.array([row]))[0])
        s = int(self.index.sample_of(np.array([row]))[0])
        name = self._range(s)[0]
        return f"manifest row {row} ({self.url}/{SHARDS_DIR}/{name}, sample {s}, cached at {self.path(u)})"

    def listing(self) -> set[int]:
        """The names (key) of the units whose files the cache holds now: one directory listing, not a
        stat per unit (a prefetcher's walk asks for a unit it does not know of: Prefetcher._all_cached)."""
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return set()
        return {
            int(n[: -len(BLOCK_EXT)])
            for n in names
            if n.endswith(BLOCK_EXT) and n[: -len(BLOCK_EXT)].isdigit()
        }

    def all_cached(self) -> bool:
        """Whether the cache holds every unit of the split (a listing at most once a second)."""
        now = time.monotonic()
        if now - self._listed[0] >= 1.0:
            keys = self.listing()
            n = len(keys)
            if self.per_doc:  # files are rows: count this val_fraction's (another's lie there too)
                n = int(np.isin(np.fromiter(keys, np.int64, len(keys)), self.blocks._val_rows).sum())
            self._listed = (now, n >= self.nunits)
        return self._listed[1]


class SampleLengths:
    """`lengths[rows]` of a bucket's dataset: its documents' token counts, read from their samples'
    cached copies (CachedBlocks.row_lengths); what DocBlocks.lengths is for the training split."""

    fetched = True  # a read may fetch samples: an epoch group's plan reads only as far as its steps go

    def __init__(self, cache: CachedBlocks):
        self.cache = cache

    def __getitem__(self, rows: Any) -> np.ndarray:
        if isinstance(rows, slice):
            rows = np.arange(rows.start, rows.stop)
        elif np.isscalar(rows):
            return self.cache.row_lengths(np.array([rows]))[0]
        return self.cache.row_lengths(rows)


def block_source(
    root: Path, info: dict[str, Any], index: DocIndex, blocks: DocBlocks, cache: CacheSettings | None
) -> CachedBlocks | None:
    """The cache a bucket's dataset (opened at `root`, remote.local_root) is read through; None for a
    local dataset, which is read in place."""
    if origin(root) is None:
        return None
    if info["format"] != FORMAT:
        raise refuse_legacy(origin(root), info["format"])
    return CachedBlocks(root, info, index, blocks, cache or CacheSettings.of())


def check_room(needs: list[tuple[CachedBlocks, int]], cache: CacheSettings) -> None:
    """Refuse, before any work, a data.cache_gb below what the loaders reading these bucket splits keep
    at once (`needs`: each split's working set, TokenLoader.cache_need), and a cache whose disk cannot
    hold what it would: the working set, or, where the splits are more than the disk holds, the bound
    (the cache evicts only at its bound: it would fill the disk first, and the run, or a checkpoint
    written beside it, stop there hours later; RV42a L2)."""
    need = sum(n for _, n in needs)
    urls = ", ".join(sorted({c.url for c, _ in needs}))
    if need > cache.max_bytes:
        gb = gb_holding(need)
        raise DatasetError(
            f"{cache.bound_key} = {cache.max_bytes / 1e9:g} is below the working set this plan reads from "
            f"{urls}: {gb:g} GB (the samples its loaders keep at once: docs/object-storage.md, Training "
            f"from a bucket); set {cache.bound_key} to at least {gb:g}"
        )
    splits = {id(c): c for c, _ in needs}.values()
    split_bytes, units = sum(c.split_bytes() for c in splits), sum(c.nunits for c in splits)
    space = _disk_free(cache.dir)
    if space is None:  # no answer (a filesystem without statvfs): its writes say when it is full
        return
    (free, block), held = space, _held(cache.dir)
    # What the cache's files may take on its disk: what is free and what they hold, each file ending in
    # a block of its own (the bound counts their bytes: a unit is ~225 kB at FineWeb-Edu's, 2% more).
    unit = split_bytes / max(1, units)
    room = int((free + held) * unit / (unit + block))
    disk = f"the disk of the cache {cache.dir} has {_gb(free)} GB free, and the cache holds {_gb(held)} GB"
    if need > room:
        raise DatasetError(
            f"{disk}: less than the working set this plan reads from {urls}, {gb_holding(need):g} GB; free "
            "room there, or give the cache a disk with room (data.cache_dir in a train config, --cache-dir "
            "in the data commands)"
        )
    if cache.max_bytes > room and split_bytes > room:
        raise DatasetError(
            f"{cache.bound_key} = {cache.max_bytes / 1e9:g} is more than the cache can hold: {disk}, and "
            f"{urls} hold {_gb(split_bytes)} GB, so the cache would fill the disk before its bound (it "
            f"evicts only there); set {cache.bound_key} to at most {gb_within(room):g} (the working set "
            f"needs {gb_holding(need):g}), or give the cache a disk with room"
        )


def _gb(n: int) -> str:
    """Bytes `n` as GB in a message, in the figures data.cache_gb takes (0.000166, not 1.66e-04)."""
    return np.format_float_positional(float(f"{n / 1e9:.3g}"), trim="-")


def _disk_free(path: Path) -> tuple[int, int] | None:
    """The bytes this user may still write on the filesystem of `path` (or of its nearest folder that
    exists: a cache not made yet), and its block size; None where the system does not say."""
    try:
        while not path.exists() and path != path.parent:
            path = path.parent
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_frsize


def _held(cache_dir: Path) -> int:
    """The bytes of the cache's unit files: its count (USAGE), else a listing."""
    counted = _usage(cache_dir)
    return counted if counted is not None else sum(size for _, size, _ in cache_usage(cache_dir))


def gb_within(room: int) -> float:
    """The largest figure of 3 significant digits, as data.cache_gb, whose bytes `room` holds."""
    x = room / 1e9
    if x <= 0:
        return 0.0
    value = float(f"{x:.3g}")
    step = 10.0 ** (math.floor(math.log10(value)) - 2)
    while value > 0 and int(value * 1e9) > room:
        value = float(f"{value - step:.3g}")
    return value


def gb_holding(need: int) -> float:
    """The smallest figure of 3 significant digits that holds `need` bytes as data.cache_gb: the
    figure a refusal quotes, set as it is, is not refused again (rounded to the nearest, it was:
    review R19b 6)."""
    x = need / 1e9
    if x <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    value = (math.floor(x / step) - 1) * step  # from below: the float division may land a step high
    while int(float(f"{value:.3g}") * 1e9) < need:
        value += step
    return float(f"{value:.3g}")


# --------------------------------------------------------------------------------------------
# eviction


def cache_usage(cache_dir: Path) -> list[tuple[Path, int, float]]:
    """(file, bytes, last needed) of every block file the cache holds (only its own: cache_files)."""
    out = []
    for path in cache_files(cache_dir):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((path, st.st_size, st.st_atime))  # Prefetcher._touch sets it; so does a read
    return out


def cache_files(cache_dir: Path) -> list[Path]:
    """The cache's unit files: `<dir>/blocks/*.blk` (samples) and `<dir>/blocks/heldout/*.blk` (held-out
    documents) of the dataset directories it made (ORIGIN)."""
    return [
        p
        for d in sorted(cache_dir.glob(f"*/{ORIGIN}"))
        for pattern in (f"*{BLOCK_EXT}", f"{HELDOUT_DIR}/*{BLOCK_EXT}")
        for p in sorted((d.parent / BLOCKS_DIR).glob(pattern))
    ]


def make_room(cache: CacheSettings, incoming: int) -> None:
    """Make room for `incoming` more bytes within the bound, and count them. The cache's usage is a
    count in USAGE, kept under node_lock by every write and eviction (a block deleted otherwise only
    makes it high: safe); when it says the bytes do not fit, the cache is listed and blocks are
    evicted down to EVICT_TO of the bound (so a full cache is listed once per many fetches, not at
    each): those no live loader keeps, least recently needed first; then those only another loader
    on the node keeps (it fetches them again: slower, never wrong), by access time too; never this
    process's (or its parent's: a DataLoader worker's rank) keep list. The caller holds node_lock.
    (Another loader's in the order it needs them, the furthest ahead first, fetched more at small
    groups: its current groups were in its memory already, the ones ahead its prefetcher had fetched
    and took for cached; review R19c 1.)"""
    used = _usage(cache.dir)
    if used is None or used + incoming > cache.max_bytes:
        _remove_dead_tmp(cache.dir)
        ours, theirs = live_keep(cache.dir)
        files = cache_usage(cache.dir)
        used = sum(size for _, size, _ in files)
        goal = min(cache.max_bytes, int(cache.max_bytes * EVICT_TO))
        victims = sorted((f for f in files if f[0] not in ours), key=lambda f: (f[0] in theirs, f[2]))
        for path, size, _ in victims:
            if used + incoming <= goal:
                break
            path.unlink(missing_ok=True)
            used -= size
    cache_write(
        cache.dir,
        lambda: cache.dir.mkdir(parents=True, exist_ok=True),
        lambda: write_atomic(cache.dir / USAGE, str(used + incoming), fsync=False),
    )


def _usage(cache_dir: Path) -> int | None:
    """The count in USAGE, None where there is none or it cannot be the bytes held: the cache is listed
    then. A count too high only evicts sooner; one below zero (a damaged file, a hand edit) let every
    fetch fit, and the blocks went past the bound (trial RV69b F4)."""
    try:
        counted = int((cache_dir / USAGE).read_text())
    except (OSError, ValueError):
        return None
    return counted if counted >= 0 else None


def _remove_dead_tmp(cache_dir: Path) -> None:
    """Temporary files `.NAME.HOST.PID.tmp` of this host's dead processes (a download killed midway)."""
    here = host()
    for d in cache_dir.glob(f"*/{ORIGIN}"):
        for tmp in d.parent.rglob(".*.tmp"):
            parts = tmp.name.rsplit(".", 3)
            if len(parts) == 4 and parts[1] == here and parts[2].isdigit() and not pid_alive(int(parts[2])):
                tmp.unlink(missing_ok=True)


def live_keep(cache_dir: Path) -> tuple[set[Path], set[Path]]:
    """The block files in the keep lists of live loaders: (this process's and its parent's, the
    others'); a dead process's list on this host is removed."""
    here = host()
    ours: set[Path] = set()
    theirs: set[Path] = set()
    for path in (cache_dir / KEEP_DIR).glob("*.json"):
        name_host, _, rest = path.stem.rpartition("-")
        pid = rest.partition("_")[0]
        if name_host == here and pid.isdigit() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)
            continue
        own = name_host == here and pid in (str(os.getpid()), str(os.getppid()))
        try:
            kept = json.loads(path.read_text())["blocks"]
        except (OSError, ValueError, KeyError):
            continue
        target = ours if own else theirs
        for d, ids in kept.items():
            target.update(Path(d) / f"{b}{BLOCK_EXT}" for b in ids)
    return ours, theirs


# --------------------------------------------------------------------------------------------
# prefetching in the plan's order


class Prefetcher:
    """Fetches ahead the blocks the plan reads next, in the order it reads them, `requests` at a time
    (threads in the loader's process); `needs(step)` names the (table, block) pairs global step `step`
    reads, `groups(step)` the (table, block) pairs of the epoch groups it reads (kept until those
    groups end). An error (a damaged object, an unreachable store) is kept and raised by `check()` at
    the next step the consumer takes, before any step reads the block."""

    def __init__(
        self,
        caches: list[CachedBlocks | None],
        needs: Callable[[int], list[tuple[int, int]]],
        groups: Callable[[int], frozenset[tuple[int, int]]],
        keys: Callable[[int], tuple],
        start: int,
        last_step: int | None,
        keep_bytes: int,
        lead: int = 0,
    ):
        """`keep_bytes`: the most this loader keeps (its working set, TokenLoader.cache_need, which
        data.cache_gb was checked against together with the other loaders'): the steps ahead are
        planned within it, never within the whole bound (which would leave a validation loader of the
        same process no room but past the bound: it cannot evict its own process's keep list).
        `lead`: how many steps past the consumer's its DataLoader workers build (0: none)."""
        self.caches, self.needs, self.groups, self.keys, self.last_step = (
            caches,
            needs,
            groups,
            keys,
            last_step,
        )
        self.cache = next(c for c in caches if c is not None).cache
        self.keep_bytes = min(keep_bytes, self.cache.max_bytes)
        self.lead = lead
        # advance's wait: the last step whose groups the published keep list holds, the step the last
        # whole walk began at, and a step the consumer waits at (it read past the keep list)
        self._published_to: float = -1
        self._walked_from: float = -1
        self._wanted = -1
        self._span = 0  # the steps the last walk planned past its own
        self.requests = requests = self.cache.requests
        self._step = start
        self._stop = False
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._memo: dict[int, list[tuple[int, int]]] = {}
        self._group_memo: dict[int, frozenset[tuple[int, int]]] = {}
        self._published: object = None
        self._keeping_all = False
        self._due: float = 0  # the step at which the thread walks the plan again
        # A held-out split's units are documents, fetched as steps read them (not a group at a time).
        self._per_doc = any(c.per_doc for c in caches if c is not None)
        self._horizon = start
        self._fresh: set[tuple[int, int]] = set()  # what this window marks as just needed (_touch)
        self._touched_at = -float("inf")  # when the groups being read were last marked as needed
        self._listed_at = -float("inf")  # when what the caches hold was last forgotten (_all_cached)
        self._relisted: set[int] = set()  # the tables listed since
        self.keep_file = self.cache.dir / KEEP_DIR / f"{host()}-{os.getpid()}_{id(self)}.json"
        self._pool = _FetchThreads(requests, "gristmill-fetch")
        self._thread = threading.Thread(target=self._run, name="gristmill-prefetch", daemon=True)
        self._thread.start()

    def advance(self, step: int) -> None:
        """The consumer's next step is `step` (0-based). The thread is woken only when it has work: the
        step reached the one at which it walks the plan again (waking it at every step cost the
        consumer the GIL's hand-offs: a fifth of a warm loader's time)."""
        with self._cond:
            self._step = step
            if step >= self._due:
                self._cond.notify()
            # Steps read past the published keep list: it still named the groups of the steps before,
            # which make_room may not evict, and the samples they read went past the bound (the thread
            # starved of a core on a loaded machine: 4 groups in a cache of 3). It waits until the keep
            # list holds the groups of the steps read (it and its DataLoader workers' `lead`), or a walk
            # from its step has ended (one whose working set cannot hold them: as far as it goes). The
            # workers' steps count up to half of what the last walk planned ahead: a lead past that
            # (32 workers, 64 steps; the tests' walks of one step) waited for a walk at every step, and
            # the fetches no longer overlapped the training (trial RV76a 2).
            reach = step + min(self.lead, self._span // 2)
            reach = reach if self.last_step is None else min(reach, self.last_step - 1)
            if 0 <= self._published_to < reach and (self.last_step is None or step < self.last_step):
                self._wanted = step
                self._cond.notify()
                while (
                    self._published_to < reach
                    and self._walked_from < step
                    and not (self._stop or STOP_FETCHING.is_set() or self.error is not None)
                    and self._thread.is_alive()
                ):
                    self._cond.wait(timeout=1.0)
                self._wanted = -1

    def check(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)
        self._pool.close()
        # A cache that turned unwritable meanwhile (the error being raised now, perhaps): a close that
        # raised too replaced that error, and the trainer stopped without saving its last step (trial
        # RV60a 5). A list left behind keeps its blocks from eviction until this process ends; the
        # next live_keep on the node then removes it (a dead process's).
        with contextlib.suppress(OSError):
            self.keep_file.unlink(missing_ok=True)

    def _step_needs(self, step: int) -> list[tuple[int, int]]:
        hit = self._memo.get(step)
        if hit is None:
            hit = self._memo[step] = [(t, b) for t, b in self.needs(step) if self.caches[t] is not None]
        return hit

    def _step_groups(self, step: int) -> frozenset[tuple[int, int]]:
        hit = self._group_memo.get(step)
        if hit is None:
            hit = self._group_memo[step] = self.groups(step)  # only sources in a bucket
        return hit

    def _bytes(self, pairs: Iterable[tuple[int, int]]) -> int:
        by_table: dict[int, list[int]] = {}
        for t, u in pairs:
            by_table.setdefault(t, []).append(u)
        return sum(self.caches[t].units_bytes(np.array(us)) for t, us in by_table.items())

    def window(self, step: int) -> tuple[list[tuple[int, int]], set[tuple[int, int]]]:
        """(to fetch: `step`'s units and the next steps', in the order the plan first reads them; to
        keep: every unit of the epoch groups the last LAG_STEPS steps, this one and the steps ahead
        read). The steps ahead go as far as their groups fit keep_bytes (and the plan goes): a step's
        groups are counted before the step is planned, since planning it fetches samples of them (the
        lengths of the documents it reaches)."""
        for old in [s for s in self._memo if s < step - LAG_STEPS]:
            del self._memo[old]
        for old in [s for s in self._group_memo if s < step - LAG_STEPS]:
            del self._group_memo[old]
        keep: set[tuple[int, int]] = set()
        for s in range(max(0, step - LAG_STEPS), step + 1):
            keep |= self._step_groups(s)
        if time.monotonic() - self._listed_at >= RELIST_EVERY_S:  # what other loaders did since
            for c in self.caches:
                if c is not None:
                    c.forget_known()
            self._relisted, self._listed_at = set(), time.monotonic()
        fetch: list[tuple[int, int]] = []
        # groups kept that the published keep list lacks (advance's wait counts only what it holds)
        unpublished = True
        if self._per_doc or not self._all_cached(keep):
            # What the previous window kept and this one does not can make room before anything is
            # fetched: the keep list is published before each step is planned.
            self._publish(keep)
            self._covered(step)
            unpublished = False
            fetch = list(dict.fromkeys(self._step_needs(step)))
        queued = set(fetch)
        # Marked as just needed (_touch): the groups being read, every TOUCH_EVERY_S (the order in
        # which make_room takes the units no loader keeps, then those only other loaders keep). Not the
        # groups ahead as they enter the keep list: two syscalls a unit, each a hand-off of the GIL the
        # loop waits for (~10% of a warm loader's time at the bench's groups of 16); a fetched copy is
        # a new file. So another loader that must take what this one keeps can take the group it reads
        # now (its reader holds their copies in memory, mostly; one it must read again is fetched
        # again: slower, never wrong).
        self._fresh = set()
        if time.monotonic() - self._touched_at >= TOUCH_EVERY_S:
            self._fresh = set(keep)
            self._touched_at = time.monotonic()
        used = self._bytes(keep)
        end = step + MAX_AHEAD_STEPS
        horizon = step  # the last step planned (self._horizon once walked)
        last = end if self.last_step is None else min(end, self.last_step)
        s = step + 1
        walked: tuple | None = None  # the groups (BatchBuilder.group_keys) of the steps just planned
        complete = False
        while s < last and not self._stop:  # a step's plan may fetch: a close waits for one, no more
            if self.keys(s) != walked:  # other groups: counted, and looked up in the cache, once
                grown = self._step_groups(s) - keep
                cost = self._bytes(grown)
                if used + cost > self.keep_bytes:
                    break
                keep |= grown
                used += cost
                if not self._all_cached(grown):
                    # a group not all cached: this step's plan fetches what it reads, into room made first
                    self._publish(keep)
                    unpublished = False
                elif grown:
                    unpublished = True
                # A group's plan fetches only what its steps reach: a partly fetched one has its steps
                # planned, and what they read fetched, one by one; one whose samples are all cached, not.
                complete = not self._per_doc and self._all_cached(self._step_groups(s))
                walked = self.keys(s)
            horizon = s
            if complete:  # a training step inside groups all fetched; so are the steps after it there
                s = horizon = self._same_groups_until(s, last)
            if not unpublished:
                self._covered(horizon)
            if complete:
                s += 1
                continue
            new = [n for n in dict.fromkeys(self._step_needs(s)) if n not in queued]
            queued.update(new)
            fetch += new
            s += 1
        self._horizon = horizon
        return fetch, keep

    def _covered(self, step: float) -> None:
        """The published keep list holds the groups of the steps up to `step` (advance waits for it). Set
        after each publish: in between, the value may name steps of the list before, whose groups the
        new, smaller list may have dropped; a reader let through then fetches into a cache whose list
        spares less, never more (review RV76b 4)."""
        with self._cond:
            self._published_to = step
            self._cond.notify_all()

    def _same_groups_until(self, s: int, last: int) -> int:
        """The last step before `last` up to which every step reads no epoch group step `s` does not,
        found by doubling then halving the distance over the steps whose keys (BatchBuilder.group_keys:
        the phase, each source's groups) equal step s's. Each source's stream only moves forward, and
        a source a phase weighs takes at least one window a step on average (the plan refuses less),
        so the largest-remainder split never leaves it out of two steps in a row: a source step s
        reads is read, between two steps with s's keys, in the same groups or not at all; one step s
        does not read is read by step s + 1, whose keys differ, and the search stops there."""
        want = self.keys(s)
        lo, d = s, 1
        while lo + d < last and self.keys(lo + d) == want:
            lo, d = lo + d, d * 2
        hi = min(lo + d, last)  # reads other groups, or is past the walk's end
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.keys(mid) == want else (lo, mid)
        return lo

    def _all_cached(self, pairs: Iterable[tuple[int, int]]) -> bool:
        """Whether the cache holds every one of `pairs`, as far as this process knows
        (CachedBlocks.on_disk: what it listed, fetched or found there); a cache is listed for a unit it
        does not know of at most once every RELIST_EVERY_S (what it knows is forgotten as often). A
        unit thought missing that another process fetched is found, and known from then on, by the
        plan's fetch or this thread's (a stat); one another loader evicted is fetched where it is read
        (slower, never wrong). So a walk makes no syscall here: listed at every walk, a FineWeb-Edu
        working set's directory (~12,000 files) held the GIL the loop waits for."""
        for t, u in pairs:
            c = self.caches[t]
            key = c.key(u)
            if key not in c.on_disk:
                if t in self._relisted:
                    return False
                self._relisted.add(t)
                c.on_disk = c.listing()
                if key not in c.on_disk:
                    return False
        return True

    @functools.cached_property
    def _whole_fits(self) -> bool:
        """Whether every unit of the splits fits this loader's working set (asked at the thread's first
        turn: a sum of the index's totals, no array of every unit)."""
        return sum(c.split_bytes() for c in self.caches if c is not None) <= self.keep_bytes

    def _publish(self, keep: Iterable[tuple[int, int]]) -> None:
        by_dir: dict[str, list[int]] = {}
        for t, b in keep:
            by_dir.setdefault(str(self.caches[t].dir), []).append(self.caches[t].key(b))
        payload = {d: sorted(ids) for d, ids in sorted(by_dir.items())}
        if payload != self._published or not self.keep_file.exists():  # the cache emptied meanwhile
            cache_write(
                self.cache.dir,
                lambda: self.keep_file.parent.mkdir(parents=True, exist_ok=True),
                lambda: write_atomic(self.keep_file, json.dumps({"blocks": payload}), fsync=False),
            )
            self._published = payload

    def _touch(self, units: Iterable[tuple[int, int]]) -> None:
        """Mark cached units as just needed (their access time): the groups being read (window).
        Eviction goes least recently needed first among the units no live loader keeps (the reader's
        hot path touches no file). The modification time stays the copy's: it is part of a copy's
        identity (_identity), which a touch must not change."""
        now = time.time_ns()
        for t, b in units:
            path = self.caches[t]._file(b)
            with contextlib.suppress(FileNotFoundError):
                os.utime(path, ns=(now, os.stat(path).st_mtime_ns))

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stop:
                        return
                    step = self._step
                # Nothing to fetch: keep it all, where it all fits this loader's working set (kept
                # past it, a validation loader of this process found no room and wrote past the bound;
                # asked first: where it cannot fit, no listing of the cache once a second)
                if self._whole_fits and all(c is None or c.all_cached() for c in self.caches):
                    if not self._keeping_all:
                        self._publish((t, b) for t, c in enumerate(self.caches) if c for b in range(c.nunits))
                        self._keeping_all = True
                        self._covered(math.inf)  # every unit kept: no step reads past it
                    self._due = float("inf")  # looked at again once a second (the wait's timeout)
                    fetch: list[tuple[int, int]] = []
                elif step < self._due and not self._keeping_all and self._wanted <= self._walked_from:
                    fetch = []  # the last window planned this far and keeps its groups: nothing new
                else:
                    self._keeping_all = False
                    fetch, keep = self.window(step)
                    self._publish(keep)
                    self._covered(self._horizon)
                    with self._cond:
                        self._walked_from, self._span = step, max(0, self._horizon - step)
                        self._cond.notify_all()
                    self._touch(self._fresh)
                    # Planned up to self._horizon: walk the plan again halfway there, or three
                    # quarters when it had nothing to fetch (every step, the walk held the GIL the
                    # consumer waits for).
                    ahead = self._horizon - step
                    self._due = step + max(1, ahead // 2 if fetch else ahead * 3 // 4)
                self._fetch_all(fetch, step)
                with self._cond:
                    if not self._stop and self._step == step:
                        self._cond.wait(timeout=1.0)
        except BaseException as e:  # kept for the consumer's next step
            self.error = e

    def _fetch_all(self, fetch: list[tuple[int, int]], step: int) -> None:
        """Fetch in order, `requests` in flight; stop submitting when the consumer moved on."""
        inflight: list[Future] = []
        for t, b in fetch:
            if self._stop or self._step > step + LAG_STEPS:
                break
            c = self.caches[t]
            if c.key(b) in c.on_disk or c.cached(b):  # what this walk's plans fetched: no syscall each
                c.known(b)
                continue
            # a wait that ends at a stop: a close then joins this thread at once, not after a request in
            # flight to a store that does not answer
            while len(inflight) >= self.requests:
                self._pool.result(inflight.pop(0))
            inflight.append(self._pool.submit(self.caches[t].fetch, b))
        for f in inflight:
            self._pool.result(f)
