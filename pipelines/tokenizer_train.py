"""`gristmill tokenizer train --config configs/data/X.toml`: a byte-level BPE on a sample of the source.

The sample is the start of the recipe's source (files in sorted order), after the recipe's
filters, up to tokenizer.train.sample_docs documents / sample_chars characters. The tokenizer is
written to tokenizer.path (or --out), atomically and, without --force, exclusively: two builds (or a
build and `gristmill tokenizer train`) training the same missing file never replace each other's
tokenizer; the later one uses the file if it is byte-identical and refuses otherwise. The separator
must be among its special tokens.

It lives here, not in tokenization/, because choosing the sample is the data pipeline's work (the
recipe's source and filters); tokenization/ keeps the BPE itself (`train_bpe`) and the encoding,
and imports nothing from pipelines/.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tokenizers import pre_tokenizers

from pipelines.build_identity import output_dir
from pipelines.config import DataConfig
from pipelines.demo_corpus import ensure_demo_corpus
from pipelines.filters import check_filters, make_filters
from pipelines.sources import SourceFiles, iter_texts, list_source_files, source_folder
from tokenization.separator import DocumentEncoder, SeparatorPolicy, spelled
from tokenization.tokenizer_io import TokenizerError, names_local_file, train_bpe, trained_record
from training.contract.atomic_write import atomic_path, fsync_dir, fsync_file, tmp_path_for, write_atomic
from training.contract.config_loader import PathArgument, add_config_arguments, load_config
from training.contract.dataset_format import BUILD_JSON, DATASET_JSON, file_sha256
from training.contract.object_store import refuse_other_urls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "configs/data/demo.toml", "tokenizer.train.vocab_size=16384")
    parser.add_argument(
        "--out",
        default=None,
        action=PathArgument,
        help="where to write tokenizer.json (default: tokenizer.path)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing tokenizer file")


def run(args: argparse.Namespace) -> int:
    refuse_other_urls({"--out": args.out})
    cfg = load_config(DataConfig, args.config, args.overrides)
    check_training_values(cfg, args.out)
    out = written_path(cfg, args.out)  # a folder's tokenizer.json: an empty folder is no file to overwrite
    if out.exists() and not args.force:
        raise TokenizerError(
            f"{out} already exists; pass --force to overwrite it (a dataset built with it keeps its own copy)"
        )
    train_tokenizer(cfg, out=out, force=args.force)
    return 0


MAX_VOCAB = 1 << 24
"""The largest vocab_size trained: the tokenizers library sizes its tables by it (2³¹ asked it for 141 GB
and aborted the process)."""


def check_training_values(cfg: DataConfig, out: str | Path | None) -> None:
    """What no training can use, in one line: an empty tokenizer.path (Path("") is ".", which
    "already exists"), counts below their least, and [filters] lengths the build refuses."""
    if not str(out or cfg.tokenizer.path).strip():
        raise TokenizerError(
            "tokenizer.path is empty; set it (or pass --out) to say where to write the tokenizer"
        )
    tc = cfg.tokenizer.train
    for key, low in (("sample_docs", 1), ("sample_chars", 1), ("min_frequency", 0)):
        if getattr(tc, key) < low:  # min_frequency -1 was the tokenizers library's OverflowError
            raise TokenizerError(f"tokenizer.train.{key} = {getattr(tc, key)} must be ≥ {low}")
    twice = sorted({token for token in tc.special_tokens if tc.special_tokens.count(token) > 1})
    if twice:  # one vocabulary entry each: the room for merges was counted one short per repeat
        raise TokenizerError(
            f"tokenizer.train.special_tokens names {', '.join(map(repr, twice))} more than once; list "
            "each once"
        )
    check_filters(cfg.filters)  # it samples through the build's filters (review R27d m2)


def written_path(cfg: DataConfig, out: str | Path | None) -> Path:
    """The tokenizer.json training writes: `out` (--out), else tokenizer.path (`~` expanded, as the build
    reads it: a literal `~` folder was another file to each: review R16f F2); a folder's tokenizer.json.
    A tokenizer.path that names a hub repo is refused without --out: written here under the repo's name,
    it was read instead of the hub's by every later build started in this folder (review R16f F1)."""
    if out is None and not names_local_file(cfg.tokenizer.path):
        raise TokenizerError(
            f"tokenizer.path = {cfg.tokenizer.path!r} names a tokenizer on the Hugging Face hub, and "
            "training writes a local file: pass --out DIR (or set tokenizer.path to a local path) for it"
        )
    path = Path(out or cfg.tokenizer.path).expanduser()
    # a .JSON too (a folder named tok.JSON was made, the file written inside it: trial RV67b F11)
    path = path if path.suffix.lower() == ".json" else path / "tokenizer.json"
    # A model's folder (a base's config.json, or its SentencePiece tokenizer.model, which the build
    # refuses to read in place of a tokenizer.json): one trained there passed for the base's own with
    # every later build and run (trial RV60b 5)
    held = [name for name in ("config.json", "tokenizer.model") if (path.parent / name).is_file()]
    if held:
        raise TokenizerError(
            f"{path.parent} holds a model ({held[0]}): a tokenizer trained into it would pass for that "
            "model's own; write it into a folder of its own (tokenizer.path, or --out)"
        )
    # A dataset's (or a build's, from its first task on): its tokenizer.json is the one its shards were
    # built with, which --force replaced (trial RV64b L2)
    held = [name for name in (DATASET_JSON, BUILD_JSON) if (path.parent / name).is_file()]
    if held:
        raise TokenizerError(
            f"{path.parent} holds a dataset ({held[0]}), whose tokenizer.json is the one its shards were "
            "built with; write a new tokenizer into a folder of its own (tokenizer.path, or --out)"
        )
    return path


