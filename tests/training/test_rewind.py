"""Rewinding past a loss spike (issue 31, training/run/rewind.py): a spike injected at a data window
(training/run/faults.py) sends the run back to the right checkpoint, the next steps' data is skipped and
recorded, and the run finishes; kill -9 before, during and after the rewind resumes to the same
weights; 2 ranks equal one process; max_rewinds ends the run (exit 3); retention with keep_last 1
keeps what a rewind needs; a non-finite step rewinds with on_nonfinite = "rewind"; a spike with no
checkpoint to go back to is said, not guessed."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.shared import run_output
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    assert_batches_as_inspected,
    assert_same_checkpoint,
    command_output,
    metrics,
    one_error_line,
    overrides,
    recorded_batches,
    torchrun_cmd,
)
from training.config import load_train_config
from training.contract import integrity
from training.contract.batch_record import BatchEntry, batch_file
from training.contract.run_layout import complete_steps, config_history
from training.data.recipe import open_plan, plot_plan, recorded_skips
from training.data.spec import resolve
from training.run.faults import KILL, NAN_LOSS, SIGTERM, SPIKE_WINDOW
from training.train import main

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

STEPS, SPIKE = 30, 17


def rewind_sets(dataset: Path, run: Path, *extra: str) -> list[str]:
    """30 steps, a checkpoint every 5 and only the newest kept; a spike at step 17 goes back to step
    10 (17 − margin 4 = 13: not 15), skipping 8 steps (11–18)."""
    return overrides(
        dataset, run, f"schedule.steps={STEPS}", "run.log_every=5", "run.on_spike=rewind",
        "run.spike_window=8", "run.spike_sigma=4", "run.rewind.skip_steps=8", "run.rewind.margin_steps=4",
        "checkpoint.interval=5", "checkpoint.keep_last=1", *extra,
    )  # fmt: skip


def window_of(sets: list[str], step: int, slot: int = 0) -> str:
    """The fault spec of one data window of `step` (from 1): source:epoch:first token."""
    cfg = load_train_config(TINY, sets)
    plan, _, _ = open_plan(cfg, resolve(cfg), expect_vocab_size=256)
    labels, epoch, first = plan.step_windows(step - 1)
    return f"{plan.sources[labels[slot]].name}:{epoch[slot]}:{first[slot]}*50"


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset()


@pytest.fixture(scope="module")
def reference(shared, dataset):
    """The uninterrupted run with the spike, trained once per test run (read-only: copy it to write
    into it); returns (run dir, its stdout)."""

    def define(run: Path) -> tuple[list[str], dict[str, str]]:
        sets = rewind_sets(dataset, run, "metrics.plot=true")  # plan.png and loss.png drawn
        return sets, {SPIKE_WINDOW: window_of(sets, SPIKE)}

    def train(definition: tuple[list[str], dict[str, str]], _) -> str:
        sets, fault = definition
        done = forked.run(_train_cmd(sets), cwd=ROOT, env={**ENV, **fault}, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run = shared.run("1-process", define, train)
    return run, run_output(run)


def _train_cmd(sets: list[str]) -> list[str]:
    return [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]


def test_a_spike_rewinds_to_the_right_checkpoint_skips_and_finishes(reference, tmp_path):
    run, out = reference
    line = next(x for x in out.splitlines() if x.startswith("rewind 1/3"))
    assert f"at step {SPIKE}" in line and "back to step 10 (checkpoint verified)" in line
    assert "skipping 8 steps (11–18) of data (8.19k tokens)" in line, line
    # the attempt's step 15 set aside, said as a rewind's (not "newer than the resumed step 10")
    assert "note: step-000015 is newer than step 10, which the rewind goes back to; moved it to" in out, out
    # The skip is the run's history: in RUN/data_plan.json and in the final checkpoint's plan.
    skips = json.loads((run / "data_plan.json").read_text())["skips"]
    assert [
        (s["rewind"], s["first_step"], s["last_step"], s["spike_step"], s["checkpoint_step"]) for s in skips
    ] == [(1, 11, 18, SPIKE, 10)]
    rows = metrics(run)
    spike = next(r for r in rows if r["step"] == SPIKE)
    assert spike["discarded_by_rewind"] == 1 and spike["attempt"] == 1 and spike["loss"] > 50
    assert any("loss spike" in e for e in spike["events"])
    # Rows 11–17 of the first attempt are discarded; from step 20 on the second attempt trains.
    assert [r["step"] for r in rows if "discarded_by_rewind" in r] == [15, SPIKE]
    kept = [r for r in rows if "discarded_by_rewind" not in r]
    assert [r["step"] for r in kept] == [1, 5, 10, 20, 25, 30] and {r["attempt"] for r in kept[3:]} == {2}
    # Tokens trained: 30 steps less the 8 skipped, each 16 × 64 tokens.
    assert kept[-1]["tokens_seen"] == (STEPS - 8) * 1024
    assert max(r["loss"] for r in kept) < 10
    assert "rewinds: 1 — rewind 1 at step 17 → back to 10, skipped 8 steps (11–18)" in out
    # the run's last line counts the steps it trained, not the skipped ones with them
    assert f"over steps 1–{STEPS} ({STEPS - 8} steps trained, 8 skipped by rewinds)" in out, out[-500:]
    # plan.png drawn again at the rewind: the skipped steps shaded (what a resume would draw)
    cfg = load_train_config(str(run / "config.toml"), [])
    plan, _, _ = open_plan(cfg, resolve(cfg))
    plot_plan(plan, tmp_path / "fresh.png", recorded_skips(run))
    plot_plan(plan, tmp_path / "plain.png")
    drawn = (run / "plan.png").read_bytes()
    assert drawn == (tmp_path / "fresh.png").read_bytes() != (tmp_path / "plain.png").read_bytes()
    assert f"curve: {run / 'loss.png'}" in out and (run / "loss.png").is_file()


def test_what_each_step_was_fed_is_recorded_and_the_discarded_attempt_kept_apart(reference):
    """Issue 47: RUN/batches.bin lists the final timeline's steps (1–10 of attempt 1, 19–30 of
    attempt 2: never a skipped step), batches-discarded.bin the steps rewind 1 discarded (11–17 of
    attempt 1), each with the digest `data inspect RUN --hash` prints; the rows carry the same."""
    run, _ = reference
    planned = assert_batches_as_inspected(run)
    kept = [(s, 1, planned[s]) for s in range(1, 11)] + [(s, 2, planned[s]) for s in range(19, STEPS + 1)]
    assert recorded_batches(run) == kept
    assert recorded_batches(run, "batches-discarded.bin") == [
        (s, 1, planned[s]) for s in range(11, SPIKE + 1)
    ]


def test_verify_names_the_first_recorded_step_that_is_not_the_plans(reference, tmp_path):
    """`gristmill verify RUN` against a tampered copy of the rewound run, one change at a time: the
    first step that differs is named, exit 1; the discarded attempt is not checked as the run's; a
    torn last record is a note."""
    run = tmp_path / "run"
    shutil.copytree(reference[0], run)
    kept = recorded_batches(run)
    sha = {s: h for s, _, h in kept + recorded_batches(run, "batches-discarded.bin")}
    rows = (run / "metrics.jsonl").read_text()

    def verify(entries, discarded=None, metrics_text=rows) -> tuple[int, str]:
        (run / "batches.bin").write_bytes(batch_file(BatchEntry(*e) for e in entries))
        if discarded is not None:
            (run / "batches-discarded.bin").write_bytes(batch_file(BatchEntry(*e) for e in discarded))
        (run / "metrics.jsonl").write_text(metrics_text)
        rc, out = command_output(["verify", str(run)])
        return rc, [line for line in out.splitlines() if "batch" in line]

    def swapped(*steps):  # each step's record given the next step's batch
        return [(s, a, sha[s + 1] if s in steps else h) for s, a, h in kept]

    assert verify(kept) == (0, [])
    rc, lines = verify(swapped(25, 22))
    where = f"({run / 'batches.bin'})"
    first = f"step 22 differs from the plan: recorded {sha[23][:16]}…, planned {sha[22][:16]}…"
    assert (rc, lines) == (1, [f"batches: {first} {where}; 1 more step(s) disagree"])
    # a record that differs past its first 16 digits: all 64 shown (two equal prefixes, R14c F11)
    flipped = sha[22][:40] + ("0" if sha[22][40] != "0" else "1") + sha[22][41:]
    rc, lines = verify([(s, a, flipped if s == 22 else h) for s, a, h in kept])
    assert lines == [f"batches: step 22 differs from the plan: recorded {flipped}, planned {sha[22]} {where}"]
    # `verify --step 22`, a step with no checkpoint or export: its record alone, not a refusal whole
    # that never looked at it (trial RV53a 1); a step the run never trained is still refused
    assert 22 not in complete_steps(run)
    rc, out = command_output(["verify", str(run), "--step", "22"])
    assert rc == 1 and out.splitlines()[1:] == [
        f"batches: step 22 differs from the plan: recorded {flipped}, planned {sha[22]} {where}"
    ], out
    assert out.startswith(f"{run} has no checkpoint or export of step 22 (step 22 has no checkpoint: ")
    assert verify(kept) == (0, [])
    assert command_output(["verify", str(run), "--step", "22"])[1].splitlines()[1:] == [
        f"batches: step 22 is the plan's ({run / 'batches.bin'})"
    ]
    # a step in no record (a run, or its start, from before batches were recorded): nothing to compare,
    # so never "is the plan's" (review RV54b 1)
    (run / "batches.bin").unlink()
    (run / "metrics.jsonl").write_text(re.sub(r', "batch_sha256": "[0-9a-f]+"', "", rows))
    assert 20 not in complete_steps(run) and any(r["step"] == 20 for r in metrics(run))  # a row, logged
    assert command_output(["verify", str(run), "--step", "20"])[0] == 2
    assert command_output(["verify", str(run), "--step", "12"])[0] == 2  # skipped by the rewind
    in_skip = sorted(kept + [(12, 1, sha[12])])
    assert verify(in_skip) == (
        1,
        [f"batches: step 12 is recorded as trained, but rewind 1 skipped it {where}"],
    )
    first_attempt = [(s, 1, h) if s == 20 else (s, a, h) for s, a, h in kept]  # as if the discarded one's
    line = f"batches: step 20 is recorded as attempt 1's, but the timeline's is attempt 2 {where}"
    assert verify(first_attempt) == (1, [line])
    # a step field damaged far past the plan: named, not counted from ("missing" steps up to it: a
    # list of billions, out of memory for 2**32 + 4: review R21b F2)
    rc, lines = verify(kept + [(10**6, 1, sha[1])])
    assert rc == 1 and lines == [f"batches: step 1000000 is not a step of the plan (1–{kept[-1][0]}) {where}"]
    gap = [e for e in kept if e[0] != 20]
    assert verify(gap) == (1, [f"batches: step 20 is not recorded (steps 19 and 21 are) {where}"])
    # two records swapped: out of order, not "not recorded" (it is, later: review R24a 4)
    at = next(i for i, e in enumerate(kept) if e[0] == 20)
    out_of_order = kept[:at] + [kept[at + 1], kept[at]] + kept[at + 2 :]
    assert verify(out_of_order) == (1, [f"batches: step 20 is recorded out of order after step 21 {where}"])
    again = kept[: at + 2] + [kept[at + 1]] + kept[at + 2 :]
    assert verify(again) == (1, [f"batches: step 21 is recorded again after step 21 {where}"])
    rc, lines = verify(kept[:-1])  # the last record cut: its checkpoint and its row say it was trained
    said = "(the record ends at step 29; the run trained through 30)"
    assert (rc, lines) == (1, [f"batches: step 30 is not recorded {said} {where}"])
    # cut further: its first missing step and how many, not the first later step with a row or a
    # checkpoint and "1 more step(s) disagree"; `--step` of one of them says so (trial RV68c F2)
    assert [e[0] for e in kept[-5:]] == [26, 27, 28, 29, 30]
    said = "(the record ends at step 25; the run trained through 30)"
    assert verify(kept[:-5]) == (
        1, [f"batches: step 26 is not recorded, nor are the 4 steps after it to step 30 {said} {where}"]
    )  # fmt: skip
    rc, out = command_output(["verify", str(run), "--step", "28"])
    assert rc == 1 and out.splitlines()[1:] == [f"batches: step 28 is not recorded {said} {where}"], out
    row = json.dumps(next(r for r in metrics(run) if r["step"] == 25))
    rc, lines = verify(kept, metrics_text=rows.replace(row, row.replace(sha[25], sha[26])))
    assert rc == 1 and lines[0].startswith(
        f"batches: step 25 has batch_sha256 {sha[26][:16]}… in metrics.jsonl"
    )
    # a row that is no longer a row (its loss and its digest edited): it cannot be compared with the
    # record, and verify passed it, said nowhere (review R21d 1)
    bad = row.replace(sha[25], "0" * 64).replace('"loss": ', '"loss": null, "was": ', 1)
    (run / "metrics.jsonl").write_text(rows.replace(row, bad))
    rc, out = command_output(["verify", str(run)])
    assert rc == 1 and f"metrics: dropped 1 unreadable line(s) of {run / 'metrics.jsonl'}" in out, out
    (run / "metrics.jsonl").write_text(rows)
    # the discarded attempt's records are history, not the run's: not checked against the plan
    assert verify(kept, discarded=[(s, 1, "00" * 32) for s in range(11, SPIKE + 1)]) == (0, [])
    with open(run / "batches.bin", "ab") as f:  # a record torn by a kill mid-write
        f.write(b"\x13" * 10)
    rc, out = command_output(["verify", str(run)])
    assert rc == 0 and "note: cut off the torn last record" in out, out
    (run / "batches.bin").unlink()  # lost, or not copied with the run: its rows say it was recorded
    rc, out = command_output(["verify", str(run)])
    assert rc == 1 and "though metrics.jsonl's rows carry batch digests" in out, out
    assert (
        "batches: step 1 is not recorded, nor are the 21 steps after it to step 30 (the record holds no "
        in out
    )
    # rows from step 20 on (a run resumed from another run's checkpoint there): from the first of them
    # (steps this directory never trained were named: review RV68d 5)
    kept_rows = [r for r in rows.splitlines() if json.loads(r)["step"] >= 20]
    (run / "metrics.jsonl").write_text("".join(r + "\n" for r in kept_rows))
    rc, out = command_output(["verify", str(run)])
    assert (
        rc == 1 and "batches: step 20 is not recorded, nor are the 10 steps after it to step 30 (" in out
    ), out
    (run / "metrics.jsonl").write_text(rows)
    # a record that cannot be read: `--step` of a step past the run is refused as before, not said as
    # that record's problem (review RV68d 6)
    (run / "batches.bin").write_bytes(b"not a record")
    assert command_output(["verify", str(run), "--step", "31"])[0] == 2


def test_kill_9_before_during_and_after_the_rewind_resumes_bit_identically(tmp_path, dataset, reference):
    """One run killed at each point of the rewind in turn, resumed each time with --resume auto; the
        last resume also changes the rewind settings, which only future rewinds would use, and is killed once
    its last checkpoint is complete, before its retention."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run)
    env = {**ENV, SPIKE_WINDOW: window_of(sets, SPIKE)}
    resume = ["--resume", "auto"]
    for i, point in enumerate(["rewind-start", "rewind-restored", "rewind-saved"]):
        cmd = _train_cmd(sets) + (resume if i else [])
        done = forked.run(cmd, cwd=ROOT, env={**env, KILL: point}, timeout=300)
        assert done.returncode == -9, (point, done.stderr[-2000:])
    # The last checkpoint complete, then killed before its retention: the resume, which saves nothing
    # more, runs it (the skip's and the margin's checkpoints stayed for good: review RV51a 3).
    changed = _train_cmd([*sets, "run.rewind.skip_steps=3"]) + resume
    done = forked.run(changed, cwd=ROOT, env={**env, KILL: f"complete:{STEPS}"}, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    assert "resumed at step 18" in done.stdout
    assert set(complete_steps(run)) > set(complete_steps(reference[0])), complete_steps(run)
    done = forked.run(changed, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert complete_steps(run) == complete_steps(reference[0]), complete_steps(run)
    assert json.loads((run / "data_plan.json").read_text())["skips"][0]["last_step"] == 18
    assert_same_checkpoint(reference[0], run, STEPS)
    ours = [(r["step"], r["loss"], r.get("discarded_by_rewind"), r["batch_sha256"]) for r in metrics(run)]
    theirs = [
        (r["step"], r["loss"], r.get("discarded_by_rewind"), r["batch_sha256"]) for r in metrics(reference[0])
    ]
    assert ours == theirs
    for name in ("batches.bin", "batches-discarded.bin"):  # the kept and the discarded records (issue 47)
        assert (run / name).read_bytes() == (reference[0] / name).read_bytes(), name


@pytest.mark.parametrize("stop", ["SIGTERM at step 13", "run.max_steps=13"])
def test_a_run_stopped_off_the_checkpoint_grid_rewinds_later_as_the_uninterrupted_run(
    tmp_path, dataset, reference, stop
):
    """A stop saves a checkpoint a run never stopped does not have (step 13, between the grid's 10
    and 15): a later spike at 17 went back to it, not to 10, and the run trained another timeline;
    with keep_last = 1 it also took step 10's place. A resume-only save is neither."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run)
    env = {**ENV, SPIKE_WINDOW: window_of(sets, SPIKE)}
    first = [*sets, "run.max_steps=13"] if stop.startswith("run.") else sets
    fault = {SIGTERM: "13"} if "SIGTERM" in stop else {}
    done = forked.run(_train_cmd(first), cwd=ROOT, env={**env, **fault}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert complete_steps(run) in ([10, 12], [10, 13])  # the stop's, and step 10 kept (keep_last = 1)
    done = forked.run(_train_cmd(sets) + ["--resume", "auto"], cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "back to step 10 (checkpoint verified)" in done.stdout, done.stdout[-3000:]
    assert_same_checkpoint(reference[0], run, STEPS)
    # the rows, but for the one a run.max_steps chunk logs at its last step (13)
    ours = [(r["step"], r["loss"], r.get("discarded_by_rewind")) for r in metrics(run) if r["step"] != 13]
    assert ours == [(r["step"], r["loss"], r.get("discarded_by_rewind")) for r in metrics(reference[0])]
    # the configs of the timeline: the resume's (without run.max_steps) trained from step 11 on, where the
    # rewind went back to, not from its own first step, 14
    history = config_history(run)
    assert list(history) == ([1, 11] if first != sets else [1]), history
    assert history[max(history)].read_text() == (run / "config.toml").read_text()
    assert list(config_history(reference[0])) == [1]


def test_two_ranks_rewind_as_one_process(tmp_path, dataset, reference):
    """The same rewind, skip and rows as one process; losses within summation order (1e-5, as in
    test_train.py's FSDP comparison)."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "parallel.shard=2")
    env = {**ENV, SPIKE_WINDOW: f"step:{SPIKE}*50"}  # the reference's window, named by its step
    done = forked.run(torchrun_cmd(sets), cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("rewind 1/3"))
    assert line == next(x for x in reference[1].splitlines() if x.startswith("rewind 1/3"))
    assert (run / "data_plan.json").read_text() == (reference[0] / "data_plan.json").read_text()
    ours, theirs = metrics(run), metrics(reference[0])
    assert [(r["step"], r.get("discarded_by_rewind")) for r in ours] == [
        (r["step"], r.get("discarded_by_rewind")) for r in theirs
    ]
    for a, b in zip(ours, theirs):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-5), (a["step"], a["loss"], b["loss"])
        assert a["batch_sha256"] == b["batch_sha256"]
    for name in ("batches.bin", "batches-discarded.bin"):  # each rank hashed its rows (issue 47)
        assert (run / name).read_bytes() == (reference[0] / name).read_bytes(), name


def test_a_resume_from_before_a_rewind_keeps_the_left_timeline_s_discarded_records_aside(
    tmp_path, dataset, monkeypatch, capsys
):
    """A resume from step 5 of a run that rewound at step 17 (back to 10): batches-discarded.bin's
    records of the rewind's attempt (steps 11-17) were rewritten away, kept nowhere, where batches.bin
    and metrics.jsonl are kept as they were (review RV57e 1). Kept beside it too, with a note."""
    r = tmp_path / "run"
    sets = rewind_sets(dataset, r, "checkpoint.keep_last=0")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, SPIKE))
    assert main(["--config", TINY, "--set", *sets]) == 0
    monkeypatch.delenv(SPIKE_WINDOW)
    discarded = r / "batches-discarded.bin"
    before = discarded.read_bytes()
    assert len(before) > len(batch_file([]))  # the rewind's attempt recorded
    capsys.readouterr()
    resume5 = f"checkpoint.resume={json.dumps(str(r / 'checkpoints' / 'step-000005'))}"
    assert main(["--config", TINY, "--set", *sets, resume5, "run.max_steps=6"]) == 0
    out = capsys.readouterr().out
    assert "note: batches-discarded.bin's records of steps 11–17 are of the timeline the resume left" in out
    assert (r / "abandoned-batches-discarded.bin").read_bytes() == before


