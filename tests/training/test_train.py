"""The trainer end to end on CPU: artifacts, learning, FSDP/HSDP equivalence, early config errors."""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_batches_as_inspected,
    read_metrics,
    recipe,
    recorded_batches,
    torchrun_cmd,
)
from tests.helpers.train_runs import RECIPE_STEPS as STEPS
from training.config import TrainConfig
from training.contract.config_loader import load_config, to_dict
from training.contract.run_layout import COMPLETE_FILE, checkpoint_dir, config_history
from training.train import load_train_config, main, train

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

FIELDS = {
    "step",
    "loss",
    "lr",
    "grad_norm",
    "update_ratio",
    "tokens_per_s",
    "tokens_seen",
    "batch_sha256",
    "peak_memory_bytes",
}


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset()


@pytest.fixture(scope="module")
def single_run(dataset, shared):
    """`gristmill train` of the tiny recipe in this process (the reference for the distributed runs),
    trained once per test run (read-only); (run dir, its overrides)."""

    def train_here(overrides: list[str], _) -> None:
        assert gristmill(["train", "--config", TINY, "--set", *overrides]) == 0

    run_dir = shared.run("1-process", lambda run: recipe(dataset, run), train_here)
    return run_dir, recipe(dataset, run_dir)


def test_end_to_end_artifacts_and_learning(single_run, capfd):
    run_dir, overrides = single_run
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert FIELDS <= r.keys(), r
        assert "mfu" not in r  # CPU: no known peak, so no MFU rather than a guess
        assert r["tokens_per_s"] > 0 and r["peak_memory_bytes"] > 0 and r["grad_norm"] > 0
        assert 0 < r["update_ratio"] < 1
    assert [r["step"] for r in rows if "val_loss" in r] == [10, 20, 30]
    # Learning: the synthetic streams are nearly deterministic bigrams, far below ln(256) = 5.55.
    assert rows[0]["loss"] == pytest.approx(5.55, abs=0.1)
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.5
    assert rows[-1]["val_loss"] < rows[0]["loss"] - 1.5
    # Schedule: linear warmup over 5 steps, cosine to min_lr at the last step.
    cfg = load_train_config(TINY, overrides)
    assert rows[0]["lr"] == pytest.approx(cfg.optim.lr / cfg.schedule.warmup_steps)
    assert rows[cfg.schedule.warmup_steps - 1]["lr"] == pytest.approx(cfg.optim.lr)
    assert rows[-1]["lr"] == pytest.approx(cfg.optim.min_lr)

    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    png = (run_dir / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 300 and height >= 200 and len(png) > 5000
    saved = load_config(TrainConfig, run_dir / "config.toml")
    assert to_dict(saved) == to_dict(cfg)


def test_every_step_records_the_batch_inspect_prints(single_run):
    """Issue 47: each row's batch_sha256 and RUN/batches.bin's record of every step (one per step,
    not only the logged ones) are the digests `gristmill data inspect RUN --hash` prints; verify
    checks them and says nothing."""
    run_dir, _ = single_run
    planned = assert_batches_as_inspected(run_dir)
    assert recorded_batches(run_dir) == [(s, 1, planned[s]) for s in range(1, STEPS + 1)]
    assert len(set(planned.values())) == STEPS
    assert not (run_dir / "batches-discarded.bin").exists()


def test_checkpointable_state_is_grouped_and_stateful(dataset, tmp_path):
    cfg = load_train_config(
        TINY, recipe(dataset, tmp_path / "run", "run.max_steps=2", "metrics.tensorboard=false")
    )
    summary = train(cfg)
    states = summary["states"]
    assert list(states) == ["model", "optimizer", "lr_scheduler", "dataloader", "train_state", "timeline"]
    assert states["timeline"].state_dict() == {"skips": "[]"}  # no rewind
    assert states["train_state"].state_dict()["step"] == 2
    assert states["lr_scheduler"].state_dict()["last_step"] == 2
    assert states["dataloader"].state_dict()["step"] == 2  # the one-source plan's state
    assert json.loads(states["dataloader"].state_dict()["data_plan"])["sources"][0]["name"] == "data"
    model_sd = states["model"].state_dict()
    assert "tok_embeddings.weight" in model_sd
    optim_sd = states["optimizer"].state_dict()
    assert int(optim_sd["state"]["tok_embeddings.weight"]["step"]) == 2  # keyed by FQN, not position
    states["train_state"].load_state_dict({**states["train_state"].state_dict(), "step": 7})
    assert states["train_state"].step == 7


def test_a_loader_that_fails_to_end_after_the_last_step_is_a_warning(dataset, tmp_path, monkeypatch, capsys):
    """The loop ends its loader's iterator itself, inside the stop's handling (training/train.py
    _end_loader), where the garbage collector ended it after the run before: a failure there (a worker
    gone as it was being shut down) would have turned a complete run into an error. It is a warning;
    the run's steps and checkpoint stand."""

    def fails(items) -> None:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr("training.data.loader._end_workers", fails)
    run_dir = tmp_path / "run"
    summary = train(
        load_train_config(
            TINY, recipe(dataset, run_dir, "run.max_steps=2", "checkpoint.interval=2", "run.val_every=0")
        )
    )
    assert summary["steps"] == 2 and (checkpoint_dir(run_dir, 2) / COMPLETE_FILE).is_file()
    assert (
        "warning: the data loader did not end cleanly: [Errno 3] No such process" in capsys.readouterr().out
    )


def test_trains_on_a_dataset_from_the_real_build(built_dataset, tmp_path):
    """The shared `gristmill data build` fixture (real tokenizer, 512 ids): the model takes the
    dataset's vocabulary, and a few steps already lower the loss from ln(512)."""
    run_dir = tmp_path / "run"
    cfg = load_train_config(
        TINY,
        [
            f"data.dataset={json.dumps(str(built_dataset))}",
            f"run.output_dir={json.dumps(str(run_dir))}",
            "run.max_steps=12",
            "data.check_separators=true",
            "run.threads=1",
            "checkpoint.interval=0",
            "metrics.tensorboard=false",
            "metrics.plot=false",
        ],
    )
    summary = train(cfg)
    assert summary["states"]["model"].model.cfg.vocab_size == 512
    assert summary["first_loss"] == pytest.approx(math.log(512), abs=0.3)
    assert summary["final_loss"] < summary["first_loss"] - 0.5


def torchrun(overrides: list[str], nproc: int = 2) -> subprocess.CompletedProcess:
    return forked.run(torchrun_cmd(overrides, nproc), cwd=ROOT, env=ENV, timeout=240)


@pytest.mark.parametrize(
    "mesh",
    [["parallel.shard=2"], ["parallel.replicate=2", "parallel.shard=1"]],
    ids=["fsdp-2", "hsdp-2x1"],
)
def test_distributed_matches_single_process(single_run, dataset, tmp_path, mesh):
    """2 ranks (FSDP, then HSDP) through the real trainer under torchrun: the same losses, gradient
    norms, update ratios and validation loss as one process on the same global batches.

    Tolerance 1e-5 (fp32 parameters): the runs differ only in summation order (per-rank partial
    means and the gradient reduce-scatter/all-reduce), which moves the loss by ~5e-7."""
    ref_dir, _ = single_run
    run_dir = tmp_path / "run"
    proc = torchrun(recipe(dataset, run_dir, "run.max_steps=10", "metrics.tensorboard=false", *mesh))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 ranks × 4 micro × 2 accumulation" in proc.stdout
    ref, got = read_metrics(ref_dir)[:10], read_metrics(run_dir)
    assert [r["step"] for r in got] == list(range(1, 11))
    for a, b in zip(ref, got):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5), (a["step"], a["loss"], b["loss"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4, abs=1e-6)
        assert b["update_ratio"] == pytest.approx(a["update_ratio"], rel=1e-4)
        assert b["lr"] == a["lr"]
    assert got[-1]["val_loss"] == pytest.approx(ref[-1]["val_loss"], abs=1e-5)
    # Each rank hashed its own rows; the global digests are one process's (issue 47).
    assert [r["batch_sha256"] for r in got] == [r["batch_sha256"] for r in ref]
    assert recorded_batches(run_dir) == recorded_batches(ref_dir)[:10]


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1e-3", r"unknown key 'optim.lrr'; did you mean 'optim.lr'"),
        (
            "data.global_batch_tokens=1000",
            r"global_batch_tokens = 1000 is not a multiple of data.seq_len = 64",
        ),
        (
            "data.micro_batch=5",
            r"global batch of 16 sequences .* not divisible by 1 data-parallel rank\(s\) × "
            r"data.micro_batch 5 = 5",
        ),
        ("model.vocab_size=300", r"vocab_size 300 \(preset 'tiny'\) differs from the dataset's 256"),
        ("data.seq_len=512 data.micro_batch=1", r"data.seq_len = 512 exceeds the model's max_seq_len = 256"),
        (
            "parallel.shard=2",  # the fix as `gristmill train` takes it (review R14b L6)
            r"needs that many ranks, but this is a single process; start 2 ranks \(on one node `gristmill "
            r"train … --nproc-per-node 2`; over several, configs/slurm/train.sbatch",
        ),
        ("optim.name=adamw8bit", r"'adamw8bit' needs a CUDA GPU"),
        ("schedule.warmup_steps=100", r"warmup_steps ≤ schedule.steps; got steps 40, warmup_steps 100"),
        ("run.threads=-3", r"run.threads \(-3\) must be ≥ 0"),
        ("data.num_workers=-1", r"data.num_workers \(-1\) .* must be ≥ 0"),
        # the interval's own check, not a rewind's "saves none" (trial RV63a); one key, the --set that gave
        # it (a line of two keys and values, one the default, named neither: trial RV78a 3)
        (
            "run.on_nonfinite=rewind checkpoint.interval=-5",
            r"checkpoint.interval = -5 must be ≥ 0 \(save every N steps; 0: .*\) "
            r"\(--set checkpoint.interval=-5\)$",
        ),
        (
            "checkpoint.keep_last=-1",
            r"^error: checkpoint.keep_last = -1 must be ≥ 0 \(.*\) \(--set checkpoint",
        ),
        (
            "run.spike_window=1",
            r"^error: run.spike_window = 1 must be ≥ 2 \(.*\) \(--set run.spike_window=1\)$",
        ),
        ("run.max_skipped=0", r"^error: run.max_skipped = 0 must be ≥ 1 \(consecutive non-finite"),
        ("run.val_every=-1", r"^error: run.val_every = -1 must be ≥ 0 \(.*\) \(--set run.val_every=-1\)$"),
    ],
)
def test_bad_config_fails_before_any_work(dataset, tmp_path, capsys, override, message):
    run_dir = tmp_path / "run"
    args = ["--config", TINY, "--set", f"data.dataset={json.dumps(str(dataset))}"]
    args += [f"run.output_dir={json.dumps(str(run_dir))}"]
    assert main([*args, *override.split()]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert not run_dir.exists()  # nothing was written: the model was never built


def test_launcher_checks_batch_arithmetic_for_its_world_size(dataset, tmp_path, capsys):
    """`gristmill train --nproc-per-node 3`: 16 sequences do not split over 3 ranks × 4 (no torchrun)."""
    run_dir = tmp_path / "run"
    args = ["train", "--config", TINY, "--nproc-per-node", "3"]
    args += [
        "--set",
        f"data.dataset={json.dumps(str(dataset))}",
        f"run.output_dir={json.dumps(str(run_dir))}",
    ]
    assert gristmill(args) == 2
    captured = capsys.readouterr()
    assert "not divisible by 3 data-parallel rank(s) × data.micro_batch 4 = 12" in captured.err
    assert "torch.distributed.run" not in captured.out and not run_dir.exists()


def test_launcher_checks_the_mesh_for_its_world_size(dataset, tmp_path, capsys):
    """`gristmill train --nproc-per-node 2 --set parallel.replicate=3`: refused before torchrun starts."""
    run_dir = tmp_path / "run"
    args = ["train", "--config", TINY, "--nproc-per-node", "2", "--set"]
    args += [f"data.dataset={json.dumps(str(dataset))}", f"run.output_dir={json.dumps(str(run_dir))}"]
    assert gristmill([*args, "parallel.replicate=3", "data.micro_batch=1"]) == 2
    captured = capsys.readouterr()
    assert "world size 2 is not divisible by parallel.replicate=3" in captured.err
    assert "torch.distributed.run" not in captured.out and not run_dir.exists()


def test_a_resume_keeps_the_past_lr_and_applies_other_optimizer_changes(dataset, tmp_path, capsys):
    """A one-dataset recipe resumes by the plan's rules, as a phased one does: a changed cosine
    budget or peak would rewrite the LR of steps already trained, so it is refused naming the key;
    the other optimizer settings are this config's from the next step on, and said."""
    from training.contract.errors import GristmillError
    from training.train import with_resume

    run = tmp_path / "run"
    base = recipe(dataset, run, "schedule.warmup_steps=2", "schedule.steps=8", "run.val_every=0",
                  "run.log_every=1", "metrics.tensorboard=false", "metrics.plot=false",
                  "checkpoint.interval=4")  # fmt: skip
    train(load_train_config(TINY, [*base, "run.max_steps=4"]))
    for changed, step, key in (
        ("schedule.steps=12", 3, "schedule.steps 8 → 12"),
        ("optim.lr=0.002", 1, "optim.lr"),
    ):
        with pytest.raises(GristmillError, match=f"step {step}: .* already trained: {key}[ ;]"):
            train(load_train_config(TINY, with_resume([*base, changed], "auto")))
    capsys.readouterr()
    train(load_train_config(TINY, with_resume([*base, "optim.weight_decay=0.05"], "auto")))
    out = capsys.readouterr().out
    assert "note: changed since" in out and "optim.weight_decay 0.1 → 0.05" in out, out
    assert "in effect from step 5" in out, out
    lr, min_lr = load_train_config(TINY, base).optim.lr, load_train_config(TINY, base).optim.min_lr
    rows = {r["step"]: r["lr"] for r in read_metrics(run)}
    want = [lr * s / 2 if s <= 2 else min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (s - 2) / 6))
            for s in range(1, 9)]  # fmt: skip
    assert [rows[s] for s in range(1, 9)] == pytest.approx(want, rel=1e-12)
    assert load_train_config(str(run / "config.toml"), []).optim.weight_decay == 0.05  # and it says so
    # What steps 1–4 trained with outlives the checkpoints that named it (review R25b 3); the refused
    # resumes left none; one that trains nothing adds its own from its next step, no step under it
    assert decays(run) == {1: 0.1, 5: 0.05}, decays(run)
    assert config_history(run)[5].read_text() == (run / "config.toml").read_text()
    train(load_train_config(TINY, with_resume([*base, "optim.weight_decay=0.05"], "auto")))  # the same
    train(load_train_config(TINY, with_resume([*base, "optim.weight_decay=0.01"], "auto")))
    assert decays(run) == {1: 0.1, 5: 0.05, 9: 0.01}, decays(run)
    shutil.rmtree(run / "checkpoints")  # started over: the earlier run's history is not the new one's
    train(load_train_config(TINY, [*base, "run.max_steps=1", "optim.weight_decay=0.2"]))
    assert decays(run) == {1: 0.2}, decays(run)


