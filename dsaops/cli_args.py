"""Checks of command-line values shared by several subcommands (stdlib only, so any CLI module may
import it): an http(s) server URL as an argparse type.
"""
from __future__ import annotations

import argparse
import urllib.parse


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
