"""[dedup]: exact and MinHash duplicate removal as extra datatrove stages of the build.

A corpus of real prose with planted copies: verbatim, case- and whitespace-changed, near copies
(one paragraph rewritten), a copy that comes before its original in input order, and a copy of a
document a filter drops. The real build (datatrove's LocalPipelineExecutor and MinHash stages)
must drop exactly the planted copies, keep the first of each group and name it in excluded/, and
give byte-identical output after a SIGKILL in a dedup stage. Ray: tests/pipelines/test_build_ray.py;
Slurm: tests/pipelines/test_build_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.build import BuildError, build
from pipelines.config import DataConfig
from pipelines.dedup import DedupError
from tests.helpers.build_runs import run_build
from tests.helpers.corpus import fixture_texts
from tests.helpers.dup_corpus import N_BASE, write_dup_config
from training.contract.config_loader import load_config
from training.contract.dataset_format import read_dataset_info

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.xdist_group("dedup"),  # the uninterrupted builds made once: every test on one worker
]

QUIET = {"log": lambda *a: None}


@pytest.fixture(scope="module")
def dup_fixture(build_fixture, tmp_path_factory):
    """(config.toml of the duplicate corpus, expected drops per kind, root for outputs)."""
    root = tmp_path_factory.mktemp("dedup")
    return (*write_dup_config(root, build_fixture[1]), root)


@pytest.fixture(scope="module")
def built(dup_fixture) -> dict[str, Path]:
    """The uninterrupted builds, one per kind."""
    config, _, root = dup_fixture
    out = {}
    for kind in ("exact", "minhash"):
        cfg = load_config(DataConfig, config, [f"output={root / kind}", f"dedup.kind={kind}"])
        result = build(cfg, **QUIET)
        assert result.ok, result.report
        out[kind] = root / kind
    return out


def excluded_rows(out: Path) -> list[dict]:
    return pa.concat_tables(
        [pq.read_table(p) for p in sorted((out / "excluded").glob("*.parquet"))]
    ).to_pylist()


def manifest_ids(out: Path) -> list[str]:
    return pa.concat_tables([pq.read_table(p) for p in sorted((out / "manifest").glob("*.parquet"))])[
        "id"
    ].to_pylist()


@pytest.mark.parametrize("kind", ["exact", "minhash"])
def test_planted_duplicates_dropped_first_kept_reasons_named(kind, built, dup_fixture):
    _, expected, _ = dup_fixture
    out = built[kind]
    rows = excluded_rows(out)
    dedup = {r["id"]: r["reason"] for r in rows if r["filter"] == "dedup"}
    assert dedup == {d: f"{kind} duplicate of {k}" for d, k in expected[kind].items()}
    # the filters ran first: the int_score drop is not a duplicate, its later copy is kept
    assert {r["id"] for r in rows if r["filter"] == "int_score"} == {"dropped-orig"}
    kept = manifest_ids(out)
    assert "copy-of-dropped" in kept and len(kept) == len(set(kept))
    assert set(expected[kind].values()) <= set(kept)  # one of each group kept: the first
    info = read_dataset_info(out)
    assert info["excluded_by_filter"]["dedup"] == len(expected[kind])
    assert info["documents"] + info["excluded"] == info["documents_read"] == N_BASE + 9
    if kind == "exact":  # near copies are not exact ones
        assert {"near-7a", "near-7b", "near-12"} <= set(kept)


def test_killed_in_dedup_stages_resumes_byte_identical(built, dup_fixture, tmp_path):
    # SIGKILL of the build inside the first pass's task 1 (task 0 finished; task 1's signature
    # files half written, its ids not yet), then on the rerun inside the clusters stage (one drop
    # table written), then a rerun to the end: the same bytes as the uninterrupted build, dedup's
    # files included. (workers = 1: the tasks run in the driver, one after the other.)
    config, _, _ = dup_fixture
    out = tmp_path / "ds"
    args = ("--set", "dedup.kind=minhash")
    for point in ("1:dedup_pass1", "0:dedup_clusters"):
        killed = run_build(config, out, {"GRISTMILL_TEST_KILL": point}, *args)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
        assert not (out / "shards").exists() and not (out / "dataset.json").exists()
        if point == "1:dedup_pass1":
            assert (out / "logs/dedup/signatures/completions/00000").is_file()
            assert not (out / "logs/dedup/signatures/completions/00001").exists()
    lines: list[str] = []  # the rerun to the end, in this process: its output is what is compared
    resumed = build(
        load_config(DataConfig, config, [f"output={out}", "dedup.kind=minhash"]), log=lines.append
    )
    assert resumed.ok, lines[-20:]
    printed = "\n".join(lines)
    for line in (
        "[dedup signatures] already complete",
        "[dedup buckets] already complete",
        "[dedup clusters] 1 task",
    ):
        assert line in printed, printed
    assert not list(out.rglob("*.tmp"))
    want = built["minhash"]
    for sub in ("shards", "manifest", "excluded", "dedup"):
        names = sorted(str(p.relative_to(want)) for p in (want / sub).rglob("*") if p.is_file())
        assert names == sorted(str(p.relative_to(out)) for p in (out / sub).rglob("*") if p.is_file())
        for name in names:
            assert (out / name).read_bytes() == (want / name).read_bytes(), name
    assert read_dataset_info(out)["fingerprint"] == read_dataset_info(want)["fingerprint"]


def test_missing_dedup_files_are_one_error_and_the_advice_works(built, dup_fixture, tmp_path):
    # OUTPUT/dedup/ deleted after the build, then a build task redone (as the advice for a damaged
    # shard says): one line naming the file and the fix; following it redoes the dedup stages.
    config, _, _ = dup_fixture
    out = tmp_path / "ds"
    shutil.copytree(built["exact"], out)
    shutil.rmtree(out / "dedup")
    (out / "logs" / "completions" / "00001").unlink()
    (out / "dataset.json").unlink()
    cfg = load_config(DataConfig, config, [f"output={out}", "dedup.kind=exact"])
    with pytest.raises(
        DedupError, match=rf"drop/00001.parquet is missing .* delete {out / 'logs' / 'dedup'} "
    ):
        build(cfg, **QUIET)
    shutil.rmtree(out / "logs" / "dedup")
    assert build(cfg, **QUIET).ok
    for sub in ("shards", "manifest", "excluded", "dedup"):
        for p in sorted((built["exact"] / sub).rglob("*.parquet")) + sorted(
            (built["exact"] / sub).glob("*.tar")
        ):
            assert (out / p.relative_to(built["exact"])).read_bytes() == p.read_bytes(), p


def test_a_task_run_before_the_stage_it_reads_has_finished_says_so(tmp_path):
    """A dedup or build task run before the stage that writes its input had finished was told the files
    were removed after their stage finished, and to delete logs/dedup, throwing the finished tasks away
    (trial RV70c 3). The stage's completion markers tell the two apart."""
    from pipelines.dedup import DedupFilter, DocRecord, ExactClusters

    out = tmp_path / "ds"
    completions = lambda stage: out / "logs" / "dedup" / stage / "completions"
    completions("hashes").mkdir(parents=True)
    (completions("hashes") / "00001").write_text("")
    early = (
        "has not finished (tasks done: {}); run or await that stage's tasks first (its Slurm chain orders "
        "them: each stage's job starts after the one before succeeded), then this one"
    )
    with pytest.raises(DedupError) as e:
        ExactClusters(out / "dedup", 2).run()
    docs = out / "dedup" / "docs" / "00000.parquet"
    assert str(e.value) == (
        f"{docs} is missing (the text hashes of task 0): the dedup stage hashes that writes it "
        + early.format("1 of 2")
    )
    build_task = lambda: list(DedupFilter(out / "dedup", "exact").run(iter([]), rank=1, world_size=2))
    with pytest.raises(DedupError) as e:
        build_task()
    drop = out / "dedup" / "drop" / "00001.parquet"
    said = f"{drop} is missing (the documents task 1 drops as duplicates): the dedup stage clusters that "
    assert str(e.value) == said + "writes it " + early.format("0 of 1")
    completions("clusters").mkdir(parents=True)
    (completions("clusters") / "00000").write_text("")  # it finished: the table was removed since
    with pytest.raises(DedupError, match=r"dedup files were removed after their stage finished; delete "):
        build_task()
    # every stage after the first starts with that check: datatrove's MinHash buckets, run before the
    # signatures finished, found no duplicate without a word (re-trial RV70e 4)
    from pipelines.config import DedupConfig
    from pipelines.dedup import AfterStage, dedup_stages

    stages = dedup_stages(DedupConfig(kind="minhash"), out, [], 2, None)
    assert [type(st.pipeline[0]) for st in stages] == [DocRecord, AfterStage, AfterStage], stages
    completions("signatures").mkdir(parents=True)
    (completions("signatures") / "00000").write_text("")
    with pytest.raises(DedupError) as e:
        stages[1].pipeline[0](None, rank=3, world_size=8)  # as datatrove's executor calls a step
    assert str(
        e.value
    ) == "task 3 of the dedup stage buckets cannot start: the dedup stage signatures " + early.format(
        "1 of 2"
    )
    (completions("signatures") / "00001").write_text("")
    assert stages[1].pipeline[0](None, rank=3, world_size=8) is None


