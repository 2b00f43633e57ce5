# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_cluster: the one fact every role reads the head, ranks and Ray address from."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._cluster import ClusterError, identity, node_table

HOSTVARS = {
    "spark1": {"multinode_fabric": {"ip": "198.18.200.11", "mgmt_ip": "198.19.1.11"}},
    "spark2": {"multinode_fabric": {"ip": "198.18.200.12", "mgmt_ip": "198.19.1.12"}},
    "spark3": {"multinode_fabric": {"ip": "198.18.200.13", "mgmt_ip": "198.19.1.13"}},
}
SETTINGS = {"ray_gcs_port": 6379, "backend": "ray", "runtime": "process", "serve": True}


def test_a_worker_sees_the_head_its_rank_and_the_ray_address():
    view = identity(HOSTVARS, "spark3", ["spark1"], ["spark2", "spark3"], **SETTINGS)
    assert view == {"head": "spark1", "workers": ["spark2", "spark3"], "hosts": ["spark1", "spark2", "spark3"],
                    "role": "worker", "node_rank": 2, "head_fabric_ip": "198.18.200.11",
                    "ray_address": "198.18.200.11:6379", "backend": "ray", "runtime": "process", "serve": True}


def test_the_head_is_rank_0_even_when_also_listed_as_a_worker_and_the_port_comes_as_text():
    view = identity(HOSTVARS, "spark1", ["spark1"], ["spark1", "spark2"], **{**SETTINGS, "ray_gcs_port": "6400"})
    assert (view["role"], view["node_rank"], view["hosts"], view["ray_address"]) == \
        ("head", 0, ["spark1", "spark2"], "198.18.200.11:6400")


@pytest.mark.parametrize("heads, host, overrides, words", [
    ([], "spark1", {}, ["0 hosts", "none", "exactly one"]),
    (["spark1", "spark2"], "spark1", {}, ["2 hosts", "spark1, spark2"]),
    (["spark1"], "spark9", {}, ["spark9", "not in the head or worker group"]),
    (["spark1"], "spark2", {"backend": "mpi"}, ["vllm_backend = 'mpi'", "ray, native"]),
    (["spark1"], "spark2", {"runtime": "k8s"}, ["multinode_runtime = 'k8s'", "docker, systemd, process"]),
    (["spark1"], "spark2", {"ray_gcs_port": 70000}, ["spark1: ray_gcs_port = 70000", "1-65535"]),
    (["spark1"], "spark2", {"ray_gcs_port": True}, ["ray_gcs_port = True"]),
])
def test_bad_input_is_named_with_the_fix(heads, host, overrides, words):
    with pytest.raises(ClusterError) as caught:
        identity(HOSTVARS, host, heads, ["spark2"], **dict(SETTINGS, **overrides))
    for word in words:
        assert word in str(caught.value)


def test_a_head_without_fabric_facts_names_the_fabric_role():
    with pytest.raises(ClusterError, match="spark1: the head has no multinode_fabric fact.*multinode.vllm.fabric"):
        identity({"spark1": {}}, "spark1", ["spark1"], [], **SETTINGS)


def test_the_node_table_lists_every_host_with_its_ray_address_or_native():
    hostvars = dict(HOSTVARS, spark2=dict(HOSTVARS["spark2"], multinode_ray_node={"node_ip_address": "198.18.200.12"},
                                          vllm_gpus_per_node=2))
    rows = node_table(hostvars, ["spark1", "spark2"], native=False)
    assert rows[0].split() == ["HOST", "MGMT", "FABRIC", "RAY", "ADDRESS", "GPUS"]
    assert rows[1].split() == ["spark1", "198.19.1.11", "198.18.200.11", "-", "1"]
    assert rows[2].split() == ["spark2", "198.19.1.12", "198.18.200.12", "198.18.200.12", "2"]
    assert node_table(hostvars, ["spark2"], native=True)[1].split()[3:] == ["-", "(native)", "2"]
