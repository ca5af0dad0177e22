"""The dashboards: generated from code (the committed JSON is what the generator writes), the
datasource is a variable (no hard-coded uid), every panel selects `$node`, status panels map a
0 to red words, ratios keep their own axis, joined tables merge their queries, the binding table
carries the plan's binding, every panel's PromQL parses and runs against the test Prometheus, and
every metric it names exists."""
from __future__ import annotations

import json
import re
import subprocess
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
    assert not re.search(r"\$(?!\d)", expr), f"unknown variable in {expr}"  # $1: label_replace's group
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
        answer = prometheus.api("query_range", query=promql(expr), start=0, end=60, step=15)
        assert answer["status"] == "success", f"{name}: {expr} (range): {answer.get('error')}"
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            text = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", text)
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


def test_the_committed_json_is_what_the_generator_writes():
    from dsaops.healthchecks import dashboard

    assert dashboard.main(["--check"]) == 0, "run python -m dsaops.healthchecks.dashboard"


def test_negative_control_a_hand_edit_is_caught(tmp_path, monkeypatch):
    from dsaops.healthchecks import dashboard

    edited = tmp_path / "dsaops.json"
    edited.write_text(dashboard.OUT.read_text().replace("Server up", "Server fine"))
    monkeypatch.setattr(dashboard, "OUT", edited)
    assert dashboard.main(["--check"]) == 1


def main_dashboard():
    return json.loads((DASHBOARDS / "dsaops.json").read_text())


def test_every_panel_selects_the_node_variable():
    for panel in panels(main_dashboard()):
        for target in panel.get("targets", []):
            assert 'node=~"$node"' in target["expr"], (panel["title"], target["expr"])


UP_METRICS = ("dsa_server_up", "dsa_worker_up")


def mapped(mappings, value):
    """(text, colour) a value mapping gives `value`."""
    for mapping in mappings:
        if str(value) in mapping.get("options", {}):
            option = mapping["options"][str(value)]
            return option["text"], option["color"]
    return None


def colour_of(thresholds, value):
    colour = None
    for step in thresholds["steps"]:
        if step["value"] is None or value >= step["value"]:
            colour = step["color"]
    return colour


def test_status_panels_map_values_and_a_down_zero_is_red():
    status = [p for p in panels(main_dashboard()) if p["type"] in ("stat", "state-timeline")]
    assert len(status) >= 3
    for panel in status:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("mappings") and defaults.get("thresholds"), panel["title"]
        if panel["title"] != "Scheduler ranks down" and any(m in t["expr"] for t in panel["targets"] for m in UP_METRICS):
            assert mapped(defaults["mappings"], 0) == ("down", "red"), panel["title"]
            assert mapped(defaults["mappings"], 1) == ("up", "green"), panel["title"]
            assert colour_of(defaults["thresholds"], 0) == "red" and colour_of(defaults["thresholds"], 1) == "green"
    ranks_down = next(p for p in status if p["title"] == "Scheduler ranks down")  # a count of the bad
    assert colour_of(ranks_down["fieldConfig"]["defaults"]["thresholds"], 1) == "red"
    assert mapped(ranks_down["fieldConfig"]["defaults"]["mappings"], 0) == ("all up", "green")


def overrides_of(panel, name):
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"] == {"id": "byName", "options": name}:
            return {p["id"]: p["value"] for p in o["properties"]}
    raise AssertionError(f"{panel['title']}: no override for {name}")


def test_tables_join_their_queries_and_map_their_status_columns():
    by_title = {p["title"]: p for p in panels(main_dashboard())}
    for panel in by_title.values():
        if panel["type"] == "table" and len(panel["targets"]) > 1:
            assert panel["transformations"][0]["id"] == "merge", panel["title"]
            assert all(t.get("format") == "table" and t.get("instant") for t in panel["targets"])
            renamed = panel["transformations"][1]["options"]["renameByName"]
            assert len(renamed) == len(panel["targets"])
    assert {"vm sysctls", "Containers"} <= {t for t, p in by_title.items() if len(p.get("targets", [])) > 1}
    running = overrides_of(by_title["Containers"], "running")
    assert mapped(running["mappings"], 0) == ("down", "red") and colour_of(running["thresholds"], 0) == "red"
    oom = overrides_of(by_title["Containers"], "OOM-killed")
    assert mapped(oom["mappings"], 1) == ("yes", "red") and colour_of(oom["thresholds"], 0) == "green"
    binds = overrides_of(by_title["What binds concurrency"], "by")
    assert mapped(binds["mappings"], "mamba") == ("mamba state cache", "orange")


