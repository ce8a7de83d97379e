"""Phased training over a mixture (training/data/plan.py): the plan's arithmetic, batches that do
not depend on ranks or workers, every token at most once across a seq_len switch (checked by an
independent decode), the resume rules, the supply check, kill -9 at the phase boundary, and the
plan, inspect and consumption outputs. Real datasets written by the build's own shard writer."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.mounts import unshare_works
from tests.helpers.phased_recipe import BATCH_SCHEDULE, GBT, recipe_toml, write_recipe
from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    assert_same_checkpoint,
    one_error_line,
    train_recipe,
    wait_for_step,
)
from training.config import TrainConfig
from training.contract.config_loader import ConfigError, load_config
from training.contract.dataset_format import DOCUMENTS_SUM, read_dataset_info, write_dataset_info
from training.contract.errors import GristmillError
from training.data import plan as data_plan
from training.data.loader import LoaderStateError, TokenLoader, batch_sha256, dataset_loader
from training.data.plan import LRPiece, Phase, Plan, PlanError, Source
from training.data.reader import DocumentTable
from training.data.recipe import open_plan
from training.data.spec import batch_shapes, check_config, resolve

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def cfg_of(sources, tmp_path, **kw) -> TrainConfig:
    return load_config(TrainConfig, write_recipe(tmp_path / "r.toml", sources, tmp_path / "run", **kw))


def loader_for(cfg: TrainConfig, rank: int = 0, world: int = 1, workers: int = 0) -> TokenLoader:
    plan, tables, _ = open_plan(cfg, resolve(cfg))
    return TokenLoader(
        plan,
        tables,
        micro_batch=tuple(ph.global_batch // world for ph in plan.phases),
        rank=rank,
        world_size=world,
        num_workers=workers,
        check_separators=True,
    )


def step_hashes(cfg: TrainConfig, world: int, workers: int = 0) -> list[str]:
    """sha256 of each global batch: the rank slices concatenated in rank order."""
    per_rank = []
    for rank in range(world):
        loader = loader_for(cfg, rank, world, workers)
        per_rank.append([b for _, b in zip(range(loader.plan.total_steps), loader)])
    return [batch_sha256([mb for rank in per_rank for mb in rank[s]]) for s in range(len(per_rank[0]))]


# -- the plan's arithmetic (no datasets) --


def test_shares_stay_within_one_window_and_never_decrease():
    plan = Plan(
        [Source(n, "", n, 10**9, 1) for n in "abc"],
        [Phase("p", 400, 64, 48, data_plan.integer_weights([0.8, 0.15, 0.05]))],
        seed=3,
    )
    w = np.array([0.8, 0.15, 0.05])
    prev = np.zeros(3, np.int64)
    for k in range(1, 401):
        cum = plan.cumulative(0, k)
        assert cum.sum() == 48 * k
        assert (np.abs(cum - 48 * k * w) < 1).all(), (k, cum)
        assert (cum >= prev).all()
        prev = cum
    assert data_plan.integer_weights([0.8, 0.15, 0.05]) == (16, 3, 1)
    two = [Source("a", "", "a", 10**9, 1), Source("b", "", "b", 10**9, 1)]
    # 0.4 windows per step: refused, with the weight to write in the mix's own units, the others' sum
    # ÷ 7 (it said "raise its weight to ≥ 0.125", the share, which a mix not summing to 1 refused
    # again: trial R30b F3); that weight is taken, a little less is not
    advice = r"raise its weight to at least the others' weights summed ÷ 7, or phase\[0\]\.global_batch"
    with pytest.raises(PlanError, match=r"gives source 'b' 0\.05 of its mix: 0\.4 windows .*" + advice):
        Plan(two, [Phase("p", 4, 64, 8, (19, 1))], 0)
    Plan(two, [Phase("p", 4, 64, 8, (21, 3))], 0)  # 21 ÷ 7 = 3: one window a step
    with pytest.raises(PlanError, match="fewer than one"):
        Plan(two, [Phase("p", 4, 64, 8, (22, 3))], 0)


def test_a_one_source_plan_is_the_single_dataset_order():
    """Window g of step s = epoch s // steps_per_epoch, window (s % spe)·G + g of that epoch."""
    tokens, seq, g = 100_003, 64, 16
    plan = Plan([Source("d", "", "f", tokens, 1, None)], [Phase("p", None, seq, g, (1,))], 5)
    spe = tokens // (seq + 1) // g
    for step in (0, 1, spe - 1, spe, spe + 1, 5 * spe + 3):
        labels, epochs, first = plan.step_windows(step)
        e, b = divmod(step, spe)
        assert (labels == 0).all() and (epochs == e).all()
        assert (first == (b * g + np.arange(g)) * (seq + 1)).all()


