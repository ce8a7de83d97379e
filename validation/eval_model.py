"""The lm-eval model classes: one separator before every text, in every task type.

Training fed the model `… doc SEP doc SEP …` (or `SEP doc SEP doc …`): every document the model
learned from starts right after exactly one separator. Stock lm-eval 0.4.x (`--model hf`) frames
requests differently depending on the task type and the tokenizer:

- loglikelihood / multiple choice and generate_until: whatever the tokenizer's post-processor adds
  (gristmill's exported tokenizer adds nothing, so no separator at all);
- loglikelihood_rolling (perplexity): `prefix_token_id` *plus* whatever the tokenizer adds — a
  Llama-3 tokenizer yields BOS BOS text.

`GristmillHFLM` (registered as lm-eval model "gristmill-hf") encodes every string as the build did
(no special tokens added; a literal "<|endoftext|>" in the text stays text, where HF tokenizers
would make it a second separator) and puts the separator in front of each request exactly once:
`_encode_pair` prefixes the context (multiple choice), `tok_batch_encode` each prompt (generation),
and rolling windows get it as lm-eval's prefix token. `in_process_lm` wraps a gristmill
`Transformer` in the same class, so an in-memory model (no export, no transformers model) is
scored by the very same request code.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM


@register_model("gristmill-hf")
class GristmillHFLM(HFLM):
    """lm-eval's HFLM with the training framing: [separator] + text tokens, for every request.

    The separator is the tokenizer's bos token (gristmill exports set bos = eos = separator);
    `prefix_token_id=` overrides it for other models.
    """

    @property
    def separator_id(self) -> int:
        return self.prefix_token_id  # custom prefix_token_id, else the tokenizer's bos

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **kw
    ) -> list[int]:
        # Never the tokenizer's own specials: the framing is added once, below, per request type. A
        # literal "<|endoftext|>" in the text stays text, as when the shards were written (HF
        # tokenizers would otherwise turn it into a second separator).
        ids = self.tokenizer.encode(string, add_special_tokens=False, split_special_tokens=True)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        context_enc, continuation_enc = super()._encode_pair(context, continuation)
        return [self.separator_id, *context_enc], continuation_enc

    def tok_batch_encode(
        self,
        strings: list[str],
        padding_side: str = "left",
        left_truncate_len: int | None = None,
        truncation: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [[self.separator_id, *self.tok_encode(s)] for s in strings]
        if left_truncate_len:
            rows = [r[-left_truncate_len:] for r in rows]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if padding_side == "left" else slice(0, len(r))
            ids[i, sl] = torch.tensor(r)
            mask[i, sl] = 1
        return ids, mask


class _InProcessCausalLM(torch.nn.Module):
    """Just enough of a transformers causal LM for HFLM's loglikelihood paths: `.config`, `.device`,
    `tie_weights()` and `forward(ids).logits` — computed by the gristmill model itself."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int):
        super().__init__()
        self.inner = model
        # HFLM reads the context length from max_position_embeddings and the backend from model_type.
        self.config = SimpleNamespace(model_type="llama", max_position_embeddings=max_seq_len)

    @property
    def device(self) -> torch.device:
        return next(self.inner.parameters()).device

    def tie_weights(self) -> None:
        pass

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.inner(input_ids))


def in_process_lm(
    model: torch.nn.Module, tokenizer: str | Path | Any, batch_size: int = 8, max_length: int | None = None
) -> GristmillHFLM:
    """An lm-eval LM over a gristmill `Transformer` in memory (loglikelihood and rolling tasks).

    `tokenizer` is an HF tokenizer or a directory holding one (an export has one); its bos token
    must be the separator, as in gristmill exports.
    """
    from transformers import AutoTokenizer

    if isinstance(tokenizer, str | Path):
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    wrapped = _InProcessCausalLM(model.eval(), model.cfg.max_seq_len)
    return GristmillHFLM(
        pretrained=wrapped,
        tokenizer=tokenizer,
        backend="causal",
        batch_size=batch_size,
        max_length=max_length,
    )
