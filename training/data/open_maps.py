"""The files this process's readers keep, all of them within one budget.

A reader keeps the files it reads: a local dataset's shards as memory maps, a bucket dataset's cached
samples as checked copies in memory (training/data/block_cache.py). An epoch group spreads its reads
over its 4,096 blocks (each a cached sample of a bucket's dataset, or part of a local shard), so a
reader is only as fast as the local loader while a group's files stay kept: reading a cached sample
again costs ~45 µs, and a reader that kept an eighth of its group ran at 0.14× the local loader
(bench/object_store.py). CPython's mmap keeps a duplicate of its file's descriptor, so each map kept
is an open file, and a common soft limit is 1,024 per process, shared by every dataset of a mixture.

Hence one budget per process: the soft open-file limit is raised to the hard one when a reader
registers, and RESERVE descriptors are left to everything else. A reader keeps at most what it asks
for (its `most`); past the budget, the least recently used map of the reader holding the most maps
closes. A bucket's copies hold no descriptor: they are bounded by their reader's `most` alone, and a
low hard limit (4,096 files, below a FineWeb-Edu group's 5,120) does not make their reader read a
sample again for nearly every document.
(Maps hold the low descriptor numbers, so a process's later sockets may be numbered past 1,024:
select.select refuses those; poll and epoll, which the libraries here use, do not.)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any

RESERVE = 256  # descriptors left to the rest of the process: sockets, pipes, logs, checkpoints
MAX_MAPS = 32_768  # maps at most, whatever the limit: vm.max_map_count's default is 65,530 areas

_tokens = itertools.count()


class OpenMaps:
    """Maps by (owner, key), least recently used first, within the process's budget (thread-safe: a
    prefetcher plans in a thread of its own)."""

    def __init__(self, max_maps: int = MAX_MAPS) -> None:
        self.max_maps = max_maps
        self._owners: dict[Hashable, OrderedDict[Hashable, Any]] = {}
        self._open = 0
        self._gone: list[Hashable] = []  # owners whose reader is garbage, their maps to close
        self._lock = threading.Lock()
        # A process forked while another thread held the lock (a prefetcher planning as DataLoader
        # workers start) would wait on it forever: the child takes a lock of its own.
        after_fork = weakref.WeakMethod(self._after_fork)
        os.register_at_fork(after_in_child=lambda: (method := after_fork()) and method())

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def register(self, reader: object, *, descriptors: bool = True) -> Hashable:
        """A new name for `reader`'s maps (unique across processes: a copy of a reader, unpickled in a
        DataLoader worker or here, gets its own), closed at the process's next lookup once the reader
        is garbage; the soft open-file limit is raised now, before the reader opens anything: to the
        hard one, or to max_maps + RESERVE when the hard one is higher. `descriptors`: whether what the
        reader keeps holds a file descriptor each (memory maps), and so counts in the budget."""
        owner = (os.getpid(), next(_tokens), descriptors)
        # Only noted here: the collector may run this inside a put that holds the lock.
        weakref.finalize(reader, self._gone.append, owner)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = self.max_maps + RESERVE
        if soft != resource.RLIM_INFINITY and soft < want:
            raised = want if hard == resource.RLIM_INFINITY else min(want, hard)
            with contextlib.suppress(ValueError, OSError):  # a platform's cap below its hard limit
                if raised > soft:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        return owner

    def budget(self) -> int:
        """Maps this process may keep: its soft open-file limit less RESERVE, at most max_maps."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = self.max_maps + RESERVE if soft == resource.RLIM_INFINITY else soft
        return max(1, min(self.max_maps, limit - RESERVE))

    def _close_gone(self) -> None:
        """Close the maps of readers that are garbage (with the lock held)."""
        while self._gone:
            owner = self._gone.pop()
            gone = len(self._owners.pop(owner, {}))
            self._open -= gone if owner[2] else 0  # owner[2]: its maps hold descriptors

    def get(self, owner: Hashable, key: Hashable) -> Any:
        """The owner's map named `key`, None when it has none open (a hit becomes the most recent)."""
        return self.get_many(owner, (key,)).get(key)

    def get_many(self, owner: Hashable, keys: Iterable[Hashable]) -> dict[Hashable, Any]:
        """The owner's maps of `keys` that are open, by key (hits become the most recent, in the order
        of `keys`): a batch's files under one acquisition of the lock, not one each (~70 per step)."""
        with self._lock:
            self._close_gone()
            mine = self._owners.get(owner)
            if mine is None:
                return {}
            hits = {}
            for key in keys:
                hit = mine.get(key)
                if hit is not None:
                    mine.move_to_end(key)
                    hits[key] = hit
            return hits

    def put(self, owner: Hashable, key: Hashable, value: Any, most: int) -> None:
        """Keep `value` as the owner's map `key`: the owner's least recently used one is closed when it
        holds `most`; when the process holds its budget of descriptors, the least recently used map of
        the owner holding the most."""
        budget = self.budget()
        with self._lock:
            self._close_gone()
            mine = self._owners.setdefault(owner, OrderedDict())
            if key in mine:
                mine[key] = value
                mine.move_to_end(key)
                return
            while len(mine) >= max(1, most):
                mine.popitem(last=False)
                self._open -= int(owner[2])
            while owner[2] and self._open >= budget:
                biggest = max((m for o, m in self._owners.items() if o[2]), key=len)
                if not biggest:
                    break
                biggest.popitem(last=False)
                self._open -= 1
            mine[key] = value
            self._open += int(owner[2])

    def pop(self, owner: Hashable, key: Hashable) -> None:
        with self._lock:
            mine = self._owners.get(owner)
            if mine is not None and mine.pop(key, None) is not None:
                self._open -= int(owner[2])

    def count(self, owner: Hashable | None = None) -> int:
        """What is kept: the owner's, or the maps holding the process's descriptors."""
        with self._lock:
            self._close_gone()
            return self._open if owner is None else len(self._owners.get(owner, ()))


OPEN_MAPS = OpenMaps()
