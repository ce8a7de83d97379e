"""RUN/base/: what a run from a base model ([model] init_from) keeps of it, written once when the
run starts from the base (not on a resume, which never reads the base).

    RUN/base/  base.json  config.json  tokenizer.json  tokenizer_config.json
               special_tokens_map.json  generation_config.json          (those the base has)

- The base's identity covers config.json and the weights index, not the weight bytes (a minute to
  hash on an 8B, on every resume). base.json adds the sha256 of every weights file, hashed once
  here, so an export of step 0 (the base itself, rebuilt from its files) refuses a base edited in
  place since the run started, and a resume that names the base in another place (a directory
  holding a hub base's commit, on a machine without the hub) is compared against them. A hub base
  has them too (hub_weights_sha256: its snapshot hashed, and held to the hub's sha256 where the
  cache names a blob by it): its pinned commit names its bytes on the hub, not in a directory
  (another commit of the same shape reads alike: review R25d S1).
- The export of any step of the run carries the base's tokenizer files and special tokens (bos,
  eos, pad as the base's users expect them), read from here: the base itself may be gone by then.
  gristmill's own eval does not take its framing from them but from the dataset's separator
  (gristmill_export.json), exactly one per document as in training.

base.json is written last and lists the files kept (and tokenizer.json's sha256: what decides the
ids the exports ship is held to it), so a start cut short leaves no record that
names files of another base.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from training.checkpoint.base_source import (
    INDEX_JSON,
    KEPT_FILES,
    TEMPLATES_DIR,
    TOKENIZER_FILES,
    TOKENIZER_JSON,
    BaseModelError,
    check_templates,
    hub_id,
    kept_name,
    named_templates,
    unrecorded_step0,
    weights_files,
)
from training.checkpoint.export_advice import export_fix
from training.checkpoint.record import (
    base_record_of,
    newest_base_record,
    read_complete_record,
    recorded_model,
)
from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import file_sha256, tokenizer_differences
from training.contract.errors import GristmillError
from training.contract.hub_cache import hub_copy_damage
from training.contract.integrity import EXPORT_CHECKSUMS, damaged_files, exported_with_checksums
from training.contract.run_layout import (
    BASE_DIR,
    COMPLETE_FILE,
    CONFIG_TOML,
    read_json_record,
    run_of_checkpoint,
)

__all__ = [
    "BASE_JSON",
    "TOKENIZER_FILES",
    "base_files",
    "kept_base_files",
    "base_record_sha256",
    "base_weights",
    "base_tokenizer_changed",
    "is_export",
    "check_kept_base",
    "carry_base_record",
    "drop_base_record",
    "read_base_record",
    "record_base",
    "record_base_of_copy",
    "unrecorded_base_reason",
    "with_run_base",
    "weights_sha256",
]

BASE_JSON = "base.json"
TOKENIZER_SHA256 = "tokenizer_sha256"  # base.json: the kept tokenizer.json's, as the run started


def weights_sha256(directory: str | Path) -> dict[str, str]:
    """{file: sha256} of a base's weights files (the safetensors and their index)."""
    directory = Path(directory)
    weight_map, names = weights_files(directory)
    names += [INDEX_JSON] if weight_map is not None else []  # the index, when it is what names them
    for name in names:  # what weights_index says of it, which the mixture search does not read
        if not (directory / name).is_file():
            raise BaseModelError(f"{directory / name} not found (named by the base's weights index)")
    got = {name: file_sha256(directory / name) for name in names}
    _check_export_record(directory, got)
    return got


def _intact_or(directory: Path, what: str) -> str:
    """The fix for a damaged export used as a base: an intact copy, or the export written again as
    export_fix says (moved aside, never deleted: it may hold the only copy of its weights, and the
    failing file may be a small one, review RV33c F4)."""
    return f"point model.init_from at an intact copy, or {export_fix(directory, what)}"


