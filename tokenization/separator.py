"""The separator contract: the ONE place where documents become token ids.

A public 7B run trained for weeks with two separators between documents: the HF tokenizer's
post-processor appended one and the data loader another. Here a document is encoded with
add_special_tokens=False (no post-processor tokens, whatever the tokenizer was saved with) and
encode_special_tokens=True (literal "<|endoftext|>" inside a web page stays text), then the
separator id is added exactly once, and the count is asserted for every document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from tokenization.tokenizer_io import TokenizerError


@dataclass
class SeparatorPolicy:
    token: str = "<|endoftext|>"
    """The special token placed between documents; must exist in the tokenizer's vocabulary."""
    position: Literal["after", "before"] = "after"
    """"after": EOS style, appended to each document; "before": BOS style, prepended."""


class DocumentEncoder:
    """Encodes documents under the separator contract; checks the tokenizer at construction.

    Construction fails (TokenizerError) when the separator is missing, its id is outside the
    vocabulary, or literal separator text would encode to the separator id — all before any
    document is processed.
    """

    def __init__(self, tokenizer: Tokenizer, policy: SeparatorPolicy, source: str = "the tokenizer"):
        # Private copy: encode_special_tokens is a mutable flag on the object, and callers may
        # use their tokenizer elsewhere with the default behaviour.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.encode_special_tokens = True
        self.policy = policy
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        sep = self.tokenizer.token_to_id(policy.token)
        if sep is None:
            specials = [t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special]
            raise TokenizerError(
                f"{source} has no separator token {policy.token!r}; set tokenizer.separator to one of its "
                f"special tokens {specials} or train a tokenizer with it (`gristmill tokenizer train`)"
            )
        if sep >= self.vocab_size:
            raise TokenizerError(
                f"{source}: separator {policy.token!r} has id {sep} ≥ vocab size {self.vocab_size}; "
                "the tokenizer file is inconsistent — re-export it"
            )
        self.separator_id = int(sep)
        probe = self.tokenizer.encode(f"a {policy.token} b", add_special_tokens=False).ids
        if self.separator_id in probe:
            raise TokenizerError(
                f"{source}: literal text {policy.token!r} encodes to the separator id {sep}, so documents "
                "quoting it would gain extra separators; declare the token as special (special=True) "
                "in the tokenizer's added_tokens"
            )

    def separator_info(self) -> dict[str, Any]:
        return {"token": self.policy.token, "id": self.separator_id, "position": self.policy.position}

    def encode(self, text: str) -> np.ndarray:
        return self._frame(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [self._frame(e.ids) for e in encs]

    def _frame(self, ids: list[int]) -> np.ndarray:
        body = np.asarray(ids, dtype=np.uint32)
        out = np.empty(len(body) + 1, dtype=np.uint32)
        if self.policy.position == "after":
            out[:-1] = body
            out[-1] = self.separator_id
        else:
            out[0] = self.separator_id
            out[1:] = body
        # The contract, asserted per document: exactly one separator, at the policy's end.
        if np.count_nonzero(out == self.separator_id) != 1:
            raise TokenizerError(
                f"a document encoded to {np.count_nonzero(out == self.separator_id)} separators "
                f"(id {self.separator_id}); the tokenizer emits the separator from plain text — fix its "
                "added_tokens so the separator is special"
            )
        return out
