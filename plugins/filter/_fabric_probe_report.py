# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _fabric_probe_report
short_description: Assemble every host's fabric probe into the all-pairs matrix
version_added: 0.1.0
description:
  - Takes each host's registered M(multinode.vllm.fabric_probe) result (phase V(probe)) and returns the
    matrix, the management reachability table, and every broken pair, each naming source, destination, address and cause.
  - A host with no result (failed earlier) makes all its pairs broken, so nothing is silently skipped.
  - A host whose fabric link is down (C(link_error) in its C(multinode_fabric) fact) is listed first.
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
  result_var:
    description: The name each host registered its probe result under.
    type: str
    default: __fabric_probe
"""

EXAMPLES = r"""
- name: Assemble the matrix
  ansible.builtin.set_fact:
    fabric_report: "{{ hostvars | multinode.vllm._fabric_probe_report(ansible_play_hosts_all, 'probe') }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: The report.
  type: dict
  contains:
    ok: {description: True when no pair is broken., type: bool}
    broken: {description: Broken pairs., type: list, elements: str}
    pairs: {description: "One row per ordered pair: src, dst, dst_fabric_ip, ok, rtt_ms, mtu_ok.", type: list, elements: dict}
    mgmt: {description: "One row per ordered pair: src, dst, address, reachable, detail.", type: list, elements: dict}
"""

from ansible_collections.multinode.vllm.plugins.module_utils._probe import assemble_report


def fabric_probe_report(hostvars, hosts, result_var="__fabric_probe"):
    results = {}
    link_errors = {}
    for host in hosts:
        value = hostvars[host].get(result_var)
        if value:
            results[str(host)] = dict(value)
        link_errors[str(host)] = (hostvars[host].get("multinode_fabric") or {}).get("link_error")
    return assemble_report(results, [str(h) for h in hosts], link_errors)


class FilterModule:
    def filters(self):
        return {"_fabric_probe_report": fabric_probe_report}
