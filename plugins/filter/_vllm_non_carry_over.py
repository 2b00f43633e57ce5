# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _vllm_non_carry_over
short_description: The keys vLLM must not copy from the head to Ray workers
version_added: 0.1.0
description:
  - vLLM's Ray executor copies the driver's C(VLLM_*), C(NCCL_*), C(UCX_*) (and a few more) variables to every
    worker, overwriting per-host values, unless the key is listed in C(ray_non_carry_over_env_vars.json) under
    C(VLLM_CONFIG_ROOT) on the node running C(vllm serve).
  - Returns the per-host keys present in any node's environment plus every carried key whose value differs
    between nodes, plus the credentials (C(VLLM_API_KEY), C(HF_TOKEN), C(HUGGING_FACE_HUB_TOKEN)) and
    O(secret_keys), which vLLM would otherwise copy into every Ray worker's runtime environment.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: Each host's environment (from P(multinode.vllm.fabric_node_env#filter)), keyed by host.
    type: dict
    required: true
  secret_keys:
    description: Names of secret variables (for example the keys of C(vllm_secret_env)).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Write vLLM's non-carry-over list
  ansible.builtin.copy:
    content: "{{ envs_by_host | multinode.vllm._vllm_non_carry_over | to_nice_json }}"
    dest: /etc/multinode-vllm/vllm/ray_non_carry_over_env_vars.json
    mode: "0644"
"""

RETURN = r"""
_value:
  description: Sorted key names.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._env import non_carry_over_keys
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import non_carry_over_with_secrets


def vllm_non_carry_over(envs_by_host, secret_keys=()):
    keys = non_carry_over_keys({str(h): dict(env) for h, env in dict(envs_by_host).items()})
    return non_carry_over_with_secrets(keys, [str(k) for k in (secret_keys or [])])


class FilterModule:
    def filters(self):
        return {"_vllm_non_carry_over": vllm_non_carry_over}
