# Lab node runtime: the node venv (vLLM CPU + Ray + supervisor) and the tiny model.
#
# Standalone:  make -f lab/lab-runtime.mk lab-venv lab-model
# Included:    include lab/lab-runtime.mk   (from the root Makefile)
#
# Overridable (make VAR=... or environment):
#   LAB_CACHE_DIR   /var/lib/multinode-vllm-lab/cache
#   LAB_NODE_VENV   $(LAB_CACHE_DIR)/node-venv            (NODE_VENV for the script)
#   LAB_MODEL_DIR   $(LAB_CACHE_DIR)/models/tiny-qwen2
#   LAB_PYTHON      python3.11                             (interpreter for the venv)
#
# Both targets are idempotent and cheap when up to date: build-node-venv.sh
# checks its stamp (sha256 of requirements/node.lock, the script, the lab
# platform fixture, the interpreter version); make-tiny-model.py checks its
# completion marker.

# Directory of this fragment, fixed at include time (works from any CWD).
LAB_RUNTIME_MK_DIR := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
LAB_RUNTIME_REPO_ROOT := $(abspath $(LAB_RUNTIME_MK_DIR)/..)

LAB_CACHE_DIR ?= /var/lib/multinode-vllm-lab/cache
LAB_NODE_VENV ?= $(LAB_CACHE_DIR)/node-venv
LAB_MODEL_DIR ?= $(LAB_CACHE_DIR)/models/tiny-qwen2
LAB_PYTHON ?= python3.11

.PHONY: lab-venv lab-model lab-image

lab-venv:
	NODE_VENV='$(LAB_NODE_VENV)' PYTHON='$(LAB_PYTHON)' '$(LAB_RUNTIME_REPO_ROOT)/lab/build-node-venv.sh'

lab-model: lab-venv
	PYTHONDONTWRITEBYTECODE=1 '$(LAB_NODE_VENV)/bin/python' '$(LAB_RUNTIME_REPO_ROOT)/lab/make-tiny-model.py' '$(LAB_MODEL_DIR)'

# The docker kind's node image (Debian 12 rootfs from debootstrap + this venv's pinned set, built inside it), as a
# `docker save` archive under $(LAB_CACHE_DIR)/node-image/<inputs hash>; labctl loads it into each node's daemon.
lab-image:
	LAB_ROOT='$(abspath $(LAB_CACHE_DIR)/..)' '$(LAB_RUNTIME_REPO_ROOT)/lab/build-node-image.py'
