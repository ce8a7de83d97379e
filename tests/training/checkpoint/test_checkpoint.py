"""Checkpoints on CPU with real DCP under torchrun (2 processes, gloo): exact resume after kill -9
and SIGTERM, resharding 2 ranks → 1, async saves and their failures, full disks, retention,
exports, and loading that never unpickles arbitrary objects.

Kept to four 2-process launches (reference, killed, resumed, SIGTERM+resume share them) and a few
in-process runs of the tiny model."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.mounts import unshare_works
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_same_checkpoint,
    fake_checkpoint,
    losses,
    metrics,
    one_error_line,
    overrides,
    recorded_batches,
    run_torchrun,
    torchrun_cmd,
    wait_for_step,
)
from tests.helpers.train_runs import SHORT_STEPS as STEPS
from training.checkpoint.checkpointer import complete_steps, dir_size, find_resume, prune
from training.checkpoint.hf_export import load_checkpoint_model
from training.checkpoint.io import checkpoint_keys
from training.checkpoint.record import CheckpointError
from training.config import TrainConfig
from training.contract.config_loader import ConfigError, load_config, to_toml
from training.contract.run_layout import COMPLETE_FILE, DCP_METADATA, checkpoint_dir, export_dir
from training.launch import AGENT_COMMAND, child_pids, torchrun_command
from training.train import load_train_config, main, train, with_resume

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset(n_docs=300)


@pytest.fixture(scope="module")
def reference(dataset, shared) -> Path:
    """An uninterrupted 2-rank run: checkpoints every 4 steps (keep 2), an export at step 8. Trained
    once per test run (read-only: copy it to write into it)."""
    return shared.run(
        "torchrun-2",
        lambda run_dir: overrides(
            dataset, run_dir, "parallel.shard=2", "checkpoint.keep_last=2", "checkpoint.export_interval=8"
        ),
        lambda sets, _: run_torchrun(sets).stdout,
    )


def test_kill9_then_resume_is_bit_identical_and_reshards_to_one_rank(reference, dataset, tmp_path):
    assert [r[0] for r in losses(reference)] == list(range(1, STEPS + 1))
    assert complete_steps(reference) == [8, 12]  # keep_last=2 pruned step 4

    # kill -9 of `gristmill train --nproc-per-node 2`'s process group (what a scheduler or the OOM
    # killer does) at a random step after the first checkpoint. torchrun starts the workers in
    # sessions of their own: they must die with it, not train on. Saves every 2 steps, keep_last=1,
    # so the kill often lands in a save or a prune: a complete checkpoint must survive.
    run_dir = tmp_path / "killed"
    sets = overrides(dataset, run_dir, "parallel.shard=2", "checkpoint.interval=2", "checkpoint.keep_last=1")
    kill_at = random.randint(3, STEPS - 3)
    launcher = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--nproc-per-node", "2"]
    proc = forked.popen([*launcher, "--set", *sets], cwd=ROOT, env=ENV, stderr=subprocess.STDOUT,
                        start_new_session=True)  # fmt: skip
    try:
        wait_for_step(proc, run_dir, kill_at)
        workers = [w for t in child_pids(proc.pid) for w in child_pids(t)]  # launcher → torchrun → 2
        assert len(workers) == 2, workers
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 3.0  # ~0.1 s when the machine is idle; a loaded CI box is slower
    while [w for w in workers if alive(w)] and time.time() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if alive(w)], "training workers outlived their killed launcher"
    killed_at = metrics(run_dir)[-1]["step"]
    assert killed_at < STEPS, "the run finished before it was killed"
    assert complete_steps(run_dir), f"no complete checkpoint after kill -9 at step {killed_at}"

    proc = run_torchrun([*sets, "parallel.shard=2", 'checkpoint.resume="auto"'])
    assert "resuming from" in proc.stdout and "the newest complete checkpoint" in proc.stdout
    # Losses, gradient norms, learning rates and token counts: bit-identical to the uninterrupted run.
    assert losses(run_dir) == losses(reference), f"killed at step {killed_at}"
    assert_same_checkpoint(run_dir, reference, STEPS)

    # 2 ranks -> 1 rank from the reference's step-8 checkpoint: the same batches, so the same
    # losses up to summation order (1 process sums the 16 sequences differently from 2 ranks).
    one = tmp_path / "one-rank"
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(reference, 8)))}"
    summary = train(load_train_config(TINY, overrides(dataset, one, resume)))
    assert summary["steps"] == STEPS
    ref = {r["step"]: r for r in metrics(reference)}
    got = metrics(one)
    assert [r["step"] for r in got] == list(range(9, STEPS + 1))
    for r in got:
        assert r["loss"] == pytest.approx(ref[r["step"]]["loss"], abs=1e-5)
        assert (r["lr"], r["tokens_seen"]) == (ref[r["step"]]["lr"], ref[r["step"]]["tokens_seen"])


def test_a_worker_killed_mid_step_is_one_line_not_the_survivors_tracebacks(dataset, tmp_path):
    """kill -9 of one worker mid-step: the survivor's collective fails ("Connection reset by peer")
    and each survivor printed a 70-line traceback above the launcher's line naming the kill (review
    R23c 6). One line each now; the status is still the kill's."""
    run_dir = tmp_path / "run"
    sets = overrides(dataset, run_dir, "parallel.shard=2", "schedule.steps=400", "run.log_every=1",
                     "checkpoint.interval=400")  # fmt: skip
    proc = forked_agent(sets)
    killed, _, err = kill_one_at_step_3(proc, run_dir, child_pids, 1)  # torchrun → 2
    assert proc.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert f"rank 1 (pid {killed}) was killed by SIGKILL" in err, err
    assert "Traceback" not in err, err[-3000:]
    survivor = [line for line in err.splitlines() if line.startswith("error: rank 0 stops:")]
    assert all(line.endswith("(another process of the job is gone)") and "[" not in line.split(":")[1]
               for line in survivor), survivor  # fmt: skip


