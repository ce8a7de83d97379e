"""`gristmill data audit DIR [DIR …]`: SQL over a dataset's manifest, exclusions, stats and fingerprint.

    gristmill data audit runs/data/demo                        # the default tables
    gristmill data audit runs/data/demo --report lengths       # one preset (--report all: every one)
    gristmill data audit runs/data/demo --sql "SELECT dump, sum(n_tokens) FROM docs GROUP BY 1"
    gristmill data audit runs/data/demo --sql "…" --format csv # or json, table (default)
    gristmill data audit runs/data/demo --plots out/           # PNG charts of the presets
    gristmill data audit runs/data/demo --db audit.duckdb      # the views in a duckdb file
    gristmill data audit runs/data/a runs/data/b               # compare builds (column dataset_name)

Views and presets live in audit_views.py and audit_reports.py. `--sql` is read-only: only one
SELECT-like statement runs (duckdb's own parser decides), and the database can read nothing
outside the dataset directories (duckdb's `enable_external_access = false` with
`allowed_directories`, configuration locked).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import decimal
import json
import math
import os
import re
import shutil
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any, TextIO

import duckdb

from training.console import answer_on_stdout
from training.contract.config_loader import PathArgument, not_utf8
from training.contract.dataset_format import (
    DATASET_JSON,
    LOGS_DIR,
    DatasetError,
    redo_task,
    relative_location,
    task_of_file,
)
from training.contract.errors import GristmillError, print_error, sigterm_raises
from training.contract.object_store import ObjectStore, ObjectURL, is_url
from training.contract.run_layout import (
    CONFIG_TOML,
    CONSUMPTION_PARQUET,
    DATA_PLAN_JSON,
    EVAL_DIR,
    EVAL_PARQUET,
    dataset_around,
    file_in_the_way,
    is_training_run,
)
from training.data.recipe import check_trained_on, recorded_plan, recorded_plan_fix
from training.data.remote import add_cache_argument, cache_of, dataset_info, origin
from training.plotting import agg_pyplot
from validation.audit_reports import DEFAULT_REPORTS, FINEWEB_ONLY, PLOTS, PRESETS, RUN_REPORTS
from validation.audit_views import (
    BUILD_STATS,
    DATASET_VIEWS,
    DERIVED_VIEWS,
    FILE_VIEWS,
    RECORD_VIEWS,
    RUN_VIEWS,
    Damaged,
    DamagedFile,
    bucket_copy,
    check_db_path,
    check_roots,
    connect,
    dataset_json,
    describe_views,
    find_damaged,
    persist,
    run_tables_read_once,
    unchecked_tables,
    unfinished_builds,
    views_named,
)
from validation.validate import VALIDATION_JSON

AUDIT_DOC = "docs/audit.md"  # the views' columns and the presets, for a user

READ_ONLY = {duckdb.StatementType.SELECT}


class AuditQueryError(GristmillError):
    """A --sql query that is refused or fails; the message says why and lists the views."""


class AuditError(GristmillError):
    """A dataset whose files the audit cannot read; the message names the file."""


class _OneReport(argparse.Action):
    """--report given once: given twice, only the last was printed, exit 0 (trial RV57b F1)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if (first := getattr(namespace, self.dest)) is not None:
            raise AuditError(f"--report given twice ({first}, {values}): give one, or --report all")
        setattr(namespace, self.dest, values)


@contextlib.contextmanager
def _damaged_files_named(roots: list[str | Path]):
    """duckdb failing on a dataset's own files (a truncated manifest, a broken dataset.json) ends
    in one line naming the file, not a traceback."""
    try:
        yield
    except DamagedFile as e:  # a run's table whose pages fail their checksums, before duckdb read it
        raise _refusal(roots, e.damaged) from None
    except PermissionError as e:  # a folder of another user's build this one may not enter (RV42e M6)
        where = Path(e.filename) if e.filename else Path(roots[0])
        denied = Damaged(where, where, f"{where} cannot be read by this user ({e.strerror})", denied=True)
        raise _refusal(roots, denied) from None
    except duckdb.Error as e:
        damaged = _damaged_error(roots)
        if damaged is None:
            raise AuditError(f"duckdb: {str(e).strip().splitlines()[0]}") from None
        raise damaged from None


def _damaged_error(roots: list[str | Path]) -> AuditError | None:
    try:
        damaged = find_damaged(roots)
    except DamagedFile as e:  # its check of the `verified` tables: raised in a handler, it went unnamed
        damaged = e.damaged
    return None if damaged is None else _refusal(roots, damaged)


def _refusal(roots: list[str | Path], damaged: Damaged) -> AuditError:
    return AuditError(f"cannot audit {', '.join(map(str, roots))}: {damaged}; {_damaged_fix(damaged)}")


