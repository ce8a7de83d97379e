"""The duplicate corpus of the dedup tests: real prose with planted copies (verbatim, case- and
whitespace-changed, near copies, a copy before its original, a copy of a filtered-out document) as
two parquet files, and a build recipe for it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.sources import FINEWEB_EDU_SCHEMA
from tests.helpers.corpus import fixture_texts

N_BASE = 60  # documents doc-000 … doc-059; task 0 reads part-00 (0-29), task 1 part-01 (30-59)
REWRITTEN = "This paragraph was rewritten by a mirror site that copies pages and edits a little of each."


def _rewrite_paragraph(text: str, k: int, new: str = REWRITTEN) -> str:
    paragraphs = text.split("\n\n")
    paragraphs[k % len(paragraphs)] = new
    return "\n\n".join(paragraphs)


def write_dup_corpus(folder: Path) -> dict[str, dict[str, str]]:
    """Two parquet files with planted duplicates; returns, per dedup kind, {dropped id: kept id}."""
    *texts, extra = fixture_texts(N_BASE + 1)
    rows = [[], []]  # part-00 (task 0), part-01 (task 1)
    for i, t in enumerate(texts):
        rows[i >= N_BASE // 2].append((f"doc-{i:03d}", t, 4))
    shout = texts[5].upper().replace("\n\n", "\n \n\t")  # case and whitespace changed
    rows[1] += [
        ("copy-3", texts[3], 4),  # verbatim
        ("copy-5", shout, 4),
        ("near-7a", _rewrite_paragraph(texts[7], 11), 4),  # one paragraph rewritten (of 22)
        ("near-7b", _rewrite_paragraph(texts[7], 5, "Another mirror rewrote a different paragraph."), 4),
        ("near-12", _rewrite_paragraph(texts[12], 8), 4),
        ("copy-of-dropped", extra, 4),
    ]
    rows[0] += [
        ("copy-3b", texts[3], 4),  # verbatim, same task as its original, after it
        ("copy-40", "  " + texts[40].replace(" ", "   ", 3) + "\n", 4),  # task 0: before doc-040
        ("dropped-orig", extra, 1),  # dropped by the int_score filter, before dedup
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for f, part in enumerate(rows):
        table = pa.Table.from_pylist(
            [{"text": t, "id": i, "url": f"https://example.org/{i}", "int_score": s} for i, t, s in part],
            schema=FINEWEB_EDU_SCHEMA,
        )
        pq.write_table(table, folder / f"part-{f:02d}.parquet")
    exact = {"copy-3": "doc-003", "copy-3b": "doc-003", "copy-5": "doc-005", "doc-040": "copy-40"}
    near = {"near-7a": "doc-007", "near-7b": "doc-007", "near-12": "doc-012"}
    return {"exact": exact, "minhash": {**exact, **near}}


def write_dup_config(root: Path, tokenizer: Path) -> tuple[Path, dict[str, dict[str, str]]]:
    """The duplicate corpus under `root` and a recipe for it (2 tasks, one per file; no dedup
    kind: set dedup.kind); returns (config path, expected drops per kind)."""
    expected = write_dup_corpus(root / "corpus")
    config = root / "data.toml"
    config.write_text(f"""
output = "{root / "unused"}"
[source]
kind = "parquet"
path = "{root / "corpus"}"
[filters]
min_int_score = 3
[tokenizer]
path = "{tokenizer}"
[shards]
target_mb = 0.05
seed = 3
[build]
tasks = 2
workers = 1
progress_interval = 0.5
min_free_gb = 0.01
""")
    return config, expected
