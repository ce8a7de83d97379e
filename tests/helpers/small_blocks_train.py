"""`python -m tests.helpers.small_blocks_train ARGS`: training.train's command line with the object
storage tests' small blocks (tests/test_object_storage.py, `small_blocks`: epoch groups of one block,
held-out blocks of 4 documents) and a prefetcher that plans one step ahead, for torchrun's workers,
which the test's monkeypatch does not reach: a store that goes down mid-run meets a fetch at the next
step, as in the one-process run (GRISTMILL_TEST_AHEAD_STEPS: more steps ahead, so that a store gone
down meets the prefetcher while the loop still trains on what it fetched)."""

from __future__ import annotations

import os
import sys

from training.data import block_cache
from training.data import order as epoch_order
from training.train import main

epoch_order.BLOCK_DOCS = 4
epoch_order.GROUP_BLOCKS = 1
block_cache.MAX_AHEAD_STEPS = int(os.environ.get("GRISTMILL_TEST_AHEAD_STEPS", "1"))

if __name__ == "__main__":
    sys.exit(main())
