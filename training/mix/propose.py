"""`gristmill mix propose --config configs/mix/demo.toml --out DIR`: a mixture from proxy runs.

    prior (token-proportional) → swarm (Dirichlet around it) → proxies (real training runs) → the
    held-out losses → the fit (cross-validated) → the proposal (its argmin under the constraints)
    → validation (proposal, uniform, token-proportional on every seed) → the gate → DIR/report.json,
    DIR/proposal.toml, DIR/mix.png

Every step resumes: a rerun reuses each proxy whose run recorded this recipe on these datasets
(training/mix/proxies.py). With --write-commands the missing proxies are written as `gristmill
train` lines for a cluster's scheduler instead of trained here; rerun once they are done. An
earlier search's outputs in DIR are moved to DIR/earlier/N/, never overwritten.

Honest about noise: the report's `warnings` (each also said in the terminal) name what makes a
proposal weak — one validation seed, a proposal on a constraint bound, a proposal outside the
swarm's range — and its `noise` puts the validation seeds' spread beside the fit's leave-one-out
error and explains the gap between the predicted and the validated loss.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from training.config import TrainConfig
from training.contract.atomic_write import write_atomic
from training.contract.config_loader import (
    ConfigError,
    PathArgument,
    add_config_arguments,
    save_config,
    tokens_shown,
)
from training.contract.errors import GristmillError, sigterm_raises
from training.contract.run_layout import artifact_in, dataset_around
from training.mix import fit as mix_fit
from training.mix import simplex
from training.mix.proxies import (
    REBUILT,
    Evidence,
    Pool,
    Proxy,
    base_identity,
    check_held_out,
    check_supply,
    find_stale,
    make_room,
    open_mix_sources,
    parallelism,
    proxy_key,
    read_evidence,
    run_dir_of,
    train_config,
)
from training.mix.recipe import MixConfig, load_mix_config, names, swarm_size, target_weights
from training.plotting import agg_pyplot
from training.run.faults import fault_warnings
from training.run.lock import RunLock, check_unlocked

SEARCH = ("gristmill mix propose", "give this one another --out")  # who holds OUT (RunLock)
REPORT_JSON, PROPOSAL_TOML, MIX_PNG, COMMANDS_SH = "report.json", "proposal.toml", "mix.png", "commands.sh"
EARLIER = "earlier"  # DIR/earlier/N/: an earlier search's outputs, with the config.toml they answer to
BASELINES = ("uniform", "proportional")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "configs/mix/demo.toml", "proxy.tokens=50000 swarm.size=9")
    parser.add_argument(
        "--out",
        required=True,
        action=PathArgument,
        local=True,
        help="the search's directory: proxies, report.json, proposal.toml, mix.png",
    )
    parser.add_argument(
        "--write-commands",
        action="store_true",
        help=f"write the proxies still missing as `gristmill train` lines to OUT/{COMMANDS_SH} "
        "(for a cluster's "
        "scheduler) instead of training them here; rerun once they have run",
    )


def bounds(cfg: MixConfig, tokens: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each source's weight range: constraints.min/max_weight, at least one sequence of a proxy's
    step, and at most what its max_epochs allows in a proxy (proxy.tokens) and in the run the
    proposal is for (constraints.run_tokens at constraints.run_batch_tokens and run_seq_len)."""
    c, p = cfg.constraints, cfg.proxy
    # the plan gives every source of a mixture at least one sequence per step (training/data/plan.py)
    one_sequence = np.ceil(1e4 * p.seq_len / p.global_batch_tokens) / 1e4
    lo = np.full(len(tokens), max(c.min_weight, one_sequence))
    hi = np.full(len(tokens), c.max_weight)
    n = len(tokens)
    if one_sequence > c.min_weight and one_sequence * n > 1.0 - 1e-9:
        raise ConfigError(
            f"proxy.global_batch_tokens = {p.global_batch_tokens} holds {p.global_batch_tokens // p.seq_len} "
            f"sequences of proxy.seq_len = {p.seq_len} a step and each of the {n} sources takes at least "
            f"one, which leaves no mixture to search; raise proxy.global_batch_tokens well above "
            f"{n * p.seq_len} (e.g. {4 * n * p.seq_len}) or lower proxy.seq_len",
            key="proxy.global_batch_tokens",
        )
    for key, value, cap in epoch_caps(cfg, tokens):
        hi = np.minimum(hi, cap)
        seq_key = "constraints.run_seq_len" if key == RUN_TOKENS and c.run_seq_len else "proxy.seq_len"
        seq = c.run_seq_len if seq_key == "constraints.run_seq_len" else p.seq_len
        tiny = [s for s in cfg.data.sources if s.max_epochs is not None and tokens[s.name] <= 2 * (seq + 1)]
        if tiny and ((hi < lo).any() or hi.sum() < 1.0):
            # no max_epochs reads it: "raise a source's max_epochs" could not help (trial RV62b 9)
            small = tiny[0]
            raise ConfigError(
                f"source {small.name!r} holds {tokens[small.name]:,} tokens, no more than two windows of "
                f"{seq_key} + 1 = {seq + 1} tokens, which an epoch's end may leave unread: no max_epochs "
                "lets a mixture read it; add documents to it, or leave it out",
                key="data.sources",
            )
        if hi.sum() < 1.0 or (hi < lo).any():
            fits = ", ".join(
                f"{s.name} ≤ {h:.4g} ({tokens[s.name]:,} tokens, max_epochs {s.max_epochs})"
                for s, h in zip(cfg.data.sources, hi)
            )
            raise ConfigError(
                f"{key} = {tokens_shown(value)} would read a source past its max_epochs in every mixture "
                f"(weights that fit: {fits}; constraints.min_weight {c.min_weight}); lower {key}, "
                "add data, or raise a source's max_epochs"
                + (_run_assumed(cfg, cfg.data.sources) if key == RUN_TOKENS else ""),
                key=key,
            )
    return lo, hi


