"""A datatrove step that says which process imported its module: the build's forkserver, before it
forked the worker (pipelines/local_executor.preload_task_modules), or the worker itself, while it
unpickled its task. `python -m tests.helpers.preload_probe OUT` runs it as a stage of two tasks on two
workers of WatchedLocalExecutor; each task writes OUT/<rank>.json."""

from __future__ import annotations

import json
import os
import sys

from datatrove.pipeline.base import PipelineStep

IMPORTED_IN = os.getpid()


class ImportProbe(PipelineStep):
    name = "import probe"

    def __init__(self, out: str):
        super().__init__()
        self.out = out

    def run(self, data, rank: int = 0, world_size: int = 1):
        with open(f"{self.out}/{rank}.json", "w") as f:
            json.dump({"worker": os.getpid(), "imported_in": IMPORTED_IN}, f)
        yield from data or ()


if __name__ == "__main__":
    from pipelines.local_executor import WatchedLocalExecutor
    from tests.helpers.preload_probe import ImportProbe as Probe  # under its module's name, not __main__

    out = sys.argv[1]
    WatchedLocalExecutor([Probe(out)], tasks=2, workers=2, logging_dir=f"{out}/logs").run()