def _damaged_fix(damaged: Damaged) -> str:
    """What makes the damaged file readable again: advice that works for that kind of file. One this
    user may not read is no verdict on its bytes: a rebuild's advice deleted an intact dataset.json
    (review RV42c F2)."""
    if damaged.denied:
        return "give this user read access to it (or audit as its owner) and audit again"
    rel = damaged.path.relative_to(damaged.root)
    if rel.parts[0] == LOGS_DIR and damaged.path.parent.name == "stats":
        task = damaged.path.stem
        if rel.parent == Path(BUILD_STATS):
            # every audit checks it against dataset.json first (review RV41b F2: "the other reports
            # work without it" was said of a file that refused them all)
            counts = f"it is datatrove's stats of task {task}, the summary's counts"
            return f"{counts}; {redo_task(task, damaged.root)}"
        return (
            f"it is datatrove's stats of task {task} of a stage before the build's own pass, which no "
            "report needs (the summary counts the build's pass, logs/stats/): delete it and audit again"
        )
    if rel == Path(VALIDATION_JSON):
        return f"rerun `gristmill data validate {damaged.root}`, which writes it again"
    run_files = (Path(DATA_PLAN_JSON), Path(CONSUMPTION_PARQUET), Path(EVAL_PARQUET))
    if (
        rel in run_files
        and not (damaged.root / CONFIG_TOML).is_file()
        and not (damaged.root / DATASET_JSON).exists()
    ):
        # a training run's file in a directory without the run's config.toml: no dataset's fix (RV42d)
        return f"a training run's file, in {damaged.root}, which has no {CONFIG_TOML}: audit the run's own"
    if rel in (Path(DATA_PLAN_JSON), Path(CONSUMPTION_PARQUET)) and is_training_run(damaged.root):
        return recorded_plan_fix(damaged.root)  # a run's, not a dataset's: its plan and ledger
    if rel == Path(EVAL_PARQUET) and is_training_run(damaged.root):
        return (
            f"it is derived from {damaged.root / EVAL_DIR}/*/results.json, which hold the scores: write it "
            f"again from them with `gristmill eval {damaged.root} --table` (it scores nothing)"
        )
    if (task := task_of_file(rel.as_posix())) is not None:  # a manifest or excluded file: its task's
        return redo_task(f"{task:05d}", damaged.root)
    return (
        f"check the dataset with `gristmill data validate {damaged.root}` and rebuild it (rerun "
        "`gristmill data build`) if it is damaged"
    )


def _refuse_unfinished(roots: list[str | Path]) -> None:
    """An unfinished build's tables would count only the tasks that have finished (or, with no
    dataset.json, be mistaken for a training run's): refused, saying how to finish it."""
    unfinished = unfinished_builds(roots)
    if unfinished:
        root = unfinished[0]
        raise AuditError(
            f"{root} is an unfinished build (no {DATASET_JSON}: the build was stopped or failed before "
            "its last step); rerun the same `gristmill data build` command to finish it, then audit it "
            "(--sql queries what its finished tasks wrote meanwhile)"
        )


class Result:
    def __init__(self, name: str, columns: list[str], rows: list[tuple]):
        self.name, self.columns, self.rows = name, columns, rows

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


def run_preset(con: duckdb.DuckDBPyConnection, name: str) -> Result:
    return Result(name, *_answered(con, PRESETS[name]))


def _answered(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[tuple]]:
    """The columns and rows of `sql`, run in a thread of its own while this one waits: a Ctrl-C or a
    SIGTERM (sigterm_raises) reaches Python between bytecodes only, never inside duckdb's execute, so
    a long query ran on through both (trial RV74a 2). Now either interrupts the query and is raised
    here, and the audit ends as on any other stop (its copies' folder removed)."""
    answer: dict[str, Any] = {}
    done = threading.Event()  # not Thread.join: one a signal's handler interrupts took the thread for
    # ended while it ran (Python 3.11's _wait_for_tstate_lock), and the connection was still busy

    def query() -> None:
        try:
            cur = con.execute(sql)
            answer["rows"] = ([d[0] for d in cur.description], cur.fetchall())
        except BaseException as e:  # noqa: BLE001 (raised in the waiting thread)
            answer["error"] = e
        finally:
            done.set()

    threading.Thread(target=query, name="gristmill-audit-query", daemon=True).start()
    try:
        while not done.wait(0.1):  # a signal's handler runs in between
            pass
    except BaseException:
        con.interrupt()
        done.wait()
        raise
    if "error" in answer:
        raise answer["error"]
    return answer["rows"]


