"""Llama-3 decoder-only transformer (RMSNorm, RoPE, GQA, SwiGLU, no biases, optional tied embeddings).

The file knows nothing about parallelism: `training/parallelize.py` applies activation
checkpointing, torch.compile and FSDP2 to a `Transformer` from outside, per `TransformerBlock`.

Parameter names follow torchtitan (`tok_embeddings`, `layers.N.attention.wq`, `feed_forward.w1` …);
training/checkpoint/hf_export.py renames them to `transformers`' `LlamaForCausalLM`. RoPE uses HF's
rotate-half layout (the first and second halves of each head dimension form the rotated pairs), so
the q/k projections need no permutation on export: the export is a pure rename (plus dropping
`lm_head.weight` when the embeddings are tied, as HF does).

Positions. Without document masking every token of a packed sequence may attend to every earlier
token, including those of the previous documents, so the rotation must use the sequence position
0..T-1: restarting positions per document would make a token of document 2 see document-1 tokens
as if they were at or after its own position (torchtitan does the same). With document masking
attention never crosses a document boundary and RoPE only depends on the *difference* of two
positions, so both choices give the same attention scores mathematically; we use the loader's
restarting `position_ids` there because that is exactly what the model sees at inference (every
document starts at 0), and cos/sin of small angles are the most precise.

Building a large model without allocating it::

    with torch.device("meta"):
        model = Transformer(cfg)
    parallelize(model, mesh, pcfg)          # shards the meta parameters
    model.to_empty(device="cuda")
    model.init_weights()                     # always call after to_empty (before loading a checkpoint)

There are no buffers: RoPE's cos/sin are computed in each forward from `position_ids`, so nothing
is left uninitialised by `to_empty` and nothing model-shaped has to go into a checkpoint besides
the parameters.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.loss import IGNORE_INDEX, chunked_linear_cross_entropy, linear_cross_entropy

__all__ = [
    "AttentionMask",
    "IGNORE_INDEX",
    "PRESETS",
    "ModelConfig",
    "Transformer",
    "TransformerBlock",
    "apply_rotary",
    "build_block_mask",
    "document_causal_mask",
    "document_ids",
    "flops_per_token",
    "num_params",
    "rope_cos_sin",
    "rope_inv_freq",
]


@dataclass
class ModelConfig:
    """Shape and numerics of a Llama-3 style decoder."""

    dim: int
    """Hidden size (HF `hidden_size`)."""
    n_layers: int
    """Number of transformer blocks (HF `num_hidden_layers`)."""
    n_heads: int
    """Query heads (HF `num_attention_heads`); head_dim = dim // n_heads."""
    n_kv_heads: int
    """Key/value heads for grouped-query attention (HF `num_key_value_heads`); divides n_heads."""
    ffn_dim: int
    """SwiGLU inner size (HF `intermediate_size`)."""
    vocab_size: int
    """Embedding rows / logits; presets carry a placeholder where the dataset decides it."""
    rope_theta: float = 500000.0
    """RoPE base θ (HF `rope_theta`)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon (HF `rms_norm_eps`)."""
    tie_embeddings: bool = False
    """Share the token embedding with the LM head (HF `tie_word_embeddings`)."""
    max_seq_len: int = 2048
    """Longest sequence the model is meant for (HF `max_position_embeddings`); longer inputs raise."""
    init_std: float = 0.02
    """Std of the normal init; the output projections wo/w2 use init_std / sqrt(2 * n_layers)."""
    document_mask: bool = False
    """Attention restricted to the current document of a packed sequence (needs position_ids)."""
    loss_chunk: int = 0
    """0 = plain loss; >0 = chunked cross-entropy over this many tokens per chunk (never holds the
    full [tokens, vocab] logits)."""
    rope_type: str = "default"
    """RoPE frequencies: "default" (theta ** (-2i/head_dim)) or "llama3" (Llama 3.1's frequency
    scaling with the four rope_* fields below; HF `rope_scaling` / `rope_parameters`)."""
    rope_factor: float = 8.0
    """llama3 scaling: low frequencies are divided by this (HF `factor`)."""
    rope_low_freq_factor: float = 1.0
    """llama3 scaling: wavelengths above original_max_seq_len / this are fully scaled (HF
    `low_freq_factor`)."""
    rope_high_freq_factor: float = 4.0
    """llama3 scaling: wavelengths below original_max_seq_len / this are kept (HF `high_freq_factor`)."""
    rope_original_max_seq_len: int = 8192
    """llama3 scaling: the context length of the original pretraining (HF
    `original_max_position_embeddings`)."""
    init_from: str = ""
    """The Hugging Face base the weights were loaded from ([model] init_from; "" = random init): its
    resolved directory, or "org/name@<commit>" for a hub id. Recorded in each checkpoint's COMPLETE;
    a resume that does not read the base again takes it from there (the checks use init_from_sha256)."""
    init_from_sha256: str = ""
    """Identity of the base: sha256 over its config.json and its weights index (see
    training/checkpoint/hf_import.py); a resume with another base is refused."""
    float8: bool = False
    """Float8 matmuls for the blocks' linears (torchao; training/parallelize.py converts them, this
    module never reads it). Compute only: the weights stay as they are, so checkpoints and exports
    do not change."""

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim {self.dim // self.n_heads} must be even for RoPE")
        if self.loss_chunk < 0:
            raise ValueError(f"loss_chunk must be >= 0, got {self.loss_chunk}")
        if self.rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type must be default or llama3, got {self.rope_type!r}")
        # low = high: no wavelength between the two, as transformers computes it (review RV52a F5)
        if self.rope_type == "llama3" and not (
            self.rope_factor > 0 and 0 < self.rope_low_freq_factor <= self.rope_high_freq_factor
            and self.rope_original_max_seq_len > 0
        ):  # fmt: skip
            raise ValueError(
                "llama3 RoPE scaling needs rope_factor > 0, 0 < rope_low_freq_factor <= "
                f"rope_high_freq_factor and rope_original_max_seq_len > 0; got {self.rope_factor}, "
                f"{self.rope_low_freq_factor}, {self.rope_high_freq_factor}, {self.rope_original_max_seq_len}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed, e.g. `PRESETS["demo"].replace(vocab_size=8192)`."""
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    # CPU unit tests: a forward/backward takes milliseconds.
    "tiny": ModelConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=512,
        rope_theta=10000.0, max_seq_len=256,
    ),
    # CPU demo (`gristmill demo`): ~1-2M non-embedding parameters, trains in minutes on 2 cores.
    # vocab_size is a placeholder: the trainer replaces it with the dataset's vocab_size.
    "demo": ModelConfig(
        dim=160, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=448, vocab_size=32768,
        rope_theta=10000.0, max_seq_len=512, tie_embeddings=True,
    ),
    # The 1.24B Llama-3 shape of the reference blog run: exactly 1,241,581,568 parameters.
    "llama3-1b": ModelConfig(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=131072,
        rope_theta=500000.0, tie_embeddings=True, max_seq_len=2048,
    ),
    # Meta-Llama-3-8B: 8,030,261,248 parameters.
    "llama3-8b": ModelConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        rope_theta=500000.0, tie_embeddings=False, max_seq_len=8192,
    ),
}  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Building blocks


class RMSNorm(nn.Module):
    """HF LlamaRMSNorm numerics: normalise in float32, cast back, then scale by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inv_freq(cfg: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """[head_dim/2] float32 inverse frequencies, op for op as transformers computes them
    (`_compute_default_rope_parameters`, and `_compute_llama3_parameters` for rope_type "llama3").

    default: inv_freq[i] = theta ** (-2i / head_dim). llama3: wavelengths 2π/inv_freq longer than
    original_max_seq_len / low_freq_factor are divided by factor, shorter than
    original_max_seq_len / high_freq_factor kept, and the ones between interpolated smoothly.
    """
    head_dim = cfg.head_dim
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    if cfg.rope_type == "default":
        return inv_freq
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_context_len = cfg.rope_original_max_seq_len
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype, inv_freq=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, T, head_dim] for integer positions [B, T], computed in float32 like HF.

    inv_freq[i] = theta ** (-2i / head_dim) unless `inv_freq` is given (`rope_inv_freq`); angles =
    position * inv_freq, duplicated over the two halves of the head dimension (rotate-half layout).
    """
    if inv_freq is None:
        inv_freq = rope_inv_freq(ModelConfig(head_dim, 1, 1, 1, 1, 1, rope_theta=theta), position_ids.device)
    with torch.autocast(device_type=position_ids.device.type, enabled=False):
        freqs = position_ids.float()[..., None] * inv_freq  # [B, T, head_dim/2], float32
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, head_dim] by cos/sin [B, T, head_dim] (HF `apply_rotary_pos_emb`)."""
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] document index of each token: a new document starts wherever the position is 0.

    Tokens before the first 0 (a sequence that starts mid-document) form document 0 of their row.
    """
    return torch.cumsum((position_ids == 0).to(torch.int32), dim=1)


