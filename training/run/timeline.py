"""The run's timeline: which steps it kept and which a rewind discarded or skipped
(docs/divergence.md, "The timeline").

A run's history is its step counter (training/checkpoint/state.TrainState) and its rewinds: each
`Skip` (training/data/plan.py) says which steps a rewind skipped, back to which checkpoint, after
which spike. `Timeline` holds them, is checkpointed (a `Stateful` under "timeline") and has one
writer, the rewinder; the data plan stays a pure function of the config, and every view that
depends on the history takes the timeline's skips (`Plan.consumed(step, skips)`,
`Plan.describe(skips)`).

The artifacts of the run directory answer to it: training/run/record.RunRecord writes them.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from training.data.plan import Plan, Skip


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

    def skipped(self, after: int, through: int) -> int:
        """How many of steps `after`+1…`through` a rewind skipped (not trained)."""
        return sum(max(0, min(k.last_step, through) - max(k.first_step, after + 1) + 1) for k in self.skips)

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