def _views_text(con: duckdb.DuckDBPyConnection) -> str:
    lines = ["views:"]
    for view, cols in describe_views(con):
        lines.append(f"  {view}({', '.join(f'{c} {t}' for c, t in cols)})")
    return "\n".join(lines)


def _quoting_hint(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """For a query duckdb cannot parse: a line for each view column it names bare that is a reserved word
    of SQL (docs' `offset`), which duckdb reads as the word, not the column (trial RV69a 9); "" if none."""
    reserved = "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
    columns = {c.lower() for _, cols in describe_views(con) for c, _ in cols}
    bare = re.sub(r"\"[^\"]*\"|'[^']*'", " ", sql)  # not a quoted name, nor inside a string
    named = {w.lower() for w in re.findall(r"\w+", bare)} & columns
    named &= {w for (w,) in con.execute(reserved).fetchall()}
    return "".join(
        f'\n{w} is a word of SQL: to name the column, write "{w}" (in double quotes)' for w in sorted(named)
    )


def _duckdb_said(said: str) -> str:
    """duckdb's message, its advice to run a SET (which --sql refuses: trial RV74a 5) told where it can be."""
    if 'Use "SET ' in said:
        said += " (--sql runs no SET: write the views into a file with --db FILE and query it in duckdb)"
    return said


def run_sql(con: duckdb.DuckDBPyConnection, sql: str) -> Result:
    """Run one read-only statement; anything else is an AuditQueryError naming the reason."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as e:
        raise AuditQueryError(
            f"{_duckdb_said(str(e))}{_quoting_hint(con, sql)}\n{_views_text(con)}"
        ) from None
    if len(statements) != 1:
        raise AuditQueryError(f"--sql takes exactly one statement, got {len(statements)}")
    kind = statements[0].type
    if kind not in READ_ONLY:
        name = str(kind).rsplit(".", 1)[-1]
        raise AuditQueryError(
            f"refused: --sql is read-only (SELECT, WITH, FROM, DESCRIBE, SUMMARIZE …); this is a {name} "
            "statement. To keep results, use --format csv|json and redirect, or --db FILE and open it "
            "with duckdb"
        )
    try:
        return Result("sql", *_answered(con, sql))
    except duckdb.PermissionException as e:
        raise AuditQueryError(
            f"refused: the audit reads only inside the dataset directories ({str(e).splitlines()[0]})"
        ) from None
    except duckdb.Error as e:
        # `from e`: only a query that failed while reading (not a typo or a refusal) can be a
        # damaged dataset file, and main() looks for one only then.
        raise AuditQueryError(f"{_duckdb_said(str(e).strip())}\n{_views_text(con)}") from e


# --------------------------------------------------------------------------------------------
# output


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):  # never rounded: 0.996 showed as 1.00, 2.4706 as 2.47 (trial RV69a 5)
        return f"{v:,}"  # the shortest decimal that reads back as it (repr); a preset rounds its shares
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=_json_default, ensure_ascii=False)  # a BLOB in a list: hex too
    if isinstance(v, bytes):  # not b'\xd7d…' (trial RV53a 2)
        return v.hex()
    return str(v)


def terminal_width(out: TextIO | None = None) -> int:
    """The terminal's columns when `out` (stdout by default) is one; 0 (no limit) otherwise, so a
    pipe or a file gets every value on one line."""
    try:
        tty = (out or sys.stdout).isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return 0
    return shutil.get_terminal_size().columns if tty else 0


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters (plus the space broken at), joining back to
    it (newlines apart): broken after a space or a slash in the line's second half, else anywhere."""
    pieces = []
    for part in text.split("\n"):
        while len(part) > width:
            half = width // 2
            cut = max(part.rfind(" ", half, width + 1), part.rfind("/", half, width)) + 1 or width
            pieces.append(part[:cut])
            part = part[cut:]
        pieces.append(part)
    return pieces


def _fit(widths: list[int], floor: list[int], budget: int) -> list[int]:
    """`widths` narrowed until they sum to `budget`: the widest column gives way first, none below
    its floor."""
    widths = list(widths)
    while sum(widths) > budget:
        shrinkable = [i for i, (w, f) in enumerate(zip(widths, floor)) if w > f]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1
    return widths


# Narrowed text columns keep their header whole and first their words up to this length (a URL
# is one long word), then, only if the table still does not fit, at least MIN_TEXT_WIDTH.
WORD_WIDTH, MIN_TEXT_WIDTH = 20, 8


def format_table(
    res: Result, max_rows: int | None = 50, max_width: int | None = None, width: int | None = None
) -> str:
    """`res` as aligned columns (numbers right, text left) with every value whole.

    `width` is the line length to keep within: None takes the terminal's (`terminal_width()`: no
    limit when stdout is no terminal), 0 means no limit. Text cells longer than their column (or
    than `max_width`) wrap onto continuation lines within it; numbers and headers never wrap, so a
    table that cannot fit is wider than `width` rather than missing characters."""
    rows = res.rows if max_rows is None else res.rows[:max_rows]
    cells = [[_cell(v) for v in r] for r in rows]
    # a column's decimal points aligned by spaces after the digits: no digit changed, and no zeros added
    # that would claim a precision the value lacks (0.5 beside 1/3 read 0.5000000000000000: RV69d 4)
    for i in range(len(res.columns)):
        plain = [
            isinstance(r[i], float) and math.isfinite(r[i]) and "e" not in c[i] for r, c in zip(rows, cells)
        ]
        places = max([len(c[i].partition(".")[2]) for c, p in zip(cells, plain) if p], default=0)
        for c, p in zip(cells, plain):
            c[i] += " " * (places - len(c[i].partition(".")[2])) if p else ""
    numeric = [
        all(
            isinstance(r[i], (int, float, decimal.Decimal)) and not isinstance(r[i], bool)
            for r in rows
            if r[i] is not None
        )
        and any(r[i] is not None for r in rows)
        for i in range(len(res.columns))
    ]
    lines = [[line for r in cells for line in r[i].split("\n")] for i in range(len(res.columns))]
    widths = [max([len(c)] + [len(x) for x in col]) for c, col in zip(res.columns, lines)]
    words = [max([0] + [len(w) for x in col for w in x.split()]) for col in lines]
    word_floor = [
        w if num else max(len(c), min(w, wd, WORD_WIDTH))
        for w, wd, c, num in zip(widths, words, res.columns, numeric)
    ]
    hard_floor = [
        w if num else max(len(c), min(w, MIN_TEXT_WIDTH)) for w, c, num in zip(widths, res.columns, numeric)
    ]
    if max_width:
        widths = [max(f, min(w, max_width)) for w, f in zip(widths, hard_floor)]
    width = terminal_width() if width is None else width
    if width:
        budget = width - 2 * (len(widths) - 1)
        widths = _fit(_fit(widths, word_floor, budget), hard_floor, budget)

    def line(vals: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.rstrip(" ").ljust(w) for v, w, num in zip(vals, widths, numeric)
        ).rstrip()

    out = [line(res.columns), line(["-" * w for w in widths])]
    for r in cells:
        pieces = [[c] if num else _wrap(c, w) for c, w, num in zip(r, widths, numeric)]
        for k in range(max(map(len, pieces), default=1)):
            out.append(line([p[k] if k < len(p) else "" for p in pieces]))
    if not res.rows:
        out.append("(no rows)")
    elif len(rows) < len(res.rows):
        out.append(
            f"… {len(res.rows) - len(rows):,} more rows (--max-rows 0 or --format csv|json prints all)"
        )
    return "\n".join(out)


def _json_default(v: Any) -> Any:
    if isinstance(v, bytes):  # a BLOB (docs.sha256): its hex, as the sha256 columns that are text
        return v.hex()
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (datetime.date, datetime.datetime, datetime.time)):
        return v.isoformat()
    return str(v)


