"""A pytest plugin that runs only the tests a file names (one node id a line), for
`bench.suite_cost --same-tests`: the candidate's cost of the checks the baseline had.

    SUITE_ONLY=/tmp/baseline-ids.txt make test PYTEST_ARGS="-p bench.suite_only"

Tests the file names that the run does not have (renamed or removed since) are counted in the
summary line; nothing here asserts anything.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "SUITE_ONLY"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    keep = set(Path(path).read_text().splitlines())
    selected = [item for item in items if item.nodeid in keep]
    if len(selected) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
        items[:] = selected
