# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _model_staging_plan
short_description: Which worker receives which model files, and every node's space problem
version_added: 0.1.0
description:
  - Assembles every worker's M(multinode.vllm.model_manifest) comparison into the cluster's staging plan.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  source:
    description: The head's manifest.
    type: dict
    required: true
  workers:
    description: The hosts that receive the model.
    type: list
    elements: str
    required: true
  register:
    description: Name of the variable each worker registered its comparison in.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Assemble the plan
  ansible.builtin.set_fact:
    plan: "{{ hostvars | multinode.vllm._model_staging_plan(head_manifest.manifest, workers, 'model_compare') }}"
"""

RETURN = r"""
_value:
  description: "C(needs) (host -> manifest entries), C(files) (what the sender serves), C(peers),
    C(peer_addresses) (C(host), C(fabric_ip)), C(lines), C(space_errors), C(bytes)."
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import ManifestError, staging_plan


def model_staging_plan(hostvars, source, workers, register):
    try:
        plan = staging_plan(source, {str(h): hostvars[h].get(register) for h in workers})
    except ManifestError as exc:
        raise AnsibleFilterError(str(exc))
    addresses = []
    for host in plan["peers"]:
        fabric = hostvars[host].get("multinode_fabric")
        if not fabric:
            raise AnsibleFilterError("%s has no fabric facts; run the multinode.vllm.fabric role first" % host)
        addresses.append({"host": host, "fabric_ip": str(fabric["ip"])})
    plan["peer_addresses"] = addresses
    return plan


class FilterModule:
    def filters(self):
        return {"_model_staging_plan": model_staging_plan}
