"""Artifacts the whole test run builds once: the first pytest-xdist worker to ask builds one under a
file lock, in a folder all workers of the run share, and every other test reads it.

Each artifact's folder is named by what it is built from (a synthetic dataset by its documents,
vocabulary and seed), so two modules asking for the same thing share it, and different things never
collide. The folder lives only as long as the run (`make test`'s two tiers share one): a change to
the code that builds an artifact is always built again.

Shared artifacts are read-only. Each is fingerprinted (every file's path, size and sha256) when
built, and `Shared.check_unchanged` compares the fingerprints at the end of the session: a test that
wrote into one fails the run there, naming the artifact and the files (copy one before damaging it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def fingerprint(folder: Path) -> dict[str, str]:
    """{relative path: "size sha256"} of every file under `folder`."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out[str(path.relative_to(folder))] = (
            f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        )
    return out


class Shared:
    def __init__(self, root: Path):
        self.root = root
        self.used: dict[str, Path] = {}
        root.mkdir(parents=True, exist_ok=True)

    def get(self, key: str, build: Callable[[Path], object]) -> Path:
        """The folder of artifact `key`, built by `build(folder)` if no worker has built it yet (in
        place: artifacts may record their own paths; complete once its fingerprint is written)."""
        path, done = self.root / key, self.root / f"{key}.fingerprint.json"
        with FileLock(str(self.root / f"{key}.lock")):
            if not done.exists():
                shutil.rmtree(path, ignore_errors=True)  # a build cut short
                build(path)
                done.write_text(json.dumps(fingerprint(path)))
        self.used[key] = path
        return path

    def check_unchanged(self) -> None:
        """Every artifact this worker used is still what it was built as."""
        changed = []
        for key, path in self.used.items():
            with FileLock(str(self.root / f"{key}.lock")):
                want = json.loads((self.root / f"{key}.fingerprint.json").read_text())
                got = fingerprint(path)
            if got != want:
                files = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
                changed.append(f"{path}: {', '.join(files[:5])}{' …' if len(files) > 5 else ''}")
        assert not changed, "a test wrote into a shared artifact (copy it first):\n" + "\n".join(changed)


SHARED_ENV = "GRISTMILL_TEST_SHARED"


def shared_root(basetemp: Path) -> Path:
    """The folder every worker of this run shares: $GRISTMILL_TEST_SHARED when set (`make test`
    sets it to a fresh folder for its two tiers, removed after them), else under the run's own
    temporary root (pytest-xdist gives each worker basetemp/popen-gwN there)."""
    if os.environ.get(SHARED_ENV):
        return Path(os.environ[SHARED_ENV])
    return (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "shared"
