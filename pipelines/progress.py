"""Build progress: each task writes a small JSON file now and then; the driver sums them up.

A task's reader and its tokenize-and-shard step share one `TaskProgress` (datatrove pickles the
whole pipeline at once, so the two steps keep pointing at the same object inside a task). The
task writes `logs/progress/NNNNN.json` and logs a line every `interval` seconds (into its task
log; on Slurm that is all a user gets); the local driver also runs `Monitor`, which reads every
task's file and shows one line of docs/s, tokens/s, tasks done and an ETA from the input bytes
consumed. `build_table` is what the build prints at the end.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from datatrove.utils.logging import logger
from tqdm import tqdm

from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import decontaminate_record, finished_tasks


def _fmt(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


def _fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class TaskProgress:
    """Counters of one task, flushed to `folder/NNNNN.json` at most every `interval` seconds."""

    def __init__(self, folder: str | Path, interval: float = 10.0):
        self.folder = str(folder)
        self.interval = interval
        self.rank = -1

    def start(self, rank: int) -> None:
        self.rank = rank
        self.read = self.kept = self.tokens = 0
        self.bytes_done = 0.0
        self.phase = "reading"
        self.t0 = self._last = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def state(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "phase": self.phase,
            "read": self.read,
            "kept": self.kept,
            "tokens": self.tokens,
            "bytes_done": self.bytes_done,
            "elapsed": time.monotonic() - self.t0,
            "time": time.time(),
        }

    def flush(self, log: bool = True) -> None:
        self._last = time.monotonic()
        state = self.state()
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"{self.rank:05d}.json")
        # Atomic, so the monitor never reads half a file; not fsynced: it is rewritten every
        # `interval` seconds and only drives the progress line, so a power loss costs nothing.
        write_atomic(path, json.dumps(state), fsync=False)
        if log:
            el = max(state["elapsed"], 1e-9)
            logger.info(
                f"task {self.rank} {self.phase}: {self.read} docs read, {self.kept} kept, "
                f"{_fmt(self.tokens)} tokens ({_fmt(self.read / el)} docs/s, {_fmt(self.tokens / el)} tok/s)"
            )


class Monitor:
    """Driver-side thread summing every task's progress file into one line while tasks run locally.

    On a terminal (`live`) the line is a tqdm bar rewritten in place; otherwise (a log file, CI) it
    is printed every `interval` seconds, flushed, so a killed build's log ends with its last state.
    Tasks finished by an earlier run count too (their final progress file), so after a resume
    "docs read" is the whole build's, not only this run's; rates and the ETA use this run's work.
    """

    def __init__(
        self,
        progress_dir: Path,
        completions_dir: Path,
        tasks: int,
        total_bytes: int,
        interval: float,
        out=None,
        live: bool = False,
        label: str = "build",
        tokens: bool = True,
        limit: int = -1,
    ):
        self.label = label  # "[build] …"; a dedup stage's first pass shows "[dedup signatures] …"
        self.tokens = tokens  # False: a pass that reads without tokenizing
        self.progress_dir = progress_dir
        self.completions_dir = completions_dir
        self.tasks = tasks
        self.total_bytes = total_bytes
        # source.limit (documents a task reads at most, -1: all): a task stops early, its files never
        # read to their end, so the bytes read said "0% of input" until the end (trial RV71e 11)
        self.limit = limit
        self.interval = interval
        self.out = out
        self.live = live
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.t0 = time.time()
        # what earlier runs' finished tasks did
        self.at_start = self._totals(self._states(finished_tasks(completions_dir)))
        self._bar = None

    def _states(self, finished: set[int]) -> list[dict[str, Any]]:
        """The progress of every finished task and of the tasks running in this run."""
        states = []
        for p in sorted(self.progress_dir.glob("*.json")):
            try:
                st = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            # A file older than this run belongs to a task killed earlier, unless the task finished.
            if st.get("rank") in finished or st.get("time", 0) >= self.t0 - 1:
                states.append(st)
        return states

    def _limited(self, states: list[dict[str, Any]], finished: set[int]) -> float:
        """With source.limit, the tasks' share done: a finished task whole (it may end before its limit,
        its files read: the documents left to its limit were an ETA ten times too long, review RV72d F9),
        a running one by its documents read of the limit."""
        running = sum(min(st["read"] / self.limit, 1.0) for st in states if st.get("rank") not in finished)
        return (len(finished) + running) / max(self.tasks, 1)

    @staticmethod
    def _totals(states: list[dict[str, Any]]) -> dict[str, float]:
        return {k: sum(s[k] for s in states) for k in ("read", "tokens", "bytes_done")}

    def __enter__(self) -> Monitor:
        if self.live:
            self._bar = tqdm(
                total=100,
                bar_format=f"[{self.label}] {{percentage:3.0f}}%|{{bar:16}}| {{desc}}",
                file=self.out or sys.stderr,
                dynamic_ncols=True,
            )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._bar is not None:
            self._show()
            self._bar.close()

    def _loop(self) -> None:
        while not self._stop.wait(min(self.interval, 0.5) if self.live else self.interval):
            self._show()

    def _show(self) -> None:
        if self._bar is not None:
            parts = self.parts()
            if parts is not None:
                self._bar.n = round(parts[1])
                self._bar.set_description_str(" | ".join(parts[0]))
            return
        line = self.line()
        if line:
            print(line, file=self.out, flush=True)

    def parts(self) -> tuple[list[str], float] | None:
        """([done, docs, tokens, ETA…], percent of input) or None before anything happened."""
        finished = finished_tasks(self.completions_dir)
        states = self._states(finished)
        done = len(finished)
        now = self._totals(states)
        if not states and done == 0:
            return None
        el = max(time.time() - self.t0, 1e-9)
        new_docs = now["read"] - self.at_start["read"]
        new_tokens = now["tokens"] - self.at_start["tokens"]
        parts = [
            f"tasks {done}/{self.tasks} done",
            f"{now['read']:.0f} docs read ({_fmt(new_docs / el)} docs/s)",
        ]
        if self.tokens:
            parts.append(f"{_fmt(now['tokens'])} tokens ({_fmt(new_tokens / el)} tok/s)")
        frac = done / max(self.tasks, 1)
        if self.limit > 0:  # a task ends at its limit or its files' end
            frac = min(self._limited(states, finished), 1.0)
            # the documents left to the unfinished tasks' limits, at this run's rate: at most that long (a
            # task ending early at once, half of two, made it ten times too short: re-trial RV72e F9)
            running = [st["read"] for st in states if st.get("rank") not in finished]
            left = sum(max(self.limit - r, 0) for r in running)
            left += self.limit * max(self.tasks - len(finished) - len(running), 0)
            if new_docs > 0 and frac < 1:
                parts.append(f"ETA {_fmt_time(el * left / new_docs)}")
        elif self.total_bytes:
            frac = min(now["bytes_done"] / self.total_bytes, 1.0)
            new = now["bytes_done"] - self.at_start["bytes_done"]
            if new > 0 and frac < 1:
                parts.append(f"ETA {_fmt_time(el * (self.total_bytes - now['bytes_done']) / new)}")
        return parts, 100 * frac

    def line(self) -> str | None:
        got = self.parts()
        if got is None:
            return None
        parts, pct = got
        n = 3 if self.tokens else 2  # done, docs (, tokens), then the percentage and the ETA
        return " | ".join([f"[{self.label}] " + parts[0], *parts[1:n], f"{pct:.0f}% of input", *parts[n:]])


def build_table(
    root: str | Path, info: dict[str, Any], validation: tuple[str, str], filter_order: list[str]
) -> str:
    """The end-of-build table: read → excluded per filter → kept, tokens, shards, validation.

    The same numbers as the audit's summary (`gristmill data audit DIR`), from dataset.json (its
    decontaminate counts completed from ROOT/decontam/manifest.json when dataset.json is older).
    """
    read = info.get("documents_read") or info["documents"]
    by_filter = info.get("excluded_by_filter") or {}
    names = [f for f in filter_order if f in by_filter] + sorted(set(by_filter) - set(filter_order))

    def pct(n: int) -> str:
        return f"{100 * n / read:5.1f}%" if read else ""

    rows = [("read", f"{read:,}", "")]
    rows += [(f"excluded by {f}", f"{by_filter[f]:,}", pct(by_filter[f])) for f in names]
    rows += [
        ("kept", f"{info['documents']:,}", pct(info["documents"])),
        ("tokens", f"{info['tokens']:,}", info["dtype"]),
        (
            "shards",
            f"{info['shards']:,}",
            f"{sum(f['bytes'] for f in info['shard_files'].values()) / 1e6:.1f} MB",
        ),
    ]
    if "index" in info:  # the loader reads this, never the manifest (training/contract/dataset_index.py)
        files = info["index"]["files"]
        size = sum(f["bytes"] for f in files.values())
        rows.append(
            (
                "loader index",
                f"{len(files)} files",
                f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB",
            )
        )
    rows.append(("validation", *validation))
    if record := decontaminate_record(root, info):
        rows.append(_unchecked_row(record))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return "\n".join(f"  {a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows)


def _unchecked_row(record: dict[str, Any]) -> tuple[str, str, str]:
    """The evaluation documents no training document was checked against (dataset.json's
    decontaminate.tasks[].documents_without_ngrams: every text shorter than n words), with the tasks
    that have any; unknown where neither dataset.json nor the index recorded them (not 0)."""
    n, tasks = record.get("ngram"), record.get("tasks") or []
    label = f"eval docs with no {n}-gram"  # "a 8-gram" read wrong (R27d m5)
    counts = [t.get("documents_without_ngrams") for t in tasks]
    if None in counts:
        return (label, "unknown", "not recorded by this build nor by its index")
    some = [f"{t['name']} {k:,}" for t, k in zip(tasks, counts) if k]
    shown = ", ".join(some[:3]) + (f", … ({len(some)} tasks)" if len(some) > 3 else "")
    total = f"{sum(counts):,} of {sum(t['documents'] for t in tasks):,}"
    return (label, total, f"no training document checked against them: {shown}" if some else "")


def input_size_note(total_bytes: int, kind: str) -> str:
    """ ", 6.7 MB of input (…)": the source files' size (on disk, or the hub's: a hub build's were
    called "on disk", trial RV70c 5), which the `% of input` of the progress lines counts; for parquet
    that is compressed bytes, often a fraction of the text."""
    where = "on the hub" if kind == "hub" else "on disk"
    parquet = kind in ("parquet", "hub", "demo", "demo-code")
    what = f"parquet files {where}, compressed" if parquet else "files on disk"
    return f", {total_bytes / 1e6:,.1f} MB of input ({what})"
