"""hadolint over the Dockerfile, shellcheck over the entrypoint, and the `dsaops` command lines the
image runs checked against the real CLI parser (so a renamed option fails here, not in a build)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsaops.cli import build_parser
from tests.images.docker_build import REPO

DOCKERFILE = REPO / "images" / "Dockerfile"
STANDIN_DOCKERFILE = REPO / "images" / "standin-base.Dockerfile"
ENTRYPOINT = REPO / "images" / "entrypoint.sh"
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert found, f"{name} is missing: pip install -r tests/requirements/images.txt"
    return found


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, STANDIN_DOCKERFILE], ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    out = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get install curl\n")
    out = subprocess.run([tool("hadolint"), str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "DL3007" in out.stdout


def test_shellcheck_clean_and_entrypoint_executable():
    out = subprocess.run([tool("shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout
    assert os.access(ENTRYPOINT, os.X_OK)  # COPY keeps the mode: a plain file could not be the ENTRYPOINT


def test_shellcheck_catches_a_bad_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    assert subprocess.run([tool("shellcheck"), str(bad)], capture_output=True, check=False).returncode != 0


def _dsaops_command_lines() -> list[list[str]]:
    """Every `dsaops ...` invocation in the Dockerfile and the entrypoint, shell values replaced by X."""
    found = []
    for path in (DOCKERFILE, ENTRYPOINT):
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        # An array expansion ("${plan[@]}") holds whole options, checked by the entrypoint's own tests.
        code = re.sub(r'"\$\{\w+\[@\]\}"', "", code.replace("\\\n", " "))
        code = re.sub(r"\$\([^()]*\)", "", code)  # a command substitution: checked where it is made
        code = re.sub(r"\$(\{[^}]*\}|\w+)", "X", code)
        for m in re.findall(r"\bdsaops ((?:patches|kernels|exporter|healthcheck|log-writer)\b[^;&|)\n]*)", code):
            found.append(shlex.split(m.strip().removesuffix('"]')))
    return found


def test_the_image_calls_dsaops_as_its_cli_accepts():
    lines = _dsaops_command_lines()
    assert {argv[0] for argv in lines} == {"patches", "kernels", "exporter", "healthcheck", "log-writer"}, lines
    parser = build_parser()
    for argv in lines:
        parser.parse_args(argv)  # exits (SystemExit) on an unknown command or option


def test_the_cli_check_can_fail():
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split("kernels compile --target X --no-such-option X"))
