"""A rank whose job's store stops answering across its loop's end, leaving the stop's waiter in the
store's C++ wait (review RV47b F2):
- `python -m tests.helpers.stop_stall serve PORT`: the store's server, in a process of its own (forked);
- `python -m tests.helpers.stop_stall rank PORT SERVER_PID complete|error`: one rank of a two-rank
  job's stop, in a fresh interpreter (a forked child leaves by os._exit: no atexit callback, no
  finalization). It stops the server (SIGSTOP) inside its GracefulStop, whose loop then completes or
  raises; it is sent a SIGTERM during the GracefulStop's exit, prints "left: THREADS", its signal
  handlers (and the loop's error) and "loop ended" after it, and returns with the server still stopped.
As the interpreter is about to finalize (an atexit callback registered before the trainer's, so run
after them), the rank says on stderr whether its first connection to the store (the default group's
client) was shut down and which SIGINT handler is set, and exits 1, with a line, where a stop's
thread is still alive: the store's answer, or its server's end, reaching it then aborts the process
(SIGABRT, 134)."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path


def _at_finalization(first: list[int]) -> None:
    for fd in first:
        try:
            with socket.socket(fileno=os.dup(fd)) as sock:
                shut = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except OSError:  # BlockingIOError: open, nothing to read (the server is stopped)
            shut = False
        if shut:
            os.write(2, b"the default client's connection to the store was shut down\n")
    handler = signal.getsignal(signal.SIGINT)
    os.write(2, f"at finalization: SIGINT {getattr(handler, '__name__', handler)}\n".encode())
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


def _sigterm_in_the_joins(stop) -> None:
    """A SIGTERM once the GracefulStop's exit has begun its threads' joins (2 s for the waiter the
    stalled store holds): not a timer's, which a loaded machine can fire before the exit or after it."""
    while stop._watching is not None:  # set to None as the joins begin
        time.sleep(0.005)
    os.kill(os.getpid(), signal.SIGTERM)


def serve(port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=60), wait_for_workers=False)
    time.sleep(120)
    del store


def rank(port: int, server: int, ending: str) -> None:
    first: list[int] = []  # the default client's socket, once made
    atexit.register(_at_finalization, first)  # before the trainer's modules register theirs
    import torch.distributed as dist

    from training.run.shutdown import GracefulStop, _sockets

    before = set(_sockets())
    store = dist.TCPStore("127.0.0.1", port, 1, False, timedelta(seconds=60))
    first.extend(set(_sockets()) - before)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with GracefulStop(0, 2) as stop:  # two ranks: the stop's threads watch the store
            time.sleep(0.5)  # the waiter is in its wait
            os.kill(server, signal.SIGSTOP)
            _until_stopped(server)
            threading.Thread(target=_sigterm_in_the_joins, args=(stop,)).start()
            if ending == "error":
                raise RuntimeError("the loop's error")
        error = None
    except RuntimeError as e:
        error = e
    print("left:", ", ".join(t.name for t in threading.enumerate() if t.name.startswith("gristmill-stop")))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    named = ", ".join(f"{sig.name} {getattr(h, '__name__', h)}" for sig, h in handlers.items())
    print(f"handlers after the loop: {named}")
    if error is not None:
        print(f"loop error: {error}")
    stop.release()
    print("loop ended", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
