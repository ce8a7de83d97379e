"""Start a run from a Hugging Face `LlamaForCausalLM` directory: `[model] init_from = "DIR"`.

    DIR/  config.json  model.safetensors                       (one file)
          config.json  model.safetensors.index.json  model-0000N-of-0000M.safetensors  (sharded)
          tokenizer.json                                       (optional; checked against the data)

Three steps, each checked rather than trusted:

- `base_model_fields` turns config.json into ModelConfig fields. Everything gristmill's model
  computes exactly is accepted (GQA, tied or untied embeddings, rms_norm_eps, rope_theta, RoPE
  scaling "default" and "llama3" in the transformers-4 `rope_scaling` and transformers-5
  `rope_parameters` spellings); anything else (biases, another rope type, a sliding window, QK-norm,
  another architecture, a head_dim other than hidden_size / num_attention_heads) is one ConfigError
  naming the key and its value: never an approximate model.
- `load_base_weights` copies the tensors into a built model, upcast to its fp32 master weights,
  unsharded or as FSDP2 DTensor shards. How: every rank memory-maps the safetensors files (numpy,
  copy-on-write) and copies only the rows of its own shard (the Shard(0) chunk FSDP2 keeps, per mesh
  dimension), one tensor at a time. No process group traffic, no rank holds the full model (the
  page cache shares the file between the ranks of a node), and the peak per rank is its shard plus
  one shard-sized fp32 temporary. Rank 0 reading and scattering would need the full model to pass
  through one process and a collective per tensor, for nothing: every rank can read the files.
- `check_base_data` refuses, before step 1, a dataset that does not match the base: another
  tokenizer.json (by what decides the ids, so a re-saved copy matches), a vocabulary larger than
  the model's, or a separator that is not one of the base's special tokens.

Refused in one line too: RoPE spellings that disagree, a tied config over a different stored head,
a weights file shorter than its header, a NaN or inf in the weights.

`base_sha256` is the base's identity (config.json and the weights index: names, dtypes, shapes,
offsets and file sizes, not the bytes of the weights, which would take a minute to hash on an 8B);
it is recorded in every checkpoint, and a resume with another base is refused.

Reads with numpy, torch and json only (training/ imports no safetensors or transformers).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.checkpoint.base_source import (
    CONFIG_JSON,
    INDEX_JSON,
    OTHER_TOKENIZER_FORMS,
    TOKENIZER_FILES,
    BaseModelError,
    weights_files,
)
from training.checkpoint.hf_names import SAFETENSORS_DTYPES, hf_name
from training.contract.config_loader import ConfigError, json_sha256
from training.contract.dataset_format import DATASET_JSON, TOKENIZER_JSON, file_sha256, tokenizer_differences
from training.contract.run_layout import is_training_run

__all__ = [
    "BASE_FIELDS",
    "LLAMA3_FIELDS",
    "TOKEN_ID_KEYS",
    "TOKEN_KEYS",
    "BaseModelError",
    "base_model_fields",
    "base_sha256",
    "check_base_data",
    "load_base_weights",
    "added_tokens",
    "special_tokens",
    "split_token_entries",
    "split_token_ids",
    "weights_index",
]

_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.int16, "F64": np.float64}
_TORCH = {code: dtype for dtype, code in SAFETENSORS_DTYPES.items()} | {"F64": torch.float64}
BASE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "norm_eps",
               "tie_embeddings", "max_seq_len", "rope_theta", "rope_type")  # fmt: skip
"""The ModelConfig fields a base's config.json decides (`base_model_fields`), with LLAMA3_FIELDS
when its RoPE is "llama3"."""
LLAMA3_FIELDS = ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len")
HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"
# Tensors some LlamaForCausalLM files carry that hold nothing to load (RoPE's buffer is recomputed).
_IGNORED = ("rotary_emb.inv_freq",)


# --------------------------------------------------------------------------------------------------
# config.json


def read_base_config(base: str | Path) -> dict[str, Any]:
    """The parsed config.json of `base` (a ConfigError naming model.init_from when it is missing)."""
    path = Path(base) / CONFIG_JSON
    if not Path(base).is_dir():
        raise ConfigError(
            f"model.init_from = {str(base)!r} is not a directory; give a Hugging Face LlamaForCausalLM "
            "directory (config.json + model.safetensors)",
            "model.init_from",
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        # a run's directory or checkpoint: its weights are exported first, or resumed (review R22f U4)
        run = next((p for p in (Path(base), *Path(base).parents[:2]) if is_training_run(p)), None)
        hint = (
            f" ({run} is a training run: export a step first, gristmill export {run} --step N, and give "
            "its exports/step-N; or continue the run with --resume)"
            if run is not None
            else ""
        )
        raise ConfigError(
            f"model.init_from: {path} not found; the base directory needs the model's config.json{hint}",
            "model.init_from",
        ) from None
    except ValueError as e:
        raise ConfigError(f"model.init_from: {path} is not valid JSON ({e})", "model.init_from") from None
    if not isinstance(config, dict):  # an AttributeError traceback where it was read (trial RV57d F1)
        raise ConfigError(
            f"model.init_from: {path} holds {_json_kind(config)}, not a JSON object", "model.init_from"
        )
    return config


def _refuse(path: Path, key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(
        f"{path}: {key} = {json.dumps(value)} is not supported by gristmill's model ({why}); "
        "gristmill loads only what it computes exactly",
        "model.init_from",
    )


def _positive(path: Path, key: str, value: Any, integer: bool = False) -> float | int:
    """`value` of config.json's `key` as the number it must be: > 0 (an integer where `integer`). A string,
    null or list was a traceback, and rope_theta = 0 or rms_norm_eps = -1 trained NaN from step 1 with
    advice to lower the learning rate (trial RV63b 6, 7)."""
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)  # 2048.0, as some writers spell a length
    kind = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0 or not math.isfinite(value):
        what = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"{path}: {key} = {json.dumps(value)} is not {what}", "model.init_from")
    return value if integer else float(value)


def _rope_spelling(c: dict[str, Any], path: Path, key: str, params: Any, theta: Any) -> dict[str, Any]:
    """RoPE fields from one spelling: `params` (the table under `key`) and its θ."""
    if not isinstance(params, dict):
        raise _refuse(path, key, params, "expected a table of RoPE parameters, as transformers requires")
    if any(isinstance(v, dict) for v in params.values()):
        raise _refuse(path, key, params, "per-layer-type RoPE parameters")
    # what transformers versions read differently (trial RV63b 1): 4 copies `type` over `rope_type` and
    # takes θ from the top level; 5 reads a θ inside rope_scaling too
    if "type" in params and "rope_type" in params and params["type"] != params["rope_type"]:
        raise _ambiguous(path, f"{key}.type = {json.dumps(params['type'])}", f"{key}.rope_type = "
                         f"{json.dumps(params['rope_type'])}")  # fmt: skip
    if key == "rope_scaling" and "rope_theta" in params and params["rope_theta"] != theta:
        top = (
            f"rope_theta = {json.dumps(c['rope_theta'])}"
            if "rope_theta" in c
            else "no rope_theta (θ = 10000)"
        )
        raise _ambiguous(path, f"rope_scaling.rope_theta = {json.dumps(params['rope_theta'])}", top)
    inside = key != "rope_scaling" and "rope_theta" in params  # else the top level's (or its default)
    theta = _positive(path, f"{key}.rope_theta" if inside else "rope_theta", theta)
    rope_type = params.get("rope_type", params.get("type", "default"))
    # transformers 5 moved partial_rotary_factor under rope_parameters; 4 reads it at the top level.
    where = params if "partial_rotary_factor" in params else c
    partial = where.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        name = f"{key}.partial_rotary_factor" if where is params else "partial_rotary_factor"
        raise _refuse(path, name, partial, "partial RoPE")
    fields: dict[str, Any] = {"rope_theta": theta, "rope_type": rope_type}
    if rope_type == "default":
        return fields
    if rope_type != "llama3":
        raise _refuse(path, f"{key}.rope_type", rope_type, 'only "default" and "llama3" RoPE')
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        if not isinstance(params.get(name), int | float):
            raise ConfigError(
                f"{path}: {key}.{name} is missing or not a number (llama3 RoPE scaling needs it)",
                "model.init_from",
            )
    # As transformers: without original_max_position_embeddings, max_position_embeddings.
    if "original_max_position_embeddings" in params:
        original = _positive(
            path, f"{key}.original_max_position_embeddings", params["original_max_position_embeddings"], True
        )
    else:
        original = _positive(path, "max_position_embeddings", c.get("max_position_embeddings", 2048), True)
    return fields | {
        "rope_factor": _positive(path, f"{key}.factor", params["factor"]),
        "rope_low_freq_factor": _positive(path, f"{key}.low_freq_factor", params["low_freq_factor"]),
        "rope_high_freq_factor": _positive(path, f"{key}.high_freq_factor", params["high_freq_factor"]),
        "rope_original_max_seq_len": original,
    }


def _ambiguous(path: Path, one: str, other: str) -> ConfigError:
    return ConfigError(
        f"{path}: {one} and {other} describe different RoPE; transformers versions differ in which one "
        "they read, so gristmill reads neither: keep the one the base was trained with and delete the other",
        "model.init_from",
    )


def _rope_fields(c: dict[str, Any], path: Path) -> dict[str, Any]:
    """RoPE fields from `rope_parameters` (transformers 5) or `rope_scaling` + `rope_theta` (4).
    A config that holds both spellings must say the same in both: which one wins differs between
    transformers versions, so a disagreement is refused rather than resolved by a guess."""
    top_theta = c.get("rope_theta", 10000.0)  # LlamaConfig's default θ
    if c.get("rope_parameters") is None:
        return _rope_spelling(c, path, "rope_scaling", c.get("rope_scaling") or {}, top_theta)
    v5 = c["rope_parameters"]
    theta = v5.get("rope_theta", top_theta) if isinstance(v5, dict) else top_theta
    fields = _rope_spelling(c, path, "rope_parameters", v5, theta)
    other = None
    if "rope_scaling" in c:
        v4 = _rope_spelling(c, path, "rope_scaling", c["rope_scaling"] or {}, top_theta)
        if v4 != fields:
            other = f"rope_scaling = {json.dumps(c['rope_scaling'])}"
            if "rope_theta" in c:
                other += f" with rope_theta = {json.dumps(c['rope_theta'])}"
            elif v4["rope_theta"] != fields["rope_theta"]:  # the θ that differs is implied (R28a m2)
                other += (
                    f" without rope_theta, which transformers 4 reads as θ = {v4['rope_theta']:g} "
                    f"(LlamaConfig's default) against rope_parameters' {fields['rope_theta']:g}"
                )
    elif "rope_theta" in c and c["rope_theta"] != fields["rope_theta"]:
        other = f"rope_theta = {json.dumps(c['rope_theta'])}"
    if other is not None:
        raise _ambiguous(path, f"rope_parameters = {json.dumps(v5)}", other)
    return fields


def base_model_fields(base: str | Path) -> dict[str, Any]:
    """ModelConfig fields of the base's config.json; a ConfigError naming the key for anything
    gristmill's model cannot compute exactly. Defaults for absent keys are LlamaConfig's."""
    path = Path(base) / CONFIG_JSON
    c = read_base_config(base)
    arch = c.get("architectures", ["LlamaForCausalLM"])
    if arch != ["LlamaForCausalLM"]:
        raise _refuse(path, "architectures", arch, "only LlamaForCausalLM")
    if c.get("model_type", "llama") != "llama":
        raise _refuse(path, "model_type", c["model_type"], 'only "llama"')
    # each key's values transformers computes as gristmill does: "swish" is silu by another name
    # (refused, it was one line for a base transformers reads the same: trial RV61d F4)
    for key, ok in (("attention_bias", (False,)), ("mlp_bias", (False,)),
                    ("hidden_act", ("silu", "swish")), ("sliding_window", (None,)),
                    ("use_sliding_window", (False,)), ("qk_norm", (False,)),
                    ("use_qk_norm", (False,)), ("attention_dropout", (0.0,)),
                    ("pretraining_tp", (1,))):  # fmt: skip
        if key in c and c[key] not in ok:
            raise _refuse(path, key, c[key], f"it computes {key} = {json.dumps(ok[0])}")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(c.get(key), int) or c[key] < 1:
            raise ConfigError(f"{path}: {key} is missing or not a positive integer", "model.init_from")
    dim, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim")
    if head_dim is not None and (dim % heads or head_dim != dim // heads):
        why = f"it uses hidden_size / num_attention_heads = {dim / heads:g}"
        raise _refuse(path, "head_dim", head_dim, why)
    kv_heads = c.get("num_key_value_heads") or heads
    if not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        # here, not ModelConfig's own check, so that the line names the file and its key (R28a m1)
        raise ConfigError(
            f"{path}: num_key_value_heads = {json.dumps(kv_heads)} does not divide num_attention_heads = "
            f"{heads} (each key/value head serves an equal group of query heads): set it to the key/value "
            "heads the weights hold (the rows of k_proj.weight / head_dim)",
            "model.init_from",
        )
    tie = bool(c.get("tie_word_embeddings", False))
    if tie:
        _check_tied_head(Path(base), path)
    return {
        "dim": dim,
        "n_layers": c["num_hidden_layers"],
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "ffn_dim": c["intermediate_size"],
        "vocab_size": c["vocab_size"],
        "norm_eps": _positive(path, "rms_norm_eps", c.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": tie,
        "max_seq_len": _positive(
            path, "max_position_embeddings", c.get("max_position_embeddings", 2048), True
        ),
        **_rope_fields(c, path),
    }


def _check_tied_head(base: Path, config: Path) -> None:
    """tie_word_embeddings = true over weights that store an lm_head.weight unlike the embedding:
    transformers 5 then keeps the two apart (with a warning), older versions tie them and drop the
    head, so the same files are two different models. Refused; a stored head equal to the
    embedding is the tied model written out in full, and fine."""
    index = weights_index(base)
    if HEAD not in index or EMBEDDING not in index:
        return
    head, embedding = _read(base, index[HEAD], HEAD), _read(base, index[EMBEDDING], EMBEDDING)
    if head.dtype != embedding.dtype:  # a copy upcast only where the files disagree
        head, embedding = head.float(), embedding.float()
    if head.shape == embedding.shape and torch.equal(head, embedding):
        return
    raise ConfigError(
        f"{config}: tie_word_embeddings = true, but {base / index[HEAD]['file']} holds an {HEAD} unlike "
        f"{EMBEDDING} (transformers 5 keeps the two apart, older versions tie them: two different "
        "models); set tie_word_embeddings = false to train both as stored, or remove lm_head.weight from "
        "the weights to tie the head to the embedding",
        "model.init_from",
    )


# --------------------------------------------------------------------------------------------------
# safetensors


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """(the JSON header of a safetensors file, the byte offset its data section starts at)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 100_000_000:
                raise ValueError(f"header length {n}")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise BaseModelError(f"{path} not found (named by the base's weights index)") from None
    except (OSError, ValueError) as e:
        raise BaseModelError(f"{path} is not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise BaseModelError(f"{path} is not a readable safetensors file (its header is no JSON object)")
    header.pop("__metadata__", None)
    # each entry as safetensors requires it (a traceback before: trial RV63b 6), and no two overlapping
    # (safetensors refuses those; gristmill read another tensor's bytes: RV63b 12)
    spans = []
    for name, h in header.items():
        offsets = h.get("data_offsets") if isinstance(h, dict) else None
        if not (
            isinstance(h, dict) and isinstance(h.get("dtype"), str) and isinstance(h.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in h["shape"]) and isinstance(offsets, list)
            and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]
        ):  # fmt: skip
            raise BaseModelError(f"{path} is not a readable safetensors file (its entry {name!r} is {h!r})")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise BaseModelError(f"{path} is not a readable safetensors file ({a} and {b} overlap)")
    return header, 8 + n


