"""The `gristmill` console script: one entry point, subcommands owned by the stage packages.

Each subcommand lives in the module that owns its stage and exposes `add_arguments(parser)` and
`run(args) -> int`. A module is imported only when its command runs, so `gristmill data validate`
does not pay for importing torch, and a stage missing optional extras (lm-eval) does not break the
others. The one-line help of each command sits in the table below rather than in its module, so
that `gristmill --help` (or no command) imports no stage at all: listing the commands costs no
torch, datatrove, duckdb or lm-eval import, and shows every command even where an extra is missing.
"""

from __future__ import annotations

import difflib
import errno
import importlib
import io
import json
import os
import sys

from training.contract.config_loader import CommandParser, bytes_shown
from training.contract.errors import (
    INTERRUPTED,
    INTERRUPTED_EXIT,
    TERMINATED_EXIT,
    GristmillError,
    Terminated,
    exit_on_signal_with,
    hold_closed_streams,
    interrupted,
    print_error,
)

# The stages `gristmill demo` runs, in order (pipelines/demo.py numbers its stages by this tuple).
DEMO_STAGES = ("build", "validate", "audit", "train", "export", "eval", "continue", "rewind", "bucket", "mix")

# (command words) -> (module implementing it, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("data", "build"): (
        "pipelines.build",
        "build validated token shards from a data recipe (configs/data/*.toml)",
    ),
    ("data", "download"): (
        "pipelines.download",
        "pre-fetch a FineWeb-Edu subset's parquet files (resumable, checksummed) for offline builds",
    ),
    ("data", "upload"): (
        "pipelines.upload",
        "copy a built dataset into an s3:// bucket: every file checked by sha256, dataset.json last",
    ),
    ("data", "convert"): (
        "pipelines.convert",
        "rewrite a dataset of an older shard layout in the current one (same documents, same batches)",
    ),
    ("data", "validate"): (
        "validation.validate",
        "re-read every shard and check separators, ids, manifest, hashes and fingerprint",
    ),
    ("data", "audit"): (
        "validation.audit",
        "SQL over a dataset's manifest, exclusions, datatrove stats and fingerprint, and a run's "
        "consumption and evals (duckdb)",
    ),
    ("data", "inspect"): (
        "training.data.inspect",
        "print the batch of a training step (ids, text, source documents) or per-step hashes",
    ),
    ("data", "decontam-index"): (
        "pipelines.decontam.index",
        "index the n-grams of lm-eval tasks' evaluation documents, for a build's [decontaminate]",
    ),
    ("data", "index"): (
        "pipelines.data_index",
        "write the loader's index (index/) of a dataset built without one; idempotent",
    ),
    ("tokenizer", "train"): (
        "pipelines.tokenizer_train",
        "train a byte-level BPE tokenizer on a sample of a data recipe's source",
    ),
    ("train",): (
        "training.launch",
        "train a model on a built dataset (one node; wraps torchrun)",
    ),
    ("mix", "propose"): (
        "training.mix.propose",
        "choose a data mixture from small proxy training runs, gated against uniform and token-proportional",
    ),
    ("export",): (
        "training.checkpoint.hf_export",
        "export a checkpoint of a training run as a Hugging Face LlamaForCausalLM directory",
    ),
    ("verify",): (
        "validation.verify_run",
        "check every checkpoint and export of a training run against its checksums, and every trained "
        "step's recorded batch against the plan",
    ),
    ("eval",): (
        "validation.eval",
        "lm-evaluation-harness on a run's checkpoints (local held-out tasks offline, hub tasks online)",
    ),
    ("demo",): (
        "pipelines.demo",
        "run the whole system offline on the demo corpus: " + " → ".join(DEMO_STAGES),
    ),
}


# The first words of commands of two words (`data`, `tokenizer`, `mix`)
GROUPS = {words[0] for words in COMMANDS if len(words) > 1}


