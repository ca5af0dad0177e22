"""`make image` checks the host before it downloads or stages anything: an engine, BuildKit, the base
and, for a foreign platform, emulation. Each missing part is one line that names the fix.

The probes are the `docker` on PATH and $DSAOPS_BINFMT_MISC: stand-ins drive every branch, and the
real dockerd the image tests start, with Debian's 20.10 client (the one the image build tests build
with, through DOCKER_BUILDKIT=1 and no buildx), checks a local base and an unreachable one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsaops import build_host, image_base
from tests.images.docker_build import REPO

FAKE_DOCKER = r"""#!/bin/sh
# A docker CLI stand-in: FAKE_CLIENT version, FAKE_ENGINE=up, FAKE_BUILDX=1, FAKE_LOCAL images, FAKE_MANIFEST file.
case "$1" in
  --version) echo "Docker version ${FAKE_CLIENT:-28.2.2}, build fake" ;;
  version) [ "$FAKE_ENGINE" = up ] && echo 28.2.2 && exit 0
           echo "Cannot connect to the Docker daemon at unix:///fake.sock. Is the docker daemon running?" >&2; exit 1 ;;
  buildx) [ "$FAKE_BUILDX" = 1 ] && echo "github.com/docker/buildx v0.21.0" && exit 0
          echo "docker: unknown command: docker buildx" >&2; exit 1 ;;
  image) for t in $FAKE_LOCAL; do [ "$t" = "$5" ] && echo linux/amd64 && exit 0; done
         echo "Error: No such image: $5" >&2; exit 1 ;;
  manifest) [ -n "$FAKE_MANIFEST" ] && cat "$FAKE_MANIFEST" && exit 0
            echo "failed to configure transport: error pinging v2 registry: dial tcp: no such host" >&2; exit 1 ;;
  *) echo "unexpected: docker $*" >&2; exit 3 ;;
esac
"""
HOST = image_base.platform()
FOREIGN = "linux/arm64" if HOST == "linux/amd64" else "linux/amd64"
FOREIGN_TARGET = "sm_121" if FOREIGN == "linux/arm64" else "sm_90"
ARM_ENTRY = ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\n"
             "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n")
X86_ENTRY = ARM_ENTRY.replace("aarch64", "x86_64").replace("0200b700", "02003e00")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """PATH with the docker stand-in (and this Python); returns a setter for its behaviour."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")   # the stand-in first; cat and sh after it
    monkeypatch.setenv("DSAOPS_BINFMT_MISC", str(tmp_path / "binfmt"))
    for key in ("FAKE_CLIENT", "FAKE_ENGINE", "FAKE_BUILDX", "FAKE_LOCAL", "FAKE_MANIFEST"):
        monkeypatch.delenv(key, raising=False)

    def set_(**env):
        for key, value in env.items():
            monkeypatch.setenv(f"FAKE_{key.upper()}", value)
    return set_


def binfmt(folder: Path, *entries: tuple[str, str], status: str = "enabled") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "status").write_text(f"{status}\n")
    (folder / "register").write_text("")
    for name, text in entries:
        (folder / name).write_text(text)
    return folder


def check(platform=HOST, uses_buildx=False, base="nvidia/cuda:13.0.3-devel-ubuntu24.04"):
    return build_host.problems(base=base, platform=platform, host_platform=HOST, uses_buildx=uses_buildx)


