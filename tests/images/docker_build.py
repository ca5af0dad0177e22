"""Helpers for the image tests: the repository, copies of its sources, the docker client."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from dsaops.image import source_files

REPO = Path(__file__).resolve().parents[2]


def copy_sources(dest: Path) -> Path:
    """A checkout-like copy of the files `dsaops image build` packages, to build or alter in isolation."""
    for rel in source_files():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    subprocess.run(["git", "init", "-q", str(dest)], check=True)  # the wheel is built from git's file list
    return dest


def docker(env: dict, *args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, check=check, timeout=timeout)
