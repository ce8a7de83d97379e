"""Sources: readers never drop a document silently; the demo corpus; a jsonl.zst build loses nothing."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipelines.build import build
from pipelines.config import DataConfig, SourceConfig
from pipelines.demo_corpus import BAD_DOCS, SCHEMA, _metadata, write_demo_corpus
from pipelines.sources import READ_ERROR, SourceError, list_source_files, make_reader, mistyped_columns
from training.contract.config_loader import load_config

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


def read_all(cfg: SourceConfig) -> list:
    source = list_source_files(cfg)
    return list(make_reader(cfg, source).run(rank=0, world_size=1))


def test_parquet_reader_metadata_and_bad_bytes(tmp_path):
    offsets = pa.array([0, 5, 12, 12], type=pa.int32()).buffers()[1]
    text = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"hellobad \xff!!")])
    table = pa.table(
        {
            "text": text,
            "id": ["a", "b", "c"],
            "url": ["u1", "u2", "u3"],
            "int_score": [3, 4, 5],
            "language_score": [0.9, 0.8, 0.7],
            "unrelated": [1, 2, 3],
        }
    )
    pq.write_table(table, tmp_path / "x.parquet")
    docs = read_all(SourceConfig(kind="parquet", path=str(tmp_path)))
    assert [d.text for d in docs] == ["hello", "bad \udcff!!", ""]  # nothing dropped by the reader
    assert docs[0].metadata == {
        "url": "u1",
        "int_score": 3,
        "language_score": 0.9,
        "source_file": "x.parquet",  # where it came from: the manifest's provenance columns
        "source_row": 0,
    }
    assert [d.id for d in docs] == ["a", "b", "c"]

    pq.write_table(pa.table({"body": pa.array([b"raw \xfe bytes"], pa.binary())}), tmp_path / "y.parquet")
    (doc,) = read_all(SourceConfig(kind="parquet", path=str(tmp_path / "y.parquet"), text_key="body"))
    assert doc.text == "raw \udcfe bytes" and doc.id == "y.parquet/0"


def write_jsonl_zst(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n"))


JSONL_LINES = [
    json.dumps(
        {"text": "A good document about rivers and the sea. " * 3, "id": "good", "int_score": 4}
    ).encode(),
    b'{"text": "bytes \xff\xfe that are not UTF-8", "id": "badbytes", "int_score": 4}',
    b'{"text": "a lone \\ud800 surrogate escape", "id": "surrogate", "int_score": 4}',
    b'{"text": "A fine text whose url is not Unicode.", "id": "bad-url", "url": "https://a.org/\\ud800"}',
    b'{"text": "A fine text whose id is not Unicode, it has a lone surrogate.", "id": "id-\\udc80"}',
    b'{"text": "unterminated',
    b"[1, 2, 3]",
    b'{"text": null, "id": "null-text"}',
    b'{"text": 42, "id": "number-text"}',
    b"",
    json.dumps(
        {"text": "Literal <|endoftext|> stays text in this document. " * 2, "id": "sep", "int_score": 3}
    ).encode(),
]


def test_jsonl_zst_reader_turns_bad_lines_into_records(tmp_path):
    write_jsonl_zst(tmp_path / "a.jsonl.zst", JSONL_LINES)
    docs = read_all(SourceConfig(kind="jsonl", path=str(tmp_path)))
    by_id = {d.id: d for d in docs}
    assert len(docs) == 10  # every non-blank line
    assert by_id["badbytes"].text == "bytes \udcff\udcfe that are not UTF-8"
    assert by_id["surrogate"].text == "a lone \ud800 surrogate escape"
    assert "malformed JSON" in by_id["a.jsonl.zst:6"].metadata[READ_ERROR]
    assert by_id["a.jsonl.zst:7"].metadata[READ_ERROR] == "a.jsonl.zst:7: line is not a JSON object"
    assert by_id["null-text"].text == "" and READ_ERROR not in by_id["null-text"].metadata
    assert "'text' is int, not a string" in by_id["number-text"].metadata[READ_ERROR]
    assert by_id["good"].metadata == {"int_score": 4, "source_file": "a.jsonl.zst", "source_row": 1}


def test_an_integer_past_64_bits_is_read_whole(tmp_path):
    """orjson reads one as a float: two 30-digit ids became one, and a number as text was said to be a
    float (trial RV64b M6). A float stays a float."""
    big = 123456789012345678901234567890
    lines = [f'{{"text": "One document.", "id": {big}}}', f'{{"text": "Two.", "id": {big + 1}}}']
    lines += [f'{{"text": {big}, "id": "t"}}', '{"text": "Three.", "id": 1e30}']
    lines += [f'{{"text": "Nested (review RV65d 9).", "id": [{big}]}}']
    low = -(2**63) - 1  # 19 digits, past 64 bits below (review RV65e 1)
    lines += [f'{{"text": "Five.", "id": {low}}}', f'{{"text": "Six.", "id": {low - 1}}}']
    write_jsonl_zst(tmp_path / "a.jsonl.zst", [line.encode() for line in lines])
    docs = read_all(SourceConfig(kind="jsonl", path=str(tmp_path)))
    assert [d.id for d in docs] == [str(big), str(big + 1), "t", "1e+30", f"[{big}]", str(low), str(low - 1)]
    assert "'text' is int, not a string" in docs[2].metadata[READ_ERROR]


def test_jsonl_build_loses_nothing(build_fixture, tmp_path):
    _, _, config = build_fixture
    (tmp_path / "src").mkdir()
    write_jsonl_zst(tmp_path / "src" / "a.jsonl.zst", JSONL_LINES)
    out = tmp_path / "ds"
    overrides = [f"output={out}", "source.kind=jsonl", f"source.path={tmp_path / 'src'}"]
    overrides += ["build.tasks=1", "build.workers=1", "filters.min_chars=1"]
    result = build(load_config(DataConfig, config, overrides), log=lambda *a: None)
    assert result.ok
    kept = pq.read_table(out / "manifest" / "00000.parquet").column("id").to_pylist()
    excluded = {r["id"]: r for r in pq.read_table(out / "excluded" / "00000_text.parquet").to_pylist()}
    assert sorted(kept) == ["good", "sep"]
    assert set(excluded) == {
        "badbytes",
        "surrogate",
        "bad-url",
        "id-\\udc80",
        "a.jsonl.zst:6",
        "a.jsonl.zst:7",
        "null-text",
        "number-text",
    }
    assert (
        excluded["badbytes"]["reason"]
        == "invalid UTF-8: bytes that are not UTF-8 or a lone surrogate at character 6"
    )
    assert excluded["surrogate"]["reason"] == "invalid UTF-8: a lone surrogate at character 7"
    assert excluded["null-text"]["reason"] == "empty or whitespace-only text"
    # each where its source has it (an id need not be unique: trial RV64b M3); a malformed line too
    rows = {i: (r["source_file"], r["source_row"]) for i, r in excluded.items()}
    assert rows["badbytes"] == ("a.jsonl.zst", 2) and rows["null-text"] == ("a.jsonl.zst", 8), rows
    assert rows["a.jsonl.zst:6"] == ("a.jsonl.zst", 6), rows
    # No UTF-8 file holds a lone surrogate: such metadata (the task failed writing it) is kept as its
    # escape, the document excluded with the field named
    assert excluded["bad-url"]["url"] == "https://a.org/\\ud800"
    assert excluded["bad-url"]["reason"] == (
        "a.jsonl.zst:4: url is not valid Unicode (a lone surrogate): https://a.org/\\ud800"
    )
    assert excluded["id-\\udc80"]["reason"] == (
        "a.jsonl.zst:5: id is not valid Unicode (bytes that are not UTF-8 or a lone surrogate): id-\\udc80"
    )
    assert all(r["filter"] == "text" for r in excluded.values())


def test_listing_local_sources(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("b.parquet", "sub/a.parquet", "notes.txt", ".hidden.parquet"):
        (tmp_path / name).write_bytes(b"x" * 3)
    src = list_source_files(SourceConfig(kind="parquet", path=str(tmp_path)))
    assert src.files == ["b.parquet", "sub/a.parquet"] and src.total_bytes == 6
    src = list_source_files(SourceConfig(kind="parquet", path=str(tmp_path), glob="sub/*.parquet"))
    assert src.files == ["sub/a.parquet"]
    # a Spark job's attempt beside its output: refused, read only if asked for; a notebook's checkpoint
    # copies (or a download tool's .cache) are hidden, as hidden files are: never inputs
    leftover = "_temporary/0/_temporary/attempt_0/b.parquet"
    (tmp_path / leftover).parent.mkdir(parents=True)
    (tmp_path / leftover).write_bytes(b"x" * 3)
    with pytest.raises(SourceError, match=rf"holds {re.escape(leftover)} in a folder named _… \(a job's"):
        list_source_files(SourceConfig(kind="parquet", path=str(tmp_path)))
    src = list_source_files(SourceConfig(kind="parquet", path=str(tmp_path), glob="**/*.parquet"))
    assert leftover in src.files
    shutil.rmtree(tmp_path / "_temporary")
    (tmp_path / "sub/.ipynb_checkpoints").mkdir()
    (tmp_path / "sub/.ipynb_checkpoints/a.parquet").write_bytes(b"x" * 3)
    assert list_source_files(SourceConfig(kind="parquet", path=str(tmp_path))).files == [
        "b.parquet",
        "sub/a.parquet",
    ]
    with pytest.raises(SourceError, match="holds no files matching"):
        list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path)))
    # a backup or a partial download beside a jsonl file would be read as another input: refused
    for name in ("sub/c.jsonl.zst", "d.jsonl", "d.jsonl.bak", "d.jsonl.gz.part"):
        (tmp_path / name).write_bytes(b"{}\n")
    with pytest.raises(SourceError, match=r"holds d\.jsonl\.bak \(and 1 more\), which is not a \.jsonl,"):
        list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path)))
    src = list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path), glob="**/*.jsonl*"))
    assert src.files == ["d.jsonl", "d.jsonl.bak", "d.jsonl.gz.part", "sub/c.jsonl.zst"]  # as the user says
    (tmp_path / "d.jsonl.bak").unlink()
    (tmp_path / "d.jsonl.gz.part").unlink()
    assert list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path))).files == [
        "d.jsonl",
        "sub/c.jsonl.zst",
    ]
    # a file whose name says it holds documents but that the default pattern passes over: refused
    for kind, name, renamed in (
        ("jsonl", "E.JSONL", "E.jsonl"),
        ("jsonl", "sub/f.ndjson.gz", "f.jsonl.gz"),
        ("parquet", "G.PARQUET", "G.parquet"),
    ):
        (tmp_path / name).write_bytes(b"{}\n")
        with pytest.raises(
            SourceError, match=rf"holds {re.escape(name)}, which '\*\*/\*\.{kind}\*?' does not"
        ) as e:
            list_source_files(SourceConfig(kind=kind, path=str(tmp_path)))
        assert f"rename it {renamed}, or" in str(e.value)  # the codec's suffix kept
        assert name in list_source_files(SourceConfig(kind=kind, path=str(tmp_path), glob="**/*")).files
        (tmp_path / name).unlink()
    (tmp_path / "notes.json").write_text("{}")  # not a name documents go by: still passed over
    assert list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path))).files == [
        "d.jsonl",
        "sub/c.jsonl.zst",
    ]


def test_a_file_of_documents_the_pattern_passes_over_is_named(tmp_path):
    """Files the default pattern passed over, exit 0, their documents left out (review R12g): JSON
    lines named .json (as many datasets name them), a parquet file named .pq, a top-level `_…` file
    named in capitals; and a link to a folder that is not there (an unmounted disk)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.jsonl").write_text('{"text": "A river."}\n')
    (tmp_path / "sub" / "x.parquet").write_bytes(b"x")
    (tmp_path / "notes.json").write_text('{"name": "my corpus"}\n')  # metadata: not an input
    (tmp_path / "info.json").write_text('{\n "text": "pretty-printed"\n}\n')
    jsonl, parquet = (
        SourceConfig(kind="jsonl", path=str(tmp_path)),
        SourceConfig(kind="parquet", path=str(tmp_path)),
    )
    assert list_source_files(jsonl).files == ["a.jsonl"]
    for name, kind, renamed in (
        ("sub/b.json.gz", "jsonl", "b.jsonl.gz"),
        ("_c.JSONL", "jsonl", "_c.jsonl"),
        ("sub/y.pq", "parquet", "y.parquet"),
    ):
        text = b'\n{"text": "Another river.", "id": "b"}\n'
        (tmp_path / name).write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
        cfg = jsonl if kind == "jsonl" else parquet
        with pytest.raises(
            SourceError, match=rf"holds {re.escape(name)}, which .* rename it {re.escape(renamed)},"
        ):
            list_source_files(cfg)
        (tmp_path / name).unlink()
    # the same when it is the folder's only input: it was "holds no files matching" (review R17a F3)
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "DATA.JSONL").write_text('{"text": "Alone."}\n')
    with pytest.raises(SourceError, match=r"holds DATA\.JSONL, which .* rename it DATA\.jsonl,"):
        list_source_files(replace(jsonl, path=str(alone)))
    (alone / "DATA.JSONL").write_text('[{"text": "Alone."}]\n')
    (alone / "DATA.JSONL").rename(alone / "docs.json")
    with pytest.raises(SourceError, match=r"holds docs\.json, a JSON array of documents"):
        list_source_files(replace(jsonl, path=str(alone)))
    shutil.rmtree(alone)
    # a parquet file `gristmill data download` was cutting short when killed: its documents were left
    # out of the build, exit 0 (review R17e F3)
    (tmp_path / "sub" / "y.parquet.part").write_bytes(b"PAR1")
    with pytest.raises(
        SourceError, match=r"holds sub/y\.parquet\.part, a download cut short .* data download"
    ):
        list_source_files(parquet)
    for glob in ("**/*.parquet", "sub/*.parquet"):  # whatever source.glob says (review R17f F7)
        with pytest.raises(SourceError, match=r"holds sub/y\.parquet\.part, a download cut short"):
            list_source_files(replace(parquet, glob=glob))
    (tmp_path / "sub" / "y.parquet.part").unlink()
    # ... but only where the pattern reads, and not in a job's `_…` folder (review R17g)
    (tmp_path / "old-fr.parquet.part").write_bytes(b"PAR1")
    (tmp_path / "_temporary" / "0").mkdir(parents=True)
    (tmp_path / "_temporary" / "0" / "x.parquet.part").write_bytes(b"PAR1")
    assert list_source_files(replace(parquet, glob="sub/*.parquet")).files == ["sub/x.parquet"]
    with pytest.raises(SourceError, match=r"holds old-fr\.parquet\.part, a download cut short"):
        list_source_files(parquet)  # the root is read: it is refused there
    (tmp_path / "old-fr.parquet.part").unlink()
    assert list_source_files(parquet).files == ["sub/x.parquet"]
    shutil.rmtree(tmp_path / "_temporary")
    # a glob the user points into a `_…` folder (as the `_…` refusal advises) still has it refused, and
    # a glob ending in `**` is no traceback (review R17h)
    (tmp_path / "_fw").mkdir()
    (tmp_path / "_fw" / "000.parquet").write_bytes((tmp_path / "sub" / "x.parquet").read_bytes())
    (tmp_path / "_fw" / "001.parquet.part").write_bytes(b"PAR1")
    with pytest.raises(SourceError, match=r"holds _fw/001\.parquet\.part, a download cut short"):
        list_source_files(replace(parquet, glob="_fw/*.parquet"))
    shutil.rmtree(tmp_path / "_fw")
    with pytest.raises(SourceError, match=r"holds no files matching '\*\*'"):
        list_source_files(replace(parquet, glob="**"))
    # review R13a: zstd (its reader has no readline), a first row without the key
    line = b'{"text": "Another river.", "id": "b"}\n'
    for name, data, renamed in (
        ("sub/b.json.zst", zstandard.ZstdCompressor().compress(line), "b.jsonl.zst"),
        ("sub/b.json", b'{"id": "a"}\n' + line, "b.jsonl"),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(
            SourceError, match=rf"holds {re.escape(name)}, which .* rename it {re.escape(renamed)},"
        ):
            list_source_files(jsonl)
        (tmp_path / name).unlink()
    # a first line that is malformed is the reader's to exclude: the file is named (review R13e)
    (tmp_path / "sub" / "b.json").write_bytes(b'{"text": "cut\n' + line)
    with pytest.raises(SourceError, match=r"holds sub/b\.json, which .* rename it b\.jsonl,"):
        list_source_files(jsonl)
    (tmp_path / "sub" / "b.json").unlink()
    # A JSON array of documents (HF's json loader reads it): refused with the command that converts it,
    # not passed over with its documents (review R15b) nor "renamed" .jsonl (review R13d); pretty-printed
    # or compressed too
    for name, data in (
        ("sub/array.json", b"[" + line.strip() + b"]\n"),
        ("sub/array.json", b"\xef\xbb\xbf[\n  " + line.strip() + b',\n  {"text": "x"}\n]\n'),
        ("sub/array.json.gz", gzip.compress(b"[" + line.strip() + b"]")),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(
            SourceError, match=r"holds sub/array\.json(\.gz)?, a JSON array of documents"
        ) as e:
            list_source_files(jsonl)
        (convert,) = [c for c in str(e.value).split("`")[1::2] if c.startswith("python3")]
        assert convert.endswith(f" {tmp_path}/sub/array.json > {tmp_path}/sub/array.jsonl"), convert
        assert list_source_files(replace(jsonl, glob="*.jsonl")).files == ["a.jsonl"]  # as the user says
        (tmp_path / name).unlink()
    # The advice followed to the letter: ids past 2^53 kept (jq 1.6 rounded them), and an input already
    # named as its output not overwritten (review R15d F4)
    # (nor beside a compressed one it would be a copy of: review R15f F5), and any text, a lone
    # surrogate too, written in any locale (review R15f F6)
    (tmp_path / "sub" / "array.jsonl").write_text('{"text": "Kept."}\n')
    (tmp_path / "sub" / "array-2.jsonl.gz").write_bytes(gzip.compress(b'{"text": "Kept too."}\n'))
    (tmp_path / "sub" / "array.json").write_text('[{"text": "Ünï \\ud800", "id": 12345678901234567891}]')
    with pytest.raises(SourceError) as e:
        list_source_files(jsonl)
    (convert,) = [c for c in str(e.value).split("`")[1::2] if c.startswith("python3")]
    assert convert.endswith(f"> {tmp_path}/sub/array-3.jsonl"), convert
    subprocess.run(convert, shell=True, check=True, env={**os.environ, "LC_ALL": "C"})
    converted = (tmp_path / "sub" / "array-3.jsonl").read_text()
    assert json.loads(converted) == {"text": "Ünï \ud800", "id": 12345678901234567891}, converted
    assert (tmp_path / "sub" / "array.jsonl").read_text() == '{"text": "Kept."}\n'
    for f in ("array.json", "array.jsonl", "array-2.jsonl.gz", "array-3.jsonl"):
        (tmp_path / "sub" / f).unlink()
    # JSON that is not JSON lines nor an array of documents is no input by its name (review R13d): an
    # array of something else, a pretty-printed file one of whose lines is an object with the key
    (tmp_path / "sub" / "array.json").write_bytes(b'[{"body": "Another river."}, 3]\n')
    (tmp_path / "sub" / "fewshot.json").write_bytes(b'{\n "examples": [\n  ' + line.strip() + b"\n ]\n}\n")
    (tmp_path / "sub" / "b.json").write_text('{"body": "Another river."}\n')  # no text_key: not by its name
    os.mkfifo(tmp_path / "sub" / "pipe.json")  # not a file: never opened (reading it waited forever)
    assert list_source_files(jsonl).files == ["a.jsonl"]
    (tmp_path / "sub" / "part2").symlink_to(tmp_path / "unmounted")
    with pytest.raises(SourceError, match=r"holds sub/part2, a link to .*/unmounted, which does not exist"):
        list_source_files(jsonl)
    # a link that leads nowhere is a file or a folder (on a disk not mounted), which cannot be told
    # apart: refused where the pattern walks, a custom glob's `**` too; a git-annex link (a file) only
    # where the pattern reads it or it is named like an input (review R13a, R13d, R13e)
    (tmp_path / "sub" / "part2").unlink()
    (tmp_path / "sub" / "en.noblocklist").symlink_to(tmp_path / "unmounted")
    for glob in ("", "**/*.jsonl"):
        with pytest.raises(SourceError, match=r"holds sub/en\.noblocklist, a link to .*/unmounted, which"):
            list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path), glob=glob))
    # a glob's folders: `*/*.jsonl` reads the folders `*` matches, a link among them too; a stale
    # link in a folder the glob never reads is no concern of it (review R13f)
    for glob in ("sub/*/*.jsonl", "*/en.noblocklist/*.jsonl"):  # a part spelled out too (review R13g)
        with pytest.raises(SourceError, match=r"holds sub/en\.noblocklist, a link"):
            list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path), glob=glob))
    with pytest.raises(SourceError, match=r"holds no files matching 'su\[!b\]\*/\*\*/\*\.jsonl'"):
        list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path), glob="su[!b]*/**/*.jsonl"))
    (tmp_path / "sub" / "en.noblocklist").unlink()
    annex = "../.git/annex/objects/Xx/Yy/SHA256E-s9--ab/SHA256E-s9--ab"
    (tmp_path / "sub" / "README.md").symlink_to(annex)  # not fetched, no input: not refused
    (tmp_path / "sub" / "de.jsonl").symlink_to(annex)
    with pytest.raises(SourceError, match=r"holds sub/de\.jsonl, a link to \.\./\.git/annex/objects/"):
        list_source_files(jsonl)
    assert list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path), glob="*.jsonl")).files == [
        "a.jsonl"
    ]
    (tmp_path / "sub" / "de.jsonl").unlink()
    assert list_source_files(jsonl).files == ["a.jsonl"]


