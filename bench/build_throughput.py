"""Build throughput vs raw tokenizer throughput, on one core, on the same generated corpus.

    .venv/bin/python -m bench.build_throughput [--mb 24] [--repeats 3]

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
5. Build with `[dedup] kind = "minhash"` (FineWeb's settings: 5-gram shingles, 14 buckets × 8
   hashes): the same build plus datatrove's MinHash stages (signatures, buckets, clusters) and the
   dedup filter, same task and worker; reported as docs/s and tokens/s relative to the plain build
   of the same round.
6. Build with `[decontaminate]` against a 5-task 13-gram index (`index = DIR`, built once before the
   rounds and not timed: the hub is out of reach here, so the tasks are 5 local lm-eval YAML tasks
   the size of hellaswag's validation split, 10,000 documents of a 40-word context and four 20-word
   endings, words drawn with the demo corpus's word frequencies); reported like the dedup row, with
   the decontaminate step's own share of the build's wall time.
Prints both rates and their ratio (target ≥ 0.9); best of --repeats runs each.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core for the encoder
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import json
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.build import build
from pipelines.config import DataConfig
from pipelines.demo_corpus import SCHEMA, write_demo_corpus
from tokenization.tokenizer_io import train_bpe
from training.contract.config_loader import load_config


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


def read_texts(corpus: Path) -> list[str]:
    return [
        t
        for f in sorted(corpus.glob("*.parquet"))
        for t in pq.read_table(f, columns=["text"])["text"].to_pylist()
    ]


def raw_encode(tokenizer_path: Path, docs: list[str], batch_chars: int) -> int:
    """Encode `docs` (fresh str objects, as the build gets them from parquet) in build-sized batches."""
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


def run_build(work: Path, corpus: Path, tokenizer: Path, i: int, extra: tuple[str, ...] = ()) -> dict:
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
            *extra,
        ],
    )
    return build(cfg, log=lambda *a: None).info


def measure(mode: str, work: Path, i: int) -> dict:
    """One measurement in this (fresh) process: {"tokens", "wall", "cpu"[, "encode_s"]}."""
    corpus, tokenizer = work / "corpus", work / "tokenizer.json"
    if mode == "raw":
        fresh = read_texts(corpus)  # untimed: the raw figure is the tokenizer alone
        c0, w0 = cpu_seconds(), time.perf_counter()
        tokens = raw_encode(tokenizer, fresh, DataConfig().shards.encode_batch_chars)
        return {"tokens": tokens, "wall": time.perf_counter() - w0, "cpu": cpu_seconds() - c0}
    c0, w0 = cpu_seconds(), time.perf_counter()
    info = run_build(work, corpus, tokenizer, i, overrides(mode, work))
    wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
    # datatrove's timer around DocumentEncoder.encode_batch: the tokenizer's share of this run.
    stats = json.loads((work / f"ds{i}" / "logs" / "stats.json").read_text())
    encode_s = next(st["time_stats"]["total"] for st in stats if "TOKENIZE" in st["name"])
    shutil.rmtree(work / f"ds{i}")
    # The build's count includes one separator per document; compare like with like.
    return {
        "tokens": info["tokens"] - info["documents"],
        "docs": info["documents_read"],
        "dropped": info["excluded_by_filter"].get("dedup", 0),
        "wall": wall,
        "cpu": cpu,
        "encode_s": encode_s,
        "decontaminated": info["excluded_by_filter"].get("decontaminate", 0),
        "decontam_s": sum(
            st["time_stats"]["total"] for st in stats if st["name"].endswith(": decontaminate")
        ),
    }


# Builds with a [dedup] kind, each measured like the plain build; mode -> the overrides it adds.
DEDUP = {"minhash": ("dedup.kind=minhash",)}


def per_round(plain: list[dict], runs: list[dict], key: str, per: str) -> str:
    """`key` (docs, tokens) per `per` (wall, cpu) second of `runs` relative to the plain build's,
    round by round, and their median."""
    rel = [(r[key] / r[per]) / (b[key] / b[per]) for b, r in zip(plain, runs)]
    return f"{[round(x, 3) for x in rel]} (median {statistics.median(rel):.3f})"


def print_dedup_row(mode: str, plain: list[dict], dedup: list[dict]) -> None:
    """docs/s and tokens/s of the `mode` builds, and per round relative to the plain build (per
    wall second, and per CPU second: steadier on a shared machine)."""
    best = max(dedup, key=lambda r: r["docs"] / r["wall"])
    print(
        f"build with dedup = {mode!r} (best): {best['docs'] / best['wall']:,.0f} docs/s, "
        f"{best['tokens'] / best['wall'] / 1e6:.3f} M tok/s (kept tokens; {best['dropped']} of "
        f"{best['docs']:,} documents dropped as duplicates)"
    )
    print(f"  relative to the plain build, per round: docs/s {per_round(plain, dedup, 'docs', 'wall')}")
    print(f"  {'':38}tok/s {per_round(plain, dedup, 'tokens', 'wall')}")
    print(f"  {'':32}docs per CPU-s {per_round(plain, dedup, 'docs', 'cpu')}")


# Decontamination: the build with [decontaminate] index = work/DECONTAM_INDEX (see 6. above).
DECONTAM = "decontam"
DECONTAM_INDEX = "decontam-index"


def overrides(mode: str, work: Path) -> tuple[str, ...]:
    """The recipe overrides of a measured build mode ("build": none)."""
    return (f"decontaminate.index={work / DECONTAM_INDEX}",) if mode == DECONTAM else DEDUP.get(mode, ())


def make_decontam_index(work: Path, texts: list[str], tasks: int = 5, docs: int = 10_000) -> str:
    """Write the 5 synthetic tasks and index them with `gristmill data decontam-index`; one line
    saying what the index holds and how long it took."""
    from collections import Counter

    from pipelines.cli import main as gristmill
    from pipelines.decontam.ngram import normalize_words, read_manifest

    counts = Counter(w for t in texts for w in normalize_words(t))
    words = list(counts)
    p = np.array([counts[w] for w in words], float)
    rng = np.random.default_rng(1)
    folder, names = work / "decontam-tasks", [f"bench_decontam_{k}" for k in range(tasks)]
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        drawn = rng.choice(len(words), size=(docs, 120), p=p / p.sum())
        lines = []
        for row in drawn:
            w = [words[k] for k in row]
            endings = [" ".join(w[40 + 20 * j : 60 + 20 * j]) for j in range(4)]
            lines.append(json.dumps({"ctx": " ".join(w[:40]), "endings": endings, "label": 0}) + "\n")
        (folder / f"{name}.jsonl").write_text("".join(lines))
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {folder / name}.jsonl\n"
            'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{ctx}}"\n'
            'doc_to_choice: "{{endings}}"\ndoc_to_target: "{{label}}"\nmetadata:\n  version: 1.0\n'
        )
    index = work / DECONTAM_INDEX
    shutil.rmtree(index, ignore_errors=True)
    argv = ["data", "decontam-index", "--tasks", ",".join(names), "--include-path", str(folder)]
    t0 = time.perf_counter()
    assert gristmill([*argv, "--out", str(index)]) == 0
    seconds = time.perf_counter() - t0
    m = read_manifest(index)
    size = sum((index / f).stat().st_size for f in ("ngrams.npy", "refs.npy")) / 1e6
    return (
        f"{tasks} tasks × {docs:,} documents, {m['ngrams']:,} distinct 13-grams ({size:.0f} MB), "
        f"indexed in {seconds:.0f} s"
    )


def print_decontam_row(index_line: str, plain: list[dict], runs: list[dict]) -> None:
    """docs/s and tokens/s of the decontaminating builds, per round relative to the plain build,
    and the decontaminate step's share of each build's own wall time (datatrove's timer)."""
    share = [r["decontam_s"] / r["wall"] for r in runs]
    best = max(runs, key=lambda r: r["tokens"] / r["wall"])
    print(f"decontamination index: {index_line}")
    print(
        f"build with [decontaminate] (best): {best['docs'] / best['wall']:,.0f} docs/s, "
        f"{best['tokens'] / best['wall'] / 1e6:.3f} M tok/s ({best['decontaminated']} of {best['docs']:,} "
        "documents dropped)"
    )
    print(f"  relative to the plain build, per round: docs/s {per_round(plain, runs, 'docs', 'wall')}")
    print(f"  {'':38}tok/s {per_round(plain, runs, 'tokens', 'wall')}")
    print(f"  {'':32}docs per CPU-s {per_round(plain, runs, 'docs', 'cpu')}")
    print(
        f"  the decontaminate step's share of each build's wall time: {[round(x, 3) for x in share]} "
        f"(median {statistics.median(share):.3f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=24.0, help="corpus size in MB of text (default 24)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    modes = ["raw", "build", *DEDUP, DECONTAM]
    ap.add_argument("--measure", choices=modes, help=argparse.SUPPRESS)  # internal
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    from loguru import logger

    logger.remove()  # datatrove's per-step logging would cost time and flood the output
    if args.measure:
        print(json.dumps(measure(args.measure, Path(args.work), args.index)))
        return

    work = Path(args.work or tempfile.mkdtemp(prefix="gristmill-bench-"))
    demo = write_demo_corpus(work / "demo-corpus")
    corpus = work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    docs = make_corpus(demo, corpus, args.mb)
    chars = sum(map(len, docs))
    texts = [
        t
        for f in sorted(demo.glob("*.parquet"))
        for t in pq.read_table(f, columns=["text"])["text"].to_pylist()
    ]
    train_bpe([t for t in texts if t], 8192, ["<|endoftext|>"]).save(str(work / "tokenizer.json"))
    index_line = make_decontam_index(work, texts)

    # Every measurement runs in a fresh interpreter (a long-lived process slows down run after
    # run), raw and build alternate and swap order each round so both see the same machine load.
    runs: dict[str, list[dict]] = {"raw": [], "build": [], **{m: [] for m in DEDUP}, DECONTAM: []}
    for i in range(args.repeats):
        for mode in list(runs) if i % 2 == 0 else list(runs)[::-1]:
            cmd = [sys.executable, __file__, "--measure", mode, "--work", str(work), "--index", str(i)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    tokens = runs["raw"][0]["tokens"]
    plain = ("raw", "build")  # dedup may drop documents: its tokens are checked against itself
    assert all(r["tokens"] == tokens for m in plain for r in runs[m]), "build and raw disagree on tokens"
    rate = {m: [(tokens / r["wall"], tokens / r["cpu"]) for r in runs[m]] for m in plain}
    share = [r["encode_s"] / r["wall"] for r in runs["build"]]
    pair = [b[0] / r[0] for r, b in zip(rate["raw"], rate["build"])]
    rw, rc = max(x[0] for x in rate["raw"]), max(x[1] for x in rate["raw"])
    bw, bc = max(x[0] for x in rate["build"]), max(x[1] for x in rate["build"])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"corpus: {len(docs):,} documents, {chars / 1e6:.1f} MB of text, {tokens:,} tokens (8192-token BPE)"
    )
    print(f"best of {args.repeats} runs each          per wall second    per CPU second")
    print(f"raw encode_batch_fast, 1 thread : {rw / 1e6:8.3f} M tok/s   {rc / 1e6:8.3f} M tok/s")
    print(f"whole build, 1 worker, 1 thread : {bw / 1e6:8.3f} M tok/s   {bc / 1e6:8.3f} M tok/s")
    print(f"ratio build / raw (target ≥ 0.9): {bw / rw:8.3f}           {bc / rc:8.3f}")
    print(
        f"ratio per round (wall)          : {[round(x, 3) for x in pair]}, "
        f"median {statistics.median(pair):.3f}"
    )
    print(
        f"tokenizer's share of each build's own wall time (load-independent): "
        f"{[round(x, 3) for x in share]}, "
        f"median {statistics.median(share):.3f}"
    )
    print(f"all runs (wall, cpu tok/s): raw {[(round(a), round(b)) for a, b in rate['raw']]}")
    print(f"                          build {[(round(a), round(b)) for a, b in rate['build']]}")
    for mode in DEDUP:
        print_dedup_row(mode, runs["build"], runs[mode])
    print_decontam_row(index_line, runs["build"], runs[DECONTAM])
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
