"""Experiment trackers: tensorboard, Weights & Biases, trackio; one small adapter class each.

Each adapter has `log(scalars, step)` and `finish(failed)`; `Trackers` holds those [metrics]
names and hands each metrics row to them (training/run/record.py, rank 0's writer, calls it), each
tracker's calls on a thread of its own behind a bounded queue (`_Feed`): the loop never waits on a
tracker, and one that fails, falls FEED_ROWS rows behind or has not returned from a call within
GRISTMILL_TRACKER_TIMEOUT seconds is given up for the rest of the run with one warning line. The
packages are imported inside the adapters only, so the trainer runs without them (training/ imports
only torch, numpy and pyarrow at module level). Which trackers a recipe names, and whether their
packages are installed, is checked with the config (training.config_checks.trackers_of), before
any work.

Resuming: RUN/trackers.json records the wandb run id (and mode) and the trackio run (name, id) with
their project, and for each whether an invocation has it open and how far its run was sent
(`open`, `sent_through`: the highest step its tracker took, kept current while an invocation has
it open). A resumed invocation (`--resume`) continues those runs (an unreadable file is an error
naming the run to continue, not a silent new run); a fresh run into the same directory starts new
ones and overwrites the file. trackio resumes a run by its name (the newest run of that
name in the project) and keeps it: when that is another run (another run directory's, of the same
name), the resume is refused rather than logged into it; a metrics.run_name changed since is not
applied to trackio (a note says so).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from training.config import MetricsSection
from training.config_checks import tracker_timeout, trackers_of
from training.console import ReaderSafeOut, say
from training.contract.atomic_write import write_atomic
from training.contract.errors import GristmillError
from training.data.remote import dataset_info

TRACKERS_JSON = "trackers.json"  # in the run directory: the wandb/trackio runs a resume continues
# Rows a tracker may be behind the loop before it is given up: far more than a pause shorter than the
# time bound leaves behind at any step rate worth logging (100 dropped a healthy wandb after a 12 s
# pause at 40 ms a step: review RV26a R1); a hang is caught by the time bound first.
FEED_ROWS = 10_000


class Trackers:
    """The trackers of [metrics], opened on rank 0 (tensorboard by default; wandb, trackio), each
    metrics row handed to them (`log`) and finished at the end (`close`).

    A resumed run (`resume_step`) continues the wandb/trackio runs recorded in RUN/trackers.json,
    where each record says how far its run was sent (`sent_through`: the highest step its tracker
    took, kept current while an invocation has it open, so a kill leaves it at most a few rows
    short, never ahead: those are sent again, which wandb drops). Those of its steps
    after the checkpoint are redone now; wandb drops steps below its last one, so no tracker gets them
    again: wandb and trackio keep what they stored of the first attempt's values of
    those steps (the same losses when the resume changes no setting; timings differ; nothing of a row
    a tracker had not stored when the invocation was killed), metrics.jsonl and tensorboard the
    redone ones (tensorboard purges the interrupted invocation's events after the checkpoint).
    """

    def __init__(
        self,
        run_dir: Path,
        m: MetricsSection,
        *,
        config: dict,
        datasets: dict[str, str],
        resume_step: int | None,
    ):
        """`config`: the resolved recipe (to_dict), `datasets`: source name -> dataset directory;
        both go to the wandb/trackio run once, with the code's git commit."""
        self.run_dir = Path(run_dir)
        self.trackers: dict[str, _Feed] = {}
        self.given_up: list[_Feed] = []  # hung ones: abandoned at the end (wandb's exit hook)
        self.skip_through: dict[str, int] = {}  # tracker -> steps up to here it already has
        self._state: dict[str, Any] = {}  # RUN/trackers.json as this invocation writes it
        self._sent: dict[str, int] = {}  # tracker -> the highest step it took from this invocation
        self._wandb: Wandb | None = None  # started, for its id if a later start fails
        made = _Made(self.run_dir)
        try:
            self._open(m, config, datasets, resume_step)
        except BaseException:
            self.close()
            made.undo(getattr(self._wandb, "id", None))
            raise

    def _open(
        self,
        m: MetricsSection,
        config: dict,
        datasets: dict[str, str],
        resume_step: int | None,
    ) -> None:
        names, project, notes = trackers_of(m)
        record = self.run_dir / TRACKERS_JSON
        # written below whatever the trackers (a fresh run's empties it): a directory there was an
        # IsADirectoryError traceback (trial RV68a F11), refused now before any tracker starts
        if record.exists() and not record.is_file():
            kind = "a directory" if record.is_dir() else "not a regular file"
            raise GristmillError(
                f"{record} is {kind}; it must be the JSON file of the wandb/trackio runs a resume continues: "
                "move it out of the run directory and run again"
            )
        for note in notes:
            say(note)
        info = provenance(datasets) if names else {}
        old = read_state(self.run_dir, names, project) if resume_step is not None else {}
        here = str(self.run_dir.resolve())
        run_name = m.run_name or Path(here).name
        trackio_name = run_name
        copied = _copied_from(old, here) if set(names) & set(_RUN_KEY) else None
        if copied is not None:
            # a copy (`cp -a RUN BRANCH`) resumed: it continued the original's wandb/trackio runs, two
            # curves of steps 17–30 in one run, the original's renamed (trial RV68a F3). A moved run,
            # whose original place is gone, continues them.
            theirs = old.get("trackio") if isinstance(old.get("trackio"), dict) else {}
            if theirs.get("name") == run_name:  # trackio finds a run by name: the original's resume
                # then found the copy's newest run of it and was refused (review RV68d 2)
                trackio_name = f"{run_name}-{hashlib.sha256(here.encode()).hexdigest()[:6]}"
            old = {k: v for k, v in old.items() if k not in _RUN_KEY}
            renamed = f" (trackio's named {trackio_name!r})" if trackio_name != run_name else ""
            say(
                f"note: {self.run_dir} is a copy of {copied}, whose {TRACKERS_JSON} names the same "
                f"wandb/trackio runs, which stay that run's: new tracker runs here{renamed}, holding none of "
                f"steps 1–{resume_step} (metrics.jsonl has them)"
            )
        state = dict(old)  # a resume keeps the record of a tracker it does not use this time
        # the run directory, absolute: what tells this run's wandb directories in a shared WANDB_DIR
        tracker_config = {**config, "provenance": {**info, "run_dir": here}}
        # trackio first, as its resume may be refused (another run has its name): no wandb run resumed
        # for nothing; tensorboard last: a tracker that fails to start leaves no empty event file behind
        held: dict[str, int | None] = {}  # tracker -> the last step its run holds (sent_through)
        for name in sorted(names, key=("trackio", "wandb", "tensorboard").index):
            prev = old.get(name) if isinstance(old.get(name), dict) else None
            prev = prev if prev and prev.get("project") == project else None
            if name == "tensorboard":
                try:
                    self.trackers[name] = _Feed(name, Tensorboard(self.run_dir, resume_step, info))
                except ImportError:
                    say("note: tensorboard is not installed; no event files (pip install tensorboard)")
                except OSError as e:  # RUN/tensorboard a file, a full disk: one line, before any step
                    fix = f"make {self.run_dir / 'tensorboard'} a writable directory"
                    raise _init_failed("tensorboard", e, fix) from None
                continue
            if name == "wandb":
                t = Wandb(self.run_dir, project=project, name=run_name, tags=list(m.tags),
                          config=tracker_config, resume_id=prev and prev.get("id"),
                          mode=prev and prev.get("mode"))  # fmt: skip
                self._wandb = t
                if t.mode == "disabled":  # recorded as an online run it never was, "continued" (RV68a F6)
                    t.finish()
                    say(
                        "note: WANDB_MODE=disabled: wandb keeps nothing of this invocation and no wandb run "
                        "is recorded or continued (unset it, or set WANDB_MODE=offline, to keep one)"
                    )
                    continue
                state[name] = {"id": t.id, "project": project, "mode": t.mode, "run_dir": here}
            else:
                t = Trackio(project=project, name=trackio_name, config=tracker_config, resume=prev)
                state[name] = {"id": t.id, "name": t.name, "project": project, "run_dir": here}
                if t.note:
                    say(t.note)
            self.trackers[name] = _Feed(name, t)
            how = "continued" if prev else "new"
            say(f"{name} tracker: {how} run {t.id} in project {project!r} (name {t.name!r}){t.where}")
            # a record without sent_through: its run holds no step (none sent, or a store found empty at
            # the end: trial RV65f 7, no note then)
            held[name] = (prev.get("sent_through") or 0) if prev else None
            if prev and isinstance(t, Trackio):
                # what its store holds: a kill -9 after trackio stored rows, before their record, had
                # them sent again (step 25 stored twice) and the note below name steps it held (RV68a F5)
                with contextlib.suppress(Exception):
                    held[name] = max(held[name], t.stored_through())
            if held[name] is not None and resume_step is not None and held[name] > resume_step:
                self.skip_through[name] = held[name]
            if isinstance(held[name], int) and resume_step is not None and held[name] < resume_step:
                # never sent later: its record read as if every step were (trial RV59a F2)
                gap = (
                    f"step {resume_step}"
                    if held[name] + 1 == resume_step
                    else f"steps {held[name] + 1}–{resume_step}"
                )
                holds = f"holds steps through {held[name]}" if held[name] else "holds no step"
                # "rows of": a step of the gap may have none (log_every; a stop's step: trial RV70d 2)
                say(
                    f"note: {name}'s run {t.id} {holds}; the rows of {gap} (trained without it, or not "
                    "taken before a stop) are not in it: metrics.jsonl has them"
                )
        # Each record says how far its tracker was sent ("sent_through": the highest step it took,
        # kept current while an invocation has it open, so a kill leaves it short, never ahead: rows
        # queued for a tracker when the process died were not taken, review R26a F1). An invocation
        # without a tracker sends it nothing: its steps, redone later, are sent then (a skip by "the
        # last invocation's rows" lost them: reviews R16h F1, R16i F5).
        for name, record in state.items():
            if isinstance(record, dict):
                record["open"] = name in names
                if held.get(name):  # the new record of a continued run: what it holds (0: none, unsaid)
                    record["sent_through"] = held[name]
        self._state = state
        if state or (self.run_dir / TRACKERS_JSON).exists():
            write_state(self.run_dir, state)
        if self.skip_through:
            last = max(self.skip_through.values())
            steps = f"step {last}" if last == resume_step + 1 else f"steps {resume_step + 1}–{last}"
            # What a tracker stored of them is not known here (an invocation killed before a tracker
            # flushed left it fewer), nor whether they equal the redone rows (a setting changed at
            # the resume): said as what it is, not as "already held" (review R16c F1, F4)
            one = len(self.skip_through) == 1
            say(
                f"note: {' and '.join(self.skip_through)} {'was' if one else 'were'} sent {steps} by an "
                "earlier invocation; redone now, not sent again: "
                f"{'it keeps' if one else 'they keep'} what {'it' if one else 'they'} stored of them as "
                "sent then (nothing of a row not yet stored when that invocation was killed; a setting "
                "changed at this resume makes the redone rows differ); metrics.jsonl has the redone rows"
            )

    def log(self, row: dict[str, Any]) -> None:
        """A metrics row's numbers (not `events` or `phase`; a bool is an int but no metric) at its step."""
        scalars = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        step = scalars.pop("step")
        scalars.pop("last_step", None)  # a setting, not a metric
        for name, feed in list(self.trackers.items()):
            if step > self.skip_through.get(name, -1) and (why := feed.put(scalars, step)):
                self._give_up(name, why)
        # how far each open tracker got, recorded as it goes: a kill leaves no claim of rows it never took
        moved = [n for n, f in self.trackers.items() if f.acked > self._sent.get(n, 0)]
        for name in moved:
            self._sent[name] = self.trackers[name].acked
        self._record_sent(moved, still_open=True)

    def _give_up(self, name: str, why: str) -> None:
        """A tracker that failed, hung or fell behind: one warning line, no more rows this run, its
        record closed at what it took (a side activity never costs training: wandb's service killed
        or stopped, a disk it writes to gone)."""
        say(
            f"WARNING: {name} {why}; it gets no more rows this run, training goes on "
            "(metrics.jsonl has every row)"
        )
        feed = self.trackers.pop(name)
        feed.given_up = True
        if feed.failed is None:  # hung: its call may never return; abandoned at the end
            self.given_up.append(feed)
        self._sent[name] = feed.acked
        # said now: a kill before the end would leave it open (review R16j F1)
        self._record_sent([name])

    def close(self) -> None:
        """Finish the trackers; called in a `finally`, so an exception on its way out marks the wandb
        run failed. One tracker failing to finish does not keep the others open."""
        failed = sys.exc_info()[0] is not None
        bound = tracker_timeout()
        deadline = time.monotonic() + bound  # all of them together: a SIGTERM's grace is short
        asked = {}
        for name, feed in list(self.trackers.items()):
            if why := feed.trouble():  # a log since the last row's check failed or hung: not waited for
                self._give_up(name, why)
                continue
            # a call already under way has had part of its bound: a fresh one each exited a SIGTERM
            # past a scheduler's 30 s grace (review RV26a R4)
            busy = feed.busy
            until = deadline if busy is None else min(deadline, busy[1] + bound)
            asked[name] = feed.ask_finish(failed), until
        # Every tracker is asked before any is waited for, one whose queue is full (behind, hung) again
        # until its time is up: they finish together, and one that hangs spends none of the others'
        # time (a healthy tensorboard was called "not answering": trial RV59a F5, review RV59f 3).
        while full := [n for n, (item, until) in asked.items() if item is None and time.monotonic() < until]:
            time.sleep(0.01)
            for name in full:
                asked[name] = self.trackers[name].ask_finish(failed), asked[name][1]
        for name, (item, until) in asked.items():
            feed = self.trackers[name]
            tracker = feed.tracker
            try:
                done = feed.finished(item, until)
            except Exception as e:
                say(f"note: {name} did not finish cleanly: {e}")
                done = True
            if not done and feed.failed is not None:  # a log of its last rows raised: said as at a row
                self._give_up(name, feed.trouble())
                continue
            self._sent[name] = feed.acked
            if not done:
                busy = feed.busy  # a row's log under way: named, as mid-run
                run = f" {tracker.id}" if hasattr(tracker, "id") else ""
                what = (
                    f"has not returned from its log of step {busy[0]}"
                    if busy
                    else f"did not finish its run{run}"
                )
                say(
                    f"WARNING: {name} {what} within {bound:g} s (it does not answer); not waited for: "
                    "the run's own record (metrics.jsonl, checkpoints) is complete"
                )
                self.given_up.append(feed)
                continue
            if (sent := self._sent.get(name, 0)) and hasattr(tracker, "stored_through"):
                try:
                    stored = tracker.stored_through()
                except Exception as e:  # an unreadable store holds no step we can count on
                    stored, why = 0, f" ({type(e).__name__}: {e})"
                else:
                    why = ""
                if stored < sent:  # recorded as sent through what it kept: a resume sends the rest
                    say(
                        f"WARNING: {name} stored steps through {stored} of the {sent} sent{why} (its store: "
                        f"{getattr(tracker, 'store', '?')}); metrics.jsonl has every row"
                    )
                    self._sent[name] = stored
                    # and the record too, which took each row as it went: _record_sent keeps the higher
                    # of it and this invocation's count, so it said "through 7" of a store holding none
                    # (trial RV65c F3)
                    if isinstance(record := self._state.get(name), dict):
                        record.pop("sent_through", None)
        for feed in self.given_up:  # hung: their exit hooks would wait for them too
            feed.abandon()
        self.trackers, self.given_up = {}, []
        self._record_sent([n for n, r in self._state.items() if isinstance(r, dict) and r.get("open")])

    def _record_sent(self, names: list[str], still_open: bool = False) -> None:
        """RUN/trackers.json: trackers `names` took rows through their highest step (sent_through);
        closed by this invocation, unless `still_open` (the record kept current as the run goes)."""
        # tensorboard keeps no record (its event files are the run directory's): nothing to say of it
        # (a KeyError here ended the run that had just been told "training goes on": review R18d 1)
        names = [n for n in names if isinstance(self._state.get(n), dict)]
        for name in names:
            record = self._state[name]
            last = max(record.get("sent_through") or 0, self._sent.get(name, 0)) or None
            record.pop("sent_through", None)
            record.update({"open": still_open, **({"sent_through": last} if last else {})})
        if names:
            with contextlib.suppress(OSError):  # a side activity's record: never an error at the end
                # as the run goes, each row's: not fsynced, a crash leaves the file before or after
                write_state(self.run_dir, self._state, fsync=not still_open)


def _raised(e: BaseException) -> str:
    """`SystemExit: 7`, or `SystemExit` alone where it says nothing (not "SystemExit: ")."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class _Finish:
    """The last item of a feed: its tracker's finish, and what that raised."""

    def __init__(self, failed: bool):
        self.failed, self.error = failed, None
        self.done = threading.Event()


class _Feed:
    """One tracker's calls (`log`, then `finish`) on a thread of its own, fed through a queue of
    FEED_ROWS rows: the training loop never waits on a tracker. A wandb service that hangs (stopped,
    swapped out, wedged) blocks `run.log` once its socket buffer is full; called from the loop, that
    stopped training, a SIGTERM's checkpoint with it, for as long as it hung (review R26a F1).
    `acked`: the highest step whose log returned (after a rewind the steps go back, and the run holds
    the higher ones)."""

    def __init__(self, name: str, tracker: Any):
        self.name, self.tracker = name, tracker
        self.acked = 0
        self.failed: tuple[int, BaseException] | None = None  # the step whose log raised, and what
        self.busy: tuple[int, float] | None = None  # the step of the log under way, since (monotonic)
        self.given_up = False  # what it takes after that is recorded nowhere: it takes nothing more
        self._queue: queue.Queue = queue.Queue(maxsize=FEED_ROWS)
        self._thread = threading.Thread(target=self._work, name=f"gristmill-{name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while not self.given_up:
            item = self._queue.get()
            if isinstance(item, _Finish):
                try:
                    self.tracker.finish(item.failed)
                except BaseException as e:  # handed to the closing thread
                    item.error = e
                item.done.set()
                return
            if self.given_up:
                return
            scalars, step = item
            self.busy = (step, time.monotonic())
            try:
                self.tracker.log(scalars, step)
            # a side activity: said by the loop's thread at its next row. BaseException: a library's
            # SystemExit (or a KeyboardInterrupt raised in it: Ctrl-C reaches the main thread only)
            # ended this thread unsaid, and the end said "does not answer" (trial RV53b 1)
            except BaseException as e:
                self.failed = (step, e)
                with contextlib.suppress(BaseException):
                    self.tracker.finish(True)
                return
            finally:
                self.busy = None
            self.acked = max(self.acked, step)

    def trouble(self) -> str | None:
        """Why the tracker is to be given up (its log raised, or has not returned within the bound)."""
        if self.failed is not None:
            step, e = self.failed
            return f"failed at step {step} ({_raised(e)})"
        busy, bound = self.busy, tracker_timeout()
        if busy is not None and time.monotonic() - busy[1] > bound:
            return f"has not returned from its log of step {busy[0]} within {bound:g} s (hung)"
        return None

    def put(self, scalars: dict[str, float], step: int) -> str | None:
        """The row handed over without waiting; why the tracker is to be given up instead, if it is."""
        if why := self.trouble():
            return why
        try:
            self._queue.put_nowait((scalars, step))
        except queue.Full:
            return f"is {FEED_ROWS} rows behind at step {step} (hung or too slow)"
        return None

    def ask_finish(self, failed: bool) -> _Finish | None:
        """The tracker's finish queued after its rows; None while its queue is full (Trackers.close asks
        again)."""
        item = _Finish(failed)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return None
        return item

    def finished(self, item: _Finish | None, deadline: float) -> bool:
        """Whether the finish `item` returned by `deadline` (monotonic); what it raised is raised here."""
        if item is None:
            return False
        # in slices: a log of the last rows that raises ends the thread before it takes the finish
        while not item.done.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic()))):
            if not self._thread.is_alive() or time.monotonic() >= deadline:
                return False
        if isinstance(item.error, Exception):
            raise item.error
        if item.error is not None:  # a SystemExit of its library's: said, never the run's own exit
            raise RuntimeError(_raised(item.error)) from None
        return True

    def abandon(self) -> None:
        """Given up while a call of it has not returned: what its library does at exit, waiting for
        the same hung service, is undone where it has such a hook (wandb)."""
        self.given_up = True
        if hasattr(self.tracker, "abandon"):
            self.tracker.abandon()


def git_commit(where: Path = Path(__file__).parent) -> str | None:
    """The commit of the code's git checkout (with "-dirty" if tracked files changed), or None
    outside a git checkout or without git. git's own messages are swallowed (no "fatal: …" noise)."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=False
        )

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("diff", "--quiet", "HEAD").returncode == 1
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def read_state(run_dir: Path, using: list[str], project: str) -> dict[str, Any]:
    """RUN/trackers.json for a resume, or {} when absent. Unreadable (truncated, not JSON, or the record
    of a tracker used not one: `{"wandb": 5}` started a new run and overwrote the id, trial RV59a F1)
    while wandb or trackio is used: an error, as going on would silently start new runs of them; it
    names the wandb run found in RUN/wandb and the line that continues it."""
    path = Path(run_dir) / TRACKERS_JSON
    if not path.exists():
        return {}
    state: Any = None
    try:
        state = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        if not isinstance(state, dict):
            raise ValueError(f"a JSON {type(state).__name__}, not an object")
        for name in using:
            if name in _RUN_KEY and name in state and not _a_record(name, state[name]):
                raise ValueError(
                    f'its "{name}" is not an object whose "{_RUN_KEY[name]}" and "project" are text (and '
                    '"sent_through", if any, a step number)'
                )
    except (OSError, ValueError) as e:
        continued = [t for t in using if t in ("wandb", "trackio")]
        if not continued:
            return {}
        why = e.strerror if isinstance(e, OSError) else str(e).split(":")[0]
        record: dict[str, Any] = {}
        if "wandb" in continued:
            runs = _wandb_runs(Path(run_dir))
            found = list(runs)
            record["wandb"] = {"id": found[-1] if found else "<the run's id in wandb>", "project": project}
            if found:  # an offline run continues offline in a shell without WANDB_MODE, as it would have
                record["wandb"]["mode"] = runs[found[-1]]
        if "trackio" in continued:
            record["trackio"] = {"name": "<the run's name in trackio>", "project": project}
        for name in continued:  # a record that names its run, wrong elsewhere: its run kept (RV59f 4)
            kept = state.get(name) if isinstance(state, dict) else None
            if isinstance(kept, dict) and isinstance(kept.get(_RUN_KEY[name]), str) and kept[_RUN_KEY[name]]:
                texts = {
                    k: v
                    for k, v in kept.items()
                    if k in ("id", "name", "project", "mode") and isinstance(v, str)
                }
                if record[name].get("id") != texts.get("id", record[name].get("id")):
                    record[name].pop("mode", None)  # the mode found was another run's
                record[name] = {**record[name], **texts}
        seen = ""
        if "wandb" in continued:
            seen = (
                f" (this run directory's wandb run(s): {', '.join(found)})"
                if found
                else " (no wandb run in RUN/wandb or WANDB_DIR shows this run directory: its id is unknown)"
            )
        raise GristmillError(
            f"{path} is unreadable ({why}), so the {' and '.join(continued)} run(s) this resume should "
            f"continue are unknown{seen}; to continue them write {json.dumps(record)} into it, or "
            "delete it to start new tracker runs"
        ) from None
    return state


_RUN_KEY = {"wandb": "id", "trackio": "name"}  # what a resume continues a tracker's run by


def _copied_from(state: dict[str, Any], here: str) -> str | None:
    """The run directory a wandb/trackio record of `state` (a trackers.json read at `here`) was
    written in ("run_dir"), where that is another that still holds a trackers.json naming the same
    run: `here` is a copy of it. None for the run's own records, a moved run's (its first place gone,
    or another run's now), and records from before the place was kept."""
    for name, key in _RUN_KEY.items():
        ours = state.get(name)
        there = ours.get("run_dir") if isinstance(ours, dict) else None
        if not isinstance(there, str) or there == here:
            continue
        try:
            if os.path.samefile(there, here):  # one directory under two paths (a bind mount, another node)
                continue
            theirs = json.loads((Path(there) / TRACKERS_JSON).read_text(encoding="utf-8")).get(name)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(theirs, dict) and ours.get(key) and theirs.get(key) == ours.get(key):
            return there
    return None


def _a_record(name: str, record: Any) -> bool:
    """Whether `record` names the run of tracker `name` that a resume continues (its project may be
    "", as metrics.project may: review RV59d 2), and how far it was sent, if it says."""
    if not isinstance(record, dict):
        return False
    sent = record.get("sent_through")  # text there was a traceback after wandb resumed (RV59d 3)
    return (
        isinstance(record.get(_RUN_KEY[name]), str)
        and bool(record[_RUN_KEY[name]])
        and isinstance(record.get("project"), str)
        and (sent is None or (isinstance(sent, int) and not isinstance(sent, bool)))
    )


def _wandb_runs(run_dir: Path) -> dict[str, str]:
    """{run id: "offline" or "online"} of this run's wandb directories (`[offline-]run-<time>-<id>[-n]`),
    oldest first, each once (its latest directory's mode): all under RUN/wandb; under WANDB_DIR, which
    other runs may share (its newest run was another run's), those whose log shows this run directory
    (the config's provenance.run_dir)."""
    mine = run_dir.resolve() / "wandb"
    roots = [mine]
    if os.environ.get("WANDB_DIR"):
        roots.append(Path(os.environ["WANDB_DIR"]).resolve() / "wandb")
    shows = repr(str(run_dir.resolve()))  # as wandb's debug.log prints the config (a dict's repr)

    def ours(root: Path, d: Path) -> bool:
        if root == mine:
            return True
        with contextlib.suppress(OSError):
            return shows in (d / "logs" / "debug.log").read_text(encoding="utf-8", errors="replace")
        return False

    found = [
        m.groups()
        for r in dict.fromkeys(roots)
        if r.is_dir()
        for d in r.iterdir()
        if (m := _WANDB_RUN_DIR.match(d.name)) and ours(r, d)
    ]
    runs: dict[str, str] = {}
    for offline, _, run_id in sorted(found, key=lambda g: g[1]):  # a key keeps its first place
        runs[run_id] = "offline" if offline else "online"
    return runs


_WANDB_RUN_DIR = re.compile(r"(offline-)?run-(\d{8}_\d{6})-([a-z0-9]+)(?:-\d+)?$")


def write_state(run_dir: Path, state: dict[str, Any], fsync: bool = True) -> None:
    write_atomic(Path(run_dir) / TRACKERS_JSON, json.dumps(state, indent=2) + "\n", fsync=fsync)


def provenance(datasets: dict[str, str]) -> dict[str, Any]:
    """What a tracker records once per run besides the config: the code's git commit and, per source,
    its dataset directory with dataset.json's content `fingerprint` and build `config_sha256`."""
    sources = {}
    for name, path in datasets.items():
        info = dataset_info(path)  # a bucket's: one GET
        sources[name] = {
            "dataset": str(path),
            "fingerprint": info["fingerprint"],
            "config_sha256": info.get("config_sha256"),
        }
    return {"git_commit": git_commit(), "datasets": sources}


def _wandb_dir(run_dir: Path) -> Path:
    """Where wandb keeps its files (in a folder `wandb` of it): WANDB_DIR, else the run directory."""
    return Path(os.environ.get("WANDB_DIR") or run_dir)


class _Made:
    """The entries of the folders a tracker's start writes in (RUN/tensorboard; RUN/wandb or WANDB_DIR/
    wandb), taken before the trackers start: a start that fails removes what this attempt made there
    (an empty event file, an empty wandb run directory, each refused attempt another: trial RV70d 3)
    and points wandb's links (latest-run, debug.log) back, never removing what was there before."""

    def __init__(self, run_dir: Path):
        self.tensorboard = run_dir / "tensorboard"
        self.wandb = _wandb_dir(run_dir) / "wandb"
        self.shared = self.wandb.parent != run_dir  # WANDB_DIR: other runs' directories beside this one's
        self.before: dict[Path, dict[str, str | None] | None] = {}
        for folder in (self.tensorboard, self.wandb):
            with contextlib.suppress(OSError):  # one that cannot be listed is left as it is (RV70h 2)
                self.before[folder] = _entries(folder)

    def undo(self, wandb_id: str | None) -> None:
        """Removes what the trackers' start made; `wandb_id`: the wandb run it started, if one (in a
        shared WANDB_DIR only that run's directory is this attempt's)."""
        for folder, before in self.before.items():
            mine = folder == self.tensorboard or not self.shared
            if before is None:  # the folder is this attempt's
                if mine and folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)
                continue
            try:
                now = _entries(folder) or {}
            except OSError:
                continue
            for name, link in now.items():
                path = folder / name
                # a link in a shared WANDB_DIR: this attempt's where it leads into its run's directory
                ours = mine or (link is not None and wandb_id is not None and f"-{wandb_id}" in link)
                with contextlib.suppress(OSError):
                    if name in before and before[name] != link and before[name] is not None and ours:
                        path.unlink()  # a link of wandb's moved to this attempt's run: pointed back
                        path.symlink_to(before[name])
                    elif name in before:
                        continue
                    elif link is not None:
                        if ours:
                            path.unlink()
                    elif folder == self.tensorboard or (
                        (run := _WANDB_RUN_DIR.match(name)) and (mine or run.group(3) == wandb_id)
                    ):
                        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _entries(folder: Path) -> dict[str, str | None] | None:
    """{name: where it links to, None for a file or folder} of `folder`'s entries; None: no folder (an
    OSError for one that cannot be listed: not taken for a folder this attempt made, review RV70h 2)."""
    try:
        return {e.name: os.readlink(e.path) if e.is_symlink() else None for e in os.scandir(folder)}
    except FileNotFoundError:
        return None


