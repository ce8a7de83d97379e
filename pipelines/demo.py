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
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-config", default="configs/data/demo.toml", help="data recipe to build")
    parser.add_argument("--train-config", default="configs/train/demo.toml", help="training recipe")
    parser.add_argument("--eval-config", default="configs/eval/demo.toml", help="eval recipe (local tasks)")
    parser.add_argument("--skip-train", action="store_true", help="stop after the audit")


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

    from training.config import TrainConfig
    from training.hf_export import export_checkpoint
    from training.train import main as train_main

    # Two runs of the same recipe: the first stops at step 100 as a preempted job would, the second
    # picks its checkpoint up (`--resume auto` also makes a rerun of the demo continue, not restart).
    sets = ["--set", f"data.dataset={data_dir}"]
    t0 = _stage(4, total, "train a small Llama on it (CPU), stop at step 100, resume from the checkpoint",
                f"gristmill train --config {args.train_config} --resume auto --set run.max_steps=100\n"
                f"    $ gristmill train --config {args.train_config} --resume auto")  # fmt: skip
    for extra in (["run.max_steps=100"], []):
        rc = train_main(["--config", args.train_config, "--resume", "auto", *sets, *extra])
        if rc:
            return rc
    print(f"    training stage took {time.time() - t0:.0f} s")

    run_dir = Path(load_config(TrainConfig, args.train_config).run.output_dir)
    _stage(5, total, "export the step-100 checkpoint (HF format), then check every file against its checksum",
           f"gristmill export {run_dir} --step 100\n    $ gristmill verify {run_dir}")  # fmt: skip
    print(f"    export: {export_checkpoint(run_dir, 100)} (step 150 was exported during training)")
    from validation.verify_run import run as verify

    if verify(argparse.Namespace(run=str(run_dir))):
        return 1

    t0 = _stage(6, total, "evaluate every export with lm-eval on held-out documents (offline)",
                f"gristmill eval {run_dir} --config {args.eval_config}")  # fmt: skip
    from validation.eval import TaskPlan, evaluate_missing, load_eval_config, print_table
    from validation.eval_results import EVAL_PLOT

    cfg = load_eval_config(args.eval_config, [])
    evaluate_missing(run_dir, cfg, TaskPlan(run_dir, cfg), show=False)
    print_table(run_dir)
    print(f"    eval stage took {time.time() - t0:.0f} s; plot: {run_dir / EVAL_PLOT}; SQL: gristmill data "
          f"audit {run_dir} --sql \"SELECT step, task, metric, value FROM eval ORDER BY step\"")  # fmt: skip
    return 0
