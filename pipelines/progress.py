"""Build progress: each task writes a small JSON file now and then; the driver sums them up.

A task's reader and its tokenize-and-shard step share one `TaskProgress` (datatrove pickles the
whole pipeline at once, so the two steps keep pointing at the same object inside a task). The
task writes `logs/progress/NNNNN.json` and logs a line every `interval` seconds, which is all a
Slurm user gets; the local driver also runs `Monitor`, which reads every task's file and prints
docs/s, tokens/s, tasks done and an ETA from the input bytes consumed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any


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
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)
        if log:
            from datatrove.utils.logging import logger

            el = max(state["elapsed"], 1e-9)
            logger.info(
                f"task {self.rank} {self.phase}: {self.read} docs read, {self.kept} kept, "
                f"{_fmt(self.tokens)} tokens ({_fmt(self.read / el)} docs/s, {_fmt(self.tokens / el)} tok/s)"
            )


class Monitor:
    """Driver-side thread: one summary line every `interval` seconds while tasks run locally."""

    def __init__(
        self,
        progress_dir: Path,
        completions_dir: Path,
        tasks: int,
        total_bytes: int,
        interval: float,
        out=None,
    ):
        self.progress_dir = progress_dir
        self.completions_dir = completions_dir
        self.tasks = tasks
        self.total_bytes = total_bytes
        self.interval = interval
        self.out = out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.t0 = time.time()
        self.done_at_start = self._completed()
        self.bytes_at_start: float | None = None

    def _completed(self) -> int:
        return len(list(self.completions_dir.glob("*"))) if self.completions_dir.is_dir() else 0

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            line = self.line()
            if line:
                print(line, file=self.out, flush=True)

    def line(self) -> str | None:
        states = []
        for p in sorted(self.progress_dir.glob("*.json")):
            try:
                st = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if st.get("time", 0) >= self.t0 - 1:  # this run's tasks only
                states.append(st)
        done = self._completed()
        if not states and done == self.done_at_start:
            return None
        el = max(time.time() - self.t0, 1e-9)
        docs = sum(s["read"] for s in states)
        tokens = sum(s["tokens"] for s in states)
        parts = [
            f"[build] tasks {done}/{self.tasks} done",
            f"{docs} docs read ({_fmt(docs / el)} docs/s)",
            f"{_fmt(tokens)} tokens ({_fmt(tokens / el)} tok/s)",
        ]
        if self.total_bytes:
            # Input bytes behind us: tasks finished before this run plus what running tasks read.
            frac_prev = self.done_at_start / max(self.tasks, 1)
            done_bytes = frac_prev * self.total_bytes + sum(s["bytes_done"] for s in states)
            frac = min(done_bytes / self.total_bytes, 1.0)
            parts.append(f"{100 * frac:.0f}% of input")
            new = done_bytes - frac_prev * self.total_bytes
            if new > 0 and frac < 1:
                parts.append(f"ETA {_fmt_time(el * (self.total_bytes - done_bytes) / new)}")
        return " | ".join(parts)
