"""Eval stage: real lm-eval runs on the local demo tasks against a tiny exported gristmill model.

The run directory is made here (config.toml + exports/step-N of a tiny random model), because
training one costs more than it proves: the tasks are built from the built dataset's held-out
documents exactly as for a trained run.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import forked
from tests.helpers.mounts import python_in_namespace, sh_quote, unshare_works
from tests.helpers.parquet_damage import flip_a_value_bit
from tests.helpers.train_runs import eval_data, fake_checkpoint, one_error_line, without_accelerate

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from training.checkpoint.hf_export import export_hf, export_separator_id  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.contract.config_loader import load_config, save_config  # noqa: E402
from training.contract.dataset_format import read_dataset_info  # noqa: E402
from training.contract.run_layout import eval_dir, export_dir  # noqa: E402
from training.data.reader import DocumentTable  # noqa: E402
from training.model import PRESETS, Transformer  # noqa: E402
from validation.eval import EvalConfig, TaskPlan, evaluate_lm, task_lines  # noqa: E402
from validation.eval_model import GristmillHFLM, in_process_lm  # noqa: E402

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.xdist_group("eval"),  # one run of exports: every test on one worker
]

SEQ_LEN = 256  # the tiny preset's max_seq_len; the fixture's cloze requests fit in it
CFG = EvalConfig(docs=5, batch_size=4, bootstrap_iters=0)
ROOT = Path(__file__).resolve().parents[2]
# plot=false: eval.png (~0.3 CPU s a scored step) is drawn only where a test looks at it (CI time)
QUICK = ["--tasks", "heldout_ppl", "--set", "docs=5", "bootstrap_iters=0", "device=cpu", "limit=3",
         "plot=false"]  # fmt: skip


def _tiny_model(dataset: Path, seed: int) -> Transformer:
    torch.manual_seed(seed)
    vocab = read_dataset_info(dataset)["vocab_size"]
    model = Transformer(PRESETS["tiny"].replace(vocab_size=vocab, tie_embeddings=True))
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.eval()


def _make_run(run: Path, dataset: Path, steps: list[int]) -> dict[int, Transformer]:
    cfg = load_config(
        TrainConfig,
        None,
        [
            f"data.dataset={dataset}",
            f"run.output_dir={run}",
            "data.val_fraction=0.1",
            f"data.seq_len={SEQ_LEN}",
        ],
    )
    run.mkdir(parents=True)
    save_config(cfg, run / "config.toml")
    models = {}
    for step in steps:
        models[step] = _tiny_model(dataset, seed=step)
        export_hf(
            models[step].state_dict(), models[step].cfg, dataset, export_dir(run, step), meta={"step": step}
        )
    return models


@pytest.fixture(scope="module")
def eval_run(built_dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("eval") / "run"
    return run, _make_run(run, built_dataset, [5])


def _sample_lls(results: dict, task: str) -> dict[tuple[int, int], float]:
    """{(doc_id, request index): loglikelihood} of one task's logged samples."""
    out = {}
    for s in results["samples"][task]:
        for i, resp in enumerate(s["filtered_resps"]):
            out[(s["doc_id"], i)] = float(resp[0] if isinstance(resp, list | tuple) else resp)
    return out


def test_export_via_hf_and_in_process_model_give_the_same_loglikelihoods(eval_run):
    run, models = eval_run
    export = export_dir(run, 5)
    plan = TaskPlan(run, CFG)
    via_export = evaluate_lm(
        GristmillHFLM(
            pretrained=str(export), device="cpu", dtype="float32", batch_size=4, max_length=SEQ_LEN
        ),
        plan,
        CFG,
        log_samples=True,
    )
    in_process = evaluate_lm(
        in_process_lm(models[5], export, 3, SEQ_LEN, separator_id=export_separator_id(export)),
        plan,
        CFG,
        True,
    )
    for task in ("heldout_ppl", "heldout_cloze"):
        a, b = _sample_lls(via_export, task), _sample_lls(in_process, task)
        assert a.keys() == b.keys() and len(a) >= 5
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-4), (task, k)
    ppl = via_export["results"]["heldout_ppl"]["word_perplexity,none"]
    assert ppl == pytest.approx(in_process["results"]["heldout_ppl"]["word_perplexity,none"], rel=1e-5)

    # Stock `--model hf` frames rolling requests with one separator too (the exported tokenizer adds
    # none, lm-eval prepends its prefix token), but its tokenizer call turns a literal
    # "<|endoftext|>" in a document into a second separator: that document's score differs.
    ppl_plan = TaskPlan(run, EvalConfig(tasks=["heldout_ppl"], docs=CFG.docs))
    stock = evaluate_lm_by_name(
        ppl_plan, f"pretrained={export},dtype=float32,device=cpu,max_length={SEQ_LEN}"
    )
    texts = [json.loads(line)["text"] for line in (eval_data(run) / "heldout_ppl.jsonl").open()]
    a, b = _sample_lls(via_export, "heldout_ppl"), _sample_lls(stock, "heldout_ppl")
    literal = {k for k in a if "<|endoftext|>" in texts[k[0]]}
    assert literal, "the held-out documents should include the fixture's literal-separator page"
    for k in a:
        assert (
            (a[k] != pytest.approx(b[k], rel=1e-3))
            if k in literal
            else (a[k] == pytest.approx(b[k], rel=1e-5))
        )


def evaluate_lm_by_name(plan: TaskPlan, model_args: str) -> dict:
    """lm-eval's own simple_evaluate of `--model hf`; its environment record (torch's collect_env: ~1
    CPU s of subprocesses, nothing compared here) taken once per process, as evaluate_lm takes it."""
    from lm_eval import simple_evaluate

    from validation.eval import _env_info_once

    with _env_info_once():
        return simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=plan.specs,
            task_manager=plan.task_manager,
            bootstrap_iters=0,
        )


class RecordingLM(GristmillHFLM):
    """GristmillHFLM that records every input_ids row its model receives, by request type."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: dict[str, list[list[int]]] = {}
        self.kind = ""
        self.model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, _mod, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        self.seen.setdefault(self.kind, []).extend(ids.tolist())

    def loglikelihood(self, requests, disable_tqdm=False):
        self.kind = "loglikelihood"
        return super().loglikelihood(requests, disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        self.kind = "loglikelihood_rolling"
        return super().loglikelihood_rolling(requests, disable_tqdm)

    def generate_until(self, requests, disable_tqdm=False):
        self.kind = "generate_until"
        return super().generate_until(requests, disable_tqdm)


def _gen_task(data_dir: Path) -> dict:
    """A generate_until task over the cloze data (continue the context for a few tokens)."""
    return {
        "task": "demo_gen",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_dir / "heldout_cloze.jsonl")}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{choices[label]}}",
        "generation_kwargs": {"until": ["\n\n"], "max_gen_toks": 3, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    }


def test_every_task_type_feeds_exactly_one_separator(eval_run):
    """The ids the model actually receives (batch size 1: no padding) are [SEP] + the text's own
    tokens, never two separators, in every request type: rolling perplexity, multiple choice and
    generation."""
    run, _ = eval_run
    dataset = read_dataset_info_path(run)
    sep = read_dataset_info(dataset)["separator"]["id"]
    cfg = EvalConfig(docs=CFG.docs, bootstrap_iters=0)
    plan = TaskPlan(run, cfg)
    data_dir = plan.data_dir
    plan.specs.append(_gen_task(data_dir))
    lm = RecordingLM(
        pretrained=str(export_dir(run, 5)), device="cpu", dtype="float32", batch_size=1, max_length=SEQ_LEN
    )
    evaluate_lm(lm, plan, cfg)

    def enc(text: str) -> list[int]:  # as the build encodes: a literal "<|endoftext|>" stays text
        return lm.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    def rows(name: str) -> list[dict]:
        return [json.loads(line) for line in (data_dir / f"{name}.jsonl").open()]

    # Rolling: each document's first window is [SEP] + the document's tokens as stored in the
    # shards (what training read), the last one only predicted; later windows hold no separator.
    seen = lm.seen["loglikelihood_rolling"]
    table = DocumentTable(dataset, split="val", val_fraction=0.1)
    expected = []
    for d in table.split_rows(np.arange(len(rows("heldout_ppl")))).tolist():
        ids = table.read(np.array([d]), np.array([0]), table.lengths[d : d + 1].astype(np.int64)).tolist()
        assert ids.count(sep) == 1
        ids.remove(sep)
        expected.append([sep, *ids[: min(SEQ_LEN, len(ids)) - 1]])
    assert sorted(ids for ids in seen if ids[0] == sep) == sorted(expected)
    assert all(sep not in ids[1:] for ids in seen)

    # Multiple choice: [SEP] + context + choice, minus the last token (predicted); a request longer
    # than the window is cut from the left by lm-eval.
    full = [[sep, *enc(d["context"] + " " + c)] for d in rows("heldout_cloze") for c in d["choices"]]
    seen = lm.seen["loglikelihood"]
    assert sorted(seen) == sorted(ids[-(SEQ_LEN + 1) :][:-1] for ids in full)
    assert sum(ids[0] == sep for ids in seen) > len(seen) // 2 and all(sep not in ids[1:] for ids in seen)

    # Generation: the prompt (each generate call's first forward) is [SEP] + context; later steps
    # feed one new token at a time through the KV cache.
    prompts = [ids for ids in lm.seen["generate_until"] if len(ids) > 1]
    assert sorted(prompts) == sorted([sep, *enc(d["context"])] for d in rows("heldout_cloze"))
    assert all(sep not in ids[1:] for ids in prompts)


def read_dataset_info_path(run: Path) -> Path:
    return Path(load_config(TrainConfig, run / "config.toml").data.dataset)


def test_eval_cli_watch_writes_results_and_the_audit_eval_view_matches_them(built_dataset, tmp_path, capsys):
    """Also: a run path with glob characters ("[1]": lm-eval's data_files are glob patterns to
    `datasets`, which once matched nothing and died with StopIteration), and an export written
    before checksums were recorded (evaluated, with a note)."""
    from pipelines.cli import main
    from training.checkpoint.hf_export import ExportError, verify_export

    run = tmp_path / "run[1]"
    _make_run(run, built_dataset, [5, 10])
    (export_dir(run, 10) / "gristmill_checksums.json").unlink()
    meta = export_dir(run, 10) / "gristmill_export.json"
    current = {**json.loads(meta.read_text()), "checkpoint_complete_sha256": "0" * 64}  # as exports now
    meta.write_text(json.dumps(current))
    # one of a current export deleted: its weights were scored unchecked, "exported before" (R17b M5)
    with pytest.raises(ExportError, match=r"has no gristmill_checksums\.json, which it was exported with"):
        verify_export(export_dir(run, 10))
    for kind in ({"copied_from": "/elsewhere"}, {"base": "/a/base"}):  # a copy, a step-0 export (R17h)
        meta.write_text(json.dumps({**current, "checkpoint_complete_sha256": None, **kind}))
        meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if v is not None}))
        with pytest.raises(ExportError, match=r"which it was exported with"):
            verify_export(export_dir(run, 10))
    # an export of before the record (no checkpoint identity recorded either: the separator was
    # recorded before checksums were, review R17g): evaluated, with a note
    meta.write_text(json.dumps({k: v for k, v in current.items() if k != "checkpoint_complete_sha256"}))
    args = ["--set", "docs=5", "bootstrap_iters=0", "device=cpu"]
    assert main(["eval", str(run), "--watch", "--poll", "0.1", "--idle-exit", "0.1", *args]) == 0
    out, err = capsys.readouterr()
    assert "heldout_cloze" in out and "word_perplexity" in out  # the table of each evaluated step
    assert f"note: {export_dir(run, 10)} has no gristmill_checksums.json" in err
    assert "note:" not in err.replace(f"note: {export_dir(run, 10)}", "")  # step 5's export verified
    assert (run / "eval.png").is_file()

    expected = set()
    for step in (5, 10):
        assert (eval_dir(run, step) / "config.toml").is_file()
        res = json.loads((eval_dir(run, step) / "results.json").read_text())
        assert res["gristmill"]["export"] == str(export_dir(run, step).resolve())
        for task, metrics in res["results"].items():
            for key, value in metrics.items():
                metric, _, filt = key.partition(",")
                if isinstance(value, float) and not metric.endswith("_stderr"):
                    expected.add((step, task, metric, filt, value))
    assert {t for _, t, *_ in expected} == {"heldout_ppl", "heldout_cloze"}

    sql = 'SELECT step, task, metric, "filter", value FROM eval ORDER BY step'
    assert main(["data", "audit", str(run), "--sql", sql, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["step"], r["task"], r["metric"], r["filter"], r["value"]) for r in rows} == expected
    assert len(rows) == len(expected)


def test_a_damaged_results_json_is_one_line_with_the_fix_that_works(eval_run, tmp_path, capsys):
    """A step's results.json with one score's digit changed was merged into the next eval of that
    step and reported in eval.parquet and the audit, exit 0; a truncated one ended `gristmill eval`
    in a traceback after lm-eval had run (review R14c F3). Each is now one line naming the file and
    the fix, and the fix works."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    results = eval_dir(run, 5) / "results.json"
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    clean = results.read_text()
    value = json.loads(clean)["results"]["heldout_ppl"]["bits_per_byte,none"]
    for damage in (clean.replace(json.dumps(value), json.dumps(value + 1.0), 1), clean[: len(clean) // 2]):
        results.write_text(damage)
        capsys.readouterr()
        other = ["--tasks", "heldout_cloze", *QUICK[2:]]  # merged with the file's heldout_ppl scores
        assert main(["eval", str(run), "--step", "5", *other]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "heldout_cloze: " not in err, err  # refused before scoring
        fix = f"evaluate it again (`gristmill eval {run} --step 5`)"
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: {results} is damaged (") and line.endswith(fix), err
        assert f"delete {results.parent} (its scores are lost) and, while the run keeps" in line
        shutil.rmtree(results.parent)
        assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
        assert json.loads(results.read_text())["results"]["heldout_ppl"]["bits_per_byte,none"] == value
    # eval.parquet truncated: the audit said "validate the dataset and rebuild it", of a run (R14c F8);
    # then "delete it and evaluate one step again", which replaced scores the run had recorded under
    # other settings (R18a F4): the table is written again from the results, scoring nothing.
    table = run / "eval.parquet"
    capsys.readouterr()
    assert main(["data", "audit", str(run), "--sql", "FROM eval", "--format", "json"]) == 0
    before = capsys.readouterr().out
    scores = {p: p.read_bytes() for p in (run / "eval").glob("*/results.json")}
    table.write_bytes(table.read_bytes()[:100])
    assert main(["data", "audit", str(run), "--sql", "FROM eval"]) == 2
    fix = f"write it again from them with `gristmill eval {run} --table` (it scores nothing)"
    assert capsys.readouterr().err.strip().endswith(fix)
    for ignored in (["--tasks", "heldout_cloze"], ["--set", "limit=-1"], ["--merged"]):  # refused (R18e 4)
        assert main(["eval", str(run), "--table", *ignored]) == 2
        assert capsys.readouterr().err.strip().endswith(f"drop {ignored[0]}")
    assert main(["eval", str(run), "--table"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {table} and {run / 'eval.png'} from ")
    # eval.png drawn under the eval files' lock: a draw that read the results before another writer's
    # and saved after it left the picture of fewer steps (trial RV66d F2)
    from training.contract.eval_table import eval_lock
    from validation.eval_results import write_plot

    (run / "eval.png").unlink()
    with eval_lock(run):
        drawing = threading.Thread(target=write_plot, args=(run,))
        drawing.start()
        drawing.join(3.0)
        assert drawing.is_alive() and not (run / "eval.png").exists()
    drawing.join(60)
    assert (run / "eval.png").is_file()
    assert main(["data", "audit", str(run), "--sql", "FROM eval", "--format", "json"]) == 0
    assert capsys.readouterr().out == before
    assert {p: p.read_bytes() for p in (run / "eval").glob("*/results.json")} == scores
    # a run never evaluated: an empty table and plot, "wrote", and the audit took it for evaluated
    for results in (run / "eval").glob("*/results.json"):
        results.unlink()
    assert main(["eval", str(run), "--table"]) == 2
    said = "has no eval/*/results.json to write a table from: evaluate a step first"
    assert said in capsys.readouterr().err


def test_scores_of_the_original_past_a_copy_s_resume_are_not_the_copy_s(tmp_path):
    """A copy of a run's directory resumed at step 100 keeps the original's id A beside its own B: the
    original's step-150 scores (id A, another timeline), put into the copy, were tabled as its own
    (review RV61e 1). Each id holds the steps of its timeline and what it inherited: A's scores up to
    100, B's at any step; a copy of the copy resumed at an older step, 80, owns every step past it."""
    from training.contract.eval_table import EvalResultsError, read_step_results, sealed_results
    from training.contract.integrity import record_began, record_copied

    run = tmp_path / "copy"
    run.mkdir()
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    record_began(run, 0, a)
    record_copied(run, 100, b)

    def scored(step: int, run_id: str) -> bool:
        path = eval_dir(run, step) / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tasks = {"gristmill_tasks": {"heldout_ppl": {"model": "in-training", "run_id": run_id}}}
        path.write_text(json.dumps(sealed_results({"results": {}, **tasks})))
        try:
            return read_step_results(run, step) != {}
        except EvalResultsError as e:
            assert f"holds another run's scores (heldout_ppl records run id {run_id}" in str(e)
            return False

    assert [scored(150, a), scored(150, b), scored(100, a), scored(100, b), scored(50, b)] == [
        False, True, True, True, True
    ]  # fmt: skip
    assert not scored(150, "d" * 32)  # never this record's
    record_copied(run, 80, c)  # a copy of the copy, resumed at an older step
    assert [scored(90, b), scored(90, c), scored(80, b), scored(50, a)] == [False, True, True, True]


def test_another_step_s_damaged_results_json_costs_this_step_s_eval_nothing(eval_run, tmp_path, capsys):
    """One step's results.json damaged failed every later eval of the run, before it scored, the
    in-training eval's as well (trial RV61b F1). The eval of another step scores and writes its
    results; the table and the plot, which read every step's, are warnings naming the file; `--table`
    refuses it in one line."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    damaged = eval_dir(run, 99) / "results.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"results": {')
    (run / "eval.png").write_bytes(b"an earlier picture")  # without this eval's scores: not kept
    capsys.readouterr()
    assert main(["eval", str(run), "--step", "5", *QUICK[:-1], "plot=true"]) == 0
    assert not (run / "eval.png").exists()
    err = "".join(capsys.readouterr())
    assert f"eval.parquet not rebuilt (EvalResultsError: {damaged} is damaged (" in err, err
    assert f"eval.png not drawn (nor kept: it lacked these scores): {damaged} is damaged (" in err, err
    closing = f"all steps: {run / 'eval.parquet'} not rebuilt (the warning above); step 5's stand"
    assert closing in err, err
    assert "heldout_ppl" in json.loads((eval_dir(run, 5) / "results.json").read_text())["results"]
    assert main(["eval", str(run), "--table"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"error: {damaged} is damaged (")


def test_scores_copied_in_from_another_run_are_refused_in_one_line(eval_run, tmp_path, capsys):
    """Each task's scores record the id of the run that scored them (RUN/checkpoints.jsonl's): a
    step's results.json copied in from another run was tabled, plotted and audited as this run's
    scores, exit 0 (trial RV60c 4). The table, the audit and the next eval refuse it in one line, and
    the fix it gives works."""
    from pipelines.cli import main
    from training.contract.integrity import record_began

    ours, theirs = (_copy_run(eval_run[0], tmp_path / name) for name in ("ours", "theirs"))
    for run, run_id in ((ours, "a" * 32), (theirs, "b" * 32)):
        record_began(run, 5, run_id)  # a record from step 5 on: the step-5 export is before it
    assert main(["eval", str(theirs), "--step", "5", *QUICK]) == 0
    scores = json.loads((eval_dir(theirs, 5) / "results.json").read_text())
    assert {info["run_id"] for info in scores["gristmill_tasks"].values()} == {"b" * 32}
    shutil.copytree(eval_dir(theirs, 5), eval_dir(ours, 5))
    shutil.copy(theirs / "eval.parquet", ours / "eval.parquet")  # the table of those scores too
    capsys.readouterr()
    results = eval_dir(ours, 5) / "results.json"
    fix = f"move {results.parent} out of {ours / 'eval'}"
    for command in (["eval", str(ours), "--table"], ["data", "audit", str(ours), "--sql", "FROM eval"]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        line = err.strip().splitlines()[-1]
        assert "Traceback" not in err, err
        assert line.startswith(f"error: {results} holds another run's scores (heldout_ppl records run id"), (
            line
        )
        assert fix in line, line
    assert main(["eval", str(ours), "--step", "5", *QUICK]) == 2  # refused before scoring
    err = capsys.readouterr().err
    assert "Traceback" not in err and "heldout_ppl: " not in err and fix in err.strip().splitlines()[-1], err
    shutil.rmtree(results.parent)
    assert main(["eval", str(ours), "--step", "5", *QUICK]) == 0
    scores = json.loads(results.read_text())
    assert {info["run_id"] for info in scores["gristmill_tasks"].values()} == {"a" * 32}
    assert main(["eval", str(ours), "--table"]) == 0


def test_scores_copied_under_another_step_s_folder_are_refused(eval_run, tmp_path, capsys):
    """A step's eval folder copied under another step's name was tabled as that step's scores, and
    --watch took the step as scored (trial RV63b 3): its results.json says which step it scored."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    shutil.copytree(eval_dir(run, 5), eval_dir(run, 7))
    capsys.readouterr()
    assert main(["eval", str(run), "--table"]) == 2
    results = eval_dir(run, 7) / "results.json"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {results} holds step 5's scores (its gristmill.step), not step 7's: move {results.parent} "
        f"out of {run / 'eval'}; while the run keeps step 7's export or checkpoint, `gristmill eval {run} "
        "--step 7` scores it"
    )
    shutil.rmtree(eval_dir(run, 7))
    assert main(["eval", str(run), "--table"]) == 0


def test_an_audit_s_eval_view_reads_the_table_its_stale_check_read(eval_run, tmp_path):
    """The audit reads a live run's eval.parquet into a copy (trial RV63c F1); the copy was taken before
    the datasets were hashed, and an eval that changed the scores meanwhile passed the check of the table
    as it was then while the view answered the copy: scores no results.json holds (review RV63f 1)."""
    from pipelines.cli import main
    from training.contract.eval_table import eval_lock, write_eval_table
    from validation.audit_views import connect, run_tables_read_once

    run = _copy_run(eval_run[0], tmp_path / "run")
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    with run_tables_read_once([run]):  # the copy: step 5's scores
        with eval_lock(run):  # meanwhile an eval sets step 5 aside and rebuilds the table
            shutil.move(eval_dir(run, 5), tmp_path / "aside")
            write_eval_table(run)
        con, _ = connect([run])
        assert con.execute("SELECT count(*) FROM eval").fetchone() == (0,)
        con.close()


def test_watch_scores_again_a_step_scored_under_other_settings(eval_run, tmp_path, capsys):
    """A step the in-training eval (or an earlier `--set limit=…`) scored on fewer documents was taken
    for done by `--watch`, which then scored nothing, exit 0: each task's scores now record the
    settings they depend on, and a step is done only under the same ones. `plot` is not one of them:
    plot=false draws no eval.png, and a step scored under it is done under plot=true."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    results = eval_dir(run, 5) / "results.json"
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05"]
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0  # limit=3, plot=false
    assert not (run / "eval.png").exists() and (run / "eval.parquet").is_file()
    first = json.loads(results.read_text())
    assert first["gristmill_tasks"]["heldout_ppl"]["settings"]["limit"] == 3
    import pyarrow.parquet as pq

    settings = {r["settings"] for r in pq.read_table(run / "eval.parquet").to_pylist()}  # each row's
    assert len(settings) == 1 and "limit=3, max_length=0" in settings.pop(), settings
    # whose held-out documents, and which model scored the task: its own record, not the header's
    # (the newest eval's, once another eval merged its tasks into the step: review R17a F1)
    task = first["gristmill_tasks"]["heldout_ppl"]
    assert task["settings"]["heldout"]["source"] == first["gristmill"]["heldout"]["source"]
    assert len(task["settings"]["heldout"]["fingerprint"]) == 64  # the dataset's, not its path
    assert task["model"] == first["gristmill"]["export"] == str(export_dir(run, 5).resolve())
    assert main([*watch, *QUICK, "plot=true"]) == 0  # the same settings, which plot is not one of: done
    assert results.read_text() == json.dumps(first, indent=2, ensure_ascii=False) + "\n"
    (run / "eval.png").write_bytes(b"an earlier picture")  # as if drawn before
    capsys.readouterr()
    assert main([*watch, *[a for a in QUICK if a != "limit=3"]]) == 0  # every document: scored again
    again = json.loads(results.read_text())
    assert again["gristmill_tasks"]["heldout_ppl"]["settings"]["limit"] == 0
    effective = [r["n-samples"]["heldout_ppl"]["effective"] for r in (first, again)]
    assert effective == [3, 5]
    # scored again under plot=false: none drawn, and the earlier picture said to lack the scores (RV65c)
    assert (run / "eval.png").read_bytes() == b"an earlier picture"
    note = f"note: {run / 'eval.png'} is an earlier picture, without the scores from step 5 on (plot = false)"
    assert note in capsys.readouterr().err


def test_each_task_s_row_names_the_model_that_scored_it():
    """Later evals of a step merge their tasks into its results.json and its header is the newest's:
    eval.parquet named the export of a cloze eval as the model of the in-training heldout_ppl scores
    (review R17a F1). Each task's row takes the model its task records."""
    from training.contract.eval_table import rows_of

    results = {
        "results": {"heldout_ppl": {"bits_per_byte,none": 2.5}, "heldout_cloze": {"acc,none": 0.25}},
        "gristmill": {"export": "/r/exports/step-000020"},
        "gristmill_tasks": {
            "heldout_ppl": {"model": "in-training"},
            "heldout_cloze": {"model": "/r/exports/step-000020"},
        },
    }
    assert {r["task"]: r["model"] for r in rows_of(20, results)} == {
        "heldout_ppl": "in-training",
        "heldout_cloze": "/r/exports/step-000020",
    }
    del results["gristmill_tasks"]  # recorded before it was per task: the header's
    assert {r["model"] for r in rows_of(20, results)} == {"/r/exports/step-000020"}


def test_rows_scored_under_other_settings_say_so(tmp_path, capsys):
    """An offline `--set max_length=64` of a step beside the in-training eval's merged rows: the table
    and the plot showed both side by side, unmarked (review R24e 6). Each row carries its task's settings
    (a group's member recorded without its own, its group's); the plot's panel and the printed table say
    where they differ."""
    from training.contract.eval_table import rows_of
    from validation.eval import print_table
    from validation.eval_results import plot_panels

    def results(max_length: int) -> dict:
        settings = {"limit": 0, "max_length": max_length, "docs": 40, "heldout": {"source": "prose"}}
        return {
            "results": {"heldout_ppl": {"bits_per_byte,none": 2.5}, "grp": {}, "mc": {"acc,none": 0.3}},
            "group_subtasks": {"grp": ["mc"]},
            "gristmill_tasks": {"heldout_ppl": {"settings": settings}, "grp": {"settings": settings}},
        }

    raw, merged = rows_of(150, results(64)), rows_of(150, results(0), merged=True)
    assert {r["task"]: r["settings"] for r in raw} == {
        "heldout_ppl": "docs=40, heldout=prose, limit=0, max_length=64",
        "mc": "limit=0, max_length=64",  # its group's, as they hold for a member (settings_held: no local
        # settings of the group's, as `evaluated` reads them: review RV35a F3)
    }
    rows = raw + merged + rows_of(100, results(0))
    panels = {p.task: p for p in plot_panels(rows, {})}
    assert panels["heldout_ppl"].other_settings == "max_length=0 at 100, 150m; max_length=64 at 150"
    assert plot_panels(rows_of(100, results(0)) + merged, {})[0].other_settings == ""
    for step, merged, max_length in ((150, False, 64), (150, True, 0), (100, False, 0)):  # what it reads
        path = eval_dir(tmp_path, step, merged) / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(results(max_length)))
    print_table(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "settings" and lines[2].endswith("max_length=0"), lines
    assert [line.endswith("max_length=64") for line in lines[2:]] == [False, False, True, True], lines
    assert {r["settings"] for r in rows_of(5, {"results": results(0)["results"]})} == {None}  # recorded
    # before settings were


def test_a_hub_task_is_not_scored_again_for_another_docs(tmp_path):
    """`docs` is how many held-out documents the local tasks score: a hub task scored under another
    value was taken for not done and scored again (minutes of a GPU for the same numbers)."""
    from training.contract.eval_table import read_step_results
    from validation.eval import HeldOut, evaluated, score_settings
    from validation.eval_results import write_step_json

    before = EvalConfig(docs=5)
    code = HeldOut("code", "c1", frozenset({"c1"}))
    tasks = {
        "hellaswag": {"settings": score_settings(before)},
        "heldout_ppl": {"settings": score_settings(before, code)},
    }
    write_step_json(tmp_path, 3, {"results": {"hellaswag": {}, "heldout_ppl": {}}, "gristmill_tasks": tasks})
    names, local = ["hellaswag", "heldout_ppl"], ["heldout_ppl"]
    assert evaluated(tmp_path, 3, names, local, code, before)
    assert evaluated(tmp_path, 3, ["hellaswag"], local, code, EvalConfig(docs=50))
    assert not evaluated(tmp_path, 3, names, local, code, EvalConfig(docs=50))  # heldout_ppl: other documents
    assert not evaluated(tmp_path, 3, ["hellaswag"], local, code, EvalConfig(docs=5, limit=3))
    # another source's held-out documents (eval.source changed on a resume): the local task is not
    # done, the hub task is (review R17a F1: the step's results mixed two sources under one label)
    prose = HeldOut("prose", "p1", frozenset({"p1"}))
    assert evaluated(tmp_path, 3, ["hellaswag"], local, prose, before)
    assert not evaluated(tmp_path, 3, names, local, prose, before)
    # the same data elsewhere (moved, or `data convert`ed: its identities hold the old fingerprint)
    # is the same documents, and scores from before the record was per task are taken by the file's
    # header (review R17c M1: every local task of every run was scored again)
    assert evaluated(tmp_path, 3, names, local, HeldOut("code", "c2", frozenset({"c2", "c1"})), before)
    for task in tasks.values():
        task["settings"].pop("heldout", None)
    header = {"heldout": {"source": "code", "dataset": "runs/data/code"}}
    write_step_json(
        tmp_path,
        4,
        {"results": {"hellaswag": {}, "heldout_ppl": {}}, "gristmill_tasks": tasks, "gristmill": header},
    )
    assert evaluated(tmp_path, 4, names, local, code, before)
    assert not evaluated(tmp_path, 4, names, local, prose, before)
    # ... and keep their header's word once a later eval of the step replaces the header: a hub-only
    # eval (no heldout in its header) re-scored them all, a local one on another source took them for
    # its own, and their rows named its model (review R17f F1)
    header["export"] = "/r/exports/step-000004"
    tasks["heldout_cloze"] = tasks["heldout_ppl"]  # settings, as each task's since they were recorded
    write_step_json(
        tmp_path,
        4,
        {"results": {"heldout_ppl": {}, "heldout_cloze": {}}, "gristmill_tasks": tasks, "gristmill": header},
    )
    later = {"hellaswag": {"settings": score_settings(before), "model": "/r/exports/step-000004-again"}}
    write_step_json(
        tmp_path, 4, {"results": {"hellaswag": {}}, "gristmill_tasks": later, "gristmill": {"export": "x"}}
    )
    assert evaluated(tmp_path, 4, names, local, code, before)
    assert not evaluated(tmp_path, 4, ["heldout_cloze"], ["heldout_cloze"], prose, before)
    assert evaluated(tmp_path, 4, ["heldout_cloze"], ["heldout_cloze"], code, before)
    recorded = read_step_results(tmp_path, 4)["gristmill_tasks"]
    assert recorded["heldout_cloze"]["model"] == "/r/exports/step-000004"


def test_a_step_scored_under_another_bootstrap_iters_is_scored_again(tmp_path, capsys):
    """bootstrap_iters decides the stderrs (none at 0), yet was no recorded setting: a watch under another
    value counted the step done, and rows of two stderr regimes shared one settings string (review R30a
    m1). It is recorded; scores recorded before it was are of the value every eval used then, 1000 (they
    were done under any, and the note and the plot said `bootstrap_iters ? → 1000`: RV31a 6), unless their
    stderrs say 0: all "N/A" where lm-eval computes them under any other (acc's; perplexities have none,
    and their "N/A" is 1000's too). Such a record was read as 1000 (RV32f B3)."""
    from training.contract.eval_table import read_step_results, settings_of
    from validation.eval import evaluated, score_settings
    from validation.eval_results import settings_apart, write_step_json

    off = EvalConfig(bootstrap_iters=0)
    off_now = score_settings(off)
    before = {k: v for k, v in off_now.items() if k != "bootstrap_iters"}  # as recorded before

    def write(step: int, settings: dict, metrics: dict | None = None, **record) -> None:
        tasks = {"hellaswag": {"settings": settings}}
        results = {"results": {"hellaswag": metrics or {}}, "gristmill_tasks": tasks, **record}
        write_step_json(tmp_path, step, results)

    write(3, score_settings(off))
    write(4, before)
    assert evaluated(tmp_path, 3, ["hellaswag"], [], None, off)
    assert not evaluated(tmp_path, 3, ["hellaswag"], [], None, EvalConfig())  # 1000: stderrs
    assert "bootstrap_iters=0" in settings_of(read_step_results(tmp_path, 3), "hellaswag")
    assert evaluated(tmp_path, 4, ["hellaswag"], [], None, EvalConfig())
    assert not evaluated(tmp_path, 4, ["hellaswag"], [], None, off)
    was = settings_of(read_step_results(tmp_path, 4), "hellaswag")
    capsys.readouterr()
    write(4, score_settings(EvalConfig()))  # the same setting: no note, and the plot's rows agree
    assert "scored again" not in capsys.readouterr().out
    now = settings_of(read_step_results(tmp_path, 4), "hellaswag")
    assert settings_apart([{"step": 4, "settings": was}, {"step": 5, "settings": now}]) == ""
    write(4, before)
    write(4, score_settings(off))
    assert "hellaswag (bootstrap_iters 1000 → 0)" in capsys.readouterr().out
    # an older record's own stderrs: none of acc's of two documents (0), none of a perplexity's (1000 as
    # well); acc of one document has "N/A" under 1000 too (it was read as 0: RV33a F2). Not its header
    # (lm-eval's `config`): an older gristmill merged evals under the newest one's (RV33g G2, G3), so a
    # perplexity's under 0 is read as 1000 (its scores are the same under any)
    for metric, docs, header, was_off in [
        ("acc", 2, None, True),
        ("word_perplexity", 2, None, False),
        ("acc", 1, 1000, False),
        ("word_perplexity", 2, 0, False),
        ("acc", 2, 1000, True),
    ]:
        metrics = {f"{metric},none": 0.5, f"{metric}_stderr,none": "N/A"}
        record = {"n-samples": {"hellaswag": {"original": docs, "effective": docs}}}
        record |= {"config": {"bootstrap_iters": header}} if header is not None else {}
        write(6, before, metrics, **record)
        assert evaluated(tmp_path, 6, ["hellaswag"], [], None, off) is was_off
        assert evaluated(tmp_path, 6, ["hellaswag"], [], None, EvalConfig()) is not was_off
        row = {
            "step": 6,
            "task": "hellaswag",
            "metric": metric,
            "filter": "none",
            "stderr": None,
            "samples": docs,
        }
        older = read_step_results(tmp_path, 6)
        old = settings_of(older, "hellaswag")
        capsys.readouterr()
        if header is not None:  # a later eval of another task replaces the header: nothing changes
            write_step_json(
                tmp_path, 6, {"results": {"arc": {}}, "config": {"bootstrap_iters": 1000 - header}}
            )
            assert evaluated(tmp_path, 6, ["hellaswag"], [], None, off) is was_off
        write(6, score_settings(off), metrics, **record)
        assert ("hellaswag (bootstrap_iters 1000 → 0)" in capsys.readouterr().out) is not was_off
        now = settings_of(read_step_results(tmp_path, 6), "hellaswag")
        apart = settings_apart([{**row, "settings": old}, {**row, "step": 7, "settings": now}], {6: older})
        assert (apart == "") is was_off
    # a group's stderr is "N/A" where one member's is (of one document), and its sample_len is their sum
    members = {
        "a": {"acc,none": 0.5, "acc_stderr,none": 0.2},
        "b": {"acc,none": 1.0, "acc_stderr,none": "N/A"},
    }
    results = {
        "results": {"g": {"acc,none": 0.6, "acc_stderr,none": "N/A", "sample_len": 7}, **members},
        "group_subtasks": {"g": ["a", "b"]},
        "n-samples": {"a": {"effective": 6}, "b": {"effective": 1}},
        "gristmill_tasks": {t: {"settings": before} for t in ("g", "a", "b")},
        "config": {"bootstrap_iters": 1000},
    }
    write_step_json(tmp_path, 8, results)
    assert evaluated(tmp_path, 8, ["g"], [], None, EvalConfig())
    # scored under 0 (a's stderr "N/A" of 6 documents), a later eval's header 1000 merged in: 0, as its
    # members say (it was done under 1000, a's stderrs never filled in: RV33g G2)
    results["results"]["a"]["acc_stderr,none"] = "N/A"
    write_step_json(tmp_path, 9, results)
    assert evaluated(tmp_path, 9, ["g"], [], None, off)
    assert not evaluated(tmp_path, 9, ["g"], [], None, EvalConfig())
    # such a group's merged-weights row (eval.parquet's: no samples, lm-eval counts none of a group) read
    # its own "N/A" alone, which says nothing: 1000, "other settings" beside a row under 0 (RV33g G4).
    # It reads its merged step's record, as a raw row its step's
    row = {"task": "g", "metric": "acc", "filter": "none", "stderr": None, "samples": None}
    rows = [
        {**row, "step": 9, "merged": True, "settings": settings_of(results, "g")},
        {**row, "step": 11, "settings": settings_of({"gristmill_tasks": {"g": {"settings": off_now}}}, "g")},
    ]
    assert settings_apart(rows, {}, {9: read_step_results(tmp_path, 9)}) == ""
    assert settings_apart(rows, {9: read_step_results(tmp_path, 9)}) != ""  # the raw step's is not its
    # the group's own stderr a number (under 1000), a member scored alone under 0 since: 1000 (RV33h H2)
    results["results"]["g"]["acc_stderr,none"] = 0.158
    write_step_json(tmp_path, 10, results)
    assert evaluated(tmp_path, 10, ["g"], [], None, EvalConfig())


def test_a_variant_of_a_task_whose_name_holds_colons_is_told_by_its_group_s_prefix():
    """A group's variant of `my::mc` that a gristmill before GROUP::task names recorded as `my::mc` is
    `gpx::my::mc` now: the member is the name less the group's prefix, not its last `::` part (`mc`,
    which the record does not hold: the variant's scores were kept as my::mc's own, review RV33g G1)."""
    from validation.eval_results import variants_replaced

    by_group, own = {"settings": {"definition": "d" * 64}}, {"settings": {"definition": "e" * 64}}
    old = {
        "results": {"gpx": {"acc,none": 0.5}, "my::mc": {"acc,none": 0.5}, "mc": {"acc,none": 0.25}},
        "group_subtasks": {"gpx": ["my::mc"]},
        "gristmill_tasks": {"gpx": by_group, "my::mc": by_group, "mc": own},
        "configs": {"my::mc": {"doc_to_text": "zzz"}},
    }
    new = {"group_subtasks": {"gpx": ["gpx::my::mc"]}, "configs": {"gpx::my::mc": {"doc_to_text": "zzz"}}}
    assert list(variants_replaced(old, new)) == ["my::mc"]
    # a registered group named my::suite: its member my::mc is no `mc` (an enclosing group is one the
    # step holds, not a part of the group's name: mc's own scores were dropped, review RV33h H1)
    old = {**old, "group_subtasks": {"my::suite": ["mc", "my::mc"]}}
    old["gristmill_tasks"] = {"my::suite": by_group, "my::mc": by_group, "mc": by_group}
    assert variants_replaced(old, {"group_subtasks": {"my::suite": ["my::mc"]}}) == {}


def test_a_step_scored_again_under_other_settings_says_which_scores_it_replaces(tmp_path, capsys):
    """An offline `gristmill eval RUN --step 4` (docs 40) replaced the in-training eval's scores of the
    step (docs 10) in results.json and eval.parquet, saying nothing, while metrics.jsonl kept the old
    ones (review R26d F2): one line names the step, the task and the settings replaced. Scored again
    under the same settings, or a task the step had not, nothing is said; a group's members go with it
    where the step held them as its members."""
    from validation.eval import HeldOut, score_settings
    from validation.eval_results import write_step_json

    prose = HeldOut("prose", "p1", frozenset({"p1"}))

    def scored(tasks: list[str], cfg: EvalConfig, merged: bool = False, groups=None, by=None) -> None:
        info = {
            t: {"settings": score_settings(cfg, prose if t.startswith("heldout") else None)} for t in tasks
        }
        for t in info if by else ():  # the planned name whose eval wrote each entry, as evaluate_lm records
            info[t]["scored_by"] = by
        results = {"results": {t: {"acc,none": 0.5} for t in tasks}, "gristmill_tasks": info}
        if groups:
            results["group_subtasks"] = groups
        write_step_json(tmp_path, 4, results, merged)

    scored(["heldout_ppl", "mmlu", "mmlu_a"], EvalConfig(docs=10), groups={"mmlu": ["mmlu_a"]})
    scored(["heldout_cloze"], EvalConfig(docs=40))
    scored(["heldout_ppl"], EvalConfig(docs=10))
    assert "note: step 4" not in capsys.readouterr().out
    scored(["heldout_ppl", "mmlu", "mmlu_a"], EvalConfig(docs=40, limit=5), groups={"mmlu": ["mmlu_a"]})
    out = capsys.readouterr().out
    assert out.count("note: step 4") == 1, out
    assert (
        "note: step 4 scored again under other settings: heldout_ppl (docs 10 → 40, limit 0 → 5), mmlu "
        f"(limit 0 → 5); these scores replace those in {eval_dir(tmp_path, 4) / 'results.json'} and "
        "eval.parquet (metrics.jsonl keeps any the training run logged)"
    ) in out
    # a member scored alone, then by its group under other settings: named (R30a F2: it went with the group)
    scored(["mmlu_b"], EvalConfig())
    both = {"mmlu": ["mmlu_a", "mmlu_b"]}
    scored(["mmlu", "mmlu_a", "mmlu_b"], EvalConfig(docs=40, limit=5), groups=both)
    assert "under other settings: mmlu_b (limit 0 → 5); these" in capsys.readouterr().out
    # a member scored alone after its group, then the group again: named (the file listed it under the
    # group still, and it went with the group: review RV30c m3)
    scored(["mmlu", "mmlu_a", "mmlu_b"], EvalConfig(), groups=both, by="mmlu")
    scored(["mmlu_b"], EvalConfig(limit=2), by="mmlu_b")
    capsys.readouterr()
    scored(["mmlu", "mmlu_a", "mmlu_b"], EvalConfig(), groups=both, by="mmlu")
    assert "under other settings: mmlu_b (limit 2 → 0); these" in capsys.readouterr().out
    # a member a gristmill before members recorded their own wrote under its group's definition, scored
    # alone: said so, not an edit of the task nobody made (RV30c m4)
    group = score_settings(EvalConfig(), definition="d" * 64)
    entries = {"plain": {"settings": group}, "mmlu_c": {"settings": group}}
    results = {"results": {t: {"acc,none": 0.5} for t in entries}, "group_subtasks": {"plain": ["mmlu_c"]}}
    write_step_json(tmp_path, 4, {**results, "gristmill_tasks": entries})
    own = {"settings": score_settings(EvalConfig(), definition="c" * 64, documents="e" * 64)}
    write_step_json(tmp_path, 4, {"results": {"mmlu_c": {}}, "gristmill_tasks": {"mmlu_c": own}})
    assert (
        "under other settings: mmlu_c (recorded under plain's definition before members recorded their own, "
        "documents ? → eeeeeeee); these"
    ) in capsys.readouterr().out
    scored(["heldout_ppl"], EvalConfig(docs=10), merged=True)
    scored(["heldout_ppl"], EvalConfig(docs=40), merged=True)
    assert "note: step 4 (merged weights) scored again under other settings: heldout_ppl (docs 10 → 40)" in (
        capsys.readouterr().out
    )


def test_a_later_eval_of_a_local_task_gives_no_heldout_to_a_task_that_reads_none(tmp_path):
    """A step's own task (own_ppl, not made of held-out documents) scored, then a local task of the step:
    merging, the old header's `heldout` went into every old task's settings, own_ppl's too, and its
    steps read as scored under other settings (eval.png: "heldout=? at 20; heldout=data at 40": review
    R30a F4). Only a task that reads the held-out documents keeps its file's header's."""
    from training.contract.eval_table import read_step_results, settings_of
    from validation.eval import score_settings
    from validation.eval_results import write_step_json

    header = {"run": "r", "step": 4, "export": "e", "heldout": {"source": "data", "dataset": "d"}}
    for step in (4, 8):
        write_step_json(tmp_path, step, {
            "results": {"own_ppl": {"bits_per_byte,none": 2.5}},
            "gristmill_tasks": {"own_ppl": {"settings": score_settings(CFG, definition="abc")}},
            "gristmill": {**header, "step": step},  # a header that names held-out documents (an older file's)
        })  # fmt: skip
    # an old file's local task, scored before settings were recorded, then a later eval of another
    # local task on other held-out documents (the header replaced)
    write_step_json(
        tmp_path, 8, {"results": {"heldout_cloze": {"acc,none": 0.5}}, "gristmill": {**header, "step": 8}}
    )
    write_step_json(tmp_path, 8, {
        "results": {"heldout_ppl": {"bits_per_byte,none": 2.0}},
        "gristmill_tasks": {"heldout_ppl": {"settings": {"docs": 5}}},
        "gristmill": {**header, "step": 8, "heldout": {"source": "other", "dataset": "o"}},
    })  # fmt: skip
    old, new = read_step_results(tmp_path, 4), read_step_results(tmp_path, 8)
    assert settings_of(new, "own_ppl") == settings_of(old, "own_ppl"), settings_of(new, "own_ppl")
    assert "heldout" not in settings_of(new, "own_ppl")
    assert new["gristmill_tasks"]["heldout_cloze"]["heldout"] == header["heldout"]  # its documents kept


def test_watch_goes_on_past_a_step_deleted_before_it_was_evaluated(
    built_dataset, tmp_path, monkeypatch, capsys
):
    """`eval --watch` beside a running trainer: retention (checkpoint.keep_last) deleted a step it had
    listed, and the watch stopped with the error while training went on (review R5)."""
    import validation.eval as eval_module
    from pipelines.cli import main

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5, 10])
    real = eval_module.evaluate_step

    def deleted_first(run_dir, step, *args, **kwargs):  # the trainer's retention, just before
        if step == 5:
            shutil.rmtree(export_dir(run_dir, 5))
        return real(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(eval_module, "evaluate_step", deleted_first)
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *QUICK]
    assert main(watch) == 0
    err = capsys.readouterr().err
    assert "step 5 skipped: its checkpoint went away before it was evaluated" in err, err
    assert (eval_dir(run, 10) / "results.json").is_file() and not eval_dir(run, 5).exists()


def test_a_step_s_damaged_results_json_stops_no_other_step_s_eval(built_dataset, tmp_path, capsys):
    """`--watch` (evaluate_missing) stopped at the first step whose results.json was damaged, scoring
    no later one (trial RV61b F1). That step is said once, the others are scored; the watch goes on,
    and evaluate_missing without a failures list raises its line once every other step is scored."""
    from pipelines.cli import main
    from training.contract.eval_table import EvalResultsError
    from validation.eval import evaluate_missing, load_eval_config

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5, 10])
    damaged = eval_dir(run, 5) / "results.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"results": {')
    capsys.readouterr()
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.3", *QUICK]
    assert main(watch) == 0
    err = capsys.readouterr().err
    assert err.count(f"step 5 not scored: {damaged} is damaged (") == 1, err  # once, over the polls
    assert (eval_dir(run, 10) / "results.json").is_file()
    shutil.rmtree(eval_dir(run, 10))
    cfg = load_eval_config(None, QUICK[3:], "heldout_ppl")
    with pytest.raises(EvalResultsError, match=f"^{re.escape(str(damaged))} is damaged"):
        evaluate_missing(run, cfg, TaskPlan(run, cfg), show=False)
    assert (eval_dir(run, 10) / "results.json").is_file()


