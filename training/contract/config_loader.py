"""Dataclass configs loaded from TOML with dotted `--set a.b=value` overrides.

Every stage's config is a tree of dataclasses. Unknown keys and wrong types are errors naming the
key (a typo such as `build.wrokers` must never be silently ignored), and the fully resolved config
is written next to every output so a run can be reproduced from its directory alone.

Lives in `training/` because the trainer may only import the standard library, torch, numpy and
pyarrow; the data pipelines import it from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import keyword
import os
import tomllib
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

from training.contract.atomic_write import write_atomic
from training.contract.errors import GristmillError, refuse_empty

T = TypeVar("T")


class ConfigError(GristmillError):
    """A config that cannot be used; the message names the key and the fix. `key` is the dotted
    key at fault when one is (load_config uses it to name the --set it came from)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build `cls` from a TOML file (optional) plus `a.b=value` overrides, checking every key."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        if path.is_dir():  # a run directory: its recipe is config.toml there (R21b F8)
            raise ConfigError(
                f"config file {path} is a directory; pass a TOML file (a run's: {path / 'config.toml'})"
            )
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; pass an existing TOML file to --config")
        try:
            text = path.read_text(encoding="utf-8")
            if text.startswith("\ufeff"):  # an editor's byte-order mark: "invalid statement" at 1:1 (RV65b)
                raise ConfigError(
                    f"{path}: starts with a UTF-8 byte-order mark, which TOML does not allow; save it as "
                    "UTF-8 without one"
                )
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML ({e}); fix the syntax at that line") from None
        except UnicodeDecodeError as e:  # TOML files are UTF-8
            raise ConfigError(
                f"{path}: not UTF-8 (byte {e.start} is 0x{e.object[e.start]:02x}); save it as UTF-8"
            ) from None
        source = str(path)
    return config_from(cls, raw, overrides, source)


def config_from(
    cls: type[T], raw: dict[str, Any], overrides: list[str] | None, source: str, flag: str = "--set"
) -> T:
    """`cls` from a parsed table plus `a.b=value` overrides (`flag` names where they were given)."""
    parsed = []
    example = _example(cls) if overrides else ""
    for item in overrides or []:
        key, value = parse_override(item, example)
        key = set_dotted(raw, key, value if isinstance(value, list | dict) else _OneValue(value))
        parsed.append((item, key))
    try:
        cfg = from_dict(cls, raw, source=source)
    except ConfigError as e:
        # The bad key first, then where it came from: the one override that names it, else the file.
        body = str(e).removeprefix(f"{source}: ")
        culprit = next((item for item, key in reversed(parsed) if _covers(key, e.key)), None)
        said = f"{flag} {bytes_shown(culprit)}" if culprit else source
        raise ConfigError(f"{body} ({said})", e.key) from None
    # Not a field: a --set equal to a default is otherwise indistinguishable from no --set at all.
    # in the order given: of two that wrote one key the later is named (a dict kept the first's place)
    cfg.__dict__[_OVERRIDES] = [(key, f"{flag} {item}") for item, key in parsed]
    cfg.__dict__[_GIVEN] = set(_tables_and_keys(raw))
    return cfg


def _example(cls: type) -> str:
    """A --set item of `cls`'s own: its first section's first key of a plain value, at its default (a
    data build's line gave the trainer's optim.lr: trial RV75c)."""
    hints = typing.get_type_hints(cls)
    sections = [
        (f"{f.name}.", hints[f.name])
        for f in dataclasses.fields(cls)
        if dataclasses.is_dataclass(hints[f.name])
    ]
    # a config of keys alone (eval's): its first key (the generic line was `section.key=value`)
    for prefix, section in sections or [("", cls)]:
        for key in dataclasses.fields(section):
            value = key.default
            if isinstance(value, str | int | float) and value != "":  # a word: no quotes (parse_override)
                shown = value if isinstance(value, str) and value.isidentifier() else json.dumps(value)
                return f"{prefix}{key.name}={shown}"
    return "section.key=value"


