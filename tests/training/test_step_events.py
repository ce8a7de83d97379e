"""Events that meet on one step (issue 36): what happens there — a NaN under stop, skip or rewind, a
loss spike under report or rewind, SIGTERM, kill -9 and a resume — where a metrics row, validation,
an eval, a checkpoint, an export, a phase boundary or the run's last step fall due.

The recipe: the tiny model on the shared real build (lm-eval needs its tokenizer), 8 steps in two
phases (a: 1–3 at seq 64; b: 4–8 at seq 128), a row and a checkpoint every 2 steps, validation, an
eval and an export every 4. So step 4 is the phase boundary with every side activity due, step 8 the
last step with every one due, and step 3 a quiet step (nothing due, the host does not look). A
rewind goes back to the newest checkpoint at least 2 steps before the spike and skips 2 steps.

After every run, the invariants (`check_timeline`):
- no artifact lists a discarded or skipped step as the run's: the kept metrics rows, checkpoints/,
  exports/ and eval/ (a rewind's own checkpoint at its skip's last step, and the final weights' row
  and eval there, excepted), eval.parquet as eval/;
- consumption.parquet equals the timeline (the plan's consumption with RUN/data_plan.json's skips);
- a run that ends has its final weights validated and evaluated (`check_final`);
- a stop under on_nonfinite = "stop" is exit 3 with nothing saved, evaluated or exported at or
  after the bad step;
- a killed (or stopped) and resumed run equals the uninterrupted one: every kept row's loss,
  validation and eval score, and the final weights;
- with [merge] (issue 46), its outputs answer to the timeline too: merged-step-N exports and evals
  only of the timeline's steps, merged scores only in rows of merge points.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("lm_eval")

from pipelines.cli import main as gristmill  # noqa: E402
from tests.helpers import forked  # noqa: E402
from tests.helpers.train_runs import ENV, ROOT, assert_same_checkpoint, one_error_line, read_metrics  # noqa: E402
from training.checkpoint.checkpointer import complete_steps  # noqa: E402
from training.checkpoint.hf_export import export_checkpoint  # noqa: E402
from training.config import TrainConfig, load_train_config  # noqa: E402
from training.contract.config_loader import load_config  # noqa: E402
from training.contract.errors import GristmillError, NonFiniteError  # noqa: E402
from training.contract.run_layout import (
    kept_rows,  # noqa: E402
    list_steps,  # noqa: E402
)
from training.data.recipe import build_plan, open_sources, recorded_skips  # noqa: E402
from training.data.spec import resolve  # noqa: E402
from training.run.faults import DATA, KILL, NAN_LOSS, SIGTERM, SPIKE_WINDOW  # noqa: E402
from training.train import train  # noqa: E402
from validation.train_eval import TrainingEval  # noqa: E402

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

STEPS, QUIET, ALL_DUE, LAST = 8, 3, 4, 8
EVAL_KEY = "eval/heldout_ppl/bits_per_byte"
# For a test that reads no save of steps 2 and 6 (no rewind, no resume from them): a save still meets
# the busiest and the last step, two fewer to write (CI time)
SAVES_AT_4 = "checkpoint.interval=4"


def recipe(dataset: Path) -> str:
    return f"""