def test_max_rewinds_ends_the_run_naming_every_rewind(tmp_path, dataset, monkeypatch, capsys):
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.rewind.max_rewinds=1", "run.rewind.skip_steps=2")
    monkeypatch.setenv(SPIKE_WINDOW, f"{window_of(sets, SPIKE)},{window_of(sets, 24)}")
    assert main(["--config", TINY, "--set", *sets]) == 3
    line = one_error_line(capsys.readouterr().err)
    assert "past run.rewind.max_rewinds = 1" in line
    assert "(so far: rewind 1 at step 17 → back to 10, skipped 2 steps (11–12))" in line
    # the command to run, not a placeholder (trial RV63a)
    assert line.endswith(f"gristmill data inspect {run} --step 17 shows what this step trained on"), line


def test_a_spike_whose_margin_reaches_past_the_last_skip_says_why_it_cannot_rewind(
    tmp_path, dataset, monkeypatch, capsys
):
    """Step 15 again after its rewind skipped 11–12: 15 − margin 4 = 11 is in the skip, so there is nowhere
    to go back to; the warning said "between step 12 and step 11", an empty range, not why."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.rewind.skip_steps=2")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, 15))  # back to 10, skips 11–12; at 15 again
    assert main(["--config", TINY, "--set", *sets, "run.max_steps=16"]) == 0  # all it says is by step 15
    out = capsys.readouterr().out
    assert "back to step 10 (checkpoint verified), skipping 2 steps (11–12)" in out, out
    assert (
        "no checkpoint to rewind to: step 15 − run.rewind.margin_steps 4 is step 11, before step 12, where "
        "rewind 1's skip ended (a rewind never goes back past an earlier one's skip): not rewinding" in out
    ), out


def test_a_nonfinite_step_rewinds_with_on_nonfinite_rewind(tmp_path, dataset, monkeypatch, capsys):
    run = tmp_path / "run"
    sets = rewind_sets(
        dataset, run, "run.on_spike=report", "run.on_nonfinite=rewind", "run.rewind.margin_steps=1"
    )
    monkeypatch.setenv(NAN_LOSS, "13")
    assert main(["--config", TINY, "--set", *sets, "run.max_steps=20"]) == 0
    out = capsys.readouterr().out
    # what was not finite, not "loss or gradient" beside a finite loss (trial RV63a), and at which step
    # (trial RV78a 4)
    assert "rewind 1/3: non-finite loss and gradient norm (loss NaN) at step 13; back to step 10" in out, out
    assert metrics(run)[-1]["step"] == 20  # trains on past the skip (11–18)
    # nowhere to go back to: it stops as on_nonfinite = "stop" does, with its advice (it gave the cause
    # alone: review R17d M2)
    monkeypatch.setenv(NAN_LOSS, "3")
    assert (
        main(
            ["--config", TINY, "--set", *rewind_sets(dataset, tmp_path / "early", "run.on_nonfinite=rewind")]
        )
        == 3
    )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no checkpoint to rewind to" in line and "start a new run with a lower learning rate" in line, line


MARGIN = "run.rewind.margin_steps 4"


@pytest.mark.parametrize(
    "spike, says",
    [
        (
            6,
            f"no complete checkpoint that verifies between step 0 and step 2 (step 6 − {MARGIN}) to rewind",
        ),
        # earlier than the margin: it named "rewind 0's skip", a rewind that never happened
        (3, f"no checkpoint to rewind to: step 3 − {MARGIN} is step -1, before the run's first step"),
    ],
)
def test_a_spike_before_any_checkpoint_is_said_and_the_run_goes_on(
    tmp_path, dataset, monkeypatch, capsys, spike, says
):
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.spike_window=4", "schedule.steps=8")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, spike))
    assert main(["--config", TINY, "--set", *sets]) == 0
    out = capsys.readouterr().out
    warning = next(line for line in out.splitlines() if line.startswith(f"WARNING step {spike}: loss "))
    assert says in warning and warning.endswith(": not rewinding, the run goes on"), warning
    assert not (run / "data_plan.json").read_text().count("skips")
    # the spike it trained is in the run's record: the row of its step (log_every 5: not a logged
    # one), with the spike as its event, as "report" records every spike it sees
    (row,) = [r for r in metrics(run) if r["step"] == spike]
    assert row["loss"] > 50 and any("loss spike" in e for e in row["events"]), row
    assert "discarded_by_rewind" not in row


def test_rewind_settings_are_checked(tmp_path, dataset, capsys):
    sets = rewind_sets(dataset, tmp_path / "run", "checkpoint.interval=0")
    assert main(["--config", TINY, "--set", *sets]) == 2
    assert (
        "run.on_spike = 'rewind' goes back to a checkpoint, but checkpoint.interval = 0"
        in capsys.readouterr().err
    )


def test_the_spike_rule_window_is_checkpointed(tmp_path, dataset, capsys):
    """A resume judges the next loss against the same window as the uninterrupted run: the
    checkpoint holds the detector's last spike_window losses, exactly."""
    import torch.distributed.checkpoint as dcp

    from training.checkpoint.state import TrainState

    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "schedule.steps=12", "run.log_every=1")
    assert main(["--config", TINY, "--set", *sets]) == 0
    state = TrainState()
    dcp.load({"train_state": state}, checkpoint_id=str(run / "checkpoints/step-000012"))
    assert state.step == 12 and state.recent_losses == [r["loss"] for r in metrics(run)][-8:]


