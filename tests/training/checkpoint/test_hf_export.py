"""HF export: transformers' LlamaForCausalLM loaded from an export computes the gristmill model's
logits; a DCP checkpoint exports by step; exports are whole or absent."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.train_runs import fake_checkpoint
from training.checkpoint.hf_export import ExportError, export_checkpoint, export_hf, newest_complete_step
from training.config import TrainConfig
from training.contract.config_loader import load_config, save_config
from training.contract.dataset_format import DatasetError, read_dataset_info
from training.contract.file_lock import file_lock
from training.contract.run_layout import COMPLETE_FILE, checkpoint_dir, export_dir
from training.data.reader import DocumentTable
from training.model import PRESETS, Transformer

tr = pytest.importorskip("transformers")


def _model(dataset: Path, tied: bool, seed: int = 0) -> Transformer:
    vocab = read_dataset_info(dataset)["vocab_size"]
    torch.manual_seed(seed)
    model = Transformer(PRESETS["tiny"].replace(vocab_size=vocab, tie_embeddings=tied, rope_theta=123456.0))
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():  # norms start at 1.0: perturb them so a swapped norm shows
            p.add_(0.01 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_with_the_same_logits(built_dataset, tmp_path, tied):
    model = _model(built_dataset, tied)
    out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "export", meta={"step": 7})
    hf = tr.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    x = torch.randint(0, model.cfg.vocab_size, (2, 48))
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max().item()
    assert diff < 1e-4, f"max abs logit difference {diff}"

    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == model.cfg.rope_theta
    info = read_dataset_info(built_dataset)
    tok = tr.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids(tok.eos_token) == info["separator"]["id"] == config["eos_token_id"]
    # The exported tokenizer adds nothing around a text: the separator framing is eval's job, once.
    assert tok("Hello world")["input_ids"] == tok.encode("Hello world", add_special_tokens=False)
    # The tokenizer knows the model's context length (without it transformers assumes 1e30 tokens).
    assert tok.model_max_length == model.cfg.max_seq_len == config["max_position_embeddings"]
    meta = json.loads((out / "gristmill_export.json").read_text())
    assert meta["step"] == 7 and meta["dataset_fingerprint"] == info["fingerprint"]


def _run_with_checkpoints(run: Path, dataset: Path, steps: dict[int, bool]) -> dict[int, Transformer]:
    """A run directory whose checkpoints hold different weights per step; steps[s] = complete?"""
    import torch.distributed.checkpoint as dcp

    from training.checkpoint.state import ModelState

    cfg = load_config(TrainConfig, None, [f"data.dataset={dataset}", f"run.output_dir={run}"])
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    models = {}
    for step, complete in steps.items():
        models[step] = _model(dataset, tied=False, seed=step)
        ckpt = checkpoint_dir(run, step)
        dcp.save({"model": ModelState(models[step])}, checkpoint_id=str(ckpt))
        if complete:
            (ckpt / COMPLETE_FILE).write_text("{}")
    return models


def test_export_checkpoint_takes_the_newest_complete_step(built_dataset, tmp_path):
    from safetensors.torch import load_file

    run = tmp_path / "run"
    models = _run_with_checkpoints(run, built_dataset, {10: True, 20: True, 30: False})
    assert newest_complete_step(run) == 20
    out = export_checkpoint(run)
    assert out == export_dir(run, 20)
    weights = load_file(out / "model.safetensors")
    torch.testing.assert_close(weights["model.layers.1.mlp.down_proj.weight"],
                               models[20].layers["1"].feed_forward.w2.weight, rtol=0, atol=0)  # fmt: skip
    assert not torch.equal(weights["model.norm.weight"], models[10].norm.weight)
    assert export_checkpoint(run, 20) == out  # an existing export is returned, not rewritten
    # --out a dangling link: one line naming it, not "cannot write .NAME.tmp-…: Not a directory; make
    # the folder writable" after the whole export was written (trial RV63b 13)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    dangling = r"^--out .*/link is a link to .*/nowhere, which does not exist: remove"
    with pytest.raises(ExportError, match=dangling):
        export_checkpoint(run, 20, out=tmp_path / "link")

    with pytest.raises(
        ExportError, match=r"no complete checkpoint of step 30: step 30's checkpoint is incomplete.*: 10, 20$"
    ):
        export_checkpoint(run, 30)
    assert not export_dir(run, 30).exists()


def test_an_export_refuses_a_tokenizer_the_run_did_not_train_with(built_dataset, tmp_path):
    """The tokenizer an export ships is the dataset's RUN/config.toml names, as given: a relative path
    led elsewhere from another working directory, and the export shipped another tokenizer, exit 0.
    RUN/data_plan.json decides: its tokenizer hash (a dataset rebuilt with the same tokenizer is the
    same to an export), or for a run that recorded none, its fingerprint."""
    run = tmp_path / "run"
    _run_with_checkpoints(run, built_dataset, {10: True, 20: True, 30: True})
    info = read_dataset_info(built_dataset)

    def recorded(**source) -> None:
        (run / "data_plan.json").write_text(json.dumps({"sources": [{"name": "data", **source}]}))

    recorded(fingerprint="f" * 64)  # another dataset, no tokenizer recorded (an older run)
    with pytest.raises(ExportError, match=r"source 'data': .* is not the dataset this run trained on .*"
                       r"no tokenizer hash.*; the export would ship another tokenizer"):  # fmt: skip
        export_checkpoint(run, 10)
    recorded(fingerprint="f" * 64, tokenizer_sha256="e" * 64)  # another tokenizer
    ours = info["tokenizer_sha256"][:12]
    with pytest.raises(
        ExportError, match=rf"tokenized with tokenizer sha256 {ours}…, not the run's \(eeeeeeeeeeee… in "
    ):
        export_checkpoint(run, 10)
    # the same shards under another tokenizer's record: dataset.json edited with its tokenizer.json, and
    # the export shipped the edited one (trial RV70d 6)
    recorded(fingerprint=info["fingerprint"], tokenizer_sha256="e" * 64)
    with pytest.raises(
        ExportError, match=rf"records tokenizer sha256 {ours}… for the shards this run trained on, tokenized "
        r"with eeeeeeeeeeee… \(.*data_plan.json\): its tokenizer.json and dataset.json were edited after the "
        "build; restore them; the export would ship another tokenizer"
    ):  # fmt: skip
        export_checkpoint(run, 10)
    recorded(fingerprint="f" * 64, tokenizer_sha256=info["tokenizer_sha256"])  # rebuilt, same tokenizer
    assert export_checkpoint(run, 10) == export_dir(run, 10)
    # its record names both: the data trained on, and the dataset whose tokenizer it ships (the latter
    # alone read as the data trained on: review R16g 1a)
    meta = json.loads((export_dir(run, 10) / "gristmill_export.json").read_text())
    assert meta["trained_on"] == [{"name": "data", "fingerprint": "f" * 64}]
    assert meta["dataset_fingerprint"] == info["fingerprint"]
    # only the sources a phase begun by the step reads (an anneal-only source is not yet: R16i F2)
    from training.checkpoint.hf_export import trained_on

    plan = {
        "sources": [{"name": "data", "fingerprint": "f" * 64}, {"name": "anneal", "fingerprint": "a" * 64}],
        "phases": [{"steps": 100, "weights": [1, 0]}, {"steps": 20, "weights": [0, 1]}],
    }
    (run / "data_plan.json").write_text(json.dumps(plan))
    assert trained_on(run, 10) == {"trained_on": [{"name": "data", "fingerprint": "f" * 64}]}
    assert [s["name"] for s in trained_on(run, 101)["trained_on"]] == ["data", "anneal"]
    assert trained_on(run, 0) == {}
    plan["skips"] = [{"checkpoint_step": 100, "first_step": 101, "last_step": 110}]  # a rewind's skip
    (run / "data_plan.json").write_text(json.dumps(plan))
    assert [s["name"] for s in trained_on(run, 110)["trained_on"]] == ["data"]  # anneal skipped so far
    assert [s["name"] for s in trained_on(run, 111)["trained_on"]] == ["data", "anneal"]
    recorded(fingerprint=info["fingerprint"])  # the dataset itself
    assert export_checkpoint(run, 20) == export_dir(run, 20)
    (run / "data_plan.json").write_text(json.dumps({"sources": [{"name": "web", "fingerprint": "f" * 64}]}))
    with pytest.raises(
        ExportError, match=r"source 'data' is not one this run trained on \(.* records 'web'\)"
    ):
        export_checkpoint(run, 30)  # a source renamed in config.toml


def test_an_export_refuses_a_damaged_dataset_tokenizer(built_dataset, tmp_path):
    """The dataset's tokenizer.json damaged after training: the export copied it, recorded its
    checksum and verified, exit 0 (review R14c F10). It is checked against dataset.json's record."""
    dataset = tmp_path / "dataset"
    shutil.copytree(built_dataset, dataset)
    run = tmp_path / "run"
    _run_with_checkpoints(run, dataset, {10: True})
    tok = dataset / "tokenizer.json"
    tok.write_bytes(tok.read_bytes().replace(b'"', b"'", 1))
    with pytest.raises(ExportError, match=rf"^{tok} has sha256 .* records .*: the tokenizer was replaced or"):
        export_checkpoint(run, 10)
    assert not export_dir(run, 10).exists()
    # deleted: the export shipped none, verified and said "+ tokenizer", exit 0, and the loader read
    # on without it (review R21b F1)
    tok.unlink()
    with pytest.raises(ExportError, match=rf"^{tok} is missing, but .* records tokenizer_sha256 .*: the"):
        export_checkpoint(run, 10)
    assert not export_dir(run, 10).exists()
    with pytest.raises(DatasetError, match=rf"^{tok} is missing, but .* records tokenizer_sha256"):
        DocumentTable(dataset)


