# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _fabric_cluster_errors
short_description: Cluster-wide fabric checks over every host
version_added: 0.1.0
description:
  - Without facts (before touching any host), checks the inventory alone, exactly one host in C(ray_head);
    C(fabric_cidr) valid; every C(fabric_ip) inside it and unique.
  - With every host's C(multinode_fabric) fact, also checks that fabric addresses are unique and on one subnet,
    that MTUs are equal, and that the inventory's C(fabric_ip) is what each host really carries; with
    O(expected_mtu), that every endpoint of every host's fabric port (both halves on a DGX Spark) has that MTU.
  - Returns the list of error messages; empty means the cluster is consistent.
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
  head_hosts:
    description: The hosts in group C(ray_head).
    type: list
    elements: str
    required: true
  fabric_cidr:
    description: The fabric subnet.
    type: str
    required: true
  use_facts:
    description: Include the checks that need each host's C(multinode_fabric) fact.
    type: bool
    default: true
  expected_mtu:
    description:
      - The MTU every endpoint of the fabric port must have on every host (C(fabric_expected_mtu)); null skips the
        check. Needs the facts.
    type: int
"""

EXAMPLES = r"""
- name: Check the inventory before touching hosts
  ansible.builtin.assert:
    that: __errors | length == 0
    fail_msg: "{{ __errors | join('; ') }}"
  vars:
    __errors: "{{ hostvars | multinode.vllm._fabric_cluster_errors(ansible_play_hosts_all, groups['ray_head'] | default([]),
                 fabric_cidr, use_facts=false) }}"
"""

RETURN = r"""
_value:
  description: Error messages, each naming the host, the value and the fix.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    FabricSelection,
    check_cluster,
    check_inventory,
)


def fabric_cluster_errors(hostvars, hosts, head_hosts, fabric_cidr, use_facts=True, expected_mtu=None):
    inventory = {}
    selections = {}
    for host in hosts:
        hv = hostvars[host]
        inventory[str(host)] = {"fabric_ip": hv.get("fabric_ip")}
        fact = hv.get("multinode_fabric") if use_facts else None
        if fact:
            try:
                selections[str(host)] = FabricSelection.from_dict(fact)
            except FabricError as exc:
                raise AnsibleFilterError("%s: %s" % (host, exc))
    if use_facts:
        missing = [h for h in inventory if h not in selections]
        if missing:
            return ["no fabric facts for %s; run multinode.vllm.fabric_facts on every host first" % ", ".join(missing)]
        return check_cluster(selections, fabric_cidr, list(head_hosts), inventory, expected_mtu=expected_mtu)
    return check_inventory(inventory, fabric_cidr, list(head_hosts))


class FilterModule:
    def filters(self):
        return {"_fabric_cluster_errors": fabric_cluster_errors}
