"""The decontamination index of the build: `gristmill data decontam-index`, and the driver's steps
that get an index before any task runs and install it into the output.

    gristmill data decontam-index --tasks hellaswag,arc_easy,piqa --out runs/decontam/three
    gristmill data decontam-index --tasks my_qa --include-path my_tasks/ --ngram 8 --out DIR

Each task (or every task of a group or tag) is read through lm-eval's own task objects, so the
texts are the ones lm-eval builds its requests from: the split it evaluates (test, else validation)
after the task's process_docs; per document the task's doc_to_decontamination_query where it sets
should_decontaminate, else its context (doc_to_text) and every answer text (doc_to_choice, or
doc_to_target when it is text). The index itself (format, normaliser, hashing) is
pipelines/decontam/ngram.py, which the build's filter reads without lm-eval: lm-eval is imported
only inside the functions that read tasks, so importing this module costs none.

With `[decontaminate]` in a data recipe the driver gets an index before any task runs
(`stage_index`): it builds one as this command would into a temporary directory, or checks the
prebuilt one that `index = DIR` names (for a cluster without the hub: build it where there is
network). The index's sha256 and n go into the build's identity, so a changed index is a changed
dataset (a resume is refused, naming it). Inside the build lock the index is copied to
OUTPUT/decontam/ (`install_index`), where every worker reads it: a dataset carries the index it was
filtered against, and Slurm or Ray nodes need nothing but the output.

Offline, local YAML tasks (`--include-path`) work; a hub task whose dataset is neither reachable
nor cached is refused in one line, as `gristmill eval` refuses it. lm-eval's and datasets' own
output goes to DIR/lm-eval.log.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.build_identity import BuildError
from pipelines.config import DecontaminateConfig
from pipelines.dataset_lock import dataset_lock
from pipelines.decontam.filter import INDEX_DIR, check_copy, enabled
from pipelines.decontam.ngram import (
    HASHES_NPY,
    MANIFEST_JSON,
    REFS_NPY,
    UNCHECKED,
    check_task_names,
    many_ngram_hashes,
    read_manifest,
    write_index,
)
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import decontam_sha256, file_sha256, read_dataset_info
from training.contract.errors import GristmillError, unwritable
from training.contract.lifetime import host, pid_alive
from training.contract.run_layout import artifact_in
from validation.eval_data import (
    EvalError,
    Written,
    check_data_folders,
    check_include_path,
    checked_task_manager,
    files_sha256,
    local_data_cache,
    task_data_files,
    task_documents_sha256,
)
from validation.eval_output import eval_output

LOG = "lm-eval.log"
STAGING = "gristmill-decontam-"  # + HOST-PID-: a build's temporary index, in $TMPDIR
LOCAL_HINT = (
    "or build the index where there is network and copy it (a recipe's [decontaminate] index = DIR); "
    "local YAML tasks: --include-path DIR"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n")[1]
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval task, group or tag names")
    parser.add_argument("--ngram", type=int, default=13, help="words per n-gram (default 13)")
    parser.add_argument(
        "--out",
        required=True,
        action=PathArgument,
        local=True,
        metavar="DIR",
        help="directory to write the index into",
    )
    parser.add_argument(
        "--include-path",
        action=PathArgument,
        append=True,
        default=[],
        metavar="DIR",
        help="a directory of lm-eval task YAML files (repeatable), as lm-eval's --include_path",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help=f"show lm-eval's output (always in DIR/{LOG})"
    )


def run(args: argparse.Namespace) -> int:
    # "": the working directory, its manifest.json replaced (R22d S2)
    if (held := artifact_in(args.out)) is not None:  # the index's files written beside its own
        raise GristmillError(f"--out {args.out} {held}; give the index a directory of its own")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    check_include_path(args.include_path, "--include-path")
    try:
        with dataset_lock(Path(args.out), "this command", key="--out"):
            before = _earlier_index(Path(args.out))
            manifest = build_index(names, args.ngram, args.out, args.include_path, verbose=args.verbose)
    except OSError as e:  # a full disk, a folder it cannot write: a traceback (trial RV64b T2)
        read = e.filename and not Path(e.filename).resolve().is_relative_to(Path(args.out).resolve())
        if read:  # a task file it reads (--include-path's), not --out's (review RV64d 3)
            raise GristmillError(
                f"cannot read {e.filename}: {e.strerror or e}; fix that path (--include-path, --tasks)"
            ) from None
        raise unwritable(Path(args.out), e) from None
    print(summary(manifest, Path(args.out)))
    if before is not None and before.get("sha256") != manifest["sha256"]:  # replaced in silence before
        tasks = ", ".join(str(t.get("name")) for t in before.get("tasks") or [] if isinstance(t, dict))
        print(
            f"note: this replaced the index {args.out} held (sha256 {before.get('sha256') or 'unrecorded'}, "
            f"{before.get('ngram')}-grams of {tasks or 'no task'}); a recipe that names it by "
            f"decontaminate.index_sha256 now needs the new one, {manifest['sha256']}"
        )
    return 0


def _earlier_index(out: Path) -> dict[str, Any] | None:
    """The manifest of the index `out` holds already, as it is: one of an older normaliser too, which
    read_manifest refuses (the first rebuild after an upgrade, which most needs saying: review RV63d 2)."""
    try:
        manifest = json.loads((out / MANIFEST_JSON).read_bytes())
    except (OSError, ValueError):
        return None  # none, or a damaged one: replaced, as a rerun repairs it
    return manifest if isinstance(manifest, dict) else None


def summary(manifest: dict[str, Any], out: Path) -> str:
    """The index's table: per task its documents, n-grams and the documents with none (every text
    shorter than n words: no training text is checked against them), and a line saying so."""
    n = manifest["ngram"]
    counts = ("documents", "ngrams", "documents_without_ngrams")
    rows = [(t["name"], t["split"], *(f"{t[k]:,}" for k in counts)) for t in manifest["tasks"]]
    rows = [("task", "split", "documents", f"{n}-grams", f"documents with no {n}-gram"), *rows]
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d:>{w[3]}}  {e:>{w[4]}}" for a, b, c, d, e in rows]
    unchecked = sum(t["documents_without_ngrams"] for t in manifest["tasks"])
    if unchecked:
        lines.append(f"note: {UNCHECKED.format(n=n, count=unchecked)}")
    return "\n".join(
        [
            f"decontamination index {out}: {manifest['ngrams']:,} distinct {n}-grams "
            f"(sha256 {manifest['sha256'][:12]}…, {manifest['seconds']:.1f} s)",
            *lines,
        ]
    )


def load_tasks(names: list[str], include_path: list[str], out: Path) -> dict[str, Any]:
    """{task name: lm-eval Task} of every leaf task of `names` (groups and tags expanded): the
    user's YAML tasks from `include_path`, the others from lm-eval's registry, checked first (offline
    without a cached dataset: one line). `out`: the index's directory, never read as a task's data."""
    if not names:
        raise EvalError("no tasks given; e.g. --tasks hellaswag,arc_easy")
    tm = checked_task_manager(names, include_path, LOCAL_HINT)
    written = Written(
        "the index's --out", out, "its files (manifest.json, …) for rows", "give --out outside it"
    )
    tasks: dict[str, Any] = {}
    try:
        for name in names:
            # a task read from local files alone, through datasets' cache of their content, as the eval
            # reads it: its own cache keys a file on path and mtime, and a file replaced under its old
            # mtime (cp -p, rsync -a) was indexed from the old rows (review RV50b F1)
            data = task_data_files(tm, name)
            check_data_folders(name, data, written)  # the eval's rules of where its documents are read
            with local_data_cache(files_sha256(data.files) if data.alone and data.files else None):
                tasks.update(tm.load([name])["tasks"])
        return tasks
    except EvalError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else ""
        raise EvalError(
            f"lm-eval could not load {', '.join(names)} ({type(e).__name__}: {first}); the library's log "
            f"is {LOG} in the index directory"
        ) from None


def eval_split(task: Any) -> str:
    """The split lm-eval evaluates (Task.eval_docs: test, else validation)."""
    return task.config.test_split if task.has_test_docs() else task.config.validation_split


def doc_texts(task: Any, doc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The texts of one evaluation document that training data must not contain (what lm-eval puts in
    the prompt and the continuations it scores), and the same without the words of the task's own
    templates, which decide whether the document is checked at all (`_template_values`)."""
    from lm_eval import utils

    cfg = task.config
    if task.should_decontaminate():
        query = cfg.doc_to_decontamination_query
        if isinstance(query, str) and query not in task.features:
            # lm-eval 0.4.13's doc_to_decontamination_query passes a rendered template through
            # ast.literal_eval, which raises on prose ("Question: …"); render it as lm-eval renders
            # doc_to_text.
            texts = _texts(utils.apply_template(query, doc))
            return texts, _template_values(query, doc, texts)
        texts = _texts(task.doc_to_decontamination_query(doc))
        return texts, texts
    prompt = _texts(task.doc_to_text(doc))
    texts, plain = list(prompt), list(prompt)
    if isinstance(cfg.doc_to_text, str) and cfg.doc_to_text not in task.features:
        plain = _template_values(cfg.doc_to_text, doc, prompt)
    rest = _texts(task.doc_to_choice(doc)) if cfg.doc_to_choice is not None else []
    if cfg.doc_to_choice is None or task.multiple_input:
        # the scored continuation: with multiple inputs (xwinograd) the choices are the contexts and
        # the target is the text after each (trial RV62h 2: it was left out)
        target = _texts(task.doc_to_target(doc))
        own = target
        if isinstance(cfg.doc_to_target, str) and cfg.doc_to_target not in task.features:
            own = _template_values(cfg.doc_to_target, doc, target)  # "The answer is: {{a}}" (RV68d 4)
        return texts + rest + target, plain + rest + own
    return texts + rest, plain + rest


