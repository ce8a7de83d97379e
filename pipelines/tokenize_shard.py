"""The tokenize-and-shard datatrove step: kept documents → token ids → shuffled webdataset tars.

Per task: documents are encoded in batches by `tokenization.separator.DocumentEncoder` (the one
place that encodes; it asserts exactly one separator per document) and appended to a spill file
(ids in the shard dtype, then the metadata JSON). When the input ends, the task's documents are
permuted by a seeded RNG (seed, task) and written through `pipelines.shard_writer.ShardWriter`
(temporary name → rename), so the full shuffle costs one sequential write and one read of the
task's tokens instead of holding them in memory. Output is a pure function of the task's input
and the config: a killed task rerun writes byte-identical shards.

In a build into a bucket (`upload`), the task checks, uploads and deletes each shard as it closes
it, then uploads the rest of its output and its record (pipelines/task_upload.py); a task whose
record is in the bucket with every object as it lists returns before reading its input.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger
from datatrove.utils.stats import PipelineStats

from pipelines.dedup import decisions_sha256, text_hash_hex
from pipelines.filters import ExcludedWriter, drop
from pipelines.progress import TaskProgress
from pipelines.shard_writer import ShardWriter
from pipelines.sources import META_KEYS
from pipelines.task_upload import TaskUpload, TaskUploader, task_root
from tokenization.separator import DocumentEncoder, SeparatorPolicy
from tokenization.tokenizer_io import TokenizerFile
from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import (
    EXCLUDED_DIR,
    MANIFEST_DIR,
    SAMPLE_DOCS,
    SHARDS_DIR,
    SOURCE_FILE,
    SOURCE_ROW,
    TEXT_HASH,
    doc_key,
    dtype_for_vocab,
    dtype_name,
)
from training.contract.disk_space import DiskFullError, check_free
from training.contract.errors import GristmillError

SPILL_PREFIX = ".spill-"  # hidden: never matches shards/*.tar
# the excluded/ rows' filter of documents whose text encodes to no token, or to the unknown token
FILTER_NAME = "tokens"
SHARD_RECORDS = "logs/shard_sha256"  # NNNNN.json per task: {shard: {bytes, sha256}}
# Tar overhead per document, at most: its sample's two headers, its DOC_RECORD-byte `.docs` record
# and both members' padding (a sample of one: 512 + 512 + 512 + 511 bytes).
TAR_OVERHEAD_PER_DOC = 2048


def _unknown_reason(unknown: int, tokens: int, unk: str | None) -> str:
    """The excluded row's reason for a text `unknown` of whose `tokens` are the unknown token `unk`."""
    return (
        f"{unknown:,} of its {tokens:,} tokens are the tokenizer's unknown token {unk!r} (text its "
        "vocabulary cannot spell, a word longer than its model reads, or that token quoted literally)"
    )


def _no_traceback_for_gristmill_errors(record) -> None:
    """loguru patcher: datatrove logs a failed task with `logger.exception`; a GristmillError's
    message already names the file and the fix, so print it as one line, without a traceback."""
    exc = record["exception"]
    if exc is not None and isinstance(exc.value, GristmillError):
        record["exception"] = None


# Imported wherever a task runs (datatrove unpickles this step in each worker process).
logger.configure(patcher=_no_traceback_for_gristmill_errors)


def check_free_space(
    path: str | Path,
    need_bytes: float,
    reserve_gb: float,
    what: str,
    kept: str = " (finished tasks are kept)",
) -> None:
    """Raise DiskFullError (the contract's, also importable from here) unless `path`'s filesystem
    keeps `reserve_gb` free after `need_bytes`. `kept` ends the advice: what a rerun keeps (nothing
    to say before any task ran)."""
    check_free(
        path,
        need_bytes,
        what=what,
        keep_bytes=reserve_gb * 1e9,
        keep_setting=f"build.min_free_gb = {reserve_gb:g}",
        advice=f"free some space or point `output` at a larger filesystem, then rerun the same command{kept}",
    )


