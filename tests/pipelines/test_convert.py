"""`gristmill data convert OLD NEW`: a dataset of an older layout (gristmill-shards/1 or /2) rewritten in
the current one (/3) with the same documents in the same rows and shards, so the same batches; a run
trained on OLD resumes on NEW; OLD is never changed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from pipelines.cli import main as gristmill
from pipelines.convert import convert_dataset
from tests.helpers.legacy_dataset import write_legacy_dataset, write_v2_dataset
from tests.helpers.train_data import affine_documents
from tests.helpers.train_runs import TINY, losses, overrides
from training.contract.dataset_format import (
    FORMAT,
    FORMAT_V2,
    LEGACY_FORMAT,
    DatasetError,
    file_sha256,
    layout_offsets,
    read_dataset_info,
)
from training.data.loader import batch_sha256, dataset_loader
from training.train import load_train_config, train


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


def test_convert_refuses_what_it_cannot_do(legacy, converted, tmp_path):
    with pytest.raises(
        DatasetError, match="is already a gristmill-shards/3 dataset, the current layout: nothing"
    ):
        convert_dataset(str(converted), str(tmp_path / "again"), log=lambda *a: None)
    with pytest.raises(DatasetError, match="exists and is not empty"):
        convert_dataset(str(legacy), str(converted), log=lambda *a: None)
    # a file, a link or a folder inside OLD as NEW: one line before any work (a traceback, a traceback
    # after the whole conversion, and NEW written into OLD: review R17b M2)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-link").symlink_to(tmp_path / "empty", target_is_directory=True)
    (tmp_path / "empty").mkdir()
    for new, what in [("a-file", "is a file"), ("a-link", "is a link")]:
        with pytest.raises(DatasetError, match=f"^{tmp_path / new} {what}: name a new directory"):
            convert_dataset(str(legacy), str(tmp_path / new), log=lambda *a: pytest.fail("converted"))
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

    from training.contract.dataset_format import fingerprint

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
    with pytest.raises(DatasetError, match=r"its manifests list \d+ documents .* records 300 of"):
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
    # A /3 dataset given to convert: one line, the current layout.
    assert gristmill(["data", "convert", str(converted_v2), str(v2.parent / "again")]) != 0
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
    from pathlib import Path

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
