"""`dsaops …`: one console script; each subcommand lives in the module that owns it.

Every module below exposes `add_parser(subparsers)` and keeps its top-level imports light
(stdlib only), so that `dsaops --help` stays fast and works without torch or SGLang.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from dsaops.errors import UserError

DESCRIPTION = "Build, deploy and watch SGLang serving of DeepSeek-Sparse-Attention models with a raw fp8 KV cache."
SUBCOMMAND_MODULES = (
    "dsaops.targets",
    "dsaops.kernels.cli",
    "dsaops.plan",
    "dsaops.verify",
    "dsaops.sglang_patches.cli",
    "dsaops.healthchecks.cli",
    "dsaops.deploy",
    "dsaops.image",
    "dsaops.bench.cli",
)


class Parser(argparse.ArgumentParser):
    """Argument errors in one line plus where the usage is, not the whole usage first; every
    subcommand's parser is one of these (add_subparsers makes its parsers of the parent's class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\nsee `{self.prog} --help`\n")


def _describe(parser: argparse.ArgumentParser) -> None:
    """A subcommand without a description of its own says what its one-line help says."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                sub = action.choices[choice.dest]
                sub.description = sub.description or choice.help
                _describe(sub)


def build_parser() -> argparse.ArgumentParser:
    from dsaops import __version__

    parser = Parser(prog="dsaops", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dsaops {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    _describe(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        for line in str(e).splitlines():   # several missing prerequisites: one line each
            print(f"dsaops {args.command}: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 141  # 128 + SIGPIPE: what a shell reports for a program the closed pipe stopped
