"""The layout of tests/: a test module imports shared code from tests/helpers/, never from another
test module or a conftest.py (pytest loads those itself; importing one ties a test to whichever
tests happen to sit beside it, and a move of one test module breaks the others)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.tiers import group_of, tier_of

ROOT = Path(__file__).resolve().parents[1]


def forbidden(module: str) -> bool:
    """`tests.<...>.test_*` or `tests[.<...>].conftest`, or anything inside one."""
    parts = module.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts[1:])


def imported_modules(node: ast.AST, package: list[str]) -> list[str]:
    """The modules an import statement names (for `from M import a`: M and M.a, either may be one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = package[: len(package) - node.level + 1] if node.level else []
    module = ".".join(base + ([node.module] if node.module else []))
    return [module] + [f"{module}.{alias.name}" for alias in node.names]


def bad_imports(path: Path) -> list[str]:
    package = list(path.relative_to(ROOT).parent.parts)
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        hits = [m for m in imported_modules(node, package) if forbidden(m)]
        if hits:
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {hits[0]}")
    return bad


def test_no_test_module_imports_another_test_module_or_a_conftest():
    bad = [line for path in sorted((ROOT / "tests").rglob("test_*.py")) for line in bad_imports(path)]
    assert not bad, "shared test code belongs in tests/helpers/ (see its __init__.py):\n" + "\n".join(bad)


# What starts processes: a subprocess, a forked trainer, torchrun, a data build (its workers), a
# mixture search. A module that does is in the process tier (`make test` runs it second).
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\.(run|Popen|check_call|check_output)\(|\bforked\.(run|popen)\(|\btorchrun_cmd\(|"
    r"(?<![\w.])build\(|\brun_build\(|\bpropose\("
)


def test_a_module_that_starts_processes_is_in_the_process_tier():
    unmarked = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if STARTS_PROCESSES.search(path.read_text()) and tier_of(path) != "process"
    ]
    assert not unmarked, "these start processes: set `pytestmark = pytest.mark.process`:\n" + "\n".join(
        unmarked
    )


def test_a_module_marked_xdist_group_is_read_as_one_group():
    """tests/conftest.py's scheduler reads the group from the module's source (the xdist controller
    imports no test module): a mark it cannot read would spread the module over both workers again,
    silently."""
    modules = set((ROOT / "tests").rglob("test_*.py")) - {Path(__file__)}
    marked = sorted(p for p in modules if "xdist_group(" in p.read_text())
    assert marked and group_of(ROOT / "tests" / "pipelines" / "test_build_ray.py") == "ray"
    unread = [str(p.relative_to(ROOT)) for p in marked if group_of(p) is None]
    assert not unread, "write pytestmark = [..., pytest.mark.xdist_group('NAME')] in:\n" + "\n".join(unread)
    assert group_of(ROOT / "tests" / "test_docs.py") is None
