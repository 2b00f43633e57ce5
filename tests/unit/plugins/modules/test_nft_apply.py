# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""nft_apply for real, in two network namespaces of our own, proven with real TCP connects.

mvfw-a is the node (the firewall is loaded there); mvfw-b is everyone else. Two veth pairs join them:
"fabric" 10.77.2.0/24 (a=.1, b=.2 listed as a cluster node, b=.3 not listed) and "mgmt" 10.77.3.0/24
(a=.1, b=.2). The module runs inside mvfw-a as Ansible runs it (python module.py args.json), so the
host's own ruleset is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._firewall import build_spec, render_ruleset

MODULE = os.path.join(os.path.dirname(__file__), *[".."] * 4, "plugins", "modules", "nft_apply.py")
SUFFIX = str(os.getpid() % 100000)  # two test runs at once do not share namespaces
NS_A, NS_B = "mvfw-a" + SUFFIX, "mvfw-b" + SUFFIX
A_FAB, B_FAB, B_FAB_OTHER = "10.77.2.1", "10.77.2.2", "10.77.2.3"
A_MGMT, B_MGMT = "10.77.3.1", "10.77.3.2"
API = 8000
# Rollback windows that a test must beat (apply, then confirm before it ends): long enough for two module runs
# on a loaded 2-core machine (ansible-test units runs the tests on every core at once; 2 s was missed there).
WINDOW = 4.0

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates network namespaces and loads nftables"),
    pytest.mark.skipif(shutil.which("nft") is None, reason="needs nft (apt-get install nftables)"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs ip (apt-get install iproute2)"),
]

LISTENER = r"""
import socket, sys, threading
def serve(sock):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
def echo(conn):
    with conn:
        while True:
            data = conn.recv(100)
            if not data:
                return
            conn.sendall(data)
socks = []
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    socks.append(s)
for s in socks[1:]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
serve(socks[0])
"""

CONNECT = r"""
import json, socket, sys
out = []
for src, dst, port in json.loads(sys.argv[1]):
    s = socket.socket()
    s.settimeout(0.5)
    try:
        s.bind((src, 0))
        s.connect((dst, port))
        out.append("ok")
    except socket.timeout:
        out.append("timeout")
    except ConnectionRefusedError:
        out.append("refused")
    finally:
        s.close()
print(json.dumps(out))
"""

# Connects from mvfw-b, the answer expected once the firewall is in: (source, destination, port) -> result.
ALLOWED = {
    (B_MGMT, A_MGMT, 22): "ok",  # SSH on mgmt
    (B_MGMT, A_MGMT, API): "timeout",  # any other mgmt port: dropped, not refused
    (B_FAB, A_FAB, 5555): "ok",  # any port over the fabric from a cluster node
    (B_FAB, A_FAB, 22): "ok",
    (B_FAB, A_FAB, 5556): "refused",  # no listener: the RST comes back, so the packet was let in
    (B_FAB_OTHER, A_FAB, 5555): "timeout",  # fabric source not in the cluster: dropped
}
OPEN = {key: ("refused" if value == "refused" else "ok") for key, value in ALLOWED.items()}


def _sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def _in(ns, *args, check=True):
    return _sh("ip", "netns", "exec", ns, *args, check=check)


def _connects(cases=None):
    cases = list(cases or ALLOWED)
    proc = _in(NS_B, sys.executable, "-c", CONNECT, json.dumps([list(case) for case in cases]))
    return dict(zip(cases, json.loads(proc.stdout)))


def _listing():
    proc = _in(NS_A, "nft", "list", "table", "inet", "multinode_vllm", check=False)
    return proc.stdout if proc.returncode == 0 else None


def _ruleset(**changes):
    data = dict(host="mvfw-a", fabric_interface="fab0", fabric_cidr="10.77.2.0/24",
                cluster={"mvfw-a": A_FAB, "mvfw-b": B_FAB}, mgmt_interface="mgmt0", mgmt_allow_tcp=[22],
                controller_port=22, allow_icmp=True)
    data.update(changes)
    return render_ruleset(build_spec(data))


