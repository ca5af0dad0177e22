"""The exporter's HTTP server under a flood: a real `dsaops exporter` process, hundreds of idle sockets
and a few that start a request and stall. Its threads stay bounded, a scrape still answers, and the
stalled and idle connections are closed by their timeouts. Control: the plain threading server the
exporter had before holds one thread per idle socket."""
from __future__ import annotations

import os
import resource
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.request
from wsgiref.simple_server import WSGIServer, make_server

import pytest
from dsaops.healthchecks.http import MAX_REQUEST, WORKERS, app, serve

from tests.support.polling import wait_for
from tests.support.ports import free_port

IDLE = 300


class _Exporter:
    def scrape(self) -> bytes:
        return b"dsa_test_up 1\n"


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def scrape(port: int, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read()


def connect_many(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


@pytest.fixture(autouse=True)
def enough_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_sockets_cost_no_thread_and_a_scrape_still_answers(fake_server):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--server-url", fake_server.url,
                             "--listen", f"127.0.0.1:{port}", "--kmsg", "none", "--interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    socks = []
    try:
        assert "serving" in proc.stdout.readline()
        assert wait_for(lambda: b"dsa_server_up" in scrape(port), 10)
        before = threads_of(proc.pid)
        socks = connect_many(port, IDLE)
        time.sleep(1)
        start = time.monotonic()
        assert b"dsa_server_up" in scrape(port)
        assert time.monotonic() - start < 3
        assert threads_of(proc.pid) <= before + WORKERS, (before, threads_of(proc.pid))
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_stalled_requests_time_out_and_the_oldest_idle_connection_makes_room():
    server = serve(_Exporter(), "127.0.0.1", 0, workers=2, max_connections=8, idle_timeout=1.0, read_timeout=0.5)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stalled = connect_many(port, 2)
        for s in stalled:
            s.sendall(b"GET /met")                 # a request started, never finished: holds a worker
        idle = connect_many(port, 8)               # more than the server keeps: the oldest go
        assert scrape(port) == b"dsa_test_up 1\n"  # the stalled ones time out (0.5 s), the scrape gets a worker
        for s in stalled:
            s.settimeout(3)
            assert s.recv(100) == b""              # closed by the read timeout
        for s in idle:
            s.settimeout(3)
            assert s.recv(100) == b""              # evicted, or closed after 1 s idle
    finally:
        server.shutdown()
        server.server_close()


def test_requests_dripped_a_byte_at_a_time_hold_no_worker_past_the_read_timeout():
    """Each byte comes well within the read timeout: only a deadline for the whole request frees the workers."""
    server = serve(_Exporter(), "127.0.0.1", 0, workers=2, read_timeout=1.0)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def drip(s):
        try:
            for byte in b"GET /metrics?" + b"x" * 1000:
                s.sendall(bytes([byte]))
                if stop.wait(0.1):
                    return
        except OSError:   # closed by the server
            pass

    dripping = connect_many(port, 4)
    threads = [threading.Thread(target=drip, args=(s,), daemon=True) for s in dripping]
    try:
        for t in threads:
            t.start()
        time.sleep(0.3)                            # both workers hold a dripping request
        start = time.monotonic()
        assert scrape(port, timeout=10) == b"dsa_test_up 1\n"
        assert time.monotonic() - start < 4        # two rounds of 1 s deadlines at most, not the drip's 100 s
    finally:
        stop.set()
        for s in dripping:
            s.close()
        server.shutdown()
        server.server_close()


def test_requests_started_on_every_connection_hold_no_worker_and_a_scrape_still_answers():
    """As many connections as the server keeps, each a request's first byte and no more: none may
    take a worker (or the scrape waits out their read timeouts), and the scrape makes room."""
    server = serve(_Exporter(), "127.0.0.1", 0, workers=2, max_connections=8, read_timeout=5.0)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = connect_many(port, 8)
    try:
        for s in started:
            s.sendall(b"G")
        time.sleep(0.3)
        assert scrape(port, timeout=3) == b"dsa_test_up 1\n"   # not refused, not after 5 s
        oversized = socket.create_connection(("127.0.0.1", port), timeout=3)
        started.append(oversized)
        try:
            oversized.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"x" * MAX_REQUEST + b"\r\n\r\n")
            answer = oversized.recv(100)
        except ConnectionResetError:
            answer = b""
        assert answer == b""                       # closed: the waiting thread holds no more than MAX_REQUEST
    finally:
        for s in started:
            s.close()
        server.shutdown()
        server.server_close()


def test_the_unbounded_server_held_a_thread_per_idle_socket():
    """Control: the exporter's former server (ThreadingMixIn) with the same flood."""
    class Threading(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    server = make_server("127.0.0.1", 0, app(_Exporter()), server_class=Threading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    socks = connect_many(server.server_address[1], 20)

    def handler_threads():
        return sum(1 for t in threading.enumerate() if getattr(t, "_target", None) == server.process_request_thread)
    try:
        assert wait_for(lambda: handler_threads() == 20, 5)
    finally:
        for s in socks:
            s.close()
        server.shutdown()
        server.server_close()
