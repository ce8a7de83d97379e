"""`gristmill train`: train on one node, in this process or through torchrun.

    gristmill train --config configs/train/demo.toml
    gristmill train --config configs/train/demo.toml --nproc-per-node 2 --set parallel.shard=2
    gristmill train --config configs/train/demo.toml --resume auto

With --nproc-per-node 1 (the default) the trainer runs in this process; with N > 1 it runs
`python -m torch.distributed.run --standalone --nproc_per_node=N -m training.train ...`; a recipe with
`[eval] interval > 0` always goes through torchrun, as `-m validation.train_eval` (the trainer with
lm-eval in its processes). The config is checked here first, so a typo or impossible batch
arithmetic fails before any process starts.

Through torchrun the command ends as the single process would: with the workers' own exit status
(2 for an error, 3 for a non-finite stop, 130 for a second Ctrl-C, 0 after a Ctrl-C's or SIGTERM's
save) and their own one-line message, without torchrun's ChildFailedError report. torchrun itself
exits 1 whatever its workers did and prints that report, so it runs here as `python -m
training.launch torchrun ARGS` (`agent_main`): torch.distributed.run with the same ARGS, whose exit
status is the workers'.
Multi-node jobs run that agent on each node (configs/slurm/train.sbatch).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from training.config import load_train_config
from training.config_checks import check_output_dir, check_threads, check_tracker_timeout
from training.console import ReaderSafeOut
from training.contract.config_loader import (
    PathArgument,
    add_config_arguments,
    add_resume_argument,
    with_resume,
)
from training.contract.errors import GristmillError, sigterm_raises, wrapped
from training.contract.lifetime import AGENT_PID_VAR, signal_at_parent_death
from training.contract.run_layout import check_saved_config_place
from training.data.spec import check_config
from training.run.lock import check_unlocked
from training.run.worker_reply import REPLY_KEY, STATUS_KEY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "configs/train/demo.toml", "optim.lr=1e-4 parallel.shard=2")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="processes (GPUs) on this node; 1 runs in this process (through torchrun when eval.interval > "
        "0: lm-eval runs in the training processes), N > 1 launches torchrun --standalone",
    )
    add_resume_argument(parser)
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the data plan (phases, seq_len, tokens per source, LR) from the config and the datasets, "
        "and exit without training: nothing is created or changed (--plot FILE draws it)",
    )
    parser.add_argument(
        "--plot",
        action=PathArgument,
        local=True,
        metavar="FILE",
        help="with --plan: draw the plan (LR, tokens per step, each source's share) to FILE, creating no run",
    )


def show_plan(cfg, nproc: int, plot: str | None = None) -> int:
    """`gristmill train --plan`: the plan table and plan.png (RUN/plan.png of a run that exists, or
    `plot`); a source the plan would run out of is the error it would be at step 1 (after the
    table, so the numbers are on screen; a plan past the bound on a source before it, as the table
    walks the plan), and so are the model's checks against the data (a base's tokenizer too)."""
    import torch

    from training.checkpoint.checkpointer import check_auto_reach, find_resume, resume_checks
    from training.checkpoint.io import merge_meta, trained_plan
    from training.checkpoint.record import CheckpointError, read_complete_record
    from training.contract.run_layout import PLAN_PNG
    from training.data.loader import TokenLoader
    from training.data.recipe import (
        build_plan,
        check_run_room,
        format_plan,
        open_sources,
        plot_plan,
        recipe_notes,
    )
    from training.data.spec import applied_config, batch_shapes
    from training.merge import resume_refusal
    from training.run.preflight import model_for_data
    from training.run.setup import identity_config
    from training.run.validation import validation_of

    spec = check_config(cfg, nproc)
    run_dir = Path(cfg.run.output_dir)
    # what train refuses --plan refuses: a path's checks (a dataset, none there: RV74c 5), and a start
    # over a run's checkpoints, where it showed the run's rewinds over this config's plan, their tokens
    # counted in a plan the run never had (trial RV78a 1)
    if cfg.checkpoint.resume != "auto":
        find_resume(run_dir, cfg.checkpoint.resume, checksums=False)
    else:
        check_auto_reach(run_dir)
    # the plan a train of this config continues: a pair of one corpus it trained is a warning there
    trained = trained_plan(run_dir, cfg.checkpoint.resume)
    tables = open_sources(spec, trained=trained)
    # The trainer's model checks too (a phase longer than max_seq_len, a base's other tokenizer):
    # --plan says what train would.
    model_config, base_notes = model_for_data(cfg, spec, tables[0].info, None)
    plan = build_plan(cfg, spec, tables)
    plan.check_bounded()  # before the table, which walks the plan (RV52b F1: hours)
    shapes = batch_shapes(cfg, spec, nproc)
    settings = {"rank": 0, "world_size": shapes[0].dp_size}
    validation = validation_of(  # what train refuses before step 1: a held-out split too small for
        cfg, spec, shapes, plan, last_step=cfg.run.max_steps or spec.last_step,  # run.val_batches, and
        vocab_size=tables[0].info["vocab_size"], device=torch.device("cpu"), world_size=nproc,  # the
        settings=settings,  # cache_gb its held-out reads need too
    )  # fmt: skip
    loader = TokenLoader(plan, tables, micro_batch=tuple(s.micro_batch for s in shapes), **settings)
    room = check_run_room(spec, loader, validation)  # as train checks, from step 0
    resumed = cfg.checkpoint.resume and trained is not None and trained.loader_state is not None
    model_notes = []
    if resumed and trained.checkpoint is not None:
        # the resume's refusals before it loads, and its notes: another model shape or base, another
        # optimizer, [merge] added or changed (the plan printed, exit 0, and the resume refused: trial
        # RV77b 1)
        path = trained.checkpoint
        identity = identity_config(applied_config(cfg, spec))
        model_notes = resume_checks(
            path, read_complete_record(path), dataclasses.asdict(model_config), identity, cfg.optim.name
        )
        if cfg.merge.kind != "none":
            try:
                refusal = resume_refusal(cfg.merge, merge_meta(path))
            except CheckpointError:  # damaged: the resume, which checks its files, passes over it
                refusal = None
            if refusal is not None:
                raise refusal
    if resumed:
        # the resume's own check of the plan's past, and its notes on the future: --plan printed a
        # plan of a past the run did not train, which train then refused (trial RV64a 1)
        try:
            loader.load_state_dict(trained.loader_state)
        except GristmillError as e:
            raise GristmillError(f"cannot resume from {trained.where}: {e}") from None
        # as train has them: the resumed checkpoint's, a fork's too, whose new directory records none
        # (re-trial RV74e F2: its table said them trained)
        loader.note_cut_skips(trained.skips)
    skips = trained.skips if resumed else ()  # a plan from step 0 has none
    base = [n.removeprefix("note: ") for n in base_notes]
    notes = [n.removeprefix("note: ") for n in [*model_notes, *loader.resume_notes]]  # none unless resumed
    for line in format_plan(plan, recipe_notes(cfg, spec, tables, plan) + room + base + notes, skips):
        print(line)
    if plot:  # where the user asked: no run directory is created or touched
        note = plot_plan(plan, Path(plot), skips)
        if note is not None and note.startswith("warning:"):  # the one thing asked for (review R22h S4)
            raise GristmillError(f"--plot {plot}: {note.removeprefix('warning: ')}")
        print(note or f"plot: {plot}")
    elif run_dir.is_dir():
        # RUN/plan.png is the trainer's (drawn at its start, resume and rewinds, from the plan it
        # trains): redrawn here from a config the run never took, it showed a plan it cannot have
        # (review R16b 1b)
        png = run_dir / PLAN_PNG
        # of the plan the run in it trained, which this config's need not be (trial RV61a 3)
        own = f"{png} is the plan its trainer drew of the run there, not necessarily this config's"
        if not png.exists():
            own = f"none in {run_dir} (its trainer draws {PLAN_PNG} with metrics.plot = true)"
        print(f"plot: {own}; --plot FILE draws this one")
    else:  # --plan creates nothing: a run that never starts leaves no directory behind
        print(
            f"plot: none yet ({run_dir} does not exist; the run draws {PLAN_PNG} there when it starts; "
            "--plot FILE draws it now)"
        )
    for note in plan.check_supply():
        print(f"note: {note}")
    return 0


PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what --plot draws in (matplotlib's savefig, by the suffix)

# With [eval] interval > 0 the workers run this entry point instead: the trainer plus lm-eval, which
# training/ itself never imports (named here as a module to start, not imported).
EVAL_ENTRY = "validation.train_eval"


def torchrun_command(
    config: str, overrides: list[str], nproc: int, module: str = "training.train"
) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["-m", module, "--config", config]
    if overrides:
        cmd += ["--set", *overrides]
    return cmd


def run(args: argparse.Namespace) -> int:
    """`gristmill train`. A closed terminal (SIGHUP) never ends it: ignored from here on, not only
    once the loop runs (it ended a run in its first seconds, a resume during its checkpoint's load:
    review R18d 2e); restored after (the tests and the demo run several commands in one process). A
    SIGTERM before the loop's handler (or the relay to torchrun's workers) takes it is one line and
    143, as a Ctrl-C there is (sigterm_raises): it ended the command without a word."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN) if main_thread else None
    try:
        with sigterm_raises():
            return _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGHUP, previous)


