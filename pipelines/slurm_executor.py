"""`build.executor = "slurm"`: one array job for the build's tasks, one dependent job that finalizes.

datatrove's SlurmPipelineExecutor renders the array job's script (logs/launch_script.slurm) and
pickles the executor (logs/executor.pik) that each array task unpickles. What it has no notion of
is the build's last step, dataset.json and validation, which must run once, after every task
succeeded, on a node that may have no network: a second script (logs/finalize.slurm), rendered
from datatrove's own template without the array directive, runs `python -m pipelines.build
--finalize-only` with the dependency afterok on the array job. build.slurm.submit = false swaps
datatrove's `sbatch` call for a recorder, so the exact scripts are written and nothing is
submitted (which is also how they are tested, where no sbatch is installed).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import datatrove.executor.slurm as dt_slurm
from datatrove.executor import SlurmPipelineExecutor

from pipelines.build_identity import CONFIG_TOML, BuildError
from pipelines.config import DataConfig
from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import LOGS_DIR


def submit_slurm(
    cfg: DataConfig, out: Path, pipeline: list, log
) -> Literal["submitted", "written", "complete"]:
    """Write (and unless build.slurm.submit = false, submit) the sbatch scripts for `pipeline`.

    Returns "submitted", "written" (submit = false) or "complete": every task had finished already,
    nothing was submitted and the caller finalizes here.
    """
    sc = cfg.build.slurm
    logs = out / LOGS_DIR
    env = [f"export RAYON_NUM_THREADS={sc.cpus_per_task}"]
    if sc.env_command:
        env.append(sc.env_command)
    elif sc.venv_path:
        env.append(f"source {sc.venv_path}")
    executor = SlurmPipelineExecutor(
        pipeline,
        tasks=cfg.build.tasks,
        time=sc.time,
        partition=sc.partition,
        cpus_per_task=sc.cpus_per_task,
        mem_per_cpu_gb=sc.mem_per_cpu_gb,
        workers=cfg.build.workers or -1,
        job_name=sc.job_name,
        qos=sc.qos,
        env_command=" && ".join(env),  # one line: datatrove dedents the script template
        sbatch_args=dict(sc.sbatch_args),
        logging_dir=str(logs),
        skip_completed=True,
    )
    # Without an environment command the job runs this very interpreter (shared filesystems).
    python = "python" if sc.env_command or sc.venv_path else sys.executable
    finalize = executor.get_launch_file_contents(
        {
            **executor.get_sbatch_args(),
            "job-name": f"{sc.job_name}-finalize",
            "array": None,
            "cpus-per-task": max(sc.cpus_per_task, 2),
            "output": str(logs / "slurm_logs" / "finalize_%j.out"),
            "error": str(logs / "slurm_logs" / "finalize_%j.out"),
        },
        f"cd {Path.cwd()} && {python} -m pipelines.build --config {out / CONFIG_TOML} "
        f"--set output={out} --finalize-only",
    )
    finalize = "".join(line for line in finalize.splitlines(True) if line.strip() != "#SBATCH --array")
    logs.mkdir(parents=True, exist_ok=True)
    write_atomic(logs / "finalize.slurm", finalize)

    submitted: list[list[str]] = []
    real_launch = dt_slurm.launch_slurm_job

    def record(contents: str, job_id_retriever, *args) -> str:
        submitted.append(list(args))
        return "DRYRUN"

    if not sc.submit:
        dt_slurm.launch_slurm_job = record
    try:
        executor.run()
    except FileNotFoundError as e:
        raise BuildError(
            f"cannot run sbatch ({e}): this machine is not a Slurm login node. Set "
            'build.slurm.submit = false to only write the scripts, or run with build.executor = "local"'
        ) from None
    finally:
        dt_slurm.launch_slurm_job = real_launch

    script = logs / "launch_script.slurm"
    if executor.job_id == -1:  # every task already complete
        log("all tasks are already complete; finalizing here")
        return "complete"
    if not sc.submit:
        log(
            f"dry run: wrote {script} and {logs / 'finalize.slurm'} (nothing submitted). Submit with:\n"
            f"  JOB=$(sbatch --parsable --export=ALL,RUN_OFFSET=0 {script})\n"
            f"  sbatch --dependency=afterok:$JOB {logs / 'finalize.slurm'}"
        )
        return "written"
    job = dt_slurm.launch_slurm_job(
        finalize, executor.job_id_retriever, f"--dependency=afterok:{executor.job_id}"
    )
    log(f"submitted Slurm array job {executor.job_id} ({cfg.build.tasks} tasks) and finalize job {job}")
    return "submitted"