def _template_values(template: str, doc: dict[str, Any], rendered: list[str]) -> list[str]:
    """What the `{{ … }}` of a template (a prompt, a query, a target) give for `doc`: the document's own
    text, without the template's words. arc's "Question: {{question}}\nAnswer:" made an 11-word question 13
    words: counted as checked at n = 13, though only a page quoting it inside that frame could match,
    and the eval called it decontaminated while plain copies trained (trial RV68c F1). A template with
    statements (`{% … %}`) is taken whole, as `rendered`: its words are not told from the document's."""
    from lm_eval import utils

    if not rendered or "{%" in template or "{#" in template:
        return rendered
    # values apart where words of the template's stand between them; joined where only spaces or
    # punctuation do: "{{body}} {{question}}" is one text a page may quote whole (review RV68d 3)
    values: list[str] = []
    joined = None  # the text being built of values with no word of the template's between them
    for i, part in enumerate(_EXPRESSION.split(template)):
        if i % 2 == 0:  # the template's own text
            if joined is not None and any(c.isalnum() for c in part):
                values.append(joined)
                joined = None
            gap = part
            continue
        value = utils.apply_template(part, doc)
        joined = value if joined is None else joined + gap + value
    values += [joined] if joined is not None else []
    return [v for v in values if v.strip()]


