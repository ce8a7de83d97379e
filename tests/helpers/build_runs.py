"""Runs of the data build for the pipeline tests: `python -m pipelines.build` in its own process
group, the `gristmill data build` argv and its one error line, a task failure that must end in one
error line, two builds' outputs compared file by file, and a build killed with kill -9 whose
processes must all end with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zstandard

from pipelines.cli import main
from tests.helpers import forked

ROOT = Path(__file__).resolve().parents[2]


def run_build(
    config: Path, out: Path, env_extra: dict[str, str] | None = None, *args: str, fork: bool = False
) -> subprocess.CompletedProcess:
    """`fork`: forked from the preloaded server (tests/helpers/forked.py), for a test about what the
    build does rather than how a fresh interpreter starts it: the same process of its own, without
    the ~3 s of imports."""
    env = {**os.environ, **(env_extra or {})}
    return (forked.run if fork else subprocess.run)(
        [sys.executable, "-m", "pipelines.build", "--config", str(config), "--set", f"output={out}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,  # its own process group: the kill takes the driver and its workers
    )


def one_error(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err  # one line, no traceback
    return lines[0]


def build_argv(config, out, *overrides) -> list[str]:
    argv = ["data", "build", "--config", str(config), "--set", f"output={out}"]
    for o in overrides:
        argv += ["--set", o]
    return argv


def assert_task_failure_is_one_error(capsys, config: Path, tmp_path: Path, *overrides: str) -> None:
    """A one-task build of a truncated jsonl file (it lists fine and fails only once a task reads
    it) ends with one error line naming the file, no traceback and no dataset.json."""
    lines = [json.dumps({"text": f"Document {i} about rivers. " * 10, "id": f"d{i}"}) for i in range(400)]
    data = zstandard.ZstdCompressor().compress("\n".join(lines).encode())
    src = tmp_path / "src" / "cut.jsonl.zst"
    src.parent.mkdir()
    src.write_bytes(data[: len(data) // 2])
    overrides = ("source.kind=jsonl", f"source.path={src.parent}", "build.tasks=1", *overrides)
    capsys.readouterr()
    assert main(build_argv(config, tmp_path / "o", *overrides)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {src} cannot be read as jsonl"), last
    assert not (tmp_path / "o" / "dataset.json").exists()


# Fields that say where and when, not what: the only differences allowed between two builds.
VOLATILE = {"dataset.json": {"created"}, "validation.json": {"root", "checked_at", "seconds"}}


def assert_same_dataset(a: Path, b: Path) -> None:
    """Every file the build writes outside logs/ is identical (build.json too: the executor is not
    part of the config hash), the JSON reports up to their VOLATILE fields."""

    skip = {"logs", "config.toml", ".build.lock"}  # config.toml: output and executor differ

    def files(root: Path) -> list[str]:
        return sorted(
            str(p.relative_to(root))
            for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] not in skip
        )

    names = files(a)
    assert names == files(b)
    assert {"shards", "manifest", "excluded", "index", "tokenizer.json", "dataset.json", "build.json"} <= {
        Path(n).parts[0] for n in names
    }
    for name in names:
        if name in VOLATILE:
            got, want = (
                {k: v for k, v in json.loads((d / name).read_text()).items() if k not in VOLATILE[name]}
                for d in (a, b)
            )
            if name == "validation.json":  # the files' versions: their sizes (mtimes, ETags differ)
                for report in (got, want):
                    for key in ("shard_versions", "file_versions"):
                        report[key] = {k: v.split()[0] for k, v in report[key].items()}
            if (
                name == "dataset.json"
            ):  # the hashes it records of the files compared above, not of skipped ones
                for info in (got, want):
                    info["files"] = {
                        k: v for k, v in info.get("files", {}).items() if Path(k).parts[0] not in skip
                    }
            assert got == want, name
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _parked(staging: Path) -> bool:
    """Whether task 1 has a shard half-written under `staging`. A task that finishes removes its own
    work folder, which an rglob walking it then meets gone (FileNotFoundError: the CI path, once)."""
    try:
        return bool(list(staging.rglob("00001_*.tar.tmp")))
    except FileNotFoundError:
        return False


def assert_kill_9_leaves_no_process(
    config: Path, staging: Path, env: dict[str, str], *sets: str, started_at_least: int = 3
) -> None:
    """`python -m pipelines.build` (in a session of its own) is killed with SIGKILL, itself alone,
    while task 1 is parked mid-shard in `staging` (the output, or a bucket build's workdir): every
    process it had started (pool workers, datatrove's manager, the forkserver, the resource tracker;
    `started_at_least` of them) is gone within 5 s, checked by PID."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.build", "--config", str(config), "--set", *sets],
        cwd=ROOT,
        env={**env, "GRISTMILL_TEST_KILL": "1:second_shard:hang"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    started: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while not _parked(staging):  # task 1 is parked mid-shard
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        started = [pid for pid in session_processes(proc.pid) if pid != proc.pid]
        # with a pool: the manager, the forkserver, a worker; none with one worker (its tasks in-process)
        assert len(started) >= started_at_least if started_at_least else started == [], started
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while alive := set(started) & set(session_processes(proc.pid)):  # zombies count as ended
            assert time.monotonic() < deadline, f"still running 5 s after kill -9 of the build: {alive}"
            time.sleep(0.05)
    finally:
        proc.kill()
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
