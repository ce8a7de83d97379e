"""The checks of each section of a `TrainConfig` that need nothing but the config (split from the
schema in training/config.py, which holds only what the keys mean): [model], [parallel] and the mesh
shape, [optim] and its batch-size LR rules, [run] and [run.rewind], [metrics]' trackers,
[checkpoint], [eval], [merge]. The recipe's data side (sources, phases, batch shapes) is resolved and checked
in training/data/spec.py, whose `check_config` runs every check before any work.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from training.config import (
    TRACKERS,
    MergePoints,
    MergeSection,
    MetricsSection,
    ModelSection,
    OptimSection,
    ParallelConfig,
    TrainConfig,
    task_names,
)
from training.contract.config_loader import ConfigError, given, naming_override
from training.contract.errors import GristmillError
from training.contract.run_layout import file_in_the_way, in_a_dataset

BATCH_LR_RULES: dict[str, dict[str, str]] = {
    # optim.name → the optim.batch_lr_scaling rules it supports, each with its evidence
    "adamw": {
        "none": "the LRs as written",
        "sqrt": "Adam's square-root scaling rule (Malladi et al., NeurIPS 2022, 'On the SDEs and Scaling "
        "Rules for Adaptive Gradient Algorithms'; OLMo-core's batch-size warmup scales Adam's LR by √ratio)",
    },
    "muon": {"none": "the LRs as written (no published batch-size rule for Muon that we know of)"},
}
BATCH_LR_RULES["adamw8bit"] = BATCH_LR_RULES["adamw"]  # Adam's update rule, 8-bit moments
_LINEAR_RULE = "linear scaling is SGD's rule (Goyal et al. 2017, 'Accurate, Large Minibatch SGD')"


def batch_lr_factor(rule: str, batch: int, first_batch: int) -> float:
    """The factor optim.batch_lr_scaling `rule` puts on the LR piece of a phase of `batch` tokens per
    step, measured against the first phase's `first_batch` (exactly 1.0 for the same batch)."""
    if rule == "none" or batch == first_batch:
        return 1.0
    return math.sqrt(batch / first_batch) if rule == "sqrt" else batch / first_batch


def check_batch_lr_scaling(optim: OptimSection) -> None:
    """optim.batch_lr_scaling must be a rule optim.name has evidence for (BATCH_LR_RULES)."""
    rule, rules = optim.batch_lr_scaling, BATCH_LR_RULES.get(optim.name, {"none": ""})
    if rule in rules:
        return
    why = _LINEAR_RULE if rule == "linear" else f"{rule!r} is not a rule gristmill knows"
    raise ConfigError(
        f"optim.batch_lr_scaling = {rule!r} is not supported with optim.name = {optim.name!r} ({why}); "
        f"{optim.name} supports {' or '.join(repr(r) for r in rules)} — set optim.batch_lr_scaling to one "
        "of them, or give each phase its lr.peak",
        "optim.batch_lr_scaling",
    )


def check_number(key: str, value: float, *, above_zero: bool = False, note: str = "") -> None:
    """ConfigError unless `value` is finite and ≥ 0 (> 0 with `above_zero`); TOML spells nan and inf
    as plain floats, and every comparison with nan is false, so a `< 0` test alone lets them through."""
    if math.isfinite(value) and (value > 0 if above_zero else value >= 0):
        return
    raise ConfigError(
        f"{key} = {value} is not allowed: it must be a finite number {'> 0' if above_zero else '≥ 0'}{note}",
        key,
    )


# [model] overrides that must be positive numbers when set (None: the preset's value).
_MODEL_POSITIVE_INTS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len")
_MODEL_POSITIVE_FLOATS = ("rope_theta", "norm_eps", "init_std")


def check_seed(key: str, seed: int) -> None:
    """A seed fits in 64 bits, what torch.manual_seed takes (past it, an OverflowError mid-setup) and
    what the loader's order keys read: data.seed = 2**64 drew seed 0's batches (trial RV65b 5)."""
    if not -(2**63) <= seed < 2**64:
        raise ConfigError(f"{key} = {seed} does not fit in 64 bits; use a smaller seed", key)


