"""Checkpoints that never fail silently: DCP saves (sync or async), resume, retention, exports.

    RUN/checkpoints/step-000500/  __0_0.distcp  __1_0.distcp  .metadata  COMPLETE

Every Stateful object of training.checkpoint.state.checkpointables (model and optimizer as sharded
DTensors, LR schedule, loader position, step/token counters, per-rank RNG streams) is written with
torch.distributed.checkpoint, so a checkpoint saved on N ranks loads on M. The rules, each one a
lesson from someone's lost run:

- Complete means `.metadata` (written by DCP after every rank's data) *and* the `COMPLETE` record
  (step, tokens, config hash, save time, and every file's size and CRC-32) that rank 0 writes
  after it, fsynced and renamed into place. Each rank hashes the files it wrote right after the
  write (in the background thread for async saves) into a small record rank 0 merges. Resume and
  export ignore anything incomplete and refuse anything whose files no longer match, naming the
  file; `--resume auto` then falls back to the newest checkpoint that verifies and says so.
- Weights and optimizer state must be finite after a load and before a save (training.train's
  non-finite guard keeps them so; this is the last line).
- Async saves copy the state into host buffers kept for the run (training/checkpoint/staging.py:
  pinned on CUDA, copied on a side stream that the next optimizer step waits for), then write in a
  background thread on their own gloo group (`dcp.async_save` needs one: its collectives must not
  interleave with training's). At most one is in flight; the next save and the end of training
  wait for it (`checkpoint_wait_s` in the metrics row, with a one-time note when writes outlast
  the interval); a background failure is raised at the next step's `poll()`, stopping the run. A
  state whose shapes changed since the first save no longer fits the buffers and is refused.
- A write that fails (ENOSPC, read-only, permission; DCP raises CheckpointException, a
  BaseException) stops the run with a CheckpointError naming the path and the last complete
  checkpoint. Before each save the free space is checked against an estimate of its size.
- Retention runs only after a new checkpoint is complete (its checksums taken from the files as
  written, so it verifies), in a thread of its own (the next save waits for it before its disk
  check, and so does the end of training), keeps the newest `keep_last` complete ones, and deletes
  an old one's COMPLETE record first (fsynced) so a half-deleted directory is never taken for
  complete.
- One run directory holds one timeline: a new run (no --resume), or a resume from another run
  directory's checkpoint, into a directory that already holds complete checkpoints is refused;
  `--resume auto` refuses when every complete checkpoint fails verification (starting over beside
  them would mix two runs); retention counts only steps up to the one just saved.
- COMPLETE records the model (ModelConfig): a resume into another model shape is refused before
  anything is loaded, and the export builds the checkpoint's own model.
- Reading a checkpoint (resume here, the model for an export) is training/checkpoint/io.py's:
  checksums first, an allow-list unpickler for `.metadata`, one line for any DCP failure.
"""

from __future__ import annotations

import contextlib
import errno
import json
import resource
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from training.checkpoint.base_record import (
    base_record_sha256,
    check_kept_base,
    other_base_reason,
    read_base_record,
    unrecorded_base_reason,
)
from training.checkpoint.hf_export import export_checkpoint
from training.checkpoint.io import (
    _single_process_quiet,
    checkpoint_error_cause,
    checkpoint_keys,
    checkpoints_out_of_reach,
    final_weights_note,
    load_or_raise,
    newest_verified,
    nonfinite_tensor,
    state_tensors,
    untrained_steps,
    verify_checkpoint,
)
from training.checkpoint.record import (
    ARCHITECTURE_FIELDS,
    BASE_RECORD,
    CONFIG_RECORD,
    MODEL_RECORD,
    RESUME_ONLY,
    RUN_RECORD,
    CheckpointError,
    describe_differences,
    is_resume_only,
    model_differences,
    read_complete_record,
    recorded_model,
    sealed_record,
    start_changes,
)
from training.checkpoint.staging import HostStaging, PreStaged, state_dict_of
from training.config import CheckpointSection
from training.console import say
from training.contract.atomic_write import fsync_dir, tmp_path_for, write_atomic
from training.contract.disk_space import fmt_bytes, free_bytes, shortfall
from training.contract.errors import GristmillError, NonFiniteError, peer_gone
from training.contract.integrity import (
    EXPORT_META,
    checkpoint_identity,
    directory_id,
    file_records,
    read_ledger,
    record_began,
    record_copied,
    record_saved,
)
from training.contract.run_layout import (
    CHECKPOINTS_DIR,
    CHECKPOINTS_JSONL,
    COMPLETE_FILE,
    CONFIG_TOML,
    DCP_METADATA,
    abandoned_name,
    checkpoint_dir,
    complete_steps,
    export_dir,
    incomplete_reason,
    is_complete_checkpoint,
    is_training_run,
    list_steps,
    names_a_step,
    run_of_checkpoint,
    set_aside_after,
    step_of,
    unlike_a_run,
)
from training.data.loader import foreign_state_message
from training.optim import optimizer_name, saved_optimizer

# --- what is on disk ---------------------------------------------------------------------------

RANK_RECORD = ".files-rank{:05d}.json"  # a rank's file checksums until rank 0 merges them into COMPLETE


def _earlier_run(run_dir: str | Path) -> str | None:
    """'RUN/checkpoints already holds step-000040 (saved …)' when the run directory has a complete
    checkpoint (abandoned-step-N directories and incomplete leftovers do not count), else None."""
    steps = complete_steps(run_dir)
    if not steps:
        return None
    newest = checkpoint_dir(run_dir, steps[-1])
    try:
        when = read_complete_record(newest).get("completed_at")
    except CheckpointError:
        when = None
    details = [f"saved {when}"] if when else []
    if len(steps) > 1:
        details.append(f"and {len(steps) - 1} older complete checkpoint(s)")
    return f"{newest.parent} already holds {newest.name}" + (f" ({', '.join(details)})" if details else "")


def check_auto_reach(run_dir: str | Path) -> None:
    """`--resume auto` refused where the run's checkpoints are out of reach (RUN/checkpoints a link to
    an unmounted disk; deleted while checkpoints.jsonl records saves): `train --resume auto --plan`
    asks it too, where it printed a plan from step 0, exit 0 (review RV78c 4)."""
    if (away := checkpoints_out_of_reach(run_dir)) is not None:
        raise CheckpointError(f"--resume auto: {away}")


