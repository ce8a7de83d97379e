"""Muon for the transformer blocks' matrices, AdamW for everything else, in one optimizer.

One `torch.optim.Optimizer` (not two) so that the checkpoint (training.checkpoint.state.OptimizerState,
`get_optimizer_state_dict`: state keyed by parameter name), the LR schedule (every group's lr) and the
non-finite guard see one object. Each param group says which update it takes (`"muon": True/False`):

- Muon groups (2-D weights inside `TransformerBlock`s): B ← μB + (1-μ)g; U = (1-μ)g + μB (Nesterov)
  or B; O = NS₅(U) (Newton–Schulz in bfloat16, torch.optim.Muon's coefficients and code);
  θ ← θ(1 - lr·wd); θ ← θ - lr·s·O with s = 0.2·√max(A, B) ("match_rms_adamw", the default) or
  √max(1, A/B) ("original"). The same update as `torch.optim.Muon`, which tests compare against.
- AdamW groups (embeddings, the LM head, norms, biases): torch's AdamW formula, decoupled decay.

Under FSDP2 the parameters, gradients and momentum buffers are DTensor shards (Shard(0) of the
rows). Everything elementwise runs on the local shard; only Newton–Schulz needs the whole matrix:
each rank all-gathers the (bfloat16) Nesterov update of a matrix, orthogonalises it — the same
computation on every rank, so every rank gets the same O — and keeps the rows of its own shard
(`distribute_tensor(..., src_data_rank=None)`: a local slice, no communication). Gathering in
bfloat16 is exact: Newton–Schulz casts its input to bfloat16 first, so one process and N ranks
orthogonalise the same bits.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from training.model import TransformerBlock

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon
NS_EPS = 1e-7
ADJUST_LR = ("match_rms_adamw", "original")


def newton_schulz(update: torch.Tensor, steps: int, eps: float = NS_EPS) -> torch.Tensor:
    """≈ U·Vᵀ of update = U·S·Vᵀ (singular values pushed into ~[0.7, 1.2]), in bfloat16.

    The operations of torch.optim.Muon's `_zeropower_via_newtonschulz`, so the two agree bit for bit."""
    a, b, c = NS_COEFFICIENTS
    x = update.bfloat16()
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))  # spectral norm ≤ Frobenius norm ≤ 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def lr_scale(shape: torch.Size, adjust_lr: str) -> float:
    """The factor on the learning rate of a Muon matrix of `shape` (A rows × B columns)."""
    rows, cols = shape[0], shape[1]
    if adjust_lr == "match_rms_adamw":  # Moonlight: update RMS ≈ 0.2, AdamW's typical
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols))  # "original" (Keller Jordan)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (a view: in-place changes reach the DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def orthogonalised(param: torch.Tensor, update: torch.Tensor, steps: int) -> torch.Tensor:
    """Newton–Schulz of the whole matrix whose local shard is `update`, as this rank's shard."""
    if not isinstance(param, DTensor):
        return newton_schulz(update, steps)
    shard = DTensor.from_local(
        update.bfloat16(), param.device_mesh, param.placements, run_check=False, shape=param.shape,
        stride=param.stride(),
    )  # fmt: skip
    full = newton_schulz(shard.full_tensor(), steps)  # all-gather over the mesh, then every rank alike
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()


def transformer_block_matrices(model: nn.Module) -> set[int]:
    """ids of the 2-D weights inside TransformerBlocks (found by type: AC/compile wrappers keep them)."""
    return {
        id(p)
        for module in model.modules()
        if isinstance(module, TransformerBlock)
        for p in module.parameters()
        if p.ndim == 2 and p.requires_grad
    }


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked `muon=True`, AdamW on the others (see the module docstring).

    The host decides whether a step runs (training.run.verdict.guarded_step reads the non-finite flag
    for optimizers other than fused AdamW): this class takes no `found_inf`."""

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        momentum: float,
        nesterov: bool,
        ns_steps: int,
        adjust_lr: str,
    ):
        if adjust_lr not in ADJUST_LR:
            raise ValueError(f"adjust_lr must be one of {ADJUST_LR}, not {adjust_lr!r}")
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=0.0, muon=False, momentum=momentum,
            nesterov=nesterov, ns_steps=ns_steps, adjust_lr=adjust_lr,
        )  # fmt: skip
        super().__init__(groups, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                raise ValueError("Muon groups take 2-D parameters only")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            (self._muon if group["muon"] else self._adamw)(group, params)
        return loss

    def _muon(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            grad, buf = _local(p.grad), _local(state["momentum_buffer"])
            buf.lerp_(grad, 1 - mu)
            update = grad.lerp(buf, mu) if group["nesterov"] else buf
            ortho = orthogonalised(p, update, group["ns_steps"])
            local = _local(p)
            local.mul_(1 - lr * wd)
            local.add_(ortho, alpha=-lr * lr_scale(p.shape, group["adjust_lr"]))

    def _adamw(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = float(state["step"])  # a CPU tensor: no device sync
            grad, local = _local(p.grad), _local(p)
            m, v = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
            local.mul_(1 - lr * wd)
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
            local.addcdiv_(m, denom, value=-lr / (1 - beta1**step))