def _nonfinite_to_null(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _nonfinite_to_null(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_nonfinite_to_null(x) for x in v]
    return v


def write_results(
    results: list[Result], fmt: str, out: TextIO, max_rows: int | None = 50, max_width: int | None = None
) -> None:
    if fmt == "json":
        data: Any = results[0].records() if len(results) == 1 else {r.name: r.records() for r in results}
        # Strict JSON for jq and friends: a NaN or inf (an eval metric that diverged) becomes null.
        data = _nonfinite_to_null(data)
        out.write(
            json.dumps(data, default=_json_default, ensure_ascii=False, indent=1, allow_nan=False) + "\n"
        )
        return
    for i, res in enumerate(results):
        if fmt == "csv":
            if len(results) > 1:
                out.write(f"# {res.name}\n")
            w = csv.writer(out, lineterminator="\n")
            w.writerow(res.columns)
            w.writerows(
                [
                    json.dumps(v, default=_json_default)
                    if isinstance(v, (list, dict))
                    else v.hex()
                    if isinstance(v, bytes)
                    else v
                    for v in r
                ]  # fmt: skip
                for r in res.rows
            )
        else:
            if len(results) > 1 or res.name != "sql":
                out.write(("\n" if i else "") + f"== {res.name} ==\n")
            out.write(format_table(res, max_rows, max_width, width=terminal_width(out)) + "\n")


# --------------------------------------------------------------------------------------------
# plots


def write_plots(con: duckdb.DuckDBPyConnection, out_dir: str | Path) -> list[Path]:
    """One PNG per plottable preset (PLOTS), a bar series per dataset; returns the files. A table of
    a column no document has (FINEWEB_ONLY: own files without `dump`, `url` or `int_score`) is not
    drawn: its one bar would be "None"."""
    plt = agg_pyplot()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (_, ycol, kind, words) in PLOTS.items():
        if name in FINEWEB_ONLY and not _has_values(con, FINEWEB_ONLY[name]):
            continue
        labels, series = plot_series(con, name)
        fig, ax = plt.subplots(figsize=(9, max(4.0, 0.3 * len(labels)) if kind == "barh" else 4.5))
        width = 0.8 / max(1, len(series))
        for k, (ds, heights) in enumerate(series.items()):
            pos = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
            (ax.barh if kind == "barh" else ax.bar)(pos, heights, width, label=ds)
        ticks = list(range(len(labels)))
        if kind == "barh":
            ax.set_yticks(ticks, labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(ycol)
            ax.set_ylabel(words)
        else:
            ax.set_xticks(ticks, labels, rotation=45 if len(labels) > 6 else 0, ha="right", fontsize=8)
            ax.set_xlabel(words)
            ax.set_ylabel(ycol)
        if not labels:
            ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes)
        if len(series) > 1:
            ax.legend()
        ax.set_title(f"{name}: {ycol} by {words}")
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def plot_series(con: duckdb.DuckDBPyConnection, name: str) -> tuple[list[str], dict[str, list[float]]]:
    """A plotted preset's x labels (numeric ones in numeric order: 8 before 16 before 1024, whichever
    dataset has them) and, per dataset, the bar heights at them (0 where it has no row)."""
    xcol, ycol, _, _ = PLOTS[name]
    recs = run_preset(con, name).records()
    xs = list(dict.fromkeys(r[xcol] for r in recs))
    if xs and all(isinstance(x, int | float) for x in xs):
        xs.sort()
    labels = [f"{x:,}" if isinstance(x, int | float) else str(x) for x in xs]
    series = {}
    for ds in dict.fromkeys(r["dataset_name"] for r in recs):
        vals = {r[xcol]: r[ycol] or 0 for r in recs if r["dataset_name"] == ds}
        series[ds] = [float(vals.get(x, 0)) for x in xs]
    return labels, series


# --------------------------------------------------------------------------------------------
# entry points


def _has_dataset(roots: list[str | Path]) -> bool:
    return any((Path(r) / DATASET_JSON).is_file() for r in roots)


def default_reports(roots: list[str | Path], con: duckdb.DuckDBPyConnection) -> list[str]:
    """The dataset tables, and a training run's (`consumption`) where a root is a run or none is a
    dataset. A FineWeb-only table is left out when no document has its column (own files without
    `dump`: one empty group says nothing)."""
    if not _has_dataset(roots):
        return RUN_REPORTS
    tables = [n for n in DEFAULT_REPORTS if n not in FINEWEB_ONLY or _has_values(con, FINEWEB_ONLY[n])]
    return tables + (RUN_REPORTS if any(is_training_run(r) for r in roots) else [])


def _has_values(con: duckdb.DuckDBPyConnection, column: str) -> bool:
    try:
        return bool(con.execute(f"SELECT count({column}) > 0 FROM docs").fetchone()[0])
    except duckdb.Error:  # no docs view: the table itself says what is missing
        return True


def print_summary(roots: list[str | Path], out: TextIO | None = None) -> None:
    """The default tables (DEFAULT_REPORTS) for these datasets, compact enough for one screen:
    long cells wrapped to the terminal's width, no dataset_name column for a single dataset.
    `make demo` shows it."""
    _refuse_unfinished(roots)
    with run_tables_read_once(roots), _damaged_files_named(roots):
        con, _ = connect(roots)
        try:
            results = [run_preset(con, n) for n in default_reports(roots, con)]
        finally:
            con.close()
    if len(roots) == 1:
        results = [Result(r.name, r.columns[1:], [row[1:] for row in r.rows]) for r in results]
    write_results(results, "table", out or sys.stdout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "presets: "
        + ", ".join(PRESETS)
        + f"\nviews: {', '.join([*FILE_VIEWS, *DERIVED_VIEWS])}; their columns in "
        f"{AUDIT_DOC}#views (or --sql 'SHOW ALL TABLES')"
    )
    parser.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        action=PathArgument,
        help="dataset directories or s3:// URLs, or training run directories (several: compare them)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--report",
        choices=[*PRESETS, "all"],
        action=_OneReport,
        help="print one preset report (all: every preset)",
    )
    what.add_argument("--sql", help="run one read-only SQL query over the views")
    parser.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output format")
    parser.add_argument("--max-rows", type=int, default=50, help="rows per table in --format table (0: all)")
    parser.add_argument(
        "--plots",
        metavar="OUT_DIR",
        action=PathArgument,
        local=True,
        help="also write PNG charts of the presets there",
    )
    parser.add_argument(
        "--db",
        metavar="FILE",
        action=PathArgument,
        local=True,
        help="also write the views into this duckdb database file",
    )
    add_cache_argument(parser)


