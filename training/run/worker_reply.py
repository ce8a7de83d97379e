"""What a torchrun worker leaves for `gristmill train`'s launcher (training/launch.py).

train.py prints a GristmillError on rank 0 only: config and data errors are every rank's, said
once. An error that only another rank met (its shard, its disk) would then reach the user as a bare
exit status, so every rank also writes its error into torchrun's per-worker reply file
(TORCHELASTIC_ERROR_FILE, the file torchrun reads into ProcessFailure.message), marked as ours, and
rank 0 marks its reply as printed; the launcher prints a reply when no worker printed its error.
(Rank 0's exit status cannot say that: torchrun may stop it with SIGTERM after it printed, in its
teardown, when another rank ended first of its error; so the reply carries the worker's own status
too, which the launcher takes for such a rank: trial RV65f 2.)
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

REPLY_KEY = "gristmill"  # in a reply: 1, or "printed" when the worker printed the message itself
STATUS_KEY = "status"  # in a reply: the exit status the worker is ending with


def report_to_launcher(message: str, printed: bool, status: int) -> None:
    """Leave `message` and the exit `status` it ends with in torchrun's reply file for this worker, if
    it has one (never raises); call it before printing, so a worker stopped right after its print
    still has its reply."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    reply = {
        "message": message,
        "timestamp": int(time.time()),
        REPLY_KEY: "printed" if printed else 1,
        STATUS_KEY: status,
    }
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(reply))
