"""The trainer: `python -m training.train --config RECIPE.toml [--set key=value ...]`, also under torchrun.

    torchrun --standalone --nproc_per_node=2 -m training.train --config configs/train/demo.toml \
        --set parallel.shard=2

Order of work: parse the config → process group (gloo on CPU, nccl on CUDA) → check the whole
config (batch arithmetic, mesh shape, model vs dataset vocabulary; a `[model] init_from` base
located, a hub id downloaded by rank 0 while the others wait) → device mesh → model on the meta
device (or materialised, see run.init_device) → parallelize (AC, compile, FSDP2) → weights
initialised with the same seed on every rank → loader for this data-parallel rank → optimizer and
schedule → the resume, or the base's weights → (init_from with [eval]: step 0's eval) → the loop.
`train_step` (one optimizer step: zero grads, accumulate micro-batches, clip, step) is separate
from `forward_backward_step` (one micro-batch), torchtitan style. The objects a
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from training.checkpoint.base_record import record_base
from training.checkpoint.base_source import BaseSource, locate_base
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.hf_import import check_base_data, load_base_weights
from training.checkpoint.io import resume_model_record
from training.checkpoint.state import TrainState, checkpointables
from training.config import TrainConfig, load_train_config  # re-exported: `from training.train import …`
from training.config_checks import BatchShape, check_config, resolve_model_config, seq_lens_of, sources_of
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
from training.contract.errors import GristmillError, unwritable
from training.contract.run_layout import CONFIG_TOML, PLAN_PNG
from training.data import plan as data_plan
from training.data.loader import TokenLoader, dataset_loader
from training.data.recipe import format_plan, open_plan, plot_plan, record_plan
from training.divergence import (
    DivergencePolicy,
    NonFiniteGuard,
    SpikeDetector,
    guarded_step,
    nonfinite_code,
)
from training.faults import LossFaults
from training.metrics import (
    MetricsWriter,
    ReaderSafeOut,
    TrainingMetrics,
    device_name,
    mfu,
    peak_flops,
    peak_memory_bytes,
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
from training.parallelize import autocast_context, build_mesh, float8_or_refuse, mesh_shape, parallelize
from training.rewind import Rewinder
from training.run_lock import RunLock
from training.shutdown import GracefulStop, exit_with_parent
from training.worker_reply import report_to_launcher


class StepEval(Protocol):
    """Eval during training (`[eval] interval`), supplied by the caller of `train`: lm-eval lives in
    validation/train_eval.py, which runs this trainer with one, so training/ never imports it."""

    def prepare(self, run_dir: Path, say: Callable[[str], None]) -> None:
        """On every rank once the run directory is owned and RUN/config.toml written: check the
        tasks and build their data before step 1 (a GristmillError on every rank when it fails)."""

    def __call__(self, model: nn.Module, step: int) -> dict[str, float | str]:
        """On every rank at an eval step (collective): rank 0's scores as metrics-row entries
        (`eval/<task>/<metric>`, `eval_s`; `eval_error`, a line, when it failed: never raises), {}
        on the other ranks. Called after the step's checkpoint, when one is due, is saved."""


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


def build_model(model_config, cfg: TrainConfig, mesh, device: torch.device) -> nn.Module:
    """Model → parallelize → weights, seeded identically on every rank (see run.init_device). A
    base model's weights ([model] init_from) replace them in `setup`, unless a resume loads a checkpoint."""
    mode = cfg.run.init_device
    if mode == "auto":
        mode = "meta" if device.type == "cuda" else "full"
    if mode == "meta":
        with torch.device("meta"):
            model = Transformer(model_config)
        model = parallelize(model, mesh, cfg.parallel)
        model.to_empty(device=device)
        torch.manual_seed(cfg.run.seed)
        with torch.no_grad():
            model.init_weights()
    else:  # whole model on every rank, then shard: identical weights whatever the world size
        torch.manual_seed(cfg.run.seed)
        with torch.device(device):
            model = Transformer(model_config)
        with torch.no_grad():
            model.init_weights()
        model = parallelize(model, mesh, cfg.parallel)
    model.train()
    return model


