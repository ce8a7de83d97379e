"""Datasets in a bucket: requests to open, bytes fetched per byte trained, warm loader speed.

    python -m bench.object_store [--dir /tmp/gristmill-s3-bench] [--shards 1000] [--shard-kb 128]
                                 [--seq-len 2048] [--global-batch 32] [--warm-steps 200] [--repeats 3]
                                 [--half-steps 150]

Against moto's S3 server on loopback (pipelines/local_s3.py), reached through the tests' seeded
fault-injecting proxy (tests/helpers/s3_server.py), which also counts the requests. Writes a
synthetic dataset of --shards shards (FineWeb-Edu-like lognormal document lengths, a small `.json`
member per document as the build writes; reused when present), uploads it with `gristmill data
upload`'s code, then measures, without and with the fault mix (10% 503 SlowDown, 2% truncated
bodies, 1% connection resets):

  - requests to open: `DocumentTable` of the URL with an empty cache (goal ≤ 3, shards fetched
    later), and again with the index cached;
  - bytes fetched ÷ bytes trained over one epoch with a cache that holds the dataset (goal ≤ 1.05);
    "trained" is the token bytes of the epoch's windows (steps × G × (seq_len + 1) × 2), and the
    fetched bytes are also given per shard byte, which separates what the cache fetches again from
    what the tar format carries besides token ids; then, without faults, the first --half-steps steps
    through a fresh cache that holds the dataset and one that holds half of it (a whole epoch through
    the half-size one refetches tens of thousands of shards: too long for moto on loopback);
  - warm tokens/s: the loader from the bucket, every shard in the cache, ÷ the loader of the local
    copy over the same steps in the same process, best of --repeats alternating runs (goal ≥ 0.9).

Benches are not tests: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

from pipelines.local_s3 import LocalS3
from pipelines.synthetic_dataset import write_synthetic_dataset
from pipelines.upload import upload_dataset
from tests.helpers.s3_server import FaultMix, FaultProxy
from training.contract.dataset_format import read_dataset_info
from training.contract.object_store import COUNTS
from training.data.loader import dataset_loader
from training.data.reader import DocumentTable
from training.data.remote import CacheSettings

BUCKET = "bench"
SEED = 3


def make_dataset(root: Path, shards: int, shard_kb: int) -> dict:
    params = {"shards": shards, "shard_kb": shard_kb, "lengths": "lognormal(6.3, 1.0), min 2"}
    try:
        info = read_dataset_info(root)
        if info.get("bench") == params:
            return info
    except Exception:
        pass
    shutil.rmtree(root, ignore_errors=True)
    target = shard_kb << 10

    def documents():
        rng = np.random.default_rng(0)
        written = 0
        while written < shards * target * 0.98:
            n = max(2, int(rng.lognormal(6.3, 1.0)))
            ids = rng.integers(1, 32768, n + 1).astype(np.int64)
            ids[-1] = 0
            written += 2 * (n + 1) + 1536  # ids, two tar headers, the .json member
            yield ids

    return write_synthetic_dataset(
        root, documents(), vocab_size=32768, target_bytes=target, extra={"bench": params}
    )


def loader(location, args, cache: CacheSettings | None = None):
    return dataset_loader(
        location, seq_len=args.seq_len, global_batch=args.global_batch, micro_batch=args.global_batch,
        seed=SEED, cache=cache,
    )  # fmt: skip


def epoch(location, args, cache: CacheSettings | None, steps: int) -> float:
    t0 = time.perf_counter()
    for _, _ in zip(range(steps), loader(location, args, cache)):
        pass
    return time.perf_counter() - t0


def fetched_per_trained(url: str, args, cache: CacheSettings, steps: int, shard_bytes: int) -> dict:
    before = COUNTS.snapshot()
    seconds = epoch(url, args, cache, steps)
    got = {k: v - before[k] for k, v in COUNTS.snapshot().items()}
    trained = steps * args.global_batch * (args.seq_len + 1) * 2
    return {
        "fetched_bytes": got["bytes"],
        "per_trained": got["bytes"] / trained,
        "per_shard_byte": got["bytes"] / shard_bytes,
        "requests": got["requests"],
        "retries": got["retries"],
        "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/gristmill-s3-bench"))
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--shard-kb", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--warm-steps", type=int, default=200)
    p.add_argument("--half-steps", type=int, default=150, help="steps read through the half-size cache")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    local = args.dir / "dataset"
    info = make_dataset(local, args.shards, args.shard_kb)
    shard_bytes = sum(f["bytes"] for f in info["shard_files"].values())
    print(
        f"dataset: {info['shards']} shards, {shard_bytes / 1e6:.1f} MB, {info['documents']:,} documents, "
        f"{info['tokens']:,} tokens ({2 * info['tokens'] / shard_bytes:.2f} of the shard bytes are token ids)"
    )
    s3 = LocalS3(BUCKET)
    proxy = FaultProxy(s3.url)
    os.environ.update(s3.env(), AWS_ENDPOINT_URL=proxy.url)
    url = f"s3://{BUCKET}/dataset"
    try:
        t0 = time.perf_counter()
        upload_dataset(local, url, log=lambda *a: None)
        print(f"upload: {time.perf_counter() - t0:.1f} s, {proxy.counts.total()} requests")
        steps = loader(local, args).steps_per_epoch
        print(f"one epoch: {steps} steps of {args.global_batch} × {args.seq_len} tokens\n")

        for faults in (None, FaultMix()):
            what = "with faults (10% 503, 2% truncated, 1% reset)" if faults else "no faults"
            proxy.set_faults(faults)
            caches = args.dir / ("cache-faults" if faults else "cache")
            shutil.rmtree(caches, ignore_errors=True)
            whole = CacheSettings(caches / "whole", 2 * shard_bytes)
            proxy.reset_counts()
            DocumentTable(url, cache=whole)
            cold = proxy.counts.total()
            proxy.reset_counts()
            DocumentTable(url, cache=whole)
            warm = proxy.counts.total()
            print(
                f"[{what}] requests to open a {info['shards']}-shard dataset: {cold} cold, {warm} with the "
                "index cached"
            )
            r = fetched_per_trained(url, args, whole, steps, shard_bytes)
            print(
                f"[{what}] one epoch, a cache that holds the dataset: fetched "
                f"{r['fetched_bytes'] / 1e6:.1f} MB = "
                f"{r['per_trained']:.3f} × the token bytes trained, {r['per_shard_byte']:.3f} × the shard "
                f"bytes; {r['requests']} requests, {r['retries']} retried; {r['seconds']:.1f} s"
            )
            if faults is None:  # what a cache smaller than the dataset costs, over the first steps
                for name, size in (
                    ("holds the dataset", 2 * shard_bytes),
                    ("holds half of it", shard_bytes // 2),
                ):
                    cache = CacheSettings(caches / f"first-{size}", size)
                    r = fetched_per_trained(url, args, cache, args.half_steps, shard_bytes)
                    trained = args.half_steps * args.global_batch * (args.seq_len + 1) * 2
                    print(
                        f"[{what}] the first {args.half_steps} steps, a fresh cache that {name}: fetched "
                        f"{r['fetched_bytes'] / 1e6:.1f} MB = {r['per_trained']:.3f} × the "
                        f"{trained / 1e6:.1f} MB of token bytes trained; {r['seconds']:.1f} s"
                    )
            proxy.set_faults(None)
            n = min(args.warm_steps, steps)
            runs = {"bucket": [], "local": []}
            for _ in range(args.repeats):
                runs["bucket"].append(epoch(url, args, whole, n))
                runs["local"].append(epoch(local, args, None, n))
            tokens = n * args.global_batch * args.seq_len
            rate = {k: tokens / min(v) for k, v in runs.items()}
            print(
                f"[{what}] warm loader, {n} steps: bucket {rate['bucket'] / 1e6:.1f}M tokens/s, local "
                f"{rate['local'] / 1e6:.1f}M tokens/s: ratio {rate['bucket'] / rate['local']:.3f}\n"
            )
    finally:
        proxy.stop()
        s3.stop()


if __name__ == "__main__":
    main()
