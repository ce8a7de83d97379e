"""`make setup`'s install after torch, by uv, as pip would make it: `python tools/uv_install.py ARGS`
runs `uv pip install ARGS` for this interpreter with pip's own settings, then checks that each
distribution uv installed is the file pip would take, reinstalling by pip any that may not be. It
exits non-zero on any failure, pip settings uv has no equivalent of included; the Makefile's pip then
completes the install and `tools/uv_install.py --by-pip` installs again by pip every distribution uv
installed (pip completing a venv uv filled kept uv's files unchecked: review RV30b F1; removing the
venv and starting over lost a working one, and `make -n` ran it: RV30d G2, G4).

Why a check: uv reads a version's files from the first index (or find-links location) that lists it,
where pip takes the best file of them all (astral-sh/uv#12123). A version whose wheels are split
between indexes (this machine's mirror holds multiprocess 0.70.19 for py310 alone: its code breaks on
3.11), that one index has only as an sdist, or that a private index rebuilt under the same name, is
then installed otherwise than by pip, and nothing says so. The check installs the same versions again
(no dependencies, into scratch folders, from uv's cache) with each of pip's indexes first and once
without pip's find-links: where every order installs the same bytes, whichever place lists a version
offers the same best file, which is therefore pip's."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

UV_KEPT = ("UV_CACHE_DIR", "UV_HTTP_TIMEOUT", "UV_NATIVE_TLS", "UV_LINK_MODE", "UV_CONCURRENT_DOWNLOADS")
# What each installer writes its own way (pip and uv differ there), left out of the comparison.
OWN_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json", "uv_build.json"}
# Where a --target install puts a wheel's scripts, data files and headers (outside site-packages in a venv).
OUTSIDE = ("bin/", "share/", "include/", "etc/")


def uv_command(first: int = 0, find_links: bool = True) -> tuple[list[str], dict[str, str], int]:
    """`uv pip install` for this interpreter with pip's settings (its config files and PIP_*
    variables), pip's index `first` of its indexes [index_url, *extra_index_urls] put first, pip's
    find-links left out unless `find_links`; the command, its environment and how many indexes there
    are.

    Only pip's settings choose what is installed: uv's own config files (--no-config) and UV_*
    variables set for other projects (an extra index, a lowest resolution) are left out but for where
    its cache lives and how it links and downloads; the indexes go in its environment, not its command
    line, where a password in an index URL would show in `ps` (review RV28d). unsafe-best-match takes
    the newest version of any index, as pip does."""
    from pip._internal.commands import create_command

    o, _ = create_command("install").parse_args([])
    if o.prefer_binary or o.require_hashes:  # (RV30b F3)
        sys.exit(f"pip's {'prefer-binary' if o.prefer_binary else 'require-hashes'} has no uv equivalent")
    args = ["--no-config", "--index-strategy", "unsafe-best-match"]
    args += [x for u in o.find_links if find_links for x in ("--find-links", u)]
    args += [x for u in o.constraints for x in ("--constraint", u)]
    args += [x for h in o.trusted_hosts for x in ("--allow-insecure-host", h)]
    args += [x for n in sorted(o.format_control.no_binary) for x in ("--no-binary", n)]
    args += [x for n in sorted(o.format_control.only_binary) for x in ("--only-binary", n)]
    args += ["--no-index"] * o.no_index + ["--prerelease=allow"] * o.pre
    indexes = [o.index_url, *o.extra_index_urls]
    indexes = indexes[first:] + indexes[:first]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_KEPT}
    env = {"UV_HTTP_TIMEOUT": str(round(o.timeout)), **env}
    # uv puts extra indexes before its default one, in their order: all of them as extra, the first
    # the one asked for (the default, its last, then changes nothing)
    env |= {"UV_INDEX_URL": indexes[-1], "UV_EXTRA_INDEX_URL": " ".join(indexes)}
    env |= {"SSL_CERT_FILE": o.cert} if o.cert else {}
    env |= {"HTTP_PROXY": o.proxy, "HTTPS_PROXY": o.proxy} if o.proxy else {}
    uv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, *args]
    return uv, env, 1 if o.no_index else len(indexes)


def installed(site: Path, by_uv: bool = False) -> dict[str, tuple[str, frozenset, frozenset]]:
    """{name: (version, its wheel's files inside site-packages and their hashes, its wheel's tags)}
    of the distributions in `site` installed from an index (not an editable or a local path's:
    direct_url.json); `by_uv`: those uv installed alone. A file's hash is RECORD's, the sha256 of its
    bytes where RECORD gives none (a wheel whose RECORD lists no hashes compared equal to any other:
    RV30b F4; hashing every file of ~200 distributions took ~14 s a tree, and both installers keep
    RECORD's hashes as the wheel gave them, so a rebuild's other bytes show as other hashes)."""
    found = {}
    for info in site.glob("*.dist-info"):
        if (info / "direct_url.json").exists() or not (info / "RECORD").exists():
            continue
        if by_uv and _read(info / "INSTALLER").strip() != "uv":
            continue
        headers = _read(info / "METADATA").split("\n\n", 1)[0].splitlines()
        meta = {k: v.strip() for k, _, v in reversed([line.partition(":") for line in headers])}
        files = set()
        for path, digest, *_ in csv.reader(_read(info / "RECORD").splitlines()):
            # (a wheel's scripts and data files: ../../../bin/, share/ … in a venv, bin/, share/ … in a
            # --target folder; the scripts written per installer)
            if path.startswith(("..", *OUTSIDE)) or "__pycache__" in path or Path(path).name in OWN_FILES:
                continue
            if not digest:
                with open(site / path, "rb") as f:
                    digest = "sha256=" + hashlib.file_digest(f, "sha256").hexdigest()
            files.add((path, digest))
        tags = frozenset(line for line in _read(info / "WHEEL").splitlines() if line.startswith("Tag:"))
        found[_canonical(meta["Name"])] = (meta["Version"], frozenset(files), tags)
    return found


def _links_may_hold(uv: list[str], ours: dict) -> bool:
    """Whether pip's find-links may list a distribution uv installed: a URL may; a folder (this
    machine's holds torch alone, installed by pip before uv) where a file is named for one. Then the
    check installs once more without them (uv takes their file before any index's: RV30b F2)."""
    for place in (uv[i + 1] for i, arg in enumerate(uv) if arg == "--find-links"):
        folder = Path(place.removeprefix("file://"))
        if not folder.is_dir():
            return True
        if {_canonical(f.name.split("-")[0]) for f in folder.iterdir()} & ours.keys():
            return True
    return False


def _canonical(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503)."""
    from pip._vendor.packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def not_as_pip(ours: dict, pins: list[str], first: int, find_links: bool = True) -> set[str]:
    """The pins (name==version) whose files, installed with pip's index `first` first (and its
    find-links, or not), differ from `ours` (`installed` of the venv)."""
    uv, env, _ = uv_command(first, find_links)
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([*uv, "-q", "--no-deps", "--target", scratch, *pins], env=env, check=True)
        theirs = installed(Path(scratch))
    return {f"{n}=={same[0]}" for n, same in theirs.items() if ours.get(n) != same}


def main(argv: list[str]) -> int:
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "--force-reinstall"]
    if argv == ["--by-pip"]:  # the Makefile's way out after a failure: pip installs again what uv did
        pins = [f"{n}=={v}" for n, (v, *_) in installed(site, by_uv=True).items()]
        if pins:
            subprocess.run([*pip, *pins], check=True)
        return 0
    uv, env, indexes = uv_command()
    subprocess.run([*uv, *argv], env=env, check=True)
    if "--dry-run" in argv or "--target" in argv:  # nothing installed here, nothing to check
        return 0
    ours = installed(site, by_uv=True)
    pins = [f"{n}=={v}" for n, (v, *_) in ours.items()]
    if not pins:  # (a venv pip filled: nothing of uv's to check; uv refuses an install of nothing)
        return 0
    orders = [(k, True) for k in range(1, indexes)]
    if "--no-index" not in uv and _links_may_hold(uv, ours):  # each index first without them (RV30d G1)
        orders += [(k, False) for k in range(indexes)]
    differ = set().union(*(not_as_pip(ours, pins, k, links) for k, links in orders))
    if differ:
        print(
            f"other files of {', '.join(sorted(differ))} lie on pip's indexes (uv takes the first place's, "
            "pip the best of all): reinstalling them with pip",
            flush=True,
        )
        subprocess.run([*pip, *sorted(differ)], check=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except subprocess.CalledProcessError as e:
        sys.exit(f"uv_install: {' '.join(map(str, e.cmd[:6]))} … exited {e.returncode}")
