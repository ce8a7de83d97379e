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

The class also records, per task, what the model was asked (`requests_seen`): the requests per
document (a multiple-choice document's count of choices: its chance level) and the inputs that
lm-eval cuts from the left because they do not fit `max_length` — the numbers behind the eval's
truncation warning, counted from the very token lists lm-eval scores.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from training.checkpoint.hf_export import export_separator_id
from validation.eval_data import EvalError


@dataclass
class TaskRequests:
    """The loglikelihood and generation requests of one task, as the model gets them."""

    per_doc: Counter[int] = field(default_factory=Counter)
    """requests per document id (a multiple-choice document: one per choice)"""
    cut_docs: set[int] = field(default_factory=set)
    """documents with an input longer than `limit`, which lm-eval cuts from the left"""
    cut_requests: int = 0
    longest: int = 0
    """tokens of the longest input before any cut"""
    limit: int = 0
    """tokens an input may have: max_length, less max_gen_toks for generation"""

    def add(self, doc_id: int, tokens: int, limit: int) -> None:
        self.per_doc[doc_id] += 1
        self.longest = max(self.longest, tokens)
        self.limit = limit
        if tokens > limit:
            self.cut_docs.add(doc_id)
            self.cut_requests += 1


@register_model("gristmill-hf")
class GristmillHFLM(HFLM):
    """lm-eval's HFLM with the training framing: [separator] + text tokens, for every request.

    The separator is the one a gristmill export records (gristmill_export.json), held explicitly:
    an export of a run from a base model keeps the base's bos, which need not be the separator the
    run was trained with. `prefix_token_id=` sets it; for other models it is the tokenizer's bos.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        pretrained = kwargs.get("pretrained")
        if kwargs.get("prefix_token_id") is None and isinstance(pretrained, str | Path):
            kwargs["prefix_token_id"] = export_separator_id(pretrained)
        self.requests_seen: dict[str, TaskRequests] = {}  # task name -> its requests; cleared by the caller
        self._owners: list[tuple[str, int]] | None = None  # (task, doc) of the requests being encoded
        self._prompt_owners: dict[str, tuple[str, int]] = {}  # generation prompt -> (task, doc)
        super().__init__(*args, **kwargs)

    def _seen(self, owner: tuple[str, int] | None, tokens: int, limit: int) -> None:
        if owner is not None:
            task, doc = owner
            self.requests_seen.setdefault(task, TaskRequests()).add(doc, tokens, limit)

    @property
    def separator_id(self) -> int:
        return self.prefix_token_id  # custom prefix_token_id, else the tokenizer's bos

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **kw
    ) -> list[int]:
        # Never the tokenizer's own specials: the framing is added once, below, per request type. A
        # literal "<|endoftext|>" in the text stays text, as when the shards were written (HF
        # tokenizers would otherwise turn it into a second separator).
        # verbose=False: no "Token indices sequence length is longer than the specified maximum" —
        # a perplexity document is encoded whole and then scored in windows of max_length, and
        # what does get cut is counted in requests_seen and reported by the eval in one line.
        ids = self.tokenizer.encode(
            string, add_special_tokens=False, split_special_tokens=True, verbose=False
        )
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        context_enc, continuation_enc = super()._encode_pair(context, continuation)
        return [self.separator_id, *context_enc], continuation_enc

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self._owners = [(r.task_name, r.doc_id) for r in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm)
        finally:
            self._owners = None

    def _loglikelihood_tokens(
        self, requests: list[Any], disable_tqdm: bool = False, override_bs: int | None = None
    ) -> list[tuple[float, bool]]:
        # Reached from loglikelihood (owners set, one per request, in order) or with the windows of
        # loglikelihood_rolling (which always fit). The model's input is context + continuation
        # less its last token; lm-eval keeps the last max_length tokens of it.
        owners, self._owners = self._owners, None
        if owners is not None and len(owners) == len(requests):
            for owner, (_, context_enc, continuation_enc) in zip(owners, requests, strict=True):
                if len(continuation_enc) > self.max_length:  # lm-eval would stop on a bare assert
                    context = getattr(self.model.config, "max_position_embeddings", None)
                    longer = (  # at the whole context it advised a longer one, refused (review RV52a F3)
                        "evaluate with a longer context (--set max_length=N, up to the model's max_seq_len) "
                        "or leave the task out"
                        if context is None or self.max_length < context
                        else "max_length is the model's whole context: no longer one fits it; leave the task "
                        "out"
                    )
                    raise EvalError(
                        f"task {owner[0]} document {owner[1]}: an answer of {len(continuation_enc)} tokens "
                        f"does not fit max_length {self.max_length}; {longer}"
                    )
                self._seen(owner, len(context_enc) + len(continuation_enc) - 1, self.max_length)
        return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        self._prompt_owners = {r.args[0]: (r.task_name, r.doc_id) for r in requests}
        try:
            return super().generate_until(requests, disable_tqdm)
        finally:
            self._prompt_owners = {}

    def tok_batch_encode(
        self,
        strings: list[str],
        padding_side: str = "left",
        left_truncate_len: int | None = None,
        truncation: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [[self.separator_id, *self.tok_encode(s)] for s in strings]
        if left_truncate_len:
            for s, r in zip(strings, rows, strict=True):
                self._seen(self._prompt_owners.get(s), len(r), left_truncate_len)
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
    model: torch.nn.Module,
    tokenizer: str | Path | Any,
    batch_size: int = 8,
    max_length: int | None = None,
    *,
    separator_id: int,
) -> GristmillHFLM:
    """An lm-eval LM over a gristmill `Transformer` in memory (loglikelihood and rolling tasks).

    `tokenizer` is an HF tokenizer or a directory holding one (an export has one); `separator_id`
    the separator the model was trained with (the dataset's), put before every request once.
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
        prefix_token_id=separator_id,
    )
