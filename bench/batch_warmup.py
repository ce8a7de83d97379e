"""Does growing the batch save steps at this scale? A constant small batch against a doubling batch
schedule (`[[phase]] global_batch_tokens`) to the same token budget, on the demo data with the demo
model, over several seeds: steps taken, wall time and the final held-out loss of each.

    python -m bench.batch_warmup                          # runs/data/demo (make demo), 3 seeds
    python -m bench.batch_warmup --seeds 0 1 2 --tokens 245760 --batch 2048

Both runs have the same three phases by tokens (¼, ¼, ½ of the budget: warmup then constant,
constant, a linear decay to a tenth of the phase's peak), the same data order (data.seed) and the
same model init (run.seed) per seed. The constant run keeps `--batch` tokens per step throughout;
the schedule trains its phases at 1×, 2× and 4× that, with optim.batch_lr_scaling = "sqrt" (Adam's
rule: the LR, its peak and its end alike, × √2 and × 2), so it takes half the steps, and its last
phase decays from 2× the constant run's LR to 2× its end: the comparison is of the two schedules,
the batch and the LR that goes with it, not of the batch alone. The final held-out loss is measured
on the same windows for both: validation reads `run.val_batches` batches of the phase's batch from
the start of each held-out split, so the constant run reads 8 batches and the schedule's last phase
2 (4× bigger): the same 8 × `--batch` tokens. A benchmark, never a test; it reports whether the
saving reproduces here, either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEQ = 128


def recipe(
    data: Path, run_dir: Path, seed: int, tokens: int, batch: int, factors: tuple[int, int, int]
) -> str:
    """The demo model on one source in three phases of ¼, ¼ and ½ of `tokens`, at `batch` × `factors`."""
    shares = (tokens // 4, tokens // 4, tokens - 2 * (tokens // 4))
    lrs = ('{ warmup_steps = 5, shape = "constant" }', '{ shape = "constant" }', '{ shape = "linear" }')
    phases = "".join(
        f'[[phase]]\nname = "p{i + 1}"\ntokens = {share}\nglobal_batch_tokens = {batch * f}\n'
        f"seq_len = {SEQ}\nlr = {lr}\n\n"
        for i, (share, f, lr) in enumerate(zip(shares, factors, lrs))
    )
    val_batches = 8 // factors[-1]  # the same 8 × batch held-out tokens at the end
    return f"""
[model]
preset = "demo"
[data]
dataset = {json.dumps(str(data))}
global_batch_tokens = {batch}
micro_batch = 16
val_fraction = 0.05
seed = {seed}
{phases}
[optim]
lr = 3e-3
min_lr = 3e-4
batch_lr_scaling = "{"sqrt" if factors != (1, 1, 1) else "none"}"
[parallel]
param_dtype = "float32"
[run]
output_dir = {json.dumps(str(run_dir))}
seed = {seed}
log_every = 10
val_every = 100000
val_batches = {val_batches}
[checkpoint]
interval = 0
[metrics]
tensorboard = false
plot = false
"""


def gristmill_train(config: Path, run_dir: Path) -> tuple[list[dict], float]:
    """One `gristmill train` in a process of its own: its metrics.jsonl rows and wall seconds."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config)]
    proc = subprocess.run(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"gristmill train exited {proc.returncode}: {proc.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, time.perf_counter() - t0


def train(config: Path, run_dir: Path) -> dict:
    """One `gristmill train`: its steps, wall seconds and final held-out loss."""
    rows, seconds = gristmill_train(config, run_dir)
    return {"steps": rows[-1]["step"], "seconds": seconds, "val_loss": rows[-1]["val_loss"],
            "tokens": rows[-1]["tokens_seen"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "runs/data/demo")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tokens", type=int, default=245_760, help="the token budget of every run")
    ap.add_argument("--batch", type=int, default=2048, help="the constant run's tokens per step")
    ap.add_argument("--dir", type=Path, default=ROOT / "runs/bench-batch-warmup")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not (args.data / "dataset.json").exists():
        raise SystemExit(f"{args.data} holds no dataset: run `make demo` first, or pass --data")
    schedules = {"constant": (1, 1, 1), "doubling": (1, 2, 4)}
    results: dict[str, list[dict]] = {name: [] for name in schedules}
    for seed in args.seeds:
        for name, factors in schedules.items():
            run_dir = args.dir / f"{name}-seed{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            config = args.dir / f"{name}-seed{seed}.toml"
            config.write_text(recipe(args.data.resolve(), run_dir, seed, args.tokens, args.batch, factors))
            r = train(config, run_dir)
            results[name].append(r)
            line = f"{r['steps']:4d} steps, {r['tokens']:,} tokens, {r['seconds']:5.0f} s"
            print(f"  seed {seed} {name:8s}: {line}, final held-out loss {r['val_loss']:.4f}", flush=True)
    const, dbl = results["constant"], results["doubling"]
    diffs = [d["val_loss"] - c["val_loss"] for c, d in zip(const, dbl)]
    summary = {
        "seeds": args.seeds,
        "tokens": args.tokens,
        "batch": args.batch,
        "steps": {"constant": const[0]["steps"], "doubling": dbl[0]["steps"]},
        "val_loss_mean": {k: statistics.mean(r["val_loss"] for r in v) for k, v in results.items()},
        "val_loss_diff_per_seed": diffs,  # doubling − constant: below 0 is better
        "seconds_mean": {k: statistics.mean(r["seconds"] for r in v) for k, v in results.items()},
    }
    mean = statistics.mean(diffs)
    spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    verdict = (
        "the saving reproduces: the schedule is no worse"
        if mean <= spread
        else "the saving does not reproduce here: the schedule ends worse than the constant batch"
    )
    print(
        f"steps: constant {const[0]['steps']}, doubling {dbl[0]['steps']} "
        f"({1 - dbl[0]['steps'] / const[0]['steps']:.0%} fewer) to {args.tokens:,} tokens; final held-out "
        f"loss {summary['val_loss_mean']['constant']:.4f} vs {summary['val_loss_mean']['doubling']:.4f} "
        f"(doubling − constant per seed: {', '.join(f'{d:+.4f}' for d in diffs)}; mean {mean:+.4f} ± "
        f"{spread:.4f}); {verdict}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