def check_data_seed(key: str, seed: int) -> None:
    """A seed of the data order (data.seed where a run starts, `data inspect --seed`) is one of 2**64:
    the order's keys keep a seed's low 64 bits, so data.seed = -1 drew seed 2**64 - 1's batches, exit 0
    (trial RV74c 2). Checked where a run starts, as check_run_seed, so an earlier run is still read."""
    if not 0 <= seed < 2**64:
        raise ConfigError(
            f"{key} = {seed} is not allowed: it must be between 0 and {2**64 - 1} (the data order keeps a "
            f"seed's low 64 bits: it would draw as seed {seed % 2**64} does)",
            key,
        )


def check_run_seed(key: str, seed: int, named: str | None = None) -> None:
    """A seed of the weights (run.seed, and a mixture search's seeds, which are its proxies' run.seed) is
    one of 2**32: torch's CPU generator keeps a seed's low 32 bits (run.seed = 0 and 2**32, or -1 and
    2**63 - 1, trained bit-identical models: trial RV72c F2), as the NumPy one the run seeds with it.
    Checked where weights are drawn from it (a run's fresh start: preflight.model_for_data; a search's
    proxies), not with the config, whose check_seed keeps every 64-bit seed so that an earlier run is
    still read, verified and resumed (review RV66e 1). `named`: how the message names the seed where it
    is one of a list (else "KEY = SEED")."""
    if not 0 <= seed < 2**32:
        raise ConfigError(
            f"{named or f'{key} = {seed}'} is not allowed: it must be between 0 and {2**32 - 1} (torch's "
            f"CPU generator keeps a seed's low 32 bits: it would draw as seed {seed % 2**32} does)",
            key,
        )


def check_threads(threads: int) -> None:
    """run.threads at most this machine's CPUs: 100000 was "can't start new thread", a segfault (trial
    RV65b 1). Checked where a process starts its threads (the trainer, its launcher), not with the
    config: a run trained on a bigger machine is read (inspected, verified) anywhere (review RV65e 2)."""
    if threads > (cpus := os.cpu_count() or 1):
        raise ConfigError(
            f"run.threads = {threads} is more than this machine's {cpus} CPUs; give at most {cpus} (0: "
            "torch's default)",
            "run.threads",
        )


def check_model_section(m: ModelSection) -> None:
    """The [model] overrides that are wrong whatever the preset (ModelConfig checks how the shape fits
    together once torch is imported): a zero init_std trains nothing, a zero or negative norm_eps or
    rope_theta makes NaNs."""
    for name in _MODEL_POSITIVE_INTS:
        value = getattr(m, name)
        if value is not None and value < 1:
            raise ConfigError(f"model.{name} = {value} is not allowed: it must be ≥ 1", f"model.{name}")
    if m.loss_chunk is not None and m.loss_chunk < 0:
        raise ConfigError(
            f"model.loss_chunk = {m.loss_chunk} is not allowed: it must be ≥ 0 (0: all at once)",
            "model.loss_chunk",
        )
    for name in _MODEL_POSITIVE_FLOATS:
        value = getattr(m, name)
        if value is not None:
            check_number(f"model.{name}", value, above_zero=True)


def check_parallel_section(p: ParallelConfig) -> None:
    """The [parallel] values that are wrong whatever the world size (mesh_shape checks how replicate
    and shard fit the ranks). The TOML loader already refuses other strings for the Literal keys;
    this also catches a ParallelConfig built in code (benchmarks, tests): training.parallelize calls
    it before it uses one."""
    if p.activation_checkpoint not in ("none", "selective", "full"):
        raise ConfigError(
            f"parallel.activation_checkpoint = {p.activation_checkpoint!r} must be none, selective or full",
            "parallel.activation_checkpoint",
        )
    for key in ("param_dtype", "reduce_dtype"):
        if getattr(p, key) not in ("bfloat16", "float32"):
            raise ConfigError(
                f"parallel.{key} = {getattr(p, key)!r} must be bfloat16 or float32", f"parallel.{key}"
            )
    if p.replicate < 1:
        raise ConfigError(f"parallel.replicate = {p.replicate} must be ≥ 1", "parallel.replicate")
    if p.shard != -1 and p.shard < 1:
        raise ConfigError(
            f"parallel.shard = {p.shard} must be ≥ 1 or -1 (= world_size // replicate)", "parallel.shard"
        )


