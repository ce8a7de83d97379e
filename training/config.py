"""The training recipe's schema: a `TrainConfig` tree of dataclasses, one documented field each.

What a run derives from it and checks about it lives in training/data/spec.py (the recipe resolved,
its batch shapes, `check_config`), training/config_checks.py (each section's checks) and
training/checkpoint/model_config.py (the model), so this module reads as the reference of the keys.
`load_train_config` stays here: it only fills the schema (`training.contract.config_loader.load_config`),
checking nothing beyond keys and types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from training.contract.config_loader import ConfigPath, load_config


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
    rope_type: str | None = None
    """RoPE frequencies: "default" or "llama3" (Llama 3.1 frequency scaling, with the rope_* keys)."""
    rope_factor: float | None = None
    """llama3 RoPE scaling factor (HF `factor`)."""
    rope_low_freq_factor: float | None = None
    """llama3 RoPE scaling low_freq_factor."""
    rope_high_freq_factor: float | None = None
    """llama3 RoPE scaling high_freq_factor."""
    rope_original_max_seq_len: int | None = None
    """llama3 RoPE scaling original_max_position_embeddings."""
    init_from: ConfigPath | None = None
    """A Hugging Face LlamaForCausalLM to start from: a directory (config.json + model.safetensors,
    or sharded with model.safetensors.index.json) or a hub id "org/name[@revision]", pinned to the
    commit it resolves to when the run starts. Its config.json gives the shape (a shape key set
    here too must agree), its weights replace the random init, and the data must use its tokenizer
    (docs/continued-pretraining.md). The preset then only supplies init_std, document_mask etc."""
    float8: bool | None = None
    """Train the transformer blocks' linears with torchao float8 matmuls (dynamic tensorwise
    scaling; CUDA sm89+ and the torchao package). The embeddings, the LM head and the norms stay in
    the compute dtype: the head's logits feed the loss directly and its vocab-sized matmul is where
    float8 rounding hurts most. Compute only: checkpoints and exports hold the usual weights, so a
    float8 run resumes, exports and evaluates like any other (and may be resumed without it)."""


@dataclass
class DataSection:
    dataset: ConfigPath = "runs/data/demo"
    """Dataset directory written by `gristmill data build` (holds dataset.json), or an
    s3://BUCKET/PREFIX URL of one in a bucket (read through data.cache_dir; docs/object-storage.md)."""
    seq_len: int = 256
    """Tokens per training sequence."""
    global_batch_tokens: int = 16384
    """Tokens per optimizer step over all ranks; a multiple of seq_len. The global batch is
    G = global_batch_tokens // seq_len sequences (≈1M tokens for the real recipes). A phase may set
    its own (`[[phase]] global_batch_tokens`: a batch schedule)."""
    micro_batch: int = 8
    """Sequences per forward/backward on one rank; G must be divisible by ranks × micro_batch, and
    the quotient is the number of gradient-accumulation steps."""
    seed: int = 1234
    """Shuffle seed of the loader (sample order is a pure function of dataset, val_fraction, seed, epoch,
    seq_len: the training split leaves out the held-out documents)."""
    num_workers: int = 0
    """Training loader worker processes (0: read in the training process). Validation reads its few
    batches in the training process whatever this is (workers forked at each validation, beside the
    loader's threads, could deadlock after the fork)."""
    val_fraction: float = 0.0
    """Fraction of the dataset held out for validation (TokenLoader split="val"); 0 disables it."""
    sources: list[SourceSection] = field(default_factory=list)
    """A mixture of datasets (`[[data.sources]]`), trained in the `[[phase]]`s; empty: the one
    dataset of `data.dataset`."""
    check_separators: bool = True
    """Verify on the fly that every window keeps one separator per document and ids < vocab (on by
    default: it costs a fraction of a loader that outruns any GPU, and catches corrupted shards
    before they become gradients)."""
    cache_dir: ConfigPath = ""
    """Where the blocks read from s3:// datasets are kept on this node, each document checked against
    its sha256 whenever it is read; the ranks of a node share it (use a local disk, not NFS). "": the
    user's cache directory, ~/.cache/gristmill/datasets (under $XDG_CACHE_HOME if set). Local datasets
    are read in place and never copied here."""
    cache_gb: float = 100.0
    """The bound on the cached blocks' size in GB (1e9 bytes); blocks in flight are held in memory.
    It must hold the loaders' working set: per bucket source, its n·4,096 largest samples with
    n = 2 + ceil((4 + 2 × num_workers) steps' bytes / its 4,096 smallest samples' bytes), so 3 while
    those steps fit in its smallest epoch group (about 2.8 GB per source at FineWeb-Edu's lengths,
    whatever the dataset's size), plus the held-out documents validation reads: a smaller value is
    refused before any work with the figure (docs/object-storage.md;
    block_cache.CachedBlocks.group_need). Blocks the plan reads next are fetched ahead as far as it
    allows; blocks of epoch groups no loader on the node reads any more are evicted."""
    fetch_requests: int = 8
    """Range requests in flight per loader while fetching a bucket's blocks ahead."""
    fetch_timeout_s: float = 300.0
    """How long no data may come from a bucket before the run stops: a fetch's retries (throttling,
    5xx, resets, an endpoint that is down), with backoff, or one request's wait for an answer; it stops
    as SIGTERM stops it, saving its last trained step first."""


