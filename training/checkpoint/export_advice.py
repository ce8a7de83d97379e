"""How to write an export again, in a refusal's words: the one home of that advice (export_fix), for
an export eval, verify or a run's start from it (model.init_from) refuses. An export may hold the only
copy of its weights (retention keeps exports whose checkpoints it deleted), so it is moved aside, never
deleted (review RV32f A6, RV33c F4)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from training.checkpoint.record import CheckpointError
from training.contract.integrity import CHECKPOINT_IDENTITY, EXPORT_META, checkpoint_identity
from training.contract.run_layout import MERGED_PREFIX, checkpoint_dir, step_of


def _verifies(checkpoint: Path) -> bool:
    """Whether `checkpoint` is there and verifies (an export can be written again from it)."""
    # imported here, not at the top: io imports DCP, and the launcher's preflight reaches this module
    # through base_record without the trainer (test_the_launcher_checks_without_importing_the_trainer)
    from training.checkpoint.io import verify_checkpoint

    try:
        verify_checkpoint(checkpoint)
    except CheckpointError:
        return False
    return True


def export_command(
    run_dir: str | Path, step: int, merged: bool = False, out: Path | None = None, dtype: str = "fp32"
) -> str:
    """`gristmill export RUN --step N [--merged] [--out DIR --dtype D]`, quoted for a shell: what the
    advice of an export's refusals (and verify's) gives to paste."""
    return shlex.join(
        ["gristmill", "export", str(run_dir), "--step", str(step), *(["--merged"] if merged else []),
         *(["--out", str(out), "--dtype", dtype] if out is not None else [])]
    )  # fmt: skip


def export_step_of(path: Path) -> tuple[Path, int, bool] | None:
    """(run, step, merged) of a run's step export `path` (RUN/exports/step-N, merged-step-N), else None."""
    try:
        step = step_of(path.with_name(path.name.removeprefix(MERGED_PREFIX)))
    except ValueError:
        return None
    return path.parent.parent, step, path.name.startswith(MERGED_PREFIX)


def export_again(path: Path) -> tuple[str, bool] | None:
    """How to write export `path` again, and whether from the run's base (step 0, RUN/base's record):
    moved aside, never deleted (retention keeps exports whose checkpoints it deleted: review R14f F1,
    RV31L F4), then exported from its checkpoint while that verifies; None where its weights are
    nowhere else."""
    if (of := export_step_of(path)) is None:
        return None
    run, step, merged = of
    if step == 0 and not merged:
        return (
            f"move {path} aside and export it again from the run's base ({export_command(run, 0)}), which "
            "needs the base at hand"
        ), True
    if not _verifies(checkpoint_dir(run, step)):  # a complete but damaged one: nothing to re-export from
        return None
    return (
        f"move {path} aside and export it again from its checkpoint ({export_command(run, step, merged)})",
        False,
    )


def _recorded_step(path: Path) -> tuple[Path, int, bool, str] | None:
    """(checkpoint, step, merged, dtype) that export `path` outside a run's exports (an --out folder)
    was written from, as its gristmill_export.json records them; None where it records no checkpoint
    (a copy of a run's export records copied_from), cannot be read, or does not hold together."""
    try:
        meta = json.loads((path / EXPORT_META).read_text(encoding="utf-8"))
        ckpt, step = Path(meta["checkpoint"]), int(meta["step"])
        dtype = json.loads((path / "config.json").read_text(encoding="utf-8")).get("torch_dtype")
        # the record is one of the files a refusal says may be damaged: its step must be its
        # checkpoint's, and that checkpoint the one it was exported from (another timeline's step N
        # since a rewind has another COMPLETE), else no command is given (review RV34g H2: an edited
        # step wrote another step's weights into the export's place). A checkpoint gone since is
        # export_fix's "gone or damaged"; an export of before the identity record gets no command.
        same = step_of(ckpt) == step and checkpoint_identity(ckpt) in (meta[CHECKPOINT_IDENTITY], None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (ckpt, step, bool(meta.get("merged")), "bf16" if dtype == "bfloat16" else "fp32") if same else None


def export_fix(path: Path, what: str | None) -> str:
    """How to replace export `path`'s damaged or unloadable `what` (None: the export is no good as a
    whole, another base's: nothing of it to restore): from its checkpoint while the run keeps it
    (export_again; for an export outside a run's exports, the checkpoint its gristmill_export.json
    records, into its place: review RV34c G3); else from a copy only. The one home of this advice: an
    export may be the only copy of its weights, so it is never "delete" (review RV32f A6)."""
    again = export_again(path)
    if again is None and export_step_of(path) is None:  # no run's step (an --out folder, a copy)
        restore = f"restore {what or path.name} from a copy of the export"
        keep = "keep the export meanwhile: it may hold the only copy of its weights"
        if (recorded := _recorded_step(path)) is None:  # unknown: where it came from is not recorded
            return (
                f"{restore}, or export its step again from its run's checkpoint where that still has one, to "
                f"another folder (gristmill export RUN --step N --out DIR); {keep}"
            )
        ckpt, step, merged, dtype = recorded
        if not _verifies(ckpt):  # a complete but damaged one left nothing to export from
            return f"{restore}; {keep} (the checkpoint it was exported from, {ckpt}, is gone or damaged)"
        command = export_command(ckpt.parent.parent, step, merged, path, dtype)
        return f"{restore}, or move {path} aside and export it again from its checkpoint ({command}); {keep}"
    if again is None:
        return (
            f"restore {what or path.name} from a copy of the export; keep the export meanwhile: its "
            "checkpoint is gone or damaged, so its weights are nowhere else"
        )
    return f"{again[0]}; or restore {what} from a copy" if again[1] and what is not None else again[0]
