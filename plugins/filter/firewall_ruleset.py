# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: firewall_ruleset
short_description: The nftables file of one host's firewall (table inet multinode_vllm)
version_added: 0.1.0
description:
  - Renders the C(nft -f) file that replaces the host's C(table inet multinode_vllm) in one transaction; see
    P(multinode.vllm.firewall#role) and docs/firewall.md for what it allows.
  - Fails listing every problem of the input (the same messages as P(multinode.vllm._firewall_errors#filter)).
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The spec (see P(multinode.vllm._firewall_errors#filter)).
    type: dict
    required: true
  hostvars:
    description: C(hostvars), to find each cluster node's fabric address.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Render this host's firewall
  ansible.builtin.set_fact:
    firewall_text: "{{ spec | multinode.vllm.firewall_ruleset(hostvars) }}"
"""

RETURN = r"""
_value:
  description: The nft file text.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._firewall import (
    FirewallError,
    build_spec,
    render_ruleset,
    spec_data,
)


def firewall_ruleset(spec, hostvars):
    try:
        return render_ruleset(build_spec(spec_data(spec, hostvars)))
    except FirewallError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"firewall_ruleset": firewall_ruleset}
