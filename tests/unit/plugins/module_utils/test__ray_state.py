# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ray node table vs inventory: every check, with the exact messages."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._ray_state import evaluate, format_table

CIDR = "198.18.200.0/24"
INVENTORY = {
    "spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
    "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.2.10"},
}
GOOD_ENV = {"spark1": {"VLLM_HOST_IP": "198.18.200.12"}, "spark2": {"VLLM_HOST_IP": "198.18.200.13"}}


def node(address, alive=True, gpus=1, node_id=None, head=False):
    return {
        "node_id": node_id or ("%032x" % abs(hash((address, alive, node_id)))),
        "node_manager_address": address,
        "alive": alive,
        "resources": {"CPU": 2.0, "GPU": float(gpus)} if gpus is not None else {"CPU": 2.0},
        "is_head": head,
    }


HEALTHY = [node("198.18.200.12", head=True), node("198.18.200.13")]

INCIDENT_MSG = (
    "spark1: Ray registered this node as 198.19.1.10, outside the fabric 198.18.200.0/24; "
    "restart it with --node-ip-address 198.18.200.12 (run playbooks/deploy.yml)"
)


@pytest.mark.parametrize(
    "nodes, env, gpus, expected",
    [
        pytest.param(HEALTHY, GOOD_ENV, 2, [], id="healthy"),
        pytest.param(
            # A restarted worker leaves a dead record beside its new alive one: fine.
            HEALTHY + [node("198.18.200.13", alive=False)], GOOD_ENV, 2, [], id="stale-dead-record",
        ),
        pytest.param(
            # The incident: head without --node-ip-address, worker through the fabric; no VLLM_HOST_IP.
            [node("198.19.1.10", head=True), node("198.18.200.13")],
            {"spark1": {}, "spark2": {}},
            2,
            [
                INCIDENT_MSG,
                "spark1: the running raylet has no VLLM_HOST_IP in its environment; vLLM workers there would pick "
                "the management address; restart Ray with VLLM_HOST_IP=198.18.200.12 in its environment "
                "(run playbooks/deploy.yml)",
                "spark2: the running raylet has no VLLM_HOST_IP in its environment; vLLM workers there would pick "
                "the management address; restart Ray with VLLM_HOST_IP=198.18.200.13 in its environment "
                "(run playbooks/deploy.yml)",
            ],
            id="incident",
        ),
        pytest.param(
            [node("198.18.200.12", head=True)],
            {"spark1": GOOD_ENV["spark1"], "spark2": None},
            0,
            [
                "Ray has 1 alive node but the inventory has 2 hosts (spark1, spark2); not registered: spark2 "
                "(198.18.200.13); start Ray on every host with its fabric address (run playbooks/deploy.yml)",
                "spark2: no alive Ray node is registered at its fabric address 198.18.200.13; start Ray there with "
                "--node-ip-address 198.18.200.13 (run playbooks/deploy.yml)",
            ],
            id="worker-missing",
        ),
        pytest.param(
            [node("198.18.200.12", head=True), node("198.18.200.13", alive=False, node_id="ab" * 16)],
            {"spark1": GOOD_ENV["spark1"]},
            0,
            [
                "Ray has 1 alive node but the inventory has 2 hosts (spark1, spark2); not registered: spark2 "
                "(198.18.200.13); start Ray on every host with its fabric address (run playbooks/deploy.yml)",
                "spark2: the Ray node registered as 198.18.200.13 (node id abababababab) is dead and no alive node "
                "holds that fabric address; restart Ray there (run playbooks/deploy.yml)",
                "spark2: no alive Ray node is registered at its fabric address 198.18.200.13; start Ray there with "
                "--node-ip-address 198.18.200.13 (run playbooks/deploy.yml)",
            ],
            id="dead-worker",
        ),
        pytest.param(
            HEALTHY + [node("198.18.200.13", node_id="cd" * 16)],
            GOOD_ENV,
            0,
            [
                "Ray has 3 alive nodes but the inventory has 2 hosts (spark1, spark2); start Ray on every host with "
                "its fabric address (run playbooks/deploy.yml)",
                "spark2: its fabric address 198.18.200.13 is registered by 2 alive Ray nodes; exactly one is allowed: "
                "stop the extra raylets and restart Ray (run playbooks/deploy.yml)",
            ],
            id="registered-twice",
        ),
        pytest.param(
            [node("198.18.200.12", head=True), node("10.0.0.5", node_id="ef" * 16)],
            {"spark1": GOOD_ENV["spark1"]},
            0,
            [
                "Ray node efefefefefef is registered as 10.0.0.5, outside the fabric 198.18.200.0/24, and matches no "
                "inventory host's fabric or management address; stop it (ray stop on that machine) or start it with "
                "--node-ip-address <its fabric address>",
                "spark2: no alive Ray node is registered at its fabric address 198.18.200.13; start Ray there with "
                "--node-ip-address 198.18.200.13 (run playbooks/deploy.yml)",
            ],
            id="unknown-outside",
        ),
        pytest.param(
            [node("198.18.200.12", head=True), node("198.18.200.13"), node("198.18.200.99", node_id="99" * 16)],
            GOOD_ENV,
            0,
            [
                "Ray has 3 alive nodes but the inventory has 2 hosts (spark1, spark2); start Ray on every host with "
                "its fabric address (run playbooks/deploy.yml)",
                "Ray node 999999999999 is registered as 198.18.200.99, inside the fabric 198.18.200.0/24, but no "
                "inventory host has that fabric address; stop it or add its host to the inventory",
            ],
            id="stranger-inside",
        ),
        pytest.param(
            [node("198.18.200.12", head=True), node("198.18.200.13", gpus=0)],
            GOOD_ENV,
            2,
            [
                "spark2: Ray sees 0 GPUs on this node (198.18.200.13); vLLM needs 2 GPUs across the cluster; start "
                "Ray with the GPUs visible (--num-gpus, GPU runtime of the container) (run playbooks/deploy.yml)",
                "Ray sees 1 GPUs in total (spark1=1, spark2=0) but tensor_parallel_size * pipeline_parallel_size = 2; "
                "add nodes or GPUs, or lower the parallel sizes",
            ],
            id="gpu-missing",
        ),
        pytest.param(HEALTHY, GOOD_ENV, 0, [], id="gpu-check-off"),
        pytest.param(
            [node("198.18.200.12", head=True, gpus=None), node("198.18.200.13", gpus=None)], GOOD_ENV, 0, [],
            id="no-gpu-key-check-off",
        ),
        pytest.param(
            HEALTHY,
            GOOD_ENV,
            4,
            [
                "Ray sees 2 GPUs in total (spark1=1, spark2=1) but tensor_parallel_size * pipeline_parallel_size = 4; "
                "add nodes or GPUs, or lower the parallel sizes",
            ],
            id="gpu-total-short",
        ),
        pytest.param(
            HEALTHY,
            {"spark1": {"VLLM_HOST_IP": "198.18.200.12"}, "spark2": {"VLLM_HOST_IP": "198.18.200.12"}},
            0,
            [
                "spark2: the running raylet has VLLM_HOST_IP=198.18.200.12, expected its fabric address "
                "198.18.200.13; restart Ray with the node's env file (run playbooks/deploy.yml)",
                "spark1 and spark2 all run their raylet with VLLM_HOST_IP=198.18.200.12; every node needs its own "
                "fabric address (run playbooks/deploy.yml)",
            ],
            id="vllm-host-ip-duplicate",
        ),
        pytest.param(
            HEALTHY,
            {"spark1": {"VLLM_HOST_IP": "198.19.1.10"}, "spark2": GOOD_ENV["spark2"]},
            0,
            [
                "spark1: the running raylet has VLLM_HOST_IP=198.19.1.10, expected its fabric address 198.18.200.12; "
                "restart Ray with the node's env file (run playbooks/deploy.yml)",
            ],
            id="vllm-host-ip-mgmt",
        ),
    ],
)
def test_evaluate(nodes, env, gpus, expected):
    _rows, errors = evaluate(nodes, INVENTORY, CIDR, gpus, env)
    assert errors == expected


