"""The suite's two tiers: a test module that starts processes (a subprocess, a forked run, torchrun,
a build's workers) says so with `pytestmark = pytest.mark.process` and runs in the second tier of
`make test`; every other module runs in the first, in-process tier. `pytest --tier NAME` runs one
tier and imports none of the other's modules (tests/conftest.py); tests/test_test_layout.py checks
that a module that starts processes carries the mark.

A module whose pytestmark also holds `pytest.mark.xdist_group("NAME")` runs all its tests on one
xdist worker (`group_of`; `--dist loadgroup`, given by the Makefile), so that its module-scoped
servers and builds start once per run, not once per worker."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

TIERS = ("in-process", "process")


def pytestmark_source(tree: ast.Module) -> str:
    """The value of the module's (last) `pytestmark = …` assignment as source, "" if it has none."""
    values = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
    ]
    return ast.unparse(values[-1]) if values else ""


def marks_process(tree: ast.Module) -> bool:
    """The module sets `pytestmark` to (a list holding) `pytest.mark.process`."""
    return "pytest.mark.process" in pytestmark_source(tree)


@functools.cache
def group_of(module: Path) -> str | None:
    """NAME where the module's pytestmark holds `pytest.mark.xdist_group('NAME')`, else None. Read
    by the xdist controller, which imports no test module (tests/conftest.py's scheduler)."""
    if not module.is_file():
        return None
    found = re.search(
        r"pytest\.mark\.xdist_group\('([^']+)'\)", pytestmark_source(ast.parse(module.read_text()))
    )
    return found[1] if found else None


def tier_of(module: Path) -> str:
    return "process" if marks_process(ast.parse(module.read_text(encoding="utf-8"))) else "in-process"