def test_a_dataset_inside_the_source_folder_is_never_read_as_documents(tmp_path):
    """An earlier build's output under source.path (or reached there through a link): its manifest
    and excluded parquet files were listed as input by the next build, a rerun too (a refusal advising
    another text_key, or their rows read as documents). The building dataset's own files are left
    out once it started; another dataset's are refused by name; a file named dataset.json by another
    program makes no dataset; an output folder that holds input files is refused (the first fix
    dropped those files, exit 0), and so is a source inside the output (an `rm -rf` of the output,
    which a changed config advises, would delete it)."""
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    files = {"src/a.parquet": "x", "src/out/build.json": '{"config_sha256": "ab"}',
             "src/out/manifest/00000.parquet": "x", "src/theirs/dataset.json": '{"name": "my corpus"}',
             "src/theirs/b.parquet": "x", "elsewhere/ds/dataset.json": '{"format": "gristmill-shards/3"}',
             "elsewhere/ds/excluded/00000_text.parquet": "x"}  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    cfg = SourceConfig(kind="parquet", path=str(src))
    inputs = ["a.parquet", "theirs/b.parquet"]
    assert list_source_files(cfg, own_output=src / "out").files == inputs  # a rerun into src/out
    with pytest.raises(
        SourceError, match=r"holds out/manifest/00000\.parquet, a file of the gristmill dataset out "
    ):
        list_source_files(cfg, own_output=tmp_path / "new")  # the next build, elsewhere
    shutil.rmtree(src / "out")
    (src / "runs").symlink_to(elsewhere)  # a linked folder is read: so is a dataset in it
    with pytest.raises(
        SourceError, match=r"holds runs/ds/excluded/00000_text\.parquet, a file of the gristmill"
    ):
        list_source_files(cfg, own_output=tmp_path / "new")
    assert list_source_files(cfg, own_output=elsewhere / "ds").files == inputs  # its own, by the link
    (src / "runs").unlink()
    with pytest.raises(SourceError, match=r"output .*/src/theirs holds theirs/b\.parquet, an input file"):
        list_source_files(cfg, own_output=src / "theirs")  # a build into a folder of input
    for output in (src, tmp_path):  # source.path itself, or above it: `rm -rf` of it deletes the input
        with pytest.raises(SourceError, match=r"lies inside the output"):
            list_source_files(cfg, own_output=output)


