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
