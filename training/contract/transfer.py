"""A download checked against the sha256 its record gives, fetched once more when it differs: one
transfer damaged on the way (a proxy, a link) is not the bucket's object, and the repair of a bucket
(an upload, a task redone) is not the advice for it (trial RV71a F3). The one rule of every reader of
a bucket that holds a recorded sha256: the cache's files, `data validate`'s shards, a bucket build's
task outputs the driver writes dataset.json from."""

from __future__ import annotations

from pathlib import Path

from training.contract.dataset_format import DATASET_JSON, DatasetError
from training.contract.object_store import COUNTS, ObjectStore, endpoint, endpoint_setting


class DamagedInTransit(DatasetError):
    """Two fetches of an object gave different bytes, neither the recorded ones: the transfer's damage,
    not the bucket's (a reader's refusal; `data validate` records no verdict on the bucket for it)."""


def download_twice(
    store: ObjectStore,
    rel: str,
    dest: Path,
    size: int | None,
    sha256: str | None,
    if_match: str | None = None,
    trained: bool = True,
    recorded_by: str = DATASET_JSON,
) -> str:
    """Object `rel` into the new file `dest` (ObjectStore.download, `if_match` its ETag), fetched once
    more when it is not the `sha256` (and `size` bytes) `recorded_by` records: a damaged transfer.
    Returns the sha256 of what `dest` holds then: the recorded bytes, or bytes both fetches gave alike
    (the bucket's object, not as recorded: the caller's to refuse or check). Two fetches that differ,
    neither the recorded bytes, raise DamagedInTransit naming both (`trained`: said to a reader that
    trains, whose sample nothing trained on). No `sha256` (nothing recorded): one fetch."""
    got: list[tuple[str, int]] = []  # each fetch's (sha256, bytes)
    for attempt in (1, 2):
        digest = store.download(rel, dest, size if size is not None else 0, if_match=if_match)
        got.append((digest, dest.stat().st_size))
        if sha256 is None or (digest == sha256 and (size is None or got[-1][1] == size)):
            return digest
        if attempt == 1:
            COUNTS.add("refetches")
    if got[0] == got[1]:
        return digest
    (a, a_size), (b, b_size) = got
    raise DamagedInTransit(
        f"{store.url.child(rel)}: fetched twice, other bytes each time ({a_size:,} with sha256 {a[:16]}…, "
        f"then {b_size:,} with {b[:16]}…), neither what {recorded_by} records "
        f"({size_and_hash(size, sha256)}): " + damaged_in_transit(trained)
    )


def size_and_hash(size: int | None, sha256: str) -> str:
    """A record's size and sha256 as refusals name them: '1,234 bytes, sha256 0123456789abcdef…'."""
    return f"{'' if size is None else f'{size:,} bytes, '}sha256 {sha256[:16]}…"


def damaged_in_transit(trained: bool = True) -> str:
    """The end of the line refusing an object whose two fetches gave different bytes, neither the
    recorded ones: at least one transfer was damaged, so the bucket's object cannot be judged, and its
    repair is not the advice; one clean fetch of a damaged object beside a damaged one differs too
    (review RV71f 4), so the run again tells. `trained`: a reader's that trains (not `data validate`'s
    or a build's)."""
    return (
        "at least one transfer was damaged on the way (a proxy or link between here and the store)"
        + (", and nothing was trained on it" if trained else "")
        + f"; check the network to {endpoint_setting()} = {endpoint()}, then run again"
        + (" (a training: resume it)" if trained else "")
        + "; a rerun whose two fetches agree names the bucket's object"
    )
