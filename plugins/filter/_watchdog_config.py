# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: _watchdog_config
short_description: The head's watchdog config for a runtime and backend, checked as the node checks it
version_added: 0.1.0
description:
  - Builds the JSON config of the whole-group recovery watchdog (the node script C(multinode-watchdog)) - the real
    completion it sends, Ray's node table it reads (backend ray), the lock, state and operator-stop files, the
    policy, and the recovery's commands for the runtime (supervisorctl under process, systemctl under systemd).
  - Refuses what the node would refuse (a policy key, a path, a runtime without a watchdog), naming the value.
  - Internal to the collection's roles, not for playbooks; it may change or go away without notice.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The policy (C(serve_watchdog_policy)), some of its keys; the rest default.
    type: dict
    required: true
  runtime:
    description: C(multinode_runtime).
    type: str
    required: true
  backend:
    description: C(vllm_backend).
    type: str
    required: true
  settings:
    description:
      - The rest of the config, as keyword arguments of C(_watchdog.watchdog_config) (api_url, model, python,
        script, config_file, state_file, lock_file, operator_stop_file, api_key_file, expected_nodes, ray_reader,
        gcs_address, supervisorctl, units, generation, check_timeout_s).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Render the watchdog config
  ansible.builtin.set_fact:
    config: "{{ serve_watchdog_policy | multinode.vllm._watchdog_config(runtime='process', backend='ray', settings=s) }}"
"""

RETURN = r"""
_value:
  description: The config, a dict ready for to_nice_json.
  type: dict
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.module_utils._watchdog import WatchdogError
from ansible_collections.multinode.vllm.plugins.module_utils._watchdog import watchdog_config as _build


def watchdog_config(policy, runtime, backend, settings):
    try:
        return _build(str(runtime), str(backend), policy=dict(policy or {}), **dict(settings or {}))
    except WatchdogError as exc:
        raise AnsibleFilterError(str(exc)) from None
    except TypeError as exc:
        raise AnsibleFilterError("_watchdog_config: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"_watchdog_config": watchdog_config}
