# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node firewall: one nftables table per node, rendered from plain data.

Pure and typed: no Ansible imports, no I/O. The role builds a spec per host,
the ``_firewall_errors`` filter checks every host before any host changes, ``render_ruleset``
writes the file that ``nft_apply`` loads.

The ruleset lives in its own table (``table inet multinode_vllm``) so other
software's tables are never flushed. The file declares the table, deletes it
and declares it again in full: ``nft -f`` runs that as one transaction, so the
old table is replaced atomically (never a moment with no rules or half the rules).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from ansible_collections.multinode.vllm.plugins.module_utils._checks import port_number, whole_number
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError, parse_cidr

TABLE = "multinode_vllm"
FAMILY = "inet"
DROP_COUNTER = "dropped"
# IFNAMSIZ is 16 with the NUL; names are quoted in the ruleset, so no quotes or blanks either.
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_RATE = re.compile(r"^[1-9][0-9]{0,5}/(second|minute|hour|day)$")


class FirewallError(MultinodeError):
    """A firewall input that cannot be rendered (every problem of one host, or a boot unit path)."""


IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


@dataclass(frozen=True)
class Source:
    """An extra source allowed on the management interface (e.g. a monitoring host)."""

    network: IPNetwork
    tcp_ports: tuple[int, ...] = ()  # empty: every protocol and port from this source


@dataclass(frozen=True)
class FirewallSpec:
    host: str
    fabric_interface: str
    fabric_network: ipaddress.IPv4Network
    cluster: tuple[tuple[str, ipaddress.IPv4Address], ...]  # (host, fabric ip), sorted by address
    mgmt_interface: str
    mgmt_tcp_ports: tuple[int, ...]
    sources: tuple[Source, ...] = ()
    allow_icmp: bool = True
    log_drops: bool = False
    log_rate: str = "5/minute"
    table: str = TABLE


# ---------------------------------------------------------------------------
# Validation: every problem of one host, each naming host, value, expectation and fix
# ---------------------------------------------------------------------------


def _port(host: str, var: str, value: Any, errors: list[str]) -> Optional[int]:
    number = whole_number(value)
    port = port_number(number)
    if number is None:
        errors.append("%s: %s contains %r, expected a TCP port 1-65535; fix %s" % (host, var, value, var))
    elif port is None:
        errors.append("%s: %s contains %d, expected a TCP port 1-65535; fix %s" % (host, var, number, var))
    return port


def _ports(host: str, var: str, values: Any, errors: list[str]) -> tuple[int, ...]:
    if values is None:
        return ()
    if isinstance(values, (str, int)) or not isinstance(values, Sequence):
        errors.append("%s: %s is %r, expected a list of TCP ports, e.g. [22, 8000]; fix %s" % (host, var, values, var))
        return ()
    ports = [_port(host, var, v, errors) for v in values]
    return tuple(sorted({p for p in ports if p is not None}))


def _ifname(host: str, var: str, value: Any, errors: list[str]) -> str:
    if not value:
        errors.append(
            "%s: %s is not set (%r), expected an interface name; run the fabric role first (it gathers "
            "multinode_fabric) or set %s in host_vars/%s.yml" % (host, var, value, var, host)
        )
        return ""
    name = str(value)
    if not _IFNAME.match(name):
        errors.append(
            "%s: %s %r is not an interface name (1-15 characters of letters, digits, _ . : @ -); fix %s"
            % (host, var, name, var)
        )
        return ""
    return name


def _source(host: str, entry: Any, errors: list[str]) -> Optional[Source]:
    var = "firewall_allow_sources"
    if isinstance(entry, str):
        entry = {"src": entry}
    if not isinstance(entry, Mapping) or "src" not in entry or set(entry) - {"src", "tcp_ports"}:
        errors.append(
            "%s: %s entry %r, expected an address/network or {src: 198.19.1.50, tcp_ports: [9100]}; fix %s"
            % (host, var, entry, var)
        )
        return None
    try:
        network = ipaddress.ip_network(str(entry["src"]), strict=False)
    except ValueError:
        errors.append(
            "%s: %s entry src %r is not an IP address or network (e.g. 198.19.1.50 or 198.19.1.0/24); fix %s"
            % (host, var, entry["src"], var)
        )
        return None
    if network.prefixlen == 0:
        errors.append(
            "%s: %s entry src %s allows the whole Internet, expected a host or a network; use "
            "firewall_mgmt_allow_tcp to open a port to everyone" % (host, var, network)
        )
        return None
    # An empty tcp_ports (a list emptied by a template, or `tcp_ports:` with nothing after it) would render
    # no port match, i.e. "accept every port from this source": refuse it. Every port is said by leaving
    # tcp_ports out (or giving the source as a plain string).
    if "tcp_ports" in entry and (entry["tcp_ports"] is None or entry["tcp_ports"] == "" or (
            isinstance(entry["tcp_ports"], Sequence) and len(entry["tcp_ports"]) == 0)):
        errors.append(
            "%s: %s entry %s tcp_ports = %r: expected at least one TCP port (empty would accept every port from "
            "this source); list the ports, e.g. tcp_ports: [9100], or leave tcp_ports out to allow every port"
            % (host, var, network, entry["tcp_ports"])
        )
        return None
    return Source(network=network, tcp_ports=_ports(host, var + " tcp_ports", entry.get("tcp_ports"), errors))


