"""Loader throughput against raw memory copies of the same bytes, and a mixture against one source.

    python -m bench.loader_throughput [--dir /tmp/gristmill-loader-bench] [--tokens 200e6]
                                      [--mix-dir DIR] [--no-mixture] [--steps 60] [--repeats 2]

Generates a synthetic dataset (random ids, FineWeb-Edu-like lognormal document lengths, no
tokenizer; reused when present) and, for the mixture, three more of 60% / 25% / 15% of --tokens
(rounded up to batches of 20,000 documents; other seeds, same vocab) under --mix-dir/{a,b,c};
warms the page cache, then measures in one process:
  - memcpy:        copying every shard's bytes out of their memory maps (np.frombuffer → buffer)
  - memcpy+int64:  the same, widened into three int64 arrays (the least a loader must write per
                   token: input_ids, labels, position_ids)
  - loader:        TokenLoader, seq 2048, global batch 512, micro-batch 8, num_workers=0, with and
                   without the separator check
  - mixture:       TokenLoader over the three datasets' DocumentTables: one unbounded
                   phase (the same seq_len and global batch), weights 0.6 / 0.25 / 0.15, so each
                   step places the sources' windows at hashed slots; the same steps and settings
and prints tokens/s, the loader's ratio to each baseline and the mixture's ratio to the one-source
loader (goal ≥ 0.9×). Each loader figure is the best of --repeats runs, the one-source loader and
the mixture alternating, so both see the same load.

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
from training.data import order as epoch_order
from training.data import plan as data_plan
from training.data.loader import TokenLoader, dataset_loader
from training.data.reader import DocumentTable

MIXTURE = (("a", 0.6, 1), ("b", 0.25, 2), ("c", 0.15, 3))  # source: share of --tokens and weight, seed


def make_dataset(root: Path, tokens: int, vocab: int, seed: int = 0) -> dict:
    params = {"tokens": tokens, "vocab": vocab, "lengths": "lognormal(6.3, 1.0), min 2", "seed": seed}
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
        rng = np.random.default_rng(seed)
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
        f"generated {root}: {info['documents']:,} documents, {info['tokens']:,} tokens "
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


def loader_rate(open_loader, steps: int) -> tuple[float, float, float]:
    """(tokens/s, open seconds, first-step seconds) of the loader `open_loader()` over `steps` steps."""
    t0 = time.perf_counter()
    loader = open_loader()
    opened = time.perf_counter() - t0
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    phase = loader.plan.phases[0]  # the bench's loaders are one-phase plans
    return steps * phase.global_batch * phase.seq_len / (time.perf_counter() - t0), opened, first


def warm(root: Path) -> None:
    """Read every shard once: the page cache holds them all."""
    for path in shard_files(root):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def single_loader(root: Path, args, **kw) -> TokenLoader:
    return dataset_loader(
        root, seq_len=args.seq_len, global_batch=args.global_batch, micro_batch=8, seed=0, **kw
    )


def mixture_loader(roots: list[Path], args, **kw) -> TokenLoader:
    """The MIXTURE as a recipe with [[data.sources]] and one unbounded phase builds it."""
    tables = [DocumentTable(root) for root in roots]
    weights = data_plan.integer_weights([w for _, w, _ in MIXTURE])
    plan = data_plan.Plan(
        [data_plan.Source.of(t, name, max_epochs=None) for t, (name, _, _) in zip(tables, MIXTURE)],
        [data_plan.Phase("main", None, args.seq_len, args.global_batch, weights)],
        seed=0,
    )
    return TokenLoader(plan, tables, micro_batch=8, **kw)


def best_rates(opens: dict, steps: int, repeats: int) -> dict[str, tuple[float, float, float]]:
    """Best tokens/s (with that run's open and first-step seconds) of each loader over `repeats`
    rounds, the loaders taking turns within a round."""
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(repeats):
        for label, open_loader in opens.items():
            got = loader_rate(open_loader, steps)
            if label not in best or got[0] > best[label][0]:
                best[label] = got
    return best


def throughput(args) -> None:
    root = Path(args.dir)
    info = make_dataset(root, int(args.tokens), args.vocab)
    dtype = np.dtype(info["dtype"])
    itemsize = dtype.itemsize
    roots = [] if args.no_mixture else [Path(args.mix_dir) / name for name, _, _ in MIXTURE]
    for mix_root, (_, share, seed) in zip(roots, MIXTURE):
        make_dataset(mix_root, int(args.tokens * share), args.vocab, seed)
    for r in [root, *roots]:
        warm(r)
    copy, wide, total = memcpy_baselines(root, dtype)
    print(
        f"dataset {root}: {info['documents']:,} documents, {info['tokens']:,} tokens ({info['dtype']}), "
        f"{total / 2**20:.0f} MiB in {info['shards']} shards; page cache warm"
    )
    if roots:
        print(
            "mixture: "
            + ", ".join(
                f"{r} ({read_dataset_info(r)['tokens']:,} tokens, weight {w})"
                for r, (_, w, _) in zip(roots, MIXTURE)
            )
        )
    print(f"baseline memcpy        {copy / itemsize / 1e6:9.1f} M tokens/s  ({copy / 2**30:.2f} GiB/s)")
    print(f"baseline memcpy+int64  {wide / itemsize / 1e6:9.1f} M tokens/s")
    # The same steps for every loader: within one epoch of the one-source stream.
    steps = min(args.steps, epoch_order.epoch_steps(info["tokens"], args.seq_len, args.global_batch)[0] - 1)
    print(f"loaders: {steps} steps of {args.global_batch * args.seq_len:,} tokens, best of {args.repeats}")
    for suffix, kw in (("", {}), (" +sep check", {"check_separators": True})):
        opens = {"loader" + suffix: lambda kw=kw: single_loader(root, args, **kw)}
        if roots:
            opens["mixture" + suffix] = lambda kw=kw: mixture_loader(roots, args, **kw)
        rates = best_rates(opens, steps, args.repeats)
        one = rates["loader" + suffix][0]
        for label, (rate, opened, first) in rates.items():
            if label.startswith("loader"):
                vs = f"{rate / (copy / itemsize):.3f}× memcpy, {rate / (wide / itemsize):.2f}× memcpy+int64"
            else:
                met = "met" if rate >= 0.9 * one else "NOT met"
                vs = f"{rate / one:.3f}× the one-source loader (goal ≥ 0.9×: {met})"
            times = f"open {opened:.2f} s, first step {first:.2f} s"
            print(f"{label:<22} {rate / 1e6:9.1f} M tokens/s  = {vs} ({times})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gristmill-loader-bench")
    ap.add_argument("--tokens", type=float, default=200e6)
    ap.add_argument("--vocab", type=int, default=131072, help="131072: uint32 ids, the 1.24B preset's")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2, help="each loader's figure: the best of this many runs")
    ap.add_argument("--mix-dir", help="the mixture's datasets, {a,b,c} under it (default: --dir + '-mix')")
    ap.add_argument("--no-mixture", action="store_true", help="the one-source loader and baselines only")
    args = ap.parse_args()
    args.mix_dir = args.mix_dir or args.dir + "-mix"
    throughput(args)


if __name__ == "__main__":
    main()
