# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _inventory_errors
short_description: Inventory checks over every cluster host, before any host is touched
version_added: 0.1.0
description:
  - The head is not also in C(ray_workers).
  - Backend ray, on every host, Ray's ports (C(ray_pinned_ports) combined with C(ray_ports), C(ray_gcs_port) on the
    head) are ports, unknown settings are named, C(min_worker_port) <= C(max_worker_port), and no port Ray or the API
    listens on (the client port, C(vllm_api_port) on the head...) lies inside Ray's worker port range or is shared.
  - On the head, C(vllm_api_port) is a port and C(vllm_api_host) is an address the controller could connect to (not
    loopback, unspecified or multicast).
  - C(fabric_ip) is not the management address C(ansible_host).
  - The ray and serve roles' defaults apply where a variable is unset (their roles are not loaded yet).
  - Returns the list of error messages, each naming host, variable, value and fix; empty means consistent.
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
  worker_hosts:
    description: The hosts in group C(ray_workers).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Check the inventory before touching hosts
  ansible.builtin.assert:
    that: __errors | length == 0
    fail_msg: "{{ __errors | join('\n') }}"
  vars:
    __errors: "{{ hostvars | multinode.vllm._inventory_errors(ansible_play_hosts_all, groups['ray_head'] | default([]),
                 groups['ray_workers'] | default([])) }}"
"""

RETURN = r"""
_value:
  description: Error messages, each naming the host, the variable, its value and the fix.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._inventory import VARIABLES, check_inventory


def inventory_errors(hostvars, hosts, head_hosts, worker_hosts):
    inventory = {}
    for host in hosts:
        hv = hostvars[host]
        inventory[str(host)] = {name: hv[name] for name in VARIABLES if name in hv}
    return check_inventory(inventory, [str(h) for h in head_hosts], [str(h) for h in worker_hosts])


class FilterModule:
    def filters(self):
        return {"_inventory_errors": inventory_errors}
