# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _cluster_identity
short_description: One host's view of the cluster, computed once (the fact multinode_cluster)
version_added: 0.1.0
description:
  - The fabric role sets the fact C(multinode_cluster) from this filter right after its cluster checks pass; every
    later role and play reads that fact instead of looking the head up in the inventory groups again.
  - Keys C(head), C(workers), C(hosts) (head first, then the workers in inventory order), C(role) (head or worker),
    C(node_rank) (the index in C(hosts)), C(head_fabric_ip), C(ray_address) (head fabric address and C(ray_gcs_port)),
    C(backend), C(runtime) and C(serve) (whether this run serves a model).
  - Fails naming the fix when there is not exactly one head, the host is in neither group, the head has no
    C(multinode_fabric) fact, or the port, backend or runtime is not valid.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  host:
    description: The host whose view this is (C(inventory_hostname)).
    type: str
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
  ray_gcs_port:
    description: The Ray head's GCS port.
    type: int
    required: true
  backend:
    description: C(vllm_backend), ray or native.
    type: str
    required: true
  runtime:
    description: C(multinode_runtime), docker, systemd or process.
    type: str
    required: true
  serve:
    description: Whether this run serves a model.
    type: bool
    required: true
"""

EXAMPLES = r"""
- name: The cluster's identity, once, after the fabric checks
  ansible.builtin.set_fact:
    multinode_cluster: >-
      {{ hostvars | multinode.vllm._cluster_identity(inventory_hostname, groups['ray_head'],
         groups['ray_workers'] | default([]), ray_gcs_port=ray_gcs_port, backend=vllm_backend,
         runtime=multinode_runtime, serve=false) }}
"""

RETURN = r"""
_value:
  description: The host's view of the cluster.
  type: dict
  sample:
    head: spark1
    workers: [spark2]
    hosts: [spark1, spark2]
    role: worker
    node_rank: 1
    head_fabric_ip: 198.18.200.11
    ray_address: 198.18.200.11:6379
    backend: ray
    runtime: process
    serve: true
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._cluster import ClusterError, identity


def cluster_identity(hostvars, host, head_hosts, worker_hosts, ray_gcs_port, backend, runtime, serve):
    view = {str(h): hostvars[h] for h in list(head_hosts)[:1] if h in hostvars}
    try:
        return identity(view, str(host), list(head_hosts), list(worker_hosts), ray_gcs_port=ray_gcs_port,
                        backend=str(backend), runtime=str(runtime), serve=bool(serve))
    except ClusterError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"_cluster_identity": cluster_identity}
