"""The eval results of a run directory, read without lm-eval: RUN/eval/step-N/results.json (lm-eval's
own, written by the evaluator; RUN/eval/merged-step-N/results.json for [merge]'s merged weights) and
RUN/eval.parquet, one row per (step, task, metric, filter, merged), built from every results.json
there, so it can never disagree with them. eval.parquet is the `eval` view
of `gristmill data audit RUN`; each evaluation rebuilds it as it writes the step's results.json, in one
hold of the eval lock (validation/eval_results.write_step_json: the trainer's eval and `gristmill
eval`), and so does the run's record when a rewind sets a discarded step's eval/ aside
(training/run/record.py); the audit reads between such writes (`read_between_writes`).

No number is hidden: a NaN or infinite metric (a model whose log-likelihoods overflow) is kept in
results.json (Python's json writes and reads `NaN`/`Infinity`) and in eval.parquet as NaN/inf. Only
what is not a number at all ("N/A" stderrs, aliases) stays out of eval.parquet.
"""

from __future__ import annotations

import json
import numbers
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from training.contract.atomic_write import atomic_path
from training.contract.errors import GristmillError
from training.contract.file_lock import file_lock, flock_listed
from training.contract.integrity import Ledger, read_ledger, seal_broken, sealed
from training.contract.run_layout import CHECKPOINTS_JSONL, EVAL_DIR, EVAL_PARQUET, eval_dir, list_steps

T = TypeVar("T")

RESULTS_JSON = "results.json"
GRISTMILL_TASKS = "gristmill_tasks"  # results.json: per task, its time, documents, truncation, chance
SCORING_RUN = "run_id"
"""A task's record's key (GRISTMILL_TASKS) for the id of the run that scored it (RUN/checkpoints.jsonl's,
where it has one): a results.json copied in from another run was tabled, plotted and audited as this
run's scores, exit 0 (trial RV60c 4). Per task: later evals of the step merge their tasks into the file."""
EVAL_LOCK = ".lock"  # in RUN/eval/: held by each writer of a results.json and of eval.parquet (eval_lock)

EVAL_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("task", pa.string()),
        ("metric", pa.string()),
        ("filter", pa.string()),
        ("value", pa.float64()),
        ("stderr", pa.float64()),
        ("samples", pa.int64()),
        ("model", pa.string()),
        ("decontamination", pa.string()),  # the task's mark (decontamination_marks); null before it
        ("merged", pa.bool_()),  # the merged weights of [merge] at that step (training/merge.py), not the raw
        ("settings", pa.string()),  # what the score depends on besides the weights (settings_of); null before
    ]
)


def metric_number(v: Any) -> float | None:
    """`v` as a float when it is a number (NaN and ±inf included: they say the model is broken), else
    None ("N/A", aliases, booleans). numpy scalars count as numbers."""
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else None


def rows_of(step: int, results: dict[str, Any], merged: bool = False) -> list[dict[str, Any]]:
    """eval.parquet rows of one lm-eval results dict (keys "metric,filter", stderr "metric_stderr,filter");
    `merged`: the results of the merged weights of the step."""
    rows = []
    samples = results.get("n-samples", {})
    model = str(results.get("gristmill", {}).get("export") or results.get("config", {}).get("model", ""))
    for task, metrics in sorted(results.get("results", {}).items()):
        settings = settings_of(results, task)  # once a task, not a metric (review RV41a F6)
        for key, value in sorted(metrics.items()):
            metric, comma, filt = key.partition(",")
            if not comma or metric.endswith("_stderr") or metric_number(value) is None:
                continue  # alias, sample_len (no filter: not metrics), stderr columns, "N/A"
            rows.append(
                {
                    "step": step,
                    "task": task,
                    "metric": metric,
                    "filter": filt,
                    "value": float(value),
                    "stderr": metric_number(metrics.get(f"{metric}_stderr,{filt}")),
                    "samples": (samples.get(task) or {}).get("effective"),
                    "model": model_of(results, task) or model,
                    "decontamination": mark_of(results, task),
                    "merged": merged,
                    "settings": settings,
                }
            )
    return rows


