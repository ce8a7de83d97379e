"""Each trained step's global-batch digest, without gathering a batch (docs/loader-and-phases.md,
"What the model was fed").

Every rank hashes the rows of its slice of each step as the loader hands them over (`add`: one sha256
per row, training/data/loader.row_digests). When the loop next writes a row or saves a checkpoint, the
ranks' row digests of the steps since are gathered (`gather`: 32 bytes a row, over a gloo group of
its own, so it never waits for the GPU) and combined in rank order into each step's global digest:
the sha256 of the global batch's row digests, which is what `gristmill data inspect RUN --hash`
computes from the plan in one process (a global batch is the same rows for any number of ranks).
The run's record (training/run/record.py) writes them to RUN/batches.bin and the row carries its
step's as `batch_sha256`. Gathered before every save, so a checkpoint's steps are always recorded.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from training.data.loader import combined_sha256, row_digests


class BatchDigests:
    """This rank's row digests of the steps not yet gathered."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        distributed = world_size > 1 and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        self.pending: list[tuple[int, bytes]] = []  # (step, this rank's row digests), in step order

    def add(self, step: int, micro_batches: list[dict[str, torch.Tensor]]) -> None:
        """This rank's micro-batches of `step` (on the host, as the loader gave them)."""
        self.pending.append((step, row_digests(micro_batches)))

    def gather(self) -> list[tuple[int, str]]:
        """(step, global-batch sha256) of every step added since the last gather, in step order, on
        every rank (a collective when distributed and a step is pending: every rank trained the same
        steps, so every rank has as many pending)."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        if self.group is None:
            return [(step, combined_sha256(rows)) for step, rows in pending]
        ranks: list[list[tuple[int, bytes]]] = [[] for _ in range(self.world_size)]
        dist.all_gather_object(ranks, pending, group=self.group)
        steps = [step for step, _ in pending]
        for rank, theirs in enumerate(ranks):
            if [step for step, _ in theirs] != steps:  # a broken lockstep: never a silent wrong digest
                raise RuntimeError(f"rank {rank} hashed steps {[s for s, _ in theirs]}, this rank {steps}")
        return [(step, combined_sha256(b"".join(r[i][1] for r in ranks))) for i, step in enumerate(steps)]
