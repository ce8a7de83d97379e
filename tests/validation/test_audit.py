"""`gristmill data audit`: duckdb views over a dataset built by the real build, presets, read-only --sql."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import statistics
import urllib.parse
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.data_index import index_dataset
from pipelines.shard_writer import ShardWriter, finalize_dataset
from training.contract.dataset_format import (
    EXCLUDED_SCHEMA,
    INDEX_WRITES,
    UPLOAD_WRITES,
    fingerprint,
    fingerprint_without_index,
    manifest_files,
    redo_task,
)
from training.contract.eval_table import write_eval_table
from training.data.plan import Phase, Plan, Source
from training.data.recipe import plan_not_found, record_plan, write_consumption
from validation.audit import (
    Result,
    format_table,
    plot_series,
    print_summary,
    run_preset,
    run_sql,
    terminal_width,
    write_plots,
    write_results,
)
from validation.audit_reports import PLOTS, PRESETS
from validation.audit_views import FILE_VIEWS, UNINDEXED_SQL, connect, dataset_names, persist


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def summary_rows(root: Path) -> dict[str, dict]:
    con, _ = connect([root])
    return {r["item"]: r for r in run_preset(con, "summary").records()}


def datatrove_stats(root: Path) -> tuple[int, dict[str, int], int, int]:
    """(documents read, dropped per filter, documents and tokens of the last step), from the
    per-task stats files datatrove wrote, parsed here independently of the audit's SQL."""
    read, dropped, kept, tokens = 0, {}, 0, 0
    files = sorted((root / "logs" / "stats").glob("*.json"))
    assert files
    for path in files:
        steps = json.loads(path.read_text())
        reader = steps[0]["stats"]["documents"]
        read += reader["total"] if isinstance(reader, dict) else reader
        for step in steps:
            if "FILTER" in step["name"]:
                name = step["name"].split(": ", 1)[1]
                dropped[name] = dropped.get(name, 0) + step["stats"].get("dropped", 0)
        last = steps[-1]["stats"]
        kept += last["documents"]["total"] if isinstance(last["documents"], dict) else last["documents"]
        tokens += last["tokens"]["total"] if isinstance(last["tokens"], dict) else last["tokens"]
    return read, dropped, kept, tokens


def test_summary_counts_equal_manifest_and_datatrove_stats(built_dataset):
    rows = summary_rows(built_dataset)
    manifest = pa.concat_tables(pq.read_table(p) for p in manifest_files(built_dataset))
    info = json.loads((built_dataset / "dataset.json").read_text())
    read, dropped, kept, tokens = datatrove_stats(built_dataset)

    n_tokens = int(np.sum(manifest.column("n_tokens").to_numpy()))
    assert rows["kept (manifest)"]["documents"] == manifest.num_rows == info["documents"] == kept
    assert rows["kept (manifest)"]["tokens"] == n_tokens == info["tokens"] == tokens
    assert rows["kept (tokenize step stats)"]["documents"] == kept
    assert rows["kept (tokenize step stats)"]["tokens"] == tokens
    assert rows["read"]["documents"] == read
    assert {
        k.removeprefix("dropped by "): r["documents"] for k, r in rows.items() if k.startswith("dropped by")
    } == (dropped)
    assert sum(dropped.values()) > 0  # the fixture corpus has rows every filter drops
    assert read == kept + sum(dropped.values())  # kept + dropped = read
    excluded = sum(pq.read_metadata(p).num_rows for p in (built_dataset / "excluded").glob("*.parquet"))
    assert rows["dropped (excluded/ rows)"]["documents"] == excluded == sum(dropped.values())
    assert rows["shards"]["documents"] == info["shards"] == len(set(manifest.column("shard").to_pylist()))
    assert rows["kept (manifest)"]["pct_of_read"] == round(100 * kept / read, 2)


def test_every_preset_runs_and_stats_view_flattens(built_dataset):
    con, names = connect([built_dataset])
    for name in PRESETS:
        res = run_preset(con, name)
        assert res.columns[0] == "dataset_name", name
    by_dump = dict(con.execute("SELECT dump, sum(n_tokens) FROM docs GROUP BY 1").fetchall())
    assert sum(by_dump.values()) == json.loads((built_dataset / "dataset.json").read_text())["tokens"]
    tasks = con.execute("SELECT DISTINCT task FROM stats ORDER BY 1").fetchall()
    assert tasks == [(0,), (1,)]
    val = run_preset(con, "validation").records()
    assert val[0]["status"] == "ok" and val[0]["problems"] == 0 and val[0]["dataset_name"] == names[0]
    balance = run_preset(con, "shard_balance").records()[0]
    assert balance["min_tokens"] <= balance["median_tokens"] <= balance["max_tokens"]
    shards = [t for (t,) in con.execute("SELECT tokens FROM shards").fetchall()]
    assert balance["median_tokens"] == statistics.median(shards), shards  # not cut to an integer (RV57b F3)