def _tables_and_keys(raw: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, value in raw.items():
        yield prefix + name
        if isinstance(value, dict):
            yield from _tables_and_keys(value, f"{prefix}{name}.")


_OVERRIDES = "_gristmill_overrides"
_GIVEN = "_gristmill_given"  # the dotted tables and keys the file and the overrides wrote (given())


@dataclasses.dataclass(frozen=True)
class _HomePath:
    """The mark of ConfigPath and KeptPath (see there): `expand` the `~`, or keep the value as written."""

    expand: bool


ConfigPath = Annotated[str, _HomePath(expand=True)]
"""A config key of a run or an eval that names a path (`run.output_dir`, `data.dataset`, …): a leading
`~` or `~user` becomes that home directory when the config is loaded, so every command that reads the
key, and the config.toml a run saves, see one path (a data build's keys are expanded where the build
reads them). Expanded at each use instead, one use missed it: `train` made a folder named `~` in the
working directory, and `data.dataset = "~/x"` was read as a relative path (trial RV72c F5, F6). A URL
(`s3://…`) or a hub id never starts with `~`."""

KeptPath = Annotated[str, _HomePath(expand=False)]
"""A data build's path key (`output`, `source.path`, `tokenizer.path`, …): a `~` that names no home is
refused as a ConfigPath's (it was a traceback, "Could not determine home directory": trial RV73a 4), and
the value is kept as written, expanded where the build reads it: the build's identity hashes its recipe
as written, and a build started with `~/corpus` goes on as that."""


def _home_of(value: str) -> str | None:
    """`value` with its leading `~` or `~user` expanded; None where it names no home here (an unknown
    user, HOME set but empty: expanduser made `~/x` the root's `/x`, trial RV73a 5)."""
    if not value.startswith("~"):
        return value
    if value.split("/", 1)[0] == "~" and os.environ.get("HOME", None) == "":
        return None
    expanded = os.path.expanduser(value)
    return None if expanded.startswith("~") else expanded


def _no_home(value: str) -> str:
    name = value.split("/", 1)[0]
    empty = " (HOME is empty)" if name == "~" else ""
    return f"{name} names no home directory here{empty}; write the path out in full"


def _home_expanded(value: str, key: str, source: str) -> str:
    """`value` of ConfigPath `key` with its leading `~` expanded; one that names no home here (HOME
    unset, an unknown user) is refused: kept as written it would become a folder named `~`. So is one of
    blanks alone: a folder of that name (data.cache_dir), a plan printed for a checkpoint.resume train
    then refused (trial RV73a 7), or the working directory."""
    path, why = _as_path(value)
    if why is not None:
        raise ConfigError(f"{source}: {key} = {_shown(value)}: {why}", key)
    return path


def not_utf8(value: str) -> str | None:
    """Why `value` (a command-line value: Python keeps bytes that are not UTF-8 as lone surrogates) can be
    no key's or path's, or None: no file, TOML, tracker or JSON can hold it, and a run wrote half its
    files before a traceback said so (trial RV74c 4)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f'"{bytes_shown(value)}" holds bytes that are not UTF-8 text; write it in UTF-8'
    return None


def bytes_shown(value: str) -> str:
    """`value` as the user typed it, on one line: a byte that is not UTF-8 as \\xNN (not Python's \\udcNN),
    a newline or another control character as its escape (a line each: reviews RV74d 1, RV74f 6)."""
    return "".join(
        c if c.isprintable()
        else f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF  # surrogateescape's byte
        else c.encode("unicode_escape").decode()
        for c in value
    )  # fmt: skip


def _as_path(value: str) -> tuple[str, str | None]:
    """(`value` with its leading `~` expanded, None), or (`value`, why it names no path): blanks alone, a
    blank at either end (" ~/x": a folder named " ~" in the working directory, re-trial RV73e 6), a `~`
    that names no home here. The one rule of a config's path keys and a command's path arguments."""
    if value and not value.strip():
        return value, "blanks are no path; name one"
    if value[:1].isspace() or value[-1:].isspace():  # "out/x ": a folder of that name (RV73f 6)
        return value, f"it {'starts' if value[:1].isspace() else 'ends'} with a blank; remove it"
    if (expanded := _home_of(value)) is None:
        return value, _no_home(value)
    return expanded, None


class CommandParser(argparse.ArgumentParser):
    """argparse's parser for a command whose refusal of its command line is one line, as every other
    bad input's (a GristmillError, printed by the command's caller): argparse printed its usage first,
    ten lines of it for `data inspect`, the refusal last."""

    def error(self, message: str) -> typing.NoReturn:
        # its message holds unrecognized arguments as typed: a newline in one printed two lines
        raise GristmillError(f"{self.prog}: {bytes_shown(message)}; `{self.prog} --help` lists its arguments")


class PathArgument(argparse.Action):
    """argparse action of a command's path argument (`--out DIR`, RUN, a dataset DIR): its leading `~`
    expanded as a ConfigPath's, and a blank one refused (refuse_empty). The shell expands no `~` after
    `--out=` or in quotes: `mix propose --out=~/m` wrote its search into a folder named `~` and its
    proxies, whose run.output_dir is a ConfigPath, into the home directory, and looked for them in the
    first (trial RV73a 1); `export --out=~/x` said `~/x` and wrote `./~/x` (RV73a 2); `data upload ""`
    uploaded the working directory (RV73a 3). Raised here, a GristmillError is the command's one line.
    `append`: each one given is added to a list (argparse's "append", a repeatable option). `local`: a
    path on this machine, a URL refused (an output's `--out s3://b/x` wrote ./s3:/b/x and said s3://b/x:
    review RV74f 3)."""

    def __init__(self, *args, append: bool = False, local: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.append, self.local = append, local

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name = option_string or self.metavar or self.dest.upper()

        def expanded(value: str) -> str:
            refuse_empty({name: value}, required=self.required)
            if (why := not_utf8(value)) is not None:
                raise GristmillError(f"{name} {why}")
            if self.local:
                from training.contract.object_store import refuse_other_urls  # its boto3 only when asked

                refuse_other_urls({name: value})
            path, why = _as_path(value)
            if why is not None:
                raise GristmillError(f"{name} {json.dumps(value)}: {why}")
            return path

        value = [expanded(v) for v in values] if isinstance(values, list) else expanded(values)
        if self.append:  # a new list: the default's is the parser's
            value = [*(getattr(namespace, self.dest, None) or []), value]
        setattr(namespace, self.dest, value)


def given(cfg: Any, key: str) -> bool:
    """Whether load_config's `cfg` had dotted `key` (a table or a key) written by its file or an
    override: a section given that sets only defaults is otherwise indistinguishable from none."""
    return key in getattr(cfg, _GIVEN, ())


def override_of(cfg: Any, key: str) -> str | None:
    """The override that gave dotted `key` to load_config's `cfg`, if any: where it was given and the
    item as the user typed it (`--set data.dataset=x`, a search's `proxy.set data.dataset=x`)."""
    return next((item for k, item in reversed(getattr(cfg, _OVERRIDES, [])) if k == key), None)


def naming_override(error: ConfigError, cfg: Any) -> ConfigError:
    """`error`, from a check of `cfg`, with the override that wrote its key named after it, as a value
    the loader refuses is: a search's check named `optim.weight_decay`, a key of no file of the
    search's, for its proxy.set item (trial RV66f F8)."""
    # the last override that wrote the key or a section holding it, as the loader names one; not one
    # written inside a section whose own check failed (phase[0]'s budget blamed on its lr.peak: RV68d 1)
    given = reversed(getattr(cfg, _OVERRIDES, []))
    said = next((item for key, item in given if _covers(key, error.key, inside=False)), None)
    if said is not None and said not in str(error):
        error.args = (f"{error} ({said})", *error.args[1:])
    return error


def _covers(override_key: str, bad_key: str | None, inside: bool = True) -> bool:
    """Whether a --set of `override_key` wrote `bad_key` (itself, a key or item inside it, or, with
    `inside`, a key of the section `bad_key` whose own check failed)."""
    if bad_key is None:
        return False
    return (
        bad_key == override_key
        or bad_key.startswith((override_key + ".", override_key + "["))
        or (inside and override_key.startswith(bad_key + "."))
    )


def add_config_arguments(parser: argparse.ArgumentParser, recipe: str, example: str) -> None:
    """`--config RECIPE` and `--set KEY=VALUE ...` (into args.config / args.overrides), for every stage."""
    parser.add_argument("--config", required=True, action=PathArgument, help=f"recipe (TOML), e.g. {recipe}")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="extend",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help=f"override config fields, e.g. --set {example} (repeatable)",
    )


def add_resume_argument(parser: argparse.ArgumentParser) -> None:
    """`--resume auto|PATH` (into args.resume), for the trainer's command lines (`gristmill train`,
    `-m training.train`); `with_resume` turns it into its override."""
    parser.add_argument(
        "--resume",
        action=PathArgument,
        metavar="auto|PATH",
        help="continue from the newest complete checkpoint of the run (auto) or from the checkpoint "
        "directory PATH (same as --set checkpoint.resume=...)",
    )


def with_resume(overrides: list[str], resume: str | None) -> list[str]:
    """--resume X as the override checkpoint.resume = "X"; a --set of another checkpoint.resume beside
    it is refused (the later one won without a word: trial RV65b)."""
    if not resume:
        return list(overrides)

    def same(a: Any, b: str) -> bool:  # one checkpoint however written (a trailing slash, relative: RV65f)
        return a == b or ("auto" not in (a, b) and os.path.realpath(str(a)) == os.path.realpath(b))

    for item in overrides:
        key, value = parse_override(item)
        if key == "checkpoint.resume" and not same(value, resume):
            raise ConfigError(
                f"--resume {resume} and --set {item} name two checkpoints to resume from; give one",
                "checkpoint.resume",
            )
    return [*overrides, f"checkpoint.resume={json.dumps(resume)}"]


def parse_override(item: str, example: str = "optim.lr=1e-4") -> tuple[str, Any]:
    """`a.b=1e-4` -> ("a.b", 0.0001). Values are TOML literals; a bare word is taken as a string.
    `example`: a key=value of the command's own config, for the line of an item without "="."""
    if "=" not in item:
        shape = "section.key=value" if "." in example.partition("=")[0] else "key=value"
        raise ConfigError(f"override {item!r} must look like {shape} (e.g. --set {example})")
    key, text = item.split("=", 1)
    key = key.strip()
    text = text.strip()
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # `--set source.kind=parquet` without quotes
    return key, value


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> str:
    """raw[a][b] = value for key "a.b"; `phase[1].seq_len` indexes an array of tables (`phase[-1]`, the
    last, as Python counts: docs/training.md says so). Returns the key with each index counted from the
    start, as a check names what it refuses: `phase[2].seq_len`, which `phase[-1]` wrote, was blamed on
    the file (review RV65d 8)."""
    parts = key.split(".")
    node, named = raw, []
    for part in parts[:-1]:
        name, index = _indexed(part, key)
        child = node.setdefault(name, {})
        if index is not None:
            index = _entry(child, index, name, key)
            child = child[index]
        named.append(part if index is None else f"{name}[{index}]")
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part!r} is a value, not a section")
        node = child
    name, index = _indexed(parts[-1], key)
    if index is None:
        node[name] = value
        return ".".join([*named, name])
    # a whole entry of an array of tables: `--set 'phase[0]={name="a", steps=5}'` (it was called an
    # unknown key 'phase[0]': trial RV65b)
    entries = node.get(name)
    index = _entry(entries, index, name, key)
    if not isinstance(value, dict):
        raise ConfigError(f'override {key}: an entry of {name} is a table, e.g. {key}={{name = "a"}}')
    entries[index] = value
    return ".".join([*named, f"{name}[{index}]"])


def _entry(entries: Any, index: int, name: str, key: str) -> int:
    """`index` of the array of tables `entries` (override `key`'s `name`), counted from the start; a
    ConfigError with the count of entries when there is none there."""
    if not isinstance(entries, list) or not -len(entries) <= index < len(entries):
        have = len(entries) if isinstance(entries, list) else 0
        raise ConfigError(f"override {key}: {name} has {have} entries, not an entry [{index}]")
    return index % len(entries)


@dataclasses.dataclass(frozen=True)
class _OneValue:
    """A scalar given by --set: a list key takes it as a list of one (`--set metrics.trackers=wandb`,
    as lm-eval's `--include_path DIR`); any other key takes the value itself. A TOML file's scalar
    stays a scalar, so a list key there still needs a list."""

    value: Any


def _shown(value: Any) -> str:
    """A value in a message as the user's TOML spells it (["x"], "two", 2024-01-01), not Python's repr."""
    try:
        return _toml_value(_plain(value))
    except TypeError:  # a TOML date or time: its own text
        return str(_plain(value))


def _plain(value: Any) -> Any:
    """`value` with every _OneValue inside it unwrapped (a value of type Any keeps its shape)."""
    if isinstance(value, _OneValue):
        return _plain(value.value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    return value


def _indexed(part: str, key: str) -> tuple[str, int | None]:
    """ "phase[1]" -> ("phase", 1); "data" -> ("data", None)."""
    if not part.endswith("]") or "[" not in part:
        return part, None
    name, _, index = part[:-1].partition("[")
    try:
        return name, int(index)
    except ValueError:
        raise ConfigError(f"override {key}: [{index}] is not a list index") from None


def from_dict(cls: type[T], raw: dict[str, Any], source: str = "config", prefix: str = "") -> T:
    """Recursively build dataclass `cls` from `raw`; unknown keys and wrong types raise ConfigError."""
    raw = raw.value if isinstance(raw, _OneValue) else raw
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: [{prefix.rstrip('.')}] must be a table, got {_shown(raw)}", prefix.rstrip(".")
        )
    fields = {toml_key(f.name): f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls, include_extras=True)  # ConfigPath's mark kept
    for key in raw:
        if key not in fields:
            guess = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean '{prefix}{guess[0]}'?" if guess else ""
            raise ConfigError(
                f"{source}: unknown key '{prefix}{key}'{hint} (valid keys in this section: "
                f"{', '.join(sorted(fields))})",
                f"{prefix}{key}",
            )
    kwargs = {}
    for name, value in raw.items():
        field_name = fields[name].name
        kwargs[field_name] = _coerce(hints[field_name], value, f"{prefix}{name}", source)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{source}: {e}", prefix.rstrip(".") or None) from None  # a section's own check


def _coerce(tp: Any, value: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if isinstance(value, _OneValue) and origin not in (typing.Union, types.UnionType):
        value = [value.value] if origin in (list, tuple) else value.value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source, prefix=f"{key}.")
    if origin is Annotated:
        base, *marks = typing.get_args(tp)
        value = _coerce(base, value, key, source)
        for mark in marks:
            if isinstance(mark, _HomePath):
                expanded = _home_expanded(value, key, source)
                return expanded if mark.expand else value
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key, source)
            except ConfigError as e:
                errors.append(e)
        raise errors[0] if errors else ConfigError(f"{source}: {key} has an invalid value {value!r}", key)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(
                f"{source}: {key} = {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}",
                key,
            )
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{source}: {key} must be a list, got {_shown(value)}", key)
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(item_tp, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key} must be a table, got {_shown(value)}", key)
        # Each value checked against the table's value type and kept as written (a mix's 3 stays 3:
        # the run's config hash is of what was given); a `--set KEY.NAME=V` arrives wrapped: unwrapped.
        _, value_tp = typing.get_args(tp) or (str, Any)
        table = {k: _plain(v) for k, v in value.items()}
        for k, v in table.items():
            _coerce(value_tp, v, f"{key}.{k}", source)
        return table
    if tp is Any:
        return _plain(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key} must be true or false, got {_shown(value)}", key)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key} must be an integer, got {_shown(value)}", key)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{source}: {key} must be a number, got {_shown(value)}", key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key} must be a string, got {_shown(value)}", key)
        if (why := not_utf8(value)) is not None:
            raise ConfigError(f"{source}: {key} = {why}", key)
        return value
    raise ConfigError(f"{source}: {key} has unsupported type {tp}")  # a bug in the dataclass, not the user


