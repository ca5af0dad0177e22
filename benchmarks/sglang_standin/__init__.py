"""SGLang 0.5.23 stood in where it cannot run (no GPU): its log lines (log_lines), its /server_info
and /health and its scheduler processes (server, launcher). The exporter's benchmark drives the
exporter with it, and the healthchecks tests share it; tests/healthchecks/test_contract.py holds
the log lines to the pinned wheel's own format strings.
"""
