"""End to end: a real Prometheus server scrapes the real exporter (1 s) on loopback; the
values are read back through Prometheus's HTTP API."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml
from dsaops.healthchecks.dashboard import BINDS_WITH_PLAN
from dsaops.healthchecks.exporter import Config
from dsaops.healthchecks.server_info import PlanFigures

from benchmarks.sglang_standin import log_lines as L
from tests.healthchecks.prometheus_text import scrape
from tests.support.polling import wait_for

RULES = Path(__file__).resolve().parents[2] / "healthchecks" / "rules" / "dsaops.yml"
TITLES = [f"sglang::scheduler_TP{i}" for i in range(4)]


@pytest.fixture
def stack(request, prometheus, fake_server, exporter_on, launcher, tmp_path):
    """Four titled ranks under a launcher, their startup lines in the log, /server_info, the exporter."""
    node = request.node.name[:40]
    log = tmp_path / "sglang.log"
    lch = launcher(TITLES)
    log.write_text("".join(L.line(L.kv_allocated(4922240, 32.48), (f"TP{i}",)) for i in range(4)))
    exp = exporter_on(Config(server_url=fake_server.url, node=node, log_file=str(log), interval=1.0,
                             stop_window=3.0, plan=PlanFigures(4900000, "dp_split")),
                      prometheus.exporter_port)
    return {"node": node, "log": log, "launcher": lch, "exporter": exp, "server": fake_server, "prom": prometheus}


def alert_expr(name: str) -> str:
    rules = yaml.safe_load(RULES.read_text())["groups"]
    return next(r["expr"] for g in rules for r in g["rules"] if r.get("alert") == name)


def on_node(stack, expr: str) -> list:
    """`expr`'s series of this test's node (the session's Prometheus holds earlier tests' too)."""
    return [r for r in stack["prom"].query(expr) if r["metric"].get("node") == stack["node"]]


def sel(stack, name, **labels):
    inner = ",".join([f'node="{stack["node"]}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return f"{name}{{{inner}}}"


def seen(stack, expr, want, timeout=15):
    prom = stack["prom"]
    return wait_for(lambda: prom.value(expr) == want, timeout, 0.25)


def test_values_deaths_and_clean_stop_through_prometheus(stack):
    prom, lch = stack["prom"], stack["launcher"]
    assert seen(stack, f'count({sel(stack, "dsa_worker_up")} == 1)', 4.0)
    assert seen(stack, sel(stack, "dsa_server_up"), 1.0)
    assert prom.value(sel(stack, "dsa_kv_pool_tokens", rank="TP2")) == 4922240
    assert prom.value(sel(stack, "dsa_kv_pool_planned_tokens")) == 4900000
    assert seen(stack, sel(stack, "dsa_concurrency_capped", by="dp_split", dp_rank="0"), 1.0)
    assert prom.value(f'sum({sel(stack, "dsa_concurrency_capped", dp_rank="0")})') == 1
    # the split the plan expected: the scraped series join, and DsaConcurrencyCapped's expression is empty
    assert prom.value(sel(stack, "dsa_concurrency_planned_binding", by="dp_split")) == 1
    alert = alert_expr("DsaConcurrencyCapped")
    assert on_node(stack, alert.partition(" unless ")[0]) and not on_node(stack, alert)
    # the dashboard's binding table: each DP rank's row carries the plan's binding
    rows = on_node(stack, BINDS_WITH_PLAN.replace("$node", stack["node"]))
    assert len(rows) == len(on_node(stack, "dsa_concurrency_capped == 1")) == 8
    assert {(r["metric"]["by"], r["metric"].get("planned")) for r in rows} == {("dp_split", "dp_split")}
    assert prom.value(sel(stack, "dsa_max_running_requests", scope="requested", dp_rank="7")) == 1
    assert prom.value(f'count({sel(stack, "dsa_kv_cache_info", dtype="float8_e4m3fn", layout="raw_fp8")})') == 1

    # TP1 SIGKILLed, SGLang's watchdog line for its pid: one death, cause sigkill, within a scrape or two
    victim = lch.pids[1]
    os.kill(victim, signal.SIGKILL)
    with open(stack["log"], "a") as f:
        f.write(L.line(L.crashed("scheduler_1", victim, -9)))
    died = sel(stack, "dsa_worker_deaths_total", rank="TP1", cause="sigkill")
    assert seen(stack, died, 1.0, timeout=5)
    assert seen(stack, sel(stack, "dsa_worker_up", rank="TP1"), 0.0, timeout=3)
    # TP3 SIGKILLed with no line: once (unknown, or sigkill if its zombie was seen before it was reaped)
    os.kill(lch.pids[3], signal.SIGKILL)
    assert seen(stack, f'sum({sel(stack, "dsa_worker_deaths_total", rank="TP3")})', 1.0, timeout=8)
    # the rest stopped cleanly: nothing more
    with open(stack["log"], "a") as f:
        f.write(L.line(L.sigterm()))
    lch.stop()
    assert seen(stack, f'count({sel(stack, "dsa_worker_up")})', 2.0, timeout=8)  # the two dead ones stay, at 0
    wait_for(lambda: False, 3)
    assert prom.value(died) == 1
    assert prom.value(f'sum(max_over_time({sel(stack, "dsa_worker_deaths_total", rank="TP1")}[2m]))') == 1  # never also "unknown"
    assert prom.value(f'sum(max_over_time({sel(stack, "dsa_worker_deaths_total")}[2m]))') == 2


def test_garbage_in_keeps_serving_counts_and_recovers(stack):
    prom, server = stack["prom"], stack["server"]
    errors = sel(stack, "dsa_exporter_errors_total", source="server_info")
    log_errors = sel(stack, "dsa_exporter_errors_total", source="log")
    assert seen(stack, sel(stack, "dsa_server_up"), 1.0)
    before = prom.value(errors)

    server.raw = b'{"model_path": "zai-org/GLM-5.3-Fl'  # truncated JSON
    assert seen(stack, sel(stack, "dsa_server_up"), 0.0, timeout=8)
    assert prom.value(errors) > before
    assert prom.value(f'up{{job="{prom.job}",instance="127.0.0.1:{prom.exporter_port}"}}') == 1
    server.raw = None
    assert seen(stack, sel(stack, "dsa_server_up"), 1.0, timeout=8)

    with open(stack["log"], "ab") as f:  # binary bytes, then a line cut in half
        f.write(b"\x00\xff\xfe garbage \x80\n" + os.urandom(512).replace(b"\n", b"") + b"\n")
        f.write(L.line(L.kv_allocated(1234, 0.01), ("TP9",)).encode()[:40])
    assert wait_for(lambda: (prom.value(log_errors) or 0) >= 2, 8)
    assert scrape(stack["exporter"].url)[f'dsa_server_up{{node="{stack["node"]}"}}'] == 1
    with open(stack["log"], "ab") as f:  # the rest of the half line: recovered
        f.write(L.line(L.kv_allocated(1234, 0.01), ("TP9",)).encode()[40:])
    assert seen(stack, sel(stack, "dsa_kv_pool_tokens", rank="TP9"), 1234.0, timeout=8)

    server.close()  # server down
    assert seen(stack, sel(stack, "dsa_server_up"), 0.0, timeout=8)
    assert prom.value(f'up{{job="{prom.job}",instance="127.0.0.1:{prom.exporter_port}"}}') == 1


def test_prometheus_scrapes_with_the_token_from_its_file_and_not_without(prometheus, fake_server, exporter_on):
    """The playbook's scrape: `authorization: {type: Bearer, credentials_file}`; the wrong token's job is down."""
    node = "token-node"
    exporter_on(Config(server_url=fake_server.url, node=node, interval=1.0, kmsg=None), prometheus.token_port,
                token=prometheus.token)
    assert wait_for(lambda: prometheus.value('up{job="token-right"}') == 1.0, 15, 0.25)
    assert wait_for(lambda: prometheus.value('up{job="token-wrong"}') == 0.0, 15, 0.25)
    assert wait_for(lambda: prometheus.value(f'dsa_server_up{{job="token-right",node="{node}"}}') == 1.0, 15, 0.25)
    assert prometheus.value('dsa_server_up{job="token-wrong"}') is None
