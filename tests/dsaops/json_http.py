"""The base of the tests' stand-in HTTP servers: quiet, answers JSON, and checks the API key as SGLang does."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class JsonHandler(BaseHTTPRequestHandler):
    api_key: str | None = None      # set on a subclass or instance: the key requests must carry

    def log_message(self, *args):  # quiet: the tests read the client's output, not the server's
        pass

    def send_json(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refused(self) -> bool:
        """As SGLang's auth middleware with --api-key (srt/utils/auth.py): 401 without `Bearer KEY`."""
        if self.api_key and self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.send_json(401, {"error": "Unauthorized"})
            return True
        return False
