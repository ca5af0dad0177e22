"""One copy of each pinned version (dsaops/pins.toml): everything else reads it through dsaops.pins.

The rule this test enforces:
- Scanned: every file git tracks or would track, except docs (`*.md`), the patch series
  (`sglang_patches/*.patch`: SGLang's own lines and prose), recorded results (`benchmarks/*.json`:
  the versions a run measured) and pins.toml itself. Prose is skipped in scanned files too:
  comments, and in Python the strings that stand alone as statements (docstrings).
- A copy is a pinned version written as a value: right after `==`, `=`, a quote, `:`, `@`, `v`,
  `-` or `/` (`sglang==0.5.23`, `"0.5.23"`, `dsaops/sglang:0.5.23-sm_90`, `v0.5.23-rocm`,
  `sglang-0.5.23-*.whl`). A sentence naming the version ("SGLang 0.5.23 sizes ...") is prose.
- The one exception is pyproject.toml's `kernels` extra: pip reads extras statically, before any
  dsaops code runs, so it states the TileLang pin itself and this test checks the two agree.
"""
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

from dsaops import build_host, image_base, pins, targets, wheel_tags
from dsaops.image import source_files
from tests.support import sglang_wheel

REPO = Path(__file__).resolve().parents[2]
SKIPPED = ("*.md", "sglang_patches/*.patch", "benchmarks/*.json", "dsaops/pins.toml")
EXCEPTIONS = {("pyproject.toml", 'kernels = ["tilelang==' + pins.TILELANG + '"]')}


def prose_free(path: str, text: str) -> str:
    """`text` with comments (and Python's standalone strings) blanked, line structure kept."""
    if not path.endswith(".py"):
        return "\n".join(re.sub(r"(^|\s)#.*", "", line) for line in text.split("\n"))
    lines = text.split("\n")
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    blank = []
    for i, tok in enumerate(tokens):
        before = next((t for t in reversed(tokens[:i]) if t.type not in (tokenize.NL, tokenize.COMMENT)), None)
        standalone = (tok.type == tokenize.STRING and tokens[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER)
                      and (before is None or before.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)))
        if tok.type == tokenize.COMMENT or standalone:
            blank.append((tok.start, tok.end))
    for (row, col), (end_row, end_col) in reversed(blank):
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            start, stop = (col if r == row else 0), (end_col if r == end_row else len(line))
            lines[r - 1] = line[:start] + " " * (stop - start) + line[stop:]
    return "\n".join(lines)


def copies(path: str, text: str) -> list[str]:
    """`path:line: text` for every pinned version written as a value outside prose."""
    pattern = re.compile("[=:'\"@v/-](" + "|".join(map(re.escape, pins.PINS.values())) + r")(?![\w.])")
    found = []
    for number, (line, code) in enumerate(zip(text.split("\n"), prose_free(path, text).split("\n"), strict=True), 1):
        if pattern.search(code) and (path, line.split("#")[0].strip()) not in EXCEPTIONS:
            found.append(f"{path}:{number}: {line.strip()}")
    return found


def scanned() -> list[str]:
    return [f for f in source_files() if not any(Path(f).match(g) for g in SKIPPED)]


def test_no_second_copy_of_a_pin():
    files = scanned()
    assert "dsaops/image.py" in files and "playbooks/roles/dsaops/defaults/main.yml" in files   # the walk works
    found = []
    for path in files:
        try:
            text = (REPO / path).read_text()
        except UnicodeDecodeError:
            continue
        found += copies(path, text)
    assert not found, "read these through dsaops.pins (dsaops/pins.toml) instead:\n" + "\n".join(found)


