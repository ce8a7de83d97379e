"""The config system: TOML + dotted overrides, unknown keys and wrong types are errors naming the key."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from training.contract.config_loader import ConfigError, config_sha256, load_config, to_toml


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
        ("optim.betas=3", "optim.betas must be a list"),
        ("optim=3", r"\[optim\] must be a table"),
        ("novalue", "must look like section.key=value"),
    ],
)
def test_wrong_types(override, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(Outer, None, [override])


def test_round_trip_and_hash(tmp_path):
    cfg = load_config(Outer, None, ["optim.lr=0.5", 'name="a \\"quoted\\" name"'])
    again = load_config(Outer, write(tmp_path, to_toml(cfg)))
    assert again == cfg
    assert config_sha256(again) == config_sha256(cfg)
    assert config_sha256(load_config(Outer, None, ["optim.lr=0.25"])) != config_sha256(cfg)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(Outer, write(tmp_path, "name = \n"))


def test_errors_name_the_override(tmp_path):
    p = write(tmp_path, "workers = 1\n")
    # The bad key first, then the one --set it came from (not the whole list), or the file.
    with pytest.raises(ConfigError, match=r"^workers must be an integer, got 'two' \(--set workers=two\)$"):
        load_config(Outer, p, ["optim.lr=1e-4", "workers=two", "name=x"])
    with pytest.raises(ConfigError, match=r"^unknown key 'optim.lrr'.* \(--set optim.lrr=1\)$"):
        load_config(Outer, p, ["workers=2", "optim.lrr=1"])
    bad = write(tmp_path, "workers = 'two'\n")
    with pytest.raises(ConfigError, match=rf"^workers must be an integer, got 'two' \({bad}\)$"):
        load_config(Outer, bad, ["name=x"])