def _header(
    cfg, model_config, shapes: list[BatchShape], env: DistEnv, device, mesh, model, flops, peak
) -> list[str]:
    """The run's header lines: model, each source's dataset, batch per phase, processes and mesh,
    FLOPs per token and MFU."""
    params = num_params(model)
    params_without_embeddings = num_params(model, exclude_embeddings=True)
    mesh_txt = "none (1 process)" if mesh is None else f"{tuple(mesh.shape)} {mesh.mesh_dim_names}"
    amp = (
        "bf16 autocast"
        if (mesh is None and cfg.parallel.param_dtype == "bfloat16")
        else cfg.parallel.param_dtype
    )
    if model_config.float8:
        amp += " + float8 block linears (torchao)"
    return [
        f"gristmill train → {cfg.run.output_dir}",
        f"  model   preset {cfg.model.preset}: {params:,} params ({params_without_embeddings:,} without "
        f"embeddings), dim {model_config.dim}, {model_config.n_layers} layers, "
        f"{model_config.n_heads}/{model_config.n_kv_heads} heads, vocab {model_config.vocab_size}"
        + (f", from the base {model_config.init_from}" if model_config.init_from else ""),
        # data.dataset has a default (runs/data/demo): name what is trained on, whichever way it came.
        "  data    " + ", ".join(f"{src.name} = {src.dataset}" for src in sources_of(cfg)),
        *(
            f"  batch   {'' if len(shapes) == 1 else f'{s.name}: '}{s.global_batch} seqs × {s.seq_len} = "
            f"{s.tokens_per_step:,} tokens/step = {_count(s.dp_size, 'rank')} × "
            f"{s.micro_batch} micro × {s.grad_accum} accumulation"
            for s in shapes
        ),
        f"  run     {_count(env.world_size, 'process', 'processes')} on {device_name(device)}, "
        f"mesh {mesh_txt}, compute {amp}, "
        + f"{sum(s.steps for s in shapes)} steps in {_count(len(shapes), 'phase')}"
        + (f", stopping at step {cfg.run.max_steps} (run.max_steps)" if cfg.run.max_steps else "")
        + " (plan below)",
        f"  flops   {flops:,} FLOPs/token = 6·N_matmul + 12·L·d·T, LM head counted in N_matmul; "
        + (
            f"MFU vs {peak / 1e12:.0f} TFLOP/s dense bf16 peak per device"
            + (
                " (a float8 run: against the bf16 peak, as the reference runs report it)"
                if model_config.float8
                else ""
            )
            if peak
            else f"MFU not reported (no known peak for {device_name(device)!r})"
        ),
    ]


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def preflight(cfg: TrainConfig, env: DistEnv) -> tuple[list[BatchShape], Any, torch.device, Path | None]:
    """Every check that needs no model or GPU memory: batch arithmetic, the mesh shape, the model
    against the dataset (vocabulary, separator, sequence length), the base model of init_from
    against the data, the device and the optimizer.
    Raises GristmillError with the numbers; returns (batch plan per phase, ModelConfig, device, the
    base's directory: None without init_from or when a resume's checkpoint stands for it)."""
    shapes = check_config(cfg, env.world_size)
    mesh_shape(cfg.parallel, env.world_size)  # replicate × shard = world size
    info = read_dataset_info(sources_of(cfg)[0].dataset)
    source = _locate_base(cfg, env) if cfg.model.init_from else None
    model_config = resolve_model_config(cfg.model, info, seq_lens_of(cfg), source)
    if source is not None and source.directory is not None:  # the data must match the base, before any work
        dataset = sources_of(cfg)[0].dataset  # every source of a mixture shares one tokenizer
        notes = check_base_data(source.directory, dataset, info, model_config.vocab_size)
        for note in notes if env.rank == 0 else ():
            print(note, flush=True)
    device = pick_device(cfg.run.device, env.local_rank)
    if cfg.optim.name == "adamw8bit":
        bitsandbytes_or_refuse(device.type, sharded=env.world_size > 1)
    if model_config.float8:
        float8_or_refuse(device)
    return shapes, model_config, device, None if source is None else source.directory


