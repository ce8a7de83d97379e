"""Which documents are held out for validation, and the index file that finds them without a scan.

Row i of the manifest is held out at `val_fraction` f iff mix64(i ^ VAL_SALT) < f·2⁶⁴: a fixed,
seed-independent subset of about f of the documents, spread evenly over the corpus, and the rows held
out at a smaller f are a subset of those at a larger one. So one file serves every f: the index's
`heldout.bin` holds every row with its token count, sorted by that hash, and the rows held out at f
are exactly its first entries, those whose hash is below the threshold. A reader takes that prefix
(f·n × 12 bytes: 18 MB at FineWeb-Edu's 1.5B documents with f = 0.001), never the per-document
lengths of the whole corpus (6 GB). `heldout_sha256.bin` holds one sha256 per CHUNK entries, so a
prefix read by range from a bucket is checked piece by piece before it is used.

splitmix64's finaliser (`mix64`) is defined here, where the contract needs it; the epoch order
(training/data/order.py) uses the same one for its permutations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import IO

import numpy as np

VAL_SALT = 0x6772697374766C31  # "gristvl1": held-out selection is independent of the seed
ENTRY = np.dtype([("row", "<u8"), ("tokens", "<u4")])  # a heldout.bin entry: 12 bytes
CHUNK = 1 << 14  # entries per sha256 of heldout_sha256.bin (196 kB): the unit of a range read
HASH_BYTES = 32


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a bijection of uint64; wraps silently)."""
    x = np.array(x, dtype=np.uint64, ndmin=1)  # a copy; arrays (not scalars) wrap without warnings
    return mix64_inplace(x, np.empty_like(x))


