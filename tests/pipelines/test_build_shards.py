"""ShardWriter writes tar headers itself (fast path); the bytes must equal Python's tarfile output, laid
out as gristmill-shards/3 says (and /2, which tests still write). The manifest and excluded schemas,
derived from the contract's table of source fields, must stay the ones datasets were built with."""

from __future__ import annotations

import hashlib
import io
import struct
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds

from pipelines.shard_writer import ShardWriter, _header, _member
from pipelines.sources import FINEWEB_EDU_SCHEMA, META_KEYS, NUMERIC_META_KEYS
from training.contract.dataset_format import (
    DOC_SHA256,
    EXCLUDED_SCHEMA,
    FORMAT,
    FORMAT_V2,
    MANIFEST_SCHEMA,
    PROVENANCE_COLUMNS,
    SAMPLE_DOCS,
    layout_offsets,
    layout_samples,
    sample_key,
)

# The schemas as they were spelled out before SOURCE_FIELDS (datasets on disk carry these).
OLD_MANIFEST_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("key", pa.string()),
        ("offset", pa.int64()),
        ("nbytes", pa.int64()),
        ("n_tokens", pa.int64()),
        ("id", pa.string()),
        ("url", pa.string()),
        ("dump", pa.string()),
        ("score", pa.float64()),
        ("int_score", pa.int64()),
        ("language", pa.string()),
        ("language_score", pa.float64()),
    ]
)
OLD_EXCLUDED_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("url", pa.string()),
        ("dump", pa.string()),
        ("filter", pa.string()),
        ("reason", pa.string()),
    ]
)
OLD_FINEWEB_EDU_SCHEMA = pa.schema(
    [
        ("text", pa.string()),
        ("id", pa.string()),
        ("url", pa.string()),
        ("dump", pa.string()),
        ("score", pa.float64()),
        ("int_score", pa.int64()),
        ("language", pa.string()),
        ("language_score", pa.float64()),
        ("token_count", pa.int64()),
    ]
)