def _locate_base(cfg: TrainConfig, env: DistEnv) -> BaseSource:
    """model.init_from located (training/checkpoint/base_source.py), a resume's recorded base where
    the base is not read again. Rank 0 first: a hub id is downloaded by rank 0 while the others
    wait, then they read its snapshot at the commit rank 0 pinned (a branch that moves meanwhile
    cannot split the ranks); a launcher's preflight (no process group) fetches alone."""
    recorded = resume_model_record(cfg.run.output_dir, cfg.checkpoint.resume)
    say = print if env.rank == 0 else None
    together = env.world_size > 1 and dist.is_initialized()
    if not together:
        source = locate_base(cfg.model.init_from, recorded, say)
    else:
        problem, source = None, None
        if env.rank == 0:
            try:
                source = locate_base(cfg.model.init_from, recorded, say)
            except GristmillError as e:
                problem = str(e)
        box = [problem, None if source is None else source.identity]
        dist.broadcast_object_list(box, src=0)  # the others wait here for rank 0's download
        if box[0] is not None:
            raise GristmillError(box[0])
        if source is None:
            source = locate_base(box[1], recorded)
    if source.note and env.rank == 0:
        print(source.note, flush=True)
    return source


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
    device = pick_device(cfg.run.device, env.local_rank)
    out = out if out is not None else ReaderSafeOut(sys.stdout)  # a closed stdout never costs the run
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
        # The checks, once the process group is up: rank 0 alone downloads a hub base (_locate_base).
        shapes, model_config, device, base_dir = preflight(cfg, env)
        # --- checks done; from here on the run does work ---
        with _own_run_dir(Path(cfg.run.output_dir), env, out):
            run = setup(cfg, model_config, shapes, env, device, out, evaluator, base_dir)
            evaluate_base(run)
            return loop(run)
    finally:
        if pg_started:
            dist.destroy_process_group()
        torch.set_num_threads(threads)  # an in-process caller (gristmill demo, tests) keeps its setting


def evaluate_base(run: Run) -> None:
    """Step 0 of a run from a base model ([model] init_from) with [eval]: the base's scores before
    any update, so the first rows of eval.parquet are the baseline (RUN/eval/step-000000; no
    metrics.jsonl row: no step was trained). Not on a resume: they are there already."""
    if run.evaluator is not None and run.model.cfg.init_from and run.state.step == 0:
        run.evaluator(run.model, 0)


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


def loader_settings(
    cfg: TrainConfig, shape: BatchShape, env: DistEnv, device: torch.device
) -> dict[str, Any]:
    """What every loader of the run shares: this data-parallel rank, workers, checks, pinning."""
    data = cfg.data
    return dict(
        rank=env.rank,  # every rank is a data-parallel rank
        world_size=shape.dp_size,
        num_workers=data.num_workers,
        check_separators=data.check_separators,
        pin_memory=device.type == "cuda",
    )


