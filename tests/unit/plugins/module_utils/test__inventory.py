# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory checks of the first gate (issue 17: bad inventory that must fail early, naming host and value)."""

from __future__ import annotations

import errno
import os
import socket

import pytest
import yaml

from ansible_collections.multinode.vllm.plugins.filter._inventory_errors import inventory_errors
from ansible_collections.multinode.vllm.plugins.module_utils import _inventory
from ansible_collections.multinode.vllm.plugins.module_utils._inventory import (
    api_reach_error,
    check_groups,
    check_host,
    check_inventory,
    connect_outcome,
)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))


def _yaml(*parts):
    with open(os.path.join(ROOT, *parts)) as handle:
        return yaml.safe_load(handle) or {}


def _check(errors, expected):
    assert len(errors) == len(expected), errors
    for error, substrings in zip(errors, expected):
        assert all(s in error for s in substrings), (error, substrings)


# ---------------------------------------------------------------------------
# The groups
# ---------------------------------------------------------------------------

GROUP_CASES = [
    # id, heads, workers, expected substrings per error
    ("head-only-in-ray_head", ["spark1"], ["spark2", "spark3"], []),
    ("no-workers", ["spark1"], [], []),
    ("head-also-a-worker", ["spark1"], ["spark1", "spark2"],
     [["spark1: in ray_head and in ray_workers", "expected the head in group ray_head only",
       "remove spark1 from group ray_workers"]]),
]


@pytest.mark.parametrize("heads, workers, expected", [c[1:] for c in GROUP_CASES], ids=[c[0] for c in GROUP_CASES])
def test_check_groups(heads, workers, expected):
    _check(check_groups(heads, workers), expected)


# ---------------------------------------------------------------------------
# One host's variables: Ray's port layout, the API port and address, fabric_ip vs ansible_host
# ---------------------------------------------------------------------------

