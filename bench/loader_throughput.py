"""Loader throughput against raw memory copies of the same bytes, and planning at FineWeb-Edu scale.

    python bench/loader_throughput.py [--dir /tmp/gristmill-loader-bench] [--tokens 200e6]

Part 1 (throughput): generates a synthetic dataset (random ids, FineWeb-Edu-like lognormal
document lengths, no tokenizer; reused when present), warms the page cache, then measures in one
process:
  - memcpy:        copying every shard's bytes out of their memory maps (np.frombuffer → buffer)
  - memcpy+int64:  the same, widened into three int64 arrays (the least a loader must write per
                   token: input_ids, labels, position_ids)
  - loader:        TokenLoader, seq 2048, global batch 512, num_workers=0, with and without the
                   separator check
and prints tokens/s and the loader's ratio to each baseline.

Part 2 (plan, in a fresh subprocess so its peak RSS is its own): a lengths-only manifest of
--plan-docs documents (default 1.5B, ~1.3T tokens: uniform 1..1734 tokens, mean 867) planned with
training.loader_plan.EpochPlan; prints plan time, the first lookup of a global batch, and peak
RSS next to the size of the lengths array itself.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.dataset_format import read_dataset_info, shard_files  # noqa: E402
from training.loader import TokenLoader  # noqa: E402
from training.loader_plan import EpochPlan  # noqa: E402


def rss_kib() -> tuple[int, int]:
    """(current, peak) resident set size in KiB, from /proc/self/status."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def make_dataset(root: Path, tokens: int, vocab: int) -> dict:
    from pipelines.shard_writer import ShardWriter, finalize_dataset

    params = {"tokens": tokens, "vocab": vocab, "lengths": "lognormal(6.3, 1.0), min 2", "seed": 0}
    try:
        info = read_dataset_info(root)
        if info.get("bench") == params:
            return info
    except Exception:
        pass
    if root.exists():
        import shutil

        shutil.rmtree(root)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    writer = ShardWriter(root, 0, vocab_size=vocab, target_bytes=256 << 20)
    written = doc = 0
    while written < tokens:
        lengths = np.maximum(rng.lognormal(6.3, 1.0, 20_000).astype(np.int64), 2)
        ids = rng.integers(1, vocab, int(lengths.sum()), dtype=np.uint32)
        ends = np.cumsum(lengths)
        ids[ends - 1] = 0  # the separator, "after" each document
        for start, end in zip((ends - lengths).tolist(), ends.tolist()):
            writer.add(f"t00000d{doc:09d}", ids[start:end], {"id": str(doc)})
            doc += 1
        written += int(lengths.sum())
    writer.close()
    info = finalize_dataset(
        root,
        vocab_size=vocab,
        separator={"token": "<|endoftext|>", "id": 0, "position": "after"},
        config_sha256="bench",
        extra={"bench": params},
    )
    print(
        f"generated {info['documents']:,} documents, {info['tokens']:,} tokens "
        f"in {time.perf_counter() - t0:.0f} s"
    )
    return info


