# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_serve_args
short_description: The vllm serve arguments of one node, for the ray or native backend, after checking the sizes
version_added: 0.1.0
description:
  - Backend V(ray) (head only) gives C(serve <model> --tensor-parallel-size T --pipeline-parallel-size P
    --distributed-executor-backend ray --host <api address> --port <api port>) plus the model settings.
  - Backend V(native) (every node) adds C(--nnodes N --node-rank R --master-addr <head fabric ip> --master-port <port>);
    ranks above 0 get C(--headless) and no API address.
  - Fails when T*P does not fit the nodes and their GPUs, naming the numbers.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: Serve settings (model, served_model_name, tensor_parallel_size, pipeline_parallel_size, api_host,
      api_port, max_model_len, dtype, gpu_memory_utilization, extra_args, master_port).
    type: dict
    required: true
  backend:
    description: V(ray) or V(native).
    type: str
    required: true
  gpus_per_node:
    description: GPUs each host offers, keyed by host.
    type: dict
    required: true
  node_rank:
    description: This node's rank (native backend; the head is 0).
    type: int
    default: 0
  head_fabric_ip:
    description: The head's fabric address (native backend's C(--master-addr)).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Compute the head's serve arguments
  ansible.builtin.set_fact:
    serve_args: >-
      {{ {'model': '/models/tiny', 'tensor_parallel_size': 2, 'api_host': '198.19.1.10'}
         | multinode.vllm.vllm_serve_args(backend='ray', gpus_per_node={'spark1': 1, 'spark2': 1}) }}
"""

RETURN = r"""
_value:
  description: The arguments after C(vllm).
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._serve import (
    ServeError,
    ServeSettings,
    check_parallel,
    serve_args,
)

_FIELDS = set(ServeSettings.__dataclass_fields__)


def vllm_serve_args(settings, backend, gpus_per_node, node_rank=0, head_fabric_ip=""):
    settings = dict(settings)
    unknown = sorted(set(settings) - _FIELDS)
    if unknown:
        raise AnsibleFilterError("vllm_serve_args: unknown settings %s" % ", ".join(unknown))
    if settings.get("extra_args") is None:
        settings["extra_args"] = ()
    gpus = {str(h): g for h, g in dict(gpus_per_node).items()}
    try:
        check_parallel(backend, settings.get("tensor_parallel_size", 1), settings.get("pipeline_parallel_size", 1),
                       len(gpus), gpus)
        return serve_args(backend, ServeSettings(**settings), nnodes=len(gpus), node_rank=int(node_rank),
                          head_fabric_ip=head_fabric_ip)
    except ServeError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"vllm_serve_args": vllm_serve_args}
