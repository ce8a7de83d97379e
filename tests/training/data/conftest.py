"""Fixtures of the data-stack tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.train_data import make_dataset


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """Three small datasets built with one tokenizer: the sources of the phased recipes."""
    root = tmp_path_factory.mktemp("sources")
    return {
        "web": make_dataset(root / "web", n_docs=240, seed=1),
        "code": make_dataset(root / "code", n_docs=160, seed=2),
        "math": make_dataset(root / "math", n_docs=100, seed=3),
    }