def test_a_jsonl_file_that_starts_with_a_byte_order_mark_loses_no_document(tmp_path):
    lines = [json.dumps({"text": f"page {i}", "id": f"p{i}"}) for i in range(2)]
    (tmp_path / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())  # as Notepad writes it
    docs = read_all(SourceConfig(kind="jsonl", path=str(tmp_path)))
    assert [(d.id, d.text, READ_ERROR in d.metadata) for d in docs] == [
        ("p0", "page 0", False),
        ("p1", "page 1", False),
    ]
    # two such files joined by `cat`, the first one a BOM and an empty line: that line was a malformed
    # document, and the second file's first document was excluded as malformed (trial RV71e 5)
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(
        bom + b"\n" + lines[0].encode() + b"\n" + bom + lines[1].encode() + b"\n"
    )
    docs = read_all(SourceConfig(kind="jsonl", path=str(tmp_path)))
    assert [(d.id, d.text, READ_ERROR in d.metadata) for d in docs] == [
        ("p0", "page 0", False),
        ("p1", "page 1", False),
    ]


def test_demo_corpus(tmp_path):
    out = write_demo_corpus(tmp_path / "demo")
    files = sorted(out.glob("*.parquet"))
    assert len(files) == 4 and all(pq.read_schema(f) == SCHEMA for f in files)
    table = pa.concat_tables([pq.read_table(f) for f in files])
    rows = table.to_pylist()
    chars = sum(len(r["text"]) for r in rows)
    assert chars > 2_000_000 and len(rows) > 500  # a few MB of real prose
    assert len({r["id"] for r in rows}) == len(rows)
    texts = [r["text"] for r in rows]
    assert "" in texts and any("<|endoftext|>" in t for t in texts)
    assert sum(r["int_score"] < 3 for r in rows) >= 2 and sum(r["language_score"] < 0.65 for r in rows) >= 1
    assert {r["int_score"] for r in rows} >= {1, 2, 3, 4} and len({r["dump"] for r in rows}) > 3
    for r in rows[:50]:  # metadata is a pure function of the URL (and text length)
        assert {k: v for k, v in r.items() if k != "text"} == _metadata(r["url"], r["text"], {})
    assert len([r for r in rows if "gristmill-demo/bad" in r["url"]]) == len(BAD_DOCS)
    mtimes = [f.stat().st_mtime_ns for f in files]
    write_demo_corpus(out)  # already there: not rewritten
    assert [f.stat().st_mtime_ns for f in files] == mtimes


