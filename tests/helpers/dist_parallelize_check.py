"""FSDP2 / HSDP parity check, run by tests/training/test_parallelize.py as

    torchrun --standalone --nproc_per_node=2 tests/helpers/dist_parallelize_check.py

Every rank computes the single-process reference (the tiny model, float32, on the whole global
batch, plain AdamW) and then the same training with the model parallelized over the 2 ranks, each
rank taking its half of the global batch. Losses (averaged over ranks) must equal the reference
step by step, and the final gathered parameters must equal the reference parameters. A negative
control skips the gradient reduction on one step and must be caught by the same comparison.
Prints "ALL CHECKS PASSED" on rank 0 and exits 0; raises (non-zero exit) on any mismatch.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from training.config import ParallelConfig  # noqa: E402
from training.model import PRESETS, ModelConfig, Transformer, num_params  # noqa: E402
from training.parallelize import autocast_context, build_mesh, parallelize  # noqa: E402

STEPS = 3
GLOBAL_BATCH, SEQ = 4, 32
LOSS_TOL = 1e-5
# AdamW divides by sqrt(v): gradient differences at float32 rounding level (reduction order) become
# parameter differences up to ~1e-5 on entries whose gradient is tiny. 1e-4 is still 30x below a
# single step's update (lr 3e-3), so a missed or doubled reduction cannot hide under it.
PARAM_TOL = 1e-4
# bf16 vs bf16-autocast: the losses agree to ~2e-3; parameters are not compared (Adam turns bf16
# noise on near-zero gradients into full-size steps of either sign).
BF16_LOSS_TOL, BF16_PARAM_TOL = 1e-2, float("inf")


def make_batch(cfg: ModelConfig):
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, SEQ + 1), generator=g)
    # Packed documents: position ids restart at 0 at random document starts.
    pos = torch.empty(GLOBAL_BATCH, SEQ, dtype=torch.long)
    for b in range(GLOBAL_BATCH):
        starts = sorted({0, *torch.randint(1, SEQ, (2,), generator=g).tolist()})
        p = torch.arange(SEQ)
        for s in starts:
            p[s:] = torch.arange(SEQ - s)
        pos[b] = p
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), pos


def fresh_model(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(cfg)


def train(model, batches, steps, *, amp=contextlib.nullcontext, average_loss=False, skip_sync_step=None):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x, y, pos = batches
    losses = []
    for step in range(steps):
        if skip_sync_step is not None:
            # Negative control: no gradient reduce-scatter on this step (grads stay local/unsharded).
            model.set_requires_gradient_sync(step != skip_sync_step)
        # Per step, around forward only: autocast caches its bf16 weight copies until the context
        # exits, so a context spanning optimizer steps would keep computing with stale weights.
        with amp():
            loss = model(x, y, position_ids=pos)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if average_loss:  # the global-batch loss = mean of the equal-sized local means
            dist.all_reduce(value, op=dist.ReduceOp.AVG)
        losses.append(value.item())
    return losses


def full_params(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[name] = t.clone()
    return out


def run_case(name, mcfg, pcfg, rank, world, *, skip_sync_step=None, expect_equal=True, tol=None):
    x, y, pos = make_batch(mcfg)
    ref_model = fresh_model(mcfg)
    amp = functools.partial(autocast_context, pcfg, None, "cpu")  # bf16 autocast iff param_dtype bf16
    ref_losses = train(ref_model, (x, y, pos), STEPS, amp=amp)
    ref_params = full_params(ref_model)

    mesh = build_mesh(pcfg, world, "cpu")
    model = parallelize(fresh_model(mcfg), mesh, pcfg)
    per = GLOBAL_BATCH // world
    sl = slice(rank * per, (rank + 1) * per)
    losses = train(model, (x[sl], y[sl], pos[sl]), STEPS, average_loss=True, skip_sync_step=skip_sync_step)
    params = full_params(model)

    loss_diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    param_diff = max((params[n] - ref_params[n]).abs().max().item() for n in ref_params)
    assert params.keys() == ref_params.keys(), (sorted(params), sorted(ref_params))
    loss_tol, param_tol = tol or (LOSS_TOL, PARAM_TOL)
    equal = loss_diff <= loss_tol and param_diff <= param_tol
    if rank == 0:
        print(
            f"{'OK  ' if equal == expect_equal else 'FAIL'} {name}: losses {[f'{v:.6f}' for v in losses]} "
            f"ref {[f'{v:.6f}' for v in ref_losses]} max|dloss|={loss_diff:.2e} max|dparam|={param_diff:.2e}"
            + ("" if expect_equal else " (negative control: must differ)"),
            flush=True,
        )
    if equal != expect_equal:
        raise SystemExit(f"{name}: parity {'failed' if expect_equal else 'was not broken'}")


def meta_init_case(rank, world) -> None:
    """meta device -> parallelize (FSDP) -> to_empty -> init_weights: tied weights stay tied, the
    parameters are real, the sharded parameter count is the model's, and a step trains."""
    for tied in (False, True):
        mcfg = PRESETS["tiny"].replace(tie_embeddings=tied)
        with torch.device("meta"):
            model = Transformer(mcfg)
        model = parallelize(model, build_mesh(ParallelConfig(), world, "cpu"), ParallelConfig())
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.init_weights()
        assert (model.output.weight is model.tok_embeddings.weight) == tied, "tie lost by to_empty"
        assert num_params(model) == num_params(fresh_model(mcfg)), "sharded parameter count"
        for name, p in model.named_parameters():
            assert torch.isfinite(p.full_tensor()).all(), name
        x, y, pos = make_batch(mcfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(2):
            loss = model(x[rank::world], y[rank::world], position_ids=pos[rank::world])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert abs(losses[0] - math.log(mcfg.vocab_size)) < 0.1 and losses[1] < losses[0], losses
        if tied:
            assert model.output.weight is model.tok_embeddings.weight, "tie lost in training"
        if rank == 0:
            print(
                f"OK   meta init under FSDP (tied={tied}): losses {[f'{v:.4f}' for v in losses]}", flush=True
            )


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "run with --nproc_per_node=2"
    fp32 = dict(param_dtype="float32", reduce_dtype="float32")
    tiny = PRESETS["tiny"]
    doc_tied_chunked = tiny.replace(document_mask=True, tie_embeddings=True, loss_chunk=24)
    cases = [
        ("fsdp shard=2", tiny, ParallelConfig(**fp32)),
        ("hsdp (1,2) AC selective", tiny,
         ParallelConfig(replicate=1, shard=2, activation_checkpoint="selective", **fp32)),
        ("hsdp (2,1) AC full", tiny,
         ParallelConfig(replicate=2, shard=1, activation_checkpoint="full", **fp32)),
        ("fsdp doc-mask + tied + chunked loss", doc_tied_chunked, ParallelConfig(**fp32)),
        ("hsdp (2,1) doc-mask + tied + chunked loss", doc_tied_chunked, ParallelConfig(replicate=2, **fp32)),
    ]  # fmt: skip
    for name, mcfg, pcfg in cases:
        run_case(name, mcfg, pcfg, rank, world)
    # Mixed precision: FSDP's bf16 parameters vs single-process bf16 autocast are different roundings
    # of the same computation (autocast keeps the residual stream in float32), so only closeness.
    run_case("fsdp bf16 params, fp32 reduce vs bf16 autocast", tiny, ParallelConfig(), rank, world,
             tol=(BF16_LOSS_TOL, BF16_PARAM_TOL))  # fmt: skip
    meta_init_case(rank, world)
    if os.environ.get("GRISTMILL_SKIP_NEGATIVE_CONTROL") != "1":
        run_case("negative control: no grad reduction on step 1", tiny, ParallelConfig(**fp32), rank, world,
                 skip_sync_step=1, expect_equal=False)  # fmt: skip
    dist.barrier()
    if rank == 0:
        print("ALL CHECKS PASSED", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