def mesh_shape(cfg: ParallelConfig, world_size: int) -> tuple[int, int] | None:
    """(replicate, shard) for `world_size` ranks, or None for a single process; checked, no process
    group needed (the trainer calls it before any work, `build_mesh` again on every rank)."""
    check_parallel_section(cfg)  # replicate ≥ 1 and shard ≥ 1 or -1, also for a ParallelConfig built in code
    if world_size == 1:
        if cfg.replicate != 1 or cfg.shard not in (-1, 1):
            n = cfg.replicate * max(cfg.shard, 1)  # the fewest ranks the mesh asks for
            raise GristmillError(
                f"parallel.replicate={cfg.replicate} x parallel.shard={cfg.shard} needs that many ranks, "
                f"but this is a single process; start {n} ranks (on one node `gristmill train … "
                f"--nproc-per-node {n}`; over several, configs/slurm/train.sbatch or torchrun --nnodes), or "
                "set parallel.replicate=1 parallel.shard=-1"
            )
        return None
    shard = cfg.shard
    if shard == -1:
        if world_size % cfg.replicate:
            raise GristmillError(
                f"world size {world_size} is not divisible by parallel.replicate={cfg.replicate}; "
                "choose a replicate count that divides the number of ranks"
            )
        shard = world_size // cfg.replicate
    if cfg.replicate * shard != world_size:
        raise GristmillError(
            f"parallel.replicate={cfg.replicate} x parallel.shard={shard} = {cfg.replicate * shard} ranks, "
            f"but the world size is {world_size}; make the product equal the number of ranks "
            "(or set shard = -1)"
        )
    return cfg.replicate, shard


def check_output_dir(cfg: TrainConfig) -> None:
    """run.output_dir names the run's directory: "" resolved to the working directory, which got the
    run's files (blanks alone are refused when the config is loaded, as any path key's: ConfigPath).
    The trainer's preflight and `gristmill train` before its --plan both call this, so --plan refuses
    what the run refuses (it printed a plan, exit 0: trial RV72c F9); not check_config, which the
    mixture search calls on its proxies' recipes before they have a directory."""
    said = f"run.output_dir = {json.dumps(cfg.run.output_dir)}"
    if not cfg.run.output_dir.strip():
        error = ConfigError(f'{said}: name the run\'s directory, e.g. "runs/train/mine"', "run.output_dir")
        raise naming_override(error, cfg)
    if (there := file_in_the_way(cfg.run.output_dir)) is not None:
        at = "is a file" if there == Path(cfg.run.output_dir).absolute() else f"lies under {there}, a file"
        error = ConfigError(f"{said} {at}; name a directory for the run", "run.output_dir")
        raise naming_override(error, cfg)
    # a dataset's directory, or one inside it: the run replaced its config.toml (the build's recipe, which
    # its validation then failed) and wrote files it does not record (trial RV74c 1)
    if (where := in_a_dataset(cfg.run.output_dir)) is not None:
        error = ConfigError(f"{said} {where}; give the run a directory of its own", "run.output_dir")
        raise naming_override(error, cfg)
    _listable(Path(cfg.run.output_dir))


