"""`dsaops image base --arch T` (`make image-base ARCH=T`): a stand-in for the target's base image,
made on this machine, to build the serving image where no registry is reachable: the offline route,
and the base CI builds every stage of the serving image on.

A stand-in is Debian bookworm made with debootstrap from Debian's packages (python3-venv, g++),
imported into the engine, plus what the real base would carry, installed when the base is made from
wheels downloaded beforehand (images/standin-base.Dockerfile), so that the serving build's RUN steps
need no network:
- every target: a Python 3.11 venv at /opt/dsaops/venv with CPU torch, the exporter's dependencies
  and setproctitle;
- NVIDIA targets (sm_90, sm_121): TileLang and its needs, and nvcc from the CUDA 13.0 wheels
  (`nvidia-cuda-nvcc`, …): the `kernels` stage compiles for real;
- gfx942: the pinned SGLang wheel installed --no-deps (its real base carries SGLang for ROCm).
Nothing in a stand-in runs a GPU kernel (CPU torch, no CUDA driver, no ROCm): an image built on one
checks the build, the patches, the exporter and the health check, not serving. Its platform is this
machine's (sm_121's stand-in build is linux/amd64 here; the real arm64 image is built on a Spark).

Cached under $DSAOPS_CACHE/images: the root filesystem tarball and the wheel folder; a base whose
inputs did not change is not rebuilt (its label `dsaops.standin.key`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from dsaops import build_host, pins, wheel_tags
from dsaops.cache import cache_dir, locked
from dsaops.errors import UserError

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "images" / "standin-base.Dockerfile"
SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3-venv", "g++")  # g++: nvcc preprocesses with the host compiler
PYTHON = "3.11"                             # bookworm's
# The serving build's `python` stage checks these are installed (it cannot apt-get offline).
SYSTEM_PACKAGES = "python3 python3-venv g++"
# A CPU build of torch (PyPI's Linux x86_64 torch is the CUDA build: PIP_EXTRA_INDEX_URL can name
# PyTorch's CPU index); the stand-in runs no kernel, it needs torch to import.
TORCH = "torch==2.13.0"
# nvcc 13.0 and the headers TileLang's generated code includes: CUDA 13.0, what the real base carries.
CUDA_WHEELS = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-cuda-cccl==13.0.85",
               "nvidia-cuda-runtime==13.0.96", "nvidia-nvvm==13.0.88")
KINDS = {"nvidia": "nvidia", "amd": "rocm"}  # target vendor -> stand-in


def machine() -> str:
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(os.uname().machine, os.uname().machine)


def platform() -> str:
    return build_host.PLATFORMS.get(machine(), f"linux/{machine()}")


def tag(target) -> str:
    return f"dsaops-standin/base:{KINDS[target.vendor]}"


def on_standin(target):
    """`target` as a build on its stand-in base sees it: this machine's platform, the stand-in's tag and
    Python; the plan, the serving build and the base's own SGLang wheel all take it from here."""
    return dataclasses.replace(target, platform=platform(), base_image=tag(target), image_python=PYTHON)


def build_args(target) -> dict[str, str]:
    """The serving build's arguments for building on the target's stand-in base."""
    return {"BASE_IMAGE": tag(target), "SYSTEM_PACKAGES": SYSTEM_PACKAGES, "SGLANG_DEPS": "none"}


def _exporter_requirements() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["exporter"]


def requirements() -> dict[str, list[str]]:
    """What the stand-ins install, by Dockerfile stage (the rocm stage adds the SGLang wheel)."""
    return {"common": [TORCH, *_exporter_requirements(), "setproctitle"],
            "nvidia": [pins.requirement("tilelang"), *CUDA_WHEELS]}


def _rootfs_tar() -> Path:
    return cache_dir("images", f"debian-{SUITE}-{'-'.join(DEBIAN_PACKAGES)}.tar")


def debian_rootfs_cached() -> Path | None:
    """The cached root filesystem tarball, where an earlier run made it."""
    return _rootfs_tar() if _rootfs_tar().is_file() else None


def debian_rootfs() -> Path:
    """bookworm minbase + DEBIAN_PACKAGES, trimmed, as a tarball in the cache (debootstrap on first use;
    DSAOPS_DEBIAN_MIRROR names another mirror)."""
    cached = _rootfs_tar()
    with locked("images", ".debian.lock"):
        if cached.is_file():
            return cached
        if not shutil.which("debootstrap") or os.geteuid() != 0:
            raise UserError("a stand-in base starts from a Debian root filesystem that debootstrap makes, as root: "
                            "install it (apt-get install debootstrap) and run this as root")
        mirror = os.environ.get("DSAOPS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        with tempfile.TemporaryDirectory(prefix="dsaops-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            print(f"dsaops image base: debootstrap {SUITE} from {mirror} (once; cached in {cached.parent})",
                  file=sys.stderr)
            done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE,
                                   str(rootfs), mirror], check=False, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise UserError(f"debootstrap failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}; "
                                "set DSAOPS_DEBIAN_MIRROR to a reachable Debian mirror")
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                         "usr/share/locale"):
                shutil.rmtree(rootfs / junk, ignore_errors=True)
            partial = cached.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(cached)
    return cached


