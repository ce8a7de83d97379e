"""The ledger of a rewind's skipped steps (training/data/plan.py Skip): the plan's accounting, the
final timeline, the description and resume, the loader state, consumption.parquet through the
audit, the metrics row, the printed plan and `gristmill data inspect RUN` on a skipped step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.cli import main as gristmill
from tests.helpers.phased_recipe import write_recipe
from tests.helpers.train_data import make_dataset
from training.checkpoint.io import missing_step_reason, untrained_steps
from training.config import TrainConfig
from training.contract.config_loader import load_config
from training.contract.dataset_format import DatasetError
from training.data import plan as data_plan
from training.data.loader import TokenLoader, batch_sha256, dataset_loader
from training.data.plan import LRPiece, Phase, Plan, PlanError, Skip, Source, skip_of
from training.data.recipe import (
    CONSUMPTION_SCHEMA,
    format_plan,
    open_plan,
    plan_rows,
    plot_plan,
    record_plan,
    recorded_plan,
    write_consumption,
)
from training.data.spec import resolve
from training.metrics import data_row
from training.run.timeline import Timeline
from validation.audit_views import connect, run_tables_read_once
from validation.eval import _rewinds


def small_plan() -> Plan:
    """Two sources read for several epochs over two phases: web enters epoch 2 at step 7 and epoch 3
    at step 14, code enters epoch 2 at step 14 (global steps from 1); phase 'long' starts at step 13."""
    return Plan(
        [Source("web", "", "w", 700, 1, None), Source("code", "", "c", 500, 1, None)],
        [
            Phase("main", 12, 16, 8, (3, 1), LRPiece(1e-3, 1e-3, "constant")),
            Phase("long", 10, 32, 4, (1, 1), LRPiece(1e-3, 1e-4, "linear")),
        ],
        seed=7,
    )


ACROSS_EPOCH = Skip(1, 5, 8, 9, 4, "loss 9.1 at step 9")  # web's first epoch crossing inside
ACROSS_PHASE = Skip(2, 11, 14, 15, 10, "loss 8.7 at step 15")  # the phase boundary and two crossings
SKIPS = (ACROSS_EPOCH, ACROSS_PHASE)  # a timeline's: the plan itself has none (a pure function of the config)


def counted(plan: Plan, steps: list[int]) -> dict[tuple[int, int], int]:
    """Windows per (phase, source) of the given global steps (from 1), counted slot by slot."""
    out: dict[tuple[int, int], int] = {}
    for s in steps:
        labels, _, _ = plan.step_windows(s - 1)
        p = plan.locate(s - 1)[0]
        for i in labels.tolist():
            out[(p, i)] = out.get((p, i), 0) + 1
    return out


def test_consumed_splits_each_row_into_trained_and_skipped_windows():
    plan = small_plan()
    skipped_steps = [*range(5, 9), *range(11, 15)]
    assert (
        skip_of(SKIPS, 7) == ACROSS_EPOCH and skip_of(SKIPS, 13) == ACROSS_PHASE and skip_of(SKIPS, 9) is None
    )
    for step in (4, 6, 12, 13, 22):  # before, inside and after the skips
        want = counted(plan, [s for s in skipped_steps if s <= step])
        for a, b in zip(plan.consumed(step), plan.consumed(step, SKIPS), strict=True):
            key = (b["phase_index"], b["source_index"])
            assert b["windows"] + b["skipped_windows"] == a["windows"], (step, key)
            assert b["skipped_windows"] == want.get(key, 0), (step, key)
            assert b["tokens"] == b["windows"] * b["seq_len"]
            assert b["skipped_tokens"] == b["skipped_windows"] * b["seq_len"]
            # the stream was read past the skipped windows: position and share are the plain plan's
            assert (b["stream_tokens"], b["epoch"], b["fraction"]) == (
                a["stream_tokens"], a["epoch"], a["fraction"]
            )  # fmt: skip
    rows = {(r["phase"], r["source"]): r for r in plan.consumed(22, SKIPS)}
    assert {k: r["rewinds"] for k, r in rows.items()} == {
        ("main", "web"): [1, 2], ("main", "code"): [1, 2], ("long", "web"): [2], ("long", "code"): [2]
    }  # fmt: skip
    # Two rewinds skipping one step count its windows once.
    again = (*SKIPS, Skip(3, 12, 13, 16, 11, "again"))
    for a, b in zip(plan.consumed(22, SKIPS), plan.consumed(22, again), strict=True):
        assert b["skipped_windows"] == a["skipped_windows"] and b["rewinds"] == sorted({*a["rewinds"], 3})
    with pytest.raises(data_plan.PlanError, match="no such range"):
        Skip(1, 9, 8, 9, 8, "")


def test_the_final_timeline_uses_each_token_once_and_skips_exactly_the_skipped_steps():
    plan = small_plan()
    spans: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # (source, epoch) -> (first, end, step)
    windows: dict[int, list[tuple[int, int, int, int]]] = {}  # step -> (source, epoch, first, end)
    for s in range(1, plan.total_steps + 1):
        labels, epochs, first = plan.step_windows(s - 1)
        w = plan.phases[plan.locate(s - 1)[0]].seq_len + 1
        windows[s] = [(i, e, f, f + w) for i, e, f in zip(labels.tolist(), epochs.tolist(), first.tolist())]
        for i, e, f, end in windows[s]:
            spans.setdefault((i, e), []).append((f, end, s))
    for key, got in spans.items():  # trained and skipped alike: no stream token in two windows
        got.sort()
        assert all(a[1] <= b[0] for a, b in zip(got, got[1:])), key
    for skip in SKIPS:
        steps = range(skip.first_step, skip.last_step + 1)
        detail = {d["source"]: d for d in plan.skip_detail(skip)}
        for i, src in enumerate(plan.sources):
            d = detail[src.name]
            lo, hi = (d["from_epoch"] - 1, d["from_token"]), (d["to_epoch"] - 1, d["to_token"])
            mine = [(e, f, end) for s in steps for j, e, f, end in windows[s] if j == i]
            assert d["windows"] == len(mine) and d["tokens"] == sum(end - f - 1 for _, f, end in mine)
            # every skipped window lies between the recorded positions, and no trained window does
            assert all(lo <= (e, f) and (e, end) <= hi for e, f, end in mine)
            trained = [
                (e, f) for s in windows if skip_of(SKIPS, s) is None for j, e, f, _ in windows[s] if j == i
            ]
            assert not [t for t in trained if lo <= t < hi], (skip.rewind, src.name)
    # the cases this plan is built for: the skips cross an epoch end and a phase boundary
    web = {s.rewind: plan.skip_detail(s)[0] for s in SKIPS}
    assert [(web[n]["from_epoch"], web[n]["to_epoch"]) for n in (1, 2)] == [(1, 2), (2, 3)]
    assert [plan.locate(s - 1)[0] for s in (ACROSS_PHASE.first_step, ACROSS_PHASE.last_step)] == [0, 1]
    total = sum(r["skipped_tokens"] for r in plan.consumed(plan.total_steps, SKIPS))
    assert total == sum(d["tokens"] for s in SKIPS for d in plan.skip_detail(s))


def test_a_phase_entered_inside_a_skip_says_the_step_it_began_at_and_the_steps_that_train(capsys):
    """After ACROSS_PHASE (steps 11-14 skipped; 'long' is steps 13-22) the next trained step is 15: the
    trainer said "phase 'long' begins at step 15 … 10 steps" (review R30b F4). A rewind from 'long'
    whose skip ends inside 'main' (steps 9-10 skipped, spike at 14) goes back to 'main' at step 11,
    whose steps 1-8 trained: not "inside a rewind's skip", nor silent for phase 0 (review RV32b F5)."""
    from training.run.timeline import Timeline
    from training.train import _enter_phase

    plan = small_plan()
    run = SimpleNamespace(plan=plan, timeline=Timeline(plan))
    run.timeline.rewound(Skip(1, 11, 14, 15, 10, "loss 8.7 at step 15"))
    assert _enter_phase(run, 15, previous=0) == 1
    assert _enter_phase(run, 13, previous=0) == 1  # entered at its first step: as before
    back = SimpleNamespace(plan=plan, timeline=Timeline(plan))
    back.timeline.rewound(Skip(1, 9, 10, 14, 8, "loss 8.7 at step 14"))
    assert _enter_phase(back, 11, previous=1) == 0
    shape = "seq_len 32, 4 sequences (128 tokens) per step"
    assert capsys.readouterr().out.splitlines() == [
        f"phase 'long' began at step 13, inside a rewind's skip: {shape}; 8 of its 10 steps train, from "
        "step 15",
        f"phase 'long' begins at step 13: {shape}, 10 steps",
        "phase 'main' again from step 11 (its step 11 of 12), after a rewind: seq_len 16, 8 sequences (128 "
        "tokens) per step",
    ]


def test_a_source_without_an_epoch_limit_says_no_limit():
    """The one-dataset recipe's source (max_epochs None) read 3 epochs: "(max_epochs None)" (R30b F4)."""
    notes = small_plan().check_supply()
    assert notes[0].startswith("source 'web' is read 3 epochs (max_epochs no limit); "), notes
    assert "None" not in " ".join(notes)


