# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The bind audit: /proc/net parsing (recorded and live), socket owners per network namespace, the verdicts."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import (
    AuditError,
    audit,
    check_allow,
    classify,
    compile_patterns,
    is_cluster_internal,
    listeners,
    parse_net,
    short_cmdline,
    socket_owners,
)

FABRIC = "198.18.200.12"
MGMT = "198.19.1.10"
SP = "/var/lib/multinode-vllm-lab/cache/node-venv/lib/python3.11/site-packages/ray"
PY = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/python"

# Recorded from /proc/self/net/* of a process listening on 127.0.0.1:47595, 0.0.0.0:39385, [::]:46159,
# [::1]:48311, [::ffff:127.0.0.1]:40555, with an SSH client connection, TIME_WAITs, a bound UDP socket
# (127.0.0.1:37929) and a connected one; the kernel prints each 32-bit word in host (little-endian) order.
# Pointers zeroed; the tcp6 column padding squeezed to one space (the parser splits on whitespace).
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:99D9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1109707 1 0000 100 0 0 10 0
   1: 0100007F:B9EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1109706 1 0000 100 0 0 10 0
   2: 0100007F:A923 0100007F:BBC9 06 00000000:00000000 03:00000BD7 00000000     0        0 0 3 0000
   3: 010113C6:9BFE 0A0113C6:0016 01 00000000:00000000 02:000AF4AC 00000000     0        0 1108155 2 0000 20 4 28 250 -1
"""
TCP6 = """\
  sl local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode
   0: 00000000000000000000000000000000:B44F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1109708 1 0000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:9E6B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1109710 1 0000 100 0 0 10 0
   2: 00000000000000000000000001000000:BCB7 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1109709 1 0000 100 0 0 10 0
"""
UDP = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
12033: 0100007F:CB47 0100007F:0009 01 00000000:00000000 00:00000000 00000000     0        0 1109712 2 0000 0
14307: 0100007F:9429 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1109711 2 0000 0
"""

little_endian = pytest.mark.skipif(sys.byteorder != "little", reason="the recorded /proc text is from a little-endian host")


@little_endian
def test_recorded_tcp_keeps_listeners_only():
    found = [(s.proto, s.address, s.port, s.inode) for s in parse_net(TCP, "tcp")]
    assert found == [("tcp", "0.0.0.0", 39385, 1109707), ("tcp", "127.0.0.1", 47595, 1109706)]


@little_endian
def test_recorded_tcp6_wildcard_mapped_and_loopback():
    found = [(s.address, s.port, s.inode) for s in parse_net(TCP6, "tcp6")]
    assert found == [("::", 46159, 1109708), ("127.0.0.1", 40555, 1109710), ("::1", 48311, 1109709)]


@little_endian
def test_recorded_udp_keeps_the_unconnected_socket_only():
    assert [(s.address, s.port) for s in parse_net(UDP, "udp")] == [("127.0.0.1", 37929)]


# Live: real sockets of this test process, read back through /proc.

def _listen(family, address, kind=socket.SOCK_STREAM, v6only=None):
    sock = socket.socket(family, kind)
    if v6only is not None:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
    sock.bind((address, 0))
    if kind == socket.SOCK_STREAM:
        sock.listen()
    return sock


@pytest.fixture
def live_sockets():
    opened = []

    def open_one(*args, **kwargs):
        try:
            sock = _listen(*args, **kwargs)
        except OSError as exc:
            pytest.skip("cannot bind %s here: %s" % (args[1], exc))
        opened.append(sock)
        return sock.getsockname()[1]

    yield open_one
    for sock in opened:
        sock.close()


def test_live_listeners_are_found_with_address_port_and_pid(live_sockets):
    expected = {
        ("tcp", live_sockets(socket.AF_INET, "127.0.0.1")): "127.0.0.1",
        ("tcp", live_sockets(socket.AF_INET, "0.0.0.0")): "0.0.0.0",
        ("tcp6", live_sockets(socket.AF_INET6, "::")): "::",
        ("tcp6", live_sockets(socket.AF_INET6, "::1")): "::1",
        ("tcp6", live_sockets(socket.AF_INET6, "::ffff:127.0.0.1", v6only=0)): "127.0.0.1",
        ("udp", live_sockets(socket.AF_INET, "127.0.0.1", socket.SOCK_DGRAM)): "127.0.0.1",
    }
    # Bound but not listening, and connected UDP: not listeners.
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))
    connected = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    connected.connect(("127.0.0.1", 9))
    try:
        seen = {(item["proto"], item["port"]): item for item in listeners(include_udp=True)}
        assert ("tcp", idle.getsockname()[1]) not in seen
        assert ("udp", connected.getsockname()[1]) not in seen
    finally:
        idle.close()
        connected.close()
    with open("/proc/self/comm") as handle:
        comm = handle.read().strip()
    for key, address in expected.items():
        assert key in seen, "%s port %d not parsed from /proc/self/net/%s" % (address, key[1], key[0])
        item = seen[key]
        assert item["address"] == address
        assert [(p["pid"], p["name"]) for p in item["processes"]] == [(os.getpid(), comm)]
    tcp_only = {(item["proto"], item["port"]) for item in listeners()}
    assert not any(proto.startswith("udp") for proto, _port in tcp_only)


