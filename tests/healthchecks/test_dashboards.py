"""The dashboards: the datasource is a variable (no hard-coded uid), every panel's PromQL
parses and runs against the test Prometheus, and every metric it names exists."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.sglang_wheel import sglang_source

DASHBOARDS = Path(__file__).resolve().parents[2] / "healthchecks" / "dashboards"
README = DASHBOARDS.parent / "README.md"
# Grafana's own variables, as a Prometheus query sees them after substitution
SUBSTITUTE = {"$node": ".*", "$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s"}


def dashboards():
    found = sorted(DASHBOARDS.glob("*.json"))
    assert found
    return [(p.name, json.loads(p.read_text())) for p in found]


def panels(dash):
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(dash):
    return [t["expr"] for p in panels(dash) for t in p.get("targets", [])]


def promql(expr: str) -> str:
    for var, value in SUBSTITUTE.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


@pytest.mark.parametrize("name,dash", dashboards())
def test_datasource_is_a_variable(name, dash):
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    refs = [p["datasource"] for p in panels(dash) if p["type"] != "row"]
    refs += [t["datasource"] for p in panels(dash) for t in p.get("targets", [])]
    refs += [v["datasource"] for v in variables.values() if "datasource" in v]
    assert refs and all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs)
    uids = re.findall(r'"uid":\s*"([^"]*)"', json.dumps(dash))
    assert set(uids) <= {"${datasource}", dash["uid"]}, "a hard-coded datasource uid"


@pytest.mark.parametrize("name,dash", dashboards())
def test_every_query_runs_on_prometheus(name, dash, prometheus):
    queries = exprs(dash)
    assert queries
    for expr in queries:
        answer = prometheus.api("query", query=promql(expr))
        assert answer["status"] == "success", f"{name}: {expr}: {answer.get('error')}"
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"]["query"])
            assert m, v["query"]
            assert prometheus.api(f"label/{m[2]}/values", **{"match[]": m[1]})["status"] == "success"


def test_negative_control_a_broken_query_is_refused(prometheus):
    assert prometheus.api("query", query=promql('sum by (node (dsa_server_up{node=~"$node"})'))["status"] == "error"


@pytest.mark.parametrize("name,dash", dashboards())
def test_every_metric_exists(name, dash):
    text = " ".join(exprs(dash))
    documented = set(re.findall(r"`(dsa_\w+)", README.read_text()))
    assert set(re.findall(r"\bdsa_\w+", text)) <= documented
    collector = (sglang_source() / "sglang/srt/observability/metrics_collector.py").read_text()
    for metric in set(re.findall(r"\bsglang:\w+", text)):
        assert f'name="{metric}"' in collector, f"{metric} is not an SGLang 0.5.23 metric"


def test_provisioning_files():
    prov = {p.name: yaml.safe_load(p.read_text()) for p in (DASHBOARDS / "provisioning").glob("*.yml")}
    assert prov["dashboards.yml"]["providers"][0]["type"] == "file"
    assert prov["datasources.yml"]["datasources"][0]["type"] == "prometheus"
