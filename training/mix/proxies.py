"""Each proxy is a real `gristmill train` run (training.train.train, in a worker process), and its
evidence is what that run recorded, checked before it is used.

A proxy's run directory is DIR/GROUP/SLOT-KEY: KEY hashes its whole training recipe and every
source's dataset fingerprint, so a proxy of a rebuilt source (or another proxy recipe) is another
run, never the old one. A directory counts as evidence only when the run's own records agree: its
config.toml is this recipe, its data_plan.json names these fingerprints, and metrics.jsonl has the
last step's row with every source's held-out loss. Anything else there (a run killed half-way) is
trained again. A run under the same SLOT whose recipe matches but whose fingerprints do not is
named ("source 'code' was rebuilt since …") and kept aside, never read.

Workers: a process pool, proxy.parallel of them, each training proxy after proxy in process, each
with run.threads torch threads. On Linux the search imports the trainer (torch) once, as its first
proxy is due, and forks its workers with it imported; elsewhere they are spawned, each importing it.
A worker checks every source's fingerprint against the search's before and after each proxy (and
when the proxy failed): a source replaced during the search ends it with one line naming the source
and both fingerprints, and a proxy that ran while it changed is cleared, never evidence (it may have
read both datasets).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.checkpoint.base_record import BASE_JSON, base_weights, read_base_record
from training.checkpoint.base_source import hub_id, locate_base
from training.config import TrainConfig, load_train_config
from training.contract.config_loader import (
    ConfigError,
    config_changes,
    config_from,
    json_sha256,
    naming_override,
    to_dict,
    tokens_shown,
)
from training.contract.errors import GristmillError, NonFiniteError, Terminated
from training.contract.run_layout import BASE_DIR, CONFIG_TOML, METRICS_JSONL, kept_rows, read_metrics
from training.data.loader import LoaderConfigError
from training.data.plan import VAL_FRACTION_KEYS, PlanError
from training.data.reader import DocumentTable
from training.data.recipe import build_plan, open_sources, recorded_plan
from training.data.remote import dataset_info
from training.data.spec import applied_config, batch_shapes, check_config, resolve
from training.mix.recipe import MixConfig, names
from training.run.faults import faults_set
from training.run.preflight import model_for_data
from training.run.validation import validation_of


@dataclass(frozen=True)
class Proxy:
    """One proxy run: where it goes and what it trains."""

    group: str  # "swarm" or "validation"
    slot: str  # "p03", "s1-proposal": the same slot keeps its name across reruns
    mix: tuple[float, ...]  # one weight per source, in the sources' order
    seed: int  # data.seed and run.seed

    def label(self, sources: list[str]) -> str:
        return (
            f"{self.group}/{self.slot} (" + ", ".join(f"{n} {w:.3f}" for n, w in zip(sources, self.mix)) + ")"
        )


@dataclass(frozen=True)
class Evidence:
    run_dir: Path
    losses: dict[str, float]  # held-out loss per source at the last step
    reused: bool


def train_config(cfg: MixConfig, proxy: Proxy, run_dir: Path | str = "") -> TrainConfig:
    """The proxy's training recipe: one phase of proxy.tokens on this mixture, validation at its last
    step, no checkpoints (a proxy is minutes: a killed one is trained again), then proxy.set."""
    p = cfg.proxy
    steps = int(p.tokens // p.global_batch_tokens)
    raw: dict[str, Any] = {
        "model": {"preset": p.preset},
        "data": {
            "sources": [to_dict(s) for s in cfg.data.sources],
            "val_fraction": cfg.data.val_fraction,
            "seed": proxy.seed,
            "global_batch_tokens": p.global_batch_tokens,
            "micro_batch": p.micro_batch,
        },
        "phase": [
            {
                "name": "proxy",
                "steps": steps,
                "seq_len": p.seq_len,
                "mix": dict(zip(names(cfg), proxy.mix)),
                "lr": {"warmup_steps": min(p.warmup_steps, steps), "shape": "cosine"},
            }
        ],
        "optim": {"lr": p.lr, "min_lr": p.min_lr},
        "run": {
            "output_dir": str(run_dir),
            "seed": proxy.seed,
            "threads": p.threads,
            "log_every": steps,
            "val_every": steps,
            "val_batches": p.val_batches,
        },
        "checkpoint": {"interval": 0},
        "metrics": {"plot": False, "tensorboard": False},
    }
    # a whole table (`optim={…}`) replaces every key of it the recipe above sets ([proxy]'s values)
    sets = [f"{sec}.{k}" for sec, table in raw.items() if isinstance(table, dict) for k in table]
    searched = list(dict.fromkeys((*OWNED, *LENGTH, *sets)))
    for item in p.set:
        if "=" not in item:  # it was parse_override's line, whose example is a command's --set (RV74c 6)
            raise ConfigError(
                f"proxy.set {item!r}: each entry is KEY=VALUE of the proxies' training recipe, e.g. "
                'proxy.set = ["optim.weight_decay=0.05"]',
                key="proxy.set",
            )
        key = item.split("=", 1)[0].strip()
        if covered := [k for k in searched if k.startswith(f"{key}.")]:
            raise ConfigError(
                f"proxy.set {item!r}: a whole [{key}] would replace {', '.join(covered)}, which the search "
                f"sets; set its keys one by one ({key}.KEY=…)",
                key="proxy.set",
            )
        if key.startswith(OWNED):
            raise ConfigError(
                f"proxy.set {item!r}: {key} is the search's own (each proxy's directory, data, mixture and "
                "seeds); set the [proxy], [data], [swarm] or [validation] key instead",
                key="proxy.set",
            )
        if key.split(".")[0] == "schedule":  # its refusal would name a [schedule] no recipe here has
            raise ConfigError(
                f"proxy.set {item!r}: a proxy is one [[phase]] of the search's (proxy.tokens long, warmup "
                "proxy.warmup_steps, then cosine from proxy.lr to proxy.min_lr), not a [schedule]; set "
                "those [proxy] keys instead",
                key="proxy.set",
            )
        if key in LENGTH:
            raise ConfigError(
                f"proxy.set {item!r}: each proxy trains proxy.tokens in batches of proxy.global_batch_tokens "
                f"at proxy.seq_len (its steps and its validation at the last one follow from them), so {key} "
                f"would train another length or do nothing; set {LENGTH[key]} instead",
                key="proxy.set",
            )
        if key in SKIPPING:
            raise ConfigError(
                f"proxy.set {item!r}: a proxy that skips steps is not evidence of its mixture (its losses "
                "are of fewer updates than the others'): a diverging proxy stops the search, exit 3; lower "
                "proxy.lr instead",
                key="proxy.set",
            )
        if key in FROM_PROXY:  # proxy.set won, and OUT/config.toml and the console named [proxy]'s (R25b 5)
            raise ConfigError(
                f"proxy.set {item!r}: [proxy] sets {key} for every proxy (and the search's config.toml and "
                f"console name its value); set {FROM_PROXY[key]} instead",
                key="proxy.set",
            )
    return config_from(TrainConfig, raw, p.set, "the proxy recipe", flag="proxy.set")


# Keys of a proxy's recipe that the search sets per proxy: proxy.set may not change them.
OWNED = ("run.output_dir", "run.seed", "data.seed", "data.sources", "data.val_fraction", "phase")
# Keys that let a proxy skip a non-finite step and go on: proxies that skipped 13 of 14 steps were
# fitted and gated as evidence, exit 0 (trial RV62b 1).
SKIPPING = ("run.on_nonfinite", "run.max_skipped")
# Keys that decide a proxy's length, which [proxy] owns: proxy.set's global_batch_tokens trained
# steps × it (not proxy.tokens), its data.seq_len nothing (the phase's seq_len is proxy.seq_len), its
# run.max_steps, val_every or log_every a proxy without its last step's validation (no evidence).
LENGTH = {
    "data.global_batch_tokens": "proxy.global_batch_tokens",
    "data.seq_len": "proxy.seq_len",
    "run.max_steps": "proxy.tokens",
    "run.val_every": "proxy.tokens",
    "run.log_every": "proxy.tokens",
}


def _recipe(tc: TrainConfig) -> dict[str, Any]:
    """What a proxy trains, wherever its directory is: the applied recipe without run.output_dir."""
    d = applied_config(tc, resolve(tc))
    del d["run"]["output_dir"]
    return d


def proxy_key(tc: TrainConfig, fingerprints: dict[str, str], base: dict[str, Any] | None = None) -> str:
    """A proxy's key: its recipe, its sources' fingerprints, its base, and the test faults set (a
    proxy trained under GRISTMILL_FAULT_* is other evidence: a search run with one left set changed
    every proxy, and a clean rerun reused them as this recipe's: review R25h 1)."""
    keyed = {"recipe": _recipe(tc), "fingerprints": fingerprints}
    if base:
        keyed["base"] = base
    if faults := faults_set():
        keyed["faults"] = faults
    return json_sha256(keyed)[:12]


def base_identity(tc: TrainConfig, say: Callable[[str], None]) -> dict[str, Any] | None:
    """The base model the proxies start from (proxy.set's model.init_from) as their runs record it
    (RUN/base/base.json: a directory and the sha256 of its weights files, or a hub id pinned to its
    commit), read once a search; None without one. Part of each proxy's key and checked in its
    evidence, as the sources' fingerprints are: the recipe holds only the path, and a base replaced
    there is other runs (review R16a F1). A hub base is its pinned commit alone (weights_sha256
    None), which names its bytes: every proxy fetches that commit, so its hash, which base.json
    records since review R25d S1, is not taken again (nor the key of proxies from before changed)."""
    if not tc.model.init_from:
        return None
    source = locate_base(tc.model.init_from, say=say)
    if hub_id(source.identity) is not None:
        return {"init_from": source.identity, "weights_sha256": None}
    say(f"model.init_from: hashing the weights of {source.identity} (the proxies' evidence is of them)")
    return base_weights(source.identity, source.directory)


def base_change(run_dir: Path, base: dict[str, Any]) -> str | None:
    """Why run `run_dir` did not start from the base `base` (base_identity), or None when it did."""
    try:
        record = read_base_record(run_dir)
    except GristmillError as e:
        return str(e)
    then = None if record is None else {k: record.get(k) for k in base}
    if then == base:
        return None
    if then is not None and base["weights_sha256"] is None and then["init_from"] == base["init_from"]:
        return None  # a hub base's commit (base_identity): its record's hashes are of that commit
    if then is None:
        return f"it records no base ({run_dir / BASE_DIR / BASE_JSON}); the proxies' is {base['init_from']}"
    if then["init_from"] != base["init_from"]:
        return f"its base was {then['init_from']}, the proxies' is {base['init_from']}"
    was, now = then["weights_sha256"] or {}, base["weights_sha256"] or {}
    changed = [f for f in sorted(set(was) | set(now)) if was.get(f) != now.get(f)]
    return f"the weights of its base {base['init_from']} were replaced since ({', '.join(changed)})"


def run_dir_of(out: Path, proxy: Proxy, key: str) -> Path:
    return out / proxy.group / f"{proxy.slot}-{key}"


# The proxy recipe's keys that [proxy] sets: proxy.set may not change them (train_config), and a
# refusal of that recipe is said in the search's keys (but proxy.set's refusal names proxy.set's key).
FROM_PROXY = {
    "data.global_batch_tokens": "proxy.global_batch_tokens",
    "data.micro_batch": "proxy.micro_batch",
    "phase[0].seq_len": "proxy.seq_len",
    "phase[0].lr warmup": "proxy.warmup_steps",
    "model.preset": "proxy.preset",
    "optim.lr": "proxy.lr",
    "optim.min_lr": "proxy.min_lr",
    "run.val_batches": "proxy.val_batches",
    "run.threads": "proxy.threads",
}


def in_search_keys(message: str, cfg: MixConfig) -> str:
    """A refusal of the proxies' training recipe, its keys named as the search's recipe sets them."""
    own = {item.split("=", 1)[0].strip() for item in cfg.proxy.set}
    for train_key, key in FROM_PROXY.items():
        if train_key.split(" ")[0] not in own:
            message = re.sub(rf"(?<![\w.\[]){re.escape(train_key)}(?!\w)", key, message)
    return message


def open_mix_sources(cfg: MixConfig) -> list[DocumentTable]:
    """Each source's training split, opened once for the whole search as the trainer opens it (one
    tokenizer across them, no dataset twice): its tokens and fingerprint, and every proxy's plan."""
    n = len(cfg.data.sources)
    probe = None
    try:
        probe = train_config(cfg, Proxy("swarm", "probe", (1.0 / n,) * n, 0))
        spec = check_config(probe, 1)
        tables = open_sources(spec)
        # the trainer's model checks too (a proxy longer than max_seq_len): refused here, not by every
        # proxy's run (or a commands.sh of runs the trainer refuses: review R18h 1); a base's with the
        # base, as the trainer and --plan check it (its vocabulary, tokenizer, shape, positions: a
        # commands.sh of runs its base refuses, trial RV66a F3)
        model_for_data(probe, spec, tables[0].info, None)
    except ConfigError as e:
        raise ConfigError(in_search_keys(str(naming_override(e, probe)), cfg), key=e.key) from None
    return tables


def source_changes(sources: list[tuple[str, str]], fingerprints: dict[str, str]) -> str | None:
    """One line naming each source (name, dataset) whose dataset is no longer the one the search
    started on (another fingerprint, or none readable now); None when every one is."""
    changed = []
    for name, dataset in sources:
        try:
            fingerprint = str(dataset_info(dataset).get("fingerprint"))
            now, same = f"{fingerprint[:12]}… now", fingerprint == fingerprints[name]
        except GristmillError as e:
            now, same = f"none readable now ({e})", False
        if not same:
            changed.append(f"source {name!r} ({dataset}) changed during the search: fingerprint "
                           f"{fingerprints[name][:12]}… at its start, {now}")  # fmt: skip
    if not changed:
        return None
    return (
        "; ".join(changed) + ". No proxy's evidence mixes the two datasets (a proxy that ran while it "
        "changed was cleared); rerun once the source is as it should be: proxies of the new data are "
        "other runs"
    )


def check_supply(cfg: MixConfig, proxy: Proxy, tables: list[DocumentTable]) -> None:
    """The trainer's own rule (the plan's max_epochs check), before any proxy trains; its refusal
    said in the search's keys."""
    tc = train_config(cfg, proxy)
    try:
        build_plan(tc, check_config(tc, 1), tables).check_supply()
    except PlanError as e:
        raise ConfigError(
            f"proxy.tokens = {tokens_shown(cfg.proxy.tokens)} at the mixture of "
            f"{proxy.label(names(cfg))}: {e}",
            key="proxy.tokens",
        ) from None


def check_held_out(cfg: MixConfig, proxy: Proxy, tables: list[DocumentTable]) -> None:
    """A held-out split too small for proxy.val_batches, refused before any proxy trains (every
    proxy's trainer refused it once the search had started, and --write-commands wrote runs the
    trainer refuses: trial RV57a F3); the same for every mixture, so checked at one (`proxy`, within
    the bounds: a mixture outside them was the plan's refusal, in the trainer's keys, review RV57c 1)."""
    tc = train_config(cfg, proxy)
    spec = check_config(tc, 1)
    try:
        validation_of(
            tc, spec, batch_shapes(tc, spec, 1), build_plan(tc, spec, tables), last_step=spec.last_step,
            vocab_size=tables[0].info["vocab_size"], device=torch.device("cpu"), world_size=1,
            settings={"rank": 0, "world_size": 1},
        )  # fmt: skip
    except LoaderConfigError as e:  # its cause: the loader's advice is the trainer's (turning
        # validation off is none of a proxy's)
        raise ConfigError(
            # by its keys: a source's own val_fraction wins over data.val_fraction (trial RV70b 2)
            f"{in_search_keys(e.cause, cfg)}; lower proxy.val_batches or raise its held-out fraction "
            f"({VAL_FRACTION_KEYS})",
            key="proxy.val_batches",
        ) from None


REBUILT = "rebuilt: "  # read_evidence's reason for a run of datasets since rebuilt (find_stale names them)


def read_evidence(
    run_dir: Path, tc: TrainConfig, fingerprints: dict[str, str], base: dict[str, Any] | None
) -> tuple[dict[str, float] | None, str]:
    """The run's held-out losses at its last step if its records show it trained this recipe on these
    datasets (from the base `base`: base_identity) to the end; else None and why not."""
    if not (run_dir / CONFIG_TOML).is_file():
        return None, "no run there"
    try:
        saved = load_train_config(str(run_dir / CONFIG_TOML), [])
        same = _recipe(saved) == _recipe(tc)
    except GristmillError as e:
        return None, f"its config.toml does not load ({e})"
    if not same:
        return None, f"{ANOTHER_RECIPE} ({'; '.join(config_changes(_recipe(tc), _recipe(saved))[:3])})"
    plan = recorded_plan(run_dir)
    recorded = {s["name"]: s.get("fingerprint") for s in (plan or {}).get("sources", [])}
    if recorded != fingerprints:
        changed = [n for n in fingerprints if recorded.get(n) != fingerprints[n]]
        return None, REBUILT + ", ".join(
            f"source {n!r} was rebuilt since ({str(recorded.get(n))[:12]}… then, {fingerprints[n][:12]}… now)"
            for n in changed
        )
    metrics = run_dir / METRICS_JSONL
    if not metrics.is_file():
        return None, "unfinished: no metrics.jsonl"
    rows = kept_rows(read_metrics(metrics)[0])
    steps = tc.phase[0].steps
    last = [r for r in rows if r["step"] == steps]
    wanted = [f"val/{n}" for n in fingerprints]
    if not last or any(k not in last[-1] for k in wanted):
        return None, f"unfinished: no row of its last step ({steps}) with every source's held-out loss"
    # held-out losses as numbers: null or text was a traceback, NaN or inf a fit, a proposal and
    # validation runs of NaN, exit 0 (trial RV62b 5)
    losses = {n: last[-1][f"val/{n}"] for n in fingerprints}
    bad = [n for n, v in losses.items() if type(v) not in (int, float) or not math.isfinite(v)]
    if bad:
        return None, f"its last row's val/{bad[0]} is {json.dumps(losses[bad[0]])}, not a held-out loss"
    if base is not None and (changed := base_change(run_dir, base)):
        return None, REBUILT + changed
    return {n: float(v) for n, v in losses.items()}, ""


def find_stale(
    out: Path,
    proxy: Proxy,
    tc: TrainConfig,
    fingerprints: dict[str, str],
    key: str,
    base: dict[str, Any] | None,
) -> list[str]:
    """Lines for runs of this slot trained on datasets, or from a base, since rebuilt or replaced (kept
    aside, never read)."""
    lines = []
    for other in sorted((out / proxy.group).glob(f"{proxy.slot}-*")):
        if other.name == f"{proxy.slot}-{key}" or not other.is_dir():
            continue
        _, why = read_evidence(other, tc, fingerprints, base)
        if why.startswith(REBUILT):
            reason = why.removeprefix(REBUILT)
            lines.append(f"{proxy.group}/{proxy.slot}: {reason}: {other} is not used; training it again")
    return lines


# How the pool's workers start. Forked (Linux, as the trainer forks its loader's workers), they begin
# with what the search imported, the trainer included (Pool.train): one import of torch for all
# proxy.parallel workers and its pages shared, where each spawned one started an interpreter and
# imported torch again (3-4 CPU s). Not Linux: spawned (fork is unsafe on macOS).
WORKER_START = "fork" if sys.platform.startswith("linux") else "spawn"


_STOPPED: Any = None  # in a worker: the search's event, set once it stops (Pool.__exit__)


def _worker_start(search: int, stopped: Any) -> None:
    """A pool worker's first act: end with the search, `search` its pid (taken before the start: a
    spawned worker whose start, seconds of imports, ended after the search's death took the reaper
    for it and trained its queued proxy for nothing), and keep `stopped`, the event the search sets
    as it stops. Imported here: a search that trains nothing never imports training.run.shutdown
    (torch.distributed)."""
    from training.run.shutdown import exit_with_parent

    global _STOPPED
    _STOPPED = stopped
    # forked inside the search's sigterm_raises: an idle worker's SIGTERM (a scheduler's, to the whole
    # group) raised Terminated in the pool's queue wait, a traceback (review RV71f 3), and a Ctrl-C's
    # SIGINT KeyboardInterrupt (RV71h 2); a proxy's training takes either with its own handler, an idle
    # worker ends as SIGTERM ends a process, and leaves a Ctrl-C to the search, which ends it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(search)


STOPS = (Terminated, KeyboardInterrupt)  # the search's own stop: its workers are ended with it

# A worker's reply: a source changed, the run refused, or it diverged (its cause, without the trainer's
# advice: `gristmill train` commands that set optim.lr, where the search's key is proxy.lr)
CHANGED, REFUSED, DIVERGED, STOPPED = "changed", "refused", "diverged", "stopped"


def _train_in_worker(
    tc: TrainConfig, log: str, sources: list[tuple[str, str]], fingerprints: dict[str, str]
) -> tuple[str, str] | None:
    """A pool worker's job: one `gristmill train` run in this process, its console in RUN/train.log,
    on the datasets the search started on (checked before and after: source_changes). None when it
    ran; else (CHANGED, the line), (DIVERGED, what happened) or (REFUSED, the run's one-line error)."""
    from training.train import train  # forked: the search imported it; spawned: the first job does

    if _STOPPED is not None and _STOPPED.is_set():
        # queued in the pool before the search stopped (Ctrl-C, a proxy's refusal): a Ctrl-C trained
        # every queued proxy before the search ended (trial RV62b 3)
        return STOPPED, "the search stopped"
    if changed := source_changes(sources, fingerprints):
        return CHANGED, changed
    refused = None
    # the trainer leaves its own SIGTERM/SIGINT handlers after a run (a note, no exit): kept, a broken
    # pool's terminate() of this worker (another one killed: the OOM killer) is swallowed, and its join
    # hangs the search (seen while RV71f 3 was mended)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with (
            open(log, "w", encoding="utf-8") as f,
            contextlib.redirect_stdout(f),
            contextlib.redirect_stderr(f),
        ):
            try:
                train(tc, out=f)
            except GristmillError as e:
                print(f"error: {e}", file=f)
                refused = (DIVERGED, e.cause) if isinstance(e, NonFiniteError) else (REFUSED, str(e))
    except Exception:  # a dataset replaced under the reader fails anyhow; said as what it is
        if changed := source_changes(sources, fingerprints):
            clear(Path(tc.run.output_dir))
            return CHANGED, changed
        raise
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if changed := source_changes(sources, fingerprints):  # it may have read either dataset
        clear(Path(tc.run.output_dir))
        return CHANGED, changed
    return refused


