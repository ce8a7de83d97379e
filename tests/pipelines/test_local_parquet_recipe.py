"""configs/data/local-parquet.toml as the README's "Your own parquet files" uses it: a folder of
plain parquet files (a text column, maybe id/url), offline, only source.path / output /
tokenizer.path changed. The build trains its tokenizer, keeps every document and validates."""

from __future__ import annotations

import mmap
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from pipelines.build import build, resolve_tokenizer
from pipelines.config import DataConfig
from pipelines.sources import list_source_files
from pipelines.tokenizer_train import train_tokenizer
from tests.helpers.corpus import SEP, fixture_texts
from training.contract.config_loader import load_config
from training.contract.dataset_format import read_dataset_info, tokenizer_differences

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "data" / "local-parquet.toml"


def write_folder(folder: Path) -> list[str]:
    """3 files, 40 documents each, with the columns a user's own files might have (or not)."""
    texts = fixture_texts(120)
    assert len(texts) == 120
    tables = [
        pa.table(  # text, id, url
            {
                "text": texts[:40],
                "id": [f"doc-{i}" for i in range(40)],
                "url": [f"https://example.org/{i}" for i in range(40)],
            }
        ),
        pa.table({"text": texts[40:80]}),  # text only
        pa.table({"title": [t[:20] for t in texts[80:]], "text": texts[80:], "year": [2024] * 40}),
    ]
    (folder / "more").mkdir(parents=True)
    for name, table in zip(["a.parquet", "b.parquet", "more/c.parquet"], tables):
        pq.write_table(table, folder / name)
    return texts


def write_mixture(path: Path, sources: dict[str, Path], run: Path) -> Path:
    """A two-step training recipe mixing `sources` (name → dataset) half and half, for `train --plan`."""
    listed = "".join(f'[[data.sources]]\nname = "{n}"\ndataset = "{d}"\n\n' for n, d in sources.items())
    mix = ", ".join(f"{n} = {1 / len(sources)}" for n in sources)
    path.write_text(
        f'{listed}[[phase]]\nname = "main"\nsteps = 2\nseq_len = 32\nmix = {{ {mix} }}\n\n'
        f'[data]\nglobal_batch_tokens = 512\nmicro_batch = 4\n\n[run]\noutput_dir = "{run}"\n'
    )
    return path


def test_recipe_defaults_suit_files_without_metadata():
    cfg = load_config(DataConfig, RECIPE)
    assert cfg.source.kind == "parquet" and cfg.source.text_key == "text"
    # No score threshold: it would drop every document of a source without that column.
    assert cfg.filters.min_int_score is cfg.filters.min_score is cfg.filters.min_language_score is None
    # Offline as is: a local tokenizer file, trained by the build when it is missing.
    assert cfg.tokenizer.path.endswith(".json") and cfg.tokenizer.train.if_missing
    assert cfg.tokenizer.separator in cfg.tokenizer.train.special_tokens
    # Own corpora repeat themselves (man pages, licence files): exact dedup on, as in the demo.
    assert cfg.dedup.kind == load_config(DataConfig, RECIPE.with_name("demo.toml")).dedup.kind == "exact"


