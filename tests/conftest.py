"""Shared test plumbing: the `gpu` marker, and one Docker engine for the areas that need one."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support.dockerd import DEBIAN_DOCKER, running
from tests.support.prerequisites import need


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which the GPU hosts need not have
def pytest_xdist_make_scheduler(config, log):
    """With --dist loadgroup (make test), every test outside tests/playbooks goes to one worker, one after
    another: some kill rank processes that the exporters they start count host-wide, and some wait out
    timeouts. Each playbook test (they start no ranks) goes to whichever worker is free. The grouping is
    by path here: xdist's xdist_group marker renames node ids in a way pytest 9.2 no longer reads."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OutsidePlaybooksOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith("tests/playbooks/") else "outside-playbooks"

    return OutsidePlaybooksOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here: run `make test-gpu` on an H100/H200 host (CONTRIBUTING.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dockerd():
    """A dockerd of our own (tests/support/dockerd.py), stopped when the session ends."""
    need(os.geteuid() == 0 and shutil.which("dockerd") and DEBIAN_DOCKER.is_file(),
         "root and Docker from Debian (apt-get install docker.io)")
    with running(Path(tempfile.mkdtemp(prefix="dsaops-img-dockerd-"))) as env:
        yield env
