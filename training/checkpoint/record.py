"""A checkpoint's COMPLETE record read back: the record itself and the model it holds.

Apart from training/checkpoint/io.py (DCP's reader) so that what only reads records, the
launcher's preflight among them, starts without importing torch.distributed.checkpoint (1.5 s of
every `gristmill train --nproc-per-node N` before torchrun starts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.contract.errors import GristmillError
from training.contract.integrity import Ledger, checkpoint_identity, read_ledger, seal_broken, sealed
from training.contract.run_layout import (
    COMPLETE_FILE,
    checkpoint_dir,
    complete_steps,
    incomplete_reason,
    named_step,
)


class CheckpointError(GristmillError):
    """A checkpoint that cannot be written or read; names the path and the last complete one."""


class CheckpointDenied(CheckpointError):
    """A checkpoint's file this user may not read: not damage (a resume passed over it, set the step
    aside and trained it again: trial RV67a F16), refused with the fix, access."""


RECORD_SHA256 = "record_sha256"
"""COMPLETE's key for the sha256 of the rest of the record (`sealed`): the files' checksums it holds
cover the checkpoint's files, this covers the record, whose model fields an export writes into its
config.json (a flipped bit made rope_theta 50000.0 in an export that verified, review R14c F2)."""


def sealed_record(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its own sha256 (RECORD_SHA256), as COMPLETE is written."""
    return sealed(record, RECORD_SHA256)


def read_complete_record(path: str | Path) -> dict[str, Any]:
    """The COMPLETE record of checkpoint `path` (a CheckpointError naming it if unreadable, or if it
    does not hash to its own sha256; a record written before they were sealed has none)."""
    record = Path(path) / COMPLETE_FILE
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as e:  # nested past the parser's depth ("[" * 200000)
        raise CheckpointError(f"{record} is unreadable ({type(e).__name__}: {e})") from None
    if seal_broken(data, RECORD_SHA256):
        raise CheckpointError(f"{record} does not hash to the {RECORD_SHA256} it holds (damaged or edited)")
    return data


RESUME_ONLY = "resume_only"
"""COMPLETE's key, true for a save a run that was never stopped does not make (Checkpointer.resume_only):
a resume's starting point, never a rewind's target, counted in no keep_last."""


def is_resume_only(path: str | Path) -> bool:
    """Whether complete checkpoint `path` is a resume-only save (RESUME_ONLY); an unreadable record
    says no (such a checkpoint fails verification wherever it would be used)."""
    try:
        return read_complete_record(path).get(RESUME_ONLY) is True
    except CheckpointError:
        return False


BASE_RECORD = "base_record_sha256"
"""COMPLETE's key for the sha256 of RUN/base/base.json when the checkpoint was saved (a run from a base
model: training/checkpoint/base_record.py); absent for a run from scratch and in checkpoints written
before gristmill recorded it. What tells RUN/base/ deleted from a run that never had one: its exports
then took the dataset's tokens and its step 0 went unchecked (review R22f S1, S2)."""


RUN_RECORD = "run"
"""COMPLETE's key for the run id RUN/checkpoints.jsonl's first line holds (training/contract/integrity.py
RUN_ID) when the checkpoint was saved; absent where the record has none (older runs). A checkpoint of
the run's steps past the record's beginning that names another run is another run's (trial RV60c 1)."""


def of_another_run(step: int, record: dict[str, Any], identity: str | None, ledger: Ledger) -> bool:
    """Whether the save of `step` (COMPLETE `record`, sha256 `identity`) is another run's by the run's
    record, past the step it begins at: its COMPLETE names another run id, and not one the record had
    before a copy of the directory was resumed with that save among the record's (the original's later
    saves, put into the copy, are another run's there)."""
    run = record.get(RUN_RECORD)
    return (
        ledger.run is not None
        and ledger.began is not None
        and step > ledger.began
        and isinstance(run, str)
        and run != ledger.run
        and (run not in ledger.runs or (step, identity) not in ledger.saves)
    )


def step_held_otherwise(path: str | Path, record: dict[str, Any]) -> int | None:
    """The step checkpoint `path`'s COMPLETE `record` names where its folder is named for another step
    (copied or renamed over), else None: its weights were exported and verified as the folder's step
    (review R23c 1)."""
    held, named = record.get("step"), named_step(path)
    return held if isinstance(held, int) and named is not None and held != named else None


def own_saves(run_dir: str | Path) -> list[tuple[int, Path, dict[str, Any] | None]]:
    """(step, checkpoint, COMPLETE record) of the run's complete checkpoints, ascending, less another
    run's (by RUN/checkpoints.jsonl: of_another_run); the record None where it cannot be read (verify
    names it where it is used). What the run itself saved: another run's checkpoint put among them
    gave the run its base (trial RV75a 3) and its step ("the run trained through 6": trial RV75e)."""
    run_dir = Path(run_dir)
    ledger = read_ledger(run_dir)
    saves = []
    for step in complete_steps(run_dir):
        ckpt = checkpoint_dir(run_dir, step)
        try:
            record = read_complete_record(ckpt)
        except CheckpointError:
            saves.append((step, ckpt, None))
            continue
        if not of_another_run(step, record, checkpoint_identity(ckpt), ledger):
            saves.append((step, ckpt, record))
    return saves