def run(args: argparse.Namespace) -> int:
    with answer_on_stdout():  # tables, CSV or JSON that a pipe reads
        return _audit(args)


def _audit(args: argparse.Namespace) -> int:
    if args.sql is not None and (why := not_utf8(args.sql)) is not None:  # duckdb's TypeError (RV74e F1)
        raise AuditError(f"--sql {why}")
    # A bucket's dataset is audited in its copy in the cache (named by its URL in `dataset_name`).
    cache = cache_of(args)  # a --cache-dir that cannot be one: one line before the bucket is asked
    _refuse_twice(args.dirs)
    for url in {d for d in args.dirs if is_url(d)}:  # an unknown bucket, no credentials: one line first
        ObjectStore(url).check_bucket()
    args.dirs = [str(bucket_copy(d, cache)) if is_url(d) else d for d in args.dirs]
    # SIGTERM raises, so the copies' folder goes with the audit (it was left: trial RV63e 3)
    with sigterm_raises(), run_tables_read_once(args.dirs), _damaged_files_named(args.dirs):
        return _run(args)


def _refuse_twice(dirs: list[str]) -> None:
    """One directory (or bucket prefix) named twice, by another spelling or a link: its views held
    its rows twice, as demo#0 and demo#1, and every count summed over them doubled (trial RV71c 8)."""
    seen: dict[str, str] = {}
    for d in dirs:
        key = str(ObjectURL.parse(d)) if is_url(d) else os.path.realpath(d)
        if key in seen:
            raise AuditError(f"{seen[key]} and {d} are one dataset or run: name it once")
        seen[key] = d