HOST_CASES = [
    # id, hostvars, is_head, expected substrings per error (in order)
    ("defaults-head", {}, True, []),
    ("defaults-worker", {}, False, []),
    ("lab-head", {"ansible_host": "198.19.1.10", "fabric_ip": "198.18.200.12", "vllm_backend": "ray"}, True, []),
    ("moved-range-and-api", {"ray_ports": {"min_worker_port": 20000, "max_worker_port": 29000},
                             "vllm_api_port": 18000}, True, []),
    ("ports-as-strings-from-jinja", {"ray_ports": {"min_worker_port": "12000"}, "vllm_api_port": "8000",
                                     "ray_gcs_port": "6379"}, True, []),
    ("range-unpinned-is-rays-default", {"ray_ports": {"min_worker_port": None, "max_worker_port": None}}, True, []),
    ("min-above-max", {"ray_ports": {"min_worker_port": 20000}}, False,
     [["spark1: ray_ports.min_worker_port = 20000 > ray_pinned_ports.max_worker_port = 19999",
       "expected min_worker_port <= max_worker_port", "fix ray_ports"]]),
    ("min-above-ray-default-max", {"ray_pinned_ports": {"min_worker_port": 25000}}, False,
     [["ray_pinned_ports.min_worker_port = 25000 > max_worker_port (Ray's default) = 19999"]]),
    ("client-port-inside-range", {"ray_ports": {"ray_client_server_port": 15000}}, True,
     [["spark1: ray_ports.ray_client_server_port = 15000: inside Ray's worker port range 10002-19999",
       "choose a port outside the range", "move the range with ray_ports"]]),
    ("client-port-head-only", {"ray_ports": {"ray_client_server_port": 15000}}, False, []),
    ("range-moved-over-the-client-port", {"ray_ports": {"min_worker_port": 10000}}, True,
     [["ray_pinned_ports.ray_client_server_port = 10001: inside Ray's worker port range 10000-19999"]]),
    ("api-port-inside-range", {"vllm_api_port": 12000}, True,
     [["spark1: vllm_api_port = 12000: inside Ray's worker port range 10002-19999",
       "when vLLM binds the API on the head", "(default 8000)"]]),
    ("api-port-inside-range-native-backend-has-no-ray", {"vllm_api_port": 12000, "vllm_backend": "native"},
     True, []),
    ("api-port-read-on-the-head-only", {"vllm_api_port": 12000}, False, []),
    ("api-port-not-a-port", {"vllm_api_port": "http"}, True,
     [["spark1: vllm_api_port = 'http': expected a TCP port 1-65535", "fix vllm_api_port"]]),
    ("api-port-out-of-range", {"vllm_api_port": 70000}, True, [["vllm_api_port = 70000", "1-65535"]]),
    ("api-port-is-the-gcs-port", {"vllm_api_port": 6379}, True,
     [["spark1: ray_gcs_port = vllm_api_port = 6379: expected a different port for each", "change all but one"]]),
    ("two-ray-ports-shared", {"ray_ports": {"object_manager_port": 6380}}, False,
     [["ray_pinned_ports.node_manager_port = ray_ports.object_manager_port = 6380"]]),
    ("port-not-a-number", {"ray_ports": {"min_worker_port": "low"}}, False,
     [["spark1: ray_ports.min_worker_port = 'low': expected a TCP port 1-65535", "fix ray_ports"]]),
    ("unknown-ray-port", {"ray_ports": {"gcs_port": 7000}}, False,
     [["spark1: ray_ports.gcs_port = 7000: expected one of Ray's port settings", "min_worker_port",
       "fix the name in ray_ports"]]),
    ("ray-ports-not-a-mapping", {"ray_ports": [10002, 19999]}, False,
     [["spark1: ray_ports = [10002, 19999]: expected a mapping", "{min_worker_port: 20000}"]]),
    ("dashboard-port-in-range-without-dashboard", {"ray_ports": {"dashboard_port": 12000}}, True, []),
    ("dashboard-port-in-range-with-dashboard", {"ray_ports": {"dashboard_port": 12000},
                                                "ray_include_dashboard": True}, True,
     [["ray_ports.dashboard_port = 12000: inside Ray's worker port range"]]),
    ("gcs-port-inside-range", {"ray_gcs_port": 11000}, True,
     [["spark1: ray_gcs_port = 11000: inside Ray's worker port range 10002-19999"]]),
    ("fabric-ip-is-ansible-host", {"ansible_host": "198.19.1.10", "fabric_ip": "198.19.1.10"}, False,
     [["spark1: fabric_ip = 198.19.1.10 = ansible_host, the management address Ansible connects to",
       "expected a fabric address apart from management", "host_vars/spark1.yml"]]),
    ("ansible-host-a-name", {"ansible_host": "spark1.lab", "fabric_ip": "198.18.200.12"}, False, []),
    ("api-host-unspecified", {"vllm_api_host": "0.0.0.0"}, True,
     [["spark1: vllm_api_host = 0.0.0.0: expected one address of the head that the controller reaches",
       "this unspecified address is the controller itself, not the head", "leave vllm_api_host empty"]]),
    ("api-host-loopback", {"vllm_api_host": "127.0.0.1"}, True, [["vllm_api_host = 127.0.0.1", "loopback"]]),
    ("api-host-v6-unspecified", {"vllm_api_host": "::"}, True, [["vllm_api_host = ::", "unspecified"]]),
    ("api-host-multicast", {"vllm_api_host": "239.1.1.1"}, True,
     [["vllm_api_host = 239.1.1.1", "a multicast address takes no TCP connection"]]),
    ("api-host-not-a-name", {"vllm_api_host": "head node"}, True,
     [["vllm_api_host = 'head node': expected an IP address or a host name"]]),
    ("api-host-a-name", {"vllm_api_host": "api.spark.example"}, True, []),
    ("api-host-mgmt", {"vllm_api_host": "198.19.1.10"}, True, []),
    ("api-host-read-on-the-head-only", {"vllm_api_host": "0.0.0.0"}, False, []),
    ("several-at-once", {"ray_ports": {"min_worker_port": 30000}, "vllm_api_port": "x", "vllm_api_host": "::1"},
     True, [["min_worker_port = 30000 > "], ["vllm_api_port = 'x'"], ["vllm_api_host = ::1"]]),
]


@pytest.mark.parametrize("hv, is_head, expected", [c[1:] for c in HOST_CASES], ids=[c[0] for c in HOST_CASES])
def test_check_host(hv, is_head, expected):
    _check(check_host("spark1", hv, is_head), expected)


def test_every_host_is_listed_at_once_through_the_filter():
    hostvars = {
        "spark1": {"vllm_api_port": 12000, "ansible_host": "198.19.1.10", "unrelated": object()},
        "spark2": {"ray_ports": {"min_worker_port": 20000}},
        "spark3": {},
    }
    errors = inventory_errors(hostvars, ["spark1", "spark2", "spark3"], ["spark1"], ["spark1", "spark2", "spark3"])
    _check(errors, [["spark1: in ray_head and in ray_workers"], ["spark1: vllm_api_port = 12000"],
                    ["spark2: ray_ports.min_worker_port = 20000 >"]])


