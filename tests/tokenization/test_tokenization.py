"""The separator contract at the encoder: exactly one separator per document, whatever the tokenizer does."""

import os
import subprocess
import sys

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, processors

from tokenization.separator import DocumentEncoder, SeparatorPolicy
from tokenization.tokenizer_io import TokenizerError, load_tokenizer, train_bpe

SEP = "<|endoftext|>"
BOS = "<|begin_of_text|>"
TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Photosynthesis converts light energy into chemical energy in plants.",
    "A literal <|endoftext|> inside a web page must stay text.",
    "",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    corpus = [t for t in TEXTS if t] * 20
    return train_bpe(corpus, vocab_size=400, special_tokens=[SEP, BOS])


def with_post_processor(tok: Tokenizer, template: str, token: str) -> Tokenizer:
    tok = Tokenizer.from_str(tok.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, tok.token_to_id(token))]
    )
    return tok


def assert_one_separator(enc: DocumentEncoder, ids: np.ndarray, position: str) -> None:
    sep = enc.separator_id
    assert np.count_nonzero(ids == sep) == 1
    assert ids[-1 if position == "after" else 0] == sep


@pytest.mark.parametrize("position", ["after", "before"])
@pytest.mark.parametrize("post", [None, "eos", "bos"])
def test_exactly_one_separator(tokenizer, position, post):
    # The double-separator trap: a tokenizer saved with a post-processor that appends the
    # separator (or prepends a BOS) must not change what reaches the shards.
    tok = tokenizer
    if post == "eos":
        tok = with_post_processor(tokenizer, f"$A {SEP}", SEP)
        assert tok.encode("hello").ids[-1] == tok.token_to_id(SEP)  # the trap is armed
    elif post == "bos":
        tok = with_post_processor(tokenizer, f"{BOS} $A", BOS)
        assert tok.encode("hello").ids[0] == tok.token_to_id(BOS)
    enc = DocumentEncoder(tok, SeparatorPolicy(SEP, position))
    plain = DocumentEncoder(tokenizer, SeparatorPolicy(SEP, position))
    for text, ids in zip(TEXTS, enc.encode_batch(TEXTS)):
        assert_one_separator(enc, ids, position)
        assert np.array_equal(ids, enc.encode(text))
        assert np.array_equal(ids, plain.encode(text))  # post-processor has no effect at all
        assert tok.token_to_id(BOS) not in ids.tolist()


def test_literal_separator_text_stays_text(tokenizer):
    enc = DocumentEncoder(tokenizer, SeparatorPolicy(SEP, "after"))
    ids = enc.encode(TEXTS[2])
    assert_one_separator(enc, ids, "after")
    assert SEP in tokenizer.decode(ids[:-1].tolist(), skip_special_tokens=False)
    assert len(ids) > 10  # the literal text was spelled out in ordinary tokens


def test_tokenizer_without_separator_is_refused(tokenizer):
    tok = train_bpe(TEXTS[:2] * 5, vocab_size=300, special_tokens=["<pad>"])
    with pytest.raises(TokenizerError, match=r"no separator token '<\|endoftext\|>'.*\['<pad>'\]"):
        DocumentEncoder(tok, SeparatorPolicy(SEP), source="tok.json")


def test_non_special_separator_is_refused(tokenizer):
    tok = train_bpe(TEXTS[:2] * 5, vocab_size=300, special_tokens=[])
    tok.add_tokens([AddedToken(SEP, special=False)])
    with pytest.raises(TokenizerError, match="declare the token as special"):
        DocumentEncoder(tok, SeparatorPolicy(SEP))


def test_load_tokenizer(tokenizer, tmp_path):
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).to_str() == tokenizer.to_str()
    assert load_tokenizer(tmp_path / "tokenizer.json").get_vocab_size() == tokenizer.get_vocab_size()
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")


def test_hub_name_offline_gives_clear_error():
    # huggingface_hub reads HF_HUB_OFFLINE at import, so the check runs in a fresh interpreter;
    # without it the same message comes after huggingface_hub's ~20 s of retries on a machine
    # without network.
    code = "from tokenization.tokenizer_io import load_tokenizer\nload_tokenizer('some-org/some-tokenizer')"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot fetch tokenizer.json of 'some-org/some-tokenizer'" in last
    assert "set tokenizer.path to the local tokenizer.json" in last
