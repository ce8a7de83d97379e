"""`gristmill data upload DIR s3://BUCKET/PREFIX`: a complete local dataset into a bucket, dataset.json
last. The build's last step for an s3:// output is the same call (pipelines/build.py), for the files
its driver writes (index, tokenizer.json, build records): its tasks uploaded the rest themselves
(pipelines/task_upload.py), and their records are allowed beside the dataset.

What goes up is what dataset.json records a sha256 for (training/contract/dataset_format.py's
`dataset_files`: shards, the loader index, tokenizer.json, manifest, excluded, the build's stats,
build.json and config.toml), each file hashed here first and refused if it is not what dataset.json
says (a file damaged on disk never reaches the bucket, nor is skipped because the bucket holds its
bytes already). Each is one PUT (a reader sees the old object
or the whole new one, never a part) carrying Content-MD5, which the store checks, and its sha256 in
the object's metadata; a file past one PUT's 5 GiB (an index file from ~170M documents) goes up in
checked parts, seen as atomically (ObjectStore.put_file). An object already there is skipped only
when its content is the file's (`ObjectStore.holds`: the store's MD5 of what it stored, or of its
parts' MD5s, never the sha256 the metadata claims), so a
rerun after a kill uploads only the rest, and one over a damaged object repairs it. Then
dataset.json, the commit point: a reader that finds it finds every object it lists. A multipart
upload left unfinished under the prefix (a killed upload, another tool) is aborted before anything is
uploaded. The local validation.json stays local: the
bucket's comes only from validating the bucket (`gristmill data validate s3://…`).

A dataset of an older layout (gristmill-shards/1 or /2), which no reader of a bucket trains from, is
refused in one line naming `gristmill data convert DIR URL`, which converts it into the bucket.

A prefix holding another dataset (its dataset.json names another fingerprint), or objects this dataset
does not have, is refused, and so is a commit over a dataset.json that changed while the upload ran
(another upload into the prefix at once). Two uploads into one prefix at once are not supported (no
lock): each PUT is preceded by a HEAD of dataset.json, so the upload that did not commit first stops
before writing over the one that did, removes the objects it put that the other does not record, and
names any of the other's it replaced with the repair (_committed_meanwhile); a mix of their objects is
never read as data, since readers check every object against dataset.json's sha256.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipelines.data_index import lacks_documents_sum, record_documents_sum
from pipelines.dataset_lock import dataset_lock
from pipelines.task_upload import damaged_objects, is_task_record, mismatch, read_record
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import (
    BUILD_JSON,
    DATASET_JSON,
    DOCUMENTS_SUM,
    FORMAT,
    INDEX_DIR,
    NO_FILES_ENTRY,
    DatasetError,
    check_fingerprint,
    dataset_files,
    dataset_json_writable,
    fingerprint,
    parse_dataset_info,
    read_dataset_info,
    read_dataset_json,
)
from training.contract.dataset_index import DOC_HASHES, sum_doc_hashes_file, wrong_sum
from training.contract.object_store import (
    COUNTS,
    ObjectMissing,
    ObjectRefused,
    ObjectStore,
    ObjectStoreError,
    ObjectURL,
    file_digests,
    is_url,
)
from validation.validate import VALIDATION_JSON  # a bucket's own report: never uploaded

THREADS = 8  # uploads in flight: requests, not bandwidth, are what a store limits


@dataclass
class Uploaded:
    objects: int  # uploaded now
    skipped: int  # already in the bucket with the file's content
    bytes: int  # uploaded now


def upload_dataset(
    root: str | Path, url: str, log=print, in_bucket: dict[str, dict] | None = None
) -> Uploaded:
    """Put the complete dataset at `root` under `url` (module docstring); returns what was done.
    `in_bucket`: objects the caller found in the bucket as their uploader recorded them (an s3://
    build's tasks' output, pipelines/task_upload.py), which need no local file and are not uploaded."""
    in_bucket = in_bucket or {}
    root = Path(root)
    # Read once: what is checked below (the files' sha256, the documents' sum) is what is put at the
    # commit, not the file as it is by then (a hand edit meanwhile went up unchecked: review RV33e L1).
    raw, info = read_dataset_json(root)
    check_fingerprint(root, info)
    if info["format"] != FORMAT:  # uploaded, it was refused by every reader that trains (review RV51b)
        raise DatasetError(
            f"{root} is a {info['format']} dataset, which a bucket does not serve (its readers read the "
            f"{FORMAT} layout, made for range reads): convert it into the bucket instead, `gristmill data "
            f"convert {root} {url}` (same documents, same batches)"
        )
    if "files" not in info:  # every dataset of the current layout records them (validate's rule)
        raise DatasetError(f"{root / DATASET_JSON} {NO_FILES_ENTRY}")
    target = ObjectURL.parse(url)
    store = ObjectStore(target)
    store.check_bucket()
    refuse_nested(target)
    before = COUNTS.snapshot()
    committed = _refuse_other_dataset(store, info)
    # its version now: a HEAD before each PUT compares with it (another upload's commit meanwhile)
    committed_etag = (store.head(DATASET_JSON) or {}).get("etag")

    def another_commit() -> bool:
        """Whether another dataset.json was committed into the prefix since this upload began."""
        return (store.head(DATASET_JSON) or {}).get("etag") != committed_etag

    files = dataset_files(info)
    # with their ETags: an object held already (not put again) replaced while the upload ran, its size
    # kept, is told by its ETag at the commit (trial RV77a 1)
    listed_first = store.list_etags()
    there = {rel: size for rel, (size, _) in listed_first.items()}
    # beside this dataset's own dataset.json too: the bucket failed validation (R17e F6)
    if strays := _strays(there, files):
        raise DatasetError(
            f"{target} already holds {len(strays)} object(s) that are not this dataset's (e.g. {strays[0]}): "
            "upload into an empty prefix, or delete them first"
        )
    # After the refusals, and of this dataset's own objects only: an upload into a parent prefix, or the
    # bucket's root, aborted every unfinished multipart upload under it (another dataset's, anyone's),
    # then refused (trial RV60a 2)
    for key, upload_id in store.multipart_uploads():
        if key.removeprefix(target.key("")) in files:
            store.abort_upload(key, upload_id)
            log(f"aborted an unfinished multipart upload of s3://{target.bucket}/{key}")
    hashed, summed = _documents_sum(root, info, in_bucket)

    def needed(rel: str) -> bool:
        spec, path = files[rel], root / rel
        if rel in in_bucket:
            return False
        if not path.is_file():
            raise _missing(path, root)
        if spec["bytes"] is not None and path.stat().st_size != spec["bytes"]:
            raise _not_recorded(path, root, "size")  # cut or grown: said before any PUT (trial RV65a F1)
        if not (rel in there and (spec["bytes"] is None or there[rel] == spec["bytes"])):
            return True  # uploaded: put() checks the file first
        # Skipped only if the file is what dataset.json records, and the object its content: a damaged
        # file whose bytes the bucket held already (an earlier sync) was skipped unchecked, and
        # dataset.json committed over it, exit 0 (review R20b F1).
        md5, sha = hashed.get(rel) or file_digests(path)
        if sha != spec["sha256"]:
            raise _not_recorded(path, root)
        return not store.holds(rel, path, digests=(md5, sha))

    with ThreadPoolExecutor(THREADS) as pool:
        todo = {rel for rel, put in zip(sorted(files), pool.map(needed, sorted(files))) if put}
    # The documents' sum is recorded in dataset.json once every local file is checked (needed(), then
    # put()), so that a refused upload leaves dataset.json as it was and reads no doc_sha256.bin in vain
    # (minutes at scale: review RV32b F6; a damaged file still to be put was found after it: RV32h N2).
    adds_sum = lacks_documents_sum(info) and dataset_json_writable(root)
    # The bucket's validation record describes the objects and the dataset.json it validated: it goes
    # before anything changes (a kill midway leaves no record, never a stale one), whoever changed them
    # (this upload, or a build's tasks: `in_bucket`).
    changed = adds_sum or committed != raw
    if VALIDATION_JSON in there and (todo or in_bucket or changed):
        store.delete(VALIDATION_JSON)
        log(
            f"removed {target}/{VALIDATION_JSON}: it validated what this upload replaces (`gristmill data "
            f"validate {target}` validates the bucket again)"
        )

    put_now: dict[str, str] = {}  # rel -> the ETag of this upload's PUT of it
    meanwhile = threading.Event()  # another dataset.json seen: the PUTs not begun are not made

    def put(rel: str) -> int:
        spec, path = files[rel], root / rel
        # another upload's commit since this one began: its objects are not written over (trial RV69b F3:
        # the later upload PUT on after the other's commit, and no rerun of either could repair it)
        if meanwhile.is_set() or another_commit():
            meanwhile.set()
            return 0
        try:
            put_now[rel] = store.put_file(path, rel, expect_sha256=spec["sha256"], digests=hashed.get(rel))
        except ObjectStoreError:
            # the other upload's commit meanwhile first: its refusal, not this PUT's (review RV69d 7)
            with contextlib.suppress(ObjectStoreError):  # the store failing: this PUT's line
                if another_commit():
                    meanwhile.set()
                    return 0
            # the store refusing the PUT: a 403 or a retry budget spent is the store's, told in its own
            # line, and a Content-MD5 refused the file's bytes changed since they were hashed; the file
            # itself says which (review RV34b F1: every refusal read "damaged")
            try:
                intact = file_digests(path)[1] == spec["sha256"]
            except OSError:  # gone meanwhile
                intact = False
            if intact:
                raise
            raise _not_recorded(path, root, put_to=target) from None
        except ValueError:  # put_file's own sha256 check: hashed before the PUT, damaged after the build
            raise _not_recorded(path, root, put_to=target) from None
        return path.stat().st_size

    with ThreadPoolExecutor(THREADS) as pool:
        sizes = list(pool.map(put, sorted(todo)))
    if meanwhile.is_set():
        raise _committed_meanwhile(store, root, info, put_now)
    if lacks_documents_sum(info):
        # under the lock of every writer of the directory: a `data index` meanwhile wrote another entry,
        # which this write of what was read before replaced (review RV31b F7)
        with dataset_lock(root, f"`gristmill data upload {root} {url}`", read_only_ok=True):
            if read_dataset_info(root) != info:
                raise DatasetError(
                    f"{root / DATASET_JSON} changed while this upload read the dataset (a `gristmill data "
                    "index` or a build wrote it): nothing was committed; run the upload again"
                )
            info = record_documents_sum(
                root, info, log, "uploaded without it, so a mixture with another source of the same "
                "documents is not refused", summed=summed,
            )  # fmt: skip
            raw, written = read_dataset_json(root)  # under the lock: what the record wrote
            if written != info:
                raise DatasetError(
                    f"{root / DATASET_JSON} changed while this upload recorded the sum: nothing was "
                    "committed; run the upload again"
                )
    # Another upload to the prefix that committed meanwhile (two at once: each checked an empty prefix
    # at its start, and the later commit put its dataset.json over the other's objects, both exit 0:
    # review R17e F1): refused. Not a lock; the readers check every object against dataset.json.
    try:
        now = store.get(DATASET_JSON)
    except ObjectMissing:
        now = None
    if now != committed:
        raise _committed_meanwhile(store, root, info, put_now)
    # The objects as they are now, listed once more: another dataset's upload into the prefix meanwhile
    # (no dataset.json yet), or an object replaced or deleted since it was put, was committed over,
    # exit 0, and the readers refused the bucket (trial RV60a 3). Sizes and strays: not a lock.
    if not in_bucket:
        etags = store.list_etags()
        listed = {rel: size for rel, (size, _) in etags.items()}
        late = _strays(listed, files)
        changed = any(listed.get(rel) != _size(root, rel, spec) for rel, spec in files.items())
        if (late or changed) and another_commit():
            # the other upload committed since the check above: "run it again", whose rerun the other's
            # dataset.json refused (trial RV69e 3)
            raise _committed_meanwhile(store, root, info, put_now)
        for rel, spec in sorted(files.items()):
            size = _size(root, rel, spec)
            if listed.get(rel) != size:
                got = "is gone" if rel not in listed else f"is {listed[rel]:,} bytes, not {size:,}"
                raise DatasetError(
                    f"{target}/{rel} {got} (another upload into the prefix, or a change, while this one "
                    f"ran): nothing was committed; run `gristmill data upload {root} {url}` again once no "
                    "other writes there (it uploads what differs), or upload into another prefix"
                )
        if late:
            raise DatasetError(
                f"{target} holds {len(late)} object(s) that are not this dataset's, put while this upload "
                f"ran (e.g. {late[0]}: another upload into the prefix): nothing was committed; upload into "
                "a prefix of its own"
            )
        for rel in sorted(files):
            # the ETag of this upload's PUT, or of the object it found holding the file's content: one
            # replaced since with other bytes of its size was committed, exit 0 (trial RV77a 1)
            want = put_now.get(rel) or listed_first.get(rel, (0, None))[1]
            if want and (got := etags[rel][1]) != want:
                raise DatasetError(
                    f"{target}/{rel} was replaced while this upload ran (its ETag is {got[:12]}…, not the "
                    f"{want[:12]}… it had when put or checked): nothing was committed; run `gristmill data "
                    f"upload {root} {url}` again once no other writes there (it uploads what differs)"
                )
    if any("etag" in spec for spec in in_bucket.values()):
        # The caller's check of the tasks' objects (pipelines/build.py) is a whole finalize old: looked
        # at again just before the commit (an object replaced meanwhile was committed, and the build's
        # table said "validation OK": review R20b F3; not a lock, the readers check every object).
        listing = store.list_etags()
        for rel, spec in sorted(in_bucket.items()):
            if "etag" in spec and (what := mismatch(spec, listing.get(rel))) is not None:
                raise DatasetError(
                    f"{target}/{rel} {what}: it changed after the build checked it, and nothing was "
                    "committed; rerun the same `gristmill data build` command (it redoes what changed)"
                )
    store.put_bytes(raw, DATASET_JSON)  # the commit point: the bytes checked
    if not in_bucket:  # a build's own commit checked its tasks' records against the bucket just above
        _forget_stale_tasks(store, there, log)
    result = Uploaded(len(todo), len(files) - len(todo), sum(sizes))
    counts = {k: v - before[k] for k, v in COUNTS.snapshot().items()}
    log(
        f"uploaded {root} to {target}: {result.objects} objects ({result.bytes / 1e6:,.1f} MB), "
        f"{result.skipped} already there, then {DATASET_JSON}; {counts['requests']} requests, "
        f"{counts['retries']} retried"
    )
    return result


DOC_HASHES_FILE = f"{INDEX_DIR}/{DOC_HASHES}"


def _documents_sum(
    root: Path, info: dict, in_bucket: dict[str, dict]
) -> tuple[dict[str, tuple[str, str]], str | None]:
    """The sum of the documents' sha256 of the dataset at `root`, from one read of its doc_sha256.bin
    that also gives that file's (MD5, sha256) for needed() (it was read twice, a minute per upload at
    1B documents: review RV33e L4), and a recorded sum refused unless the documents give it. It goes
    into the bucket, whose readers trust it (they never fetch doc_sha256.bin): a wrong one let a mixture
    of the bucket's copy with a local one of the same documents in another order train each document
    twice, exit 0 (review RV33d F0). First, before any other file is hashed and anything is put or
    removed: a refusal leaves the bucket as it was. ({}, None) where no local doc_sha256.bin is recorded."""
    entry = info.get("index") or {}
    recorded, spec = entry.get(DOCUMENTS_SUM), entry.get("files", {}).get(DOC_HASHES)
    if spec is None:
        if recorded is not None:  # an older gristmill's index: its documents have no sha256 (RV33e L3)
            raise DatasetError(
                f"{root / DATASET_JSON}: index.{DOCUMENTS_SUM} {recorded[:12]}… is recorded, but the index "
                f"has no {DOC_HASHES_FILE} (an older gristmill's), so no sum of its documents' sha256 can "
                f"give it: dataset.json was edited; delete index.{DOCUMENTS_SUM}, or run `gristmill data "
                f"index {root}` (this version's index has its documents' sha256 and their sum), then upload"
            )
        return {}, None
    path = root / DOC_HASHES_FILE
    if not path.is_file():
        if DOC_HASHES_FILE in in_bucket:  # uploaded by the build that summed it
            return {}, None
        raise _missing(path, root)
    md5 = hashlib.md5()
    summed = sum_doc_hashes_file(root, entry, md5)
    if summed is None:  # not the file dataset.json records
        raise _not_recorded(path, root)
    if recorded is not None and summed != recorded:
        unwritable = None if dataset_json_writable(root) else "read-only"
        raise DatasetError(wrong_sum(root, recorded, summed, unwritable, use_copy="upload the copy"))
    return {DOC_HASHES_FILE: (md5.hexdigest(), spec["sha256"])}, summed


def _size(root: Path, rel: str, spec: dict) -> int:
    """The bytes of dataset file `rel` as its record says, or on disk where it says none."""
    return spec["bytes"] if spec["bytes"] is not None else (root / rel).stat().st_size


def _committed_meanwhile(store: ObjectStore, root: Path, info: dict, put_now: dict[str, str]) -> DatasetError:
    """The refusal of an upload of the dataset `info` at `root` whose prefix got another dataset.json while
    it ran (another upload or build committed there first). The objects this upload put that are still
    its own (their ETag its PUT's) and that the dataset now there does not record are removed: no
    reader's, and every rerun of either upload refused them as strays. Those of that dataset's names
    whose content is not its record are named with the repair, that dataset's upload again (it puts back
    what differs): the advice to rerun either upload repaired nothing (trial RV69b F3)."""
    where, again = store.url.child(DATASET_JSON), f"`gristmill data upload {root} {store.url}`"
    said = f"{where} changed while this upload ran (another upload or build into the prefix committed first)"
    try:
        theirs = parse_dataset_info(store.get(DATASET_JSON), where)
    except (ObjectMissing, DatasetError):  # removed or damaged since: whose the prefix is cannot be told
        return DatasetError(
            f"{said}, and is now gone or unreadable: run {again} again once nothing else writes there"
        )
    if theirs.get("fingerprint") == info["fingerprint"]:  # this dataset's, by another upload of it
        return DatasetError(
            f"{said}, by this same dataset: run {again} again to check it is whole (it puts what differs)"
        )
    recorded, ours = dataset_files(theirs), dataset_files(info)
    listing = store.list_etags() if put_now else {}
    put = sorted(rel for rel, etag in put_now.items() if listing.get(rel, (0, ""))[1] == etag)
    replaced = [rel for rel in put if rel in recorded and recorded[rel]["sha256"] != ours[rel]["sha256"]]
    removed = [rel for rel in put if rel not in recorded]
    for rel in removed:
        store.delete(rel)
    kept = f"; it removed the {len(removed)} object(s) of its own it had put there" if removed else ""
    if replaced:
        return DatasetError(
            f"{said}: this upload stopped, but had put {len(replaced)} object(s) over that dataset's own "
            f"(e.g. {store.url.child(replaced[0])}), which its readers refuse now{kept}; run that dataset's "
            f"`gristmill data upload DIR {store.url}` again (it puts back what differs), and upload {root} "
            "into another prefix"
        )
    return DatasetError(
        f"{said}: this upload stopped before writing over that dataset, which is intact{kept}; upload "
        f"{root} into another prefix"
    )


def refuse_nested(url: ObjectURL) -> None:
    """Refuse a dataset's prefix inside another dataset's (one prefix above it, or the bucket's root,
    holds a dataset.json or a build's build.json): its objects are that dataset's strays, whose next
    upload then refused them, and deleting that prefix, the advice there, deleted this one too (review
    R22b F7). A HEAD request per prefix above it; one the store refuses (credentials scoped to a
    prefix below) says nothing."""
    parts = url.prefix.split("/") if url.prefix else []
    for depth in range(len(parts)):
        outer = ObjectURL(url.bucket, "/".join(parts[:depth]))
        store = ObjectStore(outer)
        try:
            held = next((n for n in (DATASET_JSON, BUILD_JSON) if store.head(n) is not None), None)
        except ObjectRefused:  # credentials scoped to a prefix below (review R22c R4): nothing known
            continue
        if held:
            raise DatasetError(
                f"{outer} holds a dataset ({outer.child(held)}), and {url} lies inside its prefix: its "
                "objects would be that dataset's strays; put this one at a prefix outside it"
            )


def _refuse_other_dataset(store: ObjectStore, info: dict) -> bytes | None:
    """The bucket's dataset.json (None: none there), refused when it is another dataset's."""
    try:
        raw = store.get(DATASET_JSON)
    except ObjectMissing:
        return None
    where = store.url.child(DATASET_JSON)
    try:
        theirs = parse_dataset_info(raw, where, "the object was damaged or edited")
    except DatasetError as e:
        # Edited or cut there: this dataset's still when its fingerprint says so (the upload writes it
        # again: the repair validate advises); whose it is cannot be told otherwise.
        with contextlib.suppress(ValueError, RecursionError):
            theirs = json.loads(raw)
            if isinstance(theirs, dict) and theirs.get("fingerprint") == info["fingerprint"]:
                return raw
        raise DatasetError(
            f"{e} — whose dataset {store.url} holds cannot be told: if it is this one, delete {where} and "
            "upload again; else upload to another prefix"
        ) from None
    if theirs.get("fingerprint") != info["fingerprint"]:
        with contextlib.suppress(Exception):  # fields a fingerprint cannot be taken of: another dataset's
            if fingerprint(theirs) == info["fingerprint"]:  # this one's, its recorded fingerprint edited:
                return raw  # written again, as other edits are (review RV42a M4)
        raise DatasetError(
            f"{store.url} holds another dataset (fingerprint {str(theirs.get('fingerprint'))[:12]}…, "
            f"this one {info['fingerprint'][:12]}…): upload to another prefix; or, if this prefix is this "
            f"dataset's and that dataset.json was put over its own, delete {where} and upload again"
        )
    return raw


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir", metavar="DIR", action=PathArgument, help="a complete dataset directory (holds dataset.json)"
    )
    parser.add_argument(
        "url", metavar="URL", help="s3://BUCKET/PREFIX (endpoint and credentials: the AWS_* environment)"
    )


def _strays(listing: dict[str, int], files: dict[str, dict]) -> list[str]:
    """The objects of a prefix's `listing` that are not the dataset's (`files`, its dataset.json, the
    bucket's validation.json, a build's task records), sorted."""
    return sorted(
        r for r in set(listing) - set(files) - {DATASET_JSON, VALIDATION_JSON} if not is_task_record(r)
    )


def run(args: argparse.Namespace) -> int:
    if is_url(args.dir):  # read as a local path: "s3:/bkt/t1/dataset.json not found" (trial RV60a 9)
        raise DatasetError(
            f"{args.dir} is a bucket's: `gristmill data upload DIR URL` copies a local dataset directory (a "
            "build's output) into a bucket; give that directory"
        )
    if not is_url(args.url):  # a local path: its "did you mean s3:///tmp/x" was refused too (RV72c F8)
        # quoted where blanks would hide it: "error:  is not a bucket's URL" (trial RV73a 9)
        said = args.url if args.url and args.url.strip() == args.url else json.dumps(args.url)
        raise DatasetError(
            f"{said} is not a bucket's URL: `gristmill data upload DIR URL` writes into a bucket; give "
            "s3://BUCKET/PREFIX (a local copy of the dataset is a copy of its directory: cp -r DIR DEST)"
        )
    upload_dataset(args.dir, args.url)
    return 0


def _missing(path: Path, root: Path) -> DatasetError:
    return DatasetError(f"{path} is missing but {root / DATASET_JSON} records it; rebuild the dataset")


def _not_recorded(
    path: Path, root: Path, what: str = "sha256", put_to: ObjectURL | None = None
) -> DatasetError:
    """A file that is not what dataset.json records. `put_to`: found as it was put (each file is hashed
    once, as it goes up: a pass before would read the dataset twice), so others went up before it,
    and stay (trial RV65a F1: the line did not say so)."""
    left = (
        f"; nothing was committed ({put_to}/{DATASET_JSON} goes last), and the objects put before it stay "
        "there: the next upload skips those the store holds, or delete them"
        if put_to is not None
        else ""
    )
    return DatasetError(
        f"{path} is not the file {root / DATASET_JSON} records (its {what} differs): it was damaged "
        f"after the build; run `gristmill data validate {root}`, rebuild, then upload{left}"
    )


def _forget_stale_tasks(store: ObjectStore, there: dict[str, int], log) -> None:
    """An s3:// build's task records that no longer describe the bucket (an object they list was
    replaced: the same dataset built locally and uploaded, its stats' timings differ) are removed once
    dataset.json describes it. A build rerun took such objects for damaged and advised redoing every
    task over a healthy dataset (review R20b M1); it says now that those tasks left no record here.
    After the commit, not before: an upload killed midway leaves the records, and the rerun names the
    objects that differ (removed first, it found the dataset complete over them: review R20c 2); and
    whichever upload replaced them (a killed one's PUTs stay)."""
    records = sorted(r for r in there if is_task_record(r) and Path(r).stem.isdigit())
    if not records:
        return
    with ThreadPoolExecutor(THREADS) as pool:  # none, or no record: the build redoes its task
        read_back = list(pool.map(lambda rel: read_record(store, int(Path(rel).stem)), records))
    listing = store.list_etags()
    for rel, record in zip(records, read_back):
        if record is not None and damaged_objects({0: record}, listing):
            store.delete(rel)
            log(f"removed {store.url}/{rel}: its task's objects were replaced by an upload")
