"""A dataset in a bucket, read through a local directory in the cache (docs/object-storage.md).

`local_root(location, cache)` is where every reader opens a dataset: a local dataset's own directory
(read in place, as ever), or for an s3:// URL the cache's directory of its fingerprint. There
dataset.json is fetched at every open (one GET: the bucket's commit point says which dataset the URL
holds now), and every other file on first need (`ensure`): downloaded under a temporary name,
checked against the sha256 dataset.json records (fetched once more if it differs, then refused in
one line naming the object, or the transfer where the two fetches differ), then renamed into place,
so no reader ever opens a file that is not the dataset's. The documents are read by range, a loader
block at a time, through the bounded cache of training/data/block_cache.py, each checked against the
index's per-document sha256.

    .NAME.lock                   beside the cache, NAME its folder's name (node_lock_file), after
    NAME/ = CACHE/               [data] cache_dir (default ~/.cache/gristmill/datasets)
      .lock                      in it (node_lock): one download (or eviction) at a time on this node
      <fingerprint>/             a dataset's copy: .origin.json (its URL), dataset.json,
                                 index/, tokenizer.json, manifest/ … as needed, blocks/ (bounded)
      keep/                      what each live loader reads next (block_cache.py)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from training.console import say
from training.contract.atomic_write import move_into_place, write_atomic
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import (
    DATASET_JSON,
    TASK_RECORDS_DIR,
    TOKENIZER_JSON,
    DatasetError,
    check_fingerprint,
    dataset_files,
    file_sha256,
    parse_dataset_info,
    read_dataset_info,
    recorded_paths,
    rewrite_bucket_dataset_json,
)
from training.contract.dataset_index import INDEX_DIR, SHARD_ROWS, shard_rows_of
from training.contract.file_lock import LockHeld, file_lock
from training.contract.lifetime import host
from training.contract.object_store import (
    COUNTS,
    FETCH_TIMEOUT_S,
    ObjectCutShort,
    ObjectMissing,
    ObjectStore,
    ObjectURL,
    endpoint,
    is_url,
    refuse_url,
    user_cache_dir,
)
from training.contract.transfer import download_twice, size_and_hash

ORIGIN = ".origin.json"  # in a dataset's cache directory: {"url": …}; local datasets have none
VERIFIED = ".verified.json"  # beside it: {path: sha256} of the copied files the fingerprint does not cover
# The node lock's file in the cache, which every path to the cache shares (node_lock: taken first)
LOCK = ".lock"
DEFAULT_CACHE_GB = 100.0
DEFAULT_FETCH_REQUESTS = 8  # range requests in flight per loader: a store serves many at once
DEFAULT_FETCH_TIMEOUT_S = FETCH_TIMEOUT_S  # how long a fetch keeps retrying before the run stops
# How long a wait for a cache lock goes on while its holder is not seen running (stopped, on another
# host): a training's data.fetch_timeout_s (no data comes meanwhile), this default elsewhere (the data
# commands). A running holder is waited for: it is fetching, and its fetches are bounded.
LOCK_WAIT_S = DEFAULT_FETCH_TIMEOUT_S
_LOCK_FIX = (
    "resume that process or end it, or give this command a cache of its own (data.cache_dir in a train "
    "config, --cache-dir in the data commands)"
)


def tmp_name(name: str) -> str:
    """A download's temporary name beside `name`: `.NAME.HOST.PID.tmp` (the host without dots), so
    that the cache can tell a dead process's leftover (block_cache._remove_dead_tmp)."""
    return f".{name}.{host()}.{os.getpid()}.tmp"


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/gristmill/datasets, else ~/.cache/gristmill/datasets."""
    return user_cache_dir() / "datasets"


@dataclass(frozen=True)
class CacheSettings:
    """Where datasets from buckets are cached on this node, the bound on their blocks' bytes, and how
    they are fetched ([data] cache_dir, cache_gb, fetch_requests)."""

    dir: Path
    max_bytes: int
    requests: int = DEFAULT_FETCH_REQUESTS
    timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    bound_key: str = "data.cache_gb"  # what the user set max_bytes by, for messages

    @classmethod
    def of(
        cls,
        cache_dir: str = "",
        cache_gb: float = DEFAULT_CACHE_GB,
        requests: int = DEFAULT_FETCH_REQUESTS,
        timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        bound_key: str = "data.cache_gb",
        dir_key: str = "data.cache_dir",
    ) -> CacheSettings:
        """From `[data] cache_dir` ("" for the default), `cache_gb`, `fetch_requests`, `fetch_timeout_s`
        (`bound_key`, `dir_key`: a command's own names for cache_gb and cache_dir, e.g. --cache-gb)."""
        refuse_url(dir_key, cache_dir)
        where = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        return cls(where, int(cache_gb * 1e9), requests, timeout_s, bound_key)


def add_cache_argument(parser, bounded: bool = False) -> None:
    """`--cache-dir` of the commands that read a dataset without a training config (inspect, validate,
    audit): where an s3:// dataset's copy goes (data.cache_dir's role); with `bounded` (inspect, which
    reads samples through the bounded cache as a loader does) `--cache-gb` too, the most it holds
    (data.cache_gb's). validate and audit fetch whole files, outside the bound (`cache_of`)."""
    parser.add_argument(
        "--cache-dir",
        action=PathArgument,
        default="",
        metavar="DIR",
        help="where an s3:// dataset's files are cached, each checked by sha256 (default: "
        "~/.cache/gristmill/datasets, under $XDG_CACHE_HOME if set)",
    )
    if bounded:
        parser.add_argument(
            "--cache-gb",
            type=_positive_gb,
            metavar="GB",
            help=f"the most the samples cached hold (default {DEFAULT_CACHE_GB:g}); in a cache a run reads "
            "from, its data.cache_gb (the bound holds for all of them together)",
        )


def _positive_gb(value: str) -> float:
    try:
        gb = float(value)
    except ValueError:
        gb = float("nan")
    if not gb > 0 or gb == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a size in GB above 0 (e.g. 100)")
    return gb


def cache_of(args) -> CacheSettings:
    """The cache of a command's --cache-dir (and --cache-gb, where it has one: add_cache_argument)."""
    if not hasattr(args, "cache_gb"):  # validate, audit: whole files, outside the bound
        return CacheSettings.of(args.cache_dir, dir_key="--cache-dir")
    gb = DEFAULT_CACHE_GB if args.cache_gb is None else args.cache_gb
    return CacheSettings.of(args.cache_dir, gb, bound_key="--cache-gb", dir_key="--cache-dir")


@contextlib.contextmanager
def node_lock(cache_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The cache's one lock: downloads and evictions of every process on the node take turns, so no
    file is downloaded twice and the bound is checked against a size nobody else is changing. Two
    files, both held inside: CACHE/.lock, in the cache's own file system, which every path to the
    cache shares (a bind mount, a pod's hostPath, an NFS mount root, whose folder above differs by path
    or namespace: review RV28a F1) and an earlier version takes too; and the one beside the cache
    (node_lock_file), which no emptying of the cache removes, so a fetch that comes after an emptying
    takes a new CACHE/.lock and still waits for the holder there (E28a). No wait at one of them holds
    the other: CACHE/.lock is waited for, then the file beside tried; where it is held, CACHE/.lock is
    let go, the file beside waited for alone (the ordinary wait), let go, and all begins again, which
    only a holder's leaving brings about. So every waiter waits for the holder itself, names it, and
    ends at its bound when it is stopped: a waiter that held one file while it waited at the other was
    taken by those behind it for a running holder, their clocks stopped, and the k-th ended after k
    bounds (review RV28b F1 with the file beside first, RV28e F1 with CACHE/.lock first and the cache
    emptied under a stopped holder); and a version that takes the two in either order cannot deadlock
    with this one (RV28e F3). The file beside's note is said only once CACHE/.lock is held (a cache
    that cannot be written is its one line, not a note first: RV28b F2). A file beside that cannot be
    opened or written (a full or read-only folder above, another user's file) is skipped with a note
    (_beside_lock); CACHE/.lock still makes every process take turns."""
    beside = node_lock_file(cache_dir)
    while True:
        with contextlib.ExitStack() as held:
            held.enter_context(cache_lock(cache_dir, Path(cache_dir) / LOCK, wait_s))
            try:
                held.enter_context(_beside_lock(beside, wait_s, block=False))
            except LockHeld:
                pass
            else:
                yield
                return
        with _beside_lock(beside, wait_s):  # CACHE/.lock let go: the ordinary, bounded wait
            pass


def node_lock_file(cache_dir: Path) -> Path:
    """The node lock's file beside the cache: `.NAME.lock` in the folder above the cache directory NAME,
    which no emptying of the cache (`rm -rf CACHE/*` or `rm -rf CACHE`, to free a disk) removes. Alone
    in the cache (CACHE/.lock), an emptying removed the lock under its holder: the next fetch made
    another, locked it and made room at the same time, both counting the same free bytes, and the
    cache went a sample past data.cache_gb (E28a). Still a lock file, not the directory's own lock: a
    file's flock is held by the server on NFS, and its holder's record is read through the waiter's own
    descriptor (review RV27e). The cache is named by its real path: a symlink to it shares this file,
    as its files; a bind mount or another mount namespace does not (node_lock's CACHE/.lock does)."""
    real = Path(os.path.realpath(cache_dir))
    return real.parent / f".{real.name}.lock"


_SKIPPED: set[Path] = set()  # the files beside a cache this process said it cannot use (_beside_lock)


@contextlib.contextmanager
def _beside_lock(path: Path, wait_s: float, block: bool = True) -> Iterator[None]:
    """file_lock on `path`, the node lock's file beside the cache, or nothing where it cannot be made,
    opened or written (a full disk above the cache's own, a read-only folder, a directory at that
    path, a file root made 0644 or another user left in a sticky /tmp): node_lock's CACHE/.lock still
    makes every process take turns, and only the emptying's protection is lost, which one note per
    process says (review RV28a F2, F3, F5: such a file stopped the run with a line blaming a cache that
    had room). A holder that holds it and is not seen running is a LockWaitError, as ever: a wait's
    verdict, never a reason to skip. A holder record that cannot be written (a disk with an inode but
    no block to spare) is let go at once: where /proc/locks does not name this process either (a holder
    on another node of an NFS folder), its waiters would take it for one that left no details, not
    running, and end their wait. Not `block`: LockHeld where another holds it (file_lock's try)."""
    with contextlib.ExitStack() as held:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if held.enter_context(file_lock(path, wait_s=wait_s, fix=_LOCK_FIX, say=say, block=block)):
                why = ""
            else:
                why = "its holder's record cannot be written in it"
        except OSError as e:
            why = e.strerror or str(e)
        if why:
            held.close()
            if path not in _SKIPPED:
                _SKIPPED.add(path)
                say(
                    f"note: the cache's lock file beside it, {path}, cannot be used ({why}); its lock in "
                    "the cache alone makes this node's processes take turns, and an emptying of the cache "
                    "while a fetch holds that lock may put it a sample past cache_gb until a later fetch "
                    f"lists it (make {path} a file this user can write, on a disk with room, or give "
                    "data.cache_dir a folder inside the cache's own disk)"
                )
        yield


@contextlib.contextmanager
def cache_lock(
    cache_dir: Path,
    path: Path,
    wait_s: float = LOCK_WAIT_S,
    say_own: bool = True,
    give_up: Callable[[], None] | None = None,
) -> Iterator[None]:
    """file_lock on `path`, a lock file in the cache `cache_dir` (CACHE/.lock, a sample's .lock-K), made with
    its folder. One that cannot be made or opened (a read-only or full disk, a folder that became a
    file, another user's lock file) is the cache's one line, which the trainer stops on after saving
    its last step: a bare OSError was a traceback, the steps since the last checkpoint lost (review
    R19b 5). A wait says whom it waits for after a second, and ends in one line once the holder was
    not seen running for `wait_s` (LOCK_WAIT_S; a stopped training held the node's cache and the next
    one hung without a word: review R26b M2); not `say_own`: a wait for another thread of this process
    is not told (file_lock); `give_up` ends a wait by raising (file_lock)."""
    with contextlib.ExitStack() as held:
        cache_write(
            cache_dir,
            lambda: path.parent.mkdir(parents=True, exist_ok=True),
            lambda: held.enter_context(
                file_lock(path, wait_s=wait_s, fix=_LOCK_FIX, say=say, say_own=say_own, give_up=give_up)
            ),
        )
        yield


def mark_origin(root: Path, url: str) -> None:
    """Make `root` the cache's copy of `url` (ORIGIN): reads go to that URL, and eviction counts only
    the directories ORIGIN marks (block_cache.cache_files)."""
    if origin(root) != url:
        write_atomic(root / ORIGIN, json.dumps({"url": url}) + "\n")


def origin(root: Path) -> str | None:
    """The URL a cache directory copies, or None for a local dataset."""
    try:
        return json.loads((Path(root) / ORIGIN).read_text())["url"]
    except (OSError, ValueError, KeyError):
        return None


def describe(root: Path, rel: str) -> str:
    """How to name file `rel` of the dataset at `root` to the user: its URL for a bucket's dataset."""
    url = origin(root)
    return f"{url}/{rel}" if url else str(Path(root) / rel)


class CacheError(DatasetError):
    """The node's cache failed (a full or read-only disk), not the dataset: no verdict on the dataset
    (`data validate` records none), one line."""


def unwritable_cache(cache_dir: Path, e: OSError, emptied: int = 0) -> CacheError:
    """Any write into the cache that failed (a full or read-only disk): one line, which the trainer
    stops on after saving its last step (a bare OSError was a traceback, nothing saved). The keys of
    both ways to name the cache: a train config's, the data commands' flag. `emptied`: the times the
    write found what it had made removed (cache_write), when that is why it failed: the directory is
    writable and has room, something clears it (review RV27b F4)."""
    if isinstance(e, IsADirectoryError):  # a rename's target is its second name
        return in_the_way(Path(e.filename2 or e.filename or cache_dir))
    what = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else e.strerror or e
    if emptied:
        return CacheError(
            f"cannot write the cache {cache_dir}: what one write made in it was removed {emptied} times "
            f"({what}); stop whatever keeps clearing the cache while it is read, or give it a directory "
            "nothing clears (data.cache_dir in a train config, --cache-dir in the data commands)"
        )
    return CacheError(
        f"cannot write the cache {cache_dir} ({what}); give it a writable directory with room "
        "(data.cache_dir and data.cache_gb in a train config, --cache-dir in the data commands)"
    )


def in_the_way(path: Path) -> CacheError:
    """A directory where the cache keeps a file (nothing gristmill makes: a fetch cannot be moved over
    it, and a read of it was a traceback: review RV49a 3)."""
    return CacheError(
        f"{path} is a directory, where the cache keeps a file: remove it (the cache is gristmill's own: "
        "put nothing in it) and run again"
    )


T = TypeVar("T")


# What one emptying of the cache (`rm -rf`, which lists each folder once and removes each name in it
# once) can remove under a write, each at most once: the write's temporary file (listed while it was
# written), its folder, the dataset's copy, the cache directory. A write is done again after each.
EMPTIED_RETRIES = 4


def _emptied_under_mkdir(e: OSError) -> bool:
    """`Path.mkdir(exist_ok=True)`'s EEXIST for a folder that is a folder again, or gone: it met the folder,
    then asked whether it is one, and an emptying in between made it raise. Taken for a folder that
    became a file, it stopped a run with "cannot write the cache … (File exists: …/blocks)" (the CI path
    at 21ec204). A file there is still that."""
    if not isinstance(e, FileExistsError) or e.filename is None:
        return False
    return os.path.isdir(e.filename) or not os.path.lexists(e.filename)


def cache_write(cache_dir: Path, folders: Callable[[], Any], write: Callable[[], T]) -> T:
    """`folders()` (make the folders of the cache `cache_dir` that `write` writes into), then `write()`:
    every write into the cache while it is read goes through here. The cache may be emptied at any time
    (`rm -rf` to free the disk, docs/object-storage.md, Training from a bucket), and nothing makes that
    wait for a write: when the write's file or a folder above it went meanwhile (ENOENT, or mkdir's EEXIST
    for a folder gone between its two looks), the folders are made
    again and the write done again, whole (a copy's temporary file is written anew, and only a
    finished one is renamed into place), up to EMPTIED_RETRIES times; ENOENT once more is a line
    saying so. Any other failure (a full or read-only disk, a folder that became a file) is the cache's
    one line."""
    retries = EMPTIED_RETRIES
    while True:
        making = True
        try:
            folders()
            making = False
            return write()
        except OSError as e:
            if not isinstance(e, FileNotFoundError) and not _emptied_under_mkdir(e):
                raise unwritable_cache(cache_dir, e) from None
            if not retries:  # a folder that cannot be made at all (data.cache_dir under /proc) was
                # told as one something kept clearing (trial T38 L8)
                raise unwritable_cache(cache_dir, e, emptied=0 if making else EMPTIED_RETRIES + 1) from None
            retries -= 1


def copy_dir(cache_dir: Path, url: str, fingerprint: str) -> Path:
    """The cache's directory for the dataset `fingerprint` at `url`: one per URL. Its reads go to the
    URL in it (ORIGIN), so two URLs of one dataset (a backup, a second bucket) must not share one:
    a process opening the other rewrote ORIGIN, and this one's fetches, and `data validate`'s check of
    its bucket, went to the other bucket."""
    return cache_dir / f"{fingerprint}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:12]}"


def local_root(location: str | Path, cache: CacheSettings | None = None) -> Path:
    """The directory readers open for `location`: the dataset itself, or a bucket's dataset's cache
    directory, with the bucket's current dataset.json (checked like a local one) in it."""
    if not is_url(location):
        return Path(location)
    cache = cache or CacheSettings.of()
    raw, info = _fetch_dataset_json(str(location), cache.timeout_s)
    root = copy_dir(cache.dir, str(location), info["fingerprint"])
    path = root / DATASET_JSON

    def written() -> None:  # the bucket's dataset.json now (another upload of the same token stream)
        if path.read_bytes() != raw:
            write_atomic(path, raw)

    cache_write(cache.dir, lambda: copy_made(root, str(location), raw), written)
    return root


def copy_made(root: Path, url: str, raw: bytes) -> None:
    """`root` is the cache's copy of `url`: the directory, marked (ORIGIN), with a dataset.json (`raw`
    where there is none). The folders of every write of an open into the copy (cache_write), which an
    emptying of the cache may have removed since: what reads the copy next finds it as local_root
    left it."""
    root.mkdir(parents=True, exist_ok=True)
    mark_origin(root, url)
    if not (root / DATASET_JSON).is_file():
        write_atomic(root / DATASET_JSON, raw)


def dataset_info(location: str | Path, within_s: float | None = None) -> dict[str, Any]:
    """read_dataset_info of a dataset wherever it is (a bucket's: one GET, nothing cached; `within_s`:
    its tries end within that long, an endpoint that never answers too: a training's
    data.fetch_timeout_s, by default its default)."""
    if is_url(location):
        return _fetch_dataset_json(str(location), within_s)[1]
    return read_dataset_info(location)


# (endpoint, URL) → (ETag, bytes) of each bucket's dataset.json this process read: read again only when it
# changed (ObjectStore.get_versioned), not whole at each of a training start's five reads (trial RV73b 4)
_DATASET_JSONS: dict[tuple[str, str], tuple[str, bytes]] = {}


def _fetch_dataset_json(location: str, within_s: float | None = None) -> tuple[bytes, dict[str, Any]]:
    """A bucket's dataset.json: its bytes and content, checked as read_dataset_info checks a file (its
    transfer checked by ObjectStore.get: a damaged read was refused with advice to delete it, RV71a F1)."""
    url = ObjectURL.parse(location)
    key = (endpoint(), str(url))
    try:
        raw, etag = ObjectStore(url, within_s=within_s).get_versioned(DATASET_JSON, _DATASET_JSONS.get(key))
    except ObjectMissing:
        if str(url).rstrip("/").endswith(f"/{DATASET_JSON}"):  # the dataset's file, not its prefix: it was
            # advised to build into s3://…/dataset.json, which a build refuses (trial RV77a 7)
            prefix = str(url).rstrip("/").removesuffix(f"/{DATASET_JSON}")
            said = f"{url} names a dataset's {DATASET_JSON}: give the dataset's prefix, {prefix}"
            raise DatasetError(said) from None
        raise DatasetError(
            f"{url.child(DATASET_JSON)} not found: {url} holds no complete gristmill dataset (build one "
            f"there with `gristmill data build … --set output={url}`, or upload one with "
            f"`gristmill data upload DIR {url}`)"
        ) from None
    fix = rewrite_bucket_dataset_json(str(url))  # the bucket's repair, not a rebuild (review RV42a M4)
    info = parse_dataset_info(raw, url.child(DATASET_JSON), fix)
    check_fingerprint(str(url), info, fix)
    if etag:  # once checked
        _DATASET_JSONS[key] = (etag, raw)
    return raw, info


def tokenizer_dir(location: str | Path, cache: CacheSettings | None = None) -> Path:
    """The dataset's directory with its tokenizer.json (a bucket's: the copy, hashed again and fetched
    again where it differs; a dataset written without one has none either way)."""
    cache = cache or CacheSettings.of()
    root = local_root(location, cache)
    if read_dataset_info(root).get("tokenizer_sha256") not in (None, "none"):
        ensure_checked(root, [TOKENIZER_JSON], cache.timeout_s)
    return root


def ensure(root: Path, rels: Iterable[str], fresh: bool = False, wait_s: float = LOCK_WAIT_S) -> set[str]:
    """Files `rels` of the dataset at `root` are there: for a bucket's dataset, each missing one is
    fetched and verified against dataset.json's sha256; a local dataset is read in place (nothing to
    do). A file dataset.json does not record cannot be checked and is refused. `fresh`: each is
    fetched and verified again even when a checked copy is there (`data validate` of a bucket checks
    the bucket's objects, not the cache's copies of them).

    The copy is named by the fingerprint, which covers the shards, the index and the tokenizer; the
    other recorded files (manifest, build records) may differ between two uploads of one token stream,
    so the hash each was fetched for is kept in VERIFIED and a copy of another one is fetched again.
    Returns the files written now, each checked as it was written."""
    url = origin(root)
    if url is None:
        return set()
    try:  # kept: the copy's dataset.json is written again from it if the cache is emptied meanwhile
        raw = (root / DATASET_JSON).read_bytes()
    except OSError:
        raw = None
    info = read_dataset_info(root) if raw is None else parse_dataset_info(raw, root / DATASET_JSON)
    others = info.get("files") or {}

    def present(rel: str, verified: dict[str, str]) -> bool:
        return (root / rel).is_file() and (rel not in others or verified.get(rel) == others[rel]["sha256"])

    verified = _verified(root)
    missing = [rel for rel in rels if fresh or not present(rel, verified)]
    written: set[str] = set()
    if not missing:
        return written
    recorded = dataset_files(info)
    store = ObjectStore(url, within_s=wait_s)  # a training's fetch_timeout_s bounds its fetches too

    def fetched() -> None:
        for rel in missing:
            # fetched by another process while this one waited, or by this one before an emptying of
            # the cache made it all again (what that removed is fetched again)
            if (not fresh or rel in written) and present(rel, verified):
                continue
            spec = recorded.get(rel)
            if spec is None:
                raise DatasetError(
                    f"{url}/{DATASET_JSON} records no sha256 for {rel}, so its copy cannot be checked: "
                    f"upload the dataset again with this version (`gristmill data upload DIR {url}` records "
                    "every file)"
                )
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            # (derived from dataset.json rather than fetched, but for `fresh`: validate checks the
            # bucket's object itself, which a copy of the bucket would carry: review R18c F2)
            shard_rows = rel == f"{INDEX_DIR}/{SHARD_ROWS}" and not fresh
            if not (shard_rows and _write_derived_shard_rows(info, dest, spec["sha256"])):
                # (`fresh`: `data validate`'s fetch, which trains nothing)
                fetch_verified(store, rel, dest, spec["bytes"], spec["sha256"], trained=not fresh)
            written.add(rel)
            if rel in others:
                verified[rel] = spec["sha256"]
                write_atomic(root / VERIFIED, json.dumps(verified, sort_keys=True))
        # an emptying between two files' fetches raised nothing (the next mkdir made the folders again,
        # unmarked): what it removed is fetched again, and the copy marked, as after one within a write
        gone = [rel for rel in missing if not (root / rel).is_file()]
        if gone or (raw is not None and origin(root) != url):
            raise FileNotFoundError(
                errno.ENOENT, "removed by an emptying of the cache", str(root / (gone or [ORIGIN])[0])
            )

    with node_lock(root.parent, wait_s):
        verified = _verified(root)
        # Through cache_write, as a fetch of a sample's block: the cache may be emptied while an open
        # fetches (a training starting, `data inspect`): the copy is made again and what it removed
        # fetched again, never a traceback (review RV27b F3)
        cache_write(root.parent, lambda: raw is None or copy_made(root, url, raw), fetched)
    return written


def ensure_checked(root: Path, rels: list[str], wait_s: float = LOCK_WAIT_S) -> None:
    """`ensure`, then each copy hashed again now, against dataset.json (a cached copy is a copy, not a
    proof): one that differs is fetched again. For the files a reader trusts whole at every open: the
    index's per-sample files (a damaged copy would refuse every sample as the bucket's fault), the
    manifest and records the audit and inspect answer from. `wait_s`: a training's fetch_timeout_s
    (node_lock)."""
    just_checked = ensure(root, rels, wait_s=wait_s)  # fetched now and hashed as written: not again
    if origin(root) is None:
        return
    recorded = dataset_files(read_dataset_info(root))

    def differs(rel: str) -> bool:
        try:
            return file_sha256(root / rel) != recorded[rel]["sha256"]
        except FileNotFoundError:  # removed meanwhile by another process that found it differ
            return True

    stale = [rel for rel in rels if rel not in just_checked and differs(rel)]
    if not stale:
        return
    # Removed under the node's lock, looked at again there: a process that saw the same damaged copy
    # would otherwise remove the one another had just fetched, or count the same copy twice (R16e)
    with node_lock(root.parent, wait_s):
        stale = [rel for rel in stale if differs(rel)]
        for rel in stale:
            with contextlib.suppress(FileNotFoundError):  # (or removed by an emptying of the cache)
                (root / rel).unlink()  # a reader that has it open keeps its inode
                COUNTS.add("refetches")
    ensure(root, stale, wait_s=wait_s)


def _verified(root: Path) -> dict[str, str]:
    try:
        return json.loads((root / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}


def ensure_dirs(root: Path, *dirs: str) -> None:
    """Every recorded file under `dirs` (e.g. manifest/) is there and checked now: `ensure_checked` of
    each (a local dataset: nothing to do)."""
    if origin(root) is None:
        return
    recorded = dataset_files(read_dataset_info(root))
    ensure_checked(root, [rel for rel in recorded if rel.split("/", 1)[0] in dirs])
    prune_unrecorded(root, *dirs)


def prune_unrecorded(root: Path, *dirs: str) -> None:
    """A bucket's copy holds, under `dirs` (e.g. manifest/, excluded/), no file of the kinds a build
    records that its dataset.json does not: the copy is named by the fingerprint, so an earlier upload
    of the same token stream may have left its own there, and the readers (the audit's views, inspect)
    read these folders whole. A local dataset is left as it is (validate names such files there)."""
    if origin(root) is None:
        return
    recorded = dataset_files(read_dataset_info(root))
    stale = [rel for rel in recorded_paths(root) if rel.split("/", 1)[0] in dirs and rel not in recorded]
    if stale:
        with node_lock(root.parent):  # as the fetches of ensure(), which write into these folders
            for rel in stale:
                (root / rel).unlink(missing_ok=True)


def _write_derived_shard_rows(info: dict[str, Any], dest: Path, sha256: str) -> bool:
    """The shard table is each shard's document count, which dataset.json holds: derived here (and
    checked against the index's hash) it costs no request."""
    import hashlib

    rows = shard_rows_of(info)
    if rows is None or hashlib.sha256(rows.tobytes()).hexdigest() != sha256:
        return False
    write_atomic(dest, rows.tobytes())
    return True


def fetch_verified(
    store: ObjectStore, rel: str, dest: Path, size: int | None, sha256: str, trained: bool = True
) -> None:
    """Object `rel` into `dest` only if it hashes to `sha256` (and is `size` bytes): downloaded under a
    temporary name, fetched once more when it differs (download_twice), then refused naming the object:
    the bucket's when both fetches gave the same bytes, the transfer's when they differ (RV71a F3); the
    rename is the only way a file gets its final name (`trained`: download_twice's). The caller holds
    node_lock."""
    tmp = dest.with_name(tmp_name(dest.name))
    try:
        try:
            digest = download_twice(store, rel, tmp, size, sha256, trained=trained)
        except (ObjectMissing, ObjectCutShort) as e:
            raise bucket_lacks(store, e) from None
        got_size = tmp.stat().st_size
        if digest == sha256 and (size is None or got_size == size):
            # a copy there of these bytes already is kept, its mtime too: a --db of the cache's copy
            # guards it by size and mtime, and refused after `data validate` of the bucket unchanged
            # fetched its manifests again (trial RV71f 2)
            if not _holds(dest, got_size, sha256):
                move_into_place(tmp, dest)
            return
    finally:
        tmp.unlink(missing_ok=True)  # gone already when it was moved into place
    raise DatasetError(
        f"{store.url.child(rel)}: fetched twice, {got_size:,} bytes with sha256 {digest[:16]}… each time, "
        f"but {DATASET_JSON} records {size_and_hash(size, sha256)}: the object in the bucket is damaged or "
        f"was replaced, and nothing was trained on it; {repair_advice(store)}"
    )


def _holds(path: Path, size: int, sha256: str) -> bool:
    """Whether file `path` holds `size` bytes hashing to `sha256` (read only where the size is it)."""
    try:
        return path.is_file() and path.stat().st_size == size and file_sha256(path) == sha256
    except OSError:
        return False


def bucket_lacks(
    store: ObjectStore, e: ObjectMissing | ObjectCutShort, sample: int | None = None
) -> DatasetError:
    """An object of the bucket's dataset missing or shorter than dataset.json records, with the bucket's
    repair (the store's own line named none, or a resume: RV49a 4); `sample`: the one a loader's fetch
    read it for, which nothing trained on."""
    read = "" if sample is None else f" (sample {sample})"
    trained = "" if sample is None else ", and nothing was trained on it"
    return DatasetError(
        f"{e}{read}: the bucket lacks what its {DATASET_JSON} records{trained}; {repair_advice(store)}"
    )


def repair_advice(store: ObjectStore) -> str:
    """What puts a damaged object of the bucket's dataset right: for one a build wrote there (its tasks'
    records are there), that build rerun; an upload of a local build over it replaced the tasks' stats
    under their records, and the next build rerun took the dataset for damaged (review R18c M2)."""
    if store.list(f"{TASK_RECORDS_DIR}/"):
        return (
            f"delete {store.url.child(DATASET_JSON)} and rerun the `gristmill data build` that wrote it "
            "there: it checks every object against its task's record and redoes what is damaged"
        )
    return f"upload the dataset again (`gristmill data upload DIR {store.url}`) or rebuild it"
