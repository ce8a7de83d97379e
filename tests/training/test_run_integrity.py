"""A run never trains on garbage and never loses itself: real runs of the tiny recipe (in process,
and under torchrun with 2 gloo ranks) against a diverging learning rate, injected NaN losses,
flipped bytes in checkpoints and exports, a garbage .metadata, a torn metrics line, a refused
resume, a second trainer on the same directory, a stale lock and a read-only run directory."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.mounts import unshare_works
from tests.helpers.parquet_damage import flip_a_header_bit, flip_a_name_bit, flip_a_value_bit
from tests.helpers.train_runs import (
    ENV,
    ROOT,
    TINY,
    damage,
    losses,
    metrics,
    one_error_line,
    overrides,
    recorded_batches,
    torchrun_cmd,
    whole_run,
)
from training.checkpoint.checkpointer import write_complete_record
from training.checkpoint.hf_export import ExportError, export_checkpoint, load_checkpoint_model
from training.contract.batch_record import HEADER, RECORD
from training.contract.dataset_format import DatasetError
from training.contract.integrity import file_records
from training.contract.run_layout import (
    COMPLETE_FILE,
    CONFIG_TOML,
    DATA_PLAN_JSON,
    DCP_METADATA,
    LOCK_FILE,
    checkpoint_dir,
    complete_steps,
    export_dir,
)
from training.run.record import RecordUnwritable
from training.train import load_train_config, main, train

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset(n_docs=300)


@pytest.fixture(scope="module")
def whole(dataset, shared) -> Path:
    """`overrides(dataset, RUN)` trained to its end, uninterrupted (read-only: train_runs.whole_run)."""
    return whole_run(shared, dataset)


def test_a_diverging_run_stops_with_exit_3_and_saves_nothing_nonfinite(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    sets = overrides(
        dataset, run, "optim.lr=1e3", "run.log_every=5", "schedule.steps=20", "metrics.plot=true"
    )
    assert main(["--config", TINY, "--set", *sets]) == 3
    line = one_error_line(capsys.readouterr().err)
    assert "is not finite (NaN or inf)" in line and "nothing was saved after it" in line
    assert f"Last complete checkpoint: {checkpoint_dir(run, 4)}" in line
    assert f"gristmill train --config {run / CONFIG_TOML} --resume auto" in line
    bad_step = int(line.split("step ", 1)[1].split(":")[0])
    saved = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").iterdir())
    assert saved == [4] and bad_step > 4  # the save at step 8 came after the NaN: refused
    load_checkpoint_model(run, 4)  # verifies the files and that every weight is finite
    assert (run / "loss.png").is_file()
    # the advice works: a resume cannot change the LR of trained steps, so it says start a new run
    assert "Lower optim.lr" not in line and "run.on_nonfinite=skip" in line
    advice = line.split("start a new run with a lower learning rate (", 1)[1].split(")")[0].split()
    assert advice[:4] == ["gristmill", "train", "--config", str(run / CONFIG_TOML)], line
    new = tmp_path / "new"
    cmd = [a.replace("NEW_DIR", str(new)) for a in advice[1:]] + ["run.max_steps=2", "checkpoint.interval=0"]
    assert gristmill(cmd) == 0 and (new / "metrics.jsonl").is_file()


def test_a_shard_changed_in_place_after_training_is_named_by_verify_and_inspect(dataset, tmp_path, capsys):
    """Every document's second id changed in place, within the vocabulary: `verify` said the recorded
    batches differ from the plan (the record blamed), and `data inspect RUN` showed and hashed the
    changed bytes, exit 0 (trial RV62a F1). Both name the shard and the row, the data at fault."""
    import numpy as np

    from training.contract.dataset_index import DocIndex

    ds, run = tmp_path / "ds", tmp_path / "run"
    shutil.copytree(dataset, ds)
    assert main(["--config", TINY, "--set", *overrides(ds, run, "schedule.steps=4")]) == 0
    assert gristmill(["verify", str(run)]) == 0
    info = json.loads((ds / "dataset.json").read_text())
    index, itemsize = DocIndex(ds, info), np.dtype(info["dtype"]).itemsize
    (shard,) = sorted(info["shard_files"])[:1]
    rows = np.arange(int(index.shard_rows[0]), int(index.shard_rows[1]))
    with open(ds / "shards" / shard, "r+b") as f:
        for at in (index.offsets_of(rows) + itemsize).tolist():
            f.seek(at)
            token = int.from_bytes(f.read(itemsize), "little")
            f.seek(at)
            f.write((token % 200 + 1 if token % 200 + 1 != token else 3).to_bytes(itemsize, "little"))
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("batches:"))
    damaged = re.escape(str(ds / "shards" / shard))
    assert re.match(
        rf"batches: step \d+'s batch cannot be rebuilt from the data: {damaged}: manifest row \d+'s ids "
        r"\(at byte \d+\) are not the document the build hashed",
        line,
    ), line
    assert gristmill(["data", "inspect", str(run), "--hash", "--step", "1", "--end", "5"]) == 2
    assert f"error: {ds / 'shards' / shard}: manifest row " in one_error_line(capsys.readouterr().err)


def test_a_checkpoint_retention_deletes_while_verify_reads_it_is_said_to_be(
    dataset, tmp_path, monkeypatch, capsys
):
    """`gristmill verify` of a run training now: retention deleted a checkpoint between the listing and
    its read, and verify ended in a FileNotFoundError traceback about 1 in 10 times (trial RV63a 4).
    The row says the folder was deleted while it was read; it is no damage."""
    from validation import verify_run as verify_module

    run = tmp_path / "run"
    assert (
        main(
            ["--config", TINY, "--set", *overrides(dataset, run, "schedule.steps=4", "checkpoint.interval=2")]
        )
        == 0
    )
    real = verify_module.verify_checkpoint

    def retention_meanwhile(path):  # the live run's retention, between verify's listing and its read
        if path.name == "step-000002":
            shutil.rmtree(path)
        return real(path)

    monkeypatch.setattr(verify_module, "verify_checkpoint", retention_meanwhile)
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.split()[:3] == ["checkpoint", "2", "deleted"])
    assert row.endswith("deleted while it was read (retention of a run training now)"), out


def test_a_sigterm_at_the_last_step_says_the_run_is_complete(dataset, tmp_path, monkeypatch):
    """A preemption signal during the last step: "resume with --resume auto", and the resume then
    had nothing to do (review R18d 3)."""
    monkeypatch.setenv("GRISTMILL_FAULT_SIGTERM", "4")
    out = io.StringIO()
    train(load_train_config(TINY, overrides(dataset, tmp_path / "run", "schedule.steps=4")), out=out)
    said = "stopping after step 4 on SIGTERM: the last step, the run is complete (checkpoint saved)"
    assert said in out.getvalue().splitlines(), out.getvalue()
    # at run.max_steps, short of the plan's end, it is not complete (review R18f 1)
    out = io.StringIO()
    sets = overrides(dataset, tmp_path / "max", "schedule.steps=8", "run.max_steps=4")
    train(load_train_config(TINY, sets), out=out)
    said = "stopping after step 4 on SIGTERM: run.max_steps 4 reached (checkpoint saved); go on with "
    said += "--resume auto and a run.max_steps above 4"
    assert said in out.getvalue().splitlines(), out.getvalue()


def test_a_ctrl_c_while_the_trackers_finish_leaves_a_complete_run_complete(
    dataset, tmp_path, monkeypatch, capfd
):
    """A Ctrl-C during the trackers' finish (wandb waits up to 30 s) after the last step: the run
    said "interrupted", 130, though every step and checkpoint was done (review R18f 4; on every rank:
    R18g 1). A note, and the run ends as it would. A run no signal reached gives Ctrl-C back to its
    caller (the demo, a test) as it found it."""
    from training.run.record import RunRecord

    before = signal.getsignal(signal.SIGINT)
    plain = overrides(dataset, tmp_path / "plain", "schedule.steps=4")
    train(load_train_config(TINY, plain), out=io.StringIO())
    assert signal.getsignal(signal.SIGINT) == before
    close = RunRecord.close

    def interrupted(self):
        os.kill(os.getpid(), signal.SIGINT)  # as a terminal sends it, during the trackers' wait
        close(self)

    monkeypatch.setattr(RunRecord, "close", interrupted)
    sets = overrides(dataset, tmp_path / "run", "schedule.steps=4")
    summary = train(load_train_config(TINY, sets), out=io.StringIO())
    assert summary["steps"] == 4 and summary["stopped_by"] is None
    assert "note: Ctrl-C after the last step: the run finishes its records" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) == before  # the caller's again (R18i A1)
    # a SIGTERM there (a scheduler after the last step) killed the complete run, 143 (R18i B3)
    terminate = lambda self: (os.kill(os.getpid(), signal.SIGTERM), close(self))  # noqa: E731
    monkeypatch.setattr(RunRecord, "close", terminate)
    sets = overrides(dataset, tmp_path / "term", "schedule.steps=4")
    assert train(load_train_config(TINY, sets), out=io.StringIO())["steps"] == 4
    assert "note: SIGTERM after the last step: the run finishes its records" in capfd.readouterr().err
    # an error after the loop left the note's handler in place: a later Ctrl-C was swallowed (R18i A2)
    monkeypatch.setattr(RunRecord, "close", close)

    def full(self, step):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunRecord, "finished", full)
    term = signal.getsignal(signal.SIGTERM)
    from training.contract.errors import GristmillError

    full_sets = overrides(dataset, tmp_path / "full", "schedule.steps=4")
    with pytest.raises(GristmillError, match="No space left on device"):
        train(load_train_config(TINY, full_sets), out=io.StringIO())
    assert signal.getsignal(signal.SIGINT) == before and signal.getsignal(signal.SIGTERM) == term


def test_nonfinite_steps_are_skipped_on_every_rank_alike(dataset, tmp_path):
    """2 ranks (FSDP2, fused AdamW on DTensors), NaN loss on rank 1 only at step 3, on_nonfinite =
    skip, a checkpoint every step: step 3's weights and optimizer state equal step 2's on both
    ranks' shards, and the run goes on."""
    run = tmp_path / "run"
    sets = overrides(dataset, run, "parallel.shard=2", 'run.on_nonfinite="skip"', "run.max_steps=4",
                     "checkpoint.interval=1", "checkpoint.keep_last=0", "run.log_every=1")  # fmt: skip
    env = {**ENV, "GRISTMILL_FAULT_NAN_LOSS": "3@1"}
    proc = forked.run(torchrun_cmd(sets), cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["step"]: r for r in metrics(run)}
    assert [rows[s]["skipped_steps"] for s in (1, 2, 3, 4)] == [0, 0, 1, 0]
    assert "first at step 3 (loss and gradient norm)" in rows[3]["events"][0]
    assert "WARNING step 3: non-finite" in proc.stdout
    # the fault is said, once (rank 0), before the run's header: one left set changed a real run's
    # loss without a trace (review R25b 7)
    warning = "warning: GRISTMILL_FAULT_NAN_LOSS=3@1 is set: a test's injected fault, the training loss"
    assert proc.stdout.count(warning) == 1, proc.stdout[:3000]
    assert proc.stdout.index(warning) < proc.stdout.index("gristmill train →")

    def state(step: int) -> dict:
        dcp_to_torch_save(checkpoint_dir(run, step), tmp_path / f"{step}.pt")
        flat = torch.load(tmp_path / f"{step}.pt", weights_only=False)
        keep = ("model", "optimizer")
        return {k: v for k, v in _flatten(flat) if k.startswith(keep) and torch.is_tensor(v)}

    s2, s3, s4 = state(2), state(3), state(4)
    assert s2.keys() == s3.keys() and len(s2) > 10
    assert all(torch.equal(s2[k], s3[k]) for k in s2), [k for k in s2 if not torch.equal(s2[k], s3[k])]
    assert any(not torch.equal(s3[k], s4[k]) for k in s3)


