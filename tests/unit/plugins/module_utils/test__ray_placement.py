# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _node_ray_placement
from ansible_collections.multinode.vllm.plugins.module_utils._ray_placement import (
    parse_output,
    placement_problems,
    placement_rows,
)
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv

# What ray_placement_check runs under the head's interpreter (the node script's source).
SCRIPT = inspect.getsource(_node_ray_placement)

HOSTS = {"spark1": "198.18.200.12", "spark2": "198.18.200.13"}


def seen(ip, get_ip=None, vllm_host_ip=None):
    return {"ray_node_ip": ip, "VLLM_HOST_IP": vllm_host_ip or ip, "get_ip": get_ip or ip, "pid": 1}


def test_script_compiles_and_prints_the_marker():
    compile(SCRIPT, "<placement>", "exec")
    assert "MULTINODE_PLACEMENT " in SCRIPT and 'resources={"node:" + ip' in SCRIPT


def test_script_without_ray_prints_the_driver_error():
    """Run as the module runs it: without an importable Ray, one marker line that says why, exit 0."""
    try:
        import ray  # noqa: F401  pylint: disable=unused-import
        pytest.skip("ray is importable in the test interpreter")
    except ImportError:
        pass
    config = {"address": "198.18.200.12:6379", "fabric_ips": ["198.18.200.12"], "deadline": time.time() + 5}
    proc = subprocess.run(script_argv([sys.executable], _node_ray_placement, json.dumps(config)), capture_output=True,
                          text=True, timeout=60, check=False)
    result = parse_output(proc.stdout)
    assert proc.returncode == 0 and result is not None, (proc.stdout, proc.stderr)
    assert result["error"].startswith("cannot connect a Ray driver to 198.18.200.12:6379: ModuleNotFoundError")
    assert placement_problems(result, {"spark1": "198.18.200.12"}, 5) == [result["error"]]


def test_parse_output_takes_the_last_marker_line():
    out = "noise\nMULTINODE_PLACEMENT {\"error\": \"x\"}\nMULTINODE_PLACEMENT " + json.dumps({"error": None}) + "\n"
    assert parse_output(out) == {"error": None}
    assert parse_output("nothing") is None


def test_healthy_cluster_has_no_problems_and_one_row_per_host():
    result = {"error": None, "nodes": {ip: seen(ip) for ip in HOSTS.values()}}
    assert placement_problems(result, HOSTS, 60) == []
    assert placement_rows(result, HOSTS)[1] == ("spark2: task on node:198.18.200.13 ran on Ray node 198.18.200.13, "
                                                "VLLM_HOST_IP=198.18.200.13, vLLM get_ip()=198.18.200.13")


def test_the_incident_head_offers_no_fabric_resource():
    result = {"error": None, "nodes": {"198.18.200.12": {"error": "not placed"}, "198.18.200.13": seen("198.18.200.13")}}
    problems = placement_problems(result, HOSTS, 60)
    assert len(problems) == 1
    assert problems[0].startswith("spark1: no Ray node offers the resource node:198.18.200.12 within 60 s")
    assert "--node-ip-address 198.18.200.12" in problems[0]


def test_get_ip_in_the_worker_must_be_the_ray_address():
    result = {"error": None, "nodes": {"198.18.200.12": seen("198.18.200.12"),
                                       "198.18.200.13": seen("198.18.200.13", get_ip="198.19.2.10", vllm_host_ip="")}}
    problems = placement_problems(result, HOSTS, 60)
    assert problems == [
        "spark2: in a Ray worker on this node vLLM's get_ip() returns 198.19.2.10 (VLLM_HOST_IP=198.18.200.13), not "
        "the node's Ray address 198.18.200.13; vLLM would send the other ranks to 198.19.2.10; put "
        "VLLM_HOST_IP=198.18.200.13 in this node's env file and restart Ray (run playbooks/deploy.yml)"]


def test_driver_errors_and_missing_output_are_reported():
    assert placement_problems({"error": "cannot connect a Ray driver to x: AuthenticationError: y"}, HOSTS, 60) == [
        "cannot connect a Ray driver to x: AuthenticationError: y"]
    assert placement_problems(None, HOSTS, 60) == ["the Ray-placed check printed no result (see its stderr)"]
    broken = {"error": None, "nodes": {"198.18.200.12": {"error": "RayTaskError: boom"},
                                       "198.18.200.13": dict(seen("198.18.200.13"), get_ip=None,
                                                             get_ip_error="ImportError: no vllm")}}
    assert placement_problems(broken, HOSTS, 60) == [
        "spark1: the task placed on node:198.18.200.12 failed: RayTaskError: boom",
        "spark2: vLLM's get_ip() could not run in the Ray worker: ImportError: no vllm"]
