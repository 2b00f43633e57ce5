# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Ray-placed check: a Ray driver that places one task on each node (a node script).

``ray_placement_check`` runs this file's source under the head's env file as ``<python> -c <source> <json config>``
(``_scripts.script_argv``; config: ``address``, ``fabric_ips``, ``deadline``). It connects to the cluster, places one
zero-CPU task on each fabric address through the ``node:<ip>`` resource (vLLM's ``_get_ray_placement_group`` pins
bundles the same way), and in that Ray worker, with exactly the environment vLLM's workers get from the raylet,
records Ray's node address, ``VLLM_HOST_IP`` and vLLM's own ``get_ip()``. It prints one ``MULTINODE_PLACEMENT
<json>`` line; ``_ray_placement.placement_problems`` turns it into messages.

Self-contained (standard library only; Ray and vLLM are imported when it runs), as every node script is.
"""

from __future__ import annotations

import json
import os
import sys
import time

MARKER = "MULTINODE_PLACEMENT "


def probe() -> dict:
    """What a Ray worker placed on one node sees (runs in that worker)."""
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


def place(cfg: dict) -> dict:
    """``{"error", "nodes": {fabric ip: what the task there saw, or its error}}``."""
    out: dict = {"error": None, "nodes": {}}
    try:
        import ray
        ray.init(address=cfg["address"], logging_level="ERROR", log_to_driver=False)
    except Exception as exc:
        out["error"] = "cannot connect a Ray driver to %s: %s: %s" % (cfg["address"], type(exc).__name__, exc)
        return out
    task = ray.remote(num_cpus=0)(probe)
    refs = {ip: task.options(resources={"node:" + ip: 0.001}).remote() for ip in cfg["fabric_ips"]}
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
    return out


def main(argv=None) -> int:
    argv = sys.argv if argv is None else argv
    sys.stdout.write(MARKER + json.dumps(place(json.loads(argv[1]))) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
    # Skip interpreter teardown: a Ray driver's shutdown can stall; the result is printed.
    os._exit(0)
