"""The loader index (training/contract/dataset_index.py): the loader reads only it, in the old order.

The corpus is test_loader's token-position corpus (tests/helpers/position_corpus.py: token =
1 + doc·1000 + position), so a stream decodes back into documents and can be compared with an order
computed here the plain way: split rows materialised, blocks, block permutation, groups, in-group
permutation, all spelled out.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main as cli
from pipelines.data_index import index_dataset
from tests.helpers.position_corpus import SEP, doc_tokens, epoch_stream, make_dataset
from training.contract import dataset_index, heldout
from training.contract.dataset_format import (
    DATASET_JSON,
    DatasetError,
    fingerprint,
    read_dataset_info,
    sample_starts,
    sample_totals,
)
from training.contract.dataset_index import (
    DOC_HASHES,
    DOC_OFFSETS,
    DOC_TOKENS,
    DOCUMENTS_SUM,
    HELDOUT,
    INDEX_DIR,
    DocIndex,
    rows_among,
    sum_doc_hashes_file,
    sum_hashes,
    write_index,
)
from training.data import cache as order_cache
from training.data import order as epoch_order
from training.data.loader import LoaderStateError, batch_sha256, dataset_loader
from training.data.reader import DocumentTable
from training.data.recipe import check_trained_on
from validation.validate import validate_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SEQ, G = 15, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    return root, make_dataset(root, n_docs=400, tasks=3)


def reference_stream(
    lengths: dict, shard_rows: list[int], seed: int, split: str, vf: float, bd: int, gb: int
) -> np.ndarray:
    """The stream the plain way: training blocks are each shard's runs of 64 rows (the build's samples)
    less the held-out rows; held-out blocks are the held-out rows, bd at a time."""
    n = len(lengths)
    held = epoch_order.heldout_mask(0, n, vf)
    if split == "val":
        rows = np.flatnonzero(held)
        blocks = [rows[i : i + bd] for i in range(0, len(rows), bd)]
    else:
        blocks = []
        for a, z in zip(shard_rows[:-1], shard_rows[1:]):
            for first in range(a, z, 64):
                sample = np.arange(first, min(first + 64, z))
                blocks.append(sample[~held[sample]])
    nblocks = len(blocks)
    key = epoch_order.derive_key(seed, 0, 0)
    border = np.argsort(epoch_order.mix64(np.arange(nblocks, dtype=np.uint64) ^ key))
    order = []
    for g in range(-(-nblocks // gb)):
        docs = np.concatenate([blocks[b] for b in border[g * gb : (g + 1) * gb]])
        key = epoch_order.derive_key(seed, 0, 1, g)
        order.extend(docs[np.argsort(epoch_order.mix64(np.arange(len(docs), dtype=np.uint64) ^ key))])
    return np.concatenate([doc_tokens(d, lengths[d]) for d in order])


@pytest.mark.parametrize(
    "split,vf,bd,gb",
    [
        ("train", 0.0, 64, 4096),
        ("train", 0.0, 4, 3),
        ("train", 0.2, 4, 3),
        ("train", 0.2, 5, 2),
        ("val", 0.2, 4, 3),
    ],
)
def test_epoch_equals_plain_reference(corpus, monkeypatch, split, vf, bd, gb):
    """A whole epoch read through the mmap index = the plan computed the plain way; small groups (and
    held-out blocks) put block and group boundaries everywhere."""
    root, lengths = corpus
    monkeypatch.setattr(epoch_order, "BLOCK_DOCS", bd)
    monkeypatch.setattr(epoch_order, "GROUP_BLOCKS", gb)
    loader = dataset_loader(
        root,
        seq_len=SEQ,
        global_batch=G,
        micro_batch=2,
        seed=3,
        split=split,
        val_fraction=vf,
        check_separators=True,
    )
    it = iter(loader)
    got = epoch_stream([next(it) for _ in range(loader.steps_per_epoch)])
    shard_rows = DocIndex(root, read_dataset_info(root)).shard_rows.tolist()
    assert len(shard_rows) > 3  # samples end at shard ends too
    want = reference_stream(lengths, shard_rows, 3, split, vf, bd, gb)
    assert len(got) == loader.steps_per_epoch * G * (SEQ + 1) > 0
    assert np.array_equal(got, want[: len(got)])
    assert len(want) - len(got) == loader.dropped_tail_tokens


@pytest.mark.parametrize("n,low_bits", [(1, None), (7, None), (70_000, None), (3000, 60), (200, 63)])
def test_hashed_order_is_the_argsort(n, low_bits):
    """The sort-based permutation equals argsort of the hashes, also where high bits collide
    (low_bits=60 leaves 4 high bits: nearly every element is in a repaired run)."""
    key = epoch_order.derive_key(5, n)
    want = np.argsort(epoch_order.mix64(np.arange(n, dtype=np.uint64) ^ key))
    assert np.array_equal(epoch_order.hashed_order(n, key, low_bits=low_bits), want)


def _strip_index(root: Path) -> str:
    """Make `root` look like a dataset built before the index existed; returns its fingerprint."""
    info = read_dataset_info(root)
    shutil.rmtree(root / INDEX_DIR)
    del info["index"]
    info["fingerprint"] = fingerprint(info)
    (root / DATASET_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info["fingerprint"]


def _with_fingerprint(state: dict, fingerprint: str | None) -> dict:
    """A loader state as a run on a dataset with another fingerprint would have saved it."""
    plan = json.loads(state["data_plan"])
    plan["sources"][0]["fingerprint"] = fingerprint
    return {**state, "data_plan": json.dumps(plan)}


def _loader(root, **kw):
    return dataset_loader(root, seq_len=SEQ, global_batch=G, micro_batch=2, seed=1, **kw)


def _hashes(loader, n):
    it = iter(loader)
    return [batch_sha256(next(it)) for _ in range(n)]


def test_index_command_on_an_old_dataset(corpus, tmp_path, capsys):
    """An index-less dataset: loader and validate name the command; the command adds the index,
    is idempotent, and a checkpoint taken before it (old fingerprint) resumes bit-identically."""
    root = tmp_path / "old"
    shutil.copytree(corpus[0], root)
    want = _hashes(_loader(root), 6)
    old_fp = _strip_index(root)
    with pytest.raises(DatasetError, match=rf"no loader index .*`gristmill data index {root}`"):
        _loader(root)
    report = validate_dataset(root, progress=False, write=False)
    # not a fault of the data: a note naming the command, the dataset ok (review R26c M2)
    assert report.ok and report.notes == [
        f"index/: no loader index (an older gristmill's build), not this version's 'gristmill-index/3': "
        f"train and inspect read the dataset after `gristmill data index {root}`"
    ]
    # a manifest edited since the build was indexed and the new fingerprint committed (review R17e F4)
    manifest = sorted((root / "manifest").glob("*.parquet"))[0]
    kept = manifest.read_bytes()
    manifest.write_bytes(kept + b"\0")
    before = (root / DATASET_JSON).read_bytes()
    assert cli(["data", "index", str(root)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {manifest}: not the file dataset.json records")
    assert (root / DATASET_JSON).read_bytes() == before and not (root / INDEX_DIR).exists()
    manifest.write_bytes(kept)
    assert cli(["data", "index", str(root)]) == 0
    info = read_dataset_info(root)
    assert info["fingerprint_before_index"] == old_fp != info["fingerprint"]
    assert validate_dataset(root, progress=False, write=False).ok
    before = (root / DATASET_JSON).read_bytes()
    mtime = (root / INDEX_DIR / DOC_OFFSETS).stat().st_mtime_ns
    assert cli(["data", "index", str(root)]) == 0  # idempotent: nothing rewritten
    assert (root / DATASET_JSON).read_bytes() == before
    assert (root / INDEX_DIR / DOC_OFFSETS).stat().st_mtime_ns == mtime
    assert "is complete" in capsys.readouterr().out
    # a bucket's dataset: one line naming the command that gives it an index, not a path "not found"
    assert cli(["data", "index", "s3://bucket/old"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: s3://bucket/old: `gristmill data index` writes into a local dataset") and (
        "`gristmill data upload DIR NEW_URL`" in err and "\n" not in err
    ), err

    # A state saved at step 3 by a run on the index-less dataset (its fingerprint was old_fp).
    first = _loader(root)
    _hashes(first, 3)
    state = _with_fingerprint(first.state_dict(), old_fp)
    resumed = _loader(root)
    resumed.load_state_dict(state)
    assert _hashes(resumed, 3) == want[3:]
    with pytest.raises(LoaderStateError, match="the fingerprint of source 'data'") as refused:
        _loader(root).load_state_dict(_with_fingerprint(state, "0" * 64))
    # where the dataset is, and where the one trained is named (trial RV64a 2d)
    assert f"is {info['fingerprint']!r} at {root}, but the checkpoint's plan has {'0' * 64!r}" in str(
        refused.value
    ) and "the run's config.toml names it" in str(refused.value), refused.value


def test_damaged_index_is_named_and_repaired(corpus, tmp_path, monkeypatch):
    root = tmp_path / "damaged"
    shutil.copytree(corpus[0], root)
    want = _hashes(_loader(root), 2)
    path = root / INDEX_DIR / DOC_OFFSETS
    data = path.read_bytes()
    path.write_bytes(data[:-4])
    with pytest.raises(DatasetError, match=rf"{path} is {len(data) - 4} bytes .*gristmill data index"):
        _loader(root)
    # two rows swapped in doc_offsets.bin and doc_tokens.bin: every document whole, in other rows, so
    # other batches than the plan's, which the separator check at read and verify (the same index)
    # passed (trial RV70g 1). The open hashes index files up to MAX_SUM_BYTES against dataset.json
    lengths = root / INDEX_DIR / DOC_TOKENS
    tokens = lengths.read_bytes()
    swap = lambda b, w: b[w : 2 * w] + b[:w] + b[2 * w :]  # rows 0 and 1
    for f, b in ((path, data), (lengths, tokens)):
        f.write_bytes(swap(b, 4))
    edited = r": its sha256 is not the one .*dataset.json records: the index was damaged or edited after the "
    edited += "build; "
    with pytest.raises(
        DatasetError, match=rf"^{root / INDEX_DIR}/doc_[a-z]*\.bin{edited}rerun `gristmill data index"
    ):
        _loader(root)
    lengths.write_bytes(tokens)
    path.write_bytes(data[:-4] + b"\xff\xff\xff\x7f")  # right size, wrong content
    report = validate_dataset(root, progress=False, write=False)
    assert [p.shard for p in report.problems] == [f"{INDEX_DIR}/{DOC_OFFSETS}"]
    with pytest.raises(DatasetError, match=rf"^{path}{edited}"):
        DocumentTable(root)
    # a larger file is trusted at open, and read there: the last row's ids past its shard's end, a
    # numpy broadcast error mid-run (trial RV57d F2)
    monkeypatch.setattr(dataset_index, "MAX_SUM_BYTES", 0)
    table = DocumentTable(root)
    last = table.documents - 1
    past = rf"{path} places manifest row {last}'s ids past the end of shards/.*gristmill data index"
    with pytest.raises(DatasetError, match=past):
        table.document(last)
    (root / "index.tmp").mkdir()  # a killed earlier `data index`
    assert cli(["data", "index", str(root)]) == 0
    assert not (root / "index.tmp").exists()
    assert validate_dataset(root, progress=False, write=False).ok
    assert _hashes(_loader(root), 2) == want


def test_training_path_never_reads_the_manifest(corpus, tmp_path):
    """With manifest/ gone the loader opens and reads the same batches: it reads index/ only."""
    root = tmp_path / "no-manifest"
    shutil.copytree(corpus[0], root)
    want = _hashes(_loader(root, val_fraction=0.2), 3)
    shutil.rmtree(root / "manifest")
    loader = _loader(root, val_fraction=0.2)
    assert _hashes(loader, 3) == want
    # Workers get the index by path, not a pickled copy of the arrays.
    index = loader.builder.tables[0].index
    assert isinstance(index.tokens, np.memmap)
    clone = pickle.loads(pickle.dumps(index))
    assert len(pickle.dumps(index)) < 2000 and np.array_equal(clone.offsets, index.offsets)


def test_index_files_are_what_dataset_json_says(corpus):
    root, lengths = corpus
    info = read_dataset_info(root)
    idx = DocIndex(root, info)
    assert np.array_equal(idx.tokens, [lengths[d] for d in range(len(lengths))])
    assert idx.shard_rows[-1] == info["documents"] and len(idx.shard_rows) == info["shards"] + 1
    for name, spec in info["index"]["files"].items():
        assert (root / INDEX_DIR / name).stat().st_size == spec["bytes"]
    assert SEP == 0


@pytest.mark.parametrize("chunk", [16384, 7])
def test_the_held_out_rows_are_a_prefix_of_heldout_bin(corpus, tmp_path, monkeypatch, chunk):
    """heldout.bin's prefix at any val_fraction is exactly the rows the hash holds out, with their
    lengths; read in chunks of 7 entries too (each checked against its sha256); a flipped byte in the
    file is one line naming it."""
    root, lengths = corpus
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    monkeypatch.setattr(heldout, "CHUNK", chunk)
    write_index(copy, read_dataset_info(copy))  # same bytes at the default chunk; 7: many chunks
    idx = DocIndex(copy, read_dataset_info(copy) | {"index": index_entry(copy)})
    n = len(lengths)
    for vf in (0.0, 0.001, 0.05, 0.2, 0.5, 0.99):
        rows, tokens = idx.heldout(vf) if vf else (np.zeros(0, np.int64),) * 2
        want = np.flatnonzero(epoch_order.heldout_mask(0, n, vf))
        assert np.array_equal(rows, want) and tokens.tolist() == [lengths[r] for r in want.tolist()], vf
    body = bytearray((copy / INDEX_DIR / HELDOUT).read_bytes())
    body[3] ^= 1
    (copy / INDEX_DIR / HELDOUT).write_bytes(bytes(body))
    last = min(chunk, n) * heldout.ENTRY.itemsize - 1  # the range's bytes, its end included
    said = rf"heldout.bin: chunk 0 \(bytes 0–{last:,}\) does not hash as heldout_sha256.bin says"
    with pytest.raises(DatasetError, match=said):
        idx.heldout(0.2)


@pytest.mark.parametrize("chunk", [16384, 7])
def test_heldout_bin_is_the_same_sorted_in_memory_or_through_the_bins(tmp_path, monkeypatch, chunk):
    """SortedWriter keeps up to HELD entries in memory and makes its 256 bin files only past that: both
    ways give the entries in hash order, cut into the same chunks with the same sha256s, whatever the
    order and the batches the rows came in; the bins are made only when needed."""
    monkeypatch.setattr(heldout, "CHUNK", chunk)
    rng = np.random.default_rng(3)
    rows = rng.permutation(5000).astype(np.uint64)
    tokens = rng.integers(1, 1 << 20, len(rows)).astype(np.uint32)
    want = heldout.sorted_entries(rows, tokens)
    assert (np.diff(heldout.row_hash(want["row"]).astype(np.float64)) > 0).all()  # hash order
    cuts = [0, 1, 17, 1999, 2000, 4096, 4990, 5000]  # the last 10 still held when the bins are read
    for held in (heldout.SortedWriter.HELD, 100):
        scratch = tmp_path / f"held-{held}"
        scratch.mkdir()
        monkeypatch.setattr(heldout.SortedWriter, "HELD", held)
        writer = heldout.SortedWriter(str(scratch))
        for a, b in zip(cuts[:-1], cuts[1:]):
            writer.add(rows[a:b], tokens[a:b])
        assert (len(list(scratch.iterdir())) == heldout.SortedWriter.BINS) == (held < len(rows)), held
        got = list(writer.chunks())
        assert [len(c) for c in got] == [min(chunk, len(rows) - i) for i in range(0, len(rows), chunk)]
        assert np.concatenate(got).tobytes() == want.tobytes(), held
        assert writer.digests == [hashlib.sha256(c.tobytes()).digest() for c in got]
    empty = heldout.SortedWriter(str(tmp_path))
    assert list(empty.chunks()) == [] and empty.digests == []


def index_entry(root: Path) -> dict:
    """The "index" entry of the files now in root/index/ (what write_index returned)."""
    from training.contract.dataset_index import expected_index

    return expected_index(root, read_dataset_info(root))


def test_a_plan_1_state_resumes_only_where_the_blocks_are_the_same(corpus):
    """Plan /1 cut training blocks from the training documents: its state resumes where that gives
    the build's samples (nothing held out, samples at multiples of 64 rows), and is refused in one
    line otherwise."""
    lengths = np.full(256, 5)
    assert epoch_order.DocBlocks.of_lengths(lengths, np.array([0, 128, 256])).same_as_plan_1()
    assert not epoch_order.DocBlocks.of_lengths(lengths, np.array([0, 100, 256])).same_as_plan_1()
    assert not epoch_order.DocBlocks.of_lengths(
        lengths, np.array([0, 128, 256]), val_fraction=0.1
    ).same_as_plan_1()
    assert epoch_order.DocBlocks.of_lengths(lengths, split="val", val_fraction=0.1).same_as_plan_1()
    root, _ = corpus
    loader = _loader(root, val_fraction=0.2)
    state = loader.state_dict()
    old = {**state, "data_plan": state["data_plan"].replace("gristmill-plan/2", "gristmill-plan/1")}
    with pytest.raises(LoaderStateError, match=r"data order 'gristmill-plan/1'.* start a new run") as e:
        _loader(root, val_fraction=0.2).load_state_dict(old)
    # the key that takes the weights, and the export it needs (it said train.init_from: review R26c M1)
    assert "(`gristmill export RUN`, then model.init_from = RUN/exports/step-N)" in str(e.value)
    assert str(e.value).endswith(
        "moved back to dataset.json first (the export checks the run's datasets too: review RV26e M2)"
    )
    val = _loader(root, split="val", val_fraction=0.2)
    state = val.state_dict()
    val.load_state_dict(
        {**state, "data_plan": state["data_plan"].replace("gristmill-plan/2", "gristmill-plan/1")}
    )


@pytest.mark.parametrize("vf,split", [(0.0, "train"), (0.2, "train"), (0.2, "val")])
def test_block_table_shared_through_the_cache(corpus, tmp_path, monkeypatch, caplog, vf, split):
    """The first process saves the split's block table, later ones memory-map it and read the same
    batches; a damaged entry is recomputed, an unusable cache directory means computing in-process."""
    root, _ = corpus
    kw = dict(val_fraction=vf, split=split)
    want = _hashes(_loader(root, **kw), 3)
    monkeypatch.setattr(order_cache, "MIN_DOCS", 0)
    monkeypatch.setenv("GRISTMILL_CACHE", str(tmp_path / "cache"))
    first = _loader(root, **kw)
    second = _loader(root, **kw)
    assert isinstance(second.builder.tables[0].blocks.block_tokens, np.memmap)
    assert _hashes(first, 3) == _hashes(second, 3) == want
    assert isinstance(second.builder.order(0).block_order, np.memmap)
    entries = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert entries == ["blocks", "plan"]
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("blocks-") and p.is_dir()]

    (entry / "block_tokens.npy").write_bytes(b"damaged")
    with caplog.at_level("WARNING", logger="training.data.loader"):
        assert _hashes(_loader(root, **kw), 3) == want
    assert "recomputing the damaged cache entry" in caplog.text
    assert len(np.load(entry / "block_tokens.npy")) > 0

    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("GRISTMILL_CACHE", str(tmp_path / "file" / "cache"))
    with caplog.at_level("WARNING", logger="training.data.loader"):
        assert _hashes(_loader(root, **kw), 3) == want
    assert "computing it here" in caplog.text


def test_a_cache_entry_damaged_in_a_way_its_arrays_allow_is_recomputed(corpus, tmp_path, monkeypatch, caplog):
    """Two blocks of an epoch's cached order swapped (still a permutation, of the right length) read
    the epoch in another order, exit 0; one repeated stopped every open with an error about the index
    that named no cache, and `data validate` said OK (review R30b F2). An entry's files are checked
    against the sha256 saved with them: a damaged one is recomputed."""
    root, _ = corpus
    want = _hashes(_loader(root), 3)
    monkeypatch.setattr(order_cache, "MIN_DOCS", 0)
    monkeypatch.setenv("GRISTMILL_CACHE", str(tmp_path / "cache"))
    assert _hashes(_loader(root), 3) == want
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("plan-") and p.is_dir()]
    order = np.load(entry / "block_order.npy")
    for damage in ("swapped", "repeated"):
        bad = order.copy()
        bad[[0, -1] if damage == "swapped" else [1]] = bad[[-1, 0] if damage == "swapped" else [0]]
        np.save(entry / "block_order.npy", bad)
        caplog.clear()
        with caplog.at_level("WARNING", logger="training.data.loader"):
            assert _hashes(_loader(root), 3) == want, damage
        assert "recomputing the damaged cache entry" in caplog.text, damage
        assert np.array_equal(np.load(entry / "block_order.npy"), order), damage


def test_fingerprint_before_index_is_recomputed_never_trusted(corpus, tmp_path):
    """`data index` refuses an edited fingerprint; a hand-written fingerprint_before_index (or a
    state without a fingerprint) does not let a foreign checkpoint resume."""
    root = tmp_path / "edited"
    shutil.copytree(corpus[0], root)
    _strip_index(root)
    info = read_dataset_info(root)
    (root / DATASET_JSON).write_text(json.dumps({**info, "fingerprint": "f" * 64}))
    with pytest.raises(DatasetError, match="recorded fingerprint does not match"):
        cli_index(root)
    # its last digit edited: both shown to where they differ, not as the same 12 characters (RV70g 5)
    last = "0" if info["fingerprint"][-1] != "0" else "1"
    (root / DATASET_JSON).write_text(json.dumps({**info, "fingerprint": info["fingerprint"][:-1] + last}))
    with pytest.raises(DatasetError) as e:
        cli_index(root)
    assert f"({info['fingerprint'][:-1] + last} recorded, {info['fingerprint']} computed)" in str(e.value)
    (root / DATASET_JSON).write_text(json.dumps(info))
    cli_index(root)
    trained = _loader(root)
    _hashes(trained, 2)  # a state with a past: at step 0 there is nothing a resume could change
    state = trained.state_dict()
    info = read_dataset_info(root)
    (root / DATASET_JSON).write_text(json.dumps({**info, "fingerprint_before_index": "f" * 64}))
    for bad in ("f" * 64, None):
        with pytest.raises(LoaderStateError, match="the fingerprint of source 'data'"):
            _loader(root).load_state_dict(_with_fingerprint(state, bad))
    report = validate_dataset(root, progress=False, write=False)
    assert [str(p) for p in report.problems] == [
        "dataset.json: fingerprint_before_index does not match its fields (edited)"
    ]


def cli_index(root: Path) -> None:
    index_dataset(root, log=lambda *a: None)


def test_cache_entry_missing_an_array_is_recomputed(corpus, tmp_path, monkeypatch, caplog):
    """An entry without the training split's document starts must not be used."""
    root, _ = corpus
    want = _hashes(_loader(root, val_fraction=0.2), 3)
    monkeypatch.setattr(order_cache, "MIN_DOCS", 0)
    monkeypatch.setenv("GRISTMILL_CACHE", str(tmp_path / "cache"))
    _loader(root, val_fraction=0.2)
    for p in (tmp_path / "cache").glob("*/_doc_start.npy"):
        p.unlink()
    with caplog.at_level("WARNING", logger="training.data.loader"):
        assert _hashes(_loader(root, val_fraction=0.2), 3) == want
    assert "recomputing the damaged cache entry" in caplog.text  # (its files are not the ones saved)


