"""Eval during training (`[eval] interval`): real lm-eval on the local tasks inside real training
runs, one process and two FSDP ranks under torchrun (gloo), against the offline eval of the same
step's checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from tests.helpers import forked  # noqa: E402
from tests.helpers.train_runs import eval_data, without_accelerate  # noqa: E402
from training.config import load_train_config  # noqa: E402
from training.contract.errors import GristmillError  # noqa: E402
from training.contract.eval_table import RESULTS_JSON, read_step_results, rows_of  # noqa: E402
from training.contract.run_layout import complete_steps, eval_dir  # noqa: E402
from training.train import main as train_main  # noqa: E402
from training.train import train  # noqa: E402
from validation.eval import EvalConfig, evaluate_step  # noqa: E402
from validation.train_eval import TrainingEval, metric_key  # noqa: E402

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/train/tiny.toml")
TASKS = ["heldout_ppl", "heldout_cloze"]
LIMIT = 4


def _sets(dataset: Path, run: Path, steps: int = 4) -> list[str]:
    return [
        f"data.dataset={dataset}",
        f"run.output_dir={run}",
        "data.seq_len=256",  # the tiny preset's context: the fixture's cloze items fit in it
        "data.global_batch_tokens=1024",
        "data.micro_batch=2",
        "data.val_fraction=0.1",
        f"schedule.steps={steps}",
        "schedule.warmup_steps=1",
        "run.log_every=3",
        "run.val_every=0",
        "run.device=cpu",
        "metrics.plot=false",
        "checkpoint.interval=2",
        "eval.interval=2",
        f"eval.limit={LIMIT}",
        'eval.tasks=["heldout_ppl", "heldout_cloze"]',
    ]


def _rows(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _offline(run: Path, step: int) -> dict[str, float]:
    """`gristmill eval RUN --step N --set limit=LIMIT` on the step's checkpoint, from scratch."""
    shutil.rmtree(eval_dir(run, step), ignore_errors=True)
    evaluate_step(run, step, EvalConfig(tasks=TASKS, limit=LIMIT, device="cpu"))
    return {metric_key(r): r["value"] for r in rows_of(step, read_step_results(run, step))}


def _assert_equal_scores(in_training: dict, offline: dict) -> None:
    keys = {k for k in in_training if k.startswith("eval/")}
    assert keys == set(offline) and {"eval/heldout_ppl/bits_per_byte", "eval/heldout_cloze/acc"} <= keys
    for k in keys:  # HF's Llama (the export) against gristmill's model on the same weights
        assert in_training[k] == pytest.approx(offline[k], rel=1e-6), k


