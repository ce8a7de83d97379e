"""Shared fixtures: a small real corpus, a small trained tokenizer, and `built_dataset`.

`built_dataset` is a dataset directory produced by the real build (`gristmill data build`: real
datatrove LocalPipelineExecutor with 2 tasks in 2 worker processes, real tars, validated), built
once per test run and shared by every worker (`shared`). It is read-only, and checked to be at the
end: copy it (`shutil.copytree`) to damage it.
The corpus, tokenizer and recipe come from tests/helpers/corpus.py.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import forked
from tests.helpers.corpus import (
    fixture_config_text,
    fixture_texts,
    train_fixture_tokenizer,
    write_fixture_corpus,
)
from tests.helpers.shared import Shared, shared_root
from tests.helpers.tiers import TIERS, group_of, tier_of

# One torch (OpenMP) thread per test process unless the caller says otherwise: `make test` runs two
# pytest-xdist workers on two cores, where a second intra-op thread per worker only waits for a
# core (the in-process tier: 75 CPU s with torch's default, 57 with one thread, less wall too).
# Set before any test module imports torch; subprocesses inherit it, and a test that wants more
# threads asks for them (run.threads, torch.set_num_threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The collector paused while this process imports what it collects (torch, datatrove, the test
# modules): every automatic full pass during those imports walked all they had made so far
# (pytest_collection_finish collects once, then freezes it). An xdist controller collects nothing
# and runs no test: pytest_configure gives it its collector back at once.
gc.disable()

# After the freeze, the share of long-lived objects that gates a full pass (a quarter of those a full
# pass left) is measured against what tests keep, a few thousand: a full pass came every tenth middle
# pass (15 in test_merge alone, 1.3 of its 8.6 CPU s). One in a hundred: 4 passes, 0.5 s.
FULL_PASS_EVERY = 100


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=TIERS,
        help="run one tier of the suite (tests/helpers/tiers.py): the modules that start no process, or "
        "those that do (pytest.mark.process); the other tier's modules are not even imported",
    )


def pytest_configure(config):
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        gc.enable()  # the xdist controller: it collects nothing


def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup (the Makefile's) by module: the tests of a module marked
    pytest.mark.xdist_group("NAME") go to one worker as one unit, every other test alone. xdist 3.8's
    own loadgroup renames each marked item's `_nodeid`, which pytest 9 no longer reads: it scheduled
    every test alone, so each worker started the module's servers."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(config.rootpath / nodeid.split("::")[0]) or nodeid

    return ModuleGroups(config, log)


def pytest_collection_finish(session):
    """What this worker imported to collect (torch, datatrove, the test modules: ~400k objects) lives
    to the end of the session: frozen out of the garbage collector's reach, so that every later full
    collection (the automatic ones, pytest's own forced ones at the end) walks only what tests made.
    A process-tier worker spent ~13% of its CPU in those walks (gc.callbacks over test_rewind)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*gc.get_threshold()[:2], FULL_PASS_EVERY)
    gc.enable()


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    tier = config.getoption("--tier")
    if tier and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True if tier_of(collection_path) != tier else None
    return None


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> Iterator[Shared]:
    """Artifacts built once per test run, whichever worker asks first (tests/helpers/shared.py);
    at the end of the session, each one this worker used must be unchanged."""
    store = Shared(shared_root(tmp_path_factory.getbasetemp()))
    yield store
    store.check_unchanged()


@pytest.fixture(scope="module", autouse=True)
def shared_untouched() -> Iterator[None]:
    """After each module: no shared artifact this worker used was written, even for a while."""
    yield
    for store in Shared.made:
        store.check_untouched()


@pytest.fixture(scope="session")
def build_fixture(shared) -> tuple[Path, Path, Path]:
    """(corpus dir, tokenizer.json, config.toml) of the shared small build; its output is `built_dataset`."""

    def make(root: Path) -> None:
        corpus = write_fixture_corpus(root / "corpus")
        tokenizer = train_fixture_tokenizer(root / "tokenizer.json", fixture_texts())
        (root / "data.toml").write_text(fixture_config_text(corpus, tokenizer, shared.root / "built-dataset"))

    root = shared.get("build-fixture", make)
    return root / "corpus", root / "tokenizer.json", root / "data.toml"


@pytest.fixture(scope="session")
def built_dataset(build_fixture, shared) -> Path:
    """A real, validated dataset (2 tasks, several shards each, uint16, separator after)."""
    from pipelines.build import build
    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config

    cfg = load_config(DataConfig, build_fixture[2])

    def make(path: Path) -> None:
        assert Path(cfg.output) == path
        result = build(cfg, log=lambda *a: None)
        assert result.ok, result.report

    return shared.get("built-dataset", make)


@pytest.fixture(scope="session")
def synthetic_dataset(shared) -> Callable[..., Path]:
    """`synthetic_dataset(n_docs=600, vocab_size=256, seed=0)`: tests/helpers/train_data.py's
    learnable dataset, built once per test run for each set of arguments (read-only)."""
    from tests.helpers.train_data import make_dataset

    def get(n_docs: int = 600, vocab_size: int = 256, seed: int = 0) -> Path:
        key = f"synthetic-{n_docs}docs-{vocab_size}vocab-seed{seed}"
        return shared.get(
            key, lambda path: make_dataset(path, n_docs=n_docs, vocab_size=vocab_size, seed=seed)
        )

    return get


def pytest_sessionfinish(session, exitstatus):
    forked.stop_server()  # reaped here: its children's CPU time counts in `time make test`
