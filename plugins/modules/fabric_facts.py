#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: fabric_facts
short_description: Find this host's fabric interface, address, MTU and RDMA ports
version_added: 0.1.0
description:
  - Reads the host's interfaces (C(/sys/class/net), C(ip -j addr), C(ip -j route)) and RDMA devices
    (C(/sys/class/infiniband)), then chooses the interface and address on O(fabric_cidr).
  - Finds every PCIe endpoint of the fabric interface's physical port. A DGX Spark's QSFP port is two PCIe x4
    endpoints, each with its own netdev and RDMA device (C(enp1s0f1np1)/C(rocep1s0f1) and
    C(enP2p1s0f1np1)/C(roceP2p1s0f1)); they are paired by PCI address (the same bus, device and function on
    two PCI domains) or by the adapter's C(sys_image_guid) with the same C(phys_port_name). Each endpoint is
    reported with its state, speed, MTU, address and the RoCE v2 GID index that holds the address; the other
    half is used for NCCL when it is up, ACTIVE, addressed and at the fabric interface's MTU, and otherwise
    named in a warning with the fix.
  - Fails with a message that names the host, the values seen and the fix when no usable fabric
    address exists, several are ambiguous, or the interface is down.
  - Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  fabric_cidr:
    description: The fabric subnet, for example V(198.18.200.0/24).
    type: str
    required: true
  fabric_ip:
    description: The address this host must carry on the fabric (from host_vars). Optional.
    type: str
  fabric_interface:
    description: The interface to use when several carry fabric addresses. Optional.
    type: str
  allow_link_down:
    description:
      - Return a down or carrier-less fabric interface as RV(ansible_facts.multinode_fabric.link_error) instead of failing,
        so that the cluster-wide probe can name every pair the link breaks.
    type: bool
    default: false
  host:
    description: The name used in messages, normally C(inventory_hostname); the system hostname when unset.
    type: str
notes:
  - Only IPv4 is supported on the fabric.
"""

EXAMPLES = r"""
- name: Gather fabric facts
  multinode.vllm.fabric_facts:
    fabric_cidr: "{{ fabric_cidr }}"
    fabric_ip: "{{ fabric_ip | default(omit) }}"
    fabric_interface: "{{ fabric_interface | default(omit) }}"
    host: "{{ inventory_hostname }}"

- name: Show the chosen fabric address
  ansible.builtin.debug:
    msg: "{{ multinode_fabric.interface }} {{ multinode_fabric.ip }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: dict
  contains:
    multinode_fabric:
      description: The fabric selection.
      type: dict
      contains:
        host: {description: Host name used in messages., type: str}
        interface: {description: Fabric interface name., type: str, sample: enp1s0f1np1}
        ip: {description: Fabric IPv4 address., type: str, sample: 198.18.200.12}
        prefix: {description: Prefix length of the fabric address., type: int, sample: 24}
        network: {description: The on-link fabric network., type: str, sample: 198.18.200.0/24}
        mtu: {description: MTU of the fabric interface., type: int, sample: 9000}
        hca_ports:
          description:
            - The RDMA C(hca:port) names NCCL_IB_HCA lists, the fabric interface's first, then every usable other
              half of its port (C(fabric_port) entries with C(used) true).
          type: list
          elements: str
          sample: [rocep1s0f1:1, roceP2p1s0f1:1]
        rdma: {description: The RDMA ports whose netdev is the fabric interface (with state and link layer)., type: list, elements: dict}
        gid_index: {description: Index of the RoCE v2 GID that carries the fabric address (null when none)., type: int}
        fabric_port:
          description:
            - Every PCIe endpoint of the fabric interface's physical port, one entry per RDMA port (the fabric
              interface's first, C(role) V(fabric); the other half of a DGX Spark's port, C(role) V(sibling)).
            - Empty when the fabric interface has no RDMA port.
          type: list
          elements: dict
          contains:
            netdev: {description: The interface., type: str, sample: enP2p1s0f1np1}
            role: {description: V(fabric) or V(sibling)., type: str}
            pci_slot: {description: Its PCI function (null when unknown)., type: str, sample: "0002:01:00.1"}
            phys_port_name: {description: Its switchdev port name (null when the driver has none)., type: str, sample: p1}
            operstate: {description: The interface's operational state., type: str}
            speed: {description: Link speed in Mb/s (null when unreadable)., type: int}
            mtu: {description: The interface's MTU., type: int}
            ip: {description: The IPv4 address a RoCE v2 GID holds (else its first address; null when none)., type: str}
            hca: {description: The RDMA device (null when none)., type: str, sample: roceP2p1s0f1}
            port: {description: Its port number., type: int}
            rdma_state: {description: The RDMA port state as sysfs reports it., type: str, sample: "4: ACTIVE"}
            gid_index: {description: Index of the RoCE v2 GID that holds C(ip) (null when none)., type: int}
            used: {description: Whether NCCL_IB_HCA lists it., type: bool}
            problem: {description: Why it is not used or what NCCL would get wrong and the fix (null when none)., type: str}
        addr_range:
          description:
            - The NCCL_IB_ADDR_RANGE under which NCCL picks, on every used RDMA port, the RoCE v2 GID that holds its
              address; O(fabric_cidr), or its smallest supernet holding every used endpoint's address (a Spark's
              two halves are often on two subnets). Null without RDMA ports.
          type: str
          sample: 198.18.200.0/23
        mgmt_interface: {description: The interface holding the default route., type: str, sample: eth0}
        mgmt_ip: {description: Its first IPv4 address., type: str, sample: 198.19.1.10}
        warnings: {description: Non-fatal observations., type: list, elements: str}
        link_error: {description: Why the fabric link is unusable (only with O(allow_link_down)); null when it is up., type: str}
    multinode_network:
      description:
        - The raw interface and RDMA data the choice was made from (each interface with its C(pci_slot) and
          C(phys_port_name), each RDMA port with its C(sys_image_guid) and GID table).
      type: dict
"""

import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    parse_network,
    select_fabric,
)
from ansible_collections.multinode.vllm.plugins.module_utils._sysfs import read_network


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            fabric_cidr=dict(type="str", required=True),
            fabric_ip=dict(type="str"),
            fabric_interface=dict(type="str"),
            host=dict(type="str"),
            allow_link_down=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    host = module.params["host"] or socket.gethostname()
    try:
        raw = read_network()
    except (OSError, ValueError) as exc:
        module.fail_json(msg="%s: could not read interfaces with `ip -j`: %s" % (host, exc))
    try:
        selection = select_fabric(
            host,
            parse_network(raw),
            module.params["fabric_cidr"],
            fabric_ip=module.params["fabric_ip"],
            fabric_interface=module.params["fabric_interface"],
            allow_link_down=module.params["allow_link_down"],
        )
    except FabricError as exc:
        module.fail_json(msg=str(exc), multinode_network=raw)
    for warning in selection.warnings:
        module.warn(warning)
    module.exit_json(
        changed=False,
        ansible_facts=dict(multinode_fabric=selection.as_dict(), multinode_network=raw),
    )


if __name__ == "__main__":
    main()
