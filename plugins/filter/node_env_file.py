# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: node_env_file
short_description: A node's environment as an env file (KEY=VALUE lines)
version_added: 0.1.0
description:
  - Sorted C(KEY=VALUE) lines with literal values, readable by C(docker --env-file), systemd C(EnvironmentFile=)
    and the C(process) runtime's launcher. A value with a newline is refused.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The environment (from P(multinode.vllm.fabric_node_env#filter)).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Render the env file
  ansible.builtin.copy:
    content: "{{ node_env | multinode.vllm.node_env_file }}"
    dest: /etc/multinode-vllm/node.env
    mode: "0600"
"""

RETURN = r"""
_value:
  description: The file's content.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._env import EnvError, env_file


def node_env_file(env):
    try:
        return env_file({str(k): str(v) for k, v in dict(env).items()})
    except EnvError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"node_env_file": node_env_file}