@pytest.fixture
def lab(tmp_path):
    """Two namespaces, two veth pairs, listeners in mvfw-a; all removed afterwards, also on failure."""
    listener = None
    state_dir = str(tmp_path / "state")
    try:
        for ns in (NS_A, NS_B):
            _sh("ip", "netns", "add", ns)
            _in(ns, "ip", "link", "set", "lo", "up")
        # Created inside the namespaces: the names never appear in the host's namespace.
        for name in ("fab0", "mgmt0"):
            _sh("ip", "link", "add", name, "netns", NS_A, "type", "veth", "peer", "name", name, "netns", NS_B)
        for ns, addrs in ((NS_A, [("fab0", A_FAB), ("mgmt0", A_MGMT)]),
                          (NS_B, [("fab0", B_FAB), ("fab0", B_FAB_OTHER), ("mgmt0", B_MGMT)])):
            for dev, addr in addrs:
                _in(ns, "ip", "addr", "add", addr + "/24", "dev", dev)
            for dev in ("fab0", "mgmt0"):
                _in(ns, "ip", "link", "set", dev, "up")
        listener = subprocess.Popen(
            ["ip", "netns", "exec", NS_A, sys.executable, "-c", LISTENER,
             "%s:22" % A_MGMT, "%s:%d" % (A_MGMT, API), "%s:5555" % A_FAB, "%s:22" % A_FAB],
            stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "ready"
        yield state_dir
    finally:
        # Disarm any pending rollback so its detached watcher exits (it polls every 0.2 s).
        if os.path.isdir(state_dir):
            for name in os.listdir(state_dir):
                if name.endswith(".armed.json"):
                    os.unlink(os.path.join(state_dir, name))
        if listener is not None:
            listener.kill()
            listener.wait()
        for ns in (NS_A, NS_B):
            _sh("ip", "netns", "del", ns, check=False)


def _module(state_dir, tmp_path, check=False, diff=False, **args):
    """Run nft_apply inside mvfw-a the way Ansible does: python nft_apply.py ARGS_FILE."""
    args = dict(args, state_dir=state_dir, _ansible_check_mode=check, _ansible_diff=diff,
                _ansible_remote_tmp=str(tmp_path / "remote_tmp"), _ansible_keep_remote_files=False)
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(["ip", "netns", "exec", NS_A, sys.executable, MODULE, str(path)],
                          capture_output=True, text=True, env=env, check=False)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("module output is not JSON: %r %r" % (proc.stdout, proc.stderr))


def test_firewall_allows_exactly_ssh_and_the_fabric_and_is_idempotent(lab, tmp_path):
    assert _connects() == OPEN  # without a firewall everything gets in: the assertions below can fail

    ruleset = _ruleset()
    checked = _module(lab, tmp_path, check=True, diff=True, ruleset=ruleset)
    assert checked["changed"] is True and checked["armed"] is False
    assert 'iifname "mgmt0" tcp dport 22 accept' in checked["diff"]["after"] and checked["diff"]["before"] == ""
    assert _listing() is None  # check mode changed nothing

    applied = _module(lab, tmp_path, ruleset=ruleset, rollback_timeout=30)
    assert applied["changed"] is True and applied["armed"] is True and applied["exact"] is True, applied
    assert _connects() == ALLOWED
    confirmed = _module(lab, tmp_path, state="confirmed", token=applied["token"])
    assert confirmed["armed"] is True and not confirmed.get("failed"), confirmed

    again = _module(lab, tmp_path, ruleset=ruleset, rollback_timeout=30)
    assert again["changed"] is False and again["armed"] is False, again  # drop counters moved: still equal

    # Dropped packets are counted.
    counter = _in(NS_A, "nft", "list", "counter", "inet", "multinode_vllm", "dropped").stdout
    assert "packets 0 " not in counter, counter

    removed = _module(lab, tmp_path, state="absent", diff=True)
    assert removed["changed"] is True and "policy drop" in removed["diff"]["before"]
    assert _listing() is None and _connects() == OPEN
    assert _module(lab, tmp_path, state="absent")["changed"] is False


def test_open_connection_survives_a_ruleset_that_closes_its_port(lab, tmp_path):
    # Conntrack must already follow the connection, as our previous table (or any ct rule) makes it do. A
    # connection opened while nothing in the namespace used conntrack is not picked up as established: on a
    # first apply the controller's SSH session is kept by the SSH port rule (checked to be in the list).
    wide = _module(lab, tmp_path, ruleset=_ruleset(mgmt_allow_tcp=[22, API]), rollback_timeout=30)
    assert _module(lab, tmp_path, state="confirmed", token=wide["token"])["armed"] is True
    client = subprocess.Popen(
        ["ip", "netns", "exec", NS_B, sys.executable, "-c",
         "import socket,sys\ns=socket.create_connection(('%s',%d),timeout=2,source_address=('%s',0))\n"
         "print('up',flush=True)\nsys.stdin.readline()\ns.sendall(b'still here')\nprint(s.recv(100).decode(),flush=True)"
         % (A_MGMT, API, B_MGMT)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "up"
        applied = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=30)
        assert applied["changed"] is True
        assert _connects([(B_MGMT, A_MGMT, API)]) == {(B_MGMT, A_MGMT, API): "timeout"}  # new ones: dropped
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "still here"  # the open one: kept
    finally:
        client.kill()
        client.wait()


def test_unconfirmed_change_is_rolled_back_and_not_retried(lab, tmp_path):
    first = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=30)
    assert _module(lab, tmp_path, state="confirmed", token=first["token"])["armed"] is True
    before = _listing()

    # A change that opens the API port, never confirmed (as if the controller had lost the host).
    wider = _ruleset(mgmt_allow_tcp=[22, API])
    started = time.monotonic()
    applied = _module(lab, tmp_path, ruleset=wider, rollback_timeout=WINDOW, diff=True)
    assert applied["changed"] is True and applied["armed"] is True
    # The role asks for the confirmation (then closes its connection); no fresh connection gets in.
    assert _module(lab, tmp_path, state="confirming", token=applied["token"])["armed"] is True
    assert "8000" not in applied["diff"]["before"] and "tcp dport { 22, 8000 }" in applied["diff"]["after"]
    assert _connects([(B_MGMT, A_MGMT, API)]) == {(B_MGMT, A_MGMT, API): "ok"}  # the new table is live

    deadline = started + WINDOW + 8
    while time.monotonic() < deadline and "8000" in (_listing() or ""):
        time.sleep(0.2)
    took = time.monotonic() - started
    assert "8000" not in (_listing() or ""), "not rolled back within %s s" % (WINDOW + 8)
    assert WINDOW - 0.5 <= took <= WINDOW + 4, took
    assert _connects() == ALLOWED  # the previous (confirmed) table is back, and enforced
    assert _normal(_listing()) == _normal(before)

    late = _module(lab, tmp_path, state="confirmed", token=applied["token"])
    assert late.get("failed") and "rolled back" in late["msg"] and applied["token"] in late["msg"], late
    retry = _module(lab, tmp_path, ruleset=wider, rollback_timeout=2)
    assert retry.get("failed") and "rolled back" in retry["msg"] and ".rolled-back.json" in retry["msg"], retry
    assert "8000" not in _listing()  # the refused retry changed nothing
    assert retry["rolled_back"]["confirm_started"] is True and "lockout" in retry["rolled_back"]["reason"]


def test_a_rollback_because_the_play_stopped_does_not_block_the_rerun(lab, tmp_path):
    """issue 17: another host failed, so this host's confirmation was never asked for; it rolls back, and the
    re-run applies the same ruleset again with no manual step. Confirming clears the marker; so does absent."""
    first = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=30)
    _module(lab, tmp_path, state="confirmed", token=first["token"])
    wider = _ruleset(mgmt_allow_tcp=[22, API])
    applied = _module(lab, tmp_path, ruleset=wider, rollback_timeout=1.5)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "8000" in (_listing() or ""):
        time.sleep(0.2)
    assert "8000" not in (_listing() or "")
    again = _module(lab, tmp_path, ruleset=wider, rollback_timeout=30)
    assert again["changed"] is True and again["armed"] is True, again
    assert again["rolled_back"]["token"] == applied["token"] and again["rolled_back"]["confirm_started"] is False
    assert "never asked for a confirmation" in again["rolled_back"]["reason"]
    _module(lab, tmp_path, state="confirming", token=again["token"])
    assert _module(lab, tmp_path, state="confirmed", token=again["token"])["armed"] is True
    assert "8000" in _listing()
    assert _module(lab, tmp_path, ruleset=wider)["rolled_back"] is None  # cleared on confirm
    # A lockout marker is cleared by absent too.
    locked = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=WINDOW)
    _module(lab, tmp_path, state="confirming", token=locked["token"])
    time.sleep(WINDOW + 1.5)
    assert _module(lab, tmp_path, ruleset=_ruleset())["failed"] is True
    _module(lab, tmp_path, state="absent")
    assert _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=30)["rolled_back"] is None


