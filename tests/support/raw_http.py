"""A listener that answers every request with the same raw bytes: a server that says what a test
needs, a broken status line or a hostile body included."""
import socket
import threading


def http_response(status: str, body: bytes) -> bytes:
    return f"HTTP/1.0 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def answering(response: bytes) -> str:
    """The base URL of a daemon listener on 127.0.0.1 that sends `response` to each request, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer():
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(response)
    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"
