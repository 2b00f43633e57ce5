# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _firewall_boot_unit
short_description: The systemd unit that loads a host's kept firewall table at boot
version_added: 0.1.0
description:
  - Renders C(multinode-vllm-firewall.service), a oneshot unit that runs C(nft -f) on the kept ruleset before
    C(network-pre.target), Docker and the systemd runtime's Ray and vLLM units, and is required by the latter (they
    do not start when the table cannot be loaded). See docs/firewall.md.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The absolute path of the kept ruleset (C(firewall_persist_path)).
    type: str
    required: true
  nft_path:
    description: The absolute path of C(nft).
    type: str
    default: /usr/sbin/nft
"""

EXAMPLES = r"""
- name: Render the boot unit
  ansible.builtin.set_fact:
    unit_text: "{{ '/etc/multinode-vllm/firewall/multinode_vllm.nft' | multinode.vllm._firewall_boot_unit }}"
"""

RETURN = r"""
_value:
  description: The unit file text.
  type: str
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._firewall import FirewallError, boot_unit


def firewall_boot_unit(ruleset_path, nft_path="/usr/sbin/nft"):
    try:
        return boot_unit(str(ruleset_path), str(nft_path))
    except FirewallError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"_firewall_boot_unit": firewall_boot_unit}
