"""`dsaops exporter`, `dsaops healthcheck`, `dsaops docker-proxy`, `dsaops log-writer`
(top-level imports stay stdlib-only)."""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import socket

from dsaops.cli_args import digits, http_url, seconds_up_to
from dsaops.errors import UserError
from dsaops.plan_input import shown

# not 9400 (dcgm-exporter) nor 9100 (node_exporter); loopback unless told otherwise (the playbooks give
# each node's exporter an address and a token, and fence its port to the monitoring hosts)
DEFAULT_LISTEN = "127.0.0.1:9860"
DEFAULT_PROXY_SOCKET = "/run/dsaops/docker.sock"
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the final NUL


def add_parser(sub) -> None:
    p = sub.add_parser("exporter", help="Prometheus exporter for SGLang DSA serving on this node",
                       description="Serve dsa_* metrics: /server_info, the server log, the scheduler processes, "
                                   "host memory and (optionally) Docker containers.")
    p.add_argument("--server-url", required=True, help="SGLang's HTTP address, e.g. http://127.0.0.1:30000")
    p.add_argument("--api-key-file", help="a file holding the server's API key, for /server_info (never on the "
                                          "command line); /health needs none")
    p.add_argument("--log-file", help="SGLang's log file, followed like tail -F")
    p.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN})")
    p.add_argument("--token-file", help="a file holding the bearer token every request must then carry "
                                        "(Authorization: Bearer TOKEN; Prometheus' credentials_file); required "
                                        "on an address other than loopback")
    p.add_argument("--allow-no-token", action="store_true",
                   help="serve on an address other than loopback without a token (a firewall alone guards it)")
    p.add_argument("--node", default=os.environ.get("DSAOPS_NODE") or socket.gethostname(),
                   help="the `node` label on every series (default $DSAOPS_NODE or the host name)")
    # at most 50 s: DsaExporterStale fires when a loop has not turned for 60 s, and a poll may take 2 x 3 s;
    # at least 0.1 s: each poll is a request the server answers, and Prometheus reads the result every 5 s
    p.add_argument("--interval", type=seconds_up_to(50, least=0.1), default=5.0,
                   help="seconds between /server_info polls, 0.1 to 50 (default 5)")
    p.add_argument("--plan", help="`dsaops plan --json` output: exports its kv_pool_tokens_per_rank and "
                                  "binding_limit for the alerts")
    p.add_argument("--state-file", help="where counts and the ranks seen persist across restarts of the exporter "
                                        "(a file on the node, e.g. /var/lib/dsaops/exporter/state.json)")
    p.add_argument("--stop-window", type=seconds_up_to(600), default=20.0,
                   help="seconds the ranks of one server may take to stop one after another (default 20)")
    p.add_argument("--container", action="append", default=[],
                   help="a Docker container to watch (restarts, exit code, OOMKilled); repeatable")
    p.add_argument("--docker-url", help="the Docker Engine's address, e.g. unix:///run/dsaops/docker.sock "
                                        "(`dsaops docker-proxy`); default: $DOCKER_HOST or the local socket")
    p.add_argument("--kmsg", default="/dev/kmsg", help="the kernel log, for OOM-killer records; 'none' to skip")
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="where the node's cgroup v2 tree is mounted")
    p.set_defaults(func=run_exporter)

    h = sub.add_parser("healthcheck", help="container HEALTHCHECK: /health and the scheduler ranks, within 5 s",
                       description="Exit 0 (healthy) when SGLang's /health answers 200 within --timeout and, with "
                                   "--expect-ranks, that many scheduler ranks run on this node; else exit 1, naming "
                                   "each problem on stderr. The image's HEALTHCHECK runs it; from the host, "
                                   "--container adds what the Docker Engine says (restarting, exited, OOMKilled).")
    h.add_argument("--server-url", required=True, help="SGLang's HTTP address, e.g. http://127.0.0.1:30000")
    h.add_argument("--expect-ranks", type=int, help="scheduler ranks that must be alive on this node")
    # at most 4 s: a HEALTHCHECK answer is due within 5 s
    h.add_argument("--timeout", type=seconds_up_to(4), default=3.0, help="seconds to wait for /health (default 3)")
    h.add_argument("--container", help="also ask the Docker Engine about this container (a check run on the host)")
    h.add_argument("--docker-url", help="the Docker Engine's address (default: $DOCKER_HOST or the local socket)")
    h.set_defaults(func=run_healthcheck)

    d = sub.add_parser("docker-proxy", help="the Docker API reduced to reading the state of named containers",
                       description="Hold the Docker socket and answer only GET /_ping, /version and "
                                   "/containers/NAME/json for the allowed names, reduced to their state.")
    d.add_argument("--allow", action="append", required=True, help="a container name that may be read; repeatable")
    d.add_argument("--listen", default=DEFAULT_PROXY_SOCKET, help=f"Unix socket to answer on (default {DEFAULT_PROXY_SOCKET})")
    d.add_argument("--docker-socket", default="/var/run/docker.sock", help="the Docker Engine's socket")
    d.set_defaults(func=run_docker_proxy)

    w = sub.add_parser("log-writer", help="append standard input to a log file, rotated by size, and echo it",
                       description="The image's log writer: stdin to FILE (rotated to FILE.1 … FILE.KEEP when it "
                                   "passes --max-bytes) and to stdout (docker logs).")
    w.add_argument("file")
    w.add_argument("--max-bytes", help="rotate past this size (default $DSAOPS_LOG_MAX_BYTES or 268435456, 256 MiB)")
    w.add_argument("--keep", help="rotated files kept (default $DSAOPS_LOG_KEEP or 4)")
    w.set_defaults(func=run_log_writer)