def _usage() -> str:
    lines = ["usage: gristmill COMMAND [options]", "", "commands:"]
    for words, (_, help_text) in COMMANDS.items():
        lines.append(f"  {' '.join(words):<20} {help_text}")
    lines.append("")
    lines.append("Run `gristmill COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    hold_closed_streams()  # `gristmill … >&-`: the printing stops, nothing else
    argv = list(sys.argv[1:] if argv is None else argv)
    # Line by line even into a pipe or a file, so the log of a killed build keeps its last lines.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    for words, (module_name, help_text) in COMMANDS.items():
        if tuple(argv[: len(words)]) == words:
            module = importlib.import_module(module_name)
            parser = CommandParser(prog=f"gristmill {' '.join(words)}", description=help_text)
            module.add_arguments(parser)
            try:
                return int(module.run(parser.parse_args(argv[len(words) :])) or 0)
            except GristmillError as e:
                return print_error(e)
            except KeyboardInterrupt:  # a Ctrl-C the command did not handle itself (during its setup)
                print(INTERRUPTED, file=sys.stderr)
                return INTERRUPTED_EXIT
            except Terminated:  # a SIGTERM where a command asked for it (sigterm_raises)
                print(interrupted("SIGTERM"), file=sys.stderr)
                return TERMINATED_EXIT
            except BrokenPipeError:  # the reader went away (`gristmill data audit … | head`): not our error
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush stays quiet
                return 141  # 128 + SIGPIPE, as the shell reports a writer stopped by its reader
            except OSError as e:
                # not `train`'s: its ranks say theirs as one process does (docs/training.md), a traceback
                if words == ("train",) or (said := _path_error(e)) is None:
                    raise
                return print_error(said)
    asks_help = argv[:1] in (["-h"], ["--help"]) or (
        argv[:1] and argv[0] in GROUPS and argv[1:2] in (["-h"], ["--help"])
    )
    if argv and not asks_help:  # (`gristmill data -h`: the listing; `gristmill trian -h`: the typo's line)
        print(f"error: {_unknown_command(argv)}", file=sys.stderr)
        return 2
    print(_usage())
    return 0


def _unknown_command(argv: list[str]) -> str:
    """The one line for words that name no command: the nearest command when a typo is near one
    (`gristmill trian`, `gristmill data biuld`, `gristmill dta build`, `gristmill build`), else where the
    list is."""
    names = [" ".join(words) for words in COMMANDS]
    in_group = argv[0] in GROUPS
    group = [name for name in names if name.startswith(argv[0] + " ")]  # its commands (none outside one)
    second = argv[1] if len(argv) > 1 and argv[1].strip() and not argv[1].startswith("-") else None
    if in_group and second is None:
        under = ", ".join(f"`gristmill {name}`" for name in group)
        return f"`gristmill {argv[0]}` needs a command after it: {under}"
    typed = f"{argv[0]} {second}" if in_group else argv[0]
    if second is not None and not in_group:  # a group's word misspelled: `dta build`, `mixx propose`
        if pair := difflib.get_close_matches(f"{argv[0]} {second}", names, n=1, cutoff=0.75):
            return (
                f"`gristmill {_shown(argv[0])} {_shown(second)}` is no command; did you mean "
                f"`gristmill {pair[0]}`? `gristmill --help` lists them"
            )
    if not typed.split():  # `gristmill ""`: an unset variable (it was an IndexError: review RV74d 1)
        return f"`gristmill {_shown(typed)}` is no command; `gristmill --help` lists them"
    # a command's last word alone (`gristmill build`) or one it begins or ends (`evaluate`, `exp`; `data
    # de`, of the group's), else a typo of a whole command (`trian`) or of a last word
    last_words = {name.split()[-1]: name for name in names}  # the later `train` wins: not tokenizer's
    if in_group:  # … but in its group, the group's (`tokenizer trian`)
        last_words |= {name.split()[-1]: name for name in group}
    word = typed.split()[-1]
    begun = {
        name
        for last, name in last_words.items()
        if min(len(word), len(last)) >= 2 and (word.startswith(last) or last.startswith(word))
        and (not in_group or name in group)
    }  # fmt: skip
    near = (
        sorted(begun)[:1]
        if len(begun) == 1
        else difflib.get_close_matches(typed, [] if in_group else names, n=1, cutoff=0.7)
        or [last_words[w] for w in difflib.get_close_matches(word, list(last_words), n=1, cutoff=0.7)]
    )
    guess = f"did you mean `gristmill {near[0]}`? " if near else ""
    if not near and not in_group:  # a group's own word misspelled or cut short alone (`tokenize`, `dat`)
        groups = [g for g in sorted(GROUPS) if len(word) >= 2 and g.startswith(word)]
        if group_word := (difflib.get_close_matches(word, sorted(GROUPS), n=1, cutoff=0.7) or groups[:1]):
            under = [name for name in names if name.startswith(group_word[0] + " ")]
            guess = (
                f"did you mean `gristmill {under[0]}`? "
                if len(under) == 1
                else f"did you mean `gristmill {group_word[0]}` and one of its commands "
                f"({', '.join(name.split()[-1] for name in under)})? "
            )
    return f"`gristmill {_shown(typed)}` is no command; {guess}`gristmill --help` lists them"


def _shown(words: str) -> str:
    """Words as typed, on one line (bytes_shown); blank ones quoted (`gristmill "" train`: RV74f 5)."""
    return json.dumps(words) if not words.strip() else bytes_shown(words)


# What a path a user gave can be that no command's own check caught: one line naming it, not a traceback
# (an unwritable --out, a file where a folder goes: trial RV60b 6)
_PATH_ERRNOS = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.EEXIST,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ENOSPC,
}


def _path_error(e: OSError) -> GristmillError | None:
    """The one line of an OSError about a path the user gave, or None for any other (a bug's: raised)."""
    if e.filename is None or e.errno not in _PATH_ERRNOS:
        return None
    # a rename's or a link's second path too: the one at fault may be either (review RV60e 2)
    paths = e.filename if e.filename2 is None else f"{e.filename} → {e.filename2}"
    return GristmillError(
        f"{paths}: {e.strerror or e} ({type(e).__name__}); fix that path (its permissions, free space, a "
        "file where a folder goes) or give the command another"
    )


def entry() -> None:
    """The `gristmill` command in a process of its own: main's status, which a SIGTERM or Ctrl-C during
    the teardown left after it no longer changes (a complete one-process training ended "Terminated",
    143: trial RV55b 1)."""
    code = main()
    exit_on_signal_with(code, "the command ended")
    sys.exit(code)


if __name__ == "__main__":
    entry()