def test_make_image_stops_before_downloading_with_one_line_a_missing_part(fake, tmp_path):
    """The fresh-clone case on a machine with a Docker 28 CLI, no buildx, no engine and no emulation."""
    fake(client="28.2.2")
    env = os.environ | {"DSAOPS_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(["make", "--no-print-directory", "image", f"ARCH={FOREIGN_TARGET}", "PYTHON=python3",
                          f"VENV={tmp_path}/no-venv"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    lines = [line for line in out.stderr.splitlines() if line.startswith("dsaops image: ")]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 3, out.stderr
    assert "no Docker engine answers" in lines[0] and "sudo systemctl start docker" in lines[0]
    assert "docker 28 builds with BuildKit" in lines[1] and "docker-buildx-plugin" in lines[1]
    assert f"cannot run {FOREIGN} build steps" in lines[2] and "qemu-user-static" in lines[2]
    assert not (tmp_path / "cache").exists()                 # no wheel was downloaded


@pytest.mark.parametrize("client, buildx, missing", [
    ("20.10.24+dfsg1", "0", False),   # Debian's client drives BuildKit itself under DOCKER_BUILDKIT=1
    ("28.2.2", "0", True),            # a newer client needs the plugin
    ("28.2.2", "1", False),
])
def test_buildkit_needs_buildx_from_docker_23(fake, client, buildx, missing):
    fake(client=client, buildx=buildx, engine="up", local="nvidia/cuda:13.0.3-devel-ubuntu24.04")
    found = check(uses_buildx=buildx == "1")
    assert bool(found) == missing, found
    if missing:
        assert found == [build_host.builder_problem(False)] and "buildx plugin" in found[0]


def test_asking_for_buildx_without_the_plugin(fake):
    fake(client="20.10.24", engine="up", local="nvidia/cuda:13.0.3-devel-ubuntu24.04")
    [line] = check(uses_buildx=True)
    assert line.startswith("--builder buildx: this docker has no buildx plugin")


def test_a_base_is_local_or_served_for_the_platform(fake, tmp_path):
    fake(client="20.10.24", engine="up", local="dsaops-local/base:1")
    assert check(base="dsaops-local/base:1") == []                      # a locally made base counts
    [line] = check(base="nvidia/cuda:13.0.3-devel-ubuntu24.04")
    assert "is not in this engine and its registry did not answer (failed to configure transport" in line
    assert "The offline route" in line
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"manifests": [{"platform": {"os": "linux", "architecture": "amd64"}}]}))
    fake(manifest=str(manifest))
    assert check(base="nvidia/cuda:13.0.3-devel-ubuntu24.04", platform="linux/amd64") == []
    [line] = build_host.problems(base="nvidia/cuda:13.0.3-devel-ubuntu24.04", platform="linux/arm64",
                                 host_platform="linux/arm64", uses_buildx=False)
    assert "has no linux/arm64 variant (it has linux/amd64)" in line


def test_a_foreign_platform_needs_an_emulator_with_the_f_flag(fake, tmp_path):
    fake(client="20.10.24", engine="up", local="b:1")
    folder = tmp_path / "binfmt"
    entry = ARM_ENTRY if FOREIGN == "linux/arm64" else X86_ENTRY
    other = X86_ENTRY if FOREIGN == "linux/arm64" else ARM_ENTRY
    assert "binfmt_misc is not enabled" in check(platform=FOREIGN, base="b:1")[0]          # not mounted
    binfmt(folder, ("qemu-other", other.format(flags="OCF")))
    assert "no binfmt_misc entry for" in check(platform=FOREIGN, base="b:1")[0]            # another machine's only
    binfmt(folder, ("qemu-it", entry.format(flags="OC")))
    assert "without the F flag" in check(platform=FOREIGN, base="b:1")[0]
    binfmt(folder, ("qemu-it", entry.format(flags="OCF")))
    assert check(platform=FOREIGN, base="b:1") == []
    binfmt(folder, status="disabled")
    assert "not enabled" in check(platform=FOREIGN, base="b:1")[0]
    assert check(platform=HOST, base="b:1") == []                                          # native: no emulator


def test_the_real_engine_with_debians_client_and_a_local_base(dockerd, standin_bases, monkeypatch):
    """Our dockerd, Debian's 20.10 client (the fixture's PATH): a native build of a local base (the
    offline route's stand-in) may go ahead."""
    for key in ("DOCKER_HOST", "PATH"):
        monkeypatch.setenv(key, dockerd[key])
    assert check(base=standin_bases["sm_90"]) == []
    [line] = check(base="127.0.0.1:1/dsaops/none:1")
    assert "127.0.0.1:1/dsaops/none:1 is not in this engine" in line and "connection refused" in line
