"""`need(ok, why)`: a part the test cannot run without (root, dockerd, sshd, Prometheus, nvcc).

Under CI (CI set) a missing part fails the test, since .ci/run installs every part;
elsewhere the test is skipped and says why.
"""
import os
import shutil

import pytest


def need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {why}")
    pytest.skip(why)


def need_nvcc() -> None:
    """The CUDA toolkit's compiler, which compiles the kernels (no GPU needed)."""
    need(shutil.which("nvcc") is not None, "nvcc (CUDA toolkit) on PATH compiles the kernels")
