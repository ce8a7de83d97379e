"""The decontamination index: its files, the text normaliser, n-gram hashing and lookup.

    DIR/ngrams.npy      uint64, sorted, unique per task: the hash of every word n-gram of the indexed
                        texts, once for each task that holds it (an index written before 2026-12-01:
                        once, for the first)
    DIR/refs.npy        uint32 (N, 2), row i names where ngrams[i] first occurs in its task: (task
                        number, document)
    DIR/manifest.json   format, n, normaliser, lm-eval version, per task (name, split, documents,
                        n-grams, version), the sha256 of the two .npy files

Both sides use this module: `gristmill data decontam-index` (pipelines/decontam/index.py, which
reads the tasks through lm-eval) writes an index with `write_index`, and the build's filter
(pipelines/decontam/filter.py) opens it with `NgramIndex`. Only numpy and the standard library here, so
build workers on a cluster never import lm-eval; and one normaliser, so a text hashes the same on
both sides.

Normalising: lowercase and NFKC (a page in decomposed Unicode, with ligatures or fullwidth letters,
renders as the eval item and must hash as it does), invisible format characters (soft hyphens,
zero-width spaces) and variation selectors removed, then every run of letters and digits, with the
combining marks that follow them (an Indic vowel sign is part of its word), is a word; punctuation,
underscores and whitespace only separate words ("The cat's-paw!" → the, cat, s, paw). A text written
without spaces (Chinese, Japanese, Thai, Khmer…) is one word per run. `normalize_words` is the
definition (a regex); `Words.of` is the same split done with numpy (a per-codepoint table of
str.isalnum and the marks, which is what the regex tests), since the filter sees every training
document and a Python step per word would cost as much as the tokenizer.

Hashing, in a few dozen array operations per document: a word's hash is the polynomial of its
codepoints modulo 2^64 (prefix sums in numpy's wrapping uint64 arithmetic) put through splitmix64's
finaliser; an n-gram's hash is the polynomial of its n word hashes with another odd base. Two
n-grams that differ in one word never collide (powers of an odd number are invertible modulo 2^64);
otherwise a false match is as likely as for random 64-bit values: about 0.5 expected for a
10M-n-gram index against 10^12 training n-grams, and each match is recorded with its text.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.contract.atomic_write import atomic_path, write_atomic
from training.contract.dataset_format import (
    DECONTAM_FILES,
    DECONTAM_FILTER,
    DECONTAM_MANIFEST,
    DECONTAM_SEAL,
    decontam_sha256,
)
from training.contract.errors import GristmillError
from training.contract.integrity import seal_broken, sealed

FORMAT = "gristmill-decontam/2"  # /2: the manifest sealed (DECONTAM_SEAL), which it must then carry
# /1 (before the seal) held an older normaliser: a /1 manifest naming this one was edited, and its n
# trusted unsealed decontaminated nothing (trial RV64b S2)
NORMALIZER = "nfkc-lower-alnum-words/4"  # change it with normal_form/_words: old indexes are refused
# /3 (a day): combining marks are word characters; /4: the marks after a letter or digit are part of its
# word, variation selectors removed (trial RV62h 1, reviews RV63d 1, RV63f 3)
HASHES_NPY, REFS_NPY = DECONTAM_FILES
MANIFEST_JSON = DECONTAM_MANIFEST
FILTER_NAME = DECONTAM_FILTER
# What an index's documents_without_ngrams means, and what to do
UNCHECKED = (
    "evaluation documents with no {n}-gram: {count:,} (every text under {n} words, its template's own "
    "words not counted, as arc's 'Question: … Answer:'; a text without "
    "spaces, as Chinese or Thai, being one word; or no text at all): no training document is checked "
    "against them; a smaller decontaminate.ngram (--ngram) checks more, in a new output; see "
    "docs/dedup-and-decontamination.md, 'Documents shorter than n'"
)

_P = 0x100000001B3  # per-character base (odd: invertible modulo 2^64)
_M = 0x9E3779B97F4A7C15  # per-word base (odd)
_is_word: np.ndarray | None = None  # codepoint -> _word_table's bool, built on first use (~1 s)
_powers: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # base -> (base^i, base^-i) mod 2^64
_BIT = np.left_shift(np.uint8(1), np.arange(8, dtype=np.uint8))  # bit k of a byte


class DecontamIndexError(GristmillError):
    """A decontamination index that cannot be used; the message names the file and the fix."""


@functools.cache
def _masks() -> tuple[np.ndarray, np.ndarray]:
    """(invisible, mark), a bool per codepoint, from one scan of Unicode's categories (~0.5 s; the
    categories themselves are not kept: 80 MiB as strings in every build worker, review RV63f 4).
    Invisible: the format characters (Cf: soft hyphen, zero-width space and joiners, byte order mark…),
    which split a word where a reader sees none, and the variation selectors (❤ and ❤️: text or emoji
    style, category Mn but no part of a word). Mark: a combining mark that belongs to the word it
    follows (Mn, Mc: Devanagari's and Tamil's vowel signs and viramas, which NFKC keeps apart from
    their letters), not an enclosing one (Me: a keycap, a circle drawn around a character)."""
    code = {"Cf": 1, "Mn": 2, "Mc": 2}
    kinds = np.fromiter(
        (code.get(unicodedata.category(chr(c)), 0) for c in range(0x110000)), np.uint8, 0x110000
    )
    selector = np.zeros(0x110000, bool)
    selector[0xFE00:0xFE10] = selector[0xE0100:0xE01F0] = True
    return (kinds == 1) | selector, (kinds == 2) & ~selector


def _class_of(mask: np.ndarray) -> str:
    """A regex class of the codepoints `mask` holds, as ranges (a class of single characters scans
    ~8x slower)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return (
        "["
        + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b - 1))}" for a, b in zip(edges[::2], edges[1::2]))
        + "]"
    )