PIECE = re.compile(r"^\s+(\S+) \(id .+?\) tokens \[(\d+), (\d+)\) of \d+")


def _pieces(run: Path, step: int, capsys) -> tuple[str, list[tuple[str, int, int]]]:
    """`gristmill data inspect RUN --step N --max-rows 0`: its step line and every document piece."""
    assert gristmill(["data", "inspect", str(run), "--step", str(step), "--max-rows", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.startswith(f"step {step} "))
    return head, [(m[1], int(m[2]), int(m[3])) for m in map(PIECE.match, out) if m]


def test_the_ledger_through_inspect_and_the_audit(reference, capsys):
    """What the final timeline trained and skipped, read back through `gristmill data inspect` and
    the audit's consumption view, not through the trainer's counters: no document token trained
    twice, the skipped steps' windows never trained, and their count in consumption."""
    run, _ = reference
    trained: dict[str, list[tuple[int, int]]] = {}
    skipped_tokens = 0
    for step in range(1, STEPS + 1):
        head, pieces = _pieces(run, step, capsys)
        is_skipped = 11 <= step <= 18
        assert ("SKIPPED by rewind 1" in head) == is_skipped, head
        for key, a, b in pieces:
            if is_skipped:
                skipped_tokens += b - a
            else:
                trained.setdefault(key, []).append((a, b))
    for key, spans in trained.items():  # no token of a document in two trained windows
        spans.sort()
        assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:])), key
    for step in range(11, 19):  # and no skipped window was trained
        for key, a, b in _pieces(run, step, capsys)[1]:
            assert all(b <= c or d <= a for c, d in trained.get(key, [])), (step, key)
    assert skipped_tokens == 8 * 16 * 65  # 8 steps × 16 windows of seq_len + 1 stream tokens
    sql = "SELECT sum(tokens) AS t, sum(skipped_tokens) AS s, any_value(rewinds) AS r FROM consumption"
    assert gristmill(["data", "audit", str(run), "--sql", sql]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[-3:] == [f"{(STEPS - 8) * 1024:,}", f"{8 * 1024:,}", "[1]"], row


def test_a_skip_that_reaches_the_last_step_ends_the_run_with_its_checkpoint(
    tmp_path, dataset, monkeypatch, capsys
):
    """Rewound to step 25 with 8 steps to skip and 30 in the plan: steps 26–30 are skipped, the
    rewind's checkpoint is the run's last, and the summary's last loss is step 25's, not the spike's."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.rewind.margin_steps=2")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, 27))
    assert main(["--config", TINY, "--set", *sets]) == 0
    out = capsys.readouterr().out
    assert "skipping 5 steps (26–30) of data" in out, out
    step25 = next(r["loss"] for r in metrics(run) if r["step"] == 25)
    assert f"→ {step25:.4f}" in out.splitlines()[-1]
    assert (run / "checkpoints/step-000030/COMPLETE").exists()
    # a resume with no step left has no spike to rewind: not "can never rewind … lower
    # run.rewind.margin_steps to 0 or less" (trial RV68b F1)
    assert main(["--config", TINY, "--resume", "auto", "--set", *sets]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "can never rewind" not in out, out


def test_a_second_skip_to_the_end_names_the_step_whose_weights_it_kept(
    tmp_path, dataset, monkeypatch, capsys
):
    """Rewind 1 (spike 17) skips 11–22 and saves step 22's checkpoint, holding step 10's weights;
    rewind 2 (spike 26) goes back to that checkpoint and skips to the end. The final row names step
    10, the last step trained (issue 47: it named step 22, never trained)."""
    run = tmp_path / "run"
    sets = rewind_sets(
        dataset, run, "run.rewind.skip_steps=12", "run.val_every=10", "checkpoint.export_interval=30"
    )
    monkeypatch.setenv(SPIKE_WINDOW, f"{window_of(sets, SPIKE)},{window_of(sets, 26)}")
    assert main(["--config", TINY, "--set", *sets]) == 0
    skips = json.loads((run / "data_plan.json").read_text())["skips"]
    assert [(s["first_step"], s["last_step"], s["checkpoint_step"]) for s in skips] == [
        (11, 22, 10),
        (23, 30, 22),
    ]
    # rewind 2's 12 steps, cut to 8 by the plan's end, said so (trial RV71d 1); rewind 1's whole, not
    out = capsys.readouterr().out.splitlines()
    said = [line for line in out if line.startswith("rewind ")]
    assert [", cut at the plan's last step)" in line for line in said] == [False, True], said
    assert "(run.rewind.skip_steps = 12, cut at the plan's last step)" in said[1], said
    # its export as step 30 holds step 10's weights: said by its line and its record (trial RV71d 2)
    note = (
        "step 30, the plan's last, lies in rewind 2's skip (steps 23–30): its weights, the run's final ones, "
        "are step 10's"
    )
    assert any(line.startswith("export ") and line.endswith(f"; note: {note}") for line in out), out
    assert json.loads((run / "exports" / "step-000030" / "gristmill_export.json").read_text())["note"] == note
    final = metrics(run)[-1]
    assert final["step"] == STEPS and "val_loss" in final, final
    assert (
        final["note"]
        == "no step trained: steps 23–30 were skipped by rewind 2; the final weights are step 10's"
    )
    # as every row with rewinds on: its attempt, and the tokens its weights trained on (review R13c F4)
    ten = next(r for r in metrics(run) if r["step"] == 10 and not r.get("discarded_by_rewind"))
    assert final["attempt"] == 3 and final["tokens_seen"] == ten["tokens_seen"] > 0, final
    # a resume with a phase of 2 more steps trains them, where a run of 32 from its start would have
    # skipped on: --plan and train say so of the skip cut at 30 (only the timeline held it: trial RV74a 1)
    monkeypatch.delenv(SPIKE_WINDOW)
    saved = (run / "config.toml").read_text().replace("phase = []\n", "")
    schedule = "[schedule]\nwarmup_steps = 3\nsteps = 30\n"
    assert saved.count(schedule) == 1
    phases = (  # the one-phase plan [schedule] is, and one more
        '[[phase]]\nname = "main"\nsteps = 30\nlr = { warmup_steps = 3, shape = "cosine" }\n\n'
        '[[phase]]\nname = "more"\nsteps = 2\nlr = { shape = "constant" }\n'
    )
    config = tmp_path / "longer.toml"
    config.write_text(saved.replace(schedule, "") + "\n" + phases)
    longer = ["checkpoint.resume=auto"]
    note = (
        "note: rewind 2 skipped steps 23–30, to the plan's last step then: if its line said \"cut at the "
        "plan's last step\", the steps after it train now, where a run of this plan from its start would "
        "have skipped on, up to run.rewind.skip_steps steps after step 22"
    )
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *longer]) == 0
    assert note in capsys.readouterr().out.splitlines()
    # without --resume train refuses to start over the run's checkpoints, and --plan now too: it printed
    # the run's rewinds over this config's plan, their tokens counted in a plan the run never had, exit 0
    # (trial RV78a 1)
    assert main(["--config", str(config)]) == 2
    refused = one_error_line(capsys.readouterr().err)
    assert "of an earlier run; continue that run with --resume auto" in refused, refused
    assert gristmill(["train", "--config", str(config), "--plan"]) == 2
    assert one_error_line(capsys.readouterr().err) == refused
    # ... and with --resume auto, the run's checkpoints out of reach (deleted, checkpoints.jsonl kept):
    # a plan from step 0, exit 0, where the resume refused (review RV78c 4)
    (run / "checkpoints").rename(tmp_path / "aside")
    assert main(["--config", str(config), "--set", *longer]) == 2
    refused = one_error_line(capsys.readouterr().err)
    assert refused.startswith("error: --resume auto: "), refused
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *longer]) == 2
    assert one_error_line(capsys.readouterr().err) == refused
    (tmp_path / "aside").rename(run / "checkpoints")
    # a fork's plan: of the checkpoint's timeline, not of the new directory's record (review RV74d 4)
    fork = [
        f"checkpoint.resume={json.dumps(str(run / 'checkpoints' / 'step-000030'))}",
        f"run.output_dir={json.dumps(str(tmp_path / 'fork'))}",
    ]
    saved = run / "checkpoints" / "step-000030"
    digest = integrity.file_digest

    def not_of_the_checkpoint(path, algorithm):
        assert saved not in Path(path).parents or Path(path).suffix != ".distcp", path  # the weights' files
        return digest(path, algorithm)

    with monkeypatch.context() as m:  # and no read of the whole checkpoint's checksums (review RV74d 3)
        m.setattr(integrity, "file_digest", not_of_the_checkpoint)
        assert gristmill(["train", "--config", str(config), "--plan", "--set", *fork]) == 0
    out = capsys.readouterr().out.splitlines()  # its table's skips too (they were the new directory's)
    assert note in out and any(line.startswith("rewind 2: steps 23-30 skipped") for line in out), out
    # … but every other check of the path: another step's checkpoint under a step's name (review RV74f 1)
    renamed = tmp_path / "renamed" / "checkpoints" / "step-000007"
    shutil.copytree(saved, renamed)
    fork[0] = f"checkpoint.resume={json.dumps(str(renamed))}"
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *fork]) == 2
    assert "step-000007 holds step 30 (its COMPLETE record says so)" in capsys.readouterr().err
    assert main(["--config", str(config), "--set", *longer]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out.count(note) == 1 and not any("rewind 1 skipped" in line for line in out), out


def test_a_skip_is_the_plans_not_this_invocations(tmp_path, dataset, monkeypatch):
    """run.max_steps stops this invocation, not the plan: a skip past it is recorded whole, so a
    later resume trains no step an uninterrupted run would have skipped."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.max_steps=15")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, 14))
    assert main(["--config", TINY, "--set", *sets]) == 0
    skip = json.loads((run / "data_plan.json").read_text())["skips"][0]
    assert (skip["first_step"], skip["last_step"]) == (11, 18)
    assert (run / "checkpoints/step-000018/COMPLETE").exists()


