"""`make setup`'s install after torch: uv reads no pip.conf, so the Makefile's PIP_TO_UV hands it pip's
own settings, and a user's pip configuration (indexes, find-links, constraints) applies to uv as it
does to pip."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]


def _wheel(folder: Path, name: str, version: str) -> None:
    """An empty pure-Python wheel: enough for a resolver to pick a version."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{dist}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"]))


def test_uv_is_handed_pip_s_find_links_constraints_and_no_index(tmp_path: Path):
    pytest.importorskip("uv", reason="a venv made before make setup installed uv")
    show = "include Makefile\nshow:\n\t@echo '$(PIP_TO_UV)'\n"
    code = subprocess.run(
        ["make", "-s", "-f", "-", "show"], input=show, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    links = tmp_path / "links"
    links.mkdir()
    for version in ("1.0", "2.0"):
        _wheel(links, "gristmill_probe", version)
    (tmp_path / "constraints.txt").write_text("gristmill-probe<2\n")
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,  # this machine's pip.conf files left out: only the settings below
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
        "PIP_CONSTRAINT": str(tmp_path / "constraints.txt"),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }
    run = subprocess.run(
        [sys.executable, "-c", code, "--dry-run", "gristmill-probe"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "gristmill-probe==1.0" in run.stderr, run.stderr