def test_build_from_a_folder_of_parquet_files(tmp_path):
    corpus, out, tok_path = tmp_path / "my-parquet", tmp_path / "mine", tmp_path / "tok" / "mine.json"
    texts = write_folder(corpus)
    overrides = [f"source.path={corpus}", f"output={out}", f"tokenizer.path={tok_path}", "build.workers=2"]
    pq.write_table(pa.table({"text": texts[:2]}), corpus / "more" / "d.parquet")  # two exact copies
    cfg = load_config(DataConfig, RECIPE, overrides)
    lines: list[str] = []
    result = build(cfg, log=lines.append)
    assert result.ok, result.report
    # the input size is the files' size on disk (compressed parquet), not the text's
    assert any("MB of input (parquet files on disk, compressed)" in line for line in lines), lines

    assert tok_path.is_file()  # trained on the folder, then copied into the dataset
    assert (out / "tokenizer.json").read_bytes() == tok_path.read_bytes()
    info = read_dataset_info(out)
    assert (
        info["tasks"] == 4 and info["documents"] == 120
    )  # the copies dropped by exact dedup and info["dtype"] == "uint16"
    assert info["separator"]["token"] == SEP

    manifest = pa.concat_tables([pq.read_table(p) for p in sorted((out / "manifest").glob("*.parquet"))])
    rows = manifest.to_pylist()
    ids = {r["id"] for r in rows}
    assert {f"doc-{i}" for i in range(40)} <= ids  # the id column where the file has one
    assert {f"b.parquet/{i}" for i in range(40)} | {f"more/c.parquet/{i}" for i in range(40)} <= ids
    assert sum(r["url"] is not None for r in rows) == 40 and all(r["int_score"] is None for r in rows)
    assert sum(manifest.column("n_tokens").to_pylist()) == info["tokens"]

    # Every document's ids decode back to its text, followed by the one separator.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    sep_id = tok.token_to_id(SEP)
    decoded = []
    for shard in sorted({r["shard"] for r in rows}):
        with open(out / "shards" / shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for r in (r for r in rows if r["shard"] == shard):
                doc = np.frombuffer(m[r["offset"] : r["offset"] + r["nbytes"]], dtype="<u2")
                assert doc[-1] == sep_id and np.count_nonzero(doc == sep_id) == 1
                decoded.append(tok.decode(doc[:-1].tolist(), skip_special_tokens=False))
    assert sorted(decoded) == sorted(texts)


def test_a_reused_tokenizer_file_is_named_with_what_it_was_trained_on(tmp_path):
    """Issue 29 item 15: a build whose tokenizer.path already exists says so in one line: the file,
    the source it was trained on (another corpus here) and when; a file with no record says that."""
    first, second, tok_path = tmp_path / "first", tmp_path / "second", tmp_path / "tok" / "shared.json"
    write_folder(first)
    write_folder(second)
    lines: list[str] = []
    cfg = load_config(DataConfig, RECIPE, [f"source.path={first}", f"tokenizer.path={tok_path}"])
    train_tokenizer(cfg, source=list_source_files(cfg.source), log=lines.append)
    cfg = load_config(DataConfig, RECIPE, [f"source.path={second}", f"tokenizer.path={tok_path}"])
    lines.clear()
    resolve_tokenizer(cfg, list_source_files(cfg.source), log=lines.append)
    said = [line for line in lines if str(tok_path) in line]
    assert len(said) == 1, lines
    assert f"trained on {first} " in said[0] and "not this source" in said[0] and " UTC" in said[0], said
    # Issue 47: a tokenizer trained on another source may be shared on purpose (a mixture needs one):
    # never "delete it", which would orphan the first dataset's vocabulary.
    assert (
        "shared, as the sources of one mixture must share one tokenizer" in said[0]
        and "delete" not in said[0]
    )

    plain = tmp_path / "plain.json"
    plain.write_bytes(tok_path.read_bytes())  # e.g. copied from elsewhere: nothing recorded
    cfg = load_config(DataConfig, RECIPE, [f"source.path={second}", f"tokenizer.path={plain}"])
    lines.clear()
    resolve_tokenizer(cfg, list_source_files(cfg.source), log=lines.append)
    said = [line for line in lines if str(plain) in line and "not recorded" in line]
    # Issue 37 item 16: a file gristmill did not train (a base model's tokenizer.json, the
    # continued-pretraining path) is never to be deleted: the note says how to train another instead.
    assert (
        len(said) == 1
        and "delete" not in said[0]
        and "set tokenizer.path to a path that does not exist" in said[0]
    )


def test_two_own_sources_share_one_tokenizer(tmp_path, capsys):
    """configs/data/local-parquet-shared.toml (docs/data-build.md, "Two of your own sources, one
    tokenizer"): the second corpus is built with the tokenizer the first one's build trained, and
    the two datasets make one mixture; without the first, one line says to build it."""
    from pipelines.cli import main as gristmill

    shared = RECIPE.with_name("local-parquet-shared.toml")
    tok = tmp_path / "tok" / "bpe.json"
    first, second = tmp_path / "first", tmp_path / "second"
    write_folder(first)
    write_folder(second)
    code = [
        f"def f{i}(x):\n    return x * {i}  # the second corpus: its own documents\n" * 3 for i in range(40)
    ]
    pq.write_table(pa.table({"text": code}), second / "code.parquet")
    missing = [f"source.path={second}", f"output={tmp_path / 'b'}", f"tokenizer.path={tok}"]
    assert gristmill(["data", "build", "--config", str(shared), "--set", *missing]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith(f"error: tokenizer {tok} not found, and this recipe does not train one")
        and "\n" not in err
    )
    for recipe, folder, out in ((RECIPE, first, tmp_path / "a"), (shared, second, tmp_path / "b")):
        sets = [f"source.path={folder}", f"output={out}", f"tokenizer.path={tok}", "build.workers=1"]
        assert gristmill(["data", "build", "--config", str(recipe), "--set", *sets]) == 0
    a, b = read_dataset_info(tmp_path / "a"), read_dataset_info(tmp_path / "b")
    assert a["tokenizer_sha256"] == b["tokenizer_sha256"] and a["fingerprint"] != b["fingerprint"]
    mixture = write_mixture(
        tmp_path / "mix.toml", {"a": tmp_path / "a", "b": tmp_path / "b"}, tmp_path / "run"
    )
    assert gristmill(["train", "--config", str(mixture), "--plan"]) == 0  # one vocabulary: mixable


def test_sources_built_with_one_tokenizer_saved_twice_mix_and_other_tokenizers_are_named(
    build_fixture, built_dataset, tmp_path, capsys
):
    """Two datasets built with one tokenizer, one of them with its transformers re-save (other bytes,
    the same vocabulary, merges and special tokens): the mixture refused them by tokenizer_sha256,
    the bytes, while init_from compares a base's by content (review R25a 3). One rule now, and a
    refusal names what differs."""
    import json

    import transformers

    from pipelines.cli import main as gristmill

    _, tokenizer_path, data_toml = build_fixture
    resaved = tmp_path / "resaved"
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path)).save_pretrained(str(resaved))
    assert (resaved / "tokenizer.json").read_bytes() != tokenizer_path.read_bytes()

    def built(name: str, tokenizer: Path) -> Path:
        # not all of the corpus: the same documents as built_dataset's in another order are one dataset
        sets = [f"output={tmp_path / name}", f"tokenizer.path={tokenizer}", "shards.seed=9", "build.tasks=1"]
        cfg = load_config(DataConfig, data_toml, [*sets, "source.limit=200", "build.workers=1"])
        assert build(cfg, log=lambda *a: None).ok
        return tmp_path / name

    other = built("other", resaved / "tokenizer.json")
    assert (
        read_dataset_info(other)["tokenizer_sha256"] != read_dataset_info(built_dataset)["tokenizer_sha256"]
    )

    def mixture(other: Path) -> Path:
        sources = {"web": built_dataset, "code": other}
        return write_mixture(tmp_path / f"mix-{other.name}.toml", sources, tmp_path / "run")

    assert gristmill(["train", "--config", str(mixture(other)), "--plan"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    # transformers 5's re-save of it as a GPT-2 tokenizer writes continuing_subword_prefix and
    # end_of_word_suffix "" where the file has null: the same setting, the same shards (review R25i M1).
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    shutil.copy(tokenizer_path, gpt2 / "tokenizer.json")
    config = {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
    (gpt2 / "tokenizer_config.json").write_text(json.dumps(config))
    transformers.AutoTokenizer.from_pretrained(str(gpt2)).save_pretrained(str(tmp_path / "gpt2-resaved"))
    model = json.loads((tmp_path / "gpt2-resaved" / "tokenizer.json").read_text())["model"]
    assert model["continuing_subword_prefix"] == "" == model["end_of_word_suffix"]
    assert json.loads(tokenizer_path.read_text())["model"]["continuing_subword_prefix"] is None
    assert tokenizer_differences(tokenizer_path, tmp_path / "gpt2-resaved" / "tokenizer.json") == []
    spec = json.loads(tokenizer_path.read_text())
    spec["model"]["continuing_subword_prefix"] = "##"  # another setting: other ids
    (tmp_path / "prefixed.json").write_text(json.dumps(spec))
    assert tokenizer_differences(tokenizer_path, tmp_path / "prefixed.json") == [
        "model.continuing_subword_prefix"
    ]
    # Another tokenizer: one merge fewer. The refusal names the part that differs.
    spec = json.loads(tokenizer_path.read_text())
    spec["model"]["merges"] = spec["model"]["merges"][:-1]
    (tmp_path / "fewer.json").write_text(json.dumps(spec))
    fewer = built("fewer", tmp_path / "fewer.json")
    for extra in (["--plan"], []):
        assert gristmill(["train", "--config", str(mixture(fewer)), *extra]) == 2
        err = capsys.readouterr().err
        assert "sources 'web'" in err and "'code'" in err and "differ in model.merges" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
