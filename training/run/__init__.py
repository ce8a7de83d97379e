"""The run's own machinery: what happens around each training step, and what guards the run.

- preflight.py     the checks before any work, also the launcher's before torchrun (imports no trainer)
- setup.py         the run's parts built in order (`Run`)
- verdict.py       one verdict per step: the non-finite tally, the loss, the spike finding, the action
- timeline.py      the run's history: kept, skipped and discarded steps
- record.py        the run directory's one writer of what describes the timeline; the pending row
- batch_digests.py each step's global-batch digest from the ranks' row digests, gathered at rows and saves
- validation.py    held-out loss during training, with its own cadence
- rewind.py        going back past a loss spike: a checkpoint restored, the next steps' data skipped
- faults.py        faults tests inject into a real run through the environment (tests only)
- lock.py          one process tree writes a run directory at a time (RUN/.gristmill.lock)
- shutdown.py      SIGTERM/SIGINT finish the step and save; no worker outlives its launcher
- worker_reply.py  a worker's one-line error, handed to the launcher that prints it
"""
