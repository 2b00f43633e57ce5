#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_probe
short_description: Probe fabric reachability from this host to every peer
version_added: 0.1.0
description:
  - Phase V(listen) starts a short-lived probe listener (TCP and UDP) on this host's fabric address and
    O(port). It answers only the fabric addresses of O(peers), and exits once every peer has finished probing
    it (a DONE carrying O(token)), or after O(listen_seconds).
  - Phase V(probe) checks, for every peer, that the route leaves through the fabric interface with the
    fabric address as source (C(ip route get)), that a TCP connection bound to the local fabric address
    reaches the peer's listener (with round-trip latency), and that a UDP datagram of the fabric MTU
    crosses with don't-fragment set. It also reports whether the peer's management address answers; an
    unreachable management address is reported, not failed.
  - The module does not fail on broken pairs; the P(multinode.vllm._fabric_probe_report#filter) filter assembles
    every host's result into the all-pairs matrix and the role fails listing every broken pair.
  - Phase V(stop) stops this host's listener early (through a unix socket private to the host's network
    namespace, so a firewall on the fabric cannot get in the way).
  - Needs only Python and C(ip) on the host; no ICMP tools or packages.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  phase:
    description:
      - V(listen) starts this host's listener; V(probe) probes the peers; V(stop) stops the listener.
      - V(listen_probe) does both in one run (one module start per host instead of two); every host runs it in the
        same task, so a peer whose listener is not up yet is retried for O(listener_wait) seconds while it refuses.
    type: str
    choices: [listen, probe, listen_probe, stop]
    required: true
  host:
    description: This host's inventory name (peers identify the listener by it).
    type: str
    required: true
  fabric_ip:
    description: This host's fabric address.
    type: str
    required: true
  fabric_interface:
    description: This host's fabric interface. Required for V(probe).
    type: str
  mtu:
    description: This host's fabric MTU; the UDP payload is MTU minus 28 bytes. Required for V(probe).
    type: int
  peers:
    description: The other cluster hosts. Required for V(probe); for V(listen), their names end the listener early.
    type: list
    elements: dict
    default: []
    suboptions:
      host: {description: Peer inventory name., type: str, required: true}
      fabric_ip: {description: Peer fabric address., type: str, required: true}
      mgmt_ip:
        description: Peer management address; reported, never failed.
        type: str
  token:
    description:
      - This run's secret, the same on every host (the fabric role makes one per run). The listener answers only
        O(peers)' fabric addresses and ends early only on a DONE that carries it, so no other host on the fabric
        can stop it. Required for V(listen), V(probe) and V(listen_probe). Never logged.
    type: str
  port:
    description: TCP and UDP port of the probe listener, on the fabric address.
    type: int
    default: 29499
  timeout:
    description: Seconds to wait for each TCP connect and for each MTU echo.
    type: float
    default: 2.0
  listen_seconds:
    description: Upper bound on the listener's lifetime.
    type: float
    default: 120.0
  listener_wait:
    description:
      - With V(listen_probe), seconds a peer's refusing port is retried (its listener starts in the same task, a
        moment apart). A timeout or an unreachable network is reported at once; only a refusal waits.
    type: float
    default: 15.0
  mgmt_port:
    description: TCP port tried on each peer's management address (SSH).
    type: int
    default: 22
  mgmt_timeout:
    description:
      - Seconds to wait on the peer's management address. Its reachability is reported, never required, and the
        probe of a peer ends only after this check, so it is short; a host on a LAN answers within a millisecond.
    type: float
    default: 0.5
"""

EXAMPLES = r"""
- name: Listen and probe every peer in one run per node (what the fabric role does)
  multinode.vllm.fabric_probe:
    phase: listen_probe
    host: "{{ inventory_hostname }}"
    fabric_ip: "{{ multinode_fabric.ip }}"
    fabric_interface: "{{ multinode_fabric.interface }}"
    mtu: "{{ multinode_fabric.mtu }}"
    peers: "{{ fabric_peers }}"
    token: "{{ probe_token }}"

- name: Start the probe listener on every node
  multinode.vllm.fabric_probe:
    phase: listen
    host: "{{ inventory_hostname }}"
    fabric_ip: "{{ multinode_fabric.ip }}"
    peers: "{{ fabric_peers }}"
    token: "{{ probe_token }}"

