"""The separator contract at the encoder: exactly one separator per document, whatever the tokenizer does."""

import json
import os
import re
import subprocess
import sys
import time

import huggingface_hub.constants
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, processors

from tests.helpers.corpus import fixture_texts
from tokenization.separator import DocumentEncoder, SeparatorPolicy
from tokenization.tokenizer_io import TokenizerError, load_tokenizer, train_bpe
from training.contract.dataset_format import dtype_for_vocab

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

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
    with pytest.raises(TokenizerError, match="is an added token with special=false .*not a special token"):
        DocumentEncoder(tok, SeparatorPolicy(SEP))


@pytest.fixture(scope="module")
def prose_tokenizer() -> Tokenizer:
    """The project's own BPE on real prose: "the" is an ordinary token, and so is " the"."""
    return train_bpe(fixture_texts(), vocab_size=512, special_tokens=[SEP, BOS])


def test_ordinary_vocabulary_token_as_separator_is_refused(prose_tokenizer):
    tok = prose_tokenizer
    the = tok.token_to_id("the")
    assert the is not None
    # The trap the old probe ("a the b") missed: there " the" is its own token, while "the" alone
    # (or glued to a word) encodes to the separator's id.
    assert the not in tok.encode("a the b", add_special_tokens=False).ids
    assert tok.encode("the", add_special_tokens=False).ids == [the]
    for token in ("the", "."):
        with pytest.raises(TokenizerError) as err:
            DocumentEncoder(tok, SeparatorPolicy(token), source="tokenizer runs/tok.json")
        msg = str(err.value)
        assert msg.startswith(
            f"tokenizer runs/tok.json: tokenizer.separator {token!r} is an ordinary vocabulary"
        )
        assert "not a special token" in msg
        assert f"set tokenizer.separator to one of its special tokens ['{SEP}', '{BOS}']" in msg
        assert f'add {token!r} to the tokenizer\'s added_tokens with "special": true' in msg


def test_the_advice_names_only_special_tokens_that_could_be_the_separator():
    """A sentencepiece-Unigram tokenizer (T5's, ALBERT's, converted): its special tokens are also
    model pieces, so plain text spells each. The refusal advised picking among all of them, the
    one refused included, and the unknown token (review R11b); none of them can be one."""
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
    )
    specials = ["<pad>", "</s>", "<unk>"]
    trainer = trainers.UnigramTrainer(
        vocab_size=400, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    tok.train_from_iterator(fixture_texts(120), trainer=trainer)
    for sep in ("</s>", "<pad>"):
        with pytest.raises(TokenizerError) as err:
            DocumentEncoder(tok, SeparatorPolicy(sep), source="t5.json")
        msg = str(err.value)
        assert "encodes to the separator id" in msg and "set tokenizer.separator to" not in msg, msg
        assert f"none of its special tokens {specials} can be one" in msg, msg
    # With one special token added that text cannot spell, the advice names it, and only it.
    tok.add_special_tokens([AddedToken("<|sep|>", special=True)])
    with pytest.raises(TokenizerError) as err:
        DocumentEncoder(tok, SeparatorPolicy("</s>"), source="t5.json")
    assert "set tokenizer.separator to another of its special tokens ['<|sep|>']" in str(err.value)
    assert DocumentEncoder(tok, SeparatorPolicy("<|sep|>")).encode("a </s> b")[-1] == tok.token_to_id(
        "<|sep|>"
    )


def test_separator_removed_from_added_tokens_is_refused(prose_tokenizer):
    # A tokenizer.json edited by hand: <|endoftext|> gone from added_tokens, still in the vocabulary.
    raw = json.loads(prose_tokenizer.to_str())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != SEP]
    assert raw["model"]["vocab"][SEP] == 0
    tok = Tokenizer.from_str(json.dumps(raw))
    assert tok.token_to_id(SEP) == 0
    with pytest.raises(
        TokenizerError, match=r"tokenizer.separator '<\|endoftext\|>' is an ordinary vocabulary"
    ):
        DocumentEncoder(tok, SeparatorPolicy(SEP), source="tok.json")