def sglang_wheel(target) -> Path:
    """The pinned SGLang wheel for the stand-in's Python on this machine."""
    from dsaops.image import sglang_wheel_for

    return sglang_wheel_for(on_standin(target), pins.SGLANG)


def _platform_tags() -> list[str]:
    """pip --platform for bookworm (glibc 2.36): every manylinux tag it runs, newest first."""
    m = machine()
    return [f"manylinux_2_{minor}_{m}" for minor in range(36, 4, -1)] + [
        f"manylinux2014_{m}", f"manylinux2010_{m}", f"manylinux1_{m}"]


def _check_pinned(wheels: Path, stamp: Path, *, downloaded: bool) -> None:
    """pins.check_wheel on the folder's wheels of the pins (`downloaded`: pip's, just now). A mismatch
    removes the completion stamp, so that a later run downloads again, and a download of another file."""
    for path in wheels.glob("*.whl"):
        name, version, _ = wheel_tags.parse(path.name)
        if pins.PINS.get(name.replace("_", "-")) == version:
            try:
                pins.check_wheel(path, downloaded=downloaded)
            except UserError:
                stamp.unlink(missing_ok=True)
                if downloaded:   # else pip would take it again as its download
                    path.unlink()
                raise


def wheel_context(target) -> Path:
    """The stand-ins' build context: wheels/ with every wheel they install (downloaded once)."""
    context = cache_dir("images", f"standin-cp{PYTHON.replace('.', '')}-{machine()}")
    wheels = context / "wheels"
    reqs = [r for group in requirements().values() for r in group]
    stamp = wheels / (".complete-" + hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:16])
    with locked("images", ".standin-wheels.lock"):
        _check_pinned(wheels, stamp, downloaded=False)   # first: pip would take a kept file as its download
        if not stamp.is_file():
            wheels.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheels), "--only-binary=:all:",
                   "--implementation", "cp", "--python-version", PYTHON, "--abi", f"cp{PYTHON.replace('.', '')}"]
            for tag_ in _platform_tags():
                cmd += ["--platform", tag_]
            print(f"dsaops image base: pip download {' '.join(reqs)} (once; cached in {wheels})", file=sys.stderr)
            if subprocess.run([*cmd, *reqs], check=False).returncode:
                raise UserError("pip could not download the stand-in's wheels (above); reach a package index "
                                "(PIP_INDEX_URL / PIP_EXTRA_INDEX_URL) or fill the folder from one")
            _check_pinned(wheels, stamp, downloaded=True)
            stamp.touch()
        wheel = sglang_wheel(target)
        if not (wheels / wheel.name).is_file():
            shutil.copy2(wheel, wheels / wheel.name)
    return context


def _rootfs_id(rootfs: Path) -> str:
    """What tells one cached root filesystem from another: its name (the suite and packages) and size."""
    return f"{rootfs.name} {rootfs.stat().st_size}"


def _key(target, context: Path, rootfs: Path) -> str:
    h = hashlib.sha256(DOCKERFILE.read_bytes())
    h.update(f"{_rootfs_id(rootfs)}\n".encode())
    for name in sorted(p.name for p in (context / "wheels").glob("*.whl")):
        h.update(name.encode() + b"\n")
    h.update(KINDS[target.vendor].encode())
    return h.hexdigest()


def _docker(*args: str, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], check=False, capture_output=capture, text=True)


def ensure(target) -> str:
    """The target's stand-in base in the engine, built when missing or made from other inputs; its tag."""
    if problem := build_host.engine_problem():
        raise UserError(problem)
    rootfs = debian_rootfs()
    context = wheel_context(target)
    key = _key(target, context, rootfs)
    image = tag(target)
    have = _docker("image", "inspect", "--format", '{{ index .Config.Labels "dsaops.standin.key" }}', image)
    if have.returncode == 0 and have.stdout.strip() == key:
        return image
    debian = f"dsaops-standin/debian:{SUITE}-{hashlib.sha256(_rootfs_id(rootfs).encode()).hexdigest()[:12]}"
    if _docker("image", "inspect", debian).returncode:
        imported = _docker("import", str(rootfs), debian)
        if imported.returncode:
            raise UserError(f"docker import of {rootfs} failed: {imported.stderr.strip()}")
    reqs = requirements()
    cmd = ["env", "DOCKER_BUILDKIT=1", "docker", "build", "--network", "none", "--file", str(DOCKERFILE),
           "--target", KINDS[target.vendor], "--build-arg", f"DEBIAN_IMAGE={debian}",
           "--build-arg", f"COMMON_REQUIREMENTS={' '.join(reqs['common'])}",
           "--build-arg", f"NVIDIA_REQUIREMENTS={' '.join(reqs['nvidia'])}",
           "--build-arg", f"SGLANG_WHEEL={sglang_wheel(target).name}", "--build-arg", f"STANDIN_KEY={key}",
           "--tag", image, str(context)]
    print(f"dsaops image base: building {image}", file=sys.stderr)
    if subprocess.run(cmd, check=False).returncode:
        raise UserError(f"the stand-in base {image} did not build (the log above says where)")
    return image


def run(args) -> int:
    """`dsaops image base --arch T`."""
    from dsaops.image import _target

    target = _target(args.arch)
    image = ensure(target)
    print(f"{image}: stand-in base for {target.name} ({platform()}); build the serving image on it with\n"
          f"  make image ARCH={target.name} BASE=standin")
    return 0
