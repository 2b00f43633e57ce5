# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ray-placed check: one task per node, placed as vLLM's placement group places its workers.

``SCRIPT`` is source text run as a Ray driver under the head's env file (``<python> -c SCRIPT <json config>``):
it connects to the cluster, places one zero-CPU task on each fabric address through the ``node:<ip>`` resource
(vLLM's ``_get_ray_placement_group`` pins bundles the same way), and in that Ray worker, with exactly the
environment vLLM's workers get from the raylet, records Ray's node address, ``VLLM_HOST_IP`` and vLLM's own
``get_ip()``. ``placement_problems`` (pure) turns the results into messages.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import parse_marked

MARKER = "MULTINODE_PLACEMENT "

SCRIPT = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
out = {"error": None, "nodes": {}}
def emit():
    print("MULTINODE_PLACEMENT " + json.dumps(out), flush=True)
try:
    import ray
    ray.init(address=cfg["address"], logging_level="ERROR", log_to_driver=False)
except Exception as exc:
    out["error"] = "cannot connect a Ray driver to %s: %s: %s" % (cfg["address"], type(exc).__name__, exc)
    emit()
    sys.exit(0)

@ray.remote(num_cpus=0)
def probe():
    import os
    import ray as worker_ray
    seen = {"ray_node_ip": worker_ray.util.get_node_ip_address(), "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP"),
            "pid": os.getpid(), "get_ip": None, "get_ip_source": None, "get_ip_error": None}
    for name in ("vllm.utils.network_utils", "vllm.utils"):
        try:
            module = __import__(name, fromlist=["get_ip"])
            seen["get_ip"] = str(module.get_ip())
            seen["get_ip_source"] = name + ".get_ip"
            seen["get_ip_error"] = None
            break
        except Exception as exc:
            seen["get_ip_error"] = "%s: %s" % (type(exc).__name__, exc)
    return seen

refs = {ip: probe.options(resources={"node:" + ip: 0.001}).remote() for ip in cfg["fabric_ips"]}
deadline = cfg["deadline"]
ready, _pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=max(1.0, deadline - time.time()))
for ip, ref in refs.items():
    if ref in ready:
        try:
            out["nodes"][ip] = ray.get(ref)
        except Exception as exc:
            out["nodes"][ip] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    else:
        out["nodes"][ip] = {"error": "not placed"}
emit()
os._exit(0)
"""


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
