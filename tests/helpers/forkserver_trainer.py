"""`python -m training.train ARGS` with multiprocessing's start method set to forkserver first (Python
3.14's default on Linux, or a caller's choice): a module, so that a test forks it
(tests/helpers/forked.py) rather than start a fresh interpreter (`force`: a forked child was itself
started by a forkserver, and has that start method set already)."""

from __future__ import annotations

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.set_start_method("forkserver", force=True)
    from training.train import main

    sys.exit(main(sys.argv[1:]))
