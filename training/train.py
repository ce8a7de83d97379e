"""The trainer: `python -m training.train --config RECIPE.toml [--set key=value ...]`, also under torchrun.

    torchrun --standalone --nproc_per_node=2 -m training.train --config configs/train/demo.toml \
        --set parallel.shard=2

It reads as setup / train_step / loop (torchtitan's shape): `train` checks the whole config before
any work and builds the run (training/run/setup.py: preflight, then the parts in order), evaluates
a base model first ([model] init_from with [eval]: step 0), then `loop` trains. `train_step` (one
optimizer step: zero grads, accumulate micro-batches, clip, step) is separate from
`forward_backward_step` (one micro-batch).

One step of the loop, in this order (`loop`):

1. the batch, and the step trained (`train_step`: a non-finite update is never applied);
2. its verdict (training/run/verdict.Judge: the loss, the non-finite tally and the spike rule read
   once, whenever anything below is due or a rewind is on) — and the loop acts on it before
   anything else: STOP writes the step's row and ends the run (exit 3: nothing is saved, validated
   or evaluated at or after the bad step, whatever else falls due there); REWIND writes the step's
   row and goes back (training/run/rewind.Rewinder.rewind: the checkpoint restored, the timeline's
   skip, the run's artifacts brought into line with it, the skip's checkpoint saved), then goes on
   after the skip;
3. the side activities of a step that goes on, each component deciding whether it is due
   (`Due.at`): its weights join [merge]'s average (training/merge.py); the checkpoint first (when
   due, and on SIGTERM/SIGINT), so that a validation or an eval that fails or dies costs no
   training; then validation and the eval of the weights just saved (at a merge point, of the
   merged weights too: `merged/…`), which go into the step's metrics row; then the row, handed to
   the run's one writer (training/run/record.RunRecord: stdout, metrics.jsonl, trackers,
   consumption.parquet). The digests of the batches trained since the last row or save
   (training/run/batch_digests.py) go to the record at each row (the row carries its step's:
   `batch_sha256`) and before each save;
4. a stop signal ends the loop there (the step saved, exit 0; resume with --resume auto).

At the end the final weights are validated and evaluated even when a rewind's skip, not a trained
step, reached the last step; the checkpointer waits for an async save; the summary reads the
final timeline's rows only. A run owns its directory: rank 0 holds RUN/.gristmill.lock for the
whole run (training/run/lock.py), and under torchrun every worker exits when its launcher dies
(training/run/shutdown.exit_with_agent).
"""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from training.checkpoint.record import CheckpointError
from training.config import TrainConfig, load_train_config  # re-exported: `from training.train import …`
from training.config_checks import check_threads, check_tracker_timeout
from training.console import console, say
from training.contract.config_loader import (  # the CLI helpers are re-exported too
    CommandParser,
    add_config_arguments,
    add_resume_argument,
    with_resume,
)
from training.contract.errors import (
    INTERRUPTED,
    INTERRUPTED_EXIT,
    GristmillError,
    exit_on_signal_with,
    hold_closed_streams,
    peer_gone,
    print_error,
    unwritable,
)
from training.contract.lifetime import torchrun_worker
from training.contract.object_store import FETCH_STOPPED
from training.contract.run_layout import (
    BATCHES_BIN,
    check_saved_config_place,
    checkpoint_dir,
    complete_steps,
)
from training.metrics import (
    kept_losses,
    mfu,
    no_step_row,
    peak_memory_bytes,
    run_summary,
    snapshot,
    step_row,
    summary_line,
    update_ratio,
)
from training.optim import ScheduledLR, clip_grad_norm
from training.run.faults import (
    COMPLETE,
    RELEASED,
    check_faults,
    data_fault,
    fault_warnings,
    kill_point,
    sigterm_point,
)
from training.run.preflight import DistEnv, pick_device, preflight
from training.run.record import RecordUnwritable
from training.run.setup import Run, StepEval, own_run_dir, setup
from training.run.shutdown import GracefulStop, exit_with_agent
from training.run.validation import to_device
from training.run.verdict import REWIND, STOP, Verdict, guarded_step, nonfinite_code
from training.run.worker_reply import report_to_launcher


