"""The dataset directory contract (docs/design.md) as code: names, dtypes, source metadata fields,
manifest schema, fingerprint.

Writer (pipelines), validator (validation) and loader (training) all import these definitions so
the three can never disagree about a column name or a dtype. Standard library, numpy and pyarrow
only: the trainer imports this on GPU boxes without datatrove.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.contract.atomic_write import write_atomic
from training.contract.config_loader import json_sha256
from training.contract.errors import GristmillError
from training.contract.object_store import is_url

# The shard layout (docs/design.md, "The dataset directory"). /3, what builds write: a tar sample per
# run of SAMPLE_DOCS consecutive documents of a shard, two members: `<key>.docs`, a DOC_RECORD-byte
# record per document (uint32 little-endian n_tokens, then the raw sha256 of its ids), then
# `<key>.ids`, their ids back to back (each with its separator); metadata in the manifest only. So one
# byte range of a shard holds a loader block's lengths, hashes and ids (layout_samples), and every
# range read is checked against the hashes it carries (also in the manifest and the index).
# /2: the same samples without the `.docs` member (the hashes in the manifest and the index only).
# /1: a sample per document (`.ids` + `.json`). /1 and /2 are still read in place, refused in a bucket
# (converted by `gristmill data convert`).
FORMAT = "gristmill-shards/3"
FORMAT_V2 = "gristmill-shards/2"
LEGACY_FORMAT = "gristmill-shards/1"
FORMATS = (LEGACY_FORMAT, FORMAT_V2, FORMAT)
# A current-layout dataset.json without its record of the files no fingerprint covers: validate's
# problem and upload's refusal (an upload recorded them after a validation that always fails).
NO_FILES_ENTRY = (
    'has no "files" entry, so its manifest, excluded documents and build records go unchecked (edited '
    "since the build?): restore it, or rebuild the dataset"
)
SAMPLE_DOCS = 64  # documents per tar sample of a /2 or /3 shard (the loader's blocks are 64 documents too)
# A /3 sample's `.docs` member: per document, uint32 little-endian n_tokens (separator included),
# then the raw sha256 of its ids bytes (the manifest's DOC_SHA256).
DOC_RECORDS = np.dtype([("n_tokens", "<u4"), ("sha256", "V32")])
DOC_RECORD = 36  # bytes per document in a `.docs` member
assert DOC_RECORDS.itemsize == DOC_RECORD
TAR_BLOCK = 512  # tar headers and member data are 512-byte aligned
DATASET_JSON = "dataset.json"
# `gristmill data index` keeps the dataset.json it replaces under this name + suffix: the gristmill
# that wrote it (and a run that gristmill started) reads the dataset again once it is moved back.
BEFORE_INDEX_SUFFIX = ".before-index"
VALIDATION_JSON = "validation.json"  # `gristmill data validate`'s last report on the dataset
STRAY = "stray"  # a validation problem's kind for a file no reader opens (a .tmp, a file no record lists)
BUILD_JSON = "build.json"  # the build's config hash and identity, written before its first task
TASK_RECORDS_DIR = "build/tasks"  # a build into a bucket: NNNNN.json per task, its commit point there
TOKENIZER_JSON = "tokenizer.json"
SHARDS_DIR = "shards"
MANIFEST_DIR = "manifest"
EXCLUDED_DIR = "excluded"
LOGS_DIR = "logs"
COMPLETIONS_DIR = "completions"  # in a datatrove logging dir: NNNNN, a finished task's marker
DEDUP_DIR = "dedup"  # OUTPUT/dedup/: the dedup stages' working files (pipelines/dedup.py)
DECONTAM_DIR = "decontam"  # [decontaminate]'s index, copied into the dataset it filtered
DECONTAM_FILES = ("ngrams.npy", "refs.npy")  # what its sha256 covers (manifest.json records it)
DECONTAM_MANIFEST = "manifest.json"  # the index's sha256, n and per-task counts (pipelines/decontam/ngram.py)
DECONTAM_SEAL = "manifest_sha256"
"""manifest.json's key for the sha256 of the rest of it: its `sha256` covers the n-gram files only, and
an edited `ngram` (with the recipe's set to match) built with n-grams the index never held, matching
nothing, and recorded the dataset as decontaminated (trial RV60b 3). One without it was edited (the key
removed with the n: review RV61e 2)."""
DECONTAM_FILTER = "decontaminate"  # the excluded/ rows' filter and the datatrove step's name
DECONTAM_TASK_KEYS = (
    "name",
    "split",
    "version",
    "documents",
    "ngrams",
    "documents_without_ngrams",
    "documents_sha256",
)
"""What dataset.json's decontaminate.tasks[] copies of each task of the index's manifest (beside the
training documents it removed)."""
INDEX_DIR = "index"  # the loader index (training/contract/dataset_index.py)
CONFIG_TOML = "config.toml"  # the build's resolved recipe (a run directory's is run_layout's)
# The files besides shards, index and tokenizer that a copy of the dataset carries (a bucket's, a
# cache's): what the audit, `data inspect` and `data validate` read. dataset.json's "files" entry
# records each one's bytes and sha256 (not part of the fingerprint: they describe the token stream,
# they are not it), so a copy is checked before it is used.
RECORDED_FILES = (
    "manifest/*.parquet",
    "excluded/**/*.parquet",
    "logs/**/stats/*.json",
    "decontam/*",
    BUILD_JSON,
    CONFIG_TOML,
)
IDS_EXT = "ids"  # tar member `<key>.ids`: raw little-endian token ids
DOCS_EXT = "docs"  # a /3 sample's tar member `<key>.docs`: its documents' DOC_RECORD records
META_EXT = "json"  # a /1 shard's tar member `<key>.json`: source metadata (/2, /3: the manifest only)


@dataclass(frozen=True)
class SourceField:
    """A source metadata field a dataset keeps (FineWeb-Edu's columns). Each document's `.json`
    member holds it when the source has it; `manifest` and `excluded` say whether it is also a
    column of manifest/*.parquet and of excluded/*.parquet."""

    name: str
    type: pa.DataType
    manifest: bool = True
    excluded: bool = False

    @property
    def numeric(self) -> bool:
        """Filters compare it with numbers, and a source must hold it as a number."""
        return pa.types.is_integer(self.type) or pa.types.is_floating(self.type)

    @cached_property
    def pytype(self) -> type:
        """What a row holds for it (str, float or int): `pytype(value)` converts a source value."""
        return float if pa.types.is_floating(self.type) else int if pa.types.is_integer(self.type) else str


# The one list of source metadata fields, in column order. The manifest and excluded schemas
# below, the readers' key lists and the rows the writers fill are all derived from it, so adding a
# field is one line here. Order and types are on disk: datasets already built must stay readable.
SOURCE_FIELDS: tuple[SourceField, ...] = (
    SourceField("id", pa.string(), excluded=True),  # source document id
    SourceField("url", pa.string(), excluded=True),
    SourceField("dump", pa.string(), excluded=True),
    SourceField("score", pa.float64()),
    SourceField("int_score", pa.int64()),
    SourceField("language", pa.string()),
    SourceField("language_score", pa.float64()),
    SourceField("token_count", pa.int64()),  # a /1 shard's .json member had it, not its manifest
)
MANIFEST_FIELDS = tuple(f for f in SOURCE_FIELDS if f.manifest)
EXCLUDED_FIELDS = tuple(f for f in SOURCE_FIELDS if f.excluded)


def source_columns(meta: dict[str, Any], fields: tuple[SourceField, ...]) -> dict[str, Any]:
    """A row's values for `fields` from a document's metadata, each as its column holds it; a
    field the source lacks is None."""
    return {f.name: None if (v := meta.get(f.name)) is None else f.pytype(v) for f in fields}


def source_disagreement(row: dict[str, Any], member: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first source field where a /1 document's manifest `row` and its `.json` member (`member`:
    its source_columns) disagree, as (field, the row's value, the member's); None where they agree.
    A row's None claims nothing; NaN (pandas' missing float, written on both sides) equals NaN
    (review RV26d M1). `data convert` and `data validate` both hold a /1 manifest to it: a row's ids
    or urls swapped with another's labelled the documents with each other's (R26c S1, RV51b F1)."""
    for name, value in member.items():
        mine = row.get(name)
        if mine is not None and mine != value and not (mine != mine and value != value):
            return name, mine, value
    return None


# Where each kept document came from, the last manifest columns (added after the format's first
# datasets: readers treat a manifest without them as all null). The reader puts file and row into
# a document's metadata (never into its .json member); text_hash is what exact dedup compares.
SOURCE_FILE = "source_file"  # the input file, relative to source.path
SOURCE_ROW = "source_row"  # its row (parquet, from 0) or line (jsonl, from 1)
TEXT_HASH = "text_hash"  # the normalised text's blake2b-128, two little-endian halves in hex (docs/audit.md)
PLACE_COLUMNS = ((SOURCE_FILE, pa.string()), (SOURCE_ROW, pa.int64()))  # where the source has a document
PROVENANCE_COLUMNS = (*PLACE_COLUMNS, (TEXT_HASH, pa.string()))

# One manifest row per kept document. `offset`/`nbytes` locate the document's ids inside the tar (its
# `.ids` member's data under /1, its place in its sample's `.ids` under /2 and /3), so the loader can
# memory-map shards and never parse tar headers on the hot path. DOC_SHA256 (/2, /3): the sha256 of those
# bytes, what every range read from a bucket is checked against.
DOC_SHA256 = "sha256"
MANIFEST_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),  # file name under shards/
        ("key", pa.string()),  # webdataset key (no dots)
        ("offset", pa.int64()),  # byte offset of the .ids data inside the tar
        ("nbytes", pa.int64()),  # byte length of the .ids data
        ("n_tokens", pa.int64()),  # tokens including the one separator
        *((f.name, f.type) for f in MANIFEST_FIELDS),
        *PROVENANCE_COLUMNS,
        (DOC_SHA256, pa.binary(32)),
    ]
)


def manifest_type_problem(table: pa.Table) -> str | None:
    """The first column of `table` (some of a manifest's) whose type is not MANIFEST_SCHEMA's, said,
    or None: a column rewritten by hand was a TypeError or a ValueError in validate, a build's rerun
    and `data index` (review R21b F9)."""
    for name in table.column_names:
        if (
            name in MANIFEST_SCHEMA.names
            and (ty := table.schema.field(name).type) != MANIFEST_SCHEMA.field(name).type
        ):
            return f"column {name} holds {ty}, not the build's {MANIFEST_SCHEMA.field(name).type}"
    return None


# One row per dropped document, with the filter that dropped it and why, and where the source has it
# (ids need not be unique: the file and row find the document; null in a build before they were kept).
EXCLUDED_SCHEMA = pa.schema(
    [
        *((f.name, f.type) for f in EXCLUDED_FIELDS),
        ("filter", pa.string()),  # step name, e.g. "int_score", "min_chars", "gopher_repetition"
        ("reason", pa.string()),  # human detail, e.g. "int_score 2 < 3"
        *PLACE_COLUMNS,
    ]
)


class DatasetError(GristmillError):
    """A dataset directory that breaks the contract; the message names the file and the fix."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab ≤ 65536), else uint32; always little-endian on disk."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def dtype_name(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 65536 else "uint32"


def numpy_dtype(name: str) -> np.dtype:
    if name not in ("uint16", "uint32"):
        raise DatasetError(f"dtype {name!r} is not one of uint16, uint32")
    return np.dtype("<u2") if name == "uint16" else np.dtype("<u4")


def shard_name(task: int, index: int) -> str:
    return f"{task:05d}_{index:05d}.tar"


# The build task a file of the dataset is: its shards, its manifest, its excluded documents (by filter),
# its datatrove stats.
_TASK_FILE = re.compile(
    rf"{SHARDS_DIR}/(\d{{5}})_\d{{5}}\.tar|{MANIFEST_DIR}/(\d{{5}})\.parquet"
    rf"|{EXCLUDED_DIR}/(\d{{5}})_\w+\.parquet|{LOGS_DIR}/stats/(\d{{5}})\.json"
)


def task_of_file(rel: str) -> int | None:
    """The build task whose file `rel` (a path inside the dataset) is, None for any other file."""
    m = _TASK_FILE.fullmatch(rel)
    return None if m is None else int(next(g for g in m.groups() if g))


def excluded_by_filter(path: str | Path) -> dict[str, int]:
    """An excluded file's rows by the filter that excluded them (its `filter` column)."""
    counts: dict[str, int] = {}
    for f in pq.read_table(path, columns=["filter"]).column("filter").to_pylist():
        counts[f] = counts.get(f, 0) + 1
    return counts


def doc_key(task: int, index: int) -> str:
    # webdataset splits member names at the first dot, so keys never contain one.
    return f"t{task:05d}d{index:09d}"


def sample_key(task: int, index: int) -> str:
    """The webdataset key of a /2 or /3 shard's sample `index` of task `task` (unique in the dataset)."""
    return f"t{task:05d}s{index:07d}"


def doc_records(n_tokens: np.ndarray, sha256: list[bytes]) -> bytes:
    """A /3 sample's `.docs` data: its documents' DOC_RECORDS records, in order."""
    records = np.zeros(len(sha256), DOC_RECORDS)
    records["n_tokens"] = n_tokens
    records["sha256"] = sha256
    return records.tobytes()


def layout_samples(
    doc_counts: np.ndarray, ids_bytes: np.ndarray, fmt: str = FORMAT
) -> tuple[np.ndarray, np.ndarray]:
    """Where a shard puts its samples, from each one's document count and ids byte size (in shard
    order): (the data offset of each sample's `.docs` member, that of its `.ids` member) inside the
    tar. A /3 sample is a 512-byte header, its documents' DOC_RECORD-byte records padded to 512
    bytes, a 512-byte header, then its ids padded to 512 bytes: bytes [docs, ids + ids_bytes) are one
    range holding the sample's lengths, hashes and ids. A /2 sample has no `.docs` member: its `.docs`
    offset is its `.ids` one (no records)."""
    _require_layout_formula(fmt)
    counts = np.asarray(doc_counts, np.int64)
    docs_member = TAR_BLOCK + tar_padded(counts * DOC_RECORD) if fmt == FORMAT else np.zeros_like(counts)
    sizes = docs_member + TAR_BLOCK + tar_padded(np.asarray(ids_bytes, np.int64))
    start = np.cumsum(sizes) - sizes  # each sample's first header
    ids = start + docs_member + TAR_BLOCK
    return (start + TAR_BLOCK if fmt == FORMAT else ids), ids


def _require_layout_formula(fmt: str) -> None:
    if fmt not in (FORMAT, FORMAT_V2):
        raise ValueError(f"{fmt} shards have no layout formula (only {FORMAT_V2} and {FORMAT} have)")


def tar_padded(n):
    """A tar member's data size `n` (an int or an array) rounded up to TAR_BLOCK, as tar stores it."""
    return -(-n // TAR_BLOCK) * TAR_BLOCK


def layout_offsets(nbytes: np.ndarray, fmt: str) -> np.ndarray:
    """Where a /2 or /3 shard puts its documents, from their byte lengths alone (in shard order): the
    data offset of each one's ids inside the tar. Its samples are SAMPLE_DOCS documents each (the last
    may have fewer), laid out by layout_samples, each sample's ids back to back. The writer lays shards
    out so; the index derivation checks the manifest against it; a bucket's reader computes byte
    ranges with it (the per-document offsets need not be fetched)."""
    nbytes = np.asarray(nbytes, np.int64)
    n = len(nbytes)
    _require_layout_formula(fmt)
    if not n:
        return np.zeros(0, np.int64)
    within = np.cumsum(nbytes) - nbytes  # from the shard's first document's ids
    sample = np.arange(n) // SAMPLE_DOCS
    first = np.arange(0, n, SAMPLE_DOCS)
    counts = np.diff(np.r_[first, n])
    _, ids = layout_samples(counts, np.add.reduceat(nbytes, first), fmt)
    return ids[sample] + within - within[first][sample]


def sample_starts(shard_rows: np.ndarray) -> np.ndarray:
    """The first manifest row of every sample, then the row count: a shard's rows (shard s holds
    [shard_rows[s], shard_rows[s+1])) are cut into runs of SAMPLE_DOCS, its last run maybe shorter. What
    a /2 shard's tar samples are; for a /1 dataset the same runs, unwritten. The epoch order's blocks
    (training/data/order.py) and a bucket's cache units are these samples."""
    shard_rows = np.asarray(shard_rows, np.int64)
    counts = -(-np.diff(shard_rows) // SAMPLE_DOCS)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.r_[np.repeat(shard_rows[:-1], counts) + within * SAMPLE_DOCS, shard_rows[-1:]].astype(np.int64)


def sample_totals(tokens: np.ndarray, shard_rows: np.ndarray) -> np.ndarray:
    """Each sample's tokens (int64): the rows' `tokens` summed over the samples sample_starts cuts."""
    tokens = np.asarray(tokens, np.int64)
    return np.add.reduceat(tokens, sample_starts(shard_rows)[:-1]) if len(tokens) else np.zeros(0, np.int64)


def tokenizer_model_span(path: str | Path) -> tuple[int, int] | None:
    """The least and the most vocab_size a dataset encoded with a tokenizer.json may have, read as plain
    JSON (training needs no `tokenizers` library). The least: the highest id + 1 of its model
    vocabulary (a token → id map, or Unigram's list, ids by position), the ids `tokenizers` uses. Its
    added tokens are not counted there (`tokenizers` may give one another id than its file says), but
    bound the most: each the vocabulary lacks may take a new id past the model's (one it holds takes
    its id there: counted as new, an edit up by one passed, trial RV61g F2), or the id its file says.
    (A dataset.json whose vocab_size was edited up trained a larger model than its tokenizer has, exit
    0: trial RV60a 1.) None for a file that is not such a tokenizer (a synthetic dataset's stand-in)."""
    try:
        spec = json.loads(Path(path).read_text())
        vocab = spec["model"]["vocab"]
        least = (max(vocab.values(), default=-1) + 1) if isinstance(vocab, dict) else len(vocab)
        pieces = set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}
        tokens = spec.get("added_tokens") or []
        new = [t for t in tokens if t.get("content") not in pieces]
        ids = [t["id"] for t in tokens if isinstance(t.get("id"), int)]
        return least, max(least + len(new), max(ids, default=-1) + 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _drop_dropout(spec: dict[str, Any]) -> bool:
    """Clears a parsed tokenizer.json's BPE dropout (`model.dropout`); whether it had any."""
    model = spec.get("model")
    if not isinstance(model, dict) or model.get("dropout") is None:
        return False
    model["dropout"] = None
    return True


def without_dropout(tokenizer_json: str) -> str:
    """A tokenizer.json's text without BPE dropout (random merges), which neither the build encodes
    with nor an export and eval may ship: a tokenizer with it scored every eval request on ids of
    random merges, differing at each eval. The text itself when it has none (an export keeps a
    base's file byte for byte)."""
    spec = json.loads(tokenizer_json)
    return json.dumps(spec, ensure_ascii=False) if _drop_dropout(spec) else tokenizer_json


# Post-processors that only move offsets (ByteLevel's trim_offsets): an export keeps them.
_OFFSET_ONLY = ("ByteLevel",)


def _offsets_of(processor: dict[str, Any]) -> dict[str, Any] | None:
    """What of post-processor `processor` only moves offsets, to keep in an export: ByteLevel itself;
    of a RobertaProcessing (which adds <s> … </s>) its trim_offsets, the same ByteLevel offset trimming
    (`tokenizers` calls one function for both), as a ByteLevel post-processor; None: nothing (review
    R25i D2: a RobertaProcessing was dropped whole, and the export's offsets changed)."""
    if processor.get("type") in _OFFSET_ONLY:
        return processor
    if processor.get("type") == "RobertaProcessing" and processor.get("trim_offsets", True):
        prefix = bool(processor.get("add_prefix_space", True))
        return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": True}
    return None


def framed_as_trained(tokenizer_json: str, separator: dict[str, Any]) -> str:
    """A tokenizer.json's text whose post-processor frames a text as the dataset's separator contract
    does (`separator`: dataset.json's): position "after" adds nothing (a document starts right after
    the previous one's separator, which a prompt has not), "before" puts the separator first. A
    foreign tokenizer's own (a Llama-3 TemplateProcessing adding <|begin_of_text|>, a Llama-2 <s>)
    made every default encode of an export start with an id the shards never held. The text itself
    when its post-processor already frames so (an export keeps the file byte for byte)."""
    spec = json.loads(tokenizer_json)
    pp = spec.get("post_processor")
    kept = [p for p in (pp.get("processors", []) if pp and pp.get("type") == "Sequence" else [pp]) if p]
    offsets = [o for p in kept if isinstance(p, dict) and (o := _offsets_of(p)) is not None]
    before = separator.get("position") == "before"
    if not before and offsets == kept:
        return tokenizer_json  # adds nothing already
    kept = offsets
    if before:
        token, sid = str(separator["token"]), int(separator["id"])
        first = {"SpecialToken": {"id": token, "type_id": 0}}
        kept.append({
            "type": "TemplateProcessing",
            "single": [first, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [first, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": token, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token: {"id": token, "ids": [sid], "tokens": [token]}},
        })  # fmt: skip
    framing = None if not kept else kept[0] if len(kept) == 1 else {"type": "Sequence", "processors": kept}
    if framing == pp:
        return tokenizer_json
    spec["post_processor"] = framing
    return json.dumps(spec, ensure_ascii=False)


def as_encoded(tokenizer_json: str) -> str:
    """A tokenizer.json's text as the build encodes with it: without BPE dropout, truncation (every
    document cut to max_length) and padding (pad ids inside a batch's documents), which a
    `tokenizers` call applies (transformers sets its own at each call, so an export keeps them)."""
    spec = json.loads(tokenizer_json)
    _drop_dropout(spec)
    spec["truncation"] = spec["padding"] = None
    return json.dumps(spec, ensure_ascii=False)


def shared_ids(vocab: Mapping[str, int]) -> list[tuple[int, list[str]]]:
    """The ids a tokenizer.json's vocab (a BPE, WordPiece or WordLevel model's, token -> id: as
    tokenizers loads it, or as the file holds it) gives to more than one token, with their tokens:
    tokenizers keeps one token an id, either one, another at each load of the same file (review RV32f
    A3). ~0.15 s for a 128k vocab (a Unigram's is a list: an id is a position, never shared)."""
    if len(set(vocab.values())) == len(vocab):
        return []
    tokens: dict[int, list[str]] = {}
    for token, i in vocab.items():
        tokens.setdefault(i, []).append(token)
    return sorted((i, sorted(names)) for i, names in tokens.items() if len(names) > 1)


def shared_ids_said(shared: list[tuple[int, list[str]]]) -> str:
    """shared_ids' answer in words, as every refusal of such a vocab says it: `gives one id to several
    tokens (id 300: 'zzz0', 'Ġe'; 2 ids so)`."""
    i, tokens = shared[0]
    more = f"; {len(shared)} ids so" if len(shared) > 1 else ""
    return f"gives one id to several tokens (id {i}: {', '.join(map(repr, tokens))}{more})"


# The parts of a tokenizer.json that decide which ids a text becomes (the build encodes without the
# post-processor; the decoder only turns ids back into text; truncation and padding are unused).
TOKENIZER_ID_SECTIONS = ("added_tokens", "normalizer", "pre_tokenizer", "model")


# A BPE model's fields whose values listed are one setting, each compared as the first (tokenizers'
# models/bpe: an empty continuing-subword prefix or end-of-word suffix adds nothing, as none does; a
# flag left out is false); a field left out is its first value too.
BPE_ONE_SETTING: dict[str, tuple[Any, ...]] = {
    "continuing_subword_prefix": (None, ""),
    "end_of_word_suffix": (None, ""),
    "fuse_unk": (False,),
    "byte_fallback": (False,),
    "ignore_merges": (False,),
}


def tokenizer_id_content(path: str | Path) -> dict[str, Any]:
    """What of a tokenizer.json decides the ids (TOKENIZER_ID_SECTIONS: special tokens, normalizer,
    pre-tokenizer, vocabulary and merges), in a canonical form: without BPE dropout (the build
    encodes without it), merges as pairs (a copy re-saved by another version of `tokenizers` writes
    "a b" or ["a", "b"]). ValueError for a file that is not JSON."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    content = {k: data.get(k) for k in TOKENIZER_ID_SECTIONS}
    model = content["model"]
    if isinstance(model, dict):
        model = content["model"] = {k: v for k, v in model.items() if k != "dropout"}
        if model.get("type") == "BPE":
            # A value left out or null and `tokenizers`' default for it are one setting: a prefix or
            # suffix "" adds nothing, as none does (transformers 5 re-saves a GPT-2 tokenizer's nulls
            # as "": review R25i M1), and a flag left out is false. Written as `tokenizers` writes them.
            for key, same in BPE_ONE_SETTING.items():
                if key not in model or model[key] in same:
                    model[key] = same[0]
        if isinstance(model.get("merges"), list):
            merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]
            content["model"] = model | {"merges": merges}
    return content


def tokenizer_differences(a: str | Path, b: str | Path) -> list[str]:
    """The parts of two tokenizer.json files that decide ids differently ("added_tokens",
    "model.vocab", "model.merges", …); [] when they are the same tokenizer, byte for byte or by
    content (tokenizer_id_content): the one rule of a mixture's sources and a base's data."""
    if file_sha256(a) == file_sha256(b):
        return []
    ca, cb = tokenizer_id_content(a), tokenizer_id_content(b)
    out = []
    for key in TOKENIZER_ID_SECTIONS:
        x, y = ca[key], cb[key]
        if x == y:
            continue
        if isinstance(x, dict) and isinstance(y, dict) and key == "model":
            out += [f"model.{k}" for k in sorted(x.keys() | y.keys()) if x.get(k) != y.get(k)]
        else:
            out.append(key)
    return out


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def decontam_sha256(folder: str | Path) -> str | None:
    """The sha256 of a decontamination index's DECONTAM_FILES, in order (what its manifest and
    dataset.json's decontaminate.index_sha256 record); None when one is missing."""
    h = hashlib.sha256()
    try:
        for name in DECONTAM_FILES:
            with open(Path(folder) / name, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
    except FileNotFoundError:
        return None
    return h.hexdigest()


# dataset.json's "index" entry: the sum mod 2**256 of its documents' sha256 (each a big-endian integer),
# one value for one multiset of documents whatever their order or shards (a duplicate adds, never
# cancels as under XOR). Not covered by the fingerprint (the stream's identity, which order is part of):
# what tells that two sources of a mixture hold the same documents (training/data/recipe.py).
DOCUMENTS_SUM = "documents_sha256_sum"


def index_hashes(entry: dict[str, Any]) -> dict[str, str]:
    """{file name: sha256} of dataset.json's "index" entry (or of one derived from the manifest)."""
    return {name: f["sha256"] for name, f in sorted(entry["files"].items())}


def fingerprint(info: dict[str, Any]) -> str:
    """Identity of the token stream: shard contents, tokenizer, dtype and separator policy.

    Rebuilding any shard with different bytes changes it, so a resume against a rebuilt dataset
    is refused instead of silently reading other tokens. The loader index (training/contract/dataset_index.py)
    is covered too, when the dataset has one, and so is the decontamination index (its sha256 and n)
    when the build filtered against one.
    """
    ident: dict[str, Any] = {
        "format": info["format"],
        "tokenizer_sha256": info["tokenizer_sha256"],
        "dtype": info["dtype"],
        "separator": info["separator"],
        "shard_files": {name: f["sha256"] for name, f in sorted(info["shard_files"].items())},
    }
    if "index" in info:
        ident["index"] = index_hashes(info["index"])
    if "decontaminate" in info:  # the eval-task index its documents were filtered against
        ident["decontaminate"] = {k: info["decontaminate"][k] for k in ("index_sha256", "ngram")}
    if "converted_from" in info:  # `gristmill data convert`: the same documents as that dataset
        ident["converted_from"] = sorted(info["converted_from"]["fingerprints"])
    return json_sha256(ident, compact=False)


def two_hashes(a: str, b: str, shown: int = 12) -> tuple[str, str]:
    """Hex digests `a` and `b` as a line shows two that differ: `shown` characters, or up to where they
    differ (the same 12 characters twice read as no difference: trial RV70g 5)."""
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    n = max(shown, same + 1)
    return tuple(h[:n] + ("…" if n < len(h) else "") for h in (a, b))  # type: ignore[return-value]


def check_fingerprint(root: str | Path, info: dict[str, Any], fix: str = "rebuild the dataset") -> None:
    """Refuse a dataset.json whose recorded fingerprint is not the one its fields give (edited); `fix`:
    what repairs it (a bucket's: rewrite_bucket_dataset_json)."""
    if (computed := fingerprint(info)) != info["fingerprint"]:
        recorded, computed = two_hashes(str(info["fingerprint"]), computed)
        raise DatasetError(
            f"{os.path.join(root, DATASET_JSON)}: the recorded fingerprint does not match the file's "
            f"contents ({recorded} recorded, {computed} computed): dataset.json was edited; {fix}"
        )


# The dataset.json keys `gristmill data index` writes (pipelines/data_index.py's indexed_info; the sum
# it records lies inside "index"): a dataset.json alike in every other key has the same
# fingerprint_without_index, whatever fields fingerprint() comes to cover (the audit's --db tells a
# dataset indexed since it was written by that: validation/audit_views.py's UNINDEXED_SQL).
INDEX_WRITES = ("index", "fingerprint", "fingerprint_before_index")
# The dataset.json key `gristmill data upload` records in an older dataset.json (its files' sha256s),
# which fingerprint() does not read: a --db written before an upload still tells the dataset (review
# RV33e F2a: it said null, "cannot tell", for exactly the older datasets `data index` is for).
UPLOAD_WRITES = ("files",)


def fingerprint_without_index(info: dict[str, Any]) -> str:
    """The fingerprint of `info`'s fields but its index: the dataset's before `gristmill data index`."""
    return fingerprint({k: v for k, v in info.items() if k != "index"})


def fingerprint_before_index(info: dict[str, Any]) -> str | None:
    """The fingerprint the dataset had before `gristmill data index` added its index, recomputed
    from the fields (never taken from the stored copy), or None when it was built with one."""
    if "fingerprint_before_index" not in info:
        return None
    return fingerprint_without_index(info)


def data_identities(info: dict[str, Any]) -> set[str]:
    """Every fingerprint this dataset's documents have had: as built, before `data index`, and of the
    dataset `gristmill data convert` rewrote into this one (the same documents in the same rows, so the
    same batches; the fingerprint covers that record, so it cannot be edited in). Two datasets sharing
    one are the same data."""
    converted = set((info.get("converted_from") or {}).get("fingerprints", ()))
    return ({info.get("fingerprint"), fingerprint_before_index(info)} | converted) - {None}


def same_data(recorded: str | None, info: dict[str, Any]) -> bool:
    """Whether a fingerprint a run recorded is this dataset's (data_identities)."""
    return recorded in data_identities(info)


def unfinished_build(root: str | Path) -> str | None:
    """What directory `root` is when a data build started it and has not finished it (build.json, no
    dataset.json, which the build writes last), said alike by every command; None otherwise."""
    root = Path(root)
    if (root / DATASET_JSON).is_file() or not (root / BUILD_JSON).is_file():
        return None
    return (
        f"{root} holds {BUILD_JSON} but no {DATASET_JSON}: a data build that did not finish, or is still "
        "running (wait for it to end, or rerun the same `gristmill data build` command)"
    )


def decontaminate_record(root: str | Path, info: dict[str, Any]) -> dict[str, Any] | None:
    """dataset.json's "decontaminate" record (None: the build had none), each task's
    documents_without_ngrams taken, where dataset.json (written before 2026-12-01) lacks it, from the
    dataset's copy of its index, DECONTAM_DIR/manifest.json, which records it since 2026-11-29
    (review R27d m1: eval and the end table said "unknown" with the count on disk). Only the same index
    counts (its manifest's sha256 is the record's index_sha256); a task neither holds keeps no count
    (unknown, not 0), and so does a bucket's dataset, whose manifest is not read here. The one home
    of that fallback: eval's marks and the build's end table read the record through it."""
    record = info.get("decontaminate")
    tasks = (record or {}).get("tasks") or []
    if all(t.get("documents_without_ngrams") is not None for t in tasks) or is_url(root):
        return record
    try:
        manifest = json.loads((Path(root) / DECONTAM_DIR / DECONTAM_MANIFEST).read_text(encoding="utf-8"))
        indexed = (
            {t["name"]: t for t in manifest["tasks"]} if manifest["sha256"] == record["index_sha256"] else {}
        )
    except (OSError, ValueError, TypeError, KeyError):  # none, or not a manifest: nothing more is known
        return record
    filled = []
    for task in tasks:
        count = (indexed.get(task.get("name")) or {}).get("documents_without_ngrams")
        known = task.get("documents_without_ngrams") is None and _is_int(count)
        filled.append({**task, "documents_without_ngrams": count} if known else task)
    return {**record, "tasks": filled}


def relative_location(location: str | Path) -> bool:
    """Whether a dataset a run's config names is a relative path: read from the working directory,
    which the run's may not have been."""
    return not is_url(location) and not Path(location).is_absolute()


def working_directory_note(location: str | Path) -> str:
    """What a line saying a run's dataset is not the one it trained on adds for a relative path: run
    elsewhere, it can find another dataset, not a rebuilt one (review RV32d 3, trials RV64a 2e, RV65d
    4); "" for an absolute path or a URL."""
    if not relative_location(location):
        return ""
    return (
        f" (from this working directory: {os.path.abspath(location)}; if the run started in another, run "
        "the command there)"
    )


def read_dataset_info(root: str | Path) -> dict[str, Any]:
    """Read and sanity-check dataset.json (cheap: no shard is hashed here)."""
    return read_dataset_json(root)[1]


def read_dataset_json(root: str | Path) -> tuple[bytes, dict[str, Any]]:
    """dataset.json's bytes, and read_dataset_info of them: what a caller that checks the file and
    then copies it (`gristmill data upload`) copies, not the file as it is by then."""
    root = Path(root)
    path = root / DATASET_JSON
    if not path.is_file() and (unfinished := unfinished_build(root)) is not None:
        raise DatasetError(f"{unfinished}; read it once it is built")  # (train said "build one": R26b m2)
    if root.name == DATASET_JSON and root.is_file():  # the record itself, not its dataset (RV70g 8)
        raise DatasetError(f"{root} is a dataset's record: name its directory, {root.parent}")
    if not path.is_file():
        # a run's recipe keeps data.dataset as written: relative, it is read from the working directory
        relative = not root.is_absolute()
        raise DatasetError(
            f"{path} not found{f' from the working directory {Path.cwd()}' if relative else ''}: {root} is "
            "not a gristmill dataset (build one with `gristmill data build`"
            + (", or run the command where that relative path was written)" if relative else ")")
        )
    raw = path.read_bytes()
    return raw, parse_dataset_info(raw, path)


def tokenizer_problem(
    root: str | Path, info: dict[str, Any], where: str | None = None, absent_ok: bool = False
) -> str | None:
    """Why the dataset's tokenizer.json is not the one it was built with (its sha256 against
    dataset.json's record, named `where`), or None: it is, or the dataset was built without one. One
    it records that is missing is a problem (an export then shipped none, exit 0: review R21b F1),
    unless `absent_ok` (a bucket's copy in the cache, which fetches it only when it is needed)."""
    tok = Path(root) / TOKENIZER_JSON
    recorded = info.get("tokenizer_sha256")
    if not tok.is_file():
        if absent_ok or recorded in (None, "none"):
            return None
        return (
            f"{tok} is missing, but {where or Path(root) / DATASET_JSON} records tokenizer_sha256 "
            f"{recorded}: the dataset's tokenizer was deleted after the build; restore it or rebuild the "
            "dataset"
        )
    if (got := file_sha256(tok)) == recorded:
        return None
    return (
        f"{tok} has sha256 {got}, but {where or Path(root) / DATASET_JSON} records "
        f"{info.get('tokenizer_sha256')}: the tokenizer was replaced or damaged after the build; restore "
        "it or rebuild the dataset"
    )


def _read_by_readers(problem: dict[str, Any]) -> bool:
    """Whether a validation problem (validation.json's record of one) is in what a reader opens."""
    where = problem.get("shard")
    if problem.get("kind") == STRAY:
        return False
    if not isinstance(where, str) or not where:
        return True
    return where.split("/", 1)[0] in (SHARDS_DIR, INDEX_DIR) or where in (DATASET_JSON, TOKENIZER_JSON)


def check_last_validation(root: Path, info: dict[str, Any]) -> None:
    """A dataset in place whose last `gristmill data validate` found problems (its validation.json
    says so, of this fingerprint) is refused: a dataset in place is not hashed at every read (only
    validate hashes every byte), so the damage that report names would be trained on, inspected and
    evaluated, exit 0. A report of another fingerprint is of another dataset and says nothing here."""
    again = f"validate the dataset again (`gristmill data validate {root}`, which rewrites it)"
    try:
        last = json.loads((root / VALIDATION_JSON).read_text(encoding="utf-8"))
        why = None if isinstance(last, dict) else "not a JSON object"
    except FileNotFoundError:
        return
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deep to decode
        why = f"{type(e).__name__}: {e}"
    if why is not None:  # a failed verdict cut short was read as none (review R22a A1)
        raise DatasetError(f"{root / VALIDATION_JSON} cannot be read as a report ({why}); {again}")
    if last.get("fingerprint") != info.get("fingerprint"):
        return
    if last.get("ok") is True:
        return
    if last.get("ok") is not False:  # "yes" was taken for a pass, whatever its problems said (review R21b)
        raise DatasetError(
            f'{root / VALIDATION_JSON}: its "ok" is {json.dumps(last.get("ok"))}, neither true nor false: '
            f"the report was edited or damaged; {again}"
        )
    found = last.get("problems") if isinstance(last.get("problems"), list) else []
    # Only problems in what the readers read: a stray file (STRAY: a .tmp a write left, in shards/ too; a
    # file no record lists), a foreign excluded file or damaged build logs stop no training (review
    # R14f F7, R14g F3). A problem of no file is the dataset's.
    read = [p for p in found if not isinstance(p, dict) or _read_by_readers(p)]
    if found and not read:
        return
    first = read[0].get("text") if read and isinstance(read[0], dict) else None
    raise DatasetError(
        f"{root / VALIDATION_JSON}: the last `gristmill data validate {root}` "
        f"({last.get('checked_at', '?')}) found {last.get('n_problems', len(found))} problem(s) in it"
        + (f", the first: {first}" if isinstance(first, str) else "")
        + f"; repair it (a rerun of its build names what to redo) and validate it again (`gristmill data "
        f"validate {root}`, which records the result)"
    )


def parse_dataset_info(text: bytes, path: str | Path, fix: str | None = None) -> dict[str, Any]:
    """dataset.json's content checked as read_dataset_info checks it; `path` names it in errors (a
    file, or the object of a dataset in a bucket), `fix` what repairs a damaged one where it is no
    local build's (a bucket's: rewrite_bucket_dataset_json; review RV42a M4); None: rebuild it."""
    built_here, fix = fix is None, fix or "rebuild the dataset"
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:  # nested too deep to decode
        raise DatasetError(f"{path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(info, dict):
        raise DatasetError(f"{path} is not a JSON object; {fix}")
    if info.get("format") not in FORMATS:
        raise DatasetError(
            f"{path}: format {info.get('format')!r} is not one of {', '.join(map(repr, FORMATS))}; rebuild "
            "with this version"
        )
    if info.get("status") != "complete":
        raise DatasetError(
            f"{path}: status is {info.get('status')!r}, not 'complete'; the build did not finish — rerun "
            "`gristmill data build` with the same config to resume it"
            if built_here
            # elsewhere only a commit puts a dataset.json (trial RV60a 7)
            else f"{path}: status is {info.get('status')!r}, not 'complete' as committed; {fix}"
        )
    for key in ("tokenizer_sha256", "vocab_size", "dtype", "separator", "shard_files", "fingerprint"):
        if key not in info:
            raise DatasetError(f"{path}: missing key {key!r}; {fix}")
    if (problem := shape_problem(info)) is not None:
        raise DatasetError(f"{path}: {problem}; restore the file or {fix}")
    total = info.get("index", {}).get(DOCUMENTS_SUM)
    if total is not None and not (isinstance(total, str) and re.fullmatch("[0-9a-f]{64}", total)):
        # derived, never a build's only record: deleting it loses nothing a rebuild (hours) would give
        raise DatasetError(
            f"{path}: index.{DOCUMENTS_SUM} {total!r} is not 64 lowercase hex digits; delete the key "
            "(`gristmill data index DIR` records it again, summed from the dataset's documents)"
        )
    if info["dtype"] != dtype_name(info["vocab_size"]):
        raise DatasetError(f"{path}: dtype {info['dtype']} does not match vocab_size {info['vocab_size']}")
    return info


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _file_entries(entries: Any, counts: tuple[str, ...]) -> bool:
    """Whether `entries` maps names to {"sha256": str, each of `counts`: int} (shard_files, the
    index's and the "files" entry's)."""
    return isinstance(entries, dict) and all(
        isinstance(f, dict) and isinstance(f.get("sha256"), str) and all(_is_int(f.get(k)) for k in counts)
        for f in entries.values()
    )


def shape_problem(info: dict[str, Any]) -> str | None:
    """What in dataset.json (edited by hand) has a type its readers cannot use, by its key, or None:
    one line where a reader's traceback was (a bucket's, too: review of 2026-12-01)."""
    if not _is_int(info["vocab_size"]):
        return f"vocab_size {info['vocab_size']!r} is not an integer"
    for key in ("dtype", "fingerprint"):
        if not isinstance(info[key], str):
            return f"{key} {info[key]!r} is not a string"
    if not isinstance(info["tokenizer_sha256"], (str, type(None))):
        return f"tokenizer_sha256 {info['tokenizer_sha256']!r} is not a string"
    sep = info["separator"]
    if (
        not isinstance(sep, dict)
        or not _is_int(sep.get("id"))
        or sep.get("position") not in ("after", "before")
    ):
        return f"separator {sep!r} needs an int 'id' and position 'after' or 'before'"
    if not _file_entries(info["shard_files"], ("bytes", "documents", "tokens")):
        return "shard_files must map each shard name to {bytes, sha256, documents, tokens}"
    for key in ("documents", "tokens"):
        if key in info and not _is_int(info[key]):
            return f"{key} {info[key]!r} is not an integer"
    index = info.get("index")
    if "index" in info and not (isinstance(index, dict) and _file_entries(index.get("files"), ("bytes",))):
        return "index must hold files, mapping each file name to {bytes, sha256}"
    if info.get("files") is not None and not _file_entries(info["files"], ("bytes",)):
        return "files must map each path to {bytes, sha256}"
    by_filter = info.get("excluded_by_filter")
    if by_filter is not None and not (isinstance(by_filter, dict) and all(map(_is_int, by_filter.values()))):
        return "excluded_by_filter must map each filter's name to a count"
    dec = info.get("decontaminate")
    if "decontaminate" in info and not (
        isinstance(dec, dict) and isinstance(dec.get("index_sha256"), str) and _is_int(dec.get("ngram"))
    ):
        return "decontaminate must hold index_sha256 (a string) and ngram (an integer)"
    conv = info.get("converted_from")
    if "converted_from" in info and not (
        isinstance(conv, dict)
        and isinstance(conv.get("fingerprints"), list)
        and all(isinstance(f, str) for f in conv["fingerprints"])
    ):
        return "converted_from must hold fingerprints, a list of strings"
    return None


def dataset_json_writable(root: Path) -> bool:
    """Whether root's dataset.json can be replaced (write_dataset_info: a file renamed over it)."""
    return os.access(root, os.W_OK) and os.access(root / DATASET_JSON, os.W_OK)


def write_dataset_info(root: str | Path, info: dict[str, Any]) -> None:
    """Replace dataset.json atomically (the commit point of a build or `gristmill data index`)."""
    write_atomic(Path(root) / DATASET_JSON, json.dumps(info, indent=2, sort_keys=True) + "\n")


# The repair of a dataset.json edited after the build (a field no fingerprint covers): the build, or a
# convert, writes it again from the shards.
REWRITE_DATASET_JSON = (
    "delete it and rerun the build's command, which writes it again from the shards (a dataset `gristmill "
    "data convert` made: convert its source again, into a new directory; one of layout /1 or /2 indexed "
    "by `gristmill data index`: convert it into a new directory, which reads its shards and manifest)"
)


def rewrite_bucket_dataset_json(url: str) -> str:
    """REWRITE_DATASET_JSON of a dataset in a bucket (one built there has no local directory: R21f 2d)."""
    return (
        f"delete {url}/{DATASET_JSON} and rerun the command that wrote it: the build into {url}, or "
        f"`gristmill data upload DIR {url}` of the dataset"
    )


def finished_tasks(completions_dir: Path) -> set[int]:
    """Ranks of the tasks datatrove marked complete in a logging dir's COMPLETIONS_DIR (its `NNNNN`
    files): the build's own pass (OUTPUT/logs/completions/) or a dedup stage's (logs/dedup/STAGE/)."""
    if not completions_dir.is_dir():
        return set()
    return {int(p.name) for p in completions_dir.iterdir() if p.name.isdigit()}


def redo_task(task: str, root: Path | None = None) -> str:
    """The fix for a finished build task (`task`: its name, NNNNN) whose output is gone or damaged:
    its completion marker and dataset.json deleted (under `root`; None: relative, where the build
    ran), the build rerun, which redoes that task alone (a rerun of a finished build only revalidates)."""
    marker, info = Path(LOGS_DIR) / COMPLETIONS_DIR / task, Path(DATASET_JSON)
    where = "" if root is not None else " where the build ran"
    if root is not None:
        marker, info = root / marker, root / info
    return (
        f"delete {marker} and {info}{where}, then rerun the same `gristmill data build` command: it "
        f"redoes task {task} alone (the same shards) and finishes the dataset again"
    )


def _glob_regex(pattern: str) -> str:
    """A RECORDED_FILES pattern as a regular expression of a path inside the dataset: `**` any
    folders (none too), `*` any part of one name."""
    # (a name is never empty: `decontam/` is a console's folder object, no file: review RV55e 6)
    name = lambda seg: "[^/]+" if seg == "*" else re.escape(seg).replace(r"\*", "[^/]*")  # noqa: E731
    parts = ["(?:[^/]+/)*" if seg == "**" else name(seg) + "/" for seg in pattern.split("/")]
    return "".join(parts).removesuffix("/")


_RECORDED = re.compile("|".join(f"(?:{_glob_regex(pattern)})" for pattern in RECORDED_FILES))


def is_recorded_path(rel: str) -> bool:
    """Whether RECORDED_FILES names the file at `rel`, a path inside a dataset (a bucket's key under its
    prefix, as much as a directory's file)."""
    return _RECORDED.fullmatch(rel) is not None


def recorded_paths(root: str | Path) -> list[str]:
    """The paths inside the dataset at `root` of the files there that RECORDED_FILES names: a walk of
    its patterns' first names only (not its shards, nor a cache copy's blocks: review RV55e 5),
    through symbolic links as a glob of them went."""
    root, found = Path(root), []
    for top in sorted({pattern.split("/")[0] for pattern in RECORDED_FILES}):
        for folder, _, files in os.walk(root / top, followlinks=True):
            found += [Path(folder, name).relative_to(root).as_posix() for name in files]
        found += [top] if (root / top).is_file() else []
    return sorted(rel for rel in found if is_recorded_path(rel) and (root / rel).is_file())


def record_files(root: str | Path) -> dict[str, dict[str, Any]]:
    """{path inside the dataset: {"bytes", "sha256"}} of its RECORDED_FILES, for dataset.json's "files"."""
    paths = {rel: Path(root) / rel for rel in recorded_paths(root)}
    return {rel: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for rel, p in paths.items()}


def dataset_files(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file of a complete dataset that dataset.json records a sha256 for, by its path inside the
    dataset: the shards, the index, tokenizer.json ("bytes" None: only its hash is recorded) and the
    "files" entry. dataset.json itself, validation.json and the build's logs are not among them."""
    out: dict[str, dict[str, Any]] = {
        f"{SHARDS_DIR}/{name}": {"bytes": f["bytes"], "sha256": f["sha256"]}
        for name, f in info["shard_files"].items()
    }
    for name, f in (info.get("index") or {}).get("files", {}).items():
        out[f"{INDEX_DIR}/{name}"] = {"bytes": f["bytes"], "sha256": f["sha256"]}
    if info.get("tokenizer_sha256") not in (None, "none"):
        out[TOKENIZER_JSON] = {"bytes": None, "sha256": info["tokenizer_sha256"]}
    out.update(info.get("files") or {})
    return out


def unlike_record(root: str | Path, info: dict[str, Any], which: Callable[[str], bool]) -> str | None:
    """The first file dataset.json records a sha256 for (`dataset_files`, those `which` takes by their
    path inside the dataset) that is missing under `root` or hashes otherwise, or None: what a command
    reads from them is the dataset as it was built."""
    for rel, spec in sorted(dataset_files(info).items()):
        if which(rel) and (
            not (Path(root) / rel).is_file() or file_sha256(Path(root) / rel) != spec["sha256"]
        ):
            return rel
    return None


def manifest_files(root: str | Path) -> list[Path]:
    return sorted((Path(root) / MANIFEST_DIR).glob("*.parquet"))


def shard_files(root: str | Path) -> list[Path]:
    return sorted((Path(root) / SHARDS_DIR).glob("*.tar"))