def test_confirmed_change_stays_and_first_apply_rolls_back_to_no_table(lab, tmp_path):
    applied = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=WINDOW)
    confirmed = _module(lab, tmp_path, state="confirmed", token=applied["token"])
    assert confirmed["armed"] is True
    time.sleep(WINDOW + 1)
    assert _listing() is not None and _connects() == ALLOWED  # confirmed: kept past the timeout

    _module(lab, tmp_path, state="absent")
    applied = _module(lab, tmp_path, ruleset=_ruleset(mgmt_allow_tcp=[22, 2222]), rollback_timeout=WINDOW)
    assert applied["armed"] is True and _listing() is not None
    time.sleep(WINDOW + 1.5)
    assert _listing() is None and _connects() == OPEN  # no table before: no table after the rollback


def test_bad_ruleset_changes_nothing(lab, tmp_path):
    result = _module(lab, tmp_path, ruleset=_ruleset().replace("policy drop", "policy dorp"))
    assert result.get("failed") and "nothing was changed" in result["msg"], result
    other = "table inet other {}\ndelete table inet other\ntable inet other {\n}\n" + _ruleset()
    result = _module(lab, tmp_path, ruleset=other)
    assert result.get("failed") and "table inet other" in result["msg"], result
    no_delete = "\n".join(line for line in _ruleset().splitlines() if not line.startswith("delete"))
    result = _module(lab, tmp_path, ruleset=no_delete)
    assert result.get("failed") and "delete table inet multinode_vllm" in result["msg"], result
    assert _listing() is None and _in(NS_A, "nft", "list", "ruleset").stdout.strip() == ""


