"""SGLang 0.5.23's server stood in: /server_info and /health in its shape, and a launcher of
processes titled like its schedulers."""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dsaops import pins

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
    "version": pins.SGLANG, "frontend": "python",
    "internal_states": [
        {"world_size": 8, "startup_time": 1764410000.0, "effective_max_running_requests_per_dp": 1,
         "last_gen_throughput": 0.0,
         "memory_usage": {"weight": 51.2, "kvcache": 32.48, "startup_available": 120.0, "token_capacity": 4922240,
                          "token_capacity_swa": None, "graph": {"decode": 1.2}}}
        for _ in range(8)
    ],
}


class FakeServer:
    """Serves /server_info and /health; tests change `info` (None: 404), `raw` (bytes served as is),
    `health_status`, `health_delay` and `api_key` (as --api-key: /server_info then answers 401 without
    `Authorization: Bearer KEY`; /health stays open) while it runs."""

    def __init__(self):
        self.info = copy.deepcopy(SERVER_INFO)
        self.raw: bytes | None = None
        self.api_key: str | None = None
        self.health_status, self.health_delay = 200, 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if (self.path != "/health" and server.api_key
                        and self.headers.get("Authorization") != f"Bearer {server.api_key}"):
                    self._send(401, b'{"error": "Unauthorized"}')
                elif self.path == "/server_info" and server.info is None and server.raw is None:
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


class Launcher:
    """launcher.py with these titles and options (its --flags, e.g. "--watchdog", "--log", path)."""

    def __init__(self, titles, *options):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "launcher.py"), *options, *titles],
                                     stdout=subprocess.PIPE, text=True)
        self.pids = json.loads(self.proc.stdout.readline())

    def stop(self):
        """A clean whole-server stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def kill_all(self):
        for pid in [*self.pids, self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
