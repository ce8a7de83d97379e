"""The embedded demo corpora: real English prose (and real code) that every Python installation carries.

Text: the docstrings of the standard library's Python sources (read with `ast`, nothing is
imported or executed), the docstrings of the `builtins` module, and the language reference topics
that `help()` shows (`pydoc_data.topics`), about 2-3 MB in all. Written as FineWeb-Edu-schema
parquet (text, id, url, dump, score, int_score, language, language_score, token_count) so the demo
exercises exactly the code path of the real corpus.

Only `text` is real. The metadata is synthetic, derived deterministically from a hash of the
document's URL so that filters and audits have something to show: `score` (mostly 2.5-4.5, about
6% of documents below 2.5), `int_score` (round(score)), `language` ("en"), `language_score`
(mostly 0.85-1.0, about 3% lower), `dump` (one of six real Common Crawl dump names), `id` (a UUID
URN like FineWeb-Edu's), `url` (the docs.python.org page the text belongs to) and `token_count`
(characters / 4, standing in for FineWeb-Edu's GPT-2 count). A handful of deliberately bad rows
show the filters working: an empty document, a very short one, two with a low int_score, one in
a language_score the demo drops, and one quoting the literal separator "<|endoftext|>" (which is
kept: it must stay text and gain no extra separator).

The code corpus (source kind "demo-code", `write_code_corpus`) is the second demo dataset: the
standard library's own .py files as they are, one document per file, about 1.5 MB in all (files
over 40 KB or under 200 characters left out, the rest taken in an order hashed from their URL
until the cap), in the same schema. Its `url` is the file on GitHub
(https://github.com/python/cpython/blob/3.X/Lib/...), and its synthetic scores all pass the demo
filters (int_score 3-4, language_score 0.9-1.0).

Both corpora depend only on the running Python's standard library, so they are identical on every
machine with the same Python version (the version is recorded in `corpus.json`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect
import json
import os
import shutil
import sys
import sysconfig
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from pydoc_data import topics
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.config import SourceConfig
from pipelines.sources import FINEWEB_EDU_SCHEMA
from training.contract.atomic_write import write_atomic
from training.contract.config_loader import ConfigError

CORPUS_VERSION = 1
N_FILES = 4
DOC_TARGET_CHARS = 4000  # sections are merged into documents of about this size
DOC_MAX_CHARS = 12000
CODE_N_FILES = 2
CODE_MAX_CHARS = 1_500_000  # the code corpus: about this many characters in all ...
CODE_MAX_FILE_CHARS = 40_000  # ... of files no longer than this
CODE_MIN_FILE_CHARS = 200  # (empty __init__.py files and the like are left out)
DUMPS = [
    "CC-MAIN-2013-20",
    "CC-MAIN-2017-04",
    "CC-MAIN-2019-35",
    "CC-MAIN-2021-04",
    "CC-MAIN-2023-50",
    "CC-MAIN-2024-10",
]
SKIP_DIRS = {"site-packages", "test", "tests", "__pycache__", "idle_test"}
SCHEMA = FINEWEB_EDU_SCHEMA
BAD_DOCS: list[tuple[str, str, dict[str, Any]]] = [
    # (url suffix, text, metadata overrides)
    ("bad/empty", "", {}),
    ("bad/short", "See also.", {}),
    (
        "bad/low-score-1",
        "Click here to subscribe to our newsletter and win a prize! Limited offer, act now. "
        "Best deals, best prices, free shipping on all orders over fifty dollars.",
        {"score": 0.9},
    ),
    (
        "bad/low-score-2",
        "Home | About | Contact | Login | Register | Cart (0) | Wishlist | Sitemap | Terms of "
        "use | Privacy policy | Cookie settings | Follow us on social media.",
        {"score": 1.6},
    ),
    (
        "bad/low-language-score",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud.",
        {"language_score": 0.31},
    ),
    (
        "bad/literal-separator",
        "How language models see document boundaries\n\n"
        "Models trained on web text are fed many documents one after another, with a special "
        "token between them. GPT-2 popularised the spelling <|endoftext|> for that token. When a "
        "web page quotes the spelling, as this one does, the text must stay ordinary text: a "
        "tokenizer that turned it into the special token would split this page in two and teach "
        "the model a boundary that is not there. The build keeps this page, encodes the literal "
        "<|endoftext|> as plain characters and still adds exactly one separator after it.",
        {},
    ),
]


def _h(key: str, salt: str) -> float:
    """A deterministic number in [0, 1) from a key."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _metadata(url: str, text: str, overrides: dict[str, Any]) -> dict[str, Any]:
    if _h(url, "low") < 0.06:
        score = 0.6 + 1.9 * _h(url, "score")  # 0.6-2.5: dropped by int_score >= 3
    else:
        score = 2.5 + 2.0 * _h(url, "score")  # 2.5-4.5
    language_score = (
        0.45 + 0.2 * _h(url, "lang") if _h(url, "lowlang") < 0.03 else 0.85 + 0.15 * _h(url, "lang")
    )
    meta = {
        "id": f"<urn:uuid:{uuid.UUID(bytes=hashlib.sha256(url.encode()).digest()[:16], version=4)}>",
        "url": url,
        "dump": DUMPS[int(_h(url, "dump") * len(DUMPS))],
        "score": round(score, 6),
        "language": "en",
        "language_score": round(language_score, 4),
        "token_count": len(text) // 4,
    }
    meta.update(overrides)
    meta["int_score"] = int(round(meta["score"]))
    return meta