def weights_index(base: str | Path) -> dict[str, dict[str, Any]]:
    """{HF tensor name: {"file", "dtype", "shape", "start", "end"}} over the base's safetensors
    file(s): model.safetensors, else the files its index names; start/end are absolute byte offsets
    in "file"."""
    base = Path(base)
    weight_map, files = weights_files(base)
    index: dict[str, dict[str, Any]] = {}
    held: dict[str, str] = {}  # tensor -> the first of the files holding it
    for name in files:
        header, data = _header(base / name)
        for tensor, h in header.items():
            if tensor in held:  # transformers reads every shard, the last one's wins; gristmill the
                # index's: two models from the same files (trial RV63b 2)
                raise BaseModelError(
                    f"{base / held[tensor]} and {base / name} both hold {tensor}: transformers reads every "
                    "shard (the last one's wins), the index names one; remove it from all but the one the "
                    "base was saved with"
                )
            held[tensor] = name
            if weight_map is not None and weight_map.get(tensor) != name:
                if tensor not in weight_map and not tensor.endswith(_IGNORED):
                    # transformers loads every tensor of the shards the index names; gristmill took the
                    # tensor for absent and blamed the weights (trial RV63b 14)
                    raise BaseModelError(
                        f"{base / name} holds {tensor}, which {base / INDEX_JSON} does not name: add it to "
                        "the index's weight_map (or remove it from the file)"
                    )
                continue  # the index names another file for it: that one is the tensor
            begin, end = h["data_offsets"]
            index[tensor] = {"file": name, "dtype": h["dtype"], "shape": h["shape"],
                             "start": data + begin, "end": data + end}  # fmt: skip
        # A cut-off download or copy: numpy's memory map would fail later with "mmap length is
        # greater than file size", naming neither file nor fix.
        need = data + max((h["data_offsets"][1] for h in header.values()), default=0)
        size = (base / name).stat().st_size
        if size < need:
            raise BaseModelError(
                f"{base / name} is truncated: its header describes {need:,} bytes, the file holds {size:,}; "
                "download or copy it again"
            )
    missing = sorted(set(weight_map or ()) - set(index))
    if missing:
        raise BaseModelError(f"{base / INDEX_JSON} names {missing[:3]} but their files do not hold them")
    return index


