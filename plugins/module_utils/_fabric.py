# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fabric model: which interface and address a host uses for cluster traffic.

Pure and typed: no Ansible imports, no I/O. ``fabric_facts`` reads a host and
feeds the data here; tests feed data written from real layouts.

Words used everywhere in this collection:
- fabric: the fast cluster interconnect on its own subnet (``fabric_cidr``).
- mgmt: the management network, the one holding the default route.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import whole_number
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem, messages


class FabricError(MultinodeError):
    """Bad input or host state; the message names host, value and fix."""


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[ipaddress.IPv4Interface, ...]
    mtu: int
    operstate: str = "unknown"
    carrier: Optional[bool] = None
    speed: Optional[int] = None
    default_route: bool = False
    # The PCI function (``0000:01:00.1``, from device/uevent) and the switchdev port name (``p1``): which
    # physical port the interface belongs to (``port_siblings``).
    pci_slot: Optional[str] = None
    phys_port_name: Optional[str] = None

    @property
    def link_up(self) -> bool:
        return self.operstate.lower() not in ("down", "lowerlayerdown", "notpresent") and self.carrier is not False


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str
    netdev: Optional[str] = None

    @property
    def ipv4(self) -> Optional[str]:
        """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
        try:
            addr = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        mapped = addr.ipv4_mapped
        return str(mapped) if mapped is not None else None


@dataclass(frozen=True)
class RdmaPort:
    hca: str
    port: int
    state: str
    link_layer: str
    netdev: Optional[str]
    gids: tuple[Gid, ...] = ()
    sys_image_guid: Optional[str] = None

    @property
    def name(self) -> str:
        return "%s:%d" % (self.hca, self.port)

    @property
    def active(self) -> bool:
        # sysfs reports "4: ACTIVE"
        return "ACTIVE" in self.state.upper()


@dataclass(frozen=True)
class PortMember:
    """One PCIe endpoint of the fabric's physical port: a netdev and its RDMA port.

    A plain ConnectX port has one (the fabric interface); a DGX Spark's QSFP port has two, one per PCIe x4
    endpoint (``enp1s0f1np1``/``rocep1s0f1`` and ``enP2p1s0f1np1``/``roceP2p1s0f1``). ``role`` is ``fabric`` for
    the fabric interface's own RDMA port and ``sibling`` for the other half; ``used`` says whether NCCL_IB_HCA lists
    it and ``problem`` why not (a sibling that is down, unaddressed or at another MTU).
    """

    netdev: str
    role: str
    hca: Optional[str] = None
    port: Optional[int] = None
    rdma_state: str = ""
    operstate: str = "unknown"
    speed: Optional[int] = None
    mtu: int = 0
    ip: Optional[str] = None
    gid_index: Optional[int] = None
    pci_slot: Optional[str] = None
    phys_port_name: Optional[str] = None
    used: bool = False
    problem: Optional[str] = None

    @property
    def hca_port(self) -> Optional[str]:
        return "%s:%d" % (self.hca, self.port) if self.hca is not None and self.port is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "netdev": self.netdev,
            "role": self.role,
            "pci_slot": self.pci_slot,
            "phys_port_name": self.phys_port_name,
            "operstate": self.operstate,
            "speed": self.speed,
            "mtu": self.mtu,
            "ip": self.ip,
            "hca": self.hca,
            "port": self.port,
            "rdma_state": self.rdma_state,
            "gid_index": self.gid_index,
            "used": self.used,
            "problem": self.problem,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PortMember":
        port = data.get("port")
        gid_index = data.get("gid_index")
        return cls(
            netdev=str(data["netdev"]),
            role=str(data.get("role") or "sibling"),
            hca=data.get("hca"),
            port=None if port is None else int(port),
            rdma_state=str(data.get("rdma_state") or ""),
            operstate=str(data.get("operstate") or "unknown"),
            speed=data.get("speed"),
            mtu=int(data.get("mtu") or 0),
            ip=data.get("ip"),
            gid_index=None if gid_index is None else int(gid_index),
            pci_slot=data.get("pci_slot"),
            phys_port_name=data.get("phys_port_name"),
            used=bool(data.get("used")),
            problem=data.get("problem"),
        )


@dataclass(frozen=True)
class HostNetwork:
    interfaces: tuple[Interface, ...]
    rdma_ports: tuple[RdmaPort, ...] = ()

    def interface(self, name: str) -> Optional[Interface]:
        for iface in self.interfaces:
            if iface.name == name:
                return iface
        return None


@dataclass(frozen=True)
class FabricSelection:
    """The result of the model for one host."""

    host: str
    interface: str
    address: ipaddress.IPv4Interface
    mtu: int
    rdma_ports: tuple[RdmaPort, ...] = ()
    gid_index: Optional[int] = None
    mgmt_interface: Optional[str] = None
    mgmt_ip: Optional[str] = None
    warnings: tuple[str, ...] = field(default=())
    # Set instead of raising when the caller allows a down link (the probe then
    # names every pair it breaks).
    link_error: Optional[str] = None
    # Every PCIe endpoint of the fabric's physical port (the fabric interface's RDMA ports first, then the other
    # half's on a Spark), and the NCCL_IB_ADDR_RANGE that selects each used one's RoCE v2 GID by address.
    members: tuple[PortMember, ...] = ()
    addr_range: Optional[str] = None

    @property
    def ip(self) -> str:
        return str(self.address.ip)

    @property
    def hca_ports(self) -> tuple[str, ...]:
        """The RDMA ports NCCL_IB_HCA lists: every used endpoint of the fabric port (facts from before the
        endpoints were gathered: the fabric interface's own RDMA ports)."""
        if self.members:
            return tuple(m.hca_port for m in self.members if m.used and m.hca_port is not None)
        return tuple(port.name for port in self.rdma_ports)

    @property
    def used_members(self) -> tuple[PortMember, ...]:
        return tuple(m for m in self.members if m.used and m.hca_port is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "interface": self.interface,
            "ip": self.ip,
            "prefix": self.address.network.prefixlen,
            "network": str(self.address.network),
            "mtu": self.mtu,
            "hca_ports": list(self.hca_ports),
            "rdma": [
                {
                    "hca": p.hca,
                    "port": p.port,
                    "state": p.state,
                    "link_layer": p.link_layer,
                    "netdev": p.netdev,
                }
                for p in self.rdma_ports
            ],
            "gid_index": self.gid_index,
            "mgmt_interface": self.mgmt_interface,
            "mgmt_ip": self.mgmt_ip,
            "warnings": list(self.warnings),
            "link_error": self.link_error,
            "fabric_port": [m.as_dict() for m in self.members],
            "addr_range": self.addr_range,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FabricSelection":
        """Rebuild a selection from ``as_dict`` output (facts gathered earlier)."""
        try:
            address = ipaddress.IPv4Interface("%s/%s" % (data["ip"], data["prefix"]))
            rdma = tuple(
                RdmaPort(
                    hca=str(p["hca"]),
                    port=int(p["port"]),
                    state=str(p.get("state", "")),
                    link_layer=str(p.get("link_layer", "")),
                    netdev=p.get("netdev"),
                )
                for p in data.get("rdma") or ()
            )
            return cls(
                host=str(data["host"]),
                interface=str(data["interface"]),
                address=address,
                mtu=int(data["mtu"]),
                rdma_ports=rdma,
                gid_index=data.get("gid_index"),
                mgmt_interface=data.get("mgmt_interface"),
                mgmt_ip=data.get("mgmt_ip"),
                warnings=tuple(data.get("warnings") or ()),
                link_error=data.get("link_error"),
                members=tuple(PortMember.from_dict(m) for m in data.get("fabric_port") or ()),
                addr_range=data.get("addr_range"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            shown = dict(data) if isinstance(data, Mapping) else data
            raise FabricError("fabric facts are incomplete or malformed (%s): %r" % (exc, shown))


# ---------------------------------------------------------------------------
# Parsing raw host data (as gathered by fabric_facts) into the model
# ---------------------------------------------------------------------------


def parse_network(data: Mapping[str, Any]) -> HostNetwork:
    """Build a HostNetwork from plain data.

    ``data`` = {"interfaces": [{"name", "addresses": ["a.b.c.d/p", ...], "mtu",
    "operstate", "carrier", "speed", "default_route", "pci_slot", "phys_port_name"}], "rdma": [{"hca", "port",
    "state", "link_layer", "netdev", "sys_image_guid", "gids": [{"index", "gid", "type", "netdev"}]}]}
    """
    interfaces = []
    for raw in data.get("interfaces") or ():
        addresses = []
        for addr in raw.get("addresses") or ():
            try:
                addresses.append(ipaddress.IPv4Interface(addr))
            except ValueError:
                continue  # IPv6 or junk: the fabric model is IPv4-only
        carrier = raw.get("carrier")
        interfaces.append(
            Interface(
                name=str(raw["name"]),
                addresses=tuple(addresses),
                mtu=int(raw.get("mtu") or 0),
                operstate=str(raw.get("operstate") or "unknown"),
                carrier=None if carrier is None else bool(carrier),
                speed=raw.get("speed"),
                default_route=bool(raw.get("default_route")),
                pci_slot=raw.get("pci_slot"),
                phys_port_name=raw.get("phys_port_name"),
            )
        )
    ports = []
    for raw in data.get("rdma") or ():
        gids = tuple(
            Gid(index=int(g["index"]), gid=str(g["gid"]), type=str(g.get("type") or ""), netdev=g.get("netdev"))
            for g in raw.get("gids") or ()
        )
        ports.append(
            RdmaPort(
                hca=str(raw["hca"]),
                port=int(raw["port"]),
                state=str(raw.get("state") or ""),
                link_layer=str(raw.get("link_layer") or ""),
                netdev=raw.get("netdev"),
                gids=gids,
                sys_image_guid=raw.get("sys_image_guid"),
            )
        )
    return HostNetwork(interfaces=tuple(interfaces), rdma_ports=tuple(ports))


def parse_cidr(fabric_cidr: Any, host: str = "cluster") -> ipaddress.IPv4Network:
    """Parse ``fabric_cidr``; refuse loopback and link-local ranges."""
    try:
        network = ipaddress.IPv4Network(str(fabric_cidr), strict=False)
    except ValueError:
        raise FabricError(
            "%s: fabric_cidr %r is not an IPv4 network; set it in group_vars, e.g. fabric_cidr: 198.18.200.0/24"
            % (host, fabric_cidr)
        )
    if network.is_loopback or network.is_link_local:
        raise FabricError(
            "%s: fabric_cidr %s is a %s range, which other nodes cannot reach; use the fabric subnet"
            % (host, network, "loopback" if network.is_loopback else "link-local")
        )
    return network


def _describe(network: HostNetwork) -> str:
    parts = []
    for iface in network.interfaces:
        addrs = ",".join(str(a) for a in iface.addresses) or "no IPv4"
        parts.append("%s=%s" % (iface.name, addrs))
    return "; ".join(parts) or "no interfaces"


def _check_usable_address(host: str, ip: ipaddress.IPv4Address, what: str) -> None:
    if ip.is_loopback:
        raise FabricError(
            "%s: %s %s is a loopback address; Ray and vLLM need an address peers can reach (the fabric address)"
            % (host, what, ip)
        )
    if ip.is_link_local:
        raise FabricError(
            "%s: %s %s is link-local (169.254.0.0/16); give the fabric interface a routable address in fabric_cidr"
            % (host, what, ip)
        )


def select_fabric(
    host: str,
    network: HostNetwork,
    fabric_cidr: Any,
    fabric_ip: Optional[str] = None,
    fabric_interface: Optional[str] = None,
    allow_link_down: bool = False,
) -> FabricSelection:
    """Choose the host's fabric interface and address, or raise FabricError.

    With ``allow_link_down`` a down link is returned as ``link_error`` rather
    than raised, so a cluster-wide probe can still name every affected pair.
    """
    cidr = parse_cidr(fabric_cidr, host)
    wanted_ip: Optional[ipaddress.IPv4Address] = None
    if fabric_ip:
        try:
            wanted_ip = ipaddress.IPv4Address(str(fabric_ip))
        except ValueError:
            raise FabricError("%s: fabric_ip %r is not an IPv4 address; fix host_vars/%s.yml" % (host, fabric_ip, host))
        _check_usable_address(host, wanted_ip, "fabric_ip")
        if wanted_ip not in cidr:
            raise FabricError(
                "%s: fabric_ip %s is outside fabric_cidr %s; set fabric_ip in host_vars/%s.yml to this host's "
                "address on the fabric subnet" % (host, wanted_ip, cidr, host)
            )

    def in_cidr(iface: Interface) -> list[ipaddress.IPv4Interface]:
        return [a for a in iface.addresses if a.ip in cidr]

    if fabric_interface:
        iface = network.interface(fabric_interface)
        if iface is None:
            raise FabricError(
                "%s: fabric_interface %s does not exist on this host (interfaces: %s); fix host_vars/%s.yml"
                % (host, fabric_interface, ", ".join(i.name for i in network.interfaces) or "none", host)
            )
        candidates = in_cidr(iface)
        if wanted_ip is not None:
            chosen = [a for a in candidates if a.ip == wanted_ip]
            if not chosen:
                raise FabricError(
                    "%s: fabric_interface %s does not carry fabric_ip %s (it has %s); assign the address or fix "
                    "host_vars/%s.yml" % (host, iface.name, wanted_ip, ",".join(map(str, iface.addresses)) or "no IPv4", host)
                )
            candidates = chosen
        elif not candidates:
            raise FabricError(
                "%s: fabric_interface %s has no address in fabric_cidr %s (it has %s); assign it one or fix "
                "host_vars/%s.yml" % (host, iface.name, cidr, ",".join(map(str, iface.addresses)) or "no IPv4", host)
            )
    elif wanted_ip is not None:
        holders = [i for i in network.interfaces if any(a.ip == wanted_ip for a in i.addresses)]
        if not holders:
            raise FabricError(
                "%s: no interface carries fabric_ip %s (seen: %s); assign it to the fabric interface or fix "
                "host_vars/%s.yml" % (host, wanted_ip, _describe(network), host)
            )
        iface = holders[0]
        candidates = [a for a in iface.addresses if a.ip == wanted_ip]
    else:
        holders = [i for i in network.interfaces if in_cidr(i)]
        if not holders:
            raise FabricError(
                "%s: no interface has an address in fabric_cidr %s (seen: %s); bring up the fabric interface "
                "or correct fabric_cidr" % (host, cidr, _describe(network))
            )
        if len(holders) > 1:
            raise FabricError(
                "%s: interfaces %s all have addresses in fabric_cidr %s; name one with fabric_interface "
                "(and fabric_ip) in host_vars/%s.yml"
                % (host, " and ".join(i.name for i in holders), cidr, host)
            )
        iface = holders[0]
        candidates = in_cidr(iface)

    if len(candidates) > 1:
        raise FabricError(
            "%s: %s has several addresses in fabric_cidr %s (%s); set fabric_ip in host_vars/%s.yml"
            % (host, iface.name, cidr, ", ".join(str(a.ip) for a in candidates), host)
        )
    address = candidates[0]
    _check_usable_address(host, address.ip, "fabric address")

    link_down = iface.operstate.lower() in ("down", "lowerlayerdown", "notpresent")
    link_error = None
    if link_down or iface.carrier is False:
        state = iface.operstate.lower() if link_down else "up without carrier"
        link_error = "%s: fabric interface %s (%s) is %s; check the cable and run `ip link set %s up`" % (
            host, iface.name, address.ip, state, iface.name)
        if not allow_link_down:
            raise FabricError(link_error)

    warnings: list[str] = []
    if iface.default_route:
        warnings.append(
            "%s: fabric interface %s also holds the default route: management and cluster traffic share it"
            % (host, iface.name)
        )
    mgmt = next((i for i in network.interfaces if i.default_route), None)
    # The management address: the default route's interface's first address outside fabric_cidr (an interface
    # carrying both would otherwise report its fabric alias as mgmt); only its fabric address when it has no other,
    # which check_cluster refuses.
    mgmt_ips = [a.ip for a in mgmt.addresses] if mgmt is not None else []
    mgmt_ip = next((str(ip) for ip in mgmt_ips if ip not in cidr), str(mgmt_ips[0]) if mgmt_ips else None)

    ports = tuple(p for p in network.rdma_ports if p.netdev == iface.name)
    for port in ports:
        if not port.active:
            warnings.append("%s: RDMA port %s of %s is %s, not ACTIVE" % (host, port.name, iface.name, port.state))
    gid_index = roce_v2_gid_index(ports, str(address.ip))
    members, addr_range = fabric_port(network, iface, address, ports, cidr)
    for member in members:
        if member.problem is not None:
            if member.used:
                warnings.append("%s: %s" % (host, member.problem))
            else:
                warnings.append(
                    "%s: %s. NCCL_IB_HCA leaves %s out until then, so NCCL reaches about half of the port"
                    % (host, member.problem, member.hca_port or member.netdev)
                )

    return FabricSelection(
        host=host,
        interface=iface.name,
        address=address,
        mtu=iface.mtu,
        rdma_ports=ports,
        gid_index=gid_index,
        mgmt_interface=mgmt.name if mgmt is not None else None,
        mgmt_ip=mgmt_ip,
        warnings=tuple(warnings),
        link_error=link_error,
        members=members,
        addr_range=addr_range,
    )


# ---------------------------------------------------------------------------
# The fabric's physical port: both halves of a DGX Spark's QSFP port
# ---------------------------------------------------------------------------


def _split_slot(slot: Optional[str]) -> Optional[tuple[str, str]]:
    """``0002:01:00.1`` -> (``0002``, ``01:00.1``): the PCI domain and the rest of the address."""
    if not slot or slot.count(":") != 2:
        return None
    domain, rest = slot.split(":", 1)
    return domain.lower(), rest.lower()


def port_siblings(network: HostNetwork, name: str) -> tuple[Interface, ...]:
    """The other PCIe endpoints of the physical port that interface ``name`` belongs to.

    A DGX Spark's ConnectX-7 presents each QSFP port as two PCIe x4 endpoints on two PCI domains: the same
    bus/device/function on domain 0000 and 0002 (``enp1s0f1np1`` = 0000:01:00.1 and ``enP2p1s0f1np1`` =
    0002:01:00.1), each with its own netdev and RDMA device. Interfaces are the same port's endpoints when either

    - their PCI addresses are equal but for the domain, and their ``phys_port_name`` agrees where both have one; or
    - their RDMA devices report the same ``sys_image_guid`` (one adapter) and both netdevs the same
      ``phys_port_name`` (one port of it), on different PCI functions.

    The ports of a plain dual-port ConnectX share the adapter's GUID but not the port name (``p0``, ``p1``) nor,
    apart from the domain, the PCI address, so neither rule pairs them.
    """
    iface = network.interface(name)
    if iface is None:
        return ()
    guids = {p.netdev: p.sys_image_guid for p in network.rdma_ports if p.netdev and p.sys_image_guid}
    mine = _split_slot(iface.pci_slot)
    siblings = []
    for other in network.interfaces:
        if other.name == iface.name or other.pci_slot is None or other.pci_slot == iface.pci_slot:
            continue
        theirs = _split_slot(other.pci_slot)
        names_known = iface.phys_port_name is not None and other.phys_port_name is not None
        names_agree = not names_known or iface.phys_port_name == other.phys_port_name
        by_pci = mine is not None and theirs is not None and mine[0] != theirs[0] and mine[1] == theirs[1]
        guid = guids.get(iface.name)
        by_guid = guid is not None and guids.get(other.name) == guid and names_known and names_agree
        if (by_pci and names_agree) or by_guid:
            siblings.append(other)
    return tuple(sorted(siblings, key=lambda i: i.name))


def _covering_network(cidr: ipaddress.IPv4Network, ips: Iterable[str]) -> ipaddress.IPv4Network:
    """``cidr``, or its smallest supernet that holds every address in ``ips``."""
    network = cidr
    wanted = [ipaddress.IPv4Address(ip) for ip in ips]
    while any(ip not in network for ip in wanted):
        network = network.supernet()
    return network


def _member_address(iface: Interface, port: RdmaPort, cidr: ipaddress.IPv4Network) -> tuple[Optional[str], Optional[int]]:
    """The interface's IPv4 address that a RoCE v2 GID of ``port`` holds (one in ``cidr`` first), and its index."""
    addresses = sorted(iface.addresses, key=lambda a: a.ip not in cidr)
    for addr in addresses:
        index = roce_v2_gid_index((port,), str(addr.ip))
        if index is not None:
            return str(addr.ip), index
    return (str(addresses[0].ip) if addresses else None), None


def _sibling_problem(fabric: Interface, sibling: Interface, port: Optional[RdmaPort], ip: Optional[str],
                     gid_index: Optional[int]) -> Optional[str]:
    """Why NCCL cannot use this other half of the fabric port, with the fix; None when it can."""
    lead = "%s, the other half of %s's port (RDMA %s)," % (
        sibling.name, fabric.name, port.name if port is not None else "none")
    if port is None:
        return "%s has no RDMA device; load the RDMA driver for it (mlx5_ib) or check `rdma link show`" % lead
    if not sibling.link_up:
        state = sibling.operstate.lower() if sibling.carrier is not False else "up without carrier"
        return "%s is %s; bring it up (`ip link set %s up`, and in netplan) with an address and MTU %d as %s has" % (
            lead, state, sibling.name, fabric.mtu, fabric.name)
    if not port.active:
        return "%s has its RDMA port in state %s, not ACTIVE; check the link with `rdma link show %s`" % (
            lead, port.state, port.name)
    if ip is None:
        return ("%s has no IPv4 address, so no RoCE v2 GID of %s holds one for NCCL; give %s an address "
                "(in netplan)" % (lead, port.name, sibling.name))
    if gid_index is None:
        return ("%s carries %s but no RoCE v2 GID of %s holds it; check the RoCE mode of %s "
                "(/sys/class/infiniband/%s/ports/%d/gid_attrs/types/)" % (
                    lead, ip, port.name, port.hca, port.hca, port.port))
    if sibling.mtu != fabric.mtu:
        return "%s has MTU %d while %s has %d; set the same MTU on both halves (`ip link set dev %s mtu %d`, and in " \
               "netplan)" % (lead, sibling.mtu, fabric.name, fabric.mtu, sibling.name, fabric.mtu)
    return None


def fabric_port(
    network: HostNetwork,
    iface: Interface,
    address: ipaddress.IPv4Interface,
    ports: Sequence[RdmaPort],
    cidr: ipaddress.IPv4Network,
) -> tuple[tuple[PortMember, ...], Optional[str]]:
    """Every endpoint of the fabric interface's physical port, and the NCCL_IB_ADDR_RANGE for the used ones.

    The fabric interface's own RDMA ports are always used (a port that is not ACTIVE is warned about by the
    caller); another half is used when it is up, ACTIVE, carries an IPv4 address held by a RoCE v2 GID, and has
    the fabric interface's MTU. The range is ``fabric_cidr``, or its smallest supernet holding every used
    endpoint's address (a Spark's halves are often on two subnets); each used endpoint's GID is then checked
    to be the one NCCL picks under that range (``nccl_gid_index``), else that endpoint gets a problem.
    """
    if not ports:
        return (), None
    members: list[PortMember] = []
    for port in ports:
        members.append(PortMember(
            netdev=iface.name, role="fabric", hca=port.hca, port=port.port, rdma_state=port.state,
            operstate=iface.operstate, speed=iface.speed, mtu=iface.mtu, ip=str(address.ip),
            gid_index=roce_v2_gid_index((port,), str(address.ip)), pci_slot=iface.pci_slot,
            phys_port_name=iface.phys_port_name, used=True,
        ))
    for sibling in port_siblings(network, iface.name):
        sibling_ports: list[Optional[RdmaPort]] = [p for p in network.rdma_ports if p.netdev == sibling.name]
        for port in sibling_ports or [None]:
            ip, gid_index = _member_address(sibling, port, cidr) if port is not None else (None, None)
            problem = _sibling_problem(iface, sibling, port, ip, gid_index)
            members.append(PortMember(
                netdev=sibling.name, role="sibling", hca=port.hca if port else None, port=port.port if port else None,
                rdma_state=port.state if port else "", operstate=sibling.operstate, speed=sibling.speed,
                mtu=sibling.mtu, ip=ip, gid_index=gid_index, pci_slot=sibling.pci_slot,
                phys_port_name=sibling.phys_port_name, used=problem is None, problem=problem,
            ))
    used_ips = [m.ip for m in members if m.used and m.ip is not None and m.gid_index is not None]
    addr_range = _covering_network(cidr, used_ips)
    by_name = {p.name: p for p in network.rdma_ports}
    checked = []
    for member in members:
        port = by_name.get(member.hca_port or "")
        if member.used and member.gid_index is not None and port is not None:
            chosen = nccl_gid_index(port.gids, addr_range)
            if chosen != member.gid_index:
                problem = (
                    "NCCL_IB_ADDR_RANGE=%s would make NCCL use GID %d of %s, not GID %d that holds %s (%s); remove the "
                    "other address in that range from %s, or set node_env_gid_selection: index"
                    % (addr_range, chosen, member.hca_port, member.gid_index, member.ip, member.netdev, member.netdev)
                )
                member = replace(member, problem=problem, used=member.role == "fabric")
        checked.append(member)
    return tuple(checked), str(addr_range)


def _gid_family(gid: Optional[Gid]) -> str:
    # NCCL's getGidAddrFamily: an IPv4-mapped GID (::ffff:a.b.c.d) is AF_INET, any other AF_INET6.
    return "inet" if gid is not None and gid.ipv4 is not None else "inet6"


def _roce_version(gid: Optional[Gid]) -> Optional[int]:
    # NCCL's ncclIbRoceGetVersionNum reads gid_attrs/types/<index>: "IB/RoCE v1" or "RoCE v1" is 1, "RoCE v2" 2.
    kind = gid.type.strip() if gid is not None else ""
    if kind.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    if kind.startswith("RoCE v2"):
        return 2
    return None


def nccl_gid_index(gids: Iterable[Gid], addr_range: Optional[ipaddress.IPv4Network], roce_version: int = 2) -> int:
    """The GID index NCCL chooses on a RoCE port when NCCL_IB_GID_INDEX is unset (IPv4 family).

    A model of ``ncclIbGetGidIndex``/``ncclUpdateGidIndex`` (NCCL's src/transport/net_ib): starting from index 0,
    each later slot replaces the choice when it is an IPv4-mapped GID inside NCCL_IB_ADDR_RANGE and the current
    one is not IPv4, or when it is such a GID of the wanted RoCE version (NCCL_IB_ROCE_VERSION_NUM, default 2)
    and the current one is of another version. Empty (all-zero) slots never win; the sysfs reader drops them.
    """
    table = {g.index: g for g in gids}
    chosen = 0
    for index in range(1, max(table, default=0) + 1):
        candidate = table.get(index)
        if candidate is None:
            continue
        current = table.get(chosen)
        family = _gid_family(candidate)
        ipv4 = candidate.ipv4
        in_range = ipv4 is not None and (addr_range is None or ipaddress.IPv4Address(ipv4) in addr_range)
        if family != _gid_family(current) and family == "inet" and in_range:
            chosen = index
        elif family == "inet" and in_range:
            version = _roce_version(candidate)
            if (current is None or _roce_version(current) != version) and version == roce_version:
                chosen = index
    return chosen


def roce_v2_gid_index(ports: Iterable[RdmaPort], ip: str) -> Optional[int]:
    """Index of the RoCE v2 GID whose IPv4-mapped address is ``ip`` (first port that has one)."""
    for port in ports:
        for gid in sorted(port.gids, key=lambda g: g.index):
            if gid.type.replace(" ", "").lower() == "rocev2" and gid.ipv4 == ip:
                return gid.index
    return None


# ---------------------------------------------------------------------------
# Cluster-level checks
# ---------------------------------------------------------------------------


def check_heads(head_hosts: Sequence[str], hosts: Iterable[str]) -> list[str]:
    """Exactly one host in group ray_head, and it is a cluster host."""
    heads = list(head_hosts)
    known = set(hosts)
    if not heads:
        return ["no host in group ray_head; put exactly one host (the head node) in group ray_head in the inventory"]
    if len(heads) > 1:
        return [
            "group ray_head has %d hosts (%s); exactly one head is allowed: move the others to ray_workers"
            % (len(heads), ", ".join(heads))
        ]
    if heads[0] not in known:
        return [
            "ray_head host %s is not one of the cluster hosts (%s); put one of them in group ray_head"
            % (heads[0], ", ".join(sorted(known)))
        ]
    return []


def check_inventory(
    hosts: Mapping[str, Mapping[str, Any]],
    fabric_cidr: Any,
    head_hosts: Sequence[str],
) -> list[str]:
    """Checks that need only the inventory (run before touching any host).

    ``hosts`` maps each cluster host to its variables (``fabric_ip`` optional).
    Returns error messages; empty means the inventory is consistent.
    """
    try:
        cidr = parse_cidr(fabric_cidr)
    except FabricError as exc:
        return [str(exc)]
    errors = check_heads(head_hosts, hosts)
    seen: dict[str, str] = {}
    for host in sorted(hosts):
        value = hosts[host].get("fabric_ip")
        if not value:
            continue
        try:
            ip = ipaddress.IPv4Address(str(value))
        except ValueError:
            errors.append("%s: fabric_ip %r is not an IPv4 address; fix host_vars/%s.yml" % (host, value, host))
            continue
        if ip not in cidr:
            errors.append(
                "%s: fabric_ip %s is outside fabric_cidr %s; set fabric_ip in host_vars/%s.yml to this host's "
                "address on the fabric subnet" % (host, ip, cidr, host)
            )
        if str(ip) in seen:
            errors.append(
                "%s and %s both have fabric_ip %s; every node needs its own fabric address"
                % (seen[str(ip)], host, ip)
            )
        else:
            seen[str(ip)] = host
    return errors


def expected_mtu_problems(selections: Mapping[str, FabricSelection], expected_mtu: Any) -> list[Problem]:
    """``check_expected_mtu`` as Problems (rule ``fabric_mtu_expected``, or ``fabric_mtu_setting`` for a bad
    ``fabric_expected_mtu``)."""
    if expected_mtu is None or expected_mtu == "":
        return []
    expected = whole_number(expected_mtu)
    if expected is None or not 68 <= expected <= 65535:
        message = (
            "fabric_expected_mtu = %r: expected an MTU from 68 to 65535 (9000 for jumbo frames) or null to skip "
            "the check; fix it in group_vars" % (expected_mtu,)
        )
        return [Problem("fabric_mtu_setting", "fabric_expected_mtu = %r" % (expected_mtu,),
                        "not an MTU from 68 to 65535", "fix fabric_expected_mtu in group_vars (or null to skip)",
                        message=message)]
    problems = []
    for host, sel in sorted(selections.items()):
        seen = {sel.interface: sel.mtu}
        for member in sel.members:
            seen.setdefault(member.netdev, member.mtu)
        for netdev, mtu in seen.items():
            if mtu == expected:
                continue
            what = "fabric interface %s" % netdev if netdev == sel.interface else \
                "%s (the other half of fabric interface %s's port)" % (netdev, sel.interface)
            fix = "set it with `ip link set dev %s mtu %d` and in the host's netplan, or change fabric_expected_mtu" % (
                netdev, expected)
            problems.append(Problem(
                "fabric_mtu_expected", "%s has MTU %d" % (what, mtu),
                "expected %d (fabric_expected_mtu) on both halves of the fabric port at both ends of every link"
                % expected, fix, host=host,
                message="%s: %s has MTU %d, expected %d (fabric_expected_mtu) on both halves of the fabric port at "
                        "both ends of every link; %s" % (host, what, mtu, expected, fix)))
    return problems


def check_expected_mtu(selections: Mapping[str, FabricSelection], expected_mtu: Any) -> list[str]:
    """With ``fabric_expected_mtu`` set: every endpoint of every host's fabric port (both halves on a Spark, so both
    ends of every link) has that MTU. Returns error messages naming host, interface and both values."""
    return messages(expected_mtu_problems(selections, expected_mtu))


def mtu_mismatch_problem(selections: Mapping[str, FabricSelection]) -> Optional[Problem]:
    """The fabric MTU differs between hosts (rule ``fabric_mtu_mismatch``): the hosts off the most common MTU are
    named in the symptom; None when every host has the same MTU."""
    mtus = {host: sel.mtu for host, sel in selections.items()}
    if len(set(mtus.values())) < 2:
        return None
    listing = ", ".join(
        "%s %s=%d" % (host, selections[host].interface, mtu) for host, mtu in sorted(mtus.items())
    )
    counts: dict[int, int] = {}
    for mtu in mtus.values():
        counts[mtu] = counts.get(mtu, 0) + 1
    common = max(counts, key=lambda m: (counts[m], m))  # a tie: the larger MTU (jumbo frames) was meant
    odd = sorted(host for host, mtu in mtus.items() if mtu != common)
    return Problem(
        "fabric_mtu_mismatch", "fabric MTU differs between hosts (%s)" % listing,
        "%s %s not at the MTU of the others (%d): frames larger than the smaller MTU are dropped, so NCCL/Gloo "
        "connections hang after connecting" % (", ".join(odd), "is" if len(odd) == 1 else "are", common),
        "set the same MTU on every fabric interface (`ip link set dev <fabric interface> mtu %d` and in netplan)"
        % common,
        message="fabric MTU differs between hosts (%s); set the same MTU on every fabric interface" % listing)


def link_problem(selection: FabricSelection) -> Optional[Problem]:
    """The fabric link of a host is down (rule ``fabric_link_down``): from ``select_fabric(..., allow_link_down=
    True)``'s ``link_error``; None when it is up."""
    if not selection.link_error:
        return None
    symptom = selection.link_error.split("; ")[0]
    prefix = selection.host + ": "
    symptom = symptom[len(prefix):] if symptom.startswith(prefix) else symptom
    return Problem("fabric_link_down", symptom,
                   "the fabric link is down (cable, switch port or the far end), so no peer reaches this node over "
                   "the fabric: Ray, NCCL and Gloo traffic to it is lost",
                   "check the cable and the far end, then run `ip link set %s up`" % selection.interface,
                   host=selection.host, message=selection.link_error)


def cluster_problems(
    selections: Mapping[str, FabricSelection],
    fabric_cidr: Any,
    head_hosts: Sequence[str],
    inventory: Optional[Mapping[str, Mapping[str, Any]]] = None,
    expected_mtu: Any = None,
) -> list[Problem]:
    """``check_cluster`` as Problems (rules ``fabric_cidr``, ``inventory_heads``, ``fabric_outside_cidr``,
    ``fabric_prefix``, ``fabric_ip_mismatch``, ``fabric_is_mgmt``, ``fabric_ip_shared``, ``fabric_mtu_mismatch``,
    ``fabric_mtu_expected``)."""
    inventory = inventory or {}
    try:
        cidr = parse_cidr(fabric_cidr)
    except FabricError as exc:
        return [Problem("fabric_cidr", "fabric_cidr = %r" % (fabric_cidr,), "not a usable IPv4 network",
                        "set fabric_cidr in group_vars to the fabric subnet", message=str(exc))]
    problems = [Problem("inventory_heads", message, "the inventory does not name exactly one head among the hosts",
                        "put exactly one cluster host in group ray_head", message=message)
                for message in check_heads(head_hosts, selections)]

    by_ip: dict[str, list[str]] = {}
    for host, sel in sorted(selections.items()):
        by_ip.setdefault(sel.ip, []).append(host)
        if sel.address.ip not in cidr:
            problems.append(Problem(
                "fabric_outside_cidr", "fabric address %s is outside fabric_cidr %s" % (sel.ip, cidr),
                "the fabric interface carries an address of another subnet",
                "give it an address in fabric_cidr or correct fabric_cidr", host=host,
                message="%s: fabric address %s is outside fabric_cidr %s" % (host, sel.ip, cidr)))
        if sel.address.network != cidr:
            problems.append(Problem(
                "fabric_prefix", "%s is configured as %s, but fabric_cidr is %s" % (
                    sel.interface, sel.address.with_prefixlen, cidr),
                "the fabric interfaces are not on one subnet with one prefix",
                "configure every fabric interface on fabric_cidr with the same prefix", host=host,
                message="%s: %s is configured as %s, but fabric_cidr is %s; every fabric interface must be on one "
                        "subnet with the same prefix" % (host, sel.interface, sel.address.with_prefixlen, cidr)))
        wanted = inventory.get(host, {}).get("fabric_ip")
        if wanted and str(wanted) != sel.ip:
            problems.append(Problem(
                "fabric_ip_mismatch", "inventory fabric_ip is %s but the host carries %s on %s" % (
                    wanted, sel.ip, sel.interface),
                "the inventory and the host disagree on the fabric address", "fix host_vars/%s.yml" % host,
                host=host, message="%s: inventory fabric_ip is %s but the host carries %s on %s; fix host_vars/%s.yml"
                                   % (host, wanted, sel.ip, sel.interface, host)))
        if sel.mgmt_ip is not None and sel.mgmt_ip == sel.ip:
            problems.append(Problem(
                "fabric_is_mgmt", "fabric address %s on %s is also its management address" % (sel.ip, sel.interface),
                "cluster traffic would share the management link, and the firewall could not tell them apart",
                "give the fabric interface its own address in fabric_cidr %s (fabric_ip, fabric_interface in "
                "host_vars/%s.yml) or correct fabric_cidr" % (cidr, host), host=host,
                message="%s: fabric address (fabric_ip) = %s on %s is also its management address (%s holds the "
                        "default route): expected "
                        "a fabric address apart from management (the firewall opens the fabric to cluster nodes and "
                        "mgmt to SSH and the API only, and cluster traffic would share the management link); give "
                        "the fabric interface its own address in fabric_cidr %s (fabric_ip, fabric_interface in "
                        "host_vars/%s.yml) or correct fabric_cidr" % (
                            host, sel.ip, sel.interface, sel.mgmt_interface, cidr, host)))
    for ip, hosts in sorted(by_ip.items()):
        if len(hosts) > 1:
            problems.append(Problem(
                "fabric_ip_shared", "%s all carry fabric address %s" % (" and ".join(hosts), ip),
                "fabric addresses must be unique", "give each host its own fabric address",
                message="%s all carry fabric address %s; fabric addresses must be unique" % (" and ".join(hosts), ip)))
    mismatch = mtu_mismatch_problem(selections)
    if mismatch is not None:
        problems.append(mismatch)
    problems.extend(expected_mtu_problems(selections, expected_mtu))
    return problems


def check_cluster(
    selections: Mapping[str, FabricSelection],
    fabric_cidr: Any,
    head_hosts: Sequence[str],
    inventory: Optional[Mapping[str, Mapping[str, Any]]] = None,
    expected_mtu: Any = None,
) -> list[str]:
    """Checks over every host's selection. Returns error messages (empty = good).

    ``expected_mtu`` (``fabric_expected_mtu``, None = no check): the MTU every endpoint of the fabric port must
    have on every host (``check_expected_mtu``). The messages of ``cluster_problems``.
    """
    return messages(cluster_problems(selections, fabric_cidr, head_hosts, inventory, expected_mtu))