def _init_failed(tracker: str, e: Exception, fix: str) -> GristmillError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return GristmillError(
        f"{tracker} could not start a run: {first}; {fix}, or drop {tracker} from metrics.trackers"
    )


class Tensorboard:
    """Event files in RUN/tensorboard. On a resume, events of steps after the checkpoint (written by
    the interrupted invocation, about to be redone) are purged, so the curves have no doubled steps;
    a new run purges all of an earlier run's."""

    def __init__(self, run_dir: Path, resume_step: int | None, info: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter  # ImportError: the caller's note

        # A new run (or one resumed from another run's checkpoint) purges every step an earlier run left
        # in RUN/tensorboard: its curve, another lr's, stayed under this run's, steps doubled.
        purge = 0 if resume_step is None else resume_step + 1
        _quiet_event_writer_threads()
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=purge)
        if resume_step is None:
            self.writer.add_text("provenance", f"```\n{json.dumps(info, indent=2)}\n```", 0)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()
        # The writer's own thread meets a removed directory first (kept off stderr, see below) while
        # the flush returns: the next step's flush raised, or none did (a flaky test)
        if not Path(self.writer.get_logdir()).is_dir():
            raise FileNotFoundError(f"{self.writer.get_logdir()} is gone")

    def finish(self, failed: bool = False) -> None:
        self.writer.close()