def test_a_dataset_replaced_while_the_ranks_start_is_refused_before_step_1(
    dataset, synthetic_dataset, tmp_path
):
    """Every rank opens its sources itself: a dataset replaced at its location between rank 0's open
    and rank 1's gave the two ranks two datasets, and the run trained both, exit 0 (review R24c 1,
    through a bucket). Rank 0 replaces it at a known point here (GRISTMILL_FAULT_REPLACE_DATASET)."""
    data, other = tmp_path / "data", tmp_path / "other"
    shutil.copytree(dataset, data)
    shutil.copytree(synthetic_dataset(n_docs=300, seed=5), other)
    run = tmp_path / "run"
    sets = overrides(data, run, "parallel.shard=2", "run.max_steps=2", "run.log_every=1")
    cmd = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "train",
        "--nproc-per-node",
        "2",
        "--config",
        TINY,
        "--set",
        *sets,
    ]
    env = {**ENV, "GRISTMILL_FAULT_REPLACE_DATASET": f"{data}={other}"}
    proc = forked.run(cmd, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = one_error_line(proc.stderr)
    fingerprint = {
        d: json.loads((d / "dataset.json").read_text())["fingerprint"][:12]
        for d in (data, tmp_path / "data.replaced")
    }
    was = fingerprint[tmp_path / "data.replaced"]
    assert line == (
        f"error: source 'data' ({data}): rank 1 opened dataset {fingerprint[data]}…, rank 0 {was}…: the "
        "dataset at that location was replaced while the run started; start the run again once it holds one "
        "dataset (nothing was trained)"
    ), line
    assert metrics(run) == []


def _flatten(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def say_step(batches: Path, record: int, step: int) -> None:
    """Damage batch record `record` (0-based) of `batches` so that it says step `step`."""
    damage(batches, len(HEADER) + record * RECORD.size, step.to_bytes(8, "little"))


def test_damaged_files_are_refused_and_resume_falls_back_to_one_that_verifies(dataset, tmp_path, capsys):
    reference = tmp_path / "reference"  # its losses only: no checkpoint (CI time)
    sets = overrides(dataset, reference, "schedule.steps=16", "checkpoint.interval=0")
    train(load_train_config(TINY, sets))
    run = tmp_path / "run"
    first = [
        "schedule.steps=16",
        "run.max_steps=12",
        "checkpoint.keep_last=2",
        "checkpoint.export_interval=8",
    ]
    train(load_train_config(TINY, overrides(dataset, run, *first)))
    capsys.readouterr()

    damage(checkpoint_dir(run, 12) / "__0_0.distcp", 1000, os.urandom(4096))
    # export without --step names the step it takes and each newer one it passed over, and why
    assert gristmill(["export", str(run)]) == 0
    out = capsys.readouterr().out
    assert "skipped step 12: step-000012 is damaged" in out and "__0_0.distcp: crc32" in out
    assert "exporting step 8, the newest complete checkpoint that verifies" in out
    assert gristmill(["export", str(run), "--step", "12"]) == 2
    assert "__0_0.distcp" in one_error_line(capsys.readouterr().err)
    damage(export_dir(run, 8) / "model.safetensors", 4096, b"\xff" * 4096)
    assert gristmill(["export", str(run), "--step", "8"]) == 2
    assert "model.safetensors: sha256" in one_error_line(capsys.readouterr().err)
    assert gristmill(["verify", str(run)]) == 1
    table = capsys.readouterr().out
    assert table.count("DAMAGED") == 2 and "2 damaged" in table
    # a truncated checksum record: "re-export the step" was refused by the same record (R14c F9)
    sums = export_dir(run, 8) / "gristmill_checksums.json"
    sums.write_text(sums.read_text()[:20])
    assert gristmill(["export", str(run), "--step", "8"]) == 2
    fix = f"move {export_dir(run, 8)} aside and export it again from its checkpoint (gristmill export {run}"
    fix += " --step 8"
    assert fix + ")" in one_error_line(capsys.readouterr().err)
    shutil.rmtree(export_dir(run, 8))
    assert gristmill(["export", str(run), "--step", "8"]) == 0
    # both records removed (another step's export copied in without them): taken for an export from
    # before checksums, exported, verified and scored as the step's (trial RV61d F1); the run's record
    # says every export of its steps is written with them
    for name in ("gristmill_checksums.json", "gristmill_export.json"):
        (export_dir(run, 8) / name).unlink()
    assert gristmill(["export", str(run), "--step", "8"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "has neither gristmill_checksums.json nor gristmill_export.json, which every export" in line, line
    assert fix + ")" in line, line
    assert gristmill(["verify", str(run)]) == 1 and "DAMAGED" in capsys.readouterr().out
    shutil.rmtree(export_dir(run, 8))
    assert gristmill(["export", str(run), "--step", "8"]) == 0

    # a torn last metrics line (a kill mid-write) and a damaged newest checkpoint: resume takes
    # step 8, the newest that verifies, and continues exactly as the uninterrupted run
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "loss": 4.')
    # step 3's record with a damaged step field: dropped with the steps the resume redoes, without a
    # word (review R21b F4); now said, and the file as it was kept
    batches = run / "batches.bin"
    say_step(batches, 2, 2**32 + 4)
    before = batches.read_bytes()
    resume = overrides(
        dataset, run, "schedule.steps=16", "checkpoint.keep_last=2", 'checkpoint.resume="auto"'
    )
    train(load_train_config(TINY, resume))
    out = capsys.readouterr().out
    assert "resuming from" in out and "step-000008, the newest complete checkpoint that verifies" in out
    assert "skipped step-000012: step-000012 is damaged" in out and "cut off the torn last line" in out
    assert (
        f"note: {batches}: 1 record(s) that cannot be trusted dropped (out of the order the steps trained "
        "in, or one of two of a step: the first, record 3, says step 4294967300); no record of step(s) 3, "
        "up to 8, the checkpoint's (`gristmill verify` names them); the file as it was: batches.bin.damaged"
    ) in out
    assert (run / "batches.bin.damaged").read_bytes() == before
    assert [s for s, _, _ in recorded_batches(run)] == [1, 2, *range(4, 17)]
    assert losses(run) == losses(reference)
    assert (run / "checkpoints" / "abandoned-step-000012").is_dir()  # set aside, never deleted
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-2:] == ["step-000012", "step-000016"]
    # the checkpoint's own step's record damaged (it read as a step the resume redoes: dropped without a
    # word, R22a A4), and a later step's saying an earlier one (intact records were blamed and it was
    # kept: A3); the first evidence is not overwritten (A5)
    position = {s: i for i, (s, _, _) in enumerate(recorded_batches(run))}
    say_step(batches, position[12], 2**32 + 4)
    say_step(batches, position[14], 2)
    again = batches.read_bytes()
    damage(checkpoint_dir(run, 16) / "__0_0.distcp", 1000, os.urandom(4096))
    train(load_train_config(TINY, resume))
    out = capsys.readouterr().out
    assert (
        f"note: {batches}: 1 record(s) that cannot be trusted dropped (out of the order the steps trained "
        "in, or one of two of a step: the first, record 13, says step 2); no record of step(s) 3, 12, up "
        "to 12, the checkpoint's (`gristmill verify` names them); the file as it was: batches.bin.damaged.2"
    ) in out, out
    assert (run / "batches.bin.damaged").read_bytes() == before
    assert (run / "batches.bin.damaged.2").read_bytes() == again
    assert [s for s, _, _ in recorded_batches(run)] == [1, 2, *range(4, 12), *range(13, 17)]
    assert losses(run) == losses(reference)

    # a refused resume (another seed) leaves the run's config.toml as it was
    config_before = (run / CONFIG_TOML).read_bytes()
    assert main(["--config", TINY, "--set", *overrides(dataset, run, "schedule.steps=16", "data.seed=99"),
                 'checkpoint.resume="auto"']) == 2  # fmt: skip
    assert "seed" in one_error_line(capsys.readouterr().err)
    assert (run / CONFIG_TOML).read_bytes() == config_before


def test_a_resume_tells_the_batch_records_it_cannot_trust_and_keeps_them_aside(dataset, tmp_path, capsys):
    """Two records of one step that either could be the intact one (a damaged record took its
    neighbour's step): the later was kept, with its step's digest under the earlier step's number
    (review R22d M2); the checkpoint's own record damaged to a later step: only "no record" was said,
    and the file's damaged bytes were lost (M3); a run started from another run's checkpoint was told
    on every resume that the steps before it have no record (M1)."""
    run = tmp_path / "run"
    first = ["schedule.steps=16", "run.max_steps=8", "checkpoint.keep_last=0"]
    train(load_train_config(TINY, overrides(dataset, run, *first)))
    batches = run / "batches.bin"
    say_step(batches, 7, 7)  # step 8's says 7
    before = batches.read_bytes()
    capsys.readouterr()
    train(
        load_train_config(
            TINY, overrides(dataset, run, "schedule.steps=16", "run.max_steps=12", 'checkpoint.resume="auto"')
        )
    )
    out = capsys.readouterr().out
    assert (
        f"note: {batches}: 2 record(s) that cannot be trusted dropped (out of the order the steps trained "
        "in, or one of two of a step: the first, record 7, says step 7); no record of step(s) 7, 8, up to "
        "8, the checkpoint's (`gristmill verify` names them); the file as it was: batches.bin.damaged"
    ) in out, out
    assert (run / "batches.bin.damaged").read_bytes() == before
    assert [s for s, _, _ in recorded_batches(run)] == [*range(1, 7), *range(9, 13)]
    position = {s: i for i, (s, _, _) in enumerate(recorded_batches(run))}
    say_step(batches, position[12], 2**32 + 4)
    again = batches.read_bytes()
    train(load_train_config(TINY, overrides(dataset, run, "schedule.steps=16", 'checkpoint.resume="auto"')))
    out = capsys.readouterr().out
    assert f"note: {batches}: no record of step(s) 7, 8, 12, up to 12, the checkpoint's" in out, out
    assert "the file as it was: batches.bin.damaged.2" in out
    assert (run / "batches.bin.damaged.2").read_bytes() == again
    # another directory, started from this run's checkpoint: its records begin after it
    other = tmp_path / "other"
    start = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 12)))}"
    train(load_train_config(TINY, overrides(dataset, other, "schedule.steps=16", "run.max_steps=14", start)))
    capsys.readouterr()
    (other / "metrics.jsonl").unlink()  # counted from step 1 then, its steps 1-12 said missing (R22g 2)
    train(load_train_config(TINY, overrides(dataset, other, "schedule.steps=16", 'checkpoint.resume="auto"')))
    assert "no record of step" not in capsys.readouterr().out
    assert [s for s, _, _ in recorded_batches(other)] == [13, 14, 15, 16]
    # the record deleted whole, or its first record damaged: nothing was said (review R22e 3)
    gone = tmp_path / "gone"
    train(load_train_config(TINY, overrides(dataset, gone, *first)))
    (gone / "batches.bin").unlink()
    capsys.readouterr()
    train(
        load_train_config(
            TINY,
            overrides(dataset, gone, "schedule.steps=16", "run.max_steps=10", 'checkpoint.resume="auto"'),
        )
    )
    out = capsys.readouterr().out
    assert f"note: {gone / 'batches.bin'}: no record of step(s) 1, 2, 3, 4, 5 (+3 more), up to 8" in out, out
    say_step(gone / "batches.bin", 0, 12)  # its first record, step 9's
    train(
        load_train_config(
            TINY,
            overrides(dataset, gone, "schedule.steps=16", "run.max_steps=12", 'checkpoint.resume="auto"'),
        )
    )
    out = capsys.readouterr().out
    assert (
        f"note: {gone / 'batches.bin'}: 1 record(s) that cannot be trusted dropped (out of the order the "
        "steps trained in, or one of two of a step: the first, record 1, says step 12); no record of "
        "step(s) 1, 2, 3, 4, 5 (+4 more), up to 10"
    ) in out, out
    # --resume given a run directory or a dataset: "not a complete checkpoint: no .metadata (the save
    # did not finish)" (review R22f U1)
    export = export_checkpoint(run, 12, out=tmp_path / "export")
    for given, what in (
        (run, f"{run} is a run directory"),
        (dataset, f"{dataset} holds dataset.json: a dataset"),
        (export, f"{export} is an export (weights to start a run from: model.init_from)"),
    ):
        resume = f"checkpoint.resume={json.dumps(str(given))}"
        assert main(["--config", TINY, "--set", *overrides(dataset, tmp_path / "new", resume)]) == 2
        assert one_error_line(capsys.readouterr().err) == (
            f"error: --resume {given}: {what}, not a checkpoint (RUN/checkpoints/step-N); give one, or "
            "--resume auto with run.output_dir set to the run"
        )
    killed = run / "checkpoints" / "step-000099"  # a save killed at once: said so (review R22i M5)
    killed.mkdir()
    resume = f"checkpoint.resume={json.dumps(str(killed))}"
    assert main(["--config", TINY, "--set", *overrides(dataset, tmp_path / "new", resume)]) == 2
    assert f"--resume {killed} is not a complete checkpoint: " in one_error_line(capsys.readouterr().err)
    killed.rmdir()
    copy = tmp_path / "a-copy"  # a checkpoint copied under another name is one (review R22h M1)
    shutil.copytree(checkpoint_dir(run, 12), copy)
    resume = f"checkpoint.resume={json.dumps(str(copy))}"
    train(load_train_config(TINY, overrides(dataset, tmp_path / "from-copy", "schedule.steps=16", resume)))


