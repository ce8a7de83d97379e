"""Free disk before a large write, and the one way sizes are printed.

The build (before it starts and before a task writes its shards), the download and the trainer's
checkpoint guard all ask the same question: does the filesystem that will hold PATH have room for
NEED bytes and still keep KEEP bytes free? `shortfall` answers it; `check_free` turns a no into a
DiskFullError whose message names the path, what is free, needed and kept, then the caller's
advice (which setting to change is the caller's to say: build.min_free_gb, checkpoint.keep_last …).
Sizes in messages use `fmt_bytes`: binary units, B/KiB/MiB/GiB/TiB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from training.contract.errors import GristmillError


class DiskFullError(GristmillError):
    """Not enough free disk for a write; the message names the path, the sizes and the fix."""


def fmt_bytes(n: float) -> str:
    """`512 B`, `1.50 KiB`, `3.00 GiB` (binary units; TiB for anything larger)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def free_bytes(path: str | Path) -> int:
    """Free bytes on the filesystem that holds `path` (or would, once its missing parents are made)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def shortfall(path: str | Path, need_bytes: float, keep_bytes: float = 0) -> tuple[int, float] | None:
    """(free, missing) when writing `need_bytes` under `path` would leave less than `keep_bytes`
    free, else None."""
    free = free_bytes(path)
    missing = need_bytes + keep_bytes - free
    return (free, missing) if missing > 0 else None


def check_free(
    path: str | Path,
    need_bytes: float,
    *,
    what: str,
    advice: str,
    keep_bytes: float = 0,
    keep_setting: str = "",
) -> None:
    """Raise DiskFullError unless `path`'s filesystem keeps `keep_bytes` free after `need_bytes`:
    "not enough free disk under PATH to WHAT: F free, N needed plus K kept free (KEEP_SETTING);
    ADVICE"."""
    short = shortfall(path, need_bytes, keep_bytes)
    if short is None:
        return
    kept = ""
    if keep_bytes:
        kept = f" plus {fmt_bytes(keep_bytes)} kept free" + (f" ({keep_setting})" if keep_setting else "")
    raise DiskFullError(
        f"not enough free disk under {path} to {what}: {fmt_bytes(short[0])} free, "
        f"{fmt_bytes(need_bytes)} needed{kept}; {advice}"
    )
