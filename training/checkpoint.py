"""Checkpoints that never fail silently: DCP saves (sync or async), resume, retention, exports.

    RUN/checkpoints/step-000500/  __0_0.distcp  __1_0.distcp  .metadata  COMPLETE

Every Stateful object of training.train_state.checkpointables (model and optimizer as sharded
DTensors, LR schedule, loader position, step/token counters, per-rank RNG streams) is written with
torch.distributed.checkpoint, so a checkpoint saved on N ranks loads on M. The rules, each one a
lesson from someone's lost run:

- Complete means `.metadata` (written by DCP after every rank's data) *and* the `COMPLETE` record
  (step, tokens, config hash, save time) that rank 0 writes after it, fsynced and renamed into
  place. Resume and export ignore anything else and say why.
- Async saves copy the state to CPU, then write in a background thread on their own gloo group
  (`dcp.async_save` needs one: its collectives must not interleave with training's). At most one
  is in flight; the next save and the end of training wait for it; a background failure is raised
  at the next step's `poll()`, stopping the run.
- A write that fails (ENOSPC, read-only, permission; DCP raises CheckpointException, a
  BaseException) stops the run with a CheckpointError naming the path and the last complete
  checkpoint. Before each save the free space is checked against an estimate of its size.
- Retention runs only after a new checkpoint is complete, keeps the newest `keep_last` complete
  ones, and deletes an old one's COMPLETE record first (fsynced) so a half-deleted directory is
  never taken for complete.
- Loading never unpickles arbitrary objects: `.metadata` goes through an unpickler that admits
  only DCP's metadata classes and torch dtypes/sizes, and non-tensor values through
  torch.load(weights_only=True).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element

from training.config import CheckpointSection
from training.errors import GristmillError
from training.metrics import fmt_bytes
from training.run_layout import (
    CHECKPOINTS_DIR,
    COMPLETE_FILE,
    DCP_METADATA,
    checkpoint_dir,
    complete_steps,
    incomplete_reason,
    is_complete_checkpoint,
    list_steps,
)


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every save/load in a single process; that is the intended use here, not news.
    (A module-level filter is not enough: libraries imported later reset the filters.)"""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


class CheckpointError(GristmillError):
    """A checkpoint that cannot be written or read; names the path and the last complete one."""


# --- loading without unpickling arbitrary objects ----------------------------------------------

