# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller's connect to the API address (issue 17: an unreachable vllm_api_host said within seconds).

Connected and refused are real sockets on loopback; a timeout and "no route" are made by a stand-in for
socket.create_connection, since what answers an unroutable address depends on the machine running the test.
"""
from __future__ import annotations

import errno
import socket
import time
from types import SimpleNamespace

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.action import api_reach
from ansible_collections.multinode.vllm.plugins.action.api_reach import ActionModule, tcp_connect


@pytest.fixture
def listening():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def closed_port():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def _action(monkeypatch, args, check_mode=False):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    action = object.__new__(ActionModule)
    action._task = SimpleNamespace(args=args, check_mode=check_mode)
    return action


def _silent(after=None):
    """A create_connection that fails like a dropped SYN (after its timeout) or an unroutable address."""
    calls = []

    def connect(address, timeout=None):
        calls.append((address, timeout))
        if after is not None:
            raise after
        raise socket.timeout("timed out")

    return connect, calls


def test_tcp_connect_real_sockets(listening, closed_port):
    assert tcp_connect("127.0.0.1", listening, 1.0)[0] == "connected"
    assert tcp_connect("127.0.0.1", closed_port, 1.0)[0] == "refused"


CASES = [
    # id, outcome of the API port, outcome of the SSH port, failed, substrings of msg
    ("timeout-both", socket.timeout("timed out"), socket.timeout("timed out"), True,
     ["spark1: vllm_api_host = 198.18.200.12: the controller cannot connect to port 8000", "timed out after 0.2 s",
      "port 22 (SSH) does not answer either"]),
    ("timeout-api-port-only", socket.timeout("timed out"), ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
     True, ["answers on port 22 (SSH), so a firewall between the controller and the head drops port 8000"]),
    ("no-route", OSError(errno.ENETUNREACH, "Network is unreachable"), OSError(errno.ENETUNREACH, "unreachable"),
     True, ["Network is unreachable"]),
    ("refused-passes", ConnectionRefusedError(errno.ECONNREFUSED, "refused"), None, False,
     ["the controller reaches 198.18.200.12:8000 (refused)"]),
]


@pytest.mark.parametrize("api_error, ssh_error, failed, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_action_fails_in_seconds_naming_host_address_and_port(monkeypatch, api_error, ssh_error, failed, words):
    errors = iter([api_error, ssh_error])
    calls = []

    def connect(address, timeout=None):
        calls.append(address)
        raise next(errors)

    monkeypatch.setattr(api_reach.socket, "create_connection", connect)
    action = _action(monkeypatch, {"address": "198.18.200.12", "port": 8000, "timeout": 0.2, "ssh_port": 22})
    result = action.run(task_vars={"inventory_hostname": "spark1"})
    assert bool(result.get("failed")) is failed, result
    assert result["reachable"] is not failed
    for word in words:
        assert word in result["msg"], (word, result["msg"])
    # The SSH port is tried only to word a failure.
    assert calls == ([("198.18.200.12", 8000), ("198.18.200.12", 22)] if failed else [("198.18.200.12", 8000)])


def test_a_real_listener_passes_and_a_real_closed_port_passes(monkeypatch, listening, closed_port):
    for port in (listening, closed_port):
        result = _action(monkeypatch, {"address": "127.0.0.1", "port": port, "timeout": 1}).run(
            task_vars={"inventory_hostname": "spark1"})
        assert result["reachable"] is True and not result.get("failed"), result


def test_the_timeout_bounds_the_wait(monkeypatch):
    """A silent address fails after about timeout seconds per port, not readiness's 600 s."""
    def connect(address, timeout=None):
        time.sleep(timeout)
        raise socket.timeout("timed out")

    monkeypatch.setattr(api_reach.socket, "create_connection", connect)
    start = time.monotonic()
    result = _action(monkeypatch, {"address": "198.18.200.12", "port": 8000, "timeout": 0.3, "ssh_port": 22}).run(
        task_vars={"inventory_hostname": "spark1"})
    assert result["failed"] is True and result["outcome"] == "timeout"
    assert time.monotonic() - start < 1.5


def test_check_mode_warns_instead_of_failing(monkeypatch):
    connect, dummy = _silent()
    monkeypatch.setattr(api_reach.socket, "create_connection", connect)
    result = _action(monkeypatch, {"address": "198.18.200.12", "port": 8000, "timeout": 0.1}, check_mode=True).run(
        task_vars={"inventory_hostname": "spark1"})
    assert not result.get("failed") and result["reachable"] is False
    assert result["msg"].startswith("check mode: spark1: vllm_api_host = 198.18.200.12")


def test_an_empty_address_fails_without_connecting(monkeypatch):
    connect, calls = _silent()
    monkeypatch.setattr(api_reach.socket, "create_connection", connect)
    result = _action(monkeypatch, {"address": "", "port": 8000, "ssh_port": 22,
                                   "address_var": "vllm_api_host (empty: the head's management address)"}).run(
        task_vars={"inventory_hostname": "spark1"})
    assert result["failed"] is True and calls == []
    assert "spark1: vllm_api_host (empty: the head's management address) is empty" in result["msg"]
