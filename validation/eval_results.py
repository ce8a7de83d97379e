"""Eval results on disk: RUN/eval/step-N/results.json (lm-eval's own; eval/merged-step-N for
[merge]'s merged weights) written and merged, the decontamination marks, and RUN/eval.png.

eval.parquet has one row per (step, task, metric, filter) and is rebuilt from every results.json
(training/contract/eval_table.py: its schema and rows, read without lm-eval) after each evaluation,
so it can never disagree with them. It is the `eval` view of `gristmill data audit RUN`.

No number is hidden: a NaN or infinite metric (a model whose log-likelihoods overflow) is kept in
results.json (Python's json writes and reads `NaN`/`Infinity`), in eval.parquet and in the printed
table as NaN/inf; `nonfinite_metrics` lists them for the warnings and the failed exit of the eval.
Only what is not a number at all ("N/A" stderrs, aliases) stays out of eval.parquet.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from textwrap import fill
from typing import Any

from training.console import say
from training.contract.atomic_write import write_atomic
from training.contract.eval_table import (
    GRISTMILL_TASKS,
    RESULTS_JSON,
    EvalResultsError,
    eval_lock,
    metric_number,
    read_results,
    read_step_results,
    rebuild_eval_table,
    result_rows,
    rows_of,
    sealed_results,
    settings_held,
    settings_holders,
    settings_line,
    settings_of,
)
from training.contract.run_layout import EVAL_PLOT, eval_dir
from training.plotting import agg_pyplot, save_figure
from validation.eval_data import RENAMED, NotRead, local_task_names

EVAL_LOG = "eval.log"  # RUN/eval/step-N/eval.log: lm-eval's, transformers' and datasets' own output
# lm-eval's per-task sections (task name -> …), merged when a step is evaluated on more tasks later.
_PER_TASK_KEYS = (
    "results",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
    "group_subtasks",
    "groups",
    "samples",
    GRISTMILL_TASKS,
)
# The tasks made of the run's held-out documents (and their old names): the only ones whose scores
# depend on them (eval.py LOCAL_SETTINGS).
HELDOUT_TASKS = frozenset(local_task_names()) | frozenset(RENAMED)
# Table rows and plot panels: bits per byte first (comparable across tokenizers), then the other
# perplexities, then accuracies; other metrics after these, by name.
METRIC_ORDER = ("bits_per_byte", "byte_perplexity", "word_perplexity", "acc", "acc_norm")
# (group, task, the config lm-eval recorded of group's variant of task, the num_fewshot an older entry's
# eval passed lm-eval) -> task's own config as that eval recorded it, None where unknown (validation/eval.py
# TaskPlan.own_config)
OwnConfig = Callable[[str, str, dict[str, Any], int | None], dict[str, Any] | None]


def _json_default(v: Any) -> Any:
    """json.dumps fallback: numpy scalars as the numbers they are (a float32 NaN must stay a number,
    not become the string "nan"), anything else as its str()."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    return str(v)