class Validation:
    """Held-out loss per source: the first `val_batches` global batches of each source's held-out
    split (the same ones every time), at the current phase's seq_len and batch; a phase with
    another seq_len gets loaders of its own. The total (`val_loss`) weights the sources by the
    current phase's mix (equally where the phase uses none of them)."""

    def __init__(
        self,
        cfg: TrainConfig,
        shapes: list[BatchShape],
        data: data_plan.Plan,
        env: DistEnv,
        device: torch.device,
        vocab_size: int,
    ):
        self.cfg, self.shapes, self.data, self.env = cfg, shapes, data, env
        self.device, self.vocab_size = device, vocab_size
        self.sources = [s for s in sources_of(cfg) if s.val_fraction > 0]
        self._loaders: dict[tuple[str, int, int], tuple[TokenLoader, dict]] = {}
        for phase in range(len(shapes) if self.sources else 0):
            self.loaders(phase)  # a held-out split too small for a phase's batch fails before any work

    def loaders(self, phase: int) -> list[tuple[str, TokenLoader, dict]]:
        shape = self.shapes[phase]
        out = []
        for src in self.sources:
            key = (src.name, shape.seq_len, shape.micro_batch)
            if key not in self._loaders:
                loader = dataset_loader(
                    src.dataset,
                    split="val",
                    seq_len=shape.seq_len,
                    global_batch=shape.global_batch,
                    micro_batch=shape.micro_batch,
                    seed=self.cfg.data.seed,
                    val_fraction=src.val_fraction,
                    expect_vocab_size=self.vocab_size,
                    **loader_settings(self.cfg, shape, self.env, self.device),
                )
                self._loaders[key] = (loader, loader.state_dict())
            out.append((src.name, *self._loaders[key]))
        return out

    def __call__(self, model: nn.Module, step: int, amp) -> dict[str, float]:
        phase, _ = self.data.locate(step - 1)
        losses = {
            name: evaluate(
                model, loader, start, self.cfg.run.val_batches, amp, self.device, self.env.world_size
            )
            for name, loader, start in self.loaders(phase)
        }
        names = [s.name for s in self.data.sources]
        weights = {n: self.data.phases[phase].weights[names.index(n)] for n in losses}
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
    shapes: list[BatchShape]  # the batch shape of each phase
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
    checkpointables: dict[str, Any]  # checkpointables(...): what a checkpoint saves and restores
    checkpointer: Checkpointer
    writer: MetricsWriter | None  # rank 0 only
    metrics: TrainingMetrics  # the rows of logged steps and the summary line (written on rank 0)
    guard: NonFiniteGuard  # device-side tally of the steps not applied
    divergence: DivergencePolicy  # when those steps stop the run
    spikes: SpikeDetector
    rewinder: Rewinder  # run.on_spike / on_nonfinite = "rewind" (training/rewind.py)
    fault: LossFaults  # tests only: GRISTMILL_FAULT_NAN_LOSS, GRISTMILL_FAULT_SPIKE_WINDOW
    last_step: int  # the last step of this invocation
    flops_per_token: list[int]  # model FLOPs per token in each phase (attention grows with seq_len), for MFU
    peak_flops: float | None  # the device's dense bf16 peak FLOP/s, None where unknown
    say: Callable[[str], None]  # prints on rank 0 only


