"""Held-out validation (training/run/validation.py): the held-out batches are the same whatever
data.seed, so runs of other seeds (a seed sweep, `mix propose`'s proxies and its validation runs)
are scored on the same windows."""

from __future__ import annotations

import torch

from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import TINY, overrides
from training.config import load_train_config
from training.data.loader import batch_sha256
from training.data.recipe import open_plan
from training.data.spec import batch_shapes, check_config
from training.run.validation import Validation


def held_out_batches(dataset, run, seed: int) -> list[str]:
    cfg = load_train_config(TINY, overrides(dataset, run, "run.val_every=4", f"data.seed={seed}"))
    spec = check_config(cfg, 1)
    plan, _, _ = open_plan(cfg, spec)
    validation = Validation(
        cfg, spec, batch_shapes(cfg, spec, 1), plan, last_step=12, vocab_size=256, device=torch.device("cpu"),
        world_size=1, settings={},
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
