"""[dedup]: exact and MinHash duplicate removal as extra datatrove stages of the build.

A corpus of real prose with planted copies: verbatim, case- and whitespace-changed, near copies
(one paragraph rewritten), a copy that comes before its original in input order, and a copy of a
document a filter drops. The real build (datatrove's LocalPipelineExecutor and MinHash stages)
must drop exactly the planted copies, keep the first of each group and name it in excluded/, and
give byte-identical output after a SIGKILL in a dedup stage. Ray: tests/pipelines/test_build_ray.py;
Slurm: tests/pipelines/test_build_slurm.py.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.build import build
from pipelines.config import DataConfig
from pipelines.dedup import DedupError
from pipelines.sources import FINEWEB_EDU_SCHEMA
from tests.conftest import fixture_texts
from tests.pipelines.test_build_resume import run_build
from training.contract.config_loader import load_config
from training.contract.dataset_format import read_dataset_info

QUIET = {"log": lambda *a: None}
N_BASE = 60  # documents doc-000 … doc-059; task 0 reads part-00 (0-29), task 1 part-01 (30-59)
REWRITTEN = "This paragraph was rewritten by a mirror site that copies pages and edits a little of each."


def _rewrite_paragraph(text: str, k: int, new: str = REWRITTEN) -> str:
    paragraphs = text.split("\n\n")
    paragraphs[k % len(paragraphs)] = new
    return "\n\n".join(paragraphs)


def write_dup_corpus(folder: Path) -> dict[str, dict[str, str]]:
    """Two parquet files with planted duplicates; returns, per dedup kind, {dropped id: kept id}."""
    *texts, extra = fixture_texts(N_BASE + 1)
    rows = [[], []]  # part-00 (task 0), part-01 (task 1)
    for i, t in enumerate(texts):
        rows[i >= N_BASE // 2].append((f"doc-{i:03d}", t, 4))
    shout = texts[5].upper().replace("\n\n", "\n \n\t")  # case and whitespace changed
    rows[1] += [
        ("copy-3", texts[3], 4),  # verbatim
        ("copy-5", shout, 4),
        ("near-7a", _rewrite_paragraph(texts[7], 11), 4),  # one paragraph rewritten (of 22)
        ("near-7b", _rewrite_paragraph(texts[7], 5, "Another mirror rewrote a different paragraph."), 4),
        ("near-12", _rewrite_paragraph(texts[12], 8), 4),
        ("copy-of-dropped", extra, 4),
    ]
    rows[0] += [
        ("copy-3b", texts[3], 4),  # verbatim, same task as its original, after it
        ("copy-40", "  " + texts[40].replace(" ", "   ", 3) + "\n", 4),  # task 0: before doc-040
        ("dropped-orig", extra, 1),  # dropped by the int_score filter, before dedup
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for f, part in enumerate(rows):
        table = pa.Table.from_pylist(
            [{"text": t, "id": i, "url": f"https://example.org/{i}", "int_score": s} for i, t, s in part],
            schema=FINEWEB_EDU_SCHEMA,
        )
        pq.write_table(table, folder / f"part-{f:02d}.parquet")
    exact = {"copy-3": "doc-003", "copy-3b": "doc-003", "copy-5": "doc-005", "doc-040": "copy-40"}
    near = {"near-7a": "doc-007", "near-7b": "doc-007", "near-12": "doc-012"}
    return {"exact": exact, "minhash": {**exact, **near}}


def write_dup_config(root: Path, tokenizer: Path) -> tuple[Path, dict[str, dict[str, str]]]:
    """The duplicate corpus under `root` and a recipe for it (2 tasks, one per file; no dedup
    kind: set dedup.kind); returns (config path, expected drops per kind)."""
    expected = write_dup_corpus(root / "corpus")
    config = root / "data.toml"
    config.write_text(f"""
output = "{root / "unused"}"
[source]
kind = "parquet"
path = "{root / "corpus"}"
[filters]
min_int_score = 3
[tokenizer]
path = "{tokenizer}"
[shards]
target_mb = 0.05
seed = 3
[build]
tasks = 2
workers = 1
progress_interval = 0.5
min_free_gb = 0.01
""")
    return config, expected


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
    resumed = run_build(config, out, None, *args)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    for line in (
        "[dedup signatures] already complete",
        "[dedup buckets] already complete",
        "[dedup clusters] 1 task",
    ):
        assert line in resumed.stdout, resumed.stdout
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
