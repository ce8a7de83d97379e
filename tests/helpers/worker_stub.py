"""torchrun's worker interpreter in the tests (PYTHON_EXEC; tests/helpers/forked_workers.py): instead of
starting a fresh `python -u -m MODULE ARGS`, which imports torch and the trainer again, this stub
asks the test worker's server to fork the worker from its preloaded copy, and stands in for it:

- it sends its command, environment, working directory, pid and stdin/stdout/stderr (the fds
  themselves) to the server, which forks the worker and answers with the worker's pid, and later
  with its wait status;
- it passes every signal torchrun or a test can send it on to the worker (the worker is in a
  session of its own, so torchrun's `killpg` of this stub's session reaches it only this way);
- it ends as the worker did: the same exit status, or killed by the same signal;
- it dies with its parent (torchrun), as the trainer's workers do (training/contract/lifetime.py),
  and the worker dies with it (the worker watches this stub's pid).

Standard library only, run with `python -S`: it costs a bare interpreter's start-up. A command that
is not `[-u] -m MODULE ARGS` or `[-u] SCRIPT ARGS`, or a missing server address, runs the real
interpreter instead (exec).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

ADDRESS = "GRISTMILL_TEST_WORKER_SERVER"  # the server's socket; with PYTHON_EXEC, not the worker's
FORWARDED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGABRT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGTERM,
)
worker = 0  # its pid, once the server has forked it
pending: list[int] = []  # signals that arrived before


def forward(signum: int, frame) -> None:
    if not worker:
        pending.append(signum)
        return
    try:
        os.kill(worker, signum)
    except ProcessLookupError:  # it has just ended; its status is on its way
        pass


def command(argv: list[str]) -> dict | None:
    """`[-u] -m MODULE ARGS` or `[-u] SCRIPT ARGS` (what torchrun runs) as the server's request."""
    unbuffered = argv[:1] == ["-u"]
    rest = argv[1:] if unbuffered else argv
    if rest[:1] == ["-m"] and len(rest) > 1:
        return {"target": rest[1], "args": rest[2:], "script": False, "unbuffered": unbuffered}
    if rest and not rest[0].startswith("-"):
        return {"target": rest[0], "args": rest[1:], "script": True, "unbuffered": unbuffered}
    return None


def open_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            pass
    return fds


def end_as(status: int) -> None:
    """Exit as the worker did: its exit status, or death by the signal that killed it."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default is not to die (never sent by torchrun)
    os._exit(code)


def main() -> None:
    global worker
    request = command(sys.argv[1:])
    env = dict(os.environ)
    address = env.pop(ADDRESS, None)
    if request is None or address is None:
        os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
    env.pop("PYTHON_EXEC", None)
    for sig in FORWARDED:
        signal.signal(sig, forward)
    parent = os.getppid()
    launcher = os.pidfd_open(parent)  # readable once torchrun has ended
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    fds = open_fds()
    request.update(env=env, cwd=os.getcwd(), pid=os.getpid(), fds=fds)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.connect(address)
    socket.send_fds(server, [json.dumps(request).encode()], fds)
    while True:
        ready, _, _ = select.select([server, launcher], [], [])
        if launcher in ready:  # no worker outlives its launcher: the worker follows this stub
            os.kill(os.getpid(), signal.SIGKILL)
        reply = json.loads(server.recv(1 << 16) or b"{}")
        if "pid" not in reply:
            break
        worker = reply["pid"]
        for sig in pending:
            forward(sig, None)
    if "status" not in reply:
        print(f"error: the test worker server at {address} is gone", file=sys.stderr, flush=True)
        os._exit(1)
    end_as(reply["status"])


if __name__ == "__main__":
    main()
