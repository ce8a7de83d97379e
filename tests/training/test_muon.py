"""optim.name = "muon": the update of one step against torch.optim.Muon and AdamW, which parameters
take which, the non-finite guard; through the trainer: 1 process vs 2 FSDP ranks, exact resume."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess

import pytest
import torch
import torch.distributed as dist

from tests.helpers import forked
from tests.helpers.models import tiny_model
from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_same_checkpoint,
    losses,
    metrics,
    one_error_line,
    overrides,
    run_torchrun,
    torchrun_cmd,
    wait_for_step,
)
from training.config import OptimSection
from training.contract.config_loader import ConfigError
from training.launch import child_pids
from training.optim import ScheduledLR, build_optimizer
from training.train import load_train_config, train, train_step
from training.train import main as train_main

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

MUON = OptimSection(name="muon", lr=3e-3, weight_decay=0.1, decay_embeddings=False)


def batch(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 17), generator=g)
    return [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]


def step(model, opt, seed, lr=3e-3, poison=False):
    sched = ScheduledLR(opt, lambda s: lr)
    handle = model.register_forward_hook(lambda m, a, out: out * float("nan")) if poison else None
    try:
        return train_step(model, opt, sched, batch(seed), grad_clip=1.0, amp=contextlib.nullcontext)
    finally:
        if handle is not None:
            handle.remove()


def names_by_group(model, opt) -> list[tuple[bool, float, set[str]]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [(g["muon"], g["weight_decay"], {names[id(p)] for p in g["params"]}) for g in opt.param_groups]


def test_blocks_matrices_take_muon_and_the_rest_adamw_with_adamws_decay_groups():
    model = tiny_model()
    opt = build_optimizer(model, MUON, "cpu")
    groups = names_by_group(model, opt)
    muon = set().union(*(n for m, _, n in groups if m))
    adamw = set().union(*(n for m, _, n in groups if not m))
    assert muon == {n for n, p in model.named_parameters() if n.startswith("layers.") and p.ndim == 2}
    assert {"layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight"} <= muon
    assert adamw == {n for n, _ in model.named_parameters()} - muon
    assert {
        "tok_embeddings.weight",
        "output.weight",
        "norm.weight",
        "layers.0.attention_norm.weight",
    } <= adamw
    # AdamW's decay groups: the matrices decay, norms and (decay_embeddings = false) embeddings do not
    assert [(m, wd) for m, wd, _ in groups] == [(True, 0.1), (False, 0.1), (False, 0.0)]
    assert groups[1][2] == {"output.weight"} and "tok_embeddings.weight" in groups[2][2]
    step(model, opt, 0)
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        assert set(st) == ({"momentum_buffer"} if names[id(p)] in muon else {"step", "exp_avg", "exp_avg_sq"})


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon (torch ≥ 2.9)")
@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
def test_one_step_equals_torch_muon_and_adamw(adjust_lr):
    """Two steps (so momentum and Adam's moments matter) of the muon optimizer equal torch.optim.Muon on
    the blocks' matrices and torch.optim.AdamW on the rest, with the same groups and decay."""
    cfg = OptimSection(name="muon", lr=3e-3, weight_decay=0.1, muon_adjust_lr=adjust_lr)
    ours, ref = tiny_model(), tiny_model()
    opt = build_optimizer(ours, cfg, "cpu")
    by_name = dict(ref.named_parameters())
    names = {id(p): n for n, p in ours.named_parameters()}
    torch_groups = [
        {"params": [by_name[names[id(p)]] for p in g["params"]], "weight_decay": g["weight_decay"]}
        for g in opt.param_groups
    ]
    muon_groups = [g for g, o in zip(torch_groups, opt.param_groups) if o["muon"]]
    adamw_groups = [g for g, o in zip(torch_groups, opt.param_groups) if not o["muon"]]
    t_muon = torch.optim.Muon(muon_groups, lr=cfg.lr, momentum=0.95, nesterov=True, adjust_lr_fn=adjust_lr)
    t_adamw = torch.optim.AdamW(adamw_groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    for seed in (0, 1):
        for model in (ours, ref):
            model.zero_grad(set_to_none=True)
            model(batch(seed)[0]["input_ids"], labels=batch(seed)[0]["labels"]).backward()
        opt.step()
        t_muon.step()
        t_adamw.step()
        for name, p in ours.named_parameters():
            torch.testing.assert_close(p, by_name[name], atol=1e-6, rtol=0, msg=name)
    moved = [(p - q).abs().max() for p, q in zip(ours.parameters(), tiny_model().parameters())]
    assert min(moved) > 1e-5  # every parameter took a step


def test_a_nonfinite_step_changes_nothing_under_muon():
    model = tiny_model()
    opt = build_optimizer(model, MUON, "cpu")
    step(model, opt, 0)
    params = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in st.items()} for st in opt.state.values()]
    out = step(model, opt, 1, poison=True)
    assert int(out["nonfinite"]) == 3
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    for a, b in zip(state, opt.state.values()):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # momentum, moments, steps
    assert int(step(model, opt, 2)["nonfinite"]) == 0
    assert not all(torch.equal(a, p) for a, p in zip(params, model.parameters()))


