"""Training metrics: MFU, update/param ratio, peak memory, a metrics row's columns, the summary.

MFU convention: model FLOPs per token = 6·N_matmul + 12·L·d·T (training.model.flops_per_token;
the run header says whether the LM head is in N_matmul), achieved FLOP/s per device =
tokens/s ÷ devices × FLOPs per token, MFU = achieved ÷ the device's dense bf16 peak. The peak is
looked up by GPU model name; any other device (CPU included) gets no MFU rather than a guess.

The rows go to stdout (`format_line`), RUN/metrics.jsonl and the trackers of [metrics], and the
loss curve to RUN/loss.png (`plot_loss`), all written by the run's one writer,
training/run/record.RunRecord; matplotlib is imported lazily so the trainer runs without it.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Shard

from training.contract.disk_space import fmt_bytes
from training.contract.object_store import COUNTS, is_url
from training.contract.run_layout import kept_rows
from training.plotting import agg_pyplot, save_figure

# Dense (no sparsity) bf16 tensor-core peak per GPU, from the vendor datasheets. Matched in order
# against torch.cuda.get_device_name(), so the specific variants come before the family name.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H100 PCIE", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200 NVL", 835e12),  # the PCIe card (1,671 TFLOPS with sparsity): was read as the SXM's (R16g)
    ("H200", 989e12),  # also GH200
    ("H800 PCIE", 756e12),  # as the H100 PCIe
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
]


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device by its name (e.g. "NVIDIA H100 80GB HBM3"), or None if unknown."""
    name = device_name.upper()
    for key, flops in PEAK_BF16_FLOPS:
        if key in name:
            return flops
    return None


def mfu(tokens_per_s: float, n_devices: int, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1] (None when the peak is unknown)."""
    if peak is None or n_devices < 1:
        return None
    return tokens_per_s / n_devices * flops_per_token / peak


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated CUDA memory on a GPU; on CPU the process's max resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def snapshot(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of this rank's parameter shards, taken before an optimizer step whose update is measured."""
    return [_local(p).detach().clone() for p in params]


def update_ratio(params: list[torch.Tensor], before: list[torch.Tensor]) -> float:
    """‖θ_after − θ_before‖ / ‖θ_after‖ over all parameters, exact under FSDP/HSDP.

    Sums of squares are taken over local shards (one foreach kernel each), then summed over the
    mesh dimensions on which the parameters are sharded: a shard replicated over HSDP's replicate
    dimension is counted once. One small all-reduce per (mesh, placement) kind, usually one.
    """
    by_kind: dict[Any, list[int]] = defaultdict(list)
    for i, p in enumerate(params):
        by_kind[(id(p.device_mesh), p.placements) if isinstance(p, DTensor) else None].append(i)
    total = torch.zeros(2, dtype=torch.float64)
    for key, idx in by_kind.items():
        after = [_local(params[i]).detach().float() for i in idx]
        delta = torch._foreach_sub(after, [before[i].float() for i in idx])
        sq = torch.stack([torch.stack(torch._foreach_norm(t)).square().sum() for t in (delta, after)])
        if key is not None:
            p = params[idx[0]]
            for dim, placement in enumerate(p.placements):
                if isinstance(placement, Shard):
                    dist.all_reduce(sq, group=p.device_mesh.get_group(dim))
        total += sq.double().cpu()
    return math.sqrt(total[0].item()) / max(math.sqrt(total[1].item()), 1e-30)


