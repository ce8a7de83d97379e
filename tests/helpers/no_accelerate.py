"""`python -m tests.helpers.no_accelerate ENTRY ARGS`: ENTRY's `main(ARGS)` in a Python where
accelerate cannot be imported (as without the eval extra): train_runs.without_accelerate runs it
forked (tests/helpers/forked.py), whose server imports nothing that imports accelerate."""

from __future__ import annotations

import importlib
import sys

if __name__ == "__main__":
    sys.modules["accelerate"] = None  # `import accelerate` raises ImportError, as where it is missing
    entry, *args = sys.argv[1:]
    sys.exit(importlib.import_module(entry).main(args))
