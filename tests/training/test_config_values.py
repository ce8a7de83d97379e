"""Numbers the recipe cannot train with are refused by check_config, before torch is imported: one
line naming the key, the value and what is allowed. TOML spells nan and inf as plain floats, and
every comparison with nan is false, so a `< 0` test alone would let them through (a nan grad_clip
silently turned clipping off; a zero init_std trained nothing, at a flat loss)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import load_train_config
from training.contract.config_loader import ConfigError
from training.data.spec import check_config

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/train/tiny.toml")
PHASED = ["schedule.steps=1000", "schedule.warmup_steps=100"]  # [[phase]] needs [schedule] at its defaults


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        check_config(load_train_config(TINY, list(overrides)), 1)
    return str(e.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lr=inf", "optim.lr = inf is not allowed: it must be a finite number > 0"),
        ("optim.lr=nan", "optim.lr = nan is not allowed: it must be a finite number > 0"),
        ("optim.lr=0", "optim.lr = 0.0 is not allowed: it must be a finite number > 0"),
        (
            "optim.grad_clip=nan",
            "optim.grad_clip = nan is not allowed: it must be a finite number ≥ 0 (0: no clipping)",
        ),
        ("optim.grad_clip=inf", "optim.grad_clip = inf is not allowed"),
        ("optim.eps=0", "optim.eps = 0.0 is not allowed: it must be a finite number > 0"),
        ("optim.eps=-1e-8", "optim.eps = -1e-08 is not allowed"),
        ("optim.weight_decay=nan", "optim.weight_decay = nan is not allowed: it must be a finite number ≥ 0"),
        ("optim.min_lr=nan", "need 0 ≤ optim.min_lr ≤ optim.lr; got lr 0.003, min_lr nan"),
        ("optim.min_lr=1", "need 0 ≤ optim.min_lr ≤ optim.lr; got lr 0.003, min_lr 1.0"),
        ("model.norm_eps=-1", "model.norm_eps = -1.0 is not allowed: it must be a finite number > 0"),
        ("model.norm_eps=0", "model.norm_eps = 0.0 is not allowed"),
        ("model.rope_theta=-1", "model.rope_theta = -1.0 is not allowed: it must be a finite number > 0"),
        ("model.rope_theta=inf", "model.rope_theta = inf is not allowed"),
        ("model.init_std=0", "model.init_std = 0.0 is not allowed: it must be a finite number > 0"),
        ("model.init_std=nan", "model.init_std = nan is not allowed"),
        ("model.n_heads=0", "model.n_heads = 0 is not allowed: it must be ≥ 1"),
        ("model.loss_chunk=-1", "model.loss_chunk = -1 is not allowed: it must be ≥ 0"),
        ("run.spike_sigma=nan", "run.spike_sigma = nan is not allowed: it must be a finite number ≥ 0"),
        ("checkpoint.min_free_factor=nan", "checkpoint.min_free_factor = nan is not allowed"),
        ("data.val_fraction=nan", "val_fraction = nan of source 'data' must be in [0, 1)"),
        ("optim.betas=[0.9, nan]", "optim.betas = [0.9, nan] must be two numbers in [0, 1)"),
        ("parallel.shard=0", "parallel.shard = 0 must be ≥ 1 or -1 (= world_size // replicate)"),
        # its advice once said to raise schedule.steps, which a resume past the warmup refuses; a saved
        # config.toml keeps a max_steps, which 0 did not undo and nothing said what does (trial RV61b)
        (
            "run.max_steps=2000",
            "run.max_steps = 2000 must be between 1 and the plan's 40 steps (it stops a run "
            "inside its plan; run.max_steps = 40 trains to the plan's end, as leaving it out does; to "
            "train past that end, add a [[phase]] after the last",
        ),
        ("run.max_steps=0", "run.max_steps = 40 trains to the plan's end, as leaving it out does"),
        ("parallel.replicate=-1", "parallel.replicate = -1 must be ≥ 1"),
        # a traceback mid-setup (torch.manual_seed), a lock file left behind
        ("run.seed=100000000000000000000000", "run.seed = 100000000000000000000000 does not fit in 64 bits"),
        # reduced modulo 2**64 by the loader's keys: seed 0's batches (trial RV65b 5)
        ("data.seed=18446744073709551616", "data.seed = 18446744073709551616 does not fit in 64 bits"),
    ],
)
def test_a_number_the_run_cannot_use_is_one_config_error(override, message):
    assert message in refusal(override)


@pytest.mark.parametrize(
    "phase, message",
    [
        ('{name="a", tokens=nan}', "phase[0].tokens = nan is not allowed: it must be a finite number > 0"),
        ('{name="a", steps=10, lr={warmup_tokens=nan}}', "phase[0].lr.warmup_tokens = nan is not allowed"),
        ('{name="a", steps=10, lr={peak=inf}}', "phase[0].lr.peak = inf is not allowed"),
        ('{name="a", steps=10, lr={to=nan}}', "phase[0].lr.to = nan is not allowed"),
    ],
)
def test_a_phase_number_the_run_cannot_use_is_one_config_error(phase, message):
    assert message in refusal(*PHASED, f"phase=[{phase}]")


def test_zeros_that_mean_off_are_allowed():
    ok = ["optim.weight_decay=0", "optim.grad_clip=0", "optim.min_lr=0", "schedule.warmup_steps=0"]
    ok += ["run.spike_sigma=0", "checkpoint.min_free_factor=0", "model.loss_chunk=0"]
    check_config(load_train_config(TINY, ok), 1)
    check_config(load_train_config(TINY, [*PHASED, 'phase=[{name="a", steps=10, lr={peak=0, to=0}}]']), 1)


def test_a_seq_len_longer_than_the_batch_gets_one_suggestion():
    """1024 tokens per step, seq_len 4096: there is no lower multiple, so not "use 4096 or 4096"."""
    message = refusal("data.seq_len=4096")
    assert "4096 or 4096" not in message
    assert message == (
        "data.global_batch_tokens = 1024 is not a multiple of data.seq_len = 4096; use "
        "data.global_batch_tokens = 4096 (one sequence per step) or a multiple of it, or a data.seq_len "
        "that divides 1024"
    )
    assert refusal("data.seq_len=48").endswith("use 1008 or 1056")  # two multiples around it


PROBE = """
import json, sys
from pipelines.cli import main
code = main(sys.argv[1:])
print("CLI-PROBE " + json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize(
    "override, said",
    [
        ("optim.lr=inf", "is not allowed"),
        ("model.init_std=0", "is not allowed"),
        # a segfault ("can't start new thread") past what the machine has (trial RV65b 1)
        ("run.threads=100000", f"is more than this machine's {os.cpu_count()} CPUs"),
    ],
)
def test_gristmill_train_refuses_it_in_one_line_before_torch(override, said):
    argv = ["train", "--config", TINY, "--set", override]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert json.loads(proc.stdout.rsplit("CLI-PROBE ", 1)[1]) == {"code": 2, "torch": False}
    key = override.split("=")[0]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {key} = ") and said in line, line


def test_a_run_trained_with_more_threads_than_here_is_read_here():
    """run.threads is the trainer's, checked where it starts them: in the config's checks, `verify RUN`
    and `data inspect RUN` of a run trained on a bigger machine refused it (review RV65e 2)."""
    check_config(load_train_config(TINY, [f"run.threads={(os.cpu_count() or 1) + 1}"]), 1)


def test_an_empty_run_output_dir_is_one_line_not_the_working_directory(
    synthetic_dataset, tmp_path, monkeypatch, capsys
):
    """run.output_dir = "" resolved to the working directory, which got the run's checkpoints,
    config.toml, metrics.jsonl and lock. `--plan` refuses it as the run does (it printed a plan, exit 0),
    the value quoted as given ("   " was quoted as ""); so is an empty data.dataset, which was called
    ". is not a gristmill dataset" without naming the key (trial RV72c F9)."""
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    data = f"data.dataset={json.dumps(str(synthetic_dataset()))}"
    for plan in ([], ["--plan"]):
        sets = [data, 'run.output_dir=""', "run.threads=1"]
        assert main(["train", "--config", TINY, *plan, "--set", *sets]) == 2
        err = capsys.readouterr().err.strip()
        said = 'run.output_dir = "": name the run\'s directory, e.g. "runs/train/mine"'
        assert err == f'error: {said} (--set run.output_dir="")', err
        assert main(["train", "--config", TINY, *plan, "--set", 'data.dataset=""']) == 2
        err = capsys.readouterr().err.strip()
        said = 'data.dataset = "": name the dataset\'s directory (or s3:// URL), e.g. '
        assert err == f'error: {said}data.dataset = "runs/data/demo" (--set data.dataset="")', err
        # blanks, for any path key: a plan printed for a checkpoint.resume train refused, a cache folder
        # named "  " (trial RV73a 7)
        for key in (
            "run.output_dir",
            "data.dataset",
            "checkpoint.resume",
            "data.cache_dir",
            "model.init_from",
        ):
            assert main(["train", "--config", TINY, *plan, "--set", data, f'{key}="  "']) == 2
            err = capsys.readouterr().err.strip()
            assert err == f'error: {key} = "  ": blanks are no path; name one (--set {key}="  ")', err
        assert main(["train", "--config", TINY, *plan, "--set", data, 'data.cache_dir=" ~/c"']) == 2
        err = capsys.readouterr().err.strip()  # a folder named " ~" (re-trial RV73e 6)
        assert err.startswith('error: data.cache_dir = " ~/c": it starts with a blank; remove it'), err
    assert list(tmp_path.iterdir()) == []


def test_a_run_into_a_dataset_s_directory_is_refused_before_it_writes(synthetic_dataset, tmp_path, capsys):
    """A run into a dataset's directory replaced its config.toml (the build's recipe: its validation then
    failed) and wrote its files beside the shards; one inside its shards/ (or another of its folders),
    files its validation fails. Refused by --plan and train in one line, the dataset untouched (trial
    RV74c 1)."""
    from pipelines.cli import main

    dataset = tmp_path / "data"
    shutil.copytree(synthetic_dataset(), dataset)
    before = sorted((p.relative_to(dataset), p.read_bytes()) for p in dataset.rglob("*") if p.is_file())
    data = f"data.dataset={json.dumps(str(dataset))}"
    record = dataset / "dataset.json"
    for out, where in (
        (dataset, "holds dataset.json: a dataset; give the run a directory of its own"),
        (dataset / "shards" / "run", f"lies inside {dataset / 'shards'}, a folder of the dataset there"),
        (dataset / "dedup" / "run", f"lies inside {dataset / 'dedup'}, a folder of the dataset there"),
        # a file: "cannot write …: File exists; make it writable" (trial RV74c 8)
        (record, "is a file; name a directory for the run"),
        (record / "run", f"lies under {record}, a file; name a directory for the run"),
    ):
        for plan in ([], ["--plan"]):
            sets = [data, f"run.output_dir={json.dumps(str(out))}", "run.threads=1"]
            assert main(["train", "--config", TINY, *plan, "--set", *sets]) == 2
            err = capsys.readouterr().err.strip()
            said = f"error: run.output_dir = {json.dumps(str(out))} {where}"
            assert err.startswith(said) and err.endswith(f" (--set {sets[1]})") and "\n" not in err, err
    assert (
        sorted((p.relative_to(dataset), p.read_bytes()) for p in dataset.rglob("*") if p.is_file()) == before
    )
    # a folder of the user's beside the dataset's own (DATASET/runs/…): its runs resumed before (RV74d 2)
    beside = f"run.output_dir={json.dumps(str(dataset / 'runs' / 'r1'))}"
    assert main(["train", "--config", TINY, "--plan", "--set", data, beside]) == 0
    notes = tmp_path / "notes"  # a build.json of the user's is no dataset's (review RV74d 2)
    notes.mkdir()
    (notes / "build.json").write_text('{"name": "notes"}')
    assert main(["train", "--config", TINY, "--plan", "--set", data, f"run.output_dir={notes}"]) == 0


def test_a_tilde_in_a_path_key_is_the_home_directory(synthetic_dataset, tmp_path, monkeypatch, capsys):
    """A leading ~ in a key that names a path is the home directory for every command, as `data build`'s
    output took it: `train` made a folder named `~` in the working directory (its plan, tensorboard,
    lock …), then failed writing to the expanded path; `--plan` called data.dataset = "~/x" a relative
    path not found from the working directory (trial RV72c F5, F6). The run's config.toml keeps the path
    expanded, which every later command reads."""
    import shutil

    from pipelines.cli import main
    from training.contract.config_loader import load_config
    from validation.eval import EvalConfig

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    shutil.copytree(synthetic_dataset(), home / "data")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    paths = [
        'model.init_from="~/base"', 'data.cache_dir="~/cache"', 'checkpoint.resume="~/run/checkpoints/x"',
    ]  # fmt: skip
    cfg = load_train_config(TINY, ['run.output_dir="~/run"', 'data.dataset="~/data"', *paths])
    said = (cfg.run.output_dir, cfg.data.dataset, cfg.model.init_from, cfg.data.cache_dir)
    said += (cfg.checkpoint.resume,)
    assert said == tuple(str(home / p) for p in ("run", "data", "base", "cache", "run/checkpoints/x")), said
    sources = load_train_config(TINY, ['data.sources=[{name = "a", dataset = "~/data"}]'])
    assert sources.data.sources[0].dataset == str(home / "data")
    assert load_config(EvalConfig, None, ['include_path="~/tasks"']).include_path == [str(home / "tasks")]
    from pipelines.config import DataConfig  # a build's kept as written: its identity hashes its recipe so

    assert load_config(DataConfig, None, ['output="~/ds"', 'source.path="~/c"']).source.path == "~/c"
    with pytest.raises(ConfigError) as e:  # a home that is not there: never a folder named `~`
        load_train_config(TINY, ['run.output_dir="~no-such-user-here/run"'])
    assert str(e.value).startswith('run.output_dir = "~no-such-user-here/run": ~no-such-user-here names no')
    sets = ['data.dataset="~/data"', 'run.output_dir="~/run"', "run.threads=1", "schedule.steps=2"]
    sets += ["schedule.warmup_steps=1", "data.val_fraction=0", "checkpoint.interval=0", "metrics.plot=false"]
    assert main(["train", "--config", TINY, "--plan", "--set", *sets]) == 0, capsys.readouterr().err
    assert main(["train", "--config", TINY, "--set", *sets]) == 0, capsys.readouterr().err
    assert list(work.iterdir()) == []
    assert load_train_config(str(home / "run" / "config.toml"), []).run.output_dir == str(home / "run")


def test_the_can_never_rewind_warning_advises_what_would_let_it():
    """The settings named are those that would make a rewind possible (reviews RV65d 6, RV65e 4)."""
    from training.config_checks import rewind_unreachable

    def advice(*sets: str, steps: int = 10, saved=(), after: int = 0) -> str | None:
        cfg = load_train_config(TINY, ["run.on_spike='rewind'", *sets])
        warned = rewind_unreachable(cfg, steps, saved, 0, after)
        return warned and warned.rsplit("; ", 1)[1]

    margin = "run.rewind.margin_steps="
    assert (
        advice("checkpoint.interval=8", f"{margin}5")
        == "lower run.rewind.margin_steps to 2 or less, or checkpoint.interval"
    )
    assert (
        advice("checkpoint.interval=20", f"{margin}10")
        == "lower run.rewind.margin_steps and checkpoint.interval"
    )
    assert (
        advice("checkpoint.interval=8", f"{margin}9", saved=[2, 4], after=5)
        == "lower run.rewind.margin_steps to 8 or less"
    )
    assert advice("checkpoint.interval=4", f"{margin}2") is None
    # the only save is at the last step: no margin reaches it, a negative one is refused, and a spike's
    # own step is judged before it is saved, so margin 0 is no better (trial RV68b F1)
    assert advice("checkpoint.interval=10", f"{margin}2") == "lower checkpoint.interval"
    assert advice("checkpoint.interval=10", f"{margin}0") == "lower checkpoint.interval"
    assert advice("checkpoint.interval=4", f"{margin}2", saved=[4, 8], after=10) is None  # nothing to train


# What each command's path arguments are called (argparse dests); every one is a PathArgument
PATH_DESTS = {"config", "resume", "out", "plot", "dataset", "cache_dir", "run", "dir", "dirs", "old", "new"}
PATH_DESTS |= {"to", "source", "plots", "db", "include_path"}
DEMO_STAGES = ("data", "code", "train", "eval", "continue", "rewind", "bucket")
PATH_DESTS |= {f"{stage}_config" for stage in DEMO_STAGES}


def test_every_command_line_path_expands_a_tilde_and_refuses_a_blank(tmp_path, monkeypatch):
    """No shell expands `~` after `--out=` or in quotes: `mix propose --out=~/m` put its search in a folder
    named `~` and its proxies, whose run.output_dir the loader expands, in the home directory (trial
    RV73a 1); `export --out=~/x` said `~/x` and wrote `./~/x` (RV73a 2). A blank positional was the
    working directory: `data upload "" URL` uploaded it (RV73a 3). Every command's path argument is
    expanded as a config's path key is, and a blank one or a `~` naming no home is refused, one line."""
    import argparse
    import importlib

    from pipelines.cli import COMMANDS
    from training.contract.config_loader import PathArgument
    from training.contract.errors import GristmillError

    seen = set()
    for words, (module_name, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=" ".join(words))
        importlib.import_module(module_name).add_arguments(parser)
        for action in parser._actions:
            if action.dest in PATH_DESTS:
                assert isinstance(action, PathArgument), (words, action.dest)
                seen.add(action.dest)
    assert seen == PATH_DESTS, PATH_DESTS - seen
    from training.checkpoint.hf_export import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    monkeypatch.setenv("HOME", str(tmp_path))
    args = parser.parse_args(["~/run", "--out=~/x"])
    assert (args.run, args.out) == (str(tmp_path / "run"), str(tmp_path / "x"))
    assert parser.parse_args(["a/~/run"]).run == "a/~/run"
    for argv, said in [
        (["", "--out=x"], 'RUN "": name a path'),
        (["  "], 'RUN "  ": name a path'),
        (["r", "--out", ""], '--out "": name a path, or leave the option out'),
        (
            ["r", "--out", " ~/x"],
            '--out " ~/x": it starts with a blank; remove it',
        ),  # a folder " ~" (RV73e 6)
        (["r", "--out", "out/x "], '--out "out/x ": it ends with a blank; remove it'),  # (trial RV73f 6)
        (
            ["r", "--out=~no-such-user-here/x"],
            '--out "~no-such-user-here/x": ~no-such-user-here names no home',
        ),
    ]:
        with pytest.raises(GristmillError) as e:
            parser.parse_args(argv)
        assert str(e.value).startswith(said), e.value
    from pipelines.decontam.index import add_arguments as index_arguments

    parser = argparse.ArgumentParser()  # a repeatable one: each given, expanded (re-trial RV73d 4)
    index_arguments(parser)
    args = parser.parse_args(["--tasks", "t", "--out", "o", "--include-path=~/a", "--include-path", "b"])
    assert args.include_path == [str(tmp_path / "a"), "b"]
    assert parser.parse_args(["--tasks", "t", "--out", "o"]).include_path == []
    monkeypatch.setenv("HOME", "")  # expanduser made ~/x the root's /x
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(GristmillError) as e:
        parser.parse_args(["~/run"])
    assert (
        str(e.value)
        == 'RUN "~/run": ~ names no home directory here (HOME is empty); write the path out in full'
    )


def test_a_recipe_s_data_dataset_gives_way_to_sources_set_beside_it_as_empty(synthetic_dataset):
    """data.dataset beside [[data.sources]] is refused; a --set cannot remove a recipe's data.dataset, so
    "" is none: a recipe naming one could not be switched to sources from the command line (trial RV73f
    7)."""
    sources = f'data.sources=[{{name = "a", dataset = "{synthetic_dataset()}"}}]'
    with pytest.raises(ConfigError) as e:
        check_config(load_train_config(TINY, [sources, 'data.dataset="x"']), 1)
    assert str(e.value).startswith('--set data.dataset="x" and [[data.sources]] are both set'), e.value
    spec = check_config(load_train_config(TINY, [sources, 'data.dataset=""']), 1)
    assert [s.name for s in spec.sources] == ["a"]


def test_plan_refuses_the_resume_paths_train_refuses(synthetic_dataset, tmp_path, capsys):
    """`train --plan --resume DATASET` (or a path that is none) printed a plan, exit 0, where train
    refuses both in one line (trial RV74c 5): --plan says what train would."""
    from pipelines.cli import main

    dataset = synthetic_dataset()
    missing = tmp_path / "nope"
    for run, (resume, said) in enumerate((
        (dataset, f"{dataset} holds dataset.json: a dataset, not a checkpoint (RUN/checkpoints/step-N)"),
        (missing, "no such checkpoint directory; give a checkpoint's path (RUN/checkpoints/step-N)"),
    )):  # fmt: skip
        run = tmp_path / f"run{run}"
        sets = [f"data.dataset={json.dumps(str(dataset))}", f"run.output_dir={json.dumps(str(run))}"]
        for plan in (["--plan"], []):
            assert main(["train", "--config", TINY, *plan, "--resume", str(resume), "--set", *sets]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"error: --resume {resume}: {said}") and "\n" not in err, err
            assert not plan or not run.exists()  # (train takes the run directory's lock first)


def test_a_value_that_is_not_utf8_is_one_line_before_any_work(synthetic_dataset, tmp_path, capsys):
    """A byte that is not UTF-8 in a --set value or a path argument (Python keeps it as a lone
    surrogate) was a traceback from the first file or tracker that wrote it, after the run's first files
    (trial RV74c 4): one line naming the key as typed, nothing written."""
    from pipelines.cli import main

    odd = "a\udcffb"  # the bytes a, 0xff, b as sys.argv holds them
    data = f"data.dataset={json.dumps(str(synthetic_dataset()))}"
    for key in ("run.output_dir", "metrics.run_name"):
        value = str(tmp_path / odd) if key == "run.output_dir" else odd
        sets = [data, f"run.output_dir={json.dumps(str(tmp_path / 'run'))}", f"{key}={value}"]
        assert main(["train", "--config", TINY, "--set", *sets]) == 2
        shown = value.replace("\udcff", "\\xff")
        assert capsys.readouterr().err.strip() == (
            f'error: {key} = "{shown}" holds bytes that are not UTF-8 text; write it in UTF-8 '
            f"(--set {key}={shown})"
        )
    assert main(["data", "audit", str(tmp_path), "--sql", f"SELECT\n'{odd}'"]) == 2  # duckdb's TypeError
    assert capsys.readouterr().err == (  # on one line (review RV74f 6)
        "error: --sql \"SELECT\\n'a\\xffb'\" holds bytes that are not UTF-8 text; write it in UTF-8\n"
    )
    assert main(["data", "validate", str(tmp_path / odd)]) == 2
    assert capsys.readouterr().err.strip() == (
        f'error: DIR "{tmp_path}/a\\xffb" holds bytes that are not UTF-8 text; write it in UTF-8'
    )
    assert list(tmp_path.iterdir()) == []
