"""Setting a run up: after the checks before any work (training/run/preflight.py), the run's parts,
built in order by a few named builders (`setup`), into the `Run` the loop trains with
(training/train.py).

Order of work: the config resolved and checked once (preflight's `Checked`: the recipe, its batch
arithmetic, the mesh shape, the model against the dataset's vocabulary, separator and sequence
lengths; a `[model] init_from` base located, a hub id downloaded by rank 0 while the others wait) →
device mesh → the data (the plan, the sources opened, this rank's loader, the held-out loaders:
before the model, so a dataset too small fails before the big allocations) → the model (on the
meta device or materialised, see run.init_device; parallelized: AC, compile, FSDP2; weights
initialised with the same seed on every rank), the optimizer and the LR schedule, [merge]'s
accumulator (training/merge.py) → the checkpointer and the resume, or the base's weights → what
rank 0 writes and prints (RUN/config.toml once the resume checks passed, the run record: the plan,
metrics.jsonl, the trackers; the header) → the judge of every step and the rewinder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn as nn

from training.checkpoint.base_record import (
    carry_base_record,
    drop_base_record,
    record_base,
    record_base_of_copy,
)
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.hf_export import check_run_tokenizer, unkept_base_note
from training.checkpoint.hf_import import load_base_weights
from training.checkpoint.io import run_data_order
from training.checkpoint.record import START_SETTINGS
from training.checkpoint.state import TrainState, checkpointables
from training.config import TrainConfig, load_train_config
from training.config_checks import rewind_unreachable
from training.console import say
from training.contract.config_loader import config_changes, config_sha256, save_config, to_dict
from training.contract.errors import GristmillError, unwritable
from training.contract.run_layout import CONFIG_TOML, kept_rows, run_of_checkpoint
from training.data.loader import TokenLoader
from training.data.plan import Plan, PlanError, integer_weights
from training.data.recipe import TrainedPlan, check_run_room, check_same_documents, format_plan, open_plan
from training.data.remote import dataset_info, tokenizer_dir
from training.data.spec import BatchShape, RunSpec, applied_config, resolve
from training.merge import MergedWeights, MergePoints
from training.metrics import TrainingMetrics, device_name, peak_flops
from training.model import ModelConfig, Transformer, flops_per_token, num_params
from training.optim import ScheduledLR, build_optimizer, plan_scheduler
from training.parallelize import autocast_context, build_mesh, parallelize
from training.run.batch_digests import BatchDigests
from training.run.faults import LossFaults, kill_point, replace_dataset
from training.run.lock import RunLock, own_checkpoints, run_dir_lost
from training.run.preflight import Checked, DistEnv, raise_rank0_problem
from training.run.record import RunRecord, not_a_file, unreadable_rows
from training.run.rewind import Rewinder
from training.run.timeline import Timeline
from training.run.validation import Validation, validation_of
from training.run.verdict import Judge


class StepEval(Protocol):
    """Eval during training (`[eval] interval`), supplied by the caller of `train`: lm-eval lives in
    validation/train_eval.py, which runs this trainer with one, so training/ never imports it."""

    def check(self, rank: int, world_size: int, model_config: ModelConfig) -> None:
        """On every rank with the run's other checks, before the run directory is touched (before any
        tracker starts): the tasks and settings that can be checked without it (a GristmillError on
        every rank when one is refused); `model_config`: the model the run trains."""

    def prepare(
        self, run_dir: Path, last_step: int, rank: int, world_size: int, model_config: ModelConfig
    ) -> None:
        """On every rank once the run directory is owned and RUN/config.toml written: the checked
        tasks' data built before step 1 (a GristmillError on every rank when it fails);
        `last_step`: this invocation's last step (always evaluated); `rank`, `world_size`: this
        process's place in the job (rank 0 scores); `model_config`: the model the run trains."""

    def due(self, step: int) -> bool:
        """Whether step `step` is evaluated: every eval.interval steps and the last step."""

    def __call__(self, model: nn.Module, step: int, merged: bool = False) -> dict[str, float | str]:
        """On every rank at an eval step (collective): rank 0's scores as metrics-row entries
        (`eval/<task>/<metric>`, `eval_s`; `eval_error`, a line, when it failed: never raises), {}
        on the other ranks. Called after the step's checkpoint, when one is due, is saved.
        `merged`: the model holds [merge]'s merged weights of the step (RUN/eval/merged-step-N)."""


