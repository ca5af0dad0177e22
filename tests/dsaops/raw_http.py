"""A listener that answers every request with the same raw bytes: a server that says what a test
needs, a broken status line or a hostile body included."""
import socket
import threading
from collections.abc import Callable


def http_response(status: str, body: bytes) -> bytes:
    return f"HTTP/1.0 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def answering(response: bytes | Callable[[socket.socket], None]) -> str:
    """The base URL of a daemon listener on 127.0.0.1 that sends `response` to each request, then closes;
    a callable `response(conn)` sends the answer itself (a drip, a flood)."""
    listener = socket.create_server(("127.0.0.1", 0))
    send = response if callable(response) else lambda conn: conn.sendall(response)

    def answer():
        while True:
            conn, _ = listener.accept()
            with conn:
                try:
                    conn.recv(65536)
                    send(conn)
                except OSError:  # the client stopped reading and hung up: what a flood or a drip is for
                    pass
    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"
