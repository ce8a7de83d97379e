"""Faults a test injects into a real build through the environment. For tests only: never set it
in a real build.

GRISTMILL_TEST_KILL="RANK:POINT": the task of that rank, on reaching the named point, SIGKILLs
its whole process group (the driver and every worker), the way a node failure would, so a test
can check what a rerun makes of what the kill left behind (tests/pipelines/test_build_resume.py,
tests/pipelines/test_dedup.py). `RANK:POINT:self` kills only the task's own process, and
`RANK:POINT:hang` parks it (tests/pipelines/test_build_signals.py). Unset, every call is one
environment lookup. The points:

    second_shard   in the shard writer (pipelines/shard_writer.py), once the task's first shard
                   was renamed and its second is half written
    dedup_pass1    in dedup's first pass (exact: hashes, minhash: signatures), once the task has
                   passed 10 documents on (its signature files half written, its ids not yet)
    dedup_clusters in dedup's clusters stage (rank 0), once task 0's drop table is written and
                   the others are not

A build in whose environment it is set says so before it starts (`fault_warnings`): one left set
in a shell would kill a real build's task without a trace (review R25b 7).

The trainer has its own, training/run/faults.py.
"""

from __future__ import annotations

import os
import signal
import time

KILL = "GRISTMILL_TEST_KILL"


def fault_warnings() -> list[str]:
    """One line when GRISTMILL_TEST_KILL is set in this process's environment (none: [])."""
    if not os.environ.get(KILL):
        return []
    return [
        f"warning: {KILL}={os.environ[KILL]} is set: a test's injected fault, the task of that rank kills "
        "its process group (or itself, or parks) at that point; unset it for a real build"
    ]


def maybe_kill(rank: int, point: str) -> None:
    """SIGKILL the process group here if GRISTMILL_TEST_KILL names this rank and point; with a
    `:self` suffix only this process (a pool worker dying alone, as under the out-of-memory
    killer), with `:hang` this process stops there for 10 minutes (a build to signal mid-run)."""
    spec = os.environ.get(KILL)
    if spec == f"{rank}:{point}":
        os.killpg(0, signal.SIGKILL)
    elif spec == f"{rank}:{point}:self":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec == f"{rank}:{point}:hang":
        time.sleep(600)