def is_export(directory: Path) -> bool:
    """Whether a base's directory is a gristmill export: its checksums there, or its record of being
    written with them (their absence is then damage: _check_export_record)."""
    return (directory / EXPORT_CHECKSUMS).is_file() or exported_with_checksums(directory)


def _check_export_record(directory: Path, got: dict[str, str]) -> None:
    """A base that is a gristmill export is held to its record of its files (EXPORT_CHECKSUMS): one
    damaged since it was exported was trained from, exit 0, where eval and verify refuse it (review
    R22f S4). `got`: its weights files' sha256, just computed, which must be the weights it records,
    no more and no fewer (re-sharded under other names: R22i S2). Its tokenizer files are not held to
    it: transformers re-saves a tokenizer with other bytes and the same tokens (R22h M3), and the
    tokenizer is checked against the dataset's as for any base; its config is (R22i S1)."""
    record = directory / EXPORT_CHECKSUMS
    if not record.is_file() and exported_with_checksums(directory):  # deleted with an edit (R22j S3)
        raise BaseModelError(
            f"model.init_from = {directory} is a gristmill export without its {EXPORT_CHECKSUMS}, which it "
            f"was exported with: its files cannot be checked; {_intact_or(directory, EXPORT_CHECKSUMS)}"
        )
    if not record.is_file():  # an export of before the record, or no export: nothing to hold it to
        return
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
        weights = {n for n in files if n.endswith(".safetensors") or n == INDEX_JSON}
        problems = [f"{directory / n}: missing, which the export holds" for n in sorted(weights - set(got))]
        problems += [f"{directory / n}: no file of the export" for n in sorted(set(got) - weights)]
        problems += [
            f"{directory / name}: sha256 {sha}, {files[name]['sha256']} when written"
            for name, sha in got.items()
            if name in files and files[name].get("sha256") != sha
        ]
        # (generation_config.json is held to it: the run keeps it and ships it in every export, whose
        # new checksums would certify an edit: review R22k S1)
        others = {n: r for n, r in files.items() if n not in weights and n not in TOKENIZER_FILES}
        problems += damaged_files(directory, others)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        problems = [f"{record} cannot be read ({type(e).__name__}: {e})"]
    if problems:
        raise BaseModelError(
            f"model.init_from = {directory} is a gristmill export that fails its checksums ({problems[0]}): "
            f"it changed after it was exported; {_intact_or(directory, 'the file')}"
        )


def hub_weights_sha256(snapshot: str | Path) -> dict[str, str]:
    """weights_sha256 of a hub base's cache snapshot (what the run loads), held to the hub's digest
    where the cache names the file's blob by it (hub_copy_damage): a copy damaged in the cache is
    refused in one line. Reading the name alone recorded the hub's bytes while the run trained on the
    damaged copy (review R25k 1: a claim beside the data is not the data)."""
    got = weights_sha256(snapshot)
    for name, sha in got.items():
        if (damage := hub_copy_damage(Path(snapshot) / name, sha256=sha)) is not None:
            raise BaseModelError(damage)
    return got


def base_weights(identity: str, directory: str | Path) -> dict[str, Any]:
    """What base.json says of a base's bytes: its identity (a directory, or a hub id pinned to its
    commit) and the sha256 of its weights files in `directory` (a hub base's snapshot, checked against
    the cache's names of them: hub_weights_sha256)."""
    got = weights_sha256(directory) if hub_id(identity) is None else hub_weights_sha256(directory)
    return {"init_from": identity, "weights_sha256": got}


def kept_base_files(directory: str | Path) -> dict[str, Path]:
    """{name: path} of the base's small files in `directory` that a run keeps in RUN/base/ (KEPT_FILES
    present there, and its named chat templates): what its exports read."""
    directory = Path(directory)
    names = [name for name in KEPT_FILES if (directory / name).is_file()] + named_templates(directory)
    check_templates(directory, names)
    return {name: directory / name for name in names}


