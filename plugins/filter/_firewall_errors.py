# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _firewall_errors
short_description: Every problem in one host's firewall input (empty when it can be rendered)
version_added: 0.1.0
description:
  - Checks the firewall spec of one host (interfaces, fabric_cidr, the cluster nodes' fabric addresses, ports,
    extra sources) and returns one message per problem, each naming the host, the value, what was expected and the fix.
  - The role runs it on every host, then fails once listing them all, before any host changes.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description:
      - The spec. Keys C(host), C(fabric_interface), C(fabric_cidr), C(cluster_hosts), C(mgmt_interface),
        C(mgmt_allow_tcp), C(controller_port), C(allow_sources), C(allow_icmp), C(log_drops), C(log_rate).
    type: dict
    required: true
  hostvars:
    description: C(hostvars), to find each cluster node's fabric address (C(multinode_fabric.ip), else C(fabric_ip)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Check this host's firewall input
  ansible.builtin.set_fact:
    firewall_problems: "{{ spec | multinode.vllm._firewall_errors(hostvars) }}"
"""

RETURN = r"""
_value:
  description: One message per problem; empty when the spec is good.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._firewall import check_spec, spec_data


def firewall_errors(spec, hostvars):
    return check_spec(spec_data(spec, hostvars))[1]


class FilterModule:
    def filters(self):
        return {"_firewall_errors": firewall_errors}
