"""Experiment trackers for real: wandb in offline mode and trackio's local store, read back.

A short in-process training logs every step to both, then a resume from an earlier checkpoint
continues the same wandb and trackio runs (ids from RUN/trackers.json) with the later steps only;
a fresh run into the same directory starts new ones. The config checks (unknown tracker, missing
package, the older wandb_project key) need no training.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import forked
from tests.helpers.train_runs import ENV, ROOT, TINY, one_error_line, read_metrics, recipe
from training.config import MetricsSection, TrainConfig
from training.config_checks import trackers_of
from training.contract.config_loader import ConfigError, load_config
from training.contract.run_layout import checkpoint_dir
from training.trackers import git_commit
from training.train import main

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """wandb offline and silent, its files in each run directory; trackio's store in a temp dir
    (TRACKIO_DIR is read when trackio is first imported, hence before the import). Yields whether
    trackio logs there: None when it is not installed, False when it was imported earlier."""
    pytest.importorskip("wandb", reason="wandb is not installed: pip install 'gristmill[wandb]'")
    store = tmp_path_factory.mktemp("trackio")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_CONSOLE", "off")  # keep wandb's stdout capture out of pytest's
        # wandb lists every installed distribution into each run (~200 here): nothing a test reads
        mp.setenv("WANDB__SAVE_REQUIREMENTS", "false")
        mp.delenv("WANDB_DIR", raising=False)
        for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # not the user's ~/.cache
            mp.setenv(var, str(store.parent / var.lower()))
        mp.setenv("TRACKIO_DIR", str(store))
        try:
            from trackio.utils import TRACKIO_DIR
        except ImportError:
            yield None
        else:
            yield TRACKIO_DIR == store


@pytest.fixture(scope="module")
def dataset(synthetic_dataset) -> Path:
    return synthetic_dataset(n_docs=200)


def run_training(dataset: Path, run_dir: Path, trackers: list[str], *extra: str) -> str:
    sets = recipe(dataset, run_dir, "schedule.steps=8", "schedule.warmup_steps=2", "run.val_every=0")
    sets += [f"metrics.trackers={json.dumps(trackers)}", 'metrics.project="gm-test"']
    sets += ['metrics.tags=["tiny"]', "metrics.plot=false", "checkpoint.interval=4", *extra]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = main(["--config", TINY, "--set", *sets])
    # an in-process caller's signals are its own again (a torchrun worker's exit-0 handler for its
    # teardown, left here, ended a later Ctrl-C of this process silently with 0: review RV55e 3)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    return code


def wandb_records(path: Path):
    """The protobuf records of a .wandb file (wandb's transaction log: a 7-byte header, then
    LevelDB-log blocks of 32 KiB whose chunks carry a 7-byte header: crc, length, type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def wandb_runs(run_dir: Path) -> list[dict]:
    """Per offline run directory (one per invocation), in order: its run id, config, tags and the
    history rows by step."""
    out = []
    for d in sorted((run_dir / "wandb").glob("offline-run-*")):
        (path,) = d.glob("run-*.wandb")
        run: dict = {"history": {}}
        # wandb's service (its own process) may still be writing the file when finish() has returned:
        # on a loaded machine it held only its header (7 bytes) then. Its exit record comes last.
        deadline = time.monotonic() + 60
        while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
            assert time.monotonic() < deadline, f"{path}: no exit record 60 s after the run finished"
            time.sleep(0.1)
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["tags"] = r.run.run_id, list(r.run.tags)
                run["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
            elif kind == "history":
                row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
                run["history"][row.pop("_step")] = row
        out.append(run)
    return out


def offline_ids(run_dir: Path) -> list[str]:
    """The run id of each invocation's offline-run-<time>-<id>[-n] directory, in order."""
    return [d.name.split("-")[3] for d in sorted((run_dir / "wandb").glob("offline-run-*"))]


def wandb_services(pid: int) -> list[int]:
    """The running wandb service processes (wandb-core) that process `pid` started: not one of an
    earlier test's runs still exiting (a zombie), which its reaper then took."""
    children = [
        c for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()
    ]
    found = []
    for c in children:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # gone since the listing
            stat = Path(f"/proc/{c}/stat").read_text()
            if "wandb" in stat.split(") ", 1)[0] and stat.rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(c))
    return found


def continue_services(pids: list[int]) -> None:
    """SIGCONT to each stopped service that is still there: one that exited meanwhile (an earlier
    run's, stopped as it exited) must not leave the others stopped, the next wandb.init of this
    test process hanging on them past the test's timeout."""
    import os
    import signal

    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def hang_wandb(until) -> list[int]:
    """This process's wandb services stopped (SIGSTOP: hung, as a wedged or swapped-out one is) and
    their socket filled from a thread of its own, as a long stall fills it with a run's rows (wide
    rows of the same run, until the event `until`): from then on the run's `run.log` blocks. Returns
    the stopped pids, to be continued (SIGCONT) at the end."""
    import os
    import signal
    import threading

    import wandb

    stopped = wandb_services(os.getpid())
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    wide = {f"fill/{i}": float(i) for i in range(200)}

    def fill() -> None:
        with contextlib.suppress(Exception):  # its run finished at the end
            while not until.is_set():
                wandb.run.log(wide, commit=False)  # blocks once the socket is full

    threading.Thread(target=fill, daemon=True).start()
    return stopped


def trackio_logs(run_id: str) -> dict[int, list[dict]]:
    from trackio.sqlite_storage import SQLiteStorage

    by_step: dict[int, list[dict]] = {}
    for row in SQLiteStorage.get_logs("gm-test", run_id=run_id):
        by_step.setdefault(row["step"], []).append(row)
    return by_step


def test_trackers_log_every_step_and_a_resume_continues_the_same_runs(env, dataset, tmp_path, capsys):
    trackers = ["tensorboard", "wandb"] + (["trackio"] if env else [])
    run_dir = tmp_path / "run"
    assert run_training(dataset, run_dir, trackers, "run.max_steps=5") == 0  # checkpoints at 4 and 5
    first = capsys.readouterr().out
    assert "wandb tracker: new run" in first and "Trackio" not in first  # trackio's chatter stays off
    ids = json.loads((run_dir / "trackers.json").read_text())
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    assert sorted(rows) == [1, 2, 3, 4, 5]

    (w,) = wandb_runs(run_dir)
    assert w["id"] == ids["wandb"]["id"] and ids["wandb"]["project"] == "gm-test" and w["tags"] == ["tiny"]
    assert sorted(w["history"]) == [1, 2, 3, 4, 5]
    for step, row in w["history"].items():
        assert row["loss"] == rows[step]["loss"] and row["lr"] == rows[step]["lr"]
    info = json.loads((dataset / "dataset.json").read_text())
    prov = w["config"]["provenance"]
    assert prov["datasets"]["data"]["fingerprint"] == info["fingerprint"]
    assert prov["datasets"]["data"]["config_sha256"] == info["config_sha256"]
    assert prov["git_commit"] == git_commit()  # this checkout's commit (None outside git)
    assert w["config"]["schedule"]["steps"] == 8 and w["config"]["metrics"]["trackers"] == trackers

    # The interrupted invocation got to step 5; resuming from step 4 redoes step 5, which the
    # trackers already hold: they get steps 6-8 only, in the same runs.
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run_dir, 4)))}"
    assert run_training(dataset, run_dir, trackers, resume) == 0
    second = capsys.readouterr().out
    assert (
        "wandb tracker: continued run" in second
        and f"{'were' if env else 'was'} sent step 5 by an earlier invocation" in second
    )
    now = json.loads((run_dir / "trackers.json").read_text())  # the same runs, each sent through step 8
    assert {t: r["sent_through"] for t, r in now.items()} == {t: 8 for t in ids} and {
        t: {k: v for k, v in r.items() if k != "sent_through"} for t, r in now.items()
    } == {t: {k: v for k, v in r.items() if k != "sent_through"} for t, r in ids.items()}
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 9))
    _, w2 = wandb_runs(run_dir)
    assert w2["id"] == w["id"] and sorted(w2["history"]) == [6, 7, 8]

    if env:
        logs = trackio_logs(ids["trackio"]["id"])
        assert sorted(logs) == list(range(1, 9)) and all(len(v) == 1 for v in logs.values())
        rows = {r["step"]: r for r in read_metrics(run_dir)}
        for step in (1, 4, 6, 8):
            assert logs[step][0]["loss"] == rows[step]["loss"]

    # A fresh run into the same directory (its checkpoints deleted: a new run is refused beside
    # them) starts new tracker runs.
    shutil.rmtree(run_dir / "checkpoints")
    assert run_training(dataset, run_dir, trackers, "run.max_steps=1") == 0
    fresh = json.loads((run_dir / "trackers.json").read_text())
    assert all(fresh[t]["id"] != ids[t]["id"] for t in ids)
    if env is None:
        pytest.skip("trackio is not installed (pip install 'gristmill[trackio]'): only wandb was checked")
    if env is False:
        pytest.skip("trackio was imported before TRACKIO_DIR was set: its store was not checked")


