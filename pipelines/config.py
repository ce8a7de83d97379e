"""The data build recipe (`configs/data/*.toml`) as dataclasses; every field documents itself.

Loaded with `training.contract.config_loader.load_config(DataConfig, path, overrides)`, so unknown keys and
wrong types are errors naming the key, and `--set build.workers=2` overrides any field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from training.contract.config_loader import KeptPath, json_sha256

HUB_FINEWEB_EDU = "hf://datasets/HuggingFaceFW/fineweb-edu"


@dataclass
class SourceConfig:
    kind: Literal["hub", "parquet", "jsonl", "demo", "demo-code"] = "hub"
    """Where documents come from. "hub": a Hugging Face dataset streamed over the network
    (FineWeb-Edu by default); "parquet" / "jsonl": local files (jsonl may be .jsonl, .jsonl.gz or
    .jsonl.zst); "demo": the embedded corpus (Python's own documentation), written to `path` on
    first use and then read as parquet; "demo-code": likewise, the standard library's own .py
    sources (about 1.5 MB; the second dataset of a two-source demo mixture). Offline with a hub
    source? Run `gristmill data download` where there is network, then `--set source.kind=parquet
    --set source.path=DIR`."""
    path: KeptPath = HUB_FINEWEB_EDU
    """hub: the dataset root (hf://datasets/ORG/NAME); parquet/jsonl: a directory (searched
    recursively) or one file; demo, demo-code: the directory the demo corpus is written to."""
    subset: str = "sample/10BT"
    """hub only: folder inside the dataset, e.g. "sample/10BT", "sample/100BT" or
    "data/CC-MAIN-2024-10". Ignored for local sources."""
    glob: str = ""
    """Optional glob relative to the source folder selecting the input files (e.g. "*.parquet");
    empty: every *.parquet file (parquet, hub, demo, demo-code) or every *.jsonl[.gz|.zst] file (jsonl)."""
    text_key: str = "text"
    """Column / JSON key holding the document text."""
    id_key: str = "id"
    """Column / JSON key holding the document id (absent: "<file>/<row>" is used)."""
    limit: int = -1
    """Read at most this many documents per task (-1: all). For quick trial builds."""


@dataclass
class FiltersConfig:
    """Empty documents and text that is not valid UTF-8 are always dropped (filter "text")."""

    min_int_score: int | None = None
    """Drop documents whose `int_score` (FineWeb-Edu's rounded educational score, 0-5) is lower.
    Documents without the field are dropped too, with that reason. None: no threshold."""
    min_score: float | None = None
    """Drop documents whose float educational `score` is lower (a finite number). None: no threshold."""
    min_language_score: float | None = None
    """Drop documents whose `language_score` (fastText confidence) is lower (0 to 1). None: no threshold."""
    min_chars: int | None = None
    """Drop documents with fewer characters (≥ 0). None: no minimum (empty ones still go)."""
    max_chars: int | None = None
    """Drop documents with more characters (≥ 1 and ≥ min_chars). None: no maximum."""
    gopher_repetition: bool = False
    """Run datatrove's GopherRepetitionFilter (duplicate lines/paragraphs/n-grams). Off by default:
    FineWeb-Edu is already filtered."""
    gopher_quality: bool = False
    """Run datatrove's GopherQualityFilter (word counts, symbol ratios, stop words). Off by default."""
    gopher_word_tokenizer: Literal["regex", "spacy"] = "regex"
    """Word splitter for the Gopher filters: "regex" (built in, no extra dependency) or "spacy"
    (datatrove's default English tokenizer; needs `pip install spacy`)."""


@dataclass
class DedupConfig:
    """Duplicate removal across the whole build (all tasks), after the filters; every removed
    document is an excluded/ row (filter "dedup") naming the kept copy's id."""

    kind: Literal["none", "exact", "minhash"] = "none"
    """"none": no deduplication. "exact": documents whose text is equal after lowercasing and
    collapsing whitespace (punctuation, digits and accents kept) are one document; the first in
    input order (task, then position) is kept. "minhash": near-duplicates by datatrove's MinHash
    (FineWeb's recipe): word n-gram shingles of the normalised text (lowercase, no punctuation,
    numbers folded), `buckets` × `hashes_per_bucket` min-hashes; documents sharing all hashes of
    any bucket are one cluster (≈ Jaccard similarity ≥ 0.72 with the defaults) and the cluster's
    first document in input order is kept. Both read the input one extra time before the build."""
    ngram: int = 5
    """minhash: words per shingle (FineWeb: 5)."""
    buckets: int = 14
    """minhash: number of LSH buckets (FineWeb: 14); also the number of tasks of the bucket stage."""
    hashes_per_bucket: int = 8
    """minhash: min-hashes per bucket (FineWeb: 8). More buckets find less similar pairs, more
    hashes per bucket fewer."""


@dataclass
class DecontaminateConfig:
    """Drop training documents that contain evaluation items: any word n-gram of the listed lm-eval
    tasks' evaluation documents (normalised: lowercase, punctuation folded). Each drop is an
    excluded/ row (filter "decontaminate") naming task, split, document and the matching words;
    dataset.json records the index, and `gristmill eval` marks each task it scores. Off unless
    `tasks` or `index` is set."""

    tasks: list[str] = field(default_factory=list)
    """lm-eval task, group or tag names (e.g. ["hellaswag", "arc_easy"]); the build indexes them with
    `gristmill data decontam-index` before any task runs (needs the tasks' datasets: the hub, its
    cache, or local YAML tasks in `include_path`). With `index` set: checked against its manifest."""
    ngram: int = 13
    """Words per n-gram (13, as GPT-3 and lm-eval's decontamination). Texts shorter than this
    contribute nothing to the index."""
    index: KeptPath = ""
    """A directory written by `gristmill data decontam-index` to use instead of building one (for
    build machines without the hub: build the index where there is network, copy it)."""
    include_path: list[KeptPath] = field(default_factory=list)
    """Directories of local lm-eval task YAML files (lm-eval's --include_path)."""


@dataclass
class TokenizerTrainConfig:
    vocab_size: int = 8192
    """Vocabulary size of the trained byte-level BPE (special tokens included)."""
    special_tokens: list[str] = field(default_factory=lambda: ["<|endoftext|>"])
    """Special tokens declared in the trained tokenizer; must include tokenizer.separator."""
    sample_docs: int = 50_000
    """Train on at most this many documents from the (filtered) source ..."""
    sample_chars: int = 200_000_000
    """... and at most this many characters in total."""
    min_frequency: int = 2
    """Minimum pair frequency for a BPE merge."""
    if_missing: bool = False
    """When `gristmill data build` finds no file at tokenizer.path, train one there first
    (the demo does this) instead of failing."""


@dataclass
class TokenizerConfig:
    path: KeptPath = ""
    """A tokenizer.json, a directory holding one, or a hub repo id (ORG/NAME, or ORG/NAME@REV for a
    branch, tag or commit; needs network, or the hub's cache). Copied into
    the dataset as tokenizer.json; `gristmill tokenizer train` writes its tokenizer here."""
    separator: str = "<|endoftext|>"
    """The special token placed once per document; must be a special token of the tokenizer."""
    position: Literal["after", "before"] = "after"
    """"after": EOS style, appended to every document; "before": BOS style, prepended."""
    train: TokenizerTrainConfig = field(default_factory=TokenizerTrainConfig)
    """How `gristmill tokenizer train` (or the build, with if_missing) trains a tokenizer."""


@dataclass
class ShardsConfig:
    target_mb: float = 256.0
    """Close a shard once it holds about this many MiB (documents are never split)."""
    shuffle: bool = True
    """Shuffle the documents within each task's output (seeded), so windows mix sources."""
    seed: int = 0
    """Seed of that shuffle; the order is a pure function of (seed, task, task input)."""
    encode_batch_chars: int = 4_000_000
    """Characters handed to the tokenizer per encode_batch call (≥ 1; throughput vs memory)."""


@dataclass
class SlurmConfig:
    partition: str = "cpu"
    """Slurm partition for the array job."""
    time: str = "12:00:00"
    """Slurm time limit per task."""
    cpus_per_task: int = 2
    """CPUs per datatrove task (the tokenizer uses them: RAYON_NUM_THREADS is set to this)."""
    mem_per_cpu_gb: int = 4
    """Memory per CPU in GB."""
    job_name: str = "gristmill-data"
    """Slurm job name."""
    qos: str = ""
    """Slurm QOS; empty: the cluster's default."""
    env_command: str = ""
    """Shell line run before the task to set up Python (e.g. "source /opt/venv/bin/activate"). Empty
    (and no venv_path): the folder of the Python that renders the scripts goes first on PATH."""
    venv_path: KeptPath = ""
    """Alternatively, a venv activate script to source."""
    sbatch_args: dict[str, Any] = field(default_factory=dict)
    """Extra #SBATCH directives, e.g. {account = "myacct", constraint = "cpu"}."""
    submit: bool = True
    """false: write the sbatch scripts under OUTPUT/logs/ and print how to submit, without calling
    sbatch (a dry run)."""


@dataclass
class RayConfig:
    address: str = "local"
    """The Ray cluster that runs the tasks, unless the process calling build() is already connected
    to one (ray.init() before it). "local": a Ray instance started on this machine for the build
    (all its CPUs, no dashboard web server, listening on 127.0.0.1 only) and stopped after it; "auto": the
    cluster started on this machine with `ray start` (or named by RAY_ADDRESS); "HOST:PORT": a
    running cluster's head node. Every node must have gristmill and see a local source at the same
    path, and a local output directory too (an s3:// output needs none: each task uploads its own)."""
    cpus_per_task: int = 1
    """CPUs Ray reserves per task (the tokenizer uses them: RAYON_NUM_THREADS is set to this)."""
    mem_per_cpu_gb: float = 2.0
    """Memory Ray reserves per reserved CPU, in GB (a scheduling reservation: a task waits until a
    node has it free)."""


@dataclass
class BuildConfig:
    executor: Literal["local", "slurm", "ray"] = "local"
    """"local": datatrove LocalPipelineExecutor on this machine; "slurm": SlurmPipelineExecutor (one
    array job for the tasks, one dependent job that finalizes and validates); "ray":
    RayPipelineExecutor on a Ray cluster (`pip install 'gristmill[ray]'`), finalized and validated
    by this process like a local build."""
    tasks: int = 0
    """Number of datatrove tasks (each reads every tasks-th input file and writes its own shards).
    0: one task per input file."""
    workers: int = 0
    """Tasks run at the same time. local: 0 is min(tasks, CPU count); slurm: the array's %
    throttle, 0 is none; ray: 0 is as many as the cluster's free resources allow."""
    progress_interval: float = 10.0
    """Seconds between progress lines (docs/s, tokens/s, tasks done, ETA)."""
    min_free_gb: float = 1.0
    """Refuse to start, or to write a task's shards, when the output filesystem would be left with
    less than this many GB free (≥ 0; 0: no reserve, only the shards' own size)."""
    validate: bool = True
    """Run `gristmill data validate` on the finished dataset (the build fails if it fails); with an
    s3:// `output`, each task checks each of its shards before it uploads it (off, a rerun of the
    complete bucket dataset has no checked counts to hold dataset.json's to, and says so)."""
    workdir: KeptPath = ""
    """With an s3:// `output`: the local work directory, on each node, of the driver (its files,
    datatrove's logs) and of each task (tasks/NNNNN/: its output until it is uploaded, then removed).
    "": ~/.cache/gristmill/builds/BUCKET/PREFIX (under $XDG_CACHE_HOME if set). It need not be shared
    by the nodes, except for what Slurm, [dedup] and [decontaminate] keep in it (the build says so
    before any work); it may be deleted at any time: the bucket holds what a rerun needs."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Used when executor = "slurm"."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Used when executor = "ray"."""


@dataclass
class DataConfig:
    output: KeptPath = "runs/data/dataset"
    """The dataset directory to create (see docs/design.md), or an s3://BUCKET/PREFIX URL (each task
    uploads its own output, dataset.json last; docs/object-storage.md); a rerun with the same config
    resumes it."""
    source: SourceConfig = field(default_factory=SourceConfig)
    """Input documents."""
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    """Which documents to drop; every drop is recorded in OUTPUT/excluded/*.parquet."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """The tokenizer and separator policy."""
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    """Shard size and ordering."""
    dedup: DedupConfig = field(default_factory=DedupConfig)
    """Duplicate removal ("none", "exact" or "minhash"), run as extra stages before the build."""
    decontaminate: DecontaminateConfig = field(default_factory=DecontaminateConfig)
    """Drop documents that contain n-grams of evaluation tasks (off by default)."""
    build: BuildConfig = field(default_factory=BuildConfig)
    """How the work is run (executor, parallelism); does not change the output."""


def content_identity(
    cfg: DataConfig,
    tokenizer_sha256: str,
    input_files: list[dict[str, Any]],
    decontaminate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything that decides the bytes of the dataset, and nothing that does not.

    Workers, executor, progress and output location may change between a run and its resume; the
    source, filters, dedup settings, tokenizer file, separator policy, shard settings, task count
    and the input file list may not; nor the decontamination index (`decontaminate`: its sha256,
    n and tasks, read from the index by pipelines.decontam.index.StagedIndex.identity, not its path).
    """
    identity: dict[str, Any] = {
        "source": asdict(cfg.source),
        "filters": asdict(cfg.filters),
        "tokenizer": {
            "sha256": tokenizer_sha256,
            "separator": cfg.tokenizer.separator,
            "position": cfg.tokenizer.position,
        },
        "shards": asdict(cfg.shards),
        "tasks": cfg.build.tasks,
        "input_files": input_files,
    }
    if (dedup := dedup_settings(cfg.dedup)) is not None:  # absent when off: old recipes keep their hash
        identity["dedup"] = dedup
    if decontaminate is not None:  # likewise
        identity["decontaminate"] = decontaminate
    return identity


def dedup_settings(cfg: DedupConfig) -> dict[str, Any] | None:
    """The dedup settings that decide the output (None: off; exact has no settings)."""
    if cfg.kind == "none":
        return None
    return asdict(cfg) if cfg.kind == "minhash" else {"kind": cfg.kind}


def identity_sha256(identity: dict[str, Any]) -> str:
    return json_sha256(identity)