def _texts(value: Any) -> list[str]:
    """The text in one of a task's values: a string, or the strings of a list (a query naming a list
    field, several targets; trial RV62h 3: a list was dropped whole). An int indexes the choices."""
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, (list, tuple)) else []


def task_ngrams(task: Any, n: int, batch: int = 2000) -> tuple[np.ndarray, np.ndarray, int, list[int], int]:
    """(n-gram hashes, document index of each, documents, the documents that give no text at all, the
    documents checked: whose own text, without a template's words, has an n-gram) of a task's
    evaluation split. A task none of whose documents gives text is refused: its keys name no text
    field (a list field was dropped whole, with advice to lower --ngram: trial RV62h 3)."""
    hashes, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint32)]
    texts: list[str] = []
    owners: list[int] = []
    # the documents' own texts (no template's words), which decide "checked": their n-grams lie in
    # `texts` already, so only counted, and the index's files are what they were
    own_texts: list[str] = []
    own_owners: list[int] = []
    checked: set[int] = set()
    textless: list[int] = []
    count = 0

    def flush() -> None:
        h, which = many_ngram_hashes(texts, n)
        hashes.append(h)
        docs.append(np.asarray(owners, np.uint32)[which])
        _, which = many_ngram_hashes(own_texts, n)
        checked.update(np.asarray(own_owners, np.int64)[which].tolist())
        for done in (texts, owners, own_texts, own_owners):
            done.clear()

    for i, doc in enumerate(task.eval_docs):
        count += 1
        found, own = doc_texts(task, doc)
        if not found:  # not a short text: a field that holds none (a null in one row, a number)
            textless.append(i)
        texts += found
        owners += [i] * len(found)
        own_texts += own
        own_owners += [i] * len(own)
        if len(texts) >= batch:
            flush()
    flush()
    if count and len(textless) == count:
        keys = (
            "doc_to_decontamination_query"
            if task.should_decontaminate()
            else "doc_to_text, doc_to_choice or doc_to_target"
        )
        raise EvalError(
            f"task {task.config.task}: no evaluation document gives text to index (its {keys} names no "
            "string or list of strings); point it at the documents' text"
        )
    return np.concatenate(hashes), np.concatenate(docs), count, textless, len(checked)