def _run(args: argparse.Namespace) -> int:
    if args.nproc_per_node < 1:
        raise GristmillError(f"--nproc-per-node must be ≥ 1, got {args.nproc_per_node}")
    overrides = with_resume(args.overrides, args.resume)
    if args.plot and not args.plan:
        raise GristmillError(f"--plot {args.plot} draws the plan: use it with --plan")
    # another suffix was matplotlib's traceback; a directory or a bare name was drawn to NAME.png
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        kinds = ", ".join(PLOT_SUFFIXES)
        raise GristmillError(f"--plot {args.plot}: name a {kinds} file to draw the plan in")
    cfg = load_train_config(args.config, overrides)
    check_saved_config_place(args.config, cfg.run.output_dir, overrides)
    check_output_dir(cfg)  # the run's refusal, before --plan too
    if args.plan:
        return show_plan(cfg, args.nproc_per_node, args.plot)
    check_config(cfg, args.nproc_per_node)  # a typo or impossible batch fails before torch is imported
    check_threads(cfg.run.threads)  # the workers' threads, on this machine
    check_tracker_timeout(cfg.metrics)
    with_eval = cfg.eval.interval > 0  # check_config refused it above when lm-eval is missing
    if args.nproc_per_node == 1 and not with_eval:
        from training.train import train

        train(cfg)
        return 0
    # the launcher's checks import none of the trainer (training/run/preflight.py): torchrun starts sooner
    from training.run.preflight import DistEnv, preflight

    preflight(cfg, DistEnv(world_size=args.nproc_per_node))
    check_unlocked(cfg.run.output_dir)  # rank 0 takes the lock; refuse a busy directory before torchrun
    module = EVAL_ENTRY if with_eval else "training.train"
    cmd = torchrun_command(args.config, overrides, args.nproc_per_node, module)
    # pasted back into a shell, it runs the same; a reader gone already (`| head -0`, a closed
    # terminal) only stops the printing (it raised BrokenPipeError: nothing trained, exit 141: R18d 2d)
    print("+ " + shlex.join(cmd), file=ReaderSafeOut(sys.stdout), flush=True)
    # torchrun dies with this launcher, and its workers with torchrun (training.run.shutdown). So the
    # launcher must not die of a preemption signal or a Ctrl-C itself: it only waits, and passes
    # SIGTERM (a scheduler's preemption) and SIGINT straight to the workers, which finish the step,
    # save and exit 0 (a second SIGINT: at once, 130); torchrun then ends with their status. torchrun
    # runs in a process group of its own, out of the terminal's reach: a Ctrl-C there would make it
    # stop the workers its own way and end with its SignalException traceback and exit status 1.
    # The line above shows the torchrun command; it runs as `agent_main` (below), the same torchrun
    # with the workers' exit status as its own.
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.launch", AGENT_COMMAND, *cmd[3:]],
        preexec_fn=functools.partial(signal_at_parent_death, os.getpid(), signal.SIGKILL),
        process_group=0,
    )

    relayed: list[int] = []  # the signals passed to the agent itself: no worker to pass them to yet

    def relay(signum: int, frame) -> None:
        if not _signal_workers(proc, signum):
            relayed.append(signum)

    previous = {sig: signal.signal(sig, relay) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal: train on
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # torchrun's agent ended by a signal (killed, or torchrun's own exit for one passed to it): its
    # workers die with it, and no rank said a word
    if code < 0 or (code - 128 in relayed):
        say_agent_killed(proc.pid, signal.Signals(-code if code < 0 else code - 128), relayed)
    return 128 - code if code < 0 else code  # torchrun killed by a signal: the shell's 128 + N


def say_agent_killed(pid: int, sig: signal.Signals, relayed: list[int]) -> None:
    """One line for torchrun's agent ended by `sig` (trial RV65b 3, 4: exit 137 or 143 and nothing
    said): a signal this launcher passed to it while it ran no worker (`relayed`: before they started,
    or after they ended, a complete run's: RV65f 1), or another's (a kill -9, the OOM killer)."""
    if sig in relayed:
        line = (
            f"note: {sig.name} reached torchrun's agent while it ran no worker (before they started, or "
            f"after they ended): exit {128 + sig} is the agent's; the run's own lines above say what was done"
        )
    else:
        line = (
            f"error: torchrun's agent (pid {pid}) was killed by {sig.name}, and its workers with it: "
            "continue with --resume auto (from the newest complete checkpoint)"
        )
    with contextlib.suppress(OSError):  # a reader gone: the status still says it
        print(line, file=sys.stderr, flush=True)


# `python -m training.launch torchrun ARGS`: the launcher's child, torchrun with the workers' exit status.
AGENT_COMMAND = "torchrun"
_AGAIN_S = 2.0  # a second SIGTERM to the agent within this of the first is the same stop, passed on


def exit_status(failures: dict[int, Any], name: str = "worker") -> tuple[int, list[str]]:
    """The exit status of a torchrun job whose workers `failures` ({global rank: ProcessFailure}) did
    not all exit 0, and the lines to print. The first failure decides (torchrun lists them in the
    order it saw them, to the second; of equal times, a signal's death first and torchrun's SIGTERM
    last; then one that left a reply, its own error, before one that did not: a survivor's failed
    collective). A worker that exited by itself with a status > 0 has said why (train.py prints a
    GristmillError once, on rank 0; an uncaught exception prints its traceback): that status is the
    job's, rank 0's where it printed its own error since its message is the one on screen, and
    nothing is added. The others then died of the SIGTERM torchrun stops survivors with, which is no
    news. A worker killed by a signal says nothing itself: a line names it (the entry point, rank, PID
    and signal) — the first failure, or any death by a signal other than that SIGTERM (the OOM
    killer's SIGKILL, a SIGSEGV) — and a first failure by a signal makes the status 128 + the signal,
    as the shell reports such a process."""
    # A worker that said its error and was then stopped by torchrun's SIGTERM in its teardown (another
    # rank's collective failed of its going first) ends with the status its reply names: its own error
    # was the job's first, not the SIGTERM (143 and "rank 0 was killed by SIGTERM" under rank 0's own
    # full-disk line: trial RV65f 2)
    codes = {rank: _own_status(f) for rank, f in failures.items()}
    # torchrun's timestamps are whole seconds. Of failures in one second, a death by a signal other than
    # torchrun's SIGTERM (SIGKILL, SIGSEGV) comes first, then an exit of the worker's own (a survivor's
    # failed collective exits 1 of it: train.peer_gone, review R23f 3), and torchrun's SIGTERM of a
    # survivor last, a consequence (rank 0 so stopped won the tie: 143 for a SIGKILLed rank 1, R23c 5).
    first = min(
        failures,
        key=lambda r: (
            failures[r].timestamp,
            codes[r] == -signal.SIGTERM,
            codes[r] > 0,
            REPLY_KEY not in failures[r].error_file_data,
        ),
    )
    code = codes[first]
    if code > 0:
        # not rank 0's exit 1 of a collective failed by another rank's error (review RV66e 3)
        printed = 0 in failures and failures[0].error_file_data.get(REPLY_KEY) == "printed"
        code = codes[0] if printed and codes[0] > 0 else code
    else:
        code = 128 - code
    lines = [
        f"error: {name} rank {rank} (pid {f.pid}) was killed by {f.signal_name()}"
        for rank, f in failures.items()
        if codes[rank] < 0 and (rank == first or codes[rank] != -signal.SIGTERM)
    ]
    # A rank's own error that rank 0, which alone prints errors, did not stop on (its shard, its
    # disk): its message is in the reply file train.py left (training/run/worker_reply.py).
    replies = [f for f in failures.values() if REPLY_KEY in f.error_file_data]
    if replies and not any(f.error_file_data[REPLY_KEY] == "printed" for f in replies):
        lines.insert(0, f"error: {min(replies, key=lambda f: f.timestamp).message}")
    return code, lines


def _own_status(failure: Any) -> int:
    """A failed worker's exit status, as torchrun reports it (a signal: its negative number), or the
    status its reply names (training/run/worker_reply.py) when torchrun's SIGTERM stopped it after it
    said its error."""
    status = failure.error_file_data.get(STATUS_KEY) if REPLY_KEY in failure.error_file_data else None
    if failure.exitcode == -signal.SIGTERM and isinstance(status, int) and status > 0:
        return status
    return failure.exitcode


class _HeldLogs(logging.Handler):
    """Holds torchrun's own log records (torch.distributed.elastic: "Sending process N closing signal
    SIGTERM", "failed (exitcode: 2) …") instead of printing them, for `finish` to print when they
    explain something the workers did not say themselves."""

    def __init__(self, name: str = "torch.distributed.elastic"):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger(name)
        self.logger.addHandler(self)
        self.logger.propagate = False

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def finish(self, show: bool) -> None:
        self.logger.removeHandler(self)
        self.logger.propagate = True
        if show and self.logger.parent is not None:
            for record in self.records:
                self.logger.parent.handle(record)
        self.records = []


def _plain_logs(name: str = "torch.distributed.run") -> None:
    """torchrun's own notes (the OMP_NUM_THREADS banner) as torchrun prints them when run as a
    script: the message alone, not torch's log-line prefix on every line of it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.propagate = False


def _cheap_event_names() -> None:
    """torch's rendezvous names each event it records (about ten at a standalone start, more at each
    restart) by its caller's function, `inspect.stack()[2].function`, computed twice: inspect.stack
    finds every frame's source file and module, a walk of sys.modules for a frame of `-c` code. ~3 ms
    an event in a fresh agent; ~0.9 of the 1.2 CPU s a launch spent in an agent forked from a process
    that imported much (the tests' servers). The same name is the frame's code name. Absent (another
    torch), torch's own stays."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if not callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        return

    def get_method_name(depth: int = 2) -> str:
        try:  # frame `depth` counted from this one, as inspect.stack()[depth]
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # a stack shallower than depth
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def agent_main(argv: list[str]) -> int:
    """torchrun (`torch.distributed.run`) with `argv`, ending with its workers' exit status (see
    `exit_status`) instead of 1 and a ChildFailedError traceback; the workers' own output is theirs,
    untouched and live (they inherit this process's stdout and stderr)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    _plain_logs()
    _cheap_event_names()
    held = _HeldLogs()
    # A scheduler that signals every process of the job (Slurm's cancel or time limit, a systemd
    # stop) reaches this agent too. torchrun's own handler then stops the workers and SIGKILLs them
    # 30 s later, mid step or mid save at 1-8B, and ends 143 after a clean save. Here SIGTERM and
    # SIGINT are passed to the workers, which finish the step, save and exit (0), and a terminal's
    # SIGHUP is ignored, as the workers do; torchrun handles only SIGQUIT.
    # Before the workers start, and at a second SIGTERM over 2 s after the first (a worker hung in a
    # step never reaches its save), torchrun's own stop remains: SIGTERM to the workers, SIGKILL 30 s later.
    os.environ["PET_SIGNALS_TO_HANDLE"] = "SIGQUIT"  # torchrun's --signals-to-handle
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGQUIT"  # what it sets, read where it has no option
    os.environ[AGENT_PID_VAR] = str(os.getpid())  # the workers watch this agent (shutdown.exit_with_agent)
    relayed: dict[int, float] = {}  # signal: when it was first passed on

    def relay(signum: int, frame) -> None:
        # a second SIGTERM is a hung worker's escape only past _AGAIN_S: one a moment after the first is
        # the same stop (a scheduler's signal sent twice, every process signalled): torchrun's stop
        # there ended a clean save 143 with a traceback (trial RV58a F2)
        first = relayed.get(signum)
        again = signum == signal.SIGTERM and first is not None and time.monotonic() - first > _AGAIN_S
        if again or not _signal_children(os.getpid(), signum):
            sigval = signal.Signals(signum)
            raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
        relayed.setdefault(signum, time.monotonic())

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, relay)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        torchrun(parse_args(argv))
    except ChildFailedError as e:
        code, lines = exit_status(e.failures, e.name)
        held.finish(show=False)
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        return code
    except SignalException as e:  # torchrun itself was signalled; it stopped the workers with it
        held.finish(show=True)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:  # a SIGINT before torchrun set its handlers: no worker has started
        held.finish(show=True)
        return 128 + signal.SIGINT
    except Exception as e:
        if (said := rendezvous_failed(e) or rendezvous_lost(e)) is None:
            held.finish(show=True)
            raise
        held.finish(show=False)  # its 40-75 lines of traceback, the port named nowhere (trial RV55b 3)
        print(f"error: {said}", file=sys.stderr, flush=True)
        return 1
    except BaseException:
        held.finish(show=True)
        raise
    held.finish(show=True)
    return 0


def rendezvous_failed(error: BaseException) -> str | None:
    """What went wrong, in one line with its fix, when torchrun's rendezvous failed before any worker
    started (the port of MASTER_PORT or --rdzv_endpoint held by another program), else None. Not a
    RendezvousConnectionError: the agent's watch of the other nodes raises it mid-run too (review
    RV55e 4)."""
    for inner in wrapped(error):
        text = str(inner)
        if "EADDRINUSE" in text or "ddress already in use" in text:
            return (
                "torchrun's rendezvous port is in use by another program (another job on this node?): "
                "give --master_port (MASTER_PORT) or --rdzv_endpoint a free port; nothing was started"
            )
    return None


def rendezvous_lost(error: BaseException) -> str | None:
    """What went wrong, in one line with its way on, when this node's agent lost the job's rendezvous
    store mid-run (the node that hosts it, at --rdzv_endpoint, died or was stopped: Slurm's first node),
    else None: its workers had stopped with their own line, and ~90 lines of torch's traceback followed
    (trial RV67c F2). Told by the class's name: this module imports no torch at its top."""
    for inner in wrapped(error):
        if type(inner).__name__ == "RendezvousConnectionError":
            return (
                "this node lost the job's rendezvous store (on the node of --rdzv_endpoint, MASTER_ADDR): "
                "that node died or was stopped, and this node's workers stopped with it; start the job "
                "again with --resume auto"
            )
    return None


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc; torchrun's children are its workers)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    return children


def _signal_children(pid: int, signum: int) -> list[int]:
    """Send `signum` to the processes `pid` started (torchrun's: its workers); returns them."""
    children = []
    with contextlib.suppress(OSError):
        children = child_pids(pid)
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)
    return children


def _signal_workers(torchrun: subprocess.Popen, signum: int) -> bool:
    """Send `signum` to torchrun's workers, or to torchrun where they cannot be listed (none started
    yet: False)."""
    if _signal_children(torchrun.pid, signum):
        return True
    torchrun.send_signal(signum)
    return False


if __name__ == "__main__":
    if sys.argv[1:2] != [AGENT_COMMAND]:
        sys.exit(f"usage: python -m training.launch {AGENT_COMMAND} TORCHRUN_ARGS (or: gristmill train)")
    sys.exit(agent_main(sys.argv[2:]))
