"""Everything a checkpoint must capture, as `Stateful` objects grouped in one dict.

`checkpointables(...)` returns {"model", "optimizer", "lr_scheduler", "dataloader", "train_state"};
each value has state_dict()/load_state_dict(), so a DCP checkpointer can be handed the dict as is
(`dcp.save(states, ...)` / `dcp.load(states, ...)`). Model and optimizer go through
torch.distributed.checkpoint.state_dict, which yields sharded (DTensor) state under FSDP2 and plain
tensors in a single process, with fully qualified parameter names in both cases.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


class TrainState:
    """Step counter, tokens seen, and this process's RNG streams."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens_seen = 0

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "rng_cpu": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["rng_cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        torch.set_rng_state(state["rng_cpu"])
        if "rng_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["rng_cuda"])


class ModelState:
    """The model's (possibly sharded) parameters and buffers, keyed by FQN."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state)


class OptimizerState:
    """The optimizer's moments and step counts, keyed by parameter FQN (not by position)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state)


def checkpointables(model, optimizer, scheduler, loader, train_state: TrainState) -> dict[str, Any]:
    """The one dict the checkpoint code saves and restores."""
    return {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,
        "dataloader": loader,
        "train_state": train_state,
    }
