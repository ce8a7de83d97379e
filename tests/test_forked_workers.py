"""torchrun's workers forked from the test worker's server (tests/helpers/forked_workers.py): to
torchrun and to a test, the stub it starts (PYTHON_EXEC) is the worker. Each behaviour is checked
against a fresh interpreter running the same script: the same output, exit status or death by the
same signal; signals reach the worker; a kill -9 of the stub, or of its parent, leaves no worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import forked, worker_probe

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

PROBE = str(Path(worker_probe.__file__).resolve())


def start(
    tmp_path: Path, what: str, *, fresh: bool = False, parent: bool = False
) -> tuple[subprocess.Popen, Path]:
    """The probe started as torchrun starts a worker (`PYTHON_EXEC -u SCRIPT ARGS`, a session of its
    own), forked through the stub, or a fresh interpreter; stdout and stderr in files of `out`.
    parent: started by a parent process of its own (as torchrun is), and that parent returned."""
    out = tmp_path / ("fresh" if fresh else "forked")
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PROBE": "here", **({} if fresh else forked.workers_env())}
    cmd = [sys.executable if fresh else env["PYTHON_EXEC"], "-u", PROBE, what]
    if parent:
        cmd = [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()", *cmd]
    with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    return proc, out


def output(out: Path) -> tuple[str, str]:
    return (out / "stdout").read_text(), (out / "stderr").read_text()


def wait_for(out: Path, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in output(out)[0]:
        assert time.monotonic() < deadline, output(out)
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def worker_pid(out: Path) -> int:
    wait_for(out, "stdout line")
    return int(output(out)[0].split("pid ")[1].split()[0])


# what the probe does: the exit status of a fresh interpreter that does it (-N: killed by signal N)
STATUS = {"exit:0": 0, "exit:3": 3, "message": 1, "raise": 1, "interrupt": -signal.SIGINT, "_exit:7": 7,
          "killed:SIGUSR1": -signal.SIGUSR1, "killed:SIGSEGV": -signal.SIGSEGV}  # fmt: skip


@pytest.mark.parametrize("what", STATUS)
def test_a_forked_worker_ends_and_writes_as_a_fresh_one(tmp_path, what):
    """The same stdout, the same last line of stderr (a traceback's frames differ: runpy's and the
    server's), the same exit status or death by the same signal (a negative returncode)."""
    runs = {}
    for fresh in (True, False):
        proc, out = start(tmp_path, what, fresh=fresh)
        proc.wait(timeout=60)
        stdout, stderr = output(out)
        pid = f"pid {proc.pid if fresh else worker_pid(out)}\n"
        runs[fresh] = (proc.returncode, stdout.replace(pid, ""), stderr.splitlines()[-1])
        assert f"preloaded torch {not fresh}" in stderr  # the forked one is a fork of the server
    assert runs[False] == runs[True]
    code, stdout, last = runs[False]
    assert f"argv ['{what}'] cwd {tmp_path} PROBE here" in stdout  # the stub's command and environment
    assert "PYTHON_EXEC False session leader True" in stdout and stdout.endswith("stdout line")
    assert code == STATUS[what]


def test_signals_sent_to_the_stub_or_its_session_reach_the_worker(tmp_path):
    """torchrun signals a worker's session (os.killpg), a test or the launcher its pid (os.kill); the
    worker is in a session of its own, so the stub passes each signal on."""
    proc, out = start(tmp_path, "wait")
    wait_for(out, "ready")
    assert "stdout line" in output(out)[0]  # `-u`: written at once, without a newline or a flush
    sent = ["SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM"]
    for i, name in enumerate(sent):
        (os.killpg if i % 2 else os.kill)(proc.pid, signal.Signals[name])
        wait_for(out, f"got {name}")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, output(out)
    assert [line for line in output(out)[0].splitlines() if line.startswith("got")] == [
        f"got {name}" for name in [*sent, "SIGTERM"]
    ]


@pytest.mark.parametrize("kill", ["the stub", "its parent"])
def test_a_kill_9_of_the_stub_or_its_parent_leaves_no_worker(tmp_path, kill):
    """torchrun's SIGKILL of a worker's session after its shutdown timeout, a test's kill -9 of a
    worker, or a kill -9 of torchrun itself (the worker dies with its launcher): the stub dies, and
    the forked worker with it."""
    proc, out = start(tmp_path, "sleep", parent=kill == "its parent")
    worker = worker_pid(out)
    assert alive(worker) and worker != proc.pid
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 3.0  # ~0.1 s when the machine is idle
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker), f"the forked worker outlived the kill -9 of {kill}"


def test_a_forked_torchrun_forks_its_workers_and_ends_with_their_status(tmp_path):
    """`python -m training.launch torchrun` (the launcher's agent) forked: both ranks are forks of the
    server with torchrun's environment (LOCAL_RANK, TORCHELASTIC_*), and rank 1's exit status is the
    job's, as with fresh workers (tests/training/test_launch_exits.py)."""
    cmd = [sys.executable, "-m", "training.launch", "torchrun", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "PROBE": "here", "OMP_NUM_THREADS": "1"}
    done = forked.run([*cmd, PROBE, "exit:3"], cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} run True" in done.stdout
    assert done.stderr.count("preloaded torch True") == 2, done.stderr[-3000:]