@dataclass
class SourceSection:
    """One dataset of a mixture (`[[data.sources]]`); phases name it in their `mix`."""

    name: str = ""
    """The source's name in phase mixes, metrics (tokens/NAME, val/NAME) and the audit's
    `consumption` view: letters, digits, `_` and `-`."""
    dataset: ConfigPath = ""
    """Dataset directory written by `gristmill data build`, or an s3://BUCKET/PREFIX URL (as
    data.dataset). Every source of a run must share one tokenizer (the same tokenizer.json hash)."""
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
    """Warmup given in tokens (rounded up to whole steps of the phase's global_batch_tokens)."""


@dataclass
class PhaseSection:
    """One phase of the plan (`[[phase]]`, in order): a budget, a seq_len, a mix, an LR piece."""

    name: str = ""
    """The phase's name in the plan table, metrics.jsonl (`phase`) and the audit."""
    steps: int | None = None
    """Budget in optimizer steps (this or `tokens`)."""
    tokens: float | None = None
    """Budget in tokens (e.g. 18e9): steps = tokens // the phase's global_batch_tokens."""
    global_batch_tokens: int | None = None
    """Tokens per optimizer step in this phase (None: data.global_batch_tokens), any ratio to the
    other phases': a batch schedule (docs/loader-and-phases.md). The LR follows it only as
    optim.batch_lr_scaling says. Fixed once the phase has trained a step (a resume refuses a change)."""
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
    name: Literal["adamw", "adamw8bit", "muon"] = "adamw"
    """"adamw" (torch), "adamw8bit" (bitsandbytes; CUDA only, refused elsewhere), or "muon":
    Newton–Schulz-orthogonalised momentum for the transformer blocks' 2-D weights, AdamW (betas, eps,
    the decay groups below) for embeddings, the LM head, norms and biases (training.muon)."""
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
    every step (the fused kernel takes the skip flag on the device: training.run.verdict)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables clipping; the norm is still logged)."""
    muon_momentum: float = 0.95
    """Muon's momentum μ (an EMA of the gradients: B ← μB + (1-μ)g), in [0, 1)."""
    muon_nesterov: bool = True
    """Orthogonalise the Nesterov look-ahead (1-μ)g + μB rather than B itself."""
    muon_ns_steps: int = 5
    """Newton–Schulz iterations per matrix and step (5: torch.optim.Muon's and Keller Jordan's)."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """How a Muon matrix's LR follows optim.lr. "match_rms_adamw" (Moonlight): lr·0.2·√max(A, B), so
    the update's RMS is AdamW's and optim.lr / weight_decay tuned for AdamW carry over. "original"
    (Keller Jordan, torch's default): lr·√max(1, A/B), an update ~10× smaller than AdamW's that
    wants a Muon-sized lr (~0.02) — which the AdamW parameters, on the same lr, would get too."""
    batch_lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    """How each phase's LR piece follows its global batch, measured against the first phase's: "none"
    (the LRs as written), "sqrt" (× √(batch / first batch)) or "linear" (× batch / first batch). Each
    optimizer supports the rules with evidence for it (training.config_checks.BATCH_LR_RULES); another
    combination is refused."""


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


@dataclass
class RewindSection:
    """`[run.rewind]`: how a rewind past a loss spike (run.on_spike / on_nonfinite = "rewind") goes
    back and what it skips (training/run/rewind.py, docs/divergence.md)."""

    skip_steps: int = 200
    """Global steps of data skipped after the checkpoint rewound to: rewound to step 1,100 with 300,
    steps 1,101–1,400 are not trained (their windows are never fed; the LR and the phases advance
    over them) and training goes on at step 1,401. Reach past the spike (see margin_steps)."""
    margin_steps: int = 100
    """The checkpoint rewound to lies at least this many steps before the spike: the newest
    complete one that verifies at or before step spike − margin_steps."""
    max_rewinds: int = 3
    """Rewinds per run; the next spike then stops the run (exit 3) naming every rewind so far."""


@dataclass
class RunSection:
    output_dir: ConfigPath = "runs/train/tiny"
    """Run directory: config.toml, metrics.jsonl, tensorboard events, loss.png (checkpoints later)."""
    max_steps: int | None = None
    """Stop after this many steps (default: schedule.steps); the schedule is not stretched. The stop
    saves a checkpoint only with checkpoint.interval > 0 (the header warns where it saves nothing)."""
    log_every: int = 10
    """Print and record metrics every N steps (the first and last step are always logged)."""
    val_every: int = 100
    """Validation loss every N steps and at the end (needs data.val_fraction > 0; 0 disables)."""
    val_batches: int = 4
    """Global batches averaged per validation (the same held-out batches every time)."""
    seed: int = 0
    """Seed of the weight initialisation (identical on all ranks) and of torch's, Python's and NumPy's
    RNGs (which nothing else draws from); a resume may not change it (training/checkpoint/record.py
    START_SETTINGS). 0 to 2**32 - 1 where a run starts: torch's CPU generator keeps a seed's low 32 bits."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """"auto": CUDA when available, else CPU."""
    init_device: Literal["auto", "meta", "full"] = "auto"
    """How weights are materialised. "meta": build on the meta device, shard, then initialise the
    shards (needed for models that do not fit one device). "full": build and initialise the whole
    model on every rank, then shard it, which gives bit-identical weights for any world size.
    "auto": meta on CUDA, full on CPU (DTensor's sharded random init is CUDA-only: "meta" on CPU with
    several processes is refused)."""
    threads: int = 0
    """torch intra-op threads per process on CPU (0: torch's default)."""
    on_nonfinite: Literal["stop", "skip", "rewind"] = "stop"
    """A step whose loss or gradient norm is NaN/inf is never applied (training.run.verdict). "stop":
    end the run when the host hears of it (next logged step or save) with exit 3, saving nothing
    new; "skip": go on, count it as `skipped_steps` in metrics.jsonl, stop after max_skipped in a
    row; "rewind": at that step, go back to a checkpoint and skip data as [run.rewind] says."""
    max_skipped: int = 10
    """With on_nonfinite = "skip": stop after this many consecutive non-finite steps."""
    spike_window: int = 20
    """Loss spikes: compare each loss with the previous this-many (logged losses with on_spike =
    "report", every step's with "rewind")."""
    spike_sigma: float = 6.0
    """A loss above mean + spike_sigma · std of that window is a spike: an event in metrics.jsonl
    and on the terminal; 0 turns spike detection off."""
    on_spike: Literal["report", "rewind"] = "report"
    """What a spike does. "report": the event only. "rewind": go back to a checkpoint before it and
    skip data ([run.rewind]); the host then reads every step's loss (one sync per step)."""
    rewind: RewindSection = field(default_factory=RewindSection)
    """`[run.rewind]`: what a rewind skips and where it goes back to."""


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
    """Draw the run's pictures (needs matplotlib): RUN/plan.png at the start, RUN/loss.png (train and
    validation loss) at the end or a stop, RUN/eval.png after each in-training eval. Off, none is drawn
    or updated (`gristmill eval RUN --table` draws eval.png from the results later)."""


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
    resume: ConfigPath = ""
    """"auto": continue from the newest complete checkpoint of this run (from scratch if none); a
    path: continue from that checkpoint directory; "": start fresh. `--resume` sets it."""

    def saves(self, step: int, last_step: int) -> bool:
        """Whether a run saves step `step`'s checkpoint (`last_step`: the invocation's last step):
        every `interval` steps and the last (a stop's save aside); the checkpointer's and the eval's
        advice's one rule."""
        return self.interval > 0 and (step % self.interval == 0 or step == last_step)


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
    tasks: list[str] = field(default_factory=lambda: ["heldout_ppl", "heldout_cloze"])
    """lm-eval task names: the local ones (validation/eval_tasks, built from the run's held-out
    documents) or lm-eval's own (they need their data: network or the HF cache)."""
    limit: int = 0
    """At most this many documents per task (0: all); a cheap signal, not a reported number."""
    docs: int = 40
    """Held-out documents the local tasks are built from, as `gristmill eval --set docs=N`
    (heldout_ppl: one item each, heldout_cloze: ≤ 2)."""
    batch_size: int = 8
    """Requests per forward pass."""
    max_length: int = 0
    """Tokens per forward pass, as `gristmill eval --set max_length=N`; 0: the model's max_seq_len.
    Above the run's longest seq_len the scores include positions it never trained at."""
    source: str = ""
    """The source ([[data.sources]] name) whose held-out documents the local tasks score; empty:
    the first with held-out documents. `gristmill eval RUN` scores the same one."""


def task_names(tasks: list[str]) -> list[str]:
    """The lm-eval task names of `tasks` (eval.tasks, `gristmill eval --tasks`): an entry may list
    several, comma-separated; a blank one names none (`[""]` passed the trainer's check, which then
    said "no tasks given" after the run had started: review R22a B4)."""
    return [t.strip() for name in tasks for t in name.split(",") if t.strip()]


@dataclass
class MergeSection:
    """`[merge]`: weights averaged in the loop and scored beside the raw ones (training/merge.py,
    docs/merging.md). The average is taken in fp32 from the master weights after each trained step
    of the run's kept timeline (a step a rewind skipped or discarded adds nothing), kept in every
    checkpoint (one fp32 copy of the parameters, sharded like the optimizer state), and read at each
    merge point: every `every` steps and at the last step. There, when validation or an eval is due,
    the merged weights are scored too (`merged/val_loss`, `merged/val/<source>`,
    `merged/eval/<task>/<metric>`); `gristmill export RUN --step N --merged` writes them as an HF
    directory."""

    kind: Literal["none", "window", "ema"] = "none"
    """"window": at each merge point N the mean of the weights after each trained step of the last
    `window` steps (N − window < k ≤ N); "ema": an exponential moving average (`decay`), started at
    the weights after the run's first trained step; "none": no merge."""
    every: int = 0
    """Steps between merge points (the last step is one too)."""
    window: int = 0
    """kind = "window": the steps averaged at each merge point, 1 to `every`."""
    decay: float = 0.0
    """kind = "ema": after each trained step ema ← decay · ema + (1 − decay) · weights; in (0, 1)
    (0.999: an average over the last ~1,000 steps)."""
    export: bool = False
    """Write RUN/exports/merged-step-N (an HF directory, like RUN/exports/step-N) at each merge
    point, from its checkpoint: merge.every must then be a multiple of checkpoint.interval."""


@dataclass(frozen=True)
class MergePoints:
    """Where merged weights are read: the multiples of `every` and the `ends` (the plan's last step;
    not a run.max_steps chunk's: reading a window closes it, and the merged weights would depend on
    where the run was cut)."""

    every: int
    ends: tuple[int, ...]

    def __contains__(self, step: int) -> bool:
        return step > 0 and (step % self.every == 0 or step in self.ends)

    def next_from(self, step: int) -> int:
        """The first merge point at or after `step`."""
        return min([-(-step // self.every) * self.every, *(e for e in self.ends if e >= step)])

    def last_upto(self, step: int) -> int:
        """The last merge point at or before `step` (0: none)."""
        return max([step // self.every * self.every, *(e for e in self.ends if e <= step)])

    def upto(self, step: int) -> list[int]:
        """The merge points from the first through `step`, in order."""
        return sorted({*range(self.every, step + 1, self.every), *(e for e in self.ends if 0 < e <= step)})

    def describe(self) -> str:
        ends = sorted({e for e in self.ends if e % self.every})
        return f"every {self.every} steps" + (f" and at step {', '.join(map(str, ends))}" if ends else "")


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
    merge: MergeSection = field(default_factory=MergeSection)
    """Weights averaged in the loop (off unless merge.kind is "window" or "ema")."""


def load_train_config(config: str, overrides: list[str]) -> TrainConfig:
    return load_config(TrainConfig, config, overrides)
