# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Node environment, vLLM's non-carry-over list and env files."""

from __future__ import annotations


import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._env import (
    EnvError,
    EnvSettings,
    carry_over_hazards,
    env_file,
    node_environment,
    non_carry_over_keys,
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
    """spark1 (RoCE v2 IPv4 GID at index 3) and spark2 (at index 4), as fabric_facts selects them; the other half
    of each fabric port (roceP2p1s0f1, on 198.18.201.0/24, GID 3) is used too."""
    return {host: select_fabric(host, parse_network(layout(host)), CIDR) for host in ("spark1", "spark2")}


# The other half of the port down on both Sparks: one HCA each (NCCL_IB_HCA leaves it out, with a warning).
TWIN_DOWN = {"enP2p1s0f1np1": {"operstate": "down", "carrier": None}}


@pytest.fixture
def sparks_one_hca(layout):
    return {host: select_fabric(host, parse_network(layout(host, **TWIN_DOWN)), CIDR) for host in ("spark1", "spark2")}


def _envs(selections, **settings):
    env_settings = EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, **settings)
    return {host: node_environment(sel, env_settings) for host, sel in selections.items()}


def test_spark_environment_is_exact(sparks):
    assert _envs(sparks)["spark1"] == {
        "VLLM_HOST_IP": "198.18.200.12",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_SOCKET_IFNAME": "=enp1s0f1np1",
        # Both PCIe x4 endpoints of the cabled QSFP port, exact names (NCCL's '=' prefix), the fabric's first.
        "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1",
        "NCCL_IB_MERGE_NICS": "1",
        # Holds both halves' addresses (198.18.200.12, 198.18.201.12): NCCL picks each HCA's GID by address.
        "NCCL_IB_ADDR_RANGE": "198.18.200.0/23",
        "UCX_NET_DEVICES": "rocep1s0f1:1,roceP2p1s0f1:1",
        # Ray stops at once on SIGTERM instead of draining for 30 s (node_environment says why).
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }


def test_spark_with_one_half_down(sparks_one_hca):
    """The other half down: one HCA, no merge setting, the range is fabric_cidr; the warning names it."""
    env = _envs(sparks_one_hca)["spark1"]
    assert (env["NCCL_IB_HCA"], env["NCCL_IB_ADDR_RANGE"], env["UCX_NET_DEVICES"]) == (
        "=rocep1s0f1:1", CIDR, "rocep1s0f1:1")
    assert "NCCL_IB_MERGE_NICS" not in env
    assert list(sparks_one_hca["spark1"].warnings) == [
        "spark1: enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), is down; bring it up "
        "(`ip link set enP2p1s0f1np1 up`, and in netplan) with an address and MTU 9000 as enp1s0f1np1 has. "
        "NCCL_IB_HCA leaves roceP2p1s0f1:1 out until then, so NCCL reaches about half of the port"
    ]


def test_plain_connectx_host_one_hca(layout):
    """hgx_prefix_trap's mlx5_1 has no sibling: one exact HCA, fabric_cidr as the range, no merge setting."""
    selection = select_fabric("gpu1", parse_network(layout("hgx_prefix_trap")), CIDR)
    env = node_environment(selection, EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD))
    assert (env["NCCL_IB_HCA"], env["NCCL_IB_ADDR_RANGE"]) == ("=mlx5_1:1", CIDR)
    assert "NCCL_IB_MERGE_NICS" not in env


def test_each_node_gets_its_own_host_ip(sparks):
    envs = _envs(sparks)
    assert (envs["spark1"]["VLLM_HOST_IP"], envs["spark2"]["VLLM_HOST_IP"]) == ("198.18.200.12", "198.18.200.13")


def test_addr_range_mode_is_identical_on_every_host(sparks):
    """GID index 3 on spark1 and 4 on spark2 (3 on both other halves); NCCL_IB_ADDR_RANGE hides the difference."""
    assert (sparks["spark1"].gid_index, sparks["spark2"].gid_index) == (3, 4)
    assert [m.gid_index for m in sparks["spark2"].members] == [4, 3]
    envs = _envs(sparks, gid_selection="addr_range")
    assert envs["spark1"]["NCCL_IB_ADDR_RANGE"] == envs["spark2"]["NCCL_IB_ADDR_RANGE"] == "198.18.200.0/23"
    assert not any("NCCL_IB_GID_INDEX" in env for env in envs.values())
    differing = sorted(k for k in envs["spark1"] if envs["spark1"][k] != envs["spark2"].get(k))
    assert differing == ["VLLM_HOST_IP"]
    assert "NCCL_IB_ADDR_RANGE" not in non_carry_over_keys(envs)


def test_index_mode_differs_per_host_and_is_not_carried(sparks_one_hca):
    envs = _envs(sparks_one_hca, gid_selection="index")
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
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "VLLM_CONFIG_ROOT": "/etc/v",
    }


def test_extra_adds_and_overrides_replace(sparks):
    settings = EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, extra={"NCCL_DEBUG": "INFO", "HF_HUB_OFFLINE": 1})
    env = node_environment(sparks["spark1"], settings, overrides={"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1"})
    assert (env["NCCL_DEBUG"], env["HF_HUB_OFFLINE"]) == ("INFO", "1")
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1"


