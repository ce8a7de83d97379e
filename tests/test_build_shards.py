"""ShardWriter writes tar headers itself (fast path); the bytes must equal Python's tarfile output."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import webdataset as wds

from pipelines.shard_writer import ShardWriter, _member


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
    from pipelines.shard_writer import _header

    long_name = "d" * 60 + "/" + "k" * 60 + ".ids"  # over 100 bytes: the tarfile fallback
    for name in ("a.ids", "short.json", "k" * 96 + ".ids", long_name):
        for size in (0, 1, 511, 512, 12345, 8**11 - 1):
            assert _header(name.encode(), size) == _member(name, size).tobuf(tarfile.USTAR_FORMAT)