def record_base(
    run_dir: str | Path,
    directory: str | Path,
    identity: str,
    init_from_sha256: str,
    expect: str | None = None,
) -> bool:
    """Keep the base's small files in RUN/base/ and write base.json: its identity and the sha256 of
    its weights files. `expect`: the sha256 of base.json a checkpoint recorded (BASE_RECORD): written
    only where the base.json made now is that one, byte for byte (the base the checkpoint's run
    started from, its weights hashed again). Returns whether it was written."""
    target, directory = Path(run_dir) / BASE_DIR, Path(directory)
    kept = list(kept_base_files(directory))
    record = {**base_weights(identity, directory), "init_from_sha256": init_from_sha256, "files": kept}
    if TOKENIZER_JSON in kept:  # what decides the ids its exports ship (check_kept_base)
        record[TOKENIZER_SHA256] = file_sha256(directory / TOKENIZER_JSON)
    text = json.dumps(record, indent=1) + "\n"
    if expect is not None and hashlib.sha256(text.encode()).hexdigest() != expect:
        return False
    target.mkdir(parents=True, exist_ok=True)
    _keep_files(directory, target, kept)
    write_atomic(target / BASE_JSON, text)
    return True


def record_base_of_copy(run_dir: str | Path, checkpoint: Path, directory: Path | None) -> str | None:
    """RUN/base/ of a run resumed from `checkpoint` where it lies in no run directory (a volume's path):
    its run's RUN/base/ cannot be carried, so it is written as that run's was where `directory` (the
    base at model.init_from, None when not at hand) is the base the checkpoint's run started from, as
    the sha256 of base.json the checkpoint recorded proves; without it step 0 was exported from a base
    edited since, unchecked (trial RV69c F1). Else the note why not (the run then keeps no record,
    and its step 0 is refused, a hub commit's excepted: hf_export.export_base)."""
    recorded, model = base_record_of(checkpoint), recorded_model(read_complete_record(checkpoint))
    if recorded is None or not model:
        # not "an earlier gristmill" alone: this one records none in a run that keeps no RUN/base/ (RV69e 3)
        why = (
            f"{checkpoint / COMPLETE_FILE} records no base's weights (its run kept no RUN/base/, or an "
            "earlier gristmill wrote it)"
        )
    elif directory is None:
        why = "the base is not at hand to compare with its record"
    else:
        identity, sha = str(model.get("init_from")), str(model.get("init_from_sha256"))
        try:
            if record_base(run_dir, directory, identity, sha, expect=recorded[1]):
                return None
            why = f"{directory} is not the base {checkpoint / COMPLETE_FILE} records, byte for byte"
        except (GristmillError, OSError) as e:
            why = f"{directory} cannot be compared with it ({(str(e).splitlines() or [''])[0]})"
    drop_base_record(run_dir)  # an earlier run's in this directory is not this one's base (R15d F8)
    step0 = unrecorded_step0(str((model or {}).get("init_from")))
    return (
        f"note: {checkpoint} lies in no run directory, so its run's RUN/base/ (the record of its base's "
        f"weights and special tokens) is not carried, and {why}: the exports take the dataset's tokens, and "
        f"{step0}; resume from RUN/checkpoints/step-N of its run to carry it"
    )


def _keep_files(source: Path, target: Path, kept: list[str]) -> None:
    """The base's small files `kept` copied from `source` into RUN/base/ (`target`); the others of
    KEPT_FILES removed there, and named chat templates (a record of an earlier start, from another
    base)."""
    for name in [*KEPT_FILES, *named_templates(target)]:
        if name not in kept:
            (target / name).unlink(missing_ok=True)
    for name in kept:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target / name, (source / name).read_bytes())