def _refuse_other_file(db: Path) -> None:
    """--db names an existing file that is not a duckdb database: duckdb opens a .parquet, .csv or .json
    given as a database as a data source, so the views went into memory only, and "wrote" was false
    (review R18a F2)."""
    try:
        with open(db, "rb") as f:
            head = f.read(12)
    except OSError:
        return  # none yet (or not a file: duckdb's own error says so)
    if head and head[8:12] != b"DUCK":  # a duckdb database file's magic bytes
        raise AuditError(
            f"--db {db} is an existing file that is not a duckdb database; the views would not be written "
            "into it: name a new file (e.g. audit.duckdb)"
        )


def _run_sources(run: Path) -> list[tuple[str, str]]:
    """(source, dataset) of each source training run `run` reads (its config.toml's data.dataset or each
    [[data.sources]]), none where it is no run or its config cannot be read (review R24e 5: the advice
    named data.dataset, which a mixture's config does not have)."""
    from training.config import load_train_config
    from training.data.spec import resolve

    if not is_training_run(run):
        return []
    try:
        named = tomllib.loads((run / CONFIG_TOML).read_text()).get("data")
        if not isinstance(named, dict) or not {"dataset", "sources"} & set(named):
            return []  # the default dataset is no run's (an emptied config.toml named it: review R24h 4)
        return [(s.name, s.dataset) for s in resolve(load_train_config(str(run / CONFIG_TOML), [])).sources]
    except (GristmillError, OSError, ValueError):
        return []


def _other_build(run: Path, source: str, location: str, info: dict[str, Any]) -> str | None:
    """Why the dataset at `location` (its dataset.json: `info`) is not the build source `source` of
    training run `run` read, by the rule of `data inspect RUN` and `verify RUN` (RUN/data_plan.json's
    fingerprint), or None: it is, or nothing tells (no plan recorded, no dataset.json). A damaged plan
    is recorded_plan's DatasetError. A dataset rebuilt under the path a run's config names was advised
    and printed as the run's (review R31b F2)."""
    plan = recorded_plan(run)
    if not info or plan is None:
        return None
    # a relative path is read from the working directory, which the run's may not have been: said by
    # check_trained_on (review RV32d 3: an untouched dataset audited from another directory was said
    # to be rebuilt)
    since = "" if relative_location(location) else " after the run"
    try:
        check_trained_on(
            run, source, location, info, f"it was rebuilt or replaced{since}, so its tables are not of the "
            "documents the run read (the `sources` view holds the fingerprint it read)", plan,
        )  # fmt: skip
    except DatasetError as e:
        return str(e)
    return None


ADVICE_LOOKUP_S = 10.0  # how long the audit's advice waits for a bucket's dataset.json


