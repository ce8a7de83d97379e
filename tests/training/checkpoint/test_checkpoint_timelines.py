"""One run directory holds one run: real in-process runs of the tiny recipe against a run directory
whose every checkpoint is damaged, a new run (or another run's checkpoint) into a directory that
already holds checkpoints, retention beside a checkpoint of another timeline, and a checkpoint's
model against a changed config (resume refuses, export builds the checkpoint's own model)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import struct
from pathlib import Path

import pytest
import torch

from pipelines.cli import main as gristmill
from tests.helpers.train_runs import TINY, damage, metrics, one_error_line, overrides
from training.checkpoint.checkpointer import Checkpointer, complete_steps
from training.checkpoint.state import ModelState
from training.config import CheckpointSection
from training.contract.batch_record import batch_file, read_batches
from training.contract.run_layout import COMPLETE_FILE, CONFIG_TOML, checkpoint_dir, export_dir, read_metrics
from training.train import main


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset(n_docs=300)


def run(dataset: Path, run_dir: Path, *sets: str) -> int:
    return main(["--config", TINY, "--set", *overrides(dataset, run_dir, *sets)])


def files(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", CONFIG_TOML)}


def test_resume_auto_refuses_when_every_complete_checkpoint_is_damaged(dataset, tmp_path, capsys):
    """Starting over beside a damaged step 8 used to start metrics.jsonl over, and retention then
    deleted the new run's step 4 and kept the damaged step 8."""
    r = tmp_path / "run"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=1") == 0
    assert complete_steps(r) == [8]
    damage(checkpoint_dir(r, 8) / "__0_0.distcp", 1000, os.urandom(4096))
    before = files(r)
    capsys.readouterr()
    assert run(dataset, r, "run.max_steps=4", "checkpoint.keep_last=1", 'checkpoint.resume="auto"') == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"no complete checkpoint in {r / 'checkpoints'} verifies (step-000008 is damaged: " in line
    assert "__0_0.distcp: crc32" in line
    assert f"move {r / 'checkpoints'} and checkpoints.jsonl aside to start over from step 0" in line
    assert files(r) == before and complete_steps(r) == [8]

    # export of the damaged step, and a partial export directory: each says what to do
    assert gristmill(["export", str(r), "--step", "8"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "step-000008 is damaged" in line and "Export another step (--step N" in line
    export_dir(r, 8).mkdir(parents=True)
    (export_dir(r, 8) / "config.json").write_text("{}")
    assert gristmill(["export", str(r), "--step", "8"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "is not an export: no model.safetensors" in line and "delete" not in line, line  # RV32f A6
    assert "restore its model.safetensors from a copy of the export" in line, line  # step 8's is damaged

    # only incomplete leftovers (a crash before the first checkpoint completed): step 0, as before
    (checkpoint_dir(r, 8) / COMPLETE_FILE).unlink()
    assert run(dataset, r, "run.max_steps=4", "checkpoint.keep_last=1", 'checkpoint.resume="auto"') == 0
    out = capsys.readouterr().out
    assert f"--resume auto: no complete checkpoint in {r / 'checkpoints'}; starting from step 0" in out
    assert [m["step"] for m in metrics(r)] == [1, 2, 3, 4] and complete_steps(r) == [4]


def test_a_new_run_into_a_directory_with_checkpoints_is_refused(dataset, tmp_path, capsys):
    """A fresh run into a directory holding an earlier run's step 8 used to train, and retention
    (counting step 8 as the newest) deleted the new run's checkpoints; export and --resume auto
    then took the old run's step 8."""
    r, other = tmp_path / "run", tmp_path / "other"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0") == 0
    assert run(dataset, other, "run.max_steps=4") == 0
    before = files(r)
    capsys.readouterr()
    assert run(dataset, r, "run.max_steps=4", "checkpoint.keep_last=1") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{r / 'checkpoints'} already holds step-000008 (saved " in line
    assert "and 1 older complete checkpoint(s)) of an earlier run" in line
    assert "continue that run with --resume auto, or use another run.output_dir" in line
    # a resume from another run directory's checkpoint, into this one
    foreign = checkpoint_dir(other, 4)
    assert run(dataset, r, "run.max_steps=8", f"checkpoint.resume={json.dumps(str(foreign))}") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--resume {foreign} is a checkpoint of another run directory, but {r / 'checkpoints'}" in line
    assert "already holds step-000008" in line and "into another run.output_dir" in line
    assert files(r) == before and complete_steps(r) == [4, 8]

    # set-aside (abandoned-step-N) and incomplete directories are no run to continue
    checkpoint_dir(r, 8).rename(checkpoint_dir(r, 8).with_name("abandoned-step-000008"))
    (checkpoint_dir(r, 4) / COMPLETE_FILE).unlink()
    assert run(dataset, r, "run.max_steps=4", "checkpoint.keep_last=1") == 0
    assert complete_steps(r) == [4] and [m["step"] for m in metrics(r)] == [1, 2, 3, 4]


def test_a_resume_from_another_run_s_checkpoint_starts_this_directory_s_record_over(
    dataset, tmp_path, capsys
):
    """Into a directory whose earlier run kept no checkpoint (checkpoint.interval = 0, or checkpoints/
    deleted as the refusal above suggests), a resume from another run's step 4 kept that earlier
    run's metrics rows and batch records of steps 1-4 as this run's (another lr, other losses), and
    `verify` passed. What the directory holds is an earlier run's: started over, as for a fresh run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r, other = tmp_path / "run", tmp_path / "other"
    tb = "metrics.tensorboard=true"
    assert run(dataset, other, "run.max_steps=8") == 0
    r.mkdir()  # what a start that failed before its first step leaves: no record to keep (R21d 5)
    (r / "metrics.jsonl").write_text("")
    (r / "batches.bin").write_bytes(batch_file([]))
    assert run(dataset, r, "run.max_steps=8", "optim.lr=1e-2", "checkpoint.interval=0", tb) == 0
    assert not list(r.glob("abandoned-*"))
    # a RUN/base/ a start from a base left (it died before its first checkpoint): not this run's base,
    # whose weights descend from a run from scratch (its exports took that base's tokens: review R15d F8)
    _plant_base(r)
    capsys.readouterr()
    foreign = checkpoint_dir(other, 4)
    assert run(dataset, r, "run.max_steps=8", f"checkpoint.resume={json.dumps(str(foreign))}", tb) == 0
    assert not (r / "base").exists()
    said = capsys.readouterr().out
    for name in ("metrics.jsonl", "batches.bin"):  # kept aside, not truncated (review R21b F3)
        assert (
            f"note: {r / name} is from an earlier run in this directory; moved it to abandoned-{name}" in said
        )
    assert read_metrics(r / "abandoned-metrics.jsonl")[0][-1]["step"] == 8  # the earlier run's, whole
    assert [e.step for e in read_batches(r / "abandoned-batches.bin")[0]] == list(range(1, 9))
    assert [(m["step"], m["loss"]) for m in metrics(r)] == [
        (m["step"], m["loss"]) for m in metrics(other)[4:]
    ]
    assert [e.step for e in read_batches(r / "batches.bin")[0]] == [5, 6, 7, 8]
    # tensorboard's curve too (the earlier run's steps 1-8 stayed beside this run's 5-8)
    logged = EventAccumulator(str(r / "tensorboard")).Reload().Scalars("loss")
    assert [(e.step, round(e.value, 4)) for e in logged] == [
        (m["step"], round(m["loss"], 4)) for m in metrics(r)
    ]
    capsys.readouterr()
    assert gristmill(["verify", str(r)]) == 0
    # Step 4 was the other run's: said so, never "deleted by retention" (it never was here).
    assert gristmill(["export", str(r), "--step", "4"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"step 4 was not trained in {r}: its record begins at step 5, the run having started " in line


def test_retention_keeps_the_save_it_follows_and_counts_only_its_timeline(tmp_path):
    """A complete step 40 of another timeline beside a run saving steps 2, 4, 6 with keep_last=1:
    retention used to count step 40 as the newest and delete each checkpoint just saved."""
    model = torch.nn.Linear(4, 3)
    states = {"model": ModelState(model)}
    cfg = CheckpointSection(interval=2, keep_last=1)

    def checkpointer() -> Checkpointer:
        return Checkpointer(cfg, tmp_path, states, rank=0, world_size=1, last_step=40, config_sha256="t",
                            estimate_bytes=0)  # fmt: skip

    old = checkpointer()
    old.save(40, 0)
    old.close()
    ckpt = checkpointer()
    for step, expect in ((2, [2, 40]), (4, [4, 40]), (6, [6, 40])):
        ckpt.save(step, 0)
        ckpt._join_retention()
        assert complete_steps(tmp_path) == expect, step
    ckpt.close()


def test_retention_passes_stray_step_names_and_removes_links_not_what_they_name(tmp_path):
    """A `step-2` copy beside step-000002 was listed as step 2, whose folder every use rebuilt as
    step-000002: retention failed at each save and resume (trial RV63a 3). A checkpoint kept elsewhere
    and linked in had its COMPLETE deleted through the link, then rmtree failed on the link at every
    resume (RV63a 2): the link goes, what it names stays whole."""
    model = torch.nn.Linear(4, 3)
    ckpt = Checkpointer(CheckpointSection(interval=2, keep_last=1), tmp_path, {"model": ModelState(model)},
                        rank=0, world_size=1, last_step=10, config_sha256="t", estimate_bytes=0)  # fmt: skip
    ckpt.save(2, 0)
    ckpt._join_retention()
    root = tmp_path / "checkpoints"
    shutil.copytree(checkpoint_dir(tmp_path, 2), root / "step-2")  # a copy the user named
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ckpt.save(4, 0)
    ckpt._join_retention()
    checkpoint_dir(tmp_path, 4).rename(elsewhere / "step-000004")
    checkpoint_dir(tmp_path, 4).symlink_to(elsewhere / "step-000004")
    for step in (6, 8):
        ckpt.save(step, 0)
        ckpt._join_retention()
    ckpt.close()
    assert complete_steps(tmp_path) == [8]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step")) == ["step-000008", "step-2"]
    assert (elsewhere / "step-000004" / COMPLETE_FILE).is_file()  # the linked copy, whole


def test_a_copy_of_a_run_whose_checkpoints_are_a_link_is_refused_not_given_the_original_s(
    dataset, tmp_path, capsys
):
    """`cp -a` of a run whose checkpoints/ links to scratch storage keeps the link: the copy resumed,
    saved into the original's folder and its retention deleted the original's checkpoints, each run
    under its own lock (trial RV63a 1). Refused at the copy's start; a run directory moved (the old
    path gone) takes its folder over."""
    original, copy = tmp_path / "a", tmp_path / "b"
    original.mkdir()
    (tmp_path / "scratch").mkdir()
    (original / "checkpoints").symlink_to(tmp_path / "scratch")
    assert run(dataset, original, "run.max_steps=4", "checkpoint.keep_last=1") == 0
    shutil.copytree(original, copy, symlinks=True)
    kept = sorted(p.name for p in (tmp_path / "scratch").iterdir())
    capsys.readouterr()
    assert run(dataset, copy, "run.max_steps=8", "checkpoint.keep_last=1", "checkpoint.resume=auto") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {copy / 'checkpoints'} is {tmp_path / 'scratch'}, the checkpoints folder of the run "
        f"{original} too (a copy of that run, its checkpoints/ a link?): each run would save into the "
        f"other's and its retention delete them; give {copy} a checkpoints folder of its own (replace the "
        f"link with a copy of what it needs, e.g. cp -rL) and start again, or, if {original} is done with, "
        f"delete {copy / 'checkpoints' / '.run'}"
    )
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == kept
    shutil.rmtree(original)  # the original gone (moved): the copy is the folder's run now
    assert run(dataset, copy, "run.max_steps=8", "checkpoint.keep_last=1", "checkpoint.resume=auto") == 0
    assert complete_steps(copy) == [8]


def test_a_seed_past_32_bits_is_refused_at_a_start_and_a_run_saved_with_one_resumes(
    dataset, tmp_path, capsys, monkeypatch
):
    """torch's CPU generator keeps a seed's low 32 bits: run.seed = 4294967296 trained seed 0's model
    bit for bit (trial RV72c F2). A fresh start is refused in one line, before the run directory; a run
    saved with such a seed (by an earlier gristmill) still resumes and verifies: its weights are the
    checkpoint's (refusing the seed in the config's checks broke that, review RV66e 1)."""
    big = "run.seed=4294967296"
    assert run(dataset, tmp_path / "fresh", "run.max_steps=4", big) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: run.seed = 4294967296 is not allowed: it must be between 0 and 4294967295 (torch's CPU "
        "generator keeps a seed's low 32 bits: it would draw as seed 0 does) (--set run.seed=4294967296)"
    )
    plan = ["train", "--config", TINY, "--plan", "--set", *overrides(dataset, tmp_path / "fresh", big)]
    assert gristmill(plan) == 2  # --plan says what train would
    assert "error: run.seed = 4294967296 is not allowed" in one_error_line(capsys.readouterr().err)
    # data.seed keeps 64 bits: -1 drew the batches of 2**64 - 1, exit 0 (trial RV74c 2)
    assert run(dataset, tmp_path / "fresh", "run.max_steps=4", "data.seed=-1") == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: data.seed = -1 is not allowed: it must be between 0 and {2**64 - 1} (the data order keeps a "
        f"seed's low 64 bits: it would draw as seed {2**64 - 1} does) (--set data.seed=-1)"
    )
    assert not (tmp_path / "fresh").exists()
    r = tmp_path / "run"
    with monkeypatch.context() as m:  # as an earlier gristmill started it
        m.setattr("training.run.preflight.check_run_seed", lambda *_: None)
        assert run(dataset, r, "run.max_steps=4", big) == 0
    assert run(dataset, r, "run.max_steps=8", big, 'checkpoint.resume="auto"') == 0
    assert complete_steps(r) == [4, 8]
    assert gristmill(["verify", str(r)]) == 0
    resume = ["train", "--config", TINY, "--plan", "--set", *overrides(dataset, r, big, "run.max_steps=8")]
    assert gristmill([*resume, 'checkpoint.resume="auto"']) == 0


def _safetensors_names(path: Path) -> set[str]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return set(json.loads(f.read(n))) - {"__metadata__"}


def test_the_checkpoint_records_its_model_and_resume_and_export_use_it(dataset, tmp_path, capsys):
    """The tiny preset has 2 layers. A resume as a 1-layer model used to load the first layer and
    train on with a note; export with a config.toml saying 1 layer wrote a 1-layer model."""
    r = tmp_path / "run"
    assert run(dataset, r, "run.max_steps=4") == 0
    record = json.loads((checkpoint_dir(r, 4) / COMPLETE_FILE).read_text())
    assert record["model"]["n_layers"] == 2 and record["model"]["dim"] == 64
    before = files(r)
    capsys.readouterr()
    auto = 'checkpoint.resume="auto"'
    assert run(dataset, r, "run.max_steps=8", auto, "model.n_layers=1") == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"cannot resume from {checkpoint_dir(r, 4)}: it holds another model" in line
    assert "(model.n_layers = 2 in the checkpoint, 1 in this config)" in line
    assert "--set model.n_layers=2" in line and "start a new run directory" in line
    assert run(dataset, r, "run.max_steps=8", auto, "model.n_kv_heads=4", "model.tie_embeddings=true") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "model.n_kv_heads = 2 in the checkpoint, 4 in this config" in line and "Size mismatch" not in line
    assert "model.tie_embeddings = false in the checkpoint, true in this config" in line
    assert files(r) == before  # refused before anything was loaded or written
    # settings that only decide the weights a run starts from: the checkpoint's replace them; a resume
    # said "in effect from step 5" and recorded them, and nothing changed (review R25b 2)
    start = ["model.init_std=0.05", "run.seed=7"]
    assert run(dataset, r, "run.max_steps=8", auto, *start) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"cannot resume from {checkpoint_dir(r, 4)}: model.init_std = 0.05 in this config, 0.02 in " in line
    )
    assert "run.seed = 7 in this config, 0 in the checkpoint; they decide only" in line
    assert "they decide only the weights a run starts from, and a resume continues the checkpoint's" in line
    assert "drop the override (or --set model.init_std=0.02 run.seed=0)" in line
    assert files(r) == before

    # a setting that leaves the weights as they are: resumed, with a note
    # (where the model is built is a memory setting, not its weights: a resume may change it)
    # (nor is init_std spelled at the value it had: not a change, not "in effect": review R25h 6)
    sets = ["model.loss_chunk=32", 'run.init_device="full"', "model.init_std=0.02"]
    assert run(dataset, r, "run.max_steps=8", auto, *sets) == 0
    out = capsys.readouterr().out
    note = "note: model settings differ from step-000004's (model.loss_chunk = 0 in the checkpoint, 32 now)"
    assert note in out and "init_std" not in out
    assert json.loads((checkpoint_dir(r, 8) / COMPLETE_FILE).read_text())["model"]["loss_chunk"] == 32

    # export takes the checkpoint's model, whatever RUN/config.toml says now
    config = (r / CONFIG_TOML).read_text()
    (r / CONFIG_TOML).write_text(config.replace('preset = "tiny"', 'preset = "tiny"\nn_layers = 1', 1))
    assert gristmill(["export", str(r), "--step", "8"]) == 0
    out = capsys.readouterr().out
    assert "note: step-000008 was saved with another model than" in out
    assert "(model.n_layers = 2 in the checkpoint, 1 in config.toml)" in out
    hf = json.loads((export_dir(r, 8) / "config.json").read_text())
    assert hf["num_hidden_layers"] == 2
    assert "model.layers.1.mlp.down_proj.weight" in _safetensors_names(export_dir(r, 8) / "model.safetensors")
    assert gristmill(["verify", str(r)]) == 0

    # a checkpoint written before COMPLETE recorded the model: RUN/config.toml's model, as before
    (r / CONFIG_TOML).write_text(config)
    del record["model"], record["record_sha256"]  # (nor its own sha256)
    (checkpoint_dir(r, 4) / COMPLETE_FILE).write_text(json.dumps(record))
    capsys.readouterr()
    assert gristmill(["export", str(r), "--step", "4"]) == 0
    assert "note:" not in capsys.readouterr().out
    assert json.loads((export_dir(r, 4) / "config.json").read_text())["num_hidden_layers"] == 2
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(r, 4)))}"
    assert run(dataset, r, "run.max_steps=5", resume) == 0
    assert [m["step"] for m in metrics(r)][-1] == 5


@pytest.mark.parametrize("before", ["a refused attempt", "no record"])
def test_a_resume_from_an_older_checkpoint_keeps_the_left_timeline_s_rows_and_records_aside(
    dataset, tmp_path, capsys, before
):
    """--resume of the run's step 4 while step 8 is complete: step 8 is set aside (abandoned-step-8),
    and metrics.jsonl's rows and batches.bin's records of steps 5-8 were dropped without a trace, so
    nothing held that timeline's losses and verify could check its checkpoint against nothing (trial
    RV57b F6). The files as they were are kept beside them, with a note each; a resume from the newest
    checkpoint (a preempted run's: the steps after it are redone) keeps nothing aside."""
    r = tmp_path / "run"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0") == 0
    rows_before, records_before = (r / "metrics.jsonl").read_bytes(), (r / "batches.bin").read_bytes()
    if before == "a refused attempt":
        # as an attempt refused after it set step 8 aside leaves it (a tracker that would not start):
        # the retry, which sets nothing aside itself, dropped the rows silently (review RV57e 2)
        checkpoint_dir(r, 8).rename(checkpoint_dir(r, 8).with_name("abandoned-step-000008"))
    else:  # a run from before checkpoints.jsonl: what the resume sets aside tells (trial RV58b F2)
        (r / "checkpoints.jsonl").unlink()
    capsys.readouterr()
    resume4 = f"checkpoint.resume={json.dumps(str(checkpoint_dir(r, 4)))}"
    assert run(dataset, r, "run.max_steps=6", "checkpoint.keep_last=0", "optim.grad_clip=0.05", resume4) == 0
    out = capsys.readouterr().out
    for name, what in (("metrics.jsonl", "rows"), ("batches.bin", "records")):
        note = f"note: {name}'s {what} of steps 5–8 are of the timeline the resume left (its checkpoints went"
        assert f"{note} past the step resumed); the file as it was: abandoned-{name}" in out, out
    assert (r / "abandoned-metrics.jsonl").read_bytes() == rows_before
    assert (r / "abandoned-batches.bin").read_bytes() == records_before
    assert [m["step"] for m in metrics(r)] == [1, 2, 3, 4, 5, 6]
    capsys.readouterr()
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0", 'checkpoint.resume="auto"') == 0
    assert "of the timeline the resume left" not in capsys.readouterr().out
    assert not (r / "abandoned-metrics.jsonl.2").exists() and not (r / "abandoned-batches.bin.2").exists()


def test_a_checkpoint_s_line_a_kill_left_out_of_checkpoints_jsonl_is_written_by_the_resume(
    dataset, tmp_path, capsys
):
    """A kill between a checkpoint's COMPLETE and its line in RUN/checkpoints.jsonl: the step's line of
    an earlier timeline was then the run's, and once retention deleted the checkpoint, verify called
    the run's own export another checkpoint's (review RV57e 3). The resume writes the line."""
    r = tmp_path / "run"
    per = ("checkpoint.keep_last=0", "checkpoint.export_interval=8")
    assert run(dataset, r, "run.max_steps=8", *per) == 0
    resume4 = f"checkpoint.resume={json.dumps(str(checkpoint_dir(r, 4)))}"
    assert run(dataset, r, "run.max_steps=8", "optim.grad_clip=0.05", resume4, *per) == 0
    ledger = r / "checkpoints.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    ledger.write_text("".join(lines[:-1]) + lines[-1][:20])  # step 8's line, cut short by the kill
    assert run(dataset, r, "run.max_steps=8", 'checkpoint.resume="auto"', *per) == 0
    shutil.rmtree(checkpoint_dir(r, 8))  # retention
    capsys.readouterr()
    assert gristmill(["verify", str(r)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("last_save", ["completes", "fails"])
def test_a_checkpoint_s_line_not_written_is_written_with_the_next_save(
    dataset, tmp_path, capsys, monkeypatch, last_save
):
    """A line of RUN/checkpoints.jsonl that could not be written (a disk full for a moment): retention
    then deleted its checkpoint and kept its export, which verify called another run's (DAMAGED). The
    line is kept and written before the next save's, and where that fails too (the run's last save,
    the disk still full), at the run's end, once retention freed room (review RV59d 1), also where the
    last save's completion failed there (the run's error path, Checkpointer.abandon: review RV59f 5)."""
    import errno

    import training.checkpoint.checkpointer as checkpointer

    written, failed = checkpointer.record_saved, []
    if last_save == "fails":
        close = checkpointer.Checkpointer.close

        def failing_close(self):
            def finish():
                raise checkpointer.CheckpointError("the last save's write failed (disk full)")

            self.finish = finish
            close(self)

        monkeypatch.setattr(checkpointer.Checkpointer, "close", failing_close)

    def once_full(run_dir, step, identity):
        if step == 4 and len(failed) < 2:  # at its save, and again at step 8's
            failed.append(step)
            raise OSError(errno.ENOSPC, "No space left on device")
        written(run_dir, step, identity)

    monkeypatch.setattr(checkpointer, "record_saved", once_full)
    r = tmp_path / "run"
    code = run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=1", "checkpoint.export_interval=4")
    assert code == (0 if last_save == "completes" else 2)
    said = capsys.readouterr().out
    assert failed == [4, 4] and not checkpoint_dir(r, 4).exists() and export_dir(r, 4, False).is_dir()
    assert gristmill(["verify", str(r)]) == 0, capsys.readouterr().out
    assert "checkpoints.jsonl not written (No space left on device): written with the next save's" in said
    # at step 8's save, both left out by then are named, not the first alone (trial RV65f 3)
    assert "if the run stops first, an export of steps 4, 8 whose checkpoint retention deletes" in said


def test_a_checkpoint_whose_loader_is_a_step_ahead_resumes_at_its_trained_step(
    dataset, tmp_path, capsys, monkeypatch
):
    """What gristmill saved after a data error on one rank of several (the ranks that read had counted
    the next step's batch, and the save kept one of their counts): a resume continues with the batch of
    the step after the trained one, and the run equals the uninterrupted one."""
    from training.data.loader import TokenLoader

    reference, r = tmp_path / "reference", tmp_path / "run"
    assert run(dataset, reference) == 0
    ahead = TokenLoader.state_dict
    with monkeypatch.context() as m:
        m.setattr(TokenLoader, "state_dict", lambda self: {**ahead(self), "step": self.step + 1})
        assert run(dataset, r, "run.max_steps=4") == 0
    capsys.readouterr()
    assert run(dataset, r, 'checkpoint.resume="auto"') == 0
    assert "holds the loader at step 5, not at its trained step 4; continuing with step 5's batch" in (
        capsys.readouterr().out
    )
    assert [row["loss"] for row in metrics(r)] == [row["loss"] for row in metrics(reference)]


def test_a_fresh_run_sets_aside_an_earlier_runs_exports(dataset, tmp_path, capsys):
    """checkpoints/ deleted to start over (the refusals' advice): the new run's export of step 4 was
    the earlier run's, kept because it verified, then scored and verified as the new run's."""
    from safetensors.torch import load_file

    r = tmp_path / "run"
    assert run(dataset, r, "run.max_steps=4", "checkpoint.export_interval=4") == 0
    earlier = load_file(export_dir(r, 4) / "model.safetensors")
    (r / "checkpoints").rename(tmp_path / "deleted")
    capsys.readouterr()
    assert run(dataset, r, "run.max_steps=4", "checkpoint.export_interval=4", "run.seed=7") == 0
    assert "exports/step-000004 is from an earlier run in this directory" in capsys.readouterr().out
    kept = load_file(r / "exports" / "abandoned-step-000004" / "model.safetensors")
    now = load_file(export_dir(r, 4) / "model.safetensors")
    assert all(torch.equal(kept[k], earlier[k]) for k in earlier)
    assert not all(torch.equal(now[k], earlier[k]) for k in earlier)


def test_exports_missed_at_a_checkpoint_are_written_when_a_resume_starts_from_it(dataset, tmp_path, capsys):
    """The process stopped between step 4's COMPLETE and its exports (a kill, a full disk): the resume
    from step 4 writes them before retention (keep_last 1) deletes the checkpoint, the merged
    weights' too, which lived nowhere else."""
    import shutil

    r = tmp_path / "run"
    sets = ["checkpoint.keep_last=1", "checkpoint.export_interval=4", 'merge.kind="window"', "merge.every=4",
            "merge.window=2", "merge.export=true"]  # fmt: skip
    assert run(dataset, r, "run.max_steps=4", *sets) == 0
    for merged in (False, True):
        shutil.rmtree(export_dir(r, 4, merged))
    capsys.readouterr()
    assert run(dataset, r, "run.max_steps=8", 'checkpoint.resume="auto"', *sets) == 0
    assert "missed when step 4's checkpoint completed" in capsys.readouterr().out
    assert complete_steps(r) == [8]
    assert export_dir(r, 4).is_dir() and export_dir(r, 4, merged=True).is_dir()
    assert gristmill(["verify", str(r)]) == 0  # every export against its checksums


def test_a_moved_run_s_saved_config_is_refused_until_run_output_dir_says_where(
    dataset, tmp_path, capsys, monkeypatch
):
    """`--config RUN/config.toml --resume auto` of a moved run, or from another working directory
    for a relative run.output_dir, found no checkpoint where output_dir led and trained another run
    from step 0 (or continued the original), with one note. Refused now, in one line naming the fix;
    with that --set, the run continues where it is."""
    orig = tmp_path / "orig"
    assert run(dataset, orig, "run.max_steps=4") == 0
    moved = tmp_path / "moved"
    orig.rename(moved)
    capsys.readouterr()
    args = ["train", "--config", str(moved / CONFIG_TOML), "--resume", "auto"]
    for entry in (gristmill, lambda a: main(a[1:])):  # the launcher, the trainer's own entry point
        assert entry(args) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"{moved / CONFIG_TOML} is the saved config of the run in {moved}, but its " in line
        assert f'run.output_dir = "{orig}" leads to {orig} from here' in line, line
        assert f'add --set run.output_dir="{moved}"' in line
        assert not orig.exists()
    assert gristmill([*args, "--set", f'run.output_dir="{moved}"', "run.max_steps=6"]) == 0
    assert "resumed at step 4" in capsys.readouterr().out
    assert [r["step"] for r in metrics(moved)][-1] == 6

    # A relative run.output_dir, from another working directory: the same refusal.
    monkeypatch.chdir(tmp_path)
    rel = "runs/rel"
    assert run(dataset, Path(rel), "run.max_steps=4") == 0
    monkeypatch.chdir(tmp_path / "runs")
    assert gristmill(["train", "--config", str(tmp_path / rel / CONFIG_TOML), "--resume", "auto"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f'run.output_dir = "{rel}" leads to {tmp_path / "runs" / rel} from here' in line, line
    assert not (tmp_path / "runs" / rel).exists()


def test_a_resume_from_a_set_aside_checkpoint_in_its_own_directory_is_refused(dataset, tmp_path, capsys):
    """`--resume RUN/checkpoints/abandoned-step-N` trained on in RUN, whose earlier checkpoints,
    exports and metrics rows were the other timeline's: nothing was set aside, and a later rewind went
    back into the other timeline's weights (review R15c F3). Refused; its advice (another directory)
    continues that timeline from its step."""
    r, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0") == 0
    resume4 = f"checkpoint.resume={json.dumps(str(checkpoint_dir(r, 4)))}"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0", "optim.grad_clip=0.05", resume4) == 0
    left = checkpoint_dir(r, 8).with_name("abandoned-step-000008")
    assert left.is_dir() and complete_steps(r) == [4, 8]
    before = files(r)
    capsys.readouterr()
    back = f"checkpoint.resume={json.dumps(str(left))}"
    assert run(dataset, r, "run.max_steps=12", "checkpoint.keep_last=0", back) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--resume {left} is a checkpoint of a timeline this run left" in line
    assert "into another run.output_dir" in line
    assert files(r) == before and complete_steps(r) == [4, 8]
    assert run(dataset, elsewhere, "run.max_steps=12", "checkpoint.keep_last=0", back) == 0
    assert [m["step"] for m in metrics(elsewhere)][:1] == [9] and complete_steps(elsewhere)[-1] == 12


def test_an_export_of_another_run_in_place_of_one_whose_checkpoint_is_gone_is_never_the_run_s(
    dataset, tmp_path, capsys
):
    """Retention deletes checkpoints and keeps their exports. Another run's export of step 8 put in
    this run's place, its checkpoint gone, was verified ok ("0 damaged"), and `export --step 8 --out
    DIR` made a bf16 copy of the other run's weights without a word (trial RV57a F1). RUN/
    checkpoints.jsonl records each checkpoint's COMPLETE sha256 as it is saved: verify names the
    export, and an export of the step refuses it in one line, leaving it. The run's own export of a
    deleted checkpoint stays ok."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for r, seed in ((ours, 0), (theirs, 1)):
        sets = (
            "run.max_steps=8",
            "checkpoint.keep_last=0",
            "checkpoint.export_interval=8",
            f"run.seed={seed}",
        )
        assert run(dataset, r, *sets) == 0
    shutil.rmtree(checkpoint_dir(ours, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(ours)]) == 0  # its own export, its checkpoint deleted
    shutil.rmtree(export_dir(ours, 8))
    shutil.copytree(export_dir(theirs, 8), export_dir(ours, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(ours)]) == 1
    out = capsys.readouterr().out
    assert "exported from another checkpoint of step 8 than the run's (set aside by a resume or a " in out, (
        out
    )
    assert "checkpoints.jsonl, the run's record of its saves, holds another of the step or none" in out, out
    assert (
        gristmill(["export", str(ours), "--step", "8", "--out", str(tmp_path / "bf16"), "--dtype", "bf16"])
        == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert f"{export_dir(ours, 8)} was exported from another checkpoint of step 8 than the run's" in line, (
        line
    )
    assert not (tmp_path / "bf16").exists() and export_dir(ours, 8).is_dir()  # said, left as it is
    # a stray byte or a deep nest in the record skips its line, never the record (it made every export
    # unchecked, or a RecursionError traceback: trial RV58b F2, F3)
    with open(ours / "checkpoints.jsonl", "ab") as f:
        f.write(b"\xff\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    assert gristmill(["verify", str(ours)]) == 1

    # A fresh run in a directory whose checkpoints were deleted: the earlier run's record vouched for
    # its exports put back, as the fresh run's, at a step the fresh run never saved (trial RV58b F1)
    fresh = tmp_path / "fresh"
    assert (
        run(dataset, fresh, "run.max_steps=8", "checkpoint.keep_last=0", "checkpoint.export_interval=8") == 0
    )
    shutil.rmtree(fresh / "checkpoints")
    assert run(dataset, fresh, "run.max_steps=4", "checkpoint.keep_last=0", "optim.grad_clip=0.05") == 0
    assert "checkpoints.jsonl is an earlier run's in this directory" in capsys.readouterr().out
    shutil.copytree(export_dir(fresh, 8).with_name("abandoned-step-000008"), export_dir(fresh, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(fresh)]) == 1
    assert "exported from another checkpoint of step 8 than the run's" in capsys.readouterr().out


def test_an_export_of_a_checkpoint_set_aside_while_it_ran_is_never_the_run_s(
    dataset, tmp_path, capsys, monkeypatch
):
    """`gristmill export RUN --step 8` read checkpoint 8; a resume from step 4 set it aside and trained
    another step 8 meanwhile; the export then went into exports/step-000008 as the run's, verified,
    and eval scored it (review R15c F2). It is set aside with one line; an export of another
    checkpoint found there later (verify: DAMAGED) is set aside by the next export, which writes the
    run's."""
    import training.checkpoint.hf_export as hf_export

    r = tmp_path / "run"
    assert run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0") == 0
    loaded = hf_export.load_checkpoint_model

    def load_then_resume(*args, **kw):  # the trainer resumes while the export runs (a 7B's minutes)
        got = loaded(*args, **kw)
        resume4 = f"checkpoint.resume={json.dumps(str(checkpoint_dir(r, 4)))}"
        assert (
            run(dataset, r, "run.max_steps=8", "checkpoint.keep_last=0", "optim.grad_clip=0.05", resume4) == 0
        )
        return got

    monkeypatch.setattr(hf_export, "load_checkpoint_model", load_then_resume)
    capsys.readouterr()
    assert gristmill(["export", str(r), "--step", "8"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{checkpoint_dir(r, 8)} was set aside while it was exported" in line
    stale = export_dir(r, 8).with_name("abandoned-step-000008")
    assert stale.is_dir() and not export_dir(r, 8).exists()
    monkeypatch.setattr(hf_export, "load_checkpoint_model", loaded)

    # such an export in the run's place (as one placed before this check was): verify names it, the
    # next export sets it aside and writes the run's step 8
    stale.rename(export_dir(r, 8))
    capsys.readouterr()
    assert gristmill(["verify", str(r)]) == 1
    assert "exported from another checkpoint of step 8 than the run's" in capsys.readouterr().out
    assert gristmill(["export", str(r), "--step", "8"]) == 0
    assert "set aside since; moved to abandoned-step-000008" in capsys.readouterr().out
    record = json.loads((export_dir(r, 8) / "gristmill_export.json").read_text())
    assert record["checkpoint_complete_sha256"] == hf_export.checkpoint_identity(checkpoint_dir(r, 8))
    assert gristmill(["verify", str(r)]) == 0

    # Such an export landing while the run's own is written (the trainer's, beside a CLI export; review
    # R15d F1: the trainer stopped, "remove it by hand"): set aside, the run's takes its place
    shutil.rmtree(export_dir(r, 8))

    def load_then_stale_lands(*args, **kw):
        got = loaded(*args, **kw)
        shutil.copytree(export_dir(r, 8).with_name("abandoned-step-000008"), export_dir(r, 8))
        return got

    monkeypatch.setattr(hf_export, "load_checkpoint_model", load_then_stale_lands)
    assert gristmill(["export", str(r), "--step", "8"]) == 0
    record = json.loads((export_dir(r, 8) / "gristmill_export.json").read_text())
    assert record["checkpoint_complete_sha256"] == hf_export.checkpoint_identity(checkpoint_dir(r, 8))

    # A copy (--out, bf16) of a checkpoint set aside while it ran is removed, and the advice, followed
    # to the letter, makes it again from the run's step 8 (review R15d F2)
    monkeypatch.setattr(hf_export, "load_checkpoint_model", load_then_resume)
    pub = tmp_path / "pub lic"  # a space: the advice is quoted for a shell (review R15g F5)
    capsys.readouterr()
    assert gristmill(["export", str(r), "--step", "8", "--out", str(pub), "--dtype", "bf16"]) == 2
    (advice,) = [
        c for c in one_error_line(capsys.readouterr().err).split("`")[1::2] if c.startswith("gristmill")
    ]
    assert not pub.exists() and f"--out '{pub}' --dtype bf16" in advice, advice
    monkeypatch.setattr(hf_export, "load_checkpoint_model", loaded)
    assert gristmill(shlex.split(advice)[1:]) == 0
    record = json.loads((pub / "gristmill_export.json").read_text())
    assert record["checkpoint_complete_sha256"] == hf_export.checkpoint_identity(checkpoint_dir(r, 8))


def _plant_base(run_dir: Path) -> None:
    """A RUN/base/ record (as a start from a base writes it), whose exports take bos 1 and eos 2."""
    (run_dir / "base").mkdir(parents=True)
    (run_dir / "base" / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    record = {
        "init_from": "/gone",
        "init_from_sha256": "0" * 64,
        "weights_sha256": {},
        "files": ["config.json"],
    }
    (run_dir / "base" / "base.json").write_text(json.dumps(record))


def test_a_resume_through_a_link_to_the_run_s_own_checkpoint_is_the_run_s(dataset, tmp_path):
    """A start from scratch in a directory a dead start from a base left RUN/base/ in keeps none
    (review R15f F4). A resume through a link to the run's own checkpoint (`latest`) read as another
    run's: its exports set aside, metrics.jsonl started over, RUN/base/ dropped (review R15f F1)."""
    r = tmp_path / "run"
    _plant_base(r)
    sets = ("run.max_steps=8", "checkpoint.keep_last=0", "checkpoint.export_interval=4")
    assert run(dataset, r, *sets) == 0
    assert not (r / "base").exists()
    _plant_base(r)  # as if the run were from a base: its record must stay
    rows = metrics(r)[:4]
    (tmp_path / "latest").symlink_to(checkpoint_dir(r, 4))
    assert run(dataset, r, *sets, f"checkpoint.resume={json.dumps(str(tmp_path / 'latest'))}") == 0
    assert metrics(r)[:4] == rows and [m["step"] for m in metrics(r)] == list(range(1, 9))
    assert export_dir(r, 4).is_dir() and (r / "base" / "base.json").is_file()


def test_a_resume_of_a_run_whose_checkpoints_folder_is_a_link_takes_that_run_s_base(
    dataset, tmp_path, capsys
):
    """The run whose checkpoint a resume into another directory takes its RUN/base/ from is the one
    whose checkpoints/ holds it, also when that folder is a link to a volume (review R15g F4: the
    volume's folder was taken for the run, RUN/base/ dropped, the exports' tokens the separator)."""
    other, new = tmp_path / "other", tmp_path / "new"
    assert run(dataset, other, "run.max_steps=4") == 0
    _plant_base(other)  # as a run from a base keeps it
    (other / "checkpoints").rename(tmp_path / "volume")
    (other / "checkpoints").symlink_to(tmp_path / "volume")
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(other, 4)))}"
    assert run(dataset, new, "run.max_steps=8", resume) == 0
    assert json.loads((new / "base" / "base.json").read_text())["init_from"] == "/gone"
    # through the volume's own path, which run it is cannot be told: a run from a base says so (review
    # R15h F4); this one from scratch has no base to lose and says nothing of one (review R15i F4)
    capsys.readouterr()
    volume = f"checkpoint.resume={json.dumps(str(tmp_path / 'volume' / 'step-000004'))}"
    assert run(dataset, tmp_path / "third", "run.max_steps=8", volume) == 0
    assert (
        "lies in no run directory" not in capsys.readouterr().out
        and not (tmp_path / "third" / "base").exists()
    )
