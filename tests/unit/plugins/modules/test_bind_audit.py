# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bind_audit for real: listeners in a network namespace of our own, the module run inside it as Ansible runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.modules import bind_audit

FABRIC = "10.77.1.2"
MODULE = bind_audit.__file__
# The directory holding ansible_collections/ (through the .cache symlink, as the import found it).
COLLECTIONS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(MODULE))))))

# Binds, prints "pid port", then holds the socket until stdin closes.
LISTENER = """
import os, socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
sock = socket.socket(family)
sock.bind((sys.argv[1], 0))
sock.listen()
print(os.getpid(), sock.getsockname()[1], flush=True)
sys.stdin.read()
"""


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _netns_unavailable():
    if os.geteuid() != 0:
        return "needs root to create a network namespace (ip netns add)"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip netns)"
    probe = _ip("netns", "list")
    if probe.returncode != 0:
        return "ip netns is unavailable here: %s" % probe.stderr.strip()
    return None


pytestmark = pytest.mark.skipif(_netns_unavailable() is not None, reason=str(_netns_unavailable()))


@pytest.fixture
def netns():
    name = "mvaudit-%d" % os.getpid()
    steps = [
        ("netns", "add", name),
        ("-n", name, "link", "set", "lo", "up"),
        # A veth pair inside the namespace carries the fabric-like address (no dummy module needed).
        ("-n", name, "link", "add", "fab0", "type", "veth", "peer", "name", "fab1"),
        ("-n", name, "addr", "add", FABRIC + "/24", "dev", "fab0"),
        ("-n", name, "link", "set", "fab0", "up"),
        ("-n", name, "link", "set", "fab1", "up"),
    ]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip("cannot set up network namespace %s: ip %s: %s" % (name, " ".join(step), done.stderr))
        yield name
    finally:
        _ip("netns", "del", name)


@pytest.fixture
def listen(netns):
    started = []

    def start(address, tag):
        # The tag is an argument, so it shows in the command line the audit's patterns look at.
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", LISTENER, address, tag],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline().split()
        assert len(line) == 2, "listener on %s did not start (exit %s)" % (address, proc.poll())
        return int(line[0]), int(line[1])

    yield start
    for proc in started:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_module(netns, tmp_path, args):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    # This interpreter's path too: ansible may be there only (ansible-test units puts it on PYTHONPATH, not in the venv).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([COLLECTIONS] + [p for p in sys.path if p]))
    done = subprocess.run(["ip", "netns", "exec", netns, sys.executable, MODULE, str(path)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.stdout, "module printed nothing (exit %d): %s" % (done.returncode, done.stderr)
    return done.returncode, json.loads(done.stdout)


def test_wildcard_listener_is_a_violation_in_its_own_namespace(netns, listen, tmp_path):
    fabric_pid, fabric_port = listen(FABRIC, "mvaudit-cluster")
    wild_pid, wild_port = listen("0.0.0.0", "mvaudit-cluster")
    lo_pid, lo_port = listen("127.0.0.1", "mvaudit-cluster")
    wild6_pid, wild6_port = listen("::", "mvaudit-cluster")
    other_pid, other_port = listen("0.0.0.0", "mvaudit-unrelated")

    code, result = _run_module(netns, tmp_path, {"fabric_ip": FABRIC, "host": "mvnode", "patterns": ["mvaudit-cluster"]})

    assert code == 1 and result["failed"] is True
    by_port = {item["port"]: item for item in result["listeners"]}
    # Only this namespace's sockets: ours, nothing of the host's.
    assert set(by_port) == {fabric_port, wild_port, lo_port, wild6_port, other_port}
    for port, pid in ((fabric_port, fabric_pid), (wild_port, wild_pid), (lo_port, lo_pid), (other_port, other_pid)):
        assert [p["pid"] for p in by_port[port]["processes"]] == [pid]
    assert (by_port[fabric_port]["verdict"], by_port[fabric_port]["reason"]) == ("allowed", "fabric address")
    assert (by_port[lo_port]["verdict"], by_port[lo_port]["reason"]) == ("allowed", "loopback")
    assert by_port[other_port]["verdict"] == "ignored"
    name = by_port[wild_port]["processes"][0]["name"]
    assert result["violations"] == [
        "mvnode: %s (pid %d) listens on 0.0.0.0:%d, a wildcard reachable from the management network; bind it to "
        "the fabric address %s (see docs/security.md) or firewall it" % (name, wild_pid, wild_port, FABRIC),
        "mvnode: %s (pid %d) listens on [::]:%d, a wildcard reachable from the management network; bind it to "
        "the fabric address %s (see docs/security.md) or firewall it" % (name, wild6_pid, wild6_port, FABRIC),
    ]
    assert result["msg"] == "; ".join(result["violations"])

    # Check mode, scope all, report only: the unrelated wildcard is judged too, and nothing fails.
    code, result = _run_module(netns, tmp_path, {"fabric_ip": FABRIC, "host": "mvnode", "scope": "all",
                                                 "fail_on_violation": False, "_ansible_check_mode": True})
    assert code == 0 and not result.get("failed") and result["changed"] is False
    flagged = sorted(item["port"] for item in result["listeners"] if item["verdict"] == "violation")
    assert flagged == sorted([wild_port, wild6_port, other_port])
    assert any("(pid %d) listens on 0.0.0.0:%d" % (other_pid, other_port) in v for v in result["violations"])
