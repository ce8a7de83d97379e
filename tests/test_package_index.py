"""Every package's `__init__.py` is its index: it names each of its modules and subpackages, so a
reader finds where a thing lives from the package down (a module added without a line fails here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    p.parent
    for top in ("pipelines", "tokenization", "training", "validation", "tests/helpers")
    for p in (ROOT / top).rglob("__init__.py")
)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_init_names_every_module(package: Path):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    members = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = [m for m in sorted(members) if not re.search(rf"(?<![\w.]){re.escape(m)}(\.py|/|\b)", doc)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not name {', '.join(missing)}"
