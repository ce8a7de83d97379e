"""`gristmill data convert OLD NEW`: a dataset of an older layout (gristmill-shards/1 or /2) rewritten in
the current one (/3) with the same documents in the same rows and shards, so the same batches; a run
trained on OLD resumes on NEW; OLD is never changed."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.distributed.checkpoint as dcp

from pipelines.cli import main as gristmill
from pipelines.convert import convert_dataset
from tests.helpers import forked
from tests.helpers.legacy_dataset import older_index, write_legacy_dataset, write_v2_dataset
from tests.helpers.mounts import unshare_works
from tests.helpers.train_data import affine_documents
from tests.helpers.train_runs import ENV, ROOT, TINY, losses, one_error_line, overrides
from training.contract.dataset_format import (
    DATASET_JSON,
    FORMAT,
    FORMAT_V2,
    LEGACY_FORMAT,
    DatasetError,
    file_sha256,
    fingerprint,
    layout_offsets,
    read_dataset_info,
    same_data,
)
from training.contract.dataset_index import damaged_files
from training.contract.run_layout import CONFIG_TOML, DATA_PLAN_JSON, checkpoint_dir
from training.data.loader import batch_sha256, dataset_loader
from training.train import load_train_config, train

pytestmark = pytest.mark.process  # starts processes (a mount namespace): the second tier of `make test`


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy") / "old"
    write_legacy_dataset(root, affine_documents(300), vocab_size=256, target_bytes=64 << 10)
    return root


def convert(old, tmp_path_factory):
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    new = tmp_path_factory.mktemp("converted") / "new"
    lines: list[str] = []
    convert_dataset(str(old), str(new), log=lines.append)
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before  # OLD untouched
    assert "the same batches" in lines[-1] and "validated" in lines[-1]
    assert f" into {new} (" in lines[-1]  # where it is, not the folder it was written in (review R13b F6)
    assert json.loads((new / "validation.json").read_text())["root"] == str(new)  # not the folder (R26c m2)
    return new


@pytest.fixture(scope="module")
def converted(legacy, tmp_path_factory):
    return convert(legacy, tmp_path_factory)


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    root = tmp_path_factory.mktemp("v2") / "old"
    # 300 documents in shards of a few samples, the last one short
    write_v2_dataset(root, affine_documents(300), vocab_size=256, target_bytes=24 << 10)
    return root


@pytest.fixture(scope="module")
def converted_v2(v2, tmp_path_factory):
    return convert(v2, tmp_path_factory)


def hashes(location, n: int = 60, **kw) -> list[str]:
    loader = dataset_loader(location, seq_len=64, global_batch=8, micro_batch=4, seed=3, **kw)
    return [batch_sha256(b) for _, b in zip(range(n), loader)]


def test_converted_dataset_gives_the_same_batches(legacy, converted, capsys):
    old, new = read_dataset_info(legacy), read_dataset_info(converted)
    assert (old["format"], new["format"]) == (LEGACY_FORMAT, FORMAT)
    assert (new["documents"], new["tokens"]) == (old["documents"], old["tokens"])
    assert new["converted_from"] == {"format": LEGACY_FORMAT, "fingerprints": [old["fingerprint"]]}
    for vf in (0.0, 0.05):  # across epoch ends (≈100 steps an epoch), with and without a held-out split
        assert hashes(converted, 120, val_fraction=vf) == hashes(legacy, 120, val_fraction=vf)
    assert hashes(converted, 5, val_fraction=0.05, split="val") == hashes(
        legacy, 5, val_fraction=0.05, split="val"
    )
    # The command line: `data inspect --hash` of both prints the same per-step hashes.
    geometry = ["--seq-len", "64", "--global-batch", "8", "--seed", "3", "--hash", "--end", "20"]
    outs = []
    for root in (legacy, converted):
        assert gristmill(["data", "inspect", str(root), *geometry]) == 0
        outs.append(capsys.readouterr().out.splitlines()[1:])
    assert outs[0] == outs[1] and len(outs[0]) == 19  # steps 1..19 (--end is exclusive)


def test_converted_dataset_keeps_the_metadata(legacy, converted):
    import pyarrow.parquet as pq

    old = pq.read_table(sorted((legacy / "manifest").glob("*.parquet"))[0]).to_pylist()
    new = pq.read_table(sorted((converted / "manifest").glob("*.parquet"))[0]).to_pylist()
    assert [(r["key"], r["id"], r["n_tokens"]) for r in old] == [
        (r["key"], r["id"], r["n_tokens"]) for r in new
    ]


def test_a_run_on_the_old_dataset_resumes_on_the_converted_one(legacy, converted, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train(load_train_config(TINY, overrides(legacy, whole)))
    train(load_train_config(TINY, overrides(legacy, resumed, "run.max_steps=8")))  # checkpoint at step 8
    sets = overrides(converted, resumed, 'checkpoint.resume="auto"')
    train(load_train_config(TINY, sets))
    assert losses(resumed) == losses(whole)  # bit for bit (run.threads 1)


def test_convert_refuses_what_it_cannot_do(legacy, converted, tmp_path, capsys):
    for argv, said in [([str(legacy), ""], 'NEW ""'), (["", str(tmp_path / "x")], 'OLD ""')]:
        assert gristmill(["data", "convert", *argv]) == 2  # `error:  names no directory …` (RV54a 11)
        assert capsys.readouterr().err == f"error: {said}: name a path\n"
    with pytest.raises(
        DatasetError, match="is already a gristmill-shards/3 dataset, the current layout: nothing"
    ):
        convert_dataset(str(converted), str(tmp_path / "again"), log=lambda *a: None)
    with pytest.raises(DatasetError, match="exists and is not empty") as e:
        convert_dataset(str(legacy), str(converted), log=lambda *a: None)
    assert str(e.value).endswith(f"'s fingerprint): nothing to redo, train from {converted}"), (
        e.value
    )  # RV60g F3
    # one that lost a shard since is not "nothing to redo" (trial RV67b F6)
    copy = tmp_path / "copy"
    shutil.copytree(converted, copy)
    gone = sorted((copy / "shards").iterdir())[1]
    gone.unlink()
    with pytest.raises(DatasetError, match=f"finished, but {copy} lacks shards/{gone.name} .*delete {copy}"):
        convert_dataset(str(legacy), str(copy), log=lambda *a: None)
    # a file, a link or a folder inside OLD as NEW: one line before any work (a traceback, a traceback
    # after the whole conversion, and NEW written into OLD: review R17b M2)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-link").symlink_to(tmp_path / "empty", target_is_directory=True)
    (tmp_path / "empty").mkdir()
    for new, what in [("a-file", "is a file"), ("a-link", "is a link")]:
        with pytest.raises(DatasetError, match=f"^{tmp_path / new} {what}: name a new directory"):
            convert_dataset(str(legacy), str(tmp_path / new), log=lambda *a: pytest.fail("converted"))
    for new in (".", "/"):  # Path.with_name's ValueError, a traceback (session 38's trial)
        with pytest.raises(DatasetError, match=f"^{new} names no directory of its own"):
            convert_dataset(str(legacy), new, log=lambda *a: pytest.fail("converted"))
    with pytest.raises(DatasetError, match=f"^{legacy / 'sub'} is inside {legacy}: convert into"):
        convert_dataset(str(legacy), str(legacy / "sub"), log=lambda *a: pytest.fail("converted"))
    edited = tmp_path / "edited"
    shutil.copytree(legacy, edited)
    info = json.loads((edited / "dataset.json").read_text())
    info["separator"]["position"] = "before"
    (edited / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="dataset.json was edited"):
        convert_dataset(str(edited), str(tmp_path / "out"), log=lambda *a: None)
    damaged = tmp_path / "damaged"
    shutil.copytree(legacy, damaged)
    shard = sorted((damaged / "shards").glob("*.tar"))[1]
    body = bytearray(shard.read_bytes())
    body[700] ^= 1
    shard.write_bytes(bytes(body))
    with pytest.raises(DatasetError, match=f"{shard}: not the shard dataset.json records"):
        convert_dataset(str(damaged), str(tmp_path / "out2"), log=lambda *a: None)


@pytest.mark.skipif(not unshare_works(), reason="needs a mount namespace (unshare -rm) for a small tmpfs")
def test_convert_into_a_mount_point_or_too_small_a_disk_is_one_line_before_any_work(legacy, tmp_path):
    """NEW a mount point: the conversion, written beside it and validated, was lost when its rename into
    place failed (EBUSY, a traceback); a disk too small: an OSError traceback after ~170 shards (trial
    RV54a 3, 4). Each is one line before any shard is written."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for new, said in [
        (mnt, f"{mnt} is a mount point: the conversion writes NEW beside it and renames it into place, "
              "which a mount point cannot be; convert into a new directory inside it, e.g. "
              f"{mnt / 'converted'}"),
        (mnt / "converted", f"not enough free disk under {mnt / '.converted.converting'} to write the "
                            f"converted {legacy}: "),
    ]:  # fmt: skip
        mount = f"mount -t tmpfs -o size=16k tmpfs {mnt}"
        cmd = [sys.executable, "-m", "tests.helpers.mounts", mount, "", "pipelines.cli", "data", "convert"]
        done = forked.run([*cmd, str(legacy), str(new)], cwd=ROOT, env=ENV, timeout=120)
        err = done.stderr.strip()
        assert done.returncode == 2 and err.startswith(f"error: {said}") and "\n" not in err, err


