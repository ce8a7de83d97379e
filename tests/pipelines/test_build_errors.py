"""Bad inputs: each is ONE clear error line naming the file or key and the fix, before any task runs.

Bad documents (empty, non-UTF-8, literal separator text) are not errors: they are excluded with a
reason or kept as text; see test_build.py and test_sources.py.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil

import huggingface_hub.constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from pipelines.build import BuildError, _check_jsonl_keys, _check_parquet_columns, build
from pipelines.cli import main
from pipelines.config import DataConfig
from pipelines.sources import list_source_files
from pipelines.tokenize_shard import DiskFullError, TokenizeShard
from tests.helpers import forked
from tests.helpers.build_runs import assert_task_failure_is_one_error, build_argv, one_error
from tests.helpers.corpus import SEP, fixture_texts
from tokenization.separator import DocumentEncoder, SeparatorPolicy
from tokenization.tokenizer_io import TokenizerFile, load_tokenizer, train_bpe
from training.contract import dataset_index
from training.contract.config_loader import load_config
from training.contract.dataset_format import DOCUMENTS_SUM, file_sha256, read_dataset_info, write_dataset_info

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def test_config_typos_name_the_key(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "build.wrokers=2"))
    assert "unknown key 'build.wrokers'" in msg and "did you mean 'build.workers'" in msg
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace("[filters]", "[filters]\nmin_int_scor = 3"))
    msg = one_error(capsys, build_argv(bad, tmp_path / "o"))
    assert str(bad) in msg and "unknown key 'filters.min_int_scor'" in msg
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "build.executor=kubernetes"))
    assert "build.executor = 'kubernetes' is not allowed" in msg
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "shards.target_mb=0"))
    assert "shards.target_mb = 0" in msg and "set it > 0" in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "override, says",
    [
        ("build.progress_interval=0", "build.progress_interval = 0.0: seconds between progress lines"),
        ("build.progress_interval=nan", "build.progress_interval = nan: seconds between progress lines"),
        ("shards.target_mb=inf", "shards.target_mb = inf: a shard is closed once it reaches this size"),
        ('output=""', 'output = "": name the dataset\'s directory (or s3:// URL)'),
        ('output="   "', 'output = "   ": blanks are no path; name one'),  # quoted as "" (trial RV72c)
        # the working directory's files were built, exit 0 (trial RV75c 1)
        ('source.path=""', 'source.path = "": name the corpus\'s folder (or file), e.g. source.path = '),
        # every stage ran, then "no document survived", naming filters, not the key; or a task's
        # ValueError; both after build.json, so the corrected rerun was refused (review R22b F6)
        ("source.limit=0", "source.limit = 0: documents read per task, at most; set it ≥ 1, or -1 for all"),
        ("source.limit=-5", "source.limit = -5: documents read per task"),
        ("shards.seed=-1", "shards.seed = -1: the shuffle's seed; set it ≥ 0"),
        # a no-op, accepted without a word (review R27a m6); or nothing kept, found after every stage ran
        (
            "filters.min_chars=-1",
            "filters.min_chars = -1: documents with fewer characters are dropped; set it ≥ 0",
        ),
        (
            "filters.max_chars=0",
            "filters.max_chars = 0: documents with more characters are dropped, every one",
        ),
        (
            "filters.max_chars=10",
            "filters.min_chars = 20 is more than filters.max_chars = 10: no document would",
        ),
        # nan compares false: every scored document kept, the filter silently off (trial RV72c F1)
        (
            "filters.min_language_score=nan",
            "filters.min_language_score = nan: documents whose language_score is lower are dropped; set "
            "it to a finite number, or leave it out for no threshold",
        ),
        ("filters.min_score=nan", "filters.min_score = nan: documents whose score is lower are dropped"),
        ("filters.min_score=-inf", "filters.min_score = -inf: documents whose score is lower are dropped"),
        (
            "filters.min_language_score=1.5",
            "filters.min_language_score = 1.5: language_score is fastText's confidence, from 0 to 1; set "
            "it between 0 and 1",
        ),
        # the free-disk guard off without a word; a tokenizer call per document (trial RV72c F3)
        (
            "build.min_free_gb=nan",
            "build.min_free_gb = nan: GB the build leaves free on the output's filesystem; set it ≥ 0 and "
            "finite",
        ),
        ("build.min_free_gb=-1", "build.min_free_gb = -1.0: GB the build leaves free"),
        (
            "shards.encode_batch_chars=0",
            "shards.encode_batch_chars = 0: characters handed to the tokenizer per call; set it ≥ 1",
        ),
        # a ~ that names no home: "RuntimeError: Could not determine home directory", a traceback (trial
        # RV73a 4); the recipe keeps a path as written (its identity hashes it so), the build expands it
        *[
            (f'{key}="~no-such-user-here/x"', f'{key} = "~no-such-user-here/x": ~no-such-user-here names no')
            for key in ("output", "source.path", "tokenizer.path", "build.workdir")
        ],
    ],
)
def test_values_that_cannot_build_are_one_line_first(
    build_fixture, tmp_path, monkeypatch, capsys, override, says
):
    """progress_interval 0 or nan: a busy loop printing a line per turn (929 lines in a 5 s build);
    target_mb inf: a traceback; output "": the working directory got the dataset's files."""
    _, _, config = build_fixture
    monkeypatch.chdir(tmp_path)  # where output = "" went
    msg = one_error(capsys, build_argv(config, tmp_path / "o", override))  # a later output= wins
    assert says in msg, msg
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_source(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'nowhere'}"))
    assert f"source.path {tmp_path / 'nowhere'} does not exist" in msg
    (tmp_path / "empty").mkdir()
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'empty'}"))
    assert "holds no files matching '**/*.parquet'" in msg
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.parquet").write_text("not parquet")
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'junk'}"))
    assert "x.parquet is not a readable parquet file" in msg
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "source.text_key=body"))
    assert "has no column 'body'" in msg and "set source.text_key" in msg
    msg = one_error(
        capsys, build_argv(config, tmp_path / "o", "source.id_key=idd")
    )  # ids replaced (R22a A10)
    assert (
        msg.startswith("error: no input file holds source.id_key = 'idd' (") and "has no column 'idd'" in msg
    )
    (
        tmp_path / "ids"
    ).mkdir()  # one file of two holds it: the other's documents are named <file>/<row> (R22d M4)
    pq.write_table(pa.table({"text": ["A."], "doc_id": ["x"]}), tmp_path / "ids" / "a.parquet")
    pq.write_table(pa.table({"text": ["B."]}), tmp_path / "ids" / "b.parquet")
    ids = load_config(DataConfig, config, [f"source.path={tmp_path / 'ids'}", "source.id_key=doc_id"])
    _check_parquet_columns(ids, list_source_files(ids.source))
    (tmp_path / "strs").mkdir()
    pq.write_table(pa.table({"text": ["A document."], "int_score": ["4"]}), tmp_path / "strs" / "s.parquet")
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'strs'}"))
    assert msg.startswith(
        f"error: {tmp_path / 'strs' / 's.parquet'}: column 'int_score' holds string, not numbers"
    )
    # a text column of a type with no text: json.dumps of a document's metadata ended the task
    (tmp_path / "lists").mkdir()
    dump = pa.array([["CC-MAIN-2024-10"]])
    pq.write_table(pa.table({"text": ["A document."], "dump": dump}), tmp_path / "lists" / "d.parquet")
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'lists'}"))
    assert msg.startswith(f"error: {tmp_path / 'lists' / 'd.parquet'}: column 'dump' holds list<"), msg
    assert msg.endswith(": string>, not text; cast it to string or drop it"), msg
    # a column the reader reads, twice: its task called the file damaged, "re-download it" (RV71e 4)
    (tmp_path / "twice").mkdir()
    twice = pa.Table.from_arrays([pa.array(["A document."]), pa.array(["B."])], names=["text", "text"])
    pq.write_table(twice, tmp_path / "twice" / "t.parquet")
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"source.path={tmp_path / 'twice'}"))
    said = "holds column 'text' 2 times; keep one of them (or rename the others)"
    assert msg == f"error: {tmp_path / 'twice' / 't.parquet'} {said}"
    assert not (tmp_path / "o").exists()


