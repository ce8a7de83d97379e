"""`gristmill data inspect`: what the model saw at step K, reproduced from the config alone.

Prints one step's batch — per sequence, the documents it is cut from (manifest key, source id,
token range), their token ids and a decoded excerpt — or, with --hash, one sha256 per step for
steps [--step, --end), equal to `training.loader.batch_sha256` of the batches the trainer got.
`tokenizers` is imported inside run() only: training code must import without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from training.contract.dataset_format import TOKENIZER_JSON, manifest_files
from training.loader import LoaderConfigError, TokenLoader, batch_sha256


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", help="dataset directory (holds dataset.json)")
    p.add_argument("--seq-len", type=int, required=True, help="training seq_len")
    p.add_argument("--global-batch", type=int, required=True, help="global batch in sequences (G)")
    p.add_argument("--seed", type=int, required=True, help="data seed of the run")
    p.add_argument("--step", type=int, default=0, help="global step (counting across epochs); default 0")
    p.add_argument("--end", type=int, help="with --hash: hash steps [--step, --end); default --step + 1")
    p.add_argument("--hash", action="store_true", help="print one sha256 per step instead of the batch")
    p.add_argument("--rank", type=int, default=0, help="show this rank's slice (default 0)")
    p.add_argument("--world-size", type=int, default=1, help="number of data-parallel ranks (default 1)")
    p.add_argument("--split", choices=["train", "val"], default="train")
    p.add_argument("--val-fraction", type=float, default=0.0, help="the run's data.val_fraction")
    p.add_argument("--max-rows", type=int, default=8, help="sequences to print (0: all); default 8")


def run(args: argparse.Namespace) -> int:
    world = args.world_size
    if world < 1 or args.global_batch % world:
        raise LoaderConfigError(
            f"--global-batch {args.global_batch} is not divisible by --world-size {world}"
        )
    loader = TokenLoader(
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
    )
    spe = loader.steps_per_epoch
    end = args.step + 1 if args.end is None else args.end
    if args.step < 0 or end <= args.step:
        raise LoaderConfigError(f"need 0 ≤ --step < --end, got --step {args.step} --end {end}")
    print(
        f"# dataset {args.dataset} fingerprint {loader.info['fingerprint']} split {args.split} "
        f"val_fraction {args.val_fraction} seed {args.seed} seq_len {args.seq_len} "
        f"global_batch {args.global_batch} rank {args.rank}/{world}: {spe} steps/epoch, "
        f"{loader.dropped_tail_tokens} tail tokens dropped per epoch"
    )
    epoch, batch = divmod(args.step, spe)
    loader.load_state_dict({**loader.state_dict(), "epoch": epoch, "batch": batch})
    if args.hash:
        for step, micro in zip(range(args.step, end), loader):
            print(f"{step} {batch_sha256(micro)}")
        return 0
    micro = next(iter(loader))
    _print_batch(loader, args, micro)
    return 0


def _print_batch(loader: TokenLoader, args: argparse.Namespace, micro: list) -> None:
    docs_table = loader.documents
    docs, starts, counts = loader.builder.segments(args.step)
    tokens = docs_table.read(docs, starts, counts)
    window = args.seq_len + 1
    nrows = len(tokens) // window
    first_row = args.rank * nrows
    epoch, batch = divmod(args.step, loader.steps_per_epoch)
    print(
        f"step {args.step} = epoch {epoch} batch {batch}; rows {first_row}..{first_row + nrows - 1} of the "
        f"global batch; sha256 {batch_sha256(micro)}"
    )
    print(
        f"each row is {window} stream tokens: input_ids are the first {args.seq_len}, labels the last "
        f"{args.seq_len}; position ids restart at 0 at each document start"
    )
    tokenizer, why_not = _tokenizer(Path(args.dataset))
    if tokenizer is None:
        print(f"({why_not}: ids only)")
    keys = _manifest_keys(Path(args.dataset), np.unique(docs).astype(np.int64))  # docs are manifest rows
    piece_at = np.cumsum(counts) - counts  # each piece's first token within `tokens`
    show = nrows if args.max_rows <= 0 else min(args.max_rows, nrows)
    for r in range(show):
        lo, hi = r * window, (r + 1) * window
        row = tokens[lo:hi]
        head = " ".join(map(str, row[:16].tolist())) + (" …" if len(row) > 16 else "")
        print(f"row {first_row + r}: ids {head}")
        # The pieces overlapping [lo, hi), clipped to the row.
        for k in np.flatnonzero((piece_at < hi) & (piece_at + counts > lo)).tolist():
            a, b = max(int(piece_at[k]), lo), min(int(piece_at[k] + counts[k]), hi)
            doc = int(docs[k])
            first = int(starts[k]) + a - int(piece_at[k])
            key, source_id = keys[doc]
            length = int(docs_table.lengths[doc])
            line = f"  {key} (id {source_id}) tokens [{first}, {first + b - a}) of {length}"
            if tokenizer is not None:
                text = tokenizer.decode(tokens[a:b].tolist(), skip_special_tokens=False)
                line += f": {text[:160] + ('…' if len(text) > 160 else '')!r}"
            print(line)
    if show < nrows:
        print(f"… {nrows - show} more rows (--max-rows 0 prints all)")


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
    base = 0
    for path in manifest_files(root):
        n = pq.ParquetFile(path).metadata.num_rows
        wanted = rows[(rows >= base) & (rows < base + n)]
        if len(wanted):
            t = pq.read_table(path, columns=["key", "id"]).take(wanted - base)
            for row, key, source_id in zip(
                wanted.tolist(), t.column("key").to_pylist(), t.column("id").to_pylist()
            ):
                out[row] = (key, source_id)
        base += n
    return out
