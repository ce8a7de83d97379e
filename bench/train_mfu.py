"""Single-device training throughput: steady-state tokens/s, MFU and peak memory per configuration.

    python bench/train_mfu.py --preset llama3-1b --seq 2048            # GPU: the default sweep
    python bench/train_mfu.py --preset tiny --device cpu               # CPU smoke (MFU omitted)
    python bench/train_mfu.py --preset llama3-1b --config compile:selective:4:2048 --config eager:none:1:0

Each configuration builds the model on the meta device, materialises it, applies
`training.parallelize.parallelize` with no mesh (one device: AC and compile, bf16 via autocast, as
the trainer does on one process), and runs full training steps on synthetic tokens: forward with
the loss inside, backward, grad-norm clipping at 1.0, fused AdamW, through the trainer's own
`training.train.train_step`. After --warmup steps (compilation happens there) it times --steps
steps. A configuration that runs out of memory is reported as OOM and the sweep goes on.

MFU = tokens/s * training.model.flops_per_token(cfg, seq) / peak dense bf16 FLOP/s of the device
(6 * N_matmul + 12 * L * d * T with the LM head; AC recomputation not counted). The table also
gives each configuration's ratio to the best public ~1B baseline, 40% MFU (torchtitan / the 1.2B
blog run on H100; H100 SXM and H200 dense bf16 peak 989 TFLOP/s). Unknown devices (CPU) get no MFU.
This is a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config import OptimSection, ScheduleSection  # noqa: E402
from training.metrics import peak_flops  # noqa: E402
from training.model import PRESETS, Transformer, flops_per_token, num_params  # noqa: E402
from training.optim import build_optimizer, build_scheduler  # noqa: E402
from training.parallelize import ParallelConfig, autocast_context, parallelize  # noqa: E402
from training.train import train_step  # noqa: E402

BASELINE_MFU = 0.40  # best public ~1B Llama-3 figure on H100 (bf16, FSDP, torch.compile)


@dataclass
class BenchConfig:
    compile: bool
    ac: str
    micro_batch: int
    loss_chunk: int

    @classmethod
    def parse(cls, spec: str) -> BenchConfig:
        """'compile|eager : none|selective|full : micro_batch : loss_chunk' e.g. compile:selective:4:2048"""
        parts = spec.split(":")
        if (
            len(parts) != 4
            or parts[0] not in ("compile", "eager")
            or parts[1] not in ("none", "selective", "full")
        ):
            raise SystemExit(
                f"bad --config {spec!r}: expected compile|eager:none|selective|full:MBS:LOSS_CHUNK"
            )
        return cls(parts[0] == "compile", parts[1], int(parts[2]), int(parts[3]))

    def label(self) -> str:
        chunk = f"chunk {self.loss_chunk}" if self.loss_chunk else "plain loss"
        return f"{'compile' if self.compile else 'eager'}, AC {self.ac}, mbs {self.micro_batch}, {chunk}"


def default_configs(device: str, seq: int) -> list[BenchConfig]:
    if device == "cpu":
        return [BenchConfig(False, "none", 1, 0), BenchConfig(False, "full", 2, seq)]
    return [
        BenchConfig(False, "none", 1, 0),
        BenchConfig(False, "selective", 2, seq),
        BenchConfig(True, "none", 2, seq),
        BenchConfig(True, "none", 2, 0),
        BenchConfig(True, "selective", 4, seq),
        BenchConfig(True, "full", 8, seq),
    ]


def run_config(args, bc: BenchConfig, device: torch.device) -> dict:
    cfg = PRESETS[args.preset].replace(max_seq_len=max(args.seq, PRESETS[args.preset].max_seq_len))
    cfg = cfg.replace(loss_chunk=bc.loss_chunk)
    pcfg = ParallelConfig(activation_checkpoint=bc.ac, compile=bc.compile, param_dtype=args.dtype)
    with torch.device("meta"):
        model = Transformer(cfg)
    model = parallelize(model, None, pcfg)
    model.to_empty(device=device)
    torch.manual_seed(0)
    model.init_weights()
    optim = OptimSection()  # the trainer's defaults: AdamW (0.9, 0.95), wd 0.1, fused on CUDA, clip 1.0
    opt = build_optimizer(model, optim, device.type)
    sched = build_scheduler(opt, optim, ScheduleSection(warmup_steps=0, steps=args.warmup + args.steps))
    amp = functools.partial(autocast_context, pcfg, None, device.type)
    g = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (bc.micro_batch, args.seq + 1), generator=g).to(device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step() -> torch.Tensor:  # the trainer's own step: one micro-batch, clip, optimizer, schedule
        batch = [{"input_ids": x, "labels": y}]
        return train_step(model, opt, sched, batch, grad_clip=optim.grad_clip, amp=amp)["loss"]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    elapsed = time.perf_counter() - t0
    tokens_per_s = bc.micro_batch * args.seq * args.steps / elapsed
    fpt = flops_per_token(cfg, args.seq)
    result = {
        "config": bc.label(),
        "tokens_per_s": tokens_per_s,
        "step_ms": 1000 * elapsed / args.steps,
        "tflops": tokens_per_s * fpt / 1e12,
        "loss": float(loss.item()),
        "params": num_params(model),
        "flops_per_token": fpt,
    }
    if device.type == "cuda":
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        result["reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-1b", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="compute dtype (default bfloat16 on GPU, float32 on CPU)")  # fmt: skip
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 5 GPU / 2 CPU)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20 GPU / 3 CPU)")
    ap.add_argument("--config", action="append", default=[],
                    help="compile|eager:none|selective|full:MICRO_BATCH:LOSS_CHUNK (repeatable)")  # fmt: skip
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    on_cpu = device.type == "cpu"
    args.dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    args.warmup = args.warmup if args.warmup is not None else (2 if on_cpu else 5)
    args.steps = args.steps if args.steps is not None else (3 if on_cpu else 20)
    configs = [BenchConfig.parse(s) for s in args.config] or default_configs(device.type, args.seq)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu"
    peak = peak_flops(name) if device.type == "cuda" else None
    if peak is not None and args.dtype == "float32":
        peak = None  # the table is for bf16 peaks
    print(
        f"device: {name}; torch {torch.__version__}; preset {args.preset}; seq {args.seq}; dtype {args.dtype}"
    )
    print(
        f"peak: {peak / 1e12:.0f} TFLOP/s dense bf16"
        if peak
        else "peak: unknown for this device, MFU omitted"
    )

    results = []
    for bc in configs:
        try:
            r = run_config(args, bc, device)
        except torch.OutOfMemoryError:
            r = {"config": bc.label(), "oom": True}
        finally:
            gc.collect()
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if peak and not r.get("oom"):
            r["mfu"] = r["tflops"] * 1e12 / peak
            r["vs_baseline"] = r["mfu"] / BASELINE_MFU
        results.append(r)
        print("  done:", json.dumps(r), flush=True)

    header = (
        f"{'configuration':48} {'tok/s':>10} {'step ms':>9} {'TFLOP/s':>8} {'MFU':>7} {'/40%':>6} "
        f"{'peak GiB':>9}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        if r.get("oom"):
            print(f"{r['config']:48} {'OOM':>10}")
            continue
        mfu = f"{100 * r['mfu']:6.1f}%" if "mfu" in r else f"{'n/a':>7}"
        ratio = f"{r['vs_baseline']:6.2f}" if "vs_baseline" in r else f"{'n/a':>6}"
        mem = f"{r['peak_mem_gib']:9.1f}" if "peak_mem_gib" in r else f"{'n/a':>9}"
        print(
            f"{r['config']:48} {r['tokens_per_s']:10.0f} {r['step_ms']:9.1f} {r['tflops']:8.2f} "
            f"{mfu} {ratio} {mem}"
        )
    ok = [r for r in results if "mfu" in r]
    if ok:
        best = max(ok, key=lambda r: r["mfu"])
        print(
            f"\nbest: {best['config']}: MFU {100 * best['mfu']:.1f}% = "
            f"{best['vs_baseline']:.2f}x the 40% baseline"
        )
    if args.json:
        args.json.write_text(json.dumps({"device": name, "args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
