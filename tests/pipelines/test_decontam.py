"""Decontamination end to end: local lm-eval tasks (YAML + jsonl written here) → `gristmill data
decontam-index` (real lm-eval task objects) → a real build with [decontaminate] (datatrove's
LocalPipelineExecutor, 2 workers) over the fixture corpus with planted copies of task items →
excluded/, dataset.json, the audit → `gristmill eval`'s marks on a tiny exported model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.build import BuildError, build, prepare
from pipelines.cli import main
from pipelines.config import DataConfig
from pipelines.decontam.filter import DecontaminationFilter
from pipelines.decontam.ngram import (
    DecontamIndexError,
    NgramIndex,
    Words,
    _words,
    many_ngram_hashes,
    normalize_words,
    read_manifest,
    tasks_of_detail,
    text_ngram_hashes,
    write_index,
)
from pipelines.sources import FINEWEB_EDU_SCHEMA
from tests.helpers.corpus import fixture_config_text, fixture_texts, write_fixture_corpus
from training.contract.config_loader import load_config
from training.contract.dataset_format import file_sha256, fingerprint, read_dataset_info
from training.contract.errors import GristmillError

pytestmark = [
    pytest.mark.process,  # starts processes: the second tier of `make test`
    pytest.mark.xdist_group("decontam"),  # the decontaminated build made once: every test on one worker
]

pytest.importorskip("lm_eval")

QUIET = dict(log=lambda *a: None)
ROOT = Path(__file__).resolve().parents[2]

CLOZE = [  # gm_cloze: no should_decontaminate, so the context and every choice are indexed
    (
        "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can of oil and "
        "a cloth to polish the great brass lamp before the fishing boats returned.",
        [
            "He lit the lamp and watched the harbour until the last boat was safely tied up.",
            "She sold the lamp.",
            "The stairs collapsed.",
            "Nobody came.",
        ],
    ),
    (
        "In the spring the village school moved its lessons outdoors, and the children measured the "
        "height of the bean plants each morning and wrote the numbers in a shared notebook.",
        [
            "By June the tallest plant had passed the top of the fence and the notebook was full.",
            "The beans were eaten.",
            "It snowed.",
            "The notebook was lost.",
        ],
    ),
    (
        "A retired engineer spent two winters restoring an old steam locomotive in a barn behind his "
        "house, replacing every rivet of the boiler by hand with help from his neighbours.",
        [
            "The engine ran again.",
            "The barn burned down.",
            "When the boiler finally held pressure the whole street came out to hear the whistle blow twice.",
            "He gave up.",
        ],
    ),
    (
        "The bakery on the corner opened at five in the morning so that the night shift workers from the "
        "hospital could buy warm bread and coffee on their way home to sleep.",
        [
            "The owner retired.",
            "Bread was free.",
            "It closed at noon.",
            "Over the years the nurses started leaving notes of thanks pinned to the board by the till.",
        ],
    ),
]
QA = [  # gm_qa: should_decontaminate with a template query: only the question is indexed
    (
        "Which layer of the atmosphere holds most of the ozone that absorbs ultraviolet light from the sun "
        "before it reaches the surface of the earth?",
        [
            "The stratosphere, between roughly fifteen and thirty five kilometres above the ground on "
            "most days of the year.",
            "The troposphere.",
            "The mesosphere.",
            "The exosphere.",
        ],
        0,
    ),
    (
        "Why do deciduous trees in temperate forests drop their leaves in autumn when the days become "
        "shorter and the nights grow colder?",
        [
            "To save water and energy through the winter.",
            "To grow taller.",
            "Because birds eat them.",
            "To attract insects.",
        ],
        0,
    ),
    (
        "What simple machine is formed when a plank rests on a log so that a small push on one end lifts a "
        "heavy rock sitting on the other end?",
        ["A pulley.", "A lever.", "A screw.", "A wedge."],
        1,
    ),
]


def write_tasks(folder: Path) -> Path:
    """Two local lm-eval tasks in `folder`: gm_cloze (context + choices indexed) and gm_qa
    (doc_to_decontamination_query, a template: lm-eval 0.4.13's own method raises on it)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = {
        "gm_cloze": [{"context": c, "choices": ch, "label": 0} for c, ch in CLOZE],
        "gm_qa": [{"question": q, "choices": ch, "label": lab} for q, ch, lab in QA],
    }
    for name, items in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    common = 'dataset_path: json\ntest_split: test\noutput_type: multiple_choice\ntarget_delimiter: " "\n'
    (folder / "gm_cloze.yaml").write_text(
        f"task: gm_cloze\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'gm_cloze.jsonl'}\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        "metadata:\n  version: 1.0\n"
    )
    (folder / "gm_qa.yaml").write_text(
        f"task: gm_qa\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'gm_qa.jsonl'}\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\nshould_decontaminate: true\n'
        'doc_to_decontamination_query: "Question: {{question}}\\nAnswer:"\nmetadata:\n  version: 1.0\n'
    )
    return folder


