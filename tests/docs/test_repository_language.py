"""The repository speaks of the product only: nothing in it counts work periods, names the project's
own issue numbers or internal script labels, or points outside the repository."""
import re
from pathlib import Path

import pytest

from dsaops.image import source_files

ROOT = Path(__file__).resolve().parents[2]

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|twentieth|\\d+(?:st|nd|rd|th)")
FORBIDDEN = {
    "a work period counted": re.compile(rf"\b(?:{ORDINALS})[- ](?:work[- ])?(?:session|period)s?\b", re.IGNORECASE),
    "an issue number (cite upstream as sgl-project/sglang#N)": re.compile(
        r"\bissues? #?\d+\b|(?<![\w/-])(?<!hunk )#\d+\b", re.IGNORECASE),
    # a reader has no issue tracker of this project: say what the thing is instead
    "an unnamed issue (say what it asks)": re.compile(r"(?<![a-z])the[ _]issue(?![a-z])", re.IGNORECASE),
    "a path outside the repository": re.compile(r"\.\./shared\b|\bshared/(?:tools|reference)\b"),
    "notes outside the repository": re.compile(r"\b(?:ANCHORS|KERNEL-NOTES|FIELD-NOTES|TESTING-HERE)\.md\b|\bseeds/"),
    "a host only the developers have": re.compile(
        r"\bdevice (?:machine|call|session)s?\b|\bthe (?:GPU|H200) machine\b|\blent (?:H200|GPU|machine)", re.IGNORECASE),
    "an internal script label": re.compile(r"\bs\d{1,2}[a-z]\b"),
}


def tracked_files() -> list[str]:
    return sorted(source_files())


def findings(name: str, text: str) -> list[str]:
    """'file:line: what (the text)' for each forbidden phrase in text."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            for m in pattern.finditer(line):
                found.append(f"{name}:{number}: {what}: {m.group(0)!r}")
    return found


def scan() -> dict[str, list[str]]:
    by_file = {}
    for name in tracked_files():
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue                                     # binary
        if found := findings(name, text):
            by_file[name] = found
    return by_file


def test_the_repository_speaks_of_the_product_only():
    by_file = scan()
    bad = [f for found in by_file.values() for f in found]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("planted", [
    "measured in the ninth " + "session",
    "see issue " + "19 for the plan",
    "as in #" + "7's notes",
    "built with ../" + "shared/" + "tools/gpu-bundle.sh",
    "the upstream figures (seeds" + "/000)",
    "run it on the device " + "machine",
    "a diagnostic (s10" + "c) showed",
    "row scales (the " + "issue's stretch question)",
    "def test_the_fields_the_" + "issue_names():",
])
def test_a_planted_phrase_is_caught_with_its_line(planted):
    assert findings("README.md", f"fine\n{planted}\n") == [f"README.md:2: {w}" for w in _whats(planted)]


def _whats(line: str) -> list[str]:
    found = [f"{what}: {m.group(0)!r}" for what, p in FORBIDDEN.items() for m in p.finditer(line)]
    assert len(found) == 1, found
    return found


@pytest.mark.parametrize("allowed", [
    "fixed upstream in sgl-project/sglang#36904",
    "patch: hunk #1 (@@ -581,6 +581,14 @@) does not apply",
    "one server per test session; ssh control masters and their sessions",
    "the first split's rows, a second pass",
    "ptxas still issues half of q's loads; the issued wgmma",
])
def test_what_the_product_may_say(allowed):
    assert findings("README.md", allowed) == []
