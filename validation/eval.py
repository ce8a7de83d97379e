"""`gristmill eval RUN`: lm-evaluation-harness on a run's HF exports, one separator per request.

    gristmill eval runs/train/demo --step 150 --tasks heldout_ppl,heldout_cloze   # local tasks, offline
    gristmill eval RUN --tasks hellaswag,arc_easy,piqa,lambada_openai       # hub tasks, need network
    gristmill eval RUN --watch --tasks heldout_ppl                             # each new export as it appears
    gristmill eval RUN --step 150 --merged                                   # [merge]'s weights at 150
    gristmill eval RUN --table                    # eval.parquet and eval.png again from the results.json

A step is evaluated from RUN/exports/step-N (exported on demand from a complete DCP checkpoint when
there is none yet) with `GristmillHFLM` (validation/eval_model.py: the training framing, exactly
one separator before every text). Results go to RUN/eval/step-N/results.json (lm-eval's own dict,
merged per task), RUN/eval.parquet (one row per step, task, metric: the `eval` view of `gristmill
data audit RUN`) and RUN/eval.png. Before any model is loaded, every task name is resolved, hub
tasks whose data cannot be had offline are refused with one message, and so is a run directory the
results cannot be written to.

Weights are checked before they are trusted: the export's files against its checksums
(`verify_export`, via `export_checkpoint`), then every loaded parameter for NaN/inf. No number is
hidden: a NaN or inf metric is kept in results.json, eval.parquet and the table, with a warning
line naming the task and metric; when no metric of a task is finite the eval fails (exit 2) after
the results are written.

The terminal gets one `[eval]` line per (step, task), a warning line for a task whose inputs
lm-eval cuts to fit max_length, and the table; lm-eval's, transformers' and datasets' own logs
and progress bars (and the `git` lm-eval runs) go to RUN/eval/step-N/eval.log (`-v` shows them).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from training.checkpoint.base_record import base_files
from training.checkpoint.base_source import TOKENIZER_FILES
from training.checkpoint.export_advice import export_fix
from training.checkpoint.hf_export import (
    CheckpointSetAside,
    ExportError,
    check_export_tokenizer,
    export_checkpoint,
    run_config,
)
from training.checkpoint.io import (
    final_weights_note,
    merged_step,
    missing_step_reason,
    nonfinite_tensor,
    untrained_reason,
    untrained_steps,
    verify_checkpoint,
)
from training.checkpoint.record import CheckpointDenied, CheckpointError
from training.config import task_names
from training.config_checks import missing_eval_module
from training.contract.config_loader import ConfigPath, PathArgument, load_config, save_config
from training.contract.dataset_format import data_identities, decontaminate_record
from training.contract.errors import GristmillError, wrapped
from training.contract.eval_table import (
    GRISTMILL_TASKS,
    LATER_SETTINGS,
    LOCAL_SETTINGS,
    RESULTS_JSON,
    SCORING_RUN,
    EvalResultsError,
    eval_lock,
    read_results,
    read_step_results,
    result_rows,
    settings_held,
    settings_holders,
    write_eval_table,
)
from training.contract.integrity import read_ledger
from training.contract.run_layout import (
    EVAL_DIR,
    EVAL_PARQUET,
    EVAL_PLOT,
    EXPORTS_DIR,
    abandoned_copies,
    checkpoint_dir,
    complete_steps,
    eval_dir,
    export_dir,
    list_steps,
)
from training.data.plan import Skip, skip_of, skips_from
from training.data.recipe import check_trained_on, recorded_plan
from training.data.remote import CacheSettings, dataset_info
from training.data.spec import RunSpec, resolve
from validation.eval_data import (
    DATA_META,
    RENAMED,
    EvalError,
    NotRead,
    TaskData,
    Written,
    build_task_data,
    check_data_folders,
    check_include_path,
    check_no_local_names,
    checked_task_manager,
    damaged_task_files,
    documents_before,
    files_sha256,
    inline_members,
    local_data_cache,
    local_files,
    local_task_config,
    local_task_definition,
    local_task_names,
    reconfigured_members,
    task_data_files,
    task_data_folder,
    task_data_settings,
    task_definition,
    task_documents,
    task_documents_sha256,
    task_file,
    task_items,
    task_members,
)
from validation.eval_output import eval_output
from validation.eval_results import (
    DOCUMENTS_RULE,
    EVAL_LOG,
    as_used,
    decontamination_marks,
    describe_metric,
    merge_results,
    metric_order,
    nonfinite_metrics,
    num_fewshot_passed,
    renamed_task,
    scored_itself,
    undrawn_plot_note,
    write_plot,
    write_step_json,
)


class DiscardedStepError(EvalError):
    """The weights an eval scored were set aside by a rewind of the running training meanwhile: a
    discarded timeline's, not the step's; nothing was recorded."""


class NonFiniteMetricsError(EvalError):
    """Some task of an evaluated step has no finite metric; its results are written all the same."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


DATA_SUBDIR = "data"  # RUN/eval/data/<settings>: the local tasks' jsonl files (task_data_folder)


@dataclass
class EvalConfig:
    """The eval recipe (configs/eval/*.toml); saved as RUN/eval/step-N/config.toml."""

    tasks: list[str] = field(default_factory=lambda: ["heldout_ppl", "heldout_cloze"])
    """lm-eval task, group or tag names: local ones (validation/eval_tasks/*.yaml) or lm-eval's."""
    batch_size: int = 8
    """Requests per forward pass."""
    device: str = "auto"
    """"cpu", "cuda", "cuda:1" …; "auto" takes cuda when there is one."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights' dtype for the forward passes."""
    limit: int = 0
    """At most this many documents per task (0: all); for smoke tests, not for reported numbers."""
    num_fewshot: int | None = None
    """Few-shot examples per request; unset (the default): each task's own (a YAML's num_fewshot, gsm8k's
    5; 0 where it names none), 0: zero-shot for every task. results.json records, per task, the n-shot
    it was scored with (`gristmill_tasks.TASK.n_shot`)."""
    bootstrap_iters: int = 1000
    """Bootstrap resamples for the stderr of non-mean metrics (perplexities); 0 skips stderrs."""
    docs: int = 40
    """Held-out documents the local tasks are built from (heldout_ppl: one item each, heldout_cloze: ≤ 2);
    of one source in a mixture (see `run_data`)."""
    max_length: int = 0
    """Tokens per forward pass (rolling windows, truncated contexts); 0: the model's max_seq_len
    (the export's max_position_embeddings), the longest context it was built for. Set it to the
    run's seq_len to score only lengths the model trained on (the eval says so when it scores
    positions past them)."""
    seed: int = 1234
    """lm-eval's random seeds (few-shot sampling), 0 to 4294967295."""
    include_path: list[ConfigPath] = field(default_factory=list)
    """Directories of your own lm-eval task YAML files (lm-eval's --include_path), e.g. the tasks a
    dataset was decontaminated against with [decontaminate] include_path."""
    plot: bool = True
    """Draw RUN/eval.png after each step is scored (~0.3 s each); false: none is drawn or updated
    (`gristmill eval RUN --table` draws it from the results later). The scores do not depend on it: a
    step scored either way is not scored again for it."""


def available_steps(run_dir: str | Path, merged: bool = False) -> list[int]:
    """Steps with an export or a complete checkpoint, ascending (`merged`: with a merged export, or a
    complete checkpoint that holds its step's merged weights)."""
    run_dir = Path(run_dir)
    exports = set(list_steps(run_dir / EXPORTS_DIR, merged))
    if not merged:  # a rewind's save of an earlier step's weights is no trained step (untrained_save)
        return sorted((exports | set(complete_steps(run_dir))) - untrained_steps(run_dir))
    return sorted(exports | {s for s in complete_steps(run_dir) if _holds_merged(run_dir, s)})


def step_went(run_dir: Path, step: int, merged: bool = False) -> bool:
    """Whether step `step`, whose evaluation failed, is no longer there to evaluate: its checkpoint
    went while it was read (a running run's checkpoint.keep_last, or a rewind), no export of it left.
    Not a failure of the step's own (one exported meanwhile is scored: evaluate_step)."""
    return step not in available_steps(run_dir, merged)


def _damaged_checkpoint(run_dir: Path, step: int, merged: bool) -> str | None:
    """Why checkpoint `step`, which the step's evaluation would be exported from (no export of it), does
    not verify, or None (it does, or an export stands for it)."""
    if export_dir(run_dir, step, merged).is_dir() or not checkpoint_dir(run_dir, step).is_dir():
        return None
    try:
        verify_checkpoint(checkpoint_dir(run_dir, step))
    except CheckpointDenied:  # access, not damage: said as it is
        return None
    except CheckpointError as e:
        return str(e)
    return None


def _holds_merged(run_dir: Path, step: int) -> bool:
    """Whether checkpoint `step` holds its step's merged weights (one it cannot read does not)."""
    try:
        return merged_step(checkpoint_dir(run_dir, step)) == step
    except CheckpointError:
        return False


@dataclass(frozen=True)
class RunData:
    source: str  # the source whose held-out documents the local tasks are made of
    dataset: str  # its dataset directory, or s3:// URL
    val_fraction: float
    cache: CacheSettings | None = None  # where a bucket's dataset is cached (the run's data.cache_*)

    def heldout(self) -> dict[str, str]:
        """Which documents the local tasks score: results.json's gristmill.heldout."""
        return {"source": self.source, "dataset": self.dataset}


@dataclass(frozen=True)
class HeldOut:
    """Whose held-out documents the local tasks score, as their scores record it (`score_settings`):
    a source and its dataset's fingerprint. The same data under another path (moved, spelled
    otherwise, `data convert`ed, indexed: data_identities) is the same documents."""

    source: str
    fingerprint: str
    identities: frozenset[str]
    # which of its held-out documents the local tasks' data holds (eval_data.task_documents), as a sorted
    # tuple of its items; None: not known yet (before the data is built)
    documents: tuple[tuple[str, Any], ...] | None = None

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"source": self.source, "fingerprint": self.fingerprint}
        if self.documents is not None:
            record["documents"] = dict(self.documents)
        return record

    def scored(self, recorded: Any) -> bool:
        """Whether scores recorded with `recorded` (a record, or results.json's header `heldout` for
        scores from before it was per task: no fingerprint) are of these documents. With `documents`
        known, of the same documents too: a record without them (scored before they were recorded,
        on every held-out document) only where none is left out now (review R25i S1: steps scored on 16
        documents before the folder was built again with 11 counted as done, one curve with the rest)."""
        if not isinstance(recorded, dict) or recorded.get("source") != self.source:
            return False
        if recorded.get("fingerprint") is not None and recorded["fingerprint"] not in self.identities:
            return False
        if self.documents is None:
            return True
        mine = dict(self.documents)
        if "documents" not in recorded:
            return mine["left_out"] == 0
        return recorded["documents"] == mine


