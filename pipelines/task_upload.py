"""Every build task uploads its own output: a build into s3:// needs the bucket, no disk shared by nodes.

A task of an s3:// build (the tokenize-and-shard step, pipelines/tokenize_shard.py) writes into its
node's work directory as a local build does, and:
- checks each shard it closes against its own manifest rows (validation's check of one shard), uploads
  it and deletes its local copy, so a node's disk holds one shard of the task's at a time besides its
  spill;
- once its input is consumed (the filters' excluded parts are closed by then), uploads its manifest
  part, its excluded parts and its datatrove stats (which datatrove itself writes only where the task
  ran), deletes objects under its own names that an earlier attempt left and this one did not write,
  then its record, build/tasks/NNNNN.json: {path: bytes, sha256, md5, etag} of every object it owns,
  for this config's sha256 and (with [dedup]) the dedup decisions'. The record is the task's commit
  point: present, every object it lists is in the bucket as listed.

An object is uploaded only when the store does not hold its content already (its ETag, which the store
computes from the bytes it stored, equal to the file's MD5, or the bytes themselves where the ETag is not
an MD5: SSE-KMS, SSE-C; never the sha256 the metadata claims), so a task redone after a kill uploads
only what is missing or wrong. A task whose record is there for this
config, with every object matching it, returns before reading its input (datatrove's steps are lazy:
nothing upstream runs). The driver (pipelines/build.py) checks every object of every record against one
listing of the bucket (size and ETag) before it writes dataset.json, from the small files it downloads;
it never needs a task's disk.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.contract.dataset_format import (
    EXCLUDED_DIR,
    LOGS_DIR,
    MANIFEST_DIR,
    SHARDS_DIR,
    TASK_RECORDS_DIR,
)
from training.contract.errors import GristmillError
from training.contract.object_store import ObjectMissing, ObjectStore, file_digests

RECORDS_DIR = TASK_RECORDS_DIR  # NNNNN.json per task: its commit point in the bucket
TASKS_DIR = "tasks"  # build.workdir/tasks/NNNNN/: a task's own folder until its output is uploaded
STATS_DIR = f"{LOGS_DIR}/stats"  # datatrove's stats of each task, where a local build has them
TASK_DIRS = (SHARDS_DIR, MANIFEST_DIR, EXCLUDED_DIR, STATS_DIR)  # in the bucket only tasks write there
THREADS = 8  # records read at once by the driver
DECISIONS_KEY = "dedup_decisions"  # a record's: the dedup decisions its task's output follows


def task_root(workdir: str | Path, rank: int) -> Path:
    """The folder task `rank` of an s3:// build writes in (the dataset's layout: shards/, manifest/,
    excluded/), on whichever node runs it; the task removes it once its output is in the bucket."""
    return Path(workdir) / TASKS_DIR / f"{rank:05d}"


class TaskUploadError(GristmillError):
    """A task's output that must not go into the bucket (a shard that fails its check)."""


RECORD_KEYS = {"bytes", "sha256", "etag"}  # what each object of a task's record must give


def record_rel(rank: int) -> str:
    return f"{RECORDS_DIR}/{rank:05d}.json"


def is_task_record(rel: str) -> bool:
    return rel.startswith(RECORDS_DIR + "/")


def is_task_output(rel: str) -> bool:
    """Whether `rel` lies where only an s3:// build's tasks write (TASK_DIRS)."""
    return rel.rpartition("/")[0] in TASK_DIRS


def read_record(store: ObjectStore, rank: int) -> dict[str, Any] | None:
    """Task `rank`'s record, None if there is none or it is not a record (cut short, edited): its task
    is then redone and writes it again."""
    try:
        record = json.loads(store.get(record_rel(rank)))
    except ObjectMissing:
        return None
    except ValueError:
        return None
    ok = isinstance(record, dict) and isinstance(record.get("objects"), dict)
    # each object as a task records it: one without its size, hash or ETag is no record either (it
    # was read as dataset.json's fault, and the advice deleted a good one: review R20j 2)
    ok = ok and all(isinstance(o, dict) and RECORD_KEYS <= o.keys() for o in record["objects"].values())
    return record if ok else None


def mismatch(spec: dict[str, Any], there: tuple[int, str] | None) -> str | None:
    """What is wrong with an object the bucket lists as `there` (bytes, ETag) against its task's
    record `spec`, None if nothing."""
    if there is None:
        return "is missing"
    size, etag = there
    if size != spec["bytes"]:
        return f"is {size:,} bytes, not the {spec['bytes']:,} its task uploaded"
    if etag != spec["etag"]:
        return f"is not the object its task uploaded (ETag {etag[:12]}…, recorded {spec['etag'][:12]}…)"
    return None


@dataclass(frozen=True)
class TaskUpload:
    """Where an s3:// build's tasks upload (carried by the step to wherever a task runs)."""

    url: str
    config_sha256: str  # the build's: a record of another config is no record
    check: bool = True  # build.validate: each shard is checked before it is uploaded

    def committed(self, rank: int, decisions: str | None = None) -> bool:
        """Whether the bucket holds task `rank`'s record for this config and these dedup `decisions`
        (`dedup.decisions_sha256`, which a task's output follows too; None: not compared) with every
        object as it lists (one HEAD each). A record some object no longer matches, or of other
        decisions, is removed: the task is redone (the dedup stages run again over an input rewritten
        since kept a finished task's drops of copies of text no longer there: trial RV55a 1)."""
        store = ObjectStore(self.url)
        record = read_record(store, rank)
        if record is None or record.get("config_sha256") != self.config_sha256:
            return False
        if decisions is not None and record.get(DECISIONS_KEY) != decisions:
            store.delete(record_rel(rank))
            return False
        for rel, spec in record["objects"].items():
            head = store.head(rel)
            if mismatch(spec, None if head is None else (head["bytes"], head["etag"])):
                store.delete(record_rel(rank))
                return False
        return True


