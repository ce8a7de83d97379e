"""Rewinding past a loss spike: back to a checkpoint before it, skip the data after that checkpoint,
go on — every token still accounted for (docs/divergence.md).

With `run.on_spike = "rewind"` (or `run.on_nonfinite = "rewind"`) the host reads every step's loss
(all-reduced, so every rank holds the same value and takes the same decision without another
collective) and the spike rule (training.run.verdict.SpikeDetector) looks at each one. At a spike
at step S, rank 0 picks the newest complete checkpoint that verifies at or before S −
margin_steps and not before the previous rewind's skip (restoring an older one would undo that
rewind's history); every rank loads it (model, optimizer, schedule, RNG, loader, the detector's
window), the checkpoints after it are set aside (`abandoned-step-N`), the next `skip_steps` steps
are recorded in the data plan as skipped (training/data/plan.Skip: the run's history, in the
checkpoints and RUN/data_plan.json) and a checkpoint is saved at the skip's last step, so a kill
at any point resumes to the same timeline. Skipped steps keep their numbers: the step counter,
the LR schedule and the phases advance over them, and training goes on with the windows of the
step after the skip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.io import CheckpointError
from training.checkpoint.state import TrainState
from training.config import RunSection
from training.contract.errors import NonFiniteError
from training.contract.run_layout import EVAL_DIR, abandoned_name, list_steps, step_name
from training.data.plan import Plan, Skip
from training.data.recipe import record_plan
from training.optim import ScheduledLR
from training.run.faults import kill_point
from training.run.verdict import NonFiniteGuard, SpikeDetector


class RewindLimitError(NonFiniteError):
    """A spike after run.rewind.max_rewinds rewinds: the run stops (exit 3)."""


class Rewinder:
    """When a step's loss calls for a rewind (`cause`), and the rewind itself (`rewind`)."""

    def __init__(
        self,
        run: RunSection,
        *,
        plan: Plan,
        loader: Any,
        scheduler: ScheduledLR,
        state: TrainState,
        checkpointer: Checkpointer,
        guard: NonFiniteGuard,
        spikes: SpikeDetector,
        run_dir: Path,
        writer: Any,
        stop: Callable[..., NoReturn],
        say: Callable[[str], None],
    ):
        """`writer`: rank 0's MetricsWriter (None elsewhere); `stop(message, error)`: ends the run
        (training.run.verdict.DivergencePolicy.stop); `say`: prints on rank 0."""
        self.on_spike, self.on_nonfinite, self.cfg = run.on_spike, run.on_nonfinite, run.rewind
        self.plan, self.loader, self.scheduler, self.state = plan, loader, scheduler, state
        self.checkpointer, self.guard, self.spikes = checkpointer, guard, spikes
        self.run_dir, self.writer, self.stop, self.say = run_dir, writer, stop, say
        self.every_step = "rewind" in (self.on_spike, self.on_nonfinite)  # the host reads each step's loss
        # Spikes are judged here, on every step's loss, only when they rewind; a report judges the
        # logged losses where they are logged (train._log).
        self.judges_spikes = self.on_spike == "rewind"
        if self.every_step:
            checkpointer.rewind_keep = self._keep()

    @property
    def _oldest(self) -> int:
        """The oldest step a rewind may go back to: the end of the last skip (before it would undo it)."""
        return self.plan.skips[-1].last_step if self.plan.skips else 0

    def _keep(self) -> tuple[int, int]:
        """Retention keeps what a later rewind may go back to: (oldest, margin_steps)."""
        return self._oldest, self.cfg.margin_steps

    def cause(self, step: int, loss: float, nonfinite: int) -> dict[str, Any] | None:
        """What makes step `step` rewind — {"text": its line, "spike": the spike rule's finding or
        None for a non-finite step} — or None (`loss`: the step's, all-reduced; `nonfinite`:
        training.run.verdict's code). A spike found while on_spike = "report" is not a cause (the metrics row
        reports it)."""
        if nonfinite and self.on_nonfinite == "rewind":
            return {"text": f"non-finite loss or gradient ({_fmt(loss)})", "spike": None}
        if not self.judges_spikes:
            return None
        spike = self.spikes.check(loss)
        if spike is None:
            return None
        text = (
            f"loss {loss:.4g} at step {step:,} (mean {spike['mean']:.4g} + {spike['sigma']:g}σ, "
            f"σ {spike['std']:.3g} over the previous {spike['window']} steps)"
        )
        return {"text": text, "spike": spike}

    def rewind(self, step: int, cause: dict[str, Any]) -> int | None:
        """Go back past the spike at `step` (every rank); returns the step training continues
        after, or None when there was no checkpoint to go back to and the run goes on (a spike)."""
        done = self.plan.skips
        n = len(done) + 1
        if n > self.cfg.max_rewinds:
            self.stop(
                f"{cause['text']}: a rewind would be the run's rewind {n}, past run.rewind.max_rewinds = "
                f"{self.cfg.max_rewinds} (so far: {'; '.join(_history(s) for s in done)}); the data or the "
                "settings need a look: gristmill data inspect RUN --step N shows what a step trained on",
                RewindLimitError,
            )
        kill_point("rewind-start")
        oldest = self._oldest
        newest = step - self.cfg.margin_steps
        found = self.checkpointer.rewind(oldest=oldest, newest=newest) if newest >= oldest else None
        if found is None:
            missing = (
                f"no complete checkpoint that verifies between step {oldest} and step {newest} "
                f"(step {step} − run.rewind.margin_steps {self.cfg.margin_steps}) to rewind to"
            )
            if cause["spike"] is None:  # a non-finite step cannot be trained past
                self.stop(f"step {step}: {cause['text']}; {missing}; stopping")
            self.say(f"WARNING step {step}: {cause['text']}; {missing}: not rewinding, the run goes on")
            return None
        back, passed = found
        if len(self.plan.skips) != n - 1:  # the checkpoint's own history: the same by the choice above
            raise CheckpointError(
                f"the checkpoint of step {back} records {len(self.plan.skips)} rewinds, not {n - 1}"
            )
        # The plan's end, not this invocation's (run.max_steps): a later resume trains no step an
        # uninterrupted run would have skipped.
        last = back + self.cfg.skip_steps
        if self.plan.total_steps is not None:
            last = min(last, self.plan.total_steps)
        skip = Skip(n, back + 1, last, step, back, cause["text"])
        self.plan.skips.append(skip)
        self.loader.seek(last)
        for _ in range(last - back):  # the LR of the skipped steps passes, as over a non-finite step
            self.scheduler.step()
        self.state.step = last
        self.guard.reset()
        self.checkpointer.rewind_keep = self._keep()
        if self.writer is not None:
            record_plan(self.plan, self.run_dir)
            self.writer.discard(after=back, rewind=n)
            set_aside_evals(self.run_dir, after=back)
        line = (
            f"rewind {n}/{self.cfg.max_rewinds}: {cause['text']}; back to step {back:,} (checkpoint "
            f"verified{'; passed over ' + ', '.join(passed) if passed else ''}), skipping "
            f"{_steps(skip)} of data ({skipped_tokens(self.plan, skip)})"
        )
        if last < step:
            line += f"; note: the skip ends before step {step}, so its data will be trained again"
        self.say(line)
        kill_point("rewind-restored")
        # The rewind made durable: a kill from here on resumes after the skip.
        self.checkpointer.save(last, self.state.tokens_seen, blocking=True)
        kill_point("rewind-saved")
        return last

    def summary(self) -> str | None:
        """The end-of-run line of the rewinds, or None when there were none."""
        if not self.plan.skips:
            return None
        return f"rewinds: {len(self.plan.skips)} — " + "; ".join(
            f"{_history(s)} ({skipped_tokens(self.plan, s)})" for s in self.plan.skips
        )