def test_sigterm_saves_exits_0_and_resume_continues_exactly(reference, dataset, tmp_path):
    """Async saves on their own gloo group; SIGTERM to one rank only (both must stop together). A
    save every 2 steps: the resumed run makes at least two async saves of sharded DTensor state
    (staged into host DTensors, the second into the first one's buffers), and its step-12 one must
    hold the reference's weights."""
    run_dir = tmp_path / "run"
    sets = overrides(dataset, run_dir, "parallel.shard=2", "checkpoint.async=true", "checkpoint.keep_last=1",
                     "checkpoint.interval=2")  # fmt: skip
    stop_at = random.randint(2, STEPS - 3)
    proc = forked.popen(torchrun_cmd(sets), cwd=ROOT, env=ENV, stderr=subprocess.STDOUT)
    wait_for_step(proc, run_dir, stop_at)
    os.kill(child_pids(proc.pid)[-1], signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    stopped = metrics(run_dir)[-1]["step"]
    assert stopped < STEPS and f"stopping after step {stopped} on SIGTERM" in out
    assert complete_steps(run_dir)[-1] == stopped

    run_torchrun([*sets, 'checkpoint.resume="auto"'])
    assert losses(run_dir) == losses(reference), f"stopped at step {stopped}"
    assert_same_checkpoint(run_dir, reference, STEPS)


@pytest.mark.parametrize("to", ["the launcher", "every process", "the agent twice"])
def test_sigterm_to_the_launcher_reaches_the_workers_who_save(dataset, tmp_path, to):
    """A scheduler's SIGTERM to `gristmill train --nproc-per-node 2` (the launcher, not a worker):
    passed on to torchrun, relayed to the workers, which finish the step, save and exit 0 — not
    killed with their launcher. To every process of the job (Slurm's cancel or time limit), after a
    closed terminal's SIGHUP: the SIGHUP changes nothing (it killed the launcher, and so the run,
    nothing saved), and torchrun's agent passes the SIGTERM on rather than stopping the workers
    itself (SIGKILL 30 s later, and exit 143 after a clean save). Twice to the agent within a moment
    (a scheduler's signal sent twice): the same stop, not the hung worker's escape that ended a clean
    save 143 with a traceback (trial RV58a F2)."""
    run_dir = tmp_path / "run"
    launcher = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--nproc-per-node", "2"]
    sets = overrides(dataset, run_dir, "parallel.shard=2", "schedule.steps=200", "checkpoint.interval=100")
    proc = forked.popen([*launcher, "--set", *sets], cwd=ROOT, env=ENV, stderr=subprocess.STDOUT)
    wait_for_step(proc, run_dir, 2)
    job = [proc.pid]
    if to == "the agent twice":
        job = child_pids(proc.pid)[:1] * 2  # torchrun's agent, the launcher's one child
    if to == "every process":
        job += descendants(proc.pid)  # the launcher, torchrun's agent, its workers
        for pid in job:
            os.kill(pid, signal.SIGHUP)
        wait_for_step(proc, run_dir, metrics(run_dir)[-1]["step"] + 2)  # trains on
    for pid in job:
        os.kill(pid, signal.SIGTERM)
        time.sleep(0.05)  # two to one process: each its own (sent at once, the kernel keeps one)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    stopped = metrics(run_dir)[-1]["step"]
    assert f"stopping after step {stopped} on SIGTERM" in out and complete_steps(run_dir) == [stopped]


def test_sigterm_to_the_whole_job_with_loader_workers_saves_and_exits_0(dataset, tmp_path):
    """Slurm's preemption and scancel signal every process of the job, the DataLoader workers too:
    torch's handler let a worker die by it, and the trainer raised mid-step ("DataLoader worker …
    is killed by signal: Terminated"), rc 1, the steps since the last checkpoint lost. A worker
    leaves SIGTERM to its trainer, which saves and exits 0."""
    run_dir = tmp_path / "run"
    sets = overrides(dataset, run_dir, "data.num_workers=2", "schedule.steps=200", "checkpoint.interval=100")
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_step(proc, run_dir, 3)
    workers = descendants(proc.pid)
    assert len(workers) >= 2, workers
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    stopped = metrics(run_dir)[-1]["step"]
    assert f"stopping after step {stopped} on SIGTERM" in out and complete_steps(run_dir) == [stopped]


def test_sigterm_to_the_loader_workers_first_then_the_trainer_saves_and_resumes_exactly(dataset, tmp_path):
    """A job-wide SIGTERM reaches each process in its own time: here every process the trainer
    started first, its trainer 0.5 s later, with Python's start method set to forkserver (3.14's
    default on Linux). The workers were forked by that forkserver, a process of the job that the
    signal killed; they followed their parent ("DataLoader worker (pid(s) …) exited unexpectedly",
    rc 1, nothing saved; under load also when all were signalled at once). The workers are the
    trainer's own children: it saves its last step, exits 0, and the resume trains what an
    uninterrupted run trains, batch for batch."""
    run_dir, reference = tmp_path / "run", tmp_path / "uninterrupted"
    job = ("data.num_workers=2", "schedule.steps=200", "checkpoint.interval=100")
    sets = overrides(dataset, run_dir, *job)
    cmd = [sys.executable, "-m", "tests.helpers.forkserver_trainer", "--config", TINY, "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_step(proc, run_dir, 3)
        started = descendants(proc.pid)
        assert len(started) >= 2, started
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        # a worker whose parent died kills itself within 0.05 s, and the trainer meets its death at the
        # next fetch (a step's micro-batches drain the prefetch); a longer wait is only more steps
        # for the uninterrupted run below to train again (CI time)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    stopped = metrics(run_dir)[-1]["step"]
    assert f"stopping after step {stopped} on SIGTERM" in out and complete_steps(run_dir) == [stopped]

    end = f"run.max_steps={stopped + 2}"
    assert main(["--config", TINY, "--set", *sets, 'checkpoint.resume="auto"', end]) == 0
    assert main(["--config", TINY, "--set", *overrides(dataset, reference, *job), end]) == 0
    assert losses(run_dir) == losses(reference)
    assert [e[::2] for e in recorded_batches(run_dir)] == [e[::2] for e in recorded_batches(reference)]
    assert_same_checkpoint(run_dir, reference, stopped + 2)


def test_a_loader_worker_killed_costs_no_training_its_last_step_saved_and_resumed_exactly(dataset, tmp_path):
    """A data.num_workers process SIGKILLed (the out-of-memory killer): torch's SIGCHLD handler raised
    in the main thread wherever it was (a backward, an optimizer step), so nothing could be saved and
    the steps since the last checkpoint were lost. The death is found at the next fetch, between two
    steps: the last trained step is saved, the run stops in one line with the shell's 137, and the
    resume reads again the batches the dead worker had prefetched: the uninterrupted run's losses.
    Under `gristmill train`, which trains one process itself: its exit status and line are the CLI's
    (under torchrun, training.train's: test_a_loader_worker_killed_under_torchrun_every_rank_saves)."""
    run_dir, reference = tmp_path / "run", tmp_path / "uninterrupted"
    job = ("data.num_workers=2", "schedule.steps=200", "checkpoint.interval=100", "run.threads=1")
    sets = overrides(dataset, run_dir, *job)
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, start_new_session=True)
    killed, out, err = kill_one_at_step_3(proc, run_dir, descendants, 0)  # the trainer's 2 workers
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:] + err[-3000:]
    line = one_error_line(err)
    saved = complete_steps(run_dir)
    assert len(saved) == 1 and saved[0] >= 3, (saved, out[-2000:])
    assert line.startswith(f"error: DataLoader worker (pid {killed}) is killed by signal: Killed"), line
    assert f"; step {saved[0]} was saved: --resume auto continues from it" in line, line
    assert metrics(run_dir)[-1]["step"] == saved[0]  # the last step trained is the one saved

    end = f"run.max_steps={saved[0] + 2}"
    assert main(["--config", TINY, "--set", *sets, 'checkpoint.resume="auto"', end]) == 0
    assert main(["--config", TINY, "--set", *overrides(dataset, reference, *job), end]) == 0
    assert losses(run_dir) == losses(reference)
    assert [e[::2] for e in recorded_batches(run_dir)] == [e[::2] for e in recorded_batches(reference)]
    assert_same_checkpoint(run_dir, reference, saved[0] + 2)


