"""Experiment trackers: tensorboard, Weights & Biases, trackio; one small adapter class each.

Each adapter has `log(scalars, step)` and `finish(failed)`; `Trackers` holds those [metrics]
names and hands each metrics row to them (training/run/record.py, rank 0's writer, calls it). The
packages are imported inside the adapters only, so the trainer runs without them (training/ imports
only torch, numpy and pyarrow at module level). Which trackers a recipe names, and whether their
packages are installed, is checked with the config (training.config_checks.trackers_of), before
any work.

Resuming: RUN/trackers.json records the wandb run id (and mode) and the trackio run (name, id) with
their project, and for each whether an invocation has it open and how far its run was sent
(`open`, `sent_through`). A resumed invocation (`--resume`) continues those runs (an unreadable file
is an error naming the run to continue, not a silent new run); a fresh run into the same directory
starts new ones and overwrites the file. trackio resumes a run by its name (the newest run of that
name in the project) and keeps it: when that is another run (another run directory's, of the same
name), the resume is refused rather than logged into it; a metrics.run_name changed since is not
applied to trackio (a note says so).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from training.config import MetricsSection
from training.config_checks import trackers_of
from training.console import say
from training.contract.atomic_write import write_atomic
from training.contract.errors import GristmillError
from training.data.remote import dataset_info

TRACKERS_JSON = "trackers.json"  # in the run directory: the wandb/trackio runs a resume continues


class Trackers:
    """The trackers of [metrics], opened on rank 0 (tensorboard by default; wandb, trackio), each
    metrics row handed to them (`log`) and finished at the end (`close`).

    A resumed run (`resume_step`) continues the wandb/trackio runs recorded in RUN/trackers.json,
    where each record says how far its run was sent (`sent_through`: exact when an invocation closed
    it; while one had it open, `logged_through`, the last step metrics.jsonl held). Those of its steps
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
        logged_through: int | None,
    ):
        """`config`: the resolved recipe (to_dict), `datasets`: source name -> dataset directory;
        both go to the wandb/trackio run once, with the code's git commit."""
        self.run_dir = Path(run_dir)
        self.trackers: dict[str, Any] = {}
        self.skip_through: dict[str, int] = {}  # tracker -> steps up to here it already has
        self._state: dict[str, Any] = {}  # RUN/trackers.json as this invocation writes it
        self._sent: dict[str, int] = {}  # tracker -> the last step this invocation sent it
        try:
            self._open(m, config, datasets, resume_step, logged_through)
        except BaseException:
            self.close()
            raise

    def _open(
        self,
        m: MetricsSection,
        config: dict,
        datasets: dict[str, str],
        resume_step: int | None,
        logged_through: int | None,
    ) -> None:
        names, project, notes = trackers_of(m)
        for note in notes:
            say(note)
        info = provenance(datasets) if names else {}
        old = read_state(self.run_dir, names, project) if resume_step is not None else {}
        state = dict(old)  # a resume keeps the record of a tracker it does not use this time
        run_name = m.run_name or self.run_dir.resolve().name
        # the run directory, absolute: what tells this run's wandb directories in a shared WANDB_DIR
        tracker_config = {**config, "provenance": {**info, "run_dir": str(self.run_dir.resolve())}}
        # trackio first, as its resume may be refused (another run has its name): no wandb run resumed
        # for nothing; tensorboard last: a tracker that fails to start leaves no empty event file behind
        held: dict[str, int | None] = {}  # tracker -> the last step its run holds (sent_through)
        for name in sorted(names, key=("trackio", "wandb", "tensorboard").index):
            prev = old.get(name) if isinstance(old.get(name), dict) else None
            prev = prev if prev and prev.get("project") == project else None
            if name == "tensorboard":
                try:
                    self.trackers[name] = Tensorboard(self.run_dir, resume_step, info)
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
                state[name] = {"id": t.id, "project": project, "mode": t.mode}
            else:
                t = Trackio(project=project, name=run_name, config=tracker_config, resume=prev)
                state[name] = {"id": t.id, "name": t.name, "project": project}
                if t.note:
                    say(t.note)
            self.trackers[name] = t
            how = "continued" if prev else "new"
            say(f"{name} tracker: {how} run {t.id} in project {project!r} (name {t.name!r}){t.where}")
            held[name] = sent_through(prev, logged_through)
            if held[name] is not None and resume_step is not None and held[name] > resume_step:
                self.skip_through[name] = held[name]
        # Each record says how far its tracker was sent: exactly once an invocation closed it
        # ("sent_through"), or, while one has it open (a kill leaves it so), up to the last row of
        # metrics.jsonl. An invocation without a tracker sends it nothing: its steps, redone later,
        # are sent then (a skip by "the last invocation's rows" lost them: reviews R16h F1, R16i F5).
        for name, record in state.items():
            if isinstance(record, dict):
                was = held[name] if name in names else sent_through(record, logged_through)
                record.update({"open": name in names, **({"sent_through": was} if was is not None else {})})
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
        for name, tracker in list(self.trackers.items()):
            if step > self.skip_through.get(name, -1):
                try:
                    tracker.log(scalars, step)
                    # the highest: after a rewind the steps go back, and the run holds the higher ones
                    self._sent[name] = max(self._sent.get(name, 0), step)
                except Exception as e:  # a side activity: it never costs training (wandb's service killed)
                    say(
                        f"WARNING: {name} failed at step {step} ({type(e).__name__}: {e}); it gets no more "
                        "rows this run, training goes on (metrics.jsonl has every row)"
                    )
                    self.trackers.pop(name)
                    with contextlib.suppress(Exception):
                        tracker.finish(True)
                    # said now: a kill before the end would leave it open, read as sent every row
                    self._record_sent([name])  # (review R16j F1)

    def close(self) -> None:
        """Finish the trackers; called in a `finally`, so an exception on its way out marks the wandb
        run failed. One tracker failing to finish does not keep the others open."""
        failed = sys.exc_info()[0] is not None
        for name, tracker in self.trackers.items():
            try:
                tracker.finish(failed)
            except Exception as e:
                say(f"note: {name} did not finish cleanly: {e}")
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
        self.trackers = {}
        self._record_sent([n for n, r in self._state.items() if isinstance(r, dict) and r.get("open")])

    def _record_sent(self, names: list[str]) -> None:
        """RUN/trackers.json: trackers `names`, closed by this invocation, were sent exactly through
        their highest step (sent_through)."""
        # tensorboard keeps no record (its event files are the run directory's): nothing to say of it
        # (a KeyError here ended the run that had just been told "training goes on": review R18d 1)
        names = [n for n in names if isinstance(self._state.get(n), dict)]
        for name in names:
            record = self._state[name]
            last = max(record.get("sent_through") or 0, self._sent.get(name, 0)) or None
            record.pop("sent_through", None)
            record.update({"open": False, **({"sent_through": last} if last else {})})
        if names:
            with contextlib.suppress(OSError):  # a side activity's record: never an error at the end
                write_state(self.run_dir, self._state)


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
    """RUN/trackers.json for a resume, or {} when absent. Unreadable (truncated, not JSON) while wandb
    or trackio is used: an error, as going on would silently start new runs of them; it names the
    wandb run found in RUN/wandb and the line that continues it."""
    path = Path(run_dir) / TRACKERS_JSON
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        if not isinstance(state, dict):
            raise ValueError(f"a JSON {type(state).__name__}, not an object")
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


