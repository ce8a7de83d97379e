"""matplotlib for the PNGs gristmill writes (loss.png, plan.png, eval.png, the audit's plots), in one
place: the file-only Agg backend (no display needed), and matplotlib imported only when a plot is
drawn, so training/ runs where it is not installed.
"""

from __future__ import annotations

from types import ModuleType


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