def test_a_spike_that_cannot_rewind_still_stops_on_an_earlier_nonfinite_step(
    tmp_path, dataset, monkeypatch, capsys
):
    """Step 3's loss is NaN (on_nonfinite = "stop"), step 4 spikes with no checkpoint to go back to:
    the row the spike wrote read step 3's tally, and the run stops on it (exit 3)."""
    run = tmp_path / "run"
    sets = rewind_sets(dataset, run, "run.spike_window=4")
    monkeypatch.setenv(NAN_LOSS, "3")
    monkeypatch.setenv(SPIKE_WINDOW, window_of(sets, 4))
    assert main(["--config", TINY, "--set", *sets]) == 3
    assert "step 3: the loss and gradient norm is not finite" in one_error_line(capsys.readouterr().err)


def test_why_a_step_has_no_checkpoint_is_said_by_export_eval_and_verify(reference, capsys):
    """Issue 37 item 12: `export --step N` (and `eval --step N`, `verify --step N`) for a step
    without a checkpoint says why (one home: training.checkpoint.io.missing_step_reason): set aside
    by the rewind, skipped by it, never saved, deleted by retention, past the end; --step -1 is
    refused, not printed as step--00001."""
    run, _ = reference
    want = {
        15: "was set aside (checkpoints/abandoned-step-000015): a rewind",
        12: "was never trained: rewind 1 skipped steps 11–18",
        # off the interval: never saved, or saved where a run stopped and deleted by retention since (R16g)
        22: "has no checkpoint: checkpoint.interval = 5 saves every 5 steps and the last (30), and a save "
        "made where the run stopped (SIGTERM, Ctrl-C, run.max_steps) is deleted by retention once a resume "
        "has saved newer ones",
        20: "checkpoint was deleted by retention: checkpoint.keep_last = 1",
        31: "is past the run's last step, 30",
        -1: "step -1 is no step: steps count from 1",
        0: "started from random initialisation",
    }
    for step, why in want.items():
        for command in (["export", str(run), "--step", str(step)], ["verify", str(run), "--step", str(step)],
                        ["eval", str(run), "--step", str(step), "--tasks", "heldout_ppl"]):  # fmt: skip
            if command[0] == "verify" and step in (22, 20):  # trained: why, then its recorded batch checked
                assert gristmill(command) == 0, (command, capsys.readouterr())
                first, batch = capsys.readouterr().out.splitlines()
                assert why in first and batch == f"batches: step {step} is the plan's ({run / 'batches.bin'})"
                continue
            assert gristmill(command) == 2, (command, capsys.readouterr())
            line = one_error_line(capsys.readouterr().err)
            assert why in line and "step--" not in line, (command, line)
    assert not (run / "exports" / "step--00001").exists()