def step_row(
    step: int,
    loss: float,
    res: dict[str, Any],
    *,
    tokens_per_s: float,
    tokens_seen: int,
    batch_sha256: str,
    skipped: dict[str, Any],
    spike: dict[str, float] | None,
    mfu: float | None,
    peak_memory_bytes: int,
) -> dict[str, Any]:
    """The metrics.jsonl row of a logged step (`res`: train_step's result; `batch_sha256`: the digest
    of the global batch it trained, training/data/loader.batch_sha256; `skipped`: the non-finite
    guard's tally since the last log; `spike`: the spike detector's finding), events included."""
    m: dict[str, Any] = {
        "step": step,
        "loss": loss,
        "lr": res["lr"],
        "grad_norm": res["grad_norm"].item(),
        "update_ratio": res.get("update_ratio"),  # None: not measured (a row a rewind asked for)
        "tokens_per_s": tokens_per_s,
        "tokens_seen": tokens_seen,
        "batch_sha256": batch_sha256,
        "skipped_steps": skipped["skipped"],
    }
    if mfu is not None:
        m["mfu"] = mfu
    m["peak_memory_bytes"] = peak_memory_bytes
    events = []
    if skipped["skipped"]:
        events.append(
            f"non-finite: {skipped['skipped']} step(s) not applied since the last log, the first "
            f"at step {skipped['first_step']} ({skipped['what']})"
        )
    if spike is not None:
        events.append(
            f"loss spike: {loss:.4f} > mean {spike['mean']:.4f} + {spike['sigma']:g}·std "
            f"({spike['std']:.4f}) of the previous {spike['window']} losses"
        )
    if events:
        m["events"] = events
    return m


def data_row(plan, step: int, consumed: list[dict[str, Any]], skips=()) -> dict[str, Any]:
    """What the data plan says of the first `step` steps (training/data/plan.Plan; `consumed` is its
    `consumed(step)`): the current phase and seq_len, the tokens trained from each source so far
    (they add up to tokens_seen), once a rewind skipped steps (`skips`, the timeline's) the tokens
    of each source those steps held (read, never trained), and the epoch of each source that may be
    read more than once."""
    p, _ = plan.locate(step - 1)
    row: dict[str, Any] = {"phase": plan.phases[p].name, "seq_len": plan.phases[p].seq_len}
    for src in plan.sources:
        row[f"tokens/{src.name}"] = 0
        if skips:
            row[f"skipped_tokens/{src.name}"] = 0
    for r in consumed:
        row[f"tokens/{r['source']}"] += r["tokens"]
        if skips:
            row[f"skipped_tokens/{r['source']}"] += r["skipped_tokens"]
        if r["phase_index"] == p and plan.sources[r["source_index"]].max_epochs != 1:
            row[f"epoch/{r['source']}"] = r["epoch"]
    return row


def fetch_row(plan, since: dict[str, int]) -> dict[str, int]:
    """With a source in a bucket: the object-store requests, retries (throttled, failed, cut-off
    requests tried again), bytes downloaded and shards fetched again after a failed sha256 check, of
    every rank and its loader workers since `since` (a snapshot of object_store.COUNTS), summed over
    ranks; {} for local sources. Every rank must call it (an all-reduce)."""
    if not any(is_url(src.dataset) for src in plan.sources):
        return {}
    counts = {k: v - since[k] for k, v in COUNTS.snapshot().items()}
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        on_gpu = dist.get_backend() == "nccl"
        t = torch.tensor(list(counts.values()), dtype=torch.int64, device="cuda" if on_gpu else "cpu")
        dist.all_reduce(t)
        counts = dict(zip(counts, t.tolist()))
    return {f"fetch/{k}": v for k, v in counts.items()}


