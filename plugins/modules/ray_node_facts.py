#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: ray_node_facts
short_description: What Ray runs on this node, with the raylet's VLLM_HOST_IP and whether multinode.vllm started it
version_added: 0.1.0
description:
  - Finds the Ray processes in this host's own network namespace (so that, where nodes share a PID namespace as in
    the lab, another node's raylet is never taken for this one's).
  - Returns the raylet's pid, the address it registered (C(--node_ip_address)), the C(--node-ip-address) of the
    C(ray start) that spawned it (null when Ray was started without one, or daemonized), C(VLLM_HOST_IP) and the
    socket interface variables from its environment, the config hash it was started with, and whether it runs
    under this node's supervisord (the C(process) runtime).
  - Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  supervisord_pidfile:
    description: Pidfile of this node's supervisord (the C(process) runtime).
    type: path
    default: /run/multinode-vllm/supervisord.pid
  auth_token_file:
    description:
      - Ray's token file on this node. When given, C(multinode_ray_node.auth_token_file) reports whether it exists,
        its sha256, mode and owner (never its content), so that a deploy whose nodes all hold the cluster's token with
        mode 0600 neither reads nor rewrites it.
    type: path
"""

EXAMPLES = r"""
- name: Read this node's Ray state
  multinode.vllm.ray_node_facts:

- name: Show the raylet's VLLM_HOST_IP
  ansible.builtin.debug:
    msg: "{{ multinode_ray_node.env.VLLM_HOST_IP | default('unset') }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: dict
  contains:
    multinode_ray_node:
      description: This node's Ray state.
      type: dict
      contains:
        running: {description: A raylet runs in this network namespace., type: bool}
        raylet_pid: {description: Its pid., type: int}
        node_ip_address: {description: The address the raylet registered with., type: str, sample: 198.18.200.12}
        start_node_ip_address: {description: C(--node-ip-address) of the C(ray start) parent; null when absent., type: str}
        gcs_server: {description: A GCS server (head) runs here., type: bool}
        env:
          description:
            - C(VLLM_HOST_IP), C(*_SOCKET_IFNAME), C(RAY_AUTH_MODE) and C(RAY_AUTH_TOKEN_PATH) of the raylet's environment,
              and C(auth_token_sha256), the sha256 of its token file (never the token).
          type: dict
        config_hash: {description: C(MULTINODE_VLLM_CONFIG_HASH) the raylet was started with; null when not ours., type: str}
        supervisord_pid: {description: This node's supervisord; null when not running., type: int}
        managed: {description: The raylet descends from this node's supervisord., type: bool}
        processes: {description: "Every Ray process here (pid, name).", type: list, elements: dict}
        foreign_pids:
          description: Ray processes this collection did not start (not under its supervisord, no config hash).
          type: list
          elements: int
        foreign_owner:
          description:
            - The systemd unit (C(unit)) or Docker container (C(container), its ID) that runs a foreign raylet, from
              its cgroup; null when ours, when none runs, or when nothing supervises it (a login session).
          type: dict
        stray_pids:
          description: Ray processes of this collection not under this node's supervisord.
          type: list
          elements: int
        ours_pids: {description: Ray processes this collection started., type: list, elements: int}
        serve_ours_pids: {description: vllm serve processes this collection started., type: list, elements: int}
        serve_pid: {description: "The main C(vllm serve) process in this network namespace; null when none.", type: int}
        serve_pids: {description: "Every process of the C(vllm serve) trees here.", type: list, elements: int}
        serve_managed: {description: The main C(vllm serve) process descends from this node's supervisord., type: bool}
        watchdog_pid: {description: "The watchdog's loop (C(multinode-watchdog --config)); null when none runs here.", type: int}
        watchdog_managed: {description: The watchdog descends from this node's supervisord., type: bool}
        auth_token_file:
          description: "With O(auth_token_file): path, exists, sha256 (never the token), valid (>= 32 characters, no
            whitespace), mode (V(0600)) and uid."
          type: dict
          returned: when O(auth_token_file) is given
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._procs import node_state, token_file_state


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            supervisord_pidfile=dict(type="path", default="/run/multinode-vllm/supervisord.pid"),
            auth_token_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    try:
        state = node_state(module.params["supervisord_pidfile"])
    except OSError as exc:
        module.fail_json(msg="could not read /proc: %s" % exc)
    if module.params["auth_token_file"]:
        state["auth_token_file"] = token_file_state(module.params["auth_token_file"])
    module.exit_json(changed=False, ansible_facts=dict(multinode_ray_node=state))


if __name__ == "__main__":
    main()
