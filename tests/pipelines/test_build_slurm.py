"""Slurm executor: the sbatch scripts datatrove renders are checked, then run here as Slurm would.

sbatch is not installed on these machines, so the build runs with build.slurm.submit = false
(scripts written, nothing submitted). The array script is then executed once per array index
with stand-ins for `srun` (runs its command) and `scontrol` (names this host), and the finalize
script after them: the result must equal the local executor's dataset byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dill
import pytest

from pipelines.build import BuildError, build
from pipelines.config import DataConfig
from pipelines.tokenize_shard import TokenizeShard
from tests.helpers.build_runs import assert_same_dataset
from tests.helpers.dup_corpus import write_dup_config
from tests.helpers.s3_server import BUCKET, s3_bucket
from training.contract.config_loader import load_config
from training.contract.dataset_format import DATASET_JSON, read_dataset_info

pytestmark = pytest.mark.process  # starts processes: the second tier of `make test`

FAKE_SRUN = """#!/bin/bash
while [[ "$1" == -* ]]; do case "$1" in -n|-N) shift 2;; *) shift;; esac; done
exec "$@"
"""


def sbatch_directives(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.M))


def run_array(script: Path, tasks: int, env: dict[str, str]) -> None:
    """Run an array job's script once per index, as Slurm would (fake srun/scontrol on PATH)."""
    for index in range(tasks):
        proc = subprocess.run(
            ["bash", str(script)],
            env={**env, "SLURM_ARRAY_TASK_ID": str(index), "SLURM_JOB_ID": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]


def run_finalize(logs: Path, env: dict[str, str]) -> str:
    """Run the finalize job's script; its output (the end table)."""
    proc = subprocess.run(
        ["bash", str(logs / "finalize.slurm")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def fake_slurm_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    # the PATH of a shell that ran the venv's gristmill by its path, the venv not activated: the
    # scripts find its launch_pickled_pipeline themselves (not found before: trial RV55a 2)
    venv_bin = Path(sys.executable).parent
    path = [str(bin_dir), *(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != venv_bin)]
    return {**os.environ, "PATH": os.pathsep.join(path), "SLURM_NODELIST": "localhost"}


def test_slurm_scripts_generated_and_runnable(built_dataset, build_fixture, tmp_path):
    _, _, config = build_fixture
    out = tmp_path / "ds"
    overrides = [
        f"output={out}",
        "build.executor=slurm",
        "build.slurm.submit=false",
        "build.slurm.partition=compute",
        'build.slurm.time="01:30:00"',
        "build.slurm.cpus_per_task=3",
        'build.slurm.sbatch_args={account = "proj42"}',
    ]
    lines: list[str] = []
    result = build(load_config(DataConfig, config, overrides), log=lines.append)
    assert result.status == "written" and not (out / "dataset.json").exists()
    logs = out / "logs"
    assert lines[-1].endswith(
        f"  J1=$(sbatch --parsable --export=ALL,RUN_OFFSET=0 {logs / 'launch_script.slurm'})\n"
        f"  J2=$(sbatch --parsable --dependency=afterok:$J1 {logs / 'merge_stats.slurm'})\n"
        f"  J3=$(sbatch --parsable --dependency=afterok:$J1 {logs / 'finalize.slurm'})\n"
        f'  echo "{{\\"jobs\\": [\\"$J1\\", \\"$J2\\", \\"$J3\\"]}}" > {logs / "slurm_jobs.json"}'
    ), lines[-1]
    assert "#SBATCH --dependency" not in (logs / "merge_stats.slurm").read_text()  # on the command line
    script = (logs / "launch_script.slurm").read_text()
    assert script.startswith("#!/bin/bash\n")
    d = sbatch_directives(script)
    assert d["array"] == "0-1%2" and d["partition"] == "compute" and d["time"] == "01:30:00"
    assert d["cpus-per-task"] == "3" and d["account"] == "proj42" and d["job-name"] == "gristmill-data"
    assert "export RAYON_NUM_THREADS=3" in script
    assert f"launch_pickled_pipeline {logs / 'executor.pik'}" in script
    finalize = (logs / "finalize.slurm").read_text()
    assert "array" not in sbatch_directives(finalize)
    assert "--finalize-only" in finalize and str(out / "config.toml") in finalize
    assert 'echo "Starting data processing job gristmill-data-finalize"' in finalize  # (RV55a 4)
    for s in (logs / "launch_script.slurm", logs / "finalize.slurm"):
        subprocess.run(["bash", "-n", str(s)], check=True)
    assert json.loads((logs / "ranks_to_run.json").read_text()) == [0, 1]
    with open(logs / "executor.pik", "rb") as f:
        executor = dill.load(f)
    assert executor.world_size == 2 and isinstance(executor.pipeline[-1], TokenizeShard)

    # Run it as Slurm would: one process per array index, then the dependent finalize job.
    env = fake_slurm_env(tmp_path)
    run_array(logs / "launch_script.slurm", 2, env)
    assert re.search(r"^  validation +OK ", run_finalize(logs, env), re.M)
    assert read_dataset_info(out)["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]


def submitted_by(printed: str, tmp_path: Path) -> list[list[str]]:
    """The sbatch calls that the dry run's printed commands make, run by bash with a stand-in sbatch
    (each call's arguments, in order; job ids 101, 102, …)."""
    bin_dir, calls = tmp_path / "sbatch-bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\necho $((100 + $(wc -l < {calls})))\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    commands = printed.split("Submit with:\n", 1)[1]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-euc", commands], env=env, check=True, timeout=60)
    return [line.split() for line in calls.read_text().splitlines()]


def test_a_dry_run_of_more_tasks_than_one_array_job_prints_every_array_job(build_fixture, tmp_path):
    """Past datatrove's max_array_size (1,001 tasks) the tasks go in several array jobs, each with its
    RUN_OFFSET: the dry run printed the first alone, and the finalize failed after it ran, the tasks
    past 1,001 never submitted (trial RV62c L2). Its printed commands submit what a real submission
    does: each array job after the one before, the stats job, and the finalize after the last."""
    _, _, config = build_fixture
    out = tmp_path / "ds"
    sets = [f"output={out}", "build.executor=slurm", "build.slurm.submit=false", "build.tasks=1003"]
    lines: list[str] = []
    assert build(load_config(DataConfig, config, sets), log=lines.append).status == "written"
    logs = out / "logs"
    calls = submitted_by(lines[-1], tmp_path)
    script = str(logs / "launch_script.slurm")
    assert calls == [
        ["--parsable", "--export=ALL,RUN_OFFSET=0", script],
        ["--parsable", "--export=ALL,RUN_OFFSET=1", "--dependency=afterany:101", script],
        ["--parsable", "--dependency=afterok:102", str(logs / "merge_stats.slurm")],
        ["--parsable", "--dependency=afterok:102", str(logs / "finalize.slurm")],
    ], calls
    # recorded as a submission's ids are: the next build asks squeue for them (re-trial RV70e 1)
    assert json.loads((logs / "slurm_jobs.json").read_text()) == {"jobs": ["101", "102", "103", "104"]}
    assert sbatch_directives(Path(script).read_text())["array"] == "0-1000%2"


def test_sbatch_refusing_a_job_is_one_line_that_says_what_is_queued(build_fixture, tmp_path, monkeypatch):
    """sbatch refusing the finalize job (an account, a QOS) was a CalledProcessError traceback, the array
    job it had just queued said nowhere (trial RV62c). One line names it and the finalize's command;
    sbatch refusing the array job says that jobs it took before stay queued."""
    _, _, config = build_fixture
    bin_dir, calls = tmp_path / "sbatch-bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\n'
        'if grep -q -- "$REFUSE" "${@: -1}"; then echo "sbatch: error: Invalid account" >&2; exit 1; fi\n'
        # a job it queued, printed otherwise than "Submitted batch job N" (trial RV72a F1, F2)
        'if [ -n "$ODD" ] && grep -q -- "$ODD" "${@: -1}"; then printf "%b" "$PRINT"; exit 0; fi\n'
        f'echo "Submitted batch job $((100 + $(wc -l < {calls})))"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    logs = tmp_path / "ds" / "logs"
    sets = [f"output={tmp_path / 'ds'}", "build.executor=slurm"]
    monkeypatch.setenv("REFUSE", "--finalize-only")
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, sets), log=lambda *a: None)
    assert str(e.value) == (
        "sbatch refused the finalize job (exit 1, its reason above) after array job 101 was queued; submit "
        f"it yourself once sbatch takes it: sbatch --dependency=afterok:101 {logs / 'finalize.slurm'}"
    )
    assert json.loads((logs / "slurm_jobs.json").read_text()) == {"jobs": ["101", "102"]}
    monkeypatch.setenv("REFUSE", "launch_pickled_pipeline")
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, [*sets, f"output={tmp_path / 'other'}"]), log=lambda *a: None)
    assert (
        str(e.value)
        == "sbatch refused a job of this build (exit 1, its reason above); fix [build.slurm] and rerun"
    )
    # a later job refused: the ones queued before are named, to cancel (trial RV70c 4)
    monkeypatch.setenv("REFUSE", "merge_stats")
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, [*sets, f"output={tmp_path / 'third'}"]), log=lambda *a: None)
    assert str(e.value) == (
        "sbatch refused a job of this build (exit 1, its reason above); jobs 105 it accepted before stay "
        "queued: cancel them (scancel 105), fix [build.slurm] and rerun"
    )
    # its id was the last word ("alpha" recorded, to scancel and depend on), or an IndexError traceback
    # after the array job was queued, nothing recorded: one line, the jobs queued before it named
    monkeypatch.setenv("REFUSE", "no such line")
    monkeypatch.setenv("ODD", "launch_pickled_pipeline")
    for printed, said in (
        (
            "Submitted batch job 108 on cluster alpha\n",
            "sbatch queued job 108 on cluster alpha (it printed 'Submitted batch job 108 on cluster alpha'), "
            "a cluster where the squeue and scancel of this node do not look: cancel it (scancel -M alpha "
            "108), then submit to this node's cluster (no --clusters)",
        ),
        (
            "108;alpha\n",  # --parsable's
            "sbatch queued job 108 on cluster alpha (it printed '108;alpha'), a cluster where the squeue and "
            "scancel of this node do not look: cancel it (scancel -M alpha 108), then submit to this node's "
            "cluster (no --clusters)",
        ),
        (
            "",
            "sbatch printed no job id (it printed nothing, not 'Submitted batch job N'), and the job may be "
            "queued: find it (squeue --me) and cancel it (scancel ID), then fix what made sbatch print "
            "otherwise and rerun",
        ),
    ):
        monkeypatch.setenv("PRINT", printed)
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, [*sets, f"output={tmp_path / 'odd'}"]), log=lambda *a: None)
        assert str(e.value) == said
    monkeypatch.setenv("ODD", "merge_stats")
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, [*sets, f"output={tmp_path / 'odd'}"]), log=lambda *a: None)
    assert str(e.value).endswith(
        "(scancel ID), and jobs 110 it accepted before (scancel 110), then fix what made sbatch print "
        "otherwise and rerun"
    ), e.value
    assert json.loads((tmp_path / "odd" / "logs" / "slurm_jobs.json").read_text()) == {"jobs": ["110"]}
    # sbatch_args.parsable: its id alone, read as datatrove's retriever read it (review RV72d F1)
    monkeypatch.setenv("ODD", "launch_pickled_pipeline")
    monkeypatch.setenv("PRINT", "112\n")
    sets_parsable = [*sets, f"output={tmp_path / 'parsable'}"]
    assert build(load_config(DataConfig, config, sets_parsable), log=lambda *a: None).status == "submitted"
    jobs = json.loads((tmp_path / "parsable" / "logs" / "slurm_jobs.json").read_text())["jobs"]
    assert jobs[0] == "112" and len(jobs) == 3, jobs
    # a number a site's banner printed before "Submitted batch job N" was every job's id (re-trial RV72e F6)
    monkeypatch.setenv("PRINT", "42\nSubmitted batch job 116\n")
    sets_banner = [*sets, f"output={tmp_path / 'banner'}"]
    assert build(load_config(DataConfig, config, sets_banner), log=lambda *a: None).status == "submitted"
    jobs = json.loads((tmp_path / "banner" / "logs" / "slurm_jobs.json").read_text())["jobs"]
    assert jobs[0] == "116" and "42" not in jobs, jobs


