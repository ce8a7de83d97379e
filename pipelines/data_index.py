"""`gristmill data index DIR`: give a dataset built before the loader index existed its index/.

The writer's side of the index (training/contract/dataset_index.py holds the format, the derivation
from the manifest and the reader); the build's finalize writes the index itself.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.dataset_lock import dataset_lock
from training.contract.atomic_write import write_atomic
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import (
    BEFORE_INDEX_SUFFIX,
    DATASET_JSON,
    DOCUMENTS_SUM,
    MANIFEST_DIR,
    REWRITE_DATASET_JSON,
    DatasetError,
    check_fingerprint,
    dataset_json_writable,
    fingerprint,
    read_dataset_info,
    unlike_record,
    write_dataset_info,
)
from training.contract.dataset_index import (
    DOC_HASHES,
    DOC_TOKENS,
    INDEX_DIR,
    SHARD_ROWS,
    DocIndex,
    IndexRecordEdited,
    damaged_files,
    index_format,
    sum_doc_hashes_file,
    unlike_manifest,
    write_index,
    wrong_sum,
)
from training.contract.disk_space import fmt_bytes
from training.contract.object_store import is_url


def index_dataset(root: str | Path, log=print) -> dict[str, Any]:
    """Give `root` a loader index and record it in dataset.json; returns the new dataset.json.

    Idempotent: an index whose files hash as recorded is left alone. A missing or damaged one is
    derived again from the manifest; dataset.json is then replaced atomically (the commit point).
    Adding an index changes the fingerprint (it covers the index), so the old one is kept as
    `fingerprint_before_index` and the loader accepts checkpoints that recorded it: the token
    stream is the same shards in the same order.
    """
    root = Path(root)
    read_dataset_info(root)  # not a dataset: said before the lock's file is written into it
    with dataset_lock(root, f"`gristmill data index {root}`", read_only_ok=True):
        return _index(root, log)


def _index(root: Path, log) -> dict[str, Any]:
    info = read_dataset_info(root)
    check_fingerprint(root, info)
    _check_manifests(root, info)
    entry = info.get("index")
    if entry is not None and entry.get("format") != index_format(info):
        # An index of an older format: derived again in this one (indexed_info: a new fingerprint).
        _check_unchanged(root, info)  # the manifest still derives the older index
        info = _replace_info(root, info, write_index(root, info))
        log(
            f"{root / INDEX_DIR}: index format {entry.get('format')!r} upgraded to {index_format(info)!r} "
            f"(the sample totals and held-out rows epochs are planned from); fingerprint now "
            f"{info['fingerprint'][:12]}…; {_kept(root)}"
        )
        return info
    if entry is not None:
        # doc_sha256.bin read once: hashed as it is summed (the sum recorded or corrected below)
        summed = sum_doc_hashes_file(root, entry)
        bad = damaged_files(root, entry, checked=(DOC_HASHES,) if summed is not None else ())
        if not bad:
            # Intact, so where it and dataset.json's counts disagree (the loader's refusal, whose advice
            # is this command), dataset.json was edited: "complete" alone sent the user round in a loop.
            try:  # what the loader opens: the documents checked, then the tokens as the reader checks
                index = DocIndex(
                    root, info, per_document=False, checked=tuple(entry["files"])
                )  # hashed above
                tokens = int(index.sample_tokens.sum())
                held = f"{int(index.shard_rows[-1]):,} documents, {tokens:,} tokens"
                edited = tokens != int(info["tokens"])
            except IndexRecordEdited:  # the loader's refusal says the edit and its repair (R21e 3, R21f 2e)
                raise
            except DatasetError:
                rows = np.fromfile(root / INDEX_DIR / SHARD_ROWS, "<u8")
                held, edited = f"{int(rows[-1]):,} documents in {len(rows) - 1} shards", True
            if edited:
                raise DatasetError(
                    f"{root / DATASET_JSON} lists {info['documents']:,} documents, {info['tokens']:,} tokens "
                    f"in {len(info['shard_files'])} shards, but its index, which hashes as recorded, holds "
                    f"{held}: {DATASET_JSON} was edited after the build; {REWRITE_DATASET_JSON}"
                )
            log(
                f"{root / INDEX_DIR} is complete ({len(entry['files'])} files hash as {DATASET_JSON} records)"
            )
            return record_documents_sum(root, info, log, _WHERE_WRITABLE, summed)
        log(f"{root / INDEX_DIR}: {', '.join(bad)} missing or damaged; deriving the index again")
        _check_unchanged(root, info)  # before replacing anything: a changed manifest leaves index/ as is
        repaired = write_index(root, info)
        log(f"repaired {root / INDEX_DIR}")
        # the sum the derivation gave: recorded in this run, not a second (review RV32b F4)
        return record_documents_sum(root, info, log, _WHERE_WRITABLE, repaired.get(DOCUMENTS_SUM))
    new = write_index(root, info)
    info = _replace_info(root, info, new)
    docs = new["files"][DOC_TOKENS]["count"]
    size = sum(f["bytes"] for f in new["files"].values())
    log(
        f"indexed {root}: {docs:,} documents, {fmt_bytes(size)} in {INDEX_DIR}/; fingerprint "
        f"{info['fingerprint_before_index'][:12]}… → {info['fingerprint'][:12]}… (runs that recorded the old "
        f"one resume unchanged); {_kept(root)}; `gristmill data validate {root}` re-checks everything"
    )
    return info


def lacks_documents_sum(info: dict[str, Any]) -> bool:
    """Whether dataset.json's index (one written before the record) lacks the sum of its documents'
    sha256 (DOCUMENTS_SUM) that its doc_sha256.bin gives."""
    entry = info.get("index")
    return entry is not None and DOCUMENTS_SUM not in entry and DOC_HASHES in entry["files"]


_WHERE_WRITABLE = "run `gristmill data index` where the dataset is writable to record it"


def record_documents_sum(
    root: Path, info: dict[str, Any], log, unwritable: str, summed: str | None = None
) -> dict[str, Any]:
    """`info` (root's dataset.json, read under the dataset's lock) with the sum of its documents' sha256
    recorded where its index lacks it (lacks_documents_sum): what tells a mixture's two sources that
    are one corpus in another order (training/data/recipe.py), and which a reader of a bucket cannot
    sum (it never fetches doc_sha256.bin). `summed`: the sum the caller has from its own read of a
    doc_sha256.bin that hashes as recorded (`gristmill data index`), which also corrects a recorded
    one that differs (edited or stale); without it, a missing sum is summed here a piece at a time
    (else left to `gristmill data validate`, which names a damaged file) and a recorded one is left
    as it is. The fingerprint covers no sum, so it is unchanged. A dataset.json that cannot be
    written (a read-only copy) is said in one line ending with `unwritable`, what the caller does
    without it, and left as it was; one whose recorded sum is not `summed` is refused (DatasetError,
    wrong_sum): every open that sums it refuses it, and a note and exit 0 read as if a sum were only
    missing (review RV32h N4)."""
    recorded = info.get("index", {}).get(DOCUMENTS_SUM)
    if not (lacks_documents_sum(info) or (recorded is not None and summed not in (None, recorded))):
        return info
    name = root / DATASET_JSON
    said = f"note: could not record the sum of its documents' sha256 in {name}"
    if not dataset_json_writable(root):  # not read (minutes at scale) in vain
        if recorded is not None and summed is not None:
            raise DatasetError(wrong_sum(root, recorded, summed, "read-only"))
        log(f"{said} (read-only): {unwritable}")
        return info
    if summed is None and (summed := sum_doc_hashes_file(root, info["index"])) is None:
        return info
    new = {**info, "index": {**info["index"], DOCUMENTS_SUM: summed}}
    try:
        write_dataset_info(root, new)
    except OSError as e:  # what access() does not foresee (root's capabilities, a mount gone read-only)
        if recorded is not None:
            raise DatasetError(wrong_sum(root, recorded, summed, str(e.strerror or e))) from None
        log(f"{said} ({e.strerror or e}): {unwritable}")
        return info
    was = "" if recorded is None else f" in place of {recorded[:12]}…, which it is not"
    log(f"{name}: recorded the sum of its documents' sha256{was} (fingerprint unchanged)")
    return new


def indexed_info(info: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The dataset.json `gristmill data index` makes of `info` (no index, or an older format's) with
    the index `entry`: the fingerprint covers the index, so it changes; a dataset with no index keeps
    the old one as `fingerprint_before_index` (the same shards in the same order), while one whose
    older index planned epochs another way keeps none (a run on it names the older order, refused)."""
    new = {**info, "index": entry}
    if info.get("index") is None:
        new["fingerprint_before_index"] = info["fingerprint"]
    new["fingerprint"] = fingerprint(new)
    return new


