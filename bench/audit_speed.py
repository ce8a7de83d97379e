"""Benchmark: `gristmill data audit` summary report over a synthetic 10M-document manifest.

    .venv/bin/python -m bench.audit_speed [--docs 10000000] [--tasks 16] [--dir /tmp/x] [--repeat 3]

Writes a dataset directory holding only what the audit reads (manifest/*.parquet with every
contract column, excluded/*.parquet, datatrove-style logs/stats/*.json, dataset.json; no tars),
then times, in the same run:
  - the summary preset (views created, query run, rows fetched: what `audit DIR --report summary` does);
  - baseline 1: duckdb `SELECT count(*), sum(n_tokens), count(DISTINCT shard)` straight over the parquet;
  - baseline 2: pyarrow reading the columns the summary needs (shard, n_tokens).
Prints each time, the summary's ratio to the 5 s target and to both baselines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training.contract.dataset_format import (
    EXCLUDED_SCHEMA,
    FORMAT,
    MANIFEST_SCHEMA,
    fingerprint,
    record_files,
)
from validation.audit import run_preset
from validation.audit_views import connect, glob_literal, sql_str

TARGET_S = 5.0
DOCS_PER_SHARD = 5000


def _strings(prefix: str, values: np.ndarray, suffix: str = "") -> pa.Array:
    s = pc.cast(pa.array(values), pa.string())
    return pc.binary_join_element_wise(prefix, s, suffix, "")


def make_dataset(root: Path, docs: int, tasks: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    for sub in ("manifest", "excluded", "logs/stats"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    per_task = -(-docs // tasks)
    shard_files: dict[str, dict] = {}
    total_tokens = 0
    for t in range(tasks):
        lo, hi = t * per_task, min(docs, (t + 1) * per_task)
        n = hi - lo
        idx = np.arange(n)
        n_tokens = np.clip(rng.lognormal(6.5, 0.9, n), 16, 60000).astype(np.int64)
        shard_idx = idx // DOCS_PER_SHARD
        shard = _strings(f"{t:05d}_", shard_idx, ".tar")
        shard = pc.utf8_lpad(shard, 15, "0")
        offset = np.zeros(n, np.int64)
        nbytes = n_tokens * 2
        score = rng.uniform(2.5, 5.0, n)
        table = pa.table(
            {
                "shard": pc.cast(shard, pa.string()),
                "key": _strings(f"t{t:05d}d", idx),
                "offset": offset,
                "nbytes": nbytes,
                "n_tokens": n_tokens,
                "id": _strings("<urn:uuid:", np.arange(lo, hi), ">"),
                "url": pc.binary_join_element_wise(
                    _strings("https://site", (idx * 7919) % 50000, ".org/page"), _strings("", idx), ""
                ),
                "dump": pa.DictionaryArray.from_arrays(
                    pa.array(rng.integers(0, 8, n).astype(np.int32)),
                    pa.array([f"CC-MAIN-2024-{w:02d}" for w in range(10, 18)]),
                ).cast(pa.string()),
                "score": score,
                "int_score": np.round(score).astype(np.int64),
                "language": pa.array(["en"] * n),
                "language_score": rng.uniform(0.65, 1.0, n),
                # the columns every manifest has since 5e67c24 (the audit reads them): nulls or filler
                "token_count": pa.nulls(n, pa.int64()),
                "source_file": pa.array([f"part-{t:05d}.parquet"] * n),
                "source_row": idx,
                "text_hash": _strings("h", np.arange(lo, hi)),
                "sha256": pa.array([i.to_bytes(32, "little") for i in range(lo, hi)], pa.binary(32)),
            },
            schema=MANIFEST_SCHEMA,
        )
        pq.write_table(table, root / "manifest" / f"{t:05d}.parquet")
        for s in range(int(shard_idx.max()) + 1 if n else 0):
            m = shard_idx == s
            shard_files[f"{t:05d}_{s:05d}.tar"] = {
                "bytes": int(nbytes[m].sum()),
                "sha256": f"{t:05d}{s:059d}",
                "documents": int(m.sum()),
                "tokens": int(n_tokens[m].sum()),
            }
        total_tokens += int(n_tokens.sum())
        # ~20% of the documents read were dropped, by two filters
        n_drop = n // 4
        which = rng.integers(0, 2, n_drop)
        reason = pc.if_else(
            pa.array(which == 0),
            _strings("int_score ", rng.integers(0, 3, n_drop), " < 3"),
            _strings("", rng.integers(1, 200, n_drop), " chars < min_chars 200"),
        )
        excl = pa.table(
            {
                "id": _strings(f"<urn:uuid:x{t}-", np.arange(n_drop), ">"),
                "url": _strings("https://dropped", np.arange(n_drop), ".org/"),
                "dump": pa.array(["CC-MAIN-2024-10"] * n_drop),
                "filter": pa.array(np.where(which == 0, "int_score", "length")),
                "reason": reason,
                "source_file": pa.array([f"in-{t:05d}.parquet"] * n_drop),
                "source_row": pa.array(np.arange(n_drop), pa.int64()),
            },
            schema=EXCLUDED_SCHEMA,
        )
        pq.write_table(excl, root / "excluded" / f"{t:05d}_all.parquet")
        d_int, d_len = int((which == 0).sum()), int((which == 1).sum())
        read = n + n_drop
        stats = [
            {"name": "📖 - READER: 📒 Parquet (gristmill)", "time_stats": 0,
             "stats": {"documents": {"total": read, "n": 4, "unit": "input_file"}}},
            {"name": "🔻 - FILTER: int_score", "time_stats": 0,
             "stats": {"total": read, "dropped": d_int, "forwarded": read - d_int}},
            {"name": "🔻 - FILTER: length", "time_stats": 0,
             "stats": {"total": read - d_int, "dropped": d_len, "forwarded": n}},
            {"name": "🔢 - TOKENIZE: tokenize + shard (gristmill)", "time_stats": 0,
             "stats": {"documents": {"total": n, "n": 9}, "tokens": {"total": int(n_tokens.sum()), "n": 9}}},
        ]  # fmt: skip
        (root / "logs" / "stats" / f"{t:05d}.json").write_text(json.dumps(stats))
    info = {
        "format": FORMAT,
        "tokenizer_sha256": "none",
        "vocab_size": 32768,
        "dtype": "uint16",
        "separator": {"token": "<|endoftext|>", "id": 0, "position": "after"},
        "config_sha256": "bench",
        "documents": docs,
        "tokens": total_tokens,
        "shards": len(shard_files),
        "shard_files": shard_files,
    }
    info["files"] = record_files(root)  # as a build records them: what the audit hashes at each audit
    info["fingerprint"] = fingerprint(info)
    info["status"] = "complete"
    (root / "dataset.json").write_text(json.dumps(info))
    return info


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs for every timing")
    ap.add_argument("--dir", help="where to write the synthetic dataset (default: a temporary dir, removed)")
    args = ap.parse_args()

    tmp = None if args.dir else tempfile.mkdtemp(prefix="audit-bench-")
    root = Path(args.dir or tmp) / "bench"
    try:
        t0 = time.perf_counter()
        info = make_dataset(root, args.docs, args.tasks)
        mb = sum(p.stat().st_size for p in (root / "manifest").glob("*.parquet")) / 1e6
        print(f"synthetic dataset: {args.docs:,} documents, {info['shards']:,} shards, manifest {mb:.0f} MB "
              f"in {args.tasks} files, written in {time.perf_counter() - t0:.1f} s")  # fmt: skip

        def summary():
            con, _ = connect([root])
            try:
                return run_preset(con, "summary").records()
            finally:
                con.close()

        def duck_scan():
            import duckdb

            # --dir as a literal (exp[1] is no pattern), the one glob its own (review RV32d 8)
            glob = sql_str(glob_literal(str(root / "manifest")) + "/*.parquet")
            return duckdb.sql(
                f"SELECT count(*), sum(n_tokens), count(DISTINCT shard) FROM read_parquet({glob})"
            ).fetchall()

        def arrow_read():
            t = pq.read_table(root / "manifest", columns=["shard", "n_tokens"])
            return t.num_rows, pc.sum(t.column("n_tokens")).as_py()

        t_sum, rows = best_of(summary, args.repeat)
        t_duck, scan = best_of(duck_scan, args.repeat)
        t_arrow, _ = best_of(arrow_read, args.repeat)
        kept = next(r for r in rows if r["item"] == "kept (manifest)")
        assert kept["documents"] == args.docs == scan[0][0] and kept["tokens"] == info["tokens"], (kept, scan)
        verdict = "OK" if t_sum < TARGET_S else "OVER"
        ratio = t_sum / TARGET_S
        print(
            f"summary report         {t_sum:7.3f} s   {ratio:.2f}x of the {TARGET_S:.0f} s target ({verdict})"
        )
        print(f"baseline duckdb scan   {t_duck:7.3f} s   summary / scan  = {t_sum / t_duck:.2f}x")
        print(f"baseline pyarrow read  {t_arrow:7.3f} s   summary / arrow = {t_sum / t_arrow:.2f}x")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
