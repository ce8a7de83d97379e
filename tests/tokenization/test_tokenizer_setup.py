"""The tokenizer a build starts from: checked before any task, found locally when it is local, and
trained without ever replacing a tokenizer file someone else wrote meanwhile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest

from pipelines.config import DataConfig
from pipelines.tokenizer_train import train_tokenizer
from tests.helpers.build_runs import build_argv, one_error
from tests.helpers.corpus import SEP, fixture_texts, train_fixture_tokenizer
from tokenization.tokenizer_io import TokenizerError, hub_name_shadowed, load_tokenizer, tokenizer_file
from training.contract.config_loader import load_config

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]


def test_ordinary_token_as_separator_stops_the_build_before_any_task(build_fixture, tmp_path, capsys):
    # "the" is a token of the fixture tokenizer, and " the" another: a probe of "a the b" alone
    # let the build start, and its first task died on a document with "the" in it.
    _, tokenizer, config = build_fixture
    assert load_tokenizer(tokenizer).token_to_id("the") is not None
    out = tmp_path / "o"
    msg = one_error(capsys, build_argv(config, out, 'tokenizer.separator="the"'))
    assert msg.startswith(
        f"error: tokenizer {tokenizer}: tokenizer.separator 'the' is an ordinary vocabulary token"
    )
    assert f"set tokenizer.separator to one of its special tokens ['{SEP}'" in msg
    assert not out.exists()  # no task ran, and nothing is left to refuse the corrected config


@pytest.mark.parametrize("edit", ["alias", "moved"])
def test_a_vocab_giving_one_id_to_two_tokens_stops_the_build_before_any_task(
    build_fixture, tmp_path, capsys, edit
):
    """A tokenizer.json whose model.vocab gives one id to two tokens (an alias added, or a token's id
    set to another's): the encoder's private copy lost one of them, and the build ended in a 25-line
    traceback ("Token … out of vocabulary") or with every task failed (found by E41a beside review
    RV34c). One line naming the id, its tokens and the file, before any task."""
    _, tokenizer, config = build_fixture
    spec = json.loads(Path(tokenizer).read_text())
    vocab = spec["model"]["vocab"]
    token = next(t for t in vocab if len(t) > 2 and t != SEP)
    other = "zzz0" if edit == "alias" else next(t for t in vocab if len(t) > 2 and t not in (token, SEP))
    vocab[other] = vocab[token]
    edited = tmp_path / "tokenizer.json"
    edited.write_text(json.dumps(spec))
    out = tmp_path / "o"
    msg = one_error(capsys, build_argv(config, out, f"tokenizer.path={json.dumps(str(edited))}"))
    assert msg.startswith(
        f"error: tokenizer {edited}: its model.vocab gives one id to several tokens (id "
    ), msg
    assert repr(other) in msg and repr(token) in msg, msg
    assert msg.endswith(f"give each id of model.vocab one token in {edited}"), msg
    assert not out.exists()


def test_an_added_token_loaded_at_a_vocab_tokens_id_stops_the_build_before_any_task(
    build_fixture, tmp_path, capsys
):
    """The separator dropped from model.vocab, its added_tokens entry kept (at any id): tokenizers gives
    it the id after model.vocab's count, which, the vocab's ids having a gap, is another token's. The
    build started, and its first task stopped on plain text encoding to the separator, advising the
    special token it already was (trial RV70c 3). One line naming the id, its tokens and the file."""
    _, tokenizer, config = build_fixture
    spec = json.loads(Path(tokenizer).read_text())
    del spec["model"]["vocab"][SEP]
    next(t for t in spec["added_tokens"] if t["content"] == SEP)["id"] = 70000
    edited = tmp_path / "tokenizer.json"
    edited.write_text(json.dumps(spec))
    out = tmp_path / "o"
    msg = one_error(capsys, build_argv(config, out, f"tokenizer.path={json.dumps(str(edited))}"))
    last = max(spec["model"]["vocab"], key=spec["model"]["vocab"].get)
    assert msg.startswith(
        f"error: tokenizer {edited}: as tokenizers loads it, its vocabulary gives one id to several tokens "
        f"(id {len(spec['model']['vocab'])}: "
    ), msg
    assert repr(SEP) in msg and repr(last) in msg, msg
    assert msg.endswith(f"add each added token to model.vocab at an id of its own in {edited}"), msg
    assert not out.exists()


def test_local_directory_without_tokenizer_json_is_one_line(build_fixture, tmp_path, capsys, monkeypatch):
    _, _, config = build_fixture
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tokdir_empty").mkdir()
    # Were it looked up on the hub, offline fails at once rather than after ~30 s of retries.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "tokenizer.path=tokdir_empty"))
    assert msg.startswith("error: directory tokdir_empty holds no tokenizer.json; set tokenizer.path")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "override, says",
    [
        ("tokenizer.train.min_frequency=-1", "tokenizer.train.min_frequency = -1 must be ≥ 0"),  # a traceback
        ("tokenizer.train.sample_docs=0", "tokenizer.train.sample_docs = 0 must be ≥ 1"),
        ('tokenizer.path=""', "tokenizer.path is empty; set it"),  # "error: . already exists"
        (  # one entry in the vocabulary, two in the room for merges' count (an older lead of RV72b)
            'tokenizer.train.special_tokens=["<|endoftext|>", "<|pad|>", "<|endoftext|>"]',
            "tokenizer.train.special_tokens names '<|endoftext|>' more than once; list each once",
        ),
    ],
)
def test_tokenizer_training_values_that_cannot_train_are_one_line(
    build_fixture, tmp_path, capsys, override, says
):
    from pipelines.cli import main

    _, _, config = build_fixture
    capsys.readouterr()
    assert main(["tokenizer", "train", "--config", str(config), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err, err


@pytest.mark.parametrize(
    "override, says",
    [
        ("filters.min_chars=-1", "filters.min_chars = -1: documents with fewer characters are dropped"),
        ("filters.max_chars=10", "filters.min_chars = 20 is more than filters.max_chars = 10"),
        ("filters.min_language_score=nan", "filters.min_language_score = nan: documents whose"),  # RV72c F1
    ],
)
def test_tokenizer_training_refuses_the_filters_the_build_refuses(
    build_fixture, tmp_path, capsys, override, says
):
    """Review R27d m2: sampling goes through the build's [filters], whose lengths only the build
    checked; min_chars = -1 trained a tokenizer and exited 0. Now the same one line as the build."""
    from pipelines.cli import main

    _, _, config = build_fixture
    out = tmp_path / "tokenizer.json"
    capsys.readouterr()
    assert main(["tokenizer", "train", "--config", str(config), "--out", str(out), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "separator, other, says",
    [
        (
            "a",
            None,
            "tokenizer.train.special_tokens: plain text spells 'a' (a byte-level vocabulary's character",
        ),
        (
            "Ġ",
            None,
            "tokenizer.train.special_tokens: plain text spells 'Ġ' (a byte-level vocabulary's character",
        ),
        (
            "the",
            None,
            "tokenizer.train.special_tokens: plain text spells 'the' (text, not a marker in <…> or",
        ),
        ("==", None, "the trained tokenizer cannot frame documents: literal text "),  # a merge's
        (
            "<|endoftext|>",
            "a",
            "tokenizer.train.special_tokens: plain text spells 'a' (a byte-level vocabulary's ",
        ),
        ("<|endoftext|>", " ", "tokenizer.train.special_tokens: plain text spells ' ' (whitespace or "),
        ("<|endoftext|>", "==", "tokenizer.train.special_tokens: plain text spells '==' (literal text "),
        # a word: transformers split "river" out of every text holding it, the build kept it (RV73f 1)
        ("<|endoftext|>", "river", "tokenizer.train.special_tokens: plain text spells 'river' (text, not a"),
        (
            "<|endoftext|>",
            "e.g.",
            "tokenizer.train.special_tokens: plain text spells 'e.g.' (text, not a",
        ),  # RV73h 1
        (
            "<|endoftext|>",
            "river bank",
            "tokenizer.train.special_tokens: plain text spells 'river bank' (text",
        ),
        ("<|endoftext|>", "€", "tokenizer.train.special_tokens: plain text spells '€' (one character)"),
    ],
)
def test_a_trained_tokenizer_with_a_special_token_plain_text_spells_is_never_written(
    build_fixture, tmp_path, capsys, separator, other, says
):
    """A special token the byte alphabet holds ("a", or byte-level BPE's "Ġ" for a space) shares that
    byte's id: as the separator, training saved it, exit 0, and every build then refused it (trial
    RV71e 8); beside it, an export's tokenizer (transformers splits special tokens out of text) encoded
    every "a" otherwise than the shards hold it (trial RV72b F2). Refused before anything is written."""
    from pipelines.cli import main

    _, _, config = build_fixture
    out = tmp_path / "tokenizer.json"
    specials = [separator] + ([other] if other is not None else [])
    sets = [f"tokenizer.separator={separator!r}", f"tokenizer.train.special_tokens={specials!r}"]
    capsys.readouterr()
    argv = ["tokenizer", "train", "--config", str(config), "--out", str(out), "--set", *sets]
    assert main([*argv, "tokenizer.train.vocab_size=400"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {says}"), err
    if says.startswith("the trained"):
        assert f"encodes to the separator id 0 (tokenizer.separator {separator!r})" in err, err
    assert "nothing was written" in err and "\n" not in err, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_training_never_writes_a_local_file_under_a_hub_repo_s_name(
    build_fixture, tmp_path, capsys, monkeypatch
):
    """Review R16f F1: `tokenizer train` with tokenizer.path a hub id wrote ./org/name/tokenizer.json,
    which every later build started in that folder read instead of the hub's, saying nothing."""
    from pipelines.cli import main

    _, _, config = build_fixture
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["tokenizer", "train", "--config", str(config), "--set", "tokenizer.path=org/name"]) == 2
    err = capsys.readouterr().err.strip()
    said = "error: tokenizer.path = 'org/name' names a tokenizer on the Hugging Face hub"
    assert err.startswith(said) and "pass --out DIR" in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "org" / "name").mkdir(parents=True)  # one an earlier version wrote: the build says so
    assert hub_name_shadowed("org/name") and not hub_name_shadowed("./org/name")
    (tmp_path / "runs" / "tokenizers" / "mine").mkdir(parents=True)  # no hub id's shape: no note (R16h)
    assert not hub_name_shadowed("runs/tokenizers/mine")
    (tmp_path / "gpt2").mkdir()  # a hub id without an org (R16i F6)
    assert hub_name_shadowed("gpt2")
    (tmp_path / "org" / "name@v1").mkdir()  # a hub id with a revision (R25g 5)
    assert hub_name_shadowed("org/name@v1") and not hub_name_shadowed("org/name@v2")


