"""Datasets on object storage (docs/object-storage.md), against a real S3 server on loopback: moto's
server in its own process, behind the seeded fault-injecting proxy of tests/helpers/s3_server.py
(10% 503 SlowDown, 2% truncated bodies, 1% connection resets, where a test turns faults on).

One server and one bucket for the module. The real build (`built_dataset`) is built a second time
straight to the bucket; the small synthetic dataset (`synthetic`) is uploaded once for the loader
and trainer tests. Every reader compares what it gets from the bucket with the local copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipelines.cli import main as gristmill
from pipelines.local_s3 import aws_env
from pipelines.upload import upload_dataset
from tests.helpers import forked
from tests.helpers.s3_server import FaultMix, FaultProxy, MotoServer, closed_port_url
from tests.helpers.train_data import make_dataset
from tests.helpers.train_runs import ENV, ROOT, TINY, losses, metrics, overrides, torchrun_cmd, wait_for_step
from training.contract.dataset_format import DATASET_JSON, DatasetError, read_dataset_info
from training.contract.object_store import COUNTS
from training.data.loader import batch_sha256, dataset_loader
from training.data.remote import CacheSettings, tmp_name
from training.data.shard_cache import cache_usage
from training.train import load_train_config, train

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

BUCKET = "gristmill-test"
STEPS = 12  # overrides(): 12 steps, a checkpoint every 4


class S3:
    def __init__(self, server: MotoServer, proxy: FaultProxy):
        self.server, self.proxy, self.client = server, proxy, server.client()
        self.env = {**aws_env(proxy.url), "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def keys(self, prefix: str) -> list[str]:
        page = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
        return sorted(o["Key"][len(prefix) + 1 :] for o in page.get("Contents", []))


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoServer()
    server.client().create_bucket(Bucket=BUCKET)
    proxy = FaultProxy(server.url)
    s3 = S3(server, proxy)
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(key)
        home = tmp_path_factory.mktemp("home")
        # No ~/.aws files count; the default cache (data inspect/validate/audit of a URL) is the test's.
        s3.env.update(
            AWS_CONFIG_FILE=str(home / "none"),
            AWS_SHARED_CREDENTIALS_FILE=str(home / "none"),
            XDG_CACHE_HOME=str(home / "cache"),
        )
        for key, value in s3.env.items():
            mp.setenv(key, value)
        yield s3
    proxy.stop()
    server.stop()


@pytest.fixture(scope="module")
def synthetic(s3, synthetic_dataset) -> tuple[Path, str]:
    """The trainer tests' synthetic dataset (10 shards), locally and uploaded."""
    local = synthetic_dataset(n_docs=300)
    upload_dataset(local, s3.url("synthetic"), log=lambda *a: None)
    return local, s3.url("synthetic")


def cache(tmp_path: Path, gb: float = 1.0) -> CacheSettings:
    return CacheSettings(tmp_path / "cache", int(gb * 1e9))


def hashes(location, n: int, **kw) -> list[str]:
    loader = dataset_loader(location, seq_len=64, global_batch=8, micro_batch=4, seed=3, **kw)
    return [batch_sha256(b) for _, b in zip(range(n), loader)]


def run_env(s3: S3, cache_dir: Path) -> dict[str, str]:
    return {**ENV, **s3.env, "XDG_CACHE_HOME": str(cache_dir)}  # its own default cache


# --------------------------------------------------------------------------------------------
# item 2: the build writes to the bucket; uploads are whole, resumable, dataset.json last


