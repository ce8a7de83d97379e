"""The training recipe: a `TrainConfig` tree of dataclasses, one documented field each.

Loaded with `training.contract.config_loader.load_config(TrainConfig, path, ["optim.lr=1e-4", ...])`; the
resolved config is written to RUN/config.toml. `check_config` does all the arithmetic that can be
done without touching a GPU, a process group or the model (batch sizes, mesh shape, schedule),
so an impossible recipe fails in the first second with the numbers in the message.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import re
from dataclasses import dataclass, field
from typing import Literal

from training.contract.config_loader import ConfigError, load_config
from training.contract.errors import GristmillError

# Presets whose vocabulary is the dataset's own (a tokenizer trained for the demo corpus); the real
# presets keep their published vocab size so their parameter count matches the reference runs.
VOCAB_FROM_DATASET_PRESETS = ("tiny", "demo")


@dataclass
class ModelSection:
    """A preset from training.model.PRESETS plus optional overrides of its ModelConfig fields.

    Every field except `preset` defaults to None, meaning "the preset's value".
    """

    preset: str = "tiny"
    """Base shape: one of training.model.PRESETS ("tiny", "demo", "llama3-1b", "llama3-8b")."""
    dim: int | None = None
    """Hidden size."""
    n_layers: int | None = None
    """Number of transformer blocks."""
    n_heads: int | None = None
    """Attention (query) heads."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); must divide n_heads."""
    ffn_dim: int | None = None
    """SwiGLU hidden size."""
    vocab_size: int | None = None
    """Embedding rows. None: the dataset's vocab_size (dataset.json) for the tiny and demo presets,
    the preset's own for the real ones (their parameter counts are the published ones). Must equal
    the dataset's vocab_size either way (the loader checks it too)."""
    rope_theta: float | None = None
    """RoPE base frequency."""
    norm_eps: float | None = None
    """RMSNorm epsilon."""
    tie_embeddings: bool | None = None
    """Share the input embedding and the LM head weight."""
    max_seq_len: int | None = None
    """Longest sequence the model supports (RoPE table); must be ≥ data.seq_len."""
    init_std: float | None = None
    """Standard deviation of the weight initialisation."""
    document_mask: bool | None = None
    """Mask attention across document boundaries (uses the loader's position ids)."""
    loss_chunk: int | None = None
    """Compute the LM head + cross-entropy in chunks of this many tokens (0: all at once)."""


@dataclass
class DataSection:
    dataset: str = "runs/data/demo"
    """Dataset directory written by `gristmill data build` (holds dataset.json)."""
    seq_len: int = 256
    """Tokens per training sequence."""
    global_batch_tokens: int = 16384
    """Tokens per optimizer step over all ranks; a multiple of seq_len. The global batch is
    G = global_batch_tokens // seq_len sequences (≈1M tokens for the real recipes)."""
    micro_batch: int = 8
    """Sequences per forward/backward on one rank; G must be divisible by ranks × micro_batch, and
    the quotient is the number of gradient-accumulation steps."""
    seed: int = 1234
    """Shuffle seed of the loader (sample order is a pure function of dataset, seed, epoch, seq_len)."""
    num_workers: int = 0
    """Loader worker processes (0: read in the training process)."""
    val_fraction: float = 0.0
    """Fraction of the dataset held out for validation (TokenLoader split="val"); 0 disables it."""
    sources: list[SourceSection] = field(default_factory=list)
    """A mixture of datasets (`[[data.sources]]`), trained in the `[[phase]]`s; empty: the one
    dataset of `data.dataset`."""
    check_separators: bool = True
    """Verify on the fly that every window keeps one separator per document and ids < vocab (on by
    default: it costs a fraction of a loader that outruns any GPU, and catches corrupted shards
    before they become gradients)."""


