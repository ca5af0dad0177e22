"""`dsaops exporter` as a user runs it, and its refusals of bad input."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.healthchecks.prometheus_text import scrape
from tests.support.polling import wait_for
from tests.support.ports import free_port


def dsaops(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "dsaops", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_exporter_serves_with_node_and_plan(tmp_path, fake_server):
    """The server wants its API key for /server_info (as SGLang with --api-key): the exporter reads it from a file."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"kv_pool_tokens_per_rank": 4922240, "kv_layout": "raw_fp8", "binding_limit": "dp_split"}))
    fake_server.api_key = "the-clusters-api-key-0123456789"
    key = tmp_path / "api-key"
    key.write_text(fake_server.api_key + "\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--server-url", fake_server.url,
                             "--listen", f"127.0.0.1:{port}", "--node", "gb10-a", "--plan", str(plan),
                             "--api-key-file", str(key), "--interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "serving" in proc.stdout.readline()

        def up():
            try:
                return scrape(f"http://127.0.0.1:{port}/metrics").get('dsa_server_up{node="gb10-a"}') == 1
            except OSError:
                return False

        assert wait_for(up, 10)
        out = scrape(f"http://127.0.0.1:{port}/metrics")
        assert out['dsa_kv_pool_planned_tokens{node="gb10-a"}'] == 4922240
        assert out['dsa_concurrency_planned_binding{by="dp_split",node="gb10-a"}'] == 1
        assert out['dsa_concurrency_planned_binding{by="none",node="gb10-a"}'] == 0
        assert all('node="gb10-a"' in key for key in out)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bad_listen_plan_and_busy_port_are_clear_errors(tmp_path):
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", "9860x")
    assert r.returncode == 2 and "give HOST:PORT" in r.stderr
    r = dsaops("exporter", "--server-url", "127.0.0.1:30000")
    assert r.returncode == 2 and "http://" in r.stderr
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--api-key-file", str(tmp_path / "no-key"))
    assert r.returncode == 2 and r.stderr.startswith("dsaops exporter: --api-key-file") and r.stderr.count("\n") == 1
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--plan", str(bad))
    assert r.returncode == 2 and "kv_pool_tokens_per_rank" in r.stderr
    bad.write_text(json.dumps({"kv_pool_tokens_per_rank": 4922240, "binding_limit": "dp-split"}))
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--plan", str(bad))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"dsaops exporter: --plan {bad}: binding_limit must be one of request, dp_split")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{busy.getsockname()[1]}")
    assert r.returncode == 2 and "choose another address or port" in r.stderr


def test_a_server_url_urllib_cannot_read_is_refused_before_the_exporter_starts():
    for url in ("http://127.0.0.1:abc", "http://[::1"):
        r = dsaops("exporter", "--server-url", url, "--listen", f"127.0.0.1:{free_port()}", timeout=10)
        assert r.returncode == 2 and r.stderr.startswith("dsaops exporter: --server-url"), (url, r.stderr)


def test_an_interval_that_is_not_a_finite_number_of_seconds_is_refused():
    """nan or 1e-9 made the /server_info loop poll without pause; inf or 1e12 overflowed its wait at every scrape."""
    interval = "a number of seconds from 0.1 to 50"
    for option, value, says in (("--interval", "nan", interval), ("--interval", "inf", interval),
                                ("--interval", "1e12", interval), ("--interval", "0", interval),
                                ("--interval", "1e-9", interval), ("--interval", "0.09", interval),
                                ("--stop-window", "inf", "a positive number of seconds up to 600")):
        r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}",
                   option, value, timeout=10)
        assert r.returncode == 2 and f"argument {option}: must be {says}, got {value}\n" in r.stderr, (value, r.stderr)


def test_the_docker_proxy_replaces_a_stale_socket_but_never_a_file(tmp_path):
    engine = tmp_path / "docker.sock"
    engine.touch()
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    r = dsaops("docker-proxy", "--allow", "c1", "--docker-socket", str(engine), "--listen", str(notes), timeout=10)
    assert r.returncode == 2 and "is not a socket" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert notes.read_text() == "notes\n"
    stale = tmp_path / "proxy.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))      # left behind when closed, as by a proxy that died
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "docker-proxy", "--allow", "c1", "--docker-socket",
                             str(engine), "--listen", str(stale)], stdout=subprocess.PIPE, text=True)
    try:
        assert "reading c1" in proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_docker_proxy_socket_path_too_long_is_said_so(tmp_path):
    engine = tmp_path / "docker.sock"
    engine.touch()
    r = dsaops("docker-proxy", "--allow", "c1", "--docker-socket", str(engine), "--listen",
               str(tmp_path / ("x" * 120 + ".sock")), timeout=10)
    assert r.returncode == 2 and "path too long" in r.stderr and "at most 107 bytes" in r.stderr, r.stderr


def test_a_log_writer_error_names_the_command_once(tmp_path):
    r = dsaops("log-writer", "--keep", "0", str(tmp_path / "server.log"), timeout=10)
    assert r.returncode == 2 and r.stderr.startswith("dsaops log-writer: the size limit"), r.stderr


def one_line_error(r, starts: str) -> bool:
    return r.returncode == 2 and r.stderr.startswith(starts) and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_numbers_are_ascii_digits_of_a_bounded_length():
    """str.isdigit took '²', and int() raised on it or on a number of 5000 digits."""
    for value in ("²", "9" * 5000):
        r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{value}", timeout=10)
        assert one_line_error(r, "dsaops exporter: --listen"), (value, r.stderr[-300:])
    for flag, value in (("--max-bytes", "²"), ("--max-bytes", "9" * 5000), ("--keep", "²"), ("--keep", "1" * 5000)):
        r = dsaops("log-writer", flag, value, "/nonexistent/server.log", timeout=10)
        assert one_line_error(r, "dsaops log-writer: the size limit"), (flag, value, r.stderr[-300:])


