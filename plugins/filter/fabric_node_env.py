# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: fabric_node_env
short_description: The environment of every cluster process on one node
version_added: 0.1.0
description:
  - Builds C(VLLM_HOST_IP) (the node's own fabric address), C(GLOO_SOCKET_IFNAME), C(TP_SOCKET_IFNAME),
    C(NCCL_SOCKET_IFNAME) (exact-match form), C(NCCL_IB_HCA) (exact C(=hca:port,...) form, every used endpoint of
    the fabric port, so both halves of a DGX Spark's QSFP port), C(NCCL_IB_MERGE_NICS=1) with more than one HCA,
    C(NCCL_IB_ADDR_RANGE) or C(NCCL_IB_GID_INDEX), C(UCX_NET_DEVICES), C(MASTER_ADDR)/C(MASTER_PORT) for the
    native backend, and C(RAY_memory_monitor_refresh_ms=0) for Ray on a unified-memory node.
  - Every runtime (docker, systemd, process) renders this one dictionary.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The host's C(multinode_fabric) fact (from M(multinode.vllm.fabric_facts)).
    type: dict
    required: true
  fabric_cidr:
    description: The fabric subnet.
    type: str
    required: true
  head_fabric_ip:
    description: The head's fabric address.
    type: str
    required: true
  backend:
    description: vLLM distributed backend.
    type: str
    choices: [ray, native]
    default: ray
  master_port:
    description: Rendezvous port for the native backend.
    type: int
    default: 29500
  gid_selection:
    description:
      - V(addr_range) sets C(NCCL_IB_ADDR_RANGE) (C(fabric_cidr), or its smallest supernet that holds every used
        endpoint's address), so NCCL picks each HCA's RoCE v2 GID by address.
      - V(index) sets the per-host C(NCCL_IB_GID_INDEX), one value for every listed HCA; it fails when the HCAs hold
        their addresses at different indexes.
    type: str
    choices: [addr_range, index]
    default: addr_range
  vllm_config_root:
    description: Value of C(VLLM_CONFIG_ROOT) (where vLLM reads its non-carry-over list).
    type: str
  extra:
    description: Cluster-wide extra variables; may not replace a computed key.
    type: dict
    default: {}
  overrides:
    description: Per-host values that replace computed keys (an escape hatch; the preflight checks the result).
    type: dict
    default: {}
  unified_memory:
    description:
      - The node's GPU shares the system's memory (C(multinode_memory.unified) from M(multinode.vllm.memory_facts)).
        With backend V(ray) it sets C(RAY_memory_monitor_refresh_ms=0), unless O(extra) sets that key.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Compute this node's environment
  ansible.builtin.set_fact:
    node_env: >-
      {{ multinode_fabric | multinode.vllm.fabric_node_env(fabric_cidr=fabric_cidr,
         head_fabric_ip=hostvars[groups['ray_head'][0]].multinode_fabric.ip) }}
"""

RETURN = r"""
_value:
  description: Environment variable names and string values.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.multinode.vllm.plugins.module_utils._env import EnvError, EnvSettings, node_environment
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError, FabricSelection


def fabric_node_env(fabric, fabric_cidr, head_fabric_ip, backend="ray", master_port=29500,
                    gid_selection="addr_range", vllm_config_root=None, extra=None, overrides=None,
                    unified_memory=False):
    try:
        settings = EnvSettings(
            fabric_cidr=str(fabric_cidr),
            head_fabric_ip=str(head_fabric_ip),
            backend=str(backend),
            master_port=int(master_port),
            gid_selection=str(gid_selection),
            vllm_config_root=vllm_config_root,
            extra=dict(extra or {}),
            unified_memory=boolean(unified_memory, strict=False),
        )
        return node_environment(FabricSelection.from_dict(fabric), settings, overrides=dict(overrides or {}))
    except (EnvError, FabricError) as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"fabric_node_env": fabric_node_env}