def test_training_never_writes_into_a_model_s_folder_and_a_file_for_a_folder_is_one_line(
    build_fixture, tmp_path, capsys
):
    """Trial RV60b 5: `tokenizer train` into a base model's folder (its config.json, or a SentencePiece
    tokenizer.model the build refuses to read) wrote a new tokenizer.json there, which later builds
    and runs took for the base's own. One line, nothing written; a folder of its own trains."""
    _, _, config = build_fixture
    for held in ("config.json", "tokenizer.model"):
        model = tmp_path / held.replace(".", "-")
        model.mkdir()
        (model / held).write_text("{}")
        said = (
            f"error: {model} holds a model ({held}): a tokenizer trained into it would pass for that "
            "model's own; write it into a folder of its own (tokenizer.path, or --out)"
        )
        for out in (model, model / "tokenizer.json"):
            argv = ["tokenizer", "train", "--config", str(config), "--out", str(out)]
            assert one_error(capsys, argv) == said
        assert sorted(p.name for p in model.iterdir()) == [held]
    # a dataset's folder, or a build's from its first task on: --force replaced the tokenizer its shards
    # were built with (trial RV64b L2)
    for held in ("dataset.json", "build.json"):
        data = tmp_path / held.replace(".", "-")
        data.mkdir()
        (data / held).write_text("{}")
        (data / "tokenizer.json").write_text("the build's")
        argv = [
            "tokenizer",
            "train",
            "--config",
            str(config),
            "--force",
            "--out",
            str(data / "tokenizer.json"),
        ]
        assert one_error(capsys, argv) == (
            f"error: {data} holds a dataset ({held}), whose tokenizer.json is the one its shards were built "
            "with; write a new tokenizer into a folder of its own (tokenizer.path, or --out)"
        )
        assert (data / "tokenizer.json").read_text() == "the build's"
    # a folder it cannot write: one line, not the tokenizers library's bare Exception (trial RV64b T1)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        argv = ["tokenizer", "train", "--config", str(config), "--out", str(locked / "t.json")]
        if os.geteuid() != 0:  # root writes anywhere: /proc is a folder no one writes a file into
            assert one_error(capsys, argv).startswith(f"error: cannot write {locked / 't.json'} (")
        argv[-1] = "/proc/t.json"
        assert one_error(capsys, argv).startswith("error: cannot write /proc/t.json (")
    finally:
        locked.chmod(0o700)
    # a file where the folder goes: one line naming it, not FileExistsError's traceback (trial RV60b 6)
    (tmp_path / "a-file").write_text("")
    argv = ["tokenizer", "train", "--config", str(config), "--out", str(tmp_path / "a-file")]
    assert one_error(capsys, argv).startswith(
        f"error: {tmp_path / 'a-file'}: File exists (FileExistsError); fix that path"
    )


