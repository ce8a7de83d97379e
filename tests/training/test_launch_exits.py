"""How `gristmill train` ends: under torchrun with the workers' own exit status and one-line message
(never torchrun's exit 1 and ChildFailedError report), on Ctrl-C once (save, exit 0) or twice (at
once, exit 130, one line, no traceback), in one process as through torchrun. Real processes and a
real torchrun throughout: each test starts `gristmill train` as a user would.

One 2-rank launch trains for real (the non-finite stop: the trainer's own message and status through
torchrun; its workers forked from the tests' server, tests/helpers/forked_workers.py: two
interpreters' start-up less); the others check what the launcher and torchrun do with a worker's
status, message and signals, with light workers (tests/helpers/light_trainer.py: no torch import,
no model), and the trainer's side of those exits with the real trainer in one process (a loader
worker killed under a one-process `gristmill train`: tests/training/checkpoint/test_checkpoint.py).
The launchers (`gristmill train`) and the probes of GracefulStop and of the agent's start
(`run_code`) are forked from the tests' server (tests/helpers/forked.py: no interpreter start, no
torch import), real processes all the same; what a launcher starts is its own (torchrun's agent, a
fresh interpreter, as for a user). The one-process second Ctrl-C stays a fresh interpreter: it may
meet the interpreter's teardown, which a forked process does not have."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from pipelines.local_s3 import free_port
from tests.helpers import forked, light_trainer
from training.contract.run_layout import COMPLETE_FILE, checkpoint_dir
from training.launch import child_pids, exit_status, say_agent_killed

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/train/tiny.toml")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
LAUNCHER = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY]
# torchrun's own report of a failed worker, and the tracebacks of the launcher or of torchrun
NOISE = (
    "Traceback",
    "ChildFailedError",
    "FAILED",
    "Root Cause",
    "torch/distributed/elastic",
    "SignalException",
)


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset()


def sets(dataset: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.dataset={json.dumps(str(dataset))}",
        f"run.output_dir={json.dumps(str(run_dir))}",
        "run.val_every=0",
        "run.threads=1",
        "metrics.tensorboard=false",
        "metrics.plot=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> dict[str, str]:
    """The environment of a launch whose torchrun workers are the light trainer (PYTHON_EXEC)."""
    folder = tmp_path_factory.mktemp("light-trainer")
    light_trainer.install(folder)
    return {**ENV, "PATH": f"{folder}{os.pathsep}{ENV['PATH']}", "PYTHON_EXEC": "training.train"}


def launch(nproc: int, overrides: list[str], *args: str, env: dict[str, str] = ENV, fresh: bool = False,
           **kw) -> subprocess.Popen | ForkedLaunch:  # fmt: skip
    """`gristmill train --config tiny.toml --nproc-per-node N [args] --set overrides`, forked
    (ForkedLaunch); `fresh`: a fresh interpreter."""
    cmd = [*LAUNCHER, "--nproc-per-node", str(nproc), *args, "--set", *overrides]
    if not fresh:
        return ForkedLaunch(cmd, env=env, **kw)
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


class ForkedLaunch(forked.Forked):
    """A launch forked from the tests' server (tests/helpers/forked.py): the launcher without its
    interpreter's start and torch's import; what it starts is its own (torchrun's agent, a fresh
    interpreter, as for a user; one process: the trainer, itself). Its stdout a pipe read here, as
    subprocess.PIPE's (`stdout`); its stderr a file (`communicate`, `output`)."""

    def __init__(self, cmd: list[str], **kw):
        reading, writing = os.pipe()
        try:
            super().__init__(cmd, cwd=ROOT, stdout=writing, **kw)
        finally:
            os.close(writing)
        self.stdout = open(reading, encoding="utf-8")

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(the rest of stdout, stderr) once it ended; stdout read meanwhile (a full pipe would stall it)."""
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.append(self.stdout.read()), daemon=True)
        reader.start()
        _, err = super().communicate(timeout)
        reader.join(timeout)
        assert rest, "stdout still open after the launcher ended"
        self.stdout.close()
        return rest[0], err


def the_one_line(err: str) -> str:
    """The message of a failed run: stderr holds that one line and nothing else but torchrun's
    OMP_NUM_THREADS banner (printed when it starts, not a failure report)."""
    for noise in NOISE:
        assert noise not in err, err
    banner = ("*****", "Setting OMP_NUM_THREADS")
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(banner)]
    assert len(lines) == 1, err
    return lines[0]


def wait_for_step(proc: subprocess.Popen, step: int) -> list[str]:
    """Read progress lines until `step` was logged (the worker's output reaches us live)."""
    seen = []
    deadline = time.time() + 240
    while time.time() < deadline:
        line = proc.stdout.readline()
        assert line, f"the run ended before step {step}: {''.join(seen)[-2000:]} {proc.communicate()}"
        seen.append(line)
        if line.startswith(f"step {step:6d}/"):
            return seen
    raise AssertionError(f"no step {step} within 240 s")


# -- exit status and message under torchrun -----------------------------------------------------


def test_a_nonfinite_stop_under_torchrun_exits_3_with_the_workers_line(dataset, tmp_path):
    """`--nproc-per-node 2 --set optim.lr=1e3`: the NaN stop exits 3 as in one process (torchrun
    itself exits 1 for any failed worker), its message is the one line on stderr, and the progress
    lines came while it trained."""
    run = tmp_path / "run"
    nan = ["optim.lr=1e3", "checkpoint.interval=4", "run.log_every=1", "parallel.shard=2"]
    proc = launch(2, sets(dataset, run, *nan), env={**ENV, **forked.workers_env()})  # workers forked
    early = wait_for_step(proc, 1)  # live: step 1 arrives before the run ends
    assert proc.poll() is None
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, out[-2000:] + err[-3000:]
    assert "+ " in early[0] and "-m training.train" in early[0]
    line = the_one_line(err)
    assert line.startswith("error: step ") and "is not finite" in line, line
    assert f"Last complete checkpoint: {run / 'checkpoints'}" in line


@pytest.mark.parametrize(
    "point, note",
    [
        ("complete", "note: SIGTERM after the run completed: exiting"),
        ("released", "note: SIGTERM after the last step: the run finishes its records"),
    ],
)
def test_a_sigterm_once_the_run_is_complete_exits_0(dataset, tmp_path, point, note):
    """A SIGTERM to a worker after its run completed, during its teardown (seconds: a scheduler's time
    limit there): the signal's default action, "killed by SIGTERM" and 143 for a complete run (trial
    RV55b 1); also once the loop gave the signals back, in the process group's teardown (RV58a F1).
    Now a note and 0; the workers are fresh interpreters, as under a user's torchrun."""
    run = tmp_path / "run"
    env = {**ENV, "GRISTMILL_FAULT_SIGTERM": point}
    proc = launch(
        2, sets(dataset, run, "parallel.shard=2", "schedule.steps=2", "schedule.warmup_steps=1"), env=env
    )
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert note in err, err[-3000:]
    assert (checkpoint_dir(run, 2) / COMPLETE_FILE).is_file()


def test_a_signal_in_the_command_s_teardown_keeps_its_status(tmp_path):
    """`gristmill` in its own process: a SIGTERM after its command ended, during the interpreter's
    teardown (here from an atexit hook), killed it, 143 for a complete one-process training (trial
    RV55b 1). The status decided stands: with a note where the hook runs before gristmill's last
    callback (torch's, multiprocessing's: registered after gristmill's first import), without one
    after it (there SIGTERM is ignored: review RV59f 1)."""
    hook = "import atexit, os, signal; atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))"
    for argv, code in (("['gristmill', '--help']", 0), ("['gristmill', 'no-such-command']", 2)):
        for first, noted in (("from pipelines.cli import entry", True), (hook, False)):
            second = hook if noted else "from pipelines.cli import entry"
            script = f"{first}; {second}; import sys; sys.argv = {argv}; entry()"
            proc = subprocess.run(
                [sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True
            )
            assert proc.returncode == code, proc.stderr[-2000:]
            note = f"note: SIGTERM after the command ended: exiting with {code}"
            assert (note in proc.stderr) == noted, proc.stderr


@pytest.mark.parametrize("entry", ["training.train", "validation.train_eval", "pipelines.cli"])
def test_the_decided_exit_s_last_callback_is_registered_first(entry):
    """atexit runs its callbacks last registered first: errors.py's, which ignores SIGTERM, registered
    after torch's and multiprocessing's ran before them, and a SIGTERM in theirs (a worker's teardown)
    was ignored without a note, a hang there ended only by a SIGKILL (review RV59f 1)."""
    probe = (
        "import atexit, importlib, sys\n"
        "names, register = [], atexit.register\n"
        "def noted(f, *a, **k):\n"
        "    names.append(getattr(f, '__qualname__', ''))\n"
        "    return register(f, *a, **k)\n"
        "atexit.register = noted\n"
        f"importlib.import_module({entry!r})\n"
        "print(names[0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert proc.stdout.strip() == "_signals_ignored_in_the_last_teardown", proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_in_the_modules_teardown_keeps_the_status(tmp_path, sig):
    """After the atexit callbacks Python gives SIGTERM and SIGINT their default action back, and the
    modules' teardown (torch's objects: up to a second) follows: a SIGTERM there killed a complete run,
    143 (trial RV59c 1), a Ctrl-C 130 (trial RV65b 2). Here one is sent from a __main__ global's
    __del__, which that teardown runs."""
    late = (
        "import os, signal, time\n"
        "class Late:\n"
        "    def __del__(self):\n"
        f"        os.kill(os.getpid(), signal.{sig})\n"
        "        time.sleep(0.2)  # the signal's delivery\n"
        "        os.write(1, b'survived\\n')\n"
        "late = Late()\n"
        "import sys; sys.argv = ['gristmill', '--help']\n"
        "from pipelines.cli import entry\n"
        "entry()\n"
    )
    proc = subprocess.run([sys.executable, "-c", late], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.endswith("survived\n"), proc.stdout[-500:]


def test_a_rendezvous_port_in_use_is_one_line(tmp_path):
    """`python -m training.launch torchrun` (the Slurm script's launch) with MASTER_PORT held by another
    program: torchrun's 40-line traceback ending in EADDRINUSE, the port's setting named nowhere (trial
    RV55b 3). One line naming it, before any worker starts."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        agent = [sys.executable, "-m", "training.launch", "torchrun", "--nproc_per_node=1"]
        rendezvous = ["--master_addr=127.0.0.1", f"--master_port={port}"]
        proc = subprocess.run(
            [*agent, *rendezvous, "-m", "training.train", "--config", TINY], cwd=tmp_path, env=ENV,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: torchrun's rendezvous port is in use by another program (another job on this node?): give "
        "--master_port (MASTER_PORT) or --rdzv_endpoint a free port; nothing was started"
    ], proc.stderr[-3000:]


def test_an_error_under_torchrun_exits_2_with_the_workers_line(dataset, tmp_path, light, capsys):
    """An error (here a missing --resume path) under torchrun: exit 2 and the worker's one line. Run
    through `validation.train_eval` (eval during training goes through torchrun even for one
    process); the 2-rank `training.train` path is the non-finite test above (CI time). The worker
    here is light, so its line is first checked as the real entry point says it, in this process."""
    pytest.importorskip("lm_eval")
    from validation.train_eval import main as train_eval_main

    missing = tmp_path / "no such 'dir'"  # a space and a quote: the echoed command quotes them (issue 37)
    run_sets = sets(dataset, tmp_path / "run", "eval.interval=20")
    assert train_eval_main(["--config", TINY, "--resume", str(missing), "--set", *run_sets]) == 2
    line = (
        f"error: --resume {missing}: no such checkpoint directory; give a checkpoint's path "
        "(RUN/checkpoints/step-N), or auto for the run's newest complete one that verifies"
    )
    assert the_one_line(capsys.readouterr().err) == line
    said = {**light, "LIGHT_TRAINER": f"exit:2:{line}"}
    proc = launch(1, run_sets, "--resume", str(missing), env=said)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert the_one_line(err) == line
    # The echoed torchrun command, pasted back into a shell, gives the same arguments.
    echo = next(line for line in out.splitlines() if line.startswith("+ "))
    argv = shlex.split(echo[2:])
    assert argv[argv.index("-m", 2) + 1] == "validation.train_eval", echo
    assert f"checkpoint.resume={json.dumps(str(missing))}" in argv, echo


def test_a_worker_killed_by_a_signal_is_named_with_128_plus_the_signal(dataset, tmp_path, light):
    """A worker killed by SIGKILL (the OOM killer) says nothing itself: the launcher's one line
    names it, and the status is the shell's for a killed process, 137 (light workers)."""
    proc = launch(
        2,
        sets(dataset, tmp_path / "run", "schedule.steps=400", "run.log_every=1", "parallel.shard=2"),
        env=light,
    )
    wait_for_step(proc, 2)
    workers = [w for agent in child_pids(proc.pid) for w in child_pids(agent)]  # launcher → torchrun → 2
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:] + err[-3000:]
    assert f"error: training.train rank 1 (pid {workers[1]}) was killed by SIGKILL" in err.splitlines()
    assert "ChildFailedError" not in err and "Root Cause" not in err


def test_torchrun_s_agent_killed_is_one_line_naming_the_resume(dataset, tmp_path, light, capsys):
    """torchrun's agent killed (kill -9, the OOM killer) ends its workers: the launcher exited 137 and
    said nothing (trial RV65b 3); a SIGTERM passed on before the workers started killed the agent, 143
    and nothing said either (RV65b 4)."""
    proc = launch(
        2,
        sets(dataset, tmp_path / "run", "schedule.steps=400", "run.log_every=1", "parallel.shard=2"),
        env=light,
    )
    wait_for_step(proc, 2)
    (agent,) = child_pids(proc.pid)
    os.kill(agent, signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:] + err[-3000:]
    assert (
        f"error: torchrun's agent (pid {agent}) was killed by SIGKILL, and its workers with it: continue "
        "with --resume auto (from the newest complete checkpoint)"
    ) in err.splitlines(), err[-3000:]
    say_agent_killed(agent, signal.SIGTERM, [signal.SIGTERM])  # the launcher's own, passed on
    assert capsys.readouterr().err == (  # before the workers started, or after they ended (RV65f 1)
        "note: SIGTERM reached torchrun's agent while it ran no worker (before they started, or after they "
        "ended): exit 143 is the agent's; the run's own lines above say what was done\n"
    )


def failure(rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="")


def test_exit_status_of_torchruns_failures():
    # rank 1 stopped first with its own status; torchrun then SIGTERMed rank 0 (no news)
    assert exit_status({1: failure(1, 3), 0: failure(0, -15)}, "training.train") == (3, [])
    # killed first: named, 128 + N; a worker that then failed of it adds nothing
    code, lines = exit_status({1: failure(1, -9), 0: failure(0, 1)}, "training.train")
    assert (code, lines) == (137, ["error: training.train rank 1 (pid 1001) was killed by SIGKILL"])
    segv = failure(1, -11)
    segv.timestamp += 1  # a second after rank 0 stopped of its own error
    code, lines = exit_status({0: failure(0, 1), 1: segv}, "m")
    assert (code, lines) == (1, ["error: m rank 1 (pid 1001) was killed by SIGSEGV"])
    # listed first in the same second, torchrun's SIGTERM of rank 0 is not the first failure (it was:
    # 143 and "rank 0 was killed by SIGTERM" for a rank 1 SIGKILLed mid-save, review R23c 5)
    both = {0: failure(0, -15), 1: failure(1, -9)}
    assert len({f.timestamp for f in both.values()}) == 1
    code, lines = exit_status(both, "training.train")
    assert (code, lines) == (137, ["error: training.train rank 1 (pid 1001) was killed by SIGKILL"])
    assert exit_status({0: failure(0, -15), 1: failure(1, 2)}, "training.train") == (2, [])
    # rank 0's collective failed of rank 1's SIGKILL in the same second (exit 1, one line of its own):
    # the kill is the first failure, 137 (review R23f 3)
    code, lines = exit_status({0: failure(0, 1), 1: failure(1, -9)}, "training.train")
    assert (code, lines) == (137, ["error: training.train rank 1 (pid 1001) was killed by SIGKILL"])


def test_an_error_only_another_rank_met_is_printed(tmp_path, monkeypatch):
    """train.py prints a GristmillError on rank 0 only (every rank has a config error: said once);
    an error only rank 1 met (its shard, its disk) reached the user as a bare exit 2. Rank 1 leaves
    it in torchrun's reply file, and the launcher prints it when rank 0 did not stop on its own."""
    from training.run.worker_reply import report_to_launcher

    def reply(rank: int, message: str, exitcode: int, status: int = 2) -> ProcessFailure:
        path = tmp_path / f"error-{rank}.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
        report_to_launcher(f"rank {rank}: {message}", printed=rank == 0, status=status)
        return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))

    rank1 = reply(1, "shards/00001_00000.tar is truncated; rebuild it", 2)
    code, lines = exit_status({1: rank1, 0: failure(0, -15)}, "training.train")
    assert (code, lines) == (2, ["error: rank 1: shards/00001_00000.tar is truncated; rebuild it"])
    # rank 0 met it too and printed it (even if torchrun then stopped it with SIGTERM): nothing added
    assert exit_status({1: rank1, 0: reply(0, "the same", -15)})[1] == []
    assert exit_status({1: rank1, 0: reply(0, "the same", 2)}) == (2, [])
    # rank 0 printed its own error (a full disk under metrics.jsonl) and was SIGTERMed in its teardown,
    # after rank 1's collective failed of it: its error's status, no "killed" line (they were 143 and
    # "rank 0 was killed by SIGTERM": trial RV65f 2)
    gone = failure(1, 1)
    gone.timestamp += 1
    full = reply(0, "cannot write metrics.jsonl: No space left on device", -15)
    assert exit_status({1: gone, 0: full}, "training.train") == (2, [])
    gone.timestamp = full.timestamp  # in the same second: the reply, its own error, is the first
    assert exit_status({1: gone, 0: full}, "training.train") == (2, [])
    # rank 0's status is the one whose message is on screen
    assert exit_status({1: failure(1, 1), 0: reply(0, "the same", 2)}) == (2, [])
    # rank 1's own error (its reply; SIGTERMed in its teardown, or exited 2), rank 0's collective failed
    # of it (exit 1, no reply): rank 1's status and line, not rank 0's 1 (review RV66e 3)
    peer = failure(0, 1)
    for own in (reply(1, "its shard is gone", -15), reply(1, "its shard is gone", 2)):
        peer.timestamp = own.timestamp
        assert exit_status({0: peer, 1: own}, "m") == (2, ["error: rank 1: its shard is gone"])
    assert exit_status({1: gone, 0: reply(0, "interrupted", -15, status=130)}, "m") == (130, [])
    # a SIGKILL after its reply (the out-of-memory killer) is a death of its own: said, 137
    code, lines = exit_status({1: gone, 0: reply(0, "the same", -9)}, "m")
    assert (code, lines) == (137, ["error: m rank 0 (pid 1000) was killed by SIGKILL"])


def test_a_reader_gone_before_the_launchers_first_line_costs_no_run(dataset, tmp_path, light):
    """`gristmill train --nproc-per-node 2 | head -0` (or a terminal closed in the first second): the
    launcher's `+ torchrun …` line raised BrokenPipeError, exit 141, nothing trained, no message
    (review R18d 2d). A closed stdout only stops the printing: the (light) workers run and end."""
    said = {**light, "LIGHT_TRAINER": "exit:0:done"}
    proc = launch(2, sets(dataset, tmp_path / "run", "parallel.shard=2"), env=said)
    proc.stdout.close()  # the reader gone before anything was printed
    proc.wait(timeout=240)
    err = proc.output()[1]
    assert proc.returncode == 0, err
    assert "done" in err.splitlines()


def test_a_ctrl_c_or_a_hangup_before_the_loop_is_one_line_or_nothing(dataset, tmp_path, monkeypatch, capsys):
    """A Ctrl-C during a worker's setup (a checkpoint's load) was a traceback per rank and exit 1
    (review R18d 2b): one line and 130, as one process says it. A SIGHUP in the launcher's first
    seconds (a terminal closed) ended the run, 129 (R18d 2e): ignored from the command's start."""
    import training.run.preflight
    import training.train
    from pipelines.cli import main as cli

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.train, "train", interrupted)
    assert training.train.main(["--config", TINY, "--set", *sets(dataset, tmp_path / "run")]) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C): nothing after the last line above was done\n"

    class Gone:  # a stderr whose reader went away: still 130, not 1 (review R18f 3)
        def write(self, text):
            raise BrokenPipeError

        def flush(self):
            raise BrokenPipeError

    monkeypatch.setattr(sys, "stderr", Gone())
    assert training.train.main(["--config", TINY, "--set", *sets(dataset, tmp_path / "run")]) == 130
    monkeypatch.undo()
    monkeypatch.setattr(training.train, "train", interrupted)
    hangup = []

    def preflight(*args, **kw):
        hangup.append(signal.getsignal(signal.SIGHUP))
        raise training.run.preflight.GristmillError("stop here")

    monkeypatch.setattr(training.run.preflight, "preflight", preflight)
    before = signal.getsignal(signal.SIGHUP)
    two = ["train", "--config", TINY, "--nproc-per-node", "2", "--set", *sets(dataset, tmp_path / "r2")]
    assert cli(two) == 2
    assert hangup == [signal.SIG_IGN] and signal.getsignal(signal.SIGHUP) == before


