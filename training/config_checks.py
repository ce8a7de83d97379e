"""What a run derives from its `TrainConfig` and checks before any work (split from the schema in
training/config.py, which holds only what the keys mean).

The recipe is resolved once, into a frozen `RunSpec` (its sources, phases, seq_lens and, for a
world size, each phase's batch shape; the model once resolved) that preflight, `gristmill train
--plan`, `data inspect`, export, eval and the training loop all share: `resolve(cfg)` derives it
from the config alone (export and eval: no world size), `check_config(cfg, world_size)` adds every
check that can be made without touching a GPU, a process group or the model (batch sizes, mesh
shape, schedule), so an impossible recipe fails in the first second with the numbers in the
message. `resolve_model_config` adds the model (it needs the dataset and the base), and
`applied_config` is the config RUN/config.toml records: only the keys that apply.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from training.config import (
    TRACKERS,
    DataSection,
    LRSection,
    MetricsSection,
    ModelSection,
    OptimSection,
    ParallelConfig,
    PhaseSection,
    ScheduleSection,
    SourceSection,
    TrainConfig,
)
from training.contract.config_loader import ConfigError, override_of, to_dict
from training.contract.errors import GristmillError
from training.data.remote import CacheSettings

if TYPE_CHECKING:
    from training.checkpoint.base_source import BaseSource

# Presets whose vocabulary is the dataset's own (a tokenizer trained for the demo corpus); the real
# presets keep their published vocab size so their parameter count matches the reference runs.
VOCAB_FROM_DATASET_PRESETS = ("tiny", "demo")


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
    """A recipe resolved once: what preflight, --plan, inspect, export, eval and the loop share."""

    sources: tuple[SourceSection, ...]  # [[data.sources]], or data.dataset as the one source "data"
    phases: tuple[PhaseSection, ...]  # [[phase]], or the one phase "main" of [schedule]; filled in
    seq_lens: tuple[tuple[str, int], ...]  # per phase: (the key that sets it, seq_len)
    shapes: tuple[BatchShape, ...] = ()  # per phase, for a world size (check_config)
    model: Any = None  # training.model.ModelConfig once resolved (resolve_model_config)
    cache: CacheSettings | None = None  # where s3:// sources are cached ([data] cache_dir, cache_gb)

    @property
    def last_step(self) -> int:
        """The plan's last step: the sum of the phases' budgets."""
        return sum(ph.steps for ph in self.phases)


BATCH_LR_RULES: dict[str, dict[str, str]] = {
    # optim.name → the optim.batch_lr_scaling rules it supports, each with its evidence
    "adamw": {
        "none": "the LRs as written",
        "sqrt": "Adam's square-root scaling rule (Malladi et al., NeurIPS 2022, 'On the SDEs and Scaling "
        "Rules for Adaptive Gradient Algorithms'; OLMo-core's batch-size warmup scales Adam's LR by √ratio)",
    },
    "muon": {"none": "the LRs as written (no published batch-size rule for Muon that we know of)"},
}
BATCH_LR_RULES["adamw8bit"] = BATCH_LR_RULES["adamw"]  # Adam's update rule, 8-bit moments
_LINEAR_RULE = "linear scaling is SGD's rule (Goyal et al. 2017, 'Accurate, Large Minibatch SGD')"


def batch_key(cfg: TrainConfig, phase: int) -> str:
    """The config key that sets phase `phase`'s tokens per step (its own, or [data]'s)."""
    own = cfg.phase and cfg.phase[phase].global_batch_tokens is not None
    return f"phase[{phase}].global_batch_tokens" if own else "data.global_batch_tokens"


def batch_lr_factor(rule: str, batch: int, first_batch: int) -> float:
    """The factor optim.batch_lr_scaling `rule` puts on the LR piece of a phase of `batch` tokens per
    step, measured against the first phase's `first_batch` (exactly 1.0 for the same batch)."""
    if rule == "none" or batch == first_batch:
        return 1.0
    return math.sqrt(batch / first_batch) if rule == "sqrt" else batch / first_batch


