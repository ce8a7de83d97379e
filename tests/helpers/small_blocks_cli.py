"""`python -m tests.helpers.small_blocks_cli ARGS`: gristmill's command line (pipelines.cli) with the
object storage tests' small blocks (tests/test_object_storage.py, `small_blocks`: epoch groups of one
block, held-out blocks of 4 documents), for a command run in a process of its own (a mount namespace:
tests/helpers/mounts.py), which the test's monkeypatch does not reach."""

from __future__ import annotations

import sys

from pipelines.cli import main
from training.data import order as epoch_order

epoch_order.BLOCK_DOCS = 4
epoch_order.GROUP_BLOCKS = 1

if __name__ == "__main__":
    sys.exit(main())
