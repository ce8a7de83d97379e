"""The trainer: `python -m training.train --config RECIPE.toml [--set key=value ...]`, also under torchrun.

    torchrun --standalone --nproc_per_node=2 -m training.train --config configs/train/demo.toml \
        --set parallel.shard=2

Order of work: parse and check the whole config (batch arithmetic, mesh shape, model vs dataset
vocabulary) → process group (gloo on CPU, nccl on CUDA) → device mesh → model on the meta device
(or materialised, see run.init_device) → parallelize (AC, compile, FSDP2) → weights initialised
with the same seed on every rank → loader for this data-parallel rank → optimizer and schedule →
the loop. `train_step` (one optimizer step: zero grads, accumulate micro-batches, clip, step)
is separate from `forward_backward_step` (one micro-batch), torchtitan style. The objects a
checkpoint needs are grouped by training.checkpoint.state.checkpointables and saved/restored by
training.checkpoint.checkpointer.Checkpointer (`--resume auto|PATH`); SIGTERM/SIGINT finish the step, save
and return normally (exit 0).

A run owns its directory: rank 0 holds RUN/.gristmill.lock for the whole run (training.run_lock),
config.toml is written only once the resume checks passed, and under torchrun every worker exits
when its launcher dies (training.shutdown.exit_with_parent). A non-finite loss or gradient is
never applied (training.divergence) and stops the run with exit 3 by default.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.io import CheckpointError
from training.checkpoint.state import TrainState, checkpointables
from training.config import TrainConfig, load_train_config  # re-exported: `from training.train import …`
from training.config_checks import BatchShape, check_config, resolve_model_config, sources_of
from training.contract.config_loader import (  # the CLI helpers are re-exported too
    add_config_arguments,
    add_resume_argument,
    config_changes,
    config_sha256,
    save_config,
    to_dict,
    with_resume,
)
from training.contract.dataset_format import read_dataset_info
from training.contract.errors import GristmillError, NonFiniteError, unwritable
from training.contract.run_layout import CONFIG_TOML, CONSUMPTION_PARQUET, PLAN_PNG
from training.data import plan as data_plan
from training.data.loader import TokenLoader, dataset_loader
from training.data.recipe import format_plan, open_plan, plot_plan, write_consumption
from training.divergence import NonFiniteGuard, SpikeDetector, guarded_step, nonfinite_code
from training.faults import NanLoss
from training.metrics import (
    MetricsWriter,
    data_row,
    device_name,
    mfu,
    peak_flops,
    peak_memory_bytes,
    plot_loss,
    snapshot,
    step_row,
    update_ratio,
)
from training.model import Transformer, flops_per_token, num_params
from training.optim import (
    ScheduledLR,
    bitsandbytes_or_refuse,
    build_optimizer,
    clip_grad_norm,
    plan_scheduler,
)
from training.parallelize import autocast_context, build_mesh, mesh_shape, parallelize
from training.run_lock import RunLock
from training.shutdown import GracefulStop, exit_with_parent
from training.worker_reply import report_to_launcher


class StepEval(Protocol):
    """Eval during training (`[eval] interval`), supplied by the caller of `train`: lm-eval lives in
    validation/train_eval.py, which runs this trainer with one, so training/ never imports it."""

    def prepare(self, run_dir: Path, say: Callable[[str], None]) -> None:
        """On every rank once the run directory is owned and RUN/config.toml written: check the
        tasks and build their data before step 1 (a GristmillError on every rank when it fails)."""

    def __call__(self, model: nn.Module, step: int) -> dict[str, float]:
        """On every rank at an eval step (collective): rank 0's scores as metrics-row entries
        (`eval/<task>/<metric>`, `eval_s`), {} on the other ranks."""


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, from torchrun's environment (1 process when absent)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        return cls(int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0)))


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise GristmillError(
            "run.device = 'cuda' but torch sees no CUDA device; use run.device = 'auto' or 'cpu'"
        )
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def forward_backward_step(
    model: nn.Module, batch: dict[str, torch.Tensor], scale: float, amp
) -> torch.Tensor:
    """Loss of one micro-batch and its gradient, scaled by 1/accumulation steps; returns the loss detached."""
    with amp():
        loss = model(batch["input_ids"], labels=batch["labels"], position_ids=batch.get("position_ids"))
    (loss * scale).backward()
    return loss.detach()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: ScheduledLR,
    micro_batches: list[dict[str, torch.Tensor]],
    *,
    grad_clip: float,
    amp,
    measure_update: bool = False,
    world_size: int = 1,
) -> dict[str, Any]:
    """One optimizer step over this rank's micro-batches, not applied when the loss or gradient norm
    is not finite (`nonfinite` in the result: 0, or a code for training.divergence). Values stay on
    the device (no host sync) except the update ratio, which is only measured when asked (it copies
    the parameter shards)."""
    optimizer.zero_grad(set_to_none=True)
    scale = 1.0 / len(micro_batches)
    losses = [forward_backward_step(model, mb, scale, amp) for mb in micro_batches]
    loss = torch.stack(losses).mean()
    # After backward FSDP2 has resharded: these are the sharded (DTensor) parameters the optimizer holds.
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = clip_grad_norm(params, grad_clip)
    # Decided on the device: a non-finite loss (any rank) or gradient norm skips the update.
    code = nonfinite_code(loss, grad_norm, world_size)
    lr = scheduler.get_last_lr()[0]
    before = snapshot(params) if measure_update else None
    guarded_step(optimizer, code)
    scheduler.step()
    out: dict[str, Any] = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "nonfinite": code}
    if before is not None:
        out["update_ratio"] = update_ratio(params, before)
    return out


@torch.no_grad()
def evaluate(
    model: nn.Module, loader, start_state: dict, n_batches: int, amp, device, world_size: int
) -> float:
    """Mean loss over the first `n_batches` global batches of the held-out split (the same ones each time)."""
    loader.load_state_dict(start_state)
    model.eval()
    losses = []
    it = iter(loader)
    for _ in range(n_batches):
        for mb in next(it):
            mb = _to_device(mb, device)
            with amp():
                losses.append(
                    model(mb["input_ids"], labels=mb["labels"], position_ids=mb.get("position_ids"))
                )
    del it
    for module in model.modules():  # FSDP2 keeps the root unsharded after a forward without backward
        if isinstance(module, FSDPModule):
            module.reshard()
    model.train()
    # Every rank evaluated the same number of equal-sized micro-batches: the mean of means is exact.
    return _all_sum(torch.stack(losses).double().sum(), world_size, device).item() / (
        len(losses) * world_size
    )


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _all_sum(t: torch.Tensor, world_size: int, device: torch.device) -> torch.Tensor:
    if world_size > 1:
        t = t.to(device)
        dist.all_reduce(t)
    return t


def _all_max(value: float, world_size: int, device: torch.device) -> float:
    if world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def build_model(mcfg, cfg: TrainConfig, mesh, device: torch.device) -> nn.Module:
    """Model → parallelize → weights, seeded identically on every rank (see run.init_device)."""
    mode = cfg.run.init_device
    if mode == "auto":
        mode = "meta" if device.type == "cuda" else "full"
    if mode == "meta":
        with torch.device("meta"):
            model = Transformer(mcfg)
        model = parallelize(model, mesh, cfg.parallel)
        model.to_empty(device=device)
        torch.manual_seed(cfg.run.seed)
        with torch.no_grad():
            model.init_weights()
    else:  # whole model on every rank, then shard: identical weights whatever the world size
        torch.manual_seed(cfg.run.seed)
        with torch.device(device):
            model = Transformer(mcfg)
        with torch.no_grad():
            model.init_weights()
        model = parallelize(model, mesh, cfg.parallel)
    model.train()
    return model


def _header(cfg, mcfg, plans: list[BatchShape], env: DistEnv, device, mesh, model, fpt, peak) -> list[str]:
    n = num_params(model)
    n_ne = num_params(model, exclude_embeddings=True)
    mesh_txt = "none (1 process)" if mesh is None else f"{tuple(mesh.shape)} {mesh.mesh_dim_names}"
    amp = (
        "bf16 autocast"
        if (mesh is None and cfg.parallel.param_dtype == "bfloat16")
        else cfg.parallel.param_dtype
    )
    lines = [
        f"gristmill train → {cfg.run.output_dir}",
        f"  model   preset {cfg.model.preset}: {n:,} params ({n_ne:,} without embeddings), dim {mcfg.dim}, "
        f"{mcfg.n_layers} layers, {mcfg.n_heads}/{mcfg.n_kv_heads} heads, vocab {mcfg.vocab_size}",
        *(
            f"  batch   {'' if len(plans) == 1 else f'{p.name}: '}{p.global_batch} seqs × {p.seq_len} = "
            f"{p.tokens_per_step:,} tokens/step = {p.dp_size} rank{'s' * (p.dp_size != 1)} × "
            f"{p.micro_batch} micro × {p.grad_accum} accumulation"
            for p in plans
        ),
        f"  run     {_count(env.world_size, 'process', 'processes')} on {device_name(device)}, "
        f"mesh {mesh_txt}, compute {amp}, "
        + f"{sum(p.steps for p in plans)} steps in {_count(len(plans), 'phase')} (plan below)",
        f"  flops   {fpt:,} FLOPs/token = 6·N_matmul + 12·L·d·T, LM head counted in N_matmul; "
        + (
            f"MFU vs {peak / 1e12:.0f} TFLOP/s dense bf16 peak per device"
            if peak
            else f"MFU not reported (no known peak for {device_name(device)!r})"
        ),
    ]
    return lines


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def preflight(cfg: TrainConfig, env: DistEnv) -> tuple[list[BatchShape], Any, torch.device]:
    """Every check that needs no process group, model or GPU memory: batch arithmetic, the mesh
    shape, the model against the dataset (vocabulary, separator, sequence length), the device and
    the optimizer.
    Raises GristmillError with the numbers; returns (batch plan per phase, ModelConfig, device)."""
    plans = check_config(cfg, env.world_size)
    mesh_shape(cfg.parallel, env.world_size)  # replicate × shard = world size
    info = read_dataset_info(sources_of(cfg)[0].dataset)
    mcfg = resolve_model_config(cfg.model, info, max(p.seq_len for p in plans))
    device = pick_device(cfg.run.device, env.local_rank)
    if cfg.optim.name == "adamw8bit":
        bitsandbytes_or_refuse(device.type, sharded=env.world_size > 1)
    return plans, mcfg, device


def train(cfg: TrainConfig, out=None, evaluator: StepEval | None = None) -> dict[str, Any]:
    """Run the whole recipe; returns a summary (rank 0's view). Raises GristmillError on bad input,
    NonFiniteError (a GristmillError) when training diverged. `evaluator`: what scores the model at
    eval.interval (validation.train_eval passes one; required when eval.interval > 0)."""
    env = DistEnv.from_environ()
    if cfg.eval.interval and evaluator is None:
        raise GristmillError(
            f"eval.interval = {cfg.eval.interval} needs lm-eval inside the training processes, which "
            "`-m training.train` never imports: start the run with `gristmill train` (it does the "
            "next thing for you) or `torchrun … -m validation.train_eval --config …`, or set eval.interval=0"
        )
    plan, mcfg, device = preflight(cfg, env)
    # --- checks done; from here on the run does work ---
    threads = torch.get_num_threads()
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    pg_started = False
    if env.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        pg_started = True
    try:
        with _own_run_dir(Path(cfg.run.output_dir), env, out):
            return loop(setup(cfg, mcfg, plan, env, device, out, evaluator))
    finally:
        if pg_started:
            dist.destroy_process_group()
        torch.set_num_threads(threads)  # an in-process caller (gristmill demo, tests) keeps its setting


def raise_rank0_problem(problem: str | None, world_size: int) -> None:
    """Every rank raises rank 0's problem as a GristmillError, or none does (collective when
    world_size > 1): a check only rank 0 makes stops the whole job with its message."""
    if world_size > 1:
        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem is not None:
        raise GristmillError(problem)


@contextlib.contextmanager
def _own_run_dir(run_dir: Path, env: DistEnv, out):
    """Rank 0 holds the run directory's lock for the run; every rank stops if it could not."""
    lock, problem = None, None
    if env.rank == 0:
        try:
            lock = RunLock(run_dir).acquire()
            if lock.note:
                print(lock.note, file=out or sys.stdout, flush=True)
        except GristmillError as e:
            problem = str(e)
        except OSError as e:
            problem = str(unwritable(run_dir, e))
    raise_rank0_problem(problem, env.world_size)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def loader_settings(cfg: TrainConfig, bp: BatchShape, env: DistEnv, device: torch.device) -> dict[str, Any]:
    """What every loader of the run shares: this data-parallel rank, workers, checks, pinning."""
    d = cfg.data
    return dict(
        rank=env.rank,  # every rank is a data-parallel rank
        world_size=bp.dp_size,
        num_workers=d.num_workers,
        check_separators=d.check_separators,
        pin_memory=device.type == "cuda",
    )


