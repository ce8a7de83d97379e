"""`make setup`'s install after torch, by uv, as pip would make it: `python tools/uv_install.py ARGS`
runs `uv pip install ARGS` for this interpreter with pip's own settings, then checks that each
distribution installed is the file pip would take, reinstalling by pip any that is not.

Why a check: uv reads a version's files from the first index that lists it, where pip takes the best
file of all indexes (astral-sh/uv#12123). A version whose wheels are split between indexes (this
machine's mirror holds multiprocess 0.70.19 for py310 alone: its code breaks on 3.11) or that one
index has only as an sdist is then installed otherwise than by pip, and nothing says so. The check
installs the same versions again (no dependencies, into scratch folders, from uv's cache) with each of
pip's indexes first: where every order gives the same files, whichever index lists a version offers the
same best file, which is therefore pip's."""

from __future__ import annotations

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


def uv_command(first: int = 0) -> tuple[list[str], dict[str, str], int]:
    """`uv pip install` for this interpreter with pip's settings (its config files and PIP_*
    variables), pip's index `first` of its indexes [index_url, *extra_index_urls] put first; the
    command, its environment and how many indexes there are.

    Only pip's settings choose what is installed: uv's own config files (--no-config) and UV_*
    variables set for other projects (an extra index, a lowest resolution) are left out but for where
    its cache lives and how it links and downloads; the indexes go in its environment, not its command
    line, where a password in an index URL would show in `ps` (review RV28d). unsafe-best-match takes
    the newest version of any index, as pip does; uv puts extra indexes before its default one."""
    from pip._internal.commands import create_command

    o, _ = create_command("install").parse_args([])
    args = ["--no-config", "--index-strategy", "unsafe-best-match"]
    args += [x for u in o.find_links for x in ("--find-links", u)]
    args += [x for u in o.constraints for x in ("--constraint", u)]
    args += [x for h in o.trusted_hosts for x in ("--allow-insecure-host", h)]
    args += ["--no-index"] * o.no_index + ["--prerelease=allow"] * o.pre
    indexes = [o.index_url, *o.extra_index_urls]
    indexes = indexes[first:] + indexes[:first]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_KEPT}
    env = {"UV_HTTP_TIMEOUT": str(round(o.timeout)), **env}
    env |= {"UV_INDEX_URL": indexes[-1], "UV_EXTRA_INDEX_URL": " ".join(indexes)}
    env |= {"SSL_CERT_FILE": o.cert} if o.cert else {}
    env |= {"HTTP_PROXY": o.proxy, "HTTPS_PROXY": o.proxy} if o.proxy else {}
    uv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, *args]
    return uv, env, 1 if o.no_index else len(indexes)


def installed(site: Path) -> dict[str, tuple[str, frozenset, frozenset]]:
    """{name: (version, the files its wheel put and their hashes, its wheel's tags)} of the
    distributions in `site` installed from an index (not an editable or a local path's:
    direct_url.json)."""
    found = {}
    for info in site.glob("*.dist-info"):
        if (info / "direct_url.json").exists() or not (info / "RECORD").exists():
            continue
        headers = (info / "METADATA").read_text(errors="replace").split("\n\n", 1)[0].splitlines()
        meta = {k: v.strip() for k, _, v in reversed([line.partition(":") for line in headers])}
        files = set()
        for line in (info / "RECORD").read_text().splitlines():
            path, digest = line.rsplit(",", 2)[:2]
            # (a wheel's scripts and data files: ../../../bin/, share/ … in a venv, bin/, share/ … in a
            # --target folder; the scripts written per installer)
            if not (
                path.startswith(("..", *OUTSIDE)) or "__pycache__" in path or Path(path).name in OWN_FILES
            ):
                files.add((path, digest))
        wheel = (info / "WHEEL").read_text() if (info / "WHEEL").exists() else ""
        tags = [line for line in wheel.splitlines() if line.startswith("Tag:")]
        found[meta["Name"].lower().replace("_", "-")] = (meta["Version"], frozenset(files), frozenset(tags))
    return found


def not_as_pip(site: Path, first: int, pins: list[str]) -> set[str]:
    """The pins (name==version) whose files, installed with pip's index `first` first, differ from
    those in `site`."""
    uv, env, _ = uv_command(first)
    with tempfile.TemporaryDirectory() as scratch:
        cmd = [*uv, "-q", "--no-deps", "--target", scratch, *pins]
        subprocess.run(cmd, env=env, check=True)
        theirs, ours = installed(Path(scratch)), installed(site)
    return {f"{n}=={same[0]}" for n, same in theirs.items() if ours.get(n) != same}


def main(argv: list[str]) -> int:
    uv, env, indexes = uv_command()
    subprocess.run([*uv, *argv], env=env, check=True)
    if "--dry-run" in argv:  # nothing installed, nothing to check
        return 0
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)))
    pins = [f"{n}=={v}" for n, (v, *_) in installed(site).items() if n not in ("torch", "uv")]
    differ = set().union(*(not_as_pip(site, k, pins) for k in range(1, indexes)))
    if differ:
        print(
            f"the indexes offer other files of {', '.join(sorted(differ))} (uv took the first index's, "
            "pip takes the best of all): reinstalling them with pip",
            flush=True,
        )
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "--force-reinstall"]
        subprocess.run([*pip, *sorted(differ)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