class TrainingMetrics:
    """The training loop's metrics: the throughput window, and what a row measures besides its step
    (the checkpoint timings, the data plan's columns, the object-store fetches, the elapsed time and
    the ETA). The loop adds the step's validation and eval between `measure` and `timed`; the row is
    then written by training/run/record.RunRecord, which holds the rows."""

    def __init__(
        self, timeline, *, log_every: int = 1, last_step: int | None = None, fetch_base: dict | None = None
    ):
        """`timeline`: the run's training/run/timeline.Timeline; `log_every` (run.log_every) and
        `last_step` (where this invocation stops: run.max_steps, else the plan's end): the rows'
        cadence, and their ETA; `fetch_base`: object_store.COUNTS when the invocation began (its
        setup's fetches, a bucket's cold start, count in its first row)."""
        self.timeline, self.log_every, self.last_step = timeline, log_every, last_step
        self.fetch_base = fetch_base or COUNTS.snapshot()  # fetch/* counts start with this invocation
        self.start()

    def due(self, step: int) -> bool:
        """Whether step `step` gets a row on its own account: every log_every steps, the first and
        the last (validation and eval add theirs: their values need a row)."""
        return step % self.log_every == 0 or step == 1 or step == self.last_step

    def start(self) -> None:
        """Start the run's clock and the throughput window (at the loop's first step)."""
        self.started = self.window_started = self.paced = time.perf_counter()
        self.window_tokens = 0
        self.steps_trained = 0  # by this invocation, for the ETA

    def pace_from_here(self) -> None:
        """The ETA's pace counts from now: a resume's catch-up row (its validation and eval, done once
        before the first step) made the first ETA several times the rest's (trial RV70a 3)."""
        self.paced = time.perf_counter()

    def count(self, tokens: int) -> None:
        """Tokens of a step just trained, towards the throughput of the next logged row."""
        self.window_tokens += tokens
        self.steps_trained += 1

    def tokens_per_s(self) -> float:
        """Throughput since the last logged row (once the step is synchronised: its loss all-reduced)."""
        return self.window_tokens / (time.perf_counter() - self.window_started)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def measure(self, row: dict[str, Any], checkpoint_timings: dict[str, float] | None) -> dict[str, Any]:
        """A row's measures before its validation and eval (a collective: every rank measures every
        row): checkpoint_stage_s/_wait_s of the saves since the last row, and after step 0 the data
        plan's columns and the object-store fetches so far."""
        step = row["step"]
        row.update(checkpoint_timings or {})
        fetched = fetch_row(self.timeline.plan, self.fetch_base)
        if step > 0:
            row.update(data_row(self.timeline.plan, step, self.timeline.consumed(step), self.timeline.skips))
            row.update(fetched)
        return row

    def timed(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row's elapsed time and, with a last step, the ETA at this invocation's pace so far
        (evals and validation included, but for a resume's catch-up: pace_from_here)."""
        row["elapsed_s"] = self.elapsed()
        if self.last_step is not None:
            row["last_step"] = self.last_step
            if self.steps_trained:
                paced = row["elapsed_s"] - (self.paced - self.started)
                row["eta_s"] = paced / self.steps_trained * max(self.last_step - row["step"], 0)
        return row

    def restart_window(self) -> None:
        """After a row is written: validation, eval and the writes are not training time."""
        self.window_started, self.window_tokens = time.perf_counter(), 0


def kept_losses(rows: list[dict[str, Any]], after: int = 0) -> list[dict[str, Any]]:
    """The final timeline's rows of trained steps after step `after` (discarded rows and rows
    without a trained step left out)."""
    return [r for r in kept_rows(rows) if "loss" in r and r["step"] > after]


def run_summary(rows: list[dict[str, Any]], start: int) -> dict[str, float | None]:
    """This invocation's first and last kept loss (steps after `start`) and its last validation loss."""
    losses = kept_losses(rows, after=start)
    val = [r["val_loss"] for r in kept_rows(rows) if r["step"] > start and "val_loss" in r]
    return {
        "first_loss": losses[0]["loss"] if losses else None,
        "final_loss": losses[-1]["loss"] if losses else None,
        "val_loss": val[-1] if val else None,
    }


def summary_line(
    rows: list[dict[str, Any]], start: int, end: int, seconds: float, skipped: int = 0, nonfinite: int = 0
) -> str | None:
    """The run's last line (None when no kept step was logged since `start`): the loss over this
    invocation's steps `start`+1…`end` (`skipped` of them by rewinds and `nonfinite` ones not applied:
    not trained) and, after a resume, over the whole run."""
    losses = kept_losses(rows, after=start)
    if not losses:
        return None
    first, last = losses[0], losses[-1]
    left_out = [
        f"{n} {how}"
        for n, how in ((skipped, "skipped by rewinds"), (nonfinite, "non-finite, not applied"))
        if n
    ]
    n = end - start - skipped - nonfinite
    trained = f"{n} step{'' if n == 1 else 's'}" + (f" trained, {', '.join(left_out)}" if left_out else "")
    steps = f"{trained}{' since the resume' if start else ''}"
    span = f"step {end}" if end == start + 1 else f"steps {start + 1}–{end}"  # not "steps 3–3 (1 steps"
    # Only logged steps have a loss: a stop between rows (Ctrl-C at step 27, rows every 5) says
    # which steps the two losses are of.
    said = (
        f"{first['loss']:.4f} → {last['loss']:.4f} over {span} ({steps})"
        if (first["step"], last["step"]) == (start + 1, end)
        else f"{first['loss']:.4f} at step {first['step']} → {last['loss']:.4f} at step {last['step']} "
        f"(logged, of steps {start + 1}–{end}; {steps})"
    )
    return f"loss {said}, {seconds:.0f} s{_whole_run(kept_losses(rows), start)}{_side_failures(rows, start)}"


def _side_failures(rows: list[dict[str, Any]], start: int) -> str:
    """The validations and evals of this invocation that failed (each a warning as it happened): a
    damaged held-out document fails every validation after it, and the run's last line said nothing
    of it (review RV49a 5). The merged weights' apart: a run whose merged evals alone failed ended
    without a word of them (trial RV75b 1)."""
    said, since = [], [r for r in kept_rows(rows) if r["step"] > start]
    for weights, prefix in (("", ""), (" of the merged weights", "merged/")):
        for what, done, failed in (("validation", "val_loss", "val_error"), ("eval", "eval_s", "eval_error")):
            done, failed = prefix + done, prefix + failed
            ran = [r for r in since if done in r or failed in r]
            if n := sum(failed in r for r in ran):
                said.append(
                    f"{what}{weights} failed at {n} of {len(ran)} steps (the rows' {failed} says why)"
                )
    return "".join(f"; {s}" for s in said)


def no_step_row(step: int, note: str, tokens_seen: int, attempt: int | None) -> dict[str, Any]:
    """A metrics row of validation and eval without a trained step: the base's scores at step 0 of
    an init_from run, the final weights when a rewind's skip reached the run's last step. Its
    `tokens_seen` (those the weights trained on) and, with rewinds on, `attempt`, as every row's."""
    return {"step": step, "note": note, "tokens_seen": tokens_seen} | (
        {} if attempt is None else {"attempt": attempt}
    )


def _whole_run(rows: list[dict[str, Any]], start: int) -> str:
    """After a resume, the whole run's first logged loss too (metrics.jsonl keeps the rows before it)."""
    if not start or not rows or rows[0]["step"] > start:
        return ""
    return f"; the whole run: {rows[0]['loss']:.4f} at step {rows[0]['step']} → {rows[-1]['loss']:.4f}"


def _duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`: an ETA's precision."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_line(m: dict[str, Any]) -> str:
    """The one stdout line of a logged step: `step N/last | loss … | … | eta 3m05s` (a row without
    a trained step: its note and validation)."""
    head = f"step {m['step']:>6d}" + (f"/{m['last_step']}" if m.get("last_step") else "")
    if "loss" not in m:
        val = f" | val {m['val_loss']:.4f}" if m.get("val_loss") is not None else ""
        if m.get("merged/val_loss") is not None:
            val += f" | merged val {m['merged/val_loss']:.4f}"
        return f"{head} | {m['note']}{val}"
    parts = [
        head,
        f"loss {m['loss']:.4f}",
        f"lr {m['lr']:.3e}",
        f"gnorm {m['grad_norm']:.3f}",
        f"upd/param {m['update_ratio']:.2e}" if m["update_ratio"] is not None else "upd/param -",
        f"tok/s {m['tokens_per_s']:,.0f}",
    ]
    if m.get("skipped_steps"):
        parts.append(f"SKIPPED {m['skipped_steps']}")
    if m.get("mfu") is not None:
        parts.append(f"mfu {100 * m['mfu']:.1f}%")
    parts.append(f"mem {fmt_bytes(m['peak_memory_bytes'])}")
    if m.get("val_loss") is not None:
        parts.append(f"val {m['val_loss']:.4f}")
    if m.get("merged/val_loss") is not None:
        parts.append(f"merged val {m['merged/val_loss']:.4f}")
    if m.get("phase") is not None:
        parts.append(f"{m['phase']} seq {m['seq_len']}")
    if m.get("eta_s") is not None and m["step"] < m.get("last_step", 0):
        parts.append(f"eta {_duration(m['eta_s'])}")
    return " | ".join(parts)


def plot_loss(history: list[dict[str, Any]], path: Path, skips=(), phases=()) -> str | None:
    """Train and validation loss against step as a PNG (`loss_figure`); returns a note instead if
    matplotlib is missing, a warning if the file cannot be written."""
    plt = agg_pyplot(required=False)
    if plt is None:
        return "note: matplotlib is not installed; no loss.png (pip install matplotlib)"
    return save_figure(plt, loss_figure(plt, history, skips, phases), path)


def loss_figure(plt, history: list[dict[str, Any]], skips=(), phases=()):
    """The loss plot of a run's rows: train loss, the validation loss (mix-weighted), the merged
    weights' (`merged/val_loss`, [merge]) and, for a mixture, each source's (`val/<source>`: the
    weighted curve moves at a phase change only because the weights do), with `phases` ((first
    step, 0-based; name) of each phase) marked where one starts. `skips`: the rewinds'
    (training/data/plan.Skip): their discarded rows dashed, their skipped steps shaded, the y axis
    kept to the trained curve (a spike's value written at the top)."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    scored = kept_rows(history)  # validation: a row without a trained step (the final weights') too
    val = [(m["step"], m["val_loss"]) for m in scored if m.get("val_loss") is not None]
    sources = sorted({k.removeprefix("val/") for m in scored for k in m if k.startswith("val/")})
    kept = [m for m in scored if "loss" in m]  # rows of trained steps (not a base's or a skip's eval)
    train = [(m["step"], m["loss"]) for m in kept]
    if train:
        ax.plot(*zip(*train), label="train")
    finite = [loss for _, loss in train if math.isfinite(loss)]
    top = max(finite) * 1.15 if finite and skips else None
    for i, s in enumerate(skips):  # each rewind's discarded steps, from the checkpoint it went back to
        rows = [m for m in history if m.get("discarded_by_rewind") == s.rewind and "loss" in m]
        back = [m for m in kept if m["step"] <= s.checkpoint_step][-1:]
        if rows:
            curve = [(m["step"], min(m["loss"], top or m["loss"])) for m in back + rows]
            label = "discarded by a rewind" if i == 0 else None
            ax.plot(*zip(*curve), color="grey", linestyle="--", label=label)
            spike = max(rows, key=lambda m: m["loss"])
            where = (spike["step"], top or spike["loss"])
            text = f"loss {spike['loss']:.3g} (rewind {s.rewind}) "
            ax.annotate(text, where, fontsize=8, va="top", ha="right")
        ax.axvspan(s.first_step - 0.5, s.last_step + 0.5, color="orange", alpha=0.2,
                   label="steps skipped" if i == 0 else None)  # fmt: skip
    if top is not None:
        ax.set_ylim(top=top)
    if val:
        ax.plot(*zip(*val), marker="o", label="validation (mix-weighted)" if sources else "validation")
    merged = [(m["step"], m["merged/val_loss"]) for m in scored if m.get("merged/val_loss") is not None]
    if merged:
        ax.plot(*zip(*merged), marker="s", linestyle="--", label="validation, merged weights ([merge])")
    for name in sources:
        curve = [(m["step"], m[f"val/{name}"]) for m in scored if m.get(f"val/{name}") is not None]
        ax.plot(*zip(*curve), marker=".", linestyle=":", label=f"validation: {name}")
    for i, step in enumerate(m["step"] for m in history if m.get("skipped_steps")):
        ax.axvline(step, color="red", alpha=0.4, label="non-finite step(s) skipped" if i == 0 else None)
    for first, name in list(phases)[1:]:  # where each phase after the first starts
        ax.axvline(first + 0.5, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f" {name}", (first + 0.5, 1), xycoords=("data", "axes fraction"), va="top", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