def test_a_tokenizer_path_under_home_is_one_file_to_training_and_reading(
    build_fixture, tmp_path, monkeypatch
):
    """Review R16f F2: the build expanded `~` in tokenizer.path, training and reading did not: each
    build trained again into a folder named `~` where it ran, and two datasets got two vocabularies."""
    _, _, config = build_fixture
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    written = train_tokenizer(train_config(config, Path("~/tok.json")))
    assert written == tmp_path / "home" / "tok.json" and written.is_file()
    assert tokenizer_file("~/tok.json") == written and not (tmp_path / "~").exists()


def test_a_reused_tokenizer_unlike_the_training_settings_is_said(build_fixture, tmp_path):
    """Review R16f F5: a build reusing tokenizer.path said only "exists: using it", though the
    recipe's [tokenizer.train] (recorded in the dataset's config.toml) asked another vocabulary."""
    from pipelines.tokenizer_train import reuse_line

    _, _, config = build_fixture
    tok = train_tokenizer(train_config(config, tmp_path / "tok.json", vocab_size=400))
    assert "note:" not in reuse_line(tok, train_config(config, tok, vocab_size=400))
    line = reuse_line(tok, train_config(config, tok, vocab_size=16384))
    assert "; note: it was trained with vocab_size = 400, not tokenizer.train.vocab_size = 16,384" in line
    assert "exists: using it, trained on this source (" in line
    # another file copied over it, the record left beside it: the record vouched for it, "trained on
    # this source", and its vocab_size was said to be the file's (trial RV66b F4)
    shutil.copyfile(train_fixture_tokenizer(tmp_path / "other.json", fixture_texts(40)), tok)
    line = reuse_line(tok, train_config(config, tok, vocab_size=16384))
    assert "trained on this source" not in line and "trained with vocab_size = 400" not in line, line
    assert "is not recorded: tok.json.trained.json beside it is another file's, " in line