def settings_of(results: dict[str, Any], task: str) -> str | None:
    """The settings `task` was scored under, as results.json records them (validation/eval.py
    score_settings: per task asked for and each member of a group it scored; a member recorded before
    members were has its group's: settings_holders, the rule eval's `evaluated` decides by), in one
    line: `docs=40, dtype=float32, heldout=prose, limit=0, max_length=64, …` (the held-out documents by
    their source, a task's definition and its documents by their hashes' first 8 digits); None when
    recorded before settings were, or under several groups whose settings differ (which of them scored
    it last is not recorded). A group's or tag's settings as they hold for a member (settings_held: not
    the group's definition and documents), so the row says what `evaluated` compares (review RV35a F3:
    one group parent's walk, the group's definition, a tag's member none). A tag's member whose tag's
    entry names no n_shot (recorded before 2a90755) has none here: only eval's task index knows its tag.
    Rows scored under other settings sat side by side in the table and the plot, unmarked (an offline
    `--set max_length=64` beside the in-training eval's merged rows: review R24e 6)."""
    lines = {settings_line(settings_held(results, task, h)) for h in settings_holders(results, task)}
    return lines.pop() if len(lines) == 1 else None


def settings_line(settings: dict[str, Any]) -> str:
    """A task's recorded `settings` as eval.parquet's `settings` line (settings_of)."""
    shown = {
        **settings,
        "heldout": _heldout_shown(settings.get("heldout")),
        "definition": str(settings.get("definition") or "")[:8] or None,
        "documents": str(settings.get("documents") or "")[:8] or None,
    }
    return ", ".join(f"{k}={v}" for k, v in sorted(shown.items()) if k in settings)


# what the records gained later (validation/eval.py evaluated: scores recorded before one of them count
# as done under any of its values), and what only the local tasks' scores depend on
LATER_SETTINGS = ("definition", "documents")
LOCAL_SETTINGS = ("docs", "heldout")


def settings_held(results: dict[str, Any], task: str, holder: str) -> dict[str, Any]:
    """The settings entry `holder` of `results` (settings_holders) records for `task`'s scores: all of
    its own; of a group's or tag's, those a member's own record holds: the group's definition and
    documents are not the member's (taken as its own, every such member was scored again: review RV34l
    P1), and its local settings no member's."""
    settings = dict(results[GRISTMILL_TASKS][holder]["settings"])
    if holder == task:
        return settings
    return {k: v for k, v in settings.items() if k not in (*LATER_SETTINGS, *LOCAL_SETTINGS)}


def settings_holders(
    results: dict[str, Any], task: str, tag_members: Callable[[str], Sequence[str] | None] | None = None
) -> list[str]:
    """The entries of `results` (a step's results dict) whose `settings` `task`'s scores were scored
    under: its own where it has some. A member of a group or tag written between ed48cab (settings
    recorded) and d7917da (each member records its own) has none: then the nearest entries up from it
    that have: the groups group_subtasks lists it under, and the tags whose members hold it, at every
    depth; it counted as done under any settings (review RV34l P1). A tag's members: those its entry's
    `n_shot` names (what its eval scored: recorded since 2a90755), else, in a record before those,
    `tag_members`' (TaskPlan.tag_members, as the task index knows them; eval.parquet has none: review
    RV35a F3). Several where it is under several (which of them scored it last is not recorded); [] where
    none has: recorded before settings were."""
    tasks, groups = results.get(GRISTMILL_TASKS, {}), results.get("group_subtasks", {})
    tags: dict[str, Sequence[str]] | None = None  # made once a name holds none: a table asks per task
    found, todo, seen = [], [task], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        info = tasks.get(name)
        if isinstance(info, dict) and isinstance(info.get("settings"), dict):
            found.append(name)
            continue
        if tags is None:  # the entries of no scores: tags' (lm-eval records none, gristmill a planned one's)
            scored = results.get("results", {})
            tags = {t: _tag_members(t, i, tag_members) for t, i in tasks.items() if t not in scored}
        todo += [g for g, subs in groups.items() if name in subs]
        todo += [t for t, members in tags.items() if name in members]
    return sorted(found)


def _tag_members(
    tag: str, info: Any, tag_members: Callable[[str], Sequence[str] | None] | None
) -> Sequence[str]:
    """The members of `tag` (its entry `info`) as settings_holders reads them: those the n_shot its eval
    recorded names, else `tag_members`'."""
    n_shot = info.get("n_shot") if isinstance(info, dict) else None
    if isinstance(n_shot, dict):
        return [m for m in n_shot if m != tag]
    return (tag_members(tag) if tag_members else None) or ()


def _heldout_shown(heldout: Any) -> Any:
    """A local task's held-out documents in a settings line: their source, and, where some were left
    out, which of its documents were scored (validation/eval.py HeldOut.documents), `prose (11 of 16
    documents 1a2b3c4d)`: a step scored on another set is another row's settings (review R25i S1).
    Every document scored is the source alone, as a record of before the documents were (which
    HeldOut.scored takes for every document): they are the same set, and rows of an upgraded run
    were marked "other settings" (review R25m 1)."""
    if not isinstance(heldout, dict):
        return heldout
    documents = heldout.get("documents")
    if not isinstance(documents, dict) or documents.get("left_out") == 0:
        return heldout.get("source")
    scored, left_out = documents.get("scored"), documents.get("left_out")
    total = scored + left_out if isinstance(scored, int) and isinstance(left_out, int) else "?"
    return f"{heldout.get('source')} ({scored} of {total} documents {str(documents.get('sha256'))[:8]})"