@dataclass
class SourceSection:
    """One dataset of a mixture (`[[data.sources]]`); phases name it in their `mix`."""

    name: str = ""
    """The source's name in phase mixes, metrics (tokens/NAME, val/NAME) and the audit's
    `consumption` view: letters, digits, `_` and `-`."""
    dataset: str = ""
    """Dataset directory written by `gristmill data build`. Every source of a run must share one
    tokenizer (the same tokenizer.json hash)."""
    max_epochs: int | None = 1
    """Epochs of this source the plan may read. A plan that needs more is refused before step 1,
    naming the source and both token counts; > 1 repeats it, each epoch reshuffled. (data.dataset
    with [schedule], the one-source form, reads its dataset for as many epochs as the schedule takes.)"""
    val_fraction: float | None = None
    """Fraction held out for validation (`val/NAME`); None: data.val_fraction."""


@dataclass
class LRSection:
    """A phase's learning-rate piece: optional (re-)warmup, then `shape` from `peak` to `to`."""

    shape: Literal["constant", "cosine", "linear", "1-sqrt"] = "cosine"
    """After warmup: stay at `peak` (constant), or go from `peak` to `to` by a cosine, a straight
    line, or 1-sqrt (the decay of warmup-stable-decay), reaching `to` at the phase's last step."""
    peak: float | None = None
    """LR after warmup. None: optim.lr in the first phase, the LR the previous phase ended at in
    the others (a continuous curve)."""
    to: float | None = None
    """LR at the phase's last step (not for `constant`). None: optim.min_lr."""
    warmup_steps: int | None = None
    """Linear warmup over this many steps, from the previous phase's last LR (0 in the first
    phase) to `peak`; later phases use it to re-warm. None: 0 (or warmup_tokens)."""
    warmup_tokens: float | None = None
    """Warmup given in tokens (rounded up to whole steps of data.global_batch_tokens)."""


@dataclass
class PhaseSection:
    """One phase of the plan (`[[phase]]`, in order): a budget, a seq_len, a mix, an LR piece."""

    name: str = ""
    """The phase's name in the plan table, metrics.jsonl (`phase`) and the audit."""
    steps: int | None = None
    """Budget in optimizer steps (this or `tokens`)."""
    tokens: float | None = None
    """Budget in tokens (e.g. 18e9): steps = tokens // data.global_batch_tokens."""
    seq_len: int | None = None
    """Sequence length of the phase (None: data.seq_len). A change re-cuts every source's stream
    from its current token: no token is read twice or skipped."""
    micro_batch: int | None = None
    """Sequences per forward/backward per rank in this phase (None: data.micro_batch)."""
    mix: dict[str, float] = field(default_factory=dict)
    """Weight per source name (normalised; a source left out gets 0). May be omitted with one source."""
    lr: LRSection = field(default_factory=LRSection)
    """The phase's learning-rate piece."""


@dataclass
class OptimSection:
    name: Literal["adamw", "adamw8bit"] = "adamw"
    """"adamw" (torch), or "adamw8bit" (bitsandbytes; CUDA only, refused elsewhere)."""
    lr: float = 3e-4
    """Peak learning rate, reached at the end of warmup."""
    min_lr: float = 3e-5
    """Final learning rate of the cosine decay (10% of the peak in the reference runs)."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW (β1, β2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay; never applied to norms and biases (parameters with < 2 dims)."""
    decay_embeddings: bool = True
    """Apply weight decay to embedding tables too (a tied LM head shares the embedding's setting)."""
    fused: bool | None = None
    """Fused AdamW kernel (CUDA and CPU); None: on. Off, a skipped non-finite step costs a host sync
    every step (the fused kernel takes the skip flag on the device: training.divergence)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping; the norm is still logged)."""


@dataclass
class ScheduleSection:
    warmup_steps: int = 100
    """Linear warmup from lr/warmup_steps to optim.lr over this many steps."""
    steps: int = 1000
    """Total optimizer steps of the schedule; cosine decay from optim.lr to optim.min_lr after warmup."""


@dataclass
class ParallelConfig:
    """How the model is spread over ranks and how each block is executed."""

    replicate: int = 1
    """HSDP replica groups (typically one per node); parameters are replicated across them and
    gradients all-reduced. 1 = plain FSDP."""
    shard: int = -1
    """Ranks in each shard group (parameters, gradients and optimizer state are split across them,
    typically the GPUs of one node). -1 = world_size // replicate."""
    activation_checkpoint: Literal["none", "selective", "full"] = "none"
    """none: keep all activations. selective: op-level selective checkpointing, keeping matmul and
    attention outputs and recomputing the cheap elementwise ops (norms, RoPE, SiLU, GQA repeats) in
    backward. full: keep only each block's input and recompute the whole block in backward."""
    compile: bool = False
    """torch.compile each transformer block separately (fullgraph), after AC and before FSDP."""
    param_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Compute dtype of the forward/backward. Master weights and optimizer state stay float32."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the gradient reduce-scatter / all-reduce across ranks."""

    def __post_init__(self) -> None:
        if self.activation_checkpoint not in ("none", "selective", "full"):
            raise GristmillError(
                f"parallel.activation_checkpoint must be none, selective or full, got "
                f"{self.activation_checkpoint!r}"
            )
        for key in ("param_dtype", "reduce_dtype"):
            if getattr(self, key) not in ("bfloat16", "float32"):
                raise GristmillError(
                    f"parallel.{key} must be bfloat16 or float32, got {getattr(self, key)!r}"
                )
        if self.replicate < 1:
            raise GristmillError(f"parallel.replicate must be >= 1, got {self.replicate}")
        if self.shard != -1 and self.shard < 1:
            raise GristmillError(
                f"parallel.shard must be >= 1 or -1 (= world_size // replicate), got {self.shard}"
            )