def toml_key(field_name: str) -> str:
    """A field named after a Python keyword plus "_" (`async_`) is spelled without it in TOML and
    --set (`checkpoint.async = true`)."""
    if field_name.endswith("_") and keyword.iskeyword(field_name[:-1]):
        return field_name[:-1]
    return field_name


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain data, keyed by the names TOML and --set use."""
    if dataclasses.is_dataclass(cfg):
        return {toml_key(f.name): to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, list | tuple):
        return type(cfg)(to_dict(v) for v in cfg)
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def json_sha256(data: Any, *, compact: bool = True, default: Callable[[Any], Any] | None = None) -> str:
    """SHA-256 (hex) of `data` as canonical JSON: keys sorted, so key order does not matter.

    compact=False hashes json.dumps' default ", " and ": " separators: the form dataset
    fingerprints and the loader's cache keys were recorded in (the other form gives other hashes).
    `default` is json.dumps' hook for values JSON has no type for (unset: such a value is a TypeError).
    """
    separators = (",", ":") if compact else None
    return hashlib.sha256(
        json.dumps(data, sort_keys=True, separators=separators, default=default).encode()
    ).hexdigest()


def config_sha256(cfg: Any) -> str:
    """Stable hash of a resolved config (key order and formatting do not matter)."""
    return json_sha256(to_dict(cfg), default=str)


def tokens_shown(value: float) -> str:
    """A number of tokens a config gives, in a message: 2000000 for 2_000_000 (not :g's 6 digits,
    2e+06: trial RV66a nit), 1e+30, not the 31 digits of its float (a budget a few digits too long:
    RV53c 4)."""
    exact = float(value).is_integer() and abs(float(value)) < 1e16
    return str(int(value)) if exact else repr(float(value))


def shown_value(table: dict[str, Any], key: str) -> str:
    """`table[key]` as a change note shows it (a resume's, a build's): `absent` where the key is not in
    the table (an entry added or gone, a source a mix does not name), `unset` where it is None (left to
    a preset, a base or the code), else its repr; not Python's None, which said neither."""
    if key not in table:
        return "absent"
    return "unset" if table[key] is None else repr(table[key])


