"""The run's timeline — which steps it kept and which a rewind discarded or skipped — and the
artifacts that answer to it (docs/divergence.md, "The timeline").

A run's history is its step counter (training/checkpoint/state.TrainState) and its rewinds: each
`Skip` (training/data/plan.py) says which steps a rewind skipped, back to which checkpoint, after
which spike. `Timeline` holds them, is checkpointed (a `Stateful` under "timeline") and has one
writer, the rewinder; the data plan stays a pure function of the config, and every view that
depends on the history takes the timeline's skips (`Plan.consumed(step, skips)`,
`Plan.describe(skips)`).

`RunRecord` keeps the run directory in agreement with the timeline at the moments the timeline
changes — the start or resume, a rewind, the end (or a stop) — so that no artifact lists a
discarded step as the run's:

- metrics.jsonl: the rows of a discarded attempt are marked `discarded_by_rewind: N` (kept, as
  history), and the summary reads kept rows only;
- consumption.parquet: rewritten at every logged row, at each rewind and at the end;
- RUN/data_plan.json and plan.png: rewritten with the skips at the start and at each rewind;
- checkpoints/, exports/ and eval/: a step-N directory newer than the step the timeline went back
  to is set aside as abandoned-step-N (training/contract/run_layout.set_aside_after), so `export`,
  `eval` and `verify` of that step say why it is gone; eval.parquet loses those steps' rows and
  eval.png is drawn again at the next eval;
- loss.png: drawn at the end (and at a stop), discarded rows dashed, skipped steps shaded.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from training.console import say
from training.contract.atomic_write import atomic_path
from training.contract.run_layout import (
    CONSUMPTION_PARQUET,
    EVAL_DIR,
    EVAL_PARQUET,
    EVAL_PLOT,
    EXPORTS_DIR,
    PLAN_PNG,
    set_aside_after,
)
from training.data.plan import Plan, Skip
from training.data.recipe import plot_plan, record_plan, write_consumption


class Timeline:
    """The rewinds' skips so far, oldest first; the attempt a step belongs to. `Stateful`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.skips: tuple[Skip, ...] = ()

    @property
    def attempt(self) -> int:
        """1 before the first rewind, n + 1 after rewind n (rewind n discards attempt n)."""
        return len(self.skips) + 1

    @property
    def oldest_target(self) -> int:
        """The oldest step a rewind may go back to: the end of the last skip (an older checkpoint
        would undo that rewind's history)."""
        return self.skips[-1].last_step if self.skips else 0

    def consumed(self, step: int) -> list[dict[str, Any]]:
        return self.plan.consumed(step, self.skips)

    def rewound(self, skip: Skip) -> None:
        """The one change a timeline takes: a rewind's skip (training/run/rewind.py)."""
        if skip.rewind != self.attempt:
            raise ValueError(f"rewind {skip.rewind} recorded as the timeline's rewind {self.attempt}")
        self.skips = (*self.skips, skip)

    def adopt(self, skips: tuple[Skip, ...]) -> None:
        """A checkpoint written before the timeline was saved on its own kept the skips in the
        loader's plan (training/checkpoint/checkpointer._load hands them over)."""
        self.skips = tuple(skips)

    def state_dict(self) -> dict[str, Any]:
        # One JSON string: DCP keeps a string whole, and the list may be empty.
        return {"skips": json.dumps([asdict(s) for s in self.skips])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skips = tuple(Skip(**s) for s in json.loads(state["skips"]))


class RunRecord:
    """Rank 0's artifacts of the run, brought into agreement with the timeline when it changes (see
    the module). Other ranks hold one that writes nothing."""

    def __init__(self, run_dir: Path, timeline: Timeline, *, writes: bool, plot: bool):
        """`writes`: rank 0; `plot`: metrics.plot (plan.png, loss.png)."""
        self.run_dir, self.timeline, self.writes, self.plot = Path(run_dir), timeline, writes, plot

    def started(self, resumed: int | None) -> None:
        """The run starts or resumes (at checkpoint `resumed`): what a discarded or redone future left
        (steps after `resumed`) set aside; the plan recorded and drawn with the timeline's skips."""
        if not self.writes:
            return
        if resumed is not None:
            self._set_aside(after=resumed)
        self._record_plan()

    def rewound(self, skip: Skip) -> None:
        """After a rewind (the timeline holds `skip`): the attempt's steps after the checkpoint gone
        back to are no longer the run's."""
        if not self.writes:
            return
        self._set_aside(after=skip.checkpoint_step)
        self._record_plan()
        self.consumption(skip.last_step)

    def consumption(self, step: int) -> None:
        """RUN/consumption.parquet after `step` steps of the timeline."""
        if self.writes:
            plan = self.timeline.plan
            consumed = self.timeline.consumed(step)
            write_consumption(plan, step, consumed, self.run_dir / CONSUMPTION_PARQUET)

    def _record_plan(self) -> None:
        record_plan(self.timeline.plan, self.run_dir, self.timeline.skips)
        if self.plot:
            note = plot_plan(self.timeline.plan, self.run_dir / PLAN_PNG, self.timeline.skips)
            if note:
                say(note)

    def _set_aside(self, after: int) -> None:
        """exports/ and eval/ of steps after `after` set aside (checkpoints: the checkpointer's own),
        eval.parquet without their rows, eval.png removed until the next eval draws it."""
        moved = set_aside_after(self.run_dir / EXPORTS_DIR, after)
        evals = set_aside_after(self.run_dir / EVAL_DIR, after)
        for old, new in moved + evals:
            say(f"note: {old.parent.name}/{old.name} is from a discarded timeline; moved it to {new.name}")
        if evals:
            _drop_eval_rows(self.run_dir, after)


def _drop_eval_rows(run_dir: Path, after: int) -> None:
    """RUN/eval.parquet without the rows of steps after `after` (what validation's write_parquet would
    rebuild from the step-N directories left); eval.png is drawn again by the next eval."""
    path = run_dir / EVAL_PARQUET
    if path.is_file():
        table = pq.read_table(path)
        with atomic_path(path) as tmp:
            pq.write_table(table.filter(pc.less_equal(table["step"], after)), tmp)
    (run_dir / EVAL_PLOT).unlink(missing_ok=True)
