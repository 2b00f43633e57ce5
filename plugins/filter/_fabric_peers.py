# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _fabric_peers
short_description: The peers one host probes, from every host's fabric facts
version_added: 0.1.0
description:
  - Returns, for every cluster host other than O(me), its name, fabric address and management address.
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
  me:
    description: The probing host.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Peers of this host
  ansible.builtin.set_fact:
    peers: "{{ hostvars | multinode.vllm._fabric_peers(ansible_play_hosts_all, inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: One entry per peer with C(host), C(fabric_ip) and C(mgmt_ip).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._probe import peer_list


def fabric_peers(hostvars, hosts, me):
    facts = {}
    for host in hosts:
        fact = hostvars[host].get("multinode_fabric")
        if not fact:
            raise AnsibleFilterError("%s has no fabric facts; run multinode.vllm.fabric_facts on it first" % host)
        facts[str(host)] = dict(fact)
    return peer_list(facts, str(me))


class FilterModule:
    def filters(self):
        return {"_fabric_peers": fabric_peers}