def test_watch_names_the_steps_saved_and_gone_while_it_scored_another(
    built_dataset, tmp_path, monkeypatch, capsys
):
    """Steps a running trainer saved and its retention deleted while the watch scored another step were
    never seen by a look, and went by without a line (trial RV59a F4): RUN/checkpoints.jsonl names them."""
    import validation.eval as eval_module
    from pipelines.cli import main
    from training.contract.integrity import record_saved

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5, 10])
    record_saved(run, 5, "a" * 64)  # saved before the watch began: not the watch's to name
    real = eval_module.evaluate_step

    def trainer_meanwhile(run_dir, step, *args, **kwargs):
        if step == 5:  # saved and deleted (keep_last) while step 5 is scored
            for saved in (6, 7, 8):
                record_saved(run_dir, saved, f"{saved}" * 64)
            # step 8 scored by the run's own [eval] before retention took it: no miss (review RV59f 2)
            eval_dir(run_dir, 8).mkdir(parents=True)
            (eval_dir(run_dir, 8) / "results.json").write_text("{}")
        if step == 10:  # saved after the look found its steps, and deleted before the next look
            shutil.copytree(export_dir(run_dir, 5), export_dir(run_dir, 11))
            record_saved(run_dir, 11, "b" * 64)
        return real(run_dir, step, *args, **kwargs)

    sleep = eval_module.time.sleep

    def retention_between_looks(seconds: float) -> None:
        shutil.rmtree(export_dir(run, 11), ignore_errors=True)
        sleep(seconds)

    monkeypatch.setattr(eval_module, "evaluate_step", trainer_meanwhile)
    monkeypatch.setattr(eval_module.time, "sleep", retention_between_looks)
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *QUICK]
    assert main(watch) == 0
    err = capsys.readouterr().err
    assert err.count("skipped: saved and gone") == 2, err
    assert "steps 6, 7 skipped: saved and gone (a running run's checkpoint.keep_last" in err, err  # not 8
    # step 11 was there when the look ended, and taken for seen: never scored nor said (trial RV66d F1)
    assert "step 11 skipped: saved and gone" in err, err


def test_a_step_that_appears_after_an_idle_look_is_scored_before_the_watch_exits(
    built_dataset, tmp_path, monkeypatch
):
    """`--idle-exit`: a step saved after a look that found nothing new, before the idle check, ended the
    watch unscored and unsaid (review RV66g nit). It is looked at first."""
    import validation.eval as eval_module
    from pipelines.cli import main

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5])
    real = eval_module.read_ledger
    calls = []

    def saved_meanwhile(run_dir):
        calls.append(1)
        if len(calls) == 3:  # after the second look (the first idle one), before its idle check
            model = _tiny_model(built_dataset, seed=12)
            export_hf(
                model.state_dict(), model.cfg, built_dataset, export_dir(run_dir, 12), meta={"step": 12}
            )
        return real(run_dir)

    monkeypatch.setattr(eval_module, "read_ledger", saved_meanwhile)
    watch = ["eval", str(run), "--watch", "--poll", "0.3", "--idle-exit", "0.01", *QUICK]
    assert main(watch) == 0
    assert (eval_dir(run, 12) / "results.json").is_file()


def test_a_step_whose_checkpoint_went_while_it_was_read_is_scored_from_an_export_made_meanwhile(
    built_dataset, tmp_path, monkeypatch, capsys
):
    """Two watches beside a run with keep_last = 1: the checkpoint of step 11 went while this watch read
    it, and the other watch had exported it meanwhile; the step counted as available, so the error was
    raised and the watch died, exit 2 (trial RV66d F3). It is scored from that export. An export this
    eval wrote itself, then a failure of its own while retention deleted the checkpoint, is that failure,
    said once: it was called "went while it was read" and scored again (review RV67d 2)."""
    import validation.eval as eval_module
    from pipelines.cli import main
    from training.checkpoint.hf_export import ExportError
    from training.contract.run_layout import checkpoint_dir

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5])
    fake_checkpoint(run, 11)  # a complete checkpoint when the look lists the steps
    real, tries = eval_module.export_checkpoint, []

    def deleted_while_read(run_dir, step, *args, **kwargs):
        tries.append(step)
        if step == 11 and tries.count(11) == 1:  # the other watch's export, then retention
            model = _tiny_model(built_dataset, seed=11)
            export_hf(
                model.state_dict(), model.cfg, built_dataset, export_dir(run_dir, 11), meta={"step": 11}
            )
            shutil.rmtree(checkpoint_dir(run_dir, 11))
            raise ExportError(
                f"{run_dir} has no complete checkpoint of step 11 any more (deleted while it was read)"
            )
        return real(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(eval_module, "export_checkpoint", deleted_while_read)
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *QUICK]
    assert main(watch) == 0
    err = capsys.readouterr().err
    assert f"step 11: its checkpoint went while it was read; scored from {export_dir(run, 11)}" in err, err
    assert (eval_dir(run, 11) / "results.json").is_file() and tries.count(11) == 2
    # its own export written, then its own failure while retention deleted the checkpoint
    fake_checkpoint(run, 12)

    def own_export_then_retention(run_dir, step, *args, **kwargs):
        if step != 12:
            return real(run_dir, step, *args, **kwargs)
        tries.append(step)
        model = _tiny_model(built_dataset, seed=12)
        made = export_hf(
            model.state_dict(), model.cfg, built_dataset, export_dir(run_dir, 12), meta={"step": 12}
        )
        shutil.rmtree(checkpoint_dir(run_dir, 12))
        return made

    def refused(export, *args, **kwargs):  # its own failure, once its export is written
        raise ExportError(f"{export} is refused by this transformers")

    monkeypatch.setattr(eval_module, "export_checkpoint", own_export_then_retention)
    monkeypatch.setattr(eval_module, "check_export_tokenizer", refused)
    assert main(watch) == 2
    err = capsys.readouterr().err
    assert "went while it was read" not in err and tries.count(12) == 1, err
    assert err.splitlines()[-1] == f"error: {export_dir(run, 12)} is refused by this transformers", err


