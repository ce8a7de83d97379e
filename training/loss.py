"""Cross-entropy of the LM head: plain, and chunked so the [tokens, vocab] logits never exist at once.

Both take the final hidden states h [N, d], the LM-head weight W [V, d] and shifted labels [N]
(IGNORE_INDEX = -100 skipped) and return sum(CE over kept tokens) / max(#kept, 1) as a float32
scalar. Logits are formed by a matmul in the compute dtype (bf16 under FSDP mixed precision or
autocast, like the plain `nn.Linear` head) and upcast to float32 before the softmax, in both paths.

Why a custom autograd function for the chunked path. Chunking only the forward does not save
memory: autograd would keep every chunk's logits (or softmax) alive for backward, which is the
full [N, V] tensor again. Wrapping each chunk in torch.utils.checkpoint would free them, but would
recompute the LM-head matmul in backward (about +7% of the step FLOPs for the 1B preset, whose
131k-token head is a fifth of the parameters). Instead, because the loss is a scalar and the last
op of the graph, the gradient of each chunk can be finished in the forward: dlogits = (softmax -
onehot) / n_kept, dh_chunk = dlogits @ W, dW += dlogits^T @ h_chunk; the chunk's logits are then
dropped. Backward only scales the stored dh [N, d] and dW [V, d] (float32 accumulator) by the
incoming gradient. Peak extra memory is one chunk's [chunk, V] float32 logits plus dh and dW; the
FLOPs are exactly those of the plain path. When no input needs a gradient (evaluation under
no_grad) the gradient work is skipped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100

__all__ = ["IGNORE_INDEX", "chunked_linear_cross_entropy", "linear_cross_entropy"]


def _compute_dtype_inputs(h: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast h and W to the dtype the plain `nn.Linear` head would compute in (autocast's, if on)."""
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = weight.dtype
    return h.to(dtype), weight.to(dtype)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Reference path: full logits [N, V], float32 cross-entropy."""
    logits = F.linear(h, weight).float()
    n_kept = (labels != IGNORE_INDEX).sum().clamp(min=1)
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum") / n_kept


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk, grad_enabled):
        N = h.shape[0]
        kept = labels != IGNORE_INDEX
        n_kept = kept.sum().clamp(min=1).to(torch.float32)
        safe_labels = labels.clamp(min=0)  # ignored rows gather a dummy target, masked out below
        # needs_input_grad is also True under no_grad, hence the explicit grad_enabled flag.
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            hc, yc, kc = h[s:e], safe_labels[s:e], kept[s:e]
            logits = (hc @ weight.t()).float()  # [c, V]
            lse = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, yc[:, None]).squeeze(1)
            total += torch.where(kc, lse - target, 0.0).sum()
            if need_h or need_w:
                # d(sum CE)/dlogits = softmax - onehot; scaled by 1/n_kept, zero on ignored rows.
                g = logits.sub_(lse[:, None]).exp_()  # softmax, in place: no second [c, V] float32
                g.scatter_add_(1, yc[:, None], torch.full_like(target[:, None], -1.0))
                g.mul_((kc.to(torch.float32) / n_kept)[:, None])
                g = g.to(h.dtype)
                if need_h:
                    grad_h[s:e] = g @ weight
                if need_w:
                    if g.dtype == torch.float32:
                        grad_w.addmm_(g.t(), hc)
                    else:
                        grad_w += g.t() @ hc  # chunk product in the compute dtype, summed in float32
            del logits
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)
        return total / n_kept

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * grad_out).to(ctx.weight_dtype) if grad_w is not None else None
        return gh, gw, None, None, None


def chunked_linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int
) -> torch.Tensor:
    """Same value and gradients as `linear_cross_entropy`, `chunk` tokens of logits at a time."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    grad_enabled = torch.is_grad_enabled()
    h, weight = _compute_dtype_inputs(h, weight)
    with torch.autocast(device_type=h.device.type, enabled=False):
        return _ChunkedLinearCrossEntropy.apply(h, weight, labels, chunk, grad_enabled)
