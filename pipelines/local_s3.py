"""A real S3 server on this machine, for the demo's bucket stage and bench/object_store.py (the tests
start it too): moto's S3 app (`moto[server]`, in the dev extra; `serve`) in its own process on
127.0.0.1, on a free port, with a bucket; `env()` is the standard AWS environment that points a client
at it. Nothing here is used when training on a real bucket.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from training.contract.errors import GristmillError
from training.contract.lifetime import signal_at_parent_death

REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aws_env(endpoint: str) -> dict[str, str]:
    """The standard AWS variables for a client of `endpoint` (moto accepts any credentials)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }


def serve(port: int) -> None:
    """moto's S3 app alone on 127.0.0.1:`port`, until SIGTERM: `python -m moto.server` answers every
    AWS service, guessing each request's from its headers under one lock, and logs each request; the
    buckets here need S3 only (the same app moto's dispatcher hands S3 requests to)."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    class Quiet(MotoRequestHandler):
        def log_request(self, *args, **kwargs) -> None:
            pass

    os.environ.setdefault("MOTO_PORT", str(port))  # moto's own server sets it: URLs it builds name it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple("127.0.0.1", port, create_backend_app("s3"), threaded=True, request_handler=Quiet)


class LocalS3:
    """moto's S3 server on a free loopback port (state in its process); `stop()` ends it."""

    def __init__(self, *buckets: str) -> None:
        try:
            import moto.server  # noqa: F401
        except ImportError:
            raise GristmillError(
                "a local S3 server needs moto: pip install 'moto[server]' (in gristmill's dev extra)"
            ) from None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "pipelines.local_s3", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # SIGTERM when the process that started it dies, even by SIGKILL: a test run or a
            # bench cut short would otherwise leave it running
            preexec_fn=functools.partial(signal_at_parent_death, os.getpid(), signal.SIGTERM),
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise GristmillError("moto's S3 server did not start") from None
                time.sleep(0.05)
        for bucket in buckets:  # moto checks no signature: a bare PUT makes a bucket
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/{bucket}", method="PUT"), timeout=30)

    def env(self) -> dict[str, str]:
        return aws_env(self.url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
