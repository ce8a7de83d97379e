"""End-to-end data build: real datatrove executor, real tars, read back two independent ways."""

from __future__ import annotations

import json
import mmap
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from tokenizers import Tokenizer, processors

from pipelines.build import BuildError, build, finalize_only
from pipelines.cli import main
from pipelines.config import DataConfig
from tests.helpers.corpus import BAD_ROWS, BOS, LITERAL_SEP_TEXT, SEP
from training.contract.config_loader import load_config
from training.contract.dataset_format import read_dataset_info

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

QUIET = dict(log=lambda *a: None)


def read_manifest(root: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((root / "manifest").glob("*.parquet"))])


def read_excluded(root: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((root / "excluded").glob("*.parquet"))])


def read_by_manifest(root: Path, dtype) -> dict[str, np.ndarray]:
    out = {}
    man = read_manifest(root).to_pylist()
    maps = {}
    for row in man:
        if row["shard"] not in maps:
            f = open(root / "shards" / row["shard"], "rb")
            maps[row["shard"]] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = maps[row["shard"]][row["offset"] : row["offset"] + row["nbytes"]]
        out[row["key"]] = np.frombuffer(buf, dtype=dtype)
        assert len(out[row["key"]]) == row["n_tokens"]
    return out


def read_by_webdataset(root: Path, dtype) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Each document's ids as a stock webdataset client reads them: a sample's `.ids` holds its
    documents back to back, each ending with the separator (id 0), in the manifest's order of the
    shard; the metadata is the manifest's (a /2 shard carries none)."""
    urls = [str(p) for p in sorted((root / "shards").glob("*.tar"))]
    docs = []
    for sample in wds.WebDataset(urls, shardshuffle=False):
        block = np.frombuffer(sample["ids"], dtype=dtype)
        ends = np.flatnonzero(block == 0) + 1
        docs += np.split(block, ends[:-1])
        assert ends[-1] == len(block)  # the sample ends with a document's separator
    rows = sorted(read_manifest(root).to_pylist(), key=lambda r: (r["shard"], r["offset"]))
    assert len(rows) == len(docs)
    return {r["key"]: d for r, d in zip(rows, docs)}, {r["key"]: r for r in rows}


def source_rows(corpus: Path) -> list[dict]:
    return pa.concat_tables([pq.read_table(p) for p in sorted(corpus.glob("*.parquet"))]).to_pylist()


def test_end_to_end_webdataset_and_manifest_agree(built_dataset, build_fixture):
    corpus, tokenizer_path, _ = build_fixture
    info = read_dataset_info(built_dataset)
    assert info["tasks"] == 2 and info["shards"] >= 4  # several shards per task
    assert info["separator"] == {"token": SEP, "id": 0, "position": "after"}
    dtype = np.dtype("<u2")
    assert info["dtype"] == "uint16"

    by_manifest = read_by_manifest(built_dataset, dtype)
    by_wds, metas = read_by_webdataset(built_dataset, dtype)
    assert by_manifest.keys() == by_wds.keys() and len(by_wds) == info["documents"]
    for key, ids in by_wds.items():
        assert np.array_equal(ids, by_manifest[key])
        assert np.count_nonzero(ids == 0) == 1 and ids[-1] == 0  # exactly one separator, at the end
    assert sum(len(v) for v in by_wds.values()) == info["tokens"]

    # The manifest carries the source metadata; the text round-trips through the tokenizer.
    tok = Tokenizer.from_file(str(tokenizer_path))
    source = {r["id"]: r for r in source_rows(corpus)}
    for key, meta in metas.items():
        row = source[meta["id"]]
        for k in ("url", "dump", "score", "int_score", "language", "language_score", "token_count"):
            assert meta[k] == row[k]
        assert tok.decode(by_wds[key][:-1].tolist(), skip_special_tokens=False) == row["text"]
    # Both tasks wrote shards, keys are ordered within each shard, and the run is not in source order.
    shards = read_manifest(built_dataset).column("shard").to_pylist()
    assert {s[:5] for s in shards} == {"00000", "00001"}
    # Shuffled within the task: task 0's documents are not in its file's order.
    task0 = [m["id"] for k, m in sorted(metas.items()) if k.startswith("t00000")]
    file0 = [r["id"] for r in pq.read_table(sorted(corpus.glob("*.parquet"))[0]).to_pylist()]
    assert sorted(task0, key=file0.index) != task0 and set(task0) <= set(file0)
    assert (built_dataset / "tokenizer.json").read_bytes() == tokenizer_path.read_bytes()
    assert load_config(DataConfig, built_dataset / "config.toml").build.tasks == 2


