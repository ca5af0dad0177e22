"""Exact-match unified diffs: parse a patch file and apply it in memory.

Deliberately strict (this is what replaces GNU patch in the image): every hunk must
match at exactly the line its header names, with no fuzz and no offset, and the
new-side line numbers must agree with the old side. Anything else is a PatchError
naming the patch, the target file and the hunk, so a pin bump fails loudly.

A patch file is free-text header lines (what/why/upstream) up to the first
`--- a/...` line, then one section per file: `--- a/PATH`, `+++ b/PATH`, hunks.
Paths carry one leading component (`a/`, `b/`): strip level 1, relative to the
folder that holds the `sglang/` package. Only modifications of existing files are
supported (no creation, deletion or rename).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_EOL = "\\ No newline at end of file"
# A line ends at \n only, as for diff and GNU patch (str.splitlines also breaks at \f, \x1c, U+2028, …).
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


class PatchError(Exception):
    """A patch that is malformed or does not apply exactly; the message says where."""

    def __init__(self, patch: str, reason: str, target: str | None = None, hunk: int | None = None,
                 header: str | None = None):
        self.patch, self.target, self.hunk, self.header, self.reason = patch, target, hunk, header, reason
        where = patch
        if target:
            where += f": {target}"
        if hunk is not None:
            where += f": hunk #{hunk} ({header})"
        super().__init__(f"{where}: {reason}")


def utf8(patch: str, data: bytes, target: str | None = None) -> str:
    """A patch or target file's text; a PatchError saying where, if it is not UTF-8."""
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise PatchError(patch, f"not UTF-8 text ({e.reason} at byte {e.start})", target=target) from None


@dataclass
class Hunk:
    header: str
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    old: list[str] = field(default_factory=list)  # context + removed lines, with their line ends
    new: list[str] = field(default_factory=list)  # context + added lines

    def reversed(self) -> Hunk:
        return Hunk(self.header, self.new_start, self.new_len, self.old_start, self.old_len, self.new, self.old)


@dataclass
class FilePatch:
    path: str  # relative to the sglang root, e.g. sglang/srt/configs/model_config.py
    hunks: list[Hunk]


@dataclass
class Patch:
    name: str
    header: str  # the free-text header, without the trailing blank lines
    files: list[FilePatch]

    @property
    def subject(self) -> str:
        first = self.header.splitlines()[0] if self.header else ""
        return first.removeprefix("Subject:").strip()


def _strip1(patch: str, raw: str, side: str) -> str:
    name = raw.split("\t", 1)[0].strip()
    if name == "/dev/null":
        raise PatchError(patch, "creating or deleting files is not supported", target=name)
    if not name.startswith(side + "/"):
        raise PatchError(patch, f"path {name!r} must start with {side}/ (strip level 1)", target=name)
    path = PurePosixPath(name[len(side) + 1:])
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != "sglang":
        raise PatchError(patch, f"path {name!r} must name a file under sglang/", target=name)
    return str(path)


def parse(name: str, text: str) -> Patch:
    lines = _LINE.findall(text)
    i = 0
    while i < len(lines) and not (lines[i].startswith("--- ") and i + 1 < len(lines)
                                  and lines[i + 1].startswith("+++ ")):
        i += 1
    header = "".join(lines[:i]).rstrip("\n")
    files: list[FilePatch] = []
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            raise PatchError(name, f"line {i + 1}: expected '--- a/…' and '+++ b/…', got {lines[i].rstrip()!r}")
        old_path = _strip1(name, lines[i][4:], "a")
        new_path = _strip1(name, lines[i + 1][4:], "b")
        if old_path != new_path:
            raise PatchError(name, f"renames are not supported ({old_path} -> {new_path})", target=old_path)
        i += 2
        fp = FilePatch(old_path, [])
        while i < len(lines) and lines[i].startswith("@@"):
            i = _parse_hunk(name, fp, lines, i)
        if not fp.hunks:
            raise PatchError(name, f"line {i + 1}: no hunk after the file header", target=old_path)
        files.append(fp)
    if not files:
        raise PatchError(name, "no '--- a/…' file section: not a unified diff")
    return Patch(name, header, files)


def _parse_hunk(name: str, fp: FilePatch, lines: list[str], i: int) -> int:
    header = lines[i].rstrip("\n")
    m = _HUNK.match(header)
    number = len(fp.hunks) + 1
    if not m:
        raise PatchError(name, "malformed hunk header", fp.path, number, header)
    o, ol, n, nl = (int(g) if g is not None else 1 for g in m.groups())
    hunk = Hunk(header, o, ol, n, nl)
    i += 1
    while len(hunk.old) < ol or len(hunk.new) < nl:
        if i >= len(lines):
            raise PatchError(name, "patch ends inside the hunk", fp.path, number, header)
        line = lines[i]
        tag, body = (line[0], line[1:]) if line not in ("\n", "") else (" ", "\n")  # blank context line
        if tag == " ":
            hunk.old.append(body)
            hunk.new.append(body)
        elif tag == "-":
            hunk.old.append(body)
        elif tag == "+":
            hunk.new.append(body)
        else:
            raise PatchError(name, f"line {i + 1}: unexpected {line.rstrip()!r} inside the hunk", fp.path, number,
                             header)
        i += 1
        if i < len(lines) and lines[i].rstrip("\n") == _NO_EOL:
            for side in {"-": (hunk.old,), "+": (hunk.new,), " ": (hunk.old, hunk.new)}[tag]:
                side[-1] = side[-1].removesuffix("\n")
            i += 1
    if len(hunk.old) != ol or len(hunk.new) != nl:
        raise PatchError(name, "hunk line counts do not match its header", fp.path, number, header)
    fp.hunks.append(hunk)
    return i


def apply_hunks(patch: str, target: str, text: str, hunks: list[Hunk]) -> str:
    """The file text with every hunk applied exactly where its header says."""
    src = _LINE.findall(text)
    out: list[str] = []
    pos = 0  # next unconsumed source line (0-based)
    for number, h in enumerate(hunks, 1):
        start = h.old_start - 1 if h.old_len else h.old_start
        if start < pos:
            raise PatchError(patch, "hunks overlap or are out of order", target, number, h.header)
        if src[start:start + h.old_len] != h.old:
            mismatch = next((k for k, (a, b) in enumerate(zip(src[start:], h.old)) if a != b), None)
            where = (f"line {start + mismatch + 1} differs" if mismatch is not None
                     else f"file has {len(src)} lines")
            raise PatchError(patch, f"does not apply exactly ({where}; no fuzz, no offset)", target, number,
                             h.header)
        out.extend(src[pos:start])
        new_start = len(out) + (1 if h.new_len else 0)
        if new_start != h.new_start:
            raise PatchError(patch, f"new-side start {h.new_start} disagrees with the old side ({new_start})",
                             target, number, h.header)
        out.extend(h.new)
        pos = start + h.old_len
    out.extend(src[pos:])
    return "".join(out)
