"""Clean shutdown on SIGTERM/SIGINT (Slurm preemption, Ctrl-C): finish the step, save, exit 0.

The handler only records the signal. After each step `should_stop()` lets every rank agree,
since the scheduler may signal only some of them and all ranks must take the same last step and
write the same checkpoint: a MAX all-reduce of one flag on a CPU (gloo) group of its own, which
never waits for the GPU. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class GracefulStop:
    def __init__(self, world_size: int):
        self.received: int = 0  # the signal number, 0 while none arrived
        distributed = world_size > 1 and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def should_stop(self) -> str | None:
        """The signal's name on every rank if any rank received one (a collective when distributed)."""
        signum = self.received
        if self.group is not None:
            t = torch.tensor([signum], dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            signum = int(t.item())
        return signal.Signals(signum).name if signum else None
