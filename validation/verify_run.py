"""`gristmill verify RUN`: every checkpoint and export of a run against its recorded checksums.

    gristmill verify runs/train/demo

Checkpoints are checked against the sizes and CRC-32s in their COMPLETE record, exports (and the
merged weights' of [merge], exports/merged-step-N) against gristmill_checksums.json (SHA-256), the
same checks a resume, an export and an eval make before they trust a file. Prints one row per
checkpoint or export; exits 1 if any is damaged (an incomplete checkpoint, an interrupted save, is
reported but is not damage).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.checkpoint.checkpointer import dir_size
from training.checkpoint.hf_export import ExportError, verify_export
from training.checkpoint.io import missing_step_reason, verify_checkpoint
from training.checkpoint.record import CheckpointError
from training.contract.dataset_format import DATASET_JSON
from training.contract.disk_space import fmt_bytes
from training.contract.errors import GristmillError
from training.contract.run_layout import (
    CHECKPOINTS_DIR,
    CONFIG_TOML,
    EXPORTS_DIR,
    incomplete_reason,
    is_training_run,
    list_steps,
    step_name,
)
from validation.audit import Result, format_table

COLUMNS = ["kind", "step", "status", "files", "size", "detail"]


def _size(path: Path) -> tuple[int, str]:
    return sum(p.is_file() for p in path.iterdir()), fmt_bytes(dir_size(path))


def verify_run(run_dir: str | Path, only: int | None = None) -> list[tuple]:
    """Rows (kind, step, status, files, size, detail); status is ok, unchecked (no checksums
    recorded), incomplete or DAMAGED. `only`: that step's checkpoint and export alone."""
    run_dir = Path(run_dir)
    rows = []
    kinds = (("checkpoint", CHECKPOINTS_DIR, False), ("export", EXPORTS_DIR, False),
             ("merged export", EXPORTS_DIR, True))  # fmt: skip
    for kind, sub, merged in kinds:
        for step in list_steps(run_dir / sub, merged):
            if only is not None and step != only:
                continue
            path = run_dir / sub / step_name(step, merged)
            reason = incomplete_reason(path) if kind == "checkpoint" else None
            if reason is not None:
                rows.append((kind, step, "incomplete", *_size(path), reason))
                continue
            try:
                note = verify_checkpoint(path) if kind == "checkpoint" else verify_export(path)
                status, detail = ("unchecked", note.removeprefix("note: ")) if note else ("ok", "")
            except (CheckpointError, ExportError) as e:
                status, detail = "DAMAGED", str(e)
            rows.append((kind, step, status, *_size(path), detail))
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="training run directory (holds config.toml, checkpoints/)")
    parser.add_argument(
        "--step", type=int, help="check only this step's checkpoint and export (and say why it has none)"
    )


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    if not is_training_run(run_dir):
        what = "is a dataset directory" if (run_dir / DATASET_JSON).is_file() else f"has no {CONFIG_TOML}"
        raise GristmillError(
            f"{run_dir} {what}, not a training run: pass the run directory (run.output_dir) of "
            "`gristmill train`; `gristmill data validate` checks a dataset"
        )
    rows = verify_run(run_dir, args.step)
    if not rows and args.step is not None:
        why = missing_step_reason(run_dir, args.step)
        raise GristmillError(f"{run_dir} has no checkpoint or export of step {args.step}: {why}")
    if not rows:
        print(f"{run_dir} has no checkpoints or exports yet")
        return 0
    print(format_table(Result("verify", COLUMNS, rows), max_rows=None, max_width=200))
    damaged = [r for r in rows if r[2] == "DAMAGED"]
    print(f"{len(rows)} checked: {len(damaged)} damaged" + (" (see detail)" if damaged else ""))
    return 1 if damaged else 0