def model_of(results: dict[str, Any], task: str) -> str | None:
    """The model that scored `task` as results.json records it per task (later evals of a step merge
    their tasks into it and the header is the newest's); None: recorded before it was per task."""
    info = results.get(GRISTMILL_TASKS, {}).get(task)
    return info.get("model") if isinstance(info, dict) else None


def mark_of(results: dict[str, Any], task: str) -> str | None:
    """The decontamination mark results.json records for `task` (None: evaluated before marks)."""
    info = results.get(GRISTMILL_TASKS, {}).get(task)
    return ((info or {}).get("decontamination") or {}).get("mark") if isinstance(info, dict) else None


RESULTS_SHA256 = "gristmill_results_sha256"
"""results.json's key for the sha256 of the rest of it (`sealed_results`): the scores it holds are
what eval.parquet, eval.png and the audit report, and a flipped bit in one was merged and reported,
exit 0 (review R14c F3). A file written before it was sealed has none."""


class EvalResultsError(GristmillError):
    """A step's results.json that cannot be read or does not hash to its seal."""


def sealed_results(results: dict[str, Any]) -> dict[str, Any]:
    """`results` (as JSON reads it back: plain numbers, lists, dicts) with its own sha256."""
    return sealed(results, RESULTS_SHA256)


def read_step_results(
    run_dir: str | Path, step: int, merged: bool = False, ledger: Ledger | None = None
) -> dict[str, Any]:
    """RUN/eval/step-N/results.json (`merged`: RUN/eval/merged-step-N's), or {} when that step has none;
    one that cannot be read, or does not hash to its seal, or is another run's (`ledger`: the run's
    record, where the caller read it), is an EvalResultsError naming the fix."""
    path = eval_dir(run_dir, step, merged) / RESULTS_JSON
    if not path.is_file():
        return {}
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(results, dict):
            raise ValueError(f"a JSON {type(results).__name__}, not an object")
        if seal_broken(results, RESULTS_SHA256):
            raise ValueError(f"it does not hash to the {RESULTS_SHA256} it holds")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise EvalResultsError(
            f"{path} is damaged ({e}): delete {path.parent} (its scores are lost) and, while the run keeps "
            f"that step's export or checkpoint, evaluate it again (`gristmill eval {run_dir} --step {step}"
            f"{' --merged' if merged else ''}`)"
        ) from None
    header = results.get("gristmill")
    said = header.get("step") if isinstance(header, dict) else None
    if isinstance(said, int) and not isinstance(said, bool) and said != step:
        # a step's folder copied under another's name: its scores were that step's, exit 0 (trial RV63b 3)
        raise EvalResultsError(
            f"{path} holds step {said}'s scores (its gristmill.step), not step {step}'s: move {path.parent} "
            f"out of {Path(run_dir) / EVAL_DIR}; while the run keeps step {step}'s export or checkpoint, "
            f"`gristmill eval {run_dir} --step {step}{' --merged' if merged else ''}` scores it"
        )
    if foreign := _scored_by_another_run(run_dir, step, results, ledger):
        task, run = foreign
        record, evals = Path(run_dir) / CHECKPOINTS_JSONL, Path(run_dir) / EVAL_DIR
        raise EvalResultsError(
            f"{path} holds another run's scores ({task} records run id {run}, which by {record} did not "
            f"train this directory's step {step}): move {path.parent} out of {evals}; while the run keeps "
            f"that step's export or checkpoint, `gristmill eval {run_dir} --step {step}"
            f"{' --merged' if merged else ''}` scores the run's own"
        )
    return results


def _scored_by_another_run(
    run_dir: str | Path, step: int, results: dict[str, Any], ledger: Ledger | None = None
) -> tuple[str, str] | None:
    """A task of `results` (step `step`'s) and the run id it records (SCORING_RUN) where that is none
    whose timeline the run's record gives the step (Ledger.runs_at: another run's, or the original's
    past the step a copy of it resumed at); None: every one is the run's, or nothing tells (scores or
    a record from before the id)."""
    tasks = results.get(GRISTMILL_TASKS)
    said = {
        task: info[SCORING_RUN]
        for task, info in (tasks.items() if isinstance(tasks, dict) else ())
        if isinstance(info, dict) and isinstance(info.get(SCORING_RUN), str)
    }
    if not said:
        return None
    runs = (ledger or read_ledger(Path(run_dir))).runs_at(step)
    return next(((task, run) for task, run in sorted(said.items()) if runs and run not in runs), None)


