# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _distributed_preflight_report
short_description: The cluster's verdict from every node's distributed preflight result
version_added: 0.1.0
description:
  - Reads each host's registered M(multinode.vllm.distributed_preflight) return and builds the messages the
    preflight fails with, the cause first, naming the host pair, the rendezvous address and port and the
    interface each side tried.
  - Also checks the environment carry-over hazard, NCCL_*/UCX_* values that differ between hosts must be listed
    in vLLM's C(ray_non_carry_over_env_vars.json) on the head.
  - With O(min_busbw_gbps), fails when the slowest rank's all-reduce busbw is below it, naming the likely causes
    in order (one HCA only, MTU 1500, GID type, NCCL build) with what each host's C(multinode_fabric), NCCL log
    and NCCL_* environment show for each.
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
  head:
    description: The head's inventory name.
    type: str
    required: true
  result_var:
    description: The name each host registered its result under.
    type: str
    default: __distributed_preflight
  timeout:
    description: The preflight deadline in seconds (for messages).
    type: float
  min_busbw_gbps:
    description: The all-reduce busbw floor in GB/s; V(0) or null is off.
    type: float
  size_mib:
    description: The timed all-reduce's size in MiB (for messages).
    type: float
"""

EXAMPLES = r"""
- name: Assemble the cluster's verdict
  ansible.builtin.set_fact:
    report: "{{ hostvars | multinode.vllm._distributed_preflight_report(ansible_play_hosts_all, groups['ray_head'][0]) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: The report.
  type: dict
  contains:
    ok: {description: True when every rank passed and no hazard was found., type: bool}
    problems: {description: "Messages, the cause first.", type: list, elements: str}
    bandwidth: {description: "The slowest rank's all-reduce: host, bytes, seconds_per_op, algbw_GBps, busbw_GBps.", type: dict}
    ranks: {description: One summary row per host., type: list, elements: dict}
    elapsed: {description: The slowest rank's seconds., type: float}
    summary: {description: One line per rank and one for the bandwidth., type: list, elements: str}
"""

from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import assemble_report


def distributed_preflight_report(hostvars, hosts, head, result_var="__distributed_preflight", timeout=None,
                                 min_busbw_gbps=None, size_mib=None):
    returns = {}
    interfaces = {}
    fabrics = {}
    for host in hosts:
        value = hostvars[host].get(result_var)
        returns[str(host)] = dict(value) if value and not value.get("skipped") else None
        fabric = hostvars[host].get("multinode_fabric") or {}
        interfaces[str(host)] = fabric.get("interface")
        fabrics[str(host)] = dict(fabric)
    return assemble_report(returns, str(head), interfaces, timeout,
                           min_busbw_gbps=float(min_busbw_gbps) if min_busbw_gbps else None, fabrics=fabrics,
                           size_mib=size_mib)


class FilterModule:
    def filters(self):
        return {"_distributed_preflight_report": distributed_preflight_report}
