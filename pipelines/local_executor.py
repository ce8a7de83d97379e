"""datatrove's LocalPipelineExecutor, watched: a worker process that dies stops the stage.

multiprocess.Pool replaces a worker that dies (the out-of-memory killer, a segfault in a native
library) but never returns a result for the task it held, so datatrove's `list(imap_unordered)`
waits forever. This executor waits for results with a timeout and, between waits, counts the
pool's worker processes: the pool starts exactly `workers` of them and only replaces a dead one,
so a pid beyond those is a death. The stage then stops with one line; the pool's context
terminates the other workers, and the tasks that finished keep their completion markers (a rerun
redoes only the rest). Otherwise it runs tasks as datatrove's `run()` does: with one worker, in the
build's process, one after the other, and with no process of its own.

Every process it starts ends with the build, also after a kill -9 of the build that runs none of
its cleanup (training/contract/lifetime.py): the pool's workers (forked by multiprocess's
forkserver, so they watch the build's pid, not their parent) and the manager process of its queue.
The forkserver and multiprocess's resource tracker then end by themselves (their pipes close).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import time
from copy import deepcopy
from functools import partial

import multiprocess
import multiprocess.pool
from datatrove.executor import LocalPipelineExecutor
from datatrove.utils.logging import logger
from datatrove.utils.stats import PipelineStats
from multiprocess.managers import SyncManager

from pipelines.build_identity import BuildError
from training.contract.lifetime import exit_with

POLL_S = 1.0  # how often the wait for the next result looks at the workers
HELP_S = 5.0  # how long the pool's end waits for its task queue's read lock (see _Pool)


class WorkerDied(BuildError):
    """A build worker process died, running a task or waiting for one (it held the pool's task queue)."""


class _Pool(multiprocess.pool.Pool):
    """multiprocess's Pool whose end does not wait forever for its task queue's read lock. A worker
    waiting for a task holds that lock; killed there (the out-of-memory killer takes an idle worker
    still holding a long document's memory), it holds it for good, and the pool's terminate() waited
    for it with the build's lock held and every task done (trial RV66b F1). The other workers hand it
    back within moments of the pool's end (its sentinels wake them); past HELP_S the end goes on
    without it: what it guards is the queue's draining, which only ending workers still read."""

    def terminate(self) -> None:
        # a stopped worker (SIGSTOP, a debugger) keeps the SIGTERM it is sent pending, and the end
        # joined it forever, the build's Ctrl-C too (trial RV66f F1): it runs on, to take it
        for worker in list(self._pool):
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
        super().terminate()

    @staticmethod
    def _help_stuff_finish(inqueue, task_handler, size):
        deadline = time.monotonic() + HELP_S
        while not inqueue._rlock.acquire(timeout=0.1):
            if time.monotonic() > deadline:
                break
        while task_handler.is_alive() and inqueue._reader.poll():
            inqueue._reader.recv()
            time.sleep(0)


class WatchedLocalExecutor(LocalPipelineExecutor):
    def run(self):
        preload_task_modules(self)
        if self.depends:  # datatrove's dependency wait
            return super().run()
        self._launched = True
        ranks = range(self.local_rank_offset, self.local_rank_offset + self.local_tasks)
        if all(map(self.is_rank_completed, ranks)):
            logger.info(f"Not doing anything as all {self.local_tasks} tasks have already been completed.")
            return None
        self.save_executor_as_json()
        ranks_to_run = self.get_incomplete_ranks(ranks)
        if (skipped := self.local_tasks - len(ranks_to_run)) > 0:
            logger.info(f"Skipping {skipped} already completed tasks")
        if self.workers == 1:
            stats = self._in_process(ranks_to_run)
        else:
            stats = self._in_pool(ranks_to_run, skipped)
        stats = sum(stats, start=PipelineStats())
        with self.logging_dir.open("stats.json", "wt") as statsfile:
            stats.save_to_disk(statsfile)
        logger.success(stats.get_repr(f"All {self.local_tasks} tasks"))
        return stats

    def _in_process(self, ranks_to_run: list[int]) -> list:
        """One worker's tasks, in the build's process as datatrove runs them, without the manager process
        datatrove starts for its queue of worker slots: it did not end with a build killed -9, and held
        the build's log and lock files for good (trial RV59b 3)."""
        slots = queue.SimpleQueue()
        slots.put(0)
        pipeline, stats = self.pipeline, []
        for rank in ranks_to_run:
            # each task's steps start fresh, as datatrove's loop gives them
            self.pipeline = deepcopy(pipeline)
            stats.append(self._launch_run_for_rank(rank, slots))
        return stats

    def _in_pool(self, ranks_to_run: list[int], skipped: int) -> list:
        build = os.getpid()
        mg = SyncManager(ctx=multiprocess.get_context())  # multiprocess.Manager(), ending with the build
        mg.start(exit_with, (build,))
        try:
            ranks_q = mg.Queue()
            for i in range(self.workers):
                ranks_q.put(i)
            completed = mg.Value("i", skipped)
            completed_lock = mg.Lock()
            ctx = multiprocess.get_context(self.start_method)
            with _Pool(self.workers, initializer=exit_with, initargs=(build,), context=ctx) as pool:
                run_rank = partial(
                    self._launch_run_for_rank,
                    ranks_q=ranks_q,
                    completed=completed,
                    completed_lock=completed_lock,
                )
                return self._collect(pool, pool.imap_unordered(run_rank, ranks_to_run), len(ranks_to_run))
        finally:
            mg.shutdown()

    def _collect(self, pool, results, n: int) -> list:
        out: list = []
        seen: dict[int, object] = {}  # every worker process the pool has had, by pid
        while len(out) < n:
            for worker in list(pool._pool):  # private, but the only view of the workers Pool gives
                seen.setdefault(worker.pid, worker)
            if len(seen) > self.workers:
                raise WorkerDied(_death_message(seen.values(), self.workers))
            try:
                out.append(results.next(timeout=POLL_S))
            except multiprocess.TimeoutError:
                continue
        return out


def preload_task_modules(executor: LocalPipelineExecutor) -> None:
    """What a task imports, imported once by the forkserver that forks the build's workers, not by
    every worker: unpickling a task imports the executor's module and each step's (~1 s of datatrove,
    the tokenizer and pyarrow), and pyarrow imports pandas at its first parquet write (~0.4 s). The
    forkserver starts with the build's first pool and serves every later stage (a list set after
    that is ignored); '__main__' stays first, as multiprocess has it by default."""
    if executor.start_method != "forkserver":
        return
    steps = [type(step).__module__ for step in executor.pipeline if hasattr(step, "run")]  # not functions
    modules = dict.fromkeys(["__main__", type(executor).__module__, *steps, "pandas"])
    multiprocess.get_context("forkserver").set_forkserver_preload(list(modules))


def _death_message(workers, started: int) -> str:
    codes = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
    code = codes[0] if codes else None
    how = "died" if code is None else f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    # fewer workers first: the same command goes on from the finished tasks, where a filters.max_chars
    # changes what is built (refused over this output's tasks: trial RV66b F3)
    hint = (
        ": what the out-of-memory killer sends; a very long document can take ~100× its size while it "
        "is processed: rerun with fewer build.workers, or build into a new output with filters.max_chars"
        if code == -9
        else ""
    )
    # running a task or waiting for one (holding the pool's task queue: the stage cannot go on)
    return f"a build worker process died ({how}{hint}); the pool of {started} workers was stopped"
