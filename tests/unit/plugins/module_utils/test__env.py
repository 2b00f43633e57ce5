# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Node environment, vLLM's non-carry-over list, env files and `ray start` arguments."""

from __future__ import annotations

import json

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._env import (
    EnvSettings,
    RaySettings,
    carry_over_hazards,
    env_file,
    node_environment,
    non_carry_over_json,
    non_carry_over_keys,
    ray_start_args,
)
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    parse_network,
    select_fabric,
)

CIDR = "198.18.200.0/24"
HEAD = "198.18.200.12"


@pytest.fixture
def sparks(layout):
    """spark1 (RoCE v2 IPv4 GID at index 3) and spark2 (at index 4), as fabric_facts selects them."""
    return {host: select_fabric(host, parse_network(layout(host)), CIDR) for host in ("spark1", "spark2")}


def _envs(selections, **settings):
    env_settings = EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, **settings)
    return {host: node_environment(sel, env_settings) for host, sel in selections.items()}


def test_spark_environment_is_exact(sparks):
    assert _envs(sparks)["spark1"] == {
        "VLLM_HOST_IP": "198.18.200.12",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_SOCKET_IFNAME": "=enp1s0f1np1",
        "NCCL_IB_HCA": "=rocep1s0f1:1",
        "NCCL_IB_ADDR_RANGE": "198.18.200.0/24",
        "UCX_NET_DEVICES": "rocep1s0f1:1",
    }


def test_each_node_gets_its_own_host_ip(sparks):
    envs = _envs(sparks)
    assert (envs["spark1"]["VLLM_HOST_IP"], envs["spark2"]["VLLM_HOST_IP"]) == ("198.18.200.12", "198.18.200.13")


def test_addr_range_mode_is_identical_on_every_host(sparks):
    """GID index 3 on spark1 and 4 on spark2; NCCL_IB_ADDR_RANGE hides the difference."""
    assert (sparks["spark1"].gid_index, sparks["spark2"].gid_index) == (3, 4)
    envs = _envs(sparks, gid_selection="addr_range")
    assert envs["spark1"]["NCCL_IB_ADDR_RANGE"] == envs["spark2"]["NCCL_IB_ADDR_RANGE"] == CIDR
    assert not any("NCCL_IB_GID_INDEX" in env for env in envs.values())
    differing = sorted(k for k in envs["spark1"] if envs["spark1"][k] != envs["spark2"].get(k))
    assert differing == ["VLLM_HOST_IP"]
    assert "NCCL_IB_ADDR_RANGE" not in non_carry_over_keys(envs)


def test_index_mode_differs_per_host_and_is_not_carried(sparks):
    envs = _envs(sparks, gid_selection="index")
    assert (envs["spark1"]["NCCL_IB_GID_INDEX"], envs["spark2"]["NCCL_IB_GID_INDEX"]) == ("3", "4")
    assert not any("NCCL_IB_ADDR_RANGE" in env for env in envs.values())
    assert non_carry_over_keys(envs) == [
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
        "UCX_NET_DEVICES",
        "VLLM_HOST_IP",
    ]


def test_hca_is_exact_match_not_prefix(layout):
    """mlx5_1 and mlx5_10..mlx5_17 on one host: only the fabric netdev's port, with '='."""
    selection = select_fabric("gpu1", parse_network(layout("hgx_prefix_trap")), CIDR)
    env = node_environment(selection, EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD))
    assert env["NCCL_IB_HCA"] == "=mlx5_1:1"
    assert env["UCX_NET_DEVICES"] == "mlx5_1:1"
    assert env["NCCL_SOCKET_IFNAME"] == "=ens1f1np1"


def test_native_backend_adds_rendezvous(sparks):
    envs = _envs(sparks, backend="native", master_port=29511)
    for env in envs.values():
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (HEAD, "29511")
    assert not any("MASTER_ADDR" in env for env in _envs(sparks, backend="ray").values())


