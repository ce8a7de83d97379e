"""Faults a test injects into a real run through the environment. Never set in real runs.

GRISTMILL_FAULT_NAN_LOSS="STEP[,STEP…][@RANK]": the training loss of those steps (on that rank
only, or on every rank) is multiplied by NaN before backward, so the loss and every gradient are
NaN — what a diverged run produces, at a chosen step.
"""

from __future__ import annotations

import os

import torch.nn as nn

NAN_LOSS = "GRISTMILL_FAULT_NAN_LOSS"


class NanLoss:
    """Arms a forward hook on the model that turns its loss into NaN at the chosen steps."""

    def __init__(self, model: nn.Module, rank: int):
        spec = os.environ.get(NAN_LOSS, "")
        steps, _, on_rank = spec.partition("@")
        self.steps = {int(s) for s in steps.split(",") if s.strip()}
        if on_rank and int(on_rank) != rank:
            self.steps = set()
        self.armed = False
        if self.steps:
            model.register_forward_hook(self._hook)

    def arm(self, step: int) -> None:
        self.armed = step in self.steps

    def _hook(self, module: nn.Module, args, output):
        return output * float("nan") if self.armed and module.training else output
