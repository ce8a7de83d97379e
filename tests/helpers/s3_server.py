"""A real S3 server on loopback for the object-storage tests: moto's server in its own process, and
a seeded fault-injecting proxy in front of it.

`MotoServer` is pipelines/local_s3.py's server (moto's S3 app alone, on 127.0.0.1 on a free
port, no docker; its state lives in that process) with a boto3 client for the tests' own setup and
damage. `FaultProxy` is a stdlib HTTP server in a
thread that forwards every request to it and, drawn from a seeded RNG per request, answers
503 SlowDown instead (10%), sends the response's full headers but only part of its body, then closes
the connection (2%, "truncated"), or resets the connection before answering (1%); where a test asks,
it flips one bit of chosen GETs' bodies (`flip_gets`: a transfer damaged, the object intact) or gives
ETags that are not the MD5 (`kms`, `opaque_etags`). The proxy logs
every request in order (`counts.log`, with each GET's Range header in `counts.ranges`), counts the
body bytes it sends (`counts.body_bytes`: our own count of egress, not the client's) and can answer
slowly (`latency`). `s3_bucket` is a test module's bucket behind them, with the environment that
points gristmill there; `bucket_objects`, `puts` and `damage` look at and spoil its objects.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import os
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipelines.local_s3 import LocalS3, aws_env, free_port

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)
BAD_DIGEST = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>BadDigest</Code>'
    b"<Message>The Content-MD5 you specified did not match what we received.</Message></Error>"
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class MotoServer(LocalS3):
    """pipelines/local_s3.py's moto server, plus a plain boto3 client to set up or damage objects."""

    def client(self):
        import boto3

        env = self.env()  # pipelines/local_s3.aws_env: the demo's and the trainer's credentials
        return boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )


@dataclass
class FaultMix:
    """Per-request probabilities; the draws come from one RNG seeded with `seed`."""

    slow_down: float = 0.10
    truncated: float = 0.02
    reset: float = 0.01
    seed: int = 0


@dataclass
class ProxyCounts:
    requests: dict[str, int] = field(default_factory=dict)  # by method
    slow_down: int = 0
    truncated: int = 0
    reset: int = 0
    log: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request, in order
    ranges: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header) of each GET
    body_bytes: int = 0  # response body bytes sent to clients (what a store bills as egress)
    bad_digests: int = 0  # PUTs answered 400 BadDigest (damage_puts, check_md5)
    flipped: int = 0  # GET bodies sent with a bit flipped (FaultProxy.flip_gets)

    def total(self) -> int:
        return sum(self.requests.values())

    def gets(self, suffix: str = "") -> list[str]:
        """Paths of the GET requests (whatever their fate) that end with `suffix`, in order."""
        return [path for method, path in self.log if method == "GET" and path.split("?")[0].endswith(suffix)]

    def range_gets(self, suffix: str = "") -> list[tuple[str, str | None]]:
        """(path, Range header or None) of the GET requests whose path ends with `suffix`, in order."""
        return [(p, r) for p, r in self.ranges if p.split("?")[0].endswith(suffix)]


def _kms_etag(etag: str) -> str:
    return hashlib.md5(f"kms:{etag}".encode()).hexdigest()


def kms_view(
    headers: list[tuple[str, str]], body: bytes, said: bool = True
) -> tuple[list[tuple[str, str]], bytes]:
    """A response as a bucket with SSE-KMS default encryption gives it: the encryption header, and every
    ETag (headers and listings) 32 hex digits that are not the MD5 of the bytes (AWS: "objects encrypted
    by SSE-C or SSE-KMS have ETags that are not an MD5 digest of their object data"), one per object.
    `said` False: no encryption header, as a store whose ETags only look like an MD5 (an encrypting
    MinIO) gives them."""
    out = [(k, f'"{_kms_etag(v.strip(chr(34)))}"' if k.lower() == "etag" else v) for k, v in headers]
    if said:
        out.append(("x-amz-server-side-encryption", "aws:kms"))
    listed = re.sub(
        rb"<ETag>(&quot;|\")([0-9a-f]{32})(&quot;|\")</ETag>",
        lambda m: b"<ETag>" + m[1] + _kms_etag(m[2].decode()).encode() + m[3] + b"</ETag>",
        body,
    )
    return out, listed


