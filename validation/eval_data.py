"""The eval stage's tasks: local ones shipped here, their data, and hub tasks' availability.

Local tasks are the lm-eval YAML files in validation/eval_tasks/ (`heldout_ppl`: perplexity,
`heldout_cloze`: next-sentence cloze). Their data comes from the run's held-out documents — the
loader's val split (`data.val_fraction`), which training never sees — and is written once per run and
settings to RUN/eval/data/<settings>/ (`task_data_folder`) with each file's sha256 in data.json
(`build_task_data`, also run by `gristmill demo`); a file changed or gone since is named and rebuilt
(`damaged_task_files`). `local_task_config`
loads a YAML with its data_files made absolute (lm-eval resolves relative data_files against the
current directory) and glob-escaped: `datasets` reads data_files as fsspec glob patterns, so a run
directory named like `run[1]` would match nothing.

Hub tasks (hellaswag, arc_easy …) come from lm-eval's own registry; `check_hub_tasks` says, before
any model is loaded, which of them cannot run because the hub is unreachable and the dataset is not
in the local cache.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import functools
import glob
import hashlib
import inspect
import json
import logging
import os
import re
import socket
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

import numpy as np
import yaml
from fsspec.utils import glob_translate
from tokenizers import Tokenizer

from tokenization.separator import DocumentEncoder, SeparatorPolicy, SharedIdsError
from training.contract.atomic_write import write_atomic
from training.contract.config_loader import json_sha256
from training.contract.dataset_format import TOKENIZER_JSON, file_sha256, shared_ids_said
from training.contract.errors import GristmillError
from training.contract.object_store import is_url
from training.data.reader import DocumentTable
from training.data.remote import CacheSettings, dataset_info, ensure

TASKS_DIR = Path(__file__).parent / "eval_tasks"
DATA_VERSION = 3  # 3: the tasks renamed heldout_*, each file's sha256 recorded
DATA_META = "data.json"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


class EvalError(GristmillError):
    """An eval that cannot run; the message names the task, file or run and the fix."""


LOCAL_FILES_CACHE = "gristmill-local-files"  # under datasets' cache: local_data_cache
RENAMED = {"demo_ppl": "heldout_ppl", "demo_cloze": "heldout_cloze"}  # old local task names: refused


def local_task_names() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def local_task_config(name: str, data_dir: str | Path) -> dict[str, Any]:
    """Task `name`'s YAML as a dict, its data_files resolved under `data_dir` (absolute)."""
    cfg = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    files = cfg["dataset_kwargs"]["data_files"]
    data_dir = Path(data_dir).resolve()
    for split, rel in files.items():
        path = data_dir / rel
        if not path.is_file():
            raise EvalError(f"task {name} needs {path}; `gristmill eval {data_dir.parents[2]}` rebuilds it")
        # A pattern to `datasets` (fsspec glob): "[", "*", "?" in the run's path must match themselves.
        files[split] = glob.escape(str(path))
    return cfg


def local_task_definition(name: str) -> str:
    """The sha256 of local task `name`'s definition: its YAML and the version of how its data is made
    (DATA_VERSION), recorded with its scores (`score_settings`) so that an edited task is scored again."""
    return json_sha256(
        {"yaml": (TASKS_DIR / f"{name}.yaml").read_text(encoding="utf-8"), "data": DATA_VERSION}
    )


def task_definition(task_manager: Any, name: str) -> str:
    """The sha256 of lm-eval task, group or tag `name`'s definition as `task_manager` indexes it (an
    include_path YAML or lm-eval's own), recorded with its scores so that a task edited between two
    evals is scored again (review R23a S1): the YAML's config with its includes, its `!function`s
    resolved as lm-eval resolves them and each written as its qualname and the sha256 of its module
    file (`_function`: a repr holds an address, another in every process); a group's and a tag's over
    their members' definitions."""
    return json_sha256(_definition(task_manager, name, set()))


class TaskData(NamedTuple):
    """The local files an lm-eval task, group or tag reads its documents from (`task_data_files`)."""

    files: list[Path]
    """The files, as found now: what its scores' `documents` digest is of."""
    alone: bool
    """Whether every one of its datasets is such files (none from the hub)."""
    patterns: list[str]
    """The glob patterns that find them (its data_files; a dataset_path folder's patterns that decide
    which of its files datasets reads, `_folder_patterns`): a file added to a glob or a folder is a match of
    these (`local_files`), not of `files` (review RV30c S1)."""
    anchors: list[str]
    """The paths as the config writes them (a dataset_path, the folders before a pattern's first
    wildcard) whose links the patterns resolved: one re-pointed (`ln -sfn v2 current`) leads the task to
    other files that no pattern of the old resolution matches (review RV32f B1)."""
    folders: list[tuple[str, str, str, tuple[str, ...]]]
    """Its dataset_path folders named without data_files (their data_dir, where given): datasets chooses
    which of their files it reads (`read_files`, `check_data_folders`). Each as (how the config names it,
    `dataset_path DATA` or `data_dir DATA/sub` or `dataset_path DATA (its dataset card's data_dir sub)`;
    the folder datasets looks in; the folder a data_files of the task's would be relative to; the
    patterns whose matches there are what datasets reads, `_folder_patterns`)."""
    caches: tuple[str, ...] = ()
    """Its dataset_kwargs' cache_dir, where given: datasets' cache for it (`check_data_folders`)."""
    from_cwd: tuple[str, ...] = ()
    """Its builder's (`dataset_path: json`, …) relative data_files, as written: lm-eval and datasets read
    them from the working directory, not from the YAML's folder (`check_data_folders`, the eval's note)."""


def task_data_files(task_manager: Any, name: str) -> TaskData:
    """The local files lm-eval task, group or tag `name` reads its documents from (its own and its
    members' `dataset_kwargs.data_files`, a `dataset_path` that is a local file or folder), whether
    every one of its datasets is such files (none from the hub), and the patterns that find them. Their
    content is what its scores are of (review R30a F1): the config names them by path or pattern only."""
    patterns: list[str] = []
    files: set[Path] = set()
    leaves: list[bool] = []
    anchors: list[str] = []
    folders: list[tuple[str, str, str, tuple[str, ...]]] = []
    definition = final_configs(task_manager, name)
    try:
        _data_files(definition, patterns, files, leaves, anchors, folders)
    except (ValueError, yaml.YAMLError) as e:  # datasets' load of the task refuses it too (RV33b C2)
        where = getattr(task_manager.task_index.get(name), "yaml_path", None)
        # datasets' first sentence, not its ~600 characters of examples after it (review RV33f F8)
        said = " ".join(str(e).split("Examples of data_files in YAML:")[0].split())
        raise EvalError(
            f"task {name}{f' ({where})' if where else ''}: datasets cannot resolve its data files: {said}; "
            "fix its dataset_kwargs or its dataset_path folder's dataset card"
        ) from e
    return TaskData(
        sorted(files),
        bool(leaves) and all(leaves),
        sorted(set(patterns)),
        sorted(set(anchors)),
        sorted(set(folders)),
        tuple(sorted(set(_cache_dirs(definition)))),
        tuple(sorted(set(_from_cwd(definition)))),
    )


class _Unbuilt:
    """A task lm-eval's TaskFactory would build, its config alone (`final_configs`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.task_name = config.get("task")


def final_configs(task_manager: Any, name: str) -> Any:
    """The configs lm-eval builds task, group or tag `name`'s tasks from: each member's own with its
    groups' overrides applied (a group's own non-structural keys, a `- task: x` item's keys: review RV33f
    F3, the member's own data files were recorded and the override's scored), asked of lm-eval's own
    TaskFactory with its tasks left unbuilt (`_built`). The definition's configs (`_definition`) where
    lm-eval cannot build it (its load says why)."""
    built = _built(task_manager, name)
    return _definition(task_manager, name, set()) if built is None else _leaves(built)


def _built(task_manager: Any, name: str) -> Any:
    """What lm-eval's TaskFactory builds of task, group or tag `name`, its tasks left unbuilt (building one
    loads its data): an `_Unbuilt`, a Group of its children, a tag's list; None where it cannot."""
    from lm_eval.tasks import _factory

    class Configs(_factory.TaskFactory):
        def _build_task(self, entry: Any, overrides: dict[str, Any] | None) -> Any:
            config = self._load_full_config(entry, overrides)
            for key in ("tag", "group", "task_list"):  # as lm-eval's own drops them before building (a
                config.pop(key, None)  # group's `tag:` reached its members: review RV34a G8)
            return _Unbuilt(config)

    entry = task_manager.task_index.get(name)
    with _swapped(_factory, "ConfigurableTask", _Unbuilt):  # an inline member is built there
        try:
            return Configs().build(entry, registry=dict(task_manager.task_index))
        except Exception:
            return None