def newest_base_record(run_dir: str | Path) -> tuple[Path, str] | None:
    """(checkpoint, BASE_RECORD) of the run's newest own save (own_saves) whose record reads, or None
    (none such, or it records no base: a run from scratch, an older checkpoint). A save of the run's
    that a later one replaced still holds the run's base (review RV75d 6)."""
    for _, ckpt, record in reversed(own_saves(run_dir)):
        if record is not None:
            sha = record.get(BASE_RECORD)
            return (ckpt, sha) if isinstance(sha, str) else None
    return None


def base_record_of(path: str | Path) -> tuple[Path, str] | None:
    """(checkpoint, BASE_RECORD) of complete checkpoint `path`, or None where it records no base."""
    sha = read_complete_record(path).get(BASE_RECORD)
    return (Path(path), sha) if isinstance(sha, str) else None


CONFIG_RECORD = "config"
"""COMPLETE's key for the applied config (as JSON) whose hash `config_sha256` is: a resume names the
keys that changed from it (it diffed against the run's config.toml, which another run's checkpoint
copied in, or a later resume, does not describe: review R23c 2). Absent in older checkpoints."""


MODEL_RECORD = "model"
"""COMPLETE's key for the model the checkpoint holds: dataclasses.asdict of the run's resolved
training.model.ModelConfig (absent in checkpoints written before gristmill recorded it)."""

ARCHITECTURE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "tie_embeddings")
"""ModelConfig fields that decide what the saved weights mean: a resume with any of them changed is
refused. So is one of init_std (START_SETTINGS). The others (rope_theta, norm_eps, max_seq_len,
document_mask, loss_chunk, float8) are settings a run may change on a resume (a longer-context
phase, a memory knob), with a note."""

START_SETTINGS = ("model.init_std", "run.seed")
"""Settings that only decide the random initial weights (their std, their seed — run.seed seeds
nothing else: the RNG streams are the checkpoint's). A resume continues the checkpoint's weights, so
one that changes them is refused: it said "in effect", recorded them, changed nothing, and a fresh run
from the run's config.toml then trained another start (review R25b 2). run.init_device is not one:
where the model is built is a memory setting a resume may need to change (a model that no longer fits
one device: "meta"), and RUN/configs/ keeps what the first steps started with."""


def start_changes(
    record: dict[str, Any], model: dict[str, Any] | None, config: dict[str, Any] | None
) -> list[tuple[str, Any, Any]]:
    """(key, the checkpoint's value, this config's) for each START_SETTINGS key that differs between
    COMPLETE `record` and this run's model config `model` (dataclasses.asdict: init_std resolved, a
    preset's or the override) and identity config `config` (what COMPLETE records); a value either
    side lacks (a checkpoint older than the records) is not compared."""
    saved = record.get(CONFIG_RECORD)
    then = {"model": recorded_model(record), "run": saved.get("run") if isinstance(saved, dict) else None}
    if (then["model"] or {}).get("init_from") or (model or {}).get("init_from"):
        return []  # a run from a base starts from its weights: neither decides anything (review R25h 4)
    now = {"model": model, "run": (config or {}).get("run")}
    changes = []
    for key in START_SETTINGS:
        section, name = key.split(".")
        was, is_ = (d.get(name) if isinstance(d, dict) else None for d in (then[section], now[section]))
        if None not in (was, is_) and was != is_:
            changes.append((key, was, is_))
    return changes


def recorded_model(record: dict[str, Any]) -> dict[str, Any] | None:
    """The model config in a checkpoint's COMPLETE `record`, or None (an older checkpoint)."""
    model = record.get(MODEL_RECORD)
    return model if isinstance(model, dict) else None


def resume_model_record(run_dir: str | Path, spec: str = "auto") -> dict[str, Any] | None:
    """The model record of the checkpoint `--resume spec` continues from ("auto": the run's newest
    complete one, unverified; a path: that checkpoint; "": none), or None (no such checkpoint, or
    one without a record). Every checkpoint of a run holds one model (a resume with another is
    refused), so this is the run's model and base, known without reading the base. The
    checkpointer still verifies and checks the checkpoint it really loads."""
    if not spec:
        return None
    if spec == "auto":  # newest first: one whose record is damaged is passed over, as the resume does
        paths = [checkpoint_dir(run_dir, s) for s in reversed(complete_steps(run_dir))]
    else:
        paths = [] if incomplete_reason(Path(spec)) is not None else [Path(spec)]
    for path in paths:
        try:
            return recorded_model(read_complete_record(path))
        except CheckpointError:
            continue  # the checkpointer names the unreadable record when it gets there
    return None


def model_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, recorded value, current value) for every field both hold with different values."""
    return [(k, recorded[k], v) for k, v in current.items() if k in recorded and recorded[k] != v]


def _value(v: Any) -> str:
    return json.dumps(v)  # TOML-like: true, 10000.0, "x"


def describe_differences(diffs: list[tuple[str, Any, Any]], first: str, second: str) -> str:
    """'model.n_layers = 2 in the checkpoint, 1 in this config; …'"""
    return "; ".join(f"model.{k} = {_value(a)} {first}, {_value(b)} {second}" for k, a, b in diffs)
