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

A Ray instance started here (build.ray.address = "local") listens on loopback only: Ray's cluster
API runs whatever code it is sent, so it must not be reachable from other machines
(init_local_ray).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pickle
import socket
import tempfile
from collections.abc import Iterator

from datatrove.executor.ray import RayPipelineExecutor

from pipelines.build_logs import loguru_to
from pipelines.config import RayConfig
from training.contract.errors import GristmillError

ERRORS_DIR = "errors"
LOOPBACK = "127.0.0.1"
# Ray's switch for a local-only instance (its default on macOS and Windows); read when ray is imported.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayClusterError(GristmillError):
    """No Ray cluster to run the build on, or one too small for a single task."""


def init_local_ray(**kwargs) -> None:
    """ray.init() of a new Ray instance on this machine, without dashboard, that listens on 127.0.0.1
    only; a RayClusterError (and no instance) where this Ray version would listen elsewhere.

    Ray binds its servers (GCS, raylet, object manager, workers, dashboard/metrics and runtime-env
    agents) to the node's IP address, which on Linux it takes to be the routable one: whoever can
    reach the machine could submit work. ray.init(_node_ip_address="127.0.0.1") alone does not help:
    Ray replaces a loopback address with that one. Ray's local-only mode does (node IP 127.0.0.1,
    servers bound to it). It is switched on for the processes ray.init() starts (LOCAL_ONLY_ENV, in
    the environment they inherit) and for this one (whose ray has read that variable already).
    """
    import ray
    from ray._private import ray_constants

    env, cluster = os.environ.get(LOCAL_ONLY_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False, **kwargs)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster
        if env is None:
            del os.environ[LOCAL_ONLY_ENV]
        else:
            os.environ[LOCAL_ONLY_ENV] = env
    node_ip = ray.util.get_node_ip_address()
    if not ipaddress.ip_address(node_ip).is_loopback:
        ray.shutdown()
        raise RayClusterError(
            f'the Ray instance started for build.ray.address = "local" listens on {node_ip}, not on '
            f"loopback only (Ray {ray.__version__} ignores {LOCAL_ONLY_ENV}=0); start a cluster "
            '(`ray start --head`) and set build.ray.address to it, or use build.executor = "local"'
        )


def _answers(address: str, timeout_s: float = 10.0) -> None:
    """Raise ConnectionError where nothing accepts a TCP connection at a "HOST:PORT" (or
    "ray://HOST:PORT") address: ray.init retries such an address for ever, printing only Ray's own
    warnings (trial RV71c 3). "auto" and other forms are Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {host}:{port}: {e.strerror or e}") from None


@contextlib.contextmanager
def ray_cluster(rc: RayConfig, verbose: bool, log=print) -> Iterator[str]:
    """Connect to (or start) the cluster build.ray describes unless this process already is
    connected; yields a description for the build's first line; disconnects what it connected."""
    import ray

    connected_here = not ray.is_initialized()
    if connected_here:
        options = dict(log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.WARNING)
        try:
            if rc.address == "local":
                # Loopback only. The build's own progress line replaces the dashboard; a
                # long-lived cluster (`ray start --head`) keeps its own.
                init_local_ray(**options)
            else:
                _answers(rc.address)
                ray.init(address=rc.address, **options)
        except RayClusterError:
            raise
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
        try:
            super().run()
        except Exception:
            # a failed task's own error says why, not what Ray's wait raised after it (once, under load:
            # "SystemError: CoreWorker.wait returned a result with an exception set")
            if (saved := self._saved_error()) is None:
                raise
            raise saved from None
        if (saved := self._saved_error()) is not None:
            raise saved

    def _saved_error(self) -> Exception | None:
        """The exception the first failed task saved (`_save_error`), None if none did."""
        for rank in self.get_incomplete_ranks(range(self.world_size)):
            if self.logging_dir.isfile(path := f"{ERRORS_DIR}/{rank:05d}.pickle"):
                with self.logging_dir.open(path, "rb") as f:
                    return pickle.load(f)
        return None

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
