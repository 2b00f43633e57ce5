# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fabric model, fed with host layouts written from real machines (fixtures/networks.yml)."""

from __future__ import annotations

import ipaddress

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    FabricSelection,
    Gid,
    RdmaPort,
    check_cluster,
    check_inventory,
    nccl_gid_index,
    parse_cidr,
    parse_network,
    port_siblings,
    roce_v2_gid_index,
    select_fabric,
)

CIDR = "198.18.200.0/24"


def _select(layout, name, host, changes=None, cidr=CIDR, **kwargs):
    return select_fabric(host, parse_network(layout(name, **(changes or {}))), cidr, **kwargs)


# ---------------------------------------------------------------------------
# select_fabric: the choices
# ---------------------------------------------------------------------------


def test_spark_selection_is_the_fabric_port_not_mgmt_nor_twin(layout):
    selection = _select(layout, "spark1", "spark1")
    assert selection.as_dict() == {
        "host": "spark1",
        "interface": "enp1s0f1np1",
        "ip": "198.18.200.12",
        "prefix": 24,
        "network": "198.18.200.0/24",
        "mtu": 9000,
        "hca_ports": ["rocep1s0f1:1", "roceP2p1s0f1:1"],
        "rdma": [
            {"hca": "rocep1s0f1", "port": 1, "state": "4: ACTIVE", "link_layer": "Ethernet", "netdev": "enp1s0f1np1"}
        ],
        "gid_index": 3,
        "mgmt_interface": "enP7s7",
        "mgmt_ip": "192.168.1.21",
        "warnings": [],
        "link_error": None,
        # Both endpoints of the cabled QSFP port; the empty cage's (f0) are not the fabric's.
        "fabric_port": [
            {"netdev": "enp1s0f1np1", "role": "fabric", "pci_slot": "0000:01:00.1", "phys_port_name": "p1",
             "operstate": "up", "speed": 200000, "mtu": 9000, "ip": "198.18.200.12", "hca": "rocep1s0f1", "port": 1,
             "rdma_state": "4: ACTIVE", "gid_index": 3, "used": True, "problem": None},
            {"netdev": "enP2p1s0f1np1", "role": "sibling", "pci_slot": "0002:01:00.1", "phys_port_name": "p1",
             "operstate": "up", "speed": 200000, "mtu": 9000, "ip": "198.18.201.12", "hca": "roceP2p1s0f1",
             "port": 1, "rdma_state": "4: ACTIVE", "gid_index": 3, "used": True, "problem": None},
        ],
        # fabric_cidr's smallest supernet holding both halves' addresses (198.18.200.12 and 198.18.201.12).
        "addr_range": "198.18.200.0/23",
    }


