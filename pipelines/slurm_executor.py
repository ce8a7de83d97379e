"""`build.executor = "slurm"`: one array job for the build's tasks, one dependent job that finalizes.

datatrove's SlurmPipelineExecutor renders the array job's script (logs/launch_script.slurm) and
pickles the executor (logs/executor.pik) that each array task unpickles. What it has no notion of
is the build's last step, dataset.json and validation, which must run once, after every task
succeeded, on a node that may have no network: a second script (logs/finalize.slurm), rendered
from datatrove's own template without the array directive, runs `python -m pipelines.build
--finalize-only` with the dependency afterok on the array job. build.slurm.submit = false swaps
datatrove's `sbatch` call for a recorder, so the exact scripts are written and nothing is
submitted (which is also how they are tested, where no sbatch is installed).

With [dedup], each dedup stage (pipelines/dedup.py) is an array job of its own, in its own logging
dir (OUTPUT/logs/dedup/<stage>/launch_script.slurm), chained with datatrove's `depends`: each
stage's job starts after the one before succeeded (afterok), the build's array job after the last
one, the finalize job after the build's. A stage whose tasks are all complete is not submitted.
"""

from __future__ import annotations

import copy
import getpass
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import datatrove.executor.slurm as dt_slurm
from datatrove.executor import SlurmPipelineExecutor

from pipelines.build_identity import BuildError
from pipelines.config import DataConfig, SlurmConfig
from pipelines.dedup import Stage
from training.contract.atomic_write import write_atomic
from training.contract.dataset_format import CONFIG_TOML, LOGS_DIR
from training.contract.object_store import is_url

SLURM_JOBS = "slurm_jobs.json"  # in OUTPUT/logs/: {"jobs": [id, …]}, what the last submission queued
# set for each job by gristmill (datatrove): one of build.slurm.sbatch_args replaced it, and an `array`
# of its own ran only some of the tasks (trial RV70c 2)
RESERVED = {
    "array": "the array of the tasks",
    "output": "the jobs' logs under OUTPUT/logs/",
    "error": "the jobs' logs under OUTPUT/logs/",
    "job-name": "from build.slurm.job_name",
    "dependency": "the order of the chain",
}
# sbatch options gristmill cannot work with, refused before any job is queued (trial RV72a F1, F2)
UNSUPPORTED = {
    # the id came back as "101 on cluster alpha": recorded as "alpha", and squeue and scancel here look at
    # this node's cluster only, so a rerun queued every task again beside the first (-M, the same option,
    # is a letter, refused as such)
    "clusters": "queues the jobs on another cluster, where the squeue and scancel of this node do not look",
    # no "Submitted batch job N": a traceback once the array job was queued, no id recorded
    "quiet": "keeps sbatch from printing the job ids that chain the jobs and are recorded for a rerun",
}
CLUSTERS_ENV = ("SBATCH_CLUSTERS", "SLURM_CLUSTERS")  # sbatch's --clusters, from the environment
# set from a build.slurm field of its own, which an sbatch_args entry silently replaced (`cpus-per-task`
# beside a RAYON_NUM_THREADS of build.slurm.cpus_per_task: review RV70e 7)
OWN_FIELDS = {
    "partition": "partition",
    "time": "time",
    "cpus-per-task": "cpus_per_task",
    "mem-per-cpu": "mem_per_cpu_gb",
    "qos": "qos",
}


def _refuse_unquotable(cfg: DataConfig, out: Path) -> None:
    """The Slurm scripts name paths unquoted (datatrove's launch script as well as the finalize job):
    one a shell splits or expands (a space, a quote, `$`) failed on the cluster once the jobs were
    queued (review R18c M3), so it is refused before any script is written."""
    paths = {"output": str(cfg.output), "the work directory": str(out), "the current directory": os.getcwd()}
    if cfg.build.slurm.venv_path:  # sourced by the scripts, as written (R18e 3)
        paths["build.slurm.venv_path"] = str(cfg.build.slurm.venv_path)
    elif not cfg.build.slurm.env_command:
        paths["the Python the jobs run"] = sys.executable
    for what, path in paths.items():
        if shlex.quote(path) != path:
            raise BuildError(
                f'build.executor = "slurm": {what}, {path!r}, holds a character a shell splits or expands, '
                "and the Slurm scripts (datatrove's too) name paths unquoted, so its jobs would fail once "
                "queued; use a path of letters, digits and -_./+=:@, only"
            )
        if "%" in path and what in ("output", "the work directory"):  # the jobs' log files are in it
            raise BuildError(
                f'build.executor = "slurm": {what}, {path!r}, holds a %, which Slurm expands in the jobs\' '
                "log paths (%u: the user's name), so their logs would go elsewhere; use a path without %"
            )
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", cfg.build.slurm.job_name):  # `#SBATCH --job-name=my job` (RV62c)
        raise BuildError(
            f"build.slurm.job_name = {cfg.build.slurm.job_name!r}: the jobs' name in their #SBATCH lines and "
            "scripts; use ASCII letters, digits and -_.+ only"
        )


