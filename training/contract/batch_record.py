"""RUN/batches.bin: what each trained step was fed, one fixed-size record per step, read without torch
(docs/loader-and-phases.md, "What the model was fed").

    header  b"gristmill-batches/1\\n"
    record  step (uint64), attempt (uint32), sha256 of the step's global batch (32 bytes): 44 bytes,
            little-endian, in the order the steps were trained

The digest is training/data/loader.batch_sha256 of the global batch, the one `gristmill data inspect
RUN --hash --step N` prints and the metrics row's `batch_sha256`. RUN/batches.bin lists the run's
steps, its final timeline's; a rewind moves the records of the steps it discards to
RUN/batches-discarded.bin (same format; attempt n is the one rewind n discarded), so a discarded step
is never listed as the run's. Written only by training/run/record.RunRecord; `gristmill verify RUN`
checks every record against the plan.
"""

from __future__ import annotations

import bisect
import collections
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HEADER = b"gristmill-batches/1\n"
RECORD = struct.Struct("<QI32s")


@dataclass(frozen=True)
class BatchEntry:
    """One trained step's record."""

    step: int  # the trainer's step, from 1 (as in metrics.jsonl)
    attempt: int  # the timeline's attempt that trained it (1 before the first rewind)
    sha256: str  # hex digest of the step's global batch


def encode(entries: Iterable[BatchEntry]) -> bytes:
    """The records of `entries`, without the header (appended to a file that has one)."""
    return b"".join(RECORD.pack(e.step, e.attempt, bytes.fromhex(e.sha256)) for e in entries)


def batch_file(entries: Iterable[BatchEntry]) -> bytes:
    """A whole file: the header and the records."""
    return HEADER + encode(entries)


def kept_on_resume(entries: list[BatchEntry], through: int) -> tuple[list[BatchEntry], list[int]]:
    """What a resume from the checkpoint of step `through` keeps of a batch record's `entries`, and the
    positions (0-based) of those it drops as damaged. The records are in the order the steps trained,
    so their steps rise: those kept are the longest rising run of records of steps up to `through`
    (the rest of those are damaged), and a record of a later step before the last one kept is damaged
    too; the records of later steps after it are the steps the resume redoes. (Picking the later
    steps by position blamed intact records and kept a damaged one: review R22a A3.) Two records of
    one step that either could take its place in the run cannot be told apart by their order (a
    damaged one took its neighbour's step): both are dropped, never the damaged one kept (R22d M2)."""
    early = [i for i, e in enumerate(entries) if e.step <= through]
    # longest strictly rising subsequence of their steps (patience sorting, with predecessors)
    tails: list[int] = []  # tails[k]: the position in `early` of the smallest last step of a run of k + 1
    steps: list[int] = []  # and that step
    before = [-1] * len(early)
    for j, i in enumerate(early):
        k = bisect.bisect_left(steps, entries[i].step)
        before[j] = tails[k - 1] if k else -1
        if k == len(tails):
            tails.append(j)
            steps.append(entries[i].step)
        else:
            tails[k], steps[k] = j, entries[i].step
    run, j = [], tails[-1] if tails else -1
    while j >= 0:
        run.append(early[j])
        j = before[j]
    run.reverse()
    same: dict[int, list[int]] = collections.defaultdict(list)  # step → its records' positions
    for i in early:
        same[entries[i].step].append(i)
    kept = set(run)
    for k, i in enumerate(run):  # another record of its step that would fit the run in its place
        lo, hi = run[k - 1] if k else -1, run[k + 1] if k + 1 < len(run) else len(entries)
        if any(lo < j < hi and j != i for j in same[entries[i].step]):
            kept.discard(i)
    last = max(run, default=-1)
    damaged = [
        i
        for i, e in enumerate(entries)
        if (e.step <= through and i not in kept) or (e.step > through and i < last)
    ]
    return [entries[i] for i in sorted(kept)], damaged


def read_batches(path: Path) -> tuple[list[BatchEntry], str | None]:
    """The records of `path` ([] when it does not exist) and a note when its last record is torn (a
    write cut short: cut off); a file that does not start with the header is a ValueError saying so."""
    if not path.is_file():
        return [], None
    data = path.read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path} is not a batch record (it does not start with {HEADER!r})")
    body = memoryview(data)[len(HEADER) :]
    whole = len(body) - len(body) % RECORD.size
    entries = [BatchEntry(s, a, d.hex()) for s, a, d in RECORD.iter_unpack(body[:whole])]
    if whole == len(body):
        return entries, None
    torn = len(body) - whole
    return entries, f"note: cut off the torn last record of {path} ({torn} bytes: a write was interrupted)"