def carry_base_record(from_run: str | Path, run_dir: str | Path) -> None:
    """RUN/base/ of run `from_run` into run `run_dir`, resumed from one of its checkpoints (its weights
    descend from that run's base, whose tokens its exports keep: review R15c F4); none when `from_run`
    has none (a run from scratch: `run_dir` then keeps none either). base.json is written last, as
    record_base writes it."""
    if Path(from_run).resolve() == Path(run_dir).resolve():
        read_base_record(run_dir)  # its own record, as it is (one unreadable is said now)
        return
    record = read_base_record(from_run)
    source, target = Path(from_run) / BASE_DIR, Path(run_dir) / BASE_DIR
    if record is None:
        drop_base_record(run_dir)
        return
    target.mkdir(parents=True, exist_ok=True)
    (target / BASE_JSON).unlink(missing_ok=True)
    _keep_files(source, target, record["files"])
    write_atomic(target / BASE_JSON, (source / BASE_JSON).read_bytes())


def drop_base_record(run_dir: str | Path) -> None:
    """Remove RUN/base/ from a run whose weights descend from no base (started from scratch, or
    resumed from such a run's checkpoint): one a start from a base left, dead before its first
    checkpoint, gave its exports that base's special tokens (review R15d F8)."""
    shutil.rmtree(Path(run_dir) / BASE_DIR, ignore_errors=True)


def read_base_record(run_dir: str | Path) -> dict[str, Any] | None:
    """RUN/base/base.json, or None (a run from scratch, or one started before gristmill kept it)."""
    path = Path(run_dir) / BASE_DIR / BASE_JSON
    try:
        record = read_json_record(path, "files")
        # the names it lists are of KEPT_FILES and tokenizer.json's sha256 text: `"files": [1]` was a
        # TypeError's traceback in verify and export (review RV60d 1)
        if record is not None and not all(isinstance(n, str) and kept_name(n) for n in record["files"]):
            kept = f"{', '.join(KEPT_FILES)} or {TEMPLATES_DIR}/*.jinja"
            raise ValueError(f"its 'files' are not names of {kept}")
        if record is not None and not isinstance(record.get(TOKENIZER_SHA256, ""), str):
            raise ValueError(f"its {TOKENIZER_SHA256!r} is not a sha256")
        return record
    except ValueError as e:
        raise GristmillError(
            f"{path} is unreadable ({e}); restore RUN/base/ from a copy of the run, or it is written "
            "again when the run starts over from its base (a new run directory)"
        ) from None


def other_base_reason(run_dir: str | Path, identity: str) -> str | None:
    """Why the base `identity` (model.init_from as a resume resolved it) is not the one the run started
    from although it reads as the same model (config.json and weights index: init_from_sha256, equal
    for two exports of one run, or two commits of one hub repository): base.json records other
    bytes, or another hub commit, or cannot tell; the line ends with its fix. None: the same base
    (moved: its weights hashed again, only on a resume that names another place), or nothing to
    compare (no record; a directory's record of before the weights were recorded)."""
    record = read_base_record(run_dir)
    if record is None or record.get("init_from") == identity:
        return None
    was, weights = str(record.get("init_from")), record.get("weights_sha256")
    path = Path(run_dir) / BASE_DIR / BASE_JSON
    if hub_id(was) is not None and hub_id(identity) is not None:
        return (
            f"model.init_from = {identity} is another hub commit than the run's base, {was}; name the "
            "repository without @revision (a resume keeps the recorded commit)"
        )
    if hub_id(identity) is not None:  # a resume fetched it: its snapshot is not what is compared here
        return (
            f"model.init_from = {identity} is a hub id, and the run's base is the directory {was}, whose "
            f"weights' sha256 {path} records; set model.init_from to {was} (gone, the checkpoint's record "
            "stands in for it)"
        )
    if not weights and hub_id(was) is not None:  # started before a hub base's weights were recorded
        return (
            f"model.init_from = {identity} is a directory, and the run's base is {was}, whose weights "
            f"{path} does not record (the run started before gristmill recorded a hub base's), so they "
            f"cannot be compared; set model.init_from to {was} (a resume does not download it again)"
        )
    if weights and weights_sha256(identity) != weights:
        return (
            f"the weights of model.init_from = {identity} are not the run's base's, {was} (their sha256 "
            f"differ from {path}'s record); set model.init_from to {was} or a copy of its files"
        )
    return None


