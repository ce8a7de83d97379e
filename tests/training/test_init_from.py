"""[model] init_from: a Hugging Face LlamaForCausalLM directory as the starting point (issue 30).

Checked, not trusted: after loading, gristmill's logits equal stock transformers' on a fixed batch
(float32 CPU) for GQA, tied and untied embeddings, sharded files, bf16 weights upcast, llama3 RoPE
scaling in both config spellings; what gristmill cannot compute exactly is one line; the data must
match the base (tokenizer, vocabulary, separator) before step 1; a resume with another base is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_same_weights,
    losses,
    one_error_line,
    overrides,
    torchrun_cmd,
)
from training.checkpoint.hf_import import (
    BaseModelError,
    base_model_fields,
    check_base_data,
    load_base_weights,
)
from training.config import ModelSection
from training.config_checks import resolve_model_config
from training.contract.config_loader import ConfigError
from training.contract.dataset_format import file_sha256
from training.model import ModelConfig, Transformer

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
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, '"yarn"'),
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
        (_dataset(tmp_path / "d3", tok | {"x": "other"}), "tokenizer.json (dataset) differs from"),
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
    notes = check_base_data(base, tmp_path / "d6", _dataset(tmp_path / "d6", tok, sep=3), 256)
    assert len(notes) == 1 and "neither its bos nor eos" in notes[0]
    (base / "tokenizer.json").unlink()
    notes = check_base_data(base, tmp_path / "d1", _dataset(tmp_path / "d1", tok), 256)
    assert len(notes) == 1 and "has no tokenizer.json" in notes[0]


# ------------------------------------------------------------------------------------------------
# Runs: a refusal before step 1, the base recorded, another base refused on resume, FSDP = 1 process


def _run(sets: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data") / "ds")


def test_init_from_run_records_the_base_resumes_exactly_and_refuses_another(tmp_path, data):
    base, other = tmp_path / "base", tmp_path / "other"
    make_base(base, max_position_embeddings=64, tie_word_embeddings=True)
    make_base(other, max_position_embeddings=64, tie_word_embeddings=True, rms_norm_eps=1e-5)
    run, straight = tmp_path / "run", tmp_path / "straight"
    init = f"model.init_from={json.dumps(str(base))}"
    done = _run(overrides(data, run, init, "schedule.steps=8", "run.max_steps=4"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has no tokenizer.json" in done.stdout  # the base has none: a note, not a refusal
    record = json.loads((run / "checkpoints" / "step-000004" / "COMPLETE").read_text())["model"]
    assert record["init_from"] == str(base.resolve()) and len(record["init_from_sha256"]) == 64
    assert "init_from" in (run / "config.toml").read_text()
    assert losses(run)[0][1] < 6.0  # ln(256) = 5.55: a random-init base starts near uniform
    sets = overrides(data, run, "schedule.steps=8", "checkpoint.resume=auto")
    line = one_error_line(_run([*sets, f"model.init_from={json.dumps(str(other))}"]).stderr)
    assert "continues from another base model" in line and str(other.resolve()) in line, line
    line = one_error_line(_run(sets).stderr)  # a resume without init_from: another model too
    assert "continues from another base model" in line and "random initialisation" in line, line
    done = _run([*sets, init])
    assert done.returncode == 0, done.stderr[-3000:]
    done = _run(overrides(data, straight, init, "schedule.steps=8"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert losses(run) == losses(straight) and len(losses(run)) == 8
    assert_same_weights(run, straight, 8)


def test_init_from_refuses_a_larger_vocabulary_before_step_1(tmp_path, data):
    base = tmp_path / "base"
    make_base(base, vocab_size=128, max_position_embeddings=64)
    done = _run(overrides(data, tmp_path / "run", f"model.init_from={json.dumps(str(base))}"))
    line = one_error_line(done.stderr)
    assert "vocab_size 256, more than the base model's 128" in line and "dataset.json" in line, line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


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
    cmd = torchrun_cmd([*sets, "run.seed=999"])
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
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
