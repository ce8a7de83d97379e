"""Where a build's datatrove logs go: under OUTPUT/logs/, not the terminal (`-v` keeps them there).

datatrove logs through loguru to stderr: per task its pipeline, every input file and a stats
block, and at the end the stats of all tasks again (70-120 lines for the 4-task demo). The
terminal gets the build's own progress line and end table instead. Task logs stay where
datatrove writes them (OUTPUT/logs/logs/task_NNNNN.log); what the driver process logs (skipped
tasks, the stats of all tasks) goes to OUTPUT/logs/executor.log.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from datatrove.utils.logging import DATATROVE_COLORIZE_LOGS, logger

from pipelines.local_executor import WatchedLocalExecutor

EXECUTOR_LOG = "executor.log"


@contextlib.contextmanager
def loguru_to(path: str | Path | None):
    """Send loguru's stderr output (datatrove's default sink) to `path`, appended; None: discard.

    datatrove (re)adds its sinks with `sys.stderr` when a task starts and ends, so redirecting
    sys.stderr for the duration catches those too; the default sink is restored afterwards.
    """
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    target = os.devnull if path is None else path
    with open(target, "a", buffering=1, encoding="utf-8") as f:
        try:
            with contextlib.redirect_stderr(f):
                _stderr_sink()
                yield
        finally:
            _stderr_sink()


def _stderr_sink() -> None:
    """loguru's one sink, writing to whatever sys.stderr is at the time of each message (datatrove
    binds the stream object, which breaks once a redirection or a test's capture has closed it)."""
    logger.remove()
    logger.add(lambda message: sys.stderr.write(message), colorize=DATATROVE_COLORIZE_LOGS)


class QuietLocalExecutor(WatchedLocalExecutor):
    """WatchedLocalExecutor whose tasks log only to their task log file, not to the terminal.

    Each task runs inside `loguru_to(None)`: datatrove's stderr sink goes nowhere while its file
    sink (logs/logs/task_NNNNN.log) keeps everything. With workers = 1 the tasks run in the
    driver process, inside the driver's own redirection, which is restored afterwards.
    """

    def _launch_run_for_rank(self, rank: int, ranks_q, completed=None, completed_lock=None):
        with loguru_to(None):
            return super()._launch_run_for_rank(rank, ranks_q, completed, completed_lock)