def forward_backward_step(
    model: nn.Module, batch: dict[str, torch.Tensor], scale: float, amp
) -> torch.Tensor:
    """Loss of one micro-batch and its gradient, scaled by 1/accumulation steps; returns the loss detached."""
    with amp():
        loss = model(batch["input_ids"], labels=batch["labels"], position_ids=batch.get("position_ids"))
    (loss * scale).backward()
    return loss.detach()


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: ScheduledLR,
    micro_batches: list[dict[str, torch.Tensor]],
    *,
    grad_clip: float,
    amp,
    measure_update: bool = False,
    world_size: int = 1,
) -> dict[str, Any]:
    """One optimizer step over this rank's micro-batches, not applied when the loss or gradient norm
    is not finite (`nonfinite` in the result: 0, or a code for training.run.verdict). Values stay on
    the device (no host sync) except the update ratio, which is only measured when asked (it copies
    the parameter shards)."""
    optimizer.zero_grad(set_to_none=True)
    scale = 1.0 / len(micro_batches)
    losses = [forward_backward_step(model, mb, scale, amp) for mb in micro_batches]
    loss = torch.stack(losses).mean()
    # After backward FSDP2 has resharded: these are the sharded (DTensor) parameters the optimizer holds.
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = clip_grad_norm(params, grad_clip)
    # Decided on the device: a non-finite loss (any rank) or gradient norm skips the update.
    code = nonfinite_code(loss, grad_norm, world_size)
    lr = scheduler.get_last_lr()[0]
    before = snapshot(params) if measure_update else None
    guarded_step(optimizer, code)
    scheduler.step()
    out: dict[str, Any] = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "nonfinite": code}
    if before is not None:
        out["update_ratio"] = update_ratio(params, before)
    return out


class LoaderWorkerDied(GristmillError):
    """A data.num_workers process died (the kernel's out-of-memory killer, most often): torch's line
    (`death`), then, once the run has saved what it could (`kept`), where a resume continues."""

    def __init__(self, death: str, exit_code: int, kept: str = ""):
        self.death, self.exit_code = death, exit_code
        super().__init__(f"{death} (a SIGKILL is the kernel's out-of-memory killer, most often){kept}")

    def kept(self, saved: int | None) -> LoaderWorkerDied:
        """The same death, saying where a resume continues: step `saved`, or (None) the last checkpoint."""
        resume = (
            f"step {saved} was saved: --resume auto continues from it"
            if saved is not None
            else "nothing was saved after the last checkpoint: resume with --resume auto"
        )
        return LoaderWorkerDied(
            self.death, self.exit_code, f"; {resume}, with fewer data.num_workers or less memory"
        )


def worker_death(text: str, where: str = "") -> LoaderWorkerDied | None:
    """torch's error for a DataLoader worker that died (`text`; `where`: the rank's prefix, for another
    rank's), with the shell's status (128 + the signal), else None (review R14e F1: a traceback, exit
    1). It is raised where the loop fetches a batch, between two steps (training/data/loader.py:
    _deaths_seen_at_the_fetch), so the last trained step can be saved first (_next_batch)."""
    if not text.startswith("DataLoader worker (pid"):
        return None
    death = text.split(" (a SIGKILL ", 1)[0].rstrip(". ")  # another rank's: its LoaderWorkerDied's line
    named = death.rsplit("signal: ", 1)[-1]
    sig = next((s for s in signal.Signals if signal.strsignal(s) == named), None)
    return LoaderWorkerDied(where + death, 128 + sig if sig is not None else 1)


def train(cfg: TrainConfig, out=None, evaluator: StepEval | None = None) -> dict[str, Any]:
    """Run the whole recipe; returns a summary (rank 0's view). Raises GristmillError on bad input,
    NonFiniteError (a GristmillError) when training diverged. `evaluator`: what scores the model at
    eval.interval (validation.train_eval passes one; required when eval.interval > 0); `out`: where
    rank 0 prints (default: stdout, safe against a reader that goes away)."""
    env = DistEnv.from_environ()
    if cfg.eval.interval and evaluator is None:
        raise GristmillError(
            f"eval.interval = {cfg.eval.interval} needs lm-eval inside the training processes, which "
            "`-m training.train` never imports: start the run with `gristmill train` (it does the "
            "next thing for you) or `torchrun … -m validation.train_eval --config …`, or set eval.interval=0"
        )
    device = pick_device(cfg.run.device, env.local_rank)
    threads = torch.get_num_threads()
    check_threads(cfg.run.threads)
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    pg_started = False
    if env.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        pg_started = True
    try:
        with console.bound(env.rank, out):
            for line in fault_warnings():  # a test's fault left set acts in a real run
                say(line)
            check_faults()
            # The checks, once the process group is up: rank 0 alone downloads a hub base.
            checked = preflight(cfg, env)
            check_tracker_timeout(cfg.metrics)  # after them: their refusals name the --set that gave them
            if evaluator is not None:  # its tasks: refused before the run directory and its trackers
                evaluator.check(env.rank, env.world_size, checked.model)
            # --- checks done; from here on the run does work ---
            with own_run_dir(Path(cfg.run.output_dir), env):
                run = setup(cfg, checked, env, evaluator)
                evaluate_base(run)
                try:
                    return loop(run)
                except RuntimeError as e:
                    # torch's SIGCHLD handler still installed (one of the caller's that chains to it, a
                    # loader first iterated off the main thread): the death raised mid-step, nothing saved
                    # that the fetch's path would have (review RV29d F3): its one line all the same
                    if (died := worker_death(str(e))) is None:
                        raise
                    raise died.kept(None) from None
    except OSError as e:
        # A full or read-only disk under a write that is not a checkpoint's (metrics.jsonl,
        # consumption.parquet, batches.bin, the run's records at its start): one line, as a
        # checkpoint's is, not a traceback (review R18d 2a); the newest complete checkpoint stays.
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        raise unwritable(cfg.run.output_dir, e) from None
    finally:
        if pg_started:
            dist.destroy_process_group()
        torch.set_num_threads(threads)  # an in-process caller (gristmill demo, tests) keeps its setting


