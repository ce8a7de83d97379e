"""Export a gristmill model as a Hugging Face `LlamaForCausalLM` directory.

    RUN/exports/step-000150/  model.safetensors  config.json  generation_config.json
                              tokenizer.json  tokenizer_config.json  special_tokens_map.json
                              gristmill_export.json  gristmill_checksums.json

The export is a rename of the state dict (hf_state_dict_names, below), never a
permutation: the model already uses HF's rotate-half RoPE layout. Only torch and json are needed, so
the trainer can write exports on a GPU box without `safetensors` or `transformers`; the
safetensors file is written by hand (8-byte header length, JSON header, raw little-endian data).
Where transformers is installed, the tokenizer files are loaded with AutoTokenizer once written, as
eval loads them (check_export_tokenizer).

A run from scratch: the tokenizer is the dataset's exact tokenizer.json, bos = eos = the dataset's
separator token (the one token the model saw between documents), no pad token. A run from a base
model ([model] init_from): the base's tokenizer files and bos/eos/pad ids (RUN/base/,
training/checkpoint/base_record.py), as the base's users expect them, where they are special tokens
of the tokenizer.json it brought (hf_import.split_token_ids; else the separator's, no pad, in
config.json and the tokenizer files alike). Either way gristmill's eval
frames each document with the separator `gristmill_export.json` records, once (validation/
eval_model.py), whatever bos says. `gristmill_export.json` records where the weights came from and
the separator policy;
`gristmill_checksums.json`, written last, the size and SHA-256 of every other file, checked by
`verify_export` before eval (or anything else here) trusts the weights.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import gc
import glob
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from training.checkpoint.base_record import (
    BASE_JSON,
    TOKENIZER_FILES,
    base_files,
    base_weights,
    check_kept_base,
    kept_base_files,
    read_base_record,
)
from training.checkpoint.base_source import (
    chat_templates,
    hub_id,
    is_hub_commit,
    listed_templates,
    locate_base,
)
from training.checkpoint.export_advice import export_again, export_command, export_fix, export_step_of
from training.checkpoint.hf_import import (
    CONFIG_JSON,
    TOKEN_ID_KEYS,
    TOKEN_KEYS,
    added_tokens,
    base_json,
    load_base_weights,
    special_tokens,
    split_token_entries,
    split_token_ids,
)
from training.checkpoint.hf_names import SAFETENSORS_DTYPES as _SAFETENSORS_DTYPES
from training.checkpoint.hf_names import hf_state_dict_names
from training.checkpoint.io import (
    final_weights_note,
    load_or_raise,
    merged_step,
    missing_step_reason,
    newest_verified,
    nonfinite_tensor,
    not_the_run_s_save,
    untrained_reason,
    verify_checkpoint,
)
from training.checkpoint.model_config import resolve_model_config
from training.checkpoint.record import (
    CheckpointError,
    describe_differences,
    model_differences,
    read_complete_record,
    recorded_model,
    resume_model_record,
    step_held_otherwise,
)
from training.checkpoint.state import ModelState
from training.config import TrainConfig
from training.contract.config_loader import PathArgument, load_config
from training.contract.dataset_format import (
    TOKENIZER_JSON,
    file_sha256,
    framed_as_trained,
    read_dataset_info,
    shared_ids,
    shared_ids_said,
    tokenizer_problem,
    without_dropout,
)
from training.contract.errors import GristmillError, unwritable
from training.contract.file_lock import LockHeld, file_lock
from training.contract.integrity import (
    CHECKPOINT_IDENTITY,
    EXPORT_CHECKSUMS,
    EXPORT_META,
    Ledger,
    checkpoint_identity,
    damaged_files,
    exported_with_checksums,
    file_records,
    read_ledger,
)
from training.contract.lifetime import host
from training.contract.run_layout import (
    BASE_DIR,
    CHECKPOINTS_DIR,
    CHECKPOINTS_JSONL,
    CONFIG_TOML,
    EXPORTS_DIR,
    abandoned_copies,
    abandoned_name,
    checkpoint_dir,
    complete_steps,
    export_dir,
    file_in_the_way,
    in_a_dataset,
    incomplete_reason,
    is_training_run,
    names_a_step,
    step_of,
    unlike_a_run,
)
from training.data.recipe import check_trained_on, recorded_plan
from training.data.remote import tokenizer_dir
from training.data.spec import RunSpec, resolve
from training.merge import MergedWeights
from training.model import ModelConfig, Transformer, model_to_load

EXPORT_FORMAT = "gristmill-hf-export/1"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
FAST_TOKENIZER = "PreTrainedTokenizerFast"  # transformers' class that encodes with tokenizer.json as it is
# The tokenizer_config.json entries an export sets where they say otherwise or nothing, so that
# AutoTokenizer encodes and decodes as tokenizer.json does: {key: (its value, what every transformers
# the eval extra allows takes where it is absent, None where they differ: clean_up's was true in
# 4.45.0, false from 4.45.1, review RV33c F1)}. A base's class (GPT2Tokenizer, LlamaTokenizer) makes
# AutoTokenizer rebuild the tokenizer from its vocabulary, dropping tokenizer.json's pre-tokenizer or
# normaliser (eval scored ids the model never trained on); clean_up_tokenization_spaces true rewrites
# every decoded text after tokenizer.json's decoder ("42 ." as "42."; transformers 4.x for every
# model, 5 for all but BPE: eval's generated answers were not tokenizer.json's, review RV32f A4).
SET_ENTRIES: dict[str, tuple[Any, Any]] = {
    "tokenizer_class": (FAST_TOKENIZER, None),
    "clean_up_tokenization_spaces": (False, None),
}


class ExportError(GristmillError):
    """An export that cannot be made; the message names the run/checkpoint and the fix."""


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write `tensors` (CPU, contiguous-able) in the safetensors format, one tensor at a time."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ExportError(f"cannot export {name}: dtype {t.dtype} is not one of fp32/bf16/fp16")
        n = t.numel() * t.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            # int16 view: numpy has no bfloat16; the bytes are what matter (x86/ARM are little-endian).
            data = t.detach().to("cpu").contiguous()
            f.write(memoryview(data.view(torch.int16 if data.element_size() == 2 else torch.int32).numpy()))
        f.flush()
        os.fsync(f.fileno())


def hf_config(cfg: ModelConfig, separator_id: int, dtype: torch.dtype) -> dict[str, Any]:
    """config.json for LlamaForCausalLM. `rope_theta` is written at the top level and under
    `rope_parameters`: transformers 5 reads only the latter, 4.x only the former; llama3 RoPE
    scaling likewise under `rope_parameters` (5) and `rope_scaling` (4)."""
    dtype_name = str(dtype).removeprefix("torch.")
    rope: dict[str, Any] = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
    scaling = None
    if cfg.rope_type == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_seq_len,
        }
        rope |= scaling
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope,
        "rope_scaling": scaling,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "bos_token_id": separator_id,
        "eos_token_id": separator_id,
        "pad_token_id": None,
        "use_cache": True,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
    }


def _tokenizer_files(
    info: dict[str, Any], cfg: ModelConfig, special: dict[str, str], datasets: bool
) -> dict[str, Any]:
    """tokenizer_config.json and special_tokens_map.json of an export whose base brought none: bos and
    eos the separator, or `special`'s (the tokens of a base's config.json ids). With the dataset's
    tokenizer.json (`datasets`), add_bos_token says what its post-processor does (framed_as_trained:
    the separator first for position "before", nothing for "after")."""
    sep = info["separator"]["token"]
    tokens = {"bos_token": sep, "eos_token": sep} | special
    framing = {}
    if datasets:
        framing = {"add_bos_token": info["separator"]["position"] == "before", "add_eos_token": False}
    return {
        TOKENIZER_CONFIG: {
            "tokenizer_class": FAST_TOKENIZER,
            **tokens,
            **framing,
            "model_max_length": cfg.max_seq_len,
            "clean_up_tokenization_spaces": False,
        },
        "special_tokens_map.json": tokens,
    }


def _base_special_tokens(
    base: dict[str, Path], tokenizer_json: Path, keys: tuple[str, ...] = ("bos", "eos")
) -> dict[str, str]:
    """{"bos_token", "eos_token"} (`keys`): the tokens of the ids the export keeps from the base's
    config.json (_token_ids) in `tokenizer_json`'s vocabulary (the first of a list), for a base without
    a tokenizer_config.json of its own, or one whose entries name ordinary tokens: the tokenizer must
    name the tokens config.json names."""
    ids = _token_ids(base)
    if not ids or not tokenizer_json.is_file():
        return {}
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_json))
    out = {}
    for key in keys:
        i = ids.get(f"{key}_token_id")
        i = i[0] if isinstance(i, list) and i else i
        token = vocab.id_to_token(i) if isinstance(i, int) else None
        if token is not None:
            out[f"{key}_token"] = token
    return out


def _ship_tokenizer_file(base: dict[str, Path], name: str, dataset_dir: Path, out: Path) -> None:
    """The base's tokenizer_config.json or special_tokens_map.json (`name`) into `out`, as it is but for
    the entries that would make AutoTokenizer treat a token as added or special that its tokenizer.json
    does not (split_token_entries, the one rule): bos/eos/pad entries name config.json's tokens instead
    (the separator where config.json has the separator's, no pad where it has none), the others are
    left out. The base's eos '"' (or its unk_token, additional_special_tokens, added_tokens_decoder
    entry) was split out of every text by AutoTokenizer's default encoding as a special token: its
    users' tok(text) gave ids the model never trained on (RV28c F1, RV28f F1; gristmill's eval, which
    does not split special tokens out, was not affected: RV29a F4)."""
    spec = base_json(base[name])
    kept, ordinary = split_token_entries(spec, added_tokens(base[TOKENIZER_JSON]))
    if not ordinary:
        shutil.copyfile(base[name], out)
        return
    if replaced := [key for key in TOKEN_KEYS if key in ordinary]:
        tokens = _base_special_tokens(base, base[TOKENIZER_JSON], ("bos", "eos", "pad"))
        separator = read_dataset_info(dataset_dir)["separator"]["token"]
        for key in replaced:
            if key not in tokens and key != "pad_token":
                tokens[key] = separator
            kept[key] = tokens.get(key)
    out.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")


def write_tokenizer(
    dataset_dir: str | Path,
    model_cfg: ModelConfig,
    out_dir: str | Path,
    base: dict[str, Path] | None = None,
    *,
    export: str | Path | None = None,
) -> None:
    """The HF tokenizer files of an export into `out_dir`: those of the run's base model where it
    brought its tokenizer.json (`base`: base_record.base_files; its special tokens as its users
    expect; own_tokenizer_files), else the dataset's tokenizer.json with bos = eos = the separator (a
    base with a tokenizer.json but no tokenizer_config.json: the tokens of its config's bos/eos ids,
    which the export keeps). The
    trainer's in-process eval loads its tokenizer from the same files; the separator it frames
    documents with is the dataset's, whatever bos says. Checked last (check_export_tokenizer;
    `export`: what to name, `out_dir` where that is a temporary folder)."""
    dataset_dir, out_dir, base = Path(dataset_dir), Path(out_dir), own_tokenizer_files(base or {})
    # dataset.json where something is the dataset's (a base with both files needs no dataset)
    info = read_dataset_info(dataset_dir) if {TOKENIZER_JSON, TOKENIZER_CONFIG} - base.keys() else {}
    # the dataset's, checked first: an export would ship a damaged one with checksums that verify
    if TOKENIZER_JSON not in base and (problem := tokenizer_problem(dataset_dir, info)):
        raise ExportError(problem)
    # A base with its own tokenizer_config.json: its files alone (a derived special_tokens_map.json
    # would override the bos it sets).
    if TOKENIZER_CONFIG not in base:
        special = _base_special_tokens(base, base.get(TOKENIZER_JSON, dataset_dir / TOKENIZER_JSON))
        for name, content in _tokenizer_files(info, model_cfg, special, TOKENIZER_JSON not in base).items():
            (out_dir / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:
        if name in base and name != TOKENIZER_JSON:
            _ship_tokenizer_file(base, name, dataset_dir, out_dir / name)
    # tokenizer.json as the data was encoded with it (without BPE dropout), the base's or the
    # dataset's (synthetic test datasets have none): else a copy, byte for byte.
    # The dataset's framed as the shards are (framed_as_trained: a foreign tokenizer's post-processor
    # adding its BOS made every default encode start with an id the model never saw); a base's as
    # its users expect it.
    source = base.get(TOKENIZER_JSON, dataset_dir / TOKENIZER_JSON)
    if source.is_file():
        data = source.read_bytes()
        text = data.decode("utf-8")
        kept = without_dropout(text)
        if TOKENIZER_JSON not in base:
            kept = framed_as_trained(kept, info["separator"])
        (out_dir / TOKENIZER_JSON).write_bytes(data if kept is text else kept.encode("utf-8"))
    config = out_dir / TOKENIZER_CONFIG
    if config.is_file() and (out_dir / TOKENIZER_JSON).is_file():
        # The data was encoded by tokenizer.json itself, and answers decode as it decodes (SET_ENTRIES).
        spec = json.loads(config.read_text(encoding="utf-8"))
        unset = {key: value for key, (value, absent) in SET_ENTRIES.items() if spec.get(key, absent) != value}
        if unset:
            config.write_text(json.dumps(spec | unset, indent=2) + "\n", encoding="utf-8")
        # A run checked these bytes before step 1 (check_run_tokenizer): its own exports (async ones
        # too, in the same process) pass from the memo; `gristmill export` checks them here.
        if _brings_tokenizer_files(base):
            check_export_tokenizer(out_dir, export or out_dir, base)


def _brings_tokenizer_files(base: dict[str, Path]) -> bool:
    """Whether an export ships tokenizer files of the base's own (own_tokenizer_files: beside its
    tokenizer.json): only those can make AutoTokenizer read otherwise than tokenizer.json. gristmill's
    own (a run from scratch, a base with tokenizer.json alone) are the test suite's to check
    (test_hf_export), and a run from scratch pays no transformers import for them (~1.5 s a start)."""
    return bool(own_tokenizer_files(base).keys() & set(TOKENIZER_FILES[1:]))


# What of tokenizer.json decides gristmill eval's ids and answers: how a text is cut into ids
# (normalizer, pre_tokenizer, model: its vocab, merges and settings) and how generated ids become an
# answer's text (decoder; what transformers does to its text after it is judged by a decoded probe,
# _DECODE_PROBE). Not the post-processor (eval never asks for specials) nor added tokens, whose
# serialized flags can say otherwise than encoding does (_added_token_problems).
ENCODING_SECTIONS = ("normalizer", "pre_tokenizer", "model", "decoder")
_ADDED_TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized")
# Tokenizer files (their sha256s, and transformers') that passed check_export_tokenizer in this process:
# the same bytes read the same way, so a trainer's later exports pay a hash, not two loads (~1 s for a
# Llama-3 tokenizer).
_PASSED: set[tuple[str, ...]] = set()


def check_export_tokenizer(
    out_dir: Path, export: Path | str, named: Mapping[str, Path] | None = None, *, scoring: bool = False
) -> None:
    """Refuse, in one line naming `export`, the key that causes it (and the file it came from:
    `named`, {file name: the base's file}, where it is the base's) and the fix, tokenizer files that
    AutoTokenizer (transformers, offline, as eval loads them from `out_dir`) reads otherwise than the
    data's tokenizer.json: another normalizer, pre-tokenizer, model or decoder than the file's (its
    loaded backend compared with the file, section by section: no probe text shows every difference,
    review RV32l F1), added or special tokens other than exactly tokenizer.json's, a pad id past the
    model's vocabulary, a decoded text other than the decoder's (transformers' clean-up after it:
    _DECODE_PROBE), or none (it cannot load them). split_token_entries is the rule for the keys
    transformers reads today; this holds what a later (or earlier) transformers makes of others.
    Nothing to check without transformers (a training box without the eval extra loads no tokenizer)
    or without tokenizer.json (a synthetic dataset's). One home: an export (write_tokenizer), every
    start of a run from a base (check_run_tokenizer) and eval (`scoring`) call it.

    `scoring`: an eval's check of the export it scores, under its own transformers (the export was
    checked under the exporting machine's, or under none: review RV29a F3): only what changes gristmill
    eval's scores is refused, naming the export's own file and what to do with the export
    (rescoring_fix: it stays, exports are permanent)."""
    tokenizer_json = out_dir / TOKENIZER_JSON
    if not tokenizer_json.is_file():
        return
    try:
        import transformers
        from tokenizers import Tokenizer
    except ImportError:
        return
    files = [out_dir / name for name in TOKENIZER_FILES if (out_dir / name).is_file()]
    passed = (transformers.__version__, *(f"{p.name}:{file_sha256(p)}" for p in files))
    if passed in _PASSED or (scoring and (*passed, "scoring") in _PASSED):
        return
    # the reference: tokenizer.json as the data was encoded with it, serialized by the same tokenizers
    # as the loaded backend is (a file of an older tokenizers spells merges otherwise)
    data = Tokenizer.from_file(str(tokenizer_json))
    pipeline = _pipeline(data)
    vocab_size = _model_vocab_size(out_dir, data)

    def refused(folder: Path) -> Problem | None:  # the first, or first scored
        problems = _tokenizer_problems(transformers, folder, data, pipeline, vocab_size)
        return next((p for p in problems if p.scored or not scoring), None)

    # the file's own fault, whatever reads it: looked for on every check, not where two loads happened
    # to keep other tokens for a shared id (chance: one shared id passed half the time, review RV33c F2)
    shared = shared_ids(data.get_vocab(with_added_tokens=False))
    problem = Problem(_shared_ids_words(shared), None, True, VOCAB) if shared else refused(out_dir)
    if problem is None:
        _PASSED.add((*passed, "scoring") if scoring else passed)
        return
    what, token, _, own_key = problem
    if own_key is not None:  # an entry of tokenizer.json itself: no key of the other files changes it
        keys = [(own_key, TOKENIZER_JSON)]
    else:  # the one edit that makes them pass: a key, or every key that holds the token (RV33c F6)
        keys = _naming(out_dir, token, lambda folder: refused(folder) is None)
    # an entry of tokenizer.json is wrong whatever reads it (review RV33c F5); a key of the others, as read
    version = "" if own_key is not None else f" AutoTokenizer (transformers {transformers.__version__})"
    own = [n for n in TOKENIZER_FILES[1:] if (out_dir / n).is_file()]
    own = list(dict.fromkeys(file for _, file in keys)) if keys else own
    named = named or {}
    if scoring:  # the export's own files, which eval read; RUN/base's only where a new export reads it
        shown = {n: out_dir / n for n in own}
        base = [
            (key, Path(named[file]))
            for key, file in keys
            if file in named
            and key not in SET_ENTRIES  # a new export writes those as tokenizer.json reads (write_tokenizer)
            and Path(named[file]).parent != out_dir
            and _same_entry(Path(named[file]), out_dir / file, key)
        ]
        if own_key == VOCAB:  # the vocab the run's data was encoded with: no export or copy fixes it
            # RUN/base's copy named only where it holds that vocab (`base`: review RV41b F5)
            fix = vocab_rescoring_fix(base[0][1] if base else None)
        else:
            fix = rescoring_fix(Path(export), transformers.__version__, _edits(base) if base else None)
    else:  # a file gristmill wrote (no base): in a temporary folder, named alone
        shown = {n: named.get(n, n) for n in own}
        fix = f"find the entry that causes it in {' or '.join(map(str, shown.values()))} and leave it out"
        if own_key == VOCAB:
            fix = _vocab_fix(Path(shown[TOKENIZER_JSON]))
        elif keys:
            fix = _edits([(key, shown[file]) for key, file in keys])
    where = f" (by no one key of {' or '.join(map(str, shown.values()))})" if not keys else ""
    named_key = f" {_keys_of([(key, shown[file]) for key, file in keys])}:" if keys else ""
    raise ExportError(f"{export}:{named_key}{version} {what}{where}; {fix}")


def _by_file(keys: Sequence[tuple[str, Path | str]]) -> dict[str, list[str]]:
    """{file: its keys} of (key, file) pairs, in their order."""
    files: dict[str, list[str]] = {}
    for key, file in keys:
        files.setdefault(str(file), []).append(key)
    return files


def _keys_of(keys: Sequence[tuple[str, Path | str]]) -> str:
    """(key, file) pairs in words: 'added_tokens_decoder and additional_special_tokens of FILE'."""
    return " and ".join(f"{' and '.join(k)} of {file}" for file, k in _by_file(keys).items())


def _edits(keys: Sequence[tuple[str, Path | str]]) -> str:
    """The one edit of files that takes the effect of every (key, file) pair away: a SET_ENTRIES key
    set to its value (without tokenizer_class, transformers picks config.json's model type's class),
    tokenizer.json's vocab (VOCAB) one token an id, any other key left out; a file's keys named
    together."""
    edits = []
    for file, names in _by_file(keys).items():
        if values := [f"{key} to {json.dumps(SET_ENTRIES[key][0])}" for key in names if key in SET_ENTRIES]:
            edits.append(f"set {' and '.join(values)} in {file}")
        if VOCAB in names:
            edits.append(f"give each id of {VOCAB} in {file} one token")
        if out := [key for key in names if key not in SET_ENTRIES and key != VOCAB]:
            edits.append(f"leave {' and '.join(out)} out of {file}")
    return " and ".join(edits)


def _same_entry(base: Path, export: Path, key: str) -> bool:
    """Whether the base's tokenizer file `base` holds `key` (VOCAB: tokenizer.json's model.vocab) as the
    export's `export` does: an export written from it again would read it again."""
    try:
        ours, theirs = (json.loads(p.read_text(encoding="utf-8")) for p in (base, export))
    except (OSError, ValueError):
        return False
    missing = object()

    def entry(spec: Any) -> Any:
        for part in key.split(".") if key == VOCAB else [key]:
            if not isinstance(spec, dict) or part not in spec:
                return missing
            spec = spec[part]
        return spec

    return entry(ours) is not missing and entry(ours) == entry(theirs)


def _model_vocab_size(folder: Path, data: Any) -> int:
    """The ids the model has embeddings for: config.json's vocab_size in an export, else tokenizer.json's
    (the start's check writes no config.json; the model's vocabulary is the data's there)."""
    try:
        return int(json.loads((folder / CONFIG_JSON).read_text(encoding="utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return data.get_vocab_size(with_added_tokens=True)


def _differ_words(default: bool, scored: bool) -> str:
    """Which encodings differ from the data's, in words: the default one (its users' tok(text)) and
    gristmill eval's (split_special_tokens=True, validation/eval_model.py tok_encode, against the
    build's, which encodes special tokens' text as text: tokenization/separator.py)."""
    if default and scored:
        return (
            "its users' tok(text) and gristmill's eval both encode texts otherwise than the data (ids the "
            "model never trained on)"
        )
    if default:
        return (
            "its users' tok(text) encodes texts otherwise than the data (not gristmill's eval, which "
            "does not split special tokens out of a text)"
        )
    if scored:
        return (
            "gristmill's eval encodes texts otherwise than the data (ids the model never trained on; its "
            "users' tok(text) does not)"
        )
    return "though its users' tok(text) and gristmill's eval encode texts as the data"


# What changes gristmill eval's scores, in the words of an eval's refusal (_tokenizer_problems)
_SPLIT = (
    "gristmill's eval encodes every text holding it otherwise than the data (ids the model never trained on)"
)
_DROPPED = (
    "lm-eval drops it from the answers gristmill's eval generates (it decodes them without special tokens)"
)
_KEPT = (
    "lm-eval keeps its text in the answers gristmill's eval generates (a special token of the data's only)"
)
_DECODED = "lm-eval decodes the answers gristmill's eval generates otherwise than the data's tokenizer.json"
# A text whose decoding shows what AutoTokenizer does to tokenizer.json's decoded text after its
# decoder (transformers' clean_up_tokenization: " ." as ".", " 's" as "'s", … ; review RV32f A4)
_DECODE_PROBE = "a . b ? c ! d , e ' f n't g 'm h 's i 've j 're k"
VOCAB = "model.vocab"  # tokenizer.json's vocabulary, as a refusal names it


class Problem(NamedTuple):
    """One thing AutoTokenizer reads otherwise than tokenizer.json (_tokenizer_problems)."""

    what: str  # in words
    token: str | None  # the token concerned, if one
    scored: bool  # whether it changes gristmill eval's scores
    key: str | None = None  # the entry of tokenizer.json that causes it; None: a key of the other files


def _tokenizer_problems(
    transformers: Any, folder: Path, data: Any, pipeline: Mapping[str, Any], vocab_size: int
) -> Iterator[Problem]:
    """Each thing AutoTokenizer reads otherwise from the tokenizer files in `folder` than tokenizer.json
    (`data`; `pipeline`: its ENCODING_SECTIONS, _pipeline) is; none where it reads them as tokenizer.json
    is. The loaded backend's pipeline is compared with the file's whole (a class transformers rebuilds,
    GPT2Tokenizer or Qwen2Tokenizer, gets its own pre-tokenizer or normalizer: review RV32l F1); then
    the added and special tokens (_added_token_problems), the pad id (lm-eval pads generated batches
    with it), and the decoding of _DECODE_PROBE (lm-eval decodes generated answers with AutoTokenizer,
    which may rewrite what tokenizer.json's decoder gives)."""
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # whatever a transformers version raises: eval could not load it either
        first = next(iter(str(e).strip().splitlines()), "")  # one line (a missing library's is five)
        what = f"cannot load its tokenizer files ({type(e).__name__}: {first}): neither can eval or its users"
        yield Problem(what, None, True)
        return
    try:  # loaded, but a key it cannot use (model_max_length "abc": a TypeError at every encode, RV34c)
        tok("", add_special_tokens=False)  # no text: nothing for a vocabulary to lack
    except Exception as e:  # noqa: BLE001 - whatever it raises, eval's first encode raises it too
        first = next(iter(str(e).strip().splitlines()), "")
        what = f"cannot encode with its tokenizer files ({type(e).__name__}: {first})"
        yield Problem(f"{what}: neither can eval or its users", None, True)
        return
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:  # a class of its own (sentencepiece, Python): tokenizer.json is not read at all
        what = f"loads them as {type(tok).__name__}, which does not encode with {TOKENIZER_JSON}"
        yield Problem(f"{what}: {_differ_words(True, True)}", None, True)
        return
    loaded = _pipeline(backend)
    for section in ENCODING_SECTIONS:
        if loaded[section] != pipeline[section]:
            what = _section_difference(
                section, *(json.loads(p or "null") for p in (loaded[section], pipeline[section]))
            )
            words = _DECODED if section == "decoder" else _differ_words(True, True)
            yield Problem(f"{what}: {words}", None, True)
            return  # the rest follows from the same class or key
    yield from _added_token_problems(tok, data, vocab_size)
    pad = tok.pad_token_id
    if pad is not None and pad >= vocab_size:
        yield Problem(
            f"has pad_token {tok.pad_token!r}, id {pad}, past the model's vocabulary ({vocab_size} ids): "
            "lm-eval pads the prompts of gristmill's eval's generating tasks with it, which the model "
            "cannot embed (the eval stops there)",
            tok.pad_token,
            True,
        )
    ids = data.encode(_DECODE_PROBE, add_special_tokens=False).ids
    ours, theirs = data.decode(ids, skip_special_tokens=True), tok.decode(ids, skip_special_tokens=True)
    if theirs != ours:  # as lm-eval's tok_decode: without special tokens
        yield Problem(
            f"decodes as {theirs!r} what {TOKENIZER_JSON} decodes as {ours!r}: {_DECODED}", None, True
        )


def _vocab_fix(tokenizer_json: Path, dataset: Path | None = None) -> str:
    """The fix, at a run's start or export, of tokenizer.json `tokenizer_json` whose vocab gives one id
    to several tokens (shared_ids): the run's data was encoded with that vocab (check_base_data
    compares a base's with the dataset's), so the edited file alone was refused at the next start
    against the dataset (review RV34c G7); `dataset`: the file is that dataset's own copy (its
    tokenizer_sha256 records it), edited where the dataset is built from."""
    then = f"and build the dataset again with it ({_ENCODED})"
    if dataset is None:
        return f"{_edits([(VOCAB, tokenizer_json)])}, {then}"
    return f"give each id of {VOCAB} one token in the tokenizer {dataset} was built with, {then}"


_ENCODED = "its data was encoded with this vocab"


def vocab_rescoring_fix(base: Path | None) -> str:
    """The fix of such a vocab in an export being scored: its run trained on data encoded with it (an
    older run: no start refused it then; a run from a base: check_base_data held the dataset's vocab to
    the base's). Copying the export shipped the same file again (the advice looped: review RV34c), and
    editing `base` (RUN/base/tokenizer.json) alone before exporting again scored other ids than the
    data's wherever the edit moved a token the encoding makes (review RV41a F1, F2): the dataset, then
    the run, again."""
    where = f" (RUN/base's copy: {base})" if base is not None else ""
    return (
        f"give each id of {VOCAB} one token in the tokenizer the run's dataset was built with{where}, "
        f"build the dataset again with it ({_ENCODED}) and train again: no export of this run can be "
        "scored as its data was encoded"
    )


def _check_shipped_vocab(tokenizer_json: Path, export: str, dataset: Path | None = None) -> None:
    """Refuse, in check_export_tokenizer's words, tokenizer.json `tokenizer_json` that a run's exports
    ship without tokenizer files of a base's own (a run from scratch, a base that brought tokenizer.json
    alone: the dataset's or the base's, `dataset` where the dataset's), whose vocab gives one id to
    several tokens: the one fault of its own whatever reads it, which no start or export looked for,
    so eval refused it after training, and its copy advice wrote the same file again (review RV34c G2).
    Nothing to check in a file that holds no such vocab (a synthetic dataset's stand-in)."""
    # the file's own vocab, as tokenizers reads it (a load by tokenizers took 1-1.8 s at 128k, its
    # merges built); parsed with the collector paused: a 128k file's ~300k merges made it walk the
    # trainer's live objects again and again (1-1.4 s, 0.4-0.6 s paused, on a loaded 2-core box)
    collecting = gc.isenabled()
    gc.disable()
    try:
        vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):  # absent, or no tokenizer: shipped as it is
        return
    finally:
        if collecting:
            gc.enable()
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        return  # a Unigram's list (an id is a position), or a vocab tokenizers cannot load
    if shared := shared_ids(vocab):
        words = _shared_ids_words(shared)
        raise ExportError(
            f"{export}: {VOCAB} of {tokenizer_json}: {words}; {_vocab_fix(tokenizer_json, dataset)}"
        )


def _shared_ids_words(shared: list[tuple[int, list[str]]]) -> str:
    """The problem of tokenizer.json's ids that name several tokens (shared_ids), in words."""
    return (
        f"{shared_ids_said(shared)}: "
        "tokenizers decodes such an id as either token, another at each load of the same file, so the "
        "answers gristmill's eval generates are no one text"
    )


def _pipeline(tokenizer: Any) -> dict[str, bytes | None]:
    """The ENCODING_SECTIONS of a tokenizers.Tokenizer as tokenizers serializes them: compared as bytes,
    a 128k vocabulary's model costs a serialization (~0.1 s), no Python loop over it."""
    parts = {section: getattr(tokenizer, section) for section in ENCODING_SECTIONS}
    return {section: None if part is None else part.__getstate__() for section, part in parts.items()}


def _section_difference(section: str, loaded: Any, ours: Any) -> str:
    """`section` of the loaded backend against tokenizer.json's, in words (its types, or the model's
    settings that differ: vocab, merges, continuing_subword_prefix, …)."""
    if section == "model" and isinstance(loaded, dict) and isinstance(ours, dict):
        keys = sorted(k for k in loaded.keys() | ours.keys() if loaded.get(k) != ours.get(k))
        return f"builds another model than {TOKENIZER_JSON}'s ({', '.join(keys)} differ)"

    def kind(part: Any) -> str:
        if not isinstance(part, dict):
            return "none"
        inner = part.get("pretokenizers") or part.get("normalizers") or part.get("decoders")
        if isinstance(inner, list):
            return f"{part.get('type')}[{', '.join(kind(p) for p in inner)}]"
        return str(part.get("type"))

    theirs, mine = kind(loaded), kind(ours)
    if theirs == mine:
        theirs = f"{theirs} with other settings"
    return f"builds the {section} {theirs} where {TOKENIZER_JSON} has {mine}"


def _added_token_problems(tok: Any, data: Any, vocab_size: int) -> Iterator[Problem]:
    """The added and special tokens AutoTokenizer (`tok`) treats otherwise than tokenizer.json
    (`data`), judged by what its encoding and decoding do, not by the flags it reports (transformers 5
    reports '<|begin_of_text|>' ordinary where its backend still takes it as special: review RV32l F2).
    An added token gristmill eval matches (not special) on one side only, or with other flags, is
    matched inside every word holding its content: eval's ids differ wherever one does (review RV31L
    F1). A token dropped from decoded answers on one side only (skip_special_tokens) changes the
    answers eval generates, below the model's vocabulary (ids past it are never generated). Flags of a
    token special on both sides change its users' tok(text) only."""
    want, got = data.get_added_tokens_decoder(), tok.backend_tokenizer.get_added_tokens_decoder()
    for i in sorted(want.keys() | got.keys()):
        ours, theirs = want.get(i), got.get(i)
        same = ours is not None and theirs is not None
        same = same and all(getattr(ours, f) == getattr(theirs, f) for f in _ADDED_TOKEN_FLAGS)
        matched = ours is not None and not ours.special
        scored = matched != (theirs is not None and _matched_by_eval(tok, theirs, i)) or (
            matched and not same
        )
        if same and not scored:
            continue
        token = (theirs or ours).content
        if ours is None:
            what = f"adds {token!r} (id {i}), no added token of {TOKENIZER_JSON}"
        elif theirs is None:
            what = f"lacks {token!r} (id {i}), an added token of {TOKENIZER_JSON}"
        elif flag := next(
            (f for f in (*_ADDED_TOKEN_FLAGS, "special") if getattr(ours, f) != getattr(theirs, f)), None
        ):
            what = f"has {flag} {getattr(theirs, flag)} for {token!r} (id {i}), {TOKENIZER_JSON} "
            what += str(getattr(ours, flag))
        else:  # every flag as recorded, yet eval's encoding does not give its id (a bare next() raised)
            what = f"does not encode {token!r} as its id {i}, as {TOKENIZER_JSON} does"
        yield Problem(f"{what}: {_SPLIT if scored else _differ_words(not same, False)}", token, scored)
    for i in sorted((want.keys() | got.keys() | set(tok.all_special_ids)) - {None}):
        if i >= vocab_size:
            continue
        dropped = tok.decode([i], skip_special_tokens=True) == ""
        if dropped == (data.decode([i], skip_special_tokens=True) == ""):
            continue
        token = tok.convert_ids_to_tokens(i)
        if dropped:
            what = f"makes {token!r} (id {i}) a special token, not one of {TOKENIZER_JSON}: {_DROPPED}"
        else:
            what = (
                f"takes {token!r} (id {i}) for an ordinary token, a special one of {TOKENIZER_JSON}: {_KEPT}"
            )
        yield Problem(what, token, True)


def _matched_by_eval(tok: Any, token: Any, i: int) -> bool:
    """Whether gristmill eval's encoding (split_special_tokens=True, as validation/eval_model.py
    tok_encode) matches added token `token` (id `i`) as itself: an ordinary added token, matched
    inside words too. As it acts: a token it splits as text is not matched, whatever its flag says;
    where its text encodes as that id anyway, its flag decides."""
    ids = tok(token.content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids == [i] and not token.special


# Keys transformers builds a loaded tokenizer's pipeline from (tokenizer.json's path, a rebuilt
# pre-tokenizer's or normalizer's settings): the likeliest single cause of another pipeline, tried
# first, each a load of the files (~1-3 s for a 128k vocab). transformers writes tokenizer_config.json
# sorted, so a stale tokenizer_file came 8th of 11 keys and a bound of six edits left it untried
# (review RV34c G1): every key is tried alone; only the edits of several keys together are bounded.
_BUILD_KEYS = (
    "tokenizer_file",
    "add_prefix_space",
    "trim_offsets",
    "legacy",
    "from_slow",
    "do_lower_case",
    "strip_accents",
    "tokenize_chinese_chars",
    "add_bos_token",
    "add_eos_token",
)


def _naming(out_dir: Path, token: str | None, passes: Callable[[Path], bool]) -> list[tuple[str, str]]:
    """The (key, file name) pairs of an export's tokenizer_config.json / special_tokens_map.json whose
    one edit (_edits: left out, or a SET_ENTRIES key set to its value) makes the files pass (`passes`:
    a reload per edit tried, on the refusing path only): a key of those that name `token`
    (added_tokens_decoder first, the key that carries a token's flags: a flag's difference named
    bos_token, whose removal changed nothing, review RV31L F3), else every one of them together (two
    keys each adding it: leaving out the one named was refused again by the other, review RV33c F6);
    then (or with no token) any one key: SET_ENTRIES first (an older export's base class is the usual
    cause of another pipeline, review RV32l F3), then the SET_ENTRIES keys together (two causes,
    review RV33c F3), then _BUILD_KEYS, then the rest in file order. Every key is tried alone (a line
    that names none says no one key causes it: review RV34c G1); of several together, only those two
    edits. A lone key that names `token` is named without a reload; where no edit passes, none ([]).
    Not the first key that names it: added_tokens_decoder holds every added token, and leaving it out
    of a pad problem's files was refused again, by pad_token (review RV32f A2)."""

    def holds(value: Any) -> bool:  # a string, an AddedToken dict, a list or dict of them
        if isinstance(value, dict | list):
            return any(holds(v) for v in (value.values() if isinstance(value, dict) else value))
        return value == token

    specs = {}
    for name in TOKENIZER_FILES[1:]:
        path = out_dir / name
        specs[name] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def settled(key: str, name: str) -> bool:  # a SET_ENTRIES key already at its value: no edit
        value, absent = SET_ENTRIES.get(key, (None, None))
        return key in SET_ENTRIES and name == TOKENIZER_CONFIG and specs[name].get(key, absent) == value

    def rank(key: str) -> int:  # SET_ENTRIES, then _BUILD_KEYS, then the rest (sort keeps file order)
        if key in SET_ENTRIES:
            return 0
        return 1 + (_BUILD_KEYS.index(key) if key in _BUILD_KEYS else len(_BUILD_KEYS))

    holding = [
        (key, name)
        for name, spec in specs.items()
        for key in sorted(spec, key=lambda k: k != "added_tokens_decoder")
        if token is not None and holds(spec[key]) and not settled(key, name)
    ]
    every = [  # a SET_ENTRIES key tokenizer_config.json leaves to transformers' default is one too
        (key, name)
        for name, spec in specs.items()
        for key in [*spec, *(k for k in SET_ENTRIES if k not in spec and name == TOKENIZER_CONFIG)]
        if not settled(key, name)
    ]
    every.sort(key=lambda pair: rank(pair[0]))
    if len(holding) == 1:  # named whether or not its edit passes: no reload
        return holding
    set_keys = [(key, name) for key, name in every if key in SET_ENTRIES and name == TOKENIZER_CONFIG]
    trials = [[pair] for pair in holding] + ([holding] if holding else [])
    # an older export's base class and clean_up true are two causes, set together (RV33c F3)
    trials += [[pair] for pair in set_keys] + ([set_keys] if len(set_keys) > 1 else [])
    trials += [[pair] for pair in every if pair not in set_keys and pair not in holding]
    with tempfile.TemporaryDirectory(prefix="gristmill-tokenizer-") as tmp:
        for trial in trials:
            edited = {name: dict(specs[name]) for name in dict.fromkeys(name for _, name in trial)}
            for key, name in trial:
                edited[name].pop(key, None)
                if key in SET_ENTRIES and name == TOKENIZER_CONFIG:
                    edited[name][key] = SET_ENTRIES[key][0]
            folder = Path(tmp) / str(len(os.listdir(tmp)))
            folder.mkdir()
            for file in out_dir.iterdir():  # linked, not copied: an export's weights are gigabytes
                if file.name not in edited:
                    (folder / file.name).symlink_to(file.resolve())
            for name, spec in edited.items():
                (folder / name).write_text(json.dumps(spec), encoding="utf-8")
            if passes(folder):
                return trial
    return []


def check_run_tokenizer(
    run_dir: Path,
    dataset_dir: Callable[[], Path],
    model_cfg: ModelConfig,
    base_dir: Path | None = None,
    source_run: Path | None = None,
) -> None:
    """Rank 0, at every start of a run, a resume's too, before step 1 and before the start writes
    anything into the run (training/run/setup.py: a refused resume left RUN/config.toml rewritten,
    review RV29e F6): the tokenizer files an export of the run would write, written to a temporary
    folder and checked (check_export_tokenizer), naming the file the run's exports read: the base's own
    (`base_dir`) for a new run, else RUN/base/ of `source_run`, the run whose checkpoint it resumes
    (another directory's is carried over this one's: naming this run's copy, an edit of it was undone
    at the next start: RV29e F7). Refused at an export, they stopped the run at its first
    export_interval, lost the steps an async checkpoint had trained since, and stopped every resume
    again (review RV29a F1); an export inside the run writes the same bytes, which pass the same way
    (in this process, from the memo). Without tokenizer files of a base's own, their tokenizer.json
    alone is checked, for an id given to several tokens (_check_shipped_vocab). `dataset_dir`: called
    only where a check is due (a bucket dataset's tokenizer is fetched: RV29e F5)."""
    if base_dir is not None:
        base = kept_base_files(base_dir)  # what record_base keeps of it for the run's exports
    else:
        base = base_files(source_run) if source_run is not None else {}
    export = f"{run_dir}'s exports"
    if GENERATION_CONFIG in base:  # shipped by every export: a JSON error there stopped the run at its
        _generation_config(base[GENERATION_CONFIG])  # first export, and every resume (trial RV63b 5)
    if not _brings_tokenizer_files(base):  # their tokenizer.json alone, the base's or the dataset's
        if TOKENIZER_JSON in base:
            _check_shipped_vocab(base[TOKENIZER_JSON], export)
        else:
            dataset = dataset_dir()
            _check_shipped_vocab(dataset / TOKENIZER_JSON, export, dataset)
        return
    with tempfile.TemporaryDirectory(prefix="gristmill-tokenizer-") as tmp:
        write_tokenizer(dataset_dir(), model_cfg, tmp, base, export=export)


def _generation_config(path: Path) -> dict[str, Any]:
    """The base's generation_config.json, which every export ships (with the run's bos/eos ids), as
    a JSON object; one that is not is an ExportError naming it."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(kept, dict):
            raise ValueError(f"a JSON {type(kept).__name__}, not an object")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        raise ExportError(
            f"{path} is not a generation config ({why}), and every export of the run ships it: fix the "
            "base's file (or remove it: exports then write their own from config.json's ids) and start "
            "the run again"
        ) from None
    return kept


def _token_ids(base: dict[str, Path]) -> dict[str, Any]:
    """bos/eos/pad token ids of the base's config.json, as its users expect them in an export: those
    that are special tokens of the tokenizer.json it brought (split_token_ids, the one rule: an
    ordinary token, or no id, is no bos or eos; the export's are then the separator's, without pad;
    a list keeps its special members). None for a
    base without a tokenizer.json of its own (own_tokenizer_files): the run's tokenizer is the
    dataset's, and the base's ids name tokens of one it did not bring (LlamaConfig's eos 2 was "!" in
    the dataset's; Gemma's order made eos a bos: review R22f S3, R23e S3), so the export's are the
    separator's, as a run from scratch's."""
    if CONFIG_JSON not in base or TOKENIZER_JSON not in base:
        return {}
    config = base_json(base[CONFIG_JSON])
    return split_token_ids(config, special_tokens(added_tokens(base[TOKENIZER_JSON])))[0]


def _generation_ids(kept: dict[str, Any], config: dict[str, Any], base: dict[str, Path]) -> dict[str, Any]:
    """The bos/eos/pad ids of an export's generation_config.json (the base's, `kept`): by the one rule
    config.json's ids follow (split_token_ids), its own special ones as they are, a list kept whole
    (Llama-3-Instruct's eos [128001, 128009] beside config.json's 128009: generate() stopped at one
    of the two: trial RV66a F2); else the export's `config` id (the separator where the base's was
    an ordinary token)."""
    own = {}
    if TOKENIZER_JSON in base:  # of ids only: a token's text there ("</s>") is no id (review RV66g 6)
        ids = {k: v for k, v in kept.items() if k in TOKEN_ID_KEYS and _holds_ids(v)}
        own = split_token_ids(ids, special_tokens(added_tokens(base[TOKENIZER_JSON])))[0]
    return {k: own.get(k, config.get(k)) for k in TOKEN_ID_KEYS if k in kept}


def _holds_ids(value: Any) -> bool:
    """Whether a generation config's token value is an id, or a list of ids (or null)."""
    members = value if isinstance(value, list) else [value]
    return all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in members)


def own_tokenizer_files(base: dict[str, Path]) -> dict[str, Path]:
    """The base's files (base_record.base_files) with its tokenizer files only when it brought its
    tokenizer.json: a tokenizer_config.json alone (a sentencepiece base's) names tokens of a tokenizer
    it did not bring, and an export that copied it gave AutoTokenizer an eos past the model's
    vocabulary (review R23e S4)."""
    if TOKENIZER_JSON in base:
        return base
    # its chat templates name that tokenizer's tokens too (review RV66g 2)
    dropped = {*TOKENIZER_FILES, *chat_templates(base)}
    return {name: path for name, path in base.items() if name not in dropped}


def unkept_base_note(run_dir: str | Path) -> str | None:
    """A note where the run's base holds chat templates its exports would ship that RUN/base/ does not
    keep: a run started before gristmill kept them (chat_template.jinja and the named ones, before
    2026-12-06) exported an instruct base's weights without them, unsaid (trial RV66f F3). Its
    templates alone: the other kept files every export writes itself (review RV67d 3). A directory
    base's files; a hub base's as the hub cache's listing of its commit names them (no request). None
    where that cannot be read: nothing an export needs (review RV67d 7)."""
    record = read_base_record(run_dir)
    if record is None:
        return None
    identity = str(record["init_from"])
    kept = {name: Path(run_dir) / BASE_DIR / name for name in record["files"]}
    hub = hub_id(identity)
    hub = hub if hub is not None and hub[1] else None  # pinned to its commit
    try:
        held = dict.fromkeys(listed_templates(*hub)) if hub else kept_base_files(Path(identity).expanduser())
    except (OSError, GristmillError):
        return None
    # as an export ships them: only with the base's own tokenizer.json (own_tokenizer_files)
    unkept = [n for n in chat_templates(own_tokenizer_files(held | kept)) if n not in kept]
    if not unkept:
        return None
    them = "it" if len(unkept) == 1 else "them"
    where, since, fetch = identity, "added since the run started, or ", ""
    if hub:
        where, since = f"the hub repository {identity}", ""
        fetch = f"`hf download {hub[0]} {' '.join(unkept)} --revision {hub[1]}` fetches {them}; "
    return (
        f"note: {where} holds {', '.join(unkept)}, which {Path(run_dir) / BASE_DIR} does not keep "
        f"({since}the run started before gristmill kept {them}): the run's exports ship none; "
        f"{fetch}put what is still the base's in a copy of an export "
        "(`gristmill export RUN --step N --out DIR`: an export of the run holds only what it lists)"
    )


def export_hf(
    state_dict: Mapping[str, torch.Tensor],
    model_cfg: ModelConfig,
    dataset_dir: str | Path,
    out_dir: str | Path,
    *,
    meta: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    base: dict[str, Path] | None = None,
) -> Path:
    """Write the HF directory for `state_dict` (full, unsharded, gristmill names) to `out_dir`;
    `base`: the files of a run's base model (base_record.base_files), whose tokenizer files and
    special token ids the export keeps.

    Everything goes into a temporary sibling directory that is renamed at the end, so an export
    under its final name is always whole. Exports are permanent: an `out_dir` that exists by then is
    an error, unless it holds the very files written here (another process, eval --watch or the
    trainer, exported the same weights meanwhile; callers return an existing export before any work).
    """
    out_dir, dataset_dir = Path(out_dir), Path(dataset_dir)
    info = read_dataset_info(dataset_dir)
    names = hf_state_dict_names(model_cfg)
    missing = sorted(set(names) - set(state_dict))
    if missing:
        raise ExportError(f"the state dict lacks {len(missing)} model tensors, e.g. {missing[:3]}")
    tensors = {hf: state_dict[ours].to(dtype) for ours, hf in names.items()}

    tmp, written = out_dir.parent / f".{out_dir.name}.tmp-{host()}-{os.getpid()}", None
    lock = tmp.with_name(f"{tmp.name}.lock")
    _remove_dead_writes(out_dir)
    with contextlib.ExitStack() as held:  # the lock while the export is written (_remove_dead_writes)
        try:
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(file_lock(lock))
            held.callback(lock.unlink, missing_ok=True)  # (before the release: LIFO)
            tmp.mkdir(parents=True)
        except OSError as e:  # a read-only or full run directory: one line, not a traceback
            raise unwritable(out_dir.parent, e) from None
        try:
            write_safetensors(tensors, tmp / "model.safetensors", {"format": "pt"})
            base = base or {}
            config = hf_config(model_cfg, int(info["separator"]["id"]), dtype) | _token_ids(base)
            files: dict[str, Any] = {
                CONFIG_JSON: config,
                GENERATION_CONFIG: {
                    "bos_token_id": config["bos_token_id"],
                    "eos_token_id": config["eos_token_id"],
                },
                EXPORT_META: {
                    "format": EXPORT_FORMAT,
                    **(meta or {}),
                    "dataset": str(dataset_dir.resolve()),
                    "dataset_fingerprint": info["fingerprint"],
                    "separator": info["separator"],
                    "model_config": dataclasses.asdict(model_cfg),
                    # the transformers installed where it was written (None: none), whose AutoTokenizer
                    # checked its tokenizer files where a base brought its own (_brings_tokenizer_files);
                    # an eval under another names it (rescoring_fix)
                    "transformers": _installed("transformers"),
                },
            }
            for name, content in files.items():
                (tmp / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
            if GENERATION_CONFIG in base:  # the base's, its ids by config.json's rule (_generation_ids)
                kept = _generation_config(base[GENERATION_CONFIG])
                ids = _generation_ids(kept, config, base)
                if all(kept[k] == v for k, v in ids.items()):
                    shutil.copyfile(base[GENERATION_CONFIG], tmp / GENERATION_CONFIG)
                else:
                    text = json.dumps(kept | ids, indent=2) + "\n"
                    (tmp / GENERATION_CONFIG).write_text(text, encoding="utf-8")
            write_tokenizer(dataset_dir, model_cfg, tmp, base, export=out_dir)
            # the chat templates of the tokenizer it ships, as the base's users load them
            for template in chat_templates(own_tokenizer_files(base)):
                (tmp / template).parent.mkdir(exist_ok=True)
                shutil.copyfile(base[template], tmp / template)
            files = [str(p.relative_to(tmp)) for p in sorted(tmp.rglob("*")) if p.is_file()]
            checksums = {"algorithm": "sha256", "files": file_records(tmp, files, "sha256")}
            (tmp / EXPORT_CHECKSUMS).write_text(json.dumps(checksums, indent=2) + "\n", encoding="utf-8")
            written = checksums["files"]
            if out_dir.exists():  # os.replace would take an empty directory's place
                raise FileExistsError(errno.EEXIST, "exists", str(out_dir))
            os.replace(tmp, out_dir)
        except BaseException as e:
            same = isinstance(e, OSError) and out_dir.is_dir() and _holds(out_dir, tmp if written else None)
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError) and out_dir.is_dir():
                if same:
                    return out_dir  # another process (eval --watch, the trainer) exported the same model
                if written is not None:
                    raise ExportError(
                        f"{out_dir} already exists with other contents; exports are permanent, remove it "
                        "by hand to redo it"
                    ) from None
            if isinstance(e, OSError):
                raise unwritable(out_dir.parent, e) from None
            raise
    return out_dir


def _installed(dist: str) -> str | None:
    """`dist`'s installed version, None where it is not installed (not imported: transformers takes
    ~1.5 s to import)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _holds(path: Path, ours: Path | None) -> bool:
    """`path` is a whole export (its files match its checksums) of what export `ours` holds (None:
    anything), one another process wrote meanwhile: the same files, and the same record in
    gristmill_export.json but for where it was read from (a dataset or checkpoint path seen from
    another working directory or cache)."""

    def record(export: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        files = json.loads((export / EXPORT_CHECKSUMS).read_text(encoding="utf-8"))["files"]
        meta = json.loads((export / EXPORT_META).read_text(encoding="utf-8"))
        paths = ("dataset", "checkpoint", "copied_from", "transformers")  # and the exporting version
        return {k: v for k, v in files.items() if k != EXPORT_META}, {
            k: meta.get(k) for k in meta if k not in paths
        }

    try:
        if verify_export(path) is not None:  # no checksums: nothing to compare
            return False
        return ours is None or record(path) == record(ours)
    except (ExportError, OSError, ValueError, KeyError, TypeError):
        return False


def export_separator_id(export: str | Path) -> int | None:
    """The separator id the model was trained with, as an export records it (gristmill_export.json):
    the one token eval frames each document with, whatever the tokenizer's bos is. None for a
    directory gristmill did not export."""
    try:
        return int(json.loads((Path(export) / EXPORT_META).read_text(encoding="utf-8"))["separator"]["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


TRANSFORMERS_READS = (".json", ".jinja", ".safetensors", ".bin", ".model", ".txt", ".py", ".tiktoken", ".pth")
"""What of a model folder transformers' loaders read (configs, tokenizers, templates, weights, remote
code): an export holding one its checksums do not list is refused."""


def verify_export(path: str | Path, step: int | None = None, merged: bool = False) -> str | None:
    """Check an export's files against gristmill_checksums.json before its weights are trusted, and,
    given the `step` (and `merged`) a run's export directory is named for, that its
    gristmill_export.json says it holds those weights: a copy of another step's export under this
    name checks out file by file (review R17b S3). Raises ExportError naming the damaged file or
    the step it holds; returns a note for an export written before checksums were recorded (nothing
    to check), else None."""
    path = Path(path)
    if step is not None:
        _check_export_step(path, step, merged)
    record = path / EXPORT_CHECKSUMS
    if not record.is_file():
        if not (path / "model.safetensors").is_file():
            raise ExportError(
                f"{path} is not an export: no model.safetensors (a partial copy?); "
                f"{export_fix(path, 'its model.safetensors')}"
            )
        if exported_with_checksums(path):  # deleted: its weights would be scored unchecked (R17b M5)
            raise ExportError(
                f"{path} has no {EXPORT_CHECKSUMS}, which it was exported with; {export_fix(path, 'it')}"
            )
        if since := _recorded_since(path):
            raise ExportError(
                f"{path} has neither {EXPORT_CHECKSUMS} nor {EXPORT_META}, which every export of a step the "
                f"run saved {since} is written with; {export_fix(path, 'them')}"
            )
        return f"note: {path} has no {EXPORT_CHECKSUMS} (exported before gristmill recorded checksums)"
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(
            f"{record} is damaged ({type(e).__name__}: {e}); {export_fix(path, record.name)}"
        ) from None
    problems = damaged_files(path, files)
    if problems:
        raise ExportError(f"export {path} is damaged: {'; '.join(problems)}; {export_fix(path, 'the file')}")
    # a file added since it was written, of a kind transformers reads as the export's (an
    # added_tokens.json gave AutoTokenizer a token past the vocabulary, and verify said ok: trial RV67a
    # F8); not a model card, nor what tools leave in hidden folders (hf upload-large-folder's .cache/:
    # review RV67e 4)
    rels = [p.relative_to(path) for p in path.rglob("*") if not p.is_dir()]
    held = {
        str(rel)
        for rel in rels
        if not any(part.startswith(".") for part in rel.parts) and rel.name.endswith(TRANSFORMERS_READS)
    }
    if added := sorted(held - set(files) - {EXPORT_CHECKSUMS}):
        raise ExportError(
            f"export {path} holds {', '.join(added[:3])}{' …' if len(added) > 3 else ''}, which its "
            f"{EXPORT_CHECKSUMS} does not list (added since it was written; transformers reads what an "
            "export holds): remove it; files of your own go in a copy (`gristmill export RUN --step N --out "
            "DIR`)"
        )
    return None


def _remove_dead_writes(out_dir: Path) -> None:
    """The temporary folders of exports to `out_dir` that killed writers left: a resume wrote the
    export again and left them, a 1.24B model's ~5 GB each (trial RV61b F2). Each writer holds the
    lock file beside its folder (TMP.lock) while it writes: one that can be taken is a dead writer's,
    on any host and in any process namespace (a pid is not: a container restarted has another
    namespace, and its leftover stayed, review RV61f F3). A folder without one (an older gristmill's)
    is left."""
    for lock in out_dir.parent.glob(f"{glob.escape(f'.{out_dir.name}.tmp-')}*.lock"):
        with contextlib.suppress(LockHeld, OSError), file_lock(lock, block=False):
            shutil.rmtree(lock.with_name(lock.name.removesuffix(".lock")), ignore_errors=True)
            lock.unlink(missing_ok=True)


def _recorded_since(path: Path) -> str | None:
    """Where `path` is a run's export (RUN/exports/step-N, merged-step-N) of a step past the one its
    RUN/checkpoints.jsonl began at with a run id (2026-12-06, after exports gained their checksums
    and record): since when (words), else None. An export of another step copied in with those two
    files removed was taken for one written before them, then exported, verified and scored as the
    step's, exit 0 (trial RV61d F1)."""
    if path.parent.name != EXPORTS_DIR or (of := export_step_of(path)) is None:
        return None
    run, step, _ = of
    ledger = read_ledger(run)
    if ledger.run is None or ledger.began is None or step <= ledger.began:
        return None
    return f"after step {ledger.began} ({run / CHECKPOINTS_JSONL} records it)"


def _in_the_runs_steps(run_dir: Path, out: Path, step: int, merged: bool, dtype: torch.dtype) -> bool:
    """Whether --out `out` lies in the run's checkpoints/, or names a step's export in its exports/
    (step-N, merged-step-N, abandoned-…) other than step `step`'s own."""
    out = out.resolve()
    if out.is_relative_to((run_dir / CHECKPOINTS_DIR).resolve()):
        return True
    exports = (run_dir / EXPORTS_DIR).resolve()
    if not out.is_relative_to(exports) or out == exports:
        return False
    parts = out.relative_to(exports).parts
    if parts[0] == export_dir(run_dir, step, merged).name:  # that name alone, fp32 (R22i S4, R22j S2)
        return len(parts) > 1 or dtype != torch.float32
    return names_a_step(parts[0])


def _check_export_step(path: Path, step: int, merged: bool) -> None:
    try:
        meta = json.loads((path / EXPORT_META).read_text(encoding="utf-8"))
        held, held_merged = int(meta["step"]), bool(meta.get("merged"))
    except (OSError, ValueError, KeyError, TypeError):
        return  # an export from before the record, or its damage, which the checksums name
    if (held, held_merged) != (step, merged):
        what = "the merged weights" if held_merged else "the weights"
        raise ExportError(
            f"{path} holds {what} of step {held} (its {EXPORT_META}), not the {'merged ' if merged else ''}"
            f"weights of step {step} its name says: a copy under another step's name; "
            f"{export_fix(path, 'the export')}"
        )
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        dtype = config.get("dtype", config.get("torch_dtype"))  # an older writer's spelling too
    except (OSError, ValueError, AttributeError):
        return  # the checksums name a damaged config.json
    if dtype not in (None, "float32"):  # the run's exports are fp32: a --dtype copy passed as one (RV63b 4)
        raise ExportError(
            f"{path} holds {dtype} weights (its config.json), not the float32 of the run's exports: a "
            f"`gristmill export --dtype` copy under the run's name; {export_fix(path, 'the export')}"
        )


def rescoring_fix(export: Path, version: str, base_edit: str | None = None) -> str:
    """What to do with export `export` whose tokenizer files transformers `version` reads otherwise than
    its tokenizer.json: written again where its weights are elsewhere (export_again), after
    `base_edit` of RUN/base's file where the new export would read the same entry; else kept (its
    weights are only there) and copied from itself with tokenizer files written as an export writes
    them now (`gristmill export --out` from the export, whose checkpoint is gone), the copy taking its
    place: an older export of a base's tokenizer_class was otherwise never scored again (review RV32f
    A5). A transformers it was exported with, other than `version`, is named where
    gristmill_export.json records one; never one it was exported without (review RV32l F3)."""
    try:
        meta = json.loads((export / EXPORT_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    wrote = meta.get("transformers") if isinstance(meta, dict) else None
    other = f"transformers {wrote}, which it was exported with" if wrote and wrote != version else None
    again = export_again(export)
    if again is not None:
        fix = again[0] if base_edit is None else f"{base_edit}, then {again[0]}"
    else:
        fix = f"keep {export} (its checkpoint is gone or damaged: its weights are only there)"
        if (of := export_step_of(export)) is not None:
            run, step, merged = of
            copy = export.with_name(f"{export.name}.retokenized")
            ckpt = checkpoint_dir(run, step)
            steps = [] if base_edit is None else [base_edit]
            # complete but damaged: the copy would read it
            aside = ckpt if incomplete_reason(ckpt) is None else None
            if aside is not None:
                steps.append(f"move the damaged {ckpt} aside")
            steps.append(
                f"copy it with its tokenizer files written again ({export_command(run, step, merged, copy)}, "
                f"which needs {_copy_needs(run, aside)} at hand)"
            )
            fix += f"; {', then '.join(steps)}, then move {export} aside and {copy} into its place"
    return fix if other is None else f"{fix}; or score it under {other}"


def _copy_needs(run: Path, aside: Path | None = None) -> str:
    """What a copy of run `run`'s export (`gristmill export --out`, run_model_config) reads besides the
    export, in words: the run's dataset, and its base where no checkpoint of the run records the
    base's shape (a run whose checkpoints were cleared: the copy stopped at a base moved away, review
    RV33c F7), once the damaged checkpoint `aside` is moved aside (the advice's first step: where it
    was the only one, its record was counted and the base not named, review RV34c G6)."""
    try:
        init_from = run_config(run).model.init_from
    except (GristmillError, OSError, ValueError):
        init_from = None
    kept = [checkpoint_dir(run, step) for step in complete_steps(run)]
    if init_from and not any(resume_model_record(run, str(ckpt)) for ckpt in kept if ckpt != aside):
        left = "with no checkpoint of the run left"
        return f"the run's dataset and, {left}, its base (model.init_from = {init_from!r})"
    return "the run's dataset"


def newest_complete_step(run_dir: str | Path) -> int | None:
    """The newest step whose checkpoint is complete and verifies, or None."""
    path, _, _ = newest_verified(run_dir)
    return None if path is None else step_of(path)


def run_config(run_dir: str | Path):
    """The resolved TrainConfig a run saved in RUN/config.toml (an error naming it if missing)."""
    require_run(run_dir)
    return load_config(TrainConfig, Path(run_dir) / CONFIG_TOML)


def require_run(run_dir: str | Path) -> None:
    """ExportError unless `run_dir` is a training run (a dataset's config.toml is its build recipe:
    R21b F8), naming what it is."""
    if not is_training_run(run_dir):
        raise ExportError(f"{unlike_a_run(run_dir)}: {run_dir} is not a gristmill training run directory")


def export_of_run(
    run_dir: str | Path, model: torch.nn.Module, mcfg: ModelConfig, dataset: Path, out: Path,
    meta: dict[str, Any], dtype: torch.dtype,
) -> Path:  # fmt: skip
    """export_hf of a run's weights: its record names the data trained on, the base's files come along."""
    meta = meta | trained_on(run_dir, meta["step"])
    return export_hf(model.state_dict(), mcfg, dataset, out, meta=meta, dtype=dtype, base=base_files(run_dir))


def trained_on(run_dir: str | Path, step: int) -> dict[str, Any]:
    """{"trained_on": [{name, fingerprint}, …]}: the sources step `step`'s weights were trained on (a
    weight above 0 in a phase begun by then), from RUN/data_plan.json, beside the export's "dataset",
    whose tokenizer and separator it ships (a dataset rebuilt with the run's tokenizer passes that
    check: an export from another directory recorded it alone, as if trained on: review R16g 1a); {}
    for step 0 (a base's own weights: nothing of the run applied, R16i F1) and a run without a plan."""
    plan = recorded_plan(Path(run_dir)) if step > 0 else None
    if not plan:
        return {}
    skipped = sorted((s["first_step"], s["last_step"]) for s in plan.get("skips") or [])
    used, start = set(), 1
    for phase in plan.get("phases") or [{"weights": [1] * len(plan["sources"]), "steps": None}]:
        if start > step:
            break
        end = min(step, start + phase["steps"] - 1 if phase.get("steps") else step)  # open-ended: past any
        if _trains_between(start, end, skipped):  # a phase a rewind skipped whole trained nothing (R16j F3)
            used |= {i for i, w in enumerate(phase["weights"]) if w > 0}
        start = end + 1 if not phase.get("steps") else start + phase["steps"]
    sources = [
        {"name": s["name"], "fingerprint": s["fingerprint"]}
        for i, s in enumerate(plan["sources"])
        if i in used
    ]
    return {"trained_on": sources}


def _trains_between(first: int, last: int, skipped: list[tuple[int, int]]) -> bool:
    """Whether some step of first..last lies outside every skipped range (sorted (first, last))."""
    at = first
    for lo, hi in skipped:
        if lo > at:
            break
        at = max(at, hi + 1)
    return at <= last


def run_tokenizer_dataset(run_dir: str | Path, spec: RunSpec) -> tuple[Path, dict[str, Any]]:
    """The dataset directory whose tokenizer the run trained with, and its dataset.json: the first
    source's (every source of a mixture shares one tokenizer, checked when the run started), refused
    when its tokenizer is not the one the run recorded (RUN/config.toml names the dataset as given: a
    relative path leads elsewhere from another working directory, and an export would ship another
    tokenizer); a dataset rebuilt with the run's tokenizer is the same to an export."""
    src = spec.sources[0]
    dataset = tokenizer_dir(src.dataset, spec.cache)  # a bucket's: its copy, tokenizer fetched
    info = read_dataset_info(dataset)  # names the missing dataset.json and how to fix it
    try:
        check_trained_on(
            Path(run_dir), src.name, src.dataset, info, "the export would ship another tokenizer than the "
            "model was trained with: point the source's dataset at one built with the run's tokenizer",
            tokenizer_only=True,
        )  # fmt: skip
    except GristmillError as e:
        raise ExportError(str(e)) from None
    return dataset, info


def run_model_config(run_dir: str | Path):
    """(TrainConfig, the dataset directory whose tokenizer it trained with, ModelConfig) of a run.
    A run from a base model (model.init_from) that has a checkpoint takes the base's shape from the
    checkpoint's record: its checkpoints never need the base again."""
    cfg = run_config(run_dir)
    spec = resolve(cfg)
    dataset, info = run_tokenizer_dataset(run_dir, spec)
    source = None
    if cfg.model.init_from:
        source = locate_base(cfg.model.init_from, resume_model_record(run_dir, "auto"), settable=False)
    return cfg, dataset, resolve_model_config(cfg.model, info, spec.seq_lens, source)


def checkpoint_model_config(
    run_dir: str | Path, ckpt: Path, config_mcfg: ModelConfig, log=None
) -> ModelConfig:
    """The model checkpoint `ckpt` holds: the ModelConfig recorded in its COMPLETE (a note through
    `log` where RUN/config.toml now says otherwise), or RUN/config.toml's `config_mcfg` for a
    checkpoint written before gristmill recorded it."""
    recorded = recorded_model(read_complete_record(ckpt))
    if recorded is None:
        return config_mcfg
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    try:
        mcfg = dataclasses.replace(config_mcfg, **{k: v for k, v in recorded.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ExportError(f"{ckpt}/COMPLETE holds an unusable model record ({e})") from None
    diffs = model_differences(dataclasses.asdict(mcfg), dataclasses.asdict(config_mcfg))
    if diffs and log is not None:
        config = Path(run_dir) / CONFIG_TOML
        log(
            f"note: {ckpt.name} was saved with another model than {config} describes "
            f"({describe_differences(diffs, 'in the checkpoint', 'in config.toml')}); exporting the "
            "checkpoint's own model"
        )
    return mcfg


def load_checkpoint_model(
    run_dir: str | Path, step: int, *, verified: bool = False, log=None
) -> tuple[Transformer, ModelConfig, Path]:
    """The model of checkpoint `step` on CPU (one process, fp32) with its weights, its config (the
    one recorded in the checkpoint; RUN/config.toml's for older checkpoints), and the run's dataset
    directory. The checkpoint's files are verified against COMPLETE first (unless the caller just
    did: `verified`) and every weight must be finite after loading."""
    run_dir = Path(run_dir)
    ckpt = checkpoint_dir(run_dir, step)

    def missing(how: str = "") -> ExportError:
        have, why = complete_steps(run_dir), missing_step_reason(run_dir, step)
        return ExportError(
            f"{run_dir} has no complete checkpoint of step {step}{how}: {why}; "
            f"complete checkpoints: {', '.join(map(str, have)) or 'none'}"
        )

    if incomplete_reason(ckpt) is not None:
        raise missing()
    try:
        if not verified:
            try:
                verify_checkpoint(ckpt)
            except CheckpointError as e:
                raise ExportError(
                    f"{e}. Export another step (--step N; without --step: the newest that verifies), or "
                    "restore the damaged file from a copy"
                ) from None
        _, dataset, config_mcfg = run_model_config(run_dir)
        mcfg = checkpoint_model_config(run_dir, ckpt, config_mcfg, log)
        model = model_to_load(mcfg)
        # no_dist: the trainer's rank 0 exports alone while the other ranks train on.
        load_or_raise({"model": ModelState(model)}, ckpt, ExportError, "read the model from", no_dist=True)
    except (ExportError, CheckpointError):
        # A running trainer's retention deletes checkpoints (checkpoint.keep_last): one that went while it
        # was read is gone, not damaged.
        if incomplete_reason(ckpt) is not None:
            raise missing(" any more (deleted while it was read)") from None
        raise
    bad = nonfinite_tensor(model.state_dict().items())
    if bad is not None:
        raise ExportError(f"{ckpt} holds non-finite weights ({bad}); export an earlier step")
    return model, mcfg, dataset


def export_checkpoint(
    run_dir: str | Path,
    step: int | None = None,
    log=None,
    *,
    verified: bool = False,
    out: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    merged: bool = False,
) -> Path:
    """Export checkpoint `step` (None: the newest complete one that verifies, saying which and what
    newer ones were passed over through `log`) to RUN/exports/step-N; an export that already
    exists is verified and returned as is. `verified`: the caller has just checked the
    checkpoint's files (the trainer, which hashed them as it wrote them). `out`, `dtype`: a copy
    in another directory, e.g. bf16 to publish; RUN/exports/step-N stays the run's fp32 export (eval
    scores it), and where the checkpoint is gone the copy is made from that export. `merged`: the
    merged weights of [merge] that checkpoint `step` holds (training/merge.py), to
    RUN/exports/merged-step-N (None: the newest checkpoint that holds some)."""
    run_dir = Path(run_dir)
    kind = "merged-step-N" if merged else "step-N"
    if out is None and dtype != torch.float32:
        raise ExportError(
            f"{run_dir / EXPORTS_DIR}/{kind} are the run's fp32 exports (eval scores them): give --out DIR "
            f"for a {_dtype_name(dtype)} copy"
        )
    out = None if out is None else Path(out)
    if out is not None and out.exists():
        raise ExportError(f"{out} already exists; choose another --out or remove it")
    if out is not None and (there := file_in_the_way(out)) is not None:
        raise ExportError(f"--out {out} lies under {there}, a file: choose a folder")
    if out is not None and (inside := in_a_dataset(out)) is not None:  # its validation then failed
        raise ExportError(f"--out {out} {inside}, which does not record it: choose another folder")
    if out is not None and out.is_symlink():  # dangling: the export cannot take a link's place (RV63b 13)
        raise ExportError(
            f"--out {out} is a link to {os.readlink(out)}, which does not exist: remove the link, or choose "
            "another --out"
        )
    if step is not None and (step < 0 or (merged and step == 0)):
        raise ExportError(f"{run_dir}: {missing_step_reason(run_dir, step, merged=merged)}")
    if step is None:
        step, verified = _newest_to_export(run_dir, log, merged), True
    elif step != 0 and not merged and (why := untrained_reason(run_dir, step)):
        raise ExportError(why)  # exported as step N, an earlier step's weights (review R15g F2)
    if out is not None and _in_the_runs_steps(run_dir, out, step, merged, dtype):
        # under another step's name: verify called it damaged, eval refused it (review R22f U5); any
        # other name in exports/ is the user's (a bf16 copy: R22h M6); the step resolved first (R22i
        # M1), step 0 too (R22j S1); the step's own name takes its fp32 export alone (R22j S2)
        raise ExportError(
            f"--out {out} is where {run_dir} keeps its steps' fp32 exports or its checkpoints: choose "
            "another name"
        )
    if step == 0:
        return export_base(run_dir, log, out=out, dtype=dtype)
    # the plan's last step inside a rewind's skip: an earlier step's weights, said by the export's record
    # too (its gristmill_export.json said only "step": N: trial RV71d 2)
    final = None if merged else final_weights_note(run_dir, step)
    if log is not None and final is not None:
        log(final)
    noted = {} if final is None else {"note": final.removeprefix("note: ")}
    run_export = export_dir(run_dir, step, merged)
    ckpt = checkpoint_dir(run_dir, step)
    if run_export.is_dir():  # another step's export copied under this one's name: refused, never moved
        _check_export_step(run_export, step, merged)
    if run_export.is_dir() and of_another_checkpoint(run_export, ckpt):
        if _run_s_identity(ckpt) is None:  # nothing to export the run's from: said, left as it is
            raise ExportError(f"{run_export} was {not_the_run_s(run_dir, step, merged)}")
        # Exported from a step N a resume or a rewind set aside while the export ran (review R15c F2):
        # another timeline's weights, set aside as that timeline's are; exported again below, from a
        # checkpoint checked first (a damaged or misnamed one left the run's export aside, and none made:
        # trial RV67a F5)
        try:
            verify_checkpoint(ckpt)
        except CheckpointError as e:
            raise ExportError(f"{e}; {run_export}, of another checkpoint, is left as it is") from None
        verified = True  # hashed once (review RV67e nit)
        aside = abandoned_name(run_export)
        run_export.rename(aside)
        if log is not None:
            log(
                f"note: {run_export} was exported from a checkpoint of step {step} set aside since; "
                f"moved to {aside.name}"
            )
    if run_export.is_dir() and (out is None or incomplete_reason(ckpt) is not None or _another_step(ckpt)):
        note = verify_export(run_export)
        if note and log is not None:
            log(note)
        if out is None:
            return run_export
        _, dataset, _ = run_model_config(run_dir)
        model, mcfg = export_model(run_export)
        meta = {"step": step, "copied_from": str(run_export.resolve()), **noted}  # (review RV71h 4)
        if merged:
            meta["merged"] = json.loads((run_export / EXPORT_META).read_text(encoding="utf-8")).get("merged")
        return export_of_run(run_dir, model, mcfg, dataset, out, meta, dtype)
    if merged and incomplete_reason(ckpt) is not None:
        raise ExportError(
            f"{run_dir} has no merged weights of step {step}: {missing_step_reason(run_dir, step, True)}"
        )
    read = checkpoint_identity(ckpt)
    model, mcfg, dataset = load_checkpoint_model(run_dir, step, verified=verified, log=log)
    meta = {"step": step, "checkpoint": str(ckpt.resolve()), CHECKPOINT_IDENTITY: read, **noted}
    if merged:
        meta["merged"] = apply_merged(run_dir, step, model)
    target = out or run_export

    def write() -> Path:
        return export_of_run(run_dir, model, mcfg, dataset, target, meta, dtype)

    # A checkpoint set aside while it was read and written (a resume from an older step, a rewind)
    # leaves an export of a timeline the run left (review R15c F2): never the run's, never a copy.
    again = export_command(run_dir, step, merged, out, _dtype_name(dtype))
    set_aside = CheckpointSetAside(
        f"{ckpt} was set aside while it was exported (a resume or a rewind left its timeline), and so "
        f"was the export; once the run has saved step {step} again, export it: `{again}`"
    )
    for attempt in range(1, 9):
        try:
            written = write()
            break
        except ExportError:
            # Another export of the step landed first (two exporters: the trainer's, eval's, the
            # CLI's; review R15d F1): this one's, when its checkpoint was set aside; the one there,
            # when it records a checkpoint set aside, is set aside as its timeline's and this one
            # takes its place (again, when yet another lands meanwhile: review R15f F2).
            if read is None or not target.is_dir():
                raise
            if _set_aside_since(ckpt, read):
                raise set_aside from None
            if out is not None or not of_another_checkpoint(target, ckpt) or attempt == 8:
                raise
            with contextlib.suppress(FileNotFoundError):  # another exporter set it aside first
                target.rename(abandoned_name(target))
    if read is not None and _set_aside_since(ckpt, read):
        if out is not None:
            if _recorded_identity(target) == read:  # a copy this call made (--out must not exist)
                shutil.rmtree(target)
        else:
            _set_aside_if_of(target, read)
        raise set_aside
    return written


def _set_aside_if_of(export: Path, read: str) -> None:
    """Set export `export` aside (abandoned-…) if it records checkpoint identity `read`: renamed
    first, then read, and put back when it is another process's (the trainer's own export of the
    step, written meanwhile: checked before the rename, it could be set aside: review R15f F8)."""
    aside = abandoned_name(export)
    try:
        export.rename(aside)
    except FileNotFoundError:
        return
    if _recorded_identity(aside) != read:
        with contextlib.suppress(OSError):
            aside.rename(export)


class CheckpointSetAside(ExportError):
    """The checkpoint an export read was set aside while the export ran (a resume from an older step
    or a rewind left its timeline): the export is another timeline's, set aside too (review R15c F2)."""


def _set_aside_since(ckpt: Path, read: str) -> bool:
    """Whether checkpoint `ckpt`, whose CHECKPOINT_IDENTITY was `read`, has since been replaced by
    another of its step or renamed abandoned-… (run_layout.abandoned_name); deleted (retention, as
    checkpoint.keep_last deletes) it changes nothing of the timeline."""
    now = checkpoint_identity(ckpt)
    if now is not None:
        return now != read
    return any(checkpoint_identity(p) == read for p in abandoned_copies(ckpt))


"""gristmill_export.json's key for the sha256 of the COMPLETE of the checkpoint it was exported from:
written once per checkpoint, with its files' checksums, so another timeline's step N has another."""


def _recorded_identity(export: Path) -> str | None:
    """The CHECKPOINT_IDENTITY export `export` records; None for an export of before the record, or
    none there (verify_export names a damaged record)."""
    try:
        return json.loads((export / EXPORT_META).read_text(encoding="utf-8")).get(CHECKPOINT_IDENTITY)
    except (OSError, ValueError, AttributeError):
        return None


def _run_s_identity(ckpt: Path, ledger: Ledger | None = None) -> str | None:
    """The COMPLETE sha256 of checkpoint `ckpt` where it is the run's save of its step: its record
    reads (not damaged), names its own step and no other run or timeline (io.not_the_run_s_save). None
    otherwise, and the run's exports are then judged by RUN/checkpoints.jsonl: the checkpoint's own
    identity made verify call the run's intact export another's, and `export` replaced it with the wrong
    weights or set it aside and failed (trial RV60c 2, 3). `ledger`: the run's record, where the caller
    has it."""
    try:
        record = read_complete_record(ckpt)
    except CheckpointError:
        return None
    if step_held_otherwise(ckpt, record) is not None:  # trial RV75a 2
        return None
    return None if not_the_run_s_save(ckpt, record, ledger) else checkpoint_identity(ckpt)


def _another_step(ckpt: Path) -> bool:
    """Whether checkpoint `ckpt`'s COMPLETE names another step than its folder's name: the run's export
    of the step is then copied where an export is asked for (`--out`: review RV75d 5)."""
    try:
        return step_held_otherwise(ckpt, read_complete_record(ckpt)) is not None
    except CheckpointError:
        return False


def of_another_checkpoint(export: Path, ckpt: Path) -> bool:
    """Whether export `export` records another checkpoint than `ckpt`'s complete one: an export of a
    step N since set aside, or of another run's step N. A checkpoint gone (retention keeps exports)
    is the one RUN/checkpoints.jsonl records (an export of another run put in its place was verified
    as the run's: trial RV57a F1); an export of before the record, or of a step it lacks, says nothing."""
    recorded = _recorded_identity(export)
    if recorded is None:
        return False
    ledger, step = read_ledger(ckpt.parent.parent), step_of(ckpt)
    now = _run_s_identity(ckpt, ledger) or ledger.last(step)
    # no checkpoint of the step recorded: where the record holds every save, none of this run's (RV58b F1)
    return recorded != now if now is not None else ledger.by_none(step, recorded)


def not_the_run_s(run_dir: Path, step: int, merged: bool) -> str:
    """What an export of step `step` that is not of the run's checkpoint of it is, and what to do:
    verify's detail, and export's refusal where the run's checkpoint is gone."""
    said = f"exported from another checkpoint of step {step} than the run's"
    if _run_s_identity(checkpoint_dir(run_dir, step)) is not None:
        again = export_command(run_dir, step, merged)
        return (
            f"{said} (one a resume or a rewind set aside since); `{again}` sets it aside, exports the run's"
        )
    # the run's checkpoint of the step is gone (retention), or it never saved one: nothing to export from
    return (
        f"{said} (set aside by a resume or a rewind, or another run's: {CHECKPOINTS_JSONL}, the run's "
        "record of its saves, holds another of the step or none, and no checkpoint of it is left): move it "
        "aside; the run's export of the step, if it had one, is only in a copy"
    )


def _newest_to_export(run_dir: Path, log, merged: bool) -> int:
    """The newest complete checkpoint that verifies (`merged`: of those, holding its step's merged
    weights), saying which and what newer ones were passed over."""
    passed_over: list[tuple[Path, str]] = []
    within = None
    while True:
        path, _, passed = newest_verified(run_dir, within)
        passed_over += passed
        why = None if path is None or merged else untrained_reason(run_dir, step_of(path))
        if path is None or (why is None and (not merged or merged_step(path) == step_of(path))):
            break
        passed_over.append((path, why or missing_step_reason(run_dir, step_of(path), merged=True)))
        within = (0, step_of(path) - 1)
    if path is None:  # one line: the newest's reason, not a line per checkpoint first (trial RV74c 8)
        what = "that holds merged weights" if merged else "to export"
        newest = f" (step {step_of(passed_over[0][0])}: {passed_over[0][1]})" if passed_over else ""
        raise ExportError(f"{run_dir / CHECKPOINTS_DIR} holds no complete checkpoint {what}{newest}")
    for skipped, reason in passed_over if log is not None else ():
        log(f"skipped step {step_of(skipped)}: {reason}")
    if log is not None:
        what = " holding its merged weights" if merged else ""
        log(f"exporting step {step_of(path)}, the newest complete checkpoint{what} that verifies")
    return step_of(path)


def apply_merged(run_dir: Path, step: int, model: Transformer) -> dict[str, Any]:
    """The merged weights checkpoint `step` holds, copied into `model` (read from that checkpoint);
    returns what they are (kind, settings, the steps averaged). One line naming why when it holds
    none of that step."""
    ckpt = checkpoint_dir(run_dir, step)
    if merged_step(ckpt) != step:
        raise ExportError(
            f"{run_dir} has no merged weights of step {step}: {missing_step_reason(run_dir, step, True)}"
        )
    reader = MergedWeights(model)
    load_or_raise({"merge": reader}, ckpt, ExportError, "read the merged weights from", no_dist=True)
    reader.apply(model)
    bad = nonfinite_tensor(model.state_dict().items())
    if bad is not None:
        raise ExportError(f"{ckpt} holds non-finite merged weights ({bad})")
    return reader.record()


def export_model(export: Path) -> tuple[Transformer, ModelConfig]:
    """The model of a (verified) export, read back through init_from's loading path, and its config."""
    try:
        recorded = json.loads((export / EXPORT_META).read_text(encoding="utf-8"))["model_config"]
        mcfg = ModelConfig(**recorded)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExportError(
            f"{export / EXPORT_META} is unusable ({type(e).__name__}: {e}); re-export the step"
        ) from None
    model = model_to_load(mcfg)
    load_base_weights(model, export)
    return model, mcfg


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


def export_base(
    run_dir: str | Path, log=None, *, out: Path | None = None, dtype: torch.dtype = torch.float32
) -> Path:
    """Step 0 of a run from a base model ([model] init_from): the base itself, exported like any
    step (fp32, the base's bf16/fp16 upcast exactly) from the base's files, which must still be the
    base the run started from: its identity (init_from_sha256, which the checkpoints record too)
    and the bytes of its weights (RUN/base/base.json, a hub base's too). No step-0 checkpoint is
    kept: the base is step 0, so only this export needs it; every checkpoint holds its own weights."""
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    if not cfg.model.init_from:
        raise ExportError(f"{run_dir} has no step 0 to export: {missing_step_reason(run_dir, 0)}")
    check_kept_base(run_dir)  # deleted, the base's bytes went unchecked (review R22f S1)
    record = read_base_record(run_dir)
    if out is None and export_dir(run_dir, 0).is_dir():
        out = export_dir(run_dir, 0)
        note = verify_export(out, 0)
        if note and log is not None:
            log(note)
        if (note := check_base_export(out, run_dir)) and log is not None:
            log(note)
        return out
    spec = resolve(cfg)
    dataset, info = run_tokenizer_dataset(run_dir, spec)
    init_from = cfg.model.init_from  # RUN/config.toml names the base the run resolved (a resume: moved)
    pinned = None if record is None else str(record.get("init_from"))
    gone = hub_id(init_from) is None and not Path(init_from).expanduser().is_dir()
    if pinned is not None and hub_id(pinned) is not None and (gone or not record.get("weights_sha256")):
        # a hub base recorded before its weights were (review R25d S1): its pinned commit names them,
        # where the directory a resume named since may hold another commit of the same shape; and
        # that directory gone, the commit is where the recorded weights are (review R25e 5)
        init_from, gone = pinned, False
    note = _unrecorded_base(run_dir, record, init_from, f"step 0 of {run_dir} cannot be exported")
    if note and log is not None:
        log(note)
    if gone:  # export takes no settings: the run's own resume sets it (trial RV69c F2)
        raise ExportError(
            f"step 0 of {run_dir} is its base model, and model.init_from = {init_from} in "
            f"{run_dir / CONFIG_TOML} is not a directory (moved or deleted); {_point_run_at_base(run_dir)}"
        )
    source = locate_base(init_from, settable=False)  # a run's recorded base: export takes no settings
    try:
        mcfg = resolve_model_config(cfg.model, info, spec.seq_lens, source)
    except GristmillError as e:
        raise ExportError(f"step 0 of {run_dir} is its base model, which cannot be read: {e}") from None
    recorded = resume_model_record(run_dir, "auto") or record or {}
    want = recorded.get("init_from_sha256", mcfg.init_from_sha256)
    if want != mcfg.init_from_sha256:
        raise ExportError(
            f"{source.directory} is not the base {run_dir} started from (init_from_sha256 "
            f"{mcfg.init_from_sha256[:12]}…, the run records {want[:12]}…); restore that base to export "
            "step 0"
        )
    weights = None if record is None else record.get("weights_sha256")
    # a hub base's snapshot is held to the hub's names of its blobs too: damage there is the cache's, with
    # the cache's advice, as the start gives it (trial RV69c F4)
    hashed = weights or hub_id(mcfg.init_from) is not None
    now = base_weights(mcfg.init_from, source.directory)["weights_sha256"] if hashed else {}
    for name in sorted(set(now) | set(weights)) if weights else ():
        if now.get(name) != weights.get(name):
            raise ExportError(
                f"{source.directory / name} is not the file {run_dir} started from (sha256 "
                f"{str(now.get(name))[:12]}… now, {str(weights.get(name))[:12]}… in "
                f"{run_dir / BASE_DIR / BASE_JSON}): the base was changed since; restore it as it was "
                "to export step 0"
            )
    model = model_to_load(mcfg)
    load_base_weights(model, source.directory)
    if log is not None:
        log(f"exporting step 0: the base model {mcfg.init_from} (no update applied)")
    meta = {
        "step": 0,
        "base": mcfg.init_from,
        "init_from_sha256": mcfg.init_from_sha256,
        "base_weights_sha256": weights,
    }
    target = export_dir(run_dir, 0) if out is None else out
    return export_of_run(run_dir, model, mcfg, dataset, target, meta, dtype)


def _point_run_at_base(run_dir: Path) -> str:
    """The fix for a run whose base directory moved: a resume of the run names its new place (a
    complete run trains nothing, and RUN/config.toml then names it), held to the run's record."""
    config = run_dir / CONFIG_TOML
    return (
        f"point the run at the base's new place with `gristmill train --config {config} --resume auto "
        f"--set model.init_from=NEWDIR` (a complete run trains nothing; it rewrites {config}), then export "
        "or eval step 0 again"
    )


class UnrecordedBase(ExportError):
    """Step 0 of a run that keeps no record of its base's weights: nothing shows it is that base."""


def _unrecorded_base(run_dir: Path, record: dict[str, Any] | None, identity: str, refused: str) -> str | None:
    """Why step 0 of `run_dir`, the base `identity`, cannot be shown to be the base the run started
    from: RUN/base/base.json missing (UnrecordedBase, `refused` its start, with the fix: a run resumed
    from a checkpoint outside its run directory exported and scored a base edited in place as step 0,
    a note blaming the run's age: trial RV69c F1), or an older gristmill's, which records no sha256 of
    its weights (its note: only the base's config and weights index are checked; such a run can show
    no more, and refused, its step 0 could never be scored: review RV69d 5). None where it records
    them, or the base is the hub commit the run recorded (the commit names its bytes)."""
    if record is not None and record.get("weights_sha256"):
        return None
    was = (record if record is not None else resume_model_record(run_dir) or {}).get("init_from")
    if is_hub_commit(identity) and was == identity:
        return None
    path = run_dir / BASE_DIR / BASE_JSON
    if record is not None:  # every base.json written since 73f36f0d records them
        return (
            f"note: {run_dir} started before gristmill recorded its base's weights ({path} holds none): the "
            "weight bytes are not checked, only the base's config and weights index"
        )
    raise UnrecordedBase(
        f"{refused}: nothing records the weights of the base it started from ({path} is missing: the run "
        "resumed from a checkpoint outside its run directory, or it was deleted), so its base's files "
        "cannot be shown to be that base; export step 0 of the run whose checkpoint this one resumed "
        "(`gristmill export THAT_RUN --step 0`), or restore RUN/base/"
    )


def check_base_export(export: Path, run_dir: Path) -> str | None:
    """An existing exports/step-000000 must hold the base the run started from (RUN/base/base.json):
    a run started over from an edited or other base keeps no stale step 0, and one of a run without
    that record cannot be shown to hold it (UnrecordedBase: trial RV69c F1). Export and verify both
    hold it here. Returns the note of an older gristmill's record, which holds no weights."""
    try:
        record = read_base_record(run_dir)
    except GristmillError as e:
        raise ExportError(str(e)) from None
    try:
        meta = json.loads((export / EXPORT_META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(
            f"{export / EXPORT_META} is unreadable ({e}); {export_fix(export, EXPORT_META)}"
        ) from None
    checked = []
    if record is not None:
        checked = [
            ("init_from_sha256", record["init_from_sha256"]),
            ("base_weights_sha256", record.get("weights_sha256")),
        ]
        if not record.get("weights_sha256") and hub_id(str(record.get("init_from"))) is not None:
            # a hub base recorded without its weights names them by its commit: one exported from a
            # directory a resume named (another commit of the same shape: review R25d S1) is not it (R25e 2)
            checked.append(("base", record["init_from"]))
    for key, want in checked:
        if meta.get(key) != want:
            raise ExportError(
                f"{export} holds another base than {run_dir} started from ({key} differs from "
                f"{run_dir / BASE_DIR / BASE_JSON}); {export_fix(export, None)}"
            )
    return _unrecorded_base(
        run_dir, record, str(meta.get("base")), f"{export} cannot be shown to hold step 0 of {run_dir}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        metavar="RUN",
        action=PathArgument,
        help="training run directory (holds config.toml, checkpoints/)",
    )
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="checkpoint step to export (default: the newest complete one; 0: a run's base model, "
        "model.init_from)",
    )
    parser.add_argument(
        "--dtype",
        choices=["fp32", "bf16"],
        default="fp32",
        help="weights' dtype (default fp32, the master weights; bf16 halves the size: needs --out)",
    )
    parser.add_argument(
        "--merged",
        action="store_true",
        help="export the merged weights of [merge] that the checkpoint of --step holds (default: the newest "
        "checkpoint holding some) to RUN/exports/merged-step-N",
    )
    parser.add_argument(
        "--out",
        action=PathArgument,
        local=True,
        metavar="DIR",
        help="write the export to DIR (a new directory) instead of RUN/exports/step-N; made from the "
        "checkpoint, or from RUN/exports/step-N when the checkpoint is gone",
    )


def run(args: argparse.Namespace) -> int:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    # a directory that is no run (a dataset's): said so, not "step N is not trained yet"
    require_run(args.run)
    if note := unkept_base_note(args.run):
        print(note)
    out = export_checkpoint(args.run, args.step, log=print, out=args.out, dtype=dtype, merged=args.merged)
    print(f"export: {out}")
    return 0