def test_steps_an_invocation_without_a_tracker_trained_are_sent_to_it_on_a_resume(
    env, dataset, tmp_path, capsys
):
    """Review R16h F1: a resume skipped the redone steps for every tracker trackers.json records, and
    said they had been sent, though the invocation before it ran without that tracker: wandb never
    got steps 5-6, exit 0."""
    run = tmp_path / "run"
    assert run_training(dataset, run, ["wandb"], "run.max_steps=4") == 0
    assert run_training(dataset, run, [], "run.max_steps=6", "checkpoint.resume=auto") == 0  # no wandb
    resume = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 4)))}"
    capsys.readouterr()
    assert run_training(dataset, run, ["wandb"], resume) == 0
    assert "by an earlier invocation" not in capsys.readouterr().out
    first, last = wandb_runs(run)
    assert sorted(first["history"]) == [1, 2, 3, 4] and sorted(last["history"]) == [5, 6, 7, 8]


def test_steps_an_earlier_invocation_sent_a_tracker_are_not_sent_again(env, dataset, tmp_path, capsys):
    """Review R16i F5: wandb sent steps 1-6, then an invocation without wandb redid step 5 from the
    step-4 checkpoint: a resume with wandb again sent it steps 5-6 once more, which wandb drops (its
    steps only go forward), with nothing said. How far each tracker was sent is its record's."""
    run = tmp_path / "run"
    assert run_training(dataset, run, ["wandb"], "run.max_steps=6") == 0
    four = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 4)))}"
    assert run_training(dataset, run, [], four, "run.max_steps=5") == 0  # no wandb
    capsys.readouterr()
    assert run_training(dataset, run, ["wandb"], four) == 0
    assert "wandb was sent steps 5–6 by an earlier invocation" in capsys.readouterr().out
    first, last = wandb_runs(run)
    assert sorted(first["history"]) == [1, 2, 3, 4, 5, 6] and sorted(last["history"]) == [7, 8]


def test_how_far_a_tracker_was_sent_is_its_highest_step_and_is_recorded_when_it_fails(env, tmp_path, capsys):
    """Review R16j: after a rewind the steps sent go back, and trackers.json recorded the last one sent,
    not the highest (the run holds the higher: a resume sent it again, which wandb drops); a tracker
    that failed mid-run stayed recorded as open, read at a resume after a kill as sent every row."""
    import os
    import signal

    import wandb

    from training.config import MetricsSection
    from training.trackers import Trackers

    run = tmp_path / "run"
    run.mkdir()
    m = MetricsSection(trackers=["wandb"], project="gm-test")
    trackers = Trackers(run, m, config={}, datasets={}, resume_step=None)
    for step in (1, 2, 3, 4, 5, 6, 7, 5, 6):  # a rewind from step 7 back to the step-4 checkpoint
        trackers.log({"step": step, "loss": 1.0})
    trackers.close()
    assert json.loads((run / "trackers.json").read_text())["wandb"]["sent_through"] == 7

    trackers = Trackers(run, m, config={}, datasets={}, resume_step=4)  # one more run
    try:
        assert json.loads((run / "trackers.json").read_text())["wandb"]["open"] is True
        trackers.log({"step": 8, "loss": 1.0})
        for pid in wandb_services(os.getpid()):  # its service killed, as the OOM killer does
            os.kill(pid, signal.SIGKILL)
        deadline, step = time.monotonic() + 60, 8
        while "wandb" in trackers.trackers:  # rows until a log finds it gone (a socket buffers a while)
            assert time.monotonic() < deadline, "no log of wandb's failed 60 s after its service was killed"
            step += 1
            trackers.log({"step": step, "loss": 1.0})
            time.sleep(0.05)
        # said at a later row than the one whose log raised (its thread's): the record is that one's
        failed = int(re.search(r"wandb failed at step (\d+)", capsys.readouterr().out).group(1))
        record = json.loads((run / "trackers.json").read_text())["wandb"]  # read before any close: a kill
        assert record["open"] is False and record["sent_through"] == failed - 1, (record, failed, step)
    finally:
        trackers.close()
        wandb.teardown()  # this process's next wandb run starts a service of its own


def test_tracker_names_and_packages_are_checked_with_the_config(monkeypatch):
    def cfg(*sets: str) -> MetricsSection:
        return load_config(TrainConfig, TINY, list(sets)).metrics

    assert trackers_of(cfg())[:2] == (["tensorboard"], "gristmill")
    assert trackers_of(cfg("metrics.tensorboard=false"))[0] == []
    names, project, notes = trackers_of(cfg('metrics.wandb_project="old"'))
    assert names == ["tensorboard", "wandb"] and project == "old"
    assert notes == ['note: metrics.wandb_project is the older key; write metrics.trackers = '
                     '["tensorboard", "wandb"] and metrics.project = "old"']  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"unknown tracker 'mlflow'; the known ones are tensorboard, wandb, trackio"
    ):
        trackers_of(cfg('metrics.trackers=["mlflow"]'))
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module as not importable
    with pytest.raises(ConfigError) as e:
        trackers_of(cfg('metrics.trackers=["wandb"]'))
    assert str(e.value) == (
        "metrics.trackers includes \"wandb\" but wandb is not installed: pip install 'gristmill[wandb]'"
    )


def test_missing_tracker_package_fails_before_any_work(dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)
    assert run_training(dataset, tmp_path / "run", ["trackio"]) == 2
    err = capsys.readouterr().err
    assert err == "error: metrics.trackers includes \"trackio\" but trackio is not installed: " \
                  "pip install 'gristmill[trackio]' (--set metrics.trackers=[\"trackio\"])\n"  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_git_commit_outside_git_is_none_and_silent(tmp_path, capfd):
    assert git_commit(tmp_path) is None
    assert capfd.readouterr() == ("", "")


