"""The hub path, offline: a `source.kind = "hub"` build and `gristmill data download` against
tests/helpers/hub_server.py, a local server speaking the part of the Hugging Face hub's HTTP API that
huggingface_hub uses, serving a FineWeb-Edu-shaped folder. The server is test code; huggingface_hub,
datatrove's hf:// reading and gristmill's sources/download code are the real ones.

Both paths give the local parquet build of the same files: the same shards, manifest, excluded
rows, loader index and dataset.json fingerprint (which covers the token stream). config_sha256
differs, as it should: it hashes the recipe, whose [source] differs.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub.constants as hf_constants
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.core import url_to_fs
from huggingface_hub.utils import http_backoff

from pipelines import download
from pipelines.build import build, resolve_tokenizer
from pipelines.cli import main
from pipelines.config import DataConfig
from pipelines.download import PART, RECORD, list_remote
from pipelines.sources import SourceError, list_source_files, make_reader
from tests.helpers import forked
from tests.helpers.corpus import fixture_config_text, write_fixture_corpus
from tests.helpers.hub_server import HubServer, point_hub_at
from tests.helpers.s3_server import BUCKET, s3_bucket
from tokenization.tokenizer_io import TokenizerError
from training.contract.config_loader import load_config
from training.contract.dataset_format import read_dataset_info

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.xdist_group("hub_server"),  # one hub server and one local build: every test on one worker
]

ROOT = Path(__file__).resolve().parents[2]
REPO = "gristmill-test/fineweb-edu"  # made up: a request that escaped to the real hub would fail
TOKENIZER_REPO = "gristmill-test/tokenizer"
OLDER_TOKENIZER_REPO = "gristmill-test/older-tokenizer"
SUBSET = "sample/10BT"
NAMES = [f"{SUBSET}/{i:03d}_00000.parquet" for i in range(3)]
DROPPED = NAMES[1]
HUB = [
    "source.kind=hub",
    f"source.path=hf://datasets/{REPO}",
    f"source.subset={SUBSET}",
    "build.tasks=0",  # one task per file, as the real recipe
]
# FineWeb-Edu's columns, in its order (date and file_path are read by nobody, as on the hub)
COLUMNS = [
    "text", "id", "dump", "url", "date", "file_path", "language", "language_score", "token_count", "score",
    "int_score",
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, build_fixture):
    """FineWeb-Edu-shaped parquet files in LOCAL/sample/10BT, their bytes, and a recipe for them."""
    root = tmp_path_factory.mktemp("hub-corpus")
    plain = write_fixture_corpus(root / "plain", n_files=len(NAMES), n_docs=120)
    local = root / "local"
    files = {}
    for name, src in zip(NAMES, sorted(plain.glob("*.parquet"))):
        t = pq.read_table(src)
        n = t.num_rows
        t = t.append_column("date", pa.array(["2024-02-21T08:20:51Z"] * n))
        warc = [
            f"s3://commoncrawl/crawl-data/{d}/segments/x/warc/CC.warc.gz"
            for d in t.column("dump").to_pylist()
        ]
        t = t.append_column("file_path", pa.array(warc)).select(COLUMNS)
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, local / name)
        files[name] = (local / name).read_bytes()
    _, tokenizer, _ = build_fixture
    config = root / "data.toml"
    config.write_text(fixture_config_text(local / SUBSET, tokenizer, root / "unused"))
    return SimpleNamespace(local=local, files=files, tokenizer=tokenizer, config=config)


@pytest.fixture(scope="module")
def hub(corpus):
    # Beside the subset: a README and another dump's folder, which a build of the subset never reads.
    dataset = {"README.md": b"---\nlicense: odc-by\n---\n", **corpus.files}
    dataset["data/CC-MAIN-2024-10/000_00000.parquet"] = corpus.files[NAMES[0]]
    with HubServer(page_size=2) as server:  # 2 entries a page: the listings follow `Link` headers
        server.add_repo(REPO, dataset)
        server.add_repo(TOKENIZER_REPO, {"tokenizer.json": corpus.tokenizer.read_bytes()}, repo_type="model")
        server.add_repo(
            OLDER_TOKENIZER_REPO, {"tokenizer.json": older_serialisation(corpus.tokenizer)}, "model"
        )
        yield server


def older_serialisation(tokenizer: Path) -> bytes:
    """The tokenizer as tokenizers < 0.19.1 wrote it (no model.ignore_merges), compact: what many hub
    repos hold. Loaded and saved again, it gains the key: other bytes, the same tokenizer."""
    spec = json.loads(tokenizer.read_text())
    spec["model"].pop("ignore_merges", None)
    return json.dumps(spec).encode()


@pytest.fixture
def hub_env(hub, monkeypatch, tmp_path):
    """Points this process's huggingface_hub at `hub`, with an empty cache and no token, and
    returns the environment that does the same for a subprocess."""
    yield point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
    hub.heal()  # a drop a failed test left behind must not reach the next one


@pytest.fixture
def quick_retries(monkeypatch):
    """The same retries, without the waits: huggingface_hub retries a dropped request 5 times
    (1+2+4+8+8 s apart) and `gristmill data download` its transfers 3 times (1, 2 s apart)."""
    monkeypatch.setitem(http_backoff.__kwdefaults__, "base_wait_time", 0.0)
    monkeypatch.setattr(download, "time", SimpleNamespace(sleep=lambda s: None))


@pytest.fixture(scope="module")
def local_build(corpus, tmp_path_factory) -> Path:
    """The reference: the local parquet build of the same files."""
    out = tmp_path_factory.mktemp("hub-ref") / "ds"
    cfg = load_config(DataConfig, corpus.config, [f"output={out}", "build.tasks=0", "build.workers=1"])
    assert build(cfg, log=lambda *a: None).ok
    return out


def assert_same_dataset(out: Path, ref: Path) -> None:
    for sub in ("shards", "manifest", "excluded", "index"):
        names = sorted(p.name for p in (ref / sub).iterdir())
        assert names and names == sorted(p.name for p in (out / sub).iterdir()), sub
        for name in names:
            assert (out / sub / name).read_bytes() == (ref / sub / name).read_bytes(), f"{sub}/{name}"
    assert (out / "tokenizer.json").read_bytes() == (ref / "tokenizer.json").read_bytes()
    info, want = read_dataset_info(out), read_dataset_info(ref)
    assert info["status"] == "complete" and info["tasks"] == len(NAMES)
    for key in ("fingerprint", "documents", "tokens", "excluded_by_filter"):
        assert info[key] == want[key], key
    assert info["config_sha256"] != want["config_sha256"]  # the recipe's [source] is hashed too


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_argv(corpus, out: Path, *overrides: str) -> list[str]:
    argv = ["data", "build", "--config", str(corpus.config), "--set", f"output={out}"]
    for o in overrides:
        argv += ["--set", o]
    return argv


def fails_in_one_line(hub: HubServer, capsys, argv: list[str]) -> str:
    """Runs the CLI while DROPPED's connection drops mid-file every time; its one error line."""
    hub.drop_after(DROPPED, 5000, times=1000)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    hub.heal()
    return err.strip().splitlines()[-1]  # after huggingface_hub's retry warnings


