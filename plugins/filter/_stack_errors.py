# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _stack_errors
short_description: The stack fingerprint gate over every host (Python, Ray, vLLM, torch, NCCL, CUDA, driver, image, model)
version_added: 0.1.0
description:
  - Compares every host's C(multinode_stack) fact (module C(multinode.vllm.stack_facts), with C(image_id) and
    C(model_manifest) where the role added them) and returns one error per component whose value differs between
    hosts, naming the hosts of each value and the fix; a component not installed counts as a value.
  - A component in the allow-list is not compared. Returns the list of error messages; empty means every node runs
    the same stack. A bad allow-list entry fails the filter, naming the entry and the valid component names.
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
  allow:
    description:
      - "C(ray_stack_allow_skew), components whose difference is accepted, as names or as
        C({component: <name>, reason: <text>})."
    type: list
    elements: raw
    default: []
"""

EXAMPLES = r"""
- name: Fail on any difference between the nodes' stacks
  ansible.builtin.fail:
    msg: "{{ __errors | join('; ') }}"
  when: __errors | length > 0
  vars:
    __errors: "{{ hostvars | multinode.vllm._stack_errors(ansible_play_hosts_all, ray_stack_allow_skew) }}"
"""

RETURN = r"""
_value:
  description: Error messages, each naming the component, every host with its value, and the fix.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._stack import StackError, stack_errors as _stack_errors


def stack_errors(hostvars, hosts, allow=None):
    stacks = {str(h): (hostvars[h].get("multinode_stack") if h in hostvars else None) for h in hosts}
    try:
        return _stack_errors(stacks, list(allow or []))
    except StackError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"_stack_errors": stack_errors}