@pytest.mark.parametrize("cached", [False, True])
def test_workers_get_paths_not_copies(corpus, tmp_path, monkeypatch, cached):
    """A pickled batch builder (what spawn/forkserver DataLoader workers receive) carries no
    per-document array: the clone maps the index (and cached tables) again and builds the same batch."""
    root, _ = corpus
    if cached:
        monkeypatch.setattr(order_cache, "MIN_DOCS", 0)
        monkeypatch.setenv("GRISTMILL_CACHE", str(tmp_path / "cache"))
    loader = _loader(root, val_fraction=0.2)
    builder = loader.builder
    builder.batch(0)  # plans epoch 0: the plan must not travel either
    blob = pickle.dumps(builder)
    clone = pickle.loads(blob)
    assert np.asarray(loader.builder.tables[0].lengths).tobytes() not in blob  # no copy of the lengths
    assert np.asarray(loader.builder.tables[0].index.offsets).tobytes() not in blob
    if cached:  # cached tables travel as paths too
        assert np.asarray(builder.order(0).block_order).tobytes() not in blob
    assert isinstance(clone.tables[0].lengths, np.memmap) and clone.tables[0].lengths.filename
    assert batch_sha256(clone.batch(5)) == batch_sha256(builder.batch(5))


def test_a_group_whose_lengths_differ_from_the_index_totals_is_refused():
    """A group's documents must hold the tokens the sample totals give it: lengths that disagree (an
    index that does not describe the shards) stop the plan instead of cutting other windows."""
    lengths = np.arange(1, 301)
    blocks = epoch_order.DocBlocks.of_lengths(lengths, np.array([0, 150, 300]))
    order = epoch_order.EpochOrder(blocks, seed=1, epoch=0, group_blocks=2)
    order.segments(0, order.tokens)  # as the index says: fine
    blocks.lengths = lengths.copy()
    blocks.lengths[7] += 1
    with pytest.raises(
        DatasetError, match=r"epoch group \d: sample 0's documents hold 2\d+ tokens but the index"
    ):
        epoch_order.EpochOrder(blocks, seed=1, epoch=0, group_blocks=2).segments(0, order.tokens)