def run_data(spec: RunSpec, source: str = "") -> RunData:
    """From a run's resolved config (RUN/config.toml): the held-out documents of `source` (its
    eval.source), else of the run's first source that holds some out (of its only one without
    [[data.sources]]: one source of a mixture is scored, and named wherever its scores are shown)."""
    src = next((s for s in spec.sources if s.name == source or (not source and s.val_fraction > 0)), None)
    src = src or spec.sources[0]
    return RunData(src.name, str(src.dataset), src.val_fraction, spec.cache)


def check_heldout_dataset(run_dir: Path, data: RunData) -> HeldOut:
    """The held-out documents are the ones the run held out (recipe.check_trained_on): its dataset, as
    RUN/config.toml names it (a path relative to where the run started: an eval started elsewhere
    scored whatever dataset that path led to there), and its val_fraction (an edited one scored
    documents the run trained on). Returns whose they are, from the same read of its dataset.json."""
    try:
        info = dataset_info(data.dataset, data.cache.timeout_s if data.cache else None)
        check_trained_on(
            run_dir, data.source, data.dataset, info, "its held-out documents would be another dataset's: "
            "point the source's dataset at the one it trained on", val_fraction=data.val_fraction,
        )  # fmt: skip
    except GristmillError as e:
        raise EvalError(str(e)) from None
    return HeldOut(data.source, info["fingerprint"], frozenset(data_identities(info)))


def training_data_checks(spec: RunSpec, run_dir: Path) -> list[dict[str, Any]]:
    """Per source dataset of the run: {"source", "dataset", "decontaminate"}, the last being
    dataset.json's record of the eval tasks the build filtered against (None: none, or the dataset
    is gone, or is not the one the run trained on, which RUN/config.toml's path may lead to from
    another directory: either cannot tell)."""
    checks = []
    for src in spec.sources:
        try:
            info = dataset_info(src.dataset, spec.cache.timeout_s)
            check_trained_on(run_dir, src.name, src.dataset, info, "its decontamination is not the run's")
            entry = decontaminate_record(src.dataset, info)  # an older dataset.json's count: its index's
        except GristmillError:
            entry = None
        checks.append({"source": src.name, "dataset": str(src.dataset), "decontaminate": entry})
    return checks


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:  # gone meanwhile, or a dangling link
        return None


class TaskNames:
    """Requested task names, checked without the run directory (a GristmillError names what is wrong:
    none, a renamed local task, an unknown one, a hub task's dataset offline and not cached); `local`:
    those that are gristmill's local tasks, `task_manager`: lm-eval's index of the others."""

    def __init__(self, cfg: EvalConfig):
        from lm_eval.tasks import TaskManager

        self.names = task_names(cfg.tasks)
        if not self.names:
            raise EvalError("no tasks given; e.g. --tasks heldout_ppl,heldout_cloze")
        if old := [n for n in self.names if n in RENAMED]:
            raise EvalError(
                "; ".join(f"task {n} is now called {RENAMED[n]}" for n in old)
                + " (the same held-out documents): use the new name in --tasks, eval.tasks or the eval recipe"
            )
        check_no_local_names(cfg.include_path)  # a task of one's own named like a local one
        local = set(local_task_names())
        self.local = [n for n in self.names if n in local]
        self.hub = [n for n in self.names if n not in local]  # lm-eval's registry or cfg.include_path
        self.task_manager = (
            checked_task_manager(self.hub, cfg.include_path)
            if self.hub
            else TaskManager(include_defaults=False)
        )


