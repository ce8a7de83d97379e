"""`gristmill demo`: the whole system, offline, on the embedded demo corpus.

Each stage is the same code path a user runs by hand (the commands are printed before each stage),
so the demo is an end-to-end check as well as a tour: build (which validates) → audit → train
(stopped at step 100 as if preempted, then resumed from its checkpoint) → export to HF format and
verify every checkpoint and export against its checksums → eval.
Everything lands under runs/; rerunning resumes or reuses what is already complete.
"""

from __future__ import annotations

import argparse
import time
import tomllib
from pathlib import Path

from training.contract.errors import GristmillError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-config", default="configs/data/demo.toml", help="data recipe to build")
    parser.add_argument("--train-config", default="configs/train/demo.toml", help="training recipe")
    parser.add_argument("--eval-config", default="configs/eval/demo.toml", help="eval recipe (local tasks)")
    parser.add_argument("--skip-train", action="store_true", help="stop after the audit")


EVAL_SQL = "SELECT step, task, metric, value, stderr FROM eval ORDER BY step, task, metric"


def train_output_dir(config: str) -> Path:
    """run.output_dir of a training recipe, read from its TOML (the demo recipes all set it)."""
    with open(config, "rb") as f:
        out = tomllib.load(f).get("run", {}).get("output_dir")
    if not out:
        raise GristmillError(f"{config} sets no run.output_dir; the demo needs to know where the run goes")
    return Path(out)


def _stage(n: int, total: int, title: str, command: str) -> float:
    print(f"\n=== [{n}/{total}] {title}\n    $ {command}", flush=True)
    return time.time()


def run(args: argparse.Namespace) -> int:
    # Each stage's imports sit where the stage starts: `gristmill demo --help` imports none of
    # datatrove, duckdb, torch or lm-eval, and --skip-train never imports torch or lm-eval.
    from pipelines.build import build
    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config
    from validation.audit import print_summary, write_plots
    from validation.audit_views import connect

    total = 3 if args.skip_train else 6
    for path in (args.data_config, *(() if args.skip_train else (args.train_config, args.eval_config))):
        if not Path(path).is_file():
            print(f"error: {path} not found; run `gristmill demo` from the repository root (or `make demo`)")
            return 2

    t0 = _stage(1, total, "build the dataset (writes the demo corpus and tokenizer on first use)",
                f"gristmill data build --config {args.data_config}")  # fmt: skip
    cfg = load_config(DataConfig, args.data_config)
    result = build(cfg)
    print(f"    build stage took {time.time() - t0:.0f} s")
    if not result.ok:
        print(f"error: validation of {result.output} failed; see the problems above")
        return 1
    data_dir = result.output

    _stage(
        2, total, "validate (already run by the build; rerun any time)", f"gristmill data validate {data_dir}"
    )
    print(f"    validation: {'ok' if result.report is None or result.report.ok else 'FAILED'}")

    _stage(3, total, "audit the dataset", f"gristmill data audit {data_dir} --plots {data_dir}/audit")
    print_summary([data_dir])
    con, _ = connect([data_dir])
    try:
        plots = write_plots(con, data_dir / "audit")
    finally:
        con.close()
    print(f"    plots in {data_dir / 'audit'}/: {', '.join(p.name for p in plots)}")
    if args.skip_train:
        return 0

    # The trainer, export, verify and eval run as the user runs them: through the CLI's command
    # table (pipelines/ imports nothing of training/ beyond its contract).
    from pipelines.cli import main as gristmill

    # Two runs of the same recipe: the first stops at step 100 as a preempted job would, the second
    # picks its checkpoint up (`--resume auto` also makes a rerun of the demo continue, not restart).
    train = ["train", "--config", args.train_config, "--resume", "auto", "--set", f"data.dataset={data_dir}"]
    t0 = _stage(4, total, "train a small Llama on it (CPU), stop at step 100, resume from the checkpoint",
                f"gristmill train --config {args.train_config} --resume auto --set run.max_steps=100\n"
                f"    $ gristmill train --config {args.train_config} --resume auto")  # fmt: skip
    for extra in (["run.max_steps=100"], []):
        if rc := gristmill([*train, *extra]):
            return rc
    print(f"    training stage took {time.time() - t0:.0f} s")

    run_dir = train_output_dir(args.train_config)
    _stage(5, total, "export the step-100 checkpoint (HF format), then check every file against its checksum",
           f"gristmill export {run_dir} --step 100\n    $ gristmill verify {run_dir}")  # fmt: skip
    print("    (step 150 was exported during training: checkpoint.export_interval)")
    for command in (["export", str(run_dir), "--step", "100"], ["verify", str(run_dir)]):
        if rc := gristmill(command):
            return rc

    t0 = _stage(6, total, "evaluate both exports with lm-eval on held-out documents (offline)",
                f"gristmill eval {run_dir} --config {args.eval_config} --step 100   (and --step 150)\n"
                f"    $ gristmill data audit {run_dir} --sql \"{EVAL_SQL}\"")  # fmt: skip
    for step in (100, 150):
        if rc := gristmill(["eval", str(run_dir), "--config", args.eval_config, "--step", str(step)]):
            return rc
    if rc := gristmill(["data", "audit", str(run_dir), "--sql", EVAL_SQL]):
        return rc
    print(f"    eval stage took {time.time() - t0:.0f} s; plot: {run_dir / 'eval.png'}")
    return 0