def test_host_without_rdma(layout):
    selection = select_fabric("node1", parse_network(layout("single_nic")), CIDR)
    env = node_environment(selection, EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, vllm_config_root="/etc/v"))
    assert env == {
        "VLLM_HOST_IP": "198.18.200.31",
        "GLOO_SOCKET_IFNAME": "eth0",
        "TP_SOCKET_IFNAME": "eth0",
        "NCCL_SOCKET_IFNAME": "=eth0",
        "UCX_NET_DEVICES": "eth0",
        "VLLM_CONFIG_ROOT": "/etc/v",
    }


def test_extra_adds_and_overrides_replace(sparks):
    settings = EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, extra={"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": 1})
    env = node_environment(sparks["spark1"], settings, overrides={"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1"})
    assert (env["NCCL_DEBUG"], env["HF_HUB_OFFLINE"]) == ("INFO", "1")
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"


ENV_ERROR_CASES = [
    # id, settings, overrides, substrings
    ("extra-replaces-computed-key", {"extra": {"VLLM_HOST_IP": "198.18.200.99"}}, None,
     ["spark1:", "extra environment sets VLLM_HOST_IP", "VLLM_HOST_IP=198.18.200.12", "per-host override"]),
    ("extra-replaces-nccl-ifname", {"extra": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}}, None,
     ["spark1:", "NCCL_SOCKET_IFNAME=" + "=enp1s0f1np1", "per-host override"]),
    ("extra-bad-key", {"extra": {"NCCL DEBUG": "INFO"}}, None,
     ["spark1:", "'NCCL DEBUG' is not a valid environment variable name"]),
    ("override-bad-key", {}, {"1NCCL": "x"}, ["spark1:", "'1NCCL' is not a valid environment variable name"]),
    ("bad-backend", {"backend": "mpi"}, None, ["backend 'mpi'", "ray, native"]),
    ("bad-gid-selection", {"gid_selection": "auto"}, None, ["gid_selection 'auto'", "addr_range, index"]),
    ("bad-cidr", {"fabric_cidr": "127.0.0.0/8"}, None, ["spark1:", "127.0.0.0/8 is a loopback range"]),
]


@pytest.mark.parametrize(
    "settings, overrides, substrings",
    [case[1:] for case in ENV_ERROR_CASES],
    ids=[case[0] for case in ENV_ERROR_CASES],
)
def test_node_environment_errors(sparks, settings, overrides, substrings):
    kwargs = {"fabric_cidr": CIDR, "head_fabric_ip": HEAD}
    kwargs.update(settings)
    with pytest.raises(FabricError) as caught:
        node_environment(sparks["spark1"], EnvSettings(**kwargs), overrides=overrides)
    message = str(caught.value)
    assert all(s in message for s in substrings), message


def test_index_mode_without_roce_v2_gid(layout):
    net = layout("spark1", rocep1s0f1={"gids": []})
    selection = select_fabric("spark1", parse_network(net), CIDR)
    with pytest.raises(FabricError) as caught:
        node_environment(selection, EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, gid_selection="index"))
    message = str(caught.value)
    for part in ("spark1:", "rocep1s0f1:1", "198.18.200.12", "use gid_selection 'addr_range'"):
        assert part in message


# ---------------------------------------------------------------------------
# non-carry-over list and hazards
# ---------------------------------------------------------------------------

NON_CARRY_CASES = [
    # id, envs_by_host, expected keys
    ("per-host-keys-even-when-equal", {"a": {"NCCL_IB_HCA": "=mlx5_1:1"}, "b": {"NCCL_IB_HCA": "=mlx5_1:1"}},
     ["NCCL_IB_HCA"]),
    ("carried-key-differs", {"a": {"NCCL_DEBUG": "INFO"}, "b": {"NCCL_DEBUG": "WARN"}}, ["NCCL_DEBUG"]),
    ("carried-key-missing-on-one", {"a": {"HF_HOME": "/srv/hf"}, "b": {}}, ["HF_HOME"]),
    ("carried-key-equal", {"a": {"NCCL_DEBUG": "INFO"}, "b": {"NCCL_DEBUG": "INFO"}}, []),
    ("not-carried-prefix-differs", {"a": {"MASTER_PORT": "1"}, "b": {"MASTER_PORT": "2"}}, []),
    ("empty", {}, []),
]