def test_a_damaged_export_whose_checkpoint_is_gone_is_kept(tmp_path):
    """Retention keeps exports whose checkpoints it deleted: "delete it and re-export it from its
    checkpoint" then lost the only copy of the weights (review R14f F1). Without its checkpoint the
    advice is a copy, the export kept; with it, the export is moved aside, never deleted (RV32l F4)."""
    from training.checkpoint.hf_export import verify_export

    def advice(step: int) -> str:
        export = export_dir(run, step)
        export.mkdir(parents=True, exist_ok=True)
        (export / "model.safetensors").write_bytes(b"weights")
        (export / "gristmill_checksums.json").write_text('{"files": ')
        with pytest.raises(ExportError) as refused:
            verify_export(export)
        return str(refused.value)

    run = tmp_path / "run"
    assert "keep the export meanwhile: its checkpoint is gone" in advice(4) and "delete" not in advice(4)
    # a checkpoint that verifies: re-exported from it; one complete but damaged: kept (review R14g F1)
    ckpt = fake_checkpoint(run, 4)
    assert f"move {export_dir(run, 4)} aside and export it again from its checkpoint" in advice(4)
    (ckpt / "__0_0.distcp").write_bytes(b"y" * 10)
    assert "keep the export meanwhile: its checkpoint is gone or damaged" in advice(4)
    # step 0 of a run from a base: exported again from the base (review R14g F2)
    assert f"move {export_dir(run, 0)} aside and export it again from the run's base" in advice(0)