def test_steps_trained_without_wandb_are_named_at_the_resume_that_takes_it_back(
    env, dataset, tmp_path, capsys
):
    """Steps trained by an invocation without wandb are never sent to its run, and the resume that
    continued it said nothing, its record then read as if every step were sent (trial RV59a F2)."""
    run_dir, steps = tmp_path / "run", "schedule.steps=12"
    assert run_training(dataset, run_dir, ["wandb"], steps, "run.max_steps=4") == 0
    wandb_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["id"]
    resume = 'checkpoint.resume="auto"'
    assert run_training(dataset, run_dir, ["tensorboard"], steps, "run.max_steps=8", resume) == 0
    capsys.readouterr()
    assert run_training(dataset, run_dir, ["wandb"], steps, resume) == 0
    out = capsys.readouterr().out
    assert f"wandb tracker: continued run {wandb_id}" in out, out
    assert (
        f"note: wandb's run {wandb_id} holds steps through 4; the rows of steps 5–8 (trained without it, or "
        "not taken before a stop) are not in it: metrics.jsonl has them"
    ) in out, out


def test_a_record_of_an_empty_project_is_a_run_s(tmp_path):
    """metrics.project = "" is a project wandb takes, and gristmill records it: its run resumes (the
    record's check refused it, and advised writing back the same record: review RV59d 2)."""
    from training.trackers import read_state

    state = {"wandb": {"id": "abc123", "project": "", "mode": "offline", "sent_through": 4}}
    (tmp_path / "trackers.json").write_text(json.dumps(state))
    assert read_state(tmp_path, ["wandb"], "") == state


def test_an_unreadable_trackers_json_is_refused_naming_the_run_to_continue(env, dataset, tmp_path, capsys):
    """A truncated RUN/trackers.json must not silently start a new wandb run on resume: one line
    says what happened, which run it was (from RUN/wandb) and how to continue it."""
    run_dir = tmp_path / "run"
    assert run_training(dataset, run_dir, ["wandb"], "run.max_steps=6") == 0
    shutil.rmtree(run_dir / "checkpoints" / "step-000006")  # a resume at 4 redoes steps 5 and 6
    ids = json.loads((run_dir / "trackers.json").read_text())
    wandb_id = ids["wandb"]["id"]
    text = (run_dir / "trackers.json").read_text()
    (run_dir / "trackers.json").write_text(text[: len(text) // 2])
    capsys.readouterr()
    kept = {name: (run_dir / name).read_bytes() for name in ("config.toml", "metrics.jsonl", "batches.bin")}
    # a changed key too: the refused attempt's overrides became the run's config.toml (review R14b M1)
    changed = ['checkpoint.resume="auto"', "optim.weight_decay=0.05"]
    assert run_training(dataset, run_dir, ["wandb"], *changed) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{run_dir / 'trackers.json'} is unreadable" in err and wandb_id in err
    assert "delete it to start new tracker runs" in err
    # JSON whose record is not a run's started a new run and recorded its id in place (trial RV59a F1)
    # (and a sent_through that is no step: a traceback after wandb resumed, review RV59d 3)
    for record in (
        "5",
        '{"project": "gm-test"}',
        f'{{"id": "{wandb_id}", "project": "gm-test", "sent_through": "4"}}',
    ):
        (run_dir / "trackers.json").write_text(f'{{"wandb": {record}}}')
        assert run_training(dataset, run_dir, ["wandb"], *changed) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and wandb_id in err, err
        said = (
            'unreadable (its "wandb" is not an object whose "id" and "project" are text (and "sent_through"'
        )
        assert said in err, err
    # a record that names its run, wrong elsewhere: the advice keeps its id, though RUN/wandb is gone
    # (it advised "<the run's id in wandb>": review RV59f 4)
    (run_dir / "wandb").rename(tmp_path / "wandb-aside")
    assert run_training(dataset, run_dir, ["wandb"], *changed) == 2
    assert (
        f'write {{"wandb": {{"id": "{wandb_id}", "project": "gm-test"}}}} into it' in capsys.readouterr().err
    )
    (tmp_path / "wandb-aside").rename(run_dir / "wandb")
    assert offline_ids(run_dir) == [wandb_id]  # no new wandb run was started
    # nor its records: rows and batches of the steps it would redo were dropped, its plan recorded
    # (beside config.toml kept, read as an edited config: review R14d F2)
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept
    # following the advice continues the same run, offline as it was (the advice left out the mode:
    # in a shell without WANDB_MODE the run then went online, or failed for want of a key, R14b L1)
    advice = json.loads(err.split("to continue them write ", 1)[1].split(" into it, ")[0])
    assert advice == {"wandb": {"id": wandb_id, "project": "gm-test", "mode": "offline"}}, err
    (run_dir / "trackers.json").write_text(json.dumps(advice))
    assert run_training(dataset, run_dir, ["wandb"], 'checkpoint.resume="auto"') == 0
    assert f"wandb tracker: continued run {wandb_id}" in capsys.readouterr().out
    assert offline_ids(run_dir) == [wandb_id, wandb_id]


def test_a_resume_keeps_the_wandb_mode_and_a_failed_start_leaves_no_event_file(env, dataset, tmp_path):
    """A resume in a new shell (a new process: wandb reads its environment once per process) with
    no WANDB_MODE and no API key continues the offline run; a fresh run that cannot start wandb
    leaves no tensorboard event file."""
    run_dir = tmp_path / "run"
    assert run_training(dataset, run_dir, ["wandb"], "run.max_steps=4") == 0
    wandb_id = json.loads((run_dir / "trackers.json").read_text())["wandb"]["id"]
    shell = {k: v for k, v in ENV.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}

    def cli(run: Path, trackers: list[str], *extra: str) -> subprocess.CompletedProcess:
        sets = recipe(dataset, run, "schedule.steps=8", "schedule.warmup_steps=2", "run.val_every=0")
        sets += ["metrics.plot=false", "checkpoint.interval=4"]
        sets += [f"metrics.trackers={json.dumps(trackers)}", 'metrics.project="gm-test"', *extra]
        cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
        return forked.run(cmd, cwd=ROOT, env=shell, timeout=240)

    done = cli(run_dir, ["wandb"], 'checkpoint.resume="auto"')
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wandb tracker: continued run {wandb_id} in project 'gm-test' (name 'run'); offline, as the " \
           "run was started (WANDB_MODE=online to sync from now on)" in done.stdout  # fmt: skip
    assert offline_ids(run_dir) == [wandb_id, wandb_id]

    fresh = tmp_path / "fresh"  # online with no key: wandb cannot start
    failed = cli(fresh, ["tensorboard", "wandb"], "run.max_steps=2")
    assert failed.returncode == 2 and "wandb could not start a run" in one_error_line(failed.stderr)
    assert "log in (wandb login) or set WANDB_MODE=offline" in failed.stderr  # a login failure's advice
    assert not list(fresh.rglob("events.out.tfevents*"))


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_tracker_that_fails_mid_run_costs_no_training_and_one_that_cannot_start_is_one_line(
    env, dataset, tmp_path, capsys
):
    """A tracker is a side activity: one that fails mid-run is a warning, no more rows to it, training
    to its last step. One run for both failures: wandb's service process (wandb-core) killed after
    step 3, as the OOM killer would (the next row's log raised, and the run ended with a traceback and
    everything since its last checkpoint lost), and RUN/tensorboard deleted then (a full disk, an NFS
    error fail the same way: the run said "training goes on", then ended in a KeyError traceback,
    exit 1, review R18d 1). RUN/tensorboard a file: a FileExistsError traceback (R18d 2f). The
    tensorboard writer thread's traceback before the warning: kept off stderr (review R26a F7)."""
    import os
    import signal
    import threading

    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"

    def fail_both() -> None:
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.01)
        for pid in wandb_services(os.getpid()):
            os.kill(pid, signal.SIGKILL)
        # the writer may add a file while rmtree walks the folder (its rmdir then fails: "Directory not
        # empty", seen on CI's loaded cores): remove until it is gone
        for _ in range(100):
            shutil.rmtree(run / "tensorboard", ignore_errors=True)
            if not (run / "tensorboard").exists():
                return
        raise AssertionError(f"{run / 'tensorboard'} could not be removed")

    failer = threading.Thread(target=fail_both, daemon=True)
    failer.start()
    trackers = ["tensorboard", "wandb"]
    assert run_training(dataset, run, trackers, "schedule.steps=40", "checkpoint.interval=20") == 0
    failer.join(timeout=60)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 41))
    out, err = capsys.readouterr()
    assert "WARNING: wandb failed at step" in out and "WARNING: tensorboard failed at step" in out, out
    # its writer thread's own traceback (15 lines) came first (review R26a F7): the warning says it
    assert "Traceback" not in err and "Exception in thread" not in err, err
    # What wandb's exit hook does when the process ends: it printed "Exception ignored in atexit
    # callback … ConnectionResetError" after the run had finished well.
    import wandb

    wandb.teardown()
    other = tmp_path / "other"
    other.mkdir()
    (other / "tensorboard").write_text("x")
    assert run_training(dataset, other, ["tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tensorboard could not start a run: "), err
    fix = f"make {other / 'tensorboard'} a writable directory, or drop tensorboard from metrics.trackers"
    assert err[0].endswith(fix), err


def test_a_resume_a_tracker_refuses_leaves_a_torn_metrics_line_and_says_nothing_of_it(
    dataset, tmp_path, capsys
):
    """A resume refused at its tracker's start (RUN/tensorboard a file) said "cut off the torn last line"
    of metrics.jsonl, which it then left as it was (trial RV61b F3). A refused resume leaves the run's
    files as they were and says nothing of them; the next resume cuts the line and says so."""
    run = tmp_path / "run"
    assert run_training(dataset, run, [], "run.max_steps=4") == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 4.')
    torn = (run / "metrics.jsonl").read_bytes()
    (run / "tensorboard").write_text("x")
    capsys.readouterr()
    assert run_training(dataset, run, ["tensorboard"], 'checkpoint.resume="auto"') == 2
    out, err = capsys.readouterr()
    assert "torn last line" not in out + err and (run / "metrics.jsonl").read_bytes() == torn, out
    (run / "tensorboard").unlink()
    assert run_training(dataset, run, ["tensorboard"], 'checkpoint.resume="auto"') == 0
    assert "cut off the torn last line" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))


