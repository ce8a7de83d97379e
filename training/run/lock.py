"""One writer per run directory: RUN/.gristmill.lock, held by rank 0 for the life of the run.

Two trainers on one run directory truncate each other's metrics.jsonl and interleave checkpoints;
a resume started beside a survivor of a killed job does the same. The lock is an flock (released
by the kernel when its holder dies, however it dies), and the file holds the holder's host, PID and
start time for the message. A file left by a dead holder is taken over with a note; the file is
never deleted (deleting an flock file lets two processes lock two different files).

A user can still delete it: `rm -rf RUN; mkdir RUN` under a live run leaves its flock on a deleted
file, and the next trainer locks a new one and writes the same checkpoints. So the holder checks that
RUN/.gristmill.lock is still the file it holds (`run_dir_lost`: same device and inode) before each
save and record write, and stops, writing nothing more there, when it is not.

flock is local to a host: on NFS without lock support, or with two hosts writing one directory,
only the host/PID text remains, and it is shown, not enforced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from training.contract.errors import GristmillError
from training.contract.run_layout import LOCK_FILE

_NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
# Run locks held by this process. A forked child (a DataLoader worker) shares the open file and
# would keep the lock after this process is killed: children close their copy at once.
_HELD: list[RunLock] = []


def _close_in_child() -> None:
    for lock in _HELD:
        lock.file.close()
        lock.file = None
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunLockedError(GristmillError):
    """Another process is writing this run directory."""


def _holder_text(raw: str) -> str:
    try:
        h = json.loads(raw)
        return f"pid {h['pid']} on {h['host']}, started {h['started']}"
    except (ValueError, KeyError, TypeError):
        return "a process that left no details"


TRAIN = ("gristmill train", "set run.output_dir to another directory")  # RunLock's `user`


def _in_use(run_dir: str | Path, holder: str, user: tuple[str, str] = TRAIN) -> str:
    command, elsewhere = user
    stop = "wait for it to end or stop it"
    return f"{run_dir} is in use by another {command} ({holder}); {stop}, or {elsewhere}"


def _open(run_dir: Path):
    run_dir.mkdir(parents=True, exist_ok=True)
    # errors="replace": a file of stray bytes reads as "no details" and is taken over, not a traceback
    return open(run_dir / LOCK_FILE, "a+", encoding="utf-8", errors="replace")  # noqa: SIM115 (held for the run)


class RunLock:
    """`with RunLock(run_dir) as lock:` holds the directory; `lock.note` says if it took over a stale one.
    `user`: the command that holds it and what else its user can do, for the refusal (a mixture
    search holds its --out the same way)."""

    def __init__(self, run_dir: str | Path, user: tuple[str, str] = TRAIN):
        self.run_dir, self.user = Path(run_dir), user
        self.file = None
        self.note: str | None = None

    def acquire(self) -> RunLock:
        f = _open(self.run_dir)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = _holder_text(f.read())
            f.close()
            raise RunLockedError(_in_use(self.run_dir, holder, self.user)) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                f.close()
                raise
            # A filesystem without flock (Lustre without -o flock, NFS without lockd): the holder is
            # written and shown, not enforced.
            self.note = (
                f"WARNING: the filesystem of {self.run_dir} has no flock ({e.strerror}); one writer per "
                "run directory is not enforced there"
            )
        f.seek(0)
        old = f.read().strip()
        if old and self.note is None:  # a holder that died without releasing: the kernel dropped its flock
            self.note = f"note: took over the lock of {_holder_text(old)}, {_gone(old)}"
        f.seek(0)
        f.truncate()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": stamp}) + "\n")
        f.flush()
        self.file = f
        _HELD.append(self)
        return self

    def lost(self) -> str | None:
        """None while RUN/.gristmill.lock is the file this lock holds (same device and inode); else
        what happened to the run directory (a stat: cheap enough before every write)."""
        try:
            now = os.stat(self.run_dir / LOCK_FILE)
        except FileNotFoundError:
            return f"{self.run_dir} was removed or moved under this run (its {LOCK_FILE} is gone)"
        held = os.fstat(self.file.fileno())
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return None
        with open(self.run_dir / LOCK_FILE, encoding="utf-8", errors="replace") as f:
            holder = f.read().strip()
        by = f", and is now held by {_holder_text(holder)}" if holder else ""
        return f"{self.run_dir} was removed or replaced under this run (its {LOCK_FILE} is another file{by})"

    def release(self) -> None:
        if self.file is None:
            return
        try:
            self.file.seek(0)
            self.file.truncate()  # an empty file: released cleanly, nothing to take over
            self.file.flush()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(self.file, fcntl.LOCK_UN)
            _HELD.remove(self)
            self.file.close()
            self.file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _gone(raw: str) -> str:
    """Why a lock file's holder no longer holds it: on this host a dead holder's flock is dropped by
    the kernel; one on another host was never seen by this host's flock, so nothing tells."""
    try:
        host = json.loads(raw)["host"]
    except (ValueError, KeyError, TypeError):
        host = None
    if host is None or host == socket.gethostname():
        return "which is no longer running"
    return (
        f"which this host cannot tell is stopped (flock does not reach {host}): make sure it is, or "
        "two runs write this directory"
    )