def test_export_is_whole_or_absent(built_dataset, tmp_path):
    model = _model(built_dataset, tied=True)
    state = model.state_dict()
    del state["layers.0.attention.wq.weight"]
    with pytest.raises(ExportError, match="lacks 1 model tensors"):
        export_hf(state, model.cfg, built_dataset, tmp_path / "e")
    state = model.state_dict()
    with pytest.raises(ExportError, match="dtype"):  # fails after the temporary dir exists
        export_hf(state, model.cfg, built_dataset, tmp_path / "e", dtype=torch.int64)
    assert list(tmp_path.iterdir()) == []  # neither the export nor its temporary directory

    # what a killed export left (a resume writes the export again, beside it: ~5 GB at 1.24B, trial
    # RV61b F2) goes, told by its lock file, free, in any process namespace (review RV61f F3); a
    # live writer's (its lock held) and an older gristmill's (no lock file) stay
    left = {who: tmp_path / f".e.tmp-{who}" for who in ("dead-1", "live-2", "older-3")}
    for folder in left.values():
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    for who in ("dead-1", "live-2"):
        (tmp_path / f".e.tmp-{who}.lock").write_text("")
    with file_lock(tmp_path / ".e.tmp-live-2.lock"):
        out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "e")
    assert [p.exists() for p in left.values()] == [False, True, True]
    assert not (tmp_path / ".e.tmp-dead-1.lock").exists()
    for path in [*list(left.values())[1:], tmp_path / ".e.tmp-live-2.lock"]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    files = {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.iterdir()}
    # The same weights exported again meanwhile (eval --watch, `gristmill export` and the trainer race
    # for a step: the loser exited 2, "remove it by hand", beside a good export): the one there is it.
    assert export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "e") == out
    shutil.copytree(built_dataset, tmp_path / "alias")  # the dataset at another path (a bucket's cache)
    assert export_hf(model.state_dict(), model.cfg, tmp_path / "alias", tmp_path / "e") == out
    other = _model(built_dataset, tied=True, seed=1)
    with pytest.raises(ExportError, match="already exists with other contents; exports are permanent"):
        export_hf(other.state_dict(), other.cfg, built_dataset, tmp_path / "e")
    assert {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in out.iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "e"]  # no temporary directory left