def test_a_step_whose_save_never_completed_is_said_to_be_trained(reference, tmp_path, capsys):
    """A run killed in the save of its newest step: `export --step N` said "step N is not trained yet:
    the run has reached step N-1" (its last metrics row) though the step was trained and recorded, or,
    past a row, blamed retention, which never deletes the newest complete checkpoint (trial RV68b F5).
    The reference run's last save, removed as a kill in it leaves none."""
    src, _ = reference
    run = tmp_path / "run"
    shutil.copytree(src, run, symlinks=True)
    shutil.rmtree(run / "checkpoints" / "step-000030")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] < 30))
    assert gristmill(["export", str(run), "--step", "30"]) == 2  # its record's line kept: deleted since
    line = one_error_line(capsys.readouterr().err)
    assert (
        "step 30's checkpoint was saved (checkpoints.jsonl records it complete) and is gone since: " in line
    )
    ledger = (run / "checkpoints.jsonl").read_text().splitlines(keepends=True)
    (run / "checkpoints.jsonl").write_text("".join(r for r in ledger if json.loads(r).get("step") != 30))
    assert gristmill(["export", str(run), "--step", "30"]) == 2  # as a kill in the save leaves the record
    line = one_error_line(capsys.readouterr().err)
    assert (
        "step 30 was trained, but its save never completed (the run stopped during it); the newest "
        "complete checkpoint is step 25, from which `gristmill train --resume auto` trains it again; " in line
    ), line
    # none left of the saves the record holds: the resume's own way on, not "trains the run again from
    # step 0", which that resume refuses (trial RV68e F1)
    shutil.rmtree(run / "checkpoints" / "step-000025")
    assert gristmill(["export", str(run), "--step", "30"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "trains the run again" not in line and "holds none of them: restore them" in line, line


def test_a_missing_checkpoint_of_a_run_that_keeps_every_one_is_not_blamed_on_this_config(
    reference, tmp_path, capsys
):
    """checkpoint.keep_last = 0 deletes nothing: a checkpoint missing there was said to be "deleted by
    retention: checkpoint.keep_last = 0 keeps the newest complete ones" (review R24b 4); but the run's
    retention may have deleted it while an earlier invocation's keep_last was above 0, and a stop's save
    is deleted once a later one completes whatever keep_last (review R24d 2). The reference run, pruned
    with keep_last = 1, as one whose config now keeps every checkpoint."""
    src, _ = reference
    run = tmp_path / "run"
    shutil.copytree(src, run, symlinks=True)
    config = (run / "config.toml").read_text()
    assert config.count("keep_last = 1\n") == 1
    # and a last invocation that stopped at run.max_steps = 25, before the checkpoints of 26–30 were
    # made by an earlier one: "past the run's last step, 25" answered for step 28 (review R24e 2)
    config = config.replace("keep_last = 1\n", "keep_last = 0\n").replace(
        "[run]\n", "[run]\nmax_steps = 25\n", 1
    )
    (run / "config.toml").write_text(config)
    want = {
        20: f"step 20 has no checkpoint in {run / 'checkpoints'}: checkpoint.keep_last = 0 (the run's config "
        "now) deletes none, so the run's retention deleted it while its keep_last was above 0, or it was "
        "removed by hand, or its save never completed",
        22: "step 22 has no checkpoint: checkpoint.interval = 5 saves every 5 steps and the last (30), and a "
        "save made where the run stopped (SIGTERM, Ctrl-C, run.max_steps) is deleted by retention once a "
        "resume has saved newer ones",
        28: "step 28 has no checkpoint: checkpoint.interval = 5 saves every 5 steps and the last (30)",
        31: "step 31 is past the run's last step, 30",
    }
    for step, why in want.items():
        assert gristmill(["export", str(run), "--step", str(step)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert why in line and "keep_last = 0 keeps" not in line, line


@pytest.mark.parametrize(
    "name, value, says",
    [
        (NAN_LOSS, "abc", "is not of the form STEP[,STEP…][@RANK]"),  # a traceback after config.toml
        (SIGTERM, "x", "is not of the form [awaited:]STEP[@RANK], complete or released"),
        (SPIKE_WINDOW, "step:5*abc", "is not of the form WINDOW[*FACTOR][,…]"),
        (KILL, "bogus", "is not of the form rewind-start, rewind-restored"),  # no kill ever, exit 0
        (SPIKE_WINDOW, "step:999", ": step 999 is outside the plan's 30 steps"),  # it said "step 998"
        (SPIKE_WINDOW, "nosuch:0:0", ": the plan has no source 'nosuch' (its sources: data)"),
    ],
)
def test_a_fault_variable_not_of_its_form_is_one_line(
    tmp_path, dataset, monkeypatch, capsys, name, value, says
):
    """A test's fault variable with a typo was a traceback after the run's files were written, an
    off-by-one step, or no fault at all, exit 0 (trial RV74a 3)."""
    monkeypatch.setenv(name, value)
    assert main(["--config", TINY, "--set", *rewind_sets(dataset, tmp_path / "run")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    said = f"error: {name}={value}{'' if says.startswith(':') else ' '}{says}"
    assert len(err) == 1 and err[0].startswith(said), err
    assert says.startswith(":") or not (tmp_path / "run").exists()  # a form: refused before any work
