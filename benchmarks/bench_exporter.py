"""Exporter benchmark (not a test): scrape latency with 8 ranks and a 1 GB log, and steady CPU.

    .venv/bin/python benchmarks/bench_exporter.py [--log-gb 1] [--scrapes 50] [--cpu-seconds 60] [--out FILE]

1. Writes a log of --log-gb GiB (SGLang 0.5.23 lines: the startup KV lines, then decode-batch
   and access lines), starts 8 processes titled `sglang::scheduler_TP0..7` under a launcher and
   a /server_info server in 0.5.23's shape.
2. Runs `dsaops exporter` in-process, waits out the first catch-up of the log (reported, and
   excluded from the scrape figures), then times --scrapes scrapes over HTTP.
3. Runs `dsaops exporter` as its own process, scraped every 5 s for --cpu-seconds while a line
   a second is appended, and reports its CPU use as a share of one core.
Targets: one scrape <= 50 ms; steady CPU < 1% of a core.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository, for `import dsaops` and `benchmarks.sglang_standin`

from benchmarks.run_info import run_info
from benchmarks.sglang_standin import log_lines as L
from benchmarks.sglang_standin.server import FakeServer, Launcher
from dsaops.cli_args import writable, write
from dsaops.errors import UserError

RANKS = [f"sglang::scheduler_TP{i}" for i in range(8)]
NEEDS = ("psutil", "prometheus_client", "setproctitle")  # the exporter's packages; the stand-in's ranks title with the last


def write_log(path: Path, gib: float) -> None:
    head = "".join(L.line(L.kv_allocated(4922240, 32.48), (f"TP{i}",)) for i in range(8))
    block = "".join(
        L.line(f"Decode batch. #running-req: {i % 64}, #token: {i * 977 % 4922240}, token usage: 0.{i % 97:02d}, "
               f"cuda graph: True, gen throughput (token/s): {1000 + i % 300}.00, #queue-req: 0, ", ("TP0",))
        + f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK\n'
        for i in range(2000)).encode()
    with open(path, "wb") as f:
        f.write(head.encode())
        f.writelines(block for _ in range(int(gib * (1 << 30)) // len(block) + 1))


def free_port() -> int:
    """A free loopback port for the exporter process (`--listen HOST:0` would not say which it got)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def scrape_latency(log: Path, server_url: str, scrapes: int) -> dict:
    from dsaops.healthchecks.exporter import Config, Exporter
    from dsaops.healthchecks.http import serve

    exp = Exporter(Config(server_url=server_url, node="bench", log_file=str(log), interval=5.0)).start()
    httpd = serve(exp, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    t0 = time.monotonic()
    exp.follower.caught_up.wait()
    catch_up = time.monotonic() - t0
    time.sleep(1.5)  # a process poll and a /server_info poll have happened
    body = get(url)
    assert body.count(b"dsa_worker_up{") == 8 and b"dsa_server_up{node=\"bench\"} 1.0" in body, body[:2000]
    times = []
    for _ in range(scrapes):
        t = time.perf_counter()
        get(url)
        times.append((time.perf_counter() - t) * 1000)
    httpd.shutdown()
    exp.stop()
    times.sort()
    print(f"first catch-up of the {log.stat().st_size / (1 << 30):.2f} GiB log: {catch_up:.1f} s (background)")
    print(f"load average during the scrapes: {os.getloadavg()[0]:.1f}")
    result = {"log_gib": round(log.stat().st_size / (1 << 30), 2), "catch_up_s": round(catch_up, 1),
              "scrapes": scrapes, "scrape_bytes": len(body), "load_average": round(os.getloadavg()[0], 1),
              "scrape_ms_median": round(statistics.median(times), 1),
              "scrape_ms_p95": round(times[int(0.95 * (len(times) - 1))], 1), "scrape_ms_max": round(times[-1], 1)}
    print(f"scrape over HTTP, {scrapes} scrapes, {len(body)} B: median {result['scrape_ms_median']} ms, "
          f"p95 {result['scrape_ms_p95']} ms, max {result['scrape_ms_max']} ms")
    return result


def steady_cpu(log: Path, server_url: str, seconds: float) -> dict:
    import psutil

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dsaops", "exporter", "--server-url", server_url, "--log-file",
                             str(log), "--listen", f"127.0.0.1:{port}", "--node", "bench", "--interval", "5"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    ps = psutil.Process(proc.pid)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        while True:  # the first catch-up is over once a second costs under 50 ms of CPU
            time.sleep(2)
            before = sum(ps.cpu_times()[:2])
            time.sleep(1)
            if sum(ps.cpu_times()[:2]) - before < 0.05:
                break
        get(url)
        start_cpu, start = sum(ps.cpu_times()[:2]), time.monotonic()
        with open(log, "a") as out:
            while time.monotonic() - start < seconds:
                for _ in range(5):
                    out.write(L.line("Decode batch. #running-req: 3, #token: 1234, token usage: 0.01, ", ("TP0",)))
                    out.flush()
                    time.sleep(1)
                get(url)
        used, wall = sum(ps.cpu_times()[:2]) - start_cpu, time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"steady CPU over {wall:.0f} s (scrape every 5 s, a log line a second, 8 ranks polled every 1 s): "
          f"{100 * used / wall:.2f}% of one core")
    return {"cpu_seconds": round(wall), "cpu_pct_of_core": round(100 * used / wall, 2)}


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-gb", type=float, default=1.0, help="GiB of SGLang log the exporter follows (default 1)")
    ap.add_argument("--scrapes", type=int, default=50, help="scrapes timed (default 50)")
    ap.add_argument("--cpu-seconds", type=float, default=60, help="seconds of steady CPU measured (default 60)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "exporter-cpu.json"),
                    help="result JSON, which benchmarks/report.py turns into BENCHMARKS.md")
    args = ap.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    # the make target runs it with the defaults; other flags are recorded as given, for the page's command row
    args.command = shlex.join(["python3", "benchmarks/bench_exporter.py", *given]) if given else "make bench-exporter"
    for flag, value in (("--log-gb", args.log_gb), ("--cpu-seconds", args.cpu_seconds)):
        if not 0 < value < math.inf:  # nan too
            raise UserError(f"{flag} {value:g}: give a number above 0")
    if args.scrapes < 1:
        raise UserError(f"--scrapes {args.scrapes}: give a whole number from 1")
    return args


def preflight(args) -> None:
    """What the run needs, checked before the log is written, so that a missing piece fails at once."""
    writable("--out", args.out)
    for name in NEEDS:
        try:
            importlib.import_module(name)
        except ImportError:
            raise UserError(f"{name} is not importable: `make bench-exporter` runs this in the project's .venv, "
                            "which has it") from None


def measure(args) -> dict:
    import psutil

    result = {**run_info(args.command), "processes": len(psutil.pids()), "ranks": len(RANKS)}
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{len(psutil.pids())} processes")
    with tempfile.TemporaryDirectory(prefix="dsaops-bench-") as tmp:
        log = Path(tmp) / "sglang.log"
        t = time.monotonic()
        write_log(log, args.log_gb)
        print(f"wrote {log.stat().st_size / (1 << 30):.2f} GiB of log in {time.monotonic() - t:.1f} s")
        server, launcher = FakeServer(), Launcher(RANKS)
        try:
            result |= scrape_latency(log, server.url, args.scrapes)
            result |= steady_cpu(log, server.url, args.cpu_seconds)
        finally:
            launcher.kill_all()
            server.close()
    return result


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        preflight(args)
        write("--out", args.out, (json.dumps(measure(args), indent=1) + "\n").encode())
    except UserError as e:
        print(f"bench_exporter: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
