"""The address sets of the network role's nftables fence (playbooks/roles/network/templates/dsaops.nft.j2),
and the addresses a node's listener is reached at: by a probe on the node, and by another machine
(Prometheus on a monitoring host).

Only addresses that parse as IPv4 addresses or networks reach the rule set, merged where they overlap
(an nftables interval set refuses overlapping elements); anything else stops the run naming the value.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping

from dsaops.errors import UserError


def nft_elements(addresses: list[str], what: str) -> str:
    """`10.0.0.1, 10.1.0.0/16`: the addresses and networks of `addresses`, merged, for an nftables set."""
    try:
        networks = [ipaddress.IPv4Network(str(a), strict=False) for a in addresses]
    except ValueError as e:
        raise UserError(f"{what}: {e}; give IPv4 addresses or networks such as 10.0.0.0/24") from None
    return ", ".join(str(n.network_address) if n.prefixlen == 32 else str(n)
                     for n in ipaddress.collapse_addresses(networks))


def _listen_address(listen_host: str, what: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(str(listen_host))
    except ValueError:
        raise UserError(f"{what}: {listen_host!r} is not an IP address; give one such as 0.0.0.0 or 127.0.0.1") from None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def listen_address(listen_host: str, port: int, what: str) -> str:
    """`listen_host:port` as a server's listen flag takes it (--web.listen-address): IPv6 in brackets."""
    return f"{_url_host(str(_listen_address(listen_host, what)))}:{int(port)}"


def probe_host(listen_host: str, what: str) -> str:
    """The host part of a URL that reaches, from the same machine, a server listening on `listen_host`:
    loopback for a wildcard address (0.0.0.0, ::), which loopback is part of, else the address itself
    (it accepts nowhere else); IPv6 in brackets."""
    address = _listen_address(listen_host, what)
    if address.is_unspecified:
        address = ipaddress.ip_address("127.0.0.1" if address.version == 4 else "::1")
    return _url_host(str(address))


def scrape_host(listen_host: str, node_address: str, what: str) -> str:
    """The host part of a URL that reaches, from another machine, a node's server listening on `listen_host`:
    the one address it listens on, else (a wildcard, or loopback, which no other machine reaches: the scrape
    fails there and says so) the node's own `node_address`; IPv6 in brackets."""
    address = _listen_address(listen_host, what)
    return _url_host(str(node_address) if address.is_unspecified or address.is_loopback else str(address))


def _ipv4_of(host: str, what: str) -> str:
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


def _on_this_machine(facts: Mapping) -> bool:
    """A host Ansible reaches locally, or at a loopback address literal (names are not resolved here)."""
    if facts.get("ansible_connection") == "local":
        return True
    try:
        return ipaddress.ip_address(str(facts.get("ansible_host", ""))).is_loopback
    except ValueError:
        return False


def monitoring_sources(hosts: Mapping[str, Mapping], allow: list[str], nodes: Mapping[str, Mapping] | None = None) -> str:
    """The monitoring set of `hosts` ({name: its Ansible variables}): each host's address as this controller
    resolves its ansible_host (its traffic's source on a flat network), its cluster address when it has one, and
    `allow`. A host Ansible reaches locally (the controller) counts its ansible_host only when set: its name says
    nothing of the address its scrapes leave by. One that names no address other than loopback stops the run
    when `nodes` (the fenced ones, {name: its Ansible variables}) holds one on another machine and `allow` is
    empty: only its traffic to its own machine arrives on loopback, and `allow` is where an address the inventory
    does not name is listed."""
    found = []
    elsewhere = [node for node, facts in (nodes or {}).items() if not _on_this_machine(facts)]
    for name, facts in hosts.items():
        local = facts.get("ansible_connection") == "local"
        host = facts.get("ansible_host") or (None if local else name)
        own = [_ipv4_of(str(host), f"monitoring host {name}")] if host else []
        if facts.get("dsaops_cluster_address"):
            own.append(str(facts["dsaops_cluster_address"]))
        if local and not allow and elsewhere and all(ipaddress.IPv4Address(a).is_loopback for a in own):
            raise UserError(f"monitoring host {name}: it is reached locally and names no address the other nodes see "
                            "its scrapes come from, so their fence would drop them; set its ansible_host to that "
                            "address (or its dsaops_cluster_address), or list it in dsaops_monitoring_allow")
        found += own
    return nft_elements([*found, *allow], "dsaops_monitoring_allow")