def _leaves(built: Any) -> list[dict[str, Any]]:
    """The task configs of `_built`'s answer, in order."""
    if isinstance(built, _Unbuilt):
        return [built.config]
    return [c for child in built for c in _leaves(child)]  # a tag's list, a group's children


def reconfigured_members(task_manager: Any, name: str) -> set[str]:
    """The tasks and groups of their own (in the task index) that group or tag `name` builds with configs
    other than their own under their own name: a group's own keys (`dataset_name: B` beside its `task`
    list, or on a `- group: inner` item) reach its members at every depth, which lm-eval scores under
    their plain names. Their scores are the group's variant's, not theirs as they are (review RV33f F3:
    recorded with the member's own definition and documents, a later eval of the member alone counted
    them done; RV34a G5: a member group's entry, too)."""
    index = task_manager.task_index

    def own(configs: list[Any]) -> list[Any]:  # lm-eval's metadata: where it ran
        mine = [c for c in configs if isinstance(c, dict)]
        return [_stable({k: v for k, v in c.items() if k != "metadata"}) for c in mine]

    def members(built: Any) -> Iterator[tuple[Any, Any]]:  # (name, what was built) under `built`
        for child in [] if isinstance(built, _Unbuilt) else built:
            yield (child.task_name if isinstance(child, _Unbuilt) else getattr(child, "name", None)), child
            yield from members(child)

    built = _built(task_manager, name)
    return {
        member
        for member, child in ([] if built is None else members(built))
        if member in index
        and str(getattr(index[member], "kind", "")).rsplit(".", 1)[-1] != "TAG"
        and own(_leaves(child)) != own(final_configs(task_manager, member))
    }