def _refuse_unusable(sc: SlurmConfig) -> None:
    """Values sbatch cannot use, refused before any script is written: they were rendered as they
    were (`#SBATCH --cpus-per-task` with no value, `--mem-per-cpu=-2G`) and the scripts printed as
    ready (review R22b F6)."""
    for key, value in (("cpus_per_task", sc.cpus_per_task), ("mem_per_cpu_gb", sc.mem_per_cpu_gb)):
        if value < 1:
            raise BuildError(f"build.slurm.{key} = {value}: set it ≥ 1")
    if not sc.time.strip():
        raise BuildError('build.slurm.time = "": set the jobs\' time limit, e.g. "12:00:00"')
    # written into the #SBATCH lines as they are: `--partition=gpu part` (sbatch reads `gpu`), and a line
    # break put what follows among the directives (trial RV70c 2)
    values = {"partition": sc.partition, "qos": sc.qos, "time": sc.time}
    values.update((f"sbatch_args.{k}", v) for k, v in sc.sbatch_args.items())
    for key, value in values.items():
        if " " in str(value) or not str(value).isprintable():
            several = " (several partitions: join them with commas)" if key == "partition" else ""
            raise BuildError(
                f"build.slurm.{key} = {value!r}: a space, line break or control character in an #SBATCH "
                f"line splits it or starts another; remove it{several}"
            )
    for key, value in sc.sbatch_args.items():
        # long options only: a letter is written `--A=x` (which sbatch refuses) or is a prefix of several
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]+", key):
            raise BuildError(
                f"build.slurm.sbatch_args: {key!r} is no sbatch long option; name one as sbatch --help "
                'spells it, without its dashes, e.g. account = "myacct" (not A)'
            )
        # sbatch takes an abbreviation of an option too (`--arr` is `--array`)
        name = next((name for name in RESERVED if name.startswith(key)), None)
        if name is not None:
            raise BuildError(
                f"build.slurm.sbatch_args.{key}: gristmill sets --{name} of each job itself "
                f"({RESERVED[name]}); remove {key} from build.slurm.sbatch_args"
            )
        name = next((name for name in UNSUPPORTED if name.startswith(key)), None)
        if name is not None:
            raise BuildError(
                f"build.slurm.sbatch_args.{key}: --{name} {UNSUPPORTED[name]}; remove {key} from "
                "build.slurm.sbatch_args"
            )
        if key in OWN_FIELDS:
            raise BuildError(
                f"build.slurm.sbatch_args.{key}: --{key} is build.slurm.{OWN_FIELDS[key]}'s; set that "
                "instead and remove it from build.slurm.sbatch_args"
            )
        # datatrove writes a value that is false as the bare flag: `exclusive = false` was `--exclusive`,
        # `mem = 0` a `--mem` with no value, and `true` a `--exclusive=True` sbatch refuses (RV70e 5)
        if not isinstance(value, str) and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value
        ):
            raise BuildError(
                f"build.slurm.sbatch_args.{key} = {json.dumps(value)}: give each value as a string, and a "
                f'flag without a value as "" ({key} = ""); leave the key out to leave the flag out'
            )
    for var in CLUSTERS_ENV:
        if os.environ.get(var):
            raise BuildError(
                # SLURM_CLUSTERS is squeue's and scancel's too (review RV72d F8): what is refused is the
                # submission to another cluster, whose "… on cluster X" ids the chain does not take
                f"{var}={os.environ[var]} in the environment sends sbatch's jobs to another cluster "
                "(--clusters), which gristmill's chain of jobs and its check for queued jobs do not follow; "
                f"unset {var} and submit from a login node of the cluster to use"
            )
    # sourced by every job: a venv's folder, or a path that is not there, failed each job on the
    # cluster once queued (`launch_pickled_pipeline: not found`, trial RV62c)
    venv = Path(sc.venv_path).expanduser() if sc.venv_path else None
    if venv is not None and not venv.is_file():
        fix = (
            f"; its activate script is {venv / 'bin' / 'activate'}"
            if (venv / "bin" / "activate").is_file()
            else ""
        )
        what = "a folder" if venv.is_dir() else "not there"
        raise BuildError(
            f"build.slurm.venv_path = {sc.venv_path!r} is {what}: name the venv's activate script, which "
            f"every job sources (the path the compute nodes see, shared with this node){fix}"
        )


