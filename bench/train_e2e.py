"""The user's throughput: `gristmill train` itself, against the model-only step, in one call.

    python -m bench.train_e2e                         # GPU: the 1.24B recipe, bf16, 150 steps
    python -m bench.train_e2e --float8 --steps 200    # float8 block linears (model.float8)
    python -m bench.train_e2e --optim muon            # optim.name = "muon" (when the trainer has it)
    python -m bench.train_e2e --smoke                 # CPU: the tiny preset end to end (no MFU)
    python -m bench.train_e2e --set run.on_spike=rewind --label rewind   # any other override

Every MFU figure of bench/train_mfu is one model-and-optimizer step on random tokens. What a user
sees is what `gristmill train` logs with everything around that step: the loader reading real
shards (memory-mapped tars, the separator check off as in the recipe), validation, the metrics
rows every 10 steps, async checkpoints, the non-finite guard. This bench:

1. writes (once, reused) a synthetic dataset at the recipe's vocabulary (131072 ids, so uint32
   shards, as the Llama-3 tokenizer gives) with FineWeb-Edu-like lognormal document lengths,
   through the build's own shard writer (pipelines/synthetic_dataset.py);
2. runs `gristmill train --config configs/train/llama3-1b-fineweb-edu.toml` with --set overrides
   only for what one GPU and a short run need (the dataset, global batch = one micro-batch of 16,
   steps, a short warmup, validation every 50 steps, an async checkpoint every 100, keep_last 1);
3. runs bench/train_mfu's headline (the same shape, micro-batch and loss chunk; no peer) in the
   same call, and prints the logged tokens/s of the run (steps after --skip, which holds the
   compile) against it: the goal is ≥ 0.97.

It prints `e2e: … tokens/s, MFU …; model-only …; ratio …` and, with --json, writes both figures,
the per-row tokens/s, the losses and peak memory. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/train/llama3-1b-fineweb-edu.toml"
TINY = ROOT / "configs/train/tiny.toml"


def write_dataset(root: Path, vocab: int, tokens: int, seed: int = 0) -> Path:
    """A synthetic dataset of about `tokens` tokens (reused when it exists with the same shape)."""
    from pipelines.synthetic_dataset import write_synthetic_dataset

    marker = root / "dataset.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("vocab_size") == vocab and info.get("tokens", 0) >= tokens:
            return root
        raise SystemExit(f"{root} holds another dataset; remove it or pass another --dir")
    rng = np.random.default_rng(seed)
    dtype = np.uint32 if vocab > 65536 else np.uint16

    def documents():
        written = 0
        while written < tokens:
            n = int(np.clip(rng.lognormal(6.5, 0.9), 16, 16384))  # mean ~900 tokens
            # Zipf-like ids (never the separator 0), so the loss moves as on text
            ids = np.minimum(rng.zipf(1.2, n), vocab - 1).astype(dtype)
            ids[-1] = 0
            written += n
            yield ids

    t0 = time.perf_counter()
    info = write_synthetic_dataset(root, documents(), vocab_size=vocab)
    print(f"dataset: {info['documents']:,} documents, {info['tokens']:,} tokens, {info['dtype']} "
          f"({time.perf_counter() - t0:.0f} s) → {root}", flush=True)  # fmt: skip
    return root


def run_train(args, dataset: Path, run_dir: Path) -> list[dict]:
    """`gristmill train` on the recipe with the bench's overrides; returns metrics.jsonl's rows."""
    sets = [
        f"data.dataset={json.dumps(str(dataset))}",
        f"run.output_dir={json.dumps(str(run_dir))}",
        f"schedule.steps={args.steps}",
        f"schedule.warmup_steps={min(10, args.steps)}",
        f"run.log_every={args.log_every}",
        f"run.val_every={args.val_every}",
        "run.val_batches=2",
        f"data.val_fraction={args.val_fraction}",
        f"checkpoint.interval={args.checkpoint_every}",
        "checkpoint.async=true",
        "checkpoint.keep_last=1",
        "metrics.tensorboard=false",
        "metrics.plot=false",
    ]
    if args.smoke:
        config = TINY
        sets += ["run.device=cpu", "data.seq_len=128", "data.global_batch_tokens=1024", "data.micro_batch=8"]
    else:
        config = RECIPE
        sets += [
            f"model.vocab_size={args.vocab}",
            f"data.seq_len={args.seq}",
            f"data.global_batch_tokens={args.micro_batch * args.seq}",
            f"data.micro_batch={args.micro_batch}",
        ]
    if args.float8:
        sets.append("model.float8=true")
    if args.optim != "adamw":
        sets.append(f"optim.name={args.optim}")
    sets += args.sets
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", str(config), "--set", *sets]
    print("$ " + " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"gristmill train exited {proc.returncode}")
    print(f"gristmill train: {time.perf_counter() - t0:.0f} s", flush=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # The figures come from metrics.jsonl; a 1.24B checkpoint is 15 GiB and a lent GPU's disk holds
    # 64 GiB, so a session's fourth run would stop at the trainer's free-space check.
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return [r for r in rows if "loss" in r]


def model_only(args, out: Path) -> dict | None:
    """bench/train_mfu's headline for the same shape (its own process: a clean GPU)."""
    if args.smoke:
        cmd = ["--preset", "tiny", "--device", "cpu", "--seq", "128", "--micro-batch", "8"]
    else:
        cmd = ["--seq", str(args.seq), "--micro-batch", str(args.micro_batch)]
    cmd = [sys.executable, "-m", "bench.train_mfu", *cmd, "--quick", "--no-peer", "--json", str(out)]
    if args.float8:
        cmd.append("--float8")
    print("$ " + " ".join(cmd[2:]), flush=True)
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        return None
    results = [r for r in json.loads(out.read_text())["results"] if "tokens_per_s" in r]
    return results[-1] if results else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "runs/bench-e2e", help="dataset and runs go here")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--skip", type=int, default=20, help="logged steps up to this one are warm-up (compile)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--val-every", type=int, default=50)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--float8", action="store_true")
    ap.add_argument("--optim", default="adamw")
    ap.add_argument("--no-model-only", action="store_true", help="skip the bench/train_mfu figure")
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="more overrides for the run")
    ap.add_argument("--label", default="", help="added to the run's label (run directory, json)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny preset: the script end to end")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.seq, args.skip = 512, 128, min(args.skip, args.steps // 2)
    tokens_per_step = (8 * 128) if args.smoke else args.micro_batch * args.seq
    # The run's steps and a held-out split of ~8 global batches (validation reads 2 of them).
    train_tokens, val_tokens = tokens_per_step * (args.steps + 8), tokens_per_step * 8
    total = int((train_tokens + val_tokens) * 1.1)
    args.val_fraction = round(val_tokens / total * 1.1, 4)
    dataset = write_dataset(args.dir / f"data-v{args.vocab}", args.vocab, total)
    label = "-".join(["float8" if args.float8 else "bf16", args.optim, *([args.label] if args.label else [])])
    run_dir = args.dir / f"run-{label}-{int(time.time())}"
    rows = run_train(args, dataset, run_dir)
    timed = [r for r in rows if r["step"] > args.skip]
    if not timed:
        raise SystemExit(f"no logged step after --skip {args.skip}; raise --steps")
    tps = statistics.median(r["tokens_per_s"] for r in timed)
    mfus = [r["mfu"] for r in timed if r.get("mfu") is not None]
    result = {
        "label": label,
        "e2e_tokens_per_s": tps,
        "e2e_mfu": statistics.median(mfus) if mfus else None,
        "rows_tokens_per_s": [(r["step"], r["tokens_per_s"]) for r in timed],
        "loss_last": rows[-1]["loss"],
        "loss_at": {r["step"]: r["loss"] for r in rows},
        "peak_memory_bytes": max(r["peak_memory_bytes"] for r in rows),
        "run_dir": str(run_dir),
    }
    mfu = f", MFU {100 * result['e2e_mfu']:.1f}%" if result["e2e_mfu"] is not None else ""
    line = (
        f"e2e {label}: {tps:,.0f} tokens/s{mfu} (median of {len(timed)} logged rows after step {args.skip})"
    )
    if not args.no_model_only:
        ref = model_only(args, args.dir / f"model-only-{label}.json")
        if ref is not None:
            result["model_only_tokens_per_s"] = ref["tokens_per_s"]
            result["ratio"] = tps / ref["tokens_per_s"]
            line += (
                f"; model-only {ref['tokens_per_s']:,.0f} tokens/s; ratio {result['ratio']:.3f} (goal ≥ 0.97)"
            )
    print(line, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