@dataclass
class Run:
    """What `setup` builds and the loop trains with."""

    cfg: TrainConfig
    spec: RunSpec  # the recipe resolved once: sources, phases, seq_lens, cache
    shapes: tuple[BatchShape, ...]  # each phase's batch arithmetic for this world size
    model_config: ModelConfig  # the model built: preset, overrides, a base's shape
    env: DistEnv
    device: torch.device
    run_dir: Path
    plan: Plan  # which tokens of which source every step takes, and the LR
    model: nn.Module
    amp: Any  # a context factory: bf16 autocast in one process, nothing under FSDP
    loader: TokenLoader
    validation: Validation | None  # held-out loss at run.val_every (None: off)
    evaluator: StepEval | None  # lm-eval at eval.interval (None: off)
    merge: MergedWeights | None  # [merge]'s accumulator, read at its merge points (None: off)
    optimizer: torch.optim.Optimizer
    scheduler: ScheduledLR
    state: TrainState  # the step and token counters, the spike rule's window, the RNG streams
    timeline: Timeline  # the rewinds' skips: the run's history
    checkpointables: dict[str, Any]  # checkpointables(...): what a checkpoint saves and restores
    checkpointer: Checkpointer
    metrics: TrainingMetrics  # the throughput window and what a row measures
    record: RunRecord  # the rows and the run directory's artifacts, in agreement with the timeline
    batches: BatchDigests  # each trained step's global-batch digest, gathered for the record
    judge: Judge  # each step's one verdict
    rewinder: Rewinder  # run.on_spike / on_nonfinite = "rewind" (training/run/rewind.py)
    fault: LossFaults  # tests only: GRISTMILL_FAULT_NAN_LOSS, GRISTMILL_FAULT_SPIKE_WINDOW
    last_step: int  # the last step of this invocation
    flops_per_token: list[int]  # model FLOPs per token in each phase (attention grows with seq_len), for MFU
    peak_flops: float | None  # the device's dense bf16 peak FLOP/s, None where unknown


def build_model(model_config: ModelConfig, cfg: TrainConfig, mesh, device: torch.device) -> nn.Module:
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


def loader_settings(
    cfg: TrainConfig, shape: BatchShape, env: DistEnv, device: torch.device
) -> dict[str, Any]:
    """What every loader of the run shares: this data-parallel rank, workers, checks, pinning."""
    return dict(
        rank=env.rank,  # every rank is a data-parallel rank
        world_size=shape.dp_size,
        num_workers=cfg.data.num_workers,
        check_separators=cfg.data.check_separators,
        pin_memory=device.type == "cuda",
    )


