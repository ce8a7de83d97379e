"""Private mount namespaces for tests that need a full or read-only filesystem without root.

`python -m tests.helpers.mounts SCRIPT AFTER MODULE ARGS`: `python -m MODULE ARGS` in a mount namespace
of its own, after sh ran SCRIPT's mounts there, and sh runs AFTER there ("" for nothing) once MODULE
ended (to copy out what a tmpfs held): what `unshare -rm sh -c "SCRIPT && { python -m MODULE ARGS;
AFTER; }"` gives (this user as root of a new user namespace), the namespace made by the process
itself, so that the command can be forked (tests/helpers/forked.py) instead of starting an
interpreter (~3 CPU s).

Its exit status is MODULE's, as `python -m` gives it (sys.exit's code; 1 and the traceback for an
exception). An AFTER that fails says so in a line on stderr, and a MODULE that exited 0 then exits
with AFTER's status: a failed copy is never an exit 0. MODULE and this helper are one process, so a
MODULE ended by a signal (SIGKILL, forked.run's timeout) or by os._exit (the trainer's second
Ctrl-C) ends it all there: AFTER does not run (the old sh ran its `cp` even then), what a tmpfs held
goes with the namespace, and the status is the signal's (-N, as Popen reports it) or os._exit's.

A torchrun that MODULE starts forks its workers from the worker server (forked.py gives each command
PYTHON_EXEC), a process outside this namespace: they see neither its mounts nor its root. A command
whose workers must run in the namespace (`--nproc-per-node 2`, an in-run eval) gives
`PYTHON_EXEC=sys.executable` in its env: fresh interpreters, started from inside it."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000


def unshare_works() -> bool:
    """`unshare -rm` can make a mount namespace here (a tmpfs mount inside it succeeds)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


def sh_quote(word: str) -> str:
    """`word` as one sh word (for the `unshare -rm sh -c` scripts)."""
    return "'" + word.replace("'", "'\\''") + "'"


def python_in_namespace(script: list[str], cmd: list[str]) -> subprocess.CompletedProcess:
    """`cmd` after the mount commands `script`, in a private mount namespace (unshare -rm), with the
    repository on its PYTHONPATH."""
    line = " && ".join([*script, f"exec {' '.join(map(sh_quote, cmd))}"])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", line], env=env, capture_output=True, text=True, timeout=60
    )


def enter_namespace(script: str) -> None:
    """This process into a new user and mount namespace, as `unshare -rm` does (its uid and gid mapped
    to root), then `sh -c SCRIPT` there: its mounts are this process's. It must have one thread (the
    kernel's rule for a new user namespace): forked.become sets torch's threads after this, not before."""
    uid, gid = os.getuid(), os.getgid()
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        threads = len(os.listdir("/proc/self/task"))  # more than 1: EINVAL, whatever `unshare -rm` can do
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWUSER | CLONE_NEWNS), {threads} threads")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    subprocess.run(["sh", "-c", script], check=True)


if __name__ == "__main__":
    from tests.helpers.forked import become

    script, after, module, *args = sys.argv[1:]
    enter_namespace(script)
    try:
        become(module, args, dict(os.environ), os.getcwd())
        ended = None
    except BaseException as end:  # sys.exit or an exception: raised again once AFTER ran, as the status
        ended = end
    copied = subprocess.run(["sh", "-c", after]).returncode if after else 0
    if copied:
        print(f"tests.helpers.mounts: AFTER ({after}) exited {copied}", file=sys.stderr, flush=True)
        if ended is None or (isinstance(ended, SystemExit) and ended.code in (0, None)):
            sys.exit(copied)
    if ended is not None:
        raise ended