def evaluate_base(run: Run) -> None:
    """Step 0 of a run from a base model ([model] init_from) with [eval]: the base's scores before
    any update (RUN/eval/step-000000, the first rows of eval.parquet, and a metrics row at step 0
    for metrics.jsonl and the trackers). Not on a resume: they are there already."""
    if run.evaluator is not None and run.model_config.init_from and run.state.step == 0:
        attempt = run.timeline.attempt if run.judge.every_step else None  # as step rows have it
        _log(
            run,
            no_step_row(0, "no step trained: the base model, before any update", 0, attempt),
            evaluate=True,
        )


@dataclass(frozen=True)
class Due:
    """What falls due at a step besides training; each component decides its own cadence."""

    save: bool  # the checkpointer's interval, or the last step
    validate: bool  # run.val_every, or the last step
    evaluate: bool  # eval.interval, or the last step
    log: bool  # run.log_every, step 1, the last step, or validation or eval (their values need a row)

    @classmethod
    def at(cls, run: Run, step: int) -> Due:
        validate = run.validation is not None and run.validation.due(step)
        evaluate = run.evaluator is not None and run.evaluator.due(step)
        log = run.metrics.due(step) or validate or evaluate
        return cls(run.checkpointer.due(step), validate, evaluate, log)


def loop(run: Run) -> dict[str, Any]:
    """Train from the state's step to `run.last_step`, one step in the order of the module's
    docstring. Returns the summary (rank 0's view). SIGINT and SIGTERM go back to the caller as they
    were, an error or not (an error after the loop left the stop's handler in place: review R18i A2)."""
    shutdown = GracefulStop(run.env.rank, run.env.world_size)
    try:
        return _loop(run, shutdown)
    finally:
        shutdown.release()
        sigterm_point(RELEASED)


def _skipped_save(run: Run) -> str | None:
    """What the run's last save being skipped (checkpoint.on_low_disk = "skip", the disk low: after a
    step or a rewind) leaves, or None when it was not: the newest complete checkpoint, or none."""
    if run.checkpointer.low_disk is None:
        return None
    steps = complete_steps(run.run_dir)
    if steps:
        return (
            f"the last complete checkpoint is {checkpoint_dir(run.run_dir, steps[-1])}: --resume auto goes "
            "on from it, training the steps after it again"
        )
    if (other := run.checkpointer.resumed_elsewhere()) is not None:  # auto does not look there (R23f 1)
        return (
            f"the last complete checkpoint is the one this run resumed from, {other}: --resume {other} goes "
            "on from it (--resume auto would start over from step 0)"
        )
    return "no checkpoint is complete: --resume auto starts over from step 0"


def _stop_advice(run: Run) -> str:
    """What a stop on a signal after step `run.state.step` leaves to do: at the plan's end or at
    run.max_steps (past it when a rewind's skip passed it) a resume has nothing to do (R18d 3); its
    save skipped, the checkpoint it goes on from (the line said "checkpoint saved" over 17 lost
    steps: review R23c 3, also after a rewind's skipped save: R23e S2)."""
    step = run.state.step
    if (skipped := _skipped_save(run)) is not None:
        return f'its checkpoint was SKIPPED (checkpoint.on_low_disk = "skip", the disk is low); {skipped}'
    if step >= run.spec.last_step:
        return "the last step, the run is complete (checkpoint saved)"
    if step >= run.last_step:
        return (
            f"run.max_steps {run.last_step} reached (checkpoint saved); go on with --resume auto and a "
            f"run.max_steps above {step}"
        )
    return "checkpoint saved; resume with --resume auto"