_EXPRESSION = re.compile(r"({{.*?}})", re.S)  # a jinja template's `{{ … }}` (statements taken apart)


@contextmanager
def _templates_compiled_once() -> Iterator[None]:
    """lm-eval compiles a task's jinja template anew for every document (lm_eval.utils.apply_template:
    about 3 ms, three quarters of an index's time); while indexing, each template is compiled once,
    in lm-eval's own environment, so the texts are the same."""
    from lm_eval import utils

    original = utils.apply_template
    compiled = functools.lru_cache(maxsize=1024)(utils.env.from_string)
    utils.apply_template = lambda template, doc: compiled(template).render(**doc)
    try:
        yield
    finally:
        utils.apply_template = original


def build_index(
    names: list[str],
    n: int,
    out: str | Path,
    include_path: list[str] | tuple[str, ...] = (),
    verbose: bool = False,
) -> dict[str, Any]:
    """Read the tasks through lm-eval and write their n-gram index into `out`; returns its manifest."""
    import lm_eval

    if n < 1:
        raise EvalError(f"--ngram {n}: an n-gram has at least one word (13 is the usual choice)")
    out = Path(out)
    t0 = time.perf_counter()
    entries, all_hashes, all_docs = [], [], []
    with eval_output(out / LOG, verbose) as terminal, _templates_compiled_once():
        tasks = load_tasks(names, list(include_path), out)
        check_task_names([{"name": name, "split": eval_split(task)} for name, task in tasks.items()])
        for name, task in sorted(tasks.items()):
            try:
                hashes, docs, count, textless, checked = task_ngrams(task, n)
            except EvalError:
                raise
            except Exception as e:
                raise EvalError(
                    f"task {name}: could not read its evaluation documents ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}); details in {out / LOG}"
                ) from None
            entries.append(
                {
                    "name": name,
                    "split": eval_split(task),
                    "version": task.VERSION,
                    "documents": count,
                    "ngrams": int(len(np.unique(hashes))),
                    "documents_without_ngrams": count - checked,
                    "documents_sha256": task_documents_sha256(task),
                }
            )
            all_hashes.append(hashes)
            all_docs.append(docs)
            print(
                f"[decontam-index] {name}: {count:,} documents, {entries[-1]['ngrams']:,} {n}-grams"
                + (
                    f"; {len(textless):,} give no text at all (counted without n-grams; the first: "
                    f"document {textless[0]})"
                    if textless
                    else ""
                ),
                file=terminal,
            )
    # no timing in the manifest: an index built again from the same tasks is the same bytes, which a
    # build's copy is checked against (a rerun after a damaged copy failed validation: review R16f F4)
    extra = {"requested": names, "lm_eval": lm_eval.__version__}
    if not any(len(h) for h in all_hashes):  # checked before anything is written
        raise EvalError(
            f"tasks {', '.join(names)} have no {n}-gram at all (every text is shorter than {n} words); "
            "an index of nothing would check nothing: use a smaller --ngram"
        )
    return {**write_index(out, n, entries, all_hashes, all_docs, extra), "seconds": time.perf_counter() - t0}


