"""The token loader: deterministic, resumable, elastic (DESIGN.md, "The loader's guarantees").

Global step s of a run is epoch s // steps_per_epoch, global batch b = s % steps_per_epoch: windows
[b·G, (b+1)·G) of that epoch's stream (training/loader_plan.py). Rank r of N takes the contiguous
G/N windows starting at b·G + r·G/N and cuts them into micro-batches in order. A batch is built
from (plan, step, rank) alone, so:

- workers: whole steps go round-robin to DataLoader worker processes and come back in step order,
  so the stream does not depend on num_workers;
- ranks: the rank slices of a step concatenate to the world-size-1 batch, for any N dividing G;
- resume: the state is a step counter plus the parameters the order depends on. It counts steps
  handed to the consumer, not steps prefetched by workers.

Each sequence is `seq_len + 1` stream tokens: input_ids = tokens[:-1], labels = tokens[1:] (never
masked: the separator is the target of a document's last token), position_ids counting from 0 at
the sequence start and again at every document start, for document-masked attention.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import mmap
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training import loader_plan
from training.dataset_format import (
    DATASET_JSON,
    IDS_EXT,
    SHARDS_DIR,
    TOKENIZER_JSON,
    DatasetError,
    file_sha256,
    fingerprint,
    manifest_files,
    numpy_dtype,
    read_dataset_info,
)
from training.errors import GristmillError

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
MAX_OPEN_SHARDS = 256  # memory maps kept open per process (each holds a file descriptor)


class LoaderStateError(GristmillError):
    """A checkpointed loader state that does not fit this run; the message names both values."""


class LoaderConfigError(GristmillError):
    """Loader arguments that cannot work together; the message names the numbers."""


class DocumentTable:
    """One split of a dataset directory: where each document's tokens are, and reading them.

    Opening is cheap and strict. It refuses a directory that is not what its dataset.json says
    (edited fingerprint field, a shard whose size differs from the recorded one, a tokenizer.json
    with another hash, manifest totals that differ, .ids members outside their shard) or that does
    not match the caller's model (vocab size, tokenizer hash). Per document it keeps the shard
    index, the byte offset of its `.ids` member and its token count: 10 bytes.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        split: str = "train",
        val_fraction: float = 0.0,
        expect_vocab_size: int | None = None,
        expect_tokenizer_sha256: str | None = None,
    ):
        self.root = Path(root)
        self.split, self.val_fraction = split, val_fraction
        self.info = info = read_dataset_info(self.root)
        where = self.root / DATASET_JSON
        if fingerprint(info) != info["fingerprint"]:
            raise DatasetError(
                f"{where}: the recorded fingerprint {info['fingerprint'][:12]}… does not match the file's "
                f"contents ({fingerprint(info)[:12]}…): dataset.json was edited; rebuild the dataset"
            )
        if expect_vocab_size is not None and expect_vocab_size != info["vocab_size"]:
            raise DatasetError(
                f"{where}: the dataset was tokenized with vocab_size {info['vocab_size']}, but the model "
                f"expects vocab_size {expect_vocab_size}; train on a dataset built with the model's "
                "tokenizer or set the model's vocab_size to the dataset's"
            )
        if expect_tokenizer_sha256 is not None and expect_tokenizer_sha256 != info["tokenizer_sha256"]:
            raise DatasetError(
                f"{where}: the dataset was tokenized with tokenizer sha256 {info['tokenizer_sha256']}, but "
                f"the training config's tokenizer has sha256 {expect_tokenizer_sha256}; use the dataset's "
                f"tokenizer ({self.root / TOKENIZER_JSON}) or rebuild the dataset with yours"
            )
        tok = self.root / TOKENIZER_JSON
        if tok.is_file() and file_sha256(tok) != info["tokenizer_sha256"]:
            raise DatasetError(
                f"{tok} has sha256 {file_sha256(tok)}, but {where} records {info['tokenizer_sha256']}: the "
                "tokenizer was replaced after the build; restore it or rebuild the dataset"
            )
        self.dtype = numpy_dtype(info["dtype"])
        self.separator_id = int(info["separator"]["id"])
        self.vocab_size = int(info["vocab_size"])
        self.separator_position = info["separator"]["position"]
        self.shard_names = sorted(info["shard_files"])
        self._read_manifest(self._check_shard_sizes())
        self.tokens = int(self.lengths.sum(dtype=np.int64))
        self._maps: OrderedDict[int, mmap.mmap] = OrderedDict()

    def _check_shard_sizes(self) -> np.ndarray:
        """Shard sizes against dataset.json: catches a rebuilt shard under an old dataset.json."""
        sizes = np.zeros(len(self.shard_names), np.int64)
        for i, name in enumerate(self.shard_names):
            path = self.root / SHARDS_DIR / name
            recorded = self.info["shard_files"][name]["bytes"]
            if not path.is_file():
                raise DatasetError(
                    f"{path} is missing but {self.root / DATASET_JSON} lists it; rebuild the dataset"
                )
            sizes[i] = path.stat().st_size
            if sizes[i] != recorded:
                raise DatasetError(
                    f"{path} is {sizes[i]} bytes but {self.root / DATASET_JSON} records {recorded}: the "
                    "shard was rebuilt or truncated after dataset.json was written; rebuild the dataset (a "
                    "resumed run must restart, the fingerprint changes)"
                )
        return sizes

    def _read_manifest(self, shard_bytes: np.ndarray) -> None:
        files = manifest_files(self.root)
        if not files:
            raise DatasetError(f"{self.root / 'manifest'} holds no *.parquet files; rebuild the dataset")
        names = pa.array(self.shard_names, pa.string())
        shard_dtype = np.uint16 if len(self.shard_names) <= 1 << 16 else np.uint32
        offset_dtype = np.uint32 if shard_bytes.max(initial=0) < 1 << 32 else np.int64
        itemsize = self.dtype.itemsize
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        rows = tokens = 0
        for path in files:
            try:
                t = pq.read_table(path, columns=["shard", "offset", "nbytes", "n_tokens"])
            except (pa.ArrowInvalid, KeyError, OSError) as e:
                raise DatasetError(f"{path}: unreadable manifest ({e}); rebuild the dataset") from None
            shard = pc.index_in(t.column("shard"), value_set=names)
            if shard.null_count:
                bad = t.column("shard").filter(pc.is_null(shard))[0].as_py()
                raise DatasetError(f"{path} names shard {bad!r}, which dataset.json does not list; rebuild")
            shard = shard.to_numpy().astype(shard_dtype)
            offset = t.column("offset").to_numpy()
            nbytes = t.column("nbytes").to_numpy()
            ntok = t.column("n_tokens").to_numpy()
            if len(ntok) and (
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
            self._check_members(path, shard, offset, nbytes)
            tokens += int(ntok.sum())
            if self.val_fraction > 0:
                held = loader_plan.heldout_mask(rows, len(ntok), self.val_fraction)
                keep = held if self.split == "val" else ~held
                shard, offset, ntok = shard[keep], offset[keep], ntok[keep]
            rows += len(t)
            parts.append((shard, offset.astype(offset_dtype), ntok.astype(np.uint32)))
        if (rows, tokens) != (self.info.get("documents"), self.info.get("tokens")):
            raise DatasetError(
                f"{self.root}: the manifests hold {rows} documents / {tokens} tokens but dataset.json "
                f"records {self.info.get('documents')} / {self.info.get('tokens')}; rebuild the dataset"
            )
        self.doc_shard = np.concatenate([p[0] for p in parts])
        self.doc_offset = np.concatenate([p[1] for p in parts])
        self.lengths = np.concatenate([p[2] for p in parts])

    def _check_members(
        self, manifest: Path, shard: np.ndarray, offset: np.ndarray, nbytes: np.ndarray
    ) -> None:
        """Spot-check the tar header of each shard's first and last listed `.ids` member.

        Tars pad to 10 KiB records, so a rebuilt shard can keep its size; its members rarely keep
        their places too. Two 512-byte reads per shard; the sha256 of every shard is `gristmill
        data validate`'s job.
        """
        first = np.unique(shard, return_index=True)[1]
        last = len(shard) - 1 - np.unique(shard[::-1], return_index=True)[1]
        for i in np.union1d(first, last).tolist():
            path = self.root / SHARDS_DIR / self.shard_names[shard[i]]
            with open(path, "rb") as f:
                f.seek(max(int(offset[i]) - 512, 0))
                header = f.read(512)
            name = header[:100].split(b"\0")[0]
            try:
                size = int(header[124:136].strip(b"\0 "), 8)
            except ValueError:
                size = -1
            if offset[i] < 512 or not name.endswith(b"." + IDS_EXT.encode()) or size != nbytes[i]:
                raise DatasetError(
                    f"{path}: no {nbytes[i]}-byte .ids member at byte {offset[i]} where {manifest} puts one "
                    f"(the tar header there reads {name!r}, {size} bytes): the shard was rebuilt after the "
                    "manifest and dataset.json were written; rebuild the dataset"
                )

    def manifest_rows(self, docs: np.ndarray) -> np.ndarray:
        """Manifest row numbers (over all manifests, in file order) of this split's documents."""
        if self.val_fraction == 0:
            return np.asarray(docs)
        held = loader_plan.heldout_mask(0, self.info["documents"], self.val_fraction)
        return np.flatnonzero(held if self.split == "val" else ~held)[docs]

    def __getstate__(self) -> dict[str, Any]:  # memory maps are per process: reopened lazily
        return {**self.__dict__, "_maps": OrderedDict()}

    def _map(self, shard: int) -> mmap.mmap:
        m = self._maps.get(shard)
        if m is None:
            if len(self._maps) >= MAX_OPEN_SHARDS:
                self._maps.popitem(last=False)
            with open(self.root / SHARDS_DIR / self.shard_names[shard], "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[shard] = m
        else:
            self._maps.move_to_end(shard)
        return m

    def read(self, docs: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Concatenated tokens of the pieces (document, first token, count), copied out of the maps."""
        out = np.empty(int(counts.sum()), self.dtype)
        offsets = self.doc_offset[docs].astype(np.int64) + starts * self.dtype.itemsize
        pos = 0
        for shard, off, n in zip(self.doc_shard[docs].tolist(), offsets.tolist(), counts.tolist()):
            out[pos : pos + n] = np.frombuffer(self._map(shard), self.dtype, n, off)
            pos += n
        return out

    def _locate(self, doc: int) -> str:
        return (
            f"document {doc} of split {self.split!r} (shards/{self.shard_names[self.doc_shard[doc]]}, "
            f".ids at byte {int(self.doc_offset[doc])})"
        )

    def check_separators(
        self, tokens: np.ndarray, docs: np.ndarray, starts: np.ndarray, counts: np.ndarray, where: str
    ) -> None:
        """The separator id sits exactly at document ends ("after") or starts ("before"), nowhere else,
        and every id is < vocab_size (on a GPU an out-of-range id is an opaque device-side assert)."""
        first = np.cumsum(counts) - counts  # where each piece begins in `tokens`
        if len(tokens) and int(tokens.max()) >= self.vocab_size:
            i = int(np.argmax(tokens >= self.vocab_size))
            k = int(np.searchsorted(first, i, side="right")) - 1
            doc = int(docs[k])
            raise DatasetError(
                f"id check failed at {where}: {self._locate(doc)} has token {int(tokens[i])} ≥ vocab_size "
                f"{self.vocab_size}; the shard is corrupt — run `gristmill data validate {self.root}`"
            )
        if self.separator_position == "after":
            at = (first + counts - 1)[starts + counts == self.lengths[docs]]
        else:
            at = first[starts == 0]
        expected = np.zeros(len(tokens), bool)
        expected[at] = True
        bad = np.flatnonzero((tokens == self.separator_id) != expected)
        if len(bad) == 0:
            return
        i = int(bad[0])
        k = int(np.searchsorted(first, i, side="right")) - 1
        doc = int(docs[k])
        found = f"token {int(tokens[i])}" + (" (the separator)" if not expected[i] else "")
        raise DatasetError(
            f"separator check failed at {where}: {self._locate(doc)} has {found} at token "
            f"{int(starts[k]) + i - int(first[k])} of {int(self.lengths[doc])}, but the "
            f"separator policy (id {self.separator_id}, position {self.separator_position!r}) puts exactly "
            "one separator at each document's "
            f"{'end' if self.separator_position == 'after' else 'start'}; the shard is corrupt or was "
            f"built under another policy — run `gristmill data validate {self.root}`"
        )


class BatchBuilder:
    """Builds one rank's batch of any global step from scratch (picklable; used in workers)."""

    def __init__(
        self,
        docs: DocumentTable,
        *,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        seed: int,
        rank: int,
        world_size: int,
        check_separators: bool,
    ):
        self.docs = docs
        self.seq_len, self.global_batch, self.micro_batch = seq_len, global_batch, micro_batch
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.check = check_separators
        # Read when the loader is built (tests shrink them to exercise many groups).
        self.block_docs, self.group_blocks = loader_plan.BLOCK_DOCS, loader_plan.GROUP_BLOCKS
        self.steps_per_epoch, self.dropped_tail_tokens = loader_plan.epoch_steps(
            docs.tokens, seq_len, global_batch
        )
        self._plan: loader_plan.EpochPlan | None = None

    def plan(self, epoch: int) -> loader_plan.EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = None  # free the previous epoch's plan before building the next
            self._plan = loader_plan.EpochPlan(
                self.docs.lengths, self.seed, epoch, self.block_docs, self.group_blocks
            )
        return self._plan

    def segments(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This rank's token span of global step `step` as (document, first token, count) pieces."""
        epoch, batch = divmod(step, self.steps_per_epoch)
        rows = self.global_batch // self.world_size
        first_window = batch * self.global_batch + self.rank * rows
        window = self.seq_len + 1
        return self.plan(epoch).segments(first_window * window, (first_window + rows) * window)

    def batch(self, step: int) -> list[dict[str, torch.Tensor]]:
        docs, starts, counts = self.segments(step)
        tokens = self.docs.read(docs, starts, counts)
        if self.check:
            self.docs.check_separators(tokens, docs, starts, counts, where=f"step {step} rank {self.rank}")
        return micro_batches(tokens, starts, counts, self.seq_len, self.micro_batch)


def micro_batches(
    tokens: np.ndarray, starts: np.ndarray, counts: np.ndarray, seq_len: int, micro_batch: int
) -> list[dict[str, torch.Tensor]]:
    """Cut a span of whole windows into micro-batches of input_ids / labels / position_ids."""
    window = seq_len + 1
    rows = len(tokens) // window
    # Position ids restart at every row start and at every document start inside a row.
    restart = np.zeros(len(tokens), bool)
    restart[::window] = True
    restart[(np.cumsum(counts) - counts)[starts == 0]] = True
    idx = np.arange(len(tokens))
    pos = idx - np.maximum.accumulate(np.where(restart, idx, 0))
    tok = tokens.reshape(rows, window)
    inputs = torch.from_numpy(np.ascontiguousarray(tok[:, :-1], dtype=np.int64))
    labels = torch.from_numpy(np.ascontiguousarray(tok[:, 1:], dtype=np.int64))
    positions = torch.from_numpy(np.ascontiguousarray(pos.reshape(rows, window)[:, :-1]))
    return [
        {"input_ids": i, "labels": lab, "position_ids": p}
        for i, lab, p in zip(
            inputs.split(micro_batch), labels.split(micro_batch), positions.split(micro_batch)
        )
    ]


def batch_sha256(micro: list[dict[str, torch.Tensor]]) -> str:
    """sha256 of a batch: input_ids, labels, position_ids of all its rows as little-endian int64.

    Independent of how the rows are cut into micro-batches, so the hashes of a global batch and of
    the rank slices concatenated in rank order agree (`gristmill data inspect --hash`).
    """
    h = hashlib.sha256()
    for key in ("input_ids", "labels", "position_ids"):
        h.update(torch.cat([mb[key] for mb in micro]).numpy().astype("<i8", copy=False).tobytes())
    return h.hexdigest()


class _StepStream(IterableDataset):
    """Steps start, start+1, … with worker k of K building steps start+k, start+k+K, …

    DataLoader asks workers round-robin and returns results in request order, so the consumer sees
    the steps in order whatever K is.
    """

    def __init__(self, builder: BatchBuilder, start: int):
        self.builder, self.start = builder, start

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        info = get_worker_info()
        k, K = (0, 1) if info is None else (info.id, info.num_workers)
        for step in itertools.count(self.start + k, K):
            yield self.builder.batch(step)


def _positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise LoaderConfigError(f"loader {name} must be a positive integer, got {v!r}")


class TokenLoader:
    """Infinite iterator of global steps; each item is this rank's list of micro-batches.

    Stateful (state_dict / load_state_dict, plain ints and strs, so DCP can save it). Resuming with
    another num_workers, or another world_size that divides global_batch, continues bit-identically;
    a changed dataset, seq_len, seed, global_batch, split or val_fraction is a LoaderStateError.
    """

    def __init__(
        self,
        dataset_dir: str | Path,
        *,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        split: str = "train",
        val_fraction: float = 0.0,
        check_separators: bool = False,
        pin_memory: bool = False,
        expect_vocab_size: int | None = None,
        expect_tokenizer_sha256: str | None = None,
    ):
        _positive(seq_len=seq_len, global_batch=global_batch, micro_batch=micro_batch, world_size=world_size)
        if not 0 <= rank < world_size:
            raise LoaderConfigError(f"loader rank {rank} is outside [0, world_size={world_size})")
        if global_batch % (world_size * micro_batch):
            raise LoaderConfigError(
                f"global_batch {global_batch} is not divisible by world_size {world_size} × micro_batch "
                f"{micro_batch} = {world_size * micro_batch}; choose a global batch that is a multiple of it"
            )
        if num_workers < 0:
            raise LoaderConfigError(f"loader num_workers must be ≥ 0, got {num_workers}")
        if split not in SPLITS:
            raise LoaderConfigError(f"loader split {split!r} is not one of {SPLITS}")
        if not 0.0 <= val_fraction < 1.0:
            raise LoaderConfigError(f"val_fraction {val_fraction} must be in [0, 1)")
        if split == "val" and val_fraction == 0.0:
            raise LoaderConfigError(
                "split 'val' is empty with val_fraction 0; set val_fraction > 0 (e.g. 0.001)"
            )
        docs = DocumentTable(
            dataset_dir,
            split=split,
            val_fraction=val_fraction,
            expect_vocab_size=expect_vocab_size,
            expect_tokenizer_sha256=expect_tokenizer_sha256,
        )
        self.info: dict[str, Any] = docs.info
        self._builder = BatchBuilder(
            docs,
            seq_len=seq_len,
            global_batch=global_batch,
            micro_batch=micro_batch,
            seed=seed,
            rank=rank,
            world_size=world_size,
            check_separators=check_separators,
        )
        self.steps_per_epoch = self._builder.steps_per_epoch
        if self.steps_per_epoch == 0:
            raise LoaderConfigError(
                f"split {split!r} of {dataset_dir} has {docs.tokens} tokens, fewer than one global batch of "
                f"{global_batch} × (seq_len {seq_len} + 1) = {global_batch * (seq_len + 1)}; "
                + (
                    f"raise val_fraction (now {val_fraction}) or turn validation off"
                    if split == "val"
                    else "lower global_batch or seq_len, or use a bigger dataset"
                )
            )
        self.tokens_per_step = global_batch * seq_len  # tokens the model trains on per global step
        self.dropped_tail_tokens = self._builder.dropped_tail_tokens
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._identity = {
            "fingerprint": self.info["fingerprint"],
            "seed": seed,
            "seq_len": seq_len,
            "global_batch": global_batch,
            "split": split,
            "val_fraction": val_fraction,
            "plan": loader_plan.plan_version(self._builder.block_docs, self._builder.group_blocks),
        }
        self._step = 0  # global steps handed to the consumer
        self._generation = 0  # bumped by __iter__ and load_state_dict; older iterators refuse to go on
        log.info(
            "loader: split %r, %d documents, %d tokens, %d steps/epoch of %d tokens, %d tail tokens dropped "
            "per epoch",
            split,
            len(docs.lengths),
            docs.tokens,
            self.steps_per_epoch,
            self.tokens_per_step,
            self.dropped_tail_tokens,
        )

    @property
    def documents(self) -> DocumentTable:
        return self._builder.docs

    @property
    def builder(self) -> BatchBuilder:
        return self._builder

    def state_dict(self) -> dict[str, Any]:
        epoch, batch = divmod(self._step, self.steps_per_epoch)
        return {**self._identity, "epoch": epoch, "batch": batch}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        missing = [k for k in (*self._identity, "epoch", "batch") if k not in sd]
        if missing:
            raise LoaderStateError(f"loader state lacks {missing}; it was not written by this loader")
        for key, ours in self._identity.items():
            if sd[key] != ours:
                raise LoaderStateError(
                    f"the checkpoint's loader state has {key}={sd[key]!r} but this run has {key}={ours!r}; "
                    + (
                        "the dataset changed since the checkpoint (rebuilt, or another directory), so "
                        "resuming would read other tokens — point the run at the original dataset or start "
                        "a new run"
                        if key == "fingerprint"
                        else f"the sample order depends on {key}, so resuming would silently reshuffle — set "
                        f"it back to {sd[key]!r} or start a new run"
                    )
                )
        epoch, batch = int(sd["epoch"]), int(sd["batch"])
        if epoch < 0 or not 0 <= batch < self.steps_per_epoch:
            raise LoaderStateError(
                f"loader state position epoch {epoch}, batch {batch} is outside an epoch of "
                f"{self.steps_per_epoch} steps"
            )
        self._step = epoch * self.steps_per_epoch + batch
        self._generation += 1

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        self._generation += 1
        generation = self._generation
        loader = DataLoader(
            _StepStream(self._builder, self._step),
            batch_size=None,
            num_workers=self.num_workers,
            prefetch_factor=2 if self.num_workers else None,
            pin_memory=self.pin_memory and torch.cuda.is_available(),
            # An explicit generator: worker seeding must not draw from (and so shift) the global RNG.
            generator=torch.Generator(),
        )
        for item in loader:
            if generation != self._generation:
                raise RuntimeError(
                    "stale loader iterator: the loader was iterated again or load_state_dict was called "
                    "since; take a new iterator"
                )
            self._step += 1
            yield item
