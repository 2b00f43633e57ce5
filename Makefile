# multinode.vllm: one entry point for setup, fast checks, the full test, the lab and the demo.
# `make check` is the fast inner loop; `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
COLLECTIONS := $(CURDIR)/.cache/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/multinode/vllm
# The docs tools (antsibull-docs, Sphinx) live in their own venv, pinned by requirements/docs.lock.
DOCS_VENV := $(CURDIR)/.cache/docs-venv
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)
# The repo root is the collection: import it as ansible_collections.multinode.vllm.
export PYTHONPATH := $(COLLECTIONS)

include lab/lab.mk
include lab/lab-runtime.mk

.PHONY: help setup system-deps check unit lint docs docs-lock sanity sanity-deps matrix matrix-lock build importer importer-lock test integration molecule lock clean demo demo-down bench lab-runtime

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

system-deps: lab-deps ## Install the Debian packages the lab needs (root; only what is missing)

$(BIN)/.stamp: requirements/controller.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/controller.lock
	touch $@

$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn $(CURDIR) $@

setup: $(BIN)/.stamp $(COLLECTION_LINK) ## Create .venv (pinned controller tools) and link the collection

lock: ## Re-pin requirements/controller.lock from requirements/controller.in
	rm -rf .cache/lockvenv && $(PYTHON) -m venv .cache/lockvenv
	.cache/lockvenv/bin/pip install -q -r requirements/controller.in
	{ echo '# Generated from requirements/controller.in with `pip freeze` (Python 3.11). Regenerate with `make lock`.'; \
	  .cache/lockvenv/bin/pip freeze; } > requirements/controller.lock

unit: setup ## Unit tests of module_utils, modules and filters
	$(BIN)/pytest -q tests/unit

# ANSIBLE_HOME: offline, ansible-lint reads collections from ~/.ansible first, where an installed copy of this
# collection may lie (stale once a role is added); a home of its own reads only the working tree.
lint: setup ## ansible-lint (production profile)
	ANSIBLE_HOME=$(CURDIR)/.cache/ansible-home $(BIN)/ansible-lint -q

check: unit lint ## The fast inner loop: unit tests and lint

$(DOCS_VENV)/.stamp: requirements/docs.lock
	rm -rf $(DOCS_VENV) && $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q --disable-pip-version-check -r requirements/docs.lock
	touch $@

docs: setup $(DOCS_VENV)/.stamp ## Lint the plugin/role docs (antsibull-docs) and build the docs site into .cache/docs-site (Sphinx -W, offline)
	tests/docs/run.sh $(DOCS_VENV)/bin $(BIN)

docs-lock: ## Re-pin requirements/docs.lock from requirements/docs.in
	rm -rf .cache/docs-lockvenv && $(PYTHON) -m venv .cache/docs-lockvenv
	.cache/docs-lockvenv/bin/pip install -q -r requirements/docs.in
	{ echo '# Generated from requirements/docs.in with `pip freeze` (Python 3.11). Regenerate with `make docs-lock`.'; \
	  .cache/docs-lockvenv/bin/pip freeze; } > requirements/docs.lock

# ansible-test sanity's shellcheck test is skipped, with a warning only, when shellcheck is missing.
SANITY_DEPS := shellcheck

sanity-deps: ## Install the Debian packages ansible-test sanity needs (shellcheck; root, only what is missing)
	@$(LAB_MK_DIR)/apt-install-missing.sh sanity-deps $(SANITY_DEPS)

sanity: setup sanity-deps ## ansible-test sanity on a copy of the collection
	tests/sanity/run.sh $(BIN)

# The other ansible-core releases meta/runtime.yml promises (requires_ansible ">=2.17.0"): one venv each,
# .cache/core-<version>, pinned by requirements/core-<version>.lock (the newest patch release; make matrix-lock).
# 2.19 is the controller's own (.venv): make check (pytest) and make sanity cover it; make matrix adds its
# ansible-test units. Each run works on its own copy of the collection (SANITY_WORKDIR), so none collide.
MATRIX_CORE := 2.17 2.18
CONTROLLER_CORE := 2.19

$(CURDIR)/.cache/core-%/bin/.stamp: requirements/core-%.lock
	rm -rf $(CURDIR)/.cache/core-$*
	$(PYTHON) -m venv $(CURDIR)/.cache/core-$*
	$(CURDIR)/.cache/core-$*/bin/pip install -q --disable-pip-version-check -r $<
	touch $@

