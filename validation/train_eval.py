"""Eval during training: `[eval] interval = N` in a training recipe.

    gristmill train --config configs/train/demo.toml        # the demo sets eval.interval
    torchrun --standalone --nproc_per_node=2 -m validation.train_eval --config … --set parallel.shard=2

This module is the trainer's entry point when a recipe evaluates while it trains (`gristmill train`
starts it instead of `-m training.train`): training/ never imports lm-eval, so the two are joined
here, and the trainer calls `TrainingEval` through its `StepEval` hook.

Every `eval.interval` steps and at the last step, every rank takes part in one gather of the full
weights (DCP's full state dict, offloaded to rank 0's CPU, the same collective a checkpoint's model
state uses), then rank 0 alone loads them into an unsharded copy of the model and scores the tasks
with the same request code as `gristmill eval` (`in_process_lm`: one separator before every text),
while the other ranks wait at a barrier. Rank 0 does all of it rather than every rank scoring a
shard of the requests because lm-eval's own data parallelism needs accelerate's launcher, and
because one process scoring every request in the offline order gives the offline numbers: a later
`gristmill eval RUN --step N` (same tasks and limit) agrees to float rounding (the export runs HF's
Llama, this runs gristmill's model on the same weights). Long evals on big models belong on another
GPU with `gristmill eval RUN --watch`.

Results go where `gristmill eval` puts them (RUN/eval/step-N/results.json, eval.parquet, eval.png)
and into the step's metrics row as `eval/<task>/<metric>` (metrics.jsonl, tensorboard, trackers),
with `eval_s`, the eval's wall time, which the training throughput does not count. A NaN metric is
a warning line, not a stop: the trainer's own divergence checks decide about the run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.checkpoint.hf_export import run_model_config, write_tokenizer
from training.checkpoint.state import rng_state, set_rng_state
from training.config import TrainConfig
from training.contract.errors import GristmillError
from training.contract.run_layout import EVAL_DIR, eval_dir
from training.model import Transformer
from training.train import main as train_main
from training.train import raise_rank0_problem
from validation.eval import (
    EvalConfig,
    TaskPlan,
    evaluate_lm,
    nonfinite_error,
    task_lines,
)
from validation.eval_model import in_process_lm
from validation.eval_output import eval_output
from validation.eval_results import EVAL_LOG, metric_order, rows_of, write_plot, write_step_results

TOKENIZER_SUBDIR = "tokenizer"  # RUN/eval/tokenizer: the export's tokenizer files, for in-process eval


def metric_key(row: dict[str, Any]) -> str:
    """`eval/<task>/<metric>` (the filter appended where it is not lm-eval's "none")."""
    filt = "" if row["filter"] in ("none", "") else f"/{row['filter']}"
    return f"eval/{row['task']}/{row['metric']}{filt}"


class TrainingEval:
    """The trainer's `StepEval`: lm-eval on the current weights at eval.interval (see the module)."""

    def __init__(self, cfg: TrainConfig, out=None):
        e = cfg.eval
        self.interval = e.interval
        # `gristmill eval`'s defaults for everything else: the later offline eval matches.
        self.cfg = EvalConfig(tasks=list(e.tasks), limit=e.limit, batch_size=e.batch_size, dtype="float32")
        self.out = out or sys.stdout
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.run_dir: Path | None = None
        self.plan: TaskPlan | None = None
        self.copy: nn.Module | None = None  # rank 0's unsharded model, made at the first eval
        self.max_length = 0

    def _say(self, text: str) -> None:
        print(f"[eval] {text}", file=self.out, flush=True)

    def prepare(self, run_dir: Path, say: Callable[[str], None]) -> None:
        """Rank 0 resolves the tasks and builds the local tasks' data and the tokenizer files; a
        problem (unknown task, hub data offline) stops every rank before step 1."""
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.run_dir = Path(run_dir)
        problem = None
        if self.rank == 0:
            try:
                self.plan = TaskPlan(self.run_dir, self.cfg)
                _, dataset, mcfg = run_model_config(self.run_dir)
                tok_dir = self.run_dir / EVAL_DIR / TOKENIZER_SUBDIR
                tok_dir.mkdir(parents=True, exist_ok=True)
                write_tokenizer(dataset, mcfg, tok_dir)
                self.tokenizer = _load_tokenizer(tok_dir)
                self.max_length = self.plan.data.seq_len  # as `gristmill eval` (max_length 0)
                limit = f" (limit {self.cfg.limit})" if self.cfg.limit else ""
                say(
                    f"  eval    {', '.join(self.plan.names)}{limit} every {self.interval} steps and at the "
                    f"last, on rank 0 → {self.run_dir / EVAL_DIR}/step-N"
                )
            except GristmillError as e:
                problem = str(e)
        raise_rank0_problem(problem, dist.get_world_size() if dist.is_initialized() else 1)

    def __call__(self, model: nn.Module, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        # Collective: every rank sends its shards; only rank 0 receives the full tensors (on CPU).
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        metrics: dict[str, float] = {}
        if self.rank == 0:
            metrics = self._evaluate(model, full, step, t0)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # the other ranks wait for rank 0's scores before the next step
        return metrics

    def _evaluate(
        self, model: nn.Module, full: dict[str, torch.Tensor], step: int, t0: float
    ) -> dict[str, float]:
        if self.copy is None:
            with torch.device("meta"):
                self.copy = Transformer(model.cfg)
            # On the training device (a DTensor parameter's device is its local shard's).
            self.copy.to_empty(device=next(model.parameters()).device)
        self.copy.load_state_dict({k: v.to(torch.float32) for k, v in full.items()})
        del full
        # lm-eval reseeds python, numpy and torch: keep the training's random state as it was.
        saved = rng_state()
        try:  # lm-eval's bars and logs go to RUN/eval/step-N/eval.log, as with `gristmill eval`
            with eval_output(eval_dir(self.run_dir, step) / EVAL_LOG):
                lm = in_process_lm(self.copy, self.tokenizer, self.cfg.batch_size, self.max_length)
                results = evaluate_lm(lm, self.plan, self.cfg)
        finally:
            set_rng_state(saved)
        results["gristmill"] = {"run": str(self.run_dir.resolve()), "step": step, "export": "in-training"}
        write_step_results(self.run_dir, step, dict(results))
        write_plot(self.run_dir)
        nonfinite_error(self.run_dir, step, results)  # warning lines; the trainer decides about the run
        rows = rows_of(step, results)
        seconds = time.perf_counter() - t0
        metrics = {metric_key(r): r["value"] for r in rows}
        metrics["eval_s"] = seconds
        self._say(f"step {step}: {_summary(rows)} ({seconds:.1f} s)")
        for line in task_lines(step, results):  # the truncation warnings (not the per-task lines)
            if line.startswith("warning:"):
                print(line, file=self.out, flush=True)
        return metrics


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def _summary(rows: list[dict[str, Any]]) -> str:
    """One headline figure per task, its first metric in the eval table's order (bits per byte for
    perplexity tasks, acc for multiple choice)."""
    first: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=metric_order(rows)):
        first.setdefault(r["task"], r)
    return ", ".join(f"{t} {r['metric']} {r['value']:.4g}" for t, r in first.items())


def main(argv: list[str] | None = None) -> int:
    return train_main(argv, make_evaluator=TrainingEval, prog="python -m validation.train_eval")


if __name__ == "__main__":
    sys.exit(main())
