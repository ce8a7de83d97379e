"""`gristmill data convert OLD NEW`: a dataset of an older shard layout (gristmill-shards/1, a tar sample
per document; /2, samples of 64 documents' ids) rewritten in the current one (gristmill-shards/3: a
sample per 64 documents, their lengths and sha256 then their ids, what a bucket is read by range
with), with the same documents in the same manifest rows and the same shards.

The loader's order is a function of the documents' lengths in manifest order (training/data/order.py),
so NEW gives OLD's batches bit for bit (`gristmill data inspect --hash` equal, checked here on the
index: the per-document token counts are the same bytes), and NEW's dataset.json records OLD's
fingerprint (`converted_from`, covered by NEW's own), so a run trained on OLD resumes on NEW. OLD or
NEW may be an s3:// URL: OLD's files are fetched into the cache (each checked by sha256), NEW is
written in a local work directory and uploaded (`gristmill data upload`'s code), dataset.json last.
NEW is validated before it counts as done. OLD is never changed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from pipelines.data_index import indexed_info
from pipelines.dataset_lock import LOCK, dataset_lock
from pipelines.shard_writer import ShardWriter, finalize_dataset
from pipelines.task_upload import is_task_record
from pipelines.upload import upload_dataset
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import (
    DATASET_JSON,
    FORMAT,
    LEGACY_FORMAT,
    MANIFEST_DIR,
    MANIFEST_FIELDS,
    PROVENANCE_COLUMNS,
    RECORDED_FILES,
    SHARDS_DIR,
    TAR_BLOCK,
    TOKENIZER_JSON,
    DatasetError,
    check_fingerprint,
    check_last_validation,
    dataset_files,
    fingerprint_before_index,
    index_hashes,
    is_recorded_path,
    manifest_files,
    numpy_dtype,
    read_dataset_info,
    recorded_paths,
    shard_name,
    source_columns,
    source_disagreement,
    tar_padded,
    task_of_file,
    tokenizer_problem,
    unlike_record,
)
from training.contract.dataset_index import (
    DOC_HASHES,
    DOC_TOKENS,
    INDEX_DIR,
    INDEX_NAMES,
    expected_index,
    index_format,
    unlike_manifest,
)
from training.contract.disk_space import check_free
from training.contract.errors import GristmillError, Terminated, sigterm_raises
from training.contract.object_store import ObjectStore, ObjectStoreError, ObjectURL, is_url, refuse_other_urls
from training.contract.separator_check import documents_breaking
from validation.validate import VALIDATION_JSON, check_shard_bytes, format_report, validate_dataset

# dataset.json keys finalize_dataset computes; every other key of OLD's (tasks, decontaminate …) is kept.
_DERIVED = {
    "format", "tokenizer_sha256", "vocab_size", "dtype", "separator", "config_sha256", "documents",
    "tokens", "shards", "shard_files", "created", "index", "files", "fingerprint", "status",
    "fingerprint_before_index", "converted_from",
}  # fmt: skip
# The first path component of every object a dataset puts in its prefix (what `data upload` writes)
_DATASET_PATHS = {SHARDS_DIR, INDEX_DIR, TOKENIZER_JSON, VALIDATION_JSON} | {
    pattern.split("/")[0] for pattern in RECORDED_FILES
}
NO_TARGET = 1 << 62  # the writer never closes a shard itself: each of OLD's ends where it ended


WORK_PREFIX = "gristmill-convert-"  # a conversion's work folder in the temporary directory
KEPT_PREFIX = "gristmill-converted-"  # a conversion its upload failed to put in the bucket: the user's
WORK_LOCK = ".owner.lock"  # in it: flock-ed by the conversion while it runs
UNLOCKED_AFTER_S = 3600  # a work folder without a lock this old is a killed conversion's


def _remove_dead_work() -> None:
    """The work folders of conversions that were killed (a bucket's copy of OLD, or NEW before its
    upload: a dataset's size each; review R20b M5): those whose lock no process holds. A lock, not a
    pid: a pid of another host or container sharing the folder looks dead here (review R20c 3)."""
    for d in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        try:
            fd = os.open(d / WORK_LOCK, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # being made now, or left by a version without the lock (R20d 4)
            with contextlib.suppress(OSError):
                if time.time() - d.stat().st_mtime > UNLOCKED_AFTER_S:
                    shutil.rmtree(d, ignore_errors=True)
            continue
        except OSError:  # another user's: left alone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its conversion runs
            continue
        finally:
            os.close(fd)
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def _work_folder():
    """A new work folder, locked (WORK_LOCK) while inside and removed after: the lock file is locked
    before it gets its name, so no cleaner ever finds it unlocked while this runs."""
    _remove_dead_work()
    with tempfile.TemporaryDirectory(prefix=WORK_PREFIX) as work:
        tmp = Path(work) / f"{WORK_LOCK}.new"
        with open(tmp, "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            tmp.rename(Path(work) / WORK_LOCK)
            yield work


def convert_dataset(old: str, new: str, log=print) -> dict[str, Any]:
    """Rewrite the older-layout dataset at `old` (a directory or s3:// URL) as `new` (module docstring);
    returns NEW's dataset.json."""
    for where in (old, new):
        if is_url(where):  # a wrong bucket is one line before any work
            ObjectStore(ObjectURL.parse(where)).check_bucket()
    _refuse_current(old)
    _check_new(old, new)
    with _work_folder() as work:
        root = _bucket_copy(old, Path(work) / "old") if is_url(old) else Path(old)
        # Written beside NEW and renamed into place once validated: a conversion cut short leaves no NEW.
        out = Path(work) / "new" if is_url(new) else _converting(new)
        recorded = read_dataset_info(root)
        was = recorded["format"]
        if is_url(new):
            _check_leftovers(old, new, recorded)
        with _writing(old, new, out):
            try:
                info = _convert(old, root, out, new, log)
            except OSError as e:
                # a write into NEW's folder past the check of its room (a disk filled meanwhile, a quota,
                # an estimate short): a traceback (trial RV77a 4); what it wrote goes with the refusal
                # (a write's error names no file; one of OLD's reads is not this one)
                ours = e.filename is not None and Path(e.filename).resolve().is_relative_to(out.resolve())
                if not (ours or e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)):
                    raise
                where = (
                    "TMPDIR on a larger disk (a bucket's NEW is written there first)"
                    if is_url(new)
                    else "NEW on a larger disk"
                )
                raise DatasetError(
                    f"cannot write the converted {old} into {out}: {e.strerror or e}; nothing of it was "
                    f"kept: free some space, or put {where}, and run the conversion again"
                ) from None
            if is_url(new):
                # its lines name what was uploaded, not the work folder gone when this ends (RV54a 11),
                # and its refusals the command to run again, not `data upload` of it (RV55d 6)
                said = lambda text: text.replace(
                    f"gristmill data upload {out} {new}", f"gristmill data convert {old} {new}"
                ).replace(str(out), "the conversion")
                try:
                    upload_dataset(out, new, lambda line: log(said(line)))
                except ObjectStoreError as e:  # the store failed: the conversion, hours at scale, is kept
                    raise DatasetError(f"{e}; {_kept_for_upload(out, new)}") from None  # (trial RV62a F4)
                except (KeyboardInterrupt, Terminated):  # a Ctrl-C or SIGTERM: kept too (RV62f 4, RV62g 7)
                    print(_kept_for_upload(out, new), file=sys.stderr)
                    raise
                except DatasetError as e:
                    raise DatasetError(said(str(e))) from None
            else:
                try:
                    if Path(new).exists():
                        Path(new).rmdir()  # empty (checked above)
                    os.replace(out, new)  # its lock file with it: held until the end, as any writer's
                except OSError as e:  # a file put in NEW meanwhile: a traceback, the conversion deleted
                    raise _Kept(  # (trial RV62a F3); a rerun would empty it and convert again (RV62e 8)
                        f"{new} changed while the conversion ran ({e.strerror}): the validated conversion is "
                        f"kept in {out}: move it to a path that is not there yet (mv {out} NEW2); a "
                        "conversion into NEW again would start over in it"
                    ) from None
        # said once it is there, under the name the user gave (it named the folder it was written in)
        checked = (  # a bucket's validation.json comes only from validating the bucket (trial T38 L9)
            f"validated before its upload (`gristmill data validate {new}` checks the bucket and writes its "
            "validation.json)"
            if is_url(new)
            else "validated"
        )
        log(
            f"converted {old} ({was}) into {new} ({FORMAT}): {info['documents']:,} documents in "
            f"{info['shards']} shards, the same batches (runs trained on it resume on this one); {checked}"
        )
        return info


@contextlib.contextmanager
def _writing(old: str, new: str, out: Path) -> Iterator[None]:
    """`out`, the folder a local NEW is written in, locked as a build locks its output and emptied (a
    killed conversion's is left): two conversions into one NEW at once removed each other's files
    (review R26c m1); the second is refused in one line. A bucket's NEW is written in this
    conversion's own work folder."""
    if is_url(new):
        yield
        return
    with dataset_lock(out, f"`gristmill data convert {old} {new}`", writing=new):
        try:
            _check_new(old, new)  # again: NEW may be one that a conversion finished meanwhile
            for p in out.iterdir():
                if p.name != LOCK:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            yield
        except _Kept:
            raise
        except BaseException:
            # a refusal keeps nothing of `out`: a dataset's size beside NEW, or, for the conversion
            # that lost the race for NEW, the folder with its lock file (review RV26d m1)
            shutil.rmtree(out, ignore_errors=True)
            raise


class _Kept(DatasetError):
    """A conversion finished and validated that could not be put in NEW's place: its folder stays."""


def _kept_for_upload(out: Path, new: str) -> str:
    """A bucket NEW's validated conversion `out`, its upload failed, moved out of the work folder (which
    goes with this conversion) into one of the temporary directory's own; what finishes the job."""
    kept = Path(tempfile.mkdtemp(prefix=KEPT_PREFIX))
    os.replace(out, kept / "new")
    return (
        f"the validated conversion is kept in {kept / 'new'}: `gristmill data upload {kept / 'new'} {new}` "
        f"uploads it (only what is missing or differs), then remove {kept}"
    )


def _converting(new: str) -> Path:
    """The folder a local NEW is written in, beside it, renamed into place once validated."""
    return Path(new).with_name(f".{Path(new).name}.converting")


def _held_already(
    old: str, new: str, new_json: bytes | None, place: str, listed: dict[str, int] | None = None
) -> str:
    """What to do about a NEW that holds something (`new_json`: its dataset.json, if any; `listed`: a
    bucket NEW's objects and sizes): nothing, where that says it is OLD's conversion (its converted_from
    names OLD's fingerprint: a rerun of one that finished before its kill was told to use another
    `place`, trial RV60g F3), and its shards are there, else another place."""
    done = False
    if new_json is not None:  # OLD read only for a NEW that is a dataset
        try:
            was = json.loads(new_json)["converted_from"]["fingerprints"]
            raw = ObjectStore(ObjectURL.parse(old)).get(DATASET_JSON) if is_url(old) else None
            info = json.loads(raw) if raw is not None else read_dataset_info(old)
            done = isinstance(was, list) and info["fingerprint"] in was
        except (GristmillError, OSError, ValueError, KeyError, TypeError):
            pass
    # its shards there at their sizes (a local NEW's files, a bucket's listing), or the rerun said
    # "nothing to redo" of a NEW that lost one since (trial RV67b F6; of a bucket NEW, RV77a 3)
    if done and listed is None:
        shards = (p for p in Path(new, SHARDS_DIR).glob("*") if p.is_file())
        listed = {f"{SHARDS_DIR}/{p.name}": p.stat().st_size for p in shards}
    lost = _shards_not_there(listed or {}, json.loads(new_json)) if done else []
    if lost:
        return (
            f"{old}'s conversion, finished, but {new} lacks {', '.join(lost[:3])} (or holds it at another "
            f"size) since: delete {new} and convert again (`gristmill data validate {new}` says what else)"
        )
    if done:
        return (
            f"{old}'s conversion, finished (its converted_from records {old}'s fingerprint): nothing to "
            f"redo, train from {new}"
        )
    return f"convert into a new {place} (OLD is never changed)"


def _shards_not_there(listed: dict[str, int], info: dict[str, Any]) -> list[str]:
    """The shards dataset.json `info` of NEW lists that are not in NEW (`listed`: its files' sizes) at
    their recorded sizes."""
    shards = sorted((info.get("shard_files") or {}).items())
    return [f"{SHARDS_DIR}/{n}" for n, spec in shards if listed.get(f"{SHARDS_DIR}/{n}") != spec.get("bytes")]


def _check_new(old: str, new: str) -> None:
    """NEW is a new place: refused in one line before any work when it holds something (an upload cut
    short, which has no dataset.json yet, is resumed), is a file or a link, lies inside OLD, or OLD
    lies inside it or its work folder (`_converting`, which the conversion empties and removes: OLD
    was deleted, review RV26d L1)."""
    if is_url(new):
        a, b = ObjectURL.parse(old) if is_url(old) else None, ObjectURL.parse(new)
        inside = lambda x, y: not y.prefix or f"{x.prefix}/".startswith(f"{y.prefix}/")  # noqa: E731
        if a is not None and a.bucket == b.bucket and (inside(b, a) or inside(a, b)):
            raise DatasetError(
                f"{new} and {old} overlap (one inside the other): convert into a prefix apart from OLD "
                "(OLD is never changed)"
            )
        there = ObjectStore(b).list()
        if DATASET_JSON in there:
            done = _held_already(old, new, ObjectStore(b).get(DATASET_JSON), "prefix", there)
            raise DatasetError(f"{new} already holds a dataset (its {DATASET_JSON}): {done}")
        # what an upload cut short leaves is a dataset's own paths; anything else was refused by the
        # upload only after the whole conversion (review R17f F4)
        other = sorted(r for r in there if r.split("/", 1)[0] not in _DATASET_PATHS and not is_task_record(r))
        if other:
            raise DatasetError(
                f"{new} already holds {len(other)} object(s) that are no dataset's (e.g. {other[0]}): "
                "convert into an empty prefix"
            )
        return
    path = Path(new)
    if path.name in ("", ".."):  # ".", "/", "..": no name for the folder NEW is written in, beside it
        raise DatasetError(
            f"{new} names no directory of its own (the conversion writes NEW beside it, as .NAME.converting, "
            "and renames it into place): name a new directory, e.g. ./converted"
        )
    work = _converting(new)
    if work.is_symlink() or (work.exists() and not work.is_dir()):
        # followed, the folder it names was emptied: OLD's shards, where it led into OLD (trial RV62a F2)
        raise DatasetError(
            f"{work} is {'a link' if work.is_symlink() else 'a file'}, where a conversion into {new} writes "
            f"it: no conversion left it; move it away (mv {work} …), then run again"
        )
    if not is_url(old):
        here, work = Path(old).resolve(), work.resolve()
        if here == path.resolve():  # it said "OLD is OLD (OLD), which…" (trial RV74c 8)
            raise DatasetError(
                f"OLD and NEW are one directory ({old}): convert into a new directory apart from it (OLD is "
                "never changed)"
            )
        for p, what in ((path.resolve(), new), (work, f"the folder a conversion into {new} is written in")):
            if here.is_relative_to(p):
                raise DatasetError(
                    f"{old} {'is' if here == p else 'lies inside'} {what} ({p}), which the conversion "
                    f"empties: convert into a NEW apart from {old} (OLD is never changed)"
                )
        if path.resolve().is_relative_to(here):  # and so is its work folder, beside it
            raise DatasetError(
                f"{new} is inside {old}: convert into a directory outside it (OLD is never changed)"
            )
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise DatasetError(f"{new} is {'a link' if path.is_symlink() else 'a file'}: name a new directory")
    if path.is_dir() and os.path.ismount(path):  # renamed into place, the converted NEW was lost (RV54a 3)
        raise DatasetError(
            f"{new} is a mount point: the conversion writes NEW beside it and renames it into place, which "
            f"a mount point cannot be; convert into a new directory inside it, e.g. {path / 'converted'}"
        )
    if path.exists() and any(path.iterdir()):
        held = (path / DATASET_JSON).read_bytes() if (path / DATASET_JSON).is_file() else None
        raise DatasetError(f"{new} exists and is not empty: {_held_already(old, new, held, 'directory')}")


def _check_leftovers(old: str, new: str, info: dict[str, Any]) -> None:
    """A bucket NEW's shards left by an upload cut short are this conversion's (NEW keeps OLD's shard
    names): one OLD does not list is another dataset's, whose upload the final upload refused only
    after the whole conversion, in its own words (trial RV54a 5). Refused before any work."""
    mine = {f"{SHARDS_DIR}/{name}" for name in info["shard_files"]}
    there = ObjectStore(ObjectURL.parse(new)).list()
    if info.get("files") is None:  # a dataset from before the record: its shards are what is known
        other = sorted(r for r in there if r.startswith(f"{SHARDS_DIR}/") and r not in mine)
    else:
        # every file NEW keeps OLD's name for (manifests, excluded, stats, decontam/), NEW's index, the
        # tokenizer: any other object was refused by the upload after the whole conversion, whose work
        # it threw away (trial RV60a 4, review RV60f 2)
        mine |= set(dataset_files(info)) | {f"{INDEX_DIR}/{name}" for name in INDEX_NAMES}
        mine |= {TOKENIZER_JSON, VALIDATION_JSON}
        other = sorted(r for r in there if r not in mine and not is_task_record(r))
    if other:
        raise DatasetError(
            f"{new} already holds {len(other)} object(s) that {old} does not have (e.g. {other[0]}): another "
            "dataset's upload cut short; convert into an empty prefix, or delete those objects first"
        )


def _check_manifests(old: str, root: Path, info: dict[str, Any]) -> None:
    """OLD's manifests, before any work: each a build's (manifest/NNNNN.parquet), naming only shards
    dataset.json lists, every listed shard named, the documents and tokens dataset.json records
    (review R17c M3). A stray copy, a leftover of another build and a listed shard without rows were
    tracebacks or a NEW short of documents; an edited `documents` went unsaid (review R26c M4, m3)."""
    documents = tokens = 0
    named: set[str] = set()
    recorded = info.get("files")
    for path in manifest_files(root):
        rel = f"{MANIFEST_DIR}/{path.name}"
        if task_of_file(rel) is None or (recorded is not None and rel not in recorded):
            raise DatasetError(
                f"{_where(old, root, rel)}: not a manifest of {old}'s build ("
                + ("manifest/NNNNN.parquet" if recorded is None else f"one its {DATASET_JSON} records")
                + f"): a copy or a leftover; move it out of {old}, then convert again"
            )
        t = pq.read_table(path, columns=["shard", "n_tokens"])
        shards = set(t.column("shard").to_pylist())
        if unlisted := sorted(shards - set(info["shard_files"])):
            raise DatasetError(
                f"{_where(old, root, rel)}: its rows name shard {unlisted[0]}, which {DATASET_JSON} does "
                f"not list (a leftover of another build): move it and {SHARDS_DIR}/{unlisted[0]} out of "
                f"{old}, then convert again"
            )
        named |= shards
        documents, tokens = documents + t.num_rows, tokens + int(sum(t.column("n_tokens").to_pylist()))
    # every listed shard there, of its recorded size: one missing near the end was found only once the
    # shards before it were converted (review RV26d m3)
    there = ObjectStore(ObjectURL.parse(old)).list(f"{SHARDS_DIR}/") if is_url(old) else None
    for name, spec in sorted(info["shard_files"].items()):
        rel = f"{SHARDS_DIR}/{name}"
        size = there.get(rel) if there is not None else _size(old, root, rel)
        if size != spec["bytes"]:
            raise _shard_error(old, root, rel, "missing" if size is None else None)
    if missing := sorted(set(info["shard_files"]) - named):
        raise DatasetError(
            f"{old}: no manifest row names {SHARDS_DIR}/{missing[0]}, which {DATASET_JSON} lists: a "
            f"manifest is missing; restore it (nothing was converted)"
        )
    if (documents, tokens) != (info["documents"], info["tokens"]):
        # the manifests checked against their record: dataset.json's totals are the edit; without a
        # record nothing has told yet which side changed (review RV26d m2)
        what = (
            f"{DATASET_JSON} was edited"
            if recorded is not None
            else f"a manifest or {DATASET_JSON}'s documents/tokens was edited"
        )
        raise DatasetError(
            f"{old}: its manifests list {documents:,} documents of {tokens:,} tokens, but {DATASET_JSON} "
            f"records {info['documents']:,} of {info['tokens']:,}: {what} after the build; nothing was "
            f"converted (`gristmill data validate {old}` lists it)"
        )


def _where(old: str, root: Path, rel: str) -> str:
    """OLD's file `rel` as a message names it: a bucket's object, never its copy in the work folder
    (`root`), which is gone when the message is read (review RV26d M3)."""
    return f"{old.rstrip('/')}/{rel}" if is_url(old) else str(root / rel)


def _size(old: str, root: Path, rel: str) -> int | None:
    """The size of OLD's file `rel`; None when it is missing; one that cannot be read (a link to
    itself, a permission) is its refusal (_shard_error), not a traceback (review RV26h M2)."""
    try:
        return (root / rel).stat().st_size
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _shard_error(old, root, rel, e.strerror or type(e).__name__) from None


def _already_current(old: str) -> DatasetError:
    return DatasetError(f"{old} is already a {FORMAT} dataset, the current layout: nothing to convert")


def _refuse_current(old: str) -> None:
    """OLD already in the current layout, refused first, from its dataset.json alone: NEW's checks came
    first ("NEW already holds a dataset" of a NEW that did), and a bucket OLD's manifests were fetched
    before (trial RV77a 7). One that cannot be read here is the conversion's own reads' to name."""
    try:
        if is_url(old):
            raw = ObjectStore(ObjectURL.parse(old)).get(DATASET_JSON)
        else:
            raw = Path(old, DATASET_JSON).read_bytes()
        fmt = json.loads(raw).get("format")
    except Exception:  # noqa: BLE001 - said by the reads that follow
        return
    if fmt == FORMAT:
        raise _already_current(old)


def _bucket_copy(url: str, dest: Path) -> Path:
    """A bucket dataset's dataset.json and recorded files but its shards and index (the shards are
    read one at a time, `_shard_bytes`); `_check_recorded` then checks them."""
    store = ObjectStore(ObjectURL.parse(url))
    dest.mkdir(parents=True)
    (dest / DATASET_JSON).write_bytes(store.get(DATASET_JSON))
    try:
        info = read_dataset_info(dest)
    except DatasetError as e:  # named in the bucket: the copy's path is gone once this ends (RV54a 6a)
        raise DatasetError(str(e).replace(str(dest), url.rstrip("/"))) from None
    wanted = list(_recorded(info))
    if info.get("files") is None:  # a dataset from before the record: the files a build wrote, as a
        # local OLD's are found (`recorded_paths`); none fetched, its manifests were "missing" (RV54a 7)
        wanted += [rel for rel in store.list() if is_recorded_path(rel)]
    for rel in wanted:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(store.get(rel))
    return dest


def _recorded(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The files OLD's dataset.json records a sha256 for (dataset_files) but its shards, checked as
    each is read (`_shard_bytes`), and its index, which NEW's build writes anew."""
    return {rel: spec for rel, spec in dataset_files(info).items() if _checked_before(rel)}


def _checked_before(rel: str) -> bool:
    return rel.split("/")[0] not in (SHARDS_DIR, INDEX_DIR)


def _check_recorded(old: str, root: Path, info: dict[str, Any]) -> None:
    """Each of `_recorded`'s files checked against its sha256 before any work: what is converted is OLD
    as it was built. A manifest or tokenizer.json replaced since would otherwise become NEW's own,
    recorded anew, under `converted_from`'s claim that NEW is OLD's data (review R17b S1, S2)."""
    if (rel := unlike_record(root, info, _checked_before)) is not None:
        raise DatasetError(
            f"{_where(old, root, rel)}: not the file {DATASET_JSON} records (missing, or its sha256 "
            f"differs): damaged or replaced since the build; nothing was converted (`gristmill data "
            f"validate {old}` lists it)"
        )


# NEW's bytes beyond its ids, measured on 600 documents of 3 tokens, one to a shard (test_convert): per
# document its .docs record, index entries and manifest row (~102); per shard tar's end-of-archive
# blocks, padded to its 10 KiB record, and its entries in dataset.json and validation.json (~236)
PER_DOCUMENT_BYTES = 128
PER_SHARD_BYTES = 10240 + 512


def converted_size(root: Path, info: dict[str, Any]) -> float:
    """The bytes NEW will take, at least: its ids (the token bytes), each 64-document block's tar headers
    and the manifests: ~1.1×; and what grows with the documents and shards, not the tokens: each
    document's and each shard's records and each shard's tar end padding (short documents in small
    shards: 712 KB against an estimate of 387 KB without them, trial RV77a 4)."""
    return (
        1.1 * int(info["tokens"]) * numpy_dtype(info["dtype"]).itemsize
        + sum(p.stat().st_size for p in manifest_files(root))
        + PER_DOCUMENT_BYTES * int(info["documents"])
        + PER_SHARD_BYTES * len(info["shard_files"])
    )


def _convert(old: str, root: Path, out: Path, target: str, log) -> dict[str, Any]:
    """OLD (its files, but a bucket's shards, at `root`) rewritten into the new directory `out`, to
    become NEW (`target`)."""
    info = read_dataset_info(root)
    check_fingerprint(old, info)
    if info["format"] == FORMAT:
        raise _already_current(old)
    if not is_url(old):  # a bucket's validation.json is the bucket's own, never the copy's
        check_last_validation(root, info)
        if why := tokenizer_problem(root, info):  # one dropped in beside a dataset that records none too
            raise DatasetError(f"{why}; nothing was converted")
    _check_recorded(old, root, info)
    _check_manifests(old, root, info)
    # OLD's index (covered by its fingerprint) is the record of which document each row read, where
    # its manifests have none: an edit since (two rows' offsets swapped) gave NEW other documents at
    # those rows, "the same batches" (review R26c S1)
    if "index" in info and (bad := unlike_manifest(root, info)):
        raise DatasetError(
            f"{old}: its manifests give another index than the one {DATASET_JSON} records "
            f"({', '.join(bad)}): a manifest was edited or replaced since the build; nothing was converted "
            f"(`gristmill data validate {old}` lists it)"
        )
    dtype = numpy_dtype(info["dtype"])
    fields = [f.name for f in MANIFEST_FIELDS]
    out.mkdir(parents=True, exist_ok=True)
    # NEW's size, before any work: a full disk was an OSError traceback after ~170 shards (trial RV54a 4)
    check_free(
        out,
        converted_size(root, info),
        what=f"write the converted {old}",
        advice=(
            "free some space, or set TMPDIR to a larger disk (a bucket's NEW is written there first)"
            if is_url(target)
            else "free some space, or convert into a directory on a larger disk"
        ),
    )
    shards = sorted(info["shard_files"])
    done = 0
    read = hashlib.sha256()  # of each document's ids' sha256 as read from OLD, in manifest order
    for path in manifest_files(root):
        named = _where(old, root, f"{MANIFEST_DIR}/{path.name}")
        rows = pq.read_table(path).to_pylist()
        writer = ShardWriter(out, int(path.stem), info["vocab_size"], target_bytes=NO_TARGET)
        groups = _by_shard(rows)
        if [shard for shard, _ in groups] != [shard_name(writer.task, i) for i in range(len(groups))]:
            raise DatasetError(  # the writer names task t's shards so: NEW keeps OLD's names
                f"{named}: its rows' shards are not {shard_name(writer.task, 0)}, … in order, as builds name "
                "them: the manifest was edited by hand; nothing was converted"
            )
        for shard, members in groups:
            data = _shard_bytes(old, root, shard, info)
            if info.get("files") is None:  # a recorded manifest is the build's (sha256 checked above)
                _check_rows(old, named, shard, data, info, members)
            docs = [np.frombuffer(data, dtype, r["n_tokens"], r["offset"]) for r in members]
            _check_documents(old, root, shard, info, members, docs)
            for r, ids in zip(members, docs):
                read.update(hashlib.sha256(ids).digest())
                if info["format"] == LEGACY_FORMAT:
                    meta = _legacy_meta(named, r, data)
                else:
                    meta = {k: r.get(k) for k in fields}
                provenance = {name: r.get(name) for name, _ in PROVENANCE_COLUMNS}
                writer.add(r["key"], ids, {k: v for k, v in meta.items() if v is not None}, provenance)
            writer.end_shard()  # OLD's shard, and only its documents (a last sample of fewer than 64)
            done += 1
            log(f"converted {shard} ({done}/{len(shards)} shards)")
        writer.close()
    # The files OLD's dataset.json records (checked above; NEW records them anew, so a file dropped in
    # beside OLD's is not carried); a dataset from before the record, every such file it holds.
    recorded = info.get("files")
    for rel in sorted(recorded) if recorded is not None else recorded_paths(root):
        if Path(rel).match("manifest/*.parquet"):
            continue
        src = root / rel
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    # OLD's identities: its fingerprint, the one before an index was added, and, when OLD lacks this
    # version's index, the one `gristmill data index` gives it (what a run of this version trained on,
    # indexed where it trained, recorded; this copy not indexed: review R26c M3).
    was = [info["fingerprint"]] + (
        [fingerprint_before_index(info)] if "fingerprint_before_index" in info else []
    )
    if (info.get("index") or {}).get("format") != index_format(info):
        was.append(indexed_info(info, expected_index(root, info))["fingerprint"])
    kept = {k: v for k, v in info.items() if k not in _DERIVED}
    tokenizer = root / TOKENIZER_JSON  # the one OLD records (checked above), or none
    new = finalize_dataset(
        out,
        vocab_size=info["vocab_size"],
        separator=info["separator"],
        config_sha256=info["config_sha256"],
        tokenizer_path=tokenizer if info["tokenizer_sha256"] != "none" else None,
        extra={**kept, "converted_from": {"format": info["format"], "fingerprints": was}},
    )
    # The order is a function of the lengths in manifest order: NEW's the same bytes as OLD's recorded
    # ones (and, from a /2 dataset, the same sha256 per row), or not the same batches. The checks above
    # are of OLD; this one is of what the conversion wrote (NEW's own validate cannot see a reordering).
    # Against OLD as read, whatever index OLD records (a /1 one has no sha256s, one built before the
    # index none): the lengths its manifest derives, each document's ids' sha256 (review RV26h M1)
    after = index_hashes(new["index"])
    derived = {DOC_TOKENS: index_hashes(expected_index(root, info))[DOC_TOKENS], DOC_HASHES: read.hexdigest()}
    expected = [(f"{old}'s documents as they were read", derived)]
    if "index" in info:
        expected.append((f"the one {old}'s {DATASET_JSON} records", index_hashes(info["index"])))
    for k, (what, hashes) in enumerate(expected):
        if differ := [n for n in (DOC_TOKENS, DOC_HASHES) if n in hashes and hashes[n] != after[n]]:
            if k:  # NEW holds OLD's documents as read, which are not what OLD records: OLD's fault, not
                # the conversion's, which blamed itself (trial RV67b F3)
                raise DatasetError(
                    f"{old}'s documents as read are not what its {DATASET_JSON} records ({', '.join(differ)} "
                    f"of its index): a document of {old} was damaged; `gristmill data validate {old}` names "
                    "it, and its repair; nothing was converted"
                )
            raise DatasetError(
                f"{target}: its index ({', '.join(differ)}) differs from {what}: the conversion did not "
                "keep OLD's documents in order; nothing was converted (please report it)"
            )
    report = validate_dataset(out, progress=False, shown_as=target)
    if not report.ok:
        raise DatasetError(f"{out}: the converted dataset does not validate:\n{format_report(report)}")
    return new


def _check_documents(
    old: str,
    root: Path,
    shard: str,
    info: dict[str, Any],
    members: list[dict[str, Any]],
    docs: list[np.ndarray],
) -> None:
    """OLD's documents in `shard` hold what its dataset.json records, as they are read: the separator
    once each, in its place, and ids below vocab_size. An OLD whose record was edited (a separator id,
    a vocab_size: outside the fingerprint) was found only by NEW's validation once every shard was
    written, in ~60 lines that blamed NEW (trial RV54a 6b)."""
    sep, vocab = info["separator"], int(info["vocab_size"])
    lengths = np.array([len(d) for d in docs], np.int64)
    ids = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    bad, counts, _ = documents_breaking(ids, int(sep["id"]), sep["position"], lengths)  # validate's rule
    why = None
    if bad.size and lengths[bad[0]] == 1 and counts[bad[0]] == 1:
        # no edit: a build before 2026-11-29 wrote one for a text that encodes to no token, and the
        # refusal called it a missing separator and OLD edited (trial RV67b F4)
        raise DatasetError(
            f"{_where(old, root, f'{SHARDS_DIR}/{shard}')}: document {members[int(bad[0])]['key']} is the "
            f"separator alone (1 token), two separators side by side in the stream (a doubled separator), "
            "which builds before 2026-11-29 wrote for a text that encodes to no token; a conversion keeps "
            f"every document, so rebuild {old} from its source with this version (which excludes such a "
            "text); nothing was converted"
        )
    if bad.size:
        key, where = members[int(bad[0])]["key"], "its last" if sep["position"] == "after" else "its first"
        why = f"document {key} does not hold the separator (id {sep['id']}) once, as {where} token"
    elif ids.size and int(ids.max()) >= vocab:
        why = f"it holds id {int(ids.max())}, past vocab_size {vocab}"
    if why:
        raise DatasetError(
            f"{_where(old, root, f'{SHARDS_DIR}/{shard}')}: {why}, as {DATASET_JSON} records: {old} is not "
            f"the dataset its record describes (edited since its build?); nothing was converted "
            f"(`gristmill data validate {old}` lists every such problem)"
        )


def _by_shard(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """A task's manifest rows grouped by shard, in manifest order (the build writes them so)."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for r in rows:
        if not out or out[-1][0] != r["shard"]:
            out.append((r["shard"], []))
        out[-1][1].append(r)
    return out


def _shard_bytes(old: str, root: Path, name: str, info: dict[str, Any]) -> bytes:
    """A shard's bytes (read in place, or a bucket's downloaded), checked against the sha256 dataset.json
    records: what is converted is OLD as it was built."""
    rel = f"{SHARDS_DIR}/{name}"
    try:
        data = ObjectStore(ObjectURL.parse(old)).get(rel) if is_url(old) else (root / rel).read_bytes()
    except OSError as e:
        missing = isinstance(e, FileNotFoundError)
        raise _shard_error(old, root, rel, "missing" if missing else e.strerror) from None
    spec = info["shard_files"][name]
    if len(data) != spec["bytes"] or hashlib.sha256(data).hexdigest() != spec["sha256"]:
        raise _shard_error(old, root, rel)
    return data


def _shard_error(old: str, root: Path, rel: str, unreadable: str | None = None) -> DatasetError:
    """The refusal of OLD's shard `rel`: `unreadable` ("missing", an OSError's words), else its bytes
    are not the ones dataset.json records."""
    if unreadable is not None:
        return DatasetError(
            f"{_where(old, root, rel)}: {unreadable}, but {DATASET_JSON} lists it: restore it, then convert "
            "again; nothing was converted"
        )
    return DatasetError(
        f"{_where(old, root, rel)}: not the shard {DATASET_JSON} records (size or sha256 differ): damaged "
        f"or replaced since the build; nothing was converted (`gristmill data validate {old}` says more)"
    )


def _check_rows(
    old: str, path: str, shard: str, data: bytes, info: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """OLD's rows of `shard` (of manifest `path`, as `_where` names it) against its bytes as `gristmill
    data validate` checks them: each row's document where its members are (/1: the `<key>.ids` member
    its key names, in tar order), each row's sha256 where it has one. A manifest no record covers, edited,
    gave NEW other documents under its rows' keys, "validated" (review R26c S1). Only for such a
    manifest: its walk of every tar member doubled a /1 conversion (review RV26d m5)."""
    res = check_shard_bytes(shard, data, info, rows)
    if res.problems:
        more = len(res.problems) + res.more_problems - 1
        raise DatasetError(
            f"{path}: its rows do not describe {res.problems[0]}"
            + (f" (and {more} more)" if more else "")
            + f": the manifest was edited or the shard replaced; nothing was converted (`gristmill data "
            f"validate {old}` lists them)"
        )


