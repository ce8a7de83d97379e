"""`python -m tests.helpers.stop_release RANK PORT`: one rank of a two-rank job whose rank 0 hosts the
job's c10d store itself (a tcp:// init, as a caller of the trainer without torchrun's agent has), which
enters and leaves a GracefulStop, as a run's loop does; exit 1, naming them, if any of its threads
outlive it."""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import torch.distributed as dist

from training.run.shutdown import GracefulStop


def main() -> None:
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    with GracefulStop(rank, 2):
        pass
    left = [t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")]
    dist.destroy_process_group()
    if left:
        sys.exit(f"rank {rank}: {', '.join(left)} outlived the stop")


if __name__ == "__main__":
    main()
