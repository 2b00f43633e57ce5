# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPU machine's harness (tests/gpu/preflight_two_namespaces.py), run here on CPU with Gloo.

The device machine runs it with NCCL (docs/benchmarks.md, "NCCL preflight on a
GPU"); CI has no GPU, so this keeps what goes there working: its two
namespaces, the module run in each with the rendered node environment, the
cluster verdict, both scenarios judged, and nothing left behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT, node_python, require_root

HARNESS = ROOT / "tests" / "gpu" / "preflight_two_namespaces.py"


def _leftovers() -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [line for line in (names + links).splitlines() if "mnv-gpu-" in line or "mnvgpu-" in line]


def test_the_harness_passes_on_the_fabric_and_names_the_worker_off_it(tmp_path):
    require_root()
    run = subprocess.run(
        [sys.executable, str(HARNESS), "--backend", "gloo", "--interpreter", node_python(), "--size-mib", "8",
         "--misconfigured-timeout", "15", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=""), check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    fabric, misconfigured = report["outcomes"]
    assert fabric["scenario"] == "fabric" and fabric["report"]["ok"], fabric["report"]
    assert fabric["report"]["bandwidth"]["ranks"] == 2
    assert [row["gloo_interface"] for row in fabric["report"]["ranks"]] == ["fabric0", "fabric0"]
    assert fabric["envs"]["spark2"]["VLLM_HOST_IP"] == "198.18.210.2"
    assert not misconfigured["report"]["ok"]
    assert misconfigured["report"]["problems"][0] == (
        "spark2 could not reach the rendezvous at 198.18.210.1:29600 from interface mgmt0 (GLOO_SOCKET_IFNAME); "
        "the fabric interface is fabric0")
    assert max(misconfigured["walls_s"].values()) < 15 + 3 + 15
    assert _leftovers() == []
