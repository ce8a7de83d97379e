"""No process outlives the command that started it: `exit_with(pid)` makes the calling process
kill itself (SIGKILL: nothing more is written) within a moment of the death of process `pid`, by
default its parent. A kill -9 of the command (a scheduler, the OOM killer, a closed terminal) runs
none of its cleanup, so each process it started watches it instead: the trainer's torchrun workers
(training/run/shutdown.py), `mix propose`'s pool workers, and every process of `gristmill data
build` — its datatrove pool's workers (children of multiprocess's forkserver, not of the build: they
are given the build's pid) and the manager process datatrove forks.

A watchdog thread, not PR_SET_PDEATHSIG: that signal fires when the parent *thread* that started
the child ends (in torchrun, not the agent's lifetime), and it cannot name a grandparent. The
parent is watched by its PID changing (the orphan is re-parented); another process through a pidfd,
which becomes readable when the process ends, zombie or not.

A torchrun worker started by `gristmill train` watches torchrun's agent by the pid the agent puts in
its workers' environment (AGENT_PID_VAR): a watch of the parent, started after the worker's imports,
would take the reaper for its parent when the agent died during them.

`signal_at_parent_death` is Linux's PR_SET_PDEATHSIG for a subprocess's own child, started from the
caller's main thread (the launcher's torchrun, the tests' S3 server).

`host()` and `pid_alive(pid)` tell a killed process's leftovers (temporary files and folders named
with its HOST and PID) from a live one's.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading
import time

AGENT_PID_VAR = "GRISTMILL_TORCHRUN_AGENT"  # set by training.launch's agent_main for its workers


def torchrun_worker() -> bool:
    """Whether this process is a torchrun worker (TORCHELASTIC_RUN_ID): a process of its own, whose
    signals and exit are the trainer's, not an in-process caller's (the demo, a test, the mixture
    search's workers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def exit_with(pid: int | None = None, poll_s: float = 0.05, forked_by: int | None = None) -> None:
    """Kill this process (and its process group when it leads one: torchrun makes each worker a
    group leader, and its DataLoader workers go with it) once process `pid` (None: the parent) ends.

    `forked_by`: the parent's pid as the parent took it before the fork (its os.getpid(), passed
    in). A process whose parent died before this call was already the reaper's (pid 1), took that
    for its parent and watched it forever: a DataLoader worker whose start came after its trainer's
    SIGKILL kept the shards' files and shared memory until a SIGKILL of its own. Given, such an
    orphan ends at once. None: the parent found now (torchrun's workers, whose agent cannot pass it)."""
    if pid is None:
        parent = os.getppid() if forked_by is None else forked_by

        def wait() -> None:
            while os.getppid() == parent:
                time.sleep(poll_s)

    else:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            fd = None

        def wait() -> None:
            if fd is not None:
                select.select([fd], [], [])

    def watch() -> None:
        wait()
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gristmill-exit-with", daemon=True).start()


def signal_at_parent_death(forked_by: int, signum: int) -> None:
    """A subprocess's preexec_fn (functools.partial with the parent's os.getpid(), taken before the
    fork, and the signal): the child is sent `signum` when its parent dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). The request is made in the child after the fork, and a
    parent dead by then (killed as it started the child) never sends it: the child, the reaper's
    already, ran on (torchrun and its workers training with no launcher). It kills itself instead,
    before its exec."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != forked_by:  # after the request: a death from now on sends the signal
        os.kill(os.getpid(), signal.SIGKILL)


_INIT_PID_NS = "pid:[4026531836]"  # the kernel's PROC_PID_INIT_INO: the host's own pid namespace


def host() -> str:
    """This host's name in the names of a process's leftovers (HOST-PID: no dots), and, in a pid
    namespace of its own (a container, `unshare --pid`), that namespace's inode after a `~`: its pids
    are another namespace's too, and two loaders sharing a cache from two of them (pods on one
    hostPath, one host name) were both pid 1, each taking the other's keep list for its own, and the
    cache grew past its bound; with pid 1 and pid 3, each took the other for dead and removed its list
    (review RV42a M1). What another namespace leaves is another host's: never judged dead here."""
    return socket.gethostname().replace(".", "_") + _pid_namespace()


def host_name() -> str:
    """This host's name as it gives it, and its pid namespace's as host() adds it: the holder named
    in a lock file (training/contract/file_lock.py), whose pid is judged only where it is this one's."""
    return socket.gethostname() + _pid_namespace()


def _pid_namespace() -> str:
    """`~INODE` of this process's pid namespace where it is not the host's own, else ""."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc: the host's namespace is all that can be told
        return ""
    return "" if namespace == _INIT_PID_NS else f"~{namespace.removeprefix('pid:[').removesuffix(']')}"


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host lives (another user's counts as alive): what a leftover of a
    killed process (a temporary file or folder naming its pid) is told apart by."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
