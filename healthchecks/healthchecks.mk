# healthchecks: the exporter's rules and benchmark (`make test` runs the tests).
.PHONY: rules-test bench-exporter dashboards

rules-test: ## promtool check and unit-test the alert rules (needs Debian's prometheus package)
	promtool check rules healthchecks/rules/*.yml
	promtool test rules healthchecks/rules/tests/*.yml

dashboards: $(STAMP) ## regenerate healthchecks/dashboards/dsaops.json from healthchecks/dashboard.py
	$(PY) -m dsaops.healthchecks.dashboard

bench-exporter: $(STAMP) ## exporter scrape latency (8 ranks, 1 GiB log) and steady CPU: benchmarks/exporter-cpu.json
	$(PY) benchmarks/bench_exporter.py
	$(PYTHON) benchmarks/report.py