def test_a_submission_while_the_last_ones_jobs_are_queued_is_refused(build_fixture, tmp_path, monkeypatch):
    """A build submitted again while its chain was queued submitted a second chain without a word; both
    ran each task at once over the same files, one died, and the finalize never ran (trial RV70c 1). The
    ids a submission got are recorded and looked up in squeue before the next one."""
    _, _, config = build_fixture
    bin_dir, calls = tmp_path / "slurm-bin", tmp_path / "sbatch-calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\necho "$*" >> {calls}\necho "Submitted batch job $((100 + $(wc -l < {calls})))"\n'
    )
    # squeue lists $QUEUED, or fails as on a node that cannot reach the controller
    (bin_dir / "squeue").write_text(
        '#!/bin/bash\n[[ "$*" == "--noheader --format=%i %r --user="* ]] || exit 2\n'
        'if [ -n "$DOWN" ]; then echo "slurm_load_jobs error: $DOWN" >&2; exit 1; fi\nprintf "%b" "$QUEUED"\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "ds"
    sets = [f"output={out}", "build.executor=slurm"]
    assert build(load_config(DataConfig, config, sets), log=lambda *a: None).status == "submitted"
    record = out / "logs" / "slurm_jobs.json"
    assert json.loads(record.read_text()) == {"jobs": ["101", "102", "103"]}  # array, stats, finalize
    monkeypatch.setenv(
        "QUEUED", "  101_[1%2] JobArrayTaskLimit\n 101_0 None\n 103 Dependency\n 999_[0-3] None\n"
    )
    # a dry run rewrites the scripts and ranks they read; a local build beside them writes each task's
    # files too (review RV70e 2)

    def refused(*other: str) -> str:
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, [*sets, *other]), log=lambda *a: None)
        return str(e.value)

    for other in ([], ["build.slurm.submit=false"], ["build.executor=local"]):
        assert refused(*other) == (
            "jobs 101 103 of this build's last submission are still queued or running (squeue), and the "
            "build run again beside them would run each task twice at once; wait for them to end, or cancel "
            "them (scancel 101 103), then rerun"
        )
    monkeypatch.setenv("DOWN", "Unable to contact slurm controller (connect failure)")
    assert refused() == (
        "cannot ask squeue whether jobs 101 102 103 of this build's last submission are still queued or "
        "running (squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller (connect "
        "failure)), and the build run again beside them would run each task twice at once: run it where "
        f"squeue works, or, once none of them is left (squeue --me; scancel 101 102 103), delete {record} "
        "and rerun"
    )
    assert len(calls.read_text().splitlines()) == 3  # nothing submitted again
    monkeypatch.delenv("DOWN")
    # a task failed: the jobs after it wait for ever, and "wait for them to end" was no fix (RV70e 8)
    monkeypatch.setenv("QUEUED", "102 DependencyNeverSatisfied\n103 DependencyNeverSatisfied\n")
    assert refused() == (
        "jobs 102 103 of this build's last submission wait on a job that failed (DependencyNeverSatisfied) "
        "and will never run; cancel them (scancel 102 103), then rerun"
    )
    monkeypatch.setenv("QUEUED", "999_[0-3]\n")  # the chain ended: submitted again, its ids recorded
    # task 0 finished: the array job holds task 1 alone, said so (trial RV72a small 2)
    (out / "logs" / "completions").mkdir(parents=True, exist_ok=True)
    (out / "logs" / "completions" / "00000").touch()
    lines: list[str] = []
    assert build(load_config(DataConfig, config, sets), log=lines.append).status == "submitted"
    assert json.loads(record.read_text()) == {"jobs": ["104", "105", "106"]}
    assert f"resuming {out}: 1/2 tasks already complete" in lines
    said = "submitted Slurm array job 104 (1 task of 2, the others complete) and finalize job 106"
    assert lines[-1] == said, lines