def _loop(run: Run, shutdown: GracefulStop) -> dict[str, Any]:
    state, checkpointer = run.state, run.checkpointer
    start = state.step  # a resumed run's summary covers its own steps, not the whole run's
    stopped_by = None
    run.metrics.start()
    batches = iter(run.loader)
    phase = None
    try:
        with shutdown, contextlib.ExitStack() as inside:
            # The loader's iterator ends inside the stop (STOP_FETCHING holds until `shutdown` exits), so
            # its prefetcher and workers give up their fetches. Ended later, on a rank that learned of a
            # stop agreed while data was awaited, they retried through an outage for their window (RV45a
            # F1). `batches` as it is then: a rewind takes a new one.
            inside.callback(lambda: _end_loader(batches))
            caught_up = _write_pending(run, resumed=True)  # a resumed checkpoint's row a kill cut off
            if run.merge is not None:  # after that row: it may read the checkpoint's merged weights
                run.merge.resume(state.step, lambda k: run.timeline.skipped(k - 1, k) > 0)
            if caught_up:  # its validation and eval are done once: the ETA's pace leaves them out
                run.metrics.pace_from_here()
            while state.step < run.last_step:
                step = state.step + 1
                checkpointer.poll()  # raises if a background save failed
                try:
                    micro_batches = _next_batch(run, batches, shutdown, start)
                except _StoppedForData as stopped:  # SIGTERM while the step's data was awaited
                    stopped_by = shutdown.should_stop() or "SIGTERM"  # every rank is here
                    advice = _stop_advice(run) if stopped.saved is not None else "resume with --resume auto"
                    say(f"stopping after step {state.step} on {stopped_by}: {advice}")
                    break
                phase = _enter_phase(run, step, phase)
                due = Due.at(run, step)
                result = _train(run, step, phase, micro_batches, measure_update=due.log)
                stop = shutdown.should_stop()  # every rank agrees, whichever ones were signalled
                verdict = run.judge.judge(
                    step, result, look=due.save or due.log or bool(stop), logged=due.log
                )
                if verdict.action == STOP:
                    _log(run, _row(run, step, phase, result, verdict))
                    _stop(run, verdict)
                if verdict.action == REWIND:
                    # The spike's row; its rewind writes consumption.parquet for the timeline it leaves.
                    _log(run, _row(run, step, phase, result, verdict), ledger=False)
                    run.rewinder.rewind(verdict.rewind)
                    run.judge.rewound(verdict.rewind.skip.checkpoint_step)
                    _write_pending(run)  # the final weights' row, when the skip reached the last step
                    batches = iter(run.loader)  # continues after the skip
                else:
                    try:
                        _go_on(run, step, phase, result, verdict, due, stop)
                    except RecordUnwritable as e:  # rank 0's alone: saved when it is the only rank
                        why = "a record of the run cannot be written"
                        _save_before_stopping(run, start, why, e, run.env.world_size == 1)
                        raise
                if stop:  # after this step's save, or the rewind's
                    stopped_by = stop
                    say(f"stopping after step {state.step} on {stop}: {_stop_advice(run)}")
                    break
            checkpointer.close()  # waits for an async save in flight
            if stopped_by is None and (skipped := _skipped_save(run)) is not None:
                say(
                    f"WARNING: the run ends at step {state.step} with its last checkpoint SKIPPED (low "
                    f"disk); {skipped}"
                )
        seconds = run.metrics.elapsed()  # the run's, not the trackers' finish below (R18d 3)
    except BaseException:
        checkpointer.abandon()  # the lock and the process group outlive no background write
        raise
    finally:
        run.record.close()  # a Ctrl-C meanwhile is a note (GracefulStop's handler after the loop)
    rewinds = run.rewinder.summary()
    if rewinds is not None:
        say(rewinds)
    run.record.finished(state.step)
    skipped = run.timeline.skipped(start, state.step)
    nonfinite = run.judge.nonfinite_after(start)
    line = summary_line(run.record.rows, start, state.step, seconds, skipped, nonfinite)
    # The curve of the run's whole record, drawn when it holds a kept loss: also where this invocation
    # trained nothing (a resume at the last step, writing the row a kill cut off, left the picture of
    # an earlier stop, or none: trial RV65c F2)
    curve = run.record.draw_loss() if kept_losses(run.record.rows) else None
    if line is not None:
        say(line + (f"; {curve}" if curve else ""))
    elif curve:  # (a note where matplotlib is missing)
        say(f"{curve} (the run's rows through step {state.step})" if curve.startswith("curve:") else curve)
    return {
        "run_dir": str(run.run_dir),
        "steps": state.step,
        "stopped_by": stopped_by,
        **run_summary(run.record.rows, start),
        "rewinds": len(run.timeline.skips),
        "seconds": seconds,
        "states": run.checkpointables,
    }