def _legacy_meta(path: str, row: dict[str, Any], data: bytes) -> dict[str, Any]:
    """A /1 document's source metadata: its `.json` member's (in the shard, which dataset.json's
    sha256 covers; token_count only there), which its manifest row must agree with where it has a
    value. A manifest from before the record of its files is covered by nothing else: ids or urls
    swapped between rows labelled NEW's documents with each other's (review R26c S1)."""
    member = source_columns(_member_json(data, row), MANIFEST_FIELDS)
    if (differs := source_disagreement(row, member)) is not None:
        name, says, value = differs
        raise DatasetError(
            f"{path}: row {row['key']} says {name} {says!r}, but its .json member in "
            f"{SHARDS_DIR}/{row['shard']} says {value!r}: the manifest was edited; nothing was converted "
            "(restore it)"
        )
    return member


def _member_json(data: bytes, row: dict[str, Any]) -> dict[str, Any]:
    """A /1 document's `.json` member: the tar member after its `.ids` member."""
    start = row["offset"] + tar_padded(row["nbytes"]) + TAR_BLOCK
    header = data[start - TAR_BLOCK : start]
    size = int(header[124:136].strip(b"\0 ") or b"0", 8)
    try:
        return json.loads(data[start : start + size])
    except ValueError:
        return {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "old", action=PathArgument, help="a dataset of an older layout: a directory or s3://BUCKET/PREFIX"
    )
    parser.add_argument(
        "new",
        action=PathArgument,
        help="where the converted dataset goes: a new directory or s3://BUCKET/PREFIX",
    )


def run(args: argparse.Namespace) -> int:
    refuse_other_urls({"OLD": args.old, "NEW": args.new}, buckets=True)
    with sigterm_raises():  # a scheduler's SIGTERM ends it as a Ctrl-C does: one line, the upload's work kept
        convert_dataset(args.old, args.new)
    return 0