def test_literal_separator_text_stays_text(built_dataset):
    tok = Tokenizer.from_file(str(built_dataset / "tokenizer.json"))
    ids, metas = read_by_webdataset(built_dataset, np.dtype("<u2"))
    (key,) = [k for k, m in metas.items() if m["id"] == "fixture-literal-sep"]
    doc = ids[key]
    assert np.count_nonzero(doc == 0) == 1 and doc[-1] == 0
    assert tok.decode(doc[:-1].tolist(), skip_special_tokens=False) == LITERAL_SEP_TEXT


def test_every_drop_is_recorded(built_dataset, build_fixture):
    corpus, _, _ = build_fixture
    read_ids = [r["id"] for r in source_rows(corpus)]
    kept = read_manifest(built_dataset).column("id").to_pylist()
    excluded = read_excluded(built_dataset).to_pylist()
    assert len(kept) + len(excluded) == len(read_ids)
    assert sorted(kept + [e["id"] for e in excluded]) == sorted(read_ids)
    by_id = {e["id"]: e for e in excluded}
    for name, _, _, filt in BAD_ROWS:
        if filt is None:
            assert name in kept
        else:
            assert by_id[name]["filter"] == filt and by_id[name]["reason"], by_id[name]
    assert by_id["fixture-low-score"]["reason"] == "int_score 1 < 3"
    assert by_id["fixture-no-score"]["reason"] == "no int_score in the source"
    assert by_id["fixture-short"]["reason"] == "10 chars < min_chars 20"
    assert by_id["fixture-empty"]["url"] == "https://example.org/fixture-empty"
    info = read_dataset_info(built_dataset)
    assert info["excluded"] == len(excluded) and info["documents_read"] == len(read_ids)


def test_rerun_same_config_is_a_no_op(built_dataset, build_fixture, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)  # the shared one is read-only: a rerun revalidates it
    before = {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
    cfg = load_config(DataConfig, build_fixture[2], [f"output={out}", "build.workers=1"])  # may change
    result = build(cfg, **QUIET)
    assert result.ok
    assert {p: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == before


def test_changed_config_is_refused(built_dataset, build_fixture):
    before = (built_dataset / "build.json").read_bytes()
    cfg = load_config(DataConfig, build_fixture[2], ["filters.min_int_score=4", "shards.seed=8"])
    with pytest.raises(
        BuildError, match=r"different config.*filters.min_int_score: 3 → 4.*shards.seed: 7 → 8"
    ):
        build(cfg, **QUIET)
    assert (built_dataset / "build.json").read_bytes() == before


def with_post_processor(src: Path, dst: Path, template: str, token: str) -> Path:
    tok = Tokenizer.from_file(str(src))
    tok.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(token, tok.token_to_id(token))]
    )
    tok.save(str(dst))
    return dst


