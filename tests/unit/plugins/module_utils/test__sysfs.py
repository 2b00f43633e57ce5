# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading a host: a fake sysfs tree (fixtures/sysfs) and recorded `ip -j` output (fixtures/ip)."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    parse_network,
    select_fabric,
)
from ansible_collections.multinode.vllm.plugins.module_utils._sysfs import read_interfaces, read_network, read_rdma

CIDR = "198.18.200.0/24"


@pytest.fixture
def spark1(fixture_data, ip_runner):
    """(sysfs files, ip runner) of the recorded DGX Spark."""
    files = fixture_data("sysfs/spark1.yml")
    runner = ip_runner(fixture_data("ip/spark1-addr.json"), fixture_data("ip/spark1-route-default.json"))
    return files, runner


def _by_name(entries, key="name"):
    return {e[key]: e for e in entries}


def test_spark_interfaces(spark1, sysfs_tree):
    files, ip = spark1
    interfaces = read_interfaces(sysfs_tree(files), ip=ip)
    assert ip.calls == [["-4", "addr", "show"], ["-4", "route", "show", "default"]]
    by_name = _by_name(interfaces)
    assert sorted(by_name) == sorted(
        ["lo", "enP7s7", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1", "wlP9s9"]
    )
    assert by_name["enP7s7"] == {
        "name": "enP7s7", "addresses": ["192.168.1.21/24"], "mtu": 1500, "operstate": "up", "carrier": True,
        "speed": 10000, "default_route": True, "pci_slot": None, "phys_port_name": None,
    }
    assert by_name["enp1s0f1np1"] == {
        "name": "enp1s0f1np1", "addresses": ["198.18.200.12/24"], "mtu": 9000, "operstate": "up", "carrier": True,
        "speed": 200000, "default_route": False, "pci_slot": "0000:01:00.1", "phys_port_name": "p1",
    }
    # A down link: carrier and speed unreadable, no IPv4 in `ip -4` (an empty {} entry).
    assert by_name["enp1s0f0np0"] == {
        "name": "enp1s0f0np0", "addresses": [], "mtu": 1500, "operstate": "down", "carrier": None,
        "speed": None, "default_route": False, "pci_slot": "0000:01:00.0", "phys_port_name": "p0",
    }
    # The other half of the fabric port: another PCI domain, the same bus, device, function and port name.
    assert (by_name["enP2p1s0f1np1"]["pci_slot"], by_name["enP2p1s0f1np1"]["phys_port_name"]) == (
        "0002:01:00.1", "p1")


def test_spark_rdma(spark1, sysfs_tree):
    files, _runner = spark1
    ports = _by_name(read_rdma(sysfs_tree(files)), key="hca")
    assert sorted(ports) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    fabric = ports["rocep1s0f1"]
    assert {k: fabric[k] for k in ("port", "state", "link_layer", "netdev")} == {
        "port": 1, "state": "4: ACTIVE", "link_layer": "Ethernet", "netdev": "enp1s0f1np1"}
    # Zero slots (4 and 10) are skipped; the rest keep index, type and netdev.
    assert fabric["gids"] == [
        {"index": 0, "gid": "fe80:0000:0000:0000:4ebb:47ff:fe2c:1a0b", "type": "IB/RoCE v1", "netdev": "enp1s0f1np1"},
        {"index": 1, "gid": "fe80:0000:0000:0000:4ebb:47ff:fe2c:1a0b", "type": "RoCE v2", "netdev": "enp1s0f1np1"},
        {"index": 2, "gid": "0000:0000:0000:0000:0000:ffff:c612:c80c", "type": "IB/RoCE v1", "netdev": "enp1s0f1np1"},
        {"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:c80c", "type": "RoCE v2", "netdev": "enp1s0f1np1"},
    ]
    assert (ports["rocep1s0f0"]["state"], ports["rocep1s0f0"]["netdev"]) == ("1: DOWN", "enp1s0f0np0")
    assert {p["sys_image_guid"] for p in ports.values()} == {"4cbb:4703:002c:1a0a"}


def test_read_then_select_matches_the_recorded_layout(spark1, sysfs_tree, layout):
    """What fabric_facts reads from the Spark fixture selects exactly what networks.yml's spark1 selects."""
    files, ip = spark1
    read = select_fabric("spark1", parse_network(read_network(sysfs_tree(files), ip=ip)), CIDR)
    written = select_fabric("spark1", parse_network(layout("spark1")), CIDR)
    assert read.as_dict() == written.as_dict()
    assert (read.interface, read.ip, read.mtu, read.hca_ports, read.gid_index, read.mgmt_interface) == (
        "enp1s0f1np1", "198.18.200.12", 9000, ("rocep1s0f1:1", "roceP2p1s0f1:1"), 3, "enP7s7")


LINK_CASES = [
    # id, sysfs changes (None removes the file), operstate in `ip -j`, expected substrings
    ("down-no-carrier-file", {"operstate": "down", "carrier": None, "speed": None}, "DOWN",
     ["spark1:", "enp1s0f1np1 (198.18.200.12) is down", "ip link set enp1s0f1np1 up"]),
    ("up-without-carrier", {"carrier": "0"}, "UP",
     ["spark1:", "enp1s0f1np1 (198.18.200.12) is up without carrier", "check the cable"]),
    ("lowerlayerdown", {"operstate": "lowerlayerdown", "carrier": None}, "LOWERLAYERDOWN",
     ["spark1:", "is lowerlayerdown"]),
]


@pytest.mark.parametrize(
    "changes, ip_state, substrings", [case[1:] for case in LINK_CASES], ids=[case[0] for case in LINK_CASES]
)
def test_fabric_link_problems_end_to_end(fixture_data, ip_runner, sysfs_tree, changes, ip_state, substrings):
    files = fixture_data("sysfs/spark1.yml")
    for name, value in changes.items():
        path = "class/net/enp1s0f1np1/" + name
        if value is None:
            files.pop(path, None)
        else:
            files[path] = value
    addr = fixture_data("ip/spark1-addr.json")
    for entry in addr:
        if entry.get("ifname") == "enp1s0f1np1":
            entry["operstate"] = ip_state
    ip = ip_runner(addr, fixture_data("ip/spark1-route-default.json"))
    network = parse_network(read_network(sysfs_tree(files), ip=ip))
    with pytest.raises(FabricError) as caught:
        select_fabric("spark1", network, CIDR)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)