def _listable(run_dir: Path) -> None:
    """Refuse a run directory this user may write but not list (mode 311), before anything is written:
    each file's atomic write, done, failed at the sync of its folder, said "make it writable", and left a
    checkpoints.jsonl that the next start set aside as an earlier run's (trial RV75e)."""
    try:
        os.stat(run_dir)
    except PermissionError as e:  # a folder above it this user may not enter: said so, not "list it"
        raise GristmillError(
            f"cannot reach {run_dir}: {e.strerror or e}; give this user access to the folders above it, or "
            "write the run somewhere else"
        ) from None
    except OSError:  # missing (made later), a link to nothing: said where it is used
        return
    try:
        with os.scandir(run_dir):
            pass
    except PermissionError as e:
        raise GristmillError(
            f"cannot list {run_dir}: {e.strerror or e}; give this user read access to it (a run lists and "
            "syncs its folder), or write the run somewhere else"
        ) from None
    except OSError:  # not a folder: said where it is used
        pass


def check_training(cfg: TrainConfig, last_step: int) -> None:
    """The checks of [optim], [run], [metrics], [checkpoint] and [eval] that need nothing but the config
    and the plan's `last_step` (the data and batch checks: training/data/spec.check_config)."""
    o, r = cfg.optim, cfg.run
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas = {o.betas} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
    check_number("optim.lr", o.lr, above_zero=True)
    check_batch_lr_scaling(o)
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(
            f"need 0 ≤ optim.min_lr ≤ optim.lr; got lr {o.lr}, min_lr {o.min_lr}", "optim.min_lr"
        )
    check_number("optim.eps", o.eps, above_zero=True)
    check_number("optim.weight_decay", o.weight_decay, note=" (0: no weight decay)")
    check_number("optim.grad_clip", o.grad_clip, note=" (0: no clipping)")
    if not 0.0 <= o.muon_momentum < 1.0:
        raise ConfigError(
            f"optim.muon_momentum = {o.muon_momentum} must be in [0, 1), e.g. 0.95", "optim.muon_momentum"
        )
    if o.muon_ns_steps < 1:
        raise ConfigError(
            f"optim.muon_ns_steps = {o.muon_ns_steps} must be ≥ 1, e.g. 5", "optim.muon_ns_steps"
        )
    check_seed("run.seed", r.seed)  # a run read or resumed; where one starts, check_run_seed as well
    check_seed("data.seed", cfg.data.seed)
    if r.max_steps is not None and not 1 <= r.max_steps <= last_step:
        raise ConfigError(
            f"run.max_steps = {r.max_steps} must be between 1 and the plan's {last_step} steps (it stops a "
            f"run inside its plan; run.max_steps = {last_step} trains to the plan's end, as leaving it out "
            "does; to train past that end, add a [[phase]] after the last: docs/checkpoints.md, Resuming "
            "with changed settings)"
        )
    # one key each: a line naming two keys and two values (one of them a default the user never wrote)
    # said neither which one failed nor the --set that gave it (trial RV78a 3)
    for key, value, least, what in (
        ("run.max_skipped", r.max_skipped, 1, "consecutive non-finite steps skip passes over"),
        ("run.spike_window", r.spike_window, 2, "the losses before it each loss is compared with"),
        ("run.log_every", r.log_every, 1, "steps between printed and recorded lines"),
        ("run.val_every", r.val_every, 0, "steps between validations; 0: none"),
        ("run.val_batches", r.val_batches, 1, "batches per validation"),
    ):
        if value < least:
            raise ConfigError(f"{key} = {value} must be ≥ {least} ({what})", key)
    check_number("run.spike_sigma", r.spike_sigma, note=" (0: no spike detection)")
    trackers_of(cfg.metrics)  # an unknown tracker or a missing package fails before any work
    c = cfg.checkpoint
    for key, value, what in (
        ("checkpoint.interval", c.interval, "save every N steps; 0: only at a SIGTERM or SIGINT"),
        ("checkpoint.keep_last", c.keep_last, "the newest N complete checkpoints kept; 0: all"),
        ("checkpoint.export_interval", c.export_interval, "export every N steps; 0: none"),
    ):
        if value < 0:
            raise ConfigError(f"{key} = {value} must be ≥ 0 ({what})", key)
    check_number("checkpoint.min_free_factor", c.min_free_factor, note=" (0: no free-space check)")
    check_rewind(cfg)  # after checkpoint.interval's own check: a negative one is not "saves none"
    if c.export_interval and not c.interval:  # "a multiple of 0" is no fix (trial RV70a 2)
        raise ConfigError(
            f"checkpoint.export_interval = {c.export_interval} exports the checkpoints of its steps, but "
            "checkpoint.interval = 0 saves one only at a SIGTERM or SIGINT: set checkpoint.interval to a "
            f"divisor of {c.export_interval}, or checkpoint.export_interval = 0",
            "checkpoint.export_interval",
        )
    if c.export_interval and c.export_interval % c.interval:
        raise ConfigError(
            f"checkpoint.export_interval = {c.export_interval} must be a multiple of checkpoint.interval = "
            f"{c.interval} (an export is made from the checkpoint of its step)"
        )
    e = cfg.eval
    named = task_names(e.tasks)
    if (
        e.interval < 0
        or e.limit < 0
        or e.docs < 1
        or e.batch_size < 1
        or e.max_length < 0
        or (e.interval and not named)
    ):
        raise ConfigError(
            f"need eval.interval ≥ 0, eval.limit ≥ 0, eval.docs ≥ 1, eval.batch_size ≥ 1, eval.max_length "
            f"≥ 0 and, with an interval, some eval.tasks; got interval {e.interval}, limit {e.limit}, docs "
            f"{e.docs}, batch_size {e.batch_size}, max_length {e.max_length}, tasks {e.tasks}"
        )
    if e.interval and (missing := missing_eval_module()):
        raise ConfigError(
            f"eval.interval = {e.interval} runs {missing}, or set eval.interval=0", "eval.interval"
        )
    check_merge(cfg.merge, c.interval, {k for k in ("every", "window", "decay") if given(cfg, f"merge.{k}")})


