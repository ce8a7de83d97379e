"""An exclusive lock on a file, for the processes of one node and the threads of one process: the
cache's downloads and fetches (training/data/remote.py, block_cache.py) and the eval results' merges
(validation/eval_results.py: the trainer's eval and `gristmill eval --watch` write one step's file).

The holder writes its pid, host and start into the file, so that a wait can say whom it waits for
(where a full disk left the file without it, the pid /proc/locks gives): a holder that was stopped
(SIGSTOP, Ctrl-Z, a suspended job) keeps its lock, and the waiters would otherwise hang without a
word. A wait longer than a second says so in one line (`say`); with `wait_s` it ends in one line
once the holder has not been seen running for that long (on this host, a running holder is waited
for: it is working, and its own fetches are bounded)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from training.contract.errors import GristmillError
from training.contract.lifetime import host_name as this_host  # a pid namespace's own: another host

_HELD: set[int] = set()  # descriptors of the file locks this process holds (file_lock)
SAY_AFTER_S = 1.0  # a wait longer than this says whom it waits for


class LockWaitError(GristmillError):
    """A lock's holder was not seen running for as long as the caller waits."""


class LockHeld(Exception):
    """The lock is held by another (file_lock's try, `block=False`): a signal to the caller, not an error."""


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


@contextlib.contextmanager
def file_lock(
    path: Path,
    *,
    wait_s: float | None = None,
    fix: str = "",
    say: Callable[[str], None] | None = None,
    block: bool = True,
    say_own: bool = True,
    give_up: Callable[[], None] | None = None,
) -> Iterator[bool]:
    """An exclusive flock on `path` while inside: the node's processes, and this process's threads,
    take turns (flock holds per open file; the kernel releases it when its holder dies). A process
    forked meanwhile (a DataLoader worker, while the prefetcher thread holds the lock) shares the
    lock through its copy of the descriptor: the lock is released explicitly on the way out, never
    by closing (which would leave it to the copy for the child's life), and the child closes its copy.
    A wait over a second is told through `say` (not `say_own`: only a wait for another process; this
    process's threads then take turns quietly); with `wait_s`, a holder not seen running for that
    long is a LockWaitError ending with `fix` (what the user can do instead); `block=False` tries
    once: a lock held by another is LockHeld, no wait; `give_up` is called at each look of a wait and
    ends it by raising (a training asked to stop: block_cache). Yields whether the holder's record was
    written (a full disk: not, and a waiter names the holder by /proc/locks, where Linux lists it:
    _holder)."""
    with open(path, "a+", encoding="utf-8", errors="replace") as f:
        _HELD.add(f.fileno())
        try:
            _wait(f, path, wait_s, fix, say, block, say_own, give_up)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            recorded = False
            with contextlib.suppress(OSError):  # only a waiter's message needs it (a full disk: none)
                os.ftruncate(f.fileno(), 0)  # (append mode: the write lands at the start; unbuffered)
                holder = {"pid": os.getpid(), "host": this_host(), "since": stamp}
                record = (json.dumps(holder) + "\n").encode()
                recorded = os.write(f.fileno(), record) == len(record)  # a short write is no record
            yield recorded
        finally:
            _HELD.discard(f.fileno())
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait(
    f,
    path: Path,
    wait_s: float | None,
    fix: str,
    say: Callable[[str], None] | None,
    block: bool = True,
    say_own: bool = True,
    give_up: Callable[[], None] | None = None,
) -> None:
    """Take the lock, polling (a blocking flock cannot be given up); the clock of `wait_s` runs only
    while the holder is not seen running. Not `block`: LockHeld at once where it is held."""
    start = last = time.monotonic()
    idle, pause, told = 0.0, 0.001, None  # (idle: seconds the holder was not seen running)
    while True:
        now = time.monotonic()
        # (looked at before the try: a holder that leaves in between, its /proc/locks entry gone with
        # it, is not judged; after it, a waiter said "a process that left no details" as it let go)
        seen = _holder(f) if now - start >= SAY_AFTER_S else None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not block:
                raise LockHeld(str(path)) from None
        if give_up is not None:
            give_up()
        if seen is not None:
            holder, running = seen
            idle = 0.0 if running else idle + (now - last)
            last = now
            tell = say is not None and (say_own or not holder.endswith(_OURS))
            if tell and holder != told:  # the first line, and one when the holder changes
                told = holder
                bound = f"; one not running is waited for at most {wait_s:g} s" if wait_s is not None else ""
                say(f"waiting for {path}, held by {holder}{bound}")
            if wait_s is not None and idle >= wait_s:
                what = f"{path} is still held by {holder}, not seen running for {wait_s:g} s"
                raise LockWaitError(f"{what}: {fix}" if fix else what)
        time.sleep(pause)
        pause = min(2 * pause, 0.02)  # a waiter is late by at most 20 ms


def _holder(f) -> tuple[str, bool]:
    """Who holds the lock, as its file says, and whether it is seen running (on this host, a process
    neither stopped nor gone). A record that is missing or names a process not running is checked
    against the holder Linux lists for the flock (/proc/locks): the file says the last holder that
    wrote its record, and a new holder's ftruncate and write can stall (a full disk, a slow one)."""
    f.seek(0)
    try:
        h = json.loads(f.read())
        pid, host, since = int(h["pid"]), str(h["host"]), h["since"]
    except (ValueError, KeyError, TypeError):
        pid = host = since = None
    if pid is not None:
        who, running = _judged(pid, host, f"pid {pid} on {host} since {since}")
        if running:
            return who, running
    listed = _flock_pid(f)
    if listed is None or listed == pid:
        return (who, running) if pid is not None else ("a process that left no details", False)
    return _judged(
        listed,
        this_host(),
        f"pid {listed} on {this_host()} (named by /proc/locks: its record is not in the lock file "
        "yet, or a full disk left no room for it)",
    )


_OURS = " (another thread of this process)"  # a holder judged to be this process (_judged)


def _judged(pid: int, host: str, who: str) -> tuple[str, bool]:
    if host != this_host():
        # another host sharing this file system (pods on one hostPath): the flock is real, its holder's
        # state cannot be seen, and ending the wait would end a healthy run (review RV26c M2)
        return f"{who} (another host: whether it runs cannot be told here, so it is waited for)", True
    if pid == os.getpid():
        return f"{who}{_OURS}", True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return f"{who} (no such process now)", False
    if state in ("T", "t"):
        return f"{who} (stopped: SIGSTOP or Ctrl-Z; `kill -CONT {pid}` resumes it)", False
    return who, state != "Z"


def _flock_pid(f) -> int | None:
    """The pid /proc/locks gives for the flock on `f`'s file; None where Linux names none (a holder on
    another node of an NFS mount, or outside this pid namespace, a file system whose locks it lists
    under another device)."""
    pid = _listed_flock(os.fstat(f.fileno()))
    return pid if pid else None


def flock_listed(path: str | Path) -> bool:
    """Whether /proc/locks lists a flock held on the file at `path` (False where there is no such file,
    and where Linux lists none: a holder on another node of an NFS mount). It takes no lock: a reader
    that asks holds nothing a writer waits on."""
    try:
        return _listed_flock(os.stat(path)) is not None
    except OSError:
        return False


def _listed_flock(st: os.stat_result) -> int | None:
    """The pid /proc/locks gives (0: none it can name) for a flock held on the file `st` is of; None
    where it lists none."""
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/locks", encoding="ascii", errors="replace") as locks,
    ):
        for line in locks:  # "1: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF"; a waiter's: "1: -> FLOCK …"
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == key:
                return max(int(fields[4]), 0)
    return None
