"""The `gristmill` command table: listing the commands imports no stage, and every entry is real."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import COMMANDS, main

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "datatrove", "duckdb", "lm_eval", "transformers")

# A fresh interpreter: this one has imported half the project by now.
PROBE = f"""
import json, sys
from pipelines.cli import main
code = main(sys.argv[1:])
heavy = sorted({{m.partition(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print("CLI-PROBE " + json.dumps({{"code": code, "heavy": heavy}}))
"""


@pytest.mark.parametrize("argv", [["--help"], ["-h"], [], ["no-such-command"]])
def test_listing_the_commands_imports_no_stage(argv):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout.rsplit("CLI-PROBE ", 1)[1])
    assert probe["heavy"] == [], f"`gristmill {' '.join(argv)}` imported {probe['heavy']}"
    assert probe["code"] == (2 if argv == ["no-such-command"] else 0)
    if argv == ["no-such-command"]:  # one line, not the listing
        assert (
            proc.stderr == "error: `gristmill no-such-command` is no command; `gristmill --help` lists them\n"
        )
        return
    for words, (_, help_text) in COMMANDS.items():
        assert f"  {' '.join(words):<20} {help_text}" in proc.stdout


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["trian", "--config", "x.toml"], "train"),  # a typo of a whole command
        (["data", "biuld"], "data build"),  # of a group's command
        (["build"], "data build"),  # a command's last word alone
        (["propose", "--out", "m"], "mix propose"),
        (["evaluate"], "eval"),  # a word a command begins
        (["trainn"], "train"),  # not tokenizer train
        (["tokenizer", "trian"], "tokenizer train"),  # in a group, its own (review RV74d 6)
        (["data", "de"], "data decontam-index"),  # the group's command it begins, not demo
        (["dta", "build"], "data build"),  # a group's word misspelled
        (["trian", "-h"], "train"),  # the typo's line, not the listing
        (["tokenize"], "tokenizer train"),  # a group's word alone, misspelled: its one command
    ],
)
def test_words_near_a_command_are_one_line_naming_it(argv, meant, capsys):
    assert main(argv) == 2
    typed = " ".join(argv[:2] if argv[0] in ("data", "tokenizer", "dta") else argv[:1])
    assert capsys.readouterr().err == (
        f"error: `gristmill {typed}` is no command; did you mean `gristmill {meant}`? "
        "`gristmill --help` lists them\n"
    )


def test_a_group_word_cut_short_is_told_the_group_and_its_commands(capsys):
    """`gristmill dat`: no suggestion, where `gristmill data` is one word away."""
    assert main(["dat"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `gristmill dat` is no command; did you mean `gristmill data` and one of")
    assert "(build, " in err and "validate" in err and err.endswith("`gristmill --help` lists them\n"), err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["verify", "RUN", "--step", "abc"], "gristmill verify: argument --step: invalid int value: 'abc'"),
        (["data", "inspect"], "gristmill data inspect: the following arguments are required: DATASET"),
        (["train", "--config"], "gristmill train: argument --config: expected one argument"),
        (["eval", "RUN", "--limit", "5"], "gristmill eval: unrecognized arguments: --limit 5"),
        (["verify", "RUN", "a\nb"], "gristmill verify: unrecognized arguments: a\\nb"),  # one line (RV77c 5)
    ],
)
def test_a_command_line_argparse_refuses_is_one_line(argv, said, capsys):
    """argparse printed its usage before its refusal: ten lines for `data inspect`, the one that says
    what is wrong last. Bad input is one line, with where the arguments are listed."""
    assert main(argv) == 2
    command = said.split(":", 1)[0]
    assert capsys.readouterr().err == f"error: {said}; `{command} --help` lists its arguments\n"


def test_blank_or_unprintable_words_are_one_line(capsys):
    """`gristmill ""` (an unset variable) was an IndexError traceback; a newline in a word printed the
    line across two (review RV74d 1)."""
    for argv, shown in (
        ([""], '""'),
        ([" "], '" "'),
        (["a\nb"], "a\\nb"),
        (["tr\udcffin"], "tr\\xffin"),
        (["", "train"], '"" train'),  # (review RV74f 5: "gristmill  train is no command")
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: `gristmill {shown}` is no command; ") and err.count("\n") == 1, err


def test_a_group_alone_names_its_commands(capsys):
    assert main(["mix"]) == 2
    assert (
        capsys.readouterr().err
        == "error: `gristmill mix` needs a command after it: `gristmill mix propose`\n"
    )
    assert main(["data", "--help"]) == 0  # the listing, as `gristmill --help`
    assert "  data build " in capsys.readouterr().out


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_every_command_module_has_add_arguments_and_run(words):
    module_name, help_text = COMMANDS[words]
    module = importlib.import_module(module_name)
    assert callable(module.add_arguments) and callable(module.run), module_name
    assert help_text and "\n" not in help_text


def test_a_command_help_uses_the_table(capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", "index", "--help"])
    assert e.value.code == 0
    assert COMMANDS[("data", "index")][1] in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "sets, message",
    [
        (["optim.lrr=1"], "unknown key 'optim.lrr'"),
        (["data.micro_batch=5"], "is not divisible by 1 data-parallel rank"),
    ],
)
def test_a_train_config_error_comes_before_torch(sets, message):
    """`gristmill train` with a typo or impossible batch arithmetic: one line, exit 2, torch never
    imported (it answers in a fraction of a second instead of the 4–8 s torch takes to import)."""
    argv = ["train", "--config", "configs/train/tiny.toml", "--set", *sets]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    probe = json.loads(proc.stdout.rsplit("CLI-PROBE ", 1)[1])
    assert probe == {"code": 2, "heavy": []}
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_reader_that_goes_away_is_not_a_traceback(built_dataset):
    """`gristmill data audit DIR | head -1` ended in a BrokenPipeError traceback."""
    sql = "SELECT * FROM range(300000)"  # more than a pipe holds: the write after `head` left fails
    cmd = f"{sys.executable} -m pipelines.cli data audit {built_dataset} --sql '{sql}' --format csv | head -1"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.strip() and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, (
        proc.stderr
    )


def test_the_help_texts_match_what_they_describe(capsys):
    """Issue 37 item 16: `gristmill --help` lists the stages the demo runs, in its order;
    `data audit --help` names every view and the page that documents them (docs/audit.md, not the
    README); docs/divergence.md describes the spike fault the demo sets."""
    import re

    from pipelines.demo import SPIKE

    assert main(["--help"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("demo "))
    announced = re.findall(r'stages\.start\("(\w+)"', (ROOT / "pipelines" / "demo.py").read_text())
    assert line.split(": ", 1)[1].split(" → ") == announced and len(announced) == len(set(announced)) > 6
    with pytest.raises(SystemExit):
        main(["data", "audit", "--help"])
    help_text = capsys.readouterr().out
    views = help_text.split("views: ", 1)[1].split(";")[0].split(", ")
    doc = (ROOT / "docs" / "audit.md").read_text()
    assert "docs/audit.md#views" in help_text and "README" not in help_text
    assert views and all(f"| `{v}` |" in doc for v in views), views
    assert f"{SPIKE[0]}={SPIKE[1]}" in (ROOT / "docs" / "divergence.md").read_text()


def test_the_demo_closes_with_each_stages_seconds(capsys):
    """The demo's closing table is the one place it says how long a stage took (the README's demo
    table quotes it): each stage from its announcement to the next one's, then their sum."""
    from pipelines.demo import Stages

    clock = iter([0.0, 18.4, 18.5, 19.1])  # build 18.4 s, validate 0.6 s
    stages = Stages(3, clock=lambda: next(clock))
    stages.start("build", "build the datasets", "gristmill data build --config configs/data/demo.toml")
    stages.start("validate", "validate", "gristmill data validate runs/data/demo")
    out = capsys.readouterr().out
    assert "=== [1/3] build the datasets\n    $ gristmill data build" in out and "=== [2/3] validate" in out
    want = ["\n=== the demo's stages took 19 s:", "    build         18 s", "    validate       1 s"]
    assert stages.summary() == want


def test_an_os_error_about_a_path_is_one_line_and_any_other_is_raised():
    """Trial RV60b 6: an unwritable --out, a file where a folder goes, were tracebacks. A path's
    OSError is one line naming it (both paths of a rename: review RV60e 2); one of no path, or of
    another kind (a bug's), is raised as it was."""
    import errno

    from pipelines.cli import _path_error

    said = str(_path_error(OSError(errno.EISDIR, "Is a directory", "a.part", None, "a")))
    assert said.startswith("a.part → a: Is a directory (IsADirectoryError); fix that path"), said
    assert str(_path_error(PermissionError(errno.EACCES, "Permission denied", "out"))).startswith(
        "out: Permission denied (PermissionError)"
    )
    assert _path_error(OSError(errno.EACCES, "Permission denied")) is None  # no path named
    assert _path_error(OSError(errno.EIO, "Input/output error", "shard.tar")) is None  # not the user's path


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "RUN", "--out", "s3://b/x"],
        ["data", "audit", "DIR", "--plots", "s3://b/p"],
        ["data", "audit", "DIR", "--db", "s3://b/a.duckdb"],
        ["train", "--config", "c.toml", "--plan", "--plot", "s3://b/p.png"],
        ["mix", "propose", "--config", "c.toml", "--out", "s3://b/m"],
        ["data", "decontam-index", "--tasks", "x", "--out", "s3://b/d"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_an_output_path_given_a_url_is_one_line_and_writes_nothing(argv, tmp_path, capsys, monkeypatch):
    """`export --out s3://b/x` wrote ./s3:/b/x and said s3://b/x; audit's --plots and --db, train's
    --plot likewise (review RV74f 3): one line, before any work."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    flag, url = argv[-2:]
    assert capsys.readouterr().err == f"error: {flag} {url}: a URL, where a path on this machine goes\n"
    assert list(tmp_path.iterdir()) == []
