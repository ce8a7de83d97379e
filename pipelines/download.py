"""`gristmill data download`: pre-fetch a FineWeb-Edu subset's parquet files for offline nodes.

    gristmill data download --subset sample/10BT --to /data/fineweb-edu
    gristmill data build --config configs/data/fineweb-edu-sample-10BT.toml \\
        --set source.kind=parquet --set source.path=/data/fineweb-edu/sample/10BT

Files keep their path inside the dataset repository (DIR/sample/10BT/000_00000.parquet). Each is
streamed into `NAME.part` and renamed only after its SHA-256 matches the hub's LFS checksum, so a
file under its final name is always complete. Interrupted? Run the same command again: a finished
file is skipped once its bytes hash to its checksum (re-hashed at every run: the record beside it is a
claim, and a file damaged on disk since was reported complete, review RV54a 1), and a `.part` file
with an LFS checksum continues from where it stopped (ranged reads; the whole file is held to the
checksum). A file with no LFS checksum is fetched whole again (a damaged `.part` continued was
recorded, and re-hashed, as the file: RV54a 2), and is known by what the listing names its content by
(the hub's git blob id; an object's ETag; a local file's mtime, change time and inode): changed
upstream, at the same size too, it is fetched again (a local file's content is compared first: a
chmod changes its change time only). Files an
earlier download recorded that the listing no longer has (the subset re-sharded upstream) are
removed: a build of the folder would read them too. The transfer works on any fsspec URL (`--from`).
Tests have no network: they run it against a local directory and against tests/helpers/hub_server.py,
a local stand-in for the hub's HTTP API.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from tqdm import tqdm

from training.contract.atomic_write import write_atomic
from training.contract.config_loader import PathArgument
from training.contract.disk_space import check_free, fmt_bytes
from training.contract.errors import GristmillError
from training.contract.object_store import refuse_other_urls
from training.contract.run_layout import in_a_dataset

DEFAULT_REPO = "HuggingFaceFW/fineweb-edu"
RECORD = ".gristmill-download.json"
LOCK = ".gristmill-download.lock"  # held by the download writing into the folder
PART = ".part"
CHUNK = 8 << 20


class DownloadError(GristmillError):
    """A download that cannot proceed; the message names the file and what to do."""


@dataclass
class RemoteFile:
    path: str  # relative to the source root, kept in the destination
    size: int
    sha256: str | None = None  # the hub's LFS checksum; None: recorded after download
    # Without a sha256, what the listing names this content by (the hub's git blob id, an object's
    # ETag, a file's mtime), recorded with the download: a file changed upstream at the same size is
    # fetched again, and a `.part` of the earlier content is not continued with the new one's bytes.
    version: str | None = None


@dataclass
class DownloadReport:
    files: int = 0
    skipped: int = 0
    downloaded: int = 0
    resumed: int = 0
    bytes_fetched: int = 0
    failed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # an earlier download's files no longer listed
    damaged: list[str] = field(default_factory=list)  # recorded files whose bytes differed: fetched again


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--subset", default="sample/10BT", help="folder in the dataset, e.g. sample/10BT (/: all of it)"
    )
    parser.add_argument(
        "--to",
        required=True,
        action=PathArgument,
        help="destination directory (subset paths are kept under it)",
    )
    parser.add_argument(
        "--repo", default=DEFAULT_REPO, help=f"hub dataset repository (default {DEFAULT_REPO})"
    )
    parser.add_argument(
        "--from",
        dest="source",
        action=PathArgument,
        default=None,
        help="fetch from this fsspec URL instead of the hub (s3://bucket/fineweb-edu, a mounted dir)",
    )
    parser.add_argument("--pattern", default="*.parquet", help="file name pattern (default *.parquet)")
    parser.add_argument("--workers", type=int, default=4, help="files fetched in parallel (default 4)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="re-hash files already downloaded (always done; kept for scripts)",
    )


def run(args: argparse.Namespace) -> int:
    refuse_other_urls({"--to": args.to})
    if not args.subset.strip():  # an unset variable: the whole repository, all of FineWeb-Edu (RV67b F8)
        raise GristmillError('--subset "": name a folder of the dataset (e.g. sample/10BT), or / for all')
    if args.workers < 1:  # taken as one without a word (review R22a A9)
        raise GristmillError(f"--workers {args.workers}: give the files fetched at once, ≥ 1")
    # a dataset's directory or one inside it: parquet files and locks it does not record (trial RV74c 1)
    if (where := in_a_dataset(args.to)) is not None:
        raise GristmillError(f"--to {args.to} {where}; download into a folder of its own")
    root = args.source or f"hf://datasets/{args.repo}"
    report = download(root, args.subset, args.to, pattern=args.pattern, workers=args.workers)
    print(
        f"{report.files} files: {report.downloaded} downloaded ({report.resumed} resumed), "
        f"{report.skipped} already complete, {fmt_bytes(report.bytes_fetched)} fetched → {args.to}"
    )
    if report.damaged:
        said = sorted(report.damaged)
        print(
            f"fetched again {len(said)} file(s) whose bytes on disk were not those downloaded "
            f"(damaged since): {', '.join(said[:3])}{' …' if len(said) > 3 else ''}"
        )
    if report.removed:
        print(
            f"removed {len(report.removed)} file(s) an earlier download put there that {args.subset} no "
            f"longer lists (re-sharded or removed upstream): {', '.join(report.removed[:3])}"
            f"{' …' if len(report.removed) > 3 else ''}"
        )
    return 0


def list_remote(fs, root: str, subset: str, pattern: str) -> list[RemoteFile]:
    base = f"{root.rstrip('/')}/{subset.strip('/')}" if subset else root.rstrip("/")
    fs.invalidate_cache()  # fsspec keeps one instance per URL, with its listings: list what is there now
    try:
        entries = fs.find(base, detail=True)
        if not entries and not fs.exists(base):  # a local path's find lists nothing: "holds no files"
            raise FileNotFoundError(base)
    except FileNotFoundError:
        raise DownloadError(f"{base} does not exist; check --repo/--from and --subset") from None
    except ValueError as e:  # a malformed repo id or path (HfUriError), not the network (trial RV62h 6)
        if isinstance(e, json.JSONDecodeError):  # a proxy's HTML page for the listing: the network
            raise _unlisted(base, e) from None
        raise DownloadError(
            f"{base} is not a path the source accepts ({str(e).splitlines()[0] if str(e) else e!r}); check "
            "--repo/--from and --subset"
        ) from None
    except Exception as e:  # offline, DNS, auth: one message
        raise _unlisted(base, e) from None
    top = fs._strip_protocol(root).rstrip("/")
    if top in entries:  # the root is a file: its path was joined to itself under --to (RV54a 9)
        folder = root.rstrip("/").rsplit("/", 1)[0] if "/" in root.rstrip("/") else "."  # as written
        raise DownloadError(
            f"--from {root} is a file: give the dataset's folder, e.g. --from {folder} (--subset and "
            "--pattern choose its files)"
        )
    prefix = top + "/"
    files = []
    for name, info in sorted(entries.items()):
        if info.get("type") == "directory" or not fnmatch(name.rsplit("/", 1)[-1], pattern):
            continue
        rel = name[len(prefix) :] if name.startswith(prefix) else name
        lfs = (info.get("lfs") or {}).get("sha256")
        files.append(RemoteFile(rel, int(info.get("size") or 0), lfs, None if lfs else _version(info)))
    if not files:
        raise DownloadError(f"{base} holds no files matching {pattern!r}")
    return files


def _unlisted(base: str, e: Exception) -> DownloadError:
    return DownloadError(
        f"cannot list {base} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
        "run `gristmill data download` on a machine with network, then copy the directory to the "
        "offline nodes"
    )


def _version(info: dict) -> str | None:
    """RemoteFile.version from a listing's entry: the first of the keys fsspec's filesystems name a
    file's content or its last change by (the hub, S3 and GCS, local and SFTP files). A local file's
    mtime is set by whoever writes it (cp -p, rsync -a, tar x): one replaced at the same size and mtime
    was kept (trial RV62h 4); its change time and inode are the kernel's, which no copy sets. They change
    with metadata too (a chmod, a hard link, a remount): the file's content is compared then
    (`_complete`), not fetched again."""
    if info.get("ino") is not None and info.get("created") is not None:  # fsspec's local files
        try:  # fsspec's `created` is the birth time where there is one (macOS)
            st = os.stat(info["name"])
        except OSError:  # a dangling link, gone since the listing: its fetch names it
            return f"mtime {info.get('mtime')}"
        return f"mtime_ns {st.st_mtime_ns} ctime_ns {st.st_ctime_ns} inode {st.st_ino}"
    for key in ("blob_id", "ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified"):
        if info.get(key) not in (None, ""):
            return f"{key} {info[key]}"
    return None


def download(
    root: str,
    subset: str,
    dest: str | Path,
    *,
    pattern: str = "*.parquet",
    workers: int = 4,
    progress: bool = True,
) -> DownloadReport:
    # `..`: its files were written, and unlisted ones removed, outside DEST (RV54a 10)
    if ".." in Path(subset).parts:
        raise DownloadError(f"--subset {subset}: name a folder inside the dataset, without '..'")
    if Path(dest).exists() and not Path(dest).is_dir():  # a FileExistsError traceback (RV54a 8)
        raise DownloadError(f"--to {dest} is a file: give a directory to download into")
    try:
        fs, _ = url_to_fs(root)
    except ImportError as e:  # s3:// and others need an fsspec package gristmill does not install (R17e E2)
        raise DownloadError(
            f"--from {root}: {e}; or copy the files into a local folder and give that"
        ) from None
    files = list_remote(fs, root, subset, pattern)
    local = _local_root(fs, root)
    if local is not None and Path(dest).resolve().is_relative_to(local.resolve()):
        # each run copied the copies again, a level deeper, exit 0: a build of either folder read each
        # document several times (trial RV62h 5)
        raise DownloadError(
            f"--to {dest} is inside --from {root}: every download would copy its own copies again; give "
            "--to a folder outside it"
        )
    _refuse_nested(Path(dest))
    try:
        Path(dest).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(dest, e) from None
    with _DestLock(Path(dest)):
        _refuse_other_source(Path(dest), root, files, local)
        report = fetch_files(fs, root, files, dest, workers=workers, progress=progress)
        report.removed = _remove_unlisted(Path(dest), root, subset, pattern, files)
    return report


class _DestLock:
    """One download into a folder at a time: two appended to one `.part` and one of them renamed it
    complete, twice the bytes under the recorded sha256, exit 0 (review R17e F2)."""

    def __init__(self, dest: Path):
        self.path = dest / LOCK

    def __enter__(self) -> _DestLock:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _unwritable(self.path.parent, e) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise DownloadError(
                f"{self.path.parent} is being written by another `gristmill data download`: let it finish "
                "(or stop it), then run this one again"
            ) from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # the lock goes with the descriptor


def _unwritable(dest: str | Path, e: OSError) -> DownloadError:
    """--to where nothing can be written: one line (a traceback before, trial RV62h 6)."""
    return DownloadError(
        f"--to {dest}: cannot write there ({e.strerror}: {e.filename}); give a folder you can write"
    )


def _refuse_nested(dest: Path) -> None:
    """A folder inside another download's folder, or holding one (up to three levels down): its lock
    and record are that folder's, so a download there wrote past both (review R17f F2). Refused
    without advising a download into the other folder, which mixes two sources (R17g)."""
    here = dest.resolve()
    outer = next((p for p in here.parents if (p / RECORD).is_file()), None)
    inner = None
    if outer is None and here.is_dir():
        found = (p.parent for depth in (1, 2, 3) for p in here.glob("*/" * depth + RECORD))
        inner = next(
            (p for p in found if p.resolve().is_relative_to(here)), None
        )  # not through a link (R17h)
    if outer is not None or inner is not None:
        other = outer if outer is not None else inner
        raise DownloadError(
            f"{dest} {'is inside' if outer is not None else 'holds'} {other}, another download's folder "
            f"(its record {other / RECORD}): give --to a folder apart from it, or move that download away"
        )


def _local_root(fs, root: str) -> Path | None:
    """The source's folder where it is on this machine (its files can be hashed), else None."""
    return Path(fs._strip_protocol(root)) if isinstance(fs, LocalFileSystem) else None


