"""Fixtures of the data-stack tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def sources(synthetic_dataset) -> dict[str, Path]:
    """Three small datasets built with one tokenizer: the sources of the phased recipes."""
    return {
        "web": synthetic_dataset(n_docs=240, seed=1),
        "code": synthetic_dataset(n_docs=160, seed=2),
        "math": synthetic_dataset(n_docs=100, seed=3),
    }
