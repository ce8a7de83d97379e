"""The `gristmill` console script: one entry point, subcommands owned by the stage packages.

Each subcommand lives in the module that owns its stage and exposes `HELP`, `add_arguments(parser)`
and `run(args) -> int`. Modules are imported only when their command runs, so `gristmill data
validate` does not pay for importing torch, and a stage missing optional extras (lm-eval) does
not break the others.
"""

from __future__ import annotations

import argparse
import importlib
import io
import sys

from training.contract.errors import GristmillError

# (command words) -> module implementing it
COMMANDS: dict[tuple[str, ...], str] = {
    ("data", "build"): "pipelines.build",
    ("data", "download"): "pipelines.download",
    ("data", "validate"): "validation.validate",
    ("data", "audit"): "validation.audit",
    ("data", "inspect"): "training.inspect",
    ("data", "index"): "pipelines.data_index",
    ("tokenizer", "train"): "tokenization.train",
    ("train",): "training.launch",
    ("export",): "training.hf_export",
    ("verify",): "validation.verify_run",
    ("eval",): "validation.eval",
    ("demo",): "pipelines.demo",
}


def _usage() -> str:
    lines = ["usage: gristmill COMMAND [options]", "", "commands:"]
    for words, module in COMMANDS.items():
        try:
            help_text = importlib.import_module(module).HELP
        except ImportError as e:  # show the command anyway; running it reports what is missing
            help_text = f"(unavailable: {e})"
        lines.append(f"  {' '.join(words):<20} {help_text}")
    lines.append("")
    lines.append("Run `gristmill COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Line by line even into a pipe or a file, so the log of a killed build keeps its last lines.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    for words, module_name in COMMANDS.items():
        if tuple(argv[: len(words)]) == words:
            module = importlib.import_module(module_name)
            parser = argparse.ArgumentParser(prog=f"gristmill {' '.join(words)}", description=module.HELP)
            module.add_arguments(parser)
            args = parser.parse_args(argv[len(words) :])
            try:
                return int(module.run(args) or 0)
            except GristmillError as e:
                print(f"error: {e}", file=sys.stderr)
                return e.exit_code
    print(_usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if not argv or argv[0] in ("-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main())
