"""A dockerd of the test's own: overlay2 storage where overlay mounts (else vfs), no iptables, no bridge, its own socket and folders.

The image tests build with one; the playbook tests give each sandbox host one, reached through
its own socket (DOCKER_HOST), so `docker save | docker load` between hosts runs for real. They run
in the machine's network namespace: `ip netns exec` remounts /sys, which hides the cgroup
folders dockerd needs, and save/load need no network.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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


@contextlib.contextmanager
def running(root: Path) -> Iterator[dict]:
    """Start dockerd with everything under `root`; yield an environment
    whose DOCKER_HOST reaches it and whose PATH finds Debian's client first; stop it at the end."""
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "docker").exists():
        (bindir / "docker").symlink_to(DEBIAN_DOCKER)
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock}", PATH=f"{bindir}:{os.environ['PATH']}")
    driver = "overlay2" if _overlay_mounts(root) else "vfs"
    with open(root / "dockerd.log", "w") as log:
        proc = subprocess.Popen(
            ["dockerd", "--storage-driver", driver, "--iptables=false", "--ip6tables=false",
             "--ip-forward=false", "--ip-masq=false", "--bridge=none", "--data-root", str(root / "data"),
             "--exec-root", str(root / "exec"), "-H", f"unix://{sock}", "--pidfile", str(root / "docker.pid")],
            stdout=log, stderr=subprocess.STDOUT)
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
