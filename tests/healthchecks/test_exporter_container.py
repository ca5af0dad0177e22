"""The exporter as its own container beside the server's, as the playbook runs them
(dsaops.healthchecks.deploy), against a real dockerd: a server container whose stand-in SGLang
(the real entrypoint, the stand-in launcher with the head node's watchdog) restarts when a rank is
killed, the Docker proxy, and deaths counted once across restarts of either container."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import uuid

import psutil
import pytest
from dsaops.healthchecks.deploy import ExporterDeployment, containers

from benchmarks.sglang_standin.server import FakeServer
from tests.healthchecks.conftest import REPO, host_mounts
from tests.healthchecks.prometheus_text import scrape
from tests.support.polling import wait_for
from tests.support.ports import free_port

pytestmark = pytest.mark.timeout(300)
SCRAPE_TOKEN = "the-clusters-scrape-token-0123456789"   # as the monitoring role writes it: a file, read-only
EXPORTER_UID, PROXY_UID = 60582, 60583   # the monitoring role's defaults: uids no host account has


@pytest.fixture(scope="module")
def node(dockerd, host_image, tmp_path_factory):
    tag = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("node")
    for folder in ("log", "state", "run", "etc"):
        (tmp / folder).mkdir()
    os.chown(tmp / "run", PROXY_UID, PROXY_UID)   # as the monitoring role makes it: the proxy writes there
    (tmp / "run").chmod(0o750)
    server = FakeServer()
    server.api_key = "the-clusters-api-key-0123456789"     # /server_info wants it, as SGLang with --api-key
    (tmp / "etc" / "api-key").write_text(server.api_key + "\n")
    (tmp / "etc" / "api-key").chmod(0o400)
    (tmp / "etc" / "token").write_text(SCRAPE_TOKEN + "\n")
    (tmp / "etc" / "token").chmod(0o400)
    socket_path = dockerd["DOCKER_HOST"].removeprefix("unix://")
    d = ExporterDeployment(image=host_image, node="c1", server_container=f"dsaops-test-srv-{tag}",
                           server_port=int(server.url.rsplit(":", 1)[1]), listen=f"127.0.0.1:{free_port()}",
                           log_file=str(tmp / "log" / "sglang.log"), uid=EXPORTER_UID, proxy_uid=PROXY_UID,
                           state_dir=str(tmp / "state"),
                           run_dir=str(tmp / "run"), exporter_name=f"dsaops-test-exporter-{tag}",
                           proxy_name=f"dsaops-test-proxy-{tag}", api_key_file=str(tmp / "etc" / "api-key"),
                           token_file=str(tmp / "etc" / "token"),
                           docker_socket=socket_path, docker_gid=os.stat(socket_path).st_gid)

    def docker(*args, check=True):
        return subprocess.run(["docker", *args], env=dockerd, capture_output=True, text=True, timeout=120,
                              check=check)

    docker("run", "--detach", "--name", d.server_container, "--restart", "on-failure:5", "--network", "none",
           "--volume", f"{tmp / 'log'}:{tmp / 'log'}", *host_mounts(),
           "--env", "DSAOPS_EXPORTER=0", "--env", f"DSAOPS_LOG_FILE={d.log_file}",
           "--env", "DSAOPS_SERVER_MODULE=benchmarks.sglang_standin.launcher",
           "--entrypoint", str(REPO / "images" / "entrypoint.sh"), host_image, "--ranks", "4", "--watchdog",
           "--log", "-")
    for c in containers(d, extra=host_mounts()):
        docker("run", *c["args"])
    yield {"d": d, "docker": docker, "url": f"http://{d.listen}/metrics", "tmp": tmp}
    for name in (d.exporter_name, d.proxy_name, d.server_container):
        docker("rm", "--force", name, check=False)
    server.close()


def metrics(node) -> dict:
    try:
        return scrape(node["url"], SCRAPE_TOKEN)
    except OSError:
        return {}


def value(node, name, **labels) -> float | None:
    key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "node": "c1"}.items())) + "}"
    return metrics(node).get(key)


def ranks_of(container_pid: int) -> dict[str, int]:
    """Host pids of the schedulers running in the server container (its init's descendants)."""
    try:
        children = psutil.Process(container_pid).children(recursive=True) if container_pid else []
        return {p.cmdline()[0].split("_", 1)[1]: p.pid for p in children
                if p.cmdline() and p.cmdline()[0].startswith("sglang::scheduler")}
    except psutil.Error:  # the container is between two runs
        return {}


def server_pid(node) -> int:
    return json.loads(node["docker"]("inspect", node["d"].server_container).stdout)[0]["State"]["Pid"]


def all_up(node, timeout=60):
    return wait_for(lambda: sum(v for k, v in metrics(node).items() if k.startswith("dsa_worker_up")) == 4
                    and len(ranks_of(server_pid(node))) == 4, timeout, 0.5)


def deaths(node) -> dict[str, float]:
    return {k: v for k, v in metrics(node).items() if k.startswith("dsa_worker_deaths_total") and v}


def kill_rank(node, rank: str) -> None:
    os.kill(ranks_of(server_pid(node))[rank], signal.SIGKILL)


def restarts(node) -> int:
    return json.loads(node["docker"]("inspect", node["d"].server_container).stdout)[0]["RestartCount"]


def test_the_exporter_container_sees_the_ranks_and_the_container(node):
    assert all_up(node), metrics(node) or node["docker"]("logs", node["d"].exporter_name, check=False).stderr
    assert value(node, "dsa_container_running", container=node["d"].server_container) == 1
    assert value(node, "dsa_kv_pool_tokens", rank="TP3") == 4922240  # the log, through the shared volume
    assert value(node, "dsa_exporter_errors_total", source="docker") == 0


def test_a_rank_death_that_restarts_the_server_container_counts_once(node):
    assert all_up(node)
    kill_rank(node, "TP1")  # the watchdog logs it (its pid inside the container) and ends the server
    assert wait_for(lambda: restarts(node) == 1, 30)
    assert wait_for(lambda: deaths(node) == {
        'dsa_worker_deaths_total{cause="sigkill",node="c1",rank="TP1"}': 1}, 30), deaths(node)
    assert all_up(node)  # the restarted server's ranks, TP1 too
    assert wait_for(lambda: value(node, "dsa_container_restarts_total",
                                  container=node["d"].server_container) == 1, 10)


def test_an_exporter_restart_forgets_nothing_and_counts_nothing_twice(node):
    before = deaths(node)
    assert before
    node["docker"]("restart", "--time", "5", node["d"].exporter_name)
    assert all_up(node)
    wait_for(lambda: False, 4)
    assert deaths(node) == before


def test_a_rank_killed_while_the_exporter_is_down_and_the_server_restarted(node):
    d, docker = node["d"], node["docker"]
    docker("stop", "--time", "5", d.exporter_name)
    kill_rank(node, "TP2")
    assert wait_for(lambda: restarts(node) == 2, 30)
    assert wait_for(lambda: len(ranks_of(server_pid(node))) == 4, 30)
    docker("start", d.exporter_name)
    assert wait_for(lambda: deaths(node) == {
        'dsa_worker_deaths_total{cause="sigkill",node="c1",rank="TP1"}': 1,
        'dsa_worker_deaths_total{cause="sigkill",node="c1",rank="TP2"}': 1}, 40), deaths(node)
    assert all_up(node)


def test_a_scrape_without_the_token_is_refused(node):
    assert all_up(node)
    for token in (None, SCRAPE_TOKEN[:-1]):
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(node["url"], token)
        assert refused.value.code == 401


def test_neither_container_runs_as_root_with_powers_or_holds_a_secret_but_the_api_key(node):
    """The proxy as its own user in the socket's group; the exporter as uid 0 with CAP_SYSLOG alone (for /dev/kmsg)
    in the proxy's group (its socket), its API key and scrape token read-only files; neither has the server's
    environment (the Hugging Face token)."""
    def inspect(name):
        return json.loads(node["docker"]("inspect", name).stdout)[0]
    proxy, exporter = inspect(node["d"].proxy_name), inspect(node["d"].exporter_name)
    assert proxy["Config"]["User"] == f"{PROXY_UID}:{PROXY_UID}" and proxy["HostConfig"]["CapDrop"] == ["ALL"]
    assert exporter["Config"]["User"] == "0:0" and exporter["HostConfig"]["CapAdd"] == ["SYSLOG"]
    assert exporter["HostConfig"]["GroupAdd"] == [str(PROXY_UID)]
    assert exporter["HostConfig"]["CapDrop"] == ["ALL"] and "no-new-privileges" in exporter["HostConfig"]["SecurityOpt"]
    for container in (proxy, exporter):
        env = " ".join(container["Config"]["Env"] or [])
        assert "HF_TOKEN" not in env and node["d"].api_key_file not in env and "api-key" not in env
        assert SCRAPE_TOKEN not in env and node["d"].token_file not in env
        assert not any("--env-file" in arg for arg in container["Args"])
    for path, flag in ((node["d"].api_key_file, "--api-key-file"), (node["d"].token_file, "--token-file")):
        mount = next(m for m in exporter["Mounts"] if m["Destination"] == path)
        assert mount["RW"] is False and flag in exporter["Args"]
        assert path not in [m["Destination"] for m in proxy["Mounts"]]
    assert value(node, "dsa_server_up") == 1          # /server_info read with the key


def test_the_proxy_answers_the_server_containers_state_and_nothing_else(node):
    import http.client
    import socket

    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(node["d"].proxy_socket)

    def ask(method, path):
        conn = Unix("localhost", timeout=10)
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()

    status, body = ask("GET", f"/v1.41/containers/{node['d'].server_container}/json")
    attrs = json.loads(body)
    assert status == 200 and set(attrs) == {"Id", "Name", "RestartCount", "State"}
    assert "Env" not in body.decode() and "DSAOPS_LOG_FILE" not in body.decode()  # no environment, no mounts
    for method, path in (("GET", "/containers/json"), ("GET", f"/containers/{node['d'].exporter_name}/json"),
                         ("POST", f"/containers/{node['d'].server_container}/kill"),
                         ("POST", "/containers/create"), ("GET", "/events"), ("DELETE", "/images/x")):
        assert ask(method, path)[0] == 403, (method, path)
    assert ask("GET", "/_ping") == (200, b"OK")
