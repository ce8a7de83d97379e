"""Eval stage: real lm-eval runs on the local demo tasks against a tiny exported gristmill model.

The run directory is made here (config.toml + exports/step-N of a tiny random model), because
training one costs more than it proves: the tasks are built from the built dataset's held-out
documents exactly as for a trained run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from training.config import TrainConfig  # noqa: E402
from training.config_loader import load_config, save_config  # noqa: E402
from training.dataset_format import read_dataset_info  # noqa: E402
from training.hf_export import export_hf  # noqa: E402
from training.loader import DocumentTable  # noqa: E402
from training.model import PRESETS, Transformer  # noqa: E402
from training.run_layout import eval_dir, export_dir  # noqa: E402
from validation.eval import EvalConfig, TaskPlan, evaluate_lm  # noqa: E402
from validation.eval_model import GristmillHFLM, in_process_lm  # noqa: E402

SEQ_LEN = 256  # the tiny preset's max_seq_len; the fixture's cloze requests fit in it
CFG = EvalConfig(docs=5, batch_size=4, bootstrap_iters=0)


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
        in_process_lm(models[5], export, batch_size=3, max_length=SEQ_LEN), plan, CFG, True
    )
    for task in ("demo_ppl", "demo_cloze"):
        a, b = _sample_lls(via_export, task), _sample_lls(in_process, task)
        assert a.keys() == b.keys() and len(a) >= 5
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-4), (task, k)
    ppl = via_export["results"]["demo_ppl"]["word_perplexity,none"]
    assert ppl == pytest.approx(in_process["results"]["demo_ppl"]["word_perplexity,none"], rel=1e-5)

    # Stock `--model hf` frames rolling requests with one separator too (the exported tokenizer adds
    # none, lm-eval prepends its prefix token), but its tokenizer call turns a literal
    # "<|endoftext|>" in a document into a second separator: that document's score differs.
    ppl_plan = TaskPlan(run, EvalConfig(tasks=["demo_ppl"], docs=CFG.docs))
    stock = evaluate_lm_by_name(
        ppl_plan, f"pretrained={export},dtype=float32,device=cpu,max_length={SEQ_LEN}"
    )
    texts = [json.loads(line)["text"] for line in (run / "eval" / "data" / "demo_ppl.jsonl").open()]
    a, b = _sample_lls(via_export, "demo_ppl"), _sample_lls(stock, "demo_ppl")
    literal = {k for k in a if "<|endoftext|>" in texts[k[0]]}
    assert literal, "the held-out documents should include the fixture's literal-separator page"
    for k in a:
        assert (
            (a[k] != pytest.approx(b[k], rel=1e-3))
            if k in literal
            else (a[k] == pytest.approx(b[k], rel=1e-5))
        )


def evaluate_lm_by_name(plan: TaskPlan, model_args: str) -> dict:
    from lm_eval import simple_evaluate

    return simple_evaluate(
        model="hf", model_args=model_args, tasks=plan.specs, task_manager=plan.task_manager, bootstrap_iters=0
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
        "dataset_kwargs": {"data_files": {"test": str(data_dir / "demo_cloze.jsonl")}},
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
    data_dir = run / "eval" / "data"
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
    for d in table.split_rows(np.arange(len(rows("demo_ppl")))).tolist():
        ids = table.read(np.array([d]), np.array([0]), table.lengths[d : d + 1].astype(np.int64)).tolist()
        assert ids.count(sep) == 1
        ids.remove(sep)
        expected.append([sep, *ids[: min(SEQ_LEN, len(ids)) - 1]])
    assert sorted(ids for ids in seen if ids[0] == sep) == sorted(expected)
    assert all(sep not in ids[1:] for ids in seen)

    # Multiple choice: [SEP] + context + choice, minus the last token (predicted); a request longer
    # than the window is cut from the left by lm-eval.
    full = [[sep, *enc(d["context"] + " " + c)] for d in rows("demo_cloze") for c in d["choices"]]
    seen = lm.seen["loglikelihood"]
    assert sorted(seen) == sorted(ids[-(SEQ_LEN + 1) :][:-1] for ids in full)
    assert sum(ids[0] == sep for ids in seen) > len(seen) // 2 and all(sep not in ids[1:] for ids in seen)

    # Generation: the prompt (each generate call's first forward) is [SEP] + context; later steps
    # feed one new token at a time through the KV cache.
    prompts = [ids for ids in lm.seen["generate_until"] if len(ids) > 1]
    assert sorted(prompts) == sorted([sep, *enc(d["context"])] for d in rows("demo_cloze"))
    assert all(sep not in ids[1:] for ids in prompts)


def read_dataset_info_path(run: Path) -> Path:
    return Path(load_config(TrainConfig, run / "config.toml").data.dataset)


def test_eval_cli_watch_writes_results_and_the_audit_eval_view_matches_them(built_dataset, tmp_path, capsys):
    from pipelines.cli import main

    run = tmp_path / "run"
    _make_run(run, built_dataset, [5, 10])
    args = ["--set", "docs=5", "bootstrap_iters=0", "device=cpu"]
    assert main(["eval", str(run), "--watch", "--poll", "0.1", "--idle-exit", "0.1", *args]) == 0
    out = capsys.readouterr().out
    assert "demo_cloze" in out and "word_perplexity" in out  # the table of each evaluated step
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
    assert {t for _, t, *_ in expected} == {"demo_ppl", "demo_cloze"}

    sql = 'SELECT step, task, metric, "filter", value FROM eval ORDER BY step'
    assert main(["data", "audit", str(run), "--sql", sql, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["step"], r["task"], r["metric"], r["filter"], r["value"]) for r in rows} == expected
    assert len(rows) == len(expected)


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

    assert main(["eval", str(run), "--tasks", "demo_ppl,hellaswag"]) == 2
    err = capsys.readouterr().err
    assert "task hellaswag needs dataset Rowan/hellaswag from the hub" in err
    assert "HF_DATASETS_CACHE" in err and "Traceback" not in err and "safetensors" not in err
    assert not (run / "eval").exists()  # nothing built, nothing evaluated


def test_task_data_comes_from_held_out_documents_only(built_dataset, tmp_path):
    from validation.eval_data import EvalError, build_task_data

    with pytest.raises(EvalError, match=r"val_fraction = 0\).*train with data.val_fraction > 0"):
        build_task_data(built_dataset, 0.0, tmp_path / "none")
    out = build_task_data(built_dataset, 0.1, tmp_path / "data", max_docs=6)
    texts = [json.loads(line)["text"] for line in (out / "demo_ppl.jsonl").open()]
    train = DocumentTable(built_dataset, split="train", val_fraction=0.1)
    val = DocumentTable(built_dataset, split="val", val_fraction=0.1)
    where = lambda t, n: set(t.split_rows(np.arange(n)).tolist())  # noqa: E731  manifest rows
    assert len(texts) == 6 and not where(val, 6) & where(train, train.documents)
    items = [json.loads(line) for line in (out / "demo_cloze.jsonl").open()]
    assert len(items) >= 6 and {it["label"] for it in items} == {0, 1, 2, 3}
    flat = [" ".join(t.split()) for t in texts]
    for it in items:  # the true sentence follows the context in one held-out document; the others do not
        true = it["choices"][it["label"]]
        (src,) = [t for t in flat if it["context"] + " " + true in t]
        assert len(set(it["choices"])) == 4 and all(c not in src for c in it["choices"] if c != true)
    mtime = (out / "demo_ppl.jsonl").stat().st_mtime_ns
    assert build_task_data(built_dataset, 0.1, out, max_docs=6) == out  # up to date: kept
    assert (out / "demo_ppl.jsonl").stat().st_mtime_ns == mtime
