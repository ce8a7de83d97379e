"""A file of the Hugging Face hub cache held to the name the cache gives its bytes.

huggingface_hub keeps each downloaded file once, as blobs/<etag>, and links snapshots/<commit>/NAME
to it. The etag is the hub's digest of the file: an LFS file's sha256 (weights, parquet), any other
file's git blob sha1 (config.json, tokenizer.json). A copy damaged in the cache, or altered on its
way in, keeps the name of the bytes the hub holds: the name is a claim beside the data, and here
the data is compared with it before it is used (reviews R25k 1, RV62c S1).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from training.contract.dataset_format import file_sha256

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")


def git_blob_sha1(path: str | Path, chunk: int = 1 << 22) -> str:
    """The git blob id of a file: sha1 of `blob <size>\\0` and its bytes (the hub's etag of a file
    kept outside LFS)."""
    h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hub_copy_damage(path: str | Path, sha256: str | None = None) -> str | None:
    """The one line that says a hub cache snapshot's file `path` is not the bytes its blob is named
    by (and how to fetch it anew), or None: it is, or `path` is no link to a named blob (a local
    directory's file, a cache that copies instead of linking). `sha256`: the file's, where the caller
    hashed it already."""
    path = Path(path)
    if not path.is_symlink():
        return None
    blob = Path(os.readlink(path))
    if blob.parent.name != "blobs":
        return None
    if _SHA256.fullmatch(blob.name):
        kind, got = "sha256", sha256 or file_sha256(path)
    elif _SHA1.fullmatch(blob.name):
        kind, got = "git blob sha1", git_blob_sha1(path)
    else:
        return None
    if got == blob.name:
        return None
    return (
        f"{path}: the hub cache's copy is damaged ({kind} {got[:12]}…, the hub's is {blob.name[:12]}…); "
        f"delete {path.resolve()} and run again with network (HF_HUB_OFFLINE unset): it is fetched anew"
    )
