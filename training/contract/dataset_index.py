"""The loader index: flat little-endian arrays next to the manifest, memory-mapped by every rank.

    index/doc_tokens.bin   uint32 per manifest row (manifest files in name order): tokens incl. separator
    index/doc_offsets.bin  uint32 (every shard < 4 GiB) or uint64 per row: byte offset of its `.ids`
                           member's data inside its shard
    index/shard_rows.bin   uint64, one per shard (dataset.json's sorted names) plus one: the shard's
                           first manifest row; shard s holds rows [shard_rows[s], shard_rows[s+1])
    index/doc_sha256.bin   32 bytes per row (gristmill-shards/2 and /3, index format /2): the
                           sha256 of the document's ids, what a bucket's range reads are checked
                           against (read by range, with the documents that need it)

dataset.json's "index" entry names each file's dtype, count, bytes and sha256; the fingerprint
covers those hashes. The arrays are derived from the manifest alone (`derive_index`), so the
build, `gristmill data index` and `gristmill data validate` all run the same code: the first two
write the files, the last re-derives them and compares hashes. At 1.5B documents the files take
~12 GB; a rank touches them through the page cache (shared by every process on the node), never
as private memory, and the parquet manifest is not read on the training path at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training.contract.dataset_format import (
    DATASET_JSON,
    DOC_SHA256,
    INDEX_DIR,
    LEGACY_FORMAT,
    DatasetError,
    file_sha256,
    layout_offsets,
    manifest_files,
    numpy_dtype,
)

LEGACY_INDEX_FORMAT = "gristmill-index/1"  # a gristmill-shards/1 dataset's: no per-document sha256
INDEX_FORMAT = "gristmill-index/2"  # a gristmill-shards/2 or /3 dataset's
DOC_TOKENS = "doc_tokens.bin"
DOC_OFFSETS = "doc_offsets.bin"
SHARD_ROWS = "shard_rows.bin"
DOC_HASHES = "doc_sha256.bin"
HASH_BYTES = 32
# dataset.json name → on disk; "sha256": HASH_BYTES raw bytes per row
_DTYPES = {"uint32": np.dtype("<u4"), "uint64": np.dtype("<u8"), "sha256": np.dtype(("V", HASH_BYTES))}


def index_format(info: dict[str, Any]) -> str:
    """The index format a dataset of dataset.json `info` has: /2 (with the per-document sha256) for the
    shard layouts /2 and /3, /1 for the legacy one."""
    return LEGACY_INDEX_FORMAT if info["format"] == LEGACY_FORMAT else INDEX_FORMAT


def index_files(info: dict[str, Any]) -> tuple[str, ...]:
    """The files of the index of a dataset of dataset.json `info`."""
    base = (DOC_TOKENS, DOC_OFFSETS, SHARD_ROWS)
    return base + (DOC_HASHES,) if index_format(info) == INDEX_FORMAT else base


_TMP = INDEX_DIR + ".tmp"  # built here, then renamed over index/ (validate flags it if left over)


def derive_index(root: str | Path, info: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """The index's arrays, derived from manifest/*.parquet, as (file name, chunk) in write order.

    Checks what the loader relies on and raises DatasetError naming the manifest otherwise: every
    row names a listed shard, rows of one shard are contiguous and shards come in name order,
    n_tokens in (0, 2³²), nbytes = n_tokens × itemsize, the member lies inside its shard, and the
    totals equal dataset.json's documents / tokens; for a gristmill-shards/2 or /3 dataset also that each
    shard's offsets are the layout's (dataset_format.layout_offsets) and every row has its sha256.
    """
    root = Path(root)
    names = sorted(info["shard_files"])
    shard_bytes = np.array([info["shard_files"][n]["bytes"] for n in names], np.int64)
    offset_dtype = offsets_dtype(info)
    itemsize = numpy_dtype(info["dtype"]).itemsize
    value_set = pa.array(names, pa.string())
    per_shard = np.zeros(len(names), np.int64)
    last_shard, rows, tokens = -1, 0, 0
    hashed = index_format(info) == INDEX_FORMAT
    files = manifest_files(root)
    if not files:
        raise DatasetError(f"{root / 'manifest'} holds no *.parquet files; rebuild the dataset")
    for path in files:
        try:
            cols = ["shard", "offset", "nbytes", "n_tokens"] + ([DOC_SHA256] if hashed else [])
            t = pq.read_table(path, columns=cols)
        except (pa.ArrowInvalid, KeyError, OSError) as e:
            raise DatasetError(f"{path}: unreadable manifest ({e}); rebuild the dataset") from None
        shard = pc.index_in(t.column("shard"), value_set=value_set)
        if shard.null_count:
            bad = t.column("shard").filter(pc.is_null(shard))[0].as_py()
            raise DatasetError(f"{path} names shard {bad!r}, which dataset.json does not list; rebuild")
        shard = shard.to_numpy().astype(np.int64)
        offset = t.column("offset").to_numpy()
        nbytes = t.column("nbytes").to_numpy()
        ntok = t.column("n_tokens").to_numpy()
        if len(ntok) == 0:
            continue
        if shard[0] < last_shard or (np.diff(shard) < 0).any():
            raise DatasetError(
                f"{path}: manifest rows are not grouped by shard in name order (the build writes them so); "
                "the manifest was edited or merged by hand — rebuild the dataset"
            )
        if (
            ntok.min() <= 0
            or ntok.max() >= 1 << 32
            or offset.min() < 0
            or (nbytes != ntok * itemsize).any()
            or (offset + nbytes > shard_bytes[shard]).any()
        ):
            raise DatasetError(
                f"{path}: rows with n_tokens ≤ 0, nbytes ≠ n_tokens × {itemsize}, or an .ids member "
                "beyond its shard's end; the manifest does not describe these shards — rebuild"
            )
        if hashed:
            starts = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]])
            for a, b in zip(starts.tolist(), np.r_[starts[1:], len(shard)].tolist()):
                laid = layout_offsets(nbytes[a:b], info["format"])
                if shard[a] == last_shard or not np.array_equal(offset[a:b], laid):
                    raise DatasetError(
                        f"{path}: the rows of shard {names[shard[a]]} are not laid out as a {info['format']} "
                        "shard lays out its documents (a sample per 64, back to back): the manifest does not "
                        "describe these shards — rebuild"
                    )
            sha = t.column(DOC_SHA256)
            if sha.null_count:
                raise DatasetError(f"{path}: rows without a {DOC_SHA256}; rebuild the dataset")
        last_shard = int(shard[-1])
        per_shard += np.bincount(shard, minlength=len(names))
        rows += len(ntok)
        tokens += int(ntok.sum())
        yield DOC_TOKENS, ntok.astype("<u4")
        yield DOC_OFFSETS, offset.astype(offset_dtype)
        if hashed:
            yield DOC_HASHES, _hash_rows(sha)
    if (rows, tokens) != (info.get("documents"), info.get("tokens")):
        raise DatasetError(
            f"{root}: the manifests hold {rows} documents / {tokens} tokens but {DATASET_JSON} records "
            f"{info.get('documents')} / {info.get('tokens')}; rebuild the dataset"
        )
    first = np.zeros(len(names) + 1, "<u8")
    np.cumsum(per_shard, out=first[1:])
    yield SHARD_ROWS, first


def _hash_rows(column: pa.ChunkedArray) -> np.ndarray:
    """A manifest's binary(32) sha256 column as one HASH_BYTES-byte record per row."""
    dtype = _DTYPES["sha256"]
    parts = [np.frombuffer(c.buffers()[1], dtype, len(c), c.offset * HASH_BYTES) for c in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def shard_rows_of(info: dict[str, Any]) -> np.ndarray | None:
    """SHARD_ROWS's array from dataset.json alone (each shard's "documents", in name order), or None
    when it lacks them: a copy of the dataset checks it against the index's hash instead of fetching
    the file."""
    try:
        counts = [int(info["shard_files"][n]["documents"]) for n in sorted(info["shard_files"])]
    except (KeyError, TypeError, ValueError):
        return None
    first = np.zeros(len(counts) + 1, "<u8")
    np.cumsum(counts, out=first[1:])
    return first


def offsets_dtype(info: dict[str, Any]) -> np.dtype:
    biggest = max((f["bytes"] for f in info["shard_files"].values()), default=0)
    return np.dtype("<u4") if biggest < 1 << 32 else np.dtype("<u8")


def _describe(chunks: Iterator[tuple[str, np.ndarray]], out: Path | None, fmt: str) -> dict[str, Any]:
    """Hash (and, with `out`, write) the derived arrays; returns dataset.json's "index" entry."""
    files: dict[str, dict[str, Any]] = {}
    hashes: dict[str, Any] = {}
    handles: dict[str, Any] = {}
    try:
        for name, chunk in chunks:
            if name not in files:
                files[name] = {"dtype": _dtype_name(chunk.dtype), "count": 0, "bytes": 0}
                hashes[name] = hashlib.sha256()
                if out is not None:
                    handles[name] = open(out / name, "wb")
            data = memoryview(np.ascontiguousarray(chunk)).cast("B")
            files[name]["count"] += len(chunk)
            files[name]["bytes"] += len(data)
            hashes[name].update(data)
            if out is not None:
                handles[name].write(data)
        for f in handles.values():
            f.flush()
            os.fsync(f.fileno())
    finally:
        for f in handles.values():
            f.close()
    for name, h in hashes.items():
        files[name]["sha256"] = h.hexdigest()
    return {"format": fmt, "files": files}


def _dtype_name(dtype: np.dtype) -> str:
    return next(name for name, d in _DTYPES.items() if d == np.dtype(dtype))


def write_index(root: str | Path, info: dict[str, Any]) -> dict[str, Any]:
    """Derive the index into index.tmp/, then rename it over index/; returns the "index" entry.

    The caller records the entry in dataset.json afterwards: that write is the commit point, so a
    crash in between leaves a dataset.json that does not describe index/, which the next
    `gristmill data index` (or build finalize) simply redoes.
    """
    root = Path(root)
    tmp, final, old = root / _TMP, root / INDEX_DIR, root / (INDEX_DIR + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)  # left by a crash between the two renames below
    try:
        tmp.mkdir()
        entry = _describe(derive_index(root, info), tmp, index_format(info))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    return entry


def damaged_files(root: str | Path, entry: dict[str, Any]) -> dict[str, str]:
    """{file name: "missing" | "damaged"} for index files not as dataset.json's entry records them."""
    bad = {}
    for name, spec in sorted(entry["files"].items()):
        path = Path(root) / INDEX_DIR / name
        if not path.is_file():
            bad[name] = "missing"
        elif file_sha256(path) != spec["sha256"]:
            bad[name] = "damaged"
    return bad


def expected_index(root: str | Path, info: dict[str, Any]) -> dict[str, Any]:
    """The "index" entry the manifest implies (hashes only, nothing written): for validation."""
    return _describe(derive_index(root, info), None, index_format(info))


class DocIndex:
    """The index of a dataset, memory-mapped read-only.

    `tokens[row]` is per manifest row, `offsets_of(rows)` where the rows' ids lie in their shards,
    `shard_of(rows)` uses the per-shard table. Opening checks the files against dataset.json's sizes
    and the shard table's shape (cheap); the hashes are `gristmill data validate`'s job (and a
    bucket's copy's, when it is fetched). `with_offsets=False` (a bucket's dataset: the per-document
    offsets are not fetched) computes a gristmill-shards/2 or /3 shard's offsets from its rows' lengths by
    its layout (dataset_format.layout_offsets), a shard at a time.
    """

    def __init__(self, root: str | Path, info: dict[str, Any], *, with_offsets: bool = True):
        root = Path(root)
        where = root / DATASET_JSON
        entry = info.get("index")
        if entry is None:
            raise DatasetError(
                f"{where} describes no loader index ({INDEX_DIR}/): the dataset was built before the loader "
                f"read one; run `gristmill data index {root}` once (it adds {INDEX_DIR}/ and updates "
                "dataset.json; runs that trained on this dataset resume unchanged)"
            )
        if entry.get("format") != index_format(info):
            raise DatasetError(
                f"{where}: index format {entry.get('format')!r} is not {index_format(info)!r}; rerun "
                f"`gristmill data index {root}`"
            )
        self.itemsize = numpy_dtype(info["dtype"]).itemsize
        self.format = info["format"]  # the shard layout (offsets_of without the offsets)
        self._files: dict[str, tuple[Path, np.dtype]] = {}
        for name in (DOC_TOKENS, DOC_OFFSETS, SHARD_ROWS) if with_offsets else (DOC_TOKENS, SHARD_ROWS):
            spec = entry["files"].get(name)
            path = root / INDEX_DIR / name
            if spec is None:
                raise DatasetError(
                    f"{where}: the index entry lacks {name}; rerun `gristmill data index {root}`"
                )
            size = path.stat().st_size if path.is_file() else None
            if size != spec["bytes"]:
                raise DatasetError(
                    f"{path} is {'missing' if size is None else f'{size} bytes'} but {where} records "
                    f"{spec['bytes']} bytes: the index was damaged or replaced; rerun "
                    f"`gristmill data index {root}`"
                )
            if spec.get("dtype") not in _DTYPES:
                raise DatasetError(
                    f"{where}: index file {name} has dtype {spec.get('dtype')!r}, not one of "
                    f"{sorted(_DTYPES)}; rerun `gristmill data index {root}`"
                )
            self._files[name] = (path, _DTYPES[spec["dtype"]])
        self._map()
        self.shard_rows = np.array(_mapped(*self._files[SHARD_ROWS]), np.int64)  # small: one per shard
        self._layout: dict[int, np.ndarray] = {}  # shard → its rows' offsets (with_offsets=False)
        n = int(info["documents"])
        if (
            len(self.tokens) != n
            or (self.offsets is not None and len(self.offsets) != n)
            or len(self.shard_rows) != len(info["shard_files"]) + 1
            or self.shard_rows[0] != 0
            or self.shard_rows[-1] != n
            or (np.diff(self.shard_rows) < 0).any()
        ):
            raise DatasetError(
                f"{root / INDEX_DIR}: the index does not describe {n} documents in "
                f"{len(info['shard_files'])} shards as {where} does; rerun `gristmill data index {root}`"
            )

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.shard_rows, rows, side="right") - 1

    def offsets_of(self, rows: np.ndarray) -> np.ndarray:
        """Byte offsets of rows' ids inside their shards (int64)."""
        rows = np.asarray(rows, np.int64)
        if self.offsets is not None:
            return self.offsets[rows].astype(np.int64)
        shards = self.shard_of(rows)
        out = np.empty(len(rows), np.int64)
        for s in np.unique(shards).tolist():
            laid = self._layout.get(s)
            if laid is None:
                if len(self._layout) >= 64:  # bounded: a few shards are read at a time
                    self._layout.pop(next(iter(self._layout)))
                a, b = int(self.shard_rows[s]), int(self.shard_rows[s + 1])
                nbytes = np.asarray(self.tokens[a:b], np.int64) * self.itemsize
                laid = self._layout[s] = layout_offsets(nbytes, self.format)
            sel = shards == s
            out[sel] = laid[rows[sel] - int(self.shard_rows[s])]
        return out

    def _map(self) -> None:
        self.tokens = _mapped(*self._files[DOC_TOKENS])
        self.offsets = _mapped(*self._files[DOC_OFFSETS]) if DOC_OFFSETS in self._files else None

    # Pickling a np.memmap copies its data: DataLoader workers get the paths and map them again.
    def __getstate__(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k not in ("tokens", "offsets")}, "_layout": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._map()


def _mapped(path: Path, dtype: np.dtype) -> np.ndarray:
    return np.memmap(path, dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


# --------------------------------------------------------------------------------------------
# `gristmill data index DIR`: add (or repair) the index of an existing dataset