def test_eval_without_step_scores_the_newest_step_when_its_checkpoint_went_while_it_was_read(
    built_dataset, tmp_path, monkeypatch, capsys
):
    """`gristmill eval RUN` (no --step) beside a running run with checkpoint.keep_last = 1: the newest step
    went while it was read, and the error named a step the user never gave (trial RV66d F6). The newest
    step now is scored; a step given with --step fails as it fails."""
    import validation.eval as eval_module
    from pipelines.cli import main
    from training.checkpoint.hf_export import ExportError
    from training.contract.run_layout import checkpoint_dir

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5])
    fake_checkpoint(run, 11)  # the newest when the eval starts
    real = eval_module.evaluate_step
    tries = []

    def retention_meanwhile(run_dir, step, *args, **kwargs):
        tries.append(step)
        if step == 11:  # the trainer saved step 12 and its retention deleted step 11
            model = _tiny_model(built_dataset, seed=12)
            export_hf(
                model.state_dict(), model.cfg, built_dataset, export_dir(run_dir, 12), meta={"step": 12}
            )
            if checkpoint_dir(run_dir, 11).is_dir():
                shutil.rmtree(checkpoint_dir(run_dir, 11))
            raise ExportError(f"{run_dir} has no complete checkpoint of step 11 any more")
        return real(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(eval_module, "evaluate_step", retention_meanwhile)
    assert main(["eval", str(run), *QUICK]) == 0
    err = capsys.readouterr().err
    assert "step 11: its checkpoint went while it was read; evaluating step 12, the newest now" in err, err
    assert tries == [11, 12] and (eval_dir(run, 12) / "results.json").is_file()
    fake_checkpoint(run, 11)
    assert main(["eval", str(run), "--step", "11", *QUICK]) == 2
    assert "has no complete checkpoint of step 11 any more" in one_error_line(capsys.readouterr().err)
    # a newest checkpoint that does not verify (no export of it) is passed over, as export passes over
    # it, which the refusal's advice said and eval did not do (trial RV67a F15); --step N fails as it fails
    monkeypatch.setattr(eval_module, "evaluate_step", real)
    shutil.rmtree(checkpoint_dir(run, 11), ignore_errors=True)  # (the fake deleted it again)
    fake_checkpoint(run, 13)
    (checkpoint_dir(run, 13) / "__0_0.distcp").write_bytes(b"y" * 10)  # its size kept, its crc32 not
    shutil.rmtree(eval_dir(run, 12))
    assert main(["eval", str(run), *QUICK]) == 0
    err = capsys.readouterr().err
    assert "skipped step 13: step-000013 is damaged: " in err and "; evaluating step 12" in err, err
    assert (eval_dir(run, 12) / "results.json").is_file()
    assert main(["eval", str(run), "--step", "13", *QUICK]) == 2
    capsys.readouterr()


def test_a_step_a_rewind_set_aside_while_the_watch_scored_it_is_not_recorded(
    eval_run, tmp_path, monkeypatch, capsys
):
    """`eval --watch` beside a trainer that rewinds: the rewind set aside exports/step-N (a discarded
    timeline's) while the watch scored it, and the scores were written as step N's all the same, so
    the retrained step N was taken for done, never scored. The rewind here is the run's own set-aside
    (RunRecord._set_aside), between the scoring and the writing."""
    import validation.eval as eval_module
    from pipelines.cli import main
    from training.run.record import RunRecord

    run = _copy_run(eval_run[0], tmp_path / "run")
    real = eval_module.evaluate_lm

    def rewound_meanwhile(*args, **kwargs):
        results = real(*args, **kwargs)
        RunRecord(run, None, None, rank=0, plot=False)._set_aside(after=4)
        return results

    monkeypatch.setattr(eval_module, "evaluate_lm", rewound_meanwhile)
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *QUICK]
    assert main(watch) == 0
    err = capsys.readouterr().err
    assert "step 5 was not recorded: a rewind of the running training set its checkpoint or export" in err
    assert not (eval_dir(run, 5) / "results.json").exists()
    monkeypatch.setattr(eval_module, "evaluate_lm", real)
    shutil.copytree(export_dir(eval_run[0], 5), export_dir(run, 5))  # the retrained step 5's export
    assert main(watch) == 0
    assert (eval_dir(run, 5) / "results.json").is_file()


@pytest.mark.parametrize(
    "meanwhile",
    ["a rewind", "retention", "a rewind, its abandoned copy deleted", "a resume of an old run",
     "a rewind after a resume from an older checkpoint, its copy deleted"],
)  # fmt: skip
def test_a_step_exported_from_a_checkpoint_is_recorded_unless_a_rewind_set_it_aside(
    built_dataset, tmp_path, monkeypatch, capsys, meanwhile
):
    """The watch exports a step that has no export yet from its checkpoint. A rewind after the
    checkpoint was read found no export to set aside, and the watch wrote exports/step-N from the
    discarded weights and recorded their scores as step N's, exit 0 (review R4): now nothing is
    recorded and the export it wrote is removed. The running trainer's retention (keep_last)
    deleting that checkpoint meanwhile changes nothing of the timeline: its scores are recorded
    and its export kept (review R6: the first fix took it for a rewind and lost both)."""
    import training.checkpoint.hf_export as hf_export
    from pipelines.cli import main
    from training.checkpoint.checkpointer import delete_checkpoint
    from training.contract.run_layout import checkpoint_dir, set_aside_after
    from training.run.record import RunRecord

    run = tmp_path / "run"
    sets = [f"data.dataset={built_dataset}", f"run.output_dir={run}", "data.val_fraction=0.1",
            f"data.seq_len={SEQ_LEN}", "schedule.steps=2", "schedule.warmup_steps=1", "checkpoint.interval=2",
            "run.val_every=0", "metrics.plot=false", "run.threads=1"]  # fmt: skip
    assert main(["train", "--config", str(ROOT / "configs/train/tiny.toml"), "--set", *sets]) == 0
    assert not export_dir(run, 2).exists()
    real = hf_export.load_checkpoint_model
    plan = json.loads((run / "data_plan.json").read_text())
    skip = {"rewind": 1, "first_step": 1, "last_step": 2, "spike_step": 2, "checkpoint_step": 0,
            "reason": "a spike", "sources": []}  # fmt: skip
    if meanwhile == "a resume of an old run":  # from before data_plan.json: its resume writes it
        (run / "data_plan.json").unlink()
    if meanwhile.startswith("a rewind after"):  # recorded before the eval: a rewind of another timeline
        (run / "data_plan.json").write_text(json.dumps({**plan, "skips": [{**skip, "reason": "earlier"}]}))

    def after_the_read(*args, **kwargs):
        loaded = real(*args, **kwargs)
        if meanwhile.startswith("a rewind"):
            set_aside_after(run / "checkpoints", 0)  # what Checkpointer.restore and the record do
            RunRecord(run, None, None, rank=0, plot=False)._set_aside(after=0)
            (run / "data_plan.json").write_text(json.dumps({**plan, "skips": [skip]}))  # the record's
            if meanwhile.endswith("deleted"):  # docs/divergence.md: abandoned-step-N are yours to delete
                shutil.rmtree(run / "checkpoints" / "abandoned-step-000002")
        elif meanwhile == "retention":
            delete_checkpoint(checkpoint_dir(run, 2))  # Checkpointer.prune's
        else:  # the resume writes data_plan.json with the run's past rewinds (here one that step 2 followed)
            (run / "data_plan.json").write_text(json.dumps({**plan, "skips": [skip]}))
        return loaded

    monkeypatch.setattr(hf_export, "load_checkpoint_model", after_the_read)
    capsys.readouterr()
    assert main(["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *QUICK]) == 0
    err = capsys.readouterr().err
    recorded = (eval_dir(run, 2) / "results.json").exists()
    if meanwhile.startswith("a rewind"):
        assert "step 2 was not recorded: a rewind of the running training set its checkpoint or export" in err
        assert not recorded and not export_dir(run, 2).exists()
    else:
        assert recorded and export_dir(run, 2).is_dir() and "not recorded" not in err, err


def test_offline_hub_task_is_refused_before_the_model_loads(eval_run, tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    src, _ = eval_run
    run = tmp_path / "run"
    (run / "exports" / "step-000005").mkdir(parents=True)
    shutil.copy(src / "config.toml", run / "config.toml")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(export_dir(src, 5) / name, export_dir(run, 5) / name)
    (export_dir(run, 5) / "model.safetensors").write_bytes(b"not weights: loading them would fail")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what an offline machine finds out by trying
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))

    assert main(["eval", str(run), "--tasks", "heldout_ppl,hellaswag"]) == 2
    err = capsys.readouterr().err
    assert "task hellaswag needs dataset Rowan/hellaswag from the hub" in err
    assert "HF_DATASETS_CACHE" in err and "Traceback" not in err and "safetensors" not in err
    assert not (run / "eval").exists()  # nothing built, nothing evaluated
    # one's own task whose dataset is on the hub too: it failed after the model loaded, "Dataset … is not
    # cached in None" (trial RV78b 6); one of a local json file is not the hub's
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    task = "output_type: multiple_choice\ndoc_to_text: q\ndoc_to_target: 0\ndoc_to_choice: [a, b]\n"
    (tasks / "hub_mc.yaml").write_text(f"task: hub_mc\ndataset_path: gristmill-test/evalmc\n{task}")
    (tasks / "json_mc.yaml").write_text(f"task: json_mc\ndataset_path: json\n{task}")
    assert main(["eval", str(run), "--tasks", "hub_mc,json_mc", "--set", f'include_path=["{tasks}"]']) == 2
    err = capsys.readouterr().err
    assert "task hub_mc needs dataset gristmill-test/evalmc from the hub" in err and "json_mc" not in err, err
    assert not (run / "eval").exists()


def test_task_data_comes_from_held_out_documents_only(built_dataset, tmp_path):
    from validation.eval_data import EvalError, build_task_data, damaged_task_files

    with pytest.raises(EvalError, match=r"val_fraction = 0\).*train with data.val_fraction > 0"):
        build_task_data(built_dataset, 0.0, tmp_path / "none")
    out = build_task_data(built_dataset, 0.1, tmp_path / "data", max_docs=6)
    texts = [json.loads(line)["text"] for line in (out / "heldout_ppl.jsonl").open()]
    train = DocumentTable(built_dataset, split="train", val_fraction=0.1)
    val = DocumentTable(built_dataset, split="val", val_fraction=0.1)
    where = lambda t, n: set(t.split_rows(np.arange(n)).tolist())  # noqa: E731  manifest rows
    assert len(texts) == 6 and not where(val, 6) & where(train, train.documents)
    items = [json.loads(line) for line in (out / "heldout_cloze.jsonl").open()]
    assert len(items) >= 6 and {it["label"] for it in items} == {0, 1, 2, 3}
    flat = [" ".join(t.split()) for t in texts]
    for it in items:  # the true sentence follows the context in one held-out document; the others do not
        true = it["choices"][it["label"]]
        (src,) = [t for t in flat if it["context"] + " " + true in t]
        assert len(set(it["choices"])) == 4 and all(c not in src for c in it["choices"] if c != true)
    mtime = (out / "heldout_ppl.jsonl").stat().st_mtime_ns
    assert build_task_data(built_dataset, 0.1, out, max_docs=6) == out  # up to date: kept
    assert (out / "heldout_ppl.jsonl").stat().st_mtime_ns == mtime
    # an eval of one task keeps the other's file recorded: the run's in-training eval checks it (review
    # R13j: a `gristmill eval RUN --tasks heldout_ppl` dropped heldout_cloze for the rest of the run)
    assert build_task_data(built_dataset, 0.1, out, max_docs=6, tasks=["heldout_ppl"]) == out
    assert damaged_task_files(out, ["heldout_ppl", "heldout_cloze"]) == []
    assert (out / "heldout_ppl.jsonl").stat().st_mtime_ns == mtime
    meta = json.loads((out / "data.json").read_text())  # its "tasks" a hand-edited value: no crash (R13k)
    (out / "data.json").write_text(json.dumps({**meta, "tasks": "heldout_ppl"}))
    assert build_task_data(built_dataset, 0.1, out, max_docs=6, tasks=["heldout_ppl"]) == out


def test_a_hub_tag_whose_tasks_lie_in_several_families_keeps_them_all(tmp_path):
    """The task index restricted to the families that mention a name indexes each family apart, and
    lm-eval replaces a tag's entry from an earlier root by a later one's: math_word_problems was 8 of
    its 26 tasks, scored under its name, and its definition digest changed with the other names asked
    (review R23d 3). Such a tag takes the full index. Its shipped part is indexed once per process; an
    include_path is indexed afresh at each call, its task replacing a shipped one of the same name."""
    import lm_eval.tasks

    from validation.eval_data import full_task_manager, hub_task_manager

    index = hub_task_manager(["math_word_problems"]).task_index
    root = Path(lm_eval.tasks.__file__).parent
    families = {Path(index[t].yaml_path).relative_to(root).parts[0] for t in index["math_word_problems"].tags}
    assert len(index["math_word_problems"].tags) == 26 and len(families) > 1, families
    mine = tmp_path / "mine.yaml"
    task = "dataset_path: x\noutput_type: loglikelihood\ndoc_to_text: a\ndoc_to_target: b\n"
    mine.write_text(f"task: arc_easy\ntag: [mine, ai2_arc]\n{task}")
    tm = full_task_manager([str(tmp_path)])
    assert tm.task_index["arc_easy"].yaml_path == mine and tm.task_index["mine"].tags == {"arc_easy"}
    assert tm.task_index["ai2_arc"].tags == {"arc_easy"}, tm.task_index["ai2_arc"]  # lm-eval's own rule
    assert "arc_easy" in tm.all_subtasks and "mine" in tm.all_tags and "math_word_problems" in tm.all_tags
    mine.write_text(f"task: arc_mine\n{task}")  # the same process, the user's file edited
    tm = full_task_manager([str(tmp_path)])
    assert tm.task_index["arc_mine"].yaml_path == mine and "mine" not in tm.task_index
    assert tm.task_index["arc_easy"].yaml_path == root / "arc" / "arc_easy.yaml"
    assert tm.task_index["math_word_problems"].tags == index["math_word_problems"].tags
    # a task of one family takes its family alone: test_a_hub_task_s_definition_is_the_same_in_every_process


def test_task_data_is_built_for_the_tasks_asked_and_counted_by_its_lines(tmp_path):
    """A corpus without a sentence a cloze item is made of could not be scored for its perplexity
    (heldout_cloze was built whatever was asked); and a held-out text holding U+2028 counted as two
    documents in the eval's header (str.splitlines) (review R13i)."""
    from pipelines.synthetic_dataset import write_synthetic_dataset
    from tokenization.tokenizer_io import train_bpe
    from validation.eval_data import EvalError, build_task_data, task_items

    texts = [f"rivers run to the sea {i}\u2028and back again {i} with no sentence end" for i in range(60)]
    tok = train_bpe(texts, vocab_size=300, special_tokens=["<|endoftext|>"])
    (tmp_path / "ds").mkdir()
    tok.save(str(tmp_path / "ds" / "tokenizer.json"))
    write_synthetic_dataset(
        tmp_path / "ds", [np.array([*tok.encode(t).ids, 0]) for t in texts], vocab_size=300
    )
    out = build_task_data(tmp_path / "ds", 0.2, tmp_path / "ppl", tasks=["heldout_ppl"])
    assert not (out / "heldout_cloze.jsonl").exists()
    ppl = out / "heldout_ppl.jsonl"
    rows = [json.loads(line) for line in ppl.read_bytes().split(b"\n") if line]
    assert task_items(ppl) == len(rows) >= 4 and all("\u2028" in r["text"] for r in rows)
    assert len(ppl.read_text(encoding="utf-8").splitlines()) == 2 * len(rows)  # what the header counted
    with pytest.raises(EvalError, match="cloze items from only 0 of") as refused:
        build_task_data(tmp_path / "ds", 0.2, tmp_path / "both")
    # the way on for such a corpus, which raising the docs did not give (trial RV66c 1)
    assert str(refused.value).endswith(
        "score heldout_ppl alone (--tasks heldout_ppl; eval.tasks in a training recipe)"
    )


def _metaspace_dataset(ds: Path) -> list[str]:
    """A dataset at `ds` whose tokenizer (Llama-2's kind: Metaspace prepend_scheme "first", a Strip
    decoder) decodes every third document, which starts with two spaces, to text that does not encode
    back to its ids; returns the documents' texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pipelines.synthetic_dataset import write_synthetic_dataset
    from tokenization.separator import DocumentEncoder, SeparatorPolicy, vocab_size_of

    texts = [
        ("  " if i % 3 == 0 else "") + f"rivers run to the sea {i}. And back again {i}." for i in range(60)
    ]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    special = ["<|endoftext|>", "<unk>"]
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)
    )
    ds.mkdir()
    tok.save(str(ds / "tokenizer.json"))
    encoder = DocumentEncoder(tok, SeparatorPolicy("<|endoftext|>"))
    # its vocab_size the tokenizer's, as a build records it (the loader refuses one above it)
    write_synthetic_dataset(ds, [encoder.encode(t) for t in texts], vocab_size=vocab_size_of(tok))
    return texts


def test_a_step_scored_on_other_held_out_documents_is_scored_again_and_its_row_says_so(tmp_path, capsys):
    """Steps scored before the local tasks left out documents that do not encode back (every held-out
    document) counted as done after the folder was built again with fewer, and sat in eval.parquet
    beside steps scored on the fewer with the identical settings string, one curve, exit 0 (review
    R25i S1). The local tasks' scores now record which documents they scored (how many, how many left
    out, the sha256 of heldout_ppl's file); a step recorded without them is scored again where some are
    left out, and the data lies in a folder of its own, apart from the one a gristmill before the
    check builds with every document for the same settings (which the two rebuilt back and forth)."""
    import pyarrow.parquet as pq

    from pipelines.cli import main
    from validation.eval import HeldOut
    from validation.eval_data import DATA_META, task_data_folder, task_data_settings
    from validation.eval_results import write_step_json

    _metaspace_dataset(tmp_path / "ds")
    run = tmp_path / "run"
    _make_run(run, tmp_path / "ds", [5])
    quick = ["--tasks", "heldout_ppl", "--set", "docs=40", "bootstrap_iters=0", "device=cpu"]
    assert main(["eval", str(run), "--step", "5", *quick]) == 0
    results = eval_dir(run, 5) / "results.json"
    scored = json.loads(results.read_text())
    record = scored["gristmill_tasks"]["heldout_ppl"]["settings"]["heldout"]
    folder = next((run / "eval" / "data").iterdir())
    meta = json.loads((folder / DATA_META).read_text())
    assert meta["left_out"] > 0
    assert record["documents"] == {
        "scored": meta["documents"],
        "left_out": meta["left_out"],
        "sha256": meta["files"]["heldout_ppl.jsonl"],
    }
    # The folder is not the one an earlier gristmill names for these settings (every document).
    settings = task_data_settings(tmp_path / "ds", 0.1, 40)
    assert folder.name == task_data_folder(settings)
    assert folder.name != task_data_folder({k: v for k, v in settings.items() if k != "kept"})
    # Scores recorded before the documents were (an earlier gristmill's, on every held-out document).
    del record["documents"]
    results.unlink()
    write_step_json(run, 5, {k: v for k, v in scored.items() if k != "gristmill_results_sha256"})
    (run / "eval.parquet").unlink()
    capsys.readouterr()
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *quick]
    assert main(watch) == 0
    again = json.loads(results.read_text())["gristmill_tasks"]["heldout_ppl"]["settings"]["heldout"]
    assert again["documents"]["left_out"] == meta["left_out"]  # scored again, on the documents kept
    rows = pq.read_table(run / "eval.parquet").to_pylist()
    total = meta["documents"] + meta["left_out"]
    assert {r["settings"] for r in rows} and all(
        f"({meta['documents']} of {total} documents {meta['files']['heldout_ppl.jsonl'][:8]})"
        in r["settings"]
        for r in rows
    )
    # A record without documents is of the documents now where none is left out (every one scored),
    # and its row's settings say the same as such a record's (an upgraded run's panels were all
    # "other settings": review R25m 1)
    from training.contract.eval_table import settings_of

    def shown(documents: dict | None) -> str:
        heldout = {"source": "s", "fingerprint": "f", **({"documents": documents} if documents else {})}
        return settings_of({"gristmill_tasks": {"t": {"settings": {"heldout": heldout}}}}, "t")

    all_of_them = {"scored": 5, "left_out": 0, "sha256": "a" * 64}
    assert shown(None) == shown(all_of_them) == "heldout=s" != shown({**all_of_them, "left_out": 1})
    documents = tuple(sorted({"scored": 5, "left_out": 0, "sha256": "a"}.items()))
    heldout = HeldOut("s", "f", frozenset({"f"}), documents)
    assert heldout.scored({"source": "s", "fingerprint": "f"})
    assert not HeldOut("s", "f", frozenset({"f"}), (*documents[:1], ("left_out", 1), *documents[2:])).scored(
        {"source": "s", "fingerprint": "f"}
    )


def test_a_local_task_file_changed_after_its_plan_was_made_is_not_scored(eval_run, tmp_path):
    """A watch makes its plan once: a heldout_ppl.jsonl cut to 3 documents during it was scored, exit 0,
    and recorded as the documents built (review R25m 2). Each step checks the files first, as the
    in-training eval does, and refuses in one line naming the file and the fix."""
    from validation.eval import evaluate_step
    from validation.eval_data import EvalError

    run = _copy_run(eval_run[0], tmp_path / "run")
    cfg = EvalConfig(tasks=["heldout_ppl"], docs=CFG.docs, bootstrap_iters=0, device="cpu", limit=3)
    plan = TaskPlan(run, cfg)
    path = plan.data_dir / "heldout_ppl.jsonl"
    path.write_text("".join(path.read_text().splitlines(True)[:3]))
    with pytest.raises(EvalError) as e:
        evaluate_step(run, 5, cfg, plan)
    assert str(e.value).startswith(f"{path}: not as {plan.data_dir / 'data.json'} recorded"), str(e.value)
    assert not (eval_dir(run, 5) / "results.json").exists()


def test_held_out_documents_whose_text_does_not_encode_back_are_left_out_and_counted(tmp_path):
    """A Metaspace tokenizer with prepend_scheme "first" and a Strip decoder (Llama-2's and Mistral's
    tokenizer.json) decodes a document starting with two spaces to one space: lm-eval encoded that
    text again and scored other ids than the shard's, and bits_per_byte counted a byte less (review
    R25a 2). Such documents are left out, said in one line and counted in data.json."""
    import hashlib

    from validation.eval_data import build_task_data

    texts = _metaspace_dataset(tmp_path / "ds")
    val = DocumentTable(tmp_path / "ds", split="val", val_fraction=0.2)
    held = [texts[int(r)] for r in val.split_rows(np.arange(val.documents))]
    lost = sum(t.startswith("  ") for t in held)
    assert 0 < lost < len(held)

    lines: list[str] = []
    out = build_task_data(tmp_path / "ds", 0.2, tmp_path / "ppl", log=lines.append, tasks=["heldout_ppl"])
    rows = [json.loads(line)["text"] for line in (out / "heldout_ppl.jsonl").open()]
    assert rows == [t for t in held if not t.startswith("  ")]  # each scored on the shard's own ids
    meta = json.loads((out / "data.json").read_text())
    assert (meta["documents"], meta["left_out"]) == (len(held) - lost, lost)
    assert len(lines) == 1 and lines[0].startswith(f"note: {lost} of {len(held)} held-out documents left out")
    assert build_task_data(tmp_path / "ds", 0.2, out, log=lines.append, tasks=["heldout_ppl"]) == out
    assert len(lines) == 1  # kept as built: its data.json's counts decide nothing
    # A folder built before (every document, no count in data.json) is built again, once.
    old = {k: v for k, v in meta.items() if k not in ("documents", "left_out")}
    (out / "heldout_ppl.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in held))
    old["files"] = {"heldout_ppl.jsonl": hashlib.sha256((out / "heldout_ppl.jsonl").read_bytes()).hexdigest()}
    (out / "data.json").write_text(json.dumps(old))
    build_task_data(tmp_path / "ds", 0.2, out, log=lines.append, tasks=["heldout_ppl"])
    assert json.loads((out / "data.json").read_text())["left_out"] == lost and len(lines) == 2
    assert [json.loads(line)["text"] for line in (out / "heldout_ppl.jsonl").open()] == rows


def _copy_run(src: Path, dst: Path, export: bool = True) -> Path:
    """A run with `src`'s config.toml (same dataset) and, if `export`, a copy of its step-5 export."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.toml", dst / "config.toml")
    if export:
        shutil.copytree(export_dir(src, 5), export_dir(dst, 5))
    return dst


def _write_tasks(run_dir: Path, tag: str) -> None:
    """40 tasks' results, one write each (and eval.parquet's rebuild), into step 8 (every writer's) and
    a step of the writer's own."""
    from validation.eval_results import write_step_json

    for i in range(40):
        for step in (8, 100 + ord(tag)):
            write_step_json(run_dir, step, {"results": {f"{tag}{i}": {"acc,none": i / 40}}})


def test_two_writers_of_one_run_s_eval_results_lose_none(tmp_path):
    """The trainer's eval and `gristmill eval --watch` beside it merge into one step's results.json and
    rebuild eval.parquet: unlocked, each lost about half the other's tasks, exit 0."""
    import multiprocessing

    import pyarrow.parquet as pq

    from training.contract.eval_table import read_step_results

    writers = [
        multiprocessing.get_context("fork").Process(target=_write_tasks, args=(tmp_path, t)) for t in "ab"
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
        assert w.exitcode == 0
    every = {f"{t}{i}" for t in "ab" for i in range(40)}
    assert set(read_step_results(tmp_path, 8)["results"]) == every
    rows = pq.read_table(tmp_path / "eval.parquet").to_pylist()
    assert {(r["step"], r["task"]) for r in rows} == {
        (step, task) for task in every for step in (8, 100 + ord(task[0]))
    }


def test_an_audit_beside_an_eval_reads_between_its_writes(tmp_path):
    """An eval wrote a step's results.json under the eval lock and rebuilt eval.parquet under a second
    acquisition; an audit between the two refused the live run's table as stale (review R31b F1). A
    writer now does both in one acquisition; the audit holds no lock (one it held shared, stopped,
    stalled the trainer's eval: review RV32e F1) and reads again a disagreement a writer's hold makes.
    Here the writer takes the lock while the audit is inside its check, and rebuilds the table only
    after the audit's first read found step 6's results.json without its rows."""
    import shutil
    import threading
    import time

    from training.contract import eval_table
    from training.contract.eval_table import read_between_writes, stale_eval_table, write_eval_table
    from training.contract.file_lock import file_lock
    from validation.eval_results import write_step_json

    write_step_json(tmp_path, 4, {"results": {"a": {"acc,none": 0.5}}})  # results.json and the table
    assert stale_eval_table(tmp_path) is None
    inside, go, first, reads, answer = threading.Event(), threading.Event(), threading.Event(), [], []

    def audit_read() -> str | None:
        if not reads:  # the audit is inside its check: the writer comes now
            inside.set()
            assert go.wait(10)
        reads.append(stale_eval_table(tmp_path))
        first.set()
        return reads[-1]

    check = threading.Thread(target=lambda: answer.append(read_between_writes(tmp_path, audit_read)))
    check.start()
    assert inside.wait(10)
    # the writer's lock, not waited for (block=False: LockHeld where the audit held it shared)
    with file_lock(tmp_path / "eval" / ".lock", block=False):
        eval_dir(tmp_path, 6).mkdir()
        shutil.copy(eval_dir(tmp_path, 4) / "results.json", eval_dir(tmp_path, 6) / "results.json")
        go.set()
        assert first.wait(10)
        write_eval_table(tmp_path)
    check.join()
    assert "does not hold the scores" in reads[0] and answer == [None], (reads, answer)
    # a disagreement with no writer at work is the answer at once (/proc/locks lists no holder)
    shutil.rmtree(eval_dir(tmp_path, 6))
    began = time.monotonic()
    assert "step 6" in (read_between_writes(tmp_path, lambda: stale_eval_table(tmp_path)) or "")
    assert time.monotonic() - began < eval_table.READ_AGAIN_S / 2
    write_eval_table(tmp_path)
    # a run the reader cannot write to (another user's, a read-only copy) is read all the same: not
    # root, chmod; root (chmod stops nothing), a read-only bind mount in a private mount namespace
    read = (
        "import sys; from training.contract.eval_table import read_between_writes, stale_eval_table; "
        "print(read_between_writes(sys.argv[1], lambda: stale_eval_table(sys.argv[1])))"
    )
    cmd = [sys.executable, "-c", read, str(tmp_path)]
    if os.geteuid() != 0:
        (tmp_path / "eval" / ".lock").chmod(0o444)
        proc = subprocess.run(
            cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True
        )
    elif unshare_works():
        q = sh_quote(str(tmp_path))
        proc = python_in_namespace([f"mount --bind {q} {q}", f"mount -o remount,bind,ro {q}"], cmd)
    else:
        return  # root without mount namespaces: no directory it cannot write
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "None\n", "")


def test_results_keep_nan_and_inf_but_not_strings(tmp_path):
    """results.json round-trips NaN/inf (also numpy scalars), eval.parquet keeps them as NaN/inf,
    "N/A" stderrs and aliases stay out; nonfinite_metrics says which task has no finite metric."""
    import pyarrow.parquet as pq

    from training.contract.eval_table import read_step_results, write_eval_table
    from validation.eval_results import nonfinite_metrics, write_step_json

    results = {
        "results": {
            "heldout_ppl": {
                "alias": "heldout_ppl",
                "word_perplexity,none": np.float32("nan"),
                "word_perplexity_stderr,none": "N/A",
                "bits_per_byte,none": float("inf"),
                "bits_per_byte_stderr,none": float("nan"),
            },
            "heldout_cloze": {
                "acc,none": np.float64(0.25),
                "acc_stderr,none": 0.1,
                "acc_norm,none": float("nan"),
            },
        },
        "n-samples": {"heldout_ppl": {"effective": 5}, "heldout_cloze": {"effective": 8}},
    }
    write_step_json(tmp_path, 7, results)
    write_eval_table(tmp_path)
    back = read_step_results(tmp_path, 7)
    ppl = back["results"]["heldout_ppl"]
    assert math.isnan(ppl["word_perplexity,none"]) and ppl["bits_per_byte,none"] == math.inf
    table = pq.read_table(tmp_path / "eval.parquet").to_pylist()
    rows = {(r["task"], r["metric"]): (r["value"], r["stderr"]) for r in table}
    assert sorted(rows) == [
        ("heldout_cloze", "acc"),
        ("heldout_cloze", "acc_norm"),
        ("heldout_ppl", "bits_per_byte"),
        ("heldout_ppl", "word_perplexity"),
    ]
    nan = pytest.approx(math.nan, nan_ok=True)
    assert rows["heldout_ppl", "word_perplexity"] == (nan, None)  # "N/A" stderr: not a number
    assert rows["heldout_ppl", "bits_per_byte"] == (math.inf, nan)
    assert rows["heldout_cloze", "acc"] == (0.25, 0.1) and rows["heldout_cloze", "acc_norm"] == (nan, None)
    bad = nonfinite_metrics(7, back)
    assert {
        task: (sorted(r["metric"] for r in bad_rows), dead) for task, (bad_rows, dead) in bad.items()
    } == {
        "heldout_ppl": (["bits_per_byte", "word_perplexity"], True),
        "heldout_cloze": (["acc_norm"], False),
    }


