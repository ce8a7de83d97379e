"""`gristmill train`: train on one node, in this process or through torchrun.

    gristmill train --config configs/train/demo.toml
    gristmill train --config configs/train/demo.toml --nproc-per-node 2 --set parallel.shard=2
    gristmill train --config configs/train/demo.toml --resume auto

With --nproc-per-node 1 (the default) the trainer runs in this process; with N > 1 it runs
`python -m torch.distributed.run --standalone --nproc_per_node=N -m training.train ...`; a recipe with
`[eval] interval > 0` always goes through torchrun, as `-m validation.train_eval` (the trainer with
lm-eval in its processes). The config is checked here first, so a typo or impossible batch
arithmetic fails before any process starts.
Multi-node jobs use torchrun directly (configs/slurm/train.sbatch).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from training.config import add_resume_argument, check_config, load_train_config, with_resume
from training.contract.config_loader import add_config_arguments
from training.contract.errors import GristmillError
from training.run_lock import check_unlocked


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "configs/train/demo.toml", "optim.lr=1e-4 parallel.shard=2")
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="processes (GPUs) on this node; 1 runs in this process, N > 1 launches torchrun --standalone",
    )
    add_resume_argument(parser)
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the data plan (phases, seq_len, tokens per source, LR) from the config and the datasets, "
        "write RUN/plan.png, and exit without training",
    )


def show_plan(cfg, nproc: int) -> int:
    """`gristmill train --plan`: the plan table and plan.png; a source the plan would run out of is
    the error it would be at step 1 (after the table, so the numbers are on screen)."""
    from training.contract.run_layout import PLAN_PNG
    from training.recipe_plan import build_plan, format_plan, open_sources, plot_plan

    check_config(cfg, nproc)
    plan = build_plan(cfg, open_sources(cfg))
    for line in format_plan(plan, []):
        print(line)
    path = Path(cfg.run.output_dir) / PLAN_PNG
    print(plot_plan(plan, path) or f"plot: {path}")
    for note in plan.check_supply():
        print(f"note: {note}")
    return 0


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
    if args.nproc_per_node < 1:
        raise GristmillError(f"--nproc-per-node must be ≥ 1, got {args.nproc_per_node}")
    overrides = with_resume(args.overrides, args.resume)
    cfg = load_train_config(args.config, overrides)
    if args.plan:
        return show_plan(cfg, args.nproc_per_node)
    check_config(cfg, args.nproc_per_node)  # a typo or impossible batch fails before torch is imported
    from training.shutdown import launcher_child_preexec
    from training.train import DistEnv, preflight, train

    with_eval = cfg.eval.interval > 0  # check_config refused it above when lm-eval is missing
    if args.nproc_per_node == 1 and not with_eval:
        train(cfg)
        return 0
    preflight(cfg, DistEnv(world_size=args.nproc_per_node))
    check_unlocked(cfg.run.output_dir)  # rank 0 takes the lock; refuse a busy directory before torchrun
    module = EVAL_ENTRY if with_eval else "training.train"
    cmd = torchrun_command(args.config, overrides, args.nproc_per_node, module)
    print("+ " + " ".join(cmd), flush=True)
    # torchrun dies with this launcher, and its workers with torchrun (training.shutdown). So the
    # launcher must not die of a preemption signal itself: it only waits. A SIGTERM (a scheduler's
    # preemption) goes straight to the workers, which finish the step, save and exit 0, and torchrun
    # then exits 0 too (sent to torchrun, it would end with its own SignalException traceback).
    # Ctrl-C reaches torchrun through the terminal, which relays it to the workers.
    proc = subprocess.Popen(cmd, preexec_fn=launcher_child_preexec)
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: _signal_workers(proc, signum)),
    }
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc; torchrun's children are its workers)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    return children


def _signal_workers(torchrun: subprocess.Popen, signum: int) -> None:
    """Send `signum` to torchrun's workers, or to torchrun where they cannot be listed."""
    workers = []
    with contextlib.suppress(OSError):
        workers = child_pids(torchrun.pid)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    if not workers:
        torchrun.send_signal(signum)
