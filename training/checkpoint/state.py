"""Everything a checkpoint must capture, as `Stateful` objects grouped in one dict.

`checkpointables(...)` returns {"model", "optimizer", "lr_scheduler", "dataloader", "train_state",
"timeline"} and, with [merge], "merge" (training/merge.MergedWeights);
each value has state_dict()/load_state_dict(), so a DCP checkpointer can be handed the dict as is
(`dcp.save(states, ...)` / `dcp.load(states, ...)`). Model and optimizer go through
torch.distributed.checkpoint.state_dict, which yields sharded (DTensor) state under FSDP2 and plain
tensors in a single process, with fully qualified parameter names in both cases.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


@dataclass(frozen=True)
class PendingRow:
    """A step's metrics row waiting, in the state (and so in a checkpoint saved now), until it is
    written after the step's validation and eval (training/run/record.RunRecord holds and takes it)."""

    row: dict[str, Any]  # the row so far: training/metrics.step_row, or a row without a trained step
    validate: bool  # the held-out loss is due at this row
    evaluate: bool  # the lm-eval scores are due at this row


class TrainState:
    """Step counter, tokens seen, the spike detector's window of recent losses, the non-finite tally
    not yet in a row, the step's metrics row still to be written, and this process's RNG streams
    (Python, numpy, torch CPU and CUDA).

    The RNG streams differ per rank, so they are saved under a per-rank key (`rng_rank0`, ...):
    DCP keeps one copy of values that have the same key on every rank. Everything is a tensor, a
    plain number or a string, so loading needs no unpickling (see training.checkpoint.checkpointer).
    The losses are there because a rewind (training/run/rewind.py) acts on what the detector decides:
    a resume must decide the same; so is the non-finite tally (run.max_skipped counts a run of
    non-finite steps across a save, and the next row counts the skipped steps before it). `pending`
    is there because a step's checkpoint is saved before its validation, eval and metrics row (so
    that an eval that dies costs no training): a kill in between leaves a checkpoint whose step has
    no row, which a resume then finishes (training/train.py).
    Before loading, `expect(keys)` with the checkpoint's keys: an entry the checkpoint lacks is not
    asked for and keeps its value (a resume onto more ranks keeps the new ranks' own RNG streams; an
    older checkpoint has no losses and no pending row).
    """

    def __init__(self, rank: int = 0) -> None:
        self.step = 0
        self.tokens_seen = 0
        self.recent_losses: list[float] = []  # training/run/verdict.SpikeDetector's window
        # training/run/verdict.NonFiniteGuard's tally as of its last read: the skipped steps no row has
        # counted yet ("unlogged") and the run of non-finite steps going on ("consecutive")
        self.nonfinite: dict[str, Any] = {}
        self.pending: PendingRow | None = None  # the row of the step being saved, until it is written
        self.rank = rank
        self._saved_keys: set[str] | None = None  # None: every entry (a save)

    @property
    def rng_key(self) -> str:
        return f"rng_rank{self.rank}"

    def expect(self, keys: set[str] | None) -> None:
        """Load only the entries among `keys` (the checkpoint's, "train_state.…"); None: all of them."""
        self._saved_keys = keys

    def _has(self, entry: str) -> bool:
        key = f"train_state.{entry}"
        return self._saved_keys is None or any(k == key or k.startswith(key + ".") for k in self._saved_keys)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step, "tokens_seen": self.tokens_seen}
        if self._has("recent_losses"):
            # json keeps every float exactly (shortest round-trip repr); a list would change shape.
            state["recent_losses"] = json.dumps(self.recent_losses)
        if self._has("nonfinite"):
            state["nonfinite"] = json.dumps(self.nonfinite)
        if self._has("pending"):
            # {"row", "validate", "evaluate"} or null; NaN losses too (json's NaN)
            state["pending"] = json.dumps(None if self.pending is None else asdict(self.pending))
        if self._has(self.rng_key):
            state[self.rng_key] = rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        # A checkpoint from before the window was saved restores an empty one (what a resume starts with).
        self.recent_losses[:] = json.loads(state["recent_losses"]) if "recent_losses" in state else []
        # In place (the guard holds this dict); a checkpoint from before it was saved: nothing counted.
        nonfinite = json.loads(state["nonfinite"]) if "nonfinite" in state else {}
        self.nonfinite.clear()
        self.nonfinite.update(nonfinite)
        pending = json.loads(state["pending"]) if "pending" in state else None
        self.pending = None if pending is None else PendingRow(**pending)
        if self.rng_key in state:
            set_rng_state(state[self.rng_key])


def rng_state() -> dict[str, Any]:
    """Every RNG stream of this process as tensors and numbers."""
    version, key, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python_version": version,
        "python_key": torch.tensor(key, dtype=torch.int64),
        "python_gauss": float("nan") if gauss is None else gauss,
        "numpy_key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
        "numpy_pos": int(np_state["state"]["pos"]),
        "numpy_has_gauss": int(np_state["has_gauss"]),
        "numpy_gauss": float(np_state["gauss"]),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    gauss = float(state["python_gauss"])
    key = tuple(int(x) for x in state["python_key"].tolist())
    random.setstate((int(state["python_version"]), key, None if math.isnan(gauss) else gauss))
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": state["numpy_key"].numpy().astype(np.uint32), "pos": int(state["numpy_pos"])},
            "has_gauss": int(state["numpy_has_gauss"]),
            "gauss": float(state["numpy_gauss"]),
        }
    )
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda"])


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
        self._none_saved = False  # the checkpoint being loaded holds no optimizer state (expect)

    def expect(self, keys: set[str] | None) -> None:
        """Told the checkpoint's keys before a load (Checkpointer._load; None after it). One saved
        before any step was applied (every step so far skipped as non-finite, with an optimizer
        whose first step creates its state: Muon, unfused AdamW) holds none, and loads as an
        optimizer that has taken no step: DCP stopped on the missing moments, and such a checkpoint
        could be neither resumed nor rewound to."""
        self._none_saved = keys is not None and not any(k.startswith("optimizer.state.") for k in keys)

    def state_dict(self) -> dict[str, Any]:
        if self._none_saved:  # nothing to read (nor to create: torch's lr=0 step would make state)
            return {}
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._none_saved:
            self.optimizer.state.clear()  # as saved: no step taken (a rewind's later steps gone)
            return
        # The checkpoint brings the moments and step counts; the hyperparameters (betas, eps, weight
        # decay, and the lr the schedule set) stay this config's. Loading them too made a resume
        # with a changed optim.* train on the old values while RUN/config.toml named the new ones.
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        set_optimizer_state_dict(self.model, self.optimizer, state)
        for group, own in zip(self.optimizer.param_groups, hyper):
            group.update(own)


def checkpointables(
    model, optimizer, scheduler, loader, train_state: TrainState, timeline, merge=None
) -> dict[str, Any]:
    """The one dict the checkpoint code saves and restores (`timeline`: training/run/timeline.Timeline,
    the run's rewinds; `merge`: training/merge.MergedWeights, the merged weights' accumulator, or None)."""
    states = {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": scheduler,
        "dataloader": loader,
        "train_state": train_state,
        "timeline": timeline,
    }
    if merge is not None:
        states["merge"] = merge
    return states
