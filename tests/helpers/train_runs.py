"""Runs of the tiny training recipe (configs/train/tiny.toml) for trainer and checkpoint tests: the
shared overrides and their uninterrupted run (trained once per test run), reading metrics.jsonl, the
torchrun command, waiting for a step, comparing two runs' checkpointed weights, a run's recorded
batches against `data inspect --hash` and `verify`, checking a run's one error line, a command
run where accelerate cannot be imported, and a checkpoint's files without training (fake_checkpoint)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import torch

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.shared import Shared
from training.checkpoint.hf_export import load_checkpoint_model
from training.checkpoint.io import checkpoint_keys, load
from training.checkpoint.state import rng_state
from training.contract.batch_record import read_batches
from training.contract.integrity import file_records
from training.contract.run_layout import COMPLETE_FILE, DCP_METADATA, checkpoint_dir
from training.train import load_train_config, train

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/train/tiny.toml")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
RECIPE_STEPS = 30  # recipe()'s schedule.steps
SHORT_STEPS = 12  # overrides()'s


def recipe(dataset: Path, run_dir: Path, *extra: str) -> list[str]:
    """Overrides shared by the in-process and the torchrun runs (so their batches are identical)."""
    return [
        f"data.dataset={json.dumps(str(dataset))}",
        f"run.output_dir={json.dumps(str(run_dir))}",
        f"schedule.steps={RECIPE_STEPS}",
        "run.log_every=1",
        "run.val_every=10",
        "parallel.param_dtype=float32",
        "run.threads=1",  # a tiny model gains nothing from more; robust on a busy 2-core machine
        "checkpoint.interval=0",  # saves only where a test asks for them (CI time); later sets win
        *extra,
    ]


def train_recipe(text: str, run_dir: Path) -> None:
    """Train the recipe `text` in this process from recipe.toml beside `run_dir` (the run directory
    it names): a shared run's `train` (tests/helpers/shared.py)."""
    config = run_dir.with_name("recipe.toml")
    config.write_text(text)
    assert gristmill(["train", "--config", str(config)]) == 0


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def overrides(dataset: Path, run_dir: Path, *extra: str) -> list[str]:
    """recipe(), shortened: 12 steps, no validation, a checkpoint every 4 steps."""
    base = ["schedule.warmup_steps=3", "run.val_every=0", "metrics.tensorboard=false", "metrics.plot=false"]
    return recipe(dataset, run_dir, f"schedule.steps={SHORT_STEPS}", *base, "checkpoint.interval=4", *extra)


def whole_run(shared: Shared, dataset: Path) -> Path:
    """`overrides(dataset, RUN)` trained to its end in one process: the uninterrupted run that
    stopped, killed or resumed runs of the same overrides are compared with, trained once per test
    run (tests/helpers/shared.py; read-only)."""

    def train_here(sets: list[str], _) -> None:
        train(load_train_config(TINY, sets), out=io.StringIO())

    return shared.run("1-process", lambda run: overrides(dataset, run), train_here)


