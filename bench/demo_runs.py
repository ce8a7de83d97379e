"""What the A/B benches over `gristmill train` share (bench/rewind_cost.py, bench/batch_record.py,
bench/merge.py): the demo recipe they default to, the check that its datasets exist, and the
overrides that keep a timed run to its training loop (no validation, trackers' files or plots)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs/train/demo.toml"
DEMO_DATASETS = ("runs/data/demo", "runs/data/demo-code")  # the two sources configs/train/demo.toml reads


def require_demo_datasets(config: Path = DEMO) -> None:
    """Stop with one line when `config` is the demo recipe and `make demo` has not built its data."""
    if config == DEMO and not all((ROOT / d / "dataset.json").exists() for d in DEMO_DATASETS):
        raise SystemExit("the demo datasets are missing: run `make demo` first (or pass --config and --set)")


def timed_overrides(steps: int) -> list[str]:
    """`steps` steps, a metrics row every 5, no validation, no tensorboard files or plots, one
    checkpoint kept: what each bench run shares before its own settings."""
    return [
        f"run.max_steps={steps}",
        "run.val_every=0",
        "run.log_every=5",
        "metrics.tensorboard=false",
        "metrics.plot=false",
        "checkpoint.keep_last=1",
    ]
