# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The firewall model: what the rendered table allows, and every bad input named before anything changes."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError
from ansible_collections.multinode.vllm.plugins.module_utils._firewall import (
    FirewallError,
    boot_unit,
    build_spec,
    check_spec,
    cluster_ips,
    normalise_listing,
    render_ruleset,
    replace_script,
)

CIDR = "198.18.200.0/24"


def _data(**changes):
    data = dict(
        host="spark1",
        fabric_interface="enp1s0f1np1",
        fabric_cidr=CIDR,
        cluster={"spark1": "198.18.200.12", "spark2": "198.18.200.13"},
        mgmt_interface="eth0",
        mgmt_allow_tcp=[22, 8000],
        controller_port=22,
        allow_sources=[],
        allow_icmp=True,
        log_drops=False,
    )
    data.update(changes)
    return data


def _rules(text):
    """The rule lines of the input chain."""
    body = text.split("chain input {\n", 1)[1].split("\n\t}\n", 1)[0]
    return [line.strip() for line in body.splitlines()]


def _errors(**changes):
    spec, errors = check_spec(_data(**changes))
    assert spec is None and errors
    return errors


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def test_ruleset_replaces_only_its_own_table_in_one_file():
    text = render_ruleset(build_spec(_data()))
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    # Declare (so delete never fails), delete, declare in full: one nft transaction.
    assert lines[:3] == ["table inet multinode_vllm {}", "delete table inet multinode_vllm", "table inet multinode_vllm {"]
    assert "flush ruleset" not in text
    assert {line.split("{")[0].strip() for line in lines if line.startswith("table")} == {"table inet multinode_vllm"}


def test_policy_is_drop_and_the_rules_allow_exactly_the_issue_list():
    rules = _rules(render_ruleset(build_spec(_data())))
    assert rules[0] == "type filter hook input priority filter; policy drop;"
    assert rules[1].startswith("ct state established,related accept")
    assert rules[2] == "ct state invalid drop"
    assert rules[3] == 'iif "lo" accept'
    assert rules[4].startswith('iifname "enp1s0f1np1" ip saddr { 198.18.200.12, 198.18.200.13 } accept')
    assert rules[5].startswith('iifname "eth0" tcp dport { 22, 8000 } accept')
    assert rules[-1] == 'counter name "dropped" drop'
    # Every accept is bound to an interface, a conntrack state, ICMP or an IPv6 link-local source: nothing else open.
    for rule in rules:
        if "accept" in rule:
            assert rule.startswith(("ct state", 'iif "lo"', 'iifname "eth0"', 'iifname "enp1s0f1np1"', "icmp",
                                    "ip6 saddr fe80::/10 ")), rule
    # IPv6 management links: MLD queries and DHCPv6 replies, from link-local addresses only.
    assert "icmpv6 type mld-listener-query ip6 saddr fe80::/10 accept" in rules
    assert "ip6 saddr fe80::/10 udp sport 547 udp dport 546 accept" in rules


def test_worker_without_api_port_and_single_port_is_not_a_set():
    rules = _rules(render_ruleset(build_spec(_data(mgmt_allow_tcp=[22]))))
    assert 'iifname "eth0" tcp dport 22 accept comment "management: SSH and API ports"' in rules
    assert not any("8000" in rule for rule in rules)


def test_ports_are_sorted_deduplicated_and_accept_strings_from_jinja():
    spec = build_spec(_data(mgmt_allow_tcp=["8000", 22, 22], controller_port="22"))
    assert spec.mgmt_tcp_ports == (22, 8000)


def test_cluster_addresses_are_sorted_by_address_not_host_name():
    spec = build_spec(_data(cluster={"b": "198.18.200.9", "a": "198.18.200.10", "c": "198.18.200.2"}))
    assert [str(pair[1]) for pair in spec.cluster] == ["198.18.200.2", "198.18.200.9", "198.18.200.10"]
    assert "{ 198.18.200.2, 198.18.200.9, 198.18.200.10 }" in render_ruleset(spec)


