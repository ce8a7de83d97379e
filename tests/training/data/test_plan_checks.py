"""The data plan's checks before step 1, the same for `gristmill train --plan` and `gristmill train`:
one dataset under two source names, --set data.dataset beside [[data.sources]], a phase longer than
the model, mixes that do not sum to 1; and the run header naming every source's dataset."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main as gristmill
from pipelines.convert import convert_dataset
from pipelines.synthetic_dataset import write_synthetic_dataset
from tests.helpers.legacy_dataset import write_v2_dataset
from tests.helpers.phased_recipe import write_recipe
from tests.helpers.train_data import affine_documents, make_dataset
from tests.helpers.train_runs import TINY
from training.contract import dataset_index
from training.contract.dataset_format import DOCUMENTS_SUM, read_dataset_info, write_dataset_info
from training.data.reader import DocumentTable


@pytest.fixture
def sources(sources: dict[str, Path]) -> dict[str, Path]:
    """Two of the data tests' sources (tests/training/data/conftest.py): web and code."""
    return {name: sources[name] for name in ("web", "code")}


def both(config: Path, sets: list[str], capsys) -> list[str]:
    """stderr of `train --plan` and of `train`, each of which must refuse (exit 2) before step 1."""
    errs = []
    for extra in (["--plan"], []):
        assert gristmill(["train", "--config", str(config), *extra, "--set", *sets]) == 2
        errs.append(capsys.readouterr().err)
    assert not (Path(sets[0].split("=", 1)[1].strip('"')) / "metrics.jsonl").exists()
    return errs


