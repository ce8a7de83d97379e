"""What rewinds cost a run that never spikes: `gristmill train` with run.on_spike = "rewind" against
the same recipe with "report", in one call.

    python -m bench.rewind_cost                      # the demo recipe on the demo datasets (make demo)
    python -m bench.rewind_cost --rounds 3 --steps 100
    python -m bench.rewind_cost --config RECIPE.toml --set data.dataset=… …   # any recipe (GPU)

With rewinds on, the host reads every step's loss (an all-reduce of one number and a device→host
copy: one sync per step) so the spike rule sees each step; with "report" it reads the loss at
logged steps only. On a CPU the step is synchronous anyway; on a GPU the sync drains the queue of
launched kernels once per step. Runs alternate (report, rewind, report, rewind, …) so drift on a
shared machine hits both; each run's figure is the median logged tokens/s after the first rows
(warm-up), and the result is the ratio of the medians over runs. No spike is injected: this is the
price of being ready to rewind. A benchmark, never a test.
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


def run(config: Path, sets: list[str], run_dir: Path, skip: int) -> float:
    """One `gristmill train`; the median tokens/s of its logged rows after step `skip`."""
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config), "--set", *sets,
           f"run.output_dir={json.dumps(str(run_dir))}"]  # fmt: skip
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gristmill train exited {proc.returncode}: {proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r["tokens_per_s"] for r in rows if r["step"] > skip]
    figure = statistics.median(timed)
    print(f"  {run_dir.name}: {figure:,.0f} tokens/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    return figure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=DEMO)
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="more overrides for both runs")
    ap.add_argument("--steps", type=int, default=100, help="run.max_steps of each run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", type=int, default=10, help="logged rows up to this step are warm-up")
    ap.add_argument("--dir", type=Path, default=ROOT / "runs/bench-rewind")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_demo_datasets(args.config)
    common = [*timed_overrides(args.steps), *args.sets]
    modes = {"report": ["run.on_spike=report"], "rewind": ["run.on_spike=rewind"]}
    figures: dict[str, list[float]] = {m: [] for m in modes}
    stamp = int(time.time())
    for r in range(args.rounds):
        for mode, sets in modes.items():
            run_dir = args.dir / f"{stamp}-{mode}-{r}"
            figures[mode].append(run(args.config, common + sets, run_dir, args.skip))
    report, rewind = (statistics.median(figures[m]) for m in modes)
    result = {"report_tokens_per_s": report, "rewind_tokens_per_s": rewind, "ratio": rewind / report,
              "runs": figures, "config": str(args.config), "steps": args.steps}  # fmt: skip
    print(
        f"rewind-ready: {rewind:,.0f} tokens/s vs report {report:,.0f} tokens/s; ratio {rewind / report:.3f} "
        f"(median of {args.rounds} runs each, {args.steps} steps, {args.config.name})",
        flush=True,
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