def _dataset_json_at(location: str) -> dict[str, Any]:
    """The dataset.json of the dataset a run's config names, a bucket's too (one GET, nothing cached:
    `Path` read an s3:// URL as a local path, which holds none, so a replaced bucket dataset was advised
    as the run's: review RV32d 2), or {} where none is readable (moved, deleted: nothing tells). A
    bucket's within ADVICE_LOOKUP_S: advice is not worth a stall (an endpoint that never answered held
    the audit for ten tries of 60 s: review RV32g C)."""
    try:
        return dataset_info(location, within_s=ADVICE_LOOKUP_S)
    except GristmillError:
        return {}


def _same_place(a: str | Path, b: str | Path) -> bool:
    """Whether two dataset locations are one: a bucket's URL (an audited root is its cache copy), or a
    directory however written."""

    def where(x: str | Path) -> str:
        return str(x) if is_url(str(x)) else (origin(Path(x)) or os.path.realpath(x))

    return where(a) == where(b)


def _note_other_builds(dirs: list[str]) -> None:
    """A dataset audited beside a run whose config names its path, but another build than the run read
    (rebuilt since): one note, since both print as if paired."""
    datasets = [d for d in dirs if (Path(d) / DATASET_JSON).is_file()]
    notes = []
    for run in (Path(d) for d in dirs if datasets and is_training_run(d)):
        for source, location in _run_sources(run):
            for root in (d for d in datasets if _same_place(d, location)):
                try:
                    notes.append(_other_build(run, source, location, dataset_json(Path(root))))
                except DatasetError as e:  # its data_plan.json damaged: nothing tells
                    notes.append(str(e))
    for why in dict.fromkeys(n for n in notes if n):
        print(f"note: {why}", file=sys.stderr)


def _no_dataset(dirs: list[str], what: str, instead: str) -> AuditError:
    """`what` (a dataset's report, plots, view) asked of `dirs`, none of which is a dataset: one line naming
    the datasets each run's config.toml names, where they are the builds it read, or `instead`. Its
    tables would be empty: "(no rows)" and exit 0 said nothing of why."""
    runs, others = [], []
    for d in dirs:
        if sources := _run_sources(Path(d)):
            try:
                why = {s: _other_build(Path(d), s, loc, _dataset_json_at(loc)) for s, loc in sources}
            except DatasetError as e:  # its data_plan.json damaged: which builds it read is unknown
                why, others = dict.fromkeys(s for s, _ in sources), [*others, str(e)]
            # none: each is missing, damaged or another build than it read, as said after (a rebuilt
            # one was "none from this working directory", though there: trial RV71c 7)
            none = "none that is the build it read"
            runs.append(f"{d}'s: " + (", ".join(_found(loc) for s, loc in sources if not why[s]) or none))
            others += [w for w in why.values() if w]
    return AuditError(
        f"{what} reads a dataset's files, and {', '.join(dirs)} holds no {DATASET_JSON}: pass a dataset "
        "directory ("
        + ("; ".join(runs) if runs else "a training run's are the datasets its config.toml names")
        + f"), or {instead}"
        + "".join(f"; {w}" for w in others)
    )


def _found(location: str) -> str:
    """A dataset location a run's config names, as advice: said not found where no dataset.json is there
    (a relative one from another working directory led nowhere, unsaid: trial RV74a 6)."""
    if is_url(location) or (Path(location) / DATASET_JSON).is_file():
        return location
    return f"{location}, not found" + (
        f" from the working directory {Path.cwd()}" if relative_location(location) else ""
    )