def document_causal_mask(doc: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask (True = may attend): causal AND same document."""
    T = doc.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    same = doc[:, :, None] == doc[:, None, :]
    return (same & causal)[:, None]


_compiled_flex = None
FLEX_KERNEL_OPTIONS: dict | None = None
"""FlexAttention's kernel_options for every call. Training leaves torch's choice (None);
bench/train_mfu's `--attention flex-flash` sets {"BACKEND": "FLASH"} (FlashAttention 4's CuTe kernels)."""


def _flex_attention(q, k, v, block_mask):
    """FlexAttention compiled once per process (the eager version is a slow reference)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(
        q,
        k,
        v,
        block_mask=block_mask,
        enable_gqa=q.shape[1] != k.shape[1],
        kernel_options=FLEX_KERNEL_OPTIONS,
    )


def build_block_mask(doc: torch.Tensor):
    """FlexAttention BlockMask for causal + same-document attention over doc ids [B, T]."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[b, q_idx] == doc[b, kv_idx])

    B, T = doc.shape
    return create_block_mask(mask_mod, B, None, T, T, device=doc.device)


@dataclass
class AttentionMask:
    """How the blocks of one forward attend. Built once per forward by `Transformer`.

    kind: "causal" (SDPA is_causal), "dense" (SDPA with a boolean [B,1,T,T] mask; the CPU reference
    path of document masking) or "flex" (FlexAttention BlockMask; the GPU document-masking path).
    """

    kind: str
    mask: object = None


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, Hkv * n_rep, T, D], each kv head serving n_rep consecutive q heads."""
    if n_rep == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionMask
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if attn.kind == "flex":
            out = _flex_attention(q, k, v, attn.mask)
        else:
            n_rep = self.n_heads // self.n_kv_heads
            k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
            if attn.kind == "dense":
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn.mask)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = HF gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h)). The unit of AC/compile/FSDP."""

    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionMask
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, attn)
        return h + self.feed_forward(self.ffn_norm(h))


# --------------------------------------------------------------------------------------------------
# The model


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        # A ModuleDict keyed "0".."L-1" keeps the FQNs `layers.N.…`; parallelize() changes each
        # block's forward in place (AC, compile) and never wraps it, so the names stay the same.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_weights()

    def _apply(self, fn, recurse=True):
        # nn.Module._apply (to_empty, to, cuda ...) replaces parameters module by module; moving
        # off the meta device it gives the embedding and the LM head two separate new tensors and
        # silently unties them. Re-tie right after, before FSDP2 (whose _apply wraps this one)
        # re-registers its sharded parameters.
        ret = super()._apply(fn, recurse)
        if self.cfg.tie_embeddings and self.output.weight is not self.tok_embeddings.weight:
            self.output.weight = self.tok_embeddings.weight
        return ret

    # ---------------------------------------------------------------------------------- init
    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter in place; works on meta (no-op), real and DTensor params.

        normal(0, init_std) everywhere except the residual-branch output projections wo and w2,
        which get init_std / sqrt(2 * n_layers) (GPT-2 / Megatron scaling, so the residual stream's
        variance does not grow with depth); RMSNorm weights are ones. With tied embeddings the
        shared matrix is initialised once, as the embedding.
        """
        cfg = self.cfg
        std = cfg.init_std
        out_std = std / math.sqrt(2 * cfg.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for block in self.layers.values():
            for lin in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1,
                        block.feed_forward.w3):  # fmt: skip
                nn.init.normal_(lin.weight, mean=0.0, std=std)
            nn.init.normal_(block.attention.wo.weight, mean=0.0, std=out_std)
            nn.init.normal_(block.feed_forward.w2.weight, mean=0.0, std=out_std)
            block.attention_norm.reset_parameters()
            block.ffn_norm.reset_parameters()
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.output.weight, mean=0.0, std=std)

    # ------------------------------------------------------------------------------- forward
    def _attention_mask(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> AttentionMask:
        if not self.cfg.document_mask or position_ids is None:
            return AttentionMask("causal")
        doc = document_ids(position_ids)
        if input_ids.device.type == "cuda":
            return AttentionMask("flex", build_block_mask(doc))
        return AttentionMask("dense", document_causal_mask(doc))

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T] -> logits [B, T, V] (float32), or the mean cross-entropy when labels given.

        labels [B, T] are already shifted (label t is the token after input t); IGNORE_INDEX (-100)
        positions are skipped and the loss is the sum over the others divided by their count
        (0.0 when there are none). The loss is computed here, inside forward, so that FSDP's root
        unshard covers the LM head and, with `cfg.loss_chunk > 0`, the [B*T, V] logits are never
        materialised.

        position_ids [B, T] (positions restarting at 0 at every document start) are used only when
        `cfg.document_mask` is on: for the document mask and for RoPE. Otherwise RoPE uses 0..T-1
        (see the module docstring for why).
        """
        B, T = input_ids.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.cfg.max_seq_len}")
        h = self.tok_embeddings(input_ids)
        if self.cfg.document_mask and position_ids is not None:
            rope_pos = position_ids
        else:
            rope_pos = torch.arange(T, device=input_ids.device).expand(B, T)
        inv_freq = rope_inv_freq(self.cfg, input_ids.device)
        cos, sin = rope_cos_sin(rope_pos, self.cfg.head_dim, self.cfg.rope_theta, h.dtype, inv_freq)
        attn = self._attention_mask(input_ids, position_ids)
        for block in self.layers.values():
            h = block(h, cos, sin, attn)
        h = self.norm(h)
        if labels is None:
            return self.output(h).float()
        h = h.reshape(B * T, -1)
        labels = labels.reshape(B * T)
        weight = self.output.weight
        if self.cfg.loss_chunk > 0:
            return chunked_linear_cross_entropy(h, weight, labels, self.cfg.loss_chunk)
        return linear_cross_entropy(h, weight, labels)


def model_to_load(cfg: ModelConfig, device: torch.device | str = "cpu") -> Transformer:
    """A Transformer whose every weight is about to be loaded (a checkpoint, an export, a base): built
    on meta and allocated, never initialised, so it draws nothing from torch's global RNG. A trainer's
    in-loop export built one with init_weights, which moved the RNG state its next checkpoint saves:
    a resumed run's checkpoints differed from the uninterrupted run's (review RV50a F2)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return model.to_empty(device=device)


