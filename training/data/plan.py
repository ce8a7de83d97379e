"""The data plan: phases over a mixture of sources, as a pure function of the config.

A run trains on one or more sources (datasets built by `gristmill data build`) in phases, each
with a step budget, a seq_len, mix weights and a learning-rate piece (docs/design.md, "The loader's
guarantees"). Everything here is integer arithmetic on the config and each source's token count;
no tar is read and nothing depends on the number of ranks or workers:

- **Windows per step.** Phase p cuts sequences of `seq_len + 1` tokens ("windows"); a step holds
  G = global_batch_tokens / seq_len of them. After k steps of the phase, source i has had the
  largest-remainder apportionment of k·G windows by the phase's weights (`cumulative`), so at every
  step each source is within one window of its share. With G·w ≥ 1 for every weight w > 0 these
  totals never decrease (checked), so a step's count is a difference of two of them.
- **Placement.** Inside a step the windows are placed by a permutation hashed from (seed, step):
  slot g of the global batch gets a source, and that source's windows keep their stream order
  across the slots. One source gives the identity placement: today's single-dataset batches.
- **Streams.** Each source keeps its own token stream, epoch after epoch, each epoch ordered as
  the single-dataset loader orders it (training/data/order.py: a function of the seed, the epoch
  and the source's documents). A source's position is (epoch, token offset). A step's windows of a
  source never straddle an epoch end: the epoch's tail that cannot hold them is dropped (fewer
  windows than one step's share, plus a partial window) and the step starts the next epoch. A
  phase boundary re-cuts each stream from its current offset at the new seq_len, so no token is
  read twice or skipped. The position after any step is found by a binary search over the
  closed-form totals per epoch crossing, not by a replay.
- **Learning rate.** Each phase has a piece: optional warmup from the LR the previous phase ended
  at (0 for the first) to its peak, then constant / cosine / linear / 1-sqrt to its target.

`Plan.describe()` is what a checkpoint stores; `check_resume` compares it with the plan of the
resuming run: the past (finished phases, and the current one up to the step) must be identical;
future phases may change. A single-dataset recipe is a one-source, one-phase plan.
"""

from __future__ import annotations

import bisect
import json
import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from typing import Any

import numpy as np

from training.contract.config_loader import tokens_shown
from training.contract.dataset_format import relative_location, working_directory_note
from training.contract.errors import GristmillError
from training.data.order import derive_key, hashed_order

# /2: the epoch order's training blocks are the build's samples (training/data/order.py, plan_version);
# a /1 state resumes only where both orders are the same (DocBlocks.same_as_plan_1).
PLAN_FORMAT = "gristmill-plan/2"
PLAN_FORMAT_1 = "gristmill-plan/1"
LAST_PLAN_1_COMMIT = "dacacc9"  # the last gristmill whose runs drew their batches in order /1
PLACE_RUN = 4  # windows of one source placed together in a step (see Plan._placement)
# The most epochs' worth of a source's tokens a bounded plan may ask. Each epoch end is found by a
# binary search (~80 µs), and the supply check and the loader walk them all: a budget with a few
# digits too many (phase.steps = 99999999999999999) walked for hours, 11 GB, instead of refusing
# (trial RV52b F1). Asked, not read: the tails an epoch end drops make up to ~2× as many epochs.
MAX_EPOCHS_ASKED = 100_000
SHAPES = ("constant", "cosine", "linear", "1-sqrt")


class PlanError(GristmillError):
    """A plan that cannot run (a source too small, a weight too small) or a resume that would
    change its past; the message names the source or field, both numbers and the fix."""


@dataclass(frozen=True)
class Source:
    """One dataset of the mixture, as the plan needs it."""

    name: str
    dataset: str
    fingerprint: str
    tokens: int  # tokens of its training split: one epoch of its stream
    documents: int
    max_epochs: int | None = 1  # None: unlimited (the single-dataset recipe, as before phases)
    val_fraction: float = 0.0  # documents held out of its stream (they decide `tokens`)
    tokenizer_sha256: str = ""  # its tokenizer.json's ("": not known), recorded for exports

    @classmethod
    def of(cls, table: Any, name: str, max_epochs: int | None = 1) -> Source:
        """The plan's view of one split of a dataset (a reader.DocumentTable): its stream is
        one epoch of `table.tokens` tokens."""
        info = table.info
        return cls(
            name, table.location, info["fingerprint"], table.tokens, table.documents, max_epochs,
            table.val_fraction, str(info.get("tokenizer_sha256") or ""),
        )  # fmt: skip


@dataclass(frozen=True)
class LRPiece:
    """A phase's learning rate: warmup from `start` to `peak`, then `shape` from `peak` to `end`.
    `start` None: where the previous phase ended (0 for the first phase). `peak` and `end` are the
    LRs the steps get; `scale` is the factor optim.batch_lr_scaling put on the written ones (a record
    for a refused resume to name the key: not compared, a plan is its LRs)."""

    peak: float
    end: float
    shape: str = "cosine"
    warmup_steps: int = 0
    start: float | None = None
    scale: float = field(default=1.0, compare=False)


@dataclass(frozen=True)
class Phase:
    name: str
    steps: int | None  # None: unbounded (a loader used on its own: inspect, validation)
    seq_len: int
    global_batch: int  # G, windows per step
    weights: tuple[int, ...]  # per source (plan order), integer weights; a source with 0 is unused
    lr: LRPiece | None = None


@dataclass(frozen=True)
class Skip:
    """Steps a rewind past a loss spike did not train (training/run/rewind.py): part of the run's
    history, not of its config, so a plan built from the config has none and a resume adopts the
    checkpoint's. The steps keep their numbers, windows and LR; their windows are never fed."""

    rewind: int  # 1 for the run's first rewind, 2 for the next, ...
    first_step: int  # global steps first_step..last_step (from 1, inclusive) were skipped
    last_step: int
    spike_step: int  # the step whose loss called for the rewind
    checkpoint_step: int  # the checkpoint the rewind restored (first_step - 1)
    reason: str  # the loss and the rule it broke, as the rewind's line said it

    def __post_init__(self) -> None:
        if not 1 <= self.first_step <= self.last_step:
            raise PlanError(
                f"rewind {self.rewind} skips steps {self.first_step}..{self.last_step}: no such range"
            )


def skips_from(description: dict[str, Any]) -> tuple[Skip, ...]:
    """The rewinds' skips a plan description (RUN/data_plan.json, an older checkpoint's) records."""
    names = [f.name for f in fields(Skip)]
    return tuple(Skip(**{k: s[k] for k in names}) for s in description.get("skips", []))


