"""The checks before any work (`preflight`): in every worker before setup, and in `gristmill train`'s
launcher before torchrun starts, so a bad recipe is one line from the launcher.

Light on purpose: the launcher imports this module and not the trainer (its model, FSDP, DCP,
optimizers), which saves about 2 s before torchrun can start its workers; the checks that need those
(adamw8bit, float8) import them where they run. tests/training/test_launch.py keeps it so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.checkpoint.base_record import base_tokenizer_changed, base_weights, is_export, with_run_base
from training.checkpoint.base_source import BaseSource, locate_base
from training.checkpoint.hf_import import BaseModelError, check_base_data
from training.checkpoint.model_config import resolve_model_config
from training.checkpoint.record import resume_model_record
from training.config import TrainConfig
from training.config_checks import check_data_seed, check_output_dir, check_run_seed, mesh_shape
from training.console import say
from training.contract.config_loader import ConfigError, naming_override
from training.contract.errors import GristmillError
from training.contract.object_store import COUNTS
from training.contract.run_layout import complete_steps
from training.data.remote import dataset_info, tokenizer_dir
from training.data.spec import BatchShape, RunSpec, batch_shapes, check_config

if TYPE_CHECKING:
    from training.model import ModelConfig  # torch-heavy: named, not imported (see the module)


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


def from_rank0(value: Any, world_size: int) -> Any:
    """Rank 0's `value` on every rank (collective when world_size > 1): what only rank 0 can tell."""
    if world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def raise_rank0_problem(problem: str | None, world_size: int) -> None:
    """Every rank raises rank 0's problem as a GristmillError, or none does (collective when
    world_size > 1): a check only rank 0 makes stops the whole job with its message."""
    problem = from_rank0(problem, world_size)
    if problem is not None:
        raise GristmillError(problem)


def pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise GristmillError(
            "run.device = 'cuda' but torch sees no CUDA device; use run.device = 'auto' or 'cpu'"
        )
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


@dataclass(frozen=True)
class Checked:
    """What preflight resolved and checked, for the run's setup."""

    spec: RunSpec  # the recipe resolved: sources, phases, seq_lens, cache
    shapes: tuple[BatchShape, ...]  # each phase's batch arithmetic for this world size
    model: ModelConfig  # the model to build: preset, overrides, a base's shape, the data's vocabulary
    device: torch.device
    base_dir: Path | None  # the base's files (None without init_from, or when a resume's checkpoint
    # stands for them)
    fetched_before: dict[str, int]  # COUNTS before preflight: step 1's fetch/* include its requests


def preflight(cfg: TrainConfig, env: DistEnv) -> Checked:
    """Every check that needs no model or GPU memory: batch arithmetic, the mesh shape, the model
    against the dataset (vocabulary, separator, sequence length), the base model of init_from
    against the data, the device and the optimizer. Raises GristmillError with the numbers."""
    fetched_before = COUNTS.snapshot()  # a bucket's dataset.json (and a base's tokenizer) are fetched here
    spec = check_config(cfg, env.world_size)
    check_output_dir(cfg)
    mesh_shape(cfg.parallel, env.world_size)  # replicate × shard = world size
    dataset = spec.sources[0].dataset  # every source of a mixture shares one tokenizer
    info = dataset_info(dataset, spec.cache.timeout_s)  # a bucket's: one GET, within data.fetch_timeout_s
    if cfg.model.init_from and not cfg.checkpoint.resume and complete_steps(cfg.run.output_dir):
        # a start over a run's checkpoints, refused at the resume's choice, refused before a hub base is
        # fetched: it downloaded the whole base first, or offline said to fetch it (trial RV78b 9). The
        # refusal's own line, imported on its path alone: the launcher's checks import no trainer (DCP)
        from training.checkpoint.checkpointer import find_resume

        find_resume(cfg.run.output_dir, "", checksums=False)
    source = _locate_base(cfg, env) if cfg.model.init_from else None
    model_config, notes = model_for_data(cfg, spec, info, source)
    for note in notes if env.rank == 0 else ():
        say(note)
    device = pick_device(cfg.run.device, env.local_rank)
    if cfg.run.init_device == "meta" and device.type != "cuda" and env.world_size > 1 and not source:
        # DTensor's sharded random init is CUDA-only: on CPU every rank draws its shard from one
        # stream, and each weight came out as copies of one block (training/run/setup.build_model).
        # A base's weights ([model] init_from) replace that init: meta is fine there.
        raise GristmillError(
            f'run.init_device = "meta" on {device.type} with {env.world_size} processes would give every '
            'rank the same random shard (sharded init is CUDA-only): set run.init_device = "full" (or "auto")'
        )
    if cfg.optim.name == "adamw8bit":
        from training.optim import bitsandbytes_or_refuse  # imported here: see the module's docstring

        bitsandbytes_or_refuse(device.type, sharded=env.world_size > 1)
    if model_config.float8:
        from training.parallelize import float8_or_refuse

        float8_or_refuse(device)
    base_dir = None if source is None else source.directory
    shapes = batch_shapes(cfg, spec, env.world_size)
    return Checked(spec, shapes, model_config, device, base_dir, fetched_before)


