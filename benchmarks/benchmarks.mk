# Benchmarks: BENCHMARKS.md is generated from benchmarks/*.json (the standard library alone runs it).
.PHONY: benchmarks-md
benchmarks-md: ## BENCHMARKS.md from benchmarks/*.json (after a benchmark writes its JSON)
	$(PYTHON) benchmarks/report.py