def setup(cfg: TrainConfig, checked: Checked, env: DistEnv, evaluator: StepEval | None = None) -> Run:
    """The run's parts, in the order of the module's docstring (`checked.base_dir`: where preflight
    located [model] init_from, whose weights replace the random init unless a checkpoint is resumed)."""
    spec, shapes, model_config, device = checked.spec, checked.shapes, checked.model, checked.device
    mesh = build_mesh(cfg.parallel, env.world_size, device.type)
    last_step = cfg.run.max_steps or spec.last_step
    fetched_before = checked.fetched_before  # step 1's fetch/*: preflight's and setup's too (a cold start)
    plan, loader, validation, notes = _data(cfg, spec, shapes, env, device, last_step)
    # Python's and NumPy's generators, saved with each checkpoint as torch's are, start from the seed
    # too: two runs of one config held the process's own streams (trial RV55b 4)
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed % 2**32)
    model = build_model(model_config, cfg, mesh, device)
    amp = functools.partial(autocast_context, cfg.parallel, mesh, device.type)  # bf16 autocast w/o FSDP
    optimizer = build_optimizer(model, cfg.optim, device.type, sharded=mesh is not None)
    scheduler = plan_scheduler(optimizer, plan)
    state, timeline = TrainState(rank=env.rank), Timeline(plan)
    merge = None
    # Merged weights read every merge.every steps and at the plan's end; not at a run.max_steps chunk's
    # end: reading a window there closed it, and the merged weights depended on how the run was cut.
    if cfg.merge.kind != "none":
        merge = MergedWeights(model, cfg.merge, MergePoints(cfg.merge.every, (spec.last_step,)))
    states = checkpointables(model, optimizer, scheduler, loader, state, timeline, merge)
    # RUN/config.toml and the config hash name the base the run resolved (a hub id: at its commit).
    resolved = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, init_from=model_config.init_from or None)
    )
    identity = identity_config(applied_config(resolved, spec))
    checkpointer = _checkpointer(
        resolved, env, states, timeline, last_step, model_config, num_params(model), identity, merge
    )
    # before iter(loader): restores its position
    resumed = checkpointer.resume(cfg.checkpoint.resume, _resume_checks(plan, loader, cfg, env, checkpointer))
    if resumed is None and model_config.init_from:  # a resume's checkpoint holds the weights: no base read
        # No files when preflight took a checkpoint's record for the base, and that checkpoint did not load.
        if checked.base_dir is None:
            raise GristmillError(
                f"model.init_from = {model_config.init_from}: the base's files are not at hand"
            )
        load_base_weights(model, checked.base_dir)  # each rank copies its own shards from the files
    run_dir = Path(cfg.run.output_dir)
    record = RunRecord(run_dir, timeline, state, rank=env.rank, plot=cfg.metrics.plot)
    _check_export_tokenizer(
        spec,
        model_config,
        env,
        run_dir,
        checked.base_dir if resumed is None else None,
        checkpointer.resumed_from,
    )
    checkpointer.open_ledger(resumed)
    checkpointer.finish_missed(resumed)
    _outputs(
        resolved,
        spec,
        model_config,
        env,
        run_dir,
        resumed,
        record,
        checked.base_dir,
        checkpointer.resumed_from,
        checkpointer.resumed_here,
        checkpointer.set_aside_steps,
    )
    # The resumed step's row, unless it was written before the run stopped (or it is another run
    # directory's checkpoint: that run's row, not this one's).
    record.resumed(own=checkpointer.resumed_here, world_size=env.world_size)
    flops = [flops_per_token(model_config, shape.seq_len, include_lm_head=True) for shape in shapes]
    peak = peak_flops(device_name(device)) if device.type == "cuda" else None
    if env.rank == 0:
        for line in _header(cfg, spec, shapes, model_config, env, device, mesh, model, flops[0], peak):
            say(line)
        if last_step < spec.last_step and not cfg.checkpoint.saves(last_step, last_step):
            # run.max_steps is how a run is trained in chunks; the stop saves only on a grid (or a signal)
            say(
                f"warning: run.max_steps = {last_step} stops before the plan's last step "
                f"({spec.last_step}) and checkpoint.interval = 0 saves nothing there: a later --resume auto "
                "starts over from step 0; set checkpoint.interval (a save also at run.max_steps) to go on"
            )
        # a resume's checkpoints (saved at another checkpoint.interval, maybe) are targets too
        targets, oldest = checkpointer.rewind_target_steps(), timeline.oldest_target
        if unreachable := rewind_unreachable(cfg, spec.last_step, targets, oldest, resumed or 0):
            say(unreachable)
        if merge is not None:
            say(f"  merge   {merge.header()}")
        for line in format_plan(plan, notes, timeline.skips):
            say(f"  plan    {line}")
    if evaluator is not None:
        # needs RUN/config.toml (the tasks' held-out documents)
        evaluator.prepare(run_dir, last_step, env.rank, env.world_size, model_config)
    if resumed is not None:
        after: list[str] = []  # said after "nothing to do"
        if resumed >= last_step and not checkpointer.resumed_here:
            # this directory gets no checkpoint, row or export of it (review R21h 1); rank 0 says it
            if checkpointer.resumed_from is not None:  # rank 0's
                foreign = run_of_checkpoint(checkpointer.resumed_from[0])
                after.append(
                    f"note: step {resumed}'s weights and record are {foreign}'s, and this directory holds "
                    f"none of them: export or evaluate that run (`gristmill export {foreign} --step "
                    f"{resumed}`)"
                )
        elif resumed >= last_step and resumed == spec.last_step != (saved := loader.saved_total_steps):
            # A plan shortened to end here: a resume that trains no step makes none of what the plan's
            # last step gets ("nothing to do" alone: review R21c 2; what it lacks, not a list: R21f 1).
            # This directory's record says what the step has (another's checkpoint: that run's, R21g 2).
            lacks = _last_step_lacks(
                record, state, resumed, validation is not None, evaluator is not None, merge
            )
            if lacks:
                after.append(
                    f"note: step {resumed} was not the last step of the checkpoint's plan ({saved} steps), "
                    f"and it lacks what this plan's last step gets: {' and '.join(lacks)}; a resume that "
                    "trains no step does not make them"
                )
        _say_resumed(loader, state, resumed, last_step, after)
    rewinder = Rewinder(
        cfg.run.rewind, timeline=timeline, checkpointer=checkpointer, loader=loader, scheduler=scheduler,
        state=state, record=record, merge=merge, validates=validation is not None,
        evaluates=evaluator is not None,
    )  # fmt: skip
    judge = Judge(
        cfg.run, plan=plan, config_path=run_dir / CONFIG_TOML, device=device,
        world_size=env.world_size, recent_losses=state.recent_losses, nonfinite=state.nonfinite,
        rewinder=rewinder,
    )  # fmt: skip
    return Run(
        cfg=cfg, spec=spec, shapes=shapes, model_config=model_config, env=env, device=device,
        run_dir=run_dir, plan=plan, model=model, amp=amp,
        loader=loader, validation=validation, evaluator=evaluator, merge=merge, optimizer=optimizer,
        scheduler=scheduler, state=state, timeline=timeline, checkpointables=states,
        checkpointer=checkpointer,
        metrics=TrainingMetrics(
            timeline, log_every=cfg.run.log_every, last_step=last_step, fetch_base=fetched_before
        ),
        record=record, batches=BatchDigests(env.world_size), judge=judge, rewinder=rewinder,
        fault=LossFaults(model, env.rank, plan),
        last_step=last_step, flops_per_token=flops, peak_flops=peak,
    )  # fmt: skip


