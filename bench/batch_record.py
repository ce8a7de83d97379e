"""What recording each trained step's batch costs a step (issue 47; docs/loader-and-phases.md, "What
the model was fed"): the demo recipe on CPU, runs with the record (as shipped) beside runs without
it, and inside each recorded run the time it spent on the record.

    python -m bench.batch_record                     # the demo recipe on the demo datasets (make demo)
    python -m bench.batch_record --rounds 3 --steps 60

Each run is one process (`--child`) that trains the recipe in-process through training.train.train:
- "record": as shipped; the time spent in the three pieces of the record is summed
  (BatchDigests.add: every row of every step hashed; BatchDigests.gather: the steps' digests combined,
  a collective under torchrun; RunRecord.batches: the records appended to RUN/batches.bin) and
  divided by the loop's time (the summary's `seconds`): the in-run share, which a shared machine's
  drift cannot move much;
- "none": the same run with those three replaced by stubs that hash, gather and write nothing (the
  rows then carry a dummy digest): the baseline.
Each round runs the two modes side by side, at the same time, one torch thread each (run.threads =
1; --set overrides it): whatever else loads a shared machine loads both alike. Run one after the
other, the pairs on the 2-core VM shared with other engineers differed by up to 3× from one
minute to the next, and "record" came out slower in all 7 pairs (0.50–0.81×) while its own timed
share of the loop was 0.02%: the load, not the record. Each run's figure is the median logged
tokens/s after step `--skip` (warm-up) and its loop seconds per step; the result is the ratio of
the medians over rounds, printed beside the baseline runs' own spread (what the ratio can
resolve). No validation, no eval (not the step's cost).

The demo's steps are small (4,096 tokens), so it also prints what hashing costs at scale: one rank's
rows of the 1.24B recipe's step on one H100 (bench/RESULTS.md: 16 × 4 micro-batches of 2048 tokens,
131,072 tokens per step at 65,763 tokens/s = 1.99 s), hashed on this machine's CPU, against that
step's time. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.demo_runs import DEMO, ROOT, require_demo_datasets, timed_overrides

MODES = ("none", "record")
H100_ROWS, H100_SEQ, H100_TOKENS_PER_S = 64, 2048, 65_763  # bench/RESULTS.md's headline, mbs 16 × 4


def child(mode: str, config: str, sets: list[str], out: Path) -> None:
    """One run in this process: `mode` "record" (timed) or "none" (stubbed); its figures to `out`."""
    from training.run.batch_digests import BatchDigests
    from training.run.record import RunRecord
    from training.train import load_train_config, train

    spent = {"add": 0.0, "gather": 0.0, "write": 0.0}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    if mode == "record":
        BatchDigests.add = timed("add", BatchDigests.add)
        BatchDigests.gather = timed("gather", BatchDigests.gather)
        RunRecord.batches = timed("write", RunRecord.batches)
    else:  # nothing hashed, gathered or written; the rows get a dummy digest
        BatchDigests.add = lambda self, step, micro_batches: self.pending.append((step, b""))

        def gather(self):
            pending, self.pending = self.pending, []
            return [(step, "0" * 64) for step, _ in pending]

        BatchDigests.gather = gather
        RunRecord.batches = lambda self, digests: None
    cfg = load_train_config(config, sets)
    summary = train(cfg)
    rows = [
        json.loads(line) for line in (Path(cfg.run.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = summary["steps"]
    out.write_text(json.dumps({"seconds": summary["seconds"], "steps": steps, "spent": spent, "rows": rows}))


def start(mode: str, config: Path, sets: list[str], run_dir: Path) -> subprocess.Popen:
    """A child process training the recipe in `mode` into `run_dir` (its figures to run_dir.json)."""
    cmd = [sys.executable, "-m", "bench.batch_record", "--child", mode, "--config", str(config),
           "--out", str(run_dir.with_suffix(".json")), "--set", *sets,
           f"run.output_dir={json.dumps(str(run_dir))}"]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.with_suffix(".log"), "w") as log:  # its output, for when it fails
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip


def figure_of(mode: str, proc: subprocess.Popen, run_dir: Path, skip: int) -> dict:
    """A finished child's tokens/s (median of the logged rows after step `skip`), loop seconds per
    step and, recorded, the record's share of the loop."""
    if proc.wait() != 0:
        log = run_dir.with_suffix(".log").read_text()
        raise SystemExit(f"the {mode} run exited {proc.returncode}: {log[-2000:]}")
    got = json.loads(run_dir.with_suffix(".json").read_text())
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in got["rows"] if r["step"] > skip)
    figure = {"tokens_per_s": tokens_per_s, "s_per_step": got["seconds"] / got["steps"]}
    if mode == "record":
        figure["spent_s"] = sum(got["spent"].values())
        figure["share"] = figure["spent_s"] / got["seconds"]
        figure["spent"] = got["spent"]
    said = f", the record {100 * figure['share']:.3f}% of the loop" if "share" in figure else ""
    print(f"  {run_dir.name}: {tokens_per_s:,.0f} tokens/s, {1000 * figure['s_per_step']:.1f} ms/step{said}",
          flush=True)  # fmt: skip
    return figure


