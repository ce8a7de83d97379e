"""The one home of the gristmill ↔ Hugging Face `LlamaForCausalLM` tensor names and safetensors
dtype codes: training/checkpoint/hf_export.py writes with them, training/checkpoint/hf_import.py
reads a base model's files with them (`[model] init_from`).
"""

from __future__ import annotations

import re

import torch

from training.model import ModelConfig

__all__ = ["HF_NAME_MAP", "SAFETENSORS_DTYPES", "hf_name", "hf_state_dict_names"]

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
"""torch dtype -> safetensors dtype code (the ones gristmill writes and reads)."""


# --- HF LlamaForCausalLM names ----------------------------------------------------------------

HF_NAME_MAP: dict[str, str] = {
    r"^tok_embeddings\.weight$": "model.embed_tokens.weight",
    r"^layers\.(\d+)\.attention_norm\.weight$": r"model.layers.\1.input_layernorm.weight",
    r"^layers\.(\d+)\.attention\.wq\.weight$": r"model.layers.\1.self_attn.q_proj.weight",
    r"^layers\.(\d+)\.attention\.wk\.weight$": r"model.layers.\1.self_attn.k_proj.weight",
    r"^layers\.(\d+)\.attention\.wv\.weight$": r"model.layers.\1.self_attn.v_proj.weight",
    r"^layers\.(\d+)\.attention\.wo\.weight$": r"model.layers.\1.self_attn.o_proj.weight",
    r"^layers\.(\d+)\.ffn_norm\.weight$": r"model.layers.\1.post_attention_layernorm.weight",
    r"^layers\.(\d+)\.feed_forward\.w1\.weight$": r"model.layers.\1.mlp.gate_proj.weight",
    r"^layers\.(\d+)\.feed_forward\.w2\.weight$": r"model.layers.\1.mlp.down_proj.weight",
    r"^layers\.(\d+)\.feed_forward\.w3\.weight$": r"model.layers.\1.mlp.up_proj.weight",
    r"^norm\.weight$": "model.norm.weight",
    r"^output\.weight$": "lm_head.weight",
}
"""Regex (over our state-dict key) -> HF LlamaForCausalLM key. Tensors need no reshaping: the
Linear weights are [out, in] like HF's and RoPE already uses HF's rotate-half layout."""

_WRAPPER_PARTS = re.compile(r"(_checkpoint_wrapped_module|_orig_mod|_fsdp_wrapped_module)\.")


def hf_name(name: str) -> str:
    """Our parameter name (wrapper prefixes tolerated) -> the HF LlamaForCausalLM name."""
    clean = _WRAPPER_PARTS.sub("", name)
    for pattern, repl in HF_NAME_MAP.items():
        new, n = re.subn(pattern, repl, clean)
        if n:
            return new
    raise KeyError(f"no HF name for parameter {name!r}")


def hf_state_dict_names(cfg: ModelConfig) -> dict[str, str]:
    """Every state-dict key of Transformer(cfg) -> its HF name, in model order.

    With tied embeddings `output.weight` is omitted: HF stores only `model.embed_tokens.weight`
    and ties `lm_head.weight` to it when `tie_word_embeddings` is true.
    """
    names = ["tok_embeddings.weight"]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        names += [p + "attention_norm.weight"]
        names += [p + f"attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")]
        names += [p + "ffn_norm.weight"]
        names += [p + f"feed_forward.{w}.weight" for w in ("w1", "w2", "w3")]
    names.append("norm.weight")
    if not cfg.tie_embeddings:
        names.append("output.weight")
    return {n: hf_name(n) for n in names}