SELECT_CASES = [
    # id, layout, changes, kwargs, expected fields
    ("spark-named-ip", "spark1", {}, {"fabric_ip": "198.18.200.12"},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.12", "gid_index": 3}),
    ("spark-named-interface", "spark1", {}, {"fabric_interface": "enp1s0f1np1"},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.12", "hca_ports": ["rocep1s0f1:1", "roceP2p1s0f1:1"]}),
    ("spark-named-both", "spark1", {}, {"fabric_interface": "enp1s0f1np1", "fabric_ip": "198.18.200.12"},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.12"}),
    ("spark-twin-subnet-as-fabric", "spark1", {}, {"cidr": "198.18.201.0/24"},
     {"interface": "enP2p1s0f1np1", "ip": "198.18.201.12", "hca_ports": ["roceP2p1s0f1:1", "rocep1s0f1:1"],
      "gid_index": 3, "addr_range": "198.18.200.0/23"}),
    ("spark2-gid-at-4-ipv6-ignored", "spark2", {}, {},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.13", "prefix": 24, "gid_index": 4}),
    ("no-default-route-mgmt-none", "spark1", {"enP7s7": {"default_route": False}}, {},
     {"interface": "enp1s0f1np1", "mgmt_interface": None, "mgmt_ip": None, "warnings": []}),
    ("mgmt-without-ipv4", "spark1", {"enP7s7": {"addresses": []}}, {},
     {"interface": "enp1s0f1np1", "mgmt_interface": "enP7s7", "mgmt_ip": None}),
    ("two-ports-resolved-by-interface", "spark_two_ports", {}, {"fabric_interface": "enP2p1s0f1np1"},
     {"interface": "enP2p1s0f1np1", "ip": "198.18.200.114", "hca_ports": ["roceP2p1s0f1:1", "rocep1s0f1:1"],
      "gid_index": 3, "addr_range": CIDR}),
    ("two-ports-resolved-by-ip", "spark_two_ports", {}, {"fabric_ip": "198.18.200.14"},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.14", "hca_ports": ["rocep1s0f1:1", "roceP2p1s0f1:1"]}),
    ("hca-prefix-trap-only-mlx5_1", "hgx_prefix_trap", {}, {},
     {"interface": "ens1f1np1", "hca_ports": ["mlx5_1:1"], "gid_index": 3, "mgmt_interface": "eno1np0"}),
    ("operstate-unknown-no-carrier-file", "spark1", {"enp1s0f1np1": {"operstate": "unknown", "carrier": None}}, {},
     {"interface": "enp1s0f1np1", "ip": "198.18.200.12"}),
    ("no-rdma", "spark1", {"rocep1s0f1": {"netdev": None}}, {},
     {"interface": "enp1s0f1np1", "hca_ports": [], "rdma": [], "gid_index": None}),
    # Issue 17: the default route's interface also carrying a fabric alias reports its other address as mgmt.
    ("mgmt-prefers-address-outside-fabric", "single_nic", {"eth0": {"addresses": ["198.18.200.31/24", "192.168.1.31/24"]}},
     {}, {"interface": "eth0", "ip": "198.18.200.31", "mgmt_interface": "eth0", "mgmt_ip": "192.168.1.31"}),
    ("roce-v1-only-no-gid-index", "spark1", {"rocep1s0f1": {"gids": [
        {"index": 2, "gid": "0000:0000:0000:0000:0000:ffff:c612:c80c", "type": "IB/RoCE v1"}]}}, {},
     {"hca_ports": ["rocep1s0f1:1", "roceP2p1s0f1:1"], "gid_index": None}),
]


@pytest.mark.parametrize(
    "name, changes, kwargs, expected",
    [case[1:] for case in SELECT_CASES],
    ids=[case[0] for case in SELECT_CASES],
)
def test_select_fabric(layout, name, changes, kwargs, expected):
    kwargs = dict(kwargs)
    cidr = kwargs.pop("cidr", CIDR)
    result = _select(layout, name, name, changes, cidr=cidr, **kwargs).as_dict()
    assert {key: result[key] for key in expected} == expected


@pytest.mark.parametrize(
    "name, changes, wanted",
    [
        ("single_nic", {}, ["single_nic: fabric interface eth0 also holds the default route: management and cluster traffic share it"]),
        ("spark1", {"rocep1s0f1": {"state": "1: DOWN"}},
         ["spark1: RDMA port rocep1s0f1:1 of enp1s0f1np1 is 1: DOWN, not ACTIVE"]),
        ("spark1", {}, []),
    ],
    ids=["single-nic-fabric-is-mgmt", "rdma-port-down", "spark-clean"],
)
def test_select_fabric_warnings(layout, name, changes, wanted):
    selection = _select(layout, name, name, changes)
    assert list(selection.warnings) == wanted


def test_single_nic_fabric_is_mgmt(layout):
    selection = _select(layout, "single_nic", "node1")
    assert (selection.interface, selection.ip, selection.mgmt_interface, selection.mgmt_ip) == (
        "eth0", "198.18.200.31", "eth0", "198.18.200.31")
    assert selection.rdma_ports == ()


# ---------------------------------------------------------------------------
# select_fabric: every error names the host, the value and the fix
# ---------------------------------------------------------------------------

ERROR_CASES = [
    # id, layout, changes, kwargs (cidr may be overridden), substrings of the message
    ("two-ports-one-cidr", "spark_two_ports", {}, {},
     ["spark_two_ports:", "enp1s0f1np1 and enP2p1s0f1np1", CIDR, "name one with fabric_interface",
      "host_vars/spark_two_ports.yml"]),
    ("link-local-only", "spark1", {"enp1s0f1np1": {"addresses": ["169.254.77.12/16"]}}, {},
     ["spark1:", "no interface has an address in fabric_cidr " + CIDR, "enp1s0f1np1=169.254.77.12/16",
      "bring up the fabric interface or correct fabric_cidr"]),
    ("fabric-down", "spark1", {"enp1s0f1np1": {"operstate": "down", "carrier": None}}, {},
     ["spark1:", "fabric interface enp1s0f1np1 (198.18.200.12) is down", "check the cable",
      "ip link set enp1s0f1np1 up"]),
    ("fabric-lowerlayerdown", "spark1", {"enp1s0f1np1": {"operstate": "LowerLayerDown"}}, {},
     ["spark1:", "enp1s0f1np1 (198.18.200.12) is lowerlayerdown", "ip link set enp1s0f1np1 up"]),
    ("fabric-up-without-carrier", "spark1", {"enp1s0f1np1": {"operstate": "up", "carrier": False}}, {},
     ["spark1:", "enp1s0f1np1 (198.18.200.12) is up without carrier", "check the cable"]),
    ("loopback-fabric-ip", "spark1", {}, {"fabric_ip": "127.0.0.1"},
     ["spark1:", "fabric_ip 127.0.0.1 is a loopback address", "an address peers can reach"]),
    ("link-local-fabric-ip", "spark1", {}, {"fabric_ip": "169.254.77.12"},
     ["spark1:", "fabric_ip 169.254.77.12 is link-local", "routable address in fabric_cidr"]),
    ("fabric-ip-outside-cidr", "spark1", {}, {"fabric_ip": "198.18.201.12"},
     ["spark1:", "fabric_ip 198.18.201.12 is outside fabric_cidr " + CIDR, "set fabric_ip in host_vars/spark1.yml"]),
    ("fabric-ip-not-ipv4", "spark1", {}, {"fabric_ip": "198.18.200"},
     ["spark1:", "fabric_ip '198.18.200' is not an IPv4 address", "fix host_vars/spark1.yml"]),
    ("named-interface-lacks-named-ip", "spark1", {},
     {"fabric_interface": "enp1s0f1np1", "fabric_ip": "198.18.200.99"},
     ["spark1:", "fabric_interface enp1s0f1np1 does not carry fabric_ip 198.18.200.99", "it has 198.18.200.12/24",
      "assign the address or fix host_vars/spark1.yml"]),
    ("named-interface-missing", "spark1", {}, {"fabric_interface": "enp1s0f1np0"},
     ["spark1:", "fabric_interface enp1s0f1np0 does not exist", "enp1s0f1np1", "fix host_vars/spark1.yml"]),
    ("named-interface-outside-cidr", "spark1", {}, {"fabric_interface": "enP2p1s0f1np1"},
     ["spark1:", "fabric_interface enP2p1s0f1np1 has no address in fabric_cidr " + CIDR, "198.18.201.12/24",
      "host_vars/spark1.yml"]),
    ("named-interface-no-ipv4", "spark1", {}, {"fabric_interface": "wlP9s9"},
     ["spark1:", "fabric_interface wlP9s9 has no address", "no IPv4", "host_vars/spark1.yml"]),
    ("named-ip-on-no-interface", "spark1", {}, {"fabric_ip": "198.18.200.99"},
     ["spark1:", "no interface carries fabric_ip 198.18.200.99", "enp1s0f1np1=198.18.200.12/24",
      "fix host_vars/spark1.yml"]),
    ("two-addresses-one-port", "spark1", {"enp1s0f1np1": {"addresses": ["198.18.200.12/24", "198.18.200.112/24"]}},
     {}, ["spark1:", "enp1s0f1np1 has several addresses", "198.18.200.12, 198.18.200.112",
          "set fabric_ip in host_vars/spark1.yml"]),
    ("cidr-link-local", "spark1", {}, {"cidr": "169.254.0.0/16"},
     ["spark1:", "fabric_cidr 169.254.0.0/16 is a link-local range", "use the fabric subnet"]),
    ("cidr-loopback", "spark1", {}, {"cidr": "127.0.0.0/8"},
     ["spark1:", "fabric_cidr 127.0.0.0/8 is a loopback range", "use the fabric subnet"]),
    ("cidr-not-a-network", "spark1", {}, {"cidr": "198.18.200.0/33"},
     ["spark1:", "fabric_cidr '198.18.200.0/33' is not an IPv4 network", "fabric_cidr: 198.18.200.0/24"]),
    ("single-nic-wrong-cidr", "single_nic", {}, {"cidr": "198.18.201.0/24"},
     ["single_nic:", "fabric_cidr 198.18.201.0/24", "lo=127.0.0.1/8; eth0=198.18.200.31/24", "correct fabric_cidr"]),
]


@pytest.mark.parametrize(
    "name, changes, kwargs, substrings",
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_select_fabric_errors(layout, name, changes, kwargs, substrings):
    kwargs = dict(kwargs)
    cidr = kwargs.pop("cidr", CIDR)
    with pytest.raises(FabricError) as caught:
        _select(layout, name, name, changes, cidr=cidr, **kwargs)
    message = str(caught.value)
    missing = [s for s in substrings if s not in message]
    assert not missing, "%r lacks %r" % (message, missing)


LINK_DOWN_CASES = [
    ("down", {"operstate": "down", "carrier": None},
     "spark1: fabric interface enp1s0f1np1 (198.18.200.12) is down; check the cable and run "
     "`ip link set enp1s0f1np1 up`"),
    ("no-carrier", {"carrier": False},
     "spark1: fabric interface enp1s0f1np1 (198.18.200.12) is up without carrier; check the cable and run "
     "`ip link set enp1s0f1np1 up`"),
    ("up", {}, None),
]


@pytest.mark.parametrize("changes, expected", [c[1:] for c in LINK_DOWN_CASES], ids=[c[0] for c in LINK_DOWN_CASES])
def test_allow_link_down_reports_instead_of_raising(layout, changes, expected):
    """The probe still runs with a dead link, so it can name every pair the link breaks."""
    selection = _select(layout, "spark1", "spark1", {"enp1s0f1np1": changes}, allow_link_down=True)
    assert selection.link_error == expected
    assert (selection.interface, selection.ip, selection.gid_index) == ("enp1s0f1np1", "198.18.200.12", 3)
    assert FabricSelection.from_dict(selection.as_dict()).link_error == expected


def test_allow_link_down_does_not_hide_other_errors(layout):
    with pytest.raises(FabricError, match="spark1: fabric_ip 198.18.201.12 is outside fabric_cidr"):
        _select(layout, "spark1", "spark1", {"enp1s0f1np1": {"operstate": "down"}}, fabric_ip="198.18.201.12",
                allow_link_down=True)


# ---------------------------------------------------------------------------
# The data model
# ---------------------------------------------------------------------------


def test_parse_network_keeps_ipv4_and_tristate_carrier(layout):
    network = parse_network(
        layout("spark2", enp1s0f1np1={"addresses": ["198.18.200.13/24", "fd12:3456:789a::13/64", "junk"]},
               enP7s7={"mtu": None, "carrier": False})
    )
    fabric = network.interface("enp1s0f1np1")
    mgmt = network.interface("enP7s7")
    assert [str(a) for a in fabric.addresses] == ["198.18.200.13/24"]
    assert (fabric.carrier, mgmt.carrier, mgmt.mtu) == (True, False, 0)
    assert network.interface("enp1s0f1np0") is None
    assert [p.name for p in network.rdma_ports] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]
    assert [g.index for g in network.rdma_ports[0].gids] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "gid, ipv4",
    [
        ("0000:0000:0000:0000:0000:ffff:c612:c80c", "198.18.200.12"),
        ("fe80:0000:0000:0000:4ebb:47ff:fe2c:1a0b", None),
        ("fd12:3456:789a:0000:0000:0000:0000:0013", None),
        ("not-a-gid", None),
    ],
    ids=["ipv4-mapped", "link-local", "ula", "junk"],
)
def test_gid_ipv4(gid, ipv4):
    assert Gid(index=0, gid=gid, type="RoCE v2").ipv4 == ipv4


@pytest.mark.parametrize(
    "state, active",
    [("4: ACTIVE", True), ("ACTIVE", True), ("1: DOWN", False), ("2: INIT", False), ("", False)],
    ids=["sysfs-active", "bare-active", "down", "init", "empty"],
)
def test_rdma_port_active(state, active):
    assert RdmaPort(hca="mlx5_1", port=1, state=state, link_layer="Ethernet", netdev=None).active is active


V2 = "0000:0000:0000:0000:0000:ffff:c612:c80c"


@pytest.mark.parametrize(
    "ports, expected",
    [
        ([[(3, V2, "RoCE v2"), (2, V2, "IB/RoCE v1")]], 3),
        ([[(7, V2, "RoCEv2"), (5, V2, "roce v2")]], 5),
        ([[(2, V2, "IB/RoCE v1")]], None),
        ([[(3, "0000:0000:0000:0000:0000:ffff:c612:c80d", "RoCE v2")]], None),
        ([[], [(4, V2, "RoCE v2")]], 4),
        ([], None),
    ],
    ids=["v2-not-v1", "lowest-index-any-spelling", "v1-only", "other-address", "second-port", "no-ports"],
)
def test_roce_v2_gid_index(ports, expected):
    rdma = [
        RdmaPort(hca="mlx5_%d" % n, port=1, state="4: ACTIVE", link_layer="Ethernet", netdev="eth1",
                 gids=tuple(Gid(index=i, gid=g, type=t) for i, g, t in gids))
        for n, gids in enumerate(ports)
    ]
    assert roce_v2_gid_index(rdma, "198.18.200.12") == expected


def test_selection_round_trips_through_facts(layout):
    selection = _select(layout, "spark2", "spark2")
    facts = selection.as_dict()
    rebuilt = FabricSelection.from_dict(facts)
    assert rebuilt.as_dict() == facts
    assert (rebuilt.gid_index, rebuilt.hca_ports, rebuilt.ip) == (4, ("rocep1s0f1:1", "roceP2p1s0f1:1"), "198.18.200.13")
    assert rebuilt.members == selection.members and rebuilt.addr_range == "198.18.200.0/23"


@pytest.mark.parametrize(
    "facts, substrings",
    [
        ({"host": "spark1", "interface": "enp1s0f1np1", "prefix": 24, "mtu": 9000}, ["'ip'", "malformed"]),
        ({"host": "spark1", "interface": "enp1s0f1np1", "ip": "198.18.200.12", "prefix": 24, "mtu": "jumbo"},
         ["jumbo", "malformed"]),
        ({"host": "spark1", "interface": "enp1s0f1np1", "ip": "198.18.200.12", "prefix": 24, "mtu": 9000,
          "rdma": [{"port": 1}]}, ["'hca'", "malformed"]),
        ("198.18.200.12", ["198.18.200.12", "malformed"]),
        (None, ["None", "malformed"]),
    ],
    ids=["missing-ip", "bad-mtu", "rdma-without-hca", "a-string-not-facts", "none"],
)
def test_selection_from_bad_facts(facts, substrings):
    with pytest.raises(FabricError) as caught:
        FabricSelection.from_dict(facts)
    message = str(caught.value)
    assert all(s in message for s in substrings), message


def test_parse_cidr_normalises_host_bits():
    assert str(parse_cidr("198.18.200.12/24")) == CIDR


# ---------------------------------------------------------------------------
# check_inventory: before any host is touched
# ---------------------------------------------------------------------------

INVENTORY_CASES = [
    # id, hosts, heads, cidr, expected substrings per error (in order)
    ("consistent", {"spark1": {"fabric_ip": "198.18.200.12"}, "spark2": {"fabric_ip": "198.18.200.13"}},
     ["spark1"], CIDR, []),
    ("fabric-ip-optional", {"spark1": {}, "spark2": {"fabric_ip": None}}, ["spark1"], CIDR, []),
    ("zero-heads", {"spark1": {}, "spark2": {}}, [], CIDR,
     [["no host in group ray_head", "put exactly one host (the head node) in group ray_head"]]),
    ("two-heads", {"spark1": {}, "spark2": {}}, ["spark1", "spark2"], CIDR,
     [["group ray_head has 2 hosts (spark1, spark2)", "move the others to ray_workers"]]),
    ("head-not-in-cluster", {"spark1": {}, "spark2": {}}, ["spark9"], CIDR,
     [["ray_head host spark9 is not one of the cluster hosts (spark1, spark2)",
       "put one of them in group ray_head"]]),
    ("fabric-ip-outside-cidr", {"spark1": {"fabric_ip": "198.18.200.12"}, "spark2": {"fabric_ip": "198.18.201.13"}},
     ["spark1"], CIDR,
     [["spark2:", "fabric_ip 198.18.201.13 is outside fabric_cidr " + CIDR, "host_vars/spark2.yml"]]),
    ("duplicate-fabric-ip", {"spark1": {"fabric_ip": "198.18.200.12"}, "spark2": {"fabric_ip": "198.18.200.12"}},
     ["spark1"], CIDR,
     [["spark1 and spark2 both have fabric_ip 198.18.200.12", "every node needs its own fabric address"]]),
    ("fabric-ip-not-ipv4", {"spark1": {"fabric_ip": "spark1.fabric"}, "spark2": {}}, ["spark1"], CIDR,
     [["spark1:", "'spark1.fabric' is not an IPv4 address", "fix host_vars/spark1.yml"]]),
    ("bad-cidr", {"spark1": {}}, ["spark1"], "fabric",
     [["fabric_cidr 'fabric' is not an IPv4 network", "fabric_cidr: 198.18.200.0/24"]]),
    ("several-at-once", {"spark1": {"fabric_ip": "10.0.0.1"}, "spark2": {}}, [], CIDR,
     [["no host in group ray_head"], ["spark1:", "10.0.0.1 is outside fabric_cidr"]]),
]


@pytest.mark.parametrize(
    "hosts, heads, cidr, expected",
    [case[1:] for case in INVENTORY_CASES],
    ids=[case[0] for case in INVENTORY_CASES],
)
def test_check_inventory(hosts, heads, cidr, expected):
    errors = check_inventory(hosts, cidr, heads)
    assert len(errors) == len(expected), errors
    for error, substrings in zip(errors, expected):
        assert all(s in error for s in substrings), (error, substrings)


# ---------------------------------------------------------------------------
# check_cluster: over every host's selection
# ---------------------------------------------------------------------------

SPARK2_AS_12 = {"enp1s0f1np1": {"addresses": ["198.18.200.12/24"]}}

CLUSTER_CASES = [
    # id, {host: (layout, changes)}, heads, inventory, cidr, expected substrings per error (in order)
    ("consistent", {"spark1": ("spark1", {}), "spark2": ("spark2", {})}, ["spark1"],
     {"spark1": {"fabric_ip": "198.18.200.12"}, "spark2": {"fabric_ip": "198.18.200.13"}}, CIDR, []),
    ("duplicate-address", {"spark1": ("spark1", {}), "spark2": ("spark2", SPARK2_AS_12)}, ["spark1"], {}, CIDR,
     [["spark1 and spark2", "198.18.200.12", "must be unique"]]),
    ("mtu-mismatch", {"spark1": ("spark1", {}), "spark2": ("spark2", {"enp1s0f1np1": {"mtu": 1500}})},
     ["spark1"], {}, CIDR,
     [["spark1 enp1s0f1np1=9000", "spark2 enp1s0f1np1=1500", "set the same MTU on every fabric interface"]]),
    ("zero-heads", {"spark1": ("spark1", {}), "spark2": ("spark2", {})}, [], {}, CIDR,
     [["no host in group ray_head", "put exactly one host"]]),
    ("two-heads", {"spark1": ("spark1", {}), "spark2": ("spark2", {})}, ["spark1", "spark2"], {}, CIDR,
     [["ray_head has 2 hosts (spark1, spark2)", "move the others to ray_workers"]]),
    ("inventory-ip-not-carried", {"spark1": ("spark1", {}), "spark2": ("spark2", {})}, ["spark1"],
     {"spark2": {"fabric_ip": "198.18.200.99"}}, CIDR,
     [["spark2:", "inventory fabric_ip is 198.18.200.99", "carries 198.18.200.13 on enp1s0f1np1",
       "fix host_vars/spark2.yml"]]),
    ("different-prefix", {"spark1": ("spark1", {}),
                          "spark2": ("spark2", {"enp1s0f1np1": {"addresses": ["198.18.200.13/16"]}})},
     ["spark1"], {}, CIDR,
     [["spark2:", "enp1s0f1np1 is configured as 198.18.200.13/16", "fabric_cidr is " + CIDR,
       "same prefix"]]),
    ("bad-cidr", {"spark1": ("spark1", {})}, ["spark1"], {}, "169.254.0.0/16",
     [["fabric_cidr 169.254.0.0/16 is a link-local range"]]),
    # Issue 17: fabric address = management address was a warning only.
    ("fabric-address-is-mgmt-address", {"node1": ("single_nic", {}), "spark2": ("spark2", {"enp1s0f1np1": {"mtu": 1500}})},
     ["node1"], {"node1": {"fabric_ip": "198.18.200.31"}}, CIDR,
     [["node1: fabric address (fabric_ip) = 198.18.200.31 on eth0 is also its management address",
       "eth0 holds the default route", "expected a fabric address apart from management",
       "host_vars/node1.yml", "correct fabric_cidr"]]),
    ("fabric-alias-on-mgmt-interface-is-not-mgmt",
     {"node1": ("single_nic", {"eth0": {"addresses": ["198.18.200.31/24", "192.168.1.31/24"]}}),
      "spark2": ("spark2", {"enp1s0f1np1": {"mtu": 1500}})}, ["node1"], {}, CIDR, []),
]


@pytest.mark.parametrize(
    "hosts, heads, inventory, cidr, expected",
    [case[1:] for case in CLUSTER_CASES],
    ids=[case[0] for case in CLUSTER_CASES],
)
def test_check_cluster(layout, hosts, heads, inventory, cidr, expected):
    selections = {
        host: _select(layout, name, host, changes, cidr=CIDR) for host, (name, changes) in hosts.items()
    }
    errors = check_cluster(selections, cidr, heads, inventory)
    assert len(errors) == len(expected), errors
    for error, substrings in zip(errors, expected):
        assert all(s in error for s in substrings), (error, substrings)


def test_check_cluster_selection_outside_cidr(layout):
    """A selection gathered for another subnet (stale facts) is outside the cluster's fabric_cidr."""
    twin = select_fabric("spark1", parse_network(layout("spark1")), "198.18.201.0/24")
    errors = check_cluster({"spark1": twin}, CIDR, ["spark1"])
    assert errors[0] == "spark1: fabric address 198.18.201.12 is outside fabric_cidr 198.18.200.0/24"
    assert "enP2p1s0f1np1 is configured as 198.18.201.12/24" in errors[1]


# ---------------------------------------------------------------------------
# The fabric's physical port: both halves of a DGX Spark's QSFP port
# ---------------------------------------------------------------------------

TWIN = "enP2p1s0f1np1"
TWIN_HCA = "roceP2p1s0f1"
LEAVES_OUT = ". NCCL_IB_HCA leaves roceP2p1s0f1:1 out until then, so NCCL reaches about half of the port"


def _twin(selection):
    return next(m for m in selection.members if m.netdev == TWIN)


SIBLING_CASES = [
    # id, layout, changes, interface, expected siblings
    ("spark-cabled-cage-pairs-across-pci-domains", "spark1", {}, "enp1s0f1np1", ["enP2p1s0f1np1"]),
    ("spark-twin-finds-the-fabric-half", "spark1", {}, "enP2p1s0f1np1", ["enp1s0f1np1"]),
    ("spark-empty-cage-pairs-its-own-halves", "spark1", {}, "enp1s0f0np0", ["enP2p1s0f0np0"]),
    # Same bus/device/function on another domain, but another port name: not the same port.
    ("port-names-disagree", "spark1", {TWIN: {"phys_port_name": "p0"}}, "enp1s0f1np1", []),
    # Without phys_port_name (a driver without switchdev names), the PCI address alone pairs them.
    ("no-port-names", "spark1", {TWIN: {"phys_port_name": None}, "enp1s0f1np1": {"phys_port_name": None}},
     "enp1s0f1np1", ["enP2p1s0f1np1"]),
    # One adapter's GUID and one port name on unrelated PCI addresses (socket direct): the same port.
    ("same-guid-and-port-name", "spark1", {TWIN: {"pci_slot": "0005:03:00.0"}}, "enp1s0f1np1", ["enP2p1s0f1np1"]),
    # Another adapter (its own GUID) at an unrelated address: not a sibling.
    ("other-adapter", "spark1", {TWIN: {"pci_slot": "0005:03:00.0"}, TWIN_HCA: {"sys_image_guid": "0000:0000:0000:0001"}},
     "enp1s0f1np1", []),
    # No PCI address known (a container without device/uevent): no sibling is guessed.
    ("no-pci-address", "spark1", {TWIN: {"pci_slot": None}}, "enp1s0f1np1", []),
    ("hgx-no-pci-data", "hgx_prefix_trap", {}, "ens1f1np1", []),
    ("unknown-interface", "spark1", {}, "eth9", []),
]


@pytest.mark.parametrize(
    "name, changes, interface, expected", [case[1:] for case in SIBLING_CASES], ids=[case[0] for case in SIBLING_CASES]
)
def test_port_siblings(layout, name, changes, interface, expected):
    network = parse_network(layout(name, **changes))
    assert [i.name for i in port_siblings(network, interface)] == expected


def test_plain_dual_port_connectx_ports_are_not_siblings(layout):
    """Both ports of one adapter share its sys_image_guid; p0 and p1 are two ports, each one HCA."""
    net = {
        "interfaces": [
            {"name": "ens1f0np0", "addresses": [], "mtu": 9000, "operstate": "up", "carrier": True,
             "pci_slot": "0000:17:00.0", "phys_port_name": "p0"},
            {"name": "ens1f1np1", "addresses": ["198.18.200.21/24"], "mtu": 9000, "operstate": "up", "carrier": True,
             "pci_slot": "0000:17:00.1", "phys_port_name": "p1"},
        ],
        "rdma": [
            {"hca": "mlx5_0", "port": 1, "state": "4: ACTIVE", "netdev": "ens1f0np0", "sys_image_guid": "b8ce:f603:00a1:b2c2"},
            {"hca": "mlx5_1", "port": 1, "state": "4: ACTIVE", "netdev": "ens1f1np1", "sys_image_guid": "b8ce:f603:00a1:b2c2",
             "gids": [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:c815", "type": "RoCE v2"}]},
        ],
    }
    selection = select_fabric("gpu1", parse_network(net), CIDR)
    assert port_siblings(parse_network(net), "ens1f1np1") == ()
    assert (selection.hca_ports, selection.addr_range, [m.role for m in selection.members]) == (
        ("mlx5_1:1",), CIDR, ["fabric"])


TWIN_PROBLEM_CASES = [
    # id, changes, the other half's problem (its HCA is left out of NCCL_IB_HCA; the warning adds LEAVES_OUT)
    ("down", {TWIN: {"operstate": "down", "carrier": None}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), is down; bring it up "
     "(`ip link set enP2p1s0f1np1 up`, and in netplan) with an address and MTU 9000 as enp1s0f1np1 has"),
    ("up-without-carrier", {TWIN: {"carrier": False}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), is up without carrier; bring it "
     "up (`ip link set enP2p1s0f1np1 up`, and in netplan) with an address and MTU 9000 as enp1s0f1np1 has"),
    ("rdma-port-down", {TWIN_HCA: {"state": "1: DOWN"}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), has its RDMA port in state "
     "1: DOWN, not ACTIVE; check the link with `rdma link show roceP2p1s0f1:1`"),
    ("no-address", {TWIN: {"addresses": []}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), has no IPv4 address, so no "
     "RoCE v2 GID of roceP2p1s0f1:1 holds one for NCCL; give enP2p1s0f1np1 an address (in netplan)"),
    ("address-without-roce-v2-gid", {TWIN_HCA: {"gids": [
        {"index": 2, "gid": "0000:0000:0000:0000:0000:ffff:c612:c90c", "type": "IB/RoCE v1"}]}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), carries 198.18.201.12 but no "
     "RoCE v2 GID of roceP2p1s0f1:1 holds it; check the RoCE mode of roceP2p1s0f1 "
     "(/sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/)"),
    ("mtu-1500", {TWIN: {"mtu": 1500}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA roceP2p1s0f1:1), has MTU 1500 while enp1s0f1np1 "
     "has 9000; set the same MTU on both halves (`ip link set dev enP2p1s0f1np1 mtu 9000`, and in netplan)"),
    ("no-rdma-device", {TWIN_HCA: {"netdev": None}},
     "enP2p1s0f1np1, the other half of enp1s0f1np1's port (RDMA none), has no RDMA device; load the RDMA driver "
     "for it (mlx5_ib) or check `rdma link show`"),
]


@pytest.mark.parametrize(
    "changes, problem", [case[1:] for case in TWIN_PROBLEM_CASES], ids=[case[0] for case in TWIN_PROBLEM_CASES]
)
def test_other_half_not_usable_is_named_with_the_fix(layout, changes, problem):
    selection = _select(layout, "spark1", "spark1", changes)
    twin = _twin(selection)
    assert (twin.used, twin.problem) == (False, problem)
    assert selection.hca_ports == ("rocep1s0f1:1",)
    # Only the fabric interface's address: the range is fabric_cidr again.
    assert selection.addr_range == CIDR
    leaves_out = LEAVES_OUT if twin.hca else LEAVES_OUT.replace("roceP2p1s0f1:1", TWIN)
    assert list(selection.warnings) == ["spark1: " + problem + leaves_out]


def test_other_half_in_fabric_cidr_keeps_fabric_cidr(layout):
    """Both halves addressed inside fabric_cidr (the operator named the interface): the range is fabric_cidr."""
    selection = _select(layout, "spark_two_ports", "spark3", fabric_interface="enp1s0f1np1")
    assert (selection.hca_ports, selection.addr_range) == (("rocep1s0f1:1", "roceP2p1s0f1:1"), CIDR)
    assert [(m.netdev, m.ip, m.gid_index, m.used) for m in selection.members] == [
        ("enp1s0f1np1", "198.18.200.14", 3, True), ("enP2p1s0f1np1", "198.18.200.114", 3, True)]


def test_other_half_address_in_fabric_cidr_is_preferred(layout):
    """Two addresses on the other half, both held by RoCE v2 GIDs: the one in fabric_cidr is its address."""
    gids = [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:c90c", "type": "RoCE v2"},
            {"index": 5, "gid": "0000:0000:0000:0000:0000:ffff:c612:c872", "type": "RoCE v2"}]
    selection = _select(layout, "spark1", "spark1", {
        TWIN: {"addresses": ["198.18.201.12/24", "198.18.200.114/24"]}, TWIN_HCA: {"gids": gids}},
        fabric_interface="enp1s0f1np1")
    twin = _twin(selection)
    assert (twin.ip, twin.gid_index) == ("198.18.200.114", 5)
    # The range is fabric_cidr, and NCCL's own choice in it is GID 5: the twin is used.
    assert (selection.addr_range, twin.used) == (CIDR, True)


def test_addr_range_that_would_pick_another_gid_is_a_problem(layout):
    """The supernet that holds both halves also holds a second address on the fabric HCA, at a lower GID index:
    NCCL would take that one. The fabric HCA stays listed (warned); the fix is named."""
    gids = [{"index": 1, "gid": "0000:0000:0000:0000:0000:ffff:c612:c932", "type": "RoCE v2"},   # 198.18.201.50
            {"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:c612:c80c", "type": "RoCE v2"}]   # 198.18.200.12
    selection = _select(layout, "spark1", "spark1", {
        "enp1s0f1np1": {"addresses": ["198.18.200.12/24", "198.18.201.50/24"]}, "rocep1s0f1": {"gids": gids}},
        fabric_ip="198.18.200.12")
    fabric = selection.members[0]
    assert selection.addr_range == "198.18.200.0/23"
    assert (fabric.used, fabric.gid_index) == (True, 3)
    assert fabric.problem == (
        "NCCL_IB_ADDR_RANGE=198.18.200.0/23 would make NCCL use GID 1 of rocep1s0f1:1, not GID 3 that holds "
        "198.18.200.12 (enp1s0f1np1); remove the other address in that range from enp1s0f1np1, or set "
        "node_env_gid_selection: index")
    assert list(selection.warnings) == ["spark1: " + fabric.problem]


V1 = "IB/RoCE v1"
V2 = "RoCE v2"
LL = "fe80:0000:0000:0000:4ebb:47ff:fe2c:1a0b"
A12 = "0000:0000:0000:0000:0000:ffff:c612:c80c"     # 198.18.200.12
B12 = "0000:0000:0000:0000:0000:ffff:c612:c90c"     # 198.18.201.12
ULA = "fd12:3456:789a:0000:0000:0000:0000:0013"

NCCL_GID_CASES = [
    # id, (index, gid, type)..., NCCL_IB_ADDR_RANGE (None: unset), expected index
    ("mlx5-order-v2-at-3", [(0, LL, V1), (1, LL, V2), (2, A12, V1), (3, A12, V2)], "198.18.200.0/24", 3),
    ("range-unset-first-ipv4-v2", [(0, LL, V1), (1, LL, V2), (2, A12, V1), (3, A12, V2)], None, 3),
    ("ipv6-ula-before-ipv4", [(0, LL, V1), (1, LL, V2), (2, ULA, V1), (3, A12, V1), (4, A12, V2), (5, ULA, V2)],
     "198.18.200.0/24", 4),
    # The other half's address outside the range: nothing matches, NCCL stays at GID 0 (link-local, RoCE v1).
    ("address-outside-range-stays-at-0", [(0, LL, V1), (1, LL, V2), (2, B12, V1), (3, B12, V2)], "198.18.200.0/24", 0),
    ("supernet-holds-it", [(0, LL, V1), (1, LL, V2), (2, B12, V1), (3, B12, V2)], "198.18.200.0/23", 3),
    ("v2-before-v1-keeps-v2", [(0, LL, V1), (2, A12, V2), (3, A12, V1)], "198.18.200.0/24", 2),
    ("empty-slots-skipped", [(0, LL, V1), (7, A12, V2)], "198.18.200.0/24", 7),
    ("only-link-local", [(0, LL, V1), (1, LL, V2)], "198.18.200.0/24", 0),
    ("first-ipv4-v2-in-range-wins", [(0, LL, V1), (1, B12, V2), (3, A12, V2)], "198.18.200.0/23", 1),
]


@pytest.mark.parametrize(
    "gids, addr_range, expected", [case[1:] for case in NCCL_GID_CASES], ids=[case[0] for case in NCCL_GID_CASES]
)
def test_nccl_gid_index_models_nccl(gids, addr_range, expected):
    table = [Gid(index=i, gid=g, type=t) for i, g, t in gids]
    network = ipaddress.IPv4Network(addr_range) if addr_range else None
    assert nccl_gid_index(table, network) == expected


def test_selection_without_rdma_has_no_port(layout):
    selection = _select(layout, "single_nic", "node1")
    assert (selection.members, selection.addr_range, selection.hca_ports) == ((), None, ())
    assert (selection.as_dict()["fabric_port"], selection.as_dict()["addr_range"]) == ([], None)


def test_facts_without_fabric_port_fall_back_to_the_fabric_hca(layout):
    """Facts from before this change (no fabric_port, no addr_range): the fabric interface's own RDMA ports."""
    facts = _select(layout, "spark1", "spark1").as_dict()
    del facts["fabric_port"], facts["addr_range"]
    rebuilt = FabricSelection.from_dict(facts)
    assert (rebuilt.hca_ports, rebuilt.members, rebuilt.addr_range) == (("rocep1s0f1:1",), (), None)


# ---------------------------------------------------------------------------
# fabric_expected_mtu: both halves, both ends of every link
# ---------------------------------------------------------------------------

EXPECTED_MTU_CASES = [
    # id, {host: changes}, expected_mtu, errors
    ("off-by-default", {"spark2": {TWIN: {"mtu": 1500}}}, None, []),
    ("empty-string-is-off", {}, "", []),
    ("all-9000", {}, 9000, []),
    ("jinja-string", {}, "9000", []),
    ("other-half-at-1500-on-one-end", {"spark2": {TWIN: {"mtu": 1500}}}, 9000, [
        "spark2: enP2p1s0f1np1 (the other half of fabric interface enp1s0f1np1's port) has MTU 1500, expected 9000 "
        "(fabric_expected_mtu) on both halves of the fabric port at both ends of every link; set it with "
        "`ip link set dev enP2p1s0f1np1 mtu 9000` and in the host's netplan, or change fabric_expected_mtu"]),
    ("everything-at-1500", {"spark1": {"enp1s0f1np1": {"mtu": 1500}, TWIN: {"mtu": 1500}},
                            "spark2": {"enp1s0f1np1": {"mtu": 1500}, TWIN: {"mtu": 1500}}}, 9000, [
        "spark1: fabric interface enp1s0f1np1 has MTU 1500, expected 9000 (fabric_expected_mtu)",
        "spark1: enP2p1s0f1np1 (the other half of fabric interface enp1s0f1np1's port) has MTU 1500, expected 9000",
        "spark2: fabric interface enp1s0f1np1 has MTU 1500, expected 9000",
        "spark2: enP2p1s0f1np1 (the other half of fabric interface enp1s0f1np1's port) has MTU 1500, expected 9000"]),
    # A down other half is left out of NCCL but still checked: it is at the other end of a link.
    ("down-other-half-still-checked", {"spark1": {TWIN: {"operstate": "down", "carrier": None, "mtu": 1500}}}, 9000,
     ["spark1: enP2p1s0f1np1 (the other half of fabric interface enp1s0f1np1's port) has MTU 1500, expected 9000"]),
    ("bad-value", {}, "jumbo", [
        "fabric_expected_mtu = 'jumbo': expected an MTU from 68 to 65535 (9000 for jumbo frames) or null to skip the "
        "check; fix it in group_vars"]),
    ("too-small", {}, 40, ["fabric_expected_mtu = 40: expected an MTU from 68 to 65535"]),
]


@pytest.mark.parametrize(
    "changes, expected_mtu, errors", [case[1:] for case in EXPECTED_MTU_CASES],
    ids=[case[0] for case in EXPECTED_MTU_CASES]
)
def test_check_cluster_expected_mtu(layout, changes, expected_mtu, errors):
    selections = {host: _select(layout, host, host, changes.get(host)) for host in ("spark1", "spark2")}
    found = check_cluster(selections, CIDR, ["spark1"], expected_mtu=expected_mtu)
    assert len(found) == len(errors), found
    for error, start in zip(found, errors):
        assert error.startswith(start), (error, start)
