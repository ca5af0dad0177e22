# Kernels: GPU tests and benchmarks, the offline bundle a GPU host without network needs, and CPU
# compile checks. On the GPU host: its own python3 (torch, triton, numpy, pytest) + PYTHONPATH=. +
# the bundle's site folder, unpacked once into TILELANG_SITE (CONTRIBUTING.md).
GPU_PYTHON ?= python3
BUNDLE_DIR ?= .devbundle
BUNDLE_PYTHON ?= 3.12
BUNDLE_PLATFORM ?= x86_64
TILELANG_BUNDLE ?= $(BUNDLE_DIR)/site.tar.xz
TILELANG_SITE ?= /tmp/site
SGLANG_ROOT ?= $(BUNDLE_DIR)/sgl
GPU_ENV = PYTHONPATH=.:$(TILELANG_SITE)$${PYTHONPATH:+:$$PYTHONPATH} PYTHONUNBUFFERED=1

.PHONY: test-gpu bench selftest compile-check gpu-check gpu-site gpu-bundle
gpu-bundle: ## build .devbundle/ for a GPU host without network (BUNDLE_PYTHON=3.12 BUNDLE_PLATFORM=x86_64)
	bash kernels/offline-bundle.sh --python $(BUNDLE_PYTHON) --platform $(BUNDLE_PLATFORM) --out $(BUNDLE_DIR)

# Unpacks the bundle when TILELANG_SITE holds none or another one (BUNDLE names what is in it), beside
# it first: the site is replaced whole (no files of an older bundle left), or, if the unpack fails, kept.
# The site's parent folder is locked (flock), so a second make at once waits and finds the site unpacked.
gpu-site:
	@set -e; site='$(TILELANG_SITE:%/=%)'; \
	if [ -f '$(TILELANG_BUNDLE)' ]; then mkdir -p "$$(dirname "$$site")"; exec 9<"$$(dirname "$$site")"; flock 9; fi; \
	if [ -f '$(TILELANG_BUNDLE)' ] && ! cmp -s '$(BUNDLE_DIR)/BUNDLE' "$$site/BUNDLE"; then \
	  rmdir "$$site" 2>/dev/null || true; \
	  if [ -e "$$site" ] && [ ! -f "$$site/BUNDLE" ]; then \
	    echo "make gpu-site: TILELANG_SITE=$$site holds files no bundle put there; give a new or empty folder" >&2; \
	    exit 2; fi; \
	  rm -rf "$$site.partial"; mkdir -p "$$site.partial"; \
	  tar -xJf '$(TILELANG_BUNDLE)' -C "$$site.partial" --strip-components=1 || { rm -rf "$$site.partial"; exit 1; }; \
	  rm -rf "$$site"; mv "$$site.partial" "$$site"; fi

# Without a CUDA GPU pytest skips every GPU test and passes: the GPU targets stop first, in one line.
gpu-check:
	@$(GPU_PYTHON) -W ignore -c 'import importlib.util as u, sys; t = u.find_spec("torch") and __import__("torch"); \
	sys.exit(None if t and t.cuda.is_available() else "make $(MAKECMDGOALS): needs a CUDA GPU, and $(GPU_PYTHON) " \
	+ ("finds no torch" if not t else "sees no GPU") + ": run it on an H100/H200 host (CONTRIBUTING.md), or set GPU_PYTHON")'

test-gpu: gpu-check gpu-site ## kernel tests marked gpu (an H100/H200 host; CONTRIBUTING.md)
	$(GPU_ENV) $(GPU_PYTHON) -m pytest -m gpu tests/kernels -q -p no:cacheprovider $(PYTEST_ARGS)

bench: gpu-check gpu-site ## decode benchmarks on an H200 (FlashMLA from the bundle): benchmarks/h200-decode.json + PNG, then BENCHMARKS.md
	$(GPU_ENV) $(GPU_PYTHON) benchmarks/h200_decode.py --sglang-root $(SGLANG_ROOT) $(BENCH_ARGS)
	$(GPU_PYTHON) benchmarks/report.py

selftest: gpu-check gpu-site ## dsaops' decode checked and timed against SGLang's on this GPU, the routing verdict (SELFTEST_ARGS=--heads 64)
	$(GPU_ENV) $(GPU_PYTHON) -m dsaops kernels selftest --sglang-root $(SGLANG_ROOT) $(SELFTEST_ARGS)

compile-check: $(STAMP) ## compile every decode kernel for sm_90 and sm_121 (no GPU) and check shared memory
	$(VENV)/bin/dsaops kernels compile --target sm_90
	$(VENV)/bin/dsaops kernels compile --target sm_121
