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

Why the per-chunk softmax is compiled on CUDA. In eager mode the elementwise part of a chunk
(upcast, logsumexp, exp, subtract the one-hot, scale, downcast) is six passes over a [chunk, V]
float32 tensor; for the 1.24B preset (V = 131072) that is ~70 GB of memory traffic per 16k
tokens, about a tenth of the whole step on an H100. `_chunk_softmax_grad` is written so that
Inductor fuses it into one reduction (read the bf16 logits once for the log-sum-exp) and one
pointwise kernel (read them again, write the bf16 gradient): ~6 bytes per logit instead of ~40.
CPU keeps the eager version (compiling costs more than it saves at test sizes); both compute the
same function (tests/gpu compares them).
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


def _chunk_softmax_grad(
    logits: torch.Tensor, labels: torch.Tensor, kept: torch.Tensor, scale: torch.Tensor, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's elementwise work: (sum of CE over kept rows, d(that sum * scale)/dlogits or None).

    logits [c, V] in the compute dtype; labels [c] already clamped to >= 0; kept [c] bool; scale a
    float32 0-d tensor (1 / n_kept: a tensor, so a new value never recompiles). The gradient comes
    back in the logits' dtype, ready for the two matmuls. softmax - onehot is written with a
    column-index comparison rather than a scatter so that Inductor can fuse it (see the module doc).
    """
    lf = logits.float()
    lse = torch.logsumexp(lf, dim=-1)
    target = lf.gather(1, labels[:, None]).squeeze(1)
    loss = torch.where(kept, lse - target, 0.0).sum()
    if not need_grad:
        return loss, None
    onehot = torch.arange(lf.shape[1], device=lf.device)[None, :] == labels[:, None]
    g = torch.exp(lf - lse[:, None]) - onehot.to(torch.float32)
    g = g * (kept.to(torch.float32) * scale)[:, None]
    return loss, g.to(logits.dtype)


_compiled_chunk_fn = None


def _chunk_fn(device: torch.device):
    """`_chunk_softmax_grad`, compiled once per process on CUDA (see the module docstring)."""
    global _compiled_chunk_fn
    if device.type != "cuda":
        return _chunk_softmax_grad
    if _compiled_chunk_fn is None:
        _compiled_chunk_fn = torch.compile(_chunk_softmax_grad, dynamic=False)
    return _compiled_chunk_fn


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, labels, chunk, grad_enabled):
        N = h.shape[0]
        kept = labels != IGNORE_INDEX
        n_kept = kept.sum().clamp(min=1).to(torch.float32)
        scale = 1.0 / n_kept
        safe_labels = labels.clamp(min=0)  # ignored rows gather a dummy target, masked out below
        # needs_input_grad is also True under no_grad, hence the explicit grad_enabled flag.
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        fn = _chunk_fn(h.device)
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            hc = h[s:e]
            logits = hc @ weight.t()  # [c, V] in the compute dtype, like the plain head
            loss, g = fn(logits, safe_labels[s:e], kept[s:e], scale, need_h or need_w)
            del logits
            total += loss
            if g is None:
                continue
            if need_h:
                grad_h[s:e] = g @ weight
            if need_w:
                if g.dtype == torch.float32:
                    grad_w.addmm_(g.t(), hc)
                else:
                    grad_w += g.t() @ hc  # chunk product in the compute dtype, summed in float32
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