class TaskPlan:
    """Requested task names resolved into lm-eval specs, checked before any model exists.

    Local names become their YAML dicts (data built under RUN/eval/data/<settings> on first use); other names
    are looked up in cfg.include_path and lm-eval's registry (only the task families that define
    them), registry tasks refused up front when offline without a cached copy. `training_data`: what
    each of the run's datasets says about decontamination, for the marks (`decontamination_marks`);
    `data`: the run's held-out documents (`run_data`), from the one read of
    RUN/config.toml.
    """

    def __init__(
        self,
        run_dir: Path,
        cfg: EvalConfig,
        log: Callable[[str], None] | None = None,
        tasks: TaskNames | None = None,
    ):
        """`log`: where a note on rebuilt task data goes (stderr's `[eval]` lines by default); `tasks`:
        cfg's task names as checked already (the in-training eval checks them before the run starts)."""
        tasks = tasks or TaskNames(cfg)
        self.names, self.task_manager, self.hub = tasks.names, tasks.task_manager, tasks.hub
        self.run_dir = run_dir
        train_cfg = run_config(run_dir)
        spec = self.run_spec = resolve(train_cfg)  # once: both read the run's sources (and train_eval)
        # Per phase, its first step and seq_len: the longest a step's weights trained on (None for a
        # run from a base model, which trained longer).
        starts = [1 + sum(ph.steps for ph in spec.phases[:p]) for p in range(len(spec.phases))]
        self.phase_lens = (
            None if train_cfg.model.init_from else [(a, n) for a, (_, n) in zip(starts, spec.seq_lens)]
        )
        self._noted: set[int] = set()
        self.training_data = training_data_checks(spec, run_dir)
        self.data = run_data(spec, train_cfg.eval.source)
        self.specs: list[Any] = list(self.hub)
        self.local = tasks.local
        self.data_dir = run_dir / EVAL_DIR / DATA_SUBDIR  # with local tasks, their settings' folder in it
        self.include_path = [Path(p).resolve() for p in cfg.include_path]
        self.heldout = None  # whose held-out documents the local tasks score, when there are some
        if self.local:
            self.heldout = check_heldout_dataset(run_dir, self.data)
            settings = task_data_settings(self.data.dataset, self.data.val_fraction, cfg.docs)
            self.data_dir = self.data_dir / task_data_folder(settings)
            build_task_data(
                self.data.dataset,
                self.data.val_fraction,
                self.data_dir,
                cfg.docs,
                log or _log,
                self.data.cache,
                self.local,
            )
            self.specs = [local_task_config(n, self.data_dir) if n in self.local else n for n in self.names]
            documents = tuple(sorted(task_documents(self.data_dir).items()))
            self.heldout = dataclasses.replace(self.heldout, documents=documents)
        # how many held-out documents the local tasks are made of (heldout_ppl: one item each)
        self.documents = task_items(self.data_dir / task_file("heldout_ppl")) if self.local else None
        # documents_sha256: by planned name, its loaded leaf tasks and the digests asked of them
        self._documents: dict[str, tuple[dict[str, Any], dict[str, str | None]]] = {}
        # what each task is, recorded with its scores: a task edited since it was scored is not done
        self.definitions: dict[str, str] = {}
        # what each reads its documents from, their content's sha256 (None: no local files) and whether
        # they are all its documents (local_data_cache); for a tag, the names lm-eval scores it under
        self.data_files: dict[str, TaskData] = {}
        self.contents: dict[str, str | None] = {}
        self.scored_as: dict[str, list[str]] = {}
        # a planned group's or tag's members that are tasks of their own: their definitions, contents
        self.member_definitions: dict[str, str] = {}
        self.member_contents: dict[str, str | None] = {}
        # those a planned group builds with other settings than their own (its own keys): recorded as
        # scored under the group's (eval_data.reconfigured_members)
        self.reconfigured: dict[str, set[str]] = {}
        self._files: list[tuple[str, int, int, int, int]] | None = None  # `_watched`, when made
        # scoring_as_is's answers, by group or tag: made again with the definitions
        self._as_is: dict[str, tuple[dict[str, str | None], set[str]] | None] = {}
        self.refresh_definitions()

    def refresh_definitions(self) -> None:
        """The tasks' definitions and the contents of the local files they read (`contents`) as the
        files are now. lm-eval reads a task's YAML and functions again each time it builds the task, so
        a task edited during a `--watch` or a training run is scored as edited, and is recorded under
        its new definition only if it is made again (review R23d 2); so are its data files, replaced
        (review R30a F1) or new matches of its globs and folders (RV30c S1). Made when a file under
        include_path or a data file changed (its name, size, mtime or ctime), else kept (a stat of each,
        not a load of every YAML and module at each poll)."""
        if self._watched() == self._files and self.definitions:
            return
        self.definitions = {
            n: local_task_definition(n) if n in self.local else task_definition(self.task_manager, n)
            for n in self.names
        }
        # the local tasks' files are checked as built
        self.data_files = {n: task_data_files(self.task_manager, n) for n in self.hub}
        run = Written("the run directory", self.run_dir, "its eval/ (made at the first eval) for a split",
                      "move the run out")  # fmt: skip
        for name, data in self.data_files.items():
            check_data_folders(name, data, run)
        self.contents = {n: files_sha256(d.files) if d.files else None for n, d in self.data_files.items()}
        self.scored_as = {n: self._scored_as(n) for n in self.hub}
        self.reconfigured = {n: reconfigured_members(self.task_manager, n) for n in self.hub}
        self._files = self._watched()
        self._as_is = {}
        # each planned group's or tag's members that are tasks of their own, by their own definition:
        # what a member's scores record (they carried their group's, and a later eval of the member
        # alone said it was "scored again under other settings" for a task nobody edited: R30a F2)
        self.member_definitions = {
            m: task_definition(self.task_manager, m)
            for n in self.names
            if n not in self.local
            for m in self._members(n)
            if m in self.task_manager.task_index
        }
        self.member_contents = {  # and the sha256 of the local files each reads, as a planned task's
            m: files_sha256(files) if files else None
            for m in self.member_definitions
            for files in [task_data_files(self.task_manager, m).files]
        }

    def _watched(self) -> list[tuple[str, int, int, int, int]]:
        """The files under include_path and the tasks' data files, those found and those their patterns
        match now (a file added to a glob or a folder is one more), each as its name, mtime, ctime, inode
        and size (the ctime: an mtime put back, cp -p)."""
        found = {f for d in self.data_files.values() for f in d.files}
        data = sorted(found.union(local_files([p for d in self.data_files.values() for p in d.patterns])))
        # where each path the configs write leads now: a link re-pointed is a change (review RV32f B1)
        leads = {(a, os.path.realpath(a)) for d in self.data_files.values() for a in d.anchors}
        return sorted(
            [
                *((f"{a} -> {real}", 0, 0, 0, 0) for a, real in leads),
                *(
                    (str(path), st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_size)
                    for top in [*self.include_path, *data]
                    for path in (top.rglob("*") if top.is_dir() else [top])
                    if "__pycache__" not in path.parts and (st := _stat(path)) is not None
                ),
            ]
        )

    def _scored_as(self, name: str) -> list[str]:
        """The names task `name`'s scores are recorded under: a tag's, its members' (never the tag's:
        review R30a F3); a group's, its own and `GROUP::member` of each member a group under it overrides
        (a file written before these names holds the variant's scores under the member's: RV30c S2);
        else its own."""
        members = self.tag_members(name)
        if members is not None:
            return members
        return [name, *(f"{group}::{member}" for member, group in self.overridden(name).items())]

    def tag_members(self, name: str) -> list[str] | None:
        """The names tag `name`'s scores are recorded under, its members' (`_scored_as`), as this plan's
        task index knows it; None where it knows no tag of that name. What links a member recorded without
        settings to its tag's entry where that entry names no n_shot (before 2a90755; since, the n_shot
        names its members: eval_table.settings_holders)."""
        if not str(getattr(self.task_manager.task_index.get(name), "kind", "")).endswith("TAG"):
            return None
        return [m for member in task_members(self.task_manager, name) or [] for m in self._scored_as(member)]

    def scoring_as_is(self, group: str, member: str) -> dict[str, str | None] | None:
        """Group or tag `group`'s `definition` and `documents` (score_settings' keys; None: no local
        files) as they are now, where it scores task `member` as it is; None where it scores its variant
        (a group under it lists it with keys of its own, `overridden`, or gives it its own,
        eval_data.reconfigured_members: a gristmill before d7917da recorded the variant's scores under
        the member's name: review RV35a F1b) or lm-eval knows no `group` here. What an older entry of
        `group` must record to vouch for the scores of a member recorded without settings of its own
        (`evaluated`, eval_table.settings_holders: review RV35a F1)."""
        if group not in self._as_is:
            self._as_is[group] = None
            if group in self.task_manager.task_index and group not in self.local:
                try:
                    files = task_data_files(self.task_manager, group).files
                except EvalError:  # its files cannot be resolved: nothing vouches for its scores
                    return None
                now = {
                    "definition": task_definition(self.task_manager, group),
                    "documents": files_sha256(files) if files else None,
                }
                variants = set(self.overridden(group)) | reconfigured_members(self.task_manager, group)
                self._as_is[group] = (now, variants)
        known = self._as_is[group]
        return None if known is None or member in known[1] else known[0]

    def cache(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Where datasets caches planned task `name`'s documents (local_data_cache): a folder of their
        content's for one read from local files alone."""
        alone = name in self.data_files and self.data_files[name].alone
        return local_data_cache(self.contents.get(name) if alone else None)

    def _members(self, name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """Every task, group and tag a group or tag `name` scores, at every depth (none for a task)."""
        found: set[str] = set()
        for member in set(task_members(self.task_manager, name) or ()) - seen:
            found |= {member} | self._members(member, seen | {name, member})
        return found

    def overridden(self, name: str) -> dict[str, str]:
        """{member: the group that overrides it} of group or tag `name`: the tasks of their own (in the
        task index) that a group under it lists with overrides (`- task: my_ll` with another
        doc_to_text), at every depth. Their scores are another task's than the member's own: they are
        recorded as `GROUP::member` (`renamed_task`), lm-eval's own name of a group's task."""
        index = self.task_manager.task_index
        return {
            member: group
            for group in sorted({name} | self._members(name))
            for member in sorted(inline_members(self.task_manager, group))
            if member in index
        }

    def own_config(
        self, group: str, member: str, variant: dict[str, Any], num_fewshot: int | None
    ) -> dict[str, Any] | None:
        """lm-eval's config of task `member` as it is, as an eval that passed lm-eval `num_fewshot` records
        it: `variant` (the config lm-eval recorded of `group`'s variant of it) with the member's own value
        of each key where the group's overrides give another (a load of each), and its num_fewshot as
        lm-eval sets it while scoring under `num_fewshot` (0 for a task that names none: RV33a L1). The
        older entry's `num_fewshot`, not today's: `variant` was scored under today's (review RV34e S1).
        None where lm-eval cannot load them here (a group defined inline in another has no name to load
        by). Asked of an older entry only (eval_results.variants_replaced: review RV32f B4)."""
        try:
            with self.cache(group):
                own = self.task_manager.load([member])["tasks"][member].dump_config()
                overridden = self.task_manager.load([group])["tasks"][member].dump_config()
        except Exception:  # not loadable here: the entry's config is not vouched for as the member's own
            return None
        differ = {k for k in own.keys() | overridden.keys() if own.get(k) != overridden.get(k)}
        kept = {k: v for k, v in variant.items() if k not in differ}
        mine = {k: own[k] for k in differ if k in own}
        return {**kept, **mine, "num_fewshot": scored_num_fewshot(own.get("num_fewshot"), num_fewshot)}

    def documents_before(self, task: str) -> str | NotRead | None:
        """The `documents` digest an older gristmill recorded of lm-eval task `task`'s files as they are now
        (eval_data.documents_before), for the note on scores replaced (eval_results.replaced_settings)."""
        if task not in self.task_manager.task_index:
            return None
        files = self.data_files[task] if task in self.data_files else task_data_files(self.task_manager, task)
        return documents_before(self.task_manager, task, files.files)

    def forget_documents(self) -> None:
        """Read the tasks' documents again at the next documents_sha256 (after each planned name's marks)."""
        self._documents.clear()

    def documents_sha256(self, planned: str, leaf: str) -> str | None:
        """The sha256 of the evaluation documents (eval_data.task_documents_sha256) of leaf task `leaf` as
        the planned name `planned` builds it (a group's member with its overrides applied, an inline
        member: review R23i 1, 2), every leaf from one load of `planned` (R23i 4), kept for its marks
        alone (evaluate_lm forgets them after: a data file replaced during a watch or a training run,
        outside include_path, was marked against the old ones: R23h S3). The decontamination marks compare it
        with the index's record (asked only for a leaf an index records it for). None for a local task
        or one lm-eval cannot load here (its scoring says why)."""
        if planned not in self._documents:
            try:
                with self.cache(planned):
                    loaded = self.task_manager.load([planned])["tasks"] if planned not in self.local else {}
            except Exception:  # the task's own eval reports its failure
                loaded = {}
            self._documents[planned] = (loaded, {})
        tasks, hashed = self._documents[planned]
        if leaf not in hashed:  # only the leaves asked (an index records few of a tag's: review R23j)
            try:
                hashed[leaf] = task_documents_sha256(tasks[leaf]) if leaf in tasks else None
            except Exception:  # this leaf's documents alone
                hashed[leaf] = None
        return hashed[leaf]

    def length_note(self, max_length: int, step: int, key: str = "max_length") -> str | None:
        """A note when windows of `max_length` tokens score positions the weights of step `step` never
        trained at (the longest seq_len of the phases up to it is shorter): their losses are higher
        than at the trained lengths, and a perplexity mixes them in (found 10% worse bits_per_byte at
        the tiny recipe's 64 of 256). Once per eval for each such length (a --watch or a run
        evaluates many steps, phase after phase)."""
        if self.phase_lens is None:
            return None
        trained = max(n for first, n in self.phase_lens if first <= max(step, 1))
        if max_length <= trained or trained in self._noted:
            return None
        self._noted.add(trained)  # once per trained length: a phase's steps share it
        return (
            f"note: max_length {max_length} scores positions {trained}–{max_length - 1}, which step "
            f"{step}'s weights never trained at (the longest seq_len up to it is {trained}); set {key} = "
            f"{trained} to score only trained lengths"
        )

    def heldout_note(self) -> str:
        """` (N held-out documents of source S (DATASET))` when local tasks are planned, else ""."""
        d = self.data
        return (
            f" ({self.documents} held-out documents of source {d.source} ({d.dataset}))" if self.local else ""
        )

    def cwd_note(self) -> str:
        """`; own_mc reads data/mc.jsonl from the working directory /x (…)` for the tasks whose relative
        data_files lm-eval reads there (TaskData.from_cwd): the same command run elsewhere scores other
        files, and nothing said so on a step's first eval (review RV52a F4); else ""."""
        named = [f"{n} reads {', '.join(d.from_cwd)}" for n, d in self.data_files.items() if d.from_cwd]
        if not named:
            return ""
        cwd = Path.cwd()
        return (
            f"; {'; '.join(named)} from the working directory {cwd} (lm-eval's rule, not the YAML's folder)"
        )

    def own_yamls(self, name: str, seen: frozenset[str] = frozenset()) -> list[Path] | None:
        """The YAML files under include_path that define task `name` (the user's own task), else None.
        A tag's or group's: its members' (and a group's own file); the user's own only when all are
        (review R23d 5: a tag of one's own tasks was taken for lm-eval's)."""
        entry = self.task_manager.task_index.get(name)
        if entry is None or name in self.local or name in seen:
            return None
        files = []
        if (path := getattr(entry, "yaml_path", None)) is not None:
            path = Path(path).resolve()
            if not any(path.is_relative_to(p) for p in self.include_path):
                return None
            files.append(path)
        members = task_members(self.task_manager, name)
        if members is None:  # a task
            return files or None
        if not members and not files:
            return None
        inline = inline_members(self.task_manager, name)
        for member in members:
            if member not in self.task_manager.task_index and member in inline:  # in the group's own file
                continue
            if (own := self.own_yamls(member, seen | {name})) is None:
                return None
            files.extend(f for f in own if f not in files)
        return files

    def without(self, names: Sequence[str]) -> TaskPlan:
        """This plan less tasks `names` (the in-training eval's of one step: a task whose data
        failed its check); the plan itself is unchanged, so the next eval tries them again."""
        keep = [i for i, n in enumerate(self.names) if n not in names]
        plan = copy.copy(self)  # shallow: the notes said once (`_noted`) stay the plan's, said once
        plan.names = [self.names[i] for i in keep]
        plan.specs = [self.specs[i] for i in keep]
        plan.local = [n for n in self.local if n not in names]
        return plan


def evaluate_lm(
    lm: Any,
    plan: TaskPlan,
    cfg: EvalConfig,
    log_samples: bool = False,
    *,
    on_task: Callable[[dict[str, Any]], None] | None = None,
    failed: dict[str, str] | None = None,
    log_file: Path | None = None,
) -> dict[str, Any]:
    """lm-eval's simple_evaluate of `lm` (an lm-eval LM) on the planned tasks; its results dict.

    One simple_evaluate per planned task (or group), so that each has its own time and a progress
    line as soon as it is done; the dicts are merged into the one a single call returns (lm-eval's
    seeds are reset per call: a task scores as when evaluated alone). results["gristmill_tasks"]
    adds, per task: `seconds` and `docs` (per planned name), and for a GristmillHFLM the requests it
    got (`requests_summary`). `on_task` gets each task's own results dict when it is done (see
    `task_lines`). `failed`, when given, gets {task: why} for each task that raised instead of
    stopping the eval (in-training: the others are still scored). `log_file`: the eval's log, where
    the traceback of a task of the user's own that fails in lm-eval's task code is written (its one
    line names it)."""
    from lm_eval import simple_evaluate

    merged: dict[str, Any] = {}
    seen = getattr(lm, "requests_seen", None)  # GristmillHFLM's record of the requests it scored
    with _env_info_once():
        for spec in plan.specs:
            name = spec["task"] if isinstance(spec, dict) else spec
            if seen is not None:
                seen.clear()
            # as lm-eval reads the tasks now, each just before it is scored: a file replaced while an
            # earlier task was scored is recorded as read (review RV30c m1; their documents: at its marks)
            plan.refresh_definitions()
            t0 = time.perf_counter()
            try:
                with plan.cache(name):  # the files as they are now, whatever their mtime
                    results = simple_evaluate(
                        model=lm,
                        tasks=[spec],
                        task_manager=plan.task_manager,
                        num_fewshot=cfg.num_fewshot,  # None: each task's own; 0 passed: zero-shot
                        limit=cfg.limit or None,
                        bootstrap_iters=cfg.bootstrap_iters,
                        log_samples=log_samples,
                        random_seed=cfg.seed,
                        numpy_random_seed=cfg.seed,
                        torch_random_seed=cfg.seed,
                        fewshot_random_seed=cfg.seed,
                    )
            except Exception as e:  # lm-eval's and datasets' own errors: any of them fails only this task
                if failed is None:
                    # `gristmill eval`: a task's data that cannot be read is one line, not lm-eval's
                    # traceback (R21b F12), and so is a task of the user's own that fails while lm-eval
                    # builds or renders it (R23a M2); anything else (ours, a bug, the device) is raised
                    # as it is: read as the task's, it lost its traceback and blamed the data file (R21e 1)
                    if isinstance(e, GristmillError):
                        raise
                    if _reading_failed(e):  # most likely its data; the traceback kept, for when not (R23g M2)
                        where = _traceback_to(log_file, name, e)
                        raise EvalError(
                            f"task {name} could not be scored: {task_failure(plan, name, e)}{where}"
                        ) from e
                    if (own := plan.own_yamls(name)) is None or not _in_task_code(e):
                        raise
                    raise EvalError(own_task_failure(plan, name, own, e, log_file)) from e
                failed[name] = task_failure(plan, name, e) + _traceback_to(log_file, name, e)
                continue
            if results is None:  # only on non-zero ranks of a distributed run
                raise EvalError("lm-eval returned no results")
            docs = sum(int(n.get("effective", 0)) for n in results.get("n-samples", {}).values())
            if docs == 0:  # a group lm-eval built with no member (`task: own_mc`, one string): 0 docs,
                # "(no rows)", exit 0 (review R23k 1)
                why = (
                    f"task {name} scored no document: lm-eval built it with none (a group's `task:` must be "
                    "a list of its members; a member's data may be empty)"
                )
                if failed is None:
                    raise EvalError(why)
                failed[name] = why
                continue
            tasks = requests_summary(seen or {}, results, getattr(lm, "max_length", 0))
            settings = score_settings(
                cfg,
                plan.heldout if name in plan.local else None,
                plan.definitions.get(name),
                plan.contents.get(name),
            )
            tasks.setdefault(name, {}).update(
                scored_by=name,
                seconds=round(time.perf_counter() - t0, 3),
                docs=docs,
                settings=settings,
                n_shot=results.get("n-shot", {}),  # what each (sub)task was scored with
            )
            # a group's members were scored under its settings: each says so itself (one member of two
            # groups scored one after the other took the other group's: review R25f 1), with its own
            # definition where it is a task of its own scored as it is (R30a F2)
            overridden = plan.overridden(name) if name not in plan.local else {}
            for member in results.get("results", {}):
                # a member the group changes by its own keys was scored as the group's variant (RV33f F3)
                changed = member in overridden or member in plan.reconfigured.get(name, set())
                own = None if changed else plan.member_definitions.get(member)
                mine = (
                    settings if own is None else score_settings(cfg, None, own, plan.member_contents[member])
                )
                tasks.setdefault(member, {}).setdefault("settings", mine)
                tasks[member].setdefault("documents_rule", DOCUMENTS_RULE)  # of whatever it scored
                tasks[member].setdefault("scored_by", name)  # whose scores they are (review RV30c m3)
            documents = functools.partial(plan.documents_sha256, name)  # its leaves as `name` built them
            for task, mark in decontamination_marks(results, plan.training_data, documents).items():
                tasks.setdefault(task, {})["decontamination"] = mark
            # read for its marks alone: its data not kept past them (R23k 2), read again at the next step's
            # (a data file replaced during a watch or a training run: R23g S1, R23h S3)
            plan.forget_documents()
            results[GRISTMILL_TASKS] = tasks
            # a member a group overrides is another task than the one of its name: recorded under its
            # group's, never in the place of the task's own scores (R30a F2)
            for member, group in overridden.items():
                renamed_task(results, member, f"{group}::{member}")
            if on_task is not None:
                on_task(results)
            merged = merge_results(merged, results)
    return merged


def scored_num_fewshot(configured: Any, passed: int | None) -> Any:
    """The num_fewshot lm-eval's simple_evaluate scores a task under whose config says `configured`,
    `passed` its num_fewshot argument (EvalConfig.num_fewshot): `passed` unless the config says 0;
    without one, the config's, none as 0."""
    if passed is not None:
        return configured if configured == 0 else passed
    return 0 if configured is None else configured


def _reading_failed(error: BaseException) -> bool:
    """Whether `error` or one it wraps is a task's data that cannot be read: an OSError (a file missing,
    unreadable), or datasets' or pyarrow's own (a file that does not parse: R21f 2a)."""
    return any(
        isinstance(inner, OSError) or type(inner).__module__.split(".")[0] in ("datasets", "pyarrow")
        for inner in wrapped(error)
    )


# Where an error that passed through one of these modules comes from gristmill, the model or the device,
# not from a task's templates or functions (_in_task_code).
_NOT_TASK_CODE = ("validation", "training", "pipelines", "tokenization", "lm_eval.models", "torch",
                  "transformers", "accelerate")  # fmt: skip


def _in_task_code(error: BaseException) -> bool:
    """Whether `error` was raised while lm-eval built or rendered a task (its task classes, a template,
    a task's own function) and nowhere in gristmill's code, the model's or the device's (after the
    frame that caught it)."""
    frames = [f for f, _ in traceback.walk_tb(error.__traceback__)][1:]
    modules = [str(f.f_globals.get("__name__", "")) for f in frames]
    if any(m == top or m.startswith(f"{top}.") for m in modules for top in _NOT_TASK_CODE):
        return False
    return any(m.startswith(("lm_eval.api.task", "lm_eval.tasks")) for m in modules)


def own_task_failure(
    plan: TaskPlan, name: str, own: list[Path], error: BaseException, log_file: Path | None
) -> str:
    """The one line for task `name` of the user's own (its YAMLs `own`: TaskPlan.own_yamls) whose `error`
    was raised in lm-eval's task code only (_in_task_code), its traceback written to `log_file`. Most
    likely the YAML's or its functions' (a template, process_docs), but the frames cannot tell: a model
    whose results lm-eval cannot read (loglikelihood's bare floats) raises there too, in the task's
    process_results (review R23d 4). So the line says where the traceback is, and that it is a bug to
    report if the task is right."""
    files = ", ".join(map(str, own))
    where = _traceback_to(log_file, f"{name} ({files})", error)
    return (
        f"task {name} ({files}) failed in lm-eval's task code (building, rendering or scoring it): "
        f"{task_failure(plan, name, error)}{where}. Check the task's YAML and its functions; if they are "
        f"right, this is a bug: report it{' with that log' if where else ''}"
    )


def _traceback_to(log_file: Path | None, task: str, error: BaseException) -> str:
    """`error`'s traceback appended to the eval's log `log_file`, and "; the full traceback is in …"
    for the line that names the failure ("" without a log): an in-training eval that dropped a task
    kept no traceback anywhere, and a bug of the in-process model could not be found (review R23g M1)."""
    if log_file is None:
        return ""
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(f"task {task} failed:\n{''.join(traceback.format_exception(error))}")
    except OSError:
        return ""
    return f"; the full traceback is in {log_file}"


def task_failure(plan: TaskPlan, name: str, error: BaseException) -> str:
    """One line on why task `name` could not be scored: the innermost error's first line (lm-eval and
    datasets wrap the one that says what happened), after the local task's data file where reading its
    data failed (_reading_failed): the file alone where the error names it, else the file or datasets'
    cache of it. Any other error (the device's, the model's) blames no file (review R21h 2, 3)."""
    reading = _reading_failed(error)
    while (inner := error.__cause__ or error.__context__) is not None:
        error = inner
    first = (str(error).splitlines() or [""])[0]
    where = ""
    if name in plan.local and reading:
        data = plan.data_dir / task_file(name)
        own = isinstance(error, OSError) and str(getattr(error, "filename", "")) == str(data)
        where = f"{data}: " if own else f"{data} (or datasets' cache of it): "
    return f"{where}{type(error).__name__}: {first}" if first else f"{where}{type(error).__name__}"


_ENV_INFO: dict[str, Any] = {}


@contextmanager
def _env_info_once() -> Iterator[None]:
    """lm-eval's add_env_info (torch's collect_env: about a second of subprocesses per
    simple_evaluate) computed once per process and copied into each task's results: the environment
    does not change between the tasks of an eval, nor between the evals of a training run."""
    import lm_eval.evaluator as evaluator

    original = evaluator.add_env_info

    def once(storage: dict[str, Any]) -> None:
        if not _ENV_INFO:
            original(_ENV_INFO)
        storage.update(_ENV_INFO)

    evaluator.add_env_info = once
    try:
        yield
    finally:
        evaluator.add_env_info = original


def requests_summary(
    seen: dict[str, Any], results: dict[str, Any], max_length: int
) -> dict[str, dict[str, Any]]:
    """{task: what the model was asked} from a GristmillHFLM's `requests_seen` (TaskRequests):
    documents, requests, documents cut from the left to fit (`cut_docs`, the longest input in tokens,
    the `limit` it had to fit) and, for a multiple-choice task, the `chance` accuracy: the mean of
    1/choices over its documents."""
    out = {}
    for task, req in seen.items():
        info: dict[str, Any] = {
            "requests": sum(req.per_doc.values()),
            "cut_docs": len(req.cut_docs),
            "of_docs": len(req.per_doc),
            "cut_requests": req.cut_requests,
            "longest": req.longest,
            "limit": req.limit,
            "max_length": max_length,
        }
        config = results.get("configs", {}).get(task, {})
        if config.get("output_type") == "multiple_choice" and req.per_doc:
            # acc_mutual_info adds one unconditional request per choice
            per_choice = (
                2 if any(m.get("metric") == "acc_mutual_info" for m in config.get("metric_list", [])) else 1
            )
            info["chance"] = sum(per_choice / n for n in req.per_doc.values()) / len(req.per_doc)
        out[task] = info
    return out


def task_lines(
    step: int, results: dict[str, Any], context: int, setting: str = "--set max_length=N"
) -> list[str]:
    """The terminal lines of evaluated tasks (evaluate_lm's results, or one task's from its
    `on_task`): `[eval] step 150 heldout_ppl: 40 docs, 3.1 s` per task, then one warning per task
    whose inputs lm-eval cut from the left to fit the context, with the numbers and `setting`, the
    way to give it more (`gristmill eval`'s, or the training's eval.max_length), where max_length is
    below the model's `context` (its max_seq_len); at it, that nothing longer fits (review R24b 3)."""
    tasks = results.get(GRISTMILL_TASKS, {})
    lines = [
        f"[eval] step {step} {name}: {info['docs']} docs, {info['seconds']:.1f} s"
        for name, info in tasks.items()
        if "seconds" in info
    ]
    for task, info in tasks.items():
        if info.get("cut_docs"):
            limit, max_length = info["limit"], info["max_length"]
            room = (
                f"max_length {limit} tokens"
                if limit == max_length
                else f"the {limit} tokens max_length {max_length} leaves for the prompt"
            )
            more = (
                f"{setting}, up to the model's max_seq_len {context}, evaluates more"
                if max_length < context
                else f"max_length is the model's whole context, {context} tokens: no longer one fits it"
            )
            lines.append(
                f"warning: step {step} {task}: {info['cut_docs']} of {info['of_docs']} documents "
                f"({info['cut_requests']} of {info['requests']} requests) are longer than {room} (longest "
                f"{info['longest']}) and were cut from the left; scores at this length "
                f"measure a truncated task ({more})"
            )
    return lines


def _device(choice: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if choice == "auto" else choice


def _log(message: str) -> None:
    print(f"[eval] {message}", file=sys.stderr, flush=True)


def check_writable(run_dir: Path) -> None:
    """Refuse, before any work, a run directory the eval cannot write its results into (read-only
    mount, permissions): one line naming it, instead of an OSError after the model has run."""
    for where in (run_dir, run_dir / EVAL_DIR):
        if where != run_dir and not where.is_dir():
            continue  # made later inside run_dir, which is checked
        try:
            fd, probe = tempfile.mkstemp(prefix=".gristmill-write-probe-", dir=where)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise EvalError(
                f"cannot write in {where}: {e.strerror or e}; gristmill eval writes its results into the run "
                f"directory ({EVAL_DIR}/, {EVAL_PARQUET}, {EVAL_PLOT}): make {run_dir} writable, or evaluate "
                "a writable copy of it (config.toml and the step's exports/ or checkpoints/ directory)"
            ) from None


def check_finite_weights(lm: Any, export: Path, dtype: str) -> None:
    """Raise EvalError naming the export and the first parameter of the loaded model holding NaN/inf."""
    bad = nonfinite_tensor(lm.model.named_parameters())
    if bad is not None:
        hint = " (float16 cannot hold values beyond ±65504: try dtype=bfloat16)" if dtype == "float16" else ""
        raise EvalError(
            f"export {export} holds non-finite weights as loaded in {dtype}{hint}: {bad}; nothing was "
            f"evaluated. Evaluate another step, or {export_fix(export, 'model.safetensors')}"
        )


def nonfinite_error(run_dir: Path, step: int, results: dict[str, Any]) -> NonFiniteMetricsError | None:
    """One warning line per task with a NaN/inf metric (to stderr); the error to raise when some task
    has no finite metric at all, else None."""
    dead = []
    for task, (bad, none_finite) in sorted(nonfinite_metrics(step, results).items()):
        print(
            f"warning: step {step} {task}: {', '.join(map(describe_metric, bad))} "
            f"({'no metric of it is finite' if none_finite else 'not finite'}): the model's log-likelihoods "
            "are NaN or inf",
            file=sys.stderr,
            flush=True,
        )
        if none_finite:
            dead.append(task)
    if not dead:
        return None
    return NonFiniteMetricsError(
        f"step {step}: no metric of {', '.join(dead)} is finite (NaN/inf log-likelihoods: the model's "
        "activations overflow or it diverged); the values are kept in "
        f"{eval_dir(run_dir, step) / RESULTS_JSON} and {run_dir / EVAL_PARQUET}",
        step,
    )


def model_max_length(export: Path) -> int:
    """The default max_length: the model's max_seq_len, as its export's config.json records it."""
    return int(json.loads((Path(export) / "config.json").read_text())["max_position_embeddings"])


def _discarded(run_dir: Path, step: int, made: Path | None, identity: tuple[int, int] | None) -> None:
    """Raise DiscardedStepError for step `step`, whose weights a rewind set aside while they were
    evaluated; `made`: the export this eval wrote from the discarded checkpoint, removed (the
    retrained step's own is written there), if it is still the one it wrote."""
    if made is not None:
        with eval_lock(run_dir):
            if identity is not None and _dir_identity(made) == identity:
                shutil.rmtree(made)
    skip = skip_of(tuple(_rewinds(run_dir) or ()), step)
    if skip is not None and final_weights_note(run_dir, step) is not None:  # the plan's last step: its
        skip = None  # final weights are scored as it again (review R17h)
    then = (  # a step a rewind skipped is never trained again (review R17d M5)
        f"it lies in rewind {skip.rewind}'s skip (steps {skip.first_step}–{skip.last_step}): never trained "
        "again"
        if skip is not None
        else "evaluate the step again once it is retrained"
    )
    raise DiscardedStepError(
        f"step {step} was not recorded: a rewind of the running training set its checkpoint or export "
        f"aside while it was evaluated (a discarded timeline's weights); {then}"
    )


def _rewinds(run_dir: Path) -> set[Skip] | None:
    """The rewinds RUN/data_plan.json records, compared as a set (a resume from an older checkpoint
    rewrites them shorter); None where there is none to read (a run from before the file, whose
    resume writes it with its past rewinds, all of which would look new; or one damaged since,
    which the eval's own start refused): the identity checks alone then decide."""
    try:
        description = recorded_plan(run_dir, sources=False)
    except GristmillError:
        return None
    return None if description is None else set(skips_from(description))


def _set_aside(path: Path, identity: tuple[int, int] | None) -> bool:
    """Whether the step directory `path` had when `identity` was taken now lies set aside as a
    discarded timeline's (renamed abandoned-…: run_layout.abandoned_name), not deleted by retention."""
    if identity is None or _dir_identity(path) == identity:
        return False
    return any(_dir_identity(p) == identity for p in abandoned_copies(path))


def _dir_identity(path: Path) -> tuple[int, int] | None:
    """A directory as created (a rename keeps it, a new one of that name is another), None if gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _tokenizer_files_named(run_dir: Path, export: Path) -> dict[str, Path]:
    """The tokenizer files a refusal names: the base's copies in RUN/base/ where the run has a base
    (what to edit before exporting again), else the export's own (RUN/base/ unreadable: the export's;
    the eval does not depend on it)."""
    try:
        base = base_files(run_dir)
    except GristmillError:
        base = {}
    return {n: export / n for n in TOKENIZER_FILES} | base


def evaluate_step(
    run_dir: str | Path,
    step: int,
    cfg: EvalConfig,
    plan: TaskPlan | None = None,
    verbose: bool = False,
    merged: bool = False,
) -> Path:
    """Evaluate one step; returns RUN/eval/step-N/results.json. Raises NonFiniteMetricsError after
    writing everything when some task has no finite metric. The libraries' own output goes to
    RUN/eval/step-N/eval.log (`verbose`: to the terminal as well). `merged`: the merged weights of
    [merge] at that step (RUN/exports/merged-step-N, results in RUN/eval/merged-step-N)."""
    from validation.eval_model import GristmillHFLM

    run_dir = Path(run_dir)
    if not merged and (why := untrained_reason(run_dir, step)):
        raise EvalError(why)
    plan = plan or TaskPlan(run_dir, cfg)
    # the step's own results.json, which the scores are merged into, before scoring (another step's
    # damaged one costs the table and the plot a warning, not this step's scores: trial RV61b F1)
    read_step_results(run_dir, step, merged)
    # The local tasks' files as built, whose documents the scores record (a watch's plan is made once:
    # one cut during it was scored and recorded as the documents built: review R25m 2), as the
    # in-training eval checks them before each eval
    if plan.local and (damaged := damaged_task_files(plan.data_dir, plan.local)):
        raise EvalError(
            f"{damaged[0]}: not as {damaged[0].parent / DATA_META} recorded (changed or deleted since it was "
            f"built); run the command again: its data is built again from the run's held-out documents"
        )
    # What the scores are of, to check under the eval lock when they are written (a rewind of the
    # running training sets both aside, as a discarded timeline's): the export, and where it is
    # written here from the checkpoint, the checkpoint read (a rewind after the read left the new
    # export a discarded timeline's; retention deleting it, as checkpoint.keep_last does, did not),
    # and the rewinds RUN/data_plan.json records (one back past the step discarded it, even where
    # its abandoned-step-N was deleted since).
    ckpt = checkpoint_dir(run_dir, step)
    rewinds = _rewinds(run_dir)
    made = _dir_identity(export_dir(run_dir, step, merged)) is None
    read = _dir_identity(ckpt) if made else None
    # The existing export, its files verified against its checksums (a note for an old export without
    # them), or one written from checkpoint N (whose files and weights are verified first).
    try:
        export = export_checkpoint(run_dir, step, log=_log, merged=merged)
    except CheckpointSetAside:  # the export it wrote from the checkpoint is set aside with it
        _discarded(run_dir, step, None, None)
    except GristmillError:
        # Its checkpoint went while it was read, and another process (a second watch, an `eval
        # --step`, `gristmill export`) exported it meanwhile: scored from that export (a watch died of
        # it, exit 2: trial RV66d F3). Only here: an export this eval wrote, then a failure of its own
        # while a retention deleted the checkpoint, is that failure (review RV67d 2).
        there = export_dir(run_dir, step, merged)
        if not (made and there.is_dir() and not checkpoint_dir(run_dir, step).is_dir()):
            raise
        _log(f"step {step}: its checkpoint went while it was read; scored from {there}")
        made = False  # another's
        export = export_checkpoint(run_dir, step, log=_log, merged=merged)
    scored = _dir_identity(export)

    def still() -> bool:
        same = scored is not None and _dir_identity(export) == scored
        now = _rewinds(run_dir) if rewinds is not None else None
        rewound = now is not None and any(s.checkpoint_step < step for s in now - rewinds)
        return same and not rewound and not (made and _set_aside(ckpt, read))

    if not still():
        _discarded(run_dir, step, export if made else None, scored)
    # Read with this process's transformers, which the scores depend on: the export's files were
    # checked under the exporting box's, or under none (a training box without the eval extra), and a
    # transformers that reads a key otherwise scored ids the model never trained on (review RV29a F3).
    try:
        check_export_tokenizer(export, export, _tokenizer_files_named(run_dir, export), scoring=True)
    except ExportError as e:
        raise EvalError(str(e)) from None
    most = model_max_length(export)
    if cfg.max_length > most:  # transformers' RoPE takes any position: the scores would be of untrained ones
        raise EvalError(
            f"max_length = {cfg.max_length} is longer than the model's context, {most} tokens "
            f"(max_position_embeddings in {export / 'config.json'}): set max_length ≤ {most} (0: the model's)"
        )
    _log(f"step {step}: {', '.join(plan.names)} on {export}{plan.heldout_note()}{plan.cwd_note()}")
    t0 = time.time()
    log_file = eval_dir(run_dir, step, merged) / EVAL_LOG
    max_length = cfg.max_length or most
    if note := plan.length_note(max_length, step):
        _log(f"step {step}: {note}")
    with eval_output(log_file, verbose) as terminal:
        try:
            lm = GristmillHFLM(
                pretrained=str(export),
                device=_device(cfg.device),
                dtype=cfg.dtype,
                batch_size=cfg.batch_size,
                max_length=max_length,
            )
        except Exception as e:  # e.g. SafetensorError: a truncated file in an export without checksums
            if isinstance(e, GristmillError):
                raise
            first = str(e).splitlines()[0] if str(e) else ""
            raise EvalError(
                f"cannot load export {export} ({type(e).__name__}: {first}); "
                f"{export_fix(export, 'the files it cannot load')}"
            ) from None
        check_finite_weights(lm, export, cfg.dtype)

        def show(task_results: dict[str, Any]) -> None:
            for line in task_lines(step, task_results, most):
                print(line, file=terminal, flush=True)

        results = evaluate_lm(lm, plan, cfg, on_task=show, log_file=log_file)
    label_results(results, run_dir, step, str(export.resolve()), plan)
    out = write_step_json(
        run_dir,
        step,
        dict(results),
        merged,
        still=still,
        own_config=plan.own_config,
        documents_before=plan.documents_before,
    )
    if out is None:
        _discarded(run_dir, step, export if made else None, scored)
    save_config(cfg, eval_dir(run_dir, step, merged) / "config.toml")
    # the scores are written: a plot that cannot be is a warning
    if cfg.plot and (warning := write_plot(run_dir)):
        print(warning, file=sys.stderr, flush=True)
    elif not cfg.plot and (note := undrawn_plot_note(run_dir, step, "plot")):
        print(note, file=sys.stderr, flush=True)
    _log(f"step {step} took {time.time() - t0:.0f} s: {out} (the libraries' log: {log_file.name})")
    error = nonfinite_error(run_dir, step, results)
    if error is not None:
        raise error
    return out


# bootstrap_iters: the stderrs' (0: none), not the values' (review R30a m1)
SCORE_SETTINGS = ("limit", "num_fewshot", "max_length", "dtype", "docs", "seed", "bootstrap_iters")
# what the records gained later: scores recorded before one of them count as done under any of its values
# (bootstrap_iters: as the value every eval used then, eval_results.SETTINGS_BEFORE)


def score_settings(
    cfg: EvalConfig,
    heldout: HeldOut | None = None,
    definition: str | None = None,
    documents: str | None = None,
) -> dict[str, Any]:
    """What a task's scores depend on besides the weights (results.json records it per task, as
    given: max_length 0 is the model's own), so a step scored under other settings (the in-training
    eval's limit, an earlier `--set`) is not taken for done. A local task's (`heldout`: whose
    held-out documents it scores) also `docs`, how many, and `heldout` (eval.source changed on a
    resume: review R17a F1); a hub task was scored again for them. `definition`: the task's own
    (TaskPlan.definitions), so that a task edited since is scored again (review R23a S1); `documents`:
    the sha256 of the local files it read (TaskPlan.contents), so that one whose data changed is (R30a F1)."""
    settings = {key: getattr(cfg, key) for key in SCORE_SETTINGS}
    if definition is not None:
        settings["definition"] = definition
    if documents is not None:
        settings["documents"] = documents
    if heldout is not None:
        return settings | {"heldout": heldout.record()}
    return {k: v for k, v in settings.items() if k not in LOCAL_SETTINGS}


def _as_now(results: dict[str, Any], name: str, holder: str | None, want: dict[str, Any]) -> dict[str, Any]:
    """Task `name`'s recorded settings in today's terms (those of entry `holder`, eval_table.
    settings_holders: its own, or its group's or tag's; None: recorded before settings were, {}), and
    `want` without what they predate: scores recorded before the task's definition or its documents'
    digest was (LATER_SETTINGS) count under any; before bootstrap_iters was, under the value used then
    (`as_used`, as task `name`'s record `results` says it); num_fewshot as passed then
    (eval_results.num_fewshot_passed of the entry that recorded it: a 0 from before the n-shot record
    was the task's own, passed as None: review R23a S3). Of a group's or tag's entry only the keys a
    member's own record holds (eval_table.settings_held; `evaluated` holds the group's definition and
    documents to the group's as it is now)."""
    if holder is None:
        return {}
    got = as_used(settings_held(results, name, holder), results, name)
    for key in LATER_SETTINGS:
        if got and key not in got:
            want.pop(key, None)
    if "num_fewshot" in got:
        got["num_fewshot"] = num_fewshot_passed(results, holder)
    return got


def label_results(results: dict[str, Any], run_dir: Path, step: int, model: str, plan: TaskPlan) -> None:
    """results.json's `gristmill` header (the run, the step, the model scored: an export, or the
    in-training weights) and each task's own `model` and the id of the run scoring it (SCORING_RUN):
    later evals of the step merge their tasks into the file, and the header is the newest's."""
    results["gristmill"] = {"run": str(run_dir.resolve()), "step": step, "export": model}
    if plan.local:
        results["gristmill"]["heldout"] = plan.data.heldout()
    run_id = read_ledger(run_dir).run
    for info in results.get(GRISTMILL_TASKS, {}).values():
        info["model"] = model
        if run_id is not None:
            info[SCORING_RUN] = run_id


def evaluated(
    run_dir: str | Path,
    step: int,
    names: list[str],
    local: list[str],
    heldout: HeldOut | None,
    cfg: EvalConfig,
    definitions: dict[str, str] | None = None,
    contents: dict[str, str | None] | None = None,
    scored_as: dict[str, list[str]] | None = None,
    tag_members: Callable[[str], Sequence[str] | None] | None = None,
    scoring_as_is: Callable[[str, str], dict[str, str | None] | None] | None = None,
) -> bool:
    """Whether step `step` has scores of every task of `names` under `cfg`'s settings (a task recorded
    before they were counts as done under any; a group's or tag's member recorded before members
    recorded theirs, under its group's or tag's: eval_table.settings_holders) and, where
    `definitions` (TaskPlan.definitions) are given, of the same task definitions and `contents`, the
    digests of the local files they read (`_as_now`: one recorded before them counts as the same); a
    tag's scores are its members' (`scored_as`, TaskPlan.scored_as: lm-eval records no tag: review
    R30a F3), each under its own definition and contents where these hold its name (a member scored as
    it is records its own). `tag_members` (TaskPlan.tag_members): a tag's where its entry names no
    n_shot, for a member recorded without settings under its tag's entry, and only where that entry's
    definition and documents are those of the group or tag now, which scores the member as it is
    (`scoring_as_is`, TaskPlan.scoring_as_is: review RV35a F1, F1b); a member with none of its own and
    no such entry in a file that records some is not done (its group was scored again since); a task's
    own entry without settings is older than them, done under any. The `local` tasks' must be of
    `heldout`'s documents (`HeldOut.scored`: recorded before it was per task, the file's header says
    whose, kept per task when a later eval replaces the header, eval_results.merge_results)."""
    results = read_step_results(run_dir, step)
    scored, tasks = results.get("results", {}), results.get(GRISTMILL_TASKS, {})
    header = results.get("gristmill", {}).get("heldout")
    # written since settings were recorded (ed48cab): a task of no known settings there is not done
    recorded = any(isinstance(i, dict) and isinstance(i.get("settings"), dict) for i in tasks.values())

    def same(name: str, planned: str, holder: str | None) -> bool:  # `name`'s scores, as planned name
        # `planned` makes them, under the settings of entry `holder` (settings_holders)
        if holder is None and recorded and not scored_itself(tasks.get(name, {})):
            return False  # a member whose group or tag was scored again since; a task's own entry
            # without settings is older than settings (ed48cab): done under any, as in a file of its own
        if holder not in (None, name):  # its group's or tag's entry vouches for them only as it is now
            vouched = {key: tasks[holder]["settings"].get(key) for key in LATER_SETTINGS}
            if scoring_as_is is None or scoring_as_is(holder, name) != vouched:
                return False
        info = tasks.get(name, {})
        key = name if name in (definitions or {}) else planned  # a tag's member: its own definition
        definition = (definitions or {}).get(key)
        if name not in local or heldout is None:
            want = score_settings(cfg, definition=definition, documents=(contents or {}).get(key))
            got = _as_now(results, name, holder, want) or want  # no settings: done under any
            return {k: v for k, v in got.items() if k in want} == want
        want = {k: v for k, v in score_settings(cfg, heldout, definition).items() if k != "heldout"}
        got = _as_now(results, name, holder, want)
        whose = got.pop("heldout", info.get("heldout", header))  # its own record, else its file's header
        return heldout.scored(whose) and (not got or got == want)  # no settings: done under any

    return all(
        m in scored and all(same(m, n, h) for h in settings_holders(results, m, tag_members) or [None])
        for n in names
        for m in (scored_as or {}).get(n, [n])
    )


def evaluate_missing(
    run_dir: str | Path,
    cfg: EvalConfig,
    plan: TaskPlan,
    show: bool = True,
    failures: list[NonFiniteMetricsError] | None = None,
    verbose: bool = False,
    told: set[int] | None = None,
    looked: set[int] | None = None,
) -> list[int]:
    """Evaluate every available step without scores of the plan's tasks under `cfg`'s settings; returns them.
    `looked`: gains the steps this look found (a watch's: a save none found went by, said).

    A step with a task whose metrics are all NaN/inf does not stop the others: its error goes to
    `failures` when a list is given, else the errors are raised together once every step is done. So
    does a step whose results.json is damaged or another run's (it stopped every later step: trial
    RV61b F1): said once (`told`, a watch's steps said so far), and raised once every step is done
    where no `failures` list is given."""
    done, failed, damaged = [], [], []
    told = set() if told is None else told
    # Step 0 of a run from a base model is the base, scored as `--step 0` scores it: a watch beside a
    # run without [eval] never scored the baseline (trial RV63b 10); `told` holds -1 once step 0's
    # failure was said (tried again at each look, said once: review RV64d 4)
    from_base = [0] if run_config(run_dir).model.init_from else []
    steps = from_base + [s for s in available_steps(run_dir) if s not in from_base]
    if looked is not None:
        looked.update(steps)
    for step in steps:
        plan.refresh_definitions()  # a task edited since the last step is not done (review R23d 2)
        try:
            scored = evaluated(
                run_dir,
                step,
                plan.names,
                plan.local,
                plan.heldout,
                cfg,
                {**plan.member_definitions, **plan.definitions},  # a tag's members record their own
                {**plan.member_contents, **plan.contents},
                plan.scored_as,
                plan.tag_members,
                plan.scoring_as_is,
            )
        except EvalResultsError as e:
            damaged.append(e)
            if step not in told:
                told.add(step)
                _log(f"step {step} not scored: {e}; the other steps go on")
            continue
        if not scored:
            try:
                evaluate_step(run_dir, step, cfg, plan, verbose)
            except NonFiniteMetricsError as e:
                failed.append(e)
            except DiscardedStepError as e:  # the watch scores the retrained step when it appears
                _log(f"{e}; the watch goes on")
                continue
            except GristmillError as e:
                went = step_went(run_dir, step)
                if step in from_base and went:
                    # the base not at hand (moved, or a hub base offline): its own line, once, not at
                    # every look, nor called a checkpoint deleted by retention (review RV64c 5)
                    if -1 not in told:
                        told.add(-1)
                        _log(f"step 0 (the base) not scored: {e}; the other steps go on (tried at each look)")
                    continue
                if not went:
                    raise
                # A running trainer's retention (checkpoint.keep_last) deleted it meanwhile: the watch
                # goes on with the steps that are there.
                _log(
                    f"step {step} skipped: its checkpoint went away before it was evaluated (a running "
                    "run's checkpoint.keep_last, or a rewind that set it aside; checkpoint.export_interval "
                    "keeps exports for a lagging eval)"
                )
                continue
            if show:
                print_table(run_dir, [step])
            done.append(step)
    if failures is not None:
        failures.extend(failed)
    elif failed:
        raise _joined(failed)
    elif damaged:
        raise damaged[0]
    return done


def _joined(errors: list[NonFiniteMetricsError]) -> NonFiniteMetricsError:
    if len(errors) == 1:
        return errors[0]
    return NonFiniteMetricsError("; ".join(map(str, errors)), errors[0].step)


def watch(
    run_dir: str | Path,
    cfg: EvalConfig,
    poll_s: float = 30.0,
    idle_exit_s: float = 0.0,
    verbose: bool = False,
) -> int:
    """Evaluate each step that gains an export (or complete checkpoint) until interrupted, or until
    nothing new appeared for `idle_exit_s` seconds (0: never). Steps with a task whose metrics are
    all NaN/inf do not stop the watch; they make it end with NonFiniteMetricsError."""
    run_dir = Path(run_dir)
    plan = TaskPlan(run_dir, cfg)
    last_new = time.time()
    failures: list[NonFiniteMetricsError] = []
    _log(f"watching {run_dir} every {poll_s:g} s (Ctrl-C stops)")
    before, seen, said, told = set(read_ledger(run_dir).saves), set(), set(), set()
    try:
        while True:
            found = evaluate_missing(
                run_dir, cfg, plan, failures=failures, verbose=verbose, told=told, looked=seen
            )
            if found:
                last_new = time.time()
            # RUN/checkpoints.jsonl's saves since the watch began that no look found: deleted while it
            # scored another step, they went by without a line (trial RV59a F4). Less those there now
            # (the next look's: a step found here and deleted before it went by unsaid, RV66d F1), a
            # rewind's saves of earlier weights and the steps the run's own [eval] scored (RV59f 2).
            saved = {s for s, i in read_ledger(run_dir).saves if (s, i) not in before}
            there = set(available_steps(run_dir))
            now = there | untrained_steps(run_dir)
            scored = {s for s in saved if (eval_dir(run_dir, s) / RESULTS_JSON).is_file()}
            missed = sorted(saved - seen - now - scored - said)
            if missed:
                said |= set(missed)
                _log(
                    f"step{'s' if len(missed) > 1 else ''} {', '.join(map(str, missed))} skipped: saved and "
                    "gone (a running run's checkpoint.keep_last, or a rewind that set them aside) before the "
                    "watch looked; checkpoint.export_interval keeps exports for a lagging eval"
                )
            # a step that appeared after the look is new: looked at before an idle exit (it went unscored)
            if idle_exit_s and time.time() - last_new > idle_exit_s and not there - seen:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        pass
    if failures:
        raise _joined(failures)
    return 0


def print_table(run_dir: str | Path, steps: list[int] | None = None, out=None, merged: bool = False) -> None:
    """The eval rows of `steps` (all when None) as a table: step, task, metric, value, stderr,
    samples and, on a task's first row, whether the training data was decontaminated against it (and
    the settings it was scored under, where a task's rows differ);
    bits per byte first (comparable across tokenizers), then the perplexities, then accuracies.
    `merged`: the rows of [merge]'s merged weights instead of the raw ones. Read from the steps'
    results.json, as eval.parquet's are: the table is not rebuilt while another step's is damaged,
    and the step just scored was shown from it (trial RV61b F1)."""
    from validation.audit import Result, format_table

    by_step = (
        read_results(run_dir, merged)
        if steps is None
        else {s: res for s in steps if (res := read_step_results(run_dir, s, merged))}
    )
    rows = result_rows(by_step, merged)
    cols = ["step", "task", "metric", "value", "stderr", "samples", "decontamination"]
    settings: dict[str, set] = {}
    for r in rows:
        settings.setdefault(r["task"], set()).add(r.get("settings"))
    if any(len(s) > 1 for s in settings.values()):  # a task's rows scored under other settings: say which
        cols.append("settings")
    picked, shown = [], set()
    for r in sorted(rows, key=metric_order(rows)):
        first = (r["step"], r["task"]) not in shown  # the task's mark and settings once, on its first row
        shown.add((r["step"], r["task"]))
        picked.append(
            tuple(r.get(c) if c not in ("decontamination", "settings") or first else None for c in cols)
        )
    print(format_table(Result("eval", cols, picked), max_rows=None), file=out or sys.stdout, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n")[1]
    parser.add_argument(
        "run", metavar="RUN", action=PathArgument, help="training run directory (holds config.toml, exports/)"
    )
    parser.add_argument(
        "--config",
        action=PathArgument,
        help="eval recipe (TOML), e.g. configs/eval/demo.toml (default: built-in)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override recipe fields, e.g. --set batch_size=16 limit=50",
    )  # fmt: skip
    parser.add_argument("--tasks", help="comma-separated task names (overrides the recipe's `tasks`)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="step to evaluate (default: the newest export or checkpoint)")
    which.add_argument(
        "--watch", action="store_true", help="evaluate every step, and each new one as it appears"
    )
    which.add_argument(
        "--table",
        action="store_true",
        help=f"score nothing: write RUN/{EVAL_PARQUET} and RUN/{EVAL_PLOT} again from "
        f"RUN/{EVAL_DIR}/*/results.json (a damaged or deleted table)",
    )
    parser.add_argument(
        "--merged",
        action="store_true",
        help="evaluate the merged weights of [merge] at --step (default: the newest step that has them), "
        "from RUN/exports/merged-step-N or exported from its checkpoint; results in RUN/eval/merged-step-N",
    )
    parser.add_argument("--poll", type=float, help="--watch: seconds between looks (default 30)")
    parser.add_argument(
        "--idle-exit",
        type=float,
        help="--watch: stop after this many seconds with nothing new (default 0: never)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="show lm-eval's, transformers' and datasets' logs and progress bars "
        f"(always written to RUN/eval/step-N/{EVAL_LOG})",
    )  # fmt: skip


def load_eval_config(path: str | None, overrides: list[str], tasks: str | None = None) -> EvalConfig:
    if tasks is not None:  # --tasks '' names no task (it was ignored: the recipe's tasks ran)
        overrides = [*overrides, f"tasks={json.dumps(task_names([tasks]))}"]
    cfg = load_config(EvalConfig, path, overrides)
    check_eval_config(cfg)
    return cfg


def check_eval_config(cfg: EvalConfig) -> None:
    """Values no eval can use, refused in one line before any export or model is loaded (they were
    tracebacks from lm-eval, or a message to delete a good export)."""
    at_least = {
        "batch_size": 1,
        "docs": 1,
        "limit": 0,
        "bootstrap_iters": 0,
        "max_length": 0,
    }
    if cfg.num_fewshot is not None and cfg.num_fewshot < 0:
        raise EvalError(f"num_fewshot = {cfg.num_fewshot} must be ≥ 0 (leave it out: each task's own)")
    for key, low in at_least.items():
        if getattr(cfg, key) < low:
            raise EvalError(f"{key} = {getattr(cfg, key)} must be ≥ {low}")
    # lm-eval seeds numpy with it, which refuses anything outside 32 bits with a traceback once the model
    # is loaded (trial RV72c T1); torch's CPU generator keeps those bits alone too
    if not 0 <= cfg.seed < 2**32:
        raise EvalError(f"seed = {cfg.seed} must be between 0 and {2**32 - 1} (lm-eval seeds numpy with it)")
    check_include_path(cfg.include_path)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        raise EvalError(f'device = "{cfg.device}" is not a device: "auto", "cpu", "cuda" or "cuda:N"')
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise EvalError(f'device = "{cfg.device}", but torch sees no CUDA GPU here; use "cpu" or "auto"')


def write_table(run_dir: Path, args: argparse.Namespace) -> int:
    """`gristmill eval RUN --table`: RUN/eval.parquet and eval.png written again from the results.json
    files, scoring nothing (a damaged or deleted table; a step scored again would replace scores
    recorded under other settings)."""
    scoring = [flag for flag, given in (("--merged", args.merged), ("--tasks", args.tasks),
               ("--set", args.overrides), ("--config", args.config)) if given]  # fmt: skip
    if scoring:  # ignored, they read as taken (review R18e 4)
        raise EvalError(
            f"--table scores nothing and writes the whole table (every task, raw and merged weights' "
            f"scores): drop {', '.join(scoring)}"
        )
    check_writable(run_dir)
    # each read is checked (read_step_results): a damaged results.json is named, not left out
    if not any([read_results(run_dir, merged) for merged in (False, True)]):
        raise EvalError(
            f"{run_dir} has no {EVAL_DIR}/*/results.json to write a table from: evaluate a step first "
            f"(gristmill eval {run_dir} --step N)"
        )
    with eval_lock(run_dir):
        write_eval_table(run_dir)
    if warning := write_plot(run_dir):  # the picture is this command's product: its failure is the exit
        raise EvalError(f"wrote {run_dir / EVAL_PARQUET}; {warning.removeprefix('warning: ')}")
    results = f"{run_dir / EVAL_DIR}/*/results.json"
    print(f"wrote {run_dir / EVAL_PARQUET} and {run_dir / EVAL_PLOT} from {results}")
    return 0


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    run_config(run_dir)  # refuses a directory that is not a training run, before any task work
    if args.table:  # before the recipe's checks: its options are refused, not checked (R18f 5)
        return write_table(run_dir, args)
    cfg = load_eval_config(args.config, args.overrides, args.tasks)
    if missing := missing_eval_module():  # before any work, not a ModuleNotFoundError once it scores
        raise EvalError(f"gristmill eval runs {missing}")
    check_writable(run_dir)
    merged = args.merged
    if args.watch:
        if merged:
            raise EvalError(
                "--watch evaluates each step's raw weights; evaluate merged weights with --step N --merged"
            )
        poll = 30.0 if args.poll is None else args.poll
        idle_exit = 0.0 if args.idle_exit is None else args.idle_exit
        if not 0 < poll < math.inf:
            # as typed (`--poll 0` was echoed as 0.0)
            raise EvalError(f"--poll {args.poll:g}: seconds between looks at the run; give a number > 0")
        if not 0 <= idle_exit < math.inf:  # -1 stopped after the first look, exit 0 (review R22a A6)
            raise EvalError(
                f"--idle-exit {args.idle_exit:g}: seconds with nothing new before the watch stops; give a "
                "number ≥ 0 (0: never)"
            )
        return watch(run_dir, cfg, poll, idle_exit, args.verbose)
    if given := [f for f, v in (("--poll", args.poll), ("--idle-exit", args.idle_exit)) if v is not None]:
        raise EvalError(
            f"{' and '.join(given)} {'pace' if len(given) > 1 else 'paces'} --watch, which this eval is not; "
            "add --watch or drop them"
        )
    steps = available_steps(run_dir, merged)
    weights = "merged weights" if merged else "export or complete checkpoint"
    step = args.step
    if step is None:
        if not steps and merged:
            # why, by the newest checkpoint's step, as `export --merged` says it: "train with [merge]
            # first" was said of a run with [merge] whose merge points no checkpoint fell on (RV77b 2b)
            saves = complete_steps(run_dir)
            newest = f"step {saves[-1]}: {missing_step_reason(run_dir, saves[-1], True)}" if saves else None
            raise EvalError(
                f"{run_dir} has no merged weights to evaluate (no exports/merged-step-N, and no checkpoint "
                "holds its step's merged weights): "
                + (f"its newest checkpoint, {newest}" if newest else "it has no complete checkpoint yet")
            )
        if not steps and (saves := complete_steps(run_dir)):  # rewinds' saves of earlier weights only
            raise EvalError(
                f"{run_dir} has no trained step to evaluate: {untrained_reason(run_dir, saves[-1])}"
            )
        if not steps:
            raise EvalError(
                f"{run_dir} has neither exports/step-N nor a complete checkpoint to evaluate; train first "
                "(or pass --watch to wait for one)"
            )
        step = steps[-1]
    elif not merged and (why := untrained_reason(run_dir, step)):
        raise EvalError(why)
    elif step not in steps and (merged or step != 0 or not run_config(run_dir).model.init_from):
        # (step 0 of a run from a base model: the base, exported now)
        raise EvalError(
            f"{run_dir} has no {weights} of step {step}: "
            f"{missing_step_reason(run_dir, step, merged)}; steps: {', '.join(map(str, steps)) or 'none'}"
        )
    for tries_left in range(3, -1, -1):
        try:
            evaluate_step(run_dir, step, cfg, verbose=args.verbose, merged=merged)
            break
        except NonFiniteMetricsError:
            print_table(run_dir, [step], merged=merged)  # the NaN/inf rows too, then the one error line
            raise
        except GristmillError:
            # The newest step asked for without --step went while it was read, beside a running run
            # with a fast checkpoint.keep_last: the error named a step the user never gave (trial RV66d
            # F6). The newest one now is what was asked for; a step given with --step fails as it fails.
            # One whose checkpoint is damaged (no export of it) is passed over, with its reason, as
            # `gristmill export` without --step passes over it: the refusal's advice said so, which eval
            # did not do (trial RV67a F15).
            went = args.step is None and step_went(run_dir, step, merged)
            damaged = args.step is None and not went and _damaged_checkpoint(run_dir, step, merged)
            now = available_steps(run_dir, merged)
            older = [s for s in now if s < step]
            if not tries_left or not (went and now or damaged and older):
                raise
            if went:
                newest = f"evaluating step {now[-1]}, the newest now"
                print(f"step {step}: its checkpoint went while it was read; {newest}", file=sys.stderr)
            else:
                print(f"skipped step {step}: {damaged}; evaluating step {older[-1]}", file=sys.stderr)
            step = now[-1] if went else older[-1]
    print_table(run_dir, [step], merged=merged)
    try:  # another step's results.json damaged: the table was not rebuilt (the warning above says so)
        for which in (False, True):
            read_results(run_dir, which)
    except EvalResultsError:
        print(f"all steps: {run_dir / EVAL_PARQUET} not rebuilt (the warning above); step {step}'s stand")
        return 0
    # after the plot's warning (a directory of its name) no "plot: RUN/eval.png" (review RV26b 5)
    plot = f", plot: {run_dir / EVAL_PLOT}" if (run_dir / EVAL_PLOT).is_file() else ""
    print(f'all steps: {run_dir / EVAL_PARQUET} (gristmill data audit {run_dir} --sql "FROM eval"){plot}')
    return 0