def _cache_dirs(value: Any) -> Iterator[str]:
    """The dataset_kwargs cache_dir of a task's config and its members', as written."""
    if isinstance(value, list):
        for v in value:
            yield from _cache_dirs(v)
    if not isinstance(value, dict):
        return
    kwargs = value.get("dataset_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("cache_dir"), str):
        yield kwargs["cache_dir"]
    for v in value.values():
        yield from _cache_dirs(v)


def _from_cwd(value: Any) -> Iterator[str]:
    """The data_files of a task's config and its members' that datasets reads from the working
    directory: a builder's (no folder of its own, no data_dir) local ones that are relative."""
    if isinstance(value, list):
        for v in value:
            yield from _from_cwd(v)
    if not isinstance(value, dict):
        return
    kwargs = value.get("dataset_kwargs") if isinstance(value.get("dataset_kwargs"), dict) else {}
    source = value.get("dataset_path")
    if isinstance(source, str) and _packaged_builder(source) and not isinstance(kwargs.get("data_dir"), str):
        for p in _patterns(kwargs.get("data_files")):
            if _local_pattern(p) and not os.path.isabs(p):
                yield p
    for v in value.values():
        yield from _from_cwd(v)


def local_files(
    patterns: Sequence[str], walk: Callable[[str, int | None], list[str]] | None = None
) -> list[Path]:
    """The files `patterns` (TaskData.patterns, `_rooted`: their folders resolved as they were made) match
    now, each once, in order, as datasets reads a data_files entry when it loads the task (a file that
    joins a pattern is read): what fsspec's glob matches (`_glob_root`, `_walk`) less what resolve_pattern
    leaves out of a match (a `__` or hidden folder or file the pattern does not name, README.md, …: Python's
    glob kept them, review RV32f B7). Each folder the patterns start from is walked once (`walk`: how; a
    walk per pattern was 64 of a 20k-file dataset_path folder at every poll, 2 s: RV32f B5)."""
    from datasets.data_files import FILES_TO_IGNORE

    def kinds(path: str) -> tuple[int, int]:  # its `__` folders, its hidden parts: as datasets counts them
        parts = path.split("/")
        return (
            sum(part.startswith("__") for part in parts[:-1]),
            sum(part.startswith(".") and set(part) != {"."} for part in parts),
        )

    walked = walk or functools.cache(_walk)
    found: set[str] = set()
    for pattern in patterns:
        if not glob.has_magic(pattern):
            found.update([pattern] if os.path.isfile(pattern) else [])
    groups: dict[tuple[str, int | None, tuple[int, int], frozenset[str]], list[str]] = {}
    for pattern in filter(glob.has_magic, patterns):
        ignored = frozenset(FILES_TO_IGNORE) - {os.path.basename(pattern)}
        groups.setdefault((*_glob_root(pattern), kinds(pattern), ignored), []).append(glob_translate(pattern))
    for (root, depth, counts, ignored), regexes in groups.items():
        match = re.compile("|".join(f"(?:{r})" for r in regexes)).match
        for path in walked(root, depth):
            if match(path) and kinds(path) == counts and os.path.basename(path) not in ignored:
                found.add(path)
    return sorted(Path(f) for f in found if os.path.isfile(f))


def _glob_root(pattern: str) -> tuple[str, int | None]:
    """The folder fsspec's glob lists for `pattern` (one with a wildcard), and to what depth (None: all),
    as LocalFileSystem.glob chooses them."""
    first = min([i for i in map(pattern.find, "*?[") if i >= 0] + [len(pattern)])
    cut = pattern.rfind("/", 0, first)
    depth = None if "**" in pattern else pattern[cut + 1 :].count("/") + 1
    return pattern[: cut + 1].rstrip("/") or "/", depth


def _walk(root: str, depth: int | None) -> list[str]:
    """Every path under folder `root` but its folders, `depth` levels deep (None: all), as fsspec's find
    lists them for a glob: a link to a folder is not followed."""
    paths = []
    top = root.count("/")
    for folder, dirs, names in os.walk(root):
        if depth is not None and folder.count("/") - top + 1 >= depth:
            dirs.clear()
        paths += [os.path.join(folder, name) for name in names]
    return paths


def _data_files(
    value: Any,
    patterns: list[str],
    files: set[Path],
    leaves: list[bool],
    anchors: list[str],
    folders: list[tuple[str, str, str, tuple[str, ...]]],
) -> None:
    if isinstance(value, list):
        for v in value:
            _data_files(v, patterns, files, leaves, anchors, folders)
    if not isinstance(value, dict):
        return
    if isinstance(source := value.get("dataset_path"), str):
        from datasets.data_files import sanitize_patterns

        kwargs = value.get("dataset_kwargs") if isinstance(value.get("dataset_kwargs"), dict) else {}
        data_files = kwargs.get("data_files")
        # `json`, `csv`, … name datasets' own builders, never a folder of that name here (review RV30c M1);
        # a folder's relative data_files lie in it, as datasets reads them (RV30c S3: they were looked
        # for here, not found, and the task read through datasets' stale cache under a new digest)
        root = None if _packaged_builder(source) else Path(source).expanduser()
        data_dir = kwargs.get("data_dir") if isinstance(kwargs.get("data_dir"), str) else None
        if root is None:  # a builder's relative data_files and split files lie in data_dir (RV33b C3)
            base = Path(data_dir).expanduser() if data_dir else None
        else:
            base = (root / (data_dir or "")) if root.is_dir() else None  # datasets reads that folder of it
        # no local file or folder: datasets reads it from the hub, and resolves its relative data_files in
        # the hub's repo (an absolute one stays local): never this directory's (review RV33b C7)
        hub = root is not None and not root.exists()
        mine = _globs(data_files, base, anchors, hub)
        if root is not None:
            anchors.append(str(root))
        found = local_files(mine)
        if base is not None and data_files is None:  # the folder's files: those datasets itself reads
            configs = None if data_dir or root is None else _card_configs(root)
            name = value.get("dataset_name") if isinstance(value.get("dataset_name"), str) else None
            walk = functools.cache(_walk)  # one walk of the folder for datasets' globs and the watch's
            chosen_name, found = read_files(str(source), name, data_dir, walk)
            if configs and not chosen_name:  # no files yet: the config datasets will choose, watched
                chosen_name = name or configs.get_default_config_name() or ""
            config = configs[chosen_name] if configs and chosen_name in configs else {}
            # how the config names the folder, and what its data_files would be relative to (datasets'
            # base_path: the dataset_path, its data_dir's; never the card's data_dir, RV33h H4)
            named = f"data_dir {base}" if data_dir else f"dataset_path {source}"
            if config.get("data_dir"):
                named += f" (its dataset card's data_dir {config['data_dir']})"
            relative = str(base)
            base = base / (config.get("data_dir") or "")  # `data_dir: null` is none, as datasets reads it
            chosen = sanitize_patterns(config["data_files"]) if config.get("data_files") is not None else None
            deciding = _folder_patterns(base, chosen, walk)
            mine += deciding
            if root is not None:  # a card written or edited is a change (RV33b C5)
                mine += [glob.escape(str(root.resolve() / card)) for card in _CARDS]
            folders.append((named, str(base), relative, tuple(deciding)))
        elif base is None and root is not None and root.is_file():
            mine.append(glob.escape(str(root.resolve())))  # once (RV31a 5)
            found = local_files(mine)
        patterns.extend(mine)
        files.update(found)
        leaves.append(bool(found) and _all_local(data_files, root, base, hub))
    for v in value.values():
        _data_files(v, patterns, files, leaves, anchors, folders)


def _folder_patterns(
    base: Path,
    chosen: dict[str, list[str]] | None = None,
    walk: Callable[[str, int | None], list[str]] = _walk,
) -> list[str]:
    """The patterns whose matches change which files datasets reads of a dataset_path folder (its
    data_dir) named without data_files (LocalDatasetModuleFactory, PackagedDatasetModuleFactory): the
    split patterns (`test/**`, `**/*-test.*`, …) of the first kind that matches any file and of the
    kinds datasets tries before it (a first match of one of them is another choice); `chosen`: the
    patterns of its dataset card's config ({split: patterns}) in their place. Never the folder's every
    file: a run directory, an eval's outputs or a cache in it changed at every step, and the task's
    steps were never done (review RV31a 3). Which files they are is datasets' to say (`read_files`)."""
    from datasets.data_files import ALL_DEFAULT_PATTERNS, SPLIT_PATTERN_SHARDED, _get_data_files_patterns

    base = base.resolve()  # as datasets does, once (RV31a 5)
    under = glob.escape(str(base))
    kinds = [[SPLIT_PATTERN_SHARDED.replace("{split}", "*")]]
    kinds += [[p for ps in kind.values() for p in ps] for kind in ALL_DEFAULT_PATTERNS]
    if chosen is None:

        def resolve(pattern: str) -> list[str]:
            if not (found := local_files([os.path.join(str(base), pattern)], walk)):
                raise FileNotFoundError(pattern)
            return [str(f) for f in found]

        try:
            chosen = _get_data_files_patterns(resolve)  # get_data_patterns(base)
        except FileNotFoundError:  # no data file yet (EmptyDatasetError): any kind's first match is one
            return [os.path.join(under, p) for kind in kinds for p in kind]
        mine = {p for ps in chosen.values() for p in ps}
        last = next((i for i, kind in enumerate(kinds) if mine & set(kind)), 0)
        mine = mine.union(*kinds[: last + 1])
    else:
        mine = {p for ps in chosen.values() for p in ps}
    return [os.path.join(under, p) for p in sorted(mine)]


def read_files(
    path: str,
    name: str | None,
    data_dir: str | None,
    walk: Callable[[str, int | None], list[str]] | None = None,
) -> tuple[str, list[Path]]:
    """The config datasets builds for `load_dataset(path, name, data_dir=data_dir)` of a local folder or
    one of its own builders (`json`, …) without data_files, and the files it reads: asked of datasets
    itself (its module factory and builder config), not worked out here again; each re-reading of its
    rules missed a case, a file read and never recorded (review RV33f F2, F6, F10). Its file listing comes
    from one walk of each folder (`_one_walk`: 68 globs of a 20k-file folder were 15-30 s); its builder
    writes a lock in a scratch cache_dir, removed after; no request to the network. No files where
    datasets finds none (lm-eval's load says so); ValueError where it refuses the folder (its card, its
    config name)."""
    import datasets
    from datasets.exceptions import DataFilesNotFoundError

    with (
        tempfile.TemporaryDirectory(prefix="gristmill-resolve-") as scratch,
        _one_walk(walk),
        # not its download-count ping (a HEAD to its S3 bucket, up to 3 s) at each plan (review RV34a G3)
        _swapped(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False),
    ):
        try:
            builder = datasets.load_dataset_builder(path, name, data_dir=data_dir, cache_dir=scratch)
        except (DataFilesNotFoundError, datasets.data_files.EmptyDatasetError, FileNotFoundError):
            return name or "", []
        except (RuntimeError, TypeError, KeyError) as e:  # a folder holding a script, …: its one line
            raise ValueError(str(e)) from e
    files = {Path(f) for fs in (builder.config.data_files or {}).values() for f in fs}
    return builder.config.name, sorted(files)


@contextlib.contextmanager
def _one_walk(walk: Callable[[str, int | None], list[str]] | None = None) -> Iterator[None]:
    """datasets' resolve_pattern, for a local pattern, from one walk of each folder (`local_files`: the
    same matches; `walk`: how, cached) while datasets resolves a folder's data files (`read_files`): its
    module global, for the whole process while the block runs (`_swapped`)."""
    from datasets import data_files as module

    walk = walk or functools.cache(_walk)

    def resolve(
        pattern: str, base_path: str, allowed_extensions: list[str] | None = None, **kwargs: Any
    ) -> list[str]:
        if "://" in pattern or "::" in pattern or "://" in base_path:
            return original(pattern, base_path, allowed_extensions, **kwargs)
        # joined as written, as datasets does: `~/x` is FOLDER/~/x to it (review RV34a G1: $HOME's files)
        full = os.path.abspath(os.path.join(base_path, pattern))
        found = [
            str(f)
            for f in local_files([full], walk)
            if allowed_extensions is None
            or any(f".{suffix}" in allowed_extensions for suffix in f.name.split(".")[1:])
        ]
        if not found:
            raise FileNotFoundError(f"Unable to find '{full}'")
        return found

    with _swapped(module, "resolve_pattern", resolve) as original:
        yield


_SWAPS = threading.RLock()


@contextlib.contextmanager
def _swapped(module: Any, name: str, value: Any) -> Iterator[Any]:
    """`module.name`, a global that datasets or lm-eval reads at each use, is `value` for the block, for
    the whole process: so one block at a time (a lock), and what it was put back after (yielded: the
    library's own, no other block running meanwhile). Two overlapping blocks (threads) each put back
    what they found: the last left its replacement installed for good, datasets reading a listing
    cached at one plan (review RV34a G2)."""
    with _SWAPS:
        own = getattr(module, name)
        try:  # before the setattr: an interrupt between the two left the replacement (RV34i I1)
            setattr(module, name, value)
            yield own
        finally:
            setattr(module, name, own)


class Written(NamedTuple):
    """A directory in a task's data folder that datasets would read: what it is, its path, what
    datasets takes of it, and how to take it out (check_data_folders)."""

    what: str
    path: Path
    taken: str
    fix: str


def check_data_folders(name: str, data: TaskData, written: Written) -> None:
    """Refuse task `name` where a dataset_path folder it names without data_files holds the directory the
    reader writes (`written`: the eval's run directory, the decontamination index's --out) or datasets'
    cache where datasets looks (not under a `.` or `__` folder, which it skips): the eval writes RUN/eval/
    (a split folder to datasets), the index its manifest.json (a JSON file to datasets: RV52c), and
    local_data_cache writes data-test.arrow, … into the cache (HF_DATASETS_CACHE, or the task's own
    dataset_kwargs cache_dir), so the task's next read took them for its documents: "no data files" after the
    first eval (review RV32f B2), or a watch that scored the cache's rows and never ended (B8, RV33b C8). And
    a task read from local files alone that names its own cache_dir, anywhere: local_data_cache's per-content
    folder is the one home of its cache (a cache_dir of its own bypassed it: a file replaced under its old
    mtime scored the old rows under the new digest, RV33f F9). Refused rather than redirected: the cache_dir
    is lm-eval's to pass to datasets, and the task loses nothing without it."""
    import datasets

    arrow = "the .arrow files cached there (data-test.arrow, …) for the task's documents"
    kept = [
        written,
        (
            "datasets' cache (HF_DATASETS_CACHE)",
            Path(datasets.config.HF_DATASETS_CACHE),
            arrow,
            "set HF_DATASETS_CACHE outside it",
        ),
        *(  # the task's own (RV33b C8: the watch never ended, as B8's)
            ("its dataset_kwargs cache_dir", Path(cache).expanduser(), arrow, "set cache_dir outside it")
            for cache in data.caches
        ),
    ]
    for named, folder, relative, deciding in data.folders:
        base = Path(folder).resolve()
        for what, path, taken, fix in kept:
            inside = path.resolve()
            if (
                inside.is_relative_to(base)
                and not any(part.startswith((".", "__")) for part in inside.relative_to(base).parts)
                and _may_match_under(deciding, inside)  # a card's data_files never reach it (RV33f F7)
            ):
                raise EvalError(
                    f"task {name} reads {named} without data_files, and {what} {path} lies "
                    f"in it: datasets would take {taken}; give {name} dataset_kwargs: data_files (its "
                    f"files, relative to {relative}) or {fix}"
                )
    for pattern in data.from_cwd:  # lm-eval's own error was a FileNotFoundError of a path (review RV52a F4)
        if not local_files([_rooted(pattern, Path.cwd())]):
            raise EvalError(
                f"task {name}: its data_files {pattern} matches no file in the working directory "
                f"{Path.cwd()}: lm-eval reads a relative data_files from there, not from the task's YAML "
                "folder; give it as an absolute path"
            )
    if data.alone and data.caches:  # datasets reads there, not local_data_cache's folder (review RV33f F9)
        raise EvalError(
            f"task {name} reads local files alone and names its own dataset_kwargs cache_dir "
            f"{data.caches[0]}: datasets keys a local file's cache there by path and mtime, so a file "
            "replaced under its old mtime would be scored from the old rows; remove cache_dir (gristmill "
            "caches such a task's documents per content under HF_DATASETS_CACHE)"
        )


def _may_match_under(patterns: Sequence[str], folder: Path) -> bool:
    """Whether any of glob `patterns` (absolute) can match a file at some depth under `folder`: the
    folder's path is a prefix of one of their matches (a partial match of the glob's regex)."""
    import regex

    under = str(folder) + "/"
    return any(regex.fullmatch(glob_translate(p), under, partial=True) for p in patterns)


_CARDS = ("README.md", ".huggingface.yaml")  # datasets.config.REPOCARD_FILENAME, REPOYAML_FILENAME


def _card_configs(folder: Path) -> Any:
    """The `configs` of the dataset card in dataset_path `folder` (README.md's YAML, .huggingface.yaml's
    over it; datasets' MetadataConfigs, {name: config}) as LocalDatasetModuleFactory reads them: each
    config's `data_files`, its `data_dir`, which datasets reads in place of the folder's split files
    (review RV33b C1, C4); which one it takes is datasets' to say (`read_files`). None where the card has
    no `configs`. ValueError where datasets cannot read them either, in words (a TypeError's traceback
    from datasets: RV33f F4, RV33h H3)."""
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    readme, standalone = (folder / card for card in _CARDS)
    text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""
    data = DatasetCard(text).data if REGEX_YAML_BLOCK.search(text) else DatasetCardData()
    if standalone.exists() and (merged := yaml.safe_load(standalone.read_text(encoding="utf-8"))):
        if not isinstance(merged, dict):  # datasets refuses it too (RV33f F4: a TypeError's traceback)
            raise ValueError(f"{standalone} is not a mapping of card keys (configs: …)")
        data = DatasetCardData(**{**data.to_dict(), **merged})
    try:  # `configs: [5]`, `config_name: [a]`: datasets refuses them too (a TypeError's traceback: RV33h H3)
        configs = MetadataConfigs.from_dataset_card_data(data)
    except (TypeError, AttributeError) as e:
        what = f"{type(e).__name__}: {e}"
        raise ValueError(f"{folder}'s dataset card's `configs` cannot be read ({what})") from None
    if not configs:
        return None
    for chosen, config in configs.items():
        if not isinstance(config.get("data_dir") or "", str):  # RV33f F4: a TypeError's traceback
            raise ValueError(
                f"{folder}'s dataset card gives config {chosen!r} data_dir {config['data_dir']}: "
                "give it a folder name"
            )
    return configs


def _rooted(pattern: str, base: Path, anchors: list[str] | None = None) -> str:
    """Glob `pattern` under folder `base` where relative, its folders before the first wildcard resolved
    here, once (a link followed, `..` gone): its matches need no resolve of their own at each poll
    (review RV31a 5). Those folders as written are appended to `anchors` (TaskData.anchors)."""
    parts = Path(pattern).parts
    literal = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts) - 1)
    folder = base / Path(*parts[:literal])
    if anchors is not None:
        anchors.append(str(folder))
    return os.path.join(glob.escape(str(folder.resolve())), *parts[literal:])