@pytest.mark.parametrize("by_need", [False, True])
def test_a_sample_of_held_out_rows_alone_whose_total_is_not_theirs_is_refused(by_need):
    """A sample whose every row is held out has no training document, so no length of it is ever read:
    its index total (less its held-out rows' tokens) must be 0, checked when its group is made; else
    the group's windows were cut short or misaligned with no error (review RV43b 1)."""
    n, vf = 40, 0.5
    lengths = np.random.default_rng(0).integers(5, 50, n)
    shard_rows = np.arange(n + 1)  # a document a shard: a sample a document
    held = np.flatnonzero(epoch_order.heldout_mask(0, n, vf))
    totals = sample_totals(lengths, shard_rows)
    totals[held[0]] += 7
    blocks = epoch_order.DocBlocks(sample_starts(shard_rows), totals, held, lengths[held], val_fraction=vf)
    blocks.lengths = _AskedLengths(lengths) if by_need else lengths
    order = epoch_order.EpochOrder(blocks, seed=1, epoch=0, group_blocks=4096)
    refused = (
        rf"epoch group 0: sample {held[0]}'s documents hold 0 tokens but the index's sample totals say 7"
    )
    with pytest.raises(DatasetError, match=refused):
        order.segments(0, 10)


class _AskedLengths:
    """Lengths read as a bucket's are (block_cache.SampleLengths: `fetched`, each read may fetch), the
    rows asked for kept."""

    fetched = True

    def __init__(self, lengths: np.ndarray):
        self.lengths, self.asked = lengths, set()

    def __getitem__(self, rows):
        self.asked.update(np.asarray(rows).tolist())
        return self.lengths[rows]


