"""The sample order: which tokens form window w of epoch e, as a pure function of the lengths.

Inputs are only the split's document lengths (manifest order), the seed and the epoch; no tar is
read here, so a benchmark can plan a 1.5B-document corpus from a lengths array alone.

The order is a hierarchical shuffle that never materialises a per-document permutation:

1. Documents are cut into blocks of `BLOCK_DOCS` consecutive documents (manifest order).
2. The blocks are permuted (per seed and epoch) and the permuted blocks grouped `GROUP_BLOCKS` at
   a time. Only per-block and per-group token totals are kept: O(blocks) memory.
3. Inside a group the documents are permuted again, lazily, when a window first needs the group.

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

from training.data import cache as order_cache

BLOCK_DOCS = 64
GROUP_BLOCKS = 4096

_M64 = (1 << 64) - 1
_GAMMA_INT = 0x9E3779B97F4A7C15
_GAMMA = np.uint64(_GAMMA_INT)
_VAL_SALT = 0x6772697374766C31  # "gristvl1": held-out selection is independent of the seed


def plan_version(block_docs: int = BLOCK_DOCS, group_blocks: int = GROUP_BLOCKS) -> str:
    """Names the ordering algorithm; stored in loader state so a changed algorithm is refused."""
    return f"splitmix64-blocks/1 block_docs={block_docs} group_blocks={group_blocks}"


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a bijection of uint64; wraps silently)."""
    x = np.array(x, dtype=np.uint64, ndmin=1)  # a copy; arrays (not scalars) wrap without warnings
    return _mix64_inplace(x, np.empty_like(x))