# A fake /proc laid out like the lab: one PID namespace, processes of two network namespaces.

MINE = "net:[100]"
OTHER = "net:[200]"


def _proc(root, pid, name, cmdline, netns, sockets=()):
    base = os.path.join(root, str(pid))
    os.makedirs(os.path.join(base, "ns"))
    os.makedirs(os.path.join(base, "fd"))
    with open(os.path.join(base, "stat"), "w") as handle:
        handle.write("%d (%s) S 1 1 1 0 -1\n" % (pid, name))
    with open(os.path.join(base, "cmdline"), "wb") as handle:
        handle.write(b"\0".join(part.encode() for part in cmdline) + b"\0")
    with open(os.path.join(base, "environ"), "wb") as handle:
        handle.write(b"RAY_SECRET=do-not-return\0")
    os.symlink(netns, os.path.join(base, "ns", "net"))
    os.symlink("/dev/null", os.path.join(base, "fd", "0"))
    for fd, inode in enumerate(sockets, start=3):
        os.symlink("socket:[%d]" % inode, os.path.join(base, "fd", str(fd)))


@little_endian
def test_fake_proc_only_this_netns_owns_sockets(tmp_path):
    root = str(tmp_path / "proc")
    os.makedirs(os.path.join(root, "self", "ns"))
    os.makedirs(os.path.join(root, "self", "net"))
    os.symlink(MINE, os.path.join(root, "self", "ns", "net"))
    with open(os.path.join(root, "self", "net", "tcp"), "w") as handle:
        handle.write(TCP)
    with open(os.path.join(root, "self", "net", "tcp6"), "w") as handle:
        handle.write(TCP6)
    _proc(root, 4242, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=" + FABRIC], MINE, [1109707])
    # Another node's process holding the same inode number must not be taken for this node's.
    _proc(root, 5000, "raylet", [SP + "/core/src/ray/raylet/raylet"], OTHER, [1109707, 1109706])
    _proc(root, 4300, "python", [PY, "-m", "vllm.entrypoints.openai.api_server", "--api-key", "sk-123"], MINE,
          [1109708])
    _proc(root, 4301, "python", [PY, "-m", "vllm.entrypoints.openai.api_server"], MINE, [1109708])
    assert socket_owners([1109707, 1109706, 1109708], root) == {1109707: [4242], 1109708: [4300, 4301]}

    result = audit(FABRIC, allow=[{"port": 22}], host="spark1", management_ip=MGMT, proc_root=root)
    by_port = {item["port"]: item for item in result["listeners"]}
    assert by_port[39385]["verdict"] == "violation"
    assert by_port[47595]["verdict"] == "allowed" and by_port[47595]["reason"] == "loopback"
    assert by_port[40555]["verdict"] == "allowed"  # ::ffff:127.0.0.1
    assert by_port[48311]["verdict"] == "allowed"  # ::1
    assert by_port[46159]["processes"][0]["cmdline"].endswith("--api-key ********")
    assert "do-not-return" not in repr(result) and "full_cmdline" not in repr(result)
    assert result["violations"] == [
        "spark1: raylet (pid 4242) listens on 0.0.0.0:39385, a wildcard reachable from the management network; "
        "bind it to the fabric address 198.18.200.12 (see docs/security.md) or firewall it",
        "spark1: python (pid 4300) and 1 more (pids 4301) listens on [::]:46159, a wildcard reachable from the "
        "management network; bind it to the fabric address 198.18.200.12 (see docs/security.md) or firewall it",
    ]


# Pure classification.

PATTERNS = compile_patterns(None)


def _item(address, port=40123, name="raylet", cmdline=SP + "/core/src/ray/raylet/raylet", pid=4242, proto="tcp"):
    procs = [dict(pid=pid, name=name, cmdline=cmdline)] if name else []
    return dict(proto=proto, address=address, port=port, inode=77, processes=procs)


def _judge(item, allow=(), scope="cluster"):
    return classify(item, FABRIC, check_allow(allow), PATTERNS, scope, MGMT, "spark1")


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback"), ("127.0.1.1", "loopback"), ("::1", "loopback"), (FABRIC, "fabric address"),
])
def test_loopback_and_fabric_are_allowed(address, reason):
    assert _judge(_item(address)) == dict(verdict="allowed", reason=reason)


def test_management_address_is_named():
    verdict = _judge(_item(MGMT, name="gcs_server", pid=7, port=6379))
    assert verdict["verdict"] == "violation"
    assert verdict["message"].startswith("spark1: gcs_server (pid 7) listens on 198.19.1.10:6379, the management "
                                         "address; bind it to the fabric address 198.18.200.12")