# --------------------------------------------------------------------------------------------------
# Counting


def num_params(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Unique parameters (a tied matrix counts once; DTensors count their global size).

    exclude_embeddings drops the token-embedding table (the lookup). With tied embeddings that is
    also the LM head, so it is gone too; an untied LM head stays counted.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
    if exclude_embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                total -= m.weight.numel()
    return total


def flops_per_token(cfg: ModelConfig, seq_len: int, include_lm_head: bool = True) -> int:
    """Training FLOPs per token (forward + backward) at sequence length seq_len.

    Convention (PaLM appendix B, as in torchtitan and nanoGPT): 6 * N_matmul + 12 * L * d * T.
    - 6 * N_matmul: every weight of a matmul does one multiply-add (2 FLOPs) per token forward and
      two backward. N_matmul counts the q/k/v/o and w1/w2/w3 weights of every block, plus the LM
      head (V * d) when include_lm_head; it never counts the embedding lookup (a gather, not a
      matmul) or the RMSNorm weights.
    - 12 * L * d * T: attention scores QK^T and the weighted sum AV, 2 * 2 * d * T FLOPs per token
      and layer forward, times 3 for forward + backward. The full T x T square is counted (causal
      masking is not halved), so MFU figures compare with torchtitan's.
    Activation recomputation (AC) is not counted: MFU is model FLOPs utilisation.
    """
    d, L, hd = cfg.dim, cfg.n_layers, cfg.head_dim
    attn = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d
    mlp = 3 * d * cfg.ffn_dim
    n_matmul = L * (attn + mlp) + (cfg.vocab_size * d if include_lm_head else 0)
    return 6 * n_matmul + 12 * L * d * seq_len
