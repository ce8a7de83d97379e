"""The host copy an async checkpoint is written from: one set of buffers for the whole run.

An async save must copy the state before training changes it, and that copy is what the
training loop waits for. DCP's own stagers allocate a fresh CPU copy per save (unpinned: 12.9 s
for the 1.24B model's 15 GB on an H100) or, reused and pinned, failed on torch 2.11 with
`KeyError: <class 'type'>` at the second save. So the Checkpointer stages itself:

- every tensor of the state (model and optimizer shards, RNG states) gets a host buffer at the
  first save, pinned on CUDA so the device-to-host copy runs at PCIe speed, plain on CPU; later
  saves copy into the same buffers after checking that every shape and dtype is unchanged;
- a sharded DTensor's local shard goes into a host DTensor with the same mesh and placements
  (what DCP's `_create_cpu_state_dict` produces too), so DCP writes the same sharded checkpoint;
- everything else (loader position, counters, schedule, Python/numpy RNG numbers) is deep-copied;
- on CUDA the copies run on a side stream and an event marks their end. The training stream waits
  for that event just before the next optimizer step (the first thing that changes the state), so
  the copy overlaps the next forward and backward (which only read the weights); the writer
  thread waits for it on the host before DCP reads a byte. Nobody waits for the write itself
  except the next save. Without an optimizer to hook, `stage` waits for the copy itself.

`dcp.async_save` gets the staged dict with a stager that passes it through (`PreStaged`) and a
FileSystemWriter that waits for the copy (`writer`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor

from training.contract.disk_space import fmt_bytes

KeyPath = tuple[Any, ...]  # keys and list indices from the state dict's root to a tensor


def _name(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (no autograd wrapper), else the tensor itself."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _describe(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def tensor_leaves(obj: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, torch.Tensor]]:
    """(path, tensor) of every tensor in a nested dict/list/tuple state dict."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensor_leaves(v, (*path, k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from tensor_leaves(v, (*path, i))


def state_dict_of(states: dict[str, Any]) -> dict[str, Any]:
    """What DCP saves for `states`: each Stateful's state_dict(), other values as they are."""
    return {k: v.state_dict() if hasattr(v, "state_dict") else v for k, v in states.items()}