def test_a_dataset_built_inside_its_source_folder_is_not_read_as_input(build_fixture, tmp_path, capsys):
    """Built into source.path/out, the dataset's manifest and excluded files were listed as input by
    the rerun (a refusal advising another text_key) and by any next build. The rerun leaves its own
    output out; another build names the dataset it would have read."""
    corpus, _, config = build_fixture
    src = tmp_path / "src"
    shutil.copytree(corpus, src)
    argv = build_argv(config, src / "out", f"source.path={src}", "build.tasks=1", "build.workers=1")
    for _ in range(2):  # the build, then its rerun (which finds every task done)
        assert main(argv) == 0
    msg = one_error(capsys, build_argv(config, tmp_path / "new", f"source.path={src}"))
    assert (
        msg.startswith(f"error: source.path {src} holds out/excluded/")
        and ", a file of the gristmill dataset out " in msg
    )
    assert not (tmp_path / "new").exists()


def test_jsonl_source_checked_before_any_task(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"body": "A document.", "id": "x"}\n')
    argv = build_argv(config, tmp_path / "o", "source.kind=jsonl", f"source.path={src}")
    # A text_key typo would otherwise exclude every document as empty and "validate" an empty dataset.
    msg = one_error(capsys, argv)
    assert f"{src / 'a.jsonl'}: the first JSON object has no key 'text' (keys: body, id)" in msg
    assert "set source.text_key" in msg
    (src / "a.jsonl").write_text(
        '{"body": "A document.", "id": "x"}\nnot json\n{"body": "Another.", "id": "y"}\n'
    )
    msg = one_error(capsys, argv)
    assert f"{src / 'a.jsonl'}: none of the first 2 JSON objects has the key 'text' (keys: body, id)" in msg
    # one row without a text is that row's problem (excluded with its reason), not a wrong text_key
    (src / "a.jsonl").write_text('{"body": "A document.", "id": "x"}\n{"text": "Another.", "id": "y"}\n')
    cfg = load_config(DataConfig, config, ["source.kind=jsonl", f"source.path={src}"])
    _check_jsonl_keys(cfg, list_source_files(cfg.source))
    # a JSON array (or a CSV, a parquet file) named .jsonl: every line was excluded as malformed, exit 0
    docs = [{"text": "A document.", "id": "x"}, {"text": "Another.", "id": "y"}]
    (src / "a.jsonl").write_text(json.dumps(docs, indent=1))
    msg = one_error(capsys, argv)
    assert f"{src / 'a.jsonl'}: none of its first 10 non-empty lines is a JSON object (it begins '[')" in msg
    assert "convert it to one JSON object per line (a JSON array: `jq -c '.[]'`)" in msg
    # UTF-16 (PowerShell's `>`): the check's parser read it, the reader's did not (review R13a F3)
    (src / "a.jsonl").write_text("\n".join(map(json.dumps, docs)), encoding="utf-16")
    assert f"{src / 'a.jsonl'} is UTF-16 (it begins with UTF-16's byte order mark)" in one_error(capsys, argv)
    # Latin-1 lines are objects to the reader, which excludes each with its reason: not refused here
    (src / "a.jsonl").write_bytes(b'{"text": "caf\xe9", "id": "x"}\n{"text": "na\xefve", "id": "y"}\n')
    _check_jsonl_keys(cfg, list_source_files(cfg.source))
    # an id_key set and misspelt: every id replaced by <file>/<row>, exit 0 (review R22a A10); one
    # that some object or file holds is the input's (R22d M4); the default's absence is the fallback
    (src / "a.jsonl").write_text('{"text": "A.", "uid": "x"}\n{"text": "B.", "id": "y"}\n')
    msg = one_error(capsys, [*argv, "--set", "source.id_key=idd"])
    assert msg == (
        "error: no input file holds source.id_key = 'idd' "
        f"({src / 'a.jsonl'} has no key 'idd' in its first 2 JSON objects), which names the documents' "
        "ids; set it to the id field, or leave it out (documents without one are named <file>/<row>)"
    ), msg
    (src / "b.jsonl").write_text('{"text": "C."}\n{"text": "D.", "uid": "z"}\n')
    named = ["source.kind=jsonl", f"source.path={src}", "source.id_key=uid"]
    _check_jsonl_keys(load_config(DataConfig, config, named), list_source_files(cfg.source))
    (src / "a.jsonl").write_text('{"text": "A."}\n')
    _check_jsonl_keys(load_config(DataConfig, config, named), list_source_files(cfg.source))  # b has it
    _check_jsonl_keys(cfg, list_source_files(cfg.source))
    (src / "b.jsonl").unlink()
    (src / "a.jsonl").unlink()
    (src / "b.jsonl.gz").write_bytes(b"not gzip at all")
    msg = one_error(capsys, argv)
    assert f"{src / 'b.jsonl.gz'} is not a readable jsonl file" in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "repo, under", [("HuggingFaceFW/fineweb-edu", ""), ("someorg/other", ""), ("someorg/other", "data/")]
)
def test_hub_source_offline(build_fixture, tmp_path, capsys, monkeypatch, repo, under):
    """The advice fetches the source's repository and folder: without --repo it fetched FineWeb-Edu's
    files whatever the source was (trial RV57d F3), and a folder under the repository's root was left
    out (review RV57e)."""
    _, _, config = build_fixture
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network, anywhere
    path = f"source.path=hf://datasets/{repo}/{under}".rstrip("/")
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "source.kind=hub", path))
    assert f"hf://datasets/{repo}/{under}sample/10BT is unreachable" in msg
    assert f"`gristmill data download --repo {repo} --subset {under}sample/10BT --to DIR`" in msg
    assert f"--set source.kind=parquet --set source.path=DIR/{under}sample/10BT" in msg