def base_sha256(base: str | Path) -> str:
    """The base's identity: config.json and the weights index (names, dtypes, shapes, offsets and
    the sizes of the files); not the weight bytes themselves."""
    base = Path(base)
    index = weights_index(base)
    sizes = {f: (base / f).stat().st_size for f in sorted({t["file"] for t in index.values()})}
    return json_sha256({"config": read_base_config(base), "weights": index, "sizes": sizes})


def _read(base: Path, entry: dict[str, Any], name: str) -> torch.Tensor:
    """The tensor `entry` describes, memory-mapped (copy-on-write: nothing is read until used)."""
    code, shape = entry["dtype"], entry["shape"]
    if code not in _NUMPY:
        raise BaseModelError(f"{base / entry['file']}: {name} has dtype {code}; gristmill reads F32/F16/BF16")
    count = math.prod(shape)
    itemsize = np.dtype(_NUMPY[code]).itemsize
    if entry["end"] - entry["start"] != count * itemsize:
        raise BaseModelError(f"{base / entry['file']}: {name}'s offsets do not match its shape {shape}")
    arr = np.memmap(base / entry["file"], dtype=_NUMPY[code], mode="c", offset=entry["start"], shape=(count,))
    # int16 view for bf16 (numpy has none); safetensors data is little-endian like x86/ARM.
    return torch.from_numpy(arr).view(_TORCH[code]).view(shape)


