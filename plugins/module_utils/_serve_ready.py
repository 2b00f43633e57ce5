# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serve's readiness: what /health, /v1/models and a completion answered, and whether each rank reached the head.

- ``health_ok`` / ``models_list`` / ``completion_result``: the readiness stages
  (``STAGES``), from the HTTP answers the ``vllm_ready`` action gets;
- ``rendezvous_check``: native backend, did every rank connect to the head's
  fabric address (the connections: ``_proc_net.parse_proc_net_tcp``).

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._serve import ServeError

STAGES = ("starting", "health", "models", "completion", "ready")


def _json(body: Any) -> Any:
    if isinstance(body, (dict, list)):
        return body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        return json.loads(body or "")
    except ValueError:
        return None


def health_ok(status: Optional[int]) -> bool:
    return status == 200


def models_list(body: Any) -> list[str]:
    """Model ids that /v1/models lists (an empty list for anything else)."""
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return []
    return [str(m.get("id")) for m in data["data"] if isinstance(m, dict) and m.get("id") is not None]


def completion_result(body: Any) -> dict[str, Any]:
    """Text and token counts of a /v1/completions answer; raises ServeError if it has none."""
    data = _json(body)
    if not isinstance(data, dict):
        raise ServeError("the completion answer is not JSON: %r" % (str(body)[:200],))
    if "error" in data and not data.get("choices"):
        raise ServeError("the completion failed: %s" % json.dumps(data["error"])[:300])
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict) or "text" not in choices[0]:
        raise ServeError("the completion answer has no choices[0].text: %s" % json.dumps(data)[:300])
    usage = data.get("usage") or {}
    text = str(choices[0]["text"])
    return {
        "text": text,
        "finish_reason": choices[0].get("finish_reason"),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
    }


def tokens_per_second(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 2) if seconds > 0 else 0.0


# ---------------------------------------------------------------------------
# native backend: did each rank reach the rendezvous over the fabric?
# ---------------------------------------------------------------------------


def rendezvous_check(host: str, rank: int, conns: Sequence[Mapping[str, Any]], own_fabric_ip: str,
                     head_fabric_ip: str, head_mgmt_ip: str = "", master_port: Optional[int] = None) -> Optional[str]:
    """None if this rank is connected to the head over the fabric; else what is wrong.

    Rank 0 (the head) must accept connections on its fabric address from the
    other ranks; a rank above 0 must hold established connections from its
    fabric address to the head's fabric address, and none to the head's
    management address. ``conns`` are the serve processes' sockets.
    """
    est = [c for c in conns if c.get("state") == "ESTABLISHED"]
    if rank == 0:
        inbound = [c for c in est if c["local"] == own_fabric_ip and c["remote"] != own_fabric_ip]
        if not inbound:
            return ("%s (rank 0): no other rank is connected to the head's fabric address %s"
                    % (host, own_fabric_ip))
        return None
    wrong = [c for c in est if head_mgmt_ip and c["remote"] == head_mgmt_ip]
    if wrong:
        return ("%s (rank %d): connected to the head's management address %s (port %d), not the fabric; "
                "set --master-addr and VLLM_HOST_IP to the head's fabric address %s"
                % (host, rank, head_mgmt_ip, wrong[0]["remote_port"], head_fabric_ip))
    to_head = [c for c in est if c["remote"] == head_fabric_ip]
    if not to_head:
        return ("%s (rank %d): no established connection to the head's fabric address %s; the rank did not "
                "reach the rendezvous" % (host, rank, head_fabric_ip))
    off = [c for c in to_head if c["local"] != own_fabric_ip]
    if off:
        return ("%s (rank %d): connects to %s from %s, not from its fabric address %s"
                % (host, rank, head_fabric_ip, off[0]["local"], own_fabric_ip))
    if master_port is not None and not any(c["remote_port"] == int(master_port) for c in to_head):
        return ("%s (rank %d): connected to the head's fabric address but not to the rendezvous port %d"
                % (host, rank, int(master_port)))
    return None
