"""Loader open + plan at FineWeb-Edu scale: 1.5B documents, 8 ranks opening at once on one box.

    python -m bench.loader_scale [--dir /tmp/gristmill-scale] [--docs 1.5e9] [--ranks 8]
                                 [--val-fraction 0.001] [--sources 1|3] [--mix-dir DIR] [--steps 10000]

1. Writes (once; reused when the parameters match) a synthetic dataset directory of --docs
   documents with FineWeb-Edu's mean length (uniform 1..1734 tokens, mean 867 → ~1.3T tokens,
   uint32 ids): the real loader index (index/doc_tokens.bin, doc_offsets.bin, shard_rows.bin,
   sample_tokens.bin, heldout.bin and its hashes, ~30 GB at 1.5B), dataset.json (the /1 layout: a
   tar sample per document), and shards as *sparse* files of the recorded sizes (~7.7 TB
   apparent, a few MB on disk) with real tar headers where the loader's open-time spot check
   looks. No manifest parquet is written at all: the training path must not need it. Hashes in
   dataset.json are placeholders (the loader does not hash; `validate` would flag them).
   With --sources 3 it also writes the same --docs split over three such datasets (12 : 2 : 1,
   1.2B / 0.2B / 0.1B documents at 1.5B; other seeds) under --mix-dir/{a,b,c}: another ~12 GB.
2. Baseline, in a fresh process: the previous loader's approach — the per-document lengths read
   into private memory (np.fromfile), then the same plan.
3. --ranks processes started at once, each `TokenLoader(..., rank=r, world_size=--ranks)` as
   `training.train` builds it (seq 2048, global batch 512 ≈ 1M tokens, held-out split on), then
   the epoch plan and rank r's first batch — twice: with an empty loader cache (a first open:
   one process computes the shared tables, training/data/cache.py) and again with it filled
   (a restart). Each reports wall times, CPU time and its peak
   *private* memory: RssAnon from /proc/self/status sampled every 5 ms (page cache, the shared
   index maps included, is RssFile and not counted).
4. With --sources 3, step 3 again for the mixture, after the single-source rounds of the same
   invocation (a fresh loader cache): each rank opens the three training splits
   (`DocumentTable(..., val_fraction=--val-fraction)`), builds the Plan as a recipe with
   [[data.sources]] does (one phase of --steps steps, seq 2048, G 512, weights 0.8 / 0.15 / 0.05,
   max_epochs 1, supply checked) and `TokenLoader(plan, tables, rank=r, ...)`, plans
   epoch 0 of every source and builds its first batch; the ratios to the single-source rounds follow.

Prints one line per rank, the worst rank against the goals (< 30 s, < 1 GiB), and the ratios to the
baseline (and, for the mixture, to the single source).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np

from training.contract.dataset_format import (
    DATASET_JSON,
    LEGACY_FORMAT,
    SHARDS_DIR,
    fingerprint,
    sample_totals,
)
from training.contract.dataset_index import (
    DOC_OFFSETS,
    DOC_TOKENS,
    HELDOUT,
    HELDOUT_SHA,
    INDEX_DIR,
    LEGACY_INDEX_FORMAT,
    SAMPLE_TOKENS,
    SHARD_ROWS,
)
from training.contract.heldout import SortedWriter

MEAN_MAX = 1734  # uniform 1..1734: mean 867 tokens, FineWeb-Edu's 1.3T tokens / 1.5B documents
SHARD_CAP = 3 << 30  # a shard starts a new one past 3 GiB, so in-shard offsets stay uint32
CHUNK = 50_000_000
BASE: list[dict] = []  # the baseline's result, for the ratios printed after each round
MIX_PARTS = (12, 2, 1)  # --sources 3: --docs split 12 : 2 : 1 (1.2B / 0.2B / 0.1B at 1.5B)
MIX_NAMES = ("a", "b", "c")
MIX_WEIGHTS = (0.8, 0.15, 0.05)  # the mixture phase's weights, in source order


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def mix_docs(docs: int) -> list[int]:
    """--docs split over the mixture's sources by MIX_PARTS (the last takes the remainder)."""
    parts = [docs * k // sum(MIX_PARTS) for k in MIX_PARTS[:-1]]
    return parts + [docs - sum(parts)]


def source_dirs(args, sources: int | None = None) -> list[Path]:
    """The dataset directories of a round of `sources` (default --sources): --dir, or the
    mixture's --mix-dir/{a,b,c}."""
    if (sources or args.sources) == 1:
        return [Path(args.dir)]
    return [Path(args.mix_dir) / name for name in MIX_NAMES]


def make_dataset(root: Path, docs: int, seed: int = 0) -> dict:
    params = {
        "docs": docs,
        "lengths": f"uniform 1..{MEAN_MAX}",
        "seed": seed,
        "shard_cap": SHARD_CAP,
        "index": LEGACY_INDEX_FORMAT,
    }
    try:
        info = json.loads((root / DATASET_JSON).read_text())
        if info.get("bench") == params:
            return info
    except (OSError, ValueError):
        pass
    shutil.rmtree(root, ignore_errors=True)
    (root / INDEX_DIR).mkdir(parents=True)
    (root / SHARDS_DIR).mkdir()
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    pos = 0  # byte position in the concatenation of all shards
    shard_first: list[int] = []  # first row of each shard
    base = 0  # where the current shard begins in that concatenation
    tokens = 0
    with open(root / INDEX_DIR / DOC_TOKENS, "wb") as ft, open(root / INDEX_DIR / DOC_OFFSETS, "wb") as fo:
        for a in range(0, docs, CHUNK):
            n = min(CHUNK, docs - a)
            lengths = rng.integers(1, MEAN_MAX + 1, n, dtype=np.uint32)
            # header + ids padded to 512 + the .json member (header + one block): a webdataset sample
            size = 512 + (lengths.astype(np.int64) * 4 + 511) // 512 * 512 + 1024
            starts = pos + np.cumsum(size) - size
            # A new shard begins with the first member that starts past the next SHARD_CAP multiple,
            # so a shard holds SHARD_CAP bytes plus at most one member: offsets stay < 4 GiB.
            slot = starts // SHARD_CAP
            first = np.r_[slot[0] != (pos - 1) // SHARD_CAP if a else True, slot[1:] != slot[:-1]]
            bases = np.where(first, starts, -1)
            bases[0] = bases[0] if first[0] else base
            np.maximum.accumulate(bases, out=bases)
            offsets = starts - bases + 512
            shard_first.extend((np.flatnonzero(first) + a).tolist())
            base = int(bases[-1])
            ft.write(lengths.astype("<u4").tobytes())
            fo.write(offsets.astype("<u4").tobytes())
            tokens += int(lengths.sum(dtype=np.int64))
            pos = int(starts[-1] + size[-1])
            print(f"\r  writing the index: {a + n:,}/{docs:,} documents", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    lengths = np.memmap(root / INDEX_DIR / DOC_TOKENS, "<u4", mode="r")
    offsets = np.memmap(root / INDEX_DIR / DOC_OFFSETS, "<u4", mode="r")
    names = [f"{s:05d}_00000.tar" for s in range(len(shard_first))]
    ends = []
    for s, name in enumerate(names):
        first_row, last_row = shard_first[s], (shard_first[s + 1] if s + 1 < len(names) else docs) - 1
        end = int(offsets[last_row]) + (int(lengths[last_row]) * 4 + 511) // 512 * 512 + 1024 + 1024
        ends.append((end + 10239) // 10240 * 10240)  # end-of-archive blocks, 10 KiB records
        with open(root / SHARDS_DIR / name, "wb") as f:
            f.truncate(ends[-1])  # sparse: no token bytes on disk
            for row in (first_row, last_row):  # where the loader's open-time spot check reads
                f.seek(int(offsets[row]) - 512)
                f.write(tar_header(f"t{s:05d}d{row:09d}.ids", int(lengths[row]) * 4))
    np.array(shard_first + [docs], "<u8").tofile(root / INDEX_DIR / SHARD_ROWS)
    # What planning reads (training/contract/dataset_index.py): each shard's 64-row samples' totals,
    # and every row sorted by the held-out hash (binned on disk: memory of one bin).
    bounds = shard_first + [docs]
    samples = 0
    with open(root / INDEX_DIR / SAMPLE_TOKENS, "wb") as f:
        for a, b in zip(bounds[:-1], bounds[1:]):
            totals = sample_totals(lengths[a:b], np.array([0, b - a]))
            f.write(totals.astype("<u8").tobytes())
            samples += len(totals)
    scratch = root / "heldout-scratch"
    scratch.mkdir(exist_ok=True)
    held = SortedWriter(str(scratch))
    for a in range(0, docs, CHUNK):
        held.add(np.arange(a, min(a + CHUNK, docs), dtype=np.uint64), lengths[a : a + CHUNK])
    with open(root / INDEX_DIR / HELDOUT, "wb") as f:
        for chunk in held.chunks():
            f.write(chunk.tobytes())
    (root / INDEX_DIR / HELDOUT_SHA).write_bytes(b"".join(held.digests))
    shutil.rmtree(scratch)
    files = {}
    for name, dtype, count in (
        (DOC_TOKENS, "uint32", docs),
        (DOC_OFFSETS, "uint32", docs),
        (SHARD_ROWS, "uint64", len(names) + 1),
        (SAMPLE_TOKENS, "uint64", samples),
        (HELDOUT, "heldout", docs),
        (HELDOUT_SHA, "sha256", len(held.digests)),
    ):
        files[name] = {
            "dtype": dtype,
            "count": count,
            "bytes": (root / INDEX_DIR / name).stat().st_size,
            "sha256": "synthetic",
        }
    info = {
        "format": LEGACY_FORMAT,  # a sample per document (.ids + .json), as written above
        "tokenizer_sha256": "synthetic",
        "vocab_size": 131072,
        "dtype": "uint32",
        "separator": {"token": "<|endoftext|>", "id": 0, "position": "after"},
        "config_sha256": "synthetic",
        "documents": docs,
        "tokens": tokens,
        "shards": len(names),
        "shard_files": {n: {"bytes": ends[s], "sha256": "synthetic"} for s, n in enumerate(names)},
        "index": {"format": LEGACY_INDEX_FORMAT, "files": files},
        "bench": params,
    }
    info["fingerprint"] = fingerprint(info)
    info["status"] = "complete"
    (root / DATASET_JSON).write_text(json.dumps(info, indent=1))
    print(
        f"  wrote {root} in {time.perf_counter() - t0:.0f} s: {len(names):,} sparse shards", file=sys.stderr
    )
    return info


class PeakAnon:
    """Peak RssAnon (private memory) of this process, sampled every 5 ms by a thread."""

    def __enter__(self):
        self.peak, self._stop = status_kib("RssAnon"), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, status_kib("RssAnon"))

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, status_kib("RssAnon"))


def open_loader(args):
    """Rank --rank's loader as the trainer builds it: one dataset, or the --sources 3 mixture."""
    from training.data import plan as data_plan  # (imported by run_rank before the clock starts)
    from training.data.loader import TokenLoader, dataset_loader
    from training.data.reader import DocumentTable

    if args.sources == 1:
        return dataset_loader(
            args.dir,
            seq_len=2048,
            global_batch=512,
            micro_batch=8,
            seed=0,
            rank=args.rank,
            world_size=args.ranks,
            val_fraction=args.val_fraction,
        )
    # As training/data/recipe.open_plan does for [[data.sources]] + one [[phase]].
    tables = [DocumentTable(d, split="train", val_fraction=args.val_fraction) for d in source_dirs(args)]
    plan = data_plan.Plan(
        [data_plan.Source.of(t, name, max_epochs=1) for t, name in zip(tables, MIX_NAMES)],
        [data_plan.Phase("main", args.steps, 2048, 512, data_plan.integer_weights(list(MIX_WEIGHTS)))],
        seed=0,
    )
    plan.check_supply()
    return TokenLoader(plan, tables, micro_batch=8, rank=args.rank, world_size=args.ranks)


def run_rank(args) -> dict:
    import training.data.loader  # noqa: F401  (torch: part of the interpreter, not of the open)

    base = status_kib("RssAnon")  # interpreter + torch + numpy, before the loader exists
    cpu0, t0 = time.process_time(), time.perf_counter()
    with PeakAnon() as peak:
        loader = open_loader(args)
        t1 = time.perf_counter()
        for source in range(len(loader.plan.sources)):  # epoch 0 of each source's stream
            loader.builder.order(0, source)
        t2 = time.perf_counter()
        batch = loader.builder.batch(0)
        t3 = time.perf_counter()
    return {
        "rank": args.rank,
        "open_s": t1 - t0,
        "plan_s": t2 - t1,
        "first_batch_s": t3 - t2,
        "total_s": t3 - t0,
        "cpu_s": time.process_time() - cpu0,
        "base_anon_mib": base / 1024,
        "peak_anon_mib": peak.peak / 1024,
        "file_mib": status_kib("RssFile") / 1024,
        "batch_rows": sum(len(mb["input_ids"]) for mb in batch),
        "documents": sum(t.documents for t in loader.builder.tables),
    }


def run_baseline(args) -> dict:
    from training.data import order as epoch_order

    base = status_kib("RssAnon")
    t0 = time.perf_counter()
    with PeakAnon() as peak:
        lengths = np.fromfile(Path(args.dir) / INDEX_DIR / DOC_TOKENS, np.uint32)  # what the old open held
        t1 = time.perf_counter()
        epoch_order.EpochOrder(epoch_order.DocBlocks.of_lengths(lengths), seed=0, epoch=0)
        t2 = time.perf_counter()
    return {
        "read_s": t1 - t0,
        "plan_s": t2 - t1,
        "total_s": t2 - t0,
        "base_anon_mib": base / 1024,
        "peak_anon_mib": peak.peak / 1024,
        "documents": len(lengths),
    }


def spawn(args, part: str, rank: int = 0) -> subprocess.Popen:
    argv = [
        sys.executable,
        __file__,
        "--part",
        part,
        "--dir",
        args.dir,
        "--rank",
        str(rank),
        "--ranks",
        str(args.ranks),
        "--val-fraction",
        str(args.val_fraction),
        "--sources",
        str(args.sources),
        "--mix-dir",
        args.mix_dir,
        "--steps",
        str(args.steps),
    ]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def collect(p: subprocess.Popen) -> dict:
    out, _ = p.communicate()
    if p.returncode:
        raise SystemExit(f"a bench process failed (exit {p.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/gristmill-scale")
    ap.add_argument("--docs", type=float, default=1.5e9)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument(
        "--val-fraction", type=float, default=0.001, help="the FineWeb-Edu recipe's (0: none held out)"
    )
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument(
        "--sources",
        type=int,
        choices=[1, 3],
        default=1,
        help="3: after the single-source rounds, the same for a 3-source mixture of --docs documents in all",
    )
    ap.add_argument("--mix-dir", help="the mixture's datasets, {a,b,c} under it (default: --dir + '-mix')")
    ap.add_argument("--steps", type=int, default=10_000, help="the mixture phase's step budget")
    ap.add_argument("--part", choices=["main", "rank", "baseline"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.mix_dir = args.mix_dir or args.dir + "-mix"
    if args.part != "main":
        print(json.dumps(run_rank(args) if args.part == "rank" else run_baseline(args)))
        return
    mixture, args.sources = args.sources == 3, 1
    info = make_dataset(Path(args.dir), int(args.docs))
    if mixture:  # written up front: the rounds below then run back to back
        for seed, (root, docs) in enumerate(zip(source_dirs(args, 3), mix_docs(int(args.docs))), 1):
            make_dataset(root, docs, seed)
    describe([info], args)
    base = None
    if not args.no_baseline:
        base = collect(spawn(args, "baseline"))
        BASE.append(base)
        base["own_mib"] = base["peak_anon_mib"] - base["base_anon_mib"]
        print(
            f"baseline, the previous loader's open (lengths read into private memory, then the plan): "
            f"{base['total_s']:.1f} s (read {base['read_s']:.1f} + plan {base['plan_s']:.1f}), private "
            f"memory +{base['own_mib'] / 1024:.2f} GiB over the interpreter; the previous loader also kept "
            f"shard and offset per document: +{info['documents'] * 6 / 2**30:.1f} GiB more per rank"
        )
    # The ranks share the split's block table through the loader's cache (training/data/order.py,
    # order_cache.py): a fresh cache directory, so round 1 is a first open; round 2 (a restart) finds it.
    os.environ["GRISTMILL_CACHE"] = str(Path(args.dir) / "loader-cache")
    rounds = ("first open, empty cache", "restart, cache filled")
    shutil.rmtree(os.environ["GRISTMILL_CACHE"], ignore_errors=True)
    single = [ranks_at_once(args, what) for what in rounds]
    if not mixture:
        return
    args.sources = 3
    print(f"\n3-source mixture, weights {'/'.join(map(str, MIX_WEIGHTS))}, one phase of {args.steps} steps:")
    describe([json.loads((d / DATASET_JSON).read_text()) for d in source_dirs(args)], args)
    shutil.rmtree(os.environ["GRISTMILL_CACHE"], ignore_errors=True)  # round 1 a first open again
    for what, one in zip(rounds, single):
        mix = ranks_at_once(args, what)
        print(
            f"mixture vs single source ({what}): worst rank time {mix['worst_s'] / one['worst_s']:.2f}×, "
            f"worst rank CPU {mix['cpu_s'] / one['cpu_s']:.2f}×, private peak "
            f"{mix['peak_mib'] / one['peak_mib']:.2f}× (the loader's own {mix['own_mib']:.0f} vs "
            f"{one['own_mib']:.0f} MiB)"
        )


def describe(infos: list[dict], args) -> None:
    """One line per dataset of the round, then the page cache warmed as a node's first rank would:
    one read of each dataset's lengths (doc_tokens.bin)."""
    for info, root in zip(infos, source_dirs(args)):
        index_bytes = sum(f["bytes"] for f in info["index"]["files"].values())
        print(
            f"dataset {root}: {info['documents']:,} documents, {info['tokens']:,} tokens, "
            f"{info['shards']:,} shards; index {index_bytes / 2**30:.1f} GiB; {os.cpu_count()} CPUs; "
            f"val_fraction {args.val_fraction}"
        )
    t0 = time.perf_counter()
    for root in source_dirs(args):
        with open(root / INDEX_DIR / DOC_TOKENS, "rb") as f:
            while f.read(1 << 26):
                pass
    print(f"page cache warmed: doc_tokens.bin read in {time.perf_counter() - t0:.1f} s")


def ranks_at_once(args, what: str) -> dict:
    """--ranks rank processes at once; prints them and returns the worst rank's figures."""
    t0 = time.perf_counter()
    procs = [spawn(args, "rank", r) for r in range(args.ranks)]
    results = [collect(p) for p in procs]
    wall = time.perf_counter() - t0
    print(f"{args.ranks} ranks at once, {what} ({wall:.1f} s wall for all):")
    print("rank  open s  plan s  1st batch s  total s  cpu s  private peak MiB (interpreter)  page cache MiB")
    for r in results:
        times = f"{r['open_s']:6.1f}  {r['plan_s']:6.1f}  {r['first_batch_s']:11.2f}  {r['total_s']:7.1f}"
        mem = f"{r['peak_anon_mib']:16.0f} ({r['base_anon_mib']:.0f})  {r['file_mib']:14.0f}"
        print(f"{r['rank']:>4}  {times}  {r['cpu_s']:5.1f}  {mem}")
    worst_t = max(r["total_s"] for r in results)
    worst_m = max(r["peak_anon_mib"] for r in results)
    own = max(r["peak_anon_mib"] - r["base_anon_mib"] for r in results)
    print(
        f"worst rank: open + plan + first batch {worst_t:.1f} s (goal < 30 s: "
        f"{'met' if worst_t < 30 else 'NOT met'}), private peak {worst_m / 1024:.2f} GiB with python+torch "
        f"(goal < 1 GiB: {'met' if worst_m < 1024 else 'NOT met'}), of which the loader {own:.0f} MiB; "
        f"{results[0]['documents']:,} training documents"
    )
    if BASE:
        base = BASE[0]
        print(
            f"vs baseline: loader private memory {own / base['own_mib']:.3f}× (not counting the previous "
            f"loader's other 6 bytes/doc), time per rank {worst_t / base['total_s']:.2f}× (baseline alone; "
            f"the ranks {args.ranks} at once on {os.cpu_count()} CPUs)"
        )
    cpu = max(r["cpu_s"] for r in results)
    return {"worst_s": worst_t, "peak_mib": worst_m, "own_mib": own, "cpu_s": cpu, "wall_s": wall}


if __name__ == "__main__":
    main()