@pytest.mark.parametrize("how", ["same directory", "symlink", "copy"])
def test_one_dataset_under_two_source_names_is_refused(sources, tmp_path, capsys, how):
    twin = sources["web"]
    if how == "symlink":
        twin = tmp_path / "link"
        twin.symlink_to(sources["web"], target_is_directory=True)
    elif how == "copy":  # a byte copy has the same fingerprint: the same windows twice
        twin = tmp_path / "copy"
        twin.mkdir()
        for f in sources["web"].rglob("*"):
            if f.is_file():
                (twin / f.relative_to(sources["web"])).parent.mkdir(parents=True, exist_ok=True)
                (twin / f.relative_to(sources["web"])).write_bytes(f.read_bytes())
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {"web": sources["web"], "code": twin}, run)
    for err in both(config, [f'run.output_dir="{run}"'], capsys):
        assert "sources 'web' and 'code' are the same dataset" in err, err
        assert str(sources["web"]) in err and str(twin) in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_dataset_and_its_converted_copy_are_one_dataset(tmp_path, capsys):
    """`data convert` writes the same documents under a new fingerprint that records the old one: as two
    sources, every window trained twice (and with val_fraction 0 on the copy, the original's held-out
    documents trained)."""
    old, new = tmp_path / "web", tmp_path / "web-converted"
    write_v2_dataset(old, affine_documents(200), vocab_size=256, target_bytes=24 << 10)
    convert_dataset(str(old), str(new), log=lambda *a: None)
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {"web": old, "code": new}, run)
    for err in both(config, [f'run.output_dir="{run}"'], capsys):
        assert "sources 'web' and 'code' are the same dataset" in err and "one fingerprint" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def same_documents(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Built once for the module: two builds of 200 documents, the second's in another order and other
    shards (as a rebuild with another shards.seed writes them: another fingerprint), {"recorded": that
    pair, "before the record": copies whose dataset.json lack the sum (as an older build wrote them;
    the same fingerprints), "one apart": the first and a third like the second but for one token,
    "another build": the first and a fourth build of its documents (other shards again)}."""
    top = tmp_path_factory.mktemp("same-documents")
    docs = list(affine_documents(200))
    again = [docs[i].copy() for i in np.random.default_rng(5).permutation(len(docs))]
    changed = [d.copy() for d in again]
    changed[17][3] = changed[17][3] % 255 + 1  # another token, not the separator
    a, b, c = top / "web", top / "web-resharded", top / "web-changed"
    write_synthetic_dataset(a, docs, vocab_size=256, target_bytes=24 << 10)
    write_synthetic_dataset(b, again, vocab_size=256, target_bytes=16 << 10)
    write_synthetic_dataset(c, changed, vocab_size=256, target_bytes=16 << 10)
    d = top / "web-rebuilt"
    write_synthetic_dataset(d, docs[::-1], vocab_size=256, target_bytes=20 << 10)
    older = []
    for root in (a, b):
        copy = top / "older" / root.name
        shutil.copytree(root, copy)
        info = read_dataset_info(copy)
        del info["index"][DOCUMENTS_SUM]
        write_dataset_info(copy, info)
        older.append(copy)
    return {
        "recorded": (a, b),
        "before the record": (older[0], older[1]),
        "one apart": (a, c),
        "another build": (a, d),
    }


@pytest.mark.parametrize("indexed", ["recorded", "before the record"])
def test_the_same_documents_in_another_order_are_one_dataset(same_documents, tmp_path, capsys, indexed):
    """Held-out documents are chosen by manifest row: two builds of one corpus in another order (another
    fingerprint) each hold out documents the other trains on, so val/NAME scored trained text, exit 0
    (review R30b F1). The documents' sum tells: recorded by the build, or (an index written before the
    record) summed at the open from doc_sha256.bin."""
    a, b = same_documents[indexed]
    assert read_dataset_info(a)["fingerprint"] != read_dataset_info(b)["fingerprint"]
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {"web": a, "code": b}, run)
    for err in both(config, [f'run.output_dir="{run}"'], capsys):
        assert "sources 'web' and 'code' are the same dataset" in err, err
        assert (
            f"({a} and {b}, the same documents under another fingerprint: each document read by both" in err
        )
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_recorded_sum_not_its_documents_is_refused_and_data_index_records_it_again(
    same_documents, tmp_path, capsys
):
    """Review RV32b F3: no fingerprint covers the sum, and the open trusted it: an edited (or stale) one
    let one corpus twice through, exit 0, or refused two datasets as one. Where the open sums a local
    doc_sha256.bin (at most MAX_SUM_BYTES), a recorded sum is checked: one line naming dataset.json and
    `gristmill data index`, which records it again. One source has no pair to compare: not summed
    (RV32b F7), so its wrong sum is no refusal there."""
    a = same_documents["recorded"][0]
    same, other = (
        shutil.copytree(pair[1], tmp_path / pair[1].name)
        for pair in (same_documents["recorded"], same_documents["one apart"])
    )
    wrong = {same: "0" * 63 + "1", other: read_dataset_info(a)["index"][DOCUMENTS_SUM]}
    run = tmp_path / "run"
    for root, total in wrong.items():
        info = read_dataset_info(root)
        write_dataset_info(root, {**info, "index": {**info["index"], DOCUMENTS_SUM: total}})
        if root == same:  # alone: no pair, not summed
            alone = write_recipe(tmp_path / "alone.toml", {"code": root}, run)
            assert gristmill(["train", "--config", str(alone), "--plan"]) == 0, capsys.readouterr().err
        config = write_recipe(tmp_path / "r.toml", {"web": a, "code": root}, run)
        for extra in (["--plan"], []) if root == same else (["--plan"],):  # train opens as --plan does
            assert gristmill(["train", "--config", str(config), *extra]) == 2
            err = capsys.readouterr().err
            assert f"{root / 'dataset.json'}: index.{DOCUMENTS_SUM} {total[:12]}… is not the sum" in err, err
            assert f"`gristmill data index {root}` records it again" in err
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert gristmill(["data", "index", str(root)]) == 0
        # the build's sum again: the pairs are then as test_the_same_documents… and …one_document_apart… show
        assert read_dataset_info(root)["index"][DOCUMENTS_SUM] == info["index"][DOCUMENTS_SUM]


def test_datasets_one_document_apart_are_two_sources(same_documents, tmp_path, capsys):
    """The sum is of the documents' sha256: one token changed in one document is another dataset. Its
    other 199 documents both hold, held out by manifest row in each, so each trains on most of what the
    other holds out: `train --plan` and `train` say so in one warning, with the counts (trial RV70b 1),
    here counted from the documents' tokens as each split reads them."""
    a, b = same_documents["one apart"]
    sums = [read_dataset_info(root)["index"][DOCUMENTS_SUM] for root in (a, b)]
    assert sums[0] != sums[1]
    split = {}
    for root in (a, b):
        for name in ("train", "val"):
            t = DocumentTable(root, split=name, val_fraction=0.1)  # the recipe's data.val_fraction
            split[root, name] = [t.document(int(r)).tobytes() for r in t.split_rows(np.arange(t.documents))]
    held = {x: sum(d in split[y, "train"] for d in split[x, "val"]) for x, y in ((a, b), (b, a))}
    assert all(held.values())  # the case of the finding: each val/NAME scores text the other trains on
    shared = sum(d in split[b, "train"] + split[b, "val"] for d in split[a, "train"] + split[a, "val"])
    assert shared == 199
    head = (
        f"warning: sources 'web' and 'code' share documents ({a} and {b}): {shared} of the 200 of 'web' are "
        "among the 200 of 'code', each read by both; "
    )
    warning = (
        f"{head}val/web holds out {len(split[a, 'val'])} documents, {held[a]} of them in the training split "
        f"of 'code'; val/code holds out {len(split[b, 'val'])} documents, {held[b]} of them in the training "
        "split of 'web', so val/web and val/code score text the run trains on; build the sources disjoint "
        "(filter the shared documents out of one), or set data.sources[0].val_fraction=0 and "
        "data.sources[1].val_fraction=0 (a training run's: a mixture search scores every source's held-out "
        "documents), or accept it\n"
    )
    config = write_recipe(tmp_path / "r.toml", {"web": a, "code": b}, tmp_path / "run")
    once = ["run.max_steps=1", "run.val_every=0", "metrics.plot=false"]
    for extra in (["--plan"], ["--set", *once]):
        assert gristmill(["train", "--config", str(config), *extra]) == 0
        out, err = capsys.readouterr()
        said = out + err
        assert said.count(warning) == 1 and said.count("warning: sources") == 1, (extra, out, err)
    # one holding nothing out already: the advice names the other alone (trial RV74b 3)
    assert (
        gristmill(["train", "--config", str(config), "--plan", "--set", "data.sources[1].val_fraction=0"])
        == 0
    )
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if line.startswith("warning: sources")]
    assert len(said) == 1 and said[0].endswith(
        "(filter the shared documents out of one), or set data.sources[0].val_fraction=0 (a training run's: "
        "a mixture search scores every source's held-out documents), or accept it"
    ), said
    # nothing held out: documents read twice, an upsampling if meant
    unheld = ["data.sources[0].val_fraction=0", "data.sources[1].val_fraction=0", "run.val_every=0"]
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *unheld]) == 0
    out, err = capsys.readouterr()
    assert (
        f"{head}neither trains on a document the other holds out: an upsampling, if meant; else build the "
        "sources disjoint (filter the shared documents out of one)\n" in out
    ), (out, err)