def model_for_data(
    cfg: TrainConfig, spec: RunSpec, info: dict[str, Any], source: BaseSource | None
) -> tuple[Any, list[str]]:
    """(the ModelConfig to build, notes): checked against the data (`info`, the first source's
    dataset.json: every source shares its tokenizer), and a base of model.init_from (`source`, located
    here when None) against its tokenizer, vocabulary and separator, before any work. `train --plan`
    and the trainer both call it (--plan passed a recipe train then refused: trial RV53a 6)."""
    if not _resumes(cfg):  # a fresh start: its weights are drawn from run.seed
        try:
            check_run_seed("run.seed", cfg.run.seed)
            check_data_seed("data.seed", cfg.data.seed)  # and its batches' order from data.seed
        except ConfigError as e:  # the --set that gave it named, as the loader's refusals do (RV73a 8)
            raise naming_override(e, cfg) from None
    recorded = _recorded_base(cfg) if cfg.model.init_from else None
    if cfg.model.init_from and source is None:  # as the trainer: a resume's recorded base (review RV54b 3)
        source = locate_base(cfg.model.init_from, recorded)
        if recorded is None and source.directory is not None and is_export(source.directory):
            # a new run holds an export base's weights to its checksums as it records them (record_base):
            # --plan printed a plan for a damaged export, exit 0 (trial RV61d F3). Only an export's: the
            # weights of any other base are hashed at the run's start, not for a plan (RV62e 5)
            base_weights(source.identity, source.directory)
    model_config = resolve_model_config(cfg.model, info, spec.seq_lens, source)
    notes = []
    if source is not None and source.directory is not None:
        # the base edited since the run kept its tokenizer.json: said so before the data is held to it
        changed = base_tokenizer_changed(
            recorded, cfg.run.output_dir, cfg.checkpoint.resume, source.directory
        )
        if changed is not None:
            raise BaseModelError(changed)
        data_dir = tokenizer_dir(spec.sources[0].dataset, spec.cache)  # a bucket's: fetched, checked
        notes = check_base_data(
            source.directory, data_dir, info, model_config.vocab_size, recorded is not None
        )
    return model_config, notes


def _resumes(cfg: TrainConfig) -> bool:
    """Whether the run goes on from a checkpoint (--resume PATH, or auto with one complete), whose
    weights are its own: run.seed drew them when the run started, and is only compared with it then.
    So an earlier run with a seed check_run_seed now refuses is still resumed (and read, verified:
    the config's own checks keep every 64-bit seed; refusing seeds there broke them, review RV66e 1)."""
    resume = cfg.checkpoint.resume
    return bool(resume) and (resume != "auto" or bool(complete_steps(cfg.run.output_dir)))


def _recorded_base(cfg: TrainConfig) -> dict[str, Any] | None:
    """The base a resume's checkpoint recorded (its run's kept copy where there is one), or None."""
    resume = cfg.checkpoint.resume
    return with_run_base(resume_model_record(cfg.run.output_dir, resume), cfg.run.output_dir, resume)


def _locate_base(cfg: TrainConfig, env: DistEnv) -> BaseSource:
    """model.init_from located (training/checkpoint/base_source.py), a resume's recorded base where
    the base is not read again. Rank 0 first: a hub id is downloaded by rank 0 while the others
    wait, then they read its snapshot at the commit rank 0 pinned (a branch that moves meanwhile
    cannot split the ranks); a launcher's preflight (no process group) fetches alone."""
    recorded = _recorded_base(cfg)
    printer = say if env.rank == 0 else None
    if env.world_size == 1 or not dist.is_initialized():
        source = locate_base(cfg.model.init_from, recorded, printer)
    else:
        problem, source = None, None
        if env.rank == 0:
            try:
                source = locate_base(cfg.model.init_from, recorded, printer)
            except GristmillError as e:
                problem = str(e)
        box = [problem, None if source is None else source.identity]
        dist.broadcast_object_list(box, src=0)  # the others wait here for rank 0's download
        if box[0] is not None:
            raise GristmillError(box[0])
        if source is None:
            source = locate_base(box[1], recorded)
    if source.note and env.rank == 0:
        say(source.note)
    return source