def set_aside_evals(run_dir: Path, after: int) -> None:
    """RUN/eval/step-N of the discarded attempt (N > `after`) renamed abandoned-step-N: eval.parquet
    and eval.png, rebuilt from the step-N results at the next eval, then hold the final timeline's."""
    root = run_dir / EVAL_DIR
    for step in list_steps(root):
        if step > after:
            path = root / step_name(step)
            path.rename(abandoned_name(path))


def skipped_tokens(plan: Plan, skip: Skip) -> str:
    """'2.46M tokens: prose 1.84M, code 0.62M' — the tokens of the skip's windows per source."""
    per = {d["source"]: d["tokens"] for d in plan.skip_detail(skip)}
    shown = ", ".join(f"{name} {_si(v)}" for name, v in per.items())
    return f"{_si(sum(per.values()))} tokens" + (f": {shown}" if len(plan.sources) > 1 else "")


def _history(s: Skip) -> str:
    return f"rewind {s.rewind} at step {s.spike_step} → back to {s.checkpoint_step}, skipped {_steps(s)}"


def _steps(s: Skip) -> str:
    n = s.last_step - s.first_step + 1
    return f"step {s.first_step}" if n == 1 else f"{n} steps ({s.first_step}–{s.last_step})"


def _si(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _fmt(loss: float) -> str:
    return "loss NaN" if math.isnan(loss) else f"loss {loss}"
