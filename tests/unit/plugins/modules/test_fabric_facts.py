# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric_facts as Ansible runs it, reading a fake sysfs and `ip -j` output (fixtures/sysfs, fixtures/ip): the DGX
Spark and the plain ConnectX host, both modelled on public sources (see each fixture's provenance)."""

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.multinode.vllm.plugins.module_utils import _sysfs
from ansible_collections.multinode.vllm.plugins.modules import fabric_facts


@pytest.fixture
def run_module(monkeypatch, fixture_data, ip_runner, sysfs_tree, run_main):
    """run_module(args, sysfs_changes, host) -> (exit code, result) with a host's sysfs and ip output (spark1 or
    connectx)."""

    # AnsibleModule.warn() collects into a module-level container that outlives one run (a list before 2.19, a dict
    # on 2.19): give each test its own, so a warning of one test is not reported by the next.
    monkeypatch.setattr(ansible_warnings, "_global_warnings", type(ansible_warnings._global_warnings)())

    def run(args, sysfs_changes=None, host="spark1"):
        files = fixture_data("sysfs/%s.yml" % host)
        files.update(sysfs_changes or {})
        files = {k: v for k, v in files.items() if v != "<absent>"}
        root = sysfs_tree(files)
        ip = ip_runner(fixture_data("ip/%s-addr.json" % host), fixture_data("ip/%s-route-default.json" % host))
        monkeypatch.setattr(fabric_facts, "read_network", lambda: _sysfs.read_network(root, ip=ip))
        return run_main(fabric_facts.main, args)

    return run


def test_facts_of_the_spark(run_module):
    code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "spark1"})
    assert code == 0
    assert result["changed"] is False
    fabric = result["ansible_facts"]["multinode_fabric"]
    assert (fabric["interface"], fabric["ip"], fabric["mtu"], fabric["hca_ports"], fabric["gid_index"]) == (
        "enp1s0f1np1", "198.18.200.12", 9000, ["rocep1s0f1:1", "roceP2p1s0f1:1"], 3)
    assert (fabric["mgmt_interface"], fabric["mgmt_ip"], fabric["link_error"]) == ("enP7s7", "192.168.1.21", None)
    raw = result["ansible_facts"]["multinode_network"]
    assert len(raw["interfaces"]) == 7 and len(raw["rdma"]) == 4
    assert not result.get("warnings")
    # Both halves of the cabled port, each with state, speed, MTU, address and the GID index holding it.
    assert [(m["netdev"], m["hca"], m["rdma_state"], m["speed"], m["mtu"], m["ip"], m["gid_index"], m["used"])
            for m in fabric["fabric_port"]] == [
        ("enp1s0f1np1", "rocep1s0f1", "4: ACTIVE", 200000, 9000, "198.18.200.12", 3, True),
        ("enP2p1s0f1np1", "roceP2p1s0f1", "4: ACTIVE", 200000, 9000, "198.18.201.12", 3, True),
    ]
    assert fabric["addr_range"] == "198.18.200.0/23"


def test_facts_of_the_plain_connectx_host(run_module):
    """One HCA per port: mlx5_0 (port 0, no cable) shares the adapter's GUID but is another port."""
    code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "gpu1"}, host="connectx")
    assert code == 0
    fabric = result["ansible_facts"]["multinode_fabric"]
    assert (fabric["interface"], fabric["ip"], fabric["hca_ports"], fabric["gid_index"], fabric["addr_range"]) == (
        "ens1f1np1", "198.18.200.21", ["mlx5_1:1"], 3, "198.18.200.0/24")
    assert [(m["netdev"], m["role"], m["pci_slot"], m["phys_port_name"]) for m in fabric["fabric_port"]] == [
        ("ens1f1np1", "fabric", "0000:17:00.1", "p1")]
    assert (fabric["mgmt_interface"], fabric["mgmt_ip"]) == ("eno1", "10.20.0.21")
    assert not result.get("warnings")


def _warnings(result):
    # ansible-core 2.19 wraps module warnings as {"event": {"msg": ...}}; older cores send the string.
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def test_spark_other_half_at_mtu_1500_is_a_warning_naming_it(run_module):
    code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "spark1"},
                              {"class/net/enP2p1s0f1np1/mtu": "1500"})
    assert code == 0
    fabric = result["ansible_facts"]["multinode_fabric"]
    assert fabric["hca_ports"] == ["rocep1s0f1:1"]
    assert _warnings(result) == [
        "spark1: enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), has MTU 1500 while "
        "enp1s0f1np1 has 9000; set the same MTU on both halves (`ip link set dev enP2p1s0f1np1 mtu 9000`, and in "
        "netplan). NCCL_IB_HCA leaves roceP2p1s0f1:1 out until then, so NCCL reaches about half of the port"]


def test_docs_show_the_spark_fixture_output(run_module):
    """docs/fabric.md shows multinode_fabric for the Spark fixture: it is this module's output, not a sketch."""
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "fabric.md")
    if not os.path.exists(doc):
        pytest.skip("docs/ is not part of this copy of the collection")
    with open(doc) as handle:
        text = handle.read()
    shown = text.split("<!-- spark1 fabric_facts: begin -->", 1)[1].split("<!-- spark1 fabric_facts: end -->", 1)[0]
    shown = shown.strip().removeprefix("```json").removesuffix("```")
    _code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "spark1"})
    assert json.loads(shown) == result["ansible_facts"]["multinode_fabric"]


def test_down_rdma_port_is_a_warning(run_module):
    code, result = run_module(
        {"fabric_cidr": "198.18.200.0/24", "host": "spark1"},
        {"class/infiniband/rocep1s0f1/ports/1/state": "1: DOWN"},
    )
    assert code == 0
    assert _warnings(result) == ["spark1: RDMA port rocep1s0f1:1 of enp1s0f1np1 is 1: DOWN, not ACTIVE"]


def test_failure_names_host_value_and_fix_and_returns_raw_data(run_module):
    code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "spark1", "fabric_ip": "198.18.200.99"})
    assert code == 1
    assert result["failed"] is True
    assert result["msg"].startswith("spark1: no interface carries fabric_ip 198.18.200.99")
    assert "fix host_vars/spark1.yml" in result["msg"]
    assert [i["name"] for i in result["multinode_network"]["interfaces"]][:2] == ["enP2p1s0f0np0", "enP2p1s0f1np1"]


@pytest.mark.parametrize(
    "allow, expected_code",
    [(False, 1), (True, 0)],
    ids=["down-link-fails", "down-link-allowed"],
)
def test_down_link(run_module, allow, expected_code):
    down = {"class/net/enp1s0f1np1/operstate": "down", "class/net/enp1s0f1np1/carrier": "<absent>"}
    code, result = run_module({"fabric_cidr": "198.18.200.0/24", "host": "spark1", "allow_link_down": allow}, down)
    message = "spark1: fabric interface enp1s0f1np1 (198.18.200.12) is down; check the cable and run " \
              "`ip link set enp1s0f1np1 up`"
    assert code == expected_code
    if allow:
        assert result["ansible_facts"]["multinode_fabric"]["link_error"] == message
    else:
        assert result["msg"] == message


def test_ip_failure_is_reported_with_host(monkeypatch, run_main):
    def broken():
        raise OSError(2, "No such file or directory: 'ip'")

    monkeypatch.setattr(fabric_facts, "read_network", broken)
    _code, result = run_main(fabric_facts.main, {"fabric_cidr": "198.18.200.0/24", "host": "spark1"})
    assert result["failed"] is True
    assert result["msg"].startswith("spark1: could not read interfaces with `ip -j`:")