def test_the_description_carries_the_skips_and_a_resume_accepts_them():
    plan = small_plan()
    saved = json.loads(plan.to_json(SKIPS))
    assert data_plan.skips_from(saved) == SKIPS
    assert saved["skips"][1]["sources"] == plan.skip_detail(ACROSS_PHASE)
    assert "skips" not in json.loads(plan.to_json())  # a run without rewinds: as before
    # The config's plan has no history: a description with skips is not a change of its past.
    assert data_plan.check_resume(saved, small_plan(), 16, lambda a, b: a == b) == []


def test_a_skip_that_ended_at_the_plans_end_is_noted_when_a_resume_adds_steps():
    # cut at the plan's last step, it stays cut when a phase is added: the added steps train where a run
    # of the longer plan from its start would have skipped them, and nothing said so (trial RV71d 1)
    plan = small_plan()
    to_the_end = Skip(1, 19, 22, 20, 18, "loss 9.3 at step 20")
    saved = json.loads(plan.to_json((to_the_end,)))
    longer = small_plan()
    longer.phases.append(Phase("more", 5, 32, 4, (1, 1), LRPiece(1e-4, 1e-4, "constant")))
    longer = Plan(longer.sources, longer.phases, seed=7)
    assert data_plan.cut_skip_notes(plan.total_steps, longer, (to_the_end,)) == [
        "rewind 1 skipped steps 19–22, to the plan's last step then: if its line said \"cut at the plan's "
        'last step", the steps after it train now, where a run of this plan from its start would have '
        "skipped on, up to run.rewind.skip_steps steps after step 18"
    ]
    assert data_plan.cut_skip_notes(plan.total_steps, small_plan(), (to_the_end,)) == []  # the same end
    assert data_plan.cut_skip_notes(plan.total_steps, longer, SKIPS) == []  # skips that end before it
    assert not any(  # the checkpoint's plan holds no skips of a current run (a resume notes them apart)
        "skipped steps" in n for n in data_plan.check_resume(saved, longer, 22, lambda a, b: a == b)
    )