def test_muon_keys_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="optim.name"):
        load_train_config(TINY, ["optim.name='lion'"])
    ds = make_dataset(tmp_path / "ds", n_docs=20)
    base = [f"data.dataset={json.dumps(str(ds))}", f"run.output_dir={json.dumps(str(tmp_path / 'r'))}"]
    for bad, key in (
        ("optim.muon_momentum=1.0", "optim.muon_momentum"),
        ("optim.muon_ns_steps=0", "optim.muon_ns_steps"),
    ):
        with pytest.raises(ConfigError, match=key):
            train(load_train_config(TINY, [*base, "optim.name='muon'", bad]))


# Through the real trainer: the tiny recipe, 12 steps, a checkpoint every 4, optim.name = "muon".
needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset(n_docs=300)


def muon_sets(dataset, run_dir, *extra: str) -> list[str]:
    return overrides(dataset, run_dir, "optim.name='muon'", "optim.lr=3e-3", *extra)


@pytest.fixture(scope="module")
def fsdp_reference(dataset, shared):
    """An uninterrupted 2-rank FSDP run (gloo, parallel.shard=2), trained once per test run
    (read-only: copy it to write into it)."""
    return shared.run(
        "torchrun-2",
        lambda run_dir: muon_sets(dataset, run_dir, "parallel.shard=2"),
        lambda sets, _: run_torchrun(sets),
    )


@needs_gloo
def test_fsdp_matches_single_process(fsdp_reference, dataset, tmp_path):
    """Each rank orthogonalises the whole matrix (gathered), so 2 FSDP ranks train like one process:
    the same losses step by step up to summation order. Tolerance 5e-5, not AdamW's 1e-5: the last-bit
    differences of the gradients flip a few bfloat16 roundings of the Newton–Schulz input (measured:
    7e-6 at most over 12 steps); orthogonalising each rank's shard alone instead moves step 2 by 9e-4."""
    single = tmp_path / "single"
    train(load_train_config(TINY, muon_sets(dataset, single, "checkpoint.interval=0")))
    ref, got = losses(single), losses(fsdp_reference)
    assert [r[0] for r in got] == [r[0] for r in ref] == list(range(1, 13))
    assert ref[-1][1] < ref[0][1] - 0.5  # it learns
    for (step, loss, norm, lr, tokens, _), (_, loss2, norm2, lr2, tokens2, _) in zip(ref, got):
        assert loss2 == pytest.approx(loss, abs=5e-5), step
        assert norm2 == pytest.approx(norm, rel=1e-4, abs=1e-6), step
        assert (lr2, tokens2) == (lr, tokens)