# What lm-eval with its HF model imports (pyproject.toml's `eval` extra): lm-eval itself, transformers
# and accelerate, which lm-eval's HF model imports at its top (without it: a ModuleNotFoundError
# traceback once the eval started, review R23a M3).
EVAL_MODULES = {"lm_eval": "lm-eval", "transformers": "transformers", "accelerate": "accelerate"}


def missing_eval_module() -> str | None:
    """`lm-eval …, which is not installed: FIX` for the first of EVAL_MODULES that is not installed
    (found without importing it), else None."""
    for module, package in EVAL_MODULES.items():
        if importlib.util.find_spec(module) is None:
            needs = "" if module == "lm_eval" else f", which needs {package} (its HF model imports it)"
            return (
                f"lm-eval{needs}, and {package} is not installed: pip install -e '.[eval]' (pyproject.toml's "
                "eval extra)"
            )
    return None


def _default_said(m: MergeSection, key: str, written: set[str]) -> str:
    """The note `(its default)` where merge.`key` was left out (not in `written`): refused as a value it
    was given, it named none (trial RV70a 1, review RV70e 9); a 0 written was called the default too
    (trial RV77b 2a)."""
    return " (its default)" if key not in written and getattr(m, key) == getattr(MergeSection, key) else ""


def check_merge(m: MergeSection, checkpoint_interval: int, written: set[str]) -> None:
    """[merge]: a kind with its one setting (window for "window", decay for "ema"), merge points at
    least one step apart, windows that do not overlap, and a checkpoint at every merge point when the
    merged weights are exported (an export is made from the checkpoint of its step). `written`: its
    keys the config gave (the others are its defaults)."""
    said = lambda key: _default_said(m, key, written)  # noqa: E731
    if m.kind == "none":
        for key, value in (
            ("every", m.every),
            ("window", m.window),
            ("decay", m.decay),
            ("export", m.export),
        ):
            if value != getattr(MergeSection, key):
                raise ConfigError(
                    f"merge.{key} = {json.dumps(value)} is set but merge.kind = 'none' merges nothing: set "
                    "merge.kind = 'window' or 'ema' (or remove it)",
                    f"merge.{key}",
                )
        return
    if not isinstance(m.every, int) or m.every < 1:
        raise ConfigError(
            f"merge.every = {m.every!r}{said('every')} must be an integer ≥ 1 (steps between merge points)",
            "merge.every",
        )
    if m.kind == "window":
        if m.decay != MergeSection.decay:
            raise ConfigError(
                f"merge.decay = {m.decay} is the EMA's, and merge.kind = 'window' averages merge.window "
                "steps: remove merge.decay, or set merge.kind = 'ema'",
                "merge.decay",
            )
        if m.window < 1:  # 0 is its default: said so, not only as a value given (trial RV70a 1)
            raise ConfigError(
                f"merge.window = {m.window}{said('window')} must be ≥ 1: merge.kind = 'window' "
                "averages the steps of "
                f"merge.window at each merge point (1 to merge.every = {m.every})",
                "merge.window",
            )
        if m.window > m.every:
            raise ConfigError(
                f"merge.window = {m.window} is more than merge.every = {m.every}: each merge point averages "
                f"the steps since the one before at most; set merge.window ≤ {m.every} or raise merge.every",
                "merge.window",
            )
    else:
        if m.window != MergeSection.window:
            raise ConfigError(
                f"merge.window = {m.window} is the window's, and merge.kind = 'ema' averages with "
                "merge.decay: remove merge.window, or set merge.kind = 'window'",
                "merge.window",
            )
        if not (math.isfinite(m.decay) and 0.0 < m.decay < 1.0):
            raise ConfigError(
                f"merge.decay = {m.decay}{said('decay')} must be in (0, 1): merge.kind = 'ema' "
                "sets, after each "
                "step, ema ← decay · ema + (1 − decay) · weights (e.g. 0.999)",
                "merge.decay",
            )
    if m.export and checkpoint_interval < 1:  # "a multiple of 0" is no fix (trial RV70a 2)
        raise ConfigError(
            f"merge.export = true exports each merge point's checkpoint, but checkpoint.interval = "
            f"{checkpoint_interval} saves one only at a SIGTERM or SIGINT: set checkpoint.interval to a "
            f"divisor of merge.every = {m.every}, or merge.export = false (its merge points are then kept by "
            "no checkpoint)",
            "merge.export",
        )
    if m.export and m.every % checkpoint_interval:
        # not "set merge.export = false and export later": those merge points are kept by no checkpoint
        # either, and a later export of one refuses (trial RV68b F4)
        raise ConfigError(
            f"merge.export = true exports each merge point's checkpoint, but merge.every = {m.every} is "
            f"not a multiple of checkpoint.interval = {checkpoint_interval}: make it one (with merge.export "
            "= false the merge points between checkpoints would keep no merged weights either)",
            "merge.export",
        )