@pytest.mark.parametrize("vf,gb", [(0.0, 4096), (0.2, 4096), (0.2, 7)])
def test_a_group_read_by_need_plans_as_the_whole_group_and_reads_the_samples_its_steps_reach(vf, gb):
    """A bucket's group is planned as its steps reach it (a length read fetches its sample): the first
    window reads the lengths of a few samples, not of the group (a dataset smaller than a group was
    fetched whole before its first step: RV42a), each sample whole, and any ranges, in any order, are
    cut exactly as the group planned whole cuts them."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 400, 40_000)
    shard_rows = np.array([0, 13_000, 27_003, 40_000])
    whole = epoch_order.DocBlocks.of_lengths(lengths, shard_rows, val_fraction=vf)
    by_need = epoch_order.DocBlocks.of_lengths(lengths, shard_rows, val_fraction=vf)
    asked = by_need.lengths = _AskedLengths(lengths)
    a = epoch_order.EpochOrder(whole, seed=2, epoch=0, group_blocks=gb)
    b = epoch_order.EpochOrder(by_need, seed=2, epoch=0, group_blocks=gb)
    first = b.segments(0, 2049)
    assert all(np.array_equal(x, y) for x, y in zip(first, a.segments(0, 2049)))
    starts = sample_starts(shard_rows)
    sample_of = lambda rows: np.searchsorted(starts, rows, side="right") - 1  # noqa: E731
    read = np.unique(sample_of(np.array(sorted(asked.asked))))
    assert set(sample_of(first[0]).tolist()) <= set(read.tolist())
    assert 0 < len(read) <= 40 < len(whole.block_tokens) // 4, len(read)  # ~13 documents
    held = epoch_order.heldout_mask(0, len(lengths), vf) if vf else np.zeros(len(lengths), bool)
    in_read = np.isin(sample_of(np.arange(len(lengths))), read)
    assert asked.asked == set(np.flatnonzero(in_read & ~held).tolist())  # each sample read whole
    ends = np.sort(rng.integers(0, a.tokens + 1, 60))
    for lo, hi in rng.permutation(np.stack([ends[:-1], ends[1:]], 1)).tolist():
        assert all(np.array_equal(x, y) for x, y in zip(b.segments(lo, hi), a.segments(lo, hi)))
    assert all(np.array_equal(x, y) for x, y in zip(b.segments(0, b.tokens), a.segments(0, a.tokens)))


def test_an_index_of_an_older_format_is_refused_then_upgraded(corpus, tmp_path, capsys):
    """A dataset indexed before the sample totals existed: opening it is one line naming `gristmill
    data index`, which derives the index again in this format; then the loader reads it."""
    root, _ = corpus
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    info = read_dataset_info(copy)
    old = {k: v for k, v in info["index"]["files"].items() if k in ("doc_tokens.bin", "doc_offsets.bin")}
    info["index"] = {
        "format": "gristmill-index/1",
        "files": {**old, "shard_rows.bin": info["index"]["files"]["shard_rows.bin"]},
    }
    info["fingerprint"] = fingerprint(info)
    (copy / DATASET_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    with pytest.raises(DatasetError, match=r"index format 'gristmill-index/1' is not .*gristmill data index"):
        _loader(copy)
    index_dataset(copy, log=print)
    assert "upgraded to 'gristmill-index/3" in capsys.readouterr().out
    assert _hashes(_loader(copy, val_fraction=0.2), 3) == _hashes(_loader(root, val_fraction=0.2), 3)


def test_a_relative_dataset_path_names_the_working_directory(tmp_path, monkeypatch):
    """A run's recipe keeps data.dataset as written; `data inspect RUN` from another directory said
    "runs/data/demo is not a gristmill dataset (build one …)" of a dataset that exists (review R14b)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError) as relative:
        read_dataset_info("runs/data/demo")
    assert f"not found from the working directory {tmp_path}: runs/data/demo is not" in str(relative.value)
    assert str(relative.value).endswith("or run the command where that relative path was written)")
    with pytest.raises(DatasetError) as absolute:
        read_dataset_info(tmp_path / "demo")
    assert str(absolute.value) == (
        f"{tmp_path / 'demo' / DATASET_JSON} not found: {tmp_path / 'demo'} is not a gristmill dataset "
        "(build one with `gristmill data build`)"
    )
    (tmp_path / "demo").mkdir()  # the record itself named: its directory said (RV70g 8)
    (tmp_path / "demo" / DATASET_JSON).write_text("{}")
    with pytest.raises(DatasetError) as record:
        read_dataset_info(tmp_path / "demo" / DATASET_JSON)
    assert str(record.value) == (
        f"{tmp_path / 'demo' / DATASET_JSON} is a dataset's record: name its directory, {tmp_path / 'demo'}"
    )

    # found, but another dataset: said as read from here, not only "rebuilt or replaced" (RV64a 2e)
    run = {"sources": [{"name": "data", "fingerprint": "f" * 64}]}
    for location, said in (("runs/data/demo", True), (str(tmp_path / "demo"), False)):
        with pytest.raises(DatasetError) as other:
            check_trained_on(tmp_path / "run", "data", location, {"fingerprint": "e" * 64}, "fix", run)
        assert (
            f"{location} (from this working directory: {tmp_path / location}; if the run started in "
            "another, run the command there) is not the dataset" in str(other.value)
        ) is said, other.value
        assert f"source 'data': {location}" in str(other.value)