class Pool:
    """Trains proxies, proxy.parallel at a time, in workers kept for the whole search (WORKER_START),
    on the search's sources (`cfg`) as `fingerprints` identify them."""

    def __init__(self, parallel: int, cfg: MixConfig, fingerprints: dict[str, str]):
        self.parallel, self.cfg, self.fingerprints = parallel, cfg, fingerprints
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._stopped: Any = None  # the workers' event: set, a queued job returns at once

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        if self._stopped is not None and exc[0] is not None:
            self._stopped.set()  # jobs the pool handed its workers already: cancel_futures cannot
        if self._executor is not None and exc[0] is not None and issubclass(exc[0], STOPS):
            # the search stopped by SIGTERM or SIGINT (`kill PID`, a scheduler's, a Ctrl-C): waited for, its
            # running proxies trained to their end before it said a word, where the signal reached the
            # search alone (trial RV70b 5, review RV71h 1). They end at once: a proxy has no checkpoints
            # and trains again from its start anyway; a SIGTERM forwarded instead, a worker that died
            # before its trainer's handler hung the pool's shutdown (review RV71f 3).
            # (_processes: the pool's own {pid: process}; it has no public list of its workers)
            for worker in list(self._executor._processes.values()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
        if self._executor is not None:
            # Waited for on an error too: the workers' running proxies end as they would at the
            # interpreter's exit, whose own wake of the pool's thread raced that thread's close of its
            # pipe (CPython 3.11: "Exception ignored … Bad file descriptor" on a refusal's terminal).
            self._executor.shutdown(wait=True, cancel_futures=True)

    def train(
        self,
        jobs: list[tuple[str, TrainConfig, Path]],
        say: Callable[[str], None],
        describe: Callable[[int], str],
        later: int = 0,
    ) -> None:
        """Train every job (label, recipe, run directory): a line as the first ones start, then one
        as each ends, with the time left for these and the `later` runs still to come after them."""
        if not jobs:
            return
        if self._executor is None:
            if WORKER_START == "fork":  # once for every worker; a search that trains nothing never does
                # and torch._dynamo, which the optimizer's constructor imports (~0.5 CPU s a worker)
                import torch._dynamo  # noqa: F401

                import training.train  # noqa: F401
            # a worker outlives no `mix propose` (killed, or its terminal closed): it would train on
            # for nothing, holding cores (training.run.shutdown.exit_with_parent)
            context = multiprocessing.get_context(WORKER_START)
            self._stopped = context.Event()
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.parallel,
                mp_context=context,
                initializer=_worker_start,
                initargs=(os.getpid(), self._stopped),
            )
        t0 = time.monotonic()
        futures = {}
        sources = [(s.name, s.dataset) for s in self.cfg.data.sources]
        for i, (_, tc, run_dir) in enumerate(jobs):
            run_dir.mkdir(parents=True, exist_ok=True)
            log = str(run_dir / "train.log")
            futures[self._executor.submit(_train_in_worker, tc, log, sources, self.fingerprints)] = i
        first = [label for label, _, _ in jobs[: self.parallel]]
        say(f"  training {len(jobs)}, {self.parallel} at a time; started {', '.join(first)}")
        done = 0
        for fut in concurrent.futures.as_completed(futures):
            i = futures[fut]
            label, _, run_dir = jobs[i]
            try:
                reply = fut.result()
            except concurrent.futures.BrokenExecutor:  # a worker killed: a traceback (trial RV62b 4)
                raise GristmillError(
                    f"a worker of the search died while proxies trained (killed: the OOM killer? {label} was "
                    f"among them, in {run_dir}); run the search again: finished proxies are reused"
                ) from None
            if reply is not None and reply[0] == CHANGED:
                raise GristmillError(reply[1])
            if reply is not None and reply[0] == DIVERGED:
                lr, what = self.cfg.proxy.lr, in_search_keys(reply[1], self.cfg)
                raise NonFiniteError(
                    f"proxy {label} ({run_dir}) diverged: {what}; run the search again with a lower proxy.lr "
                    f"(now {lr:g}; e.g. {lr / 10:g}): a new recipe, every proxy trains again"
                )
            if reply is not None:
                raise GristmillError(
                    f"proxy {label} ({run_dir}) refused to train: {in_search_keys(reply[1], self.cfg)}"
                )
            done += 1
            elapsed = time.monotonic() - t0
            left = elapsed / done * (len(jobs) - done + later)
            then = f" with the {later} validation runs" if later else ""
            say(
                f"  {done}/{len(jobs)} {label}: {describe(i)} ({_duration(elapsed)}"
                + (f", ~{_duration(left)} to go{then})" if left else ")")
            )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def parallelism(cfg: MixConfig, jobs: int) -> int:
    workers = cfg.proxy.parallel or max(1, (os.cpu_count() or 1) // cfg.proxy.threads)
    return max(1, min(workers, jobs))


ANOTHER_RECIPE = "its config.toml is another recipe"


def clear(run_dir: Path) -> None:
    """A proxy directory that is not evidence (an unfinished run): emptied for a fresh run."""
    shutil.rmtree(run_dir, ignore_errors=True)


def make_room(run_dir: Path, why: str) -> str | None:
    """A proxy directory that is not evidence (`why`), made room for a fresh run: the search's own
    (unfinished, of a rebuilt source) emptied; a run of another recipe (one trained by hand with other
    settings, a --write-commands line given --set data.micro_batch=8: trial RV62b 2) moved aside to
    NAME.aside-N, never deleted, and that place returned."""
    if not why.startswith(ANOTHER_RECIPE) and not why.startswith("its config.toml does not load"):
        clear(run_dir)
        return None
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.aside-{n}")).exists():
        n += 1
    run_dir.rename(aside)
    return str(aside)
