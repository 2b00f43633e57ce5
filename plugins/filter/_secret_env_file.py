# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _secret_env_file
short_description: The text of a secret env file for a process to read at start
version_added: 0.1.0
description:
  - Secret environment values go to a file (mode 0600, written with P(multinode.vllm.node_files#module)'s
    O(multinode.vllm.node_files#module:secret_files), never diffed or printed), which the program reads at start
    through C(/bin/sh -c 'set -a && . "$0" && set +a && exec "$@"' FILE PROGRAM ARGS...) (O(reader=sh)), or
    through the env-file launcher C(multinode-env-exec) with the process's other env files (O(reader=launcher)).
    So the values never appear on a command line, in a unit file, a supervisor section or C(docker inspect).
  - O(reader=sh) single-quotes values for sh (any text but NUL comes back unchanged); O(reader=launcher) writes
    them as they are (docker C(--env-file) rules), so a value may not hold a line break. Keys must be environment
    variable names. Errors name the variable and the key, never the value.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The secret variables, name to value.
    type: dict
    required: true
  what:
    description: The inventory variable the values come from (named in errors).
    type: str
    default: vllm_secret_env
  reader:
    description: What reads the file; C(sh) for the C(/bin/sh) prefix, C(launcher) for C(multinode-env-exec).
    type: str
    choices: [sh, launcher]
    default: sh
"""

EXAMPLES = r"""
- name: Write the secret env file of vllm serve
  multinode.vllm.node_files:
    secret_files:
      - path: /etc/multinode-vllm/vllm-api.env
        content: "{{ vllm_secret_env | multinode.vllm._secret_env_file(reader='launcher') }}"
        mode: "0600"
"""

RETURN = r"""
_value:
  description: The file's text.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._secrets import SecretError
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import secret_env_file as _render


def secret_env_file(values, what="vllm_secret_env", reader="sh"):
    try:
        return _render(dict(values or {}), what=str(what), reader=str(reader))
    except SecretError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"_secret_env_file": secret_env_file}
