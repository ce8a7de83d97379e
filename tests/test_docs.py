"""The docs stay honest: README.md and docs/*.md name only links, configs, commands and paths that exist.

1. every relative markdown link resolves: the file exists (relative to the linking file) and the
   anchor is a heading of the target under GitHub's slug rules, or an explicit <a id/name>;
2. every `configs/…toml` path named anywhere exists;
3. every `gristmill CMD [SUB]` named in code (fenced blocks and inline spans) is a key of
   pipelines.cli.COMMANDS;
4. every repository path in backticks (pipelines/ tokenization/ training/ validation/ configs/
   bench/ tests/ docs/, ending .py/.toml/.md/.sh) exists.

And the README is a front page one can scan, with each list in one place:
5. no paragraph longer than 12 lines;
6. the demo's table has one row per stage of `gristmill demo`, in its order, whose seconds add up
   to the total the table quotes (the demo's closing summary);
7. the command list is the README's table of commands: COMMANDS' keys, in their order;
8. docs/design.md's layout is the one listing of the folders: every package (a folder with an
   `__init__.py`, whose docstring is its index of modules) has its entry, every entry exists, and
   every module an entry names is in the package it is listed under.

Each failure names the file, the line and the link or path. Pure text; no network, no imports of
the packages (COMMANDS and DEMO_STAGES are read from pipelines/cli.py's source).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
# [text](target) or ![alt](target); link text may hold one level of brackets and span lines.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
CONFIG_PATH = re.compile(r"(?<![\w./-])configs/[\w./-]*?\.toml\b")
REPO_PATH = re.compile(
    r"^(?:pipelines|tokenization|training|validation|configs|bench|tests|docs)/[\w./-]*\.(?:py|toml|md|sh)$"
)
COMMAND = re.compile(r"(?<![\w./-])gristmill((?:[ \t]+[^\s`'\"|()\[\]]+){0,2})")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split_code(text: str) -> tuple[str, list[tuple[int, str]]]:
    """(the text with fenced code blocks blanked, line numbers kept; the fenced lines as (line, text))."""
    prose, code, fence = [], [], None
    for n, line in enumerate(text.split("\n"), start=1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            prose.append("")
        elif fence is not None:
            closes = m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
            if closes and not line.strip()[len(m.group(1)) :]:
                fence = None
            else:
                code.append((n, line))
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), code


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def blank_inline_code(prose: str) -> str:
    """The prose with inline code spans replaced by spaces (newlines kept): links inside them are text."""
    return INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lowercased, punctuation other than - and _
    dropped, each space a hyphen."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML such as <a id=...></a>
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1", r"\2", text)  # emphasis
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(EXPLICIT_ANCHOR.findall(prose))
    for line in prose.split("\n"):
        m = HEADING.match(line)
        if not m:
            continue
        out.update(EXPLICIT_ANCHOR.findall(m.group(2)))
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


@cache
def cli_constant(name: str) -> ast.expr:
    """The value of the module-level constant `name` in pipelines/cli.py, as a syntax tree."""
    tree = ast.parse((ROOT / "pipelines" / "cli.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name:
            return node.value
    raise AssertionError(f"pipelines/cli.py has no {name}")


@cache
def command_list() -> tuple[tuple[str, ...], ...]:
    """The keys of COMMANDS in pipelines/cli.py, in order (tuples of words)."""
    table = cli_constant("COMMANDS")
    assert isinstance(table, ast.Dict), "COMMANDS is not a dict literal"
    return tuple(ast.literal_eval(k) for k in table.keys)


def commands() -> frozenset[tuple[str, ...]]:
    return frozenset(command_list())


def is_argument(word: str) -> bool:
    return word.startswith("-") or any(c in word for c in "/.=…") or word != word.lower()


def command_problem(words: list[str]) -> str | None:
    """Why `gristmill WORDS…` is not a real command, or None."""
    keys = commands()
    if not words or is_argument(words[0]):
        return None
    first = words[0]
    if (first,) in keys:
        return None
    if not any(k[0] == first for k in keys):
        return f"'{first}' is no gristmill command"
    if len(words) > 1 and not is_argument(words[1]) and (first, words[1]) not in keys:
        return f"'{first} {words[1]}' is no gristmill command"
    return None


def test_docs_exist_and_the_readme_is_a_front_page():
    assert len(DOCS) > 1, "no docs/*.md pages"
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: keep it a front page (≤ 250), move the rest to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_relative_links_resolve(doc: Path):
    prose, _ = split_code(doc.read_text(encoding="utf-8"))
    text = blank_inline_code(prose)
    problems = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http(s):, mailto: …
            continue
        where = f"{rel(doc)}:{line_of(text, m.start(1))}: [{target}]"
        path_part, _, anchor = target.partition("#")
        dest = doc if not path_part else (doc.parent / path_part).resolve()
        if not dest.exists():
            problems.append(f"{where}: {path_part} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading or <a id> '{anchor}' in {rel(dest)}")
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_config_paths_exist(doc: Path):
    text = doc.read_text(encoding="utf-8")
    problems = [
        f"{rel(doc)}:{line_of(text, m.start())}: {m.group(0)} does not exist"
        for m in CONFIG_PATH.finditer(text)
        if not (ROOT / m.group(0)).is_file()
    ]
    assert not problems, "missing configs:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_toml_examples_parse(doc: Path):
    """A TOML example a reader copies must load (two joined keys with `;`: review R2)."""
    import tomllib

    text = doc.read_text(encoding="utf-8")
    problems = []
    for m in re.finditer(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        try:
            tomllib.loads(m.group(1))
        except tomllib.TOMLDecodeError as e:
            problems.append(f"{rel(doc)}:{line_of(text, m.start())}: {e}")
    assert not problems, "TOML examples that do not load:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_gristmill_commands_are_real(doc: Path):
    text = doc.read_text(encoding="utf-8")
    prose, code = split_code(text)
    pieces = list(code)  # (line, text) of fenced code
    for m in INLINE_CODE.finditer(prose):
        pieces.append((line_of(prose, m.start()), m.group(2)))
    problems = []
    for n, piece in pieces:
        for c in COMMAND.finditer(piece):
            problem = command_problem(c.group(1).split())
            if problem:
                problems.append(f"{rel(doc)}:{n}: `gristmill{c.group(1)}`: {problem}")
    assert not problems, "unknown commands:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_backticked_repository_paths_exist(doc: Path):
    prose, _ = split_code(doc.read_text(encoding="utf-8"))
    problems = []
    for m in INLINE_CODE.finditer(prose):
        for word in m.group(2).split():
            word = word.rstrip(",;:)").lstrip("(")
            if REPO_PATH.match(word) and not (ROOT / word).exists():
                problems.append(f"{rel(doc)}:{line_of(prose, m.start())}: `{word}` does not exist")
    assert not problems, "stale paths:\n" + "\n".join(problems)


def test_slug_rules():
    phases = "Phases and mixtures (`[[data.sources]]`, `[[phase]]`)"
    assert slug(phases) == "phases-and-mixtures-datasources-phase"
    assert slug("The loader (`training/data/loader.py`)") == "the-loader-trainingdataloaderpy"
    assert slug("On a GPU: speed, and the CUDA test suite") == "on-a-gpu-speed-and-the-cuda-test-suite"
    assert slug("`--sql` is read-only") == "--sql-is-read-only"
    assert slug("snake_case and **bold**") == "snake_case-and-bold"


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, number of lines) of each paragraph of a markdown text: runs of prose lines
    outside code blocks, each list item its own, headings and table rows none."""
    prose, _ = split_code(text)
    found, start, count = [], 0, 0
    for n, line in enumerate(prose.split("\n") + [""], start=1):
        stripped = line.strip()
        item = re.match(r"^\s*([-*+]|\d+[.)])\s", line)
        if not stripped or stripped.startswith("|") or HEADING.match(line) or item:
            if count:
                found.append((start, count))
            start, count = (n, 1) if item else (0, 0)
        else:
            start, count = (start or n), count + 1
    return found