def find_resume(run_dir: str | Path, spec: str, checksums: bool = True) -> tuple[Path | None, list[str]]:
    """The checkpoint `--resume spec` means ("auto", a path, or "": none) and lines explaining the
    choice. One run directory holds one run's checkpoints: a new run (no --resume), or a resume from
    another run directory's checkpoint, into a directory that already holds complete checkpoints is
    refused (retention, export and --resume auto would mix the two runs' steps). `checksums=False` (`train
    --plan`): a path's checks without its files' checksums, a read of the whole checkpoint (RV32h N3)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not spec:
        if (away := checkpoints_out_of_reach(run_dir, recorded=False)) is not None:
            raise CheckpointError(away)  # taken for a fresh run's, the run's record was set aside (RV67e 3)
        held = _earlier_run(run_dir)
        if held is not None:
            raise CheckpointError(
                f"{held} of an earlier run; continue that run with --resume auto, or use another "
                f"run.output_dir (or delete {root} to start over from step 0)"
            )
        return None, []
    if spec != "auto":
        path = Path(spec)
        if not path.is_dir():
            raise CheckpointError(  # "latest", "last": the word a user of another trainer tries (RV65b)
                f"--resume {spec}: no such checkpoint directory; give a checkpoint's path "
                "(RUN/checkpoints/step-N), or auto for the run's newest complete one that verifies"
            )
        saved = [path / DCP_METADATA, path / COMPLETE_FILE, *path.glob("*.distcp")]
        # a save cut at once: an empty step folder of a run's checkpoints/ (R22i M5, R22j M2)
        # (the parent's name as given: through a link, R22k M1)
        killed = path.absolute().parent.name == CHECKPOINTS_DIR and names_a_step(path.resolve().name)
        if not any(p.exists() for p in saved) and not (killed and not any(path.iterdir())):
            # nothing of a save: a run directory, an export, a dataset read as a save that did not finish
            # (reviews R22f U1; told by what it holds, not its name: a copied checkpoint is one, R22h M1)
            if is_training_run(path):
                what = f"{path} is a run directory"
            elif (path / EXPORT_META).is_file():
                what = f"{path} is an export (weights to start a run from: model.init_from)"
            else:
                what = unlike_a_run(path)
            raise CheckpointError(
                f"--resume {spec}: {what}, not a checkpoint (RUN/checkpoints/step-N); give one, or "
                "--resume auto with run.output_dir set to the run"
            )
        reason = incomplete_reason(path)
        if reason:
            raise CheckpointError(
                f"--resume {spec} is not a complete checkpoint: {reason}; use --resume auto to take the "
                "newest complete one"
            )
        if path.resolve().parent == root.resolve() and path.resolve().name.startswith("abandoned-"):
            # Its timeline was left: this directory's steps up to it (checkpoints, exports, evals,
            # metrics rows) are the other timeline's, which nothing would set aside (review R15c F3).
            raise CheckpointError(
                f"--resume {spec} is a checkpoint of a timeline this run left (a resume or a rewind set it "
                f"aside), and this run directory's earlier steps are the other timeline's: resume from it "
                "into another run.output_dir (--set run.output_dir=NEW)"
            )
        held = _earlier_run(run_dir)
        if held is not None and path.resolve().parent != root.resolve():
            raise CheckpointError(
                f"--resume {spec} is a checkpoint of another run directory, but {held}: a run directory "
                f"holds one run's checkpoints; continue this run with --resume auto, or resume from {spec} "
                f"into another run.output_dir (or delete {root} to start over)"
            )
        try:
            note = verify_checkpoint(path, checksums=checksums)
        except CheckpointError as e:
            raise CheckpointError(
                f"--resume {spec}: {e}; use --resume auto to take the newest one that verifies"
            ) from None
        return path, [f"resuming from {path} (given by --resume)", *([note] if note else [])]
    check_auto_reach(run_dir)
    path, note, passed_over = newest_verified(run_dir)
    notes = [f"  skipped {p.name}: {reason}" for p, reason in passed_over]
    if path is not None:
        head = f"resuming from {path}, the newest complete checkpoint that verifies"
        return path, [head, *notes, *([note] if note else [])]
    damaged = [reason for p, reason in passed_over if incomplete_reason(p) is None]
    if damaged:  # starting over here would train a new run beside (and prune against) the damaged one
        raise CheckpointError(
            f"--resume auto: no complete checkpoint in {root} verifies ({'; '.join(damaged)}); repair or "
            f"restore the damaged files from a copy, or move {root} and {CHECKPOINTS_JSONL} aside to start "
            "over from step 0"
        )
    return None, [f"--resume auto: no complete checkpoint in {root}; starting from step 0", *notes]


def _json_text(content: Any) -> str:
    return json.dumps(content, indent=2) + "\n"


def write_complete_record(path: Path, record: dict[str, Any]) -> None:
    """COMPLETE, written after `.metadata` (and every rank's file checksums): whole or absent after
    a crash (the contract's write_atomic: temporary file, fsync, rename, fsync of the directory)."""
    write_atomic(path / COMPLETE_FILE, _json_text(sealed_record(record)))


# The advice of a full disk: lowering checkpoint.keep_last was advised, and on a resume it freed nothing
# (retention ran only after a save completed, which the disk did not allow: review R23c 4). A resume
# now runs the retention of the checkpoint it resumed from (finish_missed), before its first save.
_RETENTION_FREES_NOTHING = (
    "checkpoint.keep_last deletes old checkpoints after a save completes and when a run resumes, so a "
    "lower one frees them at the resume; or delete the ones you do not need"
)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, every rank's failure a DCP CheckpointException holds, and their causes and contexts."""
    seen, todo = [], [exc]
    failures = getattr(exc, "failures", None) or {}
    todo += [v[0] if isinstance(v, tuple) else v for v in failures.values()]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
    return seen


def _no_space(exc: BaseException, root: Path) -> str | None:
    """ "no space left" when the failure was a full disk: ENOSPC somewhere in the exception chain,
    or (torch's zip writer reports ENOSPC as "unexpected pos …") a filesystem with almost nothing
    free after the failed write."""
    full = any(
        getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)
        for e in _chain(exc)
    )
    if not full and free_bytes(root) >= 1 << 20:
        return None
    return (
        f"no space left on the filesystem of {root} ({fmt_bytes(free_bytes(root))} free); "
        f"free space on it ({_RETENTION_FREES_NOTHING})"
    )


def _too_large(exc: BaseException) -> str | None:
    """ "File too large" when the process has a file size limit (`ulimit -f`) and the write failed
    past it: EFBIG in the chain, or torch's zip writer's "unexpected pos …" for it (review R26a F4)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    if not any(getattr(e, "errno", None) == errno.EFBIG or "unexpected pos" in str(e) for e in _chain(exc)):
        return None
    return (
        f"File too large: this process may write files of at most {fmt_bytes(limit)} (`ulimit -f`); "
        "raise the limit (`ulimit -f unlimited`)"
    )


def delete_checkpoint(path: Path) -> None:
    """COMPLETE first (and made durable), so a deletion cut short never leaves a 'complete' husk. A
    link (a checkpoint kept elsewhere, linked in) is removed, never what it names: retention deleted
    the copy's COMPLETE through it, then failed on the link at every resume (trial RV63a 2)."""
    if path.is_symlink():
        path.unlink()
        return
    marker = path / COMPLETE_FILE
    if marker.exists():
        marker.unlink()
        fsync_dir(path)
    shutil.rmtree(path)


def prune(
    run_dir: str | Path, keep_last: int, log=say, *, saved: int, rewind: tuple[int, int] | None = None
) -> list[int]:
    """Retention, called after checkpoint `saved` became complete: delete complete checkpoints older
    than the newest `keep_last` (0: keep all) and incomplete leftovers older than `saved`. Only steps
    up to `saved` are counted and only older ones deleted: `saved` itself always stays, and a higher
    step (a save in flight, or no checkpoint of this timeline) is never touched. `rewind` =
    (oldest, margin) keeps what a rewind from a later step may need (training/run/rewind.py): the
    newest complete checkpoint at or before saved + 1 − margin, and every one after it, none older
    than `oldest`. A resume-only checkpoint older than `saved` is deleted, and counted in neither.
    Returns the deleted steps."""
    complete = [s for s in complete_steps(run_dir) if s <= saved]
    if saved not in complete:  # retention runs only after a save completed; nothing to measure against
        return []
    # A resume-only save (a stop's, a run.max_steps chunk's) is kept only while it is the newest:
    # counted in keep_last it would delete what a run never stopped keeps, and a rewind would go back
    # to it (Checkpointer.resume_only).
    regular = [s for s in complete if not is_resume_only(checkpoint_dir(run_dir, s))]
    keep = set(regular[-keep_last:]) if keep_last else set(regular)
    keep.add(saved)
    if rewind is not None:
        oldest, margin = rewind
        candidates = [s for s in regular if s >= oldest]
        back = [s for s in candidates if s <= saved + 1 - margin]
        keep.update(s for s in candidates if s >= (back[-1] if back else saved + 2 - margin))
    deleted = []
    for step in list_steps(Path(run_dir) / CHECKPOINTS_DIR):
        if step < saved and step not in keep:
            delete_checkpoint(checkpoint_dir(run_dir, step))
            deleted.append(step)
    if deleted:
        log(f"retention: deleted checkpoint(s) {', '.join(map(str, deleted))} (keeping {sorted(keep)})")
    return deleted


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- the trainer's checkpointer ----------------------------------------------------------------


@dataclass
class _Pending:
    """An async save in flight: its step and tokens, DCP's future, when the save and the write began
    and (set by the writer thread) when the write ended."""

    step: int
    tokens: int
    merged: bool  # the state saved holds the merged weights of its step, to export ([merge] export)
    resume_only: bool  # Checkpointer.resume_only
    future: Future
    t0: float
    write_start: float
    write_end: float | None = None


def resume_checks(
    path: Path,
    record: dict[str, Any],
    model_config: dict[str, Any] | None,
    config: dict[str, Any] | None,
    optimizer: str | None,
) -> list[str]:
    """Every refusal of a resume from checkpoint `path` (COMPLETE `record`) before anything loads, and
    its notes, with this run's model config, identity config and optim.name (None: no optimizer state):
    another model or base, a start setting changed, another optimizer. Rank 0's resume and `train --plan
    --resume` both ask it: the plan printed, exit 0, where the resume refused (trial RV77b 1)."""
    notes = resume_model_notes(path, record, model_config)  # another model is refused before any load
    check_resume_start(path, record, model_config, config)
    if optimizer is not None:
        check_resume_optimizer(path, optimizer)
    return notes


def check_resume_start(
    path: Path, record: dict[str, Any], model_config: dict[str, Any] | None, config: dict[str, Any] | None
) -> None:
    """Before loading `path` (rank 0's, and `train --plan --resume`'s), with this run's model config and
    identity config (what COMPLETE records): a setting that only decides how a run starts (START_SETTINGS)
    changed since the checkpoint is refused in one line: the checkpoint's weights replace what it
    decides, so it changed nothing while the resume called it in effect and recorded it."""
    started = start_changes(record, model_config, config)
    if not started:
        return
    changed = "; ".join(f"{k} = {json.dumps(now)} in this config, {json.dumps(then)} in the checkpoint"
                        for k, then, now in started)  # fmt: skip
    sets = " ".join(f"{k}={json.dumps(then)}" for k, then, _ in started)
    raise CheckpointError(
        f"cannot resume from {path}: {changed}; {'it decides' if len(started) == 1 else 'they decide'} "
        "only the weights a run starts from, and a resume continues the checkpoint's: drop the "
        f"override (or --set {sets}), or, for another start, train without --resume (a new run "
        "directory: another run.output_dir)"
    )


def check_resume_optimizer(path: Path, now: str) -> None:
    """Another optim.name (`now`) than checkpoint `path`'s is refused in one line before any load (the
    trainer's, and `train --plan --resume`'s): the state of one optimizer does not fit the other (DCP
    would stop on a missing momentum_buffer)."""
    saved = saved_optimizer(checkpoint_keys(path))
    if saved is not None and saved != now:
        raise CheckpointError(
            f"cannot resume from {path}: it holds the state of optim.name = '{saved}', and this config has "
            f"optim.name = '{now}'; resume with --set optim.name={saved}, or train with {now} in a new run "
            "directory (another run.output_dir)"
        )


def resume_model_notes(path: Path, record: dict[str, Any], model_config: dict[str, Any] | None) -> list[str]:
    """Before loading `path` (rank 0's, and `train --plan --resume`'s: trial RV77b 1), with this config's
    `model_config` (its init_from set to the run's recorded base, as the checkpoints record it): a
    checkpoint of another model shape is refused in one line
    (DCP would load a 2-layer checkpoint into a 1-layer model without a word, or fail with
    torch's size mismatch); other model settings that changed get a note. Checkpoints without a
    model record (written before gristmill kept one) are not checked."""
    source = run_of_checkpoint(path)
    if (source / CONFIG_TOML).is_file():  # its run's RUN/base/ (a volume's path: no run to tell)
        try:  # as it recorded it: else the next checkpoints record none (review R22f S2)
            check_kept_base(source, path)
        except GristmillError as e:
            raise CheckpointError(f"cannot resume from {path}: {e}") from None
    recorded = recorded_model(record)
    if recorded is None or model_config is None:
        return []
    diffs = model_differences(recorded, model_config)
    base = [d for d in diffs if d[0] == "init_from_sha256"]
    if "init_from_sha256" not in recorded and model_config.get("init_from_sha256"):
        base = [("init_from_sha256", "", model_config["init_from_sha256"])]  # older: random init
    if base:  # continued pretraining from another base ([model] init_from): other weights entirely
        was = recorded.get("init_from") or "random initialisation"
        now = model_config.get("init_from") or "random initialisation"
        if was == now:  # the same base, read as another model: its files changed since the start
            raise CheckpointError(
                f"cannot resume from {path}: the base {now} reads as another model than the run started "
                f"from (sha256 {base[0][2] or '-'} now, {base[0][1] or '-'} then): its files changed "
                "since; restore them, or move the folder away (a resume reads the base's shape from the "
                "checkpoint, never its weights)"
            )
        raise CheckpointError(
            f"cannot resume from {path}: it continues from another base model ({was}, sha256 "
            f"{base[0][1] or '-'}; this config: {now}, sha256 {base[0][2] or '-'}); set model.init_from "
            "to the run's base, or start a new run directory (another run.output_dir)"
        )
    moved = any(d[0] == "init_from" for d in diffs)
    # the base of the checkpoint's run: another run's, resumed from by path, has its own record
    run, now = run_of_checkpoint(path), model_config.get("init_from")
    kept = read_base_record(run)
    # Held to the run's record whenever this config names another base, not only on a move: a run an
    # earlier gristmill resumed with another commit's directory records that directory since (R25e 2)
    why = other_base_reason(run, now) if now else None
    if why is None and moved and kept is None:  # a volume's path: nothing records the base's weights
        why = unrecorded_base_reason(path, str(recorded.get("init_from")), now)
    if why:
        raise CheckpointError(  # the record would name another base than the run's (review R17b S4)
            f"cannot resume from {path}: {why}, or start a new run directory (another run.output_dir)"
        )
    if now and kept is not None and kept.get("init_from"):
        # The checkpoints record the run's base, not the place a resume read it from (a directory
        # holding a hub base's commit): the next resume pins the hub id from it (review R25e 3)
        model_config["init_from"] = kept["init_from"]
    diffs = [d for d in diffs if d[0] != "init_from"]  # the same base, moved: not a change
    shape = [d for d in diffs if d[0] in ARCHITECTURE_FIELDS]
    if shape:
        sets = " ".join(f"model.{k}={json.dumps(a)}" for k, a, _ in shape)
        raise CheckpointError(
            f"cannot resume from {path}: it holds another model "
            f"({describe_differences(shape, 'in the checkpoint', 'in this config')}); resume with the "
            f"config it was written with ({path.parent.parent / CONFIG_TOML} of its run, or --set "
            f"{sets}), or start a new run directory (another run.output_dir)"
        )
    if not diffs:
        return []
    changed = describe_differences(diffs, "in the checkpoint", "now")
    return [f"note: model settings differ from {path.name}'s ({changed}); continuing with this config's"]


class Checkpointer:
    """Saves, resumes, prunes and exports for one run; every rank holds one, rank 0 does the files.

    Call order in the loop: `poll()` at the start of every step, `save(step, tokens)` when
    `due(step)`, `close()` at the end (waits for an async save in flight).
    """

    def __init__(
        self,
        cfg: CheckpointSection,
        run_dir: str | Path,
        states: dict[str, Any],
        *,
        rank: int,
        world_size: int,
        last_step: int,
        config_sha256: str,
        estimate_bytes: int,
        plan_last_step: int | None = None,
        model_config: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        rewind_keep: Callable[[], tuple[int, int]] | None = None,
        merged_export: Callable[[int], bool] | None = None,
        lost: Callable[[], str | None] | None = None,
        completed: Callable[[int], None] | None = None,
    ):
        """`rewind_keep`: while rewinds are on, what retention keeps for one, (oldest step, margin)
        (the timeline's oldest rewind target and run.rewind.margin_steps); `merged_export`: with
        [merge] export = true, whether the state saved at a step holds that step's merged weights
        (asked at the save; exported with the checkpoint); `states`: checkpointables(...);
        `plan_last_step`: the plan's last step, saved by every run (resume_only); `config`: the applied
        config (as JSON) whose hash `config_sha256` is, recorded beside it (CONFIG_RECORD);
        `completed`: called on rank 0 with a step once its COMPLETE is written, before its exports and
        retention (a test's kill point, training/run/faults.py)."""
        self.cfg, self.run_dir, self.states = cfg, Path(run_dir), states
        self.staging: HostStaging | None = None  # async saves' host buffers, made at the first one
        self.rank, self.world_size, self.last_step = rank, world_size, last_step
        self.plan_last_step = plan_last_step  # the plan's last step (last_step: this invocation's)
        self.config_sha256, self.config = config_sha256, config
        # dataclasses.asdict of the run's ModelConfig: recorded in COMPLETE (the export builds the
        # checkpoint's own model from it) and checked before a resume loads anything.
        self.model_config = model_config
        self.estimate_bytes, self.estimate_basis = estimate_bytes, "estimated from the parameter count"
        self.log = say if rank == 0 else (lambda *a, **k: None)
        self.root = self.run_dir / CHECKPOINTS_DIR
        distributed = dist.is_initialized()
        self.no_dist = not distributed  # one process: DCP skips its collectives (and its warning)
        # Rank 0's decisions (disk guard, resume path) reach the others over this CPU group.
        self.ctl_group = dist.new_group(backend="gloo") if distributed and world_size > 1 else None
        # dcp.async_save's collectives run in a background thread: they get a group of their own.
        self.async_group = dist.new_group(backend="gloo") if distributed and cfg.async_ else None
        self.pending: _Pending | None = None
        self.low_disk: str | None = None  # set while on_low_disk = "skip" is skipping saves
        # What the last save cost the loop: copying into the staging buffers (async), waiting for
        # the previous write; and how long the last finished async write took.
        self.last_stage_s = self.last_wait_s = self.last_write_s = 0.0
        self._unlogged: dict[str, float] = {}  # sums since the metrics row last took them
        self._last_request: tuple[int, float] | None = None  # step and time of the last save call
        self._advised = False  # the "writes outlast the interval" note is printed once
        self._retention: threading.Thread | None = None  # rank 0's retention of the last save
        self._retention_error: BaseException | None = None
        self.rewind_keep = rewind_keep
        self.merged_export = merged_export
        self.lost = lost or (lambda: None)
        self.completed = completed or (lambda step: None)
        self.resumed_here = False  # resumed from this run directory's own checkpoint (not another run's)
        self.set_aside_steps: list[int] = []  # rank 0: the complete checkpoints the resume set aside
        # rank 0: (step, COMPLETE sha256) of saves whose line of RUN/checkpoints.jsonl could not be
        # written yet; written first at the next save's (_record_saved)
        self._unrecorded: list[tuple[int, str]] = []
        self.run_id: str | None = None  # RUN/checkpoints.jsonl's run id (open_ledger), in each COMPLETE
        self.resumed_path: Path | None = None  # the checkpoint resumed, on every rank
        # rank 0, after a resume: the checkpoint, and the config hash and config its COMPLETE records
        # (the run's resume note compares configs: training/run/setup.py)
        self.resumed_from: tuple[Path, str | None, dict[str, Any] | None] | None = None

    # -- decisions shared by all ranks --
    def _from_rank0(self, value: Any) -> Any:
        if self.ctl_group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.ctl_group)
        return box[0]

    def _anywhere(self, problem: str | None) -> str | None:
        """The first rank's problem ("rank R: …"), or None when no rank has one (collective)."""
        if self.ctl_group is None:
            return problem
        every: list[str | None] = [None] * self.world_size
        dist.all_gather_object(every, problem, group=self.ctl_group)
        return next((f"rank {r}: {b}" for r, b in enumerate(every) if b is not None), None)

    def _nonfinite_anywhere(self) -> str | None:
        """The first non-finite parameter or optimizer state tensor on any rank (described), or None."""
        model, optim = self.states.get("model"), self.states.get("optimizer")
        bad = (
            None
            if model is None
            else nonfinite_tensor(state_tensors(model.model, getattr(optim, "optimizer", None)))
        )
        return self._anywhere(bad)

    def staged(self) -> None:
        """Before the state changes other than by an optimizer step (the merged weights swapped into
        the model to be scored): the device waits for an async save's copy of it (a no-op on CPU,
        where the copy is done when `save` returns)."""
        if self.staging is not None:
            self.staging.order_after_copy()

    @property
    def requested_step(self) -> int | None:
        """The step of the last save this run asked for (None: none yet)."""
        return None if self._last_request is None else self._last_request[0]

    def due(self, step: int) -> bool:
        return self.cfg.saves(step, self.last_step)

    def resume_only(self, step: int) -> bool:
        """Whether a save of `step` is one a run that was never stopped does not make: at a stop
        (SIGTERM, data that cannot be read) or at a run.max_steps off the interval's grid. It resumes
        the run, but it is no rewind's target and counts in no keep_last, so that a later spike
        rewinds, and retention keeps, as in that run (COMPLETE records it; prune deletes it once a
        later save completes)."""
        on_grid = self.cfg.interval > 0 and step % self.cfg.interval == 0
        return not (on_grid or step == self.plan_last_step)

    def rewind_target_steps(self) -> list[int]:
        """The steps of this run's complete checkpoints that a rewind may go back to (not verified
        here: what the start's warning of a rewind that cannot happen looks at)."""
        steps = complete_steps(self.run_dir)
        return [s for s in steps if not is_resume_only(checkpoint_dir(self.run_dir, s))]

    def newest_complete(self) -> str:
        """The run's newest complete checkpoint, as the messages that name it say it: with none in its
        directory, the other run directory's it resumed from (rank 0), which --resume auto would not
        find (review R23f 1), or "none"."""
        steps = complete_steps(self.run_dir)
        if steps:
            return str(checkpoint_dir(self.run_dir, steps[-1]))
        if (other := self.resumed_elsewhere()) is not None:
            return f"{other} (the checkpoint this run resumed from, in another run directory)"
        return "none"

    def resumed_elsewhere(self) -> Path | None:
        """The other run directory's checkpoint this run resumed from (every rank: one that alone met a
        failed save says it: review R23i 6), when its own holds none."""
        if self.resumed_path is None or self.resumed_here or complete_steps(self.run_dir):
            return None
        return self.resumed_path

    def resume_option(self) -> str:
        """How to go on from the newest complete checkpoint: `--resume auto`, or `--resume PATH` for the
        other run directory's this run resumed from (auto would start over from step 0: R23h M3)."""
        other = self.resumed_elsewhere()
        return "--resume auto" if other is None else f"--resume {other}"

    # -- resume --
    def resume(self, spec: str, check: Callable[[Path | None], None] | None = None) -> int | None:
        """Load the checkpoint `spec` names ("auto" or a path; "" = none); returns its step or None.
        Also with "": a new run into a directory that holds another run's checkpoints is refused.
        `check`, on every rank: given the checkpoint once it is loaded (before the newer ones are set
        aside: a refusal leaves the run's files as they were), or None where none is resumed."""
        choice, record = None, {}
        if self.rank == 0:
            try:
                path, notes = find_resume(self.run_dir, spec)
                if path is not None:
                    record = read_complete_record(path)
                    optimizer = getattr(self.states.get("optimizer"), "optimizer", None)
                    name = None if optimizer is None else optimizer_name(optimizer)
                    notes += resume_checks(path, record, self.model_config, self.config, name)
                choice = ("path", None if path is None else str(path))
                for line in notes:
                    self.log(line)
            except CheckpointError as e:
                choice = ("error", str(e))
            except Exception as e:  # any other failure still reaches every rank (they wait on it)
                choice = ("error", f"cannot choose a checkpoint to resume from: {type(e).__name__}: {e}")
        kind, value = self._from_rank0(choice)  # every rank takes rank 0's choice, or its error
        if kind == "error":
            raise CheckpointError(value)
        if value is None:
            if check is not None:
                check(None)
            return None
        path = Path(value)
        step = self._load(path)
        if check is not None:
            check(path)
        # the next save's size: this one's, not the parameter count's guess (a disk guard after a resume
        # said "estimated from the parameter count" beside the checkpoints it could measure: R23c 4)
        self.estimate_bytes, self.estimate_basis = dir_size(path), f"the size of {path.name}"
        # resolved whole, as find_resume takes it: a link to this run's checkpoint is this run's
        # (its parent taken first, it read as another run's: exports set aside, metrics started
        # over, RUN/base/ dropped: review R15f F1)
        self.resumed_here, self.resumed_path = self.owns(path), path
        if self.rank == 0:
            config = record.get(CONFIG_RECORD)
            self.resumed_from = (
                path,
                record.get("config_sha256"),
                config if isinstance(config, dict) else None,
            )
            if self.resumed_here:
                self.set_aside_steps = self._set_aside_newer(step, f"the resumed step {step}")
        return step

    def open_ledger(self, step: int | None) -> None:
        """Rank 0, once the resume is chosen (`step`: the step resumed, None: a fresh run): RUN/
        checkpoints.jsonl a record of this run's saves. A fresh run, or one from another run's
        checkpoint, sets an earlier run's aside (abandoned-checkpoints.jsonl: its lines vouched for that
        run's exports, put back, as this run's: trial RV58b F1) and begins its own at step 0 or the step
        resumed; a resume of a run from before the record begins it at its step."""
        if self.rank != 0:
            return
        path = self.run_dir / CHECKPOINTS_JSONL
        if (step is None or not self.resumed_here) and path.exists():
            kept = abandoned_name(path)
            path.rename(kept)
            self.log(f"note: {path} is an earlier run's in this directory; moved it to {kept.name}")
        if not path.exists():
            try:
                record_began(self.run_dir, step or 0, uuid.uuid4().hex)
            except OSError as e:
                self.log(f"warning: {CHECKPOINTS_JSONL} not written ({e.strerror or e})")
        # what each save records of the run (RUN_RECORD): the record's own, none where it has none (a
        # record from before the id, or none written): a save can then never name another record's run
        ledger = read_ledger(self.run_dir)
        if ledger.run is not None and ledger.directory not in (None, directory_id(self.run_dir)):
            # a copy of the run's directory, resumed: its saves from here carry an id of their own
            try:
                record_copied(self.run_dir, step or 0, uuid.uuid4().hex)
            except OSError as e:
                self.log(f"warning: {CHECKPOINTS_JSONL} not written ({e.strerror or e})")
            ledger = read_ledger(self.run_dir)
        self.run_id = ledger.run

    def _record_saved(self, step: int) -> None:
        """RUN/checkpoints.jsonl's line of complete checkpoint `step`, unless its last line of the step
        is it already (a resume repairs a line a kill between COMPLETE and it left out: the step's line
        of an earlier timeline then called the run's own export another checkpoint's, review RV57e 3).
        A line that cannot be written is a warning: the checkpoint is complete. It is kept, and written
        before the next save's: retention may delete its checkpoint meanwhile, and without the line
        verify called the step's export another run's (DAMAGED)."""
        identity = checkpoint_identity(checkpoint_dir(self.run_dir, step))
        line = (step, identity)
        if (
            identity is not None
            and line not in self._unrecorded
            and read_ledger(self.run_dir).last(step) != identity
        ):
            self._unrecorded.append(line)
        self._write_unrecorded(last=False)

    def _write_unrecorded(self, last: bool) -> None:
        """The lines of RUN/checkpoints.jsonl not written yet, in order; `last`: the run's last chance
        (its end, after retention freed room: a disk still full at the last save lost them, review
        RV59d 1)."""
        while self._unrecorded:
            missed, identity = self._unrecorded[0]
            try:
                record_saved(self.run_dir, missed, identity)
            except OSError as e:
                then = "" if last else "written with the next save's; if the run stops first, "
                steps = [s for s, _ in self._unrecorded]  # every one left out, not the first alone (RV65f 3)
                which = f"step {steps[0]}" if len(steps) == 1 else f"steps {', '.join(map(str, steps))}"
                self.log(
                    f"warning: {CHECKPOINTS_JSONL} not written ({e.strerror or e}): {then}an export of "
                    f"{which} whose checkpoint retention deletes cannot be told from another run's"
                )
                return
            del self._unrecorded[0]

    def finish_missed(self, step: int | None) -> None:
        """Rank 0, after a resume of this run's own checkpoint `step` (None: no resume) and after the
        start's checks of what an export writes (training/run/setup.py: refused here instead, the
        tokenizer files stopped the start in another line per rank, review RV29e F1): what the process
        missed when it stopped between the checkpoint's COMPLETE and them. Retention: killed there at
        the last step, a run kept for good a checkpoint the run never stopped deleted, since its resume
        saves nothing more (review RV51a 3); done first, and waited for, so that a keep_last lowered
        after a disk filled by the exports frees room for them (review RV52c 2: it never deletes
        `step`). Then the exports."""
        if step is None or self.rank != 0 or not self.resumed_here:
            return
        self._record_saved(step)
        self._retain(step)
        self._join_retention()
        merged = self.merged_export is not None and self.merged_export(step)
        self._export(step, merged, verified=False, missed=True)

    def rewind_target(self, *, oldest: int, newest: int) -> tuple[int, list[str]] | None:
        """The newest complete checkpoint that verifies between steps `oldest` and `newest` (rank 0
        chooses, every rank gets its choice; a save in flight finishes first, retention waits) and the
        newer ones passed over, each with why; None when there is none."""
        if self.pending is not None:
            self._finish_pending()
        self._join_retention()
        choice = None
        if self.rank == 0:
            try:
                path, _, passed_over = newest_verified(self.run_dir, within=(oldest, newest), rewind=True)
                passed = [f"{p.name}: {why}" for p, why in passed_over]
                choice = ("path", None if path is None else step_of(path), passed)
            except Exception as e:  # every rank waits on rank 0's choice: it gets the error instead
                choice = ("error", f"cannot choose a checkpoint to rewind to: {type(e).__name__}: {e}", [])
        kind, value, passed = self._from_rank0(choice)
        if kind == "error":
            raise CheckpointError(value)
        return None if value is None else (value, passed)

    def restore(self, step: int) -> None:
        """Every rank loads this run's checkpoint of `step` (a rewind_target) and the newer ones are
        set aside (`abandoned-step-N`)."""
        self._load(checkpoint_dir(self.run_dir, step))
        problem = None
        if self.rank == 0:
            try:
                self._set_aside_newer(step, f"step {step}, which the rewind goes back to")
            except OSError as e:
                problem = f"cannot set aside the checkpoints after step {step} in {self.root}: {e}"
        problem = self._from_rank0(problem)
        if problem is not None:
            raise CheckpointError(problem)

    def owns(self, path: Path) -> bool:
        """Whether checkpoint `path` is this run directory's (resolved whole: a link to it is)."""
        return path.resolve().parent == self.root.resolve()

    def _load(self, path: Path) -> int:
        """Every rank loads checkpoint `path` into the run's states; returns its step."""
        keys = checkpoint_keys(path)
        loader = self.states.get("dataloader")
        if loader is not None and not {f"dataloader.{k}" for k in loader.state_dict()} <= keys:
            raise CheckpointError(foreign_state_message(str(path)))
        states, timeline = self.states, self.states.get("timeline")
        older = timeline is not None and not any(k.startswith("timeline.") for k in keys)
        if older:  # written before the timeline was saved on its own: the loader's plan held its skips
            states = {k: v for k, v in states.items() if k != "timeline"}
        # Told the checkpoint's keys first: a resume onto more ranks keeps the new ranks' own RNG
        # streams (TrainState), a merge refuses a checkpoint of a run without one (training/merge.py).
        expecting = [v for v in states.values() if hasattr(v, "expect")]
        try:
            for state in expecting:
                state.expect(keys)
            load_or_raise(states, path, CheckpointError, "resume from", no_dist=self.no_dist)
        finally:
            for state in expecting:
                state.expect(None)
        if older:
            timeline.adopt(loader.saved_skips)
        if loader is not None and timeline is not None:
            loader.note_cut_skips(timeline.skips)
        trained = self.states["train_state"].step
        furthest = max((s.spike_step for s in timeline.skips), default=0) if timeline is not None else 0
        # this run's own (another run's discarded rows are not in this directory: R18g 2)
        if loader is not None and self.owns(path) and furthest > trained:
            loader.check_trained_through(
                furthest, f"a rewind's discarded attempt trained up to step {furthest}, past this checkpoint"
            )
        if loader is not None and loader.step != trained:
            # Saved by gristmill before 2026-11-29 after a data error on one rank of several: the loader
            # had counted the batch of a step not trained. What was trained is the train state's step.
            say(
                f"note: {path} holds the loader at step {loader.step}, not at its trained step {trained}; "
                f"continuing with step {trained + 1}'s batch"
            )
            loader.seek(trained)
        bad = self._nonfinite_anywhere()
        if bad is not None:
            raise CheckpointError(
                f"{path} holds non-finite values ({bad}); resume from an earlier one with --resume PATH"
            )
        return self.states["train_state"].step

    def _set_aside_newer(self, step: int, what: str) -> list[int]:
        """Checkpoints newer than the resumed one (or the one a rewind goes back to: `what` says which)
        belong to an abandoned timeline: incomplete ones are deleted, complete ones renamed
        `abandoned-step-N` (never deleted); returns their steps."""
        for s in list_steps(self.root):
            path = checkpoint_dir(self.run_dir, s)
            if s > step and not is_complete_checkpoint(path):
                delete_checkpoint(path)
        moved = set_aside_after(self.root, step)
        for path, target in moved:
            self.log(f"note: {path.name} is newer than {what}; moved it to {target.name}")
        return [step_of(path) for path, _ in moved]

    # -- save --
    def poll(self) -> None:
        """Start of a step: finish an async save that is done (raising if it failed); in skip mode,
        warn again that checkpoints are being skipped."""
        if self.pending is not None and self.pending.future.done():
            self._finish_pending()
        if self.low_disk is not None:
            self.log(f"WARNING: checkpoints are being SKIPPED: {self.low_disk}")

    def abandon(self, timeout_s: float = 600.0) -> None:
        """On an error in the loop: let an async save in flight finish its write (its files belong to
        a step whose state was finite) and retention its deletion before the process group and the
        lock go, never raising."""
        with contextlib.suppress(BaseException):
            self._join_retention()
            self._write_unrecorded(last=self.pending is None)
        if self.pending is None:
            return
        fut, self.pending = self.pending.future, None
        with contextlib.suppress(BaseException):
            fut.result(timeout=timeout_s)

    def finish(self) -> None:
        """Wait for an async save in flight and complete it (raising if it failed): its state is a trained,
        finite step's, so a run that stops on an error that is not the save's keeps it."""
        if self.pending is not None:
            self._finish_pending()

    def close(self) -> None:
        """Wait for an async save in flight (raising if it failed) and for retention, and free the
        staging buffers."""
        try:
            self.finish()
            self._join_retention()
            self._write_unrecorded(last=True)
        finally:
            if self.staging is not None:
                self.staging.close()
                self.staging = None

    def _retain(self, saved: int) -> None:
        """Retention in a thread of its own: deleting an old checkpoint's files takes time the loop
        need not wait for (1.0 s for 1.4 GB on the CI VM's disk; a 1.24B model's is 15 GB). It
        only touches checkpoints older than `saved` (the one just completed), never a save in flight."""
        self._join_retention()

        def run() -> None:
            try:
                keep = self.rewind_keep() if self.rewind_keep is not None else None
                prune(self.run_dir, self.cfg.keep_last, log=self.log, saved=saved, rewind=keep)
            except BaseException as e:  # raised in the training thread at the next save or close
                self._retention_error = e

        self._retention = threading.Thread(target=run, name="checkpoint-retention")
        self._retention.start()

    def _join_retention(self) -> None:
        if self._retention is not None:
            self._retention.join()
            self._retention = None
        if self._retention_error is not None:
            e, self._retention_error = self._retention_error, None
            raise CheckpointError(
                f"retention could not delete an old checkpoint in {self.root}: {type(e).__name__}: {e}"
            )

    def take_timings(self) -> dict[str, float]:
        """`checkpoint_stage_s` and `checkpoint_wait_s` summed over the saves since the last call
        (the trainer adds them to its next metrics row); {} when there was none."""
        out, self._unlogged = self._unlogged, {}
        return out

    def _count(self, name: str, seconds: float) -> None:
        self._unlogged[name] = self._unlogged.get(name, 0.0) + seconds

    def _advise(self, step: int, requested: float) -> None:
        """Once per run: a periodic save had to wait because writes take longer than the interval."""
        prev = self._last_request
        if self._advised or prev is None or step - prev[0] != self.cfg.interval:
            return  # a last-step or signal save soon after a periodic one says nothing of the interval
        self._advised = True
        self.log(
            f"note: checkpoint writes take {self.last_write_s:.1f} s but the interval is "
            f"{self.cfg.interval} steps ≈ {requested - prev[1]:.1f} s: saves wait for the previous write "
            f"({self.last_wait_s:.1f} s at step {step}); raise checkpoint.interval"
        )

    def save(self, step: int, tokens: int, *, blocking: bool = False, on_timeline: bool = False) -> bool:
        """Save the state of `step`, resume-only when off the grid (resume_only) unless `on_timeline`
        (a save every run makes at that step: a rewind's); returns False if the disk guard skipped it
        (on_low_disk=skip)."""
        resume_only = not on_timeline and self.resume_only(step)
        requested = time.perf_counter()
        self.last_stage_s = 0.0
        unfinished = self.pending is not None and not self.pending.future.done()
        if self.pending is not None:  # at most one in flight: wait for the previous write
            self._finish_pending()
        self._join_retention()  # the disk check below counts the space retention frees
        self.last_wait_s = time.perf_counter() - requested
        self._count("checkpoint_wait_s", self.last_wait_s)  # ~0 when the previous save was done
        if unfinished:
            self._advise(step, requested)
        self._last_request = (step, requested)
        merged = self.merged_export is not None and self.merged_export(step)  # the state as saved
        staged = self.cfg.async_ and not blocking
        state = state_dict_of(self.states) if staged else None
        bad = self._nonfinite_anywhere()  # the trainer's guard should make this impossible: the last line
        if bad is not None:
            cause = f"refusing to save step {step}: the state holds non-finite values ({bad})"
            raise NonFiniteError(f"{cause}. Last complete checkpoint: {self.newest_complete()}", cause=cause)
        if staged and self.staging is not None and self.staging.before_optimizer_state(state):
            self.staging.close()  # the previous write is done (above): its buffers are free
            self.staging = None
        changed = self._anywhere(self.staging and self.staging.changed(state)) if staged else None
        if changed is not None:
            raise CheckpointError(
                f"refusing to save step {step}: {changed}; an async save copies into host buffers sized at "
                "the first save, so the state must keep its shapes during a run (save synchronously, or "
                f"start a new run). Last complete checkpoint: {self.newest_complete()}"
            )
        path = checkpoint_dir(self.run_dir, step)
        # Rank 0's checks, then its preparation; the broadcast is also the barrier after them. A run
        # directory replaced under the run may be another run's: nothing is written or deleted there.
        lost = self.lost() if self.rank == 0 else None
        problem = self._prepare(step) if self.rank == 0 and lost is None else None
        lost, problem = self._from_rank0((lost, problem))
        if lost is not None:
            raise GristmillError(lost)
        if problem is not None:
            if self.cfg.on_low_disk == "stop":
                raise CheckpointError(problem + ' (or set checkpoint.on_low_disk = "skip")')
            self.low_disk = problem
            self.log(f"WARNING: checkpoint of step {step} SKIPPED: {problem}")
            return False
        self.low_disk = None
        t0 = time.perf_counter()
        try:
            with _single_process_quiet():
                if staged:
                    if self.staging is None:
                        optimizer = getattr(self.states.get("optimizer"), "optimizer", None)
                        self.staging = HostStaging(optimizer, log=self.log)
                    host_state = self.staging.stage(state)
                    self.last_stage_s = time.perf_counter() - t0
                    self._count("checkpoint_stage_s", self.last_stage_s)
                    write_start = time.perf_counter()
                    # (no no_dist here: async_save infers it, and older torch lacks the argument)
                    fut = dcp.async_save(
                        host_state,
                        checkpoint_id=str(path),
                        storage_writer=self.staging.writer(str(path)),
                        process_group=self.async_group,
                        async_stager=PreStaged(),
                    )
                    fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse on newer torch
                    pending = _Pending(step, tokens, merged, resume_only, fut, t0, write_start)
                    pending.future = self._then_record(fut, path, pending)
                    self.pending = pending
                    return True
                dcp.save(self.states, checkpoint_id=str(path), no_dist=self.no_dist)
            self._record_own_files(path)
        except BaseException as e:
            self._failed(step, e)
        self._complete(step, tokens, t0, merged, resume_only)
        return True

    def _then_record(self, fut: Future, path: Path, pending: _Pending) -> Future:
        """A future that is done when DCP's write is and this rank's files are hashed, both in the
        background (the hashing runs in the thread that finished the write)."""
        out: Future = Future()

        def done(f: Future) -> None:
            try:
                f.result()
                self._record_own_files(path)
                pending.write_end = time.perf_counter()
                out.set_result(None)
            except BaseException as e:  # CheckpointException is a BaseException
                out.set_exception(e)

        fut.add_done_callback(done)
        return out

    def _record_own_files(self, path: Path) -> None:
        """Size and CRC-32 of the files this rank just wrote (DCP names them __RANK_N.distcp; rank 0
        also wrote .metadata), into a small record that rank 0 merges into COMPLETE."""
        names = [p.name for p in path.iterdir() if p.name.startswith(f"__{self.rank}_")]
        if self.rank == 0:
            names.append(DCP_METADATA)
        write_atomic(path / RANK_RECORD.format(self.rank), _json_text(file_records(path, names, "crc32")))

    def _collect_records(self, path: Path, timeout_s: float = 600.0) -> dict[str, Any]:
        """Rank 0: every rank's file record (waiting for ranks still hashing), merged; a file no
        rank claimed (another writer layout) is hashed here, so COMPLETE covers every file."""
        deadline = time.monotonic() + timeout_s
        records: dict[str, Any] = {}
        for rank in range(self.world_size):
            record = path / RANK_RECORD.format(rank)
            while not record.is_file():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {rank} did not record its files' checksums ({record})")
                time.sleep(0.02)
            records.update(json.loads(record.read_text(encoding="utf-8")))
        skip = {COMPLETE_FILE, tmp_path_for(path / COMPLETE_FILE).name} | {
            RANK_RECORD.format(r) for r in range(self.world_size)
        }
        rest = [
            p.name for p in path.iterdir() if p.is_file() and p.name not in records and p.name not in skip
        ]
        records.update(file_records(path, rest, "crc32"))
        return records

    def _prepare(self, step: int) -> str | None:
        """Rank 0 before a save: the disk guard, and a stale directory of this step out of the way."""
        need = int(self.estimate_bytes * self.cfg.min_free_factor)
        short = shortfall(self.root, need)
        if short is not None:  # a problem string, not DiskFullError: on_low_disk = "skip" only warns
            return (
                f"only {fmt_bytes(short[0])} free on the filesystem of {self.root}; a checkpoint needs "
                f"{fmt_bytes(self.estimate_bytes)} ({self.estimate_basis}) × checkpoint.min_free_factor "
                f"{self.cfg.min_free_factor:g} = {fmt_bytes(need)}. Last complete checkpoint: "
                f"{self.newest_complete()}. Free space on it ({_RETENTION_FREES_NOTHING}), then resume "
                f"with {self.resume_option()}"
            )
        path = checkpoint_dir(self.run_dir, step)
        if path.is_dir():  # left by a killed run that got this far before: never half-overwrite
            delete_checkpoint(path)
        self.root.mkdir(parents=True, exist_ok=True)
        return None

    def _finish_pending(self) -> None:
        p, self.pending = self.pending, None
        try:
            p.future.result()
        except BaseException as e:
            self._failed(p.step, e)
        self.last_write_s = (p.write_end or time.perf_counter()) - p.write_start
        self._complete(p.step, p.tokens, p.t0, p.merged, p.resume_only)

    def _failed(self, step: int, exc: BaseException):
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise exc
        if self.world_size > 1 and peer_gone(exc) is not None:
            # another rank died mid-save: its collective failed of that, no fault of the storage (it said
            # "could not be written … Fix the cause": trial RV67c F3); train.main says it as it says any
            raise exc
        path = checkpoint_dir(self.run_dir, step)
        cause = _no_space(exc, self.root) or _too_large(exc) or checkpoint_error_cause(exc)
        raise CheckpointError(
            f"checkpoint of step {step} could not be written to {path}: {cause}. Last complete "
            f"checkpoint: {self.newest_complete()}. Fix the cause, then resume with {self.resume_option()}"
        ) from None

    def _complete(self, step: int, tokens: int, t0: float, merged: bool, resume_only: bool) -> None:
        """Rank 0 after DCP's .metadata: the COMPLETE record (with every rank's file checksums), an
        export if due (and the merged weights' when the state held them, `merged`), then retention."""
        if self.rank != 0:
            return
        if (lost := self.lost()) is not None:  # replaced during the write: no COMPLETE, no retention there
            raise GristmillError(lost)
        path = checkpoint_dir(self.run_dir, step)
        try:
            if not (path / DCP_METADATA).is_file():
                raise FileNotFoundError(f"{path / DCP_METADATA} missing after the save returned")
            files = self._collect_records(path)
            write_complete_record(
                path,
                {
                    "step": step,
                    "tokens": tokens,
                    "config_sha256": self.config_sha256,
                    **({CONFIG_RECORD: self.config} if self.config is not None else {}),
                    "save_seconds": round(time.perf_counter() - t0, 3),
                    "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "world_size": self.world_size,
                    **({RESUME_ONLY: True} if resume_only else {}),
                    **({MODEL_RECORD: self.model_config} if self.model_config is not None else {}),
                    **({BASE_RECORD: base} if (base := base_record_sha256(self.run_dir)) else {}),
                    **({RUN_RECORD: self.run_id} if self.run_id is not None else {}),
                    "files": files,
                },
            )
            for rank in range(self.world_size):
                (path / RANK_RECORD.format(rank)).unlink(missing_ok=True)
        except (OSError, TimeoutError, ValueError) as e:
            self._failed(step, e)
        self._record_saved(step)
        seconds = time.perf_counter() - t0
        self.estimate_bytes, self.estimate_basis = dir_size(path), f"the size of {path.name}"
        self.log(f"checkpoint {path} complete ({fmt_bytes(self.estimate_bytes)}, {seconds:.1f} s)")
        self.completed(step)
        self._export(step, merged, verified=True)  # hashed as written, just now
        self._retain(step)

    def _untrained(self, step: int) -> bool:
        """Whether checkpoint `step` is a rewind's save of an earlier step's weights (io.untrained_steps,
        by RUN/data_plan.json, which the rewind writes before it saves)."""
        try:
            return step in untrained_steps(self.run_dir)
        except GristmillError:  # a damaged RUN/data_plan.json costs the run no export (it rewrites it)
            return False

    def _export(self, step: int, merged: bool, *, verified: bool, missed: bool = False) -> None:
        """Rank 0: the exports due at complete checkpoint `step`: every checkpoint.export_interval
        steps, and its merged weights when it holds them (`merged`). `missed`: only those not there
        (the process stopped between the checkpoint's COMPLETE and its exports)."""
        due = [False] if self.cfg.export_interval and step % self.cfg.export_interval == 0 else []
        if due and self._untrained(step):
            due = []
        for kind in due + ([True] if merged else []):
            if missed and export_dir(self.run_dir, step, kind).is_dir():
                continue
            out = export_checkpoint(self.run_dir, step, verified=verified, merged=kind)
            what = (
                f"the merged weights of step {step}; permanent"
                if kind
                else "permanent: HF LlamaForCausalLM + tokenizer"
            )
            late = (
                f"; missed when step {step}'s checkpoint completed: the process stopped first"
                if missed
                else ""
            )
            final = None if kind else final_weights_note(self.run_dir, step)  # (trial RV71d 2)
            self.log(f"export {out} written ({what}{late})" + (f"; {final}" if final else ""))
