"""The loader's guarantees (docs/design.md), each checked so that it fails when the guarantee breaks.

Datasets are synthetic, written with the real ShardWriter. In the "token-position" corpus every
token names its document and position (token = 1 + doc·1000 + position, separator 0), so a test
can decode any batch back into (document, position) pairs and check order, coverage and resets.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from pipelines.cli import main as cli
from pipelines.shard_writer import finalize_dataset
from tests.helpers import forked
from tests.helpers.position_corpus import KEYS, SEP, decode, doc_tokens, epoch_stream, make_dataset, rows
from tests.helpers.train_data import SEPARATOR_ID
from tests.helpers.train_data import make_dataset as make_train_dataset
from tests.helpers.train_runs import TINY, recipe
from training.contract.dataset_format import DatasetError, numpy_dtype, read_dataset_info
from training.data import order as epoch_order
from training.data.loader import (
    LoaderConfigError,
    LoaderStateError,
    TokenLoader,
    batch_sha256,
    dataset_loader,
)

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

SEQ, G = 15, 8  # windows of 16 tokens, 8 sequences per global step


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return root, make_dataset(root)


@pytest.fixture(params=["default-plan", "small-blocks"])
def plan_shape(request, monkeypatch):
    """Default plan (one group here) or 4-doc blocks in groups of 3: many group boundaries."""
    if request.param == "small-blocks":
        monkeypatch.setattr(epoch_order, "BLOCK_DOCS", 4)
        monkeypatch.setattr(epoch_order, "GROUP_BLOCKS", 3)
    return request.param


def make_loader(root, **kw) -> TokenLoader:
    args = dict(seq_len=SEQ, global_batch=G, micro_batch=2, seed=1, check_separators=True)
    return dataset_loader(root, **{**args, **kw})


def take(loader: TokenLoader, n: int) -> list:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def assert_same_stream(got: list, want: list) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        ra, rb = rows(a), rows(b)
        for k in KEYS:
            assert np.array_equal(ra[k], rb[k]), f"step {step}: {k} differs"


def doc_order(stream: np.ndarray) -> list[int]:
    doc, pos = decode(stream)
    return doc[(pos == 0) & (stream != SEP)].tolist()


# --- resume --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", ["0", "1", "mid", "epoch-end", "next-epoch"])
def test_split_resume_equals_uninterrupted(corpus, plan_shape, k):
    root, _ = corpus
    ref_loader = make_loader(root)
    spe = ref_loader.steps_per_epoch
    total = spe + 6
    k = {"0": 0, "1": 1, "mid": spe // 2, "epoch-end": spe, "next-epoch": spe + 3}[k]
    reference = take(ref_loader, total)

    first = make_loader(root)
    head = take(first, k)
    state = json.loads(json.dumps(first.state_dict()))  # plain data: survives any serialiser (DCP too)
    assert state["step"] == k
    resumed = make_loader(root)
    resumed.load_state_dict(state)
    assert_same_stream(head + take(resumed, total - k), reference)


def test_state_counts_consumed_not_prefetched_steps(corpus):
    root, _ = corpus
    loader = make_loader(root, num_workers=2)
    it = iter(loader)
    got = [next(it), next(it)]  # workers have prefetched more by now
    state = loader.state_dict()
    assert state["step"] == 2
    resumed = make_loader(root)
    resumed.load_state_dict(state)
    assert_same_stream(got + take(resumed, 2), take(make_loader(root), 4))


def test_loader_workers_end_within_a_moment_of_their_killed_trainer(corpus, tmp_path):
    """A trainer killed by SIGKILL (the OOM killer takes one rank) left its DataLoader workers running
    ~4 s, orphaned, until torch's watchdog looked (review R18b 4): no worker outlives its launcher.
    Worker 1 here starts only after the trainer is dead (killed as its workers started: an OOM kill
    at start-up, a loaded machine's late second worker): it took the reaper for its trainer and
    never ended, SIGTERM ignored, holding the shards' files and shared memory."""
    import os
    import signal
    import subprocess
    import threading
    import time

    from training.launch import child_pids

    root, _ = corpus
    gate = tmp_path / "trainer-killed"
    script = (
        "import os, time\n"
        "from training.data import loader\n"
        "started = loader._worker_start\n"
        "def late_start(trainer, worker_id):\n"
        "    deadline = time.time() + 60  # bounded: a worker of a failed test is no leftover\n"
        f"    while worker_id == 1 and not os.path.exists({str(gate)!r}) and time.time() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    started(trainer, worker_id)\n"
        "loader._worker_start = late_start\n"
        f"it = iter(loader.dataset_loader({str(root)!r}, seq_len={SEQ}, global_batch={G}, micro_batch=2, "
        "seed=1, num_workers=2))\n"
        "next(it)  # step 0 is worker 0's\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3])  # fmt: skip
    stuck = threading.Timer(120, proc.kill)  # a trainer that never gets ready ends the readline
    stuck.start()
    workers: list[int] = []
    try:
        ready = proc.stdout.readline().strip()
        workers = child_pids(proc.pid)
    finally:
        stuck.cancel()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()  # reaped: its workers are the reaper's now
        gate.touch()  # worker 1 starts, its trainer gone

    def alive(pid: int) -> bool:  # a zombie is dead: its reaper (pid 1 here) may take its time
        try:
            return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    try:
        assert ready == "ready"
        assert len(workers) == 2, workers
        deadline = time.time() + 4.0  # 2 s was missed on a loaded 2-core box
        while (left := [w for w in workers if alive(w)]) and time.time() < deadline:
            time.sleep(0.05)
        assert not left, "DataLoader workers outlived their killed trainer"
    finally:
        for w in workers:  # a leftover of this test (it failed): no later test shares the machine with it
            if alive(w):
                os.kill(w, signal.SIGKILL)


def test_a_sigterm_as_the_workers_start_is_ignored_by_them(corpus, monkeypatch, tmp_path):
    """A preemption's SIGTERM reaches every process of the job, DataLoader workers just forked too:
    before their _worker_start set SIGTERM aside, torch's handler let them die by it (1 in 5 kills
    as the workers started; the trainer then lost its save). Forked with SIGTERM blocked, a worker
    drops one sent before that point and serves its steps. The window is held open here."""
    import os
    import signal
    import threading
    import time

    from training.data import loader as loader_module
    from training.launch import child_pids

    started = loader_module._worker_start

    def late_start(trainer: int, worker_id: int) -> None:
        time.sleep(2.0)  # a loaded machine's pause between a worker's fork and its first act
        (tmp_path / f"started-{os.getpid()}").touch()
        started(trainer, worker_id)

    monkeypatch.setattr(loader_module, "_worker_start", late_start)
    before = set(child_pids(os.getpid()))
    signalled: list[int] = []

    def signal_the_workers() -> None:  # as soon as both are forked: inside the window
        deadline = time.time() + 60
        while len(new := set(child_pids(os.getpid())) - before) < 2 and time.time() < deadline:
            time.sleep(0.005)
        for pid in new:
            # inside the window, or this test would pass without opening it (a sender late under load)
            assert not (tmp_path / f"started-{pid}").exists(), "signalled after the worker's start"
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)

    root, _ = corpus
    sender = threading.Thread(target=signal_the_workers)
    sender.start()
    got = take(make_loader(root, num_workers=2), 4)
    sender.join()
    assert len(signalled) == 2, signalled
    assert_same_stream(got, take(make_loader(root), 4))


def test_stale_iterator_refuses(corpus):
    root, _ = corpus
    loader = make_loader(root)
    old = iter(loader)
    next(old)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match="stale"):
        next(old)