def with_run_base(recorded: dict[str, Any] | None, run_dir: str | Path, spec: str) -> dict[str, Any] | None:
    """`recorded`, the model record of the checkpoint `--resume spec` continues from, naming the base
    its run's RUN/base/base.json records (the run's base) where it names another place of it: a
    resume read the base from a directory, which an earlier gristmill recorded, and `org/name` or
    the advised `org/name@commit` then resolved against that directory instead of the run's pinned
    commit: `main` fetched, or a download refused offline (review R25e 3, 4). The checkpointer
    still holds the base to that record and checks the record itself."""
    found = _resumed_base(recorded, run_dir, spec) if recorded and recorded.get("init_from") else None
    return recorded if found is None else {**recorded, "init_from": found[1]["init_from"]}


def _resumed_base(
    recorded: dict[str, Any] | None, run_dir: str | Path, spec: str
) -> tuple[Path, dict[str, Any]] | None:
    """(the run, its RUN/base/base.json) of the checkpoint `--resume spec` continues from, whose model
    record is `recorded`, where that base.json records the checkpoint's base; else None (none, another
    base's, or unreadable: the checkpointer names it where it checks the record)."""
    if not recorded or not spec:
        return None
    run = Path(run_dir) if spec == "auto" else run_of_checkpoint(spec)
    try:
        kept = read_base_record(run)
    except GristmillError:
        return None
    if kept is None or kept.get("init_from_sha256") != recorded.get("init_from_sha256"):
        return None
    return run, kept


def base_tokenizer_changed(
    recorded: dict[str, Any] | None, run_dir: str | Path, spec: str, directory: Path
) -> str | None:
    """Why a resume cannot read the base in `directory`: its tokenizer.json is not, by what decides the
    ids, the one the run kept when it started (RUN/base/tokenizer.json, held to base.json's sha256).
    `recorded`, `run_dir`, `spec`: as with_run_base's. Compared with the dataset instead, an edit of
    the base was blamed on the data, whose rebuild was the advice (trial RV71b 1). None: the same
    tokenizer (a re-saved copy too), no record, or a kept copy not intact (check_kept_base says so)."""
    found = _resumed_base(recorded, run_dir, spec)
    sha = None if found is None else found[1].get(TOKENIZER_SHA256)
    if found is None or not sha:  # no record of the tokenizer.json kept (a record of before it)
        return None
    run = found[0]
    now, copy = directory / TOKENIZER_JSON, run / BASE_DIR / TOKENIZER_JSON
    try:
        if not now.is_file() or file_sha256(now) == sha or file_sha256(copy) != sha:
            return None
        differ = tokenizer_differences(copy, now)
        how = f"in {', '.join(differ)}"
    except ValueError as e:
        differ, how = ["its content"], f"(it is no longer valid JSON: {e})"
    except OSError:
        return None
    if not differ:
        return None
    return (
        f"{now} (base model) changed since the run started: it differs from {copy}, the copy the run kept "
        f"then (sha256 {sha[:12]}… in {run / BASE_DIR / BASE_JSON}), {how}; restore it from that copy, or "
        "move the base folder away (a resume reads the base's shape from the checkpoint, never its weights)"
    )


def unrecorded_base_reason(checkpoint: Path, was: str, identity: str) -> str:
    """Why the base `identity` cannot be taken for `was`, the base checkpoint `checkpoint` records,
    moved: its run's RUN/base/base.json, which records the base's weights, is not at hand (a
    volume's path to the checkpoint; a run started before gristmill kept it), and another commit of
    one hub repository, or another export of one run, reads as the same model (init_from_sha256):
    taken for the base moved, the new run recorded it, and its step 0 was that other model (review
    R25e 1). Its fix works offline: the recorded base is not read again on a resume."""
    run = run_of_checkpoint(checkpoint)
    where = (
        f"its run {run} started before gristmill kept it"
        if (run / CONFIG_TOML).is_file()
        else f"{checkpoint} lies in no run directory"
    )
    return (
        f"model.init_from = {identity} is not the base {checkpoint / COMPLETE_FILE} records, {was}, and no "
        f"RUN/base/{BASE_JSON} records that base's weights to compare it with ({where}); resume from "
        f"RUN/checkpoints/{checkpoint.name} of its run, whose RUN/base/ records them, or set model.init_from "
        f"to {was} (the checkpoint's record stands in for it"
        + (": a hub commit is not downloaded again)" if hub_id(was) is not None else ", gone or not)")
    )


