"""A stand-in Hugging Face Hub: the model-info API and the file resolves `hf download` reads, over real HTTP.

Serves one folder as the repository `--repo` at the commit its files make (a changed file is a new commit, which
every revision names): GET /api/models/<repo>[/revision/<rev>] lists its
files with their sizes (as the Hub does with ?blobs=true), /api/models/<repo>/tree/<rev> lists them as
snapshot_download reads them, and HEAD/GET /<repo>/resolve/<rev>/<file> answer with the headers huggingface_hub
reads (X-Repo-Commit, ETag, Content-Length) and the bytes. With `--token`, every request must carry
`Bearer <token>` (401 otherwise, as the Hub answers a gated repository). It prints its port, then one line a
request it answers ("GET /path").

    python -m tests.playbooks.standin_hub --repo org/name --folder DIR --bind 10.0.0.1   # from the repository root
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.dsaops.json_http import JsonHandler


class Handler(JsonHandler):
    protocol_version = "HTTP/1.1"
    repo: str
    folder: Path
    token: str | None = None

    def _files(self) -> dict[str, Path]:
        return {str(p.relative_to(self.folder)): p for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def _commit(self) -> str:
        digest = hashlib.sha1()
        for name, p in self._files().items():
            digest.update(name.encode() + b"\0" + hashlib.sha1(p.read_bytes()).digest())
        return digest.hexdigest()

    def _allowed(self) -> bool:
        print(self.command, self.path, flush=True)
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_json(401, {"error": "Invalid credentials"})
            return False
        return True

    def do_GET(self):
        self._answer(body=True)

    def do_HEAD(self):
        self._answer(body=False)

    def _answer(self, body: bool):
        if not self._allowed():
            return
        path = unquote(urlsplit(self.path).path)
        info = f"/api/models/{self.repo}"
        if path == info or path.startswith(info + "/revision/"):
            siblings = [{"rfilename": name, "size": p.stat().st_size} for name, p in self._files().items()]
            self.send_json(200, {"id": self.repo, "modelId": self.repo, "sha": self._commit(), "siblings": siblings,
                                 "private": False, "gated": False, "disabled": False, "tags": []})
            return
        if path.startswith(f"{info}/tree/"):   # snapshot_download's listing (one page: no Link header)
            self.send_json(200, [{"type": "file", "path": name, "size": p.stat().st_size,
                                  "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for name, p in self._files().items()])
            return
        prefix = f"/{self.repo}/resolve/"
        file = self._files().get(path[len(prefix):].partition("/")[2]) if path.startswith(prefix) else None
        if file is None:
            self.send_json(404, {"error": "Entry not found"})
            return
        data = file.read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", self._commit())
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            self.wfile.write(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--token")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    handler = type("Hub", (Handler,), {"repo": args.repo, "folder": args.folder, "token": args.token})
    server = ThreadingHTTPServer((args.bind, args.port), handler)
    print(server.server_address[1], flush=True)
    sys.stdout.reconfigure(line_buffering=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