def _data(
    cfg: TrainConfig,
    spec: RunSpec,
    shapes: tuple[BatchShape, ...],
    env: DistEnv,
    device: torch.device,
    last_step: int,
) -> tuple[Plan, TokenLoader, Validation | None, list[str]]:
    """(plan, this rank's loader, the held-out loaders or None, the plan's notes). A dataset too
    small for one global batch, or a source the plan would run out of, fails here."""
    # init_from: the data's vocabulary may be smaller than the base model's (preflight checked it).
    replace_dataset(env.rank, "opening")
    vocab = dataset_info(spec.sources[0].dataset, spec.cache.timeout_s)["vocab_size"]
    # A resume's run is checked for its order before its datasets are opened (an older gristmill's
    # run: refused before the `gristmill data index` an old dataset's opening would ask for).
    run_dir = Path(cfg.run.output_dir)
    resumed = (run_dir, run_data_order(run_dir)) if cfg.checkpoint.resume else None
    # A resume's sources holding the same documents: decided once its checkpoint is picked and loaded
    # (_resume_checks), with that checkpoint's plan.
    trained = TrainedPlan.unknown("the checkpoint the resume takes") if cfg.checkpoint.resume else None
    plan, tables, notes = open_plan(cfg, spec, expect_vocab_size=vocab, resumed=resumed, trained=trained)
    settings = loader_settings(cfg, shapes[0], env, device)
    micro = tuple(shape.micro_batch for shape in shapes)
    loader = TokenLoader(plan, tables, micro_batch=micro, **settings)
    validation = validation_of(
        cfg, spec, shapes, plan, last_step=last_step, vocab_size=vocab, device=device,
        world_size=env.world_size, settings=settings,
    )  # fmt: skip
    notes = notes + check_run_room(spec, loader, validation)  # the training and validation share the cache
    replace_dataset(env.rank, "opened")
    same_datasets(plan, validation, env)
    return plan, loader, validation, notes


