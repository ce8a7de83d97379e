"""`python -m MODULE ARGS` as a real process of its own that skips the interpreter's start-up: forked
from a server that imported torch and the trainer once per test worker (multiprocessing's
forkserver with those modules preloaded).

The child is a separate OS process (its own pid, signals, kill -9, exit status, a new session when
asked) that runs MODULE as `python -m` does (runpy, `__name__ == "__main__"`, sys.argv), with the
command's environment and working directory; only the 3-4 s a fresh interpreter spends importing
torch are gone. Its stdout and stderr go to files, read back by `communicate` as text (stdout to a
descriptor of the caller's where it gives one: a pipe's end, a terminal). `popen` and
`run` take the arguments of subprocess.Popen and subprocess.run that the tests use, so a test
switches by swapping the call; commands that are not `sys.executable -m MODULE …` are refused.

A forked command's torchrun forks its workers too: each command gets PYTHON_EXEC and the address
of a second server, forked from the first (tests/helpers/forked_workers.py), unless its
environment names a PYTHON_EXEC of its own. What stays a fresh interpreter on purpose: commands
the tests start with plain `subprocess` (tests of what a command imports or how it starts, and of
how real workers die with their launcher).

The servers' children are reaped by the servers, and the servers by this process at the end of the
session (`stop_server`), so their CPU time counts in `time make test` like any subprocess's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# Imported once by the server; what a child then imports itself costs what it always did. The last
# three are what the forked children of a `make test` imported most after the fork (counted over the
# process tier, 89 children): torch._dynamo, which the optimizer's constructor imports (0.7 CPU s; 54
# children: every training run), pandas (pyarrow's parquet paths; 0.2 s, 29) and matplotlib's pyplot
# (the plots; 0.7 s, 8).
PRELOAD = ["torch", "training.train", "training.launch", "pipelines.cli", "torch.distributed.run",
           "torch._dynamo", "pandas", "matplotlib.pyplot"]  # fmt: skip
WORKERS = "tests.helpers.forked_workers"
# Makes a user and mount namespace, then becomes its MODULE here, which sets the threads then: the
# kernel refuses unshare(CLONE_NEWUSER) to a process with threads, and torch.set_num_threads starts them
MOUNTS = "tests.helpers.mounts"
NO_DAC = "tests.helpers.no_dac"  # drops capabilities, which bind only its own thread: before torch's start
FROZEN = "tests.helpers.frozen_preload"  # last: freezes what the server imported

_context = None
_outputs: Path | None = None  # the children's stdout and stderr files, removed with the server
_workers: tuple[multiprocessing.process.BaseProcess, str, str] | None = None  # (server, address, stub)


def _server():
    global _context, _outputs
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload([*PRELOAD, __name__, WORKERS, FROZEN])
        _outputs = Path(tempfile.mkdtemp(prefix="forked-"))
    return _context


def workers_env() -> dict[str, str]:
    """PYTHON_EXEC and the address of this process's worker server (started at the first call): a
    torchrun whose environment has them forks its workers from that server."""
    from tests.helpers import forked_workers as workers  # it imports this module

    global _workers
    if _workers is None:
        server = _server()
        address = str(_outputs / "workers.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(address)
        listener.listen(64)
        process = server.Process(target=workers.serve, args=(listener, os.getpid()))
        process.start()
        listener.close()
        _workers = (process, address, str(workers.install(_outputs)))
    _, address, stub = _workers
    return {"PYTHON_EXEC": stub, workers.ADDRESS: address}


def worker_server_pid() -> int:
    """The pid of this process's worker server (started at the first call): the parent of the workers
    a forked command's torchrun starts (the stubs are torchrun's children), and so of their children."""
    workers_env()
    return _workers[0].pid


def stop_server() -> None:
    """End the servers (they end on their own with this process too), reap them (the worker
    server first: the forkserver reaps it), remove the outputs."""
    if _workers is not None:
        from tests.helpers.forked_workers import STOP

        process, address, _ = _workers
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as stop:
            stop.connect(address)
            stop.send(STOP)
        process.join(60)
    if _context is not None:
        from multiprocessing import forkserver

        forkserver._forkserver._stop()
        shutil.rmtree(_outputs, ignore_errors=True)


class _Descriptor:
    """A descriptor of the test process sent to the forked child (multiprocessing passes it with the
    child's start, as it passes a Connection's): unpickled there as the child's copy of it."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def _child(module: str, args: list[str], env: dict[str, str], cwd: str, out: str | int, err: str,
           session: bool):  # fmt: skip
    if session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = path if isinstance(path, int) else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        if target != fd:
            os.dup2(target, fd)
            os.close(target)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    if isinstance(out, int):  # buffered as a fresh interpreter's stdout on it: by lines on a terminal only
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
    become(module, args, env, cwd)


