"""`gristmill data inspect`: what the model saw at step K, reproduced from the config alone.

Prints one step's batch — per sequence, the documents it is cut from (source, manifest row and key,
token range), their token ids and a decoded excerpt — or, with --hash, one sha256 per step for
steps [--step, --end), equal to `training.data.loader.batch_sha256` of the batches the trainer got.

Given a training run directory (`gristmill data inspect RUN --step 12000`), the plan comes from
RUN/config.toml (every source and phase), checked against the datasets the run recorded
(RUN/data_plan.json), whose rewinds' skips mark the steps never trained on; given a dataset
directory, the geometry comes from the flags. Either way steps count as the trainer logs them in
metrics.jsonl, from 1.
`tokenizers` is imported inside run() only: training code must import without it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from training.config_checks import check_data_seed
from training.console import answer_on_stdout
from training.contract.config_loader import PathArgument
from training.contract.dataset_format import (
    DATASET_JSON,
    MANIFEST_DIR,
    TOKENIZER_JSON,
    DatasetError,
    manifest_files,
    read_dataset_info,
    unlike_record,
)
from training.contract.object_store import is_url
from training.contract.run_layout import CONFIG_TOML, is_training_run, unlike_a_run
from training.data.loader import LoaderConfigError, TokenLoader, batch_sha256, dataset_loader
from training.data.plan import MAX_EPOCHS_ASKED, skip_of
from training.data.remote import add_cache_argument, cache_of, ensure_dirs, origin


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dataset",
        metavar="DATASET",  # as its refusals name it
        action=PathArgument,
        help="training run directory (holds config.toml), or a dataset directory",
    )
    p.add_argument("--seq-len", type=int, help="dataset mode: training seq_len")
    p.add_argument("--global-batch", type=int, help="dataset mode: global batch in sequences (G)")
    p.add_argument("--seed", type=int, help="dataset mode: data seed of the run")
    p.add_argument(
        "--step",
        type=int,
        help="the trainer's step, counted from 1 as in metrics.jsonl (default 1), in both modes",
    )
    p.add_argument("--end", type=int, help="with --hash: hash steps [--step, --end); default --step + 1")
    p.add_argument(
        "--hash",
        action="store_true",
        help="print one sha256 per step instead of the batch (of --rank's rows where --world-size > 1; a "
        "run records the whole batch's)",
    )
    p.add_argument("--rank", type=int, default=0, help="show this rank's slice (default 0)")
    p.add_argument("--world-size", type=int, default=1, help="number of data-parallel ranks (default 1)")
    p.add_argument("--split", choices=["train", "val"], help="dataset mode: split (default train)")
    p.add_argument("--val-fraction", type=float, help="dataset mode: the run's data.val_fraction (default 0)")
    p.add_argument("--max-rows", type=int, default=8, help="sequences to print (0: all); default 8")
    add_cache_argument(p, bounded=True)


# The options of dataset mode, which a run directory's config.toml answers itself.
DATASET_MODE = ("seq_len", "global_batch", "seed", "split", "val_fraction", "cache_dir", "cache_gb")


def run(args: argparse.Namespace) -> int:
    with answer_on_stdout():  # the batch, or the hashes compared with another copy's
        return _inspect(args)


def _inspect(args: argparse.Namespace) -> int:
    world = args.world_size
    if world < 1:  # a run directory's plan divided by it (ZeroDivisionError: review R21b F11)
        raise LoaderConfigError(f"--world-size must be at least 1, got {world}")
    if not 0 <= args.rank < world:  # the loader's refusal named its own "loader rank", "world_size"
        raise LoaderConfigError(
            f"--rank {args.rank}: give a rank from 0 to {world - 1} (--world-size {world})"
        )
    if args.max_rows < 0:  # was taken as 0, every row, without a word (review R21b)
        raise LoaderConfigError(f"--max-rows {args.max_rows}: give the rows to print, ≥ 1 (0: all)")
    if args.end is not None and not args.hash:  # step --step alone was shown, without a word (RV68c F4)
        raise LoaderConfigError(
            f"--end {args.end} is --hash's (hash steps --step to --end); add --hash, or drop --end to see "
            "the documents of step --step"
        )
    root = Path(args.dataset)
    if not is_url(args.dataset):  # a dataset in a bucket; a run directory is always local
        if not root.is_dir():
            raise LoaderConfigError(
                f"{unlike_a_run(root)}: pass a training run directory (holds {CONFIG_TOML}) or a dataset "
                f"directory (holds {DATASET_JSON})"
            )
        if is_training_run(root):
            # a run's config.toml decides them: given here, they changed nothing (--split val showed
            # training batches)
            given = [f"--{f.replace('_', '-')}" for f in DATASET_MODE if getattr(args, f) not in (None, "")]
            if given:
                raise LoaderConfigError(
                    f"{root} is a training run, whose config.toml decides {', '.join(given)}: drop "
                    f"{'them' if len(given) > 1 else 'it'}, or pass the dataset directory to inspect it so"
                )
            return _run_mode(args)
        if not (root / DATASET_JSON).is_file():
            raise LoaderConfigError(
                f"{unlike_a_run(root)}, not a training run or a dataset: pass a training run directory or a "
                "dataset directory"
            )
    missing = [f for f in ("seq_len", "global_batch", "seed") if getattr(args, f) is None]
    if missing:
        raise LoaderConfigError(
            f"{args.dataset} is a dataset directory: give "
            + ", ".join("--" + f.replace("_", "-") for f in missing)
            + " (or pass a training run directory, whose config.toml has them)"
        )
    check_data_seed("--seed", args.seed)
    args.split, args.val_fraction = args.split or "train", args.val_fraction or 0.0
    # in the flags' words: the loader's own refusals name its arguments ("loader seq_len must be …",
    # "val_fraction 2.0 must be in [0, 1)")
    for flag, value in (("--seq-len", args.seq_len), ("--global-batch", args.global_batch)):
        if value < 1:
            raise LoaderConfigError(f"{flag} {value}: give the run's value, ≥ 1")
    if not 0 <= args.val_fraction < 1:  # nan too
        raise LoaderConfigError(
            f"--val-fraction {args.val_fraction}: give the run's data.val_fraction, in [0, 1)"
        )
    if args.split == "val" and args.val_fraction == 0:
        raise LoaderConfigError(
            "--split val holds no document with --val-fraction 0: give the run's data.val_fraction (> 0)"
        )
    if world < 1 or args.global_batch % world:
        raise LoaderConfigError(
            f"--global-batch {args.global_batch} is not divisible by --world-size {world}"
        )
    loader = dataset_loader(
        args.dataset,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        micro_batch=args.global_batch // world,
        seed=args.seed,
        rank=args.rank,
        world_size=world,
        split=args.split,
        val_fraction=args.val_fraction,
        check_separators=True,
        cache=cache_of(args),
    )
    for table in loader.builder.tables:  # what it shows and hashes, held to the documents' sha256 (as
        table.verify_documents = True  # run_plan's tables are: trial RV62a F1)
    spe, tail = loader.steps_per_epoch, loader.dropped_tail_tokens
    step, end = _steps(args, None)
    if end - 1 > MAX_EPOCHS_ASKED * spe:  # each epoch's order before it is walked: hours (trial RV74c 3)
        given = f"--step {step}" if args.end is None else f"--end {end}"
        raise LoaderConfigError(
            f"{given} lies past the {MAX_EPOCHS_ASKED:,} epochs a run reads of a dataset at most ({spe:,} "
            f"steps an epoch at --seq-len {args.seq_len} --global-batch {args.global_batch}); give steps up "
            f"to {MAX_EPOCHS_ASKED * spe:,}"
        )
    print(
        f"# dataset {args.dataset} fingerprint {loader.info['fingerprint']} split {args.split} "
        f"val_fraction {args.val_fraction} seed {args.seed} seq_len {args.seq_len} "
        f"global_batch {args.global_batch} rank {args.rank}/{world}: {spe} steps/epoch, "
        f"{tail} tail tokens dropped per epoch"
    )
    epoch, batch = divmod(step - 1, spe)
    loader.seek(step - 1)
    if args.hash:
        for s, micro in zip(range(step, end), loader):
            print(f"{s} {_digest(micro, args)}")
        return 0
    micro = next(iter(loader))
    print(f"step {step} = epoch {epoch} batch {batch}; sha256 {_digest(micro, args)}")
    _print_batch(loader, step - 1, args, micro)
    return 0


def _steps(args: argparse.Namespace, total: int | None) -> tuple[int, int]:
    """(--step, --end) counted from 1 as in metrics.jsonl; `total`: the run's last step, if known."""
    step = 1 if args.step is None else args.step
    end = step + 1 if args.end is None else args.end
    if step < 1:
        raise LoaderConfigError(
            f"--step counts from 1 (the trainer's first step, as in metrics.jsonl), got {step}"
        )
    if total is not None and step > total:
        raise LoaderConfigError(f"--step {step} is past the run's plan of {total} steps (counted from 1)")
    if args.end is not None and not step < end <= (total or end) + 1:
        bound = "" if total is None else f" ≤ {total + 1} (the run's plan has {total} steps)"
        raise LoaderConfigError(f"need --step < --end{bound}, got --step {step} --end {end}")
    return step, end


