# dsaops: `make` lists the targets. Each area adds its own in <area>/*.mk.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A CPU build of torch for the test venv (this machine's pip takes it from local disk). The
# kernels extra brings the pinned TileLang: the CPU tests compile the decode kernels with nvcc.
TORCH ?= torch==2.13.0
TEST_REQS := $(sort $(wildcard tests/requirements/*.txt))
STAMP := $(VENV)/.installed
SETUP_STAMP := $(VENV)/.setup
export DSAOPS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/dsaops

.PHONY: help setup venv test lint
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'
	@echo "  variables: ARCH=sm_90|sm_121|gfx942  TAG=  REGISTRY= (default: \$$DSAOPS_REGISTRY)  PUSH=1  INVENTORY=playbooks/inventories/local.yml"

$(STAMP): pyproject.toml $(TEST_REQS)
	@echo "== creating $(VENV) (torch CPU, the project and its test needs)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,exporter,deploy,kernels]' $(addprefix -r ,$(TEST_REQS))
	touch $@

# The tools a user runs (dsaops, ansible-playbook): the project in editable mode with its deploy extra.
$(SETUP_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "dsaops needs Python 3.11 or newer: make setup PYTHON=python3.12")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[deploy]'
	touch $@

setup: $(SETUP_STAMP) ## dsaops and ansible-playbook in .venv; then `. .venv/bin/activate` puts them on PATH
	@echo "== ready: run \`. $(VENV)/bin/activate\` to put dsaops and ansible-playbook on your PATH"

venv: $(STAMP) ## create or refresh the test environment (.venv with the test tools; make test does it)

# One run on two workers (pytest-xdist, --dist loadgroup): the tests outside tests/playbooks go to one worker
# in turn (tests/conftest.py says why), the playbook tests, mostly Ansible's own work a task over SSH, to
# the other, and to both once the first is through. PYTEST_ARGS: the same run with them added.
TEST_WORKERS ?= 2
# The tests start Python thousands of times (an Ansible worker a task and host, each `python -m dsaops`): an
# environment's PYTHONDONTWRITEBYTECODE would have every one compile the checkout and SGLang's source again.
test: export PYTHONDONTWRITEBYTECODE :=
test: $(STAMP) ## run the CPU test suite (what CI runs)
	$(PY) -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP) ## ruff over the Python code
	$(VENV)/bin/ruff check .

-include $(sort $(wildcard */*.mk))
