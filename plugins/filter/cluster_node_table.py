# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: cluster_node_table
short_description: The node table a deploy ends with (host, management and fabric address, Ray address, GPUs)
version_added: 0.1.0
description:
  - One line per host, a header first, for a debug message. The Ray address is the one the node's raylet runs on
    (the C(multinode_ray_node) fact), C(- (native)) for the native backend; GPUs are C(vllm_gpus_per_node), else
    C(ray_num_gpus), else 1.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: The cluster's hosts in order (C(multinode_cluster.hosts)).
    type: list
    elements: str
    required: true
  native:
    description: Whether the backend is native (no Ray).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Show the node table
  ansible.builtin.debug:
    msg: "{{ hostvars | multinode.vllm.cluster_node_table(multinode_cluster.hosts, native=false) }}"
"""

RETURN = r"""
_value:
  description: The table's lines, the header first.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._cluster import node_table


def cluster_node_table(hostvars, hosts, native=False):
    return node_table({str(h): hostvars[h] for h in hosts if h in hostvars}, [str(h) for h in hosts],
                      native=bool(native))


class FilterModule:
    def filters(self):
        return {"cluster_node_table": cluster_node_table}
