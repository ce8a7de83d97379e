"""How long `gristmill train` takes to report a config typo, against importing torch.

    python -m bench.config_error_latency [--repeats 5]

Each round starts a fresh interpreter (as a user's shell does) and times, wall clock:
  - typo:       `gristmill train --config configs/train/tiny.toml --set optim.lrr=1` (exit 2, one line)
  - arithmetic: the same with `--set data.micro_batch=5` (16 sequences do not split into 5s)
  - baseline:   `python -c "import torch"` — what the check took before it ran ahead of the trainer's
                imports (and still the floor of any command that needs torch)
and prints the best and median of --repeats runs of each, and the ratio to the baseline. Goal (issue
18): a typo reported in under 2 s on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = "from pipelines.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
CASES = {
    "typo": ["-c", CLI, "train", "--config", "configs/train/tiny.toml", "--set", "optim.lrr=1"],
    "arithmetic": ["-c", CLI, "train", "--config", "configs/train/tiny.toml", "--set", "data.micro_batch=5"],
    "baseline: import torch": ["-c", "import torch"],
}


def timed(args: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0, proc.returncode, proc.stderr.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved: each case sees the same machine load
        for name, argv in CASES.items():
            seconds, code, err = timed(argv)
            if name != "baseline: import torch" and (code != 2 or len(err.splitlines()) != 1):
                raise SystemExit(f"{name}: expected exit 2 and one line, got {code}: {err[-500:]}")
            times[name].append(seconds)
    base = statistics.median(times["baseline: import torch"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<24} best {min(ts):5.2f} s  median {med:5.2f} s  = {med / base:.2f}× import torch")
    worst = max(statistics.median(times["typo"]), statistics.median(times["arithmetic"]))
    print(f"goal: a config error in < 2 s: {'met' if worst < 2 else 'NOT met'} (median {worst:.2f} s)")


if __name__ == "__main__":
    main()