def test_a_path_a_shell_would_split_is_refused_before_any_script(build_fixture, tmp_path, monkeypatch):
    """An output with a space: the scripts were written and (submitted) queued, and every job failed
    on the cluster (`unrecognized arguments`): datatrove's and the finalize job's paths are unquoted
    (review R18c M3). Refused in one line before any script is written."""
    _, _, config = build_fixture
    out = tmp_path / "my out"
    sets = [f'output="{out}"', "build.executor=slurm", "build.slurm.submit=false"]
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, sets), log=lambda *a: None)
    said = f'build.executor = "slurm": output, {str(out)!r}, holds a character a shell splits or expands'
    assert str(e.value).startswith(said), e.value
    assert not (out / "logs" / "launch_script.slurm").exists()
    venv = ["build.executor=slurm", "build.slurm.submit=false"]
    venv += ['build.slurm.venv_path="/opt/my venv/bin/activate"']
    with pytest.raises(BuildError, match=r"build.slurm.venv_path, '/opt/my venv/bin/activate', holds a"):
        build(load_config(DataConfig, config, [f"output={tmp_path / 'ds'}", *venv]), log=lambda *a: None)
    # rendered as they were (`#SBATCH --cpus-per-task` with no value, `--mem-per-cpu=-2G`) and the
    # scripts printed as ready (review R22b F6)
    for bad, said in (
        ("build.slurm.cpus_per_task=0", "build.slurm.cpus_per_task = 0: set it ≥ 1"),
        ("build.slurm.mem_per_cpu_gb=-2", "build.slurm.mem_per_cpu_gb = -2: set it ≥ 1"),
        ('build.slurm.time=""', 'build.slurm.time = "": set the jobs\' time limit, e.g. "12:00:00"'),
    ):
        out = tmp_path / bad.split("=")[0]
        sets = [f"output={out}", "build.executor=slurm", "build.slurm.submit=false", bad]
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, sets), log=lambda *a: None)
        assert str(e.value) == said
        assert not (out / "logs" / "launch_script.slurm").exists()
    # a venv's folder, or a path not there: every job failed on the cluster once queued (trial RV62c)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    fix = f"; its activate script is {venv / 'bin' / 'activate'}"
    for path, what, then in ((venv, "a folder", fix), (tmp_path / "nowhere", "not there", "")):
        out = tmp_path / f"ds-{path.name}"
        sets = [
            f"output={out}",
            "build.executor=slurm",
            "build.slurm.submit=false",
            f"build.slurm.venv_path={path}",
        ]
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, sets), log=lambda *a: None)
        assert str(e.value) == (
            f"build.slurm.venv_path = {str(path)!r} is {what}: name the venv's activate script, which every "
            f"job sources (the path the compute nodes see, shared with this node){then}"
        ), e.value
        assert not (out / "logs" / "launch_script.slurm").exists()
    # a job name a shell or sbatch splits, an output whose % Slurm expands in the log paths (RV62c)
    for bad, said in (
        ('build.slurm.job_name="my job"', "build.slurm.job_name = 'my job': the jobs' name in their #SBATCH"),
        ('build.slurm.job_name="név"', "build.slurm.job_name = 'név': the jobs' name in their #SBATCH"),
        ("output=" + str(tmp_path / "ds%u"), f"output, {str(tmp_path / 'ds%u')!r}, holds a %, which Slurm"),
    ):
        sets = [f"output={tmp_path / 'ds-named'}", "build.executor=slurm", "build.slurm.submit=false", bad]
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, sets), log=lambda *a: None)
        assert said in str(e.value), e.value
    assert not list(tmp_path.glob("ds-named/logs/*.slurm")) and not list(tmp_path.glob("ds%u/logs/*.slurm"))
    # values pasted into the #SBATCH lines as written (a line break put a command among them), and
    # directives gristmill sets (an `array` of its own ran only some of the tasks): trial RV70c 2
    split = (
        ": a space, line break or control character in an #SBATCH line splits it or starts another; remove it"
    )
    for bad, said in (
        (
            'build.slurm.partition="gpu part"',
            f"build.slurm.partition = 'gpu part'{split} (several partitions: ",
        ),
        ('build.slurm.partition="cpu\\necho hi"', f"build.slurm.partition = 'cpu\\necho hi'{split} ("),
        ('build.slurm.qos="high prio"', f"build.slurm.qos = 'high prio'{split}"),
        ('build.slurm.time="1:00:00 extra"', f"build.slurm.time = '1:00:00 extra'{split}"),
        ('build.slurm.sbatch_args={account = "a b"}', f"build.slurm.sbatch_args.account = 'a b'{split}"),
        (
            'build.slurm.sbatch_args={"a b" = "x"}',
            "build.slurm.sbatch_args: 'a b' is no sbatch long option; ",
        ),
        # a letter was written `--A=x` or named a prefix of several options; build.slurm's own fields
        # were replaced; a false value was written as the bare flag (review RV70e 5, 7)
        ('build.slurm.sbatch_args={A = "x"}', "build.slurm.sbatch_args: 'A' is no sbatch long option; "),
        (
            'build.slurm.sbatch_args={"cpus-per-task" = "8"}',
            "build.slurm.sbatch_args.cpus-per-task: --cpus-per-task is build.slurm.cpus_per_task's; set that",
        ),
        (
            "build.slurm.sbatch_args={exclusive = false}",
            "build.slurm.sbatch_args.exclusive = false: give each value as a string, and a flag without a "
            'value as "" (exclusive = "")',
        ),
        ("build.slurm.sbatch_args={mem = 0}", "build.slurm.sbatch_args.mem = 0: give each value as a string"),
        (
            'build.slurm.sbatch_args={array = "0-1"}',
            "build.slurm.sbatch_args.array: gristmill sets --array of each job itself (the array of the "
            "tasks); remove array from build.slurm.sbatch_args",
        ),
        ('build.slurm.sbatch_args={arr = "0"}', "sbatch_args.arr: gristmill sets --array of each job"),
        ('build.slurm.sbatch_args={out = "x"}', "sbatch_args.out: gristmill sets --output of each job"),
        ('build.slurm.sbatch_args={"job-name" = "x"}', "sbatch_args.job-name: gristmill sets --job-name"),
        ('build.slurm.sbatch_args={dependency = "x"}', "sbatch_args.dependency: gristmill sets --dependency"),
        # the id came back as "alpha" of "… on cluster alpha", and squeue here never lists it; --quiet
        # printed no id, a traceback once the array job was queued (trial RV72a F1, F2)
        (
            'build.slurm.sbatch_args={clusters = "alpha"}',
            "build.slurm.sbatch_args.clusters: --clusters queues the jobs on another cluster, where the "
            "squeue and scancel of this node do not look; remove clusters from build.slurm.sbatch_args",
        ),
        ('build.slurm.sbatch_args={cluster = "alpha"}', "sbatch_args.cluster: --clusters queues the jobs"),
        ('build.slurm.sbatch_args={M = "alpha"}', "build.slurm.sbatch_args: 'M' is no sbatch long option; "),
        (
            'build.slurm.sbatch_args={quiet = ""}',
            "build.slurm.sbatch_args.quiet: --quiet keeps sbatch from printing the job ids that chain the "
            "jobs and are recorded for a rerun; remove quiet from build.slurm.sbatch_args",
        ),
        ('build.slurm.sbatch_args={qui = ""}', "sbatch_args.qui: --quiet keeps sbatch from printing"),
        ('build.slurm.sbatch_args={Q = ""}', "build.slurm.sbatch_args: 'Q' is no sbatch long option; "),
    ):
        sets = [f"output={tmp_path / 'ds-sbatch'}", "build.executor=slurm", "build.slurm.submit=false", bad]
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, sets), log=lambda *a: None)
        assert said in str(e.value) and "\n" not in str(e.value), e.value
    for var in ("SBATCH_CLUSTERS", "SLURM_CLUSTERS"):  # sbatch's --clusters too
        monkeypatch.setenv(var, "alpha")
        sets = [f"output={tmp_path / 'ds-sbatch'}", "build.executor=slurm", "build.slurm.submit=false"]
        with pytest.raises(BuildError) as e:
            build(load_config(DataConfig, config, sets), log=lambda *a: None)
        assert str(e.value) == (
            f"{var}=alpha in the environment sends sbatch's jobs to another cluster (--clusters), which "
            f"gristmill's chain of jobs and its check for queued jobs do not follow; unset {var} and submit "
            "from a login node of the cluster to use"
        )
        monkeypatch.delenv(var)
    assert not list(tmp_path.glob("ds-sbatch/logs/*.slurm"))
    sets = [f"output={tmp_path / 'ds-ok'}", "build.executor=slurm", "build.slurm.submit=false"]
    sets.append('build.slurm.sbatch_args={exclusive = "", nodes = 1, gres = "gpu:1", mem = "0"}')
    monkeypatch.chdir(tmp_path)  # a relative one, as this node resolves it (it was sourced as written)
    sets.append("build.slurm.venv_path=venv/bin/activate")
    assert build(load_config(DataConfig, config, sets), log=lambda *a: None).status == "written"
    script = (tmp_path / "ds-ok" / "logs" / "launch_script.slurm").read_text()
    assert f"source {venv / 'bin' / 'activate'}" in script
    for line in (
        "#SBATCH --exclusive\n",
        "#SBATCH --nodes=1\n",
        "#SBATCH --gres=gpu:1\n",
        "#SBATCH --mem=0\n",
    ):
        assert line in script, script


