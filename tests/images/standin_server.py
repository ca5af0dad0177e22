"""Stands in for `python3 -m sglang.launch_server` where SGLang cannot serve (no GPU): the entrypoint
under test starts it exactly as it starts SGLang (DSAOPS_SERVER_MODULE=standin_server).

It prints its arguments, then, like SGLang's tokenizer manager, a `SIGTERM received` line on
SIGTERM before exiting 0. STANDIN_EXIT=N makes it exit N on its own after printing.
STANDIN_CHILD_LAST_WORDS=1: on SIGTERM it also leaves a child that writes a line to the same output
half a second after the stand-in has exited (SGLang's subprocesses log their own shutdown).
STANDIN_SERVE=1: like a worker node of SGLang, it answers /health with 200 on --port whatever
happens to its ranks, and starts one process per --tp rank titled as SGLang titles its schedulers
(`sglang::scheduler_TP<k>`, setproctitle); it prints their pids (`standin ranks pids=...`).
"""
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RANK = ("import setproctitle, signal, sys, time; setproctitle.setproctitle(sys.argv[1]); "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(3600)")
ranks = []


def _stop(signum, frame):
    if os.environ.get("STANDIN_CHILD_LAST_WORDS") == "1":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); print('child last words', flush=True)"])
    for rank in ranks:
        rank.terminate()
    print(f"SIGTERM received. signum={signum}", flush=True)
    sys.exit(0)


def option(argv, name, default):
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return default


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def serve(argv):
    server = ThreadingHTTPServer(("127.0.0.1", int(option(argv, "--port", "30000"))), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for k in range(int(option(argv, "--tp", "1"))):
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK, f"sglang::scheduler_TP{k}"]))
    print(f"standin ranks pids={','.join(str(r.pid) for r in ranks)}", flush=True)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    print(f"standin pid={os.getpid()} args={' '.join(sys.argv[1:])}", flush=True)
    print("standin on stderr", file=sys.stderr, flush=True)
    if "STANDIN_EXIT" in os.environ:
        sys.exit(int(os.environ["STANDIN_EXIT"]))
    if os.environ.get("STANDIN_SERVE") == "1":
        serve(sys.argv[1:])
    while True:
        for rank in ranks:
            rank.poll()  # reap a killed rank, as SGLang's launcher joins its schedulers
        time.sleep(0.1)


if __name__ == "__main__":
    main()