def test_a_state_file_that_is_a_folder_is_refused(tmp_path):
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}",
               "--state-file", str(tmp_path), "--kmsg", "none", timeout=10)
    assert one_line_error(r, f"dsaops exporter: --state-file {tmp_path} is a folder"), r.stderr


def test_a_docker_url_the_sdk_cannot_parse_is_refused():
    for url in ("tcp://host:port", "foo://x", "tcp://127.0.0.1:99999"):
        r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}",
                   "--container", "sglang", "--docker-url", url, "--kmsg", "none", timeout=10)
        assert one_line_error(r, f"dsaops exporter: --docker-url {url}: "), r.stderr
        r = dsaops("healthcheck", "--server-url", "http://127.0.0.1:1", "--container", "sglang", "--docker-url", url)
        assert one_line_error(r, f"dsaops healthcheck: --docker-url {url}: "), r.stderr


def test_a_plan_nested_too_deep_is_refused(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("[" * 100_000 + "]" * 100_000)
    r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--plan", str(plan), timeout=10)
    assert one_line_error(r, f"dsaops exporter: --plan {plan} is not JSON (it nests deeper than the parser follows): "), r.stderr


def test_a_missing_package_of_the_exporter_extra_names_the_install():
    """`python -m dsaops` with one package of the extra made unimportable, as where it is not installed."""
    for missing, args in (("prometheus_client", ["exporter", "--server-url", "http://127.0.0.1:1"]),
                          ("psutil", ["exporter", "--server-url", "http://127.0.0.1:1"]),
                          ("psutil", ["healthcheck", "--server-url", "http://127.0.0.1:1", "--expect-ranks", "1"]),
                          ("docker", ["healthcheck", "--server-url", "http://127.0.0.1:1", "--container", "sglang"])):
        code = (f"import runpy, sys; sys.modules[{missing!r}] = None; sys.argv = ['dsaops', *{args!r}]; "
                "runpy.run_module('dsaops', run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
        assert one_line_error(r, f"dsaops {args[0]}: the Python package {missing} is not installed"), (missing, r.stderr)
        assert "pip install -e '.[exporter]'" in r.stderr


def status_of(url: str, token: str | None = None) -> tuple[int, str | None]:
    """The HTTP status of a GET of `url` (with `Authorization: Bearer token`), and its WWW-Authenticate header."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.headers.get("WWW-Authenticate")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("WWW-Authenticate")


def started(*args) -> subprocess.Popen:
    """`dsaops exporter ARGS` once it says it serves."""
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--kmsg", "none", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "serving" in line, line + proc.stdout.read()
    return proc


def test_with_a_token_every_route_wants_it(tmp_path, fake_server):
    """Without the token, a wrong one or another scheme: 401 and `WWW-Authenticate: Bearer`, on every path."""
    token = tmp_path / "token"
    token.write_text("the-scrape-token-0123456789\n")
    port = free_port()
    proc = started("--server-url", fake_server.url, "--listen", f"0.0.0.0:{port}", "--token-file", str(token))
    try:
        for path in ("/metrics", "/", "/nowhere"):
            url = f"http://127.0.0.1:{port}{path}"
            assert status_of(url) == (401, "Bearer"), path
            assert status_of(url, "the-scrape-token-012345678") == (401, "Bearer"), path
            assert status_of(url, "the-scrape-token-0123456789x") == (401, "Bearer"), path
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Authorization": "Basic the-scrape-token-0123456789"})
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(request, timeout=5)
        assert status_of(f"http://127.0.0.1:{port}/metrics", "the-scrape-token-0123456789") == (200, None)
        assert status_of(f"http://127.0.0.1:{port}/", "the-scrape-token-0123456789") == (200, None)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_address_without_a_token_is_refused_unless_allowed(tmp_path, fake_server):
    """0.0.0.0 served /metrics to anyone the firewall let through: now one line, exit 2, nothing listening."""
    port = free_port()
    for listen in (f"0.0.0.0:{port}", f":{port}", f"myhost:{port}"):
        r = dsaops("exporter", "--server-url", fake_server.url, "--listen", listen, "--kmsg", "none", timeout=10)
        assert one_line_error(r, f"dsaops exporter: --listen '{listen}' is reachable from other machines: add "
                                 "--token-file FILE"), r.stderr
        assert "--allow-no-token" in r.stderr
    with socket.socket() as free:
        free.bind(("0.0.0.0", port))    # nothing was left listening
    proc = started("--server-url", fake_server.url, "--listen", f"0.0.0.0:{port}", "--allow-no-token")
    try:
        assert status_of(f"http://127.0.0.1:{port}/metrics") == (200, None)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_token_file_without_a_token_is_refused(tmp_path):
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two").write_text("one two\n")
    for name, says in (("empty", "is empty: write the bearer token Prometheus sends in it"),
                       ("two", ": holds more than the key"), ("missing", ": No such file or directory; give a file")):
        r = dsaops("exporter", "--server-url", "http://127.0.0.1:1", "--listen", f"0.0.0.0:{free_port()}",
                   "--token-file", str(tmp_path / name), "--kmsg", "none", timeout=10)
        assert one_line_error(r, f"dsaops exporter: --token-file {tmp_path / name}"), r.stderr
        assert says in r.stderr, r.stderr
