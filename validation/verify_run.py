"""`gristmill verify RUN`: every checkpoint and export of a run against its recorded checksums, and
every step's recorded batch against the plan.

    gristmill verify runs/train/demo

Checkpoints are checked against the sizes and CRC-32s in their COMPLETE record, exports (and the
merged weights' of [merge], exports/merged-step-N) against gristmill_checksums.json (SHA-256), and
a run from a base model ([model] init_from) its RUN/base/ against what its checkpoints recorded: the
same checks a resume, an export and an eval make before they trust a file. Prints one row per
checkpoint or export (and the base's); exits 1 if any is damaged (an incomplete checkpoint, an
interrupted save, is reported but is not damage).

The batches (`verify_batches`): RUN/batches.bin holds the digest of every step the run trained, as
the trainer was fed it (training/contract/batch_record.py); each is compared with the batch the
plan gives that step, rebuilt from RUN/config.toml and the datasets RUN/data_plan.json recorded
(the digest `gristmill data inspect RUN --hash` prints), the recorded steps with the run's timeline
(none of a rewind's skipped steps, none missing in between or before a checkpoint) and the metrics
rows' `batch_sha256` with the records. Silent when all agree; otherwise one line naming the first
step that differs, and exit 1. It needs no reference run: this is what proves that a killed and
resumed run trained the batches an uninterrupted one would have (docs/loader-and-phases.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from training.checkpoint.base_record import BASE_JSON, check_kept_base
from training.checkpoint.base_source import unrecorded_step0
from training.checkpoint.checkpointer import dir_size
from training.checkpoint.hf_export import (
    ExportError,
    UnrecordedBase,
    check_base_export,
    not_the_run_s,
    of_another_checkpoint,
    run_config,
    verify_export,
)
from training.checkpoint.io import (
    checkpoints_out_of_reach,
    missing_step_reason,
    verify_checkpoint,
)
from training.checkpoint.record import (
    RUN_RECORD,
    CheckpointDenied,
    CheckpointError,
    newest_base_record,
    own_saves,
    read_complete_record,
    resume_model_record,
)
from training.contract.batch_record import BatchEntry, read_batches
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import DatasetError
from training.contract.disk_space import fmt_bytes
from training.contract.errors import GristmillError
from training.contract.integrity import Ledger, read_ledger
from training.contract.run_layout import (
    BASE_DIR,
    BATCHES_BIN,
    CHECKPOINTS_DIR,
    CHECKPOINTS_JSONL,
    DROPPED_LINES,
    EXPORTS_DIR,
    METRICS_JSONL,
    checkpoint_dir,
    complete_steps,
    incomplete_reason,
    is_training_run,
    kept_rows,
    list_steps,
    read_metrics,
    step_name,
    unlike_a_run,
)
from training.data.loader import BatchBuilder, batch_sha256
from training.data.plan import Plan, Skip, skip_of
from training.data.recipe import run_plan
from validation.audit import Result, format_table

COLUMNS = ["kind", "step", "status", "files", "size", "detail"]


def _size(path: Path) -> tuple[int, str]:
    try:
        # files in subfolders too (an export's additional_chat_templates/: review RV67d 10)
        return sum(p.is_file() for p in path.rglob("*")), fmt_bytes(dir_size(path))
    except FileNotFoundError:  # deleted while it was read: _row says so
        return 0, fmt_bytes(0)


GONE = "deleted while it was read (retention of a run training now)"


def verify_run(run_dir: str | Path, only: int | None = None) -> list[tuple]:
    """Rows (kind, step, status, files, size, detail); status is ok, unchecked (no checksums
    recorded), incomplete, UNREADABLE (by this user) or DAMAGED. `only`: that step's checkpoint and
    export alone."""
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
                rows.append(_row(path, (kind, step, "incomplete", *_size(path), reason)))
                continue
            try:
                note = verify_checkpoint(path) if kind == "checkpoint" else verify_export(path, step, merged)
                status, detail = ("unchecked", note.removeprefix("note: ")) if note else ("ok", "")
                if kind != "checkpoint" and of_another_checkpoint(path, checkpoint_dir(run_dir, step)):
                    status, detail = "DAMAGED", not_the_run_s(run_dir, step, merged)
                elif kind == "export" and step == 0 and _from_base(run_dir):  # the base, as export holds it
                    if note := check_base_export(path, run_dir):  # an older gristmill's record
                        status, detail = "unchecked", note.removeprefix("note: ")
            except UnrecordedBase as e:  # no record to hold it to: never "ok" (trial RV69c F1)
                status, detail = "unchecked", str(e)
            except CheckpointDenied as e:  # access, not the bytes (review RV67e 9)
                status, detail = "UNREADABLE", str(e)
            except (CheckpointError, ExportError, FileNotFoundError) as e:
                status, detail = "DAMAGED", str(e)
            rows.append(_row(path, (kind, step, status, *_size(path), detail)))
    # Every export of a step ships RUN/base/'s files, so `--step N` shows the base too; step 0 is the
    # base itself, rebuilt from its own files (what export checks), so its row there is only a fault's
    base = [r for r in _base_row(run_dir) if only is None or only > 0 or r[2] != "ok"]
    # checkpoints out of reach (a link to storage not mounted): "0 damaged", exit 0 (trial RV67a F1, F2)
    away = checkpoints_out_of_reach(run_dir, recorded=False)  # checkpoints deleted once exported: no damage
    lost = [] if away is None else [("checkpoints", 0, "DAMAGED", 0, fmt_bytes(0), away)]
    # the record's row first: the checkpoints' and exports' rows are read by it, and a damaged record
    # listed last blamed every checkpoint before it said so (trial RV70g 4)
    return ([] if only is not None else _record_row(run_dir)) + rows + base + lost


def _row(path: Path, row: tuple) -> tuple:
    """`row` of the folder at `path`, or, where the folder is gone since it was listed (a live run's
    retention: verify crashed with a traceback, or would call the half-read folder damaged: trial
    RV63a 4), a row that says so."""
    return row if path.exists() else (*row[:2], "deleted", 0, fmt_bytes(0), GONE)


def _record_row(run_dir: Path) -> list[tuple]:
    """RUN/checkpoints.jsonl whose first line cannot be read: the record's beginning and run id unread,
    another run's checkpoint passed every check, without a word (trial RV60g F2); one lost (below); one
    of another run (below)."""
    path = run_dir / CHECKPOINTS_JSONL
    ledger = read_ledger(run_dir)
    size = fmt_bytes(path.stat().st_size) if path.is_file() else fmt_bytes(0)
    if ledger.first_unreadable:
        unread = "its first line (where the record begins, and the run's id) is unreadable"
    elif ledger.run is None:
        # deleted, emptied, unreadable or cut at its head while the run's saves carry its id: every check
        # by it was off, another run's checkpoint and export passed, exit 0 (trial RV67a F3)
        unread = _record_lost(path, _carried_run_ids(run_dir))
    else:  # every checkpoint blamed as another run's, the record the odd one out (trial RV67a F6)
        other = _record_of_another_run(ledger, _carried_run_ids(run_dir))
        return [] if other is None else [("record", 0, "DAMAGED", 1, size, f"{path}: {other}")]
    if unread is None:
        return []
    # the fix by the case (review RV67e 8): access for one this user may not read; for one missing,
    # nothing to move aside
    if unread.startswith("cannot be read"):
        fix = "give this user read access to it (or verify as its owner)"
    else:
        aside = "" if not path.exists() else ", or move it aside"
        fix = (
            f"restore it from a copy of the run{aside} (the next resume begins a new record at its step; "
            "the steps before it stay unchecked)"
        )
    detail = f"{path}: {unread}, so another run's checkpoint cannot be told from the run's; {fix}"
    return [("record", 0, "DAMAGED", 1, size, detail)]


def _carried_run_ids(run_dir: Path) -> list[str | None]:
    """The run id each complete checkpoint of the run records (None: saved before the record)."""
    carried = []
    for step in complete_steps(run_dir):
        with contextlib.suppress(CheckpointError):
            carried.append(read_complete_record(checkpoint_dir(run_dir, step)).get(RUN_RECORD))
    return carried


def _record_of_another_run(ledger: Ledger, carried: list[str | None]) -> str | None:
    """Why RUN/checkpoints.jsonl reads as another run's record, where two or more of the run's complete
    checkpoints all carry one run id (`carried`) that none of its lines holds: they are the run's, it
    is not."""
    ids = set(carried)
    if len(carried) < 2 or len(ids) != 1 or None in ids or not ledger.runs or ids & ledger.runs:
        return None
    return (
        f"it records run {', '.join(sorted(ledger.runs))}, while all {len(carried)} checkpoints carry run "
        f"{ids.pop()}: another run's record in this run's place? The checkpoints' and exports' rows follow "
        "from it: restore the run's own record from a copy of the run before moving anything"
    )


def _record_lost(path: Path, carried: list[str | None]) -> str | None:
    """What became of RUN/checkpoints.jsonl (`path`) whose run id is unread, where one of the run's
    complete checkpoints carries a run id (saved under a record), else None (a run from before it)."""
    if not any(run is not None for run in carried):
        return None
    if not path.exists():
        return "missing, while the run's checkpoints carry the run id its first line records"
    if not os.access(path, os.R_OK):
        return "cannot be read by this user"
    return "holds no line where the record begins (the run's id), while the run's checkpoints carry one"


def _from_base(run_dir: Path) -> bool:
    """Whether the run started from a base model ([model] init_from): its RUN/config.toml, else what
    its files say (RUN/base/, its checkpoints' record of it)."""
    try:
        if run_config(run_dir).model.init_from:
            return True
    except (GristmillError, OSError):  # RUN/config.toml unreadable: what the run's files say
        if (run_dir / BASE_DIR / BASE_JSON).exists():
            return True
    return newest_base_record(run_dir) is not None


def _base_row(run_dir: Path) -> list[tuple]:
    """A run from a base ([model] init_from): RUN/base/ as its checkpoints recorded it (the tokenizer
    and special tokens every export ships; step 0's export is rebuilt from it). Deleted or edited,
    export and resume refused the run while verify said every file was ok (trial RV59e 4). Step 0:
    the base. None for a run from scratch (a stray RUN/base/ there included)."""
    folder = run_dir / BASE_DIR
    if not _from_base(run_dir):
        return []
    # as export does: a hub commit names its bytes, so step 0 needs no record of them (RV69e 2)
    step0 = unrecorded_step0(str((resume_model_record(run_dir) or {}).get("init_from")))
    missing = (
        f"{folder / BASE_JSON} is missing: the run started before gristmill kept its base's record, or "
        "resumed from a checkpoint outside its run directory, or it was deleted (then restore RUN/base/ "
        f"from a copy of the run); its {step0}"
    )
    try:
        kept = check_kept_base(run_dir)  # None: no record, and no checkpoint's to compare with
        status, detail = ("ok", "") if kept is not None else ("unchecked", missing)
    except GristmillError as e:
        status, detail = "DAMAGED", str(e)
    size = _size(folder) if folder.is_dir() else (0, fmt_bytes(0))
    return [("base", 0, status, *size, detail)]


@dataclass
class BatchCheck:
    """What `verify_batches` found: the first step that differs (None: all agree) and notes."""

    problem: str | None = None
    notes: list[str] = field(default_factory=list)
    # `only`'s: a record of the step was there to check (its entry in batches.bin, or a timeline row
    # of it carrying batch_sha256; batches.bin unreadable, a timeline row of it: the problem answers).
    # Not a row without a digest: a run, or part of one, from before the record (review RV54b 1).
    compared: bool = False


def verify_batches(run_dir: str | Path, only: int | None = None) -> BatchCheck:
    """Every step recorded in RUN/batches.bin against the plan (see the module); `only`: that step's
    record and row alone."""
    run_dir = Path(run_dir)
    path = run_dir / BATCHES_BIN
    rows, rows_note = (
        read_metrics(run_dir / METRICS_JSONL) if (run_dir / METRICS_JSONL).is_file() else ([], None)
    )
    at_only = [r for r in kept_rows(rows) if r["step"] == only and "loss" in r]  # the timeline's, trained
    if not path.is_file():
        if not any("batch_sha256" in r for r in rows):
            return BatchCheck(
                notes=[f"note: no {path}: the run predates the batch record; its batches are unchecked"]
            )
        # Rows with digests: the run recorded its batches, and the record is gone (or was not copied
        # with the run). Checked as an empty record: every such row is a step without one.
        entries, record_note = [], f"note: no {path}, though metrics.jsonl's rows carry batch digests"
    else:
        try:
            entries, record_note = read_batches(path)  # its note: a torn last record cut off
        except ValueError as e:
            return BatchCheck(f"batches: {e}", compared=bool(at_only))
    compared = any(e.step == only for e in entries) or any("batch_sha256" in r for r in at_only)
    check = BatchCheck(notes=[record_note] if record_note else [], compared=compared)
    try:
        plan, tables, skips = run_plan(run_dir)
    except GristmillError as e:
        check.problem = f"batches: the {len(entries)} recorded steps cannot be checked against the plan: {e}"
        return check
    trained = {r["step"]: r for r in kept_rows(rows) if "loss" in r and "batch_sha256" in r}
    saved = [s for s, _, _ in own_saves(run_dir) if not skip_of(skips, s)]  # not another run's step
    # The plan's batch of each recorded step, as `data inspect RUN --hash` builds it: the global batch.
    whole = tuple(ph.global_batch for ph in plan.phases)
    builder = BatchBuilder(plan, tables, micro_batch=whole, rank=0, world_size=1, check_separators=True)
    problems: list[tuple[int, str]] = []  # (step, what); a step's difference from the plan said first
    for e in entries:
        if (only is None or e.step == only) and 1 <= e.step <= plan.total_steps:
            try:
                planned = batch_sha256(builder.batch(e.step - 1))
            except DatasetError as damaged:  # a shard changed since (run_plan's tables hash each document
                # read), not the record's difference from the plan (trial RV62a F1)
                check.problem = f"batches: step {e.step}'s batch cannot be rebuilt from the data: {damaged}"
                return check
            if planned != e.sha256:
                # the first 16 digits, or where a flipped bit lies past them, all of them
                n = 16 if planned[:16] != e.sha256[:16] else 64
                cut = "…" if n < 64 else ""
                what = f"differs from the plan: recorded {e.sha256[:n]}{cut}, planned {planned[:n]}{cut}"
                problems.append((e.step, what))
    problems += _timeline_problems(entries, plan, skips, trained, saved, only)
    if only is not None:
        problems = [(step, what) for step, what in problems if step == only]
        # a step the record should hold and lacks was compared too: said, not refused as one with
        # nothing to check (trial RV68c F2); other problems (no plan to check against) are not its
        check.compared = check.compared or bool(problems)
    first = min((e.step for e in entries), default=None)
    if only is None and first is not None and first > 1 and not any(s < first for s in trained):
        check.notes.append(
            f"note: steps 1–{first - 1} are not recorded in {path} (the run resumed from another run "
            "directory's checkpoint, or from one saved before gristmill recorded batches)"
        )
    if problems:
        step, what = min(problems, key=lambda p: p[0])
        others = len({s for s, _ in problems}) - 1
        check.problem = f"batches: step {step} {what} ({path})" + (
            f"; {others} more step(s) disagree" if others else ""
        )
    if rows_note is not None and only is None:
        # Rows that cannot be read cannot be compared with the record: a damaged row (its loss and
        # its batch_sha256 edited) passed, said nowhere (review R21d 1). A torn last line is a note.
        if rows_note.startswith(DROPPED_LINES) and check.problem is None:
            check.problem = f"metrics: {rows_note.removeprefix('note: ')}: their rows cannot be checked"
        else:
            check.notes.append(rows_note)
    return check


def _timeline_problems(
    entries: list[BatchEntry],
    plan: Plan,
    skips: tuple[Skip, ...],
    rows: dict[int, dict],
    saved: list[int],
    only: int | None = None,
) -> list[tuple[int, str]]:
    """(step, what is wrong) of the record against the run's timeline: steps in order, within the plan,
    none a rewind skipped, each of the attempt that trained it in the final timeline (1 + the rewinds
    that went back to before it), none missing between two recorded steps or before a checkpoint,
    and the metrics rows' batch_sha256 equal to the records'."""
    problems = []
    recorded: dict[int, str] = {}
    anywhere = {e.step for e in entries}
    previous = None
    for e in entries:
        if not 1 <= e.step <= plan.total_steps:
            # and no more of it: a damaged step field (2**32 + 4) counted the steps "missing" before it,
            # a list of billions (verify ran out of memory: review R21b F2)
            problems.append((e.step, f"is not a step of the plan (1–{plan.total_steps})"))
            continue
        if (skip := skip_of(skips, e.step)) is not None:
            problems.append((e.step, f"is recorded as trained, but rewind {skip.rewind} skipped it"))
        elif e.attempt != (attempt := 1 + sum(s.checkpoint_step < e.step for s in skips)):
            problems.append(
                (e.step, f"is recorded as attempt {e.attempt}'s, but the timeline's is attempt {attempt}")
            )
        if previous is not None and e.step <= previous:
            # a step recorded twice, or records out of order (two swapped: review R24a 4)
            again = "again" if e.step in recorded else "out of order"
            problems.append((e.step, f"is recorded {again} after step {previous}"))
        elif previous is not None:
            gap = (s for s in range(previous + 1, e.step) if skip_of(skips, s) is None and s not in anywhere)
            if (missing := next(gap, None)) is not None:
                problems.append((missing, f"is not recorded (steps {previous} and {e.step} are)"))
        recorded[e.step] = e.sha256
        previous = e.step
    last = max(recorded, default=0)
    # a record cut short (a copy stopped, a full disk): its first missing step, and `only` among them,
    # not the first later step with a row or a checkpoint (step 145 of a record cut at 140, "1 more
    # step(s) disagree" of 10 missing: trial RV68c F2)
    through = max([*(saved if recorded else []), *rows], default=0)
    # none recorded: from the first row with a digest (a run resumed from another run's checkpoint
    # trained none before it here: review RV68d 5)
    start = last + 1 if recorded else min(rows, default=1)
    if last < through and (steps := [s for s in range(start, through + 1) if skip_of(skips, s) is None]):
        ends = f"the record ends at step {last}" if recorded else "the record holds no step"
        why = f"({ends}; the run trained through {through})"
        more = f", nor are the {len(steps) - 1} steps after it to step {through}" if len(steps) > 1 else ""
        problems.append((steps[0], f"is not recorded{more} {why}"))
        if only is not None and only in steps[1:]:
            problems.append((only, f"is not recorded {why}"))
    for step, row in rows.items():
        if step > last:
            continue  # said above
        if step not in recorded:
            problems.append(
                (step, f"has a metrics row (batch_sha256 {row['batch_sha256'][:16]}…) but no record")
            )
        elif row["batch_sha256"] != recorded[step]:
            ours, theirs = row["batch_sha256"][:16], recorded[step][:16]
            problems.append((step, f"has batch_sha256 {ours}… in {METRICS_JSONL}, {theirs}… recorded"))
    return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        action=PathArgument,
        help="training run directory (holds config.toml, checkpoints/)",
    )
    parser.add_argument(
        "--step",
        type=int,
        help="check only this step's checkpoint, export and recorded batch (and why it has no checkpoint)",
    )


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    if not is_training_run(run_dir):
        raise GristmillError(
            f"{unlike_a_run(run_dir)}, not a training run: pass the run directory (run.output_dir) of "
            "`gristmill train`; `gristmill data validate` checks a dataset"
        )
    rows = verify_run(run_dir, args.step)
    batches = verify_batches(run_dir, args.step)
    alone = None  # --step N of a trained step without a checkpoint or export: its recorded batch alone
    if not rows and args.step is not None:
        why = missing_step_reason(run_dir, args.step)
        if not batches.compared:
            raise GristmillError(f"{run_dir} has no checkpoint or export of step {args.step}: {why}")
        alone = f"{run_dir} has no checkpoint or export of step {args.step} ({why}); its recorded batch:"
    damaged = [r for r in rows if r[2] == "DAMAGED"]
    unreadable = [r for r in rows if r[2] == "UNREADABLE"]
    if rows:
        print(format_table(Result("verify", COLUMNS, rows), max_rows=None, max_width=200))
        denied = f", {len(unreadable)} unreadable by this user" if unreadable else ""
        print(
            f"{len(rows)} checked: {len(damaged)} damaged{denied}"
            + (" (see detail)" if damaged or denied else "")
        )
    elif alone is not None:  # it was refused whole, the batch a tampered record named never checked (RV53a 1)
        print(alone)
        # its record was compared (BatchCheck.compared): a row's digest without an entry is a problem
        if batches.problem is None:
            print(f"batches: step {args.step} is the plan's ({run_dir / BATCHES_BIN})")
    else:
        print(f"{run_dir} has no checkpoints or exports yet")
    for line in batches.notes + ([batches.problem] if batches.problem else []):
        print(line)
    return 1 if damaged or unreadable or batches.problem else 0
