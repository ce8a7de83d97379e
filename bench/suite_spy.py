"""Where the suite's samples go by function, across every process it starts: a report of py-spy's raw
output (collapsed stacks, one line per stack and its sample count), inclusive per function, with
who calls a function and what it calls.

    py-spy record -r 25 --subprocesses --nonblocking -f raw -o /tmp/spy.txt -- \\
        .venv/bin/python -m pytest -q --dist loadgroup -n 3 --tier process
    python -m bench.suite_spy /tmp/spy.txt [--top 60] [--callers NAME] [--callees NAME] [--processes NAME]

bench/suite_by_test.py says which tests cost; this says which functions do, whatever test or process
runs them (a cost shared by every launch or every build shows as one line). py-spy counts a runnable
thread, so waits in C may count as samples: read shares, not CPU seconds. Nothing here asserts
anything.
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterator
from pathlib import Path

_PROCESS = "process "
_SITE = re.compile(r"\(/[^ ]*?(?:site-packages|lib/python3\.\d+)/")


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """(frames, samples) per line of py-spy's raw output; a process's command line may span lines."""
    pending = ""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            pending += line.rstrip("\n")
            head, _, count = pending.rpartition(" ")
            if ";" in head and count.isdigit():
                yield head.split(";"), int(count)
                pending = ""
            else:
                pending += " "


def frame_name(frame: str, line: bool = False) -> str:
    """A frame as `function (package/module.py)`, without the site-packages prefix or, unless asked,
    the line."""
    name = _SITE.sub("(", frame)
    return name if line else re.sub(r":\d+\)$", ")", name)


def report(path: Path, top: int, callers: str | None, callees: str | None, processes: str | None) -> None:
    inclusive: collections.Counter[str] = collections.Counter()
    related: collections.Counter[str] = collections.Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        code = [f for f in frames if not f.startswith(_PROCESS)]
        names = [frame_name(f) for f in code]
        for name in set(names):
            inclusive[name] += n
        target = callers or callees or processes
        hits = [i for i, name in enumerate(names) if target and target in name]
        if not hits:
            continue
        if processes:
            procs = [f for f in frames if f.startswith(_PROCESS)]
            related[re.sub(r'^process \d+:"', "", procs[-1])[:120] if procs else "?"] += n
        elif callers:
            i = hits[0]
            related[" <- ".join(frame_name(f, line=True) for f in reversed(code[max(0, i - 3) : i + 1]))] += n
        else:
            i = hits[-1]
            related[frame_name(code[i + 1], line=True) if i + 1 < len(code) else "(itself)"] += n
    print(f"{total} samples")
    if related:
        for key, n in related.most_common(top):
            print(f"{n:7d} {100 * n / total:5.1f}%  {key}")
        return
    for name, n in inclusive.most_common(top):
        print(f"{n:7d} {100 * n / total:5.1f}%  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="py-spy record -f raw output")
    parser.add_argument("--top", type=int, default=60)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--callers", metavar="NAME", help="the stacks above the first frame naming NAME")
    which.add_argument("--callees", metavar="NAME", help="what the last frame naming NAME calls")
    which.add_argument("--processes", metavar="NAME", help="the processes whose samples pass through NAME")
    args = parser.parse_args()
    report(args.raw, args.top, args.callers, args.callees, args.processes)


if __name__ == "__main__":
    main()