def become(target: str, args: list[str], env: dict[str, str], cwd: str, *, script: bool = False) -> None:
    """Run `python -m TARGET ARGS` (script: `python TARGET ARGS`) in this process as a fresh
    interpreter would: the command's directory, environment, sys.argv and sys.path[0]."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if "OMP_NUM_THREADS" in env and target not in (MOUNTS, NO_DAC):  # what a fresh interpreter's torch reads
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [target, *args]
    if script:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")
        return
    sys.path.insert(0, os.getcwd())
    # `python -m` runs the module's code as __main__ beside any import of it by name: so here too
    # (the preloaded copy leaves sys.modules; a later import of it imports it anew, as there).
    sys.modules.pop(target, None)
    runpy.run_module(target, run_name="__main__", alter_sys=True)


class Forked:
    """The subprocess.Popen methods the tests use, for a forked child (text output only)."""

    def __init__(self, args, *, cwd=None, env=None, stdout=None, stderr=None, start_new_session=False, **kw):
        unsupported = set(kw) - {"text", "universal_newlines"}
        if unsupported:
            raise TypeError(f"forked.popen does not take {sorted(unsupported)}")
        if list(args[:2]) != [sys.executable, "-m"]:
            raise ValueError(f"forked.popen runs `{sys.executable} -m MODULE ...`, not {args[:3]}")
        self.args = list(args)
        server = _server()
        env = dict(os.environ if env is None else env)
        if "PYTHON_EXEC" not in env:  # a torchrun it starts forks its workers too
            env.update(workers_env())
        folder = Path(tempfile.mkdtemp(dir=_outputs))
        self._out = folder / "stdout"
        self._err = self._out if stderr == subprocess.STDOUT else folder / "stderr"
        for path in {self._out, self._err}:
            path.touch()
        # stdout a descriptor of this process's (a pipe's write end, a terminal): the child's fd 1 is
        # that file, and `communicate` gives "" for stdout
        given = isinstance(stdout, int) and stdout >= 0
        if given and stderr == subprocess.STDOUT:
            raise TypeError("forked.popen takes stderr=STDOUT only with its stdout to a file")
        out = _Descriptor(stdout) if given else str(self._out)
        self._process = server.Process(
            target=_child,
            args=(args[2], list(args[3:]), env, str(cwd or os.getcwd()),
                  out, str(self._err), start_new_session),
        )  # fmt: skip
        self._process.start()
        self.pid = self._process.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            out, err = self.output()
            raise _TimedOut(self.args, timeout, output=out, stderr=err)
        return self.returncode

    def output(self) -> tuple[str, str]:
        """(stdout, stderr) written so far; stderr is '' when it went to stdout."""
        out = self._out.read_text(errors="replace")
        return out, "" if self._err == self._out else self._err.read_text(errors="replace")

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.output()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _TimedOut(subprocess.TimeoutExpired):
    """A child still running at its test's timeout: the message ends with what it had written, where a
    rare hang in CI otherwise says nothing of where the run stood."""

    def __str__(self) -> str:
        said = f"{super().__str__()}; its output ends:\n{(self.output or '')[-4000:]}"
        return said + (f"\nits stderr ends:\n{self.stderr[-4000:]}" if self.stderr else "")


def popen(args, **kw) -> Forked:
    return Forked(args, **kw)


def run(args, *, timeout: float | None = None, capture_output: bool = False, check: bool = False, **kw):
    """subprocess.run for a forked child: the output is always captured (text)."""
    proc = Forked(args, **kw)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