def merge_unkept(cfg: TrainConfig, last_step: int) -> list[str]:
    """The start's and `--plan`'s note (merge.export = false; true is refused in check_merge) naming
    the merge points of a plan of `last_step` steps that no checkpoint is saved at: their merged
    weights may be scored, but nothing keeps them for `gristmill export RUN --step N --merged`, which
    then refused, and the run had said nothing (trial RV68b F4)."""
    m, c = cfg.merge, cfg.checkpoint
    if m.kind == "none" or m.export:
        return []
    unkept = [p for p in MergePoints(m.every, (last_step,)).upto(last_step) if not c.saves(p, last_step)]
    if not unkept:
        return []
    shown = ", ".join(map(str, unkept[:3])) + (f" and {len(unkept) - 3} more" if len(unkept) > 3 else "")
    if c.interval > 0:
        finer = max(d for d in range(1, min(c.interval, m.every) + 1) if m.every % d == 0)
        fix = (
            f"make merge.every a multiple of checkpoint.interval (e.g. merge.every = "
            f"{-(-m.every // c.interval) * c.interval}, or checkpoint.interval = {finer})"
        )
    else:
        fix = f"set checkpoint.interval (e.g. {m.every})"
    return [
        f"[merge] merge point(s) {shown} fall on no checkpoint (checkpoint.interval = {c.interval}), so "
        f"their merged weights are never kept: `gristmill export {cfg.run.output_dir} --step {unkept[0]} "
        f"--merged` will refuse; {fix}"
    ]


