"""Metrics arithmetic (MFU, update ratio), the optimizer's parameter groups and the LR schedule."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.models import tiny_model
from training.config import OptimSection
from training.contract.errors import GristmillError
from training.data.plan import LRPiece, Phase, Plan, Source
from training.metrics import format_line, mfu, peak_flops, snapshot, update_ratio
from training.model import PRESETS, flops_per_token
from training.optim import build_optimizer, param_groups, plan_scheduler


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200 NVL", 835e12),  # were 989e12, the SXM's: MFU understated (review R16g)
        ("NVIDIA H800 PCIe", 756e12),
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_peak_flops_by_device_name(name, peak):
    assert peak_flops(name) == peak


def test_mfu_against_a_hand_count():
    # Llama-3 1.24B shape, seq 2048. Per block: q and o 2048², k and v 2048·512, w1/w2/w3 2048·8192.
    per_block = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192  # 60,817,408
    n_matmul = 16 * per_block + 131072 * 2048  # + tied LM head = 1,241,513,984 (all params but the norms)
    assert n_matmul == 1_241_513_984
    by_hand = 6 * n_matmul + 12 * 16 * 2048 * 2048  # attention: 12·L·d·T
    assert by_hand == 8_254_390_272
    assert flops_per_token(PRESETS["llama3-1b"], 2048, include_lm_head=True) == by_hand
    # 8 H100s at 40,000 tokens/s each: 40e3 × 8.254e9 / 989e12 = 33.4% MFU.
    util = mfu(320_000, 8, by_hand, peak_flops("NVIDIA H100 80GB HBM3"))
    assert util == pytest.approx(40_000 * 8_254_390_272 / 989e12) and 0.33 < util < 0.34
    assert mfu(320_000, 8, by_hand, peak_flops("cpu")) is None


def test_step_line_has_no_mfu_without_a_peak():
    m = {
        "step": 3,
        "loss": 2.0,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "update_ratio": 1e-3,
        "tokens_per_s": 1e4,
        "peak_memory_bytes": 3 << 30,
    }
    line = format_line(m)
    assert "mfu" not in line and "mem 3.00 GiB" in line and "loss 2.0000" in line
    assert "mfu 41.0%" in format_line({**m, "mfu": 0.41})


def test_update_ratio_plain_tensors():
    params = [torch.tensor([3.0, 4.0]), torch.tensor([[0.0, 12.0]])]
    before = snapshot(params)
    params[0] += torch.tensor([1.0, 0.0])  # Δ = (1, 0, 0, 0) → ‖Δ‖ = 1
    expected = 1.0 / math.sqrt(4.0**2 + 4.0**2 + 12.0**2)
    assert update_ratio(params, before) == pytest.approx(expected)


@pytest.mark.parametrize("tied", [False, True])
def test_weight_decay_groups(tied):
    model = tiny_model(tie_embeddings=tied)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = (sorted(names[id(p)] for p in g["params"]) for g in param_groups(model, 0.1))
    assert all(n.endswith("norm.weight") for n in no_decay) and len(no_decay) == 2 * 2 + 1
    assert "tok_embeddings.weight" in decay
    decay2, no_decay2 = (sorted(names[id(p)] for p in g["params"]) for g in param_groups(model, 0.1, False))
    assert "tok_embeddings.weight" in no_decay2 and "tok_embeddings.weight" not in decay2
    assert ("output.weight" in decay2) == (not tied)  # a tied head is the embedding itself
    n_unique = len({id(p) for p in model.parameters()})
    assert len(decay) + len(no_decay) == len(decay2) + len(no_decay2) == n_unique


def test_a_one_phase_plan_schedules_warmup_then_cosine():
    """The LR of a one-dataset recipe is its one-phase plan's: warmup to optim.lr, cosine to min_lr."""
    plan = Plan(
        [Source("d", "", "f", 10**9, 1)], [Phase("main", 4, 8, 8, (1,), LRPiece(3e-4, 3e-5, "cosine", 2))], 0
    )
    model = tiny_model()
    opt = build_optimizer(model, OptimSection(lr=3e-4, min_lr=3e-5), "cpu")
    sched = plan_scheduler(opt, plan)
    lrs = []
    for _ in range(5):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.5e-4, 3e-4, 1.65e-4, 3e-5, 3e-5])  # the last LR holds past the plan
    assert sched.state_dict() == {"last_step": 5}
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["weight_decay"] == 0.1