def _quiet_event_writer_threads() -> None:
    """tensorboard's event-file writer thread keeps what its write raised (a full disk) and raises it
    again at the writer's next call, where `Trackers` says it in one warning line; threading's hook
    printed the thread's 15-line traceback before it (review R26a F7). That thread's alone are kept
    off stderr; every other thread's go to the hook as before."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "gristmill_tensorboard", False):  # installed by an earlier run in this process
        return

    def hook(args: Any) -> None:
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)

    hook.gristmill_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class Wandb:
    """A Weights & Biases run; `resume_id` continues that run (`wandb.init(id=…, resume="allow")`).
    Files go to RUN/wandb unless WANDB_DIR says otherwise; WANDB_MODE=offline logs there only
    (`wandb sync` uploads later, the resumed part into the same run)."""

    def __init__(self, run_dir: Path, *, project: str, name: str, tags: list[str], config: dict,
                 resume_id: str | None, mode: str | None = None):  # fmt: skip
        import wandb

        # A run started offline continues offline in a shell without WANDB_MODE (not a failure on a
        # missing API key); WANDB_MODE, when set, decides.
        keep = mode == "offline" and not os.environ.get("WANDB_MODE")

        # quiet: wandb's start line with the run's place (URL or offline directory) stays, its
        # end-of-run sparkline panel goes; WANDB_QUIET / WANDB_SILENT, when set, decide instead.
        quiet = not {"WANDB_QUIET", "WANDB_SILENT"} & os.environ.keys()
        files = _wandb_dir(run_dir)
        try:
            # wandb prints to sys.stderr itself, not through the console: a reader gone meanwhile (`… 2>&1
            # | head -1`) raised BrokenPipeError out of wandb.init, the run stopped before step 1 (trial
            # RV68a F1); its lines now stop there as the console's do
            safe = _ReaderSafeStream(sys.stderr) if sys.stderr else None  # None: no stderr (a daemon)
            with contextlib.redirect_stderr(safe) if safe else contextlib.nullcontext():
                self.run = wandb.init(
                    project=project,
                    name=name,
                    tags=tags or None,
                    config=config,
                    dir=str(files),
                    id=resume_id,
                    resume="allow" if resume_id else None,
                    settings=wandb.Settings(quiet=True) if quiet else None,
                    mode="offline" if keep else None,
                )
        except Exception as e:  # no API key or network, a refused id, RUN/wandb a file: one line, no step
            raise _init_failed("wandb", e, _wandb_fix(e, files / "wandb")) from None
        self.id, self.name = self.run.id, self.run.name
        self.mode = (
            "disabled"
            if getattr(self.run, "disabled", False)
            else "offline"
            if self.run.offline
            else "online"
        )
        self.where = (
            "; offline, as the run was started (WANDB_MODE=online to sync from now on)" if keep else ""
        )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def finish(self, failed: bool = False) -> None:
        # waits for wandb's service to take the run's last records: a hung service is bounded by
        # the caller (_Feed.finish), which abandons it then
        try:
            self.run.finish(exit_code=1 if failed else 0)
        except BaseException:
            _wandb_teardown()  # its service gone: its exit hook would fail the same way
            raise

    def abandon(self) -> None:
        _wandb_teardown(wait=2)  # its exit hook would wait for the same service: unregistered first


class _ReaderSafeStream(ReaderSafeOut):
    """sys.stderr while wandb starts: what its reader, gone, cannot take is dropped (training/console.py);
    anything else (isatty, fileno, encoding, which wandb and click ask) is the stream's own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _wandb_fix(e: Exception, files: Path) -> str:
    """The fix for what wandb.init raised: logging in or going offline only where the failure is about
    those (a broken pipe or RUN/wandb a file was told to log in: trial RV68a F7)."""
    import wandb

    # before the login advice: a BrokenPipeError is a ConnectionError
    if isinstance(e, OSError) and e.errno in (errno.EPIPE, errno.EIO):
        return "the terminal or pipe it printed to closed: run it again with its output kept open"
    login = isinstance(
        e, wandb.errors.AuthenticationError | wandb.errors.CommError | ConnectionError | TimeoutError
    )
    if login or re.search(r"api.?key|log ?in\b", str(e), re.I):
        return "log in (wandb login) or set WANDB_MODE=offline"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"free space on the disk of {files} (WANDB_DIR moves it)"
    if isinstance(e, PermissionError | NotADirectoryError | FileExistsError) or (
        isinstance(e, OSError) and e.errno == errno.EROFS
    ):  # not every OSError: a refused connection was told to make the directory writable (RV68d 7)
        return f"make {files} a writable directory (WANDB_DIR moves it)"
    return "fix what it names (metrics.project, a WANDB_* variable, the disk or network it names)"