def test_eval_during_training_scores_its_steps_and_leaves_training_untouched(
    built_dataset, tmp_path, capsys, monkeypatch
):
    from validation import train_eval
    from validation.eval import TaskPlan

    written = []  # each results.json write's keywords; the write itself is the real one

    def write_step_json(*args, **kwargs):
        written.append(kwargs)
        return real_write(*args, **kwargs)

    real_write = train_eval.write_step_json
    monkeypatch.setattr(train_eval, "write_step_json", write_step_json)
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.png").write_bytes(b"an earlier picture")  # a `gristmill eval`'s, say
    cfg = load_train_config(TINY, _sets(built_dataset, run))
    train(cfg, evaluator=TrainingEval(cfg))
    # its record of a step gets what `gristmill eval`'s does for the older entries it merges into: a
    # group's member's own config and a folder's documents by the rule before (review RV33a L3: untested)
    assert len(written) == 2, written
    # metrics.plot = false (_sets): no picture, eval.png's neither; the earlier one is said to lack the
    # run's scores, once (it stayed as if it were the run's: trial RV65c)
    assert (run / "eval.png").read_bytes() == b"an earlier picture"
    said = capsys.readouterr().out
    note = f"note: {run / 'eval.png'} is an earlier picture, without the scores from step 2 on"
    assert said.count(note) == 1, said
    for kwargs in written:
        assert kwargs["own_config"].__func__ is TaskPlan.own_config, kwargs
        assert kwargs["documents_before"].__func__ is TaskPlan.documents_before, kwargs
        assert kwargs["own_config"].__self__.run_dir == run
    rows = _rows(run)
    # its line: each task's score ± stderr on how many items, from how many held-out documents of
    # which source; a warning for a score on too few to mean anything (issue 47)
    out = said.splitlines()
    documents = len((eval_data(run) / "heldout_ppl.jsonl").read_text().splitlines())
    results = read_step_results(run, 4)
    (line,) = [x for x in out if x.startswith("[eval] step 4: ")]
    for r in rows_of(4, results):
        if (r["task"], r["metric"]) in (("heldout_ppl", "bits_per_byte"), ("heldout_cloze", "acc")):
            pm = f" ± {r['stderr']:.2g}" if r["stderr"] else ""
            figure = f"{r['task']} {r['metric']} {r['value']:.4g}{pm} on {LIMIT} items"
            assert figure in line, line
            warning = f"warning: step 4: {figure} is noise at that size (fewer than 20 items)"
            # an accuracy of a multiple-choice task, not a perplexity over all of a document's tokens
            assert any(x.startswith(warning) for x in out) == (r["task"] == "heldout_cloze"), out
            # what scores more, as the settings stand (it advised eval.limit = 0 at 0, and a larger
            # val_fraction where eval.docs held the documents back: review R17a F2)
            more = "raise eval.docs (now 40" if documents >= 40 else "hold out more of the source"
            want = f"{warning}: score more items: set eval.limit = 0 (now {LIMIT}); {more}"
            assert any(x.startswith(want) for x in out) == (r["task"] == "heldout_cloze"), out
    assert f"({documents} held-out documents of source data; " in line, line
    for step in (2, 4):  # every interval and the last step: results where `gristmill eval` puts them
        assert (eval_dir(run, step) / RESULTS_JSON).is_file()
        assert rows[step]["eval_s"] > 0 and 0 <= rows[step]["eval/heldout_cloze/acc"] <= 1
    assert sorted(rows) == [1, 2, 3, 4] and not any(k.startswith("eval/") for k in rows[3])
    assert (run / "eval.parquet").is_file()

    # lm-eval reseeds torch, numpy and random: the trainer's state must come back as it was, so the
    # same run without eval trains the very same losses.
    plain = tmp_path / "plain"
    train(load_train_config(TINY, [*_sets(built_dataset, plain), "eval.interval=0"]))
    plain_rows = _rows(plain)
    assert {s: r["loss"] for s, r in plain_rows.items()} == {s: rows[s]["loss"] for s in plain_rows}