def _normal(text):
    from ansible_collections.multinode.vllm.plugins.module_utils._firewall import normalise_listing

    return normalise_listing(text)


UDP6_LISTEN = r"""
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.bind(("::", 546))
s.settimeout(float(sys.argv[1]))
print("ready", flush=True)
got = []
try:
    while True:
        data, peer = s.recvfrom(100)
        got.append("%s/%d" % (data.decode(), peer[1]))
except socket.timeout:
    pass
print(" ".join(sorted(got)), flush=True)
"""

UDP6_SEND = r"""
import socket, sys
for src, sport, label in (("fe80::b", 547, "linklocal547"), ("fe80::b", 548, "linklocal548"),
                          ("2001:db8:3::b", 547, "global547")):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind((src, sport, 0, socket.if_nametoindex("mgmt0")))
    dst = "fe80::a" if src.startswith("fe80") else "2001:db8:3::a"
    s.sendto(label.encode(), (dst, 546, 0, socket.if_nametoindex("mgmt0")))
    s.close()
"""


def test_dhcpv6_replies_come_in_only_from_link_local_servers(lab, tmp_path):
    """issue 17 (IPv6 management networks): a DHCPv6 reply (547 -> 546) from a link-local address is let in; the
    same port from a global address, or another port, is dropped. MLD queries are let in from link-local
    addresses only (rule checked below; sending one needs a raw socket and a router alert option)."""
    for ns, host in ((NS_A, "a"), (NS_B, "b")):
        _in(ns, "ip", "-6", "addr", "add", "fe80::%s/64" % host, "dev", "mgmt0", "nodad")
        _in(ns, "ip", "-6", "addr", "add", "2001:db8:3::%s/64" % host, "dev", "mgmt0", "nodad")
    applied = _module(lab, tmp_path, ruleset=_ruleset(), rollback_timeout=30)
    _module(lab, tmp_path, state="confirmed", token=applied["token"])
    listing = _listing()
    assert "icmpv6 type mld-listener-query ip6 saddr fe80::/10 accept" in listing
    listener = subprocess.Popen(["ip", "netns", "exec", NS_A, sys.executable, "-c", UDP6_LISTEN, "2"],
                                stdout=subprocess.PIPE, text=True)
    assert listener.stdout.readline().strip() == "ready"
    _in(NS_B, sys.executable, "-c", UDP6_SEND)
    assert listener.stdout.readline().split() == ["linklocal547/547"]
    listener.wait()
