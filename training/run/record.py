"""The run directory's account of the run's timeline, with one writer (docs/divergence.md, "The
timeline").

`RunRecord` writes every file of RUN/ that describes the timeline, on rank 0, from the facts the
other components hand it (a completed metrics row, a rewind's skip, the start, the end), so that no
artifact lists a discarded step as the run's and none is written twice for one fact:

- metrics.jsonl: one row per logged step (`log`; also the row's stdout line and the trackers'). A
  rewind marks the discarded attempt's rows `discarded_by_rewind: N` (kept, as history) and the file
  is rewritten whole; a resume keeps the rows up to its checkpoint (one from an older checkpoint,
  whose newer ones it set aside, keeps the file as it was beside it). The summary reads kept rows only.
- consumption.parquet: at each row of a kept step (after step 0), at a rewind and at the end, never
  twice unchanged (not at the row of a step a rewind is about to discard).
- batches.bin: each trained step's global-batch digest (training/contract/batch_record.py), handed
  over by the loop at each row and before each save (training/run/batch_digests.py); a rewind moves
  the records of the steps it discards to batches-discarded.bin; a resume keeps the records up to its
  checkpoint (and the discarded ones of the rewinds the checkpoint knows).
- data_plan.json and plan.png: at the start or resume and at each rewind, with the timeline's skips.
- exports/ and eval/: a step-N (and merged-step-N) directory newer than the step the timeline went
  back to is set aside as abandoned-step-N (training/contract/run_layout.set_aside_after; checkpoints/
  are the checkpointer's own), so `export`, `eval` and `verify` of that step say why it is gone;
  eval.parquet loses those steps' rows and eval.png is drawn again at the next eval.
- loss.png: at the end (and at a stop), discarded rows dashed, skipped steps shaded, the merged
  weights' validation ([merge]) beside the raw.

It also holds the pending row: a step's row from its checkpoint's save until it is written
(training/checkpoint/state.PendingRow, in TrainState so that a checkpoint carries it); the record is
its one writer (`hold`, `take_pending`, `drop_pending`, `resumed`). Every rank holds a RunRecord
and keeps the rows (the summary reads them); only rank 0's writes files.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from training.checkpoint.state import PendingRow, TrainState
from training.config import MetricsSection
from training.console import say
from training.contract.atomic_write import append_whole, write_atomic
from training.contract.batch_record import (
    HEADER,
    BatchEntry,
    batch_file,
    encode,
    kept_on_resume,
    read_batches,
)
from training.contract.config_loader import to_toml
from training.contract.errors import GristmillError
from training.contract.eval_table import eval_lock, rebuild_eval_table
from training.contract.integrity import checkpoint_identity, read_ledger
from training.contract.run_layout import (
    BATCHES_BIN,
    CHECKPOINTS_JSONL,
    CONFIGS_DIR,
    CONSUMPTION_PARQUET,
    DATA_PLAN_JSON,
    DISCARDED_BATCHES_BIN,
    DROPPED_LINES,
    EVAL_DIR,
    EVAL_PARQUET,
    EVAL_PLOT,
    EXPORTS_DIR,
    LOSS_PNG,
    METRICS_JSONL,
    PLAN_PNG,
    abandoned_name,
    checkpoint_dir,
    config_from_step,
    config_history,
    kept_rows,
    read_metrics,
    set_aside_after,
    unused_name,
)
from training.data.plan import Skip
from training.data.recipe import plot_plan, record_plan, write_consumption
from training.metrics import format_line, plot_loss
from training.run.lock import check_owned
from training.run.preflight import from_rank0
from training.run.timeline import Timeline
from training.trackers import Trackers


class RecordUnwritable(GristmillError):
    """A file of the run's record that cannot be written (or, by a resume that rewrites it, read),
    whatever the OSError (a full or read-only disk, permissions, an immutable file, a directory in
    its place): one line naming it. In the
    loop the trainer saves the last step first (training/train.py); before step 1 nothing trained."""


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """An OSError writing record file `path` (or a temporary file beside it) as a RecordUnwritable
    naming `path` and the errno's words: an EPERM or EACCES was a traceback, only a full or
    read-only disk was one line (review R26a F4)."""
    try:
        yield
    except OSError as e:
        raise RecordUnwritable(
            f"cannot write {path}: {e.strerror or e}; make it writable (or free space), or write the run "
            "somewhere else"
        ) from None


def unreadable_rows(run_dir: Path) -> str | None:
    """The line refusing a resume whose RUN/metrics.jsonl cannot be read (the rows it keeps: RunRecord.
    _logged_rows), or None. A permission, a folder in its place: a traceback (trial RV75a 1), said by
    the setup before the resume sets the newer checkpoints aside (review RV75d 1)."""
    path = Path(run_dir) / METRICS_JSONL
    aside = "move it aside (the resume then says the rows before its step are lost, and writes the rest)"
    if path.is_symlink() and not path.exists():  # a disk not mounted: taken for rows lost (trial RV75e 2)
        return (
            f"cannot read {path}: a link to {os.readlink(path)}, which does not exist; mount or restore what "
            f"it points to, or {aside}"
        )
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            with open(path, "rb"):
                return None
    except FileNotFoundError:  # said by _logged_rows: its rows lost, the resume writes the rest
        return None
    except OSError as e:
        return _unreadable(path, e)
    if stat.S_ISDIR(mode):  # no access fixes that (review RV75d 3)
        return f"cannot read {path}: a folder is in its place; {aside}"
    return not_a_file(run_dir)  # a FIFO: reading it waited for a writer, for good (trial RV75e 1)


def not_a_file(run_dir: Path) -> str | None:
    """The line refusing any start whose RUN/metrics.jsonl, batches.bin or checkpoints.jsonl is a pipe or
    a device, or None. Opening one waited for the other end, for good: metrics.jsonl's at a resume (trial
    RV75e 1) and at a fresh start (left in session 71), the others' at a resume (review RV76b 1, 2). A
    fresh run would have set the last two aside: refused alike, one rule."""
    for path in (Path(run_dir) / name for name in (METRICS_JSONL, BATCHES_BIN, CHECKPOINTS_JSONL)):
        try:
            mode = os.stat(path).st_mode
        except OSError:  # missing, a link to nothing, no access: said where the file is used
            continue
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            return (
                f"cannot use {path}: it is not a regular file (a pipe, a device); move it aside, or write "
                "the run somewhere else"
            )
    return None


def _unreadable(path: Path, e: OSError) -> str:
    return (
        f"cannot read {path}: {e.strerror or e}; give this user read and write access to it (a resume "
        "keeps its rows, then appends), or write the run somewhere else"
    )


def _writes(name: str) -> Callable:
    """A RunRecord method that writes RUN/`name`, its OSErrors as `_writing`'s."""

    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: RunRecord, *args: Any, **kw: Any) -> Any:
            with _writing(self.run_dir / name):
                return method(self, *args, **kw)

        return call

    return wrap


