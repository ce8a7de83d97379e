"""The sample order: which tokens form window w of epoch e, as a pure function of the index.

Inputs are the split's block totals (the build's sample totals, less the held-out rows'), the seed
and the epoch, and a group's document lengths as the windows reach them; no tar is read
here, so a benchmark can plan a 1.5B-document corpus from a lengths array alone.

The order is a hierarchical shuffle that never materialises a per-document permutation:

1. The training split's blocks are the build's samples (SAMPLE_DOCS consecutive documents of a
   shard) without their held-out documents; the held-out split's are its documents `BLOCK_DOCS`
   at a time.
2. The blocks are permuted (per seed and epoch) and the permuted blocks grouped `GROUP_BLOCKS` at
   a time. Only per-block and per-group token totals are kept: O(blocks) memory.
3. Inside a group the documents are permuted again, lazily, when a window first needs the group;
   their lengths are read as the windows reach them (a bucket's fetch the samples they lie in).

A group holds 262,144 documents drawn from 4,096 random places in the corpus, so a global batch
(~1,000 documents) mixes sources as a full shuffle would, while the plan costs a few bytes per
*block*. Every permutation is an argsort of splitmix64 hashes (a bijection, so no ties): the order
depends on neither numpy's random streams nor its version.

The permuted documents are concatenated into one token stream per epoch and cut into windows of
`seq_len + 1` tokens: window w is stream tokens [w·(seq_len+1), (w+1)·(seq_len+1)). Windows do
not overlap, so every token is used at most once per epoch.

A split's block table and each epoch's plan are the same in every rank and worker:
`DocBlocks.shared` and `EpochOrder.shared` key them by everything they depend on (dataset
fingerprint, split, val_fraction, block and group sizes, seed, epoch) and compute them once per
node (training/data/cache.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from training.contract.dataset_format import DatasetError, sample_starts, sample_totals
from training.contract.heldout import heldout_rows, mix64, mix64_inplace
from training.data import cache as order_cache

BLOCK_DOCS = 64  # the held-out split's blocks (the training split's are the build's samples)
GROUP_BLOCKS = 4096

_M64 = (1 << 64) - 1
_GAMMA_INT = 0x9E3779B97F4A7C15


def plan_version(block_docs: int = BLOCK_DOCS, group_blocks: int = GROUP_BLOCKS) -> str:
    """Names the ordering algorithm: /2 took the training split's blocks from the build's samples (/1
    cut them from the training documents, so they depended on val_fraction and needed every length)."""
    return f"splitmix64-samples/2 block_docs={block_docs} group_blocks={group_blocks}"


def derive_key(*parts: int) -> np.uint64:
    """One 64-bit key from a tuple of integers (seed, epoch, level, group …): splitmix64's
    finaliser (as mix64) over (key + γ) ^ part, in Python integers (a mixture derives one per step)."""
    h = 0
    for p in parts:
        x = ((h + _GAMMA_INT) & _M64) ^ (int(p) & _M64)
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
        h = x ^ (x >> 31)
    return np.uint64(h)


def hashed_order(n: int, key: np.uint64, dtype: type = np.int64, low_bits: int | None = None) -> np.ndarray:
    """A permutation of range(n): argsort of mix64(i ^ key). Keys are distinct, so it is unique.

    Computed as a plain sort of (high hash bits | i), 4x faster than argsort at 23M blocks and
    without argsort's int64 result: runs of equal high bits (a few hundred at 1.5B documents) are
    then put in full-hash order, so the result is exactly the argsort. (`low_bits`, more than the
    index needs, makes such runs common: for the test of that repair.)
    """
    bits = max(1, (n - 1).bit_length(), low_bits or 0)
    keys = np.arange(n, dtype=np.uint64)
    keys ^= key
    mix64_inplace(keys, np.empty_like(keys))
    low = np.uint64((1 << bits) - 1)
    keys &= ~low
    keys |= np.arange(n, dtype=np.uint64)
    keys.sort()
    order = (keys & low).astype(dtype)
    for lo in range(0, max(n - 1, 0), 1 << 22):  # adjacent equal high bits, in bounded chunks
        a, b = keys[lo : lo + (1 << 22)], keys[lo + 1 : lo + 1 + (1 << 22)]
        for i in np.flatnonzero((a[: len(b)] ^ b) <= low).tolist():
            j = lo + i
            if j > 0 and (keys[j - 1] ^ keys[j]) <= low:
                continue  # inside a run already fixed from its start
            end = j + 1
            while end + 1 < n and (keys[end] ^ keys[end + 1]) <= low:
                end += 1
            run = order[j : end + 1].astype(np.uint64)
            order[j : end + 1] = run[np.argsort(mix64(run ^ key))]
    del keys
    return order


def heldout_mask(first_row: int, n: int, val_fraction: float) -> np.ndarray:
    """Which of manifest rows [first_row, first_row+n) are held out for validation
    (training/contract/heldout.py: a fixed, seed-independent subset of about `val_fraction`)."""
    return heldout_rows(np.arange(first_row, first_row + n, dtype=np.uint64), val_fraction)


class DocBlocks:
    """One split's documents cut into the blocks the epoch order moves around.

    The training split's block k is sample k of the build (SAMPLE_DOCS consecutive rows of one shard,
    dataset_format.sample_starts) without its held-out rows; the held-out split's blocks are its own
    rows, `block_docs` at a time, in row order. So a training block's token total is the sample's total
    less its held-out rows' tokens: what planning needs is the index's sample totals and the held-out
    rows (a prefix of heldout.bin), never a per-document array of the corpus, and a training block is
    one byte range of its shard (a bucket's cache unit, training/data/block_cache.py).

    `rows(blocks)` gives the manifest rows of the given blocks' documents, block by block;
    `row_lengths(rows)` their token counts: the held-out split keeps its rows' own, the training split
    reads `lengths` (set by the table's owner: the index in place, or a bucket's cached blocks).

    `shared` opens the table of a named dataset through the node's cache; its `cache_key` (None
    for a table built directly) is what the table and the epoch plans over it depend on.
    """

    cache_key: dict[str, Any] | None = None
    lengths: Any = None  # per manifest row: lengths[rows] → their tokens (the training split's)

    def __init__(
        self,
        sample_first: np.ndarray,
        sample_tokens: np.ndarray,
        held_rows: np.ndarray,
        held_tokens: np.ndarray,
        *,
        split: str = "train",
        val_fraction: float = 0.0,
        block_docs: int = BLOCK_DOCS,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} is not train or val")
        self.split, self.val_fraction, self.block_docs = split, val_fraction, block_docs
        sample_first = np.asarray(sample_first, np.int64)
        sample_tokens = np.asarray(sample_tokens, np.int64)
        held_rows, held_tokens = np.asarray(held_rows, np.int64), np.asarray(held_tokens, np.int64)
        self.n_rows = int(sample_first[-1])
        # Over every row, both splits: checked against dataset.json.
        self.total_tokens = int(sample_tokens.sum())
        self._val_rows = self._val_lengths = self._sample_first = self._doc_start = None
        if split == "val":
            self._val_rows, self._val_lengths, self.n = held_rows, held_tokens, len(held_rows)
            pad = np.zeros(-(-self.n // block_docs) * block_docs, np.int64)
            pad[: self.n] = held_tokens
            self.block_tokens = _narrow(pad.reshape(-1, block_docs).sum(1))
        else:
            sample = np.searchsorted(sample_first, held_rows, side="right") - 1
            nsamples = len(sample_tokens)
            held_in = np.bincount(sample, minlength=nsamples)
            held_tok = np.zeros(nsamples, np.int64)
            np.add.at(held_tok, sample, held_tokens)
            kept = np.diff(sample_first) - held_in
            self._sample_first = sample_first
            self._doc_start = np.r_[0, np.cumsum(kept)]  # the split's first document of each block
            self.n = int(self._doc_start[-1])
            self.block_tokens = _narrow(sample_tokens - held_tok)
        self.tokens = int(self.block_tokens.sum(dtype=np.int64))

    @classmethod
    def of_index(cls, index: Any, *, split: str, val_fraction: float, block_docs: int) -> DocBlocks:
        """The table of a dataset's index (training/contract/dataset_index.DocIndex): its samples and
        the rows held out at `val_fraction`."""
        held = index.heldout(val_fraction) if val_fraction > 0 else (np.zeros(0, np.int64),) * 2
        return cls(
            index.sample_first, index.sample_tokens, *held,
            split=split, val_fraction=val_fraction, block_docs=block_docs,
        )  # fmt: skip

    @classmethod
    def of_lengths(
        cls, lengths: np.ndarray, shard_rows: np.ndarray | None = None, *, split: str = "train",
        val_fraction: float = 0.0, block_docs: int = BLOCK_DOCS,
    ) -> DocBlocks:  # fmt: skip
        """The table of rows with token counts `lengths` in shards of `shard_rows` (one shard when
        None), computed here in memory: for benchmarks and tests that plan without a dataset."""
        lengths = np.asarray(lengths, np.int64)
        shard_rows = np.array([0, len(lengths)]) if shard_rows is None else shard_rows
        first, totals = sample_starts(shard_rows), sample_totals(lengths, shard_rows)
        held = np.flatnonzero(heldout_mask(0, len(lengths), val_fraction)) if val_fraction > 0 else []
        held = np.asarray(held, np.int64)
        blocks = cls(first, totals, held, lengths[held], split=split, val_fraction=val_fraction,
                     block_docs=block_docs)  # fmt: skip
        blocks.lengths = lengths
        return blocks

    @classmethod
    def shared(
        cls, index: Any, *, fingerprint: str, split: str, val_fraction: float, block_docs: int
    ) -> DocBlocks:
        """The table of split `split` of the dataset with `fingerprint` (whose index is `index`),
        computed once per node and memory-mapped by its other processes (training/data/cache.py)."""
        args = dict(split=split, val_fraction=val_fraction, block_docs=block_docs)
        # Everything the split's tables depend on; the epoch plan's key adds seed, epoch, group size.
        key = {"fingerprint": fingerprint, **args}
        blocks = order_cache.shared(
            "blocks",
            {**key, "plan": plan_version(block_docs)},
            lambda: cls.of_index(index, **args),
            cls.save,
            lambda path: cls.load(path, index.n_rows, **args),
            docs=index.n_rows,
        )
        blocks.cache_key = key
        return blocks

    # -- a computed table is the same for every rank: saved once, memory-mapped by the others --
    _ARRAYS = ("block_tokens", "_sample_first", "_doc_start", "_val_rows", "_val_lengths")
    _META = ("split", "val_fraction", "block_docs", "n_rows", "n", "tokens", "total_tokens")

    def save(self, path: Path) -> None:
        """Write the table into the (new, empty) directory `path`."""
        for name in self._ARRAYS:
            if getattr(self, name) is not None:
                np.save(path / f"{name}.npy", getattr(self, name))
        (path / "meta.json").write_text(json.dumps({k: getattr(self, k) for k in self._META}))

    @classmethod
    def load(cls, path: Path, n_rows: int, split: str, val_fraction: float, block_docs: int) -> DocBlocks:
        """A saved table, its arrays memory-mapped; ValueError/OSError if it does not fit."""
        meta = json.loads((path / "meta.json").read_text())
        want = {"split": split, "val_fraction": val_fraction, "block_docs": block_docs, "n_rows": n_rows}
        if any(meta.get(k) != v for k, v in want.items()):
            raise ValueError(f"{path} was computed for {meta}, not {want}")
        self = cls.__new__(cls)
        self.__dict__.update(meta)
        for name in cls._ARRAYS:
            f = path / f"{name}.npy"
            setattr(self, name, np.load(f, mmap_mode="r") if f.is_file() else None)
        # Exactly the arrays this split needs, of the right lengths: a missing array would otherwise
        # read as another split's table.
        nblocks = len(self.block_tokens)
        train = split == "train"
        need = {
            "_sample_first": nblocks + 1 if train else None,
            "_doc_start": nblocks + 1 if train else None,
            "_val_rows": None if train else self.n,
            "_val_lengths": None if train else self.n,
        }
        for name, length in need.items():
            arr = getattr(self, name)
            if (arr is None) != (length is None) or (arr is not None and len(arr) != length):
                raise ValueError(f"{path}: {name} missing, unexpected or of the wrong length")
        if int(np.asarray(self.block_tokens).sum(dtype=np.int64)) != self.tokens:
            raise ValueError(f"{path}: block totals do not add up to the split's {self.tokens} tokens")
        return self

    # Pickled for spawn/forkserver workers: the owner re-points `lengths`; arrays loaded from the
    # cache travel as their .npy paths, not as copies.
    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__}
        state.pop("lengths", None)
        for name in self._ARRAYS:
            if isinstance(state[name], np.memmap):
                state[name] = ("npy", state[name].filename)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in self._ARRAYS:
            if isinstance(state[name], tuple):
                state[name] = np.load(state[name][1], mmap_mode="r")
        self.__dict__.update(state)

    def same_as_plan_1(self) -> bool:
        """Whether the order of plan /1 (training blocks of BLOCK_DOCS consecutive training documents)
        had the same blocks: the held-out split's are unchanged; the training split's are where nothing
        is held out and every sample starts at a multiple of 64 rows."""
        if self._val_rows is not None:
            return True
        return self.val_fraction == 0 and not (np.asarray(self._sample_first[:-1]) % 64).any()

    def rows(self, blocks: np.ndarray) -> np.ndarray:
        """Manifest rows of the documents of `blocks`, block after block, each in manifest order."""
        blocks = np.asarray(blocks, np.int64)
        if self._val_rows is not None:  # the held-out split: its own list, block_docs at a time
            docs = (blocks[:, None] * self.block_docs + np.arange(self.block_docs)).ravel()
            return self._val_rows[docs[docs < self.n]]
        # Block b is sample b's rows [first[b], first[b+1]) less the held-out ones.
        first = self._sample_first[blocks].astype(np.int64)
        spans = self._sample_first[blocks + 1].astype(np.int64) - first
        cand = np.arange(int(spans.sum()), dtype=np.int64) + np.repeat(
            first - (np.cumsum(spans) - spans), spans
        )
        return cand[~heldout_rows(cand, self.val_fraction)] if self.val_fraction > 0 else cand

    def docs_in(self, blocks: np.ndarray) -> np.ndarray:
        """How many documents each of `blocks` holds (what `rows(blocks)` gives, block by block)."""
        blocks = np.asarray(blocks, np.int64)
        if self._val_rows is not None:
            return np.minimum(self.block_docs, self.n - blocks * self.block_docs)
        return np.asarray(self._doc_start[blocks + 1], np.int64) - np.asarray(
            self._doc_start[blocks], np.int64
        )

    def row_lengths(self, rows: np.ndarray) -> np.ndarray:
        """Token counts of manifest rows `rows` (each a row of this split), int64."""
        if self._val_rows is not None:
            return np.asarray(self._val_lengths)[self.val_docs(rows)].astype(np.int64)
        return np.asarray(self.lengths[np.asarray(rows, np.int64)], np.int64)

    def val_docs(self, rows: np.ndarray) -> np.ndarray:
        """The held-out split's document numbers of manifest rows `rows` (each a row of this split)."""
        if self._val_rows is None:
            raise ValueError("val_docs is the held-out split's")
        return np.searchsorted(self._val_rows, np.asarray(rows, np.int64))

    def block_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The blocks holding manifest rows `rows` (each a row of this split)."""
        rows = np.asarray(rows, np.int64)
        if self._val_rows is not None:
            return np.searchsorted(self._val_rows, rows) // self.block_docs
        return np.searchsorted(self._sample_first, rows, side="right") - 1

    def doc_rows(self, docs: np.ndarray) -> np.ndarray:
        """Manifest rows of split documents `docs` (indices in the split's manifest order)."""
        docs = np.asarray(docs, np.int64)
        if self._val_rows is not None:
            return self._val_rows[docs]
        blocks = np.searchsorted(self._doc_start, docs, side="right") - 1
        out = np.empty(len(docs), np.int64)
        for b in np.unique(blocks).tolist():
            sel = blocks == b
            out[sel] = self.rows(np.array([b]))[docs[sel] - int(self._doc_start[b])]
        return out


def _narrow(a: np.ndarray) -> np.ndarray:
    """int64 totals as uint32 when they fit: half the memory for the per-block table."""
    return a.astype(np.uint32) if len(a) == 0 or int(a.max()) < 1 << 32 else a


class _Group:
    """One epoch group of a split's stream: its documents in stream order (a permutation of its
    blocks' documents, which needs no length) and the cumulative token counts of the first `known` of
    them, extended as the steps reach them (EpochOrder.planned). A bucket's lengths are its samples'
    records, and reading one fetches its sample whole (training/data/block_cache.py): so a group's plan
    reads the samples its next steps' documents lie in, not the group, and a run's first step fetches
    what it reads whatever the dataset's size (a whole group was ~0.9 GB at FineWeb-Edu's lengths, and
    a dataset smaller than a group was fetched whole). A local index's lengths are at hand: read at
    once, as before. Either way each block's lengths are checked against the index's total for it
    before any of its documents is cut (a block with no document of the split, when the group is made:
    its total must be 0). 16 bytes a document once the group is known whole; 24 until then."""

    def __init__(self, table: DocBlocks, blocks: np.ndarray, key: np.uint64, g: int):
        self.table, self.blocks, self.g = table, blocks, g
        per = table.docs_in(blocks)
        self.first = np.zeros(len(per) + 1, np.int64)  # each block's first document in `rows` order
        np.cumsum(per, out=self.first[1:])
        n = int(self.first[-1])
        totals = np.asarray(table.block_tokens, np.int64)[blocks]
        self._check(np.flatnonzero(per == 0), np.zeros(int((per == 0).sum()), np.int64))
        rows = table.rows(blocks)
        order = hashed_order(n, key)
        self.docs = rows[order]
        # Before `known`, the cumulative counts; after it, each loaded document's own length (0 where
        # its block is not loaded yet): extend() sums them in place.
        self.cum = np.zeros(n + 1, np.int64)
        self.known = 0
        self.mean = max(1.0, int(totals.sum()) / max(n, 1))
        if table.split == "train" and getattr(table.lengths, "fetched", False):
            self.doc_block = np.repeat(np.arange(len(blocks), dtype=np.int32), per)[order]
            self.stream_at = np.empty(n, np.int32 if n < 1 << 31 else np.int64)  # rows order → stream
            self.stream_at[order] = np.arange(n, dtype=self.stream_at.dtype)
            self.loaded = per == 0
        else:  # at hand: the whole group now, without the by-need arrays
            lengths = table.row_lengths(rows)
            self._check(np.arange(len(blocks)), self._sums(lengths, per))
            np.cumsum(lengths[order], out=self.cum[1:])
            self.known = n

    def extend(self, upto: int) -> None:
        """Know the cumulative counts further, towards group token `upto`: the lengths of the blocks the
        next documents lie in are read (about a quarter more documents than `upto` needs at the group's
        mean length, so a step's plan is one read of a bucket's samples, rarely two), then counted
        through every document whose block's lengths are known."""
        n, k = len(self.docs), self.known
        span = min(n - k, int((upto - int(self.cum[k])) / self.mean * 1.25) + 4)
        want = np.unique(self.doc_block[k : k + span])
        want = want[~self.loaded[want]]
        if len(want):
            self._load(want)
        ahead = self.loaded[self.doc_block[k : k + max(span, 8 * span + 1024)]]
        stop = len(ahead) if ahead.all() else int(np.argmin(ahead))
        counted = self.cum[k + 1 : k + stop + 1]
        np.cumsum(counted, out=counted)
        counted += self.cum[k]
        self.known = k + stop
        if self.known == n:  # known whole: the by-need arrays go
            del self.doc_block, self.stream_at, self.loaded

    def _load(self, want: np.ndarray) -> None:
        """Read the lengths of blocks `want` (places in the group) at once, each checked against the
        index's total for it, into their documents' places after `known`."""
        counts = self.first[want + 1] - self.first[want]
        at = np.repeat(self.first[want] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        places = self.stream_at[at]
        lengths = self.table.row_lengths(self.docs[places])
        self._check(want, self._sums(lengths, counts))
        self.cum[places + 1] = lengths
        self.loaded[want] = True

    @staticmethod
    def _sums(lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Per block, the sum of its `counts` lengths (the blocks' lengths back to back in `lengths`)."""
        running = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=running[1:])
        ends = np.cumsum(counts)
        return running[ends] - running[ends - counts]

    def _check(self, places: np.ndarray, sums: np.ndarray) -> None:
        """Refuse blocks (`places` in the group) whose documents' lengths (`sums`) are not the index's
        totals for them."""
        want = np.asarray(self.table.block_tokens, np.int64)[self.blocks[places]]
        bad = np.flatnonzero(sums != want)
        if len(bad):
            b = int(bad[0])
            what = "sample" if self.table.split == "train" else "held-out block"
            raise DatasetError(
                f"epoch group {self.g}: {what} {int(self.blocks[places[b]])}'s documents hold "
                f"{int(sums[b])} tokens but the index's sample totals say {int(want[b])}: the dataset's "
                "index does not match its shards; run `gristmill data validate`"
            )


class EpochOrder:
    """The token stream of one epoch of `seed` over a split's document blocks.

    `segments(a, b)` names the document pieces (by manifest row) that make stream tokens [a, b).
    Memory: 4 bytes per block for the block order, a few per group, and the two groups last used.
    """

    def __init__(self, blocks: DocBlocks, seed: int, epoch: int, group_blocks: int = GROUP_BLOCKS):
        nblocks = len(blocks.block_tokens)
        if nblocks == 0:
            raise ValueError("cannot plan an epoch over zero documents")
        self.blocks = blocks
        self.seed, self.epoch = seed, epoch
        self.group_blocks = group_blocks
        self.block_order = hashed_order(
            nblocks, derive_key(seed, epoch, 0), np.uint32 if nblocks < 1 << 32 else np.int64
        )
        ngroups = -(-nblocks // group_blocks)
        group_tokens = np.zeros(ngroups, np.int64)
        per = max(1, (1 << 22) // group_blocks)  # groups summed per step: bounded scratch memory
        for g in range(0, ngroups, per):
            sel = blocks.block_tokens[self.block_order[g * group_blocks : (g + per) * group_blocks]]
            group_tokens[g : g + per] = np.add.reduceat(
                sel.astype(np.int64), np.arange(0, len(sel), group_blocks)
            )
        self.group_start = np.zeros(ngroups + 1, np.int64)
        np.cumsum(group_tokens, out=self.group_start[1:])
        self.tokens = int(self.group_start[-1])
        self._groups: dict[int, _Group] = {}  # extended in place: an order is one thread's (below)

    @classmethod
    def shared(cls, blocks: DocBlocks, seed: int, epoch: int, group_blocks: int) -> EpochOrder:
        """The plan of `epoch`, the same in every rank and worker: computed once per node and
        memory-mapped by the node's other processes (training/data/cache.py). A block table of
        no named dataset (`blocks.cache_key` None) is planned here, unshared."""
        if blocks.cache_key is None:
            return cls(blocks, seed, epoch, group_blocks)
        return order_cache.shared(
            "plan",
            {
                **blocks.cache_key,
                "seed": seed,
                "epoch": epoch,
                "plan": plan_version(blocks.block_docs, group_blocks),
            },
            lambda: cls(blocks, seed, epoch, group_blocks),
            cls.save,
            lambda path: cls.load(path, blocks, seed, epoch, group_blocks),
            docs=blocks.n_rows,
        )

    def save(self, path: Path) -> None:
        """Write the block order and group totals into the (new, empty) directory `path`."""
        np.save(path / "block_order.npy", self.block_order)
        np.save(path / "group_start.npy", self.group_start)

    @classmethod
    def load(cls, path: Path, blocks: DocBlocks, seed: int, epoch: int, group_blocks: int) -> EpochOrder:
        """A saved plan, memory-mapped; ValueError if it does not fit `blocks`."""
        self = cls.__new__(cls)
        self.blocks = blocks
        self.seed, self.epoch, self.group_blocks = seed, epoch, group_blocks
        self.block_order = np.load(path / "block_order.npy", mmap_mode="r")
        self.group_start = np.load(path / "group_start.npy", mmap_mode="r")
        nblocks = len(blocks.block_tokens)
        if len(self.block_order) != nblocks or len(self.group_start) != -(-nblocks // group_blocks) + 1:
            raise ValueError(f"{path}: a plan for another block table")
        self.tokens = int(self.group_start[-1])
        if self.tokens != blocks.tokens:
            raise ValueError(f"{path}: plan of {self.tokens} tokens, the split has {blocks.tokens}")
        self._groups = {}
        return self

    # An order is one thread's: its groups are extended in place, unlocked (a lock held across a
    # bucket's fetch, in an order a DataLoader worker forked with, would hang the worker). Every
    # builder, node view and worker plans with orders of its own (BatchBuilder.order, __getstate__).
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_groups": {}}

    def group(self, g: int) -> _Group:
        """Group g's documents (manifest rows) in stream order; their lengths are read as `planned`
        needs them."""
        hit = self._groups.get(g)
        if hit is not None:
            return hit
        gb = self.group_blocks
        blocks = np.asarray(self.block_order[g * gb : (g + 1) * gb], np.int64)
        hit = _Group(self.blocks, blocks, derive_key(self.seed, self.epoch, 1, g), g)
        if len(self._groups) >= 2:  # a worker walks the stream forward: keep current and next
            self._groups.pop(next(iter(self._groups)))
        self._groups[g] = hit
        return hit

    def planned(self, g: int, upto: int) -> tuple[np.ndarray, np.ndarray]:
        """Group g's documents in stream order, and the cumulative token counts of its first documents,
        as far as covers its stream tokens [0, upto) at least (the whole group where its lengths are at
        hand: a local index)."""
        grp = self.group(g)
        while grp.cum[grp.known] < upto and grp.known < len(grp.docs):
            grp.extend(upto)
        if grp.cum[grp.known] < upto:  # every block checked, so only an upto past the group's tokens
            raise ValueError(f"group {g} holds {int(grp.cum[grp.known])} tokens, not {upto}")
        return grp.docs, grp.cum[: grp.known + 1]

    def segments(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stream tokens [a, b) as (document, first token in it, token count) pieces, in order."""
        if not 0 <= a <= b <= self.tokens:
            raise ValueError(f"token range [{a}, {b}) is outside the epoch's {self.tokens} tokens")
        docs_out, starts_out, counts_out = [], [], []
        while a < b:
            g = int(np.searchsorted(self.group_start, a, side="right")) - 1
            base = int(self.group_start[g])
            lo, hi = a - base, min(b, int(self.group_start[g + 1])) - base
            docs, cum = self.planned(g, hi)
            i = int(np.searchsorted(cum, lo, side="right")) - 1  # cum[i] <= lo < cum[i+1]
            j = int(np.searchsorted(cum, hi, side="left"))  # cum[j-1] < hi <= cum[j]
            first = cum[i:j]
            starts = np.maximum(lo - first, 0)
            docs_out.append(docs[i:j])
            starts_out.append(starts)
            counts_out.append(np.minimum(cum[i + 1 : j + 1], hi) - first - starts)
            a = base + hi
        if not docs_out:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return np.concatenate(docs_out), np.concatenate(starts_out), np.concatenate(counts_out)

    def segments_many(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        """`segments(a[q], b[q])` for every range q, concatenated in q order, plus each piece's q.

        Vectorised over the ranges that lie inside one group (nearly all: a group holds ~17M
        tokens at FineWeb-Edu scale), so a step of a mixture, whose windows of one source are
        scattered over the batch, costs a few array operations, not one call per window.
        """
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        if len(a) and (a.min() < 0 or (b < a).any() or b.max() > self.tokens):
            raise ValueError(f"token ranges outside the epoch's {self.tokens} tokens")
        ga = np.searchsorted(self.group_start, a, side="right") - 1
        gb = np.searchsorted(self.group_start, np.maximum(b - 1, a), side="right") - 1
        if len(a) and ga[0] == gb[-1] and ga[-1] == gb[0] and (ga == ga[0]).all() and (gb == ga[0]).all():
            return self._in_group(int(ga[0]), a, b, np.arange(len(a)))  # the common case: one group
        parts: list[tuple[np.ndarray, ...]] = []
        for q in np.flatnonzero(ga != gb).tolist():  # a range across a group boundary: rare
            d, s, c = self.segments(int(a[q]), int(b[q]))
            parts.append((d, s, c, np.full(len(d), q)))
        inside = ga == gb
        for g in np.unique(ga[inside]).tolist():
            qs = np.flatnonzero(inside & (ga == g))
            parts.append(self._in_group(g, a[qs], b[qs], qs))
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, empty
        d, s, c, q = (np.concatenate(x) for x in zip(*parts))
        order = np.argsort(q, kind="stable")
        return d[order], s[order], c[order], q[order]

    def _in_group(self, g: int, a: np.ndarray, b: np.ndarray, qs: np.ndarray) -> tuple[np.ndarray, ...]:
        """segments_many for ranges [a, b) that all lie inside group g; `qs` names them."""
        base = int(self.group_start[g])
        lo, hi = a - base, b - base
        docs, cum = self.planned(g, int(hi.max()))
        i = np.searchsorted(cum, lo, side="right") - 1  # cum[i] <= lo < cum[i+1]
        j = np.searchsorted(cum, hi, side="left")  # cum[j-1] < hi <= cum[j]
        n = j - i
        idx = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n - i, n)
        first = cum[idx]
        starts = np.maximum(np.repeat(lo, n) - first, 0)
        counts = np.minimum(cum[idx + 1], np.repeat(hi, n)) - first - starts
        return docs[idx], starts, counts, np.repeat(qs, n)


def epoch_steps(tokens: int, seq_len: int, global_batch: int) -> tuple[int, int]:
    """(steps per epoch, dropped tail tokens) for an epoch stream of `tokens` tokens.

    The tail — a partial window plus fewer than `global_batch` whole windows — is dropped, so every
    step is a full global batch and every rank gets the same number of batches.
    """
    steps = tokens // (seq_len + 1) // global_batch
    return steps, tokens - steps * global_batch * (seq_len + 1)
