"""The recipe resolved once, and every check made before any work (split from the schema in
training/config.py, which holds only what the keys mean).

The recipe is resolved once, into a frozen `RunSpec` (its sources, phases, seq_lens and cache) that
preflight, `gristmill train --plan`, `data inspect`, export, eval and the training loop all share:
`resolve(cfg)` derives it from the config alone. `check_config(cfg, world_size)` adds every check
that can be made without touching a GPU, a process group or the model: the data's and each phase's
batch arithmetic for a world size (`batch_shapes`) here, the other sections' in
training/config_checks.py, so an impossible recipe fails in the first second with the numbers in the
message. The model is resolved apart (training/checkpoint/model_config.py: it needs the dataset and
the base), and `applied_config` is the config RUN/config.toml records: only the keys that apply.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from training.config import (
    DataSection,
    LRSection,
    ModelSection,
    PhaseSection,
    ScheduleSection,
    SourceSection,
    TrainConfig,
)
from training.config_checks import (
    check_model_section,
    check_number,
    check_parallel_section,
    check_training,
)
from training.contract.config_loader import ConfigError, naming_override, override_of, to_dict, tokens_shown
from training.contract.object_store import refuse_url
from training.data.remote import CacheSettings


@dataclass(frozen=True)
class BatchShape:
    """The batch arithmetic of one phase, derived from the config and the world size."""

    global_batch: int  # sequences per optimizer step (all ranks)
    dp_size: int  # data-parallel ranks: the world size (replicate × shard)
    micro_batch: int  # sequences per forward/backward per rank
    grad_accum: int  # micro-batches per rank per step
    seq_len: int
    name: str = "main"  # the phase's name
    steps: int = 0  # the phase's budget in optimizer steps

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


@dataclass(frozen=True)
class RunSpec:
    """A recipe resolved once (`resolve`, its only maker): what preflight, --plan, inspect, export,
    eval and the loop share. A world size's batch shapes (`batch_shapes`) and the model
    (training/checkpoint/model_config.resolve_model_config) are derived from it, apart."""

    sources: tuple[SourceSection, ...]  # [[data.sources]], or data.dataset as the one source "data"
    phases: tuple[PhaseSection, ...]  # [[phase]], or the one phase "main" of [schedule]; filled in
    seq_lens: tuple[tuple[str, int], ...]  # per phase: (the key that sets it, seq_len)
    cache: CacheSettings  # where s3:// sources are cached ([data] cache_dir, cache_gb)

    @property
    def last_step(self) -> int:
        """The plan's last step: the sum of the phases' budgets."""
        return sum(ph.steps for ph in self.phases)


def batch_key(cfg: TrainConfig, phase: int) -> str:
    """The config key that sets phase `phase`'s tokens per step (its own, or [data]'s)."""
    own = cfg.phase and cfg.phase[phase].global_batch_tokens is not None
    return f"phase[{phase}].global_batch_tokens" if own else "data.global_batch_tokens"


_NAME = re.compile(r"[A-Za-z0-9_-]+")


def resolve(cfg: TrainConfig) -> RunSpec:
    """The recipe's sources, phases and seq_lens, each checked (ConfigError naming the key)."""
    sources = _sources(cfg)
    phases = _phases(cfg, [src.name for src in sources])
    seq_lens = tuple(
        (
            f"phase[{i}].seq_len" if cfg.phase and cfg.phase[i].seq_len is not None else "data.seq_len",
            ph.seq_len,
        )
        for i, ph in enumerate(phases)
    )
    return RunSpec(tuple(sources), tuple(phases), seq_lens, cache=cache_of(cfg))


