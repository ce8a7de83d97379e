"""The token-position corpus of the loader tests: every token names its document and position
(token = 1 + doc·1000 + position, separator 0), written with the real ShardWriter, so a test can
decode any batch back into (document, position) pairs and check order, coverage and resets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pipelines.shard_writer import ShardWriter, finalize_dataset

SEP = 0
KEYS = ("input_ids", "labels", "position_ids")


def doc_tokens(doc: int, n: int, position: str = "after") -> np.ndarray:
    ids = 1 + doc * 1000 + np.arange(n, dtype=np.int64)
    ids[-1 if position == "after" else 0] = SEP
    return ids


def decode(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    doc, pos = np.divmod(np.asarray(tokens) - 1, 1000)
    return doc, pos


def make_dataset(
    root: Path,
    *,
    n_docs=300,
    tasks=2,
    seed=0,
    position="after",
    vocab=1 << 20,
    tokenizer=None,
    shard_bytes=16_000,
):
    """Token-position corpus (uint32 for the default vocab); returns {doc: length}."""
    rng = np.random.default_rng(seed)
    lengths = {}
    per_task = n_docs // tasks
    for task in range(tasks):
        w = ShardWriter(root, task, vocab_size=vocab, target_bytes=shard_bytes)
        for i in range(per_task):
            doc = task * per_task + i
            lengths[doc] = n = int(rng.integers(2, 60))
            ids = (
                doc_tokens(doc, n, position)
                if vocab > 65536
                else np.append(rng.integers(1, vocab, n - 1), SEP)
            )
            w.add(f"t{task:05d}d{i:09d}", ids, {"id": f"doc-{doc}"})
        w.close()
    finalize_dataset(
        root,
        vocab_size=vocab,
        separator={"token": "<|endoftext|>", "id": SEP, "position": position},
        config_sha256="test",
        tokenizer_path=tokenizer,
    )
    return lengths


def rows(batch: list[dict]) -> dict[str, np.ndarray]:
    return {k: torch.cat([mb[k] for mb in batch]).numpy() for k in KEYS}


def epoch_stream(batches: list) -> np.ndarray:
    """The stream tokens of consecutive global batches: each row's inputs plus its last label."""
    parts = []
    for b in batches:
        r = rows(b)
        parts.append(np.concatenate([r["input_ids"], r["labels"][:, -1:]], axis=1).ravel())
    return np.concatenate(parts)