def _run_mode(args: argparse.Namespace) -> int:
    """The batch of trainer step --step (from 1) of a run, from its config.toml: every source and phase."""
    from training.data.recipe import run_plan, skip_cause, skip_lines

    plan, tables, skips = run_plan(Path(args.dataset))  # a rebuilt source: refused
    shared = math.gcd(*(ph.global_batch for ph in plan.phases))  # sequences every phase's batch splits into
    if shared % args.world_size:  # the rows of each phase's batch, split among the ranks
        sizes = sorted({ph.global_batch for ph in plan.phases})
        listed = ", ".join(map(str, sizes))
        batches = f"a global batch of {listed}" if len(sizes) == 1 else f"global batches of {listed}"
        raise LoaderConfigError(
            f"--world-size {args.world_size}: the run has {batches} sequences, which {args.world_size} "
            f"ranks cannot share; give a world size that divides "
            f"{'it' if len(sizes) == 1 else 'each'} "
            f"({', '.join(str(d) for d in range(1, shared + 1) if shared % d == 0)})"
        )
    step, end = _steps(args, plan.total_steps)
    loader = TokenLoader(
        plan,
        tables,
        micro_batch=tuple(ph.global_batch // args.world_size for ph in plan.phases),
        rank=args.rank,
        world_size=args.world_size,
        check_separators=True,
    )
    loader.seek(step - 1)
    print(
        f"# run {args.dataset}: {len(plan.sources)} source(s) "
        + ", ".join(f"{s.name} = {s.dataset}" for s in plan.sources)
        + f"; seed {plan.seed}; rank {args.rank}/{args.world_size}"
    )
    if skips:
        skipped = sum(r["skipped_tokens"] for r in plan.consumed(plan.total_steps, skips))
        print(f"# {len(skips)} rewind(s), {skipped:,} tokens skipped (read, never trained):")
        for line in skip_lines(plan, skips):
            print(f"#   {line}")
    if args.hash:
        for s, micro in zip(range(step, end), loader):
            skip = skip_of(skips, s)
            print(f"{s} {_digest(micro, args)}" + (f" skipped (rewind {skip.rewind})" if skip else ""))
        return 0
    micro = next(iter(loader))
    p, k = plan.locate(step - 1)
    ph = plan.phases[p]
    skip = skip_of(skips, step)
    skipped = (
        f"; SKIPPED by rewind {skip.rewind} ({skip_cause(skip)}): these windows were not trained on"
        if skip
        else ""
    )
    print(
        f"step {step} = phase {ph.name!r} step {k + 1} of {ph.steps} ({ph.global_batch} sequences × "
        f"{ph.seq_len} = {ph.global_batch * ph.seq_len:,} tokens){skipped}; sha256 {_digest(micro, args)}"
    )
    _print_batch(loader, step - 1, args, micro)
    return 0


def _digest(micro: list, args: argparse.Namespace) -> str:
    """The sha256 of this rank's part of a step: a rank's rows have a digest of their own, not the
    whole batch's that a run records, and say so (review R24a 2; the batch's header too: R24e 3)."""
    rows = f" rank {args.rank}/{args.world_size}'s rows" if args.world_size > 1 else ""
    return f"{batch_sha256(micro)}{rows}"


def _print_batch(loader: TokenLoader, step: int, args: argparse.Namespace, micro: list) -> None:
    """Each row of this rank's part of 0-based global step `step`: its document pieces by source."""
    plan = loader.plan
    src, docs, starts, counts, tokens = loader.builder.read(step)
    seq_len = plan.phases[plan.locate(step)[0]].seq_len
    window = seq_len + 1
    nrows = len(tokens) // window
    first_row = args.rank * nrows
    print(
        f"rows {first_row}..{first_row + nrows - 1} of the global batch; each row is {window} stream tokens: "
        f"input_ids are the first {seq_len}, labels the last {seq_len}; position ids restart at 0 at each "
        "document start"
    )
    tables = loader.builder.tables
    decoders, keys = {}, {}
    for i in np.unique(src).tolist():
        ensure_dirs(tables[i].root, TOKENIZER_JSON, MANIFEST_DIR)  # a bucket's dataset: fetched, checked
        decoders[i], why_not = _tokenizer(tables[i].root)
        if decoders[i] is None:
            print(f"({plan.sources[i].name}: {why_not}: ids only)")
        rows = np.unique(docs[src == i]).astype(np.int64)  # docs are manifest rows
        keys[i] = _manifest_keys(tables[i].root, rows)
    piece_at = np.cumsum(counts) - counts  # each piece's first token within `tokens`
    show = nrows if args.max_rows == 0 else min(args.max_rows, nrows)
    many = len(plan.sources) > 1
    for r in range(show):
        lo, hi = r * window, (r + 1) * window
        row = tokens[lo:hi]
        head = " ".join(map(str, row[:16].tolist())) + (" …" if len(row) > 16 else "")
        print(f"row {first_row + r}: ids {head}")
        # The pieces overlapping [lo, hi), clipped to the row.
        for k in np.flatnonzero((piece_at < hi) & (piece_at + counts > lo)).tolist():
            a, b = max(int(piece_at[k]), lo), min(int(piece_at[k] + counts[k]), hi)
            i, doc = int(src[k]), int(docs[k])
            first = int(starts[k]) + a - int(piece_at[k])
            key, source_id = keys[i][doc]
            length = int(tables[i].lengths[doc])
            where = f"{plan.sources[i].name} row {doc} " if many else ""
            line = f"  {where}{key} (id {source_id}) tokens [{first}, {first + b - a}) of {length}"
            if decoders[i] is not None:
                line += ": " + _excerpt(decoders[i], tables[i], doc, first, b - a)
            print(line)
    if show < nrows:
        print(f"… {nrows - show} more rows (--max-rows 0 prints all)")


def _excerpt(decoder, table, doc: int, first: int, count: int) -> str:
    """Tokens [first, first + count) of document `doc` as their quoted text, the document's separator
    outside the quotes where the piece holds it: a document whose text holds the separator's string
    (`<|endoftext|>` typed in a web page, encoded as plain tokens) reads apart from the separator."""
    after = table.separator_position == "after"
    sep_at = int(table.lengths[doc]) - 1 if after else 0  # the piece's last token, or its first
    holds = first <= sep_at < first + count
    lo = first + 1 if holds and not after else first
    n = count - 1 if holds else count
    text = piece_text(decoder, table, doc, lo, n) if n else ""
    shown = repr(text[:160] + ("…" if len(text) > 160 else ""))
    if not holds:
        return shown
    sep = f"[separator {decoder.id_to_token(table.separator_id)}]"
    return f"{shown} + {sep}" if after else f"{sep} + {shown}"


# A character is at most 4 UTF-8 bytes and a token at least 1: 3 tokens on either side of a cut hold
# the rest of any character the cut splits.
_CONTEXT = 3


def piece_text(decoder, table, doc: int, first: int, count: int) -> str:
    """The text of tokens [first, first + count) of document `doc` (manifest row) of `table`, less
    the parts of characters the window's edges cut: a token may hold some of the bytes of a
    multi-byte character, which alone decode as U+FFFD. Decoded with up to 3 tokens of the document
    on either side; what the context before decodes to is cut off the front (a character it
    completes included), and a trailing U+FFFD that the context after completes is dropped. A U+FFFD
    that is in the document stays."""
    lo, hi = max(0, first - _CONTEXT), min(int(table.lengths[doc]), first + count + _CONTEXT)
    ids = table.read(np.array([doc]), np.array([lo]), np.array([hi - lo])).tolist()
    a, b = first - lo, first - lo + count

    def decode(part: list[int]) -> str:
        return decoder.decode(part, skip_special_tokens=False)

    upto_b = decode(ids[:b])
    text = upto_b[len(decode(ids[:a])) :]
    whole = decode(ids)
    if text.endswith("\ufffd") and whole[len(upto_b) - 1 : len(upto_b)] != "\ufffd":
        text = text[:-1]  # the start of a character the context after completes
    return text


def _manifest_as_built(root: Path, info: dict, rel: str) -> None:
    """Refuse a local dataset's manifest part a batch's lines name documents from (their keys and ids)
    that is not the one dataset.json (`info`) records: the loader reads the index and the tokenizer,
    checked, but an edited manifest named other documents than the batch's, exit 0 (review RV51b F2).
    A bucket's copy was checked as `ensure_dirs` made it; a dataset from before the record: nothing
    to check against."""
    if origin(root) is None and unlike_record(root, info, lambda r: r == rel) is not None:
        raise DatasetError(
            f"{root / rel}: not the file {root / DATASET_JSON} records (its sha256 differs): changed after "
            f"the build, it would name other documents than the batch's; restore it or rebuild "
            f"(`gristmill data validate {root}` lists what differs)"
        )


def _tokenizer(root: Path):
    """(the dataset's tokenizer, None) or (None, why not). Decoding is optional: a GPU box may lack
    the `tokenizers` package, and the training package must not need it."""
    path = root / TOKENIZER_JSON
    if not path.is_file():
        return None, f"no {TOKENIZER_JSON} in the dataset"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None, "the tokenizers package is not installed, so no decoded text (pip install tokenizers)"
    return Tokenizer.from_file(str(path)), None


def _manifest_keys(root: Path, rows: np.ndarray) -> dict[int, tuple[str, str]]:
    """{manifest row: (key, source id)} for the given rows, reading only the files that hold them."""
    out: dict[int, tuple[str, str]] = {}
    base, info = 0, read_dataset_info(root)
    for path in manifest_files(root):
        n = pq.ParquetFile(path).metadata.num_rows
        wanted = rows[(rows >= base) & (rows < base + n)]
        if len(wanted):
            _manifest_as_built(root, info, f"{MANIFEST_DIR}/{path.name}")
            t = pq.read_table(path, columns=["key", "id"]).take(wanted - base)
            for row, key, source_id in zip(
                wanted.tolist(), t.column("key").to_pylist(), t.column("id").to_pylist()
            ):
                out[row] = (key, source_id)
        base += n
    return out
