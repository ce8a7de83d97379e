"""The mixture search's recipe (configs/mix/*.toml): a dataclass tree, one documented field each,
loaded like every other config (unknown keys are errors), and its checks.

The sources are `[[data.sources]]` exactly as in a training recipe (training.config.SourceSection):
one home for what a source is. The proxy is a small `gristmill train` recipe built from [proxy]
(training/mix/proxies.py); anything else of it goes through `proxy.set`, dotted train keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from training.config import SourceSection
from training.config_checks import check_run_seed
from training.contract.config_loader import ConfigError, load_config, tokens_shown


@dataclass
class MixDataSection:
    sources: list[SourceSection] = field(default_factory=list)
    """The datasets to mix (`[[data.sources]]`, as in a training recipe: name, dataset, max_epochs,
    val_fraction). Every proxy trains on all of them, each at its weight."""
    val_fraction: float = 0.02
    """Fraction of each source held out (a source's own val_fraction wins). The held-out documents
    do not depend on any seed, so every proxy is scored on the same ones."""
    seed: int = 1234
    """The swarm's data order (data.seed of its proxies); validation runs use their own seeds."""


@dataclass
class TargetSection:
    """What the search minimises: one of `mix` and `source`."""

    mix: dict[str, float] = field(default_factory=dict)
    """A held-out mix: weight per source (normalised), e.g. { prose = 0.2, code = 0.8 }. The target
    loss is that weighted sum of the per-source held-out losses."""
    source: str = ""
    """Or one source's held-out loss."""


@dataclass
class ProxySection:
    """The small model every proxy trains: a one-phase `gristmill train` recipe."""

    preset: str = "demo"
    """Model preset (training.model.PRESETS)."""
    tokens: float = 100_000
    """Training tokens per proxy (rounded down to whole steps of global_batch_tokens)."""
    seq_len: int = 128
    """Tokens per sequence."""
    global_batch_tokens: int = 2048
    """Tokens per optimizer step."""
    micro_batch: int = 16
    """Sequences per forward/backward."""
    lr: float = 3e-3
    """Peak learning rate (linear warmup, then cosine to min_lr)."""
    min_lr: float = 3e-4
    """Learning rate at the last step."""
    warmup_steps: int = 10
    """Warmup steps."""
    val_batches: int = 4
    """Held-out global batches per source scored at the last step (the same ones for every proxy)."""
    threads: int = 1
    """torch threads per proxy (run.threads): 1 makes each proxy bit-reproducible on CPU."""
    parallel: int = 0
    """Proxies trained at once (each in a worker process that imports torch once); 0: the machine's
    cores // threads."""
    set: list[str] = field(default_factory=list)
    """More keys of the proxies' training recipe, as `gristmill train --set` takes them
    (e.g. ["optim.weight_decay=0.1", "run.device=cuda"]); they are part of the evidence's key. Not
    the keys [proxy] or the search set (refused with the key to set instead: training/mix/proxies.py)."""


@dataclass
class SwarmSection:
    size: int = 0
    """Proxy mixtures sampled around the prior; 0: 3 × sources + 5. At least sources + 2 (the fit's
    cross-validation needs points to spare). Raising it later reuses the proxies already run."""
    seed: int = 0
    """Seed of the sampling (the same seed gives the same mixtures, in the same order)."""
    concentration: float = 1.0
    """Dirichlet concentration around the prior: α = concentration × sources × prior (1.0 spreads
    as widely as uniform sampling of the simplex at a uniform prior; larger stays nearer the prior)."""


@dataclass
class ConstraintsSection:
    min_weight: float = 0.0
    """Every source's weight in the swarm and the proposal is at least this."""
    max_weight: float = 1.0
    """…and at most this."""
    run_tokens: float = 0.0
    """Tokens of the run the proposal is for: each source's weight is capped so that run reads it at
    most its max_epochs times (0: no cap beyond the proxies' own budget)."""
    run_batch_tokens: float = 0.0
    """That run's global batch in tokens, its largest phase's for a batch schedule: each epoch end of
    a source read more than once drops up to one step's share of the batch of its phase (the
    trainer's plan), which the cap counts (0: not known, so a step as large as run_tokens: a
    source's epochs past the first are not counted on)."""
    run_seq_len: int = 0
    """That run's seq_len, its longest phase's: the tails the cap counts are windows of it, and a
    run at a shorter seq_len than proxy.seq_len reads more tokens per token trained (0: not known,
    taken as proxy.seq_len; a run at a longer one drops longer tails)."""


@dataclass
class ValidationSection:
    seeds: list[int] = field(default_factory=lambda: [1, 2])
    """The proposal, the uniform and the token-proportional mixes are each trained once per seed
    (data.seed and run.seed); the proposal must beat both on every seed or the prior is returned."""


@dataclass
class MixConfig:
    data: MixDataSection = field(default_factory=MixDataSection)
    """The sources."""
    target: TargetSection = field(default_factory=TargetSection)
    """The loss to minimise."""
    proxy: ProxySection = field(default_factory=ProxySection)
    """The proxy recipe."""
    swarm: SwarmSection = field(default_factory=SwarmSection)
    """The sampled mixtures."""
    constraints: ConstraintsSection = field(default_factory=ConstraintsSection)
    """Bounds on every mixture."""
    validation: ValidationSection = field(default_factory=ValidationSection)
    """The do-no-harm gate's runs."""


def load_mix_config(path: str, overrides: list[str]) -> MixConfig:
    cfg = load_config(MixConfig, path, overrides)
    check_mix_config(cfg)
    return cfg


def names(cfg: MixConfig) -> list[str]:
    return [s.name for s in cfg.data.sources]


def swarm_size(cfg: MixConfig) -> int:
    return cfg.swarm.size or 3 * len(cfg.data.sources) + 5


def target_weights(cfg: MixConfig) -> list[float]:
    """The target as one weight per source (in the sources' order), summing to 1."""
    if cfg.target.source:
        return [float(n == cfg.target.source) for n in names(cfg)]
    total = sum(cfg.target.mix.values())
    return [cfg.target.mix.get(n, 0.0) / total for n in names(cfg)]


def _weight(key: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ConfigError(f"{key} = {value}: a weight must be in [0, 1]", key=key)


def check_mix_config(cfg: MixConfig) -> None:
    """What the recipe alone can refuse (the repetition limits need the datasets: proxies.bounds)."""
    sources = names(cfg)
    if len(sources) < 2:
        raise ConfigError("[[data.sources]]: a mixture search needs at least 2 sources", key="data.sources")
    for i, name in enumerate(sources):
        if not name or sources.index(name) != i:
            raise ConfigError(
                f"data.sources[{i}].name = {name!r}: each source needs its own name", key="data.sources"
            )
    if not 0.0 < cfg.data.val_fraction < 1.0:
        raise ConfigError(
            f"data.val_fraction = {cfg.data.val_fraction}: the held-out losses are the search's evidence; "
            "set it in (0, 1), e.g. 0.02",
            key="data.val_fraction",
        )
    for i, src in enumerate(cfg.data.sources):  # a source's own wins; a proxy is scored on every one
        if src.val_fraction is not None and not 0.0 < src.val_fraction < 1.0:
            raise ConfigError(
                f"data.sources[{i}].val_fraction = {src.val_fraction} (source {src.name!r}): every source's "
                "held-out loss is the search's evidence; set it in (0, 1) or leave it to data.val_fraction",
                key=f"data.sources[{i}].val_fraction",
            )
    t = cfg.target
    if bool(t.mix) == bool(t.source):
        # both: a recipe's target.mix beside a --set target.source (trial RV74b 2), which an empty
        # target.mix makes the target
        both = (
            "give one of them, not both (target.mix = {} leaves target.source the target, target.source = "
            '"" leaves target.mix)'
        )
        raise ConfigError(
            "[target]: "
            + (both if t.mix else "give target.mix (e.g. { prose = 0.2, code = 0.8 }) or target.source"),
            key="target",
        )
    known = ", ".join(sources)
    for name in t.mix if t.mix else [t.source]:
        key = f"target.mix.{name}" if t.mix else "target.source"
        if name not in sources:
            raise ConfigError(f"{key}: unknown source {name!r}; the sources are {known}", key=key)
    for name, w in t.mix.items():
        _weight(f"target.mix.{name}", w)
    if t.mix and sum(t.mix.values()) <= 0:
        raise ConfigError(
            "target.mix: the weights sum to 0; give at least one source a weight", key="target.mix"
        )
    c = cfg.constraints
    _weight("constraints.min_weight", c.min_weight)
    _weight("constraints.max_weight", c.max_weight)
    n = len(sources)
    if c.min_weight * n > 1.0 + 1e-9 or c.max_weight * n < 1.0 - 1e-9 or c.min_weight > c.max_weight:
        raise ConfigError(
            f"constraints.min_weight = {c.min_weight} and max_weight = {c.max_weight}: no mixture of {n} "
            f"sources fits (need min_weight ≤ {1 / n:.4g} ≤ max_weight)",
            key="constraints",
        )
    if not 0 <= c.run_tokens < math.inf:  # nan compared false everywhere: the cap was dropped
        raise ConfigError(
            f"constraints.run_tokens = {c.run_tokens}: must be a finite number ≥ 0 (0: no cap)",
            key="constraints.run_tokens",
        )
    if not 0 <= c.run_batch_tokens < math.inf:
        raise ConfigError(
            f"constraints.run_batch_tokens = {c.run_batch_tokens}: must be a finite number ≥ 0 (0: not "
            "known)",
            key="constraints.run_batch_tokens",
        )
    if c.run_seq_len < 0:
        raise ConfigError(
            f"constraints.run_seq_len = {c.run_seq_len}: must be an integer ≥ 0 (0: not known)",
            key="constraints.run_seq_len",
        )
    if cfg.swarm.size and cfg.swarm.size < n + 2:
        raise ConfigError(
            f"swarm.size = {cfg.swarm.size}: at least {n + 2} for {n} sources (the fit's cross-validation "
            "needs points to spare); 0 gives 3 × sources + 5",
            key="swarm.size",
        )
    if not 0 < cfg.swarm.concentration < math.inf:
        raise ConfigError(
            f"swarm.concentration = {cfg.swarm.concentration}: must be a finite number > 0",
            key="swarm.concentration",
        )
    if not cfg.validation.seeds or len(set(cfg.validation.seeds)) != len(cfg.validation.seeds):
        raise ConfigError(
            f"validation.seeds = {cfg.validation.seeds}: give at least one seed, each once (the gate trains "
            "the proposal and both baselines on every seed)",
            key="validation.seeds",
        )
    # each is its proxies' run.seed and data.seed: refused here, not by the first proxy that trains with it
    check_run_seed("data.seed", cfg.data.seed)
    for seed in cfg.validation.seeds:
        check_run_seed("validation.seeds", seed, f"validation.seeds = {cfg.validation.seeds}: {seed}")
    if cfg.swarm.seed < 0:  # numpy's generator refuses it with a traceback
        raise ConfigError(f"swarm.seed = {cfg.swarm.seed}: must be an integer ≥ 0", key="swarm.seed")
    p = cfg.proxy
    for key, value in (("seq_len", p.seq_len), ("global_batch_tokens", p.global_batch_tokens),
                       ("micro_batch", p.micro_batch)):  # fmt: skip
        if value < 1:  # 0 was a division by zero; the trainer's refusal named its own data.seq_len
            raise ConfigError(f"proxy.{key} = {value}: must be an integer ≥ 1", key=f"proxy.{key}")
    if not p.tokens < math.inf:  # nan or inf: a traceback converting it to steps
        raise ConfigError(f"proxy.tokens = {p.tokens}: must be a finite number", key="proxy.tokens")
    if p.tokens < p.global_batch_tokens:
        raise ConfigError(
            f"proxy.tokens = {tokens_shown(p.tokens)}: less than one step of "
            f"proxy.global_batch_tokens = {p.global_batch_tokens}",
            key="proxy.tokens",
        )
    if p.threads < 1 or p.parallel < 0:
        raise ConfigError(
            f"proxy.threads = {p.threads}, proxy.parallel = {p.parallel}: "
            "threads ≥ 1, parallel ≥ 0 (0: cores // threads)",
            key="proxy",
        )
