"""Single-GPU training throughput: gristmill's trainer step against a transformers peer, in one run.

    python -m bench.train_mfu                                   # GPU: headline + sweep + memory table
    python -m bench.train_mfu --quick                           # GPU: headline only (peer vs gristmill)
    python -m bench.train_mfu --profile runs/profile            # + torch.profiler summary of gristmill
    python -m bench.train_mfu --preset tiny --device cpu --seq 128 --quick   # CPU smoke (no MFU)

The last points of MFU (issue 19), each one attempt on top of the headline, one row each:
    --attention cudnn|flash|efficient|fa3   SDPA backend forced with torch.nn.attention.sdpa_kernel
                                            (fa3: FlashAttention 3 through activate_flash_attention_impl,
                                            needs the flash_attn_interface package)
    --attention flex|flex-flash             the document mask (docs ~900 tokens) through FlexAttention:
                                            its Triton kernels, or FlashAttention 4's (flash-attn-4,
                                            kernel_options BACKEND FLASH)
    --compile-mode max-autotune-no-cudagraphs   the per-block compile (whole block: norms, attention,
                                            MLP, residual adds) with that Inductor mode
    --float8                                torchao float8 linears (reported separately, never in the
                                            bf16 MFU figure: MFU stays against the bf16 peak)
    --loss-chunk N                          the chunked loss's chunk size
    --optim adamw adamw8bit --loss-steps 200   fused AdamW against bitsandbytes' 8-bit AdamW: tokens/s,
                                            peak and reserved memory, and the loss after 200 steps of
                                            both on the same synthetic Zipf-distributed tokens
Each flag that needs CUDA (cuDNN/efficient/FA3/flex attention, float8, 8-bit AdamW) stops on CPU
with one line saying so.

Headline. Identical shapes and batch for both: the preset (default the 1.24B Llama-3 shape, vocab
131072, tied), seq 2048, --micro-batch sequences per forward, --accum micro-batches per optimizer
step (real 1M-token runs accumulate 8-64 per GPU, so the optimizer is amortised the same way),
random tokens, fp32 master weights, bf16 compute, grad clip 1.0, fused AdamW (0.9, 0.95), wd 0.1.
  (a) peer: transformers' LlamaForCausalLM with the same config, SDPA attention, bf16 autocast,
      full logits and HF's loss, fused AdamW: the reference 1.2B blog run's setup (eager; with
      --peer-compile also `torch.compile(model)`, as that run did).
  (b) gristmill: training.model.Transformer through training.parallelize (per-block compile, AC as
      given) and the trainer's own `training.train.train_step` (chunked, fused cross-entropy).
Both print tokens/s, MFU, peak memory; then the ratio gristmill / peer.

Sweep (without --quick): gristmill over micro-batch sizes x AC modes (the memory table), eager vs
compiled, plain vs chunked loss, and document masking through FlexAttention (cost measured
separately: synthetic documents of FineWeb-Edu-like lengths, mean ~900 tokens).

MFU = tokens/s x training.model.flops_per_token(cfg, seq) / dense bf16 peak (H100 SXM / H200: 989
TFLOP/s): 6 N_matmul + 12 L d T with the LM head, the full T x T attention square counted (as
torchtitan), AC recomputation not counted. Timing: --warmup untimed steps (compilation happens
there), then --steps steps between two device synchronisations; the spread is the min/max over the
--repeats timed windows. A configuration that runs out of memory is reported as OOM and the sweep
goes on. This is a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from training import model as model_module
from training.config import (
    OptimSection,
    ParallelConfig,
)
from training.metrics import peak_flops
from training.model import PRESETS, ModelConfig, Transformer, flops_per_token, num_params
from training.optim import ScheduledLR, build_optimizer
from training.parallelize import autocast_context, parallelize
from training.train import train_step


@dataclass(frozen=True)
class Spec:
    """One gristmill configuration of the sweep."""

    compile: bool = True
    ac: str = "none"
    micro_batch: int = 8
    loss_chunk: int = 8192
    document_mask: bool = False
    attention: str = "default"  # SDPA backend (sdpa_kernel), fa3, or flex / flex-flash (document mask)
    compile_mode: str = ""  # torch.compile mode of the blocks ("": the trainer's default)
    float8: bool = False  # torchao float8 linears
    optim: str = "adamw"  # or adamw8bit (bitsandbytes)

    def label(self) -> str:
        chunk = f"chunk {self.loss_chunk}" if self.loss_chunk else "full logits"
        doc = ", doc-mask (flex)" if self.document_mask else ""
        mode = "compiled" if self.compile else "eager"
        mode += f" {self.compile_mode}" if self.compile and self.compile_mode else ""
        extra = "".join(
            [
                f", attention {self.attention}" if self.attention != "default" else "",
                ", FLOAT8 (torchao)" if self.float8 else "",
                f", {self.optim}" if self.optim != "adamw" else "",
            ]
        )
        return f"gristmill {mode}, AC {self.ac}, mbs {self.micro_batch}, {chunk}{doc}{extra}"


# Features that have no CPU kernels, and why (checked before any model is built).
CUDA_ONLY = {
    "attention cudnn": "cuDNN attention is a CUDA kernel",
    "attention efficient": "memory-efficient SDPA is a CUDA kernel",
    "attention fa3": "FlashAttention 3 is a Hopper CUDA kernel",
    "attention flex": "FlexAttention's document mask runs on the GPU; the CPU path is a dense mask",
    "attention flex-flash": "FlashAttention 4's CuTe kernels are CUDA kernels",
    "float8": "float8 matmuls need a GPU with float8 tensor cores (sm89+)",
    "optim adamw8bit": "bitsandbytes' 8-bit AdamW has no CPU kernels",
}


def needs_cuda(args) -> str | None:
    """The first requested feature that needs CUDA, as one line, when running on CPU."""
    if args.device != "cpu":
        return None
    asked = [
        f"attention {args.attention}",
        "float8" if args.float8 else "",
        *(f"optim {o}" for o in args.optim),
    ]
    for feature in asked:
        if feature in CUDA_ONLY:
            return f"--{feature} needs CUDA ({CUDA_ONLY[feature]}); run it on a GPU"
    return None


def attention_backend(name: str):
    """A factory of the SDPA-backend context for the timed steps (traced into the compiled blocks
    at warm-up); fa3 first activates FlashAttention 3 as torch's flash backend (once)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name in ("default", "flex"):
        return contextlib.nullcontext
    if name == "flex-flash":  # the document mask's FlexAttention through FlashAttention 4 (CuTe DSL)
        from torch._inductor.kernel.flex.flex_flash_attention import ensure_flash_available

        if not ensure_flash_available():
            raise SystemExit("--attention flex-flash needs FlashAttention 4 (pip install flash-attn-4)")
        model_module.FLEX_KERNEL_OPTIONS = {"BACKEND": "FLASH"}
        return contextlib.nullcontext
    if name == "fa3":
        try:
            from torch.nn.attention import activate_flash_attention_impl
        except ImportError:
            raise SystemExit(
                f"--attention fa3: torch {torch.__version__} has no activate_flash_attention_impl"
            ) from None
        try:
            activate_flash_attention_impl("FA3")
        except Exception as e:  # noqa: BLE001 - the one line is the point
            raise SystemExit(
                f"--attention fa3 needs the FlashAttention 3 package (flash_attn_interface): {e}"
            ) from None
        name = "flash"
    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return functools.partial(sdpa_kernel, [backend])