def hashing_at_scale(repeats: int = 20) -> dict:
    """The time row_digests takes for one rank's rows of the H100 headline's step (median of `repeats`):
    wall seconds, and the process's CPU seconds (what it costs where the host has a core to itself, as
    a GPU box's training process does), and their shares of that step's time."""
    import torch

    from training.data.loader import row_digests

    g = torch.Generator().manual_seed(0)
    keys = ("input_ids", "labels", "position_ids")
    micro = [
        {k: torch.randint(0, 131072, (16, H100_SEQ), generator=g) for k in keys}
        for _ in range(H100_ROWS // 16)
    ]
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        row_digests(micro)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    seconds, cpu_seconds = statistics.median(wall), statistics.median(cpu)
    step = H100_ROWS * H100_SEQ / H100_TOKENS_PER_S
    mb = H100_ROWS * H100_SEQ * 24 / 1e6
    print(f"at scale: one rank's {H100_ROWS} × {H100_SEQ} tokens ({mb:.1f} MB of int64 ids, labels, "
          f"positions) hashed in {1000 * seconds:.2f} ms wall, {1000 * cpu_seconds:.2f} ms CPU "
          f"({mb / cpu_seconds:,.0f} MB/s of CPU time): {100 * seconds / step:.3f}% (wall), "
          f"{100 * cpu_seconds / step:.3f}% (CPU) of the H100 step ({step:.2f} s)")  # fmt: skip
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "step_seconds": step, "share": seconds / step,
            "cpu_share": cpu_seconds / step}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEMO)
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="more overrides for every run")
    ap.add_argument("--steps", type=int, default=60, help="run.max_steps of each run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", type=int, default=10, help="logged rows up to this step are warm-up")
    ap.add_argument("--dir", type=Path, default=ROOT / "runs/bench-batch-record")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--at-scale", action="store_true", help="only the hashing at the H100 step's scale")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, str(args.config), args.sets, args.out)
        return 0
    if args.at_scale:
        hashing_at_scale()
        return 0
    require_demo_datasets(args.config)
    common = [*timed_overrides(args.steps), "eval.interval=0", "run.threads=1", *args.sets]
    figures: dict[str, list[dict]] = {m: [] for m in MODES}
    stamp = int(time.time())
    for r in range(args.rounds):  # both modes at once: whatever else loads the machine loads both
        dirs = {mode: args.dir / f"{stamp}-{mode}-{r}" for mode in MODES}
        procs = {mode: start(mode, args.config, common, dirs[mode]) for mode in MODES}
        for mode in MODES:
            figures[mode].append(figure_of(mode, procs[mode], dirs[mode], args.skip))
    med = {
        m: {k: statistics.median(f[k] for f in figures[m]) for k in ("tokens_per_s", "s_per_step")}
        for m in MODES
    }
    share = statistics.median(f["share"] for f in figures["record"])
    ratio = med["record"]["tokens_per_s"] / med["none"]["tokens_per_s"]
    step_ratio = med["record"]["s_per_step"] / med["none"]["s_per_step"]
    print(
        f"batch record: {med['record']['tokens_per_s']:,.0f} tokens/s vs none "
        f"{med['none']['tokens_per_s']:,.0f}: "
        f"ratio {ratio:.4f}; seconds per step ratio {step_ratio:.4f}; the record's share of the loop "
        f"{100 * share:.3f}% (medians of {args.rounds} rounds)"
    )
    base = [f["s_per_step"] for f in figures["none"]]
    spread = (max(base) - min(base)) / 2 / med["none"]["s_per_step"]
    print(f"the baseline's own runs: {1000 * min(base):.1f}–{1000 * max(base):.1f} ms/step (a ratio "
          f"within ±{100 * spread:.0f}% of 1 is that noise)")  # fmt: skip
    scale = hashing_at_scale()
    result = {"medians": med, "ratio_tokens_per_s": ratio, "ratio_s_per_step": step_ratio, "share": share,
              "runs": figures, "config": str(args.config), "steps": args.steps,
              "at_scale": scale}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