def test_an_export_from_a_base_encodes_with_the_tokenizer_json_the_data_was_built_with(tmp_path):
    """A base whose tokenizer_config.json names GPT2Tokenizer (GPT-2-family repos) over a tokenizer.json
    that splits digits: AutoTokenizer rebuilt the tokenizer from the vocabulary and lost the split, so
    eval scored the model on ids the dataset never held."""
    from tokenizers import pre_tokenizers

    from tokenization.separator import DocumentEncoder, SeparatorPolicy
    from tokenization.tokenizer_io import train_bpe
    from training.checkpoint.hf_export import write_tokenizer

    base = tmp_path / "base"
    base.mkdir()
    tok = train_bpe(
        ["The year 2024 had 365 days and 12345 visitors. hello world"] * 200, 600, ["<|endoftext|>"]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.save(str(base / "tokenizer.json"))
    sep = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": sep,
              "eos_token": sep, "unk_token": sep, "model_max_length": 2048}  # fmt: skip
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "export"
    out.mkdir()
    files = {name: base / name for name in ("tokenizer.json", "tokenizer_config.json")}
    write_tokenizer(tmp_path / "no-dataset", None, out, files)
    text = "In 2024, 12345 people visited."
    trained = DocumentEncoder(tok, SeparatorPolicy("<|endoftext|>")).encode(text).tolist()[:-1]
    assert tr.AutoTokenizer.from_pretrained(str(out))(text, add_special_tokens=False)["input_ids"] == trained
    kept = json.loads((out / "tokenizer_config.json").read_text())
    assert kept["model_max_length"] == 2048 and kept["bos_token"] == "<|endoftext|>"  # the base's own