@functools.cache
def _invisible() -> re.Pattern:
    """What normal_form removes (_masks: format characters and variation selectors)."""
    return re.compile(_class_of(_masks()[0]))


@functools.cache
def _words() -> re.Pattern:
    """The reference definition of a word (the fast path, _word_table, agrees with it): a letter or digit
    (str.isalnum: `[^\\W_]`), then letters, digits and the combining marks that follow them (_masks).
    Without the marks कातिब and किताब were both the words क, त, ब, and distinct texts shared n-grams
    (trial RV62h 1); a mark after no letter (a stray accent) is no word, as punctuation is not."""
    return re.compile(rf"[^\W_](?:[^\W_]|{_class_of(_masks()[1])})*")


def normal_form(text: str) -> str:
    """`text` as both sides of decontamination hash it (the module docstring): NFKC, lowercased (and
    NFKC again: lowercasing can undo it, İ → i + a combining dot), no format characters. NFKC comes
    first: it maps letters that have no lowercase of their own (mathematical 𝐓, ℍ) to ASCII capitals.
    ASCII text (most pages) is its lowercase: NFKC keeps it and it holds no format character."""
    if text.isascii():
        return text.lower()
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).lower())
    return _invisible().sub("", text) if _invisible().search(text) else text


def normalize_words(text: str) -> list[str]:
    """The words of `text` as both sides of decontamination see them (see the module docstring)."""
    return _words().findall(normal_form(text))


def _word_table() -> np.ndarray:
    """bool per codepoint: a letter or digit (str.isalnum) or a combining mark (_masks), which Words.of
    takes for a word's characters, then drops the marks that begin a run: it splits exactly where the
    regex _words does."""
    global _is_word
    if _is_word is None:
        _is_word = np.fromiter(map(str.isalnum, map(chr, range(0x110000))), bool, 0x110000) | _masks()[1]
    return _is_word