def test_extra_sources_icmp_and_drop_log():
    spec = build_spec(
        _data(
            allow_sources=["198.19.1.50", {"src": "10.9.0.0/16", "tcp_ports": [9100]}, "2001:db8::7"],
            allow_icmp=False,
            log_drops=True,
            log_rate="3/second",
        )
    )
    rules = _rules(render_ruleset(spec))
    assert 'iifname "eth0" ip saddr 198.19.1.50 accept comment "extra source"' in rules
    assert 'iifname "eth0" ip saddr 10.9.0.0/16 tcp dport 9100 accept comment "extra source"' in rules
    assert 'iifname "eth0" ip6 saddr 2001:db8::7 accept comment "extra source"' in rules
    assert not any("echo-request" in rule for rule in rules)
    assert any(rule.startswith("icmpv6 type { nd-neighbor-solicit") for rule in rules)  # IPv6 keeps working
    assert rules[-2] == 'limit rate 3/second burst 5 packets log prefix "multinode_vllm drop: " level info'


def test_icmp_on_by_default_and_no_log():
    rules = _rules(render_ruleset(build_spec(_data())))
    assert "icmp type echo-request accept" in rules
    assert not any(rule.startswith("limit") for rule in rules)


def test_comments_fit_nft_limit_for_a_big_cluster():
    cluster = {"spark%d" % i: "198.18.200.%d" % (10 + i) for i in range(1, 65)}
    text = render_ruleset(build_spec(_data(cluster=cluster, controller_port=22)))
    for comment in text.split('comment "')[1:]:
        assert len(comment.split('"', 1)[0].encode()) <= 128


# ---------------------------------------------------------------------------
# Validation: each message names host, value, expectation, fix
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(mgmt_allow_tcp=[22, 70000]), ["spark1", "70000", "1-65535", "firewall_mgmt_allow_tcp"]),
        (dict(mgmt_allow_tcp=[0, 22]), ["spark1", "0", "1-65535"]),
        (dict(mgmt_allow_tcp=[22, True]), ["True", "1-65535"]),
        (dict(mgmt_allow_tcp=["ssh"]), ["'ssh'", "1-65535"]),
        (dict(mgmt_allow_tcp="22"), ["'22'", "list of TCP ports"]),
        (dict(mgmt_allow_tcp=[]), ["empty", "lock", "[22]"]),
        (dict(mgmt_allow_tcp=[8000]), ["does not contain 22", "lock the controller out", "add 22"]),
        (dict(cluster={"spark1": "198.18.200.12", "spark2": "10.0.0.5"}), ["spark2", "10.0.0.5", CIDR, "host_vars/spark2.yml"]),
        (dict(cluster={"spark1": "198.18.200.12", "spark2": None}), ["spark2", "no fabric address", "fabric role"]),
        (dict(cluster={"spark1": "198.18.200.12", "spark2": "not-an-ip"}), ["spark2", "'not-an-ip'", "IPv4"]),
        (dict(cluster={"spark1": "198.18.200.12", "spark2": "198.18.200.12"}), ["spark1 and spark2", "198.18.200.12"]),
        (dict(cluster={}), ["{}", "firewall_cluster_hosts"]),
        (dict(fabric_cidr="junk"), ["'junk'", "fabric_cidr", "IPv4 network"]),
        (dict(fabric_interface=None), ["firewall_fabric_interface", "None", "fabric role"]),
        (dict(mgmt_interface=""), ["firewall_mgmt_interface", "host_vars/spark1.yml"]),
        (dict(mgmt_interface='eth0" accept'), ["'eth0\" accept'", "interface name"]),
        (dict(mgmt_interface="a-very-long-interface-name"), ["a-very-long-interface-name", "1-15"]),
        (dict(mgmt_interface="enp1s0f1np1"), ["both enp1s0f1np1", "two networks"]),
        (dict(allow_sources=["0.0.0.0/0"]), ["0.0.0.0/0", "whole Internet", "firewall_mgmt_allow_tcp"]),
        (dict(allow_sources=["monitor"]), ["'monitor'", "IP address or network"]),
        (dict(allow_sources=[{"source": "1.2.3.4"}]), ["source", "{src: 198.19.1.50"]),
        (dict(allow_sources=[{"src": "1.2.3.4", "tcp_ports": [99999]}]), ["99999", "1-65535"]),
        (dict(allow_sources="1.2.3.4"), ["'1.2.3.4'", "expected a list"]),
        (dict(allow_icmp="yes"), ["firewall_allow_icmp", "'yes'", "true or false"]),
        (dict(log_rate="fast"), ["firewall_log_rate", "'fast'", "N/minute"]),
    ],
)
def test_bad_input_is_named(changes, words):
    message = "\n".join(_errors(**changes))
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    "entry",
    [
        {"src": "198.19.1.50", "tcp_ports": []},
        {"src": "198.19.1.0/24", "tcp_ports": None},
        {"src": "198.19.1.50", "tcp_ports": ""},
        {"src": "198.19.1.50", "tcp_ports": ()},
    ],
    ids=["empty-list", "null", "empty-string", "empty-tuple"],
)
def test_an_empty_tcp_ports_is_refused_not_rendered_as_every_port(entry):
    """Issue 17: `tcp_ports: []` used to render `iifname "eth0" ip saddr X accept`, every port from X."""
    message = "\n".join(_errors(allow_sources=[entry]))
    for word in ("spark1: firewall_allow_sources entry", str(entry["src"]), "tcp_ports = %r" % (entry["tcp_ports"],),
                 "at least one TCP port", "every port", "leave tcp_ports out"):
        assert word in message, (word, message)


