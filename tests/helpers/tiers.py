"""The suite's two tiers: a test module that starts processes (a subprocess, a forked run, torchrun,
a build's workers) says so with `pytestmark = pytest.mark.process` and runs in the second tier of
`make test`; every other module runs in the first, in-process tier. `pytest --tier NAME` runs one
tier and imports none of the other's modules (tests/conftest.py); tests/test_test_layout.py checks
that a module that starts processes carries the mark."""

from __future__ import annotations

import ast
from pathlib import Path

TIERS = ("in-process", "process")


def marks_process(tree: ast.Module) -> bool:
    """The module sets `pytestmark` (its last assignment) to (a list holding) `pytest.mark.process`."""
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
    ]
    return bool(values) and "pytest.mark.process" in ast.unparse(values[-1])


def tier_of(module: Path) -> str:
    return "process" if marks_process(ast.parse(module.read_text(encoding="utf-8"))) else "in-process"
