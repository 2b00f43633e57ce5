# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters, called as Jinja calls them: plain dicts for hostvars and facts."""

from __future__ import annotations

import importlib

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._fabric_cluster_errors import fabric_cluster_errors
from ansible_collections.multinode.vllm.plugins.filter.fabric_node_env import fabric_node_env
from ansible_collections.multinode.vllm.plugins.filter._fabric_peers import fabric_peers
from ansible_collections.multinode.vllm.plugins.filter._fabric_probe_report import fabric_probe_report
from ansible_collections.multinode.vllm.plugins.filter.ray_start_args import ray_start_args
from ansible_collections.multinode.vllm.plugins.filter._vllm_non_carry_over import vllm_non_carry_over
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import parse_network, select_fabric

CIDR = "198.18.200.0/24"
HOSTS = ["spark1", "spark2"]


@pytest.fixture
def facts(layout):
    """host -> multinode_fabric fact, as fabric_facts sets it, for spark1 and spark2."""

    def build(**changes_by_host):
        return {
            host: select_fabric(host, parse_network(layout(host, **changes_by_host.get(host, {}))), CIDR,
                                allow_link_down=True).as_dict()
            for host in HOSTS
        }

    return build


@pytest.fixture
def hostvars(facts):
    """Plain-dict hostvars: inventory fabric_ip plus the fabric fact of each Spark."""

    def build(fabric_ips=None, with_facts=True, **changes_by_host):
        fabric = facts(**changes_by_host)
        ips = fabric_ips if fabric_ips is not None else {"spark1": "198.18.200.12", "spark2": "198.18.200.13"}
        result = {}
        for host in HOSTS:
            result[host] = {"inventory_hostname": host}
            if ips.get(host):
                result[host]["fabric_ip"] = ips[host]
            if with_facts:
                result[host]["multinode_fabric"] = fabric[host]
        return result

    return build


@pytest.mark.parametrize(
    "name",
    ["fabric_cluster_errors", "fabric_node_env", "fabric_peers", "fabric_probe_report", "ray_start_args",
     "vllm_non_carry_over", "distributed_preflight_reuse"],
)
def test_filter_plugin_exports_its_function(name):
    module = _filter_module(name)
    assert module.FilterModule().filters() == {module.__name__.rsplit(".", 1)[1]: getattr(module, name)}


def _filter_module(name):
    """The plugin file of the function ``name``: ``name.py`` when public, ``_name.py`` when internal (its filter is
    then ``_name``, as community.sops names its internal filters)."""
    package = "ansible_collections.multinode.vllm.plugins.filter."
    try:
        return importlib.import_module(package + "_" + name)
    except ImportError:
        return importlib.import_module(package + name)


# ---------------------------------------------------------------------------
# fabric_cluster_errors
# ---------------------------------------------------------------------------

CLUSTER_CASES = [
    # id, hostvars kwargs, use_facts, expected substrings per error
    ("consistent-inventory", {"with_facts": False}, False, []),
    ("consistent-facts", {}, True, []),
    ("inventory-duplicate-ip", {"with_facts": False, "fabric_ips": {"spark1": "198.18.200.12", "spark2": "198.18.200.12"}},
     False, [["spark1 and spark2 both have fabric_ip 198.18.200.12"]]),
    ("inventory-only-ignores-facts", {"spark2": {"enp1s0f1np1": {"mtu": 1500}}}, False, []),
    ("facts-mtu-mismatch", {"spark2": {"enp1s0f1np1": {"mtu": 1500}}}, True,
     [["spark1 enp1s0f1np1=9000", "spark2 enp1s0f1np1=1500", "set the same MTU"]]),
    ("facts-inventory-ip-not-carried", {"fabric_ips": {"spark1": "198.18.200.12", "spark2": "198.18.200.99"}}, True,
     [["spark2: inventory fabric_ip is 198.18.200.99 but the host carries 198.18.200.13", "host_vars/spark2.yml"]]),
    ("facts-missing", {"with_facts": False}, True,
     [["no fabric facts for spark1, spark2", "run multinode.vllm.fabric_facts on every host first"]]),
]


@pytest.mark.parametrize(
    "hv_kwargs, use_facts, expected", [c[1:] for c in CLUSTER_CASES], ids=[c[0] for c in CLUSTER_CASES]
)
def test_fabric_cluster_errors(hostvars, hv_kwargs, use_facts, expected):
    errors = fabric_cluster_errors(hostvars(**hv_kwargs), HOSTS, ["spark1"], CIDR, use_facts=use_facts)
    assert len(errors) == len(expected), errors
    for error, substrings in zip(errors, expected):
        assert all(s in error for s in substrings), error