def test_the_room_convert_asks_for_is_at_least_what_new_takes(legacy, v2, tmp_path):
    """The free disk convert checks for before any work is at least NEW's size, also for short documents
    in small shards, where a shard's tar end and each document's records outweigh the tokens (712 KB
    against an estimate of 387 KB: trial RV77a 4); and not so far above it that an honest disk is refused."""
    from pipelines.convert import converted_size

    short = tmp_path / "short"
    write_legacy_dataset(
        short,
        (np.append(ids[:2], ids[-1]) for ids in affine_documents(600)),
        vocab_size=256,
        target_bytes=2 << 10,
    )
    for old in (legacy, v2, short):
        new = tmp_path / f"new-{old.parent.name}"
        convert_dataset(str(old), str(new), log=lambda *a: None)
        size = sum(p.stat().st_size for p in new.rglob("*") if p.is_file())
        asked = converted_size(old, read_dataset_info(old))
        assert size <= asked <= 2 * size, (old, size, asked)


def test_a_write_that_fails_past_the_check_of_room_is_one_line_and_keeps_nothing(legacy, tmp_path):
    """The room was checked, and a write failed later (a disk filled meanwhile, a quota, an estimate
    short: 712 KB against 387 KB of short documents in small shards): an OSError traceback (trial
    RV77a 4). One line; nothing of NEW is left. Here a file-size limit (`ulimit -f`) fails the write."""
    new = tmp_path / "new"
    limited = [sys.executable, "-m", "tests.helpers.fsize_limited", str(16 << 10), "pipelines.cli"]
    done = forked.run([*limited, "data", "convert", str(legacy), str(new)], cwd=ROOT, env=ENV, timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err, err
    assert err.startswith(
        f"error: cannot write the converted {legacy} into {tmp_path / '.new.converting'}: File too large; "
        "nothing of it was kept"
    ), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("edit", ["separator", "vocab_size"])
def test_an_old_dataset_unlike_its_record_is_refused_as_it_is_read_naming_old(legacy, tmp_path, edit):
    """OLD's record edited where its fingerprint does not look (a separator id with the fingerprint
    recomputed; vocab_size): found only by NEW's validation after every shard was written, ~60 lines
    blaming NEW (trial RV54a 6b). Refused at the first shard read, naming OLD's shard."""
    old = tmp_path / "old"
    shutil.copytree(legacy, old)
    info = read_dataset_info(old)
    if edit == "separator":
        info["separator"]["id"] = (info["separator"]["id"] + 1) % info["vocab_size"]
    else:
        info["vocab_size"] = 8
    info["fingerprint"] = fingerprint(info)
    (old / DATASET_JSON).write_text(json.dumps(info))
    with pytest.raises(DatasetError) as e:
        convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: pytest.fail("converted"))
    msg = str(e.value)
    says = "does not hold the separator" if edit == "separator" else "past vocab_size 8"
    assert msg.startswith(f"{old / 'shards'}/") and says in msg and "\n" not in msg, msg
    assert f"{old} is not the dataset its record describes" in msg, msg
    assert not (tmp_path / "new").exists() and not (tmp_path / ".new.converting").exists()


