"""The config system: TOML + dotted overrides, unknown keys and wrong types are errors naming the key."""

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from pipelines.build_identity import config_changes as build_config_changes
from training.contract.config_loader import (
    ConfigError,
    config_changes,
    config_sha256,
    json_sha256,
    load_config,
    to_toml,
    with_resume,
)


@dataclass
class Inner:
    lr: float = 3e-4
    """peak learning rate"""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    mode: Literal["a", "b"] = "a"


@dataclass
class Outer:
    name: str = "x"
    workers: int = 1
    flag: bool = False
    path: str | None = None
    optim: Inner = field(default_factory=Inner)


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_load_and_override(tmp_path):
    p = write(tmp_path, 'name = "demo"\n[optim]\nlr = 1\nmode = "b"\n')
    cfg = load_config(Outer, p, ["optim.lr=1e-4", "workers=2", "path=some/where"])
    assert cfg.name == "demo" and cfg.workers == 2 and cfg.path == "some/where"
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float) and cfg.optim.mode == "b"


def test_unknown_key_names_key_and_suggests(tmp_path):
    p = write(tmp_path, "[optim]\nlrr = 1.0\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optim.lrr'.*did you mean 'optim.lr'"):
        load_config(Outer, p)
    with pytest.raises(ConfigError, match="unknown key 'wrokers'"):
        load_config(Outer, None, ["wrokers=2"])


