"""The exporter's HTTP side: /metrics (a fresh registry per scrape) and a small index page.

Bounded: a connection gets a worker thread only once its request has started to arrive (idle
connections wait in one selector, costing no thread), at most `workers` requests are handled at
once, a connection that sends nothing for `idle_timeout` seconds is closed, a request must be read
whole within `read_timeout` seconds of a worker taking it (however slowly its bytes come), and
past `max_connections` open connections the oldest idle one is dropped for the newcomer. A flood
of idle or slow sockets thus holds a bounded number of threads, each for a bounded time, and a
scrape still gets a worker.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CONTENT_TYPE_LATEST

from dsaops import fetch

INDEX = b"""<html><head><title>dsaops exporter</title></head>
<body><h1>dsaops exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>"""
WORKERS = 4
MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 5.0


class _Handler(WSGIRequestHandler):
    def setup(self):
        super().setup()
        self.rfile.close()
        # one deadline for the whole request: a client dripping it a byte at a time must not hold a worker
        self.rfile = fetch.reader(self.connection, time.monotonic() + self.server.read_timeout)

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
        self._since: dict[socket.socket, float] = {}    # idle connections, oldest first
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
            if len(self._since) + self._busy >= self.max_connections:
                if not self._since:
                    self.shutdown_request(request)      # every connection is being answered: refuse
                    return
                self._forget(next(iter(self._since)), close=True)
            self._since[request] = time.monotonic()
            self._idle.register(request, selectors.EVENT_READ, client_address)
        self._waker.send(b"\0")

    def _forget(self, conn: socket.socket, close: bool) -> None:
        self._idle.unregister(conn)
        del self._since[conn]
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
                    elif key.fileobj in self._since:
                        self._forget(key.fileobj, close=False)
                        self._busy += 1
                        self._pool.submit(self._answer, key.fileobj, key.data)
                for conn, since in list(self._since.items()):
                    if now - since > self.idle_timeout:
                        self._forget(conn, close=True)

    def _drain_wake(self) -> None:
        try:
            while self._wake.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _answer(self, conn: socket.socket, client_address) -> None:
        try:
            conn.settimeout(self.read_timeout)
            self.finish_request(conn, client_address)
        except OSError:      # the client went away or timed out mid-request
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
            for conn in list(self._since):
                self._forget(conn, close=True)
        self._waker.send(b"\0")       # the waiting thread sees _closed and ends
        self._waiter.join(timeout=2)
        self._idle.close()
        self._wake.close()
        self._waker.close()


def app(exporter):
    def wsgi(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
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


def serve(exporter, host: str, port: int, **limits) -> BoundedServer:
    """A started-but-not-serving server; call `serve_forever()` (or run it in a thread)."""
    server = BoundedServer((host, port), **limits)
    server.set_app(app(exporter))
    return server