def test_a_plot_that_cannot_be_written_is_a_warning_not_the_runs_end(dataset, tmp_path, capsys):
    """plan.png a directory: a traceback before step 1; loss.png one: every step trained, then a
    traceback and exit 1, at every invocation (review R22f T1). Each is one warning now."""
    run = tmp_path / "run"
    for name in ("plan.png", "loss.png"):
        (run / name).mkdir(parents=True)
    summary = train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=4", "metrics.plot=true")))
    assert summary["steps"] == 4
    out = capsys.readouterr().out
    for name in ("plan.png", "loss.png"):
        assert f"warning: {run / name} not drawn (Is a directory)" in out, out


def test_garbage_metadata_and_nonfinite_weights_are_one_line(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    summary = train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=4")))
    capsys.readouterr()
    # a checkpoint whose files verify but whose weights hold a NaN (as a run without the guard saved)
    states = summary["states"]
    name, param = next(iter(states["model"].model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[:3] = float("nan")
    bad = checkpoint_dir(run, 6)
    dcp.save(states, checkpoint_id=str(bad), no_dist=True)
    files = file_records(bad, [p.name for p in bad.iterdir()], "crc32")
    write_complete_record(bad, {"step": 6, "files": files})
    assert gristmill(["export", str(run), "--step", "6"]) == 2
    assert f"non-finite weights ({name}: 3 NaN" in one_error_line(capsys.readouterr().err)
    resume = f"checkpoint.resume={json.dumps(str(bad))}"
    assert main(["--config", TINY, "--set", *overrides(dataset, tmp_path / "other", resume)]) == 2
    assert f"holds non-finite values ({name}: 3 NaN" in one_error_line(capsys.readouterr().err)
    # garbage .metadata: with checksums a damaged file; without (an older gristmill) unreadable
    (checkpoint_dir(run, 4) / DCP_METADATA).write_bytes(b"garbage" * 50)
    assert gristmill(["export", str(run), "--step", "4"]) == 2
    assert ".metadata: 350 bytes" in one_error_line(capsys.readouterr().err)
    record = json.loads((checkpoint_dir(run, 4) / COMPLETE_FILE).read_text())
    del record["files"], record["record_sha256"]  # (an older gristmill sealed no record)
    (checkpoint_dir(run, 4) / COMPLETE_FILE).write_text(json.dumps(record))
    assert gristmill(["export", str(run), "--step", "4"]) == 2
    assert ".metadata is unreadable (UnpicklingError" in one_error_line(capsys.readouterr().err)


def test_a_damaged_complete_record_is_a_damaged_checkpoint(dataset, tmp_path, capsys):
    """COMPLETE holds the files' checksums and the model an export writes into config.json; one
    flipped bit in it (rope_theta 10000.0 → 50000.0) exported a wrong model, exit 0, and verify
    said ok (review R14c F2). The record now holds its own sha256: such a checkpoint is damaged,
    and export and resume fall back to the one before it."""
    run = tmp_path / "run"
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=8")))
    record = checkpoint_dir(run, 8) / COMPLETE_FILE
    text = record.read_text()
    assert '"rope_theta": 10000.0' in text
    record.write_text(text.replace('"rope_theta": 10000.0', '"rope_theta": 50000.0'))
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    assert "does not hash to the record_sha256 it holds" in capsys.readouterr().out
    assert gristmill(["export", str(run)]) == 0
    out = capsys.readouterr().out
    assert "step-000008" in out and "rope_theta" not in out, out
    assert json.loads((export_dir(run, 4) / "config.json").read_text())["rope_theta"] == 10000.0
    assert not export_dir(run, 8).exists()


def test_a_checkpoint_under_another_steps_name_is_damaged(dataset, tmp_path, capsys):
    """Review R23c 1: step-000004 renamed step-000006 (a copy over, a slip of mv) verified ok, and its
    weights were exported as step 6's (gristmill_export.json "step": 6), exit 0. The record's step
    must be the folder's: verify calls it damaged, export refuses it, resume passes over it."""
    run = tmp_path / "run"
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=4", "checkpoint.interval=2")))
    checkpoint_dir(run, 4).rename(checkpoint_dir(run, 6))
    shutil.rmtree(run / "exports", ignore_errors=True)
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "step-000006 holds step 4 (its COMPLETE record says so), not step 6" in out, out
    assert "rename it back to step-000004" in out, out
    with pytest.raises(ExportError, match="holds step 4"):
        export_checkpoint(run, 6)
    assert not export_dir(run, 6).exists()
    assert export_checkpoint(run) == export_dir(run, 2)  # the newest that verifies
    checkpoint_dir(run, 6).rename(checkpoint_dir(run, 4))  # as advised
    (run / "base").mkdir()  # a stray folder in a run from scratch has no base row (review RV60d 2)
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 0
    assert "base" not in capsys.readouterr().out.split()
    # a copy while step-000004 is there: `mv` as advised nested it inside step-000004 (trial RV75e)
    shutil.copytree(checkpoint_dir(run, 4), checkpoint_dir(run, 6))
    assert gristmill(["verify", str(run)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "step-000004 is there already, so move this one out of checkpoints/ (which of the two" in out, out
    assert "rename it back" not in out, out
    shutil.rmtree(checkpoint_dir(run, 6))
    # another step's COMPLETE alone copied in: its files are not the record's, damage; renaming the
    # step's own files away, or deleting them, was the advice (trial RV60c 10)
    kept = (checkpoint_dir(run, 4) / COMPLETE_FILE).read_bytes()
    shutil.copy(checkpoint_dir(run, 2) / COMPLETE_FILE, checkpoint_dir(run, 4) / COMPLETE_FILE)
    assert gristmill(["verify", str(run)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "step-000004 is damaged" in out and "rename it back" not in out, out
    (checkpoint_dir(run, 4) / COMPLETE_FILE).write_bytes(kept)
    # another step's checkpoint copied over the step's, whose export is the run's (the record's): the
    # export was DAMAGED, "exported from another checkpoint of step 4 than the run's", and the advised
    # export refused, the checkpoint holding step 2 (trial RV75a 2)
    export_checkpoint(run, 4)
    checkpoint_dir(run, 4).rename(tmp_path / "step-4")
    shutil.copytree(checkpoint_dir(run, 2), checkpoint_dir(run, 4))
    capsys.readouterr()
    assert gristmill(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "step-000004 holds step 2" in out and "exported from another checkpoint" not in out, out
    assert re.search(r"^\s*export\s+4\s+ok\b", out, re.M), out


def test_a_stop_or_an_end_whose_checkpoint_was_skipped_says_so(dataset, tmp_path, capsys, monkeypatch):
    """Review R23c 3: with checkpoint.on_low_disk = "skip" and the disk low, a SIGTERM's line said
    "checkpoint saved; resume with --resume auto" though its save was skipped (17 steps lost, exit
    0), and a run whose last save was skipped ended without a word. Both name the last complete
    checkpoint now."""
    low = ['checkpoint.on_low_disk="skip"', "checkpoint.min_free_factor=1e12"]  # every save: too little room
    run = tmp_path / "run"
    proc, _ = _long_run_at_step_3(dataset, run, *low)
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    line = next(x for x in out.splitlines() if x.startswith("stopping after step"))
    assert "its checkpoint was SKIPPED" in line, line
    assert "no checkpoint is complete: --resume auto starts over from step 0" in line, line  # not "from none"
    assert "checkpoint saved" not in line and not complete_steps(run), line
    capsys.readouterr()
    train(load_train_config(TINY, overrides(dataset, tmp_path / "end", "run.max_steps=4", *low)))
    out = capsys.readouterr().out
    assert "WARNING: the run ends at step 4 with its last checkpoint SKIPPED (low disk)" in out, out[-2000:]
    assert "no checkpoint is complete" in out, out[-2000:]
    # after a resume the guard measures the resumed checkpoint (it said "estimated from the parameter
    # count"), and its advice of a lower keep_last says when that frees space: it freed nothing before
    # a save completed (review R23c 4); a resume runs its checkpoint's retention before its first save
    again = overrides(dataset, tmp_path / "again", "run.max_steps=4", "checkpoint.interval=2")
    train(load_train_config(TINY, again))
    capsys.readouterr()
    train(load_train_config(TINY, [*again, "run.max_steps=6", "checkpoint.resume=auto", *low]))
    warning = next(x for x in capsys.readouterr().out.splitlines() if "SKIPPED:" in x)
    assert "(the size of step-000004)" in warning, warning
    assert "keep_last deletes old checkpoints after a save completes and when a run resumes" in warning
    assert complete_steps(tmp_path / "again") == [2, 4]
    lower = [*again, "run.max_steps=6", "checkpoint.resume=auto", "checkpoint.keep_last=1", *low]
    train(load_train_config(TINY, lower))  # step 6's save skipped again: only the resume deletes
    assert "retention: deleted checkpoint(s) 2 (keeping [4])" in capsys.readouterr().out
    assert complete_steps(tmp_path / "again") == [4]
    # resumed from another run directory's checkpoint, with none of its own: that one is named, with
    # the --resume that finds it (--resume auto started over from step 0: review R23f 1)
    four = checkpoint_dir(tmp_path / "again", 4)
    moved = overrides(
        dataset, tmp_path / "moved", "run.max_steps=6", f"checkpoint.resume={json.dumps(str(four))}"
    )
    train(load_train_config(TINY, [*moved, *low]))
    out = capsys.readouterr().out
    assert f"the last complete checkpoint is the one this run resumed from, {four}: --resume {four}" in out, (
        out
    )
    warning = next(x for x in out.splitlines() if "SKIPPED:" in x)  # the save's own line (R23h M3)
    assert warning.endswith(f"then resume with --resume {four}"), warning
    # a rewind whose save was skipped, then a stop: not "checkpoint saved" either (review R23e S2)
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "6")
    monkeypatch.setenv("GRISTMILL_FAULT_SIGTERM", "6")
    rewind = ["run.on_nonfinite='rewind'", "run.rewind.margin_steps=2"]
    train(load_train_config(TINY, [*again, "run.max_steps=8", "checkpoint.resume=auto", *rewind, *low]))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("stopping after step"))
    assert "its checkpoint was SKIPPED" in line and "checkpoint saved" not in line, out[-3000:]
    assert f"the last complete checkpoint is {checkpoint_dir(tmp_path / 'again', 4)}" in line, line


def _long_run_at_step_3(dataset: Path, run: Path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    """A 150-step `gristmill train` of `run` started in a process, once its step 3 is logged; and its
    command."""
    sets = overrides(dataset, run, "schedule.steps=150", "run.log_every=1", "checkpoint.interval=75", *extra)
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    proc = forked.popen(cmd, cwd=ROOT, env=ENV)
    try:
        deadline = time.time() + 120
        while not metrics(run) or metrics(run)[-1]["step"] < 3:
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        raise
    return proc, cmd


def test_one_writer_per_run_directory(dataset, tmp_path):
    run = tmp_path / "run"
    first, cmd = _long_run_at_step_3(dataset, run)
    sets = cmd[cmd.index("--set") + 1 :]
    try:
        # a second trainer, and a launcher of two (refused before torchrun starts), side by side
        two = [*cmd[:4], "--nproc-per-node", "2", *cmd[4:], "parallel.shard=2"]
        others = [forked.popen(c, cwd=ROOT, env=ENV) for c in (cmd, two)]
        (out2, err2), (out3, err3) = (p.communicate(timeout=120) for p in others)
        assert [p.returncode for p in others] == [2, 2], err2 + err3
        line = one_error_line(err2)
        assert f"{run} is in use by another gristmill train (pid {first.pid} on " in line
        assert "is in use by another gristmill train" in one_error_line(err3)
        assert "torch.distributed.run" not in out3
        assert first.poll() is None, "the second trainer stopped the first"
        first.send_signal(signal.SIGTERM)  # the rest of its 150 steps would add nothing (CI time)
        out, err = first.communicate(timeout=240)
        assert first.returncode == 0, out[-2000:] + err[-2000:]
    finally:
        first.kill()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    stopped = len(lines)
    assert f"stopping after step {stopped} on SIGTERM" in out
    assert [json.loads(line)["step"] for line in lines] == list(range(1, stopped + 1))  # whole, in order

    # a lock left by a dead holder is taken over with a note
    (run / LOCK_FILE).write_text(json.dumps({"pid": 4_000_000, "host": "elsewhere", "started": "then"}))
    out = io.StringIO()
    resume = [*sets, 'checkpoint.resume="auto"', f"run.max_steps={stopped + 1}"]
    train(load_train_config(TINY, resume), out=out)
    assert "took over the lock of pid 4000000 on elsewhere, started then" in out.getvalue()
    # on another host it may be running: flock on this one cannot tell (review R26b m1)
    assert "which this host cannot tell is stopped (flock does not reach elsewhere)" in out.getvalue()
    assert "no longer running" not in out.getvalue()


def test_a_run_directory_replaced_under_a_run_stops_it_before_it_writes_into_the_next_runs(dataset, tmp_path):
    """`rm -rf RUN; mkdir RUN` under trainer A lets trainer B lock a new RUN/.gristmill.lock (A's flock
    is on the deleted file): A's next save stops it in one line, before it writes or deletes anything
    there; B trains on, its checkpoint and rows its own (review R26b L1: A wrote B's directory)."""
    run = tmp_path / "run"
    # A logs step 1 only (then rows every 1000 steps): its first write after the swap is its save at 50
    sets = overrides(dataset, run, "schedule.steps=150", "run.log_every=1000", "checkpoint.interval=50")
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    first = forked.popen([*cmd, "metrics.trackers=[]"], cwd=ROOT, env=ENV)  # no tracker thread's files
    second = None
    try:
        deadline = time.time() + 120
        # A stopped once step 1's records are all written (its row, then consumption.parquet): a write
        # already past its check when the directory goes lands or fails there (review RV26c M1)
        while not (metrics(run) and (run / "consumption.parquet").is_file()):
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.02)
        time.sleep(0.5)
        first.send_signal(signal.SIGSTOP)
        shutil.rmtree(run)
        run.mkdir()
        second = forked.popen(
            [*cmd, "run.log_every=1", "checkpoint.interval=0", "optim.lr=1e-3"], cwd=ROOT, env=ENV
        )
        while not metrics(run):  # B holds the new lock and trains
            assert second.poll() is None and time.time() < deadline, second.communicate()
            time.sleep(0.02)
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=240)
        assert first.returncode == 2, out[-2000:] + err[-2000:]
        line = one_error_line(err)
        assert f"{run} was removed or replaced under this run (its {LOCK_FILE} is another file, and " in line
        assert f"is now held by pid {second.pid} on " in line and "writes nothing more there" in line, line
        assert not (run / "checkpoints").exists()  # A's step 50: not written, nor B's anything deleted
        assert second.poll() is None, "A stopped B"
        second.send_signal(signal.SIGTERM)
        out, err = second.communicate(timeout=240)
        assert second.returncode == 0, out[-2000:] + err[-2000:]
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
    (saved,) = complete_steps(run)  # B's stop's, with B's config
    record = json.loads((checkpoint_dir(run, saved) / COMPLETE_FILE).read_text())
    assert record["config"]["optim"]["lr"] == 1e-3
    assert [row["step"] for row in metrics(run)] == list(range(1, saved + 1))


def test_the_run_lock_tells_a_removed_or_replaced_run_directory(tmp_path):
    from training.contract.errors import GristmillError
    from training.run.lock import RunLock, check_owned, run_dir_lost

    run = tmp_path / "run"
    with RunLock(run):
        assert run_dir_lost(run) is None and run_dir_lost(tmp_path / "other") is None
        shutil.rmtree(run)
        assert run_dir_lost(run) == (  # moved, it keeps its checkpoints: not "train again" alone (RV71b 2)
            f"{run} was removed or moved under this run (its {LOCK_FILE} is gone): this run stops and writes "
            "nothing more there; if you moved it, resume it where it is now (--resume auto --set "
            'run.output_dir="NEW"), else train again into a directory no other run uses'
        )
        run.mkdir()
        with RunLock(run) as second:  # the next run's lock, a new file (here in the same process)
            assert run_dir_lost(run).startswith(f"{run} was removed or replaced under this run (its ")
            second.release()
            with pytest.raises(GristmillError, match=r"is another file\): this run stops"):
                check_owned(run)  # released: an empty file, no holder to name


def test_read_only_run_directory_is_one_line(dataset, tmp_path):
    if not unshare_works():
        pytest.skip("no mount namespaces here (unshare -rm) to make a read-only bind mount")
    run = tmp_path / "run"
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=4")))
    shutil.rmtree(run / "exports", ignore_errors=True)
    sets = overrides(dataset, run, "run.max_steps=8")
    commands = {
        "train": ["train", "--config", TINY, "--resume", "auto", "--set", *sets],
        "export": ["export", str(run)],
    }
    read_only = f"mount --bind {run} {run} && mount -o remount,bind,ro {run}"
    for args in commands.values():  # each in a mount namespace of its own (tests/helpers/mounts.py)
        in_namespace = [sys.executable, "-m", "tests.helpers.mounts", read_only, "", "pipelines.cli", *args]
        proc = forked.run(in_namespace, cwd=ROOT, env=ENV, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "Read-only file system" in one_error_line(proc.stderr)


def test_a_path_of_the_wrong_kind_is_named_for_what_it_is(dataset, tmp_path, capsys):
    """A dataset directory given to eval or export read its build recipe as a run's config ("unknown
    key 'output'", "step 3 is not trained yet: the run has reached step 0"), a directory given to
    --config and a file given to data inspect "did not exist" (review R21b F8)."""
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("")
    half = tmp_path / "half"  # a data build that stopped before its shards: config.toml and build.json
    half.mkdir()
    (half / "config.toml").write_text('output = "x"\n')
    (half / "build.json").write_text("{}")
    for argv, said in [
        (
            ["eval", str(half)],
            f"{half} holds build.json but no dataset.json: a data build that did not finish",
        ),
        (
            ["verify", str(half)],
            f"{half} holds build.json but no dataset.json: a data build that did not finish",
        ),
        (["data", "inspect", str(half)], f"{half} holds build.json but no dataset.json: a data build that"),
        (  # a build still running said "is not a gristmill dataset (build one …)" (review R26b m2)
            [
                "train",
                "--config",
                TINY,
                "--set",
                f'data.dataset="{half}"',
                f'run.output_dir="{tmp_path / "r"}"',
            ],
            f"{half} holds build.json but no dataset.json: a data build that did not finish, or is still "
            "running (wait for it to end, or rerun the same `gristmill data build` command); read it once it "
            "is built",
        ),
        (
            ["eval", str(dataset)],
            f"{dataset} holds dataset.json: a dataset: {dataset} is not a gristmill training run",
        ),
        (
            ["export", str(dataset), "--step", "3"],
            f"{dataset} holds dataset.json: a dataset: {dataset} is not a",
        ),
        (["train", "--config", str(tmp_path)], f"config file {tmp_path} is a directory; pass a TOML file"),
        (["data", "inspect", str(recipe)], f"{recipe} is a file: pass a training run directory"),
        (["verify", str(recipe)], f"{recipe} is a file, not a training run"),
    ]:
        capsys.readouterr()
        assert gristmill(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {said}"), (argv, line)


def test_a_metrics_row_whose_loss_is_not_a_number_is_an_unreadable_line(tmp_path):
    """A row with "loss": null (a hand edit) was read as a row: a resume trained on and failed at its
    summary line (TypeError formatting None, exit 1: review R21b F10). It is dropped and named."""
    from training.contract.run_layout import read_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "loss": None},
        {"step": 2, "loss": "x"},
        {"step": 3, "loss": True},
        {"step": 4, "loss": 2.5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "val_loss": 1.0}\n')
    got, note = read_metrics(path)
    assert [r["step"] for r in got] == [4, 5]
    # each by the row it follows (trial RV65c F4: which step's row was lost)
    assert note == f"note: dropped 3 unreadable line(s) of {path}: " + ", ".join(
        f"{i} (before any row)" for i in (1, 2, 3)
    )
    path.write_text(path.read_text().replace('{"step": 1, "loss": null}', '{"step": 1, "loss": 3.0}'))
    assert (
        read_metrics(path)[1]
        == f"note: dropped 2 unreadable line(s) of {path}: 2 (after step 1's row), 3 (after step 1's row)"
    )


def test_lock_file_of_non_utf8_bytes_is_taken_over_with_a_note(tmp_path):
    from training.run.lock import RunLock, RunLockedError, check_unlocked

    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_bytes(b"\xff\xfe\x00garbage\x80")
    check_unlocked(run)  # nobody holds it: no error, no traceback
    with RunLock(run) as lock:
        assert (
            lock.note
            == "note: took over the lock of a process that left no details, which is no longer running"
        )
        # a second taker sees the live holder's details, whatever bytes the file held before
        with pytest.raises(RunLockedError, match=r"is in use by another gristmill train \(pid "):
            check_unlocked(run)


@pytest.mark.parametrize("reader", ["head -3", "a terminal closed"])
def test_a_closed_stdout_does_not_cost_the_run(dataset, tmp_path, reader):
    """`gristmill train … | head -3`: the reader goes away after three lines; printing stops, the
    run trains on to its last step, writing metrics.jsonl and its checkpoints, and exits 0. The same
    in a terminal that closes: SIGHUP, then EIO on every write (each ended the run, nothing saved)."""
    run = tmp_path / "run"
    sets = overrides(dataset, run, "run.log_every=1")
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    # forked (tests/helpers/forked.py), its stdout the pipe's write end or the terminal's
    reading, writing = os.pipe() if reader == "head -3" else pty.openpty()
    proc = forked.popen(cmd, cwd=ROOT, env=ENV, stdout=writing)
    os.close(writing)
    try:
        if reader == "head -3":
            with open(reading, "rb") as pipe:
                for _ in range(3):
                    pipe.readline()
            # as head does after its three lines: the pipe's read end closed
        else:
            seen = b""
            while seen.count(b"step ") < 3:
                seen += os.read(reading, 4096)
            os.close(reading)  # the terminal goes: writes to it fail with EIO
            proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert [r["step"] for r in metrics(run)] == list(range(1, 13))
    assert (checkpoint_dir(run, 12) / COMPLETE_FILE).is_file()


def test_a_child_of_a_process_started_without_stdout_gets_the_null_device():
    """The /dev/null put on a closed fd 1 was opened as fd 1 itself, not inheritable: a child (torchrun's
    workers, a spawn pool's) started with fd 1 closed, or the first pipe it made took it (review RV26g
    F2). The child's fd 1 is the null device."""
    child = "import os, sys; sys.stderr.write(os.readlink('/proc/self/fd/1'))"
    parent = (
        "from training.contract.errors import hold_closed_streams; import subprocess, sys; "
        f"hold_closed_streams(); subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", parent], cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True, timeout=60,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == os.devnull, proc.stderr


@pytest.mark.parametrize("entry", ["gristmill train", "torchrun -m training.train"])
def test_a_stdout_closed_from_the_start_only_stops_the_printing(dataset, tmp_path, entry):
    """`gristmill train … >&-` (a daemon, a scheduler's wrapper): Python's sys.stdout is None, and the
    first print raised AttributeError before step 1 with the run directory half made, in the CLI's
    process and in a torchrun worker (review R26a F5). Each entry point puts /dev/null there: the run
    trains to its last step, and no file the run opened took descriptor 1 (4 steps: a line printed at
    each, a checkpoint saved at the last)."""
    run = tmp_path / "run"
    sets = overrides(dataset, run, "run.log_every=1", "schedule.steps=4")
    if entry == "gristmill train":
        cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    else:
        cmd = torchrun_cmd(sets, nproc=1)
    proc = subprocess.run(
        cmd, cwd=ROOT, env=ENV, stderr=subprocess.PIPE, text=True, timeout=240, preexec_fn=lambda: os.close(1)
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 5)) and all(set(r) > {"loss"} for r in rows)
    assert (checkpoint_dir(run, 4) / COMPLETE_FILE).is_file()


def _point_at_dev_full(path: Path) -> None:
    """This process's descriptors open on `path` written into /dev/full from now on: its disk full."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, int(fd))
                os.close(full)


@pytest.mark.parametrize("record", ["consumption.parquet", "metrics.jsonl", "batches.bin"])
def test_a_run_record_that_cannot_be_written_saves_the_last_step_first(dataset, whole, tmp_path, record):
    """A record of the run that cannot be written mid-run (a directory in consumption.parquet's place;
    metrics.jsonl's disk full) ended the run with a traceback for all but a full or read-only disk,
    and either way the steps since the last checkpoint were lost (review R26a F4). Now: the step
    trained last is saved, one line names the file and the errno's words, and a resume once it is
    fixed ends as the uninterrupted run, every row written once (the row that failed too). Unless the
    step's batch record is what failed: a checkpoint past a step batches.bin does not record lost its
    row and record for good (review RV26g F1), so nothing is saved and the resume redoes the steps."""
    run = tmp_path / "run"

    class Printer(io.StringIO):  # the console: at step 5's line the record breaks
        def write(self, text: str) -> int:
            if text.startswith("step      5/") and record == "consumption.parquet":
                (run / record).unlink()
                (run / record).mkdir()
            elif text.startswith("step      5/"):
                _point_at_dev_full(run / record)
            return super().write(text)

    out = Printer()
    with pytest.raises(RecordUnwritable) as error:
        train(load_train_config(TINY, overrides(dataset, run, "run.log_every=1")), out=out)
    # consumption.parquet fails at step 5's row (after its line); metrics.jsonl and batches.bin at 6's
    failed = 5 if record == "consumption.parquet" else 6
    why = "Is a directory" if record == "consumption.parquet" else "No space left on device"
    assert str(error.value).startswith(f"cannot write {run / record}: {why}; "), str(error.value)
    if record == "batches.bin":
        assert (
            f"a record of the run cannot be written: step {failed} not saved: the batch records of steps "
            f"{failed}–{failed} could not be written (batches.bin)" in out.getvalue()
        ), out.getvalue()
        assert complete_steps(run) == [4]
    else:
        saving = f"a record of the run cannot be written: saving step {failed} before stopping"
        assert saving in out.getvalue()
        assert complete_steps(run) == [4, failed]
    if record == "consumption.parquet":
        (run / record).rmdir()
    train(load_train_config(TINY, overrides(dataset, run, "run.log_every=1", 'checkpoint.resume="auto"')))
    assert losses(run) == losses(whole)
    assert (run / "batches.bin").read_bytes() == (whole / "batches.bin").read_bytes()


def test_a_dataset_removed_under_the_run_saves_the_last_step_first(dataset, synthetic_dataset, tmp_path):
    """A source's dataset removed (to be rebuilt in place) while the run trains: its shards, mapped
    on first use, were a FileNotFoundError traceback, exit 1, the steps since the last checkpoint
    lost (review R26b M1). Source b is first read in phase 2; removed during phase 1, the run saves
    step 4, stops with one line naming the shard, and goes on once the dataset is back."""
    b = tmp_path / "b"
    shutil.copytree(synthetic_dataset(n_docs=300, seed=1), b)
    run = tmp_path / "run"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f"""
[model]
preset = "tiny"
[data]
global_batch_tokens = 512
micro_batch = 4
[[data.sources]]
name = "a"
dataset = {json.dumps(str(dataset))}
[[data.sources]]
name = "b"
dataset = {json.dumps(str(b))}
[[phase]]
name = "main"
steps = 4
seq_len = 32
mix = {{ a = 1.0 }}
[[phase]]
name = "anneal"
steps = 4
seq_len = 32
mix = {{ a = 0.5, b = 0.5 }}
[parallel]
param_dtype = "float32"
[run]
output_dir = {json.dumps(str(run))}
log_every = 1
device = "cpu"
threads = 1
[checkpoint]
interval = 0
[metrics]
tensorboard = false
plot = false
""")
    aside = tmp_path / "b-aside"

    class Printer(io.StringIO):  # the console: at step 3's line the dataset goes
        def write(self, text: str) -> int:
            if text.startswith("step      3/"):
                b.rename(aside)
            return super().write(text)

    out = Printer()
    with pytest.raises(DatasetError) as error:
        train(load_train_config(recipe, []), out=out)
    said = str(error.value)
    assert re.match(rf"{b}/shards/\d{{5}}_\d{{5}}\.tar cannot be read \(No such file or directory\): ", said)
    assert f"the dataset {b} changed or vanished after it was opened" in said, said
    assert "the data of step 5 cannot be read: saving step 4 before stopping" in out.getvalue()
    assert complete_steps(run) == [4]
    aside.rename(b)
    assert train(load_train_config(recipe, ['checkpoint.resume="auto"']), out=io.StringIO())["steps"] == 8
    assert [r["step"] for r in metrics(run)] == list(range(1, 9))


def test_a_run_record_that_cannot_be_written_before_step_1_is_one_line(dataset, tmp_path, capsys):
    """consumption.parquet blocked by a directory (or an immutable metrics.jsonl: EPERM, even for
    root) before step 1: an IsADirectoryError traceback, exit 1 (review R26a F4). One line, exit 2."""
    run = tmp_path / "run"
    (run / "consumption.parquet" / "x").mkdir(parents=True)
    assert gristmill(["train", "--config", TINY, "--set", *overrides(dataset, run)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot write {run / 'consumption.parquet'}: Is a directory; "), line


@pytest.mark.timeout(60)  # without the checks, an open waits for the pipe's other end for good
@pytest.mark.parametrize("name", ["metrics.jsonl", "batches.bin", "checkpoints.jsonl"])
def test_a_record_file_that_is_a_pipe_is_one_line_at_any_start(whole, dataset, tmp_path, capsys, name):
    """A run's record file that is a FIFO hung for good: metrics.jsonl opened to append by a fresh run
    (trial RV75e, left in session 71), batches.bin and checkpoints.jsonl read by a resume, and
    checkpoints.jsonl read by verify (review RV76b 1, 2). Every start is refused in one line before it
    writes anything, the pipe left as it was; verify reads such a record as one it cannot read."""
    said = "it is not a regular file (a pipe, a device); move it aside, or write the run somewhere else"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    os.mkfifo(fresh / name)
    assert gristmill(["train", "--config", TINY, "--set", *overrides(dataset, fresh)]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: cannot use {fresh / name}: {said}"
    assert sorted(p.name for p in fresh.iterdir()) == [LOCK_FILE, name] and (fresh / name).is_fifo()
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    (run / name).unlink()
    os.mkfifo(run / name)
    listing = sorted(p.relative_to(run) for p in run.rglob("*"))
    resume = ["train", "--config", str(run / CONFIG_TOML), "--resume", str(checkpoint_dir(run, 4)), "--set"]
    assert gristmill([*resume, f"run.output_dir={json.dumps(str(run))}"]) == 2
    assert one_error_line(capsys.readouterr().err) == f"error: cannot use {run / name}: {said}"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing and (run / name).is_fifo()
    if name == "checkpoints.jsonl":
        assert gristmill(["verify", str(run)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert f"{run / name}: holds no line where the record begins" in out, out


def test_a_damaged_data_plan_is_one_line_with_the_fix_that_works(dataset, tmp_path, capsys):
    """Issue 37 item 6: a truncated RUN/data_plan.json is one line from `data inspect RUN` and `data
    audit RUN` naming the file and what rewrites it (not a JSONDecodeError, not `data validate`,
    which refuses a training run), and that advice, followed as written, repairs it."""
    run = tmp_path / "run"
    train(load_train_config(TINY, overrides(dataset, run, "schedule.steps=4")))
    plan = run / "data_plan.json"
    good = json.loads(plan.read_text())
    plan.write_text(plan.read_text()[:100])
    capsys.readouterr()
    fix = f"gristmill train --config {run / CONFIG_TOML} --resume auto"
    for command in (
        ["data", "inspect", str(run), "--step", "2"],
        ["data", "audit", str(run), "--sql", "FROM skips"],
    ):
        assert gristmill(command) == 2, command
        line = one_error_line(capsys.readouterr().err)
        assert str(plan) in line and fix in line and "data validate" not in line, line
    assert gristmill(fix.split()[1:]) == 0
    assert json.loads(plan.read_text()) == good
    # a source without its fingerprint (every plan records it): a KeyError traceback (review RV32d 5)
    plan.write_text(json.dumps({**good, "sources": [{"name": "data"}]}))
    assert gristmill(["data", "inspect", str(run), "--step", "2"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{plan} is damaged (sources[0] has no string 'fingerprint'); the trainer writes it" in line, line
    plan.write_text(json.dumps(good))
    assert gristmill(["data", "inspect", str(run), "--step", "2", "--max-rows", "1"]) == 0
    capsys.readouterr()  # no data-parallel ranks: one line (ZeroDivisionError in the run's plan: R21b F11)
    assert gristmill(["data", "inspect", str(run), "--world-size", "0"]) == 2
    assert one_error_line(capsys.readouterr().err) == "error: --world-size must be at least 1, got 0"
    # 16 ranks share the 16 sequences (the trainer's micro-batch of 4 would not: the run's own rule, not
    # the reader's, which was refused naming data.micro_batch: trial RV64a 2f); rank 15's row is row 15
    assert gristmill(["data", "inspect", str(run), "--step", "2", "--max-rows", "0"]) == 0
    whole = capsys.readouterr().out
    assert gristmill(["data", "inspect", str(run), "--step", "2", "--world-size", "16", "--rank", "15"]) == 0
    ranks = capsys.readouterr().out
    row = whole[whole.index("row 15: ") :].split("\n")[0]
    assert row in ranks and "rows 15..15 of the global batch" in ranks and "row 14: " not in ranks, ranks
    assert gristmill(["data", "inspect", str(run), "--world-size", "3"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "error: --world-size 3: the run has a global batch of 16 sequences, which 3 ranks cannot share; "
        "give a world size that divides it (1, 2, 4, 8, 16)"
    )
    assert gristmill(["data", "inspect", str(run), "--max-rows", "-1"]) == 2  # every row (review R21b)
    said = one_error_line(capsys.readouterr().err)
    assert said == "error: --max-rows -1: give the rows to print, ≥ 1 (0: all)"
    # deleted: the note said "the run started before it was recorded" and nothing of the fix (R21b F8);
    # now refused: a run without it may be an older gristmill's, whose order is not this version's
    # (review R26c S2); the fix works
    plan.unlink()
    assert gristmill(["data", "inspect", str(run), "--step", "2", "--max-rows", "1"]) == 2
    unknown = (
        "the run's datasets and data order are unknown, and a run of an older gristmill drew its batches in "
        "an order this version does not compute (see it with the gristmill that trained it)"
    )
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {plan} not found (deleted, or the run started before gristmill 44980ef recorded it): "
        f"{unknown}; the trainer writes it again from the run's newest checkpoint: {fix} (a finished run "
        "trains nothing)"
    )
    assert gristmill(fix.split()[1:]) == 0
    assert json.loads(plan.read_text()) == good
    # with no checkpoint, that advice trained the run again from step 0 (review R22a B3)
    bare = tmp_path / "bare"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("checkpoints", "data_plan.json"))
    assert gristmill(["data", "inspect", str(bare), "--step", "2", "--max-rows", "1"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"error: {bare / 'data_plan.json'} not found (deleted, or the run started before gristmill 44980ef "
        f"recorded it): {unknown}; no checkpoint of the run holds its plan to write it from (a run started "
        "again trains from step 0)"
    )
    # its seed edited (valid JSON): it read as an edited config, and setting the config "back" to it
    # had inspect print other batches than the run's, exit 0 (review R14c F7)
    sources = [{**good["sources"][0], "val_fraction": 0.25}, *good["sources"][1:]]  # (R14f F3: the same)
    for edited in ({**good, "seed": good["seed"] + 1}, {**good, "sources": sources}):
        plan.write_text(json.dumps(edited))
        assert gristmill(["data", "inspect", str(run), "--step", "2", "--max-rows", "1"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "the config was edited after the run" in line and f"{plan} is what changed: " in line, line
        assert line.endswith(f"{fix} (a finished run trains nothing))"), line
    assert gristmill(fix.split()[1:]) == 0
    assert json.loads(plan.read_text()) == good
    # the ledger truncated: "validate the dataset and rebuild it", of a run (review R14c F8)
    ledger = run / "consumption.parquet"
    rows = pq.read_table(ledger).to_pylist()
    ledger.write_bytes(ledger.read_bytes()[:100])
    capsys.readouterr()
    assert gristmill(["data", "audit", str(run), "--sql", "FROM consumption"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(ledger) in line and fix in line and "data validate" not in line, line
    assert gristmill(fix.split()[1:]) == 0
    assert pq.read_table(ledger).to_pylist() == rows
    # a bit flipped inside a page, not the footer: duckdb read the other count, exit 0 (review R31b F6);
    # the trainer writes it with page checksums and the audit verifies them first
    count = ["data", "audit", str(run), "--sql", "SELECT sum(tokens) AS n FROM consumption", "--format=json"]
    capsys.readouterr()
    assert gristmill(count) == 0
    tokens = json.loads(capsys.readouterr().out)[0]["n"]
    flip_a_value_bit(ledger, "tokens")
    assert gristmill(count) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot audit {run}: {ledger} is unreadable (OSError: "), line
    assert "CRC checksum verification failed" in line, line
    assert line.endswith(f"{fix} (a finished run trains nothing)"), line
    assert gristmill(fix.split()[1:]) == 0
    capsys.readouterr()
    assert gristmill(count) == 0 and json.loads(capsys.readouterr().out)[0]["n"] == tokens
    # the footer, which no checksum covers: a column's name flipped read as a blank column, exit 0 (review
    # RV32e F3); a page header pyarrow tolerates ended in duckdb's bare "TProtocolException" (RV32e F6)
    written = ledger.read_bytes()
    assert flip_a_name_bit(ledger, "tokens") == "tokenr"
    assert gristmill(count) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot audit {run}: {ledger} is damaged: its columns are not "), line
    assert "tokenr (int64)" in line and line.endswith(f"{fix} (a finished run trains nothing)"), line
    ledger.write_bytes(written)
    flip_a_header_bit(ledger)
    assert gristmill(count) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: cannot audit {run}: {ledger} is damaged: duckdb cannot read it ("), line
    assert line.endswith(f"{fix} (a finished run trains nothing)"), line
    ledger.write_bytes(written)


def test_a_closed_stderr_keeps_the_exit_status_of_a_diverged_run(dataset, tmp_path, monkeypatch):
    """`gristmill train … 2>&1 | head -3` of a run that diverges: its error line meets a closed pipe.
    The status stays 3 (it was 1: the print raised inside the CLI's handler)."""
    read, write = os.pipe()
    os.close(read)
    monkeypatch.setenv("GRISTMILL_FAULT_NAN_LOSS", "3")
    sets = overrides(dataset, tmp_path / "run", 'run.on_nonfinite="stop"')
    with open(write, "w") as closed:
        monkeypatch.setattr(sys, "stderr", closed)
        assert gristmill(["train", "--config", TINY, "--set", *sets]) == 3


def test_a_full_disk_under_the_console_stops_its_printing_with_a_note(capfd):
    """stdout redirected to a log on a disk that fills (/dev/full: ENOSPC): printing stops, as for a
    reader gone, but with a note on stderr (a pipe or a terminal gone says nothing: nobody reads)."""
    from training.console import ReaderSafeOut

    with open("/dev/full", "w") as full:
        out = ReaderSafeOut(full)
        out.write("step 1 | …\n")
        out.flush()
        assert out.gone
        out.write("step 2 | …\n")  # dropped
    assert "note: printing stopped ([Errno 28] No space left on device)" in capfd.readouterr().err


def test_the_console_reaches_the_terminal_while_an_eval_redirects_stdout(tmp_path):
    """An in-training eval points file descriptors 1 and 2 at its eval.log while it runs; retention's
    "deleted checkpoint(s) N", said from its thread meanwhile, went into RUN/eval/step-N/eval.log
    instead of the console (review RV26b 3b). The run's console prints to the terminal throughout;
    lm-eval's own output still goes to the log."""
    log = tmp_path / "eval.log"
    script = (
        "import os, threading\n"
        "from training.console import console, say\n"
        "from validation.eval_output import eval_output\n"
        "with console.bound(0):\n"
        "    say('step 2 | loss 1.0')\n"
        f"    with eval_output({str(log)!r}):\n"
        "        print('lm-eval chatter')\n"
        "        os.write(1, b'subprocess chatter\\n')\n"
        "        t = threading.Thread(target=say, args=('retention: deleted checkpoint(s) 2',))\n"
        "        t.start(); t.join()\n"
        "        say('[eval] step 2: heldout_ppl 1.0')\n"
        "    say('step 3 | loss 0.9')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "step 2 | loss 1.0",
        "retention: deleted checkpoint(s) 2",
        "[eval] step 2: heldout_ppl 1.0",
        "step 3 | loss 0.9",
    ], done.stdout
    text = log.read_text()
    assert "lm-eval chatter" in text and "subprocess chatter" in text and "retention" not in text, text


def test_an_earlier_run_s_evals_set_aside_beside_an_eval_png_directory_is_a_warning(tmp_path, capsys):
    """A run directory with an earlier run's eval/step-N and a directory named eval.png: the set-aside
    of the earlier evals (RunRecord._set_aside at the start) removes the stale plot, and the directory
    was an IsADirectoryError traceback before step 1 (review RV26b 6). One warning line; the evals
    are set aside."""
    from training.run.record import RunRecord

    run = tmp_path / "run"
    (run / "eval" / "step-000020").mkdir(parents=True)
    (run / "eval.png").mkdir()
    RunRecord(run, None, None, rank=0, plot=False)._set_aside(after=0, earlier_run=True)
    out = capsys.readouterr().out
    assert f"warning: {run / 'eval.png'} not removed (Is a directory)" in out, out
    assert (run / "eval" / "abandoned-step-000020").is_dir() and (run / "eval.png").is_dir()


def test_a_resume_without_data_plan_json_falls_back_past_a_damaged_newest_checkpoint(
    dataset, whole, tmp_path
):
    """data_plan.json gone and the newest checkpoint damaged: the data order was read from that
    checkpoint before the restore could fall back past it, and the resume was refused ("cannot read
    the data order of …", review RV26e L/M-1). The restore goes back to the checkpoint before, as it
    did, and the run ends as the uninterrupted one."""
    run = tmp_path / "run"
    train(load_train_config(TINY, overrides(dataset, run, "run.max_steps=8")), out=io.StringIO())
    assert complete_steps(run)[-2:] == [4, 8]
    (run / DATA_PLAN_JSON).unlink()
    damaged = next(checkpoint_dir(run, 8).glob("*.distcp"))
    os.truncate(damaged, 100)
    out = io.StringIO()
    train(load_train_config(TINY, overrides(dataset, run, 'checkpoint.resume="auto"')), out=out)
    assert "resumed at step 4" in out.getvalue(), out.getvalue()
    assert losses(run)[-1] == losses(whole)[-1]


def test_a_checkpoint_that_is_not_the_runs_save_of_its_step_is_refused_and_its_export_kept(
    dataset, tmp_path, capsys
):
    """Trial RV60c 1-3, 9. Another run's checkpoint put among the run's, or a save of the step a later
    one replaced put back under its name, was verified, exported and resumed from as the run's, exit
    0; a COMPLETE damaged (or such a checkpoint) made verify call the run's intact export another's,
    and `export` replaced it with the wrong weights or set it aside and failed; a .metadata deleted
    under a COMPLETE was "incomplete", no damage. RUN/checkpoints.jsonl's run id, in every COMPLETE,
    and its lines tell them; the exports are judged by the record where the checkpoint is not the
    run's."""
    from training.checkpoint.io import merged_step, newest_verified
    from training.checkpoint.record import CheckpointError

    def run(name: str, *extra: str) -> Path:
        sets = overrides(dataset, tmp_path / name, "run.max_steps=4", "checkpoint.interval=2",
                         "checkpoint.export_interval=2", *extra)  # fmt: skip
        train(load_train_config(TINY, sets), out=io.StringIO())
        return tmp_path / name

    def verified(path: Path) -> tuple[int, str]:
        capsys.readouterr()
        rc = gristmill(["verify", str(path)])
        return rc, " ".join(capsys.readouterr().out.split())

    a, b = run("a"), run("b", "optim.lr=0.002", "run.max_steps=6")
    exported = {p.name: p.read_bytes() for p in export_dir(a, 4).iterdir()}
    # another run's step 4 in place of the run's
    checkpoint_dir(a, 4).rename(tmp_path / "a4")
    shutil.copytree(checkpoint_dir(b, 4), checkpoint_dir(a, 4))
    rc, out = verified(a)
    assert rc == 1 and "step-000004 is another run's checkpoint (its COMPLETE names run" in out, out
    assert re.search(r"export 4 ok", out), out  # the run's own export of it, intact
    assert export_checkpoint(a, 4) == export_dir(a, 4)  # kept, not replaced by the other run's weights
    assert {p.name: p.read_bytes() for p in export_dir(a, 4).iterdir()} == exported
    assert newest_verified(a)[0] == checkpoint_dir(a, 2)  # --resume auto passes over it
    # and one of a later step: the run did not train through it ("step 5 is not recorded … the run
    # trained through 6": trial RV75e)
    shutil.copytree(checkpoint_dir(b, 6), checkpoint_dir(a, 6))
    rc, out = verified(a)
    assert rc == 1 and "step-000006 is another run's checkpoint" in out, out
    assert not re.search(r"batches \d+ DAMAGED|trained through", out), out
    with pytest.raises(ExportError, match="step 5 is not trained yet: the run has reached step 4;"):
        export_checkpoint(a, 5)
    two = checkpoint_dir(a, 2) / COMPLETE_FILE  # nested past the JSON parser's depth: a RecursionError
    held = two.read_bytes()  # traceback where every COMPLETE is read (review RV77c 3)
    two.write_text("[" * 200_000)
    with pytest.raises(ExportError, match="step 5 is not trained yet: the run has reached step 4;"):
        export_checkpoint(a, 5)
    two.write_bytes(held)
    shutil.rmtree(checkpoint_dir(a, 6))
    shutil.rmtree(export_dir(a, 4))
    with pytest.raises(ExportError, match="another run's checkpoint"):
        export_checkpoint(a, 4)
    # a damaged COMPLETE: the checkpoint is damaged, its step's export is the run's as recorded
    shutil.rmtree(checkpoint_dir(a, 4))
    complete = checkpoint_dir(a, 2) / COMPLETE_FILE
    kept = complete.read_bytes()
    complete.write_bytes(kept.replace(b'"tokens": ', b'"tokens": 1', 1))
    rc, out = verified(a)
    assert rc == 1 and "step-000002/COMPLETE does not hash" in out and re.search(r"export 2 ok", out), out
    two = {p.name: p.read_bytes() for p in export_dir(a, 2).iterdir()}
    assert export_checkpoint(a, 2) == export_dir(a, 2)
    assert {p.name: p.read_bytes() for p in export_dir(a, 2).iterdir()} == two and not list(
        (a / "exports").glob("abandoned-*")
    )
    complete.write_bytes(kept)
    # a .metadata deleted under its COMPLETE: damage, named
    metadata = (checkpoint_dir(a, 2) / DCP_METADATA).read_bytes()
    (checkpoint_dir(a, 2) / DCP_METADATA).unlink()
    rc, out = verified(a)
    assert rc == 1 and re.search(r"checkpoint 2 DAMAGED", out) and ".metadata: missing" in out, out
    with pytest.raises(CheckpointError, match=r"\.metadata cannot be read"):  # eval --merged's question:
        merged_step(checkpoint_dir(a, 2))  # a FileNotFoundError's traceback (review RV60e 1)
    (checkpoint_dir(a, 2) / DCP_METADATA).write_bytes(metadata[: len(metadata) // 2])  # or cut short
    with pytest.raises(CheckpointError, match=r"\.metadata cannot be read \(\w+"):
        merged_step(checkpoint_dir(a, 2))  # an UnpicklingError's (review RV60f 3)
    (checkpoint_dir(a, 2) / DCP_METADATA).write_bytes(metadata)
    # a save of step 4 that a later one replaced, put back under its name
    (tmp_path / "a4").rename(checkpoint_dir(a, 4))
    run("a", f"checkpoint.resume={json.dumps(str(checkpoint_dir(a, 2)))}")
    assert verified(a)[0] == 0
    left = a / "checkpoints" / "abandoned-step-000004"
    assert left.is_dir()
    checkpoint_dir(a, 4).rename(tmp_path / "current")
    left.rename(checkpoint_dir(a, 4))
    rc, out = verified(a)
    assert rc == 1 and "step-000004 is a save of step 4 that a later one replaced" in out, out
    assert newest_verified(a)[0] == checkpoint_dir(a, 2)
    # the record's first line damaged: every check above off, without a word (trial RV60g F2); said
    checkpoint_dir(a, 4).rename(left)  # put back as they were
    (tmp_path / "current").rename(checkpoint_dir(a, 4))
    assert verified(a)[0] == 0
    record = a / "checkpoints.jsonl"
    lines = record.read_text().splitlines(keepends=True)
    record.write_text('{"began": 0, "ru\n' + "".join(lines[1:]))
    rc, out = verified(a)
    assert rc == 1 and re.search(r"record 0 DAMAGED", out), out
    assert "its first line (where the record begins, and the run's id) is unreadable" in out, out
    record.write_text("".join(lines))
    assert verified(a)[0] == 0
    # A copy of the directory, resumed on a timeline of its own: its saves shared the run's id, and
    # put back into the original passed every check (trial RV60g F1). A copy's resume records an id of
    # its own; its earlier saves (the original's, in the record) stay its own
    shutil.copytree(a, tmp_path / "fork", symlinks=True)
    fork = run(
        "fork",
        "optim.weight_decay=0.05",
        f"checkpoint.resume={json.dumps(str(tmp_path / 'fork' / 'checkpoints' / 'step-000002'))}",
    )
    assert verified(fork)[0] == 0
    checkpoint_dir(a, 4).rename(tmp_path / "current-4")
    shutil.copytree(checkpoint_dir(fork, 4), checkpoint_dir(a, 4))
    rc, out = verified(a)
    assert rc == 1 and "step-000004 is another run's checkpoint" in out, out


def test_a_resume_with_nothing_to_do_draws_the_run_s_curve(dataset, tmp_path, capsys):
    """A resume at the last step (the kill came after it) trains nothing and drew no curve, so loss.png
    stayed the picture of an earlier stop, or none (trial RV65c F2): drawn of the run's whole record."""
    run = tmp_path / "run"
    sets = overrides(dataset, run, "schedule.steps=4", "checkpoint.interval=4", "metrics.plot=true")
    train(load_train_config(TINY, sets))
    (run / "loss.png").unlink()
    capsys.readouterr()
    train(load_train_config(TINY, [*sets, "checkpoint.resume='auto'"]))
    out = capsys.readouterr().out
    assert "nothing to do: the checkpoint is at step 4" in out, out
    assert f"curve: {run / 'loss.png'} (the run's rows through step 4)" in out, out
    assert (run / "loss.png").is_file()
    # not drawn again with metrics.plot = false: the picture is said to be an earlier one's
    train(load_train_config(TINY, [*sets, "checkpoint.resume='auto'", "metrics.plot=false"]))
    said = f"{run / 'loss.png'} is an earlier invocation's curve (metrics.plot = false)"
    assert said in capsys.readouterr().out


def test_a_resume_says_which_rows_a_deleted_or_damaged_metrics_file_lost(dataset, tmp_path, capsys):
    """metrics.jsonl deleted before a resume: nothing was said, the run's record began at the resume
    (trial RV65c F4); a line in it damaged: "dropped 1 unreadable line(s): 3", not which step's row,
    nor that the file written without it loses it for good."""
    run = tmp_path / "run"
    sets = overrides(dataset, run, "schedule.steps=6", "checkpoint.interval=2", "run.max_steps=2")
    train(load_train_config(TINY, sets))
    (run / "metrics.jsonl").unlink()
    capsys.readouterr()
    train(load_train_config(TINY, [*sets, "run.max_steps=4", "checkpoint.resume='auto'"]))
    out = capsys.readouterr().out
    assert (
        f"note: {run / 'metrics.jsonl'} is missing (deleted?): the rows of the steps before 2 are lost" in out
    )
    assert [r["step"] for r in metrics(run)] == [2, 3, 4]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(f"{lines[0]}\n{lines[1][:20]}\n{lines[2]}\n")  # step 3's cut short
    train(load_train_config(TINY, [*sets, "checkpoint.resume='auto'"]))
    said = f"note: dropped 1 unreadable line(s) of {run / 'metrics.jsonl'}: 2 (after step 2's row); written "
    assert said + "without them, their rows are lost (step 4's, if one of them, is written again" in (
        capsys.readouterr().out
    )


def test_an_append_cut_short_is_finished_or_raises_the_disk_s_own_error(tmp_path):
    """A write that comes back short (a nearly full disk, a file size limit) returned its count and no
    error: the row was left torn and taken as written (trial RV65c F1). append_whole, which every
    record's append goes through (metrics.jsonl, batches.bin, checkpoints.jsonl), writes the rest, so
    the error is the limit's own, EFBIG here, not "the disk is full" (review RV65e 3)."""
    probe = (
        "import os, resource, sys\n"
        "from training.contract.atomic_write import append_whole\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)\n"
        "append_whole(fd, b'x' * 1000)\n"
        "try:\n"
        "    append_whole(fd, b'y' * 75)\n"
        "except OSError as e:\n"
        "    print(e.errno)\n"
    )
    path = tmp_path / "record"
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(path)], cwd=ROOT, env=ENV, capture_output=True, text=True
    )
    assert proc.stdout.strip() == str(errno.EFBIG), proc.stdout + proc.stderr[-2000:]
    assert path.stat().st_size == 1024  # the part that fit: a torn line the resume cuts off


def _files(run: Path) -> dict[Path, int]:
    """Each file and folder of `run` (but its lock, taken by each attempt) by its modification time."""
    return {p: p.stat().st_mtime_ns for p in run.rglob("*") if not p.is_symlink() and p.name != LOCK_FILE}


def test_checkpoints_out_of_reach_are_refused_not_taken_for_a_new_run(dataset, tmp_path, capsys):
    """Trial RV67a F1, F2: RUN/checkpoints a link to scratch storage not mounted (or an empty mount
    point), and `--resume auto` took the run for a new one: it set the run's record and exports aside as
    an earlier run's and trained from step 0, to die at its first save, and verify said "0 damaged"; a
    step-N link to nowhere was passed over, its export set aside, its steps trained again. Each is
    refused before anything is touched, and verify says so."""
    from training.checkpoint.record import CheckpointError

    run = tmp_path / "run"
    sets = overrides(dataset, run, "schedule.steps=4", "checkpoint.interval=2", "run.max_steps=2")
    train(load_train_config(TINY, sets))
    resume = [a for a in sets if a != "run.max_steps=2"] + ["checkpoint.resume='auto'"]
    scratch, gone = tmp_path / "scratch", tmp_path / "not-mounted"
    (run / "checkpoints").rename(scratch)
    (run / "checkpoints").symlink_to(gone)
    before = _files(run)

    def refused(why: str, verified: int = 1) -> None:
        with pytest.raises(CheckpointError, match=f"^--resume auto: {re.escape(why)}"):
            train(load_train_config(TINY, resume))
        assert _files(run) == before
        capsys.readouterr()
        assert gristmill(["verify", str(run)]) == verified  # a link to nowhere is; no checkpoint is not
        said = re.search(
            rf"^\s*checkpoints\s+0\s+DAMAGED\b.*{re.escape(why[:40])}", capsys.readouterr().out, re.M
        )
        assert bool(said) == bool(verified)

    refused(f"{run / 'checkpoints'} is a link to {gone}, which does not exist: mount or restore it")
    fresh = [a for a in resume if not a.startswith("checkpoint.resume")]  # a run started anew there
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(run / 'checkpoints'))} is a link to {gone}"):
        train(load_train_config(TINY, fresh))  # took for a fresh run's: its record set aside (RV67e 3)
    assert _files(run) == before
    (run / "checkpoints").unlink()
    (run / "checkpoints").mkdir()  # an empty mount point, or checkpoints deleted once exported
    (run / "checkpoints" / "abandoned-step-000002").mkdir()  # a set-aside copy is no save (RV67e 2)
    before = _files(run)
    saves = f"{run / 'checkpoints.jsonl'} records complete saves of this run (steps 2), and "
    refused(saves + f"{run / 'checkpoints'} holds none", verified=0)
    shutil.rmtree(run / "checkpoints")
    scratch.rename(run / "checkpoints")
    checkpoint_dir(run, 2).rename(tmp_path / "step-2")
    checkpoint_dir(run, 2).symlink_to(gone)
    before = _files(run)
    refused(f"{checkpoint_dir(run, 2)} is a link to {gone}, which does not exist")
    checkpoint_dir(run, 2).unlink()
    (tmp_path / "step-2").rename(checkpoint_dir(run, 2))  # back: the run goes on
    train(load_train_config(TINY, resume))
    assert complete_steps(run) == [2, 4]


def test_a_run_directory_this_user_may_not_list_is_one_line_before_any_write(dataset, capsys):
    """A run directory of mode 311 (writable, not listable): each atomic write failed at the sync of the
    folder after the file was in place, "make it writable", and the checkpoints.jsonl left behind was an
    earlier run's to the next start (trial RV75e). Refused first, nothing written; as root, without the
    capability to read any folder (tests/helpers/no_dac.py)."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gristmill-unlisted-"))
    run = work / "run"
    argv = ["train", "--config", str(TINY), "--set", *overrides(dataset, run, "run.max_steps=2")]

    def refused(*more: str) -> str:
        """`gristmill train …` without the capability: its one error line, exit 2, nothing written."""
        command = [sys.executable, "-m", "tests.helpers.no_dac", "pipelines.cli", *argv, *more]
        env = {**ENV, "HOME": tempfile.gettempdir()}
        done = forked.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        assert done.returncode == 2, done.stderr[-3000:]
        work.chmod(0o755)
        assert os.listdir(run) == []
        return one_error_line(done.stderr)

    try:
        run.mkdir(mode=0o311)
        run.chmod(0o311)  # past the umask
        said = (
            f"error: cannot list {run}: Permission denied; give this user read access to it (a run lists and "
            "syncs its folder), or write the run somewhere else"
        )
        assert refused() == said
        assert refused("--plan") == said  # --plan refuses what train refuses (review RV77c 6)
        # a folder above it that may not be entered: that is the fix, not the run directory's own mode
        run.chmod(0o755)
        work.chmod(0o600)
        assert refused() == (
            f"error: cannot reach {run}: Permission denied; give this user access to the folders above it, "
            "or write the run somewhere else"
        )
    finally:
        work.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)


def test_a_checkpoint_file_this_user_may_not_read_is_refused_not_passed_over(dataset, capsys):
    """Trial RV67a F16: a file of the newest checkpoint the resuming user may not read was taken for
    damage: `--resume auto` passed over the intact checkpoint, set it and its export aside and trained
    its steps again. Refused with the fix, access. As root (which reads any file) the resume's choice
    runs without the capability to read any file (tests/helpers/no_dac.py)."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gristmill-denied-"))
    try:
        run, data = work / "run", work / "data"  # the dataset too, for verify's check of the batches
        shutil.copytree(dataset, data)
        train(load_train_config(TINY, overrides(data, run, "schedule.steps=4", "checkpoint.interval=2")))
        for p in [work, *run.rglob("*"), *data.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        step = checkpoint_dir(run, 4)
        code = "import sys\nfrom training.checkpoint.checkpointer import find_resume\n"
        code += "find_resume(sys.argv[1], 'auto')"
        no_dac = [sys.executable, "-m", "tests.helpers.no_dac"]
        # a file of its record, its COMPLETE, and the folder itself (review RV67e 1: those were passed over)
        for hidden, mode in ((sorted(step.glob("*.distcp"))[0], 0), (step / COMPLETE_FILE, 0), (step, 0o644)):
            hidden.chmod(mode)
            done = forked.run(
                [*no_dac, "-c", code, str(run)], capture_output=True, text=True, cwd=work,
                env={**ENV, "HOME": str(work)},
            )  # fmt: skip
            assert done.returncode == 1 and "CheckpointDenied" in done.stderr, done.stderr[-3000:]
            said = f"{hidden} cannot be read by this user (permission denied): give it read access"
            assert said in done.stderr and "step-000004 is not damaged" in done.stderr, done.stderr[-3000:]
            if hidden.suffix == ".distcp":  # verify says it as access, not damage (review RV67e 9)
                verify = [*no_dac, "pipelines.cli", "verify", str(run)]
                shown = forked.run(
                    verify, capture_output=True, text=True, cwd=work, env={**ENV, "HOME": str(work)}
                )
                assert shown.returncode == 1, shown.stdout[-3000:] + shown.stderr[-3000:]
                assert re.search(r"^\s*checkpoint\s+4\s+UNREADABLE\b", shown.stdout, re.M), shown.stdout
                assert "0 damaged, 1 unreadable by this user" in shown.stdout, shown.stdout
            hidden.chmod(0o755 if hidden.is_dir() else 0o644)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_verify_says_a_record_lost_while_the_run_s_saves_carry_its_id(whole, tmp_path, capsys):
    """Trial RV67a F3: RUN/checkpoints.jsonl deleted, emptied, or cut at its head (its first line gone,
    or one without its beginning) switched every check by it off without a word: another run's
    checkpoint and export put in the run's place passed verify, exit 0. Where the run's checkpoints
    carry a run id, its record had one: verify says it is lost."""
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    record = run / "checkpoints.jsonl"
    lines = record.read_text().splitlines(keepends=True)
    assert gristmill(["verify", str(run)]) == 0
    for text, said in (
        (None, "missing, while the run's checkpoints carry the run id"),
        ("", "holds no line where the record begins"),
        ("".join(lines[1:]), "holds no line where the record begins"),
        (
            lines[0].replace('"began"', '"bagan"') + "".join(lines[1:]),
            "holds no line where the record begins",
        ),
    ):
        record.unlink(missing_ok=True)
        if text is not None:
            record.write_text(text)
        capsys.readouterr()
        assert gristmill(["verify", str(run)]) == 1
        out = capsys.readouterr().out
        assert re.search(rf"^\s*record\s+0\s+DAMAGED\b.*{re.escape(said)}", out, re.M), out
        # nothing to move aside where it is missing (review RV67e 8)
        assert ("move it aside" in " ".join(out.split())) is (text is not None), out
    record.write_text("".join(lines))
    assert gristmill(["verify", str(run)]) == 0


def test_export_leaves_the_run_s_export_where_the_checkpoint_to_export_again_is_damaged(whole, tmp_path):
    """Trial RV67a F5: checkpoints 4 and 8 swapped; `gristmill export RUN --step 4`, as verify advised,
    set the intact export of step 4 aside as another checkpoint's, then failed on the checkpoint: the
    run's export gone. The checkpoint is checked first; the export stays. The export is the one the
    run's record names for step 4: the run's, given as it is (it was called another checkpoint's, the
    advised export refused: trial RV75a 2)."""
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    for step in (4, 8):
        export_checkpoint(run, step)
    kept = {p.name: p.read_bytes() for p in export_dir(run, 4).iterdir()}
    checkpoint_dir(run, 4).rename(tmp_path / "four")
    checkpoint_dir(run, 8).rename(checkpoint_dir(run, 4))
    (tmp_path / "four").rename(checkpoint_dir(run, 8))
    assert export_checkpoint(run, 4) == export_dir(run, 4)
    assert {p.name: p.read_bytes() for p in export_dir(run, 4).iterdir()} == kept
    # and with --out: a copy of the run's export, as plain export gives it (review RV75d 5)
    copy = export_checkpoint(run, 4, out=tmp_path / "copy")
    assert (copy / "model.safetensors").read_bytes() == kept["model.safetensors"]
    assert not list((run / "exports").glob("abandoned-*"))


def test_a_metrics_jsonl_this_user_may_not_read_is_one_line_at_a_resume(whole, tmp_path):
    """Trial RV75a 1: a resume whose metrics.jsonl cannot be read (its mode 000, another user's file)
    was a 25-line PermissionError traceback after "resuming from …". One line naming it and the fix,
    access; said before the resume sets the newer checkpoints aside (they were, and the next resume
    started from the older step: review RV75d 1); a folder in its place is moved aside, not given
    access (RV75d 3). As root (which reads any file) the resume runs without the capability to read
    any file (tests/helpers/no_dac.py)."""
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    record = run / "metrics.jsonl"
    kept = record.read_bytes()
    listing = sorted(p.relative_to(run) for p in run.rglob("*"))
    resume = ["train", "--config", str(run / CONFIG_TOML), "--resume", str(checkpoint_dir(run, 4)), "--set"]
    resume += [f"run.output_dir={json.dumps(str(run))}"]
    no_dac = [sys.executable, "-m", "tests.helpers.no_dac", "pipelines.cli"]
    record.chmod(0)
    try:
        done = forked.run([*no_dac, *resume], capture_output=True, text=True, cwd=ROOT, env=ENV)
    finally:
        record.chmod(0o644)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == (
        f"error: cannot read {record}: Permission denied; give this user read and write access to it (a "
        "resume keeps its rows, then appends), or write the run somewhere else"
    ), lines
    assert record.read_bytes() == kept and sorted(p.relative_to(run) for p in run.rglob("*")) == listing
    record.rename(tmp_path / "rows")
    record.mkdir()
    done = forked.run([*no_dac, *resume], capture_output=True, text=True, cwd=ROOT, env=ENV)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"error: cannot read {record}: a folder is in its place; move it aside"), lines
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing
    # a FIFO hung the resume for good, waiting for a writer; a link to a disk not mounted was taken for
    # rows deleted, the newer checkpoints set aside, and the rows written through it (trial RV75e 1, 2)
    record.rmdir()
    for make, said in (
        (lambda: os.mkfifo(record), "it is not a regular file (a pipe, a device); move it aside"),
        (lambda: record.symlink_to(tmp_path / "unmounted" / "metrics.jsonl"), "which does not exist; mount"),
    ):
        make()
        done = forked.run([*no_dac, *resume], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and said in lines[0], done.stderr[-3000:]
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == listing
        record.unlink()


def test_an_index_file_this_user_may_not_read_is_one_line(dataset):
    """Trial RV67a F11: an index file the training user may not read was numpy's PermissionError
    traceback at the start of a run. One line naming it and the fix, access. As root (which reads any
    file) the index is opened without the capability to read any file (tests/helpers/no_dac.py)."""
    import tempfile

    from training.contract.dataset_format import INDEX_DIR
    from training.contract.dataset_index import DOC_OFFSETS

    work = Path(tempfile.mkdtemp(prefix="gristmill-denied-"))
    try:
        root = work / "ds"
        shutil.copytree(dataset, root)
        for p in [work, root, *root.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        (root / INDEX_DIR / DOC_OFFSETS).chmod(0)
        code = (
            "import sys\nfrom training.contract.dataset_format import read_dataset_info\n"
            "from training.contract.dataset_index import DocIndex\n"
            "DocIndex(sys.argv[1], read_dataset_info(sys.argv[1]))"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(work)}
        done = forked.run(
            [sys.executable, "-m", "tests.helpers.no_dac", "-c", code, str(root)],
            capture_output=True,
            text=True,
            cwd=work,
            env=env,
        )
        said = (
            f"{root / INDEX_DIR / DOC_OFFSETS} cannot be read (PermissionError: Permission denied): give this"
        )
        assert done.returncode == 1 and said in done.stderr and "DatasetError" in done.stderr, done.stderr[
            -2000:
        ]
        assert "numpy" not in done.stderr.splitlines()[-1], done.stderr[-2000:]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_run_without_its_config_toml_is_told_where_to_restore_it_from(whole, tmp_path, capsys):
    """Trial RV67a F14: a run's config.toml deleted, verify said the directory was no training run, though
    it holds the run's checkpoints and configs/from-step-N.toml: it names the file to restore it from."""
    run = tmp_path / "run"
    shutil.copytree(whole, run)
    kept = (run / CONFIG_TOML).read_bytes()
    (run / CONFIG_TOML).unlink()
    newest = sorted((run / "configs").glob("from-step-*.toml"))[-1]
    assert gristmill(["verify", str(run)]) == 2
    line = one_error_line(capsys.readouterr().err)
    said = "has no config.toml, which every run keeps, though it holds a run's configs/: restore it from"
    assert f"{said} the newest, {newest}" in line, line
    shutil.copyfile(newest, run / CONFIG_TOML)
    assert (run / CONFIG_TOML).read_bytes() == kept  # the newest of them is the run's config
    assert gristmill(["verify", str(run)]) == 0


def test_verify_names_another_run_s_record_put_in_the_run_s_place(whole, dataset, tmp_path, capsys):
    """Trial RV67a F6: another run's checkpoints.jsonl put in the run's place made every genuine
    checkpoint "another run's … move it out", every export "move it aside": the record, the odd one
    out, went unnamed. Its row says so, and to restore it before moving anything."""
    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(whole, run)
    train(load_train_config(TINY, overrides(dataset, other, "schedule.steps=4", "checkpoint.interval=4")))
    shutil.copyfile(other / "checkpoints.jsonl", run / "checkpoints.jsonl")
    assert gristmill(["verify", str(run)]) == 1
    text = " ".join(capsys.readouterr().out.split())
    assert "another run's record in this run's place? The checkpoints' and exports' rows follow" in text, text
    # listed first: the rows it decides follow (it came last, after five rows blaming the checkpoints:
    # trial RV70g 4)
    assert text.index("another run's record in this run's place") < text.index("is another run's checkpoint")
