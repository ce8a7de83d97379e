"""Loading a tokenizer (local tokenizer.json or a hub name) and training a byte-level BPE."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from training.contract.errors import GristmillError
from training.contract.hub_cache import hub_copy_damage


class TokenizerError(GristmillError):
    """A tokenizer that cannot be used; raised at start-up, never mid-build."""


def load_tokenizer(spec: str | Path) -> Tokenizer:
    """`spec` is a tokenizer.json file, a directory holding one, or a hub repo id (`org/name[@REV]`:
    needs network, or the hub's cache)."""
    path = tokenizer_file(spec)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise TokenizerError(f"{path} is not a valid tokenizer.json ({e}); re-export it") from None


def names_local_file(spec: str | Path) -> bool:
    """Whether tokenizer.path `spec` names a local file (to read, or for training to write): a .json
    name, a path spelled from `.`, `/` or `~`, or anything that exists here. Everything else is read
    as a Hugging Face hub repo id."""
    spec = str(spec)
    return (
        spec.lower().endswith(".json") or spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists()
    )


def hub_name_shadowed(spec: str | Path) -> bool:
    """Whether `spec`, spelled as a hub repo id (`name` or `org/name`, either `@REV`), is read from a
    local directory."""
    spec = str(spec)
    return _HUB_ID.fullmatch(spec) is not None and Path(spec).is_dir()


def tokenizer_file(spec: str | Path, requested: str | None = None) -> Path:
    """The tokenizer.json `spec` names, as a local file: the file, the one in a directory, or a hub
    repo's (fetched into the hub's cache). Its bytes are what a dataset records: a re-serialisation by
    another `tokenizers` version differs (a key added), and a base model's own tokenizer was then
    refused as another one. `requested`: the recipe's tokenizer.path when `spec` is instead the
    commit a build started from (its build.json), for the messages."""
    path = Path(spec).expanduser()  # as the build and `tokenizer train` read it (review R16f F2)
    if path.is_dir():
        # An existing local directory is never a hub name, even when it is relative and holds
        # no tokenizer.json (that would be five network retries for nothing).
        if not (path / "tokenizer.json").is_file() and (path / "tokenizer.model").is_file():
            # A SentencePiece model (Llama-2, Mistral of old). transformers 5 converts it to a
            # tokenizer.json that drops the leading ▁ of a text starting with whitespace (other ids than
            # sentencepiece's, where 4.57 matched: review R25i S2), so the advice is the base's own file.
            raise TokenizerError(
                f"directory {spec} holds a SentencePiece tokenizer.model but no tokenizer.json; use the "
                "base model's own tokenizer.json (its hub repository usually holds one: set tokenizer.path "
                "to org/name, or copy that file into the directory). A conversion by transformers 5 "
                "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)) can encode a text starting with "
                "whitespace to other ids than the SentencePiece model, and the build would not notice: "
                "convert only with transformers < 5, or check the converted file's ids against "
                "sentencepiece's on sample text first (docs/data-build.md)"
            )
        if not (path / "tokenizer.json").is_file():
            raise TokenizerError(
                f"directory {spec} holds no tokenizer.json; set tokenizer.path to a tokenizer.json "
                "file (or a directory holding one), or train one with "
                "`gristmill tokenizer train --config CONFIG`"
            )
        path = path / "tokenizer.json"
    if path.is_file():
        return path
    if names_local_file(spec):
        raise TokenizerError(
            f"tokenizer file {spec} not found; set tokenizer.path to an existing tokenizer.json "
            "or train one with `gristmill tokenizer train --config CONFIG`"
        )
    return _fetch_from_hub(str(spec), requested)


class TokenizerFile:
    """A tokenizer.json's bytes, carried inside a build's pipeline to wherever a task runs (a Ray or
    Slurm node needs no path shared with the driver). Printed by its source and sha256 only: datatrove
    writes the pipeline's attributes into logs/executor.json."""

    def __init__(self, data: bytes, source: str):
        self.data = data
        self.source = source  # where the driver read it: for messages
        self.sha256 = hashlib.sha256(data).hexdigest()

    def load(self) -> Tokenizer:
        return Tokenizer.from_str(self.data.decode("utf-8"))

    def __str__(self) -> str:
        return f"{self.source} (sha256 {self.sha256[:12]}…)"


# A hub repo id (`name` or `org/name`: letters, digits, '-', '_', '.'), with an optional revision (a
# branch, which may hold '/', a tag or a commit), as model.init_from and source.path take it.
_HUB_ID = re.compile(r"(?P<repo>(?:[A-Za-z0-9][\w.-]*/)?[\w.-]+)(?:@(?P<revision>[^\s@]+))?")


def hub_tokenizer(spec: str | Path) -> tuple[str, str | None] | None:
    """(repository, revision or None) when tokenizer.path `spec` is read from the hub (no local file
    or directory, `name`, `org/name` or either `@REV`); None for a local file or an invalid id."""
    match = _HUB_ID.fullmatch(str(spec))
    if match is None or names_local_file(spec):
        return None
    return match["repo"], match["revision"]


def hub_pin(spec: str | Path, path: Path) -> str | None:
    """The commit a hub tokenizer.path `spec` was read at, as "org/name@<commit>", from `path`, the
    tokenizer.json `tokenizer_file(spec)` gave (the cache's snapshots/<commit>/tokenizer.json); None
    for a local file."""
    hub = hub_tokenizer(spec)
    commit = path.parent.name
    return f"{hub[0]}@{commit}" if hub and re.fullmatch(r"[0-9a-f]{40}", commit) else None


def stale_hub_note(spec: str | Path, path: Path) -> str | None:
    """A note for a hub tokenizer.path read by a branch (main) or tag, online, whose file `path` came
    from a commit the hub did not name just after: hf_hub_download reads the cache's ref without a word
    when the hub is not reached (build.json recorded the cached commit as what main named: trial RV78b
    4), as model.init_from's note says of a base. None offline (the cache's, as asked), for a commit, a
    local file, or the commit the hub names."""
    hub = hub_tokenizer(spec)
    if hub is None or re.fullmatch(r"[0-9a-f]{40}", hub[1] or ""):
        return None
    from huggingface_hub import HfApi, constants  # here: a local tokenizer.json never imports the hub's stack

    if constants.HF_HUB_OFFLINE:
        return None
    (repo, revision), commit, ref = hub, path.parent.name, hub[1] or "main"
    try:  # bounded as huggingface_hub bounds its own metadata requests
        now = HfApi().model_info(repo, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT).sha
    except Exception as e:  # noqa: BLE001 - refused, timed out, 401/403/404, 5xx: no commit named
        return (
            f"note: tokenizer.path = {str(spec)!r}: the Hugging Face hub did not say which commit {ref} "
            f"names ({type(e).__name__}); the tokenizer read is commit {commit}, the one the hub cache "
            f"{constants.HF_HUB_CACHE} holds for {ref}: the hub's may be newer (build.json records this "
            "commit)"
        )
    if now == commit:
        return None
    return (
        f"note: tokenizer.path = {str(spec)!r}: the tokenizer read is commit {commit}, while the hub's {ref} "
        f"named {now} a moment after (pushed to meanwhile); build.json records {commit}"
    )


def _fetch_from_hub(spec: str, requested: str | None = None) -> Path:
    # Here, not at the top: the hub's download stack takes about a second to import, and a local
    # tokenizer.json (each build task, the validator) never needs it.
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    invalid = (
        f"tokenizer.path = {spec!r} is neither a local tokenizer.json (or a directory holding one) nor a "
        "hub repo id (ORG/NAME, or ORG/NAME@REV for a branch, tag or commit)"
    )
    hub = hub_tokenizer(spec)
    if hub is None:
        raise TokenizerError(invalid)
    repo, revision = hub
    try:
        local = hf_hub_download(repo, "tokenizer.json", revision=revision)
    except HFValidationError as e:  # a name the hub cannot hold ('--', a trailing '.'): no network asked
        raise TokenizerError(f"{invalid}: {str(e).splitlines()[0]}") from None
    except RevisionNotFoundError:
        if requested is not None:  # not the recipe's revision: the commit build.json recorded (R25g 4)
            raise TokenizerError(
                f"tokenizer.path = {requested!r}: {spec}, the commit this build started from (its "
                f"build.json), is gone from the hub repository {repo} (a force-push, or its branch deleted) "
                "and is not in the hub cache here: restore that commit on the hub, or build into a new "
                "output directory (which reads tokenizer.path anew)"
            ) from None
        raise TokenizerError(
            f"tokenizer.path = {spec!r}: the hub repository {repo} has no revision {revision!r} (a branch, "
            "tag or commit)"
        ) from None
    except RepositoryNotFoundError:
        raise TokenizerError(
            f"tokenizer.path = {spec!r} is not a local file, and the Hugging Face hub has no model "
            f"repository {repo!r} you can read (missing, private or gated: `hf auth login` or HF_TOKEN)"
        ) from None
    except EntryNotFoundError as e:
        # the hub answered that the file is not there, now or when the cache recorded it (its .no_exist
        # marker, read offline: R25l M2)
        if not isinstance(e, LocalEntryNotFoundError):
            raise TokenizerError(
                f"tokenizer.path = {spec!r}: the hub repository {repo} holds no tokenizer.json"
                + (f" at {revision}" if revision else "")
            ) from None
        if _recorded_absent(repo, revision):  # the cache's answer, of one commit: the hub not asked
            from huggingface_hub import constants

            raise TokenizerError(
                f"tokenizer.path = {spec!r}: the hub cache {constants.HF_HUB_CACHE} records that {repo} held "
                f"no tokenizer.json at {revision or 'the commit its main named then'} (the hub was not "
                "asked: offline, or not reached); with network (HF_HUB_OFFLINE unset) the same command asks "
                "it again"
            ) from None
        raise _unreachable(spec, repo, revision, e) from None
    except Exception as e:  # offline, a timeout, a full disk: all end the same way for the user
        raise _unreachable(spec, repo, revision, e) from None
    if not constants.HF_HUB_OFFLINE:
        _keep_listing(repo, Path(local).parent.name)
    # damaged in the cache, or altered on its way in: built with as the pinned commit's (trial RV62c S1)
    if (damage := hub_copy_damage(local)) is not None:
        raise TokenizerError(damage)
    return Path(local)


def _keep_listing(repo: str, commit: str) -> None:
    """The commit's listing kept in the hub cache (trees/<commit>.json: the hub's digest of each file),
    which hf_hub_download writes none of and snapshot_download does: the cached tokenizer.json is held
    to it offline too. Without it, a copy of another commit's tokenizer put in this commit's place
    passed as one of the cache's blobs, and a cache written without links was refused (review RV78c 1,
    3). Best effort: where the hub does not answer, the blobs' names stand."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo, revision=commit, allow_patterns=["tokenizer.json"])
    except Exception:  # noqa: BLE001 - a hub not reached: hub_copy_damage falls back to the blobs' names
        pass


def _recorded_absent(repo: str, revision: str | None) -> bool:
    """Whether the hub cache records that `repo` at `revision` holds no tokenizer.json (the marker
    hf_hub_download leaves on the hub's 404)."""
    from huggingface_hub import _CACHED_NO_EXIST, try_to_load_from_cache

    try:
        return try_to_load_from_cache(repo, "tokenizer.json", revision=revision) is _CACHED_NO_EXIST
    except Exception:  # a name or revision the cache cannot hold: not recorded
        return False


def _unreachable(spec: str, repo: str, revision: str | None, e: Exception) -> TokenizerError:
    from huggingface_hub import constants

    # The revision asked (a build's pinned commit): a plain `hf download` fetches main (R25g 3)
    download = f"hf download {repo} tokenizer.json" + (f" --revision {revision}" if revision else "")
    if constants.HF_HUB_OFFLINE:
        return TokenizerError(
            f"cannot fetch tokenizer.json of {spec!r}: HF_HUB_OFFLINE is set, and the hub cache "
            f"{constants.HF_HUB_CACHE} does not hold it: fetch it with network (the same command, "
            f"HF_HUB_OFFLINE unset), or download it elsewhere (`{download}`) and set tokenizer.path to the "
            "local tokenizer.json"
        )
    return TokenizerError(
        f"cannot fetch tokenizer.json of {spec!r} from the Hugging Face hub ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); on a machine without network, download it "
        f"elsewhere (`{download}`) and set tokenizer.path to the local tokenizer.json"
    )


LONG_RUN = 1000  # characters of a run of one pre-token class tokenizer training reads (train_bpe)
# ByteLevel's pre-token classes (letters, digits, whitespace, the rest), as Python's re spells them; a
# match starts only where a run does (the lookbehind: a run of 999 was scanned again at each character)
# (whitespace is Unicode's White_Space, as ByteLevel's regex reads it: Python's \s also takes \x1c-\x1f,
# which ByteLevel puts with the rest, and "\x1c!" * 80,000 was one pre-token the cut never saw:
# re-trial RV72e F5)
_WS = "\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CLASSES = (r"[^\W\d_]", r"\d", f"[{_WS}]", rf"(?:[^\w{_WS}]|_)")
_LONG_RUN = re.compile("|".join(rf"(?<!{c}){c}{{{LONG_RUN + 1},}}" for c in _CLASSES))


def train_bpe(
    texts: Iterable[str], vocab_size: int, special_tokens: list[str], min_frequency: int = 2
) -> Tokenizer:
    """Byte-level BPE (GPT-2/Llama-3 style: any byte sequence encodes, nothing is <unk>).

    No post-processor is attached on purpose: the separator is added by DocumentEncoder alone.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    # The trainer's time grows with the square of a pre-token's length (a run of one class ByteLevel does
    # not split): one document of "x" * 2,000,000 held `tokenizer train` over half an hour, printing
    # nothing (trial RV72b F3), and so did 2,000,000 spaces (review RV72d F2). A merge of more than
    # LONG_RUN characters of one class is none a vocabulary keeps: the sample's runs are cut there (a
    # CJK paragraph, split at its punctuation, is not one: RV72d F3); a build encodes every text whole.
    texts = (_LONG_RUN.sub(_cut, t) for t in texts)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _cut(run: re.Match) -> str:
    return run.group()[:LONG_RUN]


def trained_record(tok: Path) -> Path:
    """Beside a tokenizer `gristmill tokenizer train` trained: the source it was trained on and when
    (pipelines/tokenizer_train.py writes it; a data build takes it for its own in its output)."""
    return tok.with_name(tok.name + ".trained.json")
