"""optim.name = "muon": the update of one step against torch.optim.Muon and AdamW, which parameters
take which, the non-finite guard; through the trainer: 1 process vs 2 FSDP ranks, exact resume."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess

import pytest
import torch
import torch.distributed as dist

from tests.helpers.models import tiny_model
from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import ENV, ROOT, TINY, losses, overrides, torchrun_cmd, wait_for_step
from training.config import OptimSection
from training.contract.config_loader import ConfigError
from training.optim import ScheduledLR, build_optimizer
from training.train import load_train_config, train, train_step

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
    assert {"tok_embeddings.weight", "output.weight", "norm.weight", "layers.0.attention_norm.weight"} <= adamw
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
    for bad, key in (("optim.muon_momentum=1.0", "optim.muon_momentum"), ("optim.muon_ns_steps=0", "optim.muon_ns_steps")):
        with pytest.raises(ConfigError, match=key):
            train(load_train_config(TINY, [*base, "optim.name='muon'", bad]))
