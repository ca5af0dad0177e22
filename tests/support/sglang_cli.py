"""SGLang's own launch_server parser (prepare_server_args: ServerArgs.add_cli_args), built from the pinned
wheel's source, and the flag table dsaops ships from it (dsaops/sglang_flags.json).

Importing `sglang` runs its package __init__, which needs the frontend's dependencies (IPython); the server's
argument modules need only what the test environment holds, so the package is entered without its __init__.

    python -m tests.support.sglang_cli > dsaops/sglang_flags.json   # from the repository root, after a pin change
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import types

from dsaops import sglang_cli
from tests.support.sglang_wheel import sglang_source


@functools.cache
def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, set[str]]:
    """(SGLang's parser, the same with no defaults and nothing required, the option strings its fields declare),
    built with the pinned source's modules, which are then taken out of sys.modules again: other tests load patched
    copies under the same names."""
    before = {name: module for name, module in sys.modules.items() if name == "sglang" or name.startswith("sglang.")}
    for name in before:
        del sys.modules[name]
    package = types.ModuleType("sglang")
    package.__path__ = [str(sglang_source() / "sglang")]
    sys.modules["sglang"] = package
    try:
        from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
        from sglang.srt.server_args import ServerArgs

        parser, bare = (argparse.ArgumentParser(prog="sglang serve") for _ in range(2))   # as prepare_server_args
        for each in (parser, bare):
            ServerArgs.add_cli_args(each)
        for action in bare._actions:   # a Namespace of what the arguments give, and nothing else
            action.default, action.required = argparse.SUPPRESS, False
        declared = argparse.ArgumentParser()     # the fields alone: choices fixed in the source
        add_cli_args_from_dataclass(declared, ServerArgs)
    finally:
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(before)
    return parser, bare, set(declared._option_string_actions)


def sglang_parser() -> argparse.ArgumentParser:
    """prepare_server_args' parser (ServerArgs.add_cli_args)."""
    return _parsers()[0]


def sglang_reads(argv: list[str]) -> dict[str, object]:
    """{each flag's first option string: its value} for what argv sets, as SGLang's parser reads it (the
    --model-path it requires may be left out); SystemExit where the parser stops."""
    bare = _parsers()[1]
    given = vars(bare.parse_args(argv))
    return {action.option_strings[0]: given[action.dest] for action in bare._actions if action.dest in given}


def cli_flags() -> dict[str, list | None]:
    """Every option string of SGLang's parser but -h/--help, with its action's choices where it has them."""
    return {name: None if action.choices is None else list(action.choices)
            for name, action in sglang_parser()._option_string_actions.items()
            if not isinstance(action, argparse._HelpAction)}


def cli_aliases() -> dict[str, str]:
    """{alias: the flag it is another name of}: an action's later option strings (a BooleanOptionalAction's
    --no- spelling sets the opposite: not an alias; -h's --help neither)."""
    return {alias: action.option_strings[0] for action in sglang_parser()._actions
            if not isinstance(action, (argparse.BooleanOptionalAction, argparse._HelpAction))
            for alias in action.option_strings[1:]}


def type_name(action: argparse.Action) -> str | None:
    """The name dsaops.sglang_cli.TYPES has the action's value type under (SGLang's own function by its name:
    human_readable_int), or None where that type is SGLang's alone to check."""
    name = getattr(action.type, "__name__", None)
    return name if name in sglang_cli.TYPES else None


def _action(action: argparse.Action, declared: set[str]) -> dict:
    entry = {"names": action.option_strings, "nargs": action.nargs}
    if name := type_name(action):
        entry["type"] = name
    # choices a field declares; those add_cli_args computes when it runs (plugins' parsers, an environment
    # switch's sampling backend) may differ in the server
    if isinstance(action.choices, (list, tuple)) and action.option_strings[0] in declared:
        entry["choices"] = list(action.choices)
    return entry


def flag_table() -> dict:
    """What dsaops.sglang_cli needs of the parser: each action's option strings, nargs, value type (int, float, str
    or human_readable_int) and fixed choices; help apart."""
    parser = sglang_parser()
    help_action = next(a for a in parser._actions if isinstance(a, argparse._HelpAction))
    return {"help": help_action.option_strings,
            "actions": [_action(a, _parsers()[2]) for a in parser._actions if a is not help_action]}


def table_text(table: dict) -> str:
    """The table as the file holds it: one action a line, so that a pin change reads as a diff of flags."""
    actions = ",\n".join("  " + json.dumps(action) for action in table["actions"])
    return f'{{"help": {json.dumps(table["help"])},\n "actions": [\n{actions}\n]}}\n'


if __name__ == "__main__":
    sys.stdout.write(table_text(flag_table()))
