"""The `dsaops` console script: argument errors in one line, every subcommand says what it does."""
import argparse
import os
import subprocess
import sys

import pytest

from dsaops.cli import build_parser


def _parsers(parser, path=("dsaops",)):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _parsers(sub, (*path, name))


def test_every_subcommand_says_what_it_does():
    found = dict(_parsers(build_parser()))
    assert {("dsaops", "verify"), ("dsaops", "healthcheck"), ("dsaops", "kernels", "supports")} <= set(found)
    for path, parser in found.items():
        text = (parser.description or "").strip()
        assert len(text) > 20 and not text.endswith((":", ",", ";")), f"{' '.join(path)}: {text!r}"


def test_the_top_level_and_bench_descriptions_are_whole_sentences():
    """They were the first line of a module docstring: a note to developers, and a sentence cut mid-way."""
    found = dict(_parsers(build_parser()))
    for parser in (build_parser(), found[("dsaops", "bench")]):
        text = parser.description
        assert text.endswith(".") and "`dsaops …`" not in text and "module" not in text, text


def test_verify_usage_shows_boot_gate_as_the_other_form_not_a_required_argument():
    found = dict(_parsers(build_parser()))
    usage = found[("dsaops", "verify")].format_usage()
    assert usage.splitlines()[0] == "usage: dsaops verify --server-url URL [options]", usage
    assert found[("dsaops", "verify", "boot-gate")].prog == "dsaops verify boot-gate"


@pytest.mark.parametrize("argv, message, command", [
    (["plan", "--target"], "argument --target: expected one argument", "dsaops plan"),
    (["plan", "--target", "sm_121"], "the following arguments are required: --nodes", "dsaops plan"),
    (["image", "plan", "--arch", "sm_90", "--stage", "nope"], "argument --stage: invalid choice", "dsaops image plan"),
    (["kernels", "supports", "--heads", "x"], "argument --heads: must be a whole number from 1 to 1024, got 'x'",
     "dsaops kernels supports"),
    (["nosuch"], "argument COMMAND: invalid choice: 'nosuch'", "dsaops"),
    # int() took these: 10**12 compiler processes, 1 TiB x 10**6 of address space, an Arabic-Indic 3
    (["kernels", "compile", "--target", "sm_90", "--jobs", "1000000000000"],
     "argument --jobs: must be a whole number from 1 to 256, got '1000000000000'", "dsaops kernels compile"),
    (["bench", "eval", "--server-url", "http://h:1", "--task", "humaneval", "--exec-memory-mb", "1099511627776"],
     "argument --exec-memory-mb: must be a whole number from 1 to 1048576", "dsaops bench eval"),
    (["verify", "--server-url", "http://h:1", "--max-tokens", "\u0663"],
     "argument --max-tokens: must be a whole number from 1 to 2147483647, got '\u0663'", "dsaops verify"),
    (["bench", "serve", "--server-url", "http://h:1", "--input-len", "9" * 5000],
     "argument --input-len: must be a whole number from 1 to 2147483647, got '9999", "dsaops bench serve"),
    # the kernels' numbers too: each of these was read as a geometry, a plan or an allocation
    *[([*cmd, flag, value], f"argument {flag}: must be a whole number from {least} to {most}, got {value!r}",
       "dsaops " + " ".join(cmd[:2])) for cmd, flag, value, least, most in [
        (["kernels", "supports", "--d-qk", "576", "--topk", "2048"], "--heads", "\u0663", 1, 1024),
        (["kernels", "supports", "--heads", "64", "--topk", "2048"], "--d-qk", "5_76", 1, 2147483647),
        (["kernels", "supports", "--heads", "64", "--d-qk", "576", "--topk", "2048"], "--d-v", " 512", 1, 2147483647),
        (["kernels", "supports", "--heads", "64", "--d-qk", "576"], "--topk", "1" + "0" * 12, 1, 2147483647),
        (["kernels", "route", "--target", "sm_90"], "--heads", "0", 1, 1024),
        (["kernels", "route", "--target", "sm_90"], "--heads", "1_000", 1, 1024),
        (["kernels", "selftest"], "--heads", "\u0666\u0664", 1, 1024),
        (["kernels", "selftest"], "--max-bs", "1000000", 1, 8192),
        (["kernels", "selftest"], "--max-bs", "0", 1, 8192),
        (["kernels", "selftest"], "--tp-size", "\u0668", 1, 2147483647),
        (["kernels", "selftest"], "--tp-size", "0", 1, 2147483647),
        (["kernels", "selftest"], "--d-tail", "\u0666\u0664", 0, 64),
    ]],
])
def test_an_argument_error_is_one_line_and_the_usage_hint(argv, message, command):
    out = subprocess.run([sys.executable, "-m", "dsaops", *argv], capture_output=True, text=True, check=False)
    assert out.returncode == 2 and not out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{command}: {message}"), out.stderr
    assert lines[1] == f"see `{command} --help`"


@pytest.mark.parametrize("argv", [["patches", "list"], ["image", "plan", "--arch", "sm_90"], ["targets"]])
def test_a_reader_that_stops_early_gets_no_traceback(argv):
    """`dsaops … | head`: stdout's pipe is closed before the first line; the command stops quietly."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "dsaops", *argv], stdout=write, stderr=subprocess.PIPE, text=True,
                              check=False, timeout=60)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