def to_float8(model: torch.nn.Module) -> None:
    """torchao's float8 training linears for every block matmul (dims multiples of 16), not the LM head."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise SystemExit("--float8 needs torchao (pip install torchao)") from None

    def keep(mod: torch.nn.Module, fqn: str) -> bool:
        return (
            isinstance(mod, torch.nn.Linear)
            and fqn != "output"
            and mod.in_features % 16 == 0
            and mod.out_features % 16 == 0
        )

    convert_to_float8_training(model, module_filter_fn=keep)


# ---------------------------------------------------------------------------------------------- data


def synthetic_batch(cfg: ModelConfig, mbs: int, seq: int, device, seed: int, documents: bool):
    """Random tokens (never zeros: they run faster than real data) and, for document masking,
    position ids restarting at lognormal document boundaries (mean ~900 tokens, FineWeb-Edu-like)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, cfg.vocab_size, (mbs, seq + 1), generator=g)
    batch = {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}
    if documents:
        pos = torch.empty(mbs, seq, dtype=torch.int64)
        for row in range(mbs):
            i = 0
            while i < seq:
                n = int(torch.empty(()).log_normal_(6.5, 0.8, generator=g).clamp(16, seq))
                n = min(n, seq - i)
                pos[row, i : i + n] = torch.arange(n)
                i += n
        batch["position_ids"] = pos
    return {k: v.to(device) for k, v in batch.items()}