def test_a_run_that_trained_the_same_documents_twice_goes_on_with_a_warning(
    same_documents, tmp_path, capsys, monkeypatch
):
    """Review RV31b F1: a run that trained such a pair (started before the sum was recorded: an older
    gristmill, or a dataset whose doc_sha256.bin is over what the open sums, MAX_SUM_BYTES, lowered
    here) was stranded once `gristmill data index` recorded the sums: its resume, `data inspect` and
    `verify` refused, and the advice (one source) cannot resume it. Its past stands: a warning naming
    what its val/NAME scored, and it goes on; a fork of it too (its checkpoint into a new run.output_dir).
    Only a pair the run's plan holds (review RV32b F1): a source added at a resume, or a start from
    step 0 of a run stopped before its first save, is refused, by `--plan` as by `train`; a new run too."""
    monkeypatch.setattr(dataset_index, "MAX_SUM_BYTES", 0)
    a, b = (shutil.copytree(root, tmp_path / root.name) for root in same_documents["before the record"])
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {"web": a, "code": b}, run)
    sets = ["run.max_steps=1", "run.val_every=0", "metrics.plot=false", "checkpoint.interval=1"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0  # no sum at hand: accepted
    lacking = (
        f"note: source(s) 'web' ({a}), 'code' ({b}) record no index.{DOCUMENTS_SUM}, so another source "
        "holding the same documents in another order is not refused; `gristmill data index DIR` records it"
    )
    assert lacking in capsys.readouterr().out  # what the user can fix, said
    for root in (a, b):  # the way docs/loader-and-phases.md gives a large older dataset its sum
        assert gristmill(["data", "index", str(root)]) == 0
        assert (
            read_dataset_info(root)["index"][DOCUMENTS_SUM]
            == read_dataset_info(same_documents["recorded"][0])["index"][DOCUMENTS_SUM]
        )
    capsys.readouterr()
    warning = (
        f"warning: sources 'web' and 'code' hold the same documents ({a} and {b}: one {DOCUMENTS_SUM}), and "
        "the plan this run has trained ({}) reads both: each document is read twice, so val/web and val/code "
        "score text it trains on; a new run gives one source that dataset\n"
    )
    newest = run / "checkpoints" / "step-000001"
    commands = {
        "inspect": ["data", "inspect", str(run), "--step", "1", "--max-rows", "0"],
        "verify": ["verify", str(run)],
        "plan": ["train", "--config", str(config), "--resume", "auto", "--plan"],
        "resume": [
            "train",
            "--config",
            str(config),
            "--resume",
            "auto",
            "--set",
            *sets[1:],
            "run.max_steps=2",
        ],
    }
    commands["fork"] = [
        *commands["resume"][:4],
        str(run / "checkpoints" / "step-000002"),
        *commands["resume"][5:],
        f'run.output_dir="{tmp_path / "fork"}"',
    ]  # after "resume": from its step 2, training nothing more
    for what, argv in commands.items():
        rc = gristmill(argv)
        out, err = capsys.readouterr()
        assert rc == 0, (what, err)
        where = run / "data_plan.json" if what in ("inspect", "verify") else f"checkpoint {newest}"
        if what == "plan":  # --resume auto: not said to be the one it resumes (review RV32h N3)
            where = f"{where}, the newest complete one whose plan reads"
        assert (out + err).count(warning.format(where)) == 1, (what, out, err)
        assert "record no index." not in out + err
        if what == "resume":  # it saved step 2, which the fork resumes
            newest = run / "checkpoints" / "step-000002"
    refused = "are the same dataset ({}, the same documents under another fingerprint"
    more = same_documents["another build"][1]
    grown = (  # 'more' in the phase after the one the run is in: a change a resume may make
        '[[phase]]\nname = "main"\nsteps = 6\nseq_len = 32\nmix = { web = 0.6, code = 0.3 }\n'
        'lr = { warmup_steps = 2, shape = "constant" }\n\n[[phase]]\nname = "long"\nsteps = 5\nseq_len = 64\n'
        'mix = { web = 0.2, code = 0.4, more = 0.4 }\nlr = { shape = "linear", to = 3e-4 }\n'
    )
    added = write_recipe(tmp_path / "added.toml", {"web": a, "code": b, "more": more}, run, phases=grown)
    for argv in (["--resume", "auto", "--plan"], ["--resume", "auto"]):  # a source added at a resume
        assert gristmill(["train", "--config", str(added), *argv, "--set", *sets[1:]]) == 2
        out, err = capsys.readouterr()
        assert f"sources 'web' and 'more' {refused.format(f'{a} and {more}')}" in err, (argv, out, err)
        assert out.count("warning: ") == 1 and "warning: sources 'web' and 'more'" not in out, argv
    # A pair added at a resume before its sum was recorded (RV33d F1): trained on from the checkpoint
    # whose plan holds it, refused from an older one, which the resume takes when that one is damaged,
    # as when it is removed (`--plan` names the newest whose plan reads, as it says).
    older = tmp_path / "older-more"
    shutil.copytree(more, older)
    info = read_dataset_info(older)
    del info["index"][DOCUMENTS_SUM]
    write_dataset_info(older, info)
    added = write_recipe(tmp_path / "added.toml", {"web": a, "code": b, "more": older}, run, phases=grown)
    grow = ["train", "--config", str(added), "--resume", "auto", "--set", *sets[1:3]]
    assert gristmill([*grow, "checkpoint.interval=6", "run.max_steps=3"]) == 0, capsys.readouterr().err
    assert gristmill(["data", "index", str(older)]) == 0
    shard = next((run / "checkpoints" / "step-000003").glob("*.distcp"))
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # its plan still reads: only the checksums tell
    shard.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert gristmill(grow) == 2
    out, err = capsys.readouterr()
    assert f"sources 'web' and 'more' {refused.format(f'{a} and {older}')}" in err, (out, err)
    assert f"resuming from {run / 'checkpoints' / 'step-000002'}" in out, out
    assert "warning: sources 'web' and 'more'" not in out + err, out
    assert (run / "checkpoints" / "step-000003").is_dir()  # refused before the newer ones are set aside
    for shard in (run / "checkpoints").glob("step-*/*.distcp"):  # every checkpoint damaged (RV32h N1)
        shard.write_bytes(shard.read_bytes()[:64])
    assert gristmill(["train", "--config", str(config), "--resume", "auto", "--set", *sets[1:]]) == 2
    out, err = capsys.readouterr()  # the resume's own line, not the sources' advice that cannot resume it
    assert f"--resume auto: no complete checkpoint in {run / 'checkpoints'} verifies" in err, (out, err)
    assert "are the same dataset" not in err and "warning: " not in out + err
    (run / "checkpoints").rename(tmp_path / "set-aside")  # stopped before its first save: from step 0
    (run / "checkpoints.jsonl").rename(tmp_path / "set-aside.jsonl")  # (which recorded no save)
    for argv in (["--plan"], ["--resume", "auto"]):
        assert gristmill(["train", "--config", str(config), *argv, "--set", *sets]) == 2
        out, err = capsys.readouterr()
        assert f"sources 'web' and 'code' {refused.format(f'{a} and {b}')}" in err, (argv, out, err)
        assert "warning: " not in out + err, argv
    new = tmp_path / "new"
    both(config, [f'run.output_dir="{new}"'], capsys)


def test_set_data_dataset_beside_sources_is_refused_even_at_its_default(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for err in both(config, [f'run.output_dir="{run}"', "data.dataset=runs/data/demo"], capsys):
        assert "--set data.dataset=runs/data/demo" in err and "[[data.sources]]" in err, err


def test_a_value_a_check_refuses_names_the_set_that_gave_it(sources, tmp_path, capsys):
    """Trial RV66f F8: a value refused by a check past the loader (a weight decay below 0, a sequence
    length of 0) was named by its key alone, though the loader names the --set of a value it refuses;
    a search's proxy.set then named a key of no file of the search's. The --set is named now."""
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for item in ("optim.weight_decay=-1", "data.seq_len=0"):
        for err in both(config, [f'run.output_dir="{run}"', item], capsys):
            assert err.rstrip().endswith(f"(--set {item})") and err.count(item) == 1, err
    # of overrides of one key the last is named, not the first one's place (trial RV68e F2)
    repeated = [
        "optim.weight_decay=0.1",
        "optim={lr=3e-3, min_lr=3e-4, weight_decay=0.1}",
        "optim.weight_decay=-1",
    ]
    for err in both(config, [f'run.output_dir="{run}"', *repeated], capsys):
        assert err.rstrip().endswith("(--set optim.weight_decay=-1)"), err
    # a check of a whole section names none of the overrides inside it: phase[1]'s budget was blamed
    # on its seq_len (review RV68d 1)
    config = write_recipe(tmp_path / "p.toml", sources, run, phases=TWO_PHASES)
    for err in both(config, [f'run.output_dir="{run}"', "phase[1].seq_len=32", "phase[1].steps=5"], capsys):
        assert (
            err.startswith("error: phase[1] (long): give its budget as steps or tokens")
            and "--set" not in err
        )


def test_a_phase_longer_than_the_model_is_refused_by_plan_and_train_naming_its_key(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for err in both(config, [f'run.output_dir="{run}"', "model.max_seq_len=32"], capsys):
        assert "phase[1].seq_len = 64 exceeds the model's max_seq_len = 32" in err, err
        assert "data.seq_len" not in err


TWO_PHASES = (
    '[[phase]]\nname = "main"\nsteps = 6\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n\n'
    '[[phase]]\nname = "long"\ntokens = 3000\nseq_len = 64\nmix = { web = 0.5, code = 0.5 }\n'
)


WARM_FIRST = TWO_PHASES.replace("web = 0.6, code = 0.4", "code = 1.0")  # web only from phase 1 on
BOUND = "a plan may ask at most 100,000 epochs' worth of a source"


@pytest.mark.timeout(120)  # a budget a few digits too long walked every epoch end: hours (RV52b F1)
@pytest.mark.parametrize(
    "names, phases, sets, says",
    [
        (["web", "code"], TWO_PHASES, ["phase[0].steps=99999999999999999"],
         "source 'web' ({web}) would be read {{}} epochs or more: the plan asks {{}} tokens of its training "
         "split's {{}} (max_epochs = 1); phase[0].steps = 99999999999999999 asks the most of it: lower "
         "it or the source weight, or add data"),
        # a float budget past int64 was an OverflowError traceback (RV52b F2)
        (["web", "code"], TWO_PHASES, ["phase[1].tokens=1e30"],
         "(max_epochs = 1); phase[1].tokens = 1e+30 asks the most"),
        # web, bounded, was walked into phase 1, whose start walked code through phase 0 unchecked
        (["web", "code"], WARM_FIRST, ["phase[0].steps=99999999999999999"],
         "source 'code' ({code}) would be read {{}} epochs or more"),
        # a max_epochs above the bound is not what refuses it (review RV53c 3)
        (["web"], TWO_PHASES, ["data.sources[0].max_epochs=1000000000000", "phase[0].steps=1000000000000"],
         "source 'web' ({web}) would be read {{}} epochs or more: the plan asks {{}} tokens of its training "
         f"split's {{{{}}}} ({BOUND}); phase[0].steps = 1000000000000 asks the most of it: lower it, or add "
         "data"),
    ],
)  # fmt: skip
def test_a_budget_a_few_digits_too_long_is_refused_at_once_naming_its_key(
    sources, tmp_path, capsys, names, phases, sets, says
):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", {n: sources[n] for n in names}, run, phases=phases)
    if len(names) == 1:
        config.write_text(config.read_text().replace(", code = 0.4", "").replace(", code = 0.5", ""))
    said = says.format(web=sources["web"], code=sources["code"])
    if len(names) == 2 and phases == TWO_PHASES:  # within the bound: --plan's table first, then the refusal
        argv = ["train", "--config", str(config), "--plan", "--set", f'run.output_dir="{run}"']
        assert gristmill([*argv, "phase[0].steps=400"]) == 2
        out, err = capsys.readouterr()
        assert "tokens/step" in out and "source 'web'" in err and "would run out" in err, (out, err)
    pattern = re.escape(said).replace(re.escape("{}"), "[0-9,]+")
    for err in both(config, [f'run.output_dir="{run}"', *sets], capsys):
        assert re.search(pattern, err), err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_a_one_dataset_run_past_the_bound_and_a_step_larger_than_an_epoch_are_one_line(
    sources, tmp_path, capsys
):
    """data.dataset's one source (named "data") has no weight to lower; and a source whose epoch holds
    fewer windows than one step takes is that refusal, which no lower budget mends (review RV53c 6)."""
    run = tmp_path / "run"
    sets = [f'run.output_dir="{run}"', f'data.dataset="{sources["web"]}"', "schedule.steps=1000000000000"]
    for err in both(Path(TINY), sets, capsys):
        assert re.fullmatch(
            f"error: source 'data' \\({re.escape(str(sources['web']))}\\) would be read [0-9,]+ epochs or "
            f"more: the plan asks [0-9,]+ tokens of its training split's [0-9,]+ \\({BOUND}\\); "
            "schedule.steps = 1000000000000 asks the most of it: lower it, or add data\n",
            err,
        ), err
    per_epoch = DocumentTable(sources["web"], val_fraction=0.1).tokens // 33
    batch = -(-(per_epoch + 1) // 4) * 4  # whole micro-batches of 4
    config = write_recipe(tmp_path / "r.toml", {"web": sources["web"]}, run, phases=TWO_PHASES)
    config.write_text(config.read_text().replace(", code = 0.4", "").replace(", code = 0.5", ""))
    sets = [
        f'run.output_dir="{run}"',
        "phase[0].steps=1000000000000",
        f"phase[0].global_batch_tokens={32 * batch}",
    ]
    for err in both(config, sets, capsys):
        assert (
            f"one epoch holds {per_epoch} windows of 33 tokens, fewer than the {batch} one step of phase "
            in err
        )
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "sets, says",
    [
        # the later of two sources of one name is the one to rename, and it is not the character rule
        (['data.sources[1].name="web"'], "data.sources[1].name = 'web' is also data.sources[0].name: every "
         'source needs its own name (--set data.sources[1].name="web")'),
        # one key at fault is named, not the unused default data.seq_len beside it
        (["data.micro_batch=-4"], "data.micro_batch = -4 must be ≥ 1 (--set data.micro_batch=-4)"),
        (["phase[0].micro_batch=0"], "phase[0].micro_batch = 0 must be ≥ 1 (sequences per micro-batch) "
         "(--set phase[0].micro_batch=0)"),
        # "the sources are data": the name data.dataset's one source has inside, never written
        (["data.sources=[]"], "phase[0].mix names source 'web', but data.sources lists none: add a "
         "[[data.sources]] table for it (name = 'web', dataset = …) (--set data.sources=[])"),
    ],
)  # fmt: skip
def test_a_source_or_batch_setting_is_refused_naming_the_one_key_at_fault(
    sources, tmp_path, capsys, sets, says
):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run, phases=TWO_PHASES)
    for err in both(config, [f'run.output_dir="{run}"', *sets], capsys):
        assert f"error: {says}\n" == err, err


def test_a_held_out_split_too_small_for_val_batches_is_refused_by_plan_and_train(sources, tmp_path, capsys):
    """`train --plan` said the recipe was fine, then `train` refused it before step 1."""
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    for err in both(config, [f'run.output_dir="{run}"', "run.val_batches=10000"], capsys):
        assert "source 'web', phase 'main': run.val_batches = 10000: split 'val' of " in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        # the fix by its keys (it said "raise val_fraction, read fewer batches, or turn validation off")
        assert err.rstrip().endswith(
            "raise its held-out fraction (now 0.1: its [[data.sources]] val_fraction, else "
            "data.val_fraction), lower run.val_batches, or turn validation off (run.val_every = 0)"
        ), err


def test_the_plan_says_when_a_mix_is_normalised_and_the_header_names_every_dataset(sources, tmp_path, capsys):
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)  # main: 0.6/0.3, long: 0.2/0.4
    assert gristmill(["train", "--config", str(config), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "mix of phase 'main' normalised: web 0.6→0.667, code 0.3→0.333" in out, out
    assert "mix of phase 'long' normalised: web 0.2→0.333, code 0.4→0.667" in out
    # weights whose sum is past the largest float: their shares, not 0 (trial RV70b 4)
    assert (
        gristmill(
            ["train", "--config", str(config), "--plan", "--set", "phase[0].mix={web=1e308, code=1e308}"]
        )
        == 0
    )
    assert "mix of phase 'main' normalised: web 1e+308→0.5, code 1e+308→0.5" in capsys.readouterr().out
    sets = ["run.max_steps=1", "run.val_every=0", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    out = capsys.readouterr().out
    assert f"  data    web = {sources['web']}, code = {sources['code']}\n" in out, out
    assert "mix of phase 'main' normalised" in out


# -- `gristmill data inspect` and `gristmill verify`: what a directory is, steps from 1 --


def test_inspect_refuses_a_run_whose_source_was_rebuilt(tmp_path, capsys):
    srcs = {"web": make_dataset(tmp_path / "web", n_docs=240, seed=1)}
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", srcs, run)
    sets = ["run.max_steps=1", "run.val_every=0", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    assert gristmill(["data", "inspect", str(run), "--step", "5", "--hash"]) == 0
    capsys.readouterr()
    shutil.rmtree(srcs["web"])
    make_dataset(srcs["web"], n_docs=240, seed=9)  # rebuilt in place: another fingerprint
    assert gristmill(["data", "inspect", str(run), "--step", "5", "--hash"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "source 'web'" in err and str(srcs["web"]) in err and "not the dataset this run trained on" in err


MAIN = "(phase 'main')"


@pytest.mark.parametrize(
    "edit, says",
    [  # fmt: skip
        (("seed = 7", "seed = 8"), "has data.seed = 8, but the run trained with 7"),
        (
            ("val_fraction = 0.1", "val_fraction = 0.2"),
            "RUN gives val_fraction 0.2, but the run held out 0.1",
        ),
        (("seq_len = 32", "seq_len = 16"), f"has phase[0].seq_len {MAIN} = 16, but the run trained with 32"),
        (("steps = 6", "steps = 4"), f"has phase[0].steps {MAIN} = 4, but the run trained with 6"),
        # the mix as a recipe writes it, not the plan's integer weights [1, 2] (trial RV64a 2a)
        (
            ("web = 0.6, code = 0.3", "web = 0.3, code = 0.6"),
            f"has phase[0].mix {MAIN} = {{ web = 0.333333, code = 0.666667 }}, but the run trained with "
            "{ web = 0.666667, code = 0.333333 }",
        ),
        # an LR is no batch: the refusal said "the batches read from it" (trial RV53a 5)
        (("lr = 0.003", "lr = 0.001"), f"has optim.lr {MAIN} = 0.001, but the run trained with 0.003 ("),
    ],
)
def test_inspect_refuses_a_run_whose_config_toml_was_edited_after_it(sources, tmp_path, capsys, edit, says):
    """Every command after the run rebuilds its plan from RUN/config.toml: an edit there (by hand, or
    one a refused `--resume auto` left) showed batches and hashes the run never trained, exit 0.
    RUN/data_plan.json records what it trained; the first field that differs is named."""
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run)
    sets = ["run.max_steps=1", "metrics.plot=false"]
    assert gristmill(["train", "--config", str(config), "--set", *sets]) == 0
    assert gristmill(["data", "inspect", str(run), "--step", "3", "--hash"]) == 0
    capsys.readouterr()
    recorded = json.loads((run / "data_plan.json").read_text())["sources"]  # what an export checks
    assert [s["tokenizer_sha256"] for s in recorded] == [
        read_dataset_info(p)["tokenizer_sha256"] for p in sources.values()
    ]
    text = (run / "config.toml").read_text()
    assert edit[0] in text
    (run / "config.toml").write_text(text.replace(*edit, 1))  # the first: [data]'s, phase 0's, web's
    assert gristmill(["data", "inspect", str(run), "--step", "3", "--hash"]) == 2
    out, err = capsys.readouterr()
    says = says.replace("RUN", str(run / "config.toml"))
    assert out == "" and len(err.strip().splitlines()) == 1 and says in err, err
    assert f"{run / 'config.toml'}" in err and "set it back" in err
    if "trained with" in says:  # a plan's field (the val_fraction of a source: its held-out documents)
        assert "so the batches or learning rates read from it would not be the run's" in err
    assert gristmill(["verify", str(run)]) == 1  # verify's own report: the batches cannot be checked
    out = capsys.readouterr().out
    assert "batches: the 1 recorded steps cannot be checked against the plan: " in out and says in out, out


def test_inspect_says_what_a_directory_is_and_counts_steps_from_1(sources, tmp_path, capsys):
    web = sources["web"]
    geometry = ["--seq-len", "32", "--global-batch", "16", "--seed", "7"]
    assert gristmill(["data", "inspect", str(tmp_path / "nowhere"), *geometry]) == 2
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "is a dataset directory" not in err, err
    assert gristmill(["data", "inspect", str(web)]) == 2
    err = capsys.readouterr().err
    assert "is a dataset directory: give --seq-len, --global-batch, --seed" in err, err
    built = tmp_path / "built"
    shutil.copytree(web, built)
    (built / "config.toml").write_text("# the build's recipe\n")
    assert gristmill(["data", "inspect", str(built)]) == 2
    err = capsys.readouterr().err
    assert "is a dataset directory: give" in err and "no config.toml" not in err, err
    assert gristmill(["data", "inspect", str(web), *geometry, "--step", "0"]) == 2
    err = capsys.readouterr().err
    assert "--step counts from 1" in err and "--end" not in err, err
    # Step 1 is the first batch in dataset mode too, and --hash numbers steps the same way.
    assert gristmill(["data", "inspect", str(web), *geometry, "--hash", "--step", "1", "--end", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[0] for line in lines] == ["1", "2"]
    assert gristmill(["data", "inspect", str(web), *geometry, "--step", "2", "--max-rows", "1"]) == 0
    assert f"step 2 = epoch 0 batch 1; sha256 {lines[1].split()[1]}" in capsys.readouterr().out
    # A run's config.toml decides what dataset mode asks for: given there, they changed nothing
    # (`--split val` showed training batches, exit 0; review R2). Refused before the run is read.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("# a run's saved config\n")
    assert (
        gristmill(["data", "inspect", str(run), "--split", "val", "--val-fraction", "0.5", "--seed", "7"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"{run} is a training run, whose config.toml decides --seed, --split, --val-fraction: drop them"
        in err
    )
    assert gristmill(["data", "inspect", str(run), "--cache-gb", "5"]) == 2  # its data.cache_gb (R19d 7)
    assert (
        f"{run} is a training run, whose config.toml decides --cache-gb: drop it" in capsys.readouterr().err
    )
    # gristmill verify: a dataset directory (even with its build config.toml) is not a training run.
    assert gristmill(["verify", str(built)]) != 0
    err = capsys.readouterr().err
    assert f"{built} holds dataset.json: a dataset, not a training run" in err, err
    assert gristmill(["verify", str(tmp_path / "no-such-run")]) == 2  # not "has no config.toml"
    assert f"{tmp_path / 'no-such-run'} does not exist, not a training run" in capsys.readouterr().err


def test_the_plan_prints_each_phases_lr_shape_and_creates_no_run_directory(sources, tmp_path, capsys):
    """Issue 37 items 13, 14: `--plan` prints the shape of each phase's LR (a 5-step warmup to 1e-3
    then a cosine to 1e-4 was `0.0002 → 0.0001`: the peak hidden), and leaves no directory behind
    for a run that never starts."""
    run = tmp_path / "never" / "run"
    phases = (
        '[[phase]]\nname = "main"\nsteps = 8\nseq_len = 32\nmix = { web = 1.0 }\n'
        'lr = { warmup_steps = 5, shape = "cosine", peak = 1e-3, to = 1e-4 }\n\n'
        '[[phase]]\nname = "anneal"\nsteps = 4\nseq_len = 32\nmix = { web = 0.5, code = 0.5 }\n'
        'lr = { shape = "linear", to = 1e-5 }\n\n'
    )
    config = write_recipe(tmp_path / "r.toml", sources, run, phases=phases)
    assert gristmill(["train", "--config", str(config), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "warmup 5 → 0.001, cosine → 0.0001" in out and "linear 0.0001 → 1e-05" in out, out
    assert f"plot: none yet ({run} does not exist" in out
    assert not (tmp_path / "never").exists()
    # --plot FILE draws it anyway (LR, tokens per step, shares: three panels), still creating no run
    plot = tmp_path / "plan.png"
    assert gristmill(["train", "--config", str(config), "--plan", "--plot", str(plot)]) == 0
    assert f"plot: {plot}" in capsys.readouterr().out and not (tmp_path / "never").exists()
    for wrong in (tmp_path / "plan.xyz", tmp_path / "plan", tmp_path):  # a traceback; drawn to plan.png
        assert gristmill(["train", "--config", str(config), "--plan", "--plot", str(wrong)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: --plot {wrong}: name a .png, .svg, .pdf file to draw the plan in", err
    assert gristmill(["train", "--config", str(config), "--plan", "--plot", ""]) == 2  # drew none, exit 0
    assert capsys.readouterr().err.strip() == 'error: --plot "": name a path, or leave the option out'
    (tmp_path / "afile").write_text("")  # its folder a file: a traceback (review R22i M6)
    assert (
        gristmill(["train", "--config", str(config), "--plan", "--plot", str(tmp_path / "afile" / "x.png")])
        == 2
    )
    assert capsys.readouterr().err.startswith(f"error: --plot {tmp_path / 'afile' / 'x.png'}: ")
    (tmp_path / "dir.png").mkdir()  # the one thing asked for, not drawn: exit 0 with a warning (R22h S4)
    assert gristmill(["train", "--config", str(config), "--plan", "--plot", str(tmp_path / "dir.png")]) == 2
    said = capsys.readouterr().err.strip()
    assert (
        said == f"error: --plot {tmp_path / 'dir.png'}: {tmp_path / 'dir.png'} not drawn (Is a directory)"
    ), said
    import matplotlib.image

    assert matplotlib.image.imread(plot).shape[:2] == (700, 800)  # 8 × 7 inches at 100 dpi
    assert gristmill(["train", "--config", str(config), "--plot", str(plot)]) == 2
    assert "--plot" in capsys.readouterr().err and not (tmp_path / "never").exists()
    # a run that exists: its plan.png is its trainer's, never redrawn from a config it did not take (a
    # changed mix drew a plan the run's resume then refused: review R16b 1b)
    run.mkdir(parents=True)
    assert gristmill(["train", "--config", str(config), "--plan"]) == 0  # a run that drew none (R16e)
    none = f"plot: none in {run} (its trainer draws plan.png with metrics.plot = true)"
    assert none in capsys.readouterr().out
    (run / "plan.png").write_bytes(b"the trainer's")
    changed = "phase[1].mix={web=0.9,code=0.1}"
    assert gristmill(["train", "--config", str(config), "--plan", "--set", changed]) == 0
    said = "is the plan its trainer drew of the run there, not necessarily this config's; --plot FILE draws"
    assert f"plot: {run / 'plan.png'} {said} this one" in capsys.readouterr().out
    assert (run / "plan.png").read_bytes() == b"the trainer's" and sorted(run.iterdir()) == [run / "plan.png"]


def test_validation_asked_for_with_nothing_held_out_is_said(sources, tmp_path, capsys):
    """run.val_every with data.val_fraction = 0 trained without any val_loss, and nothing said so."""
    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run")
    note = (
        "note: no validation: run.val_every = 6, but no source holds documents out (every val_fraction is 0"
    )
    assert gristmill(["train", "--config", str(config), "--plan", "--set", "data.val_fraction=0"]) == 0
    assert note in capsys.readouterr().out
    per_source = ["data.sources[0].val_fraction=0", "data.sources[1].val_fraction=0"]  # [data]'s is 0.1
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *per_source]) == 0
    assert note in capsys.readouterr().out
    for sets in (["data.val_fraction=0", "run.val_every=0"], ["run.val_every=6"]):  # not asked for; held out
        assert gristmill(["train", "--config", str(config), "--plan", "--set", *sets]) == 0
        assert "no validation" not in capsys.readouterr().out


def test_an_edited_token_budget_is_named_in_the_steps_it_makes(sources, tmp_path, capsys):
    """A phase budget given in tokens is compared in steps: the refusal said `phase[0].tokens = 8`."""
    phases = (
        '[[phase]]\nname = "main"\ntokens = 3072\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n'
        'lr = { warmup_steps = 2, shape = "constant" }\n\n'
    )
    run = tmp_path / "run"
    config = write_recipe(tmp_path / "r.toml", sources, run, phases=phases)
    assert (
        gristmill(["train", "--config", str(config), "--set", "run.max_steps=1", "metrics.plot=false"]) == 0
    )
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text(text.replace("tokens = 3072", "tokens = 4096"))
    capsys.readouterr()
    assert gristmill(["data", "inspect", str(run), "--step", "2", "--hash"]) == 2
    err = capsys.readouterr().err
    assert "has phase[0].tokens (phase 'main', in steps) = 8, but the run trained with 6" in err, err


QUIET = ["metrics.plot=false", "run.val_every=0", "checkpoint.interval=1"]


def main_phase(tokens: int, warmup_tokens: int) -> str:
    """One cosine phase 'main' of 512 tokens per step (write_recipe's batch), its budgets in tokens."""
    return (
        f'[[phase]]\nname = "main"\ntokens = {tokens}\nseq_len = 32\nmix = {{ web = 0.6, code = 0.4 }}\n'
        f'lr = {{ warmup_tokens = {warmup_tokens}, shape = "cosine" }}\n\n'
    )


def refused_resumes(sources, tmp_path, capsys, phases: str, steps: int, *edits: list[str]) -> list[str]:
    """Train `steps` steps of the recipe with `phases`, then resume it with each of `edits` (--set
    lists): each must be refused in one line; their stderr."""
    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run", phases=phases)
    assert gristmill(["train", "--config", str(config), "--set", f"run.max_steps={steps}", *QUIET]) == 0
    capsys.readouterr()
    errs = []
    for sets in edits:
        assert gristmill(["train", "--config", str(config), "--set", *QUIET, *sets, "--resume", "auto"]) == 2
        errs.append(capsys.readouterr().err)
        assert "Traceback" not in errs[-1] and len(errs[-1].strip().splitlines()) == 1, errs[-1]
    return errs


def test_a_learning_rate_refusal_says_a_token_budget_in_tokens(sources, tmp_path, capsys):
    """A cosine's budget given in tokens, changed on resume, moves the LR of the steps trained: the
    refusal said `phase[0].tokens 6 → 8`, steps under a tokens key (review R25c 2)."""
    longer = ["phase[0].tokens=4096", "phase[0].lr.warmup_tokens=1024"]
    [err] = refused_resumes(sources, tmp_path, capsys, main_phase(3072, 512), 3, longer)
    assert "phase[0].tokens 3072 → 4096 (phase 'main': 6 → 8 steps of 512 tokens)" in err, err
    assert "phase[0].lr.warmup_tokens 512 → 1024 (phase 'main': 1 → 2 steps of 512 tokens)" in err, err


def test_a_learning_rate_refusal_says_budgets_as_written(sources, tmp_path, capsys):
    """Budgets in tokens that are not whole steps: the refusal showed the tokens of their steps
    (written 3300 → 4400 shown 3072 → 4096, warmup 600 shown 1024), values nobody wrote (R25j 4)."""
    longer = ["phase[0].tokens=4400", "phase[0].lr.warmup_tokens=1100"]
    [err] = refused_resumes(sources, tmp_path, capsys, main_phase(3300, 600), 3, longer)
    assert "phase[0].tokens 3300 → 4400 (phase 'main': 6 → 8 steps of 512 tokens)" in err, err
    assert "phase[0].lr.warmup_tokens 600 → 1100 (phase 'main': 2 → 3 steps of 512 tokens)" in err, err


def test_a_changed_batch_is_refused_before_the_budgets_it_moves(sources, tmp_path, capsys):
    """A resume that changed a finished phase's budget and the current phase's batch: the LR refusal
    came first and named the current phase's budget and warmup in tokens at the new batch, values
    never written (phase[1].tokens 8192 → 4096), and not the batch that moved them (R25j 4)."""
    phases = (
        '[[phase]]\nname = "a"\ntokens = 1024\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n'
        'lr = { warmup_steps = 1, shape = "constant" }\n\n'
        '[[phase]]\nname = "b"\ntokens = 4096\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n'
        'lr = { warmup_tokens = 1024, shape = "cosine" }\n\n'
    )
    edit = ["phase[0].tokens=1536", "phase[1].global_batch_tokens=1024"]
    # then with the batch set back: the budget that did change, as written
    # and a batch that shortens the plan below the step trained: named, not "the total steps" (R25n 1)
    shorter = ["phase[1].global_batch_tokens=4096"]
    err, back, short = refused_resumes(sources, tmp_path, capsys, phases, 4, edit, edit[:1], shorter)
    assert "phase[1].global_batch_tokens (phase 'b') = 512 but this run has 1024" in err, err
    assert "phase[1].global_batch_tokens (phase 'b') = 512 but this run has 4096" in short, short
    assert "phase[1].tokens" not in err and "warmup_tokens" not in err, err
    assert "phase[0].tokens 1024 → 1536 (phase 'a': 2 → 3 steps of 512 tokens)" in back, back
    assert "phase[1]" not in back, back


def test_a_finished_phase_s_refusal_names_only_what_must_be_set_back(sources, tmp_path, capsys):
    """A finished phase's budget changed beside the current constant phase's (which may change): the
    refusal listed both to be set back (review R25n 2)."""
    phases = (
        '[[phase]]\nname = "a"\ntokens = 1024\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n'
        'lr = { warmup_steps = 1, shape = "constant" }\n\n'
        '[[phase]]\nname = "b"\ntokens = 4096\nseq_len = 32\nmix = { web = 0.6, code = 0.4 }\n'
        'lr = { shape = "constant" }\n\n'
    )
    [err] = refused_resumes(
        sources, tmp_path, capsys, phases, 4, ["phase[0].tokens=1536", "phase[1].tokens=8192"]
    )
    assert "phase[0].tokens 1024 → 1536" in err and "phase[1]" not in err, err


def test_a_constant_phase_s_budget_that_moves_its_capped_warmup_is_named(sources, tmp_path, capsys):
    """A constant phase whose warmup (1100 tokens) is capped at its 2 steps: a budget of 2048 makes the
    warmup 3 steps and changes step 1's LR. The refusal named `warmup_tokens 1100 → 1100` and hid the
    budget that moved it, when the current phase's budget was left out as a constant phase's (R25q 1)."""
    phases = main_phase(1100, 1100).replace('shape = "cosine"', 'shape = "constant"')
    [err] = refused_resumes(sources, tmp_path, capsys, phases, 1, ["phase[0].tokens=2048"])
    assert "phase[0].tokens 1100 → 2048" in err, err


def test_a_data_seq_len_no_phase_uses_is_said(sources, tmp_path, capsys):
    """`--set data.seq_len=128` on a recipe whose every phase sets its own seq_len changed nothing,
    silently (the header said seq 32/64, config.toml dropped the key). A note, not a refusal: runs saved
    before config.toml dropped the key hold it, and must still resume, export and evaluate."""
    config = write_recipe(tmp_path / "r.toml", sources, tmp_path / "run")
    assert gristmill(["train", "--config", str(config), "--plan", "--set", "data.seq_len=128"]) == 0
    out = capsys.readouterr().out
    assert "note: data.seq_len = 128 changes nothing: every [[phase]] sets its own seq_len" in out, out
    assert gristmill(["train", "--config", str(config), "--plan"]) == 0
    assert "data.seq_len" not in capsys.readouterr().out
    # data.val_fraction where every source sets its own, as a run's config.toml writes them: a
    # `--set data.val_fraction=0.2` on it changed nothing, silently (review R25b 4)
    own = ["data.sources[0].val_fraction=0.1", "data.sources[1].val_fraction=0.1"]
    assert (
        gristmill(["train", "--config", str(config), "--plan", "--set", *own, "data.val_fraction=0.2"]) == 0
    )
    out = capsys.readouterr().out
    said = "note: data.val_fraction = 0.2 changes nothing: every [[data.sources]] sets its own val_fraction"
    assert said in out, out
    assert (
        gristmill(["train", "--config", str(config), "--plan", "--set", own[0], "data.val_fraction=0.2"]) == 0
    )
    assert "data.val_fraction" not in capsys.readouterr().out  # source 1 holds out [data]'s 0.2
    # optim.lr where the first phase sets its peak: a resume's note called the change in effect, and a
    # learning-rate sweep over it trained one LR (review R1)
    peak = ["phase[0].lr.peak=2e-3", "optim.lr=1e-2"]
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *peak]) == 0
    out = capsys.readouterr().out
    assert "note: optim.lr = 0.01 changes nothing: phase[0].lr.peak is the first peak" in out, out
    assert "note: optim.min_lr = 0.0003 changes nothing: every [[phase]] ends where its lr.to says" in out
    # settings of a feature that is off: noted, not refused (a rewind recipe run with --set
    # run.on_spike=report, a resume's advice --set optim.name=adamw, runs saved with them must work)
    off = ["run.rewind.skip_steps=5", "optim.muon_momentum=0.5", "run.max_skipped=3"]
    off += ["run.spike_sigma=0", "run.spike_window=7"]  # review R14b: said nothing
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *off]) == 0
    out = capsys.readouterr().out
    assert (
        "note: run.rewind.skip_steps = 5 changes nothing: neither run.on_spike nor run.on_nonfinite is" in out
    )
    assert "note: optim.muon_momentum = 0.5 changes nothing: optim.name = 'adamw'" in out
    assert "note: run.max_skipped = 3 changes nothing: run.on_nonfinite = 'stop' skips no step" in out
    assert "note: run.spike_window = 7 changes nothing: run.spike_sigma = 0 turns spike detection off" in out
    muon = ["optim.name=muon", "optim.fused=true"]
    assert gristmill(["train", "--config", str(config), "--plan", "--set", *muon]) == 0
    out = capsys.readouterr().out
    assert "note: optim.fused = true changes nothing: optim.name = 'muon' (the fused kernel is" in out, out