def test_adamw8bit_refused_on_cpu_and_fused_is_the_default():
    model = tiny_model()
    with pytest.raises(GristmillError, match="'adamw8bit' needs a CUDA GPU"):
        build_optimizer(model, OptimSection(name="adamw8bit"), "cpu")
    # fused on CPU too: its kernel takes the non-finite flag on the device (training.run.verdict)
    assert build_optimizer(model, OptimSection(), "cpu").defaults["fused"]
    assert not build_optimizer(model, OptimSection(fused=False), "cpu").defaults["fused"]


def test_the_summary_quotes_only_logged_steps(tmp_path):
    """A run stopped at step 27 with rows every 5 steps: the summary's losses are those of steps 1
    and 25, so it says so, not 'over steps 1–27'."""
    from training.checkpoint.state import TrainState
    from training.metrics import summary_line
    from training.run.record import RunRecord

    rows = [{"step": 1, "loss": 9.0255}, {"step": 25, "loss": 6.7533}]
    line = summary_line(rows, 0, 27, 3.0)
    assert "loss 9.0255 at step 1 → 6.7533 at step 25 (logged, of steps 1–27; 27 steps), 3 s" in line
    rows.append({"step": 27, "loss": 6.7})
    assert "loss 9.0255 → 6.7000 over steps 1–27 (27 steps)" in summary_line(rows, 0, 27, 3.0)
    # one step: not "over steps 27–27 (1 steps since the resume)" (trial RV66a nit)
    assert "loss 6.7000 → 6.7000 over step 27 (1 step since the resume)" in summary_line(rows, 26, 27, 3.0)
    # metrics.plot = false: no loss.png, so none named
    assert RunRecord(tmp_path, None, TrainState(), rank=0, plot=False).draw_loss() is None


def test_the_summary_counts_the_validations_and_evals_that_failed():
    """A damaged held-out document skips every validation after it, each with a warning as it happens;
    the run's last line, rc 0, said nothing of it (review RV49a 5). Counted over this invocation."""
    from training.metrics import summary_line

    rows = [{"step": 1, "loss": 9.0, "val_loss": 8.9}, {"step": 2, "loss": 8.0, "val_error": "x"}]
    rows += [
        {"step": 3, "loss": 7.0, "val_error": "x", "eval_s": 1.0},
        {"step": 4, "loss": 6.0, "eval_error": "y"},
    ]
    line = summary_line(rows, 0, 4, 3.0)
    assert line.endswith(
        "; validation failed at 2 of 3 steps (the rows' val_error says why); eval failed at 1 of 2 steps "
        "(the rows' eval_error says why)"
    ), line
    assert summary_line(rows, 3, 4, 3.0).endswith(
        "; eval failed at 1 of 1 steps (the rows' eval_error says why)"
    )
    assert summary_line(rows[:1], 0, 1, 3.0).endswith(", 3 s")  # nothing failed: nothing said
    # the merged weights' failures apart, also where the raw weights' eval of the step succeeded: a run
    # whose merged evals alone failed ended without a word of them (trial RV75b 1)
    rows = [{"step": 4, "loss": 6.0, "eval_s": 1.0, "merged/steps": 3, "merged/eval_error": "z"}]
    rows += [{"step": 8, "loss": 5.0, "eval_s": 1.0, "merged/steps": 3, "merged/eval_s": 1.0}]
    rows += [{"step": 12, "loss": 4.0, "val_loss": 4.1, "merged/steps": 3, "merged/val_error": "w"}]
    assert summary_line(rows, 0, 12, 3.0).endswith(
        "; validation of the merged weights failed at 1 of 1 steps (the rows' merged/val_error says why)"
        "; eval of the merged weights failed at 1 of 2 steps (the rows' merged/eval_error says why)"
    ), summary_line(rows, 0, 12, 3.0)
