# Network-namespace lab (docs/lab.md). Included by the root Makefile; also
# works standalone: `make -f lab/lab.mk lab-up LAB_NODES=4`.
# Every variable and target here is prefixed LAB_/lab- to stay out of the
# including Makefile's way.

LAB_MK_DIR := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
LAB_REPO_ROOT := $(abspath $(LAB_MK_DIR)/..)
LABCTL := $(LAB_MK_DIR)/labctl

# Where the lab lives (run/ is runtime state, cache/ is kept across lab-down).
LAB_ROOT ?= /var/lib/multinode-vllm-lab
# Number of simulated nodes spark1..sparkN.
LAB_NODES ?= 2
# The inventory in use: the one `labctl up N` generated (N != 2), else the
# static 2-node one. Recursively expanded, so it is right after lab-up too.
LAB_INVENTORY ?= $(if $(wildcard $(LAB_ROOT)/run/inventory/hosts.yml),$(LAB_ROOT)/run/inventory,$(LAB_REPO_ROOT)/inventories/lab)
export LAB_ROOT LAB_NODES LAB_INVENTORY

LAB_DEPS := openssh-server openssh-client iproute2 nftables procps util-linux
# The docker kind: Debian's Docker engine (a daemon per node), debootstrap for the node image, and requests on the
# nodes' system Python (community.docker's modules talk to the daemon's API with it).
LAB_DEPS += docker.io debootstrap python3-requests
LAB_ANSIBLE ?= $(or $(wildcard $(LAB_REPO_ROOT)/.venv/bin/ansible),$(shell command -v ansible 2>/dev/null),$(wildcard /tmp/cvenv/bin/ansible),ansible)
LAB_PYTEST ?= $(if $(wildcard $(LAB_REPO_ROOT)/.venv/bin/pytest),$(LAB_REPO_ROOT)/.venv/bin/pytest,python3 -m pytest)

.PHONY: lab-deps lab-up lab-down lab-status lab-clean lab-ping lab-test lab-bench lab-inventory

lab-deps: ## Install the lab's Debian packages if missing (root, apt)
	@$(LAB_MK_DIR)/apt-install-missing.sh lab-deps $(LAB_DEPS)

lab-up: lab-deps ## Bring the lab up (LAB_NODES=N, default 2); idempotent
	@$(LABCTL) up $(LAB_NODES)

lab-down: ## Tear the lab down: namespaces, links, processes, mounts, LAB_ROOT/run (idempotent)
	@$(LABCTL) down

lab-status: ## Show nodes, addresses, sshd and faults (exit 0 up, 1 degraded, 3 down)
	@$(LABCTL) status

lab-clean: ## lab-down, then remove LAB_ROOT entirely, cache (node venv, models) included
	@$(LABCTL) clean

lab-inventory: ## Print the inventory in use
	@echo $(LAB_INVENTORY)

lab-ping: ## ansible ping every lab node through the inventory in use
	$(LAB_ANSIBLE) -i $(LAB_INVENTORY) all -m ansible.builtin.ping

lab-test: ## Integration tests of the lab itself (root; tears the lab down at the end)
	$(LAB_PYTEST) -q $(LAB_REPO_ROOT)/tests/lab

lab-bench: ## Measure lab-up time (2 and 16 nodes) and idle node memory
	@$(LAB_MK_DIR)/bench_lab.sh