def test_nan_metric_is_shown_warned_and_fails_the_eval(eval_run, tmp_path, capsys):
    """A model whose weights are finite but whose logits overflow (final norm scaled to 3e38): every
    perplexity is NaN. It stays in the table, results.json and eval.parquet, a warning names the task
    and metrics, eval.png still renders, and the eval exits 2 with one error line."""
    import pyarrow.parquet as pq

    from pipelines.cli import main

    src, models = eval_run
    run = _copy_run(src, tmp_path / "run", export=False)
    state = {k: v.clone() for k, v in models[5].state_dict().items()}
    state["norm.weight"].fill_(3e38)
    export_hf(state, models[5].cfg, read_dataset_info_path(src), export_dir(run, 5), meta={"step": 5})

    assert main(["eval", str(run), *QUICK, "plot=true"]) == 2  # the later setting wins
    out, err = capsys.readouterr()
    table = {tuple(line.split()[1:4]) for line in out.splitlines() if "heldout_ppl" in line}
    metrics = ("bits_per_byte", "byte_perplexity", "word_perplexity")
    assert table == {("heldout_ppl", m, "nan") for m in metrics}
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "heldout_ppl" in warnings[0] and "word_perplexity = nan" in warnings[0]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no metric of heldout_ppl is finite" in errors[0] and "Traceback" not in err
    res = json.loads((eval_dir(run, 5) / "results.json").read_text())
    assert math.isnan(res["results"]["heldout_ppl"]["word_perplexity,none"])
    rows = pq.read_table(run / "eval.parquet").to_pylist()
    assert len(rows) == 3 and all(math.isnan(r["value"]) for r in rows)
    assert (run / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the audit's JSON stays strict (jq cannot read NaN): the non-finite values are null there
    assert main(["data", "audit", str(run), "--sql", "SELECT value FROM eval", "--format", "json"]) == 0
    strict = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    assert strict == [{"value": None}] * 3


def test_damaged_or_nonfinite_export_is_refused_before_evaluation(eval_run, tmp_path, capsys):
    """Bytes overwritten inside model.safetensors (size unchanged), a truncated one, and an export
    whose checksums match but whose weights hold a NaN: each one error line, exit 2, no results."""
    from pipelines.cli import main

    src, models = eval_run
    overwritten = _copy_run(src, tmp_path / "overwritten")
    with open(export_dir(overwritten, 5) / "model.safetensors", "r+b") as f:
        f.seek(8192)
        f.write(b"\xff" * 4096)
    truncated = _copy_run(src, tmp_path / "truncated")
    weights = export_dir(truncated, 5) / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    nan = _copy_run(src, tmp_path / "nan", export=False)
    state = {k: v.clone() for k, v in models[5].state_dict().items()}
    state["layers.1.feed_forward.w2.weight"][3, 7] = math.nan
    export_hf(state, models[5].cfg, read_dataset_info_path(src), export_dir(nan, 5), meta={"step": 5})

    expected = {
        overwritten: "sha256",  # "…/model.safetensors: sha256 …, … when written"
        truncated: "bytes",  # "…/model.safetensors: N bytes, M when written"
        nan: "non-finite weights as loaded in float32: model.layers.1.mlp.down_proj.weight: 1 NaN and 0 inf",
    }
    for run, what in expected.items():
        assert main(["eval", str(run), "--step", "5", *QUICK]) == 2, run
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and what in errors[0] and "Traceback" not in err, err
        assert str(export_dir(run, 5)) in errors[0]
        if run != nan:
            assert f"{export_dir(run, 5) / 'model.safetensors'}: " in errors[0]
        else:  # its checkpoint is gone: never "delete the export" (export_fix; review RV32f A6)
            assert "keep the export meanwhile: its checkpoint is gone" in errors[0], errors[0]
        assert "delete" not in errors[0], errors[0]
        assert not (eval_dir(run, 5) / "results.json").exists() and not (run / "eval.parquet").exists()


def test_an_export_s_tokenizer_files_are_checked_under_the_transformers_that_scores_it(
    eval_run, tmp_path, capsys
):
    """Review RV29a F3: an export's tokenizer files were checked where it was written (under that
    box's transformers, or none without the eval extra); eval loaded them under its own, unchecked, and
    scored ids the model never trained on where that transformers reads a key otherwise. Here the
    export's tokenizer_config.json holds what a transformers reads as added tokens (its checksums
    recorded with it, as an export written so records them). Refused before the model loads, in one
    line that never advises deleting the export (its checkpoint is gone: review RV31L F4): an ordinary
    added token (matched inside every word that holds it, whatever one probe shows: RV31L F1), a
    special one over ordinary text (lm-eval drops it from generated answers: F2). Scored: a flag of a
    token special on both sides (eval takes neither out of a text: F3)."""
    import transformers

    from pipelines.cli import main
    from training.contract.integrity import file_records

    src, _ = eval_run

    def eval_with(name: str, added: dict) -> tuple[int, Path, Path]:
        run = _copy_run(src, tmp_path / name)
        export = export_dir(run, 5)
        config = export / "tokenizer_config.json"
        config.write_text(json.dumps(json.loads(config.read_text()) | {"added_tokens_decoder": added}))
        record = export / "gristmill_checksums.json"
        checksums = json.loads(record.read_text())
        checksums["files"].update(file_records(export, [config.name], "sha256"))
        record.write_text(json.dumps(checksums))
        return main(["eval", str(run), "--step", "5", *QUICK]), export, config

    wrote = json.loads((export_dir(src, 5) / "gristmill_export.json").read_text())["transformers"]
    assert wrote == transformers.__version__  # not "score it under" the very version that refuses it
    keep = "(its checkpoint is gone or damaged: its weights are only there)"
    for name, token, why in [
        ("hi", "hi", "gristmill's eval encodes every text holding it otherwise than the data"),
        ("quote", '"', "lm-eval drops it from the answers gristmill's eval generates"),
    ]:
        added = {"464" if token == "hi" else "3": {"content": token, "special": name == "quote"}}
        rc, export, config = eval_with(name, added)
        assert rc == 2, name
        line = one_error_line(capsys.readouterr().err)
        named = f"error: {export}: added_tokens_decoder of {config}: AutoTokenizer (transformers "
        assert line.startswith(named) and why in line, line
        assert f"; keep {export} {keep}; copy it with its tokenizer files written again (" in line, line
        assert "delete" not in line and not (eval_dir(export.parents[1], 5) / "results.json").exists()
    flag = {"0": {"content": "<|endoftext|>", "special": True, "lstrip": True}}  # the separator's
    rc, export, _ = eval_with("flag", flag)
    assert rc == 0, capsys.readouterr().err
    assert (eval_dir(export.parents[1], 5) / "results.json").is_file()
    # An export without tokenizer.json (nothing to check): the model's load fails, and the line's fix
    # is export_fix's, never "delete" (its checkpoint is gone: review RV32l F4), in one line.
    run = _copy_run(src, tmp_path / "bare")
    export = export_dir(run, 5)
    (export / "tokenizer.json").unlink()
    record = export / "gristmill_checksums.json"
    checksums = json.loads(record.read_text())
    del checksums["files"]["tokenizer.json"]
    record.write_text(json.dumps(checksums))
    capsys.readouterr()
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: cannot load export {export} (") and "delete" not in line, err
    assert "keep the export meanwhile: its checkpoint is gone or damaged" in line, line


def test_eval_judges_an_export_s_tokenizer_by_what_its_encoding_does(eval_run, tmp_path):
    """Review RV32l. F1: every difference but added tokens was judged by one probe text: a
    tokenizer.json labelled with a class transformers 5 rebuilds from its vocabulary (an older
    export's base class: GPT2Tokenizer over a cl100k-style pre-tokenizer, Qwen2Tokenizer, which adds
    NFC) passed, and eval scored other ids, exit 0. The loaded backend's pipeline is compared with
    the file's: refused, naming tokenizer_class, wherever eval's ids differ. F2: an export scoring the
    same ids was refused by a flag transformers reports ('<|begin_of_text|>' ordinary, its backend
    still special); a pad token past the vocabulary was refused for a false reason. F3/F5: the advice
    names no transformers the export was not checked under, never RUN/base's file where no export is
    written from it again, and a pasteable command. Review RV32f: A4, clean_up_tokenization_spaces
    (transformers' clean-up after tokenizer.json's decoder: 4.x for every model, 5 for all but BPE
    unless forced) changed eval's generated answers and passed; A2, a pad problem named
    added_tokens_decoder, whose removal was refused again; A5, an export whose checkpoint is gone had
    no fix; A3, a vocab giving one id to two tokens was said to build "another model"."""
    import shlex

    import transformers
    from tokenizers import Tokenizer

    from pipelines.cli import main
    from training.checkpoint.hf_export import (
        ExportError,
        check_export_tokenizer,
        check_run_tokenizer,
        rescoring_fix,
        run_model_config,
        verify_export,
    )
    from training.contract.integrity import file_records

    src, _ = eval_run
    cl100k = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    split = {"type": "Split", "pattern": {"Regex": cl100k}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    cl100k_pre = {"type": "Sequence", "pretokenizers": [split, byte_level]}

    def edit(path: Path, **keys) -> None:
        path.write_text(json.dumps(json.loads(path.read_text()) | keys))

    def check(
        name: str, config: dict, named: dict | None = None, **tokenizer
    ) -> tuple[str | None, Path, bool]:
        """(the refusal or None, the export, whether eval's ids of a few texts differ from the build's)."""
        export = export_dir(_copy_run(src, tmp_path / name), 5)
        edit(export / "tokenizer_config.json", **config)
        edit(export / "tokenizer.json", **tokenizer)
        tok = transformers.AutoTokenizer.from_pretrained(export)
        data = Tokenizer.from_file(str(export / "tokenizer.json"))
        data.encode_special_tokens = True  # the build's: a special token's text encoded as text
        texts = ["def f(x):\n    return x", "cafe\u0301 2024-12-01", "hi <|begin_of_text|> x"]
        differ = any(
            tok.encode(t, add_special_tokens=False, split_special_tokens=True)
            != data.encode(t, add_special_tokens=False).ids
            for t in texts
        )
        try:
            check_export_tokenizer(export, export, named, scoring=True)
        except ExportError as e:
            return str(e), export, differ
        return None, export, differ

    five = int(transformers.__version__.split(".")[0]) >= 5  # 4.x reads both classes from tokenizer.json
    keep = "(its checkpoint is gone or damaged: its weights are only there)"
    config = "tokenizer_config.json"
    for name, cls, tokenizer, part in [
        ("gpt2", "GPT2Tokenizer", {"pre_tokenizer": cl100k_pre}, "builds the pre_tokenizer ByteLevel where"),
        ("qwen2", "Qwen2Tokenizer", {}, "builds the normalizer NFC where tokenizer.json has none"),
    ]:
        line, export, differ = check(name, {"tokenizer_class": cls}, **tokenizer)
        assert differ == five and (line is not None) == differ, (name, line)
        if line is not None:
            assert line.startswith(f"{export}: tokenizer_class of {export / config}: AutoTokenizer"), line
            assert part in line and "\n" not in line, line
    line, _, differ = check("bot", {"added_tokens_decoder": {"1": {"content": "<|begin_of_text|>"}}})
    assert line is None and not differ, line
    # the pad token named by added_tokens_decoder too: pad_token named, whose removal passes (RV32f A2)
    pad = {"pad_token": "<pad>", "added_tokens_decoder": {"512": {"content": "<pad>", "special": True}}}
    line, export, _ = check("pad", pad)
    assert line is not None and "has pad_token '<pad>', id 512, past the model's vocabulary (512 ids)" in line
    assert line.startswith(f"{export}: pad_token of {export / config}: "), line
    # RV33c F6: '"' made special by two keys, each enough: both named, the one edit that passes
    quote = {"content": '"', "special": True}
    both = {"added_tokens_decoder": {"3": quote}, "additional_special_tokens": ['"']}
    line, export, _ = check("both", both)
    keys = "added_tokens_decoder and additional_special_tokens"
    assert line is not None and line.startswith(f"{export}: {keys} of {export / config}: "), line
    assert "makes '\"' (id 3) a special token, not one of tokenizer.json" in line, line
    with pytest.raises(ExportError) as refused:  # as a start or `gristmill export` checks it
        check_export_tokenizer(export, export, {config: export / config})
    assert str(refused.value).endswith(f"; leave {keys} out of {export / config}"), str(refused.value)
    (export / config).write_text(
        json.dumps({k: v for k, v in json.loads((export / config).read_text()).items() if k not in both})
    )
    check_export_tokenizer(export, export, None, scoring=True)  # the edit named, followed, passes
    # RV32f A4: refused wherever AutoTokenizer's decoding is not tokenizer.json's (the key set to false)
    force = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    for name, cleanup in [("cleanup", {}), ("forced", {force: True})]:
        line, export, differ = check(name, {"clean_up_tokenization_spaces": True} | cleanup)
        tok = transformers.AutoTokenizer.from_pretrained(export)
        data = Tokenizer.from_file(str(export / "tokenizer.json"))
        ids = data.encode("It 's 42 , isn't it ?", add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=True) != data.decode(ids, skip_special_tokens=True)
        assert not differ and decoded == (name == "forced" or not five) and (line is not None) == decoded, (
            name
        )
        if line is not None:
            assert line.startswith(f"{export}: clean_up_tokenization_spaces of {export / config}: "), line
            assert "decodes as" in line and line.endswith(rescoring_fix(export, transformers.__version__))
    # RV33c F3: an older export's base class and clean_up true, two causes: both set, the one edit (was
    # "by no one key", after a reload per key of both files)
    if five:
        two = {"tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": True, force: True}
        line, export, _ = check("two", two, pre_tokenizer=cl100k_pre)
        keys = "tokenizer_class and clean_up_tokenization_spaces"
        assert line is not None and line.startswith(f"{export}: {keys} of {export / config}: "), line
        with pytest.raises(ExportError) as refused:
            check_export_tokenizer(export, export, {config: export / config})
        fix = f'; set tokenizer_class to "PreTrainedTokenizerFast" and {keys.split()[-1]} to false in'
        assert str(refused.value).endswith(f"{fix} {export / config}"), str(refused.value)
        edit(export / config, **dict(zip(keys.split(" and "), ["PreTrainedTokenizerFast", False])))
        check_export_tokenizer(export, export, None, scoring=True)  # the edit named, followed, passes
    # RV32f A3: an id that names two tokens (encoding agrees; which token decodes is per load), refused
    # on every check, not only where two loads kept other tokens for it (RV33c F2: half the checks
    # passed); tokenizer.json's own fault, whatever reads it; RUN/base's edited where it holds the same
    # vocab, which a new export or the copy ships again (F5: the advice looped)
    model = json.loads((export_dir(src, 5) / "tokenizer.json").read_text())["model"]
    shared = model | {"vocab": model["vocab"] | {"zzz0": 300}}
    line, export, differ = check("shared", {}, model=shared)
    assert not differ and line is not None and "\n" not in line, line
    vocab_line = (
        f"{export}: model.vocab of {export / 'tokenizer.json'}: gives one id to several tokens (id 300: "
    )
    assert line.startswith(vocab_line) and "another model" not in line, line
    # RV34c: a run from scratch (an older one: no start refused it) ships its dataset's vocab in every
    # export: the advice to copy the export with its tokenizer files written again wrote the same file
    retrain = "; give each id of model.vocab one token in the tokenizer the run's dataset was built with"
    then = (", build the dataset again with it (its data was encoded with this vocab) and train again: no "
            "export of this run can be scored as its data was encoded")  # fmt: skip
    assert line.endswith(f"{retrain}{then}"), line
    base = export.parents[1] / "base"
    base.mkdir()
    shutil.copy(export / "tokenizer.json", base / "tokenizer.json")
    for _ in range(8):  # each a load of its own: 2^-8 that all eight kept one token for id 300
        with pytest.raises(ExportError) as refused:
            check_export_tokenizer(export, export, {"tokenizer.json": base / "tokenizer.json"}, scoring=True)
    # RV41a F1, F2: the same vocab in RUN/base: the data was encoded with it too (check_base_data), and an
    # export after editing RUN/base's copy alone scored other ids wherever the edit moved a token the
    # encoding makes (the advice was to edit it, then copy the export with its tokenizer files)
    said = str(refused.value)
    assert said.endswith(f"{retrain} (RUN/base's copy: {base / 'tokenizer.json'}){then}"), said
    assert "copy it" not in said and keep not in said, said
    # RUN/base's copy edited to one token an id meanwhile: not named as holding that vocab (RV41b F5)
    (base / "tokenizer.json").write_text(json.dumps({**json.loads((base / "tokenizer.json").read_text()),
                                                     "model": model}))  # fmt: skip
    with pytest.raises(ExportError) as refused:
        check_export_tokenizer(export, export, {"tokenizer.json": base / "tokenizer.json"}, scoring=True)
    assert str(refused.value).endswith(f"{retrain}{then}"), str(refused.value)
    shutil.copy(export / "tokenizer.json", base / "tokenizer.json")  # as the cases below expect it
    # RV34c G7: at a run's start from that base, the dataset was encoded with its vocab: rebuilt too (the
    # edited base alone was refused at the next start against the dataset)
    rebuild = "and build the dataset again with it (its data was encoded with this vocab)"
    fixed = f"give each id of model.vocab in {base / 'tokenizer.json'} one token, {rebuild}"
    (base / config).write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    new_run, dataset = tmp_path / "new-run", tmp_path / "dataset"
    for files in ("tokenizer files", "tokenizer.json alone"):  # RV34c G2: the latter was not checked
        with pytest.raises(ExportError) as refused:
            check_run_tokenizer(new_run, lambda: dataset, run_model_config(src), base)
        line = str(refused.value)
        assert line.startswith(f"{new_run}'s exports: model.vocab of {base / 'tokenizer.json'}: "), (
            files,
            line,
        )
        assert line.endswith(f"; {fixed}"), (files, line)
        (base / config).unlink(missing_ok=True)
    # RV34c G2: a run from scratch, whose exports ship the dataset's tokenizer.json: refused at its start
    # (not first by eval, after training, whose copy wrote the same file again)
    dataset.mkdir()
    shutil.copy(base / "tokenizer.json", dataset / "tokenizer.json")
    with pytest.raises(ExportError) as refused:
        check_run_tokenizer(new_run, lambda: dataset, run_model_config(src))
    line = str(refused.value)
    assert line.startswith(f"{new_run}'s exports: model.vocab of {dataset / 'tokenizer.json'}: gives"), line
    assert line.endswith(
        f"; give each id of model.vocab one token in the tokenizer {dataset} was built with, {rebuild}"
    ), line
    # an ordinary 'hi' (refused), as exports of three records name what they were written under; its
    # checkpoint gone, a copy from the export with its tokenizer files written again (RV32f A5: no fix,
    # and "no version is known" where 4.x reads a base's class right)
    hi = {"added_tokens_decoder": {"464": {"content": "hi", "special": False}}}
    for meta, words in [
        ({"transformers": None}, ""),
        ({"transformers": "0.0.1"}, "; or score it under transformers 0.0.1, which it was exported with"),
        ({}, ""),
    ]:
        run = _copy_run(src, tmp_path / f"meta-{len(meta) and meta['transformers']}")
        export = export_dir(run, 5)
        edit(export / config, **hi)
        record = {k: v for k, v in json.loads((export / "gristmill_export.json").read_text()).items()}
        record.pop("transformers")
        (export / "gristmill_export.json").write_text(json.dumps(record | meta))
        with pytest.raises(ExportError) as refused:
            check_export_tokenizer(export, export, None, scoring=True)
        copy = export.with_name(f"{export.name}.retokenized")
        command = shlex.join(
            ["gristmill", "export", str(run), "--step", "5", "--out", str(copy), "--dtype", "fp32"]
        )
        fix = (
            f"; keep {export} {keep}; copy it with its tokenizer files written again ({command}, which needs "
        )
        fix += f"the run's dataset at hand), then move {export} aside and {copy} into its place{words}"
        assert str(refused.value).endswith(fix) and "no version" not in str(refused.value), str(refused.value)
    # followed: the copy (checksums recorded as an export records them) takes the export's place, scored
    checksums = json.loads((export / "gristmill_checksums.json").read_text())
    checksums["files"].update(file_records(export, [config, "gristmill_export.json"], "sha256"))
    (export / "gristmill_checksums.json").write_text(json.dumps(checksums))
    assert main(shlex.split(command)[1:]) == 0
    export.rename(export.with_name("aside"))
    copy.rename(export)
    assert verify_export(export, 5) is None
    check_export_tokenizer(export, export, None, scoring=True)
    # a run from a base holding the same entry (RUN/base/): named only where a new export reads it, after
    # a checkpoint that verifies; the command quoted for a path with a space
    run = _copy_run(src, tmp_path / "a run")
    export = export_dir(run, 5)
    edit(export / config, **hi)
    base = run / "base"
    base.mkdir()
    shutil.copy(export / config, base / config)
    named = {config: base / config}
    with pytest.raises(ExportError) as refused:
        check_export_tokenizer(export, export, named, scoring=True)
    base_edit = f"; leave added_tokens_decoder out of {base / config}, then copy it with"
    assert f"{keep}{base_edit}" in str(refused.value), str(refused.value)  # the copy reads RUN/base/
    assert "which needs the run's dataset at hand)" in str(refused.value), str(refused.value)
    # a run from a base with no checkpoint left: the copy reads the base's shape from it (RV33c F7)
    gone = tmp_path / "a base moved away"
    toml = (run / "config.toml").read_text()
    (run / "config.toml").write_text(toml.replace("[model]\n", f"[model]\ninit_from = {str(gone)!r}\n", 1))
    with pytest.raises(ExportError) as refused:
        check_export_tokenizer(export, export, named, scoring=True)
    needs = "which needs the run's dataset and, with no checkpoint of the run left, its base "
    needs += f"(model.init_from = {str(gone)!r}) at hand)"
    assert needs in str(refused.value), str(refused.value)
    fake_checkpoint(run, 5)
    with pytest.raises(ExportError) as refused:
        check_export_tokenizer(export, export, named, scoring=True)
    again = shlex.join(["gristmill", "export", str(run), "--step", "5"])
    fix = f"; leave added_tokens_decoder out of {base / config}, then move {export} aside and export it again"
    assert str(refused.value).endswith(f"{fix} from its checkpoint ({again})"), str(refused.value)
    # RV34c G6: that checkpoint complete (recording the base's shape) but damaged, the only one: the
    # line's first step moves it aside, after which the copy reads the base (was: the dataset only)
    ckpt = run / "checkpoints" / "step-000005"
    record = json.loads((ckpt / "COMPLETE").read_text())
    (ckpt / "COMPLETE").write_text(json.dumps(record | {"model": {"n_layers": 2}}))
    (ckpt / "__0_0.distcp").write_bytes(b"y" * 10)
    with pytest.raises(ExportError) as refused:
        check_export_tokenizer(export, export, named, scoring=True)
    assert f"move the damaged {ckpt} aside, then copy it" in str(refused.value), str(refused.value)
    assert needs in str(refused.value), str(refused.value)
    # step 0, a base's export: written again from the base, never "its checkpoint is gone"
    assert rescoring_fix(export_dir(run, 0), transformers.__version__).startswith(
        f"move {export_dir(run, 0)} aside and export it again from the run's base ("
    )


def test_read_only_run_is_refused_in_one_line(eval_run, tmp_path):
    """A run directory eval cannot write to: one line naming it and the fix, exit 2, before any model
    loads. Not root: chmod. Root (chmod stops nothing): a read-only bind mount in a private mount
    namespace (unshare -rm)."""
    src, _ = eval_run
    run = _copy_run(src, tmp_path / "run")
    cmd = [sys.executable, "-m", "pipelines.cli", "eval", str(run), *QUICK]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if os.geteuid() != 0:
        run.chmod(0o555)
        try:
            proc = forked.run(cmd, env=env, cwd=ROOT, timeout=300)
        finally:
            run.chmod(0o755)
    elif unshare_works():  # in a mount namespace of its own (tests/helpers/mounts.py)
        ro = sh_quote(str(run))
        read_only = f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}"
        in_namespace = [sys.executable, "-m", "tests.helpers.mounts", read_only, "", *cmd[2:]]
        proc = forked.run(in_namespace, env=env, cwd=ROOT, timeout=300)
    else:
        pytest.skip(
            "running as root without mount namespaces (unshare -rm): no way to make the run read-only"
        )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr and "[eval]" not in proc.stderr, proc.stderr
    assert errors[0].startswith(f"error: cannot write in {run}: ") and f"make {run} writable" in errors[0]
    assert not (run / "eval").exists()


def test_eval_prints_a_few_lines_and_the_libraries_write_to_eval_log(eval_run, tmp_path, monkeypatch, capfd):
    """`gristmill eval` from outside any git checkout, with a context short enough that heldout_cloze
    inputs are cut: at the file-descriptor level (subprocesses included) a progress line per task,
    one truncation warning with the numbers counted here from the task data, and the table, bits
    per byte first. lm-eval's logs, the bars and git's complaint are in eval.log; -v shows them."""
    from transformers import AutoTokenizer

    from pipelines.cli import main
    from training.contract.eval_table import read_results
    from validation.eval_data import build_task_data, task_data_folder, task_data_settings
    from validation.eval_results import plot_panels

    src, _ = eval_run
    run = _copy_run(src, tmp_path / "run")
    folder = task_data_folder(task_data_settings(read_dataset_info_path(src), 0.1, CFG.docs))
    data = build_task_data(
        read_dataset_info_path(src), 0.1, run / "eval" / "data" / folder, CFG.docs
    )  # as eval
    tok = AutoTokenizer.from_pretrained(export_dir(run, 5))
    items = [json.loads(line) for line in (data / "heldout_cloze.jsonl").open()]
    # The model's input for a choice: [SEP] + context + " " + choice, less the predicted last token.
    enc = lambda text: tok.encode(text, add_special_tokens=False, split_special_tokens=True, verbose=False)  # noqa: E731
    lengths = [[len(enc(f"{d['context']} {c}")) for c in d["choices"]] for d in items]
    short = sorted(max(ls) for ls in lengths)[len(lengths) // 2]  # about half the documents cut
    cut = [[n for n in ls if n > short] for ls in lengths]
    texts = [json.loads(line)["text"] for line in (data / "heldout_ppl.jsonl").open()]
    assert max(len(enc(t)) for t in texts) > tok.model_max_length  # transformers would warn about it
    monkeypatch.chdir(tmp_path)
    git = (
        subprocess.run(["git", "describe", "--always"], capture_output=True, text=True)
        if shutil.which("git")
        else None
    )
    args = ["--set", f"docs={CFG.docs}", "bootstrap_iters=0", "device=cpu", f"max_length={short}"]

    assert main(["eval", str(run), *args]) == 0
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert len(lines) <= 15, out + err
    for noise in ("fatal:", "Token indices", "it/s", "Truncating", "lm_eval", "Generating"):
        assert noise not in out + err, noise
    assert [line.split(",")[0] for line in err.splitlines() if line.startswith("[eval] step 5 heldout")] == [
        "[eval] step 5 heldout_ppl: 5 docs",
        f"[eval] step 5 heldout_cloze: {len(items)} docs",
    ]
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning.startswith(
        f"warning: step 5 heldout_cloze: {sum(map(bool, cut))} of {len(items)} documents "
        f"({sum(map(len, cut))} of {sum(map(len, lengths))} requests) are longer than max_length "
        f"{short} tokens (longest {max(map(max, lengths))}) and were cut from the left"
    ), warning
    assert 0 < sum(map(bool, cut)) < len(items)
    context = json.loads((export_dir(run, 5) / "config.json").read_text())["max_position_embeddings"]
    assert short < context and warning.endswith(
        f"(--set max_length=N, up to the model's max_seq_len {context}, evaluates more)"
    ), warning
    table = [line.split() for line in out.splitlines() if line.startswith("   5 ")]
    assert [row[2] for row in table] == [
        "bits_per_byte",
        "byte_perplexity",
        "word_perplexity",
        "acc",
        "acc_norm",
    ]

    log = (eval_dir(run, 5) / "eval.log").read_text()
    assert "[lm_eval.evaluator] Running loglikelihood requests" in log and "Truncating" in log
    assert "Running loglikelihood requests: 100%" in log and "Token indices" not in log
    if git is not None and git.returncode != 0:  # lm-eval's `git describe`, a subprocess: fd 2
        assert git.stderr.strip() in log
    # eval.png with one step: the chance level of the 4-choice cloze, counted from its requests
    panels = {(p.task, p.metric): p for p in plot_panels(*_plot_inputs(run))}
    assert panels["heldout_cloze", "acc"].steps == [5] and panels["heldout_cloze", "acc"].chance == 0.25
    assert panels["heldout_ppl", "bits_per_byte"].chance is None
    assert (run / "eval.png").is_file()
    assert read_results(run)[5]["gristmill_tasks"]["heldout_cloze"]["cut_docs"]

    assert main(["eval", str(run), "--tasks", "heldout_cloze", "-v", *args]) == 0
    out, err = capfd.readouterr()
    assert "Truncating" in err and "it/s" in err and "[lm_eval.evaluator]" in err
    assert sum(line.startswith("warning:") for line in err.splitlines()) == 1
    assert (eval_dir(run, 5) / "eval.log").read_text().count("[lm_eval.evaluator] Running") > log.count(
        "[lm_eval.evaluator] Running"
    )  # -v appends the log records all the same


def _plot_inputs(run: Path) -> tuple[list[dict], dict]:
    import pyarrow.parquet as pq

    from training.contract.eval_table import read_results

    return pq.read_table(run / "eval.parquet").to_pylist(), read_results(run)


def test_plot_panels_carry_stderr_chance_and_the_table_order():
    """What eval.png draws: finite values with their stderrs, NaN left out and counted, the chance
    level on accuracies of multiple-choice tasks (from the requests scored, else a fixed choice
    list), none on perplexities; panels in the table's order, bits per byte first."""
    from validation.eval_results import plot_panels

    def row(step, task, metric, value, stderr=None, filt="none"):
        return {
            "step": step,
            "task": task,
            "metric": metric,
            "filter": filt,
            "value": value,
            "stderr": stderr,
        }

    rows = [
        row(10, "mc", "acc", 0.4, 0.05),
        row(10, "mc", "acc_norm", 0.3, 0.04),
        row(10, "ppl", "word_perplexity", 2.2e9),
        row(5, "ppl", "bits_per_byte", 2.5, float("nan")),
        row(10, "ppl", "bits_per_byte", float("nan")),
        row(10, "boolq", "acc", 0.6, 0.1),
    ]
    results = {
        10: {
            "configs": {
                "mc": {"output_type": "multiple_choice", "doc_to_choice": "{{choices}}"},
                "boolq": {"output_type": "multiple_choice", "doc_to_choice": ["no", "yes"]},
                "ppl": {"output_type": "loglikelihood_rolling"},
            },
            "gristmill_tasks": {"mc": {"chance": 0.3}},
        }
    }
    panels = plot_panels(rows, results)
    assert [(p.task, p.metric) for p in panels] == [
        ("ppl", "bits_per_byte"),
        ("ppl", "word_perplexity"),
        ("boolq", "acc"),
        ("mc", "acc"),
        ("mc", "acc_norm"),
    ]
    bpb, wppl, boolq, acc, acc_norm = panels
    assert (bpb.steps, bpb.values, bpb.stderrs, bpb.nonfinite, bpb.chance) == ([5], [2.5], [None], 1, None)
    assert (wppl.values, wppl.chance) == ([2.2e9], None)
    assert (boolq.chance, acc.chance, acc_norm.chance) == (0.5, 0.3, 0.3)
    assert (acc.steps, acc.values, acc.stderrs) == ([10], [0.4], [0.05])


def test_perplexity_panels_label_their_log_axis_in_plain_numbers():
    """A perplexity's log axis keeps matplotlib's choice of which ticks to label (within a decade:
    the minor ones too) but writes them as plain numbers, not mathtext's "2.1×10¹"."""
    from training.plotting import agg_pyplot
    from validation.eval_results import eval_figure

    def row(step, metric, value):
        return {"step": step, "task": "ppl", "metric": metric, "filter": "none", "value": value,
                "stderr": None}  # fmt: skip

    plt = agg_pyplot()
    rows = [row(4, "byte_perplexity", 21.6), row(8, "byte_perplexity", 18.9)]
    rows += [row(4, "word_perplexity", 3e4), row(8, "word_perplexity", 25.0)]
    fig = eval_figure(plt, rows, {})
    fig.canvas.draw()
    narrow, wide = (ax for ax in fig.axes if ax.get_visible() and ax.get_title())
    assert narrow.get_yscale() == wide.get_yscale() == "log"
    labels = {
        name: {t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)} - {""}
        for name, ax in (("narrow", narrow), ("wide", wide))
    }
    plt.close(fig)
    assert {"19", "20", "21"} <= labels["narrow"]  # under a decade: minor ticks labelled
    assert {"100", "1000", "10000"} <= labels["wide"] and "200" not in labels["wide"]  # decades only
    assert not any("$" in text or "×" in text for texts in labels.values() for text in texts), labels


def test_an_answer_longer_than_the_context_is_one_line(eval_run, tmp_path, capsys):
    """lm-eval itself stops on a bare `assert len(continuation_enc) <= self.max_length`."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    args = ["--tasks", "heldout_cloze", "--set", "docs=5", "bootstrap_iters=0", "device=cpu", "max_length=4"]
    assert main(["eval", str(run), *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "task heldout_cloze document " in err[0]
    assert "does not fit max_length 4; evaluate with a longer context (--set max_length=N" in err[0]
    # at the model's whole context, no longer one is advised: it was, and then refused (review RV52a F3)
    tasks = _own_task(tmp_path / "tasks")
    long = {"context": "Item reads as", "choices": ["one", " ".join(["word"] * (SEQ_LEN + 10))], "label": 0}
    (tasks / "own_mc-test.jsonl").write_text(json.dumps(long) + "\n")
    assert main(["eval", str(run), *_own_args(tasks)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert (
        len(err) == 1
        and f"does not fit max_length {SEQ_LEN}; max_length is the model's whole context: no "
        "longer one fits it; leave the task out"
        in err[0]
    ), err


def test_damaged_task_data_is_rebuilt_with_one_line_naming_the_file(eval_run, tmp_path, capsys):
    """RUN/eval/data/<task>.jsonl truncated or deleted after it was built: `gristmill eval` says so in
    one line naming the file and rebuilds it from the held-out documents (the same items), instead
    of scoring the damaged file or failing in lm-eval's tracebacks."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    both = [*QUICK[2:], "--tasks", "heldout_ppl,heldout_cloze"]  # each task's file is built when asked
    assert main(["eval", str(run), "--step", "5", *both]) == 0
    data = eval_data(run)
    built = {p.name: p.read_bytes() for p in data.glob("*.jsonl")}
    capsys.readouterr()
    (data / "heldout_ppl.jsonl").write_bytes(built["heldout_ppl.jsonl"][:50])  # cut mid-line
    (data / "heldout_cloze.jsonl").unlink()
    assert main(["eval", str(run), "--step", "5", *both]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "heldout_" in line and ".jsonl" in line]
    assert len(lines) == 1, err
    assert str(data / "heldout_ppl.jsonl") in lines[0] and str(data / "heldout_cloze.jsonl") in lines[0]
    assert "rebuilt" in lines[0] and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in data.glob("*.jsonl")} == built
    # its record damaged: rebuilt without a word (trial RV57b F5)
    (data / "data.json").write_text('{"version": 3, "files": ')
    assert main(["eval", str(run), "--step", "5", *both]) == 0
    err = capsys.readouterr().err
    note = (
        f"note: {data}/data.json is damaged (not the record its build wrote); rebuilt from the run's held-out"
    )
    assert note in err, err
    assert {p.name: p.read_bytes() for p in data.glob("*.jsonl")} == built


def test_held_out_documents_of_another_dataset_than_the_run_trained_on_are_refused(
    eval_run, tmp_path, capsys
):
    """RUN/config.toml names the dataset as given, often relative to where the run started: an eval
    from elsewhere scored whatever dataset that path led to there (other documents, other scores,
    results.json none the wiser). The run's data_plan.json fingerprint decides, as for inspect."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    # the run's record: it trained on another dataset than the one its config's path leads to now
    (run / "data_plan.json").write_text(json.dumps({"sources": [{"name": "data", "fingerprint": "f" * 64}]}))
    capsys.readouterr()
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not the dataset this run trained on (fingerprint " in err and "ffffffffffff… in " in err, err
    assert not (run / "eval" / "step-000005" / "results.json").exists()


def test_held_out_documents_at_another_val_fraction_than_the_run_held_out_are_refused(
    eval_run, built_dataset, tmp_path, capsys
):
    """An edited val_fraction in RUN/config.toml (by hand, or one a refused resume left) scored
    documents the run trained on as held-out, exit 0."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    fingerprint = read_dataset_info(built_dataset)["fingerprint"]
    plan = {"sources": [{"name": "data", "fingerprint": fingerprint, "val_fraction": 0.05}]}
    (run / "data_plan.json").write_text(json.dumps(plan))
    capsys.readouterr()
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{run / 'config.toml'} gives val_fraction 0.1, but the run held out 0.05" in err, err
    assert not (run / "eval" / "step-000005" / "results.json").exists()
    plan["sources"][0]["name"] = "web"  # a source renamed in config.toml since: not the run's
    (run / "data_plan.json").write_text(json.dumps(plan))
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 2
    assert "source 'data' is not one this run trained on (" in capsys.readouterr().err
    plan["sources"][0].update(name="data", val_fraction=0.1)  # as the config says: scored
    (run / "data_plan.json").write_text(json.dumps(plan))
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0


@pytest.mark.parametrize(
    "sets, says",
    [
        (["limit=-1"], "limit = -1 must be ≥ 0"),  # a traceback from lm-eval, after the model loaded
        (["batch_size=0"], "batch_size = 0 must be ≥ 1"),
        (["max_length=-5"], "max_length = -5 must be ≥ 0"),
        (["max_length=100000"], "max_length = 100000 is longer than the model's context, 256 tokens"),
        (["num_fewshot=-1"], "num_fewshot = -1 must be ≥ 0"),  # accepted silently
        (["docs=0"], "docs = 0 must be ≥ 1"),
        # numpy's ValueError traceback, after the model loaded (trial RV72c T1)
        (["seed=-1"], "seed = -1 must be between 0 and 4294967295 (lm-eval seeds numpy with it)"),
        (["seed=4294967296"], "seed = 4294967296 must be between 0 and 4294967295"),
        (['dtype="fp8"'], "dtype = 'fp8' is not allowed"),  # "delete the export and re-export it"
        (['device="gpu"'], 'device = "gpu" is not a device'),
        # looked at only for a task outside the project's own: accepted without a word (review R21b)
        (['include_path=["nowhere"]'], "include_path nowhere is not a directory (of lm-eval task YAML"),
        (["--tasks", ""], "no tasks given; e.g. --tasks heldout_ppl,heldout_cloze"),  # the recipe's ran
        # -1 stopped after the first look, exit 0; without --watch both were ignored (review R22a A6)
        (
            ["--watch", "--idle-exit", "-1"],
            "--idle-exit -1: seconds with nothing new before the watch stops",
        ),
        # as typed, not 0.0
        (["--watch", "--poll", "0"], "--poll 0: seconds between looks at the run; give a number > 0"),
        (["--poll", "5", "--idle-exit", "9"], "--poll and --idle-exit pace --watch, which this eval is not"),
        (["--idle-exit", "5"], "error: --idle-exit paces --watch, which this eval is not"),  # trial RV75b 2
    ],
)
def test_eval_values_that_cannot_run_are_one_line_before_loading(eval_run, tmp_path, capsys, sets, says):
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    capsys.readouterr()
    options = sets if sets[0].startswith("--") else ["--set", *sets]
    step = [] if "--watch" in options else ["--step", "5"]
    assert main(["eval", str(run), *step, *options]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and err.startswith("error: ") and "\n" not in err, err


def test_mixture_eval_names_the_source_scored_and_its_context_is_the_models(eval_run, tmp_path, capsys):
    """A mixture run: the local tasks are built from one source's held-out documents, and every
    place the scores go says which (the `[eval]` line, results.json); the context defaults to the
    model's max_seq_len (tiny: 256), not the seq_len a phase trained on (here 64 after 128)."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    dataset = read_dataset_info_path(eval_run[0])
    (run / "config.toml").write_text(
        "[model]\npreset = 'tiny'\n"
        f"[[data.sources]]\nname = 'first'\ndataset = '{dataset}'\nval_fraction = 0.1\n"
        f"[[data.sources]]\nname = 'second'\ndataset = '{dataset}'\nval_fraction = 0.1\n"
        "[[phase]]\nsteps = 3\nseq_len = 128\nmix = { first = 0.5, second = 0.5 }\n"
        "[[phase]]\nsteps = 2\nseq_len = 64\nmix = { first = 0.5, second = 0.5 }\n"
        "[eval]\nsource = 'second'\n"  # both hold documents out: the run's eval.source chooses (issue 47)
    )
    assert main(["eval", str(run), "--step", "5", *QUICK, "--tasks", "heldout_cloze"]) == 0
    err = capsys.readouterr().err
    (head,) = [line for line in err.splitlines() if line.startswith("[eval] step 5: heldout_cloze")]
    documents = len((eval_data(run) / "heldout_ppl.jsonl").read_text().splitlines())
    assert f"({documents} held-out documents of source second ({dataset}))" in head, head
    res = json.loads((eval_dir(run, 5) / "results.json").read_text())
    assert res["gristmill"]["heldout"] == {"source": "second", "dataset": str(dataset)}
    assert res["gristmill_tasks"]["heldout_cloze"]["max_length"] == 256
    assert main(["eval", str(run), "--step", "5", "--tasks", "demo_ppl"]) == 2  # the old name: renamed
    assert "task demo_ppl is now called heldout_ppl" in capsys.readouterr().err


def test_eval_source_must_name_a_source_with_held_out_documents(capsys):
    """eval.source (issue 47): refused before any work unless it names a source that holds some out."""
    from pipelines.cli import main

    tiny = str(Path(__file__).resolve().parents[2] / "configs/train/tiny.toml")
    assert main(["train", "--config", tiny, "--plan", "--set", "eval.source=nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: eval.source = 'nope': not a source with held-out documents; the sources with some are data "
        "(--set eval.source=nope)"
    ), err


def test_an_eval_past_the_seq_len_a_step_trained_at_says_once_that_it_scores_untrained_positions(
    eval_run, tmp_path, capsys
):
    """max_length defaults to the model's max_seq_len: for weights that trained shorter (the tiny
    recipe, seq 64 of 256; or a step before a long-context phase), the perplexities mixed in
    positions they never trained at (10% worse bits_per_byte, measured by a review), and nothing
    said so. The eval says it once, naming the setting; at the trained seq_len it says nothing."""
    from pipelines.cli import main
    from validation.eval import TaskPlan

    src, _ = eval_run
    run = _copy_run(src, tmp_path / "run")
    phases = """
[[phase]]
name = "short"
steps = 10
seq_len = 64

[[phase]]
name = "middle"
steps = 10
seq_len = 128

[[phase]]
name = "long"
steps = 10
seq_len = 256
"""
    text = (run / "config.toml").read_text().replace(f"seq_len = {SEQ_LEN}", "seq_len = 64")
    cfg = text.replace("phase = []\n", "") + phases  # the saved config lists no phases
    (run / "config.toml").write_text(cfg)
    plan = TaskPlan(run, EvalConfig(tasks=["heldout_ppl"], docs=5))
    assert plan.length_note(64, 5) is None and plan.length_note(256, 21) is None  # trained at both
    assert plan.length_note(SEQ_LEN, 15) == (  # steps scored in any order: each phase's length once
        f"note: max_length {SEQ_LEN} scores positions 128–{SEQ_LEN - 1}, which step 15's weights never "
        "trained at (the longest seq_len up to it is 128); set max_length = 128 to score only trained "
        "lengths"
    )
    note = plan.length_note(SEQ_LEN, 5, "eval.max_length")
    assert note == (
        f"note: max_length {SEQ_LEN} scores positions 64–{SEQ_LEN - 1}, which step 5's weights never "
        "trained at (the longest seq_len up to it is 64); set eval.max_length = 64 to score only trained "
        "lengths"
    )
    assert plan.length_note(SEQ_LEN, 6) is None and plan.length_note(SEQ_LEN, 16) is None  # once each
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    err = capsys.readouterr().err
    assert err.count("never trained at") == 1 and "set max_length = 64" in err, err


def test_the_local_tasks_of_a_dataset_without_a_tokenizer_are_one_line(tmp_path):
    """A dataset that records no tokenizer (tokenizer_sha256 "none": written from ids alone) cannot be
    decoded back to the local tasks' text: `gristmill eval` of a run trained on one ended in a
    traceback from tokenizers (review R22a B1)."""
    import numpy as np

    from pipelines.synthetic_dataset import write_synthetic_dataset
    from validation.eval_data import EvalError, heldout_texts

    rng = np.random.default_rng(0)
    docs = [np.r_[rng.integers(1, 100, 20), 0] for _ in range(50)]
    info = write_synthetic_dataset(tmp_path / "ds", docs, vocab_size=128, target_bytes=1 << 20)
    assert info["tokenizer_sha256"] == "none"
    with pytest.raises(EvalError) as refused:
        heldout_texts(tmp_path / "ds", 0.1, 5)
    assert str(refused.value).startswith(f'{tmp_path / "ds"} records no tokenizer (tokenizer_sha256 "none")')


def test_the_local_tasks_of_a_dataset_whose_vocab_shares_an_id_say_to_rebuild_and_retrain(
    built_dataset, tmp_path
):
    """A dataset built before the build refused a vocab giving one id to two tokens (its encoder's copy
    loaded about half the time): the local tasks' encoder refused it saying to edit its tokenizer.json,
    which the dataset's record and the run's data were made with (review RV41b F3). One line with
    eval's advice for such a vocab: the tokenizer fixed, the dataset built again, the run trained again."""
    from training.contract.dataset_format import file_sha256, fingerprint
    from validation.eval_data import EvalError, heldout_texts

    ds = tmp_path / "ds"
    shutil.copytree(built_dataset, ds)
    spec = json.loads((ds / "tokenizer.json").read_text())
    token = next(t for t in spec["model"]["vocab"] if len(t) > 2)
    spec["model"]["vocab"]["zzz0"] = spec["model"]["vocab"][token]
    (ds / "tokenizer.json").write_text(json.dumps(spec))
    info = json.loads((ds / "dataset.json").read_text())
    info["tokenizer_sha256"] = file_sha256(ds / "tokenizer.json")  # as a build records it
    info["fingerprint"] = fingerprint(info)
    (ds / "dataset.json").write_text(json.dumps(info))
    with pytest.raises(EvalError) as refused:
        heldout_texts(ds, 0.1, 5)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        f"{ds / 'tokenizer.json'}: its model.vocab gives one id to "
    ), line
    assert "build the dataset again with it" in line and "and train again" in line, line


