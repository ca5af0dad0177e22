# Kernels: GPU tests and benchmarks (on the H200 machine, nothing installed) and CPU compile checks.
# On the GPU machine: its own python3 (torch, triton, pytest) + PYTHONPATH=. + the TileLang bundle
# that ../shared/tools/gpu-tilelang-bundle.sh writes to .devbundle/ (unpacked once into /tmp/site).
GPU_PYTHON ?= python3
TILELANG_BUNDLE ?= .devbundle/site.tar.xz
TILELANG_SITE ?= /tmp/site
SGLANG_ROOT ?= .devbundle/sgl
GPU_ENV = PYTHONPATH=.:$(TILELANG_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1

.PHONY: test-gpu bench compile-check gpu-site
gpu-site:
	@if [ ! -d $(TILELANG_SITE)/tilelang ] && [ -f $(TILELANG_BUNDLE) ]; then \
	  mkdir -p $(TILELANG_SITE) && tar -xJf $(TILELANG_BUNDLE) -C $(dir $(TILELANG_SITE)); fi

test-gpu: gpu-site ## kernel tests marked gpu (run on the H200 machine)
	$(GPU_ENV) $(GPU_PYTHON) -m pytest -m gpu tests/kernels -q -p no:cacheprovider $(PYTEST_ARGS)

bench: gpu-site ## decode + KV copy benchmarks on the H200: writes benchmarks/h200-decode.json
	$(GPU_ENV) $(GPU_PYTHON) benchmarks/h200_decode.py --sglang-root $(SGLANG_ROOT) $(BENCH_ARGS)

compile-check: $(STAMP) ## compile every decode kernel for sm_90 and sm_121 (no GPU) and check shared memory
	$(VENV)/bin/dsaops kernels compile --target sm_90
	$(VENV)/bin/dsaops kernels compile --target sm_121