def test_no_readme_paragraph_is_longer_than_12_lines():
    long = [(n, c) for n, c in paragraphs((ROOT / "README.md").read_text(encoding="utf-8")) if c > 12]
    assert not long, (
        "README.md: paragraphs of more than 12 lines (make a table or a list, or move it to docs/): "
        + (", ".join(f"line {n} ({c} lines)" for n, c in long))
    )


def test_paragraphs_are_counted_as_rendered():
    text = "a\nb\n\n```\nc\nd\n```\n- e\n  f\n- g\n\n| h |\n| --- |\n## i\nj\n"
    assert paragraphs(text) == [(1, 2), (8, 2), (10, 1), (15, 1)]


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of each body row of the first table under `heading` (a '## ' heading)."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_the_demo_table_is_the_demos_stages_with_the_seconds_of_its_summary():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = table_rows(text, "Two commands")
    stages = ast.literal_eval(cli_constant("DEMO_STAGES"))
    assert [r[0] for r in rows] == list(stages), (
        "README.md's demo table: one row per DEMO_STAGES entry, in order"
    )
    seconds = [int(r[3]) for r in rows]
    total = int(re.search(r"its stages took (\d+) s", text).group(1))
    # each row is the summary's figure rounded to a second: their sum is the total within rounding
    assert abs(sum(seconds) - total) <= len(seconds) // 2 + 1, (seconds, total)