def base_record_sha256(run_dir: str | Path) -> str | None:
    """The sha256 of RUN/base/base.json, or None (a run from scratch): what a checkpoint records of
    it (training/checkpoint/record.py BASE_RECORD)."""
    path = Path(run_dir) / BASE_DIR / BASE_JSON
    return file_sha256(path) if path.is_file() else None


def check_kept_base(run_dir: str | Path, checkpoint: str | Path | None = None) -> dict[str, Any] | None:
    """RUN/base/base.json as the run's checkpoint `checkpoint` (None: its newest) recorded it: deleted
    or replaced since, the exports of a run from a base took the dataset's tokenizer and special
    tokens instead of the base's, step 0's export went unchecked, and a resume's checkpoints then
    recorded no base, exit 0 (review R22f S1, S2). Nothing to compare for a run without checkpoints,
    or whose checkpoints record no base. Then each file base.json lists, there, and tokenizer.json as
    base.json records it (TOKENIZER_SHA256; a record from before it has none to compare). Returns
    base.json (read_base_record)."""
    folder = Path(run_dir) / BASE_DIR
    restore = (
        f"and its exports take the base's tokenizer and special tokens from {folder}; restore that folder "
        "from a copy of the run"
    )
    try:
        return _check_kept_base(run_dir, checkpoint, folder, restore)
    except OSError as e:  # a file there that cannot be read: a traceback in verify and export (RV60d 1)
        where = e.filename or folder
        raise GristmillError(f"{where} cannot be read ({e.strerror or e}): {restore}") from None


def _check_kept_base(run_dir: str | Path, checkpoint: str | Path | None, folder: Path, restore: str):
    recorded = newest_base_record(run_dir) if checkpoint is None else base_record_of(checkpoint)
    if recorded is not None:
        ckpt, sha = recorded
        now = base_record_sha256(run_dir)
        if now != sha:
            path = folder / BASE_JSON
            how = "is missing" if now is None else f"is not the one {ckpt.name} recorded (sha256 {now[:12]}…)"
            raise GristmillError(
                f"{path} {how}: the run kept its base's record there when it started (sha256 {sha[:12]}… in "
                f"{ckpt}/COMPLETE), {restore}"
            )
    # The files base.json lists, as kept: a tokenizer.json edited since shipped other ids with every
    # export, and eval scored them, exit 0; one missing was "cannot write" (review RV52a F1, F2).
    record = read_base_record(run_dir)
    for name in record["files"] if record is not None else ():
        path = folder / name
        if not path.is_file():
            raise GristmillError(
                f"{path} is missing: the run kept it from its base when it started, {restore}"
            )
        sha = record.get(TOKENIZER_SHA256) if name == TOKENIZER_JSON else None
        if sha is not None and file_sha256(path) != sha:
            raise GristmillError(
                f"{path} is not the tokenizer.json the run kept from its base when it started (sha256 "
                f"{sha[:12]}… in {folder / BASE_JSON}): the one its data was checked against, {restore}"
            )
    return record


def base_files(run_dir: str | Path) -> dict[str, Path]:
    """{name: path} of the base's files RUN/base/ keeps (none for a run from scratch), as the run's
    checkpoints recorded them (check_kept_base)."""
    record = check_kept_base(run_dir)
    folder = Path(run_dir) / BASE_DIR
    return {} if record is None else {name: folder / name for name in record["files"]}