def test_a_drop_table_changed_or_damaged_after_the_stages_is_one_error_and_the_advice_works(
    built, dup_fixture, tmp_path
):
    """A drop table emptied (its documents-count metadata kept) after the stages ran: a redone task read
    it, kept its known duplicates, and the build validated OK (trial RV59b 1); a zero-byte one failed the
    task with pyarrow's error, rerun after rerun (RV59b 2); decisions.json's record of the table lost
    (review RV59d 4). Each is one line; its advice redoes the stages and the build is the uninterrupted
    one's. A decisions.json of a gristmill from before the tables' record still builds."""
    config, _, _ = dup_fixture
    cfg_of = lambda out: load_config(DataConfig, config, [f"output={out}", "dedup.kind=exact"])
    drops = sorted((built["exact"] / "dedup" / "drop").glob("*.parquet"))
    name = next(p.name for p in drops if pq.read_metadata(p).num_rows)
    rank = str(int(name.split(".")[0]))

    def decisions(out: Path, change) -> None:
        path = out / "dedup" / "decisions.json"
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    for damage, said in [
        (
            lambda out: pq.write_table(
                pq.read_table(out / "dedup" / "drop" / name).slice(0, 0), out / "dedup" / "drop" / name
            ),
            "differs from its sha256 in decisions.json",
        ),
        (lambda out: (out / "dedup" / "drop" / name).write_bytes(b""), "cannot be read:"),
        (lambda out: decisions(out, lambda r: r["tables"].pop(rank)), "has no sha256 in decisions.json"),
        (lambda out: decisions(out, lambda r: r.pop("tables")), None),  # an older gristmill's
    ]:
        out = tmp_path / f"ds-{len(said or '')}"
        shutil.copytree(built["exact"], out)
        damage(out)
        (out / "logs" / "completions" / name.split(".")[0]).unlink()
        (out / "dataset.json").unlink()
        logs = out / "logs" / "dedup"
        if said is not None:
            with pytest.raises(
                DedupError, match=rf"drop/{name} {said} .* delete {logs} and rerun the same command"
            ):
                build(cfg_of(out), **QUIET)
            shutil.rmtree(logs)
        assert build(cfg_of(out), **QUIET).ok
        for sub in ("shards", "manifest", "excluded", "dedup"):
            for p in sorted((built["exact"] / sub).rglob("*.parquet")) + sorted(
                (built["exact"] / sub).glob("*.tar")
            ):
                assert (out / p.relative_to(built["exact"])).read_bytes() == p.read_bytes(), p


