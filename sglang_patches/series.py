"""The quilt-style series: the `series` file beside this module names the patches in order.

The series hash (sha256 over each listed name and its patch bytes, in order) identifies
what was applied; the marker written into a patched tree records it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from dsaops.sglang_patches.unidiff import Patch, PatchError, parse, utf8

DEFAULT_SERIES = Path(__file__).with_name("series")


@dataclass
class Series:
    path: Path
    patches: list[Patch]
    sha256: str

    @property
    def targets(self) -> list[str]:
        """Every file the series touches, in first-touched order."""
        return list(dict.fromkeys(fp.path for p in self.patches for fp in p.files))


def load(series_file: Path = DEFAULT_SERIES) -> Series:
    """Parse the series file and every patch it lists (lines: a patch file name; '#' comments)."""
    if not series_file.is_file():
        raise PatchError(str(series_file), "series file not found")
    digest = hashlib.sha256()
    patches = []
    for line in utf8(str(series_file), series_file.read_bytes()).splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        patch_file = series_file.parent / name
        if not patch_file.is_file():
            raise PatchError(name, f"listed in {series_file} but missing")
        data = patch_file.read_bytes()
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        patches.append(parse(name, utf8(name, data)))
    if not patches:
        raise PatchError(str(series_file), "the series lists no patch")
    return Series(series_file, patches, digest.hexdigest())
