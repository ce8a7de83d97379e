"""What a build records about itself in its output directory, and what a rerun checks against it.

A rerun of `gristmill data build` resumes: datatrove skips the tasks it marked complete, and their
shards are kept. That is sound only while two things hold, and each has its record:
- the dataset's bytes are still decided by what the finished tasks were built with. build.json
  holds the config hash and the identity it hashes (`pipelines.config.content_identity`), written
  before the first task runs; `check_output` compares a rerun's with it and names what changed,
  letting through only a re-downloaded input whose task had not finished;
- the shards of finished tasks are still the bytes they wrote. Each task records its shards' sizes
  and hashes (`tokenize_shard.SHARD_RECORDS`) before it is marked complete; at finalize
  `recorded_shards` hands them to the writer, and `changed_shards_message` turns a mismatch into
  the tasks to redo.

Kept apart from build.py so that the driver reads as its steps, and the refusals, whose wording is
what a user acts on, sit next to the comparisons that produce them. BuildError and read_json are
defined here, at the bottom of the build's modules, so that build.py and slurm_executor.py share
them without importing each other (pipelines.build re-exports BuildError); files are replaced with
the contract's write_atomic.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pipelines.config import DataConfig
from pipelines.dataset_lock import LOCK
from pipelines.dedup import decided_over
from pipelines.tokenize_shard import SHARD_RECORDS
from tokenization.tokenizer_io import TokenizerError, names_local_file, tokenizer_file, trained_record
from training.contract.atomic_write import write_atomic
from training.contract.config_loader import load_config, shown_value
from training.contract.dataset_format import (
    BUILD_JSON,
    CONFIG_TOML,
    DATASET_JSON,
    DECONTAM_DIR,
    DECONTAM_MANIFEST,
    LOGS_DIR,
    MANIFEST_DIR,
    SHARDS_DIR,
    TOKENIZER_JSON,
    file_sha256,
)
from training.contract.dataset_format import finished_tasks as completed_ranks
from training.contract.errors import GristmillError
from training.contract.object_store import ObjectURL, is_url, refuse_url, user_cache_dir
from training.contract.run_layout import run_record


class BuildError(GristmillError):
    """A build that cannot start or did not finish; the message says what to do."""


def finished_tasks(out: Path) -> set[int]:
    """The tasks datatrove marked complete in `out`: a rerun keeps their outputs."""
    return completed_ranks(out / LOGS_DIR / "completions")


def read_json(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object the build wrote earlier; damage is a BuildError naming the file and `fix`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"{path} is unreadable ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path} is not a JSON object; {fix}")
    return data


def output_dir(cfg: DataConfig) -> Path:
    """Where the tasks write: `output`, or for an s3:// output the work directory (each task's output
    until it is uploaded, the driver's files and datatrove's logs)."""
    if not is_url(cfg.output):
        return Path(cfg.output).expanduser().resolve()
    if cfg.build.workdir:
        refuse_url("build.workdir", cfg.build.workdir)
        return Path(cfg.build.workdir).expanduser().resolve()
    url = ObjectURL.parse(cfg.output)
    return user_cache_dir() / "builds" / url.bucket / (url.prefix or "_bucket_root")


def read_build_json(out: Path) -> dict[str, Any]:
    return read_json(
        out / BUILD_JSON, f"cannot tell which config built {out}; delete {out} to rebuild from scratch"
    )


def write_build_json(
    out: Path,
    sha: str,
    identity: dict[str, Any],
    source: dict[str, str] | None = None,
    read: dict[str, Any] | None = None,
    tokenizer: dict[str, str] | None = None,
) -> dict:
    """build.json: the config hash and identity this output directory is built with; for a hub
    source also `source` = {"requested": the folder the recipe names, "pinned": that folder at the
    commit the build started from}, which a resume reads again (see pipelines.build.pinned_folder);
    for local files `read` (SourceFiles.as_read: their folder and modification times); for a hub
    tokenizer `tokenizer` = {"requested": tokenizer.path, "pinned": "org/name@<commit>"}, the same
    for the tokenizer (pipelines.build.pinned_tokenizer)."""
    record: dict[str, Any] = {"config_sha256": sha, "identity": identity}
    if source:
        record["source"] = source
    if tokenizer:
        record["tokenizer"] = tokenizer
    if read:
        record["read"] = read
    write_atomic(out / BUILD_JSON, json.dumps(record, indent=2, sort_keys=True))
    return record


def check_output(
    out: Path,
    sha: str,
    identity: dict[str, Any],
    log=print,
    finished: set[int] | None = None,
    read: dict[str, Any] | None = None,
    url: str | None = None,
    tokenizer: str | None = None,
) -> dict[str, Any] | None:
    """Refuse a changed config, a changed input of a finished task or a foreign directory; return
    build.json if resuming.

    `sha` and `identity` are this run's (identity_sha256 of content_identity), `read` its local
    files' folder and times (SourceFiles.as_read); `finished`: the tasks whose output is kept
    (default: those datatrove marked complete in `out`; an s3:// build's are those whose record is in
    the bucket); `url`: the bucket output whose work directory `out` is (build.json comes back from
    the bucket into a new one: the refusal's fix is the bucket's); `tokenizer`: tokenizer.path, which
    may lie in `out` (trained there)."""
    if (out / BUILD_JSON).is_file():
        old = read_build_json(out)
        was = dict(old.get("identity", {}))
        old_files, new_files = was.get("input_files") or [], identity["input_files"]
        changed, rewritten, moved = _changed_inputs(old_files, new_files, old.get("read"), read)
        if old.get("config_sha256") == sha and not changed:
            return old
        finished = finished_tasks(out) if finished is None else finished
        spelled = _respelled_path(was.get("source", {}).get("path"), identity["source"].get("path"))
        if spelled:  # `dir` and `dir/`, or relative and absolute: the same folder, not a new config
            was["source"] = {**was["source"], "path": identity["source"]["path"]}
        changes = _diff(
            {k: v for k, v in was.items() if k != "input_files"}, {**identity, "input_files": None}
        )
        tasks = {i % identity["tasks"] for i in changed}
        dedup = identity.get("dedup")
        # the changed files' tasks whose input [dedup] decided over (each named apart: a refusal
        # said so of a file whose first-pass task had not run)
        stale = decided_over(out, dedup["kind"], tasks) if dedup is not None else set()
        # A re-downloaded input whose task never finished is fine: that task reads the new file
        # (a task reads files[rank::tasks]; an added or removed file would move later ones), unless
        # [dedup] already decided its duplicates on the old contents.
        if (
            not changes
            and [f["file"] for f in old_files] == [f["file"] for f in new_files]
            and not tasks & finished
            and not stale
        ):
            if spelled:
                log(f"source.path {spelled}: the same folder, written otherwise; resuming")
            if not changed:  # the same build: its record stays (dataset.json holds its sha256)
                return old
            sized = lambda i: f"{old_files[i]['bytes']:,} → {new_files[i]['bytes']:,} bytes"
            what = lambda i: "rewritten at the same size" if i in rewritten else sized(i)
            replaced = [moved] if moved else [f"{new_files[i]['file']} ({what(i)})" for i in sorted(changed)]
            log(f"input changed since the last run: {', '.join(replaced)}; its task had not finished")
            return write_build_json(out, sha, identity, old.get("source"), read, old.get("tokenizer"))
        changes += _input_changes(
            old_files, new_files, identity["tasks"], finished, stale, rewritten, old.get("read"), moved, read
        )
        over = (
            f"delete the objects under {url}/ (e.g. `aws s3 rm --recursive {url}/`) and `rm -rf {out}`"
            if url
            else f"`rm -rf {out}`"
        )
        kind = "prefix" if url else "directory"
        # the output keeps a copy of the tokenizer it was built with: going on with it keeps the work
        # done (the refusal offered only a new output or deleting this one: trial RV64b L1)
        kept, before = out / TOKENIZER_JSON, (was.get("tokenizer") or {}).get("sha256")
        keep = (
            f"To go on with the tokenizer it was built with, set tokenizer.path = {str(kept)!r}. "
            if before != identity["tokenizer"]["sha256"] and kept.is_file() and file_sha256(kept) == before
            else ""
        )
        keep += _kept_index_advice(out, was.get("decontaminate"), identity.get("decontaminate"))
        raise BuildError(
            f"{url or out} was built with a different config or input, refusing to mix the two (changed: "
            f"{'; '.join(changes) or 'unknown'}). {keep}Build into a new `output` {kind}, or start over: "
            f"{over}, then the same command."
        )
    leftovers = [n for n in (SHARDS_DIR, MANIFEST_DIR, DATASET_JSON) if (out / n).exists()]
    if leftovers:
        raise BuildError(
            f"{out} already holds {', '.join(leftovers)} but no {BUILD_JSON}: not a resumable gristmill "
            "build; pick an empty `output` directory"
        )
    _refuse_foreign(out, identity, tokenizer)
    return None


def _refuse_foreign(out: Path, identity: dict[str, Any], tokenizer: str | None) -> None:
    """An output without build.json holding what no build put there is refused: another artifact's
    directory, whose config.toml the build replaces (a training run's was, and the run became a
    dataset, exit 0: review R22b F3); files of no build, hidden ones too, beside which it writes and
    which the refusal of a later change advises deleting (`rm -rf OUTPUT`: R22e 1, R22g 6); a
    tokenizer.json of another tokenizer where no killed build left it, which it replaces (R22e 2,
    R22g 7). A build's own, before build.json: its recipe, the tokenizer of `tokenizer`
    (tokenizer.path) or of the recipe a killed build left, trained into it with the record beside it
    (R22g 8), a decontamination index, logs, its lock and the temporary files of its writes; and a
    volume's lost+found (R22c R1-R3)."""
    if not out.is_dir():
        return
    other, left = run_record(out), None
    if other is None and (out / CONFIG_TOML).is_file():
        try:
            left = load_config(DataConfig, out / CONFIG_TOML)
        except GristmillError as e:
            other = f"{CONFIG_TOML}, which is no data build's recipe ({e})"
    if other is not None:
        raise BuildError(
            f"{out} holds {other} but no {BUILD_JSON}: another artifact's directory (a training run's, a "
            "mixture search's), whose files a build would replace; pick an empty `output` directory"
        )
    own = {CONFIG_TOML, LOGS_DIR, DECONTAM_DIR, f"{DECONTAM_DIR}.tmp", "lost+found", ".DS_Store", LOCK}
    own |= {TOKENIZER_JSON, trained_record(Path(TOKENIZER_JSON)).name}
    for path in (tokenizer, left and left.tokenizer.path):
        tok = _local_tokenizer(path)
        if tok is None or not tok.is_relative_to(out.resolve()):
            continue
        parts = tok.relative_to(out.resolve()).parts
        if len(parts) == 1:
            own |= {tok.name, trained_record(tok).name}
            continue
        # a folder holding the tokenizer alone (and its record), at any depth: the build deletes every
        # *.tmp below the output, and a user's beside the tokenizer went (reviews R22h S1, R22i S3)
        top = out.resolve() / parts[0]
        mine = {tok.relative_to(top), trained_record(tok).relative_to(top)}
        if all(p.relative_to(top) in mine or p.is_dir() or p.name == ".DS_Store" for p in top.rglob("*")):
            own.add(parts[0])
    # write_atomic's and a download's temporary files (.NAME[.HOST].PID.tmp) a kill left: the build
    # deletes them; a hidden name of the user's ending in .tmp is no such file (review R22h S2)
    temporary = re.compile(r"\..+\.\d+\.tmp")
    strangers = sorted(
        n for n in os.listdir(out) if n not in own and not (temporary.fullmatch(n) and (out / n).is_file())
    )
    if strangers:
        shown = ", ".join(strangers[:3]) + (f" (+{len(strangers) - 3} more)" if len(strangers) > 3 else "")
        raise BuildError(
            f"{out} holds {shown} but no {BUILD_JSON}: files of no build, beside which a build would write "
            "(and which starting it over would delete); pick an empty `output` directory"
        )
    # A tokenizer.json that is neither this build's nor the one a killed build's recipe names (it
    # copies it there before it writes the recipe): a user's, which the build replaces (R22e 2, R22h S3)
    tok = out / TOKENIZER_JSON
    if tok.is_file() and (found := file_sha256(tok)) != identity["tokenizer"]["sha256"]:
        earlier = None if left is None else _local_tokenizer(left.tokenizer.path)
        if earlier is None or file_sha256(earlier) != found:
            raise BuildError(
                f"{tok} is another tokenizer than the one this build reads (tokenizer.path), and the build "
                "writes its own there: set tokenizer.path to it, or move it out of the output"
            )