def test_convert_carries_the_files_old_records_and_checks_them(v2, tmp_path):
    """A file dropped in beside OLD's (an excluded-documents file the audit reads) was copied into NEW
    and recorded there as NEW's own, so NEW validated where OLD did not (review R4); a recorded file
    changed since the build was carried over too. Only what OLD records, as it records it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    old = tmp_path / "old"
    shutil.copytree(v2, old)
    (old / "excluded").mkdir()
    pq.write_table(
        pa.table({"id": ["x"], "reason": ["dropped in"]}), old / "excluded" / "99999_extra.parquet"
    )
    info = json.loads((old / "dataset.json").read_text())
    (old / "build.json").write_text('{"a": "build record"}')
    info["files"]["build.json"] = {"bytes": 22, "sha256": file_sha256(old / "build.json")}
    (old / "dataset.json").write_text(json.dumps(info))
    convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: None)
    recorded = json.loads((tmp_path / "new" / "dataset.json").read_text())["files"]
    assert "excluded/99999_extra.parquet" not in recorded and "build.json" in recorded
    assert not (tmp_path / "new" / "excluded" / "99999_extra.parquet").exists()
    (old / "build.json").write_text('{"a": "edited since"}')
    with pytest.raises(DatasetError, match=f"{old / 'build.json'}: not the file dataset.json records"):
        convert_dataset(str(old), str(tmp_path / "new2"), log=lambda *a: None)
    assert not (tmp_path / "new2").exists()


def test_convert_checks_old_s_manifests_tokenizer_and_last_validation(v2, tmp_path):
    """A local OLD's manifest or tokenizer.json replaced since its build was carried into NEW, recorded
    as NEW's own under `converted_from`'s claim of OLD's data, exit 0, and so was an OLD its last
    validate had failed (review R17b S1, S2): a run on OLD resumed on NEW and trained other batches.
    Each is refused before any work now, naming the file; and NEW's documents must be the count OLD
    records (a manifest missing from a dataset that predates the record of its files)."""
    import pyarrow.parquet as pq

    old = tmp_path / "old"
    shutil.copytree(v2, old)
    path = old / "manifest" / "00000.parquet"
    table = pq.read_table(path).to_pylist()
    table[5]["id"] = "EDITED-ID"
    pq.write_table(pq.read_table(path).from_pylist(table, schema=pq.read_schema(path)), path)
    with pytest.raises(DatasetError, match=f"{path}: not the file dataset.json records"):
        convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: None)
    assert not (tmp_path / "new").exists()

    failed = tmp_path / "failed"  # its last validate found a shard damaged: refused as readers refuse it
    shutil.copytree(v2, failed)
    shard = sorted((failed / "shards").glob("*.tar"))[0]
    body = bytearray(shard.read_bytes())
    body[700] ^= 1
    shard.write_bytes(bytes(body))
    assert gristmill(["data", "validate", str(failed)]) == 1  # recorded in validation.json
    with pytest.raises(DatasetError, match=r"validation.json: the last `gristmill data validate"):
        convert_dataset(str(failed), str(tmp_path / "new"), log=lambda *a: None)

    tokenized = tmp_path / "tokenized"
    shutil.copytree(v2, tokenized)
    (tokenized / "tokenizer.json").write_text('{"a": "tokenizer"}')
    info = json.loads((tokenized / "dataset.json").read_text())
    info["tokenizer_sha256"] = file_sha256(tokenized / "tokenizer.json")
    info["fingerprint"] = fingerprint(info)
    (tokenized / "dataset.json").write_text(json.dumps(info))
    (tokenized / "tokenizer.json").write_text('{"a": "another tokenizer"}')
    with pytest.raises(
        DatasetError, match=f"{tokenized / 'tokenizer.json'} has sha256 .* nothing was converted"
    ):
        convert_dataset(str(tokenized), str(tmp_path / "new"), log=lambda *a: None)

    unrecorded = tmp_path / "unrecorded"  # from before dataset.json recorded its files
    shutil.copytree(v2, unrecorded)
    info = json.loads((unrecorded / "dataset.json").read_text())
    del info["files"]
    info["fingerprint"] = fingerprint(info)
    (unrecorded / "dataset.json").write_text(json.dumps(info))
    path = unrecorded / "manifest" / "00000.parquet"
    rows = pq.read_table(path)
    last = rows.column("shard").to_pylist()[-1]
    pq.write_table(rows.filter([s != last for s in rows.column("shard").to_pylist()]), path)
    with pytest.raises(DatasetError, match=f"no manifest row names shards/{last}, which dataset.json lists"):
        convert_dataset(str(unrecorded), str(tmp_path / "new"), log=lambda *a: pytest.fail("converted"))
    assert not (tmp_path / "new").exists() and not (tmp_path / ".new.converting").exists()

    # a tokenizer.json dropped in beside a dataset that records none became NEW's own (review R17c S1)
    dropped = tmp_path / "dropped"
    shutil.copytree(v2, dropped)
    assert read_dataset_info(dropped)["tokenizer_sha256"] == "none"
    (dropped / "tokenizer.json").write_text('{"a": "tokenizer"}')
    with pytest.raises(DatasetError, match=f"{dropped / 'tokenizer.json'} has sha256 .* records none"):
        convert_dataset(str(dropped), str(tmp_path / "new"), log=lambda *a: pytest.fail("converted"))


def test_converted_documents_are_the_old_ones(legacy, converted):
    from training.data.reader import DocumentTable

    old, new = DocumentTable(legacy), DocumentTable(converted)
    for row in np.linspace(0, old.documents - 1, 25).astype(int).tolist():
        assert np.array_equal(old.document(row), new.document(row))


def manifest(root) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for p in sorted((root / "manifest").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_a_v2_dataset_converts_with_the_same_rows_shards_and_batches(v2, converted_v2, capsys):
    old, new = read_dataset_info(v2), read_dataset_info(converted_v2)
    assert (old["format"], new["format"]) == (FORMAT_V2, FORMAT)
    assert new["converted_from"] == {"format": FORMAT_V2, "fingerprints": [old["fingerprint"]]}
    # The same shards, each with the same documents; every manifest column the same but where the ids
    # now lie (after each sample's .docs member), which is /3's layout of the same lengths.
    assert {k: (f["documents"], f["tokens"]) for k, f in old["shard_files"].items()} == {
        k: (f["documents"], f["tokens"]) for k, f in new["shard_files"].items()
    }
    assert len(old["shard_files"]) > 2
    before, after = manifest(v2), manifest(converted_v2)
    assert [{**r, "offset": None} for r in before] == [{**r, "offset": None} for r in after]
    for shard in sorted(new["shard_files"]):
        rows = [r for r in after if r["shard"] == shard]
        assert [r["offset"] for r in rows] == layout_offsets([r["nbytes"] for r in rows], FORMAT).tolist()
    assert len(rows) % 64  # the last shard ends with a short sample
    assert hashes(converted_v2, 120, val_fraction=0.05) == hashes(v2, 120, val_fraction=0.05)
    geometry = ["--seq-len", "64", "--global-batch", "8", "--seed", "3", "--hash", "--end", "20"]
    outs = []
    for root in (v2, converted_v2):
        assert gristmill(["data", "inspect", str(root), *geometry]) == 0
        outs.append(capsys.readouterr().out.splitlines()[1:])
    assert outs[0] == outs[1] and len(outs[0]) == 19
    # A /3 dataset given to convert: one line, the current layout; said before a NEW that holds a
    # dataset is ("NEW already holds a dataset": trial RV77a 7)
    for new in (v2.parent / "again", v2):
        assert gristmill(["data", "convert", str(converted_v2), str(new)]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"error: {converted_v2} is already a {FORMAT} dataset, the current layout: nothing to convert"
        ]


def test_a_legacy_dataset_keeps_its_shards(legacy, converted):
    old, new = read_dataset_info(legacy), read_dataset_info(converted)
    assert len(old["shard_files"]) > 2
    assert {k: f["documents"] for k, f in old["shard_files"].items()} == {
        k: f["documents"] for k, f in new["shard_files"].items()
    }
    assert [r["shard"] for r in manifest(legacy)] == [r["shard"] for r in manifest(converted)]


def test_a_killed_conversion_s_work_folder_goes_at_the_next_one(v2, tmp_path):
    """A conversion killed (SIGKILL: no cleanup) left its work folder in the temporary directory, a
    dataset's size each time (review R20b M5): the next conversion removes those whose lock no process
    holds, never a running one's (a pid test took another host's or container's for dead: R20c 3)."""
    import fcntl
    import os
    import tempfile
    import time

    from pipelines.convert import WORK_LOCK, WORK_PREFIX

    dead, live, new, old = (Path(tempfile.mkdtemp(prefix=WORK_PREFIX)) for _ in range(4))
    for d in (dead, live):
        (d / WORK_LOCK).write_text("")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))  # an unlocked folder of a version before the lock (R20d 4)
    running = open(live / WORK_LOCK, "a")  # what a conversion on another host or container holds
    fcntl.flock(running, fcntl.LOCK_EX)
    try:
        convert_dataset(str(v2), str(tmp_path / "new"), log=lambda *a: None)
        assert not dead.exists() and live.exists() and new.exists()  # one without a lock: being made
        assert not old.exists()
    finally:
        running.close()
        for d in (dead, live, new, old):
            shutil.rmtree(d, ignore_errors=True)


