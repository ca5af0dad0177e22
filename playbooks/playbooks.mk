# Deployment targets (playbooks/). INVENTORY: a file or a name in playbooks/inventories.
INVENTORY ?= playbooks/inventories/local.yml
DEPLOY_ARGS ?=

.PHONY: deploy deploy-plan deploy-commands playbooks-lint
deploy: $(SETUP_STAMP) ## deploy SGLang serving with playbooks/cluster.yml (INVENTORY=...)
	$(PY) -m dsaops deploy -i $(INVENTORY) $(DEPLOY_ARGS)

deploy-plan: $(SETUP_STAMP) ## dry run: each node's server command, then what cluster.yml would change (--check)
	$(PY) -m dsaops deploy -i $(INVENTORY) --print-commands $(DEPLOY_ARGS)
	$(PY) -m dsaops deploy -i $(INVENTORY) --check $(DEPLOY_ARGS)

deploy-commands: $(SETUP_STAMP) ## print each node's server command and environment, touching no host (DEPLOY_ARGS='-e dsaops_target=sm_90' for an inventory that says auto)
	$(PY) -m dsaops deploy -i $(INVENTORY) --print-commands $(DEPLOY_ARGS)

playbooks-lint: $(STAMP) ## ansible-lint (production profile) and --syntax-check for every inventory
	cd playbooks && ANSIBLE_CONFIG=../ansible.cfg PATH=$(abspath $(VENV))/bin:$$PATH ansible-lint --profile production --offline
	for i in playbooks/inventories/*.yml; do ANSIBLE_CONFIG=ansible.cfg $(VENV)/bin/ansible-playbook -i $$i playbooks/cluster.yml --syntax-check || exit 1; done