def test_incident_message_is_exactly_the_issue_example():
    _rows, errors = evaluate([node("198.19.1.10", head=True), node("198.18.200.13")], INVENTORY, CIDR, 0, {})
    assert errors == [INCIDENT_MSG]


def test_rows_map_nodes_to_hosts_and_list_hosts_ray_does_not_know():
    rows, _errors = evaluate([node("198.19.1.10", head=True)], INVENTORY, CIDR, 0, {})
    assert [(r["host"], r["mgmt_ip"], r["ray_address"], r["alive"], r["gpus"]) for r in rows] == [
        ("spark1", "198.19.1.10", "198.19.1.10", True, 1.0),
        ("spark2", "198.19.2.10", None, False, 0),
    ]


def test_format_table():
    rows, _errors = evaluate(HEALTHY, INVENTORY, CIDR, 2, GOOD_ENV)
    lines = format_table(rows)
    assert lines[0].split() == ["HOST", "MGMT", "RAY", "ADDRESS", "ALIVE", "GPUS", "HEAD"]
    assert lines[1].split() == ["spark1", "198.19.1.10", "198.18.200.12", "yes", "1", "head"]
    assert lines[2].split() == ["spark2", "198.19.2.10", "198.18.200.13", "yes", "1"]


def test_bad_cidr_raises():
    from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError

    with pytest.raises(FabricError):
        evaluate(HEALTHY, INVENTORY, "not-a-cidr")


def _auth(ip, mode="token", digest="a" * 64, path="/etc/multinode-vllm/ray-auth-token"):
    env = {"VLLM_HOST_IP": ip, "RAY_AUTH_MODE": mode}
    if path:
        env.update(RAY_AUTH_TOKEN_PATH=path, auth_token_sha256=digest)
    return env


@pytest.mark.parametrize(
    "spark2, expected",
    [
        (_auth("198.18.200.13"), None),
        (_auth("198.18.200.13", digest="b" * 64),
         "spark2: its Ray token (/etc/multinode-vllm/ray-auth-token) differs from the head's (spark1)"),
        (_auth("198.18.200.13", digest=None), "spark2: the raylet's token file /etc/multinode-vllm/ray-auth-token is "
                                              "missing or unreadable"),
        (_auth("198.18.200.13", mode=None, path=None), "spark2: the running raylet has no RAY_AUTH_MODE=token while "
                                                       "the head spark1 requires a token"),
    ],
)
def test_token_auth_must_match_the_heads(spark2, expected):
    env = {"spark1": _auth("198.18.200.12"), "spark2": spark2}
    _rows, errors = evaluate(HEALTHY, INVENTORY, CIDR, 2, env, head="spark1")
    if expected is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith(expected), errors
        assert "run playbooks/deploy.yml" in errors[0]


def test_token_auth_is_not_checked_when_the_head_has_none():
    env = {"spark1": _auth("198.18.200.12", mode=None, path=None), "spark2": _auth("198.18.200.13", digest="b" * 64)}
    assert evaluate(HEALTHY, INVENTORY, CIDR, 2, env, head="spark1")[1] == []
