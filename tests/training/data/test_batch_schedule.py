"""Batch schedules: `[[phase]] global_batch_tokens` changes the global batch from one phase to the
next (by any ratio), and everything follows it — the plan, the loader, the metrics rows, the
ledger (consumption), `data inspect`, `--plan`; the LR follows it only as optim.batch_lr_scaling
says; a resume keeps the past's batches (refused in the user's keys otherwise), a kill -9 in any
phase resumes bit-identical, and a resume on another number of ranks keeps the global batches.
Every (source, document, token) at most once across the batch changes: test_phases.py's
independent decode runs on this schedule too."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.phased_recipe import BATCH_SCHEDULE as SCHEDULE
from tests.helpers.phased_recipe import recipe_toml
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    assert_batches_as_inspected,
    assert_same_checkpoint,
    one_error_line,
    read_metrics,
    recorded_batches,
    train_recipe,
)
from training.config import TrainConfig
from training.contract.config_loader import ConfigError, load_config
from training.data.recipe import open_plan
from training.data.spec import batch_shapes, check_config, resolve
from training.run.faults import KILL, SPIKE_WINDOW

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

BATCHES = [512] * 4 + [1024] * 3 + [768] * 4  # tokens per step; "long": 3500 // 768 = 4 steps
LAST = len(BATCHES)
SQRT = "batch_lr_scaling = 'sqrt'\n"  # [optim] lines


def schedule_toml(
    sources, run_dir: Path, schedule: str = SCHEDULE, optim: str = SQRT, extra: str = ""
) -> str:
    """The schedule's recipe, `optim` added to its [optim] table (the sqrt rule unless told)."""
    text = recipe_toml(sources, run_dir, phases=schedule, extra=extra).replace(
        "[optim]\n", f"[optim]\n{optim}", 1
    )
    # validation takes the phase's batch: "big"'s 32 × 33 tokens need more of math's held-out split
    return text.replace("val_fraction = 0.1", "val_fraction = 0.3", 1)


def write(sources, path: Path, run_dir: Path, *args: str, **kw: str) -> Path:
    path.write_text(schedule_toml(sources, run_dir, *args, **kw))
    return path


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


# -- the recipe --


def test_a_phase_batch_sets_its_steps_shapes_and_refusals(sources, tmp_path):
    cfg = load_config(TrainConfig, write(sources, tmp_path / "r.toml", tmp_path / "run"))
    spec = check_config(cfg, 2)
    assert [ph.global_batch_tokens for ph in spec.phases] == [512, 1024, 768]
    assert [ph.steps for ph in spec.phases] == [4, 3, 4]  # long: tokens // its own batch
    assert [(s.global_batch, s.grad_accum) for s in batch_shapes(cfg, spec, 2)] == [(16, 2), (32, 4), (12, 3)]

    def refused(schedule: str, world: int = 1) -> str:
        path = write(sources, tmp_path / "bad.toml", tmp_path / "run", schedule)
        with pytest.raises(ConfigError) as e:
            check_config(load_config(TrainConfig, path), world)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "phase[1].seq_len = 32 must divide phase[1].global_batch_tokens = 1000 (a step holds whole" in (
        refused(SCHEDULE.replace("global_batch_tokens = 1024", "global_batch_tokens = 1000"))
    )
    odd = refused(SCHEDULE.replace("global_batch_tokens = 1024", "global_batch_tokens = 96"), world=2)
    assert (
        "the global batch of 3 sequences (phase[1].global_batch_tokens 96 / seq_len 32 of phase 'big') is "
        "not divisible by 2 data-parallel rank(s) × data.micro_batch 4 = 8" in odd
    )
    assert "change data.micro_batch, phase[1].global_batch_tokens or the number of ranks" in odd
    # a resume keeps the run's batches: its global batch is no way out (trial RV67c F4b)
    path = write(sources, tmp_path / "bad.toml", tmp_path / "run", SCHEDULE.replace("= 1024", "= 96", 1))
    with pytest.raises(ConfigError, match=r"; change data.micro_batch or the number of ranks \("):
        check_config(load_config(TrainConfig, path, ['checkpoint.resume="auto"']), 2)
    # an elastic resume is refused for a finished phase's batch too: said (review R18b 2)
    assert odd.endswith(" (every phase's batch must split, a finished one's too)"), odd
    assert "phase[1].global_batch_tokens = -1024 must be a whole number of tokens ≥ 1" in refused(
        SCHEDULE.replace("global_batch_tokens = 1024", "global_batch_tokens = -1024")
    )
    # a warmup in tokens longer than its phase: refused as warmup_steps past the steps is (it was cut
    # to the phase without a word: review R24d 3); one that rounds up into the budget is the phase
    long = 'lr = { shape = "linear", to = 3e-4 }'
    assert SCHEDULE.count(long) == 1
    assert refused(SCHEDULE.replace(long, long.replace("{ ", "{ warmup_tokens = 3501, "))) == (
        "phase[2].lr warmup_tokens = 3,501 is longer than the phase's 3,500 tokens"
    )
    warm = write(
        sources,
        tmp_path / "warm.toml",
        tmp_path / "run",
        SCHEDULE.replace(long, long.replace("{ ", "{ warmup_tokens = 3500, ")),
    )
    assert check_config(load_config(TrainConfig, warm), 1).phases[2].lr.warmup_steps == 4


