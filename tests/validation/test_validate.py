"""`gristmill data validate`: a clean dataset passes; every kind of damage fails naming shard and document
(or the tar sample holding it), in the current layout (gristmill-shards/3), the one before (/2) and the
legacy one (/1)."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.shard_writer import ShardWriter, finalize_dataset
from tests.helpers.legacy_dataset import LegacyShardWriter, finalize_legacy
from training.contract.dataset_format import (
    DATASET_JSON,
    DOC_RECORD,
    DOCUMENTS_SUM,
    FORMAT,
    FORMAT_V2,
    LEGACY_FORMAT,
    SAMPLE_DOCS,
    DatasetError,
    file_sha256,
    manifest_files,
    redo_task,
    sample_key,
    shard_files,
)
from validation.validate import VALIDATION_JSON, validate_dataset

VOCAB = 1000
SEP = 0
DOCS = 150  # per task: 3 samples (/2, /3), several shards each


def doc_ids(rng: np.random.Generator, position: str = "after") -> np.ndarray:
    ids = rng.integers(1, VOCAB, int(rng.integers(3, 300)), dtype=np.uint16)
    return np.concatenate([ids, [SEP]] if position == "after" else [[SEP], ids]).astype(np.uint16)


def make_dataset(
    root: Path, *, tasks: int = 2, docs: int = DOCS, position: str = "after", edit=None, fmt: str = FORMAT
) -> dict:
    """A small multi-shard dataset written by the real ShardWriter in layout `fmt` (/1: the legacy
    layout's writer); `edit(task, i, ids)` may damage a doc."""
    rng = np.random.default_rng(0)
    legacy = fmt == LEGACY_FORMAT
    for t in range(tasks):
        if legacy:
            w = LegacyShardWriter(root, t, vocab_size=VOCAB, target_bytes=4096 * 6)
        else:
            w = ShardWriter(root, t, vocab_size=VOCAB, target_bytes=4096, fmt=fmt)
        for i in range(docs):
            ids = doc_ids(rng, position)
            if edit is not None:
                ids = edit(t, i, ids)
            w.add(f"t{t}d{i}", ids, {"id": f"doc-{t}-{i}", "url": f"https://e.com/{t}/{i}", "dump": "CC-1"})
        w.close()
    (root / "tokenizer.json").write_text('{"fake": "tokenizer"}')
    sep = {"token": "<|endoftext|>", "id": SEP, "position": position}
    if legacy:
        return finalize_legacy(root, vocab_size=VOCAB, separator=sep, config_sha256="test")
    return finalize_dataset(
        root, vocab_size=VOCAB, separator=sep, config_sha256="test", extra={"format": fmt}
    )


def clean_dataset(tmp_path_factory, fmt: str) -> Path:
    """An undamaged dataset of layout `fmt`, for a module's tests to read (or copy, to damage)."""
    root = tmp_path_factory.mktemp(f"clean-{fmt.rpartition('/')[2]}") / "ds"
    make_dataset(root, fmt=fmt)
    return root


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return clean_dataset(tmp_path_factory, FORMAT)


@pytest.fixture(scope="module")
def clean_legacy(tmp_path_factory) -> Path:
    return clean_dataset(tmp_path_factory, LEGACY_FORMAT)


def private_copy(clean: Path, tmp_path: Path) -> Path:
    """A copy of a clean dataset for a test to damage."""
    shutil.copytree(clean, tmp_path / "ds")
    return tmp_path / "ds"


@pytest.fixture
def ds(clean, tmp_path) -> Path:
    return private_copy(clean, tmp_path)


@pytest.fixture
def legacy_ds(clean_legacy, tmp_path) -> Path:
    return private_copy(clean_legacy, tmp_path)


def problems(root: Path) -> list[str]:
    report = validate_dataset(root, progress=False)
    assert not report.ok and report.n_problems >= 1
    saved = json.loads((root / VALIDATION_JSON).read_text())
    assert saved["ok"] is False and saved["n_problems"] == report.n_problems
    return [str(p) for p in report.problems]


def rewrite_tar(
    shard: Path, edit, extra: tuple[str, bytes] | None = None
) -> list[tuple[tarfile.TarInfo, bytes]]:
    """Write `shard` again with each member's data `edit(name, data)` and one `extra` (name, data)
    member at the end, if given; returns the original members and their data."""
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
        for m, data in members:
            new = tarfile.TarInfo(m.name)
            data = edit(m.name, data)
            new.size = len(data)
            tf.addfile(new, io.BytesIO(data))
        if extra is not None:
            name, data = extra
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return members


def row_of(root: Path, key: str) -> dict:
    for path in manifest_files(root):
        for row in pq.read_table(path).to_pylist():
            if row["key"] == key:
                return row
    raise KeyError(key)


def test_clean_dataset_passes_and_writes_validation_json(clean, capsys):
    report = validate_dataset(clean, progress=False)
    info = json.loads((clean / "dataset.json").read_text())
    assert report.ok, report.problems
    assert (report.shards, report.documents, report.tokens) == (info["shards"], 2 * DOCS, info["tokens"])
    assert report.shards > 2 and report.separators == 2 * DOCS
    saved = json.loads((clean / VALIDATION_JSON).read_text())
    assert saved["ok"] is True and saved["documents"] == 2 * DOCS
    assert saved["fingerprint"] == info["fingerprint"]

    assert main(["data", "validate", str(clean), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "separators found" in out and "OK" in out


def test_before_position_passes(tmp_path):
    make_dataset(tmp_path / "b", tasks=1, position="before")
    assert validate_dataset(tmp_path / "b", progress=False).ok


def _one_bad_doc(tmp_path, bad_ids, position="after") -> tuple[list[str], str]:
    """Dataset with doc t1d7 replaced by bad_ids(ids); hashes agree, so only the tokens are wrong."""
    root = tmp_path / "bad"
    make_dataset(root, position=position, edit=lambda t, i, ids: bad_ids(ids) if (t, i) == (1, 7) else ids)
    return problems(root), row_of(root, "t1d7")["shard"]


@pytest.mark.parametrize(
    "bad, expect",
    [
        (lambda ids: np.append(ids, SEP), "doubled separator"),
        (lambda ids: ids[:-1], "missing separator"),
        (lambda ids: np.concatenate([[SEP], ids[:-1]]), "separator in the wrong position"),
        (lambda ids: np.append(ids[:-1], [VOCAB + 5, SEP]), "≥ vocab_size 1000"),
        # one separator, in its place, and nothing else: two side by side in the stream (RV50b F2)
        (lambda ids: ids[-1:], "the separator alone (1 token)"),
    ],
    ids=["doubled", "missing", "wrong-position", "id-over-vocab", "separator-alone"],
)
def test_token_problems_name_shard_and_document(tmp_path, bad, expect):
    found, shard = _one_bad_doc(tmp_path, bad)
    assert len(found) == 1, found
    assert f"shards/{shard}: document t1d7:" in found[0] and expect in found[0]


def test_separator_checked_against_before_policy(tmp_path):
    # an "after"-style document in a "before" dataset: one separator, wrong place
    found, shard = _one_bad_doc(tmp_path, lambda ids: np.append(ids[1:], SEP), position="before")
    n = row_of(tmp_path / "bad", "t1d7")["n_tokens"]
    assert found == [
        f"shards/{shard}: document t1d7: separator in the wrong position: at token {n - 1} of {n}, "
        "expected the first token (separator position 'before')"
    ]


def test_truncated_tar_legacy(legacy_ds):
    ds = legacy_ds
    row = row_of(ds, "t1d1")
    shard = ds / "shards" / row["shard"]
    shard.write_bytes(shard.read_bytes()[: row["offset"] + row["nbytes"] // 2])  # cut inside t1d1's tokens
    found = problems(ds)
    assert f"shards/{row['shard']}: document t1d1: member t1d1.ids is truncated" in " | ".join(found), found
    assert any(p.startswith(f"shards/{row['shard']}: size") for p in found)  # and its sha256 differs
    assert any(p.startswith(f"shards/{row['shard']}: sha256") for p in found)


def test_truncated_at_member_boundary_legacy(legacy_ds):
    ds = legacy_ds
    # tarfile itself ends quietly when a tar stops right after a member: we must not
    shard = shard_files(ds)[0]
    row = pq.read_table(manifest_files(ds)[0]).to_pylist()[0]
    data = shard.read_bytes()
    cut = row["offset"] + ((row["nbytes"] + 511) // 512) * 512  # end of the first doc's .ids data
    shard.write_bytes(data[:cut])
    found = problems(ds)
    assert (
        f"shards/{shard.name}: document {row['key']}: truncated: the file ends at byte {cut}, after this "
        "document's members, without the tar end-of-archive marker" in found
    ), found
    assert any(f"document {row['key']}: has a .ids member but no .json" in p for p in found), found


def test_corrupt_ids_bytes(ds):
    row = row_of(ds, "t0d3")
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    last = row["offset"] + row["nbytes"] - 2  # the separator token
    data[last : last + 2] = (7).to_bytes(2, "little")
    shard.write_bytes(bytes(data))
    found = problems(ds)
    assert any(p.startswith(f"shards/{row['shard']}: sha256") for p in found), found
    # with its repair, which verify and inspect point here for (none was said: trial RV67a F13)
    (line,) = [p for p in found if p.startswith(f"shards/{row['shard']}: sha256")]
    assert line.endswith(("it redoes task 00000 alone (the same shards) and finishes the dataset again",
                          "; rebuild the dataset")), line  # fmt: skip
    assert any(p.startswith(f"shards/{row['shard']}: document t0d3: missing separator") for p in found), found
    assert any("fingerprint recomputed" in p for p in found)


def test_a_verdict_that_cannot_be_written_leaves_no_earlier_record(ds, monkeypatch, capsys):
    """Review R20f 2: a disk too full for the new record kept the earlier "ok" one over damage this
    validation had just found, and the audit said ok. The earlier record is removed."""
    import validation.validate as validate_module

    assert validate_dataset(ds, progress=False).ok and (ds / VALIDATION_JSON).is_file()

    def full_disk(path, *a, **kw):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(validate_module, "write_atomic", full_disk)
    assert validate_dataset(ds, progress=False).ok  # an "ok" not written (a read-only dataset)
    assert (ds / VALIDATION_JSON).is_file()  # leaves the earlier record, which still describes it
    row = row_of(ds, "t0d3")
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"]] ^= 1
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert not validate_dataset(ds, progress=False, write=False).ok  # --no-write: kept, and said
    assert (ds / VALIDATION_JSON).is_file()
    assert "still says ok (--no-write), and readers and the audit go by it" in capsys.readouterr().err
    assert not validate_dataset(ds, progress=False).ok
    assert not (ds / VALIDATION_JSON).exists()
    assert "the earlier record, which said ok, was removed" in capsys.readouterr().err
    # a failure recorded, then the dataset repaired and an "ok" not written: the failure, which its
    # readers go by, went on refusing it, and the advice was to validate again (review R20h 4)
    monkeypatch.undo()
    assert not validate_dataset(ds, progress=False).ok and not _says_ok(ds)
    data[row["offset"]] ^= 1
    shard.write_bytes(bytes(data))
    monkeypatch.setattr(validate_module, "write_atomic", full_disk)
    assert validate_dataset(ds, progress=False).ok
    assert not (ds / VALIDATION_JSON).exists()
    assert "the earlier record, which said it failed, was removed" in capsys.readouterr().err


def _says_ok(ds) -> bool:
    return json.loads((ds / VALIDATION_JSON).read_text())["ok"]


def test_a_dataset_its_last_validation_failed_is_not_read_until_it_validates(ds):
    """A dataset in place is not hashed at every read: a damaged shard that validate had found was
    trained on, inspected (--hash) and evaluated, exit 0 (review R14c F1). Its readers now refuse it
    while its validation.json says it failed; repaired and validated again, it is read."""
    from training.data.reader import DocumentTable

    row = row_of(ds, "t0d3")
    shard = ds / "shards" / row["shard"]
    clean = shard.read_bytes()
    data = bytearray(clean)
    data[row["offset"]] ^= 1  # one bit of the document's first id
    shard.write_bytes(bytes(data))
    DocumentTable(ds)  # not hashed here: read as it is
    first = problems(ds)[0]
    with pytest.raises(DatasetError) as refused:
        DocumentTable(ds)
    assert str(refused.value).startswith(f"{ds / VALIDATION_JSON}: the last `gristmill data validate {ds}` (")
    assert f"problem(s) in it, the first: {first}; repair it" in str(refused.value)
    shard.write_bytes(clean)
    assert validate_dataset(ds, progress=False).ok
    DocumentTable(ds)
    # a problem in nothing the readers read (a stray temporary file) stops no training (R14f F7)
    (ds / "leftover.tmp").write_text("x")
    assert "stray temporary file" in problems(ds)[0]
    DocumentTable(ds)
    (ds / "leftover.tmp").unlink()
    (ds / "shards" / f"{row['shard']}.tmp").write_text("x")  # the shard writer's own (R14g F3)
    assert "stray temporary file" in problems(ds)[0]
    DocumentTable(ds)
    # its verdict edited into one that is neither: "yes" read as a pass whatever the problems said, and
    # a missing one too (review R21b)
    shard.write_bytes(bytes(data))
    assert not validate_dataset(ds, progress=False).ok
    failed = json.loads((ds / VALIDATION_JSON).read_text())
    for verdict in ({"ok": "yes"}, {"ok": None}, {}):
        report = {k: v for k, v in failed.items() if k != "ok"} | verdict
        (ds / VALIDATION_JSON).write_text(json.dumps(report))
        with pytest.raises(DatasetError) as refused:
            DocumentTable(ds)
        said = json.dumps(verdict.get("ok"))
        assert str(refused.value) == (
            f'{ds / VALIDATION_JSON}: its "ok" is {said}, neither true nor false: the report was edited '
            f"or damaged; validate the dataset again (`gristmill data validate {ds}`, which rewrites it)"
        )
    for cut in (json.dumps(failed)[:200], "[]"):  # cut short: read as no report at all (review R22a A1)
        (ds / VALIDATION_JSON).write_text(cut)
        with pytest.raises(DatasetError) as refused:
            DocumentTable(ds)
        said = str(refused.value)
        assert said.startswith(f"{ds / VALIDATION_JSON} cannot be read as a report ("), said
        assert said.endswith(
            f"; validate the dataset again (`gristmill data validate {ds}`, which rewrites it)"
        )
    (ds / VALIDATION_JSON).write_text(json.dumps({**failed, "fingerprint": "another dataset's"}))
    DocumentTable(ds)  # another dataset's report says nothing of this one


def test_corrupt_tar_header_legacy(legacy_ds):
    ds = legacy_ds
    rows = pq.read_table(manifest_files(ds)[0]).to_pylist()
    row, prev = next(
        (r, p) for p, r in zip(rows, rows[1:]) if r["shard"] == p["shard"]
    )  # not first in its tar
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] - 512 + 130] ^= 0xFF  # inside the .ids header (uid field): bad checksum
    shard.write_bytes(bytes(data))
    found = problems(ds)
    header = row["offset"] - 512
    assert (
        f"shards/{row['shard']}: document {prev['key']}: corrupt tar header at byte {header}, after this "
        in (" | ".join(found))
    ), found
    assert (
        f"shards/{row['shard']}: document {row['key']}: in the manifest but has no .ids member in this tar"
        in found
    )


def test_garbage_shard_is_a_problem_not_a_traceback(ds):
    shard = shard_files(ds)[0]
    shard.write_bytes(b"\x00\x01garbage" * 100)
    found = problems(ds)
    assert any(p.startswith(f"shards/{shard.name}: corrupt tar header at byte 0 (") for p in found), found


def edit_manifest_row(path: Path, column: str, delta: int) -> list[dict]:
    """Row 4 of the manifest file `path` with `delta` added to `column`, written back; its rows."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[4][column] += delta
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    return rows


@pytest.mark.parametrize("column, delta", [("offset", 512), ("n_tokens", 1), ("nbytes", -2)])
def test_edited_manifest_legacy(legacy_ds, column, delta):
    ds = legacy_ds
    path = manifest_files(ds)[1]
    rows = edit_manifest_row(path, column, delta)
    found = problems(ds)
    # The manifest file not the one dataset.json recorded, first: the problem of the shard, which is
    # the one recorded, is its own (review R31b F4); the loader index (derived from it) no longer matching.
    assert len(found) == 3, found
    assert found[0] == (
        f"{path.relative_to(ds)}: sha256 differs from dataset.json's record (changed since the build); "
        f"shard(s) {rows[4]['shard']} hash to dataset.json's record: the problems listed for them, found "
        "against its rows, are its own; rebuild the dataset"
    )
    assert found[1].startswith(f"shards/{rows[4]['shard']}: document {rows[4]['key']}: manifest says")
    assert found[2].startswith("index") and "rebuild" in found[2]


def test_a_legacy_manifest_s_source_fields_are_checked_against_the_json_members(legacy_ds):
    """/1 keeps each document's source fields twice: in its `.json` member and in its manifest row,
    which the audit answers from. Two rows' ids and urls swapped, with dataset.json's record of the
    manifest written to match (or a dataset from before that record): validate said OK, and `data
    convert` alone refused it (review RV51b F1). Now each row is named with both values."""
    ds = legacy_ds
    path = manifest_files(ds)[0]
    table = pq.read_table(path)
    rows = table.to_pylist()
    for field in ("id", "url"):
        rows[0][field], rows[1][field] = rows[1][field], rows[0][field]
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    info = json.loads((ds / DATASET_JSON).read_text())
    rel = str(path.relative_to(ds))
    info["files"][rel] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (ds / DATASET_JSON).write_text(json.dumps(info, indent=2))
    found = problems(ds)
    assert found == [
        f"shards/{r['shard']}: document {r['key']}: its manifest row says id {r['id']!r}, its .json member "
        f"{o['id']!r}"
        for r, o in ((rows[0], rows[1]), (rows[1], rows[0]))
    ], found


def test_edited_manifest_metadata(ds):
    """A column no structural check reads (a document's url) edited: dataset.json's record of the
    manifest's sha256 says so (issue 38: what a copy in a bucket is checked against)."""
    path = manifest_files(ds)[0]
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["url"] = "https://example.com/not-the-source"
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    assert problems(ds) == [
        f"{path.relative_to(ds)}: sha256 differs from dataset.json's record (changed since the build); "
        + redo_task("00000")
    ]
    # a stray copy of it under a task number the build never had: a stray's fix, not "redo task 00007",
    # listed first in the order found; its documents' duplicate keys keep their keys (review RV32e F4)
    stray = path.with_name("00007.parquet")
    shutil.copy(path, stray)
    found = problems(ds)
    assert found[:2] == [
        f"{stray.relative_to(ds)}: not recorded in dataset.json (added since the build?): the audit reads "
        "it; no build task wrote it: delete it",
        f"{path.relative_to(ds)}: sha256 differs from dataset.json's record (changed since the build); "
        + redo_task("00000"),
    ], found
    assert found[2:-1] == [
        f"{stray.relative_to(ds)}: document {r['key']}: duplicate manifest key (also in shard {r['shard']})"
        for r in rows
    ], found
    assert found[-1].startswith("index: cannot derive the index from the manifest: "), found
    # a stray of no task's name: listed first too, with a stray's fix (it was last: trial RV70g 3)
    copy = stray.with_name("00000 copy.parquet")
    stray.rename(copy)
    found = problems(ds)
    assert found[0] == (
        f"{copy.relative_to(ds)}: not recorded in dataset.json (added since the build?): the audit reads "
        "it; no build task wrote it: delete it"
    ), found


def test_a_file_dataset_json_does_not_record_or_its_record_deleted_is_a_problem(ds):
    """An excluded-documents file dropped in beside the build's (or its stats) is read by the audit as
    the dataset's; a dataset.json without its "files" entry checked none of them: both passed."""
    extra = ds / "excluded" / "00000_copy.parquet"
    extra.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": ["a"], "reason": ["r"]}), extra)
    assert problems(ds) == [
        "excluded/00000_copy.parquet: not recorded in dataset.json (added since the build?): "
        "the audit reads it"
    ]
    extra.unlink()
    # beside a decontamination index: no file the audit reads (it said it was: trial RV64b M5)
    stray = ds / "decontam" / "ngrams2.npy"
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"")
    found = problems(ds)
    said = "decontam/ngrams2.npy: not recorded in dataset.json (added since the build?): no file of the "
    assert said + "decontamination index" in found, found
    shutil.rmtree(stray.parent)
    info = json.loads((ds / "dataset.json").read_text())
    del info["files"]
    (ds / "dataset.json").write_text(json.dumps(info))
    assert problems(ds) == [
        'dataset.json: has no "files" entry, so its manifest, excluded documents and build records go '
        "unchecked (edited since the build?): restore it, or rebuild the dataset"
    ]


def test_manifest_row_missing_legacy(legacy_ds):
    ds = legacy_ds
    path = manifest_files(ds)[0]
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)
    row = table.slice(0, 1).to_pylist()[0]
    info = json.loads((ds / "dataset.json").read_text())
    n, t = info["documents"], info["tokens"]
    found = problems(ds)
    # the manifest not the one dataset.json records, first: the shard's problem is its own
    assert found[:2] == [
        f"{path.relative_to(ds)}: sha256 differs from dataset.json's record (changed since the build); "
        f"shard(s) {row['shard']} hash to dataset.json's record: the problems listed for them, found "
        "against its rows, are its own; rebuild the dataset",
        f"shards/{row['shard']}: document {row['key']}: in the tar but has no manifest row for this shard",
    ]
    # and the index derived from the manifest no longer matches dataset.json's totals
    assert found[2:] == [
        f"index: cannot derive the index from the manifest: {ds}: the manifests hold {n - 1} documents / "
        f"{t - row['n_tokens']} tokens but dataset.json records {n} / {t}; rebuild the dataset",
    ]


def test_deleted_shard(ds):
    shard = shard_files(ds)[2]
    shard.unlink()
    found = problems(ds)
    assert f"shards/{shard.name}: missing shard: listed in dataset.json but not on disk" in found
    assert any("manifest rows name a shard that is not on disk" in p for p in found)


def test_stray_shard_and_tmp_file(ds):
    shutil.copyfile(shard_files(ds)[0], ds / "shards" / "99999_00000.tar")
    (ds / "shards" / "00000_00099.tar.tmp").write_bytes(b"partial")
    found = problems(ds)
    assert "shards/99999_00000.tar: stray shard: on disk but not listed in dataset.json" in found
    assert any(p.startswith("shards/00000_00099.tar.tmp: stray temporary file") for p in found)


def test_a_link_to_itself_or_to_nowhere_in_shards_is_a_stray_not_a_traceback(ds):
    """A link to itself in shards/ was an OSError (ELOOP) traceback, exit 1 as FAILED is; a link to
    nowhere went unsaid (trial RV67a F12). Each is a stray shard, named."""
    (ds / "shards" / "loop.tar").symlink_to("loop.tar")
    (ds / "shards" / "extra.tar").symlink_to(ds / "nowhere")
    found = problems(ds)
    for name in ("loop.tar", "extra.tar"):
        assert f"shards/{name}: stray shard: on disk but not listed in dataset.json" in found, found


def test_non_tar_file_in_shards_is_flagged(ds):
    (ds / "shards" / "notes.txt").write_text("dropped here by hand")
    (ds / "shards" / "sub").mkdir()
    found = problems(ds)
    assert any(p.startswith("shards/notes.txt: stray file: not a shard") for p in found), found
    assert any(p.startswith("shards/sub: stray file: not a shard") for p in found), found


def test_leftover_of_a_killed_validation_is_not_a_problem(ds):
    # A kill between writing validation.json.tmp and renaming it: the next run must still pass.
    (ds / (VALIDATION_JSON + ".tmp")).write_text('{"ok": tr')
    report = validate_dataset(ds, progress=False)
    assert report.ok, [str(p) for p in report.problems]
    assert not (ds / (VALIDATION_JSON + ".tmp")).exists()
    assert json.loads((ds / VALIDATION_JSON).read_text())["ok"] is True


def test_edited_fingerprint_and_totals(ds):
    info = json.loads((ds / "dataset.json").read_text())
    info["fingerprint"] = "0" * 64
    info["tokens"] += 1
    (ds / "dataset.json").write_text(json.dumps(info))
    found = problems(ds)
    assert any(p.startswith("dataset.json: fingerprint 0000") and "edited" in p for p in found), found
    tokens = f"dataset.json: says tokens = {info['tokens']}, the shards hold {info['tokens'] - 1}"
    assert tokens in found, found  # "on disk" was said of a bucket's shards too (review RV42a L8)


def test_edited_shard_sha_in_dataset_json(ds):
    info = json.loads((ds / "dataset.json").read_text())
    name = sorted(info["shard_files"])[0]
    info["shard_files"][name]["sha256"] = "f" * 64
    (ds / "dataset.json").write_text(json.dumps(info))
    found = problems(ds)
    assert any(p.startswith(f"shards/{name}: sha256") for p in found), found
    assert any(p.startswith("dataset.json: fingerprint") for p in found)


def test_edited_documents_sum(ds):
    """index.documents_sha256_sum, covered by no fingerprint, decides whether two sources of a mixture
    are one corpus in another order (training/data/recipe.py): an edit is named, with its value back."""
    info = json.loads((ds / "dataset.json").read_text())
    right = info["index"][DOCUMENTS_SUM]
    info["index"][DOCUMENTS_SUM] = "0" * 64
    (ds / "dataset.json").write_text(json.dumps(info))
    assert problems(ds) == [
        f"index: dataset.json records {DOCUMENTS_SUM} {'0' * 16}…, the documents the manifest lists sum to "
        f"{right[:16]}…: dataset.json was edited after the build; set index.{DOCUMENTS_SUM} back to {right!r}"
    ]


def test_a_malformed_documents_sum_says_to_delete_the_key(ds):
    """A sum that is no sum refuses every reader: the repair is deleting the key (derived, so nothing is
    lost; `data index` records it again), not the rebuild (hours at scale) the other fields ask for."""
    info = json.loads((ds / "dataset.json").read_text())
    right = info["index"].pop(DOCUMENTS_SUM)
    (ds / "dataset.json").write_text(json.dumps({**info, "index": {**info["index"], DOCUMENTS_SUM: "XYZ"}}))
    found = problems(ds)
    assert len(found) == 1 and found[0].endswith(
        f"index.{DOCUMENTS_SUM} 'XYZ' is not 64 lowercase hex digits; delete the key (`gristmill data index "
        "DIR` records it again, summed from the dataset's documents)"
    ), found
    (ds / "dataset.json").write_text(json.dumps(info))  # the advice, followed
    assert main(["data", "index", str(ds)]) == 0
    assert json.loads((ds / "dataset.json").read_text())["index"][DOCUMENTS_SUM] == right


def test_tokenizer_mismatch(ds):
    (ds / "tokenizer.json").write_text('{"another": "tokenizer"}')
    assert problems(ds)[0].startswith("tokenizer.json: sha256")


def test_missing_dataset_json_and_cli_exit_codes(ds, capsys):
    (ds / "dataset.json").unlink()
    assert main(["data", "validate", str(ds), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "dataset.json:" in out and "not found" in out and "FAILED" in out
    assert main(["data", "validate", str(ds / "nope")]) == 2  # not a directory: one error line
    assert "is not a directory" in capsys.readouterr().err
    for workers in ("0", "-2"):  # taken as one process without a word (review R21b)
        assert main(["data", "validate", str(ds), "--no-write", "--workers", workers]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --workers {workers}: give the processes that check shards, ≥ 1\n", err


def test_parallel_workers_agree(ds):
    row = row_of(ds, "t1d3")
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] + row["nbytes"] - 2] = 9
    shard.write_bytes(bytes(data))
    one = validate_dataset(ds, progress=False, workers=1, write=False)
    two = validate_dataset(ds, progress=False, workers=2, write=False)
    assert [str(p) for p in one.problems] == [str(p) for p in two.problems] and not two.ok


def test_member_level_problems_legacy(legacy_ds):
    """Odd .ids length, invalid .json, a member of another kind: each named with its document."""
    ds = legacy_ds
    shard = shard_files(ds)[0]
    with tarfile.open(shard) as tf:
        keys = sorted({m.name.split(".")[0] for m in tf.getmembers()})
    bad = {f"{keys[0]}.ids": lambda d: d[:-1], f"{keys[1]}.json": lambda d: b'{"id": "\xff\xfe"}'}
    members = rewrite_tar(shard, lambda name, d: bad.get(name, lambda d: d)(d), (f"{keys[1]}.txt", b"hi"))
    found = problems(ds)
    where = f"shards/{shard.name}: document"
    assert (
        f"{where} {keys[0]}: .ids has {len(members[0][1]) - 1} bytes, not a multiple of the uint16 size 2"
        in found
    )
    assert any(p.startswith(f"{where} {keys[1]}: .json is not valid UTF-8") for p in found), found
    assert (
        f"{where} {keys[1]}: unexpected tar member '{keys[1]}.txt' (expected <key>.ids or <key>.json)"
        in found
    )


def test_built_dataset_validates(built_dataset):
    """The real build's output passes, and the counts are the ones dataset.json claims."""
    report = validate_dataset(built_dataset, progress=False, write=False)
    info = json.loads((built_dataset / "dataset.json").read_text())
    assert report.ok, report.problems
    assert (report.shards, report.documents, report.tokens) == (
        info["shards"],
        info["documents"],
        info["tokens"],
    )
    assert report.separators == report.documents


def test_a_vocab_size_other_than_the_tokenizer_s_is_a_problem(built_dataset, tmp_path):
    """Every id check trusts dataset.json's vocab_size, which the fingerprint does not cover: it is
    held to the tokenizer the dataset was built with (highest id + 1). A build that counted tokens
    instead (before 2026-11-29) recorded too small a size, and under uint16 wrapped the ids past it."""
    ds = tmp_path / "ds"
    shutil.copytree(built_dataset, ds)
    info = json.loads((ds / "dataset.json").read_text())
    real = info["vocab_size"]
    (ds / "dataset.json").write_text(json.dumps({**info, "vocab_size": real + 1000}))
    assert problems(ds) == [
        f"dataset.json: says vocab_size = {real + 1000}, but tokenizer.json's highest id + 1 is {real}; "
        "rebuild the dataset (a dataset built before 2026-11-29 from a tokenizer whose ids have gaps may "
        "hold wrapped ids)"
    ]


def test_a_vocab_size_other_than_the_tokenizer_s_is_refused_by_the_loader_too(built_dataset, tmp_path):
    """Training sized its model from dataset.json and read the ids without a word (only `data validate`
    held vocab_size to the tokenizer): a dataset whose ids may be wrapped (its vocab_size below its
    tokenizer's ids) trained, and its export failed in transformers. The loader refuses it at the
    open, in one line naming both. So is one above what the tokenizer can have (its model's ids and
    one more per added token the model lacks): the run trained a larger model than the dataset's, exit
    0 (trial RV60a 1)."""
    from training.contract.dataset_format import DatasetError
    from training.data.loader import dataset_loader

    ds = tmp_path / "ds"
    shutil.copytree(built_dataset, ds)
    info = json.loads((ds / "dataset.json").read_text())
    real = info["vocab_size"]
    (ds / "dataset.json").write_text(json.dumps({**info, "vocab_size": real // 2}))
    says = rf"says vocab_size = {real // 2}, but .*tokenizer.json's vocabulary has ids up to {real - 1}: the"
    with pytest.raises(DatasetError, match=says):
        dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)
    # up by one: its added tokens are in its vocabulary, none takes a new id (each counted as one
    # that might passed it: trial RV61g F2)
    for up in (1000, 1):
        (ds / "dataset.json").write_text(json.dumps({**info, "vocab_size": real + up}))
        says = (
            rf"says vocab_size = {real + up}, but .*tokenizer.json has at most {real} ids: dataset.json was"
        )
        with pytest.raises(DatasetError, match=says):
            dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)
    (ds / "dataset.json").write_text(json.dumps(info))
    dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)


MISTYPED = [
    ("vocab_size", "1000", "vocab_size '1000' is not an integer"),
    ("shard_files", [], "shard_files must map each shard name"),
    ("shard_files", {"00000_00000.tar": "x"}, "shard_files must map each shard name"),
    ("files", "x", "files must map each path to {bytes, sha256}"),
    ("files", {"manifest/00000.parquet": "x"}, "files must map each path to {bytes, sha256}"),
    ("index", "x", "index must hold files"),
    ("separator", "x", "separator 'x' needs an int 'id'"),
    ("tokenizer_sha256", 5, "tokenizer_sha256 5 is not a string"),
    ("converted_from", {"fingerprints": "ab"}, "converted_from must hold fingerprints"),
    ("excluded_by_filter", "8", "excluded_by_filter must map each filter's name to a count"),
    ("decontaminate", {"index_sha256": 8.5, "ngram": 13}, "decontaminate must hold index_sha256 (a string)"),
]


@pytest.mark.parametrize("field, value, expect", MISTYPED)
def test_mistyped_dataset_json_is_a_problem_not_a_traceback(ds, field, value, expect):
    """validate names the key, and so does every reader, in one line: `"files": "x"`, an index
    entry or a tokenizer_sha256 of the wrong type were tracebacks (AttributeError, TypeError) in
    validate, and `"vocab_size": "8"` one in the loader (TypeError: '<=' not supported)."""
    info = json.loads((ds / "dataset.json").read_text())
    info[field] = value
    (ds / "dataset.json").write_text(json.dumps(info))
    found = problems(ds)
    assert f"dataset.json: {expect}" in found[0] and "rebuild the dataset" in found[0], found
    from training.data.loader import dataset_loader

    with pytest.raises(DatasetError, match=rf"dataset\.json: {re.escape(expect)}.*; restore the file"):
        dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)


@pytest.mark.parametrize("dtype", ["uint32", "8", []])
def test_an_index_file_recorded_with_another_dtype_is_refused_by_readers_and_validate(ds, dtype, capsys):
    """The fingerprint covers the index files' hashes, not their dtypes: sample_digest.bin recorded as
    uint32 was read as twice as many digests without a word, a list was a TypeError, and validate said
    ok to both (review R21a 1). Readers know each file's dtype; validate compares the record with the
    index the manifest implies."""
    from training.data.loader import dataset_loader

    info = json.loads((ds / "dataset.json").read_text())
    info["index"]["files"]["sample_digest.bin"]["dtype"] = dtype
    (ds / "dataset.json").write_text(json.dumps(info))
    found = problems(ds)
    edited = "dataset.json was edited after the build; set "
    assert any(
        p.startswith("index/sample_digest.bin: dataset.json records dtype ")
        and p.endswith(f"the index the manifest implies has 'uint64': {edited}it back to 'uint64'")
        for p in found
    ), found
    (ds / VALIDATION_JSON).unlink()  # the loader's own check, not the record's refusal
    fix = re.escape(f"{edited}index.files['sample_digest.bin'].dtype back to 'uint64' there")
    with pytest.raises(
        DatasetError, match=rf"index file sample_digest\.bin has dtype .*, not 'uint64': {fix}$"
    ):
        dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)
    info["index"]["files"]["sample_digest.bin"]["dtype"] = "uint64"  # the advice, followed: it loads again
    (ds / "dataset.json").write_text(json.dumps(info))
    dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)
    info["index"]["files"]["sample_digest.bin"]["dtype"] = dtype
    (ds / "dataset.json").write_text(json.dumps(info))
    # `data index` (what the advice said before) cannot repair it: it says why, not "215 ≠ 215" (R21e 3)
    capsys.readouterr()
    assert main(["data", "index", str(ds)]) == 2
    err = capsys.readouterr().err
    assert "has dtype" in err and "not 'uint64'" in err and err.count(edited) == 1, err
    assert "documents" not in err, err  # not "lists 215 documents … holds 215 documents" (R21f 2e)


@pytest.mark.parametrize(
    "column, to", [("n_tokens", pa.float64()), ("offset", pa.string()), ("sha256", pa.string())]
)
def test_a_manifest_column_of_another_type_is_named_not_a_traceback(ds, column, to):
    """A manifest column rewritten with another type (float n_tokens, string offsets or sha256s) was
    a TypeError or ValueError traceback in validate (and a build's rerun), or blamed the shards
    (review R21b F9, F6): the file and the column are named."""
    path = sorted((ds / "manifest").glob("*.parquet"))[0]
    t = pq.read_table(path)
    i = t.schema.get_field_index(column)
    t = t.set_column(
        i,
        column,
        t.column(column).cast(to)
        if column != "sha256"
        else pa.array([b.hex() for b in t.column(column).to_pylist()]),
    )
    pq.write_table(t, path)
    found = problems(ds)
    assert f"manifest/{path.name}: column {column} holds {to}, not the build's " in " | ".join(found), found
    assert not [p for p in found if "could not be checked" in p], found  # no shard blamed for it


def test_validate_of_a_directory_that_is_no_dataset_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A run directory or a parent passed by mistake got a FAILED report, and a validation.json written
    into it (review R21b F7)."""
    run, half = tmp_path / "run", tmp_path / "half"  # half: a data build that stopped before its shards
    for d in (run, half):
        d.mkdir()
        (d / "config.toml").write_text("")
    (half / "build.json").write_text("{}")
    (half / "shards").mkdir()  # a build stopped after its first shards: no report written either (R21f 2c)
    for where, said in (
        (run, " (a training run: validate the dataset its config.toml names)"),
        (tmp_path, ""),
    ):
        assert main(["data", "validate", str(where), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"error: {where} holds no dataset.json, shards/ or manifest/: not a gristmill dataset{said}; "
            "pass a dataset directory built by `gristmill data build`, or an s3:// URL of one"
        )
        assert not (where / VALIDATION_JSON).exists()
    assert main(["data", "validate", str(half), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {half} holds build.json but no dataset.json: a data build that did not finish, or is still "
        "running (wait for it to end, or rerun the same `gristmill data build` command); validate the "
        "dataset once it is built"
    )
    assert not (half / VALIDATION_JSON).exists()


def test_json_nested_too_deep_to_decode_is_one_line_not_a_traceback(ds):
    """json.loads raises RecursionError (no ValueError) for arrays nested ~100,000 deep: in
    dataset.json it was validate's and every reader's traceback; in validation.json the loader's."""
    from training.data.loader import dataset_loader

    def load():
        return dataset_loader(ds, seq_len=16, global_batch=2, micro_batch=2, seed=0)

    deep = "[" * 100_000 + "]" * 100_000
    good = (ds / "dataset.json").read_text()
    (ds / VALIDATION_JSON).write_text(deep)
    # an unreadable record of a validation may have said it failed: one line (it was read as none,
    # which a failed verdict cut short also was: review R22a A1)
    with pytest.raises(DatasetError, match=r"validation\.json cannot be read as a report \(RecursionError"):
        load()
    (ds / VALIDATION_JSON).unlink()
    (ds / "dataset.json").write_text(deep)
    found = problems(ds)
    assert "dataset.json is not valid JSON (maximum recursion depth" in found[0], found
    with pytest.raises(DatasetError, match=r"dataset\.json is not valid JSON \(maximum recursion"):
        load()
    (ds / "dataset.json").write_text(good)


@pytest.mark.parametrize("key", ["bytes", "documents", "tokens"])
def test_a_shard_entry_without_its_counts_is_a_problem_not_a_traceback(ds, key):
    """The fingerprint covers each shard's sha256 only: an entry that lost a count was a KeyError."""
    info = json.loads((ds / "dataset.json").read_text())
    name = sorted(info["shard_files"])[0]
    del info["shard_files"][name][key]
    (ds / "dataset.json").write_text(json.dumps(info))
    found = problems(ds)
    assert "dataset.json: shard_files must map each shard name" in found[0], found


# --------------------------------------------------------------------------------------------
# the current layout's own damage: samples of documents back to back, a sha256 per document


def sample_of(row: dict) -> str:
    """The key of the tar sample holding a manifest row's document (SAMPLE_DOCS per sample)."""
    task, i = int(row["key"][1:].split("d")[0]), int(row["key"].split("d")[1])
    return sample_key(task, i // SAMPLE_DOCS)


def test_truncated_tar(ds):
    row = row_of(ds, "t1d70")  # inside the second sample of task 1
    shard = ds / "shards" / row["shard"]
    shard.write_bytes(shard.read_bytes()[: row["offset"] + row["nbytes"] // 2])  # cut inside its tokens
    found = " | ".join(problems(ds))
    where = f"shards/{row['shard']}: sample {sample_of(row)}"
    assert f"{where}: member {sample_of(row)}.ids is truncated" in found, found
    assert (
        f"shards/{row['shard']}: document t1d70: in the manifest at byte {row['offset']}, where no " in found
    )
    assert f"shards/{row['shard']}: size" in found and f"shards/{row['shard']}: sha256" in found


def test_truncated_at_sample_boundary(ds):
    # tarfile itself ends quietly when a tar stops right after a member: we must not
    shard = shard_files(ds)[0]
    rows = pq.read_table(manifest_files(ds)[0]).to_pylist()
    first = [r for r in rows if r["shard"] == shard.name][:SAMPLE_DOCS]
    end = first[-1]["offset"] + first[-1]["nbytes"]
    cut = end + -end % 512  # the end of the first sample's data
    shard.write_bytes(shard.read_bytes()[:cut])
    found = problems(ds)
    assert (
        f"shards/{shard.name}: sample {sample_of(first[0])}: truncated: the file ends at byte {cut}, after "
        "this sample's members, without the tar end-of-archive marker" in found
    ), found


def test_corrupt_sample_header(ds):
    rows = pq.read_table(manifest_files(ds)[0]).to_pylist()
    row = rows[SAMPLE_DOCS]  # the first document of task 0's second sample
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] - 512 + 130] ^= 0xFF  # inside the sample's header (uid field): bad checksum
    shard.write_bytes(bytes(data))
    found = " | ".join(problems(ds))
    assert f"corrupt tar header at byte {row['offset'] - 512}" in found, found
    assert f"document {row['key']}: in the manifest at byte {row['offset']}, where no sample" in found


@pytest.mark.parametrize("column, delta", [("offset", 2), ("n_tokens", 1), ("nbytes", -2)])
def test_edited_manifest(ds, column, delta):
    path = manifest_files(ds)[1]
    rows = edit_manifest_row(path, column, delta)
    found = problems(ds)
    # The shard's problem (the rows no longer split its samples), the loader index (derived from the
    # manifest) no longer derivable or matching, and the manifest not the one dataset.json recorded.
    assert any(p.startswith(f"shards/{rows[4]['shard']}: ") for p in found), found
    assert any(p.startswith("index") for p in found), found
    assert found[0].startswith(
        f"{path.relative_to(ds)}: sha256 differs from dataset.json's record (changed since the build); "
        f"shard(s) {rows[4]['shard']}"
    ), found
    assert found[0].endswith(redo_task("00001")), found


def test_manifest_row_missing(ds):
    path = manifest_files(ds)[0]
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)
    row, last = (table.slice(i, 1).to_pylist()[0] for i in (0, SAMPLE_DOCS - 1))
    found = problems(ds)
    assert found[0].startswith(f"{path.relative_to(ds)}: sha256 differs from dataset.json's record"), found
    assert found[1] == (
        f"shards/{row['shard']}: sample {sample_of(row)}: bytes {row['offset']}–"
        f"{last['offset'] + last['nbytes']} of the sample's data belong to no manifest row (the "
        "manifest's rows of this shard do not describe it: rebuilt, or the manifest was edited)"
    ), found
    assert any(p.startswith("index: cannot derive the index from the manifest") for p in found), found


def test_document_hash_names_the_document(ds):
    """A flipped byte in a document's ids (separator untouched): its sha256 says which document."""
    row = row_of(ds, "t0d100")
    shard = ds / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"]] ^= 0x01
    shard.write_bytes(bytes(data))
    found = problems(ds)
    assert (
        f"shards/{row['shard']}: document t0d100: its ids do not hash to the manifest's sha256 (damaged or "
        "replaced)" in found
    ), found


def test_sample_level_problems(ds):
    """An odd .ids length and a member of another kind: each named with its sample."""
    shard = shard_files(ds)[0]
    with tarfile.open(shard) as tf:
        key = tf.getmembers()[0].name.split(".")[0]
    members = rewrite_tar(
        shard, lambda name, d: d[:-1] if name.endswith(".ids") else d, (f"{key}.json", b"{}")
    )
    found = problems(ds)
    where = f"shards/{shard.name}: sample {key}"
    assert f"{where}: .ids has {len(members[1][1]) - 1} bytes, not a multiple of the uint16 size 2" in found
    assert f"{where}: unexpected tar member '{key}.json' (expected <key>.docs or <key>.ids)" in found, found


def test_legacy_dataset_validates(clean_legacy):
    report = validate_dataset(clean_legacy, progress=False, write=False)
    assert report.ok, report.problems
    assert report.documents == 2 * DOCS and report.shards > 2


# --------------------------------------------------------------------------------------------
# /3's `.docs` records: each document's n_tokens and sha256 in front of its sample's ids


def docs_member(shard: Path, row: dict) -> tuple[str, int, int]:
    """(sample key, data offset, size) of the `.docs` member of the sample holding `row`, by tarfile."""
    key = sample_of(row)
    with tarfile.open(shard) as tf:
        m = tf.getmember(f"{key}.docs")
    return key, m.offset_data, m.size


def flip(shard: Path, at: int) -> None:
    data = bytearray(shard.read_bytes())
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))


