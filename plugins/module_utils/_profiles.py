# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory profiles: ``multinode_profile`` names a kind of cluster, and each role's defaults read theirs here.

A profile only changes defaults: a variable the inventory sets wins, as over any role default. The table is the
one place a profile's values live, with the reason (and the published figure) for each; docs/dgx-spark.md prints it.
"""

from __future__ import annotations

import json
from typing import Any

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

PROFILE_VAR = "multinode_profile"

# name -> {variable: (value, why)}
PROFILES: dict[str, dict[str, tuple[Any, str]]] = {
    "dgx_spark": {
        "fabric_expected_mtu": (
            9000,
            "both halves of the ConnectX-7 port at both ends; at MTU 1500 NCCL all_gather reached 18.9-21.0 GB/s "
            "(NVIDIA/dgx-spark-playbooks issue 25)"),
        "distributed_preflight_nccl_expect_transport": (
            "ib",
            "NCCL must carry the all-reduce over NET/IB on both HCAs of the port, never NET/Socket"),
        "distributed_preflight_size_mib": (
            1024,
            "a transfer large enough to measure the link (the published figures used 1-16 GiB messages)"),
        "distributed_preflight_min_busbw_gbps": (
            15,
            "23.74 GB/s healthy vs 3.04 GB/s misconfigured (dgx-spark-playbooks PR 103, issue 102); one HCA about "
            "12.3 GB/s (tonyd2wild PR 35): 15 fails both faults and passes a healthy pair"),
        "multinode_unified_memory": (
            True,
            "the GB10 shares its memory (about 120 GiB) between CPU and GPU: Ray's memory monitor off, gpu_memory_utilization derived "
            "from MemAvailable, the model's fit checked before load (docs/serve.md)"),
    },
}


class ProfileError(MultinodeError):
    """An unknown profile name."""


def check_profile(profile: Any) -> str:
    """The profile's name ('' when unset); an unknown one fails naming the known ones."""
    name = "" if profile is None else str(profile).strip()
    if name and name not in PROFILES:
        raise ProfileError("%s is %r, which is not a profile; known: %s (or leave it unset)" % (
            PROFILE_VAR, name, ", ".join(sorted(PROFILES))))
    return name


def profile_default(profile: Any, variable: str, default: Any = None) -> Any:
    """The default of ``variable`` under ``profile``: the profile's value, else ``default``."""
    name = check_profile(profile)
    entry = PROFILES.get(name, {}).get(variable)
    return default if entry is None else entry[0]


def profile_table(profile: str) -> list[str]:
    """Markdown rows (variable | value | why) of one profile, for the docs."""
    rows = ["| variable | value | why |", "|---|---|---|"]
    for variable, (value, why) in PROFILES[check_profile(profile)].items():
        rows.append("| `%s` | `%s` | %s |" % (variable, json.dumps(value), why))
    return rows