def test_the_lr_rule_is_explicit_and_refused_without_evidence(sources, tmp_path, capsys):
    run_dir = tmp_path / "run"
    plans = {}
    for rule in ("none", "sqrt"):
        path = write(sources, tmp_path / f"{rule}.toml", run_dir, optim=f"batch_lr_scaling = '{rule}'\n")
        cfg = load_config(TrainConfig, path)
        plans[rule] = open_plan(cfg, resolve(cfg))[0]
    none, sqrt = plans["none"], plans["sqrt"]
    as_written = [1.5e-3, *[3e-3] * 7, 2.1e-3, 1.2e-3, 3e-4]  # warmup, constant ×2, linear
    assert [none.lr(s) for s in range(LAST)] == pytest.approx(as_written, rel=1e-12)
    for s in range(LAST):  # each phase's piece × √(its batch / the first phase's)
        assert sqrt.lr(s) == pytest.approx(none.lr(s) * math.sqrt(BATCHES[s] / 512), rel=1e-12)
    assert sqrt.lr(3) == none.lr(3)  # the first phase's batch: exactly as written

    path = write(sources, tmp_path / "sqrt.toml", run_dir)
    assert gristmill(["train", "--config", str(path), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "tokens/step" in out and "1,024" in out
    assert f"constant {3e-3 * math.sqrt(2):.3g}" in out  # the effective peak of phase "big"
    note = "phase 'big' trains 1,024 tokens per step, 2× the first phase's; optim.batch_lr_scaling = 'sqrt'"
    assert f"{note}: its LR pieces × 1.414" in out
    # phase 'long''s budget of 3,500 tokens is 4 steps of 768: said, not trained short silently (R24a 3)
    budget = "phase 'long': tokens = 3,500 is 4 whole steps of 768 tokens, 3,072 tokens (a budget in tokens"
    assert f"{budget} rounds down to whole steps)" in out

    for optim, words in [
        ("name = 'muon'\nbatch_lr_scaling = 'sqrt'\n", "optim.batch_lr_scaling = 'sqrt' is not "
         "supported with optim.name = 'muon'"),
        ("batch_lr_scaling = 'linear'\n", "linear scaling is SGD's rule (Goyal et al. 2017"),
    ]:  # fmt: skip
        path = write(sources, tmp_path / "refused.toml", run_dir, optim=optim)
        assert gristmill(["train", "--config", str(path)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert words in line, line
        assert not run_dir.exists()


# -- the trainer --


@pytest.fixture(scope="module")
def reference(sources, shared):
    """The schedule trained in this process with the sqrt rule, a checkpoint after every step, no
    plots (the resumes below train its config.toml: each drew plan.png and loss.png again; the
    trainer's plan.png of the schedule is checked on the last test's one-step run); trained once per
    test run (read-only: copy it to write into it). (run dir, its recipe)"""
    extra = "plot = false\n[checkpoint]\ninterval = 1\nkeep_last = 0\n"  # [metrics] plot
    run_dir = shared.run("1-process", lambda run: schedule_toml(sources, run, extra=extra), train_recipe)
    return run_dir, run_dir.with_name("recipe.toml")


def test_everything_follows_the_batch(reference, capsys):
    run_dir, config = reference
    got = read_metrics(run_dir)
    assert [r["phase"] for r in got] == ["small"] * 4 + ["big"] * 3 + ["long"] * 4
    seen = [r["tokens_seen"] for r in got]
    assert [b - a for a, b in zip([0, *seen], seen)] == BATCHES
    for r in got:  # the sources' tokens add up to the tokens seen, and the row's LR is the plan's
        assert sum(r[f"tokens/{n}"] for n in ("web", "code", "math")) == r["tokens_seen"]
    cfg = load_config(TrainConfig, run_dir / "config.toml")
    plan = open_plan(cfg, resolve(cfg))[0]
    assert [r["lr"] for r in got] == [plan.lr(s) for s in range(LAST)]
    assert [ph.global_batch for ph in plan.phases] == [16, 32, 12]

    # the ledger: consumption.parquet through the audit equals the plan's, token for token
    sql = "SELECT phase, source, tokens FROM consumption"
    assert gristmill(["data", "audit", str(run_dir), "--sql", sql, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    want = {(r["phase"], r["source"]): r["tokens"] for r in plan.consumed(LAST)}
    assert {(p, s): int(t) for p, s, t in (line.split(",") for line in lines)} == want
    assert sum(want.values()) == sum(BATCHES)
    # data inspect reads the step's own batch back
    assert gristmill(["data", "inspect", str(run_dir), "--step", "6", "--max-rows", "0"]) == 0
    assert "step 6 = phase 'big' step 2 of 3 (32 sequences × 32 = 1,024 tokens)" in capsys.readouterr().out
    # what each step was fed, across both batch changes: the batches inspect prints (issue 47)
    planned = assert_batches_as_inspected(run_dir)
    assert recorded_batches(run_dir) == [(s, 1, planned[s]) for s in range(1, LAST + 1)]


def test_kill_9_inside_each_phase_resumes_bit_identical(reference, tmp_path):
    """One run killed inside each phase in turn (steps 3, 6 and 9: "small", "big", "long"), each
    kill resumed from the checkpoint it left, the last resume to the end: the uninterrupted run's
    losses, weights and batch records (one run for the three kills, not three runs of 11 steps)."""
    run_dir, config = reference
    killed = tmp_path / "killed"
    base = ["--config", str(config), "--set", f"run.output_dir={json.dumps(str(killed))}",
            "metrics.plot=false"]  # fmt: skip
    for step in (3, 6, 9):
        cmd = [sys.executable, "-m", "training.train", *base, *(["--resume", "auto"] if step > 3 else [])]
        proc = forked.run(cmd, cwd=ROOT, env={**ENV, KILL: f"saved:{step}"}, timeout=300)
        assert proc.returncode == -9, (step, proc.stderr[-2000:])
        assert f"resumed at step {step - 3}" in proc.stdout or step == 3, (step, proc.stdout[-2000:])
    assert gristmill(["train", *base, "--resume", "auto"]) == 0
    assert losses(killed) == losses(run_dir)
    assert_same_checkpoint(run_dir, killed, LAST)
    # The record the killed and resumed run kept is the uninterrupted run's, byte for byte (issue 47).
    assert (killed / "batches.bin").read_bytes() == (run_dir / "batches.bin").read_bytes()
    assert [r["batch_sha256"] for r in read_metrics(killed)] == [
        r["batch_sha256"] for r in read_metrics(run_dir)
    ]


# A rewind back to the phase boundary: step 4 is the last of "small" (512 tokens a step), step 5 the
# first of "big" (1,024). A spike injected at step 6 (≥ 4 losses before it: half the window) goes back
# to the newest checkpoint at or before 6 − 2 = 4 and skips steps 5–6, saving step 6's checkpoint.
MEETING = ["checkpoint.interval=2", "checkpoint.keep_last=0", "metrics.plot=false", "run.on_spike=rewind",
           "run.spike_window=8", "run.spike_sigma=4", "run.rewind.skip_steps=2",
           "run.rewind.margin_steps=2"]  # fmt: skip


def test_a_rewind_and_a_resume_at_a_checkpoint_on_the_phase_boundary_record_what_ran(sources, tmp_path):
    """Issue 47, events meeting on one step: a checkpoint, a phase (and batch) change, a rewind's
    target and a resume, all at step 4; then a resume at the skip's checkpoint (step 6, the next
    phase's). A run killed once its rewind had moved steps 5–6's records apart, before the skip's
    checkpoint existed, resumed at step 4 (it drops them, trains 5–6 again and rewinds again),
    killed as the skip's checkpoint was saved and resumed from it keeps the uninterrupted run's
    records byte for byte: batches.bin steps 1–4 of attempt 1 and 7–11 of
    attempt 2 (never a skipped step, never twice), batches-discarded.bin steps 5–6 of attempt 1,
    each the batch `data inspect RUN --hash` gives it, and verify is silent."""
    config = write(sources, tmp_path / "recipe.toml", tmp_path / "unused")

    def train(run: Path, kill: str | None = None, resume: bool = False) -> subprocess.CompletedProcess:
        env = {**ENV, SPIKE_WINDOW: "step:6*50", **({KILL: kill} if kill else {})}
        cmd = [sys.executable, "-m", "training.train", "--config", str(config), "--set", *MEETING,
               f"run.output_dir={json.dumps(str(run))}", *(["--resume", "auto"] * resume)]  # fmt: skip
        return forked.run(cmd, cwd=ROOT, env=env, timeout=300)

    reference = tmp_path / "reference"
    done = train(reference)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rewind 1/" in done.stdout
    killed = tmp_path / "killed"
    assert train(killed, kill="rewind-recorded").returncode == -9
    again = train(killed, kill="rewind-saved", resume=True)
    assert again.returncode == -9 and "resumed at step 4" in again.stdout, again.stdout[-2000:]
    done = train(killed, resume=True)
    assert done.returncode == 0 and "resumed at step 6" in done.stdout, done.stderr[-3000:]

    planned = assert_batches_as_inspected(killed)
    assert recorded_batches(killed) == [(s, 1, planned[s]) for s in range(1, 5)] + [
        (s, 2, planned[s]) for s in range(7, LAST + 1)
    ]
    assert recorded_batches(killed, "batches-discarded.bin") == [(5, 1, planned[5]), (6, 1, planned[6])]
    for name in ("batches.bin", "batches-discarded.bin"):
        assert (killed / name).read_bytes() == (reference / name).read_bytes(), name

    def rows(run: Path) -> list[tuple]:
        return [(r["step"], r.get("discarded_by_rewind"), r["batch_sha256"]) for r in read_metrics(run)]

    assert rows(killed) == rows(reference)
    phases = [r["phase"] for r in read_metrics(killed) if "discarded_by_rewind" not in r]
    assert phases == ["small"] * 4 + ["big"] + ["long"] * 4
    assert_same_checkpoint(reference, killed, LAST)


def test_a_past_batch_is_immutable_and_a_future_one_may_change(reference, sources, tmp_path, capsys):
    run_dir, _ = reference
    for step, old, new, key in [
        (5, "global_batch_tokens = 1024", "global_batch_tokens = 2048", "phase[1].global_batch_tokens"),
        (6, "steps = 4\nseq_len = 32", "steps = 4\nglobal_batch_tokens = 1024\nseq_len = 32",
         "phase[0].global_batch_tokens"),
    ]:  # fmt: skip
        copy = tmp_path / f"copy{step}"
        changed = write(sources, tmp_path / "changed.toml", copy, SCHEDULE.replace(old, new))
        resume = str(run_dir / "checkpoints" / f"step-{step:06d}")
        assert gristmill(["train", "--config", str(changed), "--resume", resume]) == 2
        line = one_error_line(capsys.readouterr().err)
        was = "1024" if key.startswith("phase[1]") else "512"
        assert f"{key} (phase '{'big' if was == '1024' else 'small'}') = {was} but this run has " in line, (
            line
        )
        assert "the plan's past is immutable" in line
    # a phase not yet begun may take another batch: the run goes on, saying so
    later = SCHEDULE.replace("global_batch_tokens = 768", "global_batch_tokens = 384")
    copy = tmp_path / "future"
    changed = write(sources, tmp_path / "future.toml", copy, later)
    resume = str(run_dir / "checkpoints" / "step-000006")
    assert (
        gristmill(["train", "--config", str(changed), "--resume", resume, "--set", "metrics.plot=false"]) == 0
    )
    out = capsys.readouterr().out
    # the notes name the batch that changed, in the recipe's keys, not every phase (issue 47)
    future = next(
        line for line in out.splitlines() if "the plan's future changed since the checkpoint" in line
    )
    a, b = math.sqrt(768 / 512), math.sqrt(384 / 512)  # the sqrt rule's factors of "long", then and now
    was, now = (
        f"[linear from {3e-3 * f:.6g} to {3e-4 * f:.6g} (× {f:.4g}: optim.batch_lr_scaling)]" for f in (a, b)
    )
    batch = "phase[2].global_batch_tokens 768 → 384 tokens per step"
    tail = f": phase 'long': 4 → 9 steps, {batch}, its LR {was} → {now}"
    assert future.endswith(tail), future
    changed_line = next(line for line in out.splitlines() if line.startswith("note: changed since"))
    assert "phase[2].global_batch_tokens 768 → 384" in changed_line and "{" not in changed_line, changed_line
    assert [r["tokens_seen"] for r in read_metrics(copy)][-1] == sum(
        BATCHES[:7]
    ) + 9 * 384  # 3500 // 384 = 9 steps


def test_a_changed_batch_rule_is_refused_naming_it(reference, sources, tmp_path, capsys):
    """Phase "big" trained with the sqrt rule's LRs: the rule changed is refused naming
    optim.batch_lr_scaling (issue 47: it named optim.lr, which did not change)."""
    run_dir, _ = reference
    changed = write(sources, tmp_path / "none.toml", tmp_path / "copy", optim="batch_lr_scaling = 'none'\n")
    resume = str(run_dir / "checkpoints" / "step-000006")
    assert gristmill(["train", "--config", str(changed), "--resume", resume]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "already trained: optim.batch_lr_scaling (phase 'big': its LRs × 1.414 → × 1); " in line, line
    assert "optim.lr" not in line


def test_a_resume_note_names_what_changed_and_nothing_else(reference, tmp_path, capsys):
    """The documented resume (`--config RUN/config.toml`), into another run.output_dir: no note when
    nothing else differs; the changed keys, named, when something does (issue 47: "the config
    differs from the one step-N was saved with", naming nothing, on the documented path). From the
    next to last step's checkpoint: the note is said before the first step, one step to train."""
    run_dir, _ = reference
    resume = str(run_dir / "checkpoints" / "step-000010")
    for sets, said in [
        ([], None),
        (["optim.weight_decay=0.05"], "optim.weight_decay 0.1 → 0.05"),
        (["model.rope_theta=5e5"], "model.rope_theta unset → 500000.0"),  # not "None": the preset's
        # the same shares spelled otherwise (6/3/1 is 0.6/0.3/0.1): "changed … in effect" (trial RV61a 2)
        (["phase[0].mix={web=6,code=3,math=1}"], None),  # (other shares there: refused, the past)
    ]:
        copy = tmp_path / f"copy{len(sets)}{sets[:1]}"
        argv = ["train", "--config", str(run_dir / "config.toml"), "--resume", resume, "--set",
                f"run.output_dir={json.dumps(str(copy))}", *sets]  # fmt: skip
        assert gristmill(argv) == 0
        notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
        saved = "note: changed since step-000010 was saved"  # from the config its COMPLETE records
        when = "in effect from step 11, and for step 10's validation and eval if a stop cut them off"
        want = [] if said is None else [f"{saved}: {said}; {when}"]
        assert [n for n in notes if "config differs" in n or "changed since" in n] == want, notes


def test_a_resume_note_names_sources_by_name_when_one_is_inserted(
    reference, sources, synthetic_dataset, tmp_path, capsys
):
    """Review R24a 1: a source inserted first was compared by position, as if source 'web' now read
    another dataset (`data.sources[0].dataset '…/web' → '…/extra'`, `.name 'web' → 'extra'`, …); the
    plan matches sources by name. The note says one source was added, and the phase mix it is in."""
    run_dir, _ = reference
    names = list(sources)
    extra = synthetic_dataset(n_docs=100, seed=4)
    grown = {"extra": extra, **sources}  # the last phase ("long"), not begun yet, reads it
    mix = "mix = { web = 0.4, code = 0.4, math = 0.2 }"
    assert SCHEDULE.count(mix) == 1
    schedule = SCHEDULE.replace(mix, "mix = { web = 0.4, code = 0.4, extra = 0.2 }")
    path = write(grown, tmp_path / "grown.toml", tmp_path / "grown", schedule)
    resume = str(run_dir / "checkpoints" / "step-000006")
    assert gristmill(["train", "--config", str(path), "--resume", resume, "--set", "metrics.plot=false"]) == 0
    saved = "note: changed since step-000006 was saved: "
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith(saved)]
    order = f"data.sources (names) {names!r} → {list(grown)!r}"
    added = f"data.sources[extra].dataset absent → {str(extra)!r}"
    assert len(notes) == 1 and order in notes[0] and added in notes[0], notes
    assert "data.sources[web]" not in notes[0] and "data.sources[0]" not in notes[0], notes
    # a phase not begun renamed: one change beside the others, not each of its keys twice, which
    # pushed the other changes past the note's eight (review R24d 1)
    path = write(
        sources, tmp_path / "renamed.toml", tmp_path / "renamed", SCHEDULE.replace('"long"', '"anneal"')
    )
    argv = [
        "train",
        "--config",
        str(path),
        "--resume",
        resume,
        "--set",
        "metrics.plot=false",
        "optim.weight_decay=0.05",
    ]
    assert gristmill(argv) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(saved)]
    assert "phase[2].name 'long' → 'anneal'" in note and "optim.weight_decay 0.1 → 0.05" in note, note
    assert "(names)" not in note and "phase[anneal]" not in note, note


def test_a_resume_note_compares_with_the_checkpoints_own_config(reference, tmp_path, capsys):
    """Review R23c 2: another run's checkpoint copied into a run's checkpoints/ was resumed (auto) with
    a note that diffed this config against the run's own config.toml, naming a setting that was not
    the difference (run.max_steps 2 → 7) and not the one that was (run.seed; now optim.weight_decay: a
    resume that changes run.seed is refused, review R25b 2). COMPLETE records its config: the note names
    what differs from it."""
    run_dir, _ = reference
    other = tmp_path / "other"
    base = [
        "train",
        "--config",
        str(run_dir / "config.toml"),
        "--set",
        f"run.output_dir={json.dumps(str(other))}",
    ]
    assert gristmill([*base, "optim.weight_decay=0.05", "run.max_steps=2"]) == 0
    shutil.copytree(run_dir / "checkpoints" / "step-000006", other / "checkpoints" / "step-000006")
    # The run's record names its run now: another run's checkpoint is passed over (trial RV60c 1). A run
    # from before the record has none to tell it by: resumed, the note is the checkpoint's own config's.
    from training.checkpoint.io import newest_verified

    chosen, _, passed = newest_verified(other)
    assert chosen == other / "checkpoints" / "step-000002" and "another run's checkpoint" in passed[0][1]
    (other / "checkpoints.jsonl").unlink()
    capsys.readouterr()
    assert gristmill([*base, "optim.weight_decay=0.05", "run.max_steps=7", 'checkpoint.resume="auto"']) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "changed since" in line]
    decay = load_config(TrainConfig, run_dir / "config.toml").optim.weight_decay
    assert len(notes) == 1 and f"optim.weight_decay {decay} → 0.05" in notes[0], notes
    assert "run.max_steps unset → 7" in notes[0], notes  # the checkpoint's, not other/config.toml's 2


def test_two_ranks_then_one_keep_the_global_batches(reference, tmp_path):
    """2 ranks (FSDP) train into phase "big", one process resumes: the same global batches, so the
    losses match the one-process run up to summation order and the tokens exactly."""
    run_dir, config = reference
    two = tmp_path / "two"
    sets = [
        f"run.output_dir={json.dumps(str(two))}",
        "parallel.shard=2",
        "run.max_steps=6",
        "metrics.plot=false",
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "training.train", "--config", str(config), "--set", *sets]
    proc = forked.run(cmd, cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert gristmill(["train", "--config", str(config), "--set", f"run.output_dir={json.dumps(str(two))}",
                      "metrics.plot=false", "--resume", "auto"]) == 0  # fmt: skip
    ref, got = read_metrics(run_dir), read_metrics(two)
    assert [r["step"] for r in got] == list(range(1, LAST + 1))
    for a, b in zip(ref, got):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5), a["step"]
        assert (b["tokens_seen"], b["lr"]) == (a["tokens_seen"], a["lr"])
        assert {k: v for k, v in b.items() if k.startswith("tokens/")} == {
            k: v for k, v in a.items() if k.startswith("tokens/")
        }
        assert b["batch_sha256"] == a["batch_sha256"]
    # 2 ranks' records, then one process's: the one-process run's record (issue 47)
    assert (two / "batches.bin").read_bytes() == (run_dir / "batches.bin").read_bytes()


def test_a_held_out_split_too_small_for_val_batches_of_any_phase_batch_is_refused(sources, tmp_path, capsys):
    """Validation reads run.val_batches global batches of the current phase's batch from the start
    of each held-out split: a split whose epoch holds fewer would repeat held-out windows. Refused
    before step 1, naming the source, the phase and the figures (issue 47: it trained on). The run
    that starts draws the schedule's plan.png (the trainer's plots: metrics.plot's default)."""
    from training.data.order import epoch_steps
    from training.data.reader import DocumentTable

    held = {  # held-out global batches per (source, phase) at the recipe's val_fraction 0.3
        (name, phase): epoch_steps(DocumentTable(path, split="val", val_fraction=0.3).tokens, seq, g)[0]
        for name, path in sources.items()
        for phase, seq, g in (("small", 32, 16), ("big", 32, 32), ("long", 64, 12))
    }
    (source, phase), fits = min(held.items(), key=lambda kv: kv[1])
    assert phase == "big" and fits < held[source, "small"]  # the bigger batch is the one refused
    run_dir = tmp_path / "run"
    path = write(sources, tmp_path / "r.toml", run_dir)
    assert gristmill(["train", "--config", str(path), "--set", f"run.val_batches={fits + 1}"]) == 2
    line = one_error_line(capsys.readouterr().err)
    tokens = DocumentTable(sources[source], split="val", val_fraction=0.3).tokens
    assert f"source {source!r}, phase 'big': run.val_batches = {fits + 1}: split 'val' of" in line, line
    assert f"has {tokens:,} tokens, fewer than {fits + 1} global batches of 32 × (seq_len 32 + 1)" in line
    assert [p.name for p in run_dir.iterdir()] == [".gristmill.lock"]  # no step, no record
    # val_batches the split holds: the run starts (one step, validated at its end)
    sets = [f"run.val_batches={fits}", "run.max_steps=1"]
    assert gristmill(["train", "--config", str(path), "--set", *sets]) == 0
    assert "val_loss" in read_metrics(run_dir)[-1]
    assert (run_dir / "plan.png").stat().st_size > 0