def check_rewind(cfg: TrainConfig) -> None:
    """A rewind needs checkpoints to go back to and a spike rule to act on."""
    r, w = cfg.run, cfg.run.rewind
    for key, value, least in (("skip_steps", w.skip_steps, 1), ("margin_steps", w.margin_steps, 0),
                              ("max_rewinds", w.max_rewinds, 1)):  # fmt: skip
        if not isinstance(value, int) or value < least:
            raise ConfigError(
                f"run.rewind.{key} = {value!r} must be an integer ≥ {least}", f"run.rewind.{key}"
            )
    rewinds = [k for k, v in (("on_spike", r.on_spike), ("on_nonfinite", r.on_nonfinite)) if v == "rewind"]
    if rewinds and cfg.checkpoint.interval < 1:
        other = "report" if rewinds[0] == "on_spike" else "stop"
        raise ConfigError(
            f"run.{rewinds[0]} = 'rewind' goes back to a checkpoint, but checkpoint.interval = "
            f"{cfg.checkpoint.interval} saves none during the run; set checkpoint.interval (e.g. "
            f"{max(1, w.margin_steps)}) or run.{rewinds[0]} = '{other}'",
            "checkpoint.interval",
        )
    if r.on_spike == "rewind" and r.spike_sigma <= 0:
        raise ConfigError(
            "run.on_spike = 'rewind' acts on spikes, but run.spike_sigma = 0 detects none; set "
            "run.spike_sigma (e.g. 6)",
            "run.spike_sigma",
        )