def check_spec(data: Mapping[str, Any]) -> tuple[Optional[FirewallSpec], list[str]]:
    """Build the spec of one host from plain data; returns (spec or None, every error found).

    ``data`` keys: host, fabric_interface, fabric_cidr, cluster ({host: fabric ip or None}),
    mgmt_interface, mgmt_allow_tcp (ports), controller_port (must be in mgmt_allow_tcp: the
    controller's SSH), allow_sources, allow_icmp, log_drops, log_rate, table.
    """
    host = str(data.get("host") or "?")
    errors: list[str] = []
    try:
        network = parse_cidr(data.get("fabric_cidr"), host)
    except FabricError as exc:
        errors.append(str(exc))
        network = None
    fabric_if = _ifname(host, "firewall_fabric_interface", data.get("fabric_interface"), errors)
    mgmt_if = _ifname(host, "firewall_mgmt_interface", data.get("mgmt_interface"), errors)
    if fabric_if and fabric_if == mgmt_if:
        errors.append(
            "%s: the fabric and management interfaces are both %s, expected two networks (mgmt allows SSH "
            "and the API only, the fabric allows cluster traffic); set firewall_mgmt_interface or "
            "firewall_fabric_interface in host_vars/%s.yml" % (host, fabric_if, host)
        )

    cluster_raw = data.get("cluster")
    cluster: dict[str, ipaddress.IPv4Address] = {}
    if not isinstance(cluster_raw, Mapping) or not cluster_raw:
        errors.append(
            "%s: the cluster is %r, expected {host: fabric ip} for every cluster node; set firewall_cluster_hosts "
            "(default: groups ray_head + ray_workers)" % (host, cluster_raw)
        )
        cluster_raw = {}
    seen: dict[ipaddress.IPv4Address, str] = {}
    for node, raw_ip in sorted(cluster_raw.items(), key=lambda item: str(item[0])):
        if not raw_ip:
            errors.append(
                "%s: cluster node %s has no fabric address, expected its multinode_fabric facts; run the fabric "
                "role on every cluster node (no --limit) or set fabric_ip in host_vars/%s.yml" % (host, node, node)
            )
            continue
        try:
            ip = ipaddress.IPv4Address(str(raw_ip))
        except ValueError:
            errors.append(
                "%s: cluster node %s has fabric address %r, expected an IPv4 address; fix fabric_ip in "
                "host_vars/%s.yml" % (host, node, raw_ip, node)
            )
            continue
        if network is not None and ip not in network:
            errors.append(
                "%s: cluster node %s has fabric address %s, expected an address inside fabric_cidr %s; fix "
                "fabric_ip in host_vars/%s.yml or fabric_cidr" % (host, node, ip, network, node)
            )
            continue
        if ip in seen:
            errors.append(
                "%s: cluster nodes %s and %s share fabric address %s, expected one address per node; fix their "
                "fabric_ip" % (host, seen[ip], node, ip)
            )
            continue
        seen[ip] = str(node)
        cluster[str(node)] = ip

    ports = _ports(host, "firewall_mgmt_allow_tcp", data.get("mgmt_allow_tcp"), errors)
    controller = data.get("controller_port")
    if controller is not None:
        port = _port(host, "the controller's SSH port (ansible_port)", controller, errors)
        if port is not None and ports and port not in ports:
            errors.append(
                "%s: firewall_mgmt_allow_tcp %s does not contain %d, the SSH port the controller uses; it would "
                "lock the controller out; add %d to firewall_mgmt_allow_tcp" % (host, list(ports), port, port)
            )
    if not ports and "firewall_mgmt_allow_tcp" not in " ".join(errors):
        errors.append(
            "%s: firewall_mgmt_allow_tcp is empty, expected at least the SSH port; an empty list would lock "
            "every SSH client out; set firewall_mgmt_allow_tcp: [22]" % host
        )

    raw_sources = data.get("allow_sources") or []
    sources: list[Source] = []
    if isinstance(raw_sources, (str, Mapping)) or not isinstance(raw_sources, Sequence):
        errors.append(
            "%s: firewall_allow_sources is %r, expected a list; fix firewall_allow_sources" % (host, raw_sources)
        )
    else:
        for entry in raw_sources:
            src = _source(host, entry, errors)
            if src is not None:
                sources.append(src)

    flags = {}
    for key in ("allow_icmp", "log_drops"):
        value = data.get(key, key == "allow_icmp")
        if not isinstance(value, bool):
            errors.append("%s: firewall_%s is %r, expected true or false; fix firewall_%s" % (host, key, value, key))
        flags[key] = bool(value)
    rate = str(data.get("log_rate") or "5/minute")
    if not _RATE.match(rate):
        errors.append(
            "%s: firewall_log_rate %r, expected N/second, N/minute, N/hour or N/day; fix firewall_log_rate"
            % (host, rate)
        )
    table = str(data.get("table") or TABLE)
    if not _TABLE_NAME.match(table):
        errors.append(
            "%s: firewall table name %r, expected a letter then letters, digits or _ (at most 32); fix it"
            % (host, table)
        )

    if errors or network is None:
        return None, errors
    spec = FirewallSpec(
        host=host,
        fabric_interface=fabric_if,
        fabric_network=network,
        cluster=tuple(sorted(((h, ip) for h, ip in cluster.items()), key=lambda item: item[1])),
        mgmt_interface=mgmt_if,
        mgmt_tcp_ports=ports,
        sources=tuple(sources),
        allow_icmp=flags["allow_icmp"],
        log_drops=flags["log_drops"],
        log_rate=rate,
        table=table,
    )
    return spec, []


