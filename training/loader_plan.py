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
"""

from __future__ import annotations

import numpy as np

BLOCK_DOCS = 64
GROUP_BLOCKS = 4096

_M64 = (1 << 64) - 1
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_VAL_SALT = 0x6772697374766C31  # "gristvl1": held-out selection is independent of the seed


def plan_version(block_docs: int = BLOCK_DOCS, group_blocks: int = GROUP_BLOCKS) -> str:
    """Names the ordering algorithm; stored in loader state so a changed algorithm is refused."""
    return f"splitmix64-blocks/1 block_docs={block_docs} group_blocks={group_blocks}"


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a bijection of uint64; wraps silently)."""
    x = np.array(x, dtype=np.uint64, ndmin=1)  # a copy; arrays (not scalars) wrap without warnings
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def derive_key(*parts: int) -> np.uint64:
    """One 64-bit key from a tuple of integers (seed, epoch, level, group …)."""
    h = np.zeros(1, np.uint64)
    for p in parts:
        h = mix64((h + _GAMMA) ^ np.uint64(int(p) & _M64))
    return h[0]


def hashed_order(n: int, key: np.uint64) -> np.ndarray:
    """A permutation of range(n): argsort of mix64(i ^ key). Keys are distinct, so it is unique."""
    keys = np.arange(n, dtype=np.uint64)
    keys ^= key
    return np.argsort(mix64(keys))


def heldout_mask(first_row: int, n: int, val_fraction: float) -> np.ndarray:
    """Which of manifest rows [first_row, first_row+n) are held out for validation.

    Row i is held out iff mix64(i ^ salt) < val_fraction·2⁶⁴: a fixed, seed-independent subset of
    about `val_fraction` of the documents, spread evenly over the corpus.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction {val_fraction} must be in [0, 1)")
    rows = np.arange(first_row, first_row + n, dtype=np.uint64)
    rows ^= np.uint64(_VAL_SALT)
    return mix64(rows) < np.uint64(int(val_fraction * 2.0**64))


class EpochPlan:
    """The token stream of one epoch of `seed` over documents with `lengths` (manifest order).

    `segments(a, b)` names the document pieces that make stream tokens [a, b). Memory: the
    caller's lengths array, 8 bytes per block (24 while planning), and the two groups last used.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        seed: int,
        epoch: int,
        block_docs: int = BLOCK_DOCS,
        group_blocks: int = GROUP_BLOCKS,
    ):
        n = len(lengths)
        if n == 0:
            raise ValueError("cannot plan an epoch over zero documents")
        self.lengths = lengths
        self.seed, self.epoch = seed, epoch
        self.block_docs, self.group_blocks = block_docs, group_blocks
        nblocks = -(-n // block_docs)
        full = n // block_docs * block_docs
        # reshape + sum(dtype=int64) widens in small buffers; reduceat would copy all lengths to int64.
        block_tokens = np.zeros(nblocks, np.int64)
        block_tokens[: full // block_docs] = (
            lengths[:full].reshape(-1, block_docs).sum(axis=1, dtype=np.int64)
        )
        if full < n:
            block_tokens[-1] = lengths[full:].sum(dtype=np.int64)
        self.block_order = hashed_order(nblocks, derive_key(seed, epoch, 0))
        ngroups = -(-nblocks // group_blocks)
        per_block = np.zeros(ngroups * group_blocks, np.int64)
        per_block[:nblocks] = block_tokens[self.block_order]
        del block_tokens
        self.group_start = np.zeros(ngroups + 1, np.int64)
        np.cumsum(per_block.reshape(ngroups, group_blocks).sum(axis=1), out=self.group_start[1:])
        self.tokens = int(self.group_start[-1])
        self._groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def group(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Group g's documents in stream order, and the cumulative token counts (len + 1)."""
        hit = self._groups.get(g)
        if hit is not None:
            return hit
        blocks = self.block_order[g * self.group_blocks : (g + 1) * self.group_blocks]
        docs = (blocks[:, None] * self.block_docs + np.arange(self.block_docs)).ravel()
        docs = docs[docs < len(self.lengths)]  # the corpus's last block may be short
        docs = docs[hashed_order(len(docs), derive_key(self.seed, self.epoch, 1, g))]
        cum = np.zeros(len(docs) + 1, np.int64)
        np.cumsum(self.lengths[docs], out=cum[1:])
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


def epoch_steps(tokens: int, seq_len: int, global_batch: int) -> tuple[int, int]:
    """(steps per epoch, dropped tail tokens) for an epoch stream of `tokens` tokens.

    The tail — a partial window plus fewer than `global_batch` whole windows — is dropped, so every
    step is a full global batch and every rank gets the same number of batches.
    """
    steps = tokens // (seq_len + 1) // global_batch
    return steps, tokens - steps * global_batch * (seq_len + 1)