def test_an_export_of_a_tokenizer_saved_with_bpe_dropout_encodes_as_the_build_did(built_dataset, tmp_path):
    """A dataset whose tokenizer.json carries BPE dropout (saved from a training setup): the build
    encodes without it, but the export and the in-training eval (the same files) copied it, so every
    eval request was encoded with random merges, another way at each eval (review R11b)."""
    import shutil

    from tokenizers import Tokenizer

    from tokenization.separator import DocumentEncoder, SeparatorPolicy
    from training.checkpoint.hf_export import write_tokenizer
    from training.checkpoint.hf_import import check_base_data

    dataset = tmp_path / "dataset"
    shutil.copytree(built_dataset, dataset)
    spec = json.loads((dataset / "tokenizer.json").read_text())
    spec["model"]["dropout"] = 0.5
    (dataset / "tokenizer.json").write_text(json.dumps(spec))
    info = json.loads((dataset / "dataset.json").read_text())  # the build records the file it was given
    info["tokenizer_sha256"] = hashlib.sha256((dataset / "tokenizer.json").read_bytes()).hexdigest()
    (dataset / "dataset.json").write_text(json.dumps(info))
    sep = read_dataset_info(dataset)["separator"]["token"]
    text = "The quick brown fox jumps over the lazy dog, again and again, in 2024."
    built = DocumentEncoder(Tokenizer.from_file(str(dataset / "tokenizer.json")), SeparatorPolicy(sep))
    trained = built.encode(text).tolist()[:-1]
    for base in ({}, {"tokenizer.json": dataset / "tokenizer.json"}):  # the dataset's, a base's
        out = tmp_path / f"export-{len(base)}"
        out.mkdir()
        write_tokenizer(dataset, _model(built_dataset, tied=True).cfg, out, base)
        tok = tr.AutoTokenizer.from_pretrained(str(out))
        assert all(tok(text, add_special_tokens=False)["input_ids"] == trained for _ in range(5)), base
        # The export is a base for runs on the data it trained on: the same tokenizer (review R11c).
        info = read_dataset_info(dataset)
        ids = {"bos_token_id": info["separator"]["id"], "eos_token_id": info["separator"]["id"]}
        (out / "config.json").write_text(json.dumps(ids))
        check_base_data(out, dataset, info, info["vocab_size"])
    # Without dropout, a base's file is kept byte for byte (CRLF line ends too), and the padding it
    # sets (where transformers finds a pad token tokenizer_config.json does not name) stays.
    tok = Tokenizer.from_file(str(built_dataset / "tokenizer.json"))
    tok.enable_padding(pad_token=sep, pad_id=tok.token_to_id(sep))
    crlf = tmp_path / "base" / "tokenizer.json"
    crlf.parent.mkdir()
    crlf.write_bytes(tok.to_str(pretty=True).replace("\n", "\r\n").encode())
    out = tmp_path / "export-padded"
    out.mkdir()
    write_tokenizer(dataset, _model(built_dataset, tied=True).cfg, out, {"tokenizer.json": crlf})
    assert (out / "tokenizer.json").read_bytes() == crlf.read_bytes()
    assert tr.AutoTokenizer.from_pretrained(str(out)).pad_token == sep


def test_a_base_without_tokenizer_config_exports_the_tokens_of_its_config_ids(built_dataset, tmp_path):
    """A base of config.json, weights and tokenizer.json only: its export kept the base's bos/eos ids
    in config.json but named the separator as bos and eos in tokenizer_config.json, so the two
    disagreed (review R3). The tokenizer now names the tokens of the base's ids (the first of a
    list), where they are special tokens of it: an ordinary one ("!") is the separator (R28a M1)."""
    from tokenizers import Tokenizer

    from training.checkpoint.hf_export import write_tokenizer

    base = tmp_path / "base"
    base.mkdir()
    vocab = Tokenizer.from_file(str(built_dataset / "tokenizer.json"))
    sep = read_dataset_info(built_dataset)["separator"]
    special = {t["id"] for t in json.loads((built_dataset / "tokenizer.json").read_text())["added_tokens"]}
    bos = eos = min(special - {sep["id"]})  # <|begin_of_text|>: the dataset's one special token besides sep
    ordinary = min(set(range(5)) - special)
    files = {"config.json": base / "config.json", "tokenizer.json": built_dataset / "tokenizer.json"}
    for i, (eos_ids, want) in enumerate([([eos, sep["id"]], eos), ([ordinary, sep["id"]], sep["id"])]):
        (base / "config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos_ids}))
        out = tmp_path / f"export{i}"
        out.mkdir()
        write_tokenizer(built_dataset, _model(built_dataset, tied=True).cfg, out, files)
        tok = tr.AutoTokenizer.from_pretrained(str(out))
        assert (tok.bos_token_id, tok.eos_token_id) == (bos, want), eos_ids
        assert (tok.bos_token, tok.eos_token) == (vocab.id_to_token(bos), vocab.id_to_token(want)), eos_ids
    # without a base: bos and eos are the separator, as before
    write_tokenizer(built_dataset, _model(built_dataset, tied=True).cfg, tmp_path, {})
    assert json.loads((tmp_path / "special_tokens_map.json").read_text()) == {
        "bos_token": sep["token"],
        "eos_token": sep["token"],
    }


@pytest.mark.parametrize(
    "key, value",
    [
        ("unk_token", '"'),
        ("additional_special_tokens", ['"']),
        ("added_tokens_decoder", {"3": {"content": '"', "special": True}}),
    ],
)
def test_tokenizer_files_autotokenizer_reads_otherwise_than_tokenizer_json_are_refused(
    built_dataset, tmp_path, key, value
):
    """The check that ends write_tokenizer (review RV28f F1): tokenizer files that make AutoTokenizer
    treat a token as added or special that tokenizer.json does not (here written into an export's
    files by hand, past the rule for a base's files: what a later transformers reads from another key)
    are one line naming the export, the token and the key, not an eval scoring ids the model never
    trained on."""
    from training.checkpoint.hf_export import check_export_tokenizer, write_tokenizer

    out = tmp_path / "export"
    out.mkdir()
    write_tokenizer(built_dataset, _model(built_dataset, tied=True).cfg, out)
    check_export_tokenizer(out, tmp_path / "named")  # as written: nothing to say
    spec = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(spec | {key: value}))
    with pytest.raises(ExportError) as e:
        check_export_tokenizer(out, tmp_path / "named")
    line = str(e.value)
    config = "tokenizer_config.json"  # gristmill's own file: no base's to name
    assert "\n" not in line and line.startswith(
        f"{tmp_path / 'named'}: {key} of {config}: AutoTokenizer ("
    ), line
    assert "'\"' (id 3)" in line and line.endswith(f"; leave {key} out of {config}"), line
    # a special '"': the default encoding splits it out of a text, gristmill's eval does not (review RV29a F4)
    assert "its users' tok(text) encodes texts otherwise than the data (not gristmill's eval" in line, line
    # a training box without transformers (the eval extra) writes the export: nothing there loads it
    with pytest.MonkeyPatch.context() as m:
        m.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
        check_export_tokenizer(out, tmp_path / "named")


