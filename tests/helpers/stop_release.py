"""`python -m tests.helpers.stop_release RANK PORT`: one rank of a two-rank job whose rank 0 hosts the
job's c10d store itself (a tcp:// init, as a caller of the trainer without torchrun's agent has; the
server torch's USE_LIBUV picks). Two runs' GracefulStops, as two loops would make them: the first ends
with no stop; in the second rank 1 gets a SIGTERM and rank 0 must hear of it through the store. Exit 1,
with a line, if rank 0 did not hear it, if the posted stop was overwritten, or if any of the stop's
threads outlived its GracefulStop."""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d

from training.contract.object_store import STOP_FETCHING
from training.run.shutdown import GracefulStop


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    wrong = []
    for stopping in (False, True):
        with GracefulStop(rank, 2) as stop:
            if stopping and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler records it; the poster posts it
            if stopping and rank == 0 and not STOP_FETCHING.wait(30):
                wrong.append("rank 0 did not hear rank 1's stop")
            dist.barrier(group=stop.group)  # both in the loop until here: a stop posted, heard
        left = [t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")]
        if left:
            wrong.append(f"{', '.join(left)} outlived the stop")
        if stopping:
            posted = distributed_c10d._get_default_store().get(stop._stop_key).decode()
            if posted != str(int(signal.SIGTERM)):
                wrong.append(f"the posted stop reads {posted!r}")
    dist.barrier()
    dist.destroy_process_group()
    if wrong:
        sys.exit(f"rank {rank}: {'; '.join(wrong)}")


if __name__ == "__main__":
    main()
