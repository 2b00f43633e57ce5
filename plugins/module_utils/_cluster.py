# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The cluster's identity, computed once per host after the fabric preflight.

Pure and typed: no Ansible imports, no I/O. The fabric role sets the fact ``multinode_cluster`` from it (filter
``_cluster_identity``) right after its cluster checks pass; every later role and play reads that one fact instead of
looking the head up in the inventory groups again (head, head's fabric address, the Ray address, node rank, the
cluster's hosts in order, backend, runtime, whether this run serves).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import port_number
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

BACKENDS = ("ray", "native")
RUNTIMES = ("docker", "systemd", "process")


class ClusterError(MultinodeError, ValueError):
    """The inventory or the fabric facts cannot give the cluster an identity; the message names the fix."""


def _port(value: Any, what: str) -> int:
    port = port_number(value)
    if port is None:
        raise ClusterError("%s = %r: expected a TCP port (1-65535); set it to one in the inventory" % (what, value))
    return port


def identity(hostvars: Mapping[str, Mapping[str, Any]], host: str, head_hosts: Sequence[str],
             worker_hosts: Sequence[str], *, ray_gcs_port: Any, backend: str, runtime: str,
             serve: bool) -> dict[str, Any]:
    """``host``'s view of the cluster. Node ranks follow the head first, then the workers in inventory order."""
    heads = [str(h) for h in head_hosts]
    if len(heads) != 1:
        raise ClusterError(
            "the head group has %d hosts (%s); exactly one is needed: put one host in it (playbooks/cluster.yml maps "
            "multinode_head_group onto it)" % (len(heads), ", ".join(heads) or "none"))
    head = heads[0]
    workers = [str(w) for w in worker_hosts if str(w) != head]
    hosts = [head] + workers
    if str(host) not in hosts:
        raise ClusterError("%s: not in the head or worker group (%s); add it to one of them" % (host, ", ".join(hosts)))
    if backend not in BACKENDS:
        raise ClusterError("%s: vllm_backend = %r: expected one of %s" % (host, backend, ", ".join(BACKENDS)))
    if runtime not in RUNTIMES:
        raise ClusterError("%s: multinode_runtime = %r: expected one of %s" % (host, runtime, ", ".join(RUNTIMES)))
    fabric = (hostvars.get(head) or {}).get("multinode_fabric") or {}
    head_ip = fabric.get("ip") if isinstance(fabric, Mapping) else None
    if not head_ip:
        raise ClusterError("%s: the head has no multinode_fabric fact; run the role multinode.vllm.fabric on every "
                           "cluster host first (every playbook of the collection does)" % head)
    port = _port(ray_gcs_port, "%s: ray_gcs_port" % head)
    return {
        "head": head,
        "workers": workers,
        "hosts": hosts,
        "role": "head" if str(host) == head else "worker",
        "node_rank": hosts.index(str(host)),
        "head_fabric_ip": str(head_ip),
        "ray_address": "%s:%d" % (head_ip, port),
        "backend": backend,
        "runtime": runtime,
        "serve": bool(serve),
    }


def node_table(hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str], *, native: bool) -> list[str]:
    """The summary's node table: host, management and fabric addresses, the address Ray runs on, GPUs."""
    fmt = "%-8s %-15s %-15s %-15s %s"
    rows = [fmt % ("HOST", "MGMT", "FABRIC", "RAY ADDRESS", "GPUS")]
    for host in hosts:
        hv = hostvars.get(host) or {}
        fabric = hv.get("multinode_fabric") or {}
        ray = "- (native)" if native else ((hv.get("multinode_ray_node") or {}).get("node_ip_address") or "-")
        gpus = hv.get("vllm_gpus_per_node") or hv.get("ray_num_gpus") or 1
        rows.append(fmt % (host, fabric.get("mgmt_ip", "-"), fabric.get("ip", "-"), ray, gpus))
    return rows