[model]
preset = "tiny"
[data]
dataset = {json.dumps(str(dataset))}
global_batch_tokens = 512
micro_batch = 4
val_fraction = 0.1
[[phase]]
name = "a"
steps = 3
seq_len = 64
lr = {{ warmup_steps = 1, shape = "constant" }}
[[phase]]
name = "b"
steps = 5
seq_len = 128
lr = {{ shape = "linear", to = 3e-4 }}
[optim]
lr = 3e-3
[parallel]
param_dtype = "float32"
[run]
log_every = 2
val_every = 4
val_batches = 1
device = "cpu"
threads = 1
spike_window = 4
spike_sigma = 4.0
[run.rewind]
skip_steps = 2
margin_steps = 2
max_rewinds = 2
[checkpoint]
interval = 2
keep_last = 0
export_interval = 4
[eval]
interval = 4
tasks = ["heldout_ppl"]
limit = 1
[metrics]
tensorboard = false
plot = false
"""


@pytest.fixture(scope="module")
def config(built_dataset, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("step-events") / "recipe.toml"
    path.write_text(recipe(built_dataset))
    return path


def run_here(config: Path, run: Path, *sets: str) -> dict:
    """The recipe trained in this process, with lm-eval during training."""
    cfg = load_train_config(str(config), [f"run.output_dir={json.dumps(str(run))}", *sets])
    return train(cfg, evaluator=TrainingEval(cfg) if cfg.eval.interval else None)


def run_child(config: Path, run: Path, *sets: str, env: dict | None = None):
    """The recipe in a process of its own (to be killed), without eval (lm-eval's import alone takes
    seconds)."""
    cmd = [sys.executable, "-m", "training.train", "--config", str(config)]
    cmd += ["--set", "eval.interval=0", f"run.output_dir={json.dumps(str(run))}", *sets]
    return forked.run(cmd, cwd=ROOT, env={**ENV, **(env or {})}, timeout=300)


@pytest.fixture(scope="module")
def reference(built_dataset, shared) -> Path:
    """The uninterrupted run, no fault; trained once per test run (read-only)."""

    def train_checked(text: str, run: Path) -> None:
        config = run.with_name("recipe.toml")
        config.write_text(text)
        run_here(config, run)
        check_final(run, check_timeline(run))

    return shared.run("1-process-eval", lambda _: recipe(built_dataset), train_checked)


@pytest.fixture(scope="module")
def killed_before_the_busiest_row(built_dataset, shared) -> Path:
    """The recipe in a process of its own, killed (-9) once step 4's checkpoint is complete and before
    its validation and row; killed once per test run (read-only: copy it to resume it)."""
    fault = {KILL: f"saved:{ALL_DUE}"}

    def kill(definition: tuple[str, dict], run: Path) -> None:
        config = run.with_name("recipe.toml")
        config.write_text(definition[0])
        killed = run_child(config, run, env=definition[1])
        assert killed.returncode == -9, killed.stderr[-2000:]

    return shared.run("1-process-killed", lambda _: (recipe(built_dataset), fault), kill)


def check_timeline(run: Path) -> int:
    """The invariants every run keeps (the module's docstring); returns the step consumption.parquet
    describes (where the run's timeline ended)."""
    cfg = load_config(TrainConfig, run / "config.toml")
    spec = resolve(cfg)
    plan = build_plan(cfg, spec, open_sources(spec))
    skips = recorded_skips(run)
    all_rows = read_metrics(run)
    kept = kept_rows(all_rows)
    assert [r["step"] for r in kept] == sorted({r["step"] for r in kept}), "one kept row per step"
    assert {r["discarded_by_rewind"] for r in all_rows if "discarded_by_rewind" in r} <= {
        s.rewind for s in skips
    }
    skipped = {step for s in skips for step in range(s.first_step, s.last_step)}
    for where in ("checkpoints", "exports", "eval"):
        assert not set(list_steps(run / where)) & skipped, (where, skipped)
        assert not set(list_steps(run / where, merged=True)) & skipped, (where, "merged", skipped)
    assert not {r["step"] for r in kept} & skipped
    # a rewind's save at its skip's last step holds an earlier step's weights: neither exported nor
    # scored as that step, but at the plan's last step, the run's final weights (review R15e F2)
    untrained = {s.last_step for s in skips} - {plan.total_steps}
    for where in ("exports", "eval"):
        assert not set(list_steps(run / where)) & untrained, (where, untrained)
    if (run / "eval.parquet").is_file():
        table = pq.read_table(run / "eval.parquet").to_pylist()
        for merged in (False, True):
            evals = list_steps(run / "eval", merged)
            assert sorted({r["step"] for r in table if r["merged"] == merged}) == evals, merged
    if cfg.merge.kind != "none":  # merged scores at merge points only
        last = cfg.run.max_steps or spec.last_step
        assert all(r["step"] % cfg.merge.every == 0 or r["step"] == last for r in kept if "merged/steps" in r)
    consumed = pq.read_table(run / "consumption.parquet").to_pylist()
    step = consumed[0]["step"]
    fields = ("phase", "source", "windows", "tokens", "skipped_windows", "skipped_tokens", "rewinds")
    assert [tuple(r[k] for k in fields) for r in consumed] == [
        tuple(r[k] for k in fields) for r in plan.consumed(step, skips)
    ]
    return step


def check_final(run: Path, step: int) -> None:
    """A run that reached its last step: its final weights validated and evaluated."""
    assert step == LAST
    last = kept_rows(read_metrics(run))[-1]
    assert last["step"] == LAST and "val_loss" in last and EVAL_KEY in last, last
    assert LAST in list_steps(run / "eval") and LAST in list_steps(run / "checkpoints")


def scores(run: Path, keys: tuple[str, ...] = ("loss", "val_loss", EVAL_KEY)) -> list[tuple]:
    return [(r["step"], *(r.get(k) for k in keys)) for r in kept_rows(read_metrics(run))]


@pytest.mark.parametrize("bad", [QUIET, ALL_DUE, LAST])
def test_a_nan_under_stop_stops_before_anything_at_or_after_it(config, tmp_path, monkeypatch, bad):
    """The default on_nonfinite = "stop": exit 3 at the first step the host reads (the bad step, or
    the next one anything is due at), whatever else falls due there — nothing saved, validated,
    evaluated or exported at or after the bad step."""
    monkeypatch.setenv(NAN_LOSS, str(bad))
    run = tmp_path / "run"
    with pytest.raises(NonFiniteError) as stopped:
        run_here(config, run)
    assert stopped.value.exit_code == 3 and f"step {bad}: the loss" in str(stopped.value)
    for where in ("checkpoints", "exports", "eval"):
        assert all(s < bad for s in list_steps(run / where)), where
    heard = check_timeline(run)
    assert heard == (ALL_DUE if bad == QUIET else bad)  # the stop's row is the step that heard of it
    assert not any("val_loss" in r or EVAL_KEY in r for r in read_metrics(run) if r["step"] >= bad)


def test_unreadable_data_after_a_nan_on_a_quiet_step_saves_nothing_at_or_after_it(
    config, tmp_path, monkeypatch, capsys
):
    """The data of step 4 cannot be read (a bucket down past data.fetch_timeout_s): the run saves the
    step it trained last, then stops with the data's error. But step 3, quiet, was trained unread,
    and its loss was NaN: exit 3 then, nothing saved at or after step 3 (a resume from such a save
    would go on as if step 3 had been fine)."""
    monkeypatch.setenv(DATA, str(ALL_DUE))
    clean = tmp_path / "clean"
    with pytest.raises(GristmillError, match=f"the data of step {ALL_DUE} cannot be read") as error:
        run_here(config, clean, "eval.interval=0")
    assert not isinstance(error.value, NonFiniteError) and list_steps(clean / "checkpoints")[-1] == QUIET
    # consumption.parquet (the audit's) where it saved, not at its last logged row; a resume from an
    # older checkpoint whose first data cannot be read leaves it at that checkpoint, not at the
    # timeline it set aside (review R15e F1)
    assert check_timeline(clean) == QUIET
    monkeypatch.setenv(DATA, str(QUIET))
    older = f"checkpoint.resume={json.dumps(str(clean / 'checkpoints' / 'step-000002'))}"
    with pytest.raises(GristmillError, match=f"the data of step {QUIET} cannot be read"):
        run_here(config, clean, "eval.interval=0", older)
    assert check_timeline(clean) == 2
    monkeypatch.setenv(DATA, str(ALL_DUE))
    monkeypatch.setenv(NAN_LOSS, str(QUIET))
    run = tmp_path / "run"
    capsys.readouterr()
    with pytest.raises(NonFiniteError) as stopped:
        run_here(config, run, "eval.interval=0")
    assert stopped.value.exit_code == 3 and f"step {QUIET}: the loss" in str(stopped.value)
    assert f"the data of step {ALL_DUE} cannot be read" in capsys.readouterr().out
    assert all(s < QUIET for s in list_steps(run / "checkpoints"))
    check_timeline(run)


def test_unreadable_data_just_after_an_async_save_completes_that_save(config, tmp_path, monkeypatch):
    """Step 4's async save is still writing when step 5's data cannot be read: it is completed before
    the run stops (it was left without COMPLETE, and --resume auto went back to step 2)."""
    monkeypatch.setenv(DATA, str(ALL_DUE + 1))
    run = tmp_path / "run"
    with pytest.raises(GristmillError, match=f"the data of step {ALL_DUE + 1} cannot be read"):
        run_here(config, run, "eval.interval=0", "checkpoint.async=true")
    assert complete_steps(run)[-1] == ALL_DUE


def test_an_unreadable_eval_result_costs_no_training(config, tmp_path, capsys):
    """Step 4's results.json damaged (a disk, an edit) before a resume: the eval of step 8 rebuilt
    eval.parquet from every results.json and the run died on step 4's, nothing of 5-8 saved. The
    table is a side activity: a warning, training to the end. Then every later eval failed before it
    scored, for step 4's file (trial RV61b F1): step 8 is scored, its row has its scores, and the
    table's and the plot's warnings name step 4's file."""
    run = tmp_path / "run"
    run_here(config, run, "run.max_steps=4", SAVES_AT_4)
    results = run / "eval" / "step-000004" / "results.json"
    results.write_text(results.read_text()[:50])
    capsys.readouterr()
    run_here(config, run, 'checkpoint.resume="auto"', SAVES_AT_4, "eval.interval=2")
    out = capsys.readouterr().out
    assert "[eval] step 8: failed" not in out, out
    assert out.count(f"eval.parquet not rebuilt (EvalResultsError: {results} is damaged (") == 1, out
    # at the next eval, one short line, not the whole warning again (trial RV65c F5)
    again = f"WARNING: {run / 'eval.parquet'} not rebuilt again, for the reason said at step 6"
    assert out.count(again) == 1, out
    assert (run / "eval" / "step-000008" / "results.json").is_file()
    (row,) = [r for r in kept_rows(read_metrics(run)) if r["step"] == 8]
    assert "eval_error" not in row and any(k.startswith("eval/") for k in row), row
    assert complete_steps(run)[-1] == LAST


@pytest.mark.parametrize(
    "nan, sets",
    [
        (str(QUIET), []),  # the step-4 row counts it, and says where
        (f"{QUIET},{ALL_DUE}", ["run.max_skipped=2"]),  # two in a row, across the stop: exit 3 at step 4
    ],
    ids=["counted-in-the-next-row", "max-skipped-counts-across-a-resume"],
)
def test_sigterm_after_a_skipped_step_then_resume_counts_it_as_the_uninterrupted_run(
    config, tmp_path, monkeypatch, capsys, nan, sets
):
    """on_nonfinite = "skip", step 3's update not finite (skipped), SIGTERM there: the checkpoint of
    step 3 keeps the tally no row has counted yet and the run of non-finite steps going on, so the
    resumed run writes the rows and makes the stop the uninterrupted run does."""
    sets = ["run.on_nonfinite='skip'", "eval.interval=0", SAVES_AT_4, *sets]  # the stop saves step 3
    monkeypatch.setenv(NAN_LOSS, nan)

    advice: list[str] = []

    def outcome(run: Path, *more: str) -> str:
        try:
            run_here(config, run, *sets, *more)
            return "finished"
        except NonFiniteError as e:
            advice.append(str(e).split(";", 1)[1])
            return str(e).split(";")[0]  # the cause (the advice names the run's own config)

    def rows(run: Path) -> str:
        keys = ("step", "loss", "skipped_steps", "events")
        return json.dumps([[r.get(k) for k in keys] for r in kept_rows(read_metrics(run))])

    straight, run = tmp_path / "straight", tmp_path / "run"
    expected = outcome(straight)
    monkeypatch.setenv(SIGTERM, str(QUIET))
    capsys.readouterr()
    assert run_here(config, run, *sets)["stopped_by"] == "SIGTERM"
    stopped = capsys.readouterr().out
    monkeypatch.delenv(SIGTERM)
    assert outcome(run, "checkpoint.resume='auto'") == expected
    if expected == "finished":  # each invocation's last line counts its own non-finite step, once
        # (the stopped one called step 3 trained, the resumed one counted it as its own: review RV64c 1)
        assert (
            f"(logged, of steps 1–{QUIET}; {QUIET - 1} steps trained, 1 non-finite, not applied)" in stopped
        )
        assert f"({LAST - QUIET} steps since the resume)" in capsys.readouterr().out
    assert rows(run) == rows(straight)
    assert any(r.get("skipped_steps") for r in read_metrics(straight))  # a tally to compare
    if advice:  # stopped by run.max_skipped while skipping: the advice to skip stopped there again (R17d M1)
        assert all("--set run.max_skipped=4" in a and "on_nonfinite=skip" not in a for a in advice), advice
        # the run of left-out steps by its own steps, not "2 trained steps in a row up to" (trial RV63a)
        assert expected.startswith(f"steps {QUIET}–{ALL_DUE}: 2 non-finite steps in a row, none applied"), (
            expected
        )


def test_a_rewind_to_before_the_resume_leaves_the_closing_line_counting_this_runs_steps(
    config, tmp_path, monkeypatch, capsys
):
    """A step-3 NaN skipped and the run stopped there (its tally in the checkpoint, for the next row);
    resumed, a spike at 4 rewinds to step 2, before the resume, and that row is never written: the
    closing line said "-1 non-finite" (review RV64d 1)."""
    sets = ["run.on_nonfinite='skip'", "eval.interval=0", "run.val_every=0", "checkpoint.interval=2",
            "checkpoint.export_interval=0", "run.on_spike='rewind'", "run.rewind.margin_steps=2",
            "run.rewind.skip_steps=1"]  # fmt: skip
    run = tmp_path / "run"
    monkeypatch.setenv(NAN_LOSS, str(QUIET))
    monkeypatch.setenv(SIGTERM, str(QUIET))
    assert run_here(config, run, *sets)["stopped_by"] == "SIGTERM"
    monkeypatch.delenv(SIGTERM)
    monkeypatch.delenv(NAN_LOSS)
    monkeypatch.setenv(SPIKE_WINDOW, f"step:{QUIET + 1}*50")
    capsys.readouterr()
    run_here(config, run, *sets, "checkpoint.resume='auto'")
    out = capsys.readouterr().out
    assert "back to step 2" in out and f"({LAST - QUIET} steps since the resume)" in out, out
    # a non-finite step the rewind then discarded (step 5: back to 4, 5 skipped) is no step of the run's
    monkeypatch.setenv(NAN_LOSS, "5")
    monkeypatch.setenv(SPIKE_WINDOW, "step:6*50")
    run_here(config, tmp_path / "again", *sets)
    assert f"({LAST - 1} steps trained, 1 skipped by rewinds)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "nans, sets, said",
    [
        # a rewind's skip (5–6) between two non-finite steps in a row (4, 7): "steps 6–7" named a step
        # the rewind skipped (review RV64c 2)
        ("4,7", ["run.on_spike='rewind'", f"{SPIKE_WINDOW}=step:6*50"],
         "steps 4–7 (a rewind's skip between them): 2 non-finite steps in a row, none applied "
         "(run.max_skipped = 2; the first since the last log, step 7: loss and gradient norm not finite)"),
        # a save's read (step 4) between the log (3) and the stop (6): "the first since the last log" was
        # step 5 (review RV64c 6)
        ("4,5,6", ["run.max_skipped=3", "run.log_every=3", "checkpoint.interval=4"],
         "steps 4–6: 3 non-finite steps in a row, none applied (run.max_skipped = 3; the first since the "
         "last log, step 4: loss and gradient norm not finite)"),
    ],
    ids=["across-a-rewind-skip", "a-save-between-log-and-stop"],
)  # fmt: skip
def test_the_max_skipped_stop_names_the_non_finite_steps_it_counted(
    config, tmp_path, monkeypatch, nans, sets, said
):
    monkeypatch.setenv(NAN_LOSS, nans)
    for spec in [x for x in sets if x.startswith("GRISTMILL_")]:
        monkeypatch.setenv(*spec.split("=", 1))
    sets = [x for x in sets if not x.startswith("GRISTMILL_")]
    with pytest.raises(NonFiniteError) as e:
        run_here(config, tmp_path / "run", "eval.interval=0", "run.val_every=0", "run.on_nonfinite='skip'",
                 "run.max_skipped=2", "checkpoint.export_interval=0", *sets)  # fmt: skip
    assert str(e.value).startswith(said), e.value


def test_a_nan_under_skip_on_the_busiest_step_is_counted_and_the_run_ends_evaluated(
    config, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(NAN_LOSS, str(ALL_DUE))
    run = tmp_path / "run"
    run_here(config, run, "run.on_nonfinite='skip'", SAVES_AT_4)
    # the closing line counted the skipped step as trained (trial RV63a)
    assert f"({LAST - 1} steps trained, 1 non-finite, not applied)" in capsys.readouterr().out
    check_final(run, check_timeline(run))
    row = next(r for r in read_metrics(run) if r["step"] == ALL_DUE)
    assert row["skipped_steps"] == 1 and "val_loss" in row and EVAL_KEY in row  # finite weights: scored
    assert ALL_DUE in list_steps(run / "exports")


@pytest.mark.parametrize(
    "fault, sets, back, skipped",
    [
        # a NaN where the phase boundary, a checkpoint, an export and an eval fall due: back to 2
        (f"{NAN_LOSS}={ALL_DUE}", ["run.on_nonfinite='rewind'"], 2, 2),
        # a spike the step after them: step 4's checkpoint, export and eval are the discarded
        # attempt's (back to 2, steps 3–5 skipped): set aside, nobody's step any more
        (f"{SPIKE_WINDOW}=step:5*50", ["run.on_spike='rewind'", "run.rewind.skip_steps=3"], 2, 3),
        # a spike on the last step: back to 6, the skip (7–8) reaches the end: the final weights
        # (step 6's) validated and evaluated as step 8, consumption counts the skip
        (f"{SPIKE_WINDOW}=step:{LAST}*50", ["run.on_spike='rewind'"], 6, 2),
    ],
    ids=["nan-on-the-busiest-step", "spike-after-an-export", "spike-on-the-last-step"],
)
def test_a_rewind_leaves_every_artifact_to_the_timeline(
    config, tmp_path, monkeypatch, capsys, fault, sets, back, skipped
):
    name, value = fault.split("=", 1)
    monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    summary = run_here(config, run, *sets)
    assert summary["rewinds"] == 1
    check_final(run, check_timeline(run))
    (skip,) = recorded_skips(run)
    assert skip.checkpoint_step == back and (skip.first_step, skip.last_step) == (back + 1, back + skipped)
    discarded = [r for r in read_metrics(run) if "discarded_by_rewind" in r]
    assert discarded and all(r["step"] > back for r in discarded)
    for where in ("checkpoints", "exports", "eval"):  # what the discarded attempt wrote, set aside
        made = {s for s in (ALL_DUE,) if back < s < skip.spike_step}  # the spike step's own never ran
        assert made <= {int(p.name.split("-")[-1]) for p in (run / where).glob("abandoned-step-*")}, where
    # what the discarded attempt exported and evaluated is nobody's step: export, eval and verify of
    # it say why in one line (before: the export was returned, scored and verified ok)
    for step in made:
        for command in (["export", str(run), "--step", str(step)], ["verify", str(run), "--step", str(step)],
                        ["eval", str(run), "--step", str(step), "--tasks", "heldout_ppl"]):  # fmt: skip
            assert gristmill(command) == 2, command
            line = one_error_line(capsys.readouterr().err)
            assert f"exports/abandoned-step-{step:06d}" in line and "set aside" in line, line
    # a watch scoring a step the rewind then skipped: never "evaluate it again once it is retrained"
    # (review R17d M5)
    from validation.eval import DiscardedStepError, _discarded

    with pytest.raises(
        DiscardedStepError, match=rf"lies in rewind 1's skip \(steps {back + 1}–{skip.last_step}\)"
    ):
        _discarded(run, back + 1, None, None)
    if skip.last_step == LAST:  # ... but the plan's last step's final weights are scored as it (R17h)
        with pytest.raises(DiscardedStepError, match="evaluate the step again once it is retrained"):
            _discarded(run, LAST, None, None)
    if skip.last_step == LAST:  # the final weights exported as the last step, with a note (review R17d M6)
        capsys.readouterr()
        assert gristmill(["export", str(run), "--step", str(LAST)]) == 0
        out = capsys.readouterr().out
        note = (
            f"step {LAST}, the plan's last, lies in rewind 1's skip (steps {back + 1}–{LAST}): its weights, "
        )
        assert f"{note}the run's final ones, are step {back}'s" in out, out
    # the summary's losses are kept rows' (never the spike's)
    assert summary["final_loss"] == kept_rows(read_metrics(run))[-1].get("loss", summary["final_loss"])
    assert all(r["loss"] < 20 for r in kept_rows(read_metrics(run)) if "loss" in r)


def test_a_skip_to_the_end_with_nothing_to_score_leaves_consumption_to_the_timeline(
    config, tmp_path, monkeypatch
):
    """No validation, no eval: no row follows the rewind, and consumption.parquet (the audit's
    `consumption` view) still counts the steps trained and skipped, and the rewind."""
    monkeypatch.setenv(SPIKE_WINDOW, f"step:{LAST}*50")
    run = tmp_path / "run"
    run_here(config, run, "run.on_spike='rewind'", "run.val_every=0", "eval.interval=0")
    assert check_timeline(run) == LAST
    consumed = pq.read_table(run / "consumption.parquet").to_pylist()
    assert sum(r["skipped_windows"] for r in consumed) > 0 and [1] in [r["rewinds"] for r in consumed]


def test_a_spike_on_the_last_step_that_cannot_rewind_still_ends_validated_and_evaluated(
    config, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(SPIKE_WINDOW, f"step:{LAST}*50")
    run = tmp_path / "run"
    none_that_old = f"run.rewind.margin_steps={LAST}"
    run_here(config, run, "run.on_spike='rewind'", none_that_old, SAVES_AT_4)
    # said at the start, not only when the spike comes (trial RV63a)
    assert (
        "warning: run.on_spike = 'rewind' can never rewind in this plan: its first checkpoint "
        f"(checkpoint.interval = 4) is after its last step {LAST} − run.rewind.margin_steps {LAST}, so a "
        "spike is only reported" in capsys.readouterr().out
    )
    check_final(run, check_timeline(run))
    assert (
        recorded_skips(run) == () and kept_rows(read_metrics(run))[-1]["loss"] > 20
    )  # the spike is the run's


def test_a_resume_with_a_longer_checkpoint_interval_is_not_warned_it_cannot_rewind(
    config, tmp_path, monkeypatch, capsys
):
    """A resume's earlier checkpoints, saved at another interval, are targets too: the start's "can never
    rewind" looked at checkpoint.interval alone (it warned, then rewound: review RV64c 4)."""
    run, sets = tmp_path / "run", ["eval.interval=0", "run.on_spike='rewind'", "checkpoint.export_interval=0"]
    run_here(config, run, *sets, "run.max_steps=5", "checkpoint.interval=2")
    capsys.readouterr()
    # one that truly cannot (none of steps 2, 4 or 8 is before 8 − 7) is warned (review RV64d 6)
    run_here(config, run, *sets, "checkpoint.interval=8", "run.rewind.margin_steps=7", "run.max_steps=6",
             "checkpoint.resume='auto'")  # fmt: skip
    warned = [line for line in capsys.readouterr().out.splitlines() if "can never rewind" in line]
    assert warned == [
        "warning: run.on_spike = 'rewind' can never rewind in this plan: neither its checkpoints (step 2, "
        "step 4) nor its next save (checkpoint.interval = 8: step 8) is at or before its last step 8 − "
        "run.rewind.margin_steps 7, so a spike is only reported; lower run.rewind.margin_steps to 6 or less"
    ], warned  # not checkpoint.interval: no save after step 5 comes before 8 − 7 (review RV65d 6)
    monkeypatch.setenv(SPIKE_WINDOW, "step:7*50")
    run_here(config, run, *sets, "checkpoint.interval=8", "checkpoint.resume='auto'")
    out = capsys.readouterr().out
    assert "can never rewind" not in out and "back to step 4" in out, out


def test_a_spike_under_report_on_the_busiest_step_is_an_event_of_its_one_row(config, tmp_path, monkeypatch):
    monkeypatch.setenv(SPIKE_WINDOW, f"step:{ALL_DUE}*50")
    run = tmp_path / "run"
    run_here(config, run, SAVES_AT_4)
    check_final(run, check_timeline(run))
    (row,) = [r for r in read_metrics(run) if r["step"] == ALL_DUE]
    assert any("loss spike" in e for e in row["events"]) and "val_loss" in row and EVAL_KEY in row


MERGE = ("merge.kind='window'", "merge.every=4", "merge.window=3", "merge.export=true")
MERGED_EVAL = f"merged/{EVAL_KEY}"


@pytest.mark.parametrize("on_spike", ["report", "rewind"])
def test_a_merge_point_where_a_checkpoint_an_eval_a_phase_change_and_a_spike_meet(
    config, tmp_path, monkeypatch, capsys, on_spike
):
    """[merge] every 4 steps (a window of 3) and a spike on step 4, the busiest step. Reported: the
    spike is an event of step 4's one row, which carries the raw and the merged weights' validation
    and eval; the merged export and eval of 4 and 8 are written, and `gristmill eval --merged`
    offline scores the in-training merged eval's numbers. Rewound: back to step 2, 3–4 skipped; the
    skip reaches merge point 4, whose window holds step 2 alone (the rewind's checkpoint at 4 holds
    it, exported beside step 4's raw export, the same weights), no row or eval of step 4 remains, and
    step 8 merges steps 6–8."""
    monkeypatch.setenv(SPIKE_WINDOW, f"step:{ALL_DUE}*50")
    run = tmp_path / "run"
    saves = [SAVES_AT_4] if on_spike == "report" else []  # the rewind goes back to step 2's save
    run_here(config, run, *MERGE, f"run.on_spike='{on_spike}'", *saves)
    check_final(run, check_timeline(run))
    rows = {r["step"]: r for r in kept_rows(read_metrics(run))}
    assert rows[LAST]["merged/steps"] == 3 and "merged/val_loss" in rows[LAST] and MERGED_EVAL in rows[LAST]
    assert list_steps(run / "exports", merged=True) == [ALL_DUE, LAST]
    if on_spike == "report":
        row = rows[ALL_DUE]
        assert any("loss spike" in e for e in row["events"]) and row["phase"] == "b"  # its first step
        assert {"val_loss", EVAL_KEY, "merged/val_loss", MERGED_EVAL} <= set(row) and row["merged/steps"] == 3
        assert list_steps(run / "eval", merged=True) == [ALL_DUE, LAST]
        capsys.readouterr()
        assert gristmill(["eval", str(run), "--step", str(LAST), "--merged", "--tasks", "heldout_ppl",
                          "--set", "limit=1"]) == 0  # fmt: skip
        results = json.loads((run / "eval" / f"merged-step-{LAST:06d}" / "results.json").read_text())
        offline = results["results"]["heldout_ppl"]["bits_per_byte,none"]
        assert offline == pytest.approx(rows[LAST][MERGED_EVAL], rel=1e-6)
        assert results["gristmill"]["export"].endswith(f"exports/merged-step-{LAST:06d}")
    else:
        (skip,) = recorded_skips(run)
        assert (skip.checkpoint_step, skip.first_step, skip.last_step) == (2, 3, ALL_DUE)
        assert ALL_DUE not in rows and list_steps(run / "eval", merged=True) == [LAST]
        # step 4's raw weights are step 2's: no export of them as step 4 (review R15e F2); the merged
        # export of 4 (its window: step 2 alone) is step 2's export
        assert ALL_DUE not in list_steps(run / "exports")
        exports = (run / "exports" / f"merged-step-{ALL_DUE:06d}", export_checkpoint(run, 2))
        merged, raw = (load_file(str(path / "model.safetensors")) for path in exports)
        assert merged.keys() == raw.keys() and all(torch.equal(merged[k], raw[k]) for k in raw)
        # and `gristmill eval --step 4` says whose weights they are
        capsys.readouterr()
        assert gristmill(["eval", str(run), "--step", str(ALL_DUE), "--tasks", "heldout_ppl"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"step {ALL_DUE} was never trained: rewind 1 skipped steps 3–{ALL_DUE}" in line, line
        assert "holds step 2's weights" in line and "evaluate step 2" in line


def test_sigterm_on_the_busiest_step_then_resume_equals_the_uninterrupted_run(
    config, tmp_path, monkeypatch, reference
):
    monkeypatch.setenv(SIGTERM, str(ALL_DUE))
    run = tmp_path / "run"
    stopped = run_here(config, run)
    assert stopped["stopped_by"] == "SIGTERM" and stopped["steps"] == ALL_DUE
    monkeypatch.delenv(SIGTERM)
    run_here(config, run, "checkpoint.resume='auto'", "run.on_spike='rewind'")
    check_final(run, check_timeline(run))
    assert scores(run) == scores(reference)
    assert_same_checkpoint(reference, run, LAST)


def test_sigterm_where_a_rewind_happens_stops_at_the_rewinds_save_and_resumes_exactly(
    config, tmp_path, monkeypatch
):
    """A spike and SIGTERM on one step: the rewind goes first, its checkpoint (at the skip's last
    step) is the stop's; the resume then trains as the uninterrupted rewound run does."""
    monkeypatch.setenv(SPIKE_WINDOW, "step:5*50")
    straight, run = tmp_path / "straight", tmp_path / "run"
    run_here(config, straight, "run.on_spike='rewind'")
    monkeypatch.setenv(SIGTERM, "5")
    stopped = run_here(config, run, "run.on_spike='rewind'")
    assert stopped["stopped_by"] == "SIGTERM" and stopped["steps"] == 4 and stopped["rewinds"] == 1
    monkeypatch.delenv(SIGTERM)
    run_here(config, run, "run.on_spike='rewind'", "checkpoint.resume='auto'")
    check_final(run, check_timeline(run))
    assert scores(run) == scores(straight)
    assert_same_checkpoint(straight, run, LAST)


def test_kill_9_between_a_checkpoint_and_its_row_then_resume_equals_the_uninterrupted_run(
    config, tmp_path, reference, killed_before_the_busiest_row, capsys
):
    """Killed once step 4's checkpoint is complete and before its validation and row (and its eval:
    the in-process tests have it; the killed process of its own leaves lm-eval out, whose import
    alone takes seconds): the checkpoint holds the row still to write, and the resume (here, in this
    process) writes it, validated, before step 5, and says so: with this run's settings (the note of
    a resume's changes said they were in effect from step 5 only: review R21c 1)."""
    run = shutil.copytree(killed_before_the_busiest_row, tmp_path / "run")
    assert ALL_DUE in list_steps(run / "checkpoints") and ALL_DUE not in {
        r["step"] for r in read_metrics(run)
    }
    capsys.readouterr()
    run_here(config, run, "eval.interval=0", "checkpoint.resume='auto'")  # the resume: in this process
    out = capsys.readouterr().out
    assert f"step {ALL_DUE}'s validation, due when the run stopped, run now (with this run's settings)" in out
    check_timeline(run)
    assert scores(run, ("loss", "val_loss")) == scores(reference, ("loss", "val_loss"))
    assert "val_loss" in next(r for r in read_metrics(run) if r["step"] == ALL_DUE)
    assert_same_checkpoint(reference, run, LAST)
    # the ETA's pace leaves out that catch-up, done once (it was in the first ETA: trial RV70a 3)
    rows = read_metrics(run)
    caught_up = next(r for r in rows if r["step"] == ALL_DUE)
    first = next(r for r in rows if r["step"] > ALL_DUE and r["step"] < r["last_step"])
    paced = first["eta_s"] * (first["step"] - ALL_DUE) / (first["last_step"] - first["step"])
    assert paced <= first["elapsed_s"] - caught_up["elapsed_s"] + 1e-9, (first, caught_up)


def test_an_async_save_is_complete_before_the_validation_due_at_its_step(config, tmp_path):
    """checkpoint.async = true, killed at "saved:4" (its validation and row not yet done): the write in
    the background had not committed, and the resume went back to step 2, so a validation or an eval
    that died cost the steps since the last checkpoint (review RV50a F1). The write is waited for first
    at a step with a validation or an eval due."""
    run = tmp_path / "run"
    killed = run_child(config, run, "checkpoint.async=true", env={KILL: f"saved:{ALL_DUE}"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert complete_steps(run)[-1] == ALL_DUE


def test_a_resume_that_turns_validation_off_writes_the_row_a_kill_cut_off(
    config, tmp_path, killed_before_the_busiest_row, capsys
):
    """Killed between step 4's checkpoint and its row (validation due there), resumed with
    run.val_every = 0 (a setting a resume may change): the row is written without val_loss, and says
    so, instead of the resume failing on every try."""
    run = shutil.copytree(killed_before_the_busiest_row, tmp_path / "run")
    capsys.readouterr()
    run_here(config, run, "eval.interval=0", "run.val_every=0", "checkpoint.resume='auto'")
    out = capsys.readouterr().out
    row = next(r for r in read_metrics(run) if r["step"] == ALL_DUE)
    assert "val_loss" not in row and "loss" in row
    assert f"step {ALL_DUE}'s validation was due when the run stopped; validation is off now" in out
    assert kept_rows(read_metrics(run))[-1]["step"] == LAST


def test_the_summary_after_a_resume_reads_only_kept_rows(config, tmp_path, monkeypatch, capsys):
    """Stopped at step 4, resumed; the resumed invocation's first logged row (step 6, a spike) is
    discarded by the rewind it causes: the summary and the returned losses are kept rows'."""
    run = tmp_path / "run"
    monkeypatch.setenv(SIGTERM, str(ALL_DUE))
    run_here(config, run, "run.on_spike='rewind'")
    monkeypatch.delenv(SIGTERM)
    monkeypatch.setenv(SPIKE_WINDOW, "step:6*50")
    capsys.readouterr()
    summary = run_here(config, run, "run.on_spike='rewind'", "checkpoint.resume='auto'")
    out = capsys.readouterr().out
    spike = next(r for r in read_metrics(run) if r["step"] == 6 and "discarded_by_rewind" in r)
    line = next(x for x in out.splitlines() if x.startswith("loss "))
    assert f"{spike['loss']:.4f}" not in line and summary["first_loss"] != spike["loss"]
    kept = [r for r in kept_rows(read_metrics(run)) if r["step"] > ALL_DUE and "loss" in r]
    assert (
        summary["first_loss"] == kept[0]["loss"]
        and f"{kept[0]['loss']:.4f} at step {kept[0]['step']}" in line
    )
    check_final(run, check_timeline(run))


HAPPENINGS = {
    "nan-stop": (NAN_LOSS, "{step}", []),
    "nan-skip": (NAN_LOSS, "{step}", ["run.on_nonfinite='skip'"]),
    "nan-rewind": (NAN_LOSS, "{step}", ["run.on_nonfinite='rewind'"]),
    "spike-report": (SPIKE_WINDOW, "step:{step}*50", []),
    "spike-rewind": (SPIKE_WINDOW, "step:{step}*50", ["run.on_spike='rewind'"]),
}


@pytest.mark.sweep
@pytest.mark.parametrize("step", range(1, STEPS + 1))
@pytest.mark.parametrize("happening", list(HAPPENINGS))
def test_sweep_every_step(config, tmp_path, monkeypatch, happening, step):
    """The wider sweep (`pytest -m sweep`, not in the default suite): each happening on each step,
    the invariants after each run."""
    name, value, sets = HAPPENINGS[happening]
    monkeypatch.setenv(name, value.format(step=step))
    run = tmp_path / "run"
    try:
        run_here(config, run, *sets)
    except NonFiniteError:
        assert happening in ("nan-stop", "nan-rewind")  # a rewind with nowhere to go stops too
        assert all(s < step for w in ("checkpoints", "exports", "eval") for s in list_steps(run / w))
        check_timeline(run)
        return
    check_final(run, check_timeline(run))


def test_a_run_stopped_inside_a_rewind_s_skip_scores_no_step_of_it_and_resumes_as_never_stopped(
    config, tmp_path, monkeypatch, capsys
):
    """run.max_steps inside a rewind's skip: the save at the skip's last step (step 2's weights) was
    validated and scored as step 4, kept after a resume to the end (review R15g F1); `gristmill export
    RUN` exported it as step 4 (F2); with step 2's checkpoint gone, eval said there was no checkpoint
    and advised evaluating step 2 (F3). None of it now: the resumed run's timeline is the uninterrupted
    one's."""
    from training.checkpoint.checkpointer import delete_checkpoint

    monkeypatch.setenv(SPIKE_WINDOW, f"step:{ALL_DUE}*50")
    run = tmp_path / "run"
    run_here(config, run, "run.max_steps=4", "run.on_spike='rewind'")
    (skip,) = recorded_skips(run)
    assert (skip.checkpoint_step, skip.first_step, skip.last_step) == (2, 3, ALL_DUE)
    assert not list_steps(run / "eval") and ALL_DUE not in [r["step"] for r in kept_rows(read_metrics(run))]
    delete_checkpoint(run / "checkpoints" / "step-000002")  # as retention (checkpoint.keep_last) may
    capsys.readouterr()
    assert gristmill(["eval", str(run), "--tasks", "heldout_ppl"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "no trained step to evaluate: step 4 was never trained: rewind 1 skipped steps 3–4" in line, line
    assert "step 2's own checkpoint and export are gone (retention)" in line
    assert gristmill(["export", str(run)]) == 2
    out = capsys.readouterr()
    assert "skipped step" not in out.out and (  # one line with the newest's reason (trial RV74c 8)
        "no complete checkpoint to export (step 4: step 4 was never trained" in one_error_line(out.err)
    ), out
    assert gristmill(["export", str(run), "--step", str(ALL_DUE)]) == 2
    assert "step 4 was never trained" in one_error_line(capsys.readouterr().err)
    run_here(config, run, "checkpoint.resume='auto'", "run.on_spike='rewind'")
    check_final(run, check_timeline(run))
    # the save itself gone too: why step 4 has nothing, no --resume of a checkpoint not there (review
    # R15h F2); a damaged skip record fails no export of a trained step (a traceback: R15h F5)
    delete_checkpoint(run / "checkpoints" / "step-000004")
    capsys.readouterr()
    assert gristmill(["eval", str(run), "--step", str(ALL_DUE), "--tasks", "heldout_ppl"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "step 4 was never trained: rewind 1 skipped steps 3–4" in line and "--resume" not in line, line
    plan = json.loads((run / "data_plan.json").read_text())
    del plan["skips"][0]["checkpoint_step"]
    (run / "data_plan.json").write_text(json.dumps(plan))
    assert gristmill(["export", str(run), "--step", str(LAST)]) == 2  # refused, never read as no skip
    line = one_error_line(capsys.readouterr().err)  # (R15i F1: a rewind's save exported as trained)
    assert f"{run / 'data_plan.json'} is damaged (a rewind's record" in line, line
    advice = line[
        line.index("gristmill train --config ") : line.index(" --resume auto") + len(" --resume auto")
    ]
    # the advice is checked, not how a worker starts: its torchrun forks the worker (torch and the
    # trainer preloaded), not a fresh Python's ~4 s of imports; the product starts the agent fresh
    for name, value in forked.workers_env().items():
        monkeypatch.setenv(name, value)
    assert gristmill(shlex.split(advice)[1:]) == 0  # as advised: a finished run trains nothing
    assert gristmill(["export", str(run), "--step", str(LAST)]) == 0