def setup(
    cfg: TrainConfig,
    model_config,
    shapes: list[BatchShape],
    env: DistEnv,
    device: torch.device,
    out,
    evaluator: StepEval | None = None,
    base_dir: Path | None = None,
) -> Run:
    """Mesh, loaders, model, optimizer, schedule, checkpointer (and the resume, or the base's weights
    from `base_dir`, where preflight located [model] init_from), metrics writer."""
    mesh = build_mesh(cfg.parallel, env.world_size, device.type)
    # Loaders before the model: a dataset too small for one global batch, or a source the plan
    # would run out of, fails before the big allocations.
    # init_from: the data's vocabulary may be smaller than the base model's (preflight checked it).
    data_vocab = read_dataset_info(sources_of(cfg)[0].dataset)["vocab_size"]
    data, tables, notes = open_plan(cfg, expect_vocab_size=data_vocab)
    loader = TokenLoader(
        data,
        tables,
        micro_batch=tuple(shape.micro_batch for shape in shapes),
        **loader_settings(cfg, shapes[0], env, device),
    )
    validation = None
    if cfg.run.val_every > 0:
        validation = Validation(cfg, shapes, data, env, device, data_vocab)
        if not validation.sources:
            validation = None

    run_dir = Path(cfg.run.output_dir)
    is_main = env.rank == 0
    model = build_model(model_config, cfg, mesh, device)
    amp = functools.partial(autocast_context, cfg.parallel, mesh, device.type)  # bf16 autocast w/o FSDP
    optimizer = build_optimizer(model, cfg.optim, device.type, sharded=mesh is not None)
    scheduler = plan_scheduler(optimizer, data)
    state = TrainState(rank=env.rank)
    states = checkpointables(model, optimizer, scheduler, loader, state)
    last_step = cfg.run.max_steps or data.total_steps

    def say(text: str) -> None:
        if is_main:
            print(text, file=out or sys.stdout, flush=True)

    # RUN/config.toml and the config hash name the base the run resolved (a hub id: at its commit).
    resolved = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, init_from=model_config.init_from or None)
    )
    # --resume is how a run started, not what it trains: it is left out of the config hash.
    unresumed = dataclasses.replace(resolved, checkpoint=dataclasses.replace(cfg.checkpoint, resume=""))
    checkpointer = Checkpointer(
        cfg.checkpoint,
        run_dir,
        states,
        rank=env.rank,
        world_size=env.world_size,
        last_step=last_step,
        config_sha256=config_sha256(unresumed),
        estimate_bytes=num_params(model) * 4 * 3,  # fp32 weights + AdamW's two moments
        model_config=dataclasses.asdict(model_config),  # recorded in COMPLETE, checked before a resume loads
        log=say,
    )
    resumed = checkpointer.resume(cfg.checkpoint.resume)  # before iter(loader): restores its position
    if resumed is None and model_config.init_from:  # a resume's checkpoint holds the weights: no base read
        # Each rank copies its own shards from the files (training/checkpoint/hf_import.py).
        if base_dir is None:  # preflight took a checkpoint's record for it, and that checkpoint did not load
            raise GristmillError(
                f"model.init_from = {model_config.init_from}: the base's files are not at hand"
            )
        load_base_weights(model, base_dir)
    # Only now, with the resume checks passed: a refused resume leaves the run's config.toml as it was.
    if is_main:
        _save_run_config(resolved, run_dir, resumed, say)
        record_plan(data, run_dir)  # the sources' fingerprints, for `data inspect RUN`
        if resumed is None and model_config.init_from:  # RUN/base/: the base as loaded, for its exports
            record_base(run_dir, base_dir, model_config.init_from, model_config.init_from_sha256)
        if cfg.metrics.plot:
            note = plot_plan(data, run_dir / PLAN_PNG)
            if note:
                say(note)
    flops = [flops_per_token(model_config, shape.seq_len, include_lm_head=True) for shape in shapes]
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
            resume_rewinds=len(data.skips),
        )
        for line in _header(cfg, model_config, shapes, env, device, mesh, model, flops[0], peak):
            writer.print(line)
        for line in format_plan(data, notes):
            writer.print(f"  plan    {line}")
    if evaluator is not None:
        evaluator.prepare(run_dir, say)  # needs RUN/config.toml (the tasks' held-out documents)
    if resumed is not None:
        _say_resumed(loader, state, resumed, last_step, say)
    metrics = TrainingMetrics(writer, data, run_dir, plot=cfg.metrics.plot, last_step=last_step)
    guard = NonFiniteGuard(device)
    spikes = SpikeDetector(cfg.run.spike_window, cfg.run.spike_sigma, state.recent_losses)
    divergence = DivergencePolicy(
        on_nonfinite=cfg.run.on_nonfinite,
        max_skipped=cfg.run.max_skipped,
        lr=cfg.optim.lr,
        config_path=run_dir / CONFIG_TOML,
        checkpointer=checkpointer,
        plot=metrics.plot_loss,
        say=say,
    )
    return Run(
        cfg=cfg,
        shapes=shapes,
        data=data,
        env=env,
        device=device,
        run_dir=run_dir,
        model=model,
        amp=amp,
        loader=loader,
        validation=validation,
        evaluator=evaluator,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        checkpointables=states,
        checkpointer=checkpointer,
        writer=writer,
        metrics=metrics,
        guard=guard,
        divergence=divergence,
        spikes=spikes,
        rewinder=Rewinder(
            cfg.run,
            plan=data,
            loader=loader,
            scheduler=scheduler,
            state=state,
            checkpointer=checkpointer,
            guard=guard,
            spikes=spikes,
            run_dir=run_dir,
            writer=writer,
            stop=divergence.stop,
            say=say,
        ),
        fault=LossFaults(model, env.rank, data),
        last_step=last_step,
        flops_per_token=flops,
        peak_flops=peak,
        say=say,
    )


def _save_run_config(
    cfg: TrainConfig, run_dir: Path, resumed: int | None, say: Callable[[str], None]
) -> None:
    """Rank 0 writes RUN/config.toml, after a resume's note of what changed since the last one."""
    if resumed is not None:
        for line in _changes_since(run_dir / CONFIG_TOML, cfg, resumed):
            say(line)
    try:
        save_config(cfg, run_dir / CONFIG_TOML)
    except OSError as e:
        raise unwritable(run_dir, e) from None