def test_tokenizer_without_separator_fails_before_any_task(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    tok = train_bpe(fixture_texts(20), vocab_size=300, special_tokens=["<pad>"])
    tok.save(str(tmp_path / "nosep.json"))
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"tokenizer.path={tmp_path / 'nosep.json'}"))
    assert "nosep.json has no separator token '<|endoftext|>'" in msg and "['<pad>']" in msg
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"tokenizer.path={tmp_path / 'missing.json'}"))
    assert "missing.json not found" in msg and "gristmill tokenizer train" in msg
    assert not (tmp_path / "o").exists()  # nothing written, no task started


def test_a_foreign_tokenizer_without_the_separator_is_advised_in_a_short_line(
    build_fixture, tmp_path, capsys
):
    """A Llama-3-style tokenizer (256 special tokens, none '<|endoftext|>'): the refusal listed them all
    in one line of 8,689 characters and did not say which is likely the separator; its
    tokenizer_config.json beside it names eos and bos (review R25a 4). A SentencePiece-only directory
    (tokenizer.model, no tokenizer.json) was advised to train a tokenizer, not to convert its own."""
    _, _, config = build_fixture
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_{i}|>" for i in range(254)]
    tok = train_bpe(fixture_texts(20), vocab_size=600, special_tokens=specials)
    (tmp_path / "llama").mkdir()
    tok.save(str(tmp_path / "llama" / "tokenizer.json"))
    names = {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>", "special": True}}
    (tmp_path / "llama" / "tokenizer_config.json").write_text(json.dumps(names))
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"tokenizer.path={tmp_path / 'llama'}"))
    assert "has no separator token '<|endoftext|>'" in msg and len(msg) < 1000, msg
    assert "'<|reserved_5|>'] and 248 more, or train" in msg and "<|reserved_200|>" not in msg, msg
    assert "eos '<|end_of_text|>' (tokenizer.separator = \"<|end_of_text|>\", after each document)" in msg, (
        msg
    )
    assert (
        "bos '<|begin_of_text|>' (tokenizer.separator = \"<|begin_of_text|>\", with tokenizer.position" in msg
    )
    # The other refusals that list the special tokens list as few.
    msg = one_error(
        capsys,
        build_argv(config, tmp_path / "o", f"tokenizer.path={tmp_path / 'llama'}", "tokenizer.separator=e"),
    )
    assert "is an ordinary vocabulary token" in msg and "and 248 more" in msg and len(msg) < 1000, msg
    # ... and name the tokenizer_config.json's eos and bos too, as the missing separator's does (R25i D1)
    assert "eos '<|end_of_text|>' (tokenizer.separator = \"<|end_of_text|>\", after each document)" in msg, (
        msg
    )
    # SentencePiece only: the base's own tokenizer.json, not transformers 5's conversion, which encodes
    # a text starting with whitespace to other ids than sentencepiece (review R25i S2).
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "tokenizer.model").write_bytes(b"\x0a\x0b<sentencepiece model proto>")
    (sp / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    msg = one_error(capsys, build_argv(config, tmp_path / "o", f"tokenizer.path={sp}"))
    assert "holds a SentencePiece tokenizer.model but no tokenizer.json; use the base model's own" in msg
    assert "convert only with transformers < 5, or check the converted file's ids against" in msg, msg
    assert f"save_pretrained('{sp}')" not in msg and "tokenizer train" not in msg
    assert not (tmp_path / "o").exists()


def test_disk_too_full(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    msg = one_error(capsys, build_argv(config, tmp_path / "o", "build.min_free_gb=1e9"))
    assert "not enough free disk" in msg and "build.min_free_gb" in msg
    assert msg.endswith("then rerun the same command")  # no "finished tasks are kept": none ran
    assert not (tmp_path / "o" / "logs").exists()


def test_tokenizer_train_cli(build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    out = tmp_path / "tok.json"
    argv = ["tokenizer", "train", "--config", str(config), "--set", "tokenizer.train.vocab_size=400"]
    argv += ["--set", f"tokenizer.path={out}"]
    assert main(argv) == 0
    tok = load_tokenizer(out)
    assert tok.get_vocab_size() == 400
    assert DocumentEncoder(tok, SeparatorPolicy(SEP)).separator_id == 0
    first = out.read_bytes()
    msg = one_error(capsys, argv)
    assert "already exists; pass --force" in msg
    assert main(argv + ["--force"]) == 0
    assert out.read_bytes() == first  # deterministic
    # --out "": the config's path was written (a hub repo's name, refused without --out: review R22a A8)
    assert one_error(capsys, [*argv, "--out", ""]) == 'error: --out "": name a path, or leave the option out'
    msg = one_error(capsys, argv + ["--force", "--set", 'tokenizer.train.special_tokens=["<pad>"]'])
    assert "lacks the separator '<|endoftext|>'" in msg
    # the least said is the least taken, and a size past any corpus's merges is refused, not the library's
    # 141 GB allocation that aborted the process (trial RV67b F5)
    specials = 'tokenizer.train.special_tokens=["<|endoftext|>"]'
    msg = one_error(capsys, argv + ["--force", "--set", specials, "tokenizer.train.vocab_size=257"])
    assert "take 257); use at least 258" in msg, msg
    msg = one_error(capsys, argv + ["--force", "--set", specials, "tokenizer.train.vocab_size=2147483647"])
    assert "vocab_size 2,147,483,647 is past 16,777,216" in msg, msg
    # a .JSON name is the file, not a folder holding tokenizer.json (trial RV67b F11)
    upper = tmp_path / "tok.JSON"
    assert main([*argv[:-2], "--set", f"tokenizer.path={upper}"]) == 0
    assert upper.is_file() and json.loads(upper.read_text())["model"]["type"] == "BPE"


def test_tokenizer_train_on_no_documents_is_an_error(build_fixture, tmp_path, capsys):
    # A jsonl text_key typo (or filters that drop everything) leaves nothing to train on; the
    # tokenizers library would still write a bytes-only "tokenizer".
    _, _, config = build_fixture
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text('{"body": "A document about rivers and the sea."}\n' * 50)
    out = tmp_path / "tok.json"
    argv = ["tokenizer", "train", "--config", str(config), "--set", f"tokenizer.path={out}"]
    argv += ["--set", "source.kind=jsonl", "--set", f"source.path={tmp_path / 'src'}"]
    msg = one_error(capsys, argv)
    assert "none of the 50 documents of source.path" in msg and "passed the filters (unreadable 50)" in msg
    assert "source.text_key ('text')" in msg
    assert not out.exists()
    # an empty file holds no document, which no filter dropped (it said so: trial RV66b nit)
    (tmp_path / "src" / "a.jsonl").write_text("")
    msg = one_error(capsys, argv)
    assert f"source.path '{tmp_path / 'src'}' holds no documents (1 file read)" in msg, msg
    assert not out.exists()


def test_build_trains_missing_tokenizer_when_asked(build_fixture, tmp_path):
    _, _, config = build_fixture
    tok = tmp_path / "new-tok.json"
    overrides = [f"output={tmp_path / 'o'}", f"tokenizer.path={tok}", "tokenizer.train.vocab_size=400"]
    overrides += ["tokenizer.train.if_missing=true", "build.tasks=1", "build.workers=1"]
    result = build(load_config(DataConfig, config, overrides), log=lambda *a: None)
    assert result.ok and tok.is_file()
    assert (tmp_path / "o" / "tokenizer.json").read_bytes() == tok.read_bytes()


def test_damaged_build_or_dataset_json_on_rerun(built_dataset, build_fixture, tmp_path, capsys):
    _, _, config = build_fixture
    for name, fix in (
        ("build.json", "cannot tell which config built"),
        ("dataset.json", "delete it and rerun"),
    ):
        out = tmp_path / name
        shutil.copytree(built_dataset, out)
        (out / name).write_text('{"cut off')
        msg = one_error(capsys, build_argv(config, out))
        assert f"{out / name} is unreadable (JSONDecodeError" in msg and fix in msg
        assert (out / name).read_text() == '{"cut off'  # nothing rewritten


def test_damaged_input_mid_build_is_an_error_without_traceback(build_fixture, tmp_path, capsys):
    # Found only while a task reads (the file lists fine): the task fails, datatrove's task log
    # line and the driver's line name the file, and no traceback is printed.
    assert_task_failure_is_one_error(capsys, build_fixture[2], tmp_path, "build.workers=1")


def test_task_out_of_disk_frees_its_spill(build_fixture, tmp_path):
    # The space check before a task writes its shards fails: the task's spill (as large as its
    # shards) must not stay behind on the disk the user is asked to free.
    _, tokenizer, _ = build_fixture
    reserve_gb = (shutil.disk_usage(tmp_path).free + 10e9) / 1e9  # more than there is: always fails
    tok = TokenizerFile(tokenizer.read_bytes(), str(tokenizer))
    step = TokenizeShard(tmp_path / "o", tok, SeparatorPolicy(SEP), 1 << 20, min_free_gb=reserve_gb)
    docs = [Document(text=t, id=f"d{i}") for i, t in enumerate(fixture_texts(30))]
    with pytest.raises(DiskFullError, match="not enough free disk .* to write the shards of task 2") as e:
        list(step.run(iter(docs), rank=2))
    assert list((tmp_path / "o" / "shards").iterdir()) == []
    # A task's need is usually far below a GiB: it is shown in KiB or MiB, not as "0.00 GiB needed".
    assert re.search(r"iB free, \d+\.\d\d [KM]iB needed", str(e.value)), str(e.value)


def test_two_copies_of_a_task_at_once_do_not_crash_each_other(build_fixture, tmp_path):
    """A Slurm chain submitted twice ran each task twice at once: both spilled to one name, truncated
    each other's, and one died (`cannot mmap an empty file`, trial RV70c 1). A copy started and finished
    while another encodes leaves the other to finish the same shards; killed attempts' spills go."""
    _, tokenizer, _ = build_fixture
    tok = TokenizerFile(tokenizer.read_bytes(), str(tokenizer))
    step = lambda out: TokenizeShard(out, tok, SeparatorPolicy(SEP), 1 << 12, batch_chars=2000)
    docs = [Document(text=t, id=f"d{i}") for i, t in enumerate(fixture_texts(30))]
    shards = tmp_path / "o" / "shards"
    shards.mkdir(parents=True)
    for leftover in (".spill-00001.tmp", ".spill-00001-7-0a0b0c0d.tmp"):  # of killed attempts
        (shards / leftover).write_bytes(b"x")
    (shards / ".spill-100001-7-0a0b0c0d.tmp").write_bytes(b"x")  # task 100001's

    def with_a_second_copy():
        yield from docs[:15]
        list(step(tmp_path / "o").run(iter(docs), rank=1))  # starts and ends while the first encodes
        yield from docs[15:]

    list(step(tmp_path / "o").run(with_a_second_copy(), rank=1))
    list(step(tmp_path / "alone").run(iter(docs), rank=1))
    names = sorted(p.name for p in shards.iterdir())
    assert names == [
        ".spill-100001-7-0a0b0c0d.tmp",
        *sorted(p.name for p in (tmp_path / "alone/shards").iterdir()),
    ]
    for p in (tmp_path / "alone" / "shards").iterdir():
        assert (shards / p.name).read_bytes() == p.read_bytes(), p.name


def test_every_document_filtered_out_is_an_error(build_fixture, tmp_path, capsys):
    # Called directly: datatrove's loguru sinks from earlier capsys tests make stderr noisy here.
    _, _, config = build_fixture
    out = tmp_path / "my out"  # a space: the advised command quotes it (review R27d m4)
    cfg = load_config(DataConfig, config, [f"output={json.dumps(str(out))}", "filters.min_chars=100000000"])
    with pytest.raises(BuildError) as err:
        build(cfg, log=lambda *a: None)
    msg = str(err.value)
    assert "no document survived" in msg and "excluded by: " in msg and "length " in msg
    assert not (out / "dataset.json").exists()  # never marked complete
    assert list((out / "excluded").glob("*.parquet"))  # the reasons are kept for the audit
    # the advised command answers (review R27a M1: `--report drops` was refused as an unfinished build,
    # whose advice was to rerun the build, which failed with the same advice)
    advice = re.search(r"see `gristmill (data audit [^`]+)`", msg)
    capsys.readouterr()
    assert advice and main(shlex.split(advice.group(1))) == 0, msg
    printed = capsys.readouterr().out
    assert re.search(r"^length +\d+ +\d+ chars < min_chars 100000000$", printed, re.M), printed


def test_every_text_encoded_to_no_token_names_the_tokenizer(build_fixture, tmp_path):
    """Every text excluded because the tokenizer encodes it to no token (its normalizer deletes every
    character): the advice names tokenizer.path, not the filters or the text key."""
    from tokenizers import Regex, Tokenizer, normalizers

    _, tokenizer, config = build_fixture
    tok = Tokenizer.from_file(str(tokenizer))
    tok.normalizer = normalizers.Replace(Regex(r"[\s\S]"), "")
    deleting = tmp_path / "deleting.json"
    tok.save(str(deleting))
    out = tmp_path / "o"
    cfg = load_config(DataConfig, config, [f"output={out}", f"tokenizer.path={deleting}", "build.workers=1"])
    with pytest.raises(BuildError) as err:
        build(cfg, log=lambda *a: None)
    msg = str(err.value)
    assert "no document survived" in msg and re.search(r"excluded by: [^;]*tokens \d", msg), msg
    assert f"check tokenizer.path {deleting}: " in msg, msg
    assert "texts encoded to no token, or to its unknown token, with it" in msg, msg
    assert not (out / "dataset.json").exists()
    # The fixture corpus's planted texts are also excluded by filters: that advice stays beside it.
    assert "loosen [filters] or check source.text_key; check tokenizer.path" in msg, msg


def test_output_that_is_a_file(build_fixture, tmp_path, capsys):
    """An `output` naming a file (or a path through one): a FileExistsError/NotADirectoryError trace."""
    _, _, config = build_fixture
    (tmp_path / "afile").write_text("not a folder")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        msg = one_error(capsys, build_argv(config, out))
        assert f"{tmp_path / 'afile'} is a file" in msg and "set `output` to a directory path" in msg, msg


def test_an_input_file_replaced_while_the_build_reads_it_fails_its_task(
    build_fixture, tmp_path, monkeypatch, capsys
):
    """A file replaced after the build listed it: its task read the new one, build.json recorded the
    old, exit 0, and the rerun's advice (touch it back) certified shards of neither (review R22b F2).
    Now the task fails naming the file; the rerun redoes it from the file as it is."""
    import pipelines.build as build_module

    _, _, config = build_fixture
    listed = build_module.list_source_files

    def listed_before_a_rewrite(*args, **kwargs):
        source = listed(*args, **kwargs)
        source.modified[-1] -= 1  # what build.json records is not the file the task then reads
        return source

    monkeypatch.setattr(build_module, "list_source_files", listed_before_a_rewrite)
    out = tmp_path / "ds"
    msg = one_error(capsys, build_argv(config, out, "build.workers=1"))
    assert "changed while the build read it" in msg and "(the task is redone from it)" in msg, msg
    assert not (out / "dataset.json").exists()
    monkeypatch.undo()
    assert main(build_argv(config, out, "build.workers=1")) == 0
    said = capsys.readouterr().out
    assert "input changed since the last run:" in said and "its task had not finished" in said, said
    assert (out / "dataset.json").is_file()


def test_an_output_holding_another_artifact_is_refused_untouched(build_fixture, tmp_path, capsys):
    """An output without build.json was refused only when it held shards/, manifest/ or dataset.json: a
    training run's directory had its config.toml replaced and became a dataset, exit 0 (review R22b F3);
    so is a directory whose config.toml is no data build's recipe (a mixture search's). What a build
    writes before its build.json (its recipe, a tokenizer trained into the output with its record, a
    decontamination index) and files of no artifact (lost+found) are no refusal (R22c R1-R3)."""
    _, _, config = build_fixture
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("config.toml", "metrics.jsonl", "data_plan.json"):
        (run / name).write_text("theirs")
    msg = one_error(capsys, build_argv(config, run))
    assert msg == (
        f"error: {run} holds metrics.jsonl but no build.json: another artifact's directory (a training "
        "run's, a mixture search's), whose files a build would replace; pick an empty `output` directory"
    ), msg
    held = sorted(p.name for p in run.iterdir())  # the build's lock, taken before it looks, aside
    assert held == [".build.lock", "checkpoints", "config.toml", "data_plan.json", "metrics.jsonl"]
    assert all((run / n).read_text() == "theirs" for n in ("config.toml", "metrics.jsonl"))
    search = tmp_path / "search"
    search.mkdir()
    (search / "config.toml").write_text("[target]\nmix = {a = 1.0}\n")
    msg = one_error(capsys, build_argv(config, search))
    said = f"error: {search} holds config.toml, which is no data build's recipe (unknown key 'target'"
    assert msg.startswith(said), msg
    assert (search / "config.toml").read_text() == "[target]\nmix = {a = 1.0}\n"
    # files of no build: written beside, and a later change's advice (`rm -rf OUTPUT`) deleted them;
    # a tokenizer.json of another tokenizer was replaced (review R22e 1, 2)
    mine = tmp_path / "mine"
    (mine / "src").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    msg = one_error(capsys, build_argv(config, mine))
    assert msg.startswith(f"error: {mine} holds notes.txt, src but no build.json: files of no build"), msg
    other_tok = tmp_path / "other-tok"
    other_tok.mkdir()
    (other_tok / "tokenizer.json").write_text('{"my": "tokenizer"}')
    msg = one_error(capsys, build_argv(config, other_tok))
    assert msg.startswith(
        f"error: {other_tok / 'tokenizer.json'} is another tokenizer than the one this build"
    ), msg
    assert (other_tok / "tokenizer.json").read_text() == '{"my": "tokenizer"}'
    hidden = tmp_path / "hidden"  # a build deletes every *.tmp below its output at its end (R22g 1, 6)
    (hidden / ".scratch").mkdir(parents=True)
    (hidden / ".scratch" / "draft.tmp").write_text("mine")
    assert f"{hidden} holds .scratch but no build.json: files of no build" in one_error(
        capsys, build_argv(config, hidden)
    )
    assert (hidden / ".scratch" / "draft.tmp").read_text() == "mine"
    # a killed build's own: the tokenizer its recipe or tokenizer.path trained into the output, in a
    # folder too, and a tokenizer.json of its own recipe's, rerun with another tokenizer (R22g 7, 8)
    # a user's tokenizer beside a recipe of theirs: replaced, the recipe taken for a killed build's (R22h S3);
    # a folder holding the tokenizer and the user's files: their *.tmp deleted (R22h S1)
    tok = tmp_path / "tokin"
    (tok / "tok").mkdir(parents=True)
    shutil.copy(build_fixture[1], tok / "tok" / "tokenizer.json")
    (tok / "tokenizer.json").write_text('{"my": "tokenizer"}')
    shutil.copy(config, tok / "config.toml")
    at = f"tokenizer.path={tok / 'tok' / 'tokenizer.json'}"
    assert "tokenizer.json is another tokenizer than the one this build reads" in one_error(
        capsys, build_argv(config, tok, at)
    )
    shutil.copy(build_fixture[1], tok / "tokenizer.json")  # the killed build's own copy
    (tok / "tok" / "draft.tmp").write_text("mine")
    assert f"{tok} holds tok but no build.json: files of no build" in one_error(
        capsys, build_argv(config, tok, at)
    )
    (tok / "tok" / "draft.tmp").unlink()
    deep = tmp_path / "deep"  # the tokenizer two folders down, or tokenizer.path a folder (review R22i S3)
    (deep / "a" / "b").mkdir(parents=True)
    shutil.copy(build_fixture[1], deep / "a" / "b" / "tokenizer.json")
    (deep / "a" / "notes.tmp").write_text("mine")
    for path in (deep / "a" / "b" / "tokenizer.json", deep / "a" / "b"):
        if path.name == "b":
            shutil.move(deep / "a" / "notes.tmp", deep / "a" / "b" / "notes.tmp")
        msg = one_error(capsys, build_argv(config, deep, f"tokenizer.path={path}"))
        assert f"{deep} holds a but no build.json: files of no build" in msg, msg
    assert (deep / "a" / "b" / "notes.tmp").read_text() == "mine"
    (tok / ".notes.tmp").write_text("mine")  # hidden, ending in .tmp: no temporary file of a write (R22h S2)
    assert f"{tok} holds .notes.tmp but no build.json" in one_error(capsys, build_argv(config, tok, at))
    (tok / ".notes.tmp").unlink()
    (tok / ".config.toml.12345.tmp").write_text("")  # write_atomic's, left by a kill
    assert main(build_argv(config, tok, "build.workers=1", at)) == 0
    kept = tmp_path / "kept"  # the user's recipe kept in a new output: rewritten, comments gone (R22g 4)
    kept.mkdir()
    recipe = "# mine\n" + config.read_text()
    (kept / "config.toml").write_text(recipe)
    msg = one_error(
        capsys, ["data", "build", "--config", str(kept / "config.toml"), "--set", f"output={kept}"]
    )
    assert msg == (
        f"error: --config {kept / 'config.toml'} is {kept / 'config.toml'}, where the build writes the "
        "recipe it resolves; keep your recipe outside the output"
    ), msg
    assert (kept / "config.toml").read_text() == recipe
    killed = tmp_path / "killed"  # a build killed before its build.json, with a volume's lost+found, a
    (killed / "lost+found").mkdir(parents=True)  # tokenizer's record, a hidden file: resumed, as before
    shutil.copy(config, killed / "config.toml")
    (killed / "tokenizer.json.trained.json").write_text("{}")
    (killed / ".DS_Store").write_text("")
    assert main(build_argv(config, killed, "build.workers=1")) == 0
    assert (killed / "dataset.json").is_file()


def test_data_index_takes_the_dataset_lock_and_a_read_only_dataset_is_still_complete(
    built_dataset, tmp_path, capsys, monkeypatch
):
    """Another process writing the dataset (a build, another index: two indexes removed each other's
    index.tmp/, a traceback, review R17e E3) holds its lock: one line. An intact index on a read-only
    mount, where the lock cannot be written: said complete, as before the lock (its command with two
    torch threads: forked.become starts them after the namespace, which the kernel refuses once they
    run, review RV32c F2); one indexed before dataset.json recorded its documents' sum is said to lack
    it there, nothing written, and given it where the dataset is writable (review RV31b F4), reading
    doc_sha256.bin once (RV32b F7). A sum edited (or stale) is corrected; a damaged older index is
    repaired with its sum in one run (RV32b F3, F4)."""
    import os
    import sys

    from tests.helpers.lock_holder import held_elsewhere
    from tests.helpers.mounts import unshare_works

    root = tmp_path / "ds"
    shutil.copytree(built_dataset, root)
    with held_elsewhere(root / ".build.lock"):
        assert main(["data", "index", str(root)]) == 2
        busy = (
            "another `gristmill data build`, `data index`, `data convert` or `data decontam-index` is "
            f"writing {root}"
        )
        assert busy in capsys.readouterr().err
    assert main(["data", "index", str(root)]) == 0
    info = read_dataset_info(root)
    total = info["index"].pop(DOCUMENTS_SUM)  # as a build before the record wrote it
    write_dataset_info(root, info)
    before = (root / "dataset.json").read_bytes()
    if unshare_works():  # in a mount namespace of its own (tests/helpers/mounts.py)
        read_only = f"mount --bind {root} {root} && mount -o remount,bind,ro {root}"
        cmd = [sys.executable, "-m", "tests.helpers.mounts", read_only, "", "pipelines.cli", "data", "index"]
        done = forked.run([*cmd, str(root)], env={**os.environ, "OMP_NUM_THREADS": "2"}, timeout=120)
        assert done.returncode == 0 and "is complete" in done.stdout, done.stdout + done.stderr
        assert (
            f"note: could not record the sum of its documents' sha256 in {root / 'dataset.json'} "
            "(read-only): run `gristmill data index` where the dataset is writable to record it"
        ) in done.stdout
        assert (root / "dataset.json").read_bytes() == before
    capsys.readouterr()
    hashed = []  # the real hash, counted: doc_sha256.bin is hashed as it is summed, not read again

    def counted(path, *args, **kwargs):
        hashed.append(str(path).rsplit("/", 1)[-1])
        return file_sha256(path, *args, **kwargs)

    monkeypatch.setattr(dataset_index, "file_sha256", counted)
    assert main(["data", "index", str(root)]) == 0
    assert "recorded the sum of its documents' sha256 (fingerprint unchanged)" in capsys.readouterr().out
    assert read_dataset_info(root) == {**info, "index": {**info["index"], DOCUMENTS_SUM: total}}
    assert hashed and "doc_sha256.bin" not in hashed, hashed
    write_dataset_info(root, {**info, "index": {**info["index"], DOCUMENTS_SUM: "0" * 64}})  # edited
    assert main(["data", "index", str(root)]) == 0
    assert (
        f"sha256 in place of {'0' * 12}…, which it is not (fingerprint unchanged)" in capsys.readouterr().out
    )
    assert read_dataset_info(root)["index"][DOCUMENTS_SUM] == total
    write_dataset_info(root, info)  # an older index, and damaged: one run repairs it and records the sum
    (root / "index" / "doc_offsets.bin").unlink()
    assert main(["data", "index", str(root)]) == 0
    out = capsys.readouterr().out
    assert "repaired" in out and "recorded the sum of its documents' sha256 (fingerprint unchanged)" in out
    assert read_dataset_info(root) == {**info, "index": {**info["index"], DOCUMENTS_SUM: total}}


def test_a_saved_config_run_from_another_directory_is_refused_naming_where_to_run_it(
    build_fixture, tmp_path, monkeypatch, capsys
):
    """`data build --config OUTPUT/config.toml` from another working directory, whose relative
    output, source.path and tokenizer.path lead elsewhere from there (another clone holding the same
    layout), built a new dataset at ./<output>, exit 0, instead of resuming the original (review
    R25b 8). Refused as the trainer refuses a run's saved config, naming the directory to run from;
    run from there, it resumes (here: revalidates the complete dataset)."""
    corpus, tokenizer, config = build_fixture
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for d in (home, elsewhere):
        shutil.copytree(corpus, d / "corpus")
        shutil.copy(tokenizer, d / "tok.json")
    relative = ["source.path=corpus", "tokenizer.path=tok.json", "build.workers=1"]
    monkeypatch.chdir(home)
    assert main(build_argv(config, "runs/data/rel", *relative)) == 0
    saved = home / "runs/data/rel/config.toml"

    monkeypatch.chdir(elsewhere)
    msg = one_error(capsys, ["data", "build", "--config", str(saved)])
    assert msg.startswith(
        f"error: {saved} is the saved config of the dataset build in {saved.parent}, but its output = "
        f'"runs/data/rel" leads to {elsewhere / "runs/data/rel"} from here'
    ), msg
    assert f"run the command from {home}, where its relative paths were written" in msg
    assert sorted(p.name for p in elsewhere.iterdir()) == ["corpus", "tok.json"]

    monkeypatch.chdir(home)
    capsys.readouterr()
    assert main(["data", "build", "--config", str(saved)]) == 0
    assert "is already complete (same config)" in capsys.readouterr().out
