# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _stack_table
short_description: The stack table (node x component) the stack fingerprint gate prints
version_added: 0.1.0
description:
  - One line per host, a header first, for a debug message; columns are the components of every host's
    C(multinode_stack) fact (C(image_id) and C(model) only when some host has them), C(not installed) where a host
    lacks one.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  hosts:
    description: The cluster hosts, in the table's order.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Show the stack table
  ansible.builtin.debug:
    msg: "{{ hostvars | multinode.vllm._stack_table(ansible_play_hosts_all) }}"
"""

RETURN = r"""
_value:
  description: The table's lines, the header first.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._stack import stack_table, table_lines


def stack_table_lines(hostvars, hosts):
    hosts = [str(h) for h in hosts]
    stacks = {h: (hostvars[h].get("multinode_stack") if h in hostvars else None) for h in hosts}
    return table_lines(stack_table(stacks, hosts))


class FilterModule:
    def filters(self):
        return {"_stack_table": stack_table_lines}
