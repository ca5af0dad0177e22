"""The exporter's one way to read the server over HTTP: a total deadline and a size cap.

urllib's timeout bounds each socket operation, not the whole answer: a server that drips a
byte a second, or pushes 200 MB, held the poller for good or grew its memory without end.
Here the whole exchange (connect, headers, body) must end by the deadline and the body may
not pass `max_bytes`; every failure is a `FetchError` (refused, timed out, too big, cut
short, not HTTP), so a caller catches one thing. Extra headers (an API key) go in `headers`.
"""
from __future__ import annotations

import http.client
import time
import urllib.parse

READ = 1 << 16


class FetchError(Exception):
    """The server did not give a whole answer in time and within the size cap."""


def get(url: str, *, deadline_s: float, max_bytes: int, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of GET `url`; raises FetchError."""
    parts = urllib.parse.urlsplit(url)
    end = time.monotonic() + deadline_s
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname or "127.0.0.1", parts.port, timeout=deadline_s)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        _left(end, conn)
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise FetchError(f"{url}: answer of {length} bytes is over the {max_bytes}-byte cap")
        body = bytearray()
        while chunk := resp.read1(READ) if _left(end, conn) else b"":  # read1: one recv, so the deadline holds
            body += chunk
            if len(body) > max_bytes:
                raise FetchError(f"{url}: answer over the {max_bytes}-byte cap")
        return resp.status, bytes(body)
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as e:  # refused, timed out, cut short, not HTTP
        raise FetchError(f"{url}: {type(e).__name__}: {e}") from e
    finally:
        conn.close()


def _left(end: float, conn) -> bool:
    """Give the socket what is left of the deadline; FetchError when nothing is."""
    left = end - time.monotonic()
    if left <= 0:
        raise FetchError("no answer within the deadline")
    if conn.sock is not None:
        conn.sock.settimeout(left)
    return True