def _own_task(folder: Path, name: str = "own_mc", extra: str = "") -> Path:
    """Task `name` of one's own in include_path `folder`: two-choice items from JSON lines files (a
    train split for few-shot examples, a test split scored), `extra` appended to its YAML."""
    folder.mkdir(parents=True, exist_ok=True)
    items = [
        {"context": f"Item {i} reads as the word", "choices": ["one", "two"], "label": i % 2}
        for i in range(6)
    ]
    files = {split: folder / f"{name}-{split}.jsonl" for split in ("train", "test")}
    for path in files.values():
        path.write_text("".join(json.dumps(r) + "\n" for r in items))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        + "".join(f"    {split}: {path}\n" for split, path in files.items())
        + "test_split: test\nfewshot_split: train\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        f"metadata:\n  version: 1.0\n{extra}"
    )
    return folder


def _own_mc_scored(results: Path, setting: str) -> tuple[float, int, str | None]:
    """own_mc's accuracy, documents scored and recorded `setting` in a step's results.json."""
    task = json.loads(results.read_text())
    return (task["results"]["own_mc"]["acc,none"], task["n-samples"]["own_mc"]["effective"],
            task["gristmill_tasks"]["own_mc"]["settings"].get(setting))  # fmt: skip


def _own_sets(tasks: Path) -> list[str]:
    """The --set values the tests of one's own tasks in include_path `tasks` score with."""
    return ["bootstrap_iters=0", "device=cpu", f'include_path=["{tasks}"]', "plot=false"]


def _own_args(tasks: Path, name: str = "own_mc") -> list[str]:
    return ["--tasks", name, "--set", *_own_sets(tasks)]


def test_a_member_of_two_groups_says_the_settings_that_scored_it(eval_run, tmp_path):
    """own_mc in groups g_one and g_two, scored by g_one (limit 2), g_two (limit 6), then g_one again
    (limit 3): its rows named g_two's settings (the last group listing it), though g_one's scored them
    (review R25f 1). Each member records the settings of the eval that scored it."""
    import pyarrow.parquet as pq

    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    for group in ("g_one", "g_two"):
        (tasks / f"{group}.yaml").write_text(
            f"group: {group}\ntask:\n  - own_mc\naggregate_metric_list:\n  - metric: acc\n"
            "    weight_by_size: true\n"
        )
    for group, limit in (("g_one", 2), ("g_two", 6), ("g_one", 3)):
        assert main(["eval", str(run), "--step", "5", *_own_args(tasks, group), f"limit={limit}"]) == 0
    rows = {r["task"]: r for r in pq.read_table(run / "eval.parquet").to_pylist()}
    assert rows["own_mc"]["samples"] == 3 and "limit=3," in rows["own_mc"]["settings"], rows["own_mc"]
    assert "limit=6," in rows["g_two"]["settings"]