def _same_version(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def decontamination_marks(
    results: dict[str, Any],
    checks: list[dict[str, Any]],
    documents: Callable[[str], str | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """{task: {"mark", "removed", "datasets"}} for each task (and group) of an lm-eval results dict:
    whether the run's training data was filtered against it. `checks` holds, per source dataset of
    the run, dataset.json's "decontaminate" record (pipelines/decontam/filter.py: per indexed task its
    version and the documents removed; None when the build had no [decontaminate]). A group counts
    its subtasks. Marks: "decontaminated (N docs removed)" when every dataset's index holds the task
    at the version evaluated and checked every document of it ("…; documents too short to check:
    unknown" for a record written before they were counted); "partly checked (k of n documents shorter
    than the index's n-grams, not checked; N docs removed)" when some of its documents gave the index
    no n-gram (review R27a S1), "(at least k of n …; another dataset's count unknown; …)" when
    another dataset's record predates the count; "checked against another version" when an index
    holds it at another; "not checked" when none holds it, or its documents gave the index no n-gram
    (every text shorter than n words: nothing could match); "partly checked (k of n …)" for a
    mixture of those.
    `documents(task)`: the sha256 of the evaluated task's documents (eval_data.task_documents_sha256),
    asked only of a task an index records it for: other documents than the index's are "checked
    against other documents" (a data file replaced under the same task version: review R23a S2); None
    (they could not be read again) is taken at the version's word, as an index that records none."""
    versions = results.get("versions", {})
    groups = results.get("group_subtasks", {})

    def leaves(task: str) -> list[str]:
        return [leaf for sub in groups[task] for leaf in leaves(sub)] if groups.get(task) else [task]

    # per check: {task name: its entry in that dataset's index}
    indexes = [{t["name"]: t for t in (c.get("decontaminate") or {}).get("tasks", [])} for c in checks]
    marks = {}
    for task in results.get("results", {}):
        per = []
        for check, indexed in zip(checks, indexes):
            for leaf in leaves(task):
                entry = indexed.get(leaf)
                if entry is None:
                    status = "not checked"
                elif entry.get("ngrams") == 0:
                    # indexed, but its every text shorter than the index's n words: nothing could match
                    # ("decontaminated (0 docs removed)" claimed a check that never ran: review R16f F3)
                    status = "no n-grams"
                elif not _same_version(entry.get("version"), versions.get(leaf)):
                    status = "other version"
                elif (
                    entry.get("documents_sha256") is not None
                    and documents is not None
                    and (scored := documents(leaf)) is not None  # None: not hashed here (R23f 2)
                    and scored != entry["documents_sha256"]
                ):
                    status = "other documents"
                else:
                    status = "checked"
                per.append(
                    {
                        "source": check.get("source"),
                        "dataset": check.get("dataset"),
                        "task": leaf,
                        "status": status,
                        "removed": int((entry or {}).get("removed") or 0),
                        "index_version": (entry or {}).get("version"),
                        "evaluated_version": versions.get(leaf),
                        # the index's documents no training text was checked against (every text under
                        # n words); None: a record from before they were counted (R27a S1)
                        "documents": (entry or {}).get("documents"),
                        "unchecked_documents": (entry or {}).get("documents_without_ngrams"),
                    }
                )
        statuses = {p["status"] for p in per}
        # documents, not task-document pairs: one removed for two subtasks of a group counts once
        # (dataset.json's removed_together: review R23e S1)
        mine = set(leaves(task))
        removed = sum(p["removed"] for p in per) - sum(
            g["documents"] * (len(mine.intersection(g["tasks"])) - 1)
            for check in checks
            for g in (check.get("decontaminate") or {}).get("removed_together", [])
            if len(mine.intersection(g["tasks"])) > 1
        )
        if statuses == {"checked"}:
            docs = f"{removed:,} doc{'' if removed == 1 else 's'} removed"
            unchecked, of, unknown = _unchecked_documents(per)
            if unchecked:  # known short documents: never "decontaminated", whatever another record lacks
                others = (
                    ""
                    if not unknown
                    else "; another dataset's count unknown"
                    if unknown == 1
                    else f"; {unknown} other datasets' counts unknown"
                )
                mark = (
                    f"partly checked ({'at least ' if unknown else ''}{unchecked:,} of {of:,} "
                    f"documents shorter than the index's n-grams, not checked{others}; {docs})"
                )
            elif unknown:
                mark = f"decontaminated ({docs}; documents too short to check: unknown)"
            else:
                mark = f"decontaminated ({docs})"
        elif "other version" in statuses and statuses <= {"checked", "other version", "other documents"}:
            mark = "checked against another version"
        elif "other documents" in statuses and statuses <= {"checked", "other documents"}:
            mark = "checked against other documents"
        elif statuses <= {"not checked", "no n-grams"}:
            short = statuses == {"no n-grams"}  # every dataset indexed it: none could match (R16h)
            mark = "not checked" + (" (its documents are shorter than the index's n-grams)" if short else "")
        else:
            what = "datasets" if len(per) == len(checks) else "task-dataset pairs"
            done = sum(p["status"] in ("checked", "other version", "other documents") for p in per)
            mark = f"partly checked ({done} of {len(per)} {what})"
        marks[task] = {"mark": mark, "removed": removed, "datasets": per}
    return marks


def _unchecked_documents(per: list[dict[str, Any]]) -> tuple[int, int | None, int]:
    """(documents no dataset checked, documents, datasets whose records do not say) of the evaluated
    leaves, from their checked records. Per leaf the most over the datasets that say: the documents
    shorter than one index's n words include those shorter than a smaller n, over the same documents
    (each record here is "checked": its documents are the ones scored). A record written before the
    count leaves the others' count standing as a lower bound (review R27d M1: one such record made
    "unknown" of another dataset's 2 of 3). Documents: None when no record says."""
    most: dict[str, tuple[int, int]] = {}
    silent = set()
    for p in per:
        if p["unchecked_documents"] is None or p["documents"] is None:
            silent.add((p["source"], p["dataset"]))
            continue
        got = (p["unchecked_documents"], p["documents"])
        most[p["task"]] = max(most.get(p["task"], got), got)
    documents = sum(d for _, d in most.values()) if most else None
    return sum(u for u, _ in most.values()), documents, len(silent)


def nonfinite_metrics(step: int, results: dict[str, Any]) -> dict[str, tuple[list[dict[str, Any]], bool]]:
    """{task: (its eval.parquet rows whose value is NaN or inf, whether no metric of it is finite)}
    of one lm-eval results dict, for the tasks with at least one such row."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows_of(step, results):
        by_task.setdefault(r["task"], []).append(r)
    out = {}
    for task, rows in by_task.items():
        bad = [r for r in rows if not math.isfinite(r["value"])]
        if bad:
            out[task] = (bad, len(bad) == len(rows))
    return out


def describe_metric(row: dict[str, Any]) -> str:
    """A row as `word_perplexity = nan` (its filter named when it is not lm-eval's "none")."""
    filt = "" if row["filter"] in ("none", "") else f" [{row['filter']}]"
    return f"{row['metric']}{filt} = {row['value']}"


def merge_results(
    old: dict[str, Any], new: dict[str, Any], own_config: OwnConfig | None = None
) -> dict[str, Any]:
    """Two lm-eval results dicts as one: the per-task sections joined (`new`'s tasks win), the
    rest (model config, date, environment) from `new`. `old`'s tasks keep what its header said of
    them (the model and the held-out documents scored) in their own record, where they have none:
    the header becomes `new`'s (review R17f F1: an old file's scores took the newest eval's labels).
    An old task recorded by a group that `new` scores as `GROUP::task` is dropped unless its config is
    the task's own (`variants_replaced`, `own_config`: they were never the task's own scores)."""
    if dropped := variants_replaced(old, new, own_config):
        old = {
            key: {t: v for t, v in section.items() if t not in dropped}
            if key in _PER_TASK_KEYS and isinstance(section, dict)
            else section
            for key, section in old.items()
        }
    header = old.get("gristmill") if isinstance(old.get("gristmill"), dict) else {}
    tasks = old.get(GRISTMILL_TASKS) if isinstance(old.get(GRISTMILL_TASKS), dict) else {}
    kept = {}
    for task in old.get("results", {}) if isinstance(old.get("results"), dict) else ():
        info = dict(tasks.get(task) or {})
        if "model" not in info and header.get("export"):
            info["model"] = header["export"]
        settings = info.get("settings")
        # whose held-out documents: only a local task's scores read them (an own task's settings gained
        # `heldout` from a later eval of a local task, and its steps read as other settings: R30a F4)
        heldout = header.get("heldout") if task in HELDOUT_TASKS else None
        if isinstance(settings, dict) and "heldout" not in settings and heldout:
            info["settings"] = {**settings, "heldout": heldout}
        elif settings is None and "heldout" not in info and heldout:
            info["heldout"] = heldout  # scored before settings were recorded
        kept[task] = info
    old = {**old, GRISTMILL_TASKS: {**tasks, **kept}}
    out = {**old, **new}
    for key in _PER_TASK_KEYS:
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
            out[key] = {**old[key], **new[key]}
    return out


def renamed_task(results: dict[str, Any], old: str, new: str) -> None:
    """Task `old` of an lm-eval results dict named `new` in every per-task section and group's list
    (in place): a group's member scored with the group's overrides (eval.py TaskPlan.overridden)."""
    for key in _PER_TASK_KEYS:
        section = results.get(key)
        if isinstance(section, dict) and old in section:
            section[new] = section.pop(old)
    for group, subtasks in results.get("group_subtasks", {}).items():
        results["group_subtasks"][group] = [new if t == old else t for t in subtasks]


def metric_order(rows: list[dict[str, Any]]) -> Callable[[dict[str, Any]], tuple]:
    """Sort key for eval.parquet rows: by step, tasks by their first metric in METRIC_ORDER (a
    perplexity task before an accuracy one), metrics in METRIC_ORDER within a task."""

    def rank(metric: str) -> int:
        return METRIC_ORDER.index(metric) if metric in METRIC_ORDER else len(METRIC_ORDER)

    first: dict[str, int] = {}
    for r in rows:
        first[r["task"]] = min(first.get(r["task"], len(METRIC_ORDER)), rank(r["metric"]))
    return lambda r: (
        r["step"], first[r["task"]], r["task"], rank(r["metric"]), r["metric"], r["filter"],
        bool(r.get("merged")),
    )  # fmt: skip


def write_step_json(
    run_dir: str | Path,
    step: int,
    results: dict[str, Any],
    merged: bool = False,
    still: Callable[[], bool] | None = None,
    own_config: OwnConfig | None = None,
    documents_before: Callable[[str], str | NotRead | None] | None = None,
) -> Path | None:
    """Write (or merge into) RUN/eval/step-N/results.json (`merged`: RUN/eval/merged-step-N's) and
    rebuild RUN/eval.parquet, in one acquisition of the eval lock (an audit between the two refused the
    table as stale: review R31b F1); a table that cannot be rebuilt is a warning line said, the
    scores written (review RV32e F5). None, nothing written, where `still()`, asked under the lock
    that a rewind sets eval/ aside under too, is False: the weights scored were a discarded
    timeline's (training/run/record.py `_set_aside`). `own_config`: TaskPlan.own_config, for an older
    entry a group recorded under its member's name (`variants_replaced`); `documents_before`:
    TaskPlan.documents_before, for the note on an older record's documents (`replaced_settings`)."""
    out = eval_dir(run_dir, step, merged) / RESULTS_JSON
    with eval_lock(run_dir):
        if still is not None and not still():
            return None
        out.parent.mkdir(parents=True, exist_ok=True)
        old = read_step_results(run_dir, step, merged)
        if old:
            replaced = replaced_settings(merge_results(old, {}), results, own_config, documents_before)
            if replaced:  # eval.parquet is rebuilt from results.json; metrics.jsonl is the trainer's log
                say(
                    f"note: step {step}{' (merged weights)' if merged else ''} scored again under other "
                    f"settings: {replaced}; these scores replace those in {out} and eval.parquet "
                    "(metrics.jsonl keeps any the training run logged)"
                )
            results = merge_results(old, results, own_config)
        # allow_nan: NaN/inf metrics are written as NaN/Infinity, which json.loads (read_step_results) reads.
        text = json.dumps(results, indent=2, default=_json_default, ensure_ascii=False, allow_nan=True)
        text = json.dumps(sealed_results(json.loads(text)), indent=2, ensure_ascii=False, allow_nan=True)
        write_atomic(out, text + "\n")
        warning = rebuild_eval_table(run_dir)
    if warning:  # the scores stand (review RV32e F5): the caller's eval is not failed for the table
        say(said_again(warning, step))
    return out


_SAID: dict[str, int] = {}  # a side output's warning said in this process → the step it was said at


def said_again(warning: str, step: int) -> str:
    """`warning` (eval.parquet not rebuilt, eval.png not drawn: another step's results.json damaged),
    or, said already at another step in this process, one short line pointing back at it: the whole
    two lines came again at every later eval (trial RV65c F5)."""
    first = _SAID.setdefault(warning, step)
    if first == step:
        return warning
    return f"{warning.split(' (', 1)[0]} again, for the reason said at step {first}"


@dataclass(frozen=True)
class Panel:
    """One (task, metric, filter) of eval.png: its finite values over steps, their stderrs (None:
    none computed), the merged weights' finite values ([merge]) and, for an accuracy of a
    multiple-choice task, the chance level."""

    task: str
    metric: str
    filter: str
    steps: list[int]
    values: list[float]
    stderrs: list[float | None]
    chance: float | None
    nonfinite: int  # NaN/inf values left out of the plot (the table and eval.parquet keep them)
    merged: list[tuple[int, float]] = field(default_factory=list)  # (step, value) of the merged weights
    other_settings: str = ""  # its points' settings where they differ (settings_apart), else ""

    @property
    def title(self) -> str:
        filt = "" if self.filter in ("none", "") else f" [{self.filter}]"
        return f"{self.task}: {self.metric}{filt}"


def chance_levels(results_by_step: dict[int, dict[str, Any]]) -> dict[str, float]:
    """{task: chance accuracy} of the multiple-choice tasks: the mean of 1/choices over the
    documents scored (results.json's gristmill_tasks, from the requests themselves), else 1/len of a
    task's fixed list of choices (lm-eval's doc_to_choice given as a list)."""
    out: dict[str, float] = {}
    for _, res in sorted(results_by_step.items()):
        for task, config in res.get("configs", {}).items():
            choices = config.get("doc_to_choice") if isinstance(config, dict) else None
            if config.get("output_type") == "multiple_choice" and isinstance(choices, list) and choices:
                out.setdefault(task, 1 / len(choices))
        for task, info in res.get(GRISTMILL_TASKS, {}).items():
            if isinstance(info, dict) and metric_number(info.get("chance")) is not None:
                out[task] = float(info["chance"])
    return out


def plot_panels(
    rows: list[dict[str, Any]],
    results_by_step: dict[int, dict[str, Any]],
    merged_by_step: dict[int, dict[str, Any]] | None = None,
) -> list[Panel]:
    """What eval.png draws, from eval.parquet's rows and the steps' results dicts (`merged_by_step`: the
    merged weights'): one Panel per (task, metric, filter), in the table's order, the merged weights'
    rows (`merged`) beside the raw ones; the chance line on accuracies (acc, acc_norm, …)."""
    chance = chance_levels({**(merged_by_step or {}), **results_by_step})
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=metric_order(rows)):
        groups.setdefault((r["task"], r["metric"], r["filter"]), []).append(r)
    panels = []
    for (task, metric, filt), both in groups.items():
        group = [r for r in both if not r.get("merged")]
        merged = [(r["step"], r["value"]) for r in both if r.get("merged") and math.isfinite(r["value"])]
        finite = [r for r in group if math.isfinite(r["value"])]
        panels.append(
            Panel(
                task=task,
                metric=metric,
                filter=filt,
                steps=[r["step"] for r in finite],
                values=[r["value"] for r in finite],
                stderrs=[
                    r["stderr"] if r["stderr"] is not None and math.isfinite(r["stderr"]) else None
                    for r in finite
                ],
                chance=chance.get(task) if metric.startswith("acc") else None,
                nonfinite=len(both) - len(finite) - len(merged),
                merged=merged,
                other_settings=settings_apart(both, results_by_step, merged_by_step),
            )
        )
    return panels


def replaced_settings(
    old: dict[str, Any],
    new: dict[str, Any],
    own_config: OwnConfig | None = None,
    documents_before: Callable[[str], str | NotRead | None] | None = None,
) -> str:
    """The tasks `new` scores again that `old` (a step's results dict) holds scores of under other
    settings, each with the settings that differ, old → new: `heldout_ppl (docs 10 → 40)`; "" when
    none. A group's members go with their group where `old` holds them as that same group's scores
    (`scored_by`; before it was recorded: listed under the group); scores of the task alone or of another
    group's that a group's replaces are named (R30a F2, RV30c m3: none was). A task recorded under a
    group's definition by a gristmill before members recorded their own says so, not `definition X → Y`
    (an edit nobody made: RV30c m4); one that held a group's variant of it is named as such (RV30c S2).
    Documents recorded by the rule before 1388e61 of the files as they are (`documents_before`: a
    dataset_path folder's every file) are said to be the same files, recorded as datasets reads them
    now, not data that changed (RV32f B6); past the most it reads, that it could not tell (RV33a L2)."""
    was_in = old.get("group_subtasks", {})
    members = {
        m
        for g, subs in new.get("group_subtasks", {}).items()
        for m in subs
        if (_scored_by(old, m) == _scored_by(new, m) if _scored_by(old, m) else m in was_in.get(g, ()))
    }
    variants = variants_replaced(old, new, own_config)
    parts = [f"{task} ({held})" for task, held in variants.items()]
    for task in sorted(set(new.get("results", {})) & set(old.get("results", {})) - members - set(variants)):
        was, now = _parsed(settings_of(old, task), old, task), _parsed(settings_of(new, task), new, task)
        if now != UNRECORDED and settings_holders(old, task) != [task]:  # RV35a F2, RV35c L2: no `? → …`, nor
            # its group's definition taken for its own (`definition GROUP'S → ITS OWN`, an edit nobody made)
            parts.append(f"{task} ({_without_own_settings(old, task, now)})")
            continue
        differ = [k for k in sorted(was.keys() | now.keys()) if was.get(k) != now.get(k)]
        group = _recorded_by_group(old, task) if "definition" in differ else None
        changes = [f"recorded under {group}'s definition before members recorded their own"] if group else []
        before = (  # asked only where the documents differ: it reads the folder's every file
            documents_before(task)
            if "documents" in differ and documents_before is not None and _before_folder_rule(old, task)
            else None
        )
        said = {"documents": _documents_before_said(was.get("documents"), before)}
        changes += [
            f"{k} {was.get(k, '?')} → {now.get(k, '?')}{said.get(k, '')}"
            for k in differ
            if not (group and k == "definition")
        ]
        if changes:
            parts.append(f"{task} ({', '.join(changes)})")
    return ", ".join(parts)


def _without_own_settings(old: dict[str, Any], task: str, now: dict[str, str]) -> str:
    """What the note says of `task`'s scores in `old` (a step's results dict) whose entry records no
    settings of its own (a group's or tag's member between ed48cab and d7917da; anything before ed48cab),
    scored again under `now` (_parsed): the entries whose settings held for them (settings_holders, as
    settings_held takes them for a member, the rule `evaluated` decides by) and which of those differ.
    Each setting `? → …`, or the group's definition and documents as the member's, said nothing true
    (review RV35a F2, RV35c L2): where none differs, the group's or tag's entry no longer vouched for them
    (edited since, or its local files' digests unrecorded then)."""
    under = settings_holders(old, task)
    if not under:
        return "recorded without settings, by an older gristmill"
    said = f"recorded without settings of its own, under {' and '.join(under)}"
    held = [_parsed(settings_line(settings_held(old, task, h)), old, task) for h in under]
    if any(h != held[0] for h in held):
        return f"{said}, whose settings differ, by an older gristmill"
    differ = [f"{k} {v} → {now[k]}" for k, v in sorted(held[0].items()) if k in now and now[k] != v]
    return f"{said}'s, by an older gristmill{'; ' if differ else ''}{', '.join(differ)}"


def _documents_before_said(recorded: str | None, before: str | NotRead | None) -> str:
    """What the note adds to an older record's `documents` digest (`recorded`, its first 8 digits), given
    the rule before 1388e61's digest of the task's files as they are (`before`: documents_before): the
    same files where they are equal; where its folder holds more than DOCUMENTS_BEFORE_BYTES, that it was
    not read to tell (the plain note said the data changed: review RV33a L2)."""
    if before is NotRead.FOLDER:
        return " (changed, or the same files recorded by the rule before: its folder is too large to read)"
    if before and recorded == before[:8]:
        return " (the same files, now recorded as datasets reads its folder)"
    return ""


def _before_folder_rule(results: dict[str, Any], task: str) -> bool:
    """Whether `task`'s record can be a gristmill's before 1388e61, which recorded a dataset_path folder's
    `documents` as its every file: it has no DOCUMENTS_RULE. A record of today's rule that equals the old
    rule's digest (a glob narrowed, a read file renamed away) is data that changed (review RV33a F4)."""
    info = results.get(GRISTMILL_TASKS, {}).get(task)
    return not (isinstance(info, dict) and info.get("documents_rule") == DOCUMENTS_RULE)


def _scored_by(results: dict[str, Any], task: str) -> str | None:
    """The planned name whose eval wrote `task`'s entry (None: recorded before that was)."""
    info = results.get(GRISTMILL_TASKS, {}).get(task)
    return info.get("scored_by") if isinstance(info, dict) else None


def _definition(results: dict[str, Any], task: str) -> str | None:
    info = results.get(GRISTMILL_TASKS, {}).get(task)
    settings = info.get("settings") if isinstance(info, dict) else None
    return settings.get("definition") if isinstance(settings, dict) else None


def _recorded_by_group(results: dict[str, Any], task: str) -> str | None:
    """The group whose eval recorded `task` under the group's own definition, as gristmill did before a
    group's members recorded their own (review R30a F2) and whose eval wrote an entry (`scored_by`): one
    that group_subtasks lists it under, with the same `definition`. None for a task recorded under its
    own, and for any entry written since (an inline member records its group's definition)."""
    mine = _definition(results, task)
    groups = results.get("group_subtasks", {})
    if mine is None or _scored_by(results, task) is not None:
        return None
    return next(
        (g for g in sorted(groups) if g != task and task in groups[g] and _definition(results, g) == mine),
        None,
    )


def variants_replaced(
    old: dict[str, Any], new: dict[str, Any], own_config: OwnConfig | None = None
) -> dict[str, str]:
    """{task: what it held, for the note} of each task of `old` (a step's results dict) recorded by a
    group (`_recorded_by_group`) that `new` scores as `GROUP::task`: a gristmill before these names
    recorded the group's variant of a task (its scores with the group's overrides) under the task's own
    name (review RV30c S2). Such an entry is kept as the task's own only where its config (`configs`,
    lm-eval's of what it scored) is the task's own as the entry's eval scored it (`own_config`:
    TaskPlan.own_config, under the num_fewshot its settings record: RV34e S1), as when the group named it
    as it is (RV31a 7); it is dropped where its config is the variant's of today, any other (overrides
    edited since: RV32f B4), or none recorded (its scores unknown); where the task's own cannot be had
    (`own_config` None: an inline group; settings naming no num_fewshot), the note says it is unknown.
    The task is the name less its group's prefix, or an enclosing group's (_member_name: RV33a F1, RV33g
    G1)."""
    out = {}
    for group, subs in new.get("group_subtasks", {}).items():
        for sub in subs:
            task = _member_name(group, sub, new.get("group_subtasks", {}))
            if task == sub or task not in old.get("results", {}) or _recorded_by_group(old, task) != group:
                continue
            config = old.get("configs", {}).get(task)
            variant = new.get("configs", {}).get(sub)
            info = old[GRISTMILL_TASKS][task]  # with settings: _recorded_by_group read their definition
            # the task's own as the entry's eval would have scored it (its num_fewshot, not today's:
            # review RV34e S1); none where its settings name none (no gristmill wrote such a record)
            named = "num_fewshot" in info["settings"]
            own = (
                own_config(group, task, variant, num_fewshot_passed(old, task))
                if named and own_config and isinstance(variant, dict)
                else None
            )
            if config is None:
                held = f"no config recorded: whether it held {group}'s variant's scores or its own is unknown"
            elif _as_written(config) == _as_written(variant):
                held = f"held {group}'s variant's scores"
            elif own is None:  # not told from the task's own (review RV33a L1: the note said neither)
                why = (
                    f"{group} could not be loaded by name here"
                    if named
                    else "its settings name no num_fewshot"
                )
                held = (
                    f"held the scores of a config other than {group}'s variant's of today, not compared "
                    f"with {task}'s own ({why}): whether they were its own is unknown"
                )
            elif _as_written(config) == _as_written(own):
                continue  # the task's own scores: the group scored it as it is
            else:
                held = f"held the scores of a config neither {task}'s own nor {group}'s variant's of today"
            out[task] = f"{held}, recorded before GROUP::task names; scored again as {sub}"
    return out


def num_fewshot_passed(results: dict[str, Any], task: str) -> int | None:
    """The num_fewshot the eval that wrote `task`'s record in `results` (a step's results dict; its
    settings naming one) passed lm-eval: the recorded one, but 0 from a gristmill before 2a90755 was
    passed as `0 or None`, the task's own (review R23a S3). Such a gristmill recorded settings for the
    tasks it scored only (their entries carry `seconds` and `docs`), never for a group's members
    (d7917da, later): so a member's record says what was passed, and an own entry's 0 is dated only by
    its own `n_shot` (recorded since). Not by a group listing the task: an older gristmill's own entry
    written after a newer one scored the group was read as 0-shot (review RV34k S1), and a nested
    group's member had no listing group that recorded an n-shot (RV34k M1, RV34h M1)."""
    info = results.get(GRISTMILL_TASKS, {})[task]
    passed = info["settings"]["num_fewshot"]
    return None if passed == 0 and scored_itself(info) and "n_shot" not in info else passed


def scored_itself(info: dict[str, Any]) -> bool:
    """Whether a task's entry in a step's gristmill_tasks is one an eval planned and scored (its own
    `seconds` and `docs`), not a group's or tag's member's."""
    return "seconds" in info or "docs" in info


def _member_name(group: str, sub: str, groups: Mapping[str, Any]) -> str:
    """`sub`, a member's name under `group`, less the prefix lm-eval gave it: `group::`, or an enclosing
    group's (a group `outer::gp` defined inline in `outer` names its member `outer::own_mc`: RV33a F1),
    the longest that leaves a name; an enclosing group is one `groups` (the step's group_subtasks)
    holds, not any `::` part of the group's name (a registered group `my::suite`'s member `my::mc` is
    no `mc`: RV33h H1). Not the last `::` part: a task's own name may hold `::` (RV33g G1)."""
    parts = group.split("::")
    for n in range(len(parts), 0, -1):
        prefix = "::".join(parts[:n]) + "::"
        enclosing = n == len(parts) or prefix[:-2] in groups
        if enclosing and sub.startswith(prefix) and len(sub) > len(prefix):
            return sub[len(prefix) :]
    return sub


def _as_written(value: Any) -> Any:
    """`value` as results.json holds it (tuples as lists, numpy scalars as numbers, the rest as str)."""
    return json.loads(json.dumps(value, default=_json_default, allow_nan=True))


# gristmill_tasks.TASK.documents_rule: what `documents` is the digest of, recorded since its rule changed
# (1388e61 took a dataset_path folder's every file to the files datasets reads of it). A record without it
# can be of the rule before (`_before_folder_rule`): no other field dates a record (review RV33a F4).
DOCUMENTS_RULE = "files datasets reads"
# A setting recorded since a later gristmill, and the value every eval before it used: EvalConfig's
# default, the in-training eval's always and `gristmill eval`'s unless set (review RV31a 6)
SETTINGS_BEFORE: dict[str, Any] = {"bootstrap_iters": 1000}


def as_used(
    settings: dict[str, Any], results: dict[str, Any] | None = None, task: str | None = None
) -> dict[str, Any]:
    """A task's recorded `settings` (or a parsed settings line) with SETTINGS_BEFORE where they predate
    it: the value they were scored under, so one unchanged since is no other setting (it was `?`, and
    the note and the plot said the step's scores were another's); none recorded stays none. Where its
    record (`results`, the step's results dict holding `task`) says the value itself, that value
    (`recorded_before`: review RV33a F2, F3); SETTINGS_BEFORE only where it says nothing."""
    if not settings:
        return settings
    return {**SETTINGS_BEFORE, **recorded_before(results or {}, task), **settings}


def recorded_before(results: dict[str, Any], task: str | None) -> dict[str, Any]:
    """bootstrap_iters of `task`'s scores in a record that predates its setting, as the record says it:
    0 where its scores, or a member's (a group's), have stderrs lm-eval computes under any other value
    (acc's, not a perplexity's), all "N/A" over more than one document (review RV32f B3; one document's
    is "N/A" under any: RV33a F2); else {} (SETTINGS_BEFORE). Not lm-eval's header (`config`): an older
    gristmill merged several evals' results under the newest one's header (review RV33g G2, G3)."""
    return {"bootstrap_iters": 0} if _scored_without_stderrs(results, task) else {}


def _scored_without_stderrs(results: dict[str, Any], task: str | None, depth: int = 0) -> bool:
    metrics = results.get("results", {}).get(task) or {}
    stderrs = {k.split(",")[0].removesuffix("_stderr"): v for k, v in metrics.items() if "_stderr," in k}
    if any(v != "N/A" for v in stderrs.values()):  # its own say > 0, whatever a member scored since says
        return False  # (a member scored alone under 0 later: the group was read as 0, review RV33h H2)
    members = (results.get("group_subtasks", {}).get(task) or []) if depth < 16 else []
    if any(_scored_without_stderrs(results, m, depth + 1) for m in members if m != task):
        return True
    return bool(stderrs) and (_items(results, task) or 0) > 1 and any(map(_has_stderr, stderrs))


def _items(results: dict[str, Any], task: str | None, depth: int = 0) -> int | None:
    """How many documents `task`'s scores are of as its stderrs see them (lm-eval's n-samples, or the
    entry's sample_len); a group's, its fewest member's (its stderr is "N/A" where one member's is; its
    sample_len is their sum). None: not recorded."""
    members = (results.get("group_subtasks", {}).get(task) or []) if depth < 16 else []
    if members:
        counts = [_items(results, m, depth + 1) for m in members if m != task]
        return None if None in counts or not counts else min(counts)
    count = (results.get("n-samples", {}).get(task) or {}).get("effective")
    if count is None:
        count = (results.get("results", {}).get(task) or {}).get("sample_len")
    return count if isinstance(count, int) else None


@functools.cache
def _has_stderr(metric: str) -> bool:
    """Whether lm-eval gives `metric` a stderr under bootstrap_iters > 0: its registered aggregation has one
    (acc's mean does, word_perplexity's weighted perplexity never). False where it is not registered."""
    try:
        from lm_eval.api import metrics  # registers the aggregations
        from lm_eval.api.registry import METRIC_AGGREGATION_REGISTRY

        aggregation = METRIC_AGGREGATION_REGISTRY.get(metric)
    except (ImportError, KeyError):
        return False
    return aggregation is not None and metrics.stderr_for_metric(aggregation, 1000) is not None


# _parsed's settings of a record that holds none (before ed48cab; a member's before d7917da, under no one
# group recording some, or under a tag)
UNRECORDED = {"settings": "?"}


def _parsed(
    settings: str | None, results: dict[str, Any] | None = None, task: str | None = None
) -> dict[str, str]:
    """eval.parquet's `settings` line (settings_of) as {key: value}, as used (`as_used`, of `task` in
    its record `results`); {"settings": "?"} for none recorded."""
    if not settings:
        return dict(UNRECORDED)
    parsed = dict(kv.split("=", 1) for kv in settings.split(", "))
    return {k: str(v) for k, v in as_used(parsed, results, task).items()}


def settings_apart(
    rows: list[dict[str, Any]],
    results_by_step: dict[int, dict[str, Any]] | None = None,
    merged_by_step: dict[int, dict[str, Any]] | None = None,
) -> str:
    """Where `rows` (one task's metric over steps, raw and merged) were scored under other settings
    (eval.parquet's `settings`), the settings that differ and the steps of each (`m`: the merged
    weights'): `max_length=64 at 150; max_length=0 at 50, 100, 150m`. "" when they agree. A raw row's
    record is its step's of `results_by_step` (plot_panels'), a merged row's of `merged_by_step`; a row
    whose step is in neither, what the row holds."""
    records = {False: results_by_step or {}, True: merged_by_step or {}}
    parsed = {id(r): _parsed(r.get("settings"), _row_record(r, records), r.get("task")) for r in rows}
    keys = sorted({k for d in parsed.values() for k in d})
    differ = [k for k in keys if len({d.get(k) for d in parsed.values()}) > 1]
    if not differ:
        return ""
    steps: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["step"], bool(r.get("merged")))):
        d = parsed[id(r)]
        label = " ".join(f"{k}={d.get(k, '?')}" for k in differ)
        steps.setdefault(label, []).append(f"{r['step']}{'m' if r.get('merged') else ''}")
    return "; ".join(f"{label} at {', '.join(at)}" for label, at in steps.items())


def _row_record(row: dict[str, Any], records: dict[bool, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """The record of an eval.parquet row (`as_used`): its step's results dict, the raw weights' or the
    merged (`records[merged]`): a group's row holds no documents (lm-eval's n-samples counts none of a
    group), its members' entries say what it was scored under (review RV33g G4); else its metric, stderr
    and documents as its results entry holds them (a row without a stderr had "N/A": lm-eval writes one
    for each metric)."""
    step_records = records[bool(row.get("merged"))]
    if row.get("step") in step_records:
        return step_records[row["step"]]
    if "metric" not in row:
        return {}
    stderr = row.get("stderr")
    entry = {f"{row['metric']}_stderr,{row['filter']}": "N/A" if stderr is None else stderr}
    return {"results": {row["task"]: entry}, "n-samples": {row["task"]: {"effective": row.get("samples")}}}


def _label(value: float, stderr: float | None) -> str:
    return f"{value:.4g}" + (f" ± {stderr:.2g}" if stderr else "")


def write_plot(run_dir: str | Path) -> str | None:
    """RUN/eval.png (`eval_figure`) from the run's results files (eval.parquet's rows' files); a
    warning line instead when it cannot be written (`save_figure`: the scores stand without it), with
    the command that draws it again. Drawn under the eval files' lock: a writer that read the results
    before another's and saved after it left the picture of fewer steps (trial RV66d F2)."""
    with eval_lock(run_dir):
        try:
            raw, merged = read_results(run_dir), read_results(run_dir, merged=True)
        except EvalResultsError as e:  # another step's damaged file: this eval's scores stand (RV61b F1)
            plot = Path(run_dir) / EVAL_PLOT
            with contextlib.suppress(OSError):  # an earlier picture lacks these scores (review RV61f F4)
                plot.unlink(missing_ok=True)
            return f"warning: {plot} not drawn (nor kept: it lacked these scores): {e}"
        plt = agg_pyplot()
        fig = eval_figure(plt, result_rows(raw) + result_rows(merged, merged=True), raw, merged)
        warning = save_figure(plt, fig, Path(run_dir) / EVAL_PLOT, dpi=90)
    # the fix, which the bare "not drawn (Is a directory)" left to guess (review RV26b 5)
    return warning and f"{warning}: once it can be written, `gristmill eval {run_dir} --table` draws it"


def undrawn_plot_note(run_dir: str | Path, step: int, switch: str) -> str | None:
    """The note for an eval that scored step `step` with pictures off (`switch`) beside an earlier
    RUN/eval.png, which then lacks these scores and stayed as if it were the run's (trial RV65c); None
    where there is none."""
    plot = Path(run_dir) / EVAL_PLOT
    if not plot.exists():
        return None
    return (
        f"note: {plot} is an earlier picture, without the scores from step {step} on ({switch} = false); "
        f"`gristmill eval {run_dir} --table` draws it again"
    )


def eval_figure(
    plt,
    rows: list[dict[str, Any]],
    results_by_step: dict[int, dict[str, Any]],
    merged_by_step: dict[int, dict[str, Any]] | None = None,
):
    """One panel per (task, metric) of `rows` (result_rows), value over steps with stderr bars and the
    values written next to the points (readable with a single step), the merged weights' values
    ([merge]) as a dashed line beside them, the chance level of a multiple-choice task's accuracy
    dashed, perplexities on a log scale labelled in plain numbers (matplotlib's default writes
    "2.1×10¹" in mathtext, which is also a third of the figure's drawing time, redrawn at every
    eval). NaN/inf values are left out of the lines (the table and eval.parquet keep them), a panel
    with none finite says so."""
    from matplotlib import ticker  # matplotlib only where a plot is drawn (training/plotting.py)

    panels = plot_panels(rows, results_by_step, merged_by_step)
    n = max(1, len(panels))
    cols = min(3, n)
    fig, axes = plt.subplots(-(-n // cols), cols, figsize=(4.5 * cols, 3.2 * -(-n // cols)), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        if p.values:
            bars = [e or 0.0 for e in p.stderrs]
            ax.errorbar(p.steps, p.values, yerr=bars if any(bars) else None, marker="o", capsize=4,
                        label="raw weights" if p.merged else None)  # fmt: skip
            labelled = range(len(p.values)) if len(p.values) <= 6 else [len(p.values) - 1]
            for i in labelled:
                ax.annotate(_label(p.values[i], p.stderrs[i]), (p.steps[i], p.values[i]),
                            textcoords="offset points", xytext=(6, 4), fontsize=8)  # fmt: skip
            if len(set(p.steps)) <= 8:
                ax.set_xticks(sorted(set(p.steps)))
            if len(set(p.steps)) == 1:  # room for the label right of a lone point
                ax.set_xlim(p.steps[0] - 1, p.steps[0] + 2)
            if p.metric.endswith("perplexity") and min(p.values + [v for _, v in p.merged]) > 0:
                ax.set_yscale("log")  # then its default labels' thresholds, in plain text
                ax.yaxis.set_major_formatter(ticker.LogFormatter(10))
                ax.yaxis.set_minor_formatter(ticker.LogFormatter(10, labelOnlyBase=False))
        elif not p.merged:
            ax.text(0.5, 0.5, "no finite value", ha="center", va="center", transform=ax.transAxes)
        if p.merged:
            ax.plot(*zip(*p.merged), marker="s", linestyle="--", label="merged weights")
            ax.legend(fontsize=8, loc="best")
        if p.chance is not None:
            ax.axhline(p.chance, linestyle="--", color="gray", linewidth=1, label=f"chance {p.chance:.3g}")
            ax.legend(fontsize=8, loc="best")
        ax.set_title(p.title + (" (other settings)" if p.other_settings else ""), fontsize=9)
        if p.other_settings:  # points not comparable as drawn: which settings each was scored under
            ax.text(0.01, 0.01, fill(p.other_settings, 70), transform=ax.transAxes, fontsize=6,
                    color="firebrick", va="bottom")  # fmt: skip
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig
