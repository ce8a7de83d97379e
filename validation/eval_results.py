"""Eval results on disk: RUN/eval/step-N/results.json (lm-eval's own) and RUN/eval.parquet.

eval.parquet has one row per (step, task, metric, filter) and is rebuilt from every results.json
after each evaluation, so it can never disagree with them. It is the `eval` view of
`gristmill data audit RUN`. Only pyarrow and json here: the audit imports EVAL_SCHEMA.

No number is hidden: a NaN or infinite metric (a model whose log-likelihoods overflow) is kept in
results.json (Python's json writes and reads `NaN`/`Infinity`), in eval.parquet and in the printed
table as NaN/inf; `nonfinite_metrics` lists them for the warnings and the failed exit of the eval.
Only what is not a number at all ("N/A" stderrs, aliases) stays out of eval.parquet.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.contract.atomic_write import atomic_path, write_atomic
from training.contract.run_layout import EVAL_DIR, eval_dir, list_steps

RESULTS_JSON = "results.json"
EVAL_PARQUET = "eval.parquet"
EVAL_PLOT = "eval.png"

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
    ]
)
# lm-eval's per-task sections (task name -> …), merged when a step is evaluated on more tasks later.
_PER_TASK_KEYS = (
    "results",
    "configs",
    "versions",
    "n-shot",
    "higher_is_better",
    "n-samples",
    "group_subtasks",
)


def _number(v: Any) -> float | None:
    """`v` as a float when it is a number (NaN and ±inf included: they say the model is broken), else
    None ("N/A", aliases, booleans). numpy scalars count as numbers."""
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else None


def _json_default(v: Any) -> Any:
    """json.dumps fallback: numpy scalars as the numbers they are (a float32 NaN must stay a number,
    not become the string "nan"), anything else as its str()."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    return str(v)


def rows_of(step: int, results: dict[str, Any]) -> list[dict[str, Any]]:
    """eval.parquet rows of one lm-eval results dict (keys "metric,filter", stderr "metric_stderr,filter")."""
    rows = []
    samples = results.get("n-samples", {})
    model = str(results.get("gristmill", {}).get("export") or results.get("config", {}).get("model", ""))
    for task, metrics in sorted(results.get("results", {}).items()):
        for key, value in sorted(metrics.items()):
            metric, comma, filt = key.partition(",")
            if not comma or metric.endswith("_stderr") or _number(value) is None:
                continue  # alias, sample_len (no filter: not metrics), stderr columns, "N/A"
            rows.append(
                {
                    "step": step,
                    "task": task,
                    "metric": metric,
                    "filter": filt,
                    "value": float(value),
                    "stderr": _number(metrics.get(f"{metric}_stderr,{filt}")),
                    "samples": (samples.get(task) or {}).get("effective"),
                    "model": model,
                }
            )
    return rows


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


def write_step_results(run_dir: str | Path, step: int, results: dict[str, Any]) -> Path:
    """Write (or merge into) RUN/eval/step-N/results.json, then rebuild RUN/eval.parquet."""
    out = eval_dir(run_dir, step) / RESULTS_JSON
    out.parent.mkdir(parents=True, exist_ok=True)
    old = read_step_results(run_dir, step)
    if old:
        for key in _PER_TASK_KEYS:
            if isinstance(old.get(key), dict) and isinstance(results.get(key), dict):
                results[key] = {**old[key], **results[key]}
    # allow_nan: NaN/inf metrics are written as NaN/Infinity, which json.loads (read_step_results) reads.
    text = json.dumps(results, indent=2, default=_json_default, ensure_ascii=False, allow_nan=True)
    write_atomic(out, text + "\n")
    write_parquet(run_dir)
    return out


def read_step_results(run_dir: str | Path, step: int) -> dict[str, Any]:
    """RUN/eval/step-N/results.json, or {} when that step has none."""
    path = eval_dir(run_dir, step) / RESULTS_JSON
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read_results(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """{step: results dict} of every RUN/eval/step-N/results.json."""
    steps = list_steps(Path(run_dir) / EVAL_DIR)
    return {s: res for s in steps if (res := read_step_results(run_dir, s))}


def write_parquet(run_dir: str | Path) -> Path:
    rows = [r for step, res in read_results(run_dir).items() for r in rows_of(step, res)]
    path = Path(run_dir) / EVAL_PARQUET
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=EVAL_SCHEMA), tmp)
    return path


def write_plot(run_dir: str | Path) -> Path:
    """RUN/eval.png: one panel per (task, metric), value over steps; NaN/inf values are left out of
    the lines (the table and eval.parquet keep them), a panel with none finite says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = pq.read_table(Path(run_dir) / EVAL_PARQUET).to_pylist()
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in table:
        series.setdefault((r["task"], r["metric"]), []).append((r["step"], r["value"]))
    n = max(1, len(series))
    cols = min(3, n)
    fig, axes = plt.subplots(-(-n // cols), cols, figsize=(4.5 * cols, 3.2 * -(-n // cols)), squeeze=False)
    for ax, ((task, metric), pts) in zip(axes.flat, sorted(series.items())):
        pts = sorted(p for p in pts if math.isfinite(p[1]))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        else:
            ax.text(0.5, 0.5, "no finite value", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{task}: {metric}", fontsize=9)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(run_dir) / EVAL_PLOT
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