def test_eval_during_training_under_torchrun_fsdp_equals_the_offline_eval(built_dataset, tmp_path):
    """`gristmill train --nproc-per-node 2`: the launcher starts validation.train_eval under torchrun;
    the full weights are gathered from both FSDP shards to rank 0."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--nproc-per-node", "2",
           "--set", *_sets(built_dataset, run, steps=2), "parallel.shard=2"]  # fmt: skip
    out = forked.run(cmd, env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "-m validation.train_eval" in out.stdout
    assert "[eval] step 2:" in out.stdout
    _assert_equal_scores(_rows(run)[2], _offline(run, 2))


def test_training_entry_without_lm_eval_refuses_an_eval_interval(built_dataset, tmp_path, capsys):
    sets = _sets(built_dataset, tmp_path / "run")
    assert train_main(["--config", TINY, "--set", *sets]) == GristmillError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-m validation.train_eval" in err[0] and "eval.interval=0" in err[0]
    assert not (tmp_path / "run").exists()  # refused before any work


class _DamagesClozeDataAtStep2(TrainingEval):
    """The real evaluator; at step 2, first plants the fault (the task's data file overwritten
    mid-run) and notes which checkpoints are complete when the eval starts."""

    complete_at_eval: list[int] = []

    def __call__(self, model, step, merged=False):
        if step == 2 and not merged:
            (eval_data(self.run_dir) / "heldout_cloze.jsonl").write_text('{"context": "cut mid-')
            self.complete_at_eval.extend(complete_steps(self.run_dir))
        return super().__call__(model, step, merged)


def test_a_failing_eval_task_costs_no_training(built_dataset, tmp_path, capsys):
    """RUN/eval/data/heldout_cloze.jsonl corrupted mid-run: the step's checkpoint is saved before the
    eval, the failure is one line and an `eval_error` in the metrics row, and training goes on with
    the other task; every later eval tries the task again (still damaged here: its line again, the
    last step's saying so); the line's advice is a command that evaluates the task afterwards, and
    where the run merges weights, the merged weights' eval has its own line with --merged (they lost
    the task silently: R21c 4). The run merges: the raw weights' lines are those of a run that does
    not (one code path); that a run without merging has no merged line, the exact lines of
    test_an_eval_whose_every_task_failed_tries_them_again_at_the_next_eval say."""
    from pipelines.cli import main as cli_main

    _DamagesClozeDataAtStep2.complete_at_eval = []
    run = tmp_path / "run"
    merging = ["merge.kind='window'", "merge.every=2", "merge.window=1"]
    cfg = load_train_config(TINY, [*_sets(built_dataset, run), *merging])
    train(cfg, evaluator=_DamagesClozeDataAtStep2(cfg))
    out = capsys.readouterr()
    assert _DamagesClozeDataAtStep2.complete_at_eval == [2]  # saved first
    assert complete_steps(run) == [2, 4]
    rows = _rows(run)
    for step in (2, 4):
        assert "heldout_cloze" in rows[step]["eval_error"] and "eval/heldout_ppl/bits_per_byte" in rows[step]
        assert "eval/heldout_cloze/acc" not in rows[step]
    lines = [
        line
        for line in (out.out + out.err).splitlines()
        if "heldout_cloze" in line and line.startswith("[eval]")
    ]
    assert [line.split(": task")[0] for line in lines] == [
        f"[eval] step {s}{w}" for s in (2, 4) for w in ("", " (merged weights)")
    ], out.out + out.err
    assert "Traceback" not in out.err
    assert f"{eval_data(run)}/heldout_cloze.jsonl not as" in lines[0], lines[0]  # by name (RV70d 5)
    assert all("the next eval tries it again" in line for line in lines[:2]), lines
    assert all("it was this run's last eval step" in line for line in lines[2:]), lines
    assert (
        f"`gristmill eval {run} --step 2 --merged --tasks heldout_cloze --set limit={LIMIT}` while "
        "retention keeps checkpoint 2"
    ) in lines[1], lines[1]
    (advice,) = [c for c in lines[0].split("`")[1::2] if c.startswith("gristmill eval")]
    argv = advice.split()[1:]
    assert argv[-1] == f"limit={LIMIT}"  # the run's eval.limit
    assert cli_main([*argv, "device=cpu"]) == 0
    assert "heldout_cloze" in read_step_results(run, 2)["results"]


class _MovesDataJsonAsideAtStep2(TrainingEval):
    """The real evaluator; at step 2 the local tasks' data.json is moved aside (every task fails its
    check); at step 4 it is put back (`at4` "restore"), left ("leave") or the folder deleted
    ("delete")."""

    at4 = "leave"
    folder: Path  # RUN/eval/data/…: the local tasks' data

    def __call__(self, model, step, merged=False):
        record = self.folder / "data.json" if step > 2 else eval_data(self.run_dir) / "data.json"
        if step == 2:
            _MovesDataJsonAsideAtStep2.folder = record.parent
            record.rename(record.with_suffix(".aside"))
        if step == 4 and self.at4 == "restore":
            record.with_suffix(".aside").rename(record)
        if step == 4 and self.at4 == "delete":
            shutil.rmtree(record.parent)
        return super().__call__(model, step, merged)


@pytest.mark.parametrize("at4", ["restore", "leave", "delete"])
def test_an_eval_whose_every_task_failed_tries_them_again_at_the_next_eval(
    built_dataset, tmp_path, capsys, at4
):
    """Once every task had failed (RUN/eval/data/…/data.json gone), the later steps, the final
    weights' included, got no eval, no eval_error and no line (review R26a F6). Each later eval tries
    every task again: the data put back, they are scored; still gone, the last step's line says so;
    gone another way (the whole folder), its own cause, not "failed again" (trial RV57b F4)."""
    _MovesDataJsonAsideAtStep2.at4 = at4
    restore = at4 == "restore"
    run = tmp_path / "run"
    cfg = load_train_config(TINY, _sets(built_dataset, run))
    train(cfg, evaluator=_MovesDataJsonAsideAtStep2(cfg))
    out = capsys.readouterr()
    rows, folder = _rows(run), _MovesDataJsonAsideAtStep2.folder
    failed = [x for x in (out.out + out.err).splitlines() if "tasks heldout_ppl, heldout_cloze failed" in x]
    assert [x.split(": task")[0] for x in failed] == ["[eval] step 2"] + (
        [] if restore else ["[eval] step 4"]
    )
    # one clause for the folder's tasks, its path once (it was 4 times in ~690 characters: RV26b 4)
    assert failed[0].count(str(folder)) == 1, failed[0]
    if restore:  # scored at step 4, the final weights
        assert "eval_error" not in rows[4], rows[4]
        assert {"eval/heldout_ppl/bits_per_byte", "eval/heldout_cloze/acc"} <= set(rows[4])
        assert {r["step"] for r in rows_of(4, read_step_results(run, 4))} == {4}
    elif at4 == "leave":  # the last step's line says they are not scored, and how to score them
        assert failed[1].startswith(
            "[eval] step 4: tasks heldout_ppl, heldout_cloze failed again (as at step 2); it was this "
            "run's last eval step: evaluate them later with"
        ), failed[1]
        assert rows[4]["eval_error"] == failed[1].removeprefix("[eval] step 4: ")
    else:  # another cause: said as it is
        assert failed[1].startswith(
            f"[eval] step 4: tasks heldout_ppl, heldout_cloze failed ({folder} is gone (deleted "
        ), failed[1]
    assert f"failed ({folder}/data.json is gone (deleted since it was built)); " in rows[2]["eval_error"]
    assert "the next eval tries them again" in rows[2]["eval_error"]


class _FollowsTheExportAdviceAtStep2(TrainingEval):
    """The real evaluator; at step 2 the cloze data is damaged, and after the eval the user runs the
    line's `gristmill export` (another terminal, here in between steps): the merged weights' line's
    where the run merges (`merges`), else the raw weights'."""

    merges = False

    def __call__(self, model, step, merged=False):
        from pipelines.cli import main as cli_main

        if step == 2 and not merged:
            (eval_data(self.run_dir) / "heldout_cloze.jsonl").write_text('{"context": "cut mid-')
        metrics = super().__call__(model, step, merged)
        if step == 2 and merged == self.merges:
            (export,) = [
                c for c in metrics["eval_error"].split("`")[1::2] if c.startswith("gristmill export")
            ]
            assert cli_main(export.split()[1:]) == 0
        return metrics


