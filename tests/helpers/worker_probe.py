"""A torchrun worker script for tests/test_forked_workers.py (stdlib only): `worker_probe.py WHAT`
prints what a worker sees of its start (argv, directory, environment, session, whether torch was
already imported), then does WHAT:

  exit:N        exit with status N            message     sys.exit("a message")
  raise         an uncaught exception         interrupt   an uncaught KeyboardInterrupt
  _exit:N       os._exit(N)                   killed:SIG  killed by signal SIG (its default action)
  wait          print each signal in FORWARDED as it arrives; exit 0 after SIGTERM
  sleep         sleep until killed

Under torchrun, the ranks meet (a file each in the working directory) after printing and before
WHAT: otherwise the first rank to exit has torchrun end the others mid-print.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGTERM")


def report(signum: int, frame) -> None:
    print(f"got {signal.Signals(signum).name}", flush=True)
    if signum == signal.SIGTERM:
        sys.exit(0)


def meet() -> None:
    """Wait (up to 60 s) until every local rank of this torchrun has printed its start."""
    folder = Path("probe-ready") / os.environ["TORCHELASTIC_RUN_ID"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / os.environ["LOCAL_RANK"]).touch()
    deadline = time.monotonic() + 60
    while len(list(folder.iterdir())) < int(os.environ["LOCAL_WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.01)


def main(what: str) -> None:
    print(f"argv {sys.argv[1:]} cwd {os.getcwd()} PROBE {os.environ.get('PROBE')}")
    print(f"rank {os.environ.get('LOCAL_RANK')} run {bool(os.environ.get('TORCHELASTIC_RUN_ID'))}")
    print(f"PYTHON_EXEC {'PYTHON_EXEC' in os.environ} session leader {os.getsid(0) == os.getpid()}")
    print(f"pid {os.getpid()}", flush=True)
    print(f"preloaded torch {'torch' in sys.modules}", file=sys.stderr, flush=True)
    print("stdout line", end="")  # `-u`: arrives without a newline or a flush
    print("stderr line", file=sys.stderr)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        meet()
    name, _, value = what.partition(":")
    if name == "exit":
        sys.exit(int(value))
    if name == "message":
        sys.exit("a message")
    if name == "raise":
        raise ValueError("an uncaught exception")
    if name == "interrupt":
        raise KeyboardInterrupt
    if name == "_exit":
        os._exit(int(value))
    if name == "killed":
        os.kill(os.getpid(), signal.Signals[value])
    if name == "wait":
        for sig in FORWARDED:
            signal.signal(signal.Signals[sig], report)
        print("\nready", flush=True)
    while name in ("wait", "sleep"):
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1])