def _pow_tables(base: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(base^i, base^-i) mod 2^64 for i < length, grown by doubling and kept per process."""
    have = _powers.get(base)
    if have is None or len(have[0]) < length:
        size = max(1 << 12, 1 << (length - 1).bit_length())
        up = np.full(size, base, np.uint64)
        down = np.full(size, pow(base, -1, 1 << 64), np.uint64)
        up[0] = down[0] = 1
        have = _powers[base] = (np.cumprod(up), np.cumprod(down))  # uint64 products wrap: mod 2^64
    return have


def _window_sums(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: int) -> np.ndarray:
    """sum(values[j] * base^(end-1-j) for j in [start, end)) mod 2^64 per (start, end): a polynomial
    hash of each span in O(1) numpy operations, from prefix sums scaled by inverse powers."""
    up, down = _pow_tables(base, len(values) + 1)
    prefix = np.zeros(len(values) + 1, np.uint64)
    np.cumsum(values * down[: len(values)], out=prefix[1:])
    return (prefix[ends] - prefix[starts]) * up[ends - 1]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads a polynomial hash's low-bit structure over all 64 bits."""
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class Words:
    """A text's normalised words as codepoint spans: word i is chars[starts[i]:ends[i]]."""

    chars: np.ndarray  # uint32 codepoints of normal_form(text)
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, text: str, normal: bool = False) -> Words:
        """`normal`: the caller already put `text` in normal_form (not free)."""
        text = text if normal else normal_form(text)
        chars = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        inside = np.zeros(len(chars) + 2, bool)  # word character or not, padded with a non-word
        np.take(_word_table(), chars, out=inside[1:-1])  # letters, digits and marks
        starts = np.flatnonzero(inside[1:] > inside[:-1])
        mark = _masks()[1]
        stray = starts[mark[chars[starts]]]
        for start in stray:  # marks that begin a run follow no letter: no word (rare: a stray accent)
            end = start
            while end < len(chars) and mark[chars[end]]:
                end += 1
            inside[start + 1 : end + 1] = False
        if len(stray):
            starts = np.flatnonzero(inside[1:] > inside[:-1])
        return cls(chars, starts, np.flatnonzero(inside[1:] < inside[:-1]))

    def __len__(self) -> int:
        return len(self.starts)

    def hashes(self) -> np.ndarray:
        """64-bit hash of each word (depends on the word's characters only, not on its position)."""
        return _mix(_window_sums(self.chars.astype(np.uint64) + np.uint64(1), self.starts, self.ends, _P))

    def text(self, first: int, count: int) -> str:
        """Words first..first+count-1, normalised, joined by single spaces."""
        span = self.chars[self.starts[first] : self.ends[first + count - 1]]
        return " ".join(normalize_words(span.tobytes().decode("utf-32-le", "surrogatepass")))


def ngram_hashes(words: Words, n: int) -> np.ndarray:
    """uint64 hash of each n-gram of `words` (len(words) - n + 1 of them; none when fewer words)."""
    m = len(words) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64)
    first = np.arange(m)
    return _window_sums(words.hashes(), first, first + n, _M)


def text_ngram_hashes(text: str, n: int) -> np.ndarray:
    return ngram_hashes(Words.of(text), n)