class _NotTaken(Exception):
    """The test's own SIGTERM handler ran: the command had none of its own."""


def test_a_sigterm_before_the_loop_is_one_line_and_143(dataset, tmp_path, monkeypatch, capsys):
    """`gristmill train` in its own process: a SIGTERM during its setup (a checkpoint's load, the
    model's build; a scheduler's preemption) ended it by the signal's default action, 143 and not a
    word (review RV43a F6). It says one line now, as a Ctrl-C there does, and SIGTERM's handler is
    the caller's again after."""
    import training.train
    from pipelines.cli import main as cli

    def terminated(*args, **kw):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler runs here
        raise AssertionError("the SIGTERM was not handled")

    def not_taken(signum, frame):
        raise _NotTaken

    monkeypatch.setattr(training.train, "train", terminated)
    before = signal.signal(signal.SIGTERM, not_taken)
    try:
        assert cli(["train", "--config", TINY, "--set", *sets(dataset, tmp_path / "run")]) == 143
        assert signal.getsignal(signal.SIGTERM) is not_taken
    finally:
        signal.signal(signal.SIGTERM, before)
    assert capsys.readouterr().err == "interrupted (SIGTERM): nothing after the last line above was done\n"


def run_code(folder: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c CODE` as a process of its own, forked (tests/helpers/forked.py: torch's import
    skipped): CODE is the module `folder/probe.py`, run as `python -m probe` from `folder`."""
    (folder / "probe.py").write_text(code)
    return forked.run([sys.executable, "-m", "probe"], cwd=folder, env=ENV, timeout=timeout)


def two_ctrl_cs(folder: Path, setup: str, indent: str) -> subprocess.CompletedProcess:
    """A process of its own that runs `setup` (code using GracefulStop), then sends itself two SIGINTs
    (at `indent`: inside its block, or after it) and waits; it must end with 130."""
    kill = f"{indent}os.kill(os.getpid(), signal.SIGINT)\n"
    script = "import os, signal\nfrom training.run.shutdown import GracefulStop\n" + setup + kill * 2
    script += f"{indent}signal.pause()\n"
    done = run_code(folder, script)
    assert done.returncode == 130, done.stderr
    return done


def test_a_ctrl_c_and_a_sigterm_taken_together_are_one_stop_by_the_first(tmp_path):
    """A Ctrl-C and a SIGTERM pending together (a terminal's and a scheduler's within one bytecode):
    Python runs SIGINT's handler first, and the SIGTERM's then wrote over the stop's signal, which the
    stop's lines name (trial RV58a F5). The first one stands; neither is a second Ctrl-C."""
    script = (
        "import os, signal\n"
        "from training.run.shutdown import GracefulStop\n"
        "with GracefulStop(0, 1) as stop:\n"
        "    both = {signal.SIGINT, signal.SIGTERM}\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, both)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    signal.pthread_sigmask(signal.SIG_UNBLOCK, both)\n"
        "    print(signal.Signals(stop.received).name)\n"
    )
    done = run_code(tmp_path, script)
    assert (done.returncode, done.stdout) == (0, "SIGINT\n"), done.stderr


def test_a_second_ctrl_c_during_an_eval_says_its_line_on_the_terminal(tmp_path):
    """An in-training eval points fd 2 at its eval.log while it scores: a second Ctrl-C then exited
    130 with its one line in RUN/eval/step-N/eval.log and nothing on the terminal (review R18d 2c)."""
    log = tmp_path / "eval.log"
    done = two_ctrl_cs(
        tmp_path,
        "with GracefulStop(0, 1):\n"
        f"    fd = os.open({str(log)!r}, os.O_WRONLY | os.O_CREAT)\n"
        "    os.dup2(fd, 2)  # as validation/eval_output.py does during an eval\n",
        "    ",
    )
    assert done.stderr.startswith("second Ctrl-C (SIGINT): stopping now without saving"), done.stderr
    assert "second Ctrl-C" not in log.read_text()


def test_a_second_ctrl_c_after_the_last_step_says_the_run_is_complete(tmp_path):
    """After the loop a first Ctrl-C is a note; a second stops at once, 130, and said "resume from the
    newest complete checkpoint", where a resume has nothing to do (review R18i B4)."""
    done = two_ctrl_cs(tmp_path, "with GracefulStop(0, 1):\n    pass  # the loop, done\n", "")
    lines = done.stderr.splitlines()
    assert lines[0].startswith("note: Ctrl-C after the last step: the run finishes its records"), lines
    said = "second Ctrl-C (SIGINT) after the last step: stopping now; the run's steps and checkpoints are "
    assert lines[1] == said + "complete (its trackers may lack their last rows)", lines


# -- Ctrl-C: once saves and exits 0, twice stops at once with 130 -------------------------------


def ctrl_c(proc: subprocess.Popen, times: int) -> tuple[str, str]:
    """Ctrl-C as a terminal sends it: SIGINT to the foreground process group (the launcher's)."""
    for _ in range(times):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
    return proc.communicate(timeout=240)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_ctrl_c_stops_at_once_with_one_line_and_130(dataset, tmp_path, light, nproc):
    """With 1 process the trainer itself answers, its loader's worker in the terminal's process group
    too (which printed the line again, as its trainer's handler: trial RV58a F3); with 2 the launcher
    relays both Ctrl-Cs through torchrun to (light) workers, and every process of the tree is gone."""
    run = tmp_path / "run"
    extra = ["parallel.shard=2"] if nproc == 2 else ["data.num_workers=1"]
    long = ["schedule.steps=400", "run.log_every=1", "checkpoint.interval=2", *extra]
    # one process: a fresh interpreter, whose teardown the second Ctrl-C may meet (a forked one has none)
    proc = launch(nproc, sets(dataset, run, *long), start_new_session=True, env=light if nproc == 2 else ENV,
                  fresh=nproc == 1)  # fmt: skip
    wait_for_step(proc, 3)
    processes = [proc.pid, *all_descendants(proc.pid)]  # the launcher, torchrun and its workers
    out, err = ctrl_c(proc, 2)
    if proc.returncode == -signal.SIGINT and nproc == 1:
        # The first one's save finished and the trainer's process was in the interpreter's last
        # teardown, where Python gives SIGINT its default action back (after every atexit
        # callback): killed by it (a shell says 130), nothing left to save, no line, no traceback.
        assert "checkpoint saved" in out, out[-2000:] + err[-3000:]
        # after the run's last line (its losses): a kill before it is not the teardown's (review R21a 4)
        assert re.search(r"over steps? \d|\(logged, of steps \d", out.splitlines()[-1]), out[-2000:]
        for noise in NOISE:
            assert noise not in err, err
        assert not err.strip(), err
    else:
        assert proc.returncode == 130, out[-2000:] + err[-3000:]
        line = the_one_line(err)
        assert line == (
            "second Ctrl-C (SIGINT): stopping now without saving; resume from the newest complete "
            "checkpoint with --resume auto"
        )
    # The first one's save is cut short, or, where it finished first (a tiny model saves in a few
    # milliseconds), the second meets the exit: 130 and the line all the same (it met an atexit
    # callback: a traceback, exit 0), or, in the interpreter's teardown, the default action; never
    # a third outcome.
    assert "stopping after step" not in out or "checkpoint saved" in out
    deadline = time.time() + 3
    while [p for p in processes if alive(p)] and time.time() < deadline:
        time.sleep(0.05)
    assert not [p for p in processes if alive(p)], "a process outlived the second Ctrl-C"


@pytest.mark.parametrize("nproc", [1, 2])
def test_one_ctrl_c_saves_and_exits_0(dataset, tmp_path, light, nproc):
    """With 1 process the trainer itself finishes the step, saves and exits 0. With 2, Ctrl-C reaches
    the (light) workers through the launcher (torchrun, in a group of its own, does not see it and
    so does not end with its SignalException traceback and exit 1)."""
    run = tmp_path / "run"
    long = ["schedule.steps=400", "run.log_every=1", *(["parallel.shard=2"] if nproc == 2 else [])]
    proc = launch(nproc, sets(dataset, run, *long), start_new_session=True, env=light if nproc == 2 else ENV)
    wait_for_step(proc, 2)
    out, err = ctrl_c(proc, 1)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    for noise in NOISE:
        assert noise not in err, err
    stopped = [line for line in out.splitlines() if line.startswith("stopping after step ")]
    assert len(stopped) == 1 and stopped[0].endswith("on SIGINT: checkpoint saved; resume with --resume auto")
    if nproc == 1:  # the real trainer's save (light workers write nothing)
        step = int(stopped[0].split()[3])
        assert (checkpoint_dir(run, step) / COMPLETE_FILE).is_file()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def all_descendants(pid: int) -> list[int]:
    try:
        children = child_pids(pid)
    except OSError:
        return []
    return children + [d for c in children for d in all_descendants(c)]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_before_the_workers_start_stops_the_agent(tmp_path, sig):
    """The agent passes SIGTERM and SIGINT to its workers; one that arrives before there are any (a
    Slurm cancel or a Ctrl-C during rendezvous) is torchrun's to handle, as before: the run stops,
    128 + the signal, no worker ever started (it was dropped, and the job trained on)."""
    worker = tmp_path / "worker.py"
    worker.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    code = (
        "import os, signal, sys\nimport torch.distributed.run as tr\nfrom training.launch import agent_main\n"
        f"real = tr.run\ndef run(args):\n    os.kill(os.getpid(), signal.{sig})\n    return real(args)\n"
        f"tr.run = run\nsys.exit(agent_main(['--standalone', '--nproc_per_node=1', {str(worker)!r}]))\n"
    )
    done = run_code(tmp_path, code)
    assert done.returncode == 128 + getattr(signal, sig), done.stderr[-2000:]
    assert not (tmp_path / "ran").exists()


def test_a_failed_store_request_is_one_line_and_none_once_the_agent_is_gone(capfd, monkeypatch):
    """The stop's watcher, its store failing: the warning carried torch's ~25 lines of C++ frames, and
    when the agent that hosts the store had been SIGKILLed it described nothing that happened (the
    watchdog ends the worker a moment later: trial RV55b 2)."""
    from training.contract.lifetime import AGENT_PID_VAR
    from training.run.shutdown import GracefulStop

    error = RuntimeError(
        "recvValueWithTimeout failed\nException raised from recvValue at x.cpp:1\nframe #0: f"
    )
    alive = subprocess.Popen(["sleep", "30"])
    try:
        monkeypatch.setenv(AGENT_PID_VAR, str(alive.pid))
        GracefulStop(0, 1)._store_failed(error)
        err = capfd.readouterr().err
        assert err == (
            "warning: rank 0: the job's store did not answer the stop's watcher (recvValueWithTimeout "
            "failed); a stop that reaches one rank alone may wait for the next step\n"
        ), err
        alive.kill()
        alive.wait()  # the agent gone
        GracefulStop(0, 1)._store_failed(error)
        assert capfd.readouterr().err == ""
    finally:
        alive.kill()


def test_a_signal_within_the_handling_of_another_never_hangs_the_rank():
    """A job's SIGTERM reaches a torchrun worker up to three times within milliseconds (the scheduler's
    and the relays of the launcher and of torchrun's agent). Python runs the second handler on the same
    thread inside the first: STOP_FETCHING was a threading.Event, whose set() waited forever for the
    lock the first handler held, and the rank hung mid-step, its stop never saved (CI's every-process
    SIGTERM test: 1 run in ~17 under load). A second SIGTERM at each line of a first one's handling,
    and at each line of a wait for data, in a forked probe (tests/helpers/signal_reentry.py)."""
    probe = [sys.executable, "-m", "tests.helpers.signal_reentry"]
    done = forked.run(probe, cwd=ROOT, env=ENV, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    handled, waited = map(int, re.findall(r"(\d+) (?:lines|of)", done.stdout))
    assert handled > 10 and waited >= 4, done.stdout  # the rounds reached the handler's lines and the wait's


def test_a_stop_flag_s_stale_wake_is_no_wake():
    """STOP_FETCHING's pipe holding a byte with the flag unset (a set() that raced a clear()): every
    wait returned at once, and a fetch's backoff retried with none (review RV57c 2). The byte is
    drained and the wait waits; a wait without a timeout ends at the flag's set."""
    from training.contract.object_store import _StopFlag

    flag = _StopFlag()
    os.write(flag._pipe[1], b"\0")
    for _ in range(2):
        t0 = time.monotonic()
        assert flag.wait(0.3) is False and time.monotonic() - t0 >= 0.25
    threading.Timer(0.1, flag.set).start()
    assert flag.wait(None) is True


@pytest.mark.parametrize("server", ["libuv", "legacy"])
def test_a_stop_reaches_the_other_rank_and_the_stop_s_threads_end_with_the_loop(tmp_path, server):
    """Each rank of a distributed run waits in the job's c10d store for another's stop: one request for
    the run (a check four times a second was ~40k requests a second at 10k ranks: review RV46a F5). A
    signalled rank posts its stop, which wakes the others; the loop's end releases every rank's wait
    without touching a posted stop. A thread left blocked in the wait as the interpreter exits aborts
    the process (SIGABRT, exit 134, after a complete run) if the store's server goes meanwhile (5 of 5
    times with the server in the same process); compare_set released none on TCPStore's older server
    (USE_LIBUV=0: review RV47a F2). One rank's loop ending while another's goes on is no stop; a signal
    that comes while the rank's main thread is blocked in a collective is heard through the wakeup fd;
    a second one left its byte in the pipe, and the poster spun a core to the loop's end (RV47b F1).
    Rank 0 hosts the store (a tcp:// init, not torchrun's agent); both ranks are forked probes
    (tests/helpers/stop_release.py)."""
    port = str(free_port())
    module = [sys.executable, "-m", "tests.helpers.stop_release"]
    env = {**ENV, "USE_LIBUV": "1" if server == "libuv" else "0"}
    host = forked.popen([*module, "0", port], cwd=ROOT, env=env)
    other = forked.run([*module, "1", port], cwd=ROOT, env=env, capture_output=True, timeout=120)
    _, err = host.communicate(timeout=120)
    assert (host.returncode, other.returncode) == (0, 0), err[-2000:] + other.stderr[-2000:]
    assert "stop's watcher" not in err + other.stderr, err + other.stderr  # no failed request said


@pytest.mark.parametrize("ending", ["complete", "error"])
def test_a_store_silent_across_the_loop_s_end_leaves_no_thread_in_it_as_the_interpreter_finalizes(ending):
    """A store that stops answering as the loop ends (a stall over the loop's 2 s join) leaves the
    stop's waiter in its C++ wait; its answer, or its server's end, reaching that thread while the
    interpreter finalizes aborted the process (SIGABRT, exit 134) after a complete run (review RV47b F2:
    6 of 6 trials). The process's exit now shuts down that request's connection (not the default
    group's client's), so the thread returns, quietly (torch's C++ stack of the failed request is not
    shown), with the store still silent, and stderr and SIGINT are as they were after. A SIGTERM during
    the stop's own exit, which such a store makes seconds long, is one after a complete loop: one
    note, the after-loop handlers (RV47b F4, RV48a M3); after a loop that failed, the loop's handler's
    still, not SIGTERM's default action, which killed the rank with its error unsaid (RV48b M1). The
    rank is a fresh interpreter (a forked child skips atexit and finalization:
    tests/helpers/stop_stall.py)."""
    port = str(free_port())
    module = [sys.executable, "-m", "tests.helpers.stop_stall"]
    server = forked.popen([*module, "serve", port], cwd=ROOT, env=ENV)
    try:
        rank = subprocess.run(
            [*module, "rank", port, str(server.pid), ending], cwd=ROOT, env=ENV, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
    finally:
        server.kill()
    out, err = rank.stdout, rank.stderr
    assert out.endswith("loop ended\n"), out + err[-3000:]
    assert "left: gristmill-stop-wait" in out, out  # the stall left it, as this test needs
    assert rank.returncode == 0, err[-3000:]
    noises = ("terminate called", "Exception raised from", "recvValueWithTimeout", "Traceback", "shut down")
    for noise in noises:
        assert noise not in err, err[-3000:]
    assert "at finalization: SIGINT default_int_handler" in err, err  # and the line came out: fd 2 back
    note = "note: SIGTERM after the last step: the run finishes its records"
    if ending == "complete":
        assert "handlers after the loop: SIGINT _after_loop, SIGTERM _after_loop" in out, out
        assert err.count(note) == 1, err
    else:
        assert "loop error: the loop's error" in out, out
        assert "handlers after the loop: SIGINT default_int_handler, SIGTERM 0" in out, out
        assert note not in err, err
