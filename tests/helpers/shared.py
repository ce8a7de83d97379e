"""Artifacts the whole test run builds once: the first pytest-xdist worker to ask builds one under a
file lock, in a folder all workers of the run share, and every other test reads it.

Each artifact's folder is named by what it is built from (a synthetic dataset by its documents,
vocabulary and seed), so two modules asking for the same thing share it, and different things never
collide. The folder lives only as long as the run (`make test`'s two tiers share one): a change to
the code that builds an artifact is always built again.

Training runs are artifacts too (`Shared.run`): a reference run several tests (or modules) compare
against is trained once per test run, keyed by everything that defines it, not once per module and
xdist worker.

Shared artifacts are read-only. Each is fingerprinted (every file's path, size and sha256) when
built, and `Shared.check_unchanged` compares the fingerprints at the end of the session: a test that
wrote into one fails the run there, naming the artifact and the files (copy one before damaging it).
An edit undone before the end leaves the bytes as built, but a test on another xdist worker may have
copied the artifact meanwhile and trained on the edit (a CI failure: test_init_from's base).
`Shared.check_untouched`, after each test module, compares every file's size and modification time
with what they were when this worker first used the artifact: a write, even one undone, fails there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, TypeVar

from filelock import FileLock

D = TypeVar("D")
PLACEHOLDER_RUN = Path("/RUN")  # the run directory a run's key is computed with


def fingerprint(folder: Path) -> dict[str, str]:
    """{relative path: "size sha256"} of every file under `folder`."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        out[str(path.relative_to(folder))] = (
            f"{path.stat().st_size} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        )
    return out


class Shared:
    made: ClassVar[list[Shared]] = []  # this process's stores, checked after each test module

    def __init__(self, root: Path):
        self.root = root
        self.used: dict[str, Path] = {}
        self._stats: dict[str, dict[str, tuple[int, int]]] = {}  # key: {file: (size, mtime_ns)} at first use
        root.mkdir(parents=True, exist_ok=True)
        Shared.made.append(self)

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
        if key not in self._stats:
            self._stats[key] = _stats(path)
        return path

    def run(self, label: str, define: Callable[[Path], D], train: Callable[[D, Path], object]) -> Path:
        """The directory of a training run trained once per test run: `define(run_dir)` is all that
        defines it (its overrides or recipe text, and any fault's environment), `train(definition,
        run_dir)` trains it; text it returns (its output) is kept beside it (`run_output`). Keyed by
        `label` (how it is launched: "1-process", "torchrun-2") and the definition written for a
        placeholder directory, so two tests share a run only when theirs are the same run."""
        digest = hashlib.sha256(
            json.dumps([label, define(PLACEHOLDER_RUN)], default=str).encode()
        ).hexdigest()

        def build(folder: Path) -> None:
            folder.mkdir(parents=True)
            out = train(define(folder / "run"), folder / "run")
            if isinstance(out, str):
                (folder / "output.txt").write_text(out)

        return self.get(f"run-{label}-{digest[:16]}", build) / "run"

    def check_untouched(self) -> None:
        """No file of an artifact this worker used was written since its first use, even with its bytes
        put back (its size and modification time); a test of another worker may be the writer."""
        touched = []
        for key, path in self.used.items():
            now = _stats(path)
            if now != self._stats[key]:
                touched.append(_differing(path, self._stats[key], now))
                self._stats[key] = now  # said once
        assert not touched, (
            "a test wrote into a shared artifact, if only for a while (copy it first: a test on another "
            "worker may copy it meanwhile):\n" + "\n".join(touched)
        )

    def check_unchanged(self) -> None:
        """Every artifact this worker used is still what it was built as."""
        changed = []
        for key, path in self.used.items():
            with FileLock(str(self.root / f"{key}.lock")):
                want = json.loads((self.root / f"{key}.fingerprint.json").read_text())
                got = fingerprint(path)
            if got != want:
                changed.append(_differing(path, want, got))
        assert not changed, "a test wrote into a shared artifact (copy it first):\n" + "\n".join(changed)


def _differing(folder: Path, before: dict, now: dict) -> str:
    """`folder: file, file, …`: the files (up to five) whose record differs between the two listings."""
    files = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    return f"{folder}: {', '.join(files[:5])}{' …' if len(files) > 5 else ''}"


def _stats(folder: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under `folder` but its lock files: whoever takes
    a dataset's lock opens .build.lock for writing (a build run again on a complete output, which
    writes nothing else), and no one reads a lock's bytes."""
    out = {}
    for path in folder.rglob("*"):
        if path.is_file() and path.suffix != ".lock":
            st = path.stat()
            out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def run_output(run_dir: Path) -> str:
    """What a shared run's `train` returned (its stdout, say)."""
    return (run_dir.parent / "output.txt").read_text()


SHARED_ENV = "GRISTMILL_TEST_SHARED"


def shared_root(basetemp: Path) -> Path:
    """The folder every worker of this run shares: $GRISTMILL_TEST_SHARED when set (`make test`
    sets it to a fresh folder for its two tiers, removed after them), else under the run's own
    temporary root (pytest-xdist gives each worker basetemp/popen-gwN there)."""
    if os.environ.get(SHARED_ENV):
        return Path(os.environ[SHARED_ENV])
    return (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "shared"