def _local_chunk(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of `full` a (DTensor) parameter holds on this rank: torch.chunk per Shard(d) mesh
    dimension, as FSDP2 shards; the whole tensor for a plain parameter."""
    placements = getattr(param, "placements", None)
    if placements is None:
        return full
    mesh, coord = param.device_mesh, param.device_mesh.get_coordinate()
    part = full
    for i, placement in enumerate(placements):
        if placement.is_shard():
            chunks = torch.chunk(part, mesh.size(i), dim=placement.dim)
            part = chunks[coord[i]] if coord[i] < len(chunks) else part.narrow(placement.dim, 0, 0)
        elif not placement.is_replicate():
            raise BaseModelError(f"cannot load into a parameter placed as {placement}")
    return part


@torch.no_grad()
def load_base_weights(model: torch.nn.Module, base: str | Path) -> None:
    """Copy the base's weights into `model` (built, not on meta; plain or FSDP2-sharded): every
    parameter from its HF tensor, upcast to the parameter's dtype. A missing tensor, a shape that
    differs or a tensor the model has no place for is one line naming the file."""
    base = Path(base)
    index = weights_index(base)
    used = set()
    for name, param in model.named_parameters():  # a tied LM head is listed once, as the embedding
        hf = hf_name(name)
        entry = index.get(hf)
        if entry is None:
            raise BaseModelError(
                f"{base}: the weights hold no {hf} (gristmill's {name}); is it a LlamaForCausalLM?"
            )
        shape = tuple(getattr(param, "shape", ()))
        if tuple(entry["shape"]) != shape:
            raise BaseModelError(
                f"{base / entry['file']}: {hf} has shape {entry['shape']}, the model's {name} {list(shape)}"
            )
        local = param.to_local() if hasattr(param, "to_local") else param
        part = _local_chunk(_read(base, entry, hf), param)
        if part.shape != local.shape:
            raise BaseModelError(f"{hf}: shard of shape {list(part.shape)} for a local {list(local.shape)}")
        local.copy_(part)
        # A NaN or inf in the base would make step 1 non-finite, read as a divergence (lower the
        # LR) when the files are at fault. Each rank checks the rows it copied; the sum is one pass.
        if not torch.isfinite(local.sum(dtype=torch.float32)) and not bool(torch.isfinite(local).all()):
            nan, inf = int(local.isnan().sum()), int(local.isinf().sum())
            raise BaseModelError(
                f"{base / entry['file']}: {hf} holds {nan:,} NaN and {inf:,} inf values; the base model's "
                "weights must be finite to train from: use an intact copy of the base"
            )
        used.add(hf)
    tied = getattr(getattr(model, "cfg", None), "tie_embeddings", False)
    spare = {HEAD} if tied else set()  # a tied checkpoint may store the head anyway
    left = sorted(n for n in set(index) - used - spare if not n.endswith(_IGNORED))
    if left:
        raise BaseModelError(
            f"{base}: the weights hold {len(left)} tensors gristmill's model has no place for, e.g. "
            f"{left[:3]}; loading would drop them"
        )


# --------------------------------------------------------------------------------------------------
# The data must match the model


def _tokenizer_differences(data_tok: Path, base_tok: Path) -> list[str]:
    """tokenizer_differences (the one rule, shared with a mixture's sources), a file that is not JSON
    refused as the base's error."""
    try:
        return tokenizer_differences(data_tok, base_tok)
    except ValueError as e:
        for path in (base_tok, data_tok):  # the one that is not (both were named: review RV52a F6)
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except ValueError as bad:
                raise BaseModelError(f"{path} is not valid JSON ({bad})") from None
        raise BaseModelError(f"{data_tok} or {base_tok} is not valid JSON ({e})") from None


def added_tokens(tokenizer: Path) -> dict[int, dict[str, Any]]:
    """{id: entry} of a tokenizer.json's added tokens, special or not: the tokens it matches in a text
    before its model (BPE) sees the rest."""
    added = json.loads(tokenizer.read_text(encoding="utf-8")).get("added_tokens") or []
    return {int(t["id"]): t for t in added}


def special_tokens(added: Mapping[int, dict[str, Any]]) -> dict[int, str]:
    """{id: content} of a tokenizer.json's special tokens: its added tokens (added_tokens) marked special."""
    return {i: t.get("content", "") for i, t in added.items() if t.get("special")}


def _ids(value: Any) -> set[int]:
    return {int(v) for v in (value if isinstance(value, list) else [value]) if v is not None}


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
TOKEN_KEYS = ("bos_token", "eos_token", "pad_token")  # the same tokens, named in tokenizer_config.json


def _split_ids(value: Any, special: Mapping[int, str]) -> tuple[Any, list[int]]:
    """`value` (an id, a list of ids or None) as (what of it is special: the same shape, None where
    nothing; its ordinary ids)."""
    members = [int(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
    ordinary = [v for v in members if v not in special]
    kept = [v for v in members if v in special]
    if not kept:
        return None, ordinary
    return (kept if isinstance(value, list) else kept[0]), ordinary


def split_token_ids(
    config: dict[str, Any], special: Mapping[int, str]
) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The one rule for the bos/eos/pad ids an export of a base with its own tokenizer.json keeps from
    its config.json (`config`), against that tokenizer.json's special tokens (`special`:
    special_tokens): (kept, ordinary). Kept: those present, not null and special (of a list, its
    special members); a key left out is the export's default, bos/eos the dataset's separator, no pad,
    as for a base that brings no tokenizer.json (a config without eos left the export none, RV28c F4).
    Ordinary: the ids, by key, that are no special token, the base's by accident (LlamaConfig's
    defaults 1 and 2 left beside a BPE tokenizer whose only special token is id 0 are '!' and '"':
    generate() stopped at the first double quote, review R28a M1)."""
    kept, ordinary = {}, {}
    for key in TOKEN_ID_KEYS:
        special_part, ordinary_ids = _split_ids(config.get(key), special)
        if special_part is not None:
            kept[key] = special_part
        if ordinary_ids:
            ordinary[key] = ordinary_ids
    return kept, ordinary


def _token_content(value: Any) -> Any:
    """A tokenizer_config.json entry's token: a string, or transformers' AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


# transformers 4's and 5's spelling, and transformers 5's model_specific_special_tokens (a dict by name,
# read by name: PreTrainedTokenizerBase.__init__ adds its tokens as special ones, review RV29a F8)
TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens", "model_specific_special_tokens")
ADDED_TOKENS_DECODER = "added_tokens_decoder"


def split_token_entries(
    spec: dict[str, Any], added: Mapping[int, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The one rule for the tokens an export's tokenizer treats as added or special: exactly its
    tokenizer.json's added tokens (`added`: added_tokens), as it defines them. Of a base's
    tokenizer_config.json or special_tokens_map.json (`spec`): (kept, ordinary). Ordinary, by key, the
    tokens (repr) of the entries that would make AutoTokenizer add another: a `*_token` key (bos, eos,
    pad, unk, sep, cls, mask, transformers 5's own names) or a member of additional_special_tokens /
    extra_special_tokens / model_specific_special_tokens naming no special token of tokenizer.json, an
    added_tokens_decoder entry that is not tokenizer.json's added token of its id (content and flags).
    AutoTokenizer splits such a token ('"') out of every text before BPE: its users' tok(text) encodes
    texts otherwise than the data, and gristmill's eval too where the token is not special (eval does
    not split special tokens out: review RV28c F1, RV28f F1, RV29a F4). Kept: `spec` without those
    entries (hf_export names config.json's tokens for bos/eos/pad instead)."""
    special = set(special_tokens(added).values())
    by_id = {str(i): t for i, t in added.items()}

    def ordinary_token(value: Any) -> bool:  # a flag (add_bos_token) or none is no token
        if value is None or isinstance(value, bool | int | float):
            return False
        content = _token_content(value)
        return not isinstance(content, str) or content not in special

    def as_defined(i: str, entry: Any) -> bool:
        ours = by_id.get(str(i))
        return (
            isinstance(entry, dict)
            and ours is not None
            and "content" in entry
            and all(entry[k] == ours[k] for k in entry.keys() & ours.keys() - {"id"})
        )

    kept: dict[str, Any] = {}
    ordinary: dict[str, list[str]] = {}
    for key, value in spec.items():
        gone: list[str] = []
        if key == ADDED_TOKENS_DECODER and isinstance(value, dict):
            kept[key] = {i: e for i, e in value.items() if as_defined(i, e)}
            gone = [f"{_token_content(e)!r} (id {i})" for i, e in value.items() if not as_defined(i, e)]
        elif key in TOKEN_LISTS and isinstance(value, list):
            kept[key] = [v for v in value if not ordinary_token(v)]
            gone = [repr(_token_content(v)) for v in value if ordinary_token(v)]
        elif key in TOKEN_LISTS and isinstance(value, dict):  # extra_/model_specific_special_tokens by name
            kept[key] = {name: v for name, v in value.items() if not ordinary_token(v)}
            gone = [repr(_token_content(v)) for v in value.values() if ordinary_token(v)]
        elif key.endswith("_token") and ordinary_token(value):
            gone = [repr(_token_content(value))]
        else:
            kept[key] = value
        if gone:
            ordinary[key] = gone
    return kept, ordinary


def check_base_data(
    base: str | Path, dataset: str | Path, info: dict[str, Any], vocab_size: int, resumed: bool = False
) -> list[str]:
    """Refuse, in one line naming both files, a dataset the base model cannot train on: another
    tokenizer, a larger vocabulary than the model's, a separator that is not a special token of the
    base. Returns notes (a base without tokenizer.json; bos/eos/pad ids of its config.json and entries
    of its tokenizer_config.json / special_tokens_map.json that are ordinary tokens, which its exports
    replace or leave out: split_token_ids, split_token_entries; a separator that is special but neither bos
    nor eos of the export)."""
    base, dataset = Path(base), Path(dataset)
    where, config = dataset / DATASET_JSON, base / CONFIG_JSON
    data_vocab = int(info["vocab_size"])
    if data_vocab > vocab_size:
        raise BaseModelError(
            f"{where} has vocab_size {data_vocab}, more than the base model's {vocab_size} ({config}): "
            "build the dataset with the base model's tokenizer"
        )
    base_tok, data_tok = base / TOKENIZER_JSON, dataset / TOKENIZER_JSON
    if not base_tok.is_file():
        # a tokenizer in another form (GPT-2's vocab.json and merges.txt, SentencePiece's tokenizer.model):
        # the base's own, which a note alone let the run train past with other ids (trial RV63b 9)
        other = [n for n in OTHER_TOKENIZER_FORMS if (base / n).is_file()]
        held = f"holds its tokenizer as {', '.join(other)} but no {TOKENIZER_JSON}" if other else ""
        if other and not resumed:  # a run that trained past the note before is not stopped now (RV63g 1)
            raise BaseModelError(
                f"{base} {held}, which the dataset's tokenizer is checked against (a model trained on other "
                "ids than its base's learns from scratch): write it (AutoTokenizer.from_pretrained(DIR)."
                "save_pretrained(TMP), which needs sentencepiece for a tokenizer.model, then copy TMP's "
                "tokenizer.json alone into DIR), check its ids, and build the dataset with it"
            )
        held = held or f"has no {TOKENIZER_JSON}"
        return [f"note: {base} {held}: the dataset's tokenizer cannot be checked against it"]
    if not data_tok.is_file() and info["tokenizer_sha256"] == "none":
        raise BaseModelError(
            f"{where} records no tokenizer (a dataset written without tokenizer.json), so it cannot be "
            f"checked against {base_tok}: build the dataset with the base model's tokenizer.json"
        )
    if not data_tok.is_file():
        # All there is to compare: the sha256 of the bytes the dataset was built with.
        recorded = str(info["tokenizer_sha256"])
        if recorded != file_sha256(base_tok):
            raise BaseModelError(
                f"{where} records tokenizer_sha256 {recorded[:12]}…, the bytes of the tokenizer.json the "
                f"dataset was built with, and {base_tok} (base model) hashes to "
                f"{file_sha256(base_tok)[:12]}…; {dataset} has no tokenizer.json to compare by content (a "
                "re-saved copy of the same tokenizer differs in bytes): put the dataset's tokenizer.json "
                "back, or rebuild the dataset with the base model's tokenizer.json"
            )
    elif differ := _tokenizer_differences(data_tok, base_tok):
        raise BaseModelError(
            f"{data_tok} (dataset) differs from {base_tok} (base model) in {', '.join(differ)} (what "
            "decides the ids, compared so that a re-saved copy matches): the data was tokenized with "
            "another tokenizer; rebuild the dataset with the base model's tokenizer.json"
        )
    sep, notes = int(info["separator"]["id"]), []
    added = added_tokens(base_tok)
    special = special_tokens(added)
    if sep not in special:
        raise BaseModelError(
            f"{where}: separator id {sep} ({info['separator'].get('token')!r}) is not a special token of "
            f"{base_tok}: build the dataset with one of the base's, e.g. its bos or eos token"
        )
    c = read_base_config(base)
    (kept, ordinary), sets = split_token_ids(c, special), []
    if ordinary:
        names = ", ".join(
            f"{key} {' and '.join(map(str, ids))}" + (f" (of {c[key]})" if isinstance(c[key], list) else "")
            for key, ids in ordinary.items()
        )
        bos_eos = " and ".join(key[:3] for key in ordinary if key != "pad_token_id" and key not in kept)
        if bos_eos:
            sets.append(f"{bos_eos} to the dataset's separator {special[sep]!r} (id {sep})")
        sets += [f"{key[:3]} to {kept[key]}" for key in ordinary if key in kept]  # a list's special members
        if "pad_token_id" in ordinary and "pad_token_id" not in kept:
            sets.append("pad to none")
    entries = {
        name: split_token_entries(base_json(base / name), added)[1]
        for name in TOKENIZER_FILES[1:]
        if (base / name).is_file()
    }
    named = "; ".join(
        f"{base / name} has " + ", ".join(f"{key} {' and '.join(tokens)}" for key, tokens in found.items())
        for name, found in entries.items()
        if found
    )
    keys = list(dict.fromkeys(key for found in entries.values() for key in found))
    if ordinary or named:
        what = "; ".join(([f"{config} has {names}"] if ordinary else []) + ([named] if named else []))
        if any(key in TOKEN_KEYS for key in keys):
            sets.append(
                "their tokenizer files' bos/eos/pad entries to the tokens of the ids their config.json has"
            )
        does = [f"set {' and '.join(sets)} instead"] if sets else []
        if others := [key for key in keys if key not in TOKEN_KEYS]:
            does.append(
                f"leave out the entries of {', '.join(others)}, whose tokens AutoTokenizer would split out "
                "of its users' texts before BPE (their tok(text) would not be the data's encoding)"
            )
        decoder = " (of added_tokens_decoder: not its added token of the id)" * (ADDED_TOKENS_DECODER in keys)
        notes.append(
            f"note: {what}, not special tokens of {base_tok}{decoder}: "
            f"its exports {' and '.join(does)} (an ordinary token cannot be a special one; for another, set "
            f"the key to a special token of {base_tok})"
        )
    exported = _ids(kept.get("bos_token_id", sep)) | _ids(kept.get("eos_token_id", sep))
    if sep not in exported:
        notes.append(
            f"note: the separator {special[sep]!r} (id {sep}) of {where} is a special token of the base but "
            f"neither its bos nor eos ({config})"
        )
    return notes


def base_json(path: Path) -> dict:
    """A base's JSON file (a tokenizer file, config.json), its own or the run's copy RUN/base/: one that
    does not parse is one line naming it (a JSONDecodeError traceback before step 1: reviews RV28f F3,
    and RV29e F3 for a copy edited by hand as a refusal advises)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BaseModelError(f"{path} is not valid JSON ({e}): fix it or remove it from the base") from None
    if not isinstance(value, dict):  # an AttributeError traceback where it was read (trial RV57d F1)
        raise BaseModelError(
            f"{path} holds {_json_kind(value)}, not a JSON object: fix it or remove it from the base"
        )
    return value


def _json_kind(value: Any) -> str:
    """What a JSON value that should have been an object is, in a refusal's words."""
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )
