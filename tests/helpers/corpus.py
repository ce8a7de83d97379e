"""The small real corpus the build tests share: Python reference prose as FineWeb-Edu-shaped parquet,
the rows every fixture corpus carries (with the filter expected to drop each), the separator and BOS
strings, a tokenizer trained on it, and the build recipe (data.toml) for it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.sources import FINEWEB_EDU_SCHEMA

SEP = "<|endoftext|>"
BOS = "<|begin_of_text|>"
LITERAL_SEP_TEXT = (
    "This page quotes the separator: documents end with <|endoftext|> in GPT-2 style corpora, and a "
    "page that mentions <|endoftext|> must keep it as plain text."
)
# Rows every fixture corpus carries, with the filter expected to drop them (None: kept).
BAD_ROWS = [
    ("fixture-empty", "", {}, "text"),
    ("fixture-blank", "   \n\t ", {}, "text"),
    ("fixture-short", "Too short.", {}, "length"),
    (
        "fixture-low-score",
        "A page of adverts for cheap watches and more cheap watches. " * 3,
        {"int_score": 1},
        "int_score",
    ),
    (
        "fixture-no-score",
        "A page whose source row lacks the int_score column value entirely.",
        {"int_score": None},
        "int_score",
    ),
    ("fixture-literal-sep", LITERAL_SEP_TEXT, {}, None),
]


def fixture_texts(n_docs: int = 240) -> list[str]:
    """Real English prose: the Python language reference topics, cut into ~1-3 KB documents."""
    from pydoc_data import topics

    paragraphs = [p.strip() for _, t in sorted(topics.topics.items()) for p in t.split("\n\n") if p.strip()]
    docs, cur = [], []
    for p in paragraphs:
        cur.append(p)
        if sum(map(len, cur)) > 1000 + 150 * (len(docs) % 13):
            docs.append("\n\n".join(cur))
            cur = []
            if len(docs) == n_docs:
                break
    return docs


def write_fixture_corpus(folder: Path, n_files: int = 2, n_docs: int = 240) -> Path:
    rows = []
    for i, text in enumerate(fixture_texts(n_docs)):
        rows.append(
            {
                "text": text,
                "id": f"<urn:uuid:fixture-{i:05d}>",
                "url": f"https://example.org/doc/{i}",
                "dump": ["CC-MAIN-2023-50", "CC-MAIN-2024-10"][i % 2],
                "score": 3.0 + (i % 7) / 5,
                "int_score": 3 + (i % 7) // 5,
                "language": "en",
                "language_score": 0.9,
                "token_count": len(text) // 4,
            }
        )
    for name, text, over, _ in BAD_ROWS:
        row = {**rows[0], "text": text, "id": name, "url": f"https://example.org/{name}", **over}
        rows.insert(len(rows) // 2 if "sep" in name else len(rows) // 3, row)
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // n_files)
    for f in range(n_files):
        table = pa.Table.from_pylist(rows[f * per : (f + 1) * per], schema=FINEWEB_EDU_SCHEMA)
        pq.write_table(table, folder / f"part-{f:02d}.parquet")
    return folder


def train_fixture_tokenizer(path: Path, texts: list[str]) -> Path:
    from tokenization.tokenizer_io import train_bpe

    tok = train_bpe(texts, vocab_size=512, special_tokens=[SEP, BOS])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def fixture_config_text(corpus: Path, tokenizer: Path, output: Path) -> str:
    return f"""
output = "{output}"

[source]
kind = "parquet"
path = "{corpus}"

[filters]
min_int_score = 3
min_chars = 20

[tokenizer]
path = "{tokenizer}"
separator = "{SEP}"

[shards]
target_mb = 0.03
seed = 7

[build]
tasks = 2
workers = 2
progress_interval = 0.5
min_free_gb = 0.01
"""
