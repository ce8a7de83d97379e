"""build.executor = "ray": datatrove's RayPipelineExecutor on a local Ray instance (2 CPUs).

Its dataset is the local executor's byte for byte; a resume redoes only the tasks without a
completion marker (whichever executor ran the others); a task's bad input is the same one-line
error as with the local executor. Skipped where ray is not installed (`pip install 'gristmill[ray]'`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.build import BuildError, build
from pipelines.config import DataConfig
from tests.test_build_errors import assert_task_failure_is_one_error
from training.config_loader import load_config

QUIET = {"log": lambda *a: None}
# datatrove 0.10 passes placement_group= to Ray's .options(), deprecated since Ray 2.x; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:placement_group.* parameter is deprecated:DeprecationWarning")


# Fields that say where and when, not what: the only differences allowed between two builds.
VOLATILE = {"dataset.json": {"created"}, "validation.json": {"root", "checked_at", "seconds"}}


def assert_same_dataset(a: Path, b: Path) -> None:
    """Every file the build writes outside logs/ is identical (build.json too: the executor is not
    part of the config hash), the JSON reports up to their VOLATILE fields."""

    def files(root: Path) -> list[str]:
        skip = {"logs", "config.toml", ".build.lock"}  # config.toml: output and executor differ
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
            got, want = (json.loads((d / name).read_text()) for d in (a, b))
            assert {k: v for k, v in got.items() if k not in VOLATILE[name]} == {
                k: v for k, v in want.items() if k not in VOLATILE[name]
            }, name
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_cli_build_on_its_own_ray_instance_equals_local(built_dataset, build_fixture, tmp_path):
    # build.ray.address = "local" (the default): the build starts a Ray instance and stops it.
    pytest.importorskip("ray")
    _, _, config = build_fixture
    out = tmp_path / "ds"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.build", "--config", str(config), "--set", f"output={out}"]
        + ["--set", "build.executor=ray"],
        cwd=tmp_path,  # the Ray workers import gristmill as installed, not from the cwd
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[build] 2 tasks on Ray at " in proc.stdout and "(2 CPUs, 1 per task)" in proc.stdout
    assert re.search(r"^  validation +OK ", proc.stdout, re.M), proc.stdout
    # Quiet as the local executor: task logs in their files (copied from the Ray node), not here.
    assert "Launching pipeline" not in proc.stderr, proc.stderr[-3000:]
    for rank in (0, 1):
        assert "Processing done for rank=" in (out / "logs" / "logs" / f"task_{rank:05d}.log").read_text()
    assert_same_dataset(out, built_dataset)


@pytest.fixture(scope="module")
def ray_instance():
    """One Ray instance for the in-process builds below; build() uses it as it is connected."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_resumes_a_local_build_redoing_only_unfinished_tasks(
    ray_instance, built_dataset, build_fixture, tmp_path
):
    # A local build whose task 1 never finished (no completion marker, no shards, no
    # dataset.json) is resumed with the Ray executor: executor is not part of the config hash.
    _, _, config = build_fixture
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    (out / "logs" / "completions" / "00001").unlink()
    (out / "dataset.json").unlink()
    for p in (out / "shards").glob("00001_*"):
        p.unlink()
    executor_log = out / "logs" / "executor.log"
    executor_log.unlink(missing_ok=True)
    task0_log = (out / "logs" / "logs" / "task_00000.log").read_bytes()

    cfg = load_config(DataConfig, config, [f"output={out}", "build.executor=ray"])
    lines: list[str] = []
    result = build(cfg, log=lines.append)
    assert result.ok and result.status == "complete", lines
    assert "resuming" in lines[0] and "1/2 tasks already complete" in lines[0]
    assert "Will run pipeline on 1 incomplete ranks out of 2 total" in executor_log.read_text()
    assert (out / "logs" / "logs" / "task_00000.log").read_bytes() == task0_log  # task 0 not rerun
    assert_same_dataset(out, built_dataset)

    # Complete: a rerun only revalidates, with either executor.
    before = {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    lines.clear()
    assert build(cfg, log=lines.append).ok
    assert "already complete" in lines[0]
    assert {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == before


def test_task_failure_on_ray_is_the_local_error(ray_instance, build_fixture, tmp_path, capsys):
    # The task's exception reaches the driver (datatrove's Ray executor only logs it).
    assert_task_failure_is_one_error(capsys, build_fixture[2], tmp_path, "build.executor=ray")


def test_ray_executor_without_ray_names_the_extra(build_fixture, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees where it is not installed
    cfg = load_config(DataConfig, build_fixture[2], [f"output={tmp_path / 'o'}", "build.executor=ray"])
    with pytest.raises(BuildError, match=r"pip install 'gristmill\[ray\]'"):
        build(cfg, **QUIET)
    assert not (tmp_path / "o").exists()  # refused before anything was written
