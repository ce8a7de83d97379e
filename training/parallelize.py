"""Apply activation checkpointing, torch.compile and FSDP2 / HSDP to a `Transformer`.

Order (as torchtitan v0.2 does for Llama 3): activation checkpointing per block, then per-block
torch.compile, then FSDP2 `fully_shard` per block and on the root.

What the trainer must know
--------------------------
* Mixed precision. With a mesh (world_size > 1) FSDP2's `MixedPrecisionPolicy(param_dtype,
  reduce_dtype)` does it: the sharded parameters stay float32 (the optimizer's master weights),
  each block all-gathers them cast to `param_dtype`, computes in it, and reduce-scatters gradients
  in `reduce_dtype` into float32 sharded gradients. Do NOT wrap the step in autocast then.
  Without a mesh (one process) there is no FSDP, so `parallelize` leaves the parameters float32
  and the trainer runs forward+loss under `torch.autocast(device_type, dtype=torch.bfloat16)` when
  `param_dtype == "bfloat16"`. `autocast_context(cfg, mesh, device_type)` returns exactly the
  right context for both cases. Enter it anew for every micro-batch, around the forward (and
  loss) only: autocast caches the bf16 copies of the weights until its outermost context exits, so
  a context spanning `optimizer.step()` keeps computing with the pre-step weights (silently wrong
  training; tests/helpers/dist_parallelize_check.py hit exactly this).
* Parameter names are unchanged: AC and compile replace a block's `forward` instead of wrapping
  the block in a CheckpointWrapper / OptimizedModule, so `model.state_dict()` keys stay
  `layers.N.attention.wq.weight` … with or without them (no `_checkpoint_wrapped_module` or
  `_orig_mod` in checkpoints or the HF export).
* Gradient accumulation under FSDP: the trainer reduce-scatters after every micro-batch, so the
  gradients stay sharded. `model.set_requires_gradient_sync(False)` on all but the last micro-batch
  (FSDP2 API) would save those reduce-scatters but hold unsharded gradients across the micro-batches
  (5 GB more per rank for the 1.24B shape in fp32); not done until measured on a GPU. The result is
  the same either way (tests/helpers/dist_parallelize_check.py).
* Loss normalisation: each rank's loss is the mean over its local tokens and FSDP averages the
  gradients over ranks, so the step equals the single-process step on the global batch whenever
  every rank has the same number of non-ignored label tokens (always true for packed sequences
  without ignored labels).
* Meta-device init: build the model under `torch.device("meta")`, call `parallelize`, then
  `model.to_empty(device=...)` and `model.init_weights()`.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from training.config import ParallelConfig
from training.config_checks import check_parallel_section, mesh_shape
from training.contract.errors import GristmillError
from training.model import Transformer

try:  # torch >= 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = [
    "autocast_context",
    "build_mesh",
    "convert_to_float8",
    "float8_or_refuse",
    "parallelize",
]

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build_mesh(cfg: ParallelConfig, world_size: int, device_type: str) -> DeviceMesh | None:
    """The 2-D ("replicate", "shard") device mesh, or None for a single process.

    Must be called on every rank after the process group exists (torchrun + init_process_group,
    or init_device_mesh initialises it from the torchrun environment).
    """
    shape = mesh_shape(cfg, world_size)
    if shape is None:
        return None
    return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))


def autocast_context(cfg: ParallelConfig, mesh: DeviceMesh | None, device_type: str):
    """The context for forward + loss: bf16 autocast on a single process, nothing under FSDP.

    Use a fresh one per micro-batch around the forward only (never around the optimizer step).
    """
    if mesh is None and cfg.param_dtype == "bfloat16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def parallelize(
    model: Transformer, mesh: DeviceMesh | None, cfg: ParallelConfig, compile_mode: str | None = None
) -> Transformer:
    """Float8 linears (model.float8), then AC, then per-block compile (Inductor's `compile_mode`,
    None: its default), then FSDP2 (blocks, then root). Returns the same model object.

    mesh None: AC and compile only; mixed precision is then the trainer's autocast (see
    `autocast_context`). Works on meta-device models (FSDP shards meta parameters; materialise with
    `to_empty` + `init_weights` afterwards).
    """
    check_parallel_section(cfg)  # a ParallelConfig built in code has not been through check_config
    if model.cfg.float8:  # before AC, compile and FSDP, as torchtitan converts
        convert_to_float8(model, sharded=mesh is not None)
    if cfg.activation_checkpoint != "none":
        for block in model.layers.values():
            _apply_ac(block, cfg.activation_checkpoint)
    if cfg.compile:
        for block in model.layers.values():
            # fullgraph: a graph break inside a block would silently cost most of the speed-up.
            block.forward = torch.compile(block.forward, fullgraph=True, mode=compile_mode)
    if mesh is not None:
        _apply_fsdp(model, mesh, cfg)
    return model


# --------------------------------------------------------------------------------------------------
# Float8 (compute only)

# torchao's float8 matmuls use the float8 tensor cores of Ada/Hopper and later.
FLOAT8_MIN_CAPABILITY = (8, 9)


def float8_or_refuse(device: torch.device) -> None:
    """model.float8 needs a CUDA GPU with float8 tensor cores and torchao: one line otherwise,
    before the run allocates anything."""
    if device.type != "cuda":
        raise GristmillError(
            f"model.float8 = true needs a CUDA GPU with float8 tensor cores (sm89+: Ada, Hopper, "
            f"Blackwell); this run is on {device.type}: set model.float8 = false"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_MIN_CAPABILITY:
        raise GristmillError(
            f"model.float8 = true needs sm89+ (float8 tensor cores); {torch.cuda.get_device_name(device)} "
            f"is sm{capability[0]}{capability[1]}: set model.float8 = false"
        )
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        raise GristmillError(
            "model.float8 = true needs the torchao package (pip install torchao); or set model.float8 = false"
        )


def _float8_linear(module: nn.Module, fqn: str) -> bool:
    """The blocks' linears whose dimensions float8 GEMMs take (multiples of 16); not the LM head."""
    return (
        isinstance(module, nn.Linear)
        and fqn.startswith("layers.")
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def convert_to_float8(model: Transformer, sharded: bool) -> None:
    """Swap the blocks' nn.Linear for torchao's Float8Linear (dynamic tensorwise scaling). The
    parameters keep their names and dtype (float8 casts happen inside each matmul), so checkpoints,
    exports and the optimizer see the usual weights. Under FSDP2 the weights are all-gathered in
    float8 (half the bf16 traffic); their scales are then computed per gather, not precomputed
    once per step (torchao's precompute_float8_dynamic_scale_for_fsdp: an optimisation not taken)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=sharded)
    convert_to_float8_training(model, config=config, module_filter_fn=_float8_linear)


# --------------------------------------------------------------------------------------------------
# Activation checkpointing


def _save_ops() -> set:
    ops = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ):
        if hasattr(torch.ops.aten, name):
            ops.add(getattr(torch.ops.aten, name).default)
    flex = getattr(torch.ops.higher_order, "flex_attention", None)
    if flex is not None:
        ops.add(flex)
    return ops


_SAVE_OPS = _save_ops()


def _sac_policy(ctx, op, *args, **kwargs):
    """Keep matmul and attention outputs (expensive to recompute), recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _apply_ac(block: nn.Module, mode: str) -> None:
    inner = block.forward
    kwargs: dict = {"use_reentrant": False, "preserve_rng_state": False}  # the blocks use no RNG
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _sac_policy)

    def forward(*args):
        return checkpoint(inner, *args, **kwargs)

    block.forward = forward


# --------------------------------------------------------------------------------------------------
# FSDP2 / HSDP


def _apply_fsdp(model: Transformer, mesh: DeviceMesh, cfg: ParallelConfig) -> None:
    """fully_shard each block, then the root (embedding, final norm, LM head, tied or not).

    A 2-D mesh with replicate > 1 gives HSDP (shard within a group, all-reduce across groups);
    with replicate == 1 the 1-D "shard" sub-mesh is used so plain FSDP issues no no-op all-reduce.
    """
    if mesh.ndim == 2 and mesh.mesh_dim_names == ("replicate", "shard") and mesh.size(0) == 1:
        mesh = mesh["shard"]
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.param_dtype], reduce_dtype=_DTYPES[cfg.reduce_dtype])
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again right at the start of backward: keep them.
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
