# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric_facts as Ansible runs it, reading the recorded DGX Spark (fake sysfs + recorded `ip -j`)."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _sysfs
from ansible_collections.multinode.vllm.plugins.modules import fabric_facts


@pytest.fixture
def run_module(monkeypatch, fixture_data, ip_runner, sysfs_tree, run_main):
    """run_module(args, sysfs_changes) -> (exit code, result) with the Spark's sysfs and ip output."""

    def run(args, sysfs_changes=None):
        files = fixture_data("sysfs/spark1.yml")
        files.update(sysfs_changes or {})
        files = {k: v for k, v in files.items() if v != "<absent>"}
        root = sysfs_tree(files)
        ip = ip_runner(fixture_data("ip/spark1-addr.json"), fixture_data("ip/spark1-route-default.json"))
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


def test_down_rdma_port_is_a_warning(run_module):
    code, result = run_module(
        {"fabric_cidr": "198.18.200.0/24", "host": "spark1"},
        {"class/infiniband/rocep1s0f1/ports/1/state": "1: DOWN"},
    )
    assert code == 0
    # ansible-core 2.19 wraps module warnings as {"event": {"msg": ...}}; older cores send the string.
    warnings = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]
    assert warnings == ["spark1: RDMA port rocep1s0f1:1 of enp1s0f1np1 is 1: DOWN, not ACTIVE"]


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