_TORCH_VALUE_TYPES = (torch.dtype, torch.layout, torch.memory_format)
_SAFE_GLOBALS = {
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("collections", "OrderedDict"),
    ("torch.serialization", "_get_layout"),  # looks a torch.layout up by name
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "WindowsPath"),
    ("pathlib", "Path"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and (
            name == "Size" or isinstance(getattr(torch, name, None), _TORCH_VALUE_TYPES)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: a DCP .metadata file holds only DCP metadata classes"
        )


class SafeFileSystemReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is read by an allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        path = Path(self.path) / DCP_METADATA
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is not None and hasattr(self, "load_id"):
            storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads non-tensor values with torch.load(weights_only=True)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load(states: dict[str, Any], path: str | Path, *, no_dist: bool = False) -> None:
    """dcp.load of `states` from checkpoint `path` with the safe reader and planner."""
    with _single_process_quiet():
        dcp.load(
            states,
            storage_reader=SafeFileSystemReader(str(path)),
            planner=SafeLoadPlanner(),
            no_dist=no_dist,
        )


def checkpoint_keys(path: str | Path) -> set[str]:
    """Flattened keys stored in a checkpoint (e.g. 'train_state.rng_rank1.torch_cpu')."""
    return set(SafeFileSystemReader(str(path)).read_metadata().state_dict_metadata)


# --- what is on disk ---------------------------------------------------------------------------


def find_resume(run_dir: str | Path, spec: str) -> tuple[Path | None, list[str]]:
    """The checkpoint `--resume spec` means ("auto" or a path) and lines explaining the choice."""
    if spec != "auto":
        path = Path(spec)
        if not path.is_dir():
            raise CheckpointError(f"--resume {spec}: no such checkpoint directory")
        reason = incomplete_reason(path)
        if reason:
            raise CheckpointError(
                f"--resume {spec} is not a complete checkpoint: {reason}; use --resume auto to take the "
                "newest complete one"
            )
        return path, [f"resuming from {path} (given by --resume)"]
    root = Path(run_dir) / CHECKPOINTS_DIR
    notes = []
    for step in reversed(list_steps(root)):
        path = checkpoint_dir(run_dir, step)
        reason = incomplete_reason(path)
        if reason is None:
            return path, [f"resuming from {path}, the newest complete checkpoint", *notes]
        notes.append(f"  skipped {path.name}: {reason}")
    return None, [f"--resume auto: no complete checkpoint in {root}; starting from step 0", *notes]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_complete_record(path: Path, record: dict[str, Any]) -> None:
    """COMPLETE, written after `.metadata`: temp file, fsync, rename, fsync the directory."""
    tmp = path / (COMPLETE_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / COMPLETE_FILE)
    _fsync_dir(path)


def delete_checkpoint(path: Path) -> None:
    """COMPLETE first (and made durable), so a deletion cut short never leaves a 'complete' husk."""
    marker = path / COMPLETE_FILE
    if marker.exists():
        marker.unlink()
        _fsync_dir(path)
    shutil.rmtree(path)


def prune(run_dir: str | Path, keep_last: int, log=print) -> list[int]:
    """Retention, called after a checkpoint became complete: delete complete checkpoints older than
    the newest `keep_last` (0: keep all) and incomplete leftovers older than the newest complete one
    (a save in flight is always newer). Returns the deleted steps."""
    complete = complete_steps(run_dir)
    if not complete:
        return []
    keep = set(complete[-keep_last:]) if keep_last else set(complete)
    newest = complete[-1]
    deleted = []
    for step in list_steps(Path(run_dir) / CHECKPOINTS_DIR):
        if step < newest and step not in keep:
            delete_checkpoint(checkpoint_dir(run_dir, step))
            deleted.append(step)
    if deleted:
        log(f"retention: deleted checkpoint(s) {', '.join(map(str, deleted))} (keeping {sorted(keep)})")
    return deleted


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def checkpoint_error_cause(exc: BaseException) -> str:
    """The first rank's underlying error of a DCP CheckpointException (else the exception itself)."""
    failures = getattr(exc, "failures", None)
    if failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    return f"{type(exc).__name__}: {exc}"


# --- the trainer's checkpointer ----------------------------------------------------------------


class Checkpointer:
    """Saves, resumes, prunes and exports for one run; every rank holds one, rank 0 does the files.

    Call order in the loop: `poll()` at the start of every step, `save(step, tokens)` when
    `due(step)`, `close()` at the end (waits for an async save in flight).
    """

    def __init__(
        self,
        cfg: CheckpointSection,
        run_dir: str | Path,
        states: dict[str, Any],
        *,
        rank: int,
        world_size: int,
        last_step: int,
        config_sha256: str,
        estimate_bytes: int,
        reuse_staging: bool = True,  # False on CUDA: async saves use DCP's default staging
        log=print,
    ):
        self.cfg, self.run_dir, self.states = cfg, Path(run_dir), states
        self.reuse_staging, self.stager = reuse_staging, None
        self.rank, self.world_size, self.last_step = rank, world_size, last_step
        self.config_sha256 = config_sha256
        self.estimate_bytes, self.estimate_basis = estimate_bytes, "estimated from the parameter count"
        self.log = log if rank == 0 else (lambda *a, **k: None)
        self.root = self.run_dir / CHECKPOINTS_DIR
        distributed = dist.is_initialized()
        self.no_dist = not distributed  # one process: DCP skips its collectives (and its warning)
        # Rank 0's decisions (disk guard, resume path) reach the others over this CPU group.
        self.ctl_group = dist.new_group(backend="gloo") if distributed and world_size > 1 else None
        # dcp.async_save's collectives run in a background thread: they get a group of their own.
        self.async_group = dist.new_group(backend="gloo") if distributed and cfg.async_ else None
        self.pending: tuple[int, int, Future, float] | None = None  # step, tokens, future, start
        self.low_disk: str | None = None  # set while on_low_disk = "skip" is skipping saves

    # -- decisions shared by all ranks --
    def _from_rank0(self, value: Any) -> Any:
        if self.ctl_group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.ctl_group)
        return box[0]

    def due(self, step: int) -> bool:
        return self.cfg.interval > 0 and (step % self.cfg.interval == 0 or step == self.last_step)

    def newest_complete(self) -> str:
        steps = complete_steps(self.run_dir)
        return str(checkpoint_dir(self.run_dir, steps[-1])) if steps else "none"

    # -- resume --
    def resume(self, spec: str) -> int | None:
        """Load the checkpoint `spec` names ("auto" or a path; "" = none); returns its step or None."""
        if not spec:
            return None
        choice = None
        if self.rank == 0:
            try:
                path, notes = find_resume(self.run_dir, spec)
                choice = ("path", None if path is None else str(path))
                for line in notes:
                    self.log(line)
            except CheckpointError as e:
                choice = ("error", str(e))
        kind, value = self._from_rank0(choice)  # every rank takes rank 0's choice, or its error
        if kind == "error":
            raise CheckpointError(value)
        if value is None:
            return None
        path = Path(value)
        train_state = self.states["train_state"]
        try:
            # A resume onto more ranks: ranks without a saved RNG stream keep their own.
            train_state.rng_in_checkpoint = f"train_state.{train_state.rng_key}.torch_cpu" in checkpoint_keys(
                path
            )
            load(self.states, path, no_dist=self.no_dist)
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            if isinstance(e, KeyboardInterrupt | SystemExit):
                raise
            raise CheckpointError(f"cannot resume from {path}: {checkpoint_error_cause(e)}") from None
        finally:
            train_state.rng_in_checkpoint = True
        step = train_state.step
        if self.rank == 0:
            record = json.loads((path / COMPLETE_FILE).read_text(encoding="utf-8"))
            if record.get("config_sha256") != self.config_sha256:
                self.log(
                    f"note: the config differs from the one {path.name} was saved with (its hash in COMPLETE)"
                )
            if path.parent.resolve() == self.root.resolve():
                self._set_aside_newer(step)
        return step

    def _set_aside_newer(self, step: int) -> None:
        """Checkpoints newer than the resumed one belong to an abandoned timeline: incomplete ones
        are deleted, complete ones renamed `abandoned-step-N` (never deleted)."""
        for s in list_steps(self.root):
            if s <= step:
                continue
            path = checkpoint_dir(self.run_dir, s)
            if is_complete_checkpoint(path):
                target = path.with_name(f"abandoned-{path.name}")
                shutil.rmtree(target, ignore_errors=True)
                path.rename(target)
                self.log(
                    f"note: {path.name} is newer than the resumed step {step}; moved it to {target.name}"
                )
            else:
                shutil.rmtree(path)

    # -- save --
    def poll(self) -> None:
        """Start of a step: finish an async save that is done (raising if it failed); in skip mode,
        warn again that checkpoints are being skipped."""
        if self.pending is not None and self.pending[2].done():
            self._finish_pending()
        if self.low_disk is not None:
            self.log(f"WARNING: checkpoints are being SKIPPED: {self.low_disk}")

    def close(self) -> None:
        """Wait for an async save in flight (raising if it failed) and free the staging buffers."""
        try:
            if self.pending is not None:
                self._finish_pending()
        finally:
            if self.stager is not None:
                self.stager.close()
                self.stager = None

    def _async_stager(self):
        """The stager of async saves on CPU, kept for the whole run: it copies the state into CPU
        buffers allocated at the first save and reused after, so later saves pay one memcpy instead
        of allocating (and faulting in) a fresh copy of the state each time; the price is one CPU
        copy of this rank's state held for the run. None on CUDA, and where this torch lacks
        DefaultStager: DCP's default copy. (On an H100 with torch 2.11 the reused pinned buffers
        failed the second async save with `KeyError: <class 'type'>` inside DCP's staging, so the
        GPU path keeps DCP's default until that is understood; bench/RESULTS.md has the figures.)"""
        if self.stager is not None or not self.reuse_staging:
            return self.stager
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        except ImportError:
            return None
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
        )
        return self.stager

    def save(self, step: int, tokens: int, *, blocking: bool = False) -> bool:
        """Save the state of `step`; returns False if the disk guard skipped it (on_low_disk=skip)."""
        if self.pending is not None:
            self._finish_pending()  # at most one in flight
        path = checkpoint_dir(self.run_dir, step)
        problem = self._prepare(step) if self.rank == 0 else None
        problem = self._from_rank0(problem)  # also the barrier after rank 0's preparation
        if problem is not None:
            if self.cfg.on_low_disk == "stop":
                raise CheckpointError(problem + ' (or set checkpoint.on_low_disk = "skip")')
            self.low_disk = problem
            self.log(f"WARNING: checkpoint of step {step} SKIPPED: {problem}")
            return False
        self.low_disk = None
        t0 = time.perf_counter()
        try:
            with _single_process_quiet():
                if self.cfg.async_ and not blocking:
                    # (no no_dist here: async_save infers it, and older torch lacks the argument)
                    kwargs = {"async_stager": stager} if (stager := self._async_stager()) is not None else {}
                    fut = dcp.async_save(
                        self.states, checkpoint_id=str(path), process_group=self.async_group, **kwargs
                    )
                    fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse on newer torch
                    self.pending = (step, tokens, fut, t0)
                    return True
                dcp.save(self.states, checkpoint_id=str(path), no_dist=self.no_dist)
        except BaseException as e:
            self._failed(step, e)
        self._complete(step, tokens, time.perf_counter() - t0)
        return True

    def _prepare(self, step: int) -> str | None:
        """Rank 0 before a save: the disk guard, and a stale directory of this step out of the way."""
        need = int(self.estimate_bytes * self.cfg.min_free_factor)
        probe = self.root
        while not probe.exists():
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < need:
            return (
                f"only {fmt_bytes(free)} free on the filesystem of {self.root}; a checkpoint needs "
                f"{fmt_bytes(self.estimate_bytes)} ({self.estimate_basis}) × checkpoint.min_free_factor "
                f"{self.cfg.min_free_factor:g} = {fmt_bytes(need)}. Last complete checkpoint: "
                f"{self.newest_complete()}. Free space or lower checkpoint.keep_last, then resume with "
                "--resume auto"
            )
        path = checkpoint_dir(self.run_dir, step)
        if path.is_dir():  # left by a killed run that got this far before: never half-overwrite
            delete_checkpoint(path)
        self.root.mkdir(parents=True, exist_ok=True)
        return None

    def _finish_pending(self) -> None:
        step, tokens, fut, t0 = self.pending
        self.pending = None
        try:
            fut.result()
        except BaseException as e:
            self._failed(step, e)
        self._complete(step, tokens, time.perf_counter() - t0)

    def _failed(self, step: int, exc: BaseException):
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise exc
        raise CheckpointError(
            f"checkpoint of step {step} could not be written to {checkpoint_dir(self.run_dir, step)}: "
            f"{checkpoint_error_cause(exc)}. Last complete checkpoint: {self.newest_complete()}. Fix the "
            "cause, then resume with --resume auto"
        ) from None

    def _complete(self, step: int, tokens: int, seconds: float) -> None:
        """Rank 0 after DCP's .metadata: the COMPLETE record, an export if due, then retention."""
        if self.rank != 0:
            return
        path = checkpoint_dir(self.run_dir, step)
        try:
            if not (path / DCP_METADATA).is_file():
                raise FileNotFoundError(f"{path / DCP_METADATA} missing after the save returned")
            write_complete_record(
                path,
                {
                    "step": step,
                    "tokens": tokens,
                    "config_sha256": self.config_sha256,
                    "save_seconds": round(seconds, 3),
                    "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "world_size": self.world_size,
                },
            )
        except OSError as e:
            self._failed(step, e)
        self.estimate_bytes, self.estimate_basis = dir_size(path), f"the size of {path.name}"
        self.log(f"checkpoint {path} complete ({fmt_bytes(self.estimate_bytes)}, {seconds:.1f} s)")
        if self.cfg.export_interval and step % self.cfg.export_interval == 0:
            from training.hf_export import export_checkpoint

            out = export_checkpoint(self.run_dir, step)
            self.log(f"export {out} written (permanent: HF LlamaForCausalLM + tokenizer)")
        prune(self.run_dir, self.cfg.keep_last, log=self.log)
