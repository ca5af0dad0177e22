"""The pinned SGLang's launch_server flags as its own parser holds them (sglang_flags.json, written from that parser by
tests/support/sglang_cli.py, which also checks it against the pinned source), parsed as SGLang parses them at
startup: what would stop the server there is refused in one line before anything renders, and what the arguments
give is returned by each flag's first name (its action's first option string, as SGLang declares it).

argparse resolves the spellings (a prefix of one flag alone, an alias, `--flag=value`, a negative number as a value);
each flag is one action with its aliases among its option strings, as in SGLang (where only the deprecated
--monokernel-backend sets another flag's field), so the last given wins whichever spelled it. Every value given, not
only the last, is checked against its flag's type where that is int, float, str or SGLang's sizes with a suffix
(human_readable_int), and against the choices its field declares; it is returned as written, a whole number (an int
or a size) as the number SGLang reads; the values the planner models are then read by `dsaops plan`'s own options
(dsaops.plan_extras).
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

from dsaops import pins
from dsaops.errors import UserError
from dsaops.plan_input import shown

TABLE = Path(__file__).with_name("sglang_flags.json")
SI, IEC = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}, {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
SIZE = re.compile(rf"(\d+(?:\.\d+)?)({'|'.join([*IEC, *SI])})")


def human_readable_int(text: str) -> int:
    """A size as SGLang 0.5.23's type of that name reads it (--context-length, --max-total-tokens): a whole number as
    int() takes it, or digits with a case-sensitive SI suffix (decimals allowed: 25.6k) or IEC suffix (1Ki)."""
    text = text.strip()
    if m := SIZE.fullmatch(text):
        number, suffix = m.groups()
        if suffix in IEC:
            if "." in number:
                si = "k" if suffix == "Ki" else suffix[0]
                raise argparse.ArgumentTypeError(f"{shown(text)} has a decimal with an IEC suffix; write a whole "
                                                 f"number before {suffix}, or the SI suffix {si}")
            return int(number) * IEC[suffix]
        return int(Decimal(number) * SI[suffix])
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a whole number, nor one with a suffix (SI: 25.6k, 1M; "
                                         "IEC: 1Ki, 1Mi; case-sensitive)") from None


TYPES = {"int": int, "float": float, "str": str, "human_readable_int": human_readable_int}   # others: SGLang's to check


class Given(NamedTuple):
    """A flag's last use: the option string argparse matched (the flag or the alias written, in full where a prefix
    was written) and the words given with it: the one word of a one-value flag (a whole number as SGLang reads it),
    or a list; True for a switch (given: what it sets is SGLang's, a BooleanOptionalAction's --no- spelling turning it
    off)."""
    spelling: str
    value: str | list[str] | bool


class _Stopped(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse prints the usage and exits: SGLang's server stops there
        raise _Stopped(message)

    def _get_values(self, action, arg_strings):   # checked by type and choices; words kept for the planner
        words = list(arg_strings)
        value = super()._get_values(action, arg_strings)
        if action.nargs is None and action.type in (int, human_readable_int):
            words = [str(value)]   # the number SGLang reads ('+7', ' 7', '1_000', 128k): the planner reads no other form
        return words


class _Record(argparse.Action):
    """Keeps the flag's last use under its dest, the flag's first name."""

    def __call__(self, parser, namespace, values, option_string=None):
        value = True if self.nargs == 0 else values[0] if self.nargs is None else values
        setattr(namespace, self.dest, Given(option_string, value))


@functools.cache
def _parser() -> _Parser:
    table = json.loads(TABLE.read_text())
    parser = _Parser(prog="sglang serve", add_help=False)
    parser.add_argument(*table["help"], dest="help", action="store_true")
    for action in table["actions"]:
        words = {} if action["nargs"] == 0 else {   # switches (store_true, BooleanOptionalAction, store_const): none
            "type": TYPES[action.get("type", "str")], "choices": action.get("choices")}
        parser.add_argument(*action["names"], dest=action["names"][0], action=_Record, nargs=action["nargs"],
                            default=argparse.SUPPRESS, **words)
    return parser


def parse(args: list[str], what: str = "sglang_server_extra_args") -> dict[str, Given]:
    """{flag's first name: its last use} for `args`, in the order the flags first come; UserError in one line where
    SGLang's parser stops on them at startup: a flag it has not got (naming the nearest it has), a prefix of several,
    a value missing, of the wrong type, not among the choices or given to a switch, a word no flag takes, or -h."""
    parser, version = _parser(), pins.SGLANG   # the table is the pinned SGLang's (tests/dsaops/test_sglang_cli.py)
    try:
        given, extra = parser.parse_known_args(args)
    except _Stopped as e:
        raise UserError(f"{what}: SGLang {version} would stop at startup: {e}; fix the flag or drop it") from None
    given = vars(given)
    if given.pop("help"):
        raise UserError(f"{what}: -h / --help makes SGLang print its help and exit instead of serving; drop it")
    if not extra:
        return given
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
