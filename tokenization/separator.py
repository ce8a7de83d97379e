"""The separator contract: the ONE place where documents become token ids.

A public 7B run trained for weeks with two separators between documents: the HF tokenizer's
post-processor appended one and the data loader another. Here a document is encoded with
add_special_tokens=False (no post-processor tokens, whatever the tokenizer was saved with) and
encode_special_tokens=True (literal "<|endoftext|>" inside a web page stays text), then the
separator id is added exactly once, and the count is asserted for every document.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from tokenization.tokenizer_io import TokenizerError
from training.contract.dataset_format import as_encoded, shared_ids, shared_ids_said
from training.contract.separator_check import misplaced_separators


@dataclass
class SeparatorPolicy:
    token: str = "<|endoftext|>"
    """The special token placed between documents; must be one of the tokenizer's special added
    tokens (special=True), which plain text cannot encode to."""
    position: Literal["after", "before"] = "after"
    """"after": EOS style, appended to each document; "before": BOS style, prepended."""


def _pick_special(specials: list[str], usable: list[str], other: bool = False) -> str:
    """The advice for a separator that plain text can produce: which tokens to pick instead, among
    `usable` (the `specials` that pass the same checks: _usable)."""
    if not specials:
        return "the tokenizer has no special tokens: train one with `gristmill tokenizer train`"
    if not usable:
        return (
            f"none of its special tokens {_some(specials)} can be one (plain text spells each, or it is the "
            'unknown token): add one to its added_tokens with "special": true'
        )
    which = "another of" if other else "one of"
    return f"set tokenizer.separator to {which} its special tokens {_some(usable)}"


def _some(tokens: list[str], shown: int = 8) -> str:
    """The first `shown` of `tokens` and how many more: a Llama-3 tokenizer's 256 special tokens
    made one line of 8,689 characters."""
    more = len(tokens) - shown
    return f"{tokens[:shown]}" + (f" and {more:,} more" if more > 0 else "")


def _configured(path: str | Path | None, specials: list[str]) -> str:
    """Advice from the tokenizer_config.json beside tokenizer.json `path`: its eos and bos (when
    among `specials`, the tokenizer's special tokens that could be the separator) as the likely
    separator, after or before each document. Every refusal that suggests special tokens adds it
    (review R25i D1: only the missing separator's did, as docs/data-build.md said of all)."""
    config = Path(path).parent / "tokenizer_config.json" if path else None
    try:
        spec = json.loads(config.read_text(encoding="utf-8")) if config else {}
    except (OSError, ValueError):
        return ""
    named = []
    for key, how in (
        ("eos_token", "after each document"),
        ("bos_token", 'with tokenizer.position = "before"'),
    ):
        token = spec.get(key) if isinstance(spec, dict) else None
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in specials and token not in {n[1] for n in named}:
            named.append((key[:3], token, how))
    if not named:
        return ""
    return f"; the likely one is what {config} names: " + " or ".join(
        f"{key} {token!r} (tokenizer.separator = {json.dumps(token)}, {how})" for key, token, how in named
    )


def spelled(tokenizer: Tokenizer, token: str, building: bool = False) -> str | None:
    """A text quoting `token` literally (alone, between spaces, glued to words, doubled) that
    `tokenizer` (encode_special_tokens set) encodes to the token's id, or None when none does.
    `building` (a new build's check): also the text its id stands for (_meant), a byte-level special
    token named as its vocabulary entry ("ĊĊ" for "\n\n", "ä" for a lead byte of "中"): the build
    failed in its tasks, after hours of dedup, at the first document holding it (trials RV61c F1,
    review RV61f F2). Not for a dataset built already: the per-document check passed its documents, and
    its evals and finalize were refused (review RV61f F1)."""
    tid = tokenizer.token_to_id(token)
    for spelling in [token, *(_meant(tokenizer, tid, token) if building else [])]:
        probes = [spelling, f"a {spelling} b", f"a{spelling}b", f"word{spelling}", f"{spelling}word"]
        probes += [f"{spelling} at the start", f"at the end {spelling}", f"{spelling}{spelling}"]
        probes += [f"\n{spelling}\n", f"a {spelling}{spelling} b", f"a.{spelling} b", f"a{spelling}"]
        for text in probes:
            if tid in tokenizer.encode(text, add_special_tokens=False).ids:
                return text
    return None


def _unspellable(tokenizer: Tokenizer) -> str | None:
    """A character no entry of `tokenizer`'s vocabulary holds, which its normalizer keeps (one the
    normalizer deletes is the normalizer's): what its model must give an unknown token or bytes for. CJK
    ideographs first, then every later code point (a vocabulary holds some of them at most)."""
    held = set("".join(tokenizer.get_vocab()))
    norm = tokenizer.normalizer
    for cp in itertools.chain(range(0x4E00, 0xD800), range(0xE000, 0x110000)):
        if (c := chr(cp)) not in held and (norm is None or norm.normalize_str(c)):
            return c
    return None


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _spelled_back(
    tokenizer: Tokenizer, ids: list[int], probe: str, unk_id: int | None, byte_level: bool
) -> bool:
    """Whether `ids`, the encoding of `probe`, keep it: the unknown token, or text that holds it (as its
    normalizer writes it) when decoded, or when its tokens are read as bytes (byte-fallback pieces, a
    byte-level alphabet's characters: a tokenizer without their decoder)."""
    if unk_id is not None and unk_id in ids:
        return True
    norm = tokenizer.normalizer
    want = norm.normalize_str(probe) if norm is not None else probe
    if want in tokenizer.decode(ids, skip_special_tokens=False):
        return True
    tokens = (tokenizer.id_to_token(i) or "" for i in ids)
    raw = b"".join(_token_bytes(t, byte_level) or t.encode() for t in tokens)
    return want.encode() in raw


def _token_bytes(token: str, byte_level: bool = True) -> bytes | None:
    """The bytes vocabulary entry `token` stands for where it spells bytes: a byte-fallback piece
    (`<0xE4>`), or (`byte_level`) a byte-level alphabet's characters; else None."""
    if (m := _BYTE_FALLBACK.fullmatch(token)) is not None:
        return bytes([int(m.group(1), 16)])
    inverse = _byte_level_bytes()
    if byte_level and token and all(c in inverse for c in token):
        return bytes(inverse[c] for c in token)
    return None


def _byte_gaps(tokenizer: Tokenizer, byte_level: bool, model: dict[str, Any]) -> tuple[str, list[int]] | None:
    """(what, the bytes it lacks) of a byte-level alphabet or byte fallback that lacks some of the 243
    bytes UTF-8 text holds (a byte-level BPE's alphabet is its single-character tokens); None where it
    holds them all or the model has neither."""
    if byte_level:
        chars = _byte_level_chars()
        lacking = [b for b in _UTF8_BYTES if tokenizer.token_to_id(chars[b]) is None]
        return ("byte-level alphabet", lacking) if lacking else None
    if model.get("byte_fallback"):
        lacking = [b for b in _UTF8_BYTES if tokenizer.token_to_id(f"<0x{b:02X}>") is None]
        return ("byte fallback", lacking) if lacking else None
    return None


# The bytes UTF-8 text can hold: never 0xC0, 0xC1 or 0xF5–0xFF, which a vocabulary trained on every
# valid byte lacks (they were refused: re-trial RV73e 4)
_UTF8_BYTES = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]


def _meant(tokenizer: Tokenizer, tid: int, token: str) -> list[str]:
    """Texts holding what id `tid` stands for, other than `token` itself: its decoded text, and where it
    is bytes that are part of a character (a byte-level entry, a byte-fallback `<0xE4>`), characters
    holding them."""
    texts = [tokenizer.decode([tid], skip_special_tokens=False)]
    if (raw := _token_bytes(token)) is not None:
        for lead in (b"", b"\xc3", b"\xe4", b"\xe4\xb8", b"\xf0\x9f", b"\xf0\x9f\x98"):
            for tail in (b"", b"\x80", b"\x80\x80", b"\x80\x80\x80"):
                with contextlib.suppress(UnicodeDecodeError):
                    texts.append((lead + raw + tail).decode("utf-8"))
    return [t for t in dict.fromkeys(texts) if t and t != token and "\ufffd" not in t]


@functools.cache
def _byte_level_bytes() -> dict[str, int]:
    """_byte_level_chars read back: character → the byte it spells."""
    return {c: b for b, c in _byte_level_chars().items()}


@functools.cache
def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte → printable character map, which byte-level vocabularies spell bytes with."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def _usable(tokenizer: Tokenizer, specials: list[str], unk: str | None, separator: str) -> list[str]:
    """The special tokens other than `separator` that could be the separator: not the model's unknown
    token, and not spelled by plain text (spelled)."""
    return [t for t in specials if t not in (separator, unk) and spelled(tokenizer, t) is None]


def vocab_size_of(tokenizer: Tokenizer) -> int:
    """The highest id + 1, not the number of tokens: a tokenizer's ids may have gaps, and the shards'
    dtype (uint16 up to 65,536) is chosen from this; counting tokens, an id past 65,535 in a tokenizer
    of fewer tokens was stored modulo 65,536, as another real token."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return max(len(vocab), max(vocab.values(), default=-1) + 1)


def added_ids_taken(tokenizer: Tokenizer) -> list[tuple[int, list[str]]]:
    """The ids `tokenizer` gives an added token and, in its model's vocab, another token (as shared_ids
    says them): text spelling the vocab token would encode to the added one's id."""
    vocab = tokenizer.model
    return [
        (i, sorted([token.content, held]))
        for i, token in sorted(tokenizer.get_added_tokens_decoder().items())
        if (held := vocab.id_to_token(i)) is not None and held != token.content
    ]


