"""Whether SGLang 0.5.23 listens where the image's health check and exporter reach it.

    python3 -m dsaops.server_address HOST PORT -- <sglang.launch_server args...>

HOST and PORT are DSAOPS_SERVER_HOST and DSAOPS_SERVER_PORT. It prints the port the arguments give
SGLang (nothing when none does: the entrypoint then adds `--port PORT`), or exits 2 saying which
setting to add. The arguments are read as SGLang reads them: its `--config` YAML's keys ahead of
the command line (dsaops/sglang_config.py), and argparse's unique prefixes, so an argument of four
characters or more that begins --host or --port counts as that option (--ho is --host; --api, --api-key).
SGLang bound beyond loopback with no `--api-key` is refused unless DSAOPS_ALLOW_NO_API_KEY=1: its
routes would answer anyone who reaches it (the admin key alone guards the admin routes only). A --host
name counts as every address it resolves to (SGLang may bind any): loopback only when each is.
"""
from __future__ import annotations

import functools
import ipaddress
import os
import socket
import sys

from dsaops.cli_args import digits
from dsaops.sglang_config import merged, unread_config

# each with the shortest prefix SGLang's argparse takes for it alone (--ad... is --admin-api-key)
OPTIONS = {"--host": 4, "--port": 4, "--api-key": 5}


def _given(args: list[str]):
    """(option, value, index of the option's argument) for each of OPTIONS, in order."""
    want = None
    for at, arg in enumerate(args):
        if want:
            yield want, arg, at - 1
        name, eq, value = arg.partition("=")
        option = next((flag for flag, least in OPTIONS.items() if len(name) >= least and flag.startswith(name)), None)
        want = None
        if eq and option:
            yield option, value, at
        elif not eq:
            want = option


@functools.cache   # one answer for every check, and one wait on a slow resolver
def _addresses(name: str) -> frozenset:
    """What SGLang's server may bind for `name` (asyncio's create_server binds every address it resolves
    to): an address stands for itself, a name for what the resolver gives; none when it gives none."""
    try:
        return frozenset(ipaddress.ip_address(info[4][0])
                         for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    except (OSError, UnicodeError, ValueError):
        return frozenset()


def _reaches(bound: str, host: str) -> bool:
    """Whether SGLang bound to `bound` answers at `host`: 0.0.0.0 and :: include loopback; an
    address or a name otherwise answers at what it resolves to (IPv6 has many spellings)."""
    if bound in ("", "0.0.0.0", "::", host):
        return True
    return bool(_addresses(bound) & _addresses(host.strip("[]")))


def _same_port(given: str, port: str) -> bool:
    """SGLang's --port is an int (srt/arg_groups/fields/serving.py): 08000 is port 8000."""
    return given == port or ((number := digits(given)) is not None and number == digits(port))


def loopback(bound: str | None) -> bool:
    """Whether a server bound there answers this machine only (None: SGLang's default, 127.0.0.1): a
    name such as localhost only when every address it resolves to is loopback."""
    if bound is None:
        return True
    addresses = _addresses(bound)
    return bool(addresses) and all(address.is_loopback for address in addresses)


def check(host: str, port: str, argv: list[str], allow_no_key: bool = False) -> str | None:
    """The port argv gives SGLang, or None; ValueError when SGLang would not answer at host:port, would
    not read the --config file it was given (sglang_config.unread_config), or would serve beyond
    loopback with no API key and allow_no_key is False."""
    unread = unread_config(argv)
    if unread is not None:
        raise ValueError(f"SGLang reads its --config file only from `--config FILE`, spelled out and apart: {unread} "
                         "would leave the file's settings (the API keys too) unapplied; write --config FILE")
    launch = merged(argv)
    last = {option: (value, at) for option, value, at in _given(launch.args)}

    def named(option: str) -> tuple[str, str]:
        """How the user gave it, and what to drop instead."""
        value, at = last[option]
        if at >= launch.from_config:
            return f"{option} {value}", option
        key = launch.args[at][2:].partition("=")[0]
        return f"{key}: {value} in --config {launch.config}", f"{key}: from {launch.config}"

    given_port = last.get("--port", ("",))[0] or None   # an empty one: the entrypoint's --port, after it, wins
    if given_port is not None and not _same_port(given_port, port):
        said, drop = named("--port")
        raise ValueError(f"{said} differs from DSAOPS_SERVER_PORT={port}, which the health check and the exporter"
                         f" use; run with -e DSAOPS_SERVER_PORT={given_port} (or drop {drop})")
    bound = last.get("--host", (None,))[0]
    if bound and not _addresses(bound):
        raise ValueError(f"{named('--host')[0]} resolves to no address here, so SGLang could not bind it; give an IP"
                         " address (IPv6 without brackets) or a name the container resolves")
    if not _reaches(bound or "", host):
        said, drop = named("--host")
        reach = f"[{bound}]" if ":" in bound else bound
        raise ValueError(f"{said} is not DSAOPS_SERVER_HOST={host}, where the health check and the exporter"
                         f" reach SGLang; run with -e DSAOPS_SERVER_HOST={reach} (or drop {drop})")
    refused_config = "--config" in argv and launch.config is None   # SGLang stops at it, serving nothing
    if not (allow_no_key or refused_config or loopback(bound) or last.get("--api-key", ("",))[0]):
        said = named("--host")[0]
        raise ValueError(f"{said} serves beyond this machine with no API key: put `api-key: KEY` in SGLang's"
                         " --config file, or run with -e DSAOPS_ALLOW_NO_API_KEY=1 to serve without one")
    return given_port


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    host, port, *rest = argv
    try:
        given = check(host, port, rest[1:] if rest[:1] == ["--"] else rest,
                      allow_no_key=os.environ.get("DSAOPS_ALLOW_NO_API_KEY") == "1")
    except ValueError as e:
        print(f"dsaops-entrypoint: {e}", file=sys.stderr)
        return 2
    if given is not None:
        print(given)
    return 0


if __name__ == "__main__":
    sys.exit(main())
