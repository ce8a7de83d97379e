"""`gristmill demo`: the whole system, offline, on the embedded demo corpus.

Each stage is the same code path a user runs by hand (the commands are printed before each stage),
so the demo is an end-to-end check as well as a tour: build two datasets, prose and code (each
validated) → audit → train on their mixture in three phases, the first at half the batch (the plan
printed first; stopped inside phase "main" as if preempted, then resumed across the phase boundary;
lm-eval scores the weights at steps 60, 100 and 150 as it trains; `[merge]` keeps a window's mean of
the weights, validated and evaluated beside the raw ones) → export to HF format (the raw and the
merged weights of step 100) and verify every checkpoint and export against its checksums and every
trained step's recorded batch against the plan (and a tampered copy of the record caught) → the
offline eval of the last export → continued pretraining from that export as a Hugging Face base
(`[model] init_from`) for a few steps → a loss spike (injected) rewound past, its skipped data shown
by inspect and the audit → the prose dataset uploaded to an S3 bucket (a local moto server), 10
steps trained from the bucket by range reads into the hash-checked block cache, and its per-step
hashes equal to the local copy's → a mixture search's quick version. It closes with each stage's
seconds (`Stages.summary`), the one place it states them.
Everything lands under runs/; rerunning resumes or reuses what is already complete.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from pipelines.cli import DEMO_STAGES
from training.contract.batch_record import BatchEntry, batch_file, read_batches
from training.contract.config_loader import PathArgument
from training.contract.errors import GristmillError
from training.contract.run_layout import (
    BATCHES_BIN,
    CONFIG_TOML,
    DATA_PLAN_JSON,
    DISCARDED_BATCHES_BIN,
    METRICS_JSONL,
    complete_steps,
)

# The demo's recipes: (stage, default, what it is), each a --STAGE-config option
RECIPES = (
    ("data", "configs/data/demo.toml", "data recipe to build"),
    ("code", "configs/data/demo-code.toml", "second data recipe (the code source)"),
    ("train", "configs/train/demo.toml", "training recipe"),
    ("eval", "configs/eval/demo.toml", "eval recipe (local tasks)"),
    (
        "continue",
        "configs/train/demo-continued.toml",
        "continued-pretraining recipe (model.init_from = the step-150 export)",
    ),
    ("rewind", "configs/train/demo-rewind.toml", "the rewind stage's training recipe"),
    (
        "bucket",
        "configs/train/demo-bucket.toml",
        "the bucket stage's training recipe (data.dataset = s3://gristmill-demo/demo)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for stage, default, what in RECIPES:
        parser.add_argument(f"--{stage}-config", action=PathArgument, default=default, help=what)
    parser.add_argument("--skip-train", action="store_true", help="stop after the audit")


EVAL_SQL = "SELECT step, merged, task, metric, value, stderr FROM eval ORDER BY step, merged, task, metric"
CONSUMPTION_SQL = "SELECT phase, source, seq_len, tokens, round(100 * fraction, 1) AS pct FROM consumption"
STOP_STEP = 60  # inside phase "main" (steps 51-100): the resume crosses into "decay"
TAMPERED_STEP = 77  # the export stage's tampered copy: this step's record given the next step's batch
# The rewind stage: a loss spike injected into one data window of step 27 (training/run/faults.py, a
# test fault: never set in real runs); the recipe rewinds to step 25 and skips steps 26-33.
SPIKE = ("GRISTMILL_FAULT_SPIKE_WINDOW", "step:27*20")
SKIPPED_STEP = 30
REWIND_SQL = "SELECT phase, source, tokens, skipped_tokens, rewinds FROM consumption"
# The bucket stage: a local S3 server (moto, pipelines/local_s3.py) holding the prose dataset.
BUCKET, BUCKET_URL = "gristmill-demo", "s3://gristmill-demo/demo"
HASH_ARGS = [
    "--seq-len",
    "64",
    "--global-batch",
    "16",
    "--seed",
    "1234",
    "--hash",
    "--step",
    "1",
    "--end",
    "6",
]


def train_output_dir(config: str) -> Path:
    """run.output_dir of a training recipe, read from its TOML (the demo recipes all set it)."""
    with open(config, "rb") as f:
        out = tomllib.load(f).get("run", {}).get("output_dir")
    if not out:
        raise GristmillError(f"{config} sets no run.output_dir; the demo needs to know where the run goes")
    return Path(out)


class Stages:
    """The demo's stages as they run: each announced with its commands, and timed until the next
    one starts. `summary` is the closing table, the one place the demo says how long a stage took
    (the README's demo table quotes it)."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self._running: tuple[str, float] | None = None

    def start(self, name: str, title: str, command: str) -> None:
        """Announce stage `name` (one of DEMO_STAGES, the order `gristmill --help` lists) and its command."""
        self._stop()
        print(f"\n=== [{DEMO_STAGES.index(name) + 1}/{self.total}] {title}\n    $ {command}", flush=True)
        self._running = (name, self.clock())

    def _stop(self) -> None:
        if self._running is not None:
            name, t0 = self._running
            self.seconds[name] = self.clock() - t0
            self._running = None

    def summary(self) -> list[str]:
        """The closing table: each stage's seconds and their sum."""
        self._stop()
        lines = [f"\n=== the demo's stages took {sum(self.seconds.values()):.0f} s:"]
        lines += [f"    {name:<9} {seconds:6.0f} s" for name, seconds in self.seconds.items()]
        return lines


def train_commands(train_config: str, run_dir: Path, stop_step: int) -> list[list[str]]:
    """The demo's training stage: the plan, a run stopped at `stop_step` (left out when the run has a
    checkpoint there or later already: a rerun would flip run.max_steps back and forth and train
    nothing), the resume to the end, the consumption audit and an inspected step."""
    train = ["train", "--config", train_config, "--resume", "auto"]
    stop = [[*train, "--set", f"run.max_steps={stop_step}"]]
    if max(complete_steps(run_dir), default=0) >= stop_step:
        stop = []
    return [
        ["train", "--config", train_config, "--resume", "auto", "--plan"],  # a rerun's: the run's plan
        *stop,
        train,
        ["data", "audit", str(run_dir), "--sql", CONSUMPTION_SQL],
        ["data", "inspect", str(run_dir), "--step", "101", "--max-rows", "2"],
    ]


def run(args: argparse.Namespace) -> int:
    stages = Stages(DEMO_STAGES.index("audit") + 1 if args.skip_train else len(DEMO_STAGES))
    if rc := _run(args, stages):
        return rc
    print("\n".join(stages.summary()))
    return 0


def _run(args: argparse.Namespace, stages: Stages) -> int:
    # Each stage's imports sit where the stage starts: `gristmill demo --help` imports none of
    # datatrove, duckdb, torch or lm-eval, and --skip-train never imports torch or lm-eval.
    from pipelines.build import build
    from pipelines.config import DataConfig
    from training.contract.config_loader import load_config
    from validation.audit import print_summary, write_plots
    from validation.audit_views import connect

    configs = (args.data_config, args.code_config)
    later = (
        args.train_config,
        args.eval_config,
        args.continue_config,
        args.rewind_config,
        args.bucket_config,
    )
    for path in (*configs, *(() if args.skip_train else later)):
        if not Path(path).is_file():
            print(f"error: {path} not found; run `gristmill demo` from the repository root (or `make demo`)")
            return 2

    stages.start("build", "build the two datasets: prose (writes the demo corpus and trains the "
                 "tokenizer on first use), then code with the same tokenizer",
                 "\n    $ ".join(f"gristmill data build --config {c}" for c in configs))  # fmt: skip
    results = []
    for config in configs:
        result = build(load_config(DataConfig, config))
        if not result.ok:
            print(f"error: validation of {result.output} failed; see the problems above")
            return 1
        results.append(result)
    data_dirs = [r.output for r in results]
    data_dir = data_dirs[0]

    stages.start("validate", "validate (already run by the build; rerun any time)",
                 "\n    $ ".join(f"gristmill data validate {d}" for d in data_dirs))  # fmt: skip
    for d, result in zip(data_dirs, results):
        print(f"    {d}: {'ok' if result.report is None or result.report.ok else 'FAILED'}")

    stages.start("audit", "audit the datasets", f"gristmill data audit {' '.join(map(str, data_dirs))} "
                 f"--plots {data_dir}/audit")  # fmt: skip
    print_summary(data_dirs)
    con, _ = connect([data_dir])
    try:
        plots = write_plots(con, data_dir / "audit")
    finally:
        con.close()
    print(f"    plots in {data_dir / 'audit'}/: {', '.join(p.name for p in plots)}")
    if args.skip_train:
        return 0

    # The trainer, export, verify and eval run as the user runs them: through the CLI's command
    # table (pipelines/ imports nothing of training/ beyond its contract).
    from pipelines.cli import main as gristmill

    # The plan first (from the config and the datasets alone), then two runs of the same recipe: the
    # first stops inside phase "main" as a preempted job would, the second picks its checkpoint up
    # and crosses into phase "decay" (`--resume auto` also makes a rerun of the demo continue).
    run_dir = train_output_dir(args.train_config)
    stop = f"--resume auto --set run.max_steps={STOP_STEP}"
    stages.start("train", f"train a small Llama on the mixture (CPU) in three phases, stop at step "
                 f"{STOP_STEP}, resume from the checkpoint",
                 f"gristmill train --config {args.train_config} --resume auto --plan\n"
                 f"    $ gristmill train --config {args.train_config} {stop}\n"
                 f"    $ gristmill train --config {args.train_config} --resume auto\n"
                 f"    $ gristmill data audit {run_dir} --sql \"{CONSUMPTION_SQL}\"\n"
                 f"    $ gristmill data inspect {run_dir} --step 101 --max-rows 2")  # fmt: skip
    commands = train_commands(args.train_config, run_dir, STOP_STEP)
    if len(commands) == 4:
        print(f"    (the run is past step {STOP_STEP} already: no stop there this time)")
    for command in commands:
        if rc := gristmill(command):
            return rc
    for step in (100, 150):  # [merge] in the recipe: the window's mean, validated beside the raw weights
        raw, merged = _logged(run_dir, step, "val_loss"), _logged(run_dir, step, "merged/val_loss")
        if None not in (raw, merged):
            print(f"    step {step}: held-out loss {raw:.4f}, merged weights (mean of the last 25 steps) "
                  f"{merged:.4f}")  # fmt: skip

    tampered = run_dir.with_name(f"{run_dir.name}-tampered")
    stages.start("export", "export the step-100 checkpoint (HF format) and its merged weights ([merge]), "
                 "then check every file against its checksum and every step's recorded batch against the "
                 f"plan; then a copy of the record with step {TAMPERED_STEP}'s batch swapped, which verify "
                 "must catch",
                 f"gristmill export {run_dir} --step 100\n"
                 f"    $ gristmill export {run_dir} --step 100 --merged\n"
                 f"    $ gristmill verify {run_dir}\n    $ gristmill verify {tampered}")  # fmt: skip
    print("    (step 150 was exported during training: checkpoint.export_interval)")
    for command in (
        ["export", str(run_dir), "--step", "100"],
        ["export", str(run_dir), "--step", "100", "--merged"],
        ["verify", str(run_dir)],
    ):
        if rc := gristmill(command):
            return rc
    if rc := batch_check_shown(run_dir, tampered, gristmill):
        return rc

    # Training evaluated steps 60, 100 and 150 as it went ([eval] interval); the offline eval of
    # the step-150 export gives the same scores from the HF model (and replaces that step's row).
    stages.start("eval", "evaluate the step-150 export with lm-eval on held-out documents (offline); "
                 "training evaluated steps 60, 100 and 150 as it went",
                 f"gristmill eval {run_dir} --config {args.eval_config} --step 150\n"
                 f"    $ gristmill data audit {run_dir} --sql \"{EVAL_SQL}\"")  # fmt: skip
    if rc := gristmill(["eval", str(run_dir), "--config", args.eval_config, "--step", "150"]):
        return rc
    if rc := gristmill(["data", "audit", str(run_dir), "--sql", EVAL_SQL]):
        return rc
    print(f"    plot: {run_dir / 'eval.png'}")

    # The step-150 export is a Hugging Face Llama directory like any published base: a run that
    # starts from it (docs/continued-pretraining.md) takes its shape from its config.json, checks the
    # data's tokenizer against its tokenizer.json, and trains on from its weights.
    cont_dir = train_output_dir(args.continue_config)
    stages.start("continue", "continue pretraining from the step-150 export as a Hugging Face base "
                 "(model.init_from), 10 steps on the prose source",
                 f"gristmill train --config {args.continue_config} --resume auto")  # fmt: skip
    if rc := gristmill(["train", "--config", args.continue_config, "--resume", "auto"]):
        return rc
    first, val = _logged(cont_dir, 1, "loss"), _logged(cont_dir, 10, "val_loss")
    base = _logged(run_dir, 150, "val/prose")
    if None not in (first, val, base):  # a random init would start near ln(8192) = 9.0
        print(f"    step 1 loss {first:.4f}, where the base left off; held-out prose loss {val:.4f} at "
              f"step 10 (the base's, at the demo's step 150: {base:.4f})")  # fmt: skip
    if rc := rewind_stage(args.rewind_config, stages, gristmill):
        return rc
    if rc := bucket_stage(data_dir, args.bucket_config, stages, gristmill):
        return rc
    return mix_stage(stages, gristmill)


def rewind_stage(config: str, stages: Stages, gristmill) -> int:
    """A loss spike, rewound past: the run goes back to a checkpoint before it, skips the data after
    that checkpoint and finishes; then the ledger: what a skipped step did not train on, and the
    skipped tokens in the consumption audit (docs/divergence.md)."""
    run_dir = train_output_dir(config)
    key, value = SPIKE
    stages.start("rewind", "a loss spike (injected into one data window of step 27), rewound past: "
                 "back to a checkpoint before it, its data skipped, every token accounted for",
                 f"{key}={value} gristmill train --config {config} --resume auto\n"
                 f"    $ gristmill data inspect {run_dir} --step {SKIPPED_STEP} --max-rows 1\n"
                 f"    $ gristmill data audit {run_dir} --sql \"{REWIND_SQL}\"\n"
                 f"    $ gristmill verify {run_dir}")  # fmt: skip
    os.environ[key] = value  # the trainer's processes inherit it
    try:
        if rc := gristmill(["train", "--config", config, "--resume", "auto"]):
            return rc
    finally:
        del os.environ[key]
    for command in (
        ["data", "inspect", str(run_dir), "--step", str(SKIPPED_STEP), "--max-rows", "1"],
        ["data", "audit", str(run_dir), "--sql", REWIND_SQL],
        ["verify", str(run_dir)],
    ):
        if rc := gristmill(command):
            return rc
    kept, _ = read_batches(run_dir / BATCHES_BIN)
    discarded, _ = read_batches(run_dir / DISCARDED_BATCHES_BIN)
    trained, apart = _spans([e.step for e in kept]), _spans([e.step for e in discarded])
    print(f"    {BATCHES_BIN}: the {len(kept)} trained steps ({trained}), each the plan's batch (verify said "
          f"nothing of them); {DISCARDED_BATCHES_BIN}: step(s) {apart} of the attempt rewind 1 discarded, "
          "kept apart, not the run's")  # fmt: skip
    print(f"    curve: {run_dir / 'loss.png'}")
    return 0


def batch_check_shown(run_dir: Path, tampered: Path, gristmill, step: int = TAMPERED_STEP) -> int:
    """What `gristmill verify RUN` checked of the batches (it says nothing when all agree), then the
    same check on a copy of the run's record files with `step`'s record given the next step's batch
    (a real batch at the wrong step): verify must name that step first and exit 1. 1 if it did not."""
    entries, _ = read_batches(run_dir / BATCHES_BIN)
    sha = {e.step: e.sha256 for e in entries}
    if step not in sha or step + 1 not in sha:
        print(f"error: {run_dir / BATCHES_BIN} does not record steps {step} and {step + 1}")
        return 1
    print(f"    verify compared the {len(entries)} steps recorded in {run_dir / BATCHES_BIN} (steps "
          f"{_spans(list(sha))}) with the batches the plan gives them: all agree, so it said nothing of "
          "them; no reference run needed")  # fmt: skip
    shutil.rmtree(tampered, ignore_errors=True)
    tampered.mkdir(parents=True)
    for name in (CONFIG_TOML, DATA_PLAN_JSON, METRICS_JSONL):
        shutil.copy(run_dir / name, tampered / name)
    swapped = [BatchEntry(e.step, e.attempt, sha[step + 1]) if e.step == step else e for e in entries]
    (tampered / BATCHES_BIN).write_bytes(batch_file(swapped))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = gristmill(["verify", str(tampered)])
    print("\n".join(f"    {line}" for line in out.getvalue().splitlines()))
    named = any(line.startswith(f"batches: step {step} ") for line in out.getvalue().splitlines())
    if rc != 1 or not named:
        print(f"error: verify of the tampered copy exited {rc} and {'named' if named else 'did not name'} "
              f"step {step}: it must name it and exit 1")  # fmt: skip
        return 1
    print(f"    exit 1, step {step} named: the copy's record is not what the plan fed (the copy, four small "
          f"files, stays for `gristmill verify {tampered}`)")  # fmt: skip
    return 0


def _spans(steps: list[int]) -> str:
    """`1–25, 34–40`: sorted steps as runs."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs) or "none"


def bucket_stage(data_dir: Path, config: str, stages: Stages, gristmill) -> int:
    """The prose dataset in an S3 bucket: a local moto server (the endpoint and credentials reach the
    commands as the standard AWS variables), the upload (every file checked by sha256, dataset.json
    last), a few steps trained from the bucket through the block cache (each loader block read by
    range, its ids checked against the documents' sha256), and inspect --hash of the bucket equal to
    the local copy's (docs/object-storage.md)."""
    from pipelines.local_s3 import LocalS3

    run_dir = train_output_dir(config)
    hashes = " ".join(HASH_ARGS)
    stages.start("bucket", "datasets on object storage: the prose dataset uploaded to an S3 bucket "
                 "(a moto server on loopback), 10 steps trained from it by range reads into the hash-checked "
                 "block cache, the batches' hashes equal to the local copy's",
                 f"gristmill data upload {data_dir} {BUCKET_URL}    # AWS_ENDPOINT_URL: the demo's "
                 "own server, gone after it (yours: docs/object-storage.md)\n"
                 f"    $ gristmill train --config {config} --resume auto\n"
                 f"    $ gristmill data inspect {BUCKET_URL} {hashes}\n"
                 f"    $ gristmill data inspect {data_dir} {hashes}")  # fmt: skip
    s3 = LocalS3(BUCKET)
    saved = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())  # the trainer and the commands read the standard AWS variables
    try:
        for command in (
            ["data", "upload", str(data_dir), BUCKET_URL],
            ["train", "--config", config, "--resume", "auto"],
        ):
            if rc := gristmill(command):
                return rc
        outputs = []
        for where in (BUCKET_URL, str(data_dir)):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = gristmill(["data", "inspect", where, *HASH_ARGS, "--cache-dir", "runs/cache/datasets"])
            if rc:
                return rc
            outputs.append(out.getvalue().splitlines()[1:])  # the header names the location
        print("\n".join(f"    {line}" for line in outputs[0]))
        same = "equal" if outputs[0] == outputs[1] else "DIFFERENT"
        print(f"    the {len(outputs[0])} hashes of {BUCKET_URL} and of {data_dir} are {same}")
        fetched = {k: _logged(run_dir, 10, k) for k in ("fetch/requests", "fetch/retries", "fetch/bytes")}
        if None not in fetched.values():
            print(
                f"    training fetched {fetched['fetch/bytes']:,} bytes in {fetched['fetch/requests']} "
                f"requests ({fetched['fetch/retries']} retried): metrics.jsonl's fetch/* columns"
            )
        if outputs[0] != outputs[1]:
            return 1
    finally:
        s3.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return 0


# The mix stage: the demo's mixture search at a quick scale (configs/mix/quick.toml: its proxies too
# short to rank mixtures well, one validation seed; the search's warnings say so); the full search
# is configs/mix/demo.toml.
MIX_CONFIG, MIX_OUT = "configs/mix/quick.toml", "runs/mix/demo-quick"


def mix_stage(stages: Stages, gristmill) -> int:
    """`gristmill mix propose` on the two sources: proxies trained, a fit, a proposal, the gate, and
    the warnings of settings this small."""
    command = ["mix", "propose", "--config", MIX_CONFIG, "--out", MIX_OUT]
    title = (
        "choose a mixture of the two sources from small proxy runs, gated against uniform and token-"
        "proportional (quick: 4 proxies of 28,672 tokens, 1 seed, so it warns; configs/mix/demo.toml: the "
        "full search, ~15 min)"
    )
    stages.start("mix", title, f"gristmill {' '.join(command)}")
    if rc := gristmill(command):
        return rc
    warnings = json.loads(Path(MIX_OUT, "report.json").read_text(encoding="utf-8"))["warnings"]
    print(
        f"    plot: {MIX_OUT}/mix.png, mix: {MIX_OUT}/proposal.toml"
        f"; {len(warnings)} warning{'s' * (len(warnings) != 1)} in {MIX_OUT}/report.json (above)"
    )
    return 0


def _logged(run_dir: Path, step: int, key: str) -> float | None:
    """The value of `key` in a run's metrics row of `step` (metrics.jsonl), or None."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith("}") and (row := json.loads(line)).get("step") == step:
            return row.get(key)
    return None