def test_the_lab_inventory_is_valid():
    """make demo's inventory passes (its group_vars and host_vars as hostvars; role defaults elsewhere)."""
    base = _yaml("inventories", "lab", "group_vars", "all.yml")
    hosts = _yaml("inventories", "lab", "hosts.yml")["all"]["children"]["vllm_cluster"]["children"]
    heads, workers = list(hosts["ray_head"]["hosts"]), list(hosts["ray_workers"]["hosts"])
    hostvars = {h: dict(base, **_yaml("inventories", "lab", "host_vars", h + ".yml")) for h in heads + workers}
    assert inventory_errors(hostvars, heads + workers, heads, workers) == []
    assert check_inventory(hostvars, heads, workers) == []


def test_defaults_repeated_here_are_the_roles_defaults():
    ray = _yaml("roles", "ray", "defaults", "main.yml")
    serve = _yaml("roles", "serve", "defaults", "main.yml")
    cluster = _yaml("roles", "cluster", "defaults", "main.yml")
    assert dict(_inventory.RAY_PINNED_PORTS) == ray["ray_pinned_ports"]
    assert _inventory.RAY_GCS_PORT == cluster["ray_gcs_port"]
    assert (ray["ray_pinned_ports"]["min_worker_port"], ray["ray_pinned_ports"]["max_worker_port"]) == \
        _inventory.RAY_DEFAULT_WORKER_RANGE
    assert _inventory.VLLM_API_PORT == serve["vllm_api_port"]
    assert _inventory.VLLM_BACKEND == cluster["vllm_backend"]
    assert not ray["ray_ports"] and serve["vllm_api_host"] == ""


# ---------------------------------------------------------------------------
# The controller's connect to the API address: outcome and message
# ---------------------------------------------------------------------------

OUTCOME_CASES = [
    ("connected", None, "connected"),
    ("refused", ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "refused"),
    ("socket-timeout", socket.timeout("timed out"), "timeout"),
    ("timeout-error", TimeoutError("timed out"), "timeout"),
    ("no-route", OSError(errno.ENETUNREACH, "Network is unreachable"), "unreachable"),
    ("host-unreachable", OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable"),
    ("unresolved", socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "unresolved"),
    ("other", OSError(errno.EACCES, "Permission denied"), "error"),
]


@pytest.mark.parametrize("error, outcome", [c[1:] for c in OUTCOME_CASES], ids=[c[0] for c in OUTCOME_CASES])
def test_connect_outcome(error, outcome):
    assert connect_outcome(error)[0] == outcome


REACH_CASES = [
    # id, kwargs, expected substrings (None: reachable)
    ("connected", dict(outcome="connected", detail="connected"), None),
    ("refused-is-reachable", dict(outcome="refused", detail="connection refused"), None),
    ("timeout-nothing-answers", dict(outcome="timeout", detail="timed out", ssh_port=22, ssh_outcome="timeout"),
     ["spark1: vllm_api_host = 198.18.200.12: the controller cannot connect to port 8000 (vllm_api_port)",
      "timed out after 3 s", "port 22 (SSH) does not answer either", "readiness polls the API from the controller",
      "set vllm_api_host"]),
    ("timeout-only-the-port", dict(outcome="timeout", detail="timed out", ssh_port=22, ssh_outcome="refused"),
     ["answers on port 22 (SSH), so a firewall between the controller and the head drops port 8000",
      "let port 8000 through"]),
    ("no-route", dict(outcome="unreachable", detail="Network is unreachable (the controller has no way there)"),
     ["cannot connect to port 8000", "Network is unreachable"]),
    ("unresolved", dict(address="api.nowhere", outcome="unresolved", detail="does not resolve on the controller"),
     ["vllm_api_host = api.nowhere", "does not resolve on the controller"]),
    ("no-address", dict(address="", outcome="error", detail="no address"),
     ["spark1: vllm_api_host is empty", "no management address", "set vllm_api_host"]),
]


@pytest.mark.parametrize("kwargs, expected", [c[1:] for c in REACH_CASES], ids=[c[0] for c in REACH_CASES])
def test_api_reach_error(kwargs, expected):
    args = dict(head="spark1", address="198.18.200.12", address_var="vllm_api_host", port=8000, timeout=3.0)
    args.update(kwargs)
    message = api_reach_error(**args)
    if expected is None:
        assert message is None
    else:
        assert message is not None
        for word in expected:
            assert word in message, (word, message)