def read_results(run_dir: str | Path, merged: bool = False) -> dict[int, dict[str, Any]]:
    """{step: results dict} of every RUN/eval/step-N/results.json (`merged`: merged-step-N's)."""
    steps = list_steps(Path(run_dir) / EVAL_DIR, merged)
    ledger = read_ledger(Path(run_dir))  # once for every step's file: the table is rebuilt at every eval
    return {s: res for s in steps if (res := read_step_results(run_dir, s, merged, ledger))}


def result_rows(results_by_step: dict[int, dict[str, Any]], merged: bool = False) -> list[dict[str, Any]]:
    """eval.parquet's rows of every step's results dict (`read_results`)."""
    return [r for step, res in results_by_step.items() for r in rows_of(step, res, merged)]


def eval_lock(run_dir: str | Path):
    """The run's eval files, one writer at a time: the trainer's eval (rank 0) and `gristmill eval`
    (--watch beside the run) each merge into a step's results.json and rebuild eval.parquet, and two
    read-merge-writes at once lost one writer's tasks; a rebuild that read the files before another
    writer's, and replaced the table after that writer's rebuild, left eval.parquet without them.
    Each change to the results.json files (a step's written, a discarded step's set aside) and the
    rebuild of eval.parquet from them is one acquisition, so that a reader (`read_between_writes`)
    never finds results newer than the table: between two acquisitions the audit refused a live
    run's eval.parquet as stale (review R31b F1)."""
    lock = Path(run_dir) / EVAL_DIR / EVAL_LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    return file_lock(lock)


def write_eval_table(run_dir: str | Path) -> Path:
    """RUN/eval.parquet rebuilt from every RUN/eval/step-N/results.json and merged-step-N/results.json,
    under eval_lock, which the caller holds (in the acquisition that changed those files)."""
    path = Path(run_dir) / EVAL_PARQUET
    rows = [r for merged in (False, True) for r in result_rows(read_results(run_dir, merged), merged)]
    with atomic_path(path) as tmp:
        # page checksums: the audit verifies them before duckdb reads it (validation/audit_views.py)
        # no column statistics: the footer has no checksum, and a flipped min/max could skip rows (RV32e F3)
        table = pa.Table.from_pylist(rows, schema=EVAL_SCHEMA)
        pq.write_table(table, tmp, write_page_checksum=True, write_statistics=False)
    return path


# A reader's read that disagrees while a writer holds the eval lock is read again for this long at
# least: a writer holds it only between its change to the results.json files and its rebuild of the
# table (milliseconds; about one such read where many steps hold scores, so the bound is also
# READ_AGAIN_TIMES such reads).
READ_AGAIN_S = 2.0
READ_AGAIN_TIMES = 4
READ_AGAIN_EVERY_S = 0.05


def read_between_writes(run_dir: str | Path, read: Callable[[], T | None]) -> T | None:
    """`read()` of the run's eval files (results.json and eval.parquet): None where they agree, else
    why not. Taken without any lock, so a reader holds nothing a writer waits on (a stopped audit
    holding the eval lock shared stalled the trainer's eval without bound: review RV32e F1), and a run
    directory the reader cannot write to is read all the same. A writer changes results.json and
    rebuilds the table in one hold of eval_lock, so a disagreement it causes lasts that hold: one is
    read again every READ_AGAIN_EVERY_S while /proc/locks lists the lock held, for READ_AGAIN_S (at
    least READ_AGAIN_TIMES reads' time), and once more after; only one that lasts is the answer (a
    table stale with no writer at work is refused at once)."""
    t0 = time.monotonic()
    answer = read()
    deadline = time.monotonic() + max(READ_AGAIN_S, READ_AGAIN_TIMES * (time.monotonic() - t0))
    lock = Path(run_dir) / EVAL_DIR / EVAL_LOCK
    while answer is not None and time.monotonic() < deadline:
        writing = flock_listed(lock)
        if writing:
            time.sleep(READ_AGAIN_EVERY_S)
        answer = read()
        if not writing:
            break
    return answer


