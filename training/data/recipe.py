"""A training recipe's data plan: its sources opened and checked, the Plan built, shown as a table.

`open_plan(cfg, spec)` is what the trainer, `gristmill train --plan` and `gristmill data inspect
RUN` share: each source of the resolved recipe (training/data/spec.RunSpec) has its training
split opened (training/data/reader.py), the sources checked to share one tokenizer, and the
recipe's phases turned into a training/data/plan.Plan. Needs no torch, so `--plan` answers in
about a second.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from training.config import DataSection, OptimSection, RewindSection, RunSection, TrainConfig
from training.config_checks import batch_lr_factor, merge_unkept
from training.console import console, say
from training.contract.atomic_write import atomic_path, write_atomic
from training.contract.dataset_format import (
    DATASET_JSON,
    DOCUMENTS_SUM,
    TOKENIZER_JSON,
    DatasetError,
    data_identities,
    same_data,
    tokenizer_differences,
    two_hashes,
    working_directory_note,
)
from training.contract.dataset_index import DOC_HASHES, rows_among
from training.contract.heldout import heldout_rows
from training.contract.run_layout import (
    CONFIG_TOML,
    DATA_PLAN_JSON,
    complete_steps,
    read_json_record,
)
from training.data import plan as data_plan
from training.data.block_cache import check_room, gb_holding
from training.data.reader import DocumentTable
from training.data.remote import CacheSettings, tokenizer_dir
from training.data.spec import RunSpec, batch_key
from training.plotting import agg_pyplot, save_figure


@dataclasses.dataclass(frozen=True)
class TrainedPlan:
    """The plan a run has trained (RUN/data_plan.json's, or the checkpoint a resume continues: `where`),
    by its sources' names and fingerprints: what open_sources takes as the run's history."""

    where: str
    fingerprints: dict[str, str]
    known: bool = True
    """False (TrainedPlan.unknown): which pairs the run trained cannot be told when the sources are
    opened, so open_sources leaves them to the resume: a `train` resume's check_same_documents once its
    checkpoint is loaded, or its refusal of checkpoints that are all unreadable (`train --plan`)."""
    loader_state: dict[str, Any] | None = None
    """The checkpoint's loader state (a checkpoint's plan), which `train --plan --resume` loads as the
    resume does: its refusal of a changed past, and its notes on the future."""
    skips: tuple[data_plan.Skip, ...] = ()
    """The rewinds' skips a resume from the checkpoint has (its timeline's): `train --plan --resume`'s
    table and notes on skips cut at the plan's end are of these, not of the run directory's record,
    whose skips another checkpoint may not have (review RV74d 4, re-trial RV74e F2)."""
    checkpoint: Path | None = None
    """That checkpoint, whose model and [merge] `train --plan --resume` checks as the resume does."""

    @classmethod
    def of(
        cls,
        where: str,
        description: dict[str, Any],
        loader_state: dict[str, Any] | None = None,
        skips: tuple[data_plan.Skip, ...] = (),
        checkpoint: Path | None = None,
    ) -> TrainedPlan:
        fingerprints = {s["name"]: s["fingerprint"] for s in description.get("sources", [])}
        return cls(where, fingerprints, loader_state=loader_state, skips=skips, checkpoint=checkpoint)

    @classmethod
    def unknown(cls, where: str) -> TrainedPlan:
        return cls(where, {}, known=False)

    def holds(self, name: str, info: dict[str, Any]) -> bool:
        """Whether the plan has source `name` reading the dataset whose dataset.json is `info`."""
        return name in self.fingerprints and same_data(self.fingerprints[name], info)


def open_sources(
    spec: RunSpec, expect_vocab_size: int | None = None, trained: TrainedPlan | None = None
) -> list[DocumentTable]:
    """Each source's training split (in the spec's order); one tokenizer across them, or a DatasetError.
    Sources in a bucket are read through the spec's cache. `trained`: the plan the run has trained
    (checkpoint/io.trained_plan, or RUN/data_plan.json's), for check_same_documents; an unknown one
    leaves that check to the resume."""
    sources = spec.sources
    cache = spec.cache
    tables = [
        DocumentTable(
            s.dataset,
            split="train",
            val_fraction=s.val_fraction,
            expect_vocab_size=expect_vocab_size,
            cache=cache,
        )
        for s in sources
    ]
    seen: dict[object, tuple[str, DocumentTable]] = {}
    for src, t in zip(sources, tables):
        # One directory (or a link to it, a byte copy, or a copy `data convert` rewrote) under two
        # names: every window trained twice, and one source's held-out documents trained in the other.
        for key in [t.root.resolve(), *sorted(data_identities(t.info))]:
            if key not in seen:
                seen[key] = (src.name, t)
                continue
            name, other = seen[key]
            how = "one directory" if isinstance(key, Path) else "one fingerprint: the same documents"
            raise DatasetError(_same_dataset(name, other, src.name, t, how))
    if trained is None or trained.known:  # else the resume decides, with the plan it takes (see below)
        check_same_documents([s.name for s in sources], tables, trained)
    first_name, first = sources[0].name, tables[0]
    for src, t in zip(sources[1:], tables[1:]):
        name = src.name
        for key in ("separator", "vocab_size"):
            if t.info[key] != first.info[key]:
                raise DatasetError(
                    f"{t.location}/{DATASET_JSON}: source {name!r} has {key} {t.info[key]!r} but source "
                    f"{first_name!r} ({first.location}) has {first.info[key]!r}; every source of a run must "
                    "be built with the same tokenizer and separator (rebuild it with the other's "
                    "tokenizer.json)"
                )
        if t.info["tokenizer_sha256"] != first.info["tokenizer_sha256"]:
            _check_same_tokenizer((first_name, sources[0].dataset), (name, src.dataset), cache)
    return tables


def check_same_documents(
    names: Sequence[str], tables: Sequence[DocumentTable], trained: TrainedPlan | None
) -> None:
    """Sources `names` (their `tables`) holding the same documents under two fingerprints (a build
    with other shard settings: held-out documents are chosen by row, so each source trains on the
    other's), told by their sum (dataset_index.DOCUMENTS_SUM; a dataset that has none is checked by
    open_sources' keys alone), are refused, but for a pair `trained`, the plan the run has trained,
    reads as they are now. A `train` resume decides it once the checkpoint is loaded, with that
    checkpoint's plan (training/run/setup.py: not `train --plan`'s newest whose plan reads, which a
    resume passes over if its files do not verify: review RV33d F1); None: a start from step 0."""
    seen: dict[str, tuple[str, DocumentTable]] = {}
    for name, t in zip(names, tables):
        # (one source has nothing to compare: not summed, RV32b F7)
        if len(tables) < 2 or (documents := t.index.documents_sha256_sum()) is None:
            continue
        if documents not in seen:
            seen[documents] = (name, t)
            continue
        first, other = seen[documents]
        if trained and trained.holds(first, other.info) and trained.holds(name, t.info):
            # A run that trained such a pair (an older gristmill's, or a sum recorded since it
            # started: an upload, `data index`) cannot change its past: refusing its resume, fork,
            # inspect and verify only lost the run (review RV31b F1). Said, and it goes on. Only that
            # pair: a source added or changed since, or a start from step 0, is a new pair (RV32b F1).
            held = [f"val/{n}" for n, s in ((first, other), (name, t)) if s.val_fraction > 0]
            scored = f", so {' and '.join(held)} score text it trains on" if held else ""
            say(
                f"warning: sources {first!r} and {name!r} hold the same documents ({other.location} "
                f"and {t.location}: one {DOCUMENTS_SUM}), and the plan this run has trained "
                f"({trained.where}) reads both: each document is read twice{scored}; a new run gives "
                "one source that dataset"
            )
            continue
        how = (
            "the same documents under another fingerprint: each document read by both, and where "
            "their order differs, the documents one holds out trained in the other"
        )
        raise DatasetError(_same_dataset(first, other, name, t, how))
    partly_shared(names, tables)


def partly_shared(names: Sequence[str], tables: Sequence[DocumentTable]) -> None:
    """One warning line for each pair of sources `names` (their `tables`) that share some documents but
    not all (their sums differ: one sum is check_same_documents'). A filtered subset of a corpus beside
    the corpus upsamples it, a practice; but held-out documents are chosen by manifest row in each
    source, so the documents one holds out the other may train on: val/NAME scored trained text, with
    no word (trial RV70b 1). Compared where the open summed doc_sha256.bin (its records kept from that
    read: DocIndex.take_summed_hashes), by rank 0, which alone says it."""
    hashes = [t.index.take_summed_hashes() for t in tables]  # let go on every rank
    if console.rank != 0:
        return
    for i, j in itertools.combinations(range(len(tables)), 2):
        a, b = tables[i], tables[j]
        if hashes[i] is None or hashes[j] is None:
            continue
        if a.index.documents_sha256_sum() == b.index.documents_sha256_sum():
            continue  # the same documents: refused above, or the warning of a pair the run trained
        every = [np.arange(len(h)) for h in (hashes[i], hashes[j])]
        rows_a = rows_among(hashes[i], hashes[j], *every)
        if len(rows_a):
            rows_b = rows_among(hashes[j], hashes[i], every[1], rows_a)
            pairs = ((i, j, rows_a, rows_b), (j, i, rows_b, rows_a))
            trained = {x: _held_trained(x, y, shares, other, tables, hashes) for x, y, shares, other in pairs}
            say(_partly_shared_line(names, tables, (i, j), len(rows_a), trained))


def _held_trained(
    x: int,
    y: int,
    shares: np.ndarray,
    other: np.ndarray,
    tables: Sequence[DocumentTable],
    hashes: list[np.ndarray | None],
) -> int:
    """How many documents source `x` holds out (of its rows `shares` that `y` holds) source `y` trains
    on (of its rows `other` that `x` holds): held-out documents are the rows heldout_rows picks."""
    held = shares[heldout_rows(shares, tables[x].val_fraction)]
    trained = other[~heldout_rows(other, tables[y].val_fraction)]
    return len(rows_among(hashes[x], hashes[y], held, trained))


def _partly_shared_line(
    names: Sequence[str],
    tables: Sequence[DocumentTable],
    pair: tuple[int, int],
    shared: int,
    trained: dict[int, int],
) -> str:
    i, j = pair
    a, b = tables[i], tables[j]
    head = (
        f"warning: sources {names[i]!r} and {names[j]!r} share documents ({a.location} and {b.location}): "
        f"{shared} of the {a.index.n_rows} of {names[i]!r} are among the {b.index.n_rows} of {names[j]!r}, "
        "each read by both"
    )
    scored = [x for x in pair if trained[x]]
    if not scored:
        return (
            f"{head}; neither trains on a document the other holds out: an upsampling, if meant; else "
            "build the sources disjoint (filter the shared documents out of one)"
        )
    other = {i: j, j: i}
    held = "; ".join(
        f"val/{names[x]} holds out {tables[x].index.n_rows - tables[x].documents} documents, {trained[x]} "
        f"of them in the training split of {names[other[x]]!r}"
        for x in scored
    )
    vals = " and ".join(f"val/{names[x]}" for x in scored)
    # both: one alone holding nothing out trains what the other holds out (review RV70f 5)
    # (of those not there yet: one at 0 already was named too, trial RV74b 3)
    zero = " and ".join(f"data.sources[{x}].val_fraction=0" for x in pair if tables[x].val_fraction > 0)
    return (
        f"{head}; {held}, so {vals} {'scores' if len(scored) == 1 else 'score'} text the run trains on; "
        f"build the sources disjoint (filter the shared documents out of one), or set {zero} (a training "
        "run's: a mixture search scores every source's held-out documents), or accept it"
    )


def _same_dataset(first: str, other: DocumentTable, name: str, t: DocumentTable, how: str) -> str:
    return (
        f"sources {first!r} and {name!r} are the same dataset ({other.location} and "
        f"{t.location}, {how}); a mixture reads each dataset once: give one source that "
        "dataset and raise its mix weight"
    )


def _check_same_tokenizer(
    first: tuple[str, str | Path], other: tuple[str, str | Path], cache: CacheSettings
) -> None:
    """Two sources whose tokenizer.json files differ in bytes are one tokenizer when they decide the
    ids alike (tokenizer_differences, the rule a base's data is checked by: a transformers re-save
    writes other bytes for the same vocabulary, merges and special tokens); else a DatasetError
    naming what differs."""
    (a_name, a_where), (b_name, b_where) = first, other
    a, b = tokenizer_dir(a_where, cache) / TOKENIZER_JSON, tokenizer_dir(b_where, cache) / TOKENIZER_JSON
    if not a.is_file() or not b.is_file():
        differ = f"tokenizer_sha256, and {a if not a.is_file() else b} is not there to compare by content"
    else:
        try:
            differ = ", ".join(tokenizer_differences(a, b))
        except ValueError as e:
            differ = f"tokenizer.json ({a} or {b} is not valid JSON: {e})"
    if differ:
        raise DatasetError(
            f"sources {a_name!r} ({a}) and {b_name!r} ({b}) have other tokenizers: they differ in {differ} "
            "(what decides the ids, compared so that a re-saved copy matches); every source of a run "
            "must be built with the same tokenizer and separator (rebuild one with the other's "
            "tokenizer.json)"
        )


def build_plan(cfg: TrainConfig, spec: RunSpec, tables: list[DocumentTable]) -> data_plan.Plan:
    """The recipe's plan over the sources' training splits (`tables`, in the spec's order).

    Each source is read at most its max_epochs times (unlimited for data.dataset with [schedule],
    once under [[phase]]: training/data/spec.resolve).
    """
    sources = [data_plan.Source.of(t, s.name, s.max_epochs) for s, t in zip(spec.sources, tables)]
    phases, prev_end, first_batch = [], 0.0, spec.phases[0].global_batch_tokens
    for p, ph in enumerate(spec.phases):
        lr = ph.lr
        # the LRs as written (a phase without a peak continues the previous one's written curve),
        # then scaled by the phase's batch rule: the plan holds the LR each step really gets
        peak = lr.peak if lr.peak is not None else (cfg.optim.lr if p == 0 else prev_end)
        end = peak if lr.shape == "constant" else (cfg.optim.min_lr if lr.to is None else lr.to)
        weights = data_plan.integer_weights([ph.mix.get(s.name, 0.0) for s in sources])
        gb = ph.global_batch_tokens // ph.seq_len
        scale = batch_lr_factor(cfg.optim.batch_lr_scaling, ph.global_batch_tokens, first_batch)
        piece = data_plan.LRPiece(peak * scale, end * scale, lr.shape, lr.warmup_steps or 0, scale=scale)
        phases.append(data_plan.Phase(ph.name, ph.steps, ph.seq_len, gb, weights, piece))
        prev_end = peak if (lr.warmup_steps or 0) >= ph.steps else end
    return data_plan.Plan(
        sources, phases, cfg.data.seed, keys=plan_keys(cfg, spec), written=written_budgets(cfg)
    )


def written_budgets(cfg: TrainConfig) -> list[dict[str, float]]:
    """Per phase, its budgets given in tokens as the recipe wrote them, under the plan field they
    make whole steps of (Plan.written: a refused resume names them as written, not rounded)."""
    return [
        {
            **({"steps": ph.tokens} if ph.tokens is not None else {}),
            **({"warmup_steps": ph.lr.warmup_tokens} if ph.lr.warmup_tokens is not None else {}),
        }
        for ph in cfg.phase  # the one-phase [schedule] form gives its budget in steps
    ]


def plan_keys(cfg: TrainConfig, spec: RunSpec) -> list[dict[str, str]]:
    """Per phase, the config key each plan field comes from (build_plan's rules above), so a refused
    resume says `optim.lr 0.003 → 0.001`, not the plan's LR piece, and a non-finite stop's advice
    names the key that sets the diverged phase's LR. `spec`: the phases resolved (their steps and
    warmup_steps), for build_plan's rule that a phase all warmup ends at its peak."""
    if not cfg.phase:  # the one-phase [schedule] form (data/spec.resolve)
        sched = {"warmup_steps": "schedule.warmup_steps", "steps": "schedule.steps", "mix": "data.sources",
                 "global_batch": batch_key(cfg, 0), "scale": "optim.batch_lr_scaling",
                 "seq_len": "data.seq_len"}  # fmt: skip
        return [
            {"peak": "optim.lr", "end": "optim.min_lr", "shape": "schedule", "start": "optim.lr", **sched}
        ]
    out: list[dict[str, str]] = []
    ended = "optim.lr"  # the key of where the previous phase's LR ended (build_plan's prev_end)
    for p, ph in enumerate(cfg.phase):
        k = f"phase[{p}]"
        end = f"{k}.lr.to" if ph.lr.to is not None else "optim.min_lr"
        peak = f"{k}.lr.peak" if ph.lr.peak is not None else ended
        out.append({
            "peak": peak, "end": peak if ph.lr.shape == "constant" else end, "shape": f"{k}.lr.shape",
            "start": ended if out else f"{k}.lr.peak",
            "warmup_steps": f"{k}.lr.warmup_{'tokens' if ph.lr.warmup_tokens is not None else 'steps'}",
            "steps": f"{k}.{'tokens' if ph.tokens is not None else 'steps'}", "mix": f"{k}.mix",
            "global_batch": batch_key(cfg, p), "scale": "optim.batch_lr_scaling",
            "seq_len": f"{k}.seq_len" if ph.seq_len is not None else "data.seq_len",
        })  # fmt: skip
        resolved = spec.phases[p]  # a phase all warmup ends at its peak
        all_warmup = resolved.steps is not None and (resolved.lr.warmup_steps or 0) >= resolved.steps
        ended = peak if all_warmup else out[-1]["end"]
    return out


def mix_notes(spec: RunSpec) -> list[str]:
    """A line per phase whose mix weights do not sum to 1: the plan trains their shares, so say them."""
    notes = []
    for ph in spec.phases:
        if not math.isclose(sum(ph.mix.values()), 1.0, rel_tol=1e-9):
            top = max(ph.mix.values())  # weights near the largest float sum to inf (trial RV70b 4)
            total = sum(w / top for w in ph.mix.values())
            shares = ", ".join(f"{name} {w:g}→{w / top / total:.3g}" for name, w in ph.mix.items())
            notes.append(f"mix of phase {ph.name!r} normalised: {shares}")
    return notes


def budget_notes(cfg: TrainConfig, spec: RunSpec) -> list[str]:
    """A line per phase whose budget in tokens is not a whole number of its steps: it rounds down (a
    phase never trains past its budget), so say what it trains (review R24a 3)."""
    notes = []
    for asked, ph in zip(cfg.phase, spec.phases):
        trained = ph.steps * ph.global_batch_tokens
        if asked.tokens is not None and asked.tokens != trained:
            notes.append(
                f"phase {ph.name!r}: tokens = {asked.tokens:,.0f} is {ph.steps:,} whole "
                f"step{'s' if ph.steps != 1 else ''} of "
                f"{ph.global_batch_tokens:,} tokens, {trained:,} tokens (a budget in tokens rounds down to "
                "whole steps)"
            )
    return notes


def batch_notes(cfg: TrainConfig, spec: RunSpec) -> list[str]:
    """A line per phase whose batch differs from the first phase's: the ratio, and what the LR does
    about it (optim.batch_lr_scaling)."""
    rule, first = cfg.optim.batch_lr_scaling, spec.phases[0].global_batch_tokens
    notes = []
    for ph in spec.phases[1:]:
        if ph.global_batch_tokens != first:
            ratio = ph.global_batch_tokens / first
            factor = batch_lr_factor(rule, ph.global_batch_tokens, first)
            lr = f"its LR pieces × {factor:.4g}" if rule != "none" else "its LRs as written"
            notes.append(
                f"phase {ph.name!r} trains {ph.global_batch_tokens:,} tokens per step, {ratio:.4g}× the "
                f"first phase's; optim.batch_lr_scaling = {rule!r}: {lr}"
            )
    return notes


def open_plan(
    cfg: TrainConfig,
    spec: RunSpec,
    expect_vocab_size: int | None = None,
    resumed: tuple[Path, str | None] | None = None,
    trained: TrainedPlan | None = None,
) -> tuple[data_plan.Plan, list[DocumentTable], list[str]]:
    """(plan, training-split tables, notes): the plan checked for supply (a source that would run out
    is a PlanError before any work); the notes are recipe_notes and the supply's. `resumed`: the run
    directory a resume continues and the data order it recorded, checked first (open_run_sources).
    `trained`: the plan the run has trained (open_sources)."""
    tables = (
        open_sources(spec, expect_vocab_size, trained)
        if resumed is None
        else open_run_sources(*resumed, spec, expect_vocab_size, trained)
    )
    plan = build_plan(cfg, spec, tables)
    return plan, tables, recipe_notes(cfg, spec, tables, plan) + plan.check_supply()


def recipe_notes(
    cfg: TrainConfig, spec: RunSpec, tables: list[DocumentTable], plan: data_plan.Plan
) -> list[str]:
    """What the run's header and `--plan` say about the recipe: the mixes, the batches, validation
    asked for with nothing held out, a data.seq_len no phase uses (the cache: check_run_room's), a
    budget in tokens rounded down to whole steps, merge points no checkpoint keeps."""
    notes = mix_notes(spec) + budget_notes(cfg, spec) + batch_notes(cfg, spec)
    notes += validation_notes(cfg, spec) + unused_notes(cfg) + documents_sum_notes(spec, tables)
    return notes + merge_unkept(cfg, spec.last_step)


def documents_sum_notes(spec: RunSpec, tables: list[DocumentTable]) -> list[str]:
    """One line when a mixture's source has no sum of its documents' sha256 at hand (indexed before the
    record: a bucket's, or over what the open sums) though its documents have one: open_sources could
    not tell it from another source of the same documents, which the user can fix in one command. None
    for one source, or a dataset whose documents have no sha256 (nothing to record)."""
    if len(tables) < 2:
        return []
    lacking = [
        f"{s.name!r} ({t.location})"
        for s, t in zip(spec.sources, tables)
        if DOC_HASHES in t.index.entry["files"] and t.index.documents_sha256_sum() is None
    ]
    if not lacking:
        return []
    return [
        f"source(s) {', '.join(lacking)} record no index.{DOCUMENTS_SUM}, so another source holding the same "
        "documents in another order is not refused; `gristmill data index DIR` records it (a bucket's: index "
        "the local copy, then `gristmill data upload DIR URL` again)"
    ]


def unused_notes(cfg: TrainConfig) -> list[str]:
    """A line for each setting that changes nothing here, set to other than its default: a default
    every [[phase]] overrides (`--set data.seq_len=…` where each phase sets its own, `optim.lr` where
    the first phase sets its peak), one every [[data.sources]] overrides (data.val_fraction where each
    sets its own, as a run's config.toml writes them: review R25b 4), or a setting of a feature that
    is off (`run.max_skipped` without on_nonfinite = "skip", `[run.rewind]` without a rewind,
    `optim.muon_*` without Muon, the spike window without spike detection, `optim.fused` without
    torch's AdamW). They were
    accepted and said nothing, while a resume's note listed a change of them as in effect. Notes, not
    refusals: `--set run.on_spike=report` turns a rewind recipe's rewinds off, a resume's advice may
    be `--set optim.name=adamw`, and runs saved with such keys must still resume, export, evaluate."""
    r, o, phases = cfg.run, cfg.optim, cfg.phase
    rewinds = "rewind" in (r.on_spike, r.on_nonfinite)
    unused = [  # (key, its value, its default, why it changes nothing, whether it does not)
        ("data.seq_len", cfg.data.seq_len, DataSection().seq_len,
         "every [[phase]] sets its own seq_len", bool(phases) and all(ph.seq_len for ph in phases)),
        ("data.global_batch_tokens", cfg.data.global_batch_tokens, DataSection().global_batch_tokens,
         "every [[phase]] sets its own global_batch_tokens",
         bool(phases) and all(ph.global_batch_tokens for ph in phases)),
        ("data.micro_batch", cfg.data.micro_batch, DataSection().micro_batch,
         "every [[phase]] sets its own micro_batch", bool(phases) and all(ph.micro_batch for ph in phases)),
        ("data.val_fraction", cfg.data.val_fraction, DataSection().val_fraction,
         "every [[data.sources]] sets its own val_fraction",
         bool(cfg.data.sources) and all(src.val_fraction is not None for src in cfg.data.sources)),
        ("optim.lr", o.lr, OptimSection().lr,
         "phase[0].lr.peak is the first peak (a later phase continues or sets its own)",
         bool(phases) and phases[0].lr.peak is not None),
        ("optim.min_lr", o.min_lr, OptimSection().min_lr,
         "every [[phase]] ends where its lr.to says (or is constant)",
         bool(phases) and all(ph.lr.to is not None or ph.lr.shape == "constant" for ph in phases)),
        ("run.max_skipped", r.max_skipped, RunSection().max_skipped,
         f"run.on_nonfinite = {r.on_nonfinite!r} skips no step", r.on_nonfinite != "skip"),
        ("run.spike_window", r.spike_window, RunSection().spike_window,
         "run.spike_sigma = 0 turns spike detection off", r.spike_sigma == 0),
        ("optim.fused", o.fused, OptimSection().fused,
         f"optim.name = {o.name!r} (the fused kernel is torch's AdamW's)", o.name != "adamw"),
        *((f"run.rewind.{f.name}", getattr(r.rewind, f.name), f.default,
           "neither run.on_spike nor run.on_nonfinite is 'rewind'", not rewinds)
          for f in dataclasses.fields(RewindSection)),
        *((f"optim.{f.name}", getattr(o, f.name), f.default, f"optim.name = {o.name!r}", o.name != "muon")
          for f in dataclasses.fields(OptimSection) if f.name.startswith("muon_")),
    ]  # fmt: skip
    return [f"{key} = {json.dumps(value)} changes nothing: {why}" for key, value, default, why, dead in unused
            if dead and value != default]  # fmt: skip


def validation_notes(cfg: TrainConfig, spec: RunSpec) -> list[str]:
    """A line when run.val_every asks for validation but no source holds documents out: the run has
    no val_loss, which nothing else would say."""
    if cfg.run.val_every <= 0 or any(s.val_fraction > 0 for s in spec.sources):
        return []
    return [
        f"no validation: run.val_every = {cfg.run.val_every}, but no source holds documents out (every "
        "val_fraction is 0: data.val_fraction, or a [[data.sources]] entry's own); set one (e.g. 0.01) "
        "for a val_loss"
    ]


def check_run_room(spec: RunSpec, loader: Any, validation: Any) -> list[str]:
    """Refuse (DatasetError), before any work, a data.cache_gb below what the run reads from buckets at
    once: the training loader's need from step 0 (`loader`, a TokenLoader: TokenLoader.cache_need, the
    largest over the whole plan; a plan of at most MAX_AHEAD_STEPS steps, the samples of the groups its
    steps read, no more: R19e 1) and its validation loaders' held-out reads (`validation`:
    run.validation.Validation or None), together: checked in two steps, the first refusal quoted a
    figure the second refused (reviews R19b 6, R19d 3). The one check of train and `train --plan`
    (R16b, R19d 4); from step 0, so a resume is checked as its start was. Returns the line the run's
    header and `--plan` say of it: the figure checked, not another (R19f 1)."""
    training = loader.cache_need()
    held_out = validation.cache_need() if validation is not None else []
    check_room(training + held_out, spec.cache)
    if not training:
        return []
    # each figure rounded up, as the refusal's: never below what is kept (R19g 1). "Needs", not "keeps
    # at most": what no loader keeps stays cached until room is needed (review R20a 3)
    validation_part = f", validation {gb_holding(sum(n for _, n in held_out)):g} GB" if held_out else ""
    return [
        f"the bucket sources are read by range through data.cache_gb = {spec.cache.max_bytes / 1e9:g} on "
        f"this node; the training needs {gb_holding(sum(n for _, n in training)):g} GB of them at once"
        + validation_part
    ]


def record_plan(plan: data_plan.Plan, run_dir: Path, skips: Sequence[data_plan.Skip] = ()) -> None:
    """RUN/data_plan.json: the plan the run trains (each source's fingerprint) and its timeline's
    skips, readable without torch: `data inspect RUN` checks the datasets against it and marks the
    skipped steps, the audit's `skips` view reads it."""
    write_atomic(run_dir / DATA_PLAN_JSON, plan.to_json(skips))


def recorded_plan_fix(run_dir: Path) -> str:
    """What rewrites a run's data_plan.json: the trainer writes it at every start, from the plan
    the run's newest checkpoint holds (its rewinds' skips included). A run with no complete
    checkpoint has no plan to write it from: the resume advised trained it again from step 0, its
    records set aside (review R22a B3)."""
    if not complete_steps(run_dir):
        return (
            "no checkpoint of the run holds its plan to write it from "
            "(a run started again trains from step 0)"
        )
    return (
        f"the trainer writes it again from the run's newest checkpoint: gristmill train --config "
        f"{run_dir / CONFIG_TOML} --resume auto (a finished run trains nothing)"
    )


def _or_the_plan_changed(run_dir: Path) -> str:
    """The other side of a config (or dataset) that differs from RUN/data_plan.json: the plan itself
    damaged or edited, where setting the config "back" to its values read other batches than the
    run's (review R14c F7)."""
    return (
        f" (if they are as the run left them, {run_dir / DATA_PLAN_JSON} is what changed: "
        f"{recorded_plan_fix(run_dir)})"
    )


def recorded_plan(run_dir: Path, sources: bool = True) -> dict[str, Any] | None:
    """RUN/data_plan.json, parsed (None when the run recorded none: started before it existed); a
    damaged one is a DatasetError naming it and what rewrites it. Each source's name and fingerprint,
    which every reader of the sources takes, are checked here: every plan recorded both since the first
    (44980ef), and one without was a KeyError traceback from inspect, verify and the audit (review RV32d
    5). `sources=False`: not checked, for the readers of its rewinds and phases alone, which a damaged
    source line leaves readable: they lost the skips to it (review RV32g D)."""
    path = run_dir / DATA_PLAN_JSON
    try:
        plan = read_json_record(path, "sources")
        for i, source in enumerate(plan["sources"] if plan and sources else []):
            if not isinstance(source, dict):
                raise ValueError(f"sources[{i}] is not an object")
            if missing := [k for k in ("name", "fingerprint") if not isinstance(source.get(k), str)]:
                raise ValueError(f"sources[{i}] has no string {missing[0]!r}")
    except ValueError as e:
        raise DatasetError(f"{path} is damaged ({e}); {recorded_plan_fix(run_dir)}") from None
    return plan


# The data order of a run whose checkpoint holds the loader state of gristmill 62f489d or earlier
SINGLE_STATE_ORDER = "one-dataset"
PLAN_RECORDED_COMMIT = "44980ef"  # the first gristmill whose runs write RUN/data_plan.json


def plan_not_found(run_dir: Path) -> str:
    """Why a run without RUN/data_plan.json is refused by its readers (`data inspect RUN`, `verify RUN`, the
    audit of a run that has started): deleted, or never written (a run of gristmill before 44980ef), what
    the run trained, and in which data order, is not recorded, and an older order's batches are not this
    version's (review R26c S2); with what writes the file again."""
    return (
        f"{run_dir / DATA_PLAN_JSON} not found (deleted, or the run started before gristmill "
        f"{PLAN_RECORDED_COMMIT} recorded it): the run's datasets and data order are unknown, and a run "
        "of an older gristmill drew its batches in an order this version does not compute (see it with "
        f"the gristmill that trained it); {recorded_plan_fix(run_dir)}"
    )


def open_run_sources(
    run_dir: Path,
    order: str | None,
    spec: RunSpec,
    expect_vocab_size: int | None = None,
    trained: TrainedPlan | None = None,
) -> list[DocumentTable]:
    """open_sources for a run that exists (inspected, verified, resumed) whose batches were drawn in
    data order `order` (its data_plan.json's format, or its checkpoint's: None, not recorded), refused
    first when that is an older gristmill's order which this version does not compute for its
    datasets: they would show, or train, other batches (review R26c S2). A run of order /1 whose
    dataset this version cannot open yet (an older index) is refused too, before the `gristmill data
    index` the opening would ask for: that upgrade would not make the run this version's. `trained`:
    the plan the run has trained (open_sources)."""
    from training.data.loader import old_order_message, plan_1_differs

    if order in (None, data_plan.PLAN_FORMAT):
        return open_sources(spec, expect_vocab_size, trained)
    if order != data_plan.PLAN_FORMAT_1:
        raise DatasetError(old_order_message(str(run_dir), order))
    try:
        tables = open_sources(spec, expect_vocab_size, trained)
    except DatasetError as e:
        raise DatasetError(old_order_message(str(run_dir), order, unknown=str(e))) from None
    if differ := plan_1_differs(tables):
        raise DatasetError(old_order_message(str(run_dir), order, differ))
    return tables


def check_recorded_plan(
    run_dir: Path, plan: data_plan.Plan, tables: list[DocumentTable], description: dict[str, Any]
) -> None:
    """Refuse (DatasetError) a plan rebuilt from RUN/config.toml that is not the one the run recorded
    (RUN/data_plan.json): a source's dataset or held-out fraction, the seed, a phase's budget, batch,
    seq_len, mix or LR. Every command after the run reads config.toml again, so a hand edit (or one a
    refused resume left) would have them show batches the run never trained. A note when the run
    recorded nothing (started before data_plan.json)."""
    path = run_dir / DATA_PLAN_JSON
    damaged = _or_the_plan_changed(run_dir)
    for src, t in zip(plan.sources, tables):
        check_trained_on(
            run_dir, src.name, t.location, t.info, "it was rebuilt or replaced, so its batches are not what "
            f"the model saw: point the source back at the dataset the run trained on{damaged}", description,
            val_fraction=src.val_fraction,
        )  # fmt: skip
    found = data_plan.recorded_difference(description, plan)
    if found is not None:
        key, recorded, now = found
        raise DatasetError(
            f"{run_dir / CONFIG_TOML} has {key} = {now}, but the run trained with {recorded} ({path}): "
            "the config was edited after the run, so the batches or learning rates read from it would not "
            "be the run's; "
            f"set it back{damaged}"
        )


def check_trained_on(
    run_dir: Path,
    source: str,
    location: Any,
    info: dict[str, Any],
    consequence: str,
    description: dict[str, Any] | None = None,
    *,
    val_fraction: float | None = None,
    tokenizer_only: bool = False,
) -> None:
    """Refuse (DatasetError) the dataset at `location` (its dataset.json: `info`) as source `source`
    of the run when RUN/data_plan.json (`description`, read when not given) records no such source or
    another dataset, or `val_fraction` (when given) is not the share it held out; the message ends
    with `consequence`. `tokenizer_only`: only its tokenizer need be the run's (an export), so a
    dataset rebuilt with the recorded tokenizer passes. A run that recorded no plan passes."""
    description = recorded_plan(run_dir) if description is None else description
    recorded = {s["name"]: s for s in (description or {}).get("sources", [])}
    if not recorded:
        return
    path = run_dir / DATA_PLAN_JSON
    if source not in recorded:
        raise DatasetError(
            f"source {source!r} is not one this run trained on ({path} records "
            f"{', '.join(map(repr, recorded))}); {consequence}"
        )
    trained = recorded[source]
    tokenizer = trained.get("tokenizer_sha256")
    if not same_data(trained["fingerprint"], info):
        if tokenizer_only and tokenizer and tokenizer == info.get("tokenizer_sha256"):
            pass  # rebuilt (other documents) with the run's tokenizer: what an export ships is the same
        elif tokenizer_only and tokenizer:
            theirs = str(info.get("tokenizer_sha256"))[:12]
            raise DatasetError(
                f"source {source!r}: {location}{working_directory_note(location)} was tokenized with "
                f"tokenizer sha256 {theirs}…, not the run's ({tokenizer[:12]}… in {path}); {consequence}"
            )
        else:
            unknown = " (the run recorded no tokenizer hash to tell a rebuild by)" if tokenizer_only else ""
            now, then = two_hashes(str(info.get("fingerprint")), str(trained["fingerprint"]))
            raise DatasetError(
                f"source {source!r}: {location}{working_directory_note(location)} is not the dataset this "
                f"run trained on (fingerprint {now} now, {then} in {path}){unknown}; {consequence}"
            )
    elif tokenizer and info.get("tokenizer_sha256") != tokenizer:
        # the same shards under another tokenizer's record: dataset.json edited with its tokenizer.json
        # (a rebuild with another tokenizer writes other ids), and an export shipped the edited one
        # (trial RV70d 6)
        theirs, ours = two_hashes(str(info.get("tokenizer_sha256")), tokenizer)
        raise DatasetError(
            f"source {source!r}: {location}{working_directory_note(location)} records tokenizer sha256 "
            f"{theirs} for the shards this run trained on, tokenized with {ours} ({path}): its "
            f"tokenizer.json and dataset.json were edited after the build; restore them; {consequence}"
        )
    held_out = trained.get("val_fraction")
    if val_fraction is not None and held_out is not None and val_fraction != held_out:
        raise DatasetError(
            f"source {source!r}: {run_dir / CONFIG_TOML} gives val_fraction {val_fraction!r}, but the run "
            f"held out {held_out!r} ({path}): the config was edited after the run, so "
            f"its held-out documents would not be the run's; set it back{_or_the_plan_changed(run_dir)}"
        )


def recorded_skips(run_dir: Path, description: dict[str, Any] | None = None) -> tuple[data_plan.Skip, ...]:
    """The rewinds' skips RUN/data_plan.json records (the trainer rewrites it at each rewind; its
    `description` when read already); none when the run recorded no plan. A damaged skip record is a
    DatasetError naming the file and what rewrites it (it was a traceback, or the export of a rewind's
    save as a trained step: reviews R15h F5, R15i F1). Its sources are not read, so not checked: a
    damaged source line leaves the skips readable to every reader of them (one rule: missing_step_reason
    and `train --plan` refused where untrained_steps and eval read them, review RV33d F4)."""
    description = recorded_plan(run_dir, sources=False) if description is None else description
    if description is None:
        return ()
    try:
        return data_plan.skips_from(description)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DatasetError(
            f"{run_dir / DATA_PLAN_JSON} is damaged (a rewind's record: {type(e).__name__}: {e}); "
            f"{recorded_plan_fix(run_dir)}"
        ) from None


def run_plan(run_dir: Path) -> tuple[data_plan.Plan, list[DocumentTable], tuple[data_plan.Skip, ...]]:
    """What a run directory trained, from its files alone (`data inspect RUN`, `verify RUN`): the plan
    of RUN/config.toml (every source and phase), its sources' training splits (each document they read
    held to its sha256: DocumentTable.verify_documents), refused (DatasetError) when one is not the
    dataset RUN/data_plan.json recorded, when the run recorded no plan, or drew its batches in an older
    order; and the timeline's skips recorded there."""
    from training.contract.config_loader import load_config
    from training.data.spec import check_config

    cfg = load_config(TrainConfig, run_dir / CONFIG_TOML)
    # checked as it trained: its micro-batch rule is the trainer's, met on the run's own ranks, which a
    # reader's --world-size only splits the rows among (trial RV64a 2f: refused by that rule)
    spec = check_config(cfg, 1)
    description = recorded_plan(run_dir)
    if description is None:
        raise DatasetError(plan_not_found(run_dir))
    trained = TrainedPlan.of(str(run_dir / DATA_PLAN_JSON), description)
    tables = open_run_sources(run_dir, str(description.get("format")), spec, trained=trained)
    for table in tables:  # shown or compared: each document held to its sha256 (trial RV62a F1)
        table.verify_documents = True
    plan = build_plan(cfg, spec, tables)
    check_recorded_plan(run_dir, plan, tables, description)
    # The rewinds are the run's history, not its config: the recorded plan has its timeline's skips.
    return plan, tables, recorded_skips(run_dir, description)


def skip_cause(skip: data_plan.Skip) -> str:
    """Why and from where a rewind skipped: `<its reason>; back to step 35` (the reason names the
    loss and its step, as the rewind's line said it)."""
    return f"{skip.reason or f'step {skip.spike_step:,}'}; back to step {skip.checkpoint_step:,}"


def skip_lines(plan: data_plan.Plan, skips: Sequence[data_plan.Skip]) -> list[str]:
    """One line per rewind: the steps it skipped, why, and the tokens not trained on."""
    lines = []
    for s in skips:
        detail = plan.skip_detail(s)
        tokens = sum(d["tokens"] for d in detail)
        per = ", ".join(f"{d['source']} {d['tokens']:,}" for d in detail)
        lines.append(
            f"rewind {s.rewind}: steps {s.first_step:,}-{s.last_step:,} skipped ({skip_cause(s)}): "
            f"{tokens:,} tokens not trained on ({per})"
        )
    return lines


def plan_rows(plan: data_plan.Plan, skips: Sequence[data_plan.Skip] = ()) -> list[dict[str, Any]]:
    """One row per phase: steps, seq_len, G, the LR piece's shape, and per source the tokens trained
    and the share of its dataset (stream tokens / one epoch of its training split) read, and the
    tokens of steps the rewinds skipped (read, not trained) when there are any."""
    rows = []
    end_rows = plan.consumed(plan.total_steps, skips)
    for p, ph in enumerate(plan.phases):
        first = plan.first_step[p]
        row: dict[str, Any] = {
            "phase": ph.name,
            "steps": f"{first + 1}-{first + ph.steps}",
            "seq_len": ph.seq_len,
            "G": ph.global_batch,
            "tokens/step": f"{ph.global_batch * ph.seq_len:,}",
            "lr": lr_shape(ph.lr),
        }
        for r in end_rows:
            if r["phase_index"] == p:
                skipped = f"; {r['skipped_tokens']:,} skipped" if r["skipped_tokens"] else ""
                row[r["source"]] = f"{r['tokens']:,} ({100 * r['fraction']:.1f}%{skipped})"
        rows.append(row)
    return rows


def lr_shape(piece: data_plan.LRPiece | None) -> str:
    """A phase's LR piece as its shape: `warmup 5 → 0.001, cosine → 0.0001`, `linear 0.003 → 0.0003`,
    `constant 0.003` (the LR of its first and last step would hide a warmup's peak)."""
    if piece is None:
        return "-"
    warmup = f"warmup {piece.warmup_steps} → {piece.peak:.3g}" if piece.warmup_steps else ""
    if piece.shape == "constant":
        return f"{warmup}, constant" if warmup else f"constant {piece.peak:.3g}"
    return (
        f"{warmup}, {piece.shape} → {piece.end:.3g}"
        if warmup
        else f"{piece.shape} {piece.peak:.3g} → {piece.end:.3g}"
    )


def format_plan(plan: data_plan.Plan, notes: list[str], skips: Sequence[data_plan.Skip] = ()) -> list[str]:
    """The plan as printed by `gristmill train --plan` and at the top of a run (a resumed run's with
    its timeline's `skips`)."""
    rows = plan_rows(plan, skips)
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = [
        "  ".join(c.ljust(width[c]) for c in cols),
        *("  ".join(str(r.get(c, "")).ljust(width[c]) for c in cols) for r in rows),
    ]
    lines.append(
        "per source: tokens trained (share of one epoch of its training split read"
        + ("; tokens of the steps a rewind skipped: read, not trained" if skips else "")
        + "); sources: "
        + ", ".join(f"{s.name} = {s.dataset} ({s.tokens:,} tokens)" for s in plan.sources)
    )
    return lines + skip_lines(plan, skips) + [f"note: {n}" for n in notes]


CONSUMPTION_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("phase_index", pa.int64()),
        ("source", pa.string()),
        ("source_index", pa.int64()),
        ("dataset", pa.string()),
        ("seq_len", pa.int64()),
        ("steps", pa.int64()),
        ("windows", pa.int64()),
        ("tokens", pa.int64()),
        ("skipped_windows", pa.int64()),
        ("skipped_tokens", pa.int64()),
        ("rewinds", pa.list_(pa.int64())),
        ("stream_tokens", pa.int64()),
        ("epoch", pa.int64()),
        ("dataset_tokens", pa.int64()),
        ("fraction", pa.float64()),
    ]
)
# Columns added to CONSUMPTION_SCHEMA after its first version (git history: 0c78714, 12eafb4): an
# older writer's table lacks them (the audit reads them as null; other columns it refuses: audit_views).
CONSUMPTION_COLUMNS_ADDED = ("phase_index", "source_index", "skipped_windows", "skipped_tokens", "rewinds")


def write_consumption(plan: data_plan.Plan, step: int, consumed: list[dict[str, Any]], path: Path) -> None:
    """RUN/consumption.parquet after `step` steps (`consumed`: the plan's `consumed(step)`): per
    (phase, source) the steps, windows and tokens trained (windows × seq_len), the windows and
    tokens of steps a rewind skipped and those rewinds' numbers, stream tokens read ((trained +
    skipped windows) × (seq_len + 1)), the source's epoch and the fraction of one epoch of its
    training split read. The audit's `consumption` view."""
    rows = []
    for r in consumed:
        src = plan.sources[r["source_index"]]
        rows.append({**r, "step": step, "dataset": src.dataset, "dataset_tokens": src.tokens})
    table = pa.Table.from_pylist(rows, schema=CONSUMPTION_SCHEMA)
    with atomic_path(path, fsync=False) as tmp:  # derived from the plan: rewritten at every log
        # page checksums: the audit verifies them before duckdb reads it (validation/audit_views.py); no
        # column statistics: the footer has no checksum, and a flipped min/max could skip rows (RV32e F3)
        pq.write_table(table, tmp, write_page_checksum=True, write_statistics=False)


def plot_plan(plan: data_plan.Plan, path: Path, skips: Sequence[data_plan.Skip] = ()) -> str | None:
    """plan.png: the LR curve, the tokens of every step (the batch schedule) and each source's share
    of it, with the phase boundaries and the steps the rewinds skipped (`skips`). Returns a note
    instead when matplotlib is missing."""
    plt = agg_pyplot(required=False)
    if plt is None:
        return "plan.png skipped: matplotlib is not installed"
    import numpy as np

    total = plan.total_steps
    steps = np.unique(np.linspace(0, total - 1, min(total, 2000)).astype(int))
    fig, (ax_lr, ax_batch, ax_mix) = plt.subplots(
        3, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2, 3]}
    )
    ax_lr.plot(steps + 1, [plan.lr(int(s)) for s in steps], color="black")
    ax_lr.set_ylabel("learning rate")
    # tokens per step: each phase's global batch × seq_len, a step function over the phases
    edges = [*plan.first_step, total]
    batch = [ph.global_batch * ph.seq_len for ph in plan.phases]
    ax_batch.stairs(batch, np.array(edges) + 0.5, baseline=None, color="C0", linewidth=1.5)
    ax_batch.set_ylim(0, max(batch) * 1.15)
    ax_batch.set_ylabel("tokens per step")
    ax_batch.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    shares = np.zeros((len(plan.sources), len(steps)))
    for j, s in enumerate(steps.tolist()):
        p, k = plan.locate(s)
        n = plan.cumulative(p, k + 1) - plan.cumulative(p, k)
        shares[:, j] = n / n.sum()
    ax_mix.stackplot(steps + 1, shares, labels=[s.name for s in plan.sources])
    ax_mix.set_ylabel("share of each step")
    ax_mix.set_xlabel("step")
    ax_mix.set_ylim(0, 1)
    ax_mix.legend(loc="upper left", fontsize=8)
    for s in skips:  # steps a rewind skipped: their windows were read, not trained
        for ax in (ax_lr, ax_batch, ax_mix):
            ax.axvspan(s.first_step - 0.5, s.last_step + 0.5, color="red", alpha=0.15, linewidth=0)
    for p, ph in enumerate(plan.phases):
        for ax in (ax_lr, ax_batch, ax_mix):
            ax.axvline(plan.first_step[p] + 0.5, color="grey", linestyle=":", linewidth=1)
        ax_lr.text(plan.first_step[p] + 1, ax_lr.get_ylim()[1], f" {ph.name} (seq {ph.seq_len})",
                   va="top", fontsize=8)  # fmt: skip
    fig.tight_layout()
    return save_figure(plt, fig, path, dpi=100)
