# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _distributed_preflight_reuse
short_description: Whether a previous distributed preflight pass still proves this cluster
version_added: 0.1.0
description:
  - Reads each host's registered M(multinode.vllm.distributed_preflight) return of
    O(multinode.vllm.distributed_preflight#module:action=fingerprint) and says whether every node holds a proof
    of the same cluster fingerprint (the same env files, runtime versions, addresses, interfaces, port and set of
    nodes), younger than O(max_age) seconds.
  - The network itself is not part of the fingerprint; the fabric preflight probes it on every run.
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
  max_age:
    description: Seconds after which a pass is no longer reused.
    type: float
    default: 86400
  result_var:
    description: The name each host registered its fingerprint result under.
    type: str
    default: __distributed_preflight_fingerprint
"""

EXAMPLES = r"""
- name: Decide whether the last pass still holds
  ansible.builtin.set_fact:
    reuse: "{{ hostvars | multinode.vllm._distributed_preflight_reuse(ansible_play_hosts_all) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: The decision.
  type: dict
  contains:
    reusable: {description: True when the last pass proves this very cluster., type: bool}
    reason: {description: Why (the first host that forces a new run when not reusable)., type: str}
    cluster_fingerprint: {description: The cluster fingerprint a new pass records., type: str}
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import cluster_fingerprint, proof_reusable


def distributed_preflight_reuse(hostvars, hosts, max_age=86400, result_var="__distributed_preflight_fingerprint"):
    fingerprints = {}
    proofs = {}
    for host in hosts:
        value = hostvars[host].get(result_var) or {}
        if not value.get("fingerprint"):
            raise AnsibleFilterError("%s: no fingerprint registered under %s (run the distributed_preflight "
                                     "module with action=fingerprint on every host first)" % (host, result_var))
        fingerprints[str(host)] = value["fingerprint"]
        proofs[str(host)] = value.get("proof")
    reusable, reason = proof_reusable(proofs, fingerprints, float(max_age))
    return {"reusable": reusable, "reason": reason, "cluster_fingerprint": cluster_fingerprint(fingerprints)}


class FilterModule:
    def filters(self):
        return {"_distributed_preflight_reuse": distributed_preflight_reuse}