def _resume_checks(
    plan: Plan, loader: TokenLoader, cfg: TrainConfig, env: DistEnv, checkpointer: Checkpointer
) -> Callable[[Path | None], None] | None:
    """A resume's checks once its checkpoint is loaded, before the newer ones are set aside (every
    rank): its sources that hold the same documents (recipe.check_same_documents), with the plan of
    the checkpoint it loads (the loader's state holds it: no other read), or with none when it starts
    from step 0 — not `train --plan`'s guess, the newest checkpoint whose plan reads: a resume passes
    over one whose files do not verify, and a pair only that one trained went on, with a warning naming
    it, where removing it was refused (review RV33d F1); and, resumed in its own directory, the
    metrics.jsonl whose rows it keeps readable, rank 0's line on every rank (review RV75d 1, 2)."""
    if not cfg.checkpoint.resume:
        return None  # open_plan decided it: nothing trained
    names = [s.name for s in plan.sources]

    def check(path: Path | None) -> None:
        saved = loader.saved_plan if path is not None else None
        trained = None if saved is None else TrainedPlan.of(f"checkpoint {path}", saved)
        check_same_documents(names, loader.builder.tables, trained)
        own = path is not None and checkpointer.owns(path)
        unreadable = unreadable_rows(Path(cfg.run.output_dir)) if env.rank == 0 and own else None
        raise_rank0_problem(unreadable, env.world_size)

    return check


def same_datasets(plan: Plan, validation: Validation | None, env: DistEnv) -> None:
    """Every rank opened each source itself (a bucket's dataset.json, one GET each time): a dataset
    replaced at its location while the ranks started gave two ranks two datasets, and the run trained
    both, exit 0 (review R24c 1). Every loader of every rank must read the dataset rank 0's plan
    records (collective where world_size > 1: every rank raises the same line, or none does)."""
    ours = {s.name: s.fingerprint for s in plan.sources}
    where = {s.name: s.dataset for s in plan.sources}
    problem = None
    for name, fingerprint in validation.fingerprints() if validation is not None else ():
        if fingerprint != ours[name]:
            problem = (
                f"source {name!r} ({where[name]}): rank {env.rank}'s held-out loader opened dataset "
                f"{fingerprint[:12]}…, its training loader {ours[name][:12]}…"
            )
            break
    every = [(ours, problem)]
    if env.world_size > 1:
        every = [None] * env.world_size
        torch.distributed.all_gather_object(every, (ours, problem))
    first = every[0][0]
    for rank, (theirs, problem) in enumerate(every):
        if problem is None:
            name = next((n for n in first if theirs.get(n) != first[n]), None)
            if name is not None:
                was, now = first[name][:12], theirs[name][:12]
                problem = f"source {name!r} ({where[name]}): rank {rank} opened dataset {now}…, rank 0 {was}…"
        if problem is not None:
            raise GristmillError(
                f"{problem}: the dataset at that location was replaced while the run started; start the "
                "run again once it holds one dataset (nothing was trained)"
            )


def _checkpointer(
    resolved: TrainConfig,
    env: DistEnv,
    states: dict,
    timeline: Timeline,
    last_step: int,
    model_config,
    params: int,
    identity: dict[str, Any],
    merge: MergedWeights | None,
) -> Checkpointer:
    """`identity`: what of the config each COMPLETE records, and its hash (identity_config)."""
    run = resolved.run
    rewinds = "rewind" in (run.on_spike, run.on_nonfinite)
    return Checkpointer(
        resolved.checkpoint,
        run.output_dir,
        states,
        rank=env.rank,
        world_size=env.world_size,
        last_step=last_step,
        plan_last_step=timeline.plan.total_steps,
        config_sha256=config_sha256(identity),
        config=identity,
        # fp32 weights + AdamW's two moments (+ the merge's accumulator)
        estimate_bytes=params * 4 * (3 if merge is None else 4),
        model_config=dataclasses.asdict(model_config),  # recorded in COMPLETE, checked before a resume loads
        # Retention keeps what a later rewind may go back to (checkpointer.prune).
        rewind_keep=(lambda: (timeline.oldest_target, run.rewind.margin_steps)) if rewinds else None,
        merged_export=merge.merged_at if merge is not None and resolved.merge.export else None,
        lost=functools.partial(run_dir_lost, run.output_dir),
        completed=lambda step: kill_point(f"complete:{step}"),
    )