def unrecorded_copy(src, dest, keep_index: bool = True):
    """A copy of `src` as a build before dataset.json recorded its files left it (no sha256 of its
    manifests), with or without its index; returns dataset.json's path."""
    from training.contract.dataset_format import fingerprint

    shutil.copytree(src, dest)
    info = json.loads((dest / "dataset.json").read_text())
    del info["files"]
    if not keep_index:
        del info["index"]
        shutil.rmtree(dest / "index")
    info["fingerprint"] = fingerprint(info)
    (dest / "dataset.json").write_text(json.dumps(info))
    return dest / "dataset.json"


def swap_rows(root, columns: tuple[str, ...]) -> tuple[str, str]:
    """Two rows of one shard with the same n_tokens get each other's `columns` (an edit no record of a
    /1 dataset without "files" covers); returns their keys."""
    import pyarrow.parquet as pq

    path = root / "manifest" / "00000.parquet"
    table = pq.read_table(path)
    rows, seen = table.to_pylist(), {}
    for i, r in enumerate(rows):
        if (j := seen.setdefault((r["shard"], r["n_tokens"]), i)) != i:
            for c in columns:
                rows[i][c], rows[j][c] = rows[j][c], rows[i][c]
            pq.write_table(table.from_pylist(rows, schema=table.schema), path)
            return rows[j]["key"], rows[i]["key"]
    raise AssertionError("no two rows of one shard with the same n_tokens")


