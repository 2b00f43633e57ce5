#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: bind_audit
short_description: Fail when a cluster process listens on anything but the fabric address or loopback
version_added: 0.1.0
description:
  - Lists every listening TCP socket (and with O(include_udp) every bound, unconnected UDP socket) of this host's
    own network namespace, with the processes that hold it (pid, name, a short command line; never the
    environment, and values of key/token/password flags are masked).
  - A listener is allowed when it is bound to loopback, to O(fabric_ip), or matches an O(allow) rule. Any other
    address (the management address, a wildcard C(0.0.0.0) or C(::), another interface) is a violation when the
    process is cluster-internal (Ray, torch.distributed, vLLM, this collection; see O(patterns)), or for every
    process with O(scope=all).
  - Each violation names the host, the process and pid, the address and port, why it is wrong and the fix; the
    module fails with all of them unless O(fail_on_violation=false).
  - Where nodes share one PID namespace (the lab), only processes of this network namespace are looked at.
  - Needs root to attribute sockets of other users' processes; unattributed listeners are reported, not judged,
    unless O(scope=all).
  - Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  fabric_ip:
    description: This host's fabric address (the one cluster traffic may listen on).
    type: str
    required: true
  management_ip:
    description: This host's management address; only used to say so in a violation message.
    type: str
  host:
    description: This host's inventory name, to start each violation message with. Defaults to the hostname.
    type: str
  allow:
    description:
      - Listeners allowed off the fabric and loopback. A rule matches when all of its keys match.
      - 'Setting this replaces the default, so keep C({port: 22}) in the list for SSH.'
    type: list
    elements: dict
    default: [{port: 22}]
    suboptions:
      port:
        description: Port number.
        type: int
      address:
        description: The exact bound address (C(0.0.0.0) matches only a wildcard socket, not every address).
        type: str
      process:
        description: Regular expression searched in the process name and in its command line.
        type: str
  scope:
    description:
      - V(cluster) judges only cluster-internal processes (those matching O(patterns)).
      - V(all) judges every listener, also those whose process cannot be read.
    type: str
    choices: [cluster, all]
    default: cluster
  patterns:
    description:
      - Regular expressions searched in each process's name and in its command line (arguments joined by spaces);
        a process matching any of them is cluster-internal.
      - Defaults to Ray's daemons (C(raylet), C(gcs_server), C(ray::*)) and processes whose command line runs ray,
        vllm, torch or multinode-vllm.
    type: list
    elements: str
  include_udp:
    description: Also audit bound UDP sockets that are not connected.
    type: bool
    default: false
  fail_on_violation:
    description: Fail listing every violation. With V(false) the module only reports them.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Cluster processes listen only on the fabric (the API server and SSH are the exceptions)
  multinode.vllm.bind_audit:
    fabric_ip: "{{ multinode_fabric.ip }}"
    management_ip: "{{ multinode_fabric.mgmt_ip }}"
    host: "{{ inventory_hostname }}"
    allow:
      - {port: 22}
      - {address: "{{ vllm_api_host | default(multinode_fabric.mgmt_ip, true) }}", port: "{{ vllm_api_port }}"}

- name: Report every listener, without failing
  multinode.vllm.bind_audit:
    fabric_ip: 198.18.200.12
    scope: all
    include_udp: true
    fail_on_violation: false
  register: audit

- name: Show them
  ansible.builtin.debug:
    msg: "{{ audit.listeners | map(attribute='verdict') | list }}"
"""

RETURN = r"""
listeners:
  description: Every listener seen, with its owners and verdict.
  returned: always
  type: list
  elements: dict
  contains:
    proto: {description: "C(tcp), C(tcp6), C(udp) or C(udp6).", type: str, sample: tcp}
    address: {description: Bound address; an IPv4-mapped IPv6 address is given as IPv4., type: str, sample: 0.0.0.0}
    port: {description: Bound port., type: int, sample: 40123}
    inode: {description: Socket inode., type: int}
    processes:
      description: "Processes holding the socket (pid, name, cmdline); empty when none could be read."
      type: list
      elements: dict
    verdict: {description: "V(allowed), V(violation), V(ignored) (not cluster-internal) or V(unattributed).", type: str}
    reason: {description: Why., type: str, sample: fabric address}
    message: {description: "For a violation, the message.", type: str}
violations:
  description: One message per violation.
  returned: always
  type: list
  elements: str
  sample:
    - "spark1: raylet (pid 4242) listens on 0.0.0.0:40123, a wildcard reachable from the management network;
      bind it to the fabric address 198.18.200.12 (see docs/security.md) or firewall it"
"""

import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import AuditError, audit


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            fabric_ip=dict(type="str", required=True),
            management_ip=dict(type="str"),
            host=dict(type="str"),
            allow=dict(type="list", elements="dict", default=[{"port": 22}],
                       options=dict(port=dict(type="int"), address=dict(type="str"), process=dict(type="str"))),
            scope=dict(type="str", choices=["cluster", "all"], default="cluster"),
            patterns=dict(type="list", elements="str"),
            include_udp=dict(type="bool", default=False),
            fail_on_violation=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = audit(params["fabric_ip"], allow=params["allow"], scope=params["scope"], patterns=params["patterns"],
                       include_udp=params["include_udp"], management_ip=params["management_ip"],
                       host=params["host"] or socket.gethostname())
    except AuditError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg="could not read /proc: %s" % exc)
    if result["violations"] and params["fail_on_violation"]:
        module.fail_json(msg="; ".join(result["violations"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