RUN_TOKENS = "constraints.run_tokens"


def epoch_caps(cfg: MixConfig, tokens: dict[str, int]) -> list[tuple[str, float, np.ndarray]]:
    """(key, its value, each source's largest weight) for each budget that caps weights by max_epochs:
    proxy.tokens, and constraints.run_tokens when given (inf for a source without max_epochs)."""
    c, p = cfg.constraints, cfg.proxy

    def most(epochs: int, supply: int, budget: float, batch: float, seq_len: int) -> float:
        """The largest weight whose run of `budget` tokens in steps of `batch` at `seq_len` reads at
        most `epochs` epochs of `supply` tokens, as the trainer's plan reads (training/data/plan.py):
        windows of seq_len + 1 tokens, within one window of the weight's share of the budget; each
        step within two windows of its share; and at each epoch end the tail that cannot hold the
        next step's windows dropped, fewer than that step's (≤ weight × batch / seq_len + 2
        windows). So weight × (budget + (epochs - 1) × batch) × (s + 1) / s + 2 × epochs ×
        (seq_len + 1) ≤ epochs × supply (a 2% margin in place of the tails was refused at run_tokens
        by a run of few large steps with max_epochs 2, review R25c 1). The tokens read per token
        trained, (s + 1) / s, are taken at s = the shorter of seq_len and proxy.seq_len: a run at a
        longer seq_len reads fewer, by far more than its few longer windows add (at its bare tokens,
        the trainer refused a proposal on the bound: R16a F3), and one at a shorter seq_len reads
        more. The tails are windows of the run's `seq_len`: two windows of proxy.seq_len held no
        tail of a run at 2048 (refused by the trainer, review R25j 3)."""
        s = min(seq_len, p.seq_len)
        room = epochs * (supply - 2 * (seq_len + 1))
        return max(room, 0) * s / ((s + 1) * (budget + (epochs - 1) * batch))

    proxy_budget = (p.tokens // p.global_batch_tokens) * p.global_batch_tokens
    # not known: a step as large as the run (any batch fits under that cap)
    run_batch = c.run_batch_tokens or c.run_tokens
    run_seq = c.run_seq_len or p.seq_len  # not given: proxy.seq_len (said where the cap binds)
    out = []
    for budget, batch, seq, key, value in (
        (proxy_budget, p.global_batch_tokens, p.seq_len, "proxy.tokens", p.tokens),
        (c.run_tokens, run_batch, run_seq, RUN_TOKENS, c.run_tokens),
    ):
        if budget:
            cap = [
                np.floor(most(s.max_epochs, tokens[s.name], budget, batch, seq) * 1e4) / 1e4
                if s.max_epochs is not None
                else np.inf
                for s in cfg.data.sources
            ]
            out.append((key, value, np.array(cap)))
    return out


def _run_assumed(cfg: MixConfig, sources: list) -> str:
    """What the run_tokens cap assumed of the run, said where that cap refuses or binds `sources`:
    its batch when constraints.run_batch_tokens is not given and one of them may be read more than
    once (a source read once drops no tail at an epoch end), its seq_len when run_seq_len is not."""
    c, said = cfg.constraints, []
    if not c.run_batch_tokens and any((s.max_epochs or 0) > 1 for s in sources):
        said.append(
            "constraints.run_batch_tokens is not given: a step as large as the run is assumed, so a "
            "source's epochs past the first are not counted on; set it to the run's largest global batch"
        )
    if not c.run_seq_len:
        said.append(
            "constraints.run_seq_len is not given: the run is assumed to read windows of proxy.seq_len; "
            "set it to the run's longest seq_len"
        )
    return f" ({'; '.join(said)})" if said else ""


def run(args: argparse.Namespace) -> int:
    with sigterm_raises():  # a SIGTERM stops the search in one line, its running proxies too (RV70b 5)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    cfg = load_mix_config(args.config, args.overrides)
    out = Path(args.out)
    # its config.toml is replaced by the recipe: a dataset's or a run's was, exit 0 (review R22b F4)
    if (inside := dataset_around(out)) is not None:  # its runs' files in a dataset it does not record
        raise ConfigError(
            f"--out {out} {inside}, which does not record it: give the search a directory outside it"
        )
    if (held := artifact_in(out)) is not None:
        raise ConfigError(
            f"--out {out} {held}, whose config.toml the search would replace with its recipe; give the "
            "search a directory of its own"
        )
    sources = names(cfg)
    w = np.array(target_weights(cfg))
    tables = open_mix_sources(cfg)
    tokens = {n: t.tokens for n, t in zip(sources, tables)}
    fingerprints = {n: str(t.info.get("fingerprint", "")) for n, t in zip(sources, tables)}
    lo, hi = bounds(cfg, tokens)
    caps = epoch_caps(cfg, tokens)
    prior = simplex.prior([tokens[n] for n in sources], lo, hi)
    target_text = ", ".join(f"{n} {x:g}" for n, x in zip(sources, w) if x)
    _say(
        f"gristmill mix propose → {out}: target {target_text}; {len(sources)} sources: "
        + ", ".join(f"{n} {tokens[n]:,} tokens ({fingerprints[n][:12]}…)" for n in sources)
    )
    _say(f"prior (token-proportional): {_mix_text(sources, prior)}")
    for line in fault_warnings():  # each proxy's train.log says it too, which nobody reads (R25h 1)
        _say(line)
    try:
        points = simplex.swarm(prior, swarm_size(cfg), cfg.swarm.seed, cfg.swarm.concentration, lo, hi)
    except simplex.TooFewMixtures as e:
        ranges = ", ".join(f"{n} {a:.4g}–{b:.4g}" for n, a, b in zip(sources, lo, hi))
        raise ConfigError(
            f"swarm.size = {swarm_size(cfg)}: only {e.found} distinct mixture(s) (at 4 decimals) were found "
            f"within the weights' bounds ({ranges}: constraints.min_weight/max_weight, one sequence of a "
            "proxy step each, max_epochs); widen the bounds or lower swarm.size",
            key="swarm.size",
        ) from None
    swarm = [
        Proxy("swarm", f"p{i:02d}", tuple(float(x) for x in r), cfg.data.seed) for i, r in enumerate(points)
    ]
    for proxy in swarm:  # every proxy's plan checked before the first trains
        check_supply(cfg, proxy, tables)
    check_held_out(cfg, swarm[0], tables)
    # one search per --out: a second one cleared the first one's proxies while they trained and
    # wrote its outputs beside the other's config.toml (review R16a F4)
    with RunLock(out, SEARCH) as lock:
        if lock.note:
            _say(lock.note)
        base = base_identity(train_config(cfg, swarm[0]), _say)  # refused: OUT as it was (R16e)
        _keep_earlier(out)  # none of an earlier search's outputs stays beside this recipe, none is lost
        save_config(cfg, out / "config.toml")
        if base is not None:
            # the proxies train the base as resolved (a directory's real path, a hub id's commit),
            # which their RUN/config.toml records: a relative path, a link or an unpinned hub id
            # was another recipe to the evidence check, and no proxy was ever evidence (R16d F1)
            resolved = f"model.init_from={json.dumps(base['init_from'])}"
            cfg = replace(cfg, proxy=replace(cfg.proxy, set=[*cfg.proxy.set, resolved]))
        warnings = []
        if len(cfg.validation.seeds) == 1:  # said now: the search can still be stopped and rerun
            warnings.append(_warn(ONE_SEED.format(seeds=cfg.validation.seeds)))
        # what each trains: proxy.tokens rounds down to whole steps (it said "30,000 tokens" of proxies
        # that trained 14 × 2,048 = 28,672, review R25c 5)
        steps = int(cfg.proxy.tokens // cfg.proxy.global_batch_tokens)
        if cfg.proxy.warmup_steps >= steps:  # accepted in silence (trial RV57a F6)
            warnings.append(_warn(
                f"proxy.warmup_steps = {cfg.proxy.warmup_steps} is not shorter than a proxy ({steps} steps): "
                "every proxy trains in its warmup, below proxy.lr"
            ))  # fmt: skip
        runs = len(swarm) + 3 * len(cfg.validation.seeds)
        workers = parallelism(cfg, runs)
        with Pool(workers, cfg, fingerprints) as pool:
            model = f"from the base {base['init_from']}" if base else cfg.proxy.preset
            batch = cfg.proxy.global_batch_tokens
            _say(
                f"swarm: {len(swarm)} proxies of {steps} steps × {batch:,} = {steps * batch:,} tokens "
                f"({model}), {workers} at a time; then {runs - len(swarm)} validation runs"
            )
            later = runs - len(swarm)
            found = _gather(cfg, out, swarm, fingerprints, base, w, pool, args.write_commands, later)
            if found is None:
                return 0
            X = np.array([p.mix for p in swarm])
            Y = np.array([[found[p].losses[n] for n in sources] for p in swarm])
            fitted = mix_fit.fit(X, Y, w)
            proposal = simplex.rounded(mix_fit.argmin(fitted.predict, lo, hi, cfg.swarm.seed), lo, hi)
            predicted = float(fitted.predict(proposal)[0])
            _say(
                f"fit: {fitted.kind} (leave-one-out error {fitted.cv_error:.4f}); "
                f"proposal {_mix_text(sources, proposal)}, "
                f"predicted target {predicted:.4f} (best proxy {float((Y @ w).min()):.4f})"
            )
            outside = _outside_swarm(sources, proposal, X)
            untrained = _untrained(float((Y @ w).min()), tables[0].info["vocab_size"])
            warnings += [
                _warn(line)
                for line in (untrained, _on_bound(cfg, sources, proposal, lo, hi, caps), outside)
                if line
            ]
            mixes = {
                "proposal": proposal,
                "uniform": simplex.uniform(len(sources), lo, hi),
                "proportional": prior,
            }
            # proxies that learned nothing: the gate returns the prior whatever the validation runs
            # measured, so none is trained (they were: review RV62e 10a)
            seeds = list(cfg.validation.seeds) if untrained is None else []
            validation = [
                Proxy("validation", f"s{seed}-{name}", tuple(float(x) for x in mixes[name]), seed)
                for seed in seeds
                for name in mixes
            ]
            for proxy in validation:
                check_supply(cfg, proxy, tables)
            if seeds:
                _say(f"validation: {len(mixes)} mixtures × seeds {seeds}")
            else:
                _say(f"validation: {NOT_VALIDATED}")
            checked = _gather(cfg, out, validation, fingerprints, base, w, pool, args.write_commands)
            if checked is None:
                return 0
        losses = {
            name: [_target(checked[p].losses, sources, w) for p in validation if p.slot.endswith("-" + name)]
            for name in mixes
        }
        # proxies that learned nothing measured no mixture: their proposal "beat" the baselines by
        # noise and was kept (trial RV62b 1)
        passed = untrained is None and mix_fit.gate(
            losses["proposal"], losses["uniform"], losses["proportional"]
        )
        noise = _noise(fitted, mixes, losses, outside is not None, seeds, cfg.data.seed, base is not None)
        report = {
            "sources": sources,
            "prior": dict(zip(sources, prior.tolist())),
            "proposal": dict(zip(sources, proposal.tolist())),
            "swarm": [
                {
                    "mix": dict(zip(sources, p.mix)),
                    "run_dir": str(found[p].run_dir),
                    "target_loss": _target(found[p].losses, sources, w),
                    "per_source_loss": found[p].losses,
                    "reused": found[p].reused,
                }
                for p in swarm
            ],
            "fit": {"kind": fitted.kind, "cv_error": fitted.cv_error},
            "predicted": predicted,
            # each mixture as trained (uniform and the prior are projected into the bounds: "uniform"
            # was 0.3598/0.3599/0.2803, which report.json did not say, review R25c 4)
            "validation": {
                "seeds": seeds,
                **losses,
                "mix": {name: dict(zip(sources, mixes[name].tolist())) for name in mixes},
            },
            "gate_returned_prior": not passed,
            "fingerprints": fingerprints,
            "base": base,
            "noise": noise,
            "warnings": warnings,
        }
        write_atomic(out / REPORT_JSON, json.dumps(report, indent=1) + "\n")
        write_atomic(
            out / PROPOSAL_TOML,
            _proposal_toml(
                args,
                sources,
                prior,
                proposal,
                losses,
                seeds,
                passed,
                warnings,
                bool(untrained),
            ),
        )
        for line in _validation_table(losses, seeds):
            _say(line)
        _say(f"noise: {noise['explanation']}")
        note = plot_search(report, fitted, w, out / MIX_PNG)
        chosen = proposal if passed else prior
        _say(
            (
                "gate: the proposal beats uniform and token-proportional on every seed"
                if passed
                else "gate: the proxies learned nothing (the warning above); returning the prior"
                if untrained
                else "gate: the proposal did not beat both baselines on every seed; returning the prior"
            )
            + f" → mix = {_toml_mix(sources, chosen)} ({out / PROPOSAL_TOML}; {out / REPORT_JSON}; "
            + (note or str(out / MIX_PNG))
            + f"; {time.monotonic() - t0:.0f} s)"
            + (f"; {len(warnings)} warning{'s' * (len(warnings) > 1)} above" if warnings else "")
        )
        return 0


ONE_SEED = (
    "validation.seeds = {seeds} has one seed: one seed cannot measure seed noise, so the gate's verdict "
    "is weak; use ≥ 2 (e.g. validation.seeds = [1, 2])"
)


NOT_VALIDATED = "the proxies learned nothing: the gate returns the prior whatever they would measure"


def _untrained(best: float, vocab_size: int) -> str | None:
    """Where even the best proxy's target loss is no better than a uniform guess over the vocabulary
    (ln V nats): the proxies learned nothing of the data (an LR that blew them up: 250-450 nats at
    proxy.lr = 3, trial RV57a F6), and the fit, the proposal and the gate are of noise."""
    if best < math.log(vocab_size):
        return None
    return (
        f"the best proxy's target loss, {best:.4f}, is no better than a uniform guess over the "
        f"{vocab_size:,}-token vocabulary (ln {vocab_size:,} = {math.log(vocab_size):.4f}): the proxies "
        "learned nothing, and the fit and the proposal are of noise; lower proxy.lr or raise proxy.tokens"
    )


def _warn(line: str) -> str:
    _say(f"warning: {line}")
    return line


def _keep_earlier(out: Path) -> None:
    """An earlier search's outputs (report.json, proposal.toml, mix.png), with the config.toml they
    answer to, moved to OUT/earlier/N/ (N = 1, 2, …): a rerun never overwrites them. commands.sh is
    a to-do list, not a result: removed (a rerun writes what is still missing)."""
    (out / COMMANDS_SH).unlink(missing_ok=True)
    kept = [out / name for name in (REPORT_JSON, PROPOSAL_TOML, MIX_PNG) if (out / name).exists()]
    if not kept:
        return
    taken = [int(d.name) for d in (out / EARLIER).glob("*") if d.name.isdigit()]
    dest = out / EARLIER / str(max(taken, default=0) + 1)
    dest.mkdir(parents=True)
    for path in [*kept, out / "config.toml"]:
        if path.exists():
            path.rename(dest / path.name)
    _say(f"the earlier search's {', '.join(p.name for p in kept)} moved to {dest}/ (with its config.toml)")


def _on_bound(
    cfg: MixConfig, sources: list[str], proposal, lo: np.ndarray, hi: np.ndarray, caps
) -> str | None:
    """The warning for a proposal on a bound of the constrained simplex, each bound by its key
    (`caps`: epoch_caps, the max_epochs caps, to name the one that binds)."""
    c, at = cfg.constraints, []
    for i, name in enumerate(sources):
        x = float(proposal[i])
        if x >= hi[i] - 1e-9:
            binding = [key for key, _, cap in caps if np.isclose(hi[i], cap[i])]
            if np.isclose(hi[i], c.max_weight) or not binding:
                why = f"constraints.max_weight = {c.max_weight:g}"
            else:
                # what the run cap assumed, only where it is what binds (review R25j 2)
                assumed = _run_assumed(cfg, [cfg.data.sources[i]]) if RUN_TOKENS in binding else ""
                why = f"the most its max_epochs allows at {' and '.join(binding)}{assumed}"
            at.append(f"{name} = {x:.4g} ({why})")
        elif x <= lo[i] + 1e-9:
            why = (
                f"constraints.min_weight = {c.min_weight:g}"
                if np.isclose(lo[i], c.min_weight)
                else "one sequence of a proxy's step, the least a source of a mixture gets"
            )
            at.append(f"{name} = {x:.4g} ({why})")
    if not at:
        return None
    return (
        f"the proposal sits on a constraint bound: {', '.join(at)}; the fit's best may lie beyond it, "
        "where no proxy trained"
    )


def _outside_swarm(sources: list[str], proposal, X: np.ndarray) -> str | None:
    """The warning for a proposal outside the range of weights the swarm's proxies trained."""
    out = [
        f"{name} = {float(proposal[i]):.4g} (the swarm's {X[:, i].min():.4g}–{X[:, i].max():.4g})"
        for i, name in enumerate(sources)
        if not X[:, i].min() - 1e-9 <= proposal[i] <= X[:, i].max() + 1e-9
    ]
    if not out:
        return None
    return (
        f"the proposal lies outside the swarm's range: {', '.join(out)}; its predicted loss is an "
        "extrapolation (a larger swarm.size, or a lower swarm.concentration, spreads the proxies further)"
    )


def _noise(
    fitted: mix_fit.Fit,
    mixes: dict[str, np.ndarray],
    losses: dict[str, list[float]],
    outside: bool,
    seeds: list[int],
    swarm_seed: int,
    from_base: bool = False,
) -> dict[str, Any]:
    """The validation seeds' spread beside the fit's leave-one-out error, and the gap between each
    mixture's predicted and validated loss, explained as far as the figures go. On a seed other than
    the swarm's, the baselines' mean gap estimates that seed's shift from the swarm's only if the
    fit is exact at the baselines, which nothing measures (said as an estimate: review R16a F2);
    on the swarm's own seed there is no shift, and each gap is the fit's miss at its mixture,
    measured (review R16d F7). The shift and the proposal's miss beyond it are taken over the other
    seeds alone: averaged with the swarm's own, the miss mixed a measurement into an estimate
    (review R25c 3); the own seed's gaps are said apart (`own_seed_gap`). `from_base`: the proxies
    start from a base model, whose weights no seed changes (a seed moves its data order alone)."""
    predicted = {name: float(fitted.predict(mixes[name])[0]) for name in mixes}
    spread = {name: float(np.ptp(v)) if len(v) > 1 else None for name, v in losses.items()}
    if not seeds:  # no validation runs (proxies that learned nothing): nothing measured beside the fit
        return {
            "cv_error": fitted.cv_error,
            "seed_spread": spread,
            "predicted": predicted,
            "gap": None,
            "shift": None,
            "own_seed_gap": None,
            "explanation": f"no validation runs ({NOT_VALIDATED})",
        }
    own = [k for k, seed in enumerate(seeds) if seed == swarm_seed]
    others = [k for k, seed in enumerate(seeds) if seed != swarm_seed]

    def gap_on(ks: list[int]) -> dict[str, float]:  # validated mean over those seeds − predicted
        return {name: float(np.mean([losses[name][k] for k in ks])) - predicted[name] for name in mixes}

    gap = gap_on(list(range(len(seeds))))

    def gaps_text(shown: dict[str, float]) -> str:
        return (
            f"the proposal validated {shown['proposal']:+.4f} from its predicted "
            f"{predicted['proposal']:.4f}, uniform {shown['uniform']:+.4f} and proportional "
            f"{shown['proportional']:+.4f} from theirs: "
        )

    own_gap = gap_on(own) if own else None
    shift, text = None, ""
    if not others:
        text += gaps_text(gap) + (
            "the validation runs have the swarm's own seed, so no seed shift: each gap is the fit's own "
            f"miss at that mixture{' (the proposal an extrapolation)' if outside else ''}, beside its "
            f"leave-one-out error {fitted.cv_error:.4f}; "
        )
    else:
        other_gap = gap_on(others)
        value = float(np.mean([other_gap[b] for b in BASELINES]))
        shift = {"seeds": [seeds[k] for k in others], "shift": value, "miss": other_gap["proposal"] - value}
        on = (
            f"on validation seed{'s' * (len(others) > 1)} {shift['seeds']} (not the swarm's), " if own else ""
        )
        # the gaps shown are those the mean is of: over all seeds, they did not add up to it when the
        # swarm's own seed was among them (review R25j 1)
        moves = "data order and initialisation"
        if from_base:  # no seed changes a base's weights
            moves = "data order: the proxies start from one base"
        text += (
            f"{on}{gaps_text(other_gap)}if the fit is exact at the baselines, {value:+.4f} (their mean gap) "
            f"is the validation seeds' shift from the swarm's seed ({moves}; every mixture moves with it) "
            f"and {shift['miss']:+.4f} the fit's own miss at the proposal"
            f"{' (an extrapolation)' if outside else ''}; its leave-one-out error is {fitted.cv_error:.4f}; "
        )
        if own_gap:
            text += (
                f"validation seed {swarm_seed} is the swarm's own, so no shift there: the fit's miss "
                f"measured, proposal {own_gap['proposal']:+.4f}, uniform {own_gap['uniform']:+.4f}, "
                f"proportional {own_gap['proportional']:+.4f}; "
            )
    means = [float(np.mean(v)) for v in losses.values()]
    if spread["proposal"] is None:
        text += "one validation seed: the seeds' spread is not measured"
    else:
        text += (
            f"the seeds spread a mixture's loss by up to {max(spread.values()):.4f}, the mixtures' mean "
            f"losses differ by {max(means) - min(means):.4f}"
        )
    return {
        "cv_error": fitted.cv_error,
        "seed_spread": spread,
        "predicted": predicted,
        "gap": gap,
        "shift": shift,
        "own_seed_gap": own_gap,
        "explanation": text,
    }


def _say(line: str) -> None:
    print(line, flush=True)


def _mix_text(sources: list[str], mix) -> str:
    return ", ".join(f"{n} {float(x):.4f}" for n, x in zip(sources, mix))


def _toml_mix(sources: list[str], mix) -> str:
    return "{ " + ", ".join(f"{n} = {float(x):.4g}" for n, x in zip(sources, mix)) + " }"


def _target(losses: dict[str, float], sources: list[str], w: np.ndarray) -> float:
    """The target loss of one run: its held-out losses weighted as [target] says."""
    return float(sum(wi * losses[n] for n, wi in zip(sources, w)))


def _gather(
    cfg: MixConfig,
    out: Path,
    proxies: list[Proxy],
    fingerprints: dict[str, str],
    base: dict[str, Any] | None,
    w: np.ndarray,
    pool: Pool,
    write_commands: bool,
    later: int = 0,
) -> dict[Proxy, Evidence] | None:
    """Each proxy's evidence: reused where its run recorded it, trained (or, with --write-commands,
    written as a command) where not. None when commands were written instead. `later`: the runs
    still to come after these (the time left counts them)."""
    sources = names(cfg)
    planned: dict[Proxy, tuple[TrainConfig, Path]] = {}
    found: dict[Proxy, Evidence] = {}
    jobs: dict[Path, tuple[str, TrainConfig, Path]] = {}  # one run per directory
    for proxy in proxies:
        key = proxy_key(train_config(cfg, proxy), fingerprints, base)
        run_dir = run_dir_of(out, proxy, key)
        tc = train_config(cfg, proxy, run_dir)
        planned[proxy] = (tc, run_dir)
        losses, why = read_evidence(run_dir, tc, fingerprints, base)
        if losses is not None:
            found[proxy] = Evidence(run_dir, losses, reused=True)
            continue
        for line in find_stale(out, proxy, tc, fingerprints, key, base):
            _say(line)
        if run_dir not in jobs:
            if why != "no run there":
                # not a run another `gristmill train` (a --write-commands line) is training now
                check_unlocked(run_dir, ("gristmill train", "rerun the search once it has ended"))
                why = why.removeprefix(REBUILT)
                aside = make_room(run_dir, why)
                kept = f"; moved it to {aside}" if aside else ""
                _say(f"{proxy.group}/{proxy.slot}: {why} in {run_dir}{kept}; training it again")
            jobs[run_dir] = (proxy.label(sources), tc, run_dir)
    if found:
        _say(f"  {len(found)} of {len(proxies)} reused (their runs recorded this recipe on these datasets)")
    todo = list(jobs.values())
    if write_commands and todo:
        _write_commands(out, todo)
        return None

    trained: dict[Path, dict[str, float]] = {}

    def describe(i: int) -> str:  # read once, as each run ends: its line, and its evidence below
        _, tc, run_dir = todo[i]
        losses, why = read_evidence(run_dir, tc, fingerprints, base)
        if losses is None:
            return why.removeprefix(REBUILT)
        trained[run_dir] = losses
        return f"target {_target(losses, sources, w):.4f}"

    pool.train(todo, _say, describe, later)
    for proxy, (tc, run_dir) in planned.items():
        if proxy in found:
            continue
        if run_dir not in trained:  # a run stopped early (SIGTERM, Ctrl-C) returns without its last row
            _, why = read_evidence(run_dir, tc, fingerprints, base)
            raise GristmillError(
                f"proxy {proxy.label(sources)} did not finish ({why.removeprefix(REBUILT)}; "
                f"{run_dir / 'train.log'}); "
                "rerun to go on"
            )
        found[proxy] = Evidence(run_dir, trained[run_dir], reused=False)
    return found


def _write_commands(out: Path, todo: list[tuple[str, TrainConfig, Path]]) -> None:
    lines = [
        "#!/usr/bin/env bash",
        "# One `gristmill train` per missing proxy (any order, any machine that sees these paths);",
        "# then rerun `gristmill mix propose` with the same --config and --out.",
        "set -euo pipefail",
    ]
    for label, tc, run_dir in todo:
        recipe = run_dir.with_suffix(".toml")
        save_config(tc, recipe)
        lines.append(f"gristmill train --config {shlex.quote(str(recipe))}  # {label}")
    write_atomic(out / COMMANDS_SH, "\n".join(lines) + "\n")
    _say(
        f"wrote {len(todo)} proxy runs to {out / COMMANDS_SH} (a Slurm array: one line per task); "
        "rerun when they are done"
    )


def _validation_table(losses: dict[str, list[float]], seeds: list[int]) -> list[str]:
    if not seeds:
        return []
    lines = [f"  {'seed':>6} " + " ".join(f"{name:>13}" for name in losses)]
    for k, seed in enumerate(seeds):
        lines.append(f"  {seed:>6} " + " ".join(f"{losses[name][k]:>13.4f}" for name in losses))
    return ["validation (target loss per seed):", *lines]


def _proposal_toml(
    args, sources, prior, proposal, losses, seeds, passed: bool, warnings: list[str], untrained: bool
) -> str:
    runs = (
        "; ".join(
            f"seed {s}: proposal {losses['proposal'][k]:.4f}, uniform {losses['uniform'][k]:.4f}, "
            f"proportional {losses['proportional'][k]:.4f}"
            for k, s in enumerate(seeds)
        )
        or f"none ({NOT_VALIDATED})"
    )
    command = ["gristmill", "mix", "propose", "--config", args.config, "--out", args.out]
    if args.overrides:
        command += ["--set", *args.overrides]
    # relative paths are the working directory's: named, or the line ran nowhere else (trial RV57a F6)
    where = "" if all(Path(x).is_absolute() for x in (args.config, args.out)) else f"# in {Path.cwd()}\n"
    head = f"# {shlex.join(command)}\n{where}# validation: {runs}\n" + "".join(
        f"# warning: {x}\n" for x in warnings
    )
    if passed:
        return (
            head + f"# the proposal beat both baselines on every seed\nmix = {_toml_mix(sources, proposal)}\n"
        )
    # why, as the console says it: "did not beat" was false of proxies that learned nothing (trial RV62f 3)
    why = (
        "is of proxies that learned nothing (the warning above)"
        if untrained
        else "did not beat both baselines on every seed"
    )
    return head + (
        f"# the gate returned the prior (token-proportional): the proposal {_toml_mix(sources, proposal)} "
        f"{why}\nmix = {_toml_mix(sources, prior)}\n"
    )


def plot_search(report: dict[str, Any], fitted: mix_fit.Fit, w: np.ndarray, path: Path) -> str | None:
    """mix.png: left, the swarm's target losses against the fit (two sources: along the second
    source's weight, the fitted curve through them; more: each proxy's observed loss against the
    fit's leave-one-out prediction); right, on the same loss axis (so a difference between mixtures
    looks as large as it is next to the swarm's), each mixture's validation runs per seed, the fit's
    prediction for it and the seeds' spread. A note instead of the path when matplotlib is missing."""
    plt = agg_pyplot(required=False)
    if plt is None:
        return "note: matplotlib is not installed; no mix.png (pip install matplotlib)"
    sources = report["sources"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    X = np.array([[e["mix"][n] for n in sources] for e in report["swarm"]])
    t = np.array([e["target_loss"] for e in report["swarm"]])
    proposal = np.array([report["proposal"][n] for n in sources])
    prior = np.array([report["prior"][n] for n in sources])
    if len(sources) == 2:
        name = sources[1]
        grid = np.linspace(0, 1, 201)
        R = np.stack([1 - grid, grid], axis=1)
        ax.plot(grid, fitted.predict(R), color="C0", label=f"fit ({report['fit']['kind']})")
        ax.scatter(X[:, 1], t, color="k", s=18, zorder=3, label="swarm proxies")
        ax.axvline(proposal[1], color="C3", ls="--", label=f"proposal ({name} {proposal[1]:.3f})")
        ax.axvline(prior[1], color="C2", ls=":", label=f"prior ({name} {prior[1]:.3f})")
        ax.scatter([proposal[1]], [report["predicted"]], color="C3", marker="*", s=120, zorder=4)
        ax.set_xlabel(f"weight of {name}")
    else:
        ax.scatter(fitted.loo, t, color="k", s=18, label="swarm proxies")
        lim = [min(t.min(), fitted.loo.min()), max(t.max(), fitted.loo.max())]
        ax.plot(lim, lim, color="C0", label=f"y = x ({report['fit']['kind']})")
        ax.set_xlabel("leave-one-out predicted target loss")
    ax.set_ylabel("target loss (held-out)")
    ax.set_title(f"swarm and fit (leave-one-out error {report['fit']['cv_error']:.4f})")
    ax.legend(fontsize=8)
    v, noise = report["validation"], report["noise"]
    names = ("proposal", *BASELINES)
    for j in range(len(v["seeds"])):  # one seed's three runs joined: the gate compares within a seed
        bx.plot(range(3), [v[name][j] for name in names], color="0.75", lw=1, zorder=1)
    for k, name in enumerate(names):
        color = f"C{[3, 1, 2][k]}"
        bx.scatter(
            [k] * len(v[name]), v[name], color=color, s=30, label="validated, per seed" if k == 0 else None
        )
        bx.scatter(
            [k], [noise["predicted"][name]], marker="D", facecolors="none", edgecolors=color, s=60,
            label="predicted by the fit" if k == 0 else None,
        )  # fmt: skip
        if len(v[name]) > 1:  # the seeds' spread of this mixture
            bx.vlines(
                k - 0.12, min(v[name]), max(v[name]), color=color, lw=3, alpha=0.5,
                label="the seeds' spread" if k == 0 else None,
            )  # fmt: skip
        for seed, y in zip(v["seeds"], v[name]):
            bx.annotate(f"seed {seed}", (k, y), fontsize=7, xytext=(4, 0), textcoords="offset points")
    bx.set_xticks(range(3), list(names))
    bx.set_xlim(-0.5, 2.7)
    bx.legend(fontsize=8)
    verdict = "prior returned" if report["gate_returned_prior"] else "proposal kept"
    spread = [x for x in noise["seed_spread"].values() if x is not None]
    seeds = f"seed spread ≤ {max(spread):.4f}" if spread else "one seed: spread not measured"
    if not v["seeds"]:
        seeds = "no validation runs: the proxies learned nothing"
    bx.set_title(f"validation: {verdict} ({seeds})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
