"""Names inside a training run directory (docs/design.md "Training run directory"), in one place.

    RUN/config.toml  metrics.jsonl  batches.bin  checkpoints/step-000150/  exports/step-000150/
        eval/step-000150/  base/
        exports/merged-step-000150/  eval/merged-step-000150/    ([merge]'s weights: training/merge.py)

Step directories are zero-padded to six digits so a plain sort is a step sort; steps past 999,999
simply grow a digit (`step_of` parses either). A merged step's directories are named apart
(`merged=True`): they are never a step's own, and every listing asks for one kind. A checkpoint
directory is complete only when DCP's `.metadata` exists and the trainer's `COMPLETE` record was
written after it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from training.contract.config_loader import ConfigError

CONFIG_TOML = "config.toml"
CONFIGS_DIR = "configs"  # from-step-N.toml: the config that trains the run from step N (config_history)
CHECKPOINTS_DIR = "checkpoints"
EXPORTS_DIR = "exports"
EVAL_DIR = "eval"
DCP_METADATA = ".metadata"
COMPLETE_FILE = "COMPLETE"
# each complete checkpoint's step and COMPLETE sha256, a line per save (contract/integrity.record_saved),
# kept when retention deletes the checkpoint: which checkpoint of its step is the run's, for its exports
CHECKPOINTS_JSONL = "checkpoints.jsonl"
LOCK_FILE = ".gristmill.lock"  # training.run.lock: one writer per run directory
METRICS_JSONL = "metrics.jsonl"
LOSS_PNG = "loss.png"  # train and validation loss against step, the timeline's rewinds marked
PLAN_PNG = "plan.png"  # the data plan: LR curve with phase boundaries, each source's share
CONSUMPTION_PARQUET = "consumption.parquet"  # tokens read per (phase, source) so far: the audit's view
DATA_PLAN_JSON = "data_plan.json"  # the plan and its skips (sources' fingerprints), read without torch
BATCHES_BIN = "batches.bin"  # each trained step's batch digest, the run's (training/contract/batch_record.py)
DISCARDED_BATCHES_BIN = "batches-discarded.bin"  # the steps rewinds discarded, kept apart
EVAL_PARQUET = "eval.parquet"  # every RUN/eval/step-N/results.json as rows (validation/eval_results.py)
EVAL_PLOT = "eval.png"
BASE_DIR = "base"  # a run from a base model: its identity and small files (checkpoint/base_record.py)

_STEP_DIR = re.compile(r"^step-(\d+)$")
_MERGED_DIR = re.compile(r"^merged-step-(\d+)$")
_ANY_STEP_DIR = re.compile(r"(abandoned-)?(merged-)?step-(\d+)(\.\d+)?")
MERGED_PREFIX = "merged-"


_CONFIG_FROM = re.compile(r"^from-step-(\d+)\.toml$")


def config_from_step(run_dir: str | Path, step: int) -> Path:
    """RUN/configs/from-step-N.toml: the resolved config that trains the run from step `step` on."""
    return Path(run_dir) / CONFIGS_DIR / f"from-step-{step:06d}.toml"


def config_history(run_dir: str | Path) -> dict[int, Path]:
    """{first step: RUN/configs/from-step-N.toml} of the configs the run's timeline trained with, by
    step (training/run/record.py writes them: a resume or a rewind whose config differs from the one
    before its step adds one)."""
    try:
        names = os.listdir(Path(run_dir) / CONFIGS_DIR)
    except FileNotFoundError:
        return {}
    found = {int(m[1]): config_from_step(run_dir, int(m[1])) for n in names if (m := _CONFIG_FROM.match(n))}
    return dict(sorted(found.items()))


def is_training_run(path: str | Path) -> bool:
    """A run directory holds config.toml; a dataset directory may too (its build recipe) but has
    dataset.json, or, while its build has not finished, build.json (review R21e 2)."""
    from training.contract.dataset_format import BUILD_JSON, DATASET_JSON  # numpy/pyarrow: only when asked

    path = Path(path)
    return (path / CONFIG_TOML).is_file() and not any(
        (path / n).is_file() for n in (DATASET_JSON, BUILD_JSON)
    )


def run_record(path: str | Path) -> str | None:
    """The first of a training run's records that directory `path` holds (metrics.jsonl,
    data_plan.json, checkpoints/), None when none: a directory another command's config.toml would
    replace (a data build's output, a mixture search's --out) is refused when it holds one."""
    records = (METRICS_JSONL, DATA_PLAN_JSON, CHECKPOINTS_DIR)
    return next((n for n in records if (Path(path) / n).exists()), None)


def artifact_in(path: str | Path) -> str | None:
    """What directory `path` holds when it is another command's artifact ("holds dataset.json: a
    dataset", "holds metrics.jsonl: a training run"), None otherwise: a command writing its own files
    into a directory it is given refuses one (a mixture search replaced a dataset's config.toml, a
    decontamination index wrote beside a run's: reviews R22b F4, R22d S2)."""
    from training.contract.dataset_format import BUILD_JSON, DATASET_JSON  # numpy/pyarrow: only when asked

    path = Path(path)
    if held := next((n for n in (DATASET_JSON, BUILD_JSON) if (path / n).exists()), None):
        return f"holds {held}: a dataset"
    if held := run_record(path):
        return f"holds {held}: a training run"
    return None


def dataset_around(path: str | Path) -> str | None:
    """Where `path` lies inside a dataset (a folder above it holds dataset.json or build.json): "lies
    inside DIR, which holds dataset.json: a dataset", None otherwise. A file written there is one the
    dataset does not record: an audit's --db in its manifest/, or a mixture search's --out under its
    excluded/, failed the dataset's validation for good (trial RV62b 7, 8)."""
    # the real path: through a link into a dataset's excluded/ was accepted (trial RV62f 2)
    if (found := _dataset_over(Path(os.path.realpath(path)).parents)) is not None:
        folder, held = found
        return f"lies inside {folder}, which holds {held}: a dataset"
    return None


def _dataset_over(folders: Iterable[Path]) -> tuple[Path, str] | None:
    """The first of `folders` that is a dataset's, and the record that says so (dataset.json or
    build.json); a folder counts where its file is gristmill's (a build.json is a common name: review
    RV62e 9)."""
    from training.contract.dataset_format import BUILD_JSON, DATASET_JSON  # numpy/pyarrow: only when asked

    for folder in folders:
        if held := next((n for n in (DATASET_JSON, BUILD_JSON) if _gristmill_json(folder / n)), None):
            return folder, held
    return None


def file_in_the_way(path: str | Path) -> Path | None:
    """The file at `path` or above it where a folder must be for a command to write `path` (the nearest
    that exists is no directory), None otherwise: said as that, not as the OSError's "cannot write …:
    File exists; make it writable" (trial RV74c 7, 8; re-trial RV74e F4)."""
    for there in (Path(path).absolute(), *Path(path).absolute().parents):
        try:
            if there.exists():
                return None if there.is_dir() else there
        except OSError:  # a folder this user may not read: its own line comes where it is written
            return None
    return None


def in_a_dataset(path: str | Path) -> str | None:
    """Where `path` is a dataset's directory or lies inside one of the dataset's own folders (shards/,
    manifest/, …), None otherwise: a run, a download or an export written there replaced the build's
    config.toml or left files its validation then failed (trial RV74c 1). A folder of the user's beside
    them (DATASET/runs/…) is no dataset's: a run there was resumed before (review RV74d 2)."""
    from training.contract.dataset_format import (  # numpy/pyarrow: only when asked
        DECONTAM_DIR,
        DEDUP_DIR,
        EXCLUDED_DIR,
        INDEX_DIR,
        LOGS_DIR,
        MANIFEST_DIR,
        SHARDS_DIR,
        TASK_RECORDS_DIR,
    )

    own = {
        SHARDS_DIR,
        MANIFEST_DIR,
        EXCLUDED_DIR,
        LOGS_DIR,
        INDEX_DIR,
        DECONTAM_DIR,
        DEDUP_DIR,  # (its advice deletes it: a run there went with it, review RV74f 2)
        TASK_RECORDS_DIR.split("/")[0],
    }
    real = Path(os.path.realpath(path))
    if (found := _dataset_over((real, *real.parents))) is None:
        return None
    folder, held = found
    if folder == real:
        return f"holds {held}: a dataset"
    if (mine := real.relative_to(folder).parts[0]) in own:
        return f"lies inside {folder / mine}, a folder of the dataset there ({held})"
    return None


def _gristmill_json(path: Path) -> bool:
    """Whether `path` is a dataset.json or build.json gristmill wrote (its fingerprint, its config hash)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(record, dict) and ("fingerprint" in record or "config_sha256" in record)


def unlike_a_run(path: str | Path) -> str:
    """What directory `path` is, when no training run (is_training_run): said the same by every command
    that takes a run (review R21f 2b: an unfinished data build's output was "no config.toml")."""
    from training.contract.dataset_format import DATASET_JSON, unfinished_build  # numpy/pyarrow: when asked

    path = Path(path)
    if not path.exists():
        return f"{path} does not exist"
    if not path.is_dir():
        return f"{path} is a file"
    if (path / DATASET_JSON).is_file():
        return f"{path} holds {DATASET_JSON}: a dataset"
    if history := config_history(path):  # a run's, its config.toml deleted (trial RV67a F14)
        newest = history[max(history)]
        return (
            f"{path} has no {CONFIG_TOML}, which every run keeps, though it holds a run's configs/: restore "
            f"it from the newest, {newest} (`cp {newest} {path / CONFIG_TOML}`)"
        )
    return unfinished_build(path) or f"{path} has no {CONFIG_TOML}"


def check_saved_config_place(
    config: str | Path,
    output_dir: str,
    overrides: list[str],
    key: str = "run.output_dir",
    what: str = "run",
    record: Callable[[Path], object] = run_record,
) -> None:
    """Refuse (ConfigError) `config` when it is an artifact's own saved config.toml (beside its
    record: a training run's, by default; a data build's build.json with `record`) whose `key`
    (`output_dir`) leads to another directory from here: the artifact was moved or copied, or its
    relative `key` was written from another working directory. `--resume auto` would then find no
    checkpoint there and train another run from step 0 (or continue the original); a data build
    built a new dataset beside the old one, exit 0 (review R25b 8). Passes when it leads back to the
    artifact, or a --set names `key` (the user said which). When a relative `key` is the artifact's
    own path's tail, the line names the directory it was written from: run the command there."""
    config = Path(config)
    home = config.parent
    if config.name != CONFIG_TOML or any(o.split("=", 1)[0].strip() == key for o in overrides):
        return
    out = Path(output_dir).expanduser()
    if not record(home) or out.resolve() == home.resolve():
        return
    # the directory from which relative `out` leads to `home`: `home` less `out`'s parts at its end
    parts, at = out.parts, home.resolve().parts
    written_from = (
        Path(*at[: -len(parts)])
        if parts
        and not out.is_absolute()
        and ".." not in parts
        and len(parts) < len(at)
        and at[-len(parts) :] == parts
        else None
    )
    where = (
        f"run the command from {written_from}, where its relative paths were written, or add --set "
        if written_from is not None
        else "add --set "
    )
    raise ConfigError(
        f"{config} is the saved config of the {what} in {home}, but its {key} = {json.dumps(output_dir)} "
        f"leads to {out.resolve()} from here (the {what} was moved or copied, or started from another "
        f"directory): to continue it where it is, {where}{key}={json.dumps(str(home))} (relative paths "
        "in it also resolve against the working directory)"
    )


def read_json_record(path: Path, list_key: str) -> dict[str, Any] | None:
    """The JSON object in `path` that holds a list under `list_key` (RUN/data_plan.json's sources,
    RUN/base/base.json's files), or None when `path` does not exist; a file that is unreadable or
    not such an object is a ValueError saying what is wrong (the caller names the file's fix)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get(list_key), list):
        raise ValueError(f"not a JSON object with a {list_key!r} list")
    return data


def step_name(step: int, merged: bool = False) -> str:
    """`step-000150`; `merged-step-000150` for the merged weights of that step."""
    return f"{MERGED_PREFIX if merged else ''}step-{int(step):06d}"


def abandoned_name(path: Path) -> Path:
    """Where a step-N directory of a discarded timeline (or an earlier run's metrics.jsonl, batches.bin)
    goes: abandoned-step-N beside it, or abandoned-step-N.2, .3, … when an earlier one holds that name."""
    return unused_name(path.with_name(f"abandoned-{path.name}"))


def unused_name(target: Path) -> Path:
    """`target`, or target.2, .3, … when an earlier one holds that name: what is set aside is never
    overwritten (a second damaged batch record replaced the first's evidence: review R22a A5)."""
    name, n = target, 1
    while name.exists():
        n += 1
        name = target.with_name(f"{target.name}.{n}")
    return name


def abandoned_copies(path: Path) -> list[Path]:
    """The directories step directory `path` was set aside as (abandoned_name): abandoned-step-N and
    abandoned-step-N.2, .3 … beside it (never abandoned-step-N0: another step)."""
    name = f"abandoned-{path.name}"
    return sorted(p for p in path.parent.glob(f"{name}*") if p.name == name or p.name.startswith(f"{name}."))


def set_aside_after(parent: str | Path, after: int) -> list[tuple[Path, Path]]:
    """Every `step-N` and `merged-step-N` directory under `parent` with N > `after` renamed
    abandoned-step-N, abandoned-merged-step-N (a discarded timeline's: kept, never overwritten, out
    of every step listing); returns (old, new) paths."""
    moved = []
    for merged in (False, True):
        for step in list_steps(parent, merged):
            if step > after:
                path = Path(parent) / step_name(step, merged)
                target = abandoned_name(path)
                path.rename(target)
                moved.append((path, target))
    return moved


def run_of_checkpoint(path: str | Path) -> Path:
    """The run directory checkpoint `path` belongs to: the one whose checkpoints/ holds it, whether
    `path` is a link to it (`latest`) or the run's checkpoints/ a link to a volume elsewhere."""
    path = Path(path)
    holder = path.resolve().parent
    for run in (path.parent.parent, holder.parent):
        if (run / CHECKPOINTS_DIR).resolve() == holder:
            return run
    return holder.parent


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / step_name(step)


def export_dir(run_dir: str | Path, step: int, merged: bool = False) -> Path:
    return Path(run_dir) / EXPORTS_DIR / step_name(step, merged)


def eval_dir(run_dir: str | Path, step: int, merged: bool = False) -> Path:
    return Path(run_dir) / EVAL_DIR / step_name(step, merged)


def step_of(path: str | Path) -> int:
    """`.../step-000150` -> 150; anything else is a ValueError naming the path."""
    m = _STEP_DIR.match(Path(path).name)
    if not m:
        raise ValueError(f"{path} is not a step-N directory")
    return int(m.group(1))


def names_a_step(name: str) -> bool:
    """Whether `name` is a step's directory name as the run keeps them: step-N, merged-step-N, and
    the abandoned- copies of either (.2, .3, …)."""
    return _ANY_STEP_DIR.fullmatch(name) is not None


def named_step(path: str | Path) -> int | None:
    """The step a directory's name gives (step-N, merged-step-N, their abandoned- copies), or None
    for any other name (a copy the user named)."""
    m = _ANY_STEP_DIR.fullmatch(Path(path).name)
    return int(m.group(3)) if m else None


def list_steps(parent: str | Path, merged: bool = False) -> list[int]:
    """Steps of the `step-N` directories directly under `parent` (`merged`: of the `merged-step-N`
    ones), ascending (temporary names, and names the run does not write, ignored)."""
    parent, pattern = Path(parent), _MERGED_DIR if merged else _STEP_DIR
    if not parent.is_dir():
        return []
    # the names the run writes only (step-000005): a `step-5` beside them was listed as step 5, whose
    # folder every use then rebuilt as step-000005, stopping retention and every resume (trial RV63a 3)
    return sorted(
        step
        for p in parent.iterdir()
        if (m := pattern.match(p.name))
        and p.name == step_name(step := int(m.group(1)), merged)
        and p.is_dir()
    )


def incomplete_reason(path: str | Path) -> str | None:
    """Why `path` is not a complete checkpoint, or None if it is."""
    path = Path(path)
    # COMPLETE is written after .metadata and deleted first (checkpointer.delete_checkpoint): with it,
    # a .metadata gone is damage its record names (verify_checkpoint), not a save that did not finish,
    # passed over without a word (trial RV60c 9)
    if (path / COMPLETE_FILE).is_file():
        return None
    if not (path / DCP_METADATA).is_file():
        return "no .metadata (the save did not finish)"
    return "no COMPLETE record (the save or a deletion was interrupted)"


def is_complete_checkpoint(path: str | Path) -> bool:
    return incomplete_reason(path) is None


def complete_steps(run_dir: str | Path) -> list[int]:
    """Steps of the run's complete checkpoints, ascending."""
    return [
        s
        for s in list_steps(Path(run_dir) / CHECKPOINTS_DIR)
        if is_complete_checkpoint(checkpoint_dir(run_dir, s))
    ]


# metrics.jsonl's rows, read without torch (checkpoint io, `mix propose`)
DROPPED_LINES = "note: dropped"  # read_metrics' note of lines that are not rows (not a torn last one)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a metrics.jsonl and a note about lines that are not whole JSON rows (a torn last
    line from a kill mid-write is cut off; any other broken line is dropped and named), or None."""
    rows, bad, where = [], [], []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("not a metrics row")
            # a loss that is no number: the summary's format failed on it (R21b F10)
            if "loss" in row and (not isinstance(row["loss"], (int, float)) or isinstance(row["loss"], bool)):
                raise ValueError("a loss that is not a number")
            rows.append(row)
        except ValueError:
            bad.append(i)
            # the row it follows: which step's row it was is what a reader needs (trial RV65c F4)
            where.append(f"{i} (after step {rows[-1]['step']}'s row)" if rows else f"{i} (before any row)")
    if not bad:
        return rows, None
    if bad == [len(lines)]:
        return rows, f"note: cut off the torn last line of {path} (line {bad[0]}: a write was interrupted)"
    return rows, f"{DROPPED_LINES} {len(bad)} unreadable line(s) of {path}: {', '.join(where[:10])}"


def kept_rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the run's final timeline: those no rewind discarded (training/run/rewind.py)."""
    return [r for r in history if "discarded_by_rewind" not in r]