def sent_through(record: dict[str, Any] | None, logged_through: int | None) -> int | None:
    """The last step a tracker's run holds rows up to, by its record in RUN/trackers.json: the exact
    step an invocation that closed it recorded; while one had it open (killed, or a record written
    before gristmill kept this), the last row metrics.jsonl had, as that invocation sent every row."""
    if record is None:
        return None
    held = record.get("sent_through")
    if record.get("open", True) and logged_through is not None:
        held = max(held or 0, logged_through)
    return held


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    write_atomic(Path(run_dir) / TRACKERS_JSON, json.dumps(state, indent=2) + "\n")


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
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=purge)
        if resume_step is None:
            self.writer.add_text("provenance", f"```\n{json.dumps(info, indent=2)}\n```", 0)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()
        # The writer's own thread meets a removed directory first, and says it there (a traceback on
        # stderr) while the flush returns: the next step's flush raised, or none did (a flaky test)
        if not Path(self.writer.get_logdir()).is_dir():
            raise FileNotFoundError(f"{self.writer.get_logdir()} is gone")

    def finish(self, failed: bool = False) -> None:
        self.writer.close()


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
        try:
            self.run = wandb.init(
                project=project,
                name=name,
                tags=tags or None,
                config=config,
                dir=os.environ.get("WANDB_DIR") or str(run_dir),
                id=resume_id,
                resume="allow" if resume_id else None,
                settings=wandb.Settings(quiet=True) if quiet else None,
                mode="offline" if keep else None,
            )
        except Exception as e:  # no API key, no network, a refused id: one line, before any step
            raise _init_failed("wandb", e, "log in (wandb login) or set WANDB_MODE=offline") from None
        self.id, self.name = self.run.id, self.run.name
        self.mode = "offline" if self.run.offline else "online"
        self.where = (
            "; offline, as the run was started (WANDB_MODE=online to sync from now on)" if keep else ""
        )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def finish(self, failed: bool = False) -> None:
        # finish() waits for wandb's service to take the run's last records: a hung service (stopped,
        # swapped out, wedged) held a finished run's process forever. So in a thread, waited for
        # GRISTMILL_WANDB_FINISH_TIMEOUT seconds (30) at most; the run's results are written by then.
        errors: list[BaseException] = []

        def finish() -> None:
            try:
                self.run.finish(exit_code=1 if failed else 0)
            except BaseException as e:  # handed to the caller's thread
                errors.append(e)

        try:
            timeout = float(os.environ.get("GRISTMILL_WANDB_FINISH_TIMEOUT") or 30)
        except ValueError:  # a mistyped value must not leave the run unfinished
            timeout = 30.0
        done = threading.Thread(target=finish, name="wandb-finish", daemon=True)
        done.start()
        done.join(timeout=timeout)
        if done.is_alive():
            say(
                f"WARNING: wandb did not finish its run {self.id} within {timeout:g} s (its service does not "
                "answer); not waited for: the run's own record (metrics.jsonl, checkpoints) is complete"
            )
            _wandb_teardown(wait=2)  # its exit hook would wait for the same service: unregistered first
        elif errors:
            _wandb_teardown()
            raise errors[0]


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
        self.finish_current = trackio.finish  # clears its current run too: its exit hook then does nothing
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
            self.finish_current()

    def stored_through(self) -> int:
        """The highest step trackio's store holds of this run, read after `finish` (which waits for
        trackio's thread to store what was logged): what it took from `log` is not what it kept."""
        return self._stored_step(self.project, run_id=self.id) or 0
