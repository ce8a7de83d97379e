"""Where `[model] init_from` has its files: a local directory, or a Hugging Face hub repository
pinned to the commit its revision resolved to; on a resume, the base the checkpoint recorded.

    init_from = "/models/Llama-3.2-1B"            a directory (config.json + safetensors)
    init_from = "meta-llama/Llama-3.2-1B"         a hub id: its main branch, pinned when the run starts
    init_from = "meta-llama/Llama-3.2-1B@REV"     a branch, tag or commit

Anything that is not an existing directory (nor, on a resume, the directory the checkpoint
recorded) and reads as `org/name[@revision]` is a hub id. It is
fetched with huggingface_hub's `snapshot_download` into the usual cache (HF_HOME; HF_TOKEN for a
gated model), only the files a base needs (`HUB_FILES`), and named by the commit it resolved to:
`BaseSource.identity` = "org/name@<40-hex commit>" is what the run records (ModelConfig.init_from in
COMPLETE, model.init_from in RUN/config.toml), so every later read of the run (export, eval, rank
k of the job) reads that commit, whatever the branch says by then.

A resume continues from the checkpoint, which holds the weights: the base is not needed again.
With the model record of the checkpoint (`recorded`), a directory that is gone, or a hub id of the
recorded repository without a revision (or with the recorded commit), gives the recorded base (its
shape and identity) and a note; the hub is not asked. A directory that is present is read as at
the start, so a resume with another base (another init_from_sha256) is still refused by the
checkpointer; `org/name@REV` with another revision is resolved and must be the recorded commit.

huggingface_hub is imported only for a hub id (training/ runs without it otherwise).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.contract.config_loader import ConfigError
from training.contract.errors import GristmillError
from training.contract.hub_cache import hub_copy_damage

__all__ = [
    "CONFIG_JSON",
    "HUB_FILES",
    "INDEX_JSON",
    "CHAT_TEMPLATE",
    "KEPT_FILES",
    "TEMPLATES_DIR",
    "OTHER_TOKENIZER_FORMS",
    "TOKENIZER_FILES",
    "SINGLE_FILE",
    "BaseModelError",
    "BaseSource",
    "chat_templates",
    "check_templates",
    "kept_name",
    "listed_templates",
    "named_templates",
    "fetch_hub_base",
    "hub_id",
    "is_hub_commit",
    "unrecorded_step0",
    "locate_base",
    "weights_files",
]

CONFIG_JSON = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_JSON = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json")
CHAT_TEMPLATE = "chat_template.jinja"
"""Where transformers (4.47 on) saves a tokenizer's chat template, outside tokenizer_config.json:
an export without it lost an instruct base's template, AutoTokenizer's chat_template None (trial
RV66a F1)."""
KEPT_FILES = (CONFIG_JSON, *TOKENIZER_FILES, "generation_config.json", CHAT_TEMPLATE)
"""The files of a base a run keeps (base_record's copy in RUN/base, which its export ships), held
present or absent by the hub's word, as the weights are; and its named chat templates (below)."""
TEMPLATES_DIR = "additional_chat_templates"
"""Where transformers (4.53 on) saves a tokenizer's named chat templates, NAME.jinja each (a tool-use
or RAG template beside the default): kept and shipped as chat_template.jinja is (trial RV66f F4)."""
_NAMED_TEMPLATE = re.compile(rf"{TEMPLATES_DIR}/[^/\\]+\.jinja")


def chat_templates(names: Iterable[str]) -> list[str]:
    """The chat templates among a base's file names (relative paths): the default and named ones."""
    return [n for n in names if n == CHAT_TEMPLATE or _NAMED_TEMPLATE.fullmatch(n)]


def kept_name(name: str) -> bool:
    """Whether `name` (a path relative to the base directory) is a file a run keeps of its base."""
    return name in KEPT_FILES or bool(_NAMED_TEMPLATE.fullmatch(name))


def named_templates(directory: Path) -> list[str]:
    """The named chat templates of base directory `directory`, as paths relative to it: those
    `kept_name` takes (one rule: a name the glob took and the record's check refused made every later
    export refuse the run's base.json as unreadable: review RV67d 1)."""
    folder = directory / TEMPLATES_DIR
    found = sorted(p.name for p in folder.glob("*.jinja") if p.is_file()) if folder.is_dir() else []
    return [name for name in (f"{TEMPLATES_DIR}/{n}" for n in found) if kept_name(name)]


def check_templates(directory: Path, names: Iterable[str]) -> None:
    """The chat templates among `names` (files of base directory `directory`) as transformers reads
    them, UTF-8 text: one that is not (a macOS `._NAME.jinja` beside it) was kept, shipped, and every
    export's AutoTokenizer failed on it, blamed on another file (review RV67d 4). One line naming it."""
    for name in chat_templates(names):
        try:
            (directory / name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise BaseModelError(
                f"{directory / name} is not UTF-8 text ({e.reason} at byte {e.start}), which a chat "
                "template is: remove it from the base, or save it as UTF-8"
            ) from None


OTHER_TOKENIZER_FORMS = ("vocab.json", "merges.txt", "tokenizer.model")
"""A base's tokenizer without tokenizer.json (GPT-2's vocab.json and merges.txt, SentencePiece's
tokenizer.model): its own, other ids than the dataset's may be (hf_import.check_base_data refuses it)."""


class BaseModelError(GristmillError):
    """A base model directory whose files cannot be loaded as they claim; names the file."""


def weights_files(base: Path) -> tuple[dict[str, str] | None, list[str]]:
    """(the index's weight map, or None; the safetensors files) holding base directory `base`'s
    weights: model.safetensors first, as transformers' from_pretrained reads a folder holding both (a
    hub repo with a single file and shards is fetched whole): the base is the model users load from
    it. Here, not in hf_import, so that the mixture search names a base's weights without torch."""
    if (base / SINGLE_FILE).is_file():
        return None, [SINGLE_FILE]
    if (base / INDEX_JSON).is_file():
        try:
            weight_map = json.loads((base / INDEX_JSON).read_text(encoding="utf-8"))["weight_map"]
            # a list, or a null file name, was a traceback (trial RV63b 6); a file outside the folder is
            # read by no transformers (RV63b 12)
            if not isinstance(weight_map, dict) or not all(
                isinstance(f, str) and f and Path(f).name == f for f in weight_map.values()
            ):
                raise ValueError("weight_map is not a table of tensor names to file names in the folder")
        except (ValueError, KeyError, TypeError) as e:
            raise BaseModelError(f"{base / INDEX_JSON} is damaged ({type(e).__name__}: {e})") from None
        return weight_map, sorted(set(weight_map.values()))
    raise ConfigError(
        f"model.init_from: {base} holds neither {SINGLE_FILE} nor {INDEX_JSON} (only safetensors "
        "weights are read)",
        "model.init_from",
    )


HUB_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
]
"""What a hub base is fetched with (snapshot_download's allow_patterns): never .bin pickles, never
another format's copy of the weights (original/*.pth). Not CHAT_TEMPLATE, fetched on its own (a
snapshot a gristmill before it cached offline, whose listing names one, was refused as incomplete by
snapshot_download: review RV66g 1)."""
DOWNLOAD_ONLY = "--include '*.json' --include '*.safetensors' --include tokenizer.model --include merges.txt"
"""The same for the `hf download` an advice names: a plain one fetches the whole repository, a
Llama's original/*.pth too (16 GB more for an 8B: review RV60d 5); and a tokenizer's other forms, which
a base without tokenizer.json is refused by (review RV64c 3)."""

# The hub's repository names: letters, digits, '-', '_', '.'; a revision is a branch (which may
# hold '/'), a tag or a commit.
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class BaseSource:
    """A located base model."""

    identity: str
    """What the run records as model.init_from: the resolved directory, or "org/name@<commit>"."""
    directory: Path | None
    """The directory holding its files; None when a resume takes the checkpoint's `recorded` base."""
    recorded: dict[str, Any] | None = None
    """The checkpoint's model record (COMPLETE's "model") standing in for the files (directory None)."""
    note: str = ""
    """A line for the log (the base was not read again), or ""."""


class HubRepoMissing(ConfigError):
    """The hub answered that it has no repository of that name this user can read (not: it was not
    reached)."""


def hub_id(init_from: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) when `init_from` names a hub repository (not an existing
    directory, `org/name[@revision]`); None for a local path."""
    match = _HUB_ID.fullmatch(init_from)
    if match is None or Path(init_from).expanduser().is_dir():
        return None
    return match["repo"], match["revision"]


def is_hub_commit(identity: str) -> bool:
    """Whether base `identity` is a hub repository pinned to a commit (`org/name@<commit>`, as a run
    records a hub base): the commit names its weights' bytes on the hub, so its step 0 is exported from
    it without RUN/base/base.json's record of them (hf_export._unrecorded_base)."""
    hub = hub_id(identity)
    return hub is not None and hub[1] is not None and _COMMIT.fullmatch(hub[1]) is not None


def unrecorded_step0(base: str) -> str:
    """What step 0 of a run that keeps no record of its base's weights is, as its lines say it: a hub
    commit names its bytes, so it is exported from it (hf_export._unrecorded_base); else none can be."""
    if is_hub_commit(base):
        return f"step 0 is the hub commit {base}, exported from it"
    return "step 0 cannot be exported from this run"


def locate_base(
    init_from: str,
    recorded: dict[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
    settable: bool = True,
) -> BaseSource:
    """Where the base `init_from` names has its files, a hub id fetched and pinned (see the module).
    `recorded`: the model record of the checkpoint a resume continues from, if any. `say`: where a
    line announcing a download goes. `settable`: the command takes model.init_from (a run); False
    for one that reads a run's recorded base (export), whose advice is the hub cache instead."""
    known = recorded if recorded and recorded.get("init_from_sha256") else None
    path = Path(init_from).expanduser().resolve()
    if init_from.endswith("@") and _HUB_ID.fullmatch(init_from[:-1]) and not path.is_dir():
        # read as a local path, it was refused as "not a directory" (trial RV69c F5)
        raise ConfigError(
            f"model.init_from = {init_from!r} names no revision after '@'; give {init_from[:-1]!r} (its main "
            f"branch) or {init_from[:-1]}@REV (a branch, tag or commit)",
            "model.init_from",
        )
    # The directory the checkpoint recorded stays a directory once gone: "bases/m2" (relative, one
    # slash) then read as a hub id was fetched from the hub, and refused with `hf download bases/m2`
    # as advice (review R28a M2).
    hub = None if known is not None and str(path) == str(known.get("init_from")) else hub_id(init_from)
    if hub is None:
        if known is not None and not path.is_dir():
            note = (
                f"note: the base directory {path} is not at hand; resuming from the checkpoint, which holds "
                f"the weights (the run's base: {known.get('init_from')}, init_from_sha256 "
                f"{known['init_from_sha256'][:12]}…)"
            )
            return BaseSource(str(known.get("init_from")), None, known, note)
        return BaseSource(str(path), path)
    repo, revision = hub
    if known is not None:
        was = hub_id(str(known.get("init_from", "")))
        if was is not None and was[0] == repo and revision in (None, was[1]):
            note = (
                f"note: the base is {repo} at commit {was[1]}, recorded when the run started; resuming from "
                "the checkpoint, the hub is not asked again"
            )
            return BaseSource(str(known["init_from"]), None, known, note)
    try:
        directory, commit = fetch_hub_base(repo, revision, say, settable)
    except HubRepoMissing:
        # A checkpoint that recorded a directory, resumed by a value the hub answered it does not have:
        # that directory ("bases/m2" reached through a symlink removed with it, or resumed from another
        # working directory: review RV28c F3; advised `hf download bases/m2`). A hub not reached says
        # nothing of the value: its own line, as before (review RV29c F2). A repository the hub does
        # give is compared with the record (refused, naming the directory: review R25d S1).
        if known is None or hub_id(str(known.get("init_from", ""))) is not None or revision is not None:
            raise
        if Path(str(known.get("init_from"))).is_dir():  # there after all: read and checked, as at the start
            return locate_base(str(known.get("init_from")), recorded, say, settable)
        note = (
            f"note: model.init_from = {init_from!r} is no directory here, and the hub has no repository of "
            "that name; "
            f"the run's base is the directory {known.get('init_from')}, not at hand: resuming from the "
            f"checkpoint, which holds the weights (init_from_sha256 {known['init_from_sha256'][:12]}…)"
        )
        return BaseSource(str(known.get("init_from")), None, known, note)
    return BaseSource(f"{repo}@{commit}", directory)


def fetch_hub_base(
    repo: str, revision: str | None, say: Callable[[str], None] | None = None, settable: bool = True
) -> tuple[Path, str]:
    """snapshot_download of `HUB_FILES` of hub model `repo` at `revision` (None: main); returns the
    snapshot directory and its commit. A missing repository, revision or config.json, a hub that
    cannot be reached with nothing cached, or a snapshot read from the cache (offline, or the hub not
    reached) lacking what the hub may hold (config.json, a weights file, a file the run keeps: `KEPT_FILES`),
    is one ConfigError naming model.init_from."""
    name = f"{repo}@{revision}" if revision else repo
    try:
        from huggingface_hub import constants, hf_hub_download, snapshot_download
        from huggingface_hub.errors import (
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise ConfigError(
            f"model.init_from = {name!r} is a hub id, which needs the huggingface_hub package (pip install "
            "huggingface_hub); or download the model and set model.init_from to its directory",
            "model.init_from",
        ) from None
    offline = bool(constants.HF_HUB_OFFLINE)  # nothing is downloaded: the cache has it, or not
    pinned = bool(revision and _COMMIT.fullmatch(revision))  # a commit: the same bytes wherever read
    cache = constants.HF_HUB_CACHE
    if say is not None and offline:
        say(f"model.init_from: reading {name} from the hub cache {cache} (HF_HUB_OFFLINE is set)")
    elif say is not None and not pinned:
        say(f"model.init_from: fetching {name} from the Hugging Face hub (config, tokenizer, safetensors)")
    # a branch or tag moves: which commit it names now, to say when the snapshot is another
    named = _hub_names(repo, revision) if not offline and not pinned and say is not None else None
    try:
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError as e:
        # a snapshot whose cached listing says it misses files (newer huggingface_hub): only part of it
        partial = type(e).__name__ == "IncompleteSnapshotError"
        if not offline and not partial:
            raise ConfigError(_fetch_failed(name, repo, revision, e, settable), "model.init_from") from None
        snapshot = Path(getattr(e, "snapshot_path", None) or ".")
        pin = snapshot.name if _COMMIT.fullmatch(snapshot.name) else revision
        missing = _listed_missing(repo, snapshot) if partial and pin == snapshot.name else []
        raise ConfigError(
            f"model.init_from = {name!r}: {_no_hub(offline)}, and the hub cache {cache} "
            + (
                f"holds only part of it (no {', no '.join(missing)})"
                if missing
                else ("holds only part of it" if partial else "does not hold it")
            )
            + f": {_get(repo, pin, offline, settable)}",
            "model.init_from",
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(
            f"model.init_from = {name!r}: the hub repository {repo} has no revision {revision!r} (a branch, "
            "tag or commit)",
            "model.init_from",
        ) from None
    except RepositoryNotFoundError:
        raise HubRepoMissing(
            f"model.init_from = {name!r} is not a local directory, and the Hugging Face hub has no model "
            f"repository {repo!r} you can read (missing, private or gated: `hf auth login` or HF_TOKEN)",
            "model.init_from",
        ) from None
    except Exception as e:  # a timeout, a full disk: one line all the same
        raise ConfigError(_fetch_failed(name, repo, revision, e, settable), "model.init_from") from None
    commit = path.name  # the cache's snapshots/<commit>
    if not _COMMIT.fullmatch(commit):
        raise ConfigError(f"model.init_from = {name!r}: the hub cache gave {path}, not a commit's snapshot")
    # the chat template where the listing snapshot_download cached names one (asked of a hub that cannot
    # be reached, every start waited for its timeouts); one not fetched is said below
    templates = listed_templates(repo, commit)
    if not offline:
        for template in templates:
            if not (path / template).is_file():
                with contextlib.suppress(Exception):
                    hf_hub_download(repo, template, revision=commit)
    # named templates the listing names and the cache lacks (offline, or a fetch that failed): said
    unfetched = [t for t in templates if t != CHAT_TEMPLATE and not (path / t).is_file()]
    lacking = _lacking(path)
    listed = _hub_listing(repo, commit, offline) if lacking else None
    # What the snapshot lacks and the hub lists, or what nobody can say the hub lacks: the snapshot
    # was read from the cache (offline, or the hub not reached), holding what another command fetched
    # of the repository (a data build's tokenizer.path = ORG/BASE: its tokenizer.json alone; what
    # transformers' from_pretrained fetches: no tokenizer.json), not the repository's contents (R25d
    # M1, R25g 1-2). A file the hub cache records as absent (huggingface_hub's .no_exist marker) is
    # absent: without tokenizer.json the dataset's tokenizer is not checked against the base (a note);
    # without tokenizer_config.json or generation_config.json the export makes its own (R25l S1).
    unknown = [
        what
        for what, files in lacking.items()
        if (any(f in listed for f in files) if listed is not None else not _recorded_absent(path, files))
    ]
    if listed is not None:  # what the hub lacks, recorded as hf_hub_download does for offline reads (M1)
        _record_absent(path, [f for files in lacking.values() for f in files if f not in listed])
        # a shard the index names and the hub lacks: the repository's fault, not the cache's, whose path
        # the line named (trial RV69c F3)
        unpushed = [f for what, files in lacking.items() if what.endswith(_BY_INDEX) for f in files]
        if unpushed := [f for f in unpushed if f not in listed]:
            raise ConfigError(
                f"model.init_from = {name!r}: the hub repository {repo} at commit {commit} lacks "
                f"{', '.join(unpushed)}, which its {INDEX_JSON} names; push the missing shards to it, or "
                "name a commit that holds them",
                "model.init_from",
            )
    # a cache an older gristmill (or from_pretrained) filled holds no word of it: it runs, said below
    template_unknown = CHAT_TEMPLATE in unknown
    unknown = [u for u in unknown if u != CHAT_TEMPLATE]
    if unknown:
        held = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
        why = ""
        if set(unknown) <= set(KEPT_FILES) - {CONFIG_JSON}:
            why = ": a snapshot read from the cache cannot show the repository has none, and " + (
                "the dataset's tokenizer is checked against it"
                if unknown == [TOKENIZER_JSON]
                else "the run keeps the base's own (its export ships them)"
            )
        raise ConfigError(
            f"model.init_from = {name!r}: {_no_hub(offline)}, and the hub cache {cache} holds only part of "
            f"{repo} at commit {commit} ({held}; no {' and no '.join(unknown)}){why}: "
            f"{_get(repo, commit, offline, settable)}",
            "model.init_from",
        )
    if template_unknown and say is not None:
        say(
            f"note: the hub cache {cache} holds no {CHAT_TEMPLATE} of {repo} at commit {commit}, and nothing "
            f"says the repository has none: the run's exports ship none; `hf download {repo} "
            f"{CHAT_TEMPLATE} --revision {commit}` fetches it, where it has one"
        )
    if unfetched and say is not None:
        say(
            f"note: the hub cache {cache} holds no {', '.join(unfetched)} of {repo} at commit {commit}, "
            f"which the repository holds: the run's exports ship none; `hf download {repo} "
            f"{' '.join(unfetched)} --revision {commit}` fetches them"
        )
    others = sorted(set(OTHER_TOKENIZER_FORMS) & (listed or set()) - {p.name for p in path.iterdir()})
    if others and TOKENIZER_JSON in lacking:
        # a tokenizer the hub holds only in another form, which HUB_FILES never fetch: fetched so it is
        # refused as a directory's is, not noted as none (review RV63g 2); offline, what the cache
        # lacks of it is said (it passed offline what was refused online: review RV64c 3)
        if offline:
            raise ConfigError(
                f"model.init_from = {name!r}: {_no_hub(offline)}, and the hub cache {cache} lacks "
                f"{' and '.join(others)} of {repo} at commit {commit}, its tokenizer (it has no "
                f"{TOKENIZER_JSON}), which the dataset's tokenizer is checked against: "
                f"{_get(repo, commit, offline, settable)}",
                "model.init_from",
            )
        for other in others:
            try:
                hf_hub_download(repo, other, revision=commit)
            except Exception as e:  # a timeout, a full disk: one line all the same
                why = _fetch_failed(name, repo, revision, e, settable)
                raise ConfigError(why, "model.init_from") from None
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.init_from = {name!r}: the hub repository {repo} holds no config.json at commit {commit} "
            "(not a transformers model)",
            "model.init_from",
        )
    # Its small files (config, tokenizer) held to their blobs' names: a config.json damaged in the cache,
    # or altered on its way in, trained with another rms_norm_eps, exit 0 (trial RV62c S1). Those it
    # fetches alone, not another tool's in the same snapshot (a pytorch_model.bin: GBs the run never
    # reads, review RV62e 4); the weights where they are hashed (base_record.hub_weights_sha256).
    # The files the run keeps too (RUN/base, shipped by every export): its chat templates, default and
    # named, edited in the cache were kept and recorded as the hub commit's (review RV78c 2).
    templates = sorted(str(t.relative_to(path)) for t in (path / TEMPLATES_DIR).glob("*.jinja"))
    for file in dict.fromkeys([*(n for n in HUB_FILES if "*" not in n), *KEPT_FILES, *templates]):
        if (path / file).exists() and (damage := hub_copy_damage(path / file)) is not None:
            raise BaseModelError(damage)
    if named is not None and named[0] != commit:
        say(_not_the_hub_s(name, revision, commit, cache, *named))
    return path, commit


def _hub_names(repo: str, revision: str | None) -> tuple[str | None, str]:
    """(the commit the hub says `revision` of `repo` names now, or None; why not). snapshot_download
    reads the cache's main when the hub is not reached, or answers 401, 403 or 404 for a repository
    deleted, made private or whose token expired, without a word: an old commit trained as if current
    (trial RV62c S3, review RV63d 3). Bounded as huggingface_hub bounds its own metadata requests: a
    firewall that drops packets would hold the start twice as long (review RV63d 4)."""
    from huggingface_hub import HfApi, constants

    try:
        return HfApi().model_info(repo, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT).sha, ""
    except Exception as e:  # noqa: BLE001 - refused, timed out, 401/403/404, 5xx: no commit named
        response = getattr(e, "response", None)
        status = f"HTTP {response.status_code} " if getattr(response, "status_code", None) else ""
        return None, f"{status}{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def _not_the_hub_s(
    name: str, revision: str | None, commit: str, cache: str, now: str | None, why: str
) -> str:
    """The note for a base snapshot of another commit than the one the hub named just before."""
    ref = revision or "main"
    if now is None:
        return (
            f"note: model.init_from: the Hugging Face hub did not say which commit {ref} names ({why}); "
            f"{name} is commit {commit}, the one the hub cache {cache} holds for {ref}: the hub's may be "
            "newer (the run records this commit)"
        )
    return (
        f"note: model.init_from: {name} is commit {commit}, while the hub's {ref} named {now} a moment "
        f"before (pushed to meanwhile, or read from the hub cache {cache}); the run records {commit}"
    )


_BY_INDEX = f" (named by {INDEX_JSON})"


def _lacking(snapshot: Path) -> dict[str, list[str]]:
    """What of a base `snapshot` lacks (config.json, the weights, the files the run keeps with its
    base: `KEPT_FILES`), each with the repository files that would be it: a weights index counts with
    every shard it names."""
    lacking: dict[str, list[str]] = {}
    if not (snapshot / CONFIG_JSON).is_file():
        lacking[CONFIG_JSON] = [CONFIG_JSON]
    if not (snapshot / SINGLE_FILE).is_file():
        try:
            weight_map = json.loads((snapshot / INDEX_JSON).read_text(encoding="utf-8"))["weight_map"]
            missing = sorted(set(weight_map.values()) - {p.name for p in snapshot.iterdir()})
        except FileNotFoundError:
            lacking["weights"] = [SINGLE_FILE, INDEX_JSON]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # a damaged index: weights_files names it
        else:
            if missing:
                lacking[f"{', '.join(missing)}{_BY_INDEX}"] = missing
    for kept in KEPT_FILES:
        if kept != CONFIG_JSON and not (snapshot / kept).is_file():
            lacking[kept] = [kept]
    return lacking


def _hub_listing(repo: str, commit: str, offline: bool) -> set[str] | None:
    """The files of hub model `repo` at `commit` as the hub listed them: the listing snapshot_download
    cached (huggingface_hub >= 1.x: get_cached_repo_tree), else the hub asked (not offline); None when
    neither can say."""
    try:
        from huggingface_hub import get_cached_repo_tree

        return {f.path for f in get_cached_repo_tree(repo, revision=commit)}
    except Exception:  # an older huggingface_hub, or no listing cached
        pass
    if offline:
        return None
    try:
        from huggingface_hub import HfApi, constants

        # One request (repo info lists the files), not list_repo_files' retries
        info = HfApi().model_info(repo, revision=commit, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        return {s.rfilename for s in info.siblings or []}
    except Exception:  # the hub cannot be reached: the snapshot was read from the cache
        return None


def listed_templates(repo: str, commit: str) -> list[str]:
    """The chat templates the hub cache's listing of `repo` at `commit` names (offline: no request);
    [] where it holds none."""
    return chat_templates(sorted(_hub_listing(repo, commit, offline=True) or ()))


def _listed_missing(repo: str, snapshot: Path) -> list[str]:
    """The files of `HUB_FILES` the cached listing of `repo` at the commit of `snapshot` names and
    the snapshot lacks (what huggingface_hub's IncompleteSnapshotError counts), or [] when unknown."""
    listed = _hub_listing(repo, snapshot.name, offline=True)
    if listed is None:
        return []
    from huggingface_hub.utils import filter_repo_objects

    return sorted(
        f for f in filter_repo_objects(listed, allow_patterns=HUB_FILES) if not (snapshot / f).exists()
    )


def _no_exist(snapshot: Path) -> Path:
    return snapshot.parent.parent / ".no_exist" / snapshot.name


def _recorded_absent(snapshot: Path, files: list[str]) -> bool:
    """Whether the hub cache records `files` (one name) as absent at the commit of `snapshot`: the
    marker hf_hub_download leaves when the hub answered that the file is not there."""
    return len(files) == 1 and files[0] in KEPT_FILES and (_no_exist(snapshot) / files[0]).is_file()


def _record_absent(snapshot: Path, files: list[str]) -> None:
    """Leaves the hub cache's record of `files` being absent at the commit of `snapshot` (the empty
    `.no_exist/<commit>/<file>` hf_hub_download writes on the hub's 404), so that an offline read
    can tell, with a huggingface_hub that caches no listing (< 1.x) or without the listing. A cache
    that cannot be written is left as it is: the offline read then refuses, as before."""
    for name in files:
        if name in KEPT_FILES:
            try:
                (_no_exist(snapshot) / name).parent.mkdir(parents=True, exist_ok=True)
                (_no_exist(snapshot) / name).touch()
            except OSError:
                return


def _no_hub(offline: bool) -> str:
    return "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"


def _get(repo: str, pin: str | None, offline: bool, settable: bool) -> str:
    """The two ways to the base: with network, or downloaded elsewhere at `pin` (the commit or
    revision asked; `hf download` without --revision fetches main, another commit)."""
    return (
        "fetch the base with network (the same command"
        + (", HF_HUB_OFFLINE unset" if offline else " where the hub can be reached")
        + f"), or {_elsewhere(repo, pin, settable)}"
    )


def _elsewhere(repo: str, pin: str | None, settable: bool) -> str:
    """A base downloaded on another machine, brought here: a run names its directory; export, which
    takes no settings, reads the run's recorded hub id from a hub cache (it advised "set
    model.init_from": trial RV57d F4)."""
    get = f"hf download {repo}" + (f" --revision {pin}" if pin else "") + f" {DOWNLOAD_ONLY}"
    if settable:
        return f"download it elsewhere (`{get}`) and set model.init_from to that directory"
    return (
        f"download it elsewhere into a hub cache (`{get} --cache-dir DIR`), then bring DIR here and set "
        "HF_HUB_CACHE=DIR"
    )


def _fetch_failed(name: str, repo: str, revision: str | None, e: Exception, settable: bool) -> str:
    first = (str(e).splitlines() or [""])[0]
    return (
        f"model.init_from = {name!r} is not a local directory, and fetching it from the Hugging Face hub "
        f"failed ({type(e).__name__}: {first}); on a machine without network, "
        + _elsewhere(repo, revision, settable)
    )