def _save(tok: Any, tmp: Path, out: Path) -> None:
    """`tok` written to `tmp` (then placed at `out`); a full disk or a folder it cannot write is one line:
    the tokenizers library raises a bare Exception for them, a traceback (trial RV64b T1)."""
    try:
        tok.save(str(tmp))
    except Exception as e:  # noqa: BLE001 - tokenizers' OS errors are plain Exceptions
        raise TokenizerError(
            f"cannot write {out} ({e}); make {out.parent} writable (or free space), or write it elsewhere "
            "(tokenizer.path, or --out)"
        ) from None


def train_tokenizer(
    cfg: DataConfig,
    source: SourceFiles | None = None,
    out: str | Path | None = None,
    log=print,
    force: bool = False,
) -> Path:
    """Train on a sample of `cfg.source` and save to `out` (default: cfg.tokenizer.path).

    Without `force` an existing file is never replaced (see `place_new_file`): a file that
    appeared at `out` during training (another build training the same tokenizer.path) is used
    when it holds the same bytes, and is a TokenizerError otherwise."""
    tc = cfg.tokenizer.train
    check_training_values(cfg, out)
    out = written_path(cfg, out)
    if cfg.tokenizer.separator not in tc.special_tokens:
        raise TokenizerError(
            f"tokenizer.train.special_tokens {tc.special_tokens} lacks the separator "
            f"{cfg.tokenizer.separator!r}; add it so the trained tokenizer can frame documents"
        )
    least = 256 + len(tc.special_tokens) + 1  # the bytes, the special tokens and one merge
    if tc.vocab_size < least:  # (it said "use at least 512", and took 258: trial RV67b F5)
        raise TokenizerError(
            f"tokenizer.train.vocab_size {tc.vocab_size} leaves no room for merges (the 256 bytes and "
            f"{len(tc.special_tokens)} special tokens take {least - 1}); use at least {least} (512 or "
            "more is usual)"
        )
    if tc.vocab_size > MAX_VOCAB:  # the library allocated 141 GB and aborted (trial RV67b F5)
        raise TokenizerError(
            f"tokenizer.train.vocab_size {tc.vocab_size:,} is past {MAX_VOCAB:,}, more than any corpus "
            "gives merges for (Llama 3's is 128,256); use a smaller one"
        )
    if said := _spelled_specials(tc.special_tokens):  # known before training: no hours spent first
        raise TokenizerError(said)
    ensure_demo_corpus(cfg.source)
    source = source or list_source_files(cfg.source, own_output=output_dir(cfg))  # as the build lists it
    filters = make_filters(cfg.filters, None)
    t0 = time.perf_counter()
    stats = {"docs": 0, "chars": 0}
    seen = Counter()

    def texts():
        for text in iter_texts(cfg.source, source, filters, tc.sample_docs, tc.sample_chars, seen):
            stats["docs"] += 1
            stats["chars"] += len(text)
            yield text

    tok = train_bpe(texts(), tc.vocab_size, list(tc.special_tokens), min_frequency=tc.min_frequency)
    if stats["docs"] == 0:  # tokenizers trains "successfully" on nothing: bytes and specials only
        read = seen.pop("read", 0)
        files = f"{len(source.files)} file{'s' if len(source.files) != 1 else ''}"
        if not read:  # an empty file was "no document passed the filters" (trial RV66b nit)
            raise TokenizerError(
                f"source.path {cfg.source.path!r} holds no documents ({files} read), so there is "
                "nothing to train on; point source.path at the corpus"
            )
        why = ", ".join(f"{reason} {count:,}" for reason, count in seen.most_common())
        raise TokenizerError(
            f"none of the {read:,} documents of source.path {cfg.source.path!r} passed the filters ({why}), "
            f"so there is nothing to train on; check source.text_key ({cfg.source.text_key!r}) and the "
            "[filters] thresholds"
        )
    try:  # the build's own check, before anything is written: a separator plain text spells (a special
        # token the trainer merged text into) was trained and saved, and every build refused it (trial
        # RV71e 8)
        encoder = DocumentEncoder(
            tok, SeparatorPolicy(cfg.tokenizer.separator, cfg.tokenizer.position), building=True
        )
    except TokenizerError as e:  # its cause without its advice, which is for a tokenizer file
        raise TokenizerError(
            f"the trained tokenizer cannot frame documents: {e.cause}; nothing was written. Make "
            "tokenizer.separator (and its entry in tokenizer.train.special_tokens) a token plain text "
            "cannot spell, such as '<|endoftext|>'"
        ) from None
    if said := _spelled_specials(tc.special_tokens, encoder.tokenizer):  # merges ("the") known now
        raise TokenizerError(said)
    out.parent.mkdir(parents=True, exist_ok=True)
    if force:  # replacing is what was asked for
        with atomic_path(out) as tmp:
            _save(tok, tmp, out)
        placed = True
    else:
        tmp = tmp_path_for(out)
        try:
            _save(tok, tmp, out)
            placed = place_new_file(tmp, out)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    trained = (
        f"trained a {tok.get_vocab_size()}-token byte-level BPE on {stats['docs']:,} documents "
        f"({stats['chars'] / 1e6:.1f}M chars) in {time.perf_counter() - t0:.1f} s"
    )
    if placed:
        record = {
            "source": source_folder(cfg.source),
            "kind": cfg.source.kind,
            "vocab_size": tc.vocab_size,  # the setting (a small corpus gives fewer): _unlike_train_settings
            "sha256": file_sha256(out),  # which file it speaks of: _trained_as
            **stats,
            "at": _utc(time.time()),
        }
        write_atomic(trained_record(out), json.dumps(record, indent=1) + "\n")
        log(f"{trained} → {out}")
    else:
        log(f"{trained}; {out} appeared meanwhile with the same bytes (another process trained it): using it")
    return out


