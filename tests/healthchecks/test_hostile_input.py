"""One bad input costs only its own series: hostile /server_info answers against the real poller
loop and the real /metrics over HTTP, and a collector that raises."""
from __future__ import annotations

import resource
import socket
import threading
import time
import urllib.request

import pytest
from dsaops.healthchecks.exporter import Config

from benchmarks.sglang_standin import log_lines as L
from tests.healthchecks.prometheus_text import exposition
from tests.support.polling import wait_for
from tests.support.ports import free_port

HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


class HostileServer:
    """Answers every connection with `answer(conn)`: raw bytes, drips, floods."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer = lambda conn: None
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.recv(65536)
            self.answer(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def body(self, data: bytes, length: int | None = None):
        self.answer = lambda conn: conn.sendall(HEADERS + f"Content-Length: {len(data) if length is None else length}"
                                                          f"\r\n\r\n".encode() + data)

    def close(self):
        self._closed = True
        self.sock.close()


def flood(conn, total=200 << 20, chunked=False):
    conn.sendall(HEADERS + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked
                            else f"Content-Length: {total}\r\n\r\n".encode()))
    block = b"[" * (1 << 20)
    for _ in range(total >> 20):
        conn.sendall(f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block)


def drip(conn):
    conn.sendall(HEADERS + b"Content-Length: 100\r\n\r\n")
    for _ in range(100):
        conn.sendall(b" ")
        time.sleep(1)


def drip_head(conn):
    """The status line and headers a byte every 0.1 s: each read waits far less than the deadline."""
    for byte in HEADERS + b"X-Pad: " + b"a" * 200:
        conn.sendall(bytes([byte]))
        time.sleep(0.1)


@pytest.fixture
def hostile():
    server = HostileServer()
    yield server
    server.close()


@pytest.fixture
def exporter(hostile, exporter_on):
    return exporter_on(Config(server_url=hostile.url, node="h", interval=0.2, kmsg=None))


def metrics(exp) -> tuple[int, dict]:
    with urllib.request.urlopen(exp.url, timeout=10) as r:
        return r.status, exposition(r.read().decode())


def errors_of(exp) -> int:
    return exp.errors.counts()["server_info"]


GOOD = b'{"internal_states": [{"memory_usage": {"token_capacity": 1000}}], "max_total_num_tokens": 1000}'

CASES = {
    "short Content-Length body": lambda s: s.body(GOOD[:20], length=len(GOOD)),
    "not HTTP": lambda s: setattr(s, "answer", lambda conn: conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")),
    "200k-deep JSON": lambda s: s.body(b"[" * 200_000 + b"]" * 200_000),
    "200 MB body": lambda s: setattr(s, "answer", flood),
    "200 MB chunked body": lambda s: setattr(s, "answer", lambda conn: flood(conn, chunked=True)),
    "a byte a second": lambda s: setattr(s, "answer", drip),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_answer_is_counted_and_the_poller_lives_on(case, hostile, exporter):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    CASES[case](hostile)
    assert wait_for(lambda: errors_of(exporter) >= 2, 15), case  # polled again: the loop survived the first
    status, out = metrics(exporter)
    assert status == 200 and out['dsa_server_up{node="h"}'] == 0
    assert out['dsa_exporter_errors_total{node="h",source="server_info"}'] >= 2
    assert 'dsa_host_memory_total_bytes{node="h"}' in out  # other series still served
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) < 64 << 10  # KiB: the size cap
    hostile.body(GOOD)  # recovers
    assert wait_for(lambda: metrics(exporter)[1]['dsa_server_up{node="h"}'] == 1, 10), case


@pytest.mark.parametrize("answer", [drip, drip_head], ids=["body", "status line and headers"])
def test_each_poll_ends_by_its_deadline(hostile, answer):
    from dsaops.healthchecks.metrics import ErrorCounts
    from dsaops.healthchecks.server_info import ServerInfoPoller

    hostile.answer = answer
    poller = ServerInfoPoller(hostile.url, ErrorCounts(), timeout=1.0)
    start = time.monotonic()
    poller.poll()
    assert time.monotonic() - start < 1.5 and poller.up is False


@pytest.mark.parametrize("field,value,lost", [
    ("token_capacity", b"1e999", "dsa_kv_token_capacity"),
    ("kv_cache_dtype", b'["fp8_e4m3"]', None),
    ("token_capacity", b'"many"', "dsa_kv_token_capacity"),
])
def test_a_bad_field_costs_its_own_series_only(field, value, lost, hostile, exporter):
    usage = b'"token_capacity": ' + (value if field == "token_capacity" else b"1000")
    dtype = value if field == "kv_cache_dtype" else b'"fp8_e4m3"'
    hostile.body(b'{"kv_cache_dtype": ' + dtype + b', "max_running_requests": 4, "internal_states": [{"memory_usage": {'
                 + usage + b', "kvcache": 1.5}}]}')
    assert wait_for(lambda: metrics(exporter)[1]['dsa_server_up{node="h"}'] == 1, 10)
    before = errors_of(exporter)
    assert wait_for(lambda: errors_of(exporter) > before, 10)  # each answer's bad field is counted
    status, out = metrics(exporter)
    assert status == 200 and out['dsa_server_up{node="h"}'] == 1
    assert out['dsa_kv_cache_size_bytes{dp_rank="0",node="h"}'] == 1.5 * (1 << 30)
    if lost:
        assert not any(k.startswith(lost) for k in out)
    else:
        assert not any(k.startswith("dsa_kv_cache_info") and "fp8" in k for k in out)


def test_server_up_goes_to_zero_when_nothing_listens(fake_server, exporter_on):
    exp = exporter_on(Config(server_url=fake_server.url, node="h", interval=0.2, kmsg=None))
    assert wait_for(lambda: metrics(exp)[1]['dsa_server_up{node="h"}'] == 1, 10)
    fake_server.close()
    assert wait_for(lambda: metrics(exp)[1]['dsa_server_up{node="h"}'] == 0, 10)
    port = free_port()  # and an address where nothing ever listened
    exp2 = exporter_on(Config(server_url=f"http://127.0.0.1:{port}", node="h", interval=0.2, kmsg=None))
    assert wait_for(lambda: errors_of(exp2) >= 1, 10) and metrics(exp2)[1]['dsa_server_up{node="h"}'] == 0


def test_a_collector_that_raises_loses_its_own_series_only(exporter, monkeypatch):
    from dsaops.healthchecks import hostmem

    def broken(self):
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(hostmem.HostMemoryCollector, "collect", broken)
    status, out = metrics(exporter)
    assert status == 200 and 'dsa_server_up{node="h"}' in out
    assert not any(k.startswith("dsa_host_memory") for k in out)
    assert out['dsa_exporter_errors_total{node="h",source="hostmem"}'] == 1


def test_a_background_loop_that_raises_goes_on_and_says_so(exporter, monkeypatch, capsys):
    from dsaops.healthchecks import server_info

    calls = []

    def flaky(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("surprise")
        return original(self)

    original = server_info.ServerInfoPoller.poll
    monkeypatch.setattr(server_info.ServerInfoPoller, "poll", flaky)
    assert wait_for(lambda: len(calls) >= 3, 10)  # the loop went on after the surprise
    assert "server_info: the server_info loop met an error: RuntimeError: surprise" in capsys.readouterr().err
    assert exporter.poller._thread.is_alive()


def test_a_loop_whose_thread_ended_is_started_again_at_the_next_scrape(exporter):
    exporter.poller._stop.set()
    exporter.poller._thread.join(5)
    exporter.poller._stop.clear()
    assert not exporter.poller._thread.is_alive()
    metrics(exporter)
    assert exporter.poller._thread.is_alive()
    assert exporter.errors.counts()["server_info"] >= 1


def test_a_log_number_too_large_for_a_sample_costs_its_line_only(fake_server, exporter_on, tmp_path):
    """Such a line was kept, then failed every scrape of the log's and /server_info's collectors
    (float() overflows): the other ranks' pools and dsa_server_up were gone for good."""
    huge = "9" * 400
    log = tmp_path / "sglang.log"
    log.write_text(L.line(L.kv_allocated(5, 1.0), ("TP0",))
                   + L.line(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {huge}, KV size: 1.00 GB", ("TP1",))
                   + L.line(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: 7, KV size: {huge}.0 GB", ("TP2",))
                   + L.line(L.MAMBA_CAPPED.replace("%d", huge, 1) % (16, 2), ("TP0",)))
    exp = exporter_on(Config(server_url=fake_server.url, node="h", interval=0.2, kmsg=None, log_file=str(log)))
    assert exp.follower.caught_up.wait(5) and wait_for(lambda: metrics(exp)[1].get('dsa_server_up{node="h"}') == 1, 10)
    out = metrics(exp)[1]
    assert [k for k in out if k.startswith("dsa_kv_pool_tokens")] == ['dsa_kv_pool_tokens{node="h",rank="TP0"}']
    assert exp.errors.counts()["log"] == 3 and exp.errors.counts()["server_info"] == 0
