"""Build progress: tasks write progress files, the driver's monitor sums them into one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from pipelines.build import build
from pipelines.config import DataConfig
from pipelines.progress import Monitor, TaskProgress
from training.contract.config_loader import load_config
from validation.audit_reports import PRESETS
from validation.audit_views import connect

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def test_task_progress_and_monitor_line(tmp_path):
    progress, completions = tmp_path / "progress", tmp_path / "completions"
    completions.mkdir()
    monitor = Monitor(progress, completions, tasks=4, total_bytes=1000, interval=60)
    assert monitor.line() is None  # nothing has happened yet
    for rank, (read, tokens, done_bytes) in enumerate([(100, 5000, 200.0), (50, 2500, 100.0)]):
        p = TaskProgress(progress, interval=0)
        p.start(rank)
        p.read, p.kept, p.tokens, p.bytes_done = read, read - 1, tokens, done_bytes
        p.flush(log=False)
    (completions / "00003").touch()
    state = json.loads((progress / "00001.json").read_text())
    assert state["read"] == 50 and state["kept"] == 49 and state["phase"] == "reading"
    line = monitor.line()
    assert line.startswith("[build] tasks 1/4 done | 150 docs read")
    assert "7.5k tokens" in line and "tok/s" in line and "docs/s" in line
    assert "30% of input" in line and "ETA" in line


def test_a_monitor_with_source_limit_counts_documents_not_bytes(tmp_path):
    """With source.limit each task stops early, its files never read to their end: the bytes read said
    "0% of input" until the build ended (trial RV71e 11). Each task by its documents read of the limit,
    a finished one whole (its files may hold fewer: review RV72d F9)."""
    progress, completions = tmp_path / "progress", tmp_path / "completions"
    completions.mkdir()
    monitor = Monitor(progress, completions, tasks=2, total_bytes=10**9, interval=60, limit=100)
    p = TaskProgress(progress, interval=0)
    p.start(0)
    p.read, p.tokens, p.bytes_done = 50, 500, 1000.0
    p.flush(log=False)
    line = monitor.line()
    assert "25% of input" in line and "ETA" in line, line
    (completions / "00001").touch()  # task 1 ran out of documents before its limit: done, whole
    monitor.t0 -= 100  # 50 documents read in 100 s: task 0's 50 left take 100 s more, at most; the
    # tasks' share done (75%) said 33 s, a task ending at once making it ten times too short (RV72e F9)
    line = monitor.line()
    assert "75% of input" in line and "ETA 1m40s" in line, line


def test_resumed_monitor_counts_tasks_finished_earlier(tmp_path):
    progress, completions = tmp_path / "progress", tmp_path / "completions"
    completions.mkdir()
    for rank, read in ((0, 300), (1, 70)):  # an earlier run: task 0 finished, task 1 was killed
        p = TaskProgress(progress, interval=0)
        p.start(rank)
        p.read, p.tokens, p.bytes_done = read, 10 * read, 5.0 * read
        p.flush(log=False)
        state = json.loads((progress / f"{rank:05d}.json").read_text())
        (progress / f"{rank:05d}.json").write_text(json.dumps({**state, "time": state["time"] - 3600}))
    (completions / "00000").touch()
    monitor = Monitor(progress, completions, tasks=2, total_bytes=3000, interval=60)
    p = TaskProgress(progress, interval=0)  # task 1 redone in this run
    p.start(1)
    p.read, p.tokens, p.bytes_done = 20, 200, 100.0
    p.flush(log=False)
    line = monitor.line()
    assert line.startswith("[build] tasks 1/2 done | 320 docs read"), line  # 300 earlier + 20 now
    assert "3.2k tokens" in line and "53% of input" in line, line


def test_end_table_gives_the_audit_summary_numbers(built_dataset, build_fixture, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)  # the shared one is read-only: a rerun revalidates
    lines: list[str] = []
    assert build(load_config(DataConfig, build_fixture[2], [f"output={out}"]), log=lines.append).ok
    table = {}
    for row in "\n".join(lines).splitlines()[1:]:
        label, value = re.match(r"  (\S.*?) {2,}(\S+)", row).groups()
        table[label] = value
    con, _ = connect([out])
    summary = {r[1]: r[2:] for r in con.execute(PRESETS["summary"]).fetchall()}
    con.close()
    assert int(table["read"].replace(",", "")) == summary["read"][0]
    assert int(table["kept"].replace(",", "")) == summary["kept (manifest)"][0]
    assert int(table["tokens"].replace(",", "")) == summary["kept (manifest)"][2]
    assert int(table["shards"]) == summary["shards"][0]
    dropped = {k.removeprefix("dropped by "): v[0] for k, v in summary.items() if k.startswith("dropped by")}
    assert {
        k.removeprefix("excluded by "): int(v) for k, v in table.items() if k.startswith("excluded by")
    } == dropped
    assert list(table)[:2] == ["read", "excluded by text"] and table["validation"] == "OK"


def test_output_is_flushed_line_by_line_so_a_killed_command_keeps_its_last_lines(tmp_path):
    code = (
        "import os, signal; from pipelines.cli import main; "
        f"main(['data', 'validate', '{tmp_path / 'missing'}']); print('the last line'); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as in a user's shell
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == -9
    assert "is not a directory" in proc.stderr and proc.stdout == "the last line\n"