def config_changes(old: Any, new: Any) -> list[str]:
    """`key old → new` for every dotted key whose value differs between two configs: a list of
    tables by entry (`phase[2].global_batch_tokens 768 → 384`, as --set names it); other lists whole;
    each side as shown_value shows it (never Python's None: review R30b F4). Where the entries' names
    differ (every entry named, in both), also by name, and the shorter of the two is said: a source
    inserted first is one source added (`data.sources (names) ['web'] → ['extra', 'web']`,
    `data.sources[extra].dataset …`), not every later source changed (review R24a 1), and a phase
    renamed is its name's one change, not every key of it twice, which pushed the other changes out
    of a resume's note (review R24d 1)."""
    old, new = to_dict(old), to_dict(new)
    by_name = _renamed_arrays(old, new)
    ways = [_changes(old, new, frozenset())] + ([_changes(old, new, by_name)] if by_name else [])
    return min(ways, key=len)


def _changes(old: dict[str, Any], new: dict[str, Any], by_name: set[str]) -> list[str]:
    """config_changes' lines, the arrays of tables in `by_name` keyed by their entries' names."""
    flat_old, flat_new = _flatten(old, by_name=by_name), _flatten(new, by_name=by_name)
    return [
        f"{k} {shown_value(flat_old, k)} → {shown_value(flat_new, k)}"
        for k in sorted(flat_old.keys() | flat_new.keys())
        if flat_old.get(k) != flat_new.get(k)
    ]


