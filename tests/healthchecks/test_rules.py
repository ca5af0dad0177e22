"""The alert rules: promtool checks them and runs their unit tests (fire and stay silent)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RULES = Path(__file__).resolve().parents[2] / "healthchecks" / "rules"
README = RULES.parent / "README.md"


def run(*args, cwd=None):
    return subprocess.run(args, check=False, capture_output=True, text=True, cwd=cwd, timeout=60)


def test_rules_check(promtool):
    for rules in RULES.glob("*.yml"):
        r = run(promtool, "check", "rules", str(rules))
        assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_pass(promtool):
    tests = sorted((RULES / "tests").glob("*.yml"))
    assert tests
    r = run(promtool, "test", "rules", *map(str, tests))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_test():
    alerts = set(re.findall(r"- alert: (\w+)", "".join(p.read_text() for p in RULES.glob("*.yml"))))
    tested = set(re.findall(r"alertname: (\w+)", "".join(p.read_text() for p in (RULES / "tests").glob("*.yml"))))
    assert alerts and alerts == tested


PLAN_JOIN = 'unless on (node, by) (dsa_concurrency_planned_binding == 1)'


def without_keep_firing(expr_end: str, wait: str) -> tuple[str, str]:
    """(right, wrong): the rule whose expression ends in expr_end, with and without its keep_firing_for."""
    rule = f"{expr_end}\n        for: {wait}\n"
    return rule + "        keep_firing_for: 2m\n", rule


@pytest.mark.parametrize("right,wrong,alert", [
    # the death alert made to need 5 deaths misses the one death
    ("increase(dsa_worker_deaths_total[10m]) > 0", "increase(dsa_worker_deaths_total[10m]) > 5", "DsaWorkerRankDied"),
    # the cap alert without the plan fires for the planned split; joined on node alone it misses the KV cap
    (PLAN_JOIN, "unless on (node, by) (vector(0) == 1)", "DsaConcurrencyCapped"),
    (PLAN_JOIN, PLAN_JOIN.replace("(node, by)", "(node)"), "DsaConcurrencyCapped"),
    # without keep_firing_for an exporter restart's missed scrape resolves the alert, which fires anew later
    (*without_keep_firing("expr: dsa_worker_up == 0", "1m"), "DsaWorkerRankDown"),
    (*without_keep_firing("expr: dsa_server_up == 0", "1m"), "DsaServerDown"),
    (*without_keep_firing(PLAN_JOIN, "5m"), "DsaConcurrencyCapped"),
    (*without_keep_firing("(0.95 * max by (node) (dsa_kv_pool_planned_tokens))", "2m"), "DsaKvPoolBelowPlan"),
    (*without_keep_firing("dsa_host_memory_available_bytes / dsa_host_memory_total_bytes < 0.05", "1m"),
     "DsaHostMemoryLow"),
    (*without_keep_firing('dsa_host_memory_pressure_ratio{kind="full", window="60s"} > 0.05', "2m"),
     "DsaHostMemoryPressure"),
], ids=["deaths-threshold", "cap-ignores-plan", "cap-joined-on-node", "down-resolved-by-a-missed-scrape",
        "server-down-resolved-by-a-missed-scrape", "cap-resolved-by-a-missed-scrape",
        "kv-pool-resolved-by-a-missed-scrape", "memory-low-resolved-by-a-missed-scrape",
        "memory-pressure-resolved-by-a-missed-scrape"])
def test_negative_control_a_wrong_rule_fails_the_tests(promtool, tmp_path, right, wrong, alert):
    """The unit tests can fail: each rule made wrong fails its alert's cases."""
    (tmp_path / "tests").mkdir()
    text = (RULES / "dsaops.yml").read_text()
    assert text.count(right) == 1  # the change touches that one rule
    (tmp_path / "dsaops.yml").write_text(text.replace(right, wrong))
    shutil.copy(RULES / "tests" / "dsaops_test.yml", tmp_path / "tests")
    r = run(promtool, "test", "rules", "tests/dsaops_test.yml", cwd=tmp_path)
    assert r.returncode != 0 and set(re.findall(r"alertname: (\w+), time:", r.stdout + r.stderr)) == {alert}


def test_every_metric_in_the_rules_is_documented():
    used = set(re.findall(r"\bdsa_\w+", (RULES / "dsaops.yml").read_text()))
    documented = set(re.findall(r"`(dsa_\w+)", README.read_text()))
    assert used <= documented, used - documented
