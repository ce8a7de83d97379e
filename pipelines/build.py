"""`gristmill data build`: source → filters → tokenize-and-shard → dataset.json → validation.

The driver does every check that can fail on bad input before a single task starts (config,
source files or hub reachability, tokenizer and separator, free disk, a changed config in an
existing output), then runs the datatrove pipeline with the local, the Ray or the Slurm executor,
and finally writes dataset.json and validates the result.

Resume: datatrove marks finished tasks in OUTPUT/logs/completions/ and skips them on a rerun; a
killed task is redone from scratch (its outputs are a pure function of its input, so the shards
come out byte-identical). What may not change between a run and its resume — source, filters,
tokenizer file, separator policy, shard settings, task count, the input file list — is hashed into
OUTPUT/build.json before the first task runs; a rerun with a different hash is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipelines.config import DataConfig, content_identity, identity_sha256
from pipelines.sources import SourceFiles, list_source_files, non_numeric_columns
from tokenization.separator import DocumentEncoder, SeparatorPolicy
from tokenization.tokenizer_io import load_tokenizer
from training.contract.config_loader import add_config_arguments, load_config, save_config
from training.contract.dataset_format import (
    DATASET_JSON,
    EXCLUDED_DIR,
    LOGS_DIR,
    MANIFEST_DIR,
    SHARDS_DIR,
    TOKENIZER_JSON,
)
from training.contract.errors import GristmillError

HELP = "build validated token shards from a data recipe (configs/data/*.toml)"
BUILD_JSON = "build.json"
CONFIG_TOML = "config.toml"
LOCK = ".build.lock"


class BuildError(GristmillError):
    """A build that cannot start or did not finish; the message says what to do."""


@dataclass
class BuildResult:
    output: Path
    status: str  # "complete" or "submitted" (Slurm) or "written" (Slurm dry run)
    info: dict[str, Any] | None = None
    report: Any = None  # validation.validate.ValidationReport

    @property
    def ok(self) -> bool:
        return self.status != "complete" or self.report is None or bool(self.report.ok)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "configs/data/demo.toml", "build.workers=2")
    parser.add_argument(
        "--finalize-only",
        action="store_true",
        help="only write dataset.json and validate, once all tasks finished (the Slurm finalize job)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print datatrove's logs (per-task pipeline, files, stats) on the terminal; they are "
        "always written under OUTPUT/logs/",
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(DataConfig, args.config, args.overrides)
    result = finalize_only(cfg) if args.finalize_only else build(cfg, verbose=args.verbose)
    return 0 if result.ok else 1


# --------------------------------------------------------------------------------------------
# preparation: everything that can fail on bad input, before any task runs


@dataclass
class Prepared:
    cfg: DataConfig  # resolved: tasks filled in
    out: Path
    source: SourceFiles
    tokenizer_bytes: bytes
    encoder: DocumentEncoder
    identity: dict[str, Any]
    sha: str


def prepare(cfg: DataConfig, log=print) -> Prepared:
    out = Path(cfg.output).expanduser().resolve()
    if cfg.source.kind == "demo":
        from pipelines.demo_corpus import write_demo_corpus

        write_demo_corpus(cfg.source.path)
    source = list_source_files(cfg.source)
    if cfg.source.kind in ("parquet", "demo"):
        _check_parquet_columns(cfg, source)
    elif cfg.source.kind == "jsonl":
        _check_jsonl_keys(cfg, source)
    if cfg.build.executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise BuildError(
                "build.executor = \"ray\" needs Ray, which is not installed: pip install 'gristmill[ray]' "
                "(or pip install 'ray[default]'), or use build.executor = \"local\""
            ) from None
    if cfg.build.tasks < 0 or cfg.build.workers < 0:
        raise BuildError("build.tasks and build.workers must be ≥ 0 (0: automatic)")
    if not cfg.shards.target_mb > 0:
        raise BuildError(
            f"shards.target_mb = {cfg.shards.target_mb} would write one shard per document; "
            "set it > 0 (256 for FineWeb-Edu scale, 1 for the demo)"
        )
    cfg = replace(cfg, build=replace(cfg.build, tasks=cfg.build.tasks or len(source.files)))
    if cfg.build.tasks > len(source.files):
        log(
            f"note: {cfg.build.tasks} tasks for {len(source.files)} input files; "
            f"{cfg.build.tasks - len(source.files)} tasks will have nothing to read"
        )

    tok_bytes, encoder = resolve_tokenizer(cfg, source, log)
    identity = content_identity(cfg, hashlib.sha256(tok_bytes).hexdigest(), source.identity())
    return Prepared(cfg, out, source, tok_bytes, encoder, identity, identity_sha256(identity))


def _check_parquet_columns(cfg: DataConfig, source: SourceFiles) -> None:
    for f in source.files:
        path = Path(source.folder) / f
        try:
            schema = pq.read_schema(path)
        except Exception as e:  # not parquet, truncated, unreadable
            raise BuildError(
                f"{path} is not a readable parquet file ({e}); remove it or fix source.glob"
            ) from None
        names = schema.names
        for col, typ in non_numeric_columns(schema):
            raise BuildError(
                f"{path}: column {col!r} holds {typ}, not numbers; cast it to a number type (FineWeb-Edu "
                f"uses int64 for int_score and token_count, double for score and language_score) or drop it"
            )
        if cfg.source.text_key not in names:
            raise BuildError(
                f"{path} has no column {cfg.source.text_key!r} (columns: {', '.join(names)}); "
                "set source.text_key to the text column"
            )


def _check_jsonl_keys(cfg: DataConfig, source: SourceFiles) -> None:
    """The first JSON object of each file must hold source.text_key; without this check a typo in
    it builds an empty dataset (every document excluded as empty) that validates fine."""
    import fsspec

    for f in source.files:
        path = Path(source.folder) / f
        try:
            with fsspec.open(str(path), "rb", compression="infer") as fh:
                first = next((line for line in io.BufferedReader(fh) if line.strip()), None)
        except Exception as e:  # not gzip/zstd after all, unreadable
            raise BuildError(
                f"{path} is not a readable jsonl file ({type(e).__name__}: {e}); remove it or fix source.glob"
            ) from None
        try:
            obj = json.loads(first) if first else None
        except ValueError:
            continue  # a malformed line is excluded with its reason by the reader
        if isinstance(obj, dict) and cfg.source.text_key not in obj:
            raise BuildError(
                f"{path}: the first JSON object has no key {cfg.source.text_key!r} (keys: "
                f"{', '.join(obj)}); set source.text_key to the text field"
            )


def resolve_tokenizer(cfg: DataConfig, source: SourceFiles, log=print) -> tuple[bytes, DocumentEncoder]:
    """The exact tokenizer file bytes and a DocumentEncoder built from them (checks the separator)."""
    spec = cfg.tokenizer.path
    if not spec:
        raise BuildError(
            "tokenizer.path is empty; set it to a tokenizer.json or a hub name, or train one with "
            "`gristmill tokenizer train --config CONFIG`"
        )
    path = Path(spec).expanduser()
    local_like = spec.endswith(".json") or spec.startswith((".", "/", "~")) or path.exists()
    if local_like and not path.exists() and cfg.tokenizer.train.if_missing:
        from tokenization.train import train_tokenizer

        log(
            f"tokenizer {path} does not exist yet: training a "
            f"{cfg.tokenizer.train.vocab_size}-token BPE on the source"
        )
        train_tokenizer(cfg, source=source, log=log)
    tok = load_tokenizer(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    tok_bytes = path.read_bytes() if path.is_file() else tok.to_str(pretty=True).encode()
    policy = SeparatorPolicy(cfg.tokenizer.separator, cfg.tokenizer.position)
    encoder = DocumentEncoder(tok, policy, source=f"tokenizer {spec}")
    return tok_bytes, encoder


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if old != new:
        return [f"{prefix.rstrip('.')}: {old!r} → {new!r}"]
    return []


def _input_changes(old: list[dict], new: list[dict], tasks: int, finished: set[int]) -> list[str]:
    """Each input file that was added, removed or changed size, by name."""
    was = {f["file"]: (i, f["bytes"]) for i, f in enumerate(old)}
    now = {f["file"]: f["bytes"] for f in new}
    out = [f"input file {n} was removed" for n in was if n not in now]
    out += [f"input file {n} was added" for n in now if n not in was]
    for n, (i, size) in was.items():
        if n in now and now[n] != size:
            done = " (its task finished: its shards hold the old file)" if i % tasks in finished else ""
            out.append(f"input file {n}: {size:,} → {now[n]:,} bytes{done}")
    return out


@contextlib.contextmanager
def _locked(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(
                f"another `gristmill data build` is writing {out}; wait for it to finish"
            ) from None
        yield


def _finished_tasks(out: Path) -> set[int]:
    from pipelines.progress import finished_tasks

    return finished_tasks(out / LOGS_DIR / "completions")


def _check_output(p: Prepared, log=print) -> dict[str, Any] | None:
    """Refuse a changed config or a foreign directory; return build.json if resuming."""
    bj = p.out / BUILD_JSON
    if bj.is_file():
        old = _read_json(
            bj, f"cannot tell which config built {p.out}; delete {p.out} to rebuild from scratch"
        )
        if old.get("config_sha256") != p.sha:
            finished = _finished_tasks(p.out)
            was = dict(old.get("identity", {}))
            old_files, new_files = was.get("input_files") or [], p.identity["input_files"]
            changes = _diff(
                {k: v for k, v in was.items() if k != "input_files"}, {**p.identity, "input_files": None}
            )
            resized = [i for i, (a, b) in enumerate(zip(old_files, new_files)) if a["bytes"] != b["bytes"]]
            # A re-downloaded input whose task never finished is fine: that task reads the new file
            # (a task reads files[rank::tasks]; an added or removed file would move later ones).
            if (
                not changes
                and [f["file"] for f in old_files] == [f["file"] for f in new_files]
                and not any(i % p.identity["tasks"] in finished for i in resized)
            ):
                replaced = [
                    f"{new_files[i]['file']} ({old_files[i]['bytes']:,} → {new_files[i]['bytes']:,} bytes)"
                    for i in resized
                ]
                log(f"input changed since the last run: {', '.join(replaced)}; its task had not finished")
                return _write_build_json(p)
            changes += _input_changes(old_files, new_files, p.cfg.build.tasks, finished)
            raise BuildError(
                f"{p.out} was built with a different config, refusing to mix the two (changed: "
                f"{'; '.join(changes) or 'unknown'}). Build into a new `output` directory, or start over "
                f"with `rm -rf {p.out}` and the same command."
            )
        return old
    leftovers = [n for n in (SHARDS_DIR, MANIFEST_DIR, DATASET_JSON) if (p.out / n).exists()]
    if leftovers:
        raise BuildError(
            f"{p.out} already holds {', '.join(leftovers)} but no {BUILD_JSON}: not a resumable gristmill "
            "build; pick an empty `output` directory"
        )
    return None


# --------------------------------------------------------------------------------------------
# the pipeline


def make_pipeline(p: Prepared) -> list:
    from pipelines.filters import make_filters
    from pipelines.progress import TaskProgress
    from pipelines.sources import make_reader
    from pipelines.tokenize_shard import TokenizeShard

    cfg = p.cfg
    progress = TaskProgress(p.out / LOGS_DIR / "progress", cfg.build.progress_interval)
    return [
        make_reader(cfg.source, p.source, progress),
        *make_filters(cfg.filters, p.out),
        TokenizeShard(
            p.out,
            p.out / TOKENIZER_JSON,
            SeparatorPolicy(cfg.tokenizer.separator, cfg.tokenizer.position),
            target_bytes=int(cfg.shards.target_mb * (1 << 20)),
            shuffle=cfg.shards.shuffle,
            seed=cfg.shards.seed,
            batch_chars=cfg.shards.encode_batch_chars,
            min_free_gb=cfg.build.min_free_gb,
            progress=progress,
        ),
    ]


def build(cfg: DataConfig, log=print, verbose: bool = False) -> BuildResult:
    """Build (or resume, or revalidate) the dataset `cfg` describes; `verbose`: datatrove's logs
    on the terminal too, not only under OUTPUT/logs/."""
    from pipelines.tokenize_shard import check_free_space

    p = prepare(cfg, log)
    with _locked(p.out):
        previous = _check_output(p, log)
        info_path = p.out / DATASET_JSON
        info = _read_json(info_path, DATASET_JSON_FIX) if previous and info_path.is_file() else None
        if info is not None and info.get("status") == "complete":
            log(f"{p.out} is already complete (same config); validated it again:")
            return _validate(p.cfg, p.out, info, log)
        finished = _finished_tasks(p.out)
        check_free_space(
            p.out,
            0,
            p.cfg.build.min_free_gb,
            "start the build",
            f" ({len(finished)} finished tasks are kept)" if finished else "",
        )
        tok_dst = p.out / TOKENIZER_JSON
        if not tok_dst.is_file() or tok_dst.read_bytes() != p.tokenizer_bytes:
            _write_atomic(tok_dst, p.tokenizer_bytes)
        save_config(p.cfg, p.out / CONFIG_TOML)
        if previous is None:
            _write_build_json(p)
        else:
            log(f"resuming {p.out}: {len(finished)}/{p.cfg.build.tasks} tasks already complete")

        pipeline = make_pipeline(p)
        if p.cfg.build.executor == "slurm":
            return _submit_slurm(p, pipeline, log)
        (_run_ray if p.cfg.build.executor == "ray" else _run_local)(p, pipeline, log, verbose)
        return _finish(p.cfg, p.out, p.sha, p.encoder, log)


def _run_local(p: Prepared, pipeline: list, log, verbose: bool = False) -> None:
    from datatrove.executor import LocalPipelineExecutor

    from pipelines.build_logs import QuietLocalExecutor

    tasks = p.cfg.build.tasks
    workers = min(p.cfg.build.workers or os.cpu_count() or 1, tasks)
    # One tokenizer thread pool per worker process, sized so the workers share the cores.
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    executor = lambda: (LocalPipelineExecutor if verbose else QuietLocalExecutor)(
        pipeline, tasks=tasks, workers=workers, logging_dir=str(p.out / LOGS_DIR), skip_completed=True
    )
    _run_executor(p, executor, f"on {workers} workers", log, verbose)


def _run_ray(p: Prepared, pipeline: list, log, verbose: bool = False) -> None:
    from pipelines.ray_executor import GristmillRayExecutor, ray_cluster

    rc = p.cfg.build.ray
    with ray_cluster(rc, verbose, log) as where:
        executor = lambda: GristmillRayExecutor(
            pipeline,
            tasks=p.cfg.build.tasks,
            workers=p.cfg.build.workers or -1,
            logging_dir=str(p.out / LOGS_DIR),
            skip_completed=True,
            cpus_per_task=rc.cpus_per_task,
            mem_per_cpu_gb=rc.mem_per_cpu_gb,
            verbose=verbose,
        )
        _run_executor(p, executor, where, log, verbose)


def _run_executor(p: Prepared, make_executor, where: str, log, verbose: bool) -> None:
    """Run the tasks with `make_executor()`'s datatrove executor (made inside the log redirection:
    executors log when made) under the progress Monitor; a failed task is a BuildError."""
    from pipelines.build_logs import EXECUTOR_LOG, loguru_to
    from pipelines.progress import Monitor

    tasks = p.cfg.build.tasks
    logs = p.out / LOGS_DIR
    logs_note = "" if verbose else f"; datatrove's logs: {logs}/"
    log(f"[build] {tasks} tasks {where}, {p.source.total_bytes / 1e6:,.1f} MB of input{logs_note}")
    monitor = Monitor(
        logs / "progress",
        logs / "completions",
        tasks,
        p.source.total_bytes,
        p.cfg.build.progress_interval,
        live=sys.stderr.isatty(),
    )
    try:
        with monitor, contextlib.nullcontext() if verbose else loguru_to(logs / EXECUTOR_LOG):
            make_executor().run()
    except GristmillError:
        raise
    except Exception as e:
        raise BuildError(_failed_message(p.out, tasks, e)) from None
    line = None if monitor.live else monitor.line()
    if line:
        log(line)


def _failed_message(out: Path, tasks: int, err: BaseException | None = None) -> str:
    done = len(_finished_tasks(out))
    what = f" ({type(err).__name__}: {err})" if err else ""
    kept = f"the {done} finished tasks are kept, the others are redone" if done else "every task is redone"
    return (
        f"{tasks - done} of {tasks} tasks did not finish{what}; their logs are in {out / LOGS_DIR / 'logs'}. "
        f"Fix the cause and rerun the same command: {kept}."
    )


# --------------------------------------------------------------------------------------------
# Slurm: one array job for the tasks, one dependent job that finalizes and validates


def _submit_slurm(p: Prepared, pipeline: list, log) -> BuildResult:
    """Write (and unless build.slurm.submit = false, submit) the sbatch scripts.

    datatrove renders the array job's script (logs/launch_script.slurm) and pickles the executor
    (logs/executor.pik) that each array task unpickles; with submit = false its `sbatch` call is
    swapped for a recorder, so the exact script is written without submitting anything.
    """
    import datatrove.executor.slurm as dt_slurm
    from datatrove.executor import SlurmPipelineExecutor

    cfg, sc = p.cfg, p.cfg.build.slurm
    logs = p.out / LOGS_DIR
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
        f"cd {Path.cwd()} && {python} -m pipelines.build --config {p.out / CONFIG_TOML} "
        f"--set output={p.out} --finalize-only",
    )
    finalize = "".join(line for line in finalize.splitlines(True) if line.strip() != "#SBATCH --array")
    _write_atomic(logs / "finalize.slurm", finalize.encode())

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
        return _finish(cfg, p.out, p.sha, p.encoder, log)
    if not sc.submit:
        log(
            f"dry run: wrote {script} and {logs / 'finalize.slurm'} (nothing submitted). Submit with:\n"
            f"  JOB=$(sbatch --parsable --export=ALL,RUN_OFFSET=0 {script})\n"
            f"  sbatch --dependency=afterok:$JOB {logs / 'finalize.slurm'}"
        )
        return BuildResult(p.out, "written")
    job = dt_slurm.launch_slurm_job(
        finalize, executor.job_id_retriever, f"--dependency=afterok:{executor.job_id}"
    )
    log(f"submitted Slurm array job {executor.job_id} ({cfg.build.tasks} tasks) and finalize job {job}")
    return BuildResult(p.out, "submitted")


# --------------------------------------------------------------------------------------------
# finishing: dataset.json and validation


def finalize_only(cfg: DataConfig, log=print) -> BuildResult:
    """Used by the Slurm finalize job: no source listing (compute nodes may have no network)."""
    out = Path(cfg.output).expanduser().resolve()
    bj = out / BUILD_JSON
    if not bj.is_file():
        raise BuildError(f"{bj} not found: {out} was never started by `gristmill data build`")
    sha = _read_json(bj, f"cannot tell which config built {out}; delete {out} to rebuild from scratch").get(
        "config_sha256"
    )
    # dataset.json describes what the tasks wrote: the saved config's policy, not this command line's.
    saved = load_config(DataConfig, out / CONFIG_TOML)
    tok = load_tokenizer(out / TOKENIZER_JSON)
    encoder = DocumentEncoder(tok, SeparatorPolicy(saved.tokenizer.separator, saved.tokenizer.position))
    with _locked(out):
        return _finish(saved, out, sha, encoder, log)


def _finish(cfg: DataConfig, out: Path, sha: str, encoder: DocumentEncoder, log) -> BuildResult:
    from pipelines.shard_writer import ShardChangedError, finalize_dataset

    tasks = cfg.build.tasks
    if set(range(tasks)) - _finished_tasks(out):
        raise BuildError(_failed_message(out, tasks))
    for tmp in sorted(out.rglob("*.tmp")):  # leftovers of killed tasks, all redone since
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()  # index.tmp/: a killed finalize
    excluded = _excluded_counts(out)
    kept = sum(pq.ParquetFile(m).metadata.num_rows for m in sorted((out / MANIFEST_DIR).glob("*.parquet")))
    if kept == 0:
        # An empty dataset would validate (nothing to violate) and fail only at training time.
        by_filter = ", ".join(f"{k} {v:,}" for k, v in sorted(excluded.items())) or "none recorded"
        raise BuildError(
            f"{out}: no document survived ({sum(excluded.values()):,} read, excluded by: {by_filter}); "
            f"loosen [filters] or check source.text_key, see `gristmill data audit {out} --report drops`"
        )
    try:
        info = finalize_dataset(
            out,
            vocab_size=encoder.vocab_size,
            separator=encoder.separator_info(),
            config_sha256=sha,
            tokenizer_path=None,
            extra={
                "source": {"kind": cfg.source.kind, "path": cfg.source.path, "subset": cfg.source.subset},
                "tasks": tasks,
                "excluded": sum(excluded.values()),
                "documents_read": kept + sum(excluded.values()),
                "excluded_by_filter": excluded,
            },
            recorded=_recorded_shards(out),
        )
    except ShardChangedError as e:
        raise BuildError(_changed_shards_message(out, e.changed)) from None
    log(f"built {out}:")
    return _validate(cfg, out, info, log)


def _recorded_shards(out: Path) -> dict[str, dict[str, Any]]:
    """shard -> {bytes, sha256, task} as each task recorded when it finished (tokenize_shard)."""
    from pipelines.tokenize_shard import SHARD_RECORDS

    shards: dict[str, dict[str, Any]] = {}
    for path in sorted((out / SHARD_RECORDS).glob("*.json")):
        task = int(path.stem)
        for name, rec in _read_json(
            path, f"delete {out / LOGS_DIR / 'completions' / path.stem} and rerun"
        ).items():
            shards[name] = {**rec, "task": task}
    return shards


def _changed_shards_message(out: Path, changed: list[tuple[str, dict, dict | None]]) -> str:
    what = []
    for name, want, now in changed:
        state = "is gone" if now is None else f"is {now['bytes']:,} bytes, sha256 {now['sha256'][:12]}…"
        what.append(
            f"{SHARDS_DIR}/{name} {state}; task {want['task']} wrote {want['bytes']:,} bytes, "
            f"sha256 {want['sha256'][:12]}…"
        )
    tasks = sorted({want["task"] for _, want, _ in changed})
    markers = " ".join(str(out / LOGS_DIR / "completions" / f"{t:05d}") for t in tasks)
    return (
        f"shards changed after their task finished, refusing to describe them in {DATASET_JSON}: "
        f"{'; '.join(what)}. Redo those tasks (their shards are rewritten byte-identical): "
        f"`rm {markers}` and rerun the same command"
    )


def _excluded_counts(out: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted((out / EXCLUDED_DIR).glob("*.parquet")):
        col = pq.read_table(path, columns=["filter"]).column("filter").to_pylist()
        for f in col:
            counts[f] = counts.get(f, 0) + 1
    return counts


def _validate(cfg: DataConfig, out: Path, info: dict[str, Any], log) -> BuildResult:
    """Validate (unless build.validate = false) and print the end table; problems below it."""
    from pipelines.filters import make_filters
    from pipelines.progress import build_table

    order = [f.name for f in make_filters(cfg.filters, None)]
    if not cfg.build.validate:
        log(build_table(info, ("skipped", "(build.validate = false)"), order))
        return BuildResult(out, "complete", info)
    from validation.validate import format_report, validate_dataset

    report = validate_dataset(out, progress=False)
    if report.ok:
        row = (
            "OK",
            f"{report.separators:,} separators in {report.documents:,} documents, all shards checked",
        )
    else:
        row = ("FAILED", f"{report.n_problems:,} problems:")
    log(build_table(info, row, order))
    if not report.ok:
        log(format_report(report))
    return BuildResult(out, "complete", info, report)


DATASET_JSON_FIX = (
    "it is written last from the shards, so delete it and rerun the same command to rewrite it "
    "(validation runs again), or rebuild into a new `output`"
)


def _read_json(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object the build wrote earlier; damage is a BuildError naming the file and `fix`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"{path} is unreadable ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path} is not a JSON object; {fix}")
    return data


def _write_build_json(p) -> dict:
    """build.json: the config hash and identity this output directory is built with."""
    record = {"config_sha256": p.sha, "identity": p.identity}
    _write_atomic(p.out / BUILD_JSON, json.dumps(record, indent=2, sort_keys=True).encode())
    return record


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    from pipelines.cli import main as cli_main

    return cli_main(["data", "build", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # LocalPipelineExecutor spawns processes: keep the guard
    sys.exit(main())
