"""Optimizer, learning-rate schedule and gradient clipping (DTensor/FSDP2-aware).

AdamW with β = (0.9, 0.95) and weight decay 0.1 on matrices only (norm weights and biases never
decay; embeddings optionally), fused; the learning rate of each step from the data plan's LR pieces
(its checkpointed state is the step alone); optional 8-bit AdamW through bitsandbytes on CUDA, or
Muon for the transformer blocks' matrices with AdamW for the rest (training.muon).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from training.contract.errors import GristmillError
from training.muon import MuonAdamW, transformer_block_matrices

if TYPE_CHECKING:
    from training.config import OptimSection


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = True) -> list[dict]:
    """Two AdamW groups: decayed matrices, and undecayed norms/biases (ndim < 2) [+ embeddings].

    Embedding tables are found by module type (nn.Embedding), so a tied LM head, which is the same
    Parameter, follows the embedding's setting. Works on FSDP2-sharded models (DTensor keeps ndim).
    """
    embedding_ids = set()
    if not decay_embeddings:
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                embedding_ids.add(id(module.weight))
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() yields each shared Parameter once
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in embedding_ids else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def muon_param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = True) -> list[dict]:
    """AdamW's decay groups (`param_groups`), each split into its transformer-block matrices
    (`"muon": True`) and the rest (`"muon": False`): the blocks' matrices keep AdamW's decay."""
    matrices = transformer_block_matrices(model)
    groups = []
    for g in param_groups(model, weight_decay, decay_embeddings):
        for muon in (True, False):
            params = [p for p in g["params"] if (id(p) in matrices) == muon]
            if params:
                groups.append({**g, "params": params, "muon": muon})
    return groups


def build_optimizer(
    model: nn.Module, cfg: OptimSection, device_type: str, sharded: bool = False
) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA unless cfg.fused says otherwise), bitsandbytes' 8-bit AdamW, or Muon + AdamW."""
    betas = (float(cfg.betas[0]), float(cfg.betas[1]))
    if cfg.name == "muon":
        return MuonAdamW(
            muon_param_groups(model, cfg.weight_decay, cfg.decay_embeddings), lr=cfg.lr, betas=betas,
            eps=cfg.eps, momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov, ns_steps=cfg.muon_ns_steps,
            adjust_lr=cfg.muon_adjust_lr,
        )  # fmt: skip
    groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
    if cfg.name == "adamw8bit":
        bnb = bitsandbytes_or_refuse(device_type, sharded)
        return bnb.optim.AdamW8bit(groups, lr=cfg.lr, betas=betas, eps=cfg.eps)
    # Fused by default on every device (CUDA, and CPU since torch 2.4): it is the fastest, and it
    # takes the non-finite flag on the device (training.run.verdict). fused and foreach are mutually
    # exclusive; foreach (None → torch picks) otherwise.
    fused = cfg.fused is not False
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, fused=fused or None)


# The state each optimizer keeps per parameter (a checkpoint's keys end with it): Muon's momentum,
# bitsandbytes' 8-bit moments, AdamW's moments. Muon keeps AdamW's for the parameters it does not
# orthogonalise, so it is looked for first.
_STATE_OF = (("muon", ".momentum_buffer"), ("adamw8bit", ".state1"), ("adamw", ".exp_avg"))


def optimizer_name(optimizer: torch.optim.Optimizer) -> str:
    """The optim.name that built `optimizer`."""
    if isinstance(optimizer, MuonAdamW):
        return "muon"
    return "adamw8bit" if type(optimizer).__name__ == "AdamW8bit" else "adamw"


def saved_optimizer(keys: set[str]) -> str | None:
    """The optim.name whose state a checkpoint's flattened keys hold, or None (no optimizer state)."""
    for name, suffix in _STATE_OF:
        if any(k.startswith("optimizer.") and k.endswith(suffix) for k in keys):
            return name
    return None


def bitsandbytes_or_refuse(device_type: str, sharded: bool):
    if device_type != "cuda":
        raise GristmillError(
            f"optim.name = 'adamw8bit' needs a CUDA GPU (bitsandbytes' 8-bit AdamW has no {device_type} "
            "kernels); use optim.name = 'adamw' on this machine"
        )
    if sharded:
        raise GristmillError(
            "optim.name = 'adamw8bit' does not support FSDP-sharded parameters (bitsandbytes works on plain "
            "tensors, FSDP2 parameters are DTensors); use optim.name = 'adamw' or a single process"
        )
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise GristmillError(
            "optim.name = 'adamw8bit' needs the bitsandbytes package (pip install bitsandbytes); "
            "or use optim.name = 'adamw'"
        ) from None
    return bnb


def plan_scheduler(optimizer: torch.optim.Optimizer, plan) -> ScheduledLR:
    """The LR of a run: its data plan's pieces (training/data/plan.Plan.lr), step by step. The last
    scheduler.step() looks one step past the plan: its last LR holds."""
    return ScheduledLR(optimizer, lambda step: plan.lr(min(step, plan.total_steps - 1)))


class ScheduledLR:
    """Sets every group's lr to `lr_at(step)` each step; its checkpointed state is the step alone.

    Not LambdaLR: its state_dict keeps base_lrs and the multiplier object's attributes (warmup,
    total, min ratio), so a resume with a changed optim.lr or [schedule] went on training at the
    checkpoint's rates while RUN/config.toml said otherwise. Here the LR is a function of the config
    and the step only: a run passes its plan's LR (`plan_scheduler`); whether a phase's past LR
    changed is the plan's resume check (data_plan.check_resume), not this object's.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_at):
        self.optimizer, self.lr_at = optimizer, lr_at
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        self._last_lr = [self.lr_at(self.last_step)] * len(self.optimizer.param_groups)
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr  # a Python float: fused AdamW takes it as is

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict[str, int]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.last_step = int(state["last_step"])
        self._apply()


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Total L2 norm of all gradients (before clipping), clipping them to max_norm when > 0.

    With FSDP2 the gradients are DTensors and their norm is a partial DTensor; `full_tensor()`
    reduces it over the sharded mesh dimensions (torchtitan's recipe), so every rank clips by the
    same global norm.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total, foreach=True)
    return total