def test_download_then_build_gives_the_local_build(
    hub, hub_env, quick_retries, corpus, local_build, tmp_path, capsys
):
    root = f"hf://datasets/{REPO}"
    fs, _ = url_to_fs(root)
    listed = list_remote(fs, root, SUBSET, "*.parquet")  # the hub's LFS checksums, from its tree listing
    assert [(f.path, f.size, f.sha256) for f in listed] == [
        (n, len(d), sha256(d)) for n, d in corpus.files.items()
    ]

    # A connection that drops in the middle of one file, every time: one line, no traceback.
    dest = tmp_path / "fineweb-edu"
    argv = ["data", "download", "--repo", REPO, "--subset", SUBSET, "--to", str(dest), "--workers", "2"]
    last = fails_in_one_line(hub, capsys, argv)
    assert last.startswith(f"error: {DROPPED}: transfer failed after 3 tries (RemoteProtocolError: "), last
    assert last.endswith("run the command again to resume it")
    assert not (dest / DROPPED).exists() and (dest / NAMES[0]).read_bytes() == corpus.files[NAMES[0]]

    # The rerun skips the finished files and resumes the cut one with a ranged request.
    half = len(corpus.files[DROPPED]) // 2
    (dest / (DROPPED + PART)).write_bytes(corpus.files[DROPPED][:half])
    mark = len(hub.requests)
    assert main(argv) == 0
    assert "3 files: 1 downloaded (1 resumed), 2 already complete" in capsys.readouterr().out
    assert any(DROPPED in r and f"bytes={half}-" in r for r in hub.requests[mark:]), hub.requests[mark:]
    record = json.loads((dest / RECORD).read_text())["files"]
    for name, data in corpus.files.items():
        assert (dest / name).read_bytes() == data and record[name]["sha256"] == sha256(data)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.parquet")) == NAMES

    out = tmp_path / "from-download"
    overrides = [f"output={out}", f"source.path={dest / SUBSET}", "build.tasks=0", "build.workers=1"]
    assert build(load_config(DataConfig, corpus.config, overrides), log=lambda *a: None).ok
    assert_same_dataset(out, local_build)


