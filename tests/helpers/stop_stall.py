"""A rank whose job's store stops answering across its loop's end, leaving the stop's waiter in the
store's C++ wait (review RV47b F2):
- `python -m tests.helpers.stop_stall serve PORT`: the store's server, in a process of its own (forked);
- `python -m tests.helpers.stop_stall rank PORT SERVER_PID`: one rank of a two-rank job's stop, in a
  fresh interpreter (a forked child leaves by os._exit: no atexit callback, no finalization). It stops
  the server (SIGSTOP) inside its GracefulStop, is sent a SIGTERM during the GracefulStop's exit,
  prints "left: THREADS", its signal handlers and "loop ended" after it, and returns with the server
  still stopped.
The rank exits 1, with a line, where a stop's thread is still alive when the interpreter is about to
finalize: the store's answer, or its server's end, reaching it then aborts the process (SIGABRT, 134)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path


def _alive_at_finalization() -> None:
    left = [t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")]
    if left:
        os.write(2, f"{', '.join(left)} alive as the interpreter finalizes\n".encode())
        os._exit(1)


def _until_stopped(pid: int) -> None:
    """Until every thread of `pid` is stopped: kill() returns before they stop, and the server answered
    the loop's end in that window (1 in ~25 runs under load)."""
    tasks = Path(f"/proc/{pid}/task")
    while any((task / "stat").read_text().rsplit(")", 1)[1].split()[0] != "T" for task in tasks.iterdir()):
        time.sleep(0.01)


def serve(port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=60), wait_for_workers=False)
    time.sleep(120)
    del store


def rank(port: int, server: int) -> None:
    # Registered before the trainer's modules register theirs: atexit runs it after them
    atexit.register(_alive_at_finalization)
    import torch.distributed as dist

    from training.run.shutdown import GracefulStop

    store = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    with GracefulStop(0, 2) as stop:  # two ranks: the stop's threads watch the store
        time.sleep(0.5)  # the waiter is in its wait
        os.kill(server, signal.SIGSTOP)
        _until_stopped(server)
        # during the exit's 2 s join of the waiter, after a loop that completed
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    print("left:", ", ".join(t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    named = ", ".join(f"{sig.name} {getattr(h, '__name__', h)}" for sig, h in handlers.items())
    print(f"handlers after the loop: {named}")
    stop.release()
    print("loop ended", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        rank(int(sys.argv[2]), int(sys.argv[3]))
