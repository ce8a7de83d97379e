"""A build killed mid-run (SIGKILL of the whole executor process group) resumes to identical shards."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipelines.build import BuildError, build
from pipelines.build_identity import _input_changes
from pipelines.config import DataConfig
from pipelines.sources import SourceError
from tests.helpers.build_runs import run_build
from training.contract.config_loader import load_config
from training.contract.dataset_format import EXCLUDED_SCHEMA, DatasetError, read_dataset_info
from validation.validate import validate_dataset

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def test_killed_build_resumes_byte_identical(built_dataset, build_fixture, tmp_path):
    _, _, config = build_fixture
    out = tmp_path / "ds"
    # Task 1 SIGKILLs the build's process group once its first shard is renamed and the second is
    # half written (the hook sits in the shard-writing loop; see pipelines/faults.py).
    killed = run_build(config, out, {"GRISTMILL_TEST_KILL": "1:second_shard"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (out / "dataset.json").exists()
    # Quiet: datatrove's logs went to OUT/logs/, not the terminal.
    assert "Launching pipeline" not in killed.stderr, killed.stderr[-2000:]
    assert "Launching pipeline" in (out / "logs" / "logs" / "task_00001.log").read_text()
    assert "[build] 2 tasks on 2 workers" in killed.stdout, killed.stdout
    partial = list((out / "shards").glob("00001_*.tar.tmp"))
    assert partial, "the kill should have left a half-written shard behind its temporary name"
    # No partial shard under a final name: every visible .tar is complete and already identical
    # to the uninterrupted build's.
    for tar in (out / "shards").glob("*.tar"):
        with tarfile.open(tar) as tf:
            assert tf.getmembers()
        assert tar.read_bytes() == (built_dataset / "shards" / tar.name).read_bytes()
    assert (out / "shards" / "00001_00000.tar").is_file()

    resumed = run_build(config, out, None, "-v")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout
    assert "Launching pipeline for rank=" in resumed.stderr  # -v: datatrove's logs on the terminal
    assert not list(out.rglob("*.tmp"))
    for sub in ("shards", "manifest", "excluded"):
        names = sorted(p.name for p in (built_dataset / sub).iterdir())
        assert names == sorted(p.name for p in (out / sub).iterdir())
        for name in names:
            assert (out / sub / name).read_bytes() == (built_dataset / sub / name).read_bytes(), name
    assert read_dataset_info(out)["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]


def test_replaced_input_of_an_unfinished_task_is_accepted_on_rerun(build_fixture, tmp_path, monkeypatch):
    # The advice after a truncated input: re-download it and rerun the same command. Only the
    # inputs of finished tasks are frozen; changing one of those is refused, naming file and sizes.
    _, _, config = build_fixture
    src, out = tmp_path / "src", tmp_path / "ds"
    src.mkdir()
    full = {}
    for name in ("a", "b"):
        lines = [
            json.dumps({"text": f"Doc {i} of {name}, about rivers. " * 8, "id": f"{name}{i}", "int_score": 4})
            for i in range(60)
        ]
        full[name] = zstandard.ZstdCompressor().compress("\n".join(lines).encode())
        (src / f"{name}.jsonl.zst").write_bytes(full[name])
    (src / "b.jsonl.zst").write_bytes(full["b"][: len(full["b"]) // 2])
    overrides = [
        f"output={out}",
        "source.kind=jsonl",
        f"source.path={src}",
        "build.tasks=2",
        "build.workers=1",
    ]
    cfg = load_config(DataConfig, config, overrides)
    with pytest.raises(SourceError, match="re-download it under the same name"):
        build(cfg, log=lambda *a: None)  # task 0 (a) finishes, task 1 (b) fails
    assert (out / "logs" / "completions" / "00000").is_file()

    # What a killed earlier attempt of task 1 could have left: more shards than its rerun writes, and
    # rows it excluded (of the truncated file): counted as read and excluded, listed by the audit.
    shutil.copy(out / "shards" / "00000_00000.tar", out / "shards" / "00001_00007.tar")
    stale = {f.name: None for f in EXCLUDED_SCHEMA} | {"id": "b:7", "filter": "text", "reason": "empty"}
    (out / "excluded").mkdir(exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist([stale], schema=EXCLUDED_SCHEMA), out / "excluded" / "00001_text.parquet"
    )
    (src / "b.jsonl.zst").write_bytes(full["b"])  # "re-downloaded"
    lines = []
    result = build(cfg, log=lines.append)
    assert result.ok and result.info["documents"] == 120, lines
    assert result.info["documents_read"] == 120 and not result.info.get("excluded_by_filter"), result.info
    assert not (out / "shards" / "00001_00007.tar").exists()
    assert not (out / "excluded" / "00001_text.parquet").exists()
    assert any("b.jsonl.zst" in line and "its task had not finished" in line for line in lines), lines

    (src / "a.jsonl.zst").write_bytes(full["a"][:-10])  # task 0's input changes after it finished
    (out / "dataset.json").unlink()
    with pytest.raises(BuildError) as e:
        build(cfg, log=lambda *a: None)
    size = len(full["a"])
    assert f"input file a.jsonl.zst: {size:,} → {size - 10:,} bytes (its task finished" in str(e.value)
    assert f"rm -rf {out}" in str(e.value)

    # Rewritten at the same size (another text of the same length, or the same bytes again): told by
    # the time build.json recorded, not kept silently (review R15b: the dataset held the old text)
    (src / "a.jsonl.zst").write_bytes(full["a"])
    with pytest.raises(
        BuildError, match="input file a.jsonl.zst: rewritten at the same size .its task fin"
    ) as e:
        build(cfg, log=lambda *a: None)
    touch = re.search(r"`(touch -d @\S+ \S+)` gives it back the time recorded", str(e.value))
    assert touch and touch.group(1).endswith(str(src / "a.jsonl.zst")), str(e.value)
    subprocess.run(shlex.split(touch.group(1)), check=True)  # these are the bytes it read: as advised
    assert build(cfg, log=lambda *a: None).ok
    # A relative source.path from another directory names another folder (files of the same names and
    # sizes, copied with their times): refused, not built from both folders (review R15b)
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(src, tmp_path / "elsewhere" / "src")
    monkeypatch.chdir(tmp_path)
    relative = load_config(
        DataConfig, config, [*overrides[1:2], *overrides[3:], f"output={tmp_path / 'ds2'}", "source.path=src"]
    )
    assert build(relative, log=lambda *a: None).ok
    monkeypatch.chdir(tmp_path / "elsewhere")
    moved = f"source.path reads {tmp_path}/elsewhere/src here, the build read {src} (finished tasks' shards"
    with pytest.raises(BuildError, match=re.escape(moved)):
        build(relative, log=lambda *a: None)
    # ...but a link re-pointed at a copy on another disk (times kept, as rsync -a) reads as the same
    # input (review R15d F6: refused, with no way out but a rebuild)
    (tmp_path / "link").symlink_to(src)
    linked = load_config(DataConfig, config, [*overrides[1:2], *overrides[3:], f"output={tmp_path / 'ds3'}",
                                              f"source.path={tmp_path / 'link'}"])  # fmt: skip
    assert build(linked, log=lambda *a: None).ok
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "src")
    lines = []
    assert build(linked, log=lines.append).ok
    assert any("already complete (same config)" in line for line in lines), lines
    # re-pointed at a copy whose times were not kept: the advice gives the files read now theirs back
    # (it named the folder read then: review R15f F3)
    shutil.copytree(src, tmp_path / "third", copy_function=shutil.copy)
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "third")
    with pytest.raises(BuildError, match="rewritten at the same size") as e:
        build(linked, log=lambda *a: None)
    for touch in re.findall(r"`(touch -d @\S+ \S+)`", str(e.value)):
        assert f"{tmp_path}/third/" in touch, touch
        subprocess.run(shlex.split(touch), check=True)
    assert build(linked, log=lambda *a: None).ok


def test_shard_damaged_after_its_task_is_caught_when_dataset_json_is_rewritten(
    built_dataset, build_fixture, tmp_path
):
    # What the build suggests for a damaged dataset.json (delete it, rerun) must not re-hash a
    # corrupted shard into a new "complete" dataset.json: the shard is checked against the sha256
    # its task recorded when it finished.
    _, _, config = build_fixture
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    shard = out / "shards" / "00001_00000.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # inside the first member's token ids: same size, still a valid tar
    shard.write_bytes(bytes(data))
    (out / "dataset.json").unlink()
    cfg = load_config(DataConfig, config, [f"output={out}"])
    with pytest.raises(BuildError) as e:
        build(cfg, log=lambda *a: None)
    msg = str(e.value)
    assert "shards/00001_00000.tar is " in msg and "task 1 wrote" in msg, msg
    assert f"rm {out / 'logs' / 'completions' / '00001'}" in msg
    assert not (out / "dataset.json").exists()
    (out / "logs" / "completions" / "00001").unlink()  # the advice: task 1 is redone
    assert build(cfg, log=lambda *a: None).ok
    assert shard.read_bytes() == (built_dataset / "shards" / shard.name).read_bytes()


def test_a_damaged_finished_dataset_gets_advice_that_repairs_it(built_dataset, build_fixture, tmp_path):
    """A rerun of a complete dataset only validates it: with a damaged shard it said FAILED with no
    way out (removing the task's completion marker alone did nothing while dataset.json existed)."""
    _, _, config = build_fixture
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    shard = out / "shards" / "00001_00000.tar"
    shard.write_bytes(shard.read_bytes()[:1000])  # truncated
    cfg = load_config(DataConfig, config, [f"output={out}"])
    lines: list[str] = []
    assert not build(cfg, log=lines.append).ok
    advice = lines[-1]
    rm = f"rm {out / 'dataset.json'} {out / 'logs' / 'completions' / '00001'} && rerun the same command"
    assert advice.startswith("fix: to rebuild the damaged task(s) 1 ") and advice.endswith(rm), advice
    subprocess.run(advice.split(": ", 2)[-1].split(" && ")[0].split(), check=True)  # follow it
    assert build(cfg, log=lambda *a: None).ok
    for name in sorted(p.name for p in (built_dataset / "shards").iterdir()):
        assert (out / "shards" / name).read_bytes() == (built_dataset / "shards" / name).read_bytes(), name
    # an excluded file replaced by another's: its task is rebuilt too (rewriting dataset.json alone,
    # the advice before, recorded the replaced file's counts: a wrong excluded count that validated)
    kept = out / "excluded" / "00000_length.parquet"
    shutil.copyfile(out / "excluded" / "00000_text.parquet", kept)
    lines.clear()
    assert not build(cfg, log=lines.append).ok
    rm = f"rm {out / 'dataset.json'} {out / 'logs' / 'completions' / '00000'} && rerun the same command"
    assert lines[-1].startswith("fix: to rebuild the damaged task(s) 0 ") and lines[-1].endswith(rm), lines
    subprocess.run(lines[-1].split(": ", 2)[-1].split(" && ")[0].split(), check=True)
    assert build(cfg, log=lambda *a: None).ok
    assert kept.read_bytes() == (built_dataset / "excluded" / kept.name).read_bytes()
    # damaged datatrove stats: their task rebuilt; a file no task writes: removed (review R13f F2)
    stats = out / "logs" / "stats" / "00000.json"
    stats.write_text(stats.read_text().replace('"documents"', '"documents_"', 1))
    extra = out / "excluded" / "extra.parquet"
    shutil.copyfile(out / "excluded" / "00000_text.parquet", extra)
    for want in (
        f"fix: remove {extra} (no task of this build writes it)",
        "fix: to rebuild the damaged task(s) 0 ",
    ):
        lines.clear()
        assert not build(cfg, log=lines.append).ok
        assert lines[-1].startswith(want), lines[-3:]
        if want.startswith("fix: remove"):
            extra.unlink()
        else:
            subprocess.run(lines[-1].split(": ", 2)[-1].split(" && ")[0].split(), check=True)
    assert build(cfg, log=lambda *a: None).ok
    assert read_dataset_info(out)["documents_read"] == read_dataset_info(built_dataset)["documents_read"]

    # Each advice followed to the letter, as often as it takes, ends with the dataset's own counts
    # (review R13g: a manifest's advice named it with pyarrow's closing quote and looped; dataset.json
    # rewritten, as its own refusal advises, counted a foreign excluded file and validated, as did
    # counts edited by hand)
    def follow(advice: str) -> None:
        what = advice.split(": ", 1)[1]
        if what.startswith("remove "):
            paths = shlex.split(what.removeprefix("remove ").split(" (no task")[0])
        elif " rm " in advice:
            paths = shlex.split(advice.split(" rm ", 1)[1].split(" && ")[0])
        else:
            paths = [what.removeprefix("delete ").split(" and rerun")[0]]
        for path in paths:
            Path(path).unlink()

    counts = ("documents", "documents_read", "excluded", "excluded_by_filter")
    want = {k: read_dataset_info(built_dataset)[k] for k in counts}
    manifest = out / "manifest" / "00001.parquet"
    damages = {
        "a truncated manifest": lambda: manifest.write_bytes(manifest.read_bytes()[:100]),
        "a foreign excluded file, dataset.json gone": lambda: (
            shutil.copyfile(out / "excluded" / "00000_text.parquet", out / "excluded" / "00009_text.parquet"),
            (out / "dataset.json").unlink(),
        ),
        "counts edited": lambda: (out / "dataset.json").write_text(
            (out / "dataset.json").read_text().replace('"documents_read": ', '"documents_read": 1')
        ),
    }
    for name, damage in damages.items():
        damage()
        for _ in range(4):
            lines.clear()
            if build(cfg, log=lines.append).ok:
                break
            follow(lines[-1])
        got = read_dataset_info(out)
        assert {k: got[k] for k in counts} == want, (name, lines[-3:])
    (out / "shards" / "00000_00009.tar.tmp").write_text("x")
    lines.clear()
    assert not build(cfg, log=lines.append).ok
    assert lines[-1] == "fix: delete the stray temporary file(s) named above, then rerun to validate again"


def test_an_edited_document_count_gets_advice_that_ends(built_dataset, build_fixture, tmp_path, capsys):
    """dataset.json's `documents` edited (not part of the fingerprint): the loader said "rerun
    `gristmill data index`", which said the index was complete, and the loader refused again (review
    R14c F6). The command now says dataset.json was edited, and its fix works."""
    from pipelines.cli import main
    from training.data.reader import DocumentTable

    _, _, config = build_fixture
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    info = out / "dataset.json"
    info.write_text(info.read_text().replace('"documents": ', '"documents": 1', 1))
    with pytest.raises(DatasetError, match=rf"rerun `gristmill data index {out}`"):
        DocumentTable(out)
    capsys.readouterr()
    assert main(["data", "index", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{info} lists 1" in err and "dataset.json was edited after the build; delete it and rerun" in err
    info.unlink()
    assert build(load_config(DataConfig, config, [f"output={out}"]), log=lambda *a: None).ok
    assert DocumentTable(out).info["documents"] == read_dataset_info(built_dataset)["documents"]
    # its token count edited: the same (review R14f F8)
    edited = json.loads(info.read_text())
    info.write_text(json.dumps({**edited, "tokens": edited["tokens"] + 1000}))
    capsys.readouterr()
    assert main(["data", "index", str(out)]) == 2
    assert "dataset.json was edited after the build" in capsys.readouterr().err


def test_a_finished_task_whose_output_is_gone_is_named_not_left_out(built_dataset, build_fixture, tmp_path):
    """Task 1's manifest, shards and shard record deleted with dataset.json: the rerun wrote a
    dataset.json of task 0's documents alone and it validated, exit 0 (review R18c F1: the count
    check stopped at the first file it could not read, which no record named any more; a missing
    stats file stopped it before every later task's check too). Now each such task is named, with the
    fix that redoes it, and following it gives back the dataset."""
    _, _, config = build_fixture
    cfg = lambda out: load_config(DataConfig, config, [f"output={out}"])  # noqa: E731
    output = ["manifest/00001.parquet", "shards/00001_*", "logs/shard_sha256/00001.json"]
    stats1 = "logs/stats/00001.json"
    # and a stats file damaged, then recorded so by the rerun: it validated, and the audit's summary
    # read half the documents with exit 0 (review R18e 1)
    cut = lambda p: p.write_bytes(p.read_bytes()[:100])  # noqa: E731
    readerless = lambda p: p.write_text("[]")  # noqa: E731
    lacks = "output is missing (the dataset lacks its documents)"
    for case, gone, damaged, tasks, said_of in (
        ("output", output, None, [1], lacks),
        ("stats and a later task's output", ["logs/stats/00000.json", *output], None, [0, 1], lacks),
        ("stats cut short", [], cut, [1], "counts cannot be read: the file is unreadable"),
        ("stats without a reader", [], readerless, [1], "counts cannot be read: the file has no reader step"),
    ):
        out = tmp_path / case.replace(" ", "-")
        shutil.copytree(built_dataset, out)
        (out / "dataset.json").unlink()
        for pattern in gone:
            for path in out.glob(pattern):
                path.unlink()
        if damaged:
            damaged(out / stats1)
        result = build(cfg(out), log=lambda *a: None)
        report = validate_dataset(out, progress=False)
        assert not result.ok and not report.ok, (case, report.problems)
        said = [str(p) for p in report.problems]
        for t in tasks:
            assert any(f"task {t}'s {said_of}" in p for p in said), said
            assert any(f"delete logs/completions/{t:05d} and dataset.json" in p for p in said), said
            (out / "logs" / "completions" / f"{t:05d}").unlink()  # the fix it gives
        (out / "dataset.json").unlink()
        assert build(cfg(out), log=lambda *a: None).ok
        assert read_dataset_info(out)["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]
    # an excluded file cut short under the same rerun: a pyarrow traceback (review R18f 2)
    cut_out = tmp_path / "excluded-cut"
    shutil.copytree(built_dataset, cut_out)
    (cut_out / "dataset.json").unlink()
    excluded = min((cut_out / "excluded").glob("00000_*.parquet"))
    excluded.write_bytes(excluded.read_bytes()[:50])
    said = rf"^{re.escape(str(excluded))} is unreadable \(.*to rebuild its task, rm "
    with pytest.raises(BuildError, match=said):
        build(cfg(cut_out), log=lambda *a: None)
    # a rerun of the complete dataset that validates nothing said "validated it again" (R18c F3)
    lines: list[str] = []
    build(load_config(DataConfig, config, [f"output={out}", "build.validate=false"]), log=lines.append)
    assert lines[0] == f"{out} is already complete (same config); build.validate = false: not validated"


def test_counts_are_checked_past_a_task_that_read_nothing(build_fixture, tmp_path):
    """More tasks than input files: an empty task's reader stats hold no count, and the check of
    dataset.json's counts stopped there, so counts edited by hand validated (review R13h)."""
    _, _, config = build_fixture
    out = tmp_path / "ds"
    assert build(load_config(DataConfig, config, [f"output={out}", "build.tasks=3"]), log=lambda *a: None).ok
    info = out / "dataset.json"
    info.write_text(info.read_text().replace('"documents_read": ', '"documents_read": 1'))
    report = validate_dataset(out, progress=False)
    assert not report.ok and "edited since the build" in str(report.problems[0]), report.problems


def test_a_changed_input_is_said_decided_over_only_where_dedup_read_it():
    """[dedup]'s first pass had read task 0's file, not task 1's: the refusal said of both that dedup
    decided over the old file (review R13b F4)."""
    old = [{"file": "a.jsonl", "bytes": 10}, {"file": "b.jsonl.gz", "bytes": 20}]
    new = [{"file": "a.jsonl", "bytes": 11}, {"file": "b.jsonl.gz", "bytes": 21}]
    assert _input_changes(old, new, 2, set(), frozenset({0})) == [
        "input file a.jsonl: 10 → 11 bytes ([dedup] decided its duplicates over the old file)",
        "input file b.jsonl.gz: 20 → 21 bytes",
    ]


def test_a_replaced_input_is_refused_once_dedup_decided_over_its_old_contents(build_fixture, tmp_path):
    """With [dedup], a re-downloaded input was accepted while its task had not finished, and the dedup
    stages, already done, filtered its new text with decisions made on the old: a unique document
    dropped, a duplicate kept, exit 0 (review R6). Before dedup decided over it, it still is accepted."""
    _, _, config = build_fixture
    src, out = tmp_path / "src", tmp_path / "ds"
    src.mkdir()

    def write(name: str, salt: int = 1, cut: bool = False) -> None:
        text = "Doc {i} of {name}: rivers {r} and seas {s}. "
        lines = [
            json.dumps(
                {"text": text.format(i=i, name=name, r=i * 7919 % 1000, s=i * salt) * 8, "int_score": 4}
            )
            for i in range(60)
        ]
        data = zstandard.ZstdCompressor().compress("\n".join(lines).encode())
        (src / f"{name}.jsonl.zst").write_bytes(data[: len(data) // 2] if cut else data)

    write("a")
    write("b", cut=True)
    sets = [f"output={out}", "source.kind=jsonl", f"source.path={src}", "build.tasks=2", "build.workers=1"]
    cfg = load_config(DataConfig, config, [*sets, 'dedup.kind="exact"'])
    with pytest.raises(SourceError, match="re-download it under the same name"):
        build(cfg, log=lambda *a: None)  # the dedup pass reads b first: nothing decided over it
    write("b")
    lines = []
    assert build(cfg, log=lines.append).ok
    assert any("b.jsonl.zst" in line and "its task had not finished" in line for line in lines), lines

    write("b", salt=1001)  # as many documents, other text, and a task redone as `fix:` lines teach
    (out / "dataset.json").unlink()
    (out / "logs" / "completions" / "00001").unlink()
    with pytest.raises(
        BuildError, match=r"input file b\.jsonl\.zst: .* \(\[dedup\] decided its duplicates over"
    ):
        build(cfg, log=lambda *a: None)


def test_source_path_written_otherwise_is_the_same_build(build_fixture, tmp_path, monkeypatch):
    """`DIR/` or a relative spelling of the same folder was refused as a changed config, with the advice
    to `rm -rf` the build (review R6)."""
    _, _, config = build_fixture
    src, out = tmp_path / "src", tmp_path / "ds"
    src.mkdir()
    lines = [
        json.dumps({"text": f"Doc {i} about rivers, {i * i} of them. " * 8, "int_score": 4})
        for i in range(30)
    ]
    (src / "a.jsonl").write_text("\n".join(lines) + "\n")
    sets = [f"output={out}", "source.kind=jsonl", "build.tasks=1", "build.workers=1", 'dedup.kind="exact"']
    assert build(load_config(DataConfig, config, [*sets, f"source.path={src}"]), log=lambda *a: None).ok
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for spelled in (f"{src}/", "src", "./src/", "~/src"):  # [dedup] done: no input changed, nothing stale
        said = []
        assert build(load_config(DataConfig, config, [*sets, f"source.path={spelled}"]), log=said.append).ok
        assert any("the same folder, written otherwise; resuming" in line for line in said), said
    (tmp_path / "other").mkdir()
    shutil.copy(src / "a.jsonl", tmp_path / "other" / "a.jsonl")
    with pytest.raises(BuildError, match=r"changed: source\.path: "):  # another folder still is a change
        build(load_config(DataConfig, config, [*sets, "source.path=other"]), log=lambda *a: None)