@pytest.mark.parametrize(
    "entry, rule",
    [
        ("198.19.1.50", 'iifname "eth0" ip saddr 198.19.1.50 accept comment "extra source"'),
        ({"src": "198.19.1.50"}, 'iifname "eth0" ip saddr 198.19.1.50 accept comment "extra source"'),
        ({"src": "198.19.1.50", "tcp_ports": [9100]},
         'iifname "eth0" ip saddr 198.19.1.50 tcp dport 9100 accept comment "extra source"'),
    ],
    ids=["plain-string-every-port", "no-tcp-ports-every-port", "one-port"],
)
def test_every_port_only_when_tcp_ports_is_left_out(entry, rule):
    assert rule in _rules(render_ruleset(build_spec(_data(allow_sources=[entry]))))


def test_every_problem_is_reported_at_once():
    errors = _errors(mgmt_allow_tcp=[99999, 22], cluster={"spark1": "198.18.200.12", "spark2": "10.1.1.1"},
                     mgmt_interface="")
    assert len(errors) == 3
    with pytest.raises(FirewallError) as caught:
        build_spec(_data(mgmt_allow_tcp=[99999, 22]))
    assert "99999" in str(caught.value)


def test_no_controller_port_means_no_lockout_check():
    assert build_spec(_data(controller_port=None, mgmt_allow_tcp=[2222])).mgmt_tcp_ports == (2222,)


# ---------------------------------------------------------------------------
# Cluster addresses from hostvars, filters, listings
# ---------------------------------------------------------------------------


def test_cluster_ips_prefers_facts_then_inventory():
    hostvars = {
        "spark1": {"multinode_fabric": {"ip": "198.18.200.12"}, "fabric_ip": "198.18.200.99"},
        "spark2": {"fabric_ip": "198.18.200.13"},
        "spark3": {},
    }
    assert cluster_ips(hostvars, ["spark1", "spark2", "spark3", "ghost"]) == {
        "spark1": "198.18.200.12",
        "spark2": "198.18.200.13",
        "spark3": None,
        "ghost": None,
    }