def rewind_unreachable(
    cfg: TrainConfig, last_step: int, saved: Sequence[int] = (), oldest: int = 0, after: int = 0
) -> str | None:
    """The start's warning when no rewind can happen in a plan of `last_step` steps: no checkpoint a
    rewind may go back to (`saved`: the run's, a resume's; its next save on checkpoint.interval's grid
    after step `after`, where it starts) lies between `oldest` (the timeline's oldest target) and every
    step − run.rewind.margin_steps. A fresh run's has none saved and starts at 0; a resume's was never
    warned (review RV64d 6). Not an error: such a run trains as the rule's fallback does (a spike
    reported, a non-finite step stopping the run)."""
    r, interval = cfg.run, cfg.checkpoint.interval
    rewinds = [k for k, v in (("on_spike", r.on_spike), ("on_nonfinite", r.on_nonfinite)) if v == "rewind"]
    margin = r.rewind.margin_steps
    # a spike's own step is judged before it is saved: margin 0 goes back one step at least
    newest = last_step - max(margin, 1)
    # a resume with no step left to train has no spike to rewind (trial RV68b F1)
    if not rewinds or interval < 1 or after >= last_step:
        return None
    following = (after // interval + 1) * interval  # the next save on the grid
    if following <= newest or any(oldest <= s <= newest for s in saved):
        return None
    if not saved and after == 0:
        why = f"its first checkpoint (checkpoint.interval = {interval}) is after"
    else:
        have = ", ".join(f"step {s}" for s in sorted(saved)[-3:]) or "none in the run directory"
        later = (
            f"its next save (checkpoint.interval = {interval}: step {following})"
            if following <= last_step
            else "a later save on checkpoint.interval's grid"
        )
        within = f"between step {oldest} and" if oldest else "at or before"
        why = f"neither its checkpoints ({have}) nor {later} is {within}"
    # what would make one reachable (review RV65d 6: a lower interval was advised where no save after the
    # start can come before the last step − the margin)
    targets = sorted(s for s in saved if s >= oldest) + ([following] if following <= last_step else [])
    # never a margin below 1: 0 reaches no further, and a negative one is refused (trial RV68b F1)
    reach = last_step - targets[0] if targets else 0
    fixes = [f"run.rewind.margin_steps to {reach} or less"] if reach >= 1 else []
    if after + 1 <= newest:  # a save on a finer grid could come in time
        fixes.append("checkpoint.interval")
    fallback = {"on_spike": "a spike is only reported", "on_nonfinite": "a non-finite step stops the run"}
    bound = f"its last step {last_step} − run.rewind.margin_steps {margin}" if margin else f"step {newest}"
    return (
        f"warning: run.{rewinds[0]} = 'rewind' can never rewind in this plan: {why} {bound}, "
        f"so {' and '.join(fallback[k] for k in rewinds)}; "
        # no checkpoint and no save in the plan's reach: a lower interval is needed, and the margin too
        # where no save after the start can come in time (review RV65e 4)
        f"lower {', or '.join(fixes) or 'run.rewind.margin_steps and checkpoint.interval'}"
    )


def trackers_of(m: MetricsSection) -> tuple[list[str], str, list[str]]:
    """The trackers and the wandb/trackio project of [metrics] with `tensorboard = false` and the
    older `wandb_project` folded in, and a note when wandb_project is used. ConfigError for an
    unknown tracker, or for wandb/trackio when its package is missing (found without importing it,
    so this stays fast; a missing tensorboard is only a note when the writer starts)."""
    names, project, notes = list(dict.fromkeys(m.trackers)), m.project, []
    if m.wandb_project:
        if m.project not in (MetricsSection.project, m.wandb_project):
            raise ConfigError(
                f"metrics.wandb_project = {m.wandb_project!r} and metrics.project = {m.project!r}: keep "
                "metrics.project (wandb_project is the older key)",
                "metrics.wandb_project",
            )
        names += [] if "wandb" in names else ["wandb"]
        project = m.wandb_project
        notes.append(
            f"note: metrics.wandb_project is the older key; write metrics.trackers = {json.dumps(names)} and "
            f"metrics.project = {json.dumps(project)}"
        )
    if not m.tensorboard:
        names = [n for n in names if n != "tensorboard"]
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"metrics.trackers: unknown tracker {name!r}; the known ones are {', '.join(TRACKERS)}",
                "metrics.trackers",
            )
        if name != "tensorboard" and importlib.util.find_spec(name) is None:
            raise ConfigError(
                f'metrics.trackers includes "{name}" but {name} is not installed: '
                f"pip install 'gristmill[{name}]'",
                "metrics.trackers",
            )
    return names, project, notes


def tracker_timeout() -> float:
    """How long one tracker call (a row's log, the finish at the end, all trackers' together) may take
    before it is given up: GRISTMILL_TRACKER_TIMEOUT seconds (GRISTMILL_WANDB_FINISH_TIMEOUT, its
    older name from when only wandb's finish was bounded, counts too), 30 by default. GristmillError
    for a value that is no finite number above 0: "abc" was 30 s unsaid, and 0 gave up every tracker
    at the end, its record claiming rows its run never got (trial RV68a F8)."""
    for var in ("GRISTMILL_TRACKER_TIMEOUT", "GRISTMILL_WANDB_FINISH_TIMEOUT"):
        if raw := os.environ.get(var):
            break
    else:
        return 30.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if math.isfinite(seconds) and seconds > 0:
        return seconds
    raise GristmillError(
        f"{var}={raw} is not a finite number of seconds above 0 (how long a tracker's call may take before "
        "it is given up); set it to one, e.g. 30 (the default), or unset it"
    )


def check_tracker_timeout(m: MetricsSection) -> None:
    """The trackers' time bound, checked where a run starts (the launcher, the trainer), before any
    work; not with the config, which a read of a run (inspect, verify) checks too."""
    if trackers_of(m)[0]:
        tracker_timeout()