def test_slurm_dedup_stages_are_dependent_array_jobs(build_fixture, tmp_path, monkeypatch):
    # [dedup]: each stage is an array job of its own (its own logging dir and script), submitted
    # afterok the one before; the build's array job after the last. The stages' scripts, run in
    # that order, leave what a local build then finishes into the local executor's dataset (the
    # build's own array job is the one the test above runs).
    from pipelines.dedup import DedupFilter

    config, _ = write_dup_config(tmp_path, build_fixture[1])
    out = tmp_path / "slurm"
    overrides = [f"output={out}", "dedup.kind=exact"]
    slurm = [*overrides, "build.executor=slurm", "build.slurm.submit=false"]
    lines: list[str] = []
    assert build(load_config(DataConfig, config, slurm), log=lines.append).status == "written"
    logs = out / "logs"
    hashes, clusters = (logs / "dedup" / s / "launch_script.slurm" for s in ("hashes", "clusters"))
    calls = submitted_by(lines[-1], tmp_path)
    assert calls == [
        ["--parsable", "--export=ALL,RUN_OFFSET=0", str(hashes)],
        ["--parsable", "--dependency=afterok:101", str(hashes.parent / "merge_stats.slurm")],
        ["--parsable", "--export=ALL,RUN_OFFSET=0", "--dependency=afterok:101", str(clusters)],
        ["--parsable", "--dependency=afterok:103", str(clusters.parent / "merge_stats.slurm")],
        [
            "--parsable",
            "--export=ALL,RUN_OFFSET=0",
            "--dependency=afterok:103",
            str(logs / "launch_script.slurm"),
        ],
        ["--parsable", "--dependency=afterok:105", str(logs / "merge_stats.slurm")],
        ["--parsable", "--dependency=afterok:105", str(logs / "finalize.slurm")],
    ], calls
    for script, array, name in ((hashes, "0-1", "hashes"), (clusters, "0-0", "clusters")):
        d = sbatch_directives(script.read_text())
        assert d["array"].split("%")[0] == array and d["job-name"] == f"gristmill-data-dedup-{name}", d
    with open(logs / "executor.pik", "rb") as f:
        assert isinstance(dill.load(f).pipeline[-2], DedupFilter)

    env = fake_slurm_env(tmp_path)
    run_array(hashes, 2, env)
    run_array(clusters, 1, env)
    lines.clear()
    # the printed commands recorded their jobs' ids: the local build asks squeue, which lists none now
    (tmp_path / "bin" / "squeue").write_text("#!/bin/bash\n")
    (tmp_path / "bin" / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert build(load_config(DataConfig, config, overrides), log=lines.append).ok
    assert "[dedup hashes] already complete" in lines and "[dedup clusters] already complete" in lines
    local = tmp_path / "local"
    assert build(load_config(DataConfig, config, [*overrides, f"output={local}"]), log=lambda *a: None).ok
    assert_same_dataset(out, local)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with s3_bucket(tmp_path_factory.mktemp("home")) as s3:
        yield s3


def test_slurm_build_into_a_bucket_uploads_from_every_array_task(s3, built_dataset, build_fixture, tmp_path):
    # Each array task uploads its own output; the finalize job (given the URL and the work directory)
    # writes dataset.json from the bucket. What Slurm still needs shared is said before any work.
    _, _, config = build_fixture
    url, work = s3.url("slurm"), tmp_path / "work"
    overrides = [f"output={url}", f"build.workdir={work}", "build.executor=slurm", "build.slurm.submit=false"]
    lines: list[str] = []
    assert build(load_config(DataConfig, config, overrides), log=lines.append).status == "written"
    assert lines[0] == (
        f"note: build.workdir = {work} must be the same folder on every node (Slurm's jobs read their "
        "scripts and pipeline from its logs/); the shards, manifests and exclusions go from each task to "
        "the bucket"
    ), lines
    logs = work / "logs"
    assert f"--set output={url} build.workdir={work} --finalize-only" in (logs / "finalize.slurm").read_text()
    env = fake_slurm_env(tmp_path)
    run_array(logs / "launch_script.slurm", 2, env)
    assert list((work / "tasks").iterdir()) == []  # each task's folder, gone once uploaded
    table = run_finalize(logs, env)
    assert re.search(r"^  validation +OK .* each shard checked by its task$", table, re.M), table
    info = json.loads(s3.client.get_object(Bucket=BUCKET, Key=f"slurm/{DATASET_JSON}")["Body"].read())
    assert info["fingerprint"] == read_dataset_info(built_dataset)["fingerprint"]

    # [dedup] keeps its stages in the work directory: that is said too.
    lines.clear()
    dedup = [
        *overrides[2:],
        f"output={s3.url('slurm-dedup')}",
        f"build.workdir={tmp_path / 'w2'}",
        "dedup.kind=exact",
    ]
    assert build(load_config(DataConfig, config, dedup), log=lines.append).status == "written"
    assert "; [dedup]'s stages exchange files between tasks there)" in lines[0], lines
