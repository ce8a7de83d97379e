"""Private mount namespaces for tests that need a full or read-only filesystem without root."""

from __future__ import annotations

import shutil
import subprocess


def unshare_works() -> bool:
    """`unshare -rm` can make a mount namespace here (a tmpfs mount inside it succeeds)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True
    )
    return probe.returncode == 0


def sh_quote(word: str) -> str:
    """`word` as one sh word (for the `unshare -rm sh -c` scripts)."""
    return "'" + word.replace("'", "'\\''") + "'"