def check_batch_lr_scaling(optim: OptimSection) -> None:
    """optim.batch_lr_scaling must be a rule optim.name has evidence for (BATCH_LR_RULES)."""
    rule, rules = optim.batch_lr_scaling, BATCH_LR_RULES.get(optim.name, {"none": ""})
    if rule in rules:
        return
    why = _LINEAR_RULE if rule == "linear" else f"{rule!r} is not a rule gristmill knows"
    raise ConfigError(
        f"optim.batch_lr_scaling = {rule!r} is not supported with optim.name = {optim.name!r} ({why}); "
        f"{optim.name} supports {' or '.join(repr(r) for r in rules)} — set optim.batch_lr_scaling to one "
        "of them, or give each phase its lr.peak",
        "optim.batch_lr_scaling",
    )


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
        # One source "data": read for as many epochs as [schedule] takes; under [[phase]] once.
        epochs = 1 if cfg.phase else None
        return [SourceSection(name="data", dataset=d.dataset, max_epochs=epochs, val_fraction=d.val_fraction)]
    given = override_of(cfg, "data.dataset")
    if d.dataset != DataSection.dataset or given:
        raise ConfigError(
            f"{f'--set {given}' if given else f'data.dataset = {d.dataset!r}'} and [[data.sources]] are "
            "both set; with sources, name each dataset in a [[data.sources]] table and leave "
            "data.dataset out",
            "data.dataset",
        )
    names = [src.name for src in d.sources]
    for i, src in enumerate(d.sources):
        key = f"data.sources[{i}]"
        if not _NAME.fullmatch(src.name) or names.count(src.name) > 1:
            raise ConfigError(
                f"{key}.name = {src.name!r}: every source needs a unique name of letters, digits, _ and -",
                f"{key}.name",
            )
        if not src.dataset:
            raise ConfigError(f"{key}.dataset is empty: give the dataset directory of {src.name!r}", key)
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
        if steps < 1:
            raise ConfigError(
                f"{key} ({name}) has a budget of {steps} steps; it needs ≥ 1 step of {batch} tokens", key
            )
        mix = dict(ph.mix) or ({names[0]: 1.0} if len(names) == 1 else {})
        if not mix:
            raise ConfigError(
                f"{key}.mix is empty: give a weight per source ({', '.join(names)})", f"{key}.mix"
            )
        for src, w in mix.items():
            if src not in names:
                raise ConfigError(
                    f"{key}.mix names source {src!r}; the sources are {', '.join(names)}", f"{key}.mix.{src}"
                )
            if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w < math.inf:
                raise ConfigError(f"{key}.mix.{src} = {w!r} must be a number ≥ 0", f"{key}.mix.{src}")
        if sum(mix.values()) <= 0:
            raise ConfigError(f"{key}.mix gives every source weight 0", f"{key}.mix")
        lr = ph.lr
        if lr.warmup_steps is not None and lr.warmup_tokens is not None:
            raise ConfigError(f"{key}.lr sets both warmup_steps and warmup_tokens; keep one", f"{key}.lr")
        # Tokens round up to whole steps, but never past the phase (whose budget rounds down).
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
    if len({ph.name for ph in out}) < len(out):
        raise ConfigError(f"phase names must be unique, got {[ph.name for ph in out]}", "phase")
    return out


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


def trackers_of(m: MetricsSection) -> tuple[list[str], str, list[str]]:
    """The trackers and the wandb/trackio project of [metrics] with `tensorboard = false` and the
    older `wandb_project` folded in, and a note when wandb_project is used. ConfigError for an
    unknown tracker, or for wandb/trackio when its package is missing (found without importing it,
    so this stays fast; a missing tensorboard is only a note when the writer starts)."""
    names, project, notes = list(dict.fromkeys(m.trackers)), m.project, []
    if m.wandb_project:
        if m.project not in (MetricsSection.project, m.wandb_project):
            raise ConfigError(
                f"metrics.wandb_project = {m.wandb_project!r} and metrics.project = {m.project!r}: keep "
                "metrics.project (wandb_project is the older key)",
                "metrics.wandb_project",
            )
        names += [] if "wandb" in names else ["wandb"]
        project = m.wandb_project
        notes.append(
            f"note: metrics.wandb_project is the older key; write metrics.trackers = {json.dumps(names)} and "
            f"metrics.project = {json.dumps(project)}"
        )
    if not m.tensorboard:
        names = [n for n in names if n != "tensorboard"]
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"metrics.trackers: unknown tracker {name!r}; the known ones are {', '.join(TRACKERS)}",
                "metrics.trackers",
            )
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise ConfigError(
                f'metrics.trackers includes "{name}" but {name} is not installed: '
                f"pip install 'gristmill[{name}]'",
                "metrics.trackers",
            )
    return names, project, notes


