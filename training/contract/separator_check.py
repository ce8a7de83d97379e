"""The separator rule, once: every document of a token stream holds the separator id exactly once,
as its last token (position "after", EOS style) or its first ("before", BOS style).

Three places check it, each over its own unit and each naming what it found in its own words: the
tokenizer per document as it frames one (tokenization/separator.py), the validator over all the
documents of a shard (validation/validate.py; `gristmill data convert` over OLD's shards as it reads
them, with `documents_breaking`), the loader over the pieces of a batch, which cut documents anywhere
(training/data/reader.py). Numpy only.
"""

from __future__ import annotations

import numpy as np


def separator_mask(
    lengths: np.ndarray, position: str, starts: np.ndarray | None = None, counts: np.ndarray | None = None
) -> np.ndarray:
    """Where the separator belongs in tokens made of consecutive pieces: piece k holds tokens
    starts[k] … starts[k] + counts[k] - 1 of a document of lengths[k] tokens (by default each piece
    is a whole document). True exactly at each document's last token ("after") or first ("before")
    where its piece holds that token; False everywhere else."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.zeros(len(lengths), np.int64) if starts is None else np.asarray(starts, np.int64)
    counts = lengths if counts is None else np.asarray(counts, np.int64)
    first = np.cumsum(counts) - counts  # where each piece begins
    if position == "after":
        at = (first + counts - 1)[(starts + counts == lengths) & (counts > 0)]
    elif position == "before":
        at = first[(starts == 0) & (counts > 0)]
    else:
        raise ValueError(f"separator position {position!r} is neither 'after' nor 'before'")
    mask = np.zeros(int(counts.sum()), bool)
    mask[at] = True
    return mask


def misplaced_separators(
    tokens: np.ndarray,
    separator_id: int,
    position: str,
    lengths: np.ndarray,
    starts: np.ndarray | None = None,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """The positions in `tokens` (pieces as in separator_mask) that break the rule, in order: the
    separator where none belongs, or another token where the separator belongs. Empty when all is
    well. A document of 0 tokens breaks the rule without a position to show: a caller reading
    whole documents that may be empty flags those itself."""
    return np.flatnonzero((tokens == separator_id) != separator_mask(lengths, position, starts, counts))


def documents_breaking(
    tokens: np.ndarray, separator_id: int, position: str, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the documents that break the rule, each document's count of the separator, the separator's
    positions in `tokens`) for whole documents of `lengths` tokens, one after another in `tokens`.
    Breaking it: a misplaced separator or another token in its place, an empty document (no token to
    misplace), and the separator alone (in place, yet two separators side by side in the stream, as a
    doubled one puts them: the build excludes a text that encodes to no token, RV50b F2)."""
    ends = np.cumsum(lengths)
    sep_pos = np.flatnonzero(tokens == separator_id)
    counts = np.bincount(np.searchsorted(ends, sep_pos, side="right"), minlength=len(lengths))
    misplaced = misplaced_separators(tokens, separator_id, position, lengths)
    alone = np.flatnonzero((lengths == 1) & (counts == 1))
    bad = np.union1d(
        np.searchsorted(ends, misplaced, side="right"), np.union1d(np.flatnonzero(lengths == 0), alone)
    )
    return bad, counts, sep_pos
