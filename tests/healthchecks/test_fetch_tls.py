"""fetch.request: a real TLS server with a certificate made here, verified as by default, for the
URL's host name; a handshake that may not outlast what the TCP connect left of the deadline; a host
name looked up within the deadline, and its addresses tried in turn; an IP address not looked up."""
from __future__ import annotations

import datetime
import http.server
import ipaddress
import socket
import ssl
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dsaops import fetch


def certificate(folder, name: x509.GeneralName):
    """A self-signed certificate for `name` and its key, as PEM files in `folder`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dsaops test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([name]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hosts.append(self.headers["Host"])
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


class _IPv6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.fixture
def serve():
    """start() serves _Ok on 127.0.0.1 (on ::1 for the host [::1]), over TLS with a certificate; `.url`
    names `host`, `.hosts` and `.names` list each request's Host header and TLS server name."""
    started = []

    def start(cert=None, key=None, host="127.0.0.1") -> http.server.ThreadingHTTPServer:
        if host == "[::1]":
            try:
                server = _IPv6Server(("::1", 0), _Ok)
            except OSError as e:  # a host booted with ipv6.disable=1, or no ::1 on its loopback
                pytest.skip(f"no IPv6 loopback here: {e}")
        else:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
        server.hosts, server.names = [], []
        if cert:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            context.sni_callback = lambda sock, name, _: server.names.append(name)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        started.append(server)
        server.url = f"{'https' if cert else 'http'}://{host}:{server.server_address[1]}/"
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


LOOPBACK = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))


def test_https_answers_when_the_certificate_is_trusted(serve, tmp_path, monkeypatch):
    cert, key = certificate(tmp_path, LOOPBACK)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default context's trust store
    assert fetch.request(serve(cert, key).url, deadline_s=3, max_bytes=100) == (200, b"ok")


def test_https_to_a_host_name_checks_and_sends_that_name(serve, tmp_path, monkeypatch):
    cert, key = certificate(tmp_path, x509.DNSName("localhost"))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = serve(cert, key, host="localhost")
    assert fetch.request(server.url, deadline_s=3, max_bytes=100) == (200, b"ok")
    assert server.names == ["localhost"]
    assert server.hosts == [f"localhost:{server.server_address[1]}"]


@pytest.mark.parametrize("name,host,trusted,error", [
    (LOOPBACK, "127.0.0.1", False, "CERTIFICATE_VERIFY_FAILED"),
    (x509.DNSName("elsewhere.example"), "127.0.0.1", True, "IP address mismatch"),  # not the URL's host
    (LOOPBACK, "localhost", True, "Hostname mismatch"),  # the address connected to is not the name checked
])
def test_https_verifies_the_certificate_and_its_name(name, host, trusted, error, serve, tmp_path, monkeypatch):
    cert, key = certificate(tmp_path, name)
    if trusted:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with pytest.raises(fetch.FetchError, match=error):
        fetch.request(serve(cert, key, host).url, deadline_s=3, max_bytes=100)


def test_a_host_name_is_looked_up_and_sent(serve):
    server = serve(host="localhost")
    assert fetch.request(server.url, deadline_s=3, max_bytes=100) == (200, b"ok")
    assert server.hosts == [f"localhost:{server.server_address[1]}"]


@pytest.mark.parametrize("host,tls", [("127.0.0.1", False), ("127.0.0.1", True), ("[::1]", False)])
def test_an_ip_address_is_connected_to_without_a_lookup(host, tls, serve, tmp_path, monkeypatch):
    """An IP address needs no name lookup, nor the thread that bounds it: with getaddrinfo refusing
    (the test's stand-in), the request answers only if it was never asked. Host and TLS checks hold."""
    cert, key = certificate(tmp_path, LOOPBACK) if tls else (None, None)
    if tls:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = serve(cert, key, host=host)

    def refused(*args, **kwargs):
        raise socket.gaierror(socket.EAI_AGAIN, "getaddrinfo asked for an IP address")

    monkeypatch.setattr(socket, "getaddrinfo", refused)
    assert fetch.request(server.url, deadline_s=3, max_bytes=100) == (200, b"ok")
    assert server.hosts == [f"{host}:{server.server_address[1]}"]


