"""The address sets of the network role's nftables fence (playbooks/roles/network/templates/dsaops.nft.j2).

Only addresses that parse as IPv4 addresses or networks reach the rule set, merged where they overlap
(an nftables interval set refuses overlapping elements); anything else stops the run naming the value.
"""
from __future__ import annotations

import ipaddress
import socket

from dsaops.errors import UserError


def nft_elements(addresses: list[str], what: str) -> str:
    """`10.0.0.1, 10.1.0.0/16`: the addresses and networks of `addresses`, merged, for an nftables set."""
    try:
        networks = [ipaddress.IPv4Network(str(a), strict=False) for a in addresses]
    except ValueError as e:
        raise UserError(f"{what}: {e}; give IPv4 addresses or networks such as 10.0.0.0/24") from None
    return ", ".join(str(n.network_address) if n.prefixlen == 32 else str(n)
                     for n in ipaddress.collapse_addresses(networks))


def ipv4_of(host: str, what: str) -> str:
    """The IPv4 address `host` (an address or a name) has on this machine (the controller)."""
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"{what}: cannot resolve {host!r} to an IPv4 address here ({e}); set its ansible_host to its "
                        "address, or list the address it scrapes from in dsaops_monitoring_allow") from None
