"""The non-finite guard at the level of one step: a NaN loss or gradient leaves weights, moments and
step counts untouched (fused and non-fused AdamW), and the check costs no host sync on the fused path."""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.helpers.models import tiny_model
from training.config import OptimSection
from training.optim import ScheduledLR, build_optimizer
from training.run.verdict import NonFiniteGuard, SpikeDetector
from training.train import train_step

SYNCS = ("item", "tolist", "__bool__", "__float__", "__int__")


@contextlib.contextmanager
def count_host_reads():
    """Counts every Tensor method that copies a value to the host."""
    calls = []
    originals = {name: getattr(torch.Tensor, name) for name in SYNCS}

    def counting(name):
        def wrapper(self, *a, **k):
            calls.append(name)
            return originals[name](self, *a, **k)

        return wrapper

    for name in SYNCS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def batch(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 17), generator=g)
    return [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]


def step(model, opt, sched, seed, poison=False):
    if poison:
        handle = model.register_forward_hook(lambda m, a, out: out * float("nan"))
    try:
        return train_step(model, opt, sched, batch(seed), grad_clip=1.0, amp=contextlib.nullcontext)
    finally:
        if poison:
            handle.remove()


def snapshot_state(model, opt):
    return [p.detach().clone() for p in model.parameters()], [
        {k: v.clone() for k, v in st.items()} for st in opt.state.values()
    ]


@pytest.mark.parametrize("fused", [True, False])
def test_a_nonfinite_step_changes_nothing(fused):
    model = tiny_model()
    opt = build_optimizer(model, OptimSection(fused=fused), "cpu")
    sched = ScheduledLR(opt, lambda step: 3e-4)
    step(model, opt, sched, 0)
    params, state = snapshot_state(model, opt)
    out = step(model, opt, sched, 1, poison=True)
    assert int(out["nonfinite"]) == 3 and not torch.isfinite(out["loss"])
    after_params, after_state = snapshot_state(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(params, after_params))
    for a, b in zip(state, after_state):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # moments and step count
    out = step(model, opt, sched, 2)  # and the next finite step is applied
    assert int(out["nonfinite"]) == 0
    assert not all(torch.equal(a, p) for a, p in zip(params, model.parameters()))


def test_the_check_reads_nothing_on_the_host_between_logs():
    model = tiny_model()
    opt = build_optimizer(model, OptimSection(), "cpu")  # fused: the default
    sched = ScheduledLR(opt, lambda step: 3e-4)
    guard = NonFiniteGuard(torch.device("cpu"))
    step(model, opt, sched, 0)  # the first step creates the optimizer state
    with count_host_reads() as calls:
        for s in (2, 3, 4):
            guard.record(s, step(model, opt, sched, s, poison=s == 3)["nonfinite"])
    # clip_grad_norm and lr scheduling may read Python numbers, never tensors: no sync at all
    assert calls == [], calls
    with count_host_reads() as calls:
        report = guard.read()
    assert len(calls) == 1 and report == {
        "skipped": 1,
        "consecutive": 1,
        "last_step": 3,
        "first_step": 3,
        "what": "loss and gradient norm",
    }
    assert guard.take_unlogged()["skipped"] == 1 and guard.take_unlogged() == {"skipped": 0}


def test_spike_detector_reports_a_jump_only():
    spikes = SpikeDetector(window=10, sigma=6.0)
    losses = [5.0 - 0.1 * i + 0.01 * (i % 3) for i in range(10)]
    assert [spikes.check(x) for x in losses] == [None] * 10
    spike = spikes.check(9.0)
    assert spike is not None and spike["loss"] == 9.0 and spike["window"] == 10
    assert spikes.check(float("nan")) is None
    assert SpikeDetector(window=10, sigma=0).check(100.0) is None


def test_a_smaller_spike_window_on_resume_judges_the_next_step_by_its_own_losses():
    """A resume with run.spike_window 20 → 8 judged its first step against the checkpoint's 20 losses,
    though its note said the 8-loss window was in effect: a spike of the last 8 went unseen (review
    R5). The checkpoint's list (TrainState.recent_losses, shared) is cut to the window first."""
    recent = [10.0 + (i % 2) * 4 for i in range(12)] + [3.0 + 0.01 * (i % 2) for i in range(8)]
    spikes = SpikeDetector(window=8, sigma=6.0, recent=recent)
    spike = spikes.check(3.5)
    assert spike is not None and spike["window"] == 8
    assert len(recent) == 8  # the state that is checkpointed next holds the window's losses


def test_a_run_of_nonfinite_steps_that_ended_before_the_read_still_counts():
    guard = NonFiniteGuard(torch.device("cpu"))
    bad, good = torch.tensor(1), torch.tensor(0)
    for s in range(1, 9):
        guard.record(s, bad)
    guard.record(9, good)
    first = guard.read()
    assert (first["consecutive"], first["last_step"]) == (8, 8)  # max_skipped <= 8 must stop the run
    guard.record(10, bad)
    assert guard.read() == {"skipped": 1, "consecutive": 1, "last_step": 10, "first_step": 10, "what": "loss"}
    guard.record(11, bad)  # the run from step 10 goes on across the read
    assert {k: v for k, v in guard.read().items() if k in ("consecutive", "last_step")} == {
        "consecutive": 2,
        "last_step": 11,
    }
    # A shorter run after a longer one: the longer is the one said, by its own steps (the STOP named
    # "N trained steps in a row up to" the step read: trial RV63a)
    for s, code in zip(range(12, 18), (bad, bad, good, good, bad, good), strict=True):
        guard.record(s, code)
    report = guard.read()  # steps 10–13 in a row (across the last read), then 16 alone
    assert (report["consecutive"], report["last_step"], report["first_step"]) == (4, 13, 12)