def test_a_resume_whose_plan_now_ends_at_the_checkpoint_says_what_its_last_step_lacks(
    tmp_path, synthetic_dataset, capsys, monkeypatch
):
    """A plan shortened to end at the checkpoint's step, which its plan trained as an ordinary step:
    the resume trains nothing and said "nothing to do" alone, though the step never got what a plan's
    last step gets (review R21c 2). Refusing it was wrong (R21d), and so was a note listing everything
    (R21f 1): stopped by SIGTERM at step 4 (val_every 6), it lacks its validation, and says so; stopped by
    run.max_steps, step 4 was validated there, and nothing is said."""
    from training.run.faults import SIGTERM

    sources = {"web": synthetic_dataset(n_docs=240, seed=1), "code": synthetic_dataset(n_docs=160, seed=2)}
    main4 = (
        '[[phase]]\nname = "main"\nsteps = 4\nseq_len = 32\nmix = { web = 0.6, code = 0.3 }\n'
        'lr = { warmup_steps = 2, shape = "constant" }\n\n'
    )
    sets = ["checkpoint.interval=4", "metrics.plot=false"]
    for stop, said in (("sigterm", True), ("max_steps", False)):
        run = tmp_path / stop
        long = write_recipe(tmp_path / f"{stop}.toml", sources, run)
        if stop == "sigterm":
            monkeypatch.setenv(SIGTERM, "4")  # step 4 trained, saved, not validated (val_every 6)
            assert gristmill(["train", "--config", str(long), "--set", *sets]) == 0
            monkeypatch.delenv(SIGTERM)
        else:
            assert gristmill(["train", "--config", str(long), "--set", "run.max_steps=4", *sets]) == 0
        short = write_recipe(tmp_path / f"{stop}-short.toml", sources, run, phases=main4)
        capsys.readouterr()
        assert gristmill(["train", "--config", str(short), "--set", "checkpoint.resume='auto'", *sets]) == 0
        out = capsys.readouterr().out
        assert "nothing to do: the checkpoint is at step 4 ≥ the last step 4" in out, out
        note = (
            "note: step 4 was not the last step of the checkpoint's plan (11 steps), and it lacks what "
            "this plan's last step gets: its validation (val_loss); a resume that trains no step does not "
            "make them"
        )
        assert (note in out) == said and ("was not the last step" in out) == said, out
    # into another directory from the sigterm run's checkpoint: its rows are that run's, not this one's,
    # which has none; nothing is claimed of them (every claim was false: review R21g 2)
    checkpoint = tmp_path / "sigterm" / "checkpoints" / "step-000004"
    foreign = ["--set", f"run.output_dir='{tmp_path / 'other'}'", f"checkpoint.resume='{checkpoint}'"]
    short = write_recipe(tmp_path / "other-short.toml", sources, tmp_path / "other", phases=main4)
    capsys.readouterr()
    assert gristmill(["train", "--config", str(short), *foreign, *sets]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "was not the last step" not in out, out
    # … but that this directory holds none of it, and where it is (review R21h 1)
    run = tmp_path / "sigterm"
    assert (
        f"note: step 4's weights and record are {run}'s, and this directory holds none of them: export or "
        f"evaluate that run (`gristmill export {run} --step 4`)"
    ) in out, out


def test_the_timeline_is_checkpointed_and_an_older_checkpoints_skips_are_adopted(tmp_path):
    """The timeline holds the skips (its own state, one JSON string); the loader's state is the plan
    and the step only. A checkpoint from before the timeline kept the skips in the loader's plan:
    the loader reads them (`saved_skips`) for the timeline to adopt (training/checkpoint/checkpointer)."""
    root = make_dataset(tmp_path / "d", n_docs=60)
    kw = {"seq_len": 16, "global_batch": 4, "micro_batch": 4, "seed": 1}
    ran = dataset_loader(root, **kw)
    timeline = Timeline(ran.plan)
    timeline.rewound(Skip(1, 3, 4, 5, 2, "loss 9 at step 5"))
    with pytest.raises(ValueError, match="rewind 1 recorded as the timeline's rewind 2"):
        timeline.rewound(Skip(1, 5, 6, 7, 4, "again"))
    again = Timeline(ran.plan)
    again.load_state_dict(timeline.state_dict())
    assert again.skips == timeline.skips and again.attempt == 2 and again.oldest_target == 4
    ran.seek(4)
    assert "skips" not in json.loads(ran.state_dict()["data_plan"])
    resumed = dataset_loader(root, **kw)
    older = {**ran.state_dict(), "data_plan": ran.plan.to_json(timeline.skips)}  # as checkpoints kept it
    resumed.load_state_dict(older)
    assert resumed.saved_skips == timeline.skips and resumed.step == 4
    resumed.load_state_dict(ran.state_dict())
    assert resumed.saved_skips == ()


def test_consumption_parquet_through_the_audit_and_the_metrics_row(tmp_path):
    plan = plain = small_plan()
    run, old = tmp_path / "run", tmp_path / "old"
    run.mkdir(), old.mkdir()
    write_consumption(plan, 22, plan.consumed(22, SKIPS), run / "consumption.parquet")
    record_plan(plan, run, SKIPS)
    # A file written before the skip columns existed (a run with no rewinds).
    legacy = pa.schema(
        [f for f in CONSUMPTION_SCHEMA if f.name not in ("skipped_windows", "skipped_tokens", "rewinds")]
    )
    rows = [{**r, "step": 22, "dataset": "", "dataset_tokens": 1} for r in plain.consumed(22)]
    pq.write_table(pa.Table.from_pylist(rows, schema=legacy), old / "consumption.parquet")
    con, _ = connect([run, old])
    cols = "phase, source, windows, skipped_windows, skipped_tokens, rewinds"
    got = con.execute(f"SELECT dataset_name, {cols} FROM consumption").fetchall()
    want = [("run", *(r[c] for c in cols.split(", "))) for r in plan.consumed(22, SKIPS)]
    want += [("old", r["phase"], r["source"], r["windows"], 0, 0, []) for r in plain.consumed(22)]
    assert sorted(got) == sorted(want)
    assert con.execute("SELECT count(*) FROM consumption WHERE list_contains(rewinds, 1)").fetchone() == (2,)
    skips = con.execute("SELECT rewind, source, windows, tokens, from_epoch, to_epoch FROM skips").fetchall()
    assert sorted(skips) == sorted(
        (s.rewind, d["source"], d["windows"], d["tokens"], d["from_epoch"], d["to_epoch"])
        for s in SKIPS for d in plan.skip_detail(s)
    )  # fmt: skip
    # metrics.jsonl: tokens/NAME trained (they add up to tokens_seen), skipped_tokens/NAME beside them
    row = data_row(plan, 22, plan.consumed(22, SKIPS), SKIPS)
    for name in ("web", "code"):
        mine = [r for r in plan.consumed(22, SKIPS) if r["source"] == name]
        assert row[f"tokens/{name}"] == sum(r["tokens"] for r in mine)
        assert row[f"skipped_tokens/{name}"] == sum(r["skipped_tokens"] for r in mine) > 0
    per_step = 128  # G × seq_len in both phases: 8 × 16, 4 × 32
    trained_steps = [s for s in range(1, 23) if skip_of(SKIPS, s) is None]
    assert row["tokens/web"] + row["tokens/code"] == per_step * len(trained_steps) == per_step * 14
    assert not any(k.startswith("skipped_tokens/") for k in data_row(plain, 22, plain.consumed(22)))


def test_an_audit_reads_a_live_run_s_tables_once_and_as_of_its_ledger(tmp_path, capsys):
    """A trainer replaces consumption.parquet at every log: one replaced between two of the audit's
    opens was called damaged (trial RV63c F1), so the audit reads each of a run's live tables once, into
    a copy. A rewind writes data_plan.json seconds before the ledger (for good if the run dies there):
    `skips` listed a rewind whose steps `consumption` still counted as trained (RV63c F2); the audit
    answers as of the ledger and says so."""
    plan, run = small_plan(), tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")  # a training run's directory
    write_consumption(plan, 22, plan.consumed(22, SKIPS[:1]), run / "consumption.parquet")  # the ledger
    record_plan(plan, run, SKIPS)  # the plan, a rewind ahead
    ledger = sorted(r["windows"] for r in plan.consumed(22, SKIPS[:1]))
    with run_tables_read_once([run]):
        assert capsys.readouterr().err == (
            f"note: {run}: data_plan.json records rewind {SKIPS[1].rewind}, which consumption.parquet (step "
            "22) does not yet: the run is between the two writes, or stopped there (its resume writes both); "
            "the `skips` view answers as of step 22 (--db's views read the files as they are)\n"
        )
        (run / "consumption.parquet").write_bytes(b"replaced meanwhile")  # read only once, before
        con, _ = connect([run])
        assert sorted(w for (w,) in con.execute("SELECT windows FROM consumption").fetchall()) == ledger
        assert {r for (r,) in con.execute("SELECT rewind FROM skips").fetchall()} == {SKIPS[0].rewind}
        con.close()
    write_consumption(plan, 22, plan.consumed(22, SKIPS), run / "consumption.parquet")  # both written
    with run_tables_read_once([run]):
        con, _ = connect([run])
        assert {r for (r,) in con.execute("SELECT rewind FROM skips").fetchall()} == {s.rewind for s in SKIPS}
        con.close()
    assert capsys.readouterr().err == ""
    # a resume from a checkpoint before a rewind writes the plan without it first: said, not silent
    record_plan(plan, run, SKIPS[:1])
    with run_tables_read_once([run]):
        assert capsys.readouterr().err == (
            f"note: {run}: consumption.parquet (step 22) holds rewind {SKIPS[1].rewind}, which "
            "data_plan.json no longer records: a resume from an earlier checkpoint is between its two "
            "writes, or stopped there (the resume writes both); `skips` and `consumption` disagree until "
            "then: audit again after the run's next log\n"
        )
    record_plan(plan, run, SKIPS)
    # two threads' audits of one process apart: one ending cleared the other's copies (trial RV63e 1)
    import threading

    inside, go_on, ended = threading.Event(), threading.Event(), threading.Event()

    def other_audit() -> None:  # begins before this thread's, ends during it
        with run_tables_read_once([run]):
            inside.set()
            go_on.wait(30)
        ended.set()

    threading.Thread(target=other_audit).start()
    assert inside.wait(30)
    with run_tables_read_once([run]):
        go_on.set()
        assert ended.wait(30)
        (run / "consumption.parquet").write_bytes(b"replaced meanwhile")
        con, _ = connect([run])  # this thread's copy still there, and read
        assert sorted(w for (w,) in con.execute("SELECT windows FROM consumption").fetchall()) == sorted(
            r["windows"] for r in plan.consumed(22, SKIPS)
        )
        con.close()
    # a damaged table is named as the run's file, nowhere as the audit's copy (trial RV63e 2)
    from validation.audit_views import DamagedFile, check_roots

    with run_tables_read_once([run]), pytest.raises(DamagedFile) as damaged:
        check_roots([run])
    assert str(run / "consumption.parquet") in str(damaged.value) and "gristmill-audit-" not in str(
        damaged.value
    )
    write_consumption(plan, 22, plan.consumed(22, SKIPS), run / "consumption.parquet")
    capsys.readouterr()
    # --db's views outlive the audit: they read the run's files where they lie, not its copies
    db = tmp_path / "audit.duckdb"
    assert gristmill(["data", "audit", str(run), "--db", str(db), "--sql", "SELECT count(*) FROM skips"]) == 0
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM consumption").fetchone()[0] == len(plan.consumed(22, SKIPS))
        assert {r for (r,) in con.execute("SELECT rewind FROM skips").fetchall()} == {s.rewind for s in SKIPS}


def test_a_damaged_source_line_leaves_the_rewinds_readable(tmp_path):
    """The readers of a run's rewinds (untrained_steps, eval's) read its skips where a source line of
    RUN/data_plan.json is damaged, which the readers of its sources refuse (review RV32g D)."""
    record_plan(small_plan(), tmp_path, SKIPS)
    assert untrained_steps(tmp_path) == {8, 14} and _rewinds(tmp_path) == set(SKIPS)  # the saves at 8, 14
    description = json.loads((tmp_path / "data_plan.json").read_text())
    del description["sources"][0]["fingerprint"]
    (tmp_path / "data_plan.json").write_text(json.dumps(description))
    with pytest.raises(DatasetError, match="is damaged \\(sources\\[0\\] has no string 'fingerprint'\\)"):
        recorded_plan(tmp_path)
    assert untrained_steps(tmp_path) == {8, 14} and _rewinds(tmp_path) == set(SKIPS)  # set() and None
    # every reader of them (recorded_skips): missing_step_reason, so export/eval/verify --step, and
    # `train --plan` gave the "damaged" line (review RV33d F4)
    assert missing_step_reason(tmp_path, 8).startswith("step 8 was never trained: rewind ")


def test_the_printed_plan_shows_trained_and_skipped_tokens(tmp_path):
    plan = small_plan()
    rows = {r["phase"]: r for r in plan_rows(plan, SKIPS)}
    ends = {(r["phase"], r["source"]): r for r in plan.consumed(22, SKIPS)}
    for (phase, source), r in ends.items():
        assert (
            rows[phase][source].startswith(f"{r['tokens']:,} (")
            and f"{r['skipped_tokens']:,} skipped" in rows[phase][source]
        )
    lines = format_plan(plan, [], SKIPS)
    per = {name: 0 for name in ("web", "code")}  # rewind 2's tokens, counted slot by slot
    for (p, i), n in counted(plan, list(range(11, 15))).items():
        per[plan.sources[i].name] += n * plan.phases[p].seq_len
    assert (
        f"rewind 2: steps 11-14 skipped (loss 8.7 at step 15; back to step 10): {sum(per.values()):,} tokens "
        f"not trained on (web {per['web']:,}, code {per['code']:,})"
    ) in lines
    assert plot_plan(plan, tmp_path / "plan.png", SKIPS) in (
        None,
        "plan.png skipped: matplotlib is not installed",
    )
    assert "skipped" not in "\n".join(format_plan(small_plan(), []))


@pytest.fixture(scope="module")
def run_with_a_rewind(tmp_path_factory, synthetic_dataset):
    """A real run directory (two training steps of the two-source phased recipe) whose
    RUN/data_plan.json then records a rewind as the trainer writes it: steps 5-8 skipped."""
    root = tmp_path_factory.mktemp("rewound")
    sources = {"web": synthetic_dataset(n_docs=240, seed=1), "code": synthetic_dataset(n_docs=160, seed=2)}
    config = write_recipe(root / "recipe.toml", sources, root / "run")
    sets = ["run.max_steps=2", "checkpoint.interval=0", "metrics.plot=false", "run.val_every=0"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    run_dir = root / "run"
    cfg = load_config(TrainConfig, run_dir / "config.toml")
    plan, tables, _ = open_plan(cfg, resolve(cfg))
    skip = Skip(1, 5, 8, 9, 4, "loss 9.81 at step 9 (mean 3.12 + 6σ)")
    record_plan(plan, run_dir, (skip,))
    loader = TokenLoader(plan, tables, micro_batch=(16, 8), rank=0, world_size=1, check_separators=True)
    return run_dir, plan, loader, skip


def test_inspect_says_a_step_was_skipped_and_lists_its_windows(run_with_a_rewind, capsys):
    run_dir, plan, loader, skip = run_with_a_rewind
    assert gristmill(["data", "inspect", str(run_dir), "--step", "8", "--max-rows", "0"]) == 0
    out = capsys.readouterr().out
    skipped = sum(d["tokens"] for d in plan.skip_detail(skip))
    assert f"# 1 rewind(s), {skipped:,} tokens skipped (read, never trained):" in out
    assert "#   rewind 1: steps 5-8 skipped (loss 9.81 at step 9 (mean 3.12 + 6σ); back to step 4): " in out
    assert (
        "step 8 = phase 'long' step 2 of 5 (8 sequences × 64 = 512 tokens); SKIPPED by rewind 1 "
        "(loss 9.81 at step 9 (mean 3.12 + 6σ); "
        "back to step 4): these windows were not trained on; sha256 "
        f"{batch_sha256(loader.builder.batch(7))}" in out
    )
    assert out.count("\nrow ") == plan.phases[1].global_batch  # the batch it did not train on, all rows
    assert gristmill(["data", "inspect", str(run_dir), "--step", "9"]) == 0
    assert (
        "step 9 = phase 'long' step 3 of 5 (8 sequences × 64 = 512 tokens); sha256 "
        in capsys.readouterr().out
    )
    assert gristmill(["data", "inspect", str(run_dir), "--step", "3", "--end", "11", "--hash"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    marked = {int(line.split()[0]) for line in lines if line.endswith(" skipped (rewind 1)")}
    assert len(lines) == 8 and marked == {5, 6, 7, 8}


def test_step_spans_are_where_step_windows_put_each_source_and_only_move_forward():
    """Plan.step_spans (what a bucket's prefetcher asks of every step ahead) names, per source, the
    stream tokens step_windows gives its slots, back to back in one epoch; and each source's stream
    only moves forward from step to step, across epochs and phases (the prefetcher's walk jumps over
    steps between two that read the same epoch groups)."""
    plan = small_plan()
    reached: dict[int, tuple[int, int]] = {}
    for step in range(plan.total_steps):
        labels, epochs, first = plan.step_windows(step)
        window = plan.phases[plan.locate(step)[0]].seq_len + 1
        spans = plan.step_spans(step)
        assert [i for i, *_ in spans] == sorted(set(labels.tolist()))
        for i, epoch, a, z in spans:
            mine = labels == i
            assert set(epochs[mine].tolist()) == {epoch}
            assert sorted(first[mine].tolist()) == list(range(a, z, window))
            assert (epoch, a) >= reached.get(i, (0, 0)), (step, i)
            reached[i] = (epoch, z)
    assert {e for e, _ in reached.values()} != {0}  # the plan crossed epochs


def test_a_numpy_step_gives_the_python_step_s_windows_under_a_decimal_mix():
    """A step given as a numpy integer (an array's element) is the same step: a decimal mix's exact
    weights (0.1234567890123457 : 0.8765432109876543 → integers of 16 digits) times k·G passed int64 in
    numpy's arithmetic within ten steps, and the plan gave negative stream offsets, with only a
    RuntimeWarning (review RV34d L1)."""
    weights = data_plan.integer_weights([0.1234567890123457, 0.8765432109876543])
    assert max(weights) > 10**15  # the weights that overflow: k·G·weight past 2**63 at k = 10
    sources = [Source("a", "", "fa", 10**15, 1), Source("b", "", "fb", 10**15, 1)]
    plan = Plan(sources, [Phase("p", None, 8, 1024, weights, LRPiece(1e-3, 1e-3, "constant"))], seed=1)
    for step in (10, 1000, 100_000):
        as_numpy = np.int64(step)
        assert plan.locate(as_numpy) == plan.locate(step)
        assert plan.step_spans(as_numpy) == plan.step_spans(step)
        assert all(a >= 0 for _, _, a, _ in plan.step_spans(as_numpy))
        for got, want in zip(plan.step_windows(as_numpy), plan.step_windows(step)):
            assert got.tolist() == want.tolist()
        assert plan.cumulative(0, as_numpy).tolist() == plan.cumulative(0, step).tolist()
        assert all(type(x) is int for span in plan.step_spans(as_numpy) for x in span)


def test_a_source_too_small_for_one_step_names_what_it_holds_out():
    """A source whose epoch holds fewer windows than one step takes: the refusal names a bigger dataset
    or a smaller weight, and where the source holds documents out, val_fraction (review R2: a split
    emptied by val_fraction was advised only the first two)."""

    for val_fraction, says in (
        (0.5, r"smaller weight, or hold out less \(val_fraction 0\.5\)$"),
        (0.0, r"smaller weight$"),
    ):
        plan = Plan(
            [Source("web", "w-dir", "w", 100, 1, None, val_fraction)],
            [Phase("main", 4, 16, 8, (1,), LRPiece(1e-3, 1e-3, "constant"))],
            seed=7,
        )
        with pytest.raises(PlanError, match=says):
            plan.step_windows(0)