def test_no_sysfs_falls_back_to_ip(fixture_data, ip_runner, tmp_path):
    """Without /sys/class/net (a container), MTU and state come from `ip -j`, lower-cased."""
    ip = ip_runner(fixture_data("ip/spark1-addr.json"), [])
    by_name = _by_name(read_interfaces(str(tmp_path / "nosys"), ip=ip))
    assert sorted(by_name) == ["enP2p1s0f1np1", "enP7s7", "enp1s0f1np1", "lo"]
    assert by_name["enp1s0f1np1"] == {
        "name": "enp1s0f1np1", "addresses": ["198.18.200.12/24"], "mtu": 9000, "operstate": "up", "carrier": None,
        "speed": None, "default_route": False, "pci_slot": None, "phys_port_name": None,
    }
    assert not any(e["default_route"] for e in by_name.values())
    assert read_rdma(str(tmp_path / "nosys")) == []


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"class/net/eth1/speed": "-1", "class/net/eth1/carrier": "junk"}, {"speed": None, "carrier": None}),
        ({"class/net/eth1/speed": "25000", "class/net/eth1/carrier": "1"}, {"speed": 25000, "carrier": True}),
        ({"class/net/eth1/mtu": "", "class/net/eth1/carrier": "0"}, {"mtu": None, "carrier": False}),
    ],
    ids=["unknown-speed-and-garbage", "readable", "empty-mtu"],
)
def test_odd_sysfs_values(sysfs_tree, ip_runner, files, expected):
    entry = read_interfaces(sysfs_tree(files), ip=ip_runner([], []))[0]
    assert {key: entry[key] for key in expected} == expected


def test_several_default_routes(sysfs_tree, ip_runner):
    routes = [
        {"dst": "default", "gateway": "192.168.1.1", "dev": "enP7s7", "metric": 100},
        {"dst": "default", "gateway": "198.18.200.1", "dev": "enp1s0f1np1", "metric": 600},
    ]
    tree = sysfs_tree({"class/net/enP7s7/mtu": "1500", "class/net/enp1s0f1np1/mtu": "9000", "class/net/lo/mtu": "1"})
    flags = {e["name"]: e["default_route"] for e in read_interfaces(tree, ip=ip_runner([], routes))}
    assert flags == {"enP7s7": True, "enp1s0f1np1": True, "lo": False}


def _hca(hca, netdev, gids=(), device_nets=None, link_layer="Ethernet"):
    """sysfs files of one single-port HCA; gids are (index, gid, type) on ``netdev``."""
    base = "class/infiniband/%s/" % hca
    files = {base + "ports/1/state": "4: ACTIVE", base + "ports/1/link_layer": link_layer}
    for net in device_nets if device_nets is not None else [netdev]:
        files[base + "device/net/" + net] = None
    for index, gid, kind in gids:
        files[base + "ports/1/gids/%d" % index] = gid
        files[base + "ports/1/gid_attrs/types/%d" % index] = kind
        files[base + "ports/1/gid_attrs/ndevs/%d" % index] = netdev
    return files


def test_hca_prefix_trap_end_to_end(sysfs_tree, ip_runner):
    """mlx5_1 and mlx5_10..mlx5_17: only mlx5_1:1 maps to the fabric netdev."""
    v2 = "0000:0000:0000:0000:0000:ffff:c612:c815"
    files = {"class/net/ens1f1np1/operstate": "up", "class/net/ens1f1np1/carrier": "1",
             "class/net/ens1f1np1/mtu": "9000"}
    files.update(_hca("mlx5_1", "ens1f1np1", [(0, "fe80:0000:0000:0000:a288:c2ff:fe11:2201", "IB/RoCE v1"),
                                              (3, v2, "RoCE v2")]))
    for n in range(10, 18):
        files.update(_hca("mlx5_%d" % n, "ibs%d" % n, link_layer="InfiniBand"))
    addr = [{"ifname": "ens1f1np1", "mtu": 9000, "operstate": "UP",
             "addr_info": [{"family": "inet", "local": "198.18.200.21", "prefixlen": 24}]}]
    raw = read_network(sysfs_tree(files), ip=ip_runner(addr, []))
    assert [p["hca"] for p in raw["rdma"]] == ["mlx5_1"] + ["mlx5_%d" % n for n in range(10, 18)]
    selection = select_fabric("gpu1", parse_network(raw), CIDR)
    assert (selection.hca_ports, selection.gid_index) == (("mlx5_1:1",), 3)


