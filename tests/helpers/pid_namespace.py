"""`python -m tests.helpers.pid_namespace SCRIPT ARGS`: `python SCRIPT ARGS` as pid 1 of a pid namespace
of its own, with that namespace's /proc: what `unshare --pid --fork --mount-proc python SCRIPT ARGS`
gives, the namespace made by the process itself, so that the command can be forked
(tests/helpers/forked.py) instead of starting an interpreter (~3 CPU s). It needs what that unshare
needs (CAP_SYS_ADMIN: root).

This process enters a new pid and mount namespace (unshare(2): a process stays in its own pid
namespace, its children start in the new one) and forks: the child is pid 1 there, makes its mounts
private, mounts the namespace's /proc and runs SCRIPT, ending as the interpreter ends after it
(forked_workers.exit_as_python). This process waits for it and ends as it ended: its exit status, or
killed by the same signal (as unshare --fork does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000


def _libc(name: str, *args) -> None:
    if getattr(ctypes.CDLL(None, use_errno=True), name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args}: {os.strerror(errno)}")


def _pid_1(script: str, args: list[str]) -> None:
    """In the namespace's first process: its /proc, then SCRIPT."""
    from tests.helpers.forked import become

    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    _libc("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    become(script, args, dict(os.environ), os.getcwd(), script=True)


if __name__ == "__main__":
    from tests.helpers.forked_workers import exit_as_python

    script, *args = sys.argv[1:]
    _libc("unshare", CLONE_NEWPID | CLONE_NEWNS)
    child = os.fork()
    if child == 0:
        exit_as_python(lambda: _pid_1(script, args))
    status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if status < 0:  # killed by a signal: so is this process
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)
