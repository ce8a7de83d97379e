"""What the trainer does when training diverges: a step whose loss or gradient norm is not finite
is never applied, the host hears of it when it next looks, and loss spikes are reported.

The decision is made on the device, so steps that do not log pay no host sync: the flag (loss or
gradient norm non-finite on any rank: one MAX all-reduce, identical everywhere) is handed to fused
AdamW as `found_inf`, which then leaves weights, moments and step counts untouched (torch's own
mechanism for AMP's skipped steps). Other optimizers (optim.fused = false, adamw8bit, muon) cannot take
the flag, so for them the host reads it before every step: one sync per step. Counts accumulate in
device tensors that the host reads at each logged step and before every save, so nothing
non-finite is ever saved. The LR schedule and the data position advance over a skipped step: its
batch is consumed, as if it had been trained on.

Then `run.on_nonfinite = "stop"` ends the run (NonFiniteError, exit 3) naming the step, the value
and the last complete checkpoint; `"skip"` logs `skipped_steps` and stops after
`run.max_skipped` consecutive ones; `"rewind"` goes back to a checkpoint (training/run/rewind.py). A
loss above mean + k·std of the previous losses is a spike: an event in metrics.jsonl and a warning,
and with `run.on_spike = "rewind"` a rewind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist

from training.checkpoint.io import CheckpointError
from training.contract.errors import NonFiniteError

if TYPE_CHECKING:
    from training.checkpoint.checkpointer import Checkpointer

_WHAT = {1: "loss", 2: "gradient norm", 3: "loss and gradient norm"}


def nonfinite_code(loss: torch.Tensor, grad_norm: torch.Tensor, world_size: int) -> torch.Tensor:
    """0 when this step may be applied; 1 loss, 2 gradient norm, 3 both non-finite (on some rank).
    Stays on the device; under several ranks every rank gets the same value."""
    code = (~torch.isfinite(loss)).long() + 2 * (~torch.isfinite(grad_norm.to(loss.device))).long()
    if world_size > 1:
        dist.all_reduce(code, op=dist.ReduceOp.MAX)  # async on NCCL: no host sync
    return code


def guarded_step(optimizer: torch.optim.Optimizer, code: torch.Tensor) -> None:
    """optimizer.step() unless `code` says the step is not finite."""
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and optimizer.defaults.get("fused"):
        # Fused Adam(W) skips the update (and undoes its step count) where found_inf is 1.
        optimizer.found_inf = (code > 0).to(torch.float32)
        optimizer.step()
    elif not code.item():
        optimizer.step()


class NonFiniteGuard:
    """Device-side tally of skipped steps since the host last looked (no sync until `read`)."""

    def __init__(self, device: torch.device):
        zero = lambda: torch.zeros((), dtype=torch.int64, device=device)  # noqa: E731
        self.skipped, self.consecutive, self.first_step, self.first_code = zero(), zero(), zero(), zero()
        self.longest = zero()  # the longest run of non-finite steps since the host last looked
        self.unlogged: dict[str, Any] = {}

    def record(self, step: int, code: torch.Tensor) -> None:
        bad = (code > 0).long()
        self.skipped += bad
        self.consecutive = (self.consecutive + bad) * bad
        self.longest = torch.maximum(self.longest, self.consecutive)
        first = (self.first_step == 0) & (bad > 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.first_code = torch.where(first, code, self.first_code)

    def read(self) -> dict[str, Any]:
        """One host sync: {"skipped": n since the last read, "consecutive": the longest run of
        consecutive non-finite steps since the last read (a run may have ended before it), "first_step":
        the first of them (0: none), "what": "loss" | "gradient norm" | …}."""
        skipped, consecutive, first, code = torch.stack(
            [self.skipped, self.longest, self.first_step, self.first_code]
        ).tolist()
        self.skipped.zero_()
        self.first_step.zero_()
        self.longest.copy_(self.consecutive)  # a run still going on counts on from here
        report = {
            "skipped": skipped,
            "consecutive": consecutive,
            "first_step": first,
            "what": _WHAT.get(code),
        }
        if skipped:
            self.unlogged = self.unlogged or {"skipped": 0, "first_step": first, "what": report["what"]}
            self.unlogged["skipped"] += skipped
        return report

    def reset(self) -> None:
        """Forget every tally (a rewind went back to a checkpoint from before them)."""
        for t in (self.skipped, self.consecutive, self.first_step, self.first_code, self.longest):
            t.zero_()
        self.unlogged = {}

    def take_unlogged(self) -> dict[str, Any]:
        """What `read` saw since the last call (skipped steps, the first one and why), for a metrics row."""
        out, self.unlogged = self.unlogged or {"skipped": 0}, {}
        return out


class DivergencePolicy:
    """When the skipped steps the host hears of (NonFiniteGuard.read's report) stop the run, and
    how: the checkpointer is closed (a save in flight holds finite weights from before), the loss
    curve drawn (`plot`), then NonFiniteError (exit 3) with what to do next."""

    def __init__(
        self,
        *,
        on_nonfinite: str,
        max_skipped: int,
        lr: float,
        config_path: Path,
        checkpointer: Checkpointer,
        plot: Callable[[], object],
        say: Callable[[str], None],
    ):
        """`on_nonfinite`, `max_skipped`: run.*; `lr`: optim.lr and `config_path`: RUN/config.toml,
        named in the advice; `say`: prints on rank 0."""
        self.on_nonfinite, self.max_skipped, self.lr = on_nonfinite, max_skipped, lr
        self.config_path, self.checkpointer, self.plot, self.say = config_path, checkpointer, plot, say

    def fatal(self, report: dict[str, Any]) -> bool:
        if self.on_nonfinite == "rewind":  # training/run/rewind.py acts at the step itself
            return False
        return report["skipped"] > 0 and (
            self.on_nonfinite == "stop" or report["consecutive"] >= self.max_skipped
        )

    def check(self, report: dict[str, Any], step: int) -> None:
        """Stop (NonFiniteError) if the skipped steps the host just heard of call for it."""
        if not self.fatal(report):
            return
        why = (
            f"step {report['first_step']}: the {report['what']} is not finite (NaN or inf)"
            if self.on_nonfinite == "stop"
            else f"{report['consecutive']} consecutive steps up to step {step} had a non-finite loss or "
            f"gradient (run.max_skipped = {self.max_skipped}; the last: {report['what']})"
        )
        self.stop(
            f"{why}; no update of a non-finite step was applied and nothing was saved after it. Last "
            f"complete checkpoint: {self.checkpointer.newest_complete()}. A resume keeps the learning rate "
            "of the steps already trained, so start a new run with a lower learning rate (gristmill train "
            f"--config {self.config_path} --set optim.lr={self.lr / 10:g} run.output_dir=NEW_DIR); or "
            "check the data and resume skipping such steps (gristmill train --config "
            f"{self.config_path} --resume auto --set run.on_nonfinite=skip)"
        )

    def stop(self, message: str, error: type[NonFiniteError] = NonFiniteError) -> NoReturn:
        """End the run (exit 3): a save still in flight ends first (it holds finite weights from
        before), the loss curve is drawn, then `error(message)`."""
        try:
            self.checkpointer.close()
        except CheckpointError as e:  # said, but the divergence stays the error (exit 3)
            self.say(f"error: {e}")
        self.plot()
        raise error(message)


class SpikeDetector:
    """A loss above mean + sigma·std of the previous `window` losses it was shown (at least half a
    window of them) is a spike; returns its description, or None. Non-finite losses are not its job.
    The window is `recent` (TrainState.recent_losses: checkpointed, so a resumed run decides the same)."""

    def __init__(self, window: int, sigma: float, recent: list[float] | None = None):
        self.sigma, self.window = sigma, max(window, 1)
        self.recent = recent if recent is not None else []

    def check(self, loss: float) -> dict[str, float] | None:
        if self.sigma <= 0 or not math.isfinite(loss):
            return None
        spike = None
        if len(self.recent) >= max(2, self.window // 2):
            mean = sum(self.recent) / len(self.recent)
            std = math.sqrt(sum((x - mean) ** 2 for x in self.recent) / len(self.recent))
            if loss > mean + self.sigma * std and std > 0:
                spike = {
                    "loss": loss,
                    "mean": mean,
                    "std": std,
                    "sigma": self.sigma,
                    "window": len(self.recent),
                }
        self.recent.append(loss)
        del self.recent[: -self.window]
        return spike
