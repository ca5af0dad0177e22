"""The exact-match applier on small made-up files: what it refuses, and that reversing restores."""
import pytest
from dsaops.sglang_patches.unidiff import PatchError, apply_hunks, parse

OLD = "".join(f"line {i}\n" for i in range(1, 11))
PATCH = """Subject: header lines are skipped

--- a/sglang/x.py
+++ b/sglang/x.py
@@ -3,3 +3,4 @@
 line 3
-line 4
+line four
+line 4.5
 line 5
@@ -9,2 +10,2 @@
 line 9
-line 10
+line ten
\\ No newline at end of file
"""


def test_applies_exactly_and_reverses():
    patch = parse("p", PATCH)
    assert patch.subject == "header lines are skipped"
    (fp,) = patch.files
    new = apply_hunks("p", fp.path, OLD, fp.hunks)
    assert new == OLD.replace("line 4\n", "line four\nline 4.5\n").replace("line 10\n", "line ten")
    assert apply_hunks("p", fp.path, new, [h.reversed() for h in fp.hunks]) == OLD


def test_lines_end_only_at_newline():
    """A line is what ends in \\n, as for diff and GNU patch: a form feed or U+2028 inside a line (legal in
    Python source) neither shifts the line numbers nor splits a hunk's line."""
    old = OLD.replace("line 1\n", "line 1\f\n").replace("line 3\n", "s = '\u2028'  # line 3\n")
    (fp,) = parse("p", PATCH.replace(" line 3\n", " s = '\u2028'  # line 3\n")).files
    new = apply_hunks("p", fp.path, old, fp.hunks)
    assert new == old.replace("line 4\n", "line four\nline 4.5\n").replace("line 10\n", "line ten")
    assert apply_hunks("p", fp.path, new, [h.reversed() for h in fp.hunks]) == old


@pytest.mark.parametrize("old, message", [
    ("line 0\n" + OLD, "hunk #1"),                          # shifted by one line: no offset
    (OLD.replace("line 5\n", "line  5\n"), "line 5 differs"),  # one context line differs: no fuzz
])
def test_refuses_offset_and_fuzz(old, message):
    (fp,) = parse("p", PATCH).files
    with pytest.raises(PatchError, match=message):
        apply_hunks("p", fp.path, old, fp.hunks)


@pytest.mark.parametrize("text, message", [
    (PATCH.replace("@@ -9,2 +10,2 @@", "@@ -9,2 +11,2 @@"), "disagrees with the old side"),
    (PATCH.replace("a/sglang/x.py", "a/../etc/passwd"), "must name a file under sglang/"),
    (PATCH.replace("a/sglang/x.py", "sglang/x.py"), "strip level 1"),
    (PATCH.replace("--- a/sglang/x.py", "--- /dev/null"), "not supported"),
    (PATCH.replace(" line 5\n@@", "@@"), "unexpected"),
    ("just words\n", "not a unified diff"),
])
def test_refuses_malformed_patches(text, message):
    with pytest.raises(PatchError, match=message):
        patch = parse("p", text)
        (fp,) = patch.files
        apply_hunks("p", fp.path, OLD, fp.hunks)
