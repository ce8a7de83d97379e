"""What it would cost the ranks of a run reading local data to agree at every fetch (docs/checkpoints.md,
"Failures stop the run"): the failing-read agreement a run with a source in a bucket makes at every
step (training/run/shutdown.GracefulStop.failed_ranks: a MAX all-reduce of one flag on the stop's gloo
group while no rank failed), timed as the trainer calls it, between `--nproc` CPU processes of this
machine.

    python -m bench.step_agreement                 # 2 processes, 5 rounds of 2,000 calls
    python -m bench.step_agreement --nproc 4 --calls 5000

Each round times `--calls` calls back to back after 200 untimed ones; the figure is rank 0's median
over rounds of the mean time per call, beside the rounds' spread and the share of the 1.24B recipe's
step on one H100 (bench/RESULTS.md's headline: 1.99 s). One host's loopback only: between nodes each
call is a network round trip more. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch.distributed as dist
import torch.multiprocessing as mp

H100_STEP_S = 1.99  # bench/RESULTS.md: 131,072 tokens a step at 65,763 tokens/s


def worker(rank: int, nproc: int, port: int, rounds: int, calls: int, out) -> None:
    from training.run.shutdown import GracefulStop

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=nproc)
    stop = GracefulStop(rank, nproc)
    try:
        for _ in range(200):
            stop.failed_ranks(None)
        means = []
        for _ in range(rounds):
            dist.barrier(group=stop.group)
            t0 = time.perf_counter()
            for _ in range(calls):
                stop.failed_ranks(None)
            means.append((time.perf_counter() - t0) / calls)
        if rank == 0:
            out.put(means)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(
        worker, (args.nproc, args.port, args.rounds, args.calls, out), nprocs=args.nproc, start_method="spawn"
    )
    means = out.get()
    median = statistics.median(means)
    print(
        f"failed_ranks(None) between {args.nproc} processes over gloo: {median * 1e6:.0f} µs per call "
        f"(rounds {min(means) * 1e6:.0f}–{max(means) * 1e6:.0f} µs); "
        f"{median / H100_STEP_S:.4%} of the 1.24B recipe's {H100_STEP_S} s H100 step"
    )


if __name__ == "__main__":
    main()