def test_normalise_listing_ignores_traffic_counts_only():
    one = "table inet t {\n\tcounter dropped {\n\t\tpackets 12 bytes 3400\n\t}\n\n\tchain input {\n\t}\n}\n"
    two = one.replace("packets 12 bytes 3400", "packets 0 bytes 0")
    assert normalise_listing(one) == normalise_listing(two)
    assert normalise_listing(one) != normalise_listing(one.replace("dropped", "other"))
    assert normalise_listing(None) == "" == normalise_listing("")


def test_replace_script_restores_or_removes():
    assert replace_script("t", None) == "table inet t {}\ndelete table inet t\n"
    assert replace_script("t", "table inet t {\n}\n").endswith("delete table inet t\ntable inet t {\n}\n")


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None, reason="needs nft and unshare")
def test_rendered_ruleset_loads_in_a_scratch_namespace():
    """nft itself accepts what we render (in a throwaway network namespace, never the host's)."""
    text = render_ruleset(build_spec(_data(allow_sources=["198.19.1.50", "2001:db8::/64"], log_drops=True)))
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'printf %s "$1" | nft -f - && nft list table inet multinode_vllm', "sh", text],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0 and "unshare" in proc.stderr:
        pytest.skip("cannot make a network namespace here: %s" % proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    assert 'iifname "eth0" tcp dport { 22, 8000 } accept' in proc.stdout
    assert "policy drop;" in proc.stdout


def _unit_keys(text):
    keys = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            keys.setdefault(key, []).append(value)
    return keys


def test_boot_unit_loads_the_kept_table_before_the_network_and_the_cluster():
    keys = _unit_keys(boot_unit("/etc/multinode-vllm/firewall/multinode_vllm.nft"))
    assert keys["ExecStart"] == ["/usr/sbin/nft -f /etc/multinode-vllm/firewall/multinode_vllm.nft"]
    assert keys["Type"] == ["oneshot"] and keys["RemainAfterExit"] == ["yes"]
    assert keys["DefaultDependencies"] == ["no"]
    before = keys["Before"][0].split()
    assert {"network-pre.target", "docker.service", "multinode-ray.service", "multinode-vllm.service"} <= set(before)
    # issue 17: after Debian's nftables.service (its /etc/nftables.conf flushes the ruleset) and firewalld.
    assert set(keys["After"][0].split()) == {"nftables.service", "firewalld.service"}
    # Closed, not open: the systemd runtime's units need it; Docker is ordered after it only.
    assert keys["RequiredBy"] == ["multinode-ray.service multinode-vllm.service"]
    assert keys["WantedBy"] == ["sysinit.target"]
    # A missing file must fail the load (and so the cluster's units), not skip it.
    assert "ConditionPathExists" not in keys


@pytest.mark.parametrize("path, nft", [("relative.nft", "/usr/sbin/nft"), ("/etc/a b.nft", "/usr/sbin/nft"),
                                       ("/etc/50%.nft", "/usr/sbin/nft"), ("/etc/x.nft", "nft")])
def test_boot_unit_refuses_paths_systemd_would_read_otherwise(path, nft):
    with pytest.raises(FirewallError, match="absolute path"):
        boot_unit(path, nft)


@pytest.mark.skipif(not shutil.which("systemd-analyze") or not shutil.which("nft"), reason="needs systemd-analyze, nft")
def test_boot_unit_passes_systemd_analyze_verify(tmp_path):
    kept = tmp_path / "multinode_vllm.nft"
    kept.write_text(render_ruleset(build_spec(_data())))
    unit = tmp_path / "multinode-vllm-firewall.service"
    unit.write_text(boot_unit(str(kept), shutil.which("nft")))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    # An unknown key or a bad value is only a warning naming the file (the exit status stays 0).
    assert str(unit) not in proc.stderr, proc.stderr


def test_a_bad_spec_is_a_firewall_error_not_a_fabric_error():
    """Issue 18: a firewall input refused is a FirewallError (even when the fabric_cidr is what is wrong)."""
    with pytest.raises(FirewallError) as caught:
        build_spec(_data(fabric_cidr="not-a-cidr"))
    assert not isinstance(caught.value, FabricError) and "not-a-cidr" in str(caught.value)