def decays(run: Path) -> dict[int, float]:
    """{first step: optim.weight_decay} of the run's configs/from-step-N.toml."""
    return {step: load_train_config(str(p), []).optim.weight_decay for step, p in config_history(run).items()}


def test_optimizer_state_keeps_this_configs_hyperparameters(tmp_path):
    """The checkpoint brings the moments and step counts; betas, eps and weight decay stay the
    config's (they used to come back from the checkpoint's param groups)."""
    import torch

    from training.checkpoint.state import OptimizerState
    from training.config import OptimSection
    from training.model import ModelConfig, Transformer
    from training.optim import build_optimizer

    torch.manual_seed(0)
    shape = dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, vocab_size=64, max_seq_len=16)
    model = Transformer(ModelConfig(**shape))
    old = build_optimizer(model, OptimSection(betas=[0.9, 0.95], weight_decay=0.1, eps=1e-8), "cpu")
    model(torch.randint(0, 64, (2, 8)), labels=torch.randint(0, 64, (2, 8))).backward()
    old.step()
    saved = OptimizerState(model, old).state_dict()
    new = build_optimizer(model, OptimSection(betas=[0.5, 0.6], weight_decay=0.0, eps=1e-6), "cpu")
    OptimizerState(model, new).load_state_dict(saved)
    assert [g["betas"] for g in new.param_groups] == [(0.5, 0.6)] * len(new.param_groups)
    assert {g["weight_decay"] for g in new.param_groups} == {0.0} and new.param_groups[0]["eps"] == 1e-6
    p = next(model.parameters())
    assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])  # the moments came back


