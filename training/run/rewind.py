"""Rewinding past a loss spike: back to a checkpoint before it, skip the data after that checkpoint,
go on — every token still accounted for (docs/divergence.md).

With `run.on_spike = "rewind"` (or `run.on_nonfinite = "rewind"`) the step's Judge
(training/run/verdict.py) reads every step. At a spike at step S it asks `Rewinder.target`: rank 0
picks the newest complete checkpoint that verifies at or before S − margin_steps and not before the
previous rewind's skip (restoring an older one would undo that rewind's history), and every rank
gets its choice. The loop then writes the spike's metrics row and calls `rewind`, which owns the
whole rewind, on every rank: that checkpoint loaded (model, optimizer, schedule, RNG, loader, the
spike rule's window) and the checkpoints after it set aside (`abandoned-step-N`), the next
`skip_steps` steps made a `Skip` of the run's timeline (training/run/timeline.py: checkpointed, and
in RUN/data_plan.json), the run directory brought into line with it (training/run/record.py: the
attempt's rows marked discarded, its exports and evals set aside), the final weights' row held when
the skip reaches the run's last step, and a checkpoint saved at the skip's last step, so a kill at
any point resumes to the same timeline. Skipped steps keep their numbers: the step counter, the LR
schedule and the phases advance over them, and training goes on with the windows of the step
after the skip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.record import CheckpointError
from training.checkpoint.state import TrainState
from training.config import RewindSection
from training.console import say
from training.contract.errors import NonFiniteError
from training.data.plan import Plan, Skip, trained_step
from training.merge import MergedWeights
from training.metrics import no_step_row
from training.optim import ScheduledLR
from training.run.faults import kill_point
from training.run.record import RunRecord
from training.run.timeline import Timeline


class RewindLimitError(NonFiniteError):
    """A spike after run.rewind.max_rewinds rewinds: the run stops (exit 3)."""


@dataclass(frozen=True)
class RewindTarget:
    """Where a rewind goes back to and what it skips (the Skip it records), and the newer
    checkpoints passed over on the way (each with why)."""

    skip: Skip
    passed: tuple[str, ...] = ()


class Rewinder:
    """Where a rewind goes back to (`target`, asked by the step's Judge) and the rewind itself."""

    def __init__(
        self,
        settings: RewindSection,
        *,
        timeline: Timeline,
        checkpointer: Checkpointer,
        loader: Any,
        scheduler: ScheduledLR,
        state: TrainState,
        record: RunRecord,
        merge: MergedWeights | None,
        validates: bool,
        evaluates: bool,
    ):
        """`settings`: [run.rewind]; the timeline records each rewind's skip (its one writer);
        `validates`, `evaluates`: the run has validation, an eval (the final weights get them when a
        skip reaches the plan's last step); `merge`: [merge]'s
        accumulator (the checkpoint restores it; the skip reaches the merge points it covers)."""
        self.cfg, self.timeline, self.checkpointer = settings, timeline, checkpointer
        self.loader, self.scheduler, self.state, self.record = loader, scheduler, state, record
        self.merge = merge
        self.validates, self.evaluates = validates, evaluates

    def target(self, step: int, cause: str) -> RewindTarget | str:
        """Where a rewind of step `step` goes back to (rank 0 chooses, every rank gets its choice; a
        save in flight finishes first), or why there is nowhere to go. `cause`: the rewind's reason."""
        oldest = self.timeline.oldest_target
        newest = step - self.cfg.margin_steps
        margin = f"step {step} − run.rewind.margin_steps {self.cfg.margin_steps}"
        if newest < oldest:  # no range to look in: say why, not "between 12 and 11"
            if not self.timeline.skips:
                return f"no checkpoint to rewind to: {margin} is step {newest}, before the run's first step"
            return (
                f"no checkpoint to rewind to: {margin} is step {newest}, before step {oldest}, where "
                f"rewind {len(self.timeline.skips)}'s skip ended (a rewind never goes back past an earlier "
                "one's skip)"
            )
        found = self.checkpointer.rewind_target(oldest=oldest, newest=newest)
        if found is None:
            return (
                f"no complete checkpoint that verifies between step {oldest} and step {newest} ({margin}) "
                "to rewind to"
            )
        back, passed = found
        # The plan's end, not this invocation's (run.max_steps): a later resume of this plan trains no
        # step an uninterrupted run would have skipped (one whose plan adds steps after it may: the
        # resume says so, plan.check_resume; trial RV71d 1).
        last = back + self.cfg.skip_steps
        if self.timeline.plan.total_steps is not None:
            last = min(last, self.timeline.plan.total_steps)
        return RewindTarget(Skip(self.timeline.attempt, back + 1, last, step, back, cause), tuple(passed))

    def rewind(self, target: RewindTarget) -> None:
        """Go back (every rank): the checkpoint restored, the skip recorded in the timeline, the loader
        past it, the LR schedule and the step counter over it; the run directory brought into line
        with the timeline; the final weights' row held when the skip reaches the last step (a row
        without a trained step, pending in the skip's checkpoint until the loop writes it); then the
        skip's checkpoint saved, so a kill from here on resumes after it."""
        skip = target.skip
        kill_point("rewind-start")
        self.checkpointer.restore(skip.checkpoint_step)
        self.record.drop_pending()
        if len(self.timeline.skips) != skip.rewind - 1:  # the checkpoint's own history: the same by choice
            raise CheckpointError(
                f"the checkpoint of step {skip.checkpoint_step} records {len(self.timeline.skips)} rewinds, "
                f"not {skip.rewind - 1}"
            )
        self.timeline.rewound(skip)
        self.loader.seek(skip.last_step)
        for _ in range(skip.last_step - skip.checkpoint_step):  # their LR passes, as over a non-finite step
            self.scheduler.step()
        self.state.step = skip.last_step
        merge_note = None
        if self.merge is not None:  # restored as the checkpoint held it: the discarded attempt added nothing
            # a checkpoint saved under a plan that merged elsewhere (a resume moved its end): this plan's
            # windows, as after a resume (review RV26f A1)
            self.merge.resume(skip.checkpoint_step, lambda k: self.timeline.skipped(k - 1, k) > 0)
            merge_note = self.merge.reached(skip.last_step, skip.checkpoint_step)
        passed = "; passed over " + ", ".join(target.passed) if target.passed else ""
        line = (
            f"rewind {skip.rewind}/{self.cfg.max_rewinds}: {skip.reason}; back to step "
            f"{skip.checkpoint_step:,} (checkpoint verified{passed}), skipping {_steps(skip)} of data "
            f"({skipped_tokens(self.timeline.plan, skip)})"
        )
        if skip.last_step < skip.checkpoint_step + self.cfg.skip_steps:  # the plan's end cut it short
            line += f" (run.rewind.skip_steps = {self.cfg.skip_steps}, cut at the plan's last step)"
        if skip.last_step < skip.spike_step:
            line += f"; note: the skip ends before step {skip.spike_step}, so its data will be trained again"
        if merge_note is not None:
            line += f"; note: {merge_note}"
        say(line)
        kill_point("rewind-restored")
        self.record.rewound(skip)
        kill_point("rewind-recorded")
        # the plan's end, not this invocation's (run.max_steps inside the skip: a resume trains on,
        # and step N would keep an earlier step's scores as its own: review R15g F1)
        if skip.last_step >= self.timeline.plan.total_steps and (self.validates or self.evaluates):
            # the step whose weights they are: the checkpoint may be an earlier skip's, never trained
            weights = trained_step(self.timeline.skips, skip.checkpoint_step)
            note = (
                f"no step trained: steps {skip.first_step}–{skip.last_step} were skipped by rewind "
                f"{skip.rewind}; the final weights are step {weights}'s"
            )
            row = no_step_row(skip.last_step, note, self.state.tokens_seen, self.timeline.attempt)
            self.record.hold(row, validate=self.validates, evaluate=self.evaluates)
        self.checkpointer.save(skip.last_step, self.state.tokens_seen, blocking=True, on_timeline=True)
        kill_point("rewind-saved")

    def summary(self) -> str | None:
        """The end-of-run line of the rewinds, or None when there were none."""
        skips = self.timeline.skips
        if not skips:
            return None
        return f"rewinds: {len(skips)} — " + "; ".join(
            f"{history(s)} ({skipped_tokens(self.timeline.plan, s)})" for s in skips
        )


def skipped_tokens(plan: Plan, skip: Skip) -> str:
    """'2.46M tokens: prose 1.84M, code 0.62M' — the tokens of the skip's windows per source."""
    per = {d["source"]: d["tokens"] for d in plan.skip_detail(skip)}
    shown = ", ".join(f"{name} {_si(v)}" for name, v in per.items())
    return f"{_si(sum(per.values()))} tokens" + (f": {shown}" if len(plan.sources) > 1 else "")


def history(s: Skip) -> str:
    """`rewind 1 at step 37 → back to 30, skipped 12 steps (31–42)`."""
    return f"rewind {s.rewind} at step {s.spike_step} → back to {s.checkpoint_step}, skipped {_steps(s)}"


def _steps(s: Skip) -> str:
    n = s.last_step - s.first_step + 1
    return f"step {s.first_step}" if n == 1 else f"{n} steps ({s.first_step}–{s.last_step})"


def _si(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