def _patterns(data_files: Any) -> list[str]:
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, dict):
        return [p for v in data_files.values() for p in _patterns(v)]
    if isinstance(data_files, list | tuple):
        return [p for v in data_files for p in _patterns(v)]
    return []


def _local_pattern(pattern: str) -> bool:
    """Whether a data_files pattern names local files (not a URL of any scheme)."""
    return not is_url(pattern) and "://" not in pattern


def _packaged_builder(name: str) -> bool:
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return name in _PACKAGED_DATASETS_MODULES


def _globs(
    data_files: Any, base: Path | None, anchors: list[str] | None = None, hub: bool = False
) -> list[str]:
    """The glob patterns of `data_files` (a path, a glob, a list or a dict of them, as datasets takes
    it) that name local files (not a URL): under `base` (a dataset_path folder), else the working
    directory, where relative (`_rooted`); `~/x` is relative, as datasets joins it (review RV34a G1).
    `hub`: the dataset_path is a hub repo, in which datasets resolves the relative ones: only the
    absolute ones are local."""
    local = [p for p in _patterns(data_files) if _local_pattern(p) and (not hub or os.path.isabs(p))]
    return [_rooted(p, base if base is not None else Path.cwd(), anchors) for p in local]


def _all_local(data_files: Any, root: Path | None, base: Path | None, hub: bool = False) -> bool:
    """Whether a dataset is read from local files alone: a local dataset_path, or data_files each naming
    a local file (`hub`: _globs')."""
    patterns, local = _patterns(data_files), _globs(data_files, base, hub=hub)
    if not patterns:  # a folder's (its data_dir's) or a file's own
        return any(path is not None and path.exists() for path in (base, root))
    return len(local) == len(patterns) and all(local_files([p]) for p in local)


def files_sha256(paths: Sequence[Path]) -> str:
    """The sha256 of `paths`' contents, in their order (a file gone: as such): what a task's scores record
    of the documents it read (`task_data_files`), from the files themselves: datasets' cache of a local
    file is keyed by its path and mtime, and served the old rows of one replaced under the same mtime."""
    digests = []
    for path in paths:
        try:
            digests.append(file_sha256(path))
        except OSError:
            digests.append(None)
    return json_sha256(digests)


# the most bytes documents_before reads for a note: a folder holding a run's checkpoints is not hashed for
# one (its older digest changed at every step anyway: review RV31a 3); read under the eval lock, at each
# step scored again (about 0.5 s for 250 MiB)
DOCUMENTS_BEFORE_BYTES = 256 << 20


class NotRead(enum.Enum):
    """documents_before's answer past DOCUMENTS_BEFORE_BYTES: not told (review RV33a L2). Neither a digest
    nor falsy like None (no such folder), so no caller takes it for either (RV34e L2: it was "")."""

    FOLDER = "not read"


