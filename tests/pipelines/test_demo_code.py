"""The code demo corpus (source kind "demo-code"): deterministic, real stdlib source, capped; it builds."""

from __future__ import annotations

import json
import re
import sys
import sysconfig
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.build import BuildError, build
from pipelines.config import DataConfig
from pipelines.demo_corpus import CODE_MAX_FILE_CHARS, SCHEMA, write_code_corpus
from training.contract.config_loader import ConfigError, load_config

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "data" / "demo-code.toml"
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def rows_of(out: Path) -> list[dict]:
    files = sorted(out.glob("*.parquet"))
    assert len(files) == 2 and all(pq.read_schema(f) == SCHEMA for f in files)
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()


def test_code_corpus_is_deterministic_real_source_and_capped(tmp_path):
    a = write_code_corpus(tmp_path / "a", max_chars=300_000)
    b = write_code_corpus(tmp_path / "b", max_chars=300_000)
    names = sorted(p.name for p in a.iterdir())
    assert names == ["corpus.json", "stdlib-code-00.parquet", "stdlib-code-01.parquet"]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)

    rows = rows_of(a)
    chars = sum(len(r["text"]) for r in rows)
    assert 300_000 - CODE_MAX_FILE_CHARS < chars <= 300_000 and len(rows) > 10
    assert [r["url"] for r in rows] == sorted(r["url"] for r in rows) and len({r["id"] for r in rows}) == len(
        rows
    )
    root = Path(sysconfig.get_paths()["stdlib"])
    prefix = f"https://github.com/python/cpython/blob/{VERSION}/Lib/"
    for r in rows:  # each document is one stdlib file, as it is
        rel = r["url"].removeprefix(prefix)
        assert r["url"].startswith(prefix) and rel.endswith(".py") and "/test/" not in f"/{rel}"
        assert r["text"] == (root / rel).read_text(encoding="utf-8") and len(r["text"]) <= CODE_MAX_FILE_CHARS
        # every document passes the demo filters (configs/data/demo.toml)
        assert r["int_score"] >= 3 and r["language_score"] >= 0.65 and len(r["text"]) >= 100
    info = json.loads((a / "corpus.json").read_text())
    assert info["corpus"] == "code" and info["python"] == VERSION
    assert info["documents"] == len(rows) and info["characters"] == chars


def test_code_corpus_builds_with_a_shared_tokenizer(build_fixture, tmp_path):
    _, tokenizer, _ = build_fixture
    corpus = write_code_corpus(tmp_path / "corpus", max_chars=60_000)
    out = tmp_path / "ds"
    overrides = [f"output={out}", f"source.path={corpus}", "build.workers=1", "build.min_free_gb=0.01"]
    with pytest.raises(BuildError, match=r"nope\.json not found; .*build configs/data/demo\.toml first"):
        build(load_config(DataConfig, CONFIG, [*overrides, f"tokenizer.path={tmp_path / 'nope.json'}"]))
    assert not (tmp_path / "nope.json").exists()  # never trained here
    # an empty path is refused with the code corpus's own folder as the example, not the prose one's
    with pytest.raises(ConfigError, match=r'"": set source.path to one, e.g. "runs/data/demo-code-corpus"$'):
        build(load_config(DataConfig, CONFIG, [*overrides, 'source.path=""']))

    result = build(
        load_config(DataConfig, CONFIG, [*overrides, f"tokenizer.path={tokenizer}"]), log=lambda *a: None
    )
    assert result.ok
    info = json.loads((out / "dataset.json").read_text())
    assert info["status"] == "complete" and info["source"]["kind"] == "demo-code"
    assert info["documents"] == len(rows_of(corpus)) and info["excluded"] == 0
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()


def test_a_demo_rerun_skips_the_stop_its_run_is_already_past(tmp_path):
    """The demo's first train command stops at step 60; on a rerun, with the run already past that,
    it is left out (no `run.max_steps None → 60`, `training to step 60`, `nothing to do`, and back)."""
    from pipelines.demo import train_commands
    from tests.helpers.train_data import make_dataset
    from tests.helpers.train_runs import TINY, overrides
    from training.train import load_train_config, train

    run = tmp_path / "run"
    cfg = "cfg.toml"

    def stops(stop: int) -> list[list[str]]:
        return [c for c in train_commands(cfg, run, stop) if f"run.max_steps={stop}" in c]

    assert stops(2) == [["train", "--config", cfg, "--resume", "auto", "--set", "run.max_steps=2"]]
    dataset = make_dataset(tmp_path / "ds", n_docs=200)
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=4")))  # a checkpoint at step 4
    assert stops(2) == [] and stops(4) == [] and len(stops(8)) == 1
    assert train_commands(cfg, run, 2)[-3] == ["train", "--config", cfg, "--resume", "auto"]
    # its plan, on a rerun too: --plan refuses a start over a run's checkpoints, as train does (trial RV78a 1)
    from pipelines.cli import main as gristmill

    plan = train_commands(str(TINY), run, 2)[0]
    assert gristmill([*plan, "--set", *overrides(dataset, run)]) == 0


