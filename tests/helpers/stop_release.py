"""`python -m tests.helpers.stop_release RANK PORT`: one rank of a two-rank job whose rank 0 hosts the
job's c10d store itself (a tcp:// init, as a caller of the trainer without torchrun's agent has; the
server torch's USE_LIBUV picks), through two runs' GracefulStops, as two loops would make them:
- in the first, rank 1's loop ends while rank 0's goes on: that wakes rank 0's waiter, and is no stop;
- in the second, rank 1 gets a SIGTERM while its main thread is blocked in a gloo collective (as in
  the step's agreement), so that only the wakeup fd tells its poster; rank 0 must hear of it through
  the store; then a second SIGTERM, after which the poster must not spin.
Exit 1, with a line, where one of these fails, where the posted stop was written over, or where any of
the stop's threads outlived its GracefulStop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed import distributed_c10d

from training.contract.object_store import STOP_FETCHING
from training.run.shutdown import GracefulStop


def _cpu_s(thread: threading.Thread) -> float:
    """CPU seconds a thread of this process used so far (/proc)."""
    fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    wrong = []
    with GracefulStop(rank, 2):  # rank 1's loop ends first
        if rank == 0:
            dist.barrier()  # rank 1 is out of its loop: its end woke this rank's waiter
            time.sleep(0.5)
            if STOP_FETCHING.is_set():
                wrong.append("rank 1's loop end was taken for a stop")
    if rank == 1:
        dist.barrier()
    with GracefulStop(rank, 2) as stop:
        if rank == 1:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        elif not STOP_FETCHING.wait(30):
            wrong.append("rank 0 did not hear rank 1's stop")
        dist.barrier(group=stop.group)  # rank 1 is blocked here as its signal comes
        if rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one
            (poster,) = [t for t in threading.enumerate() if t.name == "gristmill-stop-post"]
            before = _cpu_s(poster)
            time.sleep(1.0)
            if (spent := _cpu_s(poster) - before) > 0.3:
                wrong.append(f"the poster spun after a second SIGTERM ({spent:.2f} CPU s in 1 s)")
        dist.barrier(group=stop.group)
    left = [t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")]
    if left:
        wrong.append(f"{', '.join(left)} outlived the stop")
    posted = distributed_c10d._get_default_store().get(stop._stop_key).decode()
    if posted != str(int(signal.SIGTERM)):
        wrong.append(f"the posted stop reads {posted!r}")
    dist.barrier()
    dist.destroy_process_group()
    if wrong:
        sys.exit(f"rank {rank}: {'; '.join(wrong)}")


if __name__ == "__main__":
    main()
