"""What an async checkpoint costs the training loop, through the trainer's Checkpointer, in one run.

    python -m bench.checkpoint_stall --preset demo --device cpu          # CPU: the demo model, seconds
    python -m bench.checkpoint_stall                                     # CPU: a 126M-parameter model
    python -m bench.checkpoint_stall --preset llama3-1b --device cuda --seq 2048 --batch 8   # one GPU

One process, real training steps on synthetic tokens (the trainer's `train_step`: forward,
backward, clip, fused AdamW), checkpoints of model + AdamW state + schedule + counters/RNG written
by `training.checkpoint.checkpointer.Checkpointer` (DCP, fsync) to --dir. In order:

1. a synchronous save: the write time, and the stall a sync save costs;
2. the save interval: --steps-between, or by default the fewest steps that outlast
   --interval-factor × that write time (a realistic interval: one write finishes before the next
   save, so nothing waits unless the write slows down under training);
3. two loops over the same steps: no saves (baseline), async saves every interval.

Per async save: `copy` (into the run's host buffers: pinned, on a side stream on CUDA, where it
overlaps the next step's forward and backward; device time), `wait` (for the previous write),
`save()` (the loop blocked in save: the wait, the non-finite check, the copy — on CUDA only its
launch — and DCP's planning), `poll` (the poll() that finishes it: rank 0's COMPLETE record);
blocked = save() + poll. Then the next step's excess over the baseline's median step: on CUDA
the optimizer step waiting for a copy still running, plus the writer thread's CPU use; on a CPU
the writer thread competing for the cores. Total = blocked + excess. The first save also
allocates the buffers (pinning 15 GB takes seconds): it is shown, and the medians are over the
later ones. Also printed: each async save's write time and the loop's wall time against the
no-save baseline.

Goal (issue 19): async stall ≤ 1 s per save for the 1.24B preset on an H100. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from training.checkpoint.checkpointer import Checkpointer, dir_size
from training.checkpoint.state import ModelState, OptimizerState, TrainState
from training.config import CheckpointSection, OptimSection
from training.contract.disk_space import fmt_bytes
from training.model import PRESETS, Transformer, num_params
from training.optim import ScheduledLR, build_optimizer
from training.train import train_step

# ≥ 100M parameters, small enough for a 2-core CPU step in seconds: 125.8M (50.3M of them embeddings).
CPU_126M = PRESETS["llama3-1b"].replace(
    dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32768, tie_embeddings=False
)


def build(preset: str, device: torch.device):
    cfg = CPU_126M if preset == "cpu-126m" else PRESETS[preset]
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(cfg)
    with torch.no_grad():
        model.init_weights()
    optimizer = build_optimizer(model, OptimSection(), device.type)
    scheduler = ScheduledLR(optimizer, lambda step: OptimSection().lr)  # saved as its step alone
    states = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,
        "train_state": TrainState(),
    }
    return cfg, model, optimizer, scheduler, states


class Bench:
    def __init__(self, args, device: torch.device):
        self.args, self.device = args, device
        self.cfg, self.model, self.optimizer, self.scheduler, self.states = build(args.preset, device)
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(1, self.cfg.vocab_size, (args.batch, args.seq + 1), generator=g).to(device)
        self.batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
        self.notes: list[str] = []
        self.step_no = 0

    def amp(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> float:
        t0 = time.perf_counter()
        train_step(self.model, self.optimizer, self.scheduler, [self.batch], grad_clip=1.0, amp=self.amp)
        self.sync()
        self.step_no += 1
        return time.perf_counter() - t0

    def checkpointer(self, name: str, async_: bool) -> Checkpointer:
        run_dir = Path(self.args.dir) / name
        shutil.rmtree(run_dir, ignore_errors=True)

        def log(line: str) -> None:
            if line.startswith(("note:", "checkpoint staging:", "WARNING")):
                self.notes.append(line)

        ckpt = Checkpointer(
            CheckpointSection(keep_last=1, async_=async_, min_free_factor=1.0, interval=1),
            run_dir,
            self.states,
            rank=0,
            world_size=1,
            last_step=10**9,
            config_sha256="bench",
            estimate_bytes=num_params(self.model) * 12,
        )
        ckpt.log = log  # its rank-0 lines (the console's `say` since the timeline) kept as the row's notes
        return ckpt

    def sync_save(self) -> tuple[float, int]:
        """One synchronous save after a step: (seconds, checkpoint bytes)."""
        ckpt = self.checkpointer("sync", async_=False)
        self.step()
        t0 = time.perf_counter()
        ckpt.save(self.step_no, 0)
        seconds = time.perf_counter() - t0
        ckpt.close()
        size = dir_size(Path(self.args.dir) / "sync" / "checkpoints" / f"step-{self.step_no:06d}")
        shutil.rmtree(Path(self.args.dir) / "sync", ignore_errors=True)
        return seconds, size

    def loop(self, steps_between: int, saves: int, async_: bool | None) -> dict:
        """`saves` × `steps_between` steps; with async_ (True) a save after every `steps_between`."""
        ckpt = self.checkpointer("async", async_=True) if async_ else None
        step_s: list[float] = []
        records: list[dict] = []
        t_loop = time.perf_counter()
        for _ in range(saves):
            for k in range(steps_between):
                if ckpt is not None:
                    t0 = time.perf_counter()
                    before = ckpt.pending
                    ckpt.poll()
                    if records:
                        records[-1]["poll_s"] += time.perf_counter() - t0
                        if before is not None and ckpt.pending is None:
                            records[-1]["write_s"] = ckpt.last_write_s
                s = self.step()
                step_s.append(s)
                if ckpt is not None and k == 0 and records:
                    records[-1]["next_step_s"] = s
                    records[-1]["copy_s"] = ckpt.staging.copy_seconds()
            if ckpt is not None:
                pending_before = ckpt.pending
                t0 = time.perf_counter()
                ckpt.save(self.step_no, 0)
                self.sync()
                save_s = time.perf_counter() - t0
                if pending_before is not None and records:  # its write ended inside this save
                    records[-1]["write_s"] = ckpt.last_write_s
                records.append(
                    dict(save_s=save_s, wait_s=ckpt.last_wait_s, stage_s=ckpt.last_stage_s, poll_s=0.0,
                         write_s=None, next_step_s=None, copy_s=None)
                )  # fmt: skip
        loop_s = time.perf_counter() - t_loop
        drain = 0.0
        if ckpt is not None:
            records[-1]["next_step_s"] = self.step()  # the last save's next step (outside the loop time)
            records[-1]["copy_s"] = ckpt.staging.copy_seconds()
            t0 = time.perf_counter()
            ckpt.close()
            drain = time.perf_counter() - t0
            records[-1]["write_s"] = ckpt.last_write_s
            shutil.rmtree(Path(self.args.dir) / "async", ignore_errors=True)
        return {"loop_s": loop_s, "drain_s": drain, "step_s": step_s, "saves": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-126m", help="cpu-126m (default) or a training.model preset")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--saves", type=int, default=4, help="async saves in the timed loop")
    parser.add_argument(
        "--steps-between", type=int, default=0, help="steps per save (0: from the write time)"
    )
    parser.add_argument("--interval-factor", type=float, default=1.5,
                        help="the default interval outlasts this × the sync write time")  # fmt: skip
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dir", default="runs/bench-checkpoint-stall", help="where checkpoints go (deleted)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda needs CUDA (torch sees no GPU); use --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    bench = Bench(args, device)
    n = num_params(bench.model)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"model {args.preset}: {n:,} parameters on {device} ({where}); torch {torch.__version__}; "
          f"steps of {args.batch}×{args.seq} tokens; checkpoints to {args.dir}", flush=True)  # fmt: skip

    for _ in range(2):  # warm-up: allocator, optimizer state, kernels
        bench.step()
    write_s, size = bench.sync_save()
    base_step = statistics.median(bench.step() for _ in range(3))
    steps_between = args.steps_between or max(2, math.ceil(args.interval_factor * write_s / base_step))
    print(f"sync save: {write_s:.2f} s for {fmt_bytes(size)} (the stall of checkpoint.async = false); "
          f"step {base_step:.3f} s → a save every {steps_between} steps ≈ {steps_between * base_step:.1f} s",
          flush=True)  # fmt: skip

    none = bench.loop(steps_between, args.saves, async_=None)
    done = bench.loop(steps_between, args.saves, async_=True)
    median_step = statistics.median(none["step_s"])
    rows = done["saves"]
    for r in rows:
        r["blocked_s"] = r["save_s"] + r["poll_s"]
        r["excess_s"] = max(0.0, (r["next_step_s"] or median_step) - median_step)
        r["stall_s"] = r["blocked_s"] + r["excess_s"]
    print(f"async saves, one every {steps_between} steps (median step without saves {median_step:.3f} s):")
    print("  save   copy s   wait s   save() s   poll s  blocked s  next-step excess s  TOTAL s   write s")
    for i, r in enumerate(rows, 1):
        copy_s = "-" if r["copy_s"] is None else f"{r['copy_s']:.3f}"
        first = "  (allocates the buffers)" if i == 1 else ""
        print(f"  {i:4d} {copy_s:>8} {r['wait_s']:8.3f} {r['save_s']:10.3f} {r['poll_s']:8.3f} "
              f"{r['blocked_s']:10.3f} {r['excess_s']:19.3f} {r['stall_s']:8.3f} "
              f"{r['write_s'] or 0:9.2f}{first}")  # fmt: skip
    later = rows[1:] or rows
    blocked = statistics.median(r["blocked_s"] for r in later)
    stall = statistics.median(r["stall_s"] for r in later)
    write = statistics.median(r["write_s"] or 0 for r in rows)
    print(f"median per save (saves 2–{len(rows)}): blocked {blocked:.3f} s, total with the next step's "
          f"excess {stall:.3f} s; write {write:.2f} s in the background; "
          f"sync save {write_s:.2f} s")  # fmt: skip
    print(f"training loop, {args.saves * steps_between} steps: {none['loop_s']:.1f} s without saves, "
          f"{done['loop_s']:.1f} s with {args.saves} async saves ({done['loop_s'] / none['loop_s']:.3f}×; "
          f"+{done['drain_s']:.1f} s for the last write at the end)")  # fmt: skip
    for line in bench.notes:
        print(f"  [checkpointer] {line}")
    if args.json:
        payload = dict(preset=args.preset, device=str(device), where=where, params=n, torch=torch.__version__,
                       checkpoint_bytes=size, sync_save_s=write_s, steps_between=steps_between, none=none,
                       async_=done, notes=bench.notes)  # fmt: skip
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
