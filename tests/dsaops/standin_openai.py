"""A stand-in OpenAI-compatible server: a real HTTP process on loopback with streaming SSE.

It runs at most `--max-running` requests at once (later ones wait, as in a scheduler's queue),
emits one token every `--token-latency` seconds per request, and so its output throughput
grows with concurrency up to `--max-running` and stays flat beyond: the knee is known.
`--answers FILE` ({needle: reply}) answers a prompt holding a needle with that reply (the
eval's stand-in); `--server-info FILE` serves /server_info; `--api-key-file` demands the key;
`--stall` accepts requests and never answers; `--fail-after N` answers N completions, then
drops every later one unanswered (a server that fell over).

    python -m tests.dsaops.standin_openai --port P --max-running 4 --token-latency 0.01   # from the repository root
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.dsaops.json_http import JsonHandler


class Handler(JsonHandler):
    protocol_version = "HTTP/1.1"
    cfg: argparse.Namespace
    slots: threading.BoundedSemaphore
    answers: dict
    server_info: dict | None
    served = 0
    served_lock = threading.Lock()

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {})
        elif self.path == "/v1/models" and not self.refused():
            self.send_json(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
        elif self.path == "/server_info" and self.server_info is not None:
            self.send_json(200, self.server_info)
        elif self.path != "/v1/models":
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.cfg.stall:
            time.sleep(3600)
            return
        if self.refused():
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self.send_json(404, {"detail": "Not Found"})
            return
        if self.fallen_over():
            self.close_connection = True
            return
        chat = self.path.endswith("chat/completions")
        prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt"))
        tokens = self._tokens(prompt, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
        with self.slots:
            if body.get("stream"):
                self._stream(tokens, chat, bool((body.get("stream_options") or {}).get("include_usage")))
            else:
                time.sleep(self.cfg.token_latency * len(tokens))
                self.send_json(200, _completion(tokens, chat, final=True))

    def fallen_over(self) -> bool:
        with Handler.served_lock:
            Handler.served += 1
            return self.cfg.fail_after is not None and Handler.served > self.cfg.fail_after

    def _tokens(self, prompt: str, max_tokens: int) -> list[str]:
        for needle, reply in self.answers.items():
            if needle in prompt:
                return reply.splitlines(keepends=True) or [""]
        return ["tok "] * max_tokens

    def _stream(self, tokens: list[str], chat: bool, usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for tok in tokens:
            time.sleep(self.cfg.token_latency)
            self._chunk(_completion([tok], chat, final=False))
        self._chunk(_completion([], chat, final=True, usage=len(tokens) if usage else None))
        self._send(b"data: [DONE]\n\n")
        self._send(b"")

    def _chunk(self, body: dict) -> None:
        self._send(b"data: " + json.dumps(body).encode() + b"\n\n")

    def _send(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _completion(tokens: list[str], chat: bool, final: bool, usage: int | None = None) -> dict:
    text = "".join(tokens)
    if chat:
        choice = {"index": 0, "message" if final and tokens else "delta": {"role": "assistant", "content": text}}
    else:
        choice = {"index": 0, "text": text}
    choice["finish_reason"] = "length" if final else None
    out = {"id": "cmpl-standin", "object": "chat.completion" if chat else "text_completion",
           "created": int(time.time()), "model": "standin", "choices": [choice]}
    if final and (usage is not None or tokens):
        n = usage if usage is not None else len(tokens)
        out["usage"] = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-running", type=int, default=4)
    p.add_argument("--token-latency", type=float, default=0.01)
    p.add_argument("--answers")
    p.add_argument("--server-info")
    p.add_argument("--api-key-file")
    p.add_argument("--stall", action="store_true")
    p.add_argument("--fail-after", type=int)
    cfg = p.parse_args()
    Handler.cfg = cfg
    Handler.api_key = Path(cfg.api_key_file).read_text().strip() if cfg.api_key_file else None
    Handler.slots = threading.BoundedSemaphore(cfg.max_running)
    Handler.answers = json.loads(Path(cfg.answers).read_text()) if cfg.answers else {}
    Handler.server_info = json.loads(Path(cfg.server_info).read_text()) if cfg.server_info else None
    server = ThreadingHTTPServer(("127.0.0.1", cfg.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