@dataclass
class TaskUploader:
    """One task's uploads, in the order it finishes its files; `commit` writes its record."""

    spec: TaskUpload
    rank: int
    decisions: str | None = None  # the dedup decisions its output follows (TaskUpload.committed)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # what its record lists
    uploaded: int = 0  # objects PUT by this attempt (the others were in the bucket already)
    documents: int = 0  # checked in its shards
    separators: int = 0

    def __post_init__(self) -> None:
        self.store = ObjectStore(self.spec.url)

    def put(self, path: Path, rel: str) -> None:
        """`path` as object `rel`, unless the bucket holds that content already; recorded either way."""
        md5, sha = file_digests(path)
        size = path.stat().st_size
        head = self.store.head(rel)
        same = head is not None and head["bytes"] == size
        if same and head["md5"] is not None:
            same = head["md5"] == md5
        elif same:  # an ETag that is no MD5 (an object encrypted with KMS or customer keys): the bytes
            same = self.store.holds(rel, path)
        etag = head["etag"] if same else self.store.put_file(path, rel, expect_sha256=sha)
        self.uploaded += not same
        self.objects[rel] = {"bytes": size, "sha256": sha, "md5": md5, "etag": etag}

    def put_stats(self, data: bytes) -> None:
        """The task's datatrove stats (they hold timings: a redone task's are new bytes)."""
        rel = f"{STATS_DIR}/{self.rank:05d}.json"
        etag = self.store.put_bytes(data, rel)
        self.uploaded += 1
        self.objects[rel] = {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "md5": hashlib.md5(data).hexdigest(),
            "etag": etag,
        }

    def shard(
        self,
        path: Path,
        rows: list[dict[str, Any]],
        written: dict[str, Any],
        vocab_size: int,
        dtype: str,
        separator: dict[str, Any],
    ) -> None:
        """A shard the task closed: checked against its manifest `rows` and the {bytes, sha256} it
        hashed while writing (`written`), uploaded, deleted here."""
        if self.spec.check:
            from validation.validate import check_written_shard

            res = check_written_shard(
                path, dtype=dtype, vocab_size=vocab_size, separator=separator, rows=rows, expected=written
            )
            if res.problems:
                more = len(res.problems) + res.more_problems - 1
                raise TaskUploadError(
                    f"task {self.rank} wrote {path}, which fails its check, so it was not uploaded: "
                    f"{res.problems[0]}{f' (and {more} more problems)' if more else ''}; report this as a bug"
                )
            self.documents += res.documents
            self.separators += res.separators
        self.put(path, f"{SHARDS_DIR}/{path.name}")
        path.unlink()

    def commit(self) -> None:
        """Remove this task's objects an earlier attempt left and this one did not write, then write its
        record: the task's commit point."""
        for prefix in (f"{SHARDS_DIR}/{self.rank:05d}_", f"{EXCLUDED_DIR}/{self.rank:05d}_"):
            for rel in self.store.list(prefix):
                if rel not in self.objects:
                    self.store.delete(rel)
        record = {
            "task": self.rank,
            "config_sha256": self.spec.config_sha256,
            DECISIONS_KEY: self.decisions,
            "checked": {"documents": self.documents, "separators": self.separators}
            if self.spec.check
            else None,
            "objects": dict(sorted(self.objects.items())),
        }
        self.store.put_bytes(json.dumps(record, indent=1).encode(), record_rel(self.rank))


# --------------------------------------------------------------------------------------------
# the driver


def read_records(store: ObjectStore, tasks: int, config_sha256: str) -> dict[int, dict[str, Any]]:
    """{task: record} of the tasks whose record for this config is in the bucket."""
    listed = store.list(RECORDS_DIR + "/")
    ranks = [r for r in range(tasks) if record_rel(r) in listed]
    with ThreadPoolExecutor(THREADS) as pool:
        records = list(pool.map(lambda r: read_record(store, r), ranks))
    return {
        r: rec
        for r, rec in zip(ranks, records)
        if rec is not None and rec.get("config_sha256") == config_sha256
    }


def damaged_objects(
    records: dict[int, dict[str, Any]], listing: dict[str, tuple[int, str]]
) -> list[tuple[int, str, str]]:
    """(task, object, what is wrong) for every recorded object the bucket's `listing` does not hold as
    recorded."""
    out = []
    for rank, record in sorted(records.items()):
        for rel, spec in sorted(record["objects"].items()):
            if (what := mismatch(spec, listing.get(rel))) is not None:
                out.append((rank, rel, what))
    return out


def stray_objects(records: dict[int, dict[str, Any]], listing: dict[str, Any]) -> list[str]:
    """Objects where only tasks write that no record lists (not this build's), of `listing` (the
    bucket's, or dataset.json's files: any mapping by path)."""
    recorded = {rel for record in records.values() for rel in record["objects"]}
    return sorted(rel for rel in listing if is_task_output(rel) and rel not in recorded)