def memcpy_baselines(root: Path, dtype: np.dtype, repeats: int = 3) -> tuple[float, float, int]:
    """Best-of-`repeats` bytes/s of (plain copy, copy widened to 3 × int64) over all shards."""
    maps = []
    for path in shard_files(root):
        with open(path, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    total = sum(len(m) for m in maps)
    buf = np.empty(max(len(m) for m in maps), np.uint8)
    best_copy = best_wide = 0.0
    chunk = 512 * 2049  # one global batch of tokens at a time for the widened copy
    wide = np.empty((3, chunk), np.int64)
    for _ in range(repeats):
        t0 = time.perf_counter()
        for m in maps:
            buf[: len(m)] = np.frombuffer(m, np.uint8)
        best_copy = max(best_copy, total / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for m in maps:
            src = np.frombuffer(m, dtype, len(m) // dtype.itemsize)
            for i in range(0, len(src), chunk):
                part = src[i : i + chunk]
                for k in range(3):
                    wide[k, : len(part)] = part
        best_wide = max(best_wide, total / (time.perf_counter() - t0))
    return best_copy, best_wide, total


def loader_rate(root: Path, args, **kw) -> tuple[float, float, float]:
    """(tokens/s, open seconds, first-step seconds) of TokenLoader over --steps steps."""
    t0 = time.perf_counter()
    loader = TokenLoader(
        root, seq_len=args.seq_len, global_batch=args.global_batch, micro_batch=8, seed=0, **kw
    )
    opened = time.perf_counter() - t0
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    steps = min(args.steps, loader.steps_per_epoch - 1)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * loader.tokens_per_step / (time.perf_counter() - t0), opened, first


def throughput(args) -> None:
    root = Path(args.dir)
    info = make_dataset(root, int(args.tokens), args.vocab)
    dtype = np.dtype(info["dtype"])
    itemsize = dtype.itemsize
    for path in shard_files(root):  # warm the page cache
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    copy, wide, total = memcpy_baselines(root, dtype)
    print(
        f"dataset {root}: {info['documents']:,} documents, {info['tokens']:,} tokens ({info['dtype']}), "
        f"{total / 2**20:.0f} MiB in {info['shards']} shards; page cache warm"
    )
    print(f"baseline memcpy        {copy / itemsize / 1e6:9.1f} M tokens/s  ({copy / 2**30:.2f} GiB/s)")
    print(f"baseline memcpy+int64  {wide / itemsize / 1e6:9.1f} M tokens/s")
    for label, kw in (("loader", {}), ("loader +sep check", {"check_separators": True})):
        rate, opened, first = loader_rate(root, args, **kw)
        print(
            f"{label:<22} {rate / 1e6:9.1f} M tokens/s  = {rate / (copy / itemsize):.3f}× memcpy, "
            f"{rate / (wide / itemsize):.2f}× memcpy+int64 (open {opened:.2f} s, first step {first:.2f} s)"
        )


def plan(args) -> None:
    n = int(args.plan_docs)
    t0 = time.perf_counter()
    lengths = np.empty(n, np.uint32)
    rng = np.random.default_rng(0)
    for i in range(0, n, 50_000_000):
        m = min(50_000_000, n - i)
        lengths[i : i + m] = rng.integers(1, 1735, m, dtype=np.uint32)
    gen = time.perf_counter() - t0
    before, _ = rss_kib()
    t0 = time.perf_counter()
    p = EpochPlan(lengths, seed=0, epoch=0)
    planned = time.perf_counter() - t0
    window = args.seq_len + 1
    step = (p.tokens // window // args.global_batch) // 2  # a batch in the middle of the epoch
    t0 = time.perf_counter()
    docs, _, _ = p.segments(step * args.global_batch * window, (step + 1) * args.global_batch * window)
    lookup = time.perf_counter() - t0
    now, peak = rss_kib()
    print(
        json.dumps(
            {
                "documents": n,
                "tokens": p.tokens,
                "generate_s": round(gen, 1),
                "plan_s": round(planned, 2),
                "first_lookup_s": round(lookup, 3),
                "docs_in_batch": len(docs),
                "lengths_gib": round(lengths.nbytes / 2**30, 2),
                "rss_before_plan_gib": round(before / 2**20, 2),
                "rss_after_gib": round(now / 2**20, 2),
                "peak_rss_gib": round(peak / 2**20, 2),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gristmill-loader-bench")
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--vocab", type=int, default=131072, help="131072: uint32 ids, the 1.24B preset's")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--plan-docs", type=float, default=1.5e9)
    ap.add_argument("--part", choices=["all", "throughput", "plan"], default="all")
    args = ap.parse_args()
    if args.part in ("all", "throughput"):
        throughput(args)
    if args.part == "plan":
        plan(args)
    elif args.part == "all":
        argv = [
            sys.executable,
            __file__,
            "--part",
            "plan",
            "--plan-docs",
            str(args.plan_docs),
            "--seq-len",
            str(args.seq_len),
            "--global-batch",
            str(args.global_batch),
        ]
        out = subprocess.run(argv, check=True, capture_output=True, text=True, env=os.environ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"plan {r['documents']:,} documents / {r['tokens']:,} tokens: {r['plan_s']} s, "
            "first batch lookup "
            f"{r['first_lookup_s']} s; peak RSS {r['peak_rss_gib']} GiB, of which the lengths array "
            f"{r['lengths_gib']} GiB (RSS before planning {r['rss_before_plan_gib']} GiB)"
        )


if __name__ == "__main__":
    main()