def _sources(cfg: TrainConfig) -> list[SourceSection]:
    """The run's sources: `[[data.sources]]`, or data.dataset as the one source "data"."""
    d = cfg.data
    if not d.sources:
        if not d.dataset.strip():  # it was read as the working directory: ". is not a gristmill dataset"
            raise ConfigError(
                f"data.dataset = {json.dumps(d.dataset)}: name the dataset's directory (or s3:// URL), e.g. "
                f'data.dataset = "{DataSection.dataset}"',
                "data.dataset",
            )
        # One source "data": read for as many epochs as [schedule] takes; under [[phase]] once.
        epochs = 1 if cfg.phase else None
        return [SourceSection(name="data", dataset=d.dataset, max_epochs=epochs, val_fraction=d.val_fraction)]
    given = override_of(cfg, "data.dataset")
    # "" is none: a --set cannot remove a recipe's data.dataset, and one naming it could not be switched
    # to sources from the command line (trial RV73f 7)
    if d.dataset and (d.dataset != DataSection.dataset or given):
        raise ConfigError(
            f"{given or f'data.dataset = {d.dataset!r}'} and [[data.sources]] are "
            "both set; with sources, name each dataset in a [[data.sources]] table and leave "
            'data.dataset out (or set it to "")',
            "data.dataset",
        )
    names = [src.name for src in d.sources]
    for i, src in enumerate(d.sources):
        key = f"data.sources[{i}]"
        if not _NAME.fullmatch(src.name):
            raise ConfigError(
                f"{key}.name = {src.name!r}: every source needs a unique name of letters, digits, _ and -",
                f"{key}.name",
            )
        if src.name in names[:i]:  # the later one is the one to rename (RV52b F3 blamed the first)
            raise ConfigError(
                f"{key}.name = {src.name!r} is also data.sources[{names.index(src.name)}].name: every "
                "source needs its own name",
                f"{key}.name",
            )
        if not src.dataset.strip():
            raise ConfigError(
                f"{key}.dataset = {json.dumps(src.dataset)}: give the dataset directory of {src.name!r}",
                f"{key}.dataset",
            )
        if src.max_epochs < 1:
            raise ConfigError(f"{key}.max_epochs = {src.max_epochs} must be ≥ 1", f"{key}.max_epochs")
    return [
        dataclasses.replace(
            src, val_fraction=d.val_fraction if src.val_fraction is None else src.val_fraction
        )
        for src in d.sources
    ]


def _phases(cfg: TrainConfig, names: list[str]) -> list[PhaseSection]:
    """The run's phases with steps, seq_len, micro_batch and mix filled in: `[[phase]]`, or one
    phase "main" of schedule.steps built from data.* and [schedule]. `names`: the sources'."""
    d, gbt = cfg.data, cfg.data.global_batch_tokens
    if not cfg.phase:
        if len(names) > 1:
            raise ConfigError(
                f"{len(names)} [[data.sources]] but no [[phase]]: a mixture needs its weights; add a "
                f"[[phase]] with steps (or tokens) and mix = {{ {', '.join(f'{n} = …' for n in names)} }}",
                "phase",
            )
        s = cfg.schedule
        lr = LRSection(shape="cosine", peak=cfg.optim.lr, to=cfg.optim.min_lr, warmup_steps=s.warmup_steps)
        return [
            PhaseSection(name="main", steps=s.steps, global_batch_tokens=gbt, seq_len=d.seq_len,
                         micro_batch=d.micro_batch, mix={names[0]: 1.0}, lr=lr)
        ]  # fmt: skip
    if cfg.schedule != ScheduleSection():
        raise ConfigError(
            "[schedule] is the one-phase form; with [[phase]] each phase sets its own budget (steps or "
            "tokens) and lr = { warmup_steps, shape, to }: remove [schedule]",
            "schedule",
        )
    out = []
    for i, ph in enumerate(cfg.phase):
        key = f"phase[{i}]"
        name = ph.name or f"phase{i + 1}"
        if (ph.steps is None) == (ph.tokens is None):
            raise ConfigError(f"{key} ({name}): give its budget as steps or tokens (one of them)", key)
        if ph.tokens is not None:
            check_number(f"{key}.tokens", ph.tokens, above_zero=True)
        if ph.lr.warmup_tokens is not None:
            check_number(f"{key}.lr.warmup_tokens", ph.lr.warmup_tokens)
        seq_len = d.seq_len if ph.seq_len is None else ph.seq_len
        own = ph.global_batch_tokens
        batch, batch_at = (gbt if own is None else own), batch_key(cfg, i)
        if own is not None and (isinstance(own, bool) or not isinstance(own, int) or own < 1):
            raise ConfigError(f"{batch_at} = {batch!r} must be a whole number of tokens ≥ 1", batch_at)
        if seq_len < 1 or batch % seq_len:
            raise ConfigError(
                f"{key}.seq_len = {seq_len} must divide {batch_at} = {batch} (a step holds whole sequences)",
                f"{key}.seq_len" if ph.seq_len is not None else batch_at,
            )
        steps = ph.steps if ph.steps is not None else int(ph.tokens // batch)
        if steps < 1:  # by its keys: a budget in tokens rounds down to whole steps (trial RV70b 3)
            given = (
                f"{key}.tokens = {tokens_shown(ph.tokens)} rounds down to 0 steps"
                if ph.tokens is not None
                else ""
            )
            raise ConfigError(
                f"{key} ({name}) has a budget of {steps} steps{f' ({given})' if given else ''}; it needs ≥ 1 "
                f"step of {batch_at} = {batch} tokens",
                key,
            )
        mix = dict(ph.mix) or ({names[0]: 1.0} if len(names) == 1 else {})
        if not mix:
            raise ConfigError(
                f"{key}.mix is empty: give a weight per source ({', '.join(names)})", f"{key}.mix"
            )
        for src, w in mix.items():
            if src not in names and not cfg.data.sources:  # "data", data.dataset's, is not a name given
                raise ConfigError(
                    f"{key}.mix names source {src!r}, but data.sources lists none: add a [[data.sources]] "
                    f"table for it (name = {src!r}, dataset = …)",
                    "data.sources",
                )
            if src not in names:
                raise ConfigError(
                    f"{key}.mix names source {src!r}; the sources are {', '.join(names)}", f"{key}.mix.{src}"
                )
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < math.inf:
                raise ConfigError(f"{key}.mix.{src} = {w!r} must be a number ≥ 0", f"{key}.mix.{src}")
        if sum(mix.values()) <= 0:
            raise ConfigError(
                f"{key}.mix gives every source weight 0: give at least one source a weight > 0", f"{key}.mix"
            )
        lr = ph.lr
        if lr.warmup_steps is not None and lr.warmup_tokens is not None:
            raise ConfigError(f"{key}.lr sets both warmup_steps and warmup_tokens; keep one", f"{key}.lr")
        # Tokens round up to whole steps, but never past the phase (whose budget rounds down); a
        # warmup longer than the phase's tokens is refused, as warmup_steps past its steps is (it was
        # cut to the phase without a word: review R24d 3).
        budget = ph.tokens if ph.tokens is not None else steps * batch
        if lr.warmup_tokens and lr.warmup_tokens > budget:
            raise ConfigError(
                f"{key}.lr warmup_tokens = {lr.warmup_tokens:,.0f} is longer than the phase's {budget:,.0f} "
                "tokens",
                f"{key}.lr",
            )
        by_tokens = min(math.ceil(lr.warmup_tokens / batch), steps) if lr.warmup_tokens else 0
        warmup = lr.warmup_steps or by_tokens
        if not 0 <= warmup <= steps:
            raise ConfigError(
                f"{key}.lr warmup of {warmup} steps is outside the phase's {steps}", f"{key}.lr"
            )
        if lr.shape == "constant" and lr.to is not None:
            raise ConfigError(
                f"{key}.lr: a constant piece has no `to`; use shape linear, cosine or 1-sqrt", key
            )
        for k in ("peak", "to"):
            if getattr(lr, k) is not None:
                check_number(f"{key}.lr.{k}", getattr(lr, k))
        lr = dataclasses.replace(lr, warmup_steps=warmup, warmup_tokens=None)
        micro = d.micro_batch if ph.micro_batch is None else ph.micro_batch
        out.append(dataclasses.replace(ph, name=name, steps=steps, tokens=None, global_batch_tokens=batch,
                                       seq_len=seq_len, micro_batch=micro, mix=mix, lr=lr))  # fmt: skip
    names_given = [ph.name for ph in out]
    for i, name in enumerate(names_given):
        if name in names_given[:i]:  # the later one is the one to rename, as a source's (trial RV70b 3)
            first = names_given.index(name)
            # a phase without a name is phase{i + 1}: said so, not as a name it was given (RV70e 10)
            unnamed = [f"phase[{k}]" for k in (first, i) if not cfg.phase[k].name]
            how = f" ({' and '.join(unnamed)} by default: phase[k] without a name is phase{{k + 1}})"
            raise ConfigError(
                f"phase[{i}] and phase[{first}] are both named {name!r}{how if unnamed else ''}: every phase "
                f"needs its own name; set phase[{i}].name",
                f"phase[{i}].name",
            )
    return out


def cache_of(cfg: TrainConfig) -> CacheSettings:
    """Where this run caches the blocks of s3:// sources, the bound, and how they are fetched ([data]
    cache_dir, cache_gb, fetch_requests, fetch_timeout_s)."""
    d = cfg.data
    check_number("data.cache_gb", d.cache_gb, above_zero=True)
    check_number("data.fetch_timeout_s", d.fetch_timeout_s, above_zero=True)
    if d.fetch_requests < 1:
        raise ConfigError(
            f"data.fetch_requests = {d.fetch_requests} is not allowed: it must be ≥ 1", "data.fetch_requests"
        )
    cache = CacheSettings.of(d.cache_dir, d.cache_gb, d.fetch_requests, d.fetch_timeout_s)
    if cache.dir.exists() and not cache.dir.is_dir():
        raise ConfigError(
            f"data.cache_dir = {d.cache_dir!r} is a file, not a directory; name a directory (it is created "
            "if missing)",
            "data.cache_dir",
        )
    return cache


def batch_shapes(cfg: TrainConfig, spec: RunSpec, world_size: int) -> tuple[BatchShape, ...]:
    """Each phase's batch arithmetic for `world_size` data-parallel ranks; a ConfigError naming the
    keys when a phase's global batch does not split into whole micro-batches per rank."""
    dp = world_size  # every rank is data-parallel (FSDP/HSDP); mesh_shape checks replicate × shard
    shapes = []
    for i, ph in enumerate(spec.phases):
        g = ph.global_batch_tokens // ph.seq_len
        what = (
            "data.micro_batch"
            if not cfg.phase or cfg.phase[i].micro_batch is None
            else f"phase[{i}].micro_batch"
        )
        batch_at = batch_key(cfg, i)
        if ph.micro_batch < 1:
            raise ConfigError(f"{what} = {ph.micro_batch} must be ≥ 1 (sequences per micro-batch)", what)
        if g % (dp * ph.micro_batch):
            # a resume keeps the run's batches: its global batch is no way out (trial RV67c F4b)
            keys = (
                f"{what} or the number of ranks"
                if cfg.checkpoint.resume
                else f"{what}, {batch_at} or the number of ranks"
            )
            raise ConfigError(
                f"the global batch of {g} sequences ({batch_at} {ph.global_batch_tokens} / "
                f"seq_len {ph.seq_len}{'' if not cfg.phase else f' of phase {ph.name!r}'}) is not divisible "
                f"by {dp} data-parallel rank(s) × {what} {ph.micro_batch} = {dp * ph.micro_batch}; change "
                + keys
                # a resume may not change a finished phase's batch: the ranks must divide it (R18b 2)
                + (" (every phase's batch must split, a finished one's too)" if len(spec.phases) > 1 else "")
            )
        shapes.append(
            BatchShape(g, dp, ph.micro_batch, g // (dp * ph.micro_batch), ph.seq_len, ph.name, ph.steps)
        )
    return tuple(shapes)


def check_config(cfg: TrainConfig, world_size: int) -> RunSpec:
    """Everything about the recipe that can be checked before any work, for `world_size` ranks
    (each phase's batch shape too, `batch_shapes`); returns the resolved recipe. A refusal names the
    override that set its key."""
    try:
        return _checked_config(cfg, world_size)
    except ConfigError as e:
        raise naming_override(e, cfg) from None


def _checked_config(cfg: TrainConfig, world_size: int) -> RunSpec:
    d, r = cfg.data, cfg.run
    refuse_url("run.output_dir", r.output_dir)  # runs are local; their datasets may be in a bucket
    check_model_section(cfg.model)
    check_parallel_section(cfg.parallel)
    for name in ("seq_len", "micro_batch", "global_batch_tokens"):  # each named apart (RV52b F4)
        if getattr(d, name) < 1:
            raise ConfigError(f"data.{name} = {getattr(d, name)} must be ≥ 1", f"data.{name}")
    if not cfg.phase and d.global_batch_tokens % d.seq_len:
        lo = d.global_batch_tokens // d.seq_len * d.seq_len
        use = (
            f"{lo} or {lo + d.seq_len}"
            if lo  # below one sequence per step there is no lower multiple to suggest
            else f"data.global_batch_tokens = {d.seq_len} (one sequence per step) or a multiple of it, or a "
            f"data.seq_len that divides {d.global_batch_tokens}"
        )
        raise ConfigError(
            f"data.global_batch_tokens = {d.global_batch_tokens} is not a multiple of data.seq_len = "
            f"{d.seq_len}; use {use}",
            "data.global_batch_tokens",
        )
    s = cfg.schedule
    if not cfg.phase and (s.steps < 1 or not 0 <= s.warmup_steps <= s.steps):
        raise ConfigError(
            f"need schedule.steps ≥ 1 and 0 ≤ schedule.warmup_steps ≤ schedule.steps; got steps {s.steps}, "
            f"warmup_steps {s.warmup_steps}"
        )
    spec = resolve(cfg)
    batch_shapes(cfg, spec, world_size)  # a batch that does not split over the ranks fails here
    for src in spec.sources:
        if not 0.0 <= src.val_fraction < 1.0:
            raise ConfigError(f"val_fraction = {src.val_fraction} of source {src.name!r} must be in [0, 1)")
    if d.num_workers < 0 or r.threads < 0:
        raise ConfigError(
            f"data.num_workers ({d.num_workers}) and run.threads ({r.threads}) must be ≥ 0 (0: read in the "
            "training process / torch's default thread count)"
        )
    held_out = [src.name for src in spec.sources if src.val_fraction > 0]
    if cfg.eval.source and cfg.eval.source not in held_out:
        raise ConfigError(
            f"eval.source = {cfg.eval.source!r}: not a source with held-out documents; the sources with some "
            f"are {', '.join(held_out) or 'none (set a val_fraction)'}",
            "eval.source",
        )
    check_training(cfg, spec.last_step)
    return spec


def applied_config(cfg: TrainConfig, spec: RunSpec) -> dict[str, Any]:
    """What RUN/config.toml records: the config as it applies, so that `gristmill train --config
    RUN/config.toml` (into another run.output_dir) reproduces the run and no key in it is one a
    fresh run would refuse. Left out: data.dataset and data.val_fraction beside [[data.sources]]
    (each source gets its own val_fraction written), [schedule] and data.seq_len beside [[phase]]
    (each phase gets its own seq_len written), the default preset of a run from a base model
    (model.init_from gives its shape), and checkpoint.resume (how a run was started, not what it
    trains)."""
    d = to_dict(cfg)
    if cfg.data.sources:
        del d["data"]["dataset"], d["data"]["val_fraction"]
        for raw, src in zip(d["data"]["sources"], spec.sources):
            raw["val_fraction"] = src.val_fraction
    if cfg.phase:
        del d["schedule"], d["data"]["seq_len"]
        for raw, ph in zip(d["phase"], spec.phases):
            raw["seq_len"] = ph.seq_len
    if cfg.model.init_from and cfg.model.preset == ModelSection.preset:
        del d["model"]["preset"]
    del d["checkpoint"]["resume"]
    return d