def skip_of(skips: Sequence[Skip], step: int) -> Skip | None:
    """The skip global step `step` (from 1) lies in, or None when it is (to be) trained."""
    return next((s for s in skips if s.first_step <= step <= s.last_step), None)


def untrained_save(skips: Sequence[Skip], step: int, last_step: int) -> Skip | None:
    """The skip whose rewind saved checkpoint `step` (its last step) with the weights of the step it
    went back to, to resume from: no trained step, so neither exported nor scored as step `step`
    (review R15e F2); None for a trained step, and for the plan's `last_step` (the run's final
    weights, whichever step's they are: exported and scored with a note)."""
    skip = skip_of(skips, step)
    return skip if skip is not None and step == skip.last_step != last_step else None


def trained_step(skips: Sequence[Skip], step: int) -> int:
    """The step whose weights the run holds after global step `step`: `step` itself, or for a step a
    rewind skipped, the step that rewind went back to (itself perhaps inside an earlier skip)."""
    while (skip := skip_of(skips, step)) is not None:
        step = skip.checkpoint_step
    return step


def _skipped_ranges(skips: Sequence[Skip], step: int) -> list[tuple[int, int]]:
    """The skipped steps among the first `step`, as disjoint 0-based ranges [a, b) (two rewinds
    may skip one step: it counts once)."""
    merged: list[list[int]] = []
    for a, b in sorted((s.first_step - 1, min(s.last_step, step)) for s in skips):
        if a >= b:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


@dataclass
class _Crossing:
    """Source i enters `epoch` at local step `step` of a phase, its stream at token `offset`, having
    had `base` windows of the phase before that step."""

    step: int
    epoch: int
    offset: int
    base: int