def refuse_if_queued(out: Path) -> None:
    """Refuse a submission while a job of the last one is still queued or running (squeue): a second
    chain ran every task twice at once, over the same files, and the finalize never ran (trial RV70c 1).
    The ids are those submit_slurm recorded in OUTPUT/logs/slurm_jobs.json."""
    record = out / LOGS_DIR / SLURM_JOBS
    try:
        jobs = [str(job) for job in json.loads(record.read_text())["jobs"]]
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BuildError(
            f"{record} cannot be read ({type(e).__name__}): it holds the ids of the jobs this build last "
            "submitted; once none of them is queued or running (squeue --me), delete it and rerun"
        ) from None
    ids = " ".join(jobs)
    try:
        command = ["squeue", "--noheader", "--format=%i %r", f"--user={getpass.getuser()}"]
        listed = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    except subprocess.CalledProcessError as e:
        why = f"squeue exited {e.returncode}: {(e.stderr.strip().splitlines() or [''])[-1]}"
    except (OSError, KeyError, subprocess.TimeoutExpired) as e:  # KeyError: getuser, no such user
        why = str(e)
    else:  # an array's line is ID_[0-9%2] while pending, ID_3 for a task running; then the reason
        reasons: dict[str, set[str]] = {}
        for job, reason in re.findall(r"^\s*(\d+)\S*\s*(\S*)", listed, re.M):
            reasons.setdefault(job, set()).add(reason)
        queued = [job for job in jobs if job in reasons]
        if not queued:
            return
        held = " ".join(queued)
        if all(reasons[job] == {"DependencyNeverSatisfied"} for job in queued):
            # a task before them failed: they never run, so waiting was no fix (review RV70e 8)
            raise BuildError(
                f"jobs {held} of this build's last submission wait on a job that failed "
                f"(DependencyNeverSatisfied) and will never run; cancel them (scancel {held}), then rerun"
            )
        raise BuildError(
            f"jobs {held} of this build's last submission are still queued or running (squeue), and the "
            f"build run again beside them would run each task twice at once; wait for them to end, or cancel "
            f"them (scancel {held}), then rerun"
        )
    raise BuildError(
        f"cannot ask squeue whether jobs {ids} of this build's last submission are still queued or running "
        f"({why}), and the build run again beside them would run each task twice at once: run it where "
        f"squeue works, or, once none of them is left (squeue --me; scancel {ids}), delete {record} and rerun"
    )


def _job_id(output: str, accepted: list[str]) -> str:
    """The job id in sbatch's stdout, a number: datatrove's took the last word, "alpha" of "Submitted batch
    job 101 on cluster alpha" (trial RV72a F1), and output without one was an IndexError traceback once
    the job was queued (F2); `--parsable`'s `ID` too, as datatrove's read it (review RV72d F1).
    `accepted`: the ids of this submission's jobs queued before it."""
    if m := re.search(r"^Submitted batch job (\d+)\s*$", output, re.M):
        return m[1]
    if m := re.fullmatch(r"\s*(\d+)\s*", output):  # --parsable's, as the whole output: a banner's number
        return m[1]  # before "Submitted batch job N" was every job's id (re-trial RV72e F6)
    held = " ".join(accepted)
    before = f", and jobs {held} it accepted before (scancel {held})" if held else ""
    said = repr(output.strip()[-300:]) if output.strip() else "nothing"
    if m := re.search(r"^(?:Submitted batch job (\d+) on cluster |(\d+);)(\S+)\s*$", output, re.M):
        job, cluster = m[1] or m[2], m[3]
        raise BuildError(
            f"sbatch queued job {job} on cluster {cluster} (it printed {said}), a cluster where the squeue "
            f"and scancel of this node do not look: cancel it (scancel -M {cluster} {job}){before}, then "
            "submit to this node's cluster (no --clusters)"
        )
    raise BuildError(
        f"sbatch printed no job id (it printed {said}, not 'Submitted batch job N'), and the job may be "
        f"queued: find it (squeue --me) and cancel it (scancel ID){before}, then fix what made sbatch print "
        "otherwise and rerun"
    )


