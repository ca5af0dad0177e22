"""`need(ok, why)`: a part the test cannot run without (root, dockerd, sshd, Prometheus).

Under CI (CI set) a missing part fails the test, since .ci/run installs every part;
elsewhere the test is skipped and says why.
"""
import os

import pytest


def need(ok: bool, why: str) -> None:
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {why}")
    pytest.skip(why)
