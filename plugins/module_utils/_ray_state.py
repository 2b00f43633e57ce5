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
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem, messages

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


def evaluate_problems(
    nodes: Sequence[Mapping[str, Any]],
    inventory: Mapping[str, Mapping[str, Any]],
    fabric_cidr: Any,
    required_gpus: int = 0,
    raylet_env: Optional[Mapping[str, Optional[Mapping[str, Any]]]] = None,
    head: Optional[str] = None,
) -> tuple[list[dict[str, Any]], list[Problem]]:
    """``evaluate`` as Problems: (rows, problems). Rules: ``ray_node_count``, ``ray_node_dead``,
    ``ray_node_unknown``, ``ray_not_on_fabric``, ``ray_node_unregistered``, ``ray_node_duplicate``, ``ray_gpus``,
    ``vllm_host_ip_missing``, ``vllm_host_ip_wrong``, ``vllm_host_ip_shared`` and ``auth_problems``' rules."""
    cidr = parse_cidr(fabric_cidr)
    table = [RayNode.from_dict(n) for n in nodes]
    alive = [n for n in table if n.alive]
    problems: list[Problem] = []

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
        fix = "start Ray on every host with its fabric address (%s)" % FIX
        symptom = "Ray has %d alive node%s but the inventory has %d host%s (%s)%s" % (
            len(alive), "" if len(alive) == 1 else "s", len(inventory), "" if len(inventory) == 1 else "s",
            ", ".join(sorted(inventory)), detail)
        problems.append(Problem("ray_node_count", symptom, "a raylet is not running or did not join the head",
                                fix, message="%s; %s" % (symptom, fix)))

    # 2. a dead node holds a fabric address that no alive node holds (a
    # restarted worker leaves a dead record beside its new alive one: fine).
    alive_addresses = {n.address for n in alive}
    for node in table:
        if node.alive or node.address in alive_addresses or not _in(node.address, cidr):
            continue
        host = host_of(node.address) or "unknown host"
        symptom = "the Ray node registered as %s (node id %s) is dead and no alive node holds that fabric address" % (
            node.address, node.node_id[:12])
        fix = "restart Ray there (%s)" % FIX
        problems.append(Problem("ray_node_dead", symptom,
                                "its raylet stopped or lost the head (GCS health checks failed)", fix, host=host,
                                message="%s: %s; %s" % (host, symptom, fix)))

    # 3. every alive node registered inside the fabric.
    outside_hosts: set[str] = set()
    for node in alive:
        if _in(node.address, cidr):
            if node.address not in by_fabric:
                message = ("Ray node %s is registered as %s, inside the fabric %s, but no inventory host has that "
                           "fabric address; stop it or add its host to the inventory" % (node.node_id[:12],
                                                                                         node.address, cidr))
                problems.append(Problem("ray_node_unknown", "Ray node %s is registered as %s" % (
                    node.node_id[:12], node.address), "no inventory host has that fabric address",
                    "stop it or add its host to the inventory", message=message))
            continue
        host = host_of(node.address)
        if host is not None:
            outside_hosts.add(host)
            fabric_ip = inventory[host].get("fabric_ip")
            problems.append(Problem(
                "ray_not_on_fabric", "Ray registered this node as %s, outside the fabric %s" % (node.address, cidr),
                "ray start ran without --node-ip-address %s, so Ray took the %s address%s and cluster traffic and "
                "the placement group's node:<ip> resource are not on the fabric" % (
                    fabric_ip, "management" if node.address in by_mgmt else "default route's",
                    " (the head: every worker joining its fabric address fails)" if node.is_head else ""),
                "restart it with --node-ip-address %s (%s)" % (fabric_ip, FIX), host=host,
                message="%s: Ray registered this node as %s, outside the fabric %s; restart it with "
                        "--node-ip-address %s (%s)" % (host, node.address, cidr, fabric_ip, FIX)))
        else:
            message = ("Ray node %s is registered as %s, outside the fabric %s, and matches no inventory host's "
                       "fabric or management address; stop it (ray stop on that machine) or start it with "
                       "--node-ip-address <its fabric address>" % (node.node_id[:12], node.address or "<no address>",
                                                                   cidr))
            problems.append(Problem(
                "ray_node_unknown", "Ray node %s is registered as %s, outside the fabric %s" % (
                    node.node_id[:12], node.address or "<no address>", cidr),
                "a Ray node no inventory host accounts for joined the cluster",
                "stop it (ray stop on that machine) or start it with --node-ip-address <its fabric address>",
                message=message))

    # 4. every host's fabric address registered exactly once.
    for host in sorted(inventory):
        fabric_ip = str(inventory[host].get("fabric_ip"))
        count = sum(1 for n in alive if n.address == fabric_ip)
        if count == 1 or (count == 0 and host in outside_hosts):
            continue
        if count == 0:
            symptom = "no alive Ray node is registered at its fabric address %s" % fabric_ip
            fix = "start Ray there with --node-ip-address %s (%s)" % (fabric_ip, FIX)
            problems.append(Problem("ray_node_unregistered", symptom,
                                    "its raylet is not running or never joined the head", fix, host=host,
                                    message="%s: %s; %s" % (host, symptom, fix)))
        else:
            symptom = "its fabric address %s is registered by %d alive Ray nodes" % (fabric_ip, count)
            fix = "stop the extra raylets and restart Ray (%s)" % FIX
            problems.append(Problem("ray_node_duplicate", symptom, "more than one raylet runs with that address",
                                    fix, host=host,
                                    message="%s: %s; exactly one is allowed: %s" % (host, symptom, fix)))

    # 5. GPUs per node and in total.
    if required_gpus and required_gpus > 0:
        for node in alive:
            if node.gpus < 1:
                host = host_of(node.address) or "node %s" % node.node_id[:12]
                fix = "start Ray with the GPUs visible (--num-gpus, GPU runtime of the container) (%s)" % FIX
                problems.append(Problem(
                    "ray_gpus", "Ray sees 0 GPUs on this node (%s)" % node.address,
                    "vLLM needs %d GPUs across the cluster and Ray was started without them" % required_gpus, fix,
                    host=host, message="%s: Ray sees 0 GPUs on this node (%s); vLLM needs %d GPUs across the "
                                       "cluster; %s" % (host, node.address, required_gpus, fix)))
        total = sum(n.gpus for n in alive)
        if total < required_gpus:
            per_node = ", ".join("%s=%s" % (host_of(n.address) or n.address, _gpus(n.gpus)) for n in alive)
            symptom = "Ray sees %s GPUs in total (%s) but tensor_parallel_size * pipeline_parallel_size = %d" % (
                _gpus(total), per_node or "no alive nodes", required_gpus)
            fix = "add nodes or GPUs, or lower the parallel sizes"
            problems.append(Problem("ray_gpus", symptom, "the cluster has fewer GPUs than vLLM's parallel sizes", fix,
                                    message="%s; %s" % (symptom, fix)))

    # 6. the raylet's VLLM_HOST_IP on each node: its own fabric address, unique.
    seen: dict[str, list[str]] = {}
    for host in sorted(raylet_env or {}):
        env = (raylet_env or {}).get(host)
        if env is None or host not in inventory:
            continue
        fabric_ip = str(inventory[host].get("fabric_ip"))
        value = env.get("VLLM_HOST_IP")
        if not value:
            fix = "restart Ray with VLLM_HOST_IP=%s in its environment (%s)" % (fabric_ip, FIX)
            problems.append(Problem(
                "vllm_host_ip_missing", "the running raylet has no VLLM_HOST_IP in its environment",
                "vLLM workers there would pick the management address (get_ip() follows the default route)", fix,
                host=host, message="%s: the running raylet has no VLLM_HOST_IP in its environment; vLLM workers "
                                   "there would pick the management address; %s" % (host, fix)))
            continue
        seen.setdefault(str(value), []).append(host)
        if str(value) != fabric_ip:
            fix = "restart Ray with the node's env file (%s)" % FIX
            problems.append(Problem(
                "vllm_host_ip_wrong", "the running raylet has VLLM_HOST_IP=%s, expected its fabric address %s" % (
                    value, fabric_ip),
                "vLLM's placement group asks for node:%s, which Ray does not have there" % value, fix, host=host,
                message="%s: the running raylet has VLLM_HOST_IP=%s, expected its fabric address %s; %s" % (
                    host, value, fabric_ip, fix)))
    for value, hosts in sorted(seen.items()):
        if len(hosts) > 1:
            symptom = "%s all run their raylet with VLLM_HOST_IP=%s" % (" and ".join(hosts), value)
            problems.append(Problem(
                "vllm_host_ip_shared", symptom,
                "one VLLM_HOST_IP shared by several nodes: vLLM fails with 'Every node should have a unique IP "
                "address'", "give every node its own fabric address (%s)" % FIX,
                message="%s; every node needs its own fabric address (%s)" % (symptom, FIX)))

    problems.extend(auth_problems(raylet_env or {}, head))
    return rows(table, inventory, host_of), problems


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
    missing host: no raylet there, which the node count already reports). The messages of ``evaluate_problems``.
    """
    table_rows, problems = evaluate_problems(nodes, inventory, fabric_cidr, required_gpus, raylet_env, head)
    return table_rows, messages(problems)


def auth_problems(raylet_env: Mapping[str, Optional[Mapping[str, Any]]], head: Optional[str]) -> list[Problem]:
    """``auth_errors`` as Problems (rules ``ray_auth_off``, ``ray_auth_token_missing``, ``ray_auth_token_differs``)."""
    head_env = raylet_env.get(head) if head else None
    if not head_env or str(head_env.get("RAY_AUTH_MODE") or "").lower() != "token":
        return []
    problems = []
    fix = ("run playbooks/deploy.yml: it writes the cluster's token (the head's %s) to every node"
           % (head_env.get("RAY_AUTH_TOKEN_PATH") or "token file"))
    head_digest = head_env.get("auth_token_sha256")
    for host in sorted(raylet_env):
        env = raylet_env.get(host)
        if env is None or host == head:
            continue
        if str(env.get("RAY_AUTH_MODE") or "").lower() != "token":
            problems.append(Problem(
                "ray_auth_off", "the running raylet has no RAY_AUTH_MODE=token while the head %s requires a token"
                % head, "it cannot talk to the cluster", fix, host=host,
                message="%s: the running raylet has no RAY_AUTH_MODE=token while the head %s requires a token; "
                        "it cannot talk to the cluster; %s" % (host, head, fix)))
        elif env.get("auth_token_sha256") is None:
            problems.append(Problem(
                "ray_auth_token_missing", "the raylet's token file %s is missing or unreadable"
                % env.get("RAY_AUTH_TOKEN_PATH"), "Ray there cannot authenticate to the head", fix, host=host,
                message="%s: the raylet's token file %s is missing or unreadable; %s"
                        % (host, env.get("RAY_AUTH_TOKEN_PATH"), fix)))
        elif env.get("auth_token_sha256") != head_digest:
            problems.append(Problem(
                "ray_auth_token_differs", "its Ray token (%s) differs from the head's (%s)" % (
                    env.get("RAY_AUTH_TOKEN_PATH"), head),
                "Ray there fails with InvalidAuthToken at its next start or request", fix, host=host,
                message="%s: its Ray token (%s) differs from the head's (%s): Ray there fails with "
                        "InvalidAuthToken at its next start or request; %s"
                        % (host, env.get("RAY_AUTH_TOKEN_PATH"), head, fix)))
    return problems


def auth_errors(raylet_env: Mapping[str, Optional[Mapping[str, Any]]], head: Optional[str]) -> list[str]:
    """7. Token authentication: once the head's raylet requires a token, every raylet does, with the head's token.

    Compares the sha256 of each node's token file (``auth_token_sha256``, never the token) with the head's.
    """
    return messages(auth_problems(raylet_env, head))


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