CASES = {
    "py constant": ("a.py", f'VERSION = "{pins.SGLANG}"\n', True),
    "py argument": ("a.py", f'cmd = ["pip", "install", "tilelang=={pins.TILELANG}"]\n', True),
    "py docstring and comment": (
        "a.py", f'"""Follows SGLang {pins.SGLANG}: sglang=={pins.SGLANG}, "{pins.SGLANG}"."""\nX = 1  # sglang=={pins.SGLANG}\n',
        False),
    "py value beside a docstring": (
        "a.py", f'def f():\n    """the sglang-{pins.SGLANG}-*.whl wheel"""\n    return "sglang-{pins.SGLANG}-x.whl"\n', True),
    "py sentence": ("a.py", f'print(f"SGLang {pins.SGLANG} sizes it")\n', False),
    "yaml value": ("main.yml", f'image: "dsaops/sglang:{pins.SGLANG}-{{{{ target }}}}"\n', True),
    "yaml comment": ("main.yml", f"# the images area tags dsaops/sglang:{pins.SGLANG}-<target>\nimage: x\n", False),
    "make variable": ("Makefile", f"TILELANG ?= tilelang=={pins.TILELANG}\n", True),
    "toml image tag": ("targets.toml", f'base_image = "lmsysorg/sglang:v{pins.SGLANG}-rocm10-mi30x"\n', True),
    "requirement": ("req.txt", f"sgl-flash-mla=={pins.FLASH_MLA}\n", True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_scan_tells_a_copy_from_prose(case):
    path, text, caught = CASES[case]
    assert bool(copies(path, text)) == caught, copies(path, text)


def test_pyprojects_kernels_extra_is_the_tilelang_pin():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["kernels"] == [pins.requirement("tilelang")]


def test_pins_for_shell_and_make():
    def run(*args):
        return subprocess.run([sys.executable, "-m", "dsaops.pins", *args], check=False, capture_output=True,
                              text=True, cwd=REPO)

    assert run("sglang").stdout == pins.SGLANG + "\n"
    assert run("tilelang", "--requirement").stdout == f"tilelang=={pins.TILELANG}\n"
    assert run().stdout.count("==") == 0 and f'"sgl-flash-mla": "{pins.FLASH_MLA}"' in run().stdout
    unknown = run("torch")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_every_pinned_hash_names_a_wheel_of_a_pin():
    """pins.toml's sha256 table: each key a wheel file name of a pinned distribution or an offline bundle
    package at its version, each value a sha256; each has its Linux x86_64 and aarch64 wheels listed
    (a pure-Python wheel stands for both)."""
    versions = {**pins.PINS, **pins.BUNDLE}
    listed = {}
    for filename, digest in pins.SHA256.items():
        name, version, tags = wheel_tags.parse(filename)
        assert versions.get(name.replace("_", "-")) == version, filename
        assert re.fullmatch("[0-9a-f]{64}", digest), filename
        listed.setdefault(name.replace("_", "-"), set()).update(
            m for m in ("x86_64", "aarch64") for t in tags if t[2].endswith(m) or t[2] == "any")
    assert {name: {"x86_64", "aarch64"} <= machines for name, machines in listed.items()} == dict.fromkeys(
        versions, True)


def test_every_sglang_wheel_an_image_downloads_has_a_pinned_hash():
    """What sglang_wheel_for asks pip for, per target (the real base's Python, and the stand-in's)."""
    for target in targets.table().values():
        if target.base_carries_sglang:
            continue
        for t in (target, image_base.on_standin(target)):
            py = "cp" + t.image_python.replace(".", "")
            name = f"sglang-{pins.SGLANG}-{py}-{py}-manylinux_2_34_{build_host.machine_of(t.platform)}.whl"
            assert name in pins.SHA256, (target.name, name)


def test_the_pinned_hash_is_the_real_wheels():
    """The host's SGLang wheel, downloaded or cached, checked by the same function every consumer uses."""
    real = sglang_wheel.sglang_wheel()
    assert pins.sha256(real) == pins.SHA256[real.name]


def test_a_wheel_check_from_the_shell_is_one_line_and_exit_2(tmp_path):
    def check(*args):
        return subprocess.run([sys.executable, "-m", "dsaops.pins", "--check-wheel", *map(str, args)], check=False,
                              capture_output=True, text=True, cwd=REPO)

    real = sglang_wheel.sglang_wheel()
    matches = check(real)
    assert matches.returncode == 0 and matches.stderr == ""
    other = tmp_path / real.name
    other.write_bytes(b"PK\x05\x06" + bytes(18))   # an empty zip: whole, and not PyPI's file
    done = check(real, other)
    assert done.returncode == 2 and done.stderr == (
        f"dsaops.pins: {other} has sha256 {pins.sha256(other)}, dsaops/pins.toml pins {pins.SHA256[real.name]}: "
        "a damaged or replaced file; delete it and run again to download it\n")
    unlisted = tmp_path / f"sglang-{pins.SGLANG}-py3-none-any.whl"
    unlisted.write_bytes(b"")
    done = check(unlisted, "--downloaded")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "lists no sha256 for this wheel file" in done.stderr
