"""Writes the on-disk dataset contract: tar shards, manifest rows, dataset.json.

This is the only code that writes shards. The tokenize-and-shard pipeline step feeds it encoded
documents; tests and benchmarks use it directly to make synthetic datasets without a tokenizer.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.contract.atomic_write import atomic_path, move_into_place
from training.contract.dataset_format import (
    FORMAT,
    IDS_EXT,
    MANIFEST_DIR,
    MANIFEST_FIELDS,
    MANIFEST_SCHEMA,
    META_EXT,
    SHARDS_DIR,
    TOKENIZER_JSON,
    dtype_for_vocab,
    dtype_name,
    file_sha256,
    fingerprint,
    manifest_files,
    record_files,
    shard_name,
    source_columns,
    write_dataset_info,
)
from training.contract.dataset_index import write_index

# A shard is written as NAME.tar.tmp: a task that starts over removes its own by that name
# (tokenize_shard), and the build's cleanup and the validator know `*.tmp` as a write cut short.
TMP_SUFFIX = ".tmp"


def _member(name: str, size: int) -> tarfile.TarInfo:
    # Fixed metadata (mtime 0, root owner) so a rerun writes byte-identical shards.
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# The USTAR header of `_member(name, size)`, built directly: `tarfile.addfile` costs ~40 µs per
# member (a TarInfo copy, field-by-field encoding), which was a tenth of the build's time next to
# the tokenizer. The bytes are identical to tarfile's (tests/test_build_shards.py checks it).
_HEADER_TEMPLATE = bytearray(tarfile.BLOCKSIZE)
_HEADER_TEMPLATE[100:124] = b"0000644\x000000000\x000000000\x00"  # mode, uid, gid
_HEADER_TEMPLATE[136:157] = b"00000000000\x00        0"  # mtime 0, checksum placeholder, type "0"
_HEADER_TEMPLATE[257:265] = tarfile.POSIX_MAGIC
_TEMPLATE_SUM = sum(_HEADER_TEMPLATE)


def _header(name: bytes, size: int) -> bytes:
    if len(name) > 100 or size >= 8**11:
        return _member(name.decode(), size).tobuf(tarfile.USTAR_FORMAT)
    h = bytearray(_HEADER_TEMPLATE)
    h[: len(name)] = name
    size_field = b"%011o\x00" % size
    h[124:136] = size_field
    chksum = _TEMPLATE_SUM + sum(name) + sum(size_field)
    h[148:155] = b"%06o\x00" % chksum
    return bytes(h)


def meta_json_bytes(meta: dict[str, Any]) -> bytes:
    """The `.json` member's bytes: sorted keys, UTF-8 (deterministic, so reruns are byte-identical)."""
    return json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8")


class ShardWriter:
    """Writes one task's documents into tars of about `target_bytes`, then its manifest parquet.

    Shards are written as `NAME.tar.tmp` and moved into place (fsynced, renamed) when closed, so a
    partial shard is never visible under its final name. Manifest rows are kept in memory (a few
    dozen bytes each) and written once at `close()`, also via a temporary name.
    """

    def __init__(self, root: str | Path, task: int, vocab_size: int, target_bytes: int = 256 << 20):
        self.root = Path(root)
        self.task = task
        self.dtype = dtype_for_vocab(vocab_size)
        self.vocab_size = vocab_size
        self.target_bytes = target_bytes
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.shard_index = 0
        self.tar: io.BufferedWriter | None = None  # the open NAME.tar.tmp
        self.tar_path: Path | None = None
        self.offset = 0  # bytes written to the open shard
        # name -> {"bytes", "sha256"} of each closed shard, hashed as it is written: the build
        # records it per task, so a shard changed after its task finished is caught at finalize.
        self.written: dict[str, dict[str, Any]] = {}
        self._sha = hashlib.sha256()

    def _open(self) -> None:
        name = shard_name(self.task, self.shard_index)
        self.tar_path = self.root / SHARDS_DIR / name
        self.tar = open(str(self.tar_path) + TMP_SUFFIX, "wb", buffering=1 << 20)
        self.offset = 0
        self._sha = hashlib.sha256()

    def _write(self, data: bytes) -> None:
        assert self.tar is not None
        self.tar.write(data)
        self._sha.update(data)

    def _write_member(self, name: str, data: bytes) -> int:
        """Header, data, zero padding to the next block; returns the data's offset."""
        self._write(_header(name.encode(), len(data)))
        self._write(data)
        pad = -len(data) % tarfile.BLOCKSIZE
        if pad:
            self._write(bytes(pad))
        start = self.offset + tarfile.BLOCKSIZE
        self.offset = start + len(data) + pad
        return start

    def _finish_shard(self) -> None:
        assert self.tar is not None and self.tar_path is not None
        # End of archive as tarfile writes it: two zero blocks, then padding to a whole record.
        end = self.offset + 2 * tarfile.BLOCKSIZE
        self._write(bytes(2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE)))
        self.tar.close()
        self.written[self.tar_path.name] = {
            "bytes": os.path.getsize(str(self.tar_path) + TMP_SUFFIX),
            "sha256": self._sha.hexdigest(),
        }
        move_into_place(str(self.tar_path) + TMP_SUFFIX, self.tar_path)
        self.tar = None
        self.shard_index += 1

    def add(
        self,
        key: str,
        ids: np.ndarray,
        meta: dict[str, Any],
        meta_json: bytes | None = None,
        provenance: dict[str, Any] | None = None,
    ) -> None:
        """Append one document: `<key>.ids` then `<key>.json`; records its manifest row.

        `meta_json` is `meta` already serialised with `meta_json_bytes` (the build spills it that
        way), so it is not encoded a second time; `provenance`: the row's PROVENANCE_COLUMNS."""
        if "." in key:
            raise ValueError(f"webdataset key {key!r} contains a dot")
        if self.tar is None:
            self._open()
        assert self.tar is not None and self.tar_path is not None
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        offset = self._write_member(f"{key}.{IDS_EXT}", data)
        self._write_member(f"{key}.{META_EXT}", meta_json if meta_json is not None else meta_json_bytes(meta))
        self.rows.append(
            {
                "shard": self.tar_path.name,
                "key": key,
                "offset": offset,
                "nbytes": len(data),
                "n_tokens": int(len(ids)),
                **source_columns(meta, MANIFEST_FIELDS),
                **(provenance or {}),
            }
        )
        if self.offset >= self.target_bytes:
            self._finish_shard()

    def close(self) -> list[dict[str, Any]]:
        if self.tar is not None:
            self._finish_shard()
        path = self.root / MANIFEST_DIR / f"{self.task:05d}.parquet"
        table = pa.Table.from_pylist(self.rows, schema=MANIFEST_SCHEMA)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        return self.rows