def test_a_refused_resume_leaves_nothing_of_its_trackers(env, dataset, tmp_path, capsys):
    """A resume with an unknown eval task is refused before any tracker starts (it left a wandb run, an
    event file and wandb's sync lines after the error: trial RV70d 4); one whose tensorboard cannot start
    (a full disk under RUN/tensorboard) leaves no empty event file and no wandb run directory of the
    tracker started before it, and points wandb's latest-run back (RV70d 3)."""
    from tests.helpers.mounts import sh_quote, unshare_works
    from validation.train_eval import main as train_eval

    run = tmp_path / "run"
    trackers = ["tensorboard", "wandb"]
    assert run_training(dataset, run, trackers, "run.max_steps=4") == 0

    def kept() -> dict[str, str | bytes]:
        found = {str(p.relative_to(run)): str(p.readlink()) if p.is_symlink() else "" for p in run.rglob("*")}
        trackers_files = {k: v for k, v in found.items() if k.startswith(("wandb", "tensorboard"))}
        return {**trackers_files, **{n: (run / n).read_bytes() for n in ("trackers.json", "config.toml")}}

    before = kept()
    sets = recipe(dataset, run, "schedule.steps=8", "schedule.warmup_steps=2", "run.val_every=0")
    sets += [f"metrics.trackers={json.dumps(trackers)}", 'metrics.project="gm-test"', "metrics.plot=false"]
    sets += ["checkpoint.interval=4", 'checkpoint.resume="auto"']
    capsys.readouterr()
    assert (
        train_eval(["--config", TINY, "--set", *sets, "eval.interval=2", 'eval.tasks=["heldout_pll"]']) == 2
    )
    err = capsys.readouterr().err  # the last line, no wandb line after it
    assert err.startswith("error: unknown task heldout_pll; local tasks: ") and err.count("\n") == 1, err
    assert kept() == before

    if not unshare_works():
        pytest.skip("no private mount namespace here (unshare -rm) for a full disk under RUN/tensorboard")
    board = sh_quote(str(run / "tensorboard"))
    full = f"mount -t tmpfs -o size=4k tmpfs {board} && head -c 4096 /dev/zero > {board}/fill"
    listing = tmp_path / "listing"
    cmd = [sys.executable, "-m", "tests.helpers.mounts", full, f"ls -A {board} > {sh_quote(str(listing))}"]
    cmd += ["pipelines.cli", "train", "--config", TINY, "--set", *sets]
    failed = forked.run(cmd, cwd=ROOT, env=dict(os.environ), timeout=240)
    assert failed.returncode == 2, failed.stderr[-2000:]
    assert "tensorboard could not start a run: [Errno 28]" in one_error_line(failed.stderr), failed.stderr
    assert listing.read_text().split() == ["fill"]  # no empty event file on the full disk
    assert kept() == before  # no wandb run directory, its links as they were, trackers.json untouched


def test_a_trackio_store_that_cannot_be_written_is_said_not_recorded_as_sent(
    env, dataset, tmp_path, capsys, monkeypatch
):
    """Review R22f S5: trackio stores rows from a thread of its own, which keeps its errors: with its
    store under a file, the run said "local store …", trackio kept nothing, and trackers.json
    recorded every step as sent, exit 0. A store it cannot write at the start is one line before
    any step; one lost during the run is a warning at the end, and the record says what it kept."""
    if not env:
        pytest.skip("trackio is not installed, or was imported before TRACKIO_DIR was set")
    import threading

    import trackio.sqlite_storage as storage

    (tmp_path / "file").write_text("not a directory")
    unusable = tmp_path / "file" / "store"
    with monkeypatch.context() as mp:
        mp.setattr(storage, "TRACKIO_DIR", unusable)
        capsys.readouterr()
        assert run_training(dataset, tmp_path / "start", ["trackio"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "trackio could not start a run" in err and "TRACKIO_DIR" in err, err
        assert not (tmp_path / "start" / "metrics.jsonl").exists()

    run, original = tmp_path / "lost", storage.TRACKIO_DIR
    monkeypatch.setattr(storage, "TRACKIO_DIR", storage.TRACKIO_DIR)  # restored after the test

    def lose_the_store() -> None:  # as a disk unmounted mid-run would
        while not (
            (run / "metrics.jsonl").is_file() and len((run / "metrics.jsonl").read_text().splitlines()) >= 2
        ):
            time.sleep(0.01)
        storage.TRACKIO_DIR = unusable

    thread = threading.Thread(target=lose_the_store, daemon=True)
    thread.start()
    assert run_training(dataset, run, ["trackio"]) == 0
    thread.join(timeout=60)
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))
    out = capsys.readouterr().out
    said = re.search(r"WARNING: trackio stored steps through (\d+) of the 8 sent", out)
    assert said, out[-2000:]
    # what the store holds, not the higher count recorded row by row as they went (trial RV65c F3)
    recorded = json.loads((run / "trackers.json").read_text())["trackio"].get("sent_through", 0)
    assert recorded == int(said.group(1)) < 8, (recorded, said.group(0))
    if recorded == 0:  # a store found empty: a resume says its run holds no step (trial RV65f 7)
        storage.TRACKIO_DIR = original
        step_4 = json.dumps(str(run / "checkpoints" / "step-000004"))
        assert run_training(dataset, run, ["trackio"], f"checkpoint.resume={step_4}") == 0
        assert "holds no step; the rows of steps 1–4 (trained without it" in capsys.readouterr().out


