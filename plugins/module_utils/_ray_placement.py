# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ray-placed check: one task per node, placed as vLLM's placement group places its workers.

The node script ``_node_ray_placement.py`` (a Ray driver run under the head's env file) places the tasks and prints
what each saw; ``parse_output`` reads that, ``placement_problems`` (pure) turns it into messages.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._node_ray_placement import MARKER
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import parse_marked


def parse_output(stdout: str) -> Optional[dict[str, Any]]:
    return parse_marked(stdout, MARKER)


def placement_problems(result: Optional[Mapping[str, Any]], hosts: Mapping[str, str], timeout: float) -> list[str]:
    """Messages for every node whose placed task failed or whose addresses disagree.

    ``hosts`` = {host: fabric_ip}. A node passes when a task pinned to ``node:<fabric ip>`` ran there, Ray's
    node address is that fabric address, and vLLM's get_ip() in that worker returns it too.
    """
    if result is None:
        return ["the Ray-placed check printed no result (see its stderr)"]
    if result.get("error"):
        return [str(result["error"])]
    problems = []
    nodes = result.get("nodes") or {}
    for host in sorted(hosts):
        ip = hosts[host]
        seen = nodes.get(ip) or {"error": "not placed"}
        if seen.get("error") == "not placed":
            problems.append(
                "%s: no Ray node offers the resource node:%s within %g s, so vLLM's placement group cannot put a "
                "worker on %s's fabric address; Ray registered it under another address (run playbooks/deploy.yml, "
                "which restarts Ray with --node-ip-address %s)" % (host, ip, timeout, host, ip))
            continue
        if seen.get("error"):
            problems.append("%s: the task placed on node:%s failed: %s" % (host, ip, seen["error"]))
            continue
        if seen.get("ray_node_ip") != ip:
            problems.append("%s: the task placed on node:%s runs on a Ray node registered as %s" % (
                host, ip, seen.get("ray_node_ip")))
        if seen.get("get_ip") is None:
            problems.append("%s: vLLM's get_ip() could not run in the Ray worker: %s" % (host, seen.get("get_ip_error")))
        elif seen["get_ip"] != ip:
            problems.append(
                "%s: in a Ray worker on this node vLLM's get_ip() returns %s (VLLM_HOST_IP=%s), not the node's Ray "
                "address %s; vLLM would send the other ranks to %s; put VLLM_HOST_IP=%s in this node's env file and "
                "restart Ray (run playbooks/deploy.yml)" % (host, seen["get_ip"], seen.get("VLLM_HOST_IP"), ip,
                                                            seen["get_ip"], ip))
    return problems


def placement_rows(result: Optional[Mapping[str, Any]], hosts: Mapping[str, str]) -> list[str]:
    """One line per node for the play to print."""
    nodes = (result or {}).get("nodes") or {}
    lines = []
    for host in sorted(hosts):
        seen = nodes.get(hosts[host]) or {}
        lines.append("%s: task on node:%s ran on Ray node %s, VLLM_HOST_IP=%s, vLLM get_ip()=%s" % (
            host, hosts[host], seen.get("ray_node_ip", "-"), seen.get("VLLM_HOST_IP", "-"), seen.get("get_ip", "-")))
    return lines