def _end_loader(batches) -> None:
    """The loader's iterator ended (its prefetcher, its workers). A failure there is a warning: the
    steps and saves are done, and the run's outcome is theirs (ended by the garbage collector, as
    before, it was an "Exception ignored" on stderr)."""
    try:
        batches.close()
    except Exception as e:
        say(f"warning: the data loader did not end cleanly: {e}")


def _go_on(run: Run, step: int, phase: int, result: dict[str, Any], verdict: Verdict, due: Due, stop) -> None:
    """A step the run goes on from (the verdict neither stops nor rewinds): its weights join the merge,
    its row held, its checkpoint when due (or on a stop signal), then the row written."""
    if run.merge is not None:
        run.merge.trained(step)
    kill_point(f"trained:{step}")
    if verdict.warning:
        say(verdict.warning)
    # a spike that could not rewind was trained: its row records it, logged step or not
    if due.log or verdict.warning:  # waits in the state (and in a checkpoint saved now)
        row = _row(run, step, phase, result, verdict)
        run.record.hold(row, validate=due.validate, evaluate=due.evaluate)
    if due.save or stop:  # first: a validation or eval that fails then costs no training
        _record_batches(run)  # a checkpoint's steps are recorded before it exists
        run.checkpointer.save(step, run.state.tokens_seen, blocking=stop is not None)
        if due.validate or due.evaluate:  # an async write committed before them, or one that died cost
            run.checkpointer.finish()  # the steps since the last checkpoint (review RV50a F1)
        kill_point(f"saved:{step}")
    _write_pending(run)


class _StoppedForData(Exception):
    """The run was asked to stop while a step's data was awaited (object_store.FetchStopped on every
    failing rank): the step trained last is saved (`saved`, None where it could not be), and the loop
    stops as after a step."""

    def __init__(self, saved: int | None):
        super().__init__(saved)
        self.saved = saved


def _next_batch(run: Run, batches, shutdown: GracefulStop, start: int) -> list[dict[str, torch.Tensor]]:
    """This rank's micro-batches of the next step, their rows hashed for the record (on the host, as
    the loader gave them: training/run/batch_digests.py). Data that cannot be had (a bucket unreachable for
    data.fetch_timeout_s, an object refused after its second fetch, a local shard gone) stops the run
    as SIGTERM does: every rank agrees first (a collective at every fetch: one rank's read may fail
    alone), the last trained step is saved, then the error is raised (one line: rank 0's own, else
    the first failing rank's, which rank 0 prints prefixed with that rank); unless a step trained
    since the host last looked was not finite and the run stops for it (exit 3, nothing saved). A
    data.num_workers process that died (the out-of-memory killer) stops the run the same way, its one
    line saying which step a resume continues from, with the shell's status for the signal."""
    try:
        data_fault(run.state.step + 1, run.env.rank)
        batch, error = next(batches), None
    except GristmillError as e:
        batch, error = None, e
    except RuntimeError as e:  # torch's, for a dead worker: found at a fetch, never mid-step (loader.py)
        if (died := worker_death(str(e))) is None:
            raise
        batch, error = None, died
    # Every rank, local data too: a MAX all-reduce of one flag while none failed (~0.5 ms on gloo,
    # bench/step_agreement.py); without it a rank whose shard or loader worker was gone stopped alone
    # and its error ended the job with nothing saved
    failed = shutdown.failed_ranks(None if error is None else str(error))
    if failed and error is None:  # the first failing rank's own line, which rank 0 prints with its rank
        rank, message = failed[0]
        error = worker_death(message, f"rank {rank}: ") or GristmillError(f"rank {rank}: {message}")
    if error is None:
        run.batches.add(run.state.step + 1, batch)
        return [to_device(mb, run.device) for mb in batch]
    # A stop asked for (SIGTERM) while the data was awaited ended every failing rank's wait: the run
    # stops as after the step it trained last, saved now (not after data.fetch_timeout_s: RV43a F1)
    asked = all(message == FETCH_STOPPED for _, message in failed)
    why = (
        f"asked to stop while the data of step {run.state.step + 1} was awaited"
        if asked
        else f"the data of step {run.state.step + 1} cannot be read"
    )
    saved = _save_before_stopping(run, start, why, error, can_save=True)  # every rank is here
    if asked:
        raise _StoppedForData(saved)
    if isinstance(error, LoaderWorkerDied):
        error = error.kept(saved)
    raise error