@dataclass
class Plan:
    """Sources, phases and the data seed: which tokens every global step takes, and its LR."""

    sources: list[Source]
    phases: list[Phase]
    seed: int
    _crossings: dict[tuple[int, int], list[_Crossing]] = field(default_factory=dict, repr=False)
    _all_found: set[tuple[int, int]] = field(default_factory=set, repr=False)  # bounded phases done
    # Per phase, the config key each field came from ("peak" -> "optim.lr", "steps" -> "schedule.steps"):
    # a refused resume names what the user wrote (recipe.build_plan fills it; not part of the plan).
    keys: list[dict[str, str]] = field(default_factory=list, repr=False, compare=False)
    # Per phase, the budgets given in tokens as written ("steps" -> phase.tokens, "warmup_steps" ->
    # its lr.warmup_tokens): the plan holds the whole steps they make, and a refused resume showed
    # 3300 → 4400 tokens as 3072 → 4096 (review R25j 4). Described with the plan, so a checkpoint
    # holds what its recipe wrote; not compared (the steps are the plan).
    written: list[dict[str, float]] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sources or not self.phases:
            raise PlanError("a plan needs at least one source and one phase")
        self.first_step = [0]
        for ph in self.phases[:-1]:
            if ph.steps is None:
                raise PlanError(f"phase {ph.name!r} has no step budget but is not the last phase")
            self.first_step.append(self.first_step[-1] + ph.steps)
        last = self.phases[-1].steps
        self.total_steps = None if last is None else self.first_step[-1] + last
        for p, ph in enumerate(self.phases):
            if len(ph.weights) != len(self.sources) or sum(ph.weights) <= 0:
                raise PlanError(f"phase {ph.name!r} gives no source a positive weight")
            for i, a in enumerate(ph.weights):
                if 0 < a and ph.global_batch * a < sum(ph.weights):
                    # the share it needs, 1/global_batch, in the units the mix is written in: a weight
                    # of the others' sum ÷ (global_batch − 1) (the share alone was read as the weight
                    # to write, which a mix not summing to 1 refused again: trial R30b F3)
                    b, batch = ph.global_batch, self.key_of(p, "global_batch")
                    fix = f"its weight to at least the others' weights summed ÷ {b - 1}, or {batch}"
                    raise PlanError(
                        f"phase {ph.name!r} ({self.key_of(p, 'mix')}) gives source {self.sources[i].name!r} "
                        f"{a / sum(ph.weights):.4g} of its mix: {b * a / sum(ph.weights):.3g} windows per "
                        f"step of {b}, fewer than one; raise {fix if b > 1 else batch}"
                    )
        self._start: list[list[tuple[int, int]]] = []  # per phase, per source: (epoch, offset)

    def step_tokens(self, i: int) -> int:
        """The most stream tokens one step of the plan takes of source i, over its phases."""
        return max(
            -(-ph.global_batch * ph.weights[i] // sum(ph.weights)) * (ph.seq_len + 1) for ph in self.phases
        )

    def key_of(self, p: int, name: str) -> str:
        """The config key phase `p`'s field `name` came from (`keys`), or phase[p].name."""
        return (self.keys[p] if p < len(self.keys) else {}).get(name, f"phase[{p}].{name}")

    def written_of(self, p: int) -> dict[str, float]:
        """Phase `p`'s budgets given in tokens, as written (`written`); {} when none or not known."""
        return self.written[p] if p < len(self.written) else {}

    # -- where a global step is --
    def locate(self, step: int) -> tuple[int, int]:
        """(phase index, step within the phase) of 0-based global step `step`, as Python integers
        (a numpy integer step is taken as its value: see _apportioned)."""
        step = operator.index(step)
        if step < 0 or (self.total_steps is not None and step >= self.total_steps):
            raise PlanError(f"step {step} is outside the plan's {self.total_steps} steps")
        p = bisect.bisect_right(self.first_step, step) - 1
        return p, step - self.first_step[p]

    def cumulative(self, p: int, k: int) -> np.ndarray:
        """Windows of each source in the first k steps of phase p: the largest-remainder
        apportionment of k·G by the weights (ties to the earlier source). Exact integers."""
        return np.array(self._apportioned(p, k), np.int64)

    def _apportioned(self, p: int, k: int) -> list[int]:
        """cumulative(p, k) as Python integers (exact at any scale): a phase's few sources in plain
        arithmetic, not numpy's on arrays of 1–3 numbers (~5 µs a call), since a bucket's prefetcher
        asks for dozens of steps' at each walk of the plan (step_spans), holding the GIL the loop
        waits for. `k` is taken as a Python integer: a numpy one made `a * total` int64, which a
        decimal mix's weights (0.1234567890123457 : … is 1234567890123457 : …) overflow within a few
        steps, with only a RuntimeWarning, and a caller's numpy step read other windows (review RV34d L1)."""
        ph = self.phases[p]
        d = sum(ph.weights)
        total = operator.index(k) * ph.global_batch
        parts = [divmod(a * total, d) for a in ph.weights]
        out = [q for q, _ in parts]
        short = total - sum(out)
        if short:
            for i in sorted(range(len(parts)), key=lambda i: (-parts[i][1], i))[:short]:
                out[i] += 1
        return out

    # -- source streams --
    def phase_start(self, p: int) -> list[tuple[int, int]]:
        """Each source's (epoch, token offset) when phase p starts."""
        while len(self._start) <= p:
            q = len(self._start)
            if q == 0:
                self._start.append([(0, 0)] * len(self.sources))
            else:
                steps = self.phases[q - 1].steps
                self._start.append([self.position(i, q - 1, steps) for i in range(len(self.sources))])
        return self._start[p]

    def _window(self, p: int) -> int:
        return self.phases[p].seq_len + 1

    def crossings(self, i: int, p: int, until: int) -> list[_Crossing]:
        """Source i's epoch entries in phase p, at least those at steps < `until` (the first entry is
        the phase start). Each is found by a binary search over the closed-form totals."""
        key = (i, p)
        if key not in self._crossings:
            e, off = self.phase_start(p)[i]
            self._crossings[key] = [_Crossing(0, e, off, 0)]
        found = self._crossings[key]
        if key in self._all_found:  # the loader asks every step: answered from the list
            return found
        steps = self.phases[p].steps
        limit = until if steps is None else steps
        tokens, w = self.sources[i].tokens, self._window(p)

        def cum(k: int) -> int:
            return self._apportioned(p, k)[i]

        while True:
            c = found[-1]
            room = (tokens - c.offset) // w  # whole windows left in this epoch
            if c.step >= limit or cum(limit) - c.base <= room:
                if steps is not None:
                    self._all_found.add(key)
                return found  # no (further) crossing before `limit`
            lo, hi = c.step, limit - 1  # smallest k with cum(k + 1) - base > room: it exists
            while lo < hi:
                mid = (lo + hi) // 2
                if cum(mid + 1) - c.base > room:
                    hi = mid
                else:
                    lo = mid + 1
            share = cum(lo + 1) - cum(lo)
            if share > tokens // w:
                raise self._epoch_too_small(i, p, share)
            found.append(_Crossing(lo, c.epoch + 1, 0, cum(lo)))

    def _crossing_at(self, i: int, p: int, k: int) -> _Crossing:
        found = self.crossings(i, p, k + 1)
        # by key, not a list of the steps built each call: O(epochs) a step, ~3 ms at 100,000 (RV54b 5)
        return found[bisect.bisect_right(found, k, key=lambda c: c.step) - 1]

    def position(self, i: int, p: int, k: int) -> tuple[int, int]:
        """Source i's (epoch, token offset) after k steps of phase p."""
        if k == 0:
            return self.phase_start(p)[i]
        c = self._crossing_at(i, p, k - 1)
        return c.epoch, c.offset + (int(self.cumulative(p, k)[i]) - c.base) * self._window(p)

    def step_windows(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global step `step` (0-based) as G slots: (source, epoch, first stream token) per slot."""
        p, k = self.locate(step)
        ph = self.phases[p]
        counts = self.cumulative(p, k + 1) - self.cumulative(p, k)
        if np.count_nonzero(counts) > 1:
            labels = self._placement(counts, step)
        else:  # one source: identity placement (the single-dataset loader's batches)
            labels = np.repeat(np.arange(len(self.sources)), counts)
        epoch = np.zeros(ph.global_batch, np.int64)
        first = np.zeros(ph.global_batch, np.int64)
        w = ph.seq_len + 1
        for i, ep, a, _ in self.step_spans(step):
            slots = np.flatnonzero(labels == i)  # in slot order = this source's stream order
            epoch[slots] = ep
            first[slots] = a + np.arange(len(slots)) * w
        return labels, epoch, first

    def step_spans(self, step: int) -> list[tuple[int, int, int, int]]:
        """The part of each source's stream global step `step` reads, as (source, epoch, first token,
        end token): its windows there, back to back in one epoch (step_windows places them in the
        batch; a bucket's prefetcher needs only where they lie, at every step ahead)."""
        p, k = self.locate(step)
        before, after = self._apportioned(p, k), self._apportioned(p, k + 1)
        w = self._window(p)
        out = []
        for i, (b, e) in enumerate(zip(before, after)):
            if e > b:
                c = self._crossing_at(i, p, k)
                a = c.offset + (b - c.base) * w
                out.append((i, c.epoch, a, a + (e - b) * w))
        return out

    def _placement(self, counts: np.ndarray, step: int) -> np.ndarray:
        """Each slot's source: the sources' windows cut into runs of up to PLACE_RUN (a source's
        k-th run holds its windows k·PLACE_RUN …, in stream order), the runs permuted by a hash of
        (seed, step). Runs rather than single windows: a run is read as one range, and a
        document cut at every run boundary costs the reader one more piece (8% of throughput
        at runs of 1, seq 2048)."""
        runs = -(-counts // PLACE_RUN)
        run_src = np.repeat(np.arange(len(counts)), runs)
        run_src = run_src[hashed_order(len(run_src), derive_key(self.seed, step, 2))]
        by_src = np.argsort(run_src, kind="stable")  # each source's runs in placed order
        nth = np.empty(len(run_src), np.int64)
        nth[by_src] = np.arange(len(run_src)) - np.repeat(np.cumsum(runs) - runs, runs)
        sizes = np.minimum(PLACE_RUN, counts[run_src] - nth * PLACE_RUN)
        return np.repeat(run_src, sizes)

    # -- learning rate --
    def lr(self, step: int) -> float:
        """The learning rate of 0-based global step `step`."""
        p, k = self.locate(step)
        piece = self.phases[p].lr
        if piece is None:
            raise PlanError(f"phase {self.phases[p].name!r} has no learning-rate piece")
        start = piece.start if piece.start is not None else self._end_lr(p - 1)
        if k < piece.warmup_steps:
            return start + (piece.peak - start) * (k + 1) / piece.warmup_steps
        steps = self.phases[p].steps
        if piece.shape == "constant" or steps is None:
            return piece.peak
        peak_step = max(piece.warmup_steps - 1, 0)
        span = steps - 1 - peak_step
        t = 1.0 if span <= 0 else min(1.0, (k - peak_step) / span)
        if piece.shape == "cosine":
            return piece.end + (piece.peak - piece.end) * 0.5 * (1.0 + math.cos(math.pi * t))
        if piece.shape == "linear":
            return piece.peak + (piece.end - piece.peak) * t
        return piece.end + (piece.peak - piece.end) * (1.0 - math.sqrt(t))  # 1-sqrt (WSD's decay)

    def _end_lr(self, p: int) -> float:
        if p < 0:
            return 0.0
        return self.lr(self.first_step[p] + self.phases[p].steps - 1)

    # -- accounting --
    def windows_between(self, a: int, b: int) -> list[tuple[int, int, int, np.ndarray]]:
        """0-based global steps [a, b) per phase they touch: (phase, first and end local step, windows
        of each source), differences of `cumulative` (no replay; epoch crossings change no count)."""
        out = []
        for p, ph in enumerate(self.phases):
            first = self.first_step[p]
            lo, hi = max(a, first), b if ph.steps is None else min(b, first + ph.steps)
            if lo < hi:
                ka, kb = lo - first, hi - first
                out.append((p, ka, kb, self.cumulative(p, kb) - self.cumulative(p, ka)))
        return out

    def consumed(self, step: int, skips: Sequence[Skip] = ()) -> list[dict[str, Any]]:
        """After `step` global steps of a timeline whose rewinds skipped `skips`: per (phase, source)
        the steps, the windows trained and their tokens (windows × seq_len), the windows of skipped
        steps and their tokens, the stream tokens read ((trained + skipped windows) × (seq_len + 1): a
        skipped window is read past, never fed), the rewinds that skipped some of them, and the
        source's epoch."""
        skipped = np.zeros((len(self.phases), len(self.sources)), np.int64)
        for a, b in _skipped_ranges(skips, step):
            for p, _, _, n in self.windows_between(a, b):
                skipped[p] += n
        rewinds: dict[tuple[int, int], set[int]] = {}
        for s in skips:
            for p, _, _, n in self.windows_between(s.first_step - 1, min(s.last_step, step)):
                for i in np.flatnonzero(n).tolist():
                    rewinds.setdefault((p, i), set()).add(s.rewind)
        rows = []
        for p, ph in enumerate(self.phases):
            first = self.first_step[p]
            if step <= first and p > 0:
                break
            k = step - first if ph.steps is None else min(step - first, ph.steps)
            cum = self.cumulative(p, k)
            for i, src in enumerate(self.sources):
                e, _ = self.position(i, p, k)
                read, skip = int(cum[i]), int(skipped[p, i])
                rows.append(
                    {
                        "phase": ph.name,
                        "phase_index": p,
                        "source": src.name,
                        "source_index": i,
                        "steps": k,
                        "seq_len": ph.seq_len,
                        "windows": read - skip,
                        "tokens": (read - skip) * ph.seq_len,
                        "skipped_windows": skip,
                        "skipped_tokens": skip * ph.seq_len,
                        "rewinds": sorted(rewinds.get((p, i), ())),
                        "stream_tokens": read * (ph.seq_len + 1),
                        "epoch": e + 1,
                        # the share of one epoch of the source's training split read
                        "fraction": read * (ph.seq_len + 1) / src.tokens if src.tokens else 0.0,
                    }
                )
        return rows

    def skip_detail(self, skip: Skip) -> list[dict[str, Any]]:
        """Per source the skip took windows from: the windows and their tokens, and the stream
        positions (epoch from 1, token offset) before its first skipped step and after its last —
        every window of that source between them is skipped (an epoch's dropped tail between them
        was never a window)."""
        out = []
        parts = self.windows_between(skip.first_step - 1, skip.last_step)
        for i, src in enumerate(self.sources):
            mine = [(p, ka, kb, int(n[i])) for p, ka, kb, n in parts if n[i]]
            if not mine:
                continue
            (e0, o0), (e1, o1) = (
                self.position(i, mine[0][0], mine[0][1]),
                self.position(i, mine[-1][0], mine[-1][2]),
            )
            windows = sum(n for _, _, _, n in mine)
            tokens = sum(n * self.phases[p].seq_len for p, _, _, n in mine)
            out.append(
                {"source": src.name, "windows": windows, "tokens": tokens,
                 "from_epoch": e0 + 1, "from_token": o0, "to_epoch": e1 + 1, "to_token": o1}
            )  # fmt: skip
        return out

    def asked(self) -> list[list[int]]:
        """Per source, the stream tokens each phase of the bounded plan asks of it (closed form)."""
        return [
            [self._apportioned(p, ph.steps)[i] * self._window(p) for p, ph in enumerate(self.phases)]
            for i in range(len(self.sources))
        ]

    def check_bounded(self) -> list[list[int]]:
        """Refuse (PlanError) a bounded plan that asks more than MAX_EPOCHS_ASKED epochs' worth of a
        source, every source before any epoch end is walked: a phase's start walks every source through
        the phases before it (one source checked, then walked, walked another unchecked: review RV53c
        1). Cheap: what `--plan` checks before its table walks the plan. Returns `asked` ([] for a plan
        without an end)."""
        if self.total_steps is None:
            return []
        asked = self.asked()
        for i, per_phase in enumerate(asked):
            self._check_epochs_bounded(i, per_phase)
        return asked

    def check_supply(self) -> list[str]:
        """Refuse (PlanError) a source the plan would take past its max_epochs (check_bounded first);
        returns a note for each source read more than once."""
        if self.total_steps is None:
            return []
        asked_of = self.check_bounded()
        notes = []
        for i, src in enumerate(self.sources):
            epochs = max(self.crossings(i, p, ph.steps)[-1].epoch + 1 for p, ph in enumerate(self.phases))
            asked = sum(asked_of[i])
            if src.max_epochs is not None and epochs > src.max_epochs:
                # the tails' size, so the numbers add up: read + dropped passes max_epochs × an epoch
                # ("plus the tails it drops" left a refusal asking less than the epochs hold, R25c 1)
                dropped, ends = self.dropped_tail(i), epochs - 1
                tails = (
                    f" and drops {dropped:,} more at its {ends} epoch end{'s' * (ends > 1)} (the tails "
                    f"too short for a step's windows): {asked + dropped:,} tokens"
                )
                raise PlanError(
                    f"source {src.name!r} ({src.dataset}) would run out: the plan asks {asked:,} tokens "
                    f"of it{tails if dropped else ''}, past the {src.max_epochs * src.tokens:,} of "
                    f"max_epochs = {src.max_epochs} epochs of its training split's {src.tokens:,}; lower "
                    f"its weight or the phases' budgets, add data, or set max_epochs = {epochs} for that "
                    "source to repeat it (each epoch reshuffled)"
                )
            if epochs > 1:
                dropped = self.dropped_tail(i)
                limit = "no limit" if src.max_epochs is None else src.max_epochs  # not Python's None
                notes.append(
                    f"source {src.name!r} is read {epochs} epochs (max_epochs {limit}); "
                    f"{dropped:,} tokens dropped at epoch ends (tails too short for a step's windows)"
                )
        return notes

    def _check_epochs_bounded(self, i: int, asked: list[int]) -> None:
        """Refuse (PlanError) a bounded plan that asks more than MAX_EPOCHS_ASKED epochs' worth of
        source i, `asked` stream tokens in each phase (no epoch end walked). The budget that asks the
        most is named as written."""
        src = self.sources[i]
        if not src.tokens:
            return  # an empty training split: the walk's first step refuses it, naming its cause
        least = -(-sum(asked) // src.tokens)  # epochs, before any tail too short for a step is dropped
        if least <= MAX_EPOCHS_ASKED:
            return  # check_supply walks its epoch ends for the exact figures
        for p, ph in enumerate(self.phases):  # the cause no budget mends, as the walk would name it
            every = ph.global_batch * ph.weights[i] // sum(ph.weights)  # windows each step takes, at least
            if ph.steps and every > src.tokens // self._window(p):
                raise self._epoch_too_small(i, p, every)
        p = max(range(len(asked)), key=asked.__getitem__)
        value = _budget_shown(self.written_of(p).get("steps"), self.phases[p].steps)
        if src.max_epochs is not None and src.max_epochs <= MAX_EPOCHS_ASKED:
            bound = f"max_epochs = {src.max_epochs}"
        else:  # a higher max_epochs than the bound would not let it through either (review RV53c 3)
            bound = f"a plan may ask at most {MAX_EPOCHS_ASKED:,} epochs' worth of a source"
        raise PlanError(
            f"source {src.name!r} ({src.dataset}) would be read {least:,} epochs or more: the plan asks "
            f"{sum(asked):,} tokens of its training split's {src.tokens:,} ({bound}); "
            f"{self.key_of(p, 'steps')} = {value} asks the most of it: lower it"
            f"{'' if len(self.sources) == 1 else ' or the source weight'}, or add data"
        )

    def _epoch_too_small(self, i: int, p: int, share: int) -> PlanError:
        """Source i holds fewer windows in an epoch than the `share` one step of phase p takes."""
        src, w = self.sources[i], self._window(p)
        held = f", or hold out less (val_fraction {src.val_fraction:g})" if src.val_fraction > 0 else ""
        return PlanError(
            f"source {src.name!r} ({src.dataset}): one epoch holds {src.tokens // w} windows of {w} "
            f"tokens, fewer than the {share} one step of phase {self.phases[p].name!r} takes "
            f"from it; use a bigger dataset or a smaller weight{held}"
        )

    def dropped_tail(self, i: int) -> int:
        """Tokens of source i that the bounded plan skips: at each epoch crossing, the rest of the
        epoch that could not hold the next step's windows of the source."""
        dropped = 0
        for p, ph in enumerate(self.phases):
            found = self.crossings(i, p, ph.steps)
            for prev, c in zip(found, found[1:]):
                at = prev.offset + (int(self.cumulative(p, c.step)[i]) - prev.base) * self._window(p)
                dropped += self.sources[i].tokens - at
        return dropped

    # -- identity and resume --
    def describe(self, skips: Sequence[Skip] = ()) -> dict[str, Any]:
        """Everything the batches and the learning rate depend on (what a checkpoint stores), the
        budgets written in tokens (`written`: what a refused resume names), and the timeline's
        `skips` when it has some (RUN/data_plan.json: history for readers without torch)."""
        return {
            "format": PLAN_FORMAT,
            "seed": self.seed,
            "sources": [
                {
                    "name": s.name,
                    "fingerprint": s.fingerprint,
                    "tokens": s.tokens,
                    "max_epochs": s.max_epochs,
                    "val_fraction": s.val_fraction,
                    # what an export ships (a dataset rebuilt with the same tokenizer has another fingerprint)
                    **({"tokenizer_sha256": s.tokenizer_sha256} if s.tokenizer_sha256 else {}),
                }
                for s in self.sources
            ],
            "phases": [
                {
                    "name": ph.name,
                    "steps": ph.steps,
                    "seq_len": ph.seq_len,
                    "global_batch": ph.global_batch,
                    "weights": list(ph.weights),
                    "lr": None if ph.lr is None else _lr_record(ph.lr),
                    **({"written": written} if (written := self.written_of(p)) else {}),
                }
                for p, ph in enumerate(self.phases)
            ],
            # history, with each source's windows and stream positions for readers without torch
            **({"skips": [{**asdict(s), "sources": self.skip_detail(s)} for s in skips]} if skips else {}),
        }

    def to_json(self, skips: Sequence[Skip] = ()) -> str:
        return json.dumps(self.describe(skips), sort_keys=True, separators=(",", ":"))


def integer_weights(weights: list[float]) -> tuple[int, ...]:
    """Mix weights as exact integers with the same ratios (0.8/0.15/0.05 → 16/3/1): decimal literals
    taken at their written value, so every machine apportions identically."""
    fr = [Fraction(repr(float(w))) for w in weights]
    if any(f < 0 for f in fr):
        raise PlanError(f"mix weights must be ≥ 0, got {weights}")
    den = math.lcm(*(f.denominator for f in fr))
    ints = [int(f * den) for f in fr]
    g = math.gcd(*ints) or 1
    return tuple(x // g for x in ints)


def from_description(d: dict[str, Any]) -> Plan:
    """The plan a checkpoint described (its sources' names, fingerprints and sizes; no datasets)."""
    sources = [
        Source(
            s["name"],
            "",
            s["fingerprint"],
            s["tokens"],
            0,
            s["max_epochs"],
            s["val_fraction"],
            s.get("tokenizer_sha256", ""),
        )  # fmt: skip
        for s in d["sources"]
    ]
    phases = [
        Phase(
            p["name"],
            p["steps"],
            p["seq_len"],
            p["global_batch"],
            tuple(p["weights"]),
            None if p["lr"] is None else LRPiece(**p["lr"]),
        )
        for p in d["phases"]
    ]
    return Plan(sources, phases, d["seed"], written=[p.get("written", {}) for p in d["phases"]])


def recorded_difference(recorded: dict[str, Any], plan: Plan) -> tuple[str, str, str] | None:
    """The first field of `plan` that differs from `recorded`, the description the run wrote of its
    plan (RUN/data_plan.json), as (its config key, the recorded value, `plan`'s, both as a recipe
    writes them: a mix by its sources, not the plan's integer weights: trial RV64a 2a); None when they
    agree, or when `recorded` is of another format (an older run's: its fields differ). The sources'
    datasets and held-out fractions are checked apart (recipe.check_trained_on); skips are history."""
    if recorded.get("format") != PLAN_FORMAT:
        return None
    ours = plan.describe()
    found = _first_difference(recorded, ours, plan)
    return None if found is None else (found[0], _shown(found[1]), _shown(found[2]))


def _first_difference(
    recorded: dict[str, Any], ours: dict[str, Any], plan: Plan
) -> tuple[str, Any, Any] | None:
    """recorded_difference's field and its two values (a mix already as a recipe writes it)."""

    def where(p: int, name: str) -> str:  # a budget given in tokens is compared in the steps it makes
        in_steps = name in ("steps", "warmup_steps") and plan.key_of(p, name).endswith("tokens")
        return (
            f"{plan.key_of(p, name)} (phase {ours['phases'][p]['name']!r}{', in steps' if in_steps else ''})"
        )

    if recorded["seed"] != ours["seed"]:
        return "data.seed", recorded["seed"], ours["seed"]
    for what, part in (("the sources (in order)", "sources"), ("the phases (in order)", "phases")):
        names = [[x["name"] for x in d[part]] for d in (recorded, ours)]
        if names[0] != names[1]:
            return what, *names
    for a, b in zip(recorded["sources"], ours["sources"]):
        if a["max_epochs"] != b["max_epochs"]:
            return f"the max_epochs of source {a['name']!r}", a["max_epochs"], b["max_epochs"]
    for p, (a, b) in enumerate(zip(recorded["phases"], ours["phases"])):
        if a["global_batch"] * a["seq_len"] != b["global_batch"] * b["seq_len"]:
            tokens = [ph["global_batch"] * ph["seq_len"] for ph in (a, b)]
            return where(p, "global_batch"), *tokens
        for name, key in (("steps", "steps"), ("seq_len", "seq_len"), ("weights", "mix")):
            if a[name] == b[name]:
                continue
            if name == "weights":
                names = [s["name"] for s in ours["sources"]]
                mixes = [
                    {n: str(Fraction(w, sum(ph[name]))) for n, w in zip(names, ph[name])} for ph in (a, b)
                ]
                return where(p, key), *_mixes_shown(*mixes)
            return where(p, key), a[name], b[name]
        lrs = [ph["lr"] or {} for ph in (a, b)]
        for name in sorted(set(lrs[0]) | set(lrs[1])):
            if lrs[0].get(name) != lrs[1].get(name):
                return where(p, name), lrs[0].get(name), lrs[1].get(name)
    return None


FUTURE_ONLY = "(only phases after the current one may change)"  # a resume refusal's closing rule
VAL_FRACTION_KEYS = "its [[data.sources]] val_fraction, else data.val_fraction"  # a source's held-out share


def check_resume(
    saved: dict[str, Any], plan: Plan, step: int, same_fingerprint, rule: str = FUTURE_ONLY
) -> list[str]:
    """Refuse (PlanError, naming the field and both values) a plan whose past differs from the
    checkpoint's `saved` plan at global step `step` (steps done); returns notes on future changes.
    `same_fingerprint(saved, ours)` decides whether two dataset fingerprints are the same data; `rule`
    closes a refusal (what may change: a past that runs beyond the checkpoint says its own)."""
    old = from_description(saved)
    # drawn, not "trained": a rewind's skipped steps drew their batches and trained none (RV50a F5)
    drawn = f"the run drew {'step 1' if step == 1 else f'steps 1–{step}'} from it"

    def refuse(what: str, theirs: Any, ours: Any, fix: str = "") -> PlanError:
        return PlanError(
            f"the checkpoint's plan has {what} = {theirs!r} but this run has {ours!r}; the plan's past is "
            f"immutable ({drawn}) — {fix or 'set it back'}, or start a new run " + rule
        )

    def lr_changes(upto: int) -> list[str]:
        """`key old → new` for the step budgets and LR pieces of phases 0..upto that differ: the LRs
        as written, and the batch rule's factor on them (optim.batch_lr_scaling) where that moved."""
        out = []
        follows = False  # the previous phase's end moved with its shape alone: this start with it
        for p in range(upto + 1):
            a, b = old.phases[p], plan.phases[p]
            # a constant phase ends at its peak: where its shape alone changed to or from constant, its
            # end (and the next start) moved with it, and were listed as optim.min_lr, unchanged (RV50a F3)
            shapes = {ph.lr.shape if ph.lr else None for ph in (a, b)}
            derived = {"start"} if follows else set()
            follows = len(shapes) == 2 and "constant" in shapes
            if follows:
                derived.add("end")
            # (listed also where the steps trained do not depend on it, a constant phase's: telling those
            # apart missed a warmup capped at the phase's steps, and hid the key that moved the LR: R25q 1)
            if a.steps != b.steps:
                out.append(_budget_change(old, plan, p, "steps", a.steps, b.steps))
            scale = [ph.lr.scale if ph.lr else 1.0 for ph in (a, b)]
            if not math.isclose(*scale, rel_tol=1e-12):
                out.append(
                    f"{plan.key_of(p, 'scale')} (phase {b.name!r}: its LRs × {scale[0]:.4g} → "
                    f"× {scale[1]:.4g})"
                )
            for name in ("peak", "end", "shape", "warmup_steps", "start"):
                if name in derived:
                    continue
                x, y = (getattr(ph.lr, name) if ph.lr else None for ph in (a, b))
                if name in ("peak", "end", "start") and None not in (x, y):
                    x, y = x / scale[0], y / scale[1]  # as written
                    if math.isclose(x, y, rel_tol=1e-12):
                        continue
                if name == "warmup_steps" and x != y and None not in (x, y):
                    out.append(_budget_change(old, plan, p, name, x, y))
                elif x != y:
                    out.append(f"{plan.key_of(p, name)} {' → '.join(_shown_apart(x, y))}")
        return list(dict.fromkeys(out))  # one key may feed two fields (optim.min_lr: an end and a start)

    def refuse_lr(what: str, upto: int | None = None) -> PlanError:
        changes = lr_changes(p_old if upto is None else upto)
        return PlanError(
            f"cannot change {what} already trained: {'; '.join(changes)}; the plan's "
            f"past is immutable — set {'it' if len(changes) == 1 else 'them'} back, or start a new run "
            + rule
        )

    def future(p: int) -> str | None:
        """What changed in phase p (the current one: its budget; later ones: anything), in the
        recipe's keys; None when nothing did."""
        a = old.phases[p] if p < len(old.phases) else None
        b = plan.phases[p] if p < len(plan.phases) else None
        if b is None:
            return None if a is None else f"phase {a.name!r} dropped"
        if a is None:
            return (
                f"phase {b.name!r} added: {b.steps} steps at seq_len {b.seq_len}, "
                f"{b.global_batch * b.seq_len:,} tokens per step"
            )
        what = [] if a.name == b.name else [f"renamed from {a.name!r}"]
        if a.steps != b.steps:
            what.append(f"{a.steps} → {b.steps} steps")
        if a.seq_len != b.seq_len:
            what.append(f"phase[{p}].seq_len {a.seq_len} → {b.seq_len}")
        if a.global_batch * a.seq_len != b.global_batch * b.seq_len:
            what.append(f"{plan.key_of(p, 'global_batch')} {a.global_batch * a.seq_len:,} → "
                        f"{b.global_batch * b.seq_len:,} tokens per step")  # fmt: skip
        if _mix(old, a) != _mix(plan, b):
            what.append(f"{plan.key_of(p, 'mix')} {' → '.join(_mixes_shown(_mix(old, a), _mix(plan, b)))}")
        if a.lr != b.lr:
            what.append(f"its LR {_lr_text(a.lr)} → {_lr_text(b.lr)}")
        return f"phase {b.name!r}: " + ", ".join(what) if what else None

    if old.seed != plan.seed:
        raise refuse("data.seed", old.seed, plan.seed)
    if step == 0:
        return []
    p_old, k_old = old.locate(step - 1)
    # The sources the past read (a weight in a phase up to the current one): still there, in the
    # same relative order (a step's runs are placed in source order), the same data and held-out
    # split. Sources it never read may come, go or change.
    used = {s.name for q in range(p_old + 1) for s, a in zip(old.sources, old.phases[q].weights) if a}
    ours_by_name = {s.name: s for s in plan.sources}
    old_order = [s.name for s in old.sources if s.name in used]
    new_order = [s.name for s in plan.sources if s.name in used]
    if gone := [n for n in old_order if n not in ours_by_name]:  # renamed (or dropped): said by its key,
        # not as the order it changed (review RV50a F4)
        raise refuse(
            "the names of the sources read so far",
            old_order,
            [s.name for s in plan.sources],
            f"keep a [[data.sources]] entry named {gone[0]!r} (its name is how the plan knows the source)",
        )
    if old_order != new_order:
        raise refuse("the sources read so far (in order)", old_order, new_order, "keep them, in that order")
    for s in old.sources:
        ours = ours_by_name.get(s.name)
        if s.name not in used or ours is None:
            continue
        if not same_fingerprint(s.fingerprint, ours.fingerprint):
            # where it is, and where to look for the one trained (trial RV64a 2d: two hashes alone); a
            # relative path may be another directory's dataset, not a rebuilt one (review RV65d 4)
            here = f" at {ours.dataset}{working_directory_note(ours.dataset)}" if ours.dataset else ""
            rebuilt = (
                "" if relative_location(ours.dataset) else "; where that is this path, it was rebuilt since"
            )
            raise PlanError(
                f"the fingerprint of source {s.name!r} is {ours.fingerprint!r}{here}, but the checkpoint's "
                f"plan has {s.fingerprint!r}; the plan's past is immutable ({drawn}) — point the source at "
                f"the dataset the run started with (the run's config.toml names it{rebuilt}), or start a "
                "new run " + rule
            )
        if s.val_fraction != ours.val_fraction:
            what = f"the val_fraction of source {s.name!r} ({VAL_FRACTION_KEYS})"  # by its keys (RV64a 2b)
            raise refuse(what, s.val_fraction, ours.val_fraction)
        if s.tokens != ours.tokens:
            raise refuse(f"the training tokens of source {s.name!r}", s.tokens, ours.tokens)
    # Every phase trained so far keeps its batch before any budget or LR is compared: a batch changed
    # moves the step boundaries of a budget in tokens, and the LR refusal, raised first, named budgets
    # nobody changed, and not the batch (review R25j 4); past this loop the past's batches are equal.
    for p in range(p_old + 1):
        a, b = old.phases[p], plan.phases[p] if p < len(plan.phases) else None
        where = f"phase[{p}]"
        if b is None:
            raise refuse(f"{where} ({a.name!r})", a.name, None, "keep the phases already trained")
        for key in ("name", "seq_len"):
            if getattr(a, key) != getattr(b, key):
                raise refuse(f"{where}.{key}", getattr(a, key), getattr(b, key))
        if a.global_batch != b.global_batch:
            key = plan.key_of(p, "global_batch")
            if key.endswith("global_batch_tokens"):  # the recipe's key, in its unit (same seq_len by now)
                raise refuse(
                    f"{key} (phase {a.name!r})", a.global_batch * a.seq_len, b.global_batch * b.seq_len
                )
            raise refuse(f"{where}.global_batch", a.global_batch, b.global_batch)  # a plan without a recipe
    # (after the batches: a batch changed shortened the plan below the step trained, and was refused as
    # the total steps: review R25n 1)
    p_new, k_new = (
        plan.locate(step - 1) if plan.total_steps is None or step <= plan.total_steps else (None, None)
    )
    if p_new is None:
        raise refuse(
            "the total steps", old.total_steps, plan.total_steps, "keep at least the steps already done"
        )
    for p in range(p_old + 1):
        a, b = old.phases[p], plan.phases[p]
        mix_old = _mix(old, a)
        mix_new = _mix(plan, b)
        if mix_old != mix_new:
            theirs, ours = _mixes_shown(mix_old, mix_new)
            raise PlanError(
                f"the checkpoint's plan has {plan.key_of(p, 'mix')} = {theirs} but this run has {ours}; the "
                f"plan's past is immutable ({drawn}) — "
                "set it back, or start a new run " + rule
            )
        if p < p_old and (a.steps != b.steps or a.lr != b.lr):
            # the finished phases' changes alone: the current phase's budget may change where its LR so
            # far does not (a constant phase), and was listed to be set back (review R25n 2)
            raise refuse_lr(f"the budget or learning rate of phase {a.name!r}, finished and", p_old - 1)
    if (p_new, k_new) != (p_old, k_old):
        raise refuse(
            f"the phase of step {step}",
            old.phases[p_old].name,
            plan.phases[p_new].name,
            f"keep phase {old.phases[p_old].name!r} at least {k_old + 1} steps long (the steps done in it)",
        )
    # The learning rate so far: every step of the current phase (the earlier phases' pieces are
    # equal by now). The same pieces and budgets give the same curve: no need to walk the steps.
    first = old.first_step[p_old]
    same = [(ph.steps, ph.lr) for ph in old.phases[: p_old + 1]] == [
        (ph.steps, ph.lr) for ph in plan.phases[: p_old + 1]
    ]
    for s in range(first, first if same else step):
        if not math.isclose(old.lr(s), plan.lr(s), rel_tol=1e-12, abs_tol=0.0):
            if lr_changes(p_old):
                was, now = _shown_apart(old.lr(s), plan.lr(s))
                raise refuse_lr(f"the learning rate (step {s + 1}: {was} → {now}) of the {step} steps")
            raise refuse(
                f"the learning rate of step {s + 1} (phase {old.phases[p_old].name!r})",
                *_shown_apart(old.lr(s), plan.lr(s)),
            )
    changed = [line for p in range(p_old, max(len(old.phases), len(plan.phases))) if (line := future(p))]
    return ["the plan's future changed since the checkpoint: " + "; ".join(changed)] if changed else []


def cut_skip_notes(saved_total_steps: int | None, plan: Plan, skips: Sequence[Skip]) -> list[str]:
    """A note for each of a resumed run's `skips` (its timeline's) that ended at the last step of the
    checkpoint's plan (`saved_total_steps`) where this plan trains past it: cut there or not (the plan
    records no skip_steps: the rewind's line said which), a cut one a run of this plan from its start
    would have skipped on past (trial RV71d 1: the steps trained, unsaid). The skips are the timeline's,
    not the saved plan's: a checkpoint keeps them apart, and the note never came (trial RV74a 1)."""
    if saved_total_steps is None or (plan.total_steps is not None and plan.total_steps <= saved_total_steps):
        return []
    return [
        f"rewind {s.rewind} skipped steps {s.first_step}–{s.last_step}, to the plan's last step then: if "
        'its line said "cut at the plan\'s last step", the steps after it train now, where a run of this '
        "plan from its start would have skipped on, up to run.rewind.skip_steps steps after step "
        f"{s.checkpoint_step}"
        for s in skips
        if s.last_step == saved_total_steps
    ]


def _budget_change(old: Plan, plan: Plan, p: int, name: str, was: int, now: int) -> str:
    """`key old → new` for a step count of phase p (`steps`, `warmup_steps`) in the unit its key
    was written in: a budget given in tokens as written (`Plan.written`: the checkpoint's plan and
    this recipe's), with the steps they make (the plan compares steps: `phase[1].tokens 6 → 8`
    labelled steps with a tokens key, review R25c). Steps × tokens per step stand in for a side
    that records nothing as written (a checkpoint saved before plans recorded it); they are a budget
    rounded to whole steps (recipe.budget_notes). The past's batch is the same in both plans here
    (check_resume compares it first)."""
    key = plan.key_of(p, name)
    if not key.endswith("tokens"):
        return f"{key} {was} → {now}"
    per = plan.phases[p].global_batch * plan.phases[p].seq_len
    steps = f"phase {plan.phases[p].name!r}: {was} → {now} steps of {per:,} tokens"
    shown = [_budget_shown(side.written_of(p).get(name), n * per) for side, n in ((old, was), (plan, now))]
    return f"{key} {shown[0]} → {shown[1]} ({steps})"


def _budget_shown(written: float | None, trained: int) -> str:
    """A budget in tokens as written (3300, not the 3072 of its whole steps); `trained` when unknown."""
    return str(trained) if written is None else tokens_shown(written)


def _mix(plan: Plan, ph: Phase) -> dict[str, str]:
    """A phase's mix by source name, exact (as reduced fractions: 0.8/0.2 → 4/5, 1/5)."""
    total = sum(ph.weights)
    return {s.name: str(Fraction(a, total)) for s, a in zip(plan.sources, ph.weights) if a}


def _mixes_shown(a: dict[str, str], b: dict[str, str]) -> tuple[str, str]:
    """Two mixes that differ as the user writes them, `{ web = 0.6, code = 0.4 }` (not the exact
    fractions compared), a share in both with the digits that tell it apart (0.1 and 0.1000001 both
    read `math = 0.1`: trial RV78a 2)."""

    def shown(mix: dict[str, str], other: dict[str, str]) -> str:
        shares = [
            _shown_apart(Fraction(f), Fraction(other[n]))[0] if other.get(n, f) != f else _shown(Fraction(f))
            for n, f in mix.items()
        ]
        return "{ " + ", ".join(f"{n} = {share}" for n, share in zip(mix, shares)) + " }"

    return shown(a, b), shown(b, a)


def _shown(v: Any) -> str:
    """A value as written in a recipe: 0.003, not 0.0030000000000000005 or Fraction(3, 1000)."""
    return f"{float(v):.6g}" if isinstance(v, float | Fraction) else str(v)


def _shown_apart(a: Any, b: Any) -> tuple[str, str]:
    """Two values that differ, shown with the digits that tell them apart (a refusal showed a longer
    cosine's learning rate at a step as 0.00287394 → 0.00287394)."""
    if not all(isinstance(v, float | Fraction) for v in (a, b)):
        return _shown(a), _shown(b)
    for digits in range(6, 18):
        x, y = f"{float(a):.{digits}g}", f"{float(b):.{digits}g}"
        if x != y:
            break
    return x, y


def _lr_text(piece: LRPiece | None) -> str:
    if piece is None:
        return "none"
    warmup = f"warmup {piece.warmup_steps} steps, " if piece.warmup_steps else ""
    scaled = f" (× {piece.scale:.4g}: optim.batch_lr_scaling)" if piece.scale != 1.0 else ""
    return f"[{warmup}{piece.shape} from {_shown(piece.peak)} to {_shown(piece.end)}{scaled}]"


def _lr_record(piece: LRPiece) -> dict[str, Any]:
    """A piece as a plan description holds it: `scale` only where a batch rule set one (a plan of
    LRs as written describes itself as before the rule existed)."""
    d = asdict(piece)
    if d["scale"] == 1.0:
        del d["scale"]
    return d