def documents_before(task_manager: Any, name: str, files: Sequence[Path]) -> str | NotRead | None:
    """The `documents` digest a gristmill before 1388e61 recorded of task `name`'s data as its files are
    now: each local dataset_path folder's every file, hidden ones aside, beside `files` (TaskData.files,
    those datasets reads), each resolved. An older record that equals it was taken of these same files
    by the old rule, not of other data (review RV32f B6: its note said the documents changed). None for
    a task without such a folder (the rule was the same); NotRead.FOLDER past DOCUMENTS_BEFORE_BYTES."""
    folders = _dataset_folders(_definition(task_manager, name, set()))
    if not folders:
        return None
    every = {Path(f).resolve() for f in files} | {
        p.resolve()
        for base in folders
        for p in base.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(base).parts)
    }
    if sum(_size(p) for p in every) > DOCUMENTS_BEFORE_BYTES:
        return NotRead.FOLDER
    return files_sha256(sorted(every))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _dataset_folders(value: Any) -> list[Path]:
    """The local dataset_path folders of a task's resolved config, at every depth."""
    if isinstance(value, list):
        return [f for v in value for f in _dataset_folders(v)]
    if not isinstance(value, dict):
        return []
    source = value.get("dataset_path")
    root = Path(source).expanduser() if isinstance(source, str) and not _packaged_builder(source) else None
    mine = [root] if root is not None and root.is_dir() else []
    return mine + [f for v in value.values() for f in _dataset_folders(v)]


@contextlib.contextmanager
def local_data_cache(documents: str | None) -> Iterator[None]:
    """datasets' cache for a task read from local files alone (`task_data_files`) in a folder of its own
    per content (`documents`: files_sha256): datasets keys a local file's cache on its path and mtime, so
    a file replaced at the same size and mtime (cp -p, rsync -t, tar x) was scored from the old rows
    (review R30a F1); the same content reuses its folder. None: datasets' own cache."""
    import datasets

    if documents is None:
        yield
        return
    before = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = Path(before) / LOCAL_FILES_CACHE / documents[:16]
    try:
        yield
    finally:
        datasets.config.HF_DATASETS_CACHE = before


