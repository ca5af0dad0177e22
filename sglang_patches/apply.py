"""Apply, check, revert and inspect the series on one SGLang tree, all or nothing.

`root` is the folder that holds the `sglang/` package (site-packages, or an unpacked
wheel). Every patched file is computed in memory first; files are written only when
every hunk of every patch fits, and then through `atomic_files` (new files beside the
old, fsynced, renamed into place together, undone on any error, under a lock; a file
another program wrote after it was read is left as it is, and nothing changes). No file
is read or written through a symlink that leaves the package. The marker
`sglang/.dsaops-patches.json` records the series hash and, per touched file, the sha256
before and after, so `revert` can restore byte for byte (by applying the hunks backwards
and checking the result) and `status` can tell pristine / applied / foreign, and
interrupted: no marker, each file as shipped or patched (a crash between the renames).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dsaops.sglang_patches import atomic_files
from dsaops.sglang_patches.series import Series
from dsaops.sglang_patches.unidiff import PatchError, apply_hunks, utf8

from dsaops import pins, plan_input

MARKER = "sglang/.dsaops-patches.json"
# a damaged marker: without one, `state` tells each file by its content (pristine, interrupted or foreign)
_NOT_OURS = ("dsaops did not write it, or it was damaged; delete it, then `dsaops patches status` tells each file "
             "by its content")


class TreeError(Exception):
    """The tree is not one the series may touch (version, foreign changes); nothing was changed."""


@dataclass
class State:
    kind: str  # pristine | applied | interrupted | foreign
    detail: str
    marker: dict | None = None
    files: list[File] | None = None  # read and patched in memory: without a marker, unless foreign


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def installed_versions(root: Path) -> dict[str, str]:
    """SGLang's version as each source in the tree states it: dist-info METADATA, sglang/_version.py."""
    found = {}
    for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
        m = re.search(r"^Version: *(\S+)", meta.read_text(errors="replace"), re.MULTILINE)
        if m:
            found[str(meta.relative_to(root))] = m.group(1)
    version_py = root / "sglang" / "_version.py"
    if version_py.is_file():
        m = re.search(r"^__version__ = (?:version = )?['\"]([^'\"]+)['\"]", version_py.read_text(errors="replace"),
                      re.MULTILINE)
        if m:
            found["sglang/_version.py"] = m.group(1)
    return found


def check_version(root: Path) -> None:
    if not (root / "sglang").is_dir():
        raise TreeError(f"{root} holds no sglang/ package; pass the folder that contains it with --sglang-root")
    found = installed_versions(root)
    if not found:
        raise TreeError(f"cannot tell SGLang's version under {root} (no sglang-*.dist-info/METADATA, no "
                        f"sglang/_version.py); the series targets sglang=={pins.SGLANG} only")
    wrong = {src: v for src, v in found.items() if v != pins.SGLANG}
    if wrong:
        said = ", ".join(f"{src} says {v}" for src, v in wrong.items())
        raise TreeError(f"the series is for sglang=={pins.SGLANG}, but {said}; install it "
                        f"(pip install --no-deps sglang=={pins.SGLANG}) or point --sglang-root at such a tree")


def _resolve(root: Path, rel: str) -> Path:
    try:
        return (root / rel).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop: RuntimeError before Python 3.13, OSError after
        raise TreeError(f"{rel}: cannot resolve ({e}); replace the link with the file itself") from None


def _package(root: Path) -> Path:
    """The real folder of the sglang/ package: every file the tool reads or writes must be inside it."""
    return _resolve(root, "sglang")


def _inside(root: Path, rel: str) -> Path:
    """The real path of root/rel; refuses a symlink (of the file or a folder) that leaves the package."""
    real = _resolve(root, rel)
    if not real.is_relative_to(_package(root)):
        raise TreeError(f"{rel} resolves to {real}, outside {_package(root)}: refusing to read or write through "
                        "a symlink that leaves the tree; replace the link with the file itself")
    return real


def _read(root: Path, rel: str, patch: str) -> tuple[Path, str]:
    path = _inside(root, rel)
    if not path.is_file():
        raise PatchError(patch, "target file does not exist", target=rel)
    return path, utf8(patch, path.read_bytes(), target=rel)


def _hunks(series: Series, rel: str) -> list:
    """[(patch name, hunks)] for one file, in series order."""
    return [(patch.name, fp.hunks) for patch in series.patches for fp in patch.files if fp.path == rel]


def _forward(series: Series, rel: str, text: str) -> str:
    for name, hunks in _hunks(series, rel):
        text = apply_hunks(name, rel, text, hunks)
    return text


def _backward(series: Series, rel: str, text: str) -> str:
    for name, hunks in reversed(_hunks(series, rel)):
        text = apply_hunks(name, rel, text, [h.reversed() for h in hunks])
    return text


@dataclass(frozen=True)
class File:
    """One file the series touches: where it is, and its bytes now, as shipped and patched."""

    rel: str
    path: Path  # real path (symlinks inside the package resolved)
    current: bytes
    pristine: bytes
    patched: bytes

    @property
    def is_patched(self) -> bool:
        return self.current == self.patched


def files(root: Path, series: Series) -> list[File]:
    """Every target, each either as shipped (the series applies forwards) or patched (it applies backwards;
    the test suite checks that no target of the series is both). Raises the forward PatchError otherwise."""
    out = []
    for rel in series.targets:
        path, text = _read(root, rel, _hunks(series, rel)[0][0])
        try:
            out.append(File(rel, path, text.encode(), text.encode(), _forward(series, rel, text).encode()))
        except PatchError as forward:
            try:
                pristine = _backward(series, rel, text)
            except PatchError:
                raise forward from None
            out.append(File(rel, path, text.encode(), pristine.encode(), text.encode()))
    return out


