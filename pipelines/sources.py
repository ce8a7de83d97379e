"""Document sources as datatrove readers: FineWeb-Edu on the hub, local parquet, local jsonl(.zst).

The readers differ from datatrove's stock ParquetReader/JsonlReader in what they never do
silently: a document with empty text is passed on (the "text" filter records it in excluded/),
bytes that are not UTF-8 are decoded with surrogate escapes (and then excluded with their reason)
instead of ending the file early, and a malformed JSON line becomes an excluded record naming the
file and line. Only the text, the id and FineWeb-Edu's metadata columns are read.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from datatrove.data import Document
from datatrove.io import get_datafolder
from datatrove.pipeline.readers.base import BaseDiskReader
from huggingface_hub import HfApi, HfFileSystem
from huggingface_hub.hf_file_system import HfFileSystemResolvedRepositoryPath

from pipelines.config import SourceConfig
from pipelines.download import PART  # the name a download cut short leaves
from pipelines.progress import TaskProgress
from training.contract.dataset_format import BUILD_JSON, DATASET_JSON, SOURCE_FIELDS, SOURCE_FILE, SOURCE_ROW
from training.contract.errors import GristmillError

# The metadata a reader takes from a source besides the text and the id (read through
# source.id_key): the contract's SOURCE_FIELDS, which say which ones the manifest keeps too.
META_KEYS = tuple(f.name for f in SOURCE_FIELDS if f.name != "id")
# The ones filters compare with numbers and the manifest stores as numbers.
NUMERIC_META_KEYS = tuple(f.name for f in SOURCE_FIELDS if f.numeric)
INTEGER_META_KEYS = tuple(f.name for f in SOURCE_FIELDS if f.pytype is int)
TEXT_META_KEYS = tuple(k for k in META_KEYS if k not in NUMERIC_META_KEYS)  # url, dump, language
READ_ERROR = "read_error"  # metadata key set on records the reader could not parse

# FineWeb-Edu's parquet columns (the demo corpus and test fixtures are written with this schema).
FINEWEB_EDU_SCHEMA = pa.schema([("text", pa.string()), *((f.name, f.type) for f in SOURCE_FIELDS)])


class SourceError(GristmillError):
    """A source that cannot be read; the message names it and says how to fix it."""


@dataclass
class SourceFiles:
    """The input of a build: a folder (local path or hf:// URL) and the files in it."""

    folder: str
    files: list[str]
    sizes: list[int] = field(default_factory=list)
    modified: list[int] = field(default_factory=list)  # local files: st_mtime_ns (a hub's: none)
    named: str = ""  # local files: their folder as source.path names it (absolute, links not followed)

    def identity(self) -> list[dict[str, Any]]:
        return [{"file": f, "bytes": s} for f, s in zip(self.files, self.sizes)]

    def as_read(self) -> dict[str, Any] | None:
        """What build.json records of local files beside the identity ("read"): the folder they were
        read from and each one's modification time, by which a rerun tells a file rewritten at the
        same size, or another folder a relative source.path names from another directory (a hub
        source is pinned to a commit instead). Not in the identity: the config hash stays the
        recipe's and its input's names and sizes."""
        if not self.modified:
            return None
        return {"folder": self.folder, "path": self.named, "modified_ns": self.modified}

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def source_folder(cfg: SourceConfig) -> str:
    if cfg.kind == "hub":
        return f"{cfg.path.rstrip('/')}/{cfg.subset.strip('/')}" if cfg.subset else cfg.path.rstrip("/")
    return str(Path(cfg.path).expanduser().resolve())


# What the jsonl reader opens (fsspec infers the compression from the suffix).
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz", ".jsonl.lzma")


def default_glob(cfg: SourceConfig) -> str:
    if cfg.glob:
        return cfg.glob
    return "**/*.jsonl*" if cfg.kind == "jsonl" else "**/*.parquet"


# hf://datasets/ORG/NAME[@REV][/FOLDER]: the repository, its revision, and where the folder starts
_HUB_FOLDER = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/?")
# huggingface_hub's errors for an id it cannot hold, by name: HfUriError is newer than the oldest
# huggingface_hub the project takes
_NOT_A_HUB_ID = ("HfUriError", "HFValidationError")


def offline_message(folder: str, cfg: SourceConfig, err: BaseException) -> str:
    detail = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    # the source's repository, at the commit a begun build pinned: without --repo the command fetched
    # FineWeb-Edu's files whatever the source was (trial RV57d F3)
    # (and the folder under it: a source.path below the repository's root, RV57e)
    named = _HUB_FOLDER.match(folder)
    repo = named and named["repo"] + (f"@{named['rev']}" if named["rev"] else "")
    subset = folder[named.end() :].strip("/") if named else cfg.subset
    fetch = f"gristmill data download{f' --repo {repo}' if repo else ''} --subset {subset} --to DIR"
    return (
        f"the hub source {folder} is unreachable ({detail}). To build without network, fetch the "
        f"files where there is network with `{fetch}`, copy DIR here, and build from it with `--set "
        f"source.kind=parquet --set source.path=DIR/{subset}` (into a new output where a build from "
        "the hub began; or use the offline demo: --config configs/data/demo.toml)"
    )


def pin_hub_commit(folder: str) -> str:
    """`folder` (hf://datasets/ORG/NAME[@REV]/SUBSET) at the commit its revision points to now.

    The driver lists that commit and every task reads it: tasks otherwise resolve `main` each on
    its own, so a push to the dataset during a long build would give later tasks files other than
    the listed ones, and a process that builds twice would list `main` from HfFileSystem's cache.
    """
    fs = HfFileSystem()
    where = fs.resolve_path(folder)  # FileNotFoundError for a repository or revision that doesn't exist
    if not isinstance(where, HfFileSystemResolvedRepositoryPath):
        return folder  # a bucket: no commits
    api = HfApi(endpoint=fs.endpoint)
    info = api.repo_info(where.repo_id, repo_type=where.repo_type, revision=where.revision)
    pinned = HfFileSystemResolvedRepositoryPath(where.repo_type, where.repo_id, info.sha, where.path_in_repo)
    return f"hf://{pinned.unresolve()}"


def list_source_files(
    cfg: SourceConfig, pinned: str | None = None, own_output: Path | None = None
) -> SourceFiles:
    """Resolve the config to a sorted file list, failing with one clear message if it can't.
    `pinned`: for a hub source, the commit-pinned folder to list instead of where the revision
    points now (a resumed build reads the commit it started from). `own_output`: the building
    dataset's directory (resolved), whose files are never inputs when it lies inside source.path."""
    folder = source_folder(cfg)
    if cfg.kind == "hub":
        if not folder.startswith("hf://"):
            raise SourceError(
                f"source.path {cfg.path!r} is not an hf:// URL; hub sources look like "
                "hf://datasets/HuggingFaceFW/fineweb-edu"
            )
        try:
            folder = pinned or pin_hub_commit(folder)
            df = get_datafolder(folder)
            entries = df.find("", detail=True)
        except Exception as e:  # connection errors, offline mode, missing repo: one message
            if isinstance(e, FileNotFoundError) and pinned is not None:  # as tokenizer.path's (trial RV78b 7)
                raise SourceError(
                    f"the hub source {pinned}, the commit this build started from (its build.json), is gone "
                    "from the hub (a force-push, or its branch deleted) and is not in the hub cache here: "
                    "restore that commit on the hub, or build into a new output directory (which reads "
                    "source.path anew)"
                ) from None
            if isinstance(e, FileNotFoundError):  # the revision named too: it was not (RV78b 8)
                named = _HUB_FOLDER.match(folder)  # None for a name without its ORG/
                parts = [f"the repository {named['repo']}"] if named else []
                parts += [f"its revision {named['rev']!r}"] if named and named["rev"] else []
                what = ", ".join(parts) + (" or " if parts else "") + f"the folder {cfg.subset or '/'}"
                raise SourceError(
                    f"the hub source {folder} does not exist ({what}); check source.path and source.subset "
                    '(e.g. subset = "sample/10BT" or "data/CC-MAIN-2024-10")'
                ) from None
            if type(e).__name__ in _NOT_A_HUB_ID:  # no network asked: not "unreachable", and no download
                raise SourceError(  # of an id that cannot be one (RV78b 8)
                    f"source.path {cfg.path!r} is not a hub dataset path, hf://datasets/ORG/NAME or "
                    f"hf://datasets/ORG/NAME@REV ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                ) from None
            raise SourceError(offline_message(folder, cfg, e)) from None
        pattern = default_glob(cfg)
        files = sorted(
            (name.lstrip("/"), int(info.get("size") or 0))
            for name, info in entries.items()
            if info.get("type") != "directory"
            and (fnmatch(name, pattern) or fnmatch(name, pattern.removeprefix("**/")))
        )
        if not files:
            raise SourceError(
                f"the hub source {folder} holds no files matching {pattern!r}; check source.subset"
            )
        return SourceFiles(folder, [f for f, _ in files], [int(s or 0) for _, s in files])

    if not cfg.path:  # Path("") is the working directory: its files were built, exit 0 (trial RV75c 1)
        raise SourceError(
            'source.path = "": name the corpus\'s folder (or file), e.g. source.path = "data/corpus" (a '
            "variable left unset gives an empty value)"
        )
    path = Path(folder)
    named = os.path.abspath(os.path.expanduser(cfg.path))  # a link to the data's disk stays the link
    hint = {
        "demo": "the demo corpus is written there by `gristmill demo` / `gristmill data build`",
        "demo-code": "the code demo corpus is written there by `gristmill data build`",
        "parquet": "point source.path at a directory of .parquet files (or one file)",
        "jsonl": "point source.path at a directory of .jsonl/.jsonl.zst files (or one file)",
    }[cfg.kind]
    if not path.exists():
        raise SourceError(f"source.path {path} does not exist; {hint}")
    if path.is_file():
        st = path.stat()
        _refuse_chained(path.parent, [path.name])
        return SourceFiles(
            str(path.parent), [path.name], [st.st_size], [st.st_mtime_ns], os.path.dirname(named)
        )
    pattern = default_glob(cfg)
    listed = [p for p in _glob(path, pattern) if not _hidden(p, path)]
    entries = [p for p in _walked(path, pattern) if not _hidden(p, path)]
    # A link that leads nowhere (a disk not mounted, a git-annex or DataLad file never fetched) is
    # skipped by the walk, its documents missing without a word: refused where the pattern reads it,
    # or where the walk meets it, unless it is a git-annex file (no folder) not named like an input
    # (a README a partial checkout did not fetch).
    broken = sorted(
        p
        for p in {*listed, *entries}
        if p.is_symlink()
        and not p.exists()
        and (p in listed or ANNEX_OBJECTS not in os.readlink(p) or _read_as(p, cfg))
    )
    if broken:
        raise SourceError(
            f"source.path {path} holds {_named(broken, path)}, a link to {os.readlink(broken[0])}, which "
            "does not exist: fetch its content (`git annex get`, `datalad get`) or mount its disk; or, if "
            "it holds no input, remove the link or set source.glob to the files to read"
        )
    found = sorted(p for p in listed if p.is_file())
    none_found = not found  # said after the checks below that name a file the pattern passed over
    # A gristmill dataset inside source.path (an earlier build's output, reached through a link too):
    # its manifest and excluded files are not documents. The building dataset's own, once started
    # (its build.json), are left out; input files in an output folder the build has not started are
    # refused (the dataset would be written among them).
    if own_output is not None and path.is_relative_to(own_output):
        # the dataset's directory would hold its input: the advice to a changed config, `rm -rf` the
        # output, would delete it, and an upload of the dataset would carry it
        raise SourceError(
            f"source.path {path} lies inside the output {own_output}: the dataset's directory would hold "
            "its input; set output to a directory outside source.path"
        )
    mine = [p for p in found if own_output is not None and p.resolve().is_relative_to(own_output)]
    if mine and _gristmill_dataset(own_output) is None:
        raise SourceError(
            f"output {own_output} holds {mine[0].relative_to(path)}, an input file under source.path: the "
            "dataset would be written among its input; set output to a new directory"
        )
    found = [p for p in found if p not in mine]
    datasets: dict[Path, bool] = {}  # per folder: a gristmill dataset? (each folder's files read once)
    built = next(((p, d) for p in found if (d := _in_dataset(p, path, datasets))), None)
    if built is not None:
        raise SourceError(
            f"source.path {path} holds {built[0].relative_to(path)}, a file of the gristmill dataset "
            f"{built[1].relative_to(path)} (an earlier build's output): its rows are not "
            "documents; move that dataset out of source.path, or set source.glob to a pattern that does "
            "not match it"
        )
    # A folder named `_…` holds what is not the data's: a Spark or Hadoop job's `_temporary` attempts
    # (a job that did not finish). Read, each would add its documents again.
    aside = [p for p in found if any(x[0] == "_" for x in p.relative_to(path).parts[:-1])]
    if aside and not cfg.glob:
        raise SourceError(
            f"source.path {path} holds {_named(aside, path)} in a folder named _… (a job's "
            "leftovers, as Spark's _temporary: its documents would be read again): move it out of the "
            "folder, or set source.glob to the files to read"
        )
    # The default `*.jsonl*` also matches a backup, an editor's or a download's leftover beside the
    # file (data.jsonl.bak, data.jsonl~, data.jsonl.gz.part): read, each would add its documents again.
    odd = [p for p in found if not p.name.endswith(JSONL_SUFFIXES)] if cfg.kind == "jsonl" else []
    if odd and not cfg.glob:
        raise SourceError(
            f"source.path {path} holds {_named(odd, path)}, which is not a "
            f"{', '.join(JSONL_SUFFIXES)} file: move it out of the folder, or set source.glob to the "
            "files to read"
        )
    # A file the default pattern passes over though its name says it holds documents (data.JSONL,
    # part.ndjson.gz, x.PARQUET, y.pq, JSON lines named .json) or that holds documents gristmill does
    # not read (a JSON array of them): its documents would be left out without a word. (Not one in a
    # `_…` folder: refused above when read, a job's leftovers.)
    # A file `gristmill data download` was writing when it was killed (NAME.parquet.part, where the
    # pattern reads NAME.parquet): a build left its documents out, exit 0 (review R17e F3), with a
    # source.glob too (R17f F7; only where the pattern reads, a job's `_…` folder aside: R17g). One the
    # pattern itself matches is read, as the user says (a glob naming `*.jsonl*`).
    last = Path(pattern).name
    cut_short = pattern + PART if last != "**" else str(Path(pattern) / f"*{PART}")  # `**.part` is no glob
    partial = sorted(
        p
        for p in _glob(path, cut_short)
        if p.is_file()
        and p not in listed
        and not _hidden(p, path)
        and (cfg.glob or not any(x[0] == "_" for x in p.relative_to(path).parts[:-1]))  # as `aside` (R17h)
    )
    if partial:
        raise SourceError(
            f"source.path {path} holds {_named(partial, path)}, a download cut short (its documents would "
            "be left out): run the same `gristmill data download` again to finish it, or move it out of "
            "the folder"
        )
    if not cfg.glob and cfg.kind in ("jsonl", "parquet"):
        taken = set(found) | set(mine)
        missed: dict[Path, str] = {}  # file: what it would have to be
        arrays: list[Path] = []  # JSON arrays of documents (HF's json loader reads them; gristmill not)
        for p in sorted(entries):
            if p in taken or any(x[0] == "_" for x in p.relative_to(path).parts[:-1]) or not p.is_file():
                continue
            if p.name.endswith(PART) and _read_as(p.with_name(p.name.removesuffix(PART)), cfg):
                continue  # a `.part` the pattern's own check above passed (y.pq.part): nothing to rename
            if renamed := _read_as(p, cfg):
                missed[p] = renamed
            elif cfg.kind == "jsonl" and _json_array_of(p, cfg.text_key):
                arrays.append(p)
        if arrays:
            raise SourceError(
                f"source.path {path} holds {_named(arrays, path)}, a JSON array of documents, which "
                "gristmill does not read (its documents would be left out): convert it to JSON lines "
                f"({_conversion(arrays[0])}) and move the array out of the folder, or set source.glob to "
                "the files to read"
            )
        if missed:
            raise SourceError(
                f"source.path {path} holds {_named(list(missed), path)}, which {pattern!r} does not "
                f"match (its documents would be left out): rename it {next(iter(missed.values()))}, or "
                "set source.glob to the files to read"
            )
    if none_found:  # after the checks above: a folder of only DATA.JSONL was "holds no files" (R17a F3)
        raise SourceError(f"source.path {path} holds no files matching {pattern!r}; {hint}")
    # One file under two names (a symlink to another input, a folder linked in twice) or a file beside
    # its compressed copy (zstd and gzip -k keep the original): each would add its documents again.
    seen: dict[Any, Path] = {}
    stats = [p.stat() for p in found]  # once: the checks below and the sizes and times recorded
    for p, stat in zip(found, stats):
        for key in ((stat.st_dev, stat.st_ino), p.parent / _uncompressed(p.name)):
            if key in seen:
                raise SourceError(
                    f"source.path {path} holds {seen[key].relative_to(path)} and {p.relative_to(path)}: one "
                    "file under two names, or a file and its compressed copy (or two files named alike): "
                    "both would be read; move or rename one, or set source.glob to the files to read"
                )
            seen[key] = p
    files = [str(p.relative_to(path)) for p in found]
    _refuse_chained(path, files)
    sizes, times = [st.st_size for st in stats], [st.st_mtime_ns for st in stats]
    return SourceFiles(str(path), files, sizes, times, named)


def _refuse_chained(folder: Path, files: list[str]) -> None:
    """An input whose path holds '::', which datatrove's file layer (fsspec) reads as a chain of URLs: its
    task failed with "is not a readable jsonl file (FileNotFoundError: …)" of a file that reads (trial
    RV71e 3). Refused before any task, naming it."""
    for where in (str(folder), *(str(folder / f) for f in files)):
        if "::" in where:
            raise SourceError(
                f"{where}: datatrove reads a path with '::' in it as a chain of URLs (fsspec), so the input "
                "cannot be opened; rename it (or its folder) without '::'"
            )


ANNEX_OBJECTS = "annex/objects/"  # where a git-annex (or DataLad) file's link points (a file)


def _walked(root: Path, pattern: str) -> list[Path]:
    """The names the source pattern's folders lead through below `root`: for `a/*/*.jsonl`, `a` and what
    `a/*` matches; below a `**`, every name under the folders it starts from (the default pattern: the
    whole of `root`). Level by level: pathlib's glob drops a link that leads nowhere at a part spelled
    out (`*/x/*.jsonl`: an unmounted `fr/x`)."""
    names: list[Path] = []
    level = [root]
    for part in Path(pattern).parts[:-1]:
        if part == "**":
            return names + [p for b in level for p in _glob(b, "**/*")]
        if any(c in part for c in "*?["):
            found = [c for b in level for c in b.glob(part)]
        else:
            found = [b / part for b in level if (b / part).is_symlink() or (b / part).exists()]
        names += found
        level = [f for f in found if f.is_dir()]
    return names


def _named(files: list[Path], root: Path) -> str:
    """The first of `files` (below `root`) and how many more, for a refusal naming them."""
    more = f" (and {len(files) - 1} more)" if len(files) > 1 else ""
    return f"{files[0].relative_to(root)}{more}"


def _uncompressed(name: str) -> str:
    """`name` without a compression suffix JSONL_SUFFIXES allows (data.jsonl.zst → data.jsonl)."""
    for suffix in JSONL_SUFFIXES[1:]:
        codec = suffix.removeprefix(".jsonl")
        if name.endswith(codec):
            return name.removesuffix(codec)
    return name


def _hidden(p: Path, root: Path) -> bool:
    """Whether `p` (below `root`) or a folder it lies in is named `.…`: never an input, at any depth
    (hidden files, a notebook's .ipynb_checkpoints copies, a download tool's .cache), as
    pyarrow.dataset's rule goes."""
    return any(x[0] == "." for x in p.relative_to(root).parts)


def _read_as(p: Path, cfg: SourceConfig) -> str:
    """The name file `p`, named like an input of `cfg.kind` (data.JSONL, part.ndjson.gz, x.PARQUET, y.pq,
    z.json.gz of JSON lines holding source.text_key) but not matched by the default pattern, would have
    to have; "" for any other file (notes.json, a metadata .json, a JSON array: read only as JSON
    lines)."""
    name = p.name
    low = name.lower()
    if cfg.kind == "parquet":
        stem = next((name[: -len(x)] for x in (".parquet", ".parq", ".pq") if low.endswith(x)), None)
        return "" if stem is None else f"{stem}.parquet"
    for codec in ("", *(x.removeprefix(".jsonl") for x in JSONL_SUFFIXES[1:])):
        for ext in (".jsonl", ".ndjson", ".json"):
            if low.endswith(ext + codec) and (ext != ".json" or _json_lines_of(p, cfg.text_key)):
                return f"{name[: -len(ext + codec)]}.jsonl{codec}"
    return ""


def _json_lines_of(p: Path, text_key: str) -> bool:
    """Whether .json file `p` (read through its compression) is JSON lines of documents, as many
    datasets name theirs: one of its first 100 lines an object holding `text_key`, parsed as the
    reader parses them, unless its first line opens a pretty-printed object or an array (`{`, `[…`:
    metadata, or a JSON array, which is no input)."""
    try:
        with contextlib.closing(first_json_lines(str(p), max_line=1 << 24)) as lines:
            for i, (line, obj) in enumerate(lines):
                head = line.removeprefix(BOM).strip()
                if i == 0 and (head == b"{" or head.startswith(b"[")):
                    return False
                if isinstance(obj, dict) and text_key in obj:
                    return True
    except Exception:  # not its codec, unreadable (a link to a file not there): not one by its name
        return False
    return False


def _conversion(array: Path) -> str:
    """The command that writes JSON array `array` as JSON lines beside it, under a name no input has
    (nor one it would be a copy of: x.jsonl by x.jsonl.gz). Python's json, not jq: jq 1.6 rounds
    integers past 2^53 (ids) without a word (review R15d); ASCII escapes: any text (a lone surrogate
    too) in any locale, read back the same."""
    plain = array.parent / _uncompressed(array.name)  # read decompressed
    lines, n = plain.with_suffix(".jsonl"), 1
    while any(lines.with_name(lines.stem + x).exists() for x in JSONL_SUFFIXES):
        n += 1
        lines = plain.with_name(f"{plain.stem}-{n}.jsonl")
    command = (
        "python3 -c 'import json,sys; [print(json.dumps(d)) for d in "
        f'json.load(open(sys.argv[1], encoding="utf-8-sig"))]\' {plain} > {lines}'
    )
    return f"`{command}`" + ("" if plain.name == array.name else ", decompressed first")


def _json_array_of(p: Path, text_key: str) -> bool:
    """Whether file `p`, named .json (read through its compression), is a JSON array whose first
    element is an object holding `text_key`: documents, in a form the jsonl reader does not read. Its
    first 16 MiB are read at most (a first document longer than that is not seen)."""
    if ".json" not in p.name.lower() or ".jsonl" in p.name.lower():
        return False
    try:
        with fsspec.open(str(p), "rb", compression="infer") as f:
            head = f.read(1 << 24).removeprefix(BOM).decode("utf-8", "replace").lstrip()
        if not head.startswith("["):
            return False
        first, _ = json.JSONDecoder().raw_decode(head[1:].lstrip())
    except Exception:  # not its codec, unreadable, not JSON, an empty array, cut at 16 MiB
        return False
    return isinstance(first, dict) and text_key in first


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark (Notepad, PowerShell, Excel exports): not JSON


def _jsonl_compression(path: str) -> str | None:
    """How to open JSON-lines file `path` (fsspec's `compression`): zstd is undone by _jsonl_lines."""
    return None if path.lower().endswith(".zst") else "infer"


def _jsonl_lines(f: Any, path: str) -> io.BufferedReader:
    """JSON-lines file `path`, opened as `f` (with _jsonl_compression), as a buffered stream of its
    decompressed bytes; zstd's through _StrictZstdReader (fsspec's reader ends a cut .zst quietly,
    and is not line-iterable)."""
    return io.BufferedReader(_StrictZstdReader(f) if _jsonl_compression(path) is None else f, 1 << 20)


def parse_json_line(line: bytes) -> Any:
    """Line `line` of a JSON-lines file parsed (a BOM before it dropped: a file's first line may open
    with one, and so may any line where two such files were joined by `cat`: that document was called
    malformed, trial RV71e 5); ValueError or RecursionError (nested past the parser's depth) when it
    is malformed."""
    line = line.removeprefix(BOM)
    # orjson reads an integer past 64 bits as a float: an id of 30 digits kept 17 of them (two ids one)
    # and a number as text was said "float" (trial RV64b M6), nested ones too (review RV65d 9); a line
    # with 19 digits in a row (maybe in a string) goes to the stdlib, which keeps such an integer whole
    if _LONG_NUMBER.search(line) is None:
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    # orjson refuses non-UTF-8 bytes and lone surrogate escapes; the stdlib parser reads both (as
    # surrogates) so the text filter can exclude them with a reason.
    return json.loads(line.decode("utf-8", "surrogateescape"))


def blank_line(line: bytes) -> bool:
    """Whether JSON-lines line `line` holds no document: whitespace, a BOM at most before it."""
    return not line.removeprefix(BOM).strip()


_LONG_NUMBER = re.compile(rb"[0-9]{19}")  # 19: -9223372036854775809 is past 64 bits too (RV65e 1)


def first_json_lines(path: str, lines: int = 100, max_line: int | None = None) -> Iterator[tuple[bytes, Any]]:
    """(line, its JSON or the error parsing it raised) of the first `lines` non-empty lines of the
    local JSON-lines file `path`, read and parsed as JsonlSource reads them (`max_line`: bytes read
    per line at most, a longer one read as several)."""
    with fsspec.open(path, "rb", compression="infer") as raw:
        # a buffered reader (zstd's is not line-iterable); a stream cut further on is the reader's to
        # find (JsonlSource, with its advice)
        f, read = io.BufferedReader(raw), 0
        for line in iter(lambda: f.readline(max_line or -1), b""):
            if blank_line(line):
                continue
            try:
                yield line, parse_json_line(line)
            except (ValueError, RecursionError) as e:
                yield line, e
            read += 1
            if read == lines:
                return


def _in_dataset(p: Path, root: Path, datasets: dict[Path, bool]) -> Path | None:
    """The gristmill dataset directory below `root` that file `p` lies in, None if none does
    (`datasets`: the folders judged so far, by this listing)."""
    for folder in p.parents:
        if folder == root or not folder.is_relative_to(root):
            return None
        if folder not in datasets:
            datasets[folder] = _gristmill_dataset(folder) is not None
        if datasets[folder]:
            return folder
    return None


def _gristmill_dataset(folder: Path) -> Path | None:
    """`folder` if it is a gristmill dataset directory, one a build started (its build.json holds a
    config_sha256) or finished (its dataset.json a gristmill format): a file of that name written by
    another program does not make one."""
    for name, key, is_ours in (
        (BUILD_JSON, "config_sha256", lambda v: isinstance(v, str)),
        (DATASET_JSON, "format", lambda v: isinstance(v, str) and v.startswith("gristmill-")),
    ):
        try:
            record = json.loads((folder / name).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and is_ours(record.get(key)):
            return folder
    return None


def _glob(root: Path, pattern: str) -> list[Path]:
    """root.glob(pattern), into symlinked folders too: pathlib's `**` does not follow them (Python
    3.11), so a data folder holding links to other disks was read without them, silently. Each
    folder once, by its real path (a link back up is not followed again)."""
    parts = Path(pattern).parts
    if "**" not in parts:
        return list(root.glob(pattern))
    cut = parts.index("**")  # `en/**/*.jsonl`: the folders `en` names, then `**/*.jsonl` under each
    rest = str(Path(*parts[cut:]))
    bases = list(root.glob(str(Path(*parts[:cut])))) if cut else [root]
    found: list[Path] = []
    for base in (b for b in bases if b.is_dir()):
        found += base.glob(rest)
        seen = {base.resolve()}
        for folder, dirs, _ in os.walk(base, followlinks=True):
            for name in list(dirs):
                sub = Path(folder) / name
                if name.startswith("."):  # never an input (list_source_files): it must not claim the
                    dirs.remove(name)  # real folder that a link to it, met later, reads
                    continue
                real = sub.resolve()
                if real in seen:
                    dirs.remove(name)
                    continue
                seen.add(real)
                if sub.is_symlink():  # a linked folder: pathlib's `**` did not enter it
                    found += sub.glob(rest)
    return found


class _Reader(BaseDiskReader):
    """Shared parts: the file list comes from the driver (pinned), documents keep empty text."""

    def __init__(
        self,
        source: SourceFiles,
        text_key: str = "text",
        id_key: str = "id",
        limit: int = -1,
        progress: TaskProgress | None = None,
    ):
        super().__init__(source.folder, limit=limit, text_key=text_key, id_key=id_key, add_file_path=False)
        self.files = list(source.files)
        self.sizes = dict(zip(source.files, source.sizes))
        self.modified = dict(zip(source.files, source.modified))  # local files: as build.json records
        self.progress = progress

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        shard = self.files[rank::world_size]
        self._base_bytes = 0.0
        if self.progress:
            self.progress.start(rank)
        for doc in self.read_files_shard(shard):
            self.update_doc_stats(doc)
            if self.progress:
                self.progress.read += 1
            yield doc

    def update_doc_stats(self, document: Document) -> None:
        """datatrove's, but a token_count of the wrong type (its document excluded with the reason by
        make_document) is left out of the stats, not added up (a string ended the task)."""
        self.stat_update("doc_len", value=len(document.text), unit="doc")
        count = document.metadata.get("token_count")
        if count and not number_problem(count, "token_count"):
            self.stat_update("doc_len_tokens", value=count, unit="doc")

    def _done_file(self, filepath: str) -> None:
        """A file read to its end, checked against what build.json records of it: a local file replaced
        while the build ran left shards of neither file, exit 0, and the rerun's advice then certified
        them (review R22b F2). Its task fails instead; the rerun redoes it from the file as it is."""
        if filepath in self.modified:
            path = self.data_folder.resolve_paths(filepath)
            try:
                st = os.stat(path)
            except OSError:
                st = None
            size = self.sizes.get(filepath, 0)
            if st is None or (st.st_size, st.st_mtime_ns) != (size, self.modified[filepath]):
                now = "gone" if st is None else f"{st.st_size:,} bytes" if st.st_size != size else "rewritten"
                raise SourceError(
                    f"input file {path} changed while the build read it ({size:,} bytes when the build "
                    f"started, now {now}): its task's shards would not be what build.json records; rerun "
                    "the build once the input stays as it is (the task is redone from it)"
                )
        if self.progress:
            self._base_bytes += self.sizes.get(filepath, 0)
            self.progress.bytes_done = self._base_bytes

    def make_document(
        self, text: Any, doc_id: Any, meta: dict[str, Any], where: str, file: str, row: int
    ) -> Document:
        if text is None:
            text = ""
        elif isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            meta[READ_ERROR] = f"{where}: {self.text_key!r} is {type(text).__name__}, not a string"
            text = ""
        # The id and the text metadata as text: bytes (Hive's and Impala's strings) decoded as the text
        # is, anything else as str() writes it ("dump": 2024 as ever; a list's repr is no url, but its
        # document's text is sound, and kept); one nested past what str() can print, by its type.
        values = [(None, doc_id), *((k, meta[k]) for k in TEXT_META_KEYS if k in meta)]
        for slot, v in values:  # slot: the metadata key, None for the id (id_key may name url too)
            if v is None or isinstance(v, str):
                continue
            if isinstance(v, bytes):
                v = v.decode("utf-8", "surrogateescape")
            else:
                try:
                    v = str(v)
                except RecursionError:
                    v = f"<{type(v).__name__} nested too deep to print>"
            if slot is None:
                doc_id = v
            else:
                meta[slot] = v
        problems = ((k, number_problem(meta[k], k)) for k in NUMERIC_META_KEYS if meta.get(k) is not None)
        bad = next(((k, why) for k, why in problems if why), None)
        if bad is not None and READ_ERROR not in meta:
            # e.g. "int_score": "4" in a jsonl line, or NaN (a parquet int column with a missing value
            # reads as float): excluded with its reason, not a TypeError in a filter or the shard writer
            meta[READ_ERROR] = f"{where}: {bad[0]} {bad[1]}: {meta[bad[0]]!r}"
        for k, v in [(self.id_key, doc_id), *meta.items()]:
            if isinstance(v, str) and (why := unicode_problem(v)) is not None:
                # A lone surrogate (a jsonl line's "\ud800"): no UTF-8 file can hold it (the manifest,
                # the excluded parquet), so it is kept visible as its escape and the document excluded.
                v = v.encode("utf-8", "backslashreplace").decode()
                if k == self.id_key:
                    doc_id = v
                else:
                    meta[k] = v
                meta.setdefault(READ_ERROR, f"{where}: {k} is not valid Unicode ({why[0]}): {v}")
        meta[SOURCE_FILE], meta[SOURCE_ROW] = file, row  # the manifest's provenance columns
        return Document(text=text, id=str(doc_id) if doc_id is not None else where, metadata=meta)


def unicode_problem(s: str) -> tuple[str, int] | None:
    """Why `s` cannot be written as UTF-8, and where (its character's index), None when it can. A
    surrogate of U+DC80–U+DCFF is how a byte that is not UTF-8 is read (surrogateescape), or a JSON
    escape of one: both named (a binary id of bytes that are not UTF-8 was called "a lone surrogate",
    trial RV71e 6)."""
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        escaped = 0xDC80 <= ord(s[e.start]) <= 0xDCFF
        return ("bytes that are not UTF-8 or a lone surrogate" if escaped else "a lone surrogate"), e.start
    return None


def number_problem(v: Any, key: str) -> str | None:
    """Why metadata value `v` cannot be what column `key` holds (None: it can): not a number; for an
    integer column (the manifest's int64), not finite, past int64 or not whole (4.0 is 4). A float
    column holds NaN."""
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "not a number"
    if key not in INTEGER_META_KEYS:  # the manifest's float64
        return "out of a float64's range" if isinstance(v, int) and abs(v) > sys.float_info.max else None
    if isinstance(v, float) and not math.isfinite(v):  # (an int too big for a float: isfinite overflows)
        return "not a finite number"
    if not -(2**63) <= v < 2**63:
        return "out of an int64's range"
    if isinstance(v, float) and not v.is_integer():  # the int64 column would record 3.9 as 3
        return "not a whole number"
    return None


def mistyped_columns(schema: pa.Schema) -> list[tuple[str, pa.DataType, str]]:
    """(column, its type, what it must hold) for FineWeb-Edu's metadata columns that this parquet
    schema holds with a type the reader cannot take: numbers for the numeric ones; for the others
    (text), anything but a list, a struct or a map (strings, binary as Hive and Impala write strings,
    numbers and dates are read as their text: make_document). A dictionary column (pandas'
    categories) is judged by its values."""
    out = []
    for k in (k for k in META_KEYS if k in schema.names):
        t = schema.field(k).type
        v = t.value_type if pa.types.is_dictionary(t) else t
        if k in NUMERIC_META_KEYS:
            if not (pa.types.is_integer(v) or pa.types.is_floating(v) or pa.types.is_null(v)):
                out.append((k, t, "numbers"))
        elif pa.types.is_nested(v):
            out.append((k, t, "text"))
    return out


def parquet_columns_read(names: list[str], text_key: str, id_key: str) -> list[str]:
    """The columns of a parquet file (its `names`) the reader reads: the text, the id where there is
    one, FineWeb-Edu's metadata columns it holds."""
    meta = [k for k in META_KEYS if k in names and k != text_key]
    return [text_key] + ([id_key] if id_key in names else []) + meta


class ParquetSource(_Reader):
    """Reads `text`, `id` and FineWeb-Edu's metadata columns from parquet files, column-wise."""

    name = "📒 Parquet (gristmill)"

    def __init__(self, *args, batch_size: int = 1024, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_size = batch_size

    def read_file(self, filepath: str):
        try:
            f = self.data_folder.open(filepath, "rb")
        except OSError as e:
            raise SourceError(f"cannot open {self.data_folder.resolve_paths(filepath)}: {e}") from None
        path = self.data_folder.resolve_paths(filepath)
        with f, _read_errors(path, "parquet"), pq.ParquetFile(f) as pqf:
            names = pqf.schema_arrow.names
            if self.text_key not in names:
                raise SourceError(
                    f"{path} has no column {self.text_key!r} (columns: "
                    f"{', '.join(names)}); set source.text_key to the text column"
                )
            cols = parquet_columns_read(names, self.text_key, self.id_key)
            meta_cols = cols[1 + (self.id_key in names) :]  # after the text and the id
            total = pqf.metadata.num_rows or 1
            size = self.sizes.get(filepath, 0)
            row = 0
            for batch in pqf.iter_batches(batch_size=self.batch_size, columns=cols):
                texts = _text_column(batch.column(self.text_key))
                n = len(texts)
                ids = _text_column(batch.column(self.id_key)) if self.id_key in names else [None] * n
                metas = {
                    k: (_text_column if k in TEXT_META_KEYS else pa.Array.to_pylist)(batch.column(k))
                    for k in meta_cols
                }
                for i in range(n):
                    meta = {k: v[i] for k, v in metas.items()}
                    yield self.make_document(
                        texts[i], ids[i], meta, f"{filepath}/{row + i}", filepath, row + i
                    )
                row += n
                if self.progress:
                    self.progress.bytes_done = self._base_bytes + size * row / total
        self._done_file(filepath)


def _text_column(col: pa.Array) -> list:
    """A column's values for text (make_document writes a number or a date as Python does); a date
    past Python's year 9999 as Arrow writes it; a string column holding bytes that are not UTF-8
    (Spark and Hive write them) as bytes, which make_document decodes (surrogate-escaped) and
    excludes with the reason."""
    try:
        return col.to_pylist()
    except UnicodeDecodeError:  # a string column holding bytes that are not UTF-8
        return col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary()).to_pylist()
    except (OverflowError, ValueError):  # a date Python cannot hold
        return col.cast(pa.large_string()).to_pylist()


class JsonlSource(_Reader):
    """Reads JSON lines (.jsonl, .jsonl.gz, .jsonl.zst), byte-exact: bad lines become excluded records."""

    name = "🐿 Jsonl (gristmill)"

    def read_file(self, filepath: str):
        try:
            f = self.data_folder.open(filepath, "rb", compression=_jsonl_compression(filepath))
        except OSError as e:
            raise SourceError(f"cannot open {self.data_folder.resolve_paths(filepath)}: {e}") from None
        with f, _read_errors(self.data_folder.resolve_paths(filepath), "jsonl"):
            lines = _jsonl_lines(f, filepath)
            li = 0
            for li, line in enumerate(lines, 1):
                if blank_line(line):
                    continue
                where = f"{filepath}:{li}"
                try:
                    data = parse_json_line(line)
                    why = None if isinstance(data, dict) else f"{where}: line is not a JSON object"
                except (ValueError, RecursionError) as e:  # nested past the parser's depth
                    why = f"{where}: malformed JSON ({type(e).__name__}: {e})"
                if why is not None:  # no text, its id the line's place, made as every document is: its
                    # reason and where the source has it (review RV64b M3)
                    yield self.make_document(None, None, {READ_ERROR: why}, where, filepath, li)
                    continue
                meta = {k: data[k] for k in META_KEYS if k in data}
                if self.text_key not in data:  # not "empty text": the key missing, and those there
                    keys = ", ".join(map(repr, list(data)[:8])) or "none"
                    meta[READ_ERROR] = f"{where}: no {self.text_key!r} key (source.text_key; it has {keys})"
                yield self.make_document(
                    data.get(self.text_key), data.get(self.id_key), meta, where, filepath, li
                )
            # gzip and zstd read an empty file as no documents; a compressed file holds its header at
            # least (an empty stream too): 0 bytes is a download or a copy that wrote nothing
            if li == 0 and filepath.endswith(JSONL_SUFFIXES[1:]) and self.data_folder.size(filepath) == 0:
                raise EOFError("the file is empty (0 bytes), which no compressed file is")
        self._done_file(filepath)


@contextlib.contextmanager
def _read_errors(path: str, kind: str):
    """A file that breaks off mid-read (corrupt page, truncated stream, dropped connection) ends
    the task with a SourceError naming the file, instead of a bare codec error."""
    try:
        yield
    except (GristmillError, GeneratorExit):
        raise
    except Exception as e:
        detail = str(e).splitlines()[0] if str(e) else ""
        if path.startswith("hf://"):  # nothing local to re-download: the hub client gave up retrying
            fix = (
                "the connection dropped (huggingface_hub retried it) or the file is damaged on the hub; "
                "rerun the same command (finished tasks are kept), or fetch the files with "
                "`gristmill data download` and build from the local copy"
            )
        else:
            fix = (
                "the file is damaged or truncated, or its connection dropped; re-download it under the "
                "same name (`gristmill data download` verifies checksums) and rerun the same command "
                "(finished tasks are kept), or remove it from source.path and build into a new `output`"
            )
        raise SourceError(f"{path} cannot be read as {kind} ({type(e).__name__}: {detail}): {fix}") from None


class _StrictZstdReader(io.RawIOBase):
    """zstd decompression that raises EOFError on a truncated stream.

    zstandard's stream_reader (what fsspec uses) ends quietly when the input stops inside a frame,
    so a cut .jsonl.zst would lose the rest of its documents without a word.
    """

    def __init__(self, raw):
        self._raw = raw
        self._dctx = zstandard.ZstdDecompressor()
        self._dobj = self._dctx.decompressobj()
        self._out = memoryview(b"")
        self._in_frame = False  # input fed to the current frame, which has not ended yet

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._out:
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ends inside a frame (the file is truncated)")
                return 0
            out = []
            while chunk:
                out.append(self._dobj.decompress(chunk))
                self._in_frame = not self._dobj.eof
                chunk = self._dobj.unused_data if self._dobj.eof else b""
                if self._dobj.eof:  # a frame ended; what follows is the next frame
                    self._dobj = self._dctx.decompressobj()
            self._out = memoryview(b"".join(out))
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


def make_reader(cfg: SourceConfig, source: SourceFiles, progress: TaskProgress | None = None) -> _Reader:
    cls = JsonlSource if cfg.kind == "jsonl" else ParquetSource
    return cls(source, text_key=cfg.text_key, id_key=cfg.id_key, limit=cfg.limit, progress=progress)


def iter_texts(
    cfg: SourceConfig,
    source: SourceFiles,
    filters: list,
    max_docs: int,
    max_chars: int,
    seen: Counter | None = None,
):
    """Texts from the start of the source (files in order) that pass `filters`, for tokenizer training.
    `seen`: counts the documents read ("read") and those each filter dropped, by its reason."""
    reader = make_reader(cfg, source)
    seen = Counter() if seen is None else seen
    n = chars = 0
    # read_file, not datatrove's read_files_shard, which logs every file it opens to the terminal
    for doc in (d for f in source.files for d in reader.read_file(f)):
        seen["read"] += 1
        if (why := next((r for f in filters if (r := _drop_reason(f, doc)) is not None), None)) is not None:
            seen[why] += 1
            continue
        yield doc.text
        n += 1
        chars += len(doc.text)
        if n >= max_docs or chars >= max_chars:
            return


def _drop_reason(step, doc: Document) -> str | None:
    """Why filter `step` drops `doc` (its reason, else its name), None where it passes."""
    result = step.filter(doc)
    passed, reason = result if isinstance(result, tuple) else (result, step.name)
    return None if passed else reason
