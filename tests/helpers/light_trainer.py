"""A stand-in for torchrun's `python -u -m training.train …` workers in the launcher's tests
(tests/training/test_launch_exits.py): what the launcher and torchrun see of a worker — progress
lines on stdout, an exit status with rank 0's one-line message on stderr, the answer to SIGINT and
SIGTERM, death with its parent — at the cost of a bare interpreter (stdlib only, `python -S`)
instead of torch's import and a model.

`install(folder)` writes the executable `folder/training.train`; a launch with PATH starting at
`folder` and PYTHON_EXEC=training.train makes torchrun start it as its workers' interpreter
(torchrun's documented override), and torchrun names the entry point `training.train`, as it does
the real workers. The real trainer's side of each exit (its messages, its save) is tested with the
real trainer: in one process, and in the one real 2-rank launch of that module.

What a worker does, from LIGHT_TRAINER in its environment:
  "train" (the default)   a step line every 0.02 s until signalled
  "exit:CODE:MESSAGE"     one step line, then rank 0 prints MESSAGE to stderr; every rank exits CODE
Signals, as training/run/shutdown.py answers them: the first SIGINT or SIGTERM finishes the step,
"saves" (0.5 s), and rank 0 prints `stopping after step N on SIG…: checkpoint saved; resume with
--resume auto`; exit 0. A SIGINT during that: rank 0's one line, exit 130 at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

SAVE_S = 0.5
received: list[int] = []


def install(folder: Path) -> Path:
    """Write `folder/training.train`, running this file with this interpreter (`-S`: no site)."""
    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "training.train"
    stub.write_text(
        f'#!/bin/sh\nLIGHT_TRAINER_READY="{folder / "ready"}" exec "{sys.executable}" -S '
        f'"{Path(__file__).resolve()}" "$@"\n'
    )
    stub.chmod(0o755)
    return stub


def _handle(signum: int, frame) -> None:
    if received and signum == signal.SIGINT:
        if RANK == 0:
            first = "second Ctrl-C (SIGINT)" if received[0] == signal.SIGINT else "SIGINT after SIGTERM"
            os.write(2, f"{first}: stopping now without saving; resume from the newest complete checkpoint "
                        "with --resume auto\n".encode())  # fmt: skip
        os._exit(128 + signal.SIGINT)
    received.append(signum)


def say(line: str, stream=sys.stdout) -> None:
    if RANK == 0:
        print(line, file=stream, flush=True)


def all_ranks_ready(timeout_s: float = 120) -> None:
    """Each rank says it answers signals; rank 0 prints no step before every rank does. The real
    ranks meet in init_process_group before step 1: without this, a test's Ctrl-C after rank 0's
    step 2 could reach a rank still starting its interpreter (KeyboardInterrupt, exit 130)."""
    folder = Path(os.environ["LIGHT_TRAINER_READY"]) / os.environ.get("TORCHELASTIC_RUN_ID", "none")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(RANK)).touch()
    world, deadline = int(os.environ.get("WORLD_SIZE", "1")), time.monotonic() + timeout_s
    while RANK == 0 and len(list(folder.iterdir())) < world and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handle)
    all_ranks_ready()
    parent = os.getppid()
    what = os.environ.get("LIGHT_TRAINER", "train")
    step = 0
    while True:
        step += 1
        time.sleep(0.02)
        say(f"step {step:6d}/400 | loss 5.0000 | light trainer")
        if what.startswith("exit:"):
            _, code, message = what.split(":", 2)
            say(message, sys.stderr)
            return int(code)
        if received:
            time.sleep(SAVE_S)  # the save a second Ctrl-C cuts short
            say(f"stopping after step {step} on {signal.Signals(received[0]).name}: checkpoint saved; "
                "resume with --resume auto")  # fmt: skip
            return 0
        if os.getppid() != parent:  # no worker outlives its launcher
            os.kill(os.getpid(), signal.SIGKILL)


RANK = int(os.environ.get("RANK", "0"))

if __name__ == "__main__":
    sys.exit(main())