@pytest.mark.parametrize(
    "override, msg",
    [
        ("workers=two", "workers must be an integer"),
        ("flag=1", "flag must be true or false"),
        ("optim.mode=c", "optim.mode = 'c' is not allowed"),
        ("optim.betas=[3, true]", r"optim.betas\[1\] must be a number"),
        ("optim=3", r"\[optim\] must be a table"),
        # the example is a key of the config's own: a data build's was the trainer's optim.lr (trial RV75c)
        ("novalue", r"must look like section.key=value \(e.g. --set optim.lr=0.0003\)"),
    ],
)
def test_wrong_types(override, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(Outer, None, [override])


def test_an_override_without_a_value_is_shown_a_key_of_a_config_of_keys_alone():
    """`gristmill eval --set foo` was shown `section.key=value`, though eval's keys have no section (trial
    RV75e): a config of keys alone is shown its own first key."""

    @dataclass
    class Flat:
        names: list[str] = field(default_factory=list)
        batch_size: int = 8

    with pytest.raises(ConfigError, match=r"must look like key=value \(e.g. --set batch_size=8\)"):
        load_config(Flat, None, ["novalue"])


def test_one_value_for_a_list_key_is_a_one_element_list(tmp_path):
    """`--set metrics.trackers=wandb` as lm-eval's `--include_path DIR`: one value, a list of one; in a
    TOML file a list key still needs a list."""

    @dataclass
    class Lists:
        names: list[str] = field(default_factory=list)
        maybe: list[str] | None = None
        optim: Inner = field(default_factory=Inner)

    cfg = load_config(Lists, None, ["names=wandb", "maybe=tasks/", "optim.betas=0.9"])
    assert cfg.names == ["wandb"] and cfg.maybe == ["tasks/"] and cfg.optim.betas == [0.9]
    assert load_config(Lists, None, ['names=["a", "b"]']).names == ["a", "b"]
    with pytest.raises(ConfigError, match=r"optim.betas must be a list, got 3 \("):
        load_config(Lists, write(tmp_path, "[optim]\nbetas = 3\n"))
    with pytest.raises(ConfigError, match=r'^optim.lr must be a number, got \["x"\] \(--set'):
        load_config(Lists, None, ["optim.lr=['x']"])


def test_round_trip_and_hash(tmp_path):
    cfg = load_config(Outer, None, ["optim.lr=0.5", 'name="a \\"quoted\\" name"'])
    again = load_config(Outer, write(tmp_path, to_toml(cfg)))
    assert again == cfg
    assert config_sha256(again) == config_sha256(cfg)
    assert config_sha256(load_config(Outer, None, ["optim.lr=0.25"])) != config_sha256(cfg)


def test_strings_of_any_character_round_trip(tmp_path):
    """json.dumps wrote a character past U+FFFF as a surrogate pair (\\ud83d\\ude80), which TOML
    refuses: a run named with an emoji trained, and its config.toml could not be read back (resume,
    export, eval, verify). DEL and the other control characters TOML forbids raw are escaped."""
    for name in ("loss 🚀 test", "é ü 中", "tab\there, new\nline", "del\x7f and \x01", 'a "q" \\ b'):
        cfg = Outer(name=name)
        assert load_config(Outer, write(tmp_path, to_toml(cfg))) == cfg


def test_a_key_set_inside_a_table_takes_its_value(tmp_path):
    """`--set build.slurm.sbatch_args.account=myacct`: the value, not the wrapper a --set scalar
    travels in (sbatch got `--account=_OneValue(value='myacct')`, the saved config a table of it),
    a typed table's value checked against its type and kept as written (the run's config hash)."""

    @dataclass
    class Tables:
        args: dict[str, Any] = field(default_factory=dict)
        mix: dict[str, float] = field(default_factory=dict)

    cfg = load_config(Tables, None, ["args.account=myacct", "args.nodes=2", "mix.web=1"])
    assert cfg.args == {"account": "myacct", "nodes": 2} and cfg.mix == {"web": 1}
    assert type(cfg.mix["web"]) is int  # as written: a run's config hash does not move
    assert load_config(Tables, write(tmp_path, to_toml(cfg))) == cfg
    with pytest.raises(ConfigError, match=r'^mix.code must be a number, got "x" \(--set'):
        load_config(Tables, None, ['mix.code="x"'])


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin.toml"
    path.write_bytes('name = "café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.toml: not UTF-8 \(byte 11 is 0xe9\); save it as UTF-8$"):
        load_config(Outer, path)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(Outer, write(tmp_path, "name = \n"))


def test_errors_name_the_override(tmp_path):
    p = write(tmp_path, "workers = 1\n")
    # The bad key first, then the one --set it came from (not the whole list), or the file.
    with pytest.raises(ConfigError, match=r'^workers must be an integer, got "two" \(--set workers=two\)$'):
        load_config(Outer, p, ["optim.lr=1e-4", "workers=two", "name=x"])
    with pytest.raises(ConfigError, match=r"^unknown key 'optim.lrr'.* \(--set optim.lrr=1\)$"):
        load_config(Outer, p, ["workers=2", "optim.lrr=1"])
    bad = write(tmp_path, "workers = 'two'\n")
    with pytest.raises(ConfigError, match=rf'^workers must be an integer, got "two" \({bad}\)$'):
        load_config(Outer, bad, ["name=x"])
    # an editor's byte-order mark: "invalid statement at line 1, column 1" said nothing of it (RV65b)
    marked = tmp_path / "marked.toml"
    marked.write_bytes(b"\xef\xbb\xbfworkers = 1\n")
    with pytest.raises(
        ConfigError, match=r"starts with a UTF-8 byte-order mark, .* save it as UTF-8 without"
    ):
        load_config(Outer, marked)
    # --resume beside a --set of another checkpoint.resume: the later won silently (trial RV65b)
    assert with_resume(["checkpoint.resume='auto'"], "auto")[-1] == 'checkpoint.resume="auto"'
    with pytest.raises(ConfigError, match=r"^--resume auto and --set checkpoint.resume=x/step-10 name two"):
        with_resume(["checkpoint.resume=x/step-10"], "auto")
    here = str(tmp_path / "x" / "step-10")  # one checkpoint written two ways is one (trial RV65f)
    assert with_resume([f"checkpoint.resume={here}/"], os.path.relpath(here))[-1].endswith('step-10"')


@dataclass
class Stage:
    name: str = ""
    steps: int = 1
    mix: dict[str, float] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)


@dataclass
class WithArrays:
    top: int = 0
    stage: list[Stage] = field(default_factory=list)


def test_arrays_of_tables_round_trip_and_take_indexed_overrides(tmp_path):
    """`[[stage]]` tables with inline tables inside (a phase's mix and lr) survive to_toml, and
    `--set 'stage[1].steps=5'` edits one entry; a missing entry or a typo inside one is named."""
    p = write(
        tmp_path,
        '[[stage]]\nname = "a"\nmix = { web = 0.8, "odd name" = 0.2 }\ninner = { lr = 1.0 }\n'
        '[[stage]]\nname = "b"\nsteps = 3\n',
    )
    cfg = load_config(WithArrays, p, ["stage[1].steps=5", "stage[0].inner.mode=b"])
    assert [s.steps for s in cfg.stage] == [1, 5] and cfg.stage[0].inner.mode == "b"
    assert cfg.stage[0].mix == {"web": 0.8, "odd name": 0.2}
    text = to_toml(cfg)
    assert text.count("[[stage]]") == 2
    assert load_config(WithArrays, write(tmp_path, text)) == cfg
    with pytest.raises(ConfigError, match=r"stage has 2 entries, not an entry \[2\]"):
        load_config(WithArrays, p, ["stage[2].steps=1"])
    # counted from the end as Python does (documented in docs/training.md: trial RV64a 2h)
    assert load_config(WithArrays, p, ["stage[-1].steps=7"]).stage[1].steps == 7
    with pytest.raises(ConfigError, match=r"stage has 2 entries, not an entry \[-3\]"):
        load_config(WithArrays, p, ["stage[-3].steps=1"])
    # a whole entry replaced: it was "unknown key 'stage[0]'" (trial RV65b)
    assert load_config(WithArrays, p, ['stage[0]={name = "z", steps = 9}']).stage[0] == Stage("z", 9)
    with pytest.raises(ConfigError, match=r"^override stage\[0\]: an entry of stage is a table"):
        load_config(WithArrays, p, ["stage[0]=3"])
    with pytest.raises(ConfigError) as blamed:  # on the override that wrote it, not the file (RV65d 8)
        load_config(WithArrays, p, ['stage[-1].steps="x"'])
    assert str(blamed.value).endswith("""(--set stage[-1].steps="x")"""), blamed.value
    with pytest.raises(ConfigError, match=r"unknown key 'stage\[1\].stepz'.*did you mean 'stage\[1\].steps'"):
        load_config(WithArrays, p, ["stage[1].stepz=1"])


def test_json_sha256_hashes_the_recorded_forms():
    """The two canonical JSON forms on disk (compact: config and build hashes; json.dumps' default
    separators: dataset fingerprints, loader cache keys) keep their bytes, whatever the key order."""
    data = {"b": [1, 2.5], "a": {"z": None}}
    compact = "edd3af7ccaaa058ba39b134dd251938092c3f4c092a717942522b9aab94003cd"  # of '{"a":{"z":null},...'
    spaced = "33d56cc9ddb706d71f22470acc1a4734ecf74d7a6ee16442602614b238bd3a52"  # of '{"a": {"z": null}, ...'
    assert json_sha256(data) == json_sha256(dict(reversed(data.items()))) == compact
    assert json_sha256(data, compact=False) == spaced


def test_a_change_from_or_to_a_key_not_set_says_absent_or_unset_not_none():
    """A mix weight a phase did not name (weight 0), an entry added or removed, a key left to its
    preset: a resume's note said `phase[2].mix.code None → 0.3`, Python's word (review R30b F4); and an
    entry removed read `unset`, as if it stayed with its preset (review RV31b F7): `absent`."""
    old = {
        "phase": [{"name": "a", "mix": {"web": 1.0}}, {"name": "b", "steps": 20}],
        "run": {"max_steps": 30},
    }
    new = {
        "phase": [{"name": "a", "mix": {"web": 0.7, "code": 0.3}}, {"name": "b"}],
        "run": {"max_steps": None},
    }
    assert config_changes(old, new) == [
        "phase[0].mix.code absent → 0.3",
        "phase[0].mix.web 1.0 → 0.7",
        "phase[1].steps 20 → absent",
        "run.max_steps 30 → unset",
    ]
    assert config_changes(new, {**new, "phase": new["phase"][:1]}) == ["phase[1].name 'b' → absent"]


def test_a_build_s_changed_settings_say_absent_not_none():
    """A build's "changed since" refusal (build_identity.config_changes) shows a setting added or gone as
    a resume's note does (shown_value), not as Python's None."""
    was = {"filters": {"min_chars": 100}, "input_files": []}
    now = {"filters": {"min_chars": 100, "max_chars": 5000}, "dedup": {"kind": "exact"}, "input_files": []}
    assert build_config_changes(was, now) == [
        "dedup: absent → {'kind': 'exact'}",
        "filters.max_chars: absent → 5000",
    ]
