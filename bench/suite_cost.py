"""What `make test` costs: CPU seconds (user + sys of `make test` and every process it waited for,
what `/usr/bin/time` reports) and wall time, on a fresh clone of each of two revisions, one after
the other on this machine, and the candidate's ratio to the baseline.

    python -m bench.suite_cost --baseline main --candidate HEAD --venv .venv [--same-tests]

`--same-tests` adds a third run: the candidate restricted to the baseline's tests (bench/suite_only.py),
what the checks of the baseline cost now; a suite that grows (tests for new behaviour, for bugs found
since) moves the first ratio, not this one. A baseline test is its node id in the candidate, else every
parametrization of its function there (parameters renamed or split), else of the function RENAMED
names; any left without one are printed. A test kept may check more than it did.

CPU seconds are the figure to compare on a shared machine: wall time moves with everyone else's
load (printed before and after each run), CPU time much less. Processes a run leaves behind (a
datatrove or Ray daemon no one waits for) are in neither figure, as with `/usr/bin/time`.
`--venv` links an existing virtualenv into each clone (`make -o` keeps make from reinstalling into
it); without it, each clone's `make test` builds its own.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(
    rev: str, folder: Path, venv: Path | None, log: Path, only: Path | None = None
) -> tuple[float, float, int]:
    """(CPU s, wall s, exit status) of `make test` on a fresh clone of `rev` in `folder`; `only`: a
    file of the node ids to run (bench/suite_only.py), every test without it."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "-q", rev], check=True)
    make = ["make", "test"]
    if venv is not None:
        (folder / ".venv").symlink_to(venv.resolve())
        make = ["make", "-o", ".venv/.installed", "test"]
    env = {**os.environ, "PYTHONPATH": str(folder)}  # the clone's packages, not the venv's install
    if only is not None:
        env.update(SUITE_ONLY=str(only), PYTEST_ARGS=f"{env.get('PYTEST_ARGS', '')} -p bench.suite_only")
    print(f"{rev}: load {load()} before", flush=True)
    cpu0, t0 = children_cpu(), time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(make, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    cpu, wall = children_cpu() - cpu0, time.monotonic() - t0
    print(f"{rev}: load {load()} after; {cpu:.0f} CPU s, {wall:.0f} s wall, exit {done.returncode} ({log})")
    return cpu, wall, done.returncode


# Tests of issue 48's baseline (2c01905) renamed since, function to function (git log -S finds each).
RENAMED = {
    "tests/test_object_storage.py::test_build_writes_to_the_bucket_and_readers_get_the_local_bytes":
        "tests/test_object_storage.py::test_build_into_a_bucket_uploads_from_every_task_and_readers_get_the_local_bytes",
    "tests/training/test_launch_exits.py::test_one_ctrl_c_under_torchrun_saves_and_exits_0":
        "tests/training/test_launch_exits.py::test_one_ctrl_c_saves_and_exits_0",
}  # fmt: skip


def test_ids(folder: Path) -> list[str]:
    """The node ids of the tests the clone in `folder` collects (its `make test` ran: its virtualenv
    is there)."""
    env = {**os.environ, "PYTHONPATH": str(folder), "GRISTMILL_TEST_SHARED": str(folder / ".collect")}
    python = str(folder / ".venv" / "bin" / "python")
    listing = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=folder, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line for line in listing.splitlines() if line.startswith("tests/") and "::" in line]


def same_tests(baseline: list[str], candidate: list[str]) -> tuple[list[str], list[str]]:
    """(the candidate's tests that hold the baseline's checks, the baseline's tests none holds)."""
    function = lambda node: node.partition("[")[0]
    by_function: dict[str, list[str]] = {}
    for node in candidate:
        by_function.setdefault(function(node), []).append(node)
    ids, missing = set(candidate), []
    kept: dict[str, None] = {}
    for node in baseline:
        name = function(node)
        found = [node] if node in ids else by_function.get(name) or by_function.get(RENAMED.get(name, ""))
        if found:
            kept.update(dict.fromkeys(found))
        else:
            missing.append(node)
    return list(kept), missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the revision to compare against")
    parser.add_argument("--candidate", default="HEAD", help="the revision measured")
    parser.add_argument("--venv", type=Path, help="an existing virtualenv to link into each clone")
    parser.add_argument("--out", type=Path, help="where the clones and logs go (default: a temp folder)")
    parser.add_argument(
        "--same-tests", action="store_true", help="also the candidate on the baseline's tests alone"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="suite-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    revs = {}
    for name, rev in (("baseline", args.baseline), ("candidate", args.candidate)):
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        revs[name] = (rev, sha, *measure(sha, out / name, args.venv, out / f"{name}.log"))
    if args.same_tests:
        baseline = test_ids(out / "baseline")
        kept, missing = same_tests(baseline, test_ids(out / "candidate"))
        ids = out / "same-ids.txt"
        ids.write_text("".join(f"{node}\n" for node in kept))
        print(f"the baseline's {len(baseline)} tests are {len(kept)} of the candidate's ({ids})", flush=True)
        for node in missing:
            print(f"  not in the candidate: {node}", flush=True)
        rev, sha = revs["candidate"][:2]
        name = "candidate, the baseline's tests"
        revs[name] = (rev, sha, *measure(sha, out / "same", args.venv, out / "same.log", only=ids))
    print(f"\nmachine: {os.cpu_count()} CPUs; `make test` on fresh clones, one after the other")
    print("| run | revision | CPU s (user + sys) | wall s | exit |")
    print("| --- | --- | --- | --- | --- |")
    for name, (rev, sha, cpu, wall, code) in revs.items():
        print(f"| {name} | {rev} ({sha}) | {cpu:.0f} | {wall:.0f} | {code} |")
    base = revs["baseline"]
    for name, run in revs.items():
        if name != "baseline":
            print(f"{name} / baseline: CPU {run[2] / base[2]:.3f}x, wall {run[3] / base[3]:.3f}x")
    return max(run[4] for run in revs.values())


if __name__ == "__main__":
    sys.exit(main())
