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
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError


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

    @property
    def name(self) -> str:
        return "%s:%d" % (self.hca, self.port)

    @property
    def active(self) -> bool:
        # sysfs reports "4: ACTIVE"
        return "ACTIVE" in self.state.upper()


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

    @property
    def ip(self) -> str:
        return str(self.address.ip)

    @property
    def hca_ports(self) -> tuple[str, ...]:
        return tuple(port.name for port in self.rdma_ports)

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
            )
        except (KeyError, TypeError, ValueError) as exc:
            shown = dict(data) if isinstance(data, Mapping) else data
            raise FabricError("fabric facts are incomplete or malformed (%s): %r" % (exc, shown))


# ---------------------------------------------------------------------------
# Parsing raw host data (as gathered by fabric_facts) into the model
# ---------------------------------------------------------------------------


def parse_network(data: Mapping[str, Any]) -> HostNetwork:
    """Build a HostNetwork from plain data.

    ``data`` = {"interfaces": [{"name", "addresses": ["a.b.c.d/p", ...], "mtu",
    "operstate", "carrier", "speed", "default_route"}], "rdma": [{"hca", "port",
    "state", "link_layer", "netdev", "gids": [{"index", "gid", "type", "netdev"}]}]}
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
    )


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


def check_cluster(
    selections: Mapping[str, FabricSelection],
    fabric_cidr: Any,
    head_hosts: Sequence[str],
    inventory: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> list[str]:
    """Checks over every host's selection. Returns error messages (empty = good)."""
    inventory = inventory or {}
    try:
        cidr = parse_cidr(fabric_cidr)
    except FabricError as exc:
        return [str(exc)]
    errors = check_heads(head_hosts, selections)

    by_ip: dict[str, list[str]] = {}
    for host, sel in sorted(selections.items()):
        by_ip.setdefault(sel.ip, []).append(host)
        if sel.address.ip not in cidr:
            errors.append("%s: fabric address %s is outside fabric_cidr %s" % (host, sel.ip, cidr))
        if sel.address.network != cidr:
            errors.append(
                "%s: %s is configured as %s, but fabric_cidr is %s; every fabric interface must be on one subnet "
                "with the same prefix" % (host, sel.interface, sel.address.with_prefixlen, cidr)
            )
        wanted = inventory.get(host, {}).get("fabric_ip")
        if wanted and str(wanted) != sel.ip:
            errors.append(
                "%s: inventory fabric_ip is %s but the host carries %s on %s; fix host_vars/%s.yml"
                % (host, wanted, sel.ip, sel.interface, host)
            )
        if sel.mgmt_ip is not None and sel.mgmt_ip == sel.ip:
            errors.append(
                "%s: fabric address (fabric_ip) = %s on %s is also its management address (%s holds the default route): "
                "expected "
                "a fabric address apart from management (the firewall opens the fabric to cluster nodes and mgmt to "
                "SSH and the API only, and cluster traffic would share the management link); give the fabric "
                "interface its own address in fabric_cidr %s (fabric_ip, fabric_interface in host_vars/%s.yml) or "
                "correct fabric_cidr" % (host, sel.ip, sel.interface, sel.mgmt_interface, cidr, host)
            )
    for ip, hosts in sorted(by_ip.items()):
        if len(hosts) > 1:
            errors.append(
                "%s all carry fabric address %s; fabric addresses must be unique" % (" and ".join(hosts), ip)
            )
    mtus = {host: sel.mtu for host, sel in selections.items()}
    if len(set(mtus.values())) > 1:
        listing = ", ".join(
            "%s %s=%d" % (host, selections[host].interface, mtu) for host, mtu in sorted(mtus.items())
        )
        errors.append(
            "fabric MTU differs between hosts (%s); set the same MTU on every fabric interface" % listing
        )
    return errors