def _run(args: argparse.Namespace) -> int:
    if args.max_rows < 0:  # a negative count sliced rows off the end, with a "… more rows" note
        raise AuditError(f"--max-rows {args.max_rows}: give the rows a table shows, ≥ 1 (0: all)")
    if args.sql is None:
        _refuse_unfinished(args.dirs)
    else:
        for root in unfinished_builds(args.dirs):
            print(
                f"note: {root} is an unfinished build (no {DATASET_JSON}): its views hold only what "
                "its finished tasks wrote",
                file=sys.stderr,
            )
    asked = f"--report {args.report}" if args.report not in (None, "all", *RUN_REPORTS) else None
    if (asked or args.plots) and not _has_dataset(args.dirs):
        raise _no_dataset(
            args.dirs, asked or "--plots", f"--report {' / '.join(RUN_REPORTS)} for a training run"
        )
    # the views --sql names, as duckdb reads it (its CTEs none of them)
    named = [] if args.sql is None else views_named(args.sql, [*DATASET_VIEWS, *RUN_VIEWS])
    view = next((v for v in named if v in DATASET_VIEWS), None)
    if view and not (_has_dataset(args.dirs) or unfinished_builds(args.dirs)):
        # of run directories alone, `docs` answered 0, exit 0 (trial RV69a 4)
        runs = f"query a training run's views alone ({', '.join(RUN_VIEWS)})"
        raise _no_dataset(args.dirs, f"--sql's view {view}", runs)
    _note_other_builds(args.dirs)
    # of datasets alone, a run's table would be empty: "(no rows)" and exit 0 said nothing of why
    # (review R18a F5; a --sql of one: trial RV69e 4)
    of_run = f"--report {args.report}" if args.report in RUN_REPORTS else None
    if (view := next((v for v in named if v in RUN_VIEWS), None)) is not None:
        of_run = f"--sql's view {view}"
    if of_run and not any(is_training_run(r) or (Path(r) / EVAL_PARQUET).is_file() for r in args.dirs):
        raise AuditError(
            f"{of_run} reads a training run's files, and {', '.join(args.dirs)} holds no "
            f"run: pass a training run directory (its run.output_dir) beside or instead of the dataset"
        )
    if args.plots:  # a file where the folder goes: said after the whole report was printed (RV74c 7)
        if (there := file_in_the_way(args.plots)) is not None:
            raise AuditError(f"--plots {args.plots}: {there} is a file; name a folder to write the PNGs in")
    if args.db:  # before the roots' files are hashed (minutes at FineWeb-Edu scale: review RV42c F3)
        if Path(args.db).is_dir():  # it was duckdb's "IO Error: … Is a directory" (trial RV74c 7)
            raise AuditError(
                f"--db {args.db} is a directory; name a database file (a new one, or an audit's)"
            )
        check_db_path(args.db)
        _refuse_other_file(Path(args.db))
        if (inside := dataset_around(args.db)) is not None:
            raise AuditError(f"--db {args.db} {inside}, which does not record it: name a file outside it")
    gone: list[Path] = []  # recorded stats files of a stage before the build's pass, missing: a note
    # the roots' files, hashed once where the views are made twice; a run's plan and ledger where read
    record_read = args.db is not None or (
        any(v in RECORD_VIEWS for v in named)
        if args.sql is not None
        else args.report in (None, "all", *RUN_REPORTS)
    )
    checked = check_roots(args.dirs, gone, record_read)
    for table in unchecked_tables(args.dirs):  # named as the user named them
        print(f"note: {table}: its pages were read as they are; {_damaged_fix(table)}", file=sys.stderr)
    for path in gone:
        print(
            f"note: {path} is missing, though {DATASET_JSON} records it: the `stats` view has no rows of "
            "that task of its stage (datatrove's stats of a stage before the build's pass, which no report "
            "needs)",
            file=sys.stderr,
        )
    if args.db:
        try:
            views = persist(args.dirs, args.db, checked)
        except duckdb.IOException as e:
            raise AuditError(f"cannot write --db {args.db}: {str(e).strip().splitlines()[0]}") from None
        except duckdb.CatalogException as e:  # e.g. a table of the user's own named docs
            raise AuditError(
                f"cannot write the views into --db {args.db}: {str(e).strip().splitlines()[0]}; name a new "
                "file, or a database only the audit wrote"
            ) from None
        # the duckdb CLI is no dependency of gristmill: the Python module is (trial RV71c 5)
        how = f"`duckdb.connect({str(args.db)!r})` in Python, or the duckdb CLI"
        print(f"wrote {args.db}: views {', '.join(views)} (open it with {how})", file=sys.stderr)
    con, _ = connect(args.dirs, checked)
    try:
        if args.sql is not None:
            try:
                results = [run_sql(con, args.sql)]
            except AuditQueryError as e:
                # duckdb's error for a damaged dataset file (a cast of a cut-off dataset.json) does
                # not name the file: name it, as the default tables do.
                damaged = _damaged_error(args.dirs) if e.__cause__ is not None else None
                if damaged is not None:
                    raise damaged from None
                return print_error(e)
        else:
            # "all" of what the roots are: a dataset's tables, a run's own, or both
            run = any(is_training_run(r) for r in args.dirs)
            every = [n for n in PRESETS if n not in RUN_REPORTS or run]
            every = every if _has_dataset(args.dirs) else RUN_REPORTS
            names = (
                every
                if args.report == "all"
                else [args.report]
                if args.report
                else default_reports(args.dirs, con)
            )
            results = [run_preset(con, n) for n in names]
        write_results(results, args.format, sys.stdout, args.max_rows or None)
        if args.plots:
            try:
                files = write_plots(con, args.plots)
            except OSError as e:
                raise AuditError(f"cannot write plots to {args.plots}: {e}") from None
            print(
                f"wrote {len(files)} plots to {args.plots}: {', '.join(p.name for p in files)}",
                file=sys.stderr,
            )
    finally:
        con.close()
    return 0