def check_number(key: str, value: float, *, above_zero: bool = False, note: str = "") -> None:
    """ConfigError unless `value` is finite and ≥ 0 (> 0 with `above_zero`); TOML spells nan and inf
    as plain floats, and every comparison with nan is false, so a `< 0` test alone lets them through."""
    if math.isfinite(value) and (value > 0 if above_zero else value >= 0):
        return
    raise ConfigError(
        f"{key} = {value} is not allowed: it must be a finite number {'> 0' if above_zero else '≥ 0'}{note}",
        key,
    )


def cache_of(cfg: TrainConfig) -> CacheSettings:
    """Where this run caches the shards of s3:// sources, and the bound ([data] cache_dir, cache_gb)."""
    d = cfg.data
    check_number("data.cache_gb", d.cache_gb, above_zero=True)
    cache = CacheSettings.of(d.cache_dir, d.cache_gb)
    if cache.dir.exists() and not cache.dir.is_dir():
        raise ConfigError(
            f"data.cache_dir = {d.cache_dir!r} is a file, not a directory; name a directory (it is created "
            "if missing)",
            "data.cache_dir",
        )
    return cache


# [model] overrides that must be positive numbers when set (None: the preset's value).
_MODEL_POSITIVE_INTS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len")
_MODEL_POSITIVE_FLOATS = ("rope_theta", "norm_eps", "init_std")


def check_model_section(m: ModelSection) -> None:
    """The [model] overrides that are wrong whatever the preset (ModelConfig checks how the shape fits
    together once torch is imported): a zero init_std trains nothing, a zero or negative norm_eps or
    rope_theta makes NaNs."""
    for name in _MODEL_POSITIVE_INTS:
        value = getattr(m, name)
        if value is not None and value < 1:
            raise ConfigError(f"model.{name} = {value} is not allowed: it must be ≥ 1", f"model.{name}")
    if m.loss_chunk is not None and m.loss_chunk < 0:
        raise ConfigError(
            f"model.loss_chunk = {m.loss_chunk} is not allowed: it must be ≥ 0 (0: all at once)",
            "model.loss_chunk",
        )
    for name in _MODEL_POSITIVE_FLOATS:
        value = getattr(m, name)
        if value is not None:
            check_number(f"model.{name}", value, above_zero=True)


def check_parallel_section(p: ParallelConfig) -> None:
    """The [parallel] values that are wrong whatever the world size (mesh_shape checks how replicate
    and shard fit the ranks). The TOML loader already refuses other strings for the Literal keys;
    this also catches a ParallelConfig built in code (benchmarks, tests): training.parallelize calls
    it before it uses one."""
    if p.activation_checkpoint not in ("none", "selective", "full"):
        raise ConfigError(
            f"parallel.activation_checkpoint = {p.activation_checkpoint!r} must be none, selective or full",
            "parallel.activation_checkpoint",
        )
    for key in ("param_dtype", "reduce_dtype"):
        if getattr(p, key) not in ("bfloat16", "float32"):
            raise ConfigError(
                f"parallel.{key} = {getattr(p, key)!r} must be bfloat16 or float32", f"parallel.{key}"
            )
    if p.replicate < 1:
        raise ConfigError(f"parallel.replicate = {p.replicate} must be ≥ 1", "parallel.replicate")
    if p.shard != -1 and p.shard < 1:
        raise ConfigError(
            f"parallel.shard = {p.shard} must be ≥ 1 or -1 (= world_size // replicate)", "parallel.shard"
        )


