"""The pinned SGLang wheel (and other pinned wheels), downloaded once per machine, SGLang's unpacked once.

Cached under $DSAOPS_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/dsaops): a fresh machine
fills it, a later run reuses it. The unpacked tree is read-only by convention: a test that
changes files copies it first (`pristine_copy`, or `sparse_copy` for the patched files alone).
"""
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import dsaops.cache
from dsaops import pins, wheel_tags
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


def host_tags() -> list[tuple[str, str, str]]:
    """The wheel tags this interpreter installs, best first (pip's own list)."""
    from packaging.tags import sys_tags

    return [(t.interpreter, t.abi, t.platform) for t in sys_tags()]


def wheel(name: str, version: str) -> Path:
    """Path of a cached name-version wheel that this interpreter can install (pip download --no-deps
    on first use), whose sha256 is the one dsaops/pins.toml pins (pins.check_wheel, a UserError
    otherwise). The cache also holds wheels for other platforms (`make image ARCH=sm_121` leaves
    the aarch64 SGLang there): the choice goes by the tags in the file names."""
    wheels = cache_dir() / "wheels"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    with _locked("wheel"):
        found = wheel_tags.best(wheels.glob(pattern), host_tags())
        if found is not None:
            return pins.check_wheel(found)
        wheels.mkdir(exist_ok=True)
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{name}=={version}",
                            "-d", tmp], check=True)
            got = wheel_tags.best(Path(tmp).glob(pattern), host_tags())
            if got is None:
                raise RuntimeError(f"pip downloaded no {name} {version} wheel that {sys.executable} can install")
            # checked before it moves in: a file the index swapped never lands in the cache
            os.replace(pins.check_wheel(got, downloaded=True), wheels / got.name)
        return wheels / got.name


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


def sparse_copy(dest: Path, series) -> Path:
    """A writable copy of just what the patch tool reads under `dest`: the dist-info, the version
    files and every file `series` (a dsaops.sglang_patches.series.Series) touches."""
    src = sglang_source()
    for info in src.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    for rel in ["sglang/__init__.py", "sglang/_version.py", "sglang/version.py", *series.targets]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, dest / rel)
    return dest