def _stdlib_files() -> Iterator[tuple[Path, Path]]:
    """(path, path relative to the stdlib root) of the standard library's own .py files, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not (SKIP_DIRS.intersection(rel.parts[:-1]) or rel.parts[0].startswith("config-")):
            yield path, rel


def _stdlib_sections() -> list[tuple[str, str, str]]:
    """(module, heading, docstring) for every documented module, class and function, in order."""
    out: list[tuple[str, str, str]] = []
    for path, rel in _stdlib_files():
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):  # lib2to3 test data and the like
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        doc = ast.get_docstring(tree)
        if doc:
            out.append((module, f"The {module} module", doc))
        _walk(tree.body, module, module, out)
    return out


def _walk(body: list[ast.stmt], module: str, prefix: str, out: list[tuple[str, str, str]]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                out.append((module, name, doc))
            if isinstance(node, ast.ClassDef):
                _walk(node.body, module, name, out)


def _builtin_sections() -> list[tuple[str, str, str]]:
    out = []
    for name, obj in sorted(vars(builtins).items()):
        if name.startswith("_"):
            continue
        doc = inspect.getdoc(obj)
        if doc and (inspect.isbuiltin(obj) or inspect.isclass(obj)):
            out.append(("builtins", f"The built-in {name}", doc))
    return out


def _documents(version: str) -> list[tuple[str, str]]:
    """(url, text) pairs: stdlib sections merged per module into documents of ~DOC_TARGET_CHARS."""
    docs: list[tuple[str, str]] = []
    sections = _builtin_sections() + _stdlib_sections()
    current_module, parts, size, part_no = None, [], 0, 0

    def flush() -> None:
        nonlocal parts, size, part_no
        if parts:
            anchor = f"#part-{part_no}" if part_no else ""
            url = f"https://docs.python.org/{version}/library/{current_module}.html{anchor}"
            docs.append((url, "\n\n".join(parts)[:DOC_MAX_CHARS]))
            part_no += 1
        parts, size = [], 0

    for module, heading, doc in sections:
        if module != current_module:
            flush()
            current_module, part_no = module, 0
        parts.append(f"{heading}\n\n{doc}")
        size += len(doc)
        if size >= DOC_TARGET_CHARS:
            flush()
    flush()
    # Short modules were left as small documents; the language reference topics are real prose.
    for name, text in sorted(topics.topics.items()):
        docs.append((f"https://docs.python.org/{version}/reference/{name}.html", text.strip()))
    return docs


def _prose_rows(version: str) -> list[dict[str, Any]]:
    docs = _documents(version)
    # Interleave the bad rows at fixed positions so each file sees some of them.
    rows = []
    step = max(1, len(docs) // (len(BAD_DOCS) + 1))
    bad = iter(BAD_DOCS)
    for i, (url, text) in enumerate(docs):
        if i and i % step == 0 and (b := next(bad, None)):
            bad_url = f"https://example.com/gristmill-demo/{b[0]}"
            rows.append({"text": b[1], **_metadata(bad_url, b[1], b[2])})
        rows.append({"text": text, **_metadata(url, text, {})})
    for b in bad:  # any left (tiny corpora)
        bad_url = f"https://example.com/gristmill-demo/{b[0]}"
        rows.append({"text": b[1], **_metadata(bad_url, b[1], b[2])})
    return rows


def _code_rows(version: str, max_chars: int = CODE_MAX_CHARS) -> list[dict[str, Any]]:
    """One row per stdlib .py file: files picked in a hashed order until `max_chars`, then sorted.

    Files that are not UTF-8, shorter than CODE_MIN_FILE_CHARS or longer than CODE_MAX_FILE_CHARS
    are skipped. Scores are all good (int_score 3-4, language_score 0.9-1.0): the code is the
    point of this corpus, not a showcase of the filters.
    """
    files = []
    for path, rel in _stdlib_files():
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if CODE_MIN_FILE_CHARS <= len(text) <= CODE_MAX_FILE_CHARS:
            files.append((f"https://github.com/python/cpython/blob/{version}/Lib/{rel.as_posix()}", text))
    picked, total = [], 0
    for url, text in sorted(files, key=lambda f: _h(f[0], "pick")):
        if total + len(text) > max_chars:
            break
        picked.append((url, text))
        total += len(text)
    return [{"text": text, **_metadata(url, text, _good_scores(url))} for url, text in sorted(picked)]


def _good_scores(url: str) -> dict[str, float]:
    return {
        "score": round(3.0 + 1.4 * _h(url, "score"), 6),
        "language_score": round(0.9 + 0.1 * _h(url, "lang"), 4),
    }


def _write_corpus(
    out_dir: str | Path,
    corpus: str,
    rows_of: Callable[[str], list[dict[str, Any]]],
    n_files: int,
    stem: str,
    source: str,
) -> Path:
    """Write `rows_of(python version)` as `n_files` parquet files `stem-NN.parquet` into `out_dir`
    plus a corpus.json, unless a corpus.json of the same corpus, version and Python is already there.

    Deterministic for a given Python version; written to a temporary folder first, then renamed into
    place: a new folder at once; into a folder that exists (empty, or an earlier corpus), file by file
    under a corpus.json that says a write is under way, its own last, so an interrupted write is
    written again. Nothing else in the folder is touched (the whole folder was replaced, with the
    user's files and a dataset built inside it: review R22c S1).
    """
    # `~` as the build reads it (a literal `~` folder got the corpus, the build the user's files:
    # review R22c S2); "." resolved: it has no name to put the temporary folder beside
    out_dir = Path(out_dir).expanduser().resolve()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stamp = {"corpus": corpus, "corpus_version": CORPUS_VERSION, "python": version}
    info = _demo_stamp(out_dir, corpus, stem, n_files)
    current = info is not None and {k: info.get(k) for k in stamp} == stamp
    # A current corpus missing a file (deleted: the demo built short, review R22g 5) gets that file
    # alone: the others' modification times stay those its builds recorded (R22h M4).
    missing = [n for n in _corpus_files(stem, n_files) if not (out_dir / n).is_file()]
    if current and not missing:
        return out_dir
    rows = rows_of(version)
    tmp = out_dir.with_name(f".{out_dir.name}.demo-corpus.tmp")  # ours alone: removed unasked
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    per_file = -(-len(rows) // n_files)
    for f, name in enumerate(_corpus_files(stem, n_files)):
        chunk = rows[f * per_file : (f + 1) * per_file]
        table = pa.Table.from_pylist(chunk, schema=SCHEMA)
        pq.write_table(table, tmp / name, row_group_size=2000)
    writing = {**stamp, "python": "being written"}  # ours, and unlike any finished corpus
    stamp.update(documents=len(rows), characters=sum(len(r["text"]) for r in rows), source=source)
    (tmp / "corpus.json").write_text(json.dumps(stamp, indent=2) + "\n")
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return out_dir
    if current:
        for name in missing:
            os.replace(tmp / name, out_dir / name)
        shutil.rmtree(tmp)
        return out_dir
    write_atomic(out_dir / "corpus.json", json.dumps(writing) + "\n")
    for name in [*_corpus_files(stem, n_files), "corpus.json"]:
        os.replace(tmp / name, out_dir / name)
    tmp.rmdir()
    return out_dir


def _corpus_files(stem: str, n_files: int) -> list[str]:
    return [f"{stem}-{f:02d}.parquet" for f in range(n_files)]


def _demo_stamp(out_dir: Path, corpus: str, stem: str, n_files: int) -> dict[str, Any] | None:
    """The corpus.json of the demo corpus `out_dir` holds (None: none, or the folder is missing or
    empty). The folder must hold that corpus's files alone (corpus.json, `stem`-NN.parquet; hidden
    files aside): the build reads every parquet file in it, and writing the corpus replaces its files.
    One that holds anything else, or the other demo corpus, is refused (ConfigError): source.path
    pointed at the user's data with the demo kind left in the recipe deleted it (review R22b F1), and
    the user's files beside a corpus were deleted with it, or built into the demo (R22c S1, R22e 8)."""
    kind = {"prose": "demo", "code": "demo-code"}
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            f'source.path {out_dir} is a file; source.kind = "{kind[corpus]}" writes its corpus into a '
            "folder: point source.path at a new or empty one",
            "source.path",
        )
    held = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith(".")) if out_dir.is_dir() else []
    if not held:
        return None
    try:
        info = json.loads((out_dir / "corpus.json").read_text())
    except (OSError, ValueError, RecursionError):
        info = None
    theirs = info.get("corpus", "prose") if isinstance(info, dict) else None  # before the code corpus: prose
    if isinstance(info, dict) and "corpus_version" in info and theirs != corpus:
        raise ConfigError(
            f'source.path {out_dir} holds the corpus of source.kind = "{kind.get(theirs, theirs)}", and '
            f'source.kind = "{kind[corpus]}" writes its own there: point source.path at another folder',
            "source.path",
        )
    own = {"corpus.json", *_corpus_files(stem, n_files)}  # its numbers alone (R22g 5)
    others = [n for n in held if n not in own]
    if others or not isinstance(info, dict) or "corpus_version" not in info:
        shown = ", ".join((others or held)[:3]) + (" …" if len(others or held) > 3 else "")
        # named like its files with no corpus.json: the user's as likely as a corpus (review R22h M5)
        what = (
            "files that are not the demo corpus's"
            if others
            else "files named like the demo corpus's, no corpus.json"
        )
        raise ConfigError(
            f"source.path {out_dir} holds {what} ({shown}), and the build "
            f'reads every parquet file there while source.kind = "{kind[corpus]}" writes the corpus\'s over '
            'them: to build your files, set source.kind = "parquet" or "jsonl"; for the demo, point '
            "source.path at a new or empty folder"
            + ("" if others else " (or, if they are the demo's own, delete them: they are written again)"),
            "source.path",
        )
    return info


