# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _vllm_serve_env
short_description: The text of vllm serve's own env file, every key and value checked
version_added: 0.1.0
description:
  - C(VLLM_CACHE_ROOT), C(RAY_ADDRESS) (backend ray), C(HF_HOME), C(HF_HUB_OFFLINE)/C(TRANSFORMERS_OFFLINE), then
    O(_input) (C(vllm_env)), which may replace them; a null value leaves its key out. C(KEY=VALUE) lines sorted by
    key, values as they are; the env-file launcher C(multinode-env-exec) reads the file after the node env file.
  - Fails naming the variable when a key is not an environment variable name (the launcher splits a line at its
    first C(=)) or a value holds a line break or NUL.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(vllm_env), more variables for vllm serve only.
    type: dict
    required: true
  cache_root:
    description: C(VLLM_CACHE_ROOT).
    type: str
    required: true
  ray_address:
    description: C(RAY_ADDRESS), the head's fabric address and GCS port; empty leaves it out.
    type: str
    default: ""
  hf_home:
    description: C(HF_HOME); empty leaves it out.
    type: str
    default: ""
  hf_offline:
    description: Set C(HF_HUB_OFFLINE=1) and C(TRANSFORMERS_OFFLINE=1).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Compute the env file of vllm serve
  ansible.builtin.set_fact:
    serve_env_text: "{{ vllm_env | multinode.vllm._vllm_serve_env(cache_root='/var/lib/multinode-vllm/cache/vllm') }}"
"""

RETURN = r"""
_value:
  description: The file's text, C(KEY=VALUE) lines sorted by key.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.multinode.vllm.plugins.module_utils._serve import ServeError, serve_env_file


def vllm_serve_env(extra, cache_root, ray_address="", hf_home="", hf_offline=False):
    try:
        return serve_env_file(str(cache_root), ray_address=str(ray_address or ""), hf_home=str(hf_home or ""),
                              hf_offline=boolean(hf_offline, strict=False), extra=dict(extra or {}))
    except ServeError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"_vllm_serve_env": vllm_serve_env}
