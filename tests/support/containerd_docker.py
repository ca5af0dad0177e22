"""A Docker Engine that keeps its images in containerd, as a fresh Docker 29 install does.

Debian 12's Docker (20.10) predates that image store. Debian 13's docker.io (26.1) has it
(daemon.json's `containerd-snapshotter` feature) and runs here with its containerd (1.7): both
need glibc 2.34 and Debian 12 has 2.36. The packages are the ones Debian 13's index lists now, each
checked against the index's sha256 and the index against the Release file's, whose signature gpgv
checks with Debian's archive keyring (as apt does); unpacked once into the cache ($DSAOPS_CACHE).
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
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")  # apt's (its package depends on it)
PACKAGES = ("docker.io", "containerd")
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _fields(index: str, package: str) -> dict[str, str]:
    """The stanza of `package` in a Packages index, as field -> value."""
    for stanza in index.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package:
            return fields
    raise LookupError(f"{package} is not in Debian 13's index")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as answer:
        return answer.read()


def release(signed: bytes) -> str:
    """The Release file an InRelease carries; OSError unless its signature is good under KEYRING."""
    checked = subprocess.run(["gpgv", "--keyring", str(KEYRING), "--output", "-", "-"], input=signed,
                             capture_output=True, check=False)
    if checked.returncode:
        why = checked.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise OSError(f"Debian 13's InRelease is not signed by a key of {KEYRING}: {why}")
    return checked.stdout.decode()


def _index(arch: str) -> str:
    """Debian 13's Packages index for `arch`, checked against the signed Release file's sha256."""
    name = f"main/binary-{arch}/Packages.xz"
    listed = release(fetch(f"{MIRROR}/dists/trixie/InRelease")).partition("\nSHA256:\n")[2]
    sums = {fields[2]: fields[0] for line in listed.splitlines()   # " <sha256> <size> <path>" a file
            if line.startswith(" ") and len(fields := line.split()) == 3}
    index = fetch(f"{MIRROR}/dists/trixie/{name}")
    if hashlib.sha256(index).hexdigest() != sums.get(name):
        raise OSError(f"{name} does not match Debian 13's signed Release file")
    return lzma.decompress(index).decode()


def bin_dirs() -> list[Path]:
    """The folders holding dockerd 26 and containerd 1.7, downloaded and unpacked on first use; OSError or
    LookupError when Debian's mirror cannot be reached, lacks them or gives a file that fails its check."""
    arch = ARCH[platform.machine()]
    root = cache_dir("debian13-docker", arch)
    with locked(".debian13-docker.lock"):
        if not (root / "usr/sbin/dockerd").is_file():
            index = _index(arch)
            root.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
                for package in PACKAGES:
                    fields = _fields(index, package)
                    deb = fetch(f"{MIRROR}/{fields['Filename']}")
                    if hashlib.sha256(deb).hexdigest() != fields["SHA256"]:
                        raise OSError(f"{fields['Filename']} does not match Debian 13's index")
                    path = Path(tmp, f"{package}.deb")
                    path.write_bytes(deb)
                    subprocess.run(["dpkg-deb", "-x", str(path), str(Path(tmp, "root"))], check=True)
                shutil.rmtree(root, ignore_errors=True)
                Path(tmp, "root").rename(root)
    return [root / "usr/sbin", root / "usr/bin"]