def doc_problems(found: list[str]) -> list[str]:
    """The lines but the shard's size and sha256 against dataset.json's, and the fingerprint recomputed
    from them (any edit of a shard changes those)."""
    return [p for p in found if not p.startswith("dataset.json: fingerprint") and not _shard_hash_line(p)]


def _shard_hash_line(line: str) -> bool:
    return line.startswith("shards/") and line.split(": ", 1)[1].startswith(("sha256 ", "size "))


@pytest.mark.parametrize("field, at", [("n_tokens", 0), ("sha256", 4 + 17)])
def test_docs_record_damage_names_shard_sample_and_row(ds, field, at):
    """A flipped byte in a record's length or hash (the ids untouched): one line naming the shard, the
    sample and the manifest row."""
    row = row_of(ds, "t1d70")  # the 7th document of task 1's second sample
    shard = ds / "shards" / row["shard"]
    key, offset, size = docs_member(shard, row)
    assert size == DOC_RECORD * SAMPLE_DOCS
    flip(shard, offset + DOC_RECORD * 6 + at)
    (line,) = doc_problems(problems(ds))
    n, sha = row["n_tokens"], row["sha256"].hex()[:16]
    bad_n = n ^ 1 if field == "n_tokens" else n
    bad_sha = bytearray(row["sha256"])
    if field == "sha256":
        bad_sha[17] ^= 0x01
    assert line == (
        f"shards/{row['shard']}: sample {key}: .docs record 6 (n_tokens {bad_n}, sha256 "
        f"{bytes(bad_sha).hex()[:16]}…) is not manifest row t1d70 (n_tokens {n}, sha256 {sha}…): the "
        "records were damaged or the manifest edited"
    )