class TokenizeShard(PipelineStep):
    """Encodes each task's kept documents and writes its shards and manifest."""

    type = "🔢 - TOKENIZE"
    name = "tokenize + shard (gristmill)"

    def __init__(
        self,
        output: str | Path,
        tokenizer: TokenizerFile,
        policy: SeparatorPolicy,
        target_bytes: int,
        shuffle: bool = True,
        seed: int = 0,
        batch_chars: int = 4_000_000,
        min_free_gb: float = 1.0,
        progress: TaskProgress | None = None,
        upload: TaskUpload | None = None,
        stats_of: list[PipelineStep] | None = None,
        dedup_out: str | Path | None = None,
    ):
        """`upload`: the bucket this task uploads its output to (an s3:// build), None for a local
        build; `stats_of`: the steps before this one, whose datatrove stats an uploading task sends
        with its own (datatrove writes them only after the last step, on the node that ran it);
        `dedup_out`: with [dedup], the work directory of the dedup decisions an uploading task's record
        is of (TaskUpload.committed)."""
        super().__init__()
        self.output = str(output)
        self.tokenizer = tokenizer
        self.upload = upload
        self.stats_of = list(stats_of or [])
        self.dedup_out = None if dedup_out is None else str(dedup_out)
        self.policy = policy
        self.target_bytes = target_bytes
        self.shuffle = shuffle
        self.seed = seed
        self.batch_chars = batch_chars
        self.min_free_gb = min_free_gb
        self.progress = progress

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        decisions = decisions_sha256(self.dedup_out) if self.upload and self.dedup_out else None
        if self.upload is not None and self.upload.committed(rank, decisions):
            # `data` is never iterated, so no step before this one runs: the input is not read.
            logger.info(
                f"task {rank}: its record and every object it lists are in {self.upload.url}; nothing to do"
            )
            return
        try:
            self._build(data, rank, decisions)
        except DiskFullError:
            self._remove_own_output(rank)
            raise
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            self._remove_own_output(rank)
            raise DiskFullError(
                f"the disk under {self.output} filled up while task {rank} was writing ({e}); free "
                "some space or point `output` at a larger filesystem, then rerun the same command "
                "(finished tasks are kept)"
            ) from None
        return
        yield  # a generator step that forwards nothing

    def _root(self, rank: int) -> Path:
        """Where the task writes: the dataset directory, or an uploading task's own folder."""
        return task_root(self.output, rank) if self.upload is not None else Path(self.output)

    def _remove_own_output(self, rank: int) -> None:
        """Everything this unfinished task wrote: an uploading task's own folder, or its spill, shards,
        manifest part, record and excluded rows in the dataset directory. At its start, what an earlier
        attempt left (kept, a shard of a killed attempt whose input then shrank, re-downloaded: accepted
        for an unfinished task, stayed on disk, listed nowhere, and failed validation at every rerun);
        when the disk fills, the room it holds (the rerun starts the task over anyway)."""
        if self.upload is not None:  # this attempt uploads only what it writes
            shutil.rmtree(self._root(rank), ignore_errors=True)
            return
        root, shards = Path(self.output), Path(self.output) / SHARDS_DIR
        own = [root / MANIFEST_DIR / f"{rank:05d}.parquet", root / SHARD_RECORDS / f"{rank:05d}.json"]
        # its exclusions too: a redo that excludes nothing writes no file, and an earlier attempt's rows
        # (of an input since replaced) were counted as read and excluded
        own += [*shards.glob(f"{rank:05d}_*"), *(root / EXCLUDED_DIR).glob(f"{rank:05d}_*")]
        # every attempt's spill (each has a name of its own, _build): a killed one's stays behind
        spills = [shards / f"{SPILL_PREFIX}{rank:05d}.tmp", *shards.glob(f"{SPILL_PREFIX}{rank:05d}-*.tmp")]
        for path in [*own, *spills]:
            with contextlib.suppress(OSError):
                path.unlink()

    def _build(self, data: DocumentsPipeline, rank: int, decisions: str | None) -> None:
        encoder = DocumentEncoder(self.tokenizer.load(), self.policy, source=self.tokenizer.source)
        dtype = dtype_for_vocab(encoder.vocab_size)
        progress = self.progress
        uploader = TaskUploader(self.upload, rank, decisions) if self.upload is not None else None
        root = self._root(rank)
        self._remove_own_output(rank)
        shards = os.path.join(root, SHARDS_DIR)
        os.makedirs(shards, exist_ok=True)
        # A name of this attempt's own: two copies of a task at once (a Slurm chain submitted twice) shared
        # one, truncated each other's and one died reading an empty map (trial RV70c 1).
        spill_path = os.path.join(
            shards, f"{SPILL_PREFIX}{rank:05d}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        )
        # Per document: where its ids and its metadata JSON sit in the spill file.
        ids_off: list[int] = []
        ids_len: list[int] = []
        meta_len: list[int] = []
        provenance: list[dict[str, Any]] = []  # its manifest's provenance columns
        pos = 0
        tokens = 0
        # A text the tokenizer encodes to no token (one its normalizer deletes whole: soft hyphens,
        # zero-width spaces, control characters) would be a document of the separator alone: two
        # separators back to back in the stream. Excluded, with its reason, like the filters' drops;
        # so is one holding the unknown token (below).
        no_tokens = ExcludedWriter(self.output, FILTER_NAME, per_task=self.upload is not None)
        # Read back through the handle that wrote it, not by its name: a copy of this task started
        # beside it removes every attempt's spill of the task, this one's too.
        with open(spill_path, "w+b", buffering=1 << 20) as spill:
            with no_tokens:
                unk_id = encoder.unk_id

                def encode(batch: list) -> None:
                    nonlocal pos, tokens
                    with self.track_time("batch"):
                        encoded = encoder.encode_batch([d.text for d in batch])
                    docs_before, tokens_before = len(ids_off), tokens
                    for doc, ids in zip(batch, encoded):
                        if len(ids) == 1:  # the separator alone
                            drop(
                                doc,
                                FILTER_NAME,
                                "the text encodes to no token (the tokenizer deletes all of it)",
                            )
                            no_tokens.write(doc, rank)
                            self.stat_update("no_tokens")
                            continue
                        unknown = 0 if unk_id is None else int(np.count_nonzero(ids == unk_id))
                        if unknown:
                            # its ids decode to other text: trained on, the model learns the unknown
                            # token where the text had characters, and the build said OK (trial RV72b F1)
                            drop(doc, FILTER_NAME, _unknown_reason(unknown, len(ids) - 1, encoder.unk))
                            no_tokens.write(doc, rank)
                            self.stat_update("unknown_tokens")
                            continue
                        data_bytes = ids.astype(dtype, copy=False).tobytes()
                        m = doc.metadata
                        meta = {k: m[k] for k in META_KEYS if m.get(k) is not None}
                        meta["id"] = doc.id
                        meta_bytes = json.dumps(meta, ensure_ascii=False).encode()  # spilled beside the ids
                        provenance.append(
                            {
                                SOURCE_FILE: m.get(SOURCE_FILE),
                                SOURCE_ROW: m.get(SOURCE_ROW),
                                TEXT_HASH: text_hash_hex(doc.text),
                            }
                        )
                        spill.write(data_bytes)
                        spill.write(meta_bytes)
                        ids_off.append(pos)
                        ids_len.append(len(data_bytes))
                        meta_len.append(len(meta_bytes))
                        pos += len(data_bytes) + len(meta_bytes)
                        tokens += len(ids)
                    kept = len(ids_off) - docs_before
                    self.stat_update("documents", value=kept)
                    self.stat_update("tokens", value=tokens - tokens_before)
                    if progress:
                        progress.kept += kept
                        progress.tokens = tokens
                        progress.tick()

                batch: list = []
                chars = 0
                for doc in data:
                    batch.append(doc)
                    chars += len(doc.text)
                    if chars >= self.batch_chars:
                        encode(batch)
                        batch, chars = [], 0
                if batch:
                    encode(batch)

            n = len(ids_off)
            if progress:
                progress.phase = "writing shards"
                progress.flush()
            need = pos + n * TAR_OVERHEAD_PER_DOC
            if uploader is not None and n:  # each shard is deleted once uploaded: one at a time on disk
                need = min(need, self.target_bytes + SAMPLE_DOCS * (max(ids_len) + TAR_OVERHEAD_PER_DOC))
            check_free_space(root, need, self.min_free_gb, f"write the shards of task {rank}")
            order = np.random.default_rng([self.seed, rank]).permutation(n) if self.shuffle else np.arange(n)

            def upload_shard(path: Path, rows: list[dict[str, Any]]) -> None:
                assert uploader is not None
                info = (encoder.vocab_size, dtype_name(encoder.vocab_size), encoder.separator_info())
                uploader.shard(path, rows, writer.written[path.name], *info)

            writer = ShardWriter(
                root,
                rank,
                encoder.vocab_size,
                target_bytes=self.target_bytes,
                on_shard=upload_shard if uploader is not None else None,
            )
            spill.flush()
            spilled = mmap.mmap(spill.fileno(), 0, access=mmap.ACCESS_READ) if pos else None
            try:
                for i, j in enumerate(order):
                    a, b = ids_off[j], ids_off[j] + ids_len[j]
                    # A copy, not a view of the map: a frame kept alive by an exception caught deeper
                    # down (a retried request) would keep a view, and the map could not be closed.
                    ids = np.frombuffer(spilled[a:b], dtype)
                    meta_bytes = spilled[b : b + meta_len[j]]
                    writer.add(doc_key(rank, i), ids, json.loads(meta_bytes), provenance[j])
            finally:
                if spilled is not None:
                    spilled.close()
            writer.close()
        with contextlib.suppress(FileNotFoundError):  # removed by a copy of this task started later
            os.remove(spill_path)
        if uploader is not None:
            self._upload_rest(uploader, root)
        else:
            # What this task wrote, recorded before datatrove marks it complete: finalize checks the
            # shards against it, so one damaged later is caught even when dataset.json is rewritten.
            record = Path(self.output) / SHARD_RECORDS / f"{rank:05d}.json"
            record.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(record, json.dumps(writer.written, indent=1, sort_keys=True))
        if progress:
            progress.phase = "done"
            progress.flush()

    def _upload_rest(self, uploader: TaskUploader, root: Path) -> None:
        """After the shards: the task's manifest part, its excluded parts (the filters closed them when
        this step consumed its input), its stats, then its record; its local files go."""
        if self.progress:
            self.progress.phase = "uploading"
            self.progress.flush()
        rank = uploader.rank
        files = [
            root / MANIFEST_DIR / f"{rank:05d}.parquet",
            *sorted((root / EXCLUDED_DIR).glob(f"{rank:05d}_*.parquet")),
        ]
        for path in files:
            uploader.put(path, f"{path.parent.name}/{path.name}")
        uploader.put_stats(PipelineStats([*self.stats_of, self]).to_json().encode())
        uploader.commit()
        shutil.rmtree(root)
        logger.info(
            f"task {rank}: {len(uploader.objects)} objects in {uploader.spec.url}, "
            f"{uploader.uploaded} uploaded now"
        )
