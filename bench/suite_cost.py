"""What `make test` costs: CPU seconds (user + sys of `make test` and every process it waited for,
what `/usr/bin/time` reports) and wall time, on a fresh clone of each of two revisions, one after
the other on this machine, and the candidate's ratio to the baseline.

    python -m bench.suite_cost --baseline main --candidate HEAD --venv .venv

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


def measure(rev: str, folder: Path, venv: Path | None, log: Path) -> tuple[float, float, int]:
    """(CPU s, wall s, exit status) of `make test` on a fresh clone of `rev` in `folder`."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "-q", rev], check=True)
    make = ["make", "test"]
    if venv is not None:
        (folder / ".venv").symlink_to(venv.resolve())
        make = ["make", "-o", ".venv/.installed", "test"]
    env = {**os.environ, "PYTHONPATH": str(folder)}  # the clone's packages, not the venv's install
    print(f"{rev}: load {load()} before", flush=True)
    cpu0, t0 = children_cpu(), time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(make, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    cpu, wall = children_cpu() - cpu0, time.monotonic() - t0
    print(f"{rev}: load {load()} after; {cpu:.0f} CPU s, {wall:.0f} s wall, exit {done.returncode} ({log})")
    return cpu, wall, done.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the revision to compare against")
    parser.add_argument("--candidate", default="HEAD", help="the revision measured")
    parser.add_argument("--venv", type=Path, help="an existing virtualenv to link into each clone")
    parser.add_argument("--out", type=Path, help="where the clones and logs go (default: a temp folder)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="suite-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    revs = {}
    for name, rev in (("baseline", args.baseline), ("candidate", args.candidate)):
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        revs[name] = (rev, sha, *measure(sha, out / name, args.venv, out / f"{name}.log"))
    print(f"\nmachine: {os.cpu_count()} CPUs; `make test` on fresh clones, one after the other")
    print("| run | revision | CPU s (user + sys) | wall s | exit |")
    print("| --- | --- | --- | --- | --- |")
    for name, (rev, sha, cpu, wall, code) in revs.items():
        print(f"| {name} | {rev} ({sha}) | {cpu:.0f} | {wall:.0f} | {code} |")
    base, cand = revs["baseline"], revs["candidate"]
    print(f"candidate / baseline: CPU {cand[2] / base[2]:.2f}x, wall {cand[3] / base[3]:.2f}x")
    return max(base[4], cand[4])


if __name__ == "__main__":
    sys.exit(main())
