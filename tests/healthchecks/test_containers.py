"""Containers as a source, against a real dockerd started here (vfs storage, no network):
a container in a restart loop, one the OOM killer ended, and an engine that stops answering."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from dsaops.healthchecks.containers import ContainerCollector, Containers
from dsaops.healthchecks.metrics import ErrorCounts, Families
from hc_parts import exposition, wait_for
from need import need
from prometheus_client import CollectorRegistry, generate_latest

IMAGE = "dsaops-test/busybox:1"


@pytest.fixture(scope="module")
def dockerd():
    need(os.geteuid() == 0 and shutil.which("dockerd") and shutil.which("busybox"),
         "root, dockerd and busybox (apt-get install docker.io busybox-static)")
    root = Path(tempfile.mkdtemp(prefix="dsaops-dockerd-"))
    sock = root / "docker.sock"
    log = open(root / "dockerd.log", "w")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen(
        ["dockerd", "--storage-driver", "vfs", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
         "--ip-masq=false", "--bridge=none", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "-H", f"unix://{sock}", "--pidfile", str(root / "docker.pid")], stdout=log, stderr=subprocess.STDOUT)
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock}")

    def docker(*args, **kw):
        return subprocess.run(["docker", *args], env=env, capture_output=True, timeout=60, check=True, **kw)

    try:
        ready = wait_for(lambda: subprocess.run(["docker", "version"], env=env, capture_output=True,
                                                check=False).returncode == 0, 30, 0.3)
        assert ready, (root / "dockerd.log").read_text()[-2000:]
        rootfs = root / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy(shutil.which("busybox"), rootfs / "bin" / "busybox")
        (rootfs / "bin" / "sh").symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        docker("import", "-", IMAGE, input=tar)
        yield {"url": f"unix://{sock}", "docker": docker}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def collect(names, url, errors=None):
    errors = errors or ErrorCounts()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ContainerCollector(Containers(names, errors, base_url=url), Families("n1")))
    return exposition(generate_latest(registry).decode()), errors


def test_restart_loop_exit_code_and_oom(dockerd):
    d = dockerd["docker"]
    d("run", "-d", "--network", "none", "--restart", "on-failure:20", "--name", "loop", IMAGE, "/bin/sh", "-c", "exit 3")
    d("run", "-d", "--network", "none", "--memory", "8m", "--memory-swap", "8m", "--name", "oom", IMAGE,
      "/bin/sh", "-c", 'x=$(/bin/busybox head -c 200000000 /dev/zero | /bin/busybox tr "\\0" a)')
    d("run", "-d", "--network", "none", "--name", "calm", IMAGE, "/bin/sh", "-c", "sleep 600")
    restarts = 'dsa_container_restarts_total{container="loop",node="n1"}'
    assert wait_for(lambda: collect(["loop"], dockerd["url"])[0].get(restarts, 0) >= 3, 30, 0.5)
    out, errors = collect(["loop", "oom", "calm"], dockerd["url"])
    assert out['dsa_container_exit_code{container="loop",node="n1"}'] == 3
    assert out['dsa_container_oom_killed{container="loop",node="n1"}'] == 0
    if out['dsa_container_oom_killed{container="oom",node="n1"}'] != 1:  # the memory cgroup may lag a moment
        time.sleep(2)
        out, errors = collect(["loop", "oom", "calm"], dockerd["url"])
    assert out['dsa_container_oom_killed{container="oom",node="n1"}'] == 1
    assert out['dsa_container_exit_code{container="oom",node="n1"}'] == 137
    assert out['dsa_container_running{container="calm",node="n1"}'] == 1
    assert out['dsa_container_restarts_total{container="calm",node="n1"}'] == 0
    assert errors.counts()["docker"] == 0


def test_missing_container_and_dead_engine_are_counted(dockerd, tmp_path):
    out, errors = collect(["no-such-container"], dockerd["url"])
    assert errors.counts()["docker"] == 1 and not any("no-such-container" in k for k in out)
    out, errors = collect(["calm"], f"unix://{tmp_path}/nothing.sock")
    assert errors.counts()["docker"] == 1


def test_healthcheck_asks_the_engine(dockerd, fake_server):
    from dsaops.healthchecks.healthcheck import check

    assert check(fake_server.url, None, 3, "calm", dockerd["url"]) == []
    assert any("restarting" in p or "exited" in p for p in check(fake_server.url, None, 3, "loop", dockerd["url"]))
    assert any("OOM killer" in p for p in check(fake_server.url, None, 3, "oom", dockerd["url"]))
    assert any("did not say" in p for p in check(fake_server.url, None, 3, "gone", dockerd["url"]))


def test_oom_killed_container_is_a_cause(dockerd):
    errors = ErrorCounts()
    assert Containers(["calm", "oom"], errors, dockerd["url"]).oom_killed() is True
    assert Containers(["calm", "loop"], errors, dockerd["url"]).oom_killed() is False
    assert errors.counts()["docker"] == 0
