"""`gristmill train` command lines and the Slurm script's torchrun rendezvous."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from training.launch import torchrun_command

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "configs/slurm/train.sbatch"


def test_torchrun_command_passes_config_and_overrides():
    cmd = torchrun_command("configs/train/demo.toml", ["parallel.shard=2", "optim.lr=1e-4"], 2)
    assert cmd == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "training.train", "--config", "configs/train/demo.toml",
        "--set", "parallel.shard=2", "optim.lr=1e-4",
    ]  # fmt: skip
    assert "--set" not in torchrun_command("c.toml", [], 4)


def test_sbatch_syntax_and_header():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert "#SBATCH --ntasks-per-node=1" in text  # one torchrun per node


def test_sbatch_renders_the_multi_node_torchrun(tmp_path):
    """Run the script as Slurm would, with scontrol and srun replaced by recorders."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu017\\ngpu018\\n"\n'
    )
    (bin_dir / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/srun.args\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu[017-018]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "CONFIG": "configs/train/llama3-7b-hsdp.toml",
        "PYTHON": ".venv/bin/python",
    }
    out = subprocess.run(
        ["bash", str(SBATCH), "--set", "parallel.replicate=2"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "2 node(s) x 8 GPU(s), rendezvous gpu017:29500, job 4242" in out.stdout
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args == [
        "--kill-on-bad-exit=1", ".venv/bin/python", "-m", "training.launch", "torchrun",
        "--nnodes=2", "--nproc_per_node=8", "--rdzv_id=4242", "--rdzv_backend=c10d",
        "--rdzv_endpoint=gpu017:29500",
        "-m", "training.train", "--config", "configs/train/llama3-7b-hsdp.toml",
        "--set", "parallel.replicate=2",
    ], shlex.join(args)  # fmt: skip
    # a recipe with [eval] interval > 0 needs the trainer that runs lm-eval (review R14b M2)
    env["TRAINER"] = "validation.train_eval"
    subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, check=True)
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[-4:] == ["-m", "validation.train_eval", "--config", "configs/train/llama3-7b-hsdp.toml"], args


def test_sbatch_without_slurm_variables_fails_loudly(tmp_path):
    out = subprocess.run(
        ["bash", str(SBATCH)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert out.returncode != 0 and "SLURM_JOB_NODELIST" in out.stderr


def test_the_nproc_help_says_when_one_process_still_goes_through_torchrun(capsys):
    """`[eval] interval > 0` makes even one process start torchrun (validation.train_eval); the
    help of --nproc-per-node says so instead of '1 runs in this process'."""
    import pytest

    from pipelines.cli import main as gristmill

    with pytest.raises(SystemExit):
        gristmill(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1 runs in this process (through torchrun when eval.interval > 0: " in text, text


def test_the_launcher_checks_without_importing_the_trainer():
    """`gristmill train --nproc-per-node N` runs preflight before torchrun starts; importing the
    trainer there (its model, FSDP, DCP, optimizers) would cost every launch about 2 s first."""
    heavy = ["training.train", "training.run.setup", "training.parallelize", "training.optim",
             "torch.distributed.checkpoint", "torch.distributed.fsdp"]  # fmt: skip
    code = (
        "import sys, training.launch, training.run.preflight, training.run.shutdown\n"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_launchers_child_dies_with_a_launcher_killed_as_it_started_the_child(tmp_path):
    """torchrun gets SIGKILL at the launcher's death (PR_SET_PDEATHSIG), asked for in the child after
    the fork: a launcher killed before that (an OOM kill as torchrun started) never sent it, and
    torchrun and its workers trained on with no launcher. The child's start is held here until its
    parent is dead and reaped; it must end instead of running its command."""
    import signal
    import threading
    import time

    from training.launch import child_pids

    gate = tmp_path / "parent-killed"
    script = (
        "import functools, os, signal, subprocess, sys, time\n"
        "from training.contract.lifetime import signal_at_parent_death\n"
        "def late(forked_by):\n"
        "    deadline = time.time() + 60  # bounded: a child of a failed test is no leftover\n"
        f"    while not os.path.exists({str(gate)!r}) and time.time() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    signal_at_parent_death(forked_by, signal.SIGKILL)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
        "                 preexec_fn=functools.partial(late, os.getpid()))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    stuck = threading.Timer(60, parent.kill)  # a child never forked ends the wait below
    stuck.start()
    children: list[int] = []
    try:
        while not children and parent.poll() is None:
            children = child_pids(parent.pid)
            time.sleep(0.01)
    finally:
        stuck.cancel()
        parent.kill()
        parent.wait()  # reaped: its child is the reaper's now
        gate.touch()

    def alive(pid: int) -> bool:  # a zombie is dead: its reaper may take its time
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False

    try:
        assert len(children) == 1, children
        deadline = time.time() + 4.0
        while alive(children[0]) and time.time() < deadline:
            time.sleep(0.05)
        assert not alive(children[0]), "the child outlived its parent, killed as it started the child"
    finally:
        for child in children:  # a leftover of this test (it failed)
            if alive(child):
                os.kill(child, signal.SIGKILL)


def test_a_torchrun_worker_whose_agent_died_during_its_imports_ends_at_once(tmp_path):
    """A worker's watchdog starts once its imports are done. One whose agent (the launcher's torchrun)
    was SIGKILLed during them watched its parent, by then the reaper, and trained on, waiting on the
    dead agent's store until torch's timeout (review RV34f M1). It watches the agent by the pid the
    agent gave it (shutdown.exit_with_agent): it must end at once, before its next line."""
    import signal
    import time

    pid_file, gate, ran_on = tmp_path / "worker.pid", tmp_path / "agent-killed", tmp_path / "ran-on"
    worker = tmp_path / "worker.py"
    worker.write_text(
        "import os, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "deadline = time.time() + 60  # its imports, held until the agent is dead (bounded)\n"
        f"while not os.path.exists({str(gate)!r}) and time.time() < deadline:\n"
        "    time.sleep(0.01)\n"
        "from training.run.shutdown import exit_with_agent\n"
        "exit_with_agent()\n"
        "time.sleep(1)\n"
        f"open({str(ran_on)!r}, 'w').close()\n"
    )
    code = (
        "import sys\nfrom training.launch import agent_main\n"
        f"sys.exit(agent_main(['--standalone', '--nproc_per_node=1', {str(worker)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not pid_file.exists() and agent.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert pid_file.exists(), "the worker never started"
    finally:
        agent.kill()
        agent.wait()  # reaped: its pid names no process now
        gate.touch()
    time.sleep(0.1)  # the pid file is written before its text
    pid = int(pid_file.read_text())

    def alive() -> bool:  # a zombie is dead: its reaper may take its time
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.time() + 30  # the worker's imports (torch) take a few seconds on a loaded machine
    while alive() and not ran_on.exists() and time.time() < deadline:
        time.sleep(0.05)
    try:
        assert not ran_on.exists(), "the worker ran on after its agent's death"
        assert not alive(), "the worker outlived its agent"
    finally:
        if alive():
            os.kill(pid, signal.SIGKILL)


def test_the_agent_s_rendezvous_event_names_are_torch_s_own(monkeypatch):
    """The agent names torch's rendezvous events from the caller's frame, not inspect.stack() (~0.5 CPU s
    a launch): the names are torch's own at every depth, past the stack's end included."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from training.launch import _cheap_event_names

    own = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", own)  # restored after the test
    _cheap_event_names()
    cheap = dynamic_rendezvous.get_method_name
    assert cheap is not own

    class Handler:  # as torch calls it: f"{self.__class__.__name__}.{get_method_name()}" in _record
        def _record(self, name):
            return name()

        def next_rendezvous(self, name):
            return self._record(name)

    assert Handler().next_rendezvous(cheap) == Handler().next_rendezvous(own) == "next_rendezvous"
    for depth in (0, 1, 2, 3, 10_000):
        assert cheap(depth) == own(depth), depth


def test_a_rendezvous_store_lost_mid_run_is_one_line():
    """Trial RV67c F2: the node hosting the job's rendezvous store killed, the other node's agent ended
    in ~90 lines of torch's C++ frames and a Python traceback through agent_main, its workers' own line
    above them. torch's RendezvousConnectionError, as the agent's watch raises it (wrapped or not), is
    one line with the way on; other errors are not taken for it."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from training.launch import rendezvous_lost

    lost = RendezvousConnectionError("The connection to the C10d store has failed. See inner exception.")
    try:
        try:
            raise lost
        except RendezvousConnectionError as inner:
            raise RuntimeError("agent failed") from inner
    except RuntimeError as outer:
        wrapping = outer
    for error in (lost, wrapping):
        said = rendezvous_lost(error)
        assert said is not None and said.startswith("this node lost the job's rendezvous store"), said
        assert said.endswith("start the job again with --resume auto"), said
    assert rendezvous_lost(RuntimeError("Connection closed by peer")) is None