class SharedIdsError(TokenizerError):
    """A vocab that gives one id to several tokens (`shared`: shared_ids' answer); a caller whose data
    was already encoded with it says its own fix (validation/eval_data.py heldout_texts)."""

    def __init__(self, message: str, shared: list[tuple[int, list[str]]]):
        super().__init__(message)
        self.shared = shared


class DocumentEncoder:
    """Encodes documents under the separator contract; checks the tokenizer at construction.

    Construction fails (TokenizerError) when the separator is missing, its id is outside the
    vocabulary, it is not a special added token (an ordinary vocabulary token such as "." or an
    added token with special=False), it is the model's unknown token, or its literal text in any of
    several positions (alone, between spaces, glued to words, doubled) would encode to the separator
    id — all before any document is processed. `building`: a new build's, which also refuses a
    separator that the text its id stands for encodes to (spelled).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        policy: SeparatorPolicy,
        source: str = "the tokenizer",
        path: str | Path | None = None,
        building: bool = False,
    ):
        # Private copy: encode_special_tokens is a mutable flag on the object, and callers may
        # use their tokenizer elsewhere with the default behaviour; as_encoded drops what would make a
        # task's shards other than a function of its input (truncation, padding, BPE dropout).
        encoded = as_encoded(tokenizer.to_str())
        spec = json.loads(encoded)
        # as loaded (the token -> id map keeps every token; to_str's model keeps one of each id)
        if shared := shared_ids(tokenizer.get_vocab(with_added_tokens=False)):
            # tokenizers keeps either token of such an id, another at each load: the copy below lost
            # one and failed ("Token … out of vocabulary"), a traceback, or every task of the build did
            raise SharedIdsError(
                f"{source}: its model.vocab {shared_ids_said(shared)}, so its documents would not encode "
                f"and decode as one text; give each id of model.vocab one token in "
                f"{path or 'its tokenizer.json'}",
                shared,
            )
        # tokenizers numbers an added token model.vocab lacks after model.vocab's count of tokens, never
        # by its added_tokens entry's id: a vocab with a gap in its ids gives it a vocab token's id, and
        # the separator's id became an ordinary token's too (trial RV70c 3)
        if clash := added_ids_taken(tokenizer):
            raise SharedIdsError(
                f"{source}: as tokenizers loads it, its vocabulary {shared_ids_said(clash)} (an added token "
                "model.vocab lacks takes the id after model.vocab's count of tokens, not its added_tokens "
                f"id); add each added token to model.vocab at an id of its own in "
                f"{path or 'its tokenizer.json'}",
                clash,
            )
        self.tokenizer = Tokenizer.from_str(encoded)
        self.tokenizer.encode_special_tokens = True
        self.policy = policy
        self.source = str(source)
        self.vocab_size = vocab_size_of(self.tokenizer)
        added = self.tokenizer.get_added_tokens_decoder()
        specials = [t.content for _, t in sorted(added.items()) if t.special]
        sep = self.tokenizer.token_to_id(policy.token)
        if sep is None:
            raise TokenizerError(
                f"{source} has no separator token {policy.token!r}; set tokenizer.separator to one of its "
                f"special tokens {_some(specials)}, or train a tokenizer with it (`gristmill tokenizer "
                f"train`){_configured(path, specials)}"
            )
        if sep >= self.vocab_size:
            raise TokenizerError(
                f"{source}: separator {policy.token!r} has id {sep} ≥ vocab size {self.vocab_size}; "
                "the tokenizer file is inconsistent — re-export it"
            )
        self.separator_id = int(sep)
        model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
        unk, unigram_unk = model.get("unk_token"), None
        if model.get("unk_id") is not None and isinstance(model.get("vocab"), list):  # Unigram
            unigram_unk = model["unk_id"]
            unk = model["vocab"][unigram_unk][0]
        # the id of what the vocabulary cannot spell (None: a model without one, byte-level BPE's): the
        # build excludes a text encoding to it, whose ids decode to other text (tokenize_shard.py)
        self.unk = unk if isinstance(unk, str) else None
        # a Unigram's by its index: a piece listed twice is looked up as its last copy, and the model gives
        # the unk_id one (review RV73c 2)
        if unigram_unk is not None:
            self.unk_id = unigram_unk
        else:
            self.unk_id = None if self.unk is None else self.tokenizer.token_to_id(self.unk)
        # A model that cannot encode what it cannot spell fails on the first such text: a new build's
        # traceback here, or a task's "Exception: Encountered an unknown token …" naming no file
        # (re-trial RV72e F3); a dataset built already passed its every document (`building`)
        where = path or "its tokenizer.json"
        cannot = building and not model.get("byte_fallback")
        if cannot and self.unk is not None and self.unk_id is None:
            raise TokenizerError(
                f"{source}: its model's unk_token {self.unk!r} is not in its vocabulary, so the first text "
                f"it cannot spell stops the build; add {self.unk!r} to model.vocab in {where}, or set "
                "model.unk_token to a token there"
            )
        if cannot and model.get("type") == "Unigram" and model.get("unk_id") is None:
            raise TokenizerError(
                f"{source}: its Unigram model has no unk_id, so the first text outside its pieces stops the "
                f"build; set model.unk_id in {where} to the index of its unknown piece (byte_fallback needs "
                "the pieces <0x00> to <0xFF> too)"
            )
        # And one with no unknown token to give them (a BPE without unk_token, byte fallback or ByteLevel)
        # drops the characters it cannot spell: the ids decode to other text, the build said OK
        # (re-trial RV72e F1). A character its vocabulary lacks shows it; four fixed ones missed a
        # vocabulary holding them (review RV73c 1).
        probe = _unspellable(self.tokenizer) if building else None
        try:
            ids = [] if probe is None else self.tokenizer.encode(probe, add_special_tokens=False).ids
        except Exception as e:  # tokenizers' own, a traceback: byte_fallback without its <0xNN> pieces
            raise TokenizerError(
                f"{source}: encoding {probe!r}, a character its vocabulary lacks, fails ({e}), as would the "
                f"first such text of the build; give its model an unknown token in {where}"
            ) from None
        byte_level = any('"ByteLevel"' in json.dumps(spec.get(k)) for k in ("pre_tokenizer", "decoder"))
        # A byte alphabet, or byte fallback, must hold every byte UTF-8 text holds: the probe below tries
        # three (a BPE trained without ByteLevel's initial alphabet spelled '€' as nothing: RV73d 2)
        if building and self.unk_id is None and (gap := _byte_gaps(self.tokenizer, byte_level, model)):
            kind, lacking = gap
            shown = ", ".join(f"0x{b:02X}" for b in lacking[:8]) + (" …" if len(lacking) > 8 else "")
            fix = (
                "train it with every byte (`gristmill tokenizer train` does: ByteLevel.alphabet() as its "
                "initial alphabet)"
                if byte_level
                else f"add the pieces <0x00> to <0xFF> to its vocabulary in {where}"
            )
            raise TokenizerError(
                f"{source}: its {kind} lacks {len(lacking)} of the 243 bytes of UTF-8 text ({shown}), so a "
                f"text holding them loses them without a trace; {fix}, or give its model an unk_token in "
                f"{where} (the build then excludes texts holding it)"
            )
        # Some tokens are not enough: a Metaspace BPE gave '一' as '▁' alone (re-trial RV73d 1); what
        # comes out must be the unknown token, or spell the character back
        if probe is not None and not _spelled_back(self.tokenizer, ids, probe, self.unk_id, byte_level):
            tokens = [self.tokenizer.id_to_token(i) for i in ids]
            said = (
                f"to tokens that do not spell it ({', '.join(map(repr, tokens))})"
                if ids
                else "to no token at all"
            )
            raise TokenizerError(
                f"{source}: it encodes {probe!r} {said} (no unknown token, no byte fallback), so a text "
                "loses the characters its vocabulary lacks without a trace; use a byte-level tokenizer, "
                f"or give its model an unk_token in {where} (the build then excludes texts holding it)"
            )
        # A Unigram's vocab is a list of pieces, which may hold one twice: tokenizers' own trainer, on a
        # corpus quoting "</s>", learned it as a piece beside the special entry, and the refusal below
        # then said no special token could be the separator, naming them all special (trial RV71e 2)
        pieces = model.get("vocab") if isinstance(model.get("vocab"), list) else []
        at = [i for i, p in enumerate(pieces) if isinstance(p, list) and p and p[0] == policy.token]
        if len(at) > 1:
            raise TokenizerError(
                f"{source}: its model.vocab lists tokenizer.separator {policy.token!r} {len(at)} times (ids "
                f"{', '.join(map(str, at))}: a piece its training learned from text that spells it), so text "
                f"encodes to the separator; train the tokenizer again on text that does not spell it"
            )
        # The separator must be one of the tokenizer's special added tokens: only those are kept
        # out of ordinary text by encode_special_tokens=True. An ordinary vocabulary token ("." or
        # "the"), or an added token with special=False, is what plain text encodes to.
        entry = added.get(self.separator_id)
        if entry is None or entry.content != policy.token or not entry.special:
            kind = (
                "an ordinary vocabulary token"
                if entry is None or entry.content != policy.token
                else "an added token with special=false"
            )
            raise TokenizerError(
                f"{source}: tokenizer.separator {policy.token!r} is {kind} (id {sep}), not a special "
                f"token, so plain text may encode to it; "
                f"{_pick_special(specials, usable := _usable(self.tokenizer, specials, unk, policy.token))}, "
                f'or add {policy.token!r} to the tokenizer\'s added_tokens with "special": true'
                f"{_configured(path, usable)}"
            )
        # Nor may text the vocabulary cannot spell: a model whose unknown token is the separator (some
        # GPT-2-era configs name <|endoftext|> as unk) gives it to every character it lacks.
        if unk == policy.token:
            raise TokenizerError(
                f"{source}: its model's unknown token is tokenizer.separator {policy.token!r}, so every "
                "character outside its vocabulary encodes to the separator; set the model's unk_token to "
                "another token, or use a byte-level tokenizer (it has none)"
            )
        # And literal separator text, wherever it stands in a page, must stay text (a special
        # token whose string the vocabulary can also spell, e.g. a special "." is caught here).
        text = spelled(self.tokenizer, policy.token, building)
        if text is not None:
            usable = _usable(self.tokenizer, specials, unk, policy.token)
            why = (
                f"literal text {text!r} encodes to the separator id {sep} (tokenizer.separator "
                f"{policy.token!r}), so documents quoting it would gain extra separators"
            )
            fix = "fix the tokenizer's added_tokens and vocabulary so no text spells it"
            if at:  # a piece of its Unigram model, which the model matches in text: the advice to make it a
                # special added token, which it was, did not name that (trial RV73f 2)
                why += (
                    f": it is piece {at[0]} of its Unigram model.vocab (tokenizers' UnigramTrainer keeps one "
                    "for each special token), which the model matches in plain text"
                )
                fix = (
                    "use a byte-level BPE (`gristmill tokenizer train`) or a Unigram whose model.vocab holds "
                )
                fix += "no piece of it"
            raise TokenizerError(  # `cause`: the why alone, for `tokenizer train`'s own advice
                f"{source}: {why}; {_pick_special(specials, usable, other=True)}, or {fix}"
                f"{_configured(path, usable)}",
                cause=why,
            )

    def separator_info(self) -> dict[str, Any]:
        return {"token": self.policy.token, "id": self.separator_id, "position": self.policy.position}

    def encode(self, text: str) -> np.ndarray:
        return self._frame([self.tokenizer.encode(text, add_special_tokens=False).ids], [text])[0]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        encs = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return self._frame([e.ids for e in encs], texts)

    def _frame(self, docs: list[list[int]], texts: list[str] | None = None) -> list[np.ndarray]:
        """Each document's ids with the separator added at the policy's end, as views of one array;
        `texts`, the documents', name one that breaks the contract."""
        if not docs:
            return []
        lengths = np.fromiter((len(ids) + 1 for ids in docs), np.int64, len(docs))
        ends = np.cumsum(lengths)
        out = np.empty(int(ends[-1]), dtype=np.uint32)
        after = self.policy.position == "after"
        seps = ends - 1 if after else ends - lengths
        for ids, at in zip(docs, (seps - lengths + 1 if after else seps + 1).tolist()):
            out[at : at + len(ids)] = ids
        out[seps] = self.separator_id
        # The contract, asserted for every document: exactly one separator, at the policy's end.
        bad = misplaced_separators(out, self.separator_id, self.policy.position, lengths)
        if len(bad):
            d = int(np.searchsorted(ends, bad[0], side="right"))
            doc = out[int(ends[d] - lengths[d]) : int(ends[d])]
            # the separator is special (checked at start-up), so what makes it from text is the
            # tokenizer's own pipeline; it was told to make the separator special (trial RV71e 1)
            begins = (
                f", the document that begins {texts[d][:60] + '…' * (len(texts[d]) > 60)!r}" if texts else ""
            )
            raise TokenizerError(
                f"a document encoded to {np.count_nonzero(doc == self.separator_id)} separators: "
                f"{self.source} emits tokenizer.separator {self.policy.token!r} (id {self.separator_id}) "
                f"from plain text{begins} (its normalizer, pre-tokenizer or vocabulary turns text into the "
                "separator); fix the tokenizer so no text becomes it, or set tokenizer.separator to another "
                "of its special tokens"
            )
        return np.split(out, ends[:-1])
