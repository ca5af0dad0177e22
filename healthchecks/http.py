"""The exporter's HTTP side: /metrics (a fresh registry per scrape) and a small index page, both
behind `Authorization: Bearer <token>` when the exporter has a token (401 without it).

Bounded: a connection gets a worker thread only once its whole request has arrived (one thread
reads what arrives of every connection's request, at most `MAX_REQUEST` bytes, in one selector),
at most `workers` requests are handled at once, a connection that sends nothing for `idle_timeout`
seconds is closed, so is one whose request has not arrived whole `read_timeout` seconds after its
first byte, and past `max_connections` open connections the oldest one still waiting for its
request is dropped for the newcomer. A flood of idle or slow sockets thus holds no worker, and a
scrape still gets one.
"""
from __future__ import annotations

import hmac
import io
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CONTENT_TYPE_LATEST

INDEX = b"""<html><head><title>dsaops exporter</title></head>
<body><h1>dsaops exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>"""
WORKERS = 4
MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 5.0
MAX_REQUEST = 64 << 10      # a scrape's request line and headers are a few hundred bytes


class _Handler(WSGIRequestHandler):
    def __init__(self, request, client_address, server, head: bytes):
        self.head = head
        super().__init__(request, client_address, server)

    def setup(self):
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(self.head)  # read whole before a worker took it: no worker waits for a client

    def log_message(self, *args):  # one line per scrape is noise in the server's log
        pass


class BoundedServer(WSGIServer):
    """A WSGI server that accepts on one thread, waits for requests on a second and answers on a
    bounded pool; see the module's docstring."""

    request_queue_size = 128    # the kernel's accept queue: a burst of connects waits there, not in SYN retries

    def __init__(self, address, *, workers: int = WORKERS, max_connections: int = MAX_CONNECTIONS,
                 idle_timeout: float = IDLE_TIMEOUT_S, read_timeout: float = READ_TIMEOUT_S):
        self.idle_timeout, self.read_timeout, self.max_connections = idle_timeout, read_timeout, max_connections
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="exporter-http")
        self._idle = selectors.DefaultSelector()
        # connections whose request has not arrived whole, oldest first: [deadline, what arrived]
        self._waiting: dict[socket.socket, list] = {}
        # A byte on _wake ends the waiting thread's select at once, so a new connection waits for nothing.
        self._wake, self._waker = socket.socketpair()
        self._wake.setblocking(False)
        self._idle.register(self._wake, selectors.EVENT_READ)
        self._busy = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._waiter = threading.Thread(target=self._wait_for_requests, name="exporter-http-idle", daemon=True)
        self._waiter.start()
        super().__init__(address, _Handler)        # closes the server (server_close) when it cannot bind

    def process_request(self, request, client_address):
        """On the accepting thread: park the connection until its request arrives."""
        with self._lock:
            if len(self._waiting) + self._busy >= self.max_connections:
                if not self._waiting:
                    self.shutdown_request(request)      # every connection is being answered: refuse
                    return
                self._forget(next(iter(self._waiting)), close=True)
            request.setblocking(False)
            self._waiting[request] = [time.monotonic() + self.idle_timeout, bytearray()]
            self._idle.register(request, selectors.EVENT_READ, client_address)
        self._waker.send(b"\0")

    def _forget(self, conn: socket.socket, close: bool) -> None:
        self._idle.unregister(conn)
        del self._waiting[conn]
        if close:
            self.shutdown_request(conn)

    def _wait_for_requests(self) -> None:
        while not self._closed.is_set():
            ready = self._idle.select(timeout=0.5)    # the timeout only paces the idle-timeout sweep
            now = time.monotonic()
            with self._lock:
                for key, _ in ready:
                    if key.fileobj is self._wake:
                        self._drain_wake()
                    elif key.fileobj in self._waiting:
                        self._receive(key.fileobj, key.data, now)
                for conn, (deadline, _) in list(self._waiting.items()):
                    if now > deadline:
                        self._forget(conn, close=True)

    def _receive(self, conn: socket.socket, client_address, now: float) -> None:
        """Reads what arrived of conn's request; hands the request to a worker once it is whole."""
        waiting = self._waiting[conn]
        head = waiting[1]
        try:
            data = conn.recv(MAX_REQUEST + 1 - len(head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:     # reset by the client
            data = b""
        if not data or len(head) + len(data) > MAX_REQUEST:
            self._forget(conn, close=True)
            return
        if not head:
            waiting[0] = now + self.read_timeout
        tail = max(len(head) - 3, 0)    # look for the blank line in the new bytes only: a drip costs no rescans
        head += data
        if head.find(b"\r\n\r\n", tail) >= 0 or head.find(b"\n\n", tail) >= 0:
            self._forget(conn, close=False)
            self._busy += 1
            self._pool.submit(self._answer, conn, client_address, bytes(head))

    def _drain_wake(self) -> None:
        try:
            while self._wake.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _answer(self, conn: socket.socket, client_address, head: bytes) -> None:
        try:
            conn.settimeout(self.read_timeout)     # bounds the answer's writes to a client that reads nothing
            self.RequestHandlerClass(conn, client_address, self, head)
        except OSError:      # the client went away or timed out mid-answer
            pass
        finally:
            self.shutdown_request(conn)
            with self._lock:
                self._busy -= 1

    def server_close(self):
        self._closed.set()
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for conn in list(self._waiting):
                self._forget(conn, close=True)
        self._waker.send(b"\0")       # the waiting thread sees _closed and ends
        self._waiter.join(timeout=2)
        self._idle.close()
        self._wake.close()
        self._waker.close()


def authorized(environ, token: str | None) -> bool:
    """True without a token, else when the request carries `Authorization: Bearer <token>`."""
    if token is None:
        return True
    scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    # constant time: the answer's timing tells nothing of how much of a guess was right
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1", "replace"), token.encode())


def app(exporter, token: str | None = None):
    def wsgi(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if not authorized(environ, token):
            body = b"unauthorized: send Authorization: Bearer <token>\n"
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
        elif path == "/metrics":
            body = exporter.scrape()
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        elif path == "/":
            body = INDEX
            start_response("200 OK", [("Content-Type", "text/html")])
        else:
            body = b"not found\n"
            start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [body]

    return wsgi


def serve(exporter, host: str, port: int, token: str | None = None, **limits) -> BoundedServer:
    """A started-but-not-serving server, answering only requests with `token` when one is given; call
    `serve_forever()` (or run it in a thread)."""
    server = BoundedServer((host, port), **limits)
    server.set_app(app(exporter, token))
    return server
