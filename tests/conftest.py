"""Shared fixtures: a small real corpus, a small trained tokenizer, and `built_dataset`.

`built_dataset` is a dataset directory produced by the real build (`gristmill data build`: real
datatrove LocalPipelineExecutor with 2 tasks in 2 worker processes, real tars, validated), shared
by the whole session. Treat it as read-only; copy it (`shutil.copytree`) to damage it.
The corpus, tokenizer and recipe come from tests/helpers/corpus.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import forked
from tests.helpers.corpus import (
    fixture_config_text,
    fixture_texts,
    train_fixture_tokenizer,
    write_fixture_corpus,
)


@pytest.fixture(scope="session")
def build_fixture(tmp_path_factory):
    """(corpus dir, tokenizer.json, config.toml) of the shared small build; output under it."""
    root = tmp_path_factory.mktemp("build-fixture")
    corpus = write_fixture_corpus(root / "corpus")
    tokenizer = train_fixture_tokenizer(root / "tokenizer.json", fixture_texts())
    config = root / "data.toml"
    config.write_text(fixture_config_text(corpus, tokenizer, root / "dataset"))
    return corpus, tokenizer, config


@pytest.fixture(scope="session")
def built_dataset(build_fixture) -> Path:
    """A real, validated dataset (2 tasks, several shards each, uint16, separator after)."""
    from pipelines.build import build
    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config

    _, _, config = build_fixture
    cfg = load_config(DataConfig, config)
    result = build(cfg, log=lambda *a: None)
    assert result.ok, result.report
    return Path(cfg.output)


def pytest_sessionfinish(session, exitstatus):
    forked.stop_server()  # reaped here: its children's CPU time counts in `time make test`