def test_convert_checks_an_unrecorded_manifest_against_the_shards_and_index(legacy, tmp_path, capsys):
    """A /1 dataset from before dataset.json recorded its files, two manifest rows' offsets swapped (same
    n_tokens): NEW held each document under the other's key and id, "the same batches … validated",
    exit 0 (review R26c S1); `data index` upgraded its older index from that manifest without a word.
    Now each row is checked against the tar member its key names, in tar order, and against the index
    OLD records, before anything is kept."""
    from training.contract.dataset_format import fingerprint

    bare = tmp_path / "bare"  # without an index: the shard's members are the record
    unrecorded_copy(legacy, bare, keep_index=False)
    a, b = swap_rows(bare, ("offset",))
    with pytest.raises(DatasetError) as e:
        convert_dataset(str(bare), str(tmp_path / "new"), log=lambda *a: None)
    assert f"{bare / 'manifest' / '00000.parquet'}: its rows do not describe shards/" in str(e.value)
    assert f"document {a}: manifest says offset" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "new").exists() and not (tmp_path / ".new.converting").exists()

    moved = tmp_path / "moved"  # whole rows swapped: each row's key and offset agree, not their order
    unrecorded_copy(legacy, moved, keep_index=False)
    a, _ = swap_rows(moved, ("offset", "key", "id"))
    with pytest.raises(DatasetError, match=f"document {a}: the manifest lists this shard's documents out"):
        convert_dataset(str(moved), str(tmp_path / "new"), log=lambda *a: None)
    assert gristmill(["data", "validate", str(moved)]) == 1  # validate says the same
    assert "out of their tar order" in capsys.readouterr().out

    labelled = tmp_path / "labelled"  # ids swapped, offsets not: each document's .json member says
    unrecorded_copy(legacy, labelled, keep_index=False)
    a, b = swap_rows(labelled, ("id",))
    doc = lambda key: f"doc-{int(key[len('t00000d') :])}"  # noqa: E731 - write_legacy_dataset's ids
    with pytest.raises(DatasetError, match=f"row {a} says id '{doc(b)}', but its .json member .* '{doc(a)}'"):
        convert_dataset(str(labelled), str(tmp_path / "new"), log=lambda *a: None)

    indexed = tmp_path / "indexed"  # with an index of an older format: it records the offsets
    where = unrecorded_copy(legacy, indexed)
    info = json.loads(where.read_text())
    shared = ("doc_tokens.bin", "doc_offsets.bin", "shard_rows.bin")  # gristmill-index/1's files
    info["index"] = {"format": "gristmill-index/1", "files": {n: info["index"]["files"][n] for n in shared}}
    info["fingerprint"] = fingerprint(info)
    where.write_text(json.dumps(info))
    before = where.read_bytes()
    swap_rows(indexed, ("offset",))
    with pytest.raises(DatasetError, match=r"give another index than the one dataset.json records \(doc_off"):
        convert_dataset(str(indexed), str(tmp_path / "new"), log=lambda *a: None)
    assert gristmill(["data", "index", str(indexed)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {indexed / 'manifest'}: the index derived from it differs from the one dataset.json records "
        "(doc_offsets.bin): the manifest changed after the build; nothing was indexed (restore it, or "
        "rebuild the dataset)"
    ]
    assert where.read_bytes() == before  # not upgraded


def test_convert_of_a_damaged_old_says_which_file_in_one_line(v2, tmp_path, capsys):
    """A shard missing, a copy of a manifest beside it, a shard and manifest that dataset.json does not
    list (a leftover of another build), an edited `documents`: tracebacks (FileNotFoundError,
    ValueError, KeyError), or, for the count, nothing said (review R26c M4, m3). One line each now,
    naming the file and the fix, before NEW exists."""
    import pyarrow.parquet as pq

    def refused(old, match):  # before any shard is converted (a missing one was found on reaching it)
        with pytest.raises(DatasetError, match=match) as e:
            convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: pytest.fail("converted"))
        assert "\n" not in str(e.value)
        assert not (tmp_path / "new").exists() and not (tmp_path / ".new.converting").exists()

    missing = tmp_path / "missing"  # the last shard: every other one was converted first (RV26d m3)
    shutil.copytree(v2, missing)
    last = sorted((missing / "shards").glob("*.tar"))[-1]
    last.unlink()
    refused(missing, f"^{last}: missing, but dataset.json lists it: restore")
    cut = tmp_path / "cut"
    shutil.copytree(v2, cut)
    last = sorted((cut / "shards").glob("*.tar"))[-1]
    last.write_bytes(last.read_bytes()[:-512])
    refused(cut, f"^{last}: not the shard dataset.json records \\(size or sha256 differ\\)")
    looped = tmp_path / "looped"  # a shard that cannot be read: a link to itself (RV26h M2: a traceback)
    shutil.copytree(v2, looped)
    last = sorted((looped / "shards").glob("*.tar"))[-1]
    last.unlink()
    last.symlink_to(last.name)
    refused(looped, f"^{last}: Too many levels of symbolic links, but dataset.json lists it: restore")

    stray = tmp_path / "stray"
    shutil.copytree(v2, stray)
    shutil.copy(stray / "manifest" / "00000.parquet", stray / "manifest" / "00000 copy.parquet")
    refused(
        stray, f"^{stray / 'manifest' / '00000 copy.parquet'}: not a manifest of {stray}'s build .*move it"
    )

    for recorded in (True, False):
        extra = tmp_path / f"extra-{recorded}"
        shutil.copytree(v2, extra) if recorded else unrecorded_copy(v2, extra)
        shutil.copy(extra / "shards" / "00000_00000.tar", extra / "shards" / "00001_00000.tar")
        rows = pq.read_table(extra / "manifest" / "00000.parquet").to_pylist()
        rows = [{**r, "shard": "00001_00000.tar"} for r in rows if r["shard"] == "00000_00000.tar"]
        pq.write_table(
            pq.read_table(extra / "manifest" / "00000.parquet").from_pylist(
                rows, schema=pq.read_schema(extra / "manifest" / "00000.parquet")
            ),
            extra / "manifest" / "00001.parquet",
        )
        path = extra / "manifest" / "00001.parquet"
        if recorded:  # not a file dataset.json records
            refused(extra, f"^{path}: not a manifest of {extra}'s build \\(one its dataset.json records")
        else:
            refused(extra, f"^{path}: its rows name shard 00001_00000.tar, which dataset.json does not list")

    counted = tmp_path / "counted"  # not in the fingerprint; its manifests are checked against their record
    shutil.copytree(v2, counted)
    info = json.loads((counted / "dataset.json").read_text())
    info["documents"] += 1
    (counted / "dataset.json").write_text(json.dumps(info))
    refused(counted, "its manifests list 300 documents .* records 301 of .*: dataset.json was edited after")
    counted = tmp_path / "counted-unrecorded"  # nothing yet tells which side is the edit (RV26d m2)
    where = unrecorded_copy(v2, counted)
    info = json.loads(where.read_text())
    info["documents"] += 1
    where.write_text(json.dumps(info))
    refused(counted, "records 301 of .*: a manifest or dataset.json's documents/tokens was edited after")


