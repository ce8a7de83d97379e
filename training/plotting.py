"""matplotlib for the PNGs gristmill writes (loss.png, plan.png, eval.png, the audit's plots), in one
place: the file-only Agg backend (no display needed), and matplotlib imported only when a plot is
drawn, so training/ runs where it is not installed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from training.contract.atomic_write import tmp_path_for


def agg_pyplot(required: bool = True) -> ModuleType | None:
    """matplotlib.pyplot on the Agg backend. When matplotlib is not installed: the ImportError, or
    None with required=False (a caller that can do without its plot returns a note instead)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if required:
            raise
        return None
    return plt


def save_figure(plt: ModuleType, fig: Any, path: Path, **kw: Any) -> str | None:
    """`fig` saved as `path` (through a temporary file: a full disk left a partial PNG over the last
    good one, review R22h M8) and closed; a warning line instead when it cannot be written (a directory
    of its name, a full disk): a picture of a run never costs it (a finished run ended in a traceback,
    exit 1: R22f T1). A command whose product is the picture raises on the warning itself."""
    tmp = tmp_path_for(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a file of its folder's name: R22i M6
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **kw)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return f"warning: {path} not drawn ({e.strerror or e})"
    finally:
        plt.close(fig)
    return None
