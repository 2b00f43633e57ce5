# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _watchdog_status
short_description: One line from the watchdog's state file - health, pause or give-up, the last recovery
version_added: 0.1.0
description:
  - Health (or why the watchdog is paused, or gave up), then the last recovery - when, why, its outcome and how
    long it took. A missing or unreadable state reads as "no check yet".
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The state file, parsed (C(from_json)); anything else reads as no state.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Say what the watchdog saw
  ansible.builtin.debug:
    msg: "{{ state | multinode.vllm._watchdog_status }}"
"""

RETURN = r"""
_value:
  description: The line.
  type: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._watchdog import status_line


def watchdog_status(state):
    return status_line(state if isinstance(state, dict) else None)


class FilterModule:
    def filters(self):
        return {"_watchdog_status": watchdog_status}