@dataclass
class RunSection:
    output_dir: str = "runs/train/tiny"
    """Run directory: config.toml, metrics.jsonl, tensorboard events, loss.png (checkpoints later)."""
    max_steps: int | None = None
    """Stop after this many steps (default: schedule.steps); the schedule is not stretched."""
    log_every: int = 10
    """Print and record metrics every N steps (the first and last step are always logged)."""
    val_every: int = 100
    """Validation loss every N steps and at the end (needs data.val_fraction > 0; 0 disables)."""
    val_batches: int = 4
    """Global batches averaged per validation (the same held-out batches every time)."""
    seed: int = 0
    """Seed of the weight initialisation (identical on all ranks) and of torch's RNG."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """"auto": CUDA when available, else CPU."""
    init_device: Literal["auto", "meta", "full"] = "auto"
    """How weights are materialised. "meta": build on the meta device, shard, then initialise the
    shards (needed for models that do not fit one device). "full": build and initialise the whole
    model on every rank, then shard it, which gives bit-identical weights for any world size.
    "auto": meta on CUDA, full on CPU (DTensor's sharded random init is CUDA-only)."""
    threads: int = 0
    """torch intra-op threads per process on CPU (0: torch's default)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradient norm is NaN/inf is never applied (training.divergence). "stop":
    end the run when the host hears of it (next logged step or save) with exit 3, saving nothing
    new; "skip": go on, count it as `skipped_steps` in metrics.jsonl, stop after max_skipped in a row."""
    max_skipped: int = 10
    """With on_nonfinite = "skip": stop after this many consecutive non-finite steps."""
    spike_window: int = 20
    """Loss-spike report: compare each logged loss with the previous this-many logged losses."""
    spike_sigma: float = 6.0
    """A logged loss above mean + spike_sigma · std of that window is reported as an event in
    metrics.jsonl and on the terminal (never acted on); 0 turns the report off."""


# The experiment trackers; wandb and trackio need the package (and gristmill extra) of that name.
TRACKERS = ("tensorboard", "wandb", "trackio")


@dataclass
class MetricsSection:
    """Where metrics go besides stdout and RUN/metrics.jsonl (training/metrics.py, training/trackers.py).
    Each tracker gets every numeric value of each logged row at its step, plus, once per run, the
    resolved config, the datasets' fingerprints and the code's git commit."""

    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Any of "tensorboard" (RUN/tensorboard), "wandb" (Weights & Biases: pip install
    'gristmill[wandb]'; WANDB_MODE=offline logs into RUN/wandb only), "trackio" (Hugging Face's
    local-first tracker: pip install 'gristmill[trackio]'; `trackio show` opens its store). A
    resumed run continues the same wandb/trackio run (their ids are kept in RUN/trackers.json)."""
    project: str = "gristmill"
    """The wandb and trackio project."""
    run_name: str = ""
    """The wandb and trackio run name ("": the run directory's name)."""
    tags: list[str] = field(default_factory=list)
    """wandb tags (trackio has none; they are in the logged config either way)."""
    tensorboard: bool = True
    """false: no tensorboard whatever trackers says (the switch from before trackers, kept)."""
    wandb_project: str | None = None
    """Older key: adds "wandb" to trackers with this project (with a note; use trackers and project)."""
    plot: bool = True
    """Write RUN/loss.png (train and validation loss) at the end (needs matplotlib)."""


@dataclass
class CheckpointSection:
    """DCP checkpoints under RUN/checkpoints/step-N, permanent HF exports under RUN/exports/step-N
    (training/checkpoint/checkpointer.py). A checkpoint is written on SIGTERM/SIGINT, and with
    interval > 0 also at the last step."""

    interval: int = 0
    """Save every N steps (and at the last step); 0: only on SIGTERM/SIGINT."""
    keep_last: int = 3
    """Keep the newest N complete checkpoints (0: keep all). An older one is deleted only after a
    newer one is complete; the newest complete checkpoint is never deleted."""
    async_: bool = False
    """`checkpoint.async`: write in a background thread on its own gloo group after copying the
    state to CPU, so training goes on during the write; at most one save is in flight, and a
    failed background save stops the run at the next step."""
    export_interval: int = 0
    """Write a permanent HF LlamaForCausalLM export (RUN/exports/step-N) every N steps; a multiple of
    `interval`, since an export is made from the checkpoint of that step. 0: no exports."""
    min_free_factor: float = 1.5
    """Before each save, need this many times the estimated checkpoint size free on the target
    filesystem (estimate: the last save's size, or the parameter count before the first save)."""
    on_low_disk: Literal["stop", "skip"] = "stop"
    """Below that margin: "stop" the run with a message, or "skip" the save and warn every step."""
    resume: str = ""
    """"auto": continue from the newest complete checkpoint of this run (from scratch if none); a
    path: continue from that checkpoint directory; "": start fresh. `--resume` sets it."""


@dataclass
class EvalSection:
    """lm-eval on the current weights while training (`[eval]`; validation/train_eval.py). Every
    `interval` steps and at the last step, rank 0 gathers the full weights and scores the tasks in
    the training process, the other ranks wait; results go where `gristmill eval` puts them
    (RUN/eval/step-N/results.json, eval.parquet, eval.png) and into metrics.jsonl, tensorboard and
    the trackers as `eval/<task>/<metric>`. Needs the eval extra: `gristmill train` then runs the
    trainer as `-m validation.train_eval`. The other settings are `gristmill eval`'s defaults, so a
    later `gristmill eval RUN --step N` with the same tasks and limit gives the same scores."""

    interval: int = 0
    """Evaluate every N steps and at the last step; 0: no eval during training."""
    tasks: list[str] = field(default_factory=lambda: ["demo_ppl", "demo_cloze"])
    """lm-eval task names: the local ones (validation/eval_tasks, built from the run's held-out
    documents) or lm-eval's own (they need their data: network or the HF cache)."""
    limit: int = 0
    """At most this many documents per task (0: all); a cheap signal, not a reported number."""
    batch_size: int = 8
    """Requests per forward pass."""


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    """Model shape."""
    data: DataSection = field(default_factory=DataSection)
    """Dataset and batch geometry."""
    optim: OptimSection = field(default_factory=OptimSection)
    """Optimizer."""
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    """Learning-rate schedule of a one-phase run (with `[[phase]]`, each phase has its `lr`)."""
    phase: list[PhaseSection] = field(default_factory=list)
    """Phases over the data sources, run in order (`[[phase]]`); empty: one phase of
    schedule.steps at data.seq_len on data.dataset."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """FSDP2/HSDP mesh, activation checkpointing, compile, mixed precision (training.parallelize)."""
    run: RunSection = field(default_factory=RunSection)
    """Run directory, logging cadence, seed, device."""
    metrics: MetricsSection = field(default_factory=MetricsSection)
    """Where metrics go besides metrics.jsonl and stdout."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    """Checkpoints, resuming, retention, exports, disk guard."""
    eval: EvalSection = field(default_factory=EvalSection)
    """lm-eval during training (off unless eval.interval > 0)."""


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


_NAME = re.compile(r"[A-Za-z0-9_-]+")


def sources_of(cfg: TrainConfig) -> list[SourceSection]:
    """The run's sources: `[[data.sources]]`, or data.dataset as the one source "data"."""
    d = cfg.data
    if not d.sources:
        # One source "data": read for as many epochs as [schedule] takes; under [[phase]] once.
        epochs = 1 if cfg.phase else None
        return [SourceSection(name="data", dataset=d.dataset, max_epochs=epochs, val_fraction=d.val_fraction)]
    if d.dataset != DataSection.dataset:
        raise ConfigError(
            f"data.dataset = {d.dataset!r} and [[data.sources]] are both set; with sources, name each "
            "dataset in a [[data.sources]] table and leave data.dataset out",
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


def phases_of(cfg: TrainConfig) -> list[PhaseSection]:
    """The run's phases with steps, seq_len, micro_batch and mix filled in: `[[phase]]`, or one
    phase "main" of schedule.steps built from data.* and [schedule]."""
    d, gbt = cfg.data, cfg.data.global_batch_tokens
    names = [src.name for src in sources_of(cfg)]
    if not cfg.phase:
        if len(names) > 1:
            raise ConfigError(
                f"{len(names)} [[data.sources]] but no [[phase]]: a mixture needs its weights; add a "
                f"[[phase]] with steps (or tokens) and mix = {{ {', '.join(f'{n} = …' for n in names)} }}",
                "phase",
            )
        s = cfg.schedule
        lr = LRSection(shape="cosine", peak=cfg.optim.lr, to=cfg.optim.min_lr, warmup_steps=s.warmup_steps)
        return [PhaseSection("main", s.steps, None, d.seq_len, d.micro_batch, {names[0]: 1.0}, lr)]
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
        if seq_len < 1 or gbt % seq_len:
            raise ConfigError(
                f"{key}.seq_len = {seq_len} must divide data.global_batch_tokens = {gbt} (tokens per step "
                "stay the same in every phase; the number of sequences changes)",
                f"{key}.seq_len",
            )
        steps = ph.steps if ph.steps is not None else int(ph.tokens // gbt)
        if steps < 1:
            raise ConfigError(
                f"{key} ({name}) has a budget of {steps} steps; it needs ≥ 1 step of {gbt} tokens", key
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
        warmup = lr.warmup_steps or (min(math.ceil(lr.warmup_tokens / gbt), steps) if lr.warmup_tokens else 0)
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
        out.append(dataclasses.replace(ph, name=name, steps=steps, tokens=None, seq_len=seq_len,
                                       micro_batch=micro, mix=mix, lr=lr))  # fmt: skip
    if len({ph.name for ph in out}) < len(out):
        raise ConfigError(f"phase names must be unique, got {[ph.name for ph in out]}", "phase")
    return out


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


def check_config(cfg: TrainConfig, world_size: int) -> list[BatchShape]:
    """Everything about the recipe that can be checked before any work; returns the batch plan of
    each phase (one for a recipe without [[phase]])."""
    d, o, r = cfg.data, cfg.optim, cfg.run
    check_model_section(cfg.model)
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
    dp = world_size  # every rank is data-parallel (FSDP/HSDP); mesh_shape checks replicate × shard
    plans = []
    for i, ph in enumerate(phases_of(cfg)):
        g = d.global_batch_tokens // ph.seq_len
        what = (
            "data.micro_batch"
            if not cfg.phase or cfg.phase[i].micro_batch is None
            else f"phase[{i}].micro_batch"
        )
        if ph.micro_batch < 1 or g % (dp * ph.micro_batch):
            raise ConfigError(
                f"the global batch of {g} sequences (data.global_batch_tokens {d.global_batch_tokens} / "
                f"seq_len {ph.seq_len}{'' if not cfg.phase else f' of phase {ph.name!r}'}) is not divisible "
                f"by {dp} data-parallel rank(s) × {what} {ph.micro_batch} = {dp * ph.micro_batch}; change "
                f"{what}, data.global_batch_tokens or the number of ranks"
            )
        plans.append(
            BatchShape(g, dp, ph.micro_batch, g // (dp * ph.micro_batch), ph.seq_len, ph.name, ph.steps)
        )
    for src in sources_of(cfg):
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
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(
            f"need 0 ≤ optim.min_lr ≤ optim.lr; got lr {o.lr}, min_lr {o.min_lr}", "optim.min_lr"
        )
    check_number("optim.eps", o.eps, above_zero=True)
    check_number("optim.weight_decay", o.weight_decay, note=" (0: no weight decay)")
    check_number("optim.grad_clip", o.grad_clip, note=" (0: no clipping)")
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
    check_number("run.spike_sigma", r.spike_sigma, note=" (0: no spike report)")
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
    if e.interval and importlib.util.find_spec("lm_eval") is None:  # found without importing it
        raise ConfigError(
            f"eval.interval = {e.interval} runs lm-eval during training, and lm-eval is "
            "not installed: pip install 'gristmill[eval]', or set eval.interval=0",
            "eval.interval",
        )
    return plans


def resolve_model_config(section: ModelSection, dataset_info: dict, seq_len: int):
    """The ModelConfig to build: preset + overrides + the vocabulary rule, checked against the dataset."""
    from training.model import PRESETS  # the model module is heavier; import when a run starts

    if section.preset not in PRESETS:
        raise ConfigError(f"model.preset = {section.preset!r} is not one of {', '.join(sorted(PRESETS))}")
    base = PRESETS[section.preset]
    names = {f.name for f in dataclasses.fields(base)}
    overrides = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == "preset" or value is None:
            continue
        if f.name not in names:  # the model grew or lost a field; keep the two in step
            raise ConfigError(f"model.{f.name} is not a field of training.model.ModelConfig")
        overrides[f.name] = value
    data_vocab = int(dataset_info["vocab_size"])
    if section.vocab_size is None and section.preset in VOCAB_FROM_DATASET_PRESETS:
        overrides["vocab_size"] = data_vocab
    try:
        mcfg = dataclasses.replace(base, **overrides)
    except ValueError as e:  # ModelConfig checks its own shape (heads divide dim, ...)
        raise ConfigError(f"model: {e}") from None
    if mcfg.vocab_size != data_vocab:
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
    if seq_len > mcfg.max_seq_len:
        raise ConfigError(
            f"data.seq_len = {seq_len} exceeds the model's max_seq_len = {mcfg.max_seq_len} (preset "
            f"{section.preset!r}); lower data.seq_len or set model.max_seq_len ≥ {seq_len}"
        )
    return mcfg


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="continue from the newest complete checkpoint of the run (auto) or from the checkpoint "
        "directory PATH (same as --set checkpoint.resume=...)",
    )


def with_resume(overrides: list[str], resume: str | None) -> list[str]:
    """--resume X as the override checkpoint.resume = "X" (after the others, so it wins)."""
    return [*overrides, f"checkpoint.resume={json.dumps(resume)}"] if resume else list(overrides)


def load_train_config(config: str, overrides: list[str]) -> TrainConfig:
    return load_config(TrainConfig, config, overrides)