class Validation:
    """Held-out loss per source: the first `val_batches` global batches of each source's held-out
    split (the same ones every time), at the current phase's seq_len and batch; a phase with
    another seq_len gets loaders of its own. The total (`val_loss`) weights the sources by the
    current phase's mix (equally where the phase uses none of them)."""

    def __init__(self, cfg: TrainConfig, plans: list[BatchShape], data: data_plan.Plan, env: DistEnv,
                 device: torch.device, vocab_size: int):  # fmt: skip
        self.cfg, self.plans, self.data, self.env = cfg, plans, data, env
        self.device, self.vocab_size = device, vocab_size
        self.sources = [s for s in sources_of(cfg) if s.val_fraction > 0]
        self._loaders: dict[tuple[str, int, int], tuple[TokenLoader, dict]] = {}
        for p in range(len(plans) if self.sources else 0):
            self.loaders(p)  # a held-out split too small for a phase's batch fails before any work

    def loaders(self, p: int) -> list[tuple[str, TokenLoader, dict]]:
        bp, d = self.plans[p], self.cfg.data
        out = []
        for src in self.sources:
            key = (src.name, bp.seq_len, bp.micro_batch)
            if key not in self._loaders:
                loader = dataset_loader(
                    src.dataset,
                    split="val",
                    seq_len=bp.seq_len,
                    global_batch=bp.global_batch,
                    micro_batch=bp.micro_batch,
                    seed=d.seed,
                    val_fraction=src.val_fraction,
                    expect_vocab_size=self.vocab_size,
                    **loader_settings(self.cfg, bp, self.env, self.device),
                )
                self._loaders[key] = (loader, loader.state_dict())
            out.append((src.name, *self._loaders[key]))
        return out

    def __call__(self, model: nn.Module, step: int, amp) -> dict[str, float]:
        p, _ = self.data.locate(step - 1)
        losses = {
            name: evaluate(
                model, loader, start, self.cfg.run.val_batches, amp, self.device, self.env.world_size
            )
            for name, loader, start in self.loaders(p)
        }
        names = [s.name for s in self.data.sources]
        weights = {n: self.data.phases[p].weights[names.index(n)] for n in losses}
        if not sum(weights.values()):
            weights = dict.fromkeys(losses, 1)
        out = {"val_loss": sum(weights[n] * v for n, v in losses.items()) / sum(weights.values())}
        if len(self.data.sources) > 1:
            out.update({f"val/{n}": v for n, v in losses.items()})
        return out


