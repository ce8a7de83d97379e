"""Eval results on disk: RUN/eval/step-N/results.json (lm-eval's own) and RUN/eval.parquet.

eval.parquet has one row per (step, task, metric, filter) and is rebuilt from every results.json
after each evaluation, so it can never disagree with them. It is the `eval` view of
`gristmill data audit RUN`. Only pyarrow and json here: the audit imports EVAL_SCHEMA.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.run_layout import EVAL_DIR, eval_dir, list_steps

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
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


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


def write_step_results(run_dir: str | Path, step: int, results: dict[str, Any]) -> Path:
    """Write (or merge into) RUN/eval/step-N/results.json, then rebuild RUN/eval.parquet."""
    out = eval_dir(run_dir, step) / RESULTS_JSON
    out.parent.mkdir(parents=True, exist_ok=True)
    old = read_step_results(run_dir, step)
    if old:
        for key in _PER_TASK_KEYS:
            if isinstance(old.get(key), dict) and isinstance(results.get(key), dict):
                results[key] = {**old[key], **results[key]}
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)
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
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=EVAL_SCHEMA), tmp)
    os.replace(tmp, path)
    return path


def write_plot(run_dir: str | Path) -> Path:
    """RUN/eval.png: one panel per (task, metric), value over steps."""
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
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_title(f"{task}: {metric}", fontsize=9)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(series) :]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(run_dir) / EVAL_PLOT
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