def _check_export_tokenizer(
    spec: RunSpec,
    model_config: ModelConfig,
    env: DistEnv,
    run_dir: Path,
    base_dir: Path | None,
    resumed_from: tuple[Path, str | None, dict[str, Any] | None] | None,
) -> None:
    """Every start, before step 1 and before _outputs writes into the run, [eval] or not: the tokenizer
    files the run's exports would ship, checked on rank 0 (hf_export.check_run_tokenizer): a new run's
    base (`base_dir`), else RUN/base/ of the run whose checkpoint it resumes (`resumed_from`, rank 0's).
    Refused at the first export instead, they stopped the run there, and every resume before step 1
    (review RV29a F1)."""
    problem = None
    if env.rank == 0:
        source = run_of_checkpoint(resumed_from[0]) if base_dir is None and resumed_from else None
        try:
            check_run_tokenizer(
                run_dir,
                lambda: tokenizer_dir(spec.sources[0].dataset, spec.cache),
                model_config,
                base_dir,
                source,
            )
        except GristmillError as e:
            problem = str(e)
    raise_rank0_problem(problem, env.world_size)


def _outputs(
    resolved: TrainConfig,
    spec: RunSpec,
    model_config: ModelConfig,
    env: DistEnv,
    run_dir: Path,
    resumed: int | None,
    record: RunRecord,
    base_dir: Path | None,
    resumed_from: tuple[Path, str | None, dict[str, Any] | None] | None,
    own: bool,
    set_aside: list[int],
) -> None:
    """Rank 0, once the resume checks passed (a refused resume leaves the run's files as they were):
    a new run's base (RUN/base/: the base as loaded from `base_dir`, for its exports), the run record
    started (what a discarded future left set aside, the plan's record and plot, metrics.jsonl, the
    trackers), then RUN/config.toml (after a resume's note of what changed). `resumed_from`: the
    checkpoint resumed, the config hash and config it records (Checkpointer.resumed_from); `own`: it is this
    run directory's (Checkpointer.resumed_here); `set_aside`: the steps of the complete checkpoints the
    resume set aside (Checkpointer.set_aside_steps)."""
    if env.rank != 0:
        return
    applied = applied_config(resolved, spec)
    if resumed is not None and resumed_from is not None:
        for line in _changes_since(*resumed_from, applied, resumed):
            say(line)
    # RUN/base/: the base as loaded, for its exports; a resumed run's comes from the run whose
    # checkpoint it resumed (another directory's: carried); a start from scratch has none (one a
    # start from a base left, dead before its first checkpoint, is not its base: review R15f F4)
    if resumed is None and model_config.init_from:
        record_base(run_dir, base_dir, model_config.init_from, model_config.init_from_sha256)
    elif resumed is None:
        drop_base_record(run_dir)
    elif resumed_from is not None and not own:
        source = run_of_checkpoint(resumed_from[0])
        if (source / CONFIG_TOML).is_file():
            carry_base_record(source, run_dir)
        elif model_config.init_from:  # a volume's path to it: its run cannot be told (review R15h F4)
            if note := record_base_of_copy(run_dir, resumed_from[0], base_dir):
                say(note)
    if resumed is not None and (note := unkept_base_note(run_dir)):
        say(note)
    datasets = {src.name: src.dataset for src in spec.sources}
    record.started(
        resumed, own=own, metrics=resolved.metrics, config=applied, datasets=datasets, set_aside=set_aside
    )
    # After the record started, whose trackers may still refuse the resume (an unreadable
    # trackers.json, wandb that cannot start): a refused attempt's overrides written here became the
    # run's, and `--config RUN/config.toml --resume auto` trained with them (review R14b M1).
    try:
        save_config(applied, run_dir / CONFIG_TOML)
    except OSError as e:
        raise unwritable(run_dir, e) from None


