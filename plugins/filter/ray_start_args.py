# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: ray_start_args
short_description: The C(ray start) arguments of a head or worker, always with C(--node-ip-address)
version_added: 0.1.0
description:
  - Head, C(start --head --node-ip-address <fabric ip> --port <gcs port>) with the dashboard off unless asked;
    worker, C(start --address <head fabric ip>:<gcs port> --node-ip-address <own fabric ip>); plus pinned ports.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: This node's fabric address.
    type: str
    required: true
  role:
    description: V(head) or V(worker).
    type: str
    required: true
    choices: [head, worker]
  head_ip:
    description: The head's fabric address.
    type: str
    required: true
  gcs_port:
    description: The head's GCS port.
    type: int
    default: 6379
  ports:
    description: Pinned Ray ports by setting name (for example C(node_manager_port)); null values are skipped.
    type: dict
    default: {}
  include_dashboard:
    description: Start the Ray dashboard (head only).
    type: bool
    default: false
  dashboard_host:
    description: Dashboard bind address when enabled.
    type: str
    default: 127.0.0.1
  num_gpus:
    description: GPUs to advertise; Ray detects them when unset.
    type: int
  num_cpus:
    description: CPUs to advertise; Ray detects them when unset.
    type: int
  extra_args:
    description: More arguments appended as given.
    type: list
    elements: str
    default: []
  block:
    description: Append C(--block) so the process stays in the foreground under a supervisor.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Worker arguments
  ansible.builtin.set_fact:
    ray_args: "{{ multinode_fabric.ip | multinode.vllm.ray_start_args(role='worker', head_ip='198.18.200.12') }}"
"""

RETURN = r"""
_value:
  description: Arguments that follow the C(ray) program name.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._ray_start import (
    RaySettings,
    RayStartError,
    ray_start_args as _build,
)


def ray_start_args(node_ip, role, head_ip, gcs_port=6379, ports=None, include_dashboard=False,
                   dashboard_host="127.0.0.1", num_gpus=None, num_cpus=None, extra_args=None, block=True):
    try:
        settings = RaySettings(
            gcs_port=gcs_port,
            ports=dict(ports or {}),
            include_dashboard=bool(include_dashboard),
            dashboard_host=str(dashboard_host),
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            block=bool(block),
            extra_args=tuple(extra_args or ()),
        )
        return _build(str(role), str(node_ip), str(head_ip), settings)
    except RayStartError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"ray_start_args": ray_start_args}
