"""The ``lens`` parser: the program's own options, then each command group adds its subcommands (in the order
``lens --help`` lists them).

Built from cheap modules only (no torch at import time): ``lens --help`` and an argument
error answer at once (tests/app/commands/test_cli.py checks)."""

from __future__ import annotations

import argparse

from app.commands import capture, explorer, jacobian, models, store, study
from app.commands.flags import Parser, describe_commands

_START = """first steps:
  lens models                                    the model aliases (which are installed)
  lens study all --out results                   every study, SmolLM2-135M (~7 min)
  lens app --results results --stores results    the explorer on what it wrote
  lens COMMAND --help                            a command's options and defaults"""

# each adds its commands to ``lens``'s subparsers, in this order
GROUPS = (models, capture, store, study, jacobian, explorer)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lens", description="Lens Workbench: layer-by-layer analysis of language models",
                    epilog=_START)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.add_parsers(sub)
    describe_commands(sub)
    return parser


# every command's function, by the name it has on the command line (``lens store``'s picks its subcommand)
COMMANDS = {name: run for group in GROUPS for name, run in group.COMMANDS.items()}