def torchrun_cmd(sets: list[str], nproc: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return cmd + ["-m", "training.train", "--config", TINY, "--set", *sets]


def run_torchrun(sets: list[str]) -> subprocess.CompletedProcess:
    """A 2-rank tiny run, forked (its workers too), that must exit 0; its output for the caller."""
    proc = forked.run(torchrun_cmd(sets), cwd=ROOT, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl of a run that may still be writing it (none yet, a torn last line)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def losses(run_dir: Path) -> list[tuple[int, float, float, float, int, float | None]]:
    """Each step's (step, loss, grad norm, lr, tokens seen, update ratio). The update ratio is the one
    figure of the last step that the optimizer's state decides (a loss is taken before its step's
    update): a run resumed for its last step alone, with the moments lost, logged the same losses."""
    return [
        (r["step"], r["loss"], r["grad_norm"], r["lr"], r["tokens_seen"], r["update_ratio"])
        for r in metrics(run_dir)
    ]


def assert_same_checkpoint(run_a: Path, run_b: Path, step: int) -> None:
    """Checkpoint `step` of the two runs holds the same weights and, for each rank both saved, the same
    random states (torch's CPU stream, Python's and NumPy's: what run.seed seeds and a resume restores;
    an in-loop export that drew from torch's left a resumed run's differing, review RV50a F2; Python's
    and NumPy's were the process's own, trial RV55b 4)."""
    a, _, _ = load_checkpoint_model(run_a, step)
    b, _, _ = load_checkpoint_model(run_b, step)
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(ta, tb), name
    ranks = _rng_keys(run_a, step) & _rng_keys(run_b, step)
    assert ranks, f"no rank's random state in both runs' step {step}"
    for key in sorted(ranks):
        ra, rb = _saved_rng(run_a, step, key), _saved_rng(run_b, step, key)
        for stream in ("torch_cpu", "python_key", "numpy_key"):
            assert torch.equal(ra[stream], rb[stream]), f"step {step}'s {key}.{stream} differs"


def _rng_keys(run: Path, step: int) -> set[str]:
    keys = checkpoint_keys(checkpoint_dir(run, step))
    return {k.split(".")[1] for k in keys if k.startswith("train_state.rng_rank")}


def _saved_rng(run: Path, step: int, key: str) -> dict:
    box = {"train_state": {key: rng_state()}}  # this process's streams: the shapes the saved ones have
    load(box, checkpoint_dir(run, step), no_dist=True)
    return box["train_state"][key]


def wait_for_step(proc: subprocess.Popen | forked.Forked, run_dir: Path, step: int) -> None:
    deadline = time.time() + 240
    while not metrics(run_dir) or metrics(run_dir)[-1]["step"] < step:
        assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()[0][-2000:]}"
        assert time.time() < deadline
        time.sleep(0.005)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def damage(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place: the size stays, only a checksum can tell."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def recorded_batches(run_dir: Path, name: str = "batches.bin") -> list[tuple[int, int, str]]:
    """RUN/batches.bin (or batches-discarded.bin) as (step, attempt, sha256), whole records only."""
    entries, note = read_batches(run_dir / name)
    assert note is None, note
    return [(e.step, e.attempt, e.sha256) for e in entries]


def command_output(argv: list[str]) -> tuple[int, str]:
    """(exit status, stdout) of a gristmill command run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = gristmill(argv)
    return rc, out.getvalue()


def inspected_hashes(run_dir: Path, first: int, end: int) -> dict[int, str]:
    """`gristmill data inspect RUN --hash --step first --end end`: {step: sha256}, one process."""
    rc, out = command_output(
        ["data", "inspect", str(run_dir), "--hash", "--step", str(first), "--end", str(end)]
    )
    assert rc == 0, out
    return {int(line.split()[0]): line.split()[1] for line in out.splitlines() if not line.startswith("#")}


def assert_batches_as_inspected(run_dir: Path) -> dict[int, str]:
    """Every trained step's digest, in metrics.jsonl's rows (kept and discarded) and in both batch
    records, is the one `data inspect RUN --hash` prints for that step; `gristmill verify RUN`
    agrees and says nothing of the batches. Returns inspect's {step: sha256}."""
    rows = [r for r in metrics(run_dir) if "loss" in r]
    records = recorded_batches(run_dir) + recorded_batches(run_dir, "batches-discarded.bin")
    last = max([s for s, _, _ in records] + [r["step"] for r in rows])
    planned = inspected_hashes(run_dir, 1, last + 1)
    assert [(r["step"], r["batch_sha256"]) for r in rows] == [(r["step"], planned[r["step"]]) for r in rows]
    assert [(s, sha) for s, _, sha in records] == [(s, planned[s]) for s, _, _ in records]
    rc, out = command_output(["verify", str(run_dir)])
    assert rc == 0 and "batch" not in out, out
    return planned


def eval_data(run_dir: Path) -> Path:
    """RUN/eval/data/<settings>: the local tasks' data folder of the run's one eval settings."""
    (folder,) = (p for p in (run_dir / "eval" / "data").iterdir() if p.is_dir())
    return folder


def without_accelerate(argv: list[str], entry: str = "pipelines.cli") -> subprocess.CompletedProcess:
    """`gristmill ARGV` (or `python -m ENTRY ARGV`) in a Python where accelerate cannot be imported (as
    without the eval extra): forked (tests/helpers/no_accelerate.py)."""
    cmd = [sys.executable, "-m", "tests.helpers.no_accelerate", entry, *argv]
    return forked.run(cmd, cwd=ROOT, timeout=300)


def fake_checkpoint(run: Path, step: int, *, metadata: bool = True, complete: bool = True) -> Path:
    """Checkpoint `step` of `run` as its files say, with no weights in them: a shard, DCP metadata
    (`metadata`) and a COMPLETE recording both (`complete`): one that verifies (verify_checkpoint)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = checkpoint_dir(run, step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if metadata:
        (path / DCP_METADATA).write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    if complete:
        files = file_records(path, [p.name for p in path.iterdir()], "crc32")
        (path / COMPLETE_FILE).write_text(json.dumps({"step": step, "files": files}))
    return path
