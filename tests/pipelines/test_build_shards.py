"""ShardWriter writes tar headers itself (fast path); the bytes must equal Python's tarfile output.
The manifest and excluded schemas, derived from the contract's table of source fields, must stay
the ones datasets were built with."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds

from pipelines.shard_writer import ShardWriter, _header, _member
from pipelines.sources import FINEWEB_EDU_SCHEMA, META_KEYS, NUMERIC_META_KEYS
from training.contract.dataset_format import EXCLUDED_SCHEMA, MANIFEST_SCHEMA, PROVENANCE_COLUMNS

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


def test_shards_are_byte_identical_to_tarfile(tmp_path):
    rng = np.random.default_rng(0)
    docs = []
    for i, n in enumerate([0, 1, 255, 256, 257, 700, 4096, 9999]):
        meta = {"id": f"doc-{i}", "url": "https://ex/ü", "score": 3.25, "int_score": 3}
        docs.append((f"t00003d{i:09d}", rng.integers(0, 50000, n).astype(np.uint16), meta))
    w = ShardWriter(tmp_path, 3, vocab_size=50000, target_bytes=12_000)
    for key, ids, meta in docs:
        w.add(key, ids, meta)
    rows = w.close()
    shards = sorted((tmp_path / "shards").glob("*.tar"))
    assert len(shards) > 1
    expected: dict[str, list] = {}
    for (key, ids, meta), row in zip(docs, rows):
        meta_bytes = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode()
        expected.setdefault(row["shard"], []).extend(
            [(f"{key}.ids", ids.tobytes()), (f"{key}.json", meta_bytes)]
        )
    for shard in shards:
        assert shard.read_bytes() == tarfile_reference(expected[shard.name])
    # Offsets in the manifest point at the .ids data; stock webdataset reads the same bytes.
    by_key = {r["key"]: r for r in rows}
    for sample in wds.WebDataset([str(s) for s in shards], shardshuffle=False):
        r = by_key[sample["__key__"]]
        data = (tmp_path / "shards" / r["shard"]).read_bytes()[r["offset"] : r["offset"] + r["nbytes"]]
        assert data == sample["ids"]
    assert len(by_key) == len(docs)


def test_headers_match_tarfile():
    long_name = "d" * 60 + "/" + "k" * 60 + ".ids"  # over 100 bytes: the tarfile fallback
    for name in ("a.ids", "short.json", "k" * 96 + ".ids", long_name):
        for size in (0, 1, 511, 512, 12345, 8**11 - 1):
            assert _header(name.encode(), size) == _member(name, size).tobuf(tarfile.USTAR_FORMAT)


def test_derived_schemas_are_byte_identical_to_the_old_ones(tmp_path):
    # The manifest gained the provenance columns at its end (issue 29); the old ones are unchanged.
    n_old = len(OLD_MANIFEST_SCHEMA)
    assert [(f.name, f.type) for f in MANIFEST_SCHEMA][n_old:] == list(PROVENANCE_COLUMNS)
    for new, old in (
        (pa.schema(list(MANIFEST_SCHEMA)[:n_old]), OLD_MANIFEST_SCHEMA),
        (EXCLUDED_SCHEMA, OLD_EXCLUDED_SCHEMA),
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
        "offset": 512,
        "nbytes": 10,
        "n_tokens": 5,
    }
    old_row |= {"id": "7", "url": "https://ex/ü", "dump": "CC-MAIN-2024-10", "score": 3.0, "int_score": 3}
    old_row |= {"language": "en", "language_score": 0.5}
    assert row == old_row and [type(v) for v in row.values()] == [type(v) for v in old_row.values()]
    pq.write_table(pa.Table.from_pylist([old_row], schema=OLD_MANIFEST_SCHEMA), tmp_path / "old.parquet")
    # the old columns' values, byte for byte; the provenance columns null when not given
    written = pq.read_table(tmp_path / "manifest" / "00000.parquet")
    assert written.select(OLD_MANIFEST_SCHEMA.names).equals(pq.read_table(tmp_path / "old.parquet"))
    names = [c for c, _ in PROVENANCE_COLUMNS]
    assert written.select(names).to_pylist() == [dict.fromkeys(names)]