def test_other_address_and_udp():
    verdict = _judge(_item("10.9.9.9", proto="udp"))
    assert verdict["verdict"] == "violation"
    assert "listens on udp 10.9.9.9:40123, not the fabric address" in verdict["message"]


def test_allow_rules_match_on_every_key_given():
    api = [{"address": MGMT, "port": 8000}]
    vllm = dict(name="python", cmdline=PY + " -m vllm.entrypoints.openai.api_server --host 198.19.1.10")
    assert _judge(_item(MGMT, port=8000, **vllm), api)["verdict"] == "allowed"
    # The API allowed on the management address does not allow it on every address.
    assert _judge(_item("0.0.0.0", port=8000, **vllm), api)["verdict"] == "violation"
    assert _judge(_item(MGMT, port=8001, **vllm), api)["verdict"] == "violation"
    sshd = dict(name="sshd", cmdline="sshd: /usr/sbin/sshd -D -f /var/lib/multinode-vllm-lab/sshd_config")
    assert _judge(_item("0.0.0.0", port=22, **sshd), [{"port": 22, "process": "^sshd$"}])["verdict"] == "allowed"
    assert _judge(_item("0.0.0.0", port=22, **sshd), [{"port": 22, "process": "^dropbear$"}])["verdict"] == "violation"


def test_scope_cluster_ignores_other_processes_and_all_judges_them():
    nginx = _item("0.0.0.0", port=80, name="nginx", cmdline="nginx: master process /usr/sbin/nginx")
    assert _judge(nginx)["verdict"] == "ignored"
    assert _judge(nginx, scope="all")["verdict"] == "violation"
    nobody = _item("0.0.0.0", name=None)
    assert _judge(nobody)["verdict"] == "unattributed"
    assert "an unknown process (socket inode 77)" in _judge(nobody, scope="all")["message"]


@pytest.mark.parametrize("name, cmdline, internal", [
    ("raylet", SP + "/core/src/ray/raylet/raylet --node_ip_address=198.18.200.12", True),
    ("gcs_server", SP + "/core/src/ray/gcs/gcs_server --node-ip-address=198.18.200.12", True),
    ("ray::DashboardA", "ray::DashboardAgent", True),
    # vLLM's setproctitle names (seen in the lab listening on *:19620 while serving through Ray).
    ("VLLM::EngineCor", "VLLM::EngineCore", True),
    ("VLLM::Worker_TP", "VLLM::Worker_TP1", True),
    ("python", PY + " -m ray.util.client.server --host=198.18.200.12 --port=10001", True),
    ("python", PY + " " + SP + "/dashboard/dashboard.py --host=127.0.0.1 --port=8265", True),
    ("ray", PY + " /var/lib/multinode-vllm-lab/cache/node-venv/bin/ray start --head", True),
    ("python", PY + " -m vllm.entrypoints.openai.api_server --model /models/tiny", True),
    ("vllm", PY + " /venv/bin/vllm serve /models/tiny", True),
    ("python3", "/usr/bin/python3 -m torch.distributed.run --nproc-per-node 1 x.py", True),
    ("python3", "/usr/bin/python3 /opt/multinode-vllm/probe.py", True),
    ("sshd", "sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups", False),
    ("python3", "/usr/bin/python3 -m http.server 8080", False),
    ("python3", "/usr/bin/python3 /srv/array_server.py", False),
    ("grafana", "/usr/sbin/grafana server --homepath=/usr/share/grafana", False),
])
def test_default_patterns(name, cmdline, internal):
    assert is_cluster_internal([dict(pid=1, name=name, cmdline=cmdline)], PATTERNS) is internal


def test_short_cmdline_masks_secrets_and_truncates():
    assert short_cmdline(["vllm", "serve", "--api-key", "sk-1", "--hf-token=hf_2", "--tokenizer", "/m",
                          "--max-num-batched-tokens", "8"]) == \
        "vllm serve --api-key ******** --hf-token=******** --tokenizer /m --max-num-batched-tokens 8"
    text = short_cmdline(["x" * 500], limit=50)
    assert len(text) == 50 and text.endswith("...")


@pytest.mark.parametrize("kwargs, words", [
    (dict(fabric_ip="spark1"), ["fabric_ip 'spark1' is not an IP address"]),
    (dict(fabric_ip=FABRIC, patterns=["ray("]), ["pattern 'ray('", "not a regular expression"]),
    (dict(fabric_ip=FABRIC, allow=[{"ports": 22}]), ["allow rule {'ports': 22}", "{port: 22}"]),
    (dict(fabric_ip=FABRIC, allow=[{"address": "api.example"}]), ["allow rule address 'api.example'"]),
    (dict(fabric_ip=FABRIC, scope="some"), ["scope 'some'", "cluster or all"]),
])
def test_bad_arguments_are_named(kwargs, words):
    with pytest.raises(AuditError) as caught:
        audit(**kwargs)
    for word in words:
        assert word in str(caught.value)
