"""[model] init_from: a Hugging Face LlamaForCausalLM directory or hub id as the starting point (issue 30).

Checked, not trusted: after loading, gristmill's logits equal stock transformers' on a fixed batch
(float32 CPU) for GQA, tied and untied embeddings, sharded files, bf16 weights upcast, llama3 RoPE
scaling in both config spellings; 20 training steps equal transformers + torch's AdamW on the same
windows; what gristmill cannot compute exactly is one line; the data must match the base
(tokenizer, vocabulary, separator) before step 1; a resume with another base is refused, one after
kill -9 with the base deleted is bit-identical; a hub id (the stand-in hub) is fetched by rank 0
and pinned to its commit; step 0 is the base (its eval first, its export bit for bit).
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import forked
from tests.helpers.hub_server import HubServer, point_hub_at
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_same_checkpoint,
    losses,
    metrics,
    one_error_line,
    overrides,
    torchrun_cmd,
    wait_for_step,
)
from training.checkpoint.base_record import record_base, record_base_of_copy
from training.checkpoint.base_source import HUB_FILES, locate_base
from training.checkpoint.export_advice import export_fix
from training.checkpoint.hf_export import ExportError, export_checkpoint, export_hf, verify_export
from training.checkpoint.hf_import import (
    BaseModelError,
    base_model_fields,
    base_sha256,
    check_base_data,
    load_base_weights,
    read_base_config,
)
from training.checkpoint.model_config import resolve_model_config
from training.checkpoint.record import read_complete_record
from training.config import ModelSection
from training.contract.config_loader import ConfigError
from training.contract.dataset_format import file_sha256, read_dataset_info
from training.contract.errors import GristmillError
from training.contract.run_layout import COMPLETE_FILE, checkpoint_dir, complete_steps, eval_dir, export_dir
from training.model import ModelConfig, Transformer
from training.train import load_train_config, train
from training.train import main as train_main

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

transformers = pytest.importorskip("transformers")

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}  # fmt: skip


def make_base(path: Path, *, rope: dict | None = None, dtype=torch.float32, shard: bool = False, **shape):
    """A random-init LlamaForCausalLM saved to `path`; returns the in-memory model (float32, eval)."""
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0} | (rope or {})
    config = transformers.LlamaConfig(**(SHAPE | shape), rope_parameters=rope_parameters)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).to(dtype)
    hf.save_pretrained(path, max_shard_size="100KB" if shard else "1GB")
    if dtype != torch.float32:  # hf.float() would also round-trip RoPE's inv_freq buffer through dtype
        hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    return hf.eval()


def gristmill_model(path: Path) -> Transformer:
    model = Transformer(ModelConfig(**base_model_fields(path)))
    load_base_weights(model, path)
    return model.eval()


def assert_same_logits(ours: Transformer, hf, seq: int = 48) -> None:
    ids = torch.randint(0, ours.cfg.vocab_size, (2, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids).logits.float()
        got = ours(ids)
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= 1e-5, rel


def to_v4_spelling(path: Path) -> None:
    """config.json as transformers 4 writes it: rope_theta at the top, scaling under rope_scaling."""
    c = json.loads((path / "config.json").read_text())
    params = c.pop("rope_parameters")
    c["rope_theta"] = params.pop("rope_theta")
    c["rope_scaling"] = None if params["rope_type"] == "default" else params
    (path / "config.json").write_text(json.dumps(c))


@pytest.mark.parametrize(
    "case, kwargs",
    [
        ("gqa-untied", {}),
        ("tied", {"tie_word_embeddings": True}),
        ("mha-sharded", {"num_key_value_heads": 4, "shard": True}),
        ("bf16-upcast", {"dtype": torch.bfloat16}),
        ("llama3-v5", {"rope": LLAMA3, "tie_word_embeddings": True}),
        ("llama3-v4", {"rope": LLAMA3, "shard": True}),
        # one band edge (it was refused: RV52a F5; transformers computes it)
        ("llama3-equal-factors", {"rope": LLAMA3 | {"low_freq_factor": 2.0, "high_freq_factor": 2.0}}),
    ],
)
def test_logits_equal_transformers(tmp_path, case, kwargs):
    hf = make_base(tmp_path, **kwargs)
    if case.endswith("v4"):
        to_v4_spelling(tmp_path)
        assert "rope_parameters" not in json.loads((tmp_path / "config.json").read_text())
    ours = gristmill_model(tmp_path)
    if case.startswith("llama3"):
        assert ours.cfg.rope_type == "llama3" and ours.cfg.rope_original_max_seq_len == 32
        assert ours.cfg.max_seq_len > 32  # positions past the original context: the scaling matters
    if "shard" in kwargs:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    assert ours.output.weight.dtype == torch.float32
    assert_same_logits(ours, hf, seq=120 if case.startswith("llama3") else 48)


def test_a_base_with_a_single_file_and_shards_is_the_model_transformers_loads(tmp_path):
    """A folder holding model.safetensors and a sharded copy (a hub repo with both is fetched whole;
    a re-save beside an older one) is, to transformers, its model.safetensors: the run read the
    shards' weights instead, and trained, exported and scored another model than users load."""
    make_base(tmp_path / "shards", shard=True)
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE)).eval()
    hf.save_pretrained(tmp_path / "single")
    base = tmp_path / "shards"  # now both: its shards and index, and the other model's single file
    shutil.copy(tmp_path / "single" / "model.safetensors", base / "model.safetensors")
    loaded = transformers.LlamaForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    assert_same_logits(gristmill_model(tmp_path / "single"), loaded)  # transformers reads the single file
    assert_same_logits(gristmill_model(base), loaded)


def test_llama3_scaling_is_not_the_default_rope(tmp_path):
    """Negative control: the same weights with the scaling dropped give other logits."""
    hf = make_base(tmp_path, rope=LLAMA3)
    fields = base_model_fields(tmp_path) | {"rope_type": "default"}
    model = Transformer(ModelConfig(**fields))
    load_base_weights(model, tmp_path)
    with pytest.raises(AssertionError):
        assert_same_logits(model.eval(), hf, seq=120)


