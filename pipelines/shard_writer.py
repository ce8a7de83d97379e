"""Writes the on-disk dataset contract: tar shards, manifest rows, dataset.json.

This is the only code that writes shards. The tokenize-and-shard pipeline step feeds it encoded
documents; tests and benchmarks use it directly to make synthetic datasets without a tokenizer.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines import faults
from training.contract.atomic_write import atomic_path, move_into_place
from training.contract.dataset_format import (
    DOC_SHA256,
    DOCS_EXT,
    FORMAT,
    FORMAT_V2,
    IDS_EXT,
    MANIFEST_DIR,
    MANIFEST_FIELDS,
    MANIFEST_SCHEMA,
    SAMPLE_DOCS,
    SHARDS_DIR,
    TOKENIZER_JSON,
    doc_records,
    dtype_for_vocab,
    dtype_name,
    file_sha256,
    fingerprint,
    manifest_files,
    record_files,
    sample_key,
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


class ShardWriter:
    """Writes one task's documents into tars of about `target_bytes`, then its manifest parquet.

    The gristmill-shards/3 layout (training/contract/dataset_format.py): documents are gathered
    SAMPLE_DOCS at a time into one tar sample, `<key>.docs` (each document's n_tokens and sha256) then
    `<key>.ids` (their ids back to back), so a loader block's lengths, hashes and ids are one byte
    range; a shard closes after a whole sample. Each document's manifest row records where its ids lie
    and their sha256. `fmt` FORMAT_V2 writes /2 samples (no `.docs` member): for tests of reading and
    converting /2 datasets only; builds write /3. Shards are written as `NAME.tar.tmp` and
    moved into place (fsynced, renamed) when closed, so a partial shard is never visible under its
    final name. Manifest rows are kept in memory (~100 bytes each) and written once at `close()`, also
    via a temporary name.
    """

    def __init__(
        self,
        root: str | Path,
        task: int,
        vocab_size: int,
        target_bytes: int = 256 << 20,
        on_shard: Callable[[Path, list[dict[str, Any]]], None] | None = None,
        fmt: str = FORMAT,
    ):
        """`on_shard(path, rows)`: called with each shard once it is in place, and its manifest rows (an
        s3:// build's task checks, uploads and deletes it there)."""
        if fmt not in (FORMAT, FORMAT_V2):
            raise ValueError(f"ShardWriter writes {FORMAT} (or {FORMAT_V2}), not {fmt}")
        self.fmt = fmt
        self.root = Path(root)
        self.on_shard = on_shard
        self.task = task
        self.dtype = dtype_for_vocab(vocab_size)
        self.vocab_size = vocab_size
        self.target_bytes = target_bytes
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.shard_index = 0
        self.sample_index = 0  # samples written by this task (their keys)
        self._pending: list[bytes] = []  # the ids of the sample being gathered, one entry per document
        self.tar: io.BufferedWriter | None = None  # the open NAME.tar.tmp
        self.tar_path: Path | None = None
        self.offset = 0  # bytes written to the open shard
        # name -> {"bytes", "sha256"} of each closed shard, hashed as it is written: the build
        # records it per task, so a shard changed after its task finished is caught at finalize.
        self.written: dict[str, dict[str, Any]] = {}
        self._sha = hashlib.sha256()
        self._first_row = 0

    def _open(self) -> None:
        name = shard_name(self.task, self.shard_index)
        self.tar_path = self.root / SHARDS_DIR / name
        self.tar = open(str(self.tar_path) + TMP_SUFFIX, "wb", buffering=1 << 20)
        self.offset = 0
        self._sha = hashlib.sha256()
        self._first_row = len(self.rows) - len(self._pending)  # the shard's first manifest row

    def _write(self, data: bytes) -> None:
        assert self.tar is not None
        self.tar.write(data)
        self._sha.update(data)

    def _write_member(self, name: str, data: bytes | list[bytes]) -> int:
        """Header, data (one piece or several back to back), zero padding to the next block; returns
        the data's offset."""
        pieces = [data] if isinstance(data, bytes) else data
        size = sum(len(p) for p in pieces)
        self._write(_header(name.encode(), size))
        for i, p in enumerate(pieces):
            self._write(p)
            if i == len(pieces) // 2 and self.shard_index == 1:  # the first shard renamed, this one half
                self.tar.flush()  # written: what a kill there leaves behind (tests)
                faults.maybe_kill(self.task, "second_shard")
        pad = -size % tarfile.BLOCKSIZE
        if pad:
            self._write(bytes(pad))
        start = self.offset + tarfile.BLOCKSIZE
        self.offset = start + size + pad
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
        if self.on_shard is not None:
            self.on_shard(self.tar_path, self.rows[self._first_row :])

    def add(
        self,
        key: str,
        ids: np.ndarray,
        meta: dict[str, Any],
        provenance: dict[str, Any] | None = None,
    ) -> None:
        """Append one document (`key` names it in the manifest); written with its sample's other
        documents. `provenance`: the row's PROVENANCE_COLUMNS."""
        if "." in key:
            raise ValueError(f"webdataset key {key!r} contains a dot")
        ids = np.asarray(ids)
        if len(ids) and not 0 <= int(ids.min()) <= int(ids.max()) <= np.iinfo(self.dtype).max:
            # the cast below would wrap it into another token, which no later check could tell (an id
            # that fits but is ≥ vocab_size is the id checks' to find: validate's, the loader's)
            raise ValueError(
                f"document {key!r} has token ids from {int(ids.min())} to {int(ids.max())}, which "
                f"{self.dtype.name} (vocab_size {self.vocab_size}) cannot hold"
            )
        data = np.ascontiguousarray(ids, dtype=self.dtype).tobytes()
        self.rows.append(
            {
                "shard": None,  # set when its sample is written
                "key": key,
                "offset": None,
                "nbytes": len(data),
                "n_tokens": int(len(ids)),
                **source_columns(meta, MANIFEST_FIELDS),
                **(provenance or {}),
                DOC_SHA256: hashlib.sha256(data).digest(),
            }
        )
        self._pending.append(data)
        if len(self._pending) == SAMPLE_DOCS:
            self._write_sample()

    def _write_sample(self) -> None:
        """The gathered documents as one sample (`<key>.docs`, then `<key>.ids`); their rows get shard
        and offset."""
        if self.tar is None:
            self._open()
        assert self.tar_path is not None
        key = sample_key(self.task, self.sample_index)
        rows = self.rows[len(self.rows) - len(self._pending) :]
        if self.fmt == FORMAT:
            records = doc_records([r["n_tokens"] for r in rows], [r[DOC_SHA256] for r in rows])
            self._write_member(f"{key}.{DOCS_EXT}", records)
        start = self._write_member(f"{key}.{IDS_EXT}", self._pending)
        for row in rows:
            row["shard"], row["offset"] = self.tar_path.name, start
            start += row["nbytes"]
        self._pending = []
        self.sample_index += 1
        if self.offset >= self.target_bytes:
            self._finish_shard()

    def end_shard(self) -> None:
        """Close the open shard after the documents added so far (their last sample may have fewer than
        SAMPLE_DOCS): `gristmill data convert` keeps each shard's documents in that shard."""
        if self._pending:
            self._write_sample()
        if self.tar is not None:
            self._finish_shard()

    def close(self) -> list[dict[str, Any]]:
        self.end_shard()
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
    shards_on_disk: bool = True,
) -> dict[str, Any]:
    """Hash every shard, total the manifests and write dataset.json with status "complete".

    Called once after all tasks finished. `separator` is {"token", "id", "position"}. `recorded`
    maps shard names to the {"bytes", "sha256"} their task wrote; a shard that differs (or is
    gone) raises ShardChangedError before dataset.json is written. `shards_on_disk` False: the
    shards are not under `root` but in a bucket, each checked there against `recorded` by the caller
    (an s3:// build's driver), whose sizes and hashes dataset.json then records; the manifests and
    everything else are under `root`.
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
        want = (recorded or {}).get(name)
        path = root / SHARDS_DIR / name
        if not shards_on_disk:
            now = None if want is None else {"bytes": want["bytes"], "sha256": want["sha256"]}
        else:
            now = {"bytes": path.stat().st_size, "sha256": file_sha256(path)} if path.is_file() else None
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
