"""Which of the monitoring containers' uids a host's account database already holds.

The monitoring role gives each container files only its process may read (its secrets among them)
by owning them as the container's uid and gid (the same number). Any host account with that uid or
gid, a daemon or a directory user alike, could read them too: the role runs `getent passwd` and
`getent group` with the uids on each host (the database with LDAP and the rest, not /etc/passwd
alone) and stops on what `taken` finds in their lines (the dsaops_taken_uids filter).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping


def _owners(passwd: Iterable[str], group: Iterable[str]) -> dict[int, str]:
    """{id: "user NAME's uid" or "group NAME's gid"} from getent's passwd and group lines (NAME:x:ID:...)."""
    owners: dict[int, str] = {}
    for lines, what in ((passwd, "user {}'s uid"), (group, "group {}'s gid")):
        for line in lines:
            fields = line.split(":")
            if len(fields) > 2 and fields[2].isdigit():
                owners.setdefault(int(fields[2]), what.format(fields[0]))
    return owners


def taken(uids: Mapping[str, object], passwd: Iterable[str], group: Iterable[str]) -> list[str]:
    """One line for each variable of `uids` ({variable: uid}) whose number a host user or group already has."""
    owners = _owners(passwd, group)
    return [f"{name}={uid} is {owners[int(uid)]} on this host, which could read that container's files; set {name} "
            "to a number no user or group here has (getent passwd NUMBER; getent group NUMBER)."
            for name, uid in uids.items() if int(uid) in owners]