def _entry_names(v: Any) -> list[str] | None:
    """The names of an array of tables' entries, where each has one of its own, else None."""
    if not _is_table_array(v):
        return None
    names = [entry.get("name") for entry in v]
    ok = all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
    return names if ok else None


def _renamed_arrays(old: Any, new: Any, prefix: str = "") -> set[str]:
    """The dotted keys of the arrays of tables named in both configs whose names differ."""
    out: set[str] = set()
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return out
    for k in old.keys() & new.keys():
        a, b = old[k], new[k]
        if isinstance(a, dict):
            out |= _renamed_arrays(a, b, f"{prefix}{k}.")
        elif (na := _entry_names(a)) is not None and (nb := _entry_names(b)) is not None and na != nb:
            out.add(f"{prefix}{k}")
    return out


def _flatten(d: dict[str, Any], prefix: str = "", by_name: set[str] = frozenset()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}.", by_name))
        elif _is_table_array(v):
            names = _entry_names(v) if f"{prefix}{k}" in by_name else None
            if names is not None:
                out[f"{prefix}{k} (names)"] = names
            for i, entry in enumerate(v):
                out.update(_flatten(entry, f"{prefix}{k}[{i if names is None else names[i]}].", by_name))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def to_toml(cfg: Any) -> str:
    """Render a resolved config as TOML (scalars first, then one table per nested dataclass)."""
    lines: list[str] = []
    _emit_table(to_dict(cfg), [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def save_config(cfg: Any, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, to_toml(cfg))


def _emit_table(d: dict[str, Any], name: list[str], lines: list[str], array: bool = False) -> None:
    """One table: its scalars (nested dicts inline inside an array-of-tables entry), then its
    sub-tables, then its arrays of tables (`[[phase]]`, `[[data.sources]]`)."""
    tables = {k: v for k, v in d.items() if isinstance(v, dict) and not array}
    arrays = {k: v for k, v in d.items() if _is_table_array(v)}
    scalars = {k: v for k, v in d.items() if k not in tables and k not in arrays and v is not None}
    if name:
        lines.append("")
        lines.append(f"[[{'.'.join(name)}]]" if array else f"[{'.'.join(name)}]")
    for k, v in scalars.items():
        lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in tables.items():
        _emit_table(v, name + [k], lines)
    for k, items in arrays.items():
        for item in items:
            _emit_table(item, name + [k], lines, array=True)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list | tuple) and len(v) > 0 and all(isinstance(x, dict) for x in v)


def _toml_key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) else _toml_string(k)


def _toml_string(v: str) -> str:
    """A TOML basic string: `"` and `\\` escaped and the control characters TOML forbids raw (U+0000–
    U+001F but tab, and DEL), every other character as itself. (json.dumps escaped a character past
    U+FFFF as a UTF-16 surrogate pair, which TOML refuses: a run's config.toml that could not be read
    back, for an emoji in metrics.run_name.)"""
    out = []
    for c in v:
        if c in '"\\':
            out.append("\\" + c)
        elif (c < " " and c != "\t") or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (a phase's mix and lr)
        return (
            "{ "
            + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None)
            + " }"
        )
    raise TypeError(f"cannot write {v!r} to TOML")