def rebuild_eval_table(run_dir: str | Path) -> str | None:
    """write_eval_table, under the eval lock its caller holds, after the caller changed the results.json
    files: a table that cannot be written then is a warning line (returned), not a failed eval: the
    scores stand in results.json (review RV32e F5, as R26a F3 for the plot)."""
    try:
        write_eval_table(run_dir)
    except Exception as e:  # noqa: BLE001 - a side output: one that cannot be written must not lose scores
        return (
            f"WARNING: {Path(run_dir) / EVAL_PARQUET} not rebuilt ({type(e).__name__}: {e}); the scores "
            f"stand in {Path(run_dir) / EVAL_DIR}/*/results.json, and `gristmill eval {run_dir} --table` "
            "writes it again from them (the audit refuses the table until then); nothing else stops for it"
        )
    return None


# Columns added to eval.parquet after its first version, and what a row of a table without one holds there
# (what the audit's `eval` view reads for it: validation/audit_views.py).
_LATER_COLUMNS: dict[str, Any] = {"decontamination": None, "merged": False, "settings": None}
# (git history: 7c7e513, d646aa2, c345daa; the audit refuses a table whose columns are not EVAL_SCHEMA's
# less some of these: validation/audit_views.py)
EVAL_COLUMNS_ADDED = tuple(_LATER_COLUMNS)


def stale_eval_table(run_dir: str | Path, copy: Path | None = None) -> str | None:
    """Why RUN/eval.parquet does not hold the rows of the results.json files now under RUN/eval/ (gone
    while they hold scores, rows of a step whose folder was removed, a value changed) and the fix, else
    None (also when the table cannot be read: the audit names an unreadable file itself; and for a
    table written before some of today's columns, whose own columns hold those rows). The audit
    answered the `eval` view from the table alone: deleted, it was 0 rows, exit 0 (review R23a A1).
    `copy`: the table's bytes as the caller read them (the audit's copy), named as the run's file."""
    path = Path(run_dir) / EVAL_PARQUET
    read_from = copy or path
    fix = f"write it again from them with `gristmill eval {run_dir} --table` (it scores nothing)"
    results = {merged: read_results(run_dir, merged) for merged in (False, True)}
    want = [r for merged, by_step in results.items() for r in result_rows(by_step, merged)]
    if not read_from.exists():
        return (
            f"{path} is missing, but {Path(run_dir) / EVAL_DIR}/*/results.json hold scores: {fix}"
            if want
            else None
        )
    try:
        table = pq.read_table(read_from)
    except Exception:  # noqa: BLE001 - unreadable: named by the audit's own check of its files
        return None
    have = table.to_pylist()
    # A table written before a column was (decontamination, merged) holds the same scores where the
    # rows' value there is what the audit's view reads for a missing column (review R23d 3); any other
    # column missing (value, step) or a later column's real values missing is not those rows (R23g S3).
    columns = table.column_names
    missing = set(EVAL_SCHEMA.names) - set(columns)
    wanted = pa.Table.from_pylist(want, schema=EVAL_SCHEMA).to_pylist()
    later = missing <= _LATER_COLUMNS.keys() and all(
        r.get(c) == _LATER_COLUMNS[c] for r in wanted for c in missing
    )

    def as_derived_now(row: dict[str, Any]) -> dict[str, Any]:
        # A row whose record holds no settings of its own (an older gristmill's member): its `settings`
        # are its groups' or tags' by a rule that changed (RV35a F3; a finished run's table was then
        # refused as not holding the scores: review RV41a F4). What an older rule wrote (none, or a
        # holder's whole line) is today's; any other value is not (review RV41b F4).
        step_results = results[bool(row.get("merged"))].get(row.get("step"), {})
        task = str(row.get("task"))
        holders = settings_holders(step_results, task)
        if "settings" not in row or holders == [task]:
            return row
        older = {None, *(settings_line(step_results[GRISTMILL_TASKS][h]["settings"]) for h in holders)}
        return {**row, "settings": settings_of(step_results, task)} if row["settings"] in older else row

    def keys(rows: list[dict[str, Any]]) -> list[str]:  # as written, NaN equal to NaN
        return sorted(json.dumps({c: r.get(c) for c in columns}, sort_keys=True, default=str) for r in rows)

    if later and keys([as_derived_now(r) for r in have]) == keys(wanted):
        return None
    steps = {(r.get("step"), bool(r.get("merged"))) for r in have}
    gone = sorted(s for s, merged in steps if s not in results[merged])
    if not want:  # nothing to write it from: no step has scores now
        fix = "delete it (no step has scores now)"
    if gone:
        return f"{path} holds rows of step {', '.join(map(str, gone))}, whose results.json is gone: {fix}"
    return f"{path} does not hold the scores of {Path(run_dir) / EVAL_DIR}/*/results.json: {fix}"