def _save_before_stopping(
    run: Run, start: int, why: str, error: GristmillError, can_save: bool
) -> int | None:
    """The run stops on an error that is not the model's (`why`, `error`): data that cannot be read, a
    run record that cannot be written. An async save still writing (of the step just trained, or
    before) is completed, not abandoned with the error (it had its files and no COMPLETE, and --resume
    auto went back past it); then, when every rank is here (`can_save`), the last step trained is
    saved unless a checkpoint holds it, so the error costs no training; unless a step trained since
    the host last looked was not finite: exit 3 then, nothing saved at or after it. The caller raises
    `error` after (a save that fails is said: the error stays the caller's). Returns the last trained
    step when a complete checkpoint holds it now (saved here, or by the save it had requested), else
    None: a resume goes on from the last checkpoint (nothing trained since it here, or it is lost)."""
    finished = True
    try:
        run.checkpointer.finish()
    except CheckpointError as e:  # said; the caller's error stays the run's (it is what stopped it)
        say(f"error: {e}")
        finished = False
    state = run.state
    if state.step > start and run.checkpointer.requested_step == state.step:  # held: unless failed or skipped
        return state.step if finished and run.checkpointer.low_disk is None else None
    if state.step <= start:
        return None
    if not can_save:  # the steps since the last checkpoint are lost: said (trial RV65f 2)
        newest = run.checkpointer.newest_complete()
        since = "from the start" if newest == "none" else f"from {newest}"
        say(
            f"{why}: step {state.step} not saved (a record is rank 0's alone: the other ranks cannot join "
            f"a save); {run.checkpointer.resume_option()} trains again {since}"
        )
        return None
    verdict = run.judge.settle(state.step)  # steps trained unread: a non-finite one is never saved
    if verdict.action == STOP:
        say(f"{why} ({error}); and before it:")
        _stop(run, verdict)
    # The ranks whose read succeeded have counted step state.step + 1 as handed out; the checkpoint
    # of step state.step continues at that step's batch on every rank (else, on resume, each step
    # trained the next one's batch: which rank's count a checkpoint keeps is the save's choice).
    run.loader.seek(state.step)
    try:  # the steps' batch records, before the checkpoint
        _record_batches(run)
    except RecordUnwritable as e:  # said unless it is the error that stops the run
        _say_also(e, error)
    if run.record.unrecorded is not None:  # a checkpoint past a step with no batch record would lie
        say(
            f"{why}: step {state.step} not saved: the batch records of steps {run.record.unrecorded}–"
            f"{state.step} could not be written ({BATCHES_BIN}); a resume goes on from the last checkpoint"
        )
        return None
    say(f"{why}: saving step {state.step} before stopping")
    try:
        if not run.checkpointer.save(state.step, state.tokens_seen, blocking=True):
            return None  # skipped (on_low_disk = "skip"): its warning said so
    except GristmillError as e:  # a full disk fails both: said, and the record's error stays the run's
        say(f"error: {e}")
        return None
    try:  # the audit's consumption where it saved (review R15e F1)
        run.record.finished(state.step)
    except RecordUnwritable as e:
        _say_also(e, error)
    return state.step


def _say_also(e: GristmillError, error: GristmillError) -> None:
    """A second error on the way out, said when it is not the one the run stops with."""
    if str(e) != str(error):
        say(f"error: {e}")


def _enter_phase(run: Run, step: int, previous: int | None) -> int:
    """The phase `step` belongs to, announced when it is not the phase of the previous step trained
    by this invocation (a rewind's skip may jump over a phase's first steps, or end inside an
    earlier phase than the spike's)."""
    phase, index = run.plan.locate(step - 1)
    if (phase > 0 and index == 0) if previous is None else phase != previous:
        spec = run.plan.phases[phase]
        shape = (
            f"seq_len {spec.seq_len}, {spec.global_batch} sequences ({spec.global_batch * spec.seq_len:,} "
            "tokens) per step"
        )
        first = step - index  # the phase's first step
        if index == 0:
            say(f"phase {spec.name!r} begins at step {step}: {shape}, {spec.steps} steps")
        elif run.timeline.skipped(first - 1, step - 1) == index:
            # its first steps skipped: "begins at step {step}" named the wrong step and count (R30b F4)
            say(
                f"phase {spec.name!r} began at step {first}, inside a rewind's skip: {shape}; "
                f"{spec.steps - index} of its {spec.steps} steps train, from step {step}"
            )
        else:  # a rewind back into it, whose skip ended after some of its steps trained (RV32b F5)
            say(
                f"phase {spec.name!r} again from step {step} (its step {index + 1} of {spec.steps}), after a "
                f"rewind: {shape}"
            )
    return phase