matrix: setup sanity-deps $(foreach v,$(MATRIX_CORE),$(CURDIR)/.cache/core-$(v)/bin/.stamp) ## ansible-test units on ansible-core 2.17, 2.18, 2.19; ansible-test sanity on 2.17, 2.18
	@set -e; for v in $(MATRIX_CORE) $(CONTROLLER_CORE); do \
	  bin=$(CURDIR)/.cache/core-$$v/bin; [ "$$v" != $(CONTROLLER_CORE) ] || bin=$(BIN); \
	  echo "== make matrix: ansible-test units, ansible-core $$v"; \
	  ANSIBLE_TEST_COMMAND=units SANITY_WORKDIR=/var/tmp/multinode-vllm-units-$$v tests/sanity/run.sh $$bin; \
	done
	@set -e; for v in $(MATRIX_CORE); do \
	  echo "== make matrix: ansible-test sanity, ansible-core $$v"; \
	  SANITY_WORKDIR=/var/tmp/multinode-vllm-sanity-$$v tests/sanity/run.sh $(CURDIR)/.cache/core-$$v/bin; \
	done
	@echo "make matrix: ansible-core $(MATRIX_CORE) $(CONTROLLER_CORE) passed"

matrix-lock: ## Re-pin requirements/core-2.17.lock, core-2.18.lock (newest patch release, plus core-matrix.in)
	set -e; for v in $(MATRIX_CORE); do \
	  rm -rf .cache/core-lockvenv && $(PYTHON) -m venv .cache/core-lockvenv; \
	  .cache/core-lockvenv/bin/pip install -q "ansible-core~=$$v.0" -r requirements/core-matrix.in; \
	  { echo "# Generated by \`make matrix-lock\`: ansible-core~=$$v.0 (the newest patch pip offers) and requirements/core-matrix.in, \`pip freeze\` (Python 3.11)."; \
	    .cache/core-lockvenv/bin/pip freeze; } > requirements/core-$$v.lock; \
	done; rm -rf .cache/core-lockvenv

build: setup ## Build the collection tarball (kept in .cache/dist), install it into a fresh collections path, check its file list
	tests/build/run.sh $(BIN)

# galaxy-importer pins its own ansible-core and ansible-lint: its own venv, pinned by requirements/importer.lock.
IMPORTER_VENV := $(CURDIR)/.cache/importer-venv

$(IMPORTER_VENV)/.stamp: requirements/importer.lock
	rm -rf $(IMPORTER_VENV) && $(PYTHON) -m venv $(IMPORTER_VENV)
	$(IMPORTER_VENV)/bin/pip install -q --disable-pip-version-check -r requirements/importer.lock
	touch $@

importer: build $(IMPORTER_VENV)/.stamp ## galaxy-importer on the built tarball (offline, no ansible-test); fails on any error or warning
	tests/build/importer.sh $(IMPORTER_VENV)/bin

importer-lock: ## Re-pin requirements/importer.lock from requirements/importer.in
	rm -rf .cache/importer-lockvenv && $(PYTHON) -m venv .cache/importer-lockvenv
	.cache/importer-lockvenv/bin/pip install -q -r requirements/importer.in
	{ echo '# Generated from requirements/importer.in with `pip freeze` (Python 3.11). Regenerate with `make importer-lock`.'; \
	  .cache/importer-lockvenv/bin/pip freeze; } > requirements/importer.lock

lab-runtime: lab-venv lab-model ## Build the lab's node venv (Ray, vLLM CPU) and the tiny model (cached)

integration: setup system-deps lab-runtime ## Lab tests and integration tests over the lab (root)
	$(BIN)/pytest -q -p no:cacheprovider tests/lab tests/integration

molecule: setup system-deps lab-runtime ## The molecule scenario(s) over the lab
	cd $(CURDIR) && $(BIN)/molecule test --all

test: check docs sanity matrix build importer integration molecule ## Everything CI runs
	@$(LABCTL) down >/dev/null
	@echo "make test: all passed"

clean: ## Remove the venv and caches (not the lab; see lab-down / lab-clean)
	rm -rf $(VENV) .cache .pytest_cache tests/output

BACKEND ?= ray
demo: setup system-deps lab-runtime ## Lab up, deploy + serve the tiny model (TP=2, BACKEND=ray|native), print a completion; stays up
	$(LABCTL) up 2
	set -o pipefail; $(BIN)/ansible-playbook -i inventories/lab playbooks/deploy.yml -e vllm_backend=$(BACKEND) \
	  | tee .cache/demo.log
	@echo; echo "== make demo ($(BACKEND)): node table, one completion, tokens/s =="
	@sed -n '/TASK \[Show the node table\]/,/^$$/p;/TASK \[Show one completion/,/^$$/p' .cache/demo.log \
	  | grep -vE '^(TASK|ok:| +msg:|$$)'
	@echo "Try it: curl -s http://198.19.1.10:8000/v1/completions -H 'Content-Type: application/json' \\"
	@echo "  -H \"Authorization: Bearer \$$(cat ~/.config/multinode-vllm/spark1-vllm-api-key)\" \\"
	@echo "  -d '{\"model\": \"tiny\", \"prompt\": \"Hello\", \"max_tokens\": 16}'     (make demo-down when done)"

demo-down: ## Tear down what demo started (serve, Ray), then the lab
	-$(BIN)/ansible-playbook -i inventories/lab playbooks/teardown.yml
	$(LABCTL) down

bench: setup system-deps lab-runtime ## Serve benchmark on the lab (collection vs hand-launched); writes docs/benchmarks.md (section Serve)
	tests/bench/bench_serve.sh
