"""Deduplication across the whole build (`[dedup]`): extra datatrove stages before the build's pass.

Duplicates can sit in different tasks, so no task can decide alone; the decision is made by
stages that run before the build's own pass, each a datatrove pipeline with its own tasks and its
own logging dir (OUTPUT/logs/dedup/<stage>/: completion markers, stats, task logs), run by the
build's executor (local and Ray: one stage after the other; Slurm: dependent array jobs):

    kind = "exact"    hashes      reader → filters → DocRecord (id + hash of normalised text)
                      clusters    ExactClusters (1 task): the first of each hash is kept
    kind = "minhash"  signatures  reader → filters → DocRecord (id + hash) → datatrove MinhashDedupSignature
                      buckets     datatrove MinhashDedupBuckets (one task per bucket)
                      clusters    datatrove MinhashDedupCluster → MinhashClusters (1 task):
                                  the first document of each cluster is kept
    the build         reader → filters → DedupFilter → tokenize + shard

Working files live in OUTPUT/dedup/: docs/NNNNN.parquet (pass 1: per task, the id and the text hash
of every document that passed the filters, in order), datatrove's signatures/,
buckets/ and clusters/ (minhash), and drop/NNNNN.parquet (per task: the position, id and kept
copy's id of each document to drop, and how many documents the task's first pass counted), with
decisions.json, the sha256 of the first pass's text hashes and of the drop tables (an s3:// build's
task records it: pipelines/task_upload.py) and of each drop table alone, which the build's pass checks
its task's against (a table replaced after the stages ran kept a known duplicate, validated OK).
"First" is input order: task, then position in the task. Documents are named by their position
among those that passed the filters, which is how datatrove's MinHash stages name them too; both
passes run the same reader and filters, and DedupFilter checks every document's text hash, the id
of every document it drops and the task's document count against what the first pass recorded (an
input file rewritten at the same size in between, which the build's identity of inputs does not
see, would otherwise have its documents dropped on decisions made over other text).

Every file here is a pure function of the input and the recipe and is rewritten whole by a rerun
of its task (the tables through a temporary name), so a stage killed at any point and rerun gives
the same bytes, and so does the build.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupSignature,
)
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.utils.hashing import HashConfig

from pipelines import faults
from pipelines.config import DedupConfig
from pipelines.filters import ExcludedWriter, RegexWordTokenizer, drop
from pipelines.progress import TaskProgress
from training.contract.atomic_write import atomic_path, write_atomic
from training.contract.dataset_format import COMPLETIONS_DIR, DEDUP_DIR, LOGS_DIR, finished_tasks
from training.contract.errors import GristmillError

# in it: the sha256 of every drop table's content (decisions_sha256), and of each ("tables": {rank: …})
DECISIONS_JSON = "decisions.json"
FILTER_NAME = "dedup"  # the excluded/ rows' filter, the end table's and the audit's row
DOCS_SCHEMA = pa.schema([("id", pa.string()), ("hash_hi", pa.uint64()), ("hash_lo", pa.uint64())])
DROP_SCHEMA = pa.schema([("position", pa.int64()), ("id", pa.string()), ("kept_id", pa.string())])
DOCUMENTS_KEY = b"documents"  # drop/ tables' metadata: documents the task's first pass counted
FIRST_PASS = {"exact": "hashes", "minhash": "signatures"}  # the stage that reads the input (docs/)
CLUSTERS = "clusters"  # the stage that writes drop/ (one task)


class DedupError(GristmillError):
    """Dedup working files that are missing or do not match the documents the build reads."""


@dataclass
class Stage:
    """One datatrove pipeline of the build, run to completion before the next one starts."""

    name: str  # "signatures"; the build's own pass is "build"
    pipeline: list
    tasks: int
    logs: Path  # its datatrove logging dir
    reads_input: bool  # reads the source (its progress is shown like the build's)


def normalise(text: str) -> str:
    """What exact dedup compares: lowercase, whitespace runs folded to one space, ends stripped;
    punctuation, digits and accents are kept."""
    return " ".join(text.lower().split())


def text_hash(text: str) -> tuple[int, int]:
    """128 bits of blake2b of the normalised text, as two integers (collisions: none in practice)."""
    d = hashlib.blake2b(normalise(text).encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


def text_hash_hex(text: str) -> str:
    """text_hash as the manifest's text_hash column holds it: each 64-bit half in 16 hex digits, so the
    digest's bytes 7..0 then 15..8, not blake2b's hexdigest (docs/audit.md says so; the manifests written
    hold this form and a redone task must match its siblings: not changed, review R27a m3)."""
    hi, lo = text_hash(text)
    return f"{hi:016x}{lo:016x}"


def _table_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"{rank:05d}.parquet"


def decisions_sha256(out: str | Path) -> str | None:
    """The dedup decisions of the build whose work directory is `out`, what every task's output
    follows: the sha256 of the text hashes the first pass read and of every drop table's content
    (written by the stages' last, after the tables: `_write_drops`). None where the stages did not run
    here (no drop table: every task's record was in the bucket, of one set of decisions,
    pipelines/build.py `_dedup_done_in_bucket`). Drop tables without it (deleted, or written by a
    gristmill from before it) are refused: with none to compare, records of other decisions were kept
    (trial RV56a 2)."""
    decisions = _decisions(out)
    return None if decisions is None else decisions["sha256"]


def _decisions(out: str | Path) -> dict | None:
    """OUTPUT/dedup/decisions.json (decisions_sha256 says when it is None, and when refused)."""
    root = Path(out) / DEDUP_DIR
    path = root / DECISIONS_JSON
    if not path.is_file() and not (root / "drop").is_dir():
        return None
    try:
        decisions = json.loads(path.read_text())
        decisions["sha256"] = str(decisions["sha256"])
        return decisions
    except (OSError, ValueError, KeyError, TypeError):
        # the whole folder: the driver reads the file before any stage (review RV55e 2), and drop
        # tables without it are refused (trial RV56a 3)
        raise DedupError(
            f"{path} is missing or cannot be read (the dedup decisions every task's output follows): "
            f"delete {root} and {Path(out) / LOGS_DIR / DEDUP_DIR} and rerun the same command"
        ) from None


def _write_table(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _read_table(
    path: Path, what: str, made_by: tuple[str, int], columns: list[str] | None = None
) -> pa.Table:
    return _read(path, what, made_by, lambda p: pq.read_table(p, columns=columns))


def _read(path: Path, what: str, made_by: tuple[str, int], read):
    """`read(path)` of a dedup working table that stage `made_by` (its name, its tasks) writes; one line
    where it is missing or cannot be read."""
    if not path.is_file():
        # run before it (by hand, or a job outside its chain), not removed (trial RV70c 3)
        if (why := unfinished_stage(path.parents[2], *made_by, "that writes it ")) is not None:
            raise DedupError(f"{path} is missing ({what}): {why}")
        raise _redo_stages(path, what, "is missing", "dedup files were removed after their stage finished")
    try:
        return read(path)
    except (OSError, pa.ArrowException) as e:  # a zero-byte table gave a task's traceback, rerun after rerun
        raise _redo_stages(path, what, f"cannot be read: {str(e).splitlines()[0]}", "damaged") from None


def unfinished_stage(out: Path, stage: str, tasks: int, which: str = "") -> str | None:
    """Why what reads dedup stage `stage`'s files (its `tasks`; `which` follows its name) cannot run
    yet: it has not finished; None once every task of it completed."""
    done = len(finished_tasks(stage_logs(out, stage) / COMPLETIONS_DIR) & set(range(tasks)))
    if done == tasks:
        return None
    return (
        f"the dedup stage {stage} {which}has not finished (tasks done: {done} of {tasks}); run or await "
        "that stage's tasks first (its Slurm chain orders them: each stage's job starts after the one "
        "before succeeded), then this one"
    )


class AfterStage(PipelineStep):
    """A dedup stage's first step: its tasks read the stage before's files, so none starts before that
    stage finished (datatrove's MinHash buckets, run early, read the signatures there were and found no
    duplicate without a word, and its clusters stopped on an assertion: re-trial RV70e 4)."""

    type = "🫂 - DEDUP"
    name = "after the stage before"

    def __init__(self, out: Path, stage: str, tasks: int, own: str):
        super().__init__()
        self.out, self.stage, self.tasks, self.own = Path(out), stage, tasks, own

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        # not a generator: checked as the task starts (the steps after it do not read `data`)
        if (why := unfinished_stage(self.out, self.stage, self.tasks)) is not None:
            raise DedupError(f"task {rank} of the dedup stage {self.own} cannot start: {why}")
        return data


def _redo_stages(path: Path, what: str, state: str, why: str) -> DedupError:
    """One line for a working file of the dedup stages (OUTPUT/dedup/<docs|drop>/NNNNN.parquet) that a
    rerun of them rewrites: deleting their completion markers redoes them."""
    logs = path.parents[2] / LOGS_DIR / DEDUP_DIR
    return DedupError(
        f"{path} {state} ({what}): {why}; delete {logs} and rerun the same command "
        "(the dedup stages are redone)"
    )


def _drop_table_parts(rank: int, table: pa.Table) -> list[bytes]:
    """What decisions.json's digests take of task `rank`'s drop table: its content, not its bytes
    (pyarrow's version is in them). No JSON of every row: ~10^8 of them at FineWeb-Edu's size."""
    documents = int(table.schema.metadata[DOCUMENTS_KEY])
    return [
        np.asarray([rank, documents, table.num_rows], np.int64).tobytes(),
        np.asarray(table.column("position").to_numpy(), np.int64).tobytes(),
        *("\0".join(table.column(c).to_pylist()).encode() + b"\1" for c in ("id", "kept_id")),
    ]


def _table_sha256(parts: list[bytes]) -> str:
    """decisions.json's "tables" entry of a drop table: the sha256 of its _drop_table_parts."""
    return hashlib.sha256(b"".join(parts)).hexdigest()


class DocRecord(PipelineStep):
    """First pass: records the id of every document reaching it and the hash of its normalised text,
    in order, as OUTPUT/dedup/docs/NNNNN.parquet; forwards the documents."""

    type = "🫂 - DEDUP"
    name = "record ids and text hashes"

    def __init__(self, folder: str | Path, progress: TaskProgress | None = None):
        super().__init__()
        self.folder = str(folder)
        self.progress = progress

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        ids: list[str] = []
        hi: list[int] = []
        lo: list[int] = []
        for doc in data:
            ids.append(doc.id)
            with self.track_time():
                h = text_hash(doc.text)
            hi.append(h[0])
            lo.append(h[1])
            self.stat_update("documents")
            if self.progress:
                self.progress.kept += 1
                self.progress.tick()
            if len(ids) == 10:
                faults.maybe_kill(rank, "dedup_pass1")
            yield doc
        _write_table(_table_path(self.folder, rank), pa.table([ids, hi, lo], schema=DOCS_SCHEMA))
        if self.progress:
            self.progress.phase = "done"
            self.progress.flush()


def _write_drops(
    root: Path,
    first_pass: tuple[str, int],
    task: np.ndarray,
    position: np.ndarray,
    group: np.ndarray,
    rank: int,
) -> int:
    """Given every duplicated document as (task, position) with its group (an equal hash, or a
    MinHash cluster), keep the first of each group in input order and write every task's drop
    table (empty ones too: a missing table is an error, not "nothing to drop"). Reads one task's
    ids at a time, each once: a kept copy precedes its duplicates, so when task r's table is
    written the ids of every kept copy it names (in tasks ≤ r) are known. Returns the number of
    documents dropped."""
    (root / DECISIONS_JSON).unlink(missing_ok=True)  # none beside tables it does not describe, if killed
    tasks = first_pass[1]
    decided = hashlib.sha256()  # of the tables' content, not their bytes (pyarrow's version is in them)
    order = np.lexsort((position, task, group))
    task, position, group = task[order], position[order], group[order]
    first = np.ones(len(group), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    kept = np.maximum.accumulate(np.where(first, np.arange(len(group)), 0))[~first]
    task_d, position_d = task[~first], position[~first]
    kept_ids = np.empty(len(task_d), dtype=object)
    tables: dict[str, str] = {}
    for r in range(tasks):
        docs = _read_table(_table_path(root / "docs", r), f"the ids of task {r}", first_pass)
        ids = docs.column("id")
        # the text the first pass read, too: a text rewritten that made no other drop left the digest as
        # it was, and a finished task of the old text was kept by its record (trial RV56a 1)
        for column in ("hash_hi", "hash_lo"):  # (a MinHash first pass of an older gristmill: none)
            if column in docs.column_names:
                decided.update(docs.column(column).to_numpy().tobytes())
        sel = task[kept] == r
        kept_ids[sel] = ids.take(pa.array(position[kept[sel]])).to_pylist()
        sel = np.flatnonzero(task_d == r)
        sel = sel[np.argsort(position_d[sel], kind="stable")]
        pos = pa.array(position_d[sel], pa.int64())
        table = pa.table(
            [pos, ids.take(pos), pa.array(kept_ids[sel], pa.string())],
            schema=DROP_SCHEMA.with_metadata({DOCUMENTS_KEY: str(len(ids)).encode()}),
        )
        _write_table(_table_path(root / "drop", r), table)
        parts = _drop_table_parts(r, table)
        for part in parts:
            decided.update(part)
        tables[str(r)] = _table_sha256(parts)
        if r == 0:
            faults.maybe_kill(rank, "dedup_clusters")  # one drop table written, the others not yet
    write_atomic(root / DECISIONS_JSON, json.dumps({"sha256": decided.hexdigest(), "tables": tables}) + "\n")
    return len(task_d)


class _KeepFirst(PipelineStep):
    """One task over the whole build: `groups` gives every duplicated document as (task, position)
    with its group; the first of each group in input order is kept, the others are written to
    OUTPUT/dedup/drop/ (every task's table, empty ones too)."""

    type = "🫂 - DEDUP"
    kind: str  # the dedup.kind whose stages it ends

    @property
    def first_pass(self) -> tuple[str, int]:
        """The stage that writes docs/, and its tasks (named where a table of it is missing)."""
        return FIRST_PASS[self.kind], self.tasks

    def __init__(self, root: str | Path, tasks: int):
        super().__init__()
        self.root = str(root)
        self.tasks = tasks

    def groups(self, root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> None:
        with self.track_time():
            task, position, group = self.groups(Path(self.root))
            dropped = _write_drops(Path(self.root), self.first_pass, task, position, group, rank)
        self.stat_update("duplicated", value=len(task))
        self.stat_update("dropped", value=dropped)


class ExactClusters(_KeepFirst):
    """Exact dedup's groups: documents with equal text hashes (from the first pass's tables)."""

    name = "exact clusters"
    kind = "exact"

    def groups(self, root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hashes, task, position = [], [], []
        for r in range(self.tasks):
            path = _table_path(root / "docs", r)
            t = _read_table(path, f"the text hashes of task {r}", self.first_pass, ["hash_hi", "hash_lo"])
            hashes.append(np.stack([t.column("hash_hi").to_numpy(), t.column("hash_lo").to_numpy()], axis=1))
            task.append(np.full(len(t), r, dtype=np.int64))
            position.append(np.arange(len(t), dtype=np.int64))
        # one group number per distinct hash; only hashes seen more than once matter
        _, group, counts = np.unique(np.concatenate(hashes), axis=0, return_inverse=True, return_counts=True)
        dup = counts[group] > 1
        return np.concatenate(task)[dup], np.concatenate(position)[dup], group[dup]


class MinhashClusters(_KeepFirst):
    """MinHash dedup's groups, after datatrove's MinhashDedupCluster (save_cluster_id=True) in the
    same task: its `NNNNNN.clusters` files hold (position, cluster id) of every document in a
    cluster. The first of each cluster is kept instead of datatrove's union-find root, the same
    rule as exact dedup's, which says something to whoever reads the drops."""

    name = "minhash kept copies"
    kind = "minhash"

    def groups(self, root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        task, position, cluster = [], [], []
        for r in range(self.tasks):
            path = root / "clusters" / f"{r:06d}.clusters"  # absent: no duplicate in task r
            pairs = np.fromfile(path, dtype="<u4").reshape(-1, 2) if path.is_file() else np.empty((0, 2))
            task.append(np.full(len(pairs), r, dtype=np.int64))
            position.append(pairs[:, 0].astype(np.int64))
            cluster.append(pairs[:, 1].astype(np.int64))
        return np.concatenate(task), np.concatenate(position), np.concatenate(cluster)


class DedupFilter(BaseFilter):
    """The build's pass: drops the documents its task's drop table lists, recording each in
    excluded/ as "<kind> duplicate of <kept id>"."""

    name = FILTER_NAME

    def __init__(self, root: str | Path, kind: str, exclusion_writer: ExcludedWriter | None = None):
        super().__init__(exclusion_writer)
        self.root = str(root)
        self.kind = kind
        self._rank = self._next = self._seen = 0  # this task's: set by run
        self._drops: dict[str, list] = {}
        self._hashes: tuple[np.ndarray, np.ndarray] | None = None  # per document, the first pass's text hash

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        path, what = (
            _table_path(Path(self.root) / "drop", rank),
            f"the documents task {rank} drops as duplicates",
        )
        table = _read_table(path, what, (CLUSTERS, 1))
        # (decisions.json of a gristmill from before "tables": its tables go unchecked)
        tables = (_decisions(Path(self.root).parent) or {}).get("tables")
        if isinstance(tables, dict):
            recorded, state = tables.get(str(rank)), f"differs from its sha256 in {DECISIONS_JSON}"
            if not isinstance(recorded, str):
                recorded, state = None, f"has no sha256 in {DECISIONS_JSON}"
            try:
                same = recorded == _table_sha256(_drop_table_parts(rank, table))
            except (KeyError, TypeError, ValueError, pa.ArrowException):  # its metadata or columns gone
                same = False
            if not same:
                raise _redo_stages(path, what, state, "changed since the stages wrote it")
        self._drops = table.to_pydict()
        docs, what = _table_path(Path(self.root) / "docs", rank), f"the text hashes of task {rank}"
        # (a first pass of an older gristmill recorded no hash for MinHash: its build goes on unchecked)
        first = (FIRST_PASS[self.kind], world_size)
        if not docs.is_file() or "hash_hi" in _read(docs, what, first, pq.read_schema).names:
            t = _read_table(docs, what, first, ["hash_hi", "hash_lo"])  # 16 bytes a document
            self._hashes = t.column("hash_hi").to_numpy(), t.column("hash_lo").to_numpy()
        self._rank, self._next, self._seen = rank, 0, 0
        yield from super().run(data, rank, world_size)
        expected = int(table.schema.metadata[DOCUMENTS_KEY])
        if self._seen != expected:
            raise self._mismatch(f"{self._seen} documents reached it, the first pass counted {expected}")

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        i, drops = self._seen, self._drops
        self._seen += 1
        if self._hashes is not None and i < len(self._hashes[0]):
            hi, lo = text_hash(doc.text)
            if hi != int(self._hashes[0][i]) or lo != int(self._hashes[1][i]):
                raise self._mismatch(f"document {i} ({doc.id!r}) has other text than the first pass read")
        if self._next < len(drops["position"]) and drops["position"][self._next] == i:
            j = self._next
            self._next += 1
            if doc.id != drops["id"][j]:
                raise self._mismatch(f"document {i} is {doc.id!r}, the first pass saw {drops['id'][j]!r}")
            return drop(doc, "duplicate", f"{self.kind} duplicate of {drops['kept_id'][j]}")
        return True

    def _mismatch(self, what: str) -> DedupError:
        root = Path(self.root).parent
        return DedupError(
            f"dedup files do not match the documents task {self._rank} reads ({what}): an input file, "
            f"the reader or the filters changed since the dedup stages ran; delete {root / DEDUP_DIR}, "
            f"{root / LOGS_DIR / DEDUP_DIR} and {root / LOGS_DIR / 'completions'} and rerun the same "
            "command (the dedup stages and every task are redone: a task that finished was filtered by "
            "decisions made over the old text)"
        )


def minhash_config(cfg: DedupConfig) -> MinhashConfig:
    # sha1: datatrove's default xxhash is handed str, which xxhash ≥ 4 refuses ("Strings must be
    # encoded before hashing").
    return MinhashConfig(
        n_grams=cfg.ngram,
        num_buckets=cfg.buckets,
        hashes_per_bucket=cfg.hashes_per_bucket,
        hash_config=HashConfig(precision=64, hash_fc="sha1"),
    )


def check_config(cfg: DedupConfig) -> None:
    """One line for settings the stages cannot run with (before anything is written), whatever the
    kind: under "exact", dedup.buckets = -1 was accepted and written into the dataset's config.toml
    (trial RV74c 8)."""
    for key in ("ngram", "buckets", "hashes_per_bucket"):
        if getattr(cfg, key) < 1:
            raise DedupError(f"dedup.{key} = {getattr(cfg, key)} must be ≥ 1 (FineWeb: ngram 5, buckets 14, "
                             "hashes_per_bucket 8)")  # fmt: skip


def stage_logs(out: Path, name: str) -> Path:
    """A dedup stage's datatrove logging dir (completion markers, stats, task logs)."""
    return out / LOGS_DIR / DEDUP_DIR / name


def decided_over(out: Path, kind: str, tasks: set[int]) -> set[int]:
    """Those of first-pass tasks `tasks` whose input the dedup stages in `out` already decided over:
    the task completed, or any later stage did (then all of them). A changed input of theirs would
    then be filtered by decisions made on its old contents (and finished tasks kept what those kept)."""
    decided: set[int] = set()
    for stage in (out / LOGS_DIR / DEDUP_DIR).glob("*"):
        done = finished_tasks(stage / "completions")
        if stage.name == FIRST_PASS[kind]:
            decided |= done & tasks
        elif done:
            return set(tasks)
    return decided


def first_pass_logs(out: Path, cfg: DedupConfig) -> Path:
    return stage_logs(out, FIRST_PASS[cfg.kind])


def dedup_stages(
    cfg: DedupConfig, out: Path, first_steps: list, tasks: int, progress: TaskProgress
) -> list[Stage]:
    """The stages that run before the build's pass; `first_steps` are the reader and the filters
    (recording nothing: the build's pass records the drops), `progress` the first pass's."""
    stages = _stages(cfg, out, first_steps, tasks, progress)
    for before, stage in zip(stages, stages[1:]):  # each reads the files of the one before
        stage.pipeline.insert(0, AfterStage(out, before.name, before.tasks, stage.name))
    return stages


def _stages(
    cfg: DedupConfig, out: Path, first_steps: list, tasks: int, progress: TaskProgress
) -> list[Stage]:
    root = out / DEDUP_DIR
    logs = lambda name: stage_logs(out, name)
    if cfg.kind == "exact":
        return [
            Stage(
                "hashes",
                [*first_steps, DocRecord(root / "docs", progress)],
                tasks,
                logs("hashes"),
                True,
            ),
            Stage(CLUSTERS, [ExactClusters(root, tasks)], 1, logs(CLUSTERS), False),
        ]
    if cfg.kind == "minhash":
        mc = minhash_config(cfg)
        signature = MinhashDedupSignature(str(root / "signatures"), config=mc, language=RegexWordTokenizer())
        return [
            Stage(
                "signatures",
                [*first_steps, DocRecord(root / "docs", progress), signature],
                tasks,
                logs("signatures"),
                True,
            ),
            Stage(
                "buckets",
                [MinhashDedupBuckets(str(root / "signatures"), str(root / "buckets"), config=mc)],
                cfg.buckets,
                logs("buckets"),
                False,
            ),
            Stage(
                CLUSTERS,
                [
                    MinhashDedupCluster(
                        str(root / "buckets"), str(root / "clusters"), config=mc, save_cluster_id=True
                    ),
                    MinhashClusters(root, tasks),
                ],
                1,
                logs(CLUSTERS),
                False,
            ),
        ]
    return []


def dedup_filter(cfg: DedupConfig, out: Path, per_task: bool = False) -> list[BaseFilter]:
    """The build pass's step ([] when dedup is off; `per_task`: see ExcludedWriter)."""
    if cfg.kind == "none":
        return []
    return [DedupFilter(out / DEDUP_DIR, cfg.kind, ExcludedWriter(out, FILTER_NAME, per_task=per_task))]