_MARKER = re.compile(r"<.+>|\[.+\]", re.S)  # a special token's shape: <|endoftext|>, </s>, [CLS]


def _spelled_specials(specials: list[str], trained: Any = None) -> str:
    """The refusal of the special tokens plain text spells, "" when none does: whitespace or nothing; a
    character of the byte alphabet every byte-level vocabulary holds (its id is the special token's),
    any one character, or text with a letter or digit outside a marker's brackets (`<…>`, `[…]`: trials
    RV73f 1, RV73h 1); with the `trained` tokenizer
    (encode_special_tokens set), a text encoding to its id (a merge). The separator's extra separators
    aside, transformers (an export's tokenizer) splits a special token out of any text holding it, where
    the build's encoding keeps the text: a special "a" (or " ") made an export encode every "a" otherwise
    than the shards hold it (trial RV72b F2). All named at once, before training where they can be
    (review RV72d F5)."""
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    said = []
    for token in dict.fromkeys(specials):
        if not token.strip():
            said.append(f"{token!r} (whitespace or nothing)")
        elif token in alphabet:
            said.append(f"{token!r} (a byte-level vocabulary's character for a byte, which every one holds)")
        elif len(token) == 1:  # "€", "中": text holds it as often as any character (re-trial RV72e F4)
            said.append(f"{token!r} (one character)")
        elif re.search(r"[^\W_]", token) and not _MARKER.fullmatch(token):
            # "river", "e.g.", "river bank": text, which transformers splits out of every text holding it
            # (trials RV73f 1, RV73h 1); a marker's brackets keep it out of ordinary text
            said.append(f"{token!r} (text, not a marker in <…> or […])")
        elif trained is not None and (text := spelled(trained, token)) is not None:
            said.append(f"{token!r} (literal text {text!r} encodes to its id)")
    if not said:
        return ""
    return (
        f"tokenizer.train.special_tokens: plain text spells {', '.join(said)}, so a tokenizer transformers "
        "loads would split each out of texts the build encodes otherwise, and as tokenizer.separator one "
        "would end documents inside them; nothing was written. Use special tokens plain text does not "
        "spell, such as '<|endoftext|>' or '<|im_start|>'"
    )


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _trained_as(tok: Path) -> tuple[dict[str, Any] | None, str]:
    """The record `gristmill tokenizer train` wrote beside tokenizer `tok` when it is this file's (its
    sha256 is the file's), else None, with why not: "" where there is none. A record copied or left
    beside another file vouched for it, "trained on this source" (trial RV66b F4); one written
    before the record kept the sha256 cannot tell."""
    try:
        rec = json.loads(trained_record(tok).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, ""
    if not isinstance(rec, dict):
        return None, ""
    if rec.get("sha256") != file_sha256(tok):
        why = (
            "another file's, or this one's before it changed"
            if "sha256" in rec
            else "from before records named their file"
        )
        return None, f": {trained_record(tok).name} beside it is {why}"
    return rec, ""


def _unlike_train_settings(tok: Path, cfg: DataConfig) -> str:
    """ "" when the reused tokenizer was trained with [tokenizer.train]'s vocab_size (as its record says)
    and holds its special tokens, else what differs: those settings apply to a tokenizer trained now,
    and the dataset's config.toml records them beside a vocabulary they did not make (review R16f F5)."""
    from tokenization.tokenizer_io import load_tokenizer

    tc, said = cfg.tokenizer.train, []
    rec = _trained_as(tok)[0]  # None: not trained here, or not this file: its size is no setting's
    size = None if rec is None else rec.get("vocab_size")
    if size is not None and size != tc.vocab_size:
        setting = f"tokenizer.train.vocab_size = {tc.vocab_size:,}"
        said.append(f"was trained with vocab_size = {size:,}, not {setting}")
    loaded = load_tokenizer(tok)
    missing = [t for t in tc.special_tokens if loaded.token_to_id(t) is None]
    if missing:
        said.append(f"has no {', '.join(map(repr, missing))} of tokenizer.train.special_tokens")
    if not said:
        return ""
    return f"; note: it {' and '.join(said)} (those settings train a new tokenizer, never change this one)"


def reuse_line(tok: Path, cfg: DataConfig) -> str:
    """One line for a build that finds tokenizer.path already there and uses it as is: which
    file, trained on what and when (a reused file may come from another corpus entirely). It never
    says to delete the file: another dataset may have been built with it (a mixture's sources
    share one tokenizer, configs/data/local-parquet-shared.toml), and a base model's is its own."""
    own = (
        "to train one on this source alone, set tokenizer.path to a path that does not exist yet "
        "(a dataset of its own vocabulary cannot be mixed with those of this one)"
    )
    unlike = _unlike_train_settings(tok, cfg)  # loads the tokenizer: once
    own += unlike
    rec, why = _trained_as(tok)
    try:
        source, docs, at = rec["source"], int(rec["docs"]), rec["at"]
    except (ValueError, KeyError, TypeError):
        # Not trained here (a base model's tokenizer, a copy): never suggest deleting it.
        dated = _utc(tok.stat().st_mtime)
        return (
            f"tokenizer {tok} exists: using it as is; what it was trained on is not recorded{why} "
            f"(file dated {dated}); {own}"
        )
    here = source_folder(cfg.source)
    if source == here:
        return (
            f"tokenizer {tok} exists: using it, trained on this source ({docs:,} documents) at {at}" + unlike
        )
    return (
        f"tokenizer {tok} exists: using it, trained on {source} ({docs:,} documents) at {at}, not this "
        f"source: shared, as the sources of one mixture must share one tokenizer; {own}"
    )


def place_new_file(tmp: Path, out: Path) -> bool:
    """Give the finished file `tmp` the name `out` only if no file has that name: True when placed,
    False when `out` already holds the same bytes (`tmp` is left for the caller to remove); a
    different `out` is a TokenizerError and stays as it is.

    A hard link creates the name exclusively (the kernel refuses an existing one, unlike a rename,
    which replaces it) and publishes a complete file; a filesystem without hard links gets an
    O_EXCL create, written in place."""
    fsync_file(tmp)
    try:
        try:
            os.link(tmp, out)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            _create_exclusively(out, tmp.read_bytes())
    except FileExistsError:
        if out.is_file() and out.read_bytes() == tmp.read_bytes():
            return False
        raise TokenizerError(
            f"{out} appeared while this tokenizer was being trained (another build or `gristmill "
            "tokenizer train` wrote it) and differs from the one trained here; it was left as it is: "
            "rerun to use it, or set tokenizer.path to another file"
        ) from None
    fsync_dir(out.parent)
    return True


def _create_exclusively(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