def test_the_header_says_where_run_max_steps_stops(dataset, tmp_path, capsys):
    """`run.max_steps=2` of an 8-step plan: the header says the plan's 8 steps and the stop at 2,
    not only '8 steps'."""
    sets = recipe(dataset, tmp_path / "run", "schedule.steps=8", "schedule.warmup_steps=2", "run.max_steps=2",
                  "run.val_every=0", "metrics.tensorboard=false", "metrics.plot=false")  # fmt: skip
    train(load_train_config(TINY, sets))
    out = capsys.readouterr().out.splitlines()
    run_line = next(line for line in out if line.startswith("  run "))
    assert run_line.endswith("8 steps in 1 phase, stopping at step 2 (run.max_steps) (plan below)"), run_line
    # recipe()'s checkpoint.interval = 0 saves nothing at that stop: said before step 1, not found at the
    # resume ("starts over from step 0")
    warning = "warning: run.max_steps = 2 stops before the plan's last step (8) and checkpoint.interval = 0 "
    assert sum(line.startswith(warning) for line in out) == 1, out
    assert not (tmp_path / "run" / "checkpoints").exists()
    # Issue 37 item 19: each step's line says where the invocation is (step N/its last step) and, before
    # the last, when it ends at this invocation's pace so far (the row's eta_s).
    lines = [line for line in out if line.startswith("step ")]
    rows = read_metrics(tmp_path / "run")
    assert lines[0].startswith("step      1/2 | ") and lines[1].startswith("step      2/2 | "), lines
    assert rows[0]["eta_s"] == pytest.approx(rows[0]["elapsed_s"]) and rows[1]["eta_s"] == 0
    assert lines[0].endswith(f" | eta {round(rows[0]['eta_s'])}s") and " eta " not in lines[1], lines
    # saves on a grid also save at run.max_steps (CheckpointSection.saves): nothing to warn of
    saved = tmp_path / "saved"
    train(
        load_train_config(TINY, [*sets, f"run.output_dir={json.dumps(str(saved))}", "checkpoint.interval=4"])
    )
    assert not any(line.startswith("warning: run.max_steps") for line in capsys.readouterr().out.splitlines())
    assert (checkpoint_dir(saved, 2) / COMPLETE_FILE).is_file()