def send_error(handler: BaseHTTPRequestHandler, status: int, reason: str, body: bytes) -> None:
    """An S3 error answer (`body`: its XML) from request handler `handler`; a HEAD's has no body."""
    handler.send_response(status, reason)
    handler.send_header("Content-Type", "application/xml")
    handler.send_header("Content-Length", "0" if handler.command == "HEAD" else str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


class FaultProxy:
    """Forwards to `upstream` ("http://127.0.0.1:PORT"), injecting `mix`'s faults (None: none)."""

    def __init__(self, upstream: str, mix: FaultMix | None = None):
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.latency = 0.0  # seconds added to every request (a slow store)
        self._down = False
        self.down_met_at: float | None = None  # see `down`
        self.hung = False  # every request read and never answered while set (a store that hangs)
        # (method, path) → whether the request waits (polled; then answered as usual): one slow object
        self.held: Callable[[str, str], bool] | None = None
        self.kms = (
            False  # answers as a bucket encrypting with KMS keys: ETags that are not the MD5 (kms_view)
        )
        self.opaque_etags = False  # the same ETags, without the encryption header that says so
        self.check_md5 = False  # PUTs checked against their Content-MD5 (400 BadDigest), as S3 does
        self.real_etags: dict[str, str] = {}  # the ETag either gave → the store's (If-Match, If-None-Match)
        self._flips: tuple[str, int | None, set[int], int, int | None, int | None] | None = None  # flip_gets
        self._flip_seen = 0
        self._put_flips: tuple[str, set[int], bool] | None = None  # damage_puts
        self._put_seen = 0
        # (method, path) → whether the store refuses it (403 AccessDenied): credentials scoped to a prefix
        self.forbidden: Callable[[str, str], bool] | None = None
        self.counts = ProxyCounts()
        self._lock = threading.Lock()
        self.set_faults(mix)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY: an answer is two writes (headers, then body); with Nagle on, the body waited
            # for the client's delayed ACK of the headers, ~40 ms a request on loopback
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._draw(self.command, self.path)
                if self.command == "GET":
                    with proxy._lock:
                        proxy.counts.ranges.append((self.path, self.headers.get("Range")))
                if proxy.hung:
                    while proxy.hung:  # no byte of an answer; then the connection closed unanswered
                        time.sleep(0.05)
                    self.close_connection = True
                    return
                while proxy.held is not None and proxy.held(self.command, self.path):
                    time.sleep(0.05)
                if proxy.latency:
                    time.sleep(proxy.latency)
                if proxy.down:
                    with proxy._lock:
                        proxy.down_met_at = proxy.down_met_at or time.monotonic()
                if fault == "reset" or proxy.down:
                    # SO_LINGER 0: close() sends RST, the client sees "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if proxy.forbidden is not None and proxy.forbidden(self.command, self.path):
                    send_error(self, 403, "Forbidden", ACCESS_DENIED)
                    return
                if fault == "slow_down":
                    send_error(self, 503, "Slow Down", SLOW_DOWN)
                    return
                if self.command == "PUT":
                    body, refused = proxy._damaged_put(self.path, body)
                    said = self.headers.get("Content-MD5")
                    if proxy.check_md5 and said is not None:  # as S3 checks a body against its header
                        refused = refused or base64.b64encode(hashlib.md5(body).digest()).decode() != said
                    if refused:  # as S3 answers a body that is not its Content-MD5
                        with proxy._lock:
                            proxy.counts.bad_digests += 1
                        send_error(self, 400, "Bad Request", BAD_DIGEST)
                        return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    if proxy.kms or proxy.opaque_etags:  # a condition on an ETag it gave: the store's own
                        for k, v in headers.items():
                            if k.lower() in ("if-match", "if-none-match"):
                                real = proxy.real_etags.get(v.strip('"'), v.strip('"'))
                                headers[k] = f'"{real}"'
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    resp_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
                finally:
                    conn.close()
                if proxy.kms or proxy.opaque_etags:
                    for k, v in resp_headers:
                        if k.lower() == "etag":
                            proxy.real_etags[_kms_etag(v.strip('"'))] = v.strip('"')
                    resp_headers, data = kms_view(resp_headers, data, said=proxy.kms)
                if self.command == "GET" and resp.status in (200, 206):
                    data = proxy._flipped(self.path, self.headers.get("Range"), data)
                if proxy.latency:  # done at the store, answered late
                    time.sleep(proxy.latency)
                self.send_response(resp.status, resp.reason)
                length = None
                for k, v in resp_headers:
                    if k.lower() == "content-length":
                        length = v
                        continue
                    self.send_header(k, v)
                if self.command == "HEAD":
                    self.send_header("Content-Length", length or "0")
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with proxy._lock:
                    proxy.counts.body_bytes += len(data) // 2 if fault == "truncated" else len(data)
                if fault == "truncated" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # a client that hung up: its affair
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def down(self) -> bool:
        """Every request reset while set (a store that went away). Set, `down_met_at` is when the first
        request met it (time.monotonic(): when a reader first wanted data the outage kept from it; the
        steps whose data was cached train on meanwhile); None until one does."""
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        if value and not self._down:
            self.down_met_at = None
        self._down = value

    def set_faults(self, mix: FaultMix | None) -> None:
        """Start (or stop, with None) injecting faults; the RNG restarts from the mix's seed."""
        with self._lock:
            self.mix = mix
            self.rng = random.Random(mix.seed if mix else 0)

    def flip_gets(
        self,
        suffix: str,
        *nth: int,
        seed: int = 0,
        range_from: int | None = None,
        at: int | None = None,
        bit: int | None = None,
    ) -> None:
        """Flip one bit of the body (its length kept: nothing but a hash tells it) of the `nth` GETs (1:
        the first, counted from now) whose path ends with `suffix`, and with `range_from` whose Range
        starts at that byte: a transfer damaged, the object in the bucket intact. The byte (unless `at`
        names it: an index into the body) and the bit are drawn from an RNG seeded with `seed` and the
        GET's number; `at` and `bit` both given: the same damage each time (a cache between serving it).
        No `nth`: none flipped."""
        with self._lock:
            self._flips = (suffix, range_from, set(nth), seed, at, bit) if nth else None
            self._flip_seen = 0

    def damage_puts(self, suffix: str, *nth: int, checked: bool = True) -> None:
        """Flip one bit of the body of the `nth` PUTs (1: the first, counted from now) whose path ends with
        `suffix`: an upload damaged on the way. `checked`: the store compares it with its Content-MD5 and
        answers 400 BadDigest, as S3 does; else it stores the damaged body (moto checks no Content-MD5),
        and its ETag is not the MD5 sent. No `nth`: none damaged."""
        with self._lock:
            self._put_flips = (suffix, set(nth), checked) if nth else None
            self._put_seen = 0

    def _damaged_put(self, path: str, body: bytes) -> tuple[bytes, bool]:
        """(the body forwarded, whether the store refuses it) of a PUT of `path` (damage_puts)."""
        with self._lock:
            if self._put_flips is None or not body or not path.split("?")[0].endswith(self._put_flips[0]):
                return body, False
            self._put_seen += 1
            if self._put_seen not in self._put_flips[1]:
                return body, False
            self.counts.flipped += 1
            damaged = bytearray(body)
            damaged[len(damaged) // 2] ^= 1
            return bytes(damaged), self._put_flips[2]

    def _flipped(self, path: str, range_header: str | None, data: bytes) -> bytes:
        with self._lock:
            if self._flips is None or not data:
                return data
            suffix, range_from, nth, seed, at, bit = self._flips
            if not path.split("?")[0].endswith(suffix):
                return data
            if range_from is not None and not (range_header or "").startswith(f"bytes={range_from}-"):
                return data
            self._flip_seen += 1
            if self._flip_seen not in nth:
                return data
            self.counts.flipped += 1
            rng = random.Random(seed * 1_000_003 + self._flip_seen)
        body = bytearray(data)
        at = rng.randrange(len(body)) if at is None else at
        body[at] ^= 1 << (rng.randrange(8) if bit is None else bit)
        return bytes(body)

    def _draw(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts.requests[method] = self.counts.requests.get(method, 0) + 1
            self.counts.log.append((method, path))
            if self.mix is None:
                return None
            r, m = self.rng.random(), self.mix
            for name, p in (("slow_down", m.slow_down), ("truncated", m.truncated), ("reset", m.reset)):
                if r < p:
                    setattr(self.counts, name, getattr(self.counts, name) + 1)
                    return name
                r -= p
            return None

    def reset_counts(self) -> None:
        with self._lock:
            self.counts = ProxyCounts()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """An endpoint on loopback where nothing listens: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


BUCKET = "gristmill-test"


class S3:
    """The test's bucket: moto's server, the fault proxy in front of it, a client straight to the
    server (the tests' own setup and damage) and the AWS environment that points gristmill at the proxy."""

    def __init__(self, server: MotoServer, proxy: FaultProxy):
        self.server, self.proxy, self.client = server, proxy, server.client()
        self.env = {**aws_env(proxy.url), "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        page = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
        return sorted(o["Key"][len(prefix) + 1 :] for o in page.get("Contents", []))


@contextlib.contextmanager
def s3_bucket(home: Path) -> Iterator[S3]:
    """A module's bucket (a module-scoped fixture's body): the server, the proxy, and the AWS
    environment of this process pointing at the proxy while it lasts; `home` holds the default
    cache, and no ~/.aws file counts."""
    server = MotoServer()
    server.client().create_bucket(Bucket=BUCKET)
    proxy = FaultProxy(server.url)
    s3 = S3(server, proxy)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key in [k for k in os.environ if k.startswith("AWS_")]:
                mp.delenv(key)
            s3.env.update(
                AWS_CONFIG_FILE=str(home / "none"),
                AWS_SHARED_CREDENTIALS_FILE=str(home / "none"),
                XDG_CACHE_HOME=str(home / "cache"),
            )
            for key, value in s3.env.items():
                mp.setenv(key, value)
            yield s3
    finally:
        proxy.stop()
        server.stop()


def bucket_objects(s3: S3, prefix: str) -> dict[str, str]:
    """{path: ETag} of the objects under `prefix`, listed past the fault proxy."""
    page = s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
    return {o["Key"][len(prefix) + 1 :]: o["ETag"].strip('"') for o in page.get("Contents", [])}


def puts(s3: S3, prefix: str) -> set[str]:
    """The objects under `prefix` PUT (whatever their fate) since the proxy's counts were reset."""
    base = f"/{BUCKET}/{prefix}/"
    return {
        path.split("?")[0][len(base) :]
        for m, path in s3.proxy.counts.log
        if m == "PUT" and path.startswith(base)
    }


def damage(s3: S3, key: str) -> None:
    """Object `key` replaced by as many other bytes, its metadata (the sha256 claim) kept."""
    obj = s3.client.get_object(Bucket=BUCKET, Key=key)
    body = bytearray(obj["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body), Metadata=obj["Metadata"])