@dataclass(frozen=True)
class StagedIndex:
    folder: Path  # where the index is before install_index copies it into the output
    manifest: dict[str, Any]
    temporary: bool  # made by this build (removed once installed)

    def identity(self) -> dict[str, Any]:
        return index_identity(self.manifest)


def index_identity(m: dict[str, Any]) -> dict[str, Any]:
    """What of an index (manifest `m`) decides the dataset: its hashes (sha256) and n; the task names to
    name a change."""
    return {"index_sha256": m["sha256"], "ngram": m["ngram"], "tasks": [t["name"] for t in m["tasks"]]}


def stage_index(cfg: DecontaminateConfig, log=print, kept: Path | None = None) -> StagedIndex | None:
    """The index `cfg` asks for: built now from `tasks` (build_index) or the
    prebuilt `index`, checked against `tasks` and `ngram`. None without [decontaminate]. `kept`: the
    output's copy of the index it was built with (OUTPUT/decontam/), named where `index` is not there
    (a temporary folder deleted since): a finished dataset was refused, "build one", though the copy
    verifies (trial RV60b 7). Named, never read in its place: a mistyped path then built with the old
    index, exit 0 (review RV60f 1)."""
    if not enabled(cfg):
        return None
    if cfg.ngram < 1:
        raise BuildError(f"decontaminate.ngram = {cfg.ngram}: an n-gram has at least one word (13 is usual)")
    if cfg.tasks and not cfg.index:  # in the recipe's key: the YAML read to build the index (one given
        # reads none: built where there is network and copied, its folder may not be here)
        check_include_path(cfg.include_path, "decontaminate.include_path")
    if cfg.index:
        folder = Path(cfg.index).expanduser().resolve()
        if not folder.exists() and kept is not None and (kept / MANIFEST_JSON).is_file():
            # the way on where the copy is damaged too: the same tasks give the same bytes again, which
            # no message said (trial RV68c F3)
            was = _earlier_index(kept) or {}
            names = was.get("requested") or [
                t.get("name") for t in was.get("tasks") or [] if isinstance(t, dict)
            ]
            again = (
                f"--tasks {','.join(map(str, names))} --ngram {was.get('ngram')}" if names else "--tasks …"
            )
            raise BuildError(
                f"decontaminate.index {folder} does not exist; the output keeps a copy of the index it was "
                f"built with, {kept}: to go on with that one, set decontaminate.index = {str(kept)!r}; or "
                f"write it again (`gristmill data decontam-index {again} --out {folder}`, with the same "
                "--include-path: the same task documents give the same index); else build the index you mean"
            )
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

    _remove_dead_staging()
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{STAGING}{host()}-{os.getpid()}-"))
    except OSError as e:
        raise _no_room(tempfile.gettempdir(), e) from None
    include = [str(Path(p).expanduser().resolve()) for p in cfg.include_path]
    argv = ["data", "decontam-index", "--tasks", ",".join(cfg.tasks), "--ngram", str(cfg.ngram)]
    argv += [a for p in include for a in ("--include-path", p)]
    log(f"[build] decontamination index: gristmill {' '.join(argv)} --out {tmp}")  # the same, by hand
    try:
        manifest = build_index(list(cfg.tasks), cfg.ngram, tmp, include)
        log(summary(manifest, tmp))
        return StagedIndex(tmp, manifest, temporary=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):  # the build named its output, which was not written (trial RV64b M1)
            raise _no_room(tmp, e) from None
        raise