def tarfile_reference(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            tf.addfile(_member(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [FORMAT, FORMAT_V2])
def test_shards_are_byte_identical_to_tarfile(tmp_path, fmt):
    rng = np.random.default_rng(0)
    docs = []
    sizes = [0, 1, 255, 256, 257, 700, 4096, 9999] + rng.integers(1, 300, 150).tolist()
    for i, n in enumerate(sizes):
        meta = {"id": f"doc-{i}", "url": "https://ex/ü", "score": 3.25, "int_score": 3}
        docs.append((f"t00003d{i:09d}", rng.integers(0, 50000, n).astype(np.uint16), meta))
    w = ShardWriter(tmp_path, 3, vocab_size=50000, target_bytes=30_000, fmt=fmt)
    for key, ids, meta in docs:
        w.add(key, ids, meta)
    rows = w.close()
    shards = sorted((tmp_path / "shards").glob("*.tar"))
    assert len(shards) > 1
    # A sample per SAMPLE_DOCS documents: (/3) `<key>.docs`, each document's uint32 n_tokens and the
    # sha256 of its ids, then `<key>.ids`, their ids back to back; a shard closes after a whole sample.
    expected: dict[str, list] = {}
    for k in range(0, len(docs), SAMPLE_DOCS):
        shard, key = rows[k]["shard"], sample_key(3, k // SAMPLE_DOCS)
        assert {r["shard"] for r in rows[k : k + SAMPLE_DOCS]} == {shard}
        sample = [ids.tobytes() for _, ids, _ in docs[k : k + SAMPLE_DOCS]]
        if fmt == FORMAT:
            records = b"".join(struct.pack("<I", len(d) // 2) + hashlib.sha256(d).digest() for d in sample)
            expected.setdefault(shard, []).append((f"{key}.docs", records))
        expected.setdefault(shard, []).append((f"{key}.ids", b"".join(sample)))
    for shard in shards:
        assert shard.read_bytes() == tarfile_reference(expected[shard.name])
    # Offsets in the manifest point at each document's ids, where the layout puts them; their sha256
    # is recorded; stock webdataset reads the samples' bytes (a .docs member as bytes).
    for (_, ids, _), r in zip(docs, rows):
        data = (tmp_path / "shards" / r["shard"]).read_bytes()[r["offset"] : r["offset"] + r["nbytes"]]
        assert data == ids.tobytes() and r["sha256"] == hashlib.sha256(data).digest()
    for shard in shards:
        mine = [r for r in rows if r["shard"] == shard.name]
        assert [r["offset"] for r in mine] == layout_offsets([r["nbytes"] for r in mine], fmt).tolist()
    samples = list(wds.WebDataset([str(s) for s in shards], shardshuffle=False))
    assert [sorted(s) for s in samples] == [
        sorted(["__key__", "__url__", "__local_path__", "ids"] + (["docs"] if fmt == FORMAT else []))
    ] * len(samples)
    for ext in ("docs", "ids") if fmt == FORMAT else ("ids",):
        assert [s[ext] for s in samples] == [d for m in expected.values() for n, d in m if n.endswith(ext)]


def test_layout_samples_is_where_the_writer_put_each_sample(tmp_path):
    # A shard's samples located from each one's document count and ids size alone: where tarfile finds
    # the members of real shards (the last sample of each task has fewer than SAMPLE_DOCS documents).
    rng = np.random.default_rng(1)
    for task, n_docs in enumerate((SAMPLE_DOCS * 5 + 17, SAMPLE_DOCS * 2, 3)):
        w = ShardWriter(tmp_path, task, vocab_size=70000, target_bytes=20_000)  # uint32 ids
        for i in range(n_docs):
            w.add(f"t{task:05d}d{i:09d}", rng.integers(1, 70000, int(rng.integers(1, 200))), {})
        w.close()
    shards = sorted((tmp_path / "shards").glob("*.tar"))
    assert len(shards) > 3
    for shard in shards:
        with tarfile.open(shard) as tf:
            members = tf.getmembers()
        docs = [m for m in members if m.name.endswith(".docs")]
        ids = [m for m in members if m.name.endswith(".ids")]
        assert [m.name for m in members] == [m.name for pair in zip(docs, ids) for m in pair]
        counts = [m.size // 36 for m in docs]
        at_docs, at_ids = layout_samples(counts, [m.size for m in ids])
        assert at_docs.tolist() == [m.offset_data for m in docs]
        assert at_ids.tolist() == [m.offset_data for m in ids]
        # One range per sample, from its records to the end of its ids.
        data = shard.read_bytes()
        for d, i, a, b in zip(docs, ids, at_docs.tolist(), (at_ids + [m.size for m in ids]).tolist()):
            assert data[a:b].startswith(data[d.offset_data : d.offset_data + d.size])
            assert data[a:b].endswith(data[i.offset_data : i.offset_data + i.size])
        assert layout_offsets([], FORMAT).tolist() == []
    with pytest.raises(ValueError, match="no layout formula"):
        layout_offsets([4, 4], "gristmill-shards/1")


def test_headers_match_tarfile():
    long_name = "d" * 60 + "/" + "k" * 60 + ".ids"  # over 100 bytes: the tarfile fallback
    for name in ("a.ids", "short.json", "k" * 96 + ".ids", long_name):
        for size in (0, 1, 511, 512, 12345, 8**11 - 1):
            assert _header(name.encode(), size) == _member(name, size).tobuf(tarfile.USTAR_FORMAT)


def test_derived_schemas_are_byte_identical_to_the_old_ones(tmp_path):
    # The manifest gained the provenance columns (issue 29), then the source's token_count (a /1
    # shard's .json member had it) and each document's sha256 (/2), at its end; the old ones are
    # unchanged (the excluded rows' too).
    n_old = len(OLD_MANIFEST_SCHEMA)
    assert [(f.name, f.type) for f in MANIFEST_SCHEMA][n_old:] == [
        ("token_count", pa.int64()),
        *PROVENANCE_COLUMNS,
        (DOC_SHA256, pa.binary(32)),
    ]
    # the excluded rows gained where the source has each document, at their end (trial RV64b M3)
    n_excluded = len(OLD_EXCLUDED_SCHEMA)
    assert [(f.name, f.type) for f in EXCLUDED_SCHEMA][n_excluded:] == [
        ("source_file", pa.string()),
        ("source_row", pa.int64()),
    ]
    for new, old in (
        (pa.schema(list(MANIFEST_SCHEMA)[:n_old]), OLD_MANIFEST_SCHEMA),
        (pa.schema(list(EXCLUDED_SCHEMA)[:n_excluded]), OLD_EXCLUDED_SCHEMA),
        (FINEWEB_EDU_SCHEMA, OLD_FINEWEB_EDU_SCHEMA),
    ):
        assert new.equals(old, check_metadata=True)
        assert new.serialize().to_pybytes() == old.serialize().to_pybytes()
    assert META_KEYS == ("url", "dump", "score", "int_score", "language", "language_score", "token_count")
    assert NUMERIC_META_KEYS == ("score", "int_score", "language_score", "token_count")

    # A manifest row as the writer fills it from the table: the old literal row, value for value,
    # so the parquet file comes out byte-identical too.
    meta = {"id": 7, "url": "https://ex/ü", "dump": "CC-MAIN-2024-10", "score": 3, "int_score": 3.0}
    meta |= {"language": "en", "language_score": 0.5, "token_count": 99}
    w = ShardWriter(tmp_path, 0, vocab_size=1000)
    w.add("t00000d000000000", np.arange(5, dtype=np.uint16), meta)
    (row,) = w.close()
    old_row = {
        "shard": "00000_00000.tar",
        "key": "t00000d000000000",
        "offset": 1536,  # /3: after the .docs header, its one record (padded) and the .ids header
        "nbytes": 10,
        "n_tokens": 5,
    }
    old_row |= {"id": "7", "url": "https://ex/ü", "dump": "CC-MAIN-2024-10", "score": 3.0, "int_score": 3}
    old_row |= {"language": "en", "language_score": 0.5}
    old = {k: row[k] for k in old_row}
    assert old == old_row and [type(v) for v in old.values()] == [type(v) for v in old_row.values()]
    assert row["token_count"] == 99
    pq.write_table(pa.Table.from_pylist([old_row], schema=OLD_MANIFEST_SCHEMA), tmp_path / "old.parquet")
    # the old columns' values, byte for byte; the provenance columns null when not given
    written = pq.read_table(tmp_path / "manifest" / "00000.parquet")
    assert written.select(OLD_MANIFEST_SCHEMA.names).equals(pq.read_table(tmp_path / "old.parquet"))
    names = [c for c, _ in PROVENANCE_COLUMNS]
    assert written.select(names).to_pylist() == [dict.fromkeys(names)]


@pytest.mark.parametrize("vocab_size, bad", [(65536, 70000), (65536, 65536), (70000, -1)])
def test_an_id_the_shards_cannot_hold_is_refused_not_wrapped(tmp_path, vocab_size, bad):
    """uint16 shards hold ids below 65,536: an id of 70,000 was cast to 4,464 (another real token) and
    65,536 to 0 (the separator), and nothing after the writer could tell. The build's encoder never
    gives one; any other writer (a synthetic dataset, a conversion) is refused at the document."""
    w = ShardWriter(tmp_path, 0, vocab_size=vocab_size)
    with pytest.raises(
        ValueError,
        match=f"document 'd0' has token ids from .*, which uint.. .vocab_size {vocab_size}. cannot hold",
    ):
        w.add("d0", np.array([1, bad, 0], np.int64), {})
