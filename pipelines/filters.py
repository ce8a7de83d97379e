"""Filters as datatrove steps; every dropped document is recorded in OUTPUT/excluded/*.parquet.

Each filter is a datatrove `BaseFilter` whose `exclusion_writer` is an `ExcludedWriter`: one
parquet file per (task, filter) with the contract's EXCLUDED_SCHEMA (id, url, dump, filter, reason,
source_file, source_row). datatrove's own Gopher filters plug in the same way, so their drops are
recorded too. Kept + excluded = read, for every task.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import regex
from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.utils.word_tokenizers import WordTokenizer

from pipelines.config import FiltersConfig
from pipelines.sources import READ_ERROR, unicode_problem
from pipelines.task_upload import task_root
from training.contract.atomic_write import move_into_place
from training.contract.dataset_format import (
    EXCLUDED_DIR,
    EXCLUDED_FIELDS,
    EXCLUDED_SCHEMA,
    SOURCE_FILE,
    SOURCE_ROW,
    source_columns,
)
from training.contract.errors import GristmillError

TMP_SUFFIX = ".tmp"
# A filter returns a short categorical reason (datatrove counts drops per reason in its stats) and
# may put the document-specific detail ("int_score 2 < 3") here for the excluded/ row.
DETAIL = "exclusion_detail"


def drop(doc: Document, reason: str, detail: str) -> tuple[bool, str]:
    doc.metadata[DETAIL] = detail
    return False, reason


class ExcludedWriter:
    """datatrove exclusion writer: rows of EXCLUDED_SCHEMA, written atomically per (task, filter).

    Rows are buffered and flushed every `flush_rows` into a temporary parquet file, moved into place
    as `excluded/NNNNN_<filter>.parquet` (fsynced, renamed) when the filter finishes; a killed task
    leaves only the temporary name, which its rerun overwrites. `per_task`: under the task's own folder
    of `root` (an s3:// build's, pipelines/task_upload.task_root), not under `root` itself.
    """

    def __init__(self, root: str | Path, filter_name: str, flush_rows: int = 50_000, per_task: bool = False):
        self.root = str(root)
        self.per_task = per_task
        self.filter_name = filter_name
        self.flush_rows = flush_rows
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._path: str | None = None

    def __enter__(self) -> ExcludedWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:  # a failed task: its partial file keeps the temporary name
            self._writer.close()
            self._writer = None
            self._path = None

    def write(self, doc: Document, rank: int = 0) -> None:
        if self._path is None:
            folder = os.path.join(task_root(self.root, rank) if self.per_task else self.root, EXCLUDED_DIR)
            os.makedirs(folder, exist_ok=True)
            self._path = os.path.join(folder, f"{rank:05d}_{self.filter_name}.parquet")
        m = doc.metadata
        self._rows.append(
            {
                **source_columns(m, EXCLUDED_FIELDS),
                "id": doc.id,  # the reader's id (source.id_key), not a metadata key
                "filter": self.filter_name,
                "reason": str(m.get(DETAIL) or m.get("filter_reason") or self.filter_name),
                SOURCE_FILE: m.get(SOURCE_FILE),
                SOURCE_ROW: m.get(SOURCE_ROW),
            }
        )
        if len(self._rows) >= self.flush_rows:
            self._flush()

    def _flush(self) -> None:
        assert self._path is not None
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._path + TMP_SUFFIX, EXCLUDED_SCHEMA)
        self._writer.write_table(pa.Table.from_pylist(self._rows, schema=EXCLUDED_SCHEMA))
        self._rows = []

    def close(self) -> None:
        if self._path is None:
            return
        self._flush()
        assert self._writer is not None
        self._writer.close()
        move_into_place(self._path + TMP_SUFFIX, self._path)
        self._writer = None
        self._path = None


class TextFilter(BaseFilter):
    """Always on: drops read errors, empty/whitespace-only text and text that is not valid UTF-8
    (undecodable bytes or lone surrogates, which no tokenizer can encode faithfully)."""

    name = "text"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if READ_ERROR in doc.metadata:
            return drop(doc, "unreadable", str(doc.metadata[READ_ERROR]))
        text = doc.text
        if not text or text.isspace():
            return drop(doc, "empty", "empty or whitespace-only text")
        if (why := unicode_problem(text)) is not None:
            return drop(doc, "invalid_utf8", f"invalid UTF-8: {why[0]} at character {why[1]}")
        return True


class MinMetadataFilter(BaseFilter):
    """Drops documents whose numeric metadata `key` is below `minimum` (or missing)."""

    def __init__(self, key: str, minimum: float, exclusion_writer=None):
        self.name = key  # before super().__init__, which names the stats after it
        super().__init__(exclusion_writer)
        self.key = key
        self.minimum = minimum

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        value = doc.metadata.get(self.key)
        if value is None:
            return drop(doc, "missing", f"no {self.key} in the source")
        if value != value:  # NaN (parquet from polars or Spark, a jsonl NaN): no score, and `<` passes it
            return drop(doc, "missing", f"{self.key} is NaN in the source")
        if value < self.minimum:
            return drop(doc, "below", f"{self.key} {value} < {self.minimum}")
        return True


class LengthFilter(BaseFilter):
    """Drops documents shorter than `min_chars` or longer than `max_chars` characters."""

    name = "length"

    def __init__(self, min_chars: int | None, max_chars: int | None, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.min_chars = min_chars
        self.max_chars = max_chars

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        n = len(doc.text)
        if self.min_chars is not None and n < self.min_chars:
            return drop(doc, "too_short", f"{n} chars < min_chars {self.min_chars}")
        if self.max_chars is not None and n > self.max_chars:
            return drop(doc, "too_long", f"{n} chars > max_chars {self.max_chars}")
        return True


class RegexWordTokenizer(WordTokenizer):
    """A dependency-free word splitter for datatrove's Gopher filters (letters/digits runs and
    single punctuation marks, Unicode-aware), used instead of spaCy unless configured."""

    _words = regex.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]")
    _sents = regex.compile(r"[^.!?\n]+(?:[.!?]+|\n|$)")

    def __init__(self):
        super().__init__("en")

    def word_tokenize(self, text: str) -> list[str]:
        return self._words.findall(text)

    def sent_tokenize(self, text: str) -> list[str]:
        return [s.strip() for s in self._sents.findall(text) if s.strip()]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in self._sents.finditer(text) if m.group().strip()]


def _word_tokenizer(cfg: FiltersConfig):
    if cfg.gopher_word_tokenizer == "spacy":
        try:
            import spacy  # noqa: F401
        except ImportError:
            raise GristmillError(
                'filters.gopher_word_tokenizer = "spacy" needs spaCy: `pip install spacy`, '
                'or set it to "regex"'
            ) from None
        return "en"
    return RegexWordTokenizer()


def check_filters(f: FiltersConfig) -> None:
    """Refused before any work, by every command that filters (the build, `gristmill tokenizer train`:
    review R27d m2): a negative filters.min_chars (a silent no-op: review R27a m6), a max_chars below
    1 or below min_chars (nothing kept, said only after every stage had run); a score threshold that is
    nan or infinite (nan compares false, so it kept every scored document: the filter silently off,
    trial RV72c F1; inf dropped them all), a min_language_score outside fastText's confidences, [0, 1]."""
    for key, minimum in (("score", f.min_score), ("language_score", f.min_language_score)):
        if minimum is not None and not math.isfinite(minimum):
            raise GristmillError(
                f"filters.min_{key} = {minimum}: documents whose {key} is lower are dropped; set it to a "
                "finite number, or leave it out for no threshold"
            )
    if f.min_language_score is not None and not 0 <= f.min_language_score <= 1:
        raise GristmillError(
            f"filters.min_language_score = {f.min_language_score}: language_score is fastText's confidence, "
            "from 0 to 1; set it between 0 and 1, or leave it out for no threshold"
        )
    lo, hi = f.min_chars, f.max_chars
    if lo is not None and lo < 0:
        raise GristmillError(
            f"filters.min_chars = {lo}: documents with fewer characters are dropped; set it ≥ 0, or leave it "
            "out for no minimum"
        )
    if hi is not None and hi < 1:
        raise GristmillError(
            f"filters.max_chars = {hi}: documents with more characters are dropped, every one here; set it "
            "≥ 1, or leave it out for no maximum"
        )
    if lo is not None and hi is not None and lo > hi:
        raise GristmillError(
            f"filters.min_chars = {lo} is more than filters.max_chars = {hi}: no document would be kept; set "
            "min_chars ≤ max_chars"
        )


