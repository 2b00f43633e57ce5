# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _serve_memory_plan
short_description: The cluster's gpu_memory_utilization on unified-memory hosts, and whether the model fits
version_added: 0.1.0
description:
  - Reads every host's C(multinode_memory) fact (module C(multinode.vllm.memory_facts)). When no host is unified
    memory, returns O(utilization) unchanged and nothing else.
  - On unified-memory hosts (a DGX Spark's GB10), unless O(utilization) is set, derives it as the smallest
    C((MemAvailable - reserve) / MemTotal) of those hosts, rounded down to 0.01, or keeps the value the running vllm
    serve was started with (O(running)). Then every unified host must hold its share of the model's weights plus
    O(kv_reserve) per rank within C(utilization x MemTotal), and a value the user set must leave O(reserve) of
    MemAvailable free.
  - Returns C(gpu_memory_utilization), C(derived), C(unified_hosts), C(errors), C(warnings) and C(lines).
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: The cluster hosts.
    type: list
    elements: str
    required: true
  utilization:
    description: C(vllm_gpu_memory_utilization), the user's value; null to derive it on unified-memory hosts.
    type: float
  reserve:
    description: C(serve_memory_reserve_bytes), bytes of MemAvailable left to the host.
    type: int
    required: true
  kv_reserve:
    description: C(serve_kv_cache_reserve_bytes), bytes of KV cache per rank the model must leave room for.
    type: int
    required: true
  model_bytes:
    description: Bytes of the model directory (null when unknown, which skips the fit check).
    type: int
  model_path:
    description: The model, named in messages.
    type: str
    default: ""
  world_size:
    description: Tensor parallel size x pipeline parallel size.
    type: int
    required: true
  gpus_per_node:
    description: GPUs vLLM uses on each node.
    type: int
    default: 1
  running:
    description: The C(--gpu-memory-utilization) of the running vllm serve (the head's), or null.
    type: float
  serve_running:
    description: The cluster's vllm serve runs (on the head); default, when O(running) is set.
    type: bool
"""

EXAMPLES = r"""
- name: Plan vLLM's memory on unified-memory hosts
  ansible.builtin.set_fact:
    __plan: >-
      {{ hostvars | multinode.vllm._serve_memory_plan(ansible_play_hosts_all, utilization=vllm_gpu_memory_utilization,
         reserve=serve_memory_reserve_bytes, kv_reserve=serve_kv_cache_reserve_bytes, world_size=2) }}
  run_once: true
"""

RETURN = r"""
_value:
  description: C(gpu_memory_utilization) (null leaves vLLM's default), C(derived), C(unified_hosts), C(errors),
    C(warnings) and C(lines) (one message each).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.multinode.vllm.plugins.module_utils._memory import MemoryPlanError, memory_plan


def _number(value, cast):
    return None if value is None or value == "" else cast(value)


def serve_memory_plan(hostvars, hosts, utilization=None, reserve=0, kv_reserve=0, model_bytes=None, model_path="",
                      world_size=1, gpus_per_node=1, running=None,
                      serve_running=None):
    nodes = {}
    for host in hosts:
        facts = hostvars[host].get("multinode_memory") if host in hostvars else None
        if not facts:
            raise AnsibleFilterError("%s: no multinode_memory fact; run multinode.vllm.memory_facts on every host "
                                     "first (the serve role does)" % host)
        nodes[str(host)] = facts
    try:
        return memory_plan(nodes, _number(utilization, float), int(reserve), int(kv_reserve),
                           _number(model_bytes, int), int(world_size), int(gpus_per_node),
                           running_utilization=_number(running, float), model_path=str(model_path or ""),
                           serve_running=None if serve_running is None else boolean(serve_running, strict=False))
    except (MemoryPlanError, ValueError, TypeError) as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"_serve_memory_plan": serve_memory_plan}
