# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fabric model, fed with host layouts written from real machines (fixtures/networks.yml)."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import (
    FabricError,
    FabricSelection,
    Gid,
    RdmaPort,
    check_cluster,
    check_inventory,
    parse_cidr,
    parse_network,
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
