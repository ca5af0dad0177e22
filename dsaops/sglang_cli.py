"""The pinned SGLang's launch_server flags as its own parser holds them (sglang_flags.json, written from that parser by
tests/support/sglang_cli.py, which also checks it against the pinned source), parsed as SGLang parses them at
startup, so that what would stop the server there is refused in one line before anything renders.

A value is checked against its flag's type where that is int, float or str, and against the choices its field
declares; the values the planner models are then read by `dsaops plan`'s own options (dsaops.plan_extras).
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
from pathlib import Path

from dsaops import pins
from dsaops.errors import UserError

TABLE = Path(__file__).with_name("sglang_flags.json")
TYPES = {"int": int, "float": float, "str": str}   # a value of another type is SGLang's to check


class _Stopped(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse prints the usage and exits: SGLang's server stops there
        raise _Stopped(message)


@functools.cache
def _parser() -> _Parser:
    table = json.loads(TABLE.read_text())
    parser = _Parser(prog="sglang serve", add_help=False)
    parser.add_argument(*table["help"], dest="help", action="store_true")
    for at, action in enumerate(table["actions"]):
        if action["nargs"] == 0:    # switches: store_true, BooleanOptionalAction, store_const
            parser.add_argument(*action["names"], dest=f"flag{at}", action="store_true")
        else:
            parser.add_argument(*action["names"], dest=f"flag{at}", nargs=action["nargs"],
                                type=TYPES[action.get("type", "str")], choices=action.get("choices"))
    return parser


def check(args: list[str], what: str = "sglang_server_extra_args") -> None:
    """UserError in one line where SGLang's parser stops on `args` at startup: a flag it has not got (naming the
    nearest it has), a prefix of several, a value missing, of the wrong type, not among the choices or given to a
    switch, a word no flag takes, or -h."""
    parser, version = _parser(), pins.SGLANG   # the table is the pinned SGLang's (tests/dsaops/test_sglang_cli.py)
    try:
        given, extra = parser.parse_known_args(args)
    except _Stopped as e:
        raise UserError(f"{what}: SGLang {version} would stop at startup: {e}; fix the flag or drop it") from None
    if given.help:
        raise UserError(f"{what}: -h / --help makes SGLang print its help and exit instead of serving; drop it")
    if not extra:
        return
    if extra[0] == "--":    # argparse reads the words after it as positionals, which SGLang's parser has none of
        raise UserError(f"{what}: SGLang {version} would stop at startup on what follows '--' (it takes no words "
                        "there); drop the '--'")
    word = extra[0]
    name = word.partition("=")[0]
    if name.startswith("-") and name != "-":
        near = difflib.get_close_matches(name, [s for s in parser._option_string_actions if s.startswith("--")], n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise UserError(f"{what}: SGLang {version} has no flag {name}{hint}; fix it or drop it")
    raise UserError(f"{what}: SGLang {version} would stop at startup on {word!r}: no flag takes it there (a switch, or "
                    "a flag that had its value, comes before it); drop it or give it its flag")