def task_documents_sha256(task: Any) -> str:
    """The sha256 of an lm-eval Task's evaluation documents (eval_docs, after its process_docs), each as
    canonical JSON: what a decontamination index records of every task it holds, and what the eval
    compares it with, so a task whose documents changed under the same name and version (a data
    file replaced) is not marked decontaminated against the old ones (review R23a S2)."""
    h = hashlib.sha256()
    for doc in task.eval_docs:
        h.update(json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def task_members(task_manager: Any, name: str) -> list[str] | None:
    """The names of tag or group `name`'s members as `task_manager` indexes them (a group's: those its
    YAML's `task` list names; a task it defines inline is in its own file), None for a task or an
    unknown name."""
    entry = task_manager.task_index.get(name)
    kind = str(getattr(entry, "kind", "")).rsplit(".", 1)[-1]
    if kind == "TAG":
        return sorted(entry.tags)
    if kind == "GROUP":
        return _member_names(_resolved_config(entry))
    return None


def _definition(task_manager: Any, name: str, seen: set[str]) -> Any:
    entry = task_manager.task_index.get(name)
    if entry is None or name in seen:  # unknown (checked elsewhere), or a group naming itself
        return {"name": name}
    seen = seen | {name}
    kind = str(entry.kind).rsplit(".", 1)[-1]
    if kind == "TAG":
        return {"tag": name, "members": {m: _definition(task_manager, m, seen) for m in sorted(entry.tags)}}
    resolved = _resolved_config(entry)
    cfg = _stable(resolved)
    if kind == "GROUP":
        members = _member_names(cfg)
        return {"group": cfg, "members": {m: _definition(task_manager, m, seen) for m in members}}
    if entry.yaml_path is not None and (_holds_function(resolved) or _names_function(Path(entry.yaml_path))):
        # the Python files beside the YAML, whatever its functions' own files are: a decorator's, a
        # partial's or a cache's wrapper lives elsewhere, and an edit there went unseen (review R23g S2)
        folder = Path(entry.yaml_path).parent
        cfg = {**cfg, "python_files": _python_files(folder)}
    return cfg


def _python_files(folder: Path) -> dict[str, str]:
    """{name: sha256} of the Python files in `folder`: regular files, not hidden ones (an editor's lock
    `.#utils.py`, a dangling link, made the eval a traceback; a copy's `._utils.py` another digest:
    review R23h M1, N1)."""
    return {
        p.name: file_sha256(p)
        for p in sorted(folder.glob("*.py"))
        if not p.name.startswith(".") and p.is_file()  # is_file: a dangling link is none
    }


def _member_names(cfg: dict[str, Any]) -> list[str]:
    """The task names a group's `task` list names: a string, a dict's `task` (a member with overrides,
    `- task: x` with `num_fewshot: 0`, whose own definition is the member's: R23g M3), and those of a
    group defined inline (`- group: inner` with its own `task` list: R23h S2)."""
    names: list[str] = []
    entries = cfg.get("task") or []
    for t in [entries] if isinstance(entries, str) else entries:  # one string is one name, not letters
        if isinstance(t, str):
            names.append(t)
        elif isinstance(t, dict) and isinstance(t.get("task"), str):
            names.append(t["task"])
        elif isinstance(t, dict) and isinstance(t.get("task"), list):
            names.extend(_member_names(t))
        elif isinstance(t, dict) and isinstance(t.get("group"), str):  # `- group: g` with overrides (R23i 3)
            names.append(t["group"])
    return names


def inline_members(task_manager: Any, name: str) -> set[str]:
    """The members group `name` defines in its own YAML (a `- task: x` entry with a config of its own,
    in no index of its own), as against a member it only names (a misspelt one is no inline task)."""
    entry = task_manager.task_index.get(name)
    if str(getattr(entry, "kind", "")).rsplit(".", 1)[-1] != "GROUP":
        return set()

    def defined(entries: Any) -> set[str]:  # at every depth of groups defined inline (review R23j)
        found: set[str] = set()
        for t in [entries] if isinstance(entries, str) else entries or []:
            if isinstance(t, dict) and isinstance(t.get("task"), str) and len(t) > 1:
                found.add(t["task"])
            elif isinstance(t, dict) and isinstance(t.get("task"), list):
                found |= defined(t["task"])
        return found

    return defined(_resolved_config(entry).get("task"))


def _names_function(yaml_path: Path) -> bool:
    """Whether a task's YAML names a `!function` (one whose module lm-eval could not import here is no
    callable in the resolved config, and its edits counted as well)."""
    try:
        return "!function" in yaml_path.read_text(encoding="utf-8", errors="ignore")
    except OSError:
        return False


def _holds_function(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_function(v) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds_function(v) for v in value)
    return callable(value)


def _resolved_config(entry: Any) -> dict[str, Any]:
    """An index entry's config with its functions resolved (lm-eval's load_yaml, as it builds the task);
    the index's own (a `!function` as its path) where they cannot be: building the task then fails and
    says so."""
    from lm_eval.tasks._yaml_loader import load_yaml

    if entry.yaml_path is not None:
        try:
            return load_yaml(entry.yaml_path, resolve_func=True)
        except Exception:
            pass
    return entry.cfg or {}


def _stable(value: Any) -> Any:
    """`value` as JSON that is the same in every process and at every path: functions and classes as
    `_function` writes them."""
    if isinstance(value, dict):
        return {str(k): _stable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    if isinstance(value, set | frozenset):  # YAML's !!set: in no particular order
        return sorted((_stable(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if callable(value):
        return _function(value)
    return str(value)


def _function(value: Callable[..., Any]) -> dict[str, str]:
    """A task's function (a `!function`, a functools.partial of one) as its qualname and the sha256 of
    its whole module file: an edit anywhere in that file (a helper it calls, a constant) is another
    definition (review R23d 1), the modules the file imports are not. Never by its module's name: lm-eval
    names a module of an include_path folder by its absolute path, another on every machine, checkout
    or mount of the same folder. A function without a file (a builtin) by its module's name."""
    target = getattr(value, "func", value)  # a functools.partial: the function it calls
    with contextlib.suppress(ValueError):  # a decorator's (functools.wraps) or a cache's wrapper: its own
        target = inspect.unwrap(target)
    name = getattr(target, "__qualname__", type(target).__qualname__)
    try:
        file = Path(inspect.getfile(target if hasattr(target, "__qualname__") else type(target)))
        module = file.read_bytes()
    except (OSError, TypeError):  # a builtin, or its file gone: its module's name, where that is no path
        module = str(getattr(target, "__module__", "")).encode()
        module = b"" if os.sep.encode() in module else module
    return {"function": name, "module_sha256": hashlib.sha256(module).hexdigest()}


# --------------------------------------------------------------------------------------------
# data of the local tasks


def heldout_texts(
    dataset_dir: str | Path, val_fraction: float, max_docs: int, cache: CacheSettings | None = None
) -> tuple[list[str], int]:
    """Up to `max_docs` held-out documents of the dataset, decoded back to text (no separator), and how
    many of them were left out: those whose text does not encode back to the ids the shards hold
    (lm-eval scores a task's text encoded again). A Metaspace tokenizer with prepend_scheme "first" and
    a Strip decoder (Llama-2's and Mistral's tokenizer.json) loses a document's leading space, so it
    was scored on other ids than training's, and bits_per_byte counted a byte less (review R25a 2).

    The held-out documents are the dataset's val split (training/data/reader.py), in its order.
    """
    if val_fraction <= 0:
        raise EvalError(
            "the run holds out no documents (data.val_fraction = 0), and the local tasks are built from "
            "held-out documents; train with data.val_fraction > 0 (the demo uses 0.02) or evaluate hub tasks"
        )
    table = DocumentTable(dataset_dir, split="val", val_fraction=val_fraction, cache=cache)
    if table.info.get("tokenizer_sha256") in (None, "none"):  # a traceback (review R22a B1)
        raise EvalError(
            f'{table.location} records no tokenizer (tokenizer_sha256 "none"), and the local tasks decode '
            "its held-out documents back to text with it; evaluate lm-eval's own tasks (--tasks), or "
            "train on a dataset built with its tokenizer"
        )
    ensure(table.root, [TOKENIZER_JSON])  # a bucket's dataset: fetched and checked
    tok = Tokenizer.from_file(str(table.root / TOKENIZER_JSON))
    sep = table.info["separator"]
    # the text encoded again as the build did (and eval does: no specials added, literal ones text)
    try:
        encoder = DocumentEncoder(tok, SeparatorPolicy(sep["token"], sep["position"]), str(table.location))
    except SharedIdsError as e:  # a dataset built before the build refused such a vocab: the encoder's
        # fix (edit the file) fits no dataset and run already encoded with it (review RV41b F3)
        from training.checkpoint.hf_export import vocab_rescoring_fix

        raise EvalError(
            f"{table.root / TOKENIZER_JSON}: its model.vocab {shared_ids_said(e.shared)}, so the local "
            f"tasks' texts would not decode as the run's data was encoded; {vocab_rescoring_fix(None)}"
        ) from None
    rows = table.split_rows(np.arange(min(max_docs, table.documents)))
    texts, left_out = [], 0
    for r in rows.tolist():
        ids = table.document(r)
        text = tok.decode(ids[ids != table.separator_id].tolist(), skip_special_tokens=False)
        if np.array_equal(encoder.encode(text), ids):  # the one separator per document (contract)
            texts.append(text)
        else:
            left_out += 1
    return texts, left_out


def _sentences(text: str) -> list[str]:
    return [" ".join(s.split()) for s in _SENTENCE_END.split(text) if s.strip()]


def cloze_items(texts: list[str], n_choices: int = 4, per_doc: int = 2) -> list[dict[str, Any]]:
    """Items {context, choices, label}: a document's opening sentences (≥ 150 characters), its
    true next sentence (20-200 characters), and as distractors the true next sentences of items from
    other documents."""
    pairs = []  # (document, context, true continuation)
    for doc, text in enumerate(texts):
        ctx: list[str] = []
        made = 0
        for sent in _sentences(text):
            if sum(map(len, ctx)) >= 150 and 20 <= len(sent) <= 200:
                context = " ".join(ctx)
                if len(context) > 350:  # keep the end, from a word boundary (fits 256-token windows)
                    context = context[-350:].split(" ", 1)[-1]
                pairs.append((doc, context, sent))
                made += 1
                if made == per_doc:
                    break
                ctx = []  # the next item's context starts after this one
            else:
                ctx.append(sent)
    if len({doc for doc, _, _ in pairs}) < n_choices:
        raise EvalError(
            f"cloze items from only {len({d for d, _, _ in pairs})} of {len(texts)} held-out documents (need "
            f"≥ {n_choices}); raise data.val_fraction, or docs (eval.docs in a training recipe); a corpus "
            "with few sentences (code, lowercase text) makes few: score heldout_ppl alone (--tasks "
            "heldout_ppl; eval.tasks in a training recipe)"
        )
    items = []
    for k, (doc, ctx, true) in enumerate(pairs):
        # Distractors: the true next sentences of the following items from *other* documents.
        others = [p[2] for j in range(1, len(pairs)) if (p := pairs[(k + j) % len(pairs)])[0] != doc]
        others = others[: n_choices - 1]
        label = k % n_choices  # the true answer's position cycles, so no position bias helps
        choices = others[:label] + [true] + others[label:]
        items.append({"context": ctx, "choices": choices, "label": label})
    return items


def task_file(name: str) -> str:
    """The data file of local task `name` under its RUN/eval/data/<settings> folder."""
    return f"{name}.jsonl"


def task_items(path: str | Path) -> int:
    """The items of a local task's data file: its JSON lines, which end at "\n" only (str.splitlines
    also breaks at U+2028, U+0085 a held-out text may hold, written raw)."""
    return sum(1 for line in Path(path).read_bytes().split(b"\n") if line.strip())


def damaged_task_files(out_dir: str | Path, names: Sequence[str] | None = None) -> list[Path]:
    """The local tasks' data files under `out_dir` (all, or those of task `names`) that are missing
    or differ from the sha256 data.json recorded when they were built (an unreadable data.json:
    all of them)."""
    out_dir = Path(out_dir)
    try:
        recorded = json.loads((out_dir / DATA_META).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    files = [task_file(n) for n in names] if names is not None else sorted(recorded) or []
    return [
        out_dir / f
        for f in files
        if not (out_dir / f).is_file() or recorded.get(f) != file_sha256(out_dir / f)
    ]


def task_data_problem(out_dir: str | Path, damaged: Sequence[Path] = ()) -> str:
    """What is wrong with the local tasks' data under `out_dir` where damaged_task_files found files
    (`damaged`): the folder gone, its data.json gone or unreadable, or files not as it records them.
    Each in its own words: a failed eval's line said "<task>.jsonl not as data.json recorded" of an
    unreadable data.json, and "failed again" once the whole folder was gone (trial RV57b F4)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return f"{out_dir} is gone (deleted since it was built)"
    try:
        json.loads((out_dir / DATA_META).read_text())["files"].items()
    except FileNotFoundError:
        return f"{out_dir}/{DATA_META} is gone (deleted since it was built)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{out_dir}/{DATA_META} is damaged (not the record its build wrote)"
    # the files by name (the line said `<task>.jsonl`: trial RV70d 5)
    named = ", ".join(str(out_dir / p.name) for p in damaged) or f"{out_dir}/<task>.jsonl"
    return f"{named} not as {out_dir.name}/{DATA_META} recorded (changed or deleted since it was built)"


def task_data_settings(dataset_dir: str | Path, val_fraction: float, max_docs: int) -> dict[str, Any]:
    """What decides the local tasks' data: the held-out documents' dataset, its split and how many."""
    return {
        "version": DATA_VERSION,
        "dataset": str(dataset_dir) if is_url(dataset_dir) else str(Path(dataset_dir).resolve()),
        "dataset_fingerprint": dataset_info(dataset_dir)["fingerprint"],
        "val_fraction": val_fraction,
        "max_docs": max_docs,
        # Only documents that encode back (heldout_texts): a folder of its own, apart from the one a
        # gristmill before that check builds for the same settings with every document, so that the two
        # (a run's in-training eval started before an upgrade, an `eval --watch` after it) do not rebuild
        # one folder back and forth under each other's scoring (review R25i S1).
        "kept": "documents that encode back",
    }


def task_data_folder(settings: dict[str, Any]) -> str:
    """The folder under RUN/eval/data of the local tasks' data of `settings` (task_data_settings): one
    per settings, so that an eval of other settings (`gristmill eval --set docs=5` beside a training
    run's own eval) never rewrites the files another process is scoring (review R15c F1)."""
    return f"docs{settings['max_docs']}-{json_sha256(settings)[:10]}"


def task_documents(out_dir: str | Path) -> dict[str, Any]:
    """Which documents the local tasks' data in `out_dir` holds, as its data.json recorded them when it was
    built: how many (`scored`), how many held-out documents were left out (`left_out`) and the sha256 of
    heldout_ppl's file (one line per document). Recorded with the local tasks' scores (HeldOut.documents),
    so that a step scored on another set of documents is scored again (review R25i S1)."""
    meta = json.loads((Path(out_dir) / DATA_META).read_text())
    return {
        "scored": meta["documents"],
        "left_out": meta["left_out"],
        "sha256": meta["files"][task_file("heldout_ppl")],
    }


def build_task_data(
    dataset_dir: str | Path,
    val_fraction: float,
    out_dir: str | Path,
    max_docs: int = 40,
    log: Callable[[str], None] | None = None,
    cache: CacheSettings | None = None,
    tasks: Sequence[str] | None = None,
) -> Path:
    """Write the data files of local tasks `tasks` (all: None; heldout_ppl's always, whose lines count
    the documents) from the held-out documents into `out_dir`: a task never asked for is not built (a
    corpus with no sentence a cloze item is made of scores its perplexity); those built before for the
    same documents stay (a run's in-training eval checks its own tasks' files). An up-to-date directory
    (same dataset fingerprint, val_fraction, max_docs, the tasks asked among those built, every file as
    built) is kept as it is. Files damaged or deleted since they were built are named through `log`
    and rebuilt (the same items: they are a pure function of the held-out documents)."""
    out_dir = Path(out_dir)
    meta = task_data_settings(dataset_dir, val_fraction, max_docs)
    meta_path = out_dir / DATA_META
    try:
        old = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        old = None
    unreadable = meta_path.exists() and not isinstance(old, dict)  # rebuilt below: said (not so: RV57b F5)
    if unreadable and log is not None:
        log(f"note: {task_data_problem(out_dir)}; rebuilt from the run's held-out documents")
    built = ("files", "tasks", "documents", "left_out")  # what the build found, not what decides it
    same = isinstance(old, dict) and {k: v for k, v in old.items() if k not in built} == meta
    # A folder built before documents that do not encode back were left out (no "left_out") is built
    # again: the same files where none is (the scores stand), fewer documents where some are.
    same = same and "left_out" in old
    asked = {*(local_task_names() if tasks is None else tasks), "heldout_ppl"}
    recorded = old.get("files") if same else None  # the tasks whose files it records: built before
    held = (
        {n for n in local_task_names() if task_file(n) in recorded} if isinstance(recorded, dict) else set()
    )
    meta["tasks"] = sorted(asked | held)
    if same and asked <= held:
        damaged = damaged_task_files(out_dir, meta["tasks"])
        if not damaged:
            return out_dir
        if log is not None:
            log(
                f"note: {', '.join(map(str, damaged))}: not as {meta_path} recorded (changed or deleted "
                "since it was built); rebuilt from the run's held-out documents"
            )
    texts, left_out = heldout_texts(dataset_dir, val_fraction, max_docs, cache)
    if left_out and not texts:
        raise EvalError(
            f"none of the {left_out} held-out documents of {dataset_dir} encodes back to its ids from the "
            "text its tokenizer decodes, so the local tasks would score ids training never saw; evaluate "
            "lm-eval's own tasks (--tasks)"
        )
    if left_out and log is not None:
        log(
            f"note: {left_out} of {left_out + len(texts)} held-out documents left out of the local tasks: "
            "their text, decoded from the shards, does not encode back to the same ids (the tokenizer's "
            "decoder loses something, e.g. a leading space), so they would be scored on ids training "
            f"never saw; recorded in {meta_path}"
        )
    rows = {"heldout_ppl": lambda: [{"text": t} for t in texts], "heldout_cloze": lambda: cloze_items(texts)}
    files = {task_file(name): rows[name]() for name in meta["tasks"]}
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # written last: data without it is rebuilt
    for name, rows in files.items():
        write_atomic(out_dir / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    meta["files"] = {name: file_sha256(out_dir / name) for name in files}
    meta["documents"], meta["left_out"] = len(texts), left_out
    write_atomic(meta_path, json.dumps(meta, indent=1) + "\n")
    return out_dir


# --------------------------------------------------------------------------------------------
# hub tasks


def check_include_path(include_path: Sequence[str], key: str = "include_path") -> None:
    """Every entry of `include_path` is a directory (one that is not was looked at only when a task
    outside the project's own was asked for: eval took a misspelt one without a word). `key`: its name
    where the user gave it (eval's config key, a build's decontaminate.include_path, a --include-path)."""
    for p in include_path:
        if not Path(p).expanduser().is_dir():  # a recipe's KeptPath keeps its `~` as written (RV77c 1)
            raise EvalError(f"{key} {p} is not a directory (of lm-eval task YAML files)")


def check_no_local_names(include_path: Sequence[str]) -> None:
    """Refuse a task, group or tag under `include_path` named like a local task (or an old name of one,
    RENAMED): the local task is scored under that name, and the user's own was ignored without a word
    (review R23a A2)."""
    from lm_eval.tasks import TaskManager

    if not include_path:
        return
    index = TaskManager(include_defaults=False, include_path=list(map(str, include_path))).task_index
    taken = set(local_task_names()) | set(RENAMED)
    if clash := sorted(n for n in index if n in taken):
        name = clash[0]
        where = (
            index[name].yaml_path
            or f"a tag of tasks under include_path ({', '.join(sorted(index[name].tags))})"
        )
        raise EvalError(
            f"{where} defines {name}, the name of one of gristmill's local tasks (validation/eval_tasks/): "
            "rename yours, which would never be scored under it"
        )


def local_yaml_tasks(include_path: Sequence[str]) -> set[str]:
    """Task, group and tag names defined by the lm-eval YAML files under `include_path`."""
    from lm_eval.tasks import TaskManager

    check_include_path(include_path)
    return set(TaskManager(include_defaults=False, include_path=list(map(str, include_path))).task_index)


def hub_task_manager(names: list[str], include_path: Sequence[str] = (), own: set[str] | None = None) -> Any:
    """An lm-eval TaskManager that knows `names`, indexing only the task families (top-level
    directories of lm_eval/tasks) whose YAML mentions them: the full index parses ~14k files, about
    15 s. Falls back to the full index when a name is not found that way. The directories of
    `include_path` (the user's own task YAMLs, whose names are `own` when the caller has them) are
    indexed as well."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    extra = [str(p) for p in include_path]
    if own is None:
        own = local_yaml_tasks(extra) if extra else set()
    rest = sorted(set(names) - own)
    root = Path(lm_eval.tasks.__file__).parent
    families: dict[str, set[str]] = {}  # the families whose YAML mentions each name
    if rest:
        alts = "|".join(map(re.escape, rest))
        pattern = re.compile(rf"^(?:task|group|tag):\s*({alts})\s*$|^\s*-\s*({alts})\s*$", re.M)
        for path in root.rglob("*.yaml"):
            for m in pattern.finditer(path.read_text(encoding="utf-8", errors="ignore")):
                family = str(root / path.relative_to(root).parts[0])
                families.setdefault(m.group(1) or m.group(2), set()).add(family)
    if set(families) == set(rest):
        tm = TaskManager(include_defaults=False, include_path=sorted(set().union(*families.values())) + extra)
        # lm-eval indexes each root apart and a later root's tag replaces an earlier one's: a tag whose
        # tasks lie in several families lost members (math_word_problems: 8 of 26 scored under its
        # name: review R23d 3). Such a tag takes the full index, where a family is no root.
        split_tag = any(
            len(families[n]) > 1 and str(tm.task_index[n].kind).endswith("TAG")
            for n in rest
            if n in tm.task_index
        )
        if all(n in tm.task_index for n in names) and not split_tag:
            return tm
    return full_task_manager(extra)


@functools.cache
def _shipped_task_index(root: Path) -> dict[str, Any]:
    """lm-eval's index of the tasks it ships under `root` (~14k YAML files, ~10 CPU s): built once per
    process, as that folder does not change in one; an in-training eval that falls back to the full
    index rebuilt it at every eval step."""
    from lm_eval.tasks._index import TaskIndex

    return TaskIndex.build([root])


def full_task_manager(include_path: Sequence[str] = ()) -> Any:
    """TaskManager(include_path=include_path or None): lm-eval's shipped tasks (indexed once per process)
    and `include_path`'s, indexed afresh at each call (a user's files may change between calls). The
    same index as lm-eval's own: each root indexed apart, a later root's names replacing an earlier's."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    tm = TaskManager(include_defaults=False, include_path=list(include_path) or None)
    index = dict(_shipped_task_index(Path(lm_eval.tasks.__file__).parent))
    for name, entry in tm.task_index.items():
        if name in index:  # lm-eval's warning, as when it indexes both roots itself
            shipped = index[name].yaml_path
            logging.getLogger("lm_eval.tasks._index").warning(
                "Task '%s' from %s overrides existing task from %s", name, entry.yaml_path, shipped
            )
        index[name] = entry
    # TaskManager.__init__'s own fields for the index it built (lm-eval 0.4.13, pinned)
    tm._index = index
    tm._all_tasks = sorted(index)
    tm._all_subtasks = sorted(n for n, e in index.items() if e.kind in (Kind.TASK, Kind.PY_TASK))
    tm._all_groups = sorted(n for n, e in index.items() if e.kind == Kind.GROUP)
    tm._all_tags = sorted(n for n, e in index.items() if e.kind == Kind.TAG)
    return tm


def checked_task_manager(
    names: list[str], include_path: Sequence[str] = (), local_hint: str | None = None
) -> Any:
    """hub_task_manager(names, include_path), with check_hub_tasks run on the names that are not
    the user's own YAML tasks (those of `include_path`), and on those of them that read their dataset
    from the hub: skipped, such a task failed offline after the model loaded, `Dataset … is not cached
    in None` (trial RV78b 6)."""
    own = local_yaml_tasks(include_path) if include_path else set()
    tm = hub_task_manager(names, include_path, own)
    checked = [n for n in names if n not in own or any(_on_hub(p) for _, p, _ in hub_datasets(tm, n))]
    check_hub_tasks(tm, checked, local_hint, include_path)
    return tm


def _on_hub(dataset_path: str) -> bool:
    """Whether an own task's dataset_path names a hub dataset (ORG/NAME), not a builder (json, csv) or
    a folder here."""
    return (
        "/" in dataset_path
        and not dataset_path.startswith((".", "/", "~"))
        and not Path(dataset_path).exists()
    )


def hub_datasets(task_manager: Any, name: str) -> list[tuple[str, str, str | None]]:
    """[(task, dataset_path, dataset_name)] of lm-eval task, group or tag `name` (recursively)."""
    entry = task_manager.task_index.get(name)
    if entry is None:
        return []
    cfg = entry.cfg or {}
    kind = str(entry.kind).rsplit(".", 1)[-1]
    if kind == "TAG":
        members = sorted(entry.tags)
    elif kind == "GROUP":
        members = [t for t in cfg.get("task") or [] if isinstance(t, str)]
    else:
        return [(name, cfg["dataset_path"], cfg.get("dataset_name"))] if cfg.get("dataset_path") else []
    return [d for m in members if m != name for d in hub_datasets(task_manager, m)]


OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether what `datasets` and huggingface_hub connect to for HF_ENDPOINT answers: the endpoint at
    its own port (its URL's, else its scheme's), or the proxy the environment names for its scheme
    (HTTPS_PROXY, ALL_PROXY …; NO_PROXY kept). Port 443 of its host alone refused, "the hub is
    unreachable", an endpoint on another port and any behind a proxy, which the libraries read
    (trial RV72a F3)."""
    # truthy as huggingface_hub and datasets read them: HF_DATASETS_OFFLINE=0 or HF_HUB_OFFLINE=false
    # were "the hub is unreachable" (re-trial RV72e F7)
    if any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_FLAGS):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    scheme = url.scheme or "https"
    host, port = url.hostname or "huggingface.co", _port(url, scheme)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = p.hostname or host, _port(p, p.scheme)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def _port(url, scheme: str) -> int:
    """The port of parsed URL `url`: its own, else its scheme's (80 for http, 1080 for socks, else 443)."""
    try:
        if url.port:
            return url.port
    except ValueError:  # not a number: the libraries fail on it too, and say so
        pass
    return 80 if scheme == "http" else 1080 if scheme.startswith("socks") else 443


def dataset_cached(path: str) -> bool:
    """Whether `datasets` or the hub cache holds something of dataset `path` (owner/name)."""
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    ds_cache = Path(os.environ.get("HF_DATASETS_CACHE", hf_home / "datasets"))
    hub_cache = Path(os.environ.get("HF_HUB_CACHE", hf_home / "hub"))
    return (ds_cache / path.replace("/", "___")).is_dir() or (
        hub_cache / f"datasets--{path.replace('/', '--')}"
    ).is_dir()


def unreadable_task_files(include_path: Sequence[str | Path], name: str) -> list[str]:
    """`FILE does not parse (why)` for each YAML file under `include_path` that could define task `name`
    (its text or file name holds the name) and that lm-eval's task index skips: it drops a file it
    cannot read without a word, and the task was then reported unknown (review R23a M1). A file that
    parses and defines no task, group or tag (a template others include) is not one: named, it was
    called broken (review R23d 6)."""
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    out = []
    for root in include_path:
        for path in TaskIndex._iter_yaml_files(Path(root)):  # the files, in the order, the index reads
            if path.stem != name and name not in path.read_text(encoding="utf-8", errors="ignore"):
                continue
            try:  # as TaskIndex.build reads each file
                cfg = load_yaml(path, resolve_func=False, recursive=True)
                if isinstance(cfg, dict) and not cfg.keys() & {"task", "group", "tag", "class"}:
                    continue  # a template that task files include: the index skips it by design (R23d 6)
                TaskIndex.process_cfg(cfg, path, {})
            except Exception as e:
                out.append(f"{path} does not parse ({_one_line(e)})")
    return out


def _one_line(error: BaseException) -> str:
    """A YAML error as its problem and place (yaml's own text spans lines), any other as its first line."""
    mark = getattr(error, "problem_mark", None)
    if isinstance(error, yaml.MarkedYAMLError) and mark is not None:
        return f"{error.problem or error.context}, line {mark.line + 1} column {mark.column + 1}"
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def check_hub_tasks(
    task_manager: Any,
    names: list[str],
    local_hint: str | None = None,
    include_path: Sequence[str | Path] = (),
) -> None:
    """Raise EvalError naming each hub task that cannot get its dataset (offline, not cached), and each
    unknown one (with the YAML files under `include_path` that may define it and do not parse).

    Offline with every dataset cached, the hub is switched off for this process so `datasets`
    reads the cache instead of waiting for the network. `local_hint` replaces the messages' pointer
    to the eval's local tasks (for a caller that has other ones).
    """
    unknown = [n for n in names if n not in task_manager.task_index]
    if unknown:
        hints = [
            f"{n} ({'; '.join(bad)}: fix it, lm-eval skips a task file it cannot read)"
            if (bad := unreadable_task_files(include_path, n))
            else f"{n} (did you mean {', '.join(m)}?)"
            if (m := difflib.get_close_matches(n, task_manager.all_tasks, 3))
            else n
            for n in unknown
        ]
        local = local_hint or f"local tasks: {', '.join(local_task_names())}"
        raise EvalError(f"unknown task {', '.join(hints)}; {local}; hub tasks: `lm_eval ls tasks`")
    needs = [d for n in names for d in hub_datasets(task_manager, n)]
    if not needs or hub_reachable():
        return
    missing = [(task, path) for task, path, _ in needs if not dataset_cached(path)]
    if missing:
        lines = "; ".join(f"task {t} needs dataset {p} from the hub" for t, p in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise EvalError(
            f"{lines}{more}, and the hub is unreachable: run with network once (it fills the cache) or point "
            "HF_DATASETS_CACHE at a copy of a cache that holds it; "
            + (local_hint or f"local tasks work offline: --tasks {','.join(local_task_names())}")
        )
    # The libraries read these at import (already done by lm_eval): set the flags they read, too.
    import datasets.config
    import huggingface_hub.constants

    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    huggingface_hub.constants.HF_HUB_OFFLINE = True