# its writer thread's exception, kept and raised again at the next flush, is no thread's unhandled one
def test_a_resume_does_not_log_into_another_run_of_its_trackio_name(env, dataset, tmp_path, capsys):
    """Two run directories of the same name (…/a/same, …/b/same: the default run name) in one project:
    trackio resumes a run by its name, the newest of it, so a's resume logged its steps into b's run
    and recorded b's id as a's. Refused now, in one line naming both runs, before any tracker starts."""
    if not env:
        pytest.skip("trackio is not installed, or was imported before TRACKIO_DIR was set")
    a, b = tmp_path / "a" / "same", tmp_path / "b" / "same"
    assert run_training(dataset, a, ["trackio", "wandb"], "run.max_steps=4") == 0
    assert run_training(dataset, b, ["trackio"], "run.max_steps=2") == 0
    recorded = json.loads((a / "trackers.json").read_text())
    ida, idb = recorded["trackio"]["id"], json.loads((b / "trackers.json").read_text())["trackio"]["id"]
    b_logs = trackio_logs(idb)
    capsys.readouterr()
    assert run_training(dataset, a, ["trackio", "wandb"], 'checkpoint.resume="auto"') == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"is {idb}, another run's, not this run's {ida}" in err
    assert 'remove "trackio" from its trackers.json to start a new trackio run' in err
    assert trackio_logs(idb) == b_logs and sorted(trackio_logs(ida)) == [1, 2, 3, 4]
    assert json.loads((a / "trackers.json").read_text()) == recorded
    assert offline_ids(a) == [recorded["wandb"]["id"]]  # nor was wandb's run resumed for nothing


def test_a_changed_run_name_on_resume_says_the_name_trackio_keeps(env, dataset, tmp_path, capsys):
    """metrics.run_name set on a resume: wandb renames its run, trackio cannot (it finds the run to
    resume by its recorded name); the trackio line claimed the new name."""
    if not env:
        pytest.skip("trackio is not installed, or was imported before TRACKIO_DIR was set")
    run_dir = tmp_path / "named"
    assert run_training(dataset, run_dir, ["trackio", "wandb"], "run.max_steps=4") == 0
    ids = json.loads((run_dir / "trackers.json").read_text())
    capsys.readouterr()
    resume = ['checkpoint.resume="auto"', 'metrics.run_name="renamed"']
    assert run_training(dataset, run_dir, ["trackio", "wandb"], *resume) == 0
    out = capsys.readouterr().out
    tid, wid = ids["trackio"]["id"], ids["wandb"]["id"]
    assert f"trackio tracker: continued run {tid} in project 'gm-test' (name 'named')" in out, out
    assert "note: trackio continues the run under its recorded name 'named', not 'renamed'" in out
    assert f"wandb tracker: continued run {wid} in project 'gm-test' (name 'renamed')" in out
    now = json.loads((run_dir / "trackers.json").read_text())
    assert {t: r["id"] for t, r in now.items()} == {t: r["id"] for t, r in ids.items()}
    assert sorted(trackio_logs(tid)) == list(range(1, 9))


