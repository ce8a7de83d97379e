"""The cache's file locks (training/contract/file_lock.py: `file_lock`, under `node_lock`, a unit's fetch and
the epoch order's cache): released on the way out even when a process forked meanwhile holds a copy
of the descriptor. A DataLoader worker forked while the prefetcher thread fetched would otherwise
hold the node's lock for its whole life, and every fetch on the node (its own loader's too) waits."""

from __future__ import annotations

import fcntl
import os
import threading

from training.data.remote import LOCK, node_lock


def test_the_node_lock_is_free_once_its_holder_leaves_though_a_child_forked_inside_lives_on(tmp_path):
    inside, release = threading.Event(), threading.Event()

    def holder() -> None:
        with node_lock(tmp_path):  # what a fetch does around making room and writing
            inside.set()
            release.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait()
    live, end = os.pipe()
    pid = os.fork()  # a worker starting while another thread holds the lock
    if pid == 0:
        os.close(end)
        os.read(live, 1)  # lives on until the test is done
        os._exit(0)
    os.close(live)
    try:
        release.set()
        thread.join()
        with open(tmp_path / LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: the child's copy held it
    finally:
        os.write(end, b"x")
        os.close(end)
        os.waitpid(pid, 0)
