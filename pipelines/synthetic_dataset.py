"""A dataset of given token sequences, written through the build's own ShardWriter and finalize.

For tests and benchmarks that need a real dataset directory (tars, manifest, index, dataset.json)
without a tokenizer or a datatrove run: the caller supplies each document's ids, separator
included; this writes them exactly as the build does. tests/helpers/train_data.py (learnable sequences for
the trainer) and bench/loader_throughput.py (lognormal lengths at scale) both use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.shard_writer import ShardWriter, finalize_dataset

SEPARATOR = {"token": "<|endoftext|>", "id": 0, "position": "after"}


def write_synthetic_dataset(
    root: str | Path,
    documents: Iterable[np.ndarray],
    *,
    vocab_size: int,
    target_bytes: int = 64 << 20,
    config_sha256: str = "synthetic",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `documents` (each ending with separator id 0) as task 0's shards; returns dataset.json."""
    root = Path(root)
    writer = ShardWriter(root, task=0, vocab_size=vocab_size, target_bytes=target_bytes)
    for i, ids in enumerate(documents):
        writer.add(f"t00000d{i:09d}", ids, {"id": f"doc-{i}"})
    writer.close()
    return finalize_dataset(
        root, vocab_size=vocab_size, separator=SEPARATOR, config_sha256=config_sha256, extra=extra
    )
