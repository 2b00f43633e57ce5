# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric_probe as Ansible runs it, for real over loopback: a detached listener, the probe, the stop."""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from ansible_collections.multinode.vllm.plugins.modules import fabric_probe

LO = "127.0.0.1"
TOKEN = "t0ken"

pytestmark = pytest.mark.skipif(shutil.which("ip") is None, reason="the probe phase runs `ip -j route get`")


def _free_port():
    while True:
        with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            tcp.bind((LO, 0))
            port = tcp.getsockname()[1]
            try:
                udp.bind((LO, port))
            except OSError:
                continue
            return port


def _listening(port):
    try:
        socket.create_connection((LO, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _wait_closed(port, seconds=2.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _listening(port):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def run(run_main):
    return lambda args: run_main(fabric_probe.main, args)


@pytest.fixture
def port(run):
    port = _free_port()
    yield port
    run({"phase": "stop", "host": "spark1", "fabric_ip": LO, "port": port})


def _listen(run, port, lifetime=20.0):
    return run({"phase": "listen", "host": "spark1", "fabric_ip": LO, "port": port, "listen_seconds": lifetime,
                "peers": [{"host": "spark2", "fabric_ip": LO}], "token": TOKEN})


def test_listen_probe_and_the_listener_leaves(run, port):
    code, listened = _listen(run, port)
    assert code == 0 and listened["changed"] is False
    assert isinstance(listened["listener_pid"], int) and listened["listener_pid"] > 0
    assert _listening(port)

    code, probed = run({"phase": "probe", "host": "spark2", "fabric_ip": LO, "fabric_interface": "lo", "mtu": 1500,
                        "port": port, "timeout": 1.0, "mgmt_timeout": 0.5, "token": TOKEN,
                        "peers": [{"host": "spark1", "fabric_ip": LO, "mgmt_ip": LO}]})
    assert code == 0 and probed["problems"] == []
    peer = probed["peers"][0]
    assert peer["route"] == {"dev": "lo", "src": LO, "ok": True, "error": None}
    assert (peer["tcp"]["ok"], peer["tcp"]["answered_by"]) == (True, "spark1")
    assert peer["mtu"] == {"ok": True, "mtu": 1500, "payload": 1472, "error": None}
    assert peer["mgmt"]["address"] == LO
    # spark2 was the only expected peer: its DONE ends the listener.
    assert _wait_closed(port), "the listener kept running after every peer was done"


def test_probe_with_route_off_the_fabric_interface(run, port):
    """`ip route get 127.0.0.1` says dev lo; claiming the fabric is eth9 is a broken pair, named."""
    _listen(run, port)
    code, probed = run({"phase": "probe", "host": "spark2", "fabric_ip": LO, "fabric_interface": "eth9", "mtu": 1500,
                        "port": port, "timeout": 1.0, "peers": [{"host": "spark1", "fabric_ip": LO}], "token": TOKEN})
    assert code == 0
    assert probed["problems"] == ["spark2 -> spark1 (127.0.0.1): route leaves through lo, not the fabric interface eth9"]


def test_stop_phase(run, port):
    _listen(run, port)
    code, stopped = run({"phase": "stop", "host": "spark1", "fabric_ip": LO, "port": port})
    assert (code, stopped["changed"], stopped["stopped"]) == (0, False, True)
    assert _wait_closed(port)
    code, again = run({"phase": "stop", "host": "spark1", "fabric_ip": LO, "port": port})
    assert (code, again["stopped"]) == (0, False)


def test_listen_on_an_address_the_host_lacks(run):
    code, result = run({"phase": "listen", "host": "spark1", "fabric_ip": "192.0.2.1", "port": _free_port(),
                        "token": TOKEN})
    assert code == 1
    assert result["msg"].startswith("spark1: cannot listen on 192.0.2.1:")
    assert "this host does not carry 192.0.2.1" in result["msg"]


def test_probe_requires_interface_and_mtu(run):
    code, result = run({"phase": "probe", "host": "spark2", "fabric_ip": LO, "peers": []})
    assert code == 1
    assert "fabric_interface" in result["msg"] and "mtu" in result["msg"]


@pytest.mark.parametrize("phase", ["listen", "probe", "listen_probe"])
def test_every_phase_that_listens_or_says_done_requires_the_token(run, phase):
    """Without this run's token a listener could not tell its peers' DONE from anyone's."""
    code, result = run({"phase": phase, "host": "spark2", "fabric_ip": LO, "fabric_interface": "lo", "mtu": 1500,
                        "port": _free_port(), "peers": []})
    assert code == 1 and "token" in result["msg"]


def test_the_token_is_never_in_the_result(run, port):
    code, listened = _listen(run, port)
    assert code == 0 and TOKEN not in json.dumps(listened)