def test_a_loader_worker_killed_under_torchrun_every_rank_saves(dataset, tmp_path):
    """Two ranks reading local data, one rank's DataLoader worker SIGKILLed: that rank stopped alone,
    its error ending the job with nothing saved (only a run reading a bucket had the ranks agree at
    each fetch). Every rank agrees now: both save the last trained step, and the one line, rank 0's,
    names the worker (with its rank when it was rank 1's) and the step saved; the status is 137."""
    run_dir = tmp_path / "run"
    sets = overrides(dataset, run_dir, "parallel.shard=2", "data.num_workers=1", "schedule.steps=400",
                     "checkpoint.interval=400")  # fmt: skip
    proc = forked_agent(sets)

    def loader_workers(_) -> list[int]:  # the ranks, forked by the worker server → 1 worker each
        return [w for r in child_pids(forked.worker_server_pid()) for w in child_pids(r)]

    killed, out, err = kill_one_at_step_3(proc, run_dir, loader_workers, 1)
    assert proc.returncode == 128 + signal.SIGKILL, out[-2000:] + err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    saved = complete_steps(run_dir)
    assert len(saved) == 1 and saved[0] == metrics(run_dir)[-1]["step"], (saved, out[-2000:])
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    said = re.fullmatch(
        rf"error: (rank 1: )?DataLoader worker \(pid {killed}\) is killed by signal: Killed.*", errors[0]
    )
    assert said and f"; step {saved[0]} was saved: --resume auto continues from it" in errors[0], errors[0]