RATIOS = ("sglang:token_usage", "sglang:mamba_usage", "dsa_host_memory_pressure_ratio")


def test_ratios_have_their_own_axis_and_per_rank_figures_no_sums():
    for panel in panels(main_dashboard()):
        exprs_ = [t["expr"] for t in panel.get("targets", [])]
        ratio = [any(r in e for r in RATIOS) for e in exprs_]
        if any(ratio):
            assert all(ratio), f"{panel['title']} mixes ratios with other figures"
            assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
            assert (panel["fieldConfig"]["defaults"]["min"], panel["fieldConfig"]["defaults"]["max"]) == (0, 1)
    per_rank = next(p for p in panels(main_dashboard()) if p["title"] == "KV pool tokens per rank vs plan")
    assert not any("sum" in t["expr"] for t in per_rank["targets"])


# node n1 planned and capped by the attention-DP split on both its ranks; n2 has no plan; n3 planned the KV
# pool, and the split binds
BIND_SERIES = {
    'dsa_concurrency_capped{node="n1",dp_rank="0",by="dp_split"}': 1,
    'dsa_concurrency_capped{node="n1",dp_rank="0",by="kv"}': 0,
    'dsa_concurrency_capped{node="n1",dp_rank="1",by="dp_split"}': 1,
    'dsa_concurrency_planned_binding{node="n1",by="dp_split"}': 1,
    'dsa_concurrency_planned_binding{node="n1",by="kv"}': 0,
    'dsa_concurrency_capped{node="n2",dp_rank="0",by="kv"}': 1,
    'dsa_concurrency_capped{node="n3",dp_rank="0",by="dp_split"}': 1,
    'dsa_concurrency_planned_binding{node="n3",by="kv"}': 1,
    'dsa_concurrency_planned_binding{node="n3",by="dp_split"}': 0,
}
BIND_ROWS = [("n1", "0", "dp_split", "dp_split"), ("n1", "1", "dp_split", "dp_split"), ("n2", "0", "kv", None),
             ("n3", "0", "dp_split", "kv")]


def bind_rows(promtool, tmp_path, expr: str) -> subprocess.CompletedProcess:
    """promtool's evaluator on BIND_SERIES: does `expr` give one row a rank, BIND_ROWS?"""
    samples = []
    for node, dp, by, planned in BIND_ROWS:
        labels = {"node": node, "dp_rank": dp, "by": by}
        if planned is None:  # the `or` branch: the comparison keeps the metric name
            labels["__name__"] = "dsa_concurrency_capped"
        else:
            labels["planned"] = planned
        samples.append({"labels": "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": 1})
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": s, "values": f"{v}x5"} for s, v in BIND_SERIES.items()],
        "promql_expr_test": [{"expr": promql(expr), "eval_time": "2m", "exp_samples": samples}]}]}
    path = tmp_path / "binds_test.yml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)


def binds_expr() -> str:
    panel = next(p for p in panels(main_dashboard()) if p["title"] == "What binds concurrency")
    assert overrides_of(panel, "planned") == overrides_of(panel, "by")
    return panel["targets"][0]["expr"]


def test_the_binding_table_shows_the_plans_binding_and_keeps_planless_ranks(promtool, tmp_path):
    r = bind_rows(promtool, tmp_path, binds_expr())
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("cut", [" or on (node, dp_rank) ", " * on (node) group_left (planned) "],
                         ids=["planless-ranks-dropped", "plan-not-joined"])
def test_negative_control_a_binding_table_cut_short_fails(promtool, tmp_path, cut):
    """The join alone drops n2's rank; the caps alone (the table before the plan's column) lack `planned`."""
    expr = binds_expr()
    assert cut in expr
    r = bind_rows(promtool, tmp_path, expr.partition(cut)[0])
    assert r.returncode != 0, r.stdout