def _refuse_other_source(dest: Path, root: str, files: list[RemoteFile], local: Path | None) -> None:
    """A file the folder already holds from another source under the same path that this download
    would replace (another dataset's subset downloaded into it): overwritten, the two datasets' other
    files mixed in one folder that a build reads whole (review R17e F5). Refused before any transfer.
    The same file from the same source spelled otherwise, or moved, is complete and kept (R17f F3)."""
    record = _Record(dest / RECORD)
    differ: list[str] = []
    for f in files:
        rec = record.get(f.path) or {}
        was, final = rec.get("source"), dest / f.path
        if (
            was is not None
            and was != source_of(root)
            and final.exists()
            and not _complete(final, f, rec, local)
        ):
            raise DownloadError(
                f"{dest / f.path} was downloaded from {was}, not {source_of(root)}: download into another "
                "folder (--to), or remove the other download's files first"
            )
        # a file no download put there (no record names it), at a path the listing names: the user's,
        # overwritten without a word (trial RV67b F1), where the docs promise it is never touched
        if not rec and final.is_symlink():
            raise DownloadError(
                f"{final} is not a file this download fetched (its record names none there), and "
                f"{source_of(root)} has a file of that path: move it out of {dest}, or download into "
                "another folder (--to)"
            )
        if not rec and final.exists() and _same_as_source(final, f, local) is False:
            differ.append(f.path)
    if differ:
        # or a download's file changed upstream after its record was deleted as the damaged record's line
        # advises: it said "not a file this download fetched" of it (trial RV72a F4). All named at once.
        more = f"; so do {len(differ) - 1} more: {', '.join(differ[1:4])}{' …' if differ[4:] else ''}"
        it = "them" if differ[1:] else "it"
        raise DownloadError(
            f"{dest / differ[0]} holds other bytes than {source_of(root)}'s file of that path, and no "
            "download record names it (a file of yours, or one a download fetched that changed upstream "
            f"after its record was deleted){more if differ[1:] else ''}: move {it} out of {dest}, or delete "
            f"{it} if a download fetched {it}; or download into another folder (--to)"
        )