def _say_resumed(
    loader: TokenLoader, state: TrainState, resumed: int, last_step: int, say: Callable[[str], None]
) -> None:
    for note in loader.resume_notes:
        say(f"note: {note}")
    say(f"resumed at step {resumed} ({state.tokens_seen:,} tokens seen); training to step {last_step}")
    if resumed >= last_step:
        say(f"nothing to do: the checkpoint is at step {resumed} ≥ the last step {last_step}")


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


@dataclass
class _Due:
    """What a step does besides training."""

    validate: bool
    evaluate: bool
    log: bool
    loss: float | None = None  # the step's loss when already read (rewinds on)


def loop(run: Run) -> dict[str, Any]:
    """Train from the state's step to `run.last_step`: step, log (with validation and eval), save,
    rewind past a spike, stop on a signal or divergence. Returns the summary (rank 0's view)."""
    state, checkpointer = run.state, run.checkpointer
    start = state.step  # a resumed run's summary covers its own steps, not the whole run's
    stopped_by = None
    run.metrics.start()
    batches = iter(run.loader)
    phase = None
    try:
        with GracefulStop(run.env.world_size) as shutdown:
            while state.step < run.last_step:
                step = state.step + 1
                checkpointer.poll()  # raises if a background save failed
                micro_batches = [_to_device(mb, run.device) for mb in next(batches)]
                due = _due(run, step)
                phase = _enter_phase(run, step, phase)
                result = _train(run, step, phase, micro_batches, measure_update=due.log)
                if run.rewinder.every_step and _rewound(run, step, phase, result, due):
                    batches = iter(run.loader)  # continues after the skip
                    continue
                stop = shutdown.should_stop()  # every rank agrees, whichever ones were signalled
                save = bool(stop) or checkpointer.due(step)
                if save and due.evaluate and not run.divergence.fatal(run.guard.read()):
                    # The step's checkpoint before its eval: an eval that fails or dies costs no training.
                    checkpointer.save(step, state.tokens_seen, blocking=stop is not None)
                    save = False
                if due.log:
                    report = _log(run, step, phase, result, due)
                    run.divergence.check(report, step)
                if save:
                    if not due.log:
                        run.divergence.check(
                            run.guard.read(), step
                        )  # the host hears of skipped steps before any save
                    checkpointer.save(step, state.tokens_seen, blocking=stop is not None)
                if stop:
                    stopped_by = stop
                    run.say(
                        f"stopping after step {step} on {stop}: checkpoint saved; resume with --resume auto"
                    )
                    break
            checkpointer.close()  # waits for an async save in flight
    except BaseException:
        checkpointer.abandon()  # the lock and the process group outlive no background write
        raise
    finally:
        if run.writer is not None:
            run.writer.close()
    seconds = run.metrics.elapsed()
    rewinds = run.rewinder.summary()
    if rewinds and run.writer is not None:
        run.writer.print(rewinds)
    run.metrics.summarize(start, state.step, seconds)
    return {
        "run_dir": str(run.run_dir),
        "steps": state.step,
        "stopped_by": stopped_by,
        "first_loss": run.metrics.first_loss,
        "final_loss": run.metrics.last_loss,
        "val_loss": run.metrics.val_loss,
        "rewinds": len(run.data.skips),
        "seconds": seconds,
        "states": run.checkpointables,
    }


def _rewound(run: Run, step: int, phase: int, result: dict[str, Any], due: _Due) -> bool:
    """With rewinds on, every step's loss is read: a step that calls for a rewind gets its metrics
    row (the spike and the rewind as events), then the run goes back (training/rewind.py).
    Returns whether it did (the state is then at the skip's last step)."""
    loss = _mean_loss(run, result)
    due.loss = loss  # read once: a logged row reuses it
    cause = run.rewinder.cause(step, loss, int(result["nonfinite"].item()))
    if cause is None:
        return False
    row_only = _Due(validate=False, evaluate=False, log=True, loss=loss)
    report = _log(run, step, phase, result, row_only, cause["spike"])
    if run.rewinder.rewind(step, cause) is not None:
        run.metrics.rewound()
        return True
    # No checkpoint to go back to: the run goes on; the step's row is written (no second one, so no
    # validation or eval at this step), and the non-finite steps that row read are judged as always.
    run.divergence.check(report, step)
    due.log = due.validate = due.evaluate = False
    return False


