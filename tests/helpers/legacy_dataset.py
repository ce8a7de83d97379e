"""Datasets in the layouts before the current one, which builds no longer write: /1 (a tar sample per
document: `<key>.ids`, then `<key>.json` with its metadata; no per-document sha256), byte for byte as
the /1 writer wrote them, and /2 (samples of 64 documents' ids, no `.docs` member: the ShardWriter's
`fmt`); `older_index` gives one the index an older gristmill wrote, `put_as_an_older_upload` puts one
in a bucket as an older gristmill's upload did. Datasets built before /3 are
still read in place and converted by `gristmill data convert`, which the tests check against
datasets written here."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.shard_writer import ShardWriter, _header, finalize_dataset
from pipelines.synthetic_dataset import SEPARATOR
from training.contract.dataset_format import (
    DATASET_JSON,
    DOC_SHA256,
    FORMAT_V2,
    LEGACY_FORMAT,
    MANIFEST_DIR,
    MANIFEST_FIELDS,
    MANIFEST_SCHEMA,
    SHARDS_DIR,
    dataset_files,
    dtype_for_vocab,
    fingerprint,
    read_dataset_info,
    shard_name,
    source_columns,
)
from training.contract.object_store import ObjectStore, ObjectURL

# The /1 manifest: today's columns but the per-document sha256.
LEGACY_MANIFEST_SCHEMA = pa.schema([f for f in MANIFEST_SCHEMA if f.name != DOC_SHA256])


class LegacyShardWriter:
    """The /1 ShardWriter: `add` writes `<key>.ids` and `<key>.json` members at once."""

    def __init__(self, root: str | Path, task: int, vocab_size: int, target_bytes: int = 256 << 20):
        self.root, self.task, self.target_bytes = Path(root), task, target_bytes
        self.dtype = dtype_for_vocab(vocab_size)
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.shard_index, self.offset, self.tar = 0, 0, None

    def _member(self, name: str, data: bytes) -> int:
        self.tar.write(_header(name.encode(), len(data)) + data + bytes(-len(data) % 512))
        start = self.offset + 512
        self.offset = start + len(data) + (-len(data) % 512)
        return start

    def _finish(self) -> None:
        end = self.offset + 1024
        self.tar.write(bytes(1024 + (-end % tarfile.RECORDSIZE)))
        self.tar.close()
        self.tar = None
        self.shard_index += 1

    def add(self, key: str, ids: np.ndarray, meta: dict[str, Any]) -> None:
        if self.tar is None:
            self.name = shard_name(self.task, self.shard_index)
            self.tar = open(self.root / SHARDS_DIR / self.name, "wb")
            self.offset = 0
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        offset = self._member(f"{key}.ids", data)
        self._member(f"{key}.json", json.dumps(meta, sort_keys=True, ensure_ascii=False).encode())
        self.rows.append(
            {"shard": self.name, "key": key, "offset": offset, "nbytes": len(data), "n_tokens": len(ids)}
            | source_columns(meta, MANIFEST_FIELDS)
        )
        if self.offset >= self.target_bytes:
            self._finish()

    def close(self) -> list[dict[str, Any]]:
        if self.tar is not None:
            self._finish()
        table = pa.Table.from_pylist(self.rows, schema=LEGACY_MANIFEST_SCHEMA)
        pq.write_table(table, self.root / MANIFEST_DIR / f"{self.task:05d}.parquet")
        return self.rows


def finalize_legacy(root: str | Path, **kwargs: Any) -> dict[str, Any]:
    """finalize_dataset of shards a LegacyShardWriter wrote: dataset.json says gristmill-shards/1."""
    return finalize_dataset(root, **kwargs, extra={"format": LEGACY_FORMAT, **kwargs.pop("extra", {})})


def write_legacy_dataset(
    root: str | Path, documents: Iterable[np.ndarray], *, vocab_size: int, target_bytes: int = 64 << 20
) -> dict[str, Any]:
    """write_synthetic_dataset's documents in the /1 layout (task 0); returns dataset.json."""
    writer = LegacyShardWriter(root, 0, vocab_size, target_bytes)
    for i, ids in enumerate(documents):
        writer.add(f"t00000d{i:09d}", ids, {"id": f"doc-{i}"})
    writer.close()
    return finalize_legacy(root, vocab_size=vocab_size, separator=SEPARATOR, config_sha256="synthetic")


def write_v2_dataset(
    root: str | Path, documents: Iterable[np.ndarray], *, vocab_size: int, target_bytes: int = 64 << 20
) -> dict[str, Any]:
    """write_synthetic_dataset's documents in the /2 layout (task 0); returns dataset.json."""
    writer = ShardWriter(root, 0, vocab_size, target_bytes, fmt=FORMAT_V2)
    for i, ids in enumerate(documents):
        writer.add(f"t00000d{i:09d}", ids, {"id": f"doc-{i}"})
    writer.close()
    return finalize_dataset(
        root,
        vocab_size=vocab_size,
        separator=SEPARATOR,
        config_sha256="synthetic",
        extra={"format": FORMAT_V2},
    )


def older_index(root: Path) -> dict[str, Any]:
    """Make `root` a dataset with an older gristmill's index (no sample totals, no held-out file:
    only the per-document files), dataset.json and its fingerprint as that gristmill wrote them;
    returns dataset.json."""
    info = read_dataset_info(root)
    files = info["index"]["files"]
    for name in set(files) - {"doc_tokens.bin", "doc_offsets.bin", "shard_rows.bin", "doc_sha256.bin"}:
        (root / "index" / name).unlink()
        del files[name]
    info["index"] = {"format": "gristmill-index/1", "files": files}
    info["fingerprint"] = fingerprint(info)
    (root / DATASET_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def put_as_an_older_upload(root: str | Path, url: str) -> None:
    """Put the dataset at `root` under `url` as an older gristmill's `data upload` did for any layout
    (today's refuses /1 and /2, which no reader of a bucket trains from): each file dataset.json
    records, then dataset.json."""
    root, store = Path(root), ObjectStore(ObjectURL.parse(url))
    for rel in sorted(dataset_files(read_dataset_info(root))):
        store.put_file(root / rel, rel)
    store.put_bytes((root / DATASET_JSON).read_bytes(), DATASET_JSON)
