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

At a merge point of [merge] the trainer calls it again with the merged weights in the model
(`merged=True`): their results go to RUN/eval/merged-step-N, their entries into the row as
`merged/eval/<task>/<metric>` (training/train.py).

Results go where `gristmill eval` puts them (RUN/eval/step-N/results.json and eval.png here;
eval.parquet, rebuilt from the results, is the run's record's: training/run/record.py) and into the
step's metrics row as `eval/<task>/<metric>` (metrics.jsonl, tensorboard, trackers),
with `eval_s`, the eval's wall time, which the training throughput does not count. A NaN metric is
a warning line, not a stop: the trainer's own divergence checks decide about the run.

A failing eval never costs training (the trainer saves a due checkpoint before the eval): a task
whose data file changed or went missing since it was built, or whose lm-eval run raises, is one
line naming the task (and its file) and the command that evaluates the step later, with how long
that command can work (the step's checkpoint goes when retention deletes it), `eval_error` in the
step's metrics row, and training goes on with the other tasks; an eval that fails as a whole is the
same line. Every later eval tries every task again (a task's file put back is scored; a task still
failing is its line again, "failed again (as at step N)" where nothing changed, down to the last
step's eval, whose line is the run's last word on it).
The scores stand once results.json is written: a plot that cannot be drawn is a warning line.
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

from training.checkpoint.base_record import base_files
from training.checkpoint.hf_export import run_tokenizer_dataset, write_tokenizer
from training.checkpoint.state import rng_state, set_rng_state
from training.config import TrainConfig
from training.console import say
from training.contract.dataset_format import read_dataset_info
from training.contract.errors import GristmillError
from training.contract.eval_table import read_step_results, rows_of
from training.contract.run_layout import EVAL_DIR, eval_dir
from training.model import ModelConfig, model_to_load
from training.run.preflight import raise_rank0_problem
from training.train import main as train_main
from validation.eval import (
    SCORE_SETTINGS,
    EvalConfig,
    TaskNames,
    TaskPlan,
    evaluate_lm,
    label_results,
    nonfinite_error,
    task_lines,
)
from validation.eval_data import EvalError, damaged_task_files, task_data_problem
from validation.eval_output import eval_output
from validation.eval_results import (
    EVAL_LOG,
    chance_levels,
    metric_order,
    said_again,
    undrawn_plot_note,
    write_plot,
    write_step_json,
)

TOKENIZER_SUBDIR = "tokenizer"  # RUN/eval/tokenizer: the export's tokenizer files, for in-process eval


def metric_key(row: dict[str, Any]) -> str:
    """`eval/<task>/<metric>` (the filter appended where it is not lm-eval's "none")."""
    filt = "" if row["filter"] in ("none", "") else f"/{row['filter']}"
    return f"eval/{row['task']}/{row['metric']}{filt}"


class TrainingEval:
    """The trainer's `StepEval`: lm-eval on the current weights at eval.interval (see the module)."""

    def __init__(self, cfg: TrainConfig):
        e = cfg.eval
        self.interval = e.interval
        # `gristmill eval`'s defaults for everything else: the later offline eval matches.
        self.cfg = EvalConfig(
            tasks=list(e.tasks),
            limit=e.limit,
            docs=e.docs,  # the advice to raise it named a key [eval] did not have (review R24b 2)
            batch_size=e.batch_size,
            max_length=e.max_length,
            dtype="float32",
            plot=cfg.metrics.plot,  # eval.png too: metrics.plot is the switch for all the run's pictures
        )
        self.checkpoint = cfg.checkpoint  # how long a failed step's weights stay (the advice says)
        self.merge_export = cfg.merge.export  # the merged weights kept for good, or with their checkpoint
        self.rank, self.world_size = 0, 1  # this process's place in the job (prepare sets it)
        self.run_dir: Path | None = None
        self.tasks: TaskNames | None = None  # rank 0's, checked by `check`
        self.plan: TaskPlan | None = None
        self.copy: nn.Module | None = None  # rank 0's unsharded model, made at the first eval
        self.max_length = 0
        self.context = 0  # the model's max_seq_len (prepare sets it)
        self.last_step = 0  # this invocation's: always evaluated (prepare sets it)
        self.said_undrawn = False  # that an earlier eval.png lacks this invocation's scores
        self.separator_id = 0  # the dataset's, set by prepare: what every request starts with
        self.failures: dict[bool, tuple[int, str]] = {}  # merged → (step, why) of the last failure said whole

    def _say(self, text: str) -> None:
        say(f"[eval] {text}")

    def check(self, rank: int, world_size: int, mcfg: ModelConfig) -> None:
        """Rank 0 checks the task names (unknown, renamed, hub data offline) and eval.max_length against
        the model `mcfg`, before the run directory is touched: a refusal stops every rank before any
        tracker starts (it left a wandb run and an event file behind: trial RV70d 4)."""
        self.rank, self.world_size = rank, world_size
        problem = None
        if self.rank == 0:
            try:
                self.tasks = TaskNames(self.cfg)
                if self.cfg.max_length > mcfg.max_seq_len:  # as `gristmill eval` refuses it
                    raise EvalError(
                        f"eval.max_length = {self.cfg.max_length} is longer than the model's context, "
                        f"{mcfg.max_seq_len} tokens (model.max_seq_len): set eval.max_length ≤ "
                        f"{mcfg.max_seq_len} (0: the model's)"
                    )
            except GristmillError as e:
                problem = str(e)
        raise_rank0_problem(problem, self.world_size)

    def prepare(self, run_dir: Path, last_step: int, rank: int, world_size: int, mcfg: ModelConfig) -> None:
        """Rank 0 builds the checked tasks' plan (`check`), the local tasks' data and the tokenizer
        files; a problem stops every rank before step 1. `mcfg`: the model the
        run trains, as its start resolved it: resolved again here (run_model_config) it needed the run's
        own checkpoint or its base, and a resume from a volume's checkpoint with the base gone stopped."""
        self.rank, self.world_size = rank, world_size
        self.run_dir, self.last_step = Path(run_dir), last_step
        problem = None
        if self.rank == 0:
            try:
                self.plan = TaskPlan(
                    self.run_dir, self.cfg, log=lambda line: say(f"  {line}"), tasks=self.tasks
                )
                dataset, _ = run_tokenizer_dataset(self.run_dir, self.plan.run_spec)
                tok_dir = self.run_dir / EVAL_DIR / TOKENIZER_SUBDIR
                tok_dir.mkdir(parents=True, exist_ok=True)
                write_tokenizer(dataset, mcfg, tok_dir, base_files(self.run_dir))  # the export's files
                self.tokenizer = _load_tokenizer(tok_dir)
                self.separator_id = int(read_dataset_info(dataset)["separator"]["id"])
                self.context = mcfg.max_seq_len
                self.max_length = self.cfg.max_length or mcfg.max_seq_len  # as `gristmill eval`
                limit = f" (limit {self.cfg.limit})" if self.cfg.limit else ""
                say(
                    f"  eval    {', '.join(self.plan.names)}{limit}{self.plan.heldout_note()} every "
                    f"{self.interval} steps and at the last, on rank 0 → {self.run_dir / EVAL_DIR}/step-N"
                )
            except GristmillError as e:
                problem = str(e)
        raise_rank0_problem(problem, self.world_size)

    def due(self, step: int) -> bool:
        return step % self.interval == 0 or step == self.last_step

    def __call__(self, model: nn.Module, step: int, merged: bool = False) -> dict[str, float | str]:
        t0 = time.perf_counter()
        # Collective: every rank sends its shards; only rank 0 receives the full tensors (on CPU).
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        metrics: dict[str, float | str] = {}
        if self.rank == 0:
            try:
                metrics = self._evaluate(model, full, step, t0, merged)
            except Exception as e:  # e.g. a full disk under RUN/eval: this eval is lost, not the run
                why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                metrics = self._failed(step, why, merged=merged)
        if self.world_size > 1:
            dist.broadcast_object_list([None], src=0)  # the others wait here for rank 0's scores
        return metrics

    def _later(self, step: int, merged: bool, tasks: list[str] | None = None) -> str:
        """The command that scores step `step` later as this run's evals do (their settings: the
        rows it writes match theirs, review RV26b 3), and while it can: from the step's export (never
        pruned: every checkpoint.export_interval steps; the merged weights' with merge.export), else
        from its checkpoint, which retention deletes once checkpoint.keep_last newer ones are
        complete (review RV26b 1). Only for a step the run saves (`_failed`)."""
        c = self.checkpoint
        which = f"--step {step}" + (" --merged" if merged else "")
        defaults = EvalConfig()
        # a whole eval's failure: the run's tasks, where they are not the command's own (its defaults
        # scored a task the run does not: trial RV59a F6)
        tasks = tasks or (list(self.cfg.tasks) if list(self.cfg.tasks) != defaults.tasks else None)
        sets = [
            f"{key}={getattr(self.cfg, key)}"
            for key in SCORE_SETTINGS
            if getattr(self.cfg, key) != getattr(defaults, key)
        ]
        command = (
            f"`gristmill eval {self.run_dir} {which}"
            + (f" --tasks {','.join(tasks)}" if tasks else "")
            + (f" --set {' '.join(sets)}" if sets else "")
            + "`"
        )
        every = c.export_interval  # raw weights only: the merged weights' export is merge.export
        if (self.merge_export if merged else every and step % every == 0) or not c.keep_last:
            return command
        return (
            f"{command} while retention keeps checkpoint {step} (the newest checkpoint.keep_last = "
            f"{c.keep_last}; `gristmill export {self.run_dir} {which}` keeps it for good)"
        )

    def _failed(
        self, step: int, why: str, tasks: dict[str, str] | None = None, merged: bool = False
    ) -> dict[str, float | str]:
        """The one line of a failed eval (of `tasks`: {name: why}, left out of this eval only) and
        its metrics entry: one clause per reason, the tasks it names together; the same failure as
        at the previous failed eval (of these weights, raw or merged) is "failed again (as at step
        N)", not the same ~700 characters at every eval (review RV26b 4)."""
        if tasks:
            reasons: dict[str, list[str]] = {}
            for name, reason in tasks.items():
                reasons.setdefault(reason, []).append(name)
            named = [f"task{'s' if len(n) > 1 else ''} {', '.join(n)}" for n in reasons.values()]
            full = "; ".join(f"{n} failed ({r})" for n, r in zip(named, reasons, strict=True))
            short = f"{'; '.join(named)} failed again"
            what = "it" if len(tasks) == 1 else "them"
        else:
            full, short, what = f"failed ({why})", "failed again", "it"
        first, before = self.failures.get(merged, (0, ""))
        if before != full:
            self.failures[merged] = first, before = step, full
        why = full if first == step else f"{short} (as at step {first})"
        c, last = self.checkpoint, step == self.last_step  # no later eval in this invocation (R23a M4)
        again = f"training goes on, the next eval tries {what} again"
        if not c.saves(step, self.last_step):  # no command can score it (review RV26b 2)
            saves = f"every {c.interval} steps and the last" if c.interval else "none but at a stop"
            gone = f"step {step}'s weights are not kept (checkpoint.interval = {c.interval} saves {saves})"
            then = f"it was this run's last eval step; {gone}" if last else f"{again}; {gone}"
        else:
            later = self._later(step, merged, list(tasks or []))
            then = (
                f"it was this run's last eval step: evaluate {what} later with {later}"
                if last
                else f"{again} (this step: {later})"
            )
        line = f"{why}; {then}"
        self._say(f"step {step}{' (merged weights)' if merged else ''}: {line}")
        return {"eval_error": line}

    def _evaluate(
        self, model: nn.Module, full: dict[str, torch.Tensor], step: int, t0: float, merged: bool
    ) -> dict[str, float | str]:
        # the step's own results.json, which the scores are merged into, before scoring: another's
        # damaged one failed every later eval of the run (trial RV61b F1); the table and the plot warn
        read_step_results(self.run_dir, step, merged)
        # A local task's data file as built (sha256 in data.json), else the task is not scored.
        # One reason per folder: `_failed` says it once for all its tasks (review RV26b 4).
        damaged = damaged_task_files(self.plan.data_dir, self.plan.local)
        why = task_data_problem(self.plan.data_dir, damaged) if damaged else ""
        failed = {p.stem: why for p in damaged}
        plan = self.plan.without(list(failed))  # this eval's: the next one tries every task again
        if not plan.names:
            return self._failed(step, "", failed, merged)
        if note := plan.length_note(self.max_length, step, "eval.max_length"):
            self._say(note)
        if self.copy is None:
            # On the training device (a DTensor parameter's device is its local shard's).
            self.copy = model_to_load(model.cfg, next(model.parameters()).device)
        self.copy.load_state_dict({k: v.to(torch.float32) for k, v in full.items()})
        del full
        # imported here, not at the top: without the eval extra (accelerate, which lm-eval's HF model
        # imports) the entry point itself failed to import, a traceback; the trainer's config check
        # says it in one line before step 1 (review R23a M3)
        from validation.eval_model import in_process_lm

        # lm-eval reseeds python, numpy and torch: keep the training's random state as it was.
        saved = rng_state()
        log_file = eval_dir(self.run_dir, step, merged) / EVAL_LOG
        try:  # lm-eval's bars and logs go to RUN/eval/step-N/eval.log, as with `gristmill eval`
            with eval_output(log_file):
                lm = in_process_lm(
                    self.copy,
                    self.tokenizer,
                    self.cfg.batch_size,
                    self.max_length,
                    separator_id=self.separator_id,
                )
                results = evaluate_lm(lm, plan, self.cfg, failed=failed, log_file=log_file)
        finally:
            set_rng_state(saved)
        if failed and not set(plan.names) - set(failed):
            return self._failed(step, "", failed, merged)
        export = "in-training (merged weights)" if merged else "in-training"
        label_results(results, self.run_dir, step, export, plan)
        rows = rows_of(step, results, merged)
        # results.json and eval.parquet, in one acquisition of the eval lock. From here the scores stand
        # (review R26a F3: a plot that could not be written made an eval "failed" whose scores
        # eval.parquet listed).
        write_step_json(
            self.run_dir,
            step,
            dict(results),
            merged,
            own_config=plan.own_config,
            documents_before=plan.documents_before,
        )
        seconds = time.perf_counter() - t0
        metrics: dict[str, float | str] = {metric_key(r): r["value"] for r in rows}
        metrics["eval_s"] = seconds
        at = f"step {step}{' (merged weights)' if merged else ''}"
        documents = "" if plan.documents is None else f"{plan.documents} held-out documents of "
        self._say(
            f"{at}: {_summary(rows)} ({documents}source {plan.data.source}; {seconds:.1f} s)"
            if plan.local
            else f"{at}: {_summary(rows)} ({seconds:.1f} s)"
        )
        for line in _noise(
            at, rows, chance_levels({step: results}), lambda t: _more_items(self.cfg, plan, t)
        ):
            say(line)
        if failed:
            metrics.update(self._failed(step, "", failed, merged))
        nonfinite_error(self.run_dir, step, results)  # warning lines; the trainer decides about the run
        for line in task_lines(
            step, results, self.context, "eval.max_length"
        ):  # the truncation warnings only
            if line.startswith("warning:"):
                say(line)
        # a side output, as loss.png: the scores stand
        if self.cfg.plot and (warning := write_plot(self.run_dir)):
            say(said_again(warning, step))
        elif not self.cfg.plot and not self.said_undrawn:  # once a run: the first scores it lacks
            self.said_undrawn = bool(note := undrawn_plot_note(self.run_dir, step, "metrics.plot"))
            if note:
                say(note)
        return metrics


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# A multiple-choice accuracy scored on fewer items than this gets a warning: it is noise at that size
# (on 9 held-out documents, a cloze accuracy of 0.333 ± 0.17 cannot be told from chance, 0.25).
MIN_SCORED = 20


def _headlines(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each task's headline row, its first metric in the eval table's order (bits per byte for
    perplexity tasks, acc for multiple choice)."""
    first: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=metric_order(rows)):
        first.setdefault(r["task"], r)
    return first


def _figure(r: dict[str, Any]) -> str:
    """`acc 0.333 ± 0.17 on 18 items`: the headline, its stderr and how many items it scored."""
    stderr = f" ± {r['stderr']:.2g}" if r.get("stderr") else ""
    scored = f" on {r['samples']} items" if r.get("samples") is not None else ""
    return f"{r['metric']} {r['value']:.4g}{stderr}{scored}"


def _summary(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{t} {_figure(r)}" for t, r in _headlines(rows).items())


def _more_items(cfg: EvalConfig, plan: TaskPlan, task: str) -> str:
    """What would score more of `task`'s items, as the settings stand. A larger val_fraction was
    advised while eval.docs held the documents to 40 of 53, and eval.limit = 0 while it was 0 already
    (review R17a F2); neither says anything of a hub task's items (review R17c M2)."""
    ways = [f"set eval.limit = 0 (now {cfg.limit})"] if cfg.limit else []
    if task not in plan.local:
        return "; ".join(ways) or "the task has no more (score another, larger one)"
    if plan.documents is not None and plan.documents >= cfg.docs:
        ways.append(f"raise eval.docs (now {cfg.docs}, all of them scored)")
    else:  # every held-out document is scored: the split is what is small
        ways.append("hold out more of the source (a larger val_fraction) or score another (eval.source)")
    return "; ".join(ways)


def _noise(
    at: str, rows: list[dict[str, Any]], chance: dict[str, float], more: Callable[[str], str]
) -> list[str]:
    """A warning per multiple-choice task (one with a `chance` accuracy) whose headline accuracy is
    noise: scored on fewer than MIN_SCORED items, or within two stderrs of chance. `at`: "step N",
    or "step N (merged weights)"; `more`: what scores more of a task's items (`_more_items`)."""
    out = []
    for t, r in _headlines(rows).items():
        if t not in chance or not r["metric"].startswith("acc") or r.get("samples") is None:
            continue
        few = r["samples"] < MIN_SCORED
        near = bool(r.get("stderr")) and abs(r["value"] - chance[t]) < 2 * r["stderr"]
        if few or near:
            what = (
                f"is noise at that size (fewer than {MIN_SCORED} items)"
                if few
                else f"cannot be told from chance ({chance[t]:.3g}, within two stderrs) at that size"
            )
            out.append(f"warning: {at}: {t} {_figure(r)} {what}: score more items: {more(t)}")
    return out


def main(argv: list[str] | None = None) -> int:
    return train_main(argv, make_evaluator=TrainingEval, prog="python -m validation.train_eval")


if __name__ == "__main__":
    sys.exit(main())