def _same_as_source(final: Path, f: RemoteFile, local: Path | None) -> bool | None:
    """Whether FINAL, which no record names, holds the source's bytes of `f` (by the sha256 the
    listing gives, or the source's file hashed where it is on this machine); None where that cannot be
    told (a hub file without an LFS sha256: fetched again, as a kill between its rename and its record,
    or a record deleted as advised, leaves it: review RV67e 6)."""
    want = f.sha256 or (_sha256(local / f.path) if local is not None else None)
    if want is None:
        return None
    return final.is_file() and final.stat().st_size == f.size and _sha256(final) == want


def source_of(root: str) -> str:
    """Where files come from, whatever revision: a hub dataset's URL without its `@REV`."""
    return re.sub(r"^(hf://[^/]+/[^/]+/[^/@]+)@[^/]*", r"\1", root.rstrip("/"))


def _remove_unlisted(dest: Path, root: str, subset: str, pattern: str, files: list[RemoteFile]) -> list[str]:
    """The files an earlier download of `subset` from the same source put in `dest` that the listing
    no longer has (the hub re-sharded the subset, or removed documents): removed, with their
    records. Kept, a build of the folder read them beside the new files, every document twice.
    Files the record does not name (the user's), or names from another source (another dataset
    downloaded into the same folder) or from before sources were recorded, are never touched."""
    record = _Record(dest / RECORD)
    listed = {f.path for f in files}
    prefix = f"{subset.strip('/')}/" if subset.strip("/") else ""

    def gone(rel: str, source: str | None) -> bool:
        return (
            source == source_of(root)
            and rel.startswith(prefix)
            and fnmatch(rel.rsplit("/", 1)[-1], pattern)
            and rel not in listed
        )

    stale = [rel for rel, rec in sorted(record.data["files"].items()) if gone(rel, rec.get("source"))]
    for rel in stale:
        (dest / rel).unlink(missing_ok=True)
        record.drop(rel)
    # A transfer cut short of a file the listing no longer has: its .part stopped every build, whose
    # advice (this download again) passed it by, "already complete" (trial RV60b 4)
    # a .part an older gristmill began has no source recorded: the record's own, where it has one only
    sources = {rec.get("source") for rec in record.data["files"].values()}
    only = next(iter(sources)) if len(sources) == 1 else None
    recorded = record.data.get("part_sources", {})
    parts = [rel for rel in sorted(record.data.get("parts", {})) if gone(rel, recorded.get(rel, only))]
    for rel in parts:
        (dest / (rel + PART)).unlink(missing_ok=True)
        record.drop_part(rel)
    return stale + [rel + PART for rel in parts]


