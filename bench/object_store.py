"""Datasets in a bucket: bytes fetched per token trained, requests, cold start against dataset size,
warm loader speed, and the local loader of the new layout against the old one.

    python -m bench.object_store [--dir /tmp/gristmill-s3-bench] [--shards 1000] [--shard-kb 128]
                                 [--seq-len 2048] [--global-batch 32] [--group-blocks 16]
                                 [--val-fraction 0.001] [--cold-shards 40] [--warm-steps 200]
                                 [--repeats 3] [--warm-workers 0,2] [--warm-world 2,8]
                                 [--train-tokens-per-s 81517]

Against moto's S3 server on loopback (pipelines/local_s3.py), reached through the tests' seeded
fault-injecting proxy (tests/helpers/s3_server.py), which also counts the requests and the body bytes
it sends (our own count of egress, beside the client's). Writes a synthetic gristmill-shards/3
dataset of --shards shards (FineWeb-Edu-like lognormal document lengths; reused when present),
uploads it with `gristmill data upload`'s code, then measures, without and with the fault mix (10%
503 SlowDown, 2% truncated bodies, 1% connection resets):

  - requests to open the dataset from an empty cache (dataset.json, the sample totals and digests,
    the held-out file's hashes and prefix; the shard table is derived; no per-document file, no
    shard) and with that cached;
  - one epoch through a cache of exactly the loader's working set (TokenLoader.cache_need: epoch
    groups of --group-blocks samples; 4,096 in real runs, fewer here so that this dataset holds many
    groups and the cache a fraction of it), --val-fraction held out as the real recipes do: bytes
    fetched ÷ token bytes trained (goal ≤ 1.05), requests per 1B tokens (aim ≤ 20k);
  - the cold start: bytes and seconds from an empty cache to the first step's batch, for datasets of
    1×, 10× and 100× --cold-shards shards in epoch groups of --cold-group-blocks samples (4,096, as
    real runs: below one group a dataset was fetched whole before its first step), the prefetcher's
    walk ahead counted as far as it got; and the step's own fetch (its plan and read alone); goal: flat;
  - warm tokens/s: the loader from the bucket, its working set cached, ÷ the loader of the local copy
    over the same steps (goal ≥ 0.95), best of --repeats alternating runs, in the loop's process and
    with DataLoader workers (--warm-workers: 0 and 2, as the FineWeb-Edu recipes read), whole and
    after the first batch (the steps alone: the open's requests are once a run); then with one group
    of every sample (FineWeb-Edu's groups of 4,096 samples are far more than these); and the floor:
    one open + read + xxh3 of a cached sample beside the local loader's time per sample, the most a
    reader that checks each sample it uses can reach; then rank 0 of --warm-world ranks (its 1/N of
    each step, in the loop's process): a rank's reader reads and checks every sample of its group
    whole, as one rank alone does, while the local loader reads only the rank's documents;
  - the loader's share of a training step: each warm loader's seconds per second of a training that
    consumes --train-tokens-per-s tokens a rank (the fastest measured, on an H200), local and from the
    bucket, and the training tokens/s that follow where the loader runs in the step's process;
  - local: the loader of the dataset in place, gristmill-shards/3 ÷ the same documents in the layout
    /2 (goal ≥ 0.95: the new layout costs local datasets nothing);
  - on paper: FineWeb-Edu on 64 nodes (cache per node, bytes, requests and dollars per epoch at S3
    list prices, bytes before the first step), from the formulas the measurements check.

Benches are not tests: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from pipelines.local_s3 import LocalS3
from pipelines.synthetic_dataset import write_synthetic_dataset
from pipelines.upload import upload_dataset
from tests.helpers.legacy_dataset import write_v2_dataset
from tests.helpers.s3_server import FaultMix, FaultProxy
from training.contract.dataset_format import read_dataset_info
from training.contract.object_store import COUNTS
from training.data import order as epoch_order
from training.data.loader import dataset_loader
from training.data.reader import DocumentTable
from training.data.remote import CacheSettings

BUCKET = "bench"
SEED = 3


def make_dataset(root: Path, shards: int, shard_kb: int, v2: bool = False) -> dict:
    params = {
        "shards": shards,
        "shard_kb": shard_kb,
        "lengths": "lognormal(6.3, 1.0), min 2",
        "v2": v2,
    }
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
            written += 2 * (n + 1)
            yield ids

    if v2:
        info = write_v2_dataset(root, documents(), vocab_size=32768, target_bytes=target)
        info["bench"] = params
        (root / "dataset.json").write_text(
            json.dumps(info, indent=2, sort_keys=True) + "\n"
        )  # not fingerprinted
        return info
    return write_synthetic_dataset(
        root, documents(), vocab_size=32768, target_bytes=target, extra={"bench": params}
    )


def loader(location, args, cache: CacheSettings | None = None, global_batch: int | None = None, **kw):
    g = global_batch or args.global_batch
    return dataset_loader(
        location, seq_len=args.seq_len, global_batch=g, seed=SEED, cache=cache, **{"micro_batch": g, **kw}
    )


def warm_pair(url, local, working, args, n: int, **kw) -> tuple[dict[str, float], ...]:
    """The bucket's loader (through cache `working`) and the local one, `n` warm steps each, alternating,
    --repeats times: per loader the best run's seconds, the best after its first batch, and the best
    to its first batch."""
    runs: dict[str, list[float]] = {"bucket": [], "local": []}
    firsts: dict[str, list[float]] = {"bucket": [], "local": []}
    for _ in range(args.repeats):
        for k, where, c in (("bucket", url, working), ("local", local, None)):
            runs[k].append(run_steps(where, args, c, n, firsts[k], **kw))
    after = {k: min(t - f for t, f in zip(runs[k], firsts[k])) for k in runs}
    return {k: min(v) for k, v in runs.items()}, after, {k: min(v) for k, v in firsts.items()}


def run_steps(
    location, args, cache: CacheSettings | None, steps: int, first: list | None = None, **kw
) -> float:
    """Seconds to open a loader and read `steps` steps; `first` gets the seconds to the first batch
    (the open: dataset.json, the index, the first group's plan), once a run, not a step's cost."""
    gc.collect()  # the loaders of earlier runs gone, with their maps: a run keeps only its own
    t0 = time.perf_counter()
    for step, _ in zip(range(steps), loader(location, args, cache, **kw)):
        if step == 0 and first is not None:
            first.append(time.perf_counter() - t0)
    return time.perf_counter() - t0


def checked_read_seconds(files: list[Path], repeats: int) -> float:
    """Seconds to open, read and xxh3 one cached sample, best of `repeats` passes over `files`."""
    import xxhash

    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                xxhash.xxh3_64_intdigest(fh.read())
        best = min(best, (time.perf_counter() - t0) / len(files))
    return best


def cold_start(s3: LocalS3, proxy: FaultProxy, args, cache_dir: Path) -> list[dict]:
    """Bytes and seconds from an empty cache to the first step's batch, at 1×, 10×, 100× the shards, in
    epoch groups of --cold-group-blocks samples (a real run's 4,096: below one group, a dataset was
    fetched whole before its first step). Through the loader, the prefetcher walks ahead meanwhile
    (its fetches counted too, as far as they got); then the step's own fetch, from another empty cache:
    its plan and read alone (BatchBuilder.read), no prefetcher."""
    groups, epoch_order.GROUP_BLOCKS = epoch_order.GROUP_BLOCKS, args.cold_group_blocks
    out = []
    try:
        for scale in (1, 10, 100):
            root = args.dir / f"cold-{scale}x"
            info = make_dataset(root, args.cold_shards * scale, args.shard_kb)
            url = f"s3://{BUCKET}/cold-{scale}x"
            upload_dataset(root, url, log=lambda *a: None)
            shutil.rmtree(cache_dir, ignore_errors=True)
            proxy.reset_counts()
            t0 = time.perf_counter()
            first = loader(url, args, CacheSettings(cache_dir, int(100e9)), global_batch=args.cold_batch)
            lengths = proxy.counts.body_bytes
            steps = iter(first)
            next(steps)
            seconds = time.perf_counter() - t0
            row = {
                "scale": scale,
                "shards": info["shards"],
                "documents": info["documents"],
                "samples": first.builder.tables[0].cache.nunits,
                "bytes": proxy.counts.body_bytes,
                "open_bytes": lengths,
                "requests": proxy.counts.total(),
                "seconds": seconds,
            }
            steps.close()
            del steps, first
            shutil.rmtree(cache_dir, ignore_errors=True)
            own = loader(url, args, CacheSettings(cache_dir, int(100e9)), global_batch=args.cold_batch)
            proxy.reset_counts()
            t0 = time.perf_counter()
            own.builder.read(0)
            row.update(step_bytes=proxy.counts.body_bytes, step_seconds=time.perf_counter() - t0)
            out.append(row)
    finally:
        epoch_order.GROUP_BLOCKS = groups
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/gristmill-s3-bench"))
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--shard-kb", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--group-blocks", type=int, default=16, help="samples per epoch group (real runs: 4096)")
    p.add_argument("--val-fraction", type=float, default=0.001)
    p.add_argument("--cold-shards", type=int, default=40, help="the cold start's 1× dataset")
    p.add_argument("--cold-batch", type=int, default=8, help="the cold start's global batch")
    p.add_argument(
        "--cold-group-blocks", type=int, default=4096, help="samples per epoch group in the cold start"
    )
    p.add_argument("--warm-steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--warm-workers",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[0, 2],
        help="data.num_workers of the warm runs, comma-separated (the FineWeb-Edu recipes read with 2)",
    )
    p.add_argument(
        "--warm-world",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[2, 8],
        help="world sizes of the per-rank warm runs (rank 0's loader), comma-separated",
    )
    p.add_argument(
        "--train-tokens-per-s",
        type=float,
        default=81_517.0,
        help="a rank's training tokens/s for the loader's share of a step (default: the fastest measured, "
        "the 1.24B recipe with model.float8 on one H200, bench/RESULTS.md)",
    )
    args = p.parse_args()
    epoch_order.GROUP_BLOCKS = args.group_blocks  # before any loader is built: many groups at bench scale

    local = args.dir / "dataset"
    info = make_dataset(local, args.shards, args.shard_kb)
    shard_bytes = sum(f["bytes"] for f in info["shard_files"].values())
    print(
        f"dataset: {info['shards']} shards, {shard_bytes / 1e6:.1f} MB, {info['documents']:,} documents, "
        f"{info['tokens']:,} tokens ({2 * info['tokens'] / shard_bytes:.3f} of the shard bytes are token ids)"
    )
    s3 = LocalS3(BUCKET)
    proxy = FaultProxy(s3.url)
    os.environ.update(s3.env(), AWS_ENDPOINT_URL=proxy.url)
    url = f"s3://{BUCKET}/dataset"
    vf = {"val_fraction": args.val_fraction}
    try:
        t0 = time.perf_counter()
        upload_dataset(local, url, log=lambda *a: None)
        print(f"upload: {time.perf_counter() - t0:.1f} s, {proxy.counts.total()} requests")
        probe = loader(url, args, CacheSettings(args.dir / "probe", int(100e9)), **vf)
        steps = probe.steps_per_epoch
        need = sum(n for _, n in probe.cache_need())
        print(
            f"one epoch: {steps} steps of {args.global_batch} × {args.seq_len} tokens; "
            f"{args.val_fraction:g} held out; working set {need / 1e6:.1f} MB = "
            f"{need / shard_bytes:.3f} of the dataset "
            f"(groups of {args.group_blocks} blocks)\n"
        )
        for faults in (None, FaultMix()):
            what = "with faults (10% 503, 2% truncated, 1% reset)" if faults else "no faults"
            proxy.set_faults(faults)
            cache_dir = args.dir / ("cache-faults" if faults else "cache")
            shutil.rmtree(cache_dir, ignore_errors=True)
            working = CacheSettings(cache_dir, need)
            proxy.reset_counts()
            DocumentTable(url, cache=working)
            cold = proxy.counts.total()
            proxy.reset_counts()
            DocumentTable(url, cache=working)
            warm = proxy.counts.total()
            print(f"[{what}] requests to open: {cold} cold, {warm} with the index cached")
            proxy.reset_counts()
            before = COUNTS.snapshot()
            seconds = run_steps(url, args, working, steps, last_step=steps, **vf)  # no lookahead past it
            got = {k: v - before[k] for k, v in COUNTS.snapshot().items()}
            trained_tokens = steps * args.global_batch * (args.seq_len + 1)
            trained = trained_tokens * 2
            egress = proxy.counts.body_bytes
            print(
                f"[{what}] one epoch through a cache of its working set: the store sent "
                f"{egress / 1e6:.1f} MB = {egress / trained:.4f} × the {trained / 1e6:.1f} MB of token "
                f"bytes trained (client count: {got['bytes'] / trained:.4f}); "
                f"{got['requests']:,} requests ({got['retries']} retried) = "
                f"{got['requests'] / trained_tokens * 1e9:,.0f} per 1B tokens; {seconds:.1f} s"
            )
            proxy.set_faults(None)
        cold = cold_start(s3, proxy, args, args.dir / "cache-cold")
        for r in cold:
            print(
                f"cold start, {r['scale']:>3}× ({r['shards']:,} shards, {r['samples']:,} samples, "
                f"{r['documents']:,} documents; groups of {args.cold_group_blocks:,}): "
                f"{r['bytes'] / 1e6:.2f} MB ({r['open_bytes'] / 1e6:.3f} MB of it the open: dataset.json, "
                f"sample totals and digests, held-out prefix), {r['requests']} requests, "
                f"{r['seconds']:.2f} s to the first step's batch, the prefetcher walking ahead; "
                f"the step's own fetch {r['step_bytes'] / 1e6:.2f} MB in {r['step_seconds']:.2f} s"
            )
        working = CacheSettings(args.dir / "cache", int(100e9))
        n = min(args.warm_steps, steps)
        run_steps(url, args, working, n, **vf)  # every block of those steps in the cache
        tokens = n * args.global_batch * args.seq_len
        per_rank: dict[str, dict[str, float]] = {}  # a rank's loader, tokens/s: its share of a step below
        for workers in args.warm_workers:
            # After the first batch: the steps alone (the open asks the bucket for dataset.json and
            # the held-out prefix, once a run; the workers start).
            whole, after, _ = warm_pair(url, local, working, args, n, num_workers=workers, **vf)
            rate = {k: tokens / v for k, v in whole.items()}
            per_rank[f"one rank, data.num_workers = {workers}"] = rate
            print(
                f"warm loader, {n} steps, data.num_workers = {workers}: bucket "
                f"{rate['bucket'] / 1e6:.2f}M tokens/s, local {rate['local'] / 1e6:.2f}M tokens/s: "
                f"ratio {rate['bucket'] / rate['local']:.3f}; after the first batch "
                f"{after['local'] / after['bucket']:.3f}"
            )
        # The floor: a reader that checks each cached sample when it uses it reads it once at least
        # (open, read, xxh3 of its ids); beside the local loader's time per sample, what is left.
        local_s = min(run_steps(local, args, None, n, **vf) for _ in range(args.repeats))
        cached = DocumentTable(url, cache=working, **vf).cache
        read_s = checked_read_seconds([cached.path(u) for u in range(cached.nunits)], args.repeats)
        read = tokens / float(np.mean(cached.totals))  # samples the steps read
        print(
            f"floor: one open + read + xxh3 of a cached sample {read_s * 1e6:.1f} µs; the local loader "
            f"{local_s / read * 1e6:.0f} µs a sample: a reader checking each sample it uses reaches at "
            f"most {local_s / (local_s + read * read_s):.3f}"
        )
        # FineWeb-Edu's groups are 4,096 samples, far more than the groups above: here one group of
        # every sample, each read from disk once (a reader keeps its group's checked copies).
        epoch_order.GROUP_BLOCKS = 1 << 30
        samples = DocumentTable(url, cache=working, **vf).cache.nunits
        run_steps(url, args, working, n, **vf)
        # After the first batch: the steps alone, the next group's plan among them (an epoch here).
        whole, after, first = warm_pair(url, local, working, args, n, **vf)
        print(
            f"warm loader, {n} steps, one group of all {samples} samples: bucket "
            f"{tokens / whole['bucket'] / 1e6:.2f}M tokens/s, local "
            f"{tokens / whole['local'] / 1e6:.2f}M tokens/s: ratio "
            f"{whole['local'] / whole['bucket']:.3f}; after the first batch "
            f"{after['local'] / after['bucket']:.3f} (to the first batch: bucket "
            f"{first['bucket'] * 1e3:.0f} ms, local {first['local'] * 1e3:.0f} ms)"
        )
        epoch_order.GROUP_BLOCKS = args.group_blocks
        # One rank of several, in the loop's process: rank 0's slots, 1/N of each step.
        for world in args.warm_world:
            g = args.global_batch
            if g % world:
                print(f"rank 0 of {world}: skipped, --global-batch {g} is not a multiple of {world}")
                continue
            kw = {"micro_batch": g // world, "rank": 0, "world_size": world, **vf}
            whole, after, _ = warm_pair(url, local, working, args, n, **kw)
            per_rank[f"rank 0 of {world}"] = {k: tokens / world / v for k, v in whole.items()}
            print(
                f"warm loader, {n} steps, rank 0 of {world} (its 1/{world} of each step), groups of "
                f"{args.group_blocks}: bucket {tokens / world / whole['bucket'] / 1e6:.2f}M tokens/s, "
                f"local {tokens / world / whole['local'] / 1e6:.2f}M tokens/s: ratio "
                f"{whole['local'] / whole['bucket']:.3f}; after the first batch "
                f"{after['local'] / after['bucket']:.3f}"
            )
        older = args.dir / "dataset-v2"
        make_dataset(older, args.shards, args.shard_kb, v2=True)
        runs = {"new": [], "old": []}
        for _ in range(args.repeats):
            runs["new"].append(run_steps(local, args, None, n, **vf))
            runs["old"].append(run_steps(older, args, None, n, **vf))
        rate = {k: tokens / min(v) for k, v in runs.items()}
        print(
            f"local loader, {n} steps: gristmill-shards/3 {rate['new'] / 1e6:.2f}M tokens/s, /2 "
            f"{rate['old'] / 1e6:.2f}M tokens/s: ratio {rate['new'] / rate['old']:.3f}"
        )
        step_share(per_rank, args.train_tokens_per_s)
        print()
        projection()
    finally:
        proxy.stop()
        s3.stop()


def step_share(per_rank: dict[str, dict[str, float]], train: float) -> None:
    """What each loader measured above costs a training that consumes `train` tokens/s per rank: the
    seconds its loop spends reading a training second's tokens, local and from the bucket, and the
    bucket's extra as a share of the step (in the loop's process it adds to the step; with workers it
    runs beside it, on the node's other cores)."""
    print(f"the loader's share of a training step at {train:,.0f} tokens/s per rank (--train-tokens-per-s):")
    for label, rate in per_rank.items():
        local, bucket = train / rate["local"], train / rate["bucket"]
        print(
            f"  {label}: local {local * 100:.3f}%, bucket {bucket * 100:.3f}% of each second; the bucket "
            f"adds {(bucket - local) * 100:.3f}%: training tokens/s, bucket ÷ local, "
            f"{(1 + local) / (1 + bucket):.4f}"
        )


def projection(nodes: int = 64, val_fraction: float = 0.001, step_tokens: int = 1 << 20) -> None:
    """FineWeb-Edu on `nodes` nodes, from the layout's and the loader's formulas (docs/object-storage.md);
    `step_tokens` a global batch's (configs/train/llama3-1b-fineweb-edu.toml)."""
    docs, tokens, itemsize = 1.5e9, 1.3e12, 4  # ~870 tokens a document; vocab 131072: uint32 ids
    sample_docs, group_blocks = 64, 4096
    # A sample's one range: its .docs header and records (36 bytes a document, padded), the .ids
    # header, its ids (padded: half a tar block on average).
    sample_bytes = sample_docs * tokens / docs * itemsize + 36 * sample_docs + 512 + 256
    samples = docs / sample_docs
    group = group_blocks * sample_bytes
    per_node = 3 * group  # TokenLoader.cache_need: three groups at these sizes
    index_open = 16 * samples + 12 * val_fraction * docs  # sample totals and digests, held-out prefix
    print(
        f"on paper, FineWeb-Edu (~{tokens / 1e12:.1f}T tokens, {docs / 1e9:.1f}B documents, uint32) "
        f"on {nodes} nodes:"
    )
    print(
        f"  ids {tokens * itemsize / 1e12:.1f} TB; a sample (one range request) {sample_bytes / 1e3:.0f} kB; "
        f"{samples / 1e6:.1f}M samples"
    )
    print(f"  cache per node: {per_node / 1e9:.1f} GB (data.cache_gb ≥ that), whatever the dataset's size")
    # A group's plan reads the samples its steps' documents lie in (order._Group.extend: a quarter more
    # documents than the step needs at the mean length); a node plans the stream up to its last slot,
    # so the last node plans the whole first step: that many documents drawn from the group's samples.
    first_docs = step_tokens / (tokens / docs) * 1.25 + 4
    first_samples = group_blocks * (1 - (1 - 1 / group_blocks) ** first_docs)
    first = first_samples * sample_bytes
    print(
        f"  before the first step, per node: {(index_open + first) / 1e9:.2f} GB: the sample totals and "
        f"digests and the held-out prefix ({index_open / 1e6:.0f} MB at val_fraction {val_fraction:g}), "
        f"then the samples a first step of {step_tokens:,} tokens reads ({first / 1e9:.2f} GB, "
        f"~{first_samples:,.0f} requests of its group's {group_blocks:,}; the whole group was "
        f"{group / 1e9:.2f} GB)"
    )
    # Every node plans every group, so it fetches every group whole: the dataset once per epoch.
    per_epoch = samples * sample_bytes
    requests = nodes * samples
    print(
        f"  per epoch: each node fetches every group whole, {per_epoch / 1e12:.2f} TB "
        f"({per_epoch / (tokens * itemsize):.3f} × the token bytes); all nodes "
        f"{nodes * per_epoch / 1e12:.0f} TB, "
        f"{requests / 1e9:.2f}B requests (${requests / 1e3 * 0.0004:,.0f} of GETs at $0.0004/1,000; "
        f"egress free in-region, ${nodes * per_epoch / 1e9 * 0.09:,.0f} at $0.09/GB across the internet)"
    )
    print(f"  requests per 1B tokens, one node: {samples / (tokens / 1e9):,.0f}")


if __name__ == "__main__":
    main()
