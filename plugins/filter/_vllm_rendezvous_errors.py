# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _vllm_rendezvous_errors
short_description: Native backend, did every rank reach the head over the fabric
version_added: 0.1.0
description:
  - Takes each node's rank, fabric address and the TCP connections of its serve processes
    (P(multinode.vllm.vllm_ready#module) with O(multinode.vllm.vllm_ready#module:connections=true)).
  - A rank above 0 must hold established connections from its fabric address to the head's fabric address (and
    none to the head's management address); the head must hold connections accepted on its fabric address.
  - Returns one message per rank that did not; an empty list when all did.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: Per host, a dict with C(rank), C(fabric_ip) and C(connections).
    type: dict
    required: true
  head_fabric_ip:
    description: The head's fabric address.
    type: str
    required: true
  head_mgmt_ip:
    description: The head's management address (a connection to it is an error).
    type: str
    default: ""
  expected_hosts:
    description: Every host that must run a rank; one missing from the input is an error (so an empty input fails).
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Check the rendezvous
  ansible.builtin.assert:
    that: (ranks | multinode.vllm._vllm_rendezvous_errors(head_fabric_ip='198.18.200.12')) | length == 0
"""

RETURN = r"""
_value:
  description: Error messages, one per rank that is not connected over the fabric.
  type: list
  elements: str
"""

from ansible_collections.multinode.vllm.plugins.module_utils._serve_ready import rendezvous_check


def vllm_rendezvous_errors(ranks, head_fabric_ip, head_mgmt_ip="", expected_hosts=()):
    ranks = dict(ranks)
    errors = ["%s: no rank information (its connections were not read), so the rendezvous is not proven" % host
              for host in expected_hosts if host not in ranks]
    for host, info in sorted(ranks.items()):
        error = rendezvous_check(str(host), int(info["rank"]), list(info.get("connections") or []),
                                 str(info["fabric_ip"]), str(head_fabric_ip), str(head_mgmt_ip or ""))
        if error:
            errors.append(error)
    return errors


class FilterModule:
    def filters(self):
        return {"_vllm_rendezvous_errors": vllm_rendezvous_errors}
