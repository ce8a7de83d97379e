"""Faults a test injects into a real run through the environment. Never set in real runs.

GRISTMILL_FAULT_NAN_LOSS="STEP[,STEP…][@RANK]": the training loss of those steps (on that rank
only, or on every rank) is multiplied by NaN before backward, so the loss and every gradient are
NaN — what a diverged run produces, at a chosen step.

GRISTMILL_FAULT_SPIKE_WINDOW="WINDOW[*FACTOR][,…]": the training loss of every step whose windows
include that data window is multiplied by FACTOR (default 100) on every rank — a loss spike tied to
data, not to a step number, so a run that rewinds past it and skips its window never meets it
again, and one that trains the window again does. WINDOW is SOURCE:EPOCH:TOKEN (source name,
0-based epoch, first stream token: what training/data/plan.Plan.step_windows names) or step:N, the
first window of global step N in the run's plan.

GRISTMILL_FAULT_KILL="POINT": the process kills itself with SIGKILL when it reaches that point
(`kill_point`): "rewind-start" (a rewind decided, nothing restored), "rewind-restored" (the
checkpoint loaded and the skip recorded in the timeline), "rewind-recorded" (the run directory
brought into line with it: rows marked, batch records moved; the skip's checkpoint not yet saved),
"rewind-saved" (the skip's checkpoint complete), "complete:N" (rank 0 wrote step N's COMPLETE; its
exports and retention not begun), "saved:N" (the loop's checkpoint of step N saved, an async
write still in flight unless a validation or eval is due at N; its validation, eval and metrics row
not yet done; a rewind's checkpoint is "rewind-saved"'s, never this one's: trial RV59e 1),
"trained:N" (step N trained and folded into [merge]'s average, nothing of it saved or written). A
kill -9 at a known place, for the resume tests.

GRISTMILL_FAULT_SIGTERM="[awaited:]STEP[@RANK]": the process (of that rank only, or of every rank)
sends itself SIGTERM as step STEP starts (a preemption at a known step: the run finishes that step,
saves and stops; on one rank, a `kill` of one trainer's pid: the others learn of it from the stop's
agreement); with `awaited:`, while step STEP's data is awaited (its wait ends, as a signal's during an
outage does: the run saves the step before it and stops); "complete": once `python -m training.train`'s
run is complete, before its teardown (`sigterm_point`); "released": once the loop gave the signals back,
before the process group's teardown.

GRISTMILL_FAULT_DATA="STEP[@RANK]": the data of step STEP cannot be read (`data_fault`) on that rank
only, or on every rank: the loop meets the error a bucket that stays down past data.fetch_timeout_s
gives, at a known step (on one rank: the others have taken that step's batch).

GRISTMILL_FAULT_HOLD_DATA="STEP[@RANK]": the data of step STEP is awaited for 60 s, then cannot be
read, unless the run is asked to stop meanwhile (a hung store's wait, on one rank: the others wait in
the step's agreement).

GRISTMILL_FAULT_REPLACE_DATASET="OLD=NEW": rank 0, having opened its sources (OLD among them),
moves the dataset directory NEW to OLD's place (OLD to OLD.replaced), and the other ranks open theirs
only then: a dataset replaced at its location while the ranks of one run start (`replace_dataset`).

A run in whose environment any of them is set says so before its checks (`fault_warnings`, rank 0): a
variable left set in a shell changed a real run's loss without a trace, exit 0 (review R25b 7).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import torch.nn as nn

from training.contract.errors import GristmillError
from training.contract.object_store import stop_if_asked

NAN_LOSS = "GRISTMILL_FAULT_NAN_LOSS"
SPIKE_WINDOW = "GRISTMILL_FAULT_SPIKE_WINDOW"
KILL = "GRISTMILL_FAULT_KILL"
SIGTERM = "GRISTMILL_FAULT_SIGTERM"
DATA = "GRISTMILL_FAULT_DATA"
HOLD_DATA = "GRISTMILL_FAULT_HOLD_DATA"
HOLD_S = 60  # how long GRISTMILL_FAULT_HOLD_DATA holds a step's data unless the run is asked to stop
REPLACE_DATASET = "GRISTMILL_FAULT_REPLACE_DATASET"

# What each does, for the warning a run gives when one is set.
EFFECTS = {
    NAN_LOSS: "the training loss of those steps is made NaN",
    SPIKE_WINDOW: "the training loss of the steps that train those data windows is multiplied",
    KILL: "the process kills itself (SIGKILL) at that point",
    SIGTERM: "the process sends itself SIGTERM at that step (as it starts, or while its data is awaited) "
    "or once its run is complete",
    DATA: "the data of that step cannot be read",
    HOLD_DATA: "the data of that step is awaited until the run is asked to stop (60 s at most)",
    REPLACE_DATASET: "rank 0 replaces that dataset directory with another while the run starts",
}


def faults_set() -> dict[str, str]:
    """{variable: value} of the fault variables set in this process's environment."""
    return {name: os.environ[name] for name in EFFECTS if os.environ.get(name)}


