"""Build throughput vs raw tokenizer throughput, on one core, on the same generated corpus.

    .venv/bin/python bench/build_throughput.py [--mb 24] [--repeats 3]

1. Corpus: ≥ 20 MB of English prose made from the demo corpus (the standard library's docs):
   sentences reshuffled by a seeded RNG into FineWeb-Edu-sized documents, written as parquet with
   FineWeb-Edu's columns.
2. Tokenizer: the demo's 8192-token byte-level BPE, trained on the demo corpus.
3. Raw: `tokenizers` encode_batch_fast (add_special_tokens=False) over every document, in the
   build's batch size, RAYON_NUM_THREADS=1 — the ceiling for any pipeline around it.
4. Build: `gristmill data build` (pipelines.build.build) with 1 task and 1 worker on the same
   corpus: parquet read, filters, encode, spill, shuffle, tar + manifest writing, dataset.json
   (validation off: `gristmill data validate` is measured by its own benchmark). Same single
   thread for the tokenizer.
Prints both rates and their ratio (target ≥ 0.9); best of --repeats runs each.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core for the encoder
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.build import build  # noqa: E402
from pipelines.config import DataConfig  # noqa: E402
from pipelines.demo_corpus import SCHEMA, write_demo_corpus  # noqa: E402
from tokenization.tokenizer_io import train_bpe  # noqa: E402
from training.config_loader import load_config  # noqa: E402


def make_corpus(demo: Path, out: Path, mb: float, n_files: int = 4) -> list[str]:
    texts = pa.concat_tables([pq.read_table(f, columns=["text"]) for f in sorted(demo.glob("*.parquet"))])
    sentences = [
        s for t in texts.column("text").to_pylist() for s in re.split(r"(?<=[.!?])\s+", t) if len(s) > 20
    ]
    rng = np.random.default_rng(0)
    docs, total = [], 0
    while total < mb * 1e6:
        n = int(rng.integers(5, 60))
        doc = " ".join(sentences[i] for i in rng.integers(0, len(sentences), n))
        docs.append(doc)
        total += len(doc)
    out.mkdir(parents=True)
    per = -(-len(docs) // n_files)
    for f in range(n_files):
        chunk = docs[f * per : (f + 1) * per]
        rows = [
            {
                "text": t,
                "id": f"<urn:uuid:bench-{f}-{i}>",
                "url": f"https://bench.example/{f}/{i}",
                "dump": "CC-MAIN-2024-10",
                "score": 3.5,
                "int_score": 4,
                "language": "en",
                "language_score": 0.95,
                "token_count": len(t) // 4,
            }
            for i, t in enumerate(chunk)
        ]
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), out / f"bench-{f:02d}.parquet")
    return docs


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def raw_encode(tokenizer_path: Path, docs: list[str], batch_chars: int) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.encode_special_tokens = True
    tokens, batch, chars = 0, [], 0
    for d in docs:
        batch.append(d)
        chars += len(d)
        if chars >= batch_chars:
            tokens += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
            batch, chars = [], 0
    if batch:
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
    return tokens


def run_build(work: Path, corpus: Path, tokenizer: Path, i: int) -> dict:
    out = work / f"ds{i}"
    cfg = load_config(
        DataConfig,
        None,
        [
            f"output={out}",
            "source.kind=parquet",
            f"source.path={corpus}",
            f"tokenizer.path={tokenizer}",
            "build.tasks=1",
            "build.workers=1",
            "build.validate=false",
            "build.progress_interval=1e9",
            "build.min_free_gb=0.1",
            "shards.target_mb=64",
        ],
    )
    return build(cfg, log=lambda *a: None).info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=24.0, help="corpus size in MB of text (default 24)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()

    from loguru import logger

    logger.remove()  # datatrove's per-step logging would cost time and flood the output
    work = Path(args.work or tempfile.mkdtemp(prefix="gristmill-bench-"))
    demo = write_demo_corpus(work / "demo-corpus")
    corpus = work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    docs = make_corpus(demo, corpus, args.mb)
    chars = sum(map(len, docs))
    tokenizer = work / "tokenizer.json"
    texts = [
        t
        for f in sorted(demo.glob("*.parquet"))
        for t in pq.read_table(f, columns=["text"])["text"].to_pylist()
    ]
    train_bpe([t for t in texts if t], 8192, ["<|endoftext|>"]).save(str(tokenizer))
    batch_chars = DataConfig().shards.encode_batch_chars

    # Raw and build runs alternate so both see the same machine load; each keeps its best run.
    # Rates are given per wall-clock second and per CPU-second (user+sys of this process and its
    # children): on a shared machine the CPU figure is the steadier one.
    raw, bld, share = [], [], []
    for i in range(args.repeats):
        c0, w0 = cpu_seconds(), time.perf_counter()
        tokens = raw_encode(tokenizer, docs, batch_chars)
        raw.append((tokens / (time.perf_counter() - w0), tokens / (cpu_seconds() - c0)))
        c0, w0 = cpu_seconds(), time.perf_counter()
        info = run_build(work, corpus, tokenizer, i)
        wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
        # The build's count includes one separator per document; compare like with like.
        body_tokens = info["tokens"] - info["documents"]
        assert body_tokens == tokens, (body_tokens, tokens)
        bld.append((tokens / wall, tokens / cpu))
        # Same-run view, immune to load changing between runs: the share of the build's wall time
        # spent inside DocumentEncoder.encode_batch (datatrove's timer around that call).
        stats = json.loads((work / f"ds{i}" / "logs" / "stats.json").read_text())
        encode_s = next(st["time_stats"]["total"] for st in stats if "TOKENIZE" in st["name"])
        share.append(encode_s / wall)
        shutil.rmtree(work / f"ds{i}")
    rw, rc = max(r[0] for r in raw), max(r[1] for r in raw)
    bw, bc = max(b[0] for b in bld), max(b[1] for b in bld)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"corpus: {len(docs):,} documents, {chars / 1e6:.1f} MB of text, {tokens:,} tokens (8192-token BPE)"
    )
    print("                                  per wall second    per CPU second")
    print(f"raw encode_batch_fast, 1 thread : {rw / 1e6:8.3f} M tok/s   {rc / 1e6:8.3f} M tok/s")
    print(f"whole build, 1 worker, 1 thread : {bw / 1e6:8.3f} M tok/s   {bc / 1e6:8.3f} M tok/s")
    print(f"ratio build / raw (target ≥ 0.9): {bw / rw:8.3f}           {bc / rc:8.3f}")
    print(
        f"tokenizer's share of the build's wall time, same run (≈ the ratio, load-independent): "
        f"median {statistics.median(share):.3f}, runs {[round(x, 3) for x in share]}"
    )
    print(f"best of {args.repeats}; all runs (wall, cpu) raw {[(round(a), round(b)) for a, b in raw]}")
    print(f"                          build {[(round(a), round(b)) for a, b in bld]}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