@pytest.mark.parametrize(
    "files, expected_netdev",
    [
        (_hca("mlx5_0", "eth2", device_nets=["eth2"]), "eth2"),
        (_hca("mlx5_0", "eth2", device_nets=["eth2", "eth3"]), None),
        (_hca("mlx5_0", "eth2", gids=[(1, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")],
              device_nets=["eth2", "eth3"]), "eth2"),
        (_hca("mlx5_0", "eth2", device_nets=[]), None),
    ],
    ids=["no-gids-one-device-netdev", "no-gids-ambiguous", "gid-netdev-wins", "nothing-known"],
)
def test_rdma_netdev_resolution(sysfs_tree, files, expected_netdev):
    assert read_rdma(sysfs_tree(files))[0]["netdev"] == expected_netdev


def test_gid_slots_sort_numerically(sysfs_tree):
    files = _hca("mlx5_0", "eth2", gids=[(10, "fe80:0000:0000:0000:0000:0000:0000:000a", "RoCE v2"),
                                         (2, "fe80:0000:0000:0000:0000:0000:0000:0002", "RoCE v2")])
    assert [g["index"] for g in read_rdma(sysfs_tree(files))[0]["gids"]] == [2, 10]


def test_hca_without_ports_dir_is_skipped(sysfs_tree):
    files = {"class/infiniband/mlx5_9/device/net/eth9": None}
    files.update(_hca("mlx5_0", "eth2"))
    assert [p["hca"] for p in read_rdma(sysfs_tree(files))] == ["mlx5_0"]


def test_plain_connectx_host(fixture_data, ip_runner, sysfs_tree):
    """The plain ConnectX fixture: both ports share the adapter's GUID, each is its own port (p0, p1)."""
    files = fixture_data("sysfs/connectx.yml")
    ip = ip_runner(fixture_data("ip/connectx-addr.json"), fixture_data("ip/connectx-route-default.json"))
    raw = read_network(sysfs_tree(files), ip=ip)
    by_name = _by_name(raw["interfaces"])
    assert [(n, by_name[n]["pci_slot"], by_name[n]["phys_port_name"]) for n in ("eno1", "ens1f0np0", "ens1f1np1")] == [
        ("eno1", "0000:03:00.0", None), ("ens1f0np0", "0000:17:00.0", "p0"), ("ens1f1np1", "0000:17:00.1", "p1")]
    assert [(p["hca"], p["netdev"], p["sys_image_guid"]) for p in raw["rdma"]] == [
        ("mlx5_0", "ens1f0np0", "b8ce:f603:00a1:b2c2"), ("mlx5_1", "ens1f1np1", "b8ce:f603:00a1:b2c2")]
    selection = select_fabric("gpu1", parse_network(raw), CIDR)
    assert (selection.interface, selection.hca_ports, selection.gid_index, selection.addr_range) == (
        "ens1f1np1", ("mlx5_1:1",), 3, CIDR)


@pytest.mark.parametrize(
    "uevent, expected",
    [
        ("DRIVER=mlx5_core\nPCI_CLASS=20000\nPCI_SLOT_NAME=0002:01:00.1\nMODALIAS=pci:v000015B3", "0002:01:00.1"),
        ("DRIVER=virtio_net", None),
        ("PCI_SLOT_NAME=", None),
        (None, None),
    ],
    ids=["pci-device", "not-pci", "empty", "no-device"],
)
def test_pci_slot_from_uevent(sysfs_tree, ip_runner, uevent, expected):
    files = {"class/net/eth1/mtu": "9000"}
    if uevent is not None:
        files["class/net/eth1/device/uevent"] = uevent
    entry = read_interfaces(sysfs_tree(files), ip=ip_runner([], []))[0]
    assert (entry["pci_slot"], entry["phys_port_name"]) == (expected, None)


def test_spark_other_half_read_from_sysfs_down(spark1, sysfs_tree):
    """The other half's link down in sysfs: fabric_facts reads it and leaves its HCA out, naming it."""
    files, ip = spark1
    files["class/net/enP2p1s0f1np1/operstate"] = "down"
    files.pop("class/net/enP2p1s0f1np1/carrier")
    files["class/infiniband/roceP2p1s0f1/ports/1/state"] = "1: DOWN"
    selection = select_fabric("spark1", parse_network(read_network(sysfs_tree(files), ip=ip)), CIDR)
    assert selection.hca_ports == ("rocep1s0f1:1",)
    assert selection.warnings[0].startswith(
        "spark1: enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), is down")
