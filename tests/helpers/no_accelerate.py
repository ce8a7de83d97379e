"""`python -m tests.helpers.no_accelerate ENTRY ARGS`: ENTRY's `main(ARGS)` in a Python where
accelerate cannot be imported (as without the eval extra): train_runs.without_accelerate runs it
forked (tests/helpers/forked.py), whose server imports nothing that imports accelerate."""

from __future__ import annotations

import importlib
import sys

if __name__ == "__main__":
    # forked: what the server preloaded was imported with accelerate there; one of its modules that
    # imports accelerate would fail to import without it, which a fresh interpreter shows
    preloaded = sorted(m for m in sys.modules if m == "accelerate" or m.startswith("accelerate."))
    assert not preloaded, f"a module the forked server preloads imports {preloaded[0]}"
    sys.modules["accelerate"] = None  # `import accelerate` raises ImportError, as where it is missing
    entry, *args = sys.argv[1:]
    sys.exit(importlib.import_module(entry).main(args))