def test_hub_build_gives_the_local_build(hub, hub_env, corpus, local_build, tmp_path):
    # As a user runs it: the CLI in its own process, tasks in 2 worker processes, the tokenizer
    # fetched by hub name (hf_hub_download), as configs/data/fineweb-edu-sample-10BT.toml does.
    out = tmp_path / "from-hub"
    argv = build_argv(corpus, out, *HUB, "build.workers=2", f"tokenizer.path={TOKENIZER_REPO}")
    hub.drop_after(DROPPED, 5000, times=1)  # dropped once: huggingface_hub's retry reads it again
    mark = len(hub.requests)
    run = forked.run([sys.executable, "-m", "pipelines.cli", *argv], cwd=ROOT, env=hub_env, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert_same_dataset(out, local_build)

    requests = hub.requests[mark:]
    reads = [r.split()[1] for r in requests if r.startswith("GET /datasets/")]
    # Every task read the commit the driver listed, and only the subset's files.
    pinned = f"/datasets/{REPO}/resolve/{hub.head(REPO)}/"
    assert reads and all(r.startswith(pinned) for r in reads), reads
    assert {r.removeprefix(pinned) for r in reads} == set(NAMES)
    assert sum(r.endswith(DROPPED) for r in reads) > sum(r.endswith(NAMES[0]) for r in reads)  # the retry
    assert f"GET /{TOKENIZER_REPO}/resolve/main/tokenizer.json" in requests


def test_a_connection_that_keeps_dropping_fails_its_task_in_one_line_and_the_rerun_completes(
    hub, hub_env, quick_retries, corpus, local_build, tmp_path, capsys
):
    out = tmp_path / "ds"
    argv = build_argv(corpus, out, *HUB, "build.workers=1")
    last = fails_in_one_line(hub, capsys, argv)
    url = f"hf://datasets/{REPO}@{hub.head(REPO)}/{DROPPED}"
    assert last.startswith(f"error: {url} cannot be read as parquet (RemoteProtocolError: peer closed"), last
    assert "rerun the same command (finished tasks are kept)" in last
    assert (out / "logs" / "completions" / "00000").is_file() and not (out / "dataset.json").exists()

    # A push between the failure and the rerun: the resume still reads the commit the build started
    # from, or the remaining tasks would read another commit's files than the finished ones.
    started = hub.head(REPO)
    hub.push(REPO, corpus.files)
    assert hub.head(REPO) != started
    mark = len(hub.requests)
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "resuming" in printed and f"reading hf://datasets/{REPO}@{started}/{SUBSET}, the commit" in printed
    assert "MB of input (parquet files on the hub, compressed)" in printed, printed  # not "on disk"
    reads = [r.split()[1] for r in hub.requests[mark:] if r.startswith("GET /datasets/")]
    assert reads and all(r.startswith(f"/datasets/{REPO}/resolve/{started}/") for r in reads), reads
    assert_same_dataset(out, local_build)
    assert read_dataset_info(out)["source"]["read_from"] == f"hf://datasets/{REPO}@{started}/{SUBSET}"


def test_a_bucket_build_rerun_on_another_node_reads_the_commit_it_started_from(
    hub, hub_env, quick_retries, corpus, tmp_path, capsys
):
    """A build into s3:// needs no shared disk: its rerun on another node (another work directory)
    took the pin from a local build.json alone, listed the hub anew after a push, and its remaining
    tasks read the new commit while dataset.json's read_from named the first, exit 0: two commits in
    one dataset (review R25d S2). The bucket's build.json pins the rerun, wherever it runs."""
    with s3_bucket(tmp_path / "home") as s3:
        repo = "gristmill-test/fineweb-edu-bucket"
        started = hub.add_repo(repo, corpus.files)
        url = s3.url("hub-ds")
        hubs = [
            "source.kind=hub",
            f"source.path=hf://datasets/{repo}",
            f"source.subset={SUBSET}",
            "build.tasks=0",
        ]
        argv = build_argv(corpus, tmp_path / "unused", *hubs, f"output={url}", "build.workers=1")
        hub.drop_after(DROPPED, 5000, times=1000)
        assert main([*argv, "--set", f"build.workdir={tmp_path / 'node1'}"]) == 2
        hub.heal()
        hub.push(repo, corpus.files)  # a new commit (the same bytes: what was read tells them apart)
        mark = len(hub.requests)
        capsys.readouterr()
        assert main([*argv, "--set", f"build.workdir={tmp_path / 'node2'}"]) == 0
        assert f"reading hf://datasets/{repo}@{started}/{SUBSET}, the commit" in capsys.readouterr().out
        reads = [r.split()[1] for r in hub.requests[mark:] if r.startswith("GET /datasets/")]
        assert reads and all(r.startswith(f"/datasets/{repo}/resolve/{started}/") for r in reads), reads
        info = json.loads(s3.client.get_object(Bucket=BUCKET, Key="hub-ds/dataset.json")["Body"].read())
        assert info["source"]["read_from"] == f"hf://datasets/{repo}@{started}/{SUBSET}"


def test_a_file_outside_lfs_changed_at_the_same_size_is_downloaded_again(hub, hub_env, tmp_path, capsys):
    """A file the hub keeps in git, not LFS (a .jsonl), has no sha256 in the listing: its git blob id
    is recorded with it, and a push that changes its bytes, not its size, is fetched again."""
    repo, rel = "gristmill-test/jsonl-pushed", f"{SUBSET}/000.jsonl"
    hub.add_repo(repo, {rel: b'{"text": "one"}\n'})
    dest = tmp_path / "dl"
    argv = ["data", "download", "--repo", repo, "--subset", SUBSET, "--pattern", "*.jsonl", "--to", str(dest)]
    assert main(argv) == 0
    hub.push(repo, {rel: b'{"text": "two"}\n'})
    capsys.readouterr()
    assert main(argv) == 0
    assert "1 downloaded" in capsys.readouterr().out and (dest / rel).read_bytes() == b'{"text": "two"}\n'


def test_tasks_read_the_commit_the_driver_listed(hub, hub_env, corpus):
    repo = "gristmill-test/fineweb-edu-pushed"
    first = hub.add_repo(repo, corpus.files)
    cfg = load_config(DataConfig, corpus.config, [*HUB, f"source.path=hf://datasets/{repo}"]).source
    source = list_source_files(cfg)
    assert source.folder == f"hf://datasets/{repo}@{first}/{SUBSET}"
    assert source.files == [n.split("/", 2)[2] for n in NAMES]
    assert source.sizes == [len(d) for d in corpus.files.values()]

    # A push while the tasks run (FineWeb-Edu does get updated): they still read what was listed.
    second = hub.push(repo, {**corpus.files, DROPPED: corpus.files[NAMES[0]]})
    ids = [d.id for f in source.files for d in make_reader(cfg, source).read_file(f)]
    assert ids == [
        i for n in NAMES for i in pq.read_table(corpus.local / n, columns=["id"])["id"].to_pylist()
    ]
    assert list_source_files(cfg).folder == f"hf://datasets/{repo}@{second}/{SUBSET}"  # the next build
    at_first = replace(cfg, path=f"hf://datasets/{repo}@{first}")  # a revision in source.path stays
    assert list_source_files(at_first).folder == f"hf://datasets/{repo}@{first}/{SUBSET}"

    with pytest.raises(
        SourceError, match=rf"hf://datasets/{repo}@{second}/sample/350BT holds no files matching"
    ):
        list_source_files(replace(cfg, subset="sample/350BT"))
    with pytest.raises(SourceError, match="hf://datasets/gristmill-test/missing/sample/10BT does not exist"):
        list_source_files(replace(cfg, path="hf://datasets/gristmill-test/missing"))
    # a revision the repository lacks named; an id the hub cannot hold said to be one, not "unreachable"
    # with a download advised of it; a begun build's commit gone, said as tokenizer.path's (trial RV78b 7, 8)
    with pytest.raises(SourceError) as e:
        list_source_files(replace(cfg, path=f"hf://datasets/{repo}@v9"))
    assert f"(the repository {repo}, its revision 'v9' or the folder {SUBSET})" in str(e.value), e.value
    with pytest.raises(SourceError) as e:
        list_source_files(replace(cfg, path="hf://datasets/t--x/fw"))
    said = str(e.value)
    assert (
        said.startswith("source.path 'hf://datasets/t--x/fw' is not a hub dataset path")
        and "download" not in said
    )
    gone = f"hf://datasets/{repo}@{'0' * 40}/{SUBSET}"
    with pytest.raises(
        SourceError, match=f"^the hub source {re.escape(gone)}, the commit this build started"
    ):
        list_source_files(cfg, pinned=gone)


def test_a_hub_tokenizer_is_recorded_as_the_hub_serves_it(hub, hub_env, corpus):
    """The dataset's tokenizer.json is the hub file's bytes, not tokenizers' re-serialisation of it:
    a base model's own tokenizer (train.init_from = ORG/BASE beside tokenizer.path = ORG/BASE) was
    refused as another one when an older `tokenizers` wrote the hub's file."""
    cfg = load_config(DataConfig, corpus.config, [f"tokenizer.path={OLDER_TOKENIZER_REPO}"])
    tok_bytes, encoder, _ = resolve_tokenizer(cfg, None, log=lambda *a: None)
    assert tok_bytes == older_serialisation(corpus.tokenizer)
    assert encoder.separator_id is not None


def test_a_hub_tokenizer_is_read_at_the_revision_it_names(hub, hub_env, corpus, monkeypatch, tmp_path):
    """tokenizer.path = ORG/NAME@REV reads that revision, as model.init_from and source.path take one:
    it was passed whole to the hub as the repo id, refused as invalid, and the line advised
    downloading it on a machine with network (review R25d M3). An id the hub cannot hold is said to
    be one, the network not blamed; a revision the repository lacks is named. Offline, a revision
    not cached is said to be, and the download advised is of that revision, not main (review R25g 3)."""
    repo = "gristmill-test/tokenizer-pinned"
    first = hub.add_repo(repo, {"tokenizer.json": corpus.tokenizer.read_bytes()}, "model")
    hub.push(repo, {"tokenizer.json": older_serialisation(corpus.tokenizer)}, "model")

    def resolve(spec: str) -> bytes:
        cfg = load_config(DataConfig, corpus.config, [f"tokenizer.path={spec}"])
        return resolve_tokenizer(cfg, None, log=lambda *a: None)[0]

    assert resolve(f"{repo}@{first}") == corpus.tokenizer.read_bytes()
    assert resolve(repo) == older_serialisation(corpus.tokenizer)  # main: the push
    with pytest.raises(TokenizerError) as invalid:
        resolve("gristmill-test/two--dashes")
    assert str(invalid.value).startswith("tokenizer.path = 'gristmill-test/two--dashes' is neither a local")
    assert "hub repo id (ORG/NAME, or ORG/NAME@REV" in str(invalid.value)
    assert "network" not in str(invalid.value)
    with pytest.raises(TokenizerError, match=f"the hub repository {repo} has no revision 'v9'"):
        resolve(f"{repo}@v9")
    # the cached copy damaged (two ids swapped): it was built with as the pinned commit's (trial RV62c S1)
    cached = Path(hf_constants.HF_HUB_CACHE).glob(f"models--{repo.replace('/', '--')}/snapshots/{first}/*")
    (copy,) = cached
    good = copy.read_bytes()
    copy.resolve().write_bytes(good + b"\n")  # valid, and read alike: only its bytes tell
    with pytest.raises(TokenizerError) as damaged:
        resolve(f"{repo}@{first}")
    line = str(damaged.value)
    assert line.startswith(f"{copy}: the hub cache's copy is damaged (git blob sha1 "), line
    assert f"delete {copy.resolve()} and run again with network" in line
    copy.resolve().unlink()  # as the line says: fetched anew
    assert resolve(f"{repo}@{first}") == good
    # no link (edited in place, or copied in at the same size): built with it, recorded as the pinned
    # commit's (trial RV78b 3); nor another commit's tokenizer, one of the cache's blobs, in its place
    # (review RV78c 1): held to the commit's listing, which the fetch keeps; the same bytes unlinked (a
    # cache copied with `cp -rL`) are the hub's still
    assert (copy.parent.parent.parent / "trees" / f"{first}.json").is_file()
    (main,) = (p for p in copy.parent.parent.iterdir() if p.name != first)
    for other in (good + b"\n", (main / "tokenizer.json").read_bytes()):
        copy.unlink()
        copy.write_bytes(other)
        with pytest.raises(TokenizerError) as unlinked:
            resolve(f"{repo}@{first}")
        assert str(unlinked.value).startswith(f"{copy}: the hub cache's copy is damaged (git blob sha1 "), (
            unlinked.value
        )
    copy.unlink()
    copy.write_bytes(good)
    assert resolve(f"{repo}@{first}") == good
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "another-machine"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TokenizerError) as offline:
        resolve(f"{repo}@{first}")
    line = str(offline.value)
    assert (
        f"'{repo}@{first}': HF_HUB_OFFLINE is set, and the hub cache {tmp_path / 'another-machine'}" in line
    )
    assert f"(`hf download {repo} tokenizer.json --revision {first}`)" in line, line


