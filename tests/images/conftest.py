"""Image tests' parts: a real dockerd (tests/conftest.py) and the stand-in bases `dsaops image base`
makes in it, the offline route a user without a registry takes.

No registry is reachable in CI, so the bases are Debian bookworm made with debootstrap plus what the
real bases would carry, installed from downloaded wheels (dsaops/image_base.py); the root filesystem
and the wheels are cached under $DSAOPS_CACHE/images, so a later run only imports and installs them.
"""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from dsaops import image_base, targets
from tests.images.docker_build import REPO
from tests.support.prerequisites import need


@pytest.fixture(scope="session")
def standin_bases(dockerd) -> dict[str, str]:
    """{target: its stand-in base} for the three targets, made by `dsaops image base` in our dockerd."""
    need(shutil.which("debootstrap") or image_base.debian_rootfs_cached(),
         "debootstrap (apt-get install debootstrap), which makes the stand-in bases' Debian root filesystem")
    bases = {}
    for name in targets.table():
        out = subprocess.run([sys.executable, "-m", "dsaops", "image", "base", "--arch", name], cwd=REPO, env=dockerd,
                             capture_output=True, text=True, timeout=1800, check=False)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
        bases[name] = image_base.tag(targets.get(name))
    return bases