def _train(
    run: Run, step: int, phase: int, micro_batches: list[dict[str, torch.Tensor]], measure_update: bool
) -> dict[str, Any]:
    """One optimizer step, and the state's step and tokens."""
    run.fault.arm(step)
    result = train_step(
        run.model,
        run.optimizer,
        run.scheduler,
        micro_batches,
        grad_clip=run.cfg.optim.grad_clip,
        amp=run.amp,
        measure_update=measure_update,
        world_size=run.env.world_size,
    )
    tokens = run.shapes[phase].tokens_per_step
    run.state.step = step
    run.state.tokens_seen += tokens
    run.metrics.count(tokens)
    return result


def _row(run: Run, step: int, phase: int, result: dict[str, Any], verdict: Verdict) -> dict[str, Any]:
    """The metrics row of step `step`: its verdict's loss, non-finite tally and spike, the digest of
    its batch (collectives: the batch digests since the last row or save, recorded now; the peak
    memory's maximum over ranks). Completed and written by `_log`."""
    env, device = run.env, run.device
    digests = _record_batches(run)  # inside the throughput window: the record's cost is the step's
    tokens_per_s = run.metrics.tokens_per_s()  # the verdict's loss all-reduce synchronised the step
    peak = torch.tensor([float(peak_memory_bytes(device))], dtype=torch.float64, device=device)
    if env.world_size > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    row = step_row(
        step,
        verdict.loss,
        result,
        tokens_per_s=tokens_per_s,
        tokens_seen=run.state.tokens_seen,
        batch_sha256=digests[step],
        skipped=verdict.unlogged or {"skipped": 0},
        spike=verdict.spike,
        mfu=mfu(tokens_per_s, env.world_size, run.flops_per_token[phase], run.peak_flops),
        peak_memory_bytes=int(peak.item()),
    )
    if run.judge.every_step:  # 1, then 2 after the first rewind (rewind n discards attempt n)
        row["attempt"] = run.timeline.attempt
    return row


def _record_batches(run: Run) -> dict[int, str]:
    """The digests of the batches trained since the last call, gathered from every rank (collective)
    and handed to the record (RUN/batches.bin); {step: sha256}."""
    digests = run.batches.gather()
    run.record.batches(digests)
    return dict(digests)


def _write_pending(run: Run, resumed: bool = False) -> bool:
    """The pending row written, after its step's validation and eval when due (collectives): a
    step's own, after its checkpoint; the final weights' after a rewind's skip reached the run's
    last step; or, on a resume (`resumed`), the checkpoint's step whose row a kill cut off. Whether
    there was one."""
    pending = run.record.take_pending()
    if pending is not None:
        # A resume may turn validation or eval off (run.val_every = 0, eval.interval = 0 without lm-eval):
        # the row is then written without what was due at its step, and says where to get it.
        validate = pending.validate and run.validation is not None
        evaluate = pending.evaluate and run.evaluator is not None
        step = pending.row["step"]
        if resumed and (validate or evaluate):  # with this run's settings: a resume may change them
            what = " and ".join(w for w, due in (("validation", validate), ("eval", evaluate)) if due)
            say(f"step {step}'s {what}, due when the run stopped, run now (with this run's settings)")
        if pending.validate and not validate:
            say(f"step {step}'s validation was due when the run stopped; validation is off now: no val_loss")
        if pending.evaluate and not evaluate:
            say(
                f"step {step}'s eval was due when the run stopped; eval is off now: its row has none "
                f"(`gristmill eval {run.run_dir} --step {step}` scores its checkpoint)"
            )
        checkpoint_timings = run.checkpointer.take_timings()
        _log(run, pending.row, checkpoint_timings, validate=validate, evaluate=evaluate)
    return pending is not None


def _log(
    run: Run,
    row: dict[str, Any],
    checkpoint_timings: dict[str, float] | None = None,
    *,
    validate: bool = False,
    evaluate: bool = False,
    ledger: bool = True,
) -> None:
    """A row completed and handed to the record (every rank: the measures, validation and eval are
    collectives): its measures, then the step's validation and eval when due, then its time.
    `ledger`: see RunRecord.log. Validation and eval are not training time, so the throughput window
    starts over after them."""
    step = row["step"]
    run.metrics.measure(row, checkpoint_timings)
    if validate:
        row.update(run.validation(run.model, step, run.amp))
    if evaluate:
        row.update(run.evaluator(run.model, step))
    if run.merge is not None and run.merge.merged_at(step):
        row.update(_merged(run, step, validate=validate, evaluate=evaluate))
    run.record.log(run.metrics.timed(row), ledger=ledger)
    run.metrics.restart_window()


