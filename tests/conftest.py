"""Shared test plumbing: the `gpu` marker, and one Docker engine for the areas that need one."""
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.prerequisites import need


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


# The Debian package's client (20.10) drives BuildKit without the buildx plugin when
# DOCKER_BUILDKIT=1, as `dsaops image build` sets it; a newer client would need buildx.
DEBIAN_DOCKER = Path("/usr/bin/docker")


def _overlay_mounts(root: Path) -> bool:
    """Whether an overlay filesystem mounts here (then dockerd's overlay2 driver shares image layers
    instead of copying the whole root filesystem per layer, as vfs does)."""
    work = root / "overlay-probe"
    dirs = [work / d for d in ("lower", "upper", "work", "merged")]
    for d in dirs:
        d.mkdir(parents=True)
    opts = f"lowerdir={dirs[0]},upperdir={dirs[1]},workdir={dirs[2]}"
    ok = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(dirs[3])], capture_output=True,
                        check=False).returncode == 0
    if ok:
        subprocess.run(["umount", str(dirs[3])], check=True)
    shutil.rmtree(work)
    return ok


@pytest.fixture(scope="session")
def dockerd():
    """A dockerd of our own: overlay2 storage where overlay mounts (else vfs), no iptables, no bridge;
    stopped when the session ends."""
    need(os.geteuid() == 0 and shutil.which("dockerd") and DEBIAN_DOCKER.is_file(),
         "root and Docker from Debian (apt-get install docker.io)")
    root = Path(tempfile.mkdtemp(prefix="dsaops-img-dockerd-"))
    sock = root / "docker.sock"
    bindir = root / "bin"
    bindir.mkdir()
    (bindir / "docker").symlink_to(DEBIAN_DOCKER)
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock}", PATH=f"{bindir}:{os.environ['PATH']}")
    driver = "overlay2" if _overlay_mounts(root) else "vfs"
    with open(root / "dockerd.log", "w") as log:
        proc = subprocess.Popen(
            ["dockerd", "--storage-driver", driver, "--iptables=false", "--ip6tables=false", "--ip-forward=false",
             "--ip-masq=false", "--bridge=none", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
             "-H", f"unix://{sock}", "--pidfile", str(root / "docker.pid")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "version"], env=env, capture_output=True, check=False).returncode:
            assert proc.poll() is None and time.monotonic() < deadline, (root / "dockerd.log").read_text()[-3000:]
            time.sleep(0.3)
        yield env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # A container on the host's network leaves dockerd's bind of the host network namespace behind.
        with open("/proc/mounts") as mounts:
            left = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{root}/")]
        for mount in sorted(left, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        # many files (vfs keeps a full copy of the root filesystem per layer): rm is faster than shutil.rmtree
        subprocess.run(["rm", "-rf", str(root)], check=False)