def forked_agent(sets: list[str]) -> forked.Forked:
    """The agent `gristmill train --nproc-per-node 2` starts (`python -m training.launch torchrun
    ARGS`: the command's status and lines), forked (torch.distributed.run preloaded), in a session
    of its own: for what the ranks do and say. How a launcher and its agent (a fresh Python) start and
    die is the kill -9 and SIGTERM-to-the-launcher tests'."""
    cmd = [sys.executable, "-m", "training.launch", AGENT_COMMAND, *torchrun_command(TINY, sets, 2)[3:]]
    return forked.popen(cmd, cwd=ROOT, env=ENV, start_new_session=True)


def kill_one_at_step_3(proc, run_dir: Path, processes, which: int) -> tuple[int, str, str]:
    """SIGKILL of `processes(proc.pid)[which]` (one of two) once `proc` logged step 3, then its end:
    (the pid killed, stdout, stderr); its process group SIGKILLed after, whatever happened."""
    try:
        wait_for_step(proc, run_dir, 3)
        pids = processes(proc.pid)
        assert len(pids) == 2, pids
        os.kill(pids[which], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return pids[which], out, err


def descendants(pid: int) -> list[int]:
    children = child_pids(pid)
    return children + [d for c in children for d in descendants(c)]


def test_export_matches_the_trained_model(reference, tmp_path):
    tr = pytest.importorskip("transformers")
    reference = shutil.copytree(reference, tmp_path / "run")  # the export below writes into it
    out = export_dir(reference, 8)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    model, _, _ = load_checkpoint_model(reference, 8)
    hf = tr.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    x = torch.randint(0, model.cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (model.eval()(x) - hf(x).logits).abs().max().item()
    assert diff < 1e-4, f"max abs logit difference {diff}"
    assert not checkpoint_dir(reference, 4).exists() and out.is_dir()  # exports outlive retention
    # `gristmill export RUN --step N` of any complete checkpoint; an incomplete one is refused
    assert gristmill(["export", str(reference), "--step", "12"]) == 0
    assert (export_dir(reference, 12) / "model.safetensors").is_file()
    assert gristmill(["export", str(reference), "--step", "4"]) == 2


def test_failed_async_save_stops_the_run_at_the_next_step(dataset, tmp_path, capsys):
    run_dir = tmp_path / "run"
    sets = overrides(dataset, run_dir, "checkpoint.interval=2", "checkpoint.async=true", "run.max_steps=8")
    checkpoint_dir(run_dir, 4).parent.mkdir(parents=True)
    checkpoint_dir(run_dir, 4).write_text("in the way")  # DCP cannot make its directory
    assert main(["--config", TINY, "--set", *sets]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint of step 4 could not be written to {checkpoint_dir(run_dir, 4)}" in err
    assert f"Last complete checkpoint: {checkpoint_dir(run_dir, 2)}" in err
    assert metrics(run_dir)[-1]["step"] <= 5  # the step after the failed save, at the latest
    assert complete_steps(run_dir) == [2]


def test_async_saves_in_a_row_resume_bit_identically(dataset, tmp_path):
    """Four async saves in one process (steps 2, 4, 6, 8: the second and later reuse the staging
    buffers, where DCP's own reused stager failed on torch 2.11); resuming from step 4 repeats
    steps 5-8 exactly, so step 4's checkpoint holds step 4's state, not a later one. The metrics
    row of a save's step (the save comes before the row) carries what it cost the loop."""
    a, b = tmp_path / "a", tmp_path / "b"
    sets = ["checkpoint.async=true", "checkpoint.interval=2", "checkpoint.keep_last=0", "run.max_steps=8"]
    train(load_train_config(TINY, overrides(dataset, a, *sets)))
    assert complete_steps(a) == [2, 4, 6, 8]
    rows = {r["step"]: r for r in metrics(a)}
    timed = {s for s, r in rows.items() if "checkpoint_wait_s" in r and "checkpoint_stage_s" in r}
    assert timed == {2, 4, 6, 8} and rows[2]["checkpoint_stage_s"] >= 0

    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(a, 4)))}"
    train(load_train_config(TINY, overrides(dataset, b, *sets, resume)))
    assert losses(b) == [r for r in losses(a) if r[0] > 4]
    assert_same_checkpoint(a, b, 8)