def write_demo_corpus(out_dir: str | Path) -> Path:
    """Write the prose corpus as N_FILES parquet files into `out_dir` (skipped when already there)."""
    source = "Python standard library docstrings + pydoc_data.topics; metadata synthetic"
    return _write_corpus(out_dir, "prose", _prose_rows, N_FILES, "stdlib-docs", source)


def write_code_corpus(out_dir: str | Path, max_chars: int = CODE_MAX_CHARS) -> Path:
    """Write the code corpus (stdlib .py sources, about `max_chars` characters) as CODE_N_FILES
    parquet files into `out_dir` (skipped when already there)."""
    source = f"Python standard library .py sources (at most {max_chars:,} chars); metadata synthetic"
    rows_of = functools.partial(_code_rows, max_chars=max_chars)
    return _write_corpus(out_dir, "code", rows_of, CODE_N_FILES, "stdlib-code", source)


# The source kinds whose corpus is written on first use, their writers, and the folder their
# configs/data/*.toml name (said as the example of a source.path that is no local folder).
DEMO_WRITERS: dict[str, Callable[[str | Path], Path]] = {
    "demo": write_demo_corpus,
    "demo-code": write_code_corpus,
}
DEMO_PATHS = {"demo": "runs/data/demo-corpus", "demo-code": "runs/data/demo-code-corpus"}


def ensure_demo_corpus(source: SourceConfig) -> None:
    """Write the demo corpus of a "demo" / "demo-code" source into source.path if not there yet."""
    if writer := DEMO_WRITERS.get(source.kind):
        if "://" in source.path or source.path.startswith("hf:") or not source.path.strip():
            # the field's default is the hub's dataset: it became a folder named "hf:" (review R22b F5)
            raise ConfigError(
                f'source.kind = "{source.kind}" writes its corpus into a local folder, but source.path is '
                f'"{source.path}": set source.path to one, e.g. "{DEMO_PATHS[source.kind]}"',
                "source.path",
            )
        writer(source.path)