def run_dir_lost(run_dir: str | Path) -> str | None:
    """What happened to `run_dir` when this process holds its lock and the directory was removed, moved
    or replaced under it (its lock file is no longer the one held), as the run's one-line stop: it must
    write nothing more there, where another run may now write. None while the directory is still this
    process's, or when this process holds no lock of it (the other ranks: rank 0 holds it)."""
    for lock in _HELD:
        if os.path.abspath(lock.run_dir) == os.path.abspath(run_dir) and (what := lock.lost()) is not None:
            # A moved directory keeps its checkpoints: resumed where it is now, it goes on (trial RV71b 2)
            return (
                f"{what}: this run stops and writes nothing more there; if you moved it, resume it where it "
                'is now (--resume auto --set run.output_dir="NEW"), else train again into a directory no '
                "other run uses"
            )
    return None


def check_owned(run_dir: str | Path) -> None:
    """Raise run_dir_lost's error, if any (before a write into `run_dir` that is not a collective's)."""
    if (lost := run_dir_lost(run_dir)) is not None:
        raise GristmillError(lost)


def check_unlocked(run_dir: str | Path, user: tuple[str, str] = TRAIN) -> None:
    """Raise RunLockedError if a live process holds `run_dir` (the launcher's check before torchrun
    starts; rank 0 then takes the lock itself; a search before it clears a proxy's run). Changes nothing
    on disk. `user`: as RunLock's, for the refusal."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunLockedError(_in_use(run_dir, _holder_text(f.read()), user)) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise


CHECKPOINTS_OWNER = ".run"  # RUN/checkpoints/.run: the run directory (real path) whose checkpoints they are


def own_checkpoints(run_dir: Path) -> None:
    """RUN/checkpoints/ claimed for this run directory, rank 0, under the run lock, before any save,
    retention or set-aside. A copy of a run (`cp -a`) whose checkpoints/ is a link (to scratch storage)
    saved into the original's folder and its retention deleted the original's checkpoints, each run
    under a lock of its own (trial RV63a 1): refused while the run that claimed the folder is still a
    run directory whose checkpoints/ is this folder. A run directory moved (its old path gone, or its
    checkpoints/ another folder now) is taken over. A checkpoints folder that is the run directory's own
    (no link on the way) is left as it is: no copy of the run shares it."""
    from training.contract.atomic_write import write_atomic
    from training.contract.run_layout import CHECKPOINTS_DIR

    folder = run_dir / CHECKPOINTS_DIR
    mine, real = os.path.realpath(run_dir), os.path.realpath(folder)
    if not folder.is_dir() or real == os.path.join(mine, CHECKPOINTS_DIR):
        return  # made at the first save, by this run; or a folder of its own, which no copy shares
    marker = folder / CHECKPOINTS_OWNER
    try:
        other = marker.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        other = ""
    if (
        other
        and other != mine
        and os.path.realpath(Path(other) / CHECKPOINTS_DIR) == real
        and (Path(other) / LOCK_FILE).exists()
        and not os.path.samefile(other, run_dir)  # the same directory by another mount (review RV63g 6)
    ):
        raise GristmillError(
            f"{folder} is {real}, the checkpoints folder of the run {other} too (a copy of that run, its "
            "checkpoints/ a link?): each run would save into the other's and its retention delete them; "
            f"give {run_dir} a checkpoints folder of its own (replace the link with a copy of what it needs, "
            f"e.g. cp -rL) and start again, or, if {other} is done with, delete {marker}"
        )
    if other != mine:
        write_atomic(marker, mine + "\n")