def _dry_run_lines(submitted: list[tuple[str, list[str]]], scripts: list[Path]) -> list[str]:
    """The commands that submit the jobs datatrove launched (each `(contents, args)`, in order), for the
    dry run to print: every array job of a stage (more than one past max_array_size, 1,001 tasks, each
    with its RUN_OFFSET: only the first was printed, and the tasks past it never ran, trial RV62c L2),
    and the stats job after each (datatrove's merge_stats, written beside its stage's script; its
    dependency, a shell variable here, goes on the command line, where the shell expands it)."""
    lines, previous = [], scripts[-1]
    written = {p.read_text(): p for p in scripts if p.is_file()}  # read once, not once a job
    for i, (contents, args) in enumerate(submitted, 1):
        path = written.get(contents)
        if path is None:  # the stats job of the stage launched just before
            args = [
                *args,
                *(f"--dependency={d}" for d in re.findall(r"^#SBATCH --dependency=(.*)$", contents, re.M)),
            ]
            path = previous.parent / "merge_stats.slurm"
            write_atomic(path, re.sub(r"^#SBATCH --dependency=.*\n", "", contents, flags=re.M))
        lines.append(f"  J{i}=$({' '.join(['sbatch', '--parsable', *args, str(path)])})")
        previous = path
    return lines


