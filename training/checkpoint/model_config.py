"""The model a run builds (`resolve_model_config`): its preset, the [model] overrides, a base model's
shape ([model] init_from: its config.json, or the checkpoint's record on a resume that does not read
the base again) and the dataset's vocabulary, checked against the dataset and every phase's seq_len.
The trainer's preflight, `gristmill train --plan` and the export all build it here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from training.config import ModelSection
from training.contract.config_loader import ConfigError

if TYPE_CHECKING:
    from training.checkpoint.base_source import BaseSource

# Presets whose vocabulary is the dataset's own (a tokenizer trained for the demo corpus); the real
# presets keep their published vocab size so their parameter count matches the reference runs.
VOCAB_FROM_DATASET_PRESETS = ("tiny", "demo")


def _base_overrides(base: BaseSource, overrides: dict) -> dict:
    """[model] overrides with the base's shape on top: a key set in both must agree. The shape is the
    base's config.json, or on a resume that does not read the base again the checkpoint's record
    (`base`: where model.init_from was located)."""
    # torch-heavy, like training.model below: imported when a run starts
    from training.checkpoint.hf_import import BASE_FIELDS, LLAMA3_FIELDS, base_model_fields, base_sha256

    if base.directory is None:
        record = base.recorded
        keys = BASE_FIELDS + (LLAMA3_FIELDS if record.get("rope_type") == "llama3" else ())
        fields = {k: record[k] for k in keys if k in record}
        where, sha = "recorded in the checkpoint resumed", record["init_from_sha256"]
    else:
        fields = base_model_fields(base.directory)
        where, sha = base.directory / "config.json", base_sha256(base.directory)
    for key, value in fields.items():
        if key in overrides and overrides[key] != value:
            raise ConfigError(
                f"model.{key} = {json.dumps(overrides[key])} disagrees with the base model's "
                f"{json.dumps(value)} ({where}); remove model.{key} (the base decides it)",
                f"model.{key}",
            )
    return overrides | fields | {"init_from": base.identity, "init_from_sha256": sha}


def resolve_model_config(
    section: ModelSection,
    dataset_info: dict,
    seq_lens: Sequence[tuple[str, int]],
    source: BaseSource | None = None,
):
    """The ModelConfig to build: preset + overrides + the vocabulary rule, checked against the dataset
    and every phase's seq_len (RunSpec.seq_lens). `--plan` and the trainer both call it. `source`: where
    model.init_from was located (training.checkpoint.base_source.locate_base; located here when None)."""
    from training.checkpoint.hf_import import LLAMA3_FIELDS
    from training.model import PRESETS  # the model module is heavier; import when a run starts

    if section.preset not in PRESETS:
        raise ConfigError(f"model.preset = {section.preset!r} is not one of {', '.join(sorted(PRESETS))}")
    base = PRESETS[section.preset]
    names = {f.name for f in dataclasses.fields(base)}
    overrides = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name in ("preset", "init_from") or value is None:
            continue
        if f.name not in names:  # the model grew or lost a field; keep the two in step
            raise ConfigError(f"model.{f.name} is not a field of training.model.ModelConfig")
        overrides[f.name] = value
    data_vocab = int(dataset_info["vocab_size"])
    if section.init_from:
        if source is None:
            from training.checkpoint.base_source import locate_base

            source = locate_base(section.init_from)
        overrides = _base_overrides(source, overrides)
    elif section.vocab_size is None and section.preset in VOCAB_FROM_DATASET_PRESETS:
        overrides["vocab_size"] = data_vocab
    try:
        mcfg = dataclasses.replace(base, **overrides)
    except ValueError as e:  # ModelConfig checks its own shape (heads divide dim, ...)
        raise ConfigError(f"model: {e}") from None
    # The llama3 scaling keys under another rope_type were accepted, recorded in config.toml and
    # ignored: a context stretched by rope_factor without rope_type = "llama3" trained unscaled.
    scaling = [k for k in LLAMA3_FIELDS if getattr(section, k) is not None]
    if scaling and mcfg.rope_type != "llama3":
        key = f"model.{scaling[0]}"
        if section.init_from:
            whose, fix = "the base model's", f"remove {key} (the base decides RoPE)"
        else:
            whose, fix = f"preset {section.preset!r}'s", f'set model.rope_type = "llama3" or remove {key}'
        if section.rope_type:
            whose = "model.rope_type"
        raise ConfigError(
            f'{key} = {getattr(section, scaling[0])} scales RoPE only with rope_type "llama3", and the '
            f"model's is {mcfg.rope_type!r} ({whose}): {fix}",
            key,
        )
    # With init_from a smaller data vocabulary is fine: check_base_data refuses a larger one, naming
    # both files, before step 1.
    if not section.init_from and mcfg.vocab_size != data_vocab:
        raise ConfigError(
            f"the model's vocab_size {mcfg.vocab_size} (preset {section.preset!r}) differs from the "
            f"dataset's {data_vocab} (dataset.json of data.dataset); set model.vocab_size = {data_vocab} or "
            f"train on a dataset built with a {mcfg.vocab_size}-token tokenizer"
        )
    sep = int(dataset_info["separator"]["id"])
    if not 0 <= sep < mcfg.vocab_size:
        raise ConfigError(
            f"the dataset's separator id {sep} is outside the model's vocabulary "
            f"(vocab_size {mcfg.vocab_size})"
        )
    for key, seq_len in seq_lens:
        if seq_len <= mcfg.max_seq_len:
            continue
        if not section.init_from:
            raise ConfigError(
                f"{key} = {seq_len} exceeds the model's max_seq_len = {mcfg.max_seq_len} (preset "
                f"{section.preset!r}); lower {key} or set model.max_seq_len ≥ {seq_len}",
                key,
            )
        # The base decides max_seq_len (model.max_seq_len may only repeat it): the options are the data's.
        where = "recorded in the checkpoint" if source.directory is None else source.directory / "config.json"
        raise ConfigError(
            f"{key} = {seq_len} exceeds the base model's max_position_embeddings = {mcfg.max_seq_len} "
            f"({where}); lower {key} to ≤ {mcfg.max_seq_len}, or start from a base trained for "
            f"{seq_len} positions (raising max_position_embeddings in a copy of the base's config.json makes "
            "the run train positions the base never saw)",
            key,
        )
    return mcfg