def mesh_shape(cfg: ParallelConfig, world_size: int) -> tuple[int, int] | None:
    """(replicate, shard) for `world_size` ranks, or None for a single process; checked, no process
    group needed (the trainer calls it before any work, `build_mesh` again on every rank)."""
    check_parallel_section(cfg)  # replicate ≥ 1 and shard ≥ 1 or -1, also for a ParallelConfig built in code
    if world_size == 1:
        if cfg.replicate != 1 or cfg.shard not in (-1, 1):
            raise GristmillError(
                f"parallel.replicate={cfg.replicate} x parallel.shard={cfg.shard} needs that many ranks, "
                "but this is a single process; launch with torchrun --nproc_per_node=N or use the defaults"
            )
        return None
    shard = cfg.shard
    if shard == -1:
        if world_size % cfg.replicate:
            raise GristmillError(
                f"world size {world_size} is not divisible by parallel.replicate={cfg.replicate}; "
                "choose a replicate count that divides the number of ranks"
            )
        shard = world_size // cfg.replicate
    if cfg.replicate * shard != world_size:
        raise GristmillError(
            f"parallel.replicate={cfg.replicate} x parallel.shard={shard} = {cfg.replicate * shard} ranks, "
            f"but the world size is {world_size}; make the product equal the number of ranks "
            "(or set shard = -1)"
        )
    return cfg.replicate, shard


def check_config(cfg: TrainConfig, world_size: int) -> RunSpec:
    """Everything about the recipe that can be checked before any work; returns the resolved recipe
    with the batch shape of each phase for `world_size` ranks."""
    d, o, r = cfg.data, cfg.optim, cfg.run
    check_model_section(cfg.model)
    check_parallel_section(cfg.parallel)
    if d.seq_len < 1 or d.micro_batch < 1 or d.global_batch_tokens < 1:
        raise ConfigError(
            f"data.seq_len ({d.seq_len}), data.micro_batch ({d.micro_batch}) and data.global_batch_tokens "
            f"({d.global_batch_tokens}) must all be positive"
        )
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
    dp = world_size  # every rank is data-parallel (FSDP/HSDP); mesh_shape checks replicate × shard
    plans = []
    for i, ph in enumerate(spec.phases):
        g = ph.global_batch_tokens // ph.seq_len
        what = (
            "data.micro_batch"
            if not cfg.phase or cfg.phase[i].micro_batch is None
            else f"phase[{i}].micro_batch"
        )
        batch_at = batch_key(cfg, i)
        if ph.micro_batch < 1 or g % (dp * ph.micro_batch):
            raise ConfigError(
                f"the global batch of {g} sequences ({batch_at} {ph.global_batch_tokens} / "
                f"seq_len {ph.seq_len}{'' if not cfg.phase else f' of phase {ph.name!r}'}) is not divisible "
                f"by {dp} data-parallel rank(s) × {what} {ph.micro_batch} = {dp * ph.micro_batch}; change "
                f"{what}, {batch_at} or the number of ranks"
            )
        plans.append(
            BatchShape(g, dp, ph.micro_batch, g // (dp * ph.micro_batch), ph.seq_len, ph.name, ph.steps)
        )
    for src in spec.sources:
        if not 0.0 <= src.val_fraction < 1.0:
            raise ConfigError(f"val_fraction = {src.val_fraction} of source {src.name!r} must be in [0, 1)")
    if d.num_workers < 0 or r.threads < 0:
        raise ConfigError(
            f"data.num_workers ({d.num_workers}) and run.threads ({r.threads}) must be ≥ 0 (0: read in the "
            "training process / torch's default thread count)"
        )
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas = {o.betas} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
    check_number("optim.lr", o.lr, above_zero=True)
    check_batch_lr_scaling(o)
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(
            f"need 0 ≤ optim.min_lr ≤ optim.lr; got lr {o.lr}, min_lr {o.min_lr}", "optim.min_lr"
        )
    check_number("optim.eps", o.eps, above_zero=True)
    check_number("optim.weight_decay", o.weight_decay, note=" (0: no weight decay)")
    check_number("optim.grad_clip", o.grad_clip, note=" (0: no clipping)")
    if not 0.0 <= o.muon_momentum < 1.0:
        raise ConfigError(
            f"optim.muon_momentum = {o.muon_momentum} must be in [0, 1), e.g. 0.95", "optim.muon_momentum"
        )
    if o.muon_ns_steps < 1:
        raise ConfigError(
            f"optim.muon_ns_steps = {o.muon_ns_steps} must be ≥ 1, e.g. 5", "optim.muon_ns_steps"
        )
    last = sum(p.steps for p in plans)
    if r.max_steps is not None and not 1 <= r.max_steps <= last:
        raise ConfigError(
            f"run.max_steps = {r.max_steps} must be between 1 and the plan's {last} steps "
            f"({'raise schedule.steps' if not cfg.phase else 'add to the phases budgets'} to train longer)"
        )
    if r.max_skipped < 1 or r.spike_window < 2:
        raise ConfigError(
            f"need run.max_skipped ≥ 1 and run.spike_window ≥ 2; got {r.max_skipped}, {r.spike_window}"
        )
    check_number("run.spike_sigma", r.spike_sigma, note=" (0: no spike detection)")
    check_rewind(cfg)
    if r.log_every < 1 or r.val_every < 0 or r.val_batches < 1:
        raise ConfigError(
            f"need run.log_every ≥ 1, run.val_every ≥ 0, run.val_batches ≥ 1; got {r.log_every}, "
            f"{r.val_every}, {r.val_batches}"
        )
    trackers_of(cfg.metrics)  # an unknown tracker or a missing package fails before any work
    c = cfg.checkpoint
    if c.interval < 0 or c.keep_last < 0 or c.export_interval < 0:
        raise ConfigError(
            f"checkpoint.interval ({c.interval}), keep_last ({c.keep_last}) and export_interval "
            f"({c.export_interval}) must be ≥ 0"
        )
    check_number("checkpoint.min_free_factor", c.min_free_factor, note=" (0: no free-space check)")
    if c.export_interval and (not c.interval or c.export_interval % c.interval):
        raise ConfigError(
            f"checkpoint.export_interval = {c.export_interval} must be a multiple of checkpoint.interval = "
            f"{c.interval} (an export is made from the checkpoint of its step)"
        )
    e = cfg.eval
    if e.interval < 0 or e.limit < 0 or e.batch_size < 1 or (e.interval and not e.tasks):
        raise ConfigError(
            f"need eval.interval ≥ 0, eval.limit ≥ 0, eval.batch_size ≥ 1 and, with an interval, some "
            f"eval.tasks; got interval {e.interval}, limit {e.limit}, batch_size {e.batch_size}, "
            f"tasks {e.tasks}"
        )
    held_out = [src.name for src in spec.sources if src.val_fraction > 0]
    if e.source and e.source not in held_out:
        raise ConfigError(
            f"eval.source = {e.source!r}: not a source with held-out documents; the sources with some are "
            f"{', '.join(held_out) or 'none (set a val_fraction)'}",
            "eval.source",
        )
    if e.interval and importlib.util.find_spec("lm_eval") is None:  # found without importing it
        raise ConfigError(
            f"eval.interval = {e.interval} runs lm-eval during training, and lm-eval is "
            "not installed: pip install 'gristmill[eval]', or set eval.interval=0",
            "eval.interval",
        )
    return dataclasses.replace(spec, shapes=tuple(plans))


def _base_overrides(base: BaseSource, overrides: dict) -> dict:
    """[model] overrides with the base's shape on top: a key set in both must agree. The shape is the
    base's config.json, or on a resume that does not read the base again the checkpoint's record
    (`base`: where model.init_from was located)."""
    # torch-heavy, like training.model below: imported when a run starts
    from training.checkpoint.hf_import import BASE_FIELDS, LLAMA3_FIELDS, base_model_fields, base_sha256

    if base.directory is None:
        record = base.recorded
        keys = BASE_FIELDS + (LLAMA3_FIELDS if record.get("rope_type") == "llama3" else ())
        fields = {k: record[k] for k in keys if k in record}
        where, sha = "recorded in the checkpoint resumed", record["init_from_sha256"]
    else:
        fields = base_model_fields(base.directory)
        where, sha = base.directory / "config.json", base_sha256(base.directory)
    for key, value in fields.items():
        if key in overrides and overrides[key] != value:
            raise ConfigError(
                f"model.{key} = {json.dumps(overrides[key])} disagrees with the base model's "
                f"{json.dumps(value)} ({where}); remove model.{key} (the base decides it)",
                f"model.{key}",
            )
    return overrides | fields | {"init_from": base.identity, "init_from_sha256": sha}


def resolve_model_config(
    section: ModelSection,
    dataset_info: dict,
    seq_lens: Sequence[tuple[str, int]],
    source: BaseSource | None = None,
):
    """The ModelConfig to build: preset + overrides + the vocabulary rule, checked against the dataset
    and every phase's seq_len (RunSpec.seq_lens). `--plan` and the trainer both call it. `source`: where
    model.init_from was located (training.checkpoint.base_source.locate_base; located here when None)."""
    from training.model import PRESETS  # the model module is heavier; import when a run starts

    if section.preset not in PRESETS:
        raise ConfigError(f"model.preset = {section.preset!r} is not one of {', '.join(sorted(PRESETS))}")
    base = PRESETS[section.preset]
    names = {f.name for f in dataclasses.fields(base)}
    overrides = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name in ("preset", "init_from") or value is None:
            continue
        if f.name not in names:  # the model grew or lost a field; keep the two in step
            raise ConfigError(f"model.{f.name} is not a field of training.model.ModelConfig")
        overrides[f.name] = value
    data_vocab = int(dataset_info["vocab_size"])
    if section.init_from:
        if source is None:
            from training.checkpoint.base_source import locate_base

            source = locate_base(section.init_from)
        overrides = _base_overrides(source, overrides)
    elif section.vocab_size is None and section.preset in VOCAB_FROM_DATASET_PRESETS:
        overrides["vocab_size"] = data_vocab
    try:
        mcfg = dataclasses.replace(base, **overrides)
    except ValueError as e:  # ModelConfig checks its own shape (heads divide dim, ...)
        raise ConfigError(f"model: {e}") from None
    # With init_from a smaller data vocabulary is fine: check_base_data refuses a larger one, naming
    # both files, before step 1.
    if not section.init_from and mcfg.vocab_size != data_vocab:
        raise ConfigError(
            f"the model's vocab_size {mcfg.vocab_size} (preset {section.preset!r}) differs from the "
            f"dataset's {data_vocab} (dataset.json of data.dataset); set model.vocab_size = {data_vocab} or "
            f"train on a dataset built with a {mcfg.vocab_size}-token tokenizer"
        )
    sep = int(dataset_info["separator"]["id"])
    if not 0 <= sep < mcfg.vocab_size:
        raise ConfigError(
            f"the dataset's separator id {sep} is outside the model's vocabulary "
            f"(vocab_size {mcfg.vocab_size})"
        )
    for key, seq_len in seq_lens:
        if seq_len <= mcfg.max_seq_len:
            continue
        if not section.init_from:
            raise ConfigError(
                f"{key} = {seq_len} exceeds the model's max_seq_len = {mcfg.max_seq_len} (preset "
                f"{section.preset!r}); lower {key} or set model.max_seq_len ≥ {seq_len}",
                key,
            )
        # The base decides max_seq_len (model.max_seq_len may only repeat it): the options are the data's.
        where = "recorded in the checkpoint" if source.directory is None else source.directory / "config.json"
        raise ConfigError(
            f"{key} = {seq_len} exceeds the base model's max_position_embeddings = {mcfg.max_seq_len} "
            f"({where}); lower {key} to ≤ {mcfg.max_seq_len}, or start from a base trained for "
            f"{seq_len} positions (raising max_position_embeddings in a copy of the base's config.json makes "
            "the run train positions the base never saw)",
            key,
        )
    return mcfg


def check_rewind(cfg: TrainConfig) -> None:
    """A rewind needs checkpoints to go back to and a spike rule to act on."""
    r, w = cfg.run, cfg.run.rewind
    for key, value, least in (("skip_steps", w.skip_steps, 1), ("margin_steps", w.margin_steps, 0),
                              ("max_rewinds", w.max_rewinds, 1)):  # fmt: skip
        if not isinstance(value, int) or value < least:
            raise ConfigError(
                f"run.rewind.{key} = {value!r} must be an integer ≥ {least}", f"run.rewind.{key}"
            )
    rewinds = [k for k, v in (("on_spike", r.on_spike), ("on_nonfinite", r.on_nonfinite)) if v == "rewind"]
    if rewinds and cfg.checkpoint.interval < 1:
        other = "report" if rewinds[0] == "on_spike" else "stop"
        raise ConfigError(
            f"run.{rewinds[0]} = 'rewind' goes back to a checkpoint, but checkpoint.interval = "
            f"{cfg.checkpoint.interval} saves none during the run; set checkpoint.interval (e.g. "
            f"{max(1, w.margin_steps)}) or run.{rewinds[0]} = '{other}'",
            "checkpoint.interval",
        )
    if r.on_spike == "rewind" and r.spike_sigma <= 0:
        raise ConfigError(
            "run.on_spike = 'rewind' acts on spikes, but run.spike_sigma = 0 detects none; set "
            "run.spike_sigma (e.g. 6)",
            "run.spike_sigma",
        )
