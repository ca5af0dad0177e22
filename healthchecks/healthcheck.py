"""`dsaops healthcheck`: the container HEALTHCHECK. Exit 0 when healthy, 1 otherwise, within 5 s.

SGLang's /health generates one token and may wait 20 s before answering 503, and on a
worker node it is a dummy that always answers 200: so the check has its own short timeout
and, with --expect-ranks, also counts the scheduler processes on this node. Run from the host,
--container adds the Docker Engine's word (restarting, exited, OOMKilled).
"""
from __future__ import annotations

import sys

from dsaops import fetch
from dsaops.errors import UserError

MAX_BODY = 64 << 10  # /health answers a few bytes


def live_ranks() -> list[str]:
    import psutil
    from dsaops.healthchecks.processes import COMM_PREFIX, rank_of_title

    # a stopped rank (SIGSTOP, or held by a tracer) hangs its server as a dead one does
    not_running = {psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD, psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}
    ranks = []
    for p in psutil.process_iter(["name", "status", "cmdline"]):
        if (p.info["name"] or "").startswith(COMM_PREFIX) and p.info["status"] not in not_running:
            rank = rank_of_title(" ".join(p.info["cmdline"] or []))
            if rank is not None:
                ranks.append(rank)
    return sorted(ranks)


def container_problems(name: str, docker_url: str | None, timeout: float) -> list[str]:
    """What the Docker Engine says is wrong with the container SGLang runs in (a host-side check)."""
    from dsaops.healthchecks.containers import Containers
    from dsaops.healthchecks.metrics import ErrorCounts

    attrs = Containers([name], ErrorCounts(), docker_url, timeout).inspect(name)
    if attrs is None:
        where = docker_url or "the default address"
        return [f"container {name}: the Docker Engine did not say (no such container, or no engine at {where})"]
    state, problems = attrs["State"], []
    if state.get("Restarting") or not state.get("Running"):
        problems.append(f"container {name} is {state.get('Status')} (exit code {state.get('ExitCode')}, "
                        f"{attrs.get('RestartCount', 0)} restarts)")
    if state.get("OOMKilled"):
        problems.append(f"container {name}: the OOM killer ended its last run")
    return problems


def check(server_url: str, expect_ranks: int | None, timeout: float, container: str | None = None,
          docker_url: str | None = None) -> list[str]:
    """The problems found; empty when healthy."""
    problems = []
    url = server_url.rstrip("/") + "/health"
    try:
        status, _ = fetch.request(url, deadline_s=timeout, max_bytes=MAX_BODY)
    except fetch.FetchError as e:  # refused, timed out, not HTTP
        problems.append(str(e))
    else:
        if status != 200:
            problems.append(f"{url} answered {status}")
    if expect_ranks is not None:
        ranks = live_ranks()
        if len(ranks) < expect_ranks:
            problems.append(f"{len(ranks)} of {expect_ranks} scheduler ranks alive on this node ({', '.join(ranks) or 'none'})")
    if container:
        problems += container_problems(container, docker_url, timeout)
    return problems


def run(args) -> int:
    if args.expect_ranks is not None and args.expect_ranks < 1:
        raise UserError("--expect-ranks must be at least 1 (the scheduler ranks this node runs)")
    problems = check(args.server_url, args.expect_ranks, args.timeout, args.container, args.docker_url)
    for p in problems:
        print(f"unhealthy: {p}", file=sys.stderr)
    if not problems:
        print("healthy")
    return 1 if problems else 0