def test_damaged_dedup_stats_get_advice_that_repairs_them(built, dup_fixture, tmp_path):
    """A dedup stage's datatrove stats (recorded in dataset.json, read by the audit's stats view)
    damaged: the advice was "delete dataset.json and rerun", which recorded the damaged file and
    validated (review R14a B2). Now the stage's task is redone; the dataset is the same."""
    config, _, _ = dup_fixture
    out = tmp_path / "ds"
    shutil.copytree(built["exact"], out)
    stats = out / "logs" / "dedup" / "hashes" / "stats" / "00001.json"
    clean = json.loads(stats.read_text())
    stats.write_text("[]")
    cfg = load_config(DataConfig, config, [f"output={out}", "dedup.kind=exact"])
    lines: list[str] = []
    assert not build(cfg, log=lines.append).ok
    marker = out / "logs" / "dedup" / "hashes" / "completions" / "00001"
    assert lines[-1].endswith(f"rm {out / 'dataset.json'} {marker} && rerun the same command"), lines[-3:]
    for path in lines[-1].split(" rm ", 1)[1].split(" && ")[0].split():
        Path(path).unlink()
    assert build(cfg, **QUIET).ok
    assert [s["stats"] for s in json.loads(stats.read_text())] == [s["stats"] for s in clean]
    for p in sorted((built["exact"] / "shards").glob("*.tar")) + sorted(built["exact"].glob("*/*.parquet")):
        assert (out / p.relative_to(built["exact"])).read_bytes() == p.read_bytes(), p
    # a stats file no task of the stage wrote is removed, not a marker that does not exist (R14d F1)
    foreign = stats.with_name("00099.json")
    shutil.copyfile(stats, foreign)
    lines.clear()
    assert not build(cfg, log=lines.append).ok
    assert lines[-1].startswith(f"fix: remove {foreign} (no task of this build writes it)"), lines[-3:]
    foreign.unlink()
    assert build(cfg, **QUIET).ok


