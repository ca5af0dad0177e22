# Images: `make image ARCH=sm_121` builds the serving image; `make image-plan` prints the command.
# Both run `dsaops image`, which takes every target fact from dsaops/targets.toml. No venv is
# required: without .venv the system python3 (>= 3.11, with pip) runs the source checkout.
ARCH ?=
TAG ?=
# The registry prefix: DSAOPS_REGISTRY in the environment, which the playbooks' dsaops_image_registry
# reads too, so the deploy runs the image this built; REGISTRY= overrides it for one build.
REGISTRY ?= $(DSAOPS_REGISTRY)
PUSH ?=
BASE ?=
IMAGE_PY := $(if $(wildcard $(PY)),$(PY),PYTHONPATH=. $(PYTHON))
IMAGE_OPTS = --arch "$(ARCH)" $(if $(TAG),--tag "$(TAG)") $(if $(REGISTRY),--registry "$(REGISTRY)") \
	$(if $(filter 1 yes true,$(PUSH)),--push) $(if $(BASE),--base "$(BASE)")

.PHONY: image image-plan image-base
image: ## build the serving image for ARCH=sm_90|sm_121|gfx942 (TAG=, REGISTRY=, PUSH=1, BASE=standin)
	@$(IMAGE_PY) -m dsaops image build $(IMAGE_OPTS)

image-plan: ## print the exact image build command for ARCH= without building
	@$(IMAGE_PY) -m dsaops image plan $(IMAGE_OPTS)

image-base: ## a stand-in base for ARCH= here (no registry; images/README.md), for make image BASE=standin
	@$(IMAGE_PY) -m dsaops image base --arch "$(ARCH)"