@dataclass
class Run:
    """What `setup` builds and `loop` trains with."""

    cfg: TrainConfig
    plans: list[BatchShape]  # per phase
    data: data_plan.Plan  # which tokens of which source every step takes, and the LR
    env: DistEnv
    device: torch.device
    run_dir: Path
    model: nn.Module
    amp: Any  # a context factory: bf16 autocast in one process, nothing under FSDP
    loader: TokenLoader
    validation: Validation | None
    evaluator: StepEval | None  # lm-eval at eval.interval (None: off)
    optimizer: torch.optim.Optimizer
    scheduler: ScheduledLR
    state: TrainState
    states: dict[str, Any]  # checkpointables(...): what a checkpoint saves and restores
    ckpt: Checkpointer
    writer: MetricsWriter | None  # rank 0 only
    last: int  # the last step of this invocation
    fpt: list[int]  # model FLOPs per token in each phase (attention grows with seq_len), for MFU
    peak: float | None  # the device's dense bf16 peak FLOP/s, None where unknown
    say: Callable[[str], None]  # prints on rank 0 only


def setup(
    cfg: TrainConfig, mcfg, plans: list[BatchShape], env: DistEnv, device: torch.device, out, evaluator=None
) -> Run:
    """Mesh, loaders, model, optimizer, schedule, checkpointer (and the resume), metrics writer."""
    mesh = build_mesh(cfg.parallel, env.world_size, device.type)
    # Loaders before the model: a dataset too small for one global batch, or a source the plan
    # would run out of, fails before the big allocations.
    data, tables, notes = open_plan(cfg, expect_vocab_size=mcfg.vocab_size)
    loader = TokenLoader(
        data,
        tables,
        micro_batch=tuple(p.micro_batch for p in plans),
        **loader_settings(cfg, plans[0], env, device),
    )
    validation = Validation(cfg, plans, data, env, device, mcfg.vocab_size) if cfg.run.val_every > 0 else None
    if validation is not None and not validation.sources:
        validation = None

    run_dir = Path(cfg.run.output_dir)
    is_main = env.rank == 0
    model = build_model(mcfg, cfg, mesh, device)
    amp = functools.partial(autocast_context, cfg.parallel, mesh, device.type)  # bf16 autocast w/o FSDP
    optimizer = build_optimizer(model, cfg.optim, device.type, sharded=mesh is not None)
    scheduler = plan_scheduler(optimizer, data)
    state = TrainState(rank=env.rank)
    states = checkpointables(model, optimizer, scheduler, loader, state)
    last = cfg.run.max_steps or data.total_steps

    def say(text: str) -> None:
        if is_main:
            print(text, file=out or sys.stdout, flush=True)

    # --resume is how a run started, not what it trains: it is left out of the config hash.
    unresumed = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, resume=""))
    ckpt = Checkpointer(
        cfg.checkpoint,
        run_dir,
        states,
        rank=env.rank,
        world_size=env.world_size,
        last_step=last,
        config_sha256=config_sha256(unresumed),
        estimate_bytes=num_params(model) * 4 * 3,  # fp32 weights + AdamW's two moments
        model_config=dataclasses.asdict(mcfg),  # recorded in COMPLETE, checked before a resume loads
        log=say,
    )
    resumed = ckpt.resume(cfg.checkpoint.resume)  # before iter(loader): restores its position
    # Only now, with the resume checks passed: a refused resume leaves the run's config.toml as it was.
    if is_main:
        if resumed is not None:
            for line in _changes_since(run_dir / CONFIG_TOML, cfg, resumed):
                say(line)
        try:
            save_config(cfg, run_dir / CONFIG_TOML)
        except OSError as e:
            raise unwritable(run_dir, e) from None

    if is_main and cfg.metrics.plot:
        note = plot_plan(data, run_dir / PLAN_PNG)
        if note:
            say(note)
    fpt = [flops_per_token(mcfg, p.seq_len, include_lm_head=True) for p in plans]
    peak = peak_flops(device_name(device)) if device.type == "cuda" else None
    writer = None
    if is_main:
        writer = MetricsWriter(
            run_dir,
            metrics=cfg.metrics,
            config=to_dict(cfg),
            datasets={src.name: src.dataset for src in sources_of(cfg)},
            out=out,
            resume_step=resumed,
        )
        for line in _header(cfg, mcfg, plans, env, device, mesh, model, fpt[0], peak):
            writer.print(line)
        for line in format_plan(data, notes):
            writer.print(f"  plan    {line}")
    if evaluator is not None:
        evaluator.prepare(run_dir, say)  # needs RUN/config.toml (the tasks' held-out documents)
    if resumed is not None:
        for note in loader.resume_notes:
            say(f"note: {note}")
        say(f"resumed at step {resumed} ({state.tokens_seen:,} tokens seen); training to step {last}")
        if resumed >= last:
            say(f"nothing to do: the checkpoint is at step {resumed} ≥ the last step {last}")
    return Run(cfg, plans, data, env, device, run_dir, model, amp, loader, validation, evaluator, optimizer,
               scheduler, state, states, ckpt, writer, last, fpt, peak, say)  # fmt: skip


