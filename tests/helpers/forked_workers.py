"""torchrun's workers forked too: a server per test worker, itself forked from forked.py's
forkserver (torch and the trainer imported once), forks each `python -u -m MODULE ARGS` that a
torchrun asks for through its PYTHON_EXEC, the stub tests/helpers/worker_stub.py.

forked.py gives every command it forks PYTHON_EXEC and the server's address (`workers_env`), so a
forked torchrun, and a forked `gristmill train --nproc-per-node N`'s torchrun, fork their workers
here. A worker is what a fresh one would be to torchrun and to the tests: torchrun's child is the
stub, which passes signals on and ends with the worker's status; the worker has the stub's
command, environment, directory and stdin/stdout/stderr (`-u`: unbuffered), a session of its own,
fresh signal dispositions, and the exit of a Python interpreter (SystemExit's status, 1 and a
traceback for an exception, death by SIGINT for a KeyboardInterrupt, non-daemon threads joined and
atexit run); it dies (SIGKILL, its process group with it) once its stub is gone. Commands started
with plain `subprocess` keep fresh workers: those that check how a worker starts or dies with its
launcher (the trainer's own watchdog) use them.

The server is the workers' parent and reaps them (their CPU time counts in its children's, and so
in `time make test`'s); forked.stop_server stops it and reaps it before the forkserver.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from tests.helpers import worker_stub
from tests.helpers.forked import become
from training.contract.lifetime import exit_with

ADDRESS = worker_stub.ADDRESS
STOP = b'{"stop": true}'


def install(folder: Path) -> Path:
    """The PYTHON_EXEC executable: the stub under this interpreter, without site (`-S`)."""
    exe = folder / "python-worker"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{Path(worker_stub.__file__).resolve()}" "$@"\n')
    exe.chmod(0o755)
    return exe


def serve(listener: socket.socket, owner: int) -> None:
    """Fork a worker for each stub that connects, and send it the worker's pid and then its wait
    status; end on STOP or when `owner` (the test worker) ends, killing and reaping what is left."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    owner_fd = os.pidfd_open(owner)
    selector.register(owner_fd, selectors.EVENT_READ)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd: (pid, its stub's connection)
    try:
        while True:
            for key, _ in selector.select():
                if key.fd == owner_fd:
                    return
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    try:
                        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                    except OSError:
                        data, fds = b"", []
                    if data == STOP:
                        conn.close()
                        return
                    if not data:
                        conn.close()
                        continue
                    pid = _fork(json.loads(data), fds, [listener, conn, *(c for _, c in running.values())],
                                [owner_fd, *running], selector)  # fmt: skip
                    for fd in fds:
                        os.close(fd)
                    try:
                        conn.send(json.dumps({"pid": pid}).encode())
                    except OSError:  # the stub is gone; the worker follows it
                        pass
                    pidfd = os.pidfd_open(pid)
                    running[pidfd] = (pid, conn)
                    selector.register(pidfd, selectors.EVENT_READ)
                else:
                    pid, conn = running.pop(key.fd)
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    _, status = os.waitpid(pid, 0)
                    try:
                        conn.send(json.dumps({"status": status}).encode())
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pidfd, (pid, conn) in running.items():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(pidfd)
            conn.close()
        selector.close()


def _fork(request: dict, fds: list[int], sockets: list[socket.socket], server_fds: list[int],
          selector: selectors.BaseSelector) -> int:  # fmt: skip
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        return pid
    try:  # the worker: nothing of the server's stays open in it
        selector.close()
        for sock in sockets:
            sock.close()
        for fd in server_fds:
            os.close(fd)
        for target, fd in zip(request["fds"], fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.setsid()  # torchrun starts each worker in a session of its own
        _fresh_signals()
        exit_with(request["pid"])  # SIGKILL, with its process group, once the stub is gone
        _fresh_stdio(request["unbuffered"])
    except BaseException as e:
        os.write(2, f"error: the forked worker could not start: {e!r}\n".encode())
        os._exit(1)
    exit_as_python(lambda: become(request["target"], request["args"], request["env"], request["cwd"],
                                  script=request["script"]))  # fmt: skip


def _fresh_signals() -> None:
    """A fresh interpreter's dispositions: the default everywhere but SIGINT (KeyboardInterrupt),
    SIGPIPE and SIGXFSZ (ignored); nothing blocked."""
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)


def _fresh_stdio(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on fds 0-2 as the interpreter makes them (`-u`: stdout and stderr
    written through at once)."""

    def stream(fd: int, like: io.TextIOWrapper, write: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
        buffer = raw if write and unbuffered else (io.BufferedWriter if write else io.BufferedReader)(raw)
        line = write and not unbuffered and (raw.isatty() or fd == 2)
        text = io.TextIOWrapper(buffer, encoding=like.encoding, errors=like.errors, newline="\n",
                                line_buffering=line, write_through=write and unbuffered)  # fmt: skip
        text.mode = "w" if write else "r"
        return text

    old = (sys.__stdin__ or sys.stdin, sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr)
    sys.stdin = sys.__stdin__ = stream(0, old[0], False)
    sys.stdout = sys.__stdout__ = stream(1, old[1], True)
    sys.stderr = sys.__stderr__ = stream(2, old[2], True)


def exit_as_python(main: Callable[[], object]) -> NoReturn:
    """Run `main` and end this process as the interpreter ends after its `-m` module: SystemExit's
    status (None 0, a number itself, anything else printed and 1), an uncaught exception's traceback
    and 1, a KeyboardInterrupt's traceback and death by SIGINT; non-daemon threads joined, atexit's
    functions run, the streams flushed."""
    signum = 0
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:
        sys.excepthook(type(e), e, e.__traceback__)
        code, signum = 1, (signal.SIGINT if isinstance(e, KeyboardInterrupt) else 0)
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if signum:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(code & 0xFF)
