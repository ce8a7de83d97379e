"""The process's budget of memory maps (training/data/open_maps.py): each reader keeps at most what it
asked for, the process at most its budget (the biggest reader gives way), a reader's maps close with
it, and the open-file limit is raised before a reader opens anything. The readers' side, with real
datasets at a low open-file limit: tests/test_object_storage.py."""

from __future__ import annotations

import gc
import os
import resource
import signal
import threading
import time

from training.data.open_maps import RESERVE, OpenMaps


class Reader:
    pass


def test_a_reader_keeps_at_most_what_it_asked_for_least_recently_used_first():
    maps = OpenMaps(max_maps=100)
    reader = Reader()
    owner = maps.register(reader)
    for k in range(3):
        maps.put(owner, k, f"map {k}", most=2)
    assert maps.count(owner) == 2 and maps.get(owner, 0) is None
    assert maps.get(owner, 1) == "map 1"  # now the most recent: 2 goes next
    maps.put(owner, 3, "map 3", most=2)
    assert (maps.get(owner, 1), maps.get(owner, 2), maps.get(owner, 3)) == ("map 1", None, "map 3")
    # A batch's lookup (one lock for all its files): the open ones, each now the most recent.
    assert maps.get_many(owner, [1, 2, 0]) == {1: "map 1"} and maps.get_many(Reader, [1]) == {}
    maps.put(owner, 4, "map 4", most=2)  # 3 goes: 1 was used after it
    assert maps.get_many(owner, [3, 1, 4]) == {1: "map 1", 4: "map 4"}


def test_past_the_budget_the_biggest_reader_gives_way():
    maps = OpenMaps(max_maps=4)
    readers = [Reader(), Reader()]
    big, small = (maps.register(r) for r in readers)
    for k in range(4):
        maps.put(big, k, k, most=10)
    maps.put(small, "a", "a", most=10)
    maps.put(small, "b", "b", most=10)
    assert (maps.count(big), maps.count(small), maps.count()) == (2, 2, 4)
    assert maps.get(big, 0) is None and maps.get(big, 1) is None and maps.get(big, 3) == 3
    maps.pop(small, "a")
    assert maps.count() == 3


def test_a_reader_s_maps_close_with_it():
    maps = OpenMaps()
    reader = Reader()
    owner = maps.register(reader)
    maps.put(owner, 0, bytearray(8), most=4)
    assert maps.count() == 1
    del reader
    gc.collect()
    assert maps.count() == 0 and maps.get(owner, 0) is None


def test_the_soft_open_file_limit_is_raised_to_the_hard_one_when_a_reader_registers():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        low = min(soft, hard, 1024) - 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        maps = OpenMaps(max_maps=2000)
        maps.register(Reader())
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert now == (2000 + RESERVE if hard == resource.RLIM_INFINITY else min(hard, 2000 + RESERVE))
        assert maps.budget() == min(2000, now - RESERVE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_process_forked_while_another_thread_holds_the_lock_can_use_its_maps():
    """A prefetcher thread plans (taking the lock) while DataLoader workers fork: a child must not
    inherit the lock held."""
    maps = OpenMaps()
    reader = Reader()
    owner = maps.register(reader)
    maps.put(owner, 0, "map 0", most=4)
    with maps._lock:  # as the other thread holds it at the fork
        pid = os.fork()
        if pid == 0:  # the child: its own lock, the maps it inherited
            os._exit(0 if maps.get(owner, 0) == "map 0" else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child waited on the lock"


def test_a_reader_collected_while_the_lock_is_held_has_its_maps_closed_after():
    """The cyclic collector may run a reader's finalizer in a thread that holds the lock (inside a
    put): the finalizer only notes the reader, and the next call closes its maps."""
    maps = OpenMaps()
    reader = Reader()
    reader.me = reader  # a cycle: only the collector frees it (a table and its lengths view are one)
    owner = maps.register(reader)
    maps.put(owner, 0, "map 0", most=4)

    def collect_holding_the_lock():
        with maps._lock:
            gc.collect()

    gc.disable()  # the reader is collected in the thread, with the lock held, not before
    try:
        del reader
        thread = threading.Thread(target=collect_holding_the_lock, daemon=True)
        thread.start()
        thread.join(10)
    finally:
        gc.enable()
    assert not thread.is_alive(), "the finalizer waited on the lock its own thread held"
    assert maps.count() == 0 and maps.get(owner, 0) is None