def warmup_cosine(step: int, warmup: int, total: int, peak: float, end: float) -> float:
    """The reference runs' schedule, written out independently: linear warmup reaching the peak at
    step warmup - 1, then a cosine from the peak to `end` at step total - 1 (0-based steps)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - max(warmup - 1, 0)) / (total - 1 - max(warmup - 1, 0)))
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


def test_the_lr_pieces_join_and_the_one_phase_case_is_warmup_cosine():
    one = Plan(
        [Source("d", "", "f", 10**9, 1)], [Phase("p", 100, 8, 8, (1,), LRPiece(3e-3, 3e-4, "cosine", 10))], 0
    )
    want = [warmup_cosine(s, 10, 100, 3e-3, 3e-4) for s in range(100)]
    assert [one.lr(s) for s in range(100)] == pytest.approx(want, rel=1e-12)
    assert one.lr(9) == 3e-3 and one.lr(99) == pytest.approx(3e-4) and one.lr(59) < one.lr(58)
    wsd = Plan(
        [Source("d", "", "f", 10**9, 1)],
        [
            Phase("stable", 50, 8, 8, (1,), LRPiece(1e-3, 1e-3, "constant", 5)),
            Phase("decay", 20, 8, 8, (1,), LRPiece(1e-3, 1e-4, "1-sqrt")),
        ],
        0,
    )
    assert wsd.lr(4) == 1e-3 and wsd.lr(49) == 1e-3 and wsd.lr(50) == 1e-3  # continuous
    assert wsd.lr(69) == pytest.approx(1e-4) and wsd.lr(60) < wsd.lr(55)


# -- batches over real datasets --


@pytest.mark.parametrize("phases", ["", BATCH_SCHEDULE], ids=["seq-len-switch", "batch-schedule"])
def test_mixture_batches_are_the_plan_for_any_ranks_and_workers_and_use_no_token_twice(
    sources, tmp_path, phases
):
    cfg = cfg_of(sources, tmp_path, phases=phases)
    reference = step_hashes(cfg, 1)
    assert len(reference) == 11 and len(set(reference)) == len(reference)
    assert step_hashes(cfg, 2, workers=2) == reference
    assert step_hashes(cfg, 4) == reference

    # An independent decode: every row of every step is the documents' own tokens at the pieces'
    # offsets, each source gets the plan's count, and no (source, document, token) comes twice.
    loader = loader_for(cfg)
    plan, tables = loader.plan, loader.builder.tables
    seen: set[tuple[int, int, int]] = set()
    for step, batch in zip(range(plan.total_steps), loader):
        p, k = plan.locate(step)
        window = plan.phases[p].seq_len + 1
        inputs = torch.cat([mb["input_ids"] for mb in batch]).numpy()
        labels = torch.cat([mb["labels"] for mb in batch]).numpy()
        rows = np.concatenate([inputs, labels[:, -1:]], axis=1)
        src, docs, starts, counts = loader.builder.segments(step)
        decoded = np.concatenate(
            [tables[i].document(int(d))[s : s + c] for i, d, s, c in zip(src, docs, starts, counts)]
        ).astype(np.int64)
        assert (decoded.reshape(-1, window) == rows).all()
        # Each row is one window of one source: the source of the piece holding its first token.
        row_src = src[np.searchsorted(np.cumsum(counts), np.arange(len(rows)) * window, side="right")]
        expected = plan.cumulative(p, k + 1) - plan.cumulative(p, k)
        assert np.bincount(row_src, minlength=3).tolist() == expected.tolist()
        for i, d, s, c in zip(src.tolist(), docs.tolist(), starts.tolist(), counts.tolist()):
            for t in range(s, s + c):
                assert (i, d, t) not in seen, (step, i, d, t)
                seen.add((i, d, t))
    used = {name: 0 for name in sources}
    for i, _, _ in seen:
        used[list(sources)[i]] += 1
    consumed = {r["source"]: 0 for r in plan.consumed(plan.total_steps)}
    for r in plan.consumed(plan.total_steps):
        consumed[r["source"]] += r["stream_tokens"]
    assert used == consumed


def test_the_single_dataset_loader_gives_mains_batches(tmp_path):
    """Hashes of 250–300 steps (several epochs) recorded with the loader of main before phases; those of
    a training split with held-out documents recorded again when the order's blocks became the build's
    samples (plan /2, 2026-11-29: the held-out split and val_fraction 0 kept theirs)."""
    from training.data import order as epoch_order

    ds = make_dataset(tmp_path / "ds")

    def mains_sha256(micro) -> str:
        """The batch hash these were recorded with (main's batch_sha256 then, before rows were hashed
        apart for the trainer's record): every row's input_ids, then labels, then position_ids."""
        h = hashlib.sha256()
        for key in ("input_ids", "labels", "position_ids"):
            h.update(torch.cat([mb[key] for mb in micro]).numpy().astype("<i8", copy=False).tobytes())
        return h.hexdigest()

    def digest(loader: TokenLoader, steps: int) -> str:
        h = hashlib.sha256()
        for _, b in zip(range(steps), loader):
            h.update(mains_sha256(b).encode())
        return h.hexdigest()

    common = dict(seq_len=64, global_batch=16, micro_batch=4, seed=1234)
    assert digest(dataset_loader(ds, **common), 300).startswith("c2fd03df33f708f7")
    assert digest(dataset_loader(ds, val_fraction=0.1, **common), 300).startswith("738f09ce5a00fcd9")
    assert digest(dataset_loader(ds, split="val", val_fraction=0.1, **common), 300).startswith(
        "c3e224a4dfaef504"
    )
    old = epoch_order.GROUP_BLOCKS
    epoch_order.GROUP_BLOCKS = 2  # many groups per epoch
    try:
        common = dict(seq_len=48, global_batch=8, micro_batch=2, seed=7, val_fraction=0.05, world_size=2)
        assert digest(dataset_loader(ds, rank=0, **common), 250).startswith("995ab8d1b8c7c9c6")
        assert digest(dataset_loader(ds, rank=1, **common), 250).startswith("6c27ac256b763e71")
    finally:
        epoch_order.GROUP_BLOCKS = old


# -- resume rules --


def test_resume_keeps_the_past_and_accepts_a_new_future(sources, tmp_path):
    cfg = cfg_of(sources, tmp_path)
    loader = loader_for(cfg)
    it = iter(loader)
    for _ in range(4):  # inside phase "main" (6 steps)
        next(it)
    state = loader.state_dict()

    def resume_with(**kw) -> TokenLoader:
        other = loader_for(cfg_of(sources, tmp_path / "x", **kw) if kw else cfg)
        other.load_state_dict(state)
        return other

    (tmp_path / "x").mkdir()
    text = recipe_toml(sources, tmp_path / "run")
    for old, new, field in [
        ("web = 0.6, code = 0.3", "web = 0.5, code = 0.4", "phase[0].mix"),  # the current mix
        ("steps = 6\nseq_len = 32", "steps = 6\nseq_len = 16", "phase[0].seq_len"),  # the current seq_len
        ("warmup_steps = 2", "warmup_steps = 3", "phase[0].lr.warmup_steps 2 → 3"),  # the LR so far
        # the shape alone: not also optim.min_lr, which the new shape's end reads (review RV50a F3)
        ('shape = "constant"', 'shape = "cosine"', "trained: phase[0].lr.shape constant → cosine; the"),
        ("seed = 7", "seed = 8", "data.seed"),
        ("val_fraction = 0.1", "val_fraction = 0.2", "val_fraction of source 'web'"),
    ]:
        assert old in text
        path = tmp_path / "x" / "changed.toml"
        path.write_text(text.replace(old, new))
        other = loader_for(load_config(TrainConfig, path))
        with pytest.raises(PlanError, match=field.replace("[", r"\[").replace("]", r"\]")):
            other.load_state_dict(state)

    # The current phase shortened to fewer steps than it has done: the advice said "longer than the 4
    # steps done", and exactly 4 is accepted (review R18b 3).
    for steps, refused in ((3, True), (4, False)):
        path.write_text(text.replace("steps = 6\nseq_len = 32", f"steps = {steps}\nseq_len = 32"))
        other = loader_for(load_config(TrainConfig, path))
        if refused:
            with pytest.raises(PlanError, match=r"keep phase 'main' at least 4 steps long \(the steps done"):
                other.load_state_dict(state)
        else:
            other.load_state_dict(state)

    swapped = loader_for(cfg_of({n: sources[n] for n in ("code", "web", "math")}, tmp_path / "x"))
    with pytest.raises(PlanError, match=r"the sources read so far \(in order\)"):
        swapped.load_state_dict(state)
    # a source read so far renamed: named as a name, not as a change of order (review RV50a F4)
    path.write_text(text.replace('name = "web"', 'name = "net"').replace("web = ", "net = "))
    with pytest.raises(PlanError, match=r"keep a \[\[data.sources\]\] entry named 'web'"):
        loader_for(load_config(TrainConfig, path)).load_state_dict(state)

    # The future may change: a longer phase "long" and a third phase appended.
    anneal = '[[phase]]\nname = "anneal"\nsteps = 3\nseq_len = 64\nmix = { math = 1.0 }\n'
    future = text.replace("to = 3e-4 }\n\n", "to = 3e-4 }\n\n" + anneal).replace("steps = 5", "steps = 7")
    path = tmp_path / "x" / "future.toml"
    path.write_text(future)
    longer = loader_for(load_config(TrainConfig, path))
    longer.load_state_dict(state)
    assert longer.resume_notes and "phase 'anneal' added: 3 steps" in longer.resume_notes[0]
    assert longer.step == 4
    # The batches of the past and of the unchanged present are the same under both plans.
    assert step_hashes(cfg, 1)[:6] == step_hashes(load_config(TrainConfig, path), 1)[:6]
    # Elastic: 2 ranks pick the single-rank state up.
    two = loader_for(cfg, rank=1, world=2)
    two.load_state_dict(state)
    assert two.step == 4


# -- supply --


def test_a_source_that_would_run_out_is_refused_unless_it_may_repeat(sources, tmp_path, capsys):
    small = {"web": sources["web"], "math": make_dataset(tmp_path / "math", n_docs=24, seed=4)}
    heavy = '[[phase]]\nname = "main"\nsteps = 24\nseq_len = 32\nmix = { web = 0.6, math = 0.4 }\n\n'
    config = write_recipe(tmp_path / "r.toml", small, tmp_path / "run", phases=heavy)
    cfg = load_config(TrainConfig, config)
    with pytest.raises(PlanError) as e:
        open_plan(cfg, resolve(cfg))
    msg = str(e.value)
    math_tokens = DocumentTable(small["math"], val_fraction=0.1).tokens
    asked = round(24 * 16 * 0.4) * 33  # 6–7 windows of 33 tokens per step, 6.4 on average
    assert "source 'math'" in msg and f"max_epochs = 1 epochs of its training split's {math_tokens:,}" in msg
    assert "set max_epochs = 2" in msg
    read = int(msg.split("asks ")[1].split(" tokens")[0].replace(",", ""))
    assert abs(read - asked) <= 33
    # its numbers add up: what it reads and the tail it drops at the epoch end pass the epoch (the
    # refusal said "plus the tails it drops" with no size, asking less than max_epochs hold: R25c 1)
    dropped = int(msg.split("drops ")[1].split(" more at its 1 epoch end ")[0].replace(",", ""))
    assert f": {read + dropped:,} tokens, past the {math_tokens:,} of max_epochs = 1" in msg, msg
    assert 0 < dropped < 7 * 33 and read + dropped > math_tokens
    # Refused before step 1: by the trainer too, with nothing written.
    assert gristmill(["train", "--config", str(config)]) == 2
    assert "would run out" in capsys.readouterr().err and not (tmp_path / "run" / "metrics.jsonl").exists()
    # Allowed a second epoch (reshuffled), it runs, and says so.
    sets = ["data.sources[1].max_epochs=2", "run.val_every=0", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    assert "source 'math' is read 2 epochs (max_epochs 2); " in capsys.readouterr().out
    saved = load_config(TrainConfig, tmp_path / "run" / "config.toml")
    plan = open_plan(saved, resolve(saved))[0]
    tail = plan.dropped_tail(1)  # the first epoch's end that could not hold a step's math windows
    assert 0 < tail < 7 * 33 + 33
    assert _rows(tmp_path / "run")[-1]["epoch/math"] == 2


def _phase(name: str, steps: int, lr: str) -> str:
    """One [[phase]] of `steps` at seq 32 on web and code, with the inline table `lr`."""
    return (
        f'[[phase]]\nname = "{name}"\nsteps = {steps}\nseq_len = 32\nmix = {{ web = 0.6, code = 0.4 }}\n'
        f"lr = {lr}\n\n"
    )


def test_a_nonfinite_stop_advises_the_key_of_the_learning_rate_that_diverged(
    sources, tmp_path, monkeypatch, capsys
):
    """A NaN in a phase with its own lr.peak: the stop advised `--set optim.lr=…`, which a phase's peak
    ignores, so the new run trained the same LR again (review R1)."""
    phases = _phase("main", 3, '{ warmup_steps = 1, shape = "constant" }') + _phase(
        "long", 3, '{ peak = 2e-3, shape = "linear", to = 3e-4 }'
    )
    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run", phases=phases)
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "5")
    quiet = ["run.val_every=0", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *quiet]) == 3
    err = capsys.readouterr().err
    assert "--set phase[1].lr.peak=0.0002 run.output_dir=NEW_DIR" in err and "optim.lr" not in err, err
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "2")  # in the first phase: optim.lr (3e-3) is its peak
    again = f"run.output_dir={json.dumps(str(tmp_path / 'again'))}"
    assert gristmill(["train", "--config", str(config), "--set", *quiet, again]) == 3
    assert "--set optim.lr=0.0003 run.output_dir=NEW_DIR" in capsys.readouterr().err
    # After a phase all warmup the next one starts at its peak (optim.lr), not at its end: the advice
    # named optim.min_lr, which changed nothing (review R4)
    warm = _phase("warm", 2, '{ warmup_steps = 2, shape = "cosine" }') + _phase(
        "main", 4, '{ shape = "cosine" }'
    )
    config = write_recipe(tmp_path / "w.toml", sources, tmp_path / "warm", phases=warm)
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "4")
    assert gristmill(["train", "--config", str(config), "--set", *quiet]) == 3
    assert "--set optim.lr=0.0003 run.output_dir=NEW_DIR" in capsys.readouterr().err


def test_a_resume_that_ends_the_phase_sooner_says_what_its_last_merge_window_averages(
    sources, tmp_path, capsys
):
    """A resume that shortens the current phase (8 → 7, cut at 6) moves the plan's last merge point into
    a window (5–7) whose first steps were trained before the resume, under a plan that merged
    elsewhere: the checkpoint's partial window (step 6: 8's is 6–8) is kept, step 5, of which it holds
    no sum, is said (review R5; kept since review R26d F1, which dropped it and averaged step 7 alone)."""
    phases = _phase("main", 8, '{ warmup_steps = 2, shape = "constant" }')
    merge = '[merge]\nkind = "window"\nevery = 4\nwindow = 3\n'
    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run", phases=phases, extra=merge)
    quiet = ["run.val_every=0", "metrics.plot=false", "checkpoint.interval=1"]
    assert gristmill(["train", "--config", str(config), "--set", *quiet, "run.max_steps=6"]) == 0
    capsys.readouterr()
    shorter = [*quiet, "phase[0].steps=7", 'checkpoint.resume="auto"']
    assert gristmill(["train", "--config", str(config), "--set", *shorter]) == 0
    out = capsys.readouterr().out
    assert (
        "note: [merge] step 7's window is steps 5–7, but the checkpoint of step 6, saved under a plan that "
        "merged elsewhere, holds no sum of steps 5–5: its merged weights average the steps from 6 on"
    ) in out
    assert _rows(tmp_path / "run")[-1]["merged/steps"] == 2


def test_config_errors_name_the_key(sources, tmp_path):
    head = '[[phase]]\nname = "a"\n'
    for phases, extra, match in [
        (head + "steps = 2\nmix = { web = 1.0, cod = 1.0 }\n", "", "phase.0..mix names source 'cod'"),
        (head + "step = 2\nmix = { web = 1.0 }\n", "", "unknown key 'phase.0..step'"),
        (head + "steps = 2\nseq_len = 48\nmix = { web = 1.0 }\n", "", "must divide"),
        (head + "steps = 2\nmix = { web = 1.0 }\n", "[schedule]\nsteps = 9\n", "remove .schedule."),
        (head + "mix = { web = 1.0 }\n", "", "steps or tokens"),
        # a budget in tokens below one step, a name given twice, no weight: by their keys (trial RV70b 3)
        (head + "tokens = 500\nmix = { web = 1.0 }\n", "", "phase.0..tokens = 500 rounds down to 0 steps"),
        (head + "steps = 2\nmix = { web = 0 }\n", "", "give at least one source a weight > 0"),
        (
            2 * (head + "steps = 2\nmix = { web = 1.0 }\n"),
            "",
            r"^phase.1. and phase.0. are both named .a.: every phase needs its own name; set phase.1..name",
        ),
        (  # a phase without a name is phase{k + 1} by default (review RV70e 10)
            head.replace('"a"', '"phase2"')
            + "steps = 2\nmix = { web = 1.0 }\n[[phase]]\nsteps = 2\nmix = { web = 1.0 }\n",
            "",
            r"^phase.1. and phase.0. are both named .phase2. \(phase.1. by default: phase.k. without a name",
        ),
        (
            head + "tokens = 1234567\nglobal_batch_tokens = 2048000\nmix = { web = 1.0 }\n",
            "",
            "phase.0..tokens = 1234567 rounds down to 0 steps",
        ),
    ]:
        path = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run", phases=phases, extra=extra)
        with pytest.raises(ConfigError, match=match.replace("'", ".")):
            check_config(load_config(TrainConfig, path), 1)


def test_sources_must_share_a_tokenizer(sources, tmp_path):
    other = make_dataset(tmp_path / "other", n_docs=60, vocab_size=300)
    cfg = cfg_of({"web": sources["web"], "other": other}, tmp_path)
    with pytest.raises(GristmillError, match="source 'other' has vocab_size 300 but source 'web'"):
        open_plan(cfg, resolve(cfg))


def test_a_wrong_recorded_sum_on_a_read_only_dataset_names_the_way_out(sources, tmp_path):
    """A recorded documents' sum that is not the documents' (edited or stale, no fingerprint covers
    it) on a dataset whose dataset.json cannot be written: the open's refusal said to run `gristmill
    data index`, which there exited 0 with a note as if the sum were only missing (review RV32h N4).
    Both give the one line, exit 2, naming the ways out. Read-only: a private mount namespace."""
    if not unshare_works():
        pytest.skip("no private mount namespace here (unshare -rm) to make the dataset read-only")
    code = shutil.copytree(sources["code"], tmp_path / "code")
    info = read_dataset_info(code)
    write_dataset_info(code, {**info, "index": {**info["index"], DOCUMENTS_SUM: "0" * 64}})
    config = write_recipe(tmp_path / "r.toml", {"web": sources["web"], "code": code}, tmp_path / "run")
    read_only = f"mount --bind {code} {code} && mount -o remount,bind,ro {code}"
    wrong = f"{code / 'dataset.json'}: index.{DOCUMENTS_SUM} {'0' * 12}… is not the sum of the dataset's "
    fix = (
        f"edited or stale; it cannot be written here (read-only): `gristmill data index {code}` records it "
        "again where it can be, or copy the dataset, run `gristmill data index` on the copy and give the "
        "copy as the source's dataset"
    )
    for command in (["train", "--config", str(config), "--plan"], ["data", "index", str(code)]):
        cmd = [sys.executable, "-m", "tests.helpers.mounts", read_only, "", "pipelines.cli", *command]
        done = forked.run(cmd, cwd=ROOT, env={**ENV, "OMP_NUM_THREADS": "2"}, timeout=120)
        err = done.stderr.strip()
        assert done.returncode == 2 and f"error: {wrong}" in err and err.endswith(fix), done.stdout + err
        assert "\n" not in err, err


# -- the trainer --


# The reference draws plan.png and loss.png (checked once); the runs that train its recipe again
# check losses, weights and rows, not pictures: drawing both costs ~1 CPU s a run.
NO_PLOT = "metrics.plot=false"


@pytest.fixture(scope="module")
def reference(sources, shared):
    """An uninterrupted phased run in this process, a checkpoint after every step (all kept); trained
    once per test run (read-only: copy it to write into it). (run dir, its recipe)"""
    extra = "[checkpoint]\ninterval = 1\nkeep_last = 0\n"
    run_dir = shared.run("1-process", lambda run: recipe_toml(sources, run, extra=extra), train_recipe)
    return run_dir, run_dir.with_name("recipe.toml")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _rows(run_dir)}


def test_the_run_reports_phases_sources_and_validation(reference):
    run_dir, _ = reference
    rows = _rows(run_dir)
    assert [r["phase"] for r in rows] == ["main"] * 6 + ["long"] * 5
    assert [r["seq_len"] for r in rows] == [32] * 6 + [64] * 5
    last = rows[-1]
    assert sum(last[f"tokens/{n}"] for n in ("web", "code", "math")) == last["tokens_seen"] == 11 * GBT
    assert {"val_loss", "val/web", "val/code", "val/math"} <= rows[5].keys()
    assert (run_dir / "plan.png").stat().st_size > 0
    assert [r["lr"] for r in rows][5:7] == [3e-3, 3e-3]  # constant, then the linear piece starts there


def test_the_run_config_holds_what_applies_and_trains_the_run_again(reference, tmp_path):
    """RUN/config.toml is the resolved config of what applies: no data.dataset (or its default) beside
    [[data.sources]], no [schedule] and no data.seq_len beside [[phase]] (issue 47: a seq_len the
    run never used), each source's own val_fraction and each phase's own seq_len, no --resume; a
    run from it alone (into another directory) trains the same steps."""
    run_dir, _ = reference
    saved = tomllib.loads((run_dir / "config.toml").read_text())
    assert "dataset" not in saved["data"] and "val_fraction" not in saved["data"]
    assert [s["val_fraction"] for s in saved["data"]["sources"]] == [0.1, 0.1, 0.1]
    assert "schedule" not in saved and "resume" not in saved["checkpoint"]
    assert "seq_len" not in saved["data"] and [ph["seq_len"] for ph in saved["phase"]] == [32, 64]
    again = tmp_path / "again"
    sets = [f"run.output_dir={json.dumps(str(again))}", "run.max_steps=3", "checkpoint.interval=0", NO_PLOT]
    assert gristmill(["train", "--config", str(run_dir / "config.toml"), "--set", *sets]) == 0
    assert _losses(again) == {s: v for s, v in _losses(run_dir).items() if s <= 3}


@pytest.mark.parametrize("at", [5, 6, 7])  # the last step of "main" is 6
def test_resume_before_at_and_after_the_boundary_is_bit_identical(reference, tmp_path, at):
    run_dir, config = reference
    copy = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / f"step-{at:06d}"
    assert gristmill(["train", "--config", str(config), "--set", f'run.output_dir="{copy}"', NO_PLOT,
                      "--resume", str(ckpt)]) == 0  # fmt: skip
    ref = _losses(run_dir)
    assert _losses(copy) == {s: v for s, v in ref.items() if s > at}
    assert_same_checkpoint(run_dir, copy, 11)


def test_a_resume_may_not_change_a_phase_a_discarded_attempt_trained_in(sources, tmp_path, capsys):
    """A rewind whose skip ends before its spike (here: spike at step 8, in phase 'long'; back to 4,
    steps 5–6 skipped, the skip's checkpoint at 6), killed there, then resumed with phase 'long''s
    mix changed: accepted as a future change, and the discarded attempt's rows and batch records of
    steps 7–8 then matched no plan, `data inspect` printed other digests (review R18b 1). Refused,
    naming the step that attempt reached; the same resume without the change goes on."""
    from training.run.faults import KILL, SPIKE_WINDOW

    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run")
    sets = ["checkpoint.interval=2", "metrics.plot=false", "run.val_every=0", "run.on_spike=rewind"]
    sets += ["run.spike_window=6", "run.spike_sigma=4", "run.rewind.skip_steps=2"]
    sets += ["run.rewind.margin_steps=3"]
    cmd = [sys.executable, "-m", "training.train", "--config", str(config), "--set", *sets]
    faults = {KILL: "rewind-saved", SPIKE_WINDOW: "step:8*50"}
    done = forked.run(cmd, cwd=ROOT, env={**ENV, **faults}, timeout=300)
    assert done.returncode == -9, done.stderr[-3000:]
    mix = "phase[1].mix={" + ", ".join(f"{n}={w}" for n, w in zip(sources, (0.5, 0.25, 0.25))) + "}"
    capsys.readouterr()
    assert gristmill(["train", "--config", str(config), "--set", *sets, mix, "--resume", "auto"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: a rewind's discarded attempt trained up to step 8, past this checkpoint: "
                           "the checkpoint's plan has phase[1].mix = "), line  # fmt: skip
    assert line.endswith("(only phases after step 8, which it reached, may change)"), line  # R18g 3
    # another run started from that checkpoint holds none of the discarded rows: free to change it (R18g 2)
    step6 = str(tmp_path / "run" / "checkpoints" / "step-000006")
    other = [*sets, mix, f'run.output_dir="{tmp_path / "other"}"']
    assert gristmill(["train", "--config", str(config), "--set", *other, "--resume", step6]) == 0
    assert gristmill(["train", "--config", str(config), "--set", *sets, "--resume", "auto"]) == 0


def test_kill9_at_the_boundary_then_resume_auto(reference, tmp_path, capsys):
    run_dir, config = reference
    killed = tmp_path / "killed"
    sets = [f'run.output_dir="{killed}"', "checkpoint.keep_last=2", NO_PLOT]
    cmd = [sys.executable, "-m", "training.train", "--config", str(config), "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_step(proc, killed, 6)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert gristmill(["train", "--config", str(config), "--set", f'run.output_dir="{killed}"', NO_PLOT,
                      "--resume", "auto"]) == 0  # fmt: skip
    assert _losses(killed) == _losses(run_dir)
    assert_same_checkpoint(run_dir, killed, 11)
    # The summary counts this invocation's steps, and names the whole run's first loss too.
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        "steps since the resume)" in summary
        and f"the whole run: {_rows(run_dir)[0]['loss']:.4f} at step 1" in summary
    )


def test_plan_inspect_and_consumption(reference, sources, tmp_path, capsys):
    run_dir, config = reference
    assert gristmill(["train", "--config", str(config), "--resume", "auto", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "main   1-6" in out and "long   7-11" in out and "seq_len" in out
    assert gristmill(["data", "inspect", str(run_dir), "--step", "7", "--max-rows", "0"]) == 0
    out = capsys.readouterr().out
    assert "phase 'long' step 1 of 5" in out and " row " in out
    assert all(f"{n} row" in out for n in ("web", "code", "math"))
    # --hash equals what the trainer's loader gives for the same step
    cfg = load_config(TrainConfig, run_dir / "config.toml")
    loader = loader_for(cfg)
    loader.seek(6)
    assert gristmill(["data", "inspect", str(run_dir), "--step", "7", "--hash"]) == 0
    assert capsys.readouterr().out.strip().endswith(batch_sha256(next(iter(loader))))
    sql = "SELECT phase, source, tokens FROM consumption ORDER BY phase DESC, source"
    assert gristmill(["data", "audit", str(run_dir), "--sql", sql, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    plan = open_plan(cfg, resolve(cfg))[0]
    want = {(r["phase"], r["source"]): r["tokens"] for r in plan.consumed(11)}
    got = {(p, s): int(t) for p, s, t in (line.split(",") for line in lines[1:])}
    assert got == want
    assert gristmill(["data", "audit", str(run_dir)]) == 0  # a run directory: its consumption table
    out = capsys.readouterr().out
    assert "== consumption ==" in out and "pct_of_dataset" in out and "== summary ==" not in out
    # A dataset's table asked of a run: one line, not an empty table and exit 0 (review R11d).
    assert gristmill(["data", "audit", str(run_dir), "--report", "summary"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--report summary reads a dataset's files, and {run_dir} holds no dataset.json" in line, line
    assert "--report consumption for a training run" in line
    # the run's own datasets named: a mixture's config has no data.dataset to look up (review R24e 5)
    named = ", ".join(str(sources[n]) for n in sources)
    assert f"pass a dataset directory ({run_dir}'s: {named})" in line, line
    emptied = tmp_path / "emptied"  # a config.toml that names no dataset: the default's is no run's (R24h 4)
    shutil.copytree(run_dir, emptied)
    (emptied / "config.toml").write_text("")
    assert gristmill(["data", "audit", str(emptied), "--report", "summary"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "pass a dataset directory (a training run's are the datasets its config.toml names)" in line, line
    # "all" of a run is its own tables, --plots (a dataset's charts) is refused, and a dataset with its
    # run prints both's tables (review R13c F3: nine empty tables, "no rows" charts, no consumption)
    assert gristmill(["data", "audit", str(run_dir), "--report", "all"]) == 0
    out = capsys.readouterr().out
    assert "== consumption ==" in out and "(no rows)" not in out and "== summary ==" not in out, out
    assert gristmill(["data", "audit", str(run_dir), "--plots", str(tmp_path / "plots")]) == 2
    assert "--plots reads a dataset's files" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "plots").exists()
    assert gristmill(["data", "audit", str(sources["web"]), str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "== summary ==" in out and "== consumption ==" in out, out


def test_a_one_dataset_run_resumes_by_the_plans_rules(sources, tmp_path, capsys):
    """A one-dataset run is the one-source plan "data": a recipe whose sources differ is refused by
    the plan's own rule, and a loader state in the format of gristmill 62f489d and earlier (one
    dataset's epoch and batch) is refused in one line naming the commit that resumes it."""
    legacy = tmp_path / "legacy"
    tiny = str(ROOT / "configs/train/tiny.toml")
    sets = [
        f'data.dataset="{sources["web"]}"',
        f'run.output_dir="{legacy}"',
        "schedule.steps=2",
        "schedule.warmup_steps=1",
    ]
    sets += ["run.val_every=0", "checkpoint.interval=2", "metrics.tensorboard=false", "metrics.plot=false"]
    assert gristmill(["train", "--config", tiny, "--set", *sets]) == 0
    config = write_recipe(tmp_path / "r.toml", sources, legacy)
    assert gristmill(["train", "--config", str(config), "--resume", "auto"]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint's plan has" in err and "the plan's past is immutable" in err, err
    assert "(the run drew steps 1–2 from it)" in err, err  # drawn: a rewind's skipped steps trained none
    # `train --plan` says what train would: it printed a plan of a past the run never trained, exit 0
    # (trial RV64a 1)
    assert gristmill(["train", "--config", str(config), "--resume", "auto", "--plan"]) == 2
    refusal = one_error_line(err).split("step-000002: ", 1)[1]
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot resume from checkpoint {legacy}/checkpoints/step-000002") and (
        line.endswith(f": {refusal}")
    ), line
    loader = dataset_loader(sources["web"], seq_len=16, global_batch=4, micro_batch=4, seed=0)
    old_state = {"fingerprint": "f" * 64, "seed": 0, "seq_len": 16, "global_batch": 4, "split": "train",
                 "val_fraction": 0.0, "plan": "x", "epoch": 0, "batch": 3}  # fmt: skip
    with pytest.raises(LoaderStateError, match="gristmill at commit 62f489d") as e:
        loader.load_state_dict(old_state)
    assert "\n" not in str(e.value)


def test_two_ranks_under_torchrun_train_the_same_plan(reference, tmp_path):
    """The phased run under torchrun (2 processes, gloo, FSDP): each rank takes its slots of every
    step, so the losses (and the per-source validation) match the one-process run."""
    run_dir, config = reference
    two = tmp_path / "two"
    sets = [f'run.output_dir="{two}"', "parallel.shard=2", "checkpoint.interval=0", NO_PLOT]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "training.train", "--config", str(config), "--set", *sets]
    proc = forked.run(cmd, cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ref, got = _rows(run_dir), _rows(two)
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for a, b in zip(ref, got):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5), a["step"]
        assert {k: v for k, v in b.items() if k.startswith("tokens/")} == {
            k: v for k, v in a.items() if k.startswith("tokens/")
        }
    assert got[5]["val/code"] == pytest.approx(ref[5]["val/code"], abs=1e-5)


def test_review_edges_of_the_plan_and_its_resume_rules():
    """Exact mixes (a resume at 0.3333333 : 0.6666667 is not 1 : 2), huge integer weights at step 0,
    and a source the past never read may change."""
    srcs = [Source("a", "", "fa", 10**9, 1), Source("b", "", "fb", 10**9, 1), Source("m", "", "fm", 10**9, 1)]
    lr = LRPiece(1e-3, 1e-3, "constant")

    def plan(w1, w2=(0, 0, 1), sources=srcs) -> Plan:
        return Plan(sources, [Phase("p", 100, 8, 1024, w1, lr), Phase("q", 10, 8, 1024, w2, lr)], 0)

    old = plan((1, 2, 0)).describe()
    close = plan(data_plan.integer_weights([0.3333333, 0.6666667, 0]))
    with pytest.raises(PlanError, match=r"phase\[0\]\.mix"):
        data_plan.check_resume(old, close, 50, lambda x, y: x == y)
    rebuilt = [*srcs[:2], Source("m", "", "other", 5 * 10**8, 1)]  # never read before step 100
    assert data_plan.check_resume(old, plan((1, 2, 0), sources=rebuilt), 50, lambda x, y: x == y) == []
    with pytest.raises(PlanError, match="fingerprint of source 'a'"):
        swapped = [Source("a", "", "new", 10**9, 1), *srcs[1:]]
        data_plan.check_resume(old, plan((1, 2, 0), sources=swapped), 50, lambda x, y: x == y)
    # where the dataset is; a relative path is read from here, maybe not the run's directory, so not
    # "rebuilt" (trial RV64a 2d, review RV65d 4)
    for where, rebuilt in (("runs/a", False), ("/data/a", True)):
        with pytest.raises(PlanError) as refused:
            swapped = [Source("a", where, "new", 10**9, 1), *srcs[1:]]
            data_plan.check_resume(old, plan((1, 2, 0), sources=swapped), 50, lambda x, y: x == y)
        said = str(refused.value)
        assert f"the fingerprint of source 'a' is 'new' at {where}" in said and "plan has 'fa'" in said, said
        assert ("from this working directory: " in said) is not rebuilt, said
        assert ("where that is this path, it was rebuilt since" in said) is rebuilt, said
    huge = plan(data_plan.integer_weights([1.0, 1 / 810, 0]))
    assert huge.cumulative(0, 0).tolist() == [0, 0, 0] and huge.step_windows(0)[0].shape == (1024,)


def test_review_edges_of_the_config(sources, tmp_path):
    two = {"web": sources["web"], "code": sources["code"]}
    path = write_recipe(
        tmp_path / "r.toml",
        two,
        tmp_path / "run",
        phases=" ",
        extra="[schedule]\nsteps = 9\nwarmup_steps = 1\n",
    )
    with pytest.raises(ConfigError, match=r"2 \[\[data.sources\]\] but no \[\[phase\]\]"):
        check_config(load_config(TrainConfig, path), 1)
    phases = '[[phase]]\nname = "a"\ntokens = 5000\nseq_len = 32\nmix = { web = 1.0 }\n'
    phases += "lr = { warmup_tokens = 5000 }\n"
    path = write_recipe(tmp_path / "r.toml", two, tmp_path / "run", phases=phases)
    cfg = load_config(TrainConfig, path)
    assert batch_shapes(cfg, check_config(cfg, 1), 1)[0].steps == 9  # 5000 // 512; warmup clamped


def test_resume_refusals_name_the_config_keys_and_values_the_user_wrote(sources, tmp_path):
    """A refused resume names the key(s) that changed, with the old and new values as written
    (optim.lr 0.003 → 0.001, a mix of 0.6/0.3/0.1), never the plan's internals (LRPiece, '3/5')."""
    one = {"web": sources["web"]}
    schedule = "[schedule]\nsteps = 8\nwarmup_steps = 2\n"
    (tmp_path / "x").mkdir()
    cases = [  # (phased?, old text, new text, what the message must say)
        (False, "lr = 3e-3", "lr = 1e-3", "optim.lr 0.003 → 0.001"),
        (False, "min_lr = 3e-4", "min_lr = 1e-4", "optim.min_lr 0.0003 → 0.0001"),
        # the digits that tell them apart (both were shown as 0.0003)
        (False, "min_lr = 3e-4", "min_lr = 3.000001e-4", "optim.min_lr 0.0003 → 0.0003000001"),
        (False, "warmup_steps = 2", "warmup_steps = 3", "schedule.warmup_steps 2 → 3"),
        (True, "warmup_steps = 2", "warmup_steps = 3", "phase[0].lr.warmup_steps 2 → 3"),
        (True, "lr = 3e-3", "lr = 1e-3", "optim.lr 0.003 → 0.001"),
        (True, "web = 0.6, code = 0.3", "web = 0.5, code = 0.4",
         "phase[0].mix = { web = 0.6, code = 0.3, math = 0.1 } but this run has "
         "{ web = 0.5, code = 0.4, math = 0.1 }"),
        # a share that tells them apart with its digits (both sides read math = 0.1: trial RV78a 2)
        (True, "code = 0.3, math = 0.1 }", "code = 0.3, math = 0.1000001 }",
         "phase[0].mix = { web = 0.6, code = 0.3, math = 0.1 } but this run has "
         "{ web = 0.5999999, code = 0.29999997, math = 0.1000001 }"),
    ]  # fmt: skip
    for phased, old, new, says in cases:
        srcs = sources if phased else one
        extra = "" if phased else schedule
        text = recipe_toml(srcs, tmp_path / "run", phases="" if phased else " ", extra=extra)
        (tmp_path / "r.toml").write_text(text)
        loader = loader_for(load_config(TrainConfig, tmp_path / "r.toml"))
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        assert old in text, old
        path = tmp_path / "x" / "changed.toml"
        path.write_text(text.replace(old, new, 1))
        other = loader_for(load_config(TrainConfig, path))
        with pytest.raises(PlanError) as e:
            other.load_state_dict(state)
        msg = str(e.value)
        assert says in msg and "LRPiece" not in msg and "/" not in msg.split("immutable")[0], msg
        assert not re.search(r"(?<![\w.])([\d.e-]+) → \1(?![\w.])", msg), msg  # a change shown as none
