"""`dsaops healthcheck`: non-zero within 5 s when /health fails or hangs, or a rank is missing."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.support.polling import wait_for
from tests.support.ports import free_port

TITLES = [f"sglang::scheduler_TP{i}" for i in range(2)]


def healthcheck(*args):
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dsaops", "healthcheck", *args], capture_output=True, text=True,
                       timeout=30, check=False)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - start


def test_healthy(fake_server, launcher):
    launcher(TITLES)
    code, out, _ = healthcheck("--server-url", fake_server.url, "--expect-ranks", "2")
    assert code == 0, out


def test_health_hanging_like_sglang_fails_within_5s(fake_server):
    fake_server.health_delay = 20  # SGLang's /health waits up to 20 s before its 503
    code, out, took = healthcheck("--server-url", fake_server.url)
    assert code == 1 and took < 5, (out, took)


def test_health_503_fails(fake_server):
    fake_server.health_status = 503
    code, out, _ = healthcheck("--server-url", fake_server.url)
    assert code == 1 and "503" in out


def test_server_down_fails():
    code, out, took = healthcheck("--server-url", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and took < 5, out


def test_missing_rank_fails_even_when_health_says_200(fake_server, launcher):
    """A worker node's dummy /health answers 200 whatever the ranks do."""
    launcher(TITLES)
    code, out, _ = healthcheck("--server-url", fake_server.url, "--expect-ranks", "3")
    assert code == 1 and "2 of 3 scheduler ranks" in out, out


def test_a_stopped_rank_fails_and_passes_again_once_it_runs(fake_server, launcher):
    """A rank stopped (SIGSTOP) hangs the server while its process stays: not alive to the check."""
    lch = launcher(TITLES)
    os.kill(lch.pids[1], signal.SIGSTOP)
    code, out, _ = healthcheck("--server-url", fake_server.url, "--expect-ranks", "2")
    assert code == 1 and "1 of 2 scheduler ranks alive on this node (TP0)" in out, out
    os.kill(lch.pids[1], signal.SIGCONT)
    code, out, _ = healthcheck("--server-url", fake_server.url, "--expect-ranks", "2")
    assert code == 0, out


def test_a_zombie_rank_fails(fake_server, launcher):
    """A worker node's launcher joins its ranks in order: one dead after the first stays a zombie."""
    lch = launcher(TITLES, "--join-in-order")
    os.kill(lch.pids[1], signal.SIGKILL)
    assert wait_for(lambda: psutil.Process(lch.pids[1]).status() == psutil.STATUS_ZOMBIE, 5)
    code, out, _ = healthcheck("--server-url", fake_server.url, "--expect-ranks", "2")
    assert code == 1 and "1 of 2 scheduler ranks alive on this node (TP0)" in out, out


def test_bad_input_is_a_clear_error():
    code, out, _ = healthcheck("--server-url", "http://127.0.0.1:1", "--expect-ranks", "0")
    assert code == 2 and "--expect-ranks must be at least 1" in out
    code, out, _ = healthcheck("--server-url", "http://127.0.0.1:1", "--container", "")
    assert code == 2 and "--container: give the name" in out and out.count("\n") == 1, out


def test_a_malformed_server_url_is_a_clear_error_not_a_traceback():
    for url in ("HEAD", "", "http://127.0.0.1:abc", "http://[::1", "http://a..b:1", "http://127.0.0.1:1/a b"):
        code, out, _ = healthcheck("--server-url", url)
        assert code == 2 and out.startswith("dsaops healthcheck: --server-url") and out.count("\n") == 1, out


def test_a_timeout_past_the_healthcheck_deadline_is_refused():
    for value in ("nan", "inf", "5", "0"):
        code, out, _ = healthcheck("--server-url", "http://127.0.0.1:1", "--timeout", value)
        assert code == 2 and "argument --timeout: must be a positive number of seconds up to 4," in out, (value, out)


@pytest.fixture
def raw_server():
    """A socket server that reads a request and answers each connection with `answer(conn)`."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = type("Raw", (), {"url": f"http://127.0.0.1:{sock.getsockname()[1]}", "answer": None})()

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    server.answer(conn)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    yield server
    sock.close()


def drip(conn):
    for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 200:
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


@pytest.mark.parametrize("answer", [lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n"), drip],
                         ids=["not HTTP", "headers a byte every 0.1 s"])
def test_a_server_that_does_not_answer_http_in_time_is_unhealthy(raw_server, answer):
    raw_server.answer = answer
    code, out, took = healthcheck("--server-url", raw_server.url)
    assert code == 1 and out.startswith(f"unhealthy: {raw_server.url}/health: ") and "Traceback" not in out, out
    assert took < 5, took
