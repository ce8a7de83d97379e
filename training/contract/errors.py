"""User-facing errors: every stage raises a subclass, and the CLI prints it as one line, no traceback."""

from pathlib import Path


class GristmillError(ValueError):
    """Bad input or config. The message names the file or key and says how to fix it."""

    exit_code = 2  # the CLI's exit status for it


def unwritable(where: str | Path, e: OSError) -> GristmillError:
    """The one line for a directory that cannot be written (read-only, permissions, full disk)."""
    return GristmillError(
        f"cannot write {e.filename or where}: {e.strerror or e}; make {where} writable (or free space), or "
        "write somewhere else"
    )


class NonFiniteError(GristmillError):
    """Training produced a NaN or inf (loss, gradient, weights); nothing non-finite was saved.
    The CLI exits with `exit_code` so a scheduler can tell divergence from bad input."""

    exit_code = 3