def _replace_info(root: Path, info: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """indexed_info written over dataset.json, which is kept beside it first: the gristmill that wrote
    it reads only it (its index format), and a run that gristmill started finishes only there (this
    version refuses its order: review R26c L1)."""
    new = indexed_info(info, entry)
    kept = root / (DATASET_JSON + BEFORE_INDEX_SUFFIX)
    write_atomic(kept, (root / DATASET_JSON).read_bytes())
    write_dataset_info(root, new)
    return new


def _kept(root: Path) -> str:
    """The line's word on the dataset.json `_replace_info` kept, and what it is for."""
    return (
        f"the replaced {DATASET_JSON} is kept as {root / (DATASET_JSON + BEFORE_INDEX_SUFFIX)} (an older "
        f"gristmill, and a run it started, read the dataset again once it is moved back to {DATASET_JSON})"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", action=PathArgument, help="dataset directory (holds dataset.json, shards/, manifest/)"
    )


def run(args: argparse.Namespace) -> int:
    if is_url(args.dir):  # read as a path, its // collapsed, it was "not found" (review R16b)
        raise DatasetError(
            f"{args.dir}: `gristmill data index` writes into a local dataset directory: index the copy the "
            "bucket's dataset was uploaded from (`gristmill data index DIR`) and upload it to a new prefix "
            "(`gristmill data upload DIR NEW_URL`: the index changes its fingerprint, so the old prefix "
            f"refuses it); a gristmill-shards/1 dataset there is converted instead (`gristmill data convert "
            f"{args.dir} NEW`)"
        )
    index_dataset(args.dir)
    return 0


def _check_manifests(root: Path, info: dict[str, Any]) -> None:
    """The manifests the index is derived from, each against the sha256 dataset.json records (a
    dataset from before that record: none to check), before anything is written: an edited one was
    indexed and the new fingerprint committed (review R17e F4)."""
    if (rel := unlike_record(root, info, lambda rel: rel.startswith(f"{MANIFEST_DIR}/"))) is not None:
        raise DatasetError(
            f"{root / rel}: not the file {DATASET_JSON} records (missing, or its sha256 differs): the "
            "manifest changed after the build; nothing was indexed (rebuild the dataset, or restore it)"
        )


def _check_unchanged(root: Path, info: dict[str, Any]) -> None:
    """The manifest derives the index dataset.json records (unlike_manifest), before it is written again."""
    if bad := unlike_manifest(root, info):
        raise DatasetError(
            f"{root / MANIFEST_DIR}: the index derived from it differs from the one {DATASET_JSON} records "
            f"({', '.join(bad)}): the manifest changed after the build; nothing was indexed (restore it, or "
            "rebuild the dataset)"
        )
