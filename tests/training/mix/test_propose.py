"""`gristmill mix propose` end to end on two small synthetic sources: real proxy training runs (the
tiny model, in spawned workers), the outputs, reuse of finished runs, an unfinished run trained
again, and a rebuilt source whose old evidence is never used; bad recipes refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from tests.helpers.train_data import make_dataset

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[3]
REPORT_FIELDS = {
    *("sources", "prior", "proposal", "swarm", "fit", "predicted", "validation", "gate_returned_prior"),
    "fingerprints",
}


def recipe(tmp: Path, sources: dict[str, Path]) -> Path:
    """The demo recipe's shape at the tiny scale: 6 steps of 16 × 32 tokens per proxy, 4 proxies,
    one validation seed, one worker (CI's 2 cores run two test processes)."""
    text = "".join(f'[[data.sources]]\nname = "{n}"\ndataset = "{p}"\n\n' for n, p in sources.items())
    text += """
[data]
val_fraction = 0.1

[target]
mix = { web = 0.2, code = 0.8 }

[proxy]
preset = "tiny"
tokens = 3072
seq_len = 32
global_batch_tokens = 512
micro_batch = 16
warmup_steps = 2
val_batches = 1
parallel = 1
set = ["parallel.param_dtype=float32", "run.device=cpu"]

[swarm]
size = 4

[constraints]
min_weight = 0.1
max_weight = 0.9

[validation]
seeds = [1]
"""
    path = tmp / "mix.toml"
    path.write_text(text)
    return path


def command(config: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.cli",
        "mix",
        "propose",
        "--config",
        str(config),
        "--out",
        str(out),
    ]


def propose(config: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*command(config, out), *flags], cwd=ROOT, capture_output=True, text=True)


def make_sources(root: Path) -> dict[str, Path]:
    return {
        "web": make_dataset(root / "web", n_docs=240, seed=1),
        "code": make_dataset(root / "code", n_docs=200, seed=2),
    }


@pytest.fixture(scope="module")
def shared_sources(synthetic_dataset) -> dict[str, Path]:
    return {"web": synthetic_dataset(n_docs=240, seed=1), "code": synthetic_dataset(n_docs=200, seed=2)}