def mix64_inplace(x: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """mix64 overwriting `x`, with one scratch buffer `tmp`: on cache-sized chunks ~3x faster than
    fresh arrays."""
    np.right_shift(x, np.uint64(30), out=tmp)
    x ^= tmp
    x *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(x, np.uint64(27), out=tmp)
    x ^= tmp
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp
    return x


def threshold(val_fraction: float) -> np.uint64:
    """The hash below which a row is held out at `val_fraction`."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction {val_fraction} must be in [0, 1)")
    return np.uint64(int(val_fraction * 2.0**64))


def row_hash(rows: np.ndarray) -> np.ndarray:
    """The held-out hash of manifest rows `rows` (uint64)."""
    x = np.array(rows, dtype=np.uint64, ndmin=1)
    x ^= np.uint64(VAL_SALT)
    return mix64_inplace(x, np.empty_like(x))


def heldout_rows(rows: np.ndarray, val_fraction: float) -> np.ndarray:
    """Which of manifest rows `rows` are held out at `val_fraction` (a bool mask)."""
    return row_hash(rows) < threshold(val_fraction)


def sorted_entries(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """heldout.bin's entries for `rows` (with their token counts), in hash order."""
    out = np.empty(len(rows), ENTRY)
    order = np.argsort(row_hash(rows), kind="stable")  # a bijection: no ties
    out["row"] = np.asarray(rows, np.uint64)[order]
    out["tokens"] = np.asarray(tokens)[order]
    return out


class SortedWriter:
    """heldout.bin from rows given in any order, at any scale. Up to HELD entries are kept and sorted
    in memory; past that, entries are spread over BINS temporary files by the hash's top bits (each
    bin holds a contiguous hash range), then each bin is sorted alone, so memory is HELD entries or
    one bin (n/256 entries), never the corpus. The bins are made only then: making, filling and
    removing 256 files cost every build and every validation of a small dataset ~0.1-0.2 CPU s."""

    BINS = 256
    HELD = 1 << 20  # entries (12 bytes each) sorted in memory before the bins are used

    def __init__(self, scratch: str):
        self._scratch = scratch
        self._files: list[IO[bytes]] | None = None  # the bins, once more than HELD entries came
        self._held: list[np.ndarray] = []  # entries not in the bins yet, in the order they came
        self._held_count = 0
        self.digests: list[bytes] = []  # heldout_sha256.bin: each chunk's, as `chunks` yields it

    def add(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        entries = np.empty(len(rows), ENTRY)
        entries["row"], entries["tokens"] = np.asarray(rows, np.uint64), np.asarray(tokens)
        self._held.append(entries)
        self._held_count += len(entries)
        if self._held_count > self.HELD:
            self._spill()

    def _spill(self) -> None:
        """The held entries written to their bins (made at the first spill)."""
        if self._files is None:
            self._files = [open(f"{self._scratch}/bin{b:03d}", "w+b") for b in range(self.BINS)]  # noqa: SIM115
        for entries in self._held:
            top = (row_hash(entries["row"]) >> np.uint64(56)).astype(np.int64)
            order = np.argsort(top, kind="stable")
            entries, top = entries[order], top[order]
            cuts = np.searchsorted(top, np.arange(self.BINS + 1))
            for b in np.flatnonzero(np.diff(cuts)).tolist():
                self._files[b].write(entries[cuts[b] : cuts[b + 1]].tobytes())
        self._held, self._held_count = [], 0

    def _sorted_parts(self) -> Iterator[np.ndarray]:
        """Every entry in hash order, a part at a time: all of them at once when no bin was made."""
        if self._files is None:
            held = np.concatenate([np.zeros(0, ENTRY), *self._held])
            yield sorted_entries(held["row"], held["tokens"])
            return
        self._spill()
        for f in self._files:
            f.seek(0)
            entries = np.frombuffer(f.read(), ENTRY)
            yield sorted_entries(entries["row"], entries["tokens"])

    def chunks(self) -> Iterator[np.ndarray]:
        """The sorted entries, CHUNK at a time (the last chunk may be short), each one's sha256 added
        to `digests`; closes the bins."""
        pending = np.zeros(0, ENTRY)
        try:
            for part in self._sorted_parts():
                pending = np.concatenate([pending, part])
                while len(pending) >= CHUNK:
                    chunk, pending = pending[:CHUNK], pending[CHUNK:]
                    self.digests.append(hashlib.sha256(chunk.tobytes()).digest())
                    yield chunk
            if len(pending):
                self.digests.append(hashlib.sha256(pending.tobytes()).digest())
                yield pending
        finally:
            for f in self._files or ():
                f.close()


class PrefixError(ValueError):
    """A chunk of heldout.bin that does not hash as heldout_sha256.bin records (read twice); `alike`: both
    reads gave the same bytes (the file's), else at least one read was damaged on the way."""

    def __init__(self, message: str, alike: bool):
        super().__init__(message)
        self.alike = alike


def read_prefix(
    read: Callable[[int, int], bytes], hashes: bytes, n_rows: int, val_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """The rows held out at `val_fraction` (sorted by row) and their token counts, from heldout.bin's
    prefix: `read(lo, hi)` returns the file's bytes [lo, hi) (a local file or a range request),
    `hashes` is heldout_sha256.bin. Chunks are read in order until one holds an entry at or above the
    threshold; each is checked against its sha256 (read once more, then PrefixError)."""
    limit = threshold(val_fraction)
    parts: list[np.ndarray] = []
    chunks = -(-n_rows // CHUNK)
    for c in range(chunks if limit else 0):
        lo, hi = c * CHUNK * ENTRY.itemsize, min((c + 1) * CHUNK, n_rows) * ENTRY.itemsize
        want = hashes[c * HASH_BYTES : (c + 1) * HASH_BYTES]
        reads = []
        for _ in range(2):
            data = read(lo, hi)
            if hashlib.sha256(data).digest() == want:
                break
            reads.append(data)
        else:
            raise PrefixError(
                f"chunk {c} (bytes {lo:,}–{hi - 1:,}) does not hash as heldout_sha256.bin says",
                reads[0] == reads[1],
            )
        entries = np.frombuffer(data, ENTRY)
        held = row_hash(entries["row"]) < limit
        parts.append(entries[held])
        if not held.all():  # sorted by hash: the first entry at or above the threshold ends the prefix
            break
    entries = np.concatenate(parts) if parts else np.zeros(0, ENTRY)
    entries = np.sort(entries, order="row")
    return entries["row"].astype(np.int64), entries["tokens"].astype(np.int64)