def test_a_whole_eval_s_failure_names_the_run_s_tasks_in_its_command(built_dataset, tmp_path):
    """An eval that failed whole (no task named) advised `gristmill eval RUN --step N`, whose default
    tasks are not the run's eval.tasks: it scored a task the run does not (trial RV59a F6)."""
    run = tmp_path / "run"
    sets = [*_sets(built_dataset, run), 'eval.tasks=["heldout_ppl"]', "checkpoint.export_interval=2"]
    evaluator = TrainingEval(load_train_config(TINY, sets))
    evaluator.run_dir = run  # (the run's start sets it)
    assert (
        evaluator._later(2, False)
        == f"`gristmill eval {run} --step 2 --tasks heldout_ppl --set limit={LIMIT}`"
    )
    assert "--tasks heldout_cloze " in evaluator._later(
        2, False, ["heldout_cloze"]
    )  # a task's failure: its own
    default = TrainingEval(load_train_config(TINY, [*sets[:-2], *sets[-1:]]))
    assert "--tasks" not in default._later(2, False)


@pytest.mark.parametrize("merge", [False, True])
def test_a_failed_eval_s_advice_outlives_retention(built_dataset, tmp_path, capsys, merge):
    """The advice after a failed task named `gristmill eval RUN --step 2 --tasks …`, whose checkpoint
    retention (checkpoint.keep_last) deleted two checkpoints later (review R26a F2); the merged
    weights' line named the command alone, "always exported", though merge.export is off by default
    (review RV26b 1). The line says for how long the command works and how to keep the step's
    weights; followed, it works at the end, and scores as the run's evals did: their eval.limit
    (it scored with `gristmill eval`'s defaults: review RV26b 3)."""
    from pipelines.cli import main as cli_main

    run = tmp_path / "run"
    merging = ["merge.kind='window'", "merge.every=2", "merge.window=1"] if merge else []
    cfg = load_train_config(TINY, [*_sets(built_dataset, run), "checkpoint.keep_last=1", *merging])
    evaluator = _FollowsTheExportAdviceAtStep2(cfg)
    evaluator.merges = merge
    train(cfg, evaluator=evaluator)
    which = "--step 2 --merged" if merge else "--step 2"
    line = _rows(run)[2]["merged/eval_error" if merge else "eval_error"]
    assert (
        f"(this step: `gristmill eval {run} {which} --tasks heldout_cloze --set limit={LIMIT}` while "
        f"retention keeps checkpoint 2 (the newest checkpoint.keep_last = 1; `gristmill export {run} "
        f"{which}` keeps it for good))"
    ) in line, line
    assert complete_steps(run) == [4]  # checkpoint 2 is gone, its export stays
    (advice,) = [c for c in line.split("`")[1::2] if c.startswith("gristmill eval")]
    assert cli_main([*advice.split()[1:], "device=cpu"]) == 0
    later = read_step_results(run, 2, merge)
    assert "heldout_cloze" in later["results"]
    settings = {t: later["gristmill_tasks"][t]["settings"] for t in TASKS}  # ppl: the run's own eval
    for s in settings.values():
        s.pop("definition")
    assert settings["heldout_cloze"] == settings["heldout_ppl"] and settings["heldout_ppl"]["limit"] == LIMIT