def test_a_group_s_member_with_overrides_never_takes_the_place_of_the_task_s_own_scores(
    eval_run, tmp_path, capfd
):
    """own_mc scored, then a group whose member is `- task: own_mc` with another doc_to_text: the
    override's scores were recorded as own_mc, replacing the task's own in results.json and eval.parquet,
    exit 0, no note; `--tasks own_mc,ovr` gave the override's number under own_mc's name; and a group
    without overrides recorded own_mc under the group's definition, so a later watch of own_mc said
    "scored again under other settings" of a task nobody edited (review R30a F2). The override's
    scores are `ovr::own_mc`'s (lm-eval's name of a group's task); a member scored as it is records
    its own definition."""
    import pyarrow.parquet as pq

    from pipelines.cli import main
    from validation.eval_data import hub_task_manager, reconfigured_members

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    (tasks / "ovr.yaml").write_text(
        'group: ovr\ntask:\n  - task: own_mc\n    doc_to_text: "zzz zzz {{context}}"\n'
        "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
    )
    (tasks / "plain.yaml").write_text(
        "group: plain\ntask:\n  - own_mc\naggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
    )
    results = eval_dir(run, 5) / "results.json"

    def recorded() -> tuple[dict, dict]:
        rows = {r["task"]: r for r in pq.read_table(run / "eval.parquet").to_pylist() if r["metric"] == "acc"}
        return json.loads(results.read_text()), rows

    assert main(["eval", str(run), "--step", "5", *_own_args(tasks)]) == 0
    own, rows = recorded()
    alone = rows["own_mc"]
    for names in ("ovr", "own_mc,ovr"):
        capfd.readouterr()
        assert main(["eval", str(run), "--step", "5", *_own_args(tasks, names)]) == 0
        assert "scored again" not in capfd.readouterr().out
        got, rows = recorded()
        assert rows["own_mc"] == alone, names  # the task's own scores, as scored alone
        assert got["configs"]["own_mc"]["doc_to_text"] == "{{context}}"
        assert got["configs"]["ovr::own_mc"]["doc_to_text"] == "zzz zzz {{context}}"
        assert got["group_subtasks"]["ovr"] == ["ovr::own_mc"]
        assert rows["ovr::own_mc"]["settings"] == rows["ovr"]["settings"] != alone["settings"]
    # a group that scores own_mc as it is: own_mc's own definition, done for a watch of own_mc alone
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks, "plain")]) == 0
    assert recorded()[1]["own_mc"]["settings"] == alone["settings"]
    capfd.readouterr()
    assert (
        main(["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *_own_args(tasks)]) == 0
    )
    out, err = capfd.readouterr()
    assert "scored again" not in out and "[eval] step 5 own_mc" not in err, (out, err)
    # a group's own key reaches own_mc, which lm-eval scores under its plain name: recorded under the
    # group's settings, so a watch of own_mc alone scores it again (RV33f F3: its own definition and
    # documents were recorded with the variant's scores, and the watch counted them done)
    (tasks / "lvl.yaml").write_text(
        'group: lvl\ndoc_to_text: "zzz zzz {{context}}"\ntask:\n  - own_mc\n'
        "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
    )
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks, "lvl")]) == 0
    rows = recorded()[1]
    assert rows["own_mc"]["settings"] == rows["lvl"]["settings"] != alone["settings"]
    capfd.readouterr()
    assert (
        main(["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *_own_args(tasks)]) == 0
    )
    assert "[eval] step 5 own_mc" in capfd.readouterr().err
    assert recorded()[1]["own_mc"]["settings"] == alone["settings"]
    # a group under a group that changes it by its keys (group-wide, or on a `- group:` item): its entry
    # holds the variant's scores too (RV34a G5: recorded under its own definition, a later eval of it done)
    (tasks / "outer.yaml").write_text('group: outer\ndoc_to_text: "yyy {{context}}"\ntask:\n  - plain\n')
    (tasks / "item.yaml").write_text('group: item\ntask:\n  - group: plain\n    doc_to_text: "yyy"\n')
    (tasks / "tagged.yaml").write_text("group: tagged\ntag: suite\ntask:\n  - own_mc\n")
    tm = hub_task_manager([], [str(tasks)])
    assert reconfigured_members(tm, "outer") == reconfigured_members(tm, "item") == {"plain", "own_mc"}
    # a group's `tag:` is no setting of its members (lm-eval drops it): RV34a G8, own_mc scored again
    assert reconfigured_members(tm, "tagged") == set()


def test_a_group_s_variant_recorded_under_its_member_s_name_before_group_task_names_is_scored_again(
    eval_run, tmp_path, capsys
):
    """A gristmill before `GROUP::task` names recorded a group's variant of own_mc (`- task: own_mc` with
    overrides) as own_mc, under the group's definition: after the upgrade the group's watch counted such a
    step done (its entry had no `documents`: done under any), and own_mc kept the variant's scores under
    its name in results.json, eval.parquet and the audit, unnamed (review RV30c S2). The group is done
    only where `ovr::own_mc` is; scoring it drops the old own_mc entry, with a note saying what it held,
    where the entry says it held it (lm-eval's config of the variant): one ovr scored when it named own_mc
    as it is holds own_mc's own scores, and was dropped for ovr's overrides of today (RV31a 7). One of
    ovr's overrides as they were before an edit was kept as own_mc's, no note (RV32f B4): only an entry
    whose config is own_mc's own is kept; another, or none recorded, is dropped with a note saying so."""
    from validation.eval import evaluate_missing, load_eval_config, score_settings
    from validation.eval_results import variants_replaced, write_step_json

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    ovr_yaml = (  # num_fewshot overridden too: RV33a L1, below
        'group: ovr\ntask:\n  - task: own_mc\n    doc_to_text: "zzz zzz {{context}}"\n    num_fewshot: 1\n'
        "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\n"
    )
    (tasks / "ovr.yaml").write_text(ovr_yaml)

    def planned(group: str, names: tuple[str, ...], subtasks: dict) -> tuple:
        """The plan of `group`, and the step as that gristmill wrote it: the members under the group's
        settings, no documents, by their names."""
        cfg = load_eval_config(None, _own_sets(tasks), group)
        plan = TaskPlan(run, cfg)
        old = score_settings(cfg, None, plan.definitions[group])
        both = {t: {"settings": {k: v for k, v in old.items() if k != "bootstrap_iters"}} for t in names}
        return cfg, plan, both, {"results": {t: {"acc,none": 0.25} for t in both}, "group_subtasks": subtasks}

    cfg, plan, both, results = planned("ovr", ("ovr", "own_mc"), {"ovr": ["own_mc"]})

    def scored_after(config: dict | None) -> dict:  # the step's file once ovr is scored on the old one
        shutil.rmtree(eval_dir(run, 5), ignore_errors=True)
        configs = {"configs": {"own_mc": config}} if config is not None else {}
        write_step_json(run, 5, {**results, **configs, "gristmill_tasks": both})
        assert evaluate_missing(run, cfg, plan, show=False) == [5]
        return json.loads((eval_dir(run, 5) / "results.json").read_text())

    # scored when ovr named own_mc as it is: lm-eval's config of own_mc itself, as it records it (the
    # task's config, num_fewshot 0 where the task sets none). ovr overrides num_fewshot as well: such an
    # entry was dropped as "neither own_mc's own nor ovr's variant's", its own num_fewshot taken as the
    # bare load's none (RV33a L1)
    own = dict(plan.task_manager.load("own_mc")["tasks"]["own_mc"].dump_config(), num_fewshot=0)
    got = scored_after(own)
    assert got["results"]["own_mc"] == {"acc,none": 0.25} and "ovr::own_mc" in got["results"]
    assert "own_mc (" not in capsys.readouterr().out
    variant = got["configs"]["ovr::own_mc"]  # the variant's, as lm-eval records it
    edited = {**variant, "doc_to_text": "yyy yyy {{context}}"}  # ovr's overrides before an edit
    for config, held in [
        (variant, "held ovr's variant's scores"),
        (edited, "held the scores of a config neither own_mc's own nor ovr's variant's of today"),
        (None, "no config recorded: whether it held ovr's variant's scores or its own is unknown"),
    ]:
        got = scored_after(config)
        assert (
            f"scored again under other settings: own_mc ({held}, recorded before GROUP::task names; scored "
            "again as ovr::own_mc), ovr ("
        ) in capsys.readouterr().out
        for section in ("results", "configs", "gristmill_tasks"):
            assert "own_mc" not in got[section] and "ovr::own_mc" in got[section], section
        assert evaluate_missing(run, cfg, plan, show=False) == []

    def own_kept(config: dict, settings: dict, n_shot: dict | None = None) -> dict:
        """What variants_replaced says of an own_mc entry holding `config` under ovr's old `settings`
        (its num_fewshot as recorded; ovr's entry with `n_shot` where given), against the step as ovr's
        eval wrote it ({}: kept as own_mc's)."""
        info = {**both, "own_mc": {"settings": settings}}
        if n_shot is not None:
            info["ovr"] = {**both["ovr"], "n_shot": n_shot}
        return variants_replaced(
            {**results, "configs": {"own_mc": config}, "gristmill_tasks": info}, got, plan.own_config
        )

    # own_config took num_fewshot under today's `num_fewshot` (unset), not the entry's (RV34e S1): an
    # entry ovr wrote under `--set num_fewshot=3` when it overrode only `num_fewshot: 0` held its variant,
    # own_mc 0-shot, and was kept as own_mc's own, whose own there is 3-shot; one of own_mc's own 3-shot
    # (ovr then overrode only `num_fewshot: 1`, which lm-eval sets to the 3 passed) was dropped
    then = {**both["own_mc"]["settings"], "num_fewshot": 3}
    neither = "held the scores of a config neither own_mc's own nor ovr's variant's of today"
    assert own_kept({**own, "num_fewshot": 3}, then) == {}
    assert own_kept(own, then)["own_mc"].startswith(neither)
    unnamed = {k: v for k, v in then.items() if k != "num_fewshot"}  # no gristmill wrote such a record
    assert "(its settings name no num_fewshot): whether" in own_kept(own, unnamed)["own_mc"]
    # ovr edited not to override num_fewshot, the common case (RV34e M1): an entry of own_mc's own is
    # kept, under the num_fewshot passed then too (the variant's of today is scored 0-shot)
    (tasks / "ovr.yaml").write_text(ovr_yaml.replace("    num_fewshot: 1\n", ""))
    got["configs"]["ovr::own_mc"] = {**variant, "num_fewshot": 0}
    assert own_kept(own, both["own_mc"]["settings"]) == {}
    assert own_kept({**own, "num_fewshot": 3}, then) == {}
    # own_mc's YAML says `num_fewshot: 2`; ovr scored under `--set num_fewshot=0`: a member's record holds
    # no n-shot, ovr's does (a gristmill since 2a90755, which passed 0 as 0). Its 0-shot entry is own_mc's
    # own under 0, and was dropped as "neither", read as passed None (review RV34h M1); one whose group
    # recorded no n-shot either was passed `0 or None`, own_mc's own 2-shot
    _own_task(tasks, extra="num_fewshot: 2\n")
    zero = {**then, "num_fewshot": 0}
    assert own_kept(own, zero, {"ovr": 0, "own_mc": 0}) == {}
    # a member's record says what was passed, whatever its group recorded: members have records only
    # since d7917da, which passed 0 as 0 (review RV34k M1: a nested group's member was read as 2-shot)
    assert own_kept(own, zero) == {}
    assert own_kept({**own, "num_fewshot": 2}, zero)["own_mc"].startswith(neither)
    # a group defined inline in another: lm-eval names the member outer::own_mc under outer::gp, and the
    # entry was kept as own_mc's own scores, no note (RV33a F1). outer::gp cannot be loaded by name, so
    # own_mc's own config cannot be had to compare: the note said "neither own_mc's own" of own_mc's own
    # config (RV33a L1)
    (tasks / "outer.yaml").write_text(
        "group: outer\ntask:\n  - group: gp\n    task:\n      - task: own_mc\n"
        '        doc_to_text: "zzz zzz {{context}}"\n'
    )
    subtasks = {"outer": ["outer::gp"], "outer::gp": ["own_mc"]}
    cfg, plan, both, results = planned("outer", ("outer", "outer::gp", "own_mc"), subtasks)
    got = scored_after(own)
    held = (
        "held the scores of a config other than outer::gp's variant's of today, not compared with own_mc's "
        "own (outer::gp could not be loaded by name here): whether they were its own is unknown"
    )
    assert f"own_mc ({held}, recorded before GROUP::task names; scored again as outer::own_mc)" in (
        capsys.readouterr().out
    )
    assert "own_mc" not in got["results"] and "outer::own_mc" in got["results"]


def test_watch_scores_again_a_task_edited_since_it_was_scored(eval_run, tmp_path, capsys):
    """Only the settings (limit, num_fewshot …) decided whether a step was done: a task YAML under
    include_path edited between two evals (its doc_to_target, a !function's source) counted as the
    same task, and `--watch` scored nothing, exit 0 (review R23a S1). Each task's scores record its
    definition's digest; scores recorded before the digest existed stay done."""
    from pipelines.cli import main
    from training.contract.eval_table import read_step_results
    from validation.eval import evaluated, score_settings
    from validation.eval_results import write_step_json

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="process_docs: !function own_utils.process_docs\n")
    utils = tasks / "own_utils.py"
    utils.write_text("def process_docs(docs):\n    return docs\n")
    yaml = tasks / "own_mc.yaml"
    results = eval_dir(run, 5) / "results.json"
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *_own_args(tasks)]

    def scored() -> tuple[float, int, str]:
        return _own_mc_scored(results, "definition")

    assert main(watch) == 0
    first = results.read_text()
    acc, docs, definition = scored()
    assert docs == 6
    line = "[eval] step 5 own_mc: 6 docs"
    assert line in capsys.readouterr().err
    assert main(watch) == 0
    assert results.read_text() == first and line not in capsys.readouterr().err  # the same task: done
    yaml.write_text(yaml.read_text().replace('doc_to_target: "{{label}}"', 'doc_to_target: "{{1 - label}}"'))
    assert main(watch) == 0
    assert line in capsys.readouterr().err
    flipped, _, edited = scored()
    assert flipped == pytest.approx(1 - acc)  # every item's answer flipped: scored again
    assert edited != definition and len(definition) == 64
    utils.write_text("def process_docs(docs):\n    return docs.select(range(4))\n")
    assert main(watch) == 0
    assert scored()[1] == 4  # the function's source: scored again
    assert main(watch) == 0 and scored()[1] == 4

    # scores recorded before the definition was: done under any
    cfg = EvalConfig()
    old = {"own_mc": {"settings": score_settings(cfg)}}
    write_step_json(tmp_path, 3, {"results": {"own_mc": {}}, "gristmill_tasks": old})
    assert "definition" not in read_step_results(tmp_path, 3)["gristmill_tasks"]["own_mc"]["settings"]
    assert evaluated(tmp_path, 3, ["own_mc"], [], None, cfg, {"own_mc": "d1"})
    new = {"own_mc": {"settings": score_settings(cfg, definition="d0")}}
    write_step_json(tmp_path, 4, {"results": {"own_mc": {}}, "gristmill_tasks": new})
    assert not evaluated(tmp_path, 4, ["own_mc"], [], None, cfg, {"own_mc": "d1"})
    assert evaluated(tmp_path, 4, ["own_mc"], [], None, cfg, {"own_mc": "d0"})


def test_a_task_s_definition_is_its_functions_whole_module_and_no_path(eval_run, tmp_path, capsys):
    """The definition took a `!function`'s own source and its module's name: an edit to a helper it
    calls or to a module constant kept the task done under the same digest, and lm-eval names the
    module of an include_path folder by its absolute path, so the same folder at another path scored
    every step again (review R23d 1). A function is its qualname and its whole module file's sha256."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="process_docs: !function own_utils.process_docs\n")
    utils = tasks / "own_utils.py"
    utils.write_text("N = 6\n\ndef keep(docs):\n    return docs.select(range(N))\n\n"
                     "def process_docs(docs):\n    return keep(docs)\n")  # fmt: skip
    results = eval_dir(run, 5) / "results.json"
    line = "[eval] step 5 own_mc: "

    def watch(folder: Path) -> tuple[int, str]:
        args = ["--watch", "--poll", "0.05", "--idle-exit", "0.05", *_own_args(folder)]
        assert main(["eval", str(run), *args]) == 0
        task = json.loads(results.read_text())
        return task["n-samples"]["own_mc"]["effective"], capsys.readouterr().err

    docs, err = watch(tasks)
    assert docs == 6 and line in err
    utils.write_text(utils.read_text().replace("N = 6", "N = 4"))  # process_docs' own source is the same
    # an edit a second later, as a person's: Python's bytecode cache checks a source by its size and its
    # mtime in whole seconds, and ran the old N for a same-size edit within one (seen once in a full run)
    os.utime(utils, ns=(utils.stat().st_atime_ns, utils.stat().st_mtime_ns + 2_000_000_000))
    docs, err = watch(tasks)
    assert docs == 4 and line in err, err  # scored again
    scored = results.read_text()
    moved = tmp_path / "elsewhere" / "tasks"
    shutil.copytree(tasks, moved)  # the same files at another path (data_files name the first's)
    docs, err = watch(moved)
    assert results.read_text() == scored and line not in err, err  # the same task: done


def test_a_task_s_definition_covers_its_folder_s_python_and_a_group_s_members_with_overrides(tmp_path):
    """Review R23g S2, M3: a `!function` wrapped by a decorator of another file (functools.wraps) or by
    functools.cache was digested by the wrapper's file (or by nothing), and a group naming a member
    with overrides (`- task: own_mc` + `num_fewshot: 0`) by the overrides alone: an edit to the
    function, or to the member task, kept the digest, so the steps stayed done. The Python files
    beside the task's YAML and a member's own definition are in it."""
    from lm_eval.tasks import TaskManager

    from validation.eval_data import task_definition

    tasks = _own_task(tmp_path / "tasks", extra="process_docs: !function own_utils.process_docs\n")
    (tasks / "deco.py").write_text("import functools\n\ndef logged(f):\n    @functools.wraps(f)\n"
                                   "    def run(*a):\n        return f(*a)\n    return run\n")  # fmt: skip
    utils = tasks / "own_utils.py"
    (tasks / "my_group.yaml").write_text("group: my_group\ntask:\n  - task: own_mc\n    num_fewshot: 0\n")

    def digests() -> tuple[str, str]:
        tm = TaskManager(include_defaults=False, include_path=[str(tasks)])
        return task_definition(tm, "own_mc"), task_definition(tm, "my_group")

    for wrapped in ("from deco import logged\n\n@logged\n", "import functools\n\n@functools.cache\n"):
        utils.write_text(f"{wrapped}def process_docs(docs):\n    return docs\n")
        before = digests()
        utils.write_text(utils.read_text().replace("return docs", "return docs.select(range(4))"))
        after = digests()
        assert before[0] != after[0] and before[1] != after[1], wrapped  # the task, and its group
    # an editor's lock (a dangling link) and a copy's AppleDouble file beside it: no traceback, the same
    # digest (review R23h M1, N1); a group defined inline in another's list (R23h S2)
    before = digests()
    (tasks / ".#own_utils.py").symlink_to(tmp_path / "gone")
    (tasks / "._own_utils.py").write_bytes(b"\0\5\x16\7")
    assert digests() == before
    # and a registered group named with overrides (`- group: my_group`: R23i 3)
    (tasks / "outer.yaml").write_text("group: outer\ntask:\n  - group: inner\n    task:\n      - own_mc\n")
    (tasks / "outer2.yaml").write_text("group: outer2\ntask:\n  - group: my_group\n    num_fewshot: 0\n")
    for outer, (was, now) in (("outer", ("range(4)", "range(3)")), ("outer2", ("range(3)", "range(2)"))):
        before = task_definition(TaskManager(include_defaults=False, include_path=[str(tasks)]), outer)
        utils.write_text(utils.read_text().replace(was, now))
        assert (
            task_definition(TaskManager(include_defaults=False, include_path=[str(tasks)]), outer) != before
        )


def test_a_task_edited_during_a_watch_is_scored_again_under_its_new_definition(
    built_dataset, eval_run, tmp_path
):
    """`--watch` made the tasks' definitions once, while lm-eval reads a task's files again for every
    step: a step scored after an edit during the watch was recorded under the old definition, and the
    steps before it stayed done (review R23d 2). The watch's plan (one TaskPlan, evaluate_missing at
    each poll) makes them again when a file under include_path changed."""
    from validation.eval import evaluate_missing, load_eval_config

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="process_docs: !function own_utils.process_docs\n")
    utils = tasks / "own_utils.py"
    utils.write_text("def process_docs(docs):\n    return docs\n")
    cfg = load_eval_config(None, _own_sets(tasks), "own_mc")
    plan = TaskPlan(run, cfg)  # what the watch makes once
    assert evaluate_missing(run, cfg, plan, show=False) == [5]
    first = plan.definitions["own_mc"]
    utils.write_text("def process_docs(docs):\n    return docs.select(range(4))\n")  # during the watch
    model = _tiny_model(built_dataset, 6)
    export_hf(model.state_dict(), model.cfg, built_dataset, export_dir(run, 6), meta={"step": 6})
    assert evaluate_missing(run, cfg, plan, show=False) == [5, 6]  # the next poll: step 5 again
    edited = TaskPlan(run, cfg).definitions["own_mc"]
    assert edited != first
    for step in (5, 6):
        scored = json.loads((eval_dir(run, step) / "results.json").read_text())
        assert scored["n-samples"]["own_mc"]["effective"] == 4
        assert scored["gristmill_tasks"]["own_mc"]["settings"]["definition"] == edited
    assert evaluate_missing(run, cfg, plan, show=False) == []


@pytest.mark.parametrize("layout", ["data_files", "dataset_path folder"])
def test_a_task_whose_data_file_changed_is_scored_again_on_the_file_as_it_is_now(
    eval_run, tmp_path, capsys, monkeypatch, layout
):
    """An own task's scores recorded its YAML, data_files as a path: its data file replaced (outside
    include_path), `--watch` scored nothing; replaced at the same size and mtime (cp -p), datasets'
    cache (keyed by path and mtime) served the old rows, scored and recorded as current (review R30a
    F1). The documents' content is recorded and makes the step done; the files are read as they are:
    also a dataset_path folder's relative data_files (they were looked for in the working directory:
    the old rows scored under the new digest, review RV30c S3); a `json/` folder in the working
    directory is not the `json` builder's data (RV30c M1); a dataset_path folder's files are those
    datasets reads, never the run directory in it (its every file was taken: the step was due again
    after each eval, and the watch never ended: RV31a 3); its dataset card's config's files, the card
    watched (RV33b C1, C4, C5); what datasets cannot resolve, or a cache in it, refused in one line
    (C2, C8)."""
    import datasets

    from pipelines.cli import main
    from validation.eval import load_eval_config
    from validation.eval_data import EvalError

    data = tmp_path / "data"
    data.mkdir()
    run = _copy_run(eval_run[0], (tmp_path if layout == "data_files" else data) / "run")
    tasks = _own_task(tmp_path / "tasks")
    for split in ("train", "test"):  # the data beside include_path, not in it
        shutil.move(tasks / f"own_mc-{split}.jsonl", data / f"own_mc-{split}.jsonl")
    yaml = tasks / "own_mc.yaml"
    if layout == "data_files":
        yaml.write_text(yaml.read_text().replace(str(tasks), str(data)))
    else:  # dataset_path: the folder, data_files relative to it
        yaml.write_text(
            yaml.read_text().replace("dataset_path: json", f"dataset_path: {data}").replace(f"{tasks}/", "")
        )
    unrelated = tmp_path / "cwd" / "json" / "unrelated.jsonl"
    unrelated.parent.mkdir(parents=True)
    unrelated.write_text("{}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    test = data / "own_mc-test.jsonl"
    read = TaskPlan(run, load_eval_config(None, _own_args(tasks)[3:], "own_mc")).data_files["own_mc"].files
    assert [p.resolve() for p in read] == [test.resolve(), (data / "own_mc-train.jsonl").resolve()]
    results = eval_dir(run, 5) / "results.json"
    watch = ["eval", str(run), "--watch", "--poll", "0.05", "--idle-exit", "0.05", *_own_args(tasks)]

    def scored() -> tuple[float, int, str]:
        return _own_mc_scored(results, "documents")

    assert main(watch) == 0
    acc, docs, documents = scored()
    assert docs == 6
    capsys.readouterr()
    assert main(watch) == 0 and "own_mc: 6 docs" not in capsys.readouterr().err  # the same data: done
    unrelated.write_text('{"other": 1}\n')  # not the task's data
    assert main(watch) == 0 and "own_mc: 6 docs" not in capsys.readouterr().err
    rows = test.read_text().splitlines()
    test.write_text("\n".join(rows[:4]) + "\n")  # other rows
    assert main(watch) == 0
    _, docs, fewer = scored()
    assert docs == 4 and fewer != documents
    out = capsys.readouterr().out
    assert f"scored again under other settings: own_mc (documents {documents[:8]} → {fewer[:8]})" in out, out
    # five rows at the same size and mtime, after a read that left datasets' cache warm
    test.write_text("\n".join(rows) + "\n")
    assert main(watch) == 0 and scored()[:2] == (acc, 6)
    st = test.stat()
    last = json.loads(rows[4])
    last["context"] += " " * (len(rows[5]) + 1)  # the sixth row's bytes
    test.write_text("\n".join([*rows[:4], json.dumps(last)]) + "\n")
    os.utime(test, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert test.stat().st_size == st.st_size and test.stat().st_mtime_ns == st.st_mtime_ns
    assert main(watch) == 0
    assert scored()[1] == 5  # the file's rows, not the cache's
    if layout == "data_files":
        return
    # Without data_files datasets chooses the folder's files: the run directory in it (RUN/eval/ a split
    # to datasets after the first eval: "no data files", RV32f B2) and datasets' cache in it (the
    # data-test.arrow it caches, scored as the task's, again at every poll: B8) are refused, one line.
    yaml.write_text(re.sub(r"dataset_kwargs:\n  data_files:\n(    .*\n)+", "", yaml.read_text()))
    capsys.readouterr()
    assert main(watch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"task own_mc reads dataset_path {data} without data_files, and the run directory {run} lies" in err
    )
    watch[1] = str(run.rename(tmp_path / "run"))
    results = eval_dir(tmp_path / "run", 5) / "results.json"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / "hf")
    assert main(watch) == 2
    assert f"and datasets' cache (HF_DATASETS_CACHE) {data / 'hf'} lies in it" in capsys.readouterr().err
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / ".hf")  # hidden: datasets skips it
    assert main(watch) == 0 and "own_mc: 5 docs" in capsys.readouterr().err  # the YAML edited
    assert main(watch) == 0 and "own_mc: 5 docs" not in capsys.readouterr().err
    # a dataset card's `configs` are what datasets reads there: its data_files, a config's data_dir's
    # split files (RV33b C4: refused; C1: the root's files recorded); a card written or edited is a
    # change to a running plan (C5: never watched)
    cfg = load_eval_config(None, _own_args(tasks)[3:], "own_mc")
    plan = TaskPlan(tmp_path / "run", cfg)
    # a .txt of JSON lines beside: datasets filters the split files by the format it infers without a
    # card, not for a card's config, one of its name alone too (RV33f F1: taken for no card; F5)
    stray = data / "own_mc-test.txt"
    stray.write_text(rows[0] + "\n")
    plan.refresh_definitions()
    assert stray.resolve() not in plan.data_files["own_mc"].files
    (data / "README.md").write_text("---\nconfigs:\n- config_name: default\n---\n")
    plan.refresh_definitions()
    assert stray.resolve() in plan.data_files["own_mc"].files
    (data / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_dir: null\n---\n")
    plan.refresh_definitions()  # none, as datasets reads it: not refused as a data_dir not a string (F4)
    assert stray.resolve() in plan.data_files["own_mc"].files
    stray.unlink()
    (data / "v2").mkdir()
    shutil.copy(test, data / "v2" / "own_mc-test.jsonl")
    card = "configs:\n- config_name: default\n  data_files:\n  - split: test\n    path: own_mc-train.jsonl\n"
    (data / "README.md").write_text(f"---\n{card}---\n")
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == [(data / "own_mc-train.jsonl").resolve()]
    # its data_files reach no file of a cache (or the run) in the folder: not refused (RV33f F7: it was)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / "hf")
    assert TaskPlan(tmp_path / "run", cfg).data_files["own_mc"].files == [
        (data / "own_mc-train.jsonl").resolve()
    ]
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / ".hf")
    (data / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_dir: v2\n---\n")
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == [(data / "v2" / "own_mc-test.jsonl").resolve()]
    # a folder the card's data_dir chooses is named as the task names it, its data_files relative to the
    # dataset_path, as datasets reads them (RV33h H4: "reads data_dir", "relative to" the card's folder)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / "v2" / "hf")
    with pytest.raises(EvalError) as refused:
        TaskPlan(tmp_path / "run", cfg)
    said = f"reads dataset_path {data} (its dataset card's data_dir v2) without data_files"
    assert said in str(refused.value) and f"(its files, relative to {data})" in str(refused.value)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / ".hf")
    # a card config's file not there yet (datasets reads nothing) is watched all the same: written, a change
    late = data / "v3" / "items.jsonl"
    card = f"configs:\n- config_name: default\n  data_files:\n  - split: test\n    path: v3/{late.name}\n"
    (data / "README.md").write_text(f"---\n{card}---\n")
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == []
    late.parent.mkdir()
    shutil.copy(test, late)
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == [late.resolve()]
    # the files datasets itself reads, not a re-reading of its rules: a chosen config whose splits differ in
    # format (datasets infers the builder from the first config: RV33f F6, nothing was recorded), several
    # configs none default and the card's dataset_info naming one (datasets takes it: F10, refused)
    config = "- config_name: {}\n  data_files:\n  - split: test\n    path: {}\n"
    stray.write_text(rows[0] + "\n")
    mixed = (
        config.format("B", stray.name) + "  - split: train\n    path: own_mc-train.jsonl\n  default: true\n"
    )
    (data / "README.md").write_text(f"---\nconfigs:\n{config.format('A', test.name)}{mixed}---\n")
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == [stray.resolve(), (data / "own_mc-train.jsonl").resolve()]
    # a group's override of its member's dataset_name (an item's, a group-wide key): the files of the
    # config lm-eval scores, not of the member's own (RV33f F3: B's recorded, A's scored, never rescored)
    for group in ["task:\n- task: own_mc\n  dataset_name: A\n", "dataset_name: A\ntask:\n- own_mc\n"]:
        (tasks / "g.yaml").write_text(f"group: g\n{group}")
        grouped = TaskPlan(tmp_path / "run", load_eval_config(None, _own_args(tasks)[3:], "g")).data_files
        assert grouped["g"].files == [test.resolve()], group
    (tasks / "g.yaml").unlink()
    info = "dataset_info:\n  config_name: B\n  features:\n  - name: label\n    dtype: int64\n"
    two = config.format("A", test.name) + config.format("B", stray.name)
    (data / "README.md").write_text(f"---\nconfigs:\n{two}{info}---\n")
    plan.refresh_definitions()
    assert plan.data_files["own_mc"].files == [stray.resolve()]
    stray.unlink()
    # what datasets cannot resolve either: one line (RV33b C2: a ValueError's traceback; RV33f F4: a
    # TypeError's, for a .huggingface.yaml not a mapping or a data_dir not a string), and the task's
    # own cache_dir in the folder, refused as HF_DATASETS_CACHE is (C8: the watch never ended)
    (data / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n    test: x\n---\n"
    )
    text = yaml.read_text()
    for standalone, kwargs, said in [
        ("- a\n", "", f"{data / '.huggingface.yaml'} is not a mapping of card keys"),
        ("configs:\n- config_name: x\n  data_dir: [1]\n", "", "config 'x' data_dir [1]: give it a folder"),
        ("configs: [5]\n", "", "dataset card's `configs` cannot be read (TypeError: "),  # RV33h H3
        ("", "", "but got {'test': 'x'}; fix its"),  # datasets' first sentence alone (RV33f F8)
        ("", "  data_files:\n    test: '**-test.jsonl'\n", "Invalid pattern: '**' can only be an entire"),
        ("", f"  cache_dir: {data / 'cache'}\n", f"its dataset_kwargs cache_dir {data / 'cache'} lies in it"),
        # anywhere: it bypassed local_data_cache's per-content cache (F9: the old rows under the new digest)
        (
            "",
            f"  cache_dir: {tmp_path / 'own'}\n",
            f"names its own dataset_kwargs cache_dir {tmp_path / 'own'}",
        ),
    ]:
        (data / ".huggingface.yaml").write_text(standalone)  # over README.md's YAML; empty: README's alone
        yaml.write_text(text + f"dataset_kwargs:\n{kwargs}" * bool(kwargs))
        if kwargs.startswith("  cache_dir"):
            (data / "README.md").unlink(missing_ok=True)
        assert main(watch) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    yaml.write_text(text)  # a folder holding a dataset script: datasets refuses it, in one line here too
    (data / "data.py").write_text("")
    assert main(watch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Dataset scripts are no longer supported, but found data.py" in err, err
    (data / "data.py").unlink()
    (data / "sub").mkdir()  # dataset_kwargs' data_dir: datasets reads that folder's files alone
    for split in ("train", "test"):
        shutil.copy(data / f"own_mc-{split}.jsonl", data / "sub" / f"own_mc-{split}.jsonl")
    yaml.write_text(text + "dataset_kwargs:\n  data_dir: sub\n")
    read = TaskPlan(tmp_path / "run", cfg).data_files
    assert read["own_mc"].files == sorted((data / "sub").resolve().glob("*.jsonl"))
    # and the `json` builder's, its data_dir's (RV33b C3: nothing was recorded)
    yaml.write_text(
        text.replace(f"dataset_path: {data}", "dataset_path: json")
        + "dataset_kwargs:\n  data_dir: ../data/sub\n"
    )
    read = TaskPlan(tmp_path / "run", cfg).data_files
    assert read["own_mc"].files == sorted((data / "sub").resolve().glob("*.jsonl")) and read["own_mc"].alone
    # every split file of it, whatever its name: a Spark layout (test/part-00000) read, never recorded (F2)
    for split in ("train", "test"):
        (data / "sub" / split).mkdir()
        shutil.copy(data / f"own_mc-{split}.jsonl", data / "sub" / split / "part-00000")
        (data / "sub" / split / "_SUCCESS").touch()
    read = TaskPlan(tmp_path / "run", cfg).data_files
    assert [p.relative_to((data / "sub").resolve()).as_posix() for p in read["own_mc"].files] == [
        "test/_SUCCESS",
        "test/part-00000",
        "train/_SUCCESS",
        "train/part-00000",
    ]
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", data / "sub" / "hf")  # named by its key (F8)
    capsys.readouterr()
    assert main(watch) == 2
    assert "task own_mc reads data_dir ../data/sub without data_files" in capsys.readouterr().err


def test_a_folder_s_data_files_from_one_walk_are_those_datasets_resolves(tmp_path, monkeypatch):
    """While datasets resolves a dataset_path folder's data files (eval_data.read_files), its
    resolve_pattern is served from one walk of the folder (`_one_walk`: its own 68 globs of a 20k-file
    folder were 15-30 s). The same files as datasets' own for every kind of name and pattern, or both
    none; datasets' own back after the block, left normally or by an error. `~` was expanded to $HOME,
    which datasets joins to the folder as written (review RV34a G1: a card's `~/sub/*` read by
    datasets, recorded by nobody; a task's own data_files `~/…`: $HOME's file recorded)."""
    import datasets
    import huggingface_hub.constants as hf_constants
    from datasets import data_files
    from datasets.load import _ALL_ALLOWED_EXTENSIONS

    from tests.helpers.hub_server import HubServer
    from validation.eval_data import _one_walk, hub_task_manager, read_files, task_data_files

    base = tmp_path / "t"
    for name in [
        ".hd/c-test.jsonl", ".hidden-test.jsonl", "__pycache__/p-test.jsonl", "__x/b-test.jsonl",
        "README.md", "config.json", "dataset_info.json", "a-test.jsonl", "a-train.jsonl", "UP-TEST.JSONL",
        "f-test.jsonl.gz", "e-test.tar", "noext", "test/x.jsonl", "test/part-00000", "test/_SUCCESS",
        "test/deep/n.jsonl", "data/train-00000-of-00001.parquet", "realdir/l-test.jsonl",
        "br[1]/z-test.jsonl", "st*ar/s-test.jsonl", "q?m/qm-test.jsonl", "sp ace/t-test.jsonl",
        "~/x/h-test.jsonl",
    ]:  # fmt: skip
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_text("{}\n")
    (base / "link-test.jsonl").symlink_to("a-test.jsonl")
    (base / "linkdir").symlink_to("realdir")
    (base / "broken-test.jsonl").symlink_to("gone.jsonl")
    (base / "loop").mkdir()
    (base / "loop" / "up").symlink_to("..")
    patterns = [
        "*", "**", "**/*-test.*", "test/**", "test/*", ".*", ".*/*", "__*/*", "__x/*", "README.md",
        "linkdir/**", "loop/**", "~/x/*", "~/x/h-test.jsonl", "br[[]1]/*", "st[*]ar/*", "q?m/*", "sp ace/*",
        "*.JSONL", "noext", "*.gz", "./*.jsonl", "../t/*-test.jsonl", f"{base}/*.jsonl", "nothing/*",
        "data/" + data_files.SPLIT_PATTERN_SHARDED.format(split="train"), "**/test/**",
        "**/*[-._ 0-9]test[-._ 0-9]*", "**/test[-._ 0-9]*/**",
    ]  # fmt: skip
    original = data_files.resolve_pattern

    def files(resolve, pattern: str, extensions: list[str] | None) -> list[str] | str:
        try:
            return sorted(map(os.path.normpath, resolve(pattern, str(base), extensions)))
        except FileNotFoundError:
            return "none"

    with _one_walk():
        assert data_files.resolve_pattern is not original  # served from the walk
        for pattern in patterns:
            for extensions in (None, _ALL_ALLOWED_EXTENSIONS):
                theirs = files(original, pattern, extensions)
                assert files(data_files.resolve_pattern, pattern, extensions) == theirs, (pattern, extensions)
    assert data_files.resolve_pattern is original
    with pytest.raises(KeyError), _one_walk():
        raise KeyError("a builder's")
    assert data_files.resolve_pattern is original
    # one block at a time, datasets' own back after both (RV34a G2: overlapping blocks in two threads each
    # put back what they found, the last the other's resolver, for good)
    inside, other_in, first_out = threading.Event(), threading.Event(), threading.Event()
    overlapped = []

    def first() -> None:
        with _one_walk():
            inside.set()
            overlapped.append(other_in.wait(0.3))  # the other's block waits for this one's end
        first_out.set()

    def other() -> None:
        inside.wait(60)
        with _one_walk():
            other_in.set()
            first_out.wait(60)

    threads = [threading.Thread(target=first, daemon=True), threading.Thread(target=other, daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)  # bounded: a deadlock fails here, never hangs the suite (RV34i)
    assert not any(t.is_alive() for t in threads), "the swaps' lock deadlocked"
    assert overlapped == [False] and data_files.resolve_pattern is original
    # the `json` builder's download-count ping (a HEAD to datasets' S3 bucket, 3 s timeout) at each plan of
    # a task reading its data_dir: none (RV34a G3)
    with HubServer() as counter:
        monkeypatch.setattr(datasets.config, "S3_DATASETS_BUCKET_PREFIX", f"{counter.url}/count")
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)  # its session refuses any request else
        monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", True)  # datasets' default
        assert read_files("json", None, str(base / "test"))[1]
    assert counter.requests == [] and datasets.config.HF_UPDATE_DOWNLOAD_COUNTS is True
    # a task's own data_files: FOLDER/~/x/…, never $HOME/x/… (datasets reads the one, not the other)
    (tmp_path / "home" / "x").mkdir(parents=True)
    (tmp_path / "home" / "x" / "h-test.jsonl").write_text("{}\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tl.yaml").write_text(
        f"task: tl\ndataset_path: {base}\ndataset_kwargs:\n  data_files:\n    test: ~/x/h-test.jsonl\n"
    )
    tl = task_data_files(hub_task_manager([], [str(tmp_path / "tasks")]), "tl")
    assert tl.files == [(base / "~" / "x" / "h-test.jsonl").resolve()]


def test_a_hub_dataset_s_relative_data_files_are_the_hub_repo_s_not_this_directory_s(tmp_path, monkeypatch):
    """A dataset_path that is no local file or folder is a hub repo, in which datasets resolves the
    task's relative data_files: the working directory's file of that name was recorded as the documents
    scored, the task as read from local files alone (review RV33b C7). An absolute path stays local, as
    datasets reads it."""
    from validation.eval_data import hub_task_manager, task_data_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text('{"text": "not the hub repo\'s"}\n')
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, path in (("relative", "data/test.jsonl"), ("absolute", tmp_path / "data" / "test.jsonl")):
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: someorg/somedata\n"
            f"dataset_kwargs:\n  data_files:\n    test: {path}\ntest_split: test\n"
            "output_type: loglikelihood_rolling\ndoc_to_text: '{{text}}'\n"
            "doc_to_target: '{{text}}'\n"
        )
    tm = hub_task_manager([], [str(tasks)])
    relative, absolute = task_data_files(tm, "relative"), task_data_files(tm, "absolute")
    assert (relative.files, relative.alone, relative.patterns) == ([], False, [])
    assert absolute.files == [tmp_path / "data" / "test.jsonl"] and absolute.alone


def test_a_data_file_replaced_while_scored_or_joining_a_glob_is_what_the_scores_record(
    eval_run, tmp_path, capsys, monkeypatch
):
    """A task's `documents` were taken when the eval began: a file replaced while an earlier task was
    scored was read new and recorded under the old digest (review RV30c m1); and only the files a glob
    matched then were watched, so a file joining `own_mc-test*.jsonl` during a watch was read at the next
    step and recorded under the old digest, the steps scored before counted done (RV30c S1). Each task's
    digests are taken just before it is scored, and the plan watches the patterns: a new match is a
    change. A dataset_path folder named without data_files is the files datasets reads of it (its
    split-named ones), not its every file (a cache or a run's files in it changed it: RV31a 3). A link on
    the way re-pointed leads to other files: a change (RV32f B1: the patterns' resolution was kept). A
    record of such a folder by the rule before (its every file) of the files as they are is scored again
    with a note saying so, not that its documents changed (RV32f B6)."""
    from validation import eval_data
    from validation.eval import evaluated, load_eval_config
    from validation.eval_data import files_sha256
    from validation.eval_results import write_step_json

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    real = tmp_path / "data-v1"  # outside include_path
    real.mkdir()
    data = tmp_path / "data"
    data.symlink_to(real)  # the task names it through a link
    for split in ("train", "test"):
        shutil.move(tasks / f"own_mc-{split}.jsonl", data / f"own_mc-{split}.jsonl")
    yaml = tasks / "own_mc.yaml"
    yaml.write_text(yaml.read_text().replace(f"{tasks}/own_mc-test.jsonl", f"{data}/**/own_mc-test*.jsonl"))
    yaml.write_text(yaml.read_text().replace(str(tasks), str(data)))
    test = data / "own_mc-test.jsonl"
    rows = test.read_text().splitlines(keepends=True)

    def files() -> list[Path]:  # what the task reads: its train file and the glob's matches
        return sorted(p.resolve() for p in data.glob("*.jsonl"))

    class ReplacingLM(GristmillHFLM):
        """Replaces own_mc's file while own_a is scored."""

        replacements = [rows[:3]]

        def loglikelihood(self, requests, disable_tqdm=False):
            if self.replacements:
                test.write_text("".join(self.replacements.pop(0)))
            return super().loglikelihood(requests, disable_tqdm)

    _own_task(tasks, "own_a")
    folder = _own_task(tmp_path / "folder", "own_f")  # own_f-train.jsonl, own_f-test.jsonl
    own_f = re.sub(r"dataset_kwargs:\n  data_files:\n(    .*\n)+", "", (folder / "own_f.yaml").read_text())
    (tasks / "own_f.yaml").write_text(own_f.replace("dataset_path: json", f"dataset_path: {folder}"))
    (folder / "own_f.yaml").unlink()
    sets = _own_sets(tasks)
    cfg = load_eval_config(None, sets, "own_a,own_mc,own_f")
    plan = TaskPlan(run, cfg)
    lm = ReplacingLM(pretrained=str(export_dir(run, 5)), device="cpu", batch_size=4, max_length=SEQ_LEN)
    results = evaluate_lm(lm, plan, cfg)
    assert results["gristmill_tasks"]["own_mc"]["settings"]["documents"] == files_sha256(files())
    assert results["n-samples"]["own_mc"]["effective"] == 3  # the file as it is, under its digest
    write_step_json(run, 5, results)

    def done() -> bool:  # as a watch's next poll (evaluate_missing) asks of the same plan
        plan.refresh_definitions()
        definitions, contents = (
            {**plan.member_definitions, **plan.definitions},
            {**plan.member_contents, **plan.contents},
        )
        return evaluated(
            run, 5, plan.names, plan.local, plan.heldout, cfg, definitions, contents, plan.scored_as
        )

    assert done()
    assert plan.data_files["own_f"].files == sorted(folder.resolve().glob("own_f-*.jsonl"))
    (folder / "cache").mkdir()
    (folder / "cache" / "state.json").write_text("{}\n")  # datasets reads the split-named files only
    (data / "__old").mkdir()  # datasets' `**` skips a `__` folder (RV32f B7: it was in the digest)
    (data / "__old" / "own_mc-test.jsonl").write_text("".join(rows[:1]))
    assert done()
    # recorded by the rule before (by a gristmill that recorded no documents_rule) of these files (the
    # cache's too): the same files; of others: other data; by today's rule, other data too, though equal to
    # the old rule's digest (a glob narrowed, a read file renamed: RV33a F4)
    # what 58a9e1f (before 1388e61) recorded of this folder: own_f-train/test.jsonl and cache/state.json
    before = "6020787c586072504f9e62ffbbe299c31a37bee572b3b1f985bfe61436126c65"
    assert plan.documents_before("own_f") == before
    # a folder over what documents_before reads (256 MiB; lowered here below this one's files): not read,
    # and the note says so, not that the data changed (the cap was untested: RV33a L2)
    cap = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) - 1
    not_read = " (changed, or the same files recorded by the rule before: its folder is too large to read)"
    for recorded, older, said, most in [
        (before, True, " (the same files, now recorded as datasets reads its folder)", cap + 1),
        ("0" * 64, True, "", cap + 1),
        (before, False, "", cap + 1),
        (before, True, not_read, cap),
        (before, False, "", cap),
    ]:
        monkeypatch.setattr(eval_data, "DOCUMENTS_BEFORE_BYTES", most)
        old = json.loads(json.dumps(results, default=str))
        old["gristmill_tasks"]["own_f"]["settings"]["documents"] = recorded
        if older:
            old["gristmill_tasks"]["own_f"].pop("documents_rule", None)
        write_step_json(run, 5, old)
        capsys.readouterr()
        write_step_json(run, 5, results, documents_before=plan.documents_before)
        assert (
            f"own_f (documents {recorded[:8]} → {plan.contents['own_f'][:8]}{said})"
            in capsys.readouterr().out
        )
    past = plan.documents_before("own_f")  # past the cap: neither a digest nor taken for none (RV34e L2)
    assert past and not isinstance(past, str)
    monkeypatch.undo()
    assert done()
    v2 = tmp_path / "data-v2"  # another version, the link re-pointed as `ln -sfn data-v2 data` does
    shutil.copytree(real, v2)
    (v2 / "own_mc-test.jsonl").write_text("".join(rows[:2]))
    data.unlink()
    data.symlink_to(v2)
    assert not done()
    assert plan.contents["own_mc"] == files_sha256(files()) and files()[0].parent == v2
    data.unlink()
    data.symlink_to(real)
    assert done()
    own_f = plan.contents["own_f"]
    (folder / "own_f-test-2.jsonl").write_text("".join(rows[4:]))  # one more of them
    (data / "own_mc-test-2.jsonl").write_text("".join(rows[4:]))  # joins the glob: lm-eval reads it next
    assert not done()
    assert plan.contents["own_mc"] == files_sha256(files()) and len(files()) == 3
    assert plan.contents["own_f"] != own_f and len(plan.data_files["own_f"].files) == 3


def test_watch_of_a_tag_ends_once_its_tasks_are_scored(eval_run, tmp_path):
    """lm-eval records a tag's tasks, never the tag: `--watch --tasks TAG` scored every step again at
    every poll, and --idle-exit never ended it (review R30a F3). A tag is scored when its tasks are."""
    from validation.eval import evaluate_missing, load_eval_config
    from validation.eval_results import write_step_json

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="tag: own_tag\n")
    (tasks / "gov.yaml").write_text('group: gov\ntask:\n  - task: own_mc\n    doc_to_text: "Q: {{context}}"')
    cfg = load_eval_config(None, _own_sets(tasks), "own_tag")
    plan = TaskPlan(run, cfg)
    # own_mc recorded by a gristmill between ed48cab and d7917da: no settings of its own, the tag's entry
    # holds them (review RV34l P1: done under any; test_a_member_recorded_before_members_recorded_settings_…),
    # done where they are the tag's definition and documents now (such a record holds no documents: RV35a F1)
    for shots, scored in ((None, []), (0, [5])):  # the default then; `--set num_fewshot=0`, today's 2-shot
        settings = {"limit": 0, "num_fewshot": shots, "max_length": 0, "dtype": "float32", "seed": 1234,
                    "definition": plan.definitions["own_tag"],
                    "documents": plan.contents["own_tag"]}  # fmt: skip
        tag = {"seconds": 2.5, "docs": 6, "settings": settings, "n_shot": {"own_mc": shots or 0}}
        metrics = {"acc,none": 0.5, "acc_stderr,none": "N/A"}  # scored under bootstrap_iters=0
        then = {"results": {"own_mc": metrics}, "n-samples": {"own_mc": {"effective": 6}}}
        write_step_json(run, 5, {**then, "gristmill_tasks": {"own_tag": tag, "own_mc": {"requests": 12}}})
        assert evaluate_missing(run, cfg, plan, show=False) == scored, shots
    assert "own_tag" not in json.loads((eval_dir(run, 5) / "results.json").read_text())["results"]
    assert evaluate_missing(run, cfg, plan, show=False) == []
    (tasks / "own_mc.yaml").write_text((tasks / "own_mc.yaml").read_text() + "num_fewshot: 1\n")
    assert evaluate_missing(run, cfg, plan, show=False) == [5]  # a task of the tag edited: scored again
    # what vouches for a member recorded without settings: the tag as it is now (RV35a F1); gov's variant
    # of own_mc is none of own_mc's scores (F1b)
    now = {"definition": plan.definitions["own_tag"], "documents": plan.contents["own_tag"]}
    assert plan.scoring_as_is("own_tag", "own_mc") == now and plan.scoring_as_is("gov", "own_mc") is None


