"""The project's one way to ask a server over HTTP (the exporter, verify, bench): a total deadline
and a size cap.

urllib's timeout bounds each socket operation, not the whole answer: a server that drips a
byte a second, or pushes 200 MB, held the poller for good or grew its memory without end.
Here the whole exchange (host name lookup, connect, TLS handshake, request, status line,
headers, body) must end by the deadline: every read waits only what is left of it (`reader`).
The body may not pass `max_bytes`; every failure is a `FetchError` (a bad URL, refused, timed
out, too big, cut short, not HTTP), so a caller catches one thing, and its cause says which.
Extra headers (an API key) go in `headers`.
"""
from __future__ import annotations

import concurrent.futures
import functools
import http.client
import io
import ipaddress
import socket
import threading
import time
import urllib.parse

READ = 1 << 16


class FetchError(Exception):
    """The server did not give a whole answer in time and within the size cap."""


def request(url: str, *, deadline_s: float, max_bytes: int, headers: dict[str, str] | None = None,
            data: bytes | None = None) -> tuple[int, bytes]:
    """(status, body) of GET `url`, or of POST `data` to it; raises FetchError."""
    end = time.monotonic() + deadline_s
    conn = None
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url} is not an http(s) URL with a host")
        kind = functools.partial(_HTTPSConnection, end=end) if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port)
        conn._create_connection = functools.partial(_connect, end)  # http.client's own seam for its connect
        conn.response_class = functools.partial(_Response, end=end)
        conn.connect()
        conn.sock.settimeout(_left(end))
        conn.request("GET" if data is None else "POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                     body=data, headers=headers or {})
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url}: answer of {length} bytes is over the {max_bytes}-byte cap")
        body = bytearray()
        while chunk := resp.read1(READ):  # read1: one read at a time, so the cap holds as it comes
            body += chunk
            if len(body) > max_bytes:
                raise FetchError(f"{url}: answer over the {max_bytes}-byte cap")
        return resp.status, bytes(body)
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:  # bad URL, refused, timed out, cut short, not HTTP
        raise FetchError(f"{url}: {type(e).__name__}: {e}") from e
    finally:
        if conn is not None:
            conn.close()


def reader(sock: socket.socket, end: float) -> io.BufferedReader:
    """A buffered reader of `sock` whose reads all end by `end` (time.monotonic()): a peer that
    drips one byte at a time cannot hold it longer."""
    return io.BufferedReader(_DeadlineIO(sock, end))


class _DeadlineIO(io.RawIOBase):
    def __init__(self, sock: socket.socket, end: float):
        # through makefile, as http.client reads: the socket stays open until this is closed too
        self._sock, self._raw, self._end = sock, sock.makefile("rb", buffering=0), end

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        left = self._end - time.monotonic()
        if left <= 0:
            raise TimeoutError("not done within the deadline")
        before = self._sock.gettimeout()
        self._sock.settimeout(left if before is None else min(left, before))
        try:
            return self._raw.readinto(buffer)
        finally:
            self._sock.settimeout(before)  # what the socket's writes wait is left as it was

    def close(self) -> None:
        self._raw.close()
        super().close()


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPSConnection.connect with the TLS handshake given only what the TCP connect left of the
    deadline: the socket's timeout bounds the whole handshake, but afresh from its start."""

    def __init__(self, *args, end: float, **kwargs):
        super().__init__(*args, **kwargs)
        self._end = end

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock.settimeout(_left(self._end))
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)


class _Response(http.client.HTTPResponse):
    """Reads its status line, headers and body through `reader`."""

    def __init__(self, sock, *args, end: float, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp.close()
        self.fp = reader(sock, end)


def _connect(end: float, address: tuple[str, int], *_) -> socket.socket:
    """socket.create_connection with the name lookup and each address's TCP connect given only what is
    left of the deadline (the timeout and source address http.client passes are not ours)."""
    host, port = address
    error: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, sockaddr in _lookup(host, port, end):
        left = _left(end)
        sock = None
        try:
            sock = socket.socket(family, kind, proto)  # EAFNOSUPPORT for ::1 where IPv6 is off
            sock.settimeout(left)
            sock.connect(sockaddr)
            return sock
        except OSError as e:  # no such socket here, refused or unreachable there: the next address may answer
            if sock is not None:
                sock.close()
            error = e
    raise error


def _lookup(host: str, port: int, end: float) -> list:
    """getaddrinfo as create_connection asks it, waited for only until `end`: it takes no timeout,
    and with a dead DNS server the system resolver blocks for seconds to tens of seconds. The
    thread is a daemon, left to finish alone. An IP address (urlsplit drops IPv6's brackets) is
    its own answer: no lookup, no thread."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        pass
    else:
        return [(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM, 0, "", (host, port))]
    found = concurrent.futures.Future()

    def ask():
        try:
            found.set_result(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except (OSError, ValueError) as e:  # gaierror, a name IDNA cannot encode: request's FetchError
            found.set_exception(e)

    left = _left(end)
    try:
        threading.Thread(target=ask, daemon=True).start()
    except RuntimeError as e:  # no thread to be had (a pids limit): a failed request, not a crash of the caller
        raise OSError(f"host name lookup not started: {e}") from None
    try:
        return found.result(timeout=left)
    except concurrent.futures.TimeoutError:
        raise TimeoutError("host name lookup not done within the deadline") from None


def _left(end: float) -> float:
    """The seconds left until `end` (for the lookup, each connect, the TLS handshake, sending the
    request); TimeoutError when none are."""
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError("no answer within the deadline")
    return left
