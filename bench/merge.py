"""[merge] at the demo's scale (issue 46): what it costs a step, and whether merged weights score better
than the raw ones. CPU; needs the demo datasets (`make demo`, or the two `gristmill data build`s of
configs/train/demo.toml's header).

    python -m bench.merge cost [--rounds 3 --steps 60]     # tokens/s with [merge] against without
    python -m bench.merge evidence [--seeds 0 1 2 --jobs 2] # merged vs raw held-out loss; WSM vs the decay
    python -m bench.merge evidence --reuse runs/bench-merge/evidence-N   # its finished runs read again

`cost`: the demo recipe through `gristmill train` three ways, alternating (none, window, ema, none, …)
so drift on a shared machine hits all of them: no [merge]; a window of 50 every 50 steps (every step is
added: the most a window costs); an EMA (decay 0.99; a lerp every step). Each run's figure is the
median logged tokens/s after step `--skip`; the result is the ratio of the medians over runs, and
beside it what folding one step in costs, timed alone on the demo model (`fold_seconds`). No
validation (the merged weights' scoring is validation's cost, not the step's). One torch thread
per run (`--threads`, for both parts): on the shared 2-core VM (load 11) the demo trained 2,150
tokens/s with one thread and 170 with torch's two, which spin against each other.

`evidence`: the demo model and data, its three phases at equal tokens (150 steps), validation every
50 steps (the held-out loss, `val_loss`, mix-weighted, of the raw and the merged weights):
1. a constant-LR run (the demo with its decay phase's LR held at the peak: warmup-stable only) with
   [merge] windows of 10, 25 and 50 steps every 50: merged against raw held-out loss at steps 50, 100
   and 150 (the raw curve is the same run three times: merging does not change training);
2. WSM (that constant-LR run, merged over the last 50 steps) against the demo's own decay (linear to
   optim.min_lr over the last 50 steps), over `--seeds` (run.seed and data.seed): the held-out loss at
   step 150 of the merged constant run, the decayed run and the raw constant run.
It prints what it sees, whichever way it goes. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.batch_warmup import gristmill_train
from bench.demo_runs import DEMO, ROOT, require_demo_datasets, timed_overrides
from bench.rewind_cost import run as tokens_per_s
from training.config import MergeSection, load_train_config
from training.contract.config_loader import save_config

MERGES = {  # the cost's modes: overrides of each (the demo recipe's own [merge] replaced)
    "none": ["merge.kind=none", "merge.every=0", "merge.window=0"],
    "window": ["merge.kind=window", "merge.every=50", "merge.window=50"],
    "ema": ["merge.kind=ema", "merge.every=50", "merge.window=0", "merge.decay=0.99"],
}
WINDOWS = (10, 25, 50)
POINTS = (50, 100, 150)


def cost(args: argparse.Namespace) -> dict:
    common = [*timed_overrides(args.steps), "eval.interval=0", f"run.threads={args.threads}"]
    figures: dict[str, list[float]] = {m: [] for m in MERGES}
    stamp = int(time.time())
    for r in range(args.rounds):
        for mode, sets in MERGES.items():
            run_dir = args.dir / f"{stamp}-{mode}-{r}"
            figures[mode].append(tokens_per_s(DEMO, common + sets, run_dir, args.skip))
            shutil.rmtree(run_dir, ignore_errors=True)
    medians = {m: statistics.median(v) for m, v in figures.items()}
    fold = fold_seconds(args.threads)
    step_s = 4096 / medians["none"]  # the demo's main and decay phases: 4,096 tokens a step
    for mode in ("window", "ema"):
        print(f"[merge] {mode}: {medians[mode]:,.0f} tokens/s vs none {medians['none']:,.0f}: ratio "
              f"{medians[mode] / medians['none']:.3f}; folding a step in takes {fold[mode] * 1e3:.2f} ms, "
              f"{fold[mode] / step_s:.2%} of a 4,096-token step", flush=True)  # fmt: skip
    return {"runs": figures, "medians": medians, "steps": args.steps, "fold_seconds": fold,
            "ratios": {m: medians[m] / medians["none"] for m in ("window", "ema")}}  # fmt: skip


def fold_seconds(threads: int, calls: int = 200) -> dict[str, float]:
    """What `MergedWeights.trained` costs per step on the demo model, timed in this process (the
    median of `calls`): the window's foreach add and the EMA's foreach lerp over every parameter."""
    import torch

    from training.merge import MergedWeights, MergePoints
    from training.model import PRESETS, Transformer

    if threads:
        torch.set_num_threads(threads)
    model = Transformer(PRESETS["demo"].replace(vocab_size=8192))
    out = {}
    for kind, settings in (("window", MergeSection("window", every=10**9, window=10**9)),
                           ("ema", MergeSection("ema", every=10**9, decay=0.99))):  # fmt: skip
        merge = MergedWeights(model, settings, MergePoints(settings.every, (10**9,)))
        times = []
        for step in range(1, calls + 1):
            t0 = time.perf_counter()
            merge.trained(step)
            times.append(time.perf_counter() - t0)
        out[kind] = statistics.median(times[1:])  # the first is a copy, not a fold
    return out


def recipe(path: Path, run_dir: Path, seed: int, *, decay: bool, merge: MergeSection, threads: int) -> Path:
    """The demo recipe as is (`decay`) or with its decay phase's LR constant, at `seed`, with `merge`,
    validated every 50 steps, no eval, no checkpoints: a full recipe file for `gristmill train`."""
    cfg = load_train_config(str(DEMO), [])
    phases = [dataclasses.replace(p, lr=dataclasses.replace(p.lr, shape="constant")) for p in cfg.phase]
    cfg = dataclasses.replace(
        cfg,
        phase=cfg.phase if decay else phases,
        data=dataclasses.replace(cfg.data, seed=seed),
        run=dataclasses.replace(
            cfg.run, seed=seed, output_dir=str(run_dir), val_every=50, log_every=10, threads=threads
        ),
        checkpoint=dataclasses.replace(cfg.checkpoint, interval=0, export_interval=0, async_=False),
        eval=dataclasses.replace(cfg.eval, interval=0),
        metrics=dataclasses.replace(cfg.metrics, tensorboard=False, plot=False),
        merge=merge,
    )
    save_config(cfg, path)
    return path


def train(config: Path, run_dir: Path, reuse: bool = False) -> dict[int, dict]:
    """One `gristmill train`; its rows at the validation steps. `reuse`: a run directory whose
    metrics.jsonl validated the last step already is read, not trained again."""
    done = run_dir / "metrics.jsonl"
    if reuse and done.is_file():
        rows = {r["step"]: r for r in map(json.loads, done.read_text().splitlines()) if "val_loss" in r}
        if POINTS[-1] in rows:
            print(f"  {run_dir.name}: reused", flush=True)
            return rows
    shutil.rmtree(run_dir, ignore_errors=True)
    rows, seconds = gristmill_train(config, run_dir)
    print(f"  {run_dir.name}: {seconds:.0f} s", flush=True)
    return {r["step"]: r for r in rows if "val_loss" in r}


def evidence(args: argparse.Namespace) -> dict:
    out: dict = {"windows": {}, "seeds": {}}
    work = args.reuse or args.dir / f"evidence-{int(time.time())}"
    configs: dict[str, Path] = {}  # every run, by name: independent, so `--jobs` of them at a time
    for seed in args.seeds:
        for w in WINDOWS if seed == args.seeds[0] else (max(WINDOWS),):
            name = f"seed{seed}-constant-window{w}"
            merge = MergeSection(kind="window", every=50, window=w)
            configs[name] = recipe(
                work / f"{name}.toml", work / name, seed, decay=False, merge=merge, threads=args.threads
            )
        name = f"seed{seed}-decay"
        configs[name] = recipe(
            work / f"{name}.toml", work / name, seed, decay=True, merge=MergeSection(), threads=args.threads
        )
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = dict(zip(configs, pool.map(lambda n: train(configs[n], work / n, bool(args.reuse)), configs)))
    for seed in args.seeds:
        runs = {
            w: done[f"seed{seed}-constant-window{w}"]
            for w in WINDOWS
            if f"seed{seed}-constant-window{w}" in done
        }
        decayed = done[f"seed{seed}-decay"]
        if seed == args.seeds[0]:
            raws = {tuple(r[s]["val_loss"] for s in POINTS) for r in runs.values()}
            out["raw_identical"] = len(raws) == 1  # merging never changes training
            same = "yes" if len(raws) == 1 else "NO"
            print(f"  the raw curve is the same in the {len(runs)} window runs: {same}")
            for w, rows in runs.items():
                out["windows"][w] = {
                    s: {"raw": rows[s]["val_loss"], "merged": rows[s]["merged/val_loss"]} for s in POINTS
                }
        last = runs[max(WINDOWS)][POINTS[-1]]
        out["seeds"][seed] = {"wsm": last["merged/val_loss"], "constant": last["val_loss"],
                              "decay": decayed[POINTS[-1]]["val_loss"]}  # fmt: skip
        seen = out["seeds"][seed]
        print(f"  seed {seed}: WSM {seen['wsm']:.4f}, decay {seen['decay']:.4f}, "
              f"constant {seen['constant']:.4f}", flush=True)  # fmt: skip
    print("held-out loss, constant LR: raw and merged (window W, read every 50 steps)")
    for w, points in out["windows"].items():
        cells = ", ".join(f"step {s}: {p['raw']:.4f} → {p['merged']:.4f} ({p['merged'] - p['raw']:+.4f})"
                          for s, p in points.items())  # fmt: skip
        print(f"  window {w:3d}: {cells}")
    seeds = out["seeds"].values()
    for what in ("wsm", "constant"):
        diffs = [s[what] - s["decay"] for s in seeds]
        spread = f" ± {statistics.stdev(diffs):.4f}" if len(diffs) > 1 else ""
        mean = statistics.mean(diffs)
        print(f"{what} − decay at step {POINTS[-1]}: {mean:+.4f}{spread} over {len(diffs)} seeds")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["cost", "evidence"])
    ap.add_argument("--steps", type=int, default=60, help="cost: run.max_steps of each run")
    ap.add_argument("--rounds", type=int, default=3, help="cost: runs of each mode")
    ap.add_argument("--skip", type=int, default=10, help="cost: logged rows up to this step are warm-up")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="evidence: the seeds")
    ap.add_argument(
        "--reuse", type=Path, help="evidence: an earlier evidence-N directory; its finished runs are read"
    )
    ap.add_argument("--jobs", type=int, default=1, help="evidence: runs at a time (each its own process)")
    ap.add_argument("--threads", type=int, default=1, help="run.threads: torch threads per run (0: torch's)")
    ap.add_argument("--dir", type=Path, default=ROOT / "runs/bench-merge")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    require_demo_datasets()
    t0 = time.perf_counter()
    result = cost(args) if args.part == "cost" else evidence(args)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