def test_the_host_name_lookup_waits_only_the_deadline(serve, monkeypatch):
    """A dead DNS server makes getaddrinfo block for the resolver's timeouts; a real resolver cannot
    be made to stall here, so this stand-in for getaddrinfo (the test's one) sleeps 3 s first."""
    deadline, lookup, release = 0.5, socket.getaddrinfo, threading.Event()

    def stalled(*args, **kwargs):
        release.wait(3)
        return lookup(*args, **kwargs)

    url = serve(host="localhost").url
    monkeypatch.setattr(socket, "getaddrinfo", stalled)
    start = time.monotonic()
    try:
        got = fetch.request(url, deadline_s=deadline, max_bytes=100)
    except fetch.FetchError as e:
        got = e
    finally:
        release.set()
    took = time.monotonic() - start
    assert took < deadline + 0.3, (took, got)
    assert str(got) == f"{url}: TimeoutError: host name lookup not done within the deadline"


def test_a_lookup_thread_that_cannot_start_is_a_failed_request(serve, monkeypatch):
    """Under a pids limit a thread cannot start (RuntimeError); the health check and verify catch
    FetchError, so it must fail as a request, not as a traceback. The refusal is a stand-in."""
    def refused(self):
        raise RuntimeError("can't start new thread")

    url = serve(host="localhost").url
    monkeypatch.setattr(threading.Thread, "start", refused)
    with pytest.raises(fetch.FetchError) as failed:
        fetch.request(url, deadline_s=1, max_bytes=100)
    assert str(failed.value) == f"{url}: OSError: host name lookup not started: can't start new thread"


def test_an_address_whose_socket_cannot_be_made_gives_way_to_the_next(serve, monkeypatch):
    """On a host booted with ipv6.disable=1, localhost's ::1 still comes first from getaddrinfo and
    its socket fails with EAFNOSUPPORT: the next address answers, as socket.create_connection does.
    The test's stand-in for getaddrinfo puts an address family the kernel refuses (255) first."""
    server, lookup = serve(host="localhost"), socket.getaddrinfo

    def unmakable_first(host, port, *args, **kwargs):
        return [(255, socket.SOCK_STREAM, 0, "", ("::1", port)), *lookup(host, port, *args, **kwargs)]

    monkeypatch.setattr(socket, "getaddrinfo", unmakable_first)
    assert fetch.request(server.url, deadline_s=3, max_bytes=100) == (200, b"ok")


def test_the_tls_handshake_waits_only_what_the_connect_left():
    """A full accept queue drops the SYN: the TCP connect takes the kernel's 1 s retransmit. The
    server then starts a TLS record and stalls; the whole get still ends by its deadline."""
    deadline = 1.5
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # fills the queue of one
    accepted, done = [], threading.Event()

    def serve():
        time.sleep(0.5)
        first, _ = listener.accept()  # room again: the client's retransmitted SYN gets in
        conn, _ = listener.accept()
        accepted.append(time.monotonic() - start)
        conn.recv(65536)
        conn.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16 KiB, never sent
        done.wait(10)
        for s in (first, conn):
            s.close()

    thread = threading.Thread(target=serve, daemon=True)
    start = time.monotonic()
    thread.start()
    try:
        with pytest.raises(fetch.FetchError):
            fetch.request(f"https://127.0.0.1:{port}/", deadline_s=deadline, max_bytes=100)
        took = time.monotonic() - start
    finally:
        done.set()
        thread.join()
        filler.close()
        listener.close()
    assert accepted and accepted[0] > 0.8, "the connect was not slowed: the test proves nothing"
    assert took < deadline + 0.3, took
