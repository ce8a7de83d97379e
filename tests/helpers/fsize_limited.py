"""`python -m tests.helpers.fsize_limited BYTES MODULE ARGS`: `python -m MODULE ARGS` in a process that
may write files of at most BYTES (`ulimit -f`), the limit set by the process itself before MODULE
runs (what a subprocess's preexec_fn set), so that the command can be forked (tests/helpers/forked.py)."""

from __future__ import annotations

import os
import resource
import sys

from tests.helpers.forked import become

if __name__ == "__main__":
    limit, module, *args = sys.argv[1:]
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), int(limit)))
    become(module, args, dict(os.environ), os.getcwd())
