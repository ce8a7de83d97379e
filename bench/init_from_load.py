"""Loading a base model through `[model] init_from` at the size people use: time and peak host memory.

    python -m bench.init_from_load                         # Llama-3.2-1B's shape, bf16, written to a temp dir
    python -m bench.init_from_load --shape small           # a 0.2B shape, for a quick look
    python -m bench.init_from_load --dir /models/Llama-3.2-1B   # an existing base directory (kept)

Writes a random-init `LlamaForCausalLM` with transformers (bf16 safetensors, sharded at 1 GB; the
1B is ~2.5 GB: check the disk) unless --dir is given, then measures gristmill's loading path, each
time in fresh processes so that every peak is that run's own:

1. one process, as the trainer builds the model on a CPU (run.init_device "full"): the whole fp32
   model (random init), then `load_base_weights` copies every tensor into it;
2. `torchrun --nproc_per_node=2`, gloo, FSDP2 over 2 ranks, the meta-device path the trainer takes
   on GPUs (run.init_device "meta"): each rank materialises only its shard, then copies only its
   own rows of each tensor from the memory-mapped files.

Per process: RSS after start-up, after the model is built (random init), the peak during the load
(VmHWM, reset just before it through /proc/self/clear_refs) and the load's wall time; against one
full fp32 copy of the model (4 bytes × parameters). The files' pages are dropped from the page
cache before each measurement (posix_fadvise DONTNEED, these files only), so the load reads the disk;
--warm keeps them. Loading never needs more than the model being loaded plus the pages of the
tensor being copied: the memory map is read in place (bf16 → fp32 as it is copied), no rank
holds the full model or a second copy. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    # Llama-3.2-1B's config.json (random weights): 1,235,814,400 parameters, tied embeddings.
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
               tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}),
    "small": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32768, max_position_embeddings=4096,
                  tie_word_embeddings=False),
}  # fmt: skip


def write_base(out: Path, shape: str) -> None:
    """A random-init LlamaForCausalLM in bf16 (created in bf16: half the memory), sharded at 1 GB."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**SHAPES[shape])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size="1GB")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _drop_page_cache(base: Path) -> None:
    for f in base.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages (a file just written) are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def child(base: Path, warm: bool) -> None:
    """One process of a measurement (a torchrun worker under --nproc 2): prints a JSON line."""
    import torch
    import torch.distributed as dist

    from training.checkpoint.hf_import import base_model_fields, load_base_weights
    from training.config import TrainConfig
    from training.model import ModelConfig, num_params
    from training.parallelize import build_mesh
    from training.run.preflight import DistEnv
    from training.run.setup import build_model

    env = DistEnv.from_environ()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.world_size))
    if env.world_size > 1:
        dist.init_process_group("gloo")
    started = _status("VmRSS")
    cfg = TrainConfig()
    mode = "meta" if env.world_size > 1 else "full"  # the trainer's GPU path under FSDP; its CPU path alone
    cfg = dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, init_device=mode, device="cpu"),
        parallel=dataclasses.replace(cfg.parallel, shard=env.world_size, param_dtype="float32"),
    )
    mcfg = ModelConfig(**base_model_fields(base))
    t0 = time.perf_counter()
    model = build_model(mcfg, cfg, build_mesh(cfg.parallel, env.world_size, "cpu"), torch.device("cpu"))
    built_s = time.perf_counter() - t0
    built = _status("VmRSS")
    if not warm and env.local_rank == 0:
        _drop_page_cache(base)
    if env.world_size > 1:
        dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on is the load's
    t0 = time.perf_counter()
    load_base_weights(model, base)
    load_s = time.perf_counter() - t0
    peak = _status("VmHWM")
    row = {
        "rank": env.rank,
        "world_size": env.world_size,
        "init_device": mode,
        "params": num_params(model) if env.world_size == 1 else None,
        "fp32_bytes": 4 * sum(p.numel() for p in model.parameters()) if env.world_size == 1 else None,
        "rss_start": started,
        "rss_built": built,
        "rss_peak_load": peak,
        "build_s": built_s,
        "load_s": load_s,
    }
    print("RESULT " + json.dumps(row), flush=True)
    if env.world_size > 1:
        dist.destroy_process_group()


def _run(cmd: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"measurement failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda r: r["rank"])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--dir", type=Path, help="an existing base directory (not written, not deleted)")
    parser.add_argument("--warm", action="store_true", help="keep the files in the page cache")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        return child(args.child, args.warm)

    tmp = None
    base = args.dir
    if base is None:
        tmp = Path(tempfile.mkdtemp(prefix="init-from-bench-"))
        base = tmp / "base"
        t0 = time.perf_counter()
        write_base(base, args.shape)
        print(f"wrote a random-init {args.shape} LlamaForCausalLM in {time.perf_counter() - t0:.0f} s")
    size = sum(f.stat().st_size for f in base.glob("*.safetensors"))
    me = [
        sys.executable,
        "-m",
        "bench.init_from_load",
        "--child",
        str(base),
        *(["--warm"] if args.warm else []),
    ]
    try:
        one = _run(me)[0]
        two = _run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *me[1:]]
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    fp32 = one["fp32_bytes"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {gib(ram)} RAM; "
          f"{'warm' if args.warm else 'cold'} page cache; {base}: {gib(size)} of safetensors")  # fmt: skip
    print(f"model: {one['params']:,} parameters; one full fp32 copy = {gib(fp32)}")
    print("| processes | init_device | rank | RSS at start | + model built | + the load's own peak | "
          "load s | (peak − start) / fp32 copy |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in [one, *two]:
        start, built, peak = r["rss_start"], r["rss_built"], r["rss_peak_load"]
        where = f"| {r['world_size']} | {r['init_device']} | {r['rank']} "
        print(f"{where}| {gib(start)} | {gib(built - start)} | {gib(peak - built)} | {r['load_s']:.1f} | "
              f"{(peak - start) / fp32:.2f}× |")  # fmt: skip


if __name__ == "__main__":
    main()