class ShardChangedError(Exception):
    """Shards whose bytes differ from what their task recorded: [(name, recorded, on disk or None)]."""

    def __init__(self, changed: list[tuple[str, dict[str, Any], dict[str, Any] | None]]):
        super().__init__(", ".join(name for name, _, _ in changed))
        self.changed = changed


def finalize_dataset(
    root: str | Path,
    *,
    vocab_size: int,
    separator: dict[str, Any],
    config_sha256: str,
    tokenizer_path: str | Path | None = None,
    extra: dict[str, Any] | None = None,
    recorded: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Hash every shard, total the manifests and write dataset.json with status "complete".

    Called once after all tasks finished. `separator` is {"token", "id", "position"}. `recorded`
    maps shard names to the {"bytes", "sha256"} their task wrote; a shard that differs (or is
    gone) raises ShardChangedError before dataset.json is written.
    """
    root = Path(root)
    tok_dst = root / TOKENIZER_JSON
    if tokenizer_path is not None and Path(tokenizer_path).resolve() != tok_dst.resolve():
        shutil.copyfile(tokenizer_path, tok_dst)
    tokenizer_sha = file_sha256(tok_dst) if tok_dst.exists() else "none"

    per_shard: dict[str, dict[str, int]] = {}
    documents = tokens = 0
    for path in manifest_files(root):
        t = pq.read_table(path, columns=["shard", "n_tokens"])
        shards = t.column("shard").to_pylist()
        ntok = t.column("n_tokens").to_numpy()
        for s, n in zip(shards, ntok):
            entry = per_shard.setdefault(s, {"documents": 0, "tokens": 0})
            entry["documents"] += 1
            entry["tokens"] += int(n)
        documents += len(shards)
        tokens += int(ntok.sum()) if len(ntok) else 0

    shard_files = {}
    changed = []
    for name in sorted(set(per_shard) | set(recorded or {})):
        path = root / SHARDS_DIR / name
        now = {"bytes": path.stat().st_size, "sha256": file_sha256(path)} if path.is_file() else None
        want = (recorded or {}).get(name)
        if want is not None and now != {"bytes": want["bytes"], "sha256": want["sha256"]}:
            changed.append((name, want, now))
        if name in per_shard and now is not None:
            shard_files[name] = {**now, **per_shard[name]}
    if changed:
        raise ShardChangedError(changed)
    info: dict[str, Any] = {
        "format": FORMAT,
        "tokenizer_sha256": tokenizer_sha,
        "vocab_size": int(vocab_size),
        "dtype": dtype_name(vocab_size),
        "separator": dict(separator),
        "config_sha256": config_sha256,
        "documents": documents,
        "tokens": tokens,
        "shards": len(shard_files),
        "shard_files": shard_files,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }
    info["index"] = write_index(root, info)
    info["files"] = record_files(root)  # what a copy in a bucket or a cache is checked against
    info["fingerprint"] = fingerprint(info)
    info["status"] = "complete"
    write_dataset_info(root, info)
    return info
