"""Which cached wheel fits which interpreter, by the tags in its file name (PEP 425/427). Stdlib only.

`make image` needs the SGLang wheel for the image's Python and machine, the tests the one for
their own interpreter; both keep them in one folder ($DSAOPS_CACHE/wheels), so neither may take
the other's. A wheel fits an interpreter when one of the tags its name carries
(name-version[-build]-python-abi-platform.whl, each of the last three possibly a dot-separated
set) is one the interpreter accepts; among several, the one whose best tag the interpreter
prefers wins.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

Tag = tuple[str, str, str]   # (python, abi, platform), e.g. ("cp312", "cp312", "manylinux_2_34_aarch64")

# The legacy manylinux names and the glibc each stands for (PEP 600).
_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}
# The oldest manylinux glibc minor per machine: aarch64 wheels start at manylinux2014.
_OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5, "aarch64": 17}


def parse(filename: str) -> tuple[str, str, frozenset[Tag]]:
    """(distribution, version, every tag) of a wheel file name; ValueError for a name that is not a wheel's."""
    parts = filename.removesuffix(".whl").split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{filename} is not a wheel file name (name-version[-build]-python-abi-platform.whl)")
    python, abi, platform = parts[-3:]
    return parts[0], parts[1], frozenset(
        (p, a, pl) for p in python.split(".") for a in abi.split(".") for pl in platform.split("."))


def wheel_tags(filename: str) -> frozenset[Tag]:
    """Every tag a wheel file name carries; ValueError for a name that is not a wheel's."""
    return parse(filename)[2]


def best(paths: Iterable[Path], accepted: Sequence[Tag]) -> Path | None:
    """The wheel among `paths` whose best tag comes first in `accepted` (best first), or None."""
    rank = {tag: i for i, tag in reversed(list(enumerate(accepted)))}
    scored = []
    for path in paths:
        try:
            ranks = [rank[t] for t in wheel_tags(path.name) if t in rank]
        except ValueError:
            continue
        if ranks:
            scored.append((min(ranks), path.name, path))
    return min(scored)[2] if scored else None


def linux_cpython_tags(python: str, machine: str, glibc: tuple[int, int]) -> list[Tag]:
    """The tags CPython `python` ("3.12") on Linux `machine` with `glibc` installs, best first, in
    the order packaging.tags.sys_tags gives them there: its own ABI, none, abi3 of older versions,
    then pure wheels; newer manylinux before older."""
    major, minor = (int(n) for n in python.split("."))
    cp = f"cp{major}{minor}"
    platforms = []
    for glibc_minor in range(glibc[1], _OLDEST_GLIBC_MINOR.get(machine, 17) - 1, -1):
        platforms.append(f"manylinux_{glibc[0]}_{glibc_minor}_{machine}")
        if legacy := _LEGACY_MANYLINUX.get((glibc[0], glibc_minor)):
            platforms.append(f"{legacy}_{machine}")
    platforms.append(f"linux_{machine}")
    tags = [(cp, abi, p) for abi in (cp, "abi3", "none") for p in platforms]
    tags += [(f"cp{major}{older}", "abi3", p) for older in range(minor - 1, 1, -1) for p in platforms]
    pythons = [f"py{major}{m}" for m in range(minor, -1, -1)]
    tags += [(py, "none", p) for py in (*pythons[:1], f"py{major}", *pythons[1:]) for p in platforms]
    tags += [(cp, "none", "any")] + [(py, "none", "any") for py in (*pythons[:1], f"py{major}", *pythons[1:])]
    return tags