def _page(i: int, inserted: str) -> str:
    """A fixture page (Python docs prose) with `inserted` in its middle."""
    text = fixture_texts(40)[i]
    cut = text.index(" ", len(text) // 2)
    return f"{text[:cut]} {inserted} {text[cut:]}"


def planted_rows() -> tuple[list[dict], dict[str, tuple[str, int] | None]]:
    """Rows of the planted file and, per id, the (task, document) that must exclude it (None: kept)."""
    qa2 = QA[2][0].upper().replace(" ", " — ", 3)  # case and punctuation differ: normalised away
    cloze0 = CLOZE[0][0].split()
    plants = {
        "plant-whole": (f"{CLOZE[1][0]} {CLOZE[1][1][0]}", ("gm_cloze", 1)),
        "plant-embedded-question": (_page(3, qa2), ("gm_qa", 2)),
        "plant-embedded-choice": (_page(5, CLOZE[2][1][2]), ("gm_cloze", 2)),
        "near-miss-12-words": (_page(7, " ".join(QA[0][0].split()[:12]) + " and something else"), None),
        "near-miss-split": (_page(9, " ".join(cloze0[:7]) + " (see above) " + " ".join(cloze0[7:14])), None),
        "qa-answer-only": (_page(11, QA[0][1][0]), None),  # gm_qa indexes its question only
        # both tasks' texts: removed for each (named by the first match, the other counted too: R23b S1)
        "plant-two-tasks": (_page(13, f"{QA[1][0]} Later: {CLOZE[3][0]}"), ("gm_qa", 1)),
    }
    rows = []
    for i, (rid, (text, _)) in enumerate(plants.items()):
        rows.append(
            {"text": text, "id": rid, "url": f"https://example.org/{rid}", "dump": "CC-MAIN-2024-10",
             "score": 3.5, "int_score": 3, "language": "en", "language_score": 0.9, "token_count": i}
        )  # fmt: skip
    return rows, {rid: want for rid, (_, want) in plants.items()}


@pytest.fixture(scope="module")
def decontam(build_fixture, tmp_path_factory):
    """The fixture corpus plus the planted file, built with [decontaminate] of both tasks."""
    _, tokenizer, _ = build_fixture
    root = tmp_path_factory.mktemp("decontam")
    corpus = write_fixture_corpus(root / "corpus")
    rows, expected = planted_rows()
    pq.write_table(pa.Table.from_pylist(rows, schema=FINEWEB_EDU_SCHEMA), corpus / "part-02.parquet")
    tasks = write_tasks(root / "tasks")
    config = root / "data.toml"
    config.write_text(
        fixture_config_text(corpus, tokenizer, root / "dataset")
        + f'\n[decontaminate]\ntasks = ["gm_cloze", "gm_qa"]\nngram = 13\ninclude_path = ["{tasks}"]\n'
    )
    cfg = load_config(DataConfig, config)
    result = build(cfg, **QUIET)
    assert result.ok, result.report
    return root, Path(cfg.output), tasks, config, expected


def excluded_rows(out: Path) -> list[dict]:
    return pa.concat_tables(
        [pq.read_table(p) for p in sorted((out / "excluded").glob("*.parquet"))]
    ).to_pylist()


def test_exactly_the_planted_documents_are_excluded_naming_task_and_document(decontam, capsys):
    _, out, _, _, expected = decontam
    dropped = {r["id"]: r for r in excluded_rows(out) if r["filter"] == "decontaminate"}
    want = {rid: w for rid, w in expected.items() if w is not None}
    assert set(dropped) == set(want), dropped.keys()
    for rid, (task, doc) in want.items():
        assert dropped[rid]["reason"].startswith(f'13-gram of {task} test doc {doc}: "'), dropped[rid]
    # the matching words, normalised, are those of the task's text
    reason = dropped["plant-embedded-question"]["reason"]
    quoted = reason.split('"')[1]
    assert " ".join(normalize_words(QA[2][0])).find(quoted) >= 0 and len(quoted.split()) == 13
    kept_ids = {
        r["id"] for p in sorted((out / "manifest").glob("*.parquet")) for r in pq.read_table(p).to_pylist()
    }
    assert {rid for rid, w in expected.items() if w is None} <= kept_ids  # shorter than 13: not a match

    info = read_dataset_info(out)
    entry = info["decontaminate"]
    assert info["excluded_by_filter"]["decontaminate"] == 4 == info["decontaminate"]["removed"]
    assert dropped["plant-two-tasks"]["reason"].endswith("; also gm_cloze)"), dropped["plant-two-tasks"]
    assert entry["ngram"] == 13 and entry["requested"] == ["gm_cloze", "gm_qa"]
    assert entry["index_sha256"] == read_manifest(out / "decontam", verify=True)["sha256"]
    assert {
        t["name"]: (t["split"], t["documents"], t["documents_without_ngrams"], t["removed"])
        for t in entry["tasks"]
    } == {
        "gm_cloze": ("test", 4, 0, 3),
        "gm_qa": ("test", 3, 0, 2),
    }
    # a group of both counts documents, not task-document pairs: the page holding both once (R23e S1)
    assert entry["removed_together"] == [{"tasks": ["gm_cloze", "gm_qa"], "documents": 1}]
    from validation.eval_results import decontamination_marks

    results = {"results": {"both": {}}, "versions": {"gm_cloze": 1.0, "gm_qa": 1.0},
               "group_subtasks": {"both": ["gm_cloze", "gm_qa"]}}  # fmt: skip
    marks = decontamination_marks(results, [{"source": "data", "dataset": str(out), "decontaminate": entry}])
    assert marks["both"]["mark"] == "decontaminated (4 docs removed)", marks  # 3 + 2 - 1, the 4 excluded
    assert fingerprint(info) != fingerprint({k: v for k, v in info.items() if k != "decontaminate"})

    # the drops report's rows per task are dataset.json's `removed`: plant-two-tasks under both (R27a S2)
    assert main(["data", "audit", str(out), "--report", "drops", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # (the SQL parses Match.detail as tasks_of_detail does: held together here, not by literals: R27d m3)
    per_task = {r["reason"]: r["documents"] for r in report if r["filter"] == "decontaminate"}
    assert per_task == {
        f'N-gram of {t["name"]} {t["split"]} doc N: "…"': t["removed"] for t in entry["tasks"]
    }
    assert sorted(per_task.values()) == [2, 3], report  # gm_qa, gm_cloze: plant-two-tasks under both


def test_an_ngram_two_tasks_share_removes_a_document_for_both(tmp_path):
    """Review R23b S1: the index kept an n-gram once, for the first task holding it, so a training
    document holding a passage two tasks share was counted for the first alone, and the other task's
    eval mark said "0 docs removed". Kept once per task now; the reason names every task."""
    shared = " ".join(f"w{i}" for i in range(13))
    # names as lm-eval's tmmluplus_education_(profession_level): read back whole (trial RV64b S1)
    texts = {"a_(x)": [shared, "one two three four five six seven eight nine ten eleven twelve thirteen"],
             "b_(y)": ["nothing of a here at all just b alone and a few more words", shared]}  # fmt: skip
    hashes, docs, entries = [], [], []
    for name, items in texts.items():
        h, owner = many_ngram_hashes(items, 13)
        hashes.append(h)
        docs.append(owner.astype(np.uint32))
        entries.append({"name": name, "split": "test", "version": 1, "documents": 2, "ngrams": len(set(h))})
    write_index(tmp_path, 13, entries, hashes, docs)
    index = NgramIndex(tmp_path)
    match = index.first_match(f"a page that quotes {shared} and goes on")
    assert (match.task, match.doc, match.also) == ("a_(x)", 0, ("b_(y)",)), match
    detail = match.detail()
    assert tasks_of_detail(detail) == ["a_(x)", "b_(y)"] and detail.endswith("(also b_(y))"), detail
    only_a = index.first_match("one two three four five six seven eight nine ten eleven twelve thirteen")
    assert (only_a.task, only_a.also) == ("a_(x)", ()) and tasks_of_detail(only_a.detail()) == ["a_(x)"]
    assert tasks_of_detail("81 chars < min_chars 100") == []


def test_index_command_is_deterministic_and_lookups_follow_the_normaliser(
    decontam, tmp_path, capsys, monkeypatch
):
    _, out, tasks, _, _ = decontam
    index = tmp_path / "index"
    argv = ["data", "decontam-index", "--tasks", "gm_qa,gm_cloze", "--include-path", str(tasks)]
    assert main([*argv, "--out", str(index)]) == 0
    assert "gm_cloze  test" in capsys.readouterr().out
    # "" wrote into the working directory, over a manifest.json there; a dataset's or a run's directory
    # got the index's files beside its own (review R22d S2)
    monkeypatch.chdir(tmp_path)  # where "" wrote
    assert main([*argv, "--out", ""]) == 2
    assert capsys.readouterr().err.strip() == 'error: --out "": name a path'  # a required option
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {out} holds dataset.json: a dataset; give the index a directory of its own"
    )
    # one writer of a folder at a time: two into one left one's n-grams beside the other's manifest,
    # which verified (trial RV60b 2); a file for a folder is one line, no traceback (RV60b 6)
    from tests.helpers.lock_holder import held_elsewhere

    with held_elsewhere(index / ".build.lock"):
        assert main([*argv, "--out", str(index)]) == 2
        assert f"`data decontam-index` is writing {index}; wait for it to finish" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("")
    assert main([*argv, "--out", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {tmp_path / 'a-file'} cannot be a directory: {tmp_path / 'a-file'} is a file; set "
        "`--out` to a directory path"
    )
    manifest = read_manifest(index, verify=True)
    assert manifest["sha256"] == read_manifest(out / "decontam")["sha256"]  # task order does not matter
    # gm_qa indexes its question only (its own doc_to_decontamination_query), gm_cloze every text
    qa = next(t for t in manifest["tasks"] if t["name"] == "gm_qa")
    assert qa["ngrams"] == sum(len(normalize_words(f"Question: {q}\nAnswer:")) - 12 for q, _, _ in QA)

    idx = NgramIndex(index)
    question = QA[1][0]
    assert idx.first_match(f"Intro. {question.upper()} Outro.").doc == 1
    words = question.split()
    assert idx.first_match(" ".join(words[:12])) is None
    assert idx.first_match(" ".join(words[1:14])) is not None
    # what renders as the item matches it: fullwidth letters, soft hyphens inside words, a ligature,
    # decomposed accents (each hashed as other words before: the page was kept)
    wide = "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in question)
    assert idx.first_match(f"Intro. {wide} Outro.").doc == 1
    assert idx.first_match(" ".join(w[:2] + "\u00ad" + w[2:] if len(w) > 4 else w for w in words)).doc == 1
    assert normalize_words("the \ufb01rst \ufb02oor") == ["the", "first", "floor"]  # ligatures ﬁ, ﬂ
    math = "\U0001d413\U0001d407\U0001d404 \u210d\U0001d556llo"  # 𝐓𝐇𝐄 ℍ𝕖llo: no lowercase of their own
    assert normalize_words(math) == ["the", "hello"]
    nfc = "the naïve café owner in zürich reopened the façade"
    assert normalize_words(unicodedata.normalize("NFD", nfc)) == normalize_words(nfc) == nfc.split()
    # the vectorised split equals the regex definition on Unicode text, and so do the hashes
    text = "Ünïcode — “quoted” text_with_underscores, ß İstanbul 42nd 日本語 über-cool x"
    w = Words.of(text)
    got = [w.chars[a:b].tobytes().decode("utf-32-le") for a, b in zip(w.starts, w.ends)]
    assert got == normalize_words(text)
    assert np.array_equal(text_ngram_hashes(text, 3), text_ngram_hashes(" ".join(normalize_words(text)), 3))
    # combining marks are part of their words: Devanagari's and Tamil's vowel signs and viramas split
    # कातिब and किताब into the same words क, त, ब, and distinct texts shared n-grams (trial RV62h 1)
    indic = "कातिब ने हिन्दी में किताब लिखी और தமிழ் பாடம் படித்தார்"
    w = Words.of(indic)
    assert [w.chars[a:b].tobytes().decode("utf-32-le") for a, b in zip(w.starts, w.ends)] == indic.split()
    assert normalize_words(indic) == indic.split()
    swapped = indic.replace("कातिब", "किताब", 1)
    shared = set(text_ngram_hashes(indic, 3)) & set(text_ngram_hashes(swapped, 3))
    assert len(shared) == len(indic.split()) - 3  # all but the one 3-gram holding the first word
    # a mark after no letter is no word: a variation selector (❤️, category Mn) made one, and a page
    # with ❤️ for the item's ❤ shared half its n-grams (review RV63d 1)
    assert normalize_words("I love \u2764\ufe0f New York") == normalize_words("I love \u2764 New York")
    assert normalize_words(" \u0301x 1\ufe0f\u20e3 1") == ["x", "1", "1"]
    # and the vectorised split is the regex's on every codepoint: after a letter, doubled, after a space
    # and before a letter (the numpy table and the regex class are built apart)
    every = "".join(f"a{chr(c)}{chr(c)} {chr(c)}b " for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    w = Words.of(every, normal=True)
    split = [w.chars[a:b].tobytes().decode("utf-32-le", "surrogatepass") for a, b in zip(w.starts, w.ends)]
    assert split == _words().findall(every)
    texts = [text, "two words", "İİ lower() lengthens this one", "", QA[0][0]]  # no n-gram spans two texts
    hashes, owner = many_ngram_hashes(texts, 3)
    assert np.array_equal(hashes, np.concatenate([text_ngram_hashes(t, 3) for t in texts]))
    assert owner.tolist() == [i for i, t in enumerate(texts) for _ in range(len(text_ngram_hashes(t, 3)))]


def test_a_task_file_replaced_under_its_old_mtime_is_indexed_as_it_is_now(tmp_path, capsys):
    """datasets keys a local file's cache on its path and mtime: a task file replaced by a new release
    under its old mtime (cp -p, rsync -a, tar x) was indexed from the cached old rows, and a page quoting
    the new item was kept (review RV50b F1). The index reads such a task per content, as the eval does."""
    tasks = write_tasks(tmp_path / "tasks")
    argv = ["data", "decontam-index", "--tasks", "gm_qa", "--include-path", str(tasks), "--out"]
    assert main([*argv, str(tmp_path / "before")]) == 0
    data = tasks / "gm_qa.jsonl"
    st = data.stat()
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    new = (
        "Which purple elephant danced across the frozen lake while seven orange penguins sang loudly at dawn?"
    )
    data.write_text(
        "".join(json.dumps({**r, "question": new} if i == 0 else r) + "\n" for i, r in enumerate(rows))
    )
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert main([*argv, str(tmp_path / "after")]) == 0
    capsys.readouterr()
    assert NgramIndex(tmp_path / "before").first_match(new) is None
    assert NgramIndex(tmp_path / "after").first_match(f"Intro. {new} Outro.").doc == 0
    assert read_manifest(tmp_path / "after")["sha256"] != read_manifest(tmp_path / "before")["sha256"]
    # a task naming its own cache_dir is read from that cache, keyed as above: refused, as the eval
    # refuses it (it was indexed from there: review RV50b)
    yaml = tasks / "gm_qa.yaml"
    yaml.write_text(
        yaml.read_text().replace("dataset_kwargs:\n", f"dataset_kwargs:\n  cache_dir: {tmp_path}/own\n")
    )
    assert main([*argv, str(tmp_path / "own-cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: task gm_qa reads local files alone and names its own dataset_kwargs cache_dir "
        f"{tmp_path}/own: datasets keys a local file's cache there by path and mtime, so a file replaced "
        "under its old mtime would be scored from the old rows; remove cache_dir (gristmill caches such a "
        "task's documents per content under HF_DATASETS_CACHE)"
    ), err
    assert not (tmp_path / "own").exists()


def test_a_task_name_the_exclusion_records_cannot_name_back_is_refused(decontam, tmp_path, capsys):
    """A task named "gm qa" (a space): its documents were removed, and dataset.json counted 0 for it,
    which the eval's mark says, as excluded/'s reasons name it in words that read back as no task
    (trial RV64b S1). Refused in one line: by decontam-index, and in an index written before."""
    from training.contract.integrity import sealed

    tasks = write_tasks(tmp_path / "tasks")
    yaml = tasks / "gm_qa.yaml"
    yaml.write_text(yaml.read_text().replace("task: gm_qa", "task: gm qa", 1))
    out = tmp_path / "index"
    assert (
        main(["data", "decontam-index", "--tasks", "gm qa", "--include-path", str(tasks), "--out", str(out)])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: task 'gm qa': its name holds whitespace, which the build's") and (
        "\n" not in err
    ), err
    assert not (out / "manifest.json").exists()
    shutil.copytree(decontam[1] / "decontam", out, dirs_exist_ok=True)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tasks"][0]["name"] = "gm (cloze)"
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    (out / "manifest.json").write_text(json.dumps(sealed(body, "manifest_sha256")))
    with pytest.raises(GristmillError, match=r"task 'gm \(cloze\)': its name holds whitespace"):
        read_manifest(out)


def test_every_text_a_task_scores_is_indexed_whatever_its_shape(tmp_path, capsys):
    """A multiple-input task (xwinograd: doc_to_text an int, the choices the contexts, the target the
    scored continuation) had its continuation left out; a doc_to_decontamination_query naming a list field
    was dropped whole, with advice to lower --ngram (trial RV62h 2, 3). A document giving no text is
    counted and said; a task none of whose documents gives text is refused."""
    fill = "the trophy would not fit in the brown suitcase because it was far too large for the bag"
    query = ["a first passage of the list with more than enough words for one n-gram here",
             "and a second passage in that list with plenty of distinct words to hash as well"]  # fmt: skip
    rows = {
        "gm_fill": {"option1": "The trophy", "option2": "The suitcase", "answer": "1", "after": fill},
        "gm_list": {"passages": query, "label": 0, "n": 7},
    }
    common = "dataset_path: json\ntest_split: test\noutput_type: multiple_choice\nmetadata:\n  version: 1.0\n"
    for name, row in rows.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    with (tmp_path / "gm_list.jsonl").open("a") as f:  # a row whose field is null: counted, not refused
        f.write(json.dumps({"passages": None, "label": 0, "n": 8}) + "\n")
    files = {n: f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / f'{n}.jsonl'}\n" for n in rows}
    (tmp_path / "gm_fill.yaml").write_text(
        f'task: gm_fill\n{common}{files["gm_fill"]}doc_to_text: "{{{{answer | int - 1}}}}"\n'
        'doc_to_choice: "{{[option1, option2]}}"\ndoc_to_target: after\n'
    )
    listed = f"task: gm_list\n{common}{files['gm_list']}doc_to_text: x\ndoc_to_choice: [a, b]\n"
    listed += "doc_to_target: label\nshould_decontaminate: true\ndoc_to_decontamination_query: "
    (tmp_path / "gm_list.yaml").write_text(listed + "passages\n")
    opts = ["--include-path", str(tmp_path), "--ngram", "8", "--out"]
    assert main(["data", "decontam-index", "--tasks", "gm_fill,gm_list", *opts, str(tmp_path / "i")]) == 0
    assert re.search(  # the progress lines' terminal: stderr
        r"\[decontam-index\] gm_list: 2 documents, \d+ 8-grams; 1 give no text at all \(counted without "
        r"n-grams; the first: document 1\)\n",
        capsys.readouterr().err,
    )
    index = NgramIndex(tmp_path / "i")
    assert (index.first_match(f"Intro. {fill} Outro.").task, index.first_match(query[1]).task) == (
        "gm_fill",
        "gm_list",
    )
    assert [t["documents_without_ngrams"] for t in read_manifest(tmp_path / "i")["tasks"]] == [0, 1]
    # an index replaced by another is said to be (it was replaced in silence: trial RV62h); the same, not;
    # one of an older normaliser too, which the reader refuses (review RV63d 2)
    was = read_manifest(tmp_path / "i")["sha256"]
    for tasks, note in (("gm_fill,gm_list", False), ("gm_fill", True), ("gm_fill,gm_list", True)):
        if tasks == "gm_fill":
            manifest = json.loads((tmp_path / "i" / "manifest.json").read_text())
        else:
            manifest = {**json.loads((tmp_path / "i" / "manifest.json").read_text()), "normalizer": "old/1"}
            (tmp_path / "i" / "manifest.json").write_text(json.dumps(manifest))
        assert main(["data", "decontam-index", "--tasks", tasks, *opts, str(tmp_path / "i")]) == 0
        out = capsys.readouterr().out
        assert ("note: this replaced" in out) == note, out
        now = read_manifest(tmp_path / "i")["sha256"]
        if note:
            assert out.splitlines()[-1] == (
                f"note: this replaced the index {tmp_path / 'i'} held (sha256 {manifest['sha256']}, "
                f"8-grams of {', '.join(t['name'] for t in manifest['tasks'])}); a recipe that names it by "
                f"decontaminate.index_sha256 now needs the new one, {now}"
            )
    assert now == was
    (tmp_path / "gm_list.yaml").write_text(listed + "n\n")  # an int field: no document gives text
    assert main(["data", "decontam-index", "--tasks", "gm_list", *opts, str(tmp_path / "j")]) == 2
    assert capsys.readouterr().err == (
        "error: task gm_list: no evaluation document gives text to index (its doc_to_decontamination_query "
        "names no string or list of strings); point it at the documents' text\n"
    )


def test_a_template_s_own_words_never_count_a_short_document_as_checked(tmp_path, capsys):
    """Trial RV68c F1: arc's "Question: {{question}}\nAnswer:" made an 11-word question 13 words, so it
    was counted as checked at n = 13 and the eval called the task decontaminated, while a page quoting the
    question plainly trained. A document is checked when its own text, without a template's words, has an
    n-gram; the framed n-grams are indexed as before (the index's files are the same)."""
    short = "Which gas do green plants take from the air to make food?"  # 12 words
    long = "Which layer of the atmosphere holds most of the ozone that absorbs light from the sun?"  # 16
    rows = "".join(
        json.dumps({"question": q, "choices": ["yes", "no"], "label": 0}) + "\n" for q in (short, long)
    )
    common = "dataset_path: json\ntest_split: test\noutput_type: multiple_choice\nmetadata:\n  version: 1.0\n"
    frame = '"Question: {{question}}\\nAnswer:"'
    for name, keys in (  # the query of should_decontaminate, and the prompt of a task without it
        (
            "gm_arc",
            f"doc_to_text: {frame}\nshould_decontaminate: true\ndoc_to_decontamination_query: {frame}\n",
        ),
        ("gm_prompt", f"doc_to_text: {frame}\n"),
    ):
        (tmp_path / f"{name}.jsonl").write_text(rows)
        (tmp_path / f"{name}.yaml").write_text(
            f"task: {name}\n{common}dataset_kwargs:\n  data_files:\n    test: {tmp_path / f'{name}.jsonl'}\n"
            f'{keys}doc_to_choice: "{{{{choices}}}}"\ndoc_to_target: "{{{{label}}}}"\n'
        )
    out = tmp_path / "i"
    assert main(["data", "decontam-index", "--tasks", "gm_arc,gm_prompt", "--include-path", str(tmp_path),
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert [t["documents_without_ngrams"] for t in read_manifest(out)["tasks"]] == [1, 1], printed
    assert (
        "note: evaluation documents with no 13-gram: 2 (every text under 13 words, its template's own "
        in printed
    )
    index = NgramIndex(out)
    assert index.first_match(f"Intro. Question: {short}\nAnswer: carbon dioxide. Outro.") is not None
    assert index.first_match(f"Intro. {long} Outro.") is not None
    assert index.first_match(f"Intro. {short} Carbon dioxide. Outro.") is None  # as counted: unchecked
    # two values with only punctuation between them are one text a page may quote whole (counted
    # checked: it matches); a target's template words count no more than a prompt's (review RV68d 3, 4)
    a, b = "the quick brown fox jumps over the lazy", "dog while seven tired cats watch from afar"  # 8 each
    files = {
        name: f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / f'{name}.jsonl'}\n"
        for name in ("gm_pair", "gm_gen")
    }
    for name in files:
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"a": a, "b": b, "label": 0}) + "\n")
    (tmp_path / "gm_pair.yaml").write_text(
        f'task: gm_pair\n{common}{files["gm_pair"]}doc_to_text: "{{{{a}}}}, {{{{b}}}}"\n'
        'doc_to_choice: ["yes", "no"]\ndoc_to_target: "{{label}}"\n'
    )
    (tmp_path / "gm_gen.yaml").write_text(
        f"task: gm_gen\n{common.replace('multiple_choice', 'generate_until')}{files['gm_gen']}"
        'doc_to_text: "Q: {{a}}"\ndoc_to_target: "The answer to this question is: {{a}}"\n'
    )
    out = tmp_path / "j"
    assert main(["data", "decontam-index", "--tasks", "gm_pair,gm_gen", "--include-path", str(tmp_path),
                 "--out", str(out)]) == 0  # fmt: skip
    assert {t["name"]: t["documents_without_ngrams"] for t in read_manifest(out)["tasks"]} == {
        "gm_gen": 1,
        "gm_pair": 0,
    }, capsys.readouterr()
    assert NgramIndex(out).first_match(f"Intro. {a} {b}. Outro.") is not None


def test_an_index_written_into_a_task_s_data_folder_is_refused(tmp_path, capsys):
    """A task read from a folder without data_files reads every file datasets finds there: an index
    written into it (its manifest.json, …) was that task's rows at the next read, as the eval's run
    directory would be (the eval refused that one only: review RV52c)."""
    tasks = write_tasks(tmp_path / "tasks")
    data = tmp_path / "qa"
    data.mkdir()
    shutil.move(tasks / "gm_qa.jsonl", data / "test.jsonl")
    yaml = tasks / "gm_qa.yaml"
    text = yaml.read_text().replace("dataset_path: json", f"dataset_path: {data}")
    yaml.write_text(text.replace(f"dataset_kwargs:\n  data_files:\n    test: {tasks / 'gm_qa.jsonl'}\n", ""))
    assert "data_files" not in yaml.read_text()
    argv = ["data", "decontam-index", "--tasks", "gm_qa", "--include-path", str(tasks), "--out"]
    assert main([*argv, str(data / "index")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: task gm_qa reads dataset_path {data} without data_files, and the index's --out "
        f"{data / 'index'} lies in it: datasets would take its files (manifest.json, …) for rows; give "
        f"gm_qa dataset_kwargs: data_files (its files, relative to {data}) or give --out outside it\n"
    ), err
    assert main([*argv, str(tmp_path / "index")]) == 0  # the same task, its index outside its folder
    assert read_manifest(tmp_path / "index")["tasks"][0]["documents"] == len(QA)


def test_an_index_that_cannot_be_written_is_one_line(decontam, tmp_path, capsys, monkeypatch):
    """decontam-index's --out where its files cannot be written (here a folder in ngrams.npy's place; a
    full disk the same): a chained traceback (trial RV64b T2). A build's temporary index where $TMPDIR
    cannot hold it: the line named the output, which was never written (RV64b M1)."""
    import tempfile

    _, _, tasks, config, _ = decontam
    out = tmp_path / "index"
    (out / "ngrams.npy").mkdir(parents=True)
    argv = ["data", "decontam-index", "--tasks", "gm_qa", "--include-path", str(tasks), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1].startswith(f"error: cannot write {out}") and len([e for e in err if "Traceback" in e]) == 0
    ), err
    # a task file it reads, not --out, when that is what cannot be read (review RV64d 3)
    shutil.rmtree(out)
    bad = tmp_path / "include"
    (bad / "bad.yaml").mkdir(parents=True)
    assert (
        main(["data", "decontam-index", "--tasks", "gm_qa", "--include-path", str(bad), "--out", str(out)])
        == 2
    )
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(f"error: cannot read {bad / 'bad.yaml'}: ") and "--include-path" in said, said
    # a folder that is not there, in the words it was given in: the flag, the recipe's key (it said
    # "include_path", eval's key, for both: note of the seventieth session)
    nowhere = tmp_path / "nowhere"
    argv[argv.index(str(tasks))] = str(nowhere)
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert said == f"error: --include-path {nowhere} is not a directory (of lm-eval task YAML files)\n", said
    sets = [f"output={tmp_path / 'ds'}", f'decontaminate.include_path=["{nowhere}"]']
    with pytest.raises(GristmillError, match=f"^decontaminate.include_path {nowhere} is not a directory"):
        prepare(load_config(DataConfig, config, sets), **QUIET)
    # not a recipe's `~/tasks` that is there (its KeptPath keeps the `~`), nor the folder of an index
    # given, which is not read (review RV77c 1, 2)
    from pipelines.config import DecontaminateConfig
    from pipelines.decontam.index import stage_index
    from validation.eval_data import check_include_path

    monkeypatch.setenv("HOME", str(tasks.parent))
    check_include_path([f"~/{tasks.name}"], "decontaminate.include_path")
    given = DecontaminateConfig(
        ["gm_cloze", "gm_qa"], index=str(decontam[1] / "decontam"), include_path=[nowhere]
    )
    assert stage_index(given, log=lambda *a: None) is not None
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))
    with pytest.raises(BuildError) as e:
        prepare(load_config(DataConfig, config, [f"output={tmp_path / 'ds'}"]), **QUIET)
    assert str(e.value).startswith(
        f"cannot write the decontamination index into {tmp_path / 'no-such-tmp'} (the temporary folder, "
        "$TMPDIR)"
    ), e.value


def test_a_killed_builds_temporary_index_is_removed_by_the_next(decontam, tmp_path, monkeypatch):
    """kill -9 of a build while it indexed its tasks left its temporary index in $TMPDIR for good (a
    whole index each: trial RV64b M2). The next build removes those of its host whose process is gone; a
    live process's, and another host's, are kept."""
    import tempfile

    from pipelines.decontam.index import STAGING, discard_staged, stage_index
    from training.contract.lifetime import host

    _, _, _, config, _ = decontam
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    mine, pid = f"{STAGING}{host()}-", gone.stdout.strip()
    # another host's (a $TMPDIR on a shared filesystem): never judged dead here
    names = (f"{mine}{pid}-x", f"{mine}{os.getpid()}-y", f"{STAGING}elsewhere-{pid}-z")
    dead, alive, other = (tmp_path / n for n in names)
    for folder in (dead, alive, other):
        folder.mkdir()
        (folder / "ngrams.npy").write_bytes(b"0" * 64)
    staged = stage_index(load_config(DataConfig, config).decontaminate, log=lambda *a: None)
    with discard_staged(staged):
        assert staged.folder.name.startswith(f"{mine}{os.getpid()}-")
    assert not dead.exists() and alive.is_dir() and other.is_dir() and not staged.folder.exists()


def test_bad_index_settings_are_one_line_errors(decontam, tmp_path):
    """A missing, cut-off or mismatched index is one line before any task runs; a rerun into the
    dataset with another index (here an 8-gram one, prebuilt with `index = DIR`) is refused, naming it."""
    root, out, tasks, config, _ = decontam
    with_index = lambda index, *more: load_config(DataConfig, config, [f"decontaminate.index={index}", *more])  # noqa: E731
    fresh = f"output={json.dumps(str(tmp_path / 'fresh'))}"  # no copy of an index to read instead
    with pytest.raises(GristmillError, match="does not exist; build one with `gristmill data decontam-index"):
        prepare(with_index(tmp_path / "none", fresh), **QUIET)
    index = tmp_path / "index"
    shutil.copytree(out / "decontam", index)
    with pytest.raises(
        BuildError, match=r"holds 13-grams; set ngram = 13 or rebuild the index with --ngram 8"
    ):
        prepare(with_index(index, "decontaminate.ngram=8"), **QUIET)
    with pytest.raises(BuildError, match=r"was built for \['gm_cloze', 'gm_qa'\]"):
        prepare(with_index(index, 'decontaminate.tasks=["gm_qa"]'), **QUIET)
    (index / "ngrams.npy").write_bytes((index / "ngrams.npy").read_bytes()[:-8])
    with pytest.raises(GristmillError, match=r"do not match the sha256 in manifest.json"):
        prepare(with_index(index), **QUIET)
    # the manifest's n edited to the recipe's: it built with 8-grams the index never held, matching
    # nothing, and recorded the dataset as decontaminated (trial RV60b 3)
    shutil.copyfile(out / "decontam" / "ngrams.npy", index / "ngrams.npy")  # the n-grams as before
    sealed = json.loads((index / "manifest.json").read_text())
    edited = json.dumps({**sealed, "ngram": 8}, indent=1)
    unsealed = {k: v for k, v in sealed.items() if k != "manifest_sha256"} | {"ngram": 8}
    # the format from before the seal declared with the edit: no such index holds this normaliser
    # (trial RV64b S2), and the build decontaminated nothing
    older = json.dumps(unsealed | {"format": "gristmill-decontam/1"})
    cut = '{"format": "gristmill-decontam/1", "ngram": 13'
    # the seal removed with the edit (review RV61e 2): a sealed format's manifest carries it
    eight = ["decontaminate.ngram=8"]
    (index / "manifest.json").write_text(older)
    with pytest.raises(GristmillError, match=r"format 'gristmill-decontam/1' / normaliser .* is not"):
        prepare(with_index(index, *eight), **QUIET)
    for text, sets in ((edited, eight), (json.dumps(unsealed), eight), (cut, [])):
        (index / "manifest.json").write_text(text)
        with pytest.raises(
            GristmillError, match=r"manifest.json is not a valid index manifest \(cut off or edited\)"
        ):
            prepare(with_index(index, *sets), **QUIET)

    eight = tmp_path / "eight"
    argv = [
        "data",
        "decontam-index",
        "--tasks",
        "gm_cloze,gm_qa",
        "--include-path",
        str(tasks),
        "--ngram",
        "8",
    ]
    assert main([*argv, "--out", str(eight)]) == 0
    with pytest.raises(
        BuildError,
        match=r"changed: decontaminate\.index_sha256: '\w+' → '\w+'; decontaminate\.ngram: 13 → 8\)",
    ) as refused:
        build(with_index(eight, "decontaminate.ngram=8"), **QUIET)
    # the way on with the index the dataset was built with (trial RV66b nit): its copy, which builds
    way = f"set decontaminate.index = {str(out / 'decontam')!r} and decontaminate.ngram = 13 (tasks as it was"
    assert way in str(refused.value), refused.value
    build(with_index(out / "decontam", "decontaminate.ngram=13"), **QUIET)


def test_decontaminate_with_neither_tasks_nor_an_index_is_refused(decontam, tmp_path):
    """Trial RV60b 1: `--set decontaminate.index="$IDX"` of an unset variable, or [decontaminate] with
    ngram and include_path but no tasks, built the dataset undecontaminated, exit 0, without a word.
    One line naming what was given; a recipe without [decontaminate] builds as before."""
    _, _, tasks, config, _ = decontam
    text = config.read_text()
    cfg = load_config(DataConfig, config, ["decontaminate.tasks=[]", 'decontaminate.index=""'])
    with pytest.raises(
        BuildError, match=r'^--set decontaminate.index="": decontaminate.tasks and decontaminate.index'
    ):
        prepare(cfg, **QUIET)
    without_tasks = tmp_path / "no-tasks.toml"
    without_tasks.write_text(text.replace('tasks = ["gm_cloze", "gm_qa"]\n', ""))
    with pytest.raises(BuildError, match="are both empty, so nothing would be decontaminated") as e:
        prepare(load_config(DataConfig, without_tasks), **QUIET)
    assert str(e.value).startswith(f"decontaminate.include_path = {[str(tasks)]!r}:"), str(e.value)
    without = tmp_path / "without.toml"
    without.write_text(text[: text.index("[decontaminate]")])
    assert prepare(load_config(DataConfig, without), **QUIET).decontam is None
    # a section of defaults alone was taken for none: built undecontaminated, exit 0 (trial RV75c 2)
    for section, sets, said in (
        ("[decontaminate]\n", [], "[decontaminate] (empty):"),
        ("[decontaminate]\nngram = 13\n", [], "decontaminate.ngram = 13:"),
        ("[decontaminate]\ninclude_path = []\n", [], "decontaminate.include_path = []:"),
        ("", ["decontaminate.ngram=13"], "decontaminate.ngram = 13:"),
    ):
        given = tmp_path / "given.toml"
        given.write_text(without.read_text() + section)
        with pytest.raises(BuildError, match="are both empty, so nothing would be decontaminated") as e:
            prepare(load_config(DataConfig, given, sets), **QUIET)
        assert str(e.value).startswith(said), (section, sets, str(e.value))
    # the saved config.toml of a build without it names both, empty: it builds as before
    saved = tmp_path / "saved.toml"
    defaults = '[decontaminate]\ntasks = []\nngram = 13\nindex = ""\ninclude_path = []\n'
    saved.write_text(without.read_text() + defaults)
    assert prepare(load_config(DataConfig, saved), **QUIET).decontam is None


def test_a_finished_dataset_whose_prebuilt_index_is_gone_names_the_copy_it_keeps(decontam, tmp_path):
    """Trial RV60b 7: the index folder `index = DIR` named, deleted after the build (a temporary
    folder), made the rerun of the finished dataset advise building one, though OUTPUT/decontam/ holds
    the verified copy it was built with. The line names the copy and the setting; followed, the rerun
    goes on. Never read in its place: a mistyped path built with the old index, exit 0 (review RV60f 1)."""
    _, out, _, config, _ = decontam
    index, dataset = tmp_path / "index", tmp_path / "dataset"
    shutil.copytree(out / "decontam", index)
    sets = [f"decontaminate.index={json.dumps(str(index))}", f"output={json.dumps(str(dataset))}"]
    assert build(load_config(DataConfig, config, sets), **QUIET).ok
    files = {  # validation.json: its time taken
        p: p.read_bytes()
        for p in sorted(dataset.rglob("*"))
        if p.is_file() and "logs" not in p.parts and p.name != "validation.json"
    }
    shutil.rmtree(index)
    with pytest.raises(BuildError) as e:
        build(load_config(DataConfig, config, sets), **QUIET)
    kept = dataset / "decontam"
    assert str(e.value).startswith(f"decontaminate.index {index} does not exist; the output keeps a copy"), (
        e.value
    )
    assert f"set decontaminate.index = {str(kept)!r}" in str(e.value), e.value
    advised = [f"decontaminate.index={json.dumps(str(kept))}", sets[1]]
    result = build(load_config(DataConfig, config, advised), **QUIET)
    assert result.ok, result.report
    assert {p: p.read_bytes() for p in files} == files
    # the other way on, where the copy is damaged too: the index written again as the line says, the
    # same bytes, so the rerun of the recipe as it was goes on (no line said so: trial RV68c F3)
    again = re.search(r"`gristmill data decontam-index (.+) --out (.+?)`", str(e.value))
    assert again and again[1] == "--tasks gm_cloze,gm_qa --ngram 13" and again[2] == str(index), e.value
    _, _, tasks, _, _ = decontam
    assert (
        main(["data", "decontam-index", *again[1].split(), "--include-path", str(tasks), "--out", again[2]])
        == 0
    )
    result = build(load_config(DataConfig, config, sets), **QUIET)
    assert result.ok, result.report
    assert {p: p.read_bytes() for p in files} == files


def test_an_edited_decontam_manifest_is_copied_again_by_the_rerun(decontam, tmp_path):
    """decontam/ (recorded in dataset.json) edited: the advice was "delete dataset.json and rerun",
    which recorded the edited claim and validated (review R14a). A manifest sealed (trial RV60b 3) is
    no index when edited: the rerun copies the index again, as for a damaged n-gram file; and so is one
    sealed again over another n beside the same n-gram files (the filter reads the copy's manifest:
    a resume's build removed nothing, validated: trial RV64b S2)."""
    from training.contract.integrity import sealed

    _, built, _, config, _ = decontam
    out = tmp_path / "ds"
    shutil.copytree(built, out)
    manifest = out / "decontam" / "manifest.json"
    clean = json.loads(manifest.read_text())
    other_n = {k: v for k, v in clean.items() if k != "manifest_sha256"} | {"ngram": 20}
    cfg = load_config(DataConfig, config, [f"output={out}"])
    for edit in (
        manifest.read_text().replace('"documents": ', '"documents": 1', 1),
        json.dumps(sealed(other_n, "manifest_sha256"), indent=1),
    ):
        manifest.write_text(edit)
        lines: list[str] = []
        assert build(cfg, log=lines.append).ok
        assert any(f"{out / 'decontam'}/ is damaged or another index" in line for line in lines), lines
        assert json.loads(manifest.read_text()) == clean


def test_a_damaged_index_copy_repaired_as_validate_advises_validates(decontam, tmp_path):
    """Review R16f F4: `data validate` finds a damaged decontam/ copy and advises the build's command,
    which builds the index again from the tasks: its manifest held the build's timing ("seconds"), so
    the copy differed from dataset.json's record and the repaired dataset failed validation."""
    from validation.validate import validate_dataset

    _, built, _, config, _ = decontam
    out = tmp_path / "ds"
    shutil.copytree(built, out)
    # indexed under another lm-eval (or before the manifest lost its timing: R16h F2), the manifest
    # dataset.json records is not the one the build stages now, its n-grams the same
    from training.contract.integrity import sealed

    manifest = out / "decontam" / "manifest.json"
    older = {k: v for k, v in json.loads(manifest.read_text()).items() if k != "manifest_sha256"}
    manifest.write_text(json.dumps(sealed({**older, "lm_eval": "0.4.0"}, "manifest_sha256"), indent=1))
    info = json.loads((out / "dataset.json").read_text())
    info["files"]["decontam/manifest.json"] = {
        "bytes": manifest.stat().st_size,
        "sha256": file_sha256(manifest),
    }
    info["decontaminate"]["lm_eval"] = "0.4.0"  # as that build recorded it
    (out / "dataset.json").write_text(json.dumps(info, indent=2))
    assert validate_dataset(out, progress=False, write=False).ok
    hashes = out / "decontam" / "ngrams.npy"
    data = bytearray(hashes.read_bytes())
    data[-1] ^= 1
    hashes.write_bytes(bytes(data))
    assert not validate_dataset(out, progress=False, write=False).ok
    cfg = load_config(DataConfig, config, [f"output={out}"])
    assert build(cfg, **QUIET).ok
    assert validate_dataset(out, progress=False, write=False).ok


def test_validate_checks_what_dataset_json_says_of_its_decontamination(decontam, tmp_path):
    """Trial RV75c 3: dataset.json's decontaminate block edited (the one task renamed hellaswag, its
    removed count and the total zeroed, its documents changed) validated OK, and eval marks tasks
    decontaminated by it. Its tasks are the index copy's (a sealed manifest whose sha256 is the n-gram
    files'), its counts the excluded files' (a document of two tasks counted for each, once in all)."""
    from validation.validate import validate_dataset

    _, built, _, _, _ = decontam
    out = tmp_path / "ds"
    shutil.copytree(built, out)
    kept = (out / "dataset.json").read_text()
    assert validate_dataset(out, progress=False, write=False).ok

    def edited(edit) -> list[str]:
        info = json.loads(kept)
        edit(info["decontaminate"])
        (out / "dataset.json").write_text(json.dumps(info, indent=2))
        report = validate_dataset(out, progress=False, write=False)
        return [str(p) for p in report.problems]

    def renamed(d) -> None:
        d["tasks"][0].update(name="hellaswag", removed=0, documents=3000)
        d["requested"], d["removed"] = ["hellaswag"], 0

    def zeroed(d) -> None:
        d["tasks"][0]["removed"] = 0

    for edit, said in (
        (renamed, "records decontaminate's tasks (or ngram, requested, lm_eval) otherwise than its index"),
        (zeroed, "records removed counts by task (gm_cloze 0, gm_qa 2) adding up to 2, but its 4 documents"),
        (lambda d: d.update(removed=0), "records 0 documents removed by decontamination"),
        # a document of two tasks counted twice by task, once in all: the field edited named (RV75e)
        (lambda d: d["removed_together"][0].update(documents=2), '"documents": 2, "tasks": ["gm_cloze", "gm'),
        (lambda d: d.update(removed_together=[]), "up to 5, but its 4 documents removed, each counted again"),
        (lambda d: d.update(removed_together=[1]), "records removed_together [1], not a list of {"),
        (lambda d: d.update(removed_together=""), 'records removed_together "", not a list of {'),
    ):
        problems = edited(edit)
        assert len(problems) == 1 and "dataset.json" in problems[0] and said in problems[0], problems
    info = json.loads(kept)  # a count that is no number: a traceback at the comparison (review RV77c 4)
    info["excluded_by_filter"]["decontaminate"] = info["decontaminate"]["removed"] = "4"
    (out / "dataset.json").write_text(json.dumps(info, indent=2))
    problems = [str(p) for p in validate_dataset(out, progress=False, write=False).problems]
    assert any("excluded_by_filter must map each filter's name to a count" in p for p in problems), problems
    (out / "dataset.json").write_text(kept)
    manifest = out / "decontam" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"gm_qa"', '"gm_qb"', 1))  # the seal no longer holds
    problems = [str(p) for p in validate_dataset(out, progress=False, write=False).problems]
    assert any(
        "decontam/manifest.json is not the manifest of the index dataset.json records" in p for p in problems
    )


def test_an_index_copy_changed_after_its_validation_is_audited_stale(decontam, tmp_path):
    """The audit's validation status is of the files the record says the check read: a damaged
    decontam/ copy, which `data validate` fails, still said "ok" (review RV61e 3)."""
    from validation.audit import run_preset
    from validation.audit_views import connect

    _, built, _, _, _ = decontam
    out = tmp_path / "ds"
    shutil.copytree(built, out)  # mtimes kept: the record's versions
    status = lambda: run_preset(connect([out])[0], "validation").records()[0]["status"]  # noqa: E731
    assert status() == "ok"
    hashes = out / "decontam" / "ngrams.npy"
    data = bytearray(hashes.read_bytes())
    data[-1] ^= 1
    hashes.write_bytes(bytes(data))
    assert status() == "stale (files changed since): validate again"


def test_build_workers_filter_without_lm_eval(decontam, tmp_path):
    """The filter step, as a worker runs it: a fresh interpreter where lm_eval, torch and validation/
    cannot be imported opens OUTPUT/decontam/ and drops a planted page."""
    _, out, _, _, _ = decontam
    script = f"""
import sys
for name in ("lm_eval", "torch", "validation", "transformers"):
    sys.modules[name] = None  # importing it raises ImportError
from datatrove.data import Document
from pipelines.decontam.filter import DecontaminationFilter
step = DecontaminationFilter({str(out / "decontam")!r})
docs = [Document(text={CLOZE[3][0]!r}, id="a"), Document(text="An unrelated page.", id="b")]
print([d.id for d in step.run(iter(docs))])
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "['b']", proc.stderr


def _run_with_an_export(dataset: Path, run: Path, step: int = 5) -> None:
    """A run directory of `dataset` holding a random tiny model's export as step `step` (what eval
    scores), made if it is not there yet."""
    import torch

    from training.checkpoint.hf_export import export_hf
    from training.config import TrainConfig
    from training.contract.config_loader import save_config
    from training.contract.run_layout import export_dir
    from training.model import PRESETS, Transformer

    if not run.exists():
        run.mkdir()
        sets = [
            f"data.dataset={dataset}",
            f"run.output_dir={run}",
            "data.val_fraction=0.1",
            "data.seq_len=256",
        ]
        save_config(load_config(TrainConfig, None, sets), run / "config.toml")
    torch.manual_seed(0)
    vocab_size = read_dataset_info(dataset)["vocab_size"]
    model = Transformer(PRESETS["tiny"].replace(vocab_size=vocab_size, tie_embeddings=True))
    with torch.no_grad():
        model.init_weights()
    export_hf(model.state_dict(), model.cfg, dataset, export_dir(run, step), meta={"step": step})


def test_eval_marks_each_task(decontam, tmp_path, capsys):
    """`gristmill eval` on a tiny exported model: the table, results.json and eval.parquet say
    gm_cloze was decontaminated (with the documents removed), heldout_ppl not checked."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from training.contract.eval_table import read_results

    _, out, tasks, _, _ = decontam
    run = tmp_path / "run"
    _run_with_an_export(out, run)

    args = ["--set", "docs=5", "bootstrap_iters=0", "device=cpu", "limit=2", "plot=false",
            f'include_path=["{tasks}"]']  # fmt: skip
    assert main(["eval", str(run), "--tasks", "gm_cloze,heldout_ppl", *args]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("   5 ")]
    marks = {
        line.split()[1]: line.split("  ")[-1].strip()
        for line in table
        if line.rstrip().endswith(("removed)", "checked"))
    }
    assert marks == {
        "gm_cloze": "decontaminated (3 docs removed)",
        "heldout_ppl": "not checked",
    }, table
    recorded = read_results(run)[5]["gristmill_tasks"]
    assert recorded["gm_cloze"]["decontamination"]["datasets"] == [
        {"source": "data", "dataset": str(out), "task": "gm_cloze", "status": "checked", "removed": 3,
         "index_version": 1.0, "evaluated_version": 1.0, "documents": 4, "unchecked_documents": 0}
    ]  # fmt: skip
    view = pq.read_table(run / "eval.parquet").to_pylist()
    assert {(r["task"], r["decontamination"]) for r in view} == {(t, m) for t, m in marks.items()}
    # the same task name and version over other documents (a data file replaced): the index checked the
    # old ones, so not "decontaminated" (review R23a S2: it said so of verbatim training documents)
    edited = tmp_path / "edited"
    shutil.copytree(tasks, edited)
    (edited / "gm_cloze.yaml").write_text(
        (tasks / "gm_cloze.yaml").read_text().replace(str(tasks), str(edited))
    )
    rows = (edited / "gm_cloze.jsonl").read_text().splitlines()
    rows[0] = json.dumps({"context": fixture_texts(40)[20], "choices": ["a", "b", "c", "d"], "label": 0})
    (edited / "gm_cloze.jsonl").write_text("\n".join(rows) + "\n")
    index = {t["name"]: t for t in read_dataset_info(out)["decontaminate"]["tasks"]}
    assert len(index["gm_cloze"]["documents_sha256"]) == 64
    capsys.readouterr()
    args[-1] = f'include_path=["{edited}"]'
    assert main(["eval", str(run), "--tasks", "gm_cloze", *args]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("   5  gm_cloze")]
    assert table and table[0].rstrip().endswith("checked against other documents"), table  # the task's mark
    status = read_results(run)[5]["gristmill_tasks"]["gm_cloze"]["decontamination"]["datasets"][0]["status"]
    assert status == "other documents"
    # a task of one's own whose data file is gone: one line naming it, not lm-eval's traceback (R21b F12)
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "gm_gone.yaml").write_text(
        (tasks / "gm_cloze.yaml").read_text().replace("gm_cloze", "gm_gone").replace(str(tasks), str(gone))
    )
    capsys.readouterr()
    assert main(["eval", str(run), "--tasks", "gm_gone", *args[:-1], f'include_path=["{gone}"]']) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith("error: task gm_gone could not be scored: "), err
    assert "gm_gone.jsonl" in err[0], err
    # most likely its data, but an OSError of the model's code reads alike: its traceback is kept (R23g M2)
    log = run / "eval" / "step-000005" / "eval.log"
    assert err[0].endswith(f"; the full traceback is in {log}") and "Traceback" in log.read_text(), err
    # one that does not parse: one line too (pyarrow's ArrowInvalid in datasets' error: review R21f 2a)
    (gone / "gm_gone.jsonl").write_text('{"context": "cut mid-')
    capsys.readouterr()
    assert main(["eval", str(run), "--tasks", "gm_gone", *args[:-1], f'include_path=["{gone}"]']) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith("error: task gm_gone could not be scored: "), err
    # gristmill's own refusal while scoring is said as it is, not as the task's data (review R21e 1)
    assert main(["eval", str(run), "--tasks", "gm_cloze", *args, "--set", "max_length=4"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and err[0].startswith("error: task gm_cloze document "), err

    # The run trained on another dataset than the one config.toml's path leads to now (a relative
    # path, from another directory): that dataset's record says nothing of the run's data.
    (run / "data_plan.json").write_text(json.dumps({"sources": [{"name": "data", "fingerprint": "f" * 64}]}))
    assert main(["eval", str(run), "--step", "5", "--tasks", "gm_cloze", *args]) == 0
    recorded = read_results(run)[5]["gristmill_tasks"]["gm_cloze"]["decontamination"]
    assert recorded["mark"] == "not checked" and recorded["datasets"][0]["status"] == "not checked"


def test_a_task_edited_during_a_watch_is_marked_against_its_new_documents(decontam, tmp_path):
    """Review R23g S1: the watch's one TaskPlan kept each task's documents sha256 from before an edit, so
    a task rescored after its process_docs changed the documents was marked "decontaminated" against
    the index's (other) documents, and recorded so under its new definition. Made again with it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from training.contract.run_layout import eval_dir
    from validation.eval import TaskPlan, evaluate_missing, load_eval_config

    _, out, indexed, _, _ = decontam
    tasks = tmp_path / "tasks"
    shutil.copytree(indexed, tasks)
    yaml_text = (tasks / "gm_cloze.yaml").read_text().replace(str(indexed), str(tasks))
    (tasks / "gm_cloze.yaml").write_text(yaml_text + "process_docs: !function gm_utils.process_docs\n")
    (tasks / "gm_utils.py").write_text("def process_docs(docs):\n    return docs\n")
    run = tmp_path / "run"
    _run_with_an_export(out, run)
    sets = ["bootstrap_iters=0", "device=cpu", "limit=2", "plot=false", f'include_path=["{tasks}"]']
    cfg = load_eval_config(None, sets, "gm_cloze")
    plan = TaskPlan(run, cfg)  # the watch's one plan

    def status() -> str:
        results = json.loads((eval_dir(run, 5) / "results.json").read_text())
        return results["gristmill_tasks"]["gm_cloze"]["decontamination"]["datasets"][0]["status"]

    assert evaluate_missing(run, cfg, plan, show=False) == [5] and status() == "checked"
    edited = "    return docs.map(lambda d: {**d, 'context': d['context'] + ' (edited)'})\n"
    (tasks / "gm_utils.py").write_text("def process_docs(docs):\n" + edited)
    assert evaluate_missing(run, cfg, plan, show=False) == [5] and status() == "other documents"
    # the data file replaced where no include_path looks (here: its folder moved out of it), and a new
    # step scored by the same plan: marked against the documents as they are (review R23h S3)
    data = tmp_path / "data"
    data.mkdir()
    shutil.move(tasks / "gm_cloze.jsonl", data / "gm_cloze.jsonl")
    (tasks / "gm_cloze.yaml").write_text(
        (tasks / "gm_cloze.yaml")
        .read_text()
        .replace(str(tasks / "gm_cloze.jsonl"), str(data / "gm_cloze.jsonl"))
    )
    (tasks / "gm_utils.py").write_text("def process_docs(docs):\n    return docs\n")  # as indexed again
    assert evaluate_missing(run, cfg, plan, show=False) == [5] and status() == "checked"
    rows = [json.loads(line) for line in (data / "gm_cloze.jsonl").read_text().splitlines()]
    rows[0]["context"] += " (a new release)"
    (data / "gm_cloze.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _run_with_an_export(out, run, 6)
    # step 5 as well: its documents changed (review R30a F1)
    assert evaluate_missing(run, cfg, plan, show=False) == [5, 6]
    for step in (5, 6):
        results = json.loads((eval_dir(run, step) / "results.json").read_text())
        assert (
            results["gristmill_tasks"]["gm_cloze"]["decontamination"]["datasets"][0]["status"]
            == "other documents"
        )


def test_marks_for_versions_mixtures_and_groups():
    from validation.eval_results import decontamination_marks

    def check(source, tasks, unchecked=0):
        entry = {
            "tasks": [
                {"name": n, "version": v, "removed": r, "documents": 4, "documents_without_ngrams": unchecked}
                for n, v, r in tasks or []
            ]
        }
        return {"source": source, "dataset": f"/data/{source}", "decontaminate": entry if tasks else None}

    results = {
        "results": {"a": {}, "b": {}, "c": {}, "grp": {}},
        "versions": {"a": 1.0, "b": 2, "c": 1.0, "grp": 0},
        "group_subtasks": {"grp": ["a", "c"]},
    }
    one = decontamination_marks(results, [check("prose", [("a", 1, 4), ("b", 1.0, 0), ("c", 1.0, 1)])])
    assert {t: m["mark"] for t, m in one.items()} == {
        "a": "decontaminated (4 docs removed)",  # 1 and 1.0 are one version
        "b": "checked against another version",
        "c": "decontaminated (1 doc removed)",
        "grp": "decontaminated (5 docs removed)",
    }
    two = decontamination_marks(results, [check("prose", [("a", 1.0, 4)]), check("code", None)])
    assert two["a"]["mark"] == "partly checked (1 of 2 datasets)" and two["b"]["mark"] == "not checked"
    assert two["grp"]["mark"] == "partly checked (1 of 4 task-dataset pairs)"
    # indexed, but no text of it reached n words: nothing could match, so no check ran (review R16f F3:
    # "decontaminated (0 docs removed)")
    short = check("prose", [("a", 1.0, 0), ("c", 1.0, 2)])
    short["decontaminate"]["tasks"][0]["ngrams"] = 0
    three = decontamination_marks(results, [short])
    assert three["a"]["mark"] == "not checked (its documents are shorter than the index's n-grams)"
    assert three["grp"]["mark"] == "partly checked (1 of 2 task-dataset pairs)"
    four = decontamination_marks(results, [short, check("code", None)])  # one dataset never checked it
    assert four["a"]["mark"] == "not checked"
    # some of its documents gave the index no n-gram: never "decontaminated" plainly (review R27a S1); a
    # document no dataset's index could check is one not checked (the most over the datasets, not the sum)
    part = decontamination_marks(results, [check("prose", [("a", 1.0, 4), ("c", 1.0, 1)], 3)])
    assert part["a"]["mark"] == (
        "partly checked (3 of 4 documents shorter than the index's n-grams, not checked; 4 docs removed)"
    )
    assert part["grp"]["mark"].startswith("partly checked (6 of 8 documents shorter")
    assert part["a"]["datasets"][0]["unchecked_documents"] == 3 and part["a"]["datasets"][0]["documents"] == 4
    # a task's documents replaced under its version, met after another task already marked: the count
    # of the first task's documents took the name of the hashing function, and the second was marked
    # "decontaminated" unchecked (None) or crashed (an int)
    hashes = {"a": "sha-a", "c": "replaced"}
    entry = check("prose", [("a", 1.0, 4), ("c", 1.0, 1)])
    for t in entry["decontaminate"]["tasks"]:
        t["documents_sha256"] = f"sha-{t['name']}"
    both = decontamination_marks(
        {"results": {"a": {}, "c": {}}, "versions": results["versions"]}, [entry], hashes.get
    )
    assert both["a"]["mark"] == "decontaminated (4 docs removed)"
    assert both["c"]["mark"] == "checked against other documents"
    for t in entry["decontaminate"]["tasks"]:  # records from before the counts: the silent case (None)
        del t["documents"], t["documents_without_ngrams"]
    old = decontamination_marks(
        {"results": {"a": {}, "c": {}}, "versions": results["versions"]}, [entry], hashes.get
    )
    assert old["c"]["mark"] == "checked against other documents"
    two_n = [check("prose", [("a", 1.0, 4)], 1), check("code", [("a", 1.0, 0)], 2)]
    assert decontamination_marks(results, two_n)["a"]["mark"].startswith("partly checked (2 of 4 documents")
    # a record written before the count: unknown, not 0
    old = check("prose", [("a", 1.0, 4)])
    del old["decontaminate"]["tasks"][0]["documents_without_ngrams"]
    unknown = decontamination_marks(results, [old])["a"]
    assert unknown["mark"] == "decontaminated (4 docs removed; documents too short to check: unknown)"
    assert unknown["datasets"][0]["unchecked_documents"] is None
    # an older dataset beside one that knows 2 of 4 unchecked: the known count stands, as a lower bound
    # (review R27d M1: "decontaminated (…; documents too short to check: unknown)")
    mixed = decontamination_marks(results, [old, check("code", [("a", 1.0, 0)], 2)])["a"]["mark"]
    assert mixed == (
        "partly checked (at least 2 of 4 documents shorter than the index's n-grams, not checked; "
        "another dataset's count unknown; 4 docs removed)"
    )
    none_known = decontamination_marks(results, [old, check("code", [("a", 1.0, 0)], 0)])["a"]["mark"]
    assert none_known == "decontaminated (4 docs removed; documents too short to check: unknown)"


def test_eval_documents_shorter_than_n_are_counted_said_and_marked(build_fixture, tmp_path, capsys):
    """Review R27a S1: an evaluation document with no n-gram (an 11-word question at n = 13; a Chinese
    sentence, one "word" to the normaliser) is checked against no training text. The build said only
    "3 documents, 6 13-grams", dataset.json had no count and eval called the task decontaminated. Now the
    count is in dataset.json, the index's table and the end table, and eval's mark says it; the
    documents themselves are still not matched (as documented)."""
    from pipelines.progress import build_table
    from validation.eval_results import decontamination_marks

    _, tokenizer, _ = build_fixture
    zh = "在一个阳光明媚的下午老师带着全班同学去公园观察植物的生长情况同学们认真记录了每一种花的颜色和形状"
    short = "How do I ready a guinea pig cage for its new occupants?"  # 11 words
    long = " ".join(QA[0][0].split()[:19])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gm_short.jsonl").write_text(
        "".join(
            json.dumps({"context": c, "choices": ["yes", "no"], "label": 0}) + "\n" for c in (zh, short, long)
        )
    )
    (tasks / "gm_short.yaml").write_text(
        (write_tasks(tmp_path / "both") / "gm_cloze.yaml")
        .read_text()
        .replace("gm_cloze", "gm_short")
        .replace(str(tmp_path / "both"), str(tasks))
    )
    texts = {"zh-verbatim": f"{zh}。", "short-verbatim": short, "long": f"Intro. {long} and more."}
    corpus = _fineweb_corpus(tmp_path / "corpus", {**texts, "clean": fixture_texts(40)[3]})
    config = tmp_path / "data.toml"
    config.write_text(
        fixture_config_text(corpus, tokenizer, tmp_path / "dataset")
        + f'\n[decontaminate]\ntasks = ["gm_short"]\nngram = 13\ninclude_path = ["{tasks}"]\n'
    )
    cfg = load_config(DataConfig, config, ["build.tasks=1", "build.workers=1", "filters.min_chars=1"])
    lines: list[str] = []
    assert build(cfg, log=lambda *a: lines.append(" ".join(map(str, a)))).ok
    printed = "\n".join(lines)
    assert re.search(r"^  gm_short +test +3 +7 +2$", printed, re.M), printed  # the index's table
    assert (
        "note: evaluation documents with no 13-gram: 2 (every text under 13 words, its template's " in printed
    )
    # "with no", which reads right for every n ("without a 8-gram" did not), and the key to change (R27d m5)
    assert re.search(r"^  task +split +documents +13-grams +documents with no 13-gram$", printed, re.M), (
        printed
    )
    assert "a smaller decontaminate.ngram (--ngram) checks more, in a new output; see docs/" in printed
    out = Path(cfg.output)
    entry = read_dataset_info(out)["decontaminate"]
    assert [(t["documents"], t["documents_without_ngrams"], t["removed"]) for t in entry["tasks"]] == [
        (3, 2, 1)
    ]
    assert {r["id"] for r in excluded_rows(out) if r["filter"] == "decontaminate"} == {"long"}
    row = r"^  eval docs with no 13-gram +2 of 3  no training document checked against them: gm_short 2$"
    assert re.search(row, printed, re.M), printed  # the end table
    results = {"results": {"gm_short": {}}, "versions": {"gm_short": 1.0}}
    mark = decontamination_marks(results, [{"source": "data", "dataset": str(out), "decontaminate": entry}])
    assert mark["gm_short"]["mark"] == (
        "partly checked (2 of 3 documents shorter than the index's n-grams, not checked; 1 doc removed)"
    )
    # a dataset.json written before the count (2026-12-01): the dataset's copy of its index has recorded
    # it since 2026-11-29, so the end table and eval's mark give it (review R27d m1: "unknown" both)
    from training.config import TrainConfig
    from training.contract.dataset_format import write_dataset_info
    from training.data.spec import resolve
    from validation.eval import training_data_checks

    older = read_dataset_info(out)
    del older["decontaminate"]["tasks"][0]["documents_without_ngrams"]
    write_dataset_info(out, older)
    assert re.search(row, build_table(out, read_dataset_info(out), ("OK", ""), []), re.M)
    spec = resolve(
        load_config(TrainConfig, None, [f"data.dataset={out}", f"run.output_dir={tmp_path / 'run'}"])
    )
    checks = training_data_checks(spec, tmp_path / "run")
    assert checks[0]["decontaminate"]["tasks"][0]["documents_without_ngrams"] == 2
    assert decontamination_marks(results, checks)["gm_short"]["mark"] == mark["gm_short"]["mark"]
    # neither records it (an index made before it was counted, which a build refuses): unknown, not 0
    manifest = json.loads((out / "decontam" / "manifest.json").read_text())
    del manifest["tasks"][0]["documents_without_ngrams"]
    (out / "decontam" / "manifest.json").write_text(json.dumps(manifest))
    table = build_table(out, read_dataset_info(out), ("OK", ""), [])
    unknown = r"^  eval docs with no 13-gram +unknown  not recorded by this build nor by its index$"
    assert re.search(unknown, table, re.M), table
    unknown_mark = decontamination_marks(results, training_data_checks(spec, tmp_path / "run"))["gm_short"]
    assert unknown_mark["mark"] == "decontaminated (1 doc removed; documents too short to check: unknown)"


def _fineweb_corpus(corpus: Path, texts: dict[str, str]) -> Path:
    """A one-file FineWeb-Edu-shaped parquet corpus of `texts` (id → text), every filter passed."""
    corpus.mkdir()
    rows = [
        {"text": t, "id": rid, "url": f"https://example.org/{rid}", "dump": "CC-MAIN-2024-10", "score": 3.5,
         "int_score": 3, "language": "en", "language_score": 0.9, "token_count": 0}
        for rid, t in texts.items()
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=FINEWEB_EDU_SCHEMA), corpus / "part-00.parquet")
    return corpus


def test_a_contaminated_page_is_never_the_copy_dedup_keeps(decontam, build_fixture, tmp_path):
    """Decontamination runs with the filters, before dedup: a page with a planted task question is
    dropped as contaminated, and its clean near-copy later in the input stays (with dedup first,
    the contaminated page would be the kept copy and the clean one would go as its duplicate)."""
    _, out, _, _, _ = decontam
    _, tokenizer, _ = build_fixture
    page = fixture_texts(40)[9]
    texts = {"contaminated": _page(9, QA[2][0]), "clean-near-copy": page}
    corpus = _fineweb_corpus(tmp_path / "corpus", texts)
    config = tmp_path / "data.toml"
    config.write_text(
        fixture_config_text(corpus, tokenizer, tmp_path / "dataset")
        + f'\n[decontaminate]\nindex = "{out / "decontam"}"\n\n[dedup]\nkind = "minhash"\n'
    )
    cfg = load_config(DataConfig, config, ["build.tasks=1", "build.workers=1"])
    result = build(cfg, **QUIET)
    assert result.ok, result.report
    dropped = {r["id"]: r["filter"] for r in excluded_rows(Path(cfg.output))}
    assert dropped == {"contaminated": "decontaminate"}


def test_a_build_decontamination_empties_names_decontamination(decontam, build_fixture, tmp_path):
    """Every document dropped as contaminated: the advice named only [filters] and source.text_key
    (trial RV59b 4); it names [decontaminate] and its count."""
    _, out, _, _, _ = decontam
    _, tokenizer, _ = build_fixture
    texts = {"contaminated-1": _page(9, QA[2][0]), "contaminated-2": _page(3, QA[1][0])}
    corpus = _fineweb_corpus(tmp_path / "corpus", texts)
    config = tmp_path / "data.toml"
    index = out / "decontam"
    config.write_text(
        fixture_config_text(corpus, tokenizer, tmp_path / "dataset")
        + f'\n[decontaminate]\nindex = "{index}"\n'
    )
    cfg = load_config(DataConfig, config, ["build.tasks=1", "build.workers=1"])
    with pytest.raises(BuildError) as e:
        build(cfg, **QUIET)
    said = str(e.value)
    assert "no document survived (2 read, excluded by: decontaminate 2)" in said, said
    assert (
        "; check [decontaminate]: 2 documents share a 13-word n-gram with the evaluation documents of "
        f"the index {index} (a larger decontaminate.ngram, or fewer tasks?)"
    ) in said, said
    assert "loosen [filters]" not in said, said


def test_a_damaged_index_copy_is_never_trusted(decontam, build_fixture, tmp_path):
    """Issue 29 item 2, the fault as found: after a finished build with `index = DIR`, the copy in
    OUTPUT/decontam/ is altered in place (same size, every hash + 1). `data validate` names it; the
    README's repair (rm dataset.json and a task's completion marker, rerun) copies the index anew,
    saying so, and the planted page is dropped again. A truncated copy is named by validate too."""
    from datatrove.data import Document

    from validation.validate import validate_dataset

    _, out, _, _, _ = decontam
    _, tokenizer, _ = build_fixture
    index = tmp_path / "index"
    shutil.copytree(out / "decontam", index)
    corpus = _fineweb_corpus(
        tmp_path / "corpus", {"contaminated": _page(9, QA[2][0]), "clean": fixture_texts(40)[3]}
    )
    config = tmp_path / "data.toml"
    config.write_text(
        fixture_config_text(corpus, tokenizer, tmp_path / "dataset")
        + f'\n[decontaminate]\nindex = "{index}"\n'
    )
    cfg = load_config(DataConfig, config, ["build.tasks=1", "build.workers=1"])
    assert build(cfg, **QUIET).ok
    built = Path(cfg.output)
    copy = built / "decontam" / "ngrams.npy"
    hashes = np.load(copy)
    size = copy.stat().st_size
    np.save(copy, hashes + np.uint64(1))  # the planted fault: same size, every hash + 1
    assert copy.stat().st_size == size
    report = validate_dataset(built, progress=False, write=False)
    assert not report.ok and any(p.shard == "decontam" for p in report.problems), report.problems

    (built / "dataset.json").unlink()
    (built / "logs" / "completions" / "00000").unlink()
    lines: list[str] = []
    assert build(cfg, log=lines.append).ok
    assert any("decontam/" in line and "damaged" in line for line in lines), lines
    assert np.array_equal(np.load(copy), hashes)
    dropped = {r["id"]: r["filter"] for r in excluded_rows(built)}
    assert dropped == {"contaminated": "decontaminate"}
    assert validate_dataset(built, progress=False, write=False).ok

    copy.write_bytes(copy.read_bytes()[: size // 2])  # cut off after a finished build
    report = validate_dataset(built, progress=False, write=False)
    assert [p.shard for p in report.problems] == ["decontam"], report.problems  # the folder (RV60b 8)
    assert report.problems[0].message.startswith("ngrams.npy and refs.npy together: sha256 differs")
    from pipelines.build import _repair_advice  # the build's advice still removes the copy (RV60f 4)

    assert f"rm -r {built / 'dataset.json'} {built / 'decontam'}" in _repair_advice(built, report, 1)
    assert "gristmill data build" in report.problems[0].message
    lines.clear()  # the advice: a rerun of the complete dataset copies the index again
    assert build(cfg, log=lines.append).ok
    assert any("copying it again" in line for line in lines) and np.array_equal(np.load(copy), hashes)
    copy.write_bytes(copy.read_bytes()[: size // 2])
    step = DecontaminationFilter(
        built / "decontam", sha256=read_dataset_info(built)["decontaminate"]["index_sha256"]
    )
    with pytest.raises(
        DecontamIndexError, match=r"ngrams.npy/refs.npy are missing or damaged .*rerun the build"
    ):
        list(step.run(iter([Document(text="A page.", id="a")])))  # a worker refuses before its first lookup
