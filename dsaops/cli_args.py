"""Checks of command-line values shared by several subcommands (stdlib only, so any CLI module may
import it; SGLang's size reader is imported on use): an http(s) server URL, a number of seconds and a
bounded whole number (or size) as argparse types, comma-separated whole numbers, an output path that
must be writable, or a folder that can be made, before a long run starts, and the write of its result.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import tempfile
import urllib.parse
from pathlib import Path

from dsaops.errors import UserError
from dsaops.plan_input import shown

MAX_SECONDS = 1_000_000   # about 11 days; far longer overflows the socket and thread timeouts


def http_url(text: str) -> str:
    """argparse type: an http(s) URL with a host and, if any, a numeric port; without a trailing slash."""
    hint = "give e.g. http://HEAD:30000"
    if any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} has a space or control character: {hint}")
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # ValueError for a port that is not a number in 0-65535
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL ({e}): {hint}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host: {hint}")
    try:
        parts.hostname.encode("idna")  # what the resolver is asked for; urllib raises this mid-request
    except UnicodeError:
        raise argparse.ArgumentTypeError(f"{text!r}: the host has an empty or too long label: {hint}") from None
    return text.rstrip("/")


def seconds_up_to(most: float, least: float = 0.0):
    """argparse type: a finite number of seconds above 0, at least `least` and at most `most` (nan made a poll
    loop spin)."""
    what = (f"a number of seconds from {least:.10g} to {most:.10g}" if least
            else f"a positive number of seconds up to {most:.10g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (0 < value <= most and value >= least):  # false for nan too
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value
    return parse


seconds = seconds_up_to(MAX_SECONDS)


def digits(text: str) -> int | None:
    """`text` as a whole number if it is 1 to 12 ASCII digits: int() also takes '٣', '1_000' and 4,000 digits."""
    return int(text) if re.fullmatch(r"[0-9]{1,12}", text) else None


def whole_up_to(most: int, least: int = 1, sizes: bool = False):
    """argparse type: a whole number from `least` to `most`; with `sizes`, also one with SGLang's suffix as its
    human_readable_int reads them (128k, 25.6k, 128Ki), still in ASCII digits."""
    def parse(text: str) -> int:
        value = digits(text)
        if value is None and sizes and re.fullmatch(r"[0-9]{1,12}(\.[0-9]+)?([kMGT]|[KMGT]i)", text):
            from dsaops.sglang_cli import human_readable_int  # on use: its flag table's module stays unloaded

            value = human_readable_int(text)
        if value is None or not least <= value <= most:
            hint = " (or one with SGLang's suffix: 128k, 128Ki)" if sizes and value is None else ""
            raise argparse.ArgumentTypeError(f"must be a whole number from {least} to {most}, got {shown(text)}{hint}")
        return value
    return parse


def whole_numbers(text: str, flag: str, example: str) -> list[int]:
    """Comma-separated whole numbers (spaces ignored); UserError naming `flag` and an example otherwise."""
    words = [w for w in text.replace(" ", "").split(",") if w]
    values = [digits(w) for w in words]
    if None in values:
        raise UserError(f"{flag} takes comma-separated whole numbers, e.g. {example}; got {shown(text)}")
    return values


def can_write_in(folder: Path) -> bool:
    """Whether a file can be made in folder, made first with its parents where missing (mkdir -p):
    tried for real, as os.access says yes to root where no file can be made (/proc). The try
    leaves nothing behind: its file and the folders it made are removed."""
    folder, made = folder.absolute(), []
    try:
        for step in [*reversed(folder.parents), folder]:
            if not step.is_dir():
                step.mkdir()
                made.append(step)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".dsaops-write-check-"):
            return True
    except OSError:
        return False
    finally:
        for step in reversed(made):
            with contextlib.suppress(OSError):  # another process wrote into it meanwhile: leave it
                step.rmdir()


def writable(flag: str, path: str) -> None:
    """Checked before a run, so that a run's result is not lost to an unwritable output path; `write`
    replaces the file, so a folder, device or pipe there (/dev/stdout) is refused too."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not can_write_in(Path(folder)) or (os.path.lexists(path)
                                                                      and not os.path.isfile(path)):
        raise UserError(f"{flag} {path}: cannot write there; give a file in a folder you may write to")


def write(flag: str, path: str, data: bytes) -> None:
    """`data` as the file at `path`, all or nothing (atomic_files: written beside it, then renamed over
    it), so that a full disk or a crash leaves the file that was there whole."""
    from dsaops.sglang_patches import atomic_files

    try:
        atomic_files.replace_all([atomic_files.Change(Path(path), data)])
    except atomic_files.WriteError as e:
        raise UserError(f"{flag} {path}: {e}") from None
