"""The data plan's checks before step 1, the same for `gristmill train --plan` and `gristmill train`:
one dataset under two source names, --set data.dataset beside [[data.sources]], a phase longer than
the model, mixes that do not sum to 1; and the run header naming every source's dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from tests.helpers.phased_recipe import write_recipe
from tests.helpers.train_data import make_dataset


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        "web": make_dataset(root / "web", n_docs=240, seed=1),
        "code": make_dataset(root / "code", n_docs=160, seed=2),
    }


def both(config: Path, sets: list[str], capsys) -> list[str]:
    """stderr of `train --plan` and of `train`, each of which must refuse (exit 2) before step 1."""
    errs = []
    for extra in (["--plan"], []):
        assert gristmill(["train", "--config", str(config), *extra, "--set", *sets]) == 2
        errs.append(capsys.readouterr().err)
    assert not (Path(sets[0].split("=", 1)[1].strip('"')) / "metrics.jsonl").exists()
    return errs


@pytest.mark.parametrize("how", ["same directory", "symlink", "copy"])
def test_one_dataset_under_two_source_names_is_refused(sources, tmp_path, capsys, how):
    twin = sources["web"]
    if how == "symlink":
        twin = tmp_path / "link"
        twin.symlink_to(sources["web"], target_is_directory=True)
    elif how == "copy":  # a byte copy has the same fingerprint: the same windows twice
        twin = tmp_path / "copy"
        twin.mkdir()
        for f in sources["web"].rglob("*"):
            if f.is_file():
                (twin / f.relative_to(sources["web"])).parent.mkdir(parents=True, exist_ok=True)
                (twin / f.relative_to(sources["web"])).write_bytes(f.read_bytes())
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {"web": sources["web"], "code": twin}, run)
    for err in both(config, [f'run.output_dir="{run}"'], capsys):
        assert "sources 'web' and 'code' are the same dataset" in err, err
        assert str(sources["web"]) in err and str(twin) in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_set_data_dataset_beside_sources_is_refused_even_at_its_default(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for err in both(config, [f'run.output_dir="{run}"', "data.dataset=runs/data/demo"], capsys):
        assert "--set data.dataset=runs/data/demo" in err and "[[data.sources]]" in err, err


def test_a_phase_longer_than_the_model_is_refused_by_plan_and_train_naming_its_key(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for err in both(config, [f'run.output_dir="{run}"', "model.max_seq_len=32"], capsys):
        assert "phase[1].seq_len = 64 exceeds the model's max_seq_len = 32" in err, err
        assert "data.seq_len" not in err


def test_the_plan_says_when_a_mix_is_normalised_and_the_header_names_every_dataset(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)  # main: 0.6/0.3, long: 0.2/0.4
    assert gristmill(["train", "--config", str(config), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "mix of phase 'main' normalised: web 0.6→0.667, code 0.3→0.333" in out, out
    assert "mix of phase 'long' normalised: web 0.2→0.333, code 0.4→0.667" in out
    sets = ["run.max_steps=1", "run.val_every=0", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    out = capsys.readouterr().out
    assert f"  data    web = {sources['web']}, code = {sources['code']}\n" in out, out
    assert "mix of phase 'main' normalised" in out