def test_an_input_rewritten_at_the_same_size_after_dedup_is_an_error_not_a_wrong_drop(dup_fixture, tmp_path):
    """A file rewritten at the same size after the dedup stages ran was read by the build's pass
    against decisions made over its old text, and a unique document was dropped as "exact duplicate
    of" another, exit 0, validated (review R13b F1). build.json's record of the inputs' times refuses
    it first (review R15b); with its time kept, the dedup step's own check does."""
    config, _, _ = dup_fixture
    src, out = tmp_path / "src", tmp_path / "ds"
    src.mkdir()
    (original,) = fixture_texts(1)
    rows = {"a.jsonl": [("Y", original)], "b.jsonl": [("X", original)]}  # X: a copy of Y, in task 1
    for name, docs in rows.items():
        (src / name).write_text(
            "".join(json.dumps({"id": i, "text": t, "int_score": 4}) + "\n" for i, t in docs)
        )
    sets = [f"output={out}", "dedup.kind=exact", "source.kind=jsonl", f"source.path={src}"]
    cfg = load_config(DataConfig, config, sets)
    assert build(cfg, **QUIET).ok
    assert [r["id"] for r in excluded_rows(out) if r["filter"] == "dedup"] == ["X"]
    # task 0 to be redone (its completion marker gone, as a damaged shard's repair says), its input
    # rewritten at the same size: Y is now another text, and X, whose task finished, no copy
    (out / "logs" / "completions" / "00000").unlink()
    (out / "dataset.json").unlink()
    before = (src / "a.jsonl").stat().st_size
    unique = original[::-1]  # the same characters (the same JSON escapes), another text
    (src / "a.jsonl").write_text(json.dumps({"id": "Y", "text": unique, "int_score": 4}) + "\n")
    assert (src / "a.jsonl").stat().st_size == before
    # refused before any work by the time build.json recorded (review R15b)
    with pytest.raises(
        BuildError, match=r"input file a\.jsonl: rewritten at the same size \(\[dedup\] decided"
    ):
        build(cfg, **QUIET)
    # with its time given back too (`cp -p`, `rsync -a` of another copy), the dedup step's own check
    os.utime(
        src / "a.jsonl",
        ns=(time.time_ns(), json.loads((out / "build.json").read_text())["read"]["modified_ns"][0]),
    )
    with pytest.raises(
        DedupError, match=r"\(document 0 \('Y'\) has other text than the first pass read\): an input"
    ) as e:
        build(cfg, **QUIET)
    # the advice, to the letter: the dedup stages and every task redone over the new text (task 1's
    # drop of X, decided over the old, went on being kept when only the dedup stages were redone)
    rm = re.search(r"delete (\S+), (\S+) and (\S+) and rerun", str(e.value)).groups()
    for path in rm:
        shutil.rmtree(path)
    assert build(cfg, **QUIET).ok
    assert not list((out / "excluded").glob("*.parquet"))  # X is no copy now: kept


