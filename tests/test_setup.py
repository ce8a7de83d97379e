"""`make setup`'s install after torch (tools/uv_install.py): uv reads no pip.conf, so it is handed pip's
own settings, and a user's pip configuration (indexes, find-links, constraints) applies to uv as it
does to pip; a version whose files differ between indexes (uv takes the first index's, pip the best of
all) is found, for pip to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]


def _wheel(folder: Path, name: str, version: str, python: str = "py3", code: str = "") -> None:
    """An empty pure-Python wheel for `python` (a tag such as py3 or py310): enough for a resolver to
    pick a version, and an installer a file."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": code,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {python}-none-any\n",
    }
    with zipfile.ZipFile(folder / f"{name}-{version}-{python}-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{dist}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"]))


def _index(folder: Path, *versions: str, python: str = "py3", code: str = "") -> str:
    """A simple (PEP 503) index on disk holding gristmill-probe at `versions` (wheels for `python`);
    its URL."""
    project = folder / "simple" / "gristmill-probe"
    project.mkdir(parents=True)
    for version in versions:
        _wheel(project, "gristmill_probe", version, python, code)
    links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (folder / "simple").as_uri()


def _pip_env(tmp_path: Path, settings: dict[str, str]) -> dict[str, str]:
    """This environment with pip configured by `settings` alone (this machine's pip.conf files and
    PIP_* and UV_* variables left out), uv's cache in `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return env | {"PIP_CONFIG_FILE": os.devnull, "UV_CACHE_DIR": str(tmp_path / "uv-cache"), **settings}


def _uv_step(tmp_path: Path, settings: dict[str, str], *args: str) -> str:
    """tools/uv_install.py run with `args` and pip configured by `settings`; its standard error."""
    pytest.importorskip("uv", reason="a venv made before make setup installed uv")
    cmd = [sys.executable, str(ROOT / "tools" / "uv_install.py"), *args]
    run = subprocess.run(cmd, env=_pip_env(tmp_path, settings), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stderr


def _picked(tmp_path: Path, settings: dict[str, str]) -> str:
    """What the uv step would install of gristmill-probe with pip configured by `settings`."""
    said = _uv_step(tmp_path, settings, "--dry-run", "gristmill-probe")
    return next((w for w in said.split() if w.startswith("gristmill-probe==")), said)


def test_uv_is_handed_pip_s_find_links_constraints_and_no_index(tmp_path: Path):
    links = tmp_path / "links"
    links.mkdir()
    for version in ("1.0", "2.0"):
        _wheel(links, "gristmill_probe", version)
    (tmp_path / "constraints.txt").write_text("gristmill-probe<2\n")
    settings = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    assert (
        _picked(tmp_path, {**settings, "PIP_CONSTRAINT": str(tmp_path / "constraints.txt")})
        == "gristmill-probe==1.0"
    )
    # --no-index handed over: pip's index (3.0 there) is not read
    newer = _index(tmp_path / "newer", "3.0")
    assert _picked(tmp_path, {**settings, "PIP_INDEX_URL": newer}) == "gristmill-probe==2.0"


def test_uv_reads_pip_s_indexes_and_none_of_its_own_settings(tmp_path: Path):
    """pip's index and extra index are uv's; an index a user set for uv elsewhere (UV_EXTRA_INDEX_URL)
    and a uv.toml (resolution = "lowest") are not read: the install is the one pip would make (review
    RV28d M1)."""
    empty, index, users = (
        _index(tmp_path / "e"),
        _index(tmp_path / "i", "2.0", "3.0"),
        _index(tmp_path / "u", "4.0"),
    )
    assert _picked(tmp_path, {"PIP_INDEX_URL": empty, "PIP_EXTRA_INDEX_URL": index}) == "gristmill-probe==3.0"
    home = tmp_path / "home"
    (home / ".config" / "uv").mkdir(parents=True)
    (home / ".config" / "uv" / "uv.toml").write_text('resolution = "lowest"\n')
    for own in ({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}, {"UV_EXTRA_INDEX_URL": users}):
        assert _picked(tmp_path, {"PIP_INDEX_URL": index, **own}) == "gristmill-probe==3.0", own


_CHECK = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from uv_install import installed, not_as_pip, uv_command
uv, env, indexes = uv_command()
import subprocess
subprocess.run([*uv, "-q", "--no-deps", "--target", sys.argv[2], "gristmill-probe==1.0"], env=env, check=True)
print(indexes, sorted(not_as_pip(installed(Path(sys.argv[2])), ["gristmill-probe==1.0"], 1)))
"""


@pytest.mark.parametrize("case", ["older wheel first", "older wheel second", "same name, other bytes"])
def test_a_version_whose_files_differ_between_indexes_is_found_for_pip_to_install(tmp_path, case):
    """uv reads a version's files from the first index listing it, pip takes the best of all: a mirror
    holding a version's wheel for an older Python only (this machine's mirror holds multiprocess
    0.70.19 for py310 alone, whose code breaks on 3.11: every build under uv failed) gave uv that
    wheel, as pip's index or as an extra one, whichever index came first (review RV30a F1); a private
    index's rebuild under the public file's name, uv the first index's (RV30a B, RV30b F4: the bytes
    compared, not RECORD's claims). The install with another index first finds the version, which pip
    then installs; where both indexes hold the same file, nothing is found."""
    pytest.importorskip("uv", reason="a venv made before make setup installed uv")
    own = f"py{sys.version_info.major}{sys.version_info.minor}"
    index = _index(tmp_path / "i", "1.0", python=own)
    if case == "same name, other bytes":
        first, extra = index, _index(tmp_path / "m", "1.0", python=own, code="PRIVATE = True\n")
    else:
        mirror = _index(tmp_path / "m", "1.0", python="py30")
        first, extra = (mirror, index) if case == "older wheel first" else (index, mirror)
    same = _index(tmp_path / "s", "1.0", python=own)
    shutil.copy(next((tmp_path / "i").rglob("*.whl")), next((tmp_path / "s").rglob("*.whl")))
    for settings, found in (
        ({"PIP_INDEX_URL": first, "PIP_EXTRA_INDEX_URL": extra}, ["gristmill-probe==1.0"]),
        ({"PIP_INDEX_URL": index, "PIP_EXTRA_INDEX_URL": same}, []),
    ):
        target = tmp_path / f"target-{len(found)}"
        cmd = [sys.executable, "-c", _CHECK, str(ROOT / "tools"), str(target)]
        run = subprocess.run(cmd, env=_pip_env(tmp_path, settings), capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split(maxsplit=1) == ["2", f"{found}\n"], run.stdout
