# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The tagged problem: its line, its order, and the checks' tagged functions giving their old messages."""

from __future__ import annotations

from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import listener_problems
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    check_cluster,
    cluster_problems,
    parse_network,
    select_fabric,
)
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem, lines, messages, ordered
from ansible_collections.multinode.vllm.plugins.module_utils._ray_state import evaluate, evaluate_problems
from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import cause_problem, likely_cause
from ansible_collections.multinode.vllm.plugins.module_utils._stack import stack_errors, stack_problems

CIDR = "198.18.200.0/24"
INVENTORY = {"spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
             "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"}}


def test_line_text_and_order():
    a = Problem("r1", "seen", "why", "do this", host="spark2", weight=10)
    b = Problem("r2", "other", "because", "fix it", weight=90)
    assert a.line() == "spark2: seen -> why -> do this"
    assert b.line() == "other -> because -> fix it"
    assert a.text == "spark2: seen; why; do this"
    assert Problem("r", "s", "c", "f", message="the old message").text == "the old message"
    assert ordered([a, b, a]) == [b, a]
    assert lines([b]) == ["other -> because -> fix it"]
    assert messages([a]) == ["spark2: seen; why; do this"]
    assert a.weighted(5).weight == 5 and a.as_dict()["rule"] == "r1"


def selection(host, mtu, ip):
    net = parse_network({"interfaces": [
        {"name": "eth0", "addresses": [INVENTORY[host]["mgmt_ip"] + "/24"], "mtu": 1500, "default_route": True,
         "operstate": "up"},
        {"name": "fab0", "addresses": [ip + "/24"], "mtu": mtu, "operstate": "up"}]})
    return select_fabric(host, net, CIDR)


def test_fabric_cluster_problems_are_check_clusters_messages():
    sels = {"spark1": selection("spark1", 9000, "198.18.200.12"), "spark2": selection("spark2", 1500, "198.18.200.12")}
    problems = cluster_problems(sels, CIDR, ["spark1"], INVENTORY, 9000)
    assert messages(problems) == check_cluster(sels, CIDR, ["spark1"], INVENTORY, 9000)
    assert [p.rule for p in problems] == ["fabric_ip_mismatch", "fabric_ip_shared", "fabric_mtu_mismatch",
                                          "fabric_mtu_expected"]


def test_ray_problems_are_evaluates_messages():
    nodes = [{"node_id": "a" * 32, "node_manager_address": "198.19.1.10", "alive": True, "is_head": True},
             {"node_id": "b" * 32, "node_manager_address": "198.18.200.13", "alive": False}]
    env = {"spark1": {}, "spark2": {"VLLM_HOST_IP": "198.18.200.12"}}
    rows, problems = evaluate_problems(nodes, INVENTORY, CIDR, 2, env, "spark1")
    assert (rows, messages(problems)) == evaluate(nodes, INVENTORY, CIDR, 2, env, "spark1")
    assert {"ray_node_count", "ray_node_dead", "ray_not_on_fabric", "vllm_host_ip_missing",
            "vllm_host_ip_wrong", "ray_gpus"} <= {p.rule for p in problems}


def test_stack_problems_are_stack_errors():
    stacks = {"spark1": {"ray": "2.52.0"}, "spark2": {"ray": "2.51.0"}}
    assert messages(stack_problems(stacks)) == stack_errors(stacks)


def test_bind_and_serve_failure_problems():
    listener = {"proto": "tcp", "address": "0.0.0.0", "port": 6379, "processes": [{"pid": 9, "name": "gcs_server"}],
                "verdict": "violation", "reason": "a wildcard", "message": "spark1: gcs_server ..."}
    problem, = listener_problems([listener, dict(listener, verdict="allowed")], "198.18.200.12", "spark1")
    assert (problem.rule, problem.host, problem.message) == ("bind_not_fabric", "spark1", "spark1: gcs_server ...")
    cause = likely_cause({"spark2": ["OSError: [Errno 28] No space left on device"]})
    assert cause is not None and cause["key"] == "disk_full"
    assert cause_problem(cause).rule == "vllm_disk_full"