# --- elasticity ------------------------------------------------------------------------------------


def test_worker_count_does_not_change_the_stream(corpus):
    root, _ = corpus
    n = make_loader(root).steps_per_epoch + 3  # across an epoch end
    streams = {w: take(make_loader(root, num_workers=w), n) for w in (0, 1, 3)}
    assert_same_stream(streams[1], streams[0])
    assert_same_stream(streams[3], streams[0])


def global_batches(root, world_size: int, micro_batch: int, steps: int, state=None, **kw) -> list:
    """Run `world_size` simulated ranks and concatenate their slices per step, rank order."""
    per_rank = []
    for r in range(world_size):
        loader = make_loader(root, rank=r, world_size=world_size, micro_batch=micro_batch, **kw)
        if state is not None:
            loader.load_state_dict(state)
        batches = take(loader, steps)
        for b in batches:
            assert len(b) == G // (world_size * micro_batch)
            assert all(
                mb[k].shape == (micro_batch, SEQ) and mb[k].dtype == torch.long for mb in b for k in KEYS
            )
        per_rank.append(batches)
    return [sum((per_rank[r][s] for r in range(world_size)), []) for s in range(steps)]


def test_rank_slices_concatenate_to_the_global_batch(corpus, plan_shape):
    root, _ = corpus
    steps = make_loader(root).steps_per_epoch + 2
    reference = global_batches(root, 1, 2, steps)
    for world_size, micro_batch in ((2, 2), (4, 1), (8, 1)):
        assert_same_stream(global_batches(root, world_size, micro_batch, steps), reference)


def test_resume_at_another_world_size(corpus):
    root, _ = corpus
    reference = global_batches(root, 1, 4, 11)
    saver = make_loader(root, rank=1, world_size=2)
    take(saver, 5)
    state = saver.state_dict()
    resumed = global_batches(root, 4, 1, 6, state=state, num_workers=1)
    assert_same_stream(resumed, reference[5:])


# --- coverage and content -------------------------------------------------------------------------


def test_epoch_uses_every_token_once_except_the_reported_tail(corpus, plan_shape):
    root, lengths = corpus
    loader = make_loader(root)
    spe = loader.steps_per_epoch
    stream = epoch_stream(take(loader, spe))
    total = sum(lengths.values())
    assert len(stream) == spe * G * (SEQ + 1) == total - loader.dropped_tail_tokens
    assert 0 <= loader.dropped_tail_tokens < G * (SEQ + 1)
    # Walk the stream: whole documents in some order, each at most once; only the last may be cut.
    seen, i = set(), 0
    while i < len(stream):
        doc, pos = decode(stream[i : i + 1])
        doc, pos = int(doc[0]), int(pos[0])
        assert pos == 0 and doc not in seen, (
            f"token {i}: expected a new document start, got doc {doc} pos {pos}"
        )
        seen.add(doc)
        piece = stream[i : i + lengths[doc]]
        assert np.array_equal(piece, doc_tokens(doc, lengths[doc])[: len(piece)]), f"document {doc} garbled"
        assert len(piece) == lengths[doc] or i + len(piece) == len(stream), "only the tail may be cut"
        i += lengths[doc]
    # What is missing is exactly the reported tail: the cut document's rest plus unseen documents.
    missing = (i - len(stream)) + sum(n for d, n in lengths.items() if d not in seen)
    assert missing == loader.dropped_tail_tokens
    body = stream[stream != SEP]
    assert len(np.unique(body)) == len(body)