def _changes_since(path: Path, cfg: TrainConfig, step: int) -> list[str]:
    """A resume's note of what differs from the run's saved config.toml (the optimizer, the schedule
    and the run settings are this config's from the next step on; the data and the model are
    checked apart and refused when they changed)."""
    try:
        before = load_train_config(path, [])
    except (GristmillError, OSError):
        return []  # no or an unreadable earlier config: nothing to compare with
    changes = config_changes(before, cfg, ignore=("checkpoint.resume",))
    if not changes:
        return []
    shown = ", ".join(changes[:8]) + (f" (+{len(changes) - 8} more)" if len(changes) > 8 else "")
    return [f"note: changed since {path} was written: {shown}; in effect from step {step + 1}"]


def loop(r: Run) -> dict[str, Any]:
    """Train from the state's step to `r.last`: log, validate, save, stop on a signal or divergence.
    Returns the summary (rank 0's view)."""
    cfg, env, device, state, ckpt, writer = r.cfg, r.env, r.device, r.state, r.ckpt, r.writer
    first_loss = last_loss = val_loss = None
    start = state.step  # a resumed run's summary covers its own steps, not the whole run's
    stopped_by = None
    t_start = t_window = time.perf_counter()
    tokens_window = 0
    guard = NonFiniteGuard(device)
    spikes = SpikeDetector(cfg.run.spike_window, cfg.run.spike_sigma)
    fault = NanLoss(r.model, env.rank)  # tests only: GRISTMILL_FAULT_NAN_LOSS
    train_iter = iter(r.loader)
    shutdown = GracefulStop(env.world_size).__enter__()

    def fatal(report: dict[str, Any]) -> bool:
        return report["skipped"] > 0 and (
            cfg.run.on_nonfinite == "stop" or report["consecutive"] >= cfg.run.max_skipped
        )

    def diverged(report: dict[str, Any], step: int) -> None:
        """Stop (NonFiniteError) if the skipped steps the host just heard of call for it."""
        if not fatal(report):
            return
        try:
            ckpt.close()  # a save still in flight holds finite weights from before: let it complete
        except CheckpointError as e:  # said, but the divergence stays the error (exit 3)
            r.say(f"error: {e}")
        if writer is not None and cfg.metrics.plot:
            plot_loss(writer.history, r.run_dir / "loss.png")
        why = (
            f"step {report['first_step']}: the {report['what']} is not finite (NaN or inf)"
            if cfg.run.on_nonfinite == "stop"
            else f"{report['consecutive']} consecutive steps up to step {step} had a non-finite loss or "
            f"gradient (run.max_skipped = {cfg.run.max_skipped}; the last: {report['what']})"
        )
        raise NonFiniteError(
            f"{why}; no update of a non-finite step was applied and nothing was saved after it. Last "
            f"complete checkpoint: {ckpt.newest_complete()}. Lower optim.lr (now {cfg.optim.lr:g}) or check "
            f"the data, then resume: gristmill train --config {r.run_dir / CONFIG_TOML} --resume auto"
        )

    try:
        for step in range(state.step + 1, r.last + 1):
            ckpt.poll()  # raises if a background save failed
            micro_batches = [_to_device(mb, device) for mb in next(train_iter)]
            do_val = r.validation is not None and (step % cfg.run.val_every == 0 or step == r.last)
            phase, k = r.data.locate(step - 1)
            if k == 0 and phase > 0:
                ph = r.data.phases[phase]
                r.say(f"phase {ph.name!r} begins at step {step}: seq_len {ph.seq_len}, {ph.global_batch} "
                      f"sequences per step, {ph.steps} steps")  # fmt: skip
            do_eval = r.evaluator is not None and (step % cfg.eval.interval == 0 or step == r.last)
            do_log = step % cfg.run.log_every == 0 or step in (1, r.last) or do_val or do_eval
            fault.arm(step)
            res = train_step(
                r.model,
                r.optimizer,
                r.scheduler,
                micro_batches,
                grad_clip=cfg.optim.grad_clip,
                amp=r.amp,
                measure_update=do_log,
                world_size=env.world_size,
            )
            guard.record(step, res["nonfinite"])
            state.step = step
            state.tokens_seen += r.plans[phase].tokens_per_step
            tokens_window += r.plans[phase].tokens_per_step
            if do_log:
                report = guard.read()
                skipped = guard.take_unlogged()
                loss = _all_sum(res["loss"].double(), env.world_size, device).item() / env.world_size
                elapsed = time.perf_counter() - t_window  # the loss all-reduce synchronised the step
                m = step_row(
                    step,
                    loss,
                    res,
                    tokens_per_s=tokens_window / elapsed,
                    tokens_seen=state.tokens_seen,
                    skipped=skipped,
                    spike=spikes.check(loss),
                    mfu=mfu(tokens_window / elapsed, env.world_size, r.fpt[phase], r.peak),
                    peak_memory_bytes=int(_all_max(peak_memory_bytes(device), env.world_size, device)),
                )
                m.update(ckpt.take_timings())  # checkpoint_stage_s/_wait_s of the saves since the last row
                consumed = r.data.consumed(step) if writer is not None else []
                if writer is not None:
                    m.update(data_row(r.data, step, consumed))
                if do_val and not fatal(report):  # skipped updates left the weights finite
                    m.update(r.validation(r.model, step, r.amp))
                    val_loss = m["val_loss"]
                if do_eval and not fatal(report):
                    m.update(r.evaluator(r.model, step))
                m["elapsed_s"] = time.perf_counter() - t_start
                first_loss = loss if first_loss is None else first_loss
                last_loss = loss
                if writer is not None:
                    writer.log(m)
                    write_consumption(r.data, step, consumed, r.run_dir / CONSUMPTION_PARQUET)
                    for event in m.get("events", []):
                        writer.print(f"WARNING step {step}: {event}")
                diverged(report, step)
                t_window, tokens_window = time.perf_counter(), 0  # validation and eval are not training time
            stop = shutdown.should_stop()  # every rank agrees, whichever ones were signalled
            if stop or ckpt.due(step):
                if not do_log:
                    diverged(guard.read(), step)  # the host hears of skipped steps before any save
                ckpt.save(step, state.tokens_seen, blocking=stop is not None)
            if stop:
                stopped_by = stop
                r.say(f"stopping after step {step} on {stop}: checkpoint saved; resume with --resume auto")
                break
        ckpt.close()  # waits for an async save in flight
    except BaseException:
        ckpt.abandon()  # the lock and the process group outlive no background write
        raise
    finally:
        shutdown.__exit__()
        if writer is not None:
            writer.close()
    summary = {
        "run_dir": str(r.run_dir),
        "steps": state.step,
        "stopped_by": stopped_by,
        "first_loss": first_loss,
        "final_loss": last_loss,
        "val_loss": val_loss,
        "seconds": time.perf_counter() - t_start,
        "states": r.states,
    }
    if writer is not None and last_loss is not None:
        note = plot_loss(writer.history, r.run_dir / "loss.png") if cfg.metrics.plot else None
        writer.print(
            note
            or f"loss {first_loss:.4f} → {last_loss:.4f} over steps {start + 1}–{state.step} "
            f"({state.step - start} steps{' since the resume' if start else ''}), "
            f"{summary['seconds']:.0f} s{_whole_run(writer.history, start)}; curve: {r.run_dir / 'loss.png'}"
        )
    return summary