def test_async_staging_copies_and_refuses_changed_shapes(tmp_path):
    """The staged copy is the state at save time (training may change the weights at once), and a
    state whose shapes changed since the first save is refused in one line naming the tensor."""
    from training.checkpoint.checkpointer import Checkpointer
    from training.checkpoint.io import load
    from training.checkpoint.state import ModelState
    from training.config import CheckpointSection

    model = torch.nn.Linear(4, 3)
    cfg = CheckpointSection(interval=1, async_=True, keep_last=0)
    ckpt = Checkpointer(cfg, tmp_path, {"model": ModelState(model)}, rank=0, world_size=1, last_step=10,
                        config_sha256="t", estimate_bytes=0)  # fmt: skip
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt.save(1, 0)
    with torch.no_grad():
        model.weight.add_(1.0)  # while the write may still run
    ckpt.save(2, 0)  # the same buffers, now holding the changed weights
    model.weight = torch.nn.Parameter(torch.zeros(5, 4))
    refusal = r"refusing to save step 3: model\.weight is \(5, 4\) float32 on this rank now but was \(3, 4\)"
    with pytest.raises(CheckpointError, match=refusal + r" float32 at the run's first save"):
        ckpt.save(3, 0)
    ckpt.close()
    for step, expect in ((1, saved), (2, {"weight": saved["weight"] + 1.0, "bias": saved["bias"]})):
        fresh = torch.nn.Linear(4, 3)
        load({"model": ModelState(fresh)}, checkpoint_dir(tmp_path, step), no_dist=True)
        for name, value in fresh.state_dict().items():
            assert torch.equal(value, expect[name]), (step, name)


def test_a_save_waiting_for_the_previous_write_reports_it_and_advises_once(tmp_path):
    """Saves back to back (the interval far shorter than a 64 MiB write): each waits for the write
    before it, says how long in its timings, and the run is told once to raise the interval."""
    from training.checkpoint.checkpointer import Checkpointer
    from training.checkpoint.state import ModelState
    from training.config import CheckpointSection
    from training.console import console

    out = io.StringIO()
    cfg, states = (
        CheckpointSection(interval=5, async_=True, keep_last=0),
        {"model": ModelState(torch.nn.Linear(2048, 8192))},
    )
    with console.bound(0, out):  # the run's one printer, here into `out`
        ckpt = Checkpointer(cfg, tmp_path, states, rank=0, world_size=1, last_step=99, config_sha256="t",
                            estimate_bytes=0)  # fmt: skip
        timings = []
        for step in (5, 10, 15):
            ckpt.save(step, 0)
            timings.append(ckpt.take_timings())
        ckpt.close()
    lines = out.getvalue().splitlines()
    assert timings[0]["checkpoint_wait_s"] < 0.1 and timings[1]["checkpoint_wait_s"] > 0
    assert all(t["checkpoint_stage_s"] > 0 for t in timings) and ckpt.take_timings() == {}
    notes = [line for line in lines if line.startswith("note:")]
    assert len(notes) == 1 and "but the interval is 5 steps" in notes[0], lines
    assert notes[0].endswith("raise checkpoint.interval") and complete_steps(tmp_path) == [5, 10, 15]