def test_propose_runs_reuses_and_never_mixes_evidence_across_a_rebuild(tmp_path):
    sources = make_sources(tmp_path)
    config, out = recipe(tmp_path, sources), tmp_path / "search"
    first = propose(config, out)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report) == REPORT_FIELDS
    assert report["sources"] == ["web", "code"] and len(report["swarm"]) == 4
    assert not any(e["reused"] for e in report["swarm"])
    for e in report["swarm"]:  # each entry is what its run recorded
        rows = [json.loads(line) for line in (Path(e["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == 6
        assert e["per_source_loss"] == {"web": rows[-1]["val/web"], "code": rows[-1]["val/code"]}
        assert e["target_loss"] == pytest.approx(0.2 * rows[-1]["val/web"] + 0.8 * rows[-1]["val/code"])
        assert sum(e["mix"].values()) == pytest.approx(1.0) and min(e["mix"].values()) >= 0.1 - 1e-9
    v = report["validation"]
    assert v["seeds"] == [1] and all(len(v[k]) == 1 for k in ("proposal", "uniform", "proportional"))
    passed = v["proposal"][0] < min(v["uniform"][0], v["proportional"][0])
    assert report["gate_returned_prior"] is (not passed)
    returned = report["prior"] if report["gate_returned_prior"] else report["proposal"]
    mix = tomllib.loads((out / "proposal.toml").read_text())["mix"]
    assert mix == pytest.approx(returned, abs=1e-4)
    assert (out / "mix.png").stat().st_size > 10_000

    # A rerun trains only what is missing: one run left unfinished (no last row), the rest reused.
    gone = Path(report["swarm"][1]["run_dir"])
    (gone / "metrics.jsonl").unlink()
    kept = Path(report["swarm"][0]["run_dir"]) / "metrics.jsonl"
    stamp = kept.stat().st_mtime_ns
    second = propose(config, out)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"swarm/p01: unfinished: no metrics.jsonl in {gone}; training it again" in second.stdout
    assert "3 of 4 reused" in second.stdout and "3 of 3 reused" in second.stdout
    again = json.loads((out / "report.json").read_text())
    assert [e["reused"] for e in again["swarm"]] == [True, False, True, True]
    assert kept.stat().st_mtime_ns == stamp
    assert [e["run_dir"] for e in again["swarm"]] == [e["run_dir"] for e in report["swarm"]]

    # The code source rebuilt (other documents): no run of the old datasets counts, each slot whose
    # recipe is unchanged says why it trains again, and the old runs stay on disk. --write-commands
    # (the cluster's path) lists every proxy as missing instead of training them.
    shutil.rmtree(sources["code"])
    make_dataset(sources["code"], n_docs=200, seed=7)
    third = propose(config, out, "--write-commands")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "reused" not in third.stdout
    commands = (out / "commands.sh").read_text().splitlines()
    trains = [line for line in commands if line.startswith("gristmill train --config ")]
    assert len(trains) == 4 and all("# swarm/p0" in line for line in trains)
    old_dirs = {e["run_dir"] for e in report["swarm"]}
    assert (
        not (out / "report.json").exists() and not (out / "proposal.toml").exists()
    )  # none outlives its data
    for line in trains:
        recipe_path = Path(line.split()[3])
        assert recipe_path.is_file() and str(recipe_path.with_suffix("")) not in old_dirs
        slot = recipe_path.name[:3]
        old = next(Path(d) for d in old_dirs if Path(d).name.startswith(slot))
        if (recipe_path.with_suffix("").name != old.name) and _same_mix(recipe_path, old):
            assert f"swarm/{slot}: source 'code' was rebuilt since" in third.stdout
    assert "swarm/p03: source 'code' was rebuilt since" in third.stdout  # at the bound: the same mixture
    assert all(Path(d).is_dir() for d in old_dirs)


def _same_mix(recipe_path: Path, old_run: Path) -> bool:
    mix = tomllib.loads(recipe_path.read_text())["phase"][0]["mix"]
    return mix == tomllib.loads((old_run / "config.toml").read_text())["phase"][0]["mix"]


@pytest.mark.parametrize(
    "sets, says",
    [
        (
            ["target.mix={ web = 0.2, math = 0.8 }"],
            "target.mix.math: unknown source 'math'; the sources are web, code",
        ),
        (["target.mix={ web = 0.2, code = 1.5 }"], "target.mix.code = 1.5: a weight must be in [0, 1]"),
        (["constraints.min_weight=-0.1"], "constraints.min_weight = -0.1: a weight must be in [0, 1]"),
        (
            ["constraints.max_weight=0.3"],
            "constraints.min_weight = 0.1 and max_weight = 0.3: no mixture of 2 sources",
        ),
        (["swarm.size=3"], "swarm.size = 3: at least 4 for 2 sources"),
        (
            ["proxy.tokens=200000"],
            "proxy.tokens = 200000 would read a source past its max_epochs in every mixture",
        ),
        (
            ["constraints.run_tokens=1e6"],
            "constraints.run_tokens = 1e+06 would read a source past its max_epochs",
        ),
        (["proxy.set=['optim.lrr=1']"], "optim.lrr"),
        (["proxy.set=['run.output_dir=\"x\"']"], "run.output_dir is the search's own"),
        (["target.source=code"], "[target]: give one of target.mix"),
        (["swarm.sizes=3"], "swarm.sizes"),
    ],
)
def test_a_bad_recipe_is_one_line_before_any_run(tmp_path, shared_sources, capsys, sets, says):
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out), "--set", *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.startswith("error: ") and "\n" not in err, err
    assert not (out / "swarm").exists()


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_a_killed_search_leaves_no_worker_training(tmp_path):
    """kill -9 of `mix propose` (or its terminal gone): its workers stop within a moment instead of
    training on for nothing (training.run.shutdown.exit_with_parent as the pool's initializer)."""
    sources = {
        "web": make_dataset(tmp_path / "web", n_docs=1500, seed=1),
        "code": make_dataset(tmp_path / "code", n_docs=1500, seed=2),
    }
    config, out = recipe(tmp_path, sources), tmp_path / "search"
    proc = subprocess.Popen(
        [*command(config, out), "--set", "proxy.tokens=150000"], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not any("step " in p.read_text() for p in out.glob("swarm/*/train.log")):
            assert proc.poll() is None and time.monotonic() < deadline, "no proxy started training"
            time.sleep(0.2)
        workers = [
            pid
            for pid in _children(proc.pid)
            if "multiprocessing" in Path(f"/proc/{pid}/cmdline").read_text()
        ]
        assert workers
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while [pid for pid in workers if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "a worker outlived its search"
