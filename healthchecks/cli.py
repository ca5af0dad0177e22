"""`dsaops exporter` and `dsaops healthcheck` (top-level imports stay stdlib-only)."""
from __future__ import annotations

import os
import socket

from dsaops.errors import UserError

DEFAULT_LISTEN = "0.0.0.0:9860"  # not 9400 (dcgm-exporter) nor 9100 (node_exporter)


def add_parser(sub) -> None:
    p = sub.add_parser("exporter", help="Prometheus exporter for SGLang DSA serving on this node",
                       description="Serve dsa_* metrics: /server_info, the server log, the scheduler processes, "
                                   "host memory and (optionally) Docker containers.")
    p.add_argument("--server-url", required=True, help="SGLang's HTTP address, e.g. http://127.0.0.1:30000")
    p.add_argument("--log-file", help="SGLang's log file, followed like tail -F")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN})")
    p.add_argument("--node", default=os.environ.get("DSAOPS_NODE") or socket.gethostname(),
                   help="the `node` label on every series (default $DSAOPS_NODE or the host name)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between /server_info polls (default 5)")
    p.add_argument("--plan", help="`dsaops plan --json` output: exports its kv_pool_tokens_per_rank for the alert")
    p.add_argument("--container", action="append", default=[],
                   help="a Docker container to watch (restarts, exit code, OOMKilled); repeatable")
    p.set_defaults(func=run_exporter)

    h = sub.add_parser("healthcheck", help="container HEALTHCHECK: /health and the scheduler ranks, within 5 s")
    h.add_argument("--server-url", required=True, help="SGLang's HTTP address, e.g. http://127.0.0.1:30000")
    h.add_argument("--expect-ranks", type=int, help="scheduler ranks that must be alive on this node")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for /health (default 3)")
    h.add_argument("--container", help="also ask the Docker Engine about this container (a check run on the host)")
    h.add_argument("--docker-url", help="the Docker Engine's address (default: $DOCKER_HOST or the local socket)")
    h.set_defaults(func=run_healthcheck)


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--listen {value!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "0.0.0.0", int(port)


def run_exporter(args) -> int:
    from dsaops.healthchecks.exporter import Config, Exporter
    from dsaops.healthchecks.http import serve
    from dsaops.healthchecks.server_info import read_plan

    host, port = parse_listen(args.listen)
    if args.interval <= 0:
        raise UserError("--interval must be a positive number of seconds")
    if not args.server_url.startswith(("http://", "https://")):
        raise UserError(f"--server-url {args.server_url!r}: give an http:// or https:// address")
    planned = read_plan(args.plan) if args.plan else None
    exporter = Exporter(Config(server_url=args.server_url, node=args.node, log_file=args.log_file,
                               interval=args.interval, planned_tokens=planned, containers=args.container))
    try:
        server = serve(exporter, host, port)
    except OSError as e:
        raise UserError(f"--listen {args.listen}: {e.strerror}; choose another address or port") from e
    exporter.start()
    print(f"dsaops exporter: serving http://{host}:{port}/metrics (node={args.node})", flush=True)
    try:
        server.serve_forever()
    finally:
        exporter.stop()
    return 0


def run_healthcheck(args) -> int:
    from dsaops.healthchecks.healthcheck import run

    return run(args)
