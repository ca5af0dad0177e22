"""A Docker Engine that keeps its images in containerd, as a fresh Docker 29 install does.

Debian 12's Docker (20.10) predates that image store. Debian 13's docker.io (26.1) has it
(daemon.json's `containerd-snapshotter` feature) and runs here with its containerd (1.7): both
need glibc 2.34 and Debian 12 has 2.36. The packages are the ones Debian 13's index lists now,
each checked against the index's sha256, unpacked once into the cache ($DSAOPS_CACHE).
"""
from __future__ import annotations

import hashlib
import lzma
import platform
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from dsaops.cache import cache_dir, locked

MIRROR = "https://deb.debian.org/debian"
PACKAGES = ("docker.io", "containerd")
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _fields(index: str, package: str) -> dict[str, str]:
    """The stanza of `package` in a Packages index, as field -> value."""
    for stanza in index.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package:
            return fields
    raise LookupError(f"{package} is not in Debian 13's index")


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return answer.read()


def bin_dirs() -> list[Path]:
    """The folders holding dockerd 26 and containerd 1.7, downloaded and unpacked on first use; OSError or
    LookupError when Debian's mirror cannot be reached or lacks them."""
    arch = ARCH[platform.machine()]
    root = cache_dir("debian13-docker", arch)
    with locked(".debian13-docker.lock"):
        if not (root / "usr/sbin/dockerd").is_file():
            index = lzma.decompress(_fetch(f"{MIRROR}/dists/trixie/main/binary-{arch}/Packages.xz")).decode()
            root.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
                for package in PACKAGES:
                    fields = _fields(index, package)
                    deb = _fetch(f"{MIRROR}/{fields['Filename']}")
                    if hashlib.sha256(deb).hexdigest() != fields["SHA256"]:
                        raise OSError(f"{fields['Filename']} does not match Debian 13's index")
                    path = Path(tmp, f"{package}.deb")
                    path.write_bytes(deb)
                    subprocess.run(["dpkg-deb", "-x", str(path), str(Path(tmp, "root"))], check=True)
                shutil.rmtree(root, ignore_errors=True)
                Path(tmp, "root").rename(root)
    return [root / "usr/sbin", root / "usr/bin"]