def test_special_separator_that_text_can_spell_is_refused(prose_tokenizer):
    # Special, but its string is also an ordinary token: plain "the" would encode to its id.
    tok = Tokenizer.from_str(prose_tokenizer.to_str())
    tok.add_special_tokens([AddedToken("the", special=True)])
    with pytest.raises(TokenizerError, match="literal text 'the' encodes to the separator id"):
        DocumentEncoder(tok, SeparatorPolicy("the"), source="tok.json")
    # The real separator passes every position of the probe.
    enc = DocumentEncoder(tok, SeparatorPolicy(SEP))
    for text in (SEP, f"x{SEP}y", f"{SEP} start", f"end {SEP}", SEP * 2):
        assert_one_separator(enc, enc.encode(text), "after")


@pytest.mark.parametrize("token, spelled", [("Ġand", " and"), ("ĊĠĠĠĠĠ", "\n     "), ("ä", None)])
def test_a_special_separator_named_as_its_byte_level_entry_is_refused_by_a_build(
    prose_tokenizer, token, spelled
):
    """A byte-level vocabulary entry ("Ġand" is " and", "ĊĊ" is a blank line, "ä" the lead byte of
    "中") made special: its string never encodes to it, so the probes passed, but the text it stands for
    does. The build ran every dedup stage, then failed in its tasks at the first document holding it
    (trial RV61c F1; the lead byte: review RV61f F2). A new build refuses it; a dataset built already,
    whose documents the per-document check passed, is read (its evals refused it: review RV61f F1)."""
    tok = Tokenizer.from_str(prose_tokenizer.to_str())
    tok.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    said = re.escape(repr(spelled)) if spelled else "'.*'"
    with pytest.raises(TokenizerError, match=f"literal text {said} encodes to the separator"):
        DocumentEncoder(tok, SeparatorPolicy(token), source="tok.json", building=True)
    enc = DocumentEncoder(tok, SeparatorPolicy(token), source="tok.json")  # as eval and finalize open it
    assert enc.separator_id == tok.token_to_id(token)


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_separator_that_is_the_unknown_token_is_refused(kind):
    """A model whose unknown token is the separator (GPT-2-era configs name <|endoftext|> as unk)
    gives it to every character it cannot spell: refused at start-up, not mid-build at the first
    such document with a fix that names the separator it already has."""
    from tokenizers import models, pre_tokenizers, trainers

    model, trainer = {
        "bpe": (models.BPE(unk_token=SEP), trainers.BpeTrainer),
        "unigram": (models.Unigram(), trainers.UnigramTrainer),
    }[kind]
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    extra = {"unk_token": SEP} if kind == "unigram" else {}
    tok.train_from_iterator(fixture_texts(60), trainer(vocab_size=300, special_tokens=[SEP, BOS], **extra))
    assert tok.token_to_id(SEP) in tok.encode("a ☃ b", add_special_tokens=False).ids
    with pytest.raises(TokenizerError) as err:
        DocumentEncoder(tok, SeparatorPolicy(SEP), source="tok.json")
    assert str(err.value) == (
        f"tok.json: its model's unknown token is tokenizer.separator '{SEP}', so every character outside "
        "its vocabulary encodes to the separator; set the model's unk_token to another token, or use a "
        "byte-level tokenizer (it has none)"
    )


def test_a_separator_listed_twice_in_a_unigram_vocab_is_named():
    # tokenizers' trainer, on text quoting "</s>", learned it as a piece beside the special one: the
    # refusal said none of its special tokens could be one, all of them special (trial RV71e 2)
    from tokenizers import AddedToken, models, pre_tokenizers

    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("a", -1.0), ("b", -1.0), ("</s>", -2.0)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    with pytest.raises(TokenizerError) as err:
        DocumentEncoder(tok, SeparatorPolicy("</s>"), source="tok.json")
    assert str(err.value) == (
        "tok.json: its model.vocab lists tokenizer.separator '</s>' 2 times (ids 2, 5: a piece its training "
        "learned from text that spells it), so text encodes to the separator; train the tokenizer again on "
        "text that does not spell it"
    )


