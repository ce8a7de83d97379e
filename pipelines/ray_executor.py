"""`build.executor = "ray"`: the build's datatrove tasks on a Ray cluster (RayPipelineExecutor).

The rest is the local executor's: the same pipeline objects, completion markers in
OUTPUT/logs/completions/ (a rerun skips finished tasks), progress files and the driver's progress
line, and finalize + validation in the driver once every task finished. The output directory (and
a local source) must be at the same path on every node, like on Slurm.

Two things datatrove's Ray executor does differently from its local one, evened out here:
- a task's exception never reaches the driver: its task manager logs it at debug level and run()
  returns. Each task here pickles its exception into logs/errors/NNNNN.pickle and run() raises
  the first one once all tasks ended, as the local executor's process pool does (a bad input
  file gets the same one-line error on both);
- a task logs into {tempdir}/ray_logs/logs/task_NNNNN.log, copied to OUTPUT/logs/logs/ when it
  ends: one path per rank and node, so two builds on one node would write each other's task logs
  (or fail on another user's file). Each task gets its own temporary directory instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
from collections.abc import Iterator

from datatrove.executor.ray import RayPipelineExecutor

from pipelines.build_logs import loguru_to
from pipelines.config import RayConfig
from training.errors import GristmillError

ERRORS_DIR = "errors"


class RayClusterError(GristmillError):
    """No Ray cluster to run the build on, or one too small for a single task."""


@contextlib.contextmanager
def ray_cluster(rc: RayConfig, verbose: bool, log=print) -> Iterator[str]:
    """Connect to (or start) the cluster build.ray describes unless this process already is
    connected; yields a description for the build's first line; disconnects what it connected."""
    import ray

    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(
                address=rc.address,
                # The build's own progress line replaces the dashboard; a long-lived cluster
                # (`ray start --head`) keeps its own.
                **({"include_dashboard": False} if rc.address == "local" else {}),
                log_to_driver=verbose,
                logging_level=logging.INFO if verbose else logging.WARNING,
            )
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RayClusterError(
                f"cannot connect to Ray at build.ray.address = {rc.address!r} ({type(e).__name__}: {e}); "
                'start the cluster (`ray start --head` on its head node), or use address = "local" '
                "for a Ray instance on this machine"
            ) from None
    try:
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        need_gb = rc.cpus_per_task * rc.mem_per_cpu_gb
        fits = lambda n: n.get("CPU", 0) >= rc.cpus_per_task and n.get("memory", 0) >= need_gb * 2**30
        if not any(map(fits, nodes)):
            largest = max(nodes, key=lambda n: (n.get("CPU", 0), n.get("memory", 0)))
            what = (
                f"a task needs {rc.cpus_per_task} CPUs and {need_gb:g} GB on one node "
                "(build.ray.cpus_per_task, build.ray.mem_per_cpu_gb); the largest node of the Ray "
                f"cluster has {largest.get('CPU', 0):g} CPUs and {largest.get('memory', 0) / 2**30:.1f} GB"
            )
            # datatrove waits for such a node for ever: an autoscaling cluster may add one, the
            # instance started here will not.
            if connected_here and rc.address == "local":
                raise RayClusterError(f"{what}; lower them")
            log(f"note: {what}; the tasks wait until the cluster adds a node that large")
        cpus = sum(n.get("CPU", 0) for n in nodes)
        address = ray.get_runtime_context().gcs_address
        yield f"on Ray at {address} ({cpus:g} CPUs, {rc.cpus_per_task} per task)"
    finally:
        if connected_here:
            ray.shutdown()


class GristmillRayExecutor(RayPipelineExecutor):
    """RayPipelineExecutor whose failed tasks' exceptions reach the driver, with per-task temporary
    directories and, unless `verbose`, task logs in their log files only (as QuietLocalExecutor)."""

    def __init__(self, *args, verbose: bool = False, **kwargs):
        super().__init__(*args, log_first=verbose, **kwargs)
        self.verbose = verbose

    def run(self) -> None:
        if self.logging_dir.isdir(ERRORS_DIR):  # an earlier run's: not this run's failures
            self.logging_dir.rm(ERRORS_DIR, recursive=True)
        super().run()
        for rank in self.get_incomplete_ranks(range(self.world_size)):
            if self.logging_dir.isfile(path := f"{ERRORS_DIR}/{rank:05d}.pickle"):
                with self.logging_dir.open(path, "rb") as f:
                    raise pickle.load(f)

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1):
        # Runs in a process of its own (datatrove's per-task pool under the Ray actor).
        os.environ["RAYON_NUM_THREADS"] = str(self.cpus_per_task)
        quiet = contextlib.nullcontext() if self.verbose else loguru_to(None)
        with tempfile.TemporaryDirectory(prefix=f"gristmill-task-{rank:05d}-") as tmp, quiet:
            tempfile.tempdir = tmp
            try:
                return super()._run_for_rank(rank, local_rank, node_rank)
            except Exception as e:
                self._save_error(rank, e)
                raise
            finally:
                tempfile.tempdir = None

    def _save_error(self, rank: int, err: Exception) -> None:
        try:
            data = pickle.dumps(err)
            pickle.loads(data)
        except Exception:  # not picklable (or not rebuildable from its args): keep its text
            data = pickle.dumps(RuntimeError(f"{type(err).__name__}: {err}"))
        with self.logging_dir.open(f"{ERRORS_DIR}/{rank:05d}.pickle", "wb") as f:
            f.write(data)