def test_a_full_disk_under_the_run_s_records_is_one_line(dataset, tmp_path):
    """The run directory on a tmpfs that fills as metrics.jsonl, consumption.parquet and batches.bin
    grow: a pyarrow or json traceback, exit 1 (review R18d 2a). One line naming the file, exit 2; the
    save of the last step tried first fails on the same disk, and says so (review R26a F4)."""
    if not unshare_works():
        pytest.skip("no mount namespaces here (unshare -rm)")
    run_dir = tmp_path / "full"
    run_dir.mkdir()
    sets = overrides(dataset, run_dir, "checkpoint.interval=0", "schedule.steps=400", "run.log_every=1",
                     "metrics.plot=false", 'metrics.trackers=[]')  # fmt: skip
    # 44k: the files a run writes before step 1 take ~36k of it, each step ~0.5k more: full at ~step 17
    # (56k trained 43 steps, 96k ~120, to the same end: consumption.parquet cannot be written); in a
    # mount namespace of its own (tests/helpers/mounts.py)
    mount = f"mount -t tmpfs -o size=44k tmpfs {run_dir}"
    cmd = [sys.executable, "-m", "tests.helpers.mounts", mount, "", "training.train", "--config", TINY]
    proc = forked.run([*cmd, "--set", *sets], env=ENV, cwd=ROOT, timeout=300, stderr=subprocess.STDOUT)
    out = proc.stdout
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and errors[-1].startswith(f"error: cannot write {run_dir}"), out[-3000:]
    assert "No space left on device" in errors[-1], errors
    assert errors[0].startswith("error: only ") and "free on the filesystem of" in errors[0], errors
    assert "a record of the run cannot be written: saving step" in out, out[-3000:]


def test_a_checkpoint_past_the_file_size_limit_says_file_too_large(dataset, tmp_path):
    """A trainer under `ulimit -f` (smaller than a checkpoint's file): the save failed with torch's
    "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598" (review
    R26a F4). It says "File too large", the limit and the fix."""
    limit = 512 << 10  # the tiny model's checkpoint file is ~1.7 MiB; every other file far smaller
    sets = overrides(dataset, tmp_path / "run", "checkpoint.interval=2", "metrics.tensorboard=false")
    # the limit set by the forked process itself (tests/helpers/fsize_limited.py): no interpreter start
    limited = [sys.executable, "-m", "tests.helpers.fsize_limited", str(limit)]
    proc = forked.run(
        [*limited, "training.train", "--config", TINY, "--set", *sets], env=ENV, cwd=ROOT, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    assert line.startswith("error: checkpoint of step 2 could not be written to "), line
    assert "File too large: this process may write files of at most 512.00 KiB (`ulimit -f`)" in line, line


def test_full_disk_stops_the_run_and_keeps_the_last_checkpoint(reference, dataset, tmp_path):
    """RUN/checkpoints on a tmpfs that holds 1.5 checkpoints (a private mount namespace, no root
    needed): the disk guard stops the run at the second save; with the guard off the write itself
    fails with ENOSPC. Either way: a clear message, exit 2, the first checkpoint complete and
    resumable. Without mount namespaces, only the write-error half runs (a file in the way)."""
    size = int(dir_size(checkpoint_dir(reference, 8)) * 1.5) // 4096 * 4096 + 4096
    runs = {"guard": ["checkpoint.min_free_factor=1.0"], "enospc": ["checkpoint.min_free_factor=0.0"]}
    if not unshare_works():
        pytest.skip("no mount namespaces here (unshare -rm); the write-error path is also covered by "
                    "test_failed_async_save_stops_the_run_at_the_next_step")  # fmt: skip
    outputs = {}
    for name, extra in runs.items():  # each in a mount namespace of its own (tests/helpers/mounts.py)
        run_dir = tmp_path / name
        (run_dir / "checkpoints").mkdir(parents=True)
        sets = overrides(dataset, run_dir, "checkpoint.interval=2", "checkpoint.keep_last=1", *extra)
        mount = f"mount -t tmpfs -o size={size} tmpfs {run_dir}/checkpoints"
        copy_out = f"cp -a {run_dir}/checkpoints {run_dir}/saved"
        cmd = [sys.executable, "-m", "tests.helpers.mounts", mount, copy_out, "training.train"]
        outputs[name] = forked.run(
            [*cmd, "--config", TINY, "--set", *sets], env=ENV, cwd=ROOT, timeout=300, stderr=subprocess.STDOUT
        )
    for name, expect in (("guard", "free on the filesystem of"), ("enospc", "could not be written to")):
        out = outputs[name].stdout
        if name == "enospc":  # the cause a full disk gives, not torch's "unexpected pos …"
            assert "no space left on the filesystem of" in out
        run_dir = tmp_path / name
        assert outputs[name].returncode == 2, out[-3000:]
        assert expect in out and f"Last complete checkpoint: {checkpoint_dir(run_dir, 2)}" in out, out[-2000:]
        saved = run_dir / "saved" / "step-000002"
        assert (saved / COMPLETE_FILE).is_file() and (saved / DCP_METADATA).is_file()
    # resumable: continue the guard run from its saved checkpoint for two steps
    resume = f"checkpoint.resume={json.dumps(str(tmp_path / 'guard/saved/step-000002'))}"
    summary = train(
        load_train_config(TINY, overrides(dataset, tmp_path / "again", "run.max_steps=4", resume))
    )
    assert summary["steps"] == 4 and [r["step"] for r in metrics(tmp_path / "again")] == [3, 4]


def test_a_metrics_row_written_in_part_stops_the_run_and_the_resume_writes_it(dataset, tmp_path):
    """A nearly full disk writes part of a row and returns the count, no error: the row was printed
    and sent on as written, the next one's ENOSPC stopped the run, and the resume cut the torn row off
    (trial RV65c F1: its step's row lost, verify clean). Here metrics.jsonl lies on a tmpfs with one
    page free: the short write is a full disk's stop, the row kept for the resume, which writes it."""
    if not unshare_works():
        pytest.skip("no mount namespaces here (unshare -rm) for a tmpfs of one free page")
    run, small = tmp_path / "run", tmp_path / "small"
    run.mkdir()
    small.mkdir()
    sets = overrides(dataset, run, "schedule.steps=30", "checkpoint.interval=10")
    mount = (
        f"mount -t tmpfs -o size=12k tmpfs {small} && dd if=/dev/zero of={small}/fill bs=4k count=2 "
        f"2>/dev/null && ln -s {small}/metrics.jsonl {run}/metrics.jsonl"
    )
    copy_out = f"cp {small}/metrics.jsonl {tmp_path}/metrics.jsonl"
    cmd = [sys.executable, "-m", "tests.helpers.mounts", mount, copy_out, "training.train"]
    proc = forked.run([*cmd, "--config", TINY, "--set", *sets], env=ENV, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "metrics.jsonl: No space left on device" in proc.stderr, proc.stderr[-3000:]
    (run / "metrics.jsonl").unlink()  # the link into the tmpfs, gone with its namespace
    shutil.move(tmp_path / "metrics.jsonl", run / "metrics.jsonl")
    train(load_train_config(TINY, [*sets, "checkpoint.resume='auto'"]))
    assert [r["step"] for r in metrics(run)] == list(range(1, 31))


def test_a_record_rank_0_cannot_write_under_torchrun_ends_with_its_error_and_says_what_is_lost(
    dataset, tmp_path
):
    """Two processes, metrics.jsonl's disk full: a record is rank 0's alone, so the other rank cannot
    join a save and the steps since the last checkpoint are lost (docs/checkpoints.md). The run ended
    143 with "rank 0 … was killed by SIGTERM" under rank 0's own line (torchrun stopped it in its
    teardown after rank 1's collective failed of it), and nothing said the steps were lost (trial
    RV65f 2): now exit 2, rank 0's line, and which checkpoint a resume trains again from."""
    if not unshare_works():
        pytest.skip("no mount namespaces here (unshare -rm) for a tmpfs of one free page")
    run, small = tmp_path / "run", tmp_path / "small"
    run.mkdir()
    small.mkdir()
    sets = overrides(dataset, run, "checkpoint.interval=4")
    mount = (
        f"mount -t tmpfs -o size=12k tmpfs {small} && dd if=/dev/zero of={small}/fill bs=4k count=2 "
        f"2>/dev/null && ln -s {small}/metrics.jsonl {run}/metrics.jsonl"
    )
    cmd = [sys.executable, "-m", "tests.helpers.mounts", mount, "", "pipelines.cli", "train"]
    env = {**ENV, "PYTHON_EXEC": sys.executable}  # the workers in the namespace, where the tmpfs is
    argv = [*cmd, "--config", TINY, "--nproc-per-node", "2", "--set", *sets, "parallel.shard=2"]
    proc = forked.run(argv, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "metrics.jsonl: No space left on device" in proc.stderr, proc.stderr[-3000:]
    assert "killed by" not in proc.stderr, proc.stderr[-3000:]
    said = re.search(
        r"step (\d+) not saved \(a record is rank 0's alone: .*; --resume auto trains again (.*)", proc.stdout
    )
    assert said is not None, proc.stdout[-3000:]
    newest = complete_steps(run)
    assert said[2] == (f"from {checkpoint_dir(run, newest[-1])}" if newest else "from the start"), said[0]
    assert int(said[1]) > (newest[-1] if newest else 0)


# --- no training needed -----------------------------------------------------------------------


def test_retention_and_resume_choice(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 6):
        fake_checkpoint(run, step)
    fake_checkpoint(run, 1, complete=False)  # a leftover of a crash, older than complete ones
    fake_checkpoint(run, 8, complete=False)  # a save in flight (or killed): never touched
    fake_checkpoint(run, 10, metadata=False, complete=False)
    assert prune(run, keep_last=2, log=lambda *_: None, saved=6) == [1, 2]
    assert complete_steps(run) == [4, 6] and checkpoint_dir(run, 8).is_dir()
    path, notes = find_resume(run, "auto")
    assert path == checkpoint_dir(run, 6)
    assert "skipped step-000010: no .metadata" in notes[1] and "skipped step-000008: no COMPLETE" in notes[2]
    # keep_last=1 never deletes the newest complete checkpoint, even with newer incomplete ones
    prune(run, keep_last=1, log=lambda *_: None, saved=6)
    assert complete_steps(run) == [6]
    with pytest.raises(CheckpointError, match="not a complete checkpoint: no COMPLETE record"):
        find_resume(run, str(checkpoint_dir(run, 8)))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_loading_never_unpickles_arbitrary_objects(tmp_path):
    (tmp_path / DCP_METADATA).write_bytes(pickle.dumps(_Evil()))
    # one line naming the file (a CheckpointError since review RV60f 3), never the object loaded
    with pytest.raises(
        CheckpointError, match=r"\.metadata cannot be read \(UnpicklingError: refusing to load posix.system"
    ):
        checkpoint_keys(tmp_path)


def test_a_metadata_file_gone_under_a_load_is_one_line_without_torch_s_tracebacks(tmp_path, caplog):
    """Retention deleted a checkpoint `eval --watch` had checked, just before its load: torch logged two
    tracebacks ("Global metadata is not found. Falling back to rank local metadata.") on the terminal
    before gristmill's own line (trial RV61g F3)."""
    import torch.distributed.checkpoint as dcp

    from training.checkpoint.io import load_or_raise

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's single-process note
        dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path), no_dist=True)
    box = {"w": torch.zeros(3)}
    load_or_raise(box, tmp_path, CheckpointError, "load", no_dist=True)
    assert box["w"].tolist() == [1.0, 1.0, 1.0]  # the metadata read once serves dcp.load
    (tmp_path / DCP_METADATA).unlink()
    with caplog.at_level(logging.DEBUG), pytest.raises(CheckpointError) as e:
        load_or_raise(box, tmp_path, CheckpointError, "load", no_dist=True)
    assert str(e.value) == (
        f"cannot load {tmp_path}: FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{tmp_path / DCP_METADATA}'"
    )
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_resume_flag_reaches_torchrun():
    cmd = torchrun_command("c.toml", with_resume(["optim.lr=1e-4"], "auto"), 2)
    assert cmd[-3:] == ["--set", "optim.lr=1e-4", 'checkpoint.resume="auto"']


def test_checkpoint_config_keys():
    cfg = load_config(TrainConfig, None, ["checkpoint.async=true", "checkpoint.interval=5"])
    assert cfg.checkpoint.async_ is True and "async = true" in to_toml(cfg)
    with pytest.raises(
        ConfigError, match="export_interval = 7 must be a multiple of checkpoint.interval = 5"
    ):
        from training.data.spec import check_config

        check_config(
            load_config(TrainConfig, None, ["checkpoint.interval=5", "checkpoint.export_interval=7"]), 1
        )


def test_a_save_failed_by_a_rank_gone_is_not_a_storage_fault(tmp_path):
    """Trial RV67c F3: a rank killed mid-save failed the others' collective, and the survivor said
    "checkpoint of step 20 could not be written to …: RuntimeError: [...pair.cc:553] Connection closed
    by peer … Fix the cause", a storage fault. On a job of several ranks the transport's own error goes
    on, which train.main says as any rank gone; one process's write failures stay the checkpoint's."""
    from training.checkpoint.checkpointer import Checkpointer
    from training.checkpoint.state import ModelState
    from training.config import CheckpointSection

    gone = RuntimeError(
        "[/__w/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:58073. This"
    )
    cfg = CheckpointSection(interval=1, keep_last=0)
    for world, raised in ((2, RuntimeError), (1, CheckpointError)):
        ckpt = Checkpointer(cfg, tmp_path / str(world), {"model": ModelState(torch.nn.Linear(2, 2))}, rank=0,
                            world_size=world, last_step=4, config_sha256="t", estimate_bytes=0)  # fmt: skip
        with pytest.raises(raised) as e:
            ckpt._failed(3, gone)
        assert ("could not be written" in str(e.value)) is (world == 1), e.value
        ckpt.close()