@pytest.mark.parametrize("trap", ["eos", "bos"])
def test_double_separator_trap_through_the_build(built_dataset, build_fixture, tmp_path, trap):
    # A tokenizer saved with a post-processor that appends the separator (or prepends a BOS)
    # must produce exactly the ids of the plain tokenizer: one separator, no BOS.
    _, tokenizer_path, config = build_fixture
    if trap == "eos":
        tok_path = with_post_processor(tokenizer_path, tmp_path / "tok.json", f"$A {SEP}", SEP)
        assert Tokenizer.from_file(str(tok_path)).encode("hello").ids[-1] == 0  # the trap is armed
    else:
        tok_path = with_post_processor(tokenizer_path, tmp_path / "tok.json", f"{BOS} $A", BOS)
        assert Tokenizer.from_file(str(tok_path)).encode("hello").ids[0] == 1
    out = tmp_path / "ds"
    cfg = load_config(DataConfig, config, [f"output={out}", f"tokenizer.path={tok_path}", "build.workers=1"])
    assert build(cfg, **QUIET).ok
    got, _ = read_by_webdataset(out, np.dtype("<u2"))
    want, _ = read_by_webdataset(built_dataset, np.dtype("<u2"))
    assert got.keys() == want.keys()
    for key in want:
        assert np.count_nonzero(got[key] == 0) == 1 and got[key][-1] == 0
        assert 1 not in got[key]  # no BOS
        assert np.array_equal(got[key], want[key])


@pytest.mark.parametrize("position", ["after", "before"])
def test_an_export_of_a_tokenizer_that_adds_a_bos_frames_text_as_the_shards(
    build_fixture, tmp_path, position
):
    """A dataset built with a foreign tokenizer whose post-processor adds a BOS (Llama-3's
    TemplateProcessing and <|begin_of_text|>, Llama-2's <s>): the export shipped that tokenizer.json
    as is while its tokenizer_config.json said bos = eos = the separator, so every default encode
    (transformers, pipelines, vLLM) started with an id the shards never held (review R25a 1). The
    export frames a text as the dataset's separator contract does, and says so."""
    import json

    import torch

    from tokenization.separator import DocumentEncoder, SeparatorPolicy
    from training.checkpoint.hf_export import export_hf
    from training.model import PRESETS, Transformer

    tr = pytest.importorskip("transformers")

    _, tokenizer_path, config = build_fixture
    foreign = Tokenizer.from_file(str(tokenizer_path))
    bos = foreign.token_to_id(BOS)
    foreign.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    foreign.save(str(tmp_path / "tokenizer.json"))
    dataset = tmp_path / "ds"
    sets = [
        f"output={dataset}",
        f"tokenizer.path={tmp_path / 'tokenizer.json'}",
        f"tokenizer.position={position}",
    ]
    assert build(
        load_config(DataConfig, config, [*sets, "build.tasks=1", "build.workers=1"]), log=lambda *a: None
    ).ok
    sep = read_dataset_info(dataset)["separator"]
    text = "Hello world, and the quick brown fox."
    framed = DocumentEncoder(foreign, SeparatorPolicy(sep["token"], position)).encode(text).tolist()
    want = framed[:-1] if position == "after" else framed  # a prompt: no separator after it
    assert foreign.encode(text).ids[0] == bos  # the trap is armed

    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny"].replace(vocab_size=read_dataset_info(dataset)["vocab_size"]))
    with torch.no_grad():
        model.init_weights()
    out = export_hf(model.state_dict(), model.cfg, dataset, tmp_path / "export", meta={"step": 1})
    tok = tr.AutoTokenizer.from_pretrained(str(out))
    assert tok(text).input_ids == want and bos not in tok(text).input_ids
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids == want  # vLLM, TGI read it
    # The claims agree with what encode does: bos is the separator, added only where training put it.
    claims = json.loads((out / "tokenizer_config.json").read_text())
    assert tok.bos_token_id == sep["id"] and claims["add_bos_token"] == (want[0] == sep["id"])