def train_config(config: Path, out: Path, vocab_size: int = 400, source: Path | None = None) -> DataConfig:
    overrides = [f"tokenizer.path={out}", f"tokenizer.train.vocab_size={vocab_size}"]
    if source is not None:
        overrides.append(f"source.path={source}")
    return load_config(DataConfig, config, overrides)


def test_training_never_replaces_a_tokenizer_that_appeared_meanwhile(build_fixture, tmp_path):
    # What a second build training the same missing tokenizer.path meets when it saves: the file
    # the first one wrote (and may already have built a dataset with).
    _, _, config = build_fixture
    out = tmp_path / "newtok.json"
    theirs = train_fixture_tokenizer(out, fixture_texts(40)).read_bytes()
    with pytest.raises(TokenizerError) as err:
        train_tokenizer(train_config(config, out), log=lambda *a: None)
    assert str(err.value).startswith(f"{out} appeared while this tokenizer was being trained")
    assert "rerun to use it, or set tokenizer.path to another file" in str(err.value)
    assert out.read_bytes() == theirs  # left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newtok.json"]  # no temporary file left

    # The same bytes (the same recipe trained twice): the file already there is used, untouched.
    same = tmp_path / "same" / "tok.json"
    train_tokenizer(train_config(config, same), log=lambda *a: None)
    inode = same.stat().st_ino
    logged = []
    assert train_tokenizer(train_config(config, same), log=logged.append) == same
    assert same.stat().st_ino == inode  # not replaced by a copy
    assert "appeared meanwhile with the same bytes" in logged[-1]
    assert sorted(p.name for p in same.parent.iterdir()) == ["tok.json", "tok.json.trained.json"]


RACE = """
import sys
from pipelines.config import DataConfig
from pipelines.tokenizer_train import train_tokenizer
from tokenization.tokenizer_io import TokenizerError
from training.contract.config_loader import load_config
cfg = load_config(DataConfig, sys.argv[1], sys.argv[2:])
sys.stdin.read()  # both processes start training together
try:
    train_tokenizer(cfg, log=lambda *a: None)
except TokenizerError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


def test_two_trainings_of_the_same_missing_file_race_safely(build_fixture, tmp_path):
    # Two processes train different tokenizers (vocab 400 and 450) for the same path at once: one
    # writes it, the other finds it there when it saves and refuses; neither replaces the other's.
    _, _, config = build_fixture
    out = tmp_path / "newtok.json"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACE,
                str(config),
                f"tokenizer.path={out}",
                f"tokenizer.train.vocab_size={v}",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for v in (400, 450)
    ]
    for p in procs:
        p.stdin.write("go")
        p.stdin.close()
    rcs = [p.wait(timeout=300) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert sorted(rcs) == [0, 2], errs
    winner, loser = (400, 450) if rcs[0] == 0 else (450, 400)
    assert "appeared while this tokenizer was being trained" in errs[rcs.index(2)]
    assert json.loads(out.read_text())["model"]["vocab"]  # a whole tokenizer.json
    assert load_tokenizer(out).get_vocab_size() == winner != loser
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newtok.json", "newtok.json.trained.json"]