def test_truncated_jsonl_zst_is_an_error_naming_the_file(tmp_path):
    lines = [
        json.dumps({"text": f"Document {i} about rivers. " * 10, "id": f"d{i}"}).encode() for i in range(500)
    ]
    data = zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n")
    # Two frames back to back (as pzstd or `cat a.zst b.zst` write them) read as one stream.
    (tmp_path / "whole.jsonl.zst").write_bytes(data + data)
    docs = read_all(SourceConfig(kind="jsonl", path=str(tmp_path / "whole.jsonl.zst")))
    assert len(docs) == 1000 and docs[-1].id == "d499"
    # Cut mid-frame: zstandard's stream reader would end quietly after ~half the documents.
    (tmp_path / "cut.jsonl.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceError, match=r"cut\.jsonl\.zst cannot be read as jsonl .*truncated"):
        read_all(SourceConfig(kind="jsonl", path=str(tmp_path / "cut.jsonl.zst")))
    # Cut at byte 0 (a download or a copy that wrote nothing): gzip and zstd read no document, exit 0.
    for name in ("empty.jsonl.zst", "empty.jsonl.gz"):
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(
            SourceError, match=rf"{re.escape(name)} cannot be read as jsonl .*empty \(0 bytes\)"
        ):
            read_all(SourceConfig(kind="jsonl", path=str(tmp_path / name)))
    (tmp_path / "nothing.jsonl.gz").write_bytes(gzip.compress(b""))  # a stream of no line: no document
    assert read_all(SourceConfig(kind="jsonl", path=str(tmp_path / "nothing.jsonl.gz"))) == []
    (tmp_path / "nothing.jsonl").write_bytes(b"")  # an empty text file: no document
    assert read_all(SourceConfig(kind="jsonl", path=str(tmp_path / "nothing.jsonl"))) == []


def test_metadata_column_types_a_build_takes():
    """Numbers for the numeric columns; for the others anything with a text: strings, binary (Hive's
    strings), numbers, dates, dictionaries of them (pandas' categories, common for `dump`); a list,
    a struct or a map is named."""
    categories = pa.dictionary(pa.int8(), pa.string())
    ok = pa.schema(
        [("dump", categories), ("url", pa.binary()), ("language", pa.large_string()),
         ("int_score", pa.dictionary(pa.int8(), pa.int64())), ("score", pa.float32()),
         ("token_count", pa.null())]
    )  # fmt: skip
    assert mistyped_columns(ok) == []
    ok = pa.schema([("dump", pa.timestamp("us")), ("url", pa.int64()), ("language", pa.string_view())])
    assert mistyped_columns(ok) == []  # read as their text, as a number id is
    struct = pa.struct([("a", pa.int8())])
    bad = pa.schema([("dump", pa.list_(pa.string())), ("score", pa.string()), ("url", struct)])
    assert [(k, want) for k, _, want in mistyped_columns(bad)] == [
        ("url", "text"),
        ("dump", "text"),
        ("score", "numbers"),
    ]


def test_binary_metadata_columns_are_read_as_text(tmp_path):
    """Hive and Impala write strings as binary columns: the id and url read as their text (the url
    ended the task in json.dumps, the id was recorded as "b'doc-1'")."""
    binary = pa.array([b"doc-1", b"doc-2"], pa.binary())
    urls = pa.array([b"https://x.org/a", b"https://x.org/\xff"], pa.binary())
    pq.write_table(pa.table({"text": ["One.", "Two."], "id": binary, "url": urls}), tmp_path / "a.parquet")
    docs = read_all(SourceConfig(kind="parquet", path=str(tmp_path)))
    assert [(d.id, d.metadata["url"], READ_ERROR in d.metadata) for d in docs] == [
        ("doc-1", "https://x.org/a", False),
        ("doc-2", "https://x.org/\\udcff", True),  # not UTF-8: its escape, the document excluded
    ]
    # the same bytes in a column typed string (Spark writes them): UnicodeDecodeError ended the task
    offsets = pa.array([0, 15, 30], type=pa.int32()).buffers()[1]
    urls = pa.Array.from_buffers(
        pa.string(), 2, [None, offsets, pa.py_buffer(b"https://x.org/ahttps://x.org/\xff")]
    )
    pq.write_table(pa.table({"text": ["One.", "Two."], "url": urls}), tmp_path / "a.parquet")
    docs = read_all(SourceConfig(kind="parquet", path=str(tmp_path)))
    assert [(d.metadata["url"], READ_ERROR in d.metadata) for d in docs] == [
        ("https://x.org/a", False),
        ("https://x.org/\\udcff", True),
    ]
    assert (
        docs[1].metadata[READ_ERROR]
        == "a.parquet/1: url is not valid Unicode (bytes that are not UTF-8 or a lone surrogate): "
        "https://x.org/\\udcff"
    )
    # the url as the id too (source.id_key = "url"): the id was decoded, the url left bytes (a crash)
    pq.write_table(
        pa.table({"text": ["One."], "url": pa.array([b"https://x.org/a"])}), tmp_path / "a.parquet"
    )
    (doc,) = read_all(SourceConfig(kind="parquet", path=str(tmp_path), id_key="url"))
    assert (doc.id, doc.metadata["url"], READ_ERROR in doc.metadata) == (
        "https://x.org/a",
        "https://x.org/a",
        False,
    )
    # a date past Python's year 9999 in a text column: its text, not "the file is damaged"
    dump = pa.array([253402300800000], pa.timestamp("ms"))
    pq.write_table(pa.table({"text": ["One."], "dump": dump}), tmp_path / "a.parquet")
    (doc,) = read_all(SourceConfig(kind="parquet", path=str(tmp_path)))
    assert doc.metadata["dump"] == "10000-01-01 00:00:00.000" and READ_ERROR not in doc.metadata


def test_corrupt_parquet_pages_are_an_error_naming_the_file(tmp_path):
    texts = [f"Document {i} about rivers and the sea. " * 20 for i in range(2000)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "x.parquet", row_group_size=500)
    data = bytearray((tmp_path / "x.parquet").read_bytes())
    data[len(data) // 3 : len(data) // 3 + 2000] = b"A" * 2000  # a data page; the footer is intact
    (tmp_path / "x.parquet").write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"x\.parquet cannot be read as parquet .*damaged or truncated"):
        read_all(SourceConfig(kind="parquet", path=str(tmp_path)))


def test_metadata_of_the_wrong_type_is_excluded_with_its_reason(build_fixture, tmp_path):
    _, _, config = build_fixture
    (tmp_path / "src").mkdir()
    good = {"text": "A good document about rivers and the sea. " * 3, "int_score": 4, "score": 3.5}
    lines = [
        {**good, "id": "good"},
        {**good, "id": "str-score", "int_score": "4"},
        {**good, "id": "bool-score", "score": True},
        # a parquet int column with a missing value reads as float NaN: the task died in the shard writer
        # ("cannot convert float NaN to integer", naming no file), and so did every rerun
        {**good, "id": "nan-count", "token_count": float("nan")},
        {**good, "id": "huge-count", "token_count": 1e20},
        {**good, "id": "nan-language", "language_score": float("nan")},  # a float column holds NaN: kept
        {"content": "A document under another key.", "id": "no-text"},  # was "empty or whitespace-only"
        {**good, "id": "bigger-than-a-float", "int_score": 10**400},  # isfinite overflowed: a crash
        # the manifest's int64 truncated it: 3.9 was recorded, filtered and audited as 3
        {**good, "id": "fractional-int", "int_score": 3.9},
        {**good, "id": "whole-float", "int_score": 4.0},  # a parquet int column with a null reads so: kept
        {**good, "id": "huge-score", "score": 10**400},  # float() of it in the shard writer: a crash
        {**good, "id": "number-url", "url": 5},  # a number as its text, as ever: kept
        {**good, "id": "list-dump", "dump": ["CC-MAIN-2024-10"]},  # its repr, as ever: the text is sound
        # datatrove's reader stats added it up: a string ended the task (review R13i)
        {**good, "id": "str-count", "token_count": "40"},
    ]
    # nested past the parser's depth: a RecursionError, which ended the task as "re-download the file"
    deep = '{"text": "x", "id": "deep", "extra": ' + "[" * 5000 + "]" * 5000 + "}"
    # a url nested 1,000 deep (orjson reads up to 1,024): its repr ended the task (a RecursionError): kept
    deep_url = json.dumps({**good, "id": "deep-url"})[:-1] + ', "url": ' + "[" * 1000 + "]" * 1000 + "}"
    text = "".join(json.dumps(x) + "\n" for x in lines) + deep_url + "\n" + deep + "\n"
    (tmp_path / "src" / "a.jsonl").write_text(text)
    out = tmp_path / "ds"
    overrides = [f"output={out}", "source.kind=jsonl", f"source.path={tmp_path / 'src'}"]
    overrides += ["build.tasks=1", "build.workers=1", "filters.min_score=1.0"]
    result = build(load_config(DataConfig, config, overrides), log=lambda *a: None)
    assert result.ok
    manifest = pq.read_table(out / "manifest" / "00000.parquet")
    kept = manifest.to_pylist()
    assert sorted(r["id"] for r in kept) == [
        "deep-url",
        "good",
        "list-dump",
        "nan-language",
        "number-url",
        "whole-float",
    ]
    assert [r["int_score"] for r in kept] == [4] * 6
    texts = {r["id"]: (r["url"], r["dump"]) for r in kept}
    assert texts["number-url"][0] == "5" and texts["list-dump"][1] == "['CC-MAIN-2024-10']"
    assert texts["deep-url"][0] == "<list nested too deep to print>"
    excluded = {
        r["id"]: r["reason"] for r in pq.read_table(out / "excluded" / "00000_text.parquet").to_pylist()
    }
    assert excluded == {
        "str-score": "a.jsonl:2: int_score not a number: '4'",
        "bool-score": "a.jsonl:3: score not a number: True",
        "nan-count": "a.jsonl:4: token_count not a finite number: nan",
        "huge-count": "a.jsonl:5: token_count out of an int64's range: 1e+20",
        "no-text": "a.jsonl:7: no 'text' key (source.text_key; it has 'content', 'id')",
        "bigger-than-a-float": f"a.jsonl:8: int_score out of an int64's range: {10**400}",
        "fractional-int": "a.jsonl:9: int_score not a whole number: 3.9",
        "huge-score": f"a.jsonl:11: score out of a float64's range: {10**400}",
        "str-count": "a.jsonl:14: token_count not a number: '40'",
        "a.jsonl:16": excluded["a.jsonl:16"],
    }
    assert excluded["a.jsonl:16"].startswith("a.jsonl:16: malformed JSON (RecursionError: maximum recursion")
    reader = json.loads((out / "logs" / "stats" / "00000.json").read_text())[0]["stats"]
    assert "doc_len_tokens" not in reader, reader  # no sound token_count here: nan, 1e20, '40' not added


def test_a_linked_folder_is_read_and_no_file_twice(tmp_path):
    """pathlib's `**` does not enter a symlinked folder: a data folder linking to another disk was read
    without it, exit 0. And a file beside its compressed copy (zstd and gzip -k keep the original) or
    a link to another input added every document again (review R6)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "part.jsonl").write_text(json.dumps({"text": "Far away rivers.", "id": "far"}) + "\n")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "local.jsonl").write_text(json.dumps({"text": "Near rivers.", "id": "near"}) + "\n")
    (src / "sub" / "more").symlink_to(elsewhere)
    (src / "loop").symlink_to(src)  # a link back up: not followed again
    docs = read_all(SourceConfig(kind="jsonl", path=str(src)))
    assert sorted(d.id for d in docs) == ["far", "near"]
    docs = read_all(SourceConfig(kind="jsonl", path=str(src), glob="sub/**/*.jsonl"))  # `**` after a folder
    assert [d.id for d in docs] == ["far"]

    (src / "loop").unlink()
    (src / "again.jsonl").symlink_to(src / "local.jsonl")
    with pytest.raises(
        SourceError, match=r"holds again\.jsonl and local\.jsonl: one file under two names, or a file and its"
    ):
        read_all(SourceConfig(kind="jsonl", path=str(src)))
    (src / "again.jsonl").unlink()
    (src / "local.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress((src / "local.jsonl").read_bytes())
    )
    with pytest.raises(
        SourceError,
        match=r"holds local\.jsonl and local\.jsonl\.zst: one file under two names, or a file and its",
    ):
        read_all(SourceConfig(kind="jsonl", path=str(src)))


def test_an_input_path_with_a_url_chain_is_refused_by_name(tmp_path):
    # fsspec reads '::' as a chain of URLs: the task called a good file unreadable (trial RV71e 3)
    src = tmp_path / "in::put"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": "Rivers run.", "id": "a"}) + "\n")
    for path, named in ((src, src), (src / "a.jsonl", src)):
        with pytest.raises(SourceError) as err:
            list_source_files(SourceConfig(kind="jsonl", path=str(path)))
        assert str(err.value).startswith(
            f"{named}: datatrove reads a path with '::' in it as a chain of URLs"
        )
    src.rename(tmp_path / "input")
    (tmp_path / "input" / "a.jsonl").rename(tmp_path / "input" / "w::v.jsonl")
    with pytest.raises(SourceError, match=r"input/w::v\.jsonl: datatrove reads a path with '::'"):
        list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path / "input")))
    (tmp_path / "input" / "w::v.jsonl").rename(tmp_path / "input" / "wv.jsonl")  # the advice, followed
    assert list_source_files(SourceConfig(kind="jsonl", path=str(tmp_path / "input"))).files == ["wv.jsonl"]


def test_a_link_into_a_hidden_folder_is_read_and_a_broken_link_refused(tmp_path):
    """Hidden folders are no input, but a link to one is (review R12g): the walk had taken the hidden
    folder's real path as seen, so the link met after it was never read (exit 0, its documents gone,
    depending on the directory's order). A link to a file not there (an unfetched git-annex file, an
    unmounted disk) was skipped without a word."""
    src = tmp_path / "src"
    (src / ".store").mkdir(parents=True)
    (src / "en").mkdir()
    (src / "top.jsonl").write_text(json.dumps({"text": "Top rivers.", "id": "top"}) + "\n")
    (src / ".store" / "x.jsonl").write_text(json.dumps({"text": "Stored rivers.", "id": "stored"}) + "\n")
    (src / "en" / "data").symlink_to("../.store")  # walked after .store, whose real path it shares
    assert list_source_files(SourceConfig(kind="jsonl", path=str(src))).files == [
        "en/data/x.jsonl",
        "top.jsonl",
    ]
    (src / "b.jsonl").symlink_to(".git/annex/objects/XX/SHA256E-s1--abc.jsonl")
    with pytest.raises(
        SourceError, match=r"holds b\.jsonl, a link to \.git/annex/objects/.*, which does not exist"
    ):
        list_source_files(SourceConfig(kind="jsonl", path=str(src)))