def test_cli_formats(built_dataset, capsys):
    sql = "SELECT dump, sum(n_tokens) AS tokens FROM docs GROUP BY 1 ORDER BY 1"
    assert main(["data", "audit", str(built_dataset), "--sql", sql, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["dump"] for r in rows] == ["CC-MAIN-2023-50", "CC-MAIN-2024-10"]
    assert main(["data", "audit", str(built_dataset), "--sql", sql, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [int(r["tokens"]) for r in data] == [int(r["tokens"]) for r in rows]
    # docs.sha256, a BLOB: its hex in every format, the sha256 of the document's ids (it was
    # b'\xd7d\xfa?…', Python's repr: trial RV53a 2)
    sql = 'SELECT shard, key, "offset", nbytes, sha256 FROM docs ORDER BY shard, key, "offset" DESC LIMIT 1'
    said = []
    for fmt in ("csv", "json", "table"):
        assert main(["data", "audit", str(built_dataset), "--sql", sql, "--format", fmt]) == 0
        said.append(capsys.readouterr().out)
    first = json.loads(said[1])[0]
    shard = (built_dataset / "shards" / first["shard"]).read_bytes()  # offset: in the shard file
    digest = hashlib.sha256(shard[first["offset"] : first["offset"] + first["nbytes"]]).hexdigest()
    assert first["sha256"] == digest and all(digest in out for out in said), said
    listed = 'SELECT [sha256] AS l FROM docs ORDER BY shard, key, "offset" DESC LIMIT 1'  # in a list too
    assert main(["data", "audit", str(built_dataset), "--sql", listed]) == 0
    assert f'["{digest}"]' in capsys.readouterr().out
    assert main(["data", "audit", str(built_dataset), "--report", "lengths"]) == 0
    out = capsys.readouterr().out
    assert "== lengths ==" in out and "tokens_from" in out
    # given twice: only the last was printed, exit 0 (trial RV57b F1)
    assert main(["data", "audit", str(built_dataset), "--report", "summary", "--report", "lengths"]) == 2
    said = capsys.readouterr()
    assert said.err == "error: --report given twice (summary, lengths): give one, or --report all\n", said
    assert said.out == ""
    assert main(["data", "audit", str(built_dataset)]) == 0  # the default tables
    out = capsys.readouterr().out
    assert "== summary ==" in out and "kept (manifest)" in out and "== validation ==" in out


@pytest.mark.parametrize(
    "sql",
    [
        "COPY docs TO '{root}/leak.csv'",
        "COPY (SELECT 1) TO '{tmp}/leak.csv'",
        "EXPORT DATABASE '{root}/leak'",
        "ATTACH '{root}/leak.duckdb' AS x",
        "CREATE TABLE leak AS SELECT * FROM docs",
        "INSERT INTO docs SELECT * FROM docs",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "PRAGMA enable_profiling",
        "SELECT 1; COPY docs TO '{root}/leak.csv'",
    ],
)
def test_write_queries_are_refused_and_leave_no_file(built_dataset, tmp_path, capsys, sql):
    before = files_under(built_dataset)
    sql = sql.format(root=built_dataset, tmp=tmp_path)
    assert main(["data", "audit", str(built_dataset), "--sql", sql]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and ("refused" in err or "exactly one statement" in err), err
    assert files_under(built_dataset) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_blob('/proc/self/environ')",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM read_csv('{root}/../../../../etc/passwd')",
        "SELECT count(*) FROM read_parquet('{other}/manifest/*.parquet')",
    ],
)
def test_file_functions_outside_the_dataset_are_refused(built_dataset, tmp_path, capsys, sql):
    other = tmp_path / "other"
    shutil.copytree(built_dataset / "manifest", other / "manifest")
    sql = sql.format(root=built_dataset, other=other)
    assert main(["data", "audit", str(built_dataset), "--sql", sql]) == 2
    err = capsys.readouterr().err
    assert "refused: the audit reads only inside the dataset directories" in err, err


def test_reading_inside_the_dataset_is_allowed(built_dataset):
    con, _ = connect([built_dataset])
    n = run_sql(con, f"SELECT count(*) AS n FROM read_parquet('{built_dataset}/manifest/*.parquet')").rows[0][
        0
    ]
    assert n == json.loads((built_dataset / "dataset.json").read_text())["documents"]


def test_malformed_query_prints_error_and_views(built_dataset, capsys):
    assert main(["data", "audit", str(built_dataset), "--sql", "SELECT no_such_column FROM docs"]) == 2
    err = capsys.readouterr().err
    assert "no_such_column" in err and "views:" in err
    assert "docs(dataset_name VARCHAR, shard VARCHAR" in err and "  stats(" in err
    assert main(["data", "audit", str(built_dataset), "--sql", "SELEC 1"]) == 2
    assert "syntax error" in capsys.readouterr().err
    # a column that is a reserved word, written bare: the hint to quote it (trial RV69a 9)
    assert main(["data", "audit", str(built_dataset), "--sql", "SELECT shard, offset FROM docs"]) == 2
    err = capsys.readouterr().err
    assert 'syntax error at or near "FROM"' in err, err
    assert '\noffset is a word of SQL: to name the column, write "offset" (in double quotes)\nviews:' in err
    assert main(["data", "audit", str(built_dataset), "--sql", 'SELECT "offset" FRO docs']) == 2
    assert "word of SQL" not in capsys.readouterr().err
    # duckdb's advice to SET what --sql refuses: where it can be done (trial RV74a 5)
    assert main(["data", "audit", str(built_dataset), "--sql", "SELECT " + "+".join(["1"] * 1500)]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: Parser Error: Max expression depth") and first.endswith(
        '"SET max_expression_depth TO x" to increase the maximum expression depth. (--sql runs no SET: write '
        "the views into a file with --db FILE and query it in duckdb)"
    ), first


def test_plots_skip_columns_a_dataset_lacks_and_order_lengths_numerically(built_dataset, tmp_path):
    """Issue 47: own files without FineWeb's columns drew a single "None" bar per plot, and
    lengths.png's bins were in the order the datasets listed them, labelled `tokens_from`."""
    from tests.helpers.train_data import make_dataset

    own = make_dataset(tmp_path / "own", n_docs=120)  # synthetic: no dump, url or int_score
    con, _ = connect([own])
    assert sorted(p.name for p in write_plots(con, tmp_path / "plots")) == ["drops.png", "lengths.png"]
    con, _ = connect([built_dataset, own])
    labels, series = plot_series(con, "lengths")
    bins = [int(label.replace(",", "")) for label in labels]
    assert bins == sorted(set(bins))
    low = "(2 ** floor(log2(greatest(n_tokens, 1))))::BIGINT"
    counted = con.execute(f"SELECT dataset_name, {low}, count(*) FROM docs GROUP BY ALL").fetchall()
    assert sum(map(len, series.values())) == 2 * len(bins)
    for name, low, documents in counted:  # each dataset's bar at its bin, 0 where it has none
        assert series[name][bins.index(low)] == documents
    assert sum(sum(v) for v in series.values()) == sum(n for _, _, n in counted)
    assert PLOTS["lengths"][3] == "document length in tokens (each bin: from n to 2n)"


def test_plots_are_png(built_dataset, tmp_path):
    con, _ = connect([built_dataset])
    files = write_plots(con, tmp_path / "plots")
    assert sorted(p.name for p in files) == sorted(f"{n}.png" for n in PLOTS)
    for p in files:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", p
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 100 and height > 100 and len(data) > 1000


def small_dataset(root: Path, seed: int = 1) -> Path:
    """A ShardWriter dataset with no logs/ and no excluded/; task 1 has no documents, and the
    source rows s0 and s1 each appear twice (ids), once under the same url. Another `seed` is
    another build (other token ids: another fingerprint)."""
    rng = np.random.default_rng(seed)
    for t in range(2):
        w = ShardWriter(root, t, vocab_size=1000, target_bytes=4096)
        for i in range(0 if t == 1 else 12):
            ids = np.append(rng.integers(1, 1000, 50), 0).astype(np.uint16)
            j = i % 10  # docs 10, 11 repeat sources 0, 1
            url = f"https://www.other.net/{j if i != 11 else 'moved'}"
            w.add(f"t{t}d{i}", ids, {"id": f"s{j}", "url": url, "dump": "CC-X"})
        w.close()
    sep = {"token": "<|endoftext|>", "id": 0, "position": "after"}
    finalize_dataset(root, vocab_size=1000, separator=sep, config_sha256="small")
    return root


def without_index(data: Path) -> str:
    """`data` as built without a loader index (its index removed): its fingerprint then."""
    info = json.loads((data / "dataset.json").read_text())
    shutil.rmtree(data / "index")
    del info["index"]
    info["fingerprint"] = fingerprint(info)
    (data / "dataset.json").write_text(json.dumps(info))
    return info["fingerprint"]


def test_a_runs_dataset_rebuilt_under_its_path_is_named_another_build(tmp_path, capsys, monkeypatch):
    """The run's config names a path whose dataset was rebuilt: the advice and a run audited beside it
    named it as the run's, and no view held the build the run read (review R31b F2). A relative path is
    read from the working directory, maybe not the run's: said so, naming the path read (review RV32d 3)."""
    read = without_index(small_dataset(tmp_path / "data"))  # the run read it before `data index`
    data = tmp_path / "data"
    plan = Plan([Source("data", str(data), read, 600, 12, None)], [Phase("main", 4, 16, 2, (1,))], seed=1)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f"[data]\ndataset = {json.dumps(str(data))}\n")
    record_plan(plan, run)
    write_consumption(plan, 2, plan.consumed(2), run / "consumption.parquet")
    same = "SELECT list_contains(d.fingerprints, s.fingerprint) FROM consumption c JOIN sources s USING "
    same += "(dataset_name, source), dataset d"  # as docs/audit.md asks it
    persist([run, data], tmp_path / "audit.duckdb")  # made before `data index` (review RV32g B)
    index_dataset(data, log=lambda *a: None)  # the same data: fingerprints holds both (review RV32d 4)
    assert main(["data", "audit", str(run), str(data), "--sql", same, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[-1] == "True" and not err, (out, err)
    db = duckdb.connect(str(tmp_path / "audit.duckdb"))
    # the --db said False, "another build" (review RV32g B); its views of data now refuse once its files
    # changed since it was written, `data index` too (trial RV71c 1)
    refused = re.escape(f"{data} changed since this --db was written (dataset.json changed, and ")
    with pytest.raises(duckdb.InvalidInputException, match=refused):
        db.execute(same)
    write_consumption(plan, 2, plan.consumed(2), run / "consumption.parquet")  # as the trainer rewrites it
    assert db.execute("SELECT count(*) FROM consumption").fetchone()[0] > 0  # a run's tables: not guarded
    # The digest the --db compares: every key of dataset.json but those `data index` writes, so one a
    # future fingerprint() covers changes it too; it listed the fields fingerprint() covered, a second
    # list (and a json_each of shard_files: 47 s at 300k shards), review RV33d F2, F6.
    info = json.loads((data / "dataset.json").read_text())
    unindexed = fingerprint_without_index(info)
    skipped = INDEX_WRITES + UPLOAD_WRITES  # an upload's "files" too (review RV33e F2a)
    assert fingerprint_without_index({**info, **dict.fromkeys(skipped, "x")}) == unindexed

    def digest(i: dict) -> str:
        return db.execute(f"SELECT {UNINDEXED_SQL} FROM (SELECT ?::JSON AS j)", [json.dumps(i)]).fetchone()[0]

    for key in {*info, *UPLOAD_WRITES, "a_field_fingerprint_may_come_to_cover"}:
        assert (digest({**info, key: "x"}) == digest(info)) == (key in skipped), key
    shutil.rmtree(data)
    small_dataset(data, seed=2)
    with pytest.raises(duckdb.InvalidInputException, match=refused):  # it read the new build's files
        db.execute(same)
    db.close()
    without_index(data)
    now = index_dataset(data, log=lambda *a: None)["fingerprint"]
    another = f"{data} is not the dataset this run trained on (fingerprint {now[:12]}… now, {read[:12]}… in "
    assert main(["data", "audit", str(run), "--report", "summary"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        f"pass a dataset directory ({run}'s: none that is the build it read)" in err
        and another in err
        and "\n" not in err
    ), err
    assert main(["data", "audit", str(run), str(data), "--sql", same, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[-1] == "False" and err.startswith("note: source 'data': " + another), err
    (run / "config.toml").write_text('[data]\ndataset = "data"\n')  # as the run read it from tmp_path
    monkeypatch.chdir(tmp_path)
    assert main(["data", "audit", str(run), "--report", "summary"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"({run}'s: none that is the build it read)" in err, err
    assert (
        f"source 'data': data (from this working directory: {data}; if the run started in another, run the "
        "command there) is not the dataset " in err
    ), err
    assert "; it was rebuilt or replaced, so its tables" in err, err
    # a source without its fingerprint: a KeyError traceback from each audit of the run (review RV32d 5)
    plan = json.loads((run / "data_plan.json").read_text())
    del plan["sources"][0]["fingerprint"]
    (run / "data_plan.json").write_text(json.dumps(plan))
    damaged = f"{run / 'data_plan.json'} is damaged (sources[0] has no string 'fingerprint'); no checkpoint"
    assert main(["data", "audit", str(run), "--report", "summary"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"({run}'s: data)" in err and f"; {damaged}" in err and "\n" not in err, err
    assert main(["data", "audit", str(run), "data", "--sql", "SELECT count(*) FROM sources"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[-1] == "1" and err.startswith(f"note: {damaged}") and err.count("\n") == 1, err


def run_of_no_step(tmp_path: Path) -> Path:
    """A training run directory as the trainer leaves it at its start: config.toml naming the dataset
    tmp_path/data, its plan and its ledger at step 0."""
    source = Source("data", str(tmp_path / "data"), "f" * 64, 600, 12, None)
    plan = Plan([source], [Phase("main", 4, 16, 2, (1,))], seed=1)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f"[data]\ndataset = {json.dumps(str(tmp_path / 'data'))}\n")
    record_plan(plan, run)
    write_consumption(plan, 0, plan.consumed(0), run / "consumption.parquet")
    return run


def test_a_started_run_without_its_plan_or_its_ledger_is_refused_not_read_as_empty(tmp_path, capsys):
    """A run's consumption.parquet deleted read as a run that trained nothing ("(no rows)", exit 0), and
    its data_plan.json deleted gave empty `sources` and `skips`, which `data inspect RUN` refuses (trial
    RV69a 2, 3). The trainer writes both at its start, before metrics.jsonl: a run without it has none."""
    run = run_of_no_step(tmp_path)
    write_eval_table(run)  # no scores: a run directory without the ledger still (the trial's had one)
    query = ["data", "audit", str(run), "--sql", "SELECT count(*) FROM sources, consumption"]
    (run / "data_plan.json").rename(tmp_path / "plan")
    assert main(query) == 0  # not started (a folder `gristmill eval` scored): nothing to miss
    (tmp_path / "plan").rename(run / "data_plan.json")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n")
    assert main(query) == 0
    capsys.readouterr()
    fix = "no checkpoint of the run holds its plan to write it from (a run started again trains from step 0)"
    for name, why in (
        ("consumption.parquet", f"not found (deleted: the trainer writes it when the run starts, before "
         f"{run / 'metrics.jsonl'}); {fix}"),
        ("data_plan.json", plan_not_found(run).removeprefix(str(run / "data_plan.json") + " ")),
    ):  # fmt: skip
        (run / name).rename(tmp_path / name)
        assert main(query) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"error: cannot audit {run}: {run / name} {why}\n", err
        (tmp_path / name).rename(run / name)
    # a query of the run's eval alone reads neither: an older gristmill's run has none (review RV69d 1)
    for name in ("consumption.parquet", "data_plan.json"):
        (run / name).unlink()
    assert main(["data", "audit", str(run), "--sql", "SELECT count(*) AS n FROM eval"]) == 0
    assert main(["data", "audit", str(run), "--report", "consumption"]) == 2


def test_a_dataset_view_queried_of_runs_alone_is_refused_naming_their_datasets(tmp_path, capsys, monkeypatch):
    """`--sql` of `docs` over a run directory answered 0, exit 0, where `--report summary` is refused
    naming the datasets to pass (trial RV69a 4), said not found where none is there (a relative one from
    another working directory led nowhere, unsaid: trial RV74a 6); a query of the run's own views answers."""
    run = run_of_no_step(tmp_path)
    for sql in ("SELECT count(*) FROM docs", "SELECT 1 FROM consumption WHERE EXISTS (FROM main.Shards)"):
        assert main(["data", "audit", str(run), "--sql", sql]) == 2
        out, err = capsys.readouterr()
        view = sql.split()[-1].strip(")").split(".")[-1].lower()
        assert out == "" and err == (
            f"error: --sql's view {view} reads a dataset's files, and {run} holds no dataset.json: pass a "
            f"dataset directory ({run}'s: {tmp_path / 'data'}, not found), or query a training run's views "
            "alone (eval, consumption, skips, sources)\n"
        ), err
    (run / "config.toml").write_text('[data]\ndataset = "data"\n')
    monkeypatch.chdir(run)
    assert main(["data", "audit", str(run), "--report", "summary"]) == 2
    assert f"({run}'s: data, not found from the working directory {run})" in capsys.readouterr().err
    # the run's own views, and a CTE of a dataset view's name, answer
    sql = "WITH docs AS (SELECT 1) SELECT count(*) AS n FROM docs, consumption"
    assert main(["data", "audit", str(run), "--sql", sql, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 1}]


def test_missing_excluded_logs_and_empty_task_do_not_break_views(tmp_path):
    root = small_dataset(tmp_path / "small")
    assert pq.read_metadata(root / "manifest" / "00001.parquet").num_rows == 0  # the empty task
    con, _ = connect([root])
    for name in FILE_VIEWS:
        con.execute(f"SELECT * FROM {name}").fetchall()
    rows = {r["item"]: r for r in run_preset(con, "summary").records()}
    assert rows["kept (manifest)"]["documents"] == 12 and rows["kept (manifest)"]["tokens"] == 12 * 51
    assert "read" not in rows  # no datatrove stats: nothing claimed
    assert run_preset(con, "validation").records()[0]["status"] == "not validated"
    # a zero-row excluded file (an empty task's) reads as no rows
    (root / "excluded").mkdir()
    empty = root / "excluded" / "00001_text.parquet"
    pq.write_table(EXCLUDED_SCHEMA.empty_table(), empty)
    info = json.loads((root / "dataset.json").read_text())  # as the build records it
    info.setdefault("files", {})[f"excluded/{empty.name}"] = {
        "bytes": empty.stat().st_size,
        "sha256": hashlib.sha256(empty.read_bytes()).hexdigest(),
    }
    (root / "dataset.json").write_text(json.dumps(info))
    con, _ = connect([root])
    assert con.execute("SELECT count(*) FROM excluded").fetchone() == (0,)


def test_duplicates_report(tmp_path):
    con, _ = connect([small_dataset(tmp_path / "small")])
    got = [(r["field"], r["value"], r["copies"], r["keys"]) for r in run_preset(con, "duplicates").records()]
    assert got == [
        ("id", "s0", 2, ["t0d0", "t0d10"]),
        ("id", "s1", 2, ["t0d1", "t0d11"]),
        ("url", "https://www.other.net/0", 2, ["t0d0", "t0d10"]),
    ]
    domains = run_preset(con, "top_domains").records()
    assert [(r["domain"], r["documents"]) for r in domains] == [("other.net", 12)]


def test_top_domains_is_the_urls_hostname(tmp_path):
    """urllib's hostname, "www." dropped: a query, fragment, user:password, port or IPv6 host after the
    '//' was cut at the third '/' and became its own domain (review R31b F7); leading spaces and
    controls, and tab, CR and LF anywhere, are skipped as urllib skips them (review RV32d 7)."""
    urls = [
        "https://WWW.Example.com:8080/a", "http://example.com/b", "https://user:pw@example.com/c",
        "example.com/d", "https://example.com?q=1", "https://example.com#frag", "HTTPS://EXAMPLE.COM/e",
        "https://[::1]:8080/x", "//example.com/f", "https://a@b@example.com:1/g",
        "mailto:someone@example.com", "https://[FE80::1]?x",
        " https://example.com/h", "\nhttps://example.com/i", "https:\t//exa\tmple.com\r/j\n",  # RV32d 7
    ]  # fmt: skip
    w = ShardWriter(tmp_path / "urls", 0, vocab_size=1000, target_bytes=4096)
    for i, url in enumerate(urls):
        w.add(f"d{i}", np.array([i + 1, 0], np.uint16), {"id": f"s{i}", "url": url})
    w.close()
    sep = {"token": "<|endoftext|>", "id": 0, "position": "after"}
    finalize_dataset(tmp_path / "urls", vocab_size=1000, separator=sep, config_sha256="urls")
    con, _ = connect([tmp_path / "urls"])
    got = {r["domain"]: r["documents"] for r in run_preset(con, "top_domains").records()}
    hosts = [urllib.parse.urlsplit(u).hostname for u in urls]
    assert got == dict(Counter(h and h.removeprefix("www.") for h in hosts)), got
    assert got == {"example.com": 11, "::1": 1, "fe80::1": 1, None: 2}
    # the share rounded once, by the preset: rounded to 3 decimals first, then to 2 by the table, a share
    # of 7.8355 % showed as 7.83 (trial RV57b F2); the table rounds none (trial RV69a 5)
    shares = {r["domain"]: r["pct_of_tokens"] for r in run_preset(con, "top_domains").records()}
    assert shares["example.com"] == round(100 * 22 / 30, 2) == 73.33, shares


def test_two_datasets_compare(built_dataset, tmp_path, capsys):
    small = small_dataset(tmp_path / "small")
    assert (
        main(["data", "audit", str(built_dataset), str(small), "--report", "summary", "--format", "json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    kept = {r["dataset_name"]: r["documents"] for r in rows if r["item"] == "kept (manifest)"}
    info = json.loads((built_dataset / "dataset.json").read_text())
    assert kept == {built_dataset.name: info["documents"], "small": 12}
    con, names = connect([built_dataset, small])
    got = dict(con.execute("SELECT dataset_name, count(*) FROM docs GROUP BY 1").fetchall())
    assert got == kept and names == [built_dataset.name, "small"]
    for view in ("docs", "excluded", "stats", "dataset", "shards", "validation"):
        cols = [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]
        assert cols[0] == "dataset_name", view
    assert all(p.stat().st_size > 1000 for p in write_plots(con, tmp_path / "plots"))


def test_dataset_names_are_disambiguated(tmp_path):
    a, b = tmp_path / "a" / "demo", tmp_path / "b" / "demo"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    assert dataset_names([a, b]) == ["a/demo", "b/demo"]
    assert dataset_names([a, a]) == ["demo#0", "demo#1"]


def test_one_dataset_named_twice_is_refused(built_dataset, tmp_path, capsys):
    # by another spelling or a link: demo#0 and demo#1, every summed count doubled (trial RV71c 8)
    (tmp_path / "link").symlink_to(built_dataset)
    for again in (f"{built_dataset}/", str(tmp_path / "link")):
        assert main(["data", "audit", str(built_dataset), again, "--report", "summary"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: {built_dataset} and {again} are one dataset or run: name it once"
        )
    assert main(["data", "audit", "s3://b/x", "s3://b/x/", "--report", "summary"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: s3://b/x and s3://b/x/ are one dataset or run: name it once"
    )


def test_db_file_persists_views(built_dataset, tmp_path, capsys):
    db = tmp_path / "audit.duckdb"
    assert main(["data", "audit", str(built_dataset), "--db", str(db), "--report", "validation"]) == 0
    capsys.readouterr()
    con = duckdb.connect(str(db), read_only=True)
    assert (
        con.execute("SELECT count(*) FROM docs").fetchone()[0]
        == json.loads((built_dataset / "dataset.json").read_text())["documents"]
    )
    assert {"docs", "excluded", "stats", "dataset", "shards", "validation"} <= {
        r[0] for r in con.execute("SHOW TABLES").fetchall()
    }


def test_a_db_refuses_once_its_dataset_changed(built_dataset, tmp_path, capsys):
    """A --db's views list a dataset's files as they were when it was written but read them as they are:
    a rebuild under the same path answered a mix of both builds, and `validation` kept the files_changed
    of its writing (ok, 0 with a shard changed since), exit 0 (trial RV71c 1, 2). Its views now refuse in
    one line, naming a file and the command that writes the --db again (for a shard, `validation` alone)."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    db = tmp_path / "audit.duckdb"
    assert main(["data", "audit", str(root), "--db", str(db), "--report", "validation"]) == 0
    capsys.readouterr()
    views = ("docs", "excluded", "stats", "shards", "validation", "dataset")
    queries = [f"SELECT count(*) FROM {v}" for v in views]

    def answers() -> list:
        with duckdb.connect(str(db), read_only=True) as con:
            return [con.execute(q).fetchone()[0] for q in queries]

    def refused(what: str, asked: list[str] = queries) -> None:
        said = f"{root} changed since this --db was written ({what}): write it again with "
        said += f"`gristmill data audit {root} --db {db}`"
        with duckdb.connect(str(db), read_only=True) as con:
            for q in asked:
                with pytest.raises(duckdb.InvalidInputException) as e:
                    con.execute(q)
                assert str(e.value) == f"Invalid Input Error: {said}", q

    unchanged = answers()
    assert unchanged[0] == json.loads((root / "dataset.json").read_text())["documents"] > 0
    assert unchanged[4:] == [1, 1]
    # duckdb prunes a part by its files' parquet statistics, or with no files, as it plans: the rows'
    # guard then never ran, and a filter on a value only an added file holds answered 0 (trial RV71f 1)
    filtered = [
        "SELECT count(*) FROM docs WHERE id = 's_new'",
        "SELECT count(*) FROM docs d JOIN shards s USING (dataset_name, shard) WHERE d.id = 's_new'",
        "SELECT max(n_tokens) FROM docs WHERE n_tokens > 1e9",
        "SELECT count(*) FROM shards WHERE documents > 1e9",
        "SELECT count(*) FROM excluded WHERE id = 's_new'",
        "SELECT count(*) FROM validation WHERE NOT ok",
        "SELECT count(*) FROM docs WHERE dataset_name = 'ds'",
    ]
    manifest = root / "manifest" / "00000.parquet"
    added = pq.read_table(manifest)
    added = added.set_column(added.schema.get_field_index("id"), "id", pa.array(["s_new"] * len(added)))
    pq.write_table(added, root / "manifest" / "00002.parquet")  # a third task's, as a rebuild adds
    refused("manifest/00002.parquet added", queries + filtered)
    (root / "manifest" / "00002.parquet").unlink()
    assert answers() == unchanged  # the files as written: answered as before
    with duckdb.connect(str(db), read_only=True) as con:
        assert [con.execute(q).fetchone()[0] for q in filtered] == [0, 0, None, 0, 0, 0, unchanged[0]]
    # duckdb's "No files found"; and with none of a view's files left, its SQL did not bind
    manifest.parent.rename(tmp_path / "away")
    (root / "validation.json").rename(tmp_path / "validation.json")
    # the fixture's two tasks' and validation.json
    refused("manifest/00000.parquet removed, and 2 more", queries + filtered)
    (tmp_path / "away").rename(manifest.parent)
    (tmp_path / "validation.json").rename(root / "validation.json")
    assert answers() == unchanged
    shard = sorted((root / "shards").iterdir())[-1]
    with shard.open("ab") as f:
        f.write(b"x")
    # validation said ok, files_changed 0; the views that read no shard answer as they did
    refused(f"shards/{shard.name} changed", [queries[4], "SELECT ok, files_changed FROM validation"])
    with duckdb.connect(str(db), read_only=True) as con:
        assert [con.execute(q).fetchone()[0] for q in queries[:4]] == unchanged[:4]


def test_a_db_refuses_once_files_appear_where_it_had_none(tmp_path):
    """A view of a dataset without files when its --db was written (no excluded/, no logs/, no
    validation.json) read a static empty relation, which duckdb pruned with its guard: it answered 0 once
    they appeared, and so did a filtered query (trial RV71f 1c)."""
    root = small_dataset(tmp_path / "ds")
    db = tmp_path / "audit.duckdb"
    persist([root], db)
    asked = [
        "SELECT count(*) FROM excluded",
        "SELECT count(*) FROM excluded WHERE reason = 'r'",
        "SELECT count(*) FROM stats",
        "SELECT count(*) FROM validation_problems",
    ]
    with duckdb.connect(str(db), read_only=True) as con:
        before = [con.execute(q).fetchone()[0] for q in asked]
    assert before == [0, 0, 0, 0]
    (root / "excluded").mkdir()
    pq.write_table(pa.table({"id": ["x"], "reason": ["r"]}), root / "excluded" / "00000.parquet")
    (root / "logs" / "stats").mkdir(parents=True)
    (root / "logs" / "stats" / "00000.json").write_text("[]")
    (root / "validation.json").write_text(
        json.dumps({"ok": False, "problems": [{"shard": "a", "message": "m"}]})
    )
    with duckdb.connect(str(db), read_only=True) as con:
        for q in asked:
            with pytest.raises(
                duckdb.InvalidInputException, match=re.escape("excluded/00000.parquet added, and 2 more")
            ):
                con.execute(q)
    shutil.rmtree(root / "excluded")
    shutil.rmtree(root / "logs")
    (root / "validation.json").unlink()
    with duckdb.connect(str(db), read_only=True) as con:
        assert [con.execute(q).fetchone()[0] for q in asked] == before


def test_db_inside_a_dataset_is_refused_before_it_is_written(built_dataset, tmp_path, capsys):
    """--db in the audited dataset's manifest/ (or any folder of a dataset) wrote a file the dataset does
    not record: every later audit refused it and `data validate` failed it for good (trial RV62b 7)."""
    link = tmp_path / "manifest-link"  # through a link into it too (trial RV62f 2)
    link.symlink_to(built_dataset / "manifest")
    for db in (
        built_dataset / "manifest" / "zz.parquet",
        built_dataset / "audit.duckdb",
        link / "zz.parquet",
    ):
        capsys.readouterr()
        assert main(["data", "audit", str(built_dataset), "--db", str(db), "--report", "validation"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"error: --db {db} lies inside {built_dataset.resolve()}, which holds dataset.json: a dataset, "
            "which does not record it: name a file outside it"
        ), err
        assert not db.exists()


def test_db_naming_a_data_file_or_a_foreign_table_is_one_line(built_dataset, tmp_path, capsys):
    """--db naming an existing .parquet, .csv or .json: duckdb opened it as a data source, the views
    went into memory and the audit said "wrote", exit 0 (review R18a F2); a duckdb file holding a
    table named like a view was duckdb's catalog error. Each is one line; the file is unchanged."""
    sources = {
        "t.parquet": (built_dataset / "manifest" / "00000.parquet").read_bytes(),
        "t.csv": b"a,b\n1,2\n",
        "t.json": b'{"a": 1}\n',
    }
    for name, data in sources.items():
        db = tmp_path / name
        db.write_bytes(data)
        capsys.readouterr()
        assert main(["data", "audit", str(built_dataset), "--db", str(db), "--report", "validation"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        said = f"error: --db {db} is an existing file that is not a duckdb database; the views would not "
        assert lines == [said + "be written into it: name a new file (e.g. audit.duckdb)"], lines
        assert db.read_bytes() == data
    db = tmp_path / "own.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE docs AS SELECT 1 AS x")
    con.close()
    capsys.readouterr()
    assert main(["data", "audit", str(built_dataset), "--db", str(db), "--report", "validation"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write the views into --db {db}: "), lines
    assert lines[0].endswith("name a new file, or a database only the audit wrote"), lines
    (tmp_path / "d").mkdir()  # duckdb opened d\x.duckdb as d/x.duckdb, exit 0 (review RV32g A)
    db = tmp_path / "d\\x.duckdb"
    assert main(["data", "audit", str(built_dataset), "--db", str(db), "--report", "validation"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    said = [
        f"error: --db {db}: duckdb reads a '\\' in a database path as a '/', so it would write "
        f"{tmp_path / 'd' / 'x.duckdb'} instead; name the file without '\\'"
    ]
    assert lines == said, lines
    assert not db.exists() and not (tmp_path / "d" / "x.duckdb").exists()
    # asked before any file is hashed (minutes at FineWeb-Edu scale): a changed manifest is not what
    # it says first (review RV42c F3)
    changed = tmp_path / "changed"
    shutil.copytree(built_dataset, changed)
    manifest = sorted((changed / "manifest").glob("*.parquet"))[0]
    data = bytearray(manifest.read_bytes())
    data[len(data) // 2] ^= 1
    manifest.write_bytes(data)
    assert main(["data", "audit", str(changed), "--db", str(db), "--report", "validation"]) == 2
    assert [line for line in capsys.readouterr().err.splitlines() if line.strip()] == said


def test_a_run_report_asked_of_a_dataset_is_one_line(built_dataset, capsys, tmp_path, monkeypatch):
    """`--report consumption` of a dataset printed "(no rows)", exit 0, and `--report all` an empty
    consumption table (review R18a F5), while a dataset report asked of a run is refused."""
    capsys.readouterr()
    assert main(["data", "audit", str(built_dataset), "--report", "consumption"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        f"error: --report consumption reads a training run's files, and {built_dataset} holds no run: pass a "
        "training run directory (its run.output_dir) beside or instead of the dataset"
    ], lines
    # a --sql of a run's view the same: it answered 0, exit 0 (trial RV69e 4)
    for view in ("consumption", "skips"):
        assert main(["data", "audit", str(built_dataset), "--sql", f"SELECT count(*) FROM {view}"]) == 2
        assert capsys.readouterr().err.startswith(f"error: --sql's view {view} reads a training run's files")
    assert main(["data", "audit", str(built_dataset), "--report", "all"]) == 0
    out = capsys.readouterr().out
    assert "== summary ==" in out and "== consumption" not in out, out
    # a mistyped path was told to pass dataset directories, though runs are audited too (R18a F6)
    assert main(["data", "audit", str(built_dataset) + "-typo"]) == 2
    assert capsys.readouterr().err.strip().endswith("or training run directories (run.output_dir)")
    assert main(["data", "audit", str(built_dataset), "--max-rows", "-2"]) == 2  # sliced rows off, exit 0
    said = "error: --max-rows -2: give the rows a table shows, ≥ 1 (0: all)"
    assert capsys.readouterr().err.strip() == said
    for flag in ("--db", "--plots"):  # "" wrote nothing, exit 0 (review R22a A7)
        assert main(["data", "audit", str(built_dataset), flag, ""]) == 2
        assert capsys.readouterr().err.strip() == f'error: {flag} "": name a path, or leave the option out'
    # `--plots=~/plots` (no shell expands it there) said "wrote 5 plots to ~/plots" and wrote them into
    # ./~/plots (trial RV73a 2)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert main(["data", "audit", str(built_dataset), "--plots=~/plots"]) == 0
    assert f"wrote 5 plots to {home / 'plots'}: " in capsys.readouterr().err
    assert list((home / "plots").glob("*.png")) and list(work.iterdir()) == []


def test_validation_status_stale_and_failed(built_dataset, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    v = json.loads((root / "validation.json").read_text())
    (root / "validation.json").write_text(json.dumps({**v, "fingerprint": "0" * 64}))
    con, _ = connect([root])
    assert (
        run_preset(con, "validation").records()[0]["status"]
        == "stale (dataset rebuilt since): validate again"
    )
    (root / "validation.json").write_text(json.dumps({**v, "ok": False, "n_problems": 3}))
    con, _ = connect([root])
    assert run_preset(con, "validation").records()[0]["status"] == "FAILED"
    # "yes" was cast to a pass, [1] read as stale; readers refuse the record (reviews R22a A2, R22d M5)
    for record in ({**v, "ok": "yes", "n_problems": 3}, {**v, "ok": None}, [1], "x"):
        (root / "validation.json").write_text(json.dumps(record))
        con, _ = connect([root])
        assert (
            run_preset(con, "validation").records()[0]["status"]
            == "record damaged (no verdict): validate again"
        )


@pytest.mark.parametrize("changed", ["shards", "tokenizer.json", "index"])  # a manifest: its view refuses it
def test_a_file_changed_after_its_validation_is_stale_not_ok(built_dataset, tmp_path, changed):
    """A shard replaced or damaged after `data validate` said ok: the audit went on saying "ok" of
    bytes no validation had checked (review RV49a 2), and so it did of a damaged tokenizer.json or
    index file (trial RV60a 8); the files' versions the record holds (sizes and mtimes here, a
    bucket's ETags in test_object_storage) tell it."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    con, _ = connect([root])
    assert run_preset(con, "validation").records()[0]["status"] == "ok"
    shard = root / changed if (root / changed).is_file() else sorted((root / changed).iterdir())[0]
    data = bytearray(shard.read_bytes())
    data[700 if changed == "shards" else len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    con, _ = connect([root])
    assert (
        run_preset(con, "validation").records()[0]["status"] == "stale (files changed since): validate again"
    )
    assert main(["data", "validate", str(root)]) == 1
    con, _ = connect([root])
    assert run_preset(con, "validation").records()[0]["status"] == "FAILED"


def test_print_summary(built_dataset, capsys):
    print_summary([built_dataset])
    out = capsys.readouterr().out
    assert out.startswith("== summary ==") and "shard_balance" in out


@pytest.mark.parametrize(
    "damage",
    ["manifest/00001.parquet", "dataset.json", "logs/stats/00001.json", "validation.json"],
)
def test_damaged_dataset_is_one_error_naming_the_file(built_dataset, tmp_path, capsys, damage):
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    target = root / damage
    target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])  # truncated
    capsys.readouterr()
    assert main(["data", "audit", str(root)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines  # no traceback
    # (a table of the views at another size than recorded: refused before it is read, R14c F4)
    said = "bytes, but" if damage.startswith(("manifest/", "logs/stats/")) else "is unreadable"
    assert f"{target} is " in lines[0] and said in lines[0], lines[0]
    fix = {  # advice that works for that file (test_audit_builds.py follows the stats one)
        "manifest/00001.parquet": f"names the task to rebuild (`gristmill data validate {root}` lists",
        "dataset.json": f"check the dataset with `gristmill data validate {root}`",
        "logs/stats/00001.json": f"delete {root / 'logs/completions/00001'} and {root / 'dataset.json'}",
        "validation.json": f"rerun `gristmill data validate {root}`, which writes it again",
    }[damage]
    assert fix in lines[0], lines[0]
    if damage == "dataset.json":  # every report, not only those that read it: the checks of the tables
        # against it were skipped, and --sql answered from an edited manifest, exit 0 (trial RV67a F7)
        assert main(["data", "audit", str(root), "--sql", "SELECT sum(n_tokens) FROM docs"]) == 2
        assert f"{target} is unreadable" in capsys.readouterr().err


def test_a_damaged_manifest_page_is_named_with_its_task_s_fix(built_dataset, tmp_path, capsys):
    """A byte flipped in a page of a manifest (its size and footer intact): the audit ended in duckdb's
    "Snappy decompression failure" / "Out of buffer" with no fix, and `data validate` blamed the
    intact shards of its task, dozens of lines, the manifest's last (review R31b F3, F4). Both name the
    manifest first, as not of the sha256 dataset.json records, with the command that redoes its task."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    target = root / "manifest" / "00001.parquet"
    meta = pq.read_metadata(target)
    at = meta.row_group(0).column(meta.schema.names.index("n_tokens")).data_page_offset + 3
    data = bytearray(target.read_bytes())
    data[at] ^= 0x10  # in the page's compressed body: snappy fails on it
    target.write_bytes(bytes(data))
    fix = f"delete {root / 'logs/completions/00001'} and {root / 'dataset.json'}, then rerun the same"
    capsys.readouterr()
    assert main(["data", "audit", str(root)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot audit {root}: {target} is damaged: "), (
        lines
    )
    assert fix in lines[0], lines[0]
    assert main(["data", "validate", str(root)]) == 1
    listed = capsys.readouterr().out.split("problems:\n", 1)[1].splitlines()
    assert listed[0].startswith("  manifest/00001.parquet: ") and redo_task("00001") in listed[0], listed
    assert "hash to dataset.json's record: the problems listed for them" in listed[0], listed


def test_a_build_stats_file_missing_or_stray_is_refused_not_counted(built_dataset, tmp_path, capsys):
    """A build pass's stats file deleted, or a copy of one under another task's name: the summary
    counted 729 read of 973 (or 1,214) with the validation preset still ok, exit 0 (review R18a F1).
    dataset.json records them: one missing or stray is one line naming it and what to do."""
    stats = sorted((built_dataset / "logs" / "stats").glob("*.json"))
    for case in ("missing", "stray"):
        root = tmp_path / case
        shutil.copytree(built_dataset, root)
        first = root / "logs" / "stats" / stats[0].name
        if case == "missing":
            first.unlink()
            target, said = first, f"is missing, but {root / 'dataset.json'} records it: "
            fix = f"delete {root / 'logs' / 'completions' / first.stem} and {root / 'dataset.json'}"
        else:
            target = first.with_name(f"{len(stats) + 7:05d}.json")
            shutil.copy(first, target)
            said, fix = "is not one of the files", "no task of this build wrote it: delete it"
        capsys.readouterr()
        assert main(["data", "audit", str(root), "--report", "summary"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {target} {said}"), lines
        assert fix in lines[0], lines[0]


def test_an_edited_table_is_refused_not_counted(built_dataset, tmp_path, capsys):
    """A manifest row's n_tokens raised, an excluded file's rows cut (each still valid parquet): the
    audit answered from them, exit 0 (review R14c F4). A table at another size than dataset.json
    records is refused, naming it (a same-size edit is validate's to find: it hashes every file)."""
    for rel, edit in (
        ("manifest/00001.parquet", lambda t: t.set_column(
            t.schema.get_field_index("n_tokens"), "n_tokens",
            pa.array([t["n_tokens"][0].as_py() + 1000, *t["n_tokens"].to_pylist()[1:]], pa.int64()))),
        (min(f"excluded/{p.name}" for p in (built_dataset / "excluded").glob("*.parquet")),
         lambda t: t.slice(0, max(0, t.num_rows - 5))),
    ):  # fmt: skip
        root = tmp_path / rel.replace("/", "-")
        shutil.copytree(built_dataset, root)
        pq.write_table(edit(pq.read_table(root / rel)), root / rel)
        capsys.readouterr()
        assert main(["data", "audit", str(root), "--sql", "SELECT count(*) FROM docs"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {root / rel} is ") and "it changed after the build" in err, err


def test_a_value_flipped_in_a_manifest_page_is_refused_not_counted(built_dataset, tmp_path, capsys):
    """A bit flipped in a manifest's language_score where the page still decodes (its size kept): the
    audit answered other values, exit 0 (validate alone hashed the file), where the same dataset
    audited from a bucket was refused (its copy is hashed at each audit). Now every file the views
    read is hashed against dataset.json first: one line naming the file and its task's fix, under
    the default tables, --sql and --db alike; also in a cache's copy audited by its path, which only an
    audit of its URL hashed (review RV41b F6)."""
    from tests.helpers.parquet_damage import flip_a_value_bit
    from training.data.remote import mark_origin

    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    target = root / "manifest" / "00001.parquet"
    was, now = flip_a_value_bit(target, "language_score")  # a dictionary page's: every row of that value
    assert was != now and pq.read_table(target)["language_score"].to_pylist()[0] == now  # still decodes
    fix = f"delete {root / 'logs/completions/00001'} and {root / 'dataset.json'}, then rerun the same"
    mark_origin(root, "s3://bucket/ds")  # a cache's copy audited by its path: no bucket_copy hashed it
    for args in ([], ["--sql", "SELECT sum(language_score) FROM docs"], ["--db", str(tmp_path / "a.duckdb")]):
        capsys.readouterr()
        assert main(["data", "audit", str(root), *args]) == 2, args
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1, (args, lines)
        assert lines[0].startswith(f"error: cannot audit {root}: {target} is damaged: the sha256 "), lines
        assert fix in lines[0], lines[0]


def test_a_stats_file_edited_at_its_size_is_refused_with_a_fix_that_holds(built_dataset, tmp_path, capsys):
    """One digit of a stats file changed, its size kept: the build pass's was refused saying the other
    reports work without it, which the refusal of every audit made false (review RV41b F2); a dedup
    stage's, which the `stats` view reads too (logs/**/stats/), was never checked: `--sql` over it
    answered the edited count, exit 0 (RV41b F1)."""
    from training.contract.dataset_format import record_files

    build_pass = sorted((built_dataset / "logs" / "stats").glob("*.json"))[0]
    for where in ("logs/stats", "logs/dedup/exact/stats"):
        root = tmp_path / where.replace("/", "-")
        shutil.copytree(built_dataset, root)
        target = root / where / build_pass.name
        if where != "logs/stats":  # a dedup stage's, recorded as a build records them
            target.parent.mkdir(parents=True)
            shutil.copy(build_pass, target)
            info = json.loads((root / "dataset.json").read_text())
            info["files"] = record_files(root)
            info["fingerprint"] = fingerprint(info)
            (root / "dataset.json").write_text(json.dumps(info))
        assert main(["data", "audit", str(root), "--sql", "SELECT count(*) FROM stats"]) == 0
        text = target.read_text()
        digit = next(i for i, c in enumerate(text) if c.isdigit() and c != "9")
        target.write_text(text[:digit] + str(int(text[digit]) + 1) + text[digit + 1 :])  # the same size
        capsys.readouterr()
        assert main(["data", "audit", str(root), "--sql", "SELECT count(*) FROM stats"]) == 2, where
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"{target} is damaged: the sha256 " in lines[0], lines
        assert "work without it" not in lines[0], lines[0]


def test_the_stats_and_excluded_views_read_the_recorded_files_as_they_list_them(
    built_dataset, tmp_path, capsys
):
    """The check of the recorded files listed them with pathlib and only logs/stats/ of the stats; the
    views list them with glob, which follows a linked directory: a dedup stage's stats file copied
    beside it, a build pass's copied under logs/other/stats/, and a directory linked to its own parent
    under logs/ or excluded/ doubled the `stats` and `excluded` answers, exit 0; a recorded dedup
    stats file deleted (the advice for a damaged one) answered its stage's rows as none, silently
    (review RV42c F1). Every file a view would read must be a recorded one; a recorded dedup stats file
    that is gone is a note; a dot file beside the manifest, which no view reads, is no refusal."""
    from training.contract.dataset_format import record_files

    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    build_pass = sorted((root / "logs" / "stats").glob("*.json"))[0]
    dedup = root / "logs/dedup/exact/stats" / build_pass.name
    dedup.parent.mkdir(parents=True)
    shutil.copy(build_pass, dedup)
    info = json.loads((root / "dataset.json").read_text())
    info["files"] = record_files(root)  # a dedup stage's stats, recorded as a build records them
    info["fingerprint"] = fingerprint(info)
    (root / "dataset.json").write_text(json.dumps(info))
    ask = "SELECT (SELECT count(*) FROM stats) AS s, (SELECT count(*) FROM excluded) AS e"

    def answer() -> tuple[int, list, list[str]]:
        capsys.readouterr()
        rc = main(["data", "audit", str(root), "--sql", ask, "--format", "json"])
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else out), [x for x in err.splitlines() if x.strip()]

    rc, want, err = answer()
    assert rc == 0 and not err and want[0]["s"] > 0 and want[0]["e"] > 0, (want, err)
    excluded = min((p.parent for p in (root / "excluded").rglob("*.parquet")), key=lambda p: len(p.parts))
    for stray, undo in (
        (dedup.parent / "00099.json", None),
        (root / "logs/other/stats" / build_pass.name, None),
        (root / "logs/again", "."),
        (excluded / "again", "."),
    ):
        if undo is None:
            stray.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(build_pass, stray)
        else:
            stray.symlink_to(undo)
        rc, _, err = answer()
        assert rc == 2 and len(err) == 1, (stray, err)
        assert f"is not one of the files {root / 'dataset.json'} records: " in err[0], err
        assert "delete it" in err[0] or "rerun the command that built it" in err[0], err
        stray.unlink()
        assert answer()[:2] == (0, want), stray
    manifest = sorted((root / "manifest").glob("*.parquet"))[0]  # a link to nothing in its place: one line
    kept = manifest.rename(tmp_path / "kept.parquet")
    manifest.symlink_to(tmp_path / "nowhere.parquet")
    rc, _, err = answer()
    assert rc == 2 and len(err) == 1 and f"{manifest} is unreadable (FileNotFoundError" in err[0], err
    manifest.unlink()
    kept.rename(manifest)
    (root / "manifest" / "._00000.parquet").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)  # a macOS copy's
    assert answer() == (0, want, [])
    dedup.unlink()
    rc, got, err = answer()
    assert (
        rc == 0
        and got[0]["s"] < want[0]["s"]
        and err
        == [
            f"note: {dedup} is missing, though dataset.json records it: the `stats` view has no rows of that "
            "task of its stage (datatrove's stats of a stage before the build's pass, which no report needs)"
        ]
    ), (got, err)


def test_unwritable_db_or_plots_is_one_error_about_that_path(built_dataset, tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    for flag, target, expect in (
        ("--db", tmp_path / "missing-dir" / "a.duckdb", "cannot write --db"),
        ("--plots", tmp_path / "a-file" / "plots", "--plots"),  # said before any work (trial RV74c 7)
    ):
        capsys.readouterr()
        assert main(["data", "audit", str(built_dataset), "--report", "validation", flag, str(target)]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {expect} {target}"), lines
        assert "validate" not in lines[0]  # not blamed on the dataset


def test_duckdb_temp_directory_is_not_readable_from_any_cwd(built_dataset, tmp_path, monkeypatch, capsys):
    # duckdb adds its spill directory (./.tmp by default) to allowed_directories.
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "s.txt").write_text("secret")
    monkeypatch.chdir(tmp_path)
    con, _ = connect([built_dataset])
    allowed = con.execute("SELECT current_setting('allowed_directories')").fetchone()[0]
    assert allowed == [f"{built_dataset}/"]
    con.close()
    for sql in ("SELECT content FROM read_text('.tmp/s.txt')", f"SELECT * FROM glob('{tmp_path}/.tmp/*')"):
        assert main(["data", "audit", str(built_dataset), "--sql", sql]) == 2
        assert "refused: the audit reads only inside" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "sibling"), [("exp[1]", "exp1"), ("a*b", "a-b"), ("run?", "runX")])
def test_directory_names_with_glob_characters(built_dataset, tmp_path, name, sibling, capsys):
    # beside a directory its name matches as a pattern: duckdb read the sibling's files (review R31b F5);
    # with a '\' too, which duckdb's glob reads as '/', no pattern reads it (review RV32d 1)
    root = tmp_path / name
    shutil.copytree(built_dataset, root, ignore=shutil.ignore_patterns("shards"))
    other = small_dataset(tmp_path / sibling)  # 12 documents
    info = json.loads((root / "dataset.json").read_text())
    assert summary_rows(root)["kept (manifest)"]["documents"] == info["documents"] > 12
    con, _ = connect([root, other])
    fingerprints = [
        (name, info["fingerprint"]),
        (sibling, json.loads((other / "dataset.json").read_text())["fingerprint"]),
    ]
    assert con.execute("SELECT dataset_name, fingerprint FROM dataset ORDER BY 1").fetchall() == sorted(
        fingerprints
    )
    count = "SELECT dataset_name, count(*) FROM docs GROUP BY 1 ORDER BY 1"
    assert con.execute(count).fetchall() == sorted([(name, info["documents"]), (sibling, 12)])
    db = tmp_path / "audit.duckdb"  # the views a user opens with full access read the same files
    persist([root], db)
    assert duckdb.connect(str(db), read_only=True).execute(count).fetchall() == [(name, info["documents"])]
    (tmp_path / "d").mkdir()  # the escaped d\{name} is d/{name} to duckdb: root's documents, not its own
    root.rename(tmp_path / "d" / name)
    other = other.rename(tmp_path / f"d\\{name}")
    assert main(["data", "audit", str(other), "--sql", count]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot audit {other}: its path holds a '\\'") and "\n" not in err, err
    assert "rename or move the directory" in err
    other = other.rename(tmp_path / "d\\e")  # no glob character: not globbed, read as it is
    assert connect([other])[0].execute(count).fetchall() == [("d\\e", 12)]


def test_an_unfinished_build_s_views_read_its_finished_tasks_files_alone(built_dataset, tmp_path, capsys):
    """A build killed mid-way: its unfinished tasks' manifest, excluded and stats files were counted by
    `--sql`, whose note says its views hold what its finished tasks wrote (trial RV69a 1)."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root, ignore=shutil.ignore_patterns("shards", "index"))
    (root / "dataset.json").unlink()
    (root / "logs" / "completions" / "00000").unlink()  # task 0 unfinished, its files left
    stage = root / "logs" / "dedup" / "hashes"  # a dedup stage whose task 0 finished and task 1 did not
    (stage / "stats").mkdir(parents=True)
    for task in ("00000", "00001"):
        shutil.copy(root / "logs" / "stats" / "00001.json", stage / "stats" / f"{task}.json")
    (stage / "completions").mkdir()
    (stage / "completions" / "00000").touch()
    assert (root / "excluded" / "00000_length.parquet").is_file() and (root / "validation.json").is_file()
    con, _ = connect([root])
    views = ("docs", "excluded", "validation")
    counts = [con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in views]
    assert counts == [pq.read_metadata(root / "manifest" / "00001.parquet").num_rows, 0, 0]
    tasks = con.execute("SELECT DISTINCT pipeline, task FROM stats ORDER BY ALL").fetchall()
    assert tasks == [("", 1), ("dedup/hashes", 0)]
    assert main(["data", "audit", str(root), "--sql", "SELECT count(*) FROM docs"]) == 0
    assert "its views hold only what its finished tasks wrote" in capsys.readouterr().err
    # no task of the build's pass finished, its dedup stage's did: those stats answer (trial RV69e 5)
    shutil.rmtree(root / "manifest")
    (root / "logs" / "completions" / "00001").unlink()
    sql = "SELECT DISTINCT pipeline FROM stats"
    assert main(["data", "audit", str(root), "--sql", sql, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"pipeline": "dedup/hashes"}]


def test_dataset_json_listing_documents_without_manifest_is_an_error(built_dataset, tmp_path, capsys):
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root, ignore=shutil.ignore_patterns("shards", "manifest"))
    (root / "manifest").mkdir()
    assert main(["data", "audit", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'dataset.json'} lists" in err and "holds no parquet file" in err


def test_a_manifest_or_excluded_file_missing_or_foreign_is_an_error_not_a_smaller_count(
    built_dataset, tmp_path, capsys
):
    """One manifest file gone: `docs` counted the others, exit 0, no warning (review R13c F2)."""
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root, ignore=shutil.ignore_patterns("shards"))
    sql = ["data", "audit", str(root), "--sql", "SELECT count(*) FROM docs"]
    (root / "manifest" / "00001.parquet").unlink()
    assert main(sql) == 2
    err = capsys.readouterr().err
    assert f"{root / 'manifest' / '00001.parquet'} is missing, but {root / 'dataset.json'} records it" in err
    shutil.copyfile(built_dataset / "manifest" / "00001.parquet", root / "manifest" / "00001.parquet")
    shutil.copyfile(root / "excluded" / "00000_text.parquet", root / "excluded" / "00009_text.parquet")
    assert main(sql) == 2
    err = capsys.readouterr().err
    assert (
        f"{root / 'excluded' / '00009_text.parquet'} is not one of the files {root / 'dataset.json'}" in err
    )
    (root / "excluded" / "00009_text.parquet").unlink()
    assert main(sql) == 0


def test_sql_over_a_broken_dataset_json_names_the_file(built_dataset, tmp_path, capsys):
    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root, ignore=shutil.ignore_patterns("shards"))
    (root / "dataset.json").write_text('{"documents": "many", "cut')
    assert main(["data", "audit", str(root), "--sql", "SELECT documents FROM dataset"]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'dataset.json'} is unreadable" in err, err


LONG_URL = "https://example.org/" + "/".join(f"section-{i:03d}" for i in range(16)) + "?page=7"


def _long_url_table() -> Result:
    rows = [(LONG_URL, 1234567, "kept after the dedup pass"), ("https://a.io/", 5, None)]
    return Result("urls", ["url", "documents", "note"], rows)


@pytest.mark.parametrize("width", [80, 40])
def test_table_at_terminal_width_wraps_long_cells_whole_and_aligned(width):
    assert len(LONG_URL) > 200
    out = format_table(_long_url_table(), width=width).splitlines()
    assert "…" not in "\n".join(out) and all(len(line) <= width for line in out)
    header, rule, body = out[0], out[1], out[2:]
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    assert [header[a:b].strip() for a, b in spans] == ["url", "documents", "note"]
    (u0, u1), (d0, d1), (n0, n1) = spans
    # The URL's continuation lines, in its column and left-aligned, join back to it.
    assert "".join(line[u0:u1].strip() for line in body[:-1]) == LONG_URL
    assert all(line[u0] != " " for line in body if line[u0:u1].strip())
    # Numbers stay on the row's first line, right-aligned; text wraps within its own column.
    assert body[0][d0:d1] == "1,234,567" and body[-1][d0:d1] == "        5"
    assert all(not line[d0:d1].strip() for line in body[1:-1])
    assert " ".join(line[n0:].strip() for line in body[:-1]).split() == "kept after the dedup pass".split()
    assert body[-1][u0:u1].strip() == "https://a.io/"


def test_table_off_a_terminal_is_never_cut(capsys):
    buf = io.StringIO()  # not a tty: no width, every value on one line
    write_results([_long_url_table()], "table", buf)
    assert any(LONG_URL in line for line in buf.getvalue().splitlines())
    assert terminal_width(buf) == 0
    print(format_table(_long_url_table(), max_rows=None))  # eval's print_table call, stdout captured
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and LONG_URL in lines[2]
    # max_width (verify's 200) wraps a longer cell, still whole.
    wrapped = format_table(_long_url_table(), max_width=50, width=0).splitlines()
    assert "".join(line[:50].strip() for line in wrapped[2:-1]) == LONG_URL


def test_table_shows_each_double_as_it_reads_back_points_aligned():
    """Doubles were rounded to 2 decimals: 0.996 showed as 1.00, an eval's bits per byte 2.4706 and
    2.4646 as 2.47 and 2.46 (trial RV69a 5). Each is its shortest decimal, spaces after it aligning the
    points (zeros added made 0.5 beside 1/3 read 0.5000000000000000: review RV69d 4)."""
    values = [0.996, 99.996, 0.0179, 0.00858, None, 2.4706, 1234567.5, 1e-07, 0.5]
    out = format_table(Result("x", ["x"], [(v,) for v in values]), width=0).splitlines()[2:]
    shown = ["0.996", "99.996", "0.0179", "0.00858", "", "2.4706", "1,234,567.5", "1e-07", "0.5"]
    assert [line.strip() for line in out] == shown, out
    assert all(float(line.replace(",", "")) == v for line, v in zip(out, values) if v is not None)
    points = {line.index(".") for line in out if "." in line and "e" not in line}
    assert len(points) == 1, out  # the points in one column


def test_cli_table_shows_long_urls_whole(built_dataset, capsys):
    sql = f"SELECT '{LONG_URL}' AS url, count(*) AS documents FROM docs"
    assert main(["data", "audit", str(built_dataset), "--sql", sql]) == 0
    assert LONG_URL in capsys.readouterr().out


def test_drops_report_reads_a_reasons_tasks_as_the_build_does():
    """A task named 'x"' with split '(also': the report read its "also" part from the first '" (' and
    counted a task 'doc 5: "w" (also q' (review RV64d 5); read as tasks_of_detail reads it."""
    import duckdb

    from pipelines.decontam.ngram import tasks_of_detail
    from validation.audit_reports import PRESETS

    reason = '13-gram of x" (also doc 5: "w" (also q)'
    con = duckdb.connect()
    con.execute("CREATE TABLE excluded (dataset_name VARCHAR, filter VARCHAR, reason VARCHAR)")
    con.execute("INSERT INTO excluded VALUES ('d', 'decontaminate', ?)", [reason])
    tasks = [{"name": 'x"', "split": "(also"}, {"name": "q", "split": "test"}]
    con.execute("CREATE TABLE dataset (dataset_name VARCHAR, json JSON)")
    con.execute("INSERT INTO dataset VALUES ('d', ?)", [json.dumps({"decontaminate": {"tasks": tasks}})])
    got = sorted(r for _, _, r, _, _, _ in con.execute(PRESETS["drops"]).fetchall())
    assert tasks_of_detail(reason) == ['x"', "q"]
    assert got == ['N-gram of q test doc N: "…"', 'N-gram of x" (also doc N: "…"'], got


def test_drops_report_groups_dedup_and_decontamination_reasons():
    """One row per kind of drop, not one per document: the kept id of a duplicate and the quoted
    words of a decontamination match are folded like the numbers. Decontamination: one row per task
    and split, counting every document whose reason names the task, as dataset.json's `removed`
    (review R27a S2: digits in task names were folded, anli_r1 and anli_r2 one row, and a document
    matching two tasks counted for the first alone)."""
    import duckdb

    from validation.audit_reports import PRESETS

    con = duckdb.connect()
    rows = [
        ("d", "dedup", "exact duplicate of <urn:uuid:1>"),
        ("d", "dedup", "minhash duplicate of doc-7"),
        ("d", "dedup", "exact duplicate of <urn:uuid:2>"),
        # numbers folded, not a name's digit: "invalid UTF-N" (trial RV66b F5)
        ("d", "text", "invalid UTF-8 at byte 12"),
        ("d", "text", "invalid UTF-8 at byte 7"),
        # one kind, not one per exponent or range end (trial RV66f F2)
        ("d", "language", "language_score 1.2e-05 < 0.65"),
        ("d", "language", "language_score 3.4e-06 < 0.65"),
        ("d", "length", "words 10-20 outside 30-40"),
        ("d", "length", "words 1-2 outside 30-40"),
        ("d", "decontaminate", '13-gram of qa test doc 8: "the man is" (+4 more indexed 13-grams)'),
        ("d", "decontaminate", '13-gram of qa test doc 12: "a b c"'),
        ("d", "decontaminate", '13-gram of anli_r1 test_r1 doc 3: "a b c"'),
        ("d", "decontaminate", '13-gram of anli_r2 test_r2 doc 3: "a b c" (also anli_r1, qa)'),
        (
            "d",
            "decontaminate",
            '13-gram of anli_r2 test_r2 doc 4: "a b c" (+2 more indexed 13-grams; also anli_r3)',
        ),
        # lm-eval names with parentheses (tmmluplus_education_(profession_level)), and words "also" in
        # the quote: counted under their own names (trial RV64b S1)
        ("d", "decontaminate", '13-gram of tm_(a) test doc 1: "we also saw" (also tm_(b), qa)'),
    ]
    con.execute("CREATE TABLE excluded (dataset_name VARCHAR, filter VARCHAR, reason VARCHAR)")
    con.executemany("INSERT INTO excluded VALUES (?, ?, ?)", rows)
    tasks = [
        {"name": n, "split": s}
        for n, s in [
            ("qa", "test"),
            *((f"anli_r{i}", f"test_r{i}") for i in (1, 2, 3)),
            ("tm_(a)", "test"),
            ("tm_(b)", "test"),
        ]
    ]
    con.execute("CREATE TABLE dataset (dataset_name VARCHAR, json JSON)")
    con.execute("INSERT INTO dataset VALUES ('d', ?)", [json.dumps({"decontaminate": {"tasks": tasks}})])
    got = {(f, r): (n, pct) for _, f, r, n, pct, _ in con.execute(PRESETS["drops"]).fetchall()}
    assert got == {
        ("dedup", "exact duplicate of <id>"): (2, 13.33),
        ("dedup", "minhash duplicate of <id>"): (1, 6.67),
        ("text", "invalid UTF-8 at byte N"): (2, 13.33),
        ("language", "language_score N < N"): (2, 13.33),
        ("length", "words N-N outside N-N"): (2, 13.33),
        ("decontaminate", 'N-gram of qa test doc N: "…"'): (4, 26.67),
        ("decontaminate", 'N-gram of anli_r1 test_r1 doc N: "…"'): (2, 13.33),
        ("decontaminate", 'N-gram of anli_r2 test_r2 doc N: "…"'): (2, 13.33),
        ("decontaminate", 'N-gram of anli_r3 test_r3 doc N: "…"'): (1, 6.67),
        ("decontaminate", 'N-gram of tm_(a) test doc N: "…"'): (1, 6.67),
        ("decontaminate", 'N-gram of tm_(b) test doc N: "…"'): (1, 6.67),
    }
    examples = {r: e for _, _, r, _, _, e in con.execute(PRESETS["drops"]).fetchall()}
    assert examples['N-gram of anli_r1 test_r1 doc N: "…"'] == '13-gram of anli_r1 test_r1 doc 3: "a b c"'
    # the example of a kind whose reasons are equally common is the same one whatever the rows' order
    # (review R23b M2: arg_max broke the tie as the rows came, another example at each audit)
    examples = set()
    for seed in range(4):
        con.execute("DELETE FROM excluded")
        con.execute(
            "INSERT INTO excluded SELECT 'd', 'dedup', 'exact duplicate of <' || i || '>' "
            f"FROM range(5000) t(i) ORDER BY hash(i + {seed})"
        )
        examples.add(con.execute(PRESETS["drops"]).fetchall()[0][-1])
    assert examples == {"exact duplicate of <9>"}, examples  # the last in sort order


def test_a_plots_file_or_a_db_folder_is_one_line_before_the_report(built_dataset, tmp_path, capsys):
    """--plots naming a file was said after the whole report was printed; --db naming a folder was
    duckdb's "IO Error: … Is a directory" with no fix (trial RV74c 7)."""
    afile = tmp_path / "f.png"
    afile.write_text("x")
    for args, said in (
        (["--plots", str(afile)], f"--plots {afile}: {afile} is a file; name a folder to write the PNGs in"),
        (["--plots", str(afile / "x")], f"--plots {afile / 'x'}: {afile} is a file; name a folder"),
        (["--db", str(tmp_path)], f"--db {tmp_path} is a directory; name a database file"),
    ):
        assert main(["data", "audit", str(built_dataset), *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {said}") and err.count("\n") == 1, (out, err)
    assert sorted(tmp_path.iterdir()) == [afile]