def test_the_advice_for_an_unreadable_trackers_json_names_no_other_runs_wandb_run(
    env, dataset, tmp_path, capsys, monkeypatch
):
    """WANDB_DIR shared by two runs: the advice for a's unreadable trackers.json named the newest
    wandb run there, b's, so following it continued b's wandb run with a's steps. It names a's run
    (its wandb directory's log shows a's run directory), or says it cannot tell."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("WANDB_DIR", str(shared))
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_training(dataset, a, ["wandb"], "run.max_steps=4") == 0
    assert run_training(dataset, b, ["wandb"], "run.max_steps=2") == 0
    ida = json.loads((a / "trackers.json").read_text())["wandb"]["id"]
    idb = json.loads((b / "trackers.json").read_text())["wandb"]["id"]
    (a / "trackers.json").write_text("{")
    capsys.readouterr()
    assert run_training(dataset, a, ["wandb"], 'checkpoint.resume="auto"') == 2
    err = capsys.readouterr().err
    assert ida in err and idb not in err, err
    advice = json.loads(err.split("to continue them write ", 1)[1].split(" into it, ")[0])
    assert advice == {"wandb": {"id": ida, "project": "gm-test", "mode": "offline"}}, err
    for d in (shared / "wandb").glob(f"offline-run-*-{ida}"):  # a's wandb run gone: no id to offer
        shutil.rmtree(d)
    assert run_training(dataset, a, ["wandb"], 'checkpoint.resume="auto"') == 2
    err = capsys.readouterr().err
    assert idb not in err and "shows this run directory: its id is unknown" in err, err


def test_a_hung_wandb_service_does_not_keep_a_finished_run_from_exiting(env, dataset, tmp_path):
    """wandb's service (wandb-core) stopped after step 3 (SIGSTOP: hung, as a wedged or swapped-out
    one is): the run trained to its last step, then waited in wandb's finish forever. The wait is
    bounded now (GRISTMILL_WANDB_FINISH_TIMEOUT, 30 s by default): a warning, exit 0, the run's
    record complete."""
    import os
    import signal

    run = tmp_path / "run"
    sets = recipe(dataset, run, "schedule.steps=12", "schedule.warmup_steps=2", "run.val_every=0")
    sets += ["metrics.plot=false", "checkpoint.interval=6", 'metrics.trackers=["wandb"]']
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    # the env fixture's wandb settings, not the service of this process's wandb runs (WANDB_SERVICE):
    # the run starts its own, to be stopped
    shell = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    shell |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = forked.popen(cmd, cwd=ROOT, env={**shell, "GRISTMILL_WANDB_FINISH_TIMEOUT": "3"})
    stopped: list[int] = []
    try:
        metrics = run / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.output()
            time.sleep(0.02)
        for pid in wandb_services(proc.pid):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        assert stopped
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        continue_services(stopped)  # resumed, it sees its run's process gone and exits with its monitor
    assert proc.returncode == 0, err[-2000:]
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 13))
    assert checkpoint_dir(run, 12).is_dir()
    assert "WARNING: wandb did not finish its run" in out and "within 3 s" in out, out[-2000:]
    # the summary's seconds are the run's, not the 3 s waited for wandb (review R18d 3): its last
    # row's time, give or take the last step (a fixed "< 3" failed on a loaded machine)
    summary = next(line for line in out.splitlines() if line.startswith("loss ") and " s" in line)
    trained = read_metrics(run)[-1]["elapsed_s"]
    assert int(re.search(r", (\d+) s", summary).group(1)) < trained + 2, (summary, trained)


def test_a_hung_tracker_never_holds_the_training_loop(env, dataset, tmp_path, capsys, monkeypatch):
    """Review R26a F1: wandb's service stopped mid-run (SIGSTOP: hung, as a wedged or swapped-out one
    is) with its socket full: `run.log`, called from the training loop, blocked the loop (no step, no
    checkpoint, a SIGTERM not acted on) for as long as the service hung. Each tracker's calls are on a
    thread of its own now: wandb is given up after GRISTMILL_TRACKER_TIMEOUT seconds with one warning
    naming it and the step, every step is trained and logged, the end not held by it."""
    import threading

    import wandb

    monkeypatch.setenv("GRISTMILL_TRACKER_TIMEOUT", "2")
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"
    stopped: list[int] = []
    ended, let_go = threading.Event(), threading.Event()

    def hang() -> None:
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            time.sleep(0.01)
        stopped.extend(hang_wandb(until=ended))

    def release() -> None:  # without the fix the run never ends: the service let go after 120 s
        if not ended.wait(120):
            let_go.set()
            continue_services(stopped)

    hanger = threading.Thread(target=hang, daemon=True)
    hanger.start()
    threading.Thread(target=release, daemon=True).start()
    try:
        start = time.monotonic()
        assert run_training(dataset, run, ["wandb"], "schedule.steps=80", "checkpoint.interval=40") == 0
        took = time.monotonic() - start
        assert not let_go.is_set(), "the run ended only once the hung wandb service was let go"
    finally:
        ended.set()
        continue_services(stopped)
        hanger.join(timeout=30)
        wandb.teardown()  # this process's next wandb run starts a service of its own
    assert stopped
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 81))
    assert checkpoint_dir(run, 80).is_dir()
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("WARNING: wandb")]
    assert len(warnings) == 1, out[-3000:]
    hung = int(
        re.search(r"has not returned from its log of step (\d+) within 2 s \(hung\)", warnings[0]).group(1)
    )
    assert "it gets no more rows this run, training goes on" in warnings[0]
    assert re.findall(r"^step +(\d+)", out, re.M)[-1] == "80"  # the step lines went on
    record = json.loads((run / "trackers.json").read_text())["wandb"]
    assert record["open"] is False and record.get("sent_through", 0) < hung, record  # never the hung row
    print(f"took {took:.1f} s, wandb hung at step {hung}", file=sys.stderr)


def test_a_killed_invocations_record_claims_no_row_its_tracker_did_not_take(env, tmp_path, capsys):
    """Review R26a F8: trackers.json of an invocation killed while a tracker was open was read as "sent
    every row metrics.jsonl has", and a resume sent it none of them again. Its rows now wait in a queue
    while the tracker is slow or hung: the open record says how far the tracker took them (the
    highest step whose log returned), row by row, never further. A tracker FEED_ROWS rows behind is
    given up, its record closed there."""
    import threading

    import wandb

    from training.trackers import FEED_ROWS, Trackers

    run = tmp_path / "run"
    run.mkdir()
    trackers = Trackers(run, MetricsSection(trackers=["wandb"], project="gm-test"), config={}, datasets={},
                        resume_step=None)  # fmt: skip
    stopped: list[int] = []
    ended = threading.Event()
    try:
        for step in (1, 2, 3):
            trackers.log({"step": step, "loss": 1.0})
            while trackers.trackers["wandb"].acked < step:  # taken before the next, as a slow loop's are
                time.sleep(0.01)
        stopped = hang_wandb(until=ended)
        time.sleep(2)  # its socket full by then
        rows = threading.Thread(target=lambda: [trackers.log({"step": s, "loss": 1.0}) for s in range(4, 11)])
        rows.start()
        rows.join(timeout=20)
        assert not rows.is_alive(), "a hung tracker held the loop"
        record = json.loads((run / "trackers.json").read_text())["wandb"]  # as a kill -9 now leaves it
        assert record["open"] is True and record["sent_through"] == 3, record
        capsys.readouterr()
        for step in range(11, 11 + FEED_ROWS):  # within the time bound (30 s): the queue fills first
            trackers.log({"step": step, "loss": 1.0})
        # step 4's log under way, 5 to FEED_ROWS + 4 queued
        out = capsys.readouterr().out
        behind = f"WARNING: wandb is {FEED_ROWS} rows behind at step {FEED_ROWS + 5} (hung or too slow)"
        assert out.startswith(behind), out
        record = json.loads((run / "trackers.json").read_text())["wandb"]
        assert record["open"] is False and record["sent_through"] == 3, record
    finally:
        ended.set()
        continue_services(stopped)
        trackers.close()
        wandb.teardown()  # this process's next wandb run starts a service of its own


@contextlib.contextmanager
def wandb_hung_after_row_1(run: Path):
    """A wandb-only Trackers of `run` that took row 1, then its service hung, its socket full
    (hang_wandb). Yields (trackers, resume): resume() continues the service. On the way out the service
    is continued, the trackers closed (again: closing twice is safe) and wandb torn down."""
    import threading

    import wandb

    from training.trackers import Trackers

    trackers = Trackers(run, MetricsSection(trackers=["wandb"], project="gm-test"), config={}, datasets={},
                        resume_step=None)  # fmt: skip
    ended, stopped = threading.Event(), []

    def resume() -> None:
        ended.set()
        continue_services(stopped)
        stopped.clear()

    try:
        trackers.log({"step": 1, "loss": 1.0})
        stopped += hang_wandb(until=ended)
        time.sleep(2)  # its socket full by then
        yield trackers, resume
    finally:
        resume()
        trackers.close()
        wandb.teardown()  # this process's next wandb run starts a service of its own


@pytest.mark.parametrize(
    "raised, shown", [(SystemExit(7), "SystemExit: 7"), (KeyboardInterrupt(), "KeyboardInterrupt")]
)  # one that says nothing: its name alone, not "KeyboardInterrupt: " (review RV54b 7)
@pytest.mark.parametrize("where", ["log", "finish"])
def test_a_tracker_ended_by_a_base_exception_is_said_as_one_that_raised(
    tmp_path, capsys, monkeypatch, raised, shown, where
):
    """A library's SystemExit (or a KeyboardInterrupt raised in it) in a tracker's log ended its thread
    unsaid: no row after it, no warning, then "did not finish its run within 30 s (it does not answer)"
    at the end, at once (trial RV53b 1); in its finish, it was raised out of the run's end. Said as any
    error is, and the run's end goes on."""
    from training.trackers import Tensorboard, Trackers

    own = getattr(Tensorboard, where)

    def ending(self, *args):
        if where == "finish" or args[1] == 3:
            raise raised
        return own(self, *args)

    monkeypatch.setattr(Tensorboard, where, ending)
    run = tmp_path / "run"
    run.mkdir()
    trackers = Trackers(
        run, MetricsSection(trackers=["tensorboard"]), config={}, datasets={}, resume_step=None
    )
    for step in range(1, 6):
        trackers.log({"step": step, "loss": 1.0})
        time.sleep(0.2)  # its thread takes the row before the next
    trackers.close()
    out, err = capsys.readouterr()
    said = (
        f"WARNING: tensorboard failed at step 3 ({shown}); it gets no more rows this run"
        if where == "log"
        else f"note: tensorboard did not finish cleanly: {shown}\n"
    )
    assert said in out and "does not answer" not in out, out
    assert "Traceback" not in err and "Exception in thread" not in err, err