def test_a_tokenizer_key_transformers_loads_but_cannot_encode_with_is_one_line(built_dataset, tmp_path):
    """tokenizer_config.json's model_max_length "abc" loads, then every encode raises a TypeError in
    transformers (its too-long check compares the length with it): a traceback from the export, the
    run start and eval's first encode before (review RV34c). Now one line naming the key, its file and
    the fix; a value transformers encodes with (a float, null) passes."""
    from training.checkpoint.hf_export import check_export_tokenizer, write_tokenizer

    out = tmp_path / "export"
    out.mkdir()
    write_tokenizer(built_dataset, _model(built_dataset, tied=True).cfg, out)
    spec = json.loads((out / "tokenizer_config.json").read_text())
    for fine in (1.5, None):
        (out / "tokenizer_config.json").write_text(json.dumps(spec | {"model_max_length": fine}))
        check_export_tokenizer(out, tmp_path / "named")
    (out / "tokenizer_config.json").write_text(json.dumps(spec | {"model_max_length": "abc"}))
    with pytest.raises(ExportError) as e:
        check_export_tokenizer(out, tmp_path / "named")
    line = str(e.value)
    assert "\n" not in line and line.startswith(
        f"{tmp_path / 'named'}: model_max_length of tokenizer_config.json: AutoTokenizer ("
    ), line
    assert "cannot encode with its tokenizer files (TypeError: " in line, line
    assert line.endswith("leave model_max_length out of tokenizer_config.json"), line


def test_a_checkpoint_retention_deletes_while_it_is_read_is_gone_not_damaged(
    built_dataset, tmp_path, monkeypatch
):
    """`gristmill eval --watch` beside a running trainer: retention (checkpoint.keep_last) deleted the
    checkpoint being read, and the export said it was damaged and to restore it from a copy."""
    import shutil

    from training.checkpoint import hf_export

    run = tmp_path / "run"
    _run_with_checkpoints(run, built_dataset, {10: True, 20: True})
    verify = hf_export.verify_checkpoint

    def deleted_meanwhile(ckpt):  # the trainer's retention, at the worst moment
        shutil.rmtree(ckpt)
        return verify(ckpt)

    monkeypatch.setattr(hf_export, "verify_checkpoint", deleted_meanwhile)
    gone = r"no complete checkpoint of step 10 any more \(deleted while it was read\): "
    gone += r".*; complete checkpoints: 20$"
    with pytest.raises(ExportError, match=gone) as e:
        export_checkpoint(run, 10)
    assert "damaged" not in str(e.value)