@needs_gloo
def test_sigterm_then_resume_auto_is_bit_identical(fsdp_reference, dataset, tmp_path):
    """Stopped by SIGTERM mid-run (it saves the sharded momentum buffers and Adam moments), then
    `checkpoint.resume = "auto"`: losses, norms and the final weights equal the uninterrupted run's."""
    run_dir = tmp_path / "run"
    sets = muon_sets(dataset, run_dir, "parallel.shard=2")
    proc = forked.popen(torchrun_cmd(sets), cwd=ROOT, env=ENV, stderr=subprocess.STDOUT)
    wait_for_step(proc, run_dir, 5)
    os.kill(child_pids(proc.pid)[-1], signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    stopped = losses(run_dir)[-1][0]
    assert stopped < 12 and f"stopping after step {stopped} on SIGTERM" in out
    proc = forked.run(torchrun_cmd([*sets, 'checkpoint.resume="auto"']), cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming from" in proc.stdout
    assert losses(run_dir) == losses(fsdp_reference), f"stopped at step {stopped}"
    assert_same_checkpoint(run_dir, fsdp_reference, 12)


def test_switching_optimizer_on_resume_is_one_line(fsdp_reference, dataset, tmp_path, capsys):
    """Issue 37 item 8: muon ↔ adamw on a resume is refused naming optim.name with the old and new
    values, before any load (DCP's own error was `Missing key … momentum_buffer`)."""
    muon_run = tmp_path / "muon"
    shutil.copytree(fsdp_reference, muon_run)
    adamw_run = tmp_path / "adamw"
    train(load_train_config(TINY, overrides(dataset, adamw_run, "schedule.steps=4")))
    capsys.readouterr()
    for run_dir, sets, old, new in (
        (muon_run, muon_sets(dataset, muon_run, "optim.name='adamw'"), "muon", "adamw"),
        (adamw_run, muon_sets(dataset, adamw_run, "schedule.steps=4"), "adamw", "muon"),
    ):
        before = (run_dir / "config.toml").read_text()
        assert train_main(["--config", TINY, "--set", *sets, "checkpoint.resume=auto"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"holds the state of optim.name = '{old}', and this config has optim.name = '{new}'" in line
        assert f"--set optim.name={old}" in line and "momentum_buffer" not in line, line
        assert (run_dir / "config.toml").read_text() == before  # a refused resume changes nothing


@pytest.mark.parametrize(
    "optimizer",
    [
        ("optim.name='muon'",),
        ("optim.name='muon'", "checkpoint.async=true"),
        ("optim.name='adamw'", "optim.fused=false"),
    ],
)
def test_a_checkpoint_saved_before_any_step_was_applied_resumes_exactly(
    dataset, tmp_path, monkeypatch, optimizer
):
    """Steps 1 and 2 non-finite and skipped, a checkpoint at step 2: Muon (and unfused AdamW) create
    their state at their first step, so the checkpoint held none, and resuming from it (or a rewind
    to it) stopped on DCP's `Missing key … momentum_buffer` (review R11a). It resumes as an
    optimizer that has taken no step, as the uninterrupted run had at step 2. With async saves, the
    host buffers sized at that first save had no room for the state: the next save was refused and
    the run stopped (review R11c); they are sized again."""
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "1,2")
    sets = [*optimizer, "run.on_nonfinite='skip'", "checkpoint.interval=2", "schedule.steps=6"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(load_train_config(TINY, muon_sets(dataset, whole, *sets)))
    train(load_train_config(TINY, muon_sets(dataset, cut, *sets, "run.max_steps=2")))
    train(load_train_config(TINY, muon_sets(dataset, cut, *sets, "checkpoint.resume=auto")))
    assert [r["step"] for r in metrics(cut)] == [1, 2, 3, 4, 5, 6]
    assert repr(losses(cut)) == repr(losses(whole))  # nan at steps 1 and 2 in both
    assert_same_checkpoint(cut, whole, 6)