def _whole_run(history: list[dict[str, Any]], start: int) -> str:
    """After a resume, the whole run's first logged loss too (metrics.jsonl keeps the rows before it)."""
    if not start or not history or history[0]["step"] > start:
        return ""
    return (
        f"; the whole run: {history[0]['loss']:.4f} at step {history[0]['step']} → {history[-1]['loss']:.4f}"
    )


def main(
    argv: list[str] | None = None,
    make_evaluator: Callable[[TrainConfig], StepEval] | None = None,
    prog: str = "python -m training.train",
) -> int:
    """The trainer's command line; `make_evaluator` builds the eval-during-training hook from the
    config (validation.train_eval's entry point passes one)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    add_config_arguments(parser, "configs/train/demo.toml", "optim.lr=1e-4 parallel.shard=2")
    add_resume_argument(parser)
    args = parser.parse_args(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: never outlive the launcher
        exit_with_parent()
    try:
        cfg = load_train_config(args.config, with_resume(args.overrides, args.resume))
        evaluator = make_evaluator(cfg) if make_evaluator is not None and cfg.eval.interval else None
        train(cfg, evaluator=evaluator)
    except GristmillError as e:
        # Config and data errors are the same on every rank: said once, by rank 0. Every rank also
        # leaves it for the launcher, which prints it when no rank printed (an error that only
        # this rank met: its shard, its disk; training/worker_reply.py).
        rank = DistEnv.from_environ().rank
        report_to_launcher(f"rank {rank}: {e}", printed=rank == 0)
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