def check_server_url(url: str) -> None:
    """cli_args.http_url's check, run here rather than as the argparse type: the image's lint parses
    these commands with placeholder values."""
    try:
        http_url(url)
    except argparse.ArgumentTypeError as e:
        raise UserError(f"--server-url {e}") from None


def require(*modules: str) -> None:
    """Packages of the `exporter` extra a command needs: one missing is a one-line hint, not a traceback."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise UserError(f"the Python package {e.name} is not installed: run `pip install -e '.[exporter]'` in "
                            "the dsaops checkout (the serving image has it)") from None


def check_docker_url(url: str | None) -> None:
    """The docker SDK's own parse of --docker-url, which otherwise raises at the first read."""
    from docker.errors import DockerException
    from docker.utils import parse_host

    if url is not None:
        try:
            parse_host(url)
        except (DockerException, ValueError) as e:
            raise UserError(f"--docker-url {url}: {e}; give e.g. unix://{DEFAULT_PROXY_SOCKET}") from None


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    number = digits(port) if sep else None
    if number is None or not 0 < number < 65536:
        raise UserError(f"--listen {shown(value)}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "0.0.0.0", number


def run_exporter(args) -> int:
    require("prometheus_client", "psutil", *(["docker"] if args.container else []))
    from dsaops.healthchecks.exporter import Config, Exporter
    from dsaops.healthchecks.http import serve
    from dsaops.healthchecks.server_info import NO_PLAN, read_plan

    from dsaops import api_key, server_address

    host, port = parse_listen(args.listen)
    if not (args.token_file or args.allow_no_token or server_address.loopback(host)):
        raise UserError(f"--listen {shown(args.listen)} is reachable from other machines: add --token-file FILE "
                        "(the bearer token Prometheus sends), or --allow-no-token to serve it to anyone who reaches it")
    check_server_url(args.server_url)
    if args.state_file and not os.path.isdir(os.path.dirname(os.path.abspath(args.state_file))):
        raise UserError(f"--state-file {args.state_file}: its folder does not exist; create it or mount one there")
    if args.state_file and os.path.isdir(args.state_file):
        raise UserError(f"--state-file {args.state_file} is a folder: give a file in it, e.g. "
                        f"{os.path.join(args.state_file, 'state.json')}")
    if args.container:
        check_docker_url(args.docker_url)
    plan = read_plan(args.plan) if args.plan else NO_PLAN
    key = api_key.read(args.api_key_file)
    token = api_key.read(args.token_file, "--token-file", "the bearer token Prometheus sends")
    exporter = Exporter(Config(server_url=args.server_url, api_key=key, node=args.node, log_file=args.log_file,
                               interval=args.interval, stop_window=args.stop_window,
                               plan=plan,
                               containers=args.container, docker_url=args.docker_url, state_file=args.state_file,
                               kmsg=None if args.kmsg == "none" else args.kmsg, cgroup_root=args.cgroup_root))
    try:
        server = serve(exporter, host, port, token)
    except OSError as e:
        raise UserError(f"--listen {args.listen}: {e.strerror}; choose another address or port") from e
    exporter.start()
    print(f"dsaops exporter: serving http://{host}:{port}/metrics (node={args.node}"
          f"{', bearer token required' if token else ''})", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `docker stop` ends it as Ctrl-C does: state saved
    try:
        server.serve_forever()
    finally:
        exporter.stop()
    return 0


def run_healthcheck(args) -> int:
    from dsaops.healthchecks.healthcheck import run

    check_server_url(args.server_url)
    if args.container == "":
        raise UserError("--container: give the name of the container SGLang runs in (or leave the flag out)")
    require(*(["psutil"] if args.expect_ranks is not None else []), *(["docker"] if args.container else []))
    if args.container:
        check_docker_url(args.docker_url)
    return run(args)


def run_docker_proxy(args) -> int:
    from dsaops.healthchecks.dockerproxy import serve

    if not os.path.exists(args.docker_socket):
        raise UserError(f"--docker-socket {args.docker_socket}: no such socket; mount the Docker socket there")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.listen))):
        raise UserError(f"--listen {args.listen}: its folder does not exist; mount one there")
    try:
        server = serve(args.listen, args.docker_socket, args.allow)
    except OSError as e:  # "AF_UNIX path too long" comes without a strerror
        raise UserError(f"--listen {args.listen}: {e.strerror or e}; give a path of at most {MAX_UNIX_PATH} "
                        "bytes, not an existing file, in a folder this user may write to") from e
    print(f"dsaops docker-proxy: {args.listen} -> {args.docker_socket}, reading {', '.join(args.allow)}", flush=True)
    server.serve_forever()
    return 0


def run_log_writer(args) -> int:
    from dsaops.healthchecks.logwriter import run

    max_bytes = args.max_bytes or os.environ.get("DSAOPS_LOG_MAX_BYTES") or str(256 << 20)
    keep = args.keep or os.environ.get("DSAOPS_LOG_KEEP") or "4"
    size, kept = digits(max_bytes), digits(keep)
    if size is None or size < 4096 or kept is None or not 1 <= kept <= 99:
        raise UserError(f"the size limit ({shown(max_bytes)}, --max-bytes or DSAOPS_LOG_MAX_BYTES) must be 4096 to "
                        f"999999999999 bytes and the files kept ({shown(keep)}, --keep or DSAOPS_LOG_KEEP) 1 to 99")
    return run(args.file, size, kept)