def _kept_index_advice(out: Path, was: Any, now: Any) -> str:
    """How to go on with the decontamination index the output was built with, where it changed and
    OUTPUT/decontam/ still holds that one (the refusal offered only a new output or deleting this one:
    trial RV66b nit); else ""."""
    if not isinstance(was, dict) or was == now or not was.get("index_sha256"):
        return ""
    try:  # its manifest's word (the build checks the index's files when it stages the one named)
        kept = json.loads((out / DECONTAM_DIR / DECONTAM_MANIFEST).read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return ""
    if kept != was["index_sha256"]:
        return ""
    same_n = was.get("ngram") == (now or {}).get("ngram")
    ngram = "" if same_n else f" and decontaminate.ngram = {was['ngram']}"
    return (
        f"To go on with the decontamination index it was built with, set decontaminate.index = "
        f"{str(out / DECONTAM_DIR)!r}{ngram} (tasks as it was built for, or empty). "
    )


def _local_tokenizer(spec: str | None) -> Path | None:
    """The tokenizer.json tokenizer.path `spec` names here (tokenizer_file: the file, or a folder's),
    resolved; None for a hub id or a file that is not there (nothing fetched)."""
    if not spec or not names_local_file(spec):
        return None
    try:
        return tokenizer_file(spec).resolve()
    except TokenizerError:
        return None


def _respelled_path(old: Any, new: Any) -> str:
    """'OLD → NEW' when two spellings of source.path name one folder (a trailing slash, a relative and
    an absolute path, `~`; a URL's trailing slash), else ""."""
    if not (isinstance(old, str) and isinstance(new, str)) or old == new:
        return ""
    if "://" in old or "://" in new:
        same = old.rstrip("/") == new.rstrip("/")
    else:
        same = Path(old).expanduser().resolve() == Path(new).expanduser().resolve()
    return f"{old!r} → {new!r}" if same else ""


def config_changes(was: dict[str, Any], identity: dict[str, Any], respelled_ok: bool = False) -> list[str]:
    """`key: old → new` for each setting of a build's identity (build.json's) that differs, the input
    files aside (their own comparison names them). `respelled_ok`: source.path spelled otherwise for
    the same folder (_respelled_path) is no change: a resume takes it as the same build and saves the
    recipe so spelled, which its finalize then refused (review RV62e 2). Elsewhere it is one, named:
    the config hash covers the spelling (a bucket's complete dataset is this config's by its hash)."""
    strip = lambda d: {k: v for k, v in d.items() if k != "input_files"}  # noqa: E731
    old, new = (d.get("source") if isinstance(d.get("source"), dict) else {} for d in (was, identity))
    if respelled_ok and _respelled_path(old.get("path"), new.get("path")):
        was = {**was, "source": {**old, "path": new.get("path")}}
    return _diff(strip(was), strip(identity))


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old → new` for each dotted key whose value differs, each side as a resume's note shows it
    (shown_value: a setting added, `absent → 5000`, was `None → 5000`)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {shown_value(old, k)} → {shown_value(new, k)}")
    return out


def _changed_inputs(
    old: list[dict], new: list[dict], was_read: dict[str, Any] | None, read: dict[str, Any] | None
) -> tuple[set[int], set[int], str]:
    """(the places in the input list whose file differs from the one the build read, those of them
    rewritten at the same size, and "" or what moved). A file differs by its size, or for local files
    recorded in build.json's "read" by its modification time; when this run's source.path is another
    folder than the one the build read (a relative path from another directory), every file does."""
    changed = {i for i, (a, b) in enumerate(zip(old, new)) if a["bytes"] != b["bytes"]}
    # a build.json of before the record, a hub source, or files added or removed: sizes alone
    if not (isinstance(was_read, dict) and read) or [f["file"] for f in old] != [f["file"] for f in new]:
        return changed, set(), ""
    # Another folder: by where source.path leads and by how it is spelled (a relative path from another
    # directory: both differ; a link re-pointed at a copy on another disk, or two spellings of one
    # folder, is not: review R15d F6)
    path = was_read.get("path")
    if was_read.get("folder") != read["folder"] and (not path or path != read["path"]):
        moved = f"source.path reads {read['folder']} here, the build read {was_read.get('folder')}"
        return set(range(len(new))), set(), moved
    times = zip(was_read.get("modified_ns") or [], read["modified_ns"])
    rewritten = {i for i, (a, b) in enumerate(times) if a != b and i not in changed}
    return changed | rewritten, rewritten, ""


def _input_changes(
    old: list[dict],
    new: list[dict],
    tasks: int,
    finished: set[int],
    stale: AbstractSet[int] = frozenset(),
    rewritten: AbstractSet[int] = frozenset(),
    was_read: dict[str, Any] | None = None,
    moved: str = "",
    read: dict[str, Any] | None = None,
) -> list[str]:
    """Each input file that was added, removed or changed size, by name, and those `rewritten` at the
    same size (by place: _changed_inputs; `was_read`: build.json's "read", their recorded times;
    `read`: this run's, where they are now), or
    the folder `moved` (once, not per file) (`stale`: the tasks whose input [dedup] decided its
    duplicates over, the old contents)."""
    if moved:
        return [moved + (" (finished tasks' shards hold that folder's files)" if finished else "")]

    def done(i: int) -> str:
        if i % tasks in finished:
            return " (its task finished: its shards hold the old file)"
        return " ([dedup] decided its duplicates over the old file)" if i % tasks in stale else ""

    was = {f["file"]: (i, f["bytes"]) for i, f in enumerate(old)}
    now = {f["file"]: f["bytes"] for f in new}
    out = [f"input file {n} was removed" for n in was if n not in now]
    out += [f"input file {n} was added" for n in now if n not in was]
    for n, (i, size) in was.items():
        if n in now and now[n] != size:
            out.append(f"input file {n}: {size:,} → {now[n]:,} bytes{done(i)}")
    for i in sorted(rewritten):
        n, why = new[i]["file"], done(i)
        if why and was_read and read:  # a copy or a download of the same bytes has a new time too
            t = was_read["modified_ns"][i]
            why += (  # the file read now (a link re-pointed at a copy: not the folder read then)
                f"; if its bytes are the ones the build read, `touch -d @{t // 10**9}.{t % 10**9:09d} "
                f"{Path(read['folder']) / n}` gives it back the time recorded (run by its owner)"
            )
        out.append(f"input file {n}: rewritten at the same size{why}")
    return out


def changed_since_complete(
    old: dict[str, Any], identity: dict[str, Any], read: dict[str, Any] | None
) -> list[str]:
    """What changed in the input of the complete build whose build.json is `old` (every task finished),
    by this run's `identity` and `read` (SourceFiles.as_read); [] when nothing did."""
    files = old.get("identity", {}).get("input_files") or []
    changed, rewritten, moved = _changed_inputs(files, identity["input_files"], old.get("read"), read)
    if not changed:
        return []
    everything = set(range(identity["tasks"]))
    return _input_changes(
        files,
        identity["input_files"],
        identity["tasks"],
        everything,
        set(),
        rewritten,
        old.get("read"),
        moved,
        read,
    )


def recorded_shards(out: Path) -> dict[str, dict[str, Any]]:
    """shard -> {bytes, sha256, task} as each task recorded when it finished (tokenize_shard)."""
    shards: dict[str, dict[str, Any]] = {}
    for path in sorted((out / SHARD_RECORDS).glob("*.json")):
        task = int(path.stem)
        for name, rec in read_json(
            path, f"delete {out / LOGS_DIR / 'completions' / path.stem} and rerun"
        ).items():
            shards[name] = {**rec, "task": task}
    return shards


def completion_markers(out: Path, tasks) -> str:
    """The completion markers of `tasks`, space-separated: removing them makes a rerun redo those tasks."""
    return " ".join(str(out / LOGS_DIR / "completions" / f"{t:05d}") for t in sorted(tasks))


def changed_shards_message(out: Path, changed: list[tuple[str, dict, dict | None]]) -> str:
    """The BuildError for shards that differ from their task's record: which, and which tasks to redo."""
    what = []
    for name, want, now in changed:
        state = "is gone" if now is None else f"is {now['bytes']:,} bytes, sha256 {now['sha256'][:12]}…"
        what.append(
            f"{SHARDS_DIR}/{name} {state}; task {want['task']} wrote {want['bytes']:,} bytes, "
            f"sha256 {want['sha256'][:12]}…"
        )
    markers = completion_markers(out, {want["task"] for _, want, _ in changed})
    return (
        f"shards changed after their task finished, refusing to describe them in {DATASET_JSON}: "
        f"{'; '.join(what)}. Redo those tasks (their shards are rewritten byte-identical): "
        f"`rm {markers}` and rerun the same command"
    )
