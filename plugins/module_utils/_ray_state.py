# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Judge a running Ray cluster against the inventory and the fabric.

Input: Ray's node table (as read from GCS), the inventory's hosts with their
fabric and management addresses, ``fabric_cidr``, the GPUs vLLM needs
(tensor_parallel_size * pipeline_parallel_size) and, per host, the
environment of the raylet running there. Output: rows for printing and a list
of errors, each naming the host, the registered value, the expected value
and the fix. Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import parse_cidr

FIX = "run playbooks/deploy.yml"


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str
    alive: bool
    gpus: float
    is_head: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RayNode":
        resources = data.get("resources") or {}
        return cls(
            node_id=str(data.get("node_id") or ""),
            address=str(data.get("node_manager_address") or ""),
            alive=bool(data.get("alive")),
            gpus=float(resources.get("GPU") or 0),
            is_head=bool(data.get("is_head")),
        )


def _gpus(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _in(address: str, cidr: ipaddress.IPv4Network) -> bool:
    try:
        return ipaddress.IPv4Address(address) in cidr
    except ValueError:
        return False


def evaluate(
    nodes: Sequence[Mapping[str, Any]],
    inventory: Mapping[str, Mapping[str, Any]],
    fabric_cidr: Any,
    required_gpus: int = 0,
    raylet_env: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None,
    head: Optional[str] = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Return (rows, errors). ``errors`` empty means the cluster is what the inventory says.

    ``inventory`` = {host: {"fabric_ip": ..., "mgmt_ip": ...}}; ``raylet_env`` =
    {host: {"VLLM_HOST_IP": ...}} for hosts where a raylet runs (None or a
    missing host: no raylet there, which the node count already reports).
    """
    cidr = parse_cidr(fabric_cidr)
    table = [RayNode.from_dict(n) for n in nodes]
    alive = [n for n in table if n.alive]
    errors: list[str] = []

    by_fabric = {str(v.get("fabric_ip")): h for h, v in inventory.items() if v.get("fabric_ip")}
    by_mgmt = {str(v.get("mgmt_ip")): h for h, v in inventory.items() if v.get("mgmt_ip")}

    def host_of(address: str) -> Optional[str]:
        return by_fabric.get(address) or by_mgmt.get(address)

    # 1. alive count equals the inventory's host count.
    if len(alive) != len(inventory):
        registered = {n.address for n in alive}
        missing = [
            "%s (%s)" % (h, inventory[h].get("fabric_ip"))
            for h in sorted(inventory)
            if str(inventory[h].get("fabric_ip")) not in registered and str(inventory[h].get("mgmt_ip")) not in registered
        ]
        detail = "; not registered: %s" % ", ".join(missing) if missing else ""
        errors.append(
            "Ray has %d alive node%s but the inventory has %d host%s (%s)%s; start Ray on every host with its fabric "
            "address (%s)"
            % (len(alive), "" if len(alive) == 1 else "s", len(inventory), "" if len(inventory) == 1 else "s",
               ", ".join(sorted(inventory)), detail, FIX)
        )

    # 2. a dead node holds a fabric address that no alive node holds (a
    # restarted worker leaves a dead record beside its new alive one: fine).
    alive_addresses = {n.address for n in alive}
    for node in table:
        if node.alive or node.address in alive_addresses or not _in(node.address, cidr):
            continue
        host = host_of(node.address) or "unknown host"
        errors.append(
            "%s: the Ray node registered as %s (node id %s) is dead and no alive node holds that fabric address; "
            "restart Ray there (%s)" % (host, node.address, node.node_id[:12], FIX)
        )

    # 3. every alive node registered inside the fabric.
    outside_hosts: set[str] = set()
    for node in alive:
        if _in(node.address, cidr):
            if node.address not in by_fabric:
                errors.append(
                    "Ray node %s is registered as %s, inside the fabric %s, but no inventory host has that fabric "
                    "address; stop it or add its host to the inventory" % (node.node_id[:12], node.address, cidr)
                )
            continue
        host = host_of(node.address)
        if host is not None:
            outside_hosts.add(host)
            errors.append(
                "%s: Ray registered this node as %s, outside the fabric %s; restart it with --node-ip-address %s (%s)"
                % (host, node.address, cidr, inventory[host].get("fabric_ip"), FIX)
            )
        else:
            errors.append(
                "Ray node %s is registered as %s, outside the fabric %s, and matches no inventory host's fabric or "
                "management address; stop it (ray stop on that machine) or start it with --node-ip-address <its "
                "fabric address>" % (node.node_id[:12], node.address or "<no address>", cidr)
            )

    # 4. every host's fabric address registered exactly once.
    for host in sorted(inventory):
        fabric_ip = str(inventory[host].get("fabric_ip"))
        count = sum(1 for n in alive if n.address == fabric_ip)
        if count == 1 or (count == 0 and host in outside_hosts):
            continue
        if count == 0:
            errors.append(
                "%s: no alive Ray node is registered at its fabric address %s; start Ray there with "
                "--node-ip-address %s (%s)" % (host, fabric_ip, fabric_ip, FIX)
            )
        else:
            errors.append(
                "%s: its fabric address %s is registered by %d alive Ray nodes; exactly one is allowed: stop the "
                "extra raylets and restart Ray (%s)" % (host, fabric_ip, count, FIX)
            )

    # 5. GPUs per node and in total.
    if required_gpus and required_gpus > 0:
        for node in alive:
            if node.gpus < 1:
                host = host_of(node.address) or "node %s" % node.node_id[:12]
                errors.append(
                    "%s: Ray sees 0 GPUs on this node (%s); vLLM needs %d GPUs across the cluster; start Ray with "
                    "the GPUs visible (--num-gpus, GPU runtime of the container) (%s)"
                    % (host, node.address, required_gpus, FIX)
                )
        total = sum(n.gpus for n in alive)
        if total < required_gpus:
            per_node = ", ".join("%s=%s" % (host_of(n.address) or n.address, _gpus(n.gpus)) for n in alive)
            errors.append(
                "Ray sees %s GPUs in total (%s) but tensor_parallel_size * pipeline_parallel_size = %d; add nodes or "
                "GPUs, or lower the parallel sizes"
                % (_gpus(total), per_node or "no alive nodes", required_gpus)
            )

    # 6. the raylet's VLLM_HOST_IP on each node: its own fabric address, unique.
    seen: dict[str, list[str]] = {}
    for host in sorted(raylet_env or {}):
        env = (raylet_env or {}).get(host)
        if env is None or host not in inventory:
            continue
        fabric_ip = str(inventory[host].get("fabric_ip"))
        value = env.get("VLLM_HOST_IP")
        if not value:
            errors.append(
                "%s: the running raylet has no VLLM_HOST_IP in its environment; vLLM workers there would pick the "
                "management address; restart Ray with VLLM_HOST_IP=%s in its environment (%s)" % (host, fabric_ip, FIX)
            )
            continue
        seen.setdefault(str(value), []).append(host)
        if str(value) != fabric_ip:
            errors.append(
                "%s: the running raylet has VLLM_HOST_IP=%s, expected its fabric address %s; restart Ray with the "
                "node's env file (%s)" % (host, value, fabric_ip, FIX)
            )
    for value, hosts in sorted(seen.items()):
        if len(hosts) > 1:
            errors.append(
                "%s all run their raylet with VLLM_HOST_IP=%s; every node needs its own fabric address (%s)"
                % (" and ".join(hosts), value, FIX)
            )

    errors.extend(auth_errors(raylet_env or {}, head))
    return rows(table, inventory, host_of), errors


def auth_errors(raylet_env: Mapping[str, Optional[Mapping[str, Any]]], head: Optional[str]) -> list[str]:
    """7. Token authentication: once the head's raylet requires a token, every raylet does, with the head's token.

    Compares the sha256 of each node's token file (``auth_token_sha256``, never the token) with the head's.
    """
    head_env = raylet_env.get(head) if head else None
    if not head_env or str(head_env.get("RAY_AUTH_MODE") or "").lower() != "token":
        return []
    errors = []
    fix = ("run playbooks/deploy.yml: it writes the cluster's token (the head's %s) to every node"
           % (head_env.get("RAY_AUTH_TOKEN_PATH") or "token file"))
    head_digest = head_env.get("auth_token_sha256")
    for host in sorted(raylet_env):
        env = raylet_env.get(host)
        if env is None or host == head:
            continue
        if str(env.get("RAY_AUTH_MODE") or "").lower() != "token":
            errors.append("%s: the running raylet has no RAY_AUTH_MODE=token while the head %s requires a token; "
                          "it cannot talk to the cluster; %s" % (host, head, fix))
        elif env.get("auth_token_sha256") is None:
            errors.append("%s: the raylet's token file %s is missing or unreadable; %s"
                          % (host, env.get("RAY_AUTH_TOKEN_PATH"), fix))
        elif env.get("auth_token_sha256") != head_digest:
            errors.append("%s: its Ray token (%s) differs from the head's (%s): Ray there fails with "
                          "InvalidAuthToken at its next start or request; %s"
                          % (host, env.get("RAY_AUTH_TOKEN_PATH"), head, fix))
    return errors


def rows(table: Sequence[RayNode], inventory: Mapping[str, Mapping[str, Any]], host_of: Any) -> list[dict[str, Any]]:
    """One row per Ray node (alive first, by host), then one per inventory host Ray does not know."""
    out = []
    known: set[str] = set()
    for node in table:
        host = host_of(node.address)
        if host and node.alive:
            known.add(host)
        out.append(
            {
                "host": host or "?",
                "mgmt_ip": inventory.get(host, {}).get("mgmt_ip") if host else None,
                "ray_address": node.address,
                "alive": node.alive,
                "gpus": node.gpus,
                "head": node.is_head,
                "node_id": node.node_id,
            }
        )
    for host in sorted(inventory):
        if host not in known and not any(r["host"] == host for r in out):
            out.append(
                {
                    "host": host,
                    "mgmt_ip": inventory[host].get("mgmt_ip"),
                    "ray_address": None,
                    "alive": False,
                    "gpus": 0,
                    "head": False,
                    "node_id": None,
                }
            )
    out.sort(key=lambda r: (not r["alive"], r["host"], r["ray_address"] or ""))
    return out


def format_table(table_rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Fixed-width lines: HOST MGMT RAY-ADDRESS ALIVE GPUS."""
    header = ("HOST", "MGMT", "RAY ADDRESS", "ALIVE", "GPUS", "HEAD")
    body = [
        (
            str(r["host"]),
            str(r.get("mgmt_ip") or "-"),
            str(r.get("ray_address") or "-"),
            "yes" if r.get("alive") else "no",
            _gpus(float(r.get("gpus") or 0)),
            "head" if r.get("head") else "",
        )
        for r in table_rows
    ]
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in [header] + body]


def alive_count(nodes: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for n in nodes if n.get("alive"))