def test_labels_and_position_ids(corpus):
    root, _ = corpus
    for batch in take(make_loader(root), 5):
        r = rows(batch)
        inp, lab, pos = r["input_ids"], r["labels"], r["position_ids"]
        assert np.array_equal(lab[:, :-1], inp[:, 1:])  # labels: inputs shifted by one, never masked
        _, tok_pos = decode(inp)
        doc_start = (tok_pos == 0) & (inp != SEP)
        # 0 at the row start and at every document start; +1 everywhere else.
        expected = np.zeros_like(pos)
        for c in range(1, SEQ):
            expected[:, c] = np.where(doc_start[:, c], 0, expected[:, c - 1] + 1)
        assert np.array_equal(pos, expected)


def test_before_position_separator_dataset(tmp_path):
    lengths = make_dataset(tmp_path, n_docs=120, position="before")
    loader = make_loader(tmp_path)
    stream = epoch_stream(take(loader, loader.steps_per_epoch))  # check_separators is on
    batch = rows(take(make_loader(tmp_path), 1)[0])
    # With BOS-style framing, a document starts at its separator: position ids restart there.
    inp, pos = batch["input_ids"], batch["position_ids"]
    assert np.all(pos[(inp == SEP)] == 0)
    assert len(stream) == sum(lengths.values()) - loader.dropped_tail_tokens


def test_seeds_and_epochs_give_different_orders(corpus):
    root, lengths = corpus
    a = make_loader(root, seed=1)
    spe = a.steps_per_epoch
    run_a = take(a, 2 * spe)
    epoch0, epoch1 = doc_order(epoch_stream(run_a[:spe])), doc_order(epoch_stream(run_a[spe:]))
    other_seed = doc_order(epoch_stream(take(make_loader(root, seed=2), spe)))
    assert epoch0 != epoch1 and epoch0 != other_seed
    # Still shuffles of the same documents (all but the tail's few).
    assert len(set(epoch0) & set(epoch1)) > 0.9 * len(lengths)
    # Documents are shuffled, not just blocks of them: manifest neighbours rarely stay neighbours.
    neighbours = sum(d2 == d1 + 1 for d1, d2 in zip(epoch0, epoch0[1:]))
    assert neighbours < 0.05 * len(epoch0)


def test_val_split_is_disjoint_and_seed_independent(corpus):
    root, lengths = corpus
    train = make_loader(root, val_fraction=0.2)
    val = make_loader(root, split="val", val_fraction=0.2, global_batch=2, micro_batch=1)
    val_other_seed = make_loader(root, split="val", val_fraction=0.2, global_batch=2, micro_batch=1, seed=7)
    train_docs = set(doc_order(epoch_stream(take(train, train.steps_per_epoch))))
    val_docs = set(doc_order(epoch_stream(take(val, val.steps_per_epoch))))
    val_docs_7 = set(doc_order(epoch_stream(take(val_other_seed, val.steps_per_epoch))))
    assert not train_docs & val_docs
    assert 0.1 * len(lengths) < len(val_docs) < 0.3 * len(lengths)
    assert len(val_docs ^ val_docs_7) <= 4  # same held-out set; only the dropped tails differ
    assert len(train_docs | val_docs) >= len(lengths) - 6


# --- refusals --------------------------------------------------------------------------------------


def copy_task(src: Path, dst: Path, task: int) -> None:
    for path in (src / "shards").glob(f"{task:05d}_*.tar"):
        shutil.copyfile(path, dst / "shards" / path.name)
    shutil.copyfile(src / "manifest" / f"{task:05d}.parquet", dst / "manifest" / f"{task:05d}.parquet")


