"""Image tests' parts: a real dockerd started here, a local Debian base, copies of the sources.

No registry is reachable in CI, so the base is a Debian bookworm root filesystem made with
debootstrap (Python 3.11, like the cached cp311 SGLang wheel) and imported with `docker
import`; its tarball is cached under $DSAOPS_CACHE/images so a later run skips debootstrap.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.images.docker_build import docker
from tests.support.prerequisites import need
from tests.support.sglang_wheel import cache_dir

BASE_TAG = "dsaops-test/debian-python:bookworm"
def _debian_rootfs_tar() -> Path:
    """bookworm minbase + python3-venv, trimmed, as a tarball in the cache (debootstrap on first use)."""
    cached = cache_dir() / "images" / "debian-bookworm-python3.tar"
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.parent / ".debian.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cached.is_file():
            return cached
        need(shutil.which("debootstrap"), "debootstrap (apt-get install debootstrap)")
        mirror = os.environ.get("DSAOPS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
        with tempfile.TemporaryDirectory(prefix="dsaops-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            subprocess.run(["debootstrap", "--variant=minbase", "--include=python3-venv", "bookworm", str(rootfs),
                            mirror], check=True, capture_output=True, timeout=900)
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                         "usr/share/locale"):
                shutil.rmtree(rootfs / junk, ignore_errors=True)
            partial = cached.with_suffix(".partial")
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(cached)
    return cached


@pytest.fixture(scope="session")
def local_base(dockerd) -> str:
    """A Debian bookworm image with Python 3.11 and venv, imported into our dockerd."""
    tar = _debian_rootfs_tar()
    docker(dockerd, "import", str(tar), BASE_TAG)
    return BASE_TAG
