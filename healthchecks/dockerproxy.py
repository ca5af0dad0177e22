"""`dsaops docker-proxy`: the Docker Engine API reduced to what the exporter needs.

The Docker socket is root on the host, read-only or not: whoever can reach it can start a
privileged container. The exporter parses untrusted input (the log, /server_info) and
listens on the network, so it never holds the socket. This proxy, in its own container with
no network, holds it and answers on a Unix socket of its own, only:

- `GET /_ping`, `GET /version` (the docker SDK's version check);
- `GET /containers/{name}/json` for the containers named with `--allow`, reduced to `Id`,
  `Name`, `RestartCount` and `State` (running, restarting, exit code, OOMKilled, start and end
  times, error). The rest of `docker inspect` (the environment with its tokens, mounts, the
  command line) never leaves the proxy.

Everything else is refused with 403: other paths, other containers, every other method (no
create, exec, kill, no event stream, no listing). What the exporter learns through it is
this much state of these containers, nothing it could act on.
"""
from __future__ import annotations

import errno
import http.client
import json
import os
import re
import socket
import socketserver
import stat
from http.server import BaseHTTPRequestHandler

MAX_BYTES = 4 << 20
TIMEOUT_S = 5.0
STATE_FIELDS = ("Status", "Running", "Paused", "Restarting", "OOMKilled", "Dead", "Pid", "ExitCode", "Error",
                "StartedAt", "FinishedAt")
_VERSIONED = re.compile(r"^(?:/v\d+\.\d+)?(/.*)$")
_INSPECT = re.compile(r"^/containers/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/json$")


def reduce_inspect(attrs: dict) -> dict:
    """What the exporter may know of a container: its identity, restarts and state."""
    state = attrs.get("State") if isinstance(attrs.get("State"), dict) else {}
    return {"Id": attrs.get("Id"), "Name": attrs.get("Name"), "RestartCount": attrs.get("RestartCount"),
            "State": {k: state[k] for k in STATE_FIELDS if k in state}}


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=TIMEOUT_S)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(self.unix_path)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, listen: str, docker_socket: str, allow: set[str]):
        self.docker_socket, self.allow = docker_socket, allow
        super().__init__(listen, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = TIMEOUT_S  # a client that stalls is dropped
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # one line per request would flood the container's log
        pass

    def address_string(self):
        return "unix"

    def _answer(self, code: int, body: dict | bytes) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if data[:1] in (b"{", b"[") else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _refuse(self) -> None:
        self._answer(403, {"message": "dsaops docker-proxy: only GET /_ping, /version and "
                                      "/containers/{allowed name}/json are answered"})

    def _upstream(self, path: str) -> tuple[int, bytes]:
        conn = _UnixHTTPConnection(self.server.docker_socket)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read(MAX_BYTES + 1)
            if len(body) > MAX_BYTES:
                raise ValueError("answer too large")
            return resp.status, body
        finally:
            conn.close()

    def do_GET(self):
        asked = self.path.split("?", 1)[0]
        m = _VERSIONED.match(asked)
        path = m[1] if m else ""
        inspect = _INSPECT.match(path)
        if path not in ("/_ping", "/version") and not (inspect and inspect[1] in self.server.allow):
            return self._refuse()
        try:
            status, body = self._upstream(asked)
            if inspect and status == 200:
                body = json.dumps(reduce_inspect(json.loads(body))).encode()
        except (OSError, ValueError, http.client.HTTPException) as e:
            return self._answer(502, {"message": f"dsaops docker-proxy: the Docker Engine did not answer: {e}"})
        self._answer(status, body)

    def do_HEAD(self):
        if self.path.split("?", 1)[0] in ("/_ping",):
            return self.do_GET()
        return self._refuse()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = lambda self: self._refuse()


def serve(listen: str, docker_socket: str, allow: list[str], mode: int = 0o660) -> _Server:
    """A proxy listening on the Unix socket `listen` (replacing a stale one); call serve_forever(). Its
    user and group may connect (the exporter runs as the one, or in the other)."""
    if os.path.lexists(listen):
        if not stat.S_ISSOCK(os.lstat(listen).st_mode):  # a file there is someone's: never remove it
            raise FileExistsError(errno.EEXIST, "it exists and is not a socket", listen)
        os.unlink(listen)
    old = os.umask(0o777 & ~mode)   # created with `mode` already: no moment with wider permissions
    try:
        server = _Server(listen, docker_socket, set(allow))
    finally:
        os.umask(old)
    os.chmod(listen, mode)
    return server