def _wandb_teardown(wait: float = 10) -> None:
    """wandb's service is gone (killed) or hung: wandb's exit hook would fail the same way (printed as
    a traceback after the run's last line) or wait forever. Tearing down unregisters that hook first;
    in a thread, waited for `wait` s at most, since it waits for a service that may still be alive
    (and may sys.exit with its status), which must not hold up or end training."""
    import wandb

    def teardown() -> None:
        with contextlib.suppress(BaseException):
            wandb.teardown()

    done = threading.Thread(target=teardown, name="wandb-teardown", daemon=True)
    done.start()
    done.join(timeout=wait)


class Trackio:
    """A trackio run in trackio's local store (TRACKIO_DIR, default ~/.cache/huggingface/trackio;
    `trackio show` opens it). trackio resumes by run name; its own start-up chatter (dashboard
    instructions, psutil notices) is kept off the terminal."""

    def __init__(self, *, project: str, name: str, config: dict, resume: dict | None):
        with contextlib.redirect_stdout(io.StringIO()):
            import trackio
            from trackio.sqlite_storage import SQLiteStorage
            from trackio.utils import TRACKIO_DIR

            if resume:  # the run trackio.init would resume (its own look-up), checked before it logs there
                try:
                    newest = SQLiteStorage.get_latest_run_record_by_name(project, resume["name"])
                except Exception:  # an unreadable store: trackio.init says so itself
                    newest = None
                if newest and resume.get("id") and newest["id"] != resume["id"]:
                    raise GristmillError(
                        f"trackio resumes a run by its name, and the newest run named {resume['name']!r} in "
                        f"project {project!r} is {newest['id']}, another run's, not this run's "
                        f"{resume['id']} (its {TRACKERS_JSON}); rename or delete that other run in trackio, "
                        f'or remove "trackio" from its {TRACKERS_JSON} to start a new trackio run'
                    )
            try:
                # trackio stores rows from a thread of its own, whose errors it keeps to itself: a store
                # it cannot write took every row and said nothing (review R22f S5). Opened here first.
                SQLiteStorage.init_db(project)
                self.run = trackio.init(
                    project=project,
                    name=resume["name"] if resume else name,
                    config=config,
                    resume="allow" if resume else "never",
                    embed=False,
                )
            except Exception as e:  # an invalid project name, an unwritable TRACKIO_DIR
                raise _init_failed("trackio", e, "check metrics.project and TRACKIO_DIR") from None
        # Its current run cleared here, in the thread that set it: its exit hook then does nothing
        # (finished by `finish` on the feed's thread, or not at all when given up as hung).
        trackio.context_vars.current_run.set(None)
        self.project, self.store = project, TRACKIO_DIR
        self._stored_step = SQLiteStorage.get_max_step_for_run
        self.id, self.name = self.run.id, self.run.name
        where = self.run.url or f"local store {TRACKIO_DIR}, see it with `trackio show --project {project}`"
        self.where = f"; {where}"
        self.note = None
        if resume and resume.get("id") != self.id:  # the recorded run is gone (deleted in trackio)
            self.note = (
                f"note: trackio's run {self.name!r} in project {project!r} is id {self.id}, not the "
                f"recorded {resume.get('id')} (trackio resumes the newest run of a name)"
            )
        elif resume and name != self.name:  # trackio resumes by the recorded name and has no rename on init
            self.note = (
                f"note: trackio continues the run under its recorded name {self.name!r}, not {name!r} "
                "(trackio finds the run to resume by its name)"
            )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def finish(self, failed: bool = False) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()

    def stored_through(self) -> int:
        """The highest step trackio's store holds of this run, read after `finish` (which waits for
        trackio's thread to store what was logged): what it took from `log` is not what it kept."""
        return self._stored_step(self.project, run_id=self.id) or 0