def build_spec(data: Mapping[str, Any]) -> FirewallSpec:
    """``check_spec`` that raises FirewallError listing every problem."""
    spec, errors = check_spec(data)
    if errors or spec is None:
        raise FirewallError("\n".join(errors))
    return spec


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def _set(items: Sequence[Any]) -> str:
    return str(items[0]) if len(items) == 1 else "{ %s }" % ", ".join(str(i) for i in items)


def render_ruleset(spec: FirewallSpec) -> str:
    """The ``nft -f`` file that replaces this node's table in one transaction."""
    table = "%s %s" % (FAMILY, spec.table)
    rules = [
        "type filter hook input priority filter; policy drop;",
        # Replies to connections already open, the controller's SSH session among them.
        'ct state established,related accept comment "replies to open connections (keeps the current SSH session)"',
        "ct state invalid drop",
        'iif "lo" accept',
        # (nft comments hold at most 128 bytes: no host names here)
        'iifname "%s" ip saddr %s accept comment "fabric: all traffic between the %d cluster nodes"'
        % (spec.fabric_interface, _set([pair[1] for pair in spec.cluster]), len(spec.cluster)),
        'iifname "%s" tcp dport %s accept comment "management: SSH and API ports"'
        % (spec.mgmt_interface, _set(list(spec.mgmt_tcp_ports))),
    ]
    for src in spec.sources:
        single = src.network.prefixlen == src.network.max_prefixlen
        shown = src.network.network_address if single else src.network
        match = "%s saddr %s" % ("ip" if src.network.version == 4 else "ip6", shown)
        ports = " tcp dport %s" % _set(list(src.tcp_ports)) if src.tcp_ports else ""
        rules.append('iifname "%s" %s%s accept comment "extra source"' % (spec.mgmt_interface, match, ports))
    if spec.allow_icmp:
        rules.append("icmp type echo-request accept")
        rules.append("icmpv6 type echo-request accept")
    # Without neighbour discovery IPv6 stops working on every link; it never leaves the link.
    rules.append("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert } ip6 hoplimit 255 accept")
    # Multicast listener queries come from the link's router, link-local; a host that never answers them is cut off
    # from its solicited-node groups by MLD-snooping switches, and neighbour discovery fails.
    rules.append("icmpv6 type mld-listener-query ip6 saddr fe80::/10 accept")
    # DHCPv6 replies reach a client from a server's or relay's link-local address (547 -> 546); conntrack does not
    # match them to the client's multicast Solicit.
    rules.append("ip6 saddr fe80::/10 udp sport 547 udp dport 546 accept")
    if spec.log_drops:
        rules.append('limit rate %s burst 5 packets log prefix "multinode_vllm drop: " level info' % spec.log_rate)
    rules.append('counter name "%s" drop' % DROP_COUNTER)
    lines = [
        "# multinode.vllm firewall of %s (generated by the multinode.vllm.firewall role; edits are replaced)" % spec.host,
        "table %s {}" % table,
        "delete table %s" % table,
        "table %s {" % table,
        "\tcounter %s {" % DROP_COUNTER,
        "\t}",
        "",
        "\tchain input {",
    ]
    lines += ["\t\t" + rule for rule in rules]
    lines += ["\t}", "}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# After a reboot
# ---------------------------------------------------------------------------

# The units of the systemd runtime (roles ray and serve): they need the table loaded first.
CLUSTER_UNITS = ("multinode-ray.service", "multinode-vllm.service")


def boot_unit(ruleset_path: str, nft_path: str = "/usr/sbin/nft") -> str:
    """The systemd unit that loads the kept table at boot, before the network, Docker and the cluster's units.

    Like Debian's nftables.service (no default dependencies, before network-pre.target). RequiredBy= the Ray and
    vLLM units: when the table cannot be loaded they do not start (closed, not open). Docker is only ordered after
    it (a failed load must not stop the host's Docker), so under the docker runtime a failed load is open: the
    containers start; the journal names the failure.
    """
    for value, what in ((ruleset_path, "ruleset path"), (nft_path, "nft path")):
        if not value.startswith("/") or re.search(r"[\s%$\\\"']", value):
            raise FirewallError("firewall boot unit: the %s must be an absolute path without spaces, quotes, %% or $; "
                                "got %r" % (what, value))
    lines = [
        "# Generated by the multinode.vllm.firewall role; edits are replaced.",
        "[Unit]",
        "Description=multinode.vllm firewall (nftables table %s multinode_vllm)" % FAMILY,
        "DefaultDependencies=no",
        "Wants=network-pre.target",
        # Debian's nftables.service loads /etc/nftables.conf, which starts with `flush ruleset`: load after it (and
        # after firewalld, which replaces the ruleset too), or our table may be loaded first and flushed.
        "After=nftables.service firewalld.service",
        "Before=network-pre.target shutdown.target docker.service %s" % " ".join(CLUSTER_UNITS),
        "Conflicts=shutdown.target",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        # The file declares, deletes and declares the table again: loading it twice changes nothing.
        "ExecStart=%s -f %s" % (nft_path, ruleset_path),
        "",
        "[Install]",
        "WantedBy=sysinit.target",
        "RequiredBy=%s" % " ".join(CLUSTER_UNITS),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Comparing and restoring what ``nft list table`` prints
# ---------------------------------------------------------------------------

_COUNTS = re.compile(r"packets \d+ bytes \d+")


def normalise_listing(text: Optional[str]) -> str:
    """``nft list table`` output without traffic counts or blank-line noise (for idempotence)."""
    if not text:
        return ""
    lines = [_COUNTS.sub("packets 0 bytes 0", line.rstrip()) for line in text.strip().splitlines()]
    return "\n".join(line for line in lines if line.strip()) + "\n"


def replace_script(table: str, listing: Optional[str]) -> str:
    """A file that replaces ``table`` with ``listing`` (None or empty: removes the table), atomically."""
    head = "table %s %s {}\ndelete table %s %s\n" % (FAMILY, table, FAMILY, table)
    return head + (listing.strip() + "\n" if listing and listing.strip() else "")


def ruleset_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cluster_ips(hostvars: Mapping[str, Any], hosts: Sequence[str]) -> dict[str, Optional[str]]:
    """{host: fabric ip} of the cluster nodes: the fabric role's fact, else the inventory's fabric_ip, else None."""
    ips: dict[str, Optional[str]] = {}
    for host in hosts:
        node = hostvars.get(host) if hasattr(hostvars, "get") else None
        node = node or {}
        fact = node.get("multinode_fabric") or {}
        ip = fact.get("ip") if isinstance(fact, Mapping) else None
        ips[str(host)] = str(ip or node.get("fabric_ip") or "") or None
    return ips


def spec_data(spec: Mapping[str, Any], hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The role's spec (``cluster_hosts`` names) with ``cluster`` resolved to {host: fabric ip}."""
    data = dict(spec)
    hosts = data.pop("cluster_hosts", None)
    if "cluster" not in data:
        data["cluster"] = cluster_ips(hostvars, list(hosts or []))
    return data
