"""Containers as a source, against a real dockerd started here (vfs storage, no network):
a container in a restart loop, one the OOM killer ended, one removed and run again under its
name (as the systemd unit does) across exporter restarts, and an engine that stops answering."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from dsaops.healthchecks.containers import ContainerCollector, Containers
from dsaops.healthchecks.exporter import Config, Exporter
from dsaops.healthchecks.metrics import ErrorCounts, Families
from prometheus_client import CollectorRegistry, generate_latest

from tests.healthchecks.prometheus_text import exposition
from tests.support.polling import wait_for
from tests.support.prerequisites import need

IMAGE = "dsaops-test/busybox:1"


@pytest.fixture(scope="module")
def engine(dockerd):
    """The shared test dockerd with a busybox image of our own (no registry here)."""
    need(shutil.which("busybox"), "busybox (apt-get install busybox-static)")

    def docker(*args, **kw):
        return subprocess.run(["docker", *args], env=dockerd, capture_output=True, timeout=60, check=True, **kw)

    with tempfile.TemporaryDirectory(prefix="dsaops-busybox-") as tmp:
        rootfs = Path(tmp)
        (rootfs / "bin").mkdir()
        shutil.copy(shutil.which("busybox"), rootfs / "bin" / "busybox")
        (rootfs / "bin" / "sh").symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
    docker("import", "-", IMAGE, input=tar)
    yield {"url": dockerd["DOCKER_HOST"], "docker": docker}
    names = docker("ps", "-aq", "--filter", f"ancestor={IMAGE}").stdout.split()
    if names:
        docker("rm", "-f", *[n.decode() for n in names])


@pytest.fixture(scope="module")
def oom(engine):
    """A container named "oom" that the OOM killer ended, as the engine recorded it. The engine
    sets OOMKilled only when containerd's OOM event reaches it before the exit (else exit code 137,
    OOMKilled false); on a loaded machine it sometimes does not, so it gets three runs."""
    d = engine["docker"]
    for _ in range(3):  # the pause lets containerd watch the container's memory cgroup first
        d("run", "-d", "--network", "none", "--memory", "8m", "--memory-swap", "8m", "--name", "oom", IMAGE,
          "/bin/sh", "-c", 'sleep 1; x=$(/bin/busybox head -c 200000000 /dev/zero | /bin/busybox tr "\\0" a)')
        d("wait", "oom")
        state = d("inspect", "--format", "{{json .State}}", "oom").stdout
        if json.loads(state)["OOMKilled"]:
            return
        d("rm", "oom")
    pytest.fail(f"the engine recorded no OOM kill in three runs; the last: {state.decode()}")


def collect(names, url, errors=None):
    errors = errors or ErrorCounts()
    return scrape(Containers(names, errors, base_url=url)), errors


def scrape(containers):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ContainerCollector(containers, Families("n1")))
    return exposition(generate_latest(registry).decode())


def restarts(containers, name):
    return scrape(containers)[f'dsa_container_restarts_total{{container="{name}",node="n1"}}']


def test_restart_loop_exit_code_and_oom(engine, oom):
    d = engine["docker"]
    d("run", "-d", "--network", "none", "--restart", "on-failure:20", "--name", "loop", IMAGE, "/bin/sh", "-c", "exit 3")
    d("run", "-d", "--network", "none", "--name", "calm", IMAGE, "/bin/sh", "-c", "sleep 600")
    restarts = 'dsa_container_restarts_total{container="loop",node="n1"}'
    assert wait_for(lambda: collect(["loop"], engine["url"])[0].get(restarts, 0) >= 3, 30, 0.5)
    out, errors = collect(["loop", "oom", "calm"], engine["url"])
    assert out['dsa_container_exit_code{container="loop",node="n1"}'] == 3
    assert out['dsa_container_oom_killed{container="loop",node="n1"}'] == 0
    assert out['dsa_container_oom_killed{container="oom",node="n1"}'] == 1
    assert out['dsa_container_exit_code{container="oom",node="n1"}'] == 137
    assert out['dsa_container_running{container="calm",node="n1"}'] == 1
    assert out['dsa_container_restarts_total{container="calm",node="n1"}'] == 0
    assert errors.counts()["docker"] == 0


def test_missing_container_and_dead_engine_are_counted(engine, tmp_path):
    out, errors = collect(["no-such-container"], engine["url"])
    assert errors.counts()["docker"] == 1 and not any("no-such-container" in k for k in out)
    out, errors = collect(["calm"], f"unix://{tmp_path}/nothing.sock")
    assert errors.counts()["docker"] == 1


def test_healthcheck_asks_the_engine(engine, oom, fake_server):
    from dsaops.healthchecks.healthcheck import check

    assert check(fake_server.url, None, 3, "calm", engine["url"]) == []
    assert any("restarting" in p or "exited" in p for p in check(fake_server.url, None, 3, "loop", engine["url"]))
    assert any("OOM killer" in p for p in check(fake_server.url, None, 3, "oom", engine["url"]))
    assert any("did not say" in p for p in check(fake_server.url, None, 3, "gone", engine["url"]))


def test_oom_killed_container_is_a_cause(engine, oom):
    errors = ErrorCounts()
    assert Containers(["calm", "oom"], errors, engine["url"]).oom_killed() is True
    assert Containers(["calm", "loop"], errors, engine["url"]).oom_killed() is False
    assert errors.counts()["docker"] == 0


def test_a_container_run_anew_under_its_name_is_a_restart_across_exporter_restarts(engine, tmp_path):
    """The systemd unit's start: `docker rm --force NAME`, then a new container (RestartCount 0)."""
    d, exporters = engine["docker"], []

    def run_anew():
        d("rm", "--force", "anew")
        d("run", "-d", "--network", "none", "--name", "anew", IMAGE, "/bin/sh", "-c", "sleep 600")

    def exporter():  # a new exporter's state, taken back from the file it saves when it stops
        if exporters:
            exporters[-1].keeper.save()
        exp = Exporter(Config(server_url="http://127.0.0.1:9", node="n1", containers=["anew"],
                              docker_url=engine["url"], state_file=str(tmp_path / "state.json"), kmsg=None))
        exp.keeper.restore()
        exporters.append(exp)
        return exp.containers

    run_anew()
    containers = exporter()
    assert restarts(containers, "anew") == 0
    run_anew()
    assert restarts(containers, "anew") == 1
    assert restarts(containers, "anew") == 1  # looked at again: the same container
    containers = exporter()
    assert restarts(containers, "anew") == 1  # restarted exporter: neither lost nor counted again
    run_anew()  # and the exporter restarts before its next look
    containers = exporter()
    assert restarts(containers, "anew") == 2
    assert all(e.errors.counts()["docker"] == e.errors.counts()["state"] == 0 for e in exporters)


def test_restarts_by_docker_are_counted_once_and_a_start_by_hand_loses_none(engine):
    """Docker restarts keep the Id: no re-creation on top of RestartCount. `docker start` resets
    RestartCount to 0; the counter keeps what it had counted and goes on from there."""
    d, containers = engine["docker"], Containers(["twice"], ErrorCounts(), base_url=engine["url"])
    d("run", "-d", "--network", "none", "--restart", "on-failure:2", "--name", "twice", IMAGE,
      "/bin/sh", "-c", "sleep 2; exit 3")
    exited = 'dsa_container_running{container="twice",node="n1"}'
    assert wait_for(lambda: scrape(containers).get(exited) == 0 and restarts(containers, "twice") == 2, 30, 0.2)
    wait_for(lambda: False, 1)
    assert restarts(containers, "twice") == 2
    d("start", "twice")
    assert d("inspect", "--format", "{{.RestartCount}}", "twice").stdout.strip() == b"0"
    assert restarts(containers, "twice") == 2  # a Prometheus counter never goes down
    assert wait_for(lambda: restarts(containers, "twice") == 4, 30, 0.2), restarts(containers, "twice")
