# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reader of Ray's node table that ray_verify runs under the node's Python.

``READER`` is source text, not code of this module: ray_verify runs it as
``<python> -c READER <gcs address> <timeout> [<nodes to wait for> <seconds to wait>]`` with the node venv's
interpreter (or ``docker exec <container> python``), where Ray is importable. Waiting for the nodes to join
happens inside that one process (one Ray import, the table read every 0.2 s; a read that fails inside the wait
window, as a GCS that has just started can, is read again), not by starting it again.
"""

from __future__ import annotations

# Runs under the node's Python (venv or container). Prints one JSON object.
READER = r"""
import json, sys
try:
    import ray
    from ray._raylet import GcsClient
except Exception as exc:
    print(json.dumps({"error": "import", "detail": "%s: %s" % (type(exc).__name__, exc)}))
    sys.exit(0)
version = getattr(ray, "__version__", "unknown")
import socket
host, _, port = sys.argv[1].rpartition(":")
try:
    socket.create_connection((host, int(port)), timeout=float(sys.argv[2])).close()
except (OSError, ValueError) as exc:
    print(json.dumps({"error": "connect", "detail": "%s: %s" % (type(exc).__name__, exc), "ray_version": version}))
    sys.exit(0)
try:
    alive_state = 0
    try:
        from ray.core.generated import gcs_pb2
        alive_state = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
    except Exception:
        pass
    client = GcsClient(address=sys.argv[1])
    try:
        read = client.get_all_node_info
    except AttributeError as exc:
        print(json.dumps({"error": "api", "detail": str(exc), "ray_version": version}))
        sys.exit(0)
    import time
    wait_nodes = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    deadline = time.monotonic() + (float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
    alive_seen = []
    while True:
        try:
            info = read(timeout=float(sys.argv[2]))
        except Exception:
            # A GCS that has just (re)started can fail a read for a moment: inside the wait window, read again.
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise
        nodes = []
        for node_id, node in info.items():
            nodes.append({
                "node_id": node_id.hex() if hasattr(node_id, "hex") else str(node_id),
                "node_manager_address": node.node_manager_address,
                "alive": node.state == alive_state,
                "resources": dict(node.resources_total),
                "is_head": bool(getattr(node, "is_head_node", False)),
            })
        alive = sum(1 for node in nodes if node["alive"])
        if not alive_seen or alive_seen[-1] != alive:
            alive_seen.append(alive)
        if alive >= wait_nodes or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
except Exception as exc:
    print(json.dumps({"error": "read", "detail": "%s: %s" % (type(exc).__name__, exc), "ray_version": version}))
    sys.exit(0)
print(json.dumps({"ray_version": version, "nodes": nodes, "alive_seen": alive_seen}))
"""
