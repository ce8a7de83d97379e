"""A local stand-in for the Hugging Face hub: the part of its HTTP API that huggingface_hub's
HfApi, HfFileSystem (hf:// URLs, what datatrove and `gristmill data download` read through) and
hf_hub_download use, served from memory by a stdlib HTTP server in a thread.

Point the client at it with HF_ENDPOINT, read by huggingface_hub at import: a process that has
imported it already needs `huggingface_hub.constants.ENDPOINT` and `HUGGINGFACE_CO_URL_TEMPLATE`
set as well (HfApi, HfFileSystem and hf_hub_url read those at each call).
Repository ids here are made up, so a request that escaped to the real hub could not succeed.

Implemented (datasets under /api/datasets and /datasets/, models under /api/models and /):
  GET  /api/{type}s/{repo}[/revision/{rev}]        repo info: id, sha, siblings
  GET  /api/{type}s/{repo}/tree/{rev}[/{path}]     listing, ?recursive=, paginated by a `Link`
                                                   header (page_size entries a page), 404
                                                   EntryNotFound for a path that is no folder
  POST /api/{type}s/{repo}/paths-info/{rev}        form `paths`: entries of the existing ones
  HEAD/GET {prefix}{repo}/resolve/{rev}/{path}     bytes, `Range: bytes=a-[b]` (206/416), with
                                                   ETag, X-Repo-Commit and, for LFS files (the
                                                   *.parquet and *.safetensors ones, as on the
                                                   hub), X-Linked-Etag = sha256 and X-Linked-Size;
                                                   a 404 EntryNotFound with X-Repo-Commit (what
                                                   huggingface_hub's .no_exist record of it needs)
  GET  /api/agent-harnesses                        an empty registry (huggingface_hub asks daily)
A revision is a branch name or a commit sha; `push` makes a new commit and moves `main` to it.
Errors carry the hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound), which is how
huggingface_hub tells them apart. No Xet headers: clients fall back to plain HTTP downloads.

Faults: `drop_after(path, n, times)` makes the next `times` GETs of that file whose body is
longer than n bytes send their full headers, then n bytes, then close the socket (a connection
dropped mid-file); `heal()` ends all drops. Every request is logged in `requests`
("GET /datasets/…/resolve/… bytes=0-99", with its Range if it has one).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".parquet", ".safetensors")  # stored in LFS on the hub: ETag/X-Linked-Etag is their sha256
COMMIT_DATE = "2025-01-01T00:00:00.000Z"


def point_hub_at(hub: HubServer, monkeypatch, home) -> dict[str, str]:
    """Points this process's huggingface_hub at `hub` (pytest's `monkeypatch` undoes it), with an
    empty cache under `home` and no token; returns the environment that does the same for a
    subprocess."""
    import huggingface_hub.constants as hf_constants

    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
    ):
        monkeypatch.delenv(key, raising=False)
    # huggingface_hub reads these from the environment at import; HfApi, HfFileSystem and
    # hf_hub_url read them from its constants at each call (the URL template too: not ENDPOINT).
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # another test may have set it
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(home / "token"))
    return dict(os.environ)


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit sha
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: bytes}


class HubServer:
    """`with HubServer() as hub:` serves on 127.0.0.1 (hub.url) until the block ends."""

    def __init__(self, page_size: int = 1000):
        self.page_size = page_size
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.requests: list[str] = []
        self._drops: dict[str, list[int]] = {}  # path in repo -> [bytes sent before closing, times]
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    # -- content ------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes], repo_type: str = "dataset") -> str:
        self.repos[(repo_type, repo_id)] = _Repo()
        return self.push(repo_id, files, repo_type)

    def push(self, repo_id: str, files: dict[str, bytes], repo_type: str = "dataset") -> str:
        """A new commit holding exactly `files`; `main` moves to it. Returns its sha."""
        repo = self.repos[(repo_type, repo_id)]
        h = hashlib.sha1(repo.refs.get("main", "").encode())
        for path in sorted(files):
            h.update(f"{path}\0{_git_blob_oid(files[path])}\0".encode())
        sha = h.hexdigest()
        repo.commits[sha] = dict(files)
        repo.refs["main"] = sha
        return sha

    def head(self, repo_id: str, repo_type: str = "dataset") -> str:
        """The commit `main` points to."""
        return self.repos[(repo_type, repo_id)].refs["main"]

    def drop_after(self, path_in_repo: str, nbytes: int, times: int = 1) -> None:
        with self._lock:
            self._drops[path_in_repo] = [nbytes, times]

    def heal(self) -> None:
        with self._lock:
            self._drops.clear()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start the server first (with HubServer() as hub: ...)"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- the API's answers --------------------------------------------------------------------

    def _commit(self, repo: _Repo, rev: str) -> str | None:
        return repo.refs.get(rev) or (rev if rev in repo.commits else None)

    @staticmethod
    def _entry(path: str, files: dict[str, bytes]) -> dict | None:
        if path in files:
            data = files[path]
            entry = {"type": "file", "oid": _git_blob_oid(data), "size": len(data), "path": path}
            if path.endswith(LFS_SUFFIXES):
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            return entry
        if any(f.startswith(path + "/") for f in files) or path == "":
            return {
                "type": "directory",
                "oid": hashlib.sha1(path.encode()).hexdigest(),
                "size": 0,
                "path": path,
            }
        return None

    def _tree(self, files: dict[str, bytes], path: str, recursive: bool) -> list[dict] | None:
        entry = self._entry(path, files)
        if entry is None or entry["type"] != "directory":
            return None
        prefix = path + "/" if path else ""
        below = {f[len(prefix) :] for f in files if f.startswith(prefix)}
        names = set()
        for rel in below:
            parts = rel.split("/")
            for depth in range(1, len(parts) + 1 if recursive else 2):
                names.add("/".join(parts[:depth]))
        # The hub lists folders before files at each level; clients sort anyway.
        out = [self._entry(prefix + n, files) for n in sorted(names)]
        return sorted(out, key=lambda e: (e["path"].count("/"), e["type"] != "directory", e["path"]))


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the hub; every answer has a Content-Length

        def log_message(self, *args) -> None:  # quiet: the log is hub.requests
            pass

        def do_HEAD(self) -> None:
            self._route()

        def do_GET(self) -> None:
            self._route()

        def do_POST(self) -> None:
            self._route()

        # -- plumbing ---------------------------------------------------------------------------

        def _route(self) -> None:
            rng = self.headers.get("Range")
            with hub._lock:
                hub.requests.append(f"{self.command} {self.path}" + (f" {rng}" if rng else ""))
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if parts == ["api", "agent-harnesses"]:  # huggingface_hub asks once a day: "none known"
                    self._json({"standardEnvVars": [], "harnesses": {}})
                elif parts[0] == "api":
                    self._api(parts[1:], query, url)
                else:
                    self._resolve(parts)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj, headers: dict | None = None) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})})

        def _find(self, repo_type: str, repo_id: str, rev: str | None):
            repo = hub.repos.get((repo_type, repo_id))
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
                return None
            sha = hub._commit(repo, rev or "main")
            if sha is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return None
            return sha, repo.commits[sha]

        # -- /api/... -----------------------------------------------------------------------------

        def _api(self, parts: list[str], query: dict, url) -> None:
            # parts: ["datasets", ns, name, (action, rev, *path)]
            if len(parts) < 3 or parts[0] not in ("datasets", "models", "spaces"):
                return self._error(404, "NotFound", "unknown endpoint")
            repo_type, repo_id, rest = parts[0][:-1], f"{parts[1]}/{parts[2]}", parts[3:]
            action = rest[0] if rest else None
            rev = rest[1] if len(rest) > 1 else None
            found = self._find(repo_type, repo_id, rev)
            if found is None:
                return
            sha, files = found
            if action in (None, "revision") and self.command == "GET":
                info = {
                    "id": repo_id,
                    "author": repo_id.split("/")[0],
                    "sha": sha,
                    "lastModified": COMMIT_DATE,
                    "private": False,
                    "gated": False,
                    "disabled": False,
                    "tags": [],
                    "siblings": [{"rfilename": p} for p in sorted(files)],
                }
                return self._json(info)
            if action == "tree" and self.command == "GET":
                path = "/".join(rest[2:]).strip("/")
                entries = hub._tree(files, path, query.get("recursive", "false").lower() == "true")
                if entries is None:
                    return self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
                start = int(query.get("cursor", 0))
                page = entries[start : start + hub.page_size]
                headers = {}
                if start + len(page) < len(entries):
                    q = {**query, "cursor": str(start + len(page))}
                    nxt = f"{hub.url}{url.path}?" + "&".join(f"{k}={quote(v)}" for k, v in q.items())
                    headers["Link"] = f'<{nxt}>; rel="next"'
                return self._json(page, headers)
            if action == "paths-info" and self.command == "POST":
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                paths = [p.strip("/") for p in form.get("paths", [])]
                return self._json([e for p in paths if (e := hub._entry(p, files)) is not None])
            return self._error(404, "NotFound", "unknown endpoint")

        # -- {datasets/}{repo}/resolve/{rev}/{path} --------------------------------------------------

        def _resolve(self, parts: list[str]) -> None:
            repo_type = "model"
            if parts[0] in ("datasets", "spaces"):
                repo_type, parts = parts[0][:-1], parts[1:]
            if len(parts) < 5 or parts[2] != "resolve" or self.command == "POST":
                return self._error(404, "NotFound", "unknown endpoint")
            found = self._find(repo_type, f"{parts[0]}/{parts[1]}", parts[3])
            if found is None:
                return
            sha, files = found
            path = "/".join(parts[4:])
            if path not in files:  # with the commit, as the hub: huggingface_hub records the absence
                return self._error(404, "EntryNotFound", f"{path} does not exist", {"X-Repo-Commit": sha})
            data = files[path]
            etag = hub._entry(path, files)["oid"]
            headers = {
                "X-Repo-Commit": sha,
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            if path.endswith(LFS_SUFFIXES):
                etag = hashlib.sha256(data).hexdigest()
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            headers["ETag"] = f'"{etag}"'
            status, body = 200, data
            if rng := self.headers.get("Range"):
                first, _, last = rng.removeprefix("bytes=").partition("-")
                start, end = int(first), min(int(last) + 1 if last else len(data), len(data))
                if start >= len(data):
                    return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                status, body = 206, data[start:end]
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
            if self.command == "GET" and self._drop(path, body, status, headers):
                return
            self._send(status, body, headers)

        def _drop(self, path: str, body: bytes, status: int, headers: dict) -> bool:
            with hub._lock:
                drop = hub._drops.get(path)
                if not drop or drop[1] <= 0 or len(body) <= drop[0]:
                    return False
                drop[1] -= 1
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: drop[0]])
            self.wfile.flush()
            self.close_connection = True  # the handler closes the socket: the client sees a short body
            return True

    return Handler
