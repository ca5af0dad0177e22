"""What `make image` needs from the host, checked before anything is downloaded or staged.

- an engine: a `docker` command whose engine answers;
- BuildKit (the Dockerfile bind-mounts the wheels with RUN --mount): the buildx plugin, or a
  docker client older than 23, which drives BuildKit itself under DOCKER_BUILDKIT=1 (Debian's
  20.10 does); from 23 on the client hands every BuildKit build to buildx and fails without it;
- the base: an image of that name in the engine (a locally made one counts), or a registry that
  serves its manifest, for the target's platform where the manifest lists platforms;
- emulation, where the target's platform is not the host's: a binfmt_misc entry that runs the
  target machine's binaries, with the F flag that container builds need.

`problems(plan)` returns one line per missing part, each naming the fix; `dsaops image build`
prints them all and stops (exit 2). The probes are the `docker` found on PATH and the folder in
$DSAOPS_BINFMT_MISC (default /proc/sys/fs/binfmt_misc), which the tests point at stand-ins.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DOCKER_TIMEOUT_S = 60    # a docker probe that has not answered by then counts as no answer
BUILDX_MIN_CLIENT = 23   # the first docker client that builds with BuildKit only through buildx
# Docker's platform of each Linux machine (`uname -m`, and the machine in a wheel's platform tag).
PLATFORMS = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}
# ELF e_machine of each Linux machine, as it appears in a binfmt_misc magic (bytes 18-19, little-endian).
_ELF_MACHINE = {"aarch64": "b700", "x86_64": "3e00"}
_EMULATION_FIX = ("install emulation (`sudo apt-get install qemu-user-static binfmt-support`, or "
                  "`docker run --privileged --rm tonistiigi/binfmt --install {arch}`), or build on a {platform} "
                  "machine instead{native}")


def _docker(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["docker", *args], check=False, capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def _last_line(out: subprocess.CompletedProcess | None) -> str:
    if out is None:
        return f"no answer within {DOCKER_TIMEOUT_S} s"
    return ((out.stderr or out.stdout).strip().splitlines() or ["no output"])[-1]


def engine_problem() -> str | None:
    if not shutil.which("docker"):
        return ("no `docker` command here: install Docker Engine (https://docs.docker.com/engine/install/) "
                "and its buildx plugin, then run `make image` again")
    out = _docker("version", "--format", "{{.Server.Version}}")
    if out is None or out.returncode != 0:
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        return (f"no Docker engine answers at {where} ({_last_line(out)}); start it (`sudo systemctl start docker`), "
                "add yourself to the `docker` group, or set DOCKER_HOST to a running engine; nothing was built")
    return None


def client_major() -> int | None:
    """The docker client's major version (`docker --version`: 'Docker version 28.2.2, build ...')."""
    out = _docker("--version")
    found = re.search(r"version (\d+)\.", out.stdout if out else "")
    return int(found.group(1)) if found else None


def has_buildx() -> bool:
    out = _docker("buildx", "version")
    return out is not None and out.returncode == 0


def builder_problem(uses_buildx: bool) -> str | None:
    """The build command's builder: `docker buildx build`, or `DOCKER_BUILDKIT=1 docker build`."""
    install = ("install the buildx plugin (docker-buildx-plugin from Docker's apt repository, or Debian/Ubuntu's "
               "docker-buildx)")
    if uses_buildx:
        return None if has_buildx() else f"--builder buildx: this docker has no buildx plugin: {install}"
    major = client_major()
    if major is not None and major >= BUILDX_MIN_CLIENT:
        return (f"docker {major} builds with BuildKit (which the Dockerfile's RUN --mount needs) only through the "
                f"buildx plugin, which is missing: {install}")
    return None


def base_problem(base: str, platform: str) -> str | None:
    """A local image of that name, or a manifest the registry serves (with the platform, if it lists any)."""
    if (local := _docker("image", "inspect", "--format", "{{.Os}}/{{.Architecture}}", base)) and local.returncode == 0:
        return None
    remote = _docker("manifest", "inspect", base)
    if remote is None or remote.returncode != 0:
        return (f"base image {base} is not in this engine and its registry did not answer ({_last_line(remote)}): "
                "check the network or `docker login`, or make the base locally and pass its tag with "
                "--build-arg BASE_IMAGE=TAG (images/README.md, \"The offline route\")")
    try:
        listed = [m.get("platform", {}) for m in json.loads(remote.stdout).get("manifests", [])]
    except (json.JSONDecodeError, AttributeError):
        listed = []
    offered = {f"{p.get('os')}/{p.get('architecture')}" for p in listed}
    if listed and platform not in offered:
        return (f"base image {base} has no {platform} variant (it has {', '.join(sorted(offered))}): choose a base "
                f"built for {platform} with --build-arg BASE_IMAGE=TAG")
    return None


def machine_of(platform: str) -> str:
    """The Linux machine of a Docker platform (linux/arm64: aarch64); else the platform's last part."""
    return next((m for m, p in PLATFORMS.items() if p == platform), platform.rpartition("/")[2])


def emulation_problem(platform: str, host_platform: str, binfmt: Path | None = None) -> str | None:
    """Running RUN steps of another platform needs the kernel to hand its binaries to an emulator."""
    if platform == host_platform:
        return None
    machine = machine_of(platform)
    binfmt = Path(binfmt or os.environ.get("DSAOPS_BINFMT_MISC") or "/proc/sys/fs/binfmt_misc")
    native = " (for sm_121: the DGX Spark itself)" if platform == "linux/arm64" else ""
    fix = _EMULATION_FIX.format(arch=platform.rpartition("/")[2], platform=platform, native=native)
    status = binfmt / "status"
    if not status.is_file() or status.read_text().strip() != "enabled":
        return f"this host ({host_platform}) cannot run {platform} build steps: binfmt_misc is not enabled at {binfmt}; {fix}"
    unflagged = None
    for entry in sorted(binfmt.iterdir()):
        if entry.name in ("status", "register") or not entry.is_file():
            continue
        state, *lines = entry.read_text().splitlines() or [""]
        fields = dict(line.partition(" ")[::2] for line in lines)
        if state != "enabled" or fields.get("magic", "")[36:40] != _ELF_MACHINE.get(machine):
            continue
        if "F" in fields.get("flags:", ""):
            return None
        unflagged = entry.name
    if unflagged:
        return (f"the binfmt_misc entry {unflagged} runs {machine} binaries without the F flag, so they cannot run "
                f"inside a build container: re-register it with F (qemu-user-static's entries have it); {fix}")
    return f"this host ({host_platform}) cannot run {platform} build steps: no binfmt_misc entry for {machine} in {binfmt}; {fix}"


def problems(*, base: str, platform: str, host_platform: str, uses_buildx: bool) -> list[str]:
    """Every missing prerequisite of a build, one line each (empty: go ahead)."""
    found = [engine_problem()]
    if shutil.which("docker"):
        found.append(builder_problem(uses_buildx))
        if found[0] is None:   # the engine's own images decide whether a local base is there
            found.append(base_problem(base, platform))
    found.append(emulation_problem(platform, host_platform))
    if importlib.util.find_spec("pip") is None:
        found.append(f"{sys.executable} has no pip, which builds the project's wheel: install it "
                     "(sudo apt-get install python3-pip) or run `make venv` first")
    return [p for p in found if p]