def test_num_fewshot_unset_is_each_task_s_own_and_0_is_zero_shot(eval_run, tmp_path):
    """num_fewshot 0 was passed as `0 or None`: a task with its own few-shot default (a YAML's
    num_fewshot: 2, gsm8k's 5) was scored 2-shot while results.json recorded 0 (review R23a S3).
    Unset is each task's own, 0 is zero-shot, and each task records the n-shot it was scored with;
    a record of 0 from before that record was the task's own, done under the default."""
    from pipelines.cli import main
    from validation.eval import evaluated
    from validation.eval_results import write_step_json

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="num_fewshot: 2\n")
    results = eval_dir(run, 5) / "results.json"
    for sets, shots in (([], 2), (["--set", "num_fewshot=0"], 0), (["--set", "num_fewshot=1"], 1)):
        assert main(["eval", str(run), "--step", "5", *_own_args(tasks), *sets]) == 0
        recorded = json.loads(results.read_text())
        task = recorded["gristmill_tasks"]["own_mc"]
        assert recorded["n-shot"]["own_mc"] == shots and task["n_shot"] == {"own_mc": shots}
        assert task["settings"]["num_fewshot"] == (shots if sets else None)
        saved = (eval_dir(run, 5) / "config.toml").read_text()
        assert ("\nnum_fewshot = " in saved) == bool(sets)  # unset: the key left out
    cfg = EvalConfig()
    before = {"own_mc": {"seconds": 1.5, "docs": 6, "settings": {"limit": 0, "num_fewshot": 0,
                                      "max_length": 0, "dtype": "float32", "seed": 1234}}}  # fmt: skip
    write_step_json(tmp_path, 3, {"results": {"own_mc": {}}, "gristmill_tasks": before})
    assert evaluated(tmp_path, 3, ["own_mc"], [], None, cfg)  # was scored with the task's own
    assert not evaluated(tmp_path, 3, ["own_mc"], [], None, EvalConfig(num_fewshot=0))
    # a group's member records no n-shot: its group's entry does (as `eval --tasks grp --set
    # num_fewshot=0` writes them, grp `- task: own_mc`), and 0 was passed as 0. A watch of own_mc alone,
    # unset, counted its 0-shot scores as own_mc's own 2-shot (review RV34h S1); before `scored_by`, the
    # groups listing it date it
    member = {"settings": before["own_mc"]["settings"], "scored_by": "grp"}
    grp = {"settings": before["own_mc"]["settings"], "n_shot": {"grp": 0, "own_mc": 0}}
    for record in (member, {k: v for k, v in member.items() if k != "scored_by"}):
        tasks = {"own_mc": record, "grp": grp}
        results = {"results": {"own_mc": {}, "grp": {}}, "group_subtasks": {"grp": ["own_mc"]}}
        write_step_json(tmp_path, 4, {**results, "gristmill_tasks": tasks})
        assert not evaluated(tmp_path, 4, ["own_mc"], [], None, cfg)
        assert evaluated(tmp_path, 4, ["own_mc"], [], None, EvalConfig(num_fewshot=0))
    # own_mc's own entry written by a gristmill before 2a90755 (`0 or None`: its own 2-shot) after a newer
    # one scored grp listing it: dated by no group's n-shot, its own scores stand as what they are (review
    # RV34k S1: read as 0-shot, a watch under 0 counted it done)
    tasks = {"own_mc": before["own_mc"], "grp": grp}
    results = {"results": {"own_mc": {}, "grp": {}}, "group_subtasks": {"grp": ["own_mc"]}}
    write_step_json(tmp_path, 6, {**results, "gristmill_tasks": tasks})
    assert evaluated(tmp_path, 6, ["own_mc"], [], None, cfg)
    assert not evaluated(tmp_path, 6, ["own_mc"], [], None, EvalConfig(num_fewshot=0))


def test_a_member_recorded_before_members_recorded_settings_is_done_only_under_its_group_s(tmp_path):
    """A group's or tag's member recorded by a gristmill between ed48cab (each task's scores record their
    settings) and d7917da (each member records its own) has none of its own: its group's or tag's entry
    holds them. It counted as done under any: `eval --tasks grp --set num_fewshot=0`, then a watch of
    own_mc (or of grp, or of a tag listing it) under num_fewshot=2 kept the 0-shot scores as 2-shot ones,
    nothing scored, exit 0 (review RV34l P1). It is done under its group's or tag's settings, where that
    entry's definition and documents are the group's or tag's now (not compared with the member's own:
    every such member was scored again).
    Through evaluate_missing and a real plan: test_watch_of_a_tag_ends_once_its_tasks_are_scored."""
    from validation.eval import evaluated
    from validation.eval_results import write_step_json

    defined = {"own_mc": "a" * 64}  # its own definition; its group's is another
    tag_members = {"mytag": ["own_mc"]}.get  # as TaskPlan.tag_members: the record names no tag's members
    # as TaskPlan.scoring_as_is: each group's and tag's definition and documents now, None for a variant
    now = {g: {"definition": "b" * 64, "documents": None} for g in ("grp", "outer", "mytag", "g1", "g2")}

    def as_is(group: str, member: str) -> dict | None:  # gov overrides own_mc
        return None if group == "gov" else now[group]

    def done(step: int, shots: int | None, names: tuple[str, ...] = ("own_mc",)) -> bool:
        scored_as = {n: tag_members(n) or [n] for n in names}
        return evaluated(tmp_path, step, list(names), [], None, EvalConfig(num_fewshot=shots), defined, None,
                         scored_as, tag_members, as_is)  # fmt: skip

    # requests_summary's entry, all a member got then: no settings
    member = {"requests": 12, "cut_docs": 0, "of_docs": 6, "cut_requests": 0, "longest": 9, "limit": 256,
              "max_length": 256, "chance": 0.5}  # fmt: skip

    def scored(name: str, shots: int, n_shot: bool = True) -> dict:
        """The planned name's entry as evaluate_lm wrote it then (n_shot since 2a90755)."""
        settings = {"limit": 0, "num_fewshot": shots, "max_length": 0, "dtype": "float32", "seed": 1234,
                    "definition": "b" * 64}  # fmt: skip
        return {"seconds": 2.5, "docs": 6, "settings": settings} | (
            {"n_shot": {name: shots, "own_mc": shots}} if n_shot else {}
        )

    group = {"results": {"own_mc": {}, "grp": {}}, "group_subtasks": {"grp": ["own_mc"]}}
    for step, shots in ((2, 0), (3, 2)):  # both ways: another setting is scored again, the same is not
        write_step_json(
            tmp_path, step, {**group, "gristmill_tasks": {"grp": scored("grp", shots), "own_mc": member}}
        )
        assert [done(step, asked) for asked in (0, 2)] == [shots == 0, shots == 2], shots
    # a 0 recorded before 2a90755 (no n_shot) was passed as `0 or None`: own_mc's own few-shot
    write_step_json(
        tmp_path, 4, {**group, "gristmill_tasks": {"grp": scored("grp", 0, False), "own_mc": member}}
    )
    assert done(4, None) and not done(4, 0)
    # nested: only the planned outer group's entry has settings
    nested = {
        "results": {"own_mc": {}, "grp": {}, "outer": {}},
        "group_subtasks": {"outer": ["grp"], "grp": ["own_mc"]},
    }
    write_step_json(
        tmp_path, 5, {**nested, "gristmill_tasks": {"outer": scored("outer", 0), "own_mc": member}}
    )
    assert done(5, 0) and not done(5, 2)
    # a tag: lm-eval records none, gristmill its entry; a watch of the tag or of own_mc alone
    write_step_json(
        tmp_path,
        6,
        {"results": {"own_mc": {}}, "gristmill_tasks": {"mytag": scored("mytag", 0), "own_mc": member}},
    )
    for names in (("mytag",), ("own_mc",)):
        assert [done(6, asked, names) for asked in (0, 2)] == [True, False], names
    # its task edited since (the tag's definition now another), or its local files, which no record of
    # then holds: the tag's entry vouches for no scores of it as it is now (review RV35a F1: counted done)
    for edited in ({"definition": "c" * 64}, {"documents": "d" * 64}):
        now["mytag"] = now["grp"] | edited
        assert not done(6, 0, ("mytag",)) and not done(6, 0), edited
    # gov overrides it (`- task: own_mc` with its own doc_to_text): its variant's scores, recorded under
    # own_mc's name, are no scores of own_mc, alone or in a tag; nor once today's eval of gov recorded
    # gov::own_mc, leaving that entry under no group (review RV35a F1b: counted done)
    then = {"results": {"own_mc": {}, "gov": {}}, "group_subtasks": {"gov": ["own_mc"]}}
    write_step_json(tmp_path, 9, {**then, "gristmill_tasks": {"gov": scored("gov", 0), "own_mc": member}})
    today = {"results": {**then["results"], "gov::own_mc": {}}, "group_subtasks": {"gov": ["gov::own_mc"]}}
    again = {"gov": scored("gov", 0), "gov::own_mc": scored("gov", 0), "own_mc": member}
    write_step_json(tmp_path, 10, {**today, "gristmill_tasks": again})
    for step in (9, 10):
        assert not done(step, 0, ("mytag",)) and not done(step, 0), step
    # under two such groups (which scored it last is not recorded): done only under both's settings
    two = {
        "results": {"own_mc": {}, "g1": {}, "g2": {}},
        "group_subtasks": {"g1": ["own_mc"], "g2": ["own_mc"]},
    }
    record = {"g1": scored("g1", 0), "g2": scored("g2", 2), "own_mc": member}
    write_step_json(tmp_path, 7, {**two, "gristmill_tasks": record})
    assert not done(7, 0) and not done(7, 2)
    # recorded before settings were (before ed48cab): done under any, as before
    write_step_json(
        tmp_path, 8, {**group, "gristmill_tasks": {"grp": {"seconds": 2.5, "docs": 6}, "own_mc": member}}
    )
    assert done(8, 0) and done(8, 2)
    # a task's own entry from then (its seconds and docs), a later eval's merged beside it: still done
    # under any (review RV35c L1: scored again once, each such task of each step)
    merged = {"results": {"own_mc": {}, "grp": {}}, "gristmill_tasks": {"own_mc": {"seconds": 2.5, "docs": 6},
              "grp": scored("grp", 0)}}  # fmt: skip
    write_step_json(tmp_path, 11, merged)
    assert done(11, 0) and done(11, 2)


def test_a_member_recorded_without_settings_is_told_so_and_tabled_by_the_rule_eval_decides_by(
    tmp_path, capsys
):
    """Such a member (between ed48cab and d7917da) scored again: the note listed `? → …` for every
    setting, `settings ? → ?` among them, none of it true (review RV35a F2, RV35c L2); now it says the
    record holds none of its own, and under which groups' it lies where they differ. eval.parquet's
    settings of a member take the rule `evaluated` decides by (settings_holders): groups at every depth,
    and under several, their settings where they agree (RV35a F3: one parent's walk gave none)."""
    import pyarrow.parquet as pq

    from validation.eval_results import write_step_json

    member = {"requests": 12, "cut_docs": 0, "of_docs": 6, "limit": 256, "max_length": 256}  # no settings

    def scored(shots: int) -> dict:
        settings = {"limit": 0, "num_fewshot": shots, "max_length": 0, "dtype": "float32", "seed": 1234}
        return {"seconds": 2.5, "docs": 6, "settings": settings}

    def settings_column(step: int) -> str | None:
        rows = pq.read_table(tmp_path / "eval.parquet").to_pylist()
        return next(r["settings"] for r in rows if r["step"] == step and r["task"] == "own_mc")

    acc = {"acc,none": 0.5}
    two = {
        "results": {"own_mc": acc, "g1": {}, "g2": {}},
        "group_subtasks": {"g1": ["own_mc"], "g2": ["own_mc"]},
    }
    for step, shots in ((1, 0), (2, 2)):  # g2's the same as g1's, then another
        write_step_json(tmp_path, step, {**two, "gristmill_tasks": {"g1": scored(0), "g2": scored(shots),
                                                                    "own_mc": member}})  # fmt: skip
    assert "num_fewshot=0" in settings_column(1) and settings_column(2) is None
    alone = {"results": {"own_mc": {"acc,none": 0.75}}, "gristmill_tasks": {"own_mc": scored(0)}}
    capsys.readouterr()
    write_step_json(tmp_path, 2, alone)
    out = capsys.readouterr()
    note = "note: step 2 scored again under other settings: own_mc (recorded without settings of its own, "
    assert f"{note}under g1 and g2, whose settings differ, by an older gristmill); these" in out.err + out.out
    assert "?" not in (out.err + out.out).split("these scores")[0], out
    # a tag's member (the record names no tag's members): none of its own, said so
    tagged = {"results": {"own_mc": acc}, "gristmill_tasks": {"mytag": scored(0), "own_mc": member}}
    write_step_json(tmp_path, 3, tagged)
    assert settings_column(3) is None
    write_step_json(tmp_path, 3, alone)
    out = capsys.readouterr()
    assert "own_mc (recorded without settings, by an older gristmill); these" in out.err + out.out, out


