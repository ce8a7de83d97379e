"""A small synthetic dataset for trainer tests: learnable token streams written through the real writer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipelines.synthetic_dataset import write_synthetic_dataset

SEPARATOR_ID = 0


def affine_documents(n_docs: int, vocab_size: int = 256, seed: int = 0) -> Iterator[np.ndarray]:
    """Documents that follow one of a few affine rules x → (a·x + b) mod (V-1) + 1 with 5% noise, then
    the separator (id 0, after each document): a bigram model gets the loss far below ln(V)."""
    rng = np.random.default_rng(seed)
    rules = [(3, 7), (5, 11), (7, 1), (11, 13)]
    for i in range(n_docs):
        a, b = rules[i % len(rules)]
        n = int(rng.integers(40, 300))
        ids = np.empty(n + 1, dtype=np.int64)
        x = int(rng.integers(1, vocab_size))
        for t in range(n):
            ids[t] = x
            x = (a * x + b) % (vocab_size - 1) + 1
            if rng.random() < 0.05:
                x = int(rng.integers(1, vocab_size))
        ids[n] = SEPARATOR_ID
        yield ids


def make_dataset(root: Path, *, n_docs: int = 600, vocab_size: int = 256, seed: int = 0) -> Path:
    """affine_documents through the real writer."""
    documents = affine_documents(n_docs, vocab_size, seed)
    write_synthetic_dataset(root, documents, vocab_size=vocab_size, target_bytes=64 << 10)
    return root
