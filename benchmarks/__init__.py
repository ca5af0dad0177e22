"""Benchmark scripts (run as files; results in BENCHMARKS.md) and the SGLang stand-in they share with the tests."""
