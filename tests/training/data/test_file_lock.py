"""The cache's file locks (training/contract/file_lock.py: `file_lock`, under `node_lock`, a unit's fetch and
the epoch order's cache): released on the way out even when a process forked meanwhile holds a copy
of the descriptor. A DataLoader worker forked while the prefetcher thread fetched would otherwise
hold the node's lock for its whole life, and every fetch on the node (its own loader's too) waits."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.mounts import python_in_namespace, sh_quote, unshare_works
from training.contract.file_lock import LockWaitError
from training.data.remote import LOCK, node_lock, node_lock_file

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


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
        with open(node_lock_file(tmp_path), "a") as f:
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


def _wait_in_thread(cache, name: str | None = None, wait_s: float = 0.5) -> tuple[threading.Thread, list]:
    outcome: list = []

    def wait() -> None:
        try:
            with node_lock(cache, wait_s=wait_s):  # a training's data.fetch_timeout_s
                outcome.append("taken")
        except Exception as e:
            outcome.append(e)

    # (daemon: a wait that never ends fails, not hangs)
    thread = threading.Thread(target=wait, name=name, daemon=True)
    thread.start()
    return thread, outcome


def _waited_for(holder: _Holder) -> _Holder:
    """A waiter for `holder`'s lock still waits after five times its bound (0.5 s), and takes the lock
    once the holder lets go; returns the holder (its pid names it in the lines)."""
    try:
        thread, outcome = _wait_in_thread(holder.cache)
        time.sleep(2.5)
        assert thread.is_alive() and outcome == []
        _release_to(holder, [(thread, outcome)])
    finally:
        holder.kill()
    return holder


def test_a_wait_for_the_node_lock_names_its_holder_and_a_stopped_one_ends_it_in_one_line(tmp_path, capsys):
    """A training stopped (SIGSTOP, Ctrl-Z) while it held the node's cache lock made the next one on
    that cache hang forever without a word (review R26b M2). Now: a line naming the lock and its holder
    after a second; a running holder is waited for; one not seen running for `wait_s` (a training's
    data.fetch_timeout_s) ends the wait in one line with the fix."""
    host = socket.gethostname()
    lock = tmp_path / LOCK  # waited for first: CACHE/.lock (node_lock)
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


def _until(done, what: str, timeout: float = 20.0) -> None:
    """Wait until `done()` (a condition on other threads' progress, never on how fast they are)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _release_to(holder: _Holder, waiters) -> None:
    """The holder lets go of the node lock; each waiter (_wait_in_thread) then takes it."""
    assert holder.release() == 0
    for thread, outcome in waiters:
        thread.join(timeout=20)
        assert outcome == ["taken"]


@pytest.mark.parametrize("emptying", ["contents", "directory"])
def test_the_node_lock_outlives_an_emptying_of_the_cache_and_its_waiters_name_the_holder(
    tmp_path, monkeypatch, emptying
):
    """`rm -rf CACHE/*` (or `rm -rf CACHE`) removed CACHE/.lock, the node's lock, under the process that
    held it: the next fetch made another, locked it and made room at the same time, both counting the
    same free bytes, and the cache went a sample past data.cache_gb (the emptied-cache bound test's
    flake: 92,832 bytes held of 77,916). The lock is a file beside the cache: a waiter that comes after
    the emptying waits too. Each waiter names the running holder from its record, which the emptying
    left (E27f's lock on the directory lost it with the emptying: the holder was taken for "a process
    that left no details" and the wait ended in LockWaitError after wait_s, review RV27e F-LOCKWAIT),
    and goes on waiting past wait_s, until the holder lets go."""
    from training.contract import file_lock
    from training.data import remote

    cache = tmp_path / "cache"
    monkeypatch.setattr(file_lock, "SAY_AFTER_S", 0.0)  # a waiter's line at its first look at the holder
    said: dict[str, list[str]] = {}
    looks: dict[str, list[float]] = {}  # per waiter, when it looked at the holder's record
    look = file_lock._holder

    def looked(*args):
        looks.setdefault(threading.current_thread().name, []).append(time.monotonic())
        return look(*args)

    monkeypatch.setattr(file_lock, "_holder", looked)
    monkeypatch.setattr(
        remote, "say", lambda line: said.setdefault(threading.current_thread().name, []).append(line)
    )
    holder = _Holder(cache)  # another process of the node, inside the lock
    try:
        (cache / "copy" / "blocks").mkdir(parents=True)
        (cache / "copy" / "blocks" / "0.blk").write_bytes(b"x")
        waiters = {"before": _wait_in_thread(cache, "before")}
        _until(lambda: looks.get("before") or waiters["before"][1], "the first waiter never waited")
        since = {
            "before": time.monotonic()
        }  # (a wait's clock of wait_s, were its holder lost, runs from here)
        if emptying == "directory":
            shutil.rmtree(cache)
        else:
            for child in cache.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        since["after"] = time.monotonic()
        waiters["after"] = _wait_in_thread(cache, "after")
        _until(lambda: looks.get("after") or waiters["after"][1], "the second waiter never waited")
        assert waiters["after"][1] == [], (
            "a waiter that came after the emptying took the lock from its holder"
        )

        def looked_again(name: str) -> bool:  # wait_s (0.5 s) after the emptying or its start, and once more
            late = [t for t in looks.get(name, []) if t >= since[name] + 0.5]
            return len(late) >= 2 or bool(waiters[name][1])

        _until(lambda: all(looked_again(name) for name in waiters), "the waiters stopped looking")
        assert {name: outcome for name, (_, outcome) in waiters.items()} == {"before": [], "after": []}
        # one line each: the holder never became "a process that left no details"; the first waits at
        # CACHE/.lock (node_lock's first file, removed under it), the one after the emptying took the
        # new CACHE/.lock and waits at the file beside, which the emptying left
        for name, lock in (("before", cache / LOCK), ("after", node_lock_file(cache))):
            (line,) = said[name]
            assert line.startswith(f"waiting for {lock}, held by pid {holder.pid} on "), line
            assert line.endswith("; one not running is waited for at most 0.5 s") and "(" not in line, line
        _release_to(holder, waiters.values())
    finally:
        holder.kill()


def _ended_naming(waiters: dict, said: dict[str, list[str]], lock: Path, pid: int) -> None:
    """Every waiter (_wait_in_thread, by name) ended in a LockWaitError at `lock` naming the process
    `pid`, and its every line (`said`, by name) waited there for that process."""
    for name, (thread, outcome) in waiters.items():
        assert not thread.is_alive() and len(outcome) == 1, (name, outcome)
        assert isinstance(outcome[0], LockWaitError), (name, outcome)
        assert str(outcome[0]).startswith(f"{lock} is still held by pid {pid} "), (name, outcome)
        waited = f"waiting for {lock}, held by pid {pid} "
        assert said[name] and all(line.startswith(waited) for line in said[name]), (name, said[name])


def test_a_stopped_holder_of_the_lock_in_the_cache_alone_ends_every_waiter_s_wait_at_its_bound(
    tmp_path, monkeypatch
):
    """A stopped holder (SIGSTOP) of CACHE/.lock alone: an earlier version's training, or one that
    reaches the cache by another path. node_lock took the file beside first: the first waiter held it
    while it waited at CACHE/.lock, and every other waiter waited for that running waiter, its clock
    stopped: the k-th ended after k × wait_s, its line naming a waiter, not the stopped holder (review
    RV28b F1). CACHE/.lock comes first now: every waiter waits there, names the stopped holder and ends
    at its bound."""
    from training.contract import file_lock
    from training.data import remote

    cache = tmp_path / "cache"
    monkeypatch.setattr(file_lock, "SAY_AFTER_S", 0.0)  # a waiter's line at its first look at the holder
    said: dict[str, list[str]] = {}
    monkeypatch.setattr(
        remote, "say", lambda line: said.setdefault(threading.current_thread().name, []).append(line)
    )
    held, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with remote.cache_lock(cache, cache / LOCK):  # the one lock an earlier version takes
                os.write(told, b"x")
                time.sleep(600)
        finally:
            os._exit(0)
    try:
        os.read(held, 1)
        os.kill(pid, signal.SIGSTOP)
        waiters = {name: _wait_in_thread(cache, name) for name in ("first", "second")}
        for thread, _ in waiters.values():
            thread.join(timeout=20)
        _ended_naming(waiters, said, cache / LOCK, pid)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_cache_emptied_under_a_stopped_holder_ends_every_waiter_s_wait_at_its_bound(tmp_path, monkeypatch):
    """A holder of both lock files stopped (SIGSTOP, Ctrl-Z), then `rm -rf CACHE/*`: the first fetch
    after it made a new CACHE/.lock and waited at the file beside holding it, and the others waited
    for that running fetch, their clocks stopped: the k-th ended after k × wait_s, its line naming a
    waiter, not the stopped holder (review RV28e F1). No wait at one file holds the other now: every
    waiter names the stopped holder at the file beside and ends at its bound, all of them before the
    second could have then (2 × wait_s; the margin is for a loaded machine's stalls)."""
    from training.contract import file_lock
    from training.data import remote

    cache, wait_s = tmp_path / "cache", 1.5
    monkeypatch.setattr(file_lock, "SAY_AFTER_S", 0.5)  # a waiter's first look at the holder
    said: dict[str, list[str]] = {}
    monkeypatch.setattr(
        remote, "say", lambda line: said.setdefault(threading.current_thread().name, []).append(line)
    )
    holder = _Holder(cache)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        for child in cache.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        started = time.monotonic()
        waiters = {name: _wait_in_thread(cache, name, wait_s) for name in ("first", "second", "third")}
        for thread, _ in waiters.values():
            thread.join(timeout=20)
        took = time.monotonic() - started  # (before: 3 × wait_s, the third waiter's end)
        assert took < 2 * wait_s, took
        _ended_naming(waiters, said, node_lock_file(cache), holder.pid)
    finally:
        holder.kill()


def test_the_node_lock_and_an_earlier_version_s_order_of_its_files_take_turns(tmp_path):
    """An earlier version (98f8890) took the file beside, then CACHE/.lock; the next one the other way
    round: side by side on one cache, each held one file and waited at the other, both running, so
    neither wait ever ended (review RV28e F3). node_lock never waits at one while it holds the other:
    both go on. Two threads, 50 fetches each (a deadlock: a thread still waiting after 20 s)."""
    from training.data import remote

    cache, done = tmp_path / "cache", []

    def earlier() -> None:  # the order of 98f8890
        for _ in range(50):
            with remote._beside_lock(node_lock_file(cache), 0.5), remote.cache_lock(cache, cache / LOCK, 0.5):
                pass
        done.append("earlier")

    def this() -> None:
        for _ in range(50):
            with node_lock(cache, wait_s=0.5):
                pass
        done.append("this")

    # (daemon: a deadlock fails, not hangs)
    threads = [threading.Thread(target=run, daemon=True) for run in (earlier, this)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert sorted(done) == ["earlier", "this"], f"deadlocked: only {done} finished"


# A process that takes the node lock of each cache twice (two fetches) and says, inside it, which of
# its two files it holds: the file beside the cache, and CACHE/.lock ("none": no such file).
_LOCKS_OF = (
    "import fcntl, sys; from pathlib import Path\n"
    "from training.data.remote import LOCK, node_lock, node_lock_file\n"
    "def held(path):\n"
    "    try:\n"
    "        f = open(path)\n"
    "    except OSError:\n"
    "        return 'none'\n"
    "    with f:\n"
    "        try:\n"
    "            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "        except BlockingIOError:\n"
    "            return 'held'\n"
    "        return 'free'\n"
    "for cache in map(Path, sys.argv[1:]):\n"
    "    for _ in range(2):\n"
    "        with node_lock(cache):\n"
    "            print(held(node_lock_file(cache)), held(cache / LOCK), flush=True)\n"
)


def test_a_cache_whose_folder_above_cannot_be_written_takes_turns_through_its_lock_inside(tmp_path):
    """A cache at the root of a mount point its user owns, under a folder the user cannot write (a
    scratch disk, a container's volume): the node lock's file beside it cannot be made, and was, from
    E28a on, the lock chosen by os.access; a folder whose disk was full, or a file there root made 0644
    or another user left in /tmp, stopped every fetch with "cannot write the cache …", blaming a
    cache with room (review RV28a F2, F3, F5). Now the file beside is skipped, with one note per
    process naming it and what is lost, and CACHE/.lock, which node_lock always takes too, is held.
    Where that folder holds a lock file the user can write (made there for the cache's users), both
    are held. Not root: chmod. Root (chmod stops nothing): a read-only bind mount in a private mount
    namespace (unshare -rm), the caches and the lock file mounted on it writable."""
    above, own = tmp_path / "above", tmp_path / "own"
    for name in ("mount", "locked"):
        (above / name).mkdir(parents=True)
        (own / name).mkdir(parents=True)
    (own / ".locked.lock").touch(mode=0o666)
    (above / ".locked.lock").touch(mode=0o666)
    caches = [str(above / "mount"), str(above / "locked")]
    cmd = [sys.executable, "-c", _LOCKS_OF, *caches]
    if os.geteuid() != 0:
        above.chmod(0o555)
        try:
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        finally:
            above.chmod(0o755)
    elif unshare_works():
        q = sh_quote
        script = [
            f"mount --bind {q(str(above))} {q(str(above))}",
            f"mount -o remount,bind,ro {q(str(above))}",
            *(f"mount --bind {q(str(own / name))} {q(str(above / name))}" for name in ("mount", "locked")),
            f"mount --bind {q(str(own / '.locked.lock'))} {q(str(above / '.locked.lock'))}",
        ]
        proc = python_in_namespace(script, cmd)
    else:
        pytest.skip("running as root without mount namespaces (unshare -rm): no folder it cannot write")
    assert proc.returncode == 0, proc.stderr
    note, *held = proc.stdout.splitlines()
    assert note.startswith(
        f"note: the cache's lock file beside it, {above / '.mount.lock'}, cannot be used ("
    ), note
    assert "an emptying of the cache while a fetch holds that lock may put it a sample past cache_gb" in note
    assert held == ["none held", "none held", "held held", "held held"], proc.stdout


def test_a_lock_file_beside_the_cache_that_cannot_be_opened_leaves_the_lock_in_the_cache(
    tmp_path, capsys, monkeypatch
):
    """A file beside the cache that cannot be opened (here a directory at its path: EISDIR, as root
    too) stopped every fetch with "cannot write the cache …" (review RV28a F2). The fetches go on
    under CACHE/.lock, with one note for the process, and a second process waits there."""
    from training.contract import file_lock
    from training.data.remote import LOCK

    cache = tmp_path / "cache"
    node_lock_file(cache).mkdir(parents=True)
    for _ in range(2):
        with node_lock(cache):
            probe = open(cache / LOCK)
            with probe, pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (note,) = capsys.readouterr().out.splitlines()
    assert note.startswith(
        f"note: the cache's lock file beside it, {node_lock_file(cache)}, cannot be used ("
    ), note
    assert "Is a directory" in note, note
    monkeypatch.setattr(file_lock, "SAY_AFTER_S", 0.0)  # a waiter's line at its first look at the holder
    holder = _Holder(cache)  # another process of the node, in CACHE/.lock alone
    try:
        thread, outcome = _wait_in_thread(cache)
        said: list[str] = []
        _until(lambda: said.extend(capsys.readouterr().out.splitlines()) or said or outcome, "no wait")
        assert outcome == [], "a second process took the node lock while the first held it"
        assert said[0].startswith(f"waiting for {cache / LOCK}, held by pid {holder.pid} on "), said
        _release_to(holder, [(thread, outcome)])
    finally:
        holder.kill()


def test_a_lock_file_beside_the_cache_whose_holder_record_cannot_be_written_is_let_go(tmp_path):
    """A folder above the cache on a disk with an inode but no block to spare (the cache on its own
    disk, with room): the file beside opens, but the holder's record cannot be written, and a waiter
    there would take the running holder for "a process that left no details", not running, and end its
    wait in LockWaitError after data.fetch_timeout_s (review RV28a F2). The file is let go at once,
    with one note, and the fetches go on under CACHE/.lock. A one-page tmpfs, filled, in a private
    mount namespace (unshare -rm), the cache bind-mounted into it."""
    if not unshare_works():
        pytest.skip("no mount namespaces (unshare -rm): no full disk")
    above, own = tmp_path / "above", tmp_path / "own" / "cache"
    above.mkdir()
    own.mkdir(parents=True)
    q = sh_quote
    script = [
        f"mount -t tmpfs -o size=4k tmpfs {q(str(above))}",
        f"mkdir {q(str(above / 'cache'))}",
        f"mount --bind {q(str(own))} {q(str(above / 'cache'))}",
        f"head -c 4096 /dev/zero > {q(str(above / 'fill'))}",
    ]
    proc = python_in_namespace(script, [sys.executable, "-c", _LOCKS_OF, str(above / "cache")])
    assert proc.returncode == 0, proc.stderr
    note, *held = proc.stdout.splitlines()
    lock = above / ".cache.lock"
    assert note.startswith(
        f"note: the cache's lock file beside it, {lock}, cannot be used (its holder's record "
    ), note
    assert held == ["free held", "free held"], proc.stdout


# A holder of the node lock of the cache argv[1] (running) and a waiter: `_waited_for`; its pid, last.
_WAITED_FOR = (
    "import sys; from pathlib import Path\n"
    "from training.contract import file_lock\n"
    "from tests.training.data.test_file_lock import _Holder, _waited_for\n"
    "file_lock.SAY_AFTER_S = 0.0\n"
    "print(_waited_for(_Holder(Path(sys.argv[1]))).pid)\n"
)


def test_a_holder_whose_record_a_full_cache_disk_cannot_take_is_waited_for_by_its_pid(tmp_path):
    """A cache on a full disk: a new CACHE/.lock (after an emptying, a first fetch) cannot take its
    holder's record, and every waiter took the running holder for "a process that left no details",
    not running, and ended its wait after data.fetch_timeout_s with a line blaming a stopped process
    that does not exist (review RV28e F2). Linux names the holder of the flock (/proc/locks): it is
    waited for, named by its pid. A one-page tmpfs as the cache, filled, in a private mount namespace
    (unshare -rm)."""
    if not unshare_works():
        pytest.skip("no mount namespaces (unshare -rm): no full disk")
    cache = tmp_path / "cache"
    cache.mkdir()
    q = sh_quote(str(cache))
    script = [f"mount -t tmpfs -o size=4k tmpfs {q}", f"head -c 4096 /dev/zero > {q}/fill"]
    proc = python_in_namespace(script, [sys.executable, "-c", _WAITED_FOR, str(cache)])
    assert proc.returncode == 0, proc.stderr
    *said, pid = proc.stdout.splitlines()
    assert len(said) == 1, proc.stdout  # one line: never "a process that left no details", as it let go
    line = said[0]
    assert line.startswith(f"waiting for {cache / LOCK}, held by pid {pid} on {socket.gethostname()} "), line
    assert (
        "(named by /proc/locks: its record is not in the lock file yet, or a full disk left no room for it)"
        in line
    ), line


# Two threads of one process take the node lock of one cache by two paths (argv[1], argv[2]: a bind
# mount): the first holds it until the second says it waits or gets in; the second's lines, then the
# order of the events.
_TWO_PATHS = (
    "import sys, threading, time; from pathlib import Path\n"
    "from training.contract import file_lock; from training.data import remote\n"
    "file_lock.SAY_AFTER_S = 0.0\n"
    "said, events, inside = [], [], threading.Event()\n"
    "remote.say = said.append\n"
    "def first():\n"
    "    with remote.node_lock(Path(sys.argv[1])):\n"
    "        events.append('first in'); inside.set()\n"
    "        deadline = time.monotonic() + 20\n"
    "        while not said and 'second in' not in events and time.monotonic() < deadline:\n"
    "            time.sleep(0.005)\n"
    "        events.append('first out')\n"
    "thread = threading.Thread(target=first); thread.start(); inside.wait()\n"
    "with remote.node_lock(Path(sys.argv[2])):\n"
    "    events.append('second in')\n"
    "thread.join()\n"
    "print(*said, sep='\\n'); print(events)\n"
)


def test_a_cache_reached_by_two_paths_takes_turns(tmp_path):
    """A cache directory that is a mount point (pods on one hostPath, an NFS mount root, `docker -v`, a
    bind mount) is reached by paths whose folders above differ: from E28a on, each path's process
    locked its own file beside the cache, both made room at once, and the cache went past its bound
    (review RV28a F1: 51,570 bytes held past a 38,681 bound). Every path shares CACHE/.lock, which
    node_lock takes after the file beside: the second path's fetch waits, as its line says (judged by
    that line and the events' order, not by time)."""
    if not unshare_works():
        pytest.skip("no mount namespaces (unshare -rm): no bind mount")
    host, other = tmp_path / "host" / "cache", tmp_path / "ctr" / "cache"
    host.mkdir(parents=True)
    other.mkdir(parents=True)
    script = [f"mount --bind {sh_quote(str(host))} {sh_quote(str(other))}"]
    proc = python_in_namespace(script, [sys.executable, "-c", _TWO_PATHS, str(host), str(other)])
    assert proc.returncode == 0, proc.stderr
    *said, events = proc.stdout.splitlines()
    assert events == str(["first in", "first out", "second in"]), (
        "both paths held the node lock at once",
        said,
        events,
    )
    (line,) = said
    assert line.startswith(f"waiting for {other / '.lock'}, held by pid "), line


@pytest.mark.parametrize("left", ["empty", "a gone holder's record"])
def test_a_holder_whose_record_is_not_written_yet_is_waited_for(tmp_path, monkeypatch, left):
    """A holder's ftruncate and write of its record can stall (a slow disk's writeback): the file is
    empty, or still says the last holder, a process now gone, and its waiters ended on a running holder
    ("a process that left no details", "no such process now"). Linux names the holder of the flock
    (/proc/locks): it is waited for. A thread that holds the flock without writing its record stands
    for the stalled holder."""
    from training.contract import file_lock as fl

    monkeypatch.setattr(fl, "SAY_AFTER_S", 0.1)
    lock = tmp_path / "lock"
    lock.write_text("")
    if left != "empty":
        gone = os.fork()
        if gone == 0:
            os._exit(0)
        os.waitpid(gone, 0)
        lock.write_text(json.dumps({"pid": gone, "host": socket.gethostname(), "since": "T"}) + "\n")
    held, release = threading.Event(), threading.Event()

    def stalled() -> None:
        with open(lock, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            held.set()
            release.wait()
            fcntl.flock(f, fcntl.LOCK_UN)

    thread = threading.Thread(target=stalled, daemon=True)
    thread.start()
    held.wait()
    said: list[str] = []
    threading.Timer(1.5, release.set).start()  # five times the bound
    with fl.file_lock(lock, wait_s=0.3, say=said.append):
        assert release.is_set()  # not ended before the holder let go
    assert said and all(f"held by pid {os.getpid()} " in line for line in said), said


def test_a_sample_s_lock_held_by_another_thread_of_the_process_is_waited_for_without_a_word(
    tmp_path, monkeypatch
):
    """A bucket's loop and its prefetcher fetch side by side, and two samples of one lock stripe
    (LOCK_STRIPES files a split) take turns: through a flaky store each slow fetch had the other
    thread say `waiting for …/.lock-K, held by pid N … (another thread of this process)` (RV43's
    bench with faults). A sample's lock (cache_lock with say_own off) waits for this process's own
    threads without a word; the node's lock still tells every wait over a second."""
    from training.contract import file_lock as fl
    from training.data import remote

    monkeypatch.setattr(fl, "SAY_AFTER_S", 0.0)
    said: list[str] = []
    monkeypatch.setattr(remote, "say", said.append)
    for say_own in (False, True):
        path, held, release = tmp_path / f"stripe-{say_own}", threading.Event(), threading.Event()

        def hold(path=path, held=held, release=release, say_own=say_own) -> None:
            with remote.cache_lock(tmp_path, path, say_own=say_own):
                held.set()
                release.wait(10)

        thread = threading.Thread(target=hold)
        thread.start()
        held.wait()
        timer = threading.Timer(0.3, release.set)
        timer.start()
        start = time.monotonic()
        with remote.cache_lock(tmp_path, path, say_own=say_own):
            waited = time.monotonic() - start
        thread.join()
        assert waited >= 0.2, waited  # it did wait for the holder
        if not say_own:
            assert said == [], said
    (line,) = said
    assert line.startswith(f"waiting for {tmp_path / 'stripe-True'}, held by pid {os.getpid()} "), line
    assert "(another thread of this process)" in line, line
