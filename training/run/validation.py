"""Held-out loss during training (`run.val_every`, `run.val_batches`): `Validation`, one of the
loop's side activities, which owns its cadence (`due`)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from training.config import TrainConfig
from training.console import say
from training.contract.errors import GristmillError
from training.data.loader import LoaderConfigError, TokenLoader, dataset_loader
from training.data.plan import VAL_FRACTION_KEYS, Plan
from training.data.spec import BatchShape, RunSpec
from training.run.shutdown import any_rank

# The held-out split's order, whatever data.seed: runs of other seeds (a seed sweep, `mix propose`'s
# proxies and its validation runs) are scored on the same held-out windows. (With data.seed, the
# first val_batches of a 17-batch split were another subset per seed: mix propose's tiny proxies
# scored 0.37 nats apart at one mixture, 0.05 on the whole split.)
HELD_OUT_SEED = 0


def validation_of(cfg: TrainConfig, spec: RunSpec, shapes: tuple[BatchShape, ...], plan: Plan, **kw: Any):
    """The run's Validation (`kw`: its keyword arguments), None where it validates nothing (run.val_every
    0, or no source holds documents out). Its held-out loaders are opened here: a split too small for
    run.val_batches is refused by train and `train --plan` alike, before step 1."""
    if cfg.run.val_every > 0 and any(s.val_fraction > 0 for s in spec.sources):
        return Validation(cfg, spec, shapes, plan, **kw)
    return None


class Validation:
    """Held-out loss per source: the first `val_batches` global batches of each source's held-out
    split (the same ones every time, whatever data.seed), at the current phase's seq_len and batch;
    a phase with another seq_len or batch gets loaders of its own (a bigger batch: more of the same
    held-out windows, from the first). The total (`val_loss`) weights the sources by the current
    phase's mix (equally where the phase uses none of them)."""

    def __init__(
        self,
        cfg: TrainConfig,
        spec: RunSpec,
        shapes: tuple[BatchShape, ...],
        plan: Plan,
        *,
        last_step: int,
        vocab_size: int,
        device: torch.device,
        world_size: int,
        settings: dict[str, Any],
    ):
        """`last_step`: this invocation's (validated too); `settings`: the loaders' rank, world
        size, workers and checks (the training loader's)."""
        self.cfg, self.spec, self.shapes, self.plan, self.last_step = cfg, spec, shapes, plan, last_step
        self.vocab_size, self.device, self.world_size, self.settings = (
            vocab_size,
            device,
            world_size,
            settings,
        )
        self.sources = [s for s in spec.sources if s.val_fraction > 0]
        self._loaders: dict[tuple[str, int, int, int], tuple[TokenLoader, dict]] = {}
        for phase in range(len(shapes) if self.sources else 0):
            self.loaders(phase)  # a held-out split too small for val_batches of a phase's batch: refused

    def all_loaders(self) -> list[tuple[TokenLoader, dict]]:
        """Every held-out loader (with its start state), of every phase's shape."""
        return list(self._loaders.values())

    def fingerprints(self) -> list[tuple[str, str]]:
        """(source name, dataset fingerprint) of every held-out loader: the dataset each opened."""
        return [(key[0], loader.info["fingerprint"]) for key, (loader, _) in self._loaders.items()]

    def cache_need(self) -> list[tuple[Any, int]]:
        """(cache, bytes) of the held-out documents its loaders read from buckets (TokenLoader.cache_need),
        which share the node's cache with the training's: counted with them by `train` and `--plan`."""
        return [need for loader, _ in self.all_loaders() for need in loader.cache_need()]

    def due(self, step: int) -> bool:
        return step % self.cfg.run.val_every == 0 or step == self.last_step

    def loaders(self, phase: int) -> list[tuple[str, TokenLoader, dict]]:
        shape = self.shapes[phase]
        out = []
        for src in self.sources:
            key = (src.name, shape.seq_len, shape.global_batch, shape.micro_batch)
            if key not in self._loaders:
                try:
                    loader = dataset_loader(
                        src.dataset,
                        split="val",
                        seq_len=shape.seq_len,
                        global_batch=shape.global_batch,
                        micro_batch=shape.micro_batch,
                        seed=HELD_OUT_SEED,
                        val_fraction=src.val_fraction,
                        expect_vocab_size=self.vocab_size,
                        cache=self.spec.cache,
                        last_step=self.cfg.run.val_batches,  # all it reads (more would repeat windows)
                        check_cache=False,  # with the training's need: recipe.check_run_room
                        # Read here, never by DataLoader workers: each validation iterates its
                        # loaders anew, and workers forked then, beside the training loader's
                        # threads (its prefetcher, its fetches), deadlocked in CPython's after-fork
                        # now and then: 4 of 26 two-rank runs from a bucket hung at a validation
                        # step, no line, nothing saved (review R20a 1). The batches are the same.
                        **{**self.settings, "num_workers": 0},
                    )
                except LoaderConfigError as e:
                    name = self.plan.phases[phase].name
                    where = f", phase {name!r}" if len(self.plan.phases) > 1 else ""
                    n = self.cfg.run.val_batches
                    at = f"source {src.name!r}{where}: run.val_batches = {n}: "
                    # the fix by its keys: "read fewer batches" with run.val_batches at its least, and no
                    # key for the others (trial RV64a 2c)
                    fix = (
                        f"{at}{e.cause}; raise its held-out fraction (now {src.val_fraction:g}: "
                        f"{VAL_FRACTION_KEYS})"
                        + (", lower run.val_batches" if n > 1 else "")
                        + ", or turn validation off (run.val_every = 0)"
                    )
                    raise LoaderConfigError(fix, cause=f"{at}{e.cause}") from None
                self._loaders[key] = (loader, loader.state_dict())
            out.append((src.name, *self._loaders[key]))
        return out

    def __call__(self, model: nn.Module, step: int, amp) -> dict[str, float]:
        """The step's row entries (every rank: the forwards are collectives); `val_error`, the line, with
        a warning, when some rank cannot read its held-out batches (a damaged document, a bucket down
        past data.fetch_timeout_s): a side activity, it costs no training, and the row says why it has
        no val_loss (it said nothing: trial T38 M1). The batches are read before any forward, and the
        ranks agree on them, so a rank's error never leaves the others waiting inside a forward."""
        phase, _ = self.plan.locate(step - 1)
        n, error = self.cfg.run.val_batches, None
        try:
            held_out = {name: read_batches(loader, start, n) for name, loader, start in self.loaders(phase)}
        except GristmillError as e:
            held_out, error = {}, e
        failed = error is not None
        if failed if self.world_size == 1 else any_rank(failed, device=self.device):
            rank = self.settings.get("rank", 0)
            if error is not None and rank:  # the console prints rank 0's lines only
                with contextlib.suppress(OSError):
                    print(f"rank {rank}: validation of step {step}: {error}", file=sys.stderr, flush=True)
            why = error if error is not None and not rank else "another rank could not read its held-out data"
            say(f"WARNING: validation of step {step} skipped: {why}; training goes on")
            return {"val_error": str(why)}
        losses = {
            name: evaluate(model, batches, amp, self.device, self.world_size)
            for name, batches in held_out.items()
        }
        names = [s.name for s in self.plan.sources]
        weights = {n: self.plan.phases[phase].weights[names.index(n)] for n in losses}
        if not sum(weights.values()):
            weights = dict.fromkeys(losses, 1)
        out = {"val_loss": sum(weights[n] * v for n, v in losses.items()) / sum(weights.values())}
        if len(self.plan.sources) > 1:
            out.update({f"val/{n}": v for n, v in losses.items()})
        return out


def read_batches(
    loader: TokenLoader, start_state: dict, n_batches: int
) -> list[list[dict[str, torch.Tensor]]]:
    """The first `n_batches` global batches of the held-out split (the same ones each time): this
    rank's micro-batches of each, on the host."""
    loader.load_state_dict(start_state)
    it = iter(loader)
    batches = [next(it) for _ in range(n_batches)]
    del it
    return batches


@torch.no_grad()
def evaluate(model: nn.Module, batches: list, amp, device, world_size: int) -> float:
    """Mean loss over held-out `batches` (read_batches), every rank's."""
    model.eval()
    losses = []
    for batch in batches:
        for mb in batch:
            mb = to_device(mb, device)
            with amp():
                losses.append(
                    model(mb["input_ids"], labels=mb["labels"], position_ids=mb.get("position_ids"))
                )
    for module in model.modules():  # FSDP2 keeps the root unsharded after a forward without backward
        if isinstance(module, FSDPModule):
            module.reshard()
    model.train()
    # Every rank evaluated the same number of equal-sized micro-batches: the mean of means is exact.
    total = torch.stack(losses).double().sum()
    if world_size > 1:
        total = total.to(device)
        dist.all_reduce(total)
    return total.item() / (len(losses) * world_size)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