def fault_warnings() -> list[str]:
    """One line for each fault variable set in this process's environment (none: [])."""
    return [
        f"warning: {name}={value} is set: a test's injected fault, {EFFECTS[name]}; unset it for a real run"
        for name, value in faults_set().items()
    ]


# The form of each variable's value: a test's typo was a traceback after the run's files were written,
# or an injection that never came, exit 0 (trial RV74a 3)
_STEP = r"\s*[0-9]+\s*"
_WINDOW = r"(step:[0-9]+|[^:,*]+:[0-9]+:[0-9]+)(\*[0-9.eE+-]+)?"
FORMS = {
    NAN_LOSS: (rf"{_STEP}(,{_STEP})*(@[0-9]+)?", "STEP[,STEP…][@RANK]"),
    SPIKE_WINDOW: (rf"{_WINDOW}(,{_WINDOW})*", "WINDOW[*FACTOR][,…], WINDOW SOURCE:EPOCH:TOKEN or step:N"),
    KILL: (
        r"rewind-(start|restored|recorded|saved)|(complete|saved|trained):[0-9]+",
        "rewind-start, rewind-restored, rewind-recorded, rewind-saved, complete:N, saved:N or trained:N",
    ),
    SIGTERM: (
        r"(awaited:)?[0-9]+(@[0-9]+)?|complete|released",
        "[awaited:]STEP[@RANK], complete or released",
    ),
    DATA: (r"[0-9]+(@[0-9]+)?", "STEP[@RANK]"),
    HOLD_DATA: (r"[0-9]+(@[0-9]+)?", "STEP[@RANK]"),
    REPLACE_DATASET: (r"[^=]+=[^=]+", "OLD=NEW"),
}


def check_faults() -> None:
    """Refuse, in one line, a fault variable whose value is not of its form (FORMS)."""
    for name, value in faults_set().items():
        pattern, form = FORMS[name]
        if re.fullmatch(pattern, value) is None or (name == SPIKE_WINDOW and not _factors_read(value)):
            raise GristmillError(
                f"{name}={value} is not of the form {form} (a test's injected fault: "
                "training/run/faults.py); fix it, or unset it for a real run"
            )


def _factors_read(value: str) -> bool:
    """Whether each window's FACTOR reads as a number (the form lets "1.2.3" through)."""
    try:
        [float(item.partition("*")[2] or 100) for item in value.split(",")]
    except ValueError:
        return False
    return True


def kill_point(point: str) -> None:
    """SIGKILL this process if GRISTMILL_FAULT_KILL names `point`."""
    if os.environ.get(KILL) == point:
        os.kill(os.getpid(), signal.SIGKILL)


AWAITED = "awaited:"
COMPLETE = "complete"  # GRISTMILL_FAULT_SIGTERM's point once a run is complete (sigterm_point)
RELEASED = "released"  # and once the loop gave the signals back, before the process group's teardown


def sigterm_point(point: str) -> None:
    """SIGTERM this process if GRISTMILL_FAULT_SIGTERM names `point`."""
    if os.environ.get(SIGTERM) == point:
        os.kill(os.getpid(), signal.SIGTERM)


def _step_named(spec: str, rank: int) -> int:
    """The step of a "STEP[@RANK]" value where it names this rank (or none), else 0."""
    at, _, on_rank = spec.partition("@")
    return int(at) if at and on_rank in ("", str(rank)) else 0