def _mix64_inplace(x: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    # In place with one scratch buffer: on cache-sized chunks this is ~3x faster than fresh arrays.
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


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
    _mix64_inplace(keys, np.empty_like(keys))
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


def _threshold(val_fraction: float) -> np.uint64:
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction {val_fraction} must be in [0, 1)")
    return np.uint64(int(val_fraction * 2.0**64))


def heldout_mask(first_row: int, n: int, val_fraction: float) -> np.ndarray:
    """Which of manifest rows [first_row, first_row+n) are held out for validation.

    Row i is held out iff mix64(i ^ salt) < val_fraction·2⁶⁴: a fixed, seed-independent subset of
    about `val_fraction` of the documents, spread evenly over the corpus.
    """
    return heldout_rows(np.arange(first_row, first_row + n, dtype=np.uint64), val_fraction)


def heldout_rows(rows: np.ndarray, val_fraction: float) -> np.ndarray:
    """heldout_mask for an arbitrary array of manifest rows."""
    x = np.array(rows, dtype=np.uint64, ndmin=1)
    return _held_inplace(x, np.empty_like(x), _threshold(val_fraction), np.empty(len(x), bool))


def _held_inplace(rows: np.ndarray, tmp: np.ndarray, threshold: np.uint64, out: np.ndarray) -> np.ndarray:
    """The held-out test on uint64 `rows`, overwriting them (and `tmp`); the mask lands in `out`."""
    rows ^= np.uint64(_VAL_SALT)
    return np.less(_mix64_inplace(rows, tmp), threshold, out=out)


SCAN_ROWS = 1 << 18  # rows per step of the split scan: its buffers stay in the CPU's L2/L3 cache


class DocBlocks:
    """One split's documents cut into blocks of `block_docs` consecutive documents (manifest order).

    `lengths` holds the token count of every manifest row (a read-only memory map of the dataset
    index, shared by all processes; or any array). Opening scans it once and keeps per *block*
    the token total and, when documents are held out, the manifest row where the block starts:
    no per-document array is made for the training split, so a 1.5B-document corpus costs a few
    hundred MB per process instead of 6 GB. The held-out split (small) keeps its row numbers.
    `rows(blocks)` gives the manifest rows of the given blocks' documents, block by block.

    `shared` opens the table of a named dataset through the node's cache; its `cache_key` (None
    for a table built directly) is what the table and the epoch plans over it depend on.
    """

    cache_key: dict[str, Any] | None = None

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        split: str = "train",
        val_fraction: float = 0.0,
        block_docs: int = BLOCK_DOCS,
    ):
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} is not train or val")
        self.lengths, self.split, self.val_fraction = lengths, split, val_fraction
        self.block_docs = block_docs
        self.n_rows = len(lengths)
        self.total_tokens = 0  # over every row, both splits: checked against dataset.json
        self._first_row: np.ndarray | None = None  # per block, train split with held-out rows
        self._val_rows: np.ndarray | None = None  # per document, the held-out split
        if val_fraction == 0.0 and split == "train":
            self._scan_all()
        else:
            self._scan_split(_threshold(val_fraction))
        self.tokens = int(self.block_tokens.sum(dtype=np.int64))

    def _scan_all(self) -> None:
        bd, n = self.block_docs, self.n_rows
        self.n = n
        self.block_tokens = np.zeros(-(-n // bd), np.int64)
        step = max(1, SCAN_ROWS // bd) * bd
        for a in range(0, n, step):
            chunk = np.asarray(self.lengths[a : a + step])
            full = len(chunk) // bd * bd
            self.block_tokens[a // bd : (a + full) // bd] = (
                chunk[:full].reshape(-1, bd).sum(1, dtype=np.int64)
            )
            if full < len(chunk):
                self.block_tokens[-1] = chunk[full:].sum(dtype=np.int64)
        self.total_tokens = int(self.block_tokens.sum())
        self.block_tokens = _narrow(self.block_tokens)

    def _scan_split(self, threshold: np.uint64) -> None:
        """One pass over all rows: the held-out mask, then per block its first row and token total.

        Per chunk the work is the hash (7 in-place passes over a cache-sized buffer) and one
        segmented sum of the lengths; the few held-out rows of the training split are handled by position
        (kept document j of a chunk sits at row j + #held rows before it), never by fancy-indexing
        all rows: this pass is most of a rank's open time at 1.5B documents.
        """
        bd, n = self.block_docs, self.n_rows
        keep_val = self.split == "val"
        row_dtype = np.uint32 if n < 1 << 32 else np.int64
        cap = -(-n // bd) if not keep_val else 0  # upper bound for the train split, trimmed at the end
        first_row = np.zeros(cap, row_dtype)
        block_tokens = np.zeros(cap, np.int64)
        val_rows: list[np.ndarray] = []
        val_lengths: list[np.ndarray] = []
        iota = np.arange(SCAN_ROWS, dtype=np.uint64)
        buf, tmp = np.empty(SCAN_ROWS, np.uint64), np.empty(SCAN_ROWS, np.uint64)
        held = np.empty(SCAN_ROWS, bool)
        count = 0  # training documents seen so far
        for a in range(0, n, SCAN_ROWS):
            m = min(SCAN_ROWS, n - a)
            chunk = np.asarray(self.lengths[a : a + m])
            x = np.add(iota[:m], np.uint64(a), out=buf[:m])
            held_rows = np.flatnonzero(_held_inplace(x, tmp[:m], threshold, held[:m]))
            if keep_val:
                self.total_tokens += int(chunk.sum(dtype=np.int64))
                val_rows.append(held_rows + a)
                val_lengths.append(chunk[held_rows])
                continue
            kept = m - len(held_rows)
            # Training documents count, count+1, …; blocks start at those ≡ 0 (mod bd).
            first = (-count) % bd
            starts = np.arange(first, kept, bd)
            start_rows = starts + np.searchsorted(held_rows - np.arange(len(held_rows)), starts, side="right")
            # Row segments [edges[i], edges[i+1]): the first finishes the block begun in an earlier
            # chunk (only held rows when first == 0), each other is one block's part in this chunk.
            edges = np.r_[0, start_rows, m]
            sums = np.add.reduceat(chunk, edges[:-1], dtype=np.int64)
            sums[edges[:-1] == edges[1:]] = 0  # reduceat gives chunk[i], not 0, for an empty segment
            self.total_tokens += int(sums.sum())
            if len(held_rows):
                np.subtract.at(sums, np.searchsorted(edges, held_rows, side="right") - 1, chunk[held_rows])
            b0 = (count + first) // bd
            if first:
                block_tokens[b0 - 1] += sums[0]
            block_tokens[b0 : b0 + len(starts)] = sums[1:]
            first_row[b0 : b0 + len(starts)] = start_rows + a
            count += kept
        if keep_val:
            rows = np.concatenate(val_rows) if val_rows else np.zeros(0, np.int64)
            lens = np.concatenate(val_lengths) if val_lengths else np.zeros(0, np.int64)
            self._val_rows, self.n = rows, len(rows)
            pad = np.zeros(-(-len(lens) // bd) * bd, np.int64)
            pad[: len(lens)] = lens
            self.block_tokens = _narrow(pad.reshape(-1, bd).sum(1))
        else:
            nblocks = -(-count // bd)
            self.n = count
            self._first_row = first_row[:nblocks]
            self.block_tokens = _narrow(block_tokens[:nblocks])

    @classmethod
    def shared(
        cls, lengths: np.ndarray, *, fingerprint: str, split: str, val_fraction: float, block_docs: int
    ) -> DocBlocks:
        """The table of split `split` of the dataset with `fingerprint` (whose rows have `lengths`),
        computed once per node and memory-mapped by its other processes (training/data/cache.py)."""
        args = dict(split=split, val_fraction=val_fraction, block_docs=block_docs)
        # Everything the split's tables depend on; the epoch plan's key adds seed, epoch, group size.
        key = {"fingerprint": fingerprint, **args}
        blocks = order_cache.shared(
            "blocks",
            {**key, "plan": plan_version(block_docs)},
            lambda: cls(lengths, **args),
            cls.save,
            lambda path: cls.load(path, lengths, **args),
            docs=len(lengths),
        )
        blocks.cache_key = key
        return blocks

    # -- a computed table is the same for every rank: saved once, memory-mapped by the others --
    _ARRAYS = ("block_tokens", "_first_row", "_val_rows")
    _META = ("split", "val_fraction", "block_docs", "n_rows", "n", "tokens", "total_tokens")

    def save(self, path: Path) -> None:
        """Write the table into the (new, empty) directory `path`."""
        for name in self._ARRAYS:
            if getattr(self, name) is not None:
                np.save(path / f"{name}.npy", getattr(self, name))
        (path / "meta.json").write_text(json.dumps({k: getattr(self, k) for k in self._META}))

    @classmethod
    def load(
        cls, path: Path, lengths: np.ndarray, split: str, val_fraction: float, block_docs: int
    ) -> DocBlocks:
        """A saved table, its arrays memory-mapped; ValueError/OSError if it does not fit `lengths`."""
        meta = json.loads((path / "meta.json").read_text())
        want = {
            "split": split,
            "val_fraction": val_fraction,
            "block_docs": block_docs,
            "n_rows": len(lengths),
        }
        if any(meta.get(k) != v for k, v in want.items()):
            raise ValueError(f"{path} was computed for {meta}, not {want}")
        self = cls.__new__(cls)
        self.lengths = lengths
        self.__dict__.update(meta)
        for name in cls._ARRAYS:
            f = path / f"{name}.npy"
            setattr(self, name, np.load(f, mmap_mode="r") if f.is_file() else None)
        # Exactly the arrays this split needs, of the right lengths: a missing _first_row would
        # otherwise read as "nothing held out" and put held-out documents into training.
        nblocks = -(-self.n // block_docs)
        need = {
            "block_tokens": nblocks,
            "_first_row": nblocks if split == "train" and val_fraction > 0 else None,
            "_val_rows": self.n if split == "val" else None,
        }
        for name, length in need.items():
            arr = getattr(self, name)
            if (arr is None) != (length is None) or (arr is not None and len(arr) != length):
                raise ValueError(f"{path}: {name} missing, unexpected or of the wrong length")
        if int(np.asarray(self.block_tokens).sum(dtype=np.int64)) != self.tokens:
            raise ValueError(f"{path}: block totals do not add up to the split's {self.tokens} tokens")
        return self

    # Pickled for spawn/forkserver workers: the owner re-points `lengths` at the index; arrays
    # loaded from the cache travel as their .npy paths, not as copies.
    def __getstate__(self) -> dict[str, Any]:
        state = {**self.__dict__, "lengths": None}
        for name in self._ARRAYS:
            if isinstance(state[name], np.memmap):
                state[name] = ("npy", state[name].filename)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in self._ARRAYS:
            if isinstance(state[name], tuple):
                state[name] = np.load(state[name][1], mmap_mode="r")
        self.__dict__.update(state)

    def rows(self, blocks: np.ndarray) -> np.ndarray:
        """Manifest rows of the documents of `blocks`, block after block, each in manifest order."""
        bd = self.block_docs
        blocks = np.asarray(blocks, np.int64)
        if self._first_row is None:  # no held-out rows (train), or the held-out split's own list
            docs = (blocks[:, None] * bd + np.arange(bd)).ravel()
            docs = docs[docs < self.n]  # the split's last block may be short
            return docs if self._val_rows is None else self._val_rows[docs]
        # Train split with held-out rows: block b spans rows [first_row[b], first_row[b+1]).
        nb = len(self._first_row)
        first = self._first_row[blocks].astype(np.int64)
        nxt = np.where(blocks + 1 < nb, self._first_row[np.minimum(blocks + 1, nb - 1)], self.n_rows)
        nxt = nxt.astype(np.int64)
        spans = nxt - first
        cand = np.arange(int(spans.sum()), dtype=np.int64) + np.repeat(
            first - (np.cumsum(spans) - spans), spans
        )
        return cand[~heldout_rows(cand, self.val_fraction)]

    def val_docs(self, rows: np.ndarray) -> np.ndarray:
        """The held-out split's document numbers of manifest rows `rows` (each a row of this split)."""
        if self._val_rows is None:
            raise ValueError("val_docs is the held-out split's")
        return np.searchsorted(self._val_rows, np.asarray(rows, np.int64))

    def block_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The blocks holding manifest rows `rows` (each a row of this split)."""
        rows = np.asarray(rows, np.int64)
        if self._val_rows is not None:  # the held-out split: its documents are its own list's entries
            return np.searchsorted(self._val_rows, rows) // self.block_docs
        if self._first_row is None:
            return rows // self.block_docs
        return np.searchsorted(self._first_row, rows, side="right") - 1

    def doc_rows(self, docs: np.ndarray) -> np.ndarray:
        """Manifest rows of split documents `docs` (indices in the split's manifest order)."""
        docs = np.asarray(docs, np.int64)
        if self._first_row is None:
            return docs if self._val_rows is None else self._val_rows[docs]
        blocks, inside = np.divmod(docs, self.block_docs)
        out = np.empty(len(docs), np.int64)
        for b in np.unique(blocks).tolist():
            sel = blocks == b
            out[sel] = self.rows(np.array([b]))[inside[sel]]
        return out


def _narrow(a: np.ndarray) -> np.ndarray:
    """int64 totals as uint32 when they fit: half the memory for the per-block table."""
    return a.astype(np.uint32) if len(a) == 0 or int(a.max()) < 1 << 32 else a


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
        self._groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}

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

    def group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Group g's documents (manifest rows) in stream order, and the cumulative token counts."""
        hit = self._groups.get(g)
        if hit is not None:
            return hit
        docs = self.blocks.rows(self.block_order[g * self.group_blocks : (g + 1) * self.group_blocks])
        docs = docs[hashed_order(len(docs), derive_key(self.seed, self.epoch, 1, g))]
        cum = np.zeros(len(docs) + 1, np.int64)
        np.cumsum(self.blocks.lengths[docs], out=cum[1:])
        if len(self._groups) >= 2:  # a worker walks the stream forward: keep current and next
            self._groups.pop(next(iter(self._groups)))
        self._groups[g] = (docs, cum)
        return docs, cum

    def segments(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stream tokens [a, b) as (document, first token in it, token count) pieces, in order."""
        if not 0 <= a <= b <= self.tokens:
            raise ValueError(f"token range [{a}, {b}) is outside the epoch's {self.tokens} tokens")
        docs_out, starts_out, counts_out = [], [], []
        while a < b:
            g = int(np.searchsorted(self.group_start, a, side="right")) - 1
            docs, cum = self.group(g)
            base = int(self.group_start[g])
            lo, hi = a - base, min(b, int(self.group_start[g + 1])) - base
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
        docs, cum = self.group(g)
        base = int(self.group_start[g])
        lo, hi = a - base, b - base
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
