"""The build's decontamination step: drop every document that contains an n-gram of the index.

`DecontaminationFilter` needs numpy only (pipelines/decontam/ngram.py): it opens the index in
OUTPUT/decontam/ once per worker process, memory-mapped, and drops a document that contains any
indexed n-gram; its excluded/ row names the task, split, document and the matching words. Workers
import this module for the filter, never lm-eval (the index is built or checked by the driver,
pipelines/decontam/index.py, before any task runs). At the end `dataset_entry` puts the index's
manifest and the documents removed per task into dataset.json, which `gristmill eval` reads to
mark each task it scores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.build_identity import BuildError
from pipelines.config import DataConfig, DecontaminateConfig
from pipelines.decontam.ngram import (
    FILTER_NAME,
    MANIFEST_JSON,
    DecontamIndexError,
    NgramIndex,
    read_manifest,
    tasks_of_detail,
)
from pipelines.filters import ExcludedWriter, drop
from training.contract.config_loader import given, override_of
from training.contract.dataset_format import DECONTAM_DIR as INDEX_DIR
from training.contract.dataset_format import DECONTAM_FILES, DECONTAM_TASK_KEYS, EXCLUDED_DIR, decontam_sha256


class DecontaminationFilter(BaseFilter):
    """Drops a document containing any n-gram of the index; the reason is the task's name (datatrove
    counts drops per task in its stats), the excluded/ detail names task, split, document and text."""

    name = FILTER_NAME

    def __init__(
        self,
        index_dir: str | Path,
        exclusion_writer: ExcludedWriter | None = None,
        batch_size: int = 64,
        sha256: str | None = None,
    ):
        # Documents are looked up in batches: numpy's per-call overhead is then paid once per batch.
        super().__init__(exclusion_writer, batch_size)
        self.index_dir = str(index_dir)
        self.sha256 = sha256  # the build's index: a copy whose bytes differ is refused, never used
        self._index: NgramIndex | None = None  # opened in the worker, on its first batch

    def _open(self) -> NgramIndex:
        if self._index is None:
            self._index = open_index(self.index_dir, self.sha256)
        return self._index

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        matches = self._open().first_matches([doc.text for doc in batch])
        return [True if m is None else drop(doc, m.task, m.detail()) for doc, m in zip(batch, matches)]

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return self.filter_batch([doc])[0]


# datatrove copies the pipeline for every task (a deepcopy, or a pickle into the pool), so a filter's
# own attribute would rebuild the index's bitmap once per task: the opened index is kept per process,
# keyed by its folder and its files' identity (a rebuilt or altered index is opened, and checked, anew).
_opened: dict[tuple, NgramIndex] = {}


def open_index(folder: str, sha256: str | None = None) -> NgramIndex:
    try:
        stats = [(Path(folder) / name).stat() for name in (MANIFEST_JSON, *DECONTAM_FILES)]
    except OSError:
        return NgramIndex(folder)  # its own error names what is missing
    key = (folder, sha256, *((st.st_mtime_ns, st.st_size) for st in stats))
    if key not in _opened:
        _opened.clear()  # one index per build: keep no stale one alive
        if sha256 is not None:  # once per worker process, before its first lookup
            check_copy(Path(folder), sha256)
        _opened[key] = NgramIndex(folder)
    return _opened[key]


def check_copy(folder: Path, sha256: str) -> None:
    """Refuse an index copy whose files are not the bytes `sha256` records (altered, cut off)."""
    if decontam_sha256(folder) != sha256:
        raise DecontamIndexError(
            f"{folder}: {'/'.join(DECONTAM_FILES)} are missing or damaged (their sha256 is not the "
            f"index's {sha256[:12]}…); rerun the build: it copies the index again"
        )


def enabled(cfg: DecontaminateConfig) -> bool:
    return bool(cfg.tasks or cfg.index)


def check_decontaminate(cfg: DataConfig) -> None:
    """[decontaminate] given but with neither tasks nor an index decontaminates nothing: an index of
    an unset shell variable (`--set decontaminate.index="$IDX"`), or ngram and include_path without
    tasks, built the dataset undecontaminated, exit 0, without a word (trial RV60b 1); so did a section
    that gave only defaults (empty, `ngram = 13`, `include_path = []`: trial RV75c 2). A section that
    names tasks and index, both empty, is a build's saved config.toml of a build without it."""
    d = cfg.decontaminate
    if enabled(d):
        return
    said = [item for key in ("index", "tasks") if (item := override_of(cfg, f"decontaminate.{key}"))]
    keys = [k for k, v in vars(d).items() if v != getattr(DecontaminateConfig(), k)]
    if not keys and not (given(cfg, "decontaminate.tasks") or given(cfg, "decontaminate.index")):
        keys = [k for k in vars(d) if given(cfg, f"decontaminate.{k}")]  # defaults alone
        if not keys and given(cfg, "decontaminate"):
            said = said or ["[decontaminate] (empty)"]
    if said or keys:
        what = said[0] if said else f"decontaminate.{keys[0]} = {getattr(d, keys[0])!r}"
        raise BuildError(
            f"{what}: decontaminate.tasks and decontaminate.index are both empty, so nothing would be "
            "decontaminated; give the tasks (or an index written by `gristmill data decontam-index`), or "
            "leave [decontaminate] out"
        )