- name: Probe every peer
  multinode.vllm.fabric_probe:
    phase: probe
    host: "{{ inventory_hostname }}"
    fabric_ip: "{{ multinode_fabric.ip }}"
    fabric_interface: "{{ multinode_fabric.interface }}"
    mtu: "{{ multinode_fabric.mtu }}"
    peers: "{{ fabric_peers }}"
    token: "{{ probe_token }}"
  register: probe
"""

RETURN = r"""
listener_pid:
  description: Pid of the detached listener (phase V(listen) or V(listen_probe)).
  returned: phase is listen or listen_probe
  type: int
peers:
  description: One result per peer (phase V(probe) or V(listen_probe)).
  returned: phase is probe or listen_probe
  type: list
  elements: dict
  contains:
    host: {description: Peer name., type: str}
    fabric_ip: {description: Peer fabric address., type: str}
    route: {description: "C(dev), C(src), C(ok) and C(error) of the route to the peer.", type: dict}
    tcp: {description: "C(ok), C(error), C(connect_ms), C(rtt_ms) and C(answered_by).", type: dict}
    mtu: {description: "C(ok), C(mtu), C(payload) and C(error) of the don't-fragment UDP echo.", type: dict}
    mgmt: {description: "C(address), C(reachable) and C(detail) of the peer's management address.", type: dict}
stopped:
  description: Whether a listener was running and has been asked to stop (phase V(stop)).
  returned: phase is stop
  type: bool
problems:
  description: This host's broken pairs, as C(src -> dst (ip) - what).
  returned: phase is probe
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._probe import (
    ProbeError,
    pair_problems,
    probe_peers,
    spawn_listener,
    stop_listener,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            phase=dict(type="str", choices=["listen", "probe", "listen_probe", "stop"], required=True),
            host=dict(type="str", required=True),
            fabric_ip=dict(type="str", required=True),
            fabric_interface=dict(type="str"),
            mtu=dict(type="int"),
            peers=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    host=dict(type="str", required=True),
                    fabric_ip=dict(type="str", required=True),
                    mgmt_ip=dict(type="str"),
                ),
            ),
            token=dict(type="str", no_log=True),
            port=dict(type="int", default=29499),
            timeout=dict(type="float", default=2.0),
            listen_seconds=dict(type="float", default=120.0),
            listener_wait=dict(type="float", default=15.0),
            mgmt_port=dict(type="int", default=22),
            mgmt_timeout=dict(type="float", default=0.5),
        ),
        required_if=[
            ("phase", "listen", ("token",)),
            ("phase", "probe", ("fabric_interface", "mtu", "token")),
            ("phase", "listen_probe", ("fabric_interface", "mtu", "token")),
        ],
        supports_check_mode=True,
    )
    p = module.params
    if p["phase"] == "stop":
        module.exit_json(changed=False, stopped=stop_listener(p["port"]))
    pid = None
    if p["phase"] in ("listen", "listen_probe"):
        try:
            pid = spawn_listener(
                p["fabric_ip"], p["port"], p["host"], {peer["host"]: peer["fabric_ip"] for peer in p["peers"]},
                p["listen_seconds"], p["token"],
            )
        except ProbeError as exc:
            module.fail_json(msg="%s: %s" % (p["host"], exc))
        if p["phase"] == "listen":
            module.exit_json(changed=False, listener_pid=pid)

    results = probe_peers(
        p["host"],
        p["fabric_interface"],
        p["fabric_ip"],
        p["peers"],
        port=p["port"],
        timeout=p["timeout"],
        mtu=p["mtu"],
        mgmt_port=p["mgmt_port"],
        mgmt_timeout=p["mgmt_timeout"],
        listener_wait=p["listener_wait"] if p["phase"] == "listen_probe" else 0.0,
        token=p["token"],
    )
    problems = [msg for result in results for msg in pair_problems(p["host"], result)]
    extra = {"listener_pid": pid} if pid is not None else {}
    module.exit_json(changed=False, peers=results, problems=problems, **extra)


if __name__ == "__main__":
    main()