def test_the_demo_shows_the_batch_record_verified_and_a_tampered_copy_caught(tmp_path, capsys):
    """Issue 47: the demo's export stage says what `verify` checked of the recorded batches (it is
    silent when they agree), then runs verify on a copy of the record with one step's batch swapped
    for the next step's: verify's own line names that step and it exits 1; the copy stays, for the
    command the stage prints (it was removed, and the printed `gristmill verify COPY` failed). A
    step the record cannot swap (the last) is an error, not a pass."""
    from pipelines.cli import main as gristmill
    from pipelines.demo import batch_check_shown
    from tests.helpers.train_data import make_dataset
    from tests.helpers.train_runs import TINY, overrides
    from training.train import load_train_config, train

    run, tampered = tmp_path / "run", tmp_path / "run-tampered"
    dataset = make_dataset(tmp_path / "ds", n_docs=200)
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=8")))
    capsys.readouterr()
    assert batch_check_shown(run, tampered, gristmill, step=5) == 0
    out = capsys.readouterr().out
    assert f"verify compared the 8 steps recorded in {run / 'batches.bin'} (steps 1–8)" in out
    said = r"^    batches: step 5 differs from the plan: recorded \w{16}…, planned \w{16}…"
    assert re.search(said, out, re.M), out
    assert "exit 1, step 5 named" in out
    assert gristmill(["verify", str(tampered)]) == 1  # as the stage prints it
    assert batch_check_shown(run, tampered, gristmill, step=8) == 1
    assert "does not record steps 8 and 9" in capsys.readouterr().out


def test_a_demo_source_never_replaces_a_folder_that_is_not_its_corpus(tmp_path, capsys, monkeypatch):
    """The demo corpus replaces its folder when it is written: source.path pointed at the user's own
    data with the demo kind left in the recipe deleted that data, then built the demo, exit 0 (review
    R22b F1); the code corpus's folder was replaced by the prose one; the hub default or "." as the
    folder was a traceback (F5). Each is one line naming source.path, and nothing is touched."""
    from pipelines.cli import main

    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "precious.parquet").write_bytes(b"mine")
    code = write_code_corpus(tmp_path / "code", max_chars=30_000)
    before = sorted(p.name for p in code.iterdir())
    base = [
        "data",
        "build",
        "--config",
        str(CONFIG.with_name("demo.toml")),
        "--set",
        f"output={tmp_path / 'ds'}",
    ]
    cases = {
        str(mine): f"source.path {mine} holds files that are not the demo corpus's (precious.parquet)",
        str(
            code
        ): f'source.path {code} holds the corpus of source.kind = "demo-code", and source.kind = "demo"',
        str(mine / "precious.parquet"): f"source.path {mine / 'precious.parquet'} is a file",
        "hf://datasets/HuggingFaceFW/fineweb-edu": 'source.path is "hf://datasets/HuggingFaceFW/fineweb-edu"',
    }
    for path, says in cases.items():
        assert main([*base, f"source.path={path}"]) == 2, path
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert (mine / "precious.parquet").read_bytes() == b"mine" and len(list(mine.iterdir())) == 1
    assert sorted(p.name for p in code.iterdir()) == before
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".*tmp"))
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "notes.txt").write_text("x")
    monkeypatch.chdir(here)
    assert main([*base, "source.path=."]) == 2  # a ValueError traceback ('.' has an empty name)
    assert (
        f"source.path {here} holds files that are not the demo corpus's (notes.txt)"
        in capsys.readouterr().err
    )
    assert (here / "notes.txt").read_text() == "x"


def test_a_demo_corpus_written_again_touches_nothing_else_in_its_folder(tmp_path, monkeypatch):
    """A corpus of another Python or corpus_version is written again: the whole folder was replaced,
    with the user's files and a dataset built inside it (review R22c S1); a folder holding the corpus
    and other files is refused (their parquet files were built into the demo, and one named like the
    corpus's deleted: R22e 4, 8); "." in an empty working directory replaced the directory itself,
    then a traceback (M2); "~" made a folder named "~" (S2)."""
    corpus = write_code_corpus(tmp_path / "corpus", max_chars=30_000)
    first = {p.name: p.read_bytes() for p in corpus.iterdir()}
    stamp = json.loads((corpus / "corpus.json").read_text())
    (corpus / "corpus.json").write_text(json.dumps({**stamp, "python": "3.10"}))
    (corpus / ".DS_Store").write_bytes(b"hidden: no one's input")
    write_code_corpus(corpus, max_chars=30_000)
    assert {p.name: p.read_bytes() for p in corpus.iterdir() if not p.name.startswith(".")} == first
    assert not list(tmp_path.glob(".*"))
    (corpus / "stdlib-code-01.parquet").unlink()  # one of its files deleted: the corpus built short (R22g 5)
    kept = (corpus / "stdlib-code-00.parquet").stat().st_mtime_ns
    write_code_corpus(corpus, max_chars=30_000)
    assert {p.name: p.read_bytes() for p in corpus.iterdir() if not p.name.startswith(".")} == first
    assert (corpus / "stdlib-code-00.parquet").stat().st_mtime_ns == kept  # that file alone (R22h M4)
    (corpus / "corpus.json").unlink()  # files named like its own, no corpus.json: written over (R22h M5)
    with pytest.raises(ConfigError, match="holds files named like the demo corpus's, no corpus.json"):
        write_code_corpus(corpus, max_chars=30_000)
    (corpus / "corpus.json").write_bytes(first["corpus.json"])
    # a file named like the corpus's but not one of its own was built into the demo (R22g 5)
    for mine in ("stdlib-code-mine.parquet", "stdlib-code-07.parquet", "notes.txt"):
        (corpus / mine).write_bytes(b"precious")
        with pytest.raises(ConfigError, match=f"holds files that are not the demo corpus's \\({mine}\\)"):
            write_code_corpus(corpus, max_chars=30_000)
        assert (corpus / mine).read_bytes() == b"precious"
        (corpus / mine).unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    write_code_corpus(".", max_chars=30_000)
    assert sorted(p.name for p in empty.iterdir()) == sorted(first) and Path.cwd() == empty
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write_code_corpus("~/code", max_chars=30_000)
    assert sorted(p.name for p in (tmp_path / "home" / "code").iterdir()) == sorted(first)
    assert not (empty / "~").exists()