@pytest.mark.parametrize(
    "envs, expected", [case[1:] for case in NON_CARRY_CASES], ids=[case[0] for case in NON_CARRY_CASES]
)
def test_non_carry_over_keys(envs, expected):
    assert non_carry_over_keys(envs) == expected


def test_non_carry_over_json_is_vllm_file_content():
    text = non_carry_over_json({"a": {"VLLM_HOST_IP": "1"}, "b": {"VLLM_HOST_IP": "2", "NCCL_DEBUG": "INFO"}})
    assert text.endswith("\n")
    assert json.loads(text) == ["NCCL_DEBUG", "VLLM_HOST_IP"]


def test_carry_over_hazard_names_key_and_hosts(sparks):
    envs = _envs(sparks, gid_selection="index")
    hazards = carry_over_hazards(envs, listed=["NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES"])
    assert len(hazards) == 1
    for part in ("NCCL_IB_GID_INDEX", "spark1=3", "spark2=4", "ray_non_carry_over_env_vars.json",
                 "add it to the list"):
        assert part in hazards[0]
    assert carry_over_hazards(envs, listed=non_carry_over_keys(envs)) == []


@pytest.mark.parametrize(
    "envs, listed, expected",
    [
        ({"a": {"UCX_TLS": "rc"}, "b": {}}, [], ["UCX_TLS differs between hosts (a=rc, b=<unset>)"]),
        ({"a": {"VLLM_X": "1"}, "b": {"VLLM_X": "2"}}, [], []),
        ({"a": {"NCCL_DEBUG": "INFO"}, "b": {"NCCL_DEBUG": "INFO"}}, [], []),
        ({"a": {"NCCL_DEBUG": "INFO"}, "b": {"NCCL_DEBUG": "WARN"}}, ["NCCL_DEBUG"], []),
    ],
    ids=["unset-on-one-host", "vllm-keys-not-checked", "equal", "listed"],
)
def test_carry_over_hazards(envs, listed, expected):
    hazards = carry_over_hazards(envs, listed)
    assert len(hazards) == len(expected)
    for hazard, start in zip(hazards, expected):
        assert hazard.startswith(start), hazard


# ---------------------------------------------------------------------------
# env files
# ---------------------------------------------------------------------------