@pytest.mark.parametrize("position", ["after", "before"])
def test_an_export_of_a_roberta_tokenizer_keeps_its_offset_trimming(build_fixture, position):
    """A RobertaProcessing post-processor adds <s> … </s> (which the export drops: the shards hold
    none) and trims offsets as ByteLevel does: the export dropped it whole, and the offsets of a text
    with spaces changed (review R25i D2). The trimming is kept, as a ByteLevel post-processor."""
    from training.contract.dataset_format import framed_as_trained

    _, tokenizer_path, _ = build_fixture
    roberta = Tokenizer.from_file(str(tokenizer_path))
    bos = roberta.token_to_id(BOS)
    roberta.post_processor = processors.RobertaProcessing((BOS, bos), (BOS, bos), trim_offsets=True)
    separator = {"token": BOS, "id": bos, "position": position}
    exported = Tokenizer.from_str(framed_as_trained(roberta.to_str(), separator))
    texts = [" Hello  world, and the  quick fox. ", "a   b\n c"]
    for text in texts:
        plain = roberta.encode(text, add_special_tokens=False)
        got = exported.encode(text)
        first = [bos] if position == "before" else []
        assert got.ids == first + plain.ids  # no <s> … </s>: framed as the shards
        assert got.offsets[len(first) :] == plain.offsets  # trimmed as the tokenizer trims them
    untrimmed = Tokenizer.from_str(roberta.to_str())
    untrimmed.post_processor = None
    assert untrimmed.encode(texts[0]).offsets != roberta.encode(texts[0], add_special_tokens=False).offsets


def test_separator_before_policy(build_fixture, tmp_path):
    corpus, tokenizer_path, config = build_fixture
    out = tmp_path / "ds"
    cfg = load_config(
        DataConfig, config, [f"output={out}", "tokenizer.position=before", "build.tasks=1", "build.workers=1"]
    )
    assert build(cfg, **QUIET).ok
    info = read_dataset_info(out)
    assert info["separator"]["position"] == "before" and info["tasks"] == 1
    for ids in read_by_manifest(out, np.dtype("<u2")).values():
        assert ids[0] == 0 and np.count_nonzero(ids == 0) == 1