def decontam_filter(
    cfg: DecontaminateConfig, out: Path, sha256: str | None, record: bool = True, per_task: bool = False
) -> list[BaseFilter]:
    """The filter step reading OUTPUT/decontam/ ([] without [decontaminate]), which must hold the
    index of `sha256`; `record`: its drops go to OUTPUT/excluded/ (dedup's first pass runs it without;
    `per_task`: see ExcludedWriter)."""
    if not enabled(cfg):
        return []
    writer = ExcludedWriter(out, FILTER_NAME, per_task=per_task) if record else None
    return [DecontaminationFilter(out / INDEX_DIR, writer, sha256=sha256)]


def removed_by_task(out: Path) -> tuple[dict[str, int], int, dict[tuple[str, ...], int]]:
    """({task: documents the filter excluded holding an n-gram of it}, the documents it excluded,
    {tasks: documents holding n-grams of each of those two or more tasks}) from
    OUTPUT/excluded/*_decontaminate.parquet: a document holding several tasks' counts for each task,
    once in the total, and once under its set of tasks (a group's count is of documents, not of
    task-document pairs: review R23e S1)."""
    counts: dict[str, int] = {}
    together: dict[tuple[str, ...], int] = {}
    total = 0
    for path in sorted((out / EXCLUDED_DIR).glob(f"*_{FILTER_NAME}.parquet")):
        for reason in pq.read_table(path, columns=["reason"]).column("reason").to_pylist():
            total += 1
            tasks = tasks_of_detail(reason or "")
            for task in tasks:
                counts[task] = counts.get(task, 0) + 1
            if len(tasks) > 1:
                key = tuple(sorted(tasks))
                together[key] = together.get(key, 0) + 1
    return counts, total, together


def dataset_entry(cfg: DecontaminateConfig, out: Path) -> dict[str, Any] | None:
    """dataset.json's "decontaminate": the index's n, sha256 and lm-eval version, and per task its
    split, version, documents (their count and sha256: None for an index made before it was
    recorded), n-grams, documents_without_ngrams (its documents no training text was checked against:
    every text shorter than n words; a record written before 2026-12-01 lacks it: unknown, not 0) and
    the training documents removed (a document holding several tasks' counted for each, and under
    removed_together once for the set). None when off."""
    if not enabled(cfg):
        return None
    m = read_manifest(out / INDEX_DIR)
    removed, total, together = removed_by_task(out)
    tasks = [
        {**{k: t.get(k) for k in DECONTAM_TASK_KEYS}, "removed": removed.get(t["name"], 0)}
        for t in m["tasks"]
    ]
    return {
        "ngram": m["ngram"],
        "index_sha256": m["sha256"],
        "lm_eval": m.get("lm_eval"),
        "requested": m.get("requested"),
        "tasks": tasks,
        "removed": total,
        # documents counted for several tasks: a group of them removed each once (eval's marks)
        **(
            {"removed_together": [{"tasks": list(k), "documents": n} for k, n in sorted(together.items())]}
            if together
            else {}
        ),
    }