def _marker_path(root: Path) -> Path:
    return _inside(root, MARKER)


def read_marker(root: Path) -> dict | None:
    """The marker; None without one; ValueError (ending in what to do) for one this tool did not write."""
    path = _marker_path(root)
    if not path.is_file():
        return None
    return plan_input.read_json(path, "marker", fix=_NOT_OURS, error=ValueError)


def state(root: Path, series: Series) -> State:
    try:
        marker = read_marker(root)
    except ValueError as e:
        return State("foreign", str(e), {})
    if marker is None:
        try:
            found = files(root, series)
        except PatchError as e:
            return State("foreign", f"no marker, and the files differ from sglang=={pins.SGLANG}: {e}")
        patched = [f.rel for f in found if f.is_patched]
        if not patched:
            return State("pristine", f"every patch of the series applies ({len(series.patches)} patches)", files=found)
        return State("interrupted", f"no marker, but {len(patched)} of {len(found)} files carry the series and the "
                                    "rest are as shipped: an apply or revert stopped half way; run `dsaops patches "
                                    "apply` to finish it or `dsaops patches revert` to undo it", files=found)
    if not isinstance(marker.get("files"), dict):
        return State("foreign", f"marker {MARKER} has no \"files\" object: {_NOT_OURS}", marker)
    if marker.get("series_sha256") != series.sha256:
        return State("foreign", f"marker {MARKER} is from another series (sha256 {marker.get('series_sha256')!r}, "
                                f"this series {series.sha256})", marker)
    if set(marker["files"]) != set(series.targets):   # apply records every target, and only those
        return State("foreign", f"marker {MARKER} names other files than the series touches: {_NOT_OURS}", marker)
    changed = []
    for rel, h in marker["files"].items():
        path = _inside(root, rel)
        if not path.is_file() or not isinstance(h, dict) or _sha(path.read_bytes()) != h.get("patched_sha256"):
            changed.append(rel)
    if changed:
        return State("foreign", "files changed since the series was applied: " + ", ".join(changed), marker)
    return State("applied", f"series sha256 {series.sha256}", marker)


def _locked(root: Path):
    return atomic_files.locked(_package(root), "`dsaops patches apply` or `revert`")


def apply(root: Path, series: Series) -> str:
    """Apply the whole series; returns what happened. Raises TreeError/PatchError/WriteError with nothing
    changed.

    The patched files are renamed into place first and the marker last: a crash in between leaves
    a tree that `state` calls interrupted (each file as shipped or patched, no marker), which
    apply finishes and revert undoes."""
    check_version(root)
    with _locked(root):
        st = state(root, series)
        if st.kind == "applied":
            return f"already applied (series sha256 {series.sha256}); nothing changed"
        if st.marker is not None:
            raise TreeError(f"refusing to apply over a foreign tree: {st.detail}")
        # a foreign tree without a marker: files() raises, naming the patch and hunk
        found = st.files if st.files is not None else files(root, series)
        marker = {
            "sglang_version": pins.SGLANG,
            "series_sha256": series.sha256,
            "patches": [p.name for p in series.patches],
            "files": {f.rel: {"pristine_sha256": _sha(f.pristine), "patched_sha256": _sha(f.patched)}
                      for f in found},
        }
        _replace(root, series, [*(atomic_files.Change(f.path, f.patched, f.current) for f in found if not f.is_patched),
                  atomic_files.Change(_marker_path(root), (json.dumps(marker, indent=1) + "\n").encode())])
    finished = " (finishing an interrupted apply)" if st.kind == "interrupted" else ""
    return (f"applied {len(series.patches)} patches to {len(found)} files{finished} "
            f"(series sha256 {series.sha256})")


def revert(root: Path, series: Series) -> str:
    """Restore every touched file byte for byte and remove the marker (first: a crash leaves an
    interrupted tree, never a marker over files it does not describe)."""
    with _locked(root):
        st = state(root, series)
        if st.kind == "pristine":
            return "not applied; nothing to revert"
        if st.kind == "foreign":
            raise TreeError(f"refusing to revert: {st.detail}")
        restored = [f for f in (st.files if st.files is not None else files(root, series)) if f.is_patched]
        if st.marker is not None:
            for f in restored:
                if _sha(f.pristine) != (st.marker["files"].get(f.rel) or {}).get("pristine_sha256"):
                    raise TreeError(f"{f.rel}: reversing the series does not give the recorded pristine file; "
                                    "nothing changed")
        marker = [atomic_files.Change(_marker_path(root), None)] if st.marker is not None else []
        _replace(root, series, marker + [atomic_files.Change(f.path, f.pristine, f.current) for f in restored])
    return f"reverted {len(restored)} files to sglang=={pins.SGLANG} as shipped"


def _replace(root: Path, series: Series, changes: list[atomic_files.Change]) -> None:
    atomic_files.remove_leftovers([_marker_path(root), *(_inside(root, rel) for rel in series.targets)])
    atomic_files.replace_all(changes)


def check(root: Path, series: Series) -> str:
    """Version equals the pin and the series applies exactly (or is already applied); changes nothing."""
    check_version(root)
    st = state(root, series)
    if st.kind == "foreign":
        raise TreeError(st.detail)
    return f"{st.kind}: {st.detail}"