def test_a_hub_tokenizer_read_from_the_cache_s_main_with_the_hub_not_reached_is_said(
    hub, hub_env, corpus, monkeypatch
):
    """The hub not reached (not offline), hf_hub_download reads the cache's main without a word: a
    build recorded that commit as what main named, where the hub's main had moved (trial RV78b 4).
    Said as model.init_from says it of a base; nothing when the hub names the commit read."""
    import huggingface_hub.constants as hf_constants

    repo = "gristmill-test/tokenizer-moved"
    first = hub.add_repo(repo, {"tokenizer.json": corpus.tokenizer.read_bytes()}, "model")

    def notes() -> list[str]:
        lines: list[str] = []
        cfg = load_config(DataConfig, corpus.config, [f"tokenizer.path={repo}"])
        pinned = resolve_tokenizer(cfg, None, log=lines.append)[2]
        return [pinned, *(line for line in lines if line.startswith("note: "))]

    assert notes() == [f"{repo}@{first}"]  # cached, and the hub's main
    hub.push(repo, {"tokenizer.json": older_serialisation(corpus.tokenizer)}, "model")
    dead = "http://127.0.0.1:9"  # discard: nothing listens
    monkeypatch.setattr(hf_constants, "ENDPOINT", dead)
    monkeypatch.setattr(
        hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", dead + "/{repo_id}/resolve/{revision}/{filename}"
    )
    pinned, *said = notes()
    assert pinned == f"{repo}@{first}" and len(said) == 1, said
    assert said[0].startswith(
        f"note: tokenizer.path = {repo!r}: the Hugging Face hub did not say which commit main names ("
    ), said
    assert f"the tokenizer read is commit {first}, the one the hub cache " in said[0], said
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)  # the cache's, as asked: nothing to say
    assert notes() == [f"{repo}@{first}"]


