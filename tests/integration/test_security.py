# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Security posture on the 2-node lab, proved from the outside (docs/security.md).

The root namespace is the control node on the management side. After deploy.yml (Ray part, firewall on):
every listening port of each node except SSH is unreachable on its management address, while the same ports
answer over the fabric; Ray refuses a client without the cluster token; a node whose token differs is named by
verify.yml; the bind audit passes, then fails naming a deliberate wildcard listener. The API key (401 without
it) is proved by every readiness check (roles/serve) and by the molecule scenario's completion.yml.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import LAB_INVENTORY, labctl, require_root, run_playbook

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")
NO_SERVE = ("-e", '{"serve_enabled": false}')
NODES = {"spark1": ("198.19.1.10", "198.18.200.12"), "spark2": ("198.19.2.10", "198.18.200.13")}
TOKEN = "/etc/multinode-vllm/ray-auth-token"
# A real torch TCPStore (the rendezvous vLLM starts on the head) on the native master port.
TCPSTORE = ("import time, datetime, torch.distributed as d; "
            "s = d.TCPStore('198.18.200.12', 29500, 1, True, timeout=datetime.timedelta(seconds=60)); "
            "print('listening', flush=True); time.sleep(120)")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd)"),
    pytest.mark.skipif(not (VENV / "bin" / "ray").exists(),
                       reason="node venv with Ray missing; build it with `make lab-venv`"),
]


def node_exec(node: str, *cmd: str, check: bool = True) -> str:
    return labctl("exec", node, "--", *cmd, check=check)


def listening_ports(node: str) -> set[int]:
    out = node_exec(node, "ss", "-Hltn")
    return {int(m) for m in re.findall(r"\S+:(\d+)\s+\S+:\*", out)}


def connects(address: str, port: int, timeout: float = 1.0) -> bool:
    with socket.socket() as sock:
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
            return True
        except OSError:
            return False


def connects_from(node: str, address: str, port: int) -> bool:
    code = "import socket; socket.create_connection((%r, %d), timeout=2).close()" % (address, port)
    return subprocess.run(["ip", "netns", "exec", node, "python3", "-c", code], capture_output=True,
                          check=False).returncode == 0


@pytest.fixture(scope="module")
def cluster():
    require_root()
    labctl("up", "2")
    result = run_playbook("playbooks/deploy.yml", *NO_SERVE)
    assert result.rc == 0, result.why
    yield LAB_INVENTORY
    run_playbook("playbooks/teardown.yml")


def test_nothing_but_ssh_answers_on_the_management_addresses(cluster):
    tcpstore = subprocess.Popen(["ip", "netns", "exec", "spark1", str(VENV / "bin" / "python"), "-c", TCPSTORE],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert tcpstore.stdout.readline().strip() == "listening"
        for node, (mgmt, fabric) in NODES.items():
            ports = listening_ports(node)
            # Ray's pinned ports (and, on the head, the TCPStore) really listen...
            assert {6380, 6381}.issubset(ports), (node, ports)
            if node == "spark1":
                assert {6379, 29500}.issubset(ports), ports
            for port in sorted(ports - {22}):
                # ...and none answers from the management side, whatever address it is bound to.
                assert not connects(mgmt, port), "%s: port %d answers on the management address %s" % (node, port, mgmt)
            assert connects(mgmt, 22), "%s: SSH must stay reachable" % node
        # Over the fabric, the cluster reaches the same ports (GCS, raylet, TCPStore).
        for port in (6379, 6380, 29500):
            assert connects_from("spark2", "198.18.200.12", port), port
    finally:
        tcpstore.kill()
        tcpstore.wait()


def test_ray_refuses_a_client_without_the_token(cluster):
    ray = str(VENV / "bin" / "ray")
    out = node_exec("spark2", "env", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/nonexistent", "timeout", "60", ray,
                    "status", "--address", "198.18.200.12:6379", check=False)
    # Token mode with no token at all: Ray refuses to even start the client.
    assert "RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty: /nonexistent" in out, out[-2000:]
    out = node_exec("spark2", "timeout", "60", ray, "status", "--address", "198.18.200.12:6379", check=False)
    assert "InvalidAuthToken" in out, out[-2000:]
    out = node_exec("spark2", "env", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=" + TOKEN, "timeout", "60", ray,
                    "status", "--address", "198.18.200.12:6379")
    assert "Active:" in out and len(re.findall(r"node_[0-9a-f]+", out.split("Active:", 1)[1].split("Pending:", 1)[0])) \
        == 2, out


def test_a_mismatched_token_is_named_by_verify(cluster):
    original = node_exec("spark2", "cat", TOKEN)
    node_exec("spark2", "sh", "-c", "printf '%s\\n' " + "f" * 64 + " > " + TOKEN)
    try:
        result = run_playbook("playbooks/verify.yml", "-e", "distributed_preflight_enabled=false")
        assert result.rc != 0
        flat = " ".join(result.output.split())
        assert ("spark2: its Ray token (%s) differs from the head's (spark1)" % TOKEN) in flat, result.output[-3000:]
        assert "f" * 64 not in result.output and original.strip() not in result.output
    finally:
        node_exec("spark2", "sh", "-c", "printf '%s\\n' " + original.strip() + " > " + TOKEN)


def test_bind_audit_passes_then_names_a_wildcard_listener(cluster):
    result = run_playbook("playbooks/verify.yml", "-e", "distributed_preflight_enabled=false")
    assert result.rc == 0, result.why
    assert "none on a wrong address" in result.output
    # A deliberate cluster-looking listener on 0.0.0.0 (its command line names torch).
    rogue = subprocess.Popen(["ip", "netns", "exec", "spark2", "python3", "-c",
                              "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29777)); s.listen(); "
                              "print('up', flush=True); time.sleep(120)", "torch"], stdout=subprocess.PIPE, text=True)
    try:
        assert rogue.stdout.readline().strip() == "up"
        result = run_playbook("playbooks/verify.yml", "-e", "distributed_preflight_enabled=false")
        assert result.rc != 0
        flat = " ".join(result.output.split())
        assert re.search(r"spark2: python3 \(pid %d\) listens on 0\.0\.0\.0:29777, a wildcard" % rogue.pid, flat), \
            result.output[-3000:]
    finally:
        rogue.kill()
        rogue.wait()
