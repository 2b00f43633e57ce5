# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _profile_default
short_description: A role variable's default under the inventory's multinode_profile
version_added: 0.1.0
description:
  - The profile's value for the variable (docs/dgx-spark.md lists each profile's values), else the given default.
  - An unknown profile name fails, naming the known ones.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The profile name (C(multinode_profile)); empty or null for none.
    type: str
    required: true
  variable:
    description: The role variable.
    type: str
    required: true
  default:
    description: The value without a profile.
    type: raw
"""

EXAMPLES = r"""
fabric_expected_mtu: "{{ multinode_profile | default('') | multinode.vllm._profile_default('fabric_expected_mtu', none) }}"
"""

RETURN = r"""
_value:
  description: The default to use.
  type: raw
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._profiles import ProfileError, profile_default


def _profile_default(profile, variable, default=None):
    try:
        return profile_default(profile, str(variable), default)
    except ProfileError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"_profile_default": _profile_default}