def data_fault(step: int, rank: int) -> None:
    """Raise the error of data that cannot be had if GRISTMILL_FAULT_DATA names step `step` (and, when
    it names a rank, `rank`); wait for it until the run is asked to stop where GRISTMILL_FAULT_HOLD_DATA
    names it (FetchStopped; HOLD_S at most, then that error); or, where GRISTMILL_FAULT_SIGTERM names
    it `awaited:`, SIGTERM this process, whose handler ends the wait (object_store.FetchStopped)."""
    if _step_named(os.environ.get(DATA, ""), rank) == step:
        raise GristmillError(f"the data of step {step} cannot be read ({DATA}={os.environ[DATA]})")
    if _step_named(os.environ.get(HOLD_DATA, ""), rank) == step:
        deadline = time.monotonic() + HOLD_S
        while time.monotonic() < deadline:  # only a stop ends it, as a hung store's wait
            stop_if_asked()
            time.sleep(0.05)
        raise GristmillError(f"the data of step {step} cannot be read ({HOLD_DATA} held it for {HOLD_S} s)")
    spec = os.environ.get(SIGTERM, "")
    if spec.startswith(AWAITED) and _step_named(spec.removeprefix(AWAITED), rank) == step:
        os.kill(os.getpid(), signal.SIGTERM)  # handled before the call returns: STOP_FETCHING is set
        stop_if_asked()


def replace_dataset(rank: int, point: str) -> None:
    """GRISTMILL_FAULT_REPLACE_DATASET at `point`: "opened" (rank 0 has opened its sources: it
    replaces OLD with NEW) or "opening" (another rank, about to open its sources, waits until then)."""
    old, _, new = os.environ.get(REPLACE_DATASET, "").partition("=")
    if not new:
        return
    aside = Path(f"{old}.replaced")
    if rank == 0 and point == "opened":
        os.rename(old, aside)
        os.rename(new, old)
    elif rank != 0 and point == "opening":
        deadline = time.monotonic() + 120
        while not (aside.is_dir() and Path(old).is_dir()):
            if time.monotonic() > deadline:
                raise GristmillError(f"{REPLACE_DATASET}: rank 0 did not replace {old} within 120 s")
            time.sleep(0.05)


class LossFaults:
    """Arms a forward hook on the model that multiplies its loss at the chosen steps or windows."""

    def __init__(self, model: nn.Module, rank: int, plan):
        """`plan`: the run's training/data/plan.Plan (to find the spike windows' steps)."""
        spec = os.environ.get(NAN_LOSS, "")
        steps, _, on_rank = spec.partition("@")
        self.nan_steps = {int(s) for s in steps.split(",") if s.strip()}
        if on_rank and int(on_rank) != rank:
            self.nan_steps = set()
        self.windows: dict[tuple[int, int, int], float] = {}
        for item in filter(None, os.environ.get(SPIKE_WINDOW, "").split(",")):
            where, _, factor = item.partition("*")
            self.windows[_window(where, plan)] = float(factor or 100)
        self.plan = plan
        self.factor = 1.0
        spec = os.environ.get(SIGTERM, "")
        self.sigterm_step = (
            0 if spec.startswith(AWAITED) or spec in (COMPLETE, RELEASED) else _step_named(spec, rank)
        )
        if self.nan_steps or self.windows:
            model.register_forward_hook(self._hook)

    def arm(self, step: int) -> None:
        """Before global step `step` (from 1) trains: the factor its loss gets (1: none)."""
        if step == self.sigterm_step:
            os.kill(os.getpid(), signal.SIGTERM)
        self.factor = float("nan") if step in self.nan_steps else 1.0
        if self.windows:
            for window in zip(*(a.tolist() for a in self.plan.step_windows(step - 1))):
                self.factor *= self.windows.get(window, 1.0)

    def _hook(self, module: nn.Module, args, output):
        return output * self.factor if self.factor != 1.0 and module.training else output


def _window(spec: str, plan) -> tuple[int, int, int]:
    """(source index, epoch, first stream token) of "SOURCE:EPOCH:TOKEN" or "step:N" (check_faults
    checked the form; a step outside the plan, or a source not its, named as given)."""
    said = f"{SPIKE_WINDOW}={os.environ.get(SPIKE_WINDOW)}"
    if spec.startswith("step:"):
        step = int(spec[5:])
        if plan.total_steps is not None and not 1 <= step <= plan.total_steps:
            raise GristmillError(f"{said}: step {step} is outside the plan's {plan.total_steps} steps")
        labels, epoch, first = plan.step_windows(step - 1)
        return int(labels[0]), int(epoch[0]), int(first[0])
    name, epoch, token = spec.split(":")
    names = [s.name for s in plan.sources]
    if name not in names:
        raise GristmillError(f"{said}: the plan has no source {name!r} (its sources: {', '.join(names)})")
    return names.index(name), int(epoch), int(token)
