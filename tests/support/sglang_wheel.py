"""The pinned SGLang wheel (and other pinned wheels), downloaded once per machine, SGLang's unpacked once.

Cached under $DSAOPS_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dsaops): a fresh machine
fills it, a later run reuses it. The unpacked tree is read-only by convention: a test that
changes files copies it first (`pristine_copy`).
"""
import contextlib
import fcntl
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import dsaops.cache
from dsaops.pins import SGLANG as SGLANG_VERSION


def cache_dir() -> Path:
    path = dsaops.cache.cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _locked(name: str):
    """One process at a time fills the cache (pytest-xdist workers, parallel runs)."""
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def wheel(name: str, version: str) -> Path:
    """Path of a cached name-version-*.whl for this machine (pip download --no-deps on first use)."""
    wheels = cache_dir() / "wheels"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    with _locked("wheel"):
        found = sorted(wheels.glob(pattern))
        if not found:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{name}=={version}",
                            "-d", str(wheels)], check=True)
            found = sorted(wheels.glob(pattern))
    return found[0]


def sglang_wheel() -> Path:
    """Path of sglang-0.5.23-*.whl."""
    return wheel("sglang", SGLANG_VERSION)


def sglang_source() -> Path:
    """The folder that holds the pristine `sglang/` package and its dist-info."""
    root = cache_dir() / f"sglang-{SGLANG_VERSION}"
    with _locked("unpack"):
        if not (root / ".complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            with zipfile.ZipFile(sglang_wheel()) as whl:
                whl.extractall(root)
            (root / ".complete").touch()
    return root


def pristine_copy(dest: Path) -> Path:
    """A writable copy of the unpacked wheel (sglang/ and its dist-info) under `dest`."""
    src = sglang_source()
    for entry in src.iterdir():
        if entry.name.startswith("sglang"):
            shutil.copytree(entry, dest / entry.name)
    return dest
