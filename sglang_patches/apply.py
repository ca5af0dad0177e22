"""Apply, check, revert and inspect the series on one SGLang tree, all or nothing.

`root` is the folder that holds the `sglang/` package (site-packages, or an unpacked
wheel). Every patched file is computed in memory first; files are written only when
every hunk of every patch fits. The marker `sglang/.dsaops-patches.json` records the
series hash and, per touched file, the sha256 before and after, so `revert` can
restore byte for byte (by applying the hunks backwards and checking the result) and
`status` can tell pristine / applied / foreign.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dsaops.sglang_patches.series import Series
from dsaops.sglang_patches.unidiff import PatchError, apply_hunks

from dsaops import pins

MARKER = "sglang/.dsaops-patches.json"


class TreeError(Exception):
    """The tree is not one the series may touch (version, foreign changes); nothing was changed."""


@dataclass
class State:
    kind: str  # pristine | applied | foreign
    detail: str
    marker: dict | None = None


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
        m = re.search(r"^__version__ = (?:version = )?['\"]([^'\"]+)['\"]", version_py.read_text(), re.MULTILINE)
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


def _read(root: Path, rel: str, patch: str) -> bytes:
    path = root / rel
    if not path.is_file():
        raise PatchError(patch, "target file does not exist", target=rel)
    return path.read_bytes()


def plan(root: Path, series: Series) -> dict[str, tuple[bytes, bytes]]:
    """{path: (current bytes, patched bytes)} for every touched file; raises PatchError naming the hunk."""
    before: dict[str, bytes] = {}
    text: dict[str, str] = {}
    for patch in series.patches:
        for fp in patch.files:
            if fp.path not in text:
                before[fp.path] = _read(root, fp.path, patch.name)
                text[fp.path] = before[fp.path].decode()
            text[fp.path] = apply_hunks(patch.name, fp.path, text[fp.path], fp.hunks)
    return {rel: (before[rel], text[rel].encode()) for rel in text}


def _unplan(root: Path, series: Series) -> dict[str, str]:
    """{path: text} with the series' hunks applied backwards to the current files."""
    text = {rel: _read(root, rel, "revert").decode() for rel in series.targets}
    for patch in reversed(series.patches):
        for fp in reversed(patch.files):
            text[fp.path] = apply_hunks(patch.name, fp.path, text[fp.path], [h.reversed() for h in fp.hunks])
    return text


def read_marker(root: Path) -> dict | None:
    path = root / MARKER
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"series_sha256": None, "files": {}}


def state(root: Path, series: Series) -> State:
    marker = read_marker(root)
    if marker is None:
        try:
            plan(root, series)
        except PatchError as e:
            return State("foreign", f"no marker, and the files differ from sglang=={pins.SGLANG}: {e}")
        return State("pristine", f"every patch of the series applies ({len(series.patches)} patches)")
    if marker.get("series_sha256") != series.sha256:
        return State("foreign", f"marker {MARKER} is from another series (sha256 {marker.get('series_sha256')}, "
                                f"this series {series.sha256})", marker)
    changed = [rel for rel, h in marker["files"].items()
               if not (root / rel).is_file() or _sha((root / rel).read_bytes()) != h["patched_sha256"]]
    if changed:
        return State("foreign", "files changed since the series was applied: " + ", ".join(changed), marker)
    return State("applied", f"series sha256 {series.sha256}", marker)


def _write_all(root: Path, contents: dict[str, tuple[bytes, bytes]]) -> None:
    """Write each file's second value; if a write fails, put back the first values already replaced."""
    done = []
    try:
        for rel, (_, new) in contents.items():
            (root / rel).write_bytes(new)
            done.append(rel)
    except OSError:
        for rel in done:
            (root / rel).write_bytes(contents[rel][0])
        raise


def apply(root: Path, series: Series) -> str:
    """Apply the whole series; returns what happened. Raises TreeError/PatchError with nothing changed."""
    check_version(root)
    st = state(root, series)
    if st.kind == "applied":
        return f"already applied (series sha256 {series.sha256}); nothing changed"
    if st.marker is not None:
        raise TreeError(f"refusing to apply over a foreign tree: {st.detail}")
    contents = plan(root, series)
    _write_all(root, contents)
    marker = {
        "sglang_version": pins.SGLANG,
        "series_sha256": series.sha256,
        "patches": [p.name for p in series.patches],
        "files": {rel: {"pristine_sha256": _sha(old), "patched_sha256": _sha(new)}
                  for rel, (old, new) in contents.items()},
    }
    (root / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return f"applied {len(series.patches)} patches to {len(contents)} files (series sha256 {series.sha256})"


def revert(root: Path, series: Series) -> str:
    """Restore every touched file byte for byte and remove the marker."""
    st = state(root, series)
    if st.kind == "pristine":
        return "not applied; nothing to revert"
    if st.kind == "foreign":
        raise TreeError(f"refusing to revert: {st.detail}")
    restored = _unplan(root, series)
    contents = {}
    for rel, text in restored.items():
        data = text.encode()
        if _sha(data) != st.marker["files"][rel]["pristine_sha256"]:
            raise TreeError(f"{rel}: reversing the series does not give the recorded pristine file; nothing changed")
        contents[rel] = ((root / rel).read_bytes(), data)
    _write_all(root, contents)
    (root / MARKER).unlink()
    return f"reverted {len(contents)} files to sglang=={pins.SGLANG} as shipped"


def check(root: Path, series: Series) -> str:
    """Version equals the pin and the series applies exactly (or is already applied); changes nothing."""
    check_version(root)
    st = state(root, series)
    if st.kind == "foreign":
        raise TreeError(st.detail)
    return f"{st.kind}: {st.detail}"
