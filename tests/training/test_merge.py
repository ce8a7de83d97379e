"""[merge] (issue 46): weights averaged in the loop, checked against the per-step exports of the same
run, through a kill -9 inside a window, a rewind inside one, 2 FSDP ranks, the refusals, the rows,
the trackers and the exports.

The recipe: the tiny model on a synthetic dataset, 8 steps, a checkpoint and an HF export after
every step (the weights after each step, to rebuild the averages from), validation every 4. The
merged weights are rebuilt here with the same fp32 operations the trainer uses (a window: the first
step's weights, += each later one's, ÷ the count; an EMA: the first step's weights, then lerp towards
each later one's by 1 − decay), so they must be equal bit for bit, not close.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.train_runs import ENV, ROOT, TINY, one_error_line, overrides, read_metrics, torchrun_cmd
from training.config import MergeSection
from training.contract.config_loader import ConfigError
from training.contract.run_layout import checkpoint_dir, export_dir, list_steps
from training.merge import MergedWeights, MergePoints, master_tensor
from training.run.faults import KILL, NAN_LOSS, SPIKE_WINDOW
from training.train import load_train_config, main, train

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

WINDOW = ("merge.kind='window'", "merge.every=4", "merge.window=3", "merge.export=true")
EMA = ("merge.kind='ema'", "merge.every=4", "merge.decay=0.7", "merge.export=true")
# Fewer saves where a test reads no per-step export or checkpoint: writing them is most of a run's cost
NO_STEP_EXPORTS = "checkpoint.export_interval=0"  # the merged exports only
SPARSE = "checkpoint.interval=2"  # merge.every = 4 (export = true) still meets a checkpoint


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset()


def sets(dataset: Path, run: Path, *extra: str) -> list[str]:
    """8 steps, a checkpoint and an export after each, validation at 4 and 8."""
    per_step = [
        "schedule.steps=8",
        "checkpoint.interval=1",
        "checkpoint.keep_last=0",
        "checkpoint.export_interval=1",
    ]
    return overrides(dataset, run, *per_step, "run.val_every=4", *extra)


def run_here(dataset: Path, run: Path, *extra: str) -> dict:
    return train(load_train_config(TINY, sets(dataset, run, *extra)))


@pytest.fixture(scope="module")
def runs(dataset, shared) -> dict[str, Path]:
    """The same 8 steps without [merge], with a window (and tensorboard), and with an EMA under Muon;
    each trained once per test run (read-only: copy one to write into it)."""
    extras = {
        "plain": (),
        "window": (*WINDOW, "metrics.tensorboard=true"),
        "ema": (*EMA, "optim.name='muon'"),
    }
    return {
        name: shared.run(
            "1-process",
            lambda run, extra=extra: sets(dataset, run, *extra),
            lambda s, _: train(load_train_config(TINY, s)),
        )
        for name, extra in extras.items()
    }


def weights(run: Path, step: int, merged: bool = False) -> dict[str, torch.Tensor]:
    return load_file(str(export_dir(run, step, merged) / "model.safetensors"))


def window_mean(run: Path, steps: list[int]) -> dict[str, torch.Tensor]:
    first, *rest = [weights(run, s) for s in steps]
    acc = {k: v.clone() for k, v in first.items()}
    for w in rest:
        for k in acc:
            acc[k].add_(w[k])
    return {k: v.div_(float(len(steps))) for k, v in acc.items()}


def ema(run: Path, steps: list[int], decay: float) -> dict[str, torch.Tensor]:
    first, *rest = [weights(run, s) for s in steps]
    acc = {k: v.clone() for k, v in first.items()}
    for w in rest:
        for k in acc:
            acc[k].lerp_(w[k], 1.0 - decay)
    return acc


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), (k, (got[k] - want[k]).abs().max())


def merged_rows(run: Path) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("merged/")} for r in read_metrics(run)}


def test_the_merged_weights_are_the_mean_and_the_ema_of_the_per_step_exports(runs):
    """At each merge point (4 and 8): the window's mean of the last 3 steps, the EMA of every step
    from the first (under Muon); training itself is untouched (the window run's losses and weights
    are the plain run's)."""
    window, ema_run = runs["window"], runs["ema"]
    for point in (4, 8):
        assert_equal(weights(window, point, merged=True), window_mean(window, [point - 2, point - 1, point]))
        assert_equal(weights(ema_run, point, merged=True), ema(ema_run, list(range(1, point + 1)), 0.7))
    assert [r["loss"] for r in read_metrics(window)] == [r["loss"] for r in read_metrics(runs["plain"])]
    assert_equal(weights(window, 8), weights(runs["plain"], 8))
    # the merged weights differ from the raw ones (the test would pass on a copy of them otherwise)
    assert not torch.equal(
        weights(window, 8, merged=True)["model.norm.weight"], weights(window, 8)["model.norm.weight"]
    )
    meta = json.loads((export_dir(window, 8, merged=True) / "gristmill_export.json").read_text())["merged"]
    assert meta == {"kind": "window", "every": 4, "window": 3, "steps": 3, "first": 6, "last": 8}


def test_the_rows_the_step_line_the_trackers_and_the_loss_curve_carry_the_merged_scores(runs, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.metrics import format_line, loss_figure
    from training.plotting import agg_pyplot

    rows = merged_rows(runs["window"])
    assert {s for s, r in rows.items() if r} == {4, 8}  # merge points only
    for step in (4, 8):
        assert rows[step]["merged/steps"] == 3 and 0 < rows[step]["merged/val_loss"] < 10
    raw = {r["step"]: r for r in read_metrics(runs["window"])}
    assert rows[8]["merged/val_loss"] != raw[8]["val_loss"]
    assert f"| val {raw[8]['val_loss']:.4f} | merged val {rows[8]['merged/val_loss']:.4f} |" in format_line(
        raw[8]
    )
    assert not any(merged_rows(runs["plain"]).values())
    events = EventAccumulator(str(runs["window"] / "tensorboard")).Reload()
    logged = events.Scalars("merged/val_loss")
    assert [e.step for e in logged] == [4, 8]
    assert [e.value for e in logged] == pytest.approx([rows[s]["merged/val_loss"] for s in (4, 8)])
    plt = agg_pyplot()
    fig = loss_figure(plt, read_metrics(runs["window"]))
    curves = {line.get_label(): line.get_xydata().tolist() for line in fig.axes[0].get_lines()}
    plt.close(fig)
    assert curves["validation, merged weights ([merge])"] == [[s, rows[s]["merged/val_loss"]] for s in (4, 8)]


def test_kill_9_inside_a_window_then_resume_is_bit_identical(dataset, runs, tmp_path):
    """Killed once merge point 4's checkpoint is complete, before its row: the resume validates the
    merged weights that checkpoint holds for the row. That resume killed once step 7 is trained and
    folded into the window (steps 6–8), before its checkpoint: the next resume goes back to step 6's
    checkpoint, whose accumulator holds step 6 alone, and trains 7 and 8 again. The merged weights
    and every row equal the uninterrupted run's (one run for both kills)."""
    run = tmp_path / "run"
    merged_only = sets(dataset, run, *WINDOW, NO_STEP_EXPORTS)  # no per-step export is read here
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *merged_only]
    for point, saved in (("saved:4", 4), ("trained:7", 6)):
        resume = ["checkpoint.resume='auto'"] if saved == 6 else []
        killed = forked.run([*cmd, *resume], cwd=ROOT, env={**ENV, KILL: point}, timeout=300)
        assert killed.returncode == -9, (point, killed.stderr[-2000:])
        assert list_steps(run / "checkpoints")[-1] == saved, point
        assert list_steps(run / "exports", merged=True) == [4], point
        assert saved not in [r["step"] for r in read_metrics(run)] or point == "trained:7"
    run_here(dataset, run, *WINDOW, NO_STEP_EXPORTS, "checkpoint.resume='auto'")
    assert_equal(weights(run, 8, merged=True), weights(runs["window"], 8, merged=True))
    scores = ("loss", "val_loss", "merged/val_loss", "merged/steps")
    assert [[r.get(k) for k in scores] for r in read_metrics(run)] == [
        [r.get(k) for k in scores] for r in read_metrics(runs["window"])
    ]


def test_a_run_cut_by_max_steps_inside_a_window_merges_as_the_run_trained_at_once(dataset, runs, tmp_path):
    """Cut at step 7 (run.max_steps) inside merge point 8's window (steps 6–8), then resumed: the cut
    read the window as a merge point, closed it, and step 8 averaged step 8 alone; the merged weights
    a run ships depended on how it was cut into jobs. A cut is no merge point."""
    run = tmp_path / "run"
    merged_only = (*WINDOW, NO_STEP_EXPORTS)  # no per-step export is read here
    run_here(dataset, run, *merged_only, "run.max_steps=7")
    assert list_steps(run / "exports", merged=True) == [4]
    run_here(dataset, run, *merged_only, "checkpoint.resume='auto'")
    assert list_steps(run / "exports", merged=True) == [4, 8]
    assert_equal(weights(run, 8, merged=True), weights(runs["window"], 8, merged=True))
    assert merged_rows(run)[8] == merged_rows(runs["window"])[8] and merged_rows(run)[8]["merged/steps"] == 3


@pytest.mark.parametrize("rewind", [False, True])
def test_a_plan_grown_on_resume_merges_as_the_grown_plan_trained_at_once(
    dataset, tmp_path, capsys, monkeypatch, rewind
):
    """10 steps (merge points 4, 8 and the last, 10: steps 9–10), then resumed with 12 (a constant LR:
    steps 1–10 train alike): step 12's window is 10–12 as in the 12 steps trained at once, bit for
    bit, step 10's weights the checkpoint's own. It was floored at step 10, no merge point of 12
    steps, and averaged 11–12, saying nothing (review R26d F1). With a non-finite step 11 rewound to
    step 10's checkpoint (saved under the 10-step plan): the rewind restored that plan's window too,
    and step 12 averaged itself alone (review RV26f A1); now 10 and 12, as at once."""
    constant = ("optim.min_lr=0.003", "schedule.warmup_steps=0", *WINDOW)
    if rewind:
        monkeypatch.setenv(NAN_LOSS, "11")
        constant += ("run.on_nonfinite='rewind'", "run.rewind.skip_steps=1", "run.rewind.margin_steps=1")
    at_once, grown = tmp_path / "at-once", tmp_path / "grown"
    # saved only where read: at_once's merged exports and (rewound) step 10's checkpoint, grown's step
    # 10 (its checkpoint and export) before the resume's per-step ones
    run_here(dataset, at_once, *constant, "schedule.steps=12", SPARSE, NO_STEP_EXPORTS)
    run_here(dataset, grown, *constant, "schedule.steps=10", SPARSE, "checkpoint.export_interval=10")
    assert list_steps(grown / "exports", merged=True) == [4, 8, 10]
    capsys.readouterr()
    run_here(dataset, grown, *constant, "schedule.steps=12", "checkpoint.resume='auto'")
    assert "note: [merge]" not in capsys.readouterr().out
    assert_equal(weights(grown, 12, merged=True), weights(at_once, 12, merged=True))
    assert_equal(weights(grown, 12, merged=True), window_mean(grown, [10, 12] if rewind else [10, 11, 12]))
    steps = 2 if rewind else 3
    assert (
        merged_rows(grown)[12] == merged_rows(at_once)[12] and merged_rows(grown)[12]["merged/steps"] == steps
    )


REWIND = ("run.on_spike='rewind'", "run.spike_window=4", "run.spike_sigma=4.0", "run.rewind.margin_steps=2",
          "run.rewind.skip_steps=2")  # fmt: skip


@pytest.mark.parametrize("kind", ["window", "ema"])
def test_a_rewind_inside_a_window_leaves_out_the_discarded_steps(
    dataset, tmp_path, monkeypatch, capsys, kind
):
    """A spike at step 7 goes back to step 5's checkpoint and skips 6–7; the merged weights hold no
    discarded or skipped step. A window of 4 every 4: step 8's window (5–8) is steps 5 and 8, step 5
    from before the checkpoint (its accumulator restored), the attempt's step 6 left out. An EMA read
    every 3 steps: the attempt's merge point 6 is set aside with its exports (export --merged of it
    says so), and the EMA folds in 1–5 then 8."""
    monkeypatch.setenv(SPIKE_WINDOW, "step:7*50")
    run = tmp_path / "run"
    merge = (
        (*WINDOW[:2], "merge.window=4", *WINDOW[3:])
        if kind == "window"
        else (*EMA[:1], "merge.every=3", *EMA[2:])
    )
    summary = run_here(dataset, run, *merge, *REWIND)
    assert summary["rewinds"] == 1
    if kind == "window":
        assert list_steps(run / "exports", merged=True) == [4, 8]
        assert_equal(weights(run, 4, merged=True), window_mean(run, [1, 2, 3, 4]))
        assert_equal(weights(run, 8, merged=True), window_mean(run, [5, 8]))
        assert merged_rows(run)[8]["merged/steps"] == 2
        return
    assert list_steps(run / "exports", merged=True) == [3, 8]
    assert (run / "exports" / "abandoned-merged-step-000006").is_dir()
    assert_equal(weights(run, 8, merged=True), ema(run, [1, 2, 3, 4, 5, 8], 0.7))
    assert merged_rows(run)[8]["merged/steps"] == 6
    capsys.readouterr()
    assert gristmill(["export", str(run), "--step", "6", "--merged"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "exports/abandoned-merged-step-000006" in line and "set aside" in line, line


@pytest.mark.parametrize("kind", ["window", "ema"])
def test_a_merge_point_inside_a_skip_is_said_to_have_no_merged_weights(
    dataset, tmp_path, monkeypatch, capsys, kind
):
    """Every 3: a spike at step 7 goes back to step 5 and skips 6–7, past merge point 6, whose window
    (of 3) had trained steps 4–5. Merged weights live in the merge point's checkpoint, and a skipped
    step has none: step 6 had none, and nothing said so (docs/merging.md promised them where a step of
    the window was trained: review RV51a 1; an EMA's, where it had folded in a step: trial RV68b F3).
    The rewind's line says it now; step 8 averages its own window's trained step alone."""
    monkeypatch.setenv(SPIKE_WINDOW, "step:7*50")
    run = tmp_path / "run"
    how = "merge.window=3" if kind == "window" else "merge.decay=0.7"
    merge = (f"merge.kind='{kind}'", "merge.every=3", how, "merge.export=true")
    capsys.readouterr()
    assert run_here(dataset, run, *merge, *REWIND)["rewinds"] == 1
    out = capsys.readouterr().out
    held = "its window's 2 trained step(s), 4–5, have" if kind == "window" else "the EMA of steps 1–5 has"
    assert (
        f"; note: [merge] merge point 6 lies inside the skip, so it has no merged weights ({held} no "
        "checkpoint of step 6 to be kept in)"
    ) in out, out
    assert list_steps(run / "exports", merged=True) == [3, 8]
    if kind == "window":
        assert_equal(weights(run, 8, merged=True), window_mean(run, [8]))


def test_merge_points_no_checkpoint_keeps_are_named_at_the_start_and_in_the_plan(dataset, tmp_path, capsys):
    """merge.export = false, every 3, a checkpoint every 2: merge point 3's merged weights are scored but
    no checkpoint keeps them, and `export --step 3 --merged` refused with nothing said before (trial
    RV68b F4). The run's start and `--plan` name it with the fix; every 4 on the same grid, nothing."""
    run = tmp_path / "run"
    merge = ("merge.kind='window'", "merge.every=3", "merge.window=3", SPARSE, NO_STEP_EXPORTS)
    note = (
        "note: [merge] merge point(s) 3 fall on no checkpoint (checkpoint.interval = 2), so their merged "
        f"weights are never kept: `gristmill export {run} --step 3 --merged` will refuse; make merge.every "
        "a multiple of checkpoint.interval (e.g. merge.every = 4, or checkpoint.interval = 1)"
    )
    capsys.readouterr()
    assert gristmill(["train", "--config", TINY, "--plan", "--set", *sets(dataset, run, *merge)]) == 0
    assert note in capsys.readouterr().out
    run_here(dataset, run, *merge)
    assert f"  plan    {note}" in capsys.readouterr().out
    assert gristmill(["export", str(run), "--step", "3", "--merged"]) == 2
    assert "step 3 has no checkpoint" in one_error_line(capsys.readouterr().err)
    other = tmp_path / "other"  # not the run's directory: a plan that starts over it is refused
    assert gristmill(["train", "--config", TINY, "--plan", "--set", *sets(dataset, other, *merge, *W4)]) == 0
    assert "note: [merge]" not in capsys.readouterr().out


def test_two_fsdp_ranks_match_one_process(dataset, runs, tmp_path):
    """torchrun, 2 ranks (gloo), parallel.shard = 2: each rank accumulates its shard; the merged
    weights DCP reassembles are the mean of that run's own per-step weights exactly, and the
    single process's to its summation order (the losses' tolerance, tests/training/test_train.py)."""
    run = tmp_path / "run"
    proc = forked.run(
        torchrun_cmd(sets(dataset, run, *WINDOW, "parallel.shard=2")), cwd=ROOT, env=ENV, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 ranks × 4 micro" in proc.stdout and "  merge   mean of the last 3 steps" in proc.stdout
    for point in (4, 8):
        got = weights(run, point, merged=True)
        assert_equal(got, window_mean(run, [point - 2, point - 1, point]))
        for k, want in weights(runs["window"], point, merged=True).items():
            torch.testing.assert_close(got[k], want, rtol=0, atol=1e-5)
    one, two = merged_rows(runs["window"]), merged_rows(run)
    assert two[8]["merged/val_loss"] == pytest.approx(one[8]["merged/val_loss"], abs=1e-5)


def test_init_from_a_base_merges_the_trained_steps_only(runs, dataset, tmp_path):
    """From a base model ([model] init_from: the plain run's export of step 4), the EMA starts at the
    weights after the run's first trained step, never the base's."""
    run = tmp_path / "run"
    base = f"model.init_from={json.dumps(str(export_dir(runs['plain'], 4)))}"
    run_here(dataset, run, base, "schedule.steps=4", *EMA)
    assert_equal(weights(run, 4, merged=True), ema(run, [1, 2, 3, 4], 0.7))
    assert merged_rows(run)[4]["merged/steps"] == 4


W4, E4 = ("merge.kind='window'", "merge.every=4"), ("merge.kind='ema'", "merge.every=4")
EVERY3 = (
    "checkpoint.interval=3",
    "checkpoint.export_interval=3",
)  # checkpoints merge.every = 4 does not meet


def _window(every: int, window: int, end: int) -> MergedWeights:
    torch.manual_seed(0)
    return MergedWeights(
        torch.nn.Linear(2, 2),
        MergeSection(kind="window", every=every, window=window),
        MergePoints(every, (end,)),
    )


def _saved(merge: MergedWeights) -> dict:
    return {k: ({n: t.clone() for n, t in v.items()} if isinstance(v, dict) else v)
            for k, v in merge.state_dict().items()}  # fmt: skip


def test_the_note_of_a_window_begun_before_a_resume_is_said_only_when_the_plan_moved(capsys):
    """A resume whose plan ends sooner (40 → 38) puts the last merge point in a window (35–38) whose
    first steps were trained before it: the checkpoint's own step joins it exactly (step 35's
    weights are the model's), a partial window of the old plan whose steps are all in the new one is
    kept (37 of 35–38), and only the steps the checkpoint holds no sum of are said, once (35–36). A
    kill -9 after a rewind's skip, resumed under the same plan, says nothing: the window's first steps
    were skipped, not trained, as in the uninterrupted run (review R6)."""
    merge = _window(100, 4, 40)
    for s in range(1, 36):
        merge.trained(s)
    resumed = _window(100, 4, 38)
    resumed.load_state_dict(_saved(merge))
    resumed.resume(35)
    resumed.trained(36)
    assert "note: [merge]" not in capsys.readouterr().out
    assert (resumed.count, resumed.first, resumed.last) == (2, 35, 36)
    merge = _window(100, 4, 40)
    for s in range(1, 38):
        merge.trained(s)
    resumed = _window(100, 4, 38)
    resumed.load_state_dict(_saved(merge))  # a partial window for 40, steps 37–37: kept
    resumed.resume(37)
    resumed.trained(38)
    out = capsys.readouterr().out
    assert (
        "note: [merge] step 38's window is steps 35–38, but the checkpoint of step 37, saved under a plan"
        in out
    )
    assert "holds no sum of steps 35–36: its merged weights average the steps from 37 on" in out
    assert out.count("note: [merge]") == 1 and (resumed.count, resumed.first) == (2, 37)
    merge = _window(10, 4, 40)
    for s in range(1, 5):
        merge.trained(s)
    at4 = _saved(merge)
    merge.trained(5)
    merge.load_state_dict(at4)  # a rewind to step 4 that skips 5–8 (the window of 10 is 7–10)
    merge.reached(8)
    resumed = _window(10, 4, 40)
    resumed.load_state_dict(_saved(merge))  # killed after the skip's save, resumed
    resumed.resume(8)
    resumed.trained(9)
    assert "note: [merge]" not in capsys.readouterr().out
    # … nor where the plan moved too: the window's steps before the resume were skipped (review R7)
    merge = _window(100, 4, 40)
    for s in range(1, 35):
        merge.trained(s)
    at34 = _saved(merge)
    merge.trained(35)
    merge.load_state_dict(at34)  # a rewind to 34 that skips 35–36
    merge.reached(36)
    resumed = _window(100, 4, 38)
    resumed.load_state_dict(_saved(merge))
    resumed.resume(36)
    resumed.trained(37)
    assert "note: [merge]" not in capsys.readouterr().out


def _load(merge: MergedWeights, state: dict) -> None:
    """A checkpoint's state loaded as DCP loads it: the accumulator in place, then the record."""
    for name, t in state["acc"].items():
        merge.acc[name].copy_(t)
    merge.load_state_dict(state)


def _steps(merge: MergedWeights, steps, rewind: tuple[int, int] | None = None) -> dict[int, dict]:
    """Trains `steps` into `merge` with the weights of step k all k (sums of small integers are exact);
    `rewind` (to, through): after step `through`, back to step `to`'s state, the steps up to `through`
    skipped. Returns the states saved after each step."""
    saved = {}
    for k in steps:
        with torch.no_grad():
            for _, p in merge.params:
                p.fill_(float(k))
        merge.trained(k)
        saved[k] = _saved(merge)
        if rewind is not None and k == rewind[1]:
            _load(merge, saved[rewind[0]])
            with torch.no_grad():
                for _, p in merge.params:
                    p.fill_(float(rewind[0]))  # the checkpoint's weights
            merge.reached(k)
            saved[k] = _saved(merge)
    return saved


@pytest.mark.parametrize(
    "every, window, old_end, at, new_end, rewind, averaged, missing",
    [
        (
            4,
            3,
            10,
            10,
            12,
            None,
            [10, 11, 12],
            None,
        ),  # review R26d F1: a phase appended, the old end off-grid
        (4, 1, 10, 10, 12, None, [12], None),
        (4, 2, 10, 10, 12, None, [11, 12], None),
        (4, 4, 10, 10, 12, None, [10, 11, 12], "9–9"),  # step 9: in step 10's mean, no sum of it
        (4, 3, 10, 10, 11, None, [10, 11], "9–9"),  # grown to an end off the grid
        (4, 3, 8, 8, 12, None, [10, 11, 12], None),  # the old end on the grid: a merge point of both
        (4, 3, 8, 8, 10, None, [9, 10], None),
        (4, 3, 16, 10, 11, None, [10, 11], "9–9"),  # cut inside 12's window {10}, shortened to 11: kept
        (4, 3, 14, 13, 15, None, [13, 14, 15], None),  # 14's partial {13} is 15's too
        (8, 4, 20, 18, 22, None, [19, 20, 21, 22], None),  # 20's partial {17, 18} is outside 22's window
        (4, 3, 10, 10, 12, (8, 9), [10, 11, 12], None),  # a rewind to 8 that skipped 9, then grown
        (4, 3, 10, 10, 12, (9, 10), [11, 12], None),  # a rewind that skipped the old last step 10
        (4, 4, 10, 10, 12, (8, 9), [10, 11, 12], None),  # step 9 of the window skipped: nothing to say
        (4, 3, 16, 10, 11, (8, 9), [10, 11], None),  # (review RV26f A2: it was said as not summed)
    ],
)
def test_a_resume_whose_plan_merges_elsewhere_averages_the_steps_of_its_windows(
    capsys, every, window, old_end, at, new_end, rewind, averaged, missing
):
    """Resumed from step `at`'s checkpoint of a plan ending at `old_end` with one ending at `new_end`:
    the merged weights of the new last step are the mean of `averaged` (the steps of its window the
    run trained), bit for bit those of the new plan trained at once where the checkpoint holds them
    all (it floored the window at the old plan's last step: review R26d F1, steps 11–12 of 10–12),
    and the steps it holds no sum of are said. An EMA is not touched by the resume."""
    old = _window(every, window, old_end)
    before = range(1, at + 1)
    at_once = _window(every, window, new_end)
    _steps(at_once, range(1, new_end + 1), rewind)
    resumed = _window(every, window, new_end)
    _load(resumed, _steps(old, before, rewind)[at])
    with torch.no_grad():  # the checkpoint's weights: its last trained step's
        for (_, p), (_, q) in zip(resumed.params, old.params):
            p.copy_(q)
    resumed.resume(at, lambda k: rewind is not None and rewind[0] < k <= rewind[1])
    _steps(resumed, range(at + 1, new_end + 1))
    out = capsys.readouterr().out
    assert resumed.merged_at(new_end) and resumed.count == len(averaged)
    assert (resumed.first, resumed.last) == (averaged[0], averaged[-1])
    mean = sum(averaged) / len(averaged)
    assert all(torch.equal(a, torch.full_like(a, mean)) for a in resumed.acc.values())
    if missing is None:
        assert "note: [merge]" not in out
        assert all(torch.equal(a, b) for a, b in zip(resumed.acc.values(), at_once.acc.values()))
    else:
        assert out.count("note: [merge]") == 1 and f"holds no sum of steps {missing}:" in out
    ema = MergedWeights(
        torch.nn.Linear(2, 2), MergeSection(kind="ema", every=4, decay=0.5), MergePoints(4, (10,))
    )
    state = _steps(ema, range(1, 11))[10]
    _load(ema, state)
    ema.resume(10)
    assert _saved(ema)["meta"] == state["meta"] and all(
        torch.equal(ema.acc[k], state["acc"][k]) for k in state["acc"]
    )


@pytest.mark.parametrize(
    "bad, key, message",
    [
        (W4, "merge.window", "merge.window = 0 (its default) must be ≥ 1"),
        # given, not "(its default)" (trial RV77b 2a)
        ((*W4, "merge.window=0"), "merge.window", "merge.window = 0 must be ≥ 1"),
        ((*W4, "merge.window=-1"), "merge.window", "merge.window = -1 must be ≥ 1: merge.kind = 'window'"),
        ((*W4, "merge.window=5"), "merge.window", "merge.window = 5 is more than merge.every = 4"),
        ((*E4, "merge.decay=1.0"), "merge.decay", "merge.decay = 1.0 must be in (0, 1)"),
        (E4, "merge.decay", "merge.decay = 0.0 (its default) must be in (0, 1): merge.kind = 'ema' sets"),
        (("merge.kind='ema'", "merge.every=0", "merge.decay=0.9"), "merge.every",
         "merge.every = 0 must be"),
        (("merge.kind='ema'", "merge.decay=0.9"), "merge.every", "merge.every = 0 (its default) must be"),
        (("merge.every=4",), "merge.every", "merge.every = 4 is set but merge.kind = 'none'"),
        ((*W4, "merge.window=2", "merge.decay=0.5"), "merge.decay", "merge.decay = 0.5 is the EMA's"),
        ((*E4, "merge.decay=0.9", "merge.export=true", *EVERY3),
         "merge.export", "merge.every = 4 is not a multiple of checkpoint.interval = 3"),
        # "make it a multiple of checkpoint.interval = 0" (trial RV70a 2)
        ((*E4, "merge.decay=0.9", "merge.export=true", "checkpoint.interval=0", NO_STEP_EXPORTS),
         "merge.export", "checkpoint.interval = 0 saves one only at a SIGTERM or SIGINT: set "
         "checkpoint.interval to a divisor of merge.every = 4, or merge.export = false"),
        (("checkpoint.interval=0",), "checkpoint.export_interval",
         "checkpoint.export_interval = 1 exports the checkpoints of its steps, but checkpoint.interval = 0 "
         "saves one only at a SIGTERM or SIGINT: set checkpoint.interval to a divisor of 1, or "
         "checkpoint.export_interval = 0"),
    ],
)  # fmt: skip
def test_bad_merge_settings_are_refused_before_any_work(dataset, tmp_path, bad, key, message):
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        run_here(dataset, run, *bad)
    assert refused.value.key == key and message in str(refused.value), str(refused.value)
    assert not run.exists()


def test_adding_or_changing_merge_on_resume_is_one_line(runs, dataset, tmp_path, capsys):
    plain, window = tmp_path / "plain", tmp_path / "window"
    shutil.copytree(runs["plain"], plain)
    shutil.copytree(runs["window"], window)
    for run, extra, want in (
        (
            plain,
            WINDOW,
            # "the run trained without [merge]": untrue of one that dropped it on a resume (review R21c 4b)
            "merge.kind = 'window': [merge] was added on resume, and the checkpoint holds no merged weights "
            "(it was saved by a run without [merge], so",
        ),
        (window, (*WINDOW, "merge.window=2"), "merge.window = 2 differs from the 3 the run merged with"),
        (window, EMA, 'merge.kind = "ema" differs from the "window" the run merged with'),
        (plain, ("model.n_layers=7",), "it holds another model (model.n_layers = 2 in the checkpoint, 7"),
        (plain, ("optim.name='muon'",), "it holds the state of optim.name = 'adamw', and this config has"),
        (plain, ("run.seed=5",), "run.seed = 5 in this config, "),
    ):
        before = (run / "config.toml").read_text()
        capsys.readouterr()
        assert main(["--config", TINY, "--set", *sets(dataset, run, *extra), "checkpoint.resume='auto'"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert want in line, line
        # --plan says what the resume refuses: it printed the plan, exit 0 (trial RV77b 1)
        plan = ["train", "--config", TINY, "--set", *sets(dataset, run, *extra), "--resume", "auto", "--plan"]
        assert gristmill(plan) == 2
        assert want in one_error_line(capsys.readouterr().err)
        assert (run / "config.toml").read_text() == before
    # the newest checkpoint's COMPLETE damaged: the resume passes over it, and --plan too, which refused
    # the resume over it as "unreadable" (review RV77d 1)
    (checkpoint_dir(plain, 8) / "COMPLETE").write_text("{ damaged")
    assert (
        gristmill(["train", "--config", TINY, "--set", *sets(dataset, plain), "--resume", "auto", "--plan"])
        == 0
    )
    # removing [merge] is allowed: the checkpoint's average is no longer read (steps 7-8 trained again)
    for step in (7, 8):
        shutil.rmtree(checkpoint_dir(window, step))
    assert main(["--config", TINY, "--set", *sets(dataset, window), "checkpoint.resume='auto'"]) == 0
    rows = read_metrics(window)
    assert [r["step"] for r in rows][-2:] == [7, 8] and not any(k.startswith("merged/") for k in rows[-1])
    # a step that the config which trained it made no merge point, [merge] removed since: said so, not
    # "a rewind skipped its window, or config.toml made it a merge point" (trial RV57a F5)
    capsys.readouterr()
    assert gristmill(["export", str(window), "--step", "5", "--merged"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "step 5 is not a merge point: merge.every = 4 reads the merged weights at its multiples" in line, (
        line
    )


def test_export_and_verify_of_merged_steps(runs, tmp_path, capsys):
    """`gristmill export RUN --step N --merged` (the run's export, or a copy made from the checkpoint:
    the same bytes of weights), a bf16 copy transformers loads, and one line for a step without
    merged weights."""
    transformers = pytest.importorskip("transformers")
    window = shutil.copytree(runs["window"], tmp_path / "window")  # the export below writes into it
    assert gristmill(["export", str(window), "--step", "8", "--merged"]) == 0
    assert f"export: {export_dir(window, 8, merged=True)}" in capsys.readouterr().out
    copy = tmp_path / "copy"
    assert gristmill(["export", str(window), "--step", "4", "--merged", "--out", str(copy)]) == 0
    assert_equal(load_file(str(copy / "model.safetensors")), weights(window, 4, merged=True))
    half = tmp_path / "bf16"
    assert gristmill(["export", str(window), "--merged", "--out", str(half), "--dtype", "bf16"]) == 0
    assert (
        "exporting step 8, the newest complete checkpoint holding its merged weights"
        in capsys.readouterr().out
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(str(half))
    want = weights(window, 8, merged=True)["model.norm.weight"].to(torch.bfloat16)
    assert torch.equal(model.state_dict()["model.norm.weight"], want)
    for run, step, why in (
        (window, 5, "step 5 is not a merge point: merge.every = 4 reads the merged weights at its multiples"),
        (runs["plain"], 4, "of step 4: step 4 was trained with merge.kind = 'none' ("),  # once (RV75b 2)
        (window, 0, "step 0 is the base model, before any trained step"),
    ):
        capsys.readouterr()
        assert gristmill(["export", str(run), "--step", str(step), "--merged"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert why in line, line
    # the newest, of a run without [merge]: one line, not a "skipped step" line per checkpoint first
    capsys.readouterr()
    assert gristmill(["export", str(runs["plain"]), "--merged"]) == 2
    out, err = capsys.readouterr()
    assert "skipped" not in out + err and len(err.strip().splitlines()) == 1, (out, err)
    assert "holds no complete checkpoint that holds merged weights (step " in err and "no [merge] in " in err
    # eval --merged says why as export does: "train with [merge] first" was said of runs with [merge]
    # whose merge points no checkpoint fell on (trial RV77b 2b)
    assert gristmill(["eval", str(runs["plain"]), "--merged", "--tasks", "heldout_ppl"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "merged weights): its newest checkpoint, step 8: step 8 was trained with merge.kind" in line, line
    capsys.readouterr()
    assert gristmill(["verify", str(window)]) == 0
    out = capsys.readouterr().out
    assert out.count("merged export") == 2 and "0 damaged" in out
    # Another step's export copied under step 4's name checked out file by file: verify, export and
    # eval took it for step 4's (review R17b S3); its gristmill_export.json says which step it holds.
    shutil.rmtree(export_dir(window, 4, merged=True))
    shutil.copytree(export_dir(window, 8, merged=True), export_dir(window, 4, merged=True))
    assert gristmill(["verify", str(window)]) == 1
    assert (
        "holds the merged weights of step 8 (its gristmill_export.json), not the merged"
        in capsys.readouterr().out
    )
    assert gristmill(["export", str(window), "--step", "4", "--merged"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "merged-step-000004 holds the merged weights of step 8" in line, line
    assert "aside and export it again from its checkpoint" in line and "delete " not in line, line  # RV32l F4


def test_the_swap_for_scoring_is_exact_and_float8_weights_are_read_inside_their_wrapper():
    """Scoring swaps the merged weights into the model and back through copies: the raw weights and
    the accumulator come back bit for bit. torchao's float8 FSDP wrapper (how model.float8 keeps a
    weight under FSDP2) is read at its high-precision tensor, the one the optimizer updates."""
    from tests.helpers.models import tiny_model

    pytest.importorskip("torchao")
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model = tiny_model()
    raw = {k: v.clone() for k, v in model.state_dict().items()}
    merged = MergedWeights(model)
    for a in merged.acc.values():
        a.normal_()
    acc = {k: v.clone() for k, v in merged.acc.items()}
    with merged.swapped():
        assert all(torch.equal(p, acc[n]) for n, p in model.named_parameters())
    assert all(torch.equal(v, raw[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, acc[k]) for k, v in merged.acc.items())
    inner = torch.randn(4, 4)
    wrapped = WeightWithDynamicFloat8CastTensor(inner, LinearMMConfig(), torch.float8_e4m3fn)
    assert master_tensor(wrapped) is inner and master_tensor(inner) is inner


def test_eval_png_draws_the_merged_scores_beside_the_raw_ones():
    """eval.png's panel of a (task, metric) holds the raw weights' values and, apart, the merged
    weights' (eval.parquet's `merged` rows); a merged NaN is left out and counted like a raw one."""
    from validation.eval_results import plot_panels

    def row(step, value, merged):
        return {"step": step, "task": "heldout_ppl", "metric": "bits_per_byte", "filter": "none",
                "value": value, "stderr": None, "merged": merged}  # fmt: skip

    rows = [row(4, 4.4, False), row(4, 4.3, True), row(8, 4.2, False), row(8, float("nan"), True)]
    (panel,) = plot_panels(rows, {})
    assert (panel.steps, panel.values) == ([4, 8], [4.4, 4.2])
    assert panel.merged == [(4, 4.3)] and panel.nonfinite == 1