def many_ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, text of each) of every n-gram of `texts`, none spanning two texts: the same hashes as
    text_ngram_hashes of each, in one pass (numpy's per-call overhead paid once, not per text)."""
    normal = [normal_form(t) for t in texts]  # it may change a text's length: offsets from these
    offsets = np.cumsum([0] + [len(t) + 1 for t in normal])[:-1]  # texts joined by "\n"
    words = Words.of("\n".join(normal), normal=True)
    m = len(words) - n + 1
    if m <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    owner = np.searchsorted(offsets, words.starts, side="right") - 1
    inside = owner[:m] == owner[n - 1 :]
    return ngram_hashes(words, n)[inside], owner[:m][inside]


# --------------------------------------------------------------------------------------------
# writing


def write_index(
    folder: str | Path,
    n: int,
    tasks: list[dict[str, Any]],
    hashes: list[np.ndarray],
    docs: list[np.ndarray],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the index of `tasks` (manifest entries, in order) into `folder`; returns the manifest.

    `hashes[t]` are task t's n-gram hashes and `docs[t]` the document index of each. An n-gram is kept
    once per task that holds it, named by its first occurrence there (document order), the tasks in
    order: a training document holding an n-gram two tasks share is removed for both (kept once,
    only the first task counted it, and the other's eval mark said "0 docs removed": review R23b S1).
    The manifest is written last: a folder without one is no index."""
    check_task_names(tasks)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_JSON).unlink(missing_ok=True)
    all_h = np.concatenate([np.zeros(0, np.uint64), *hashes]).astype(np.uint64, copy=False)
    refs = np.concatenate(
        [np.zeros((0, 2), np.uint32)]
        + [np.stack([np.full(len(d), t, np.uint32), d.astype(np.uint32)], axis=1) for t, d in enumerate(docs)]
    )
    order = np.argsort(all_h, kind="stable")
    sorted_h = all_h[order]
    task_of = refs[order, 0]  # equal hashes keep the task order (a stable sort of a task-major list)
    first = np.ones(len(sorted_h), bool)
    first[1:] = (sorted_h[1:] != sorted_h[:-1]) | (task_of[1:] != task_of[:-1])
    for name, arr in ((HASHES_NPY, sorted_h[first]), (REFS_NPY, refs[order[first]])):
        with atomic_path(folder / name) as tmp, open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arr))
    manifest = {
        "format": FORMAT,
        "ngram": n,
        "normalizer": NORMALIZER,
        **(extra or {}),
        "tasks": tasks,
        "ngrams": int(first.sum()),
        "sha256": decontam_sha256(folder),
    }
    manifest = sealed(manifest, DECONTAM_SEAL)
    write_atomic(folder / MANIFEST_JSON, json.dumps(manifest, indent=1) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------
# reading

REBUILD = "rebuild it with `gristmill data decontam-index --tasks … --out DIR`"


def read_manifest(folder: str | Path, verify: bool = False) -> dict[str, Any]:
    """DIR/manifest.json, checked (format, normaliser, files present; `verify`: their sha256)."""
    folder = Path(folder)
    path = folder / MANIFEST_JSON
    if not path.is_file():
        what = "does not exist" if not folder.exists() else f"holds no {MANIFEST_JSON}"
        raise DecontamIndexError(
            f"decontamination index {folder} {what}; build one with "
            f"`gristmill data decontam-index --tasks … --out {folder}`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        types = {"tasks": list, "ngram": int, "ngrams": int, "sha256": str}
        ok = isinstance(manifest, dict) and all(isinstance(manifest.get(k), t) for k, t in types.items())
    except (ValueError, UnicodeDecodeError):
        ok = False
    if (
        not ok
        or seal_broken(manifest, DECONTAM_SEAL)
        or (manifest.get("format") == FORMAT) != (DECONTAM_SEAL in manifest)
    ):
        raise DecontamIndexError(f"{path} is not a valid index manifest (cut off or edited); {REBUILD}")
    if manifest.get("format") != FORMAT or manifest.get("normalizer") != NORMALIZER:
        raise DecontamIndexError(
            f"{path}: format {manifest.get('format')!r} / normaliser {manifest.get('normalizer')!r} is not "
            f"{FORMAT!r} / {NORMALIZER!r} (made by another gristmill version); {REBUILD}"
        )
    check_task_names(manifest["tasks"])
    for name in (HASHES_NPY, REFS_NPY):
        if not (folder / name).is_file():
            raise DecontamIndexError(f"{folder / name} is missing; {REBUILD}")
    if verify and decontam_sha256(folder) != manifest["sha256"]:
        raise DecontamIndexError(
            f"{folder}: {HASHES_NPY}/{REFS_NPY} do not match the sha256 in {MANIFEST_JSON} (changed after it "
            f"was written); {REBUILD}"
        )
    return manifest


@dataclass(frozen=True)
class Match:
    """The first indexed n-gram of a document, and how many of its n-grams are indexed."""

    n: int
    task: str
    split: str
    doc: int
    text: str  # the n-gram's normalised words, joined by spaces
    count: int
    also: tuple[str, ...] = ()  # the other tasks any of its indexed n-grams belongs to, in index order

    def detail(self) -> str:
        # excluded/'s reason; read back by tasks_of_detail (dataset.json's removed) and by the SQL of
        # validation/audit_reports.py's "drops" report (its regexes): change all three together
        more = [f"+{self.count - 1} more indexed {self.n}-grams"] if self.count > 1 else []
        more += [f"also {', '.join(self.also)}"] if self.also else []
        shown = f" ({'; '.join(more)})" if more else ""
        return f'{self.n}-gram of {self.task} {self.split} doc {self.doc}: "{self.text}"{shown}'


# The n-gram's text is normalised words (letters and digits, spaces): no quote, parenthesis or ";".
# Match.detail's format; the audit's "drops" SQL (validation/audit_reports.py) parses it too.
# Names hold no whitespace (check_task_names), so "; " and ", " split the parenthesis, whatever else a
# name holds: lm-eval's tmmluplus_education_(profession_level) among them (trial RV64b S1).
_DETAIL = re.compile(r'^\d+-gram of (\S+) \S+ doc \d+: "[^"]*"(?: \((.*)\))?$')


def check_task_names(tasks: list[dict[str, Any]]) -> None:
    """Refuse a task (or split) name Match.detail cannot write so that it reads back: its documents
    were removed and dataset.json counted 0 for it, which the eval's mark then says (trial RV64b S1)."""
    for task in tasks:
        for key in ("name", "split"):
            if re.search(r"\s", str(task.get(key, ""))):
                its = "its name" if key == "name" else f"its split {task.get(key)!r}"
                raise DecontamIndexError(
                    f"task {task['name']!r}: {its} holds whitespace, "
                    "which the build's exclusion records cannot name so that each task's removed count reads "
                    "back; rename it (its YAML's `task:`) and index it again"
                )


def tasks_of_detail(detail: str) -> list[str]:
    """The tasks an excluded/ reason that Match.detail wrote names, its first one first ([] for any
    other text)."""
    m = _DETAIL.match(detail)
    if m is None:
        return []
    also = [part[len("also ") :] for part in (m.group(2) or "").split("; ") if part.startswith("also ")]
    return [m.group(1), *(also[0].split(", ") if also else [])]


class NgramIndex:
    """An index opened for lookups: the .npy files memory-mapped (their pages shared between the
    workers of a machine), plus a bitmap of the hashes' top bits built here (about 32 bits per
    n-gram, at most 128 MiB) that answers most misses without touching the sorted array."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.n = int(self.manifest["ngram"])
        self.tasks = [(t["name"], t["split"]) for t in self.manifest["tasks"]]
        try:
            self.hashes = np.load(self.folder / HASHES_NPY, mmap_mode="r")
            self.refs = np.load(self.folder / REFS_NPY, mmap_mode="r")
        except ValueError as e:
            raise DecontamIndexError(f"{self.folder}: unreadable .npy file ({e}); {REBUILD}") from None
        n = len(self.hashes)
        if self.hashes.dtype != np.uint64 or n != self.manifest["ngrams"] or self.refs.shape != (n, 2):
            raise DecontamIndexError(f"{self.folder}: its .npy files do not match {MANIFEST_JSON}; {REBUILD}")
        log2_bits = min(30, max(16, (32 * n).bit_length()))
        self._shift = np.uint64(64 - log2_bits)
        self._bits = np.zeros(1 << (log2_bits - 3), np.uint8)
        for i in range(0, n, 1 << 22):
            top = self.hashes[i : i + (1 << 22)] >> self._shift
            np.bitwise_or.at(self._bits, top >> np.uint64(3), _BIT[top & np.uint64(7)])

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """bool mask: which of `hashes` are in the index."""
        found = np.zeros(len(hashes), bool)
        if len(self.hashes) == 0 or len(hashes) == 0:
            return found
        top = hashes >> self._shift
        maybe = np.flatnonzero(self._bits[top >> np.uint64(3)] & _BIT[top & np.uint64(7)])
        if len(maybe):
            query = hashes[maybe]
            pos = np.searchsorted(self.hashes, query)
            np.minimum(pos, len(self.hashes) - 1, out=pos)
            found[maybe] = self.hashes[pos] == query
        return found

    def first_matches(self, texts: list[str]) -> list[Match | None]:
        """first_match of each text; the texts are hashed and looked up together (numpy's per-call
        overhead paid once per batch), only those with a hit one by one."""
        hashes, owner = many_ngram_hashes(texts, self.n)
        found = [None] * len(texts)
        for k in np.unique(owner[self.contains(hashes)]).tolist():
            found[k] = self.first_match(texts[k])
        return found

    def first_match(self, text: str) -> Match | None:
        """The first indexed n-gram of `text`, or None."""
        words = Words.of(text)
        hashes = ngram_hashes(words, self.n)
        hit = self.contains(hashes)
        if not hit.any():
            return None
        i = int(np.argmax(hit))
        task, doc = (int(x) for x in self.refs[int(np.searchsorted(self.hashes, hashes[i]))])
        name, split = self.tasks[task]
        # every task any indexed n-gram of the text belongs to (an n-gram is listed once per task)
        found = np.unique(hashes[hit])
        lo, hi = np.searchsorted(self.hashes, found, "left"), np.searchsorted(self.hashes, found, "right")
        rows = np.concatenate([np.arange(a, b) for a, b in zip(lo.tolist(), hi.tolist())])
        also = tuple(self.tasks[t][0] for t in np.unique(self.refs[rows, 0]).tolist() if t != task)
        return Match(self.n, name, split, doc, words.text(i, self.n), int(hit.sum()), also)