def test_the_command_list_is_the_readmes_table_of_commands():
    rows = table_rows((ROOT / "README.md").read_text(encoding="utf-8"), "Commands")
    listed = [tuple(r[0].strip("`").split()[1:]) for r in rows]
    assert listed == list(command_list()), "README.md's command table: COMMANDS' keys, in their order"


PACKAGE_ROOTS = ("pipelines", "tokenization", "training", "validation")
ENTRY = re.compile(r"^( {0,2})([\w.-]+)/ {2,}(.*)$")


def design_layout() -> tuple[list[str], dict[str, str]]:
    """docs/design.md's layout block: (the files of its first line, {folder: its entry's text})."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = text.split("\n## Layout\n", 1)[1].split("```\n", 1)[1].split("\n```", 1)[0].splitlines()
    entries: dict[str, str] = {}
    parent = current = ""
    for line in block[1:]:
        m = ENTRY.match(line)
        if m:
            indent, name, rest = m.groups()
            current = f"{parent}/{name}" if indent else name
            parent = parent if indent else name
            entries[current] = rest
        else:
            assert current and line.startswith(" " * 15), (
                f"docs/design.md layout: a line of no entry: {line!r}"
            )
            entries[current] += " " + line.strip()
    return block[0].split(), entries


def test_the_design_layout_is_the_one_listing_of_the_folders():
    files, entries = design_layout()
    problems = [f"{f} does not exist" for f in files if not (ROOT / f).exists()]
    packages = sorted(
        str(p.parent.relative_to(ROOT)) for top in PACKAGE_ROOTS for p in (ROOT / top).rglob("__init__.py")
    )
    problems += [f"{p}/ (a package) has no entry" for p in packages if p not in entries]
    for folder, text in entries.items():
        if not (ROOT / folder).is_dir():
            problems.append(f"{folder}/ does not exist")
            continue
        for name in re.findall(r"(?<![\w./-])([\w/]+\.py)\b", text):
            path = ROOT / name if "/" in name else ROOT / folder / name
            if not path.is_file():
                problems.append(f"{folder}/: {name} is not {'a file' if '/' in name else 'a module of it'}")
    assert not problems, "docs/design.md's layout against the packages:\n" + "\n".join(problems)
