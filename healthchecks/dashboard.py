"""The Grafana dashboard, as code: `python -m dsaops.healthchecks.dashboard` writes
dashboards/dsaops.json (what the playbook installs), `--check` says whether it is current.

Built with grafana-foundation-sdk (pinned in tests/requirements/healthchecks.txt to the SDK
release for the Grafana the playbook runs, 11.2). Rules every panel keeps, and the tests hold:
- every query selects `node=~"$node"` and the data source is the `datasource` variable;
- status panels map their values to words and colours: an up-like 0 is red;
- a per-rank figure is drawn beside per-rank plans, never against a sum;
- ratios (0..1) have their own panel and axis, never one shared with token counts;
- tables that show several queries join them into one row per node (and rank/container).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "dsaops.json"
N = 'node=~"$node"'
# Each DP rank's binding, with the plan's (`planned`) copied on by node; ranks of a node without a plan
# keep their row, without the column.
_CAPPED = f"(dsa_concurrency_capped{{{N}}} == 1)"
BINDS_WITH_PLAN = (f"{_CAPPED} * on (node) group_left (planned) max by (node, planned) (label_replace("
                   f'dsa_concurrency_planned_binding{{{N}}} == 1, "planned", "$1", "by", "(.*)")) '
                   f"or on (node, dp_rank) {_CAPPED}")
RED, GREEN, ORANGE = "red", "green", "orange"


def _sdk():
    from grafana_foundation_sdk.builders import (
        common,
        dashboard,
        prometheus,
        stat,
        statetimeline,
        table,
        timeseries,
    )
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus as prom_model

    return common, dashboard, prometheus, stat, statetimeline, table, timeseries, model, prom_model


def build() -> dict:
    common, dashboard, prometheus, stat, statetimeline, table, timeseries, m, pm = _sdk()
    last = common.ReduceDataOptions().calcs(["lastNotNull"])
    ref = m.DataSourceRef(type_val="prometheus", uid="${datasource}")

    def query(expr: str, legend: str = "", ref_id: str = "A", instant: bool = False):
        q = prometheus.Dataquery().expr(expr).ref_id(ref_id).datasource(ref)
        if instant:
            return q.instant().format(pm.PromQueryFormat.TABLE)
        return q.legend_format(legend)

    def words(*pairs: tuple[object, str, str]) -> list:
        """Value mappings: (value, text, colour)."""
        return [m.ValueMap(options={str(v): m.ValueMappingResult(text=text, color=color, index=i)
                                    for i, (v, text, color) in enumerate(pairs)})]

    def steps(*pairs: tuple[float | None, str]):
        t = dashboard.ThresholdsConfig().mode(m.ThresholdsMode.ABSOLUTE)
        return t.steps([m.Threshold(value=v, color=c) for v, c in pairs])

    up_words = words((0, "down", RED), (1, "up", GREEN))
    up_steps = steps((None, RED), (1, GREEN))

    def timeseries_panel(title: str, *targets, unit: str = "", desc: str = "", minimum=None, maximum=None):
        p = timeseries.Panel().title(title).datasource(ref).description(desc).span(8).height(7)
        for t in targets:
            p = p.with_target(t)
        if unit:
            p = p.unit(unit)
        if minimum is not None:
            p = p.min(minimum)
        if maximum is not None:
            p = p.max(maximum)
        return p

    def joined_table(title: str, desc: str, columns: list[tuple[str, str]], keys: list[str]):
        """One instant query per column, merged into one row per `keys`."""
        p = table.Panel().title(title).datasource(ref).description(desc).span(8).height(7)
        rename, order = {}, {k: i for i, k in enumerate(keys)}
        for i, (name, expr) in enumerate(columns):
            ref_id = chr(ord("A") + i)
            p = p.with_target(query(expr, ref_id=ref_id, instant=True))
            rename[f"Value #{ref_id}"] = name
            order[name] = len(keys) + i
        p = p.with_transformation(m.DataTransformerConfig(id_val="merge", options={}))
        return p.with_transformation(m.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "__name__": True, "job": True, "instance": True},
            "renameByName": rename, "indexByName": order}))

    dash = (dashboard.Dashboard("dsaops: SGLang DSA serving").uid("dsaops-serving").tags(["dsaops", "sglang"])
            .refresh("30s").time("now-6h", "now").timezone("browser").editable()
            .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
            .with_variable(dashboard.QueryVariable("node").label("Node").datasource(ref)
                           .query("label_values(dsa_server_up, node)").refresh(m.VariableRefresh.ON_TIME_RANGE_CHANGED)
                           .sort(m.VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*")))

    # -- ranks and server ---------------------------------------------------------------------
    dash = dash.with_row(dashboard.Row("Ranks and server"))
    dash = dash.with_panel(
        stat.Panel().title("Server up").datasource(ref).span(6).height(5)
        .description("/server_info answered (worker node: its /health)")
        .with_target(query(f"dsa_server_up{{{N}}}", "{{node}}"))
        .mappings(up_words).thresholds(up_steps).color_mode("background").no_value("no data").reduce_options(last))
    dash = dash.with_panel(
        stat.Panel().title("Scheduler ranks down").datasource(ref).span(6).height(5)
        .description("Ranks whose process died and has not come back, or is stopped (dsa_worker_up 0)")
        .with_target(query(f"count by (node) (dsa_worker_up{{{N}}} == 0) "
                           f"or on (node) (0 * count by (node) (dsa_worker_up{{{N}}}))", "{{node}}"))
        .mappings(words((0, "all up", GREEN))).thresholds(steps((None, GREEN), (1, RED))).color_mode("background")
        .reduce_options(last))
    deaths = (table.Panel().title("Rank deaths in range").datasource(ref).span(12).height(5)
              .description("Deaths counted from the processes; cause from the log, the zombie's exit status, the "
                           "kernel OOM record, the cgroup or Docker")
              .with_target(query(f"sum by (node, rank, cause) (increase(dsa_worker_deaths_total{{{N}}}[$__range])) > 0",
                                 instant=True))
              .thresholds(steps((None, GREEN), (1, RED)))
              .with_transformation(m.DataTransformerConfig(id_val="organize", options={
                  "excludeByName": {"Time": True}, "renameByName": {"Value": "deaths"}})))
    deaths = deaths.override_by_name("deaths", [m.DynamicConfigValue(id_val="custom.cellOptions",
                                                                       value={"type": "color-background"})])
    dash = dash.with_panel(deaths)
    dash = dash.with_panel(
        statetimeline.Panel().title("Worker ranks").datasource(ref).span(12).height(7)
        .description("Each scheduler rank's process: up, or down after it died (until its server restarts) or while it is stopped")
        .with_target(query(f"dsa_worker_up{{{N}}}", "{{node}} {{rank}}"))
        .mappings(up_words).thresholds(up_steps))
    dash = dash.with_panel(timeseries_panel(
        "SGLang alarm lines", query(f"increase(dsa_server_log_events_total{{{N}}}[$__rate_interval])",
                                    "{{node}} {{event}}"), desc="SIGQUIT, SIGTERM and health-check-failed lines")
        .span(12))

    # -- concurrency ---------------------------------------------------------------------------
    dash = dash.with_row(dashboard.Row("Concurrency"))
    binds = (table.Panel().title("What binds concurrency").datasource(ref).span(8).height(7)
             .description("by: what binds each DP rank's running requests; planned: what the plan expected "
                          "(empty without --plan). none: the request itself; dp_split: divided by the attention-DP "
                          "size; kv: the KV pool; mamba: the mamba state cache")
             .with_target(query(BINDS_WITH_PLAN, instant=True))
             .with_transformation(m.DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True},
                 "indexByName": {"node": 0, "dp_rank": 1, "by": 2, "planned": 3}})))
    bind_words = [m.ValueMap(options={
        "none": m.ValueMappingResult(text="the request", color=GREEN, index=0),
        "dp_split": m.ValueMappingResult(text="attention-DP split", color=ORANGE, index=1),
        "kv": m.ValueMappingResult(text="KV pool", color=ORANGE, index=2),
        "mamba": m.ValueMappingResult(text="mamba state cache", color=ORANGE, index=3)}).to_json()]
    for column in ("by", "planned"):
        binds = binds.override_by_name(column, [
            m.DynamicConfigValue(id_val="mappings", value=bind_words),
            m.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})])
    dash = dash.with_panel(binds)
    dash = dash.with_panel(timeseries_panel(
        "max_running_requests per DP rank", query(f"dsa_max_running_requests{{{N}}}", "{{node}} dp{{dp_rank}} {{scope}}"),
        desc="requested (after the attention-DP split) and effective (what each DP rank's scheduler runs)"))
    mamba = timeseries_panel(
        "Mamba state cache", query(f"dsa_mamba_cache_slots{{{N}}}", "{{node}} {{rank}}{{dp_rank}} slots", "A"),
        query(f"dsa_mamba_running_requests_cap{{{N}}}", "{{node}} {{rank}}{{dp_rank}} request cap", "B"),
        query(f"dsa_mamba_slots_per_request{{{N}}}", "{{node}} {{rank}}{{dp_rank}} slots/request", "C"),
        desc="Slots and the running-request cap per rank (left); state slots one request holds (right)")
    mamba = mamba.override_by_query("C", [m.DynamicConfigValue(id_val="custom.axisPlacement", value="right")])
    dash = dash.with_panel(mamba)
    dash = dash.with_panel(timeseries_panel(
        "Running and queued requests", query(f"sum by (node) (sglang:num_running_reqs{{{N}}})", "{{node}} running", "A"),
        query(f"sum by (node) (sglang:num_queue_reqs{{{N}}})", "{{node}} queued", "B"),
        desc="SGLang's own metrics (--enable-metrics), per node").span(12))
    dash = dash.with_panel(timeseries_panel(
        "Generation throughput", query(f"sum by (node) (sglang:gen_throughput{{{N}}})", "{{node}}"),
        unit="tok/s", desc="SGLang's own metric, per node").span(12))

    # -- KV cache ------------------------------------------------------------------------------
    dash = dash.with_row(dashboard.Row("KV cache"))
    dash = dash.with_panel(timeseries_panel(
        "KV pool tokens per rank vs plan",
        query(f"dsa_kv_pool_tokens{{{N}}}", "{{node}} {{rank}}", "A"),
        query(f"dsa_kv_token_capacity{{{N}}}", "{{node}} dp{{dp_rank}} capacity", "B"),
        query(f"max by (node) (dsa_kv_pool_planned_tokens{{{N}}})", "{{node}} plan per rank", "C"),
        query(f"sglang:max_total_num_tokens{{{N}}}", "{{node}} sglang tp{{tp_rank}} dp{{dp_rank}}", "D"),
        desc="Each rank's pool (log, /server_info, SGLang) against the plan's pool per rank"))
    dash = dash.with_panel(timeseries_panel(
        "KV pool bytes per rank", query(f"dsa_kv_pool_bytes{{{N}}}", "{{node}} {{rank}}", "A"),
        query(f"dsa_kv_cache_size_bytes{{{N}}}", "{{node}} dp{{dp_rank}}", "B"), unit="bytes"))
    dash = dash.with_panel(
        table.Panel().title("KV dtype and layout").datasource(ref).span(8).height(7)
        .with_target(query(f"dsa_kv_cache_info{{{N}}}", instant=True))
        .with_transformation(m.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True}})))
    dash = dash.with_panel(timeseries_panel(
        "KV tokens in use", query(f"sum by (node) (sglang:kv_used_tokens{{{N}}})", "{{node}} used", "A"),
        query(f"sum by (node) (sglang:kv_available_tokens{{{N}}})", "{{node}} available", "B"),
        desc="Token counts (the ratios are beside)").span(12))
    dash = dash.with_panel(timeseries_panel(
        "KV and mamba usage (ratio)", query(f"avg by (node) (sglang:token_usage{{{N}}})", "{{node}} KV", "A"),
        query(f"avg by (node) (sglang:mamba_usage{{{N}}})", "{{node}} mamba", "B"),
        unit="percentunit", minimum=0, maximum=1).span(12))

    # -- host memory ---------------------------------------------------------------------------
    dash = dash.with_row(dashboard.Row("Host memory (on GB10 also the GPU's)"))
    dash = dash.with_panel(timeseries_panel(
        "Memory", query(f"dsa_host_memory_available_bytes{{{N}}}", "{{node}} available", "A"),
        query(f"dsa_host_memory_free_bytes{{{N}}}", "{{node}} free", "B"),
        query(f"dsa_host_memory_total_bytes{{{N}}}", "{{node}} total", "C"),
        query(f"dsa_host_swap_free_bytes{{{N}}}", "{{node}} swap free", "D"), unit="bytes"))
    dash = dash.with_panel(timeseries_panel(
        "Memory pressure (PSI)", query(f"dsa_host_memory_pressure_ratio{{{N}}}", "{{node}} {{kind}} {{window}}"),
        unit="percentunit", minimum=0, maximum=1))
    dash = dash.with_panel(joined_table(
        "vm sysctls", "The memory sysctls the playbook sets, one row per node",
        [("min_free_kbytes", f"dsa_host_vm_min_free_kbytes{{{N}}}"),
         ("vfs_cache_pressure", f"dsa_host_vm_vfs_cache_pressure{{{N}}}")], ["node"]))

    # -- exporter and containers ---------------------------------------------------------------
    dash = dash.with_row(dashboard.Row("Exporter and containers"))
    dash = dash.with_panel(timeseries_panel(
        "Exporter errors by source",
        query(f"sum by (node, source) (rate(dsa_exporter_errors_total{{{N}}}[$__rate_interval]))", "{{node}} {{source}}"),
        unit="cps"))
    dash = dash.with_panel(timeseries_panel(
        "Exporter loop age", query(f"dsa_exporter_loop_age_seconds{{{N}}}", "{{node}} {{loop}}"), unit="s")
        .thresholds(steps((None, GREEN), (60, RED))))
    containers = joined_table(
        "Containers", "Docker's word on the server container, one row per node and container",
        [("running", f"dsa_container_running{{{N}}}"),
         ("restarts (1h)", f"increase(dsa_container_restarts_total{{{N}}}[1h])"),
         ("exit code", f"dsa_container_exit_code{{{N}}}"),
         ("OOM-killed", f"dsa_container_oom_killed{{{N}}}")], ["node", "container"])
    cell = m.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-background"})
    containers = containers.override_by_name("running", [
        m.DynamicConfigValue(id_val="mappings", value=[v.to_json() for v in up_words]),
        m.DynamicConfigValue(id_val="thresholds", value=up_steps.build().to_json()), cell])
    containers = containers.override_by_name("OOM-killed", [
        m.DynamicConfigValue(id_val="mappings", value=[v.to_json() for v in words((0, "no", GREEN), (1, "yes", RED))]),
        m.DynamicConfigValue(id_val="thresholds", value=steps((None, GREEN), (1, RED)).build().to_json()), cell])
    dash = dash.with_panel(containers)
    out = json.loads(json.dumps(dash.build(), cls=_encoder()))
    for i, panel in enumerate(out["panels"], 1):  # stable ids: links and provisioning refer to them
        panel["id"] = i
    return out


def _encoder():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return JSONEncoder


def render() -> str:
    return json.dumps(build(), indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed JSON differs from the code's")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is stale: run python -m dsaops.healthchecks.dashboard", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