@pytest.mark.parametrize("hung", ["finish", "log"])
def test_a_tracker_whose_finish_hangs_spends_no_other_tracker_s_time(
    env, tmp_path, monkeypatch, capsys, hung
):
    """The trackers' finishes shared one bound one after the other: a wandb that hung at the end spent
    it all, and a healthy tensorboard after it was called "not answering" (trial RV59a F5). They are
    asked together; only the hung one is said. A hung log whose queue is full (its finish cannot be
    queued) is asked last (review RV59f 3)."""
    import threading

    import training.trackers
    from training.trackers import Tensorboard, Trackers, Wandb

    monkeypatch.setenv("GRISTMILL_TRACKER_TIMEOUT", "5")  # ample beside a loaded machine's stalls
    released, own = threading.Event(), Tensorboard.finish
    if hung == "finish":
        monkeypatch.setattr(Wandb, "finish", lambda self, failed=False: released.wait(30))  # service hung
    else:
        monkeypatch.setattr(training.trackers, "FEED_ROWS", 1)  # one row in its log, one queued: full
        monkeypatch.setattr(Wandb, "log", lambda self, scalars, step: released.wait(30) if step > 1 else None)

    def slow(self, failed=False):  # a finish that takes a moment: a large event file's flush
        time.sleep(0.5)
        own(self, failed)

    monkeypatch.setattr(Tensorboard, "finish", slow)
    run = tmp_path / "run"
    run.mkdir()
    section = MetricsSection(trackers=["wandb", "tensorboard"], project="gm-test")
    trackers = Trackers(run, section, config={}, datasets={}, resume_step=None)
    trackers.log({"step": 1, "loss": 1.0})
    if hung == "log":
        feed = trackers.trackers["wandb"]
        while feed.acked < 1:  # row 1 taken
            time.sleep(0.01)
        trackers.log({"step": 2, "loss": 1.0})
        while feed.busy is None:  # row 2 in its hung log
            time.sleep(0.01)
        trackers.log({"step": 3, "loss": 1.0})  # its queue full
    try:
        trackers.close()
    finally:
        released.set()
    out = capsys.readouterr().out
    assert "WARNING: wandb " in out, out
    assert "tensorboard did not finish" not in out, out


def test_a_tracker_paused_shorter_than_the_bound_keeps_every_row(env, tmp_path, capsys):
    """A wandb service paused for a few seconds while a fast loop logged 300 rows was given up at the
    100th, and the rest of the run's rows never reached it though it came back (review RV26a R1). A
    pause within the time bound costs no row."""
    run = tmp_path / "run"
    run.mkdir()
    with wandb_hung_after_row_1(run) as (trackers, resume):
        for step in range(2, 301):
            trackers.log({"step": step, "loss": 1.0})
        resume()
        trackers.close()  # every row queued, then the finish, within the bound
    assert "WARNING" not in capsys.readouterr().out
    record = json.loads((run / "trackers.json").read_text())["wandb"]
    assert record["open"] is False and record["sent_through"] == 300, record


def test_the_end_waits_for_a_hung_call_only_what_is_left_of_its_bound(env, tmp_path, monkeypatch, capsys):
    """A call already hung when the run ends (a SIGTERM during the hang) was given a fresh bound at the
    end: a 30 s bound exited ~39 s after the signal, past a scheduler's 30 s grace (review RV26a R4).
    The end waits only what is left of the bound the call started with."""
    monkeypatch.setenv("GRISTMILL_TRACKER_TIMEOUT", "6")
    run = tmp_path / "run"
    run.mkdir()
    with wandb_hung_after_row_1(run) as (trackers, _):
        trackers.log({"step": 2, "loss": 1.0})  # its call hangs from now
        time.sleep(5)  # 5 of its 6 s gone
        started = time.monotonic()
        trackers.close()
        took = time.monotonic() - started
    assert "has not returned from its log of step 2" in capsys.readouterr().out
    assert took < 5, took  # ~1 s left of its bound, then the 2 s teardown; a fresh bound: 6 + 2


def test_a_reader_gone_while_wandb_starts_costs_no_run(env, dataset, tmp_path):
    """`gristmill train … 2>&1 | head -1` with wandb: wandb prints its start lines to stderr itself, not
    through the console, and the closed pipe raised BrokenPipeError out of wandb.init: "wandb could not
    start a run: [Errno 32] Broken pipe; log in …", exit 2, nothing trained (trial RV68a F1). The run
    trains, and wandb gets every row."""
    import os

    run = tmp_path / "run"
    sets = recipe(dataset, run, "schedule.steps=8", "schedule.warmup_steps=2", "run.val_every=0")
    sets += ["metrics.plot=false", 'metrics.trackers=["wandb"]', 'metrics.project="gm-test"']
    cmd = [sys.executable, "-m", "pipelines.cli", "train", "--config", TINY, "--set", *sets]
    # wandb's start lines printed (the fixture's WANDB_SILENT kept them back); its own service, not this
    # process's (WANDB_SERVICE). A plain process: forked.popen sends stderr to a file, never a pipe
    shell = {k: v for k, v in os.environ.items() if k not in ("WANDB_SILENT", "WANDB_SERVICE")}
    shell |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=shell, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.stdout.close()  # the reader gone before anything was printed
    assert proc.wait(timeout=240) == 0, sorted(p.name for p in run.iterdir()) if run.exists() else None
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 9))
    (w,) = wandb_runs(run)
    assert sorted(w["history"]) == list(range(1, 9))


def test_a_wandb_that_cannot_write_its_files_is_told_so_not_to_log_in(env, dataset, tmp_path, capsys):
    """RUN/wandb a file: "wandb could not start a run: [Errno 20] Not a directory: …; log in (wandb
    login) or set WANDB_MODE=offline" (trial RV68a F7). The login advice is for a login or network
    failure; this one names the directory to fix."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "wandb").write_text("x")
    assert run_training(dataset, run, ["wandb"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: wandb could not start a run: [Errno 20] Not a directory"), line
    fix = f"make {run / 'wandb'} a writable directory (WANDB_DIR moves it), or drop wandb from "
    fix += "metrics.trackers"
    assert line.endswith(fix) and "login" not in line, line


@pytest.mark.parametrize(
    "var, value",
    [("GRISTMILL_TRACKER_TIMEOUT", "abc"), ("GRISTMILL_TRACKER_TIMEOUT", "0"),
     ("GRISTMILL_TRACKER_TIMEOUT", "-1"), ("GRISTMILL_WANDB_FINISH_TIMEOUT", "inf")],
)  # fmt: skip
def test_a_tracker_timeout_that_is_no_number_above_0_is_refused_before_any_work(
    dataset, tmp_path, capsys, monkeypatch, var, value
):
    """GRISTMILL_TRACKER_TIMEOUT=abc was 30 s unsaid; =0 gave every tracker up at the end, wandb's file
    with no row while trackers.json said "sent_through": 12 (trial RV68a F8). Refused in one line
    naming the variable, before the run directory is made."""
    monkeypatch.delenv("GRISTMILL_TRACKER_TIMEOUT", raising=False)
    monkeypatch.setenv(var, value)
    run = tmp_path / "run"
    assert run_training(dataset, run, ["tensorboard"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {var}={value} is not a finite number of seconds above 0"), line
    assert line.endswith("set it to one, e.g. 30 (the default), or unset it"), line
    assert not run.exists()


def test_a_trackers_json_that_is_a_directory_is_one_line_and_costs_nothing(dataset, tmp_path, capsys):
    """RUN/trackers.json a directory, resumed with tensorboard only: an IsADirectoryError traceback from
    its write, exit 1 (trial RV68a F11). One line naming it and the fix; the run's files as they were."""
    run = tmp_path / "run"
    assert run_training(dataset, run, ["tensorboard"], "run.max_steps=4") == 0
    (run / "trackers.json").mkdir()
    (run / "trackers.json" / "kept").write_text("x")
    before = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert run_training(dataset, run, ["tensorboard"], 'checkpoint.resume="auto"') == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"error: {run / 'trackers.json'} is a directory; it must be the JSON file of the wandb/trackio runs "
        "a resume continues: move it out of the run directory and run again"
    )
    assert (run / "metrics.jsonl").read_bytes() == before and (run / "trackers.json" / "kept").is_file()
    assert not list(run.glob(".trackers.json.*.tmp"))