def test_a_table_whose_derived_settings_an_older_rule_wrote_still_holds_the_scores(tmp_path):
    """eval.parquet's `settings` of a member recorded without settings of its own are its groups' by a
    rule that changed (RV35a F3): a finished run's table written before was refused by the audit as
    not holding the scores, though only that derived column differed (review RV41a F4). It holds them
    where that column is what an older rule wrote (none, or a holder's whole line); any other value
    there (RV41b F4), a row's own settings changed, or a value, is still another table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from training.contract.eval_table import settings_line, stale_eval_table
    from validation.eval_results import write_step_json

    member = {"requests": 12, "cut_docs": 0, "of_docs": 6, "limit": 256, "max_length": 256}  # no settings
    settings = {"limit": 0, "num_fewshot": 0, "max_length": 0, "dtype": "float32", "seed": 1234}
    own = {"seconds": 1.0, "docs": 6, "settings": settings}
    record = {
        "results": {"own_mc": {"acc,none": 0.5}, "g1": {}, "g2": {}, "alone": {"acc,none": 0.25}},
        "group_subtasks": {"g1": ["own_mc"], "g2": ["own_mc"]},
        "gristmill_tasks": {"g1": own, "g2": own, "own_mc": member, "alone": own},
    }
    write_step_json(tmp_path, 1, record)
    table = tmp_path / "eval.parquet"
    rows = pq.read_table(table).to_pylist()
    assert stale_eval_table(tmp_path) is None and {r["task"] for r in rows} == {"own_mc", "alone"}

    def written(edit) -> str | None:  # the table as another writer left it
        schema = pq.read_schema(table)
        pq.write_table(pa.Table.from_pylist([edit(dict(r)) for r in rows], schema=schema), table)
        return stale_eval_table(tmp_path)

    older = written(lambda r: r | {"settings": None} if r["task"] == "own_mc" else r)  # two groups: none
    assert older is None, older
    whole = settings_line(settings | {"definition": "a" * 64})  # a holder's whole line, as 795c7a8 wrote
    record["gristmill_tasks"]["g1"] = own | {"settings": settings | {"definition": "a" * 64}}
    write_step_json(tmp_path, 1, record)
    rows = pq.read_table(table).to_pylist()
    assert written(lambda r: r | {"settings": whole} if r["task"] == "own_mc" else r) is None
    for edit in (
        lambda r: r | {"settings": None} if r["task"] == "alone" else r,  # its own settings
        lambda r: r | {"value": 0.75} if r["task"] == "own_mc" else r,
        lambda r: r | {"settings": "limit=5, num_fewshot=25"} if r["task"] == "own_mc" else r,  # RV41b F4
    ):
        assert "does not hold the scores" in (written(edit) or ""), edit


def test_a_member_recorded_under_one_group_s_settings_is_told_so_not_given_the_group_s_definition(
    tmp_path, capsys
):
    """A member under one group, recorded without settings of its own (ed48cab..d7917da, as `gristmill
    eval --tasks g1 --set num_fewshot=0` of d7917da^ writes it on a group of one's own tasks: the group's
    entry with its definition, no documents), then scored alone: the note said `definition G1'S → ITS
    OWN, documents ? → …`, an edit nobody made and a `?` (review RV35a F2); it says the member held
    g1's settings and which of those differ (the rule `evaluated` decides by: settings_held)."""
    from validation.eval_results import write_step_json

    member = {"requests": 12, "cut_docs": 0, "of_docs": 6, "cut_requests": 0, "longest": 16, "limit": 256,
              "max_length": 256, "chance": 0.5}  # fmt: skip
    settings = {"limit": 0, "num_fewshot": 0, "max_length": 0, "dtype": "float32", "seed": 1234}
    g1 = {"seconds": 0.97, "settings": settings | {"definition": "4" * 64}, "n_shot": {"g1": 0, "own_mc": 0}}
    metrics = {"acc,none": 0.5, "acc_stderr,none": "N/A"}  # scored under bootstrap_iters=0
    then = {"results": {"own_mc": metrics, "g1": {}}, "group_subtasks": {"g1": ["own_mc"]},
            "n-samples": {"own_mc": {"effective": 6}}}  # fmt: skip
    write_step_json(tmp_path, 5, {**then, "gristmill_tasks": {"g1": g1, "own_mc": member}})
    for shots, differ in ((0, ""), (2, "; num_fewshot 0 → 2")):
        own = settings | {
            "num_fewshot": shots,
            "bootstrap_iters": 0,
            "definition": "f" * 64,
            "documents": "0" * 64,
        }
        alone = {"results": {"own_mc": {"acc,none": 0.75}}, "gristmill_tasks": {"own_mc": {"seconds": 1.0,
                 "docs": 6, "settings": own, "n_shot": {"own_mc": shots}}}}  # fmt: skip
        capsys.readouterr()
        write_step_json(tmp_path, 5 + shots, {**then, "gristmill_tasks": {"g1": g1, "own_mc": member}})
        write_step_json(tmp_path, 5 + shots, alone)
        out = capsys.readouterr()
        said = (
            f"own_mc (recorded without settings of its own, under g1's, by an older gristmill{differ}); these"
        )
        assert said in out.err + out.out, out


def test_a_tag_s_member_recorded_without_settings_is_tabled_under_the_settings_eval_judges_it_by(
    tmp_path, capsys
):
    """A tag's member recorded without settings of its own (ed48cab..d7917da, as `gristmill eval --tasks
    own_tag --set num_fewshot=0` of d7917da^ writes it: the tag's entry, its n_shot naming what it
    scored) had no settings in eval.parquet, while `evaluated` judged it under the tag's (review RV35a
    F3). The table and `evaluated` take them by one rule (settings_holders, settings_held): the tag's
    entry's n_shot names its members, so the table needs no task index, nor does `evaluated` there."""
    import pyarrow.parquet as pq

    from validation.eval import evaluated
    from validation.eval_results import write_step_json

    member = {"requests": 12, "cut_docs": 0, "of_docs": 6, "cut_requests": 0, "longest": 16, "limit": 256,
              "max_length": 256, "chance": 0.5}  # fmt: skip
    settings = {"limit": 0, "num_fewshot": 0, "max_length": 0, "dtype": "float32", "seed": 1234}
    tag = {
        "seconds": 0.93,
        "docs": 6,
        "settings": settings | {"definition": "6" * 64},
        "n_shot": {"own_mc": 0},
    }
    then = {"results": {"own_mc": {"acc,none": 0.5, "acc_stderr,none": "N/A"}},
            "n-samples": {"own_mc": {"effective": 6}}}  # fmt: skip
    write_step_json(tmp_path, 5, {**then, "gristmill_tasks": {"own_tag": tag, "own_mc": member}})
    rows = pq.read_table(tmp_path / "eval.parquet").to_pylist()
    assert {r["settings"] for r in rows} == {"dtype=float32, limit=0, max_length=0, num_fewshot=0, seed=1234"}

    def done(shots: int, name: str) -> bool:  # no task index: the tag's entry names its members
        vouched = {"definition": "6" * 64, "documents": None}  # TaskPlan.scoring_as_is: the tag as it is
        cfg = EvalConfig(num_fewshot=shots, bootstrap_iters=0)
        return evaluated(tmp_path, 5, [name], [], None, cfg, {"own_mc": "a" * 64}, None,
                         {"own_tag": ["own_mc"]}, None, lambda tag, member: vouched)  # fmt: skip

    for name in ("own_tag", "own_mc"):
        assert [done(0, name), done(2, name)] == [True, False], name
    alone = {"results": {"own_mc": {"acc,none": 0.75}}, "gristmill_tasks": {"own_mc": {"seconds": 1.0,
             "docs": 6, "settings": settings | {"num_fewshot": 2, "bootstrap_iters": 0}}}}  # fmt: skip
    capsys.readouterr()
    write_step_json(tmp_path, 5, alone)
    out = capsys.readouterr()
    said = "own_mc (recorded without settings of its own, under own_tag's, by an older gristmill; num_fewshot"
    assert f"{said} 0 → 2); these" in out.err + out.out, out
    # recorded before n_shot was (2a90755): only the task index knows the tag's members, the table none
    before = {k: v for k, v in tag.items() if k != "n_shot"}
    write_step_json(tmp_path, 6, {**then, "gristmill_tasks": {"own_tag": before, "own_mc": member}})
    assert [
        r["settings"] for r in pq.read_table(tmp_path / "eval.parquet").to_pylist() if r["step"] == 6
    ] == [None]


def test_a_task_yaml_that_does_not_parse_is_named_not_called_unknown(eval_run, tmp_path, capsys):
    """lm-eval's task index drops a YAML file it cannot parse without a word: a task of one's own with
    a syntax error was "unknown task own_mc" (review R23a M1). The one line names the file and why, and
    not a template that task files include and that mentions the name (review R23d 6)."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    yaml = tasks / "own_mc.yaml"
    yaml.write_text(yaml.read_text().replace('doc_to_text: "{{context}}"', 'doc_to_text: "{{context}}'))
    template = tasks / "_own_template.yaml"  # what own_mc and its kin would include: no task of its own
    template.write_text("# shared by own_mc and its variants\noutput_type: multiple_choice\n")
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: unknown task own_mc ({yaml} does not parse ("), err
    assert "line 11 column 17" in err[0] and "lm-eval skips a task file it cannot read" in err[0], err
    assert template.name not in err[0], err
    assert not (eval_dir(run, 5) / "results.json").exists()


def test_a_task_s_relative_data_files_are_the_working_directory_s_and_said_so(
    eval_run, tmp_path, monkeypatch, capsys
):
    """lm-eval reads a builder's relative data_files from the working directory, not the YAML's folder:
    run from elsewhere, the eval stopped on a FileNotFoundError of a path, or scored another folder's
    file of that name without a word (review RV52a F4). One line naming the working directory; where
    found, the eval's line says where it read them."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    yaml = tasks / "own_mc.yaml"
    yaml.write_text(yaml.read_text().replace(f"{tasks}/", ""))  # own_mc-test.jsonl, relative
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: task own_mc: its data_files own_mc-test.jsonl matches no file in the working directory "
        f"{elsewhere}: lm-eval reads a relative data_files from there, not from the task's YAML folder; give "
        "it as an absolute path"
    ], err
    monkeypatch.chdir(tasks)
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks)]) == 0
    assert (
        f"own_mc reads own_mc-test.jsonl, own_mc-train.jsonl from the working directory {tasks} (lm-eval's "
        "rule, not the YAML's folder)" in capsys.readouterr().err
    )


def _failed_in_one_line(run: Path, args: list[str], capfd) -> tuple[str, str]:
    """`gristmill eval RUN --step 5 ARGS` that exits 2 without a traceback: its last line and stderr."""
    from pipelines.cli import main

    capfd.readouterr()
    assert main(["eval", str(run), "--step", "5", *args]) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1], err


def test_a_task_of_one_s_own_that_fails_while_lm_eval_builds_it_is_one_line(eval_run, tmp_path, capfd):
    """A template of one's own task that raises as lm-eval builds the task was lm-eval's 50-line
    traceback, exit 1 (review R23a M2): one line naming the task, its YAML and the error."""
    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    yaml = tasks / "own_mc.yaml"
    bad = 'doc_to_target: "{{ context.nosuchattr.upper() }}"'
    yaml.write_text(yaml.read_text().replace('doc_to_target: "{{label}}"', bad))
    line, err = _failed_in_one_line(run, _own_args(tasks), capfd)
    log = eval_dir(run, 5) / "eval.log"
    assert line == (
        f"error: task own_mc ({yaml}) failed in lm-eval's task code (building, rendering or scoring it): "
        f"UndefinedError: 'str object' has no attribute 'nosuchattr'; the full traceback is in {log}. Check "
        "the task's YAML and its functions; if they are right, this is a bug: report it with that log"
    ), err
    assert "Traceback (most recent call last)" in log.read_text() and "nosuchattr" in log.read_text()


def test_a_tag_or_group_of_one_s_own_tasks_that_fails_in_lm_eval_s_task_code_is_one_line(
    eval_run, tmp_path, capfd
):
    """A tag of one's own tasks (`tag: my_suite` in their YAMLs) with a bad template was lm-eval's
    55-line traceback, exit 1: only a task's own YAML made it the user's (review R23d 5). A tag or
    group whose members are all the user's own is the user's own too; the line names their YAMLs."""
    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", extra="tag: my_suite\n")
    yaml = tasks / "own_mc.yaml"
    bad = 'doc_to_target: "{{ context.nosuchattr.upper() }}"'
    yaml.write_text(yaml.read_text().replace('doc_to_target: "{{label}}"', bad))
    group = tasks / "my_group.yaml"
    # with a member defined inline, in no index of its own: still the user's group (review R23h M2)
    lines = [x for x in yaml.read_text().splitlines() if x not in ("tag: my_suite", "task: own_mc")]
    inline = "  - task: own_inline\n" + "".join(f"    {line}\n" for line in lines)
    group.write_text("group: my_group\ntask:\n  - own_mc\n" + inline)
    for name, files in (("my_suite", f"{yaml}"), ("my_group", f"{group}, {yaml}")):
        line, err = _failed_in_one_line(run, _own_args(tasks, name), capfd)
        assert line.startswith(
            f"error: task {name} ({files}) failed in lm-eval's task code (building, rendering or scoring "
            "it): UndefinedError: 'str object' has no attribute 'nosuchattr'; the full traceback is in "
        ), err


def test_a_group_s_inline_member_s_documents_are_read_through_its_group(eval_run, tmp_path):
    """A group's member defined inline (`- task: x` with its config) is in no index of its own: its
    documents' sha256 was asked of it by its result's name (`my_group::x`), none came, and the
    decontamination mark took it at its version's word, unchecked (review R23h S1)."""
    from validation.eval import TaskPlan, load_eval_config
    from validation.eval_data import task_documents_sha256

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    own = [x for x in (tasks / "own_mc.yaml").read_text().splitlines() if x != "task: own_mc"]
    inline = "  - task: own_inline\n" + "".join(f"    {line}\n" for line in own)
    (tasks / "my_group.yaml").write_text("group: my_group\ntask:\n" + inline)
    # and a member with overrides (another split) is read as the group builds it, not alone (R23i 1)
    (tasks / "ovr.yaml").write_text("group: ovr\ntask:\n  - task: own_mc\n    test_split: train\n")
    train = tasks / "own_mc-train.jsonl"
    train.write_text("".join(train.read_text().splitlines(keepends=True)[:3]))  # other documents
    cfg = load_eval_config(None, ["device=cpu", f'include_path=["{tasks}"]'], "my_group,ovr")
    plan = TaskPlan(run, cfg)
    member = plan.task_manager.load(["my_group"])["tasks"]["my_group::own_inline"]
    assert plan.documents_sha256("my_group", "my_group::own_inline") == task_documents_sha256(member)
    as_scored = task_documents_sha256(plan.task_manager.load(["ovr"])["tasks"]["own_mc"])
    alone = task_documents_sha256(plan.task_manager.load(["own_mc"])["tasks"]["own_mc"])
    assert plan.documents_sha256("ovr", "own_mc") == as_scored != alone
    # a member only named, misspelt, is no inline task: such a group is not the user's own (R23i 5)
    (tasks / "typo.yaml").write_text("group: typo\ntask:\n  - own_mcc\n")
    plan = TaskPlan(run, load_eval_config(None, ["device=cpu", f'include_path=["{tasks}"]'], "my_group"))
    assert plan.own_yamls("typo") is None and plan.own_yamls("my_group") == [
        (tasks / "my_group.yaml").resolve()
    ]
    # an inline member of a group defined inline in the list: the user's own too (review R23j)
    nested = "  - group: sub\n    task:\n" + "".join(f"  {line}\n" for line in inline.splitlines())
    (tasks / "gig.yaml").write_text("group: gig\ntask:\n" + nested)
    plan = TaskPlan(run, load_eval_config(None, ["device=cpu", f'include_path=["{tasks}"]'], "gig"))
    assert plan.own_yamls("gig") == [(tasks / "gig.yaml").resolve()]


def test_a_task_that_scores_no_document_is_one_line_not_an_empty_table(eval_run, tmp_path, capfd):
    """A group whose `task:` is one string (`task: own_mc`, not a list) is built by lm-eval with no
    member: it printed "0 docs", an empty table and exit 0, and its digest took the string's letters
    for members (review R23k 1). One line now, exit 2; the string is one member's name."""
    from lm_eval.tasks import TaskManager

    from validation.eval_data import task_members

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    (tasks / "gone_group.yaml").write_text("group: gone_group\ntask: own_mc\n")
    tm = TaskManager(include_defaults=False, include_path=[str(tasks)])
    assert task_members(tm, "gone_group") == ["own_mc"]
    line, err = _failed_in_one_line(run, _own_args(tasks, "gone_group"), capfd)
    assert line == (
        "error: task gone_group scored no document: lm-eval built it with none (a group's `task:` must be a "
        "list of its members; a member's data may be empty)"
    ), err


def test_a_model_s_results_lm_eval_cannot_read_on_one_s_own_task_is_not_blamed_on_the_yaml(
    eval_run, tmp_path, capfd, monkeypatch
):
    """A model bug raised in lm-eval's task code (loglikelihood's bare floats, not (float, bool): its
    process_results fails, no gristmill frame left) was one line saying "fix the task's YAML" (review
    R23d 4). The line names the error and eval.log, which holds the traceback, and says it is a bug to
    report if the task is right. The bug is made here, in the model's loglikelihood: the eval is real."""
    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks")
    real = GristmillHFLM.loglikelihood
    monkeypatch.setattr(
        GristmillHFLM, "loglikelihood", lambda self, requests, disable_tqdm=False: [
            ll for ll, _ in real(self, requests, disable_tqdm)
        ]
    )  # fmt: skip
    line, err = _failed_in_one_line(run, _own_args(tasks), capfd)
    log = eval_dir(run, 5) / "eval.log"
    assert line.startswith(f"error: task own_mc ({tasks / 'own_mc.yaml'}) failed in lm-eval's task code "), (
        err
    )
    assert line.endswith(
        f"; the full traceback is in {log}. Check the task's YAML and its functions; if they are right, "
        "this is a bug: report it with that log"
    ), err
    assert "fix the task" not in line and "process_results" in log.read_text()


def test_eval_without_accelerate_is_one_line_naming_the_extra(eval_run, tmp_path):
    """lm-eval's HF model imports accelerate: without it `gristmill eval` ended in a ModuleNotFoundError
    traceback (review R23a M3). One line naming the module and the fix, before any work."""
    run = _copy_run(eval_run[0], tmp_path / "run")
    proc = without_accelerate(["eval", str(run), "--step", "5", *QUICK])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: gristmill eval runs lm-eval, which needs accelerate (its HF model imports it), and "
        "accelerate is not installed: pip install -e '.[eval]' (pyproject.toml's eval extra)"
    ]
    assert not (run / "eval").exists()


def test_the_audit_refuses_an_eval_table_that_is_not_its_results(eval_run, tmp_path, capsys):
    """The audit's `eval` view answered from eval.parquet alone: deleted, `SELECT count(*) FROM eval`
    was 0, exit 0; with a step's eval folder removed, its rows were still answered (review R23a A1).
    A table that is not the results.json files' rows is one line with the fix, and the fix works."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.cli import main
    from training.data.recipe import CONSUMPTION_SCHEMA

    run = _copy_run(eval_run[0], tmp_path / "run")
    pq.write_table(
        pa.Table.from_pylist([], schema=CONSUMPTION_SCHEMA), run / "consumption.parquet"
    )  # trained
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    table = run / "eval.parquet"
    count = ["data", "audit", str(run), "--sql", "SELECT count(*) AS n FROM eval", "--format", "json"]
    capsys.readouterr()
    assert main(count) == 0
    rows = json.loads(capsys.readouterr().out)[0]["n"]
    assert rows == 3  # heldout_ppl's three metrics

    def refused(why: str) -> None:
        assert main(count) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: cannot audit {run}: {table} {why}"), err

    table.unlink()
    refused(f"is missing, but {run / 'eval'}/*/results.json hold scores: write it again from them with "
            f"`gristmill eval {run} --table` (it scores nothing)")  # fmt: skip
    assert main(["eval", str(run), "--table"]) == 0
    capsys.readouterr()
    assert main(count) == 0 and json.loads(capsys.readouterr().out)[0]["n"] == rows
    # a bit flipped in a page: named as damaged, with what rewrites it (review R31b F6)
    flip_a_value_bit(table, "value")
    refused("is unreadable (OSError: could not verify page integrity, CRC checksum verification failed")
    assert main(["eval", str(run), "--table"]) == 0
    written = pq.read_table(table).to_pylist()
    pq.write_table(
        pa.Table.from_pylist([{**written[0], "value": 0.5}, *written[1:]], schema=pq.read_schema(table)),
        table,
    )
    refused(f"does not hold the scores of {run / 'eval'}/*/results.json: write it again")
    assert main(["eval", str(run), "--table"]) == 0
    shutil.rmtree(eval_dir(run, 5))
    refused("holds rows of step 5, whose results.json is gone: delete it (no step has scores now)")
    table.unlink()
    assert main(count) == 0 and json.loads(capsys.readouterr().out)[0]["n"] == 0


def test_the_audit_answers_an_eval_table_written_before_its_newer_columns(eval_run, tmp_path, capsys):
    """The check of eval.parquet against the results.json files compared every column of today's: a
    healthy run's table written before `decontamination` and `merged` were was refused as not holding
    the scores, though the audit's view reads a missing column as null (review R23d 3). Only the
    table's own columns are compared: such a table is answered, one of other scores still refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.cli import main
    from training.data.recipe import CONSUMPTION_SCHEMA

    run = _copy_run(eval_run[0], tmp_path / "run")
    consumption = run / "consumption.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=CONSUMPTION_SCHEMA), consumption, write_page_checksum=True)
    assert main(["eval", str(run), "--step", "5", *QUICK]) == 0
    table = run / "eval.parquet"
    count = ["data", "audit", str(run), "--sql", "SELECT count(*) AS n, count(merged) AS m FROM eval"]
    capsys.readouterr()
    assert main(count) == 0 and "note:" not in capsys.readouterr().err  # as gristmill writes them
    fresh = pq.read_table(table)
    old = fresh.drop(["merged"])  # as written before that column: its rows are no merged weights' scores
    pq.write_table(old, table)  # and before page checksums were (review RV32e F7: read without a word)
    assert main([*count, "--format", "json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out) == [{"n": 3, "m": 0}]  # heldout_ppl's 3 metrics; merged null
    assert got.err.strip().splitlines() == [
        f"note: {table} was written without page checksums: its pages were read as "
        f"they are; it is derived from {run / 'eval'}/*/results.json, which hold the scores: write it "
        f"again from them with `gristmill eval {run} --table` (it scores nothing)"
    ], got.err
    bare = tmp_path / "bare"  # the table alone, beside no config.toml: no dataset's fix (review RV42d)
    bare.mkdir()
    shutil.copy(table, bare / "eval.parquet")
    assert main(["data", "audit", str(bare), "--sql", "SELECT count(*) AS n FROM eval"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        f"note: {bare / 'eval.parquet'} was written without page checksums: its pages were read as they "
        f"are; a training run's file, in {bare}, which has no config.toml: audit the run's own"
    ]
    # without a column whose values the results hold (the marks; the scores themselves): not its rows,
    # though the view would read them as null (review R23g S3)
    for gone in (["decontamination"], ["settings"]):
        pq.write_table(fresh.drop(gone), table)
        assert main(count) == 2, gone
        assert "does not hold the scores" in capsys.readouterr().err, gone
    # without the scores' own columns: no writer's table (review RV32e F3: the columns are checked)
    pq.write_table(fresh.drop(["value", "stderr", "samples"]), table)
    assert main(count) == 2
    err = capsys.readouterr().err
    assert f"{table} is damaged: its columns are not those its writer writes" in err, err
    assert "value (double) missing" in err and f"`gristmill eval {run} --table`" in err, err
    rows = old.to_pylist()
    pq.write_table(pa.Table.from_pylist([{**rows[0], "value": 0.5}, *rows[1:]], schema=old.schema), table)
    assert main(count) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cannot audit {run}: {table} does not hold the scores of {run / 'eval'}/*/results.json: "
        f"write it again from them with `gristmill eval {run} --table` (it scores nothing)"
    ], err


def test_a_task_of_one_s_own_named_like_a_local_task_is_refused(eval_run, tmp_path, capsys):
    """A task YAML under include_path named heldout_ppl was ignored without a word: the local
    heldout_ppl was scored under its name (review R23a A2). The clash is one line naming the file."""
    from pipelines.cli import main

    run = _copy_run(eval_run[0], tmp_path / "run")
    tasks = _own_task(tmp_path / "tasks", name="heldout_ppl")
    capsys.readouterr()
    assert main(["eval", str(run), "--step", "5", *_own_args(tasks, "heldout_ppl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tasks / 'heldout_ppl.yaml'} defines heldout_ppl, the name of one of gristmill's local "
        "tasks (validation/eval_tasks/): rename yours, which would never be scored under it"
    ], err
    assert not (eval_dir(run, 5) / "results.json").exists()


def test_a_hub_task_s_definition_is_the_same_in_every_process():
    """The definition recorded with a task's scores (review R23a S1) names each function by its
    qualname and its module file's sha256 (R23d 1), never by its repr (an address, another in every
    process): two processes, this one and a fresh interpreter, digest hellaswag (a `!function
    process_docs`) alike."""
    import hashlib

    import lm_eval.tasks.hellaswag.utils as utils

    from validation.eval_data import _definition, hub_task_manager, task_definition

    code = (
        "import json; from validation.eval_data import _definition, hub_task_manager, task_definition; "
        "tm = hub_task_manager(['hellaswag']); "
        "print(task_definition(tm, 'hellaswag'), json.dumps(_definition(tm, 'hellaswag', set())))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert other.returncode == 0, other.stderr
    tm = hub_task_manager(["hellaswag"])
    assert len(tm.task_index) < 100  # a task of one family: its family alone, not the ~14k-file index
    here = f"{task_definition(tm, 'hellaswag')} {json.dumps(_definition(tm, 'hellaswag', set()))}\n"
    assert other.stdout == here
    digest, definition = here.split(" ", 1)
    assert len(digest) == 64 and " at 0x" not in definition
    assert json.loads(definition)["process_docs"] == {
        "function": "process_docs",
        "module_sha256": hashlib.sha256(Path(utils.__file__).read_bytes()).hexdigest(),
    }


def test_the_truncation_warning_at_the_model_s_whole_context_advises_no_longer_max_length():
    """At max_length = the model's max_seq_len, the warning advised a longer max_length "up to the
    model's max_seq_len", which it already was (review R24b 3)."""
    info = {"cut_docs": 2, "of_docs": 5, "cut_requests": 2, "requests": 5, "longest": 300}
    results = {"gristmill_tasks": {"heldout_ppl": {**info, "limit": 128, "max_length": 128}}}
    (line,) = task_lines(7, results, 128)
    assert line.endswith(
        "a truncated task (max_length is the model's whole context, 128 tokens: no longer one fits it)"
    ), line
    (line,) = task_lines(7, results, 256, "eval.max_length")
    assert line.endswith("(eval.max_length, up to the model's max_seq_len 256, evaluates more)"), line