def test_a_docs_member_not_as_the_index_says_is_refused(tmp_path):
    # A /3 sample's .docs header spot-checked too: one record short (the same padding, so the same
    # size and offsets) is refused at open.
    make_dataset(tmp_path / "a", seed=0)
    shard = sorted((tmp_path / "a" / "shards").glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    header = tarfile.TarInfo.frombuf(bytes(data[:512]), "utf-8", "surrogateescape")
    assert header.name.endswith(".docs")
    header.size -= 36
    data[:512] = header.tobuf(tarfile.USTAR_FORMAT)
    shard.write_bytes(bytes(data))
    with pytest.raises(
        DatasetError, match=rf"{shard}: no {header.size + 36}-byte .docs member at byte 512"
    ) as e:
        make_loader(tmp_path / "a")
    # its index hashed as recorded at open: the shard's fault, not "`data index` repairs that", which
    # repaired nothing (trial RV70g 6)
    assert str(e.value).endswith(
        "bytes): the shard was replaced or rebuilt after the build (the index hashes as dataset.json "
        f"records): `gristmill data validate {tmp_path / 'a'}` names it"
    ), e.value


def test_rebuilt_shard_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_dataset(a, seed=0)
    make_dataset(b, seed=5, shard_bytes=40_000, n_docs=400)  # other documents, bigger shards
    loader = make_loader(a)
    take(loader, 3)
    state = loader.state_dict()
    shard = "00001_00000.tar"
    rebuilt = (b / "shards" / shard).read_bytes()
    size = (a / "shards" / shard).stat().st_size
    assert len(rebuilt) > size

    # A shard swapped under an unchanged dataset.json is refused at open: by the size check when
    # its size changed, by the member spot-check when it did not (tars pad to 10 KiB records, so a
    # rebuilt shard can keep its size; here cut to the old size).
    for name, data, message in (
        ("other-size", rebuilt, rf"{shard} is {len(rebuilt)} bytes but .* records {size}"),
        ("same-size", rebuilt[:size], r"no \d+-byte .ids member"),
    ):
        swapped = tmp_path / name
        shutil.copytree(a, swapped)
        (swapped / "shards" / shard).write_bytes(data)
        with pytest.raises(DatasetError, match=message):
            make_loader(swapped)

    # Task 1 properly rebuilt and dataset.json rewritten: opens, but the checkpoint is refused.
    copy_task(b, a, 1)
    old_fp = json.loads(state["data_plan"])["sources"][0]["fingerprint"]
    new_fp = finalize_dataset(
        a,
        vocab_size=1 << 20,
        separator={"token": "<|endoftext|>", "id": SEP, "position": "after"},
        config_sha256="test",
    )["fingerprint"]
    assert new_fp != old_fp
    reopened = make_loader(a)
    with pytest.raises(LoaderStateError, match="fingerprint") as e:
        reopened.load_state_dict(state)
    assert old_fp in str(e.value) and new_fp in str(e.value)


@pytest.mark.parametrize("change", ["deleted", "truncated", "dataset removed"])
def test_a_shard_gone_after_the_opening_is_one_line_naming_it(tmp_path, change):
    """Shards are mapped on first use: one deleted, cut or removed with its dataset under a running
    training (the dataset rebuilt in place) was a FileNotFoundError traceback (review R26b M1), which
    the trainer could not tell from a bug, so it saved nothing. A DatasetError now names the shard and
    what happened, the trainer's data path (save the last step, one line)."""
    make_dataset(tmp_path / "a")
    loader = make_loader(tmp_path / "a")
    shards = tmp_path / "a" / "shards"
    if change == "deleted":
        for shard in shards.iterdir():
            shard.unlink()
    elif change == "truncated":
        for shard in shards.iterdir():
            shard.write_bytes(shard.read_bytes()[:1024])
    else:
        shutil.rmtree(tmp_path / "a")
    with pytest.raises(DatasetError) as e:
        take(loader, 1)
    said = str(e.value)
    assert re.match(rf"{tmp_path / 'a' / 'shards'}/\d{{5}}_\d{{5}}\.tar cannot be read \(", said), said
    assert f"the dataset {tmp_path / 'a'} changed or vanished after it was opened" in said, said
    why = "No such file or directory" if change != "truncated" else "1024 bytes where dataset.json records"
    assert why in said and "\n" not in said, said


def test_edited_dataset_json_is_refused(tmp_path):
    make_dataset(tmp_path, n_docs=40)
    info = read_dataset_info(tmp_path)
    info["separator"]["id"] = 5
    (tmp_path / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match="fingerprint"):
        make_loader(tmp_path, global_batch=2)


@pytest.mark.parametrize(
    "key, new", [("seq_len", 14), ("seed", 2), ("global_batch", 8), ("val_fraction", 0.1), ("split", "val")]
)
def test_changed_parameter_under_resume_is_refused(corpus, key, new):
    root, _ = corpus
    old = make_loader(root, global_batch=4, micro_batch=1, val_fraction=0.1)
    take(old, 2)
    state = old.state_dict()
    args = dict(global_batch=4, micro_batch=1, val_fraction=0.1)
    args[key] = new if key != "val_fraction" else 0.2
    changed = make_loader(root, **args)
    with pytest.raises(LoaderStateError) as e:
        changed.load_state_dict(state)
    # Named as the plan names them, with both values.
    want = {
        "seq_len": r"phase\[0\]\.seq_len = \d+ but this run has 14",
        "seed": r"data\.seed = \d+ but this run has 2",
        "global_batch": r"phase\[0\]\.global_batch = 4 but this run has 8",
        "val_fraction": r"the val_fraction of source 'data' \(its \[\[data.sources\]\] val_fraction, else "
        r"data.val_fraction\) = 0\.1 but this run has 0\.2",
        "split": r"the training tokens of source 'data' = \d+ but this run has \d+",
    }[key]
    assert re.search(want, str(e.value)), str(e.value)


def task0_manifest(root: Path) -> list[dict]:
    return pq.read_table(root / "manifest" / "00000.parquet").to_pylist()


def overwrite_token(root: Path, row: dict, index: int, value: int) -> None:
    """Token `index` of the document at manifest `row` becomes `value`, in place. Same size, so
    dataset.json's cheap checks pass; only the on-the-fly check can see it."""
    dtype = numpy_dtype(read_dataset_info(root)["dtype"])
    with open(root / "shards" / row["shard"], "r+b") as f:
        f.seek(row["offset"] + dtype.itemsize * index)
        f.write(np.array([value], dtype).tobytes())


def corrupt(root: Path, corruption: str) -> dict:
    """One corrupted token in a document of task 0; returns its manifest row."""
    row = next(r for r in task0_manifest(root)[5:] if r["n_tokens"] >= 5)
    index = row["n_tokens"] - 1 if corruption == "separator-missing" else 2
    value = {"separator-inside": SEP, "separator-missing": 12345, "id-out-of-vocab": 1 << 20}[corruption]
    overwrite_token(root, row, index, value)
    return row


@pytest.mark.parametrize("corruption", ["separator-inside", "separator-missing", "id-out-of-vocab"])
def test_separator_check_catches_a_corrupted_window(tmp_path, corruption):
    make_dataset(tmp_path, n_docs=60)
    row = corrupt(tmp_path, corruption)
    unchecked = make_loader(tmp_path, global_batch=2, micro_batch=1, check_separators=False)
    take(unchecked, unchecked.steps_per_epoch)  # reads everything without noticing
    checked = make_loader(tmp_path, global_batch=2, micro_batch=1)
    check = "id check" if corruption == "id-out-of-vocab" else "separator check"
    with pytest.raises(DatasetError, match=f"{check} failed.*{row['shard']}"):
        take(checked, checked.steps_per_epoch)


def test_worker_error_is_the_in_process_error(tmp_path):
    # A corrupt shard found in a DataLoader worker: the same one-line error as in-process, not
    # torch's "Caught DatasetError in DataLoader worker process 0. Original Traceback …".
    make_dataset(tmp_path, n_docs=60)
    row = corrupt(tmp_path, "separator-inside")  # a planted double separator
    errors = {}
    for workers in (0, 2):
        loader = make_loader(tmp_path, global_batch=2, micro_batch=1, num_workers=workers)
        with pytest.raises(DatasetError) as e:
            take(loader, loader.steps_per_epoch)
        errors[workers] = e.value
    assert type(errors[2]) is type(errors[0]) is DatasetError
    assert str(errors[2]) == str(errors[0])
    message = str(errors[2])
    assert message.startswith("separator check failed") and f"shards/{row['shard']}" in message, message
    assert "Traceback" not in message and "\n" not in message, message


def test_training_with_workers_on_a_corrupt_shard_prints_one_error_line(tmp_path):
    dataset = make_train_dataset(tmp_path / "ds")
    for row in task0_manifest(dataset):  # a double separator in every document: step 0 hits one
        overwrite_token(dataset, row, 2, SEPARATOR_ID)
    overrides = recipe(dataset, tmp_path / "run", "data.num_workers=2", "data.check_separators=true")
    proc = forked.run(
        [sys.executable, "-m", "training.train", "--config", TINY, "--set", *overrides], timeout=120
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: separator check failed at step 1 rank 0: "), lines[0]  # 1-based
    shard = re.search(r"\(shards/(\d{5}_\d{5}\.tar), ", lines[0])
    assert shard and (dataset / "shards" / shard[1]).is_file(), lines[0]


def test_a_killed_loader_worker_is_one_line_with_the_signals_status(tmp_path):
    """A data.num_workers process SIGKILLed (the out-of-memory killer): torch's error from its SIGCHLD
    handler ended the run in a traceback, exit 1 (review R14e F1). One line, 128 + the signal."""
    import os
    import signal

    from tests.helpers.train_runs import one_error_line, wait_for_step
    from training.launch import child_pids

    dataset = make_train_dataset(tmp_path / "ds")
    run = tmp_path / "run"
    overrides = recipe(dataset, run, "data.num_workers=2", "schedule.steps=400")
    proc = forked.popen([sys.executable, "-m", "training.train", "--config", TINY, "--set", *overrides])
    try:
        wait_for_step(proc, run, 2)
        os.kill(child_pids(proc.pid)[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    line = one_error_line(err)
    assert line.startswith("error: DataLoader worker (pid"), line
    assert line.endswith("--resume auto continues from it, with fewer data.num_workers or less memory"), line
    # the signal named and the shell's status whoever sees the death first: torch's SIGCHLD handler,
    # or the loader at a result the dead worker had sent (review RV27a F2: exit 1 by that race)
    assert "is killed by signal: Killed" in line, line
    assert proc.returncode == 128 + signal.SIGKILL, err


def test_a_loader_with_workers_keeps_torchs_sigchld_handler_out_and_the_processs_own_in(corpus):
    """torch's SIGCHLD handler raised a dead worker's error in the main thread wherever it was (mid
    step: nothing could be saved); the loader keeps it out, so a death is found at a fetch. A handler
    the process had stays installed and called (torch's only chained it), also when a DataLoader of
    the caller's installed torch's first."""
    import signal
    import subprocess
    import time

    from torch.utils.data import DataLoader
    from torch.utils.data._utils import signal_handling

    root, _ = corpus
    seen: list[int] = []

    def own(signum, frame):
        seen.append(signum)

    before, was = signal.signal(signal.SIGCHLD, own), signal_handling._SIGCHLD_handler_set
    try:
        signal_handling._SIGCHLD_handler_set = False  # as in a process that iterated no loader yet
        assert list(DataLoader(range(2), num_workers=1)) == [torch.tensor(0), torch.tensor(1)]
        assert getattr(signal.getsignal(signal.SIGCHLD), "__module__", None) == signal_handling.__name__
        take(make_loader(root, num_workers=1), 2)
        assert signal.getsignal(signal.SIGCHLD) is own
        subprocess.run(["true"], check=True)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen, "the process's own SIGCHLD handler was not called"
    finally:
        signal.signal(signal.SIGCHLD, before)
        signal_handling._SIGCHLD_handler_set = was


def test_bad_arguments_name_the_numbers(corpus):
    root, _ = corpus
    with pytest.raises(LoaderConfigError, match="global_batch 10 .* world_size 4 × micro_batch 1 = 4"):
        make_loader(root, global_batch=10, world_size=4, micro_batch=1)
    with pytest.raises(DatasetError, match=r"vocab_size 1048576, but the model expects vocab_size 32768"):
        make_loader(root, expect_vocab_size=32768)
    with pytest.raises(DatasetError, match="tokenizer sha256 none, but .* sha256 abc"):
        make_loader(root, expect_tokenizer_sha256="abc")
    with pytest.raises(LoaderConfigError, match="fewer than one global batch.*lower global_batch"):
        make_loader(root, global_batch=4096, micro_batch=1)
    # a training split emptied by what is held out names val_fraction too (review R2)
    with pytest.raises(LoaderConfigError, match=r"split 'train' .* or hold out less \(val_fraction 0.999\)$"):
        make_loader(root, val_fraction=0.999)
    with pytest.raises(LoaderConfigError, match="split 'val' .* raise val_fraction \\(now 0.001\\)"):
        make_loader(root, split="val", val_fraction=0.001)
    make_loader(root, expect_vocab_size=1 << 20, expect_tokenizer_sha256="none")


def test_iteration_leaves_the_global_rng_alone(corpus):
    root, _ = corpus
    before = torch.get_rng_state()
    take(make_loader(root, num_workers=1), 2)
    assert torch.equal(torch.get_rng_state(), before)


# --- gristmill data inspect ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    vocab = {"<|endoftext|>": SEP, **{f"w{i}": i for i in range(1, 512)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(root / "tok.json"))
    make_dataset(root / "ds", n_docs=100, vocab=512, tokenizer=root / "tok.json")
    return root / "ds"


def inspect(capsys, *args) -> tuple[int, str]:
    rc = cli(["data", "inspect", *map(str, args)])
    return rc, capsys.readouterr().out


def test_inspect_prints_the_batch(text_dataset, capsys):
    common = (text_dataset, "--seq-len", SEQ, "--global-batch", G, "--seed", 1)
    rc, out = inspect(capsys, *common, "--step", 4, "--max-rows", 0)  # steps count from 1
    assert rc == 0
    loader = make_loader(text_dataset)
    loader.seek(3)
    step3 = take(loader, 1)[0]
    assert f"sha256 {batch_sha256(step3)}" in out
    batch = rows(step3)
    first_ids = " ".join(map(str, batch["input_ids"][0, :16].tolist()))
    assert f"row 0: ids {first_ids}" in out
    assert "(id doc-" in out and " w" in out  # source ids and decoded text
    assert out.count("\nrow ") == G
    rc, out = inspect(capsys, *common, "--step", 4, "--rank", 1, "--world-size", 2)
    assert "rows 4..7" in out and "row 4: ids" in out
    half = make_loader(text_dataset, rank=1, world_size=2)  # its header's digest is the rank's rows' (R24e 3)
    half.seek(3)
    assert f"; sha256 {batch_sha256(take(half, 1)[0])} rank 1/2's rows\n" in out, out
    # --end is --hash's: without it, step 4 alone was shown, without a word (trial RV68c F4)
    assert cli(["data", "inspect", *map(str, common), "--step", "4", "--end", "6"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --end 6 is --hash's (hash steps --step to --end); add --hash, or " \
        "drop --end to see the documents of step --step\n", err  # fmt: skip
    # in the flags' words, not the loader's arguments' ("loader rank 2 is outside [0, world_size=2)")
    for more, said in (
        (["--rank", "2", "--world-size", "2"], "--rank 2: give a rank from 0 to 1 (--world-size 2)"),
        (["--rank", "-1"], "--rank -1: give a rank from 0 to 0 (--world-size 1)"),
        (["--val-fraction", "nan"], "--val-fraction nan: give the run's data.val_fraction, in [0, 1)"),
        (["--split", "val"], "--split val holds no document with --val-fraction 0: give the run's data.val"),
        (["--seq-len", "0"], "--seq-len 0: give the run's value, ≥ 1"),
    ):
        assert cli(["data", "inspect", *map(str, common), *more]) == 2, more
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {said}") and err.count("\n") == 1, err


def test_inspect_without_the_tokenizers_package_prints_ids(text_dataset, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` raises ImportError
    rc, out = inspect(capsys, text_dataset, "--seq-len", SEQ, "--global-batch", G, "--seed", 1)
    assert rc == 0 and "tokenizers package is not installed" in out
    assert "row 0: ids " in out and "(id doc-" in out


def test_inspect_hashes_match_the_loader_and_repeat(text_dataset, capsys):
    common = (text_dataset, "--seq-len", SEQ, "--global-batch", G, "--seed", 1)
    loader = make_loader(text_dataset, num_workers=1)
    spe = loader.steps_per_epoch
    want = [f"{s} {batch_sha256(b)}" for s, b in enumerate(take(loader, spe + 2), start=1)][spe - 3 :]
    rc, out = inspect(capsys, *common, "--hash", "--step", spe - 2, "--end", spe + 3)  # across the epoch
    assert rc == 0
    assert [line for line in out.splitlines() if not line.startswith("#")] == want
    assert inspect(capsys, *common, "--hash", "--step", spe - 2, "--end", spe + 3)[1] == out
    # a rank's rows have a digest of their own, not the whole batch's a run records: said (R24a 2)
    rc, out = inspect(capsys, *common, "--hash", "--step", 2, "--rank", 1, "--world-size", 2)
    half = make_loader(text_dataset, rank=1, world_size=2)
    half.seek(1)
    assert [line for line in out.splitlines() if not line.startswith("#")] == [
        f"2 {batch_sha256(take(half, 1)[0])} rank 1/2's rows"
    ]
    rc, _ = inspect(capsys, *common, "--world-size", 3)
    assert rc == 2
    # a seed past 64 bits: seed 0's batches, as the run's data.seed was (trial RV65b 5)
    argv = ["data", "inspect", str(text_dataset), "--seq-len", str(SEQ), "--global-batch", str(G)]
    # a step past the epochs a run reads ran for hours, saying nothing (trial RV74c 3)
    for far, given in (
        (["--step", str(10**11)], f"--step {10**11}"),
        (["--hash", "--end", str(10**11)], f"--end {10**11}"),
    ):
        assert cli([*argv, "--seed", "1", *far]) == 2
        said = capsys.readouterr().err.strip()
        assert said == (
            f"error: {given} lies past the 100,000 epochs a run reads of a dataset at most ({spe:,} steps an "
            f"epoch at --seq-len {SEQ} --global-batch {G}); give steps up to {100_000 * spe:,}"
        ), said
    for seed, like in ((2**64, 0), (-1, 2**64 - 1)):  # and a negative one, another's (trial RV74c 2)
        assert cli([*argv, "--seed", str(seed)]) == 2
        said = capsys.readouterr().err.strip()
        assert said == (
            f"error: --seed = {seed} is not allowed: it must be between 0 and {2**64 - 1} (the data order "
            f"keeps a seed's low 64 bits: it would draw as seed {like} does)"
        ), said


def test_inspect_refuses_a_manifest_changed_after_the_build(text_dataset, tmp_path, capsys):
    """The batch is read from the index and decoded by the tokenizer, both checked; its lines name
    documents from the manifest. A manifest edited after the build (two rows' ids swapped) named other
    documents than the batch's, exit 0 (review RV51b F2): now one line naming the file. The hashes,
    of the index alone, are as before."""
    common = ("--seq-len", SEQ, "--global-batch", G, "--seed", 1, "--step", 2, "--max-rows", 0)
    ds = shutil.copytree(text_dataset, tmp_path / "ds")
    for part in sorted((ds / "manifest").glob("*.parquet")):
        t = pq.read_table(part)
        ids = t.column("id").to_pylist()
        ids[0], ids[1] = ids[1], ids[0]
        pq.write_table(t.set_column(t.schema.get_field_index("id"), "id", [ids]), part)
    assert cli(["data", "inspect", str(ds), *map(str, common)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ds}/manifest/00000.parquet: not the file {ds}/dataset.json records"), err
    assert err.count("\n") == 1, err
    hashes = [inspect(capsys, d, *common[:6], "--hash") for d in (ds, text_dataset)]
    assert [(rc, [x for x in out.splitlines() if not x.startswith("#")]) for rc, out in hashes] == [
        (0, [x for x in hashes[1][1].splitlines() if not x.startswith("#")])
    ] * 2


def test_inspect_refuses_a_shard_changed_after_the_build(text_dataset, tmp_path, capsys):
    """A document's ids changed in place within the vocabulary (no id or separator check sees it):
    inspect printed and hashed the changed bytes as the data, exit 0 (trial RV62a F1). The documents it
    reads are held to the index's sha256 of each: one line naming the shard and the row."""
    from training.contract.dataset_index import DocIndex

    ds = shutil.copytree(text_dataset, tmp_path / "ds")
    info = read_dataset_info(ds)
    _, docs, starts, counts, _ = make_loader(ds).builder.read(0)  # step 1's pieces
    doc = int(docs[0])
    index = DocIndex(ds, info)
    shard = sorted(info["shard_files"])[int(index.shard_of(np.array([doc]))[0])]
    itemsize = np.dtype(info["dtype"]).itemsize
    at = int(index.offsets_of(np.array([doc]))[0]) + itemsize  # its second token: not a separator
    with open(ds / "shards" / shard, "r+b") as f:
        f.seek(at)
        token = int.from_bytes(f.read(itemsize), "little")
        f.seek(at)
        f.write((token % 500 + 1 if token % 500 + 1 != token else 2).to_bytes(itemsize, "little"))
    common = (ds, "--seq-len", SEQ, "--global-batch", G, "--seed", 1, "--step", 1)
    for more in ([], ["--hash"]):
        assert cli(["data", "inspect", *map(str, common), *more]) == 2, more
        err = capsys.readouterr().err
        assert err.startswith(
            f"error: {ds / 'shards' / shard}: manifest row {doc}'s ids (at byte {at - itemsize}) are not the "
            "document the build hashed (index/doc_sha256.bin records another sha256)"
        ), err
        assert err.count("\n") == 1, err
        # the index file may be the one at fault: validate tells which (trial RV62f 1, review RV62e 6)
        assert (
            f"the shard or that index file changed after the build; `gristmill data validate {ds}` says"
            in err
        )
    assert inspect(capsys, text_dataset, *common[1:])[0] == 0  # the intact copy: as before


def test_real_build_output(built_dataset, capsys):
    """The dataset `gristmill data build` writes: a full epoch passes the separator check, and
    inspect decodes real text with the dataset's own tokenizer."""
    info = read_dataset_info(built_dataset)
    loader = dataset_loader(
        built_dataset,
        seq_len=63,
        global_batch=4,
        micro_batch=2,
        seed=0,
        check_separators=True,
        expect_vocab_size=info["vocab_size"],
        expect_tokenizer_sha256=info["tokenizer_sha256"],
    )
    stream = epoch_stream(take(loader, loader.steps_per_epoch))
    assert len(stream) == info["tokens"] - loader.dropped_tail_tokens
    assert (stream == info["separator"]["id"]).sum() >= info["documents"] - 10
    args = ("--seq-len", 63, "--global-batch", 32, "--seed", 0, "--step", 1, "--max-rows", 0)
    rc, out = inspect(capsys, built_dataset, *args)  # 32 × 64 tokens: several documents
    assert rc == 0 and "(id <urn:uuid:fixture-" in out and "<|endoftext|>" in out


def test_inspect_prints_the_separator_apart_from_text_that_spells_it(tmp_path, capsys):
    """A web page holding the text `<|endoftext|>` is encoded as plain tokens (the separator contract),
    but inspect decoded both to the same string inside one quoted excerpt: the doubled separator a
    user audits for read the same as a sound document (review R12b F8). The separator now prints
    outside the quotes."""
    from pipelines.synthetic_dataset import write_synthetic_dataset
    from tokenization.tokenizer_io import train_bpe

    tok = train_bpe(["rivers run to the sea"] * 20, vocab_size=300, special_tokens=["<|endoftext|>"])
    tok.encode_special_tokens = True  # as the build encodes: the literal stays text
    texts = [f"Rivers <|endoftext|> run {i}." for i in range(30)]
    docs = [np.array([*tok.encode(t).ids, SEPARATOR_ID]) for t in texts]
    assert all((d == SEPARATOR_ID).sum() == 1 for d in docs)
    (tmp_path / "ds").mkdir()
    tok.save(str(tmp_path / "ds" / "tokenizer.json"))
    write_synthetic_dataset(tmp_path / "ds", docs, vocab_size=tok.get_vocab_size())
    rc, out = inspect(capsys, tmp_path / "ds", "--seq-len", 15, "--global-batch", 8, "--seed", 1,
                      "--max-rows", 0)  # fmt: skip
    pieces = [line for line in out.splitlines() if ") tokens [" in line]
    ends = [p for p in pieces if re.search(r"tokens \[\d+, (\d+)\) of \1:", p)]
    assert rc == 0 and len(ends) >= 4, out
    assert all(p.endswith(".' + [separator <|endoftext|>]") for p in ends), ends
    assert not any("[separator" in p for p in pieces if p not in ends)
    assert any("<|endoftext|> run" in p for p in pieces), pieces  # the text's own, inside the quotes


def test_inspect_trims_the_parts_of_characters_a_window_cuts(tmp_path, capsys):
    """Issue 37 item 17: a window edge inside a multi-byte character (a byte-level BPE splits é, €
    and 😀 into byte tokens) printed U+FFFD; the excerpt now drops the partial character at a cut
    and keeps what is in the document, a U+FFFD of its own included."""
    from pipelines.synthetic_dataset import write_synthetic_dataset
    from tokenization.tokenizer_io import train_bpe
    from training.data.inspect import piece_text
    from training.data.reader import DocumentTable

    texts = [f"Le café {i} coûte 3 € 😀 — naïve señor {i * 7}, déjà vu. " * 3 for i in range(40)]
    texts[5] = "A replacement character \ufffd is text too: \ufffd\ufffd. " * 3
    tok = train_bpe(["plain ascii words only"] * 20, vocab_size=300, special_tokens=["<|endoftext|>"])
    docs = [np.array([*tok.encode(t).ids, SEPARATOR_ID]) for t in texts]
    (tmp_path / "ds").mkdir()
    tok.save(str(tmp_path / "ds" / "tokenizer.json"))  # before the writer: dataset.json records it
    write_synthetic_dataset(tmp_path / "ds", docs, vocab_size=tok.get_vocab_size())
    table = DocumentTable(tmp_path / "ds")
    doc = int(np.flatnonzero(table.lengths == len(docs[5]))[0])
    for row in (doc, (doc + 1) % len(docs)):
        text = tok.decode(table.document(row).tolist(), skip_special_tokens=False)
        n = int(table.lengths[row])
        for first in range(0, n - 1, 3):
            piece = piece_text(tok, table, row, first, min(7, n - first))
            assert piece in text, (row, first, piece)
            assert "\ufffd" not in piece or row == doc, (row, first, piece)
    assert "\ufffd" in piece_text(tok, table, doc, 0, 40)  # the document's own U+FFFD stays
    for step in (1, 2, 3):
        rc, out = inspect(capsys, tmp_path / "ds", "--seq-len", 15, "--global-batch", 8, "--seed", 1,
                          "--step", step, "--max-rows", 0)  # fmt: skip
        pieces = [line for line in out.splitlines() if ") tokens [" in line and "(id doc-5)" not in line]
        assert rc == 0 and len(pieces) >= 8 and any("€" in p or "é" in p for p in pieces), out
        assert not [p for p in pieces if "\ufffd" in p], out
