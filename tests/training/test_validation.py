"""Held-out validation (training/run/validation.py): the held-out batches are the same whatever
data.seed, so runs of other seeds (a seed sweep, `mix propose`'s proxies and its validation runs)
are scored on the same windows."""

from __future__ import annotations

import torch

from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import TINY, overrides, read_metrics
from training.config import load_train_config
from training.data.loader import batch_sha256
from training.data.recipe import open_plan
from training.data.spec import batch_shapes, check_config
from training.run.validation import Validation


def held_out_batches(dataset, run, seed: int, settings: dict | None = None) -> list[str]:
    cfg = load_train_config(TINY, overrides(dataset, run, "run.val_every=4", f"data.seed={seed}"))
    spec = check_config(cfg, 1)
    plan, _, _ = open_plan(cfg, spec)
    validation = Validation(
        cfg, spec, batch_shapes(cfg, spec, 1), plan, last_step=12, vocab_size=256, device=torch.device("cpu"),
        world_size=1, settings=settings or {},
    )  # fmt: skip
    ((_, loader, start),) = validation.loaders(0)
    loader.load_state_dict(start)
    it = iter(loader)
    return [batch_sha256(next(it)) for _ in range(cfg.run.val_batches)]


def test_the_held_out_batches_do_not_depend_on_the_data_seed(tmp_path):
    """Issue 47: with the data seed they were another subset of the held-out split per seed, and
    `mix propose` compared its validation runs' losses with the swarm's on other windows."""
    dataset = make_dataset(tmp_path / "data", n_docs=400)
    assert held_out_batches(dataset, tmp_path / "a", 1) == held_out_batches(dataset, tmp_path / "b", 2)


def test_validation_reads_its_batches_without_forking_workers(tmp_path, monkeypatch):
    """Each validation iterates its loaders anew: with data.num_workers, DataLoader workers were forked
    at every validation beside the training loader's threads, and one deadlocked now and then in
    CPython's after-fork (review R20a 1: a two-rank run hung at a validation step, no line, nothing
    saved). Validation reads in the trainer's process, whatever data.num_workers: the same batches."""
    import os

    dataset = make_dataset(tmp_path / "data", n_docs=400)
    want = held_out_batches(dataset, tmp_path / "a", 1)

    def no_fork():
        raise AssertionError("validation forked a process")

    monkeypatch.setattr(os, "fork", no_fork)
    assert held_out_batches(dataset, tmp_path / "b", 1, {"num_workers": 2}) == want


def test_held_out_data_that_cannot_be_read_costs_no_training(tmp_path, capsys):
    """Every held-out document damaged (its ids zeroed: separators only): the run's validation raised
    and the run ended, everything since its last checkpoint lost. Validation is a side activity: a
    warning at each of its steps, training to the end; each of those steps' rows says why it has no
    val_loss (`val_error`: a bucket down past data.fetch_timeout_s left nothing in the row, trial T38 M1)."""
    import numpy as np
    import pyarrow.parquet as pq

    from training.contract.heldout import heldout_rows
    from training.train import train

    dataset = make_dataset(tmp_path / "data", n_docs=400)
    rows = pq.read_table(dataset / "manifest" / "00000.parquet").to_pylist()
    held = np.flatnonzero(heldout_rows(np.arange(len(rows), dtype=np.uint64), 0.1))
    for r in held.tolist():
        with open(dataset / "shards" / rows[r]["shard"], "r+b") as f:
            f.seek(rows[r]["offset"])
            f.write(b"\x00" * rows[r]["nbytes"])
    run = tmp_path / "run"
    sets = ["run.val_every=4", "data.val_fraction=0.1", "checkpoint.interval=0"]
    train(load_train_config(TINY, overrides(dataset, run, *sets)))
    out = capsys.readouterr().out
    assert out.count("WARNING: validation of step") == 3, out[-2000:]
    assert "separator check failed at held-out batch 1 rank 0" in out, out[-2000:]
    assert [r["step"] for r in read_metrics(run) if "loss" in r][-1] == 12
    failed = {r["step"]: r.get("val_error", "") for r in read_metrics(run) if "val_loss" not in r}
    why = "separator check failed at held-out batch 1"
    assert [step for step, line in failed.items() if why in line] == [4, 8, 12], failed
