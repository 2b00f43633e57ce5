# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reader of Ray's node table: a program ray_verify runs under the node's Python (a node script).

``ray_verify`` runs this file's source as
``<python> -c <source> <gcs address> <timeout> [<nodes to wait for> <seconds to wait>]`` with the node venv's
interpreter (or ``docker exec <container> python``), where Ray is importable (``_scripts.script_argv``). Waiting for
the nodes to join happens inside that one process (one Ray import, the table read every 0.2 s; a read that fails
inside the wait window, as a GCS that has just started can, is read again), not by starting it again. It prints one
JSON object: the Ray version, the nodes and the alive counts seen, or an error (``import``, ``connect``, ``api``,
``read``) with its detail.

Self-contained (standard library only; Ray is imported when it runs), as every node script is.
"""

from __future__ import annotations

import json
import socket
import sys
import time


def read(argv: list) -> dict:
    """The node table at ``argv[1]`` (the GCS address), as the JSON object ``main`` prints."""
    try:
        import ray
        from ray._raylet import GcsClient
    except Exception as exc:
        return {"error": "import", "detail": "%s: %s" % (type(exc).__name__, exc)}
    version = getattr(ray, "__version__", "unknown")
    host, _sep, port = argv[1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=float(argv[2])).close()
    except (OSError, ValueError) as exc:
        return {"error": "connect", "detail": "%s: %s" % (type(exc).__name__, exc), "ray_version": version}
    try:
        alive_state = 0
        try:
            from ray.core.generated import gcs_pb2
            alive_state = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
        except Exception:
            pass
        client = GcsClient(address=argv[1])
        try:
            read_all = client.get_all_node_info
        except AttributeError as exc:
            return {"error": "api", "detail": str(exc), "ray_version": version}
        wait_nodes = int(argv[3]) if len(argv) > 3 else 0
        deadline = time.monotonic() + (float(argv[4]) if len(argv) > 4 else 0.0)
        alive_seen: list = []
        while True:
            try:
                info = read_all(timeout=float(argv[2]))
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
        return {"error": "read", "detail": "%s: %s" % (type(exc).__name__, exc), "ray_version": version}
    return {"ray_version": version, "nodes": nodes, "alive_seen": alive_seen}


def main(argv=None) -> int:
    sys.stdout.write(json.dumps(read(sys.argv if argv is None else argv)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