def _remove_dead_staging() -> None:
    """The temporary indexes of builds killed before they removed theirs (kill -9: a whole index each,
    ~48 MB for five hub tasks, left for good: trial RV64b M2): those of this host whose process is gone.
    A live process's (another user's too), another host's ($TMPDIR on a shared filesystem) and any not
    named so are kept."""
    mine = f"{STAGING}{host()}-"
    for path in Path(tempfile.gettempdir()).glob(f"{glob.escape(mine)}*"):
        pid = path.name.removeprefix(mine).split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _no_room(where: str | Path, e: OSError) -> BuildError:
    return BuildError(
        f"cannot write the decontamination index into {where} (the temporary folder, $TMPDIR): "
        f"{e.strerror or e}; free space there, or set TMPDIR to a folder with room"
    )


@contextmanager
def discard_staged(staged: StagedIndex | None) -> Iterator[None]:
    """Remove a temporary staged index when the build stops before installing it (refused, locked)."""
    try:
        yield
    finally:
        if staged is not None and staged.temporary:
            shutil.rmtree(staged.folder, ignore_errors=True)


def _recorded_manifest(out: Path, dst: Path) -> bool:
    """Whether OUTPUT/decontam/manifest.json is the one OUTPUT/dataset.json records."""
    try:
        recorded = (read_dataset_info(out).get("files") or {}).get(f"{INDEX_DIR}/{MANIFEST_JSON}") or {}
        return file_sha256(dst / MANIFEST_JSON) == recorded.get("sha256")
    except (GristmillError, OSError):
        return False


def install_index(staged: StagedIndex | None, out: Path, log=print) -> None:
    """Copy the staged index to OUTPUT/decontam/, kept only when its files are byte for byte the
    staged index (a resume); a damaged copy (altered or cut off since) is said and replaced, so no
    task ever reads it. Called inside the build lock."""
    if staged is None:
        return
    dst = out / INDEX_DIR
    want = staged.manifest["sha256"]
    names_it = same = False
    try:
        # the copy's n and tasks too: the filter reads its manifest, and one of another n kept beside the
        # same n-gram files matched nothing (trial RV64b S2)
        names_it = index_identity(read_manifest(dst)) == staged.identity()
        same = names_it and decontam_sha256(dst) == want
    except GristmillError:  # a damaged manifest or index file: replaced below
        pass
    if not same:
        if dst.exists():
            log(f"[build] {dst}/ is damaged or another index (not sha256 {want[:12]}…): copying it again")
        tmp = out / f"{INDEX_DIR}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in (HASHES_NPY, REFS_NPY):
            shutil.copyfile(staged.folder / name, tmp / name)
        # The manifest last: it makes an index. The copy's own when it is the one dataset.json records
        # (a manifest written before it held no build timing differs from one built now by that alone:
        # the repair validate advises failed validation: review R16h F2)
        recorded = names_it and _recorded_manifest(out, dst)
        kept = dst / MANIFEST_JSON if recorded else staged.folder / MANIFEST_JSON
        shutil.copyfile(kept, tmp / MANIFEST_JSON)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    check_copy(dst, want)  # the staged folder itself may have changed since it was checked
