"""Decontamination in the build: the filter step, and the index it reads (OUTPUT/decontam/).

With `[decontaminate]` in a recipe the driver gets an index before any task runs (`stage_index`):
it runs `gristmill data decontam-index` through the CLI's command table (the command lives in
validation/ because it reads the tasks with lm-eval; pipelines/ never imports lm-eval) into a
temporary directory, or checks the prebuilt one that `index = DIR` names (for a cluster without
the hub: build it where there is network). The index's sha256 and n go into the build's identity,
so a changed index is a changed dataset (a resume is refused, naming it). Inside the build lock the
index is copied to OUTPUT/decontam/ (`install_index`), where every worker reads it: a dataset
carries the index it was filtered against, and Slurm or Ray nodes need nothing but the output.

`DecontaminationFilter` needs numpy only (pipelines/ngram_index.py): it opens the index once per
worker, memory-mapped, and drops a document that contains any indexed n-gram; its excluded/ row
names the task, split, document and the matching words. At the end `dataset_entry` puts the
index's manifest and the documents removed per task into dataset.json, which `gristmill eval`
reads to mark each task it scores.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.build_identity import BuildError
from pipelines.config import DecontaminateConfig
from pipelines.filters import ExcludedWriter, drop
from pipelines.ngram_index import (
    FILTER_NAME,
    HASHES_NPY,
    MANIFEST_JSON,
    REFS_NPY,
    NgramIndex,
    read_manifest,
    task_of_detail,
)
from training.contract.dataset_format import EXCLUDED_DIR
from training.contract.errors import GristmillError

INDEX_DIR = "decontam"  # OUTPUT/decontam/: the index the dataset was filtered against


class DecontaminationFilter(BaseFilter):
    """Drops a document containing any n-gram of the index; the reason is the task's name (datatrove
    counts drops per task in its stats), the excluded/ detail names task, split, document and text."""

    name = FILTER_NAME

    def __init__(
        self, index_dir: str | Path, exclusion_writer: ExcludedWriter | None = None, batch_size: int = 64
    ):
        # Documents are looked up in batches: numpy's per-call overhead is then paid once per batch.
        super().__init__(exclusion_writer, batch_size)
        self.index_dir = str(index_dir)
        self._index: NgramIndex | None = None  # opened in the worker, on its first batch

    def _open(self) -> NgramIndex:
        if self._index is None:
            self._index = open_index(self.index_dir)
        return self._index

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        matches = self._open().first_matches([doc.text for doc in batch])
        return [True if m is None else drop(doc, m.task, m.detail()) for doc, m in zip(batch, matches)]

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return self.filter_batch([doc])[0]


# datatrove copies the pipeline for every task (a deepcopy, or a pickle into the pool), so a filter's
# own attribute would rebuild the index's bitmap once per task: the opened index is kept per process,
# keyed by its folder and its manifest's identity (a rebuilt index at the same path is opened anew).
_opened: dict[tuple[str, int, int], NgramIndex] = {}


def open_index(folder: str) -> NgramIndex:
    try:
        st = (Path(folder) / MANIFEST_JSON).stat()
    except OSError:
        return NgramIndex(folder)  # its own error names what is missing
    key = (folder, st.st_mtime_ns, st.st_size)
    if key not in _opened:
        _opened.clear()  # one index per build: keep no stale one alive
        _opened[key] = NgramIndex(folder)
    return _opened[key]


def enabled(cfg: DecontaminateConfig) -> bool:
    return bool(cfg.tasks or cfg.index)


def decontam_filter(cfg: DecontaminateConfig, out: Path, record: bool = True) -> list[BaseFilter]:
    """The filter step reading OUTPUT/decontam/ ([] without [decontaminate]); `record`: its drops
    go to OUTPUT/excluded/ (dedup's first pass runs it without)."""
    if not enabled(cfg):
        return []
    return [DecontaminationFilter(out / INDEX_DIR, ExcludedWriter(out, FILTER_NAME) if record else None)]


@dataclass(frozen=True)
class StagedIndex:
    folder: Path  # where the index is before install_index copies it into the output
    manifest: dict[str, Any]
    temporary: bool  # made by this build (removed once installed)

    def identity(self) -> dict[str, Any]:
        """What of the index decides the dataset: its hashes (sha256) and n; the task names to
        name a change."""
        m = self.manifest
        return {"index_sha256": m["sha256"], "ngram": m["ngram"], "tasks": [t["name"] for t in m["tasks"]]}


def stage_index(cfg: DecontaminateConfig, log=print) -> StagedIndex | None:
    """The index `cfg` asks for: built now from `tasks` (validation.decontam_index) or the
    prebuilt `index`, checked against `tasks` and `ngram`. None without [decontaminate]."""
    if not enabled(cfg):
        return None
    if cfg.ngram < 1:
        raise BuildError(f"decontaminate.ngram = {cfg.ngram}: an n-gram has at least one word (13 is usual)")
    if cfg.index:
        folder = Path(cfg.index).expanduser().resolve()
        manifest = read_manifest(folder, verify=True)
        if manifest["ngram"] != cfg.ngram:
            raise BuildError(
                f"decontaminate.ngram = {cfg.ngram}, but the index {folder} holds {manifest['ngram']}-grams; "
                f"set ngram = {manifest['ngram']} or rebuild the index with --ngram {cfg.ngram}"
            )
        have = manifest.get("requested") or [t["name"] for t in manifest["tasks"]]
        if cfg.tasks and sorted(cfg.tasks) != sorted(have):
            raise BuildError(
                f"decontaminate.tasks = {cfg.tasks}, but the index {folder} was built for {have}; make them "
                f"equal, or leave tasks empty to use the index as it is"
            )
        return StagedIndex(folder, manifest, temporary=False)

    # Imported only now: the driver may import lm-eval, the workers, which import this module for
    # the filter, do not.
    from validation.decontam_index import build_index, summary

    tmp = Path(tempfile.mkdtemp(prefix="gristmill-decontam-"))
    include = [str(Path(p).expanduser().resolve()) for p in cfg.include_path]
    argv = ["data", "decontam-index", "--tasks", ",".join(cfg.tasks), "--ngram", str(cfg.ngram)]
    argv += [a for p in include for a in ("--include-path", p)]
    log(f"[build] decontamination index: gristmill {' '.join(argv)} --out {tmp}")  # the same, by hand
    try:
        manifest = build_index(list(cfg.tasks), cfg.ngram, tmp, include)
        log(summary(manifest, tmp))
        return StagedIndex(tmp, manifest, temporary=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def discard_staged(staged: StagedIndex | None) -> Iterator[None]:
    """Remove a temporary staged index when the build stops before installing it (refused, locked)."""
    try:
        yield
    finally:
        if staged is not None and staged.temporary:
            shutil.rmtree(staged.folder, ignore_errors=True)


def install_index(staged: StagedIndex | None, out: Path) -> None:
    """Copy the staged index to OUTPUT/decontam/ (kept when it already holds the same one: a
    resume). Called inside the build lock."""
    if staged is None:
        return
    dst = out / INDEX_DIR
    try:
        same = (dst / MANIFEST_JSON).is_file() and read_manifest(dst)["sha256"] == staged.manifest["sha256"]
    except GristmillError:  # a damaged copy: replaced below
        same = False
    if not same:
        tmp = out / f"{INDEX_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in (HASHES_NPY, REFS_NPY, MANIFEST_JSON):  # the manifest last: it makes an index
            shutil.copyfile(staged.folder / name, tmp / name)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)


def removed_by_task(out: Path) -> dict[str, int]:
    """{task: documents the filter excluded} from OUTPUT/excluded/*_decontaminate.parquet."""
    counts: dict[str, int] = {}
    for path in sorted((out / EXCLUDED_DIR).glob(f"*_{FILTER_NAME}.parquet")):
        for reason in pq.read_table(path, columns=["reason"]).column("reason").to_pylist():
            task = task_of_detail(reason or "")
            if task is not None:
                counts[task] = counts.get(task, 0) + 1
    return counts


def dataset_entry(cfg: DecontaminateConfig, out: Path) -> dict[str, Any] | None:
    """dataset.json's "decontaminate": the index's n, sha256 and lm-eval version, and per task its
    split, version, documents, n-grams and the training documents removed. None when off."""
    if not enabled(cfg):
        return None
    m = read_manifest(out / INDEX_DIR)
    removed = removed_by_task(out)
    keys = ("name", "split", "version", "documents", "ngrams")
    tasks = [{**{k: t.get(k) for k in keys}, "removed": removed.get(t["name"], 0)} for t in m["tasks"]]
    return {
        "ngram": m["ngram"],
        "index_sha256": m["sha256"],
        "lm_eval": m.get("lm_eval"),
        "requested": m.get("requested"),
        "tasks": tasks,
        "removed": sum(removed.values()),
    }