def test_the_dedup_decisions_are_of_the_tables_content_and_a_damaged_record_is_one_line(built, tmp_path):
    """decisions.json, which an s3:// build's task records, is the sha256 of the first pass's text
    hashes (a text rewritten that changed no drop: trial RV56a 1) and of the drop tables' content (not
    of their bytes, which hold pyarrow's version: a rerun of the stages elsewhere would redo every
    task, review RV55d 3); damaged, or missing beside drop tables (records of other decisions were
    then kept: RV56a 2), it is one line naming the repair."""
    import hashlib

    from pipelines.dedup import decisions_sha256

    content, dedup = hashlib.sha256(), built["exact"] / "dedup"
    for r, table in enumerate(sorted((dedup / "drop").glob("*.parquet"))):
        first = pq.read_table(dedup / "docs" / table.name)
        for column in ("hash_hi", "hash_lo"):
            content.update(np.asarray(first.column(column).to_pylist(), np.uint64).tobytes())
        t = pq.read_table(table)
        documents = int(t.schema.metadata[b"documents"])
        content.update(np.asarray([r, documents, t.num_rows], np.int64).tobytes())
        content.update(np.asarray(t.column("position").to_pylist(), np.int64).tobytes())
        for column in ("id", "kept_id"):
            content.update("\0".join(t.column(column).to_pylist()).encode() + b"\1")
    assert decisions_sha256(built["exact"]) == content.hexdigest()
    copy = tmp_path / "copy"
    shutil.copytree(dedup, copy / "dedup")
    said = (
        rf"^{copy / 'dedup' / 'decisions.json'} is missing or cannot be read .* delete {copy / 'dedup'} and "
    )
    (copy / "dedup" / "decisions.json").write_text("{")
    with pytest.raises(DedupError, match=said):
        decisions_sha256(copy)
    (copy / "dedup" / "decisions.json").unlink()  # beside the drop tables
    with pytest.raises(DedupError, match=said):
        decisions_sha256(copy)
    assert decisions_sha256(tmp_path / "none") is None


@pytest.mark.parametrize("kind", ["exact", "minhash"])
def test_dedup_counts_below_one_are_one_line_whatever_the_kind(kind):
    """dedup.buckets = -1 under kind "exact" was accepted and written into the dataset's config.toml
    (trial RV74c 8); under "minhash" it was refused already."""
    from pipelines.config import DedupConfig
    from pipelines.dedup import check_config

    for key in ("ngram", "buckets", "hashes_per_bucket"):
        with pytest.raises(DedupError, match=rf"^dedup\.{key} = -1 must be ≥ 1 \(FineWeb: ngram 5"):
            check_config(DedupConfig(kind=kind, **{key: -1}))
    check_config(DedupConfig(kind=kind))