ENV_ERROR_CASES = [
    # id, settings, overrides, error, substrings
    ("extra-replaces-computed-key", {"extra": {"VLLM_HOST_IP": "198.18.200.99"}}, None, EnvError,
     ["spark1:", "extra environment sets VLLM_HOST_IP", "VLLM_HOST_IP=198.18.200.12", "per-host override"]),
    ("extra-replaces-nccl-ifname", {"extra": {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}}, None, EnvError,
     ["spark1:", "NCCL_SOCKET_IFNAME=" + "=enp1s0f1np1", "per-host override"]),
    ("extra-bad-key", {"extra": {"NCCL DEBUG": "INFO"}}, None, EnvError,
     ["spark1:", "'NCCL DEBUG' is not a valid environment variable name"]),
    ("override-bad-key", {}, {"1NCCL": "x"}, EnvError, ["spark1:", "'1NCCL' is not a valid environment variable name"]),
    ("bad-backend", {"backend": "mpi"}, None, EnvError, ["backend 'mpi'", "ray, native"]),
    ("bad-gid-selection", {"gid_selection": "auto"}, None, EnvError, ["gid_selection 'auto'", "addr_range, index"]),
    ("bad-cidr", {"fabric_cidr": "127.0.0.0/8"}, None, FabricError, ["spark1:", "127.0.0.0/8 is a loopback range"]),
]


@pytest.mark.parametrize(
    "settings, overrides, error, substrings",
    [case[1:] for case in ENV_ERROR_CASES],
    ids=[case[0] for case in ENV_ERROR_CASES],
)
def test_node_environment_errors(sparks, settings, overrides, error, substrings):
    """A bad setting of the environment is an EnvError; a bad fabric (fabric_cidr) stays a FabricError."""
    kwargs = {"fabric_cidr": CIDR, "head_fabric_ip": HEAD}
    kwargs.update(settings)
    with pytest.raises(error) as caught:
        node_environment(sparks["spark1"], EnvSettings(**kwargs), overrides=overrides)
    message = str(caught.value)
    assert all(s in message for s in substrings), message


def test_index_mode_one_value_for_every_hca(sparks):
    """spark1's halves both hold their address at GID 3: one NCCL_IB_GID_INDEX fits both."""
    env = _envs({"spark1": sparks["spark1"]}, gid_selection="index")["spark1"]
    assert (env["NCCL_IB_GID_INDEX"], env["NCCL_IB_HCA"]) == ("3", "=rocep1s0f1:1,roceP2p1s0f1:1")
    assert "NCCL_IB_ADDR_RANGE" not in env


def test_index_mode_refuses_per_hca_indexes_that_differ(sparks):
    """spark2 holds 198.18.200.13 at GID 4 of rocep1s0f1 and 198.18.201.13 at GID 3 of roceP2p1s0f1:
    NCCL_IB_GID_INDEX is one value for every HCA, so index mode cannot be right; it says so and names addr_range."""
    with pytest.raises(FabricError) as caught:
        node_environment(sparks["spark2"], EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, gid_selection="index"))
    assert str(caught.value) == (
        "spark2: gid_selection is 'index' but NCCL_IB_GID_INDEX is one value for every HCA in NCCL_IB_HCA, and the "
        "RoCE v2 GIDs differ (rocep1s0f1:1 holds 198.18.200.13 at GID 4, roceP2p1s0f1:1 holds 198.18.201.13 at "
        "GID 3); use gid_selection 'addr_range' (NCCL_IB_ADDR_RANGE: NCCL then picks each HCA's GID by address)")


def test_index_mode_without_roce_v2_gid(layout):
    net = layout("spark1", rocep1s0f1={"gids": []}, **TWIN_DOWN)
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


def test_carry_over_hazard_names_key_and_hosts(sparks_one_hca):
    envs = _envs(sparks_one_hca, gid_selection="index")
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
    with pytest.raises(EnvError) as caught:
        env_file(env)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)


def test_a_bad_setting_is_an_env_error_not_a_fabric_error(sparks):
    """Issue 18: FabricError is the fabric's; a setting of the environment refused is an EnvError."""
    with pytest.raises(EnvError) as caught:
        node_environment(sparks["spark1"], EnvSettings(fabric_cidr=CIDR, head_fabric_ip=HEAD, backend="mpi"))
    assert not isinstance(caught.value, FabricError)


# Unified memory (a DGX Spark's GB10): Ray's memory monitor off, for Ray only (_memory.py gives the sources).


def test_unified_memory_turns_ray_memory_monitor_off(sparks):
    envs = _envs(sparks, unified_memory=True)
    assert envs["spark1"]["RAY_memory_monitor_refresh_ms"] == "0"
    assert "RAY_memory_monitor_refresh_ms" not in _envs(sparks)["spark1"]
    # No Ray with the native backend: nothing to turn off.
    assert "RAY_memory_monitor_refresh_ms" not in _envs(sparks, unified_memory=True, backend="native")["spark1"]
    # Not a key vLLM carries to the workers (not listed as per-host either).
    assert "RAY_memory_monitor_refresh_ms" not in non_carry_over_keys(envs)


def test_ray_drain_on_sigterm_is_off_for_ray_only_and_extra_may_set_it(sparks):
    assert _envs(sparks)["spark2"]["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S" not in _envs(sparks, backend="native")["spark1"]
    envs = _envs(sparks, extra={"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5"})
    assert envs["spark1"]["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "5"
    assert "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S" not in non_carry_over_keys(envs)


def test_unified_memory_extra_may_set_the_monitor(sparks):
    # node_env_extra may set another refresh period (with RAY_memory_usage_threshold, say) instead of 0.
    envs = _envs(sparks, unified_memory=True,
                 extra={"RAY_memory_monitor_refresh_ms": "250", "RAY_memory_usage_threshold": "0.99"})
    assert envs["spark1"]["RAY_memory_monitor_refresh_ms"] == "250"
