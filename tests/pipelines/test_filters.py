"""Filters: reasons per dropped document, recorded by the exclusion writer; Gopher filters without spaCy."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from pipelines.config import FiltersConfig
from pipelines.filters import ExcludedWriter, LengthFilter, MinMetadataFilter, TextFilter, make_filters
from pipelines.sources import READ_ERROR
from training.contract.dataset_format import EXCLUDED_SCHEMA

PROSE = (
    "The museum opened a new wing dedicated to the history of printing. Visitors can see early "
    "presses, read about the people who ran them and learn how books changed the way ideas spread "
    "across the continent. Guided tours are offered every afternoon, and the staff are happy to "
    "answer questions about the collection and the restoration work that is still going on."
)


def doc(text: str, i: int = 0, **meta) -> Document:
    return Document(
        text=text,
        id=f"d{i}",
        metadata={
            "url": f"https://x/{i}",
            "dump": "CC-MAIN-2024-10",
            "source_file": "in.jsonl",
            "source_row": i + 1,
        }
        | meta,
    )


def run(step, docs, rank=0):
    return list(step.run(iter(docs), rank=rank, world_size=1))


@pytest.mark.parametrize(
    "text, meta, reason",
    [
        ("", {}, "empty or whitespace-only text"),
        (" \n\t", {}, "empty or whitespace-only text"),
        (
            "ok \udcff\udcfe bytes",
            {},
            "invalid UTF-8: bytes that are not UTF-8 or a lone surrogate at character 3",
        ),
        ("lone \ud800 surrogate", {}, "invalid UTF-8: a lone surrogate at character 5"),
        ("", {READ_ERROR: "a.jsonl:3: malformed JSON (x)"}, "a.jsonl:3: malformed JSON (x)"),
    ],
)
def test_text_filter_reasons(tmp_path, text, meta, reason):
    kept = run(TextFilter(ExcludedWriter(tmp_path, "text")), [doc(text, **meta), doc("fine ✓ text", 1)])
    assert [d.id for d in kept] == ["d1"]
    rows = pq.read_table(tmp_path / "excluded" / "00000_text.parquet").to_pylist()
    assert rows == [
        {"id": "d0", "url": "https://x/0", "dump": "CC-MAIN-2024-10", "filter": "text", "reason": reason}
        | {"source_file": "in.jsonl", "source_row": 1}  # where the source has it (trial RV64b M3)
    ]


def test_threshold_and_length_filters(tmp_path):
    docs = [
        doc("a" * 50, 0, int_score=2),
        doc("a" * 50, 1, int_score=3),
        doc("a" * 50, 2),
        doc("a" * 5, 3, int_score=4),
        doc("a" * 50, 5, int_score=float("nan")),  # polars', Spark's NaN: `nan < 3` is False
    ]
    kept = run(MinMetadataFilter("int_score", 3, ExcludedWriter(tmp_path, "int_score")), docs, rank=1)
    kept = run(LengthFilter(10, 40, ExcludedWriter(tmp_path, "length")), kept + [doc("b" * 41, 4)], rank=1)
    assert kept == []
    got = {
        r["id"]: (r["filter"], r["reason"])
        for p in sorted((tmp_path / "excluded").glob("*.parquet"))
        for r in pq.read_table(p).to_pylist()
    }
    assert got == {
        "d0": ("int_score", "int_score 2 < 3"),
        "d2": ("int_score", "no int_score in the source"),
        "d5": ("int_score", "int_score is NaN in the source"),
        "d3": ("length", "5 chars < min_chars 10"),
        "d1": ("length", "50 chars > max_chars 40"),
        "d4": ("length", "41 chars > max_chars 40"),
    }
    assert sorted(p.name for p in (tmp_path / "excluded").iterdir()) == [
        "00001_int_score.parquet",
        "00001_length.parquet",
    ]
    assert pq.read_schema(tmp_path / "excluded" / "00001_length.parquet") == EXCLUDED_SCHEMA


def test_excluded_writer_is_atomic_and_flushes_in_parts(tmp_path):
    w = ExcludedWriter(tmp_path, "text", flush_rows=2)
    with w:
        for i in range(5):
            w.write(doc("", i), rank=3)
        assert not (tmp_path / "excluded" / "00003_text.parquet").exists()  # only the .tmp so far
        assert (tmp_path / "excluded" / "00003_text.parquet.tmp").exists()
    assert pq.read_table(tmp_path / "excluded" / "00003_text.parquet").num_rows == 5
    assert not list(tmp_path.rglob("*.tmp"))


def test_failed_task_leaves_no_excluded_file_under_its_final_name(tmp_path):
    # The read breaks off after some drops (a damaged input file): the partial exclusion list must
    # not look finished; the task's rerun writes the whole one.
    def source():
        yield from (doc("", i) for i in range(5))
        raise OSError("corrupt page")

    with pytest.raises(OSError, match="corrupt page"):
        run(TextFilter(ExcludedWriter(tmp_path, "text", flush_rows=2)), source())
    assert not (tmp_path / "excluded" / "00000_text.parquet").exists()


def test_nothing_dropped_no_file(tmp_path):
    assert len(run(TextFilter(ExcludedWriter(tmp_path, "text")), [doc(PROSE)])) == 1
    assert not (tmp_path / "excluded").exists()


def test_make_filters_and_gopher_without_spacy(tmp_path):
    cfg = FiltersConfig(
        min_int_score=3, min_language_score=0.5, min_chars=10, gopher_repetition=True, gopher_quality=True
    )
    steps = make_filters(cfg, tmp_path)
    assert [s.name for s in steps][:4] == ["text", "int_score", "language_score", "length"]
    repetitive = "\n".join(["Buy cheap watches now."] * 40)
    docs = [
        doc(PROSE, 0, int_score=4, language_score=0.9),
        doc(repetitive, 1, int_score=4, language_score=0.9),
    ]
    data = iter(docs)
    for step in steps:
        data = step.run(data, rank=0, world_size=1)
    assert [d.id for d in data] == ["d0"]
    (row,) = pq.read_table(tmp_path / "excluded" / "00000_gopher_repetition.parquet").to_pylist()
    assert row["id"] == "d1" and row["filter"] == "gopher_repetition" and row["reason"] == "dup_line_frac"


def test_default_filters_only_text():
    assert [s.name for s in make_filters(FiltersConfig(), None)] == ["text"]
