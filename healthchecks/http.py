"""The exporter's HTTP side: /metrics (a fresh registry per scrape) and a small index page."""
from __future__ import annotations

import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST

INDEX = b"""<html><head><title>dsaops exporter</title></head>
<body><h1>dsaops exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>"""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):  # one line per scrape is noise in the server's log
        pass


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


def serve(exporter, host: str, port: int):
    """A started-but-not-serving server; call `serve_forever()` (or run it in a thread)."""
    return make_server(host, port, app(exporter), server_class=_Server, handler_class=_QuietHandler)