@pytest.mark.parametrize(
    "edit, key",
    [
        ({"attention_bias": True}, "attention_bias = true"),
        ({"mlp_bias": True}, "mlp_bias = true"),
        ({"architectures": ["MistralForCausalLM"]}, "architectures"),
        ({"sliding_window": 4096}, "sliding_window = 4096"),
        ({"head_dim": 32}, "head_dim = 32"),
        # named as the file and key say it, not ModelConfig's n_kv_heads under "model" (R28a m1)
        ({"num_key_value_heads": 3}, "num_key_value_heads = 3 does not divide num_attention_heads = 4"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, '"yarn"'),
        # what transformers versions read differently: a θ inside rope_scaling (5 reads it, 4 the top
        # level's), `type` beside `rope_type` (4 copies it over); gristmill read neither (trial RV63b 1)
        (
            {
                "rope_parameters": None,
                "rope_theta": 1e4,
                "rope_scaling": {"rope_type": "default", "rope_theta": 5e5},
            },
            "rope_scaling.rope_theta = 500000.0 and rope_theta = 10000.0 describe different RoPE",
        ),
        (
            {"rope_parameters": None, "rope_scaling": {"rope_type": "default", "type": "llama3"}},
            'rope_scaling.type = "llama3" and rope_scaling.rope_type = "default" describe different RoPE',
        ),
        # numbers that are none, or no number: tracebacks, or NaN from step 1 (trial RV63b 6, 7)
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": "abc"}},
            'rope_parameters.rope_theta = "abc" is not a positive number',
        ),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
            "rope_parameters.rope_theta = 0 is not a positive number",
        ),
        ({"rms_norm_eps": -1}, "rms_norm_eps = -1 is not a positive number"),
        ({"rms_norm_eps": None}, "rms_norm_eps = null is not a positive number"),
        ({"max_position_embeddings": None}, "max_position_embeddings = null is not a positive integer"),
        ({"max_position_embeddings": 256.5}, "max_position_embeddings = 256.5 is not a positive integer"),
        ({"rms_norm_eps": float("inf")}, "rms_norm_eps = Infinity is not a positive number"),
        # the top level's θ named where rope_parameters holds none (review RV63g 7)
        (
            {"rope_theta": 0, "rope_parameters": {"rope_type": "default"}},
            "config.json: rope_theta = 0 is not",
        ),
    ],
)
def test_what_gristmill_cannot_compute_is_one_line(tmp_path, edit, key):
    make_base(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text()) | edit
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError) as e:
        base_model_fields(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and key in msg and "config.json" in msg, msg


def test_spellings_transformers_computes_as_gristmill_does_load(tmp_path):
    """`hidden_act = "swish"` is silu by another name in transformers: it was refused as what gristmill
    cannot compute (trial RV61d F4). It loads, to transformers' logits."""
    make_base(tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    edit = {"hidden_act": "swish"}
    (tmp_path / "config.json").write_text(json.dumps(c | edit))
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert_same_logits(gristmill_model(tmp_path), loaded)


def _edit_config(path: Path, **edit) -> None:
    c = json.loads((path / "config.json").read_text()) | edit
    (path / "config.json").write_text(json.dumps(c))


def test_rope_spellings_that_disagree_are_refused_naming_both(tmp_path):
    """Issue 37 item 1: rope_parameters and rope_scaling (or a top-level rope_theta) that disagree are
    refused naming both values (transformers versions differ in which one they read); spellings
    that agree, as gristmill's own exports write them, load; a string rope_parameters is refused."""
    hf = make_base(tmp_path, rope=LLAMA3)
    v5 = json.loads((tmp_path / "config.json").read_text())["rope_parameters"]
    scaling = {k: v for k, v in v5.items() if k != "rope_theta"}
    _edit_config(tmp_path, rope_scaling=scaling, rope_theta=v5["rope_theta"])  # both spellings, agreeing
    assert_same_logits(gristmill_model(tmp_path), hf, seq=120)
    conflicts = [
        ({"rope_scaling": None}, "rope_scaling = null"),  # transformers 4 would read no scaling
        ({"rope_scaling": scaling | {"factor": 4.0}}, '"factor": 4.0'),
        ({"rope_theta": 500000.0}, "rope_theta = 500000.0"),
    ]
    for edit, want in conflicts:
        _edit_config(tmp_path, **({"rope_scaling": scaling, "rope_theta": v5["rope_theta"]} | edit))
        with pytest.raises(ConfigError) as e:
            base_model_fields(tmp_path)
        msg = str(e.value)
        assert (
            "\n" not in msg and "rope_parameters = {" in msg and want in msg and "describe different" in msg
        ), msg
    # rope_scaling null without a top-level rope_theta: the θ that differs is what the line names, the
    # one transformers 4 implies against rope_parameters' (R28a m2)
    c = json.loads((tmp_path / "config.json").read_text())
    c.pop("rope_theta")
    c |= {"rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 12345.0}}
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ConfigError) as e:
        base_model_fields(tmp_path)
    msg = str(e.value)
    want = "rope_scaling = null without rope_theta, which transformers 4 reads as θ = 10000 (LlamaConfig's "
    assert want + "default) against rope_parameters' 12345 describe different RoPE" in msg, msg
    _edit_config(tmp_path, rope_parameters="llama3")
    with pytest.raises(ConfigError, match='rope_parameters = "llama3" is not supported.*expected a table'):
        base_model_fields(tmp_path)


def test_partial_rope_names_its_value(tmp_path):
    """Item 10: partial_rotary_factor is named with the value the config holds, wherever it is."""
    make_base(tmp_path)
    v5 = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    for edit in ({"partial_rotary_factor": 0.5}, {"rope_parameters": v5}):
        _edit_config(tmp_path, **edit)
        with pytest.raises(ConfigError, match=r"partial_rotary_factor = 0\.5 is not supported"):
            base_model_fields(tmp_path)


def test_tied_config_over_a_different_stored_head_is_refused(tmp_path):
    """Item 2: tie_word_embeddings = true over weights holding an lm_head.weight unlike the embedding
    is two models (transformers 5 keeps the head, 4 ties it): refused naming both keys. A stored head
    equal to the embedding is the tied model written in full: accepted, and the same logits."""
    from safetensors.torch import load_file, save_file

    untied = make_base(tmp_path / "untied")
    _edit_config(tmp_path / "untied", tie_word_embeddings=True)
    with pytest.raises(ConfigError) as e:
        base_model_fields(tmp_path / "untied")
    msg = str(e.value)
    assert "tie_word_embeddings = true" in msg and "lm_head.weight unlike model.embed_tokens.weight" in msg, (
        msg
    )
    assert "\n" not in msg and "config.json" in msg
    tied = make_base(tmp_path / "tied", tie_word_embeddings=True)
    tensors = load_file(tmp_path / "tied" / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, tmp_path / "tied" / "model.safetensors", metadata={"format": "pt"})
    assert_same_logits(gristmill_model(tmp_path / "tied"), tied)
    assert untied is not None


def test_a_truncated_weights_file_is_one_line_naming_it(tmp_path):
    """Item 5: a safetensors file cut short (the single file, or one shard of several) is one line
    naming the file before anything is read, not numpy's "mmap length is greater than file size"."""
    for shard in (False, True):
        base = tmp_path / f"shard-{shard}"
        make_base(base, shard=shard)
        victim = sorted(base.glob("*.safetensors"))[-1]
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size - 100)
        with pytest.raises(BaseModelError) as e:
            gristmill_model(base)
        msg = str(e.value)
        assert str(victim) in msg and "is truncated" in msg and "\n" not in msg, msg


def _rewrite_header(path: Path, edit) -> None:
    """`path`'s safetensors header replaced by edit(header) (the data section kept as it is)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = edit(json.loads(raw[8 : 8 + n]))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def test_weights_transformers_reads_otherwise_or_cannot_read_are_one_line(tmp_path):
    """A tensor in two shards (transformers reads every shard, the last one's wins; gristmill the
    index's: two models, trial RV63b 2); overlapping offsets (safetensors refuses them, gristmill read
    another tensor's bytes: RV63b 12); entries and weight maps of the wrong shape (tracebacks: RV63b 6)."""
    base = tmp_path / "base"
    make_base(base, shard=True)
    shards = sorted(base.glob("model-*.safetensors"))
    index = json.loads((base / "model.safetensors.index.json").read_text())
    norm = "model.norm.weight"
    home = base / index["weight_map"][norm]
    other = next(p for p in shards if p != home)
    original = {p: p.read_bytes() for p in [*shards, base / "model.safetensors.index.json"]}

    def refused(want: str) -> None:
        with pytest.raises(BaseModelError) as e:
            gristmill_model(base)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
        for p, raw in original.items():
            p.write_bytes(raw)

    def first(h: dict) -> str:  # the tensor at the start of a shard's data
        return min((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])

    def with_norm(h: dict) -> dict:  # the norm's entry in another shard too, over its first tensor's bytes
        begin, end = h[first(h)]["data_offsets"]
        return h | {norm: {"dtype": "F32", "shape": [(end - begin) // 4], "data_offsets": [begin, end]}}

    _rewrite_header(other, lambda h: {k: v for k, v in with_norm(h).items() if k != first(h)})
    sides = sorted([str(home), str(other)])
    refused(f"{sides[0]} and {sides[1]} both hold {norm}: transformers reads every shard")
    _rewrite_header(other, with_norm)
    refused("overlap")
    _rewrite_header(home, lambda h: h | {norm: {"dtype": "F32", "shape": [4]}})
    refused(f"{home} is not a readable safetensors file (its entry '{norm}' is ")
    # an index that does not name a tensor its shard holds: the index at fault, not "the weights hold
    # no model.norm.weight" (trial RV63b 14)
    unnamed = {k: v for k, v in index["weight_map"].items() if k != norm}
    (base / "model.safetensors.index.json").write_text(json.dumps(index | {"weight_map": unnamed}))
    refused(f"{home} holds {norm}, which {base / 'model.safetensors.index.json'} does not name: add it")
    for weight_map in ([], {norm: None}, {norm: "../outside.safetensors"}):
        (base / "model.safetensors.index.json").write_text(json.dumps(index | {"weight_map": weight_map}))
        refused(f"{base / 'model.safetensors.index.json'} is damaged (ValueError: weight_map is not a table")


def test_shape_key_must_agree_with_the_base(tmp_path):
    make_base(tmp_path)
    info = {"vocab_size": 256, "separator": {"id": 0}}
    section = ModelSection(init_from=str(tmp_path), n_layers=2, document_mask=True)
    mcfg = resolve_model_config(section, info, [("data.seq_len", 64)])
    assert (mcfg.n_layers, mcfg.n_kv_heads, mcfg.document_mask) == (2, 2, True)
    assert mcfg.init_from == str(tmp_path.resolve()) and len(mcfg.init_from_sha256) == 64
    with pytest.raises(ConfigError) as e:
        resolve_model_config(ModelSection(init_from=str(tmp_path), n_layers=3), info, [("data.seq_len", 64)])
    assert "model.n_layers = 3" in str(e.value) and "base model's 2" in str(e.value), str(e.value)
    # Item 9: a seq_len past the base's context names the base's limit and the real options (not
    # model.max_seq_len, which the base decides), for data.seq_len and a phase's seq_len alike.
    for key in ("data.seq_len", "phase[1].seq_len"):
        with pytest.raises(ConfigError) as e:
            resolve_model_config(
                ModelSection(init_from=str(tmp_path)), info, [("data.seq_len", 64), (key, 512)]
            )
        msg = str(e.value)
        assert f"{key} = 512 exceeds the base model's max_position_embeddings = 256" in msg, msg
        assert f"lower {key} to ≤ 256" in msg and "model.max_seq_len" not in msg and "config.json" in msg, msg


def test_llama3_scaling_keys_under_another_rope_type_are_refused(tmp_path):
    """model.rope_factor (or another llama3 scaling key) without rope_type "llama3" was accepted,
    recorded in config.toml and ignored: the context trained unscaled (review R2)."""
    info, seq = {"vocab_size": 256, "separator": {"id": 0}}, [("data.seq_len", 64)]
    with pytest.raises(ConfigError) as e:
        resolve_model_config(ModelSection(preset="tiny", rope_factor=64.0), info, seq)
    assert str(e.value) == (
        'model.rope_factor = 64.0 scales RoPE only with rope_type "llama3", and the model\'s is '
        "'default' (preset 'tiny''s): set model.rope_type = \"llama3\" or remove model.rope_factor"
    )
    scaled = resolve_model_config(
        ModelSection(preset="tiny", rope_type="llama3", rope_factor=64.0), info, seq
    )
    assert (scaled.rope_type, scaled.rope_factor) == ("llama3", 64.0)
    make_base(tmp_path)  # default RoPE
    with pytest.raises(ConfigError) as e:
        resolve_model_config(ModelSection(init_from=str(tmp_path), rope_original_max_seq_len=16), info, seq)
    assert str(e.value).endswith(
        "(the base model's): remove model.rope_original_max_seq_len (the base decides RoPE)"
    ), str(e.value)


def test_weights_that_do_not_fit_are_named(tmp_path):
    make_base(tmp_path)
    model = Transformer(ModelConfig(**(base_model_fields(tmp_path) | {"n_layers": 1})))
    with pytest.raises(BaseModelError, match="no place for.*model.layers.1"):
        load_base_weights(model, tmp_path)
    model = Transformer(ModelConfig(**(base_model_fields(tmp_path) | {"ffn_dim": 64})))
    with pytest.raises(BaseModelError, match="mlp.gate_proj.weight has shape"):
        load_base_weights(model, tmp_path)


# ------------------------------------------------------------------------------------------------
# The data must match the model


def _export_of(tmp_path: Path, dataset: Path, name: str, config: dict, **tokenizer_files: dict) -> Path:
    """The export of a base with the dataset's tokenizer.json (<|endoftext|> 0 and <|begin_of_text|> 1
    special, "!" 2 and '"' 3 ordinary), config.json's bos/eos/pad keys replaced by `config`'s (None:
    the key absent) and tokenizer files of its own (`tokenizer_files`: tokenizer_config=..., ...)."""
    base = tmp_path / name
    make_base(base, vocab_size=read_dataset_info(dataset)["vocab_size"])
    c = json.loads((base / "config.json").read_text())
    c = {k: v for k, v in c.items() if k not in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (base / "config.json").write_text(json.dumps(c | {k: v for k, v in config.items() if v is not None}))
    (base / "generation_config.json").unlink()
    shutil.copyfile(dataset / "tokenizer.json", base / "tokenizer.json")
    for stem, content in tokenizer_files.items():
        (base / f"{stem}.json").write_text(json.dumps(content))
    model = gristmill_model(base)
    files = {
        p.name: p for p in base.iterdir() if p.suffix == ".json" and p.name != "model.safetensors.index.json"
    }
    return export_hf(model.state_dict(), model.cfg, dataset, tmp_path / f"{name}-export", base=files)


def test_a_base_whose_tokenizer_is_in_another_form_is_refused_not_noted(tmp_path, built_dataset):
    """A base with GPT-2's vocab.json and merges.txt but no tokenizer.json trained on the dataset's ids
    with a note that nothing could be checked; its own tokenizer gave other ids (trial RV63b 9)."""
    info = read_dataset_info(built_dataset)
    base = tmp_path / "base"
    make_base(base, vocab_size=info["vocab_size"])
    (notes,) = check_base_data(base, built_dataset, info, info["vocab_size"])
    assert (
        notes == f"note: {base} has no tokenizer.json: the dataset's tokenizer cannot be checked against it"
    )
    for name in ("vocab.json", "merges.txt"):
        (base / name).write_text("{}" if name.endswith(".json") else "#version: 0.2\n")
    with pytest.raises(BaseModelError) as e:
        check_base_data(base, built_dataset, info, info["vocab_size"])
    assert str(e.value).startswith(
        f"{base} holds its tokenizer as vocab.json, merges.txt but no tokenizer.json"
    )
    # a run that trained past the note before is not stopped at its resume (review RV63g 1)
    (notes,) = check_base_data(base, built_dataset, info, info["vocab_size"], resumed=True)
    assert notes.startswith(f"note: {base} holds its tokenizer as vocab.json, merges.txt but no"), notes


def test_a_bases_own_tokenizer_files_follow_the_one_rule(tmp_path, built_dataset):
    """Review RV28c F1: a base's tokenizer_config.json naming the ordinary '"' as eos was shipped as
    it was: config.json said eos 0, AutoTokenizer's eos was '"', split out of every text before BPE as
    a special token, so eval scored ids the model never trained on, and the note said the exports
    used the separator."""
    from tokenizers import Tokenizer

    info = read_dataset_info(built_dataset)
    vocab_size, data_tok = info["vocab_size"], built_dataset / "tokenizer.json"
    text = 'He said "hi"! then ."quoted" text!!'
    trained = Tokenizer.from_file(str(data_tok)).encode(text, add_special_tokens=False).ids
    assert 3 in trained  # '"' alone, one of the ids the model trains on
    own = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "!", "eos_token": '"', "pad_token": '"',
           "clean_up_tokenization_spaces": True}  # fmt: skip
    added = {"content": '"', "special": True, "__type": "AddedToken"}  # transformers' other spelling
    ids, spec_map = {"bos_token_id": 2, "eos_token_id": 3}, {"eos_token": added, "bos_token": "!"}
    out = _export_of(tmp_path, built_dataset, "f1", ids, tokenizer_config=own, special_tokens_map=spec_map)
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 0, None)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(text, add_special_tokens=False)["input_ids"] == trained
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token) == (0, 0, None)
    kept = json.loads((out / "tokenizer_config.json").read_text())
    assert kept["tokenizer_class"] == "PreTrainedTokenizerFast" and kept["eos_token"] == "<|endoftext|>"
    # answers decode as tokenizer.json decodes them, under any transformers (4.x cleaned up "42 ." to
    # "42." after a BPE's decoder too, 5 a forced BPE's and any other model's: review RV32f A4)
    assert kept["clean_up_tokenization_spaces"] is False
    base = tmp_path / "f1"
    (notes,) = check_base_data(base, built_dataset, info, vocab_size)
    assert "config.json has bos_token_id 2, eos_token_id 3" in notes, notes
    assert f"{base / 'tokenizer_config.json'} has bos_token '!', eos_token '\"', pad_token '\"'" in notes, (
        notes
    )
    assert f"{base / 'special_tokens_map.json'} has eos_token '\"', bos_token '!'" in notes, notes
    assert "their tokenizer files' bos/eos/pad entries to the tokens of the ids their config.json" in notes, (
        notes
    )
    # a tokenizer file that does not parse: one line naming it, before step 1 (review RV28f F3)
    (base / "tokenizer_config.json").write_text('{"bos_token": "!",}')
    with pytest.raises(
        BaseModelError, match=r"tokenizer_config\.json is not valid JSON \(.*\): fix it or remove"
    ):
        check_base_data(base, built_dataset, info, vocab_size)
    # valid JSON but no object: an AttributeError traceback (trial RV57d F1)
    for text, kind in (("[1]", "a list"), ('"x"', "a string"), ("null", "null")):
        (base / "tokenizer_config.json").write_text(text)
        with pytest.raises(
            BaseModelError, match=rf"tokenizer_config\.json holds {kind}, not a JSON object: fix it"
        ):
            check_base_data(base, built_dataset, info, vocab_size)
    config = (base / "config.json").read_text()
    (base / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match=r"model.init_from: .*config\.json holds a list, not a JSON object"):
        read_base_config(base)
    (base / "config.json").write_text(config)


EOT = {"content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
       "normalized": False, "special": True}  # fmt: skip  # the dataset's tokenizer.json's id 0
QUOTE = EOT | {"content": '"'}  # '"' is an ordinary token there (id 3)


@pytest.mark.parametrize(
    "key, entry, left",
    [
        ("added_tokens_decoder", {"0": EOT, "3": QUOTE}, {"0": EOT}),
        ("additional_special_tokens", ["<|begin_of_text|>", '"'], ["<|begin_of_text|>"]),
        ("extra_special_tokens", {"quote_token": '"'}, {}),  # transformers 5's named tokens (4.x: since 4.48)
        ("model_specific_special_tokens", {"quote_token": '"'}, {}),  # transformers 5 (review RV29a F8)
        ("unk_token", '"', None),
    ],
)
def test_no_entry_of_a_bases_tokenizer_files_adds_a_token(tmp_path, built_dataset, key, entry, left):
    """Review RV28f F1: entries of a base's tokenizer_config.json other than bos/eos/pad that make the
    ordinary '"' an added special token were shipped as they were: AutoTokenizer split it out of every
    text before BPE (222, 3, 464 where the data has 270, 464), with no note. The export's tokenizer
    treats exactly tokenizer.json's added tokens as added; the note names what was left out."""
    from tokenizers import Tokenizer

    info = read_dataset_info(built_dataset)
    text = 'He said "hi"! then ."quoted" text!!'
    trained = Tokenizer.from_file(str(built_dataset / "tokenizer.json")).encode(
        text, add_special_tokens=False
    )
    assert 3 in trained.ids
    own = {"eos_token": "<|endoftext|>", key: entry}
    out = _export_of(
        tmp_path, built_dataset, "b", {"bos_token_id": 0, "eos_token_id": 0}, tokenizer_config=own
    )
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(text, add_special_tokens=False)["input_ids"] == trained.ids
    assert 3 not in tok.added_tokens_decoder and 3 not in tok.all_special_ids
    kept = json.loads((out / "tokenizer_config.json").read_text())
    assert kept.get(key) == left, kept  # '"' left out, the rest kept
    # the base leaves it to transformers' default: true in 4.45.0, which the eval extra allows (RV33c F1)
    assert kept["clean_up_tokenization_spaces"] is False
    base = tmp_path / "b"
    (note,) = check_base_data(base, built_dataset, info, info["vocab_size"])
    gone = "'\"' (id 3)" if key == "added_tokens_decoder" else "'\"'"
    assert f"{base / 'tokenizer_config.json'} has {key} {gone}, not special tokens of" in note, note
    assert f"its exports leave out the entries of {key}, whose tokens AutoTokenizer would split" in note, note


def test_an_export_whose_tokenizer_files_autotokenizer_reads_otherwise_is_refused_whole(
    tmp_path, built_dataset
):
    """Review RV29a F2: nothing checked that export_hf refuses what check_export_tokenizer refuses
    (the check removed from write_tokenizer, every test passed). An entry the rule keeps
    (additional_special_tokens as one string, which transformers 5 cannot load): one line naming the
    export, the base's file and the key, and neither the export nor its temporary sibling left."""
    own = {"eos_token": "<|endoftext|>", "additional_special_tokens": '"'}
    ids = {"bos_token_id": 0, "eos_token_id": 0}
    with pytest.raises(ExportError) as e:
        _export_of(tmp_path, built_dataset, "s", ids, tokenizer_config=own)
    line, config = str(e.value), tmp_path / "s" / "tokenizer_config.json"
    assert "\n" not in line and line.startswith(
        f"{tmp_path / 's-export'}: additional_special_tokens of {config}"
    ), line
    assert line.endswith(f"; leave additional_special_tokens out of {config}"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no s-export, no .s-export.tmp-PID


def test_tokenizer_files_refused_by_no_one_key_name_the_files_to_look_in(tmp_path, built_dataset):
    """Review RV29e F2: where no one key's removal makes the files read as tokenizer.json
    (additional_special_tokens and extra_special_tokens both one string, which transformers 5 cannot
    load), the refusal named no file ("leave that entry out of the base model's tokenizer files", on a
    resume too, whose files are RUN/base/'s): it names the files the export reads."""
    own = {"eos_token": "<|endoftext|>", "additional_special_tokens": '"', "extra_special_tokens": '"'}
    with pytest.raises(ExportError) as e:
        _export_of(tmp_path, built_dataset, "n", {"bos_token_id": 0, "eos_token_id": 0}, tokenizer_config=own)
    line, config = str(e.value), tmp_path / "n" / "tokenizer_config.json"
    assert (
        "\n" not in line and f"(by no one key of {config}); find the entry that causes it in {config}" in line
    ), line
    # Review RV34c G1: every key is tried alone. Keys as transformers writes them (sorted), the one cause
    # (a value transformers cannot load, as 4.x a stale tokenizer_file) 8th of the keys to try: a bound of
    # six edits said "(by no one key of ...)"; the key and its edit are named
    sorted_keys = {"add_bos_token": False, "add_prefix_space": False, "chat_template": "{{ m }}",
                   "eos_token": "<|endoftext|>", "errors": "replace", "model_input_names": ["input_ids"],
                   "model_max_length": 256, "padding_side": "right", "truncation_side": "middle"}  # fmt: skip
    with pytest.raises(ExportError) as e:
        _export_of(
            tmp_path, built_dataset, "k", {"bos_token_id": 0, "eos_token_id": 0}, tokenizer_config=sorted_keys
        )
    line, config = str(e.value), tmp_path / "k" / "tokenizer_config.json"
    assert line.startswith(f"{tmp_path / 'k-export'}: truncation_side of {config}: "), line
    assert line.endswith(f"; leave truncation_side out of {config}"), line


def test_a_bases_consistent_tokenizer_files_are_its_own(tmp_path, built_dataset):
    """A base whose tokenizer files agree with its tokenizer.json (a chat model's: added_tokens_decoder
    its added tokens, special bos and eos, a chat template, AddedToken dicts) ships them byte for
    byte, with no note."""
    info = read_dataset_info(built_dataset)
    added = json.loads((built_dataset / "tokenizer.json").read_text())["added_tokens"]
    decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
    named = {t["content"]: {k: v for k, v in t.items() if k not in ("id", "special")} for t in added}
    own = {"added_tokens_decoder": decoder, "bos_token": "<|begin_of_text|>", "eos_token": "<|endoftext|>",
           "additional_special_tokens": ["<|begin_of_text|>"], "extra_special_tokens": {},
           "chat_template": "{% for m in messages %}{{ m['content'] }}<|endoftext|>{% endfor %}",
           "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
           "model_max_length": 256}  # fmt: skip
    spec_map = {"bos_token": named["<|begin_of_text|>"], "eos_token": named["<|endoftext|>"]}
    ids = {"bos_token_id": 1, "eos_token_id": 0}
    out = _export_of(tmp_path, built_dataset, "chat", ids, tokenizer_config=own, special_tokens_map=spec_map)
    for name in ("tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (tmp_path / "chat" / name).read_bytes(), name
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 0)
    assert check_base_data(tmp_path / "chat", built_dataset, info, info["vocab_size"]) == []


def test_a_generation_config_an_export_cannot_ship_stops_a_run_before_step_1(tmp_path, built_dataset, capsys):
    """A base's generation_config.json that is no JSON object passed every check at the start; the run
    stopped with a traceback at its first export, after the checkpoint, and so did every resume (the
    missed export is written first), `gristmill export` too (trial RV63b 5). One line before step 1."""
    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"])
    (base / "generation_config.json").write_text('{"a":')
    run = tmp_path / "run"
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", _init(base), "data.seq_len=128",
            "data.global_batch_tokens=512", "data.micro_batch=2", "run.val_every=0", "metrics.plot=false",
            "checkpoint.interval=2", "checkpoint.export_interval=2", "run.threads=1", "run.device=cpu",
            "metrics.tensorboard=false", "schedule.steps=2", "schedule.warmup_steps=1"]  # fmt: skip
    capsys.readouterr()
    assert train_main(["--config", TINY, "--set", *sets]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {base / 'generation_config.json'} is not a generation config (JSONDecodeError"
    ), line
    assert line.endswith("fix the base's file (or remove it: exports then write their own from config.json's "
                         "ids) and start the run again"), line  # fmt: skip
    assert not complete_steps(run) and not metrics(run)  # nothing trained
    (base / "generation_config.json").write_text('{"max_new_tokens": 5}')
    assert train_main(["--config", TINY, "--set", *sets]) == 0
    assert json.loads((export_dir(run, 2) / "generation_config.json").read_text())["max_new_tokens"] == 5


def test_a_resume_of_a_continued_run_with_evals_finds_every_record(tmp_path, built_dataset, capsys):
    """A continued run's eval of its base writes a row of step 0, which no step trained: every resume
    said step 0 had no record in batches.bin and set the file aside, .damaged, .damaged.2 … (trial
    RV63b 8)."""
    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"])
    run = tmp_path / "run"
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", _init(base), "data.seq_len=128",
            "data.global_batch_tokens=512", "data.micro_batch=2", "run.val_every=0", "metrics.plot=false",
            "checkpoint.interval=2", "run.threads=1", "run.device=cpu", "metrics.tensorboard=false",
            "schedule.steps=4", "schedule.warmup_steps=1", "eval.interval=2", 'eval.tasks=["heldout_ppl"]',
            "eval.limit=4"]  # fmt: skip
    pytest.importorskip("lm_eval")
    from validation.train_eval import main as train_with_eval

    assert train_with_eval(["--config", TINY, "--set", *sets, "run.max_steps=2"]) == 0
    assert 0 in {m["step"] for m in metrics(run)}  # the base's eval row
    capsys.readouterr()
    assert train_with_eval(["--config", TINY, "--set", *sets, "checkpoint.resume=auto"]) == 0
    out = capsys.readouterr().out
    assert "no record of step" not in out and not list(run.glob("batches.bin.damaged*")), out
    # Resumed from a volume's copy of a checkpoint with the base gone, it trains and scores as a resume of
    # its own checkpoint does: the eval resolved the model again from the new run's checkpoints, none
    # yet, or the base, and stopped before step 1 (trial RV69e 1)
    volume = tmp_path / "volume" / "step-000002"
    shutil.copytree(checkpoint_dir(run, 2), volume)
    base.rename(tmp_path / "base-gone")
    other = [*sets, f"run.output_dir={tmp_path / 'other'}", f"checkpoint.resume={json.dumps(str(volume))}"]
    assert train_with_eval(["--config", TINY, "--set", *other]) == 0
    assert "[eval] step 4:" in capsys.readouterr().out


def test_tokenizer_files_an_export_would_refuse_stop_a_run_before_step_1(tmp_path, built_dataset, capsys):
    """Review RV29a F1: tokenizer files an export refuses stopped a run at its first export (the
    steps an async checkpoint had trained since lost), and every resume again before step 1, naming
    the base's file though the run reads its copy RUN/base/. Checked at every start now, before step
    1, [eval] or not, naming the file read and the key: additional_special_tokens as one string, which
    split_token_entries keeps and transformers cannot load; a resume whose last export was missed too
    (review RV29e F1)."""
    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"])
    _edit_config(base, bos_token_id=0, eos_token_id=0)
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")
    clean = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    bad = json.dumps(clean | {"additional_special_tokens": '"'})
    run = tmp_path / "run"
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", _init(base), "data.seq_len=128",
            "data.global_batch_tokens=512", "data.micro_batch=2", "schedule.warmup_steps=1",
            "run.val_every=0", "metrics.plot=false", "checkpoint.interval=2", "checkpoint.export_interval=2",
            "run.threads=1", "parallel.param_dtype=float32", "run.device=cpu", "metrics.tensorboard=false",
            "schedule.steps=4"]  # fmt: skip
    key = "additional_special_tokens of {}: AutoTokenizer (transformers {}) cannot load its tokenizer files"
    fix = "; leave additional_special_tokens out of {}"
    (base / "tokenizer_config.json").write_text(bad)
    capsys.readouterr()
    assert train_main(["--config", TINY, "--set", *sets, "run.max_steps=2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    config = base / "tokenizer_config.json"
    assert f"{run}'s exports: {key.format(config, transformers.__version__)}" in line, line
    assert line.endswith(fix.format(config)), line
    assert not complete_steps(run) and not (run / "exports").exists() and not metrics(run)  # nothing trained
    (base / "tokenizer_config.json").write_text(json.dumps(clean))
    assert train_main(["--config", TINY, "--set", *sets, "run.max_steps=2"]) == 0
    assert complete_steps(run) == [2] and export_dir(run, 2).is_dir()
    # the run's copy, which a resume reads, named (editing the base's own did not unblock it)
    kept = run / "base" / "tokenizer_config.json"
    kept.write_text(bad)
    # and step 2's export missed (the process stopped after its COMPLETE): the resume's pass that writes
    # it comes after the check, not before it, in another line per rank (review RV29e F1)
    shutil.rmtree(export_dir(run, 2))
    capsys.readouterr()
    resume = [*sets, "checkpoint.resume=auto"]
    saved = (run / "config.toml").read_bytes()
    assert train_main(["--config", TINY, "--set", *resume, "run.log_every=3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{run}'s exports: {key.format(kept, transformers.__version__)}" in line, line
    assert line.endswith(fix.format(kept)), line
    assert complete_steps(run) == [2] and [r["step"] for r in metrics(run) if "loss" in r] == [1, 2]
    assert (run / "config.toml").read_bytes() == saved  # a refused resume leaves it (review RV29e F6)
    kept.write_text(json.dumps(clean)[:-1])  # the copy edited by hand, as advised, with a typo
    assert train_main(["--config", TINY, "--set", *resume]) == 2
    line = one_error_line(capsys.readouterr().err)  # one line, not a JSONDecodeError traceback (RV29e F3)
    assert f"{kept} is not valid JSON (" in line, line
    kept.write_text(json.dumps(clean))
    assert train_main(["--config", TINY, "--set", *resume]) == 0
    assert complete_steps(run)[-1] == 4 and export_dir(run, 4).is_dir() and export_dir(run, 2).is_dir()
    # The run's copy of tokenizer.json, two ids swapped: its exports shipped it, and eval scored other
    # ids than the data's, exit 0 (review RV52a F1); base.json records it as the run kept it.
    ids, good = run / "base" / "tokenizer.json", (run / "base" / "tokenizer.json").read_bytes()
    spec = json.loads(good)
    vocab = spec["model"]["vocab"]
    vocab["e"], vocab["t"] = vocab["t"], vocab["e"]
    ids.write_text(json.dumps(spec))
    shutil.rmtree(export_dir(run, 4))
    with pytest.raises(GristmillError) as e:
        export_checkpoint(run, 4)
    assert str(e.value).startswith(f"{ids} is not the tokenizer.json the run kept from its base"), e.value
    assert "restore that folder from a copy of the run" in str(e.value) and not export_dir(run, 4).exists()
    ids.write_bytes(good)
    kept.unlink()  # one the run kept, gone: "cannot write …", naming the export's folder (RV52a F2)
    with pytest.raises(GristmillError, match=rf"^{re.escape(str(kept))} is missing: the run kept it"):
        export_checkpoint(run, 4)
    kept.write_text(json.dumps(clean))
    assert export_checkpoint(run, 4) == export_dir(run, 4)


def test_a_base_config_without_bos_and_eos_exports_the_separator(tmp_path, built_dataset):
    """Review RV28c F4: a base's config.json without bos/eos keys (with its tokenizer.json): the
    absent keys were exported as null over the separator, so the export had no eos at all."""
    info = read_dataset_info(built_dataset)
    vocab_size = info["vocab_size"]
    out = _export_of(tmp_path, built_dataset, "f4", {"pad_token_id": None})
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 0, None), config
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (0, 0), generation
    assert transformers.AutoTokenizer.from_pretrained(out).eos_token_id == 0
    assert check_base_data(tmp_path / "f4", built_dataset, info, vocab_size) == []


def test_train_plan_refuses_a_base_of_another_tokenizer_as_train_does(
    tmp_path, built_dataset, capsys, monkeypatch
):
    """`train --plan` printed the plan of a base whose tokenizer is not the data's, exit 0, and `train`
    refused it a second later (trial RV53a 6): both refuse it in one line, creating nothing."""
    from pipelines.cli import main as gristmill

    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"])
    tok = json.loads((built_dataset / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: other ids for the same text
    (base / "tokenizer.json").write_text(json.dumps(tok))
    run = tmp_path / "run"
    sets = [
        f"data.dataset={built_dataset}",
        f"run.output_dir={run}",
        _init(base),
        "schedule.steps=4",
        "schedule.warmup_steps=1",
    ]
    for plan in (["--plan"], []):
        capsys.readouterr()
        assert gristmill(["train", "--config", TINY, *plan, "--set", *sets]) == 2, plan
        line = one_error_line(capsys.readouterr().err)
        assert f"{built_dataset / 'tokenizer.json'} (dataset) differs from {base / 'tokenizer.json'}" in line
        assert not run.exists(), plan
    (base / "tokenizer.json").write_text((built_dataset / "tokenizer.json").read_text())  # the data's own
    # a base that is no export: its weights are not hashed for a plan (140 GB read at 70B: review RV62e 5)
    import training.run.preflight as preflight

    def hashed(*_):
        raise AssertionError("--plan hashed the weights of a base that is no export")

    monkeypatch.setattr(preflight, "base_weights", hashed)
    assert gristmill(["train", "--config", TINY, "--plan", "--set", *sets]) == 0
    assert not run.exists()


def test_a_resume_whose_base_tokenizer_changed_since_the_start_says_so_not_rebuild_the_data(
    tmp_path, built_dataset, capsys
):
    """Trial RV71b 1: the base's tokenizer.json edited (two ids swapped) after the run started, a
    resume and its --plan said the dataset was tokenized with another tokenizer, rebuild it: the
    base changed, and RUN/base/ keeps the copy it was (base.json its sha256). Said so, naming the
    copy; restored (re-saved, other bytes), the resume trains; a new run still blames the data."""
    from pipelines.cli import main as gristmill

    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"])
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")
    run = tmp_path / "run"
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", _init(base), "data.seq_len=128",
            "data.global_batch_tokens=512", "data.micro_batch=2", "run.val_every=0", "metrics.plot=false",
            "checkpoint.interval=2", "run.threads=1", "run.device=cpu", "metrics.tensorboard=false",
            "schedule.steps=4", "schedule.warmup_steps=1"]  # fmt: skip
    assert train_main(["--config", TINY, "--set", *sets, "run.max_steps=2"]) == 0
    tok = json.loads((base / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = list(vocab)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (base / "tokenizer.json").write_text(json.dumps(tok))
    kept = run / "base" / "tokenizer.json"
    for plan in (["--plan"], []):
        capsys.readouterr()
        assert gristmill(["train", "--config", TINY, *plan, "--resume", "auto", "--set", *sets]) == 2, plan
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(
            f"error: {base / 'tokenizer.json'} (base model) changed since the run started: it differs from "
            f"{kept}, the copy the run kept then (sha256 "
        ), line
        assert "in model.vocab; restore it from that copy, or move the base folder away" in line, line
    assert complete_steps(run) == [2]
    # step 0's export is the base's weights with the copy's tokenizer, as the run's steps': not refused
    assert (export_checkpoint(run, 0) / "tokenizer.json").read_bytes() == kept.read_bytes()
    fresh = [*sets, f"run.output_dir={tmp_path / 'fresh'}"]  # no record yet: the data is held to the base
    assert gristmill(["train", "--config", TINY, "--plan", "--set", *fresh]) == 2
    assert "(dataset) differs from" in one_error_line(capsys.readouterr().err)
    (base / "tokenizer.json").write_text(json.dumps(json.loads(kept.read_text()), indent=2))  # re-saved
    assert train_main(["--config", TINY, "--set", *sets, "checkpoint.resume=auto"]) == 0
    assert complete_steps(run) == [2, 4]


def test_an_eos_list_keeps_its_special_members(tmp_path, built_dataset):
    """Review RV28c F5: eos_token_id [1, 2] (1 special, 2 ordinary): the whole list was replaced and
    the note called both ordinary; 2 alone is named and dropped, the special 1 kept."""
    info = read_dataset_info(built_dataset)
    vocab_size = info["vocab_size"]
    out = _export_of(tmp_path, built_dataset, "f5", {"bos_token_id": 1, "eos_token_id": [1, 2]})
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, [1]), config
    notes = check_base_data(tmp_path / "f5", built_dataset, info, vocab_size)
    assert "has eos_token_id 2 (of [1, 2]), not special tokens of" in notes[0], notes
    assert "its exports set eos to [1] instead" in notes[0], notes


def _tokenizer(path: Path, specials: dict[int, str], extra: str = "") -> Path:
    added = [{"id": i, "content": t, "special": True} for i, t in specials.items()]
    added.append({"id": 9, "content": "plain", "special": False})
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "added_tokens": added, "x": extra}))
    return path / "tokenizer.json"


def _dataset(path: Path, tokenizer: dict | None = None, *, sep: int = 1, vocab: int = 256) -> dict:
    path.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        (path / "tokenizer.json").write_text(json.dumps(tokenizer, indent=4))
    sha = file_sha256(path / "tokenizer.json") if tokenizer is not None else "none"
    return {"vocab_size": vocab, "tokenizer_sha256": sha, "separator": {"id": sep, "token": "<s>"}}


def test_the_data_must_match_the_base(tmp_path):
    base = tmp_path / "base"
    make_base(base)  # config.json: bos 1, eos 2
    tok = json.loads(_tokenizer(base, {1: "<s>", 2: "</s>", 3: "<pad>"}).read_text())
    # The same tokenizer re-saved with other whitespace: accepted (normalised hash).
    assert check_base_data(base, tmp_path / "d1", _dataset(tmp_path / "d1", tok), 256) == []
    # The dataset dir without tokenizer.json: its recorded hash is compared with the base's file.
    info = _dataset(tmp_path / "d2") | {"tokenizer_sha256": file_sha256(base / "tokenizer.json")}
    assert check_base_data(base, tmp_path / "d2", info, 256) == []
    refusals = [
        (
            _dataset(tmp_path / "d3", tok | {"model": {"vocab": {"a": 1}}}),
            "tokenizer.json (dataset) differs from",
        ),
        (_dataset(tmp_path / "d4", tok, vocab=300), "vocab_size 300, more than the base model's 256"),
        (_dataset(tmp_path / "d5", tok, sep=9), "separator id 9 ('<s>') is not a special token of"),
    ]
    for i, (info, want) in enumerate(refusals, start=3):
        with pytest.raises(BaseModelError) as e:
            check_base_data(base, tmp_path / f"d{i}", info, 256)
        msg = str(e.value)
        assert want in msg and "\n" not in msg and str(base) in msg and f"d{i}" in msg, msg
    with pytest.raises(BaseModelError, match="d7/dataset.json records no tokenizer"):
        check_base_data(base, tmp_path / "d7", _dataset(tmp_path / "d7"), 256)
    # Item 11: a dataset without tokenizer.json has only the hash of its bytes; against a re-saved
    # copy of the base's tokenizer the refusal names what exists (dataset.json's record) and why
    # bytes are all it can compare.
    info = _dataset(tmp_path / "d8") | {"tokenizer_sha256": file_sha256(base / "tokenizer.json")}
    (base / "tokenizer.json").write_text(json.dumps(tok, indent=1))  # the same tokenizer, re-saved
    assert check_base_data(base, tmp_path / "d1", _dataset(tmp_path / "d1", tok), 256) == []
    with pytest.raises(BaseModelError) as e:
        check_base_data(base, tmp_path / "d8", info, 256)
    msg = str(e.value)
    assert f"{tmp_path / 'd8' / 'dataset.json'} records tokenizer_sha256" in msg and "\n" not in msg, msg
    assert "d8/tokenizer.json" not in msg and "no tokenizer.json to compare by content" in msg, msg
    notes = check_base_data(base, tmp_path / "d6", _dataset(tmp_path / "d6", tok, sep=3), 256)
    assert len(notes) == 1 and "neither its bos nor eos" in notes[0]
    # the base's tokenizer.json cut short: named alone, not "the dataset's or the base's" (RV52a F6)
    (base / "tokenizer.json").write_text(json.dumps(tok)[:-9])
    with pytest.raises(
        BaseModelError, match=rf"^{re.escape(str(base / 'tokenizer.json'))} is not valid JSON"
    ):
        check_base_data(base, tmp_path / "d1", _dataset(tmp_path / "d1", tok), 256)
    (base / "tokenizer.json").unlink()
    notes = check_base_data(base, tmp_path / "d1", _dataset(tmp_path / "d1", tok), 256)
    assert len(notes) == 1 and "has no tokenizer.json" in notes[0]


# ------------------------------------------------------------------------------------------------
# Runs: a refusal before step 1, the base recorded, another base refused on resume, FSDP = 1 process


def _run(sets: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]
    return forked.run(cmd, cwd=ROOT, env=ENV, timeout=300)


def _init(base: Path | str) -> str:
    return f"model.init_from={json.dumps(str(base))}"


@pytest.fixture(scope="module")
def data(synthetic_dataset):
    return synthetic_dataset()


@pytest.fixture(scope="module")
def base(shared) -> Path:
    """The runs' base: a tied LlamaForCausalLM (random init, float32, 64 positions); made once per
    test run (read-only)."""
    return shared.get(
        "init-from-base-tied-64",
        lambda path: make_base(path, max_position_embeddings=64, tie_word_embeddings=True),
    )


def _train(sets: list[str], _) -> None:
    done = _run(sets)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def straight(base, data, shared) -> Path:
    """An uninterrupted 8-step run from `base`: checkpoints at steps 4 and 8; trained once per test
    run (read-only: copy it to write into it)."""
    return shared.run("1-process", lambda run: overrides(data, run, _init(base), "schedule.steps=8"), _train)


def test_a_runs_base_folder_deleted_or_replaced_is_refused_by_export_and_resume(
    tmp_path, data, base, straight
):
    """Review R22f S1, S2: with RUN/base/ deleted, the exports of a run from a base took the dataset's
    tokens instead of the base's, step 0 was exported without its bytes checked (a note said the run
    predated the record), and a resume's checkpoints recorded no base, so nothing told it later: exit
    0 each. Each checkpoint records base.json's sha256; export, step 0's included, and resume refuse
    a folder that is not what it recorded, in one line, and take it again once restored."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(run / "exports", ignore_errors=True)
    kept = (run / "base" / "base.json").read_bytes()
    shutil.move(run / "base", tmp_path / "kept")
    for step in (8, 0):
        with pytest.raises(GristmillError) as e:
            export_checkpoint(run, step)
        msg = str(e.value)
        assert "\n" not in msg and f"{run / 'base' / 'base.json'} is missing" in msg, msg
        assert "restore that folder from a copy of the run" in msg, msg
    assert not (run / "exports").exists() or not list((run / "exports").iterdir())
    four = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 4)))}"
    listing = sorted(p.relative_to(run) for p in run.rglob("*"))
    done = _run(overrides(data, run, _init(base), "schedule.steps=8", four))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert "base.json is missing" in done.stderr, done.stderr
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing  # nothing set aside
    shutil.copytree(tmp_path / "kept", run / "base")  # another base's record in its place
    (run / "base" / "base.json").write_bytes(kept.replace(b'"init_from"', b'"init_from" ', 1))
    with pytest.raises(GristmillError, match="base.json is not the one step-000008 recorded"):
        export_checkpoint(run, 8)
    (run / "base" / "base.json").write_bytes(kept)  # restored
    assert export_checkpoint(run, 8) == export_dir(run, 8) and export_checkpoint(run, 0) == export_dir(run, 0)
    done = _run(overrides(data, run, _init(base), "schedule.steps=8", four))
    assert done.returncode == 0, done.stderr[-3000:]


def test_verify_checks_the_runs_base_folder_as_export_and_resume_do(tmp_path, straight, capsys):
    """Trial RV59e 4: RUN/base/ deleted, edited or lacking a file it lists, export and resume refused
    the run while `gristmill verify` said every checkpoint and export was ok, exit 0. Its row is the
    base's (step 0), DAMAGED with the export's own line, exit 1; ok again once restored."""
    from pipelines.cli import main as gristmill

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    kept = tmp_path / "kept"
    shutil.copytree(run / "base", kept)
    assert gristmill(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s*base\s+0\s+ok\b", out, re.M), out
    listed = json.loads((run / "base" / "base.json").read_text())["files"]
    assert listed, "the base keeps files"
    damages = {
        "deleted": lambda: shutil.rmtree(run / "base"),
        "a listed file gone": lambda: (run / "base" / listed[0]).unlink(),
        "base.json edited": lambda: (run / "base" / "base.json").write_text(
            (kept / "base.json").read_text().replace('"files"', '"files" ', 1)
        ),
    }
    for name, damage in damages.items():
        damage()
        assert gristmill(["verify", str(run)]) == 1, name
        out = capsys.readouterr().out
        assert re.search(r"^\s*base\s+0\s+DAMAGED\b", out, re.M), (name, out)
        text = " ".join(out.split())  # the detail column wraps
        assert "restore that folder from a copy of the run" in text and "1 damaged" in text, (name, out)
        shutil.rmtree(run / "base", ignore_errors=True)
        shutil.copytree(kept, run / "base")
    # --step N shows a damaged base too: every export ships its files (review RV60d 3)
    shutil.rmtree(run / "base")
    assert gristmill(["verify", str(run), "--step", "8"]) == 1
    assert re.search(r"^\s*base\s+0\s+DAMAGED\b", capsys.readouterr().out, re.M)
    shutil.copytree(kept, run / "base")
    # No checkpoint left to compare with (retention, a user's rm): a record of no names is one row, no
    # traceback (review RV60d 1); base.json gone is unchecked, never ok (review RV60d 2)
    shutil.rmtree(run / "checkpoints")
    (run / "base" / "base.json").write_text(json.dumps({"files": [1]}))
    assert gristmill(["verify", str(run)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "base.json is unreadable (its 'files' are not names of config.json" in text, text
    (run / "base" / "base.json").unlink()
    assert gristmill(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s*base\s+0\s+unchecked\b", out, re.M), out
    assert "the run started before gristmill kept its base's record" in " ".join(out.split()), out


def test_another_runs_checkpoint_in_a_run_from_scratch_gives_it_no_base(tmp_path, data, straight, capsys):
    """Trial RV75a 3: a run from scratch whose step-8 checkpoint was replaced by a run-from-a-base's
    got, beside that checkpoint's DAMAGED row, a base row, DAMAGED, "base.json is missing … restore
    that folder from a copy of the run", a folder the run never had: its base was read from the
    newest checkpoint, the other run's. Only the run's own saves say what its base is."""
    from pipelines.cli import main as gristmill

    run = tmp_path / "run"
    done = _run(overrides(data, run, "schedule.steps=8"))
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.rmtree(checkpoint_dir(run, 8))
    shutil.copytree(checkpoint_dir(straight, 8), checkpoint_dir(run, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^\s*checkpoint\s+8\s+DAMAGED\s.*another run's checkpoint", out, re.M), out
    assert not re.search(r"^\s*base\b", out, re.M) and "1 damaged" in out, out


def test_a_checkpoint_outside_its_run_records_its_base_only_where_the_base_is_byte_for_byte_it(
    tmp_path, base, straight
):
    """Trial RV69c F1: a run resumed from a checkpoint copied outside its run directory kept no RUN/base/,
    so a base edited in place since (same shapes) was exported and scored as its step 0. The base at
    init_from is recorded only where its base.json is the one the checkpoint's COMPLETE records;
    otherwise nothing is written, and the note says why."""
    volume = tmp_path / "volume" / "step-000004"
    shutil.copytree(checkpoint_dir(straight, 4), volume)
    assert record_base_of_copy(tmp_path / "same", volume, base) is None
    assert (tmp_path / "same" / "base" / "base.json").read_bytes() == (
        straight / "base" / "base.json"
    ).read_bytes()
    edited = tmp_path / "edited"
    shutil.copytree(base, edited)
    _retrain_in_place(edited)
    note = record_base_of_copy(tmp_path / "other", volume, edited)
    assert note is not None and "\n" not in note, note
    assert f"{edited} is not the base {volume / COMPLETE_FILE} records, byte for byte" in note, note
    assert "step 0 cannot be exported from this run" in note, note
    assert not (tmp_path / "other" / "base").exists()
    assert "the base is not at hand" in record_base_of_copy(tmp_path / "gone", volume, None)
    # a checkpoint of a run that kept no RUN/base/ (itself resumed so) records none: not "an earlier
    # gristmill" alone, which this one is not (trial RV69e 3)
    from training.checkpoint.record import BASE_RECORD, sealed_record

    complete = volume / COMPLETE_FILE
    record = {k: v for k, v in json.loads(complete.read_text()).items() if k != BASE_RECORD}
    complete.write_text(json.dumps(sealed_record(record), indent=1))
    note = record_base_of_copy(tmp_path / "unkept", volume, base)
    assert "records no base's weights (its run kept no RUN/base/, or an earlier gristmill" in note, note


def _retrain_in_place(base: Path) -> None:
    """`base`'s weights file rewritten with other values of the same shapes (the same identity)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(base / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1
    save_file(weights, str(base / "model.safetensors"), metadata={"format": "pt"})


def test_step_0_of_a_run_that_records_no_base_weights_is_refused_and_its_export_unchecked(
    tmp_path, straight, capsys
):
    """Trial RV69c F1: a run keeping no RUN/base/base.json (resumed from a checkpoint outside its run
    directory) exported step 0 from a base edited in place, with a note blaming the run's age, and
    returned that stale export once the base was restored, while verify called it ok. Step 0 is
    refused (export and eval) where nothing records the base's weights, an existing step-0 export too,
    and verify calls it unchecked."""
    from pipelines.cli import main as gristmill
    from training.checkpoint.record import BASE_RECORD, sealed_record

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    assert export_checkpoint(run, 0) == export_dir(run, 0)
    shutil.rmtree(run / "base")
    for step in complete_steps(run):  # as saved by a run resumed so: no record of a base.json
        complete = checkpoint_dir(run, step) / COMPLETE_FILE
        record = {k: v for k, v in json.loads(complete.read_text()).items() if k != BASE_RECORD}
        complete.write_text(json.dumps(sealed_record(record), indent=1))
    said = "resumed from a checkpoint outside its run directory"
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    msg = str(e.value)
    assert "\n" not in msg and f"{export_dir(run, 0)} cannot be shown to hold step 0" in msg, msg
    assert said in msg and "`gristmill export THAT_RUN --step 0`" in msg, msg
    assert gristmill(["verify", str(run)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"export 0 unchecked .* cannot be shown to hold step 0", text), text
    shutil.rmtree(export_dir(run, 0))
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    msg = str(e.value)
    assert (
        "\n" not in msg and f"step 0 of {run} cannot be exported: nothing records" in msg and said in msg
    ), msg
    assert not export_dir(run, 0).exists()
    # an older gristmill's record, which holds no weights' sha256: step 0 exports with a note, and verify
    # calls it unchecked; refused, such a run's step 0 could never be scored (review RV69d 5)
    shutil.copytree(straight / "base", run / "base")
    old = {**json.loads((run / "base" / "base.json").read_text()), "weights_sha256": {}}
    (run / "base" / "base.json").write_text(json.dumps(old, indent=1) + "\n")
    for step in complete_steps(run):
        complete = checkpoint_dir(run, step) / COMPLETE_FILE
        record = {**json.loads(complete.read_text()), BASE_RECORD: file_sha256(run / "base" / "base.json")}
        complete.write_text(json.dumps(sealed_record(record), indent=1))
    notes: list[str] = []
    assert export_checkpoint(run, 0, log=notes.append) == export_dir(run, 0)
    older = "started before gristmill recorded its base's weights"
    assert any(older in n for n in notes), notes
    assert gristmill(["verify", str(run)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(rf"export 0 unchecked .*{older}", text), text


def test_step_0_of_a_run_whose_base_directory_moved_names_the_resume_that_points_it_there(
    tmp_path, base, straight
):
    """Trial RV69c F2: with the base directory moved, export and eval of step 0 said "give a Hugging Face
    LlamaForCausalLM directory", though they take no settings. The line names the run's resume that
    records the new place; after it step 0 exports."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    shutil.rmtree(export_dir(run, 0), ignore_errors=True)
    moved = Path(shutil.copytree(base, tmp_path / "moved"))
    config = run / "config.toml"
    config.write_text(
        config.read_text().replace(json.dumps(str(base.resolve())), json.dumps(str(tmp_path / "gone")))
    )
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    msg = str(e.value)
    fix = f"`gristmill train --config {config} --resume auto --set model.init_from=NEWDIR`"
    assert (
        "\n" not in msg and f"model.init_from = {tmp_path / 'gone'} in {config} is not a directory" in msg
    ), msg
    assert fix in msg and "LlamaForCausalLM" not in msg, msg
    train(
        load_train_config(
            config, [f"run.output_dir={json.dumps(str(run))}", "checkpoint.resume=auto", _init(moved)]
        )
    )
    assert export_checkpoint(run, 0) == export_dir(run, 0)


def _plan_line(sets: list[str], capsys) -> str:
    """`train --plan`'s one line where the resume of `sets` refuses (it printed the plan, exit 0, for a
    resume refused before any load: trial RV77b 1)."""
    from pipelines.cli import main as gristmill

    capsys.readouterr()
    assert gristmill(["train", "--config", str(TINY), "--set", *sets, "--plan"]) == 2
    return one_error_line(capsys.readouterr().err)


def test_init_from_run_records_the_base_resumes_exactly_and_refuses_another(
    tmp_path, data, base, straight, capsys
):
    # This test edits its base's config.json for a while, so it trains from a copy: the same base (one
    # identity, the same losses as `straight`). An edit of the shared one, even undone, was copied by a
    # test on another xdist worker in that window, which then trained another model (a CI failure).
    base = Path(shutil.copytree(base, tmp_path / "base"))
    other = tmp_path / "other"
    make_base(other, max_position_embeddings=64, tie_word_embeddings=True, rms_norm_eps=1e-5)
    run = tmp_path / "run"
    init = _init(base)
    done = _run(overrides(data, run, init, "schedule.steps=8", "run.max_steps=4"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has no tokenizer.json" in done.stdout  # the base has none: a note, not a refusal
    record = json.loads((run / "checkpoints" / "step-000004" / "COMPLETE").read_text())["model"]
    assert record["init_from"] == str(base.resolve()) and len(record["init_from_sha256"]) == 64
    saved = tomllib.loads((run / "config.toml").read_text())["model"]
    assert saved["init_from"] == str(base.resolve()) and "preset" not in saved  # the base, not the preset
    assert f"  model   the base {base.resolve()}: " in done.stdout
    assert losses(run)[0][1] < 6.0  # ln(256) = 5.55: a random-init base starts near uniform
    sets = overrides(data, run, "schedule.steps=8", "checkpoint.resume=auto")
    line = one_error_line(_run([*sets, f"model.init_from={json.dumps(str(other))}"]).stderr)
    assert "continues from another base model" in line and str(other.resolve()) in line, line
    assert _plan_line([*sets, f"model.init_from={json.dumps(str(other))}"], capsys) == line
    line = one_error_line(_run(sets).stderr)  # a resume without init_from: another model too
    assert "continues from another base model" in line and "random initialisation" in line, line
    assert _plan_line(sets, capsys) == line
    config, original = base / "config.json", (base / "config.json").read_text()
    try:  # the same base folder, changed since the start: said so, not "another base" named twice
        config.write_text(json.dumps({**json.loads(original), "rms_norm_eps": 1e-3}))
        line = one_error_line(_run([*sets, init]).stderr)
    finally:
        config.write_text(original)
    assert f"the base {base.resolve()} reads as another model than the run started from" in line, line
    config.write_text(json.dumps({**json.loads(original), "rms_norm_eps": 1e-3}))
    try:
        assert _plan_line([*sets, init], capsys) == line
    finally:
        config.write_text(original)
    # Another base that reads as the same model (its config and weights index: two exports of one
    # run) was taken for the same base moved, and the run's record named it (review R17b S4); the
    # same base moved is still the same base.
    from safetensors.torch import load_file, save_file

    retrained, moved = tmp_path / "retrained", tmp_path / "moved"
    shutil.copytree(base, retrained)
    shutil.copytree(base, moved)
    weights = load_file(str(retrained / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1
    save_file(weights, str(retrained / "model.safetensors"), metadata={"format": "pt"})
    line = one_error_line(_run([*sets, _init(retrained)]).stderr)
    assert f"the weights of model.init_from = {retrained.resolve()} are not the run's base's" in line, line
    assert _plan_line([*sets, _init(retrained)], capsys) == line
    # ... and from a new run directory resuming the run's checkpoint by path, whose own record was not
    # written yet (review R17c S2)
    by_path = f"checkpoint.resume={json.dumps(str(run / 'checkpoints' / 'step-000004'))}"
    line = one_error_line(
        _run(overrides(data, tmp_path / "run-b", "schedule.steps=8", by_path, _init(retrained))).stderr
    )
    assert f"the weights of model.init_from = {retrained.resolve()} are not the run's base's" in line, line
    done = _run([*sets, _init(moved)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert losses(run) == losses(straight) and len(losses(run)) == 8
    assert_same_checkpoint(run, straight, 8)


def test_init_from_an_export_that_fails_its_checksums_is_refused_before_step_1(
    tmp_path, data, straight, capsys
):
    """A gristmill export damaged since it was exported (eval and verify refuse it) was trained from,
    exit 0: its gristmill_checksums.json was never read (review R22f S4); `train --plan` printed its
    plan, exit 0 (trial RV61d F3)."""
    from pipelines.cli import main as gristmill

    copy = export_checkpoint(straight, 8, out=tmp_path / "export")
    weights = copy / "model.safetensors"
    data_at = weights.stat().st_size - 64
    with open(weights, "r+b") as f:
        f.seek(data_at)
        f.write(bytes(64))
    run = tmp_path / "run"
    done = _run(overrides(data, run, _init(copy), "schedule.steps=4"))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    line = one_error_line(done.stderr)
    assert line.startswith(
        f"error: model.init_from = {copy} is a gristmill export that fails its checksums ("
    ), line
    # the fix is export_fix's, never "delete" (it may hold the only copy of its weights: RV33c F4)
    fix = "; point model.init_from at an intact copy, or restore the file from a copy of the export, or "
    assert f"{weights}: sha256 " in line and fix in line and "delete" not in line, line
    assert line.endswith("keep the export meanwhile: it may hold the only copy of its weights"), line
    capsys.readouterr()
    assert gristmill(["train", "--config", TINY, "--plan", "--set", *overrides(data, run, _init(copy))]) == 2
    assert one_error_line(capsys.readouterr().err) == line  # --plan says what train would
    # the command its gristmill_export.json records, not a placeholder (RV34c G3)
    again = shlex.join(["gristmill", "export", str(straight.resolve()), "--step", "8", "--out", str(copy)])
    assert f"or move {copy} aside and export it again from its checkpoint ({again} --dtype fp32); " in line, (
        line
    )
    assert not (run / "checkpoints").exists()
    # a record edited (its step, or its checkpoint's identity: another timeline's step 8) gives no
    # command: it would write another checkpoint's weights into the export's place (RV34g H2)
    meta_file = copy / "gristmill_export.json"
    meta = json.loads(meta_file.read_text())
    for edit in ({"step": 4}, {"checkpoint_complete_sha256": "0" * 64}):
        meta_file.write_text(json.dumps({**meta, **edit}))
        fix = export_fix(copy, "the file")
        assert "(gristmill export RUN --step N --out DIR)" in fix and "--step 4" not in fix, fix
    meta_file.write_text(json.dumps(meta))
    # its config edited (what the same weights compute), or its weights re-saved under other names:
    # both were trained from once the check held the weights' own sha256s alone (review R22i S1, S2)
    from safetensors.torch import load_file, save_file

    edited = export_checkpoint(straight, 8, out=tmp_path / "edited")
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.5}))
    resharded = export_checkpoint(straight, 8, out=tmp_path / "resharded")
    tensors = load_file(resharded / "model.safetensors")
    save_file(tensors, resharded / "model-00001-of-00001.safetensors", metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}
    (resharded / "model.safetensors.index.json").write_text(json.dumps(index))
    (resharded / "model.safetensors").unlink()
    generation = export_checkpoint(straight, 8, out=tmp_path / "generation")  # shipped in every export
    (generation / "generation_config.json").write_text(json.dumps({"eos_token_id": 7, "do_sample": True}))
    unrecorded = export_checkpoint(straight, 8, out=tmp_path / "unrecorded")  # its record deleted (R22j S3)
    (unrecorded / "gristmill_checksums.json").unlink()
    for changed, says in (
        (edited, "config.json: "),
        (generation, "generation_config.json: "),  # certified by the run's exports' checksums (R22k S1)
        (resharded, "model.safetensors: missing"),
        (unrecorded, "without its gristmill_checksums.json, which it was exported with"),
    ):
        done = _run(overrides(data, tmp_path / "run2", _init(changed), "schedule.steps=4"))
        line = one_error_line(done.stderr)
        assert f"model.init_from = {changed} is a gristmill export" in line and says in line, line


def test_an_export_out_inside_the_runs_own_folders_is_refused(tmp_path, straight):
    """--out RUN/exports/step-000004 (a step that never had a checkpoint) wrote step 6's weights under
    step 4's name: verify then called them damaged and eval refused the step (review R22f U5)."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    for out in (export_dir(run, 4), run / "checkpoints" / "mine"):
        with pytest.raises(ExportError, match=r"keeps its steps. fp32 exports or its checkpoints"):
            export_checkpoint(run, 8, out=out)
        assert not out.exists()
    # another name there is the user's: a bf16 copy beside the run's fp32 exports (review R22h M6); one
    # inside the step's own export made it read as damaged (R22i S4); without --step, the step it takes
    # is resolved first (its own export's name was "another step's": M1)
    assert export_checkpoint(run, 8, out=run / "exports" / "for-hub", dtype=torch.bfloat16).is_dir()
    for step, out, dtype in (
        (8, export_dir(run, 8) / "bf16", torch.bfloat16),
        (8, export_dir(run, 8), torch.bfloat16),  # the run's fp32 export, bf16 (review R22j S2)
        (0, export_dir(run, 4), torch.float32),  # step 0 skipped the check (R22j S1)
    ):
        with pytest.raises(ExportError, match="keeps its steps' fp32 exports or its checkpoints"):
            export_checkpoint(run, step, out=out, dtype=dtype)
    shutil.rmtree(export_dir(run, 8), ignore_errors=True)
    assert export_checkpoint(run, out=export_dir(run, 8)) == export_dir(run, 8)
    # inside a dataset: a folder its validation then called stray (trial RV74c 1)
    dataset = tmp_path / "data"
    (dataset / "shards").mkdir(parents=True)
    (dataset / "dataset.json").write_text(json.dumps({"fingerprint": "f" * 64}))
    with pytest.raises(
        ExportError, match=rf"^--out {dataset}/shards/x lies inside {dataset}/shards, a folder"
    ):
        export_checkpoint(run, 8, out=dataset / "shards" / "x")
    assert sorted(p.name for p in dataset.rglob("*")) == ["dataset.json", "shards"]
    with pytest.raises(
        ExportError, match=rf"^--out {dataset}/dataset.json/x lies under {dataset}/dataset.json, a"
    ):
        export_checkpoint(run, 8, out=dataset / "dataset.json" / "x")  # "File exists; make it writable"


def test_init_from_a_run_or_its_checkpoint_says_to_export_a_step(tmp_path, data, straight):
    """ "config.json not found", with no word of what to give instead (review R22f U4)."""
    for given in (straight, checkpoint_dir(straight, 8)):
        done = _run(overrides(data, tmp_path / "run", _init(given), "schedule.steps=4"))
        line = one_error_line(done.stderr)
        assert (
            f"({straight} is a training run: export a step first, gristmill export {straight} --step N"
            in line
        ), line


def test_init_from_refuses_a_larger_vocabulary_before_step_1(tmp_path, data):
    base = tmp_path / "base"
    make_base(base, vocab_size=128, max_position_embeddings=64)
    done = _run(overrides(data, tmp_path / "run", f"model.init_from={json.dumps(str(base))}"))
    line = one_error_line(done.stderr)
    assert "vocab_size 256, more than the base model's 128" in line and "dataset.json" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_base_with_nan_weights_is_refused_before_step_1(tmp_path, data, capsys):
    """Item 7: a NaN in the base is the base's fault, named with its file and tensor before step 1
    (exit 2), not a divergence at step 1 (exit 3, "lower the LR")."""
    from safetensors.torch import load_file, save_file

    base = tmp_path / "base"
    make_base(base, max_position_embeddings=64)
    tensors = load_file(base / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    run = tmp_path / "run"
    capsys.readouterr()
    assert train_main(["--config", TINY, "--set", *overrides(data, run, _init(base))]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{base / 'model.safetensors'}: model.layers.1.mlp.up_proj.weight holds 1 NaN" in line, line
    assert not (run / "metrics.jsonl").exists()


def test_fsdp_two_ranks_equal_one_process(tmp_path, data):
    base = tmp_path / "base"
    make_base(base, max_position_embeddings=64)
    init = f"model.init_from={json.dumps(str(base))}"
    one, two = tmp_path / "one", tmp_path / "two"
    done = _run(overrides(data, one, init, "schedule.steps=4", "checkpoint.interval=0"))
    assert done.returncode == 0, done.stderr[-3000:]
    # The 2 ranks build on meta and each reads its own shards (the GPU path); another run.seed: the
    # base's weights replace the random init, so the seed no longer matters for them.
    sets = overrides(data, two, init, "schedule.steps=4", "checkpoint.interval=0", "run.init_device=meta")
    done = forked.run(torchrun_cmd([*sets, "run.seed=999"]), cwd=ROOT, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = losses(one), losses(two)
    assert len(a) == 4 and [r[0] for r in a] == [r[0] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra[1] == pytest.approx(rb[1], rel=1e-5, abs=1e-6), (ra, rb)


def test_llama3_rope_survives_the_export(tmp_path):
    """gristmill → HF: hf_config writes llama3 scaling in both spellings; transformers reads it back
    and computes the same logits, and init_from reads the export back to the same ModelConfig."""
    from training.checkpoint.hf_export import hf_config, write_safetensors
    from training.checkpoint.hf_names import hf_state_dict_names

    make_base(tmp_path / "base", rope=LLAMA3)
    ours = gristmill_model(tmp_path / "base")
    out = tmp_path / "export"
    out.mkdir()
    state = ours.state_dict()
    tensors = {hf: state[name] for name, hf in hf_state_dict_names(ours.cfg).items()}
    write_safetensors(tensors, out / "model.safetensors", {"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(ours.cfg, 0, torch.float32)))
    assert ModelConfig(**base_model_fields(out)) == ours.cfg.replace(init_from="", init_from_sha256="")
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert_same_logits(ours, hf, seq=120)


def test_a_base_without_a_tokenizer_json_exports_the_separator_as_bos_and_eos(tmp_path, built_dataset):
    """Reviews R22f S3, R23e S3-S4: a base that brings no tokenizer.json trains with the dataset's; its
    config's bos and eos ids (LlamaConfig's 1 and 2, Gemma's 2 and 1) name tokens of a tokenizer it
    did not bring. Id 2 is "!" in the dataset's and was exported as eos; kept where special, Gemma's
    order made eos <|begin_of_text|>; a tokenizer_config.json of its own (a sentencepiece base's:
    <s>, </s>) gave AutoTokenizer an eos past the model's vocabulary. Such a base's export is a run
    from scratch's: bos = eos = the separator, in every file."""
    from training.checkpoint.hf_export import export_hf

    vocab_size = read_dataset_info(built_dataset)["vocab_size"]
    vocab = json.loads((built_dataset / "tokenizer.json").read_text())["model"]["vocab"]
    # 0 is the separator; 1 another special token, 2 a letter
    assert vocab["!"] == 2 and vocab["<|begin_of_text|>"] == 1 and vocab["<|endoftext|>"] == 0
    for case, ids, extra in [
        ("llama", {}, {}),
        ("gemma", {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}, {}),
        ("sentencepiece", {}, {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"}),
    ]:
        base = tmp_path / case
        make_base(base, vocab_size=vocab_size, **ids)
        files = {name: base / name for name in ("config.json", "generation_config.json")}
        if extra:
            (base / "tokenizer_config.json").write_text(json.dumps(extra))
            files["tokenizer_config.json"] = base / "tokenizer_config.json"
        model = gristmill_model(base)
        out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / f"{case}-export", base=files)
        config = json.loads((out / "config.json").read_text())
        generation = json.loads((out / "generation_config.json").read_text())
        assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 0, None), case
        assert (generation["bos_token_id"], generation["eos_token_id"]) == (0, 0), (case, generation)
        tokenizer = transformers.AutoTokenizer.from_pretrained(out)
        assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|endoftext|>", "<|endoftext|>"), case
        assert tokenizer.eos_token_id == 0 and len(tokenizer) <= vocab_size, (case, len(tokenizer))
    # A base with its own tokenizer (here the dataset's, copied) keeps the ids of its config.json that
    # are special tokens of it: its users'. LlamaConfig's eos 2 is "!" there, an ordinary token: the
    # export's eos was "!" and generate() stopped at the first "!" (review R28a M1); it is the
    # separator, as the note at the start of training says; bos 1 (<|begin_of_text|>, special) stays.
    base = tmp_path / "llama"
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")
    notes = check_base_data(base, built_dataset, read_dataset_info(built_dataset), vocab_size)
    assert len(notes) == 1 and "eos_token_id 2, not special tokens of" in notes[0], notes
    assert "exports set eos to the dataset's separator '<|endoftext|>' (id 0) instead" in notes[0], notes
    files = {name: base / name for name in ("config.json", "generation_config.json", "tokenizer.json")}
    model = gristmill_model(base)
    out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "own", base=files)
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 0, None), config
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 0), generation
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|endoftext|>")
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "<|endoftext|>"


def test_an_instruct_base_s_chat_template_and_generation_eos_list_reach_its_exports(tmp_path, built_dataset):
    """An instruct base's chat template, saved by transformers as chat_template.jinja, was in no
    export (AutoTokenizer's chat_template None), and its generation_config.json's eos list (Llama-3-
    Instruct's [128001, 128009]) was replaced by config.json's one id, so generate() no longer stopped
    at the other (trial RV66a F1, F2). The template is kept in RUN/base and shipped; the list keeps
    its special members by config.json's rule, an ordinary id ("!", 2 here) left out."""
    from training.checkpoint.base_record import base_files
    from training.checkpoint.hf_export import unkept_base_note

    vocab_size = read_dataset_info(built_dataset)["vocab_size"]
    base = tmp_path / "instruct"
    make_base(base, vocab_size=vocab_size, bos_token_id=1, eos_token_id=0)
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")
    generation = {"bos_token_id": 1, "eos_token_id": [0, 1, 2], "do_sample": False}
    (base / "generation_config.json").write_text(json.dumps(generation))
    template = "{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}"
    (base / "chat_template.jinja").write_text(template)
    # a named template beside it (transformers' additional_chat_templates/): kept and shipped too (trial
    # RV66f F4: AutoTokenizer's chat_template lost it)
    tool_use = "{% for m in messages %}[tool] {{ m.content }}{% endfor %}"
    (base / "additional_chat_templates").mkdir()
    (base / "additional_chat_templates" / "tool_use.jinja").write_text(tool_use)
    run = tmp_path / "run"
    run.mkdir()
    record_base(run, base, str(base.resolve()), base_sha256(base))
    files = base_files(run)
    assert {"chat_template.jinja", "additional_chat_templates/tool_use.jinja"} <= files.keys(), files
    model = gristmill_model(base)
    out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "export", base=files)
    shipped = json.loads((out / "generation_config.json").read_text())
    assert (shipped["bos_token_id"], shipped["eos_token_id"], shipped["do_sample"]) == (1, [0, 1], False)
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 0
    templates = transformers.AutoTokenizer.from_pretrained(out).chat_template
    assert templates == {"default": template, "tool_use": tool_use}, templates
    assert (out / "chat_template.jinja").read_text() == template
    assert verify_export(out) is None  # its checksums name the named template's file too
    # a file added since (transformers reads it as the export's: an added_tokens.json gave AutoTokenizer a
    # token past the vocabulary, and verify said ok: trial RV67a F8)
    (out / "added_tokens.json").write_text('{"hello world": 8192}')
    with pytest.raises(ExportError, match="holds added_tokens.json, which its gristmill_checksums.json"):
        verify_export(out)
    (out / "added_tokens.json").unlink()
    # a model card, and what hf upload-large-folder leaves, transformers never reads (review RV67e 4)
    (out / "README.md").write_text("# a model card")
    (out / ".cache" / "huggingface").mkdir(parents=True)
    (out / ".cache" / "huggingface" / "upload.metadata.json").write_text("{}")
    assert verify_export(out) is None
    (out / "additional_chat_templates" / "tool_use.jinja").write_text("edited")
    with pytest.raises(ExportError, match="additional_chat_templates/tool_use.jinja"):
        verify_export(out)
    # a token's text for an id ("</s>") was a traceback at every export (review RV66g 6): the export's id
    files["generation_config.json"].write_text(json.dumps({"eos_token_id": "</s>", "bos_token_id": 1}))
    out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "text-id", base=files)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 0
    # a base without a tokenizer.json of its own trains and ships the dataset's: its template names the
    # tokens of one it did not bring, and is not shipped (review RV66g 2)
    del files["tokenizer.json"]
    out = export_hf(model.state_dict(), model.cfg, built_dataset, tmp_path / "no-tokenizer", base=files)
    assert not (out / "chat_template.jinja").exists() and not (out / "additional_chat_templates").exists()
    # a run started before gristmill kept the templates (its RUN/base and base.json without them)
    # exported none, unsaid (trial RV66f F3): said at `gristmill export` and at its resumes; its
    # templates alone, not a kept file every export writes itself (review RV67d 3)
    assert unkept_base_note(run) is None
    record = json.loads((run / "base" / "base.json").read_text())
    for name in ("chat_template.jinja", "additional_chat_templates/tool_use.jinja", "generation_config.json"):
        record["files"].remove(name)
        (run / "base" / name).unlink()
    (run / "base" / "base.json").write_text(json.dumps(record))
    note = unkept_base_note(run)
    assert note == (
        f"note: {base.resolve()} holds chat_template.jinja, additional_chat_templates/tool_use.jinja, which "
        f"{run / 'base'} does not keep (added since the run started, or the run started before gristmill "
        "kept them): the run's exports ship none; put what is still the base's in a copy of an export "
        "(`gristmill export RUN --step N --out DIR`: an export of the run holds only what it lists)"
    ), note
    # a template that is not UTF-8 text (a macOS ._NAME beside it) is refused where the run would keep
    # it, naming it (it was shipped, and every export's AutoTokenizer failed: review RV67d 4), and a
    # name only the glob took (no stem) is no template of the base (RV67d 1)
    (base / "additional_chat_templates" / ".jinja").write_text("{{ x }}")
    odd = base / "additional_chat_templates" / "._tool_use.jinja"
    odd.write_bytes(b"\x00\x05\x16\x07\xff\xfe")
    with pytest.raises(GristmillError, match=r"\._tool_use\.jinja is not UTF-8 text \(invalid start byte"):
        record_base(tmp_path / "other-run", base, str(base.resolve()), base_sha256(base))
    assert unkept_base_note(run) is None  # nothing an export needs: no traceback (RV67d 7)
    odd.unlink()
    assert unkept_base_note(run) == note  # not additional_chat_templates/.jinja
    record_base(tmp_path / "other-run", base, str(base.resolve()), base_sha256(base))
    kept = json.loads((tmp_path / "other-run" / "base" / "base.json").read_text())["files"]
    assert [n for n in kept if n.endswith(".jinja")] == [
        "chat_template.jinja",
        "additional_chat_templates/tool_use.jinja",
    ], kept
    # not shipped by a base without its own tokenizer.json (above)
    record["files"].remove("tokenizer.json")
    (run / "base" / "base.json").write_text(json.dumps(record))
    (base / "tokenizer.json").unlink()
    assert unkept_base_note(run) is None


def test_gristmill_export_and_a_resume_say_a_chat_template_the_run_does_not_keep(
    tmp_path, built_dataset, capsys
):
    """The note of a base's chat template RUN/base does not keep (trial RV66f F3), where a user sees it:
    `gristmill export` and the run's resume (nothing tested that they print it: review RV67d 8)."""
    from pipelines.cli import main as gristmill

    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"], bos_token_id=1, eos_token_id=0)
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")  # its own: it ships templates
    (base / "additional_chat_templates").mkdir()
    (base / "additional_chat_templates" / "tool.jinja").write_text("{{ messages }}")  # kept from the start
    run = tmp_path / "run"
    sets = overrides(built_dataset, run, _init(base), "schedule.steps=4", "checkpoint.interval=2")
    train(load_train_config(TINY, [*sets, "run.max_steps=2"]))
    (base / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    capsys.readouterr()
    assert gristmill(["export", str(run), "--step", "2"]) == 0
    note = f"note: {base.resolve()} holds chat_template.jinja, which {run / 'base'} does not keep"
    assert note in capsys.readouterr().out
    assert not (export_dir(run, 2) / "chat_template.jinja").exists()
    # verify's files column counts the export's subfolder's too (review RV67d 10)
    shipped = sum(p.is_file() for p in export_dir(run, 2).rglob("*"))
    assert (export_dir(run, 2) / "additional_chat_templates" / "tool.jinja").is_file()
    assert gristmill(["verify", str(run)]) == 0
    assert re.search(rf"^\s*export\s+2\s+ok\s+{shipped}\s", capsys.readouterr().out, re.M)
    train(load_train_config(TINY, [*sets, "checkpoint.resume='auto'"]))
    assert note in capsys.readouterr().out


def test_export_dtype_and_out(tmp_path, straight, capsys):
    """Issue 37 item 20: `export RUN --step N --dtype bf16 --out DIR` writes a bf16 copy (each tensor
    the fp32 export's, rounded once) from the checkpoint, or from RUN/exports/step-N once the
    checkpoint is gone; RUN/exports/step-N stays the run's fp32 export, so bf16 without --out is
    refused; fp32 stays the default."""
    from safetensors.torch import load_file

    from pipelines.cli import main as gristmill

    run = tmp_path / "run"
    shutil.copytree(straight, run)
    assert gristmill(["export", str(run), "--step", "8", "--dtype", "bf16"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "fp32 exports (eval scores them): give --out DIR for a bf16 copy" in line, line
    assert (
        gristmill(["export", str(run), "--step", "8", "--dtype", "bf16", "--out", str(tmp_path / "a")]) == 0
    )
    assert gristmill(["export", str(run), "--step", "8"]) == 0
    fp32 = load_file(export_dir(run, 8) / "model.safetensors")
    shutil.rmtree(run / "checkpoints" / "step-000008")  # retention: only the export is left
    assert (
        gristmill(["export", str(run), "--step", "8", "--dtype", "bf16", "--out", str(tmp_path / "b")]) == 0
    )
    assert (
        gristmill(["export", str(run), "--step", "8", "--out", str(tmp_path / "a")]) == 2
    )  # never overwritten
    for out in ("a", "b"):
        bf16 = load_file(tmp_path / out / "model.safetensors")
        assert bf16.keys() == fp32.keys() and json.loads((tmp_path / out / "config.json").read_text())[
            "torch_dtype"] == "bfloat16"  # fmt: skip
        for name, tensor in fp32.items():
            assert tensor.dtype == torch.float32 and torch.equal(bf16[name], tensor.to(torch.bfloat16)), name
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "b", dtype=torch.float32)
    assert torch.equal(hf.model.embed_tokens.weight, fp32["model.embed_tokens.weight"].bfloat16().float())
    # a bf16 copy moved in as the run's export passed verify and was scored as the fp32 (trial RV63b 4)
    shutil.rmtree(export_dir(run, 8))
    shutil.copytree(tmp_path / "b", export_dir(run, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{export_dir(run, 8)} holds bfloat16 weights (its config.json), not the float32 of the run's" in out
    ), out


def test_kill9_then_resume_without_the_base_is_bit_identical(tmp_path, data, base, straight, capsys):
    """kill -9 after a checkpoint, the base directory deleted, `--resume auto`: the checkpoint holds
    everything (shape and base identity in COMPLETE, the weights), the run finishes bit-identical to
    the uninterrupted one and exports; only step 0 (the base itself) needs the base."""
    copy = tmp_path / "base"  # the same base in another directory: the same identity
    shutil.copytree(base, copy)
    base_ids = json.loads((base / "config.json").read_text())
    run = tmp_path / "run"
    sets = overrides(data, run, _init(copy), "schedule.steps=8", "checkpoint.interval=2")
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_step(proc, run, random.randint(3, 5))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert metrics(run)[-1]["step"] < 8 and complete_steps(run), "killed too late or before a checkpoint"
    shutil.rmtree(copy)
    # `--plan` of that resume locates the base as the trainer does, from the checkpoint's record: it
    # refused the resume train makes (review RV54b 3)
    from pipelines.cli import main as gristmill

    assert gristmill(["train", "--config", TINY, "--plan", "--set", *sets, "checkpoint.resume=auto"]) == 0
    # (run.seed decides nothing in a run from a base: a resume that changes it was refused as one that
    # changed the starting weights: review R25h 4)
    train(load_train_config(TINY, [*sets, "checkpoint.resume=auto", "run.seed=5"]))
    out = capsys.readouterr().out
    assert f"the base directory {copy} is not at hand" in out, out[-2000:]
    assert losses(run) == losses(straight)
    assert_same_checkpoint(run, straight, 8)
    assert (export_checkpoint(run, 8) / "model.safetensors").is_file()
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    assert "\n" not in str(e.value) and "step 0" in str(e.value) and str(copy) in str(e.value), str(e.value)
    # A resume of its checkpoint into another directory: its exports keep the base's special tokens,
    # as the run's do (RUN/base/ comes with the checkpoint; they had the separator as bos and eos:
    # review R15c F4)
    elsewhere = tmp_path / "elsewhere"
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 6)))}"
    train(
        load_train_config(
            TINY,
            [*overrides(data, elsewhere, _init(copy), "schedule.steps=8", "checkpoint.interval=2"), resume],
        )
    )
    assert_same_checkpoint(elsewhere, straight, 8)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    got, want = (json.loads((export_checkpoint(r, 8) / "config.json").read_text()) for r in (elsewhere, run))
    assert [got.get(k) for k in ids] == [want.get(k) for k in ids]
    # (this base brings no tokenizer.json: its tokens are the separator's, R23e S3; its record came along)
    assert [want.get(k) for k in ids] != [base_ids.get(k) for k in ids]
    assert (elsewhere / "base" / "base.json").read_bytes() == (run / "base" / "base.json").read_bytes()
    # through a volume's own path to the checkpoint (the run's checkpoints/ a link to it), which run it
    # is cannot be told (review R15h F4): its RUN/base/ is written again where the base at init_from
    # is, byte for byte, the one the checkpoint records, so step 0 stays checkable (trial RV69c F1)
    (run / "checkpoints").rename(tmp_path / "volume")
    (run / "checkpoints").symlink_to(tmp_path / "volume")
    shutil.copytree(base, copy)
    capsys.readouterr()
    volume = f"checkpoint.resume={json.dumps(str(tmp_path / 'volume' / 'step-000006'))}"
    train(
        load_train_config(
            TINY,
            [
                *overrides(
                    data, tmp_path / "fourth", _init(copy), "schedule.steps=8", "checkpoint.interval=2"
                ),
                volume,
            ],
        )
    )
    assert "lies in no run directory" not in capsys.readouterr().out
    assert (tmp_path / "fourth" / "base" / "base.json").read_bytes() == (
        run / "base" / "base.json"
    ).read_bytes()
    # the newest checkpoint's record damaged: the run's model is the next one's record, not the base
    # (gone), which export and resume then asked for (review R14f F2)
    shutil.rmtree(export_dir(run, 8))
    record = checkpoint_dir(run, 8) / COMPLETE_FILE
    record.write_text(json.dumps({**json.loads(record.read_text()), "completed_at": "edited"}))
    assert export_checkpoint(run) == export_dir(run, 6)


def test_twenty_steps_equal_transformers_with_torch_adamw(tmp_path, data):
    """The same 20 steps without gristmill's model, optimizer or schedule code: transformers'
    LlamaForCausalLM loaded from the base, torch.optim.AdamW with the documented groups (matrices
    decayed, norms not), the plan's LR per step, gradient clipping, the run's own windows."""
    make_base(tmp_path / "base", max_position_embeddings=64)
    sets = overrides(data, tmp_path / "run", _init(tmp_path / "base"), "schedule.steps=20",
                     "checkpoint.interval=0")  # fmt: skip
    cfg = load_train_config(TINY, sets)
    loader = train(cfg)["states"]["dataloader"]
    ours = losses(tmp_path / "run")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).train()
        o = cfg.optim
        groups = [
            {"params": [p for p in hf.parameters() if p.ndim >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in hf.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ]
        opt = torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, fused=True)
        theirs = []
        for step in range(1, 21):
            lr = loader.plan.lr(step - 1)
            for g in opt.param_groups:
                g["lr"] = lr
            micro = loader.builder.batch(step - 1)  # rank 0 of 1: the whole global batch
            opt.zero_grad()
            step_losses = []
            for mb in micro:
                logits = hf(input_ids=mb["input_ids"]).logits
                loss = F.cross_entropy(logits.flatten(0, 1), mb["labels"].flatten())
                (loss / len(micro)).backward()
                step_losses.append(loss.detach())
            norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), o.grad_clip)
            opt.step()
            theirs.append((step, torch.stack(step_losses).mean().item(), norm.item(), lr))
    finally:
        torch.set_num_threads(threads)
    assert [r[0] for r in ours] == list(range(1, 21))
    assert ours[0][1] == theirs[0][1]  # the same forward: bit-identical before any update
    for a, b in zip(ours, theirs, strict=True):
        assert a[3] == b[3], (a, b)  # the LR: the same float
        # Measured: 17 of 20 losses bit-identical, the rest one float32 ulp apart (~1e-7 relative):
        # the two backward passes sum some gradients in another order.
        assert a[1] == pytest.approx(b[1], rel=1e-6), (a, b)
        assert a[2] == pytest.approx(b[2], rel=1e-5), (a, b)


CONTINUED_LOCAL = str(ROOT / "configs" / "train" / "continued-local.toml")


def test_the_continued_local_recipe_is_the_newcomers_day():
    """Issue 37 item 18: configs/train/continued-local.toml is the whole day in one file: a local base,
    rewind on, eval of the base (step 0) and after, exports; its data build command (the base's own
    tokenizer, never a new one) is valid for configs/data/local-parquet.toml. The scaled-down run is
    test_step_0_is_the_base_its_eval_comes_first_and_its_export_is_bit_for_bit."""
    import shlex

    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config
    from training.data.spec import batch_shapes, check_config

    cfg = load_train_config(CONTINUED_LOCAL, [])
    assert Path(cfg.model.init_from).is_absolute() and cfg.run.on_spike == "rewind" and cfg.eval.interval > 0
    assert cfg.checkpoint.export_interval and cfg.checkpoint.interval <= cfg.checkpoint.export_interval
    assert batch_shapes(cfg, check_config(cfg, 1), 1)[0].steps == cfg.schedule.steps
    text = Path(CONTINUED_LOCAL).read_text()
    build = text.split("gristmill data build", 1)[1].split("\n# 2.")[0].replace("\\\n#", " ")
    args = shlex.split(build)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert args[:2] == ["--config", "configs/data/local-parquet.toml"] and len(sets) == 5, args
    data = load_config(DataConfig, ROOT / args[1], sets)
    assert data.tokenizer.path.endswith("tokenizer.json") and not data.tokenizer.train.if_missing
    assert data.output == cfg.data.dataset


REPO = "gristmill-test/tiny-llama"  # made up: a request that escaped to the real hub would fail
# what advised downloads fetch: no original/*.pth
ONLY = "--include '*.json' --include '*.safetensors' --include tokenizer.model --include merges.txt"


def test_hub_id_is_fetched_by_rank_0_pinned_and_resumed_without_the_hub(
    tmp_path, data, base, monkeypatch, capsys
):
    files = {p.name: p.read_bytes() for p in base.iterdir()}
    unwanted = {"README.md": b"# a tiny llama\n", "original/consolidated.00.pth": b"never fetched"}
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files | unwanted, repo_type="model")
        env = point_hub_at(hub, monkeypatch, tmp_path / "hf-home") | {"OMP_NUM_THREADS": "1"}
        run = tmp_path / "run"
        sets = overrides(data, run, _init(REPO), "schedule.steps=8")
        done = forked.run(torchrun_cmd([*sets, "run.max_steps=4", "parallel.shard=2"]), cwd=ROOT, env=env,
                          timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        # Rank 0 resolved main and downloaded while rank 1 waited; rank 1 then read that commit's
        # snapshot from the cache: no request twice, only the base's files.
        assert len(hub.requests) == len(set(hub.requests)), hub.requests
        assert [r for r in hub.requests if "/revision/" in r] == [f"GET /api/models/{REPO}/revision/main"]
        got = {r.split(f"/resolve/{commit}/")[1] for r in hub.requests if r.startswith("GET /gristmill")}
        assert got == set(files), hub.requests
        pinned = f"{REPO}@{commit}"
        record = json.loads((run / "checkpoints/step-000004/COMPLETE").read_text())["model"]
        assert record["init_from"] == pinned and record["init_from_sha256"] == base_sha256(base)
        assert f"init_from = {json.dumps(pinned)}" in (run / "config.toml").read_text()

        # main moves on; the resume (1 process) keeps the commit the run started from, and the hub
        # is not asked
        hub.push(REPO, files | {"config.json": b"{}"}, repo_type="model")
        hub.requests.clear()
        train(load_train_config(TINY, [*sets, "checkpoint.resume=auto"]))
        assert hub.requests == []
        assert f"the base is {REPO} at commit {commit}" in capsys.readouterr().out
        record = json.loads((run / "checkpoints/step-000008/COMPLETE").read_text())["model"]
        assert record["init_from"] == pinned

        # Step 0's export offline, the base in no cache here: export takes no settings, so its advice
        # is a hub cache brought from elsewhere, not "set model.init_from" (trial RV57d F4). Its
        # command, run as written, fetches the base's files alone (not README.md, not original/: review
        # RV60d 5), and with HF_HUB_CACHE set as it says, the export is written
        with monkeypatch.context() as offline:
            offline.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
            offline.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
            with pytest.raises(GristmillError) as e:
                export_checkpoint(run, 0)
            line = str(e.value)
            assert "\n" not in line and "set model.init_from" not in line, line
            advised = re.search(r"\(`(hf download [^`]*--cache-dir DIR)`\), then bring DIR here and set "
                                r"HF_HUB_CACHE=DIR", line)  # fmt: skip
            assert advised is not None and f"--revision {commit}" in advised[1], line
            elsewhere = tmp_path / "elsewhere"
            argv = shlex.split(advised[1].replace("DIR", str(elsewhere)))
            assert argv[0] == "hf"  # huggingface_hub's command
            hf = [sys.executable, "-m", "huggingface_hub.cli.hf"]
            fetched = forked.run([*hf, *argv[1:]], env={**os.environ, **env}, timeout=120)
            assert fetched.returncode == 0, fetched.stderr[-2000:]
            snapshot = next(elsewhere.glob("models--*/snapshots/*"))
            assert {p.name for p in snapshot.iterdir()} == set(files), list(snapshot.iterdir())
            offline.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(elsewhere))
            assert export_checkpoint(run, 0) == export_dir(run, 0)
        capsys.readouterr()  # the download's progress bars

        # A revision or a repository the hub does not have: one line naming it, before any work
        for init, want in ((f"{REPO}@v9", f"{REPO} has no revision 'v9'"),
                           ("gristmill-test/nope", "no model repository 'gristmill-test/nope'")):  # fmt: skip
            new_run = overrides(data, tmp_path / "new", _init(init))
            assert train_main(["--config", TINY, "--set", *new_run]) == 2
            line = one_error_line(capsys.readouterr().err)
            assert want in line and "model.init_from" in line, line
        assert not (tmp_path / "new").exists()


def _as_before_hub_weights_were_recorded(run: Path) -> None:
    """RUN/base/base.json as gristmill wrote it for a hub base before review R25d S1 (no sha256 of
    its weights: the commit was taken to name them), and each COMPLETE's record of it to match,
    sealed again as a checkpoint of then would be."""
    from training.checkpoint.record import BASE_RECORD, sealed_record

    path = run / "base" / "base.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "weights_sha256": None}, indent=1) + "\n")
    for step in complete_steps(run):
        complete = checkpoint_dir(run, step) / COMPLETE_FILE
        record = json.loads(complete.read_text()) | {BASE_RECORD: file_sha256(path)}
        complete.write_text(json.dumps(sealed_record(record), indent=1))


def test_a_directory_base_resumed_with_a_hub_id_is_refused_naming_the_directory(
    tmp_path, data, base, straight, monkeypatch
):
    """Review R25d S1, the other way: a run from a directory resumed with a hub id of a repository that
    reads as the same model (config.json and weights index) was taken for the base moved, exit 0;
    what the hub's commit holds is not compared with base.json's record there, so it is refused in
    one line naming the directory to set (gone, the checkpoint's record stands in for it)."""
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    four = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 4)))}"
    files = {p.name: p.read_bytes() for p in base.iterdir()}
    with HubServer() as hub:
        hub.add_repo(REPO, files, repo_type="model")
        env = point_hub_at(hub, monkeypatch, tmp_path / "hf-home") | {"OMP_NUM_THREADS": "1"}
        env |= {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # stderr: the error line alone
        cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set"]
        sets = overrides(data, run, _init(REPO), "schedule.steps=8", four)
        done = forked.run([*cmd, *sets], cwd=ROOT, env=env, timeout=300)
    line = one_error_line(done.stderr)
    assert f"is a hub id, and the run's base is the directory {base.resolve()}" in line, line
    assert f"set model.init_from to {base.resolve()}" in line, line
    assert complete_steps(run) == complete_steps(straight)


QUIET_HUB = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # a fetch's progress is not the one error line


def _next_commit(base: Path, tmp_path: Path) -> bytes:
    """The weights of the repository's next commit: `base`'s retrained, the same shape (so the same
    config.json and weights index: init_from_sha256 alike)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(base / "model.safetensors"))
    later = tmp_path / "later.safetensors"
    save_file(
        {**weights, "model.norm.weight": weights["model.norm.weight"] + 1}, str(later), {"format": "pt"}
    )
    return later.read_bytes()


def _hub_train_cmd(*sets: str) -> list[str]:
    return [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]


def test_a_hub_base_resumed_from_another_commit_is_refused_in_its_run_and_from_a_copied_checkpoint(
    tmp_path, data, base, monkeypatch, capsys
):
    """One run from a hub id (4 of 8 steps), resumed with another commit of its repository two ways.

    In its own run (review R25d S1): resumed on a machine without the hub, with init_from the
    directory the docs advise downloading it to, it took another commit of the same repository there
    (same shape: config.json and the weights index, init_from_sha256, alike) for the run's base
    moved, exit 0: its record named that directory, and `export RUN --step 0` wrote the other
    commit's weights as the run's step 0. base.json holds the sha256 of a hub base's weights too
    (its snapshot, hashed once at the start), which a resume naming a directory and step 0's export
    are held to; a run of before, which has none, is refused in one line naming its base, and its
    step 0 exported from the commit it pinned.

    From its checkpoint copied to a volume (review R25e 1), resumed from that path into a new run
    with init_from a directory holding another commit of the repository (or that commit's hub id):
    taken for the base moved, exit 0: the volume holds no RUN/base/base.json to compare the weights
    with, and the new run recorded the other commit, its step 0 that commit's weights. Refused in one
    line naming the recorded base and a fix that works offline with nothing cached: the recorded
    commit is taken from the checkpoint, not downloaded."""
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file

    files = {p.name: p.read_bytes() for p in base.iterdir()}
    weights = load_file(str(base / "model.safetensors"))
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        env = point_hub_at(hub, monkeypatch, tmp_path / "hf-home") | {"OMP_NUM_THREADS": "1", **QUIET_HUB}
        run = tmp_path / "run"
        sets = overrides(data, run, _init(REPO), "schedule.steps=8")
        done = forked.run(_hub_train_cmd(*sets, "run.max_steps=4"), cwd=ROOT, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        recorded = json.loads((run / "base" / "base.json").read_text())["weights_sha256"]
        assert recorded == {"model.safetensors": file_sha256(base / "model.safetensors")}
        # the repository's next commit: retrained, the same shape
        later = hub.push(REPO, files | {"model.safetensors": _next_commit(base, tmp_path)}, repo_type="model")
        # For a machine without the hub, downloaded elsewhere as the docs advise: main, by now the
        # next commit, and the run's own commit
        newer = Path(snapshot_download(REPO, local_dir=str(tmp_path / "models" / "newer")))
        pinned = Path(snapshot_download(REPO, revision=commit, local_dir=str(tmp_path / "models" / "pinned")))
        offline = env | {"HF_HUB_OFFLINE": "1"}
        resume = [*sets, "checkpoint.resume=auto"]
        listing = sorted(p.relative_to(run) for p in run.rglob("*"))
        done = forked.run(_hub_train_cmd(*resume, _init(newer)), cwd=ROOT, env=offline, timeout=300)
        line = one_error_line(done.stderr)
        assert done.returncode == 2, done.stderr[-3000:]
        assert (
            f"the weights of model.init_from = {newer.resolve()} are not the run's base's, {REPO}@{commit}"
            in (line)
        ), line
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing  # refused before any write
        # without --resume: refused as a start over the run's checkpoints, before the base is fetched (it
        # downloaded the whole base first, or offline with nothing cached said to fetch it: trial RV78b 9)
        elsewhere = offline | {"HF_HOME": str(tmp_path / "empty-home")}
        done = forked.run(_hub_train_cmd(*sets), cwd=ROOT, env=elsewhere, timeout=300)
        line = one_error_line(done.stderr)
        assert done.returncode == 2 and "of an earlier run; continue that run with --resume auto" in line, (
            line
        )

        # A run started before: nothing to compare a directory with, so it is refused naming its base;
        # with that (no download), it resumes; its step 0 is the commit it pinned, whatever directory
        # an earlier resume named (RUN/config.toml, as one accepted before this fix left it)
        old = tmp_path / "old"
        shutil.copytree(run, old)
        _as_before_hub_weights_were_recorded(old)
        old_sets = [*overrides(data, old, "schedule.steps=8", "checkpoint.resume=auto")]
        done = forked.run(_hub_train_cmd(*old_sets, _init(pinned)), cwd=ROOT, env=offline, timeout=300)
        line = one_error_line(done.stderr)
        assert f"the run's base is {REPO}@{commit}, whose weights" in line, line
        assert f"set model.init_from to {REPO}@{commit}" in line, line
        toml = (old / "config.toml").read_text()
        (old / "config.toml").write_text(toml.replace(f"{REPO}@{commit}", str(newer.resolve())))
        exported = load_file(str(export_checkpoint(old, 0) / "model.safetensors"))
        assert torch.equal(exported["model.norm.weight"], weights["model.norm.weight"])

        # Its checkpoint copied to a volume, resumed into a new run with the next commit (a directory
        # offline, the hub id online)
        volume = tmp_path / "volume" / "step-000004"
        shutil.copytree(checkpoint_dir(run, 4), volume)
        new = tmp_path / "new"
        new_sets = [*overrides(data, new, "schedule.steps=8"), f"checkpoint.resume={json.dumps(str(volume))}"]
        for init_from, how in ((newer, offline), (f"{REPO}@{later}", env)):
            done = forked.run(_hub_train_cmd(*new_sets, _init(init_from)), cwd=ROOT, env=how, timeout=300)
            line = one_error_line(done.stderr)
            assert done.returncode == 2, done.stderr[-3000:]
            assert f"is not the base {volume / COMPLETE_FILE} records, {REPO}@{commit}" in line, line
            assert f"{volume} lies in no run directory" in line, line
            assert f"set model.init_from to {REPO}@{commit}" in line, line
            assert not complete_steps(new)

    # The run's own commit in a directory is its base moved: it resumes, without the hub
    done = forked.run(_hub_train_cmd(*resume, _init(pinned)), cwd=ROOT, env=offline, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert complete_steps(run)[-1] == 8
    assert f"init_from = {json.dumps(str(pinned.resolve()))}" in (run / "config.toml").read_text()
    # ... and that directory downloaded again once main moved on: step 0 is not the next commit
    (pinned / "model.safetensors").write_bytes(_next_commit(base, tmp_path))
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    msg = str(e.value)
    assert f"{pinned.resolve() / 'model.safetensors'} is not the file {run} started from" in msg, msg
    assert "\n" not in msg and not export_dir(run, 0).exists()
    (pinned / "model.safetensors").write_bytes(files["model.safetensors"])
    exported = load_file(str(export_checkpoint(run, 0) / "model.safetensors"))
    assert torch.equal(exported["model.norm.weight"], weights["model.norm.weight"])
    # The fix the copied checkpoint's refusal names, without the hub and with nothing cached: the
    # checkpoint's record stands in
    nothing = offline | {"HF_HOME": str(tmp_path / "empty")}
    done = forked.run(
        _hub_train_cmd(*new_sets, _init(f"{REPO}@{commit}")), cwd=ROOT, env=nothing, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert complete_steps(new)[-1] == 8
    # No RUN/base/ kept, and step 0 is the pinned commit all the same, as export takes it: the note said
    # it "cannot be exported", and verify's base row beside `export 0 ok` (trial RV69e 2)
    said = f"step 0 is the hub commit {REPO}@{commit}, exported from it"
    assert said in " ".join(done.stdout.split()) and not (new / "base").exists(), done.stdout[-3000:]
    from pipelines.cli import main as gristmill

    capsys.readouterr()
    assert gristmill(["verify", str(new)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(rf"base 0 unchecked .*its {said}", text) and "cannot be exported" not in text, text


def test_a_hub_base_damaged_in_the_cache_is_refused_not_recorded_as_the_hub_s(
    tmp_path, data, base, monkeypatch
):
    """A hub base's weights are hashed at the start and held to the hub's own sha256, the name of the
    blob its cached file links to: a copy damaged in the cache was trained on while base.json
    recorded the hub's sha256, read from the name alone (review R25k 1), and before that recorded the
    damage as the base without a word. Now the start is refused in one line naming the file and the
    fix, and the run records what it loads."""
    files = {p.name: p.read_bytes() for p in base.iterdir()}

    def start(run: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        sets = overrides(data, run, _init(REPO), "run.max_steps=1")
        return forked.run(_hub_train_cmd(*sets), cwd=ROOT, env=env, timeout=300)

    templates = {"chat_template.jinja": b"{{ m }}", "additional_chat_templates/tool.jinja": b"{{ t }}"}
    with HubServer() as hub:
        hub.add_repo(REPO, files | templates, repo_type="model")
        env = point_hub_at(hub, monkeypatch, tmp_path / "hf-home") | {"OMP_NUM_THREADS": "1", **QUIET_HUB}
        first = start(tmp_path / "first", env)  # fetched into the cache
        assert first.returncode == 0, first.stderr[-3000:]
    recorded = json.loads((tmp_path / "first" / "base" / "base.json").read_text())["weights_sha256"]
    assert recorded == {"model.safetensors": file_sha256(base / "model.safetensors")}
    (blob,) = (tmp_path / "hf-home" / "hub").rglob("snapshots/*/model.safetensors")
    damaged = bytearray(blob.read_bytes())
    damaged[-1] ^= 1  # the last tensor's last byte: the file still loads
    blob.resolve().write_bytes(bytes(damaged))
    run = tmp_path / "run"
    done = start(run, env | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stdout[-2000:]
    line = one_error_line(done.stderr)
    assert f"{blob}: the hub cache's copy is damaged" in line and f"delete {blob.resolve()} and run" in line
    assert not (run / "base" / "base.json").exists()
    # step 0's export gives the same advice: it said the base was changed since (trial RV69c F4)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(GristmillError) as e:
        export_checkpoint(tmp_path / "first", 0, out=tmp_path / "step-0")
    msg = str(e.value)
    assert f"{blob}: the hub cache's copy is damaged" in msg and f"delete {blob.resolve()} and run" in msg, (
        msg
    )
    # its config.json (a git blob, not LFS) edited in the cache: trained with another rms_norm_eps, exit 0
    # (trial RV62c S1)
    blob.resolve().write_bytes(files["model.safetensors"])
    config = blob.with_name("config.json")
    edited = json.loads(config.read_text()) | {"rms_norm_eps": 1e-3}
    config.resolve().write_text(json.dumps(edited))
    done = start(run, env | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stdout[-2000:]
    line = one_error_line(done.stderr)
    assert line.startswith(f"error: {config}: the hub cache's copy is damaged (git blob sha1 "), line
    assert not (run / "base" / "base.json").exists()
    # another tool's file in the snapshot, which the run never reads, is neither hashed nor refused
    # (a pytorch_model.bin: GBs; review RV62e 4)
    config.resolve().write_bytes(files["config.json"])
    other = blob.resolve().parent / ("0" * 64)
    other.write_bytes(b"not the bytes its name says")
    (blob.parent / "pytorch_model.bin").symlink_to(os.path.relpath(other, blob.parent))
    done = start(tmp_path / "other-files", env | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    # a snapshot's file that is no link had no blob name to be held to, and was trained on and recorded
    # as the hub commit's (trial RV78b 1-3): held to the commit's listing (trees/<commit>.json) now. A
    # cache copied with its links followed (`cp -rL`, to an offline node) is the hub's as it was ...
    copied = tmp_path / "copied"
    shutil.copytree(tmp_path / "hf-home", copied, symlinks=False)
    offline = env | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(copied)}
    assert start(tmp_path / "copied-run", offline).returncode == 0
    (snapshot,) = (copied / "hub").glob("models--*/snapshots/*")
    assert not (snapshot / "config.json").is_symlink() and list((snapshot.parent.parent / "trees").iterdir())
    # ... but not with one of its files edited in place (`sed -i`), nor with a file the commit lacks
    (snapshot / "config.json").write_text(json.dumps(edited))
    done = start(tmp_path / "edited", offline)
    assert done.returncode == 2, done.stdout[-2000:]
    line = one_error_line(done.stderr)
    assert line.startswith(
        f"error: {snapshot / 'config.json'}: the hub cache's copy is damaged (git blob "
    ), line
    (snapshot / "config.json").write_bytes(files["config.json"])
    (snapshot / "tokenizer.json").write_text("{}")  # the base has none: its check of the data's passed
    done = start(tmp_path / "planted", offline)
    assert done.returncode == 2, done.stdout[-2000:]
    line = one_error_line(done.stderr)
    assert (
        f"{snapshot / 'tokenizer.json'}: the hub's commit {snapshot.name[:12]}… holds no tokenizer.json"
        in line
    )
    # the files the run keeps and ships too: its chat templates (review RV78c 2)
    (snapshot / "tokenizer.json").unlink()
    for kept in templates:
        (snapshot / kept).write_bytes(b"{{ evil }}")
        done = start(tmp_path / "kept", offline)
        line = one_error_line(done.stderr)
        assert line.startswith(f"error: {snapshot / kept}: the hub cache's copy is damaged (git blob "), line
        (snapshot / kept).write_bytes(templates[kept])
    # without the listing (a cache that keeps none), an unlinked file is held to the blobs fetched
    shutil.rmtree(snapshot.parent.parent / "trees")
    assert start(tmp_path / "no-listing", offline).returncode == 0
    (snapshot / "config.json").write_text(json.dumps(edited))
    done = start(tmp_path / "no-listing-edited", offline)
    assert done.returncode == 2, done.stdout[-2000:]
    line = one_error_line(done.stderr)
    said = f"error: {snapshot / 'config.json'}: nothing in the hub cache holds its bytes to the hub's: "
    assert line.startswith(said) and "run once with network (HF_HUB_OFFLINE unset)" in line, line


def _as_resumed_by_an_earlier_gristmill(run: Path, directory: Path) -> None:
    """A hub base's run as gristmill left it before review R25d S1, resumed with `directory` (another
    commit of the repository): base.json without its weights' sha256, the checkpoints and
    RUN/config.toml naming the directory, each COMPLETE sealed again as a checkpoint of then was."""
    from training.checkpoint.record import BASE_RECORD, MODEL_RECORD, sealed_record

    path = run / "base" / "base.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "weights_sha256": None}, indent=1) + "\n")
    for step in complete_steps(run):
        complete = checkpoint_dir(run, step) / COMPLETE_FILE
        record = json.loads(complete.read_text()) | {BASE_RECORD: file_sha256(path)}
        record[MODEL_RECORD] = record[MODEL_RECORD] | {"init_from": str(directory)}
        complete.write_text(json.dumps(sealed_record(record), indent=1))
    toml = run / "config.toml"
    toml.write_text(
        re.sub(r'init_from = ".*"', f"init_from = {json.dumps(str(directory))}", toml.read_text())
    )


def test_a_hub_base_stays_the_runs_pinned_commit_whatever_directory_a_resume_read(
    tmp_path, data, base, monkeypatch
):
    """Review R25e 2-5. A resume reading the run's own commit from a directory recorded that
    directory as the base, so a later resume with plain `org/name` pinned nothing and fetched `main`
    (another commit: refused, telling the user to drop an @revision they never set); the checkpoints
    record the run's base (base.json's) now, and the pin is taken from base.json. That directory
    gone, step 0 is exported from the pinned commit. A run an earlier gristmill resumed with another
    commit's directory is held to base.json on every resume (it was not "moved": its checkpoints
    name that directory), its exports/step-000000 of that commit is not the run's step 0, and the
    fix named, `org/name@commit`, works offline with nothing cached."""
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file

    files = {p.name: p.read_bytes() for p in base.iterdir()}
    weights = load_file(str(base / "model.safetensors"))
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        env = point_hub_at(hub, monkeypatch, tmp_path / "hf-home") | {"OMP_NUM_THREADS": "1", **QUIET_HUB}
        run = tmp_path / "run"
        sets = overrides(data, run, "checkpoint.resume=auto")
        done = forked.run(
            _hub_train_cmd(*sets, _init(REPO), "run.max_steps=4"), cwd=ROOT, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        old = tmp_path / "old"
        shutil.copytree(run, old)
        hub.push(REPO, files | {"model.safetensors": _next_commit(base, tmp_path)}, repo_type="model")
        newer = Path(snapshot_download(REPO, local_dir=str(tmp_path / "models" / "newer"))).resolve()
        pinned = Path(snapshot_download(REPO, revision=commit, local_dir=str(tmp_path / "models" / "pinned")))
        offline = env | {"HF_HUB_OFFLINE": "1"}
        done = forked.run(
            _hub_train_cmd(*sets, _init(pinned), "run.max_steps=8"), cwd=ROOT, env=offline, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert read_complete_record(checkpoint_dir(run, 8))["model"]["init_from"] == f"{REPO}@{commit}"
        # That directory gone (RUN/config.toml names it), step 0 is the pinned commit, in the cache
        pinned.rename(tmp_path / "away")
        exported = load_file(str(export_checkpoint(run, 0) / "model.safetensors"))
        assert torch.equal(exported["model.norm.weight"], weights["model.norm.weight"])
        shutil.rmtree(export_dir(run, 0))
        # With network, plain org/name: the run's commit, not main's
        done = forked.run(_hub_train_cmd(*sets, _init(REPO)), cwd=ROOT, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert read_complete_record(checkpoint_dir(run, 12))["model"]["init_from"] == f"{REPO}@{commit}"

        # A run an earlier gristmill resumed with the next commit's directory, and its step 0 exported
        # from there (as that gristmill did: made here from a copy whose base.json names the directory)
        _as_resumed_by_an_earlier_gristmill(old, newer)
        maker = tmp_path / "maker"
        shutil.copytree(old, maker)
        path = maker / "base" / "base.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "init_from": str(newer)}, indent=1))
        _as_resumed_by_an_earlier_gristmill(maker, newer)  # (seals the records of the base.json above)
        with monkeypatch.context() as then:  # that gristmill exported a step 0 no record vouched for
            then.setattr("training.checkpoint.hf_export._unrecorded_base", lambda *_: None)
            shutil.copytree(export_checkpoint(maker, 0), export_dir(old, 0))
        with pytest.raises(ExportError) as e:
            export_checkpoint(old, 0)
        assert f"{export_dir(old, 0)} holds another base than {old} started from (base differs" in str(
            e.value
        )
        shutil.rmtree(export_dir(old, 0))
        old_sets = overrides(data, old, "checkpoint.resume=auto", "run.max_steps=8")
        done = forked.run(_hub_train_cmd(*old_sets, _init(newer)), cwd=ROOT, env=offline, timeout=300)
        line = one_error_line(done.stderr)
        assert done.returncode == 2, done.stderr[-3000:]
        assert f"set model.init_from to {REPO}@{commit}" in line, line
        nothing = offline | {"HF_HOME": str(tmp_path / "empty")}
        done = forked.run(
            _hub_train_cmd(*old_sets, _init(f"{REPO}@{commit}")), cwd=ROOT, env=nothing, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert read_complete_record(checkpoint_dir(old, 8))["model"]["init_from"] == f"{REPO}@{commit}"
        exported = load_file(str(export_checkpoint(old, 0) / "model.safetensors"))
        assert torch.equal(exported["model.norm.weight"], weights["model.norm.weight"])


def test_step_0_is_the_base_its_eval_comes_first_and_its_export_is_bit_for_bit(
    built_dataset, tmp_path, capsys
):
    """With [eval], the base is scored before any update (eval.parquet's first rows, step 0), not
    again on a resume; `export --step 0` gives back the bf16 base's tensors bit for bit (exported
    as fp32 like every step: the upcast is exact), and `gristmill eval RUN --step 0` scores that
    export as the in-training eval scored the base."""
    pytest.importorskip("lm_eval")
    import pyarrow.parquet as pq
    from safetensors.torch import load_file

    from pipelines.cli import main as gristmill
    from training.contract.eval_table import read_step_results, rows_of
    from validation.train_eval import TrainingEval, metric_key

    base = tmp_path / "base"
    make_base(base, vocab_size=read_dataset_info(built_dataset)["vocab_size"], dtype=torch.bfloat16)
    shutil.copyfile(built_dataset / "tokenizer.json", base / "tokenizer.json")  # the data's own tokenizer
    # Its users' special tokens: bos is not the separator the data was built with (<|endoftext|>, id 0).
    _edit_config(base, bos_token_id=1, eos_token_id=0, pad_token_id=0)
    special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    (base / "tokenizer_config.json").write_text(
        json.dumps(special | {"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    run = tmp_path / "run"
    tasks, limit = ["heldout_ppl"], 4
    # The newcomer's recipe (issue 37 item 18), scaled down: a local base, rewind on, eval before and after.
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", _init(base), "data.seq_len=128",
            "data.global_batch_tokens=512", "data.micro_batch=2", "data.val_fraction=0.1", "schedule.steps=2",
            "schedule.warmup_steps=1", "run.val_every=0", "metrics.plot=false", "checkpoint.interval=2",
            "eval.interval=2", f"eval.limit={limit}", f"eval.tasks={json.dumps(tasks)}", "run.threads=1",
            "parallel.param_dtype=float32", "run.device=cpu", "metrics.tensorboard=false"]  # fmt: skip
    cfg = load_train_config(CONTINUED_LOCAL, sets)
    assert cfg.run.on_spike == "rewind" and cfg.checkpoint.export_interval > 0
    train(cfg, evaluator=TrainingEval(cfg))
    assert "[eval] step 0:" in capsys.readouterr().out
    steps = pq.read_table(run / "eval.parquet").column("step").to_pylist()
    assert steps[0] == 0 and sorted(set(steps)) == [0, 2], steps
    in_training = {metric_key(r): r["value"] for r in rows_of(0, read_step_results(run, 0))}
    # …and in metrics.jsonl (so the trackers) as step 0: a row without a trained step
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert (
        first["step"] == 0
        and "loss" not in first
        and first[next(iter(in_training))] == next(iter(in_training.values()))
    )

    cfg = load_train_config(CONTINUED_LOCAL, [*sets, "checkpoint.resume=auto"])
    train(cfg, evaluator=TrainingEval(cfg))
    assert "[eval] step 0:" not in capsys.readouterr().out  # a resume does not score the base again

    # `gristmill eval RUN --step 0`: exports step 0 (the base, rebuilt from its files), then scores it
    shutil.rmtree(eval_dir(run, 0))
    assert gristmill(["eval", str(run), "--step", "0", "--tasks", ",".join(tasks), "--set", f"limit={limit}",
                      "device=cpu"]) == 0  # fmt: skip
    offline = {metric_key(r): r["value"] for r in rows_of(0, read_step_results(run, 0))}
    assert offline.keys() == in_training.keys() and offline
    for key, value in offline.items():  # HF's Llama on the export against gristmill's model on the base
        assert value == pytest.approx(in_training[key], rel=1e-6), key
    exported = load_file(export_dir(run, 0) / "model.safetensors")
    want = load_file(base / "model.safetensors")
    assert set(want) <= set(exported)
    for name, tensor in want.items():
        assert tensor.dtype == torch.bfloat16 and exported[name].dtype == torch.float32, name
        assert torch.equal(exported[name].to(torch.bfloat16).view(torch.int16), tensor.view(torch.int16)), (
            name
        )
        assert torch.equal(exported[name], tensor.float()), name
    assert export_checkpoint(run, 0) == export_dir(run, 0)  # `gristmill export RUN --step 0`: that export
    # `gristmill eval RUN --watch` scores step 0 too, with no export of it yet: it scored every step but
    # the baseline (trial RV63b 10)
    shutil.rmtree(eval_dir(run, 0))
    shutil.rmtree(export_dir(run, 0))
    assert gristmill(["eval", str(run), "--watch", "--poll", "0.1", "--idle-exit", "0.1", "--tasks", *tasks,
                      "--set", f"limit={limit}", "device=cpu"]) == 0  # fmt: skip
    assert {metric_key(r): r["value"] for r in rows_of(0, read_step_results(run, 0))} == offline
    # The base moved away: step 0's own line, once, and the watch goes on (it said "its checkpoint went
    # away …" at every look, and fetched a hub base again each time: review RV64c 5)
    aside = [(export_dir(run, 0), tmp_path / "export-0"), (eval_dir(run, 0), tmp_path / "eval-0"),
             (base, tmp_path / "base-moved")]  # fmt: skip
    for path, away in aside:
        path.rename(away)
    capsys.readouterr()
    assert gristmill(["eval", str(run), "--watch", "--poll", "0.1", "--idle-exit", "0.6", "--tasks", *tasks,
                      "--set", f"limit={limit}", "device=cpu"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("[eval] step 0 (the base) not scored: ") == 1 and "went away" not in err, err
    # ...and tried again at the next look: the base back, step 0 is scored (not given up for good after
    # any failure: review RV64d 4)
    from validation.eval import EvalConfig, TaskPlan, evaluate_missing

    cfg = EvalConfig(tasks=tasks, limit=limit, device="cpu")
    told: set[int] = set()
    assert evaluate_missing(run, cfg, TaskPlan(run, cfg), show=False, told=told) == [] and -1 in told
    (tmp_path / "base-moved").rename(base)
    assert evaluate_missing(run, cfg, TaskPlan(run, cfg), show=False, told=told) == [0]
    assert {metric_key(r): r["value"] for r in rows_of(0, read_step_results(run, 0))} == offline
    capsys.readouterr()
    meta = json.loads((export_dir(run, 0) / "gristmill_export.json").read_text())
    assert "trained_on" not in meta  # the base's own weights: no data of the run applied (R16i F1)

    # Issue 37 item 4: the export keeps the base's tokenizer files and special tokens (bos <|begin_of_text|>,
    # eos and pad <|endoftext|>), for step 0 as for a trained step; gristmill's eval still frames each
    # document with the data's separator (id 0), held in gristmill_export.json, not with bos.
    from validation.eval_model import GristmillHFLM

    export_checkpoint(run, 2)
    for step in (0, 2):
        out = export_dir(run, step)
        tokenizer = transformers.AutoTokenizer.from_pretrained(out)
        assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == tuple(special.values())
        config = json.loads((out / "config.json").read_text())
        assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 0, 0)
        assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    lm = GristmillHFLM(pretrained=str(export_dir(run, 2)), device="cpu", dtype="float32", batch_size=1)
    assert (
        lm.separator_id
        == read_dataset_info(built_dataset)["separator"]["id"]
        == 0
        != lm.tokenizer.bos_token_id
    )

    # Item 3: the base's weight bytes are part of step 0's identity. Edited in place (same shapes, so
    # config.json and the weights index hash alike), it is refused, naming the file...
    original = (base / "model.safetensors").read_bytes()
    edited = bytearray(original)
    edited[-2:] = bytes([edited[-2] ^ 1, edited[-1]])  # one bit of the last bf16 value
    (base / "model.safetensors").write_bytes(bytes(edited))
    shutil.rmtree(export_dir(run, 0))
    assert gristmill(["verify", str(run), "--step", "0"]) == 2  # item 12: no checkpoint holds step 0
    assert "step 0 is the run's base model, which no checkpoint holds" in capsys.readouterr().err
    with pytest.raises(ExportError) as e:
        export_checkpoint(run, 0)
    msg = str(e.value)
    assert f"{base / 'model.safetensors'} is not the file {run} started from" in msg and "\n" not in msg, msg
    # ... and a step-0 export of another base than the run's record (a run started over from the
    # edited base: the trainer's record_base) is not returned as the run's step 0.
    (base / "model.safetensors").write_bytes(original)
    assert export_checkpoint(run, 0) == export_dir(run, 0)
    (base / "model.safetensors").write_bytes(bytes(edited))
    record_base(run, base, str(base.resolve()), base_sha256(base))
    # (its checkpoints record the first base.json: refused as not the one they recorded, R22f S1)
    with pytest.raises(GristmillError, match="base.json is not the one step-000002 recorded"):
        export_checkpoint(run, 0)
    shutil.rmtree(run / "checkpoints")  # a run started over has none yet: the export's own record
    with pytest.raises(
        ExportError, match="holds another base than .* started from .*base_weights_sha256"
    ) as e:
        export_checkpoint(run, 0)
    # moved aside, never deleted (export_fix: an export may hold the only copy of its weights, RV32f A6)
    again = f"; move {export_dir(run, 0)} aside and export it again from the run's base (gristmill export "
    assert str(e.value).endswith(f"{again}{run} --step 0), which needs the base at hand"), str(e.value)


def test_a_weights_file_the_index_names_but_the_base_lacks_is_one_line_when_hashed(tmp_path):
    """Review R16d F2: the mixture search hashes a base's weights without loading them
    (base_record.weights_sha256, torch-free): a shard the index names but the directory lacks was a
    FileNotFoundError traceback, where the trainer said one line."""
    from training.checkpoint.base_record import weights_sha256

    make_base(tmp_path / "base", shard=True)
    shards = sorted((tmp_path / "base").glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[1].unlink()
    said = rf"^{re.escape(str(shards[1]))} not found \(named by the base's"
    with pytest.raises(BaseModelError, match=said):
        weights_sha256(tmp_path / "base")


def test_offline_a_hub_cache_holding_only_the_tokenizer_is_said_to_hold_part_of_the_base(
    tmp_path, monkeypatch
):
    """Offline, model.init_from = ORG/BASE whose cache held only tokenizer.json (what a data build's
    tokenizer.path = ORG/BASE fetches) printed "fetching … from the hub" while offline, then called
    the repository "not a transformers model" (review R25d M1). Offline, the cache is read and said
    to hold only part of the base, with the two ways to get it; with network the same call fetches it."""
    import huggingface_hub.constants as hf_constants
    from huggingface_hub import hf_hub_download

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    files["tokenizer.json"] = _tokenizer(tmp_path / "tok", {0: "<|endoftext|>"}).read_bytes()
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        hf_hub_download(REPO, "tokenizer.json")  # as `data build` with tokenizer.path = REPO leaves it
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        said = []
        with pytest.raises(ConfigError) as refused:
            locate_base(REPO, say=said.append)
        assert said == [f"model.init_from: reading {REPO} from the hub cache {tmp_path / 'hf-home' / 'hub'} "
                        "(HF_HUB_OFFLINE is set)"]  # fmt: skip
        line = str(refused.value)
        assert f"holds only part of {REPO} at commit {commit} (tokenizer.json; no config.json and no " in line
        assert "not a transformers model" not in line
        assert "the same command, HF_HUB_OFFLINE unset" in line
        assert f"`hf download {REPO} --revision {commit} {ONLY}`" in line  # that commit, not main (R25g 3)

        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        assert locate_base(REPO).identity == f"{REPO}@{commit}"  # with network: the rest is fetched
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        snapshot = tmp_path / "hf-home" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit
        assert locate_base(REPO).directory == snapshot  # offline again: the cache holds the base now


def _cache_of(home: Path, commit: str) -> Path:
    return home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit


def test_a_cached_base_without_its_tokenizer_json_is_refused_unless_the_hub_said_it_has_none(
    tmp_path, monkeypatch
):
    """Review R25g 1: offline, a hub base whose cache held config.json and the weights but no
    tokenizer.json (what transformers' from_pretrained fetches) was taken for a base without a
    tokenizer: the dataset's tokenizer went unchecked ("note: … has no tokenizer.json") and a dataset
    of another tokenizer trained, exit 0, where the same command with network was refused. A
    snapshot read from the cache cannot show the repository lacks it: refused, naming the commit to
    download (R25g 3); with the hub's word (its listing, or the cache's record of the file's
    absence) a base without tokenizer.json is taken, offline too."""
    import huggingface_hub.constants as hf_constants
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    tokenizer = _tokenizer(tmp_path / "tok", {0: "<|endoftext|>"}).read_bytes()
    home = tmp_path / "hf-home"
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files | {"tokenizer.json": tokenizer}, repo_type="model")
        point_hub_at(hub, monkeypatch, home)
        for name in files:  # as from_pretrained(REPO) leaves the cache: no tokenizer.json
            hf_hub_download(REPO, name)
        for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the hub's 404, recorded
            with pytest.raises(EntryNotFoundError):
                hf_hub_download(REPO, name)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(ConfigError) as refused:
            locate_base(REPO)
        line = str(refused.value)
        held = ", ".join(sorted(files))
        assert (
            f"holds only part of {REPO} at commit {commit} ({held}; no tokenizer.json): a snapshot " in line
        )
        assert "cannot show the repository has none" in line, line
        assert f"`hf download {REPO} --revision {commit} {ONLY}`" in line, line

        # A commit without tokenizer.json: fetched with network (the hub lists the files), then offline
        # from the cache, which recorded the listing; or only the files from_pretrained asks for, the
        # tokenizer's absence recorded by huggingface_hub (.no_exist) when asked for it
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        bare = hub.push(REPO, files, repo_type="model")
        assert locate_base(REPO).directory == _cache_of(home, bare)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        assert locate_base(REPO).identity == f"{REPO}@{bare}"
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home-2")  # another cache: no listing in it
        for name in files:
            hf_hub_download(REPO, name)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            with pytest.raises(EntryNotFoundError):
                hf_hub_download(REPO, name)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        said = []
        assert locate_base(REPO, say=said.append).identity == f"{REPO}@{bare}"
        # no word of a chat_template.jinja (a cache as a gristmill before it was kept left it): taken,
        # and said, not refused as a file the run keeps (trial RV66a F1)
        assert said[-1].startswith(
            f"note: the hub cache {tmp_path / 'hf-home-2' / 'hub'} holds no chat_template.jinja"
        )
        assert "says the repository has none: the run's exports ship none" in said[-1], said


def test_a_hub_base_whose_tokenizer_is_in_another_form_is_refused_as_a_directorys_is(
    tmp_path, built_dataset, monkeypatch
):
    """A hub repository holding its tokenizer only as tokenizer.model (no tokenizer.json): the base's
    fetch (HUB_FILES) never took it, so the run trained on the dataset's ids with a note that there was
    nothing to check, where the same files in a directory are refused (review RV63g 2)."""
    info = read_dataset_info(built_dataset)
    make_base(tmp_path / "base", vocab_size=info["vocab_size"])
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    with HubServer() as hub:
        commit = hub.add_repo(
            REPO, files | {"tokenizer.model": b"<sentencepiece model proto>"}, repo_type="model"
        )
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        base = locate_base(REPO).directory
        assert (base / "tokenizer.model").read_bytes() == b"<sentencepiece model proto>"
        with pytest.raises(BaseModelError) as e:
            check_base_data(base, built_dataset, info, info["vocab_size"])
        assert str(e.value).startswith(f"{base} holds its tokenizer as tokenizer.model but no tokenizer.json")
        # offline, a cache as an earlier fetch left it (no tokenizer.model): refused with what it lacks,
        # not passed with a note as online it is refused (review RV64c 3)
        import huggingface_hub.constants as hf_constants
        from huggingface_hub import snapshot_download

        point_hub_at(hub, monkeypatch, tmp_path / "hf-home-2")
        snapshot_download(REPO, allow_patterns=HUB_FILES)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(ConfigError) as e:
            locate_base(REPO)
        assert (
            f"lacks tokenizer.model of {REPO} at commit {commit}, its tokenizer (it has no tokenizer.json)"
            in (str(e.value))
            and f"`hf download {REPO} --revision {commit} {ONLY}`" in str(e.value)
        ), e.value


def test_a_cached_main_read_because_the_hub_was_not_reached_is_said_to_be(tmp_path, monkeypatch):
    """Without network (HF_HUB_OFFLINE unset), or with the repository gone from the hub (404: deleted,
    made private), snapshot_download reads the cache's main without a word: a base pushed to since
    trained as the old commit, as if current (trial RV62c S3, review RV63d 3). Said, with the commit;
    with the hub there and naming that commit, nothing is said."""
    from huggingface_hub import close_session

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    cache = tmp_path / "hf-home" / "hub"
    said: list[str] = []

    def note() -> str:
        notes = [s for s in said if s.startswith("note")]
        assert len(notes) == 1, said
        said.clear()
        return notes[0]

    with HubServer() as hub:
        first = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        assert locate_base(REPO, say=said.append).identity == f"{REPO}@{first}"
        assert not [s for s in said if s.startswith("note")], said
        said.clear()
        newer = hub.push(REPO, {**files, "README.md": b"a newer commit"}, repo_type="model")
        assert newer != first
        gone = hub.repos.pop(("model", REPO))  # deleted, or made private: the hub answers 404
        assert locate_base(REPO, say=said.append).identity == f"{REPO}@{first}"
        assert re.fullmatch(
            r"note: model\.init_from: the Hugging Face hub did not say which commit main names \(HTTP 404 "
            rf".+\); {REPO} is commit {first}, the one the hub cache {cache} holds for main: the hub's "
            r"may be newer \(the run records this commit\)",
            note(),
        )
        hub.repos[("model", REPO)] = gone
    close_session()  # the hub is gone
    assert locate_base(REPO, say=said.append).identity == f"{REPO}@{first}"
    assert note().startswith(
        "note: model.init_from: the Hugging Face hub did not say which commit main names (ConnectError: "
    )


def test_without_network_a_partly_cached_base_is_said_to_be_one_and_each_shard_counts(tmp_path, monkeypatch):
    """Review R25g 2: with HF_HUB_OFFLINE unset and no network, snapshot_download falls back to the
    cached snapshot, and one holding only tokenizer.json was called "not a transformers model" (R25d
    M1's symptom, fixed only offline). R25g 6: a weights index whose shard is not cached counted as
    the weights. Both are said to be part of the base, naming what is missing, with the commit to
    download (R25g 3)."""
    from huggingface_hub import close_session, hf_hub_download

    make_base(tmp_path / "base", shard=True)
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    shards = sorted(n for n in files if n.startswith("model-"))
    assert len(shards) > 1
    files["tokenizer.json"] = _tokenizer(tmp_path / "tok", {0: "<|endoftext|>"}).read_bytes()
    home = tmp_path / "hf-home"
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, home)
        hf_hub_download(REPO, "tokenizer.json")  # as `data build` with tokenizer.path = REPO leaves it
    close_session()  # the hub is gone (no kept-alive connection to it either); HF_HUB_OFFLINE is not set
    with pytest.raises(ConfigError) as refused:
        locate_base(REPO)
    line = str(refused.value)
    assert "not a transformers model" not in line, line
    assert (
        f"the Hugging Face hub cannot be reached, and the hub cache {home / 'hub'} holds only part of {REPO} "
        f"at commit {commit} (tokenizer.json; no config.json and no weights and no tokenizer_config.json and "
        "no special_tokens_map.json and no generation_config.json)"
    ) in line, line
    assert f"`hf download {REPO} --revision {commit} {ONLY}`" in line, line

    with HubServer() as hub:
        hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, home)
        for name in files.keys() - {shards[-1]}:
            hf_hub_download(REPO, name)
    close_session()
    for offline in (False, True):  # no network, or HF_HUB_OFFLINE set
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", offline)
        with pytest.raises(ConfigError) as refused:
            locate_base(REPO)
        line = str(refused.value)
        assert (
            f"; no {shards[-1]} (named by model.safetensors.index.json) and no tokenizer_config.json and no "
            "special_tokens_map.json): "
        ) in line, line


def test_a_hub_repository_lacking_a_shard_its_index_names_is_said_to_lack_it(tmp_path, monkeypatch):
    """Trial RV69c F3: a repository whose weights index names a shard it was pushed without was
    reported as a path in the hub cache "not found"; the line names the repository and commit."""
    make_base(tmp_path / "base", shard=True)
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    shard = sorted(n for n in files if n.startswith("model-"))[-1]
    with HubServer() as hub:
        commit = hub.add_repo(REPO, {n: b for n, b in files.items() if n != shard}, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        with pytest.raises(ConfigError) as refused:
            locate_base(REPO)
    line = str(refused.value)
    assert "\n" not in line and "hf-home" not in line, line
    assert f"the hub repository {REPO} at commit {commit} lacks {shard}, which its model.safetensors" in line


def test_an_empty_revision_is_refused_as_one(tmp_path, monkeypatch):
    """Trial RV69c F5: `org/name@` was read as a local path and refused as "not a directory"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as refused:
        locate_base("acme/tiny@")
    line = str(refused.value)
    assert line.startswith("model.init_from = 'acme/tiny@' names no revision after '@'"), line
    assert "'acme/tiny' (its main branch) or acme/tiny@REV" in line, line


def test_an_instruct_base_s_chat_template_is_fetched_and_an_older_cache_without_it_is_read(
    tmp_path, monkeypatch
):
    """A hub base's chat_template.jinja is fetched with it (exports ship it: trial RV66a F1); a snapshot
    an earlier gristmill cached without it, whose cached listing names one, was refused offline as
    incomplete by snapshot_download (review RV66g 1): read, with a note that the exports ship none."""
    from huggingface_hub import snapshot_download

    from training.checkpoint.hf_export import unkept_base_note

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    files["chat_template.jinja"] = b"{% for m in messages %}{{ m.content }}{% endfor %}"
    files["additional_chat_templates/rag.jinja"] = b"{% for m in messages %}[rag] {{ m.content }}{% endfor %}"
    files["tokenizer.json"] = b"{}"  # its own: its exports ship its templates
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        fetched = locate_base(REPO).directory
        for template in ("chat_template.jinja", "additional_chat_templates/rag.jinja"):  # (RV66f F4)
            assert (fetched / template).read_bytes() == files[template], template
        # a run of it started before gristmill kept them: said, from the cached listing (review RV67d 5)
        run = tmp_path / "run"
        record_base(run, fetched, f"{REPO}@{commit}", "its config's sha256")
        record = json.loads((run / "base" / "base.json").read_text())
        record["files"] = [n for n in record["files"] if not n.endswith(".jinja")]
        (run / "base" / "base.json").write_text(json.dumps(record))
        assert unkept_base_note(run) == (
            f"note: the hub repository {REPO}@{commit} holds additional_chat_templates/rag.jinja, "
            f"chat_template.jinja, which {run / 'base'} does not keep (the run started before gristmill "
            f"kept them): the run's exports ship none; `hf download {REPO} "
            f"additional_chat_templates/rag.jinja chat_template.jinja --revision {commit}` fetches them; "
            "put what is still the base's in a copy of an export (`gristmill export RUN --step N --out "
            "DIR`: an export of the run holds only what it lists)"
        )
        point_hub_at(hub, monkeypatch, tmp_path / "older-home")
        snapshot_download(REPO, allow_patterns=HUB_FILES)  # what a gristmill before the template cached
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
        said = []
        assert locate_base(REPO, say=said.append).identity == f"{REPO}@{commit}"
    assert said[-2].startswith(
        f"note: the hub cache {tmp_path / 'older-home' / 'hub'} holds no chat_template.jinja"
    )
    assert "the run's exports ship none" in said[-2], said
    # the named one, which the cached listing names: said too, not passed over
    assert said[-1].startswith(
        f"note: the hub cache {tmp_path / 'older-home' / 'hub'} holds no additional_chat_templates/rag.jinja "
        f"of {REPO} at commit {commit}, which the repository holds"
    ), said


def _refused_offline(monkeypatch) -> str:
    """The line locate_base(REPO) is refused with, HF_HUB_OFFLINE set."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError) as refused:
        locate_base(REPO)
    return str(refused.value)


def test_a_cached_base_without_a_file_the_run_keeps_is_refused_unless_the_hub_said_it_has_none(
    tmp_path, monkeypatch
):
    """Review R25l S1: offline, a cache filled file by file (no listing cached) that held config.json,
    the weights and tokenizer.json but not the repository's tokenizer_config.json and
    generation_config.json was taken: RUN/base lacked them, and the export shipped files made up
    from config.json's ids (another eos, no chat_template) where the same run with network shipped
    the hub's. Every file the run keeps is held to tokenizer.json's rule: present, or absent by the
    hub's word (its listing, or the cache's .no_exist record), else refused in one line naming it."""
    import huggingface_hub.constants as hf_constants
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    assert "generation_config.json" in files
    files["tokenizer.json"] = _tokenizer(tmp_path / "tok", {0: "<|endoftext|>"}).read_bytes()
    files["tokenizer_config.json"] = json.dumps(
        {"eos_token": "<|endoftext|>", "chat_template": "{{ m }}"}
    ).encode()
    home = tmp_path / "hf-home"
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, home)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            hf_hub_download(REPO, name)
        with pytest.raises(EntryNotFoundError):  # the hub's 404, recorded (.no_exist): not asked of it
            hf_hub_download(REPO, "special_tokens_map.json")
        line = _refused_offline(monkeypatch)
        assert (
            f"holds only part of {REPO} at commit {commit} (config.json, model.safetensors, tokenizer.json; "
            "no tokenizer_config.json and no generation_config.json): a snapshot read from the cache cannot "
            "show the repository has none, and the run keeps the base's own (its export ships them): "
        ) in line, line
        assert f"`hf download {REPO} --revision {commit} {ONLY}`" in line, line

        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # with network: fetched, then offline
        snapshot = locate_base(REPO).directory
        assert {p.name for p in snapshot.iterdir()} == set(files)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        assert locate_base(REPO).directory == snapshot


def test_a_cached_listing_naming_files_the_snapshot_lacks_is_said_to_name_them(tmp_path, monkeypatch):
    """Review R25l M4: offline, a snapshot whose cached listing (huggingface_hub >= 1.x) names files the
    cache lacks was said to hold "only part of it", not which part. The line names them."""
    from huggingface_hub import snapshot_download

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    files["tokenizer.json"] = _tokenizer(tmp_path / "tok", {0: "<|endoftext|>"}).read_bytes()
    files["README.md"] = b"not fetched: not a file of the base"
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        snapshot_download(REPO, allow_patterns=["config.json"])  # the listing is cached with it
        line = _refused_offline(monkeypatch)
    assert (
        f"holds only part of it (no generation_config.json, no model.safetensors, no tokenizer.json): "
        f"fetch the base with network (the same command, HF_HUB_OFFLINE unset), or download it elsewhere "
        f"(`hf download {REPO} --revision {commit} {ONLY}`)"
    ) in line, line


def test_a_file_the_hub_lacks_is_recorded_as_absent_when_the_base_is_fetched(tmp_path, monkeypatch):
    """Review R25l M1: a huggingface_hub that caches no listing (< 1.x: no get_cached_repo_tree, which
    transformers 4.x needs) could not show offline that a base gristmill had fetched whole has no
    tokenizer.json: refused every time. Fetching a base, gristmill leaves for each kept file the hub's
    listing lacks the .no_exist record hf_hub_download leaves for a 404; offline, with no listing
    cached (removed here, as the old versions never write it), the base is taken."""
    import huggingface_hub.constants as hf_constants

    make_base(tmp_path / "base")
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    home = tmp_path / "hf-home"
    with HubServer() as hub:
        commit = hub.add_repo(REPO, files, repo_type="model")
        point_hub_at(hub, monkeypatch, home)
        assert locate_base(REPO).identity == f"{REPO}@{commit}"
    cache = home / "hub" / f"models--{REPO.replace('/', '--')}"
    absent = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}
    assert {p.name for p in (cache / ".no_exist" / commit).iterdir()} == absent
    shutil.rmtree(cache / "trees", ignore_errors=True)  # no listing cached
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    said = []
    assert locate_base(REPO, say=said.append).identity == f"{REPO}@{commit}"
    assert not any("chat_template" in line for line in said), said


@pytest.mark.parametrize("way", ["through a symlink", "from another working directory"])
def test_a_relative_base_reached_another_way_and_gone_is_resumed_from_the_checkpoint(
    tmp_path, monkeypatch, way
):
    """Review RV28c F3: init_from = "bases/m2" reached through a symlink to a model store, or resumed
    from another working directory, its directory gone: the checkpoint records the directory the value
    resolved to at the start, which the value no longer resolves to, and the resume asked the hub for
    a repository "bases/m2", failed, and advised `hf download bases/m2`. A checkpoint that recorded a
    directory, resumed by a value the hub (the stand-in) answers it does not have, resumes from the
    checkpoint with the note naming that directory; where that directory is there after all, it is read
    as at the start; a hub not reached (offline) says nothing of the value: its own line (RV29c F2)."""
    import huggingface_hub.constants as hf_constants

    store, work = tmp_path / "store" / "m2", tmp_path / "work"
    store.mkdir(parents=True)
    (work / "bases").mkdir(parents=True)
    if way == "through a symlink":
        (work / "bases" / "m2").symlink_to(store)
    else:
        shutil.copytree(store, work / "bases" / "m2")
    monkeypatch.chdir(work)
    identity = locate_base("bases/m2").identity
    recorded = {"init_from": identity, "init_from_sha256": "ab" * 32}
    with HubServer() as hub:
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        if way == "through a symlink":
            (work / "bases" / "m2").unlink()  # the link gone, the store's directory there after all
        else:
            monkeypatch.chdir(tmp_path)  # no bases/m2 here; the recorded one there after all
        assert locate_base("bases/m2", recorded).directory == Path(identity)
        shutil.rmtree(identity)
        said = []
        source = locate_base("bases/m2", recorded, say=said.append)
        assert source.directory is None and source.identity == identity, (said, source)
        assert f"the run's base is the directory {identity}, not at hand: resuming from the checkpoint" in (
            source.note
        ), source.note
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(ConfigError, match="HF_HUB_OFFLINE|offline|does not hold it"):
            locate_base("bases/m2", recorded)


def test_a_relative_base_directory_gone_is_resumed_from_the_checkpoint_not_fetched(tmp_path, monkeypatch):
    """Review R28a M2: init_from = "bases/m2" (relative, one slash: it reads as org/name), the run
    stopped, the directory removed, `--resume auto`: the resume asked the hub for a repository
    "bases/m2" and advised `hf download bases/m2`, where the absolute path of the same directory gave
    the documented note. The checkpoint recorded the directory the value resolved to; the value
    resolving to it is that directory, gone: the note, the hub (the stand-in) not asked."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bases" / "m2").mkdir(parents=True)
    identity = locate_base("bases/m2").identity  # what the run records (COMPLETE's model.init_from)
    assert identity == str((tmp_path / "bases" / "m2").resolve())
    shutil.rmtree(tmp_path / "bases" / "m2")
    recorded = {"init_from": identity, "init_from_sha256": "ab" * 32}
    with HubServer() as hub:
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        said = []
        source = locate_base("bases/m2", recorded, say=said.append)
    assert said == [] and source.directory is None and source.identity == identity, (said, source)
    assert source.note.startswith(f"note: the base directory {identity} is not at hand; resuming from the "
                                  "checkpoint"), source.note  # fmt: skip