def test_an_eval_step_without_a_checkpoint_names_no_command(built_dataset, tmp_path, capsys):
    """checkpoint.interval = 4, eval.interval = 2: step 2's failed eval said "while retention keeps
    checkpoint 2" of a checkpoint never saved, and named two commands that fail (review RV26b 2). It
    says the step's weights are not kept; the last step, always saved, keeps its command."""
    run = tmp_path / "run"
    cfg = load_train_config(TINY, [*_sets(built_dataset, run), "checkpoint.interval=4"])
    train(cfg, evaluator=_DamagesClozeDataAtStep2(cfg))
    rows = _rows(run)
    assert rows[2]["eval_error"].endswith(
        "training goes on, the next eval tries it again; step 2's weights are not kept "
        "(checkpoint.interval = 4 saves every 4 steps and the last)"
    ), rows[2]["eval_error"]
    assert "gristmill" not in rows[2]["eval_error"]
    assert (
        f"evaluate it later with `gristmill eval {run} --step 4 --tasks heldout_cloze"
        in rows[4]["eval_error"]
    )


def test_an_eval_plot_that_cannot_be_written_is_a_warning_and_the_scores_stand(
    built_dataset, tmp_path, capsys
):
    """RUN/eval.png unwritable (a directory of its name; a disk with room for results.json only): the
    in-training eval was "failed" (no eval/* values, eval_error) while results.json and eval.parquet
    held its scores, and the advised `gristmill eval RUN --step N` ended in a traceback (review R26a
    F3). The plot is a warning: the scores go to the row; offline the same; --table, whose product the
    picture is, one line and exit 2. RUN/eval.parquet unwritable too: rebuilt in the eval's hold of
    the eval lock, it made the eval "failed" the same way (review RV32e F5); a warning, the scores
    stand."""
    import shutil

    from pipelines.cli import main as cli_main

    run = tmp_path / "run"
    (run / "eval.png" / "x").mkdir(parents=True)
    (run / "eval.parquet" / "x").mkdir(parents=True)
    cfg = load_train_config(TINY, [*_sets(built_dataset, run), "metrics.plot=true"])
    train(cfg, evaluator=TrainingEval(cfg))
    out = capsys.readouterr()
    rows = _rows(run)
    for step in (2, 4):
        assert "eval_error" not in rows[step] and "eval/heldout_cloze/acc" in rows[step], rows[step]
    warnings = [x for x in (out.out + out.err).splitlines() if x.startswith(f"warning: {run / 'eval.png'}")]
    assert len(warnings) == 2 and "Is a directory" in warnings[0], out.out + out.err
    table = [x for x in (out.out + out.err).splitlines() if x.startswith(f"WARNING: {run / 'eval.parquet'}")]
    assert len(table) == 2 and f"`gristmill eval {run} --table` writes it" in table[0], out.out + out.err
    shutil.rmtree(run / "eval.parquet")
    assert cli_main(["eval", str(run), "--step", "4", "--set", f"limit={LIMIT}", "device=cpu"]) == 0
    out = capsys.readouterr()
    assert f"warning: {run / 'eval.png'} not drawn" in out.err and "Traceback" not in out.err
    # it then said "plot: RUN/eval.png", and neither line said how to draw it (review RV26b 5)
    assert "plot:" not in out.out and f"`gristmill eval {run} --table` draws it" in out.err, out
    assert cli_main(["eval", str(run), "--table"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: wrote ") and f"{run / 'eval.png'} not drawn" in err and "\n" not in err, err
    assert err.endswith(f"once it can be written, `gristmill eval {run} --table` draws it"), err


def test_an_in_training_task_that_fails_in_lm_eval_keeps_its_traceback_in_the_eval_log(
    built_dataset, tmp_path, capsys, monkeypatch
):
    """A task the in-training eval dropped (lm-eval raised on it) kept no traceback anywhere: a bug of
    the in-process model could not be found (review R23g M1). The line names the step's eval.log,
    which holds it. The bug is made here, in the model's loglikelihood (bare floats): the eval is real."""
    from validation.eval_model import GristmillHFLM

    real = GristmillHFLM.loglikelihood
    monkeypatch.setattr(
        GristmillHFLM, "loglikelihood", lambda self, requests, disable_tqdm=False: [
            ll for ll, _ in real(self, requests, disable_tqdm)
        ]
    )  # fmt: skip
    run = tmp_path / "run"
    cfg = load_train_config(TINY, _sets(built_dataset, run, steps=2))
    train(cfg, evaluator=TrainingEval(cfg))
    out = capsys.readouterr()
    log = eval_dir(run, 2) / "eval.log"
    (line,) = [
        x for x in (out.out + out.err).splitlines() if x.startswith("[eval] step 2: task heldout_cloze")
    ]
    assert f"the full traceback is in {log}" in line, line
    assert "task heldout_cloze failed:\nTraceback" in log.read_text()


class _DamagesResultsAtStep4(TrainingEval):
    """The real evaluator; at step 4, the last, first puts a damaged results.json in step 4's folder
    (which its eval checks before it scores, to merge into): the whole eval fails."""

    def __call__(self, model, step, merged=False):
        if step == 4:
            results = eval_dir(self.run_dir, 4) / "results.json"
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text('{"results": {')
        return super().__call__(model, step, merged)


def test_an_eval_that_fails_at_the_last_step_names_the_command_that_scores_it(
    built_dataset, tmp_path, capsys
):
    """An eval that failed as a whole at the last step said "tried again at the next interval", of
    which there is none (review R23a M4): it names `gristmill eval RUN --step N` instead."""
    run = tmp_path / "run"
    cfg = load_train_config(TINY, _sets(built_dataset, run))
    train(cfg, evaluator=_DamagesResultsAtStep4(cfg))
    out = capsys.readouterr()
    (line,) = [x for x in (out.out + out.err).splitlines() if x.startswith("[eval] step 4: failed")]
    assert "next interval" not in line and "EvalResultsError" in line, line
    assert line.endswith(
        f"it was this run's last eval step: evaluate it later with `gristmill eval {run} --step 4 --set "
        f"limit={LIMIT}` "
        f"while retention keeps checkpoint 4 (the newest checkpoint.keep_last = 3; "
        f"`gristmill export {run} --step 4` keeps it for good)"
    ), line
    assert _rows(run)[4]["eval_error"] == line.removeprefix("[eval] step 4: ")


@pytest.mark.parametrize(
    # [""] and [","]: passed, and the run started, then "no tasks given; e.g. --tasks …" (review R22a B4)
    "bad",
    [
        "eval.interval=-1",
        "eval.batch_size=0",
        "eval.tasks=[]",
        'eval.tasks=[""]',
        'eval.tasks=[" , "]',
        "eval.max_length=-8",
        "eval.docs=0",
    ],
)
def test_eval_section_errors(bad, built_dataset, tmp_path):
    from training.data.spec import check_config

    cfg = load_train_config(TINY, [*_sets(built_dataset, tmp_path), bad])
    with pytest.raises(GristmillError, match="eval.interval ≥ 0"):
        check_config(cfg, 1)


def test_the_in_training_eval_takes_its_max_length_and_says_when_it_scores_untrained_positions(
    built_dataset, tmp_path, capsys
):
    """[eval] max_length, as `gristmill eval --set max_length=N`: above the model's context it is
    refused before step 1; longer than the run's seq_len, the eval says once that it scores positions
    the run never trained at, naming the key, as its warning about items cut to it does."""
    too_long = load_train_config(TINY, [*_sets(built_dataset, tmp_path / "long"), "eval.max_length=4096"])
    with pytest.raises(
        GristmillError, match="eval.max_length = 4096 is longer than the model's context, 256"
    ):
        train(too_long, evaluator=TrainingEval(too_long))
    assert not (tmp_path / "long").exists()  # with the run's checks, before the run directory is made

    run = tmp_path / "run"
    sets = [*_sets(built_dataset, run, steps=2), "data.seq_len=64", "eval.max_length=96", "eval.docs=6"]
    cfg = load_train_config(TINY, sets)
    train(cfg, evaluator=TrainingEval(cfg))
    out = capsys.readouterr().out
    # eval.docs, which the noise warning advises raising (it was not a key of [eval]: review R24b 2)
    assert read_step_results(run, 2)["gristmill_tasks"]["heldout_ppl"]["settings"]["docs"] == 6
    assert len((eval_data(run) / "heldout_ppl.jsonl").read_text().splitlines()) == 6
    assert out.count("never trained at") == 1, out
    assert (
        "[eval] note: max_length 96 scores positions 64–95, which step 2's weights never trained at "
        "(the longest seq_len up to it is 64); set eval.max_length = 64 to score only trained lengths"
    ) in out
    # the cloze items cut to 96 tokens: the warning names the key a training takes (not --set max_length)
    (cut,) = [line for line in out.splitlines() if "were cut from the left" in line]
    assert cut.endswith("(eval.max_length, up to the model's max_seq_len 256, evaluates more)"), cut


class _AnotherEvalBesideAtStep2(TrainingEval):
    """The real evaluator; after its step 2, `gristmill eval RUN --step 2 --set docs=3` (another
    process's settings, beside the run) runs to its end."""

    def __call__(self, model, step):
        got = super().__call__(model, step)
        if step == 2:
            from pipelines.cli import main as cli_main

            other = ["eval", str(self.run_dir), "--step", "2", "--tasks", "heldout_ppl"]
            assert cli_main([*other, "--set", "docs=3", "limit=0", "device=cpu"]) == 0
        return got


def test_an_eval_of_other_settings_beside_the_run_leaves_the_run_s_own_eval_its_documents(
    built_dataset, tmp_path
):
    """`gristmill eval --set docs=N` beside a training run rebuilt RUN/eval/data in place: the run's
    own eval then scored those N documents while its results claimed its own docs (review R15c F1).
    Each settings' data has its folder."""
    run = tmp_path / "run"
    cfg = load_train_config(TINY, _sets(built_dataset, run))
    train(cfg, evaluator=_AnotherEvalBesideAtStep2(cfg))
    results = {s: read_step_results(run, s) for s in (2, 4)}
    scored = {
        s: (
            r["n-samples"]["heldout_ppl"]["effective"],
            r["gristmill_tasks"]["heldout_ppl"]["settings"]["docs"],
        )
        for s, r in results.items()
    }
    assert scored == {2: (3, 3), 4: (LIMIT, 40)}, scored  # step 2: the other eval's, as it says
    assert sorted(p.name.split("-")[0] for p in (run / "eval" / "data").iterdir()) == ["docs3", "docs40"]


def test_the_noise_warning_advises_what_scores_more_of_that_task():
    """The advice followed the settings of the local tasks for every task: a hub multiple-choice
    task (boolq) was told to raise eval.docs or val_fraction, which change nothing of its items
    (review R17c M2)."""
    from types import SimpleNamespace

    from validation.train_eval import _more_items

    plan = SimpleNamespace(local=["heldout_cloze"], documents=40)  # the TaskPlan's two fields read
    assert (
        _more_items(EvalConfig(docs=40), plan, "heldout_cloze")
        == "raise eval.docs (now 40, all of them scored)"
    )
    assert _more_items(EvalConfig(docs=50, limit=9), plan, "heldout_cloze") == (
        "set eval.limit = 0 (now 9); hold out more of the source (a larger val_fraction) or score another "
        "(eval.source)"
    )
    assert (
        _more_items(EvalConfig(docs=40), plan, "boolq") == "the task has no more (score another, larger one)"
    )
    assert _more_items(EvalConfig(limit=9), plan, "boolq") == "set eval.limit = 0 (now 9)"


def test_training_with_eval_without_accelerate_is_one_line_before_step_1(built_dataset, tmp_path):
    """lm-eval's HF model imports accelerate: without it `gristmill train` with [eval] ended in a
    ModuleNotFoundError traceback from the trainer's entry point (review R23a M3). One line naming
    the module and the fix, before step 1."""
    run = tmp_path / "run"
    proc = without_accelerate(["train", "--config", TINY, "--set", *_sets(built_dataset, run)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "error: eval.interval = 2 runs lm-eval, which needs accelerate (its HF model imports it), and "
            "accelerate is not installed: pip install -e '.[eval]' (pyproject.toml's eval extra), or set "
            "eval.interval=0"
        )
    ), proc.stderr
    assert "step 1" not in proc.stdout and not (run / "metrics.jsonl").exists()
    # the trainer's entry point started by hand (torchrun, sbatch): it failed to import, a traceback
    proc = without_accelerate(
        ["--config", TINY, "--set", *_sets(built_dataset, run)], "validation.train_eval"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("error: eval.interval = 2 runs lm-eval, which needs accelerate")
    )
    assert not (run / "metrics.jsonl").exists()