class HostStaging:
    """One host copy of a rank's checkpointed state, allocated at the first `stage` and reused."""

    def __init__(self, optimizer: torch.optim.Optimizer | None = None, log: Callable[[str], None] = print):
        self.optimizer, self.log = optimizer, log
        self.buffers: dict[KeyPath, torch.Tensor] | None = None  # path → host tensor (or host DTensor)
        self.device: torch.device | None = None  # the CUDA device the state lives on; None on CPU
        self.stream: torch.cuda.Stream | None = None
        self.copied: torch.cuda.Event | None = None  # recorded after the copies of the last stage
        self._began: torch.cuda.Event | None = None  # recorded before them (for copy_seconds)
        self._copy_s = 0.0  # the last copy's duration on CPU, where it is synchronous
        self._hook = None  # the optimizer pre-step hook that orders training after the copy
        self.nbytes = 0

    def before_optimizer_state(self, state: dict[str, Any]) -> bool:
        """Whether the buffers were sized at a save that held no optimizer state and `state` holds it:
        a first save after every step so far was skipped (Muon, unfused AdamW create their state at
        their first applied step). Such buffers are sized again, once, not refused (`changed`)."""
        if self.buffers is None or any(p[:2] == ("optimizer", "state") for p in self.buffers):
            return False
        return any(p[:2] == ("optimizer", "state") for p, _ in tensor_leaves(state))

    def changed(self, state: dict[str, Any]) -> str | None:
        """Why `state` no longer fits the buffers of the first save (one line), or None."""
        if self.buffers is None:
            return None
        for path, t in tensor_leaves(state):
            buf = self.buffers.get(path)
            if buf is None:
                return f"{_name(path)} ({_describe(_local(t))}) was not in the state at the run's first save"
            if (_local(t).shape, t.dtype, t.shape) != (_local(buf).shape, buf.dtype, buf.shape):
                return (
                    f"{_name(path)} is {_describe(_local(t))} on this rank now but was "
                    f"{_describe(_local(buf))} at the run's first save"
                )
        return None

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of `state` in the host buffers (checked with `changed` first): the same nesting,
        host tensors in place of tensors, deep copies of everything else. On CUDA the copies are
        only queued; `wait` blocks until they are done."""
        if self.buffers is None:
            self._allocate(state)
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (host buffer, source)

        def build(obj: Any, path: KeyPath) -> Any:
            if isinstance(obj, torch.Tensor):
                host = self.buffers[path]
                pairs.append((_local(host), _local(obj)))
                return host
            if isinstance(obj, dict):
                return {k: build(v, (*path, k)) for k, v in obj.items()}
            if isinstance(obj, list | tuple):
                items = [build(v, (*path, i)) for i, v in enumerate(obj)]
                return items if isinstance(obj, list) else tuple(items)
            return copy.deepcopy(obj)

        staged = build(state, ())
        with torch.no_grad():
            if self.stream is None:  # CPU: plain copies, done when this returns
                t0 = time.perf_counter()
                for dst, src in pairs:
                    dst.copy_(src)
                self._copy_s = time.perf_counter() - t0
            else:
                # After everything queued so far on the training stream (the last optimizer step).
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                self._began = torch.cuda.Event(enable_timing=True)
                self.copied = torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(self.stream):
                    self._began.record()
                    for dst, src in pairs:
                        if src.is_cuda:  # a temporary source must outlive the copy in the allocator
                            src.record_stream(self.stream)
                        dst.copy_(src, non_blocking=True)
                    self.copied.record()
                if self._hook is None:  # no optimizer to order the copy before: wait here
                    self.copied.synchronize()
        return staged

    def wait(self) -> None:
        """Block the host until the last stage's copies are done (the writer, before it reads)."""
        if self.copied is not None:
            self.copied.synchronize()

    def copy_seconds(self) -> float:
        """How long the last stage's copies took (on CUDA: device time, waiting for them)."""
        if self.copied is None or self._began is None:
            return self._copy_s
        self.copied.synchronize()
        return self._began.elapsed_time(self.copied) / 1e3

    def writer(self, path: str) -> FileSystemWriter:
        """DCP's FileSystemWriter for `path` that first waits for the copies (in the writer thread)."""
        return _AfterCopyWriter(path, self.wait)

    def close(self) -> None:
        """Wait for the copies, then drop the buffers and the optimizer hook."""
        self.wait()
        if self._hook is not None:
            self._hook.remove()
        self.buffers, self.copied, self._began, self._hook, self.stream = None, None, None, None, None

    def _allocate(self, state: dict[str, Any]) -> None:
        leaves = list(tensor_leaves(state))
        cuda = [_local(t).device for _, t in leaves if _local(t).is_cuda]
        self.device = cuda[0] if cuda else None
        pin = self.device is not None
        buffers: dict[KeyPath, torch.Tensor] = {}
        for path, t in leaves:
            src = _local(t)
            # Pinned memory makes the device-to-host copy asynchronous and ~2× faster; an empty
            # shard (uneven FSDP sharding) cannot be pinned and needs no copy anyway.
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=pin and src.numel() > 0)
            if isinstance(t, DTensor):
                # DTensor.from_local would move the buffer to the mesh's device (the GPU): the host
                # DTensor is built from the shard's own spec, as DCP's _create_cpu_state_dict does.
                buf = DTensor(buf, t._spec, requires_grad=False)
            buffers[path] = buf
            self.nbytes += src.numel() * src.element_size()
        self.buffers = buffers
        if self.device is not None:
            self.stream = torch.cuda.Stream(self.device)
            if self.optimizer is not None:
                self._hook = self.optimizer.register_step_pre_hook(self._before_optimizer_step)
        self.log(
            f"checkpoint staging: {fmt_bytes(self.nbytes)} of {'pinned ' if pin else ''}host memory per "
            "rank, allocated once and reused by every async save"
        )

    def _before_optimizer_step(self, *_: Any) -> None:
        self.order_after_copy()

    def order_after_copy(self) -> None:
        """The training stream waits for the checkpoint copy before the state changes (the optimizer
        step's hook, and the caller of any other change: on the device, the host does not block);
        once waited for, later steps pay nothing."""
        if self.copied is not None and self.device is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied)


class _AfterCopyWriter(FileSystemWriter):
    """FileSystemWriter whose save starts by waiting for the staging copies; runs in DCP's writer
    thread, before any tensor is read. Its tensors are on the host already: no copy-ahead."""

    def __init__(self, path: str, ready: Callable[[], None]):
        super().__init__(path, per_thread_copy_ahead=0)
        self._ready = ready

    def set_up_storage_writer(self, *args: Any, **kwargs: Any) -> None:
        self._ready()
        super().set_up_storage_writer(*args, **kwargs)


class PreStaged(AsyncStager):
    """The stager for `dcp.async_save` of a dict that HostStaging already copied: passes it on."""

    _synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass
