"""Fixtures for the healthchecks tests: titled scheduler processes, a /server_info server in
SGLang 0.5.23's shape, the exporter on loopback, and one real Prometheus per session."""
from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from need import need

HERE = Path(__file__).parent

# /server_info as 0.5.23 builds it (http_server.py server_info: resolved args, scheduler info,
# internal_states per DP rank from internal_state.py; memory_usage from memory_usage.py), trimmed
# to the fields that matter plus a few neighbours. 8 attention-DP ranks, 8 requested: 1 per rank.
SERVER_INFO = {
    "model_path": "zai-org/GLM-5.3-Flash", "tp_size": 8, "dp_size": 1, "attn_dp_size": 8,
    "enable_dp_attention": True, "max_running_requests": 8, "context_length": 131072,
    "kv_cache_dtype": "fp8_e4m3", "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang",
    "disable_radix_cache": False, "max_mamba_cache_size": None, "page_size": 64,
    "max_total_num_tokens": 4922240, "max_req_input_len": 131066, "startup_time": 1764410000.0,
    "launch_command": "python3 -m sglang.launch_server --model-path zai-org/GLM-5.3-Flash --tp 8 --attn-dp-size 8",
    "version": "0.5.23", "frontend": "python",
    "internal_states": [
        {"world_size": 8, "startup_time": 1764410000.0, "effective_max_running_requests_per_dp": 1,
         "last_gen_throughput": 0.0,
         "memory_usage": {"weight": 51.2, "kvcache": 32.48, "startup_available": 120.0, "token_capacity": 4922240,
                          "token_capacity_swa": None, "graph": {"decode": 1.2}}}
        for _ in range(8)
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """Serves /server_info and /health; tests change `info` (None: 404), `raw` (bytes served as is),
    `health_status` and `health_delay` while it runs."""

    def __init__(self):
        self.info = copy.deepcopy(SERVER_INFO)
        self.raw: bytes | None = None
        self.health_status, self.health_delay = 200, 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/server_info" and server.info is None and server.raw is None:
                    self._send(404, b"")  # a worker node: no /server_info
                elif self.path == "/server_info":
                    body = server.raw if server.raw is not None else json.dumps(server.info).encode()
                    self._send(200, body)
                elif self.path == "/health":
                    time.sleep(server.health_delay)
                    self._send(server.health_status, b"")
                else:
                    self._send(404, b"")

            def _send(self, code, body):
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (the health check's own timeout)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    server = FakeServer()
    yield server
    server.close()


class Launcher:
    def __init__(self, titles):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fake_launcher.py"), *titles],
                                     stdout=subprocess.PIPE, text=True)
        self.pids = json.loads(self.proc.stdout.readline())

    def stop(self):
        """A clean whole-server stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)

    def kill_all(self):
        for pid in [*self.pids, self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)


@pytest.fixture
def launcher():
    started = []

    def start(titles):
        started.append(Launcher(titles))
        return started[-1]

    yield start
    for lch in started:
        lch.kill_all()


def wait_for(predicate, timeout: float, step: float = 0.1):
    """The predicate's first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


class Prometheus:
    """A real Prometheus server (Debian's package) on loopback, scraping one exporter port
    every second; each test's exporter takes that port in turn, with its own `node`."""

    def __init__(self, tmp: Path, exporter_port: int):
        self.exporter_port = exporter_port
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: dsaops\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n")
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
def prometheus(tmp_path_factory):
    need(shutil.which("prometheus") is not None, "Prometheus server (apt-get install prometheus)")
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), free_port())
    yield prom
    prom.stop()


@pytest.fixture
def exporter_on(request):
    """exporter_on(Config, port): the real exporter (background readers + HTTP server) on loopback."""
    from dsaops.healthchecks.exporter import Exporter
    from dsaops.healthchecks.http import serve

    running = []

    def start(cfg, port=0):
        exp = Exporter(cfg).start()
        server = serve(exp, "127.0.0.1", port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        running.append((exp, server))
        exp.url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        return exp

    yield start
    for exp, server in running:
        server.shutdown()
        server.server_close()
        exp.stop()


def scrape(url: str) -> dict[str, float]:
    """The exposition as {'name{labels}': value}, labels in the exporter's order."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