def test_offline_a_hub_tokenizer_the_cache_records_as_absent_is_said_to_be_absent(
    hub, hub_env, corpus, monkeypatch
):
    """Review R25l M2: offline, a tokenizer.path = ORG/NAME whose repository the hub had answered
    holds no tokenizer.json (the cache's .no_exist record of it) was said not to be cached, to be
    downloaded with network or `hf download`, which fails the same way. Offline it is said that the
    cache records the repository held none, the hub not asked (a later commit may hold one: R25o 1)."""
    repo = "gristmill-test/no-tokenizer"
    hub.add_repo(repo, {"config.json": b"{}"}, "model")

    def refused() -> str:
        cfg = load_config(DataConfig, corpus.config, [f"tokenizer.path={repo}"])
        with pytest.raises(TokenizerError) as e:
            resolve_tokenizer(cfg, None, log=lambda *a: None)
        return str(e.value)

    online = refused()
    assert online == f"tokenizer.path = {repo!r}: the hub repository {repo} holds no tokenizer.json", online
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    offline = refused()
    assert f"records that {repo} held no tokenizer.json at " in offline, offline
    assert "the hub was not asked" in offline and "hf download" not in offline, offline


def test_a_rerun_reads_the_hub_tokenizer_at_the_commit_the_build_started_from(
    hub, hub_env, quick_retries, corpus, local_build, tmp_path, capsys, monkeypatch
):
    """tokenizer.path = ORG/NAME was fetched at `main` on every run: a push to the tokenizer's
    repository between a failed build and its rerun was another tokenizer.sha256, and the rerun was
    refused (start over), its finished tasks lost, though OUTPUT/tokenizer.json held the first bytes
    (review R25d M2). build.json records the commit, and the rerun reads it, as the source's. That
    commit gone from the hub (a force-push) and from the cache is said to be the build's, with the
    ways out: the recipe's tokenizer.path was blamed for a revision it never named (review R25g 4)."""
    repo = "gristmill-test/tokenizer-moving"
    started = hub.add_repo(repo, {"tokenizer.json": corpus.tokenizer.read_bytes()}, "model")
    out = tmp_path / "ds"
    argv = build_argv(corpus, out, *HUB, "build.workers=1", f"tokenizer.path={repo}")
    fails_in_one_line(hub, capsys, argv)
    assert (out / "logs" / "completions" / "00000").is_file()
    build_json = json.loads((out / "build.json").read_text())
    assert build_json["tokenizer"] == {"requested": repo, "pinned": f"{repo}@{started}"}

    hub.push(repo, {"tokenizer.json": older_serialisation(corpus.tokenizer)}, "model")  # other bytes
    mark = len(hub.requests)
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"reading tokenizer {repo}@{started}, the commit this build started from" in printed
    assert "resuming" in printed
    assert not [r for r in hub.requests[mark:] if f"/{repo}/resolve/main/" in r]  # the cached commit's
    assert_same_dataset(out, local_build)

    del hub.repos[("model", repo)].commits[started]  # force-pushed away; another machine's cache
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "another-machine"))
    assert main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"error: tokenizer.path = {repo!r}: {repo}@{started}, the commit this build started from (its "
        f"build.json), is gone from the hub repository {repo} (a force-push, or its branch deleted) and is "
        "not in the hub cache here: restore that commit on the hub, or build into a new output directory "
        f"(which reads tokenizer.path anew); or set tokenizer.path = {out / 'tokenizer.json'}, the build's "
        "copy of that commit's file (the sha256 this build started with): the finished tasks are kept"
    ), line
    # the way out the line offers (trial RV62c L4: only a new output was)
    kept = [
        a if not a.startswith("tokenizer.path=") else f"tokenizer.path={out / 'tokenizer.json'}" for a in argv
    ]
    assert main(kept) == 0, capsys.readouterr().err
    assert_same_dataset(out, local_build)


def test_the_hub_probe_connects_where_the_libraries_do(hub, hub_env, monkeypatch):
    """`gristmill eval`, `data decontam-index` and a build's [decontaminate] tasks asked whether the hub
    answers at port 443 of HF_ENDPOINT's host: an endpoint on its own port (this stand-in's) and any
    behind a proxy were "the hub is unreachable", though `datasets` read them (trial RV72a F3)."""
    from validation.eval_data import hub_reachable

    for var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.lower(), raising=False)
    assert hub.url.startswith("http://127.0.0.1:") and hub_reachable()  # at its own port
    for flag, value, offline in [("HF_DATASETS_OFFLINE", "0", False), ("HF_HUB_OFFLINE", "false", False)]:
        monkeypatch.setenv(flag, value)  # not offline, as the libraries read it (re-trial RV72e F7)
        assert hub_reachable() is not offline
        monkeypatch.delenv(flag)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hub_reachable()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:1")  # nothing listens there
    assert not hub_reachable()
    monkeypatch.setenv("HTTPS_PROXY", hub.url)  # a proxy that answers (any listening socket stands in)
    assert hub_reachable()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # not through the proxy: the endpoint itself
    assert not hub_reachable()
