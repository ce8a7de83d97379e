"""`gristmill mix propose` end to end on two small synthetic sources: real proxy training runs (the
tiny model, in the search's forked workers), the outputs, reuse of finished runs, an unfinished run
trained again, and a rebuilt source whose old evidence is never used; bad recipes refused in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main as gristmill
from tests.helpers import forked
from tests.helpers.train_data import make_dataset
from training.contract.dataset_format import read_dataset_info
from training.contract.errors import interrupted
from training.mix.propose import COMMANDS_SH, RUN_TOKENS, SEARCH, _on_bound, bounds, epoch_caps
from training.mix.proxies import Proxy, check_supply, open_mix_sources
from training.mix.recipe import load_mix_config, names
from training.run.faults import SPIKE_WINDOW
from training.run.lock import RunLock

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

ROOT = Path(__file__).resolve().parents[3]
REPORT_FIELDS = {
    *("sources", "prior", "proposal", "swarm", "fit", "predicted", "validation", "gate_returned_prior"),
    *("fingerprints", "base", "noise", "warnings"),
}
ONE_SEED = "validation.seeds = [1] has one seed: one seed cannot measure seed noise"


def recipe(tmp: Path, sources: dict[str, Path]) -> Path:
    """The demo recipe's shape at the tiny scale: 6 steps of 16 × 32 tokens per proxy, 4 proxies,
    one validation seed, one worker (CI's 2 cores run two test processes)."""
    text = "".join(f'[[data.sources]]\nname = "{n}"\ndataset = "{p}"\n\n' for n, p in sources.items())
    text += """
[data]
val_fraction = 0.1

[target]
mix = { web = 0.2, code = 0.8 }

[proxy]
preset = "tiny"
tokens = 3072
seq_len = 32
global_batch_tokens = 512
micro_batch = 16
warmup_steps = 2
val_batches = 1
parallel = 1
set = ["parallel.param_dtype=float32", "run.device=cpu"]

[swarm]
size = 4

[constraints]
min_weight = 0.1
max_weight = 0.9

[validation]
seeds = [1]
"""
    path = tmp / "mix.toml"
    path.write_text(text)
    return path


def command(config: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.cli",
        "mix",
        "propose",
        "--config",
        str(config),
        "--out",
        str(out),
    ]


def propose(config: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`gristmill mix propose` as its own process, forked from the preloaded server (tests/helpers/forked)."""
    return forked.run([*command(config, out), *flags], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture(scope="module")
def shared_sources(synthetic_dataset) -> dict[str, Path]:
    return {"web": synthetic_dataset(n_docs=240, seed=1), "code": synthetic_dataset(n_docs=200, seed=2)}


@pytest.fixture(scope="module")
def long_sources(synthetic_dataset) -> dict[str, Path]:
    """Sources for proxies of proxy.tokens = 150000 (the searches stopped while a proxy trains)."""
    return {"web": synthetic_dataset(n_docs=1500, seed=1), "code": synthetic_dataset(n_docs=1500, seed=2)}


def test_propose_runs_reuses_and_never_mixes_evidence_across_a_rebuild(tmp_path, shared_sources):
    sources = {"web": shared_sources["web"], "code": tmp_path / "code"}  # code is rebuilt below: a copy
    shutil.copytree(shared_sources["code"], sources["code"])
    config, out = recipe(tmp_path, sources), tmp_path / "search"
    first = propose(config, out)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report) == REPORT_FIELDS
    assert report["sources"] == ["web", "code"] and len(report["swarm"]) == 4
    assert not any(e["reused"] for e in report["swarm"])
    for e in report["swarm"]:  # each entry is what its run recorded
        rows = [json.loads(line) for line in (Path(e["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["step"] == 6
        assert e["per_source_loss"] == {"web": rows[-1]["val/web"], "code": rows[-1]["val/code"]}
        assert e["target_loss"] == pytest.approx(0.2 * rows[-1]["val/web"] + 0.8 * rows[-1]["val/code"])
        assert sum(e["mix"].values()) == pytest.approx(1.0) and min(e["mix"].values()) >= 0.1 - 1e-9
    v = report["validation"]
    assert v["seeds"] == [1] and all(len(v[k]) == 1 for k in ("proposal", "uniform", "proportional"))
    passed = v["proposal"][0] < min(v["uniform"][0], v["proportional"][0])
    assert report["gate_returned_prior"] is (not passed)
    returned = report["prior"] if report["gate_returned_prior"] else report["proposal"]
    mix = tomllib.loads((out / "proposal.toml").read_text())["mix"]
    assert mix == pytest.approx(returned, abs=1e-4)
    assert (out / "mix.png").stat().st_size > 10_000
    assert_honest_about_noise(report, first.stdout)
    assert "learned nothing" not in first.stdout  # these proxies learned
    # the progress: a line as the first proxy starts, and the swarm's time left counts the validation
    lines = first.stdout.splitlines()
    started = lines.index("  training 4, 1 at a time; started " + report_label(report, 0))
    assert lines[started + 1].startswith("  1/4 swarm/p00 ")
    swarm_lines = [line for line in lines if line.startswith(tuple(f"  {k}/4 swarm/" for k in (1, 2, 3, 4)))]
    assert len(swarm_lines) == 4 and all(
        line.endswith("to go with the 3 validation runs)") for line in swarm_lines
    )
    assert (
        (out / "proposal.toml")
        .read_text()
        .startswith(f"# gristmill mix propose --config {config} --out {out}\n")
    )

    # A rerun trains only what is missing: one run left unfinished (no last row), the rest reused. Its
    # validation seeds are the swarm's own data.seed (1234) beside seed 1, at a proxy.tokens of no whole
    # number of steps: the same swarm and seed 1's validation runs (reused), seed 1234's trained.
    gone = Path(report["swarm"][1]["run_dir"])
    (gone / "metrics.jsonl").unlink()
    kept = Path(report["swarm"][0]["run_dir"]) / "metrics.jsonl"
    stamp = kept.stat().st_mtime_ns
    earlier = {
        name: (out / name).read_bytes() for name in ("report.json", "proposal.toml", "mix.png", "config.toml")
    }
    sets = ["swarm.concentration=1.0", "validation.seeds=[1234, 1]", "proxy.tokens=3300"]
    second = propose(config, out, "--set", *sets)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"swarm/p01: unfinished: no metrics.jsonl in {gone}; training it again" in second.stdout
    assert "3 of 4 reused" in second.stdout and "3 of 6 reused" in second.stdout, second.stdout
    again = json.loads((out / "report.json").read_text())
    assert [e["reused"] for e in again["swarm"]] == [True, False, True, True]
    assert kept.stat().st_mtime_ns == stamp
    assert [e["run_dir"] for e in again["swarm"]] == [e["run_dir"] for e in report["swarm"]]
    assert again["proposal"] == report["proposal"]  # p01 trained again is the same run: the same fit
    assert_own_seed_measured_apart(out, second.stdout)
    # the first search's outputs kept, with the recipe they answer to; the reproduce line has the --set
    assert {name: (out / "earlier/1" / name).read_bytes() for name in earlier} == earlier
    assert (
        f"the earlier search's report.json, proposal.toml, mix.png moved to {out / 'earlier/1'}/"
        in second.stdout
    )
    shown = "--set swarm.concentration=1.0 'validation.seeds=[1234, 1]' proxy.tokens=3300"
    reproduce = f"# gristmill mix propose --config {config} --out {out} {shown}"
    assert (out / "proposal.toml").read_text().splitlines()[0] == reproduce

    # A proxy trained by hand with another setting (a --write-commands line given `--set
    # data.micro_batch=…`) was deleted by the next search, --write-commands too (trial RV62b 2): moved
    # aside, with the key that differs.
    hand = Path(again["swarm"][2]["run_dir"])
    toml = (hand / "config.toml").read_text()
    micro = int(re.search(r"^micro_batch = (\d+)$", toml, re.M)[1])
    other = toml.replace(f"micro_batch = {micro}", f"micro_batch = {micro % 2 + 1}")
    (hand / "config.toml").write_text(other)
    listed = propose(config, out, "--set", *sets, "--write-commands")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    aside = hand.with_name(f"{hand.name}.aside-1")
    assert (
        f"swarm/p02: its config.toml is another recipe (data.micro_batch {micro} → {micro % 2 + 1}) in "
        f"{hand}; moved it to {aside}; training it again" in listed.stdout
    ), listed.stdout
    assert (aside / "metrics.jsonl").is_file() and not hand.exists()
    aside.rename(hand)  # as it was, for what follows
    (hand / "config.toml").write_text(toml)
    # A held-out loss in the last row that is no number: null or text was a traceback, NaN a fit, a
    # proposal and validation runs of NaN, exit 0 (trial RV62b 5). Not evidence: trained again.
    nan = Path(again["swarm"][1]["run_dir"])
    shutil.copytree(nan, tmp_path / "p01-as-it-was")
    rows = (nan / "metrics.jsonl").read_text().splitlines()
    for value, said in (("NaN", "NaN"), ("null", "null"), ('"x"', '"x"')):
        last = re.sub(r'"val/web": [^,}]+', f'"val/web": {value}', rows[-1])
        (nan / "metrics.jsonl").write_text("\n".join([*rows[:-1], last]) + "\n")
        listed = propose(config, out, "--set", *sets, "--write-commands")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        line = f"swarm/p01: its last row's val/web is {said}, not a held-out loss in {nan}; training it again"
        assert line in listed.stdout, listed.stdout
        shutil.rmtree(nan, ignore_errors=True)
        shutil.copytree(tmp_path / "p01-as-it-was", nan)

    # The code source rebuilt (other documents): no run of the old datasets counts, each slot whose
    # recipe is unchanged says why it trains again, and the old runs stay on disk. --write-commands
    # (the cluster's path) lists every proxy as missing instead of training them.
    shutil.rmtree(sources["code"])
    make_dataset(sources["code"], n_docs=200, seed=7)
    third = propose(config, out, "--write-commands")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "reused" not in third.stdout
    commands = (out / "commands.sh").read_text().splitlines()
    trains = [line for line in commands if line.startswith("gristmill train --config ")]
    assert len(trains) == 4 and all("# swarm/p0" in line for line in trains)
    old_dirs = {e["run_dir"] for e in report["swarm"]}
    assert (
        not (out / "report.json").exists() and not (out / "proposal.toml").exists()
    )  # none outlives its data beside the recipe, and none is lost
    assert json.loads((out / "earlier/2/report.json").read_text()) == again
    for line in trains:
        recipe_path = Path(line.split()[3])
        assert recipe_path.is_file() and str(recipe_path.with_suffix("")) not in old_dirs
        slot = recipe_path.name[:3]
        old = next(Path(d) for d in old_dirs if Path(d).name.startswith(slot))
        if (recipe_path.with_suffix("").name != old.name) and _same_mix(recipe_path, old):
            assert f"swarm/{slot}: source 'code' was rebuilt since" in third.stdout
    assert "swarm/p03: source 'code' was rebuilt since" in third.stdout  # at the bound: the same mixture
    assert all(Path(d).is_dir() for d in old_dirs)


def report_label(report: dict, k: int) -> str:
    mix = report["swarm"][k]["mix"]
    return f"swarm/p{k:02d} (" + ", ".join(f"{n} {w:.3f}" for n, w in mix.items()) + ")"


def assert_honest_about_noise(report: dict, stdout: str) -> None:
    """report.json's warnings (each said in the terminal) are the ones its own figures call for; its
    noise holds the seeds' spread beside the fit's error and the gap between predicted and validated."""
    sources, proposal = report["sources"], report["proposal"]
    on_bound = [n for n in sources if proposal[n] in (pytest.approx(0.1), pytest.approx(0.9))]
    swarm = {n: [e["mix"][n] for e in report["swarm"]] for n in sources}
    outside = [n for n in sources if not min(swarm[n]) - 1e-9 <= proposal[n] <= max(swarm[n]) + 1e-9]
    want = [ONE_SEED, *(["the proposal sits on a constraint bound"] * bool(on_bound))]
    want += ["the proposal lies outside the swarm's range"] * bool(outside)
    assert [w[: len(x)] for w, x in zip(report["warnings"], want)] == want and len(report["warnings"]) == len(
        want
    )
    for w in report["warnings"]:
        assert f"warning: {w}" in stdout.splitlines()
    for n in on_bound:
        bound = "max_weight = 0.9" if proposal[n] > 0.5 else "min_weight = 0.1"
        assert f"{n} = {proposal[n]:.4g} (constraints.{bound})" in report["warnings"][1]
    noise, v = report["noise"], report["validation"]
    assert (
        noise["cv_error"] == report["fit"]["cv_error"]
        and noise["predicted"]["proposal"] == report["predicted"]
    )
    assert noise["seed_spread"] == {"proposal": None, "uniform": None, "proportional": None}  # one seed
    for name in ("proposal", "uniform", "proportional"):
        assert noise["gap"][name] == pytest.approx(v[name][0] - noise["predicted"][name])
    shift = (noise["gap"]["uniform"] + noise["gap"]["proportional"]) / 2
    assert (
        f"if the fit is exact at the baselines, {shift:+.4f} (their mean gap) is the validation seeds' shift "
        "from the swarm's seed" in noise["explanation"]
    )
    assert (
        f"{noise['gap']['proposal'] - shift:+.4f} the fit's own miss at the proposal" in noise["explanation"]
    )
    assert f"noise: {noise['explanation']}" in stdout.splitlines()


def assert_own_seed_measured_apart(out: Path, stdout: str) -> None:
    """Review R25c 3–5: with validation.seeds = [1234, 1] (1234: the swarm's own data.seed) the noise
    text's "fit's own miss at the proposal" averaged the own seed (no shift there) into the other's
    estimate; report.json did not record the baselines as trained (uniform is projected into the
    bounds); and the console said "proxies of 30,000 tokens" of proxies that trained whole steps."""
    # what each proxy trains: 6 whole steps of 512, not proxy.tokens
    assert any(
        line.startswith("swarm: 4 proxies of 6 steps × 512 = 3,072 tokens (tiny), ")
        for line in stdout.splitlines()
    ), stdout
    report = json.loads((out / "report.json").read_text())
    v, noise = report["validation"], report["noise"]
    # every validation mixture as its runs trained it
    assert set(v["mix"]) == {"proposal", "uniform", "proportional"}
    assert v["mix"]["proposal"] == report["proposal"] and v["mix"]["proportional"] == report["prior"]
    for name, mix in v["mix"].items():
        for seed in (1234, 1):
            (run,) = (out / "validation").glob(f"s{seed}-{name}-*/config.toml")
            assert tomllib.loads(run.read_text())["phase"][0]["mix"] == pytest.approx(mix), name
    # the swarm's own seed (first) is the direct measurement; the shift is seed 1's alone
    pred = noise["predicted"]
    own = {name: v[name][0] - pred[name] for name in pred}
    other = {name: v[name][1] - pred[name] for name in pred}
    assert noise["own_seed_gap"] == pytest.approx(own)
    shift = (other["uniform"] + other["proportional"]) / 2
    assert noise["shift"]["seeds"] == [1]
    assert (noise["shift"]["shift"], noise["shift"]["miss"]) == pytest.approx(
        (shift, other["proposal"] - shift)
    )
    explanation = noise["explanation"]
    # the gaps said beside their mean are seed 1's, the seeds it is of: they were over both seeds,
    # and their mean was not the mean said (review R25j 1)
    assert (
        f"on validation seed [1] (not the swarm's), the proposal validated {other['proposal']:+.4f} from "
        f"its predicted {pred['proposal']:.4f}, uniform {other['uniform']:+.4f} and proportional "
        f"{other['proportional']:+.4f} from theirs: if the fit is exact at the baselines, {shift:+.4f} "
        "(their mean gap) is the validation seeds' shift" in explanation
    ), explanation
    assert f"{other['proposal'] - shift:+.4f} the fit's own miss at the proposal" in explanation, explanation
    assert (
        f"validation seed 1234 is the swarm's own, so no shift there: the fit's miss measured, proposal "
        f"{own['proposal']:+.4f}, uniform {own['uniform']:+.4f}, proportional {own['proportional']:+.4f}"
    ) in explanation, explanation


TOKENIZER = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}]}


def write_base(path: Path, tokenizer: Path, seed: int) -> None:
    """A random-init LlamaForCausalLM of the tiny shape, with the datasets' tokenizer (TOKENIZER)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, bos_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    shutil.copy(tokenizer, path / "tokenizer.json")


def test_a_base_replaced_at_the_same_path_is_other_runs(tmp_path):
    """Review R16a F1: the proxies' key and evidence covered the recipe (which holds only
    model.init_from's path) and the sources: a base replaced there reused every proxy of the old one,
    and a proxy trained again mixed both bases in one fit. The base's weights are now part of both."""
    sources = {}
    for name, n_docs, seed in (("web", 240, 1), ("code", 200, 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(TOKENIZER))  # the base's tokens
        sources[name] = make_dataset(tmp_path / name, n_docs=n_docs, seed=seed)
    base = tmp_path / "models" / "base"
    write_base(base, sources["web"] / "tokenizer.json", seed=0)
    (tmp_path / "base").symlink_to(base)  # named through a link: the proxies record the real path (R16d F1)
    config, out = recipe(tmp_path, sources), tmp_path / "search"
    text = config.read_text().replace('set = ["', f'set = ["model.init_from={tmp_path / "base"}", "', 1)
    config.write_text(text.replace("seeds = [1]", "seeds = [1234]"))  # the swarm's own data.seed
    first = propose(config, out)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((out / "report.json").read_text())
    old = report["base"]
    assert old["init_from"] == str(base) and set(old["weights_sha256"]) == {"model.safetensors"}
    # the validation runs have the swarm's seed: no seed shift is claimed (review R16a F2)
    assert "the validation runs have the swarm's own seed, so no seed shift" in report["noise"]["explanation"]
    assert "shift from the swarm's seed" not in report["noise"]["explanation"]
    write_base(base, sources["web"] / "tokenizer.json", seed=1)  # other weights, same path
    again = propose(config, out, "--write-commands")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reused" not in again.stdout, again.stdout
    stale = [line for line in again.stdout.splitlines() if "is not used; training it again" in line]
    assert len(stale) == 4 and all(
        f"the weights of its base {base} were replaced since (model.safetensors)" in line for line in stale
    ), again.stdout
    commands = (out / "commands.sh").read_text()
    assert sum(line.startswith("gristmill train ") for line in commands.splitlines()) == 4, commands
    # proxies their base refuses (another shape): refused before any run, not written as a commands.sh
    # whose every line the trainer refuses on the cluster (trial RV66a F3)
    shaped = config.read_text()
    config.write_text(shaped.replace('set = ["', 'set = ["model.n_layers=3", "', 1))
    refused = propose(config, out, "--write-commands")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stdout + refused.stderr
    assert "model.n_layers = 3" in refused.stderr and "gristmill train" not in refused.stdout, refused.stderr
    assert (out / "commands.sh").read_text() == commands
    config.write_text(shaped)
    # a base that cannot be read is refused before the search changes OUT (R16e F2)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    (base / "model.safetensors").unlink()
    refused = propose(config, out, "--write-commands")
    assert refused.returncode == 2 and "model.init_from" in refused.stderr, refused.stderr
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_a_hub_bases_proxies_are_its_commit_as_their_runs_record_it(tmp_path, monkeypatch):
    """Review R25d S1: base.json records the sha256 of a hub base's weights too (its snapshot, so a
    resume naming a directory is held to them). The proxies' identity of a hub base stays its pinned
    commit (their keys as before; the commit names the bytes): a proxy run's record of it, with the
    hashes or without (a run of before), is a run from that base, and another commit is not."""
    from tests.helpers.hub_server import HubServer, point_hub_at
    from tests.helpers.train_runs import TINY
    from training.checkpoint.base_record import BASE_JSON, record_base
    from training.checkpoint.base_source import locate_base
    from training.mix.proxies import base_change, base_identity
    from training.train import load_train_config

    (tmp_path / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    write_base(tmp_path / "base", tmp_path / "tokenizer.json", seed=0)
    files = {p.name: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    repo, said = "gristmill-test/tiny-llama", []
    with HubServer() as hub:
        commit = hub.add_repo(repo, files, repo_type="model")
        point_hub_at(hub, monkeypatch, tmp_path / "hf-home")
        tc = load_train_config(TINY, [f"model.init_from={json.dumps(repo)}"])
        base = base_identity(tc, said.append)
        assert base == {"init_from": f"{repo}@{commit}", "weights_sha256": None}
        run = tmp_path / "proxy"
        record_base(run, locate_base(base["init_from"]).directory, base["init_from"], "sha of its config")
        record = json.loads((run / "base" / BASE_JSON).read_text())
        assert set(record["weights_sha256"]) == {"model.safetensors"}  # what a resume is held to
        assert base_change(run, base) is None
        (run / "base" / BASE_JSON).write_text(json.dumps(record | {"weights_sha256": None}))  # one of before
        assert base_change(run, base) is None
        write_base(tmp_path / "later", tmp_path / "tokenizer.json", seed=1)
        later = hub.push(
            repo, {p.name: p.read_bytes() for p in (tmp_path / "later").iterdir()}, repo_type="model"
        )
        moved = base_identity(tc, said.append)
    assert moved["init_from"] == f"{repo}@{later}" != base["init_from"]
    assert base_change(run, moved) == f"its base was {repo}@{commit}, the proxies' is {repo}@{later}"


def test_a_second_search_into_the_same_out_is_refused_before_it_touches_anything(tmp_path, shared_sources):
    """Review R16a F4: a second search into a running one's --out cleared a proxy while it trained and
    could write its outputs beside the other's config.toml."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    out.mkdir()
    (out / "report.json").write_text("{}")
    with RunLock(out, SEARCH):  # the first search, as it holds OUT
        second = propose(config, out)
    assert second.returncode != 0, second.stdout
    line = second.stderr.strip()
    assert "\n" not in line and line.startswith(
        f"error: {out} is in use by another gristmill mix propose (pid {os.getpid()} on "
    ), second.stderr
    assert line.endswith("wait for it to end or stop it, or give this one another --out"), line
    assert sorted(p.name for p in out.iterdir()) == [".gristmill.lock", "report.json"]


def test_a_mix_on_the_run_tokens_bound_is_one_the_trainer_takes(tmp_path, shared_sources):
    """Review R16a F3: constraints.run_tokens capped a weight at max_epochs × tokens ÷ run_tokens,
    without the windows' extra token and the plan's room: a proposal on that bound was one the
    trainer refused ("source 'web' would run out"), after an exit 0 that offered it."""
    config = recipe(tmp_path, shared_sources)
    sets = ['target.source="code"', "target.mix={}", "constraints.min_weight=0", "constraints.max_weight=1"]
    cfg = load_mix_config(str(config), [*sets, "constraints.run_tokens=60000"])
    tables = open_mix_sources(cfg)
    lo, hi = bounds(cfg, {n: t.tokens for n, t in zip(names(cfg), tables)})
    assert hi[0] < 1.0, hi  # web's max_epochs is what caps it
    # the run the proposal is for, as the trainer plans it (a proxy's recipe of run_tokens)
    at_run = load_mix_config(str(config), [*sets, "proxy.tokens=60000"])
    web = float(hi[0])
    check_supply(at_run, Proxy("swarm", "bound", (web, 1.0 - web), at_run.data.seed), tables)


@pytest.mark.parametrize("batch", [2048, 8192, 16384, None])
def test_a_mix_on_the_run_tokens_bound_is_one_the_trainer_takes_in_any_batch(tmp_path, shared_sources, batch):
    """Review R25c 1: with max_epochs 2 the trainer drops up to one step's share of a source at each
    epoch end, which the bound's 2% margin did not hold for a run of few large steps: a proposal on
    the bound was refused at run_tokens. constraints.run_batch_tokens counts those tails; not given,
    the bound holds at any batch the run may have (here up to the largest one the plan takes)."""
    config = recipe(tmp_path, shared_sources)
    sets = ["constraints.min_weight=0", "constraints.max_weight=1", "data.sources[1].max_epochs=2"]
    given = [] if batch is None else [f"constraints.run_batch_tokens={batch}"]
    cfg = load_mix_config(str(config), [*sets, "constraints.run_tokens=60000", *given])
    tables = open_mix_sources(cfg)
    tokens = {n: t.tokens for n, t in zip(names(cfg), tables)}
    lo, hi = bounds(cfg, tokens)
    code = float(hi[1])
    assert code < 1.0 and 1.0 - code <= hi[0], hi  # code's max_epochs caps it; web takes the rest
    # a proposal there says what the cap assumed of the run's batch when it was not given
    line = _on_bound(cfg, names(cfg), np.array([1.0 - code, code]), lo, hi, epoch_caps(cfg, tokens))
    assert f"code = {code:.4g} (the most its max_epochs allows at constraints.run_tokens" in line, line
    unknown = (
        "(constraints.run_batch_tokens is not given: a step as large as the run is assumed, so a source's"
    )
    assert (unknown in line) is (batch is None), line
    # the run the proposal is for, as the trainer plans it, at each batch it may have
    for run_batch in [batch] if batch else [512, 2048, 8192, 16384]:
        at_run = load_mix_config(
            str(config), [*sets, "proxy.tokens=60000", f"proxy.global_batch_tokens={run_batch}"]
        )
        check_supply(at_run, Proxy("swarm", "bound", (1.0 - code, code), at_run.data.seed), tables)


@pytest.mark.parametrize("seq_len, run_tokens, batch", [(2048, 172041, 8192), (16, 63553, 2048)])
def test_a_mix_on_the_run_tokens_bound_is_one_the_trainer_takes_at_the_runs_seq_len(
    tmp_path, shared_sources, synthetic_dataset, seq_len, run_tokens, batch
):
    """Review R25j 3: the cap counted each epoch end's tail in windows of proxy.seq_len + 1, but the
    trainer's tail at a longer run seq_len is up to two windows of the run's: the mix on the bound
    was refused at seq_len 2048 (here a = 0.3296: "drops 8,122 more at its 2 epoch ends").
    constraints.run_seq_len counts them; and a run at a shorter seq_len than the proxies' reads more
    tokens per token trained (17/16, not 33/32: a = 0.9 was refused at seq_len 16)."""
    sources = {"a": synthetic_dataset(n_docs=200, seed=1), "b": shared_sources["web"]}
    config = recipe(tmp_path, sources)
    sets = ["target.mix={ a = 0.5, b = 0.5 }", "data.val_fraction=0.0675", "constraints.max_weight=0.9"]
    sets += ["data.sources[0].max_epochs=2", "data.sources[1].max_epochs=10"]
    run = [f"constraints.run_tokens={run_tokens}", f"constraints.run_batch_tokens={batch}"]
    cfg = load_mix_config(str(config), [*sets, *run, f"constraints.run_seq_len={seq_len}"])
    tables = open_mix_sources(cfg)
    lo, hi = bounds(cfg, {n: t.tokens for n, t in zip(names(cfg), tables)})
    a = float(hi[0])
    # the run the proposal is for, as the trainer plans it, at its seq_len
    at_run = load_mix_config(
        str(config),
        [*sets, f"proxy.tokens={run_tokens}", f"proxy.global_batch_tokens={batch}",
         f"proxy.seq_len={seq_len}", "proxy.micro_batch=1",
         f'proxy.set=["run.device=cpu", "model.max_seq_len={max(seq_len, 32)}"]'],
    )  # fmt: skip
    check_supply(at_run, Proxy("swarm", "bound", (a, 1.0 - a), at_run.data.seed), tables)
    assert a < 0.9 and 1.0 - a <= hi[1], hi  # a's max_epochs is what capped it; b takes the rest


@pytest.mark.parametrize(
    "sets, binds",
    [
        (["proxy.tokens=81920", "constraints.run_tokens=0"], "proxy.tokens"),  # no run cap at all
        (["proxy.tokens=81920", "constraints.run_tokens=6000"], "proxy.tokens"),  # one above the proxies'
        # code read once (web up to 3 times: its tails are not code's)
        (
            ["data.sources[0].max_epochs=3", "data.sources[1].max_epochs=1", "constraints.run_tokens=60000"],
            RUN_TOKENS,
        ),
    ],
)
def test_a_bound_says_what_the_run_cap_assumed_only_where_it_binds(tmp_path, shared_sources, sets, binds):
    """Review R25j 2: the bound warning advised constraints.run_batch_tokens when no run cap was in
    play (run_tokens 0, or proxy.tokens binding) and for a source read once, which drops no tail."""
    config = recipe(tmp_path, shared_sources)
    base = ["constraints.min_weight=0", "constraints.max_weight=1", "data.sources[1].max_epochs=2"]
    cfg = load_mix_config(str(config), [*base, *sets])
    tables = open_mix_sources(cfg)
    tokens = {n: t.tokens for n, t in zip(names(cfg), tables)}
    lo, hi = bounds(cfg, tokens)
    code = float(hi[1])
    assert code < 1.0, hi
    line = _on_bound(cfg, names(cfg), np.array([1.0 - code, code]), lo, hi, epoch_caps(cfg, tokens))
    assert f"code = {code:.4g} (the most its max_epochs allows at {binds}" in line, line
    assert "run_batch_tokens" not in line, line
    assert ("constraints.run_seq_len is not given" in line) is (binds == RUN_TOKENS), line


def _same_mix(recipe_path: Path, old_run: Path) -> bool:
    mix = tomllib.loads(recipe_path.read_text())["phase"][0]["mix"]
    return mix == tomllib.loads((old_run / "config.toml").read_text())["phase"][0]["mix"]


@pytest.mark.parametrize(
    "sets, says",
    [
        (
            ["target.mix={ web = 0.2, math = 0.8 }"],
            "target.mix.math: unknown source 'math'; the sources are web, code",
        ),
        (["target.mix={ web = 0.2, code = 1.5 }"], "target.mix.code = 1.5: a weight must be in [0, 1]"),
        (["constraints.min_weight=-0.1"], "constraints.min_weight = -0.1: a weight must be in [0, 1]"),
        (
            ["constraints.max_weight=0.3"],
            "constraints.min_weight = 0.1 and max_weight = 0.3: no mixture of 2 sources",
        ),
        (["swarm.size=3"], "swarm.size = 3: at least 4 for 2 sources"),
        (
            ["proxy.tokens=200000"],
            "proxy.tokens = 200000 would read a source past its max_epochs in every mixture",
        ),
        (
            ["constraints.run_tokens=1e6"],
            "constraints.run_tokens = 1000000 would read a source past its max_epochs",  # not 1e+06 (RV66a)
        ),
        (["proxy.set=['optim.lrr=1']"], "optim.lrr"),
        (  # it named a command's --set (trial RV74c 6)
            ["proxy.set=['nope']"],
            "proxy.set 'nope': each entry is KEY=VALUE of the proxies' training recipe, e.g. proxy.set = "
            '["optim.weight_decay=0.05"]',
        ),
        (["proxy.set=['run.output_dir=\"x\"']"], "run.output_dir is the search's own"),
        # proxies that skipped 13 of 14 steps were fitted and gated as evidence, exit 0 (trial RV62b 1)
        (["proxy.set=['run.on_nonfinite=\"skip\"']"], "a proxy that skips steps is not evidence"),
        (["proxy.set=['run.max_skipped=100']"], "a proxy that skips steps is not evidence"),
        # proxy.tokens trained at a batch proxy.set changed: 4x the tokens, exit 0 (review R2)
        (
            ["proxy.set=['data.global_batch_tokens=2048']"],
            "data.global_batch_tokens would train another length or do nothing; set "
            "proxy.global_batch_tokens instead",
        ),
        (["proxy.set=['data.seq_len=128']"], "set proxy.seq_len instead"),
        (  # it said "trains proxy.tokens at proxy.tokens" (trial RV74b 1)
            ["proxy.set=['run.max_steps=3']"],
            "each proxy trains proxy.tokens in batches of proxy.global_batch_tokens at proxy.seq_len (its "
            "steps and its validation at the last one follow from them), so run.max_steps would train "
            "another length or do nothing; set proxy.tokens instead",
        ),
        # refused as "[schedule] is the one-phase form; remove [schedule]", of a recipe with none
        (["proxy.set=['schedule.steps=3']"], "a proxy is one [[phase]] of the search's (proxy.tokens long"),
        # the trainer's model check: every proxy refused it, or --write-commands wrote them (R18h 1)
        (["proxy.set=['model.max_seq_len=16']"], "exceeds the model's max_seq_len = 16"),
        # an inline table went around both checks (review R4)
        (["proxy.set=['run={threads=1}']"], "a whole [run] would replace run.output_dir, run.seed"),
        # … and so did one of a table [proxy] fills (optim.lr, model.preset …: review R6)
        (["proxy.set=['optim={weight_decay=0.0}']"], "a whole [optim] would replace proxy.lr, proxy.min_lr"),
        (  # beside the recipe's target.mix (trial RV74b 2)
            ["target.source=code"],
            "[target]: give one of them, not both (target.mix = {} leaves target.source the target, "
            'target.source = "" leaves target.mix)',
        ),
        (["target.mix={}"], "[target]: give target.mix (e.g. { prose = 0.2, code = 0.8 }) or target.source"),
        (["swarm.sizes=3"], "swarm.sizes"),
        # the proxies' training recipe refused in the search's keys (issue 47), the user's own kept
        (
            ["proxy.global_batch_tokens=1000"],
            "proxy.seq_len = 32 must divide proxy.global_batch_tokens = 1000",
        ),
        (
            ["proxy.micro_batch=3"],
            "change proxy.micro_batch, proxy.global_batch_tokens or the number of ranks",
        ),
        (["proxy.lr=-1"], "proxy.lr = -1.0 is not allowed"),
        # a division by zero, a numpy traceback, and a refusal naming the trainer's data.seq_len (R16a)
        (["proxy.global_batch_tokens=0"], "proxy.global_batch_tokens = 0: must be an integer ≥ 1"),
        (["swarm.seed=-1"], "swarm.seed = -1: must be an integer ≥ 0"),
        # the proxies' run.seed: refused by the first proxy's training, or seed 0's weights (RV72c F2)
        (["data.seed=4294967296"], "data.seed = 4294967296 is not allowed: it must be between 0 and "),
        (["validation.seeds=[1, -1]"], "validation.seeds = [1, -1]: -1 is not allowed: it must be between"),
        (["proxy.micro_batch=0"], "proxy.micro_batch = 0: must be an integer ≥ 1"),
        (["proxy.min_lr=1"], "need 0 ≤ proxy.min_lr ≤ proxy.lr; got lr 0.003, min_lr 1.0"),
        # proxy.set won over [proxy]'s keys, while OUT/config.toml and the console named [proxy]'s
        # values (review R25b 5)
        (["proxy.set=['optim.lr=-1']"], "[proxy] sets optim.lr for every proxy (and the search's "),
        (["proxy.set=['optim.min_lr=0']"], "[proxy] sets optim.min_lr for every proxy"),
        (["proxy.set=['model.preset=\"demo\"']"], "set proxy.preset instead"),
        (["proxy.set=['data.micro_batch=2']"], "set proxy.micro_batch instead"),
        (["proxy.set=['run.threads=2']"], "set proxy.threads instead"),
        (["proxy.set=['run.val_batches=2']"], "proxy.set 'run.val_batches=2': [proxy] sets run.val_batches"),
        # a check past the loader named the trainer's key alone, of no file of the search's (RV66f F8)
        (
            ["proxy.set=['optim.weight_decay=-1']"],
            "optim.weight_decay = -1.0 is not allowed: it must be a finite number ≥ 0 (0: no weight decay) "
            "(proxy.set optim.weight_decay=-1)",
        ),
        # bounds that fit one mixture, or a handful: the swarm drew forever, silently
        (
            ["proxy.global_batch_tokens=64", "proxy.micro_batch=1"],
            "proxy.global_batch_tokens = 64 holds 2 sequences of proxy.seq_len = 32 a step and each of "
            "the 2 sources takes at least one, which leaves no mixture to search",
        ),
        (["constraints.min_weight=0.4999"], "swarm.size = 4: only 2 distinct mixture(s) (at 4 decimals)"),
        # nan compares false everywhere: a traceback, a cap silently dropped, an internal key named
        (["proxy.tokens=nan"], "proxy.tokens = nan: must be a finite number"),
        (["constraints.run_tokens=nan"], "constraints.run_tokens = nan: must be a finite number ≥ 0"),
        (
            ["constraints.run_batch_tokens=-1"],
            "constraints.run_batch_tokens = -1.0: must be a finite number ≥ 0",
        ),
        (["constraints.run_seq_len=-1"], "constraints.run_seq_len = -1: must be an integer ≥ 0"),
        # the cap's assumption where it refuses: no batch given, a second epoch is not counted on;
        # no seq_len given, the run's tails are taken at proxy.seq_len (review R25j 3)
        (
            ["data.sources[0].max_epochs=2", "data.sources[1].max_epochs=2", "constraints.run_tokens=1e6"],
            "(constraints.run_batch_tokens is not given: a step as large as the run is assumed",
        ),
        (
            ["constraints.run_tokens=1e6"],
            "(constraints.run_seq_len is not given: the run is assumed to read windows of proxy.seq_len",
        ),
        (["swarm.concentration=nan"], "swarm.concentration = nan: must be a finite number > 0"),
        # every proxy's trainer refused it, once the search had started (trial RV57a F3)
        (["proxy.val_batches=100000"], "source 'web': proxy.val_batches = 100000: split 'val' of "),
        (
            ["proxy.val_batches=100000"],
            "; lower proxy.val_batches or raise its held-out fraction (its [[data.sources]] val_fraction, "
            "else data.val_fraction)",
        ),
        # the held-out check's plan, at a mixture outside the bounds, refused it first in the trainer's
        # keys (review RV57c 1)
        (
            ["proxy.global_batch_tokens=32", "proxy.micro_batch=1"],
            "proxy.global_batch_tokens = 32 holds 1 sequences of proxy.seq_len = 32 a step",
        ),
    ],
)
def test_a_bad_recipe_is_one_line_before_any_run(tmp_path, shared_sources, capsys, sets, says):
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out), "--set", *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.startswith("error: ") and "\n" not in err, err
    assert not (out / "swarm").exists()


def test_an_out_holding_a_dataset_or_a_run_is_refused_untouched(
    tmp_path, shared_sources, capsys, monkeypatch
):
    """--out's config.toml is replaced by the search's recipe: a dataset's (its validation then failed)
    or a run's (its verify failed) was, exit 0 (review R22b F4)."""
    config = recipe(tmp_path, shared_sources)

    def refused(out: Path) -> str:
        assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out)]) == 2
        return capsys.readouterr().err.strip()

    for held, what in (
        ("dataset.json", "a dataset"),
        ("build.json", "a dataset"),
        ("metrics.jsonl", "a training run"),
    ):
        out = tmp_path / held
        out.mkdir()
        (out / held).write_text("{}")
        (out / "config.toml").write_text("# theirs\n")
        err = refused(out)
        assert err == (
            f"error: --out {out} holds {held}: {what}, whose config.toml the search would replace with its "
            "recipe; give the search a directory of its own"
        ), err
        assert sorted(p.name for p in out.iterdir()) == sorted([held, "config.toml"])
        assert (out / "config.toml").read_text() == "# theirs\n"
    # under a dataset's folder (its excluded/), or through a link into it: the proxies' files failed its
    # validation (trials RV62b 8, RV62f 2); a folder whose dataset.json is no gristmill's is not one
    dataset = tmp_path / "dataset.json"
    (dataset / "dataset.json").write_text('{"fingerprint": "0"}')
    (dataset / "excluded").mkdir()
    (tmp_path / "link").symlink_to(dataset / "excluded")  # a link to the folder itself (review RV62g 3)
    for out in (dataset / "excluded", dataset / "excluded" / "search", tmp_path / "link" / "search"):
        err = refused(out)
        assert err == (
            f"error: --out {out} lies inside {dataset}, which holds dataset.json: a dataset, which does not "
            "record it: give the search a directory outside it"
        ), err
        assert not (out / "config.toml").exists()
    other = tmp_path / "cordova"  # a build.json of another tool's
    other.mkdir()
    (other / "build.json").write_text('{"android": {}}')
    assert (
        gristmill(["mix", "propose", "--config", str(config), "--out", str(other / "s"), "--write-commands"])
        == 0
    )
    capsys.readouterr()
    # "": the search ran in the working directory, over a config.toml there (review R22d S1)
    monkeypatch.chdir(tmp_path)
    assert gristmill(["mix", "propose", "--config", str(config), "--out", ""]) == 2
    assert capsys.readouterr().err.strip() == 'error: --out "": name a path'


def test_a_search_s_out_with_a_tilde_holds_its_proxies(tmp_path, shared_sources, capsys, monkeypatch):
    """`--out=~/m` (no shell expands it there) was the search's folder `./~/m`, while its proxies, whose
    run.output_dir the loader expands, trained into the home directory: each then "no run there", the
    search stopped, and a rerun the same (trial RV73a 1). One folder for both."""
    config = recipe(tmp_path, shared_sources)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert gristmill(["mix", "propose", "--config", str(config), "--out=~/m", "--write-commands"]) == 0
    capsys.readouterr()
    commands = (home / "m" / COMMANDS_SH).read_text()
    assert f"{home / 'm' / 'swarm'}/p00" in commands, commands
    assert list(work.iterdir()) == []


def test_a_source_too_small_for_any_max_epochs_is_said_to_be(
    tmp_path, shared_sources, synthetic_dataset, capsys
):
    """A source of fewer tokens than two windows of seq_len + 1 is capped at 0 whatever its max_epochs
    (an epoch's end may leave that much unread), and the refusal said to raise its max_epochs (trial
    RV62b 9)."""
    small = synthetic_dataset(n_docs=8, seed=3)
    config, out = recipe(tmp_path, {**shared_sources, "code": small}), tmp_path / "search"
    tokens = read_dataset_info(small)["tokens"]
    assert 2 * 33 < tokens <= 2 * 1025, tokens  # two windows of the run's seq_len 1024 + 1
    sets = ["--set", "data.sources[1].max_epochs=100000", "constraints.run_tokens=1e6"]
    sets.append("constraints.run_seq_len=1024")
    assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: source 'code' holds {tokens:,} tokens, no more than two windows of constraints.run_seq_len "
        "+ 1 = 1025 tokens, which an epoch's end may leave unread: no max_epochs lets a mixture read it; add "
        "documents to it, or leave it out"
    ), err


def test_a_source_without_held_out_documents_is_one_line_before_any_run(tmp_path, shared_sources, capsys):
    """Every proxy is scored on every source's held-out loss: with a source's own val_fraction = 0
    each one trained to its end, was then found unfinished, and the rerun trained them all again."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    config.write_text(config.read_text().replace('name = "code"\n', 'name = "code"\nval_fraction = 0.0\n'))
    assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: data.sources[1].val_fraction = 0.0 (source 'code'): every source's held-out loss is the "
        "search's evidence; set it in (0, 1) or leave it to data.val_fraction"
    )


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_a_killed_search_leaves_no_worker_training(tmp_path, long_sources):
    """kill -9 of `mix propose` (or its terminal gone): its workers stop within a moment instead of
    training on for nothing (training.run.shutdown.exit_with_parent as the pool's initializer)."""
    config, out = recipe(tmp_path, long_sources), tmp_path / "search"
    proc = forked.popen([*command(config, out), "--set", "proxy.tokens=150000"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not any("step " in p.read_text() for p in out.glob("swarm/*/train.log")):
            assert proc.poll() is None and time.monotonic() < deadline, "no proxy started training"
            time.sleep(0.2)
        workers = _children(proc.pid)  # its pool's workers: the search starts no other process
        assert workers
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while [pid for pid in workers if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "a worker outlived its search"


def _started_training(proc, out: Path) -> None:
    deadline = time.monotonic() + 120
    while not any("step " in p.read_text() for p in out.glob("swarm/*/train.log")):
        assert proc.poll() is None and time.monotonic() < deadline, "no proxy started training"
        time.sleep(0.2)


def test_a_ctrl_c_trains_no_queued_proxy_and_a_killed_worker_is_one_line(tmp_path, long_sources):
    """Ctrl-C (SIGINT to the terminal's process group) saved the training proxy and then trained the
    ones the pool had queued to its workers, to their end, before the search ended (trial RV62b 3); a
    worker killed (the OOM killer) was a BrokenProcessPool traceback (RV62b 4)."""
    config, out = recipe(tmp_path, long_sources), tmp_path / "search"
    argv = [*command(config, out), "--set", "proxy.tokens=150000", "proxy.parallel=1"]
    # a process of its own, in a session of its own: a Ctrl-C reaches the whole group, as from a terminal.
    # Forked, as each search below (21 of the test's 35 CPU s were six fresh interpreters' imports): a
    # KeyboardInterrupt or Terminated the command let out would end in multiprocessing's bootstrap with a
    # traceback and exit 1, which the assertions refuse as they refused a fresh interpreter's
    proc = forked.popen(argv, cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        _started_training(proc, out)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
    logs = {p.parent.name[:3]: p.read_text() for p in out.glob("swarm/*/train.log")}
    assert list(logs) == ["p00"], logs  # p01, queued to the worker, never started
    # a SIGTERM to the search alone (`kill PID`) ended it with exit 143 and no word, its running proxy
    # killed with it or, waited for, trained to its end (trial RV70b 5); to the whole group (a scheduler's),
    # a worker left idle (5 for 4 proxies) printed a traceback (review RV71f 3). To the search alone, two
    # proxies at a time: each proxy started costs its start (~0.8 CPU s)
    out = tmp_path / "terminated"
    argv = [*command(config, out), "--set", "proxy.tokens=150000", "proxy.parallel=2"]
    proc = forked.popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _started_training(proc, out)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err.splitlines()[-1] == interrupted("SIGTERM"), err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(workers) == 2 and not [pid for pid in workers if Path(f"/proc/{pid}").exists()], workers
    # the scheduler's way, every process of the job, and a Ctrl-C's, with a worker idle (RV71h 2); and a
    # SIGINT to the search alone, which waited for its proxies to train to their end (review RV71h 1)
    for n, (sig, code, group) in enumerate(((signal.SIGTERM, 143, True), (signal.SIGINT, 130, True),
                                            (signal.SIGINT, 130, False))):  # fmt: skip
        out = tmp_path / f"group{n}"
        argv = [*command(config, out), "--set", "proxy.tokens=150000", f"proxy.parallel={5 if group else 2}"]
        proc = forked.popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            _started_training(proc, out)
            workers = _children(proc.pid)
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        said = interrupted("SIGTERM" if sig == signal.SIGTERM else "Ctrl-C")
        assert proc.returncode == code and err.splitlines()[-1] == said, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()], workers
        logs = [p.read_text() for p in out.glob("swarm/*/train.log")]
        assert not any("292/292" in log for log in logs), logs  # none trained to its end
    out = tmp_path / "again"
    argv = [*command(config, out), "--set", "proxy.tokens=150000", "proxy.parallel=1"]
    proc = forked.popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _started_training(proc, out)
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, err
    said = "error: a worker of the search died while proxies trained (killed: the OOM "
    assert lines[0].startswith(said), err
    assert lines[0].endswith("run the search again: finished proxies are reused"), err


def test_a_proxy_refused_by_the_trainer_is_said_in_the_search_keys(tmp_path, shared_sources, capsys):
    """What the trainer checks of the model (the preset) is refused in [proxy]'s keys, and before any
    proxy (it refused the first one, once the earlier outputs were moved aside: review R18h 1)."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    assert (
        gristmill(
            ["mix", "propose", "--config", str(config), "--out", str(out), "--set", "proxy.preset=nope"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == "error: proxy.preset = 'nope' is not one of demo, llama3-1b, llama3-8b, tiny", err
    assert not (out / "swarm").exists()


def test_a_diverged_proxy_s_advice_is_in_the_search_s_keys(tmp_path, shared_sources, capsys):
    """A proxy that diverges stops the search (exit 3) with its cause and the search's next step. It
    gave the trainer's advice with its key renamed: `gristmill train --config …/config.toml --set
    proxy.lr=…`, which the trainer refuses (unknown key 'proxy'), and a resume skipping such steps,
    whose run the search then takes for another recipe (trial RV57a F2)."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    sets = ["--set", "proxy.lr=1e6", "proxy.min_lr=0", "proxy.parallel=1"]
    assert gristmill(["mix", "propose", "--config", str(config), "--out", str(out), *sets]) == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: proxy swarm/p00 \(.+\) diverged: step \d+: [^;]*not finite[^;]*; "
        r"run the search again with a lower proxy\.lr \(now 1e\+06; e\.g\. 100000\): "
        r"a new recipe, every proxy trains again",
        err,
    ), err


def test_proxies_that_learned_nothing_are_said_to_have(tmp_path, shared_sources):
    """Proxies blown up by their LR (targets of 60-210 nats against ln 256 = 5.55 for a uniform guess)
    were fitted, proposed from and gated in silence, as if they measured the mixtures (trial RV57a F6).
    A warning on screen and in proposal.toml; a search whose proxies learned says nothing of it."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    # run from tmp_path with relative paths: proposal.toml names where (its command ran nowhere else)
    argv = [*command(Path(config.name), Path(out.name)), "--set", "proxy.lr=3.0", "proxy.min_lr=0"]
    done = forked.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "proposal.toml").read_text().splitlines()[:2] == [
        f"# gristmill mix propose --config {config.name} --out {out.name} --set proxy.lr=3.0 proxy.min_lr=0",
        f"# in {tmp_path}",
    ]
    said = re.search(r"warning: (the best proxy's target loss, [\d.]+, is no better than .*)", done.stdout)
    assert said and "(ln 256 = 5.5452): the proxies learned nothing" in said[1], done.stdout
    assert f"# warning: {said[1]}\n" in (out / "proposal.toml").read_text()
    report = json.loads((out / "report.json").read_text())
    best = min(e["target_loss"] for e in report["swarm"])
    assert best > 5.5452 and f"loss, {best:.4f}," in said[1]
    # and the proposal of noise is not kept, whatever its validation runs scored (trial RV62b 1)
    assert report["gate_returned_prior"] is True
    assert (
        "# the gate returned the prior (token-proportional): the proposal {"
        in (out / "proposal.toml").read_text()
    )
    assert (
        "} is of proxies that learned nothing (the warning above)\nmix = "
        in (out / "proposal.toml").read_text()
    )
    assert "gate: the proxies learned nothing (the warning above); returning the prior → " in done.stdout
    # and no validation run trains: whatever it measured, the prior is returned (review RV62e 10a)
    assert report["validation"]["seeds"] == [] and report["validation"]["proposal"] == []
    assert "validation: the proxies learned nothing: the gate returns the prior" in done.stdout
    assert not list(out.glob("validation*")) and not list(out.rglob("s1-proposal*")), sorted(out.iterdir())
    assert "# validation: none (the proxies learned nothing" in (out / "proposal.toml").read_text()
    assert report["noise"]["explanation"].startswith("no validation runs (") and (out / "mix.png").is_file()


@pytest.mark.parametrize("warmup, said", [(2, False), (6, True)])
def test_a_warmup_as_long_as_a_proxy_is_said(tmp_path, shared_sources, capsys, warmup, said):
    """proxy.warmup_steps not shorter than a proxy (6 steps here): every proxy trains below proxy.lr,
    accepted in silence (trial RV57a F6)."""
    config, out = recipe(tmp_path, shared_sources), tmp_path / "search"
    argv = ["mix", "propose", "--config", str(config), "--out", str(out), "--write-commands"]
    assert gristmill([*argv, "--set", f"proxy.warmup_steps={warmup}"]) == 0
    line = f"warning: proxy.warmup_steps = {warmup} is not shorter than a proxy (6 steps): every proxy trains"
    assert (line in capsys.readouterr().out) is said


def test_a_search_under_a_test_fault_says_so_and_is_other_evidence(
    tmp_path, shared_sources, capsys, monkeypatch
):
    """GRISTMILL_FAULT_SPIKE_WINDOW left set changed every proxy and the proposal, said only in each
    proxy's train.log, and a clean rerun reused the faulted proxies as this recipe's evidence (review
    R25h 1): the search says so, and a proxy trained under a fault has another key."""
    config = recipe(tmp_path, shared_sources)

    def proxies(out: Path) -> tuple[str, set[str]]:
        assert (
            gristmill(["mix", "propose", "--config", str(config), "--out", str(out), "--write-commands"]) == 0
        )
        lines = (out / "commands.sh").read_text().splitlines()
        runs = {Path(line.split()[3]).name for line in lines if line.startswith("gristmill train ")}
        return capsys.readouterr().out, runs

    said, clean = proxies(tmp_path / "clean")
    assert "GRISTMILL_FAULT" not in said
    monkeypatch.setenv(SPIKE_WINDOW, "step:5*50")
    said, faulted = proxies(tmp_path / "faulted")
    assert f"warning: {SPIKE_WINDOW}=step:5*50 is set: a test's injected fault" in said, said
    assert clean and len(faulted) == len(clean) and not clean & faulted, (clean, faulted)


def test_a_source_replaced_during_the_search_is_one_line_and_never_evidence(tmp_path, long_sources):
    """Issue 47: a source replaced while the proxies trained gave a ValueError traceback, and one
    proxy trained on the new data under the old fingerprint's name. Now the proxy that ran while it
    changed is cleared and the search ends in one line naming the source and both fingerprints."""
    sources = {"web": long_sources["web"], "code": tmp_path / "code"}  # code is replaced below: a copy
    shutil.copytree(long_sources["code"], sources["code"])
    config, out = recipe(tmp_path, sources), tmp_path / "search"
    old = read_dataset_info(sources["code"])["fingerprint"]
    replacement = make_dataset(tmp_path / "new-code", n_docs=1500, seed=7)
    new = read_dataset_info(replacement)["fingerprint"]
    proc = subprocess.Popen(  # not forked: its poll hung once (issue 48 note)
        [*command(config, out), "--set", "proxy.tokens=150000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any("step " in p.read_text() for p in out.glob("swarm/*/train.log")):
            assert proc.poll() is None and time.monotonic() < deadline, "no proxy started training"
            time.sleep(0.2)
        shutil.rmtree(sources["code"])  # replaced under the first proxy, as a rebuild would
        replacement.rename(sources["code"])
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 2, stdout[-3000:] + stderr[-3000:]
    line = stderr.strip()
    assert "\n" not in line and "Traceback" not in stderr, stderr
    assert line.startswith(
        f"error: source 'code' ({sources['code']}) changed during the search: fingerprint {old[:12]}… at "
        "its start, "
    ), line
    assert f"{new[:12]}… now" in line or "none readable now" in line, line
    # no run directory is evidence of the search's datasets unless its records say it trained them
    for run_dir in out.glob("swarm/p*-*"):
        assert not (run_dir / "metrics.jsonl").is_file(), f"{run_dir} kept a run of the changed source"


@pytest.mark.parametrize("name", ["demo", "quick"])
def test_the_shipped_recipes_load(name):
    from training.mix.recipe import load_mix_config

    cfg = load_mix_config(str(ROOT / "configs/mix" / f"{name}.toml"), [])
    assert [s.dataset for s in cfg.data.sources] == ["runs/data/demo", "runs/data/demo-code"]