def test_separator_count_error_names_the_key_and_tokenizer(prose_tokenizer):
    enc = DocumentEncoder(prose_tokenizer, SeparatorPolicy(SEP), source="tokenizer out/tokenizer.json")
    with pytest.raises(TokenizerError) as err:
        enc._frame([[3, 4], [enc.separator_id, 5]])  # what a tokenizer emitting the separator from text gives
    msg = str(err.value)
    assert "a document encoded to 2 separators" in msg
    assert f"tokenizer out/tokenizer.json emits tokenizer.separator '{SEP}' (id 0)" in msg


def test_a_normalizer_that_makes_the_separator_names_the_document():
    # the separator is special (start-up checks that): a normalizer that writes its string was told to
    # make it special, and the document was not named (trial RV71e 1)
    from tokenizers import AddedToken, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel({SEP: 0, "[UNK]": 1, "alpha": 2, "QQ": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.normalizer = normalizers.Sequence([normalizers.Replace(SEP, "ZZ"), normalizers.Replace("QQ", SEP)])
    tok.add_special_tokens([AddedToken(SEP, special=True)])
    enc = DocumentEncoder(tok, SeparatorPolicy(SEP), source="tok.json")
    assert [len(d) for d in enc.encode_batch(["alpha alpha"])] == [3]
    with pytest.raises(TokenizerError) as err:
        enc.encode_batch(["alpha", "alpha QQ alpha " + "x" * 100])
    assert str(err.value) == (
        f"a document encoded to 2 separators: tok.json emits tokenizer.separator '{SEP}' (id 0) from "
        "plain text, the document that begins 'alpha QQ alpha " + "x" * 45 + "…' (its normalizer, "
        "pre-tokenizer or vocabulary turns text into the separator); fix the tokenizer so no text becomes "
        "it, or set tokenizer.separator to another of its special tokens"
    )


def test_existing_directory_without_tokenizer_json_is_not_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokdir").mkdir()
    # Were it looked up on the hub, offline this fails at once (instead of ~30 s of retries).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError) as err:
        load_tokenizer("tokdir")
    assert str(err.value).startswith("directory tokdir holds no tokenizer.json; set tokenizer.path")
    assert "hub" not in str(err.value)
    assert time.perf_counter() - t0 < 5


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


def test_ids_past_the_token_count_set_the_vocab_size_and_survive_the_shard_dtype(prose_tokenizer):
    """A tokenizer of 512 tokens whose "Ġthe" has id 65,602: the vocab size is the highest id + 1, so
    the shards' dtype holds every id (counting tokens chose uint16, which stored 65,602 as 66: "a")."""
    spec = json.loads(prose_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    vocab["Ġthe"] = 65536 + vocab["a"]
    gapped = Tokenizer.from_str(json.dumps(spec))
    enc = DocumentEncoder(gapped, SeparatorPolicy(SEP))
    assert enc.vocab_size == 65536 + vocab["a"] + 1
    ids = enc.encode("the cat and the dog")
    assert 65536 + vocab["a"] in ids.tolist()
    stored = ids.astype(dtype_for_vocab(enc.vocab_size))
    assert stored.tolist() == ids.tolist()


def test_a_tokenizer_saved_with_truncation_padding_or_dropout_encodes_whole_documents(prose_tokenizer):
    """A tokenizer.json can carry settings for other uses (enable_truncation/enable_padding, BPE
    dropout): documents were cut to max_length, padded with pad ids, or merged at random, and
    validation (one separator per document) passed."""
    texts = [" ".join(fixture_texts()[:3]), "the cat"]
    plain = [
        ids.tolist() for ids in DocumentEncoder(prose_tokenizer, SeparatorPolicy(SEP)).encode_batch(texts)
    ]
    assert len(plain[0]) > 40
    spec = json.loads(prose_tokenizer.to_str())
    spec["model"]["dropout"] = 0.5
    carrying = Tokenizer.from_str(json.dumps(spec))
    carrying.enable_truncation(16)
    carrying.enable_padding(pad_id=prose_tokenizer.token_to_id(BOS), pad_token=BOS)
    enc = DocumentEncoder(carrying, SeparatorPolicy(SEP))
    for _ in range(3):  # dropout would draw other merges each time
        assert [ids.tolist() for ids in enc.encode_batch(texts)] == plain


@pytest.mark.parametrize("run", ["x", " ", "\n", "7", "-", "\x1c!"])  # \x1c: not White_Space (RV72e F5)
def test_training_reads_a_long_run_of_one_class_to_its_first_thousand_characters(run):
    """The trainer's time grows with the square of a pre-token's length: one document of "x" * 2,000,000
    held `tokenizer train` over half an hour (trial RV72b F3), and so did spaces (review RV72d F2). Runs
    of one class (letters, digits, whitespace, the rest) are cut at LONG_RUN characters for training: no
    token learned is longer (uncut, 5,000 of them give one of 2,048), and a build encodes the whole text.
    Text of other classes in between, a CJK paragraph's punctuation, is kept (review RV72d F3)."""
    from tokenization.tokenizer_io import LONG_RUN

    tok = train_bpe([f"a {run * 5000} b", "and some words"], 300, [SEP])
    longest = max(tok.get_vocab(), key=len)
    assert len(longest) <= LONG_RUN, len(longest)
    encoder = DocumentEncoder(tok, SeparatorPolicy(SEP))
    assert tok.decode(encoder.encode(run * 5000)[:-1].tolist()) == run * 5000
    # no space in 2,800 characters, but runs of 6 letters: "山水風景" only past the 1,000th, learned from
    paragraph = "，".join(["蝴蝶鸚鵡琵琶"] * 200 + ["山水風景"] * 200)
    tok = train_bpe([paragraph], 300, [SEP])
    assert len(tok.encode("山水風景").ids) < len("山水風景".encode())


def test_a_new_build_refuses_a_model_that_cannot_encode_what_it_cannot_spell():
    """A BPE whose unk_token is not in its vocabulary, or a Unigram without unk_id, fails on the first
    text it cannot spell: a new build's traceback at its separator check, or a task's "Encountered an
    unknown token but 'unk_id' is missing" naming no file (re-trial RV72e F3). One line before any task."""
    from tokenizers import models

    bpe = Tokenizer(models.BPE(vocab={SEP: 0, "a": 1, "b": 2}, merges=[], unk_token="<missing>"))
    unigram = Tokenizer(models.Unigram([(SEP, 0.0), ("a", -1.0), ("b", -1.0)]))
    # byte fallback without its <0xNN> pieces, as the refusal's advice once offered: a traceback (RV73c 3)
    fallback = Tokenizer(models.Unigram([(SEP, 0.0), ("a", -1.0), ("b", -1.0)], byte_fallback=True))
    for tok, says in [
        (bpe, "its model's unk_token '<missing>' is not in its vocabulary, so the first text it cannot"),
        (unigram, "its Unigram model has no unk_id, so the first text outside its pieces stops the build"),
        (fallback, "encoding '一', a character its vocabulary lacks, fails (Encountered an unknown token"),
    ]:
        tok.add_special_tokens([SEP])
        with pytest.raises(TokenizerError, match=re.escape(f"the tokenizer: {says}")):
            DocumentEncoder(tok, SeparatorPolicy(SEP), building=True)


def test_a_unigram_s_unknown_token_is_the_piece_its_unk_id_names():
    """A Unigram's vocabulary may list a piece twice; looked up by name, its unknown token was the last
    copy, where the model gives the unk_id one, and the build kept texts holding it (review RV73c 2)."""
    from tokenizers import models

    pieces = [("<unk>", 0.0), ("a", -1.0), ("b", -1.0), ("<unk>", -1.5)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=0))
    tok.add_special_tokens([SEP])
    encoder = DocumentEncoder(tok, SeparatorPolicy(SEP), building=True)
    assert tok.encode("a中b").ids == [1, 0, 2] and encoder.unk_id == 0, encoder.unk_id


def test_a_new_build_refuses_a_model_that_drops_what_it_cannot_spell():
    """A BPE with no unk_token, byte fallback or ByteLevel deletes the characters its alphabet lacks:
    "Zebra river" was stored as "e b r a river", validation OK (re-trial RV72e F1). One line before any
    task; byte-level and unk-giving models pass."""
    import string

    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # its alphabet holds a few characters of other scripts, not all: four fixed probes missed it (RV73c 1)
    texts = TEXTS * 5 + ["€ 中 ж 😀"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=200, special_tokens=[SEP]))
    assert tok.encode("一").ids == []  # gone without a trace
    with pytest.raises(TokenizerError, match=re.escape("the tokenizer: it encodes '一' to no token at all")):
        DocumentEncoder(tok, SeparatorPolicy(SEP), building=True)
    # Some token is not enough: a Metaspace BPE gave '一' as '▁' alone (re-trial RV73d 1)
    letters = ["▁", *string.ascii_letters, *string.digits]
    meta = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(letters)}, merges=[]))
    meta.pre_tokenizer, meta.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    says = "the tokenizer: it encodes '一' to tokens that do not spell it ('▁') (no unknown token"
    # A byte alphabet or byte fallback lacking bytes: one probe tries three (re-trial RV73d 2)
    partial = Tokenizer(models.BPE())
    partial.pre_tokenizer, partial.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
    partial.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=[SEP]))
    some = {**{c: i for i, c in enumerate(letters)}, "<0xE4>": 63}
    fallback = Tokenizer(models.BPE(vocab=some, merges=[], byte_fallback=True))
    for bad, said in [
        (meta, says),
        (partial, "the tokenizer: its byte-level alphabet lacks "),
        (fallback, "the tokenizer: its byte fallback lacks 242 of the 243 bytes of UTF-8 text (0x00, 0x01"),
    ]:
        bad.add_special_tokens([SEP])
        with pytest.raises(TokenizerError, match=re.escape(said)):
            DocumentEncoder(bad, SeparatorPolicy(SEP), building=True)
    # and sound ones pass: Llama-2's kind (Metaspace, byte fallback whole), WordPiece's [UNK]
    pieces = {f"<0x{b:02X}>": len(letters) + b for b in range(256)}
    whole = {**{c: i for i, c in enumerate(letters)}, **pieces}
    llama = Tokenizer(models.BPE(vocab=whole, merges=[], byte_fallback=True))
    llama.pre_tokenizer, llama.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, **{c: i + 1 for i, c in enumerate(letters)}}))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    # the bytes UTF-8 text never holds (0xC0, 0xC1, 0xF5–0xFF) need no piece: they were refused (RV73e 4)
    utf8 = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]
    some_bytes = {
        **{c: i for i, c in enumerate(letters)},
        **{f"<0x{b:02X}>": len(letters) + i for i, b in enumerate(utf8)},
    }
    text_bytes = Tokenizer(models.BPE(vocab=some_bytes, merges=[], byte_fallback=True))
    # a byte-level BPE without its decoder: its tokens read as bytes spell the character (review RV73g 5)
    undecoded = train_bpe(TEXTS, 300, [SEP])
    undecoded.decoder = decoders.Fuse()
    for sound in (llama, wordpiece, text_bytes, undecoded):
        sound.add_special_tokens([SEP])
        DocumentEncoder(sound, SeparatorPolicy(SEP), building=True)
    DocumentEncoder(train_bpe(TEXTS, 300, [SEP]), SeparatorPolicy(SEP), building=True)


def test_a_separator_that_is_a_piece_of_a_unigram_model_is_refused_naming_that():
    """tokenizers' UnigramTrainer keeps each special token as a piece of model.vocab, which the model
    matches in plain text: the refusal advised making it a special added token, which it was (trial
    RV73f 2). The cause is named, with advice that applies."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    texts = ["the river runs to the sea and a zebra drinks", "hello world, a test of the unigram model"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(
        texts * 50, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", SEP], unk_token="<unk>")
    )
    said = (
        "it is piece 1 of its Unigram model.vocab (tokenizers' UnigramTrainer keeps one for each special "
        "token), which the model matches in plain text; "
    )
    with pytest.raises(TokenizerError, match=re.escape(said)) as e:
        DocumentEncoder(tok, SeparatorPolicy(SEP), building=True)
    fix = ", or use a byte-level BPE (`gristmill tokenizer train`) or a Unigram whose model.vocab holds"
    assert fix in str(e.value), e.value
