"""Fixtures for the healthchecks tests: titled scheduler processes, a /server_info server in
SGLang 0.5.23's shape, the exporter on loopback, and one real Prometheus per session."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from benchmarks.sglang_standin.server import FakeServer, Launcher
from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.prerequisites import need


@pytest.fixture
def fake_server():
    server = FakeServer()
    yield server
    server.close()


@pytest.fixture
def launcher():
    started = []

    def start(titles, *options):
        started.append(Launcher(titles, *options))
        return started[-1]

    yield start
    for lch in started:
        lch.kill_all()


class Prometheus:
    """A real Prometheus server (Debian's package) on loopback, scraping one exporter port
    every second; each test's exporter takes that port in turn, with its own `node`. Two more
    jobs scrape `token_port` with a bearer token from a file: `token` (jobs `token-right`) and
    a wrong one (`token-wrong`)."""

    token = "the-scrape-token-0123456789"

    def __init__(self, tmp: Path, exporter_port: int):
        from dsaops.healthchecks.scrape import exporter_job

        self.exporter_port, self.token_port = exporter_port, free_port()
        self.port = free_port()
        self.job = exporter_job()  # the job the rules select, as the playbook's configuration names it
        (tmp / "token-right").write_text(self.token + "\n")
        (tmp / "token-wrong").write_text(self.token[:-1] + "\n")
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: {self.job}\n    honor_labels: true\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
            + "".join(f"  - job_name: token-{which}\n"
                      f"    authorization: {{type: Bearer, credentials_file: token-{which}}}\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{self.token_port}']}}]\n"
                      for which in ("right", "wrong")))
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        ready = wait_for(self._ready, 30, 0.2)
        assert ready, f"Prometheus did not become ready: {(tmp / 'prometheus.log').read_text()[-2000:]}"

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def query(self, expr: str) -> list:
        answer = self.api("query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="session")
def promtool():
    need(shutil.which("promtool") is not None, "promtool (apt-get install prometheus)")
    return shutil.which("promtool")


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    need(shutil.which("prometheus") is not None, "Prometheus server (apt-get install prometheus)")
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), free_port())
    yield prom
    prom.stop()


@pytest.fixture
def exporter_on(request):
    """exporter_on(Config, port, token): the real exporter (background readers + HTTP server) on loopback."""
    from dsaops.healthchecks.exporter import Exporter
    from dsaops.healthchecks.http import serve

    running = []

    def start(cfg, port=0, token=None):
        exp = Exporter(cfg).start()
        server = serve(exp, "127.0.0.1", port, token)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running.append((exp, server))
        exp.url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        return exp

    yield start
    for exp, server in running:
        server.shutdown()
        server.server_close()
        exp.stop()


HOST_IMAGE = "dsaops-test/host-python:1"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def host_image(dockerd):
    """An image that runs this checkout's Python and `dsaops` (no registry here, and no serving image
    to build): busybox, /lib and /lib64 pointing into /usr, and `host_mounts` bind the host's /usr,
    the interpreter's prefix and the checkout in read-only. Containers of it are real containers:
    their own PID namespace, cgroup and restart policy."""
    need(shutil.which("busybox"), "busybox (apt-get install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="dsaops-hostimg-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        shutil.copy(shutil.which("busybox"), root / "bin" / "busybox")
        (root / "bin" / "sh").symlink_to("busybox")
        for link in ("lib", "lib64"):
            (root / link).symlink_to(f"usr/{link}")
        for folder in ("usr", "tmp", "etc", "proc", "sys", "dev", "run"):
            (root / folder).mkdir(exist_ok=True)
        (root / "tmp").chmod(0o1777)
        tar = subprocess.run(["tar", "-C", tmp, "-c", "."], capture_output=True, check=True).stdout
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    subprocess.run(["docker", "import", "--change", f"ENV PATH={path}", "--change", f"ENV PYTHONPATH={REPO}", "-",
                    HOST_IMAGE], env=dockerd, input=tar, capture_output=True, check=True, timeout=120)
    return HOST_IMAGE


def host_mounts() -> tuple[str, ...]:
    """Read-only binds that let a host_image container run this checkout's Python."""
    folders = {"/usr", sys.base_prefix, str(REPO)}
    return tuple(arg for folder in sorted(folders) for arg in ("--volume", f"{folder}:{folder}:ro"))
