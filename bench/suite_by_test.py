"""Where the suite's CPU goes, per test: a pytest plugin that records, for each test, the CPU seconds
of the xdist worker's whole process tree over it (the worker, the processes it waited for, and its
live descendants: forked runs, torchrun agents and workers, build workers), then a report by module
and by test.

    SUITE_BY_TEST_OUT=/tmp/by-test.jsonl make test PYTEST_ARGS="-p bench.suite_by_test"
    python -m bench.suite_by_test /tmp/by-test.jsonl [--top 40]

A test's figure includes the session fixtures it was the first to need (a shared build, a server);
processes that outlive their test and that nobody waits for (Ray's daemons) count only while a test
runs. Read from /proc (Linux); nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

import pytest

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU s of the process and of the children it waited for), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime


def tree_cpu(root: int) -> float:
    """CPU seconds of `root` and its live descendants (each one's reaped children included)."""
    stats = {pid: s for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if (s := _stat(pid))}
    children = collections.defaultdict(list)
    for pid, (parent, _) in stats.items():
        children[parent].append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo += children[pid]
    return total


def _write(record: dict) -> None:
    out = os.environ.get("SUITE_BY_TEST_OUT")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = tree_cpu(os.getpid()), time.monotonic()
    yield
    _write({"test": item.nodeid, "cpu": tree_cpu(os.getpid()) - cpu, "wall": time.monotonic() - wall})


def pytest_sessionfinish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # the worker's whole tree: its start-up and collection are the part no test holds
        _write({"worker": worker, "cpu": tree_cpu(os.getpid())})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("records", type=Path, help="the SUITE_BY_TEST_OUT file of a `make test`")
    p.add_argument("--top", type=int, default=40, help="how many tests to list")
    args = p.parse_args()
    rows = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    tests = [r for r in rows if "test" in r]
    workers = sum(r["cpu"] for r in rows if "worker" in r)
    in_tests = sum(r["cpu"] for r in tests)
    print(f"{len(tests)} tests: {in_tests:.0f} CPU s inside tests; the workers' trees {workers:.0f} CPU s")
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for r in tests:
        m = modules[r["test"].split("::")[0]]
        m[0] += r["cpu"]
        m[1] += 1
    print("\n| module | tests | CPU s | share |\n| --- | --- | --- | --- |")
    for name, (cpu, n) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        if cpu >= 0.01 * in_tests:
            print(f"| {name} | {n} | {cpu:.1f} | {cpu / in_tests:.1%} |")
    print("\n| test | CPU s | wall s |\n| --- | --- | --- |")
    for r in sorted(tests, key=lambda r: -r["cpu"])[: args.top]:
        print(f"| {r['test']} | {r['cpu']:.1f} | {r['wall']:.1f} |")


if __name__ == "__main__":
    main()
