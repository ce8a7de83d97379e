"""Weights averaged in the loop (`[merge]`, docs/merging.md): a window's mean or an EMA of the weights
after each trained step, kept in every checkpoint, read at each merge point.

Which steps count: the run's kept timeline. The loop calls `MergedWeights.trained` after each step it
goes on from (never a step a rewind discards, nor a stopped run's last), and a rewind calls `reached`
at its skip's last step after restoring its checkpoint, whose state holds the accumulator as it was:
so a discarded attempt contributes nothing and a skipped step adds nothing. A resume calls `resume`
before its first step: its plan may merge elsewhere than the checkpoint's (a phase appended).

Merge points (`MergePoints`, in training/config.py beside [merge]'s section): every `merge.every`
steps and the plan's last step (not a run.max_steps chunk's: the merged weights would depend on where
the run was cut). They are where the merged
weights are read: scored beside the raw weights when validation or an eval is due
(training/train.py), kept in that step's checkpoint for `gristmill export RUN --step N --merged`
(training/checkpoint/hf_export.py).

- window = W: the merged weights at merge point N are the mean of the weights after each trained
  step k with max(N − W, P) < k ≤ N, P the merge point before N. On the every-grid P ≤ N − W
  (W ≤ every), so this is the last W steps; a last step within W steps after a merge point averages
  the steps since that merge point (a trained step is in one window at most, so one accumulator is
  enough). The accumulator holds the window's partial sum and its count; at N it is divided in
  place, and the next window's first step starts it over by a copy. A merge point whose whole
  window a rewind skipped has no merged weights, nor one inside a skip that ends after it: no
  checkpoint of it exists to keep them (the rewind's line says so).
- decay = d: the EMA is the weights after the run's first trained step, then d·ema + (1 − d)·w
  after each later one (one foreach lerp: a pass over the shard). It is read at each merge point; one
  inside a skip that ends after it has none (the rewind's line says so).

Cost: one fp32 copy of the parameters, a DTensor per parameter sharded like it (each rank holds its
shard, as the optimizer state; DCP reshards it to any world size); a foreach add per step inside a
window, or a lerp per step for the EMA. Accumulated from the master weights: the parameters the
optimizer updates (fp32: FSDP2 computes in param_dtype from them, one process autocasts), and for
float8 (torchao wraps each weight for its float8 all-gather) the high-precision tensor inside.

The state (`state_dict`): the accumulator and a JSON record — the settings (a resume that changes
them is refused: the merge's past is fixed), the count, the first and last step averaged, the merge
point the window is for, the last merge point the timeline reached, and `merged`: the merge point
whose merged weights the accumulator holds now (0: none), which is what an export reads.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from training.config import MergePoints, MergeSection  # MergePoints: re-exported
from training.console import say
from training.contract.config_loader import ConfigError

META = "meta"  # the JSON record's key in the state (checkpoint key "merge.meta")
ACC = "acc"  # the accumulator's (checkpoint keys "merge.acc.<parameter>")
SETTINGS = ("kind", "every", "window", "decay")  # what a resume may not change


def master_tensor(p: torch.Tensor) -> torch.Tensor:
    """This rank's high-precision tensor of a parameter: a DTensor's shard, and inside torchao's
    float8 FSDP weight wrapper (WeightWithDynamicFloat8CastTensor) the tensor it casts from."""
    t = p._local_tensor if isinstance(p, DTensor) else p
    inner = getattr(t, "_tensor", None)  # torchao's wrapper subclass keeps the weight there
    return inner if isinstance(inner, torch.Tensor) and type(t) is not torch.Tensor else t


def resume_refusal(settings: MergeSection | None, meta: dict[str, Any] | None = None) -> ConfigError | None:
    """Why a run's [merge] (`settings`, None without one) cannot resume a checkpoint whose merge state
    records `meta` (None: it holds none), or None: [merge] added to a run trained without it (its
    windows and EMA would miss the steps before), or a setting changed (a merge's past is fixed). The
    trainer's load and `train --plan --resume` ask it (the plan said nothing of it: trial RV77b 1)."""
    if settings is None:
        return None
    if meta is None:
        return ConfigError(
            f"merge.kind = '{settings.kind}': [merge] was added on resume, and the checkpoint holds no "
            "merged weights (it was saved by a run without [merge], so its windows and EMA would miss "
            "the steps before it); remove [merge] from the recipe to resume this run, or start a new "
            "run directory with it",
            "merge.kind",
        )
    for key in SETTINGS:
        now, was = getattr(settings, key), meta.get(key)
        if now != was:
            return ConfigError(
                f"merge.{key} = {json.dumps(now)} differs from the {json.dumps(was)} the run merged "
                f"with: a merge's past is fixed; resume with --set merge.{key}={json.dumps(was)}, or "
                "start a new run directory",
                f"merge.{key}",
            )
    return None


class MergedWeights:
    """The merge's accumulator and its record (Stateful: in every checkpoint as "merge"). Built by
    the trainer with its settings and merge points; built with neither to read a checkpoint's
    merged weights (`apply`)."""

    def __init__(
        self, model: nn.Module, settings: MergeSection | None = None, points: MergePoints | None = None
    ):
        self.settings, self.points = settings, points
        # The Parameter objects stay for the run; their shards' storage may not (FSDP2's lazy init
        # re-points them), so the master tensors are looked up at each use.
        self.params = list(model.named_parameters())
        self.acc: dict[str, torch.Tensor] = {name: _zeros_like(p) for name, p in self.params}
        self.kind = settings.kind if settings is not None else ""
        self.count = 0  # steps averaged (window) or folded in (EMA)
        self.first = self.last = 0  # the first and last of them
        self.point = 0  # window: the merge point the accumulator is for
        self.mean = False  # window: the accumulator holds the mean (its merge point was reached)
        self.closed = 0  # window: the last merge point the timeline reached
        self.merged = 0  # the merge point whose merged weights the accumulator holds now (0: none)
        self.recorded: dict[str, Any] = {}  # a checkpoint's settings, once one is loaded
        self._resumed = False  # loaded from a checkpoint, and no step trained or skipped since
        self._trained = 0  # the last step trained (not a rewind's skip): the checkpoint's after a load

    # -- the loop's --
    def trained(self, step: int) -> None:
        """The weights after trained step `step` of the kept timeline, folded in."""
        self._trained = step
        weights, acc = self._weights(), list(self._acc_local())
        with torch.no_grad():
            if self.kind == "ema":
                if self.count == 0:
                    torch._foreach_copy_(acc, weights)
                    self.first = step
                else:  # ema + (1 − d)(w − ema) = d·ema + (1 − d)·w, in one pass
                    torch._foreach_lerp_(acc, weights, 1.0 - self.settings.decay)
                self.count += 1
                self.last = step
            else:
                point = self.points.next_from(step)
                if step > self._start(point):
                    if self.point == point and not self.mean and self.count:
                        torch._foreach_add_(acc, weights)
                        self.count += 1
                    else:
                        torch._foreach_copy_(acc, weights)
                        self.point, self.count, self.first, self.mean = point, 1, step, False
                    self.last = step
        self.reached(step)

    def resume(self, step: int, skipped: Callable[[int], bool] = lambda k: False) -> None:
        """Before the first step after a resume from checkpoint `step` (once the row a kill cut off,
        which may read that checkpoint's merged weights, is written): the window of this plan's next
        merge point takes what the checkpoint holds of it. The plan may merge elsewhere than the
        checkpoint's (a phase added, one shortened): a partial window whose steps are all in the new
        one is kept; else the window's steps trained before the resume start with the checkpoint's
        last trained one, whose weights the model holds now (exact: as the run trained at once); the
        steps before those that the checkpoint holds no sum of are said. Under the checkpoint's own
        plan nothing changes. `skipped(k)`: whether a rewind skipped step k (never trained: nothing
        to say of it, review RV26f A2)."""
        if not self._resumed or self.kind != "window":
            return
        point = self.points.next_from(step + 1)
        before = self._start(self.point)  # the checkpoint's window began after this step
        # the last merge point of this plan reached (the old plan's last step may be none of its)
        self.closed = self.points.last_upto(step)
        start = self._start(point)
        if self.count and not self.mean and before >= start:
            self.point, held = point, before
        elif self._trained > start:
            with torch.no_grad():
                torch._foreach_copy_(list(self._acc_local()), self._weights())
            self.point, self.count, self.first, self.last = point, 1, self._trained, self._trained
            self.mean, self.merged, held = False, 0, self._trained - 1
        else:
            held = start
            if not self.mean:
                self.count = 0  # a partial window of steps this plan's windows leave out
        missing = [k for k in range(start + 1, held + 1) if not skipped(k)]
        if missing:
            say(
                f"note: [merge] step {point}'s window is steps {start + 1}–{point}, but the checkpoint of "
                f"step {step}, saved under a plan that merged elsewhere, holds no sum of steps "
                f"{missing[0]}–{missing[-1]}: its merged weights average the steps from {held + 1} on "
                "(merged/steps says how many)"
            )

    def reached(self, step: int, skipped_after: int | None = None) -> str | None:
        """The timeline is at `step`: trained, or the last step of a rewind's skip of the steps after
        `skipped_after` (its checkpoint's). A window whose merge point is at or before it is closed
        (its mean taken). Returns a note naming the merge points inside the skip that trained steps
        were averaged for: no checkpoint of them holds their merged weights, so they have none."""
        self._resumed = False
        lost: list[int] = []  # merge points passed without a checkpoint (only a skip does: RV51a 1)
        if self.kind == "ema":
            if self.count and skipped_after is not None:  # every one was the EMA's (trial RV68b F3)
                lost = [p for p in range(skipped_after + 1, step) if p in self.points]
            self.merged = step if self.count and step in self.points else 0
            held = f"the EMA of steps {self.first}–{self.last} has"
        else:
            if self.count and not self.mean and self.point <= step:
                with torch.no_grad():
                    torch._foreach_div_(list(self._acc_local()), float(self.count))
                self.mean = True
                lost = [self.point] if self.point < step else []
            held = f"its window's {self.count} trained step(s), {self.first}–{self.last}, have"
            self.closed = max(self.closed, self.points.last_upto(step))
            self.merged = self.point if self.mean and self.point == step else 0
        if not lost:
            return None
        one = len(lost) == 1
        points = f"merge point {lost[0]} lies" if one else f"merge points {', '.join(map(str, lost))} lie"
        return (
            f"[merge] {points} inside the skip, so {'it has' if one else 'they have'} no merged weights "
            f"({held} no checkpoint of {f'step {lost[0]}' if one else 'them'} to be kept in)"
        )

    def merged_at(self, step: int) -> bool:
        """Whether the accumulator holds the merged weights of merge point `step` now."""
        return step > 0 and self.merged == step

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The merged weights in the model's parameters (the raw ones in the accumulator) while the
        block runs, then back, exactly: copies through one tensor-sized temporary at a time. On
        every rank (each its shard), between steps; the caller makes sure no async checkpoint copy
        still reads them (training.checkpoint.checkpointer.Checkpointer.staged)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def row(self) -> dict[str, Any]:
        """A merge point's metrics entries: the steps averaged (window) or folded in (EMA)."""
        return {"merged/steps": self.count}

    def describe(self) -> str:
        """`mean of steps 41–50 (10 trained)` / `EMA (decay 0.99) of steps 1–50`."""
        if self.kind == "ema":
            decay = self.settings.decay if self.settings is not None else self.recorded["decay"]
            return f"EMA (decay {decay:g}) of steps {self.first}–{self.last}"
        return f"mean of steps {self.first}–{self.last} ({self.count} trained)"

    def header(self) -> str:
        """The run header's line of [merge]."""
        s = self.settings
        what = f"mean of the last {s.window} steps" if s.kind == "window" else f"EMA, decay {s.decay:g}"
        local = sum(a.numel() * a.element_size() for a in self._acc_local())
        return (
            f"{what}, read {self.points.describe()}; one fp32 copy of the weights "
            f"({local / 2**20:,.1f} MiB on this rank)"
        )

    # -- a checkpoint's merged weights, read back (the export) --
    def apply(self, model: nn.Module) -> None:
        """Copy the merged weights into `model` (the one this reader was built on)."""
        with torch.no_grad():
            for (_, p), a in zip(self.params, self._acc_local()):
                master_tensor(p).copy_(a)

    def record(self) -> dict[str, Any]:
        """What an export records of the merged weights: the settings, the steps and their span."""
        unused = "decay" if self.kind == "window" else "window"
        settings = {k: v for k, v in self.recorded.items() if k != unused}
        return {**settings, "steps": self.count, "first": self.first, "last": self.last}

    # -- Stateful --
    def expect(self, keys: set[str] | None) -> None:
        """Before a load: the checkpoint's keys ("merge.…"); a trainer's merge refuses a checkpoint of a
        run trained without one. None: after the load."""
        if keys is not None and f"merge.{META}" not in keys and (refusal := resume_refusal(self.settings)):
            raise refusal

    def state_dict(self) -> dict[str, Any]:
        meta = {
            **{key: getattr(self.settings, key) for key in SETTINGS if self.settings is not None},
            "count": self.count, "first": self.first, "last": self.last, "point": self.point,
            "mean": self.mean, "closed": self.closed, "merged": self.merged,
            "trained": self._trained,
        }  # fmt: skip
        return {ACC: self.acc, META: json.dumps(meta)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        meta = json.loads(state[META])
        self._resumed, self._trained = True, meta.get("trained", 0)
        self.recorded = {key: meta[key] for key in SETTINGS if key in meta}
        if self.settings is None:  # a reader takes the checkpoint's kind
            self.kind = meta.get("kind", "")
        elif (refusal := resume_refusal(self.settings, meta)) is not None:
            raise refusal
        self.count, self.first, self.last = meta["count"], meta["first"], meta["last"]
        self.point, self.mean, self.closed, self.merged = (
            meta["point"],
            meta["mean"],
            meta["closed"],
            meta["merged"],
        )

    # -- inside --
    def _start(self, point: int) -> int:
        """A window's first step is after this one."""
        return max(point - self.settings.window, self.closed)

    def _weights(self) -> list[torch.Tensor]:
        out = [master_tensor(p) for _, p in self.params]
        return [w if w.dtype == torch.float32 else w.float() for w in out]

    def _acc_local(self) -> Iterator[torch.Tensor]:
        return (a._local_tensor if isinstance(a, DTensor) else a for a in self.acc.values())

    def _swap(self) -> None:
        with torch.no_grad():
            for (_, p), a in zip(self.params, self._acc_local()):
                w = master_tensor(p)
                held = w.clone()
                w.copy_(a)
                a.copy_(held)


def _zeros_like(p: torch.Tensor) -> torch.Tensor:
    """An fp32 accumulator for parameter `p`: a DTensor with its spec (each rank its shard) or a tensor."""
    local = torch.zeros(master_tensor(p).shape, dtype=torch.float32, device=master_tensor(p).device)
    return DTensor(local, p._spec, requires_grad=False) if isinstance(p, DTensor) else local