def make_filters(cfg: FiltersConfig, output: str | Path | None, per_task: bool = False) -> list[BaseFilter]:
    """The configured filter steps, in order, each recording its drops under OUTPUT/excluded/
    (`output` None: no recording, for sampling the source; `per_task`: see ExcludedWriter)."""

    def excluded(name: str) -> ExcludedWriter | None:
        return ExcludedWriter(output, name, per_task=per_task) if output is not None else None

    steps: list[BaseFilter] = [TextFilter(excluded("text"))]
    for key, minimum in (
        ("int_score", cfg.min_int_score),
        ("score", cfg.min_score),
        ("language_score", cfg.min_language_score),
    ):
        if minimum is not None:
            steps.append(MinMetadataFilter(key, minimum, excluded(key)))
    if cfg.min_chars is not None or cfg.max_chars is not None:
        steps.append(LengthFilter(cfg.min_chars, cfg.max_chars, excluded("length")))
    if cfg.gopher_repetition or cfg.gopher_quality:
        words = _word_tokenizer(cfg)
        if cfg.gopher_repetition:
            steps.append(
                GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition"), language=words)
            )
        if cfg.gopher_quality:
            steps.append(GopherQualityFilter(exclusion_writer=excluded("gopher_quality"), language=words))
    return steps
