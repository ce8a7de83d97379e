"""`python -m tests.helpers.signal_reentry`: a second SIGTERM arriving at each line a trainer runs while
it handles a first one (GracefulStop's handler: STOP_FETCHING set, the loader's workers signalled), and
at each line of a wait for data (STOP_FETCHING.wait, a fetch's backoff) that a SIGTERM ends. A job's
signal reaches a torchrun worker up to three times within milliseconds (from the scheduler, and relayed
by the launcher and by torchrun's agent); Python runs the second handler on the same thread, inside the
first, and a lock the first held hung the rank mid-step, its stop never saved.

Each line is reached by a tracer that sends the signal there (the handler runs before the line does),
one line per round, until a round's handling has no line left to reach. Prints the rounds and exits 0;
a hang is the caller's timeout; a round whose stop was lost exits 1 with a line."""

from __future__ import annotations

import os
import signal
import sys
import time

from training.contract.object_store import STOP_FETCHING
from training.run.shutdown import GracefulStop

_HERE = os.path.abspath(__file__)
_WAIT_S = 2.0


def _signal_at_line(k: int) -> list:
    """A tracer (this thread's) that sends this process a SIGTERM at the k-th line run outside this
    module; the list holds the lines counted so far, then when it was sent."""
    seen = [0, 0.0]

    def trace(frame, event, arg):
        if os.path.abspath(frame.f_code.co_filename) == _HERE:
            return None
        if event == "line":
            seen[0] += 1
            if seen[0] == k:
                seen[1] = time.monotonic()
                os.kill(os.getpid(), signal.SIGTERM)
                _pending_signals_run()
        return trace

    sys.settrace(trace)
    return seen


def _pending_signals_run() -> None:
    """A call: the interpreter runs pending signal handlers at a function's start."""


def _rounds(act) -> int:
    """`act(stop, seen)` in a run's GracefulStop, with the signal sent at its 1st, 2nd, … line, until a round
    reaches no line; the rounds."""
    k = 0
    while True:
        k += 1
        with GracefulStop(rank=0, world_size=1) as stop:
            seen = _signal_at_line(k)
            try:
                act(stop, seen)
            finally:
                sys.settrace(None)
        if seen[0] < k:
            return k - 1


def _a_first_signal(stop: GracefulStop, seen: list) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    _pending_signals_run()
    if stop.received != signal.SIGTERM or not STOP_FETCHING.is_set():
        sys.exit("signal_reentry: a SIGTERM within the handling of another lost the stop")


def _a_wait(stop: GracefulStop, seen: list) -> None:
    """A wait that the signal, sent at one of its lines, ends at once (its last line's signal comes
    after its timeout; the last round, with no line left to reach, waits out the timeout)."""
    ended = STOP_FETCHING.wait(_WAIT_S)
    if stop.received and not (ended and time.monotonic() - seen[1] < _WAIT_S / 2):
        sys.exit("signal_reentry: a SIGTERM during a wait for data did not end it")


def main() -> None:
    handler = _rounds(_a_first_signal)
    wait = _rounds(_a_wait)
    print(f"rounds: {handler} lines of the handling, {wait} of a wait", flush=True)


if __name__ == "__main__":
    main()