# ------------------------------------------------------------------------------------------- timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step, device: torch.device, warmup: int, steps: int, repeats: int
) -> tuple[float, float, float]:
    """(median, min, max) seconds per step over `repeats` windows of `steps` steps after `warmup`."""
    for _ in range(warmup):
        step()
    sync(device)
    windows = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        windows.append((time.perf_counter() - t0) / steps)
    windows.sort()
    return windows[len(windows) // 2], windows[0], windows[-1]


def measure(name: str, step, args, cfg: ModelConfig, tokens_per_step: int, device, extra: dict) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    med, lo, hi = time_steps(step, device, args.warmup, args.steps, args.repeats)
    fpt = flops_per_token(cfg, args.seq)
    r = {
        "config": name,
        "tokens_per_s": tokens_per_step / med,
        "tokens_per_s_range": [tokens_per_step / hi, tokens_per_step / lo],
        "step_ms": 1000 * med,
        "tflops": tokens_per_step / med * fpt / 1e12,
        "flops_per_token": fpt,
        **extra,
    }
    if device.type == "cuda":
        r["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        r["reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    return r


# ------------------------------------------------------------------------------------------- models


def model_config(args, spec: Spec | None = None) -> ModelConfig:
    base = PRESETS[args.preset]
    cfg = base.replace(max_seq_len=max(args.seq, base.max_seq_len))
    if spec is not None:
        cfg = cfg.replace(loss_chunk=spec.loss_chunk, document_mask=spec.document_mask)
    return cfg


def zipf_batch(cfg: ModelConfig, mbs: int, seq: int, device, seed: int) -> dict:
    """Tokens with a learnable distribution (Zipf over the vocabulary, s = 1.1), for comparing the
    loss two optimizers reach on the same data: uniform random tokens leave nothing to learn."""
    g = torch.Generator().manual_seed(10_000 + seed)
    ranks = torch.arange(1, cfg.vocab_size, dtype=torch.float64)
    tokens = torch.multinomial(ranks**-1.1, mbs * (seq + 1), replacement=True, generator=g) + 1
    tokens = tokens.view(mbs, seq + 1)
    return {"input_ids": tokens[:, :-1].to(device), "labels": tokens[:, 1:].to(device)}


def run_gristmill(args, spec: Spec, device: torch.device, profile_dir: Path | None = None) -> dict:
    cfg = model_config(args, spec)
    pcfg = ParallelConfig(activation_checkpoint=spec.ac, compile=spec.compile, param_dtype=args.dtype)
    with torch.device("meta"):
        model = Transformer(cfg)
    if spec.float8:  # before compile, as torchtitan does
        to_float8(model)
    model = parallelize(model, None, pcfg, compile_mode=spec.compile_mode or None)
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights()
    # The trainer's defaults: AdamW (0.9, 0.95), wd 0.1, fused on CUDA, clip 1.0 (or 8-bit AdamW).
    optim = OptimSection(name=spec.optim)
    opt = build_optimizer(model, optim, device.type)
    sched = ScheduledLR(opt, lambda step: optim.lr)  # a constant LR: the schedule costs the same
    amp = functools.partial(autocast_context, pcfg, None, device.type)
    batches = [
        synthetic_batch(cfg, spec.micro_batch, args.seq, device, i, spec.document_mask)
        for i in range(args.accum)
    ]

    attention = attention_backend(spec.attention)

    def step(data=batches):  # the trainer's own optimizer step: accumulate, clip, AdamW, schedule
        with attention():
            return train_step(model, opt, sched, data, grad_clip=optim.grad_clip, amp=amp)

    r = measure(
        spec.label(),
        step,
        args,
        cfg,
        spec.micro_batch * args.seq * args.accum,
        device,
        {"params": num_params(model), "loss": None, "float8": spec.float8},
    )
    r["loss"] = float(step()["loss"])
    if args.loss_steps:  # the same Zipf batches for every configuration: comparable losses
        losses = []
        for i in range(args.loss_steps):
            data = [
                zipf_batch(cfg, spec.micro_batch, args.seq, device, i * args.accum + j)
                for j in range(args.accum)
            ]
            losses.append(float(step(data)["loss"]))
        r["loss_after"] = {"steps": args.loss_steps, "mean_of_last_10": sum(losses[-10:]) / len(losses[-10:])}
    if profile_dir is not None:
        r["profile"] = profile(step, device, profile_dir)
    return r


def run_peer(args, mbs: int, device: torch.device, compiled: bool) -> dict:
    """transformers' LlamaForCausalLM, SDPA, bf16 autocast over fp32 weights, fused AdamW."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.checkpoint.hf_export import hf_config

    cfg = model_config(args)
    hf = hf_config(cfg, separator_id=0, dtype=torch.float32)
    hf["use_cache"] = False
    config = LlamaConfig(**hf)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.train()
    fwd = torch.compile(model) if compiled else model
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused or None
    )
    amp_dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    batches = [synthetic_batch(cfg, mbs, args.seq, device, i, False) for i in range(args.accum)]

    def step():
        opt.zero_grad(set_to_none=True)
        for b in batches:
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                # HF shifts labels itself: labels = input_ids is the same next-token task.
                loss = fwd(input_ids=b["input_ids"], labels=b["input_ids"]).loss
            (loss / len(batches)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        return loss

    name = f"peer: HF LlamaForCausalLM {'compiled' if compiled else 'eager'}, SDPA, mbs {mbs}, full logits"
    return measure(
        name,
        step,
        args,
        cfg,
        mbs * args.seq * args.accum,
        device,
        {"params": sum(p.numel() for p in model.parameters())},
    )


def profile(step, device: torch.device, out_dir: Path) -> list[dict]:
    """Top kernels by self device time over 2 steps; writes a Chrome trace to out_dir."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    out_dir.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        for _ in range(2):
            step()
        sync(device)
    prof.export_chrome_trace(str(out_dir / "trace.json.gz"))  # gzip: traces get large
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0]
    if device.type == "cuda":  # kernels only, not the CPU-side aten ops that launched them
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(getattr(e, attr) for e in events)
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    rows = [
        {
            "kernel": e.key[:90],
            "ms_per_step": getattr(e, attr) / 1e3 / 2,
            "share": getattr(e, attr) / total,
            "calls_per_step": e.count / 2,
        }
        for e in events[:25]
    ]
    (out_dir / "top_kernels.json").write_text(json.dumps(rows, indent=2))
    print(f"\nprofile (2 steps; trace in {out_dir}/trace.json.gz): top kernels by self device time")
    for row in rows[:15]:
        print(
            f"  {row['ms_per_step']:8.2f} ms/step {100 * row['share']:5.1f}%  x{row['calls_per_step']:<5.0f} "
            f"{row['kernel']}"
        )
    return rows


# -------------------------------------------------------------------------------------------- main


def guarded(fn, label: str, peak: float | None) -> dict:
    """Run one configuration; OOM (or a compile failure) is reported, never fatal for the sweep."""
    try:
        r = fn()
    except torch.OutOfMemoryError:
        r = {"config": label, "oom": True}
    except Exception as e:  # noqa: BLE001 - a benchmark reports a broken configuration and goes on
        r = {"config": label, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    finally:
        gc.collect()
        torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if peak and "tflops" in r and not r.get("float8"):  # float8 is never in the bf16 MFU figure
        r["mfu"] = r["tflops"] * 1e12 / peak
    print("  done:", json.dumps({k: v for k, v in r.items() if k != "profile"}), flush=True)
    return r


def table(results: list[dict]) -> None:
    header = f"{'configuration':70} {'tok/s':>9} {'step ms':>8} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        if "tflops" not in r:
            print(f"{r['config']:70} {'OOM' if r.get('oom') else 'ERROR ' + r.get('error', '')[:60]}")
            continue
        mfu = f"{100 * r['mfu']:5.1f}%" if "mfu" in r else f"{'n/a':>6}"
        mem = f"{r['peak_mem_gib']:8.1f}" if "peak_mem_gib" in r else f"{'n/a':>8}"
        print(f"{r['config']:70} {r['tokens_per_s']:9.0f} {r['step_ms']:8.1f} {r['tflops']:8.1f} {mfu} {mem}")
    trained = [r for r in results if "loss_after" in r]
    if trained:
        steps = trained[0]["loss_after"]["steps"]
        print(f"\n{'configuration':70} {'tok/s':>9} {'peak GiB':>8} {'rsvd GiB':>8} {f'loss@{steps}':>10}")
        for r in trained:
            peak_gib = f"{r['peak_mem_gib']:8.1f}" if "peak_mem_gib" in r else f"{'n/a':>8}"
            rsvd = f"{r['reserved_gib']:8.1f}" if "reserved_gib" in r else f"{'n/a':>8}"
            loss = r["loss_after"]["mean_of_last_10"]
            print(f"{r['config']:70} {r['tokens_per_s']:9.0f} {peak_gib} {rsvd} {loss:10.4f}")


def sweep_specs(args, head: Spec) -> list[Spec]:
    specs = []
    for pair in args.sweep:
        ac, _, mbs = pair.partition(":")
        if ac not in ("none", "selective", "full") or not mbs.isdigit():
            raise SystemExit(f"bad --sweep entry {pair!r}: expected AC:MICRO_BATCH, e.g. selective:16")
        specs.append(replace(head, ac=ac, micro_batch=int(mbs)))
    specs += (
        []
        if args.no_extras
        else [
            replace(head, compile=False),  # what compile buys
            replace(head, loss_chunk=0),  # what the chunked, fused loss buys
            replace(head, document_mask=True),  # FlexAttention document masking, costed separately
        ]
    )
    seen, out = {head}, []
    for s in specs:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-1b", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="compute dtype (default bfloat16 on GPU, float32 on CPU)",
    )
    ap.add_argument(
        "--micro-batch", type=int, default=None, help="headline micro-batch (default 16 GPU, 2 CPU)"
    )
    ap.add_argument(
        "--accum", type=int, default=None, help="micro-batches per optimizer step (default 4 GPU, 1 CPU)"
    )
    ap.add_argument("--ac", default="none", choices=("none", "selective", "full"), help="headline AC mode")
    ap.add_argument("--loss-chunk", type=int, default=8192, help="headline loss chunk (0: full logits)")
    ap.add_argument("--no-compile", action="store_true", help="headline without per-block compile")
    ap.add_argument("--peer-compile", action="store_true", help="also time the peer under torch.compile")
    ap.add_argument(
        "--peer-micro-batch", type=int, help="the peer's first micro-batch to try (default: headline)"
    )
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers peer")
    ap.add_argument("--quick", action="store_true", help="headline only, no sweep")
    ap.add_argument(
        "--sweep",
        nargs="*",
        default=["none:4", "none:16", "selective:8", "selective:16", "full:16", "full:32"],
        help="AC:MICRO_BATCH pairs of the sweep (the memory table)",
    )
    ap.add_argument(
        "--no-extras", action="store_true", help="sweep without the eager/full-logits/doc-mask rows"
    )
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3 GPU / 1 CPU)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed window (default 4 GPU / 2 CPU)")
    ap.add_argument("--repeats", type=int, default=3, help="timed windows (median reported)")
    ap.add_argument(
        "--attention",
        default="default",
        choices=("default", "cudnn", "flash", "efficient", "math", "fa3", "flex", "flex-flash"),
        help="SDPA backend of the gristmill rows (default: torch's choice); flex and flex-flash: the "
        "document mask through FlexAttention (Triton, or FlashAttention 4's BACKEND FLASH)",
    )
    ap.add_argument(
        "--compile-mode", default="", help="torch.compile mode of the blocks, e.g. max-autotune-no-cudagraphs"
    )
    ap.add_argument("--float8", action="store_true", help="torchao float8 linears (CUDA; reported apart)")
    ap.add_argument(
        "--optim",
        nargs="+",
        default=["adamw"],
        choices=("adamw", "adamw8bit"),
        help="optimizer(s) of the headline; several: one row each",
    )
    ap.add_argument(
        "--loss-steps", type=int, default=0, help="then train N steps on Zipf tokens and report the loss"
    )
    ap.add_argument("--profile", type=Path, help="profile the headline gristmill step; trace written here")
    ap.add_argument("--json", type=Path, help="also write all results here")
    args = ap.parse_args(argv)
    refusal = needs_cuda(args)
    if refusal is None and args.device == "cuda" and not torch.cuda.is_available():
        refusal = "--device cuda needs CUDA (torch sees no GPU)"
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    args.dtype = args.dtype or ("float32" if cpu else "bfloat16")
    args.micro_batch = args.micro_batch or (2 if cpu else 16)
    args.accum = args.accum or (1 if cpu else 4)
    args.warmup = args.warmup if args.warmup is not None else (1 if cpu else 3)
    args.steps = args.steps if args.steps is not None else (2 if cpu else 4)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_flops(name) if (device.type == "cuda" and args.dtype == "bfloat16") else None
    print(
        f"device {name}; torch {torch.__version__}; preset {args.preset}; seq {args.seq}; {args.dtype}; "
        f"accum {args.accum}; " + (f"peak {peak / 1e12:.0f} TFLOP/s dense bf16" if peak else "MFU omitted")
    )
    head = Spec(
        compile=not args.no_compile,
        ac=args.ac,
        micro_batch=args.micro_batch,
        loss_chunk=args.loss_chunk,
        attention=args.attention,
        document_mask=args.attention.startswith("flex"),
        compile_mode=args.compile_mode,
        float8=args.float8,
        optim=args.optim[0],
    )

    results: list[dict] = []
    peer, peer_mbs = None, head.micro_batch
    if not args.no_peer:
        # The peer materialises [mbs, T, V] float32 logits: each variant halves its micro-batch from
        # --peer-micro-batch until it fits; the faster variant is the baseline.
        for compiled in (False, True) if args.peer_compile else (False,):
            m = args.peer_micro_batch or head.micro_batch
            while m >= 1:
                label = f"peer {'compiled' if compiled else 'eager'}, mbs {m}"
                r = guarded(lambda m=m, c=compiled: run_peer(args, m, device, c), label, peak)
                results.append(r)
                if not r.get("oom"):
                    break
                m //= 2
            if "tflops" in r and (peer is None or r["tokens_per_s"] > peer["tokens_per_s"]):
                peer, peer_mbs = r, m
    ours = guarded(lambda: run_gristmill(args, head, device, args.profile), head.label(), peak)
    results.append(ours)
    for name in args.optim[1:]:  # the same configuration with another optimizer, one row each
        spec = replace(head, optim=name)
        results.append(guarded(lambda s=spec: run_gristmill(args, s, device), spec.label(), peak))
    if peer is not None and "tflops" in peer and "tflops" in ours:
        same = ours
        if peer_mbs != head.micro_batch:  # also at the peer's micro-batch: identical shapes
            spec = replace(head, micro_batch=peer_mbs)
            same = guarded(lambda: run_gristmill(args, spec, device), spec.label(), peak)
            results.append(same)
        pairs = [("same micro-batch", same)] + (
            [("each at its own micro-batch", ours)] if same is not ours else []
        )
        for label, r in pairs:
            if "tflops" in r:
                r["vs_peer"] = r["tokens_per_s"] / peer["tokens_per_s"]
                mfu = f"; MFU {100 * r['mfu']:.1f}% vs {100 * peer['mfu']:.1f}%" if peak else ""
                ratio = f"{r['vs_peer']:.2f}x tokens/s{mfu}"
                print(f"\nheadline ({label}): {r['config']} / {peer['config']} = {ratio}")
    if not args.quick:
        for spec in sweep_specs(args, head):
            if any(r["config"] == spec.label() for r in results):
                continue
            results.append(guarded(lambda s=spec: run_gristmill(args, s, device), spec.label(), peak))
    table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