def _header(
    cfg: TrainConfig,
    spec: RunSpec,
    shapes: tuple[BatchShape, ...],
    mcfg: ModelConfig,
    env: DistEnv,
    device,
    mesh,
    model,
    flops: int,
    peak: float | None,
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
    if mcfg.float8:
        amp += " + float8 block linears (torchao)"
    # A run from a base model says the base, which gives its shape; the preset only fills the rest.
    origin = f"the base {mcfg.init_from}" if mcfg.init_from else f"preset {cfg.model.preset}"
    return [
        f"gristmill train → {cfg.run.output_dir}",
        f"  model   {origin}: {params:,} params ({params_without_embeddings:,} without "
        f"embeddings), dim {mcfg.dim}, {mcfg.n_layers} layers, "
        f"{mcfg.n_heads}/{mcfg.n_kv_heads} heads, vocab {mcfg.vocab_size}",
        "  data    " + ", ".join(f"{src.name} = {src.dataset}" for src in spec.sources),
        *(
            f"  batch   {'' if len(shapes) == 1 else f'{s.name}: '}{s.global_batch} seqs × {s.seq_len} = "
            f"{s.tokens_per_step:,} tokens/step = {_count(s.dp_size, 'rank')} × "
            f"{s.micro_batch} micro × {s.grad_accum} accumulation"
            for s in shapes
        ),
        f"  run     {_count(env.world_size, 'process', 'processes')} on {device_name(device)}, "
        f"mesh {mesh_txt}, compute {amp}, "
        + f"{spec.last_step} steps in {_count(len(shapes), 'phase')}"
        + (f", stopping at step {cfg.run.max_steps} (run.max_steps)" if cfg.run.max_steps else "")
        + " (plan below)",
        f"  flops   {flops:,} FLOPs/token = 6·N_matmul + 12·L·d·T, LM head counted in N_matmul; "
        + (
            f"MFU vs {peak / 1e12:.0f} TFLOP/s dense bf16 peak per device"
            + (
                " (a float8 run: against the bf16 peak, as the reference runs report it)"
                if mcfg.float8
                else ""
            )
            if peak
            else f"MFU not reported (no known peak for {device_name(device)!r})"
        ),
    ]


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _say_resumed(
    loader: TokenLoader, state: TrainState, resumed: int, last_step: int, after: list[str]
) -> None:
    """`after`: notes said after "nothing to do" (setup)."""
    for note in loader.resume_notes:
        say(f"note: {note}")
    say(f"resumed at step {resumed} ({state.tokens_seen:,} tokens seen); training to step {last_step}")
    if resumed >= last_step:
        say(f"nothing to do: the checkpoint is at step {resumed} ≥ the last step {last_step}")
        for line in after:
            say(line)


def _last_step_lacks(
    record: RunRecord,
    state: TrainState,
    step: int,
    validates: bool,
    evaluates: bool,
    merge: MergedWeights | None,
) -> list[str]:
    """What step `step`'s row (rank 0's record of this directory) lacks of what a plan's last step gets:
    validation and eval where the run has them (unless its pending row, written next, has them due),
    merged weights where it merges; how to have the eval."""
    row = next((r for r in reversed(kept_rows(record.rows)) if r["step"] == step), {})
    pending = state.pending
    lacks = []
    if validates and "val_loss" not in row and not (pending and pending.validate):
        lacks.append("its validation (val_loss)")
    if evaluates and not any(k.startswith("eval/") for k in row) and not (pending and pending.evaluate):
        lacks.append(f"its eval (`gristmill eval {record.run_dir} --step {step}` scores it)")
    # the pending row is logged with the merged weights' entries where this plan reads them (R21g 1)
    if merge is not None and "merged/steps" not in row and not (pending and merge.merged_at(step)):
        lacks.append("merged weights")
    return lacks


def identity_config(applied: dict[str, Any]) -> dict[str, Any]:
    """What a run trains, which every checkpoint's COMPLETE records (as JSON) with its hash: the applied
    config (checkpoint.resume is not in it) without run.output_dir, so a resume with the run's own
    config.toml, or into another directory, is the same run's."""
    ours = {**applied, "run": {k: v for k, v in applied["run"].items() if k != "output_dir"}}
    return json.loads(json.dumps(to_dict(ours), default=str))


def run_identity(applied: dict[str, Any]) -> str:
    """The hash of identity_config(applied), which every checkpoint's COMPLETE records."""
    return config_sha256(identity_config(applied))


def _changes_since(
    checkpoint: Path, recorded: str | None, config: dict[str, Any] | None, applied: dict[str, Any], step: int
) -> list[str]:
    """A resume's note of what differs from the config `checkpoint` was saved with (the optimizer,
    the schedule and the run settings are this config's from the next step on; the data and the model
    are checked apart and refused when they changed): nothing when COMPLETE's hash (`recorded`) is
    this config's, else the keys that differ from the config COMPLETE records (`config`), or, for a
    checkpoint older than that record, from its run's config.toml, which that hash says is the
    checkpoint's config or not (a later resume rewrote it)."""
    if recorded == run_identity(applied):
        return []
    # the checkpoint's own config, where it records it: a run's config.toml does not describe another
    # run's checkpoint copied into it, nor one a later resume rewrote (review R23c 2)
    when = (
        f"; in effect from step {step + 1}, and for step {step}'s validation and eval if a stop cut them off"
    )
    name = checkpoint.resolve().name  # not a link's (`latest`)
    if config is not None:
        # the settings that only decide how a run starts: a resume that changed them was refused
        # (checkpointer.check_resume_start); one that spells the same value otherwise (init_std unset →
        # 0.02, the preset's) changed nothing, and "in effect" would say it did (review R25h 6)
        now = identity_config(applied)
        changes = [
            c
            for c in config_changes(config, now)
            if not c.startswith((*(f"{key} " for key in START_SETTINGS), *_same_shares(config, now)))
        ]
        shown = ", ".join(changes[:8]) + (f" (+{len(changes) - 8} more)" if len(changes) > 8 else "")
        return [f"note: changed since {name} was saved: {shown}{when}"] if changes else []
    path = run_of_checkpoint(checkpoint) / CONFIG_TOML
    try:
        before = load_train_config(path, [])
        before_applied = applied_config(before, resolve(before))
    except (GristmillError, OSError):
        before_applied = None  # no or an unreadable config.toml there: nothing to name the keys from
    same = _same_shares(to_dict(before_applied), to_dict(applied)) if before_applied is not None else ()
    changes = [
        c
        for c in config_changes(before_applied or {}, applied)
        if not c.startswith(("run.output_dir ", *same))
    ]
    shown = ", ".join(changes[:8]) + (f" (+{len(changes) - 8} more)" if len(changes) > 8 else "")
    # (the checkpoint's step's validation and eval, when a stop cut them off, run now: review R21c 1)
    if before_applied is not None and recorded in (None, run_identity(before_applied)):
        return [f"note: changed since {name} was saved ({path}): {shown}{when}"] if changes else []
    return [
        f"note: the config differs from the one {name} was saved with (its hash in COMPLETE)"
        + (f"; changed since {path} was written: {shown}{when}" if before_applied and changes else "")
    ]


def _same_shares(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    """The `phase[…].mix.` keys (by position and by name) of the phases whose mixes give every source the
    same share in both configs, as the plan takes them (integer_weights: `{a = 3, b = 1}` is 0.75 /
    0.25): spelled otherwise, they change nothing, and a resume's note said "in effect from step N"
    of them (trial RV61a 2)."""
    same: list[str] = []
    for i, (a, b) in enumerate(zip(old.get("phase") or [], new.get("phase") or [])):
        mixes = [p.get("mix") if isinstance(p, dict) else None for p in (a, b)]
        if not all(isinstance(m, dict) and m for m in mixes):
            continue
        names = sorted(set(mixes[0]) | set(mixes[1]))
        try:
            shares = [integer_weights([float(m.get(n, 0.0)) for n in names]) for m in mixes]
        except (PlanError, TypeError, ValueError):
            continue
        if shares[0] == shares[1]:
            same.append(f"phase[{i}].mix.")
            if isinstance(a.get("name"), str):  # as config_changes names a phase where names differ
                same.append(f"phase[{a['name']}].mix.")
    return tuple(same)


@contextlib.contextmanager
def own_run_dir(run_dir: Path, env: DistEnv) -> Iterator[None]:
    """Rank 0 holds the run directory's lock for the run; every rank stops if it could not, or if a record
    file it appends to is a pipe (record.not_a_file)."""
    lock, problem = None, None
    if env.rank == 0:
        try:
            lock = RunLock(run_dir).acquire()
            if lock.note:
                say(lock.note)
            own_checkpoints(run_dir)  # one run's checkpoints per folder, a linked one too
            problem = not_a_file(run_dir)
        except GristmillError as e:
            problem = str(e)
        except OSError as e:
            problem = str(unwritable(run_dir, e))
        if problem is not None and lock is not None:
            lock.release()
            lock = None
    raise_rank0_problem(problem, env.world_size)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