def _merged(run: Run, step: int, *, validate: bool, evaluate: bool) -> dict[str, Any]:
    """A merge point's row entries (every rank; collectives): the steps merged and, when validation
    or an eval is due there, the merged weights' scores as `merged/…`, from the model with the merged
    weights swapped in for them (then back, exactly)."""
    out = run.merge.row()
    if validate or evaluate:
        run.checkpointer.staged()  # an async save's copy of the weights is done before they move
        scores: dict[str, Any] = {}
        with run.merge.swapped():
            if validate:
                scores.update(run.validation(run.model, step, run.amp))
            if evaluate:
                scores.update(run.evaluator(run.model, step, merged=True))
        out.update({f"merged/{key}": value for key, value in scores.items()})
    return out


def _stop(run: Run, verdict: Verdict) -> None:
    """The one way a diverged run ends (exit 3): a save in flight finishes (it holds finite weights
    from before), the loss curve is drawn (consumption came with the stopped step's row), then the
    verdict's error."""
    try:
        run.checkpointer.close()
    except CheckpointError as e:  # said, but the divergence stays the error (exit 3)
        say(f"error: {e}")
    run.record.draw_loss()
    raise verdict.error(verdict.message(run.checkpointer.newest_complete()), cause=verdict.cause)


def main(
    argv: list[str] | None = None,
    make_evaluator: Callable[[TrainConfig], StepEval] | None = None,
    prog: str = "python -m training.train",
) -> int:
    """The trainer's command line; `make_evaluator` builds the eval-during-training hook from the
    config (validation.train_eval's entry point passes one)."""
    hold_closed_streams()  # a worker started with stdout closed (`torchrun … >&-`) trains on
    parser = CommandParser(prog=prog, description=__doc__.splitlines()[0])
    add_config_arguments(parser, "configs/train/demo.toml", "optim.lr=1e-4 parallel.shard=2")
    add_resume_argument(parser)
    try:
        args = parser.parse_args(argv)
    except GristmillError as e:  # a path argument's refusal (PathArgument): its one line
        return print_error(e)
    if torchrun_worker():  # never outlive the launcher
        exit_with_agent()
    try:
        overrides = with_resume(args.overrides, args.resume)
        cfg = load_train_config(args.config, overrides)
        check_saved_config_place(args.config, cfg.run.output_dir, overrides)
        evaluator = make_evaluator(cfg) if make_evaluator is not None and cfg.eval.interval else None
        train(cfg, evaluator=evaluator)
        if torchrun_worker():  # (not an in-process caller's)
            rank = DistEnv.from_environ().rank  # its teardown is all that is left
            exit_on_signal_with(0, "the run completed" if rank == 0 else None)
            sigterm_point(COMPLETE)
    except GristmillError as e:
        # Config and data errors are the same on every rank: said once, by rank 0. Every rank also
        # leaves it for the launcher, which prints it when no rank printed (an error that only
        # this rank met: its shard, its disk; training/run/worker_reply.py).
        rank = DistEnv.from_environ().rank
        if torchrun_worker():  # torchrun's SIGTERM in the teardown left: this status, not 143 (RV66e)
            exit_on_signal_with(e.exit_code, None)
        report_to_launcher(f"rank {rank}: {e}", printed=rank == 0, status=e.exit_code)
        return print_error(e) if rank == 0 else e.exit_code
    except KeyboardInterrupt:
        # A Ctrl-C outside the loop's handler (setup, a checkpoint's load; the launcher passes it to
        # every worker): one line and 130, as one process says it (pipelines/cli.py), not a
        # traceback per rank and exit 1 (review R18d 2b).
        rank = DistEnv.from_environ().rank
        report_to_launcher(f"rank {rank}: {INTERRUPTED}", printed=rank == 0, status=INTERRUPTED_EXIT)
        if rank == 0:
            with contextlib.suppress(OSError):  # a reader gone: still 130 (it was 1: review R18f 3)
                print(INTERRUPTED, file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except Exception as e:
        env = DistEnv.from_environ()
        if env.world_size > 1 and (gone := peer_gone(e)) is not None:
            # Another process of the job died (killed, or of its own error, which it printed): this
            # one's collective failed of it. One line, not a 70-line traceback from every survivor
            # above the launcher's line that names the first failure (review R23c 6).
            with contextlib.suppress(OSError):
                print(
                    f"error: rank {env.rank} stops: {gone} (another process of the job is gone)",
                    file=sys.stderr,
                )
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
