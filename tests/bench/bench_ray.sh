#!/usr/bin/env bash
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Ray verify and idempotent deploy on the 2-node lab (docs/benchmarks.md).
# Root, from the repo root:  tests/bench/bench_ray.sh     (RUNS=3 by default)
# Brings the lab up, deploys once (cold), times verify.yml and the deploy
# re-run RUNS times each (median), then the incident's verify, then tears down
# and leaves the lab down.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
export ANSIBLE_CONFIG=$PWD/ansible.cfg PYTHONPATH=$PWD/.cache/collections
PB=(.venv/bin/ansible-playbook -i inventories/lab)
# The Ray part of deploy.yml (serving has its own benchmark, make bench); the firewall and the bind audit stay on.
NO_SERVE=(-e '{"serve_enabled": false}')
# verify.yml as issue #4 defines it: the fabric preflight and the Ray verify (the rendezvous proof and the bind
# audit, added later, are timed in the full verify.yml row).
RAY_GATE=(-e '{"distributed_preflight_enabled": false, "bind_audit_enabled": false}')
RAY=/var/lib/multinode-vllm-lab/cache/node-venv/bin/ray

t() { local s e; s=$(date +%s.%N); "$@" >/tmp/bench_ray.out 2>&1 || echo "rc=$? ($*)" >&2; e=$(date +%s.%N); echo "$e - $s" | bc; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

lab/labctl up 2 >/dev/null
"${PB[@]}" playbooks/teardown.yml >/dev/null
cold=$(t "${PB[@]}" playbooks/deploy.yml "${NO_SERVE[@]}")
verify=(); verify_full=(); redeploy=()
for _ in $(seq "$RUNS"); do verify+=("$(t "${PB[@]}" playbooks/verify.yml "${RAY_GATE[@]}")"); done
for _ in $(seq "$RUNS"); do verify_full+=("$(t "${PB[@]}" playbooks/verify.yml)"); done
for _ in $(seq "$RUNS"); do redeploy+=("$(t "${PB[@]}" playbooks/deploy.yml "${NO_SERVE[@]}")"); done
grep -q 'changed=0' /tmp/bench_ray.out && grep -q 'the last pass still holds' /tmp/bench_ray.out \
  && idem="changed=0, preflight pass reused" || idem="NOT idempotent"
grep -E '^spark[12] +:' /tmp/bench_ray.out >&2 || true

# The incident by hand, then verify (expected to fail, naming spark1).
"${PB[@]}" playbooks/teardown.yml >/dev/null
lab/labctl exec spark1 -- "$RAY" start --head --port 6379 --num-gpus 1 >/dev/null 2>&1
lab/labctl exec spark2 -- "$RAY" start --address 198.18.200.12:6379 --node-ip-address 198.18.200.13 --num-gpus 1 >/dev/null 2>&1
incident=$(t "${PB[@]}" playbooks/verify.yml "${RAY_GATE[@]}")
grep -q 'spark1: Ray registered this node as 198.19.1.10' /tmp/bench_ray.out && caught=yes || caught=NO
"${PB[@]}" playbooks/teardown.yml >/dev/null
lab/labctl down >/dev/null

echo "date: $(date -u +%Y-%m-%dT%H:%M:%S) UTC; $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| measurement | median | runs |"
echo "|---|---|---|"
echo "| deploy.yml, cold (Ray not running) | ${cold} s | 1 |"
echo "| verify.yml, Ray gate (fabric preflight + Ray verify), healthy 2-node cluster | $(median "${verify[@]}") s | ${verify[*]} |"
echo "| verify.yml, all of it (+ distributed preflight with the Ray-placed check, + bind audit) | $(median "${verify_full[@]}") s | ${verify_full[*]} |"
echo "| deploy.yml re-run, Ray part ($idem) | $(median "${redeploy[@]}") s | ${redeploy[*]} |"
echo "| verify.yml on the incident (fails, names spark1: $caught) | ${incident} s | 1 |"