def test_build_writes_to_the_bucket_and_readers_get_the_local_bytes(
    s3, build_fixture, built_dataset, tmp_path, capsys
):
    from pipelines.build import build
    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config

    _, _, config = build_fixture
    url = s3.url("built")
    sets = [f"output={json.dumps(url)}", f"build.workdir={json.dumps(str(tmp_path / 'work'))}"]
    cfg = load_config(DataConfig, config, sets)
    result = build(cfg, log=lambda *a: None)
    assert result.ok and result.status == "complete"
    info = json.loads(s3.client.get_object(Bucket=BUCKET, Key=f"built/{DATASET_JSON}")["Body"].read())
    local = read_dataset_info(built_dataset)
    assert info["fingerprint"] == local["fingerprint"]  # the same shards, index and tokenizer
    assert info["files"].keys() == local["files"].keys() and "manifest/00000.parquet" in info["files"]
    for name, f in info["shard_files"].items():  # the manifest's record of each shard's sha256
        body = s3.client.get_object(Bucket=BUCKET, Key=f"built/shards/{name}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == f["sha256"] == local["shard_files"][name]["sha256"]
    assert not s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")

    # A rerun finds it complete in the bucket: nothing is built or uploaded again.
    s3.proxy.reset_counts()
    lines: list[str] = []
    assert build(load_config(DataConfig, config, sets), log=lines.append).ok
    assert any("already complete (same config): nothing to do" in line for line in lines), lines
    assert "PUT" not in s3.proxy.counts.requests

    # Readers: inspect --hash, validate and audit of the URL say what they say of the local copy.
    capsys.readouterr()

    def out(*argv: str) -> str:
        code, printed = gristmill(list(argv)), capsys.readouterr()
        assert code == 0, printed.out[-3000:] + printed.err[-3000:]
        return printed.out

    geometry = [
        "--seq-len",
        "32",
        "--global-batch",
        "8",
        "--seed",
        "5",
        "--hash",
        "--step",
        "1",
        "--end",
        "9",
    ]
    remote, here = (
        out("data", "inspect", url, *geometry),
        out("data", "inspect", str(built_dataset), *geometry),
    )
    assert remote.splitlines()[1:] == here.splitlines()[1:] and len(remote.splitlines()) == 9
    report = out("data", "validate", url, "--no-progress")
    assert report.strip().endswith("OK: every shard, document and separator checks out"), report
    assert "validation.json" in s3.keys("built")
    # The local build uploaded too: the same token stream (one copy in the cache) with its own
    # build records, which are fetched again, not taken from the other upload's copy.
    upload_dataset(built_dataset, s3.url("built-here"), log=lambda *a: None)
    report = out("data", "validate", s3.url("built-here"), "--no-progress")
    assert report.strip().endswith("OK: every shard, document and separator checks out"), report
    table = out("data", "audit", url, "--sql", "SELECT dataset_name, count(*) AS n FROM docs GROUP BY 1")
    assert url in table and f"{local['documents']:,}" in table.replace(" ", ""), table


def test_an_upload_killed_midway_reruns_to_the_same_dataset(s3, synthetic, tmp_path):
    local, _ = synthetic
    url = s3.url("killed")
    s3.proxy.reset_counts()
    s3.proxy.latency = 0.2  # a slow store: the kill lands among the PUTs
    cmd = [sys.executable, "-m", "pipelines.cli", "data", "upload", str(local), url]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=run_env(s3, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        while s3.proxy.counts.requests.get("PUT", 0) < 6:
            assert proc.poll() is None, proc.stderr.read()
            threading.Event().wait(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        threading.Event().wait(0.5)  # the PUTs in flight reach the store (or not) by now
        s3.proxy.latency = 0.0
    uploaded = s3.keys("killed")
    assert uploaded and DATASET_JSON not in uploaded  # the commit point is the last PUT
    with pytest.raises(DatasetError, match=r"dataset.json not found: .* holds no complete gristmill dataset"):
        hashes(url, 1, cache=cache(tmp_path))  # a reader sees no dataset, not part of one
    assert not s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")

    done = upload_dataset(local, url, log=lambda *a: None)
    assert done.skipped >= len(uploaded) - 1 and done.objects + done.skipped == len(uploaded) + done.objects
    assert hashes(url, 30, cache=cache(tmp_path)) == hashes(local, 30)
    assert not s3.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_uploads_never_mix_two_datasets(s3, synthetic, tmp_path):
    local, url = synthetic
    other = make_dataset(tmp_path / "other", n_docs=50, seed=1)
    with pytest.raises(DatasetError, match="holds another dataset"):
        upload_dataset(other, url, log=lambda *a: None)


# --------------------------------------------------------------------------------------------
# items 3-5: the loader through a bounded, verified cache, under faults


def test_loader_through_faults_and_a_small_cache_gives_the_local_batches(s3, synthetic, tmp_path):
    local, url = synthetic
    info = read_dataset_info(local)
    biggest = max(f["bytes"] for f in info["shard_files"].values())
    settings = CacheSettings(tmp_path / "cache", 8 * biggest)  # 8 of the 10 shards (a step reads ≤ 5)
    # Files the cache did not write, and a live process's download: eviction leaves them alone; a
    # dead process's download is removed.
    shards = settings.dir / info["fingerprint"] / "shards"
    gone = 4_194_305  # above the kernel's largest pid (2**22): no such process
    dead = shards / tmp_name("00000_00001.tar").replace(f".{os.getpid()}.", f".{gone}.")
    live = shards / tmp_name("00000_00002.tar").replace(f".{os.getpid()}.", f".{os.getppid()}.")
    foreign = [settings.dir / "notes.tar", settings.dir / "mine" / "shards" / "x.tar", live]
    for f in [*foreign, dead]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"not the cache's")
    peak, stop = [0], threading.Event()

    def sample() -> None:  # the cache's bytes (shards and downloads in flight), as often as possible
        while not stop.is_set():
            total = 0
            for p in settings.dir.rglob("*.tar*"):
                try:
                    total += p.stat().st_size if p not in foreign else 0
                except FileNotFoundError:  # evicted, or renamed into place, since the listing
                    pass
            peak[0] = max(peak[0], total)

    sampler = threading.Thread(target=sample, daemon=True)
    s3.proxy.set_faults(FaultMix(seed=395))  # a seed whose first requests meet all three faults
    before = COUNTS.snapshot()
    sampler.start()
    try:
        got = hashes(
            url, 110, cache=settings
        )  # across the end of the epoch (102 steps): shards fetched again
    finally:
        stop.set()
        sampler.join()
        s3.proxy.set_faults(None)
    assert got == hashes(local, 110)
    faults = s3.proxy.counts
    assert faults.slow_down and faults.truncated and faults.reset, faults
    assert (
        COUNTS.snapshot()["retries"] - before["retries"] == faults.slow_down + faults.truncated + faults.reset
    )
    assert peak[0] <= settings.max_bytes + biggest, (peak[0], settings.max_bytes)
    assert sum(size for _, size, _ in cache_usage(settings.dir)) <= settings.max_bytes
    assert all(f.read_bytes() == b"not the cache's" for f in foreign) and not dead.exists()


def test_shards_are_fetched_once_in_the_order_the_plan_reads_them(s3, synthetic, tmp_path):
    _, url = synthetic
    loader = dataset_loader(url, seq_len=64, global_batch=8, micro_batch=4, seed=3, cache=cache(tmp_path))
    view = loader.builder.global_view()
    first_step: dict[str, int] = {}
    for step in range(40):
        for _, shard in view.shards_read(step):
            first_step.setdefault(view.tables[0].shard_names[shard], step)
    s3.proxy.reset_counts()
    for _, _ in zip(range(40), loader):
        pass
    fetched = [p.rsplit("/", 1)[1] for p in s3.proxy.counts.gets(".tar")]
    assert sorted(fetched) == sorted(first_step)  # each shard the 40 steps read, once
    order = [first_step[name] for name in fetched]
    assert order == sorted(order), order  # ahead of need, in the plan's order
    # DataLoader workers (forked) fetch into the same cache, checked the same way.
    workers = hashes(url, 40, cache=cache(tmp_path / "workers"), num_workers=2)
    assert workers == hashes(synthetic[0], 40)


def test_a_bit_flipped_object_is_fetched_once_more_then_refused(s3, synthetic, tmp_path, capsys):
    local, _ = synthetic
    url = s3.url("flipped")
    upload_dataset(local, url, log=lambda *a: None)
    name = sorted(read_dataset_info(local)["shard_files"])[3]
    body = bytearray((local / "shards" / name).read_bytes())
    body[1000] ^= 0x10
    s3.client.put_object(Bucket=BUCKET, Key=f"flipped/shards/{name}", Body=bytes(body))
    s3.proxy.reset_counts()
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        code = gristmill(
            [
                "data",
                "inspect",
                url,
                "--seq-len",
                "64",
                "--global-batch",
                "8",
                "--seed",
                "3",
                "--hash",
                "--end",
                "40",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert (
        err[0].startswith(f"error: {url}/shards/{name}: fetched twice")
        and "nothing was trained on it" in err[0]
    )
    assert len(s3.proxy.counts.gets(f"/flipped/shards/{name}")) == 2
    assert not list((tmp_path / "xdg").rglob(name))  # never under its name in the cache


# --------------------------------------------------------------------------------------------
# item 5: training from the bucket is training from the local copy; kill -9 and resume; 2 ranks


@pytest.fixture(scope="module")
def local_run(synthetic, tmp_path_factory) -> Path:
    """The reference: 12 steps of the tiny recipe on the local copy, in this process (run.threads 1)."""
    local, _ = synthetic
    run_dir = tmp_path_factory.mktemp("local-run") / "run"
    train(load_train_config(TINY, overrides(local, run_dir)))
    return run_dir


def test_training_from_the_bucket_killed_and_resumed_equals_the_local_run(s3, synthetic, local_run, tmp_path):
    _, url = synthetic
    run_dir = tmp_path / "run"
    sets = overrides(url, run_dir, f"data.cache_dir={json.dumps(str(tmp_path / 'cache'))}")
    cmd = [sys.executable, "-m", "training.train", "--config", TINY, "--set", *sets]
    s3.proxy.set_faults(FaultMix(seed=1))
    try:
        proc = forked.popen(cmd, cwd=ROOT, env=run_env(s3, tmp_path), stderr=subprocess.STDOUT)
        try:
            wait_for_step(proc, run_dir, 6)  # past the checkpoint of step 4
        finally:
            proc.kill()  # kill -9
            proc.wait()
        killed_at = metrics(run_dir)[-1]["step"]
        assert 6 <= killed_at < STEPS
        train(load_train_config(TINY, [*sets, 'checkpoint.resume="auto"']))  # this process: no torch import
    finally:
        s3.proxy.set_faults(None)
    assert losses(run_dir) == losses(local_run), f"killed at step {killed_at}"  # bit for bit
    rows = metrics(run_dir)
    assert all(
        {"fetch/requests", "fetch/retries", "fetch/bytes", "fetch/refetches"} <= r.keys() for r in rows
    )
    assert any(r["fetch/retries"] > 0 for r in rows) and s3.proxy.counts.slow_down > 0
    assert "fetch/requests" not in metrics(local_run)[0]  # a local dataset is read in place


def test_two_ranks_share_the_cache_and_fetch_each_shard_once(s3, synthetic, local_run, tmp_path):
    local, url = synthetic
    run_dir = tmp_path / "run"
    s3.proxy.reset_counts()
    sets = overrides(
        url,
        run_dir,
        "parallel.shard=2",
        "checkpoint.interval=0",
        "run.max_steps=6",  # the reference's first 6 steps (the schedule is the same)
        f"data.cache_dir={json.dumps(str(tmp_path / 'cache'))}",
    )
    proc = forked.run(torchrun_cmd(sets), cwd=ROOT, env=run_env(s3, tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    gets = s3.proxy.counts.gets(".tar")
    assert gets and len(gets) == len(set(gets)), "a shard was downloaded twice"
    ref = {r[0]: r for r in losses(local_run)}
    for step, loss, _, lr, tokens in losses(run_dir):  # the same batches, summed in another order
        assert loss == pytest.approx(ref[step][1], abs=1e-5) and (lr, tokens) == (ref[step][3], ref[step][4])


# --------------------------------------------------------------------------------------------
# item 7: bad input is one line, before any work


@pytest.mark.parametrize("problem", ["unknown bucket", "no credentials", "unreachable endpoint"])
def test_bad_bucket_input_is_one_line_before_any_work(
    s3, build_fixture, synthetic, problem, tmp_path, capsys, monkeypatch
):
    url = f"s3://{'no-such-bucket' if problem == 'unknown bucket' else BUCKET}/data"
    if problem == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    if problem == "unreachable endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", closed_port_url())
    want = {
        "unknown bucket": f"error: bucket 'no-such-bucket' does not exist at {s3.proxy.url} ({url}",
        "no credentials": "error: no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        "unreachable endpoint": "error: cannot reach http://127.0.0.1:",
    }[problem]
    _, _, config = build_fixture
    work = tmp_path / "work"
    commands = [
        [
            "data",
            "build",
            "--config",
            str(config),
            "--set",
            f"output={json.dumps(url)}",
            f"build.workdir={json.dumps(str(work))}",
        ],
        [
            "train",
            "--config",
            TINY,
            "--set",
            f"data.dataset={json.dumps(url)}",
            f"run.output_dir={json.dumps(str(tmp_path / 'run'))}",
        ],
        ["data", "inspect", url, "--seq-len", "8", "--global-batch", "2", "--seed", "0"],
        ["data", "validate", url],
        ["data", "upload", str(synthetic[0]), url],
    ]
    for argv in commands:
        assert gristmill(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(want), (argv, err)
        assert url in err[0] or problem == "no credentials", err
    assert not work.exists() and not (tmp_path / "run").exists()


def test_bucket_config_keys_are_checked(s3, synthetic, build_fixture, tmp_path, capsys):
    _, url = synthetic
    for sets, want in [
        (["data.cache_gb=0"], "data.cache_gb = 0.0 is not allowed: it must be a finite number > 0"),
        ([f"data.cache_dir={json.dumps(str(TINY))}"], f"data.cache_dir = {str(TINY)!r} is a file"),
    ]:
        assert (
            gristmill(
                ["train", "--config", TINY, "--plan", "--set", f"data.dataset={json.dumps(url)}", *sets]
            )
            == 2
        )
        assert want in capsys.readouterr().err
    _, _, config = build_fixture
    sets = [f"output={json.dumps(s3.url('big'))}", "shards.target_mb=5000"]
    assert gristmill(["data", "build", "--config", str(config), "--set", *sets]) == 2
    assert (
        "shards.target_mb = 5000 with output s3://gristmill-test/big: a shard goes into the bucket as one PUT"
        in (capsys.readouterr().err)
    )