@pytest.mark.parametrize(
    "changes, expected_mtu, expected",
    [
        ({}, None, []),
        ({}, 9000, []),
        ({"spark2": {"enP2p1s0f1np1": {"mtu": 1500}}}, None, []),
        ({"spark2": {"enP2p1s0f1np1": {"mtu": 1500}}}, "9000", [
            "spark2: enP2p1s0f1np1 (the other half of fabric interface enp1s0f1np1's port) has MTU 1500, expected "
            "9000 (fabric_expected_mtu)"]),
    ],
    ids=["off", "all-9000", "off-ignores-1500", "other-half-1500"],
)
def test_fabric_cluster_errors_expected_mtu(hostvars, changes, expected_mtu, expected):
    """fabric_expected_mtu reaches check_cluster through the filter, from the facts fabric_facts set."""
    errors = fabric_cluster_errors(hostvars(**changes), HOSTS, ["spark1"], CIDR, expected_mtu=expected_mtu)
    assert len(errors) == len(expected), errors
    for error, start in zip(errors, expected):
        assert error.startswith(start), error


def test_fabric_cluster_errors_heads(hostvars):
    assert fabric_cluster_errors(hostvars(), HOSTS, [], CIDR) == [
        "no host in group ray_head; put exactly one host (the head node) in group ray_head in the inventory"]


def test_fabric_cluster_errors_malformed_fact(hostvars):
    hv = hostvars()
    del hv["spark2"]["multinode_fabric"]["ip"]
    with pytest.raises(AnsibleFilterError) as caught:
        fabric_cluster_errors(hv, HOSTS, ["spark1"], CIDR)
    assert str(caught.value).startswith("spark2: fabric facts are incomplete or malformed ('ip')")


# ---------------------------------------------------------------------------
# fabric_probe_report
# ---------------------------------------------------------------------------


def _peer_result(host, ip, ok=True):
    return {
        "host": host, "fabric_ip": ip,
        "route": {"dev": "enp1s0f1np1", "src": "x", "ok": True, "error": None},
        "tcp": {"ok": ok, "error": None if ok else "timed out after 2 s", "connect_ms": 0.1, "rtt_ms": 0.05,
                "answered_by": host if ok else None},
        "mtu": {"ok": ok, "mtu": 9000, "payload": 8972, "error": None if ok else "skipped: TCP failed"},
        "mgmt": {"address": None, "reachable": None, "detail": "peer management address unknown"},
    }


def test_fabric_probe_report_all_pairs(hostvars):
    hv = hostvars()
    hv["spark1"]["probe"] = {"changed": False, "peers": [_peer_result("spark2", "198.18.200.13")], "problems": []}
    hv["spark2"]["probe"] = {"changed": False, "peers": [_peer_result("spark1", "198.18.200.12", ok=False)]}
    report = fabric_probe_report(hv, HOSTS, "probe")
    assert report["ok"] is False
    assert report["broken"] == ["spark2 -> spark1 (198.18.200.12): timed out after 2 s"]
    assert [(p["src"], p["dst"], p["ok"]) for p in report["pairs"]] == [("spark1", "spark2", True),
                                                                        ("spark2", "spark1", False)]


def test_fabric_probe_report_default_var_and_missing_host(hostvars):
    hv = hostvars()
    hv["spark1"]["__fabric_probe"] = {"peers": [_peer_result("spark2", "198.18.200.13")]}
    report = fabric_probe_report(hv, HOSTS)
    assert report["broken"] == ["spark2 -> spark1: not probed (no probe result)"]


def test_fabric_probe_report_names_the_down_link_first(hostvars):
    hv = hostvars(spark2={"enp1s0f1np1": {"operstate": "down", "carrier": None}})
    hv["spark1"]["probe"] = {"peers": [_peer_result("spark2", "198.18.200.13", ok=False)]}
    hv["spark2"]["probe"] = {"peers": [_peer_result("spark1", "198.18.200.12", ok=False)]}
    report = fabric_probe_report(hv, HOSTS, "probe")
    assert report["broken"] == [
        "spark2: fabric interface enp1s0f1np1 (198.18.200.13) is down; check the cable and run "
        "`ip link set enp1s0f1np1 up`",
        "spark1 -> spark2 (198.18.200.13): timed out after 2 s",
        "spark2 -> spark1 (198.18.200.12): timed out after 2 s",
    ]


# ---------------------------------------------------------------------------
# fabric_node_env, vllm_non_carry_over, fabric_peers
# ---------------------------------------------------------------------------


