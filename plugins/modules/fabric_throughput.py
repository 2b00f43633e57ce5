#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_throughput
short_description: Raw TCP throughput over the fabric, one stream from the head to each worker
version_added: 0.1.0
description:
  - The baseline under vLLM's serving figures and the distributed preflight's all-reduce bandwidth - what one plain
    TCP stream moves between two fabric addresses (standard library sockets, no tuning).
  - Run on every host in one task - each worker (V(receive)) listens on its fabric address for one connection from
    O(peers) (the head's fabric address) and reads until EOF; the head (V(send)) connects from its fabric address to
    each worker of O(peers) in turn (a refusal is retried while the receiver starts) and sends O(mib) MiB.
  - Changes nothing; the listener ends after its one transfer or O(timeout).
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  phase:
    description: V(send) on the head, V(receive) on a worker.
    type: str
    required: true
    choices: [send, receive]
  fabric_ip:
    description: This host's fabric address (bound on both ends, so the stream cannot take another network).
    type: str
    required: true
  peers:
    description: With V(send), the workers' fabric addresses; with V(receive), the head's (the only sender accepted).
    type: list
    elements: str
    required: true
  port:
    description: TCP port of the receivers (open between cluster nodes on the fabric).
    type: int
    default: 29660
  mib:
    description: MiB to send to each worker.
    type: int
    default: 256
  timeout:
    description: Seconds a receiver waits and a transfer may take.
    type: float
    default: 60.0
"""

EXAMPLES = r"""
- name: Measure raw TCP from the head to each worker over the fabric
  multinode.vllm.fabric_throughput:
    phase: "{{ 'send' if inventory_hostname == groups['ray_head'][0] else 'receive' }}"
    fabric_ip: "{{ fabric_ip }}"
    peers: "{{ workers_fabric_ips if inventory_hostname == groups['ray_head'][0] else [head_fabric_ip] }}"
"""

RETURN = r"""
links:
  description: With V(send), one entry per worker - C(src), C(dst), C(mib), C(seconds), C(gbytes_per_s),
    C(gbits_per_s), or C(error).
  returned: always
  type: list
  elements: dict
received:
  description: With V(receive), what arrived (C(bytes), C(seconds), C(gbytes_per_s)).
  returned: when phase is receive
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._bench import tcp_receive, tcp_send


def main():
    module = AnsibleModule(
        argument_spec=dict(
            phase=dict(type="str", required=True, choices=["send", "receive"]),
            fabric_ip=dict(type="str", required=True),
            peers=dict(type="list", elements="str", required=True),
            port=dict(type="int", default=29660),
            mib=dict(type="int", default=256),
            timeout=dict(type="float", default=60.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["phase"] == "receive":
        if len(p["peers"]) != 1:
            module.fail_json(msg="fabric_throughput: a receiver takes exactly one peer (the head's fabric address); "
                                 "got %s" % p["peers"])
        try:
            got = tcp_receive(p["fabric_ip"], p["port"], p["peers"][0], p["timeout"])
        except OSError as exc:
            module.fail_json(msg="fabric_throughput: %s received nothing from %s on port %d (%s); is the port open "
                                 "between the fabric addresses?" % (p["fabric_ip"], p["peers"][0], p["port"], exc))
        module.exit_json(changed=False, links=[], received=got)
    links = []
    for dst in p["peers"]:
        try:
            links.append(dict(tcp_send(p["fabric_ip"], dst, p["port"], p["mib"], timeout=p["timeout"]),
                              src=p["fabric_ip"], dst=dst))
        except OSError as exc:
            links.append({"src": p["fabric_ip"], "dst": dst, "mib": p["mib"], "error": str(exc)})
    module.exit_json(changed=False, links=links)


if __name__ == "__main__":
    main()