def submit_slurm(
    cfg: DataConfig, out: Path, pipeline: list, log, stages: Sequence[Stage] = ()
) -> Literal["submitted", "written", "complete"]:
    """Write (and unless build.slurm.submit = false, submit) the sbatch scripts for `pipeline`,
    after those of the dedup `stages` (each depending on the one before).

    Returns "submitted", "written" (submit = false) or "complete": every task had finished already,
    nothing was submitted and the caller finalizes here.
    """
    sc = cfg.build.slurm
    _refuse_unquotable(cfg, out)
    _refuse_unusable(sc)
    logs = out / LOGS_DIR
    env = [f"export RAYON_NUM_THREADS={sc.cpus_per_task}"]
    if sc.env_command:
        env.append(sc.env_command)
    elif sc.venv_path:  # absolute (a relative one was sourced from the jobs' directory), links as written:
        env.append(f"source {os.path.abspath(os.path.expanduser(sc.venv_path))}")  # the nodes may lack theirs
    else:  # this interpreter's environment, as its activation would: datatrove's array scripts run a
        # bare `launch_pickled_pipeline`, not found on a PATH without it (trial RV55a 2)
        env.append(f"export PATH={Path(sys.executable).parent}:$PATH")

    def executor_for(
        steps: list, tasks: int, logging_dir: Path, job_name: str, depends=None, skip_completed=True
    ) -> SlurmPipelineExecutor:
        return SlurmPipelineExecutor(
            steps,
            tasks=tasks,
            time=sc.time,
            partition=sc.partition,
            cpus_per_task=sc.cpus_per_task,
            mem_per_cpu_gb=sc.mem_per_cpu_gb,
            workers=cfg.build.workers or -1,
            job_name=job_name,
            qos=sc.qos,
            env_command=" && ".join(env),  # one line: datatrove dedents the script template
            sbatch_args=dict(sc.sbatch_args),
            logging_dir=str(logging_dir),
            skip_completed=skip_completed,
            depends=depends,
        )

    chain: list[tuple[Stage, SlurmPipelineExecutor]] = []
    for st in stages:
        dep = chain[-1][1] if chain else None
        chain.append(
            (st, executor_for(st.pipeline, st.tasks, st.logs, f"{sc.job_name}-dedup-{st.name}", dep))
        )
    # Into a bucket, a task is done when the bucket holds its record, which it checks itself.
    executor = executor_for(
        pipeline, cfg.build.tasks, logs, sc.job_name, chain[-1][1] if chain else None, not is_url(cfg.output)
    )
    # Without an environment command the job runs this very interpreter (shared filesystems).
    python = "python" if sc.env_command or sc.venv_path else sys.executable
    named = copy.copy(executor)  # its script's "Starting … job NAME" line says the finalize job's name
    named.job_name = f"{sc.job_name}-finalize"
    finalize = named.get_launch_file_contents(
        {
            **executor.get_sbatch_args(),
            "job-name": f"{sc.job_name}-finalize",
            "array": None,
            "cpus-per-task": max(sc.cpus_per_task, 2),
            "output": str(logs / "slurm_logs" / "finalize_%j.out"),
            "error": str(logs / "slurm_logs" / "finalize_%j.out"),
        },
        f"cd {Path.cwd()} && {python} -m pipelines.build --config {out / CONFIG_TOML} "
        + (f"--set output={cfg.output} build.workdir={out}" if is_url(cfg.output) else f"--set output={out}")
        + " --finalize-only",
    )
    finalize = "".join(line for line in finalize.splitlines(True) if line.strip() != "#SBATCH --array")
    logs.mkdir(parents=True, exist_ok=True)
    write_atomic(logs / "finalize.slurm", finalize)

    submitted: list[tuple[str, list[str]]] = []
    accepted: list[str] = []  # the ids sbatch gave, recorded as it gives them (refuse_if_queued)
    real_launch = dt_slurm.launch_slurm_job

    def record(contents: str, job_id_retriever, *args) -> str:
        submitted.append((contents, list(args)))
        return f"$J{len(submitted)}"  # the shell variable the dry run's command for it sets

    def launch(contents: str, job_id_retriever, *args) -> str:
        job = real_launch(contents, lambda output: _job_id(output, accepted), *args)
        accepted.append(str(job))
        write_atomic(logs / SLURM_JOBS, json.dumps({"jobs": accepted}) + "\n")
        return job

    dt_slurm.launch_slurm_job = launch if sc.submit else record
    try:
        executor.run()
    except FileNotFoundError as e:
        raise BuildError(
            f"cannot run sbatch ({e}): this machine is not a Slurm login node. Set "
            'build.slurm.submit = false to only write the scripts, or run with build.executor = "local"'
        ) from None
    except subprocess.CalledProcessError as e:  # sbatch said why on the terminal (its stderr)
        held = " ".join(accepted)  # named: the line said to cancel them, not which (trial RV70c 4)
        queued = f"jobs {held} it accepted before stay queued: cancel them (scancel {held}), " if held else ""
        raise BuildError(
            f"sbatch refused a job of this build (exit {e.returncode}, its reason above); {queued}fix "
            "[build.slurm] and rerun"
        ) from None
    finally:
        dt_slurm.launch_slurm_job = real_launch

    script = logs / "launch_script.slurm"
    if executor.job_id == -1:  # every task already complete
        log("all tasks are already complete; finalizing here")
        return "complete"
    launched = [(st, ex) for st, ex in chain if ex.job_id != -1]  # stages with tasks left
    if not sc.submit:
        scripts = [st.logs / "launch_script.slurm" for st, _ in launched] + [script]
        lines = _dry_run_lines(submitted, scripts)
        what = f"the {len(launched)} dedup stages' scripts, " if launched else ""
        # the ids recorded as a submission's are (refuse_if_queued): by hand, a second chain beside the
        # first went unnoticed (re-trial RV70e 1)
        ids = ", ".join(f'\\"$J{i}\\"' for i in range(1, len(lines) + 2))
        log(
            f"dry run: wrote {what}{script} and {logs / 'finalize.slurm'} (nothing submitted). Submit with:\n"
            + "".join(line + "\n" for line in lines)
            + f"  J{len(lines) + 1}=$(sbatch --parsable --dependency=afterok:{executor.job_id} "
            f"{logs / 'finalize.slurm'})\n" + f'  echo "{{\\"jobs\\": [{ids}]}}" > {logs / SLURM_JOBS}'
        )
        return "written"
    try:
        job = launch(finalize, executor.job_id_retriever, f"--dependency=afterok:{executor.job_id}")
    except subprocess.CalledProcessError as e:  # a traceback, the array job queued without a word (RV62c)
        raise BuildError(
            f"sbatch refused the finalize job (exit {e.returncode}, its reason above) after array job "
            f"{executor.job_id} was queued; submit it yourself once sbatch takes it: "
            f"sbatch --dependency=afterok:{executor.job_id} {logs / 'finalize.slurm'}"
        ) from None
    dedup = ", ".join(f"{st.name} {ex.job_id}" for st, ex in launched)
    # those datatrove queued, the incomplete ones: a resumed build said all of them (trial RV72a small 2)
    queued = len(json.loads((logs / "ranks_to_run.json").read_text()))
    of = f" of {cfg.build.tasks}, the others complete" if queued < cfg.build.tasks else ""
    log(
        f"submitted Slurm array job {executor.job_id} ({queued} task{'' if queued == 1 else 's'}{of})"
        + (f" after the dedup jobs ({dedup})" if dedup else "")
        + f" and finalize job {job}"
    )
    return "submitted"