def test_the_documents_sum_is_of_the_documents_not_their_order(corpus):
    """dataset.json's index.documents_sha256_sum: each document's sha256 as a big-endian integer, summed
    mod 2**256: one value whatever the order (what tells a resharded build of one corpus: R30b F1),
    a duplicate adds instead of cancelling (as XOR would), and one summed in pieces is the same."""
    root, info = corpus[0], read_dataset_info(corpus[0])
    hashes = np.fromfile(root / INDEX_DIR / DOC_HASHES, np.dtype(("V", 32)))
    plain = sum(int.from_bytes(h.tobytes(), "big") for h in hashes) % (1 << 256)
    assert info["index"][DOCUMENTS_SUM] == f"{plain:064x}"
    assert sum_hashes(hashes[::-1]) == sum_hashes(hashes[:100], sum_hashes(hashes[100:])) == plain
    twice = sum_hashes(np.concatenate([hashes[:1], hashes[:1]]))
    assert twice == 2 * int.from_bytes(hashes[0].tobytes(), "big") % (1 << 256) != 0


def test_shared_documents_are_told_by_all_32_bytes_of_their_sha256(corpus):
    """Sources that share some documents (trial RV70b 1) are compared on the records the sum's one read
    of doc_sha256.bin kept: a first 8 bytes in common picks a candidate, all 32 decide, and a document
    held twice beside another of its first 8 bytes is still found."""
    root = corpus[0]
    hashes = np.fromfile(root / INDEX_DIR / DOC_HASHES, np.dtype(("V", 32)))
    pieces: list[np.ndarray] = []
    assert sum_doc_hashes_file(root, read_dataset_info(root)["index"], keep=pieces) is not None
    assert np.concatenate(pieces).tobytes() == hashes.tobytes()
    rng = np.random.default_rng(3)
    decoys = hashes[:40].copy()  # the same first 8 bytes, another last one
    decoys.view(np.uint8).reshape(-1, 32)[:, 31] ^= 1
    other = np.concatenate([hashes[rng.permutation(len(hashes))[:50]], decoys, hashes[30:32]])
    every = [np.arange(len(h)) for h in (hashes, other)]
    held = {h.tobytes() for h in other}
    want = [r for r, h in enumerate(hashes) if h.tobytes() in held]
    assert 0 < len(want) < 40 + 50 and rows_among(hashes, other, *every).tolist() == want
    some = np.arange(0, len(other), 2)  # of given rows only
    want = [r for r, h in enumerate(hashes) if h.tobytes() in {other[k].tobytes() for k in some}]
    assert rows_among(hashes, other, every[0], some).tolist() == want
    unlike = np.frombuffer(rng.bytes(32 * 9), np.dtype(("V", 32)))
    assert rows_among(hashes, unlike, every[0], np.arange(9)).size == 0