def test_a_second_conversion_into_the_same_new_is_refused(v2, tmp_path, capsys):
    """Two conversions into one NEW at once removed each other's files in `.NEW.converting`
    (tracebacks, or a failed validation: review R26c m1). The folder is locked as a build locks its
    output: the second is refused in one line, the first's files untouched."""
    from tests.helpers.lock_holder import held_elsewhere

    work = tmp_path / ".new.converting"
    work.mkdir()
    (work / "theirs").write_text("a running conversion's file")
    with held_elsewhere(work / ".build.lock"):
        new = tmp_path / "new"
        assert gristmill(["data", "convert", str(v2), str(new)]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            "error: another `gristmill data build`, `data index`, `data convert` or `data decontam-index` is "
            f"writing {new}; wait for it to finish, then run `gristmill data convert {v2} {new}` again"
        ]
        assert (work / "theirs").is_file() and not new.exists()
    # once it is gone (killed: its folder left), the next conversion takes the folder over
    convert_dataset(str(v2), str(tmp_path / "new"), log=lambda *a: None)
    assert not work.exists() and not (tmp_path / "new" / "theirs").exists()


def test_a_run_in_an_older_order_is_refused_before_data_index_and_is_not_stranded(legacy, tmp_path, capsys):
    """A run an older gristmill trained (its batches drawn in data order /1, on a dataset with that
    gristmill's index): `data inspect RUN` showed another order's batch, exit 0, once `data index` let
    it open the dataset, and `train --resume` sent the user to `data index`, which rewrote dataset.json
    so that neither version could finish the run (review R26c S2, L1). Now both refuse first, naming the
    order and the gristmill that reads it; `data index` keeps the dataset.json it replaces, whose index
    files still hash as it records (what that gristmill checks); a run whose checkpoint holds the
    loader state of gristmill 62f489d is refused by inspect the same way."""
    ds, run = tmp_path / "old", tmp_path / "run"
    shutil.copytree(legacy, ds)
    train(load_train_config(TINY, overrides(ds, run, "run.max_steps=4")))
    older = older_index(ds)
    plan = json.loads((run / DATA_PLAN_JSON).read_text())
    plan["format"] = "gristmill-plan/1"
    plan["sources"][0]["fingerprint"] = older["fingerprint"]
    (run / DATA_PLAN_JSON).write_text(json.dumps(plan))
    capsys.readouterr()
    resume = ["train", "--config", str(run / CONFIG_TOML), "--resume", "auto", "--set", "run.max_steps=8"]
    for command in (["data", "inspect", str(run), "--step", "2"], resume):
        assert gristmill(command) != 0, command
        line = one_error_line(capsys.readouterr().err)
        assert f"error: {run}'s batches were drawn in data order 'gristmill-plan/1'" in line, line
        assert (
            "drew this order up to commit dacacc9: git checkout COMMIT" in line
            and "dataset.json.before-index" in line
        ), line
        assert f"gristmill export {run}`, then model.init_from = {run}/exports/step-N" in line, line
    before = (ds / DATASET_JSON).read_bytes()
    assert gristmill(["data", "index", str(ds)]) == 0
    assert f"kept as {ds / 'dataset.json.before-index'}" in capsys.readouterr().out
    assert (ds / "dataset.json.before-index").read_bytes() == before  # moved back: the older one's
    assert damaged_files(ds, older["index"]) == {}  # its index files as it recorded them
    assert gristmill(["data", "inspect", str(run), "--step", "2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"which cut the training documents of {ds} into other blocks" in line, line
    # gristmill 62f489d's loader state, and no data_plan.json (it wrote none): inspect refuses a run
    # that recorded no order; a resume reads it from the checkpoint
    (run / DATA_PLAN_JSON).unlink()
    assert gristmill(["data", "inspect", str(run), "--step", "2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "the run's datasets and data order are unknown" in line, line
    step = checkpoint_dir(run, 4)
    for f in [*step.glob("*.distcp"), step / ".metadata"]:
        f.unlink()
    state = {"fingerprint": older["fingerprint"], "epoch": 0, "batch": 4}
    dcp.save({"dataloader": state}, checkpoint_id=step, no_dist=True)
    assert gristmill(resume) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {run}'s batches were drawn in the one-dataset order of gristmill 62f489d")
    assert "drew this order up to commit 62f489d: git checkout COMMIT" in line, line
    # a run of order /1 from before data_plan.json: its checkpoint's loader state says the order
    for f in [*step.glob("*.distcp"), step / ".metadata"]:
        f.unlink()
    dcp.save({"dataloader": {"data_plan": json.dumps(plan), "step": 4}}, checkpoint_id=step, no_dist=True)
    assert gristmill(resume) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"which cut the training documents of {ds} into other blocks" in line, line


def test_an_older_index_validates_ok_with_a_note_and_converts(v2, tmp_path, capsys):
    """An intact dataset with an older gristmill's index: validate said FAILED "rebuild the dataset",
    recorded ok=false, and `data convert` then refused it (review R26c M2). Now it is ok, with a note
    naming `gristmill data index`, and converts."""
    old = tmp_path / "old"
    shutil.copytree(v2, old)
    (old / "validation.json").unlink(missing_ok=True)
    older_index(old)
    assert gristmill(["data", "validate", str(old), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "note: index/: index format 'gristmill-index/1' (an older gristmill's build), not " in out, out
    assert f"read the dataset after `gristmill data index {old}`" in out and "\nOK:" in out, out
    assert json.loads((old / "validation.json").read_text())["ok"] is True
    convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: None)


def test_a_run_on_an_indexed_copy_resumes_on_the_conversion_of_the_unindexed_one(v2, tmp_path):
    """A run of this version trains on OLD after `data index OLD` (a new fingerprint); NEW converted
    from a copy of OLD not indexed (the bucket's, a backup) recorded only the copy's fingerprint, so
    the run was refused on NEW for the same batches (review R26c M3). NEW records the fingerprint
    `data index` gives OLD too."""
    copy, indexed = tmp_path / "copy", tmp_path / "indexed"
    shutil.copytree(v2, copy)
    older_index(copy)
    shutil.copytree(copy, indexed)
    assert gristmill(["data", "index", str(indexed)]) == 0
    new = tmp_path / "new"
    convert_dataset(str(copy), str(new), log=lambda *a: None)
    assert same_data(read_dataset_info(indexed)["fingerprint"], read_dataset_info(new))


def test_convert_never_empties_old_as_new_s_work_folder(v2, tmp_path):
    """OLD named as NEW's work folder (`.NEW.converting`, which the conversion locks, empties and
    removes), or inside it: OLD was deleted, "error: … dataset.json not found" (review RV26d L1). One
    line now, before any work, OLD as it was."""
    old = tmp_path / ".zz.converting"
    shutil.copytree(v2, old)
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    for src, what in [(old, "is the folder"), (old / "shards", "lies inside the folder")]:
        with pytest.raises(
            DatasetError, match=f"^{src} {what} a conversion into {tmp_path / 'zz'} is written"
        ):
            convert_dataset(str(src), str(tmp_path / "zz"), log=lambda *a: pytest.fail("converted"))
    # OLD named as NEW: "OLD is OLD (OLD), which the conversion empties" (trial RV74c 8)
    with pytest.raises(DatasetError) as said:
        convert_dataset(str(old), str(old), log=lambda *a: pytest.fail("converted"))
    assert str(said.value) == (
        f"OLD and NEW are one directory ({old}): convert into a new directory apart from it (OLD is never "
        "changed)"
    )
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "zz").exists()


def test_a_link_or_a_file_where_new_s_work_folder_goes_is_refused_and_left(v2, tmp_path):
    """A link at `.NEW.converting` was followed and the folder it names emptied: all of OLD's shards,
    where it led into OLD, and the error then blamed OLD (trial RV62a F2). Refused in one line, before
    any work, the link and what it names left as they were."""
    old = tmp_path / "old"
    shutil.copytree(v2, old)
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    work = tmp_path / ".new.converting"
    for make, what in ((lambda: work.symlink_to(old / "shards"), "a link"), (work.touch, "a file")):
        make()
        with pytest.raises(DatasetError) as e:
            convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: pytest.fail("converted"))
        assert str(e.value) == (
            f"{work} is {what}, where a conversion into {tmp_path / 'new'} writes it: no conversion left it; "
            f"move it away (mv {work} …), then run again"
        )
        assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
        assert work.is_symlink() or work.is_file()
        work.unlink()


def test_new_that_gains_a_file_meanwhile_keeps_the_finished_conversion(v2, tmp_path, monkeypatch):
    """NEW gained a file while the conversion ran: a traceback (Directory not empty), and the finished,
    validated conversion deleted (trial RV62a F3). One line naming where it is kept."""
    import pipelines.convert as convert_module

    new = tmp_path / "new"
    convert = convert_module._convert

    def someone_writes_into_new(*args, **kwargs):
        info = convert(*args, **kwargs)
        new.mkdir()
        (new / "notes.txt").write_text("mine")
        return info

    monkeypatch.setattr(convert_module, "_convert", someone_writes_into_new)
    with pytest.raises(DatasetError) as e:
        convert_dataset(str(v2), str(new), log=lambda *a: None)
    work = tmp_path / ".new.converting"
    assert str(e.value).startswith(f"{new} changed while the conversion ran (Directory not empty): "), e.value
    assert (
        f"the validated conversion is kept in {work}: move it to a path that is not there yet (mv {work} "
        in (str(e.value))
    )
    assert (new / "notes.txt").read_text() == "mine"
    monkeypatch.undo()
    moved = tmp_path / "moved"
    os.replace(work, moved)
    assert read_dataset_info(v2)["fingerprint"] in read_dataset_info(moved)["converted_from"]["fingerprints"]


def test_a_conversion_that_loses_the_race_for_new_leaves_nothing(v2, tmp_path, monkeypatch):
    """A conversion into NEW finished while this one read OLD (a bucket OLD's whole download): this one
    is refused once it holds NEW's work folder, and left `.NEW.converting/.build.lock` behind (review
    RV26d m1). The refusal removes the folder now."""
    import pipelines.convert as convert_module

    new = tmp_path / "new"
    read = convert_module.read_dataset_info

    def another_conversion_finishes(root):
        monkeypatch.setattr(convert_module, "read_dataset_info", read)  # once
        convert_dataset(str(v2), str(new), log=lambda *a: None)
        return read(root)

    monkeypatch.setattr(convert_module, "read_dataset_info", another_conversion_finishes)
    with pytest.raises(DatasetError, match=f"^{new} exists and is not empty"):
        convert_dataset(str(v2), str(new), log=lambda *a: pytest.fail("converted"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("bug", ["reversed", "swapped"])
def test_convert_checks_what_it_wrote_against_old_s_index(legacy, tmp_path, monkeypatch, bug, indexed):
    """The comparison of NEW's index (lengths, sha256 per row) with the one OLD records, after the
    conversion, was dropped (review RV26d M2): a conversion that wrote a shard's documents in another
    order (simulated: the writer reverses each shard's rows) gave other batches, "the same batches …
    validated", exit 0 (NEW is self-consistent, so its own validate cannot see it). Restored, it
    compared lengths alone for a /1 OLD (whose index has no sha256s) and nothing for one without an
    index: two same-length documents' ids swapped converted (review RV26h M1). NEW's index is now held
    to OLD's documents as they were read."""
    import pipelines.convert as convert_module
    from pipelines.shard_writer import ShardWriter

    class Faulty(ShardWriter):
        pending: list = []

        def add(self, *args):
            self.pending.append(list(args))

        def end_shard(self):
            rows = self.pending
            if bug == "reversed":
                rows = rows[::-1]
            else:  # the ids of the first two documents of one length trade places
                seen: dict[int, list] = {}
                for row in rows:
                    if (twin := seen.setdefault(len(row[1]), row)) is not row:
                        twin[1], row[1] = row[1], twin[1]
                        break
            for args in rows:
                super().add(*args)
            self.pending.clear()
            super().end_shard()

    old = legacy
    if not indexed:
        old = tmp_path / "bare"
        unrecorded_copy(legacy, old, keep_index=False)
    monkeypatch.setattr(convert_module, "ShardWriter", Faulty)
    new = tmp_path / "new"
    differ = "doc_tokens.bin, doc_sha256.bin" if bug == "reversed" else "doc_sha256.bin"
    with pytest.raises(DatasetError, match=rf"^{new}: its index \({differ}\) differs from {old}'s documents"):
        convert_dataset(str(old), str(new), log=lambda *a: None)
    assert not new.exists() and not (tmp_path / ".new.converting").exists()


def test_a_legacy_dataset_with_a_nan_score_converts(tmp_path):
    """pandas writes a missing float as NaN, in the .json member and the manifest row alike; NaN != NaN
    refused the honest dataset: "the manifest was edited; … (restore it)" (review RV26d M1)."""
    import math

    import pyarrow.parquet as pq

    from pipelines.synthetic_dataset import SEPARATOR
    from tests.helpers.legacy_dataset import LegacyShardWriter, finalize_legacy

    old = tmp_path / "old"
    writer = LegacyShardWriter(old, 0, 256, target_bytes=16 << 10)
    for i, ids in enumerate(affine_documents(40)):
        writer.add(f"t00000d{i:09d}", ids, {"id": f"doc-{i}", "score": math.nan if i == 7 else 0.5})
    writer.close()
    finalize_legacy(old, vocab_size=256, separator=SEPARATOR, config_sha256="synthetic")
    for unrecorded in (False, True):
        src = tmp_path / f"old-{unrecorded}"
        unrecorded_copy(old, src) if unrecorded else shutil.copytree(old, src)
        new = tmp_path / f"new-{unrecorded}"
        convert_dataset(str(src), str(new), log=lambda *a: None)
        scores = pq.read_table(new / "manifest" / "00000.parquet").column("score").to_pylist()
        assert math.isnan(scores[7]) and scores[:7] == [0.5] * 7


def test_a_document_of_the_separator_alone_is_said_as_such_not_an_edit(tmp_path):
    """A build before 2026-11-29 wrote a document of the separator alone for a text that encodes to no
    token: convert refused it as one that "does not hold the separator once" and OLD as edited, where it
    holds it once, as its last token (trial RV67b F4). Said as what it is, with the way on."""
    from training.contract.dataset_format import DatasetError

    def docs():
        for i, ids in enumerate(affine_documents(40)):
            yield np.array([ids[-1]]) if i == 7 else ids  # the separator alone

    old = tmp_path / "old"
    write_legacy_dataset(old, docs(), vocab_size=256, target_bytes=16 << 10)
    with pytest.raises(DatasetError, match=r"is the separator alone \(1 token\), two separators side") as e:
        convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: None)
    assert "edited" not in str(e.value) and f"rebuild {old} from its source with this version" in str(e.value)
    assert not (tmp_path / "new").exists()


def test_an_old_document_damaged_before_its_shard_was_recorded_blames_old(v2, tmp_path):
    """A /2 OLD whose shard holds a damaged document while dataset.json records the shard as it now is
    (disk rot before the finalize): convert said "the conversion did not keep OLD's documents in order
    (please report it)" (trial RV67b F3). OLD's documents as read are not its record: OLD is named."""
    import hashlib

    import pyarrow.parquet as pq

    from training.contract.dataset_format import DatasetError, fingerprint

    old = tmp_path / "old"
    shutil.copytree(v2, old)
    row = pq.read_table(old / "manifest" / "00000.parquet").to_pylist()[3]
    shard = old / "shards" / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] + 2] ^= 1
    shard.write_bytes(bytes(data))
    info = json.loads((old / "dataset.json").read_text())
    info["shard_files"][row["shard"]].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    info["fingerprint"] = fingerprint(info)
    (old / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=f"^{old}'s documents as read are not what its dataset.json") as e:
        convert_dataset(str(old), str(tmp_path / "new"), log=lambda *a: None)
    assert "please report" not in str(e.value) and f"`gristmill data validate {old}` names it" in str(e.value)
    assert not (tmp_path / "new").exists()
