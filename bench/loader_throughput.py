"""Loader throughput against raw memory copies of the same bytes.

    python -m bench.loader_throughput [--dir /tmp/gristmill-loader-bench] [--tokens 200e6]

Part 1 (throughput): generates a synthetic dataset (random ids, FineWeb-Edu-like lognormal
document lengths, no tokenizer; reused when present), warms the page cache, then measures in one
process:
  - memcpy:        copying every shard's bytes out of their memory maps (np.frombuffer → buffer)
  - memcpy+int64:  the same, widened into three int64 arrays (the least a loader must write per
                   token: input_ids, labels, position_ids)
  - loader:        TokenLoader, seq 2048, global batch 512, num_workers=0, with and without the
                   separator check
and prints tokens/s and the loader's ratio to each baseline.

Planning at FineWeb-Edu scale (1.5B documents, 8 ranks at once) is bench/loader_scale.py.
"""

from __future__ import annotations

import argparse
import mmap
import shutil
import time
from pathlib import Path

import numpy as np

from pipelines.synthetic_dataset import write_synthetic_dataset
from training.contract.dataset_format import read_dataset_info, shard_files
from training.loader import TokenLoader


def make_dataset(root: Path, tokens: int, vocab: int) -> dict:
    params = {"tokens": tokens, "vocab": vocab, "lengths": "lognormal(6.3, 1.0), min 2", "seed": 0}
    try:
        info = read_dataset_info(root)
        if info.get("bench") == params and "index" in info:  # (built before the loader index: redo)
            return info
    except Exception:
        pass
    if root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()

    def documents():
        rng = np.random.default_rng(0)
        written = 0
        while written < tokens:
            lengths = np.maximum(rng.lognormal(6.3, 1.0, 20_000).astype(np.int64), 2)
            ids = rng.integers(1, vocab, int(lengths.sum()), dtype=np.uint32)
            ends = np.cumsum(lengths)
            ids[ends - 1] = 0  # the separator, "after" each document
            for start, end in zip((ends - lengths).tolist(), ends.tolist()):
                yield ids[start:end]
            written += int(lengths.sum())

    info = write_synthetic_dataset(
        root, documents(), vocab_size=vocab, target_bytes=256 << 20, config_sha256="bench",
        extra={"bench": params},
    )  # fmt: skip
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gristmill-loader-bench")
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--vocab", type=int, default=131072, help="131072: uint32 ids, the 1.24B preset's")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    throughput(args)


if __name__ == "__main__":
    main()
