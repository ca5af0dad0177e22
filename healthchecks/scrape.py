"""The scrape job name, in one place: the packaged alert rules (`rules/*.yml`).

`DsaExporterDown` selects `up{job="…"}`; the playbook's Prometheus configuration takes its job
name from there (the dsaops_exporter_job filter), and so do the tests' Prometheus servers, so a
rule and a scrape configuration cannot name two different jobs.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parent / "rules"
_UP_JOB = re.compile(r'\bup\{[^}]*\bjob="([^"]+)"')


def exporter_job(rule_files: list[str] | None = None) -> str:
    """The one job name `up{job=…}` selects across the rule files (default: the packaged ones)."""
    jobs = set()
    for path in rule_files or sorted(map(str, RULES.glob("*.yml"))):
        for group in (yaml.safe_load(Path(path).read_text()) or {}).get("groups", []):
            for rule in group.get("rules", []):
                jobs.update(_UP_JOB.findall(str(rule.get("expr", ""))))
    if len(jobs) != 1:
        raise ValueError(f"the alert rules must select exactly one scrape job in up{{job=...}}, found {sorted(jobs)}")
    return jobs.pop()