def _due(run: Run, step: int) -> _Due:
    last = step == run.last_step
    validate = run.validation is not None and (step % run.cfg.run.val_every == 0 or last)
    evaluate = run.evaluator is not None and (step % run.cfg.eval.interval == 0 or last)
    log = step % run.cfg.run.log_every == 0 or step == 1 or last or validate or evaluate
    return _Due(validate=validate, evaluate=evaluate, log=log)


def _enter_phase(run: Run, step: int, previous: int | None) -> int:
    """The phase `step` belongs to, announced when it is not the phase of the previous step trained
    by this invocation (a rewind's skip may jump over a phase's first steps)."""
    phase, index = run.data.locate(step - 1)
    if phase > 0 and (index == 0 if previous is None else phase != previous):
        spec = run.data.phases[phase]
        run.say(
            f"phase {spec.name!r} begins at step {step}: seq_len {spec.seq_len}, {spec.global_batch} "
            f"sequences per step, {spec.steps} steps"
        )
    return phase


def _train(
    run: Run, step: int, phase: int, micro_batches: list[dict[str, torch.Tensor]], measure_update: bool
) -> dict[str, Any]:
    """One optimizer step, its non-finite tally and the state's step and tokens."""
    run.fault.arm(step)
    result = train_step(
        run.model,
        run.optimizer,
        run.scheduler,
        micro_batches,
        grad_clip=run.cfg.optim.grad_clip,
        amp=run.amp,
        measure_update=measure_update,
        world_size=run.env.world_size,
    )
    run.guard.record(step, result["nonfinite"])
    run.state.step = step
    run.state.tokens_seen += run.shapes[phase].tokens_per_step
    run.metrics.count(run.shapes[phase].tokens_per_step)
    return result


def _mean_loss(run: Run, result: dict[str, Any]) -> float:
    """The step's loss, the mean over ranks: the same value on every rank (one host sync)."""
    env = run.env
    return _all_sum(result["loss"].double(), env.world_size, run.device).item() / env.world_size


def _log(
    run: Run, step: int, phase: int, result: dict[str, Any], due: _Due, spike: dict | None = None
) -> dict[str, Any]:
    """The metrics row of a logged step (validation and eval too when due and the weights are
    finite); returns the non-finite guard's report for the divergence check. `spike`: what the
    rewinder found (with rewinds on it judges every step; otherwise the logged losses are judged here)."""
    env, device = run.env, run.device
    report = run.guard.read()
    skipped = run.guard.take_unlogged()
    loss = due.loss if due.loss is not None else _mean_loss(run, result)
    if not run.rewinder.judges_spikes:
        spike = run.spikes.check(loss)
    tokens_per_s = run.metrics.tokens_per_s()  # the loss all-reduce synchronised the step
    row = step_row(
        step,
        loss,
        result,
        tokens_per_s=tokens_per_s,
        tokens_seen=run.state.tokens_seen,
        skipped=skipped,
        spike=spike,
        mfu=mfu(tokens_per_s, env.world_size, run.flops_per_token[phase], run.peak_flops),
        peak_memory_bytes=int(_all_max(peak_memory_bytes(device), env.world_size, device)),
    )
    if run.rewinder.every_step:  # 1, then 2 after the first rewind (rewind n discards attempt n)
        row["attempt"] = len(run.data.skips) + 1
    finite = not run.divergence.fatal(report)  # skipped updates left the weights finite
    run.metrics.log(
        row,
        checkpoint_timings=run.checkpointer.take_timings(),
        validate=functools.partial(run.validation, run.model, step, run.amp)
        if due.validate and finite
        else None,
        evaluate=functools.partial(run.evaluator, run.model, step) if due.evaluate and finite else None,
    )
    return report


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