def test_a_doc_sha256_bin_not_as_recorded_is_never_summed(corpus, tmp_path):
    """The sum of an index written before the record is taken from doc_sha256.bin only once it hashes as
    dataset.json records (content checked before trusted; review RV31b): two of its rows swapped, which
    sum alike, are not the file the build wrote."""
    entry = read_dataset_info(corpus[0])["index"]
    hashes = np.fromfile(corpus[0] / INDEX_DIR / DOC_HASHES, np.dtype(("V", 32)))
    (tmp_path / INDEX_DIR).mkdir()
    hashes.tofile(tmp_path / INDEX_DIR / DOC_HASHES)
    assert sum_doc_hashes_file(tmp_path, entry) == entry[DOCUMENTS_SUM]
    hashes[[3, 7]] = hashes[[7, 3]]
    hashes.tofile(tmp_path / INDEX_DIR / DOC_HASHES)
    assert sum_hashes(hashes) == int(entry[DOCUMENTS_SUM], 16)
    assert sum_doc_hashes_file(tmp_path, entry) is None


def test_doc_sha256_bin_is_summed_a_piece_at_a_time(tmp_path, monkeypatch):
    """`data upload` and `data index` sum doc_sha256.bin of any size (48 GB at 1.5B documents): read a
    piece at a time, never whole into memory (it was: review RV31b F2)."""
    hashes = np.random.default_rng(0).integers(0, 256, (1 << 17, 32), np.uint8)  # 4 MiB
    (tmp_path / INDEX_DIR).mkdir()
    path = tmp_path / INDEX_DIR / DOC_HASHES
    hashes.tofile(path)
    spec = {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    monkeypatch.setattr(dataset_index, "_SUM_READ", 64 << 10)
    tracemalloc.start()
    try:
        total = sum_doc_hashes_file(tmp_path, {"files": {DOC_HASHES: spec}})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == f"{sum_hashes(hashes):064x}"
    assert peak < 1 << 20, peak