def test_validation_failure_fails_the_build(built_dataset, build_fixture, tmp_path):
    # A dataset damaged after its build is re-validated on rerun: the command exits non-zero.
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    shard = sorted((out / "shards").glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # inside the first document's ids
    shard.write_bytes(bytes(data))
    assert main(["data", "build", "--config", str(build_fixture[2]), "--set", f"output={out}"]) == 1


def test_more_tasks_than_files_and_an_empty_task(build_fixture, tmp_path):
    # Task 2 reads no file: it writes an empty manifest and no shard; the dataset is still whole.
    _, _, config = build_fixture
    out = tmp_path / "ds"
    lines: list[str] = []
    cfg = load_config(DataConfig, config, [f"output={out}", "build.tasks=3", "build.workers=1"])
    assert build(cfg, log=lines.append).ok
    assert any("1 tasks will have nothing to read" in line for line in lines)
    assert pq.read_table(out / "manifest" / "00002.parquet").num_rows == 0
    assert not list((out / "shards").glob("00002_*")) and read_dataset_info(out)["tasks"] == 3


def test_finalize_only_describes_what_the_tasks_wrote(built_dataset, build_fixture, tmp_path):
    # The Slurm finalize job rewrites dataset.json from the output's saved config.toml; a different
    # separator policy on its command line must not be recorded for shards built "after".
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    (out / "dataset.json").unlink()
    cfg = load_config(DataConfig, build_fixture[2], [f"output={out}", "tokenizer.position=before"])
    # a task not finished: "rerun the same command" reran the finalize, which redoes no task (RV72a small 1)
    marker = out / "logs" / "completions" / "00001"
    marker.rename(out / "marker")
    with pytest.raises(BuildError) as e:
        finalize_only(cfg, **QUIET)
    assert str(e.value) == (
        f"1 of 2 tasks did not finish; their logs are in {out / 'logs' / 'logs'}. Fix the cause and rerun "
        "the build (`gristmill data build` with the same config; --finalize-only redoes no task): the 1 "
        "finished tasks are kept, the others are redone."
    )
    (out / "marker").rename(marker)
    assert finalize_only(cfg, **QUIET).ok
    info = read_dataset_info(out)
    assert info["separator"]["position"] == "after"
    assert info["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]
    # The saved recipe and tokenizer themselves edited after the tasks ran: an edited filter was
    # sealed into dataset.json, another tokenizer recorded as the shards', exit 0 (trial RV62c S5, L1)
    (out / "dataset.json").unlink()
    recipe, tok_file = out / "config.toml", out / "tokenizer.json"
    kept_recipe, kept_tok = recipe.read_text(), tok_file.read_text()
    tok = json.loads(kept_tok)
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    edits = [
        (recipe, kept_recipe.replace("min_chars = 20", "min_chars = 30", 1), "filters.min_chars: 20 → 30"),
        (recipe, kept_recipe.replace('position = "after"', 'position = "before"'), "tokenizer.position: "),
        (tok_file, json.dumps(tok), "tokenizer.sha256: "),
    ]
    for path, text, says in edits:
        kept = path.read_text()
        path.write_text(text)
        with pytest.raises(BuildError) as e:
            finalize_only(cfg, **QUIET)
        assert str(e.value).startswith(
            f"{recipe} or {tok_file} is not what the tasks of {out} were built with (changed: {says}"
        ), e.value
        assert str(e.value).endswith("writes both files again and finalizes (the tasks' output is kept)")
        assert not (out / "dataset.json").exists()
        path.write_text(kept)
    # the way out the line gives: the build of the recipe the tasks were built with (review RV62e 3)
    recipe.write_text(kept_recipe.replace("min_chars = 20", "min_chars = 30", 1))
    assert build(load_config(DataConfig, build_fixture[2], [f"output={out}", "build.workers=1"]), **QUIET).ok
    assert "min_chars = 20" in recipe.read_text() and "min_chars = 30" not in recipe.read_text()
    assert read_dataset_info(out)["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]
    # source.path spelled otherwise for the same folder: a resume takes it as the same build, and the
    # finalize after it refused the recipe it saved (review RV62e 2)
    (out / "dataset.json").unlink()
    saved = recipe.read_text()
    folder = tomllib.loads(saved)["source"]["path"]
    recipe.write_text(saved.replace(f'path = "{folder}"', f'path = "{folder}/"', 1))
    assert recipe.read_text() != saved
    assert finalize_only(cfg, **QUIET).ok
    assert read_dataset_info(out)["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]


def test_a_tokenizer_changed_under_a_build_is_refused_naming_the_outputs_copy(
    built_dataset, build_fixture, tmp_path
):
    """tokenizer.path's file replaced (a `tokenizer train --force`) under a built or partly built output:
    the refusal offered only a new output or `rm -rf OUTPUT`, though the output keeps the tokenizer it
    was built with, and a build from that copy goes on with the work done (trial RV64b L1)."""
    out = tmp_path / "ds"
    shutil.copytree(built_dataset, out)
    (out / "dataset.json").unlink()  # a rerun, as after a kill in the finalize
    tok = json.loads(build_fixture[1].read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "retrained.json").write_text(json.dumps(tok))
    sets = [f"output={out}", "build.workers=1"]
    with pytest.raises(BuildError) as e:
        build(
            load_config(
                DataConfig, build_fixture[2], [*sets, f"tokenizer.path={tmp_path / 'retrained.json'}"]
            )
        )
    kept = out / "tokenizer.json"
    assert "(changed: tokenizer.sha256: " in str(e.value), e.value
    assert f"To go on with the tokenizer it was built with, set tokenizer.path = {str(kept)!r}." in str(
        e.value
    )
    result = build(load_config(DataConfig, build_fixture[2], [*sets, f"tokenizer.path={kept}"]), **QUIET)
    assert result.ok and result.info["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]


def _with_texts(corpus: Path, folder: Path, texts: dict[str, str]) -> Path:
    """A copy of the fixture corpus at `folder` with a file more: a document per id of `texts`."""
    shutil.copytree(corpus, folder)
    first = pq.read_table(sorted(folder.glob("*.parquet"))[0]).slice(0, 1).to_pylist()[0]
    rows = [{**first, "id": i, "text": t} for i, t in texts.items()]
    schema = pq.read_schema(folder / "part-00.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / "part-02.parquet")
    return folder


def test_a_text_holding_the_unknown_token_is_excluded_with_its_count(build_fixture, tmp_path):
    """A tokenizer with an unknown token (BPE without byte fallback, WordPiece, Unigram) encodes what its
    vocabulary cannot spell to it: a quarter of a build's ids were `<unk>`, and the build, `data
    validate` and training all said OK; only eval found it (trial RV72b F1). Such a text is excluded
    with the count, every other one kept as before."""
    from tokenizers import models, pre_tokenizers, trainers

    from tests.helpers.corpus import fixture_texts

    corpus, _, config = build_fixture
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[SEP, "<unk>"], show_progress=False)
    tok.train_from_iterator(fixture_texts(), trainer)  # every character of the corpus, none of the planted
    tok_path = tmp_path / "unk.json"
    tok.save(str(tok_path))
    folder = _with_texts(corpus, tmp_path / "corpus", {"unspellable": "A page that quotes 中文 twice: 中文."})
    out = tmp_path / "ds"
    sets = [f"output={out}", f"source.path={folder}", f"tokenizer.path={tok_path}", "build.workers=1"]
    result = build(load_config(DataConfig, config, sets), **QUIET)
    assert result.ok
    excluded = {e["id"]: e for e in read_excluded(out).to_pylist() if e["filter"] == "tokens"}
    assert list(excluded) == ["unspellable"], excluded
    assert excluded["unspellable"]["reason"].startswith("4 of its "), excluded
    assert excluded["unspellable"]["reason"].endswith(
        " tokens are the tokenizer's unknown token '<unk>' (text its vocabulary cannot spell, a word longer "
        "than its model reads, or that token quoted literally)"
    )
    assert "unspellable" not in read_manifest(out).column("id").to_pylist()
    unk = tok.token_to_id("<unk>")
    assert all(unk not in ids for ids in read_by_manifest(out, np.dtype("<u2")).values())
    from validation.audit import run_preset
    from validation.audit_views import connect

    funnel = {r["item"]: r["documents"] for r in run_preset(connect([out])[0], "summary").records()}
    assert funnel["dropped by tokens (encoded to no token, or to the unknown token)"] == 1


def test_a_text_the_tokenizer_encodes_to_nothing_is_excluded_not_a_lone_separator(build_fixture, tmp_path):
    """A tokenizer whose normalizer deletes characters (here soft hyphens and zero-width spaces, as
    BERT-style `clean_text` deletes control characters) encodes a text of only those to no token: it
    was stored as a document of the separator alone, two separators back to back in the stream, and
    the writer, `data validate` and the loader all passed it. It is excluded with its reason."""
    from tokenizers import normalizers

    corpus, tokenizer_path, config = build_fixture
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace("\u00ad", ""), normalizers.Replace("\u200b", "")]
    )
    tok_path = tmp_path / "deleting.json"
    tok.save(str(tok_path))
    texts = {f"nothing-{k}": t for k, t in enumerate(["\u00ad" * 30, "\u200b\u00ad" * 15])}
    folder = _with_texts(corpus, tmp_path / "corpus", texts)
    out = tmp_path / "ds"
    sets = [f"output={out}", f"source.path={folder}", f"tokenizer.path={tok_path}", "build.workers=1"]
    result = build(load_config(DataConfig, config, sets), **QUIET)
    assert result.ok
    by_id = {e["id"]: e for e in read_excluded(out).to_pylist()}
    assert {by_id[f"nothing-{k}"]["filter"] for k in (0, 1)} == {"tokens"}
    assert "encodes to no token" in by_id["nothing-0"]["reason"]
    assert result.info["excluded_by_filter"]["tokens"] == 2
    docs = read_by_manifest(out, np.dtype("<u2"))
    assert min(len(ids) for ids in docs.values()) > 1  # no document of the separator alone
    assert "nothing-0" not in read_manifest(out).column("id").to_pylist()
    from validation.audit import run_preset
    from validation.audit_views import connect

    funnel = {r["item"]: r["documents"] for r in run_preset(connect([out])[0], "summary").records()}
    assert funnel["dropped by tokens (encoded to no token, or to the unknown token)"] == 2
