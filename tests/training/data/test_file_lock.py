"""The cache's file locks (training/contract/file_lock.py: `file_lock`, under `node_lock`, a unit's fetch and
the epoch order's cache): released on the way out even when a process forked meanwhile holds a copy
of the descriptor. A DataLoader worker forked while the prefetcher thread fetched would otherwise
hold the node's lock for its whole life, and every fetch on the node (its own loader's too) waits."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import threading
import time

from training.contract.file_lock import LockWaitError
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


class _Holder:
    """A forked process that takes the node's lock of `cache` and holds it until `release`."""

    def __init__(self, cache, host: str | None = None) -> None:
        """`host`: the name the holder records (a pod of another name on the same node's disk)."""
        self.cache = cache
        held, self.told = os.pipe()
        self.wait_for, release = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            if host is not None:
                socket.gethostname = lambda: host
            with node_lock(cache):
                os.write(self.told, b"x")
                os.read(self.wait_for, 1)
            os._exit(0)
        os.read(held, 1)
        self.release_fd = release

    def release(self) -> int:
        os.write(self.release_fd, b"x")
        return os.waitpid(self.pid, 0)[1]

    def kill(self) -> None:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


def _wait_in_thread(cache) -> tuple[threading.Thread, list]:
    outcome: list = []

    def wait() -> None:
        try:
            with node_lock(cache, wait_s=0.5):  # a training's data.fetch_timeout_s
                outcome.append("taken")
        except Exception as e:
            outcome.append(e)

    thread = threading.Thread(target=wait, daemon=True)  # (daemon: a wait that never ends fails, not hangs)
    thread.start()
    return thread, outcome


def _waited_for(holder: _Holder) -> _Holder:
    """A waiter for `holder`'s lock still waits after five times its bound (0.5 s), and takes the lock
    once the holder lets go; returns the holder (its pid names it in the lines)."""
    try:
        thread, outcome = _wait_in_thread(holder.cache)
        time.sleep(2.5)
        assert thread.is_alive() and outcome == []
        assert holder.release() == 0
        thread.join(timeout=20)
        assert outcome == ["taken"]
    finally:
        holder.kill()
    return holder


def test_a_wait_for_the_node_lock_names_its_holder_and_a_stopped_one_ends_it_in_one_line(tmp_path, capsys):
    """A training stopped (SIGSTOP, Ctrl-Z) while it held the node's cache lock made the next one on
    that cache hang forever without a word (review R26b M2). Now: a line naming the lock and its holder
    after a second; a running holder is waited for; one not seen running for `wait_s` (a training's
    data.fetch_timeout_s) ends the wait in one line with the fix."""
    host = socket.gethostname()
    lock = tmp_path / LOCK
    holder = _waited_for(_Holder(tmp_path))  # a running holder: waited for, however long
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1, said  # one line, whatever the wait
    assert said == [
        f"waiting for {lock}, held by pid {holder.pid} on {host} since {said[0].split(' since ')[1]}"
    ] and said[0].endswith("; one not running is waited for at most 0.5 s"), said

    holder = _Holder(tmp_path)
    try:  # a stopped holder: one line at the bound
        os.kill(holder.pid, signal.SIGSTOP)
        started = time.monotonic()
        thread, outcome = _wait_in_thread(tmp_path)
        thread.join(timeout=20)
        assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], LockWaitError), outcome
        assert time.monotonic() - started < 5
        stopped = f"(stopped: SIGSTOP or Ctrl-Z; `kill -CONT {holder.pid}` resumes it)"
        message = str(outcome[0])
        assert message.startswith(f"{lock} is still held by pid {holder.pid} on {host} since "), message
        assert message.endswith(
            f"{stopped}, not seen running for 0.5 s: resume that process or end it, or give this command a "
            "cache of its own (data.cache_dir in a train config, --cache-dir in the data commands)"
        ), message
        assert stopped in capsys.readouterr().out
    finally:
        holder.kill()


def test_a_holder_recorded_on_another_host_is_waited_for(tmp_path, capsys):
    """A holder whose record names another host (pods of other names sharing a node's cache on one
    hostPath: the flock is real, its holder's state cannot be seen) was counted as not running, and
    the wait ended a healthy run after data.fetch_timeout_s (review RV26c M2). It is waited for, and
    the line says why."""
    lock = tmp_path / LOCK
    holder = _waited_for(_Holder(tmp_path, host="pod-b"))
    (said,) = capsys.readouterr().out.splitlines()
    assert said.startswith(f"waiting for {lock}, held by pid {holder.pid} on pod-b since "), said
    assert "(another host: whether it runs cannot be told here, so it is waited for)" in said, said
