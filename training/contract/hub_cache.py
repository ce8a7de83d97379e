"""A file of the Hugging Face hub cache held to the name the cache gives its bytes.

huggingface_hub keeps each downloaded file once, as blobs/<etag>, and links snapshots/<commit>/NAME
to it. The etag is the hub's digest of the file: an LFS file's sha256 (weights, parquet), any other
file's git blob sha1 (config.json, tokenizer.json). A copy damaged in the cache, or altered on its
way in, keeps the name of the bytes the hub holds: the name is a claim beside the data, and here
the data is compared with it before it is used (reviews R25k 1, RV62c S1).

A snapshot's file that is no link (edited in place by `sed -i`, copied in, or a cache copied with its
links followed: `cp -rL`, `rsync -L`) has no such name: it is held to the hub's digest in the commit's
listing, which snapshot_download keeps as trees/<commit>.json, and without one to the name of a blob
the cache holds. A file the listing lacks was never the commit's. Unchecked, such a copy was trained
on and recorded as the hub commit's (trial RV78b 1-3).
"""

from __future__ import annotations

import hashlib
import json
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
    """The one line that says a hub cache snapshot's file `path` is not the bytes the hub holds under
    its name (and how to fetch it anew), or None: it is, or `path` is no file of a hub cache snapshot
    (a local directory's). `sha256`: the file's, where the caller hashed it already."""
    path = Path(path)
    snapshot = _snapshot_of(path)
    if snapshot is None:
        return None
    repo, commit, name = snapshot
    listed = _listing(repo, commit)
    fix = f"delete {path.resolve()} and run again with network (HF_HUB_OFFLINE unset): it is fetched anew"
    if listed is not None:
        if not isinstance(entry := listed.get(name), dict):
            return (  # nothing fetches it anew: the commit has none (review RV78c 5a)
                f"{path}: the hub's commit {commit[:12]}… holds no {name} (its listing in the cache, "
                f"{repo / 'trees' / (commit + '.json')}): it was put into the snapshot by hand; delete it"
            )
        want = entry.get("lfs_sha256") or entry.get("blob_id")  # an LFS file's blob_id is its pointer's
    elif path.is_symlink() and (blob := Path(os.readlink(path))).parent.name == "blobs":
        want = blob.name
    else:  # no listing, no link: its bytes are one of the blobs the cache fetched, or unknown (the
        # sha1 only where the sha256 names none: a weights file is not read twice, review RV78c 5b)
        blobs = repo / "blobs"
        if (blobs / (sha256 or file_sha256(path))).is_file() or (blobs / git_blob_sha1(path)).is_file():
            return None
        # a cache written without links (HF_HUB_DISABLE_SYMLINKS, a filesystem without them) keeps no
        # blobs: the listing a run with network fetches holds the hub's digests (review RV78c 3)
        return (
            f"{path}: nothing in the hub cache holds its bytes to the hub's: no listing of commit "
            f"{commit[:12]}… ({repo / 'trees'}) and no blob of them in {blobs} (a cache written without "
            "links, or the file edited in place or copied in); run once with network (HF_HUB_OFFLINE unset), "
            f"which fetches the commit's listing, or delete {path}: it is fetched anew"
        )
    if not isinstance(want, str):
        return None
    if _SHA256.fullmatch(want):
        kind, got = "sha256", sha256 or file_sha256(path)
    elif _SHA1.fullmatch(want):
        kind, got = "git blob sha1", git_blob_sha1(path)
    else:
        return None
    if got == want:
        return None
    return f"{path}: the hub cache's copy is damaged ({kind} {got[:12]}…, the hub's is {want[:12]}…); {fix}"


def _snapshot_of(path: Path) -> tuple[Path, str, str] | None:
    """(the repo's cache folder, the commit, the file's name in the repo) of a file under
    `<cache>/models--ORG--NAME/snapshots/<commit>/` (datasets--, spaces-- too), else None."""
    parts = path.absolute().parts
    for i in range(len(parts) - 3, 0, -1):
        if parts[i] == "snapshots" and _SHA1.fullmatch(parts[i + 1]) and "--" in parts[i - 1]:
            return Path(*parts[:i]), parts[i + 1], "/".join(parts[i + 2 :])
    return None


def _listing(repo: Path, commit: str) -> dict | None:
    """The commit's files as the hub listed them (huggingface_hub's trees/<commit>.json: each one's
    blob_id and, for LFS, lfs_sha256), or None where the cache keeps none."""
    try:
        files = json.loads((repo / "trees" / f"{commit}.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files if isinstance(files, dict) else None