class RunRecord:
    """The run directory's timeline artifacts and the pending row (see the module)."""

    def __init__(self, run_dir: Path, timeline: Timeline, state: TrainState, *, rank: int, plot: bool):
        """`state`: the run's TrainState (its pending row); `rank`: this process's, rank 0 writes;
        `plot`: metrics.plot (plan.png, loss.png; the in-training eval's eval.png reads it too)."""
        self.run_dir, self.timeline, self.state = Path(run_dir), timeline, state
        self.rank, self.plot = rank, plot
        # Rank 0: metrics.jsonl's rows (a resume's earlier ones too); elsewhere this invocation's.
        self.rows: list[dict[str, Any]] = []
        self.jsonl: int | None = None  # rank 0's metrics.jsonl, open for appending
        self.batches_fd: int | None = None  # rank 0's batches.bin, open for appending
        self.trackers: Trackers | None = None
        self.ledger: tuple[int, int] | None = None  # (step, rewinds) of the last consumption.parquet
        self.config: str | None = None  # rank 0: this invocation's resolved config, as TOML
        # Rank 0: the first step whose batch record could not be written (None: every one was); no
        # checkpoint may then hold it (a checkpoint's steps are recorded before it exists: review RV26g F1)
        self.unrecorded: int | None = None

    # -- the timeline's moments --
    def started(
        self,
        resumed: int | None,
        *,
        own: bool,
        metrics: MetricsSection,
        config: dict,
        datasets: dict[str, str],
        set_aside: list[int],
    ) -> None:
        """The run starts or resumes (at checkpoint `resumed`, this directory's when `own`), on rank 0:
        the trackers of [metrics] opened (`config`: the resolved recipe, `datasets`: source name ->
        dataset, for their runs); then what a discarded or redone future left (steps after `resumed`)
        set aside; the plan recorded and drawn with the timeline's skips, consumption.parquet at its
        step; metrics.jsonl kept up to the checkpoint (or started over). `set_aside`: the steps of the
        complete checkpoints the resume set aside (a timeline it left, as checkpoints.jsonl tells too)."""
        if self.rank != 0:
            return
        # A fresh run (one refused while complete checkpoints exist: after checkpoint.interval = 0, or
        # with checkpoints/ deleted to start over) sets aside every step's: an earlier run's exports
        # and evals, kept, were listed, scored and verified as this run's. So does a run resumed from
        # another directory's checkpoint: what this directory holds is an earlier run's, whose rows and
        # batch records up to the checkpoint were kept as this run's (other losses, another lr), its
        # trackers' runs continued.
        mine = resumed if own else None
        logged, cut = self._logged_rows(mine)
        # The trackers first: they may still refuse the resume (an unreadable trackers.json, wandb
        # that cannot start), and a refused resume leaves the run's files as they were (its plan
        # recorded here, with a config.toml left as it was, made `data inspect RUN` and verify say
        # the config had been edited: review R14d F2).
        self.trackers = Trackers(self.run_dir, metrics, config=config, datasets=datasets, resume_step=mine)
        try:
            self._set_aside(after=-1 if mine is None else mine, earlier_run=mine is None)
            self._record_plan()
            # at the timeline's start: what the file held was a future set aside, or an earlier run's,
            # which the audit answered from until this run's first logged row (review R15e F1)
            self._consumption(resumed or 0)
            # A timeline that went on past the checkpoint, saving checkpoints since (a resume from an
            # older one): its rows and records were dropped without a trace (trial RV57b F6), kept aside;
            # known by the record of the saves or by what this resume set aside (a run without the
            # record: its rows were dropped, RV58b F2)
            resumed_id = None if mine is None else checkpoint_identity(checkpoint_dir(self.run_dir, mine))
            saved = [] if resumed_id is None else read_ledger(self.run_dir).after(mine, resumed_id)
            left = sorted({*saved, *set_aside}) if mine is not None else []
            self._open_log(mine, logged, left)
            if cut:  # said once the file is written without them: a resume refused before it kept them
                # (it said so, and the torn line stayed: trial RV61b F3); an unreadable row is lost for
                # good then, which verify can no longer tell (trial RV65c F4)
                lost = (  # the resumed step's own row comes back from the checkpoint (RV65f 4)
                    f"; written without them, their rows are lost (step {mine}'s, if one of them, is written "
                    "again from the checkpoint)"
                    if cut.startswith(DROPPED_LINES)
                    else ""
                )
                say(cut + lost)
            self._open_batches(mine, left)
            self.config = to_toml(config)
            self._record_config((resumed or 0) + 1, earlier_run=mine is None)
        except BaseException:
            self.close()
            raise

    def log(self, row: dict[str, Any], *, ledger: bool = True) -> None:
        """A completed metrics row (training/metrics.py), kept by every rank. Rank 0 appends it to
        metrics.jsonl, prints its line, hands it to the trackers and, after step 0, writes
        consumption.parquet at its step (`ledger` False: the row of a step a rewind discards next,
        whose rewind writes it), then says the row's events. (The evaluator rebuilds eval.parquet as
        it writes a step's results.json, in one acquisition of the eval lock: review R31b F1.)"""
        self.rows.append(row)
        if self.rank != 0:
            return
        check_owned(self.run_dir)  # a run directory replaced under the run is another's (lock.py)
        # One os.write per row on an O_APPEND descriptor: a row is whole or absent, never split
        # across writes (a kill mid-row leaves at most a torn last line, which read_metrics cuts).
        try:
            with _writing(self.run_dir / METRICS_JSONL):
                append_whole(self.jsonl, (json.dumps(row) + "\n").encode())
        except RecordUnwritable:
            # the row waits in the state again, complete: the checkpoint the trainer saves before it
            # stops carries it, and a resume writes it
            self.state.pending = PendingRow(row, validate=False, evaluate=False)
            raise
        say(format_line(row))
        self.trackers.log(row)
        step = row["step"]
        if ledger and step > 0:
            self._consumption(step)
        for event in row.get("events", []):
            say(f"WARNING step {step}: {event}")

    def batches(self, digests: list[tuple[int, str]]) -> None:
        """Trained steps' global-batch digests, (step, sha256) in step order (training/run/
        batch_digests.py), appended to batches.bin by rank 0 as the timeline's current attempt's."""
        if self.rank != 0 or not digests:
            return
        attempt = self.timeline.attempt
        # One os.write for them all on an O_APPEND descriptor, as metrics.jsonl's rows.
        try:
            with _writing(self.run_dir / BATCHES_BIN):
                append_whole(self.batches_fd, encode(BatchEntry(step, attempt, sha) for step, sha in digests))
        except RecordUnwritable:
            if self.unrecorded is None:
                self.unrecorded = digests[0][0]
            raise

    def rewound(self, skip: Skip) -> None:
        """After a rewind (the timeline holds `skip`), on every rank: the rows of steps after the
        checkpoint gone back to that no rewind discarded yet are marked discarded by this one. On
        rank 0: metrics.jsonl rewritten, the attempt's batch records moved to batches-discarded.bin,
        its exports and evals set aside, the plan recorded and drawn, consumption.parquet at the
        skip's last step."""
        for r in self.rows:
            if r["step"] > skip.checkpoint_step and "discarded_by_rewind" not in r:
                r["discarded_by_rewind"] = skip.rewind
        if self.rank != 0:
            return
        check_owned(self.run_dir)  # its files are rewritten by path: never into another run's directory
        self._rewrite_log()
        self._discard_batches(after=skip.checkpoint_step)
        self._set_aside(after=skip.checkpoint_step)
        self._record_plan()
        self._consumption(skip.last_step)
        self._record_config(skip.checkpoint_step + 1)  # gone back past this invocation's first step

    @_writes(CONFIGS_DIR)
    def _record_config(self, first: int, earlier_run: bool = False) -> None:
        """RUN/configs/from-step-N.toml: this invocation's config trains the timeline from step `first`
        on, so the entries of later steps (a future discarded or redone) go, every entry when they are
        an `earlier_run`'s (a fresh run; one resumed from another directory's checkpoint, whose earlier
        steps' config is that run's), and its own is written where it differs from the config before
        `first`. config.toml is the last invocation's alone: after a resume that changed a setting, and
        retention of the checkpoints whose COMPLETE named the earlier one, nothing said what the earlier
        steps trained with (review R25b 3)."""
        history = config_history(self.run_dir)
        for step, path in history.items():
            if step >= first or earlier_run:
                path.unlink()
        before = [path for step, path in history.items() if step < first and not earlier_run]
        if before and before[-1].read_text(encoding="utf-8") == self.config:
            return
        path = config_from_step(self.run_dir, first)
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, self.config)

    def finished(self, step: int) -> None:
        """The loop ended at `step` (the last step, or a stop signal's): consumption.parquet there,
        unless the step's row wrote it already."""
        if self.rank == 0:
            check_owned(self.run_dir)
            self._consumption(step)

    def draw_loss(self) -> str | None:
        """RUN/loss.png on rank 0 when metrics.plot is on (at the end, and at a stop): its place as
        `curve: PATH`, a note instead when matplotlib is missing, None when not drawn. With it off, an
        earlier invocation's picture is said to be one (it stayed as if it were the run's: RV65c F2)."""
        if self.rank != 0:
            return None
        path = self.run_dir / LOSS_PNG
        if not self.plot:
            return (
                f"{path} is an earlier invocation's curve (metrics.plot = false)" if path.exists() else None
            )
        plan = self.timeline.plan
        phases = [(plan.first_step[p], ph.name) for p, ph in enumerate(plan.phases)]
        return plot_loss(self.rows, path, self.timeline.skips, phases) or f"curve: {path}"

    def close(self) -> None:
        """Close metrics.jsonl and finish the trackers (in a `finally`: an exception on its way out
        marks a wandb run failed)."""
        for fd in (self.jsonl, self.batches_fd):
            if fd is not None:
                os.close(fd)
        self.jsonl = self.batches_fd = None
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None

    # -- the pending row (TrainState.pending: its one writer) --
    def hold(self, row: dict[str, Any], *, validate: bool, evaluate: bool) -> None:
        """A row that waits in the state, and so in a checkpoint saved now, until it is written
        (`take_pending`) after its validation and eval, when due."""
        self.state.pending = PendingRow(row, validate, evaluate)

    def take_pending(self) -> PendingRow | None:
        """The pending row, to be written now; the state holds none after."""
        pending, self.state.pending = self.state.pending, None
        return pending

    def drop_pending(self) -> None:
        """A rewind restored a checkpoint: its own pending row was written, the run went on past it."""
        self.state.pending = None

    def resumed(self, *, own: bool, world_size: int) -> None:
        """On a resume (every rank; collective): the checkpoint's pending row is dropped when rank 0's
        metrics.jsonl holds it already (written before the run stopped) or when the checkpoint is
        not this run directory's (`own` False: that run's row, not this one's)."""
        if self.state.pending is None:
            return
        step = self.state.pending.row["step"]
        written = self.rank == 0 and any(r["step"] == step for r in kept_rows(self.rows))
        if from_rank0(written, world_size) or not own:
            self.state.pending = None

    # -- the files --
    def _logged_rows(self, resumed: int | None) -> tuple[list[dict[str, Any]] | None, str | None]:
        """metrics.jsonl's rows a resume finds (None: a fresh run, or no file), read, not changed, and
        the note of the lines that are none, which go when _open_log writes the rows."""
        path = self.run_dir / METRICS_JSONL
        if resumed is None:
            return None, None
        if not path.exists():  # every run that started made it: deleted, its rows with it (RV65c F4)
            return None, (
                f"note: {path} is missing (deleted?): the rows of the steps before {resumed} are lost (a "
                "checkpoint holds its own step's alone); this resume writes the rest"
            )
        try:
            return read_metrics(path)
        except OSError as e:  # unreadable since unreadable_rows said it was not (a race)
            raise RecordUnwritable(_unreadable(path, e)) from None

    @_writes(METRICS_JSONL)
    def _open_log(self, resumed: int | None, logged: list[dict[str, Any]] | None, left: list[int]) -> None:
        """metrics.jsonl opened for appending; a resume keeps the rows (`logged`, as _logged_rows read
        them) up to its checkpoint and drops those of the steps it will redo (written after the
        checkpoint by the interrupted run, or by a timeline the resume `left`: kept aside)."""
        path = self.run_dir / METRICS_JSONL
        if logged is not None:
            # Rows a rewind discarded stay (the run's history) if the checkpoint knows that rewind.
            known = len(self.timeline.skips) + 1

            def kept(r: dict[str, Any]) -> bool:
                return r["step"] <= resumed or r.get("discarded_by_rewind", known) < known

            self.rows = [r for r in logged if kept(r)]
            if left and (dropped := [r["step"] for r in logged if not kept(r)]):
                _keep_left(path, "rows", dropped, left)
            write_atomic(path, _jsonl(self.rows))
        elif resumed is None and path.exists() and path.stat().st_size:  # a fresh run starts the log over
            _keep_earlier(path)  # (an empty one, a start that failed before its first row, is no record)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if resumed is not None else os.O_TRUNC)
        self.jsonl = os.open(path, flags, 0o644)

    @_writes(METRICS_JSONL)
    def _rewrite_log(self) -> None:
        """metrics.jsonl replaced, atomically, by the rows (a rewind marked some); appends go on into
        the new file (the old descriptor is swapped only once it is in place)."""
        path = self.run_dir / METRICS_JSONL
        write_atomic(path, _jsonl(self.rows))
        old, self.jsonl = self.jsonl, os.open(path, os.O_WRONLY | os.O_APPEND, 0o644)
        os.close(old)  # it would keep appending to the replaced file

    @_writes(BATCHES_BIN)
    def _open_batches(self, resumed: int | None, left: list[int]) -> None:
        """batches.bin opened for appending. A resume keeps the records up to its checkpoint (the steps
        it redoes were recorded by the interrupted run) and, in batches-discarded.bin, those of the
        rewinds the checkpoint knows (a later rewind it does not know is redone); a fresh run starts
        both over."""
        path, apart = self.run_dir / BATCHES_BIN, self.run_dir / DISCARDED_BATCHES_BIN
        if resumed is None:
            for earlier in (path, apart):
                if earlier.exists() and earlier.stat().st_size > len(HEADER):  # records, not a header
                    _keep_earlier(earlier)
            apart.unlink(missing_ok=True)
            write_atomic(path, batch_file([]))
        else:
            entries = self._read_batches(path)
            kept, damaged = kept_on_resume(entries, resumed)
            if left and (later := [e.step for e in entries if e.step > resumed]):
                _keep_left(path, "records", later, left)
            self._say_dropped(path, entries, kept, damaged, resumed)
            write_atomic(path, batch_file(kept))
            if apart.exists():  # the attempts before the one the checkpoint trains in: its rewinds'
                known = self.timeline.attempt
                discarded = self._read_batches(apart)
                if left and (later := [e.step for e in discarded if e.attempt >= known]):  # RV57e 1
                    _keep_left(apart, "records", later, left)
                write_atomic(apart, batch_file(e for e in discarded if e.attempt < known))
        self.batches_fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def _say_dropped(
        self, path: Path, entries: list[BatchEntry], kept: list[BatchEntry], damaged: list[int], resumed: int
    ) -> None:
        """A resume's note of what batches.bin lacks up to its checkpoint's step `resumed`: the records
        it cannot trust (out of the order the steps trained in, or two of one step), and the trained
        steps, from the first this directory trained, left with no record (dropped without a word:
        review R21b F4; a damaged record of the checkpoint's own step reads as a step it redoes: R22a
        A4). The file as it was is set aside first whenever one is said (R22d M3). A run started from
        another directory's checkpoint recorded none of that run's steps: not said (R22d M1)."""
        parts = []
        if damaged:
            first = damaged[0]
            parts.append(
                f"{len(damaged)} record(s) that cannot be trusted dropped (out of the order the steps "
                f"trained in, or one of two of a step: the first, record {first + 1}, says step "
                f"{entries[first].step})"
            )
        # the steps a rewind skipped were never trained: they have none
        have = {e.step for e in kept} | {
            s for k in self.timeline.skips for s in range(k.first_step, k.last_step + 1)
        }
        # From the first step this directory trained, as far as its files tell: its first metrics row
        # (step 1 always has one; a run started from another directory's checkpoint logs from its
        # first step or later: run.log_every) or its first kept record, the earlier; neither: nothing
        # to count from. The kept records alone missed a damaged first record and a file deleted whole
        # (review R22e 3); the rows alone, a record without rows (R22g 2, 3).
        firsts = [
            # step 0 is no trained step: a continued run's eval of its base writes its row (every resume
            # said step 0 had no record and set the file aside: trial RV63b 8)
            min((r["step"] for r in kept_rows(self.rows) if r["step"] >= 1), default=None),
            kept[0].step if kept else None,
        ]
        start = min((s for s in firsts if s is not None), default=resumed + 1)
        missing = [s for s in range(start, resumed + 1) if s not in have]
        if missing:
            more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
            parts.append(
                f"no record of step(s) {', '.join(map(str, missing[:5]))}{more}, up to {resumed}, the "
                "checkpoint's (`gristmill verify` names them)"
            )
        if parts and path.exists():  # (deleted whole, there is nothing to keep)
            aside = unused_name(path.with_name(f"{path.name}.damaged"))
            write_atomic(aside, path.read_bytes())
            parts.append(f"the file as it was: {aside.name}")
        if parts:
            say(f"note: {path}: " + "; ".join(parts))

    @_writes(BATCHES_BIN)
    def _discard_batches(self, after: int) -> None:
        """The records of steps after `after` (a rewind's discarded attempt) moved from batches.bin to
        batches-discarded.bin: appended there first, so a kill in between loses none (the resume
        keeps each file's own, by the checkpoint's timeline)."""
        path, apart = self.run_dir / BATCHES_BIN, self.run_dir / DISCARDED_BATCHES_BIN
        entries = self._read_batches(path)
        moved = [e for e in entries if e.step > after]
        if moved:
            old = self._read_batches(apart)
            write_atomic(apart, batch_file(old + moved))
        write_atomic(path, batch_file(e for e in entries if e.step <= after))
        old_fd, self.batches_fd = self.batches_fd, os.open(path, os.O_WRONLY | os.O_APPEND)
        os.close(old_fd)  # it would keep appending to the replaced file

    def _read_batches(self, path: Path) -> list[BatchEntry]:
        """A batch record's entries; one that is not a batch record is set aside (renamed, named in a
        note: the evidence kept) and read as empty."""
        try:
            entries, note = read_batches(path)
        except ValueError as e:
            aside = unused_name(path.with_name(f"{path.name}.unreadable"))
            path.rename(aside)
            say(f"note: {e}; moved it to {aside.name}, its steps are not recorded")
            return []
        if note:
            say(note)
        return entries

    @_writes(CONSUMPTION_PARQUET)
    def _consumption(self, step: int) -> None:
        """RUN/consumption.parquet after `step` steps of the timeline, unless it holds that already."""
        at = (step, len(self.timeline.skips))
        if at == self.ledger:
            return
        plan, path = self.timeline.plan, self.run_dir / CONSUMPTION_PARQUET
        write_consumption(plan, step, self.timeline.consumed(step), path)
        self.ledger = at

    @_writes(DATA_PLAN_JSON)
    def _record_plan(self) -> None:
        record_plan(self.timeline.plan, self.run_dir, self.timeline.skips)
        if self.plot:
            note = plot_plan(self.timeline.plan, self.run_dir / PLAN_PNG, self.timeline.skips)
            if note:
                say(note)

    def _set_aside(self, after: int, earlier_run: bool = False) -> None:
        """exports/ and eval/ of steps after `after` set aside (those of a discarded timeline, or of
        an `earlier_run` in this directory), eval.parquet rebuilt without them, eval.png removed until
        the next eval draws it."""
        # Under the eval lock, `gristmill eval --watch` beside the run writes no discarded step's scores
        # after this (it checks its export under the lock). Without eval/ there is no lock to take and
        # no step being scored (an eval makes eval/step-N/eval.log before it scores); one begun since
        # finds its export moved when it writes. So a run without evals gets no eval/ directory.
        evaluated = (self.run_dir / EVAL_DIR).is_dir()
        # eval.parquet rebuilt without them in the same acquisition (an audit between the two refused it
        # as stale: review R31b F1)
        with eval_lock(self.run_dir) if evaluated else contextlib.nullcontext():
            moved = set_aside_after(self.run_dir / EXPORTS_DIR, after)
            evals = set_aside_after(self.run_dir / EVAL_DIR, after)
            rebuilt = evals and (self.run_dir / EVAL_PARQUET).is_file()
            warning = rebuild_eval_table(self.run_dir) if rebuilt else None
            # a draw in flight would put the discarded steps back (trial RV66d F2): under the lock too
            unplotted = self._unplot() if evals else None
        whose = "an earlier run in this directory" if earlier_run else "a discarded timeline"
        for old, new in moved + evals:
            say(f"note: {old.parent.name}/{old.name} is from {whose}; moved it to {new.name}")
        if warning:  # the run goes on (review RV32e F5), having said what it moved
            say(warning)
        if unplotted:
            say(unplotted)

    def _unplot(self) -> str | None:
        """RUN/eval.png removed (a picture of discarded steps); the warning when it cannot be."""
        plot = self.run_dir / EVAL_PLOT
        try:  # a directory of its name was a traceback at the run's start (review RV26b 6)
            plot.unlink(missing_ok=True)
        except OSError as e:
            return f"warning: {plot} not removed ({e.strerror or e}): it is no picture of this run's evals"
        return None


def _keep_earlier(path: Path) -> None:
    """An earlier run's record in this directory (a fresh run's, or one resumed from another run's
    checkpoint) moved aside, as its exports and evals are: it was truncated, its losses and batch
    records lost (review R21b F3)."""
    kept = abandoned_name(path)
    path.rename(kept)
    say(f"note: {path} is from an earlier run in this directory; moved it to {kept.name}")


def _keep_left(path: Path, what: str, steps: list[int], left: list[int]) -> None:
    """The file as it was, kept beside it (abandoned-NAME), before a resume from an older checkpoint of
    the run drops its `what` of `steps`: those of the timeline the resume left, which saved the
    checkpoints of steps `left` after it. They went without a trace, and verify could not check those
    checkpoints against any row or record (trial RV57b F6)."""
    kept = abandoned_name(path)
    write_atomic(kept, path.read_bytes())
    say(
        f"note: {path.name}'s {what} of steps {min(steps)}–{max(steps)} are of the timeline the resume "
        f"left (its checkpoints went past the step resumed); the file as it was: {kept.name}"
    )


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)
