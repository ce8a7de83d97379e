"""Build progress: tasks write progress files, the driver's monitor sums them into one line."""

from __future__ import annotations

import json

from pipelines.progress import Monitor, TaskProgress


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


def test_output_is_flushed_line_by_line_so_a_killed_command_keeps_its_last_lines(tmp_path):
    import os
    import subprocess
    import sys

    code = (
        "import os, signal; from pipelines.cli import main; "
        f"main(['data', 'validate', '{tmp_path / 'missing'}']); print('the last line'); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as in a user's shell
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == -9
    assert "is not a directory" in proc.stderr and proc.stdout == "the last line\n"
