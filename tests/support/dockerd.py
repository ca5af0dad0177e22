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
def running(root: Path, containerd_store: bool = False, containerd_root: Path | None = None) -> Iterator[dict]:
    """Start dockerd with everything under `root`; yield an environment
    whose DOCKER_HOST reaches it and whose PATH finds Debian's client first; stop it at the end.

    containerd_store: Debian 13's dockerd, which keeps its images in containerd (tests/support/containerd_docker.py):
    in a containerd it starts under its data root or, given containerd_root, in one of its own with that root, as
    Docker's packages run containerd.service beside dockerd."""
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    if not (bindir / "docker").exists():
        (bindir / "docker").symlink_to(DEBIAN_DOCKER)
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock}", PATH=f"{bindir}:{os.environ['PATH']}")
    overlay, daemon_env = _overlay_mounts(root), None
    store = ["--storage-driver", "overlay2" if overlay else "vfs"]
    if containerd_store:  # the storage driver names containerd's snapshotter
        from tests.support.containerd_docker import bin_dirs

        daemon_env = dict(os.environ, PATH=os.pathsep.join([*map(str, bin_dirs()), os.environ["PATH"]]))
        (root / "daemon.json").write_text('{"features": {"containerd-snapshotter": true}}\n')
        store = ["--config-file", str(root / "daemon.json"), "--storage-driver", "overlayfs" if overlay else "native"]
    with contextlib.ExitStack() as started:
        started.callback(_remove, root)
        if containerd_root is not None:
            store.append(f"--containerd={started.enter_context(_containerd(root, containerd_root, daemon_env))}")
        with open(root / "dockerd.log", "w") as log:
            proc = subprocess.Popen(
                ["dockerd", *store, "--iptables=false", "--ip6tables=false",
                 "--ip-forward=false", "--ip-masq=false", "--bridge=none", "--data-root", str(root / "data"),
                 "--exec-root", str(root / "exec"), "-H", f"unix://{sock}", "--pidfile", str(root / "docker.pid")],
                env=daemon_env, stdout=log, stderr=subprocess.STDOUT)
        started.callback(_stop, proc)
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "version"], env=env, capture_output=True, check=False).returncode:
            assert proc.poll() is None and time.monotonic() < deadline, (root / "dockerd.log").read_text()[-3000:]
            time.sleep(0.3)
        yield env


@contextlib.contextmanager
def _containerd(root: Path, containerd_root: Path, env: dict | None) -> Iterator[Path]:
    """A containerd keeping images under `containerd_root`, its state and socket under `root`; yields the socket."""
    sock = root / "containerd.sock"
    (root / "containerd.toml").write_text(f'version = 2\nroot = "{containerd_root}"\nstate = "{root}/containerd-state"\n'
                                          f'[grpc]\n  address = "{sock}"\n')
    with open(root / "containerd.log", "w") as log:
        proc = subprocess.Popen(["containerd", "--config", str(root / "containerd.toml")], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not sock.is_socket():
            assert proc.poll() is None and time.monotonic() < deadline, (root / "containerd.log").read_text()[-3000:]
            time.sleep(0.1)
        yield sock
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _remove(root: Path) -> None:
    """Remove `root`, with what a stopped dockerd left mounted under it."""
    # A container on the host's network leaves dockerd's bind of the host network namespace behind.
    with open("/proc/mounts") as mounts:
        left = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{root}/")]
    for mount in sorted(left, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
    # many files (vfs keeps a full copy of the root filesystem per layer): rm is faster than shutil.rmtree
    subprocess.run(["rm", "-rf", str(root)], check=False)
