"""One verdict per step: what a step did, read once, and what the run does about it.

A step whose loss or gradient norm is not finite is never applied, and the host need not look at
every step to make sure of it: the flag (loss or gradient norm non-finite on any rank: one MAX
all-reduce, identical everywhere) is decided on the device and handed to fused AdamW as
`found_inf`, which then leaves weights, moments and step counts untouched (torch's own mechanism
for AMP's skipped steps). Other optimizers (optim.fused = false, adamw8bit, muon) cannot take the
flag, so for them `guarded_step` reads it before every step: one sync per step. The LR schedule
and the data position advance over a skipped step: its batch is consumed, as if trained on.

`Judge.judge` is the one reader of what a step did. On a step where anything else is due (a
metrics row, a checkpoint, validation, an eval, a stop signal, the last step), and on every step
while a rewind is on, it reads once: the loss (the mean over ranks: every rank holds the same
value and takes the same decision), the non-finite tally since it last looked (`NonFiniteGuard`,
counted on the device in between), the spike rule's finding (`SpikeDetector`: on logged losses
with run.on_spike = "report", on every step's with "rewind"); and from them one frozen `Verdict`:

- GO_ON: train on (a spike under "report" is an event of the step's row);
- SKIPPED: non-finite updates were left out and run.on_nonfinite = "skip" lets the run go on (they
  are counted in the next metrics row; run.max_skipped in a row stop it);
- STOP: run.on_nonfinite = "stop" (the default), max_skipped reached, a non-finite step with no
  checkpoint to rewind to, or a rewind past run.rewind.max_rewinds: exit 3, nothing saved at or
  after the bad step whatever else falls due on it (the loop acts on the verdict before any of it);
- REWIND: go back to the checkpoint the verdict names and skip data (training/run/rewind.py). A
  spike with no checkpoint to go back to is a GO_ON with a warning.

Nothing else reads or clears the guard. A step with nothing due and no rewind on is not read
(no host sync): its tally waits for the next read, which comes before any save (`settle`, for the
save before data that cannot be had). The tally read is kept in TrainState: a resumed run counts on.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from training.config import RunSection
from training.contract.errors import NonFiniteError
from training.data.plan import Plan, Skip
from training.run.rewind import Rewinder, RewindLimitError, RewindTarget, history

GO_ON, SKIPPED, STOP, REWIND = "go on", "skipped", "stop", "rewind"
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
    """Device-side tally of skipped steps since the host last looked (no sync until `read`); the
    Judge's alone. What the host knows after a read lives in `kept` (TrainState.nonfinite: saved with
    every checkpoint, so a resume counts the same skips and the same run of non-finite steps)."""

    def __init__(self, device: torch.device, kept: dict[str, Any] | None = None):
        zero = lambda: torch.zeros((), dtype=torch.int64, device=device)  # noqa: E731
        self.skipped, self.consecutive, self.first_step, self.first_code = zero(), zero(), zero(), zero()
        self.longest = zero()  # the longest run of non-finite steps since the host last looked
        self.longest_end = zero()  # the step where that run reached its length (0: not seen since the start)
        self.kept = {} if kept is None else kept
        self.restore()

    @property
    def unlogged(self) -> dict[str, Any]:
        """Skipped steps `read` saw that no metrics row has counted yet (take_unlogged)."""
        return self.kept.setdefault("unlogged", {})

    @unlogged.setter
    def unlogged(self, value: dict[str, Any]) -> None:
        self.kept["unlogged"] = value

    def restore(self) -> None:
        """The tally as `kept` holds it (a resumed or rewound-to checkpoint's): its unlogged skips, and
        its run of non-finite steps going on, which the next steps extend; nothing unread."""
        for t in (self.skipped, self.first_step, self.first_code, self.longest_end):
            t.zero_()
        going_on = int(self.kept.get("consecutive", 0))
        self.consecutive.fill_(going_on)
        self.longest.fill_(going_on)

    def record(self, step: int, code: torch.Tensor) -> None:
        bad = (code > 0).long()
        self.skipped += bad
        self.consecutive = (self.consecutive + bad) * bad
        grew = self.consecutive > self.longest
        self.longest = torch.where(grew, self.consecutive, self.longest)
        self.longest_end = torch.where(grew, step, self.longest_end)
        first = (self.first_step == 0) & (bad > 0)
        self.first_step = torch.where(first, step, self.first_step)
        self.first_code = torch.where(first, code, self.first_code)

    def read(self) -> dict[str, Any]:
        """One host sync: {"skipped": n since the last read, "consecutive": the longest run of
        consecutive non-finite steps since the last read (a run may have ended before it), "last_step":
        that run's last step (0: it began before this process's first step, a resume's), "first_step": the
        first non-finite step since the last read (0: none), "what": its "loss" | "gradient norm" | …}."""
        skipped, consecutive, last, first, code, going_on = torch.stack(
            [self.skipped, self.longest, self.longest_end, self.first_step, self.first_code, self.consecutive]
        ).tolist()
        self.skipped.zero_()
        self.first_step.zero_()
        self.longest.copy_(self.consecutive)  # a run still going on counts on from here
        self.kept["consecutive"] = going_on
        report = {
            "skipped": skipped,
            "consecutive": consecutive,
            "last_step": last,
            "first_step": first,
            "what": _WHAT.get(code),
        }
        if skipped:
            self.unlogged = self.unlogged or {"skipped": 0, "first_step": first, "what": report["what"]}
            self.unlogged["skipped"] += skipped
        return report

    def take_unlogged(self) -> dict[str, Any]:
        """What `read` saw since the last call (skipped steps, the first one and why), for a metrics row."""
        out, self.unlogged = self.unlogged or {"skipped": 0}, {}
        return out


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
        # a checkpoint's window of a larger run.spike_window is cut to this one before it judges: the
        # resume's note says the new window is in effect from the next step
        del self.recent[: -self.window]
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


@dataclass(frozen=True)
class Verdict:
    """What step `step` did and what the run does about it (see the module), decided once."""

    step: int
    action: str  # GO_ON, SKIPPED, STOP or REWIND
    loss: float | None = None  # the step's loss, the mean over ranks (None: the host did not read the step)
    # Non-finite steps not applied since the last metrics row (a logged, stopped or rewound step's
    # row counts them): {"skipped": n, "first_step": …, "what": "loss" | …}; None on other steps.
    unlogged: dict[str, Any] | None = None
    spike: dict[str, float] | None = None  # the spike rule's finding
    rewind: RewindTarget | None = None  # where a REWIND goes back to, and what it skips
    cause: str = ""  # why a STOP or REWIND: the loss, the step and the rule
    advice: str = ""  # a non-finite STOP's next steps (a lower LR, or skipping such steps)
    warning: str = ""  # a line to print (a spike that could not rewind)
    error: type[NonFiniteError] = field(default=NonFiniteError)  # what a STOP raises

    def message(self, last_checkpoint: str) -> str:
        """The STOP's one line, naming the last complete checkpoint once the saves have ended."""
        if not self.advice:
            return self.cause
        return (
            f"{self.cause}; no update of a non-finite step was applied and nothing was saved after it. "
            f"Last complete checkpoint: {last_checkpoint}. {self.advice}"
        )


class Judge:
    """Reads what each step did, once, and decides the step's Verdict (see the module)."""

    def __init__(
        self,
        run: RunSection,
        *,
        plan: Plan,
        config_path: Path,
        device: torch.device,
        world_size: int,
        recent_losses: list[float],
        nonfinite: dict[str, Any],
        rewinder: Rewinder,
    ):
        """`run`: the [run] section (on_nonfinite, max_skipped, spike_*, on_spike, [run.rewind]);
        `plan` (the key each phase's LR peak comes from) and `config_path` (RUN/config.toml): named
        in a STOP's advice;
        `recent_losses`, `nonfinite`: the spike rule's window and the non-finite tally
        (TrainState's: checkpointed)."""
        self.run, self.plan, self.config_path = run, plan, config_path
        self.device, self.world_size = device, world_size
        self.guard = NonFiniteGuard(device, nonfinite)
        self.read_step: int | None = None  # the last step the host read (its tally and the steps' before)
        self.spikes = SpikeDetector(run.spike_window, run.spike_sigma, recent_losses)
        self.rewinder = rewinder
        # With a rewind on, every step is read: a rewind acts at the step itself.
        self.every_step = "rewind" in (run.on_spike, run.on_nonfinite)
        # The non-finite steps this process trained, for the run's last line: (step read, how many up to
        # it); a rewind discards those after its checkpoint (every step is read then, one each). The
        # rows' skipped_steps are no count of this process's: a checkpoint's tally no row had counted is
        # counted by the next run's first row, and a rewind can discard that row (reviews RV64c 1,
        # RV64d 1).
        self.nonfinite_read: list[tuple[int, int]] = []

    def judge(self, step: int, result: dict[str, Any], *, look: bool, logged: bool) -> Verdict:
        """The verdict of step `step` (`result`: train_step's). `look`: something besides training
        is due at this step (the host reads it then); `logged`: its metrics row is due (the row's
        loss is judged for spikes under on_spike = "report")."""
        self.guard.record(step, result["nonfinite"])
        if not (look or self.every_step):
            return Verdict(step, GO_ON)
        loss = _mean(result["loss"], self.world_size, self.device)
        tally = self._read(step)
        judged = logged or self.run.on_spike == "rewind"
        spike = self.spikes.check(loss) if judged else None
        verdict = self._decide(step, loss, tally, spike)
        if logged or verdict.action in (STOP, REWIND):  # these steps write a row
            verdict = _with(verdict, unlogged=self.guard.take_unlogged())
        return verdict

    def rewound(self, back_to: int) -> None:
        """After a REWIND's checkpoint (of step `back_to`) is restored: the tally as that checkpoint kept
        it (the discarded attempt's skips are nobody's)."""
        self.guard.restore()
        self.nonfinite_read = [(s, n) for s, n in self.nonfinite_read if s <= back_to]

    def nonfinite_after(self, start: int) -> int:
        """How many of the steps after `start` this process trained were non-finite (not applied), in the
        kept timeline."""
        return sum(n for s, n in self.nonfinite_read if s > start)

    def _read(self, step: int) -> dict[str, Any]:
        """The guard's tally (one host sync), its non-finite steps kept for nonfinite_after."""
        tally = self.guard.read()
        self.read_step = step
        if tally["skipped"]:
            self.nonfinite_read.append((step, tally["skipped"]))
        return tally

    def settle(self, step: int) -> Verdict:
        """The verdict on the steps up to `step` that trained unread (no host sync while nothing was
        due), for a save the loop did not plan: data that cannot be had stops the run after saving the
        last step trained, and a STOP here means nothing may be saved at or after its bad step. A
        GO_ON when the host read `step` already (every step is read while a rewind is on)."""
        if self.read_step == step:
            return Verdict(step, GO_ON)
        tally = self._read(step)  # identical on every rank: each step's flag was all-reduced
        return self._decide(step, None, tally, None)

    def _decide(self, step: int, loss: float | None, tally: dict[str, Any], spike: dict | None) -> Verdict:
        on_nonfinite, seen = self.run.on_nonfinite, Verdict(step, GO_ON, loss=loss, spike=spike)
        if tally["skipped"]:
            if on_nonfinite == "rewind":
                # every step is read under a rewind: the tally's first step is this one
                # its step, as a spike's reason names it (trial RV78a 4)
                return self._rewind(seen, f"non-finite {tally['what']} ({_fmt(loss)}) at step {step:,}")
            if on_nonfinite == "stop" or tally["consecutive"] >= self.run.max_skipped:
                why = (
                    f"step {tally['first_step']}: the {tally['what']} is not finite (NaN or inf)"
                    if on_nonfinite == "stop"
                    else _too_many_skipped(
                        tally, step, self.run.max_skipped, self.guard.unlogged, self.rewinder.timeline.skips
                    )
                )
                return _with(seen, action=STOP, cause=why, advice=self._advice(step))
            seen = _with(seen, action=SKIPPED)
        if spike is not None and self.run.on_spike == "rewind":
            rule = (
                f"loss {loss:.4g} at step {step:,} (mean {spike['mean']:.4g} + {spike['sigma']:g}σ, "
                f"σ {spike['std']:.3g} over the previous {spike['window']} steps)"
            )
            return self._rewind(seen, rule)
        return seen

    def _rewind(self, seen: Verdict, cause: str) -> Verdict:
        """A REWIND to the checkpoint the rewinder finds; a STOP past max_rewinds or for a
        non-finite step with none; a GO_ON with a warning for a spike with none."""
        limit = self.run.rewind.max_rewinds
        done = self.rewinder.timeline.skips
        if len(done) >= limit:
            return _with(
                seen,
                action=STOP,
                error=RewindLimitError,
                cause=f"{cause}: a rewind would be the run's rewind {len(done) + 1}, past "
                f"run.rewind.max_rewinds = {limit} (so far: {'; '.join(history(s) for s in done)}); the "
                f"data or the settings need a look: gristmill data inspect {self.config_path.parent} --step "
                f"{seen.step} shows what this step trained on",
            )
        target = self.rewinder.target(seen.step, cause)
        if isinstance(target, RewindTarget):
            return _with(seen, action=REWIND, rewind=target, cause=cause)
        if seen.spike is None:  # a non-finite step cannot be trained past: stopped as "stop" stops it
            why = f"step {seen.step}: {cause}; {target}; stopping"
            return _with(seen, action=STOP, cause=why, advice=self._advice(seen.step))  # (review R17d M2)
        return _with(
            seen, warning=f"WARNING step {seen.step}: {cause}; {target}: not rewinding, the run goes on"
        )

    def _advice(self, step: int) -> str:
        # The key the step's LR peak comes from: a phase's own lr.peak, else optim.lr (advising
        # optim.lr where a phase sets its own peak trained the same LR again).
        p, _ = self.plan.locate(step - 1)
        key = self.plan.key_of(p, "peak")
        piece = self.plan.phases[p].lr
        lower = piece.peak / piece.scale / 10  # as written: the batch rule's factor is the plan's
        # skipping already, the advice to skip gave the same stop at the same step (review R17d M1)
        resume = f"gristmill train --config {self.config_path} --resume auto --set"
        then = (
            f"resume allowing more of them in a row ({resume} run.max_skipped={self.run.max_skipped * 2})"
            if self.run.on_nonfinite == "skip"
            else f"resume skipping such steps ({resume} run.on_nonfinite=skip)"
        )
        return (
            "A resume keeps the learning rate of the steps already trained, so start a new run with a lower "
            f"learning rate (gristmill train --config {self.config_path} --set {key}={lower:g} "
            f"run.output_dir=NEW_DIR); or check the data and {then}"
        )


def _too_many_skipped(
    tally: dict[str, Any], step: int, most: int, unlogged: dict[str, Any], skips: tuple[Skip, ...]
) -> str:
    """The STOP's cause past run.max_skipped: the run of non-finite steps (left out, not trained), by
    its steps where the tally knows them (a rewind's skip may lie between two of them: its steps were
    not trained, review RV64c 2), and the first non-finite step no metrics row has counted yet."""
    n, end = tally["consecutive"], tally["last_step"]
    if not end:  # the run began before this process and nothing here extended it (a resume's)
        steps = f"up to step {step}"
    else:
        first, left = end, n - 1
        while left:  # n trained steps back from `end`, over the skips' untrained steps
            first -= 1
            left -= not any(k.first_step <= first <= k.last_step for k in skips)
        steps = f"step {end}" if n == 1 else f"steps {first}–{end}"
        steps += " (a rewind's skip between them)" if end - first + 1 > n else ""
    count = "a non-finite step" if n == 1 else f"{n} non-finite steps in a row"
    first_seen = unlogged or tally  # a save's or a signal's read is no log: the row's own first step
    return (
        f"{steps}: {count}, none applied (run.max_skipped = {most}; the first since the last log, step "
        f"{first_seen['first_step']}: {first_seen['what']} not finite)"
    )


def _with(verdict: Verdict, **changes: Any) -> Verdict:
    return dataclasses.replace(verdict, **changes)


def _mean(loss: torch.Tensor, world_size: int, device: torch.device) -> float:
    """The step's loss, the mean over ranks: the same value on every rank (one host sync)."""
    total = loss.double()
    if world_size > 1:
        total = total.to(device)
        dist.all_reduce(total)
    return total.item() / world_size


def _fmt(loss: float | None) -> str:
    if loss is None:
        return "loss not read"
    return "loss NaN" if math.isnan(loss) else f"loss {loss}"