def fetch_files(
    fs, root: str, files: list[RemoteFile], dest: str | Path, *, workers=4, progress=True
) -> DownloadReport:
    """Fetch `files` (paths relative to `root` on `fs`) into `dest`; resumable and checksummed."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    local = _local_root(fs, root)
    need = sum(f.size for f in files) - sum(
        (dest / f.path).stat().st_size for f in files if (dest / f.path).is_file()
    )
    check_free(
        dest,
        need,
        what=f"download {len(files)} files",
        advice="free some space or download to a larger filesystem (--to)",
    )
    record = _Record(dest / RECORD)
    report = DownloadReport(files=len(files))
    lock = threading.Lock()
    bar = tqdm(
        total=sum(f.size for f in files), unit="B", unit_scale=True, desc="download", disable=not progress
    )

    def one(f: RemoteFile) -> None:
        final, rec = dest / f.path, record.get(f.path)
        digest = _complete(final, f, rec, local)
        if digest is None and final.is_file() and _same_upstream(f, rec):
            with lock:  # the source unchanged since: damaged on disk (trial RV70c 5 had it unnamed)
                report.damaged.append(f.path)
        if digest:
            record.set(f.path, f.size, digest, source_of(root), f.version)
            with lock:
                report.skipped += 1
            bar.update(f.size)
            return
        part = final.with_name(final.name + PART)
        # a .part of other content (or of no record), or of a file with no checksum to hold the whole
        # to: fetched whole (a damaged .part continued was recorded as the file, review RV54a 2)
        if f.version != record.part_version(f.path) or f.sha256 is None:
            part.unlink(missing_ok=True)
        # continued too: a .part an older gristmill began has no source recorded (review RV60e 3)
        record.start_part(f.path, f.version, source_of(root))
        fetched, resumed = _fetch_one(fs, root, f, final, bar)
        digest = _sha256(final.with_name(final.name + PART))
        if f.sha256 and digest != f.sha256 and resumed:
            # The partial file was not a prefix of this one (changed upstream or corrupted): redo.
            os.remove(final.with_name(final.name + PART))
            more, _ = _fetch_one(fs, root, f, final, bar)
            fetched += more
            resumed = False  # fetched whole: the report said "1 resumed" of it (trial RV72a 3)
            digest = _sha256(final.with_name(final.name + PART))
        got = final.with_name(final.name + PART).stat().st_size
        if f.size and got != f.size:  # the only check for files the hub gives no sha256 for
            raise DownloadError(
                f"{f.path}: the transfer ended at {got:,} of {f.size:,} bytes (connection closed early, "
                "or the file changed upstream); run the command again to resume it"
            )
        if f.sha256 and digest != f.sha256:
            os.remove(final.with_name(final.name + PART))
            raise DownloadError(
                f"{f.path}: checksum mismatch (got sha256 {digest[:16]}…, the source says {f.sha256[:16]}…); "
                "the partial file was removed, run the command again to refetch it"
            )
        os.replace(final.with_name(final.name + PART), final)
        record.set(f.path, f.size, digest, source_of(root), f.version)
        with lock:
            report.downloaded += 1
            report.resumed += int(resumed)
            report.bytes_fetched += fetched

    try:
        with ThreadPoolExecutor(max(1, workers)) as pool:
            for fut in [pool.submit(one, f) for f in files]:
                fut.result()
    finally:
        bar.close()
    return report


def _same_upstream(f: RemoteFile, rec: dict | None) -> bool:
    """Whether the source's `f` is the file `rec` records as downloaded: the same sha256 where the
    listing gives one (a hub LFS file, which has no version: review RV70f 1), else the same size and a
    version that names its content."""
    if rec is None:
        return False
    if f.sha256 is not None:
        return rec.get("sha256") == f.sha256
    return f.version is not None and rec.get("version") == f.version and rec.get("size") == f.size


def _complete(final: Path, f: RemoteFile, rec: dict | None, local: Path | None) -> str | None:
    """The sha256 of an already complete FINAL, its bytes hashed now (the record beside it is a
    claim: a file damaged on disk was "already complete", review RV54a 1), or None if it must be
    (re)fetched. `local`: the source's folder when it is on this machine, where a file whose version
    changed is hashed: the same content as recorded (a chmod, a remount; a record of an older gristmill)
    is not fetched again (review RV63d 5)."""
    if not final.is_file() or final.stat().st_size != f.size:
        return None
    expected = f.sha256 or (rec or {}).get("sha256")
    if f.version and (rec or {}).get("version") != f.version:
        # changed upstream since it was fetched, or fetched before versions were recorded
        if local is None or expected is None or _sha256(local / f.path) != expected:
            return None
    digest = _sha256(final)
    return digest if expected is None or digest == expected else None


def _fetch_one(fs, root: str, f: RemoteFile, final: Path, bar) -> tuple[int, bool]:
    """Append the missing bytes of `f` to FINAL.part; returns (bytes fetched, resumed?)."""
    part = final.with_name(final.name + PART)
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    if have > f.size:
        os.remove(part)
        have = 0
    bar.update(have)
    fetched = 0
    url = f"{root.rstrip('/')}/{f.path}"
    for attempt in range(3):
        try:
            with fs.open(url, "rb") as src, open(part, "ab") as out:
                src.seek(have + fetched)
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    fetched += len(chunk)
                    bar.update(len(chunk))
            break
        except Exception as e:  # not only OSError: huggingface_hub raises httpx errors once its retries end
            if attempt == 2:
                detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                raise DownloadError(
                    f"{f.path}: transfer failed after 3 tries ({detail}); run the command again to resume it"
                ) from None
            time.sleep(2**attempt)
    return fetched, have > 0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


class _Record:
    """DEST/.gristmill-download.json: size and sha256 of every completed file (thread-safe)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        try:
            self.data = json.loads(path.read_text()) if path.is_file() else {"files": {}}
            if not isinstance(self.data, dict) or not isinstance(self.data.get("files"), dict):
                raise ValueError("not a download record")
        except ValueError as e:  # a traceback before (review R17e E3)
            raise DownloadError(
                f"{path} is damaged ({e}): delete it and run the command again (files already there are "
                "hashed against the source's checksums where it gives them; one that differs, changed "
                "upstream since it was downloaded, is named then: delete it too)"
            ) from None

    def get(self, rel: str) -> dict | None:
        return self.data["files"].get(rel)

    def set(self, rel: str, size: int, sha256: str, source: str, version: str | None) -> None:
        with self.lock:
            self.data["files"][rel] = {"size": size, "sha256": sha256, "source": source, "version": version}
            self.data.get("parts", {}).pop(rel, None)
            self.data.get("part_sources", {}).pop(rel, None)
            self._write()

    def part_version(self, rel: str) -> str | None:
        """The version of the content REL's `.part` holds the start of (RemoteFile.version)."""
        return self.data.get("parts", {}).get(rel)

    def start_part(self, rel: str, version: str | None, source: str) -> None:
        with self.lock:
            self.data.setdefault("parts", {})[rel] = version
            self.data.setdefault("part_sources", {})[rel] = source
            self._write()

    def drop_part(self, rel: str) -> None:
        with self.lock:
            self.data.get("parts", {}).pop(rel, None)
            self.data.get("part_sources", {}).pop(rel, None)
            self._write()

    def _write(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True))

    def drop(self, rel: str) -> None:
        with self.lock:
            self.data["files"].pop(rel, None)
            self._write()