def test_fabric_node_env_unified_memory(facts):
    # From Jinja the fact's bool may come as a string.
    for unified in (True, "true", "True"):
        env = fabric_node_env(facts()["spark2"], CIDR, "198.18.200.12", unified_memory=unified)
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
    for unified in (False, "false", None):
        env = fabric_node_env(facts()["spark2"], CIDR, "198.18.200.12", unified_memory=unified)
        assert "RAY_memory_monitor_refresh_ms" not in env


def test_fabric_node_env_from_facts(facts):
    env = fabric_node_env(facts()["spark2"], CIDR, "198.18.200.12", backend="native",
                          vllm_config_root="/etc/multinode-vllm/vllm", extra={"NCCL_DEBUG": "WARN"})
    assert env == {
        "VLLM_HOST_IP": "198.18.200.13",
        "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
        "TP_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_SOCKET_IFNAME": "=enp1s0f1np1",
        "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1",
        "NCCL_IB_MERGE_NICS": "1",
        "NCCL_IB_ADDR_RANGE": "198.18.200.0/23",
        "UCX_NET_DEVICES": "rocep1s0f1:1,roceP2p1s0f1:1",
        "MASTER_ADDR": "198.18.200.12",
        "MASTER_PORT": "29500",
        "VLLM_CONFIG_ROOT": "/etc/multinode-vllm/vllm",
        "NCCL_DEBUG": "WARN",
    }


@pytest.mark.parametrize(
    "fact_change, kwargs, substrings",
    [
        (None, {"extra": {"NCCL_IB_HCA": "mlx5_1"}},
         ["spark1: extra environment sets NCCL_IB_HCA", "NCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1",
          "per-host override"]),
        (None, {"gid_selection": "gid"}, ["gid_selection 'gid' is not one of addr_range, index"]),
        # Facts gathered before the port's endpoints were (no fabric_port): the fabric interface's own GID.
        ({"gid_index": None, "fabric_port": []}, {"gid_selection": "index"},
         ["spark1: gid_selection is 'index' but no RoCE v2 GID on rocep1s0f1:1 carries 198.18.200.12"]),
        ("198.18.200.12", {}, ["fabric facts are incomplete or malformed", "'198.18.200.12'"]),
    ],
    ids=["extra-replaces-computed", "bad-gid-selection", "index-without-gid", "ip-instead-of-fact"],
)
def test_fabric_node_env_errors(facts, fact_change, kwargs, substrings):
    fact = facts()["spark1"]
    if isinstance(fact_change, dict):
        fact.update(fact_change)
    elif fact_change is not None:
        fact = fact_change
    with pytest.raises(AnsibleFilterError) as caught:
        fabric_node_env(fact, CIDR, "198.18.200.12", **kwargs)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)