def test_docs_member_of_the_wrong_size(ds):
    """A record short: (still inside the member's padding, so every offset stays) one line naming the
    shard, the sample and its manifest rows."""
    row = row_of(ds, "t0d64")  # the first document of task 0's second sample
    shard = ds / "shards" / row["shard"]
    key, _, size = docs_member(shard, row)
    rewrite_tar(shard, lambda name, d: d[:-DOC_RECORD] if name == f"{key}.docs" else d)
    (line,) = doc_problems(problems(ds))
    assert line == (
        f"shards/{row['shard']}: sample {key}: .docs has {size - DOC_RECORD} bytes, not 36 × the 64 "
        "documents the manifest places in the sample (rows t0d64…t0d127): its records do not describe "
        "its documents"
    )


def test_docs_member_must_come_right_before_its_ids(ds):
    shard = shard_files(ds)[0]
    with tarfile.open(shard) as tf:
        members = [(m, tf.extractfile(m).read()) for m in tf.getmembers()]
    key = members[0][0].name.split(".")[0]
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
        for m, data in [members[1], members[0], *members[2:]]:  # .ids, then .docs
            tf.addfile(m, io.BytesIO(data))
    found = doc_problems(problems(ds))
    assert (
        f"shards/{shard.name}: sample {key}: its .docs member does not come right before its .ids member"
        in found
    )


@pytest.fixture(scope="module")
def clean_v2(tmp_path_factory) -> Path:
    return clean_dataset(tmp_path_factory, FORMAT_V2)


def test_v2_dataset_validates_and_its_damage_is_found(clean_v2, tmp_path):
    report = validate_dataset(clean_v2, progress=False, write=False)
    assert report.ok, report.problems
    assert report.documents == report.separators == 2 * DOCS and report.shards > 2
    with tarfile.open(shard_files(clean_v2)[0]) as tf:
        assert all(m.name.endswith(".ids") for m in tf.getmembers())  # no .docs members
    ds = private_copy(clean_v2, tmp_path)
    row = row_of(ds, "t0d100")
    flip(ds / "shards" / row["shard"], row["offset"])
    assert (
        f"shards/{row['shard']}: document t0d100: its ids do not hash to the manifest's sha256 (damaged or "
        "replaced)" in problems(ds)
    )