def test_env_file_sorted_key_value():
    text = env_file({"VLLM_HOST_IP": "198.18.200.12", "NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "A_NUM": 3})
    assert text == "A_NUM=3\nNCCL_SOCKET_IFNAME==enp1s0f1np1\nVLLM_HOST_IP=198.18.200.12\n"


@pytest.mark.parametrize(
    "env, substrings",
    [
        ({"NCCL_DEBUG": "INFO\nEVIL=1"}, ["NCCL_DEBUG", "newline"]),
        ({"NCCL_DEBUG": "INFO\r"}, ["NCCL_DEBUG", "newline"]),
        ({"BAD-KEY": "1"}, ["'BAD-KEY' is not a valid environment variable name", "env file"]),
    ],
    ids=["newline", "carriage-return", "bad-key"],
)
def test_env_file_refuses(env, substrings):
    with pytest.raises(FabricError) as caught:
        env_file(env)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)


# ---------------------------------------------------------------------------
# ray start
# ---------------------------------------------------------------------------

PORTS = {
    "node_manager_port": 6380,
    "object_manager_port": 6381,
    "metrics_export_port": None,
    "dashboard_port": 8265,
    "ray_client_server_port": 10001,
    "min_worker_port": 20000,
    "max_worker_port": 20100,
}

RAY_CASES = [
    # id, role, node_ip, settings, expected args
    ("head-default", "head", HEAD, RaySettings(),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6379", "--include-dashboard=false", "--block"]),
    ("worker-default", "worker", "198.18.200.13", RaySettings(),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--block"]),
    ("head-pinned-ports", "head", HEAD, RaySettings(gcs_port=6400, ports=PORTS),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6400", "--include-dashboard=false",
      "--dashboard-port", "8265", "--max-worker-port", "20100", "--min-worker-port", "20000",
      "--node-manager-port", "6380", "--object-manager-port", "6381", "--ray-client-server-port", "10001",
      "--block"]),
    ("worker-skips-head-only-ports", "worker", "198.18.200.13", RaySettings(gcs_port=6400, ports=PORTS),
     ["start", "--address", HEAD + ":6400", "--node-ip-address", "198.18.200.13",
      "--max-worker-port", "20100", "--min-worker-port", "20000",
      "--node-manager-port", "6380", "--object-manager-port", "6381", "--block"]),
    ("head-dashboard", "head", HEAD, RaySettings(include_dashboard=True, dashboard_host="0.0.0.0"),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6379", "--include-dashboard=true",
      "--dashboard-host", "0.0.0.0", "--block"]),
    ("worker-resources-extra-no-block", "worker", "198.18.200.13",
     RaySettings(num_gpus=1, num_cpus=20, extra_args=("--labels", '{"fabric":"roce"}'), block=False),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--num-gpus", "1",
      "--num-cpus", "20", "--labels", '{"fabric":"roce"}']),
    ("port-given-as-string", "worker", "198.18.200.13", RaySettings(gcs_port="6379", ports={"node_manager_port": "6380"}),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--node-manager-port", "6380",
      "--block"]),
]


@pytest.mark.parametrize(
    "role, node_ip, settings, expected", [case[1:] for case in RAY_CASES], ids=[case[0] for case in RAY_CASES]
)
def test_ray_start_args(role, node_ip, settings, expected):
    assert ray_start_args(role, node_ip, HEAD, settings) == expected


RAY_ERROR_CASES = [
    ("unknown-port-name", "worker", "198.18.200.13", RaySettings(ports={"gcs_server_port": 6379}),
     ["unknown Ray port setting 'gcs_server_port'", "known: dashboard_agent_grpc_port", "node_manager_port"]),
    ("port-zero", "worker", "198.18.200.13", RaySettings(ports={"node_manager_port": 0}),
     ["node_manager_port must be between 1 and 65535; got 0"]),
    ("port-too-high", "head", HEAD, RaySettings(ports={"dashboard_port": 70000}),
     ["dashboard_port must be between 1 and 65535; got 70000"]),
    ("port-not-a-number", "worker", "198.18.200.13", RaySettings(ports={"min_worker_port": "low"}),
     ["min_worker_port must be a TCP port number; got 'low'"]),
    ("gcs-port-out-of-range", "worker", "198.18.200.13", RaySettings(gcs_port=65536),
     ["gcs_port must be between 1 and 65535; got 65536"]),
    ("unknown-head-only-port-on-worker", "worker", "198.18.200.13", RaySettings(ports={"dashbord_port": 8265}),
     ["unknown Ray port setting 'dashbord_port'"]),
    ("bad-role", "driver", HEAD, RaySettings(), ["role must be 'head' or 'worker'; got 'driver'"]),
    ("head-ip-differs", "head", "198.18.200.13", RaySettings(),
     ["head node_ip 198.18.200.13 differs from head_ip " + HEAD]),
]


@pytest.mark.parametrize(
    "role, node_ip, settings, substrings",
    [case[1:] for case in RAY_ERROR_CASES],
    ids=[case[0] for case in RAY_ERROR_CASES],
)
def test_ray_start_args_errors(role, node_ip, settings, substrings):
    with pytest.raises(FabricError) as caught:
        ray_start_args(role, node_ip, HEAD, settings)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)