def test_a_copy_of_a_run_resumed_starts_tracker_runs_of_its_own_and_a_moved_one_continues(
    env, dataset, tmp_path, capsys
):
    """Trial RV68a F3: `cp -a RUN BRANCH`, BRANCH resumed with another setting, then RUN resumed: one
    trackio run held two curves of the same steps and the original's wandb run was renamed. A copy, whose
    original still names the same runs, starts its own; a moved run continues them."""
    trackers = ["wandb"] + (["trackio"] if env else [])
    orig, branch, moved = tmp_path / "orig", tmp_path / "branch", tmp_path / "moved"
    assert run_training(dataset, orig, trackers, "run.max_steps=4") == 0
    ids = json.loads((orig / "trackers.json").read_text())
    assert {ids[t]["run_dir"] for t in trackers} == {str(orig.resolve())}
    shutil.copytree(orig, branch, symlinks=True)
    shutil.copytree(orig, tmp_path / "board", symlinks=True)  # resumed with no copied tracker: unsaid
    capsys.readouterr()
    assert run_training(dataset, tmp_path / "board", ["tensorboard"], 'checkpoint.resume="auto"') == 0
    assert "is a copy of" not in capsys.readouterr().out
    assert run_training(dataset, branch, trackers, 'checkpoint.resume="auto"', "optim.weight_decay=0.5") == 0
    assert (
        f"note: {branch} is a copy of {orig.resolve()}, whose trackers.json names the same wandb/trackio "
        "runs, which stay that run's: new tracker runs here, holding none of steps 1–4 (metrics.jsonl has "
        "them)"
    ) in capsys.readouterr().out
    mine = json.loads((branch / "trackers.json").read_text())
    assert all(
        mine[t]["id"] != ids[t]["id"] and mine[t]["run_dir"] == str(branch.resolve()) for t in trackers
    )
    orig.rename(moved)
    assert run_training(dataset, moved, trackers, 'checkpoint.resume="auto"') == 0
    assert "is a copy of" not in capsys.readouterr().out
    back = json.loads((moved / "trackers.json").read_text())
    assert all(back[t]["id"] == ids[t]["id"] and back[t]["run_dir"] == str(moved.resolve()) for t in trackers)
    assert [sorted(w["history"]) for w in wandb_runs(moved)] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # its own directory under another path (a bind mount, another node's name for it): no copy
    record = (moved / "trackers.json").read_text()
    (moved / "trackers.json").write_text(
        record.replace(str(moved.resolve()), f"{moved.parent}/./{moved.name}")
    )
    assert run_training(dataset, moved, trackers, 'checkpoint.resume="auto"') == 0  # nothing to do
    assert "is a copy of" not in capsys.readouterr().out
    assert all(json.loads((moved / "trackers.json").read_text())[t]["id"] == ids[t]["id"] for t in trackers)
    if env:
        assert sorted(trackio_logs(ids["trackio"]["id"])) == list(range(1, 9))
        assert sorted(trackio_logs(mine["trackio"]["id"])) == [5, 6, 7, 8]
    else:
        pytest.skip("trackio's store was not checked (not installed, or imported before TRACKIO_DIR was set)")


def test_a_resume_sends_trackio_no_step_its_store_holds(env, dataset, tmp_path, capsys):
    """Trial RV68a F5: a kill -9 after trackio stored rows, before trackers.json recorded them, left the
    record short: the resume sent the redone steps again (one step stored twice) and its note named
    steps the store held as missing. What the store holds counts."""
    if not env:
        pytest.skip("trackio is not installed, or was imported before TRACKIO_DIR was set")
    run = tmp_path / "run"
    assert run_training(dataset, run, ["trackio"], "run.max_steps=5") == 0  # checkpoints at 4 and 5
    record = json.loads((run / "trackers.json").read_text())
    record["trackio"]["sent_through"] = 3  # as a kill leaves it: never ahead, maybe short
    (run / "trackers.json").write_text(json.dumps(record))
    capsys.readouterr()
    four = f"checkpoint.resume={json.dumps(str(checkpoint_dir(run, 4)))}"
    assert run_training(dataset, run, ["trackio"], four) == 0
    out = capsys.readouterr().out
    assert "holds steps through" not in out and "trackio was sent step 5 by an earlier invocation" in out, out
    logs = trackio_logs(record["trackio"]["id"])
    assert sorted(logs) == list(range(1, 9)) and all(len(rows) == 1 for rows in logs.values()), logs


def test_wandb_disabled_is_said_and_no_run_is_recorded(env, dataset, tmp_path, capsys, monkeypatch):
    """Trial RV68a F6: WANDB_MODE=disabled was said as "wandb tracker: new run …" and recorded as an
    online run holding the steps; the resume offline then "continued" it, steps 1–4 in no run, unsaid."""
    import wandb

    run = tmp_path / "run"
    wandb.teardown()  # wandb's settings are the process's until then (each invocation's are its own)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert run_training(dataset, run, ["wandb"], "run.max_steps=4") == 0
    out = capsys.readouterr().out
    assert "note: WANDB_MODE=disabled: wandb keeps nothing of this invocation" in out, out
    assert "wandb tracker:" not in out and not (run / "trackers.json").exists()
    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert run_training(dataset, run, ["wandb"], 'checkpoint.resume="auto"') == 0
    out = capsys.readouterr().out
    assert "wandb tracker: new run" in out, out
    assert [sorted(w["history"]) for w in wandb_runs(run)] == [[5, 6, 7, 8]]


def test_a_copy_with_the_original_s_run_name_leaves_the_original_its_trackio_run(
    env, dataset, tmp_path, capsys
):
    """Review RV68d 2: trackio finds the run to resume by its name; a copy's new trackio run of the same
    metrics.run_name made the original's next resume refused (the newest run of that name another's).
    The copy's is named apart, the note says so, and both resume their own."""
    if not env:
        pytest.skip("trackio is not installed, or was imported before TRACKIO_DIR was set")
    orig, branch = tmp_path / "orig", tmp_path / "branch"
    named = ['metrics.run_name="exp"', 'metrics.project="gm-copy"']
    assert run_training(dataset, orig, ["trackio"], *named, "run.max_steps=4") == 0
    shutil.copytree(orig, branch, symlinks=True)
    capsys.readouterr()
    assert (
        run_training(dataset, branch, ["trackio"], *named, "run.max_steps=6", 'checkpoint.resume="auto"') == 0
    )
    mine = json.loads((branch / "trackers.json").read_text())["trackio"]
    assert (
        mine["name"].startswith("exp-") and f"(trackio's named {mine['name']!r})" in capsys.readouterr().out
    )
    assert run_training(dataset, orig, ["trackio"], *named, 'checkpoint.resume="auto"') == 0
    assert run_training(dataset, branch, ["trackio"], *named, 'checkpoint.resume="auto"') == 0
    assert json.loads((branch / "trackers.json").read_text())["trackio"]["id"] == mine["id"]


def test_the_advice_for_a_wandb_start_failure_follows_its_cause(env, tmp_path):
    """Review RV68d 7: every OSError but a broken pipe was told to make RUN/wandb writable (a refused
    connection, a timeout, a full disk); a broken pipe, a ConnectionError too, must not be told to log in."""
    from training.trackers import _wandb_fix

    files = tmp_path / "wandb"
    advice = {
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"): "log in (wandb login)",
        TimeoutError("no reply"): "log in (wandb login)",
        BrokenPipeError(errno.EPIPE, "pipe"): "the terminal or pipe it printed to closed",
        OSError(errno.ENOSPC, "full"): f"free space on the disk of {files}",
        NotADirectoryError(errno.ENOTDIR, "file"): f"make {files} a writable directory",
        PermissionError(errno.EACCES, "denied"): f"make {files} a writable directory",
        ValueError("bad project name"): "fix what it names (metrics.project",
    }
    for error, says in advice.items():
        assert _wandb_fix(error, files).startswith(says), (error, _wandb_fix(error, files))