@pytest.mark.parametrize(
    "gid_selection, expected",
    [
        ("addr_range", ["GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                        "UCX_NET_DEVICES", "VLLM_HOST_IP"]),
        ("index", ["GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
                   "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "VLLM_HOST_IP"]),
    ],
)
def test_vllm_non_carry_over(facts, gid_selection, expected):
    # The other half of each port down: one HCA per host, so index mode has one GID index per host (3 and 4).
    twin_down = {"enP2p1s0f1np1": {"operstate": "down", "carrier": None}}
    fabric = facts(spark1=twin_down, spark2=twin_down)
    envs = {host: fabric_node_env(fabric[host], CIDR, "198.18.200.12", gid_selection=gid_selection)
            for host in HOSTS}
    # The credentials are never carried to Ray workers (vLLM copies VLLM_API_KEY and HF_* by default).
    assert vllm_non_carry_over(envs) == sorted(expected + ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY"])
    assert "MY_SECRET" in vllm_non_carry_over(envs, secret_keys=["MY_SECRET"])


def test_fabric_peers(hostvars):
    assert fabric_peers(hostvars(), HOSTS, "spark2") == [
        {"host": "spark1", "fabric_ip": "198.18.200.12", "mgmt_ip": "192.168.1.21"}]


def test_fabric_peers_without_facts(hostvars):
    hv = hostvars()
    del hv["spark2"]["multinode_fabric"]
    with pytest.raises(AnsibleFilterError) as caught:
        fabric_peers(hv, HOSTS, "spark1")
    assert str(caught.value) == "spark2 has no fabric facts; run multinode.vllm.fabric_facts on it first"


@pytest.mark.parametrize(
    "module, call, substring",
    [
        ("node_env_file", lambda f: f({"BAD-KEY": "1"}), "'BAD-KEY' is not a valid environment variable name"),
        ("node_runtime", lambda f: f({"A": "1"}, "k8s", "ray", "ray", [], "/e"), "runtime 'k8s' is not one of"),
    ],
    ids=["node_env_file", "node_runtime"],
)
def test_render_filters_raise_a_filter_error(module, call, substring):
    """Each filter turns its module_utils' error (EnvError, RuntimeConfigError) into AnsibleFilterError."""
    plugin = _filter_module(module)
    with pytest.raises(AnsibleFilterError, match=substring):
        call(getattr(plugin, module))


# ---------------------------------------------------------------------------
# ray_start_args
# ---------------------------------------------------------------------------


def test_ray_start_args_worker():
    assert ray_start_args("198.18.200.13", "worker", "198.18.200.12",
                          ports={"node_manager_port": 6380, "dashboard_port": 8265}) == [
        "start", "--address", "198.18.200.12:6379", "--node-ip-address", "198.18.200.13",
        "--node-manager-port", "6380", "--block"]


def test_ray_start_args_head():
    assert ray_start_args("198.18.200.12", "head", "198.18.200.12", gcs_port=6400, num_gpus=1, block=False) == [
        "start", "--head", "--node-ip-address", "198.18.200.12", "--port", "6400", "--include-dashboard=false",
        "--num-gpus", "1"]


@pytest.mark.parametrize(
    "kwargs, substring",
    [
        ({"ports": {"gcs_port": 6379}}, "unknown Ray port setting 'gcs_port'"),
        ({"ports": {"max_worker_port": 99999}}, "max_worker_port must be between 1 and 65535; got 99999"),
        ({"gcs_port": "redis"}, "gcs_port must be a TCP port number; got 'redis'"),
    ],
    ids=["unknown-port", "port-out-of-range", "gcs-port-not-a-number"],
)
def test_ray_start_args_errors(kwargs, substring):
    with pytest.raises(AnsibleFilterError) as caught:
        ray_start_args("198.18.200.13", "worker", "198.18.200.12", **kwargs)
    assert substring in str(caught.value)


def test_distributed_preflight_reuse_decides_from_every_host():
    from ansible_collections.multinode.vllm.plugins.filter._distributed_preflight_reuse import (
        distributed_preflight_reuse,
    )
    from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import cluster_fingerprint

    fps = {"spark1": "1" * 64, "spark2": "2" * 64}
    proof = {"cluster_fingerprint": cluster_fingerprint(fps), "age_s": 5.0}
    hv = {h: {"__distributed_preflight_fingerprint": {"fingerprint": fp, "proof": proof}} for h, fp in fps.items()}
    out = distributed_preflight_reuse(hv, ["spark1", "spark2"])
    assert out == {"reusable": True, "cluster_fingerprint": cluster_fingerprint(fps),
                   "reason": "nothing the rendezvous depends on changed since the last pass on all 2 nodes"}
    hv["spark2"]["__distributed_preflight_fingerprint"]["proof"] = None
    assert not distributed_preflight_reuse(hv, ["spark1", "spark2"])["reusable"]
    with pytest.raises(AnsibleFilterError, match="spark3: no fingerprint registered"):
        distributed_preflight_reuse(dict(hv, spark3={}), ["spark1", "spark2", "spark3"])


def test_distributed_preflight_report_judges_the_busbw_floor_with_each_host_s_fabric():
    from ansible_collections.multinode.vllm.plugins.filter._distributed_preflight_report import (
        distributed_preflight_report,
    )

    def rank(host, rank_no):
        return {"host": host, "rank": rank_no, "world_size": 2, "ok": True, "phase": "done", "backend": "gloo",
                "backends": ["gloo"], "bandwidth": {"bytes": 64 << 20, "dtype": "float32", "iterations": 5,
                                                    "seconds_per_op": 0.2, "algbw_GBps": 0.3355, "busbw_GBps": 0.3355}}

    hv = {h: {"__distributed_preflight": {"result": rank(h, i), "env": {}, "non_carry_over": [], "elapsed": 9.0},
              "multinode_fabric": {"interface": "enp1s0f1np1", "mtu": 1500}}
          for i, h in enumerate(HOSTS)}
    assert distributed_preflight_report(hv, HOSTS, "spark1")["ok"] is True
    assert distributed_preflight_report(hv, HOSTS, "spark1", min_busbw_gbps=0)["ok"] is True
    report = distributed_preflight_report(hv, HOSTS, "spark1", min_busbw_gbps=15, size_mib=64)
    (problem,) = report["problems"]
    assert problem.startswith("all-reduce busbw 0.34 GB/s (spark1, the slowest rank: 64.0 MiB float32 over 2 ranks) "
                              "is below distributed_preflight_min_busbw_gbps 15 GB/s.")
    assert "2. MTU 1500: spark1: enp1s0f1np1 MTU 1500; spark2: enp1s0f1np1 MTU 1500;" in problem
