"""Integration tests of the network-namespace lab itself (lab/labctl).

Run as root: `make lab-test` or `python3 -m pytest -q tests/lab`.
The module brings the lab down and up again (2 nodes), injects every fault,
and ends with the lab down (or back up with the node count it had before).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABCTL = REPO / "lab" / "labctl"
LAB_ROOT = Path(os.environ.get("LAB_ROOT") or "/var/lib/multinode-vllm-lab")
RUN = LAB_ROOT / "run"
SSH_DIR = RUN / "ssh"
STATIC_INVENTORY = REPO / "inventories" / "lab"
PRODUCT_DIRS = ("/var/lib/multinode-vllm", "/etc/multinode-vllm", "/var/log/multinode-vllm")


def _missing_tools():
    tools = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "nft")
    missing = [t for t in tools if not shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")]
    if not os.access("/usr/sbin/sshd", os.X_OK):
        missing.append("sshd")
    return missing


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="lab tests need root (network namespaces, veths, mounts)"),
    pytest.mark.skipif(os.geteuid() == 0 and bool(_missing_tools()),
                       reason=f"lab tools missing: {_missing_tools()}; run `make lab-deps`"),
]


def mgmt_ip(i):
    return f"198.19.{i}.10"


def fabric_ip(i):
    return f"198.18.200.{11 + i}"


def labctl(*args, check=True, timeout=120):
    p = subprocess.run([str(LABCTL), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"labctl {' '.join(map(str, args))} -> {p.returncode}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def node_exec(node, *cmd, check=True, timeout=60):
    return labctl("exec", node, "--", *cmd, check=check, timeout=timeout)


CONNECT = r"""
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("accepted")
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e.errno)
"""

LISTEN = r"""
import socket, sys, time
socks = []
for port in sys.argv[2:]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(port)))
    s.listen(64)
    socks.append(s)
print("ready", flush=True)
time.sleep(600)
"""


def connect(node, host, port, timeout=1.5):
    """TCP connect from inside a node: accepted | refused | timeout | error N."""
    return node_exec(node, "python3", "-c", CONNECT, host, port, timeout).stdout.strip()


def ssh(i, command, known_hosts=None, timeout=30):
    return subprocess.run(
        ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known_hosts or SSH_DIR / 'known_hosts'}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
         "-o", "ConnectTimeout=5", "-i", str(SSH_DIR / "id_ed25519"),
         f"root@{mgmt_ip(i)}", command],
        capture_output=True, text=True, timeout=timeout, check=False)


def status():
    return json.loads(labctl("status", "--json", check=False).stdout)


def sshd_pids():
    return {n["name"]: n["sshd_pid"] for n in status()["nodes"]}


def netns_list():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def lab_netns():
    return [n for n in netns_list() if n == "fabric" or n.startswith("spark")]


def root_links():
    return [link["ifname"] for link in
            json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)]


@pytest.fixture(scope="module")
def lab():
    before = status() if RUN.exists() else {}
    prev_nodes = before.get("nodes_expected") if before.get("state") in ("up", "degraded") else None
    labctl("down")
    t0 = time.monotonic()
    out = labctl("up", 2).stdout
    elapsed = time.monotonic() - t0
    yield {"up_seconds": elapsed, "up_output": out}
    labctl("fault", "clear", check=False)
    if prev_nodes:
        labctl("up", prev_nodes)
    else:
        labctl("down")


@pytest.fixture
def listener():
    """Start a TCP listener inside a node; yields start(node, ip, *ports)."""
    procs = []

    def start(node, host, *ports):
        p = subprocess.Popen([str(LABCTL), "exec", node, "--", "python3", "-c", LISTEN, host,
                              *map(str, ports)], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------


def test_up_from_scratch_is_fast(lab):
    assert lab["up_seconds"] < 10, lab
    assert "inventory: " + str(STATIC_INVENTORY) in lab["up_output"]
    st = status()
    assert st["state"] == "up" and [n["name"] for n in st["nodes"]] == ["spark1", "spark2"]


def test_topology_addresses_and_mtu(lab):
    for i in (1, 2):
        node = f"spark{i}"
        links = {x["ifname"]: x for x in json.loads(node_exec(node, "ip", "-j", "addr").stdout)}
        assert set(links) == {"lo", "eth0", "enp1s0f1np1"}
        assert {"UP"} <= set(links["lo"]["flags"])

        def addrs(link):
            return {(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"}

        assert addrs(links["eth0"]) == {(mgmt_ip(i), 24)}
        assert addrs(links["enp1s0f1np1"]) == {(fabric_ip(i), 24)}
        assert links["enp1s0f1np1"]["mtu"] == 9000
        routes = json.loads(node_exec(node, "ip", "-j", "route", "show", "default").stdout)
        assert [r["gateway"] for r in routes] == [f"198.19.{i}.1"]
    root = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    root_addrs = {a["local"]: x["ifname"] for x in root for a in x["addr_info"]}
    assert root_addrs["198.19.1.1"] == "mg-spark1" and root_addrs["198.19.2.1"] == "mg-spark2"
    assert not [a for a in root_addrs if a.startswith("198.18.")], "root ns must not be on the fabric"
    fab = json.loads(subprocess.run(["ip", "-n", "fabric", "-j", "link"], capture_output=True,
                                    text=True, check=True).stdout)
    fab = {x["ifname"]: x for x in fab}
    assert fab["br0"]["mtu"] == 9000
    for i in (1, 2):
        assert fab[f"fb-spark{i}"]["master"] == "br0" and fab[f"fb-spark{i}"]["mtu"] == 9000


IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
ISOLATION = ("inet", "multinode_vllm_lab_isolation")


@pytest.fixture
def ip_forward():
    """Set the host's net.ipv4.ip_forward for a test; restored afterwards."""
    before = IP_FORWARD.read_text().strip()
    yield lambda value: IP_FORWARD.write_text("%d\n" % value)
    IP_FORWARD.write_text(before + "\n")


def isolation_table():
    p = subprocess.run(["nft", "list", "table", *ISOLATION], capture_output=True, text=True, check=False)
    return p.stdout if p.returncode == 0 else None


@pytest.mark.parametrize("forward", [0, 1])
def test_management_isolated_whatever_the_hosts_ip_forward(lab, ip_forward, forward):
    ip_forward(forward)
    assert connect("spark2", mgmt_ip(1), 22, timeout=2) == "timeout"
    assert connect("spark1", mgmt_ip(2), 22, timeout=2) == "timeout"
    assert connect("spark2", fabric_ip(1), 22) == "refused"  # the fabric still answers
    assert ssh(1, "true").returncode == 0  # the control node still reaches every node


def test_the_isolation_table_is_what_isolates_and_up_restores_it(lab, ip_forward):
    ip_forward(1)
    subprocess.run(["nft", "delete", "table", *ISOLATION], check=True)
    # Without the lab's table, a forwarding host routes between management veths: the incident no longer holds.
    assert connect("spark2", mgmt_ip(1), 22, timeout=2) == "accepted"
    p = labctl("up", 2)
    assert "nothing to do" not in p.stdout + p.stderr  # a missing table is not "up"
    assert isolation_table() is not None
    assert connect("spark2", mgmt_ip(1), 22, timeout=2) == "timeout"


def test_down_removes_the_table_and_leaves_the_sysctl_alone(lab, ip_forward):
    ip_forward(1)
    labctl("down")
    assert isolation_table() is None
    assert IP_FORWARD.read_text().strip() == "1"
    labctl("up", 2)
    assert isolation_table() is not None
    assert IP_FORWARD.read_text().strip() == "1"


def test_up_refuses_a_host_that_uses_the_lab_range(lab):
    subprocess.run(["ip", "link", "add", "labtest0", "type", "veth", "peer", "name", "labtest1"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", "198.19.250.1/24", "dev", "labtest0"], check=True)
        subprocess.run(["ip", "link", "set", "labtest0", "up"], check=True)
        p = labctl("up", 2, check=False)
        assert p.returncode != 0
        assert "already uses the lab's address range 198.18.0.0/15" in p.stderr, p.stderr
        assert "address 198.19.250.1/24 on labtest0" in p.stderr and "route 198.19.250.0/24 dev labtest0" in p.stderr
    finally:
        subprocess.run(["ip", "link", "del", "labtest0"], check=False)
    labctl("up", 2)


def test_fabric_reachable_management_isolated(lab):
    t0 = time.monotonic()
    # sshd listens on the management address only: the fabric port answers "refused", fast.
    assert connect("spark2", fabric_ip(1), 22) == "refused"
    assert connect("spark1", fabric_ip(2), 22) == "refused"
    assert time.monotonic() - t0 < 5
    assert connect("spark2", mgmt_ip(1), 22, timeout=2) == "timeout"
    assert connect("spark1", mgmt_ip(2), 22, timeout=2) == "timeout"
    # The control node is not on the fabric, and no lab address leaves through the uplink.
    out = subprocess.run(["python3", "-c", CONNECT, fabric_ip(1), "22", "1"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out not in ("accepted", "refused"), out


def test_ssh_with_pinned_host_key(lab):
    for i in (1, 2):
        p = ssh(i, "ip -4 -o addr show enp1s0f1np1")
        assert p.returncode == 0, p.stderr
        assert fabric_ip(i) + "/24" in p.stdout
    with tempfile.NamedTemporaryFile("w") as empty:
        p = ssh(1, "true", known_hosts=empty.name)
        assert p.returncode != 0 and "Host key verification failed" in p.stderr
    # The pinned key of spark2 does not match spark1: keys are per node.
    kh = (SSH_DIR / "known_hosts").read_text().splitlines()
    assert len({line.split()[2] for line in kh}) == 2


def test_private_tmp_and_state_dirs(lab):
    name = f"labtest-{uuid.uuid4().hex}"
    node_exec("spark1", "sh", "-c",
              f"echo one > /tmp/{name} && echo one > /dev/shm/{name} && "
              f"echo one > /var/lib/multinode-vllm/{name} && echo one > /etc/multinode-vllm/{name} "
              f"&& echo one > /var/log/multinode-vllm/{name}")
    for d in ("/tmp", "/dev/shm") + PRODUCT_DIRS:
        assert node_exec("spark1", "cat", f"{d}/{name}").stdout == "one\n"
        assert node_exec("spark2", "test", "-e", f"{d}/{name}", check=False).returncode == 1, d
        assert not os.path.exists(f"{d}/{name}"), f"root ns sees {d}/{name}"
    # Backing store of the node's state dir lives under $LAB_ROOT/run.
    assert (RUN / "nodes" / "spark1" / "state" / name).read_text() == "one\n"
    # The root namespace's own /tmp is not visible in a node either.
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="labtest-root-") as f:
        assert node_exec("spark1", "test", "-e", f.name, check=False).returncode == 1


def test_root_bashrc_is_a_stock_one_in_nodes(lab):
    """sshd runs every command through root's bash, which sources ~/.bashrc: a node has no dev-box start-up cost."""
    if not os.path.isfile("/root/.bashrc"):
        pytest.skip("the host has no /root/.bashrc")
    assert node_exec("spark1", "cat", "/root/.bashrc").stdout == (RUN / "nodes" / "spark1" / "bashrc").read_text()
    assert "return" in node_exec("spark2", "cat", "/root/.bashrc").stdout
    # Whatever the host's bashrc sets up (pyenv here), an SSH command on a node does not run it.
    p = ssh(1, "echo ${PYENV_ROOT:-unset}")
    assert (p.returncode, p.stdout.strip()) == (0, "unset"), p.stderr


def test_cache_is_read_only_in_nodes(lab):
    venv = LAB_ROOT / "cache" / "node-venv"
    if not venv.is_dir():
        pytest.skip(f"{venv} not built yet")
    p = node_exec("spark1", "touch", f"{venv}/.labtest-write", check=False)
    assert p.returncode != 0 and "Read-only" in p.stderr


def test_fault_link_down(lab):
    assert connect("spark2", fabric_ip(1), 22) == "refused"
    labctl("fault", "link-down", "spark1")
    try:
        assert connect("spark2", fabric_ip(1), 22, timeout=1.5) in ("timeout", "error 113")
        assert {n["name"]: n["faults"] for n in status()["nodes"]} == {"spark1": ["link-down"], "spark2": []}
    finally:
        labctl("fault", "link-up", "spark1")
    deadline = time.monotonic() + 10
    while connect("spark2", fabric_ip(1), 22) != "refused":
        assert time.monotonic() < deadline, "fabric did not come back after link-up"
        time.sleep(0.2)


def test_fault_mtu(lab):
    labctl("fault", "mtu", "spark2", 1500)
    try:
        assert " mtu 1500 " in node_exec("spark2", "ip", "link", "show", "enp1s0f1np1").stdout
        assert " mtu 9000 " in node_exec("spark1", "ip", "link", "show", "enp1s0f1np1").stdout
    finally:
        labctl("fault", "mtu", "spark2", 9000)
    assert " mtu 9000 " in node_exec("spark2", "ip", "link", "show", "enp1s0f1np1").stdout


def test_fault_drop_port(lab, listener):
    listener("spark1", fabric_ip(1), 18080, 18081)
    assert connect("spark2", fabric_ip(1), 18080) == "accepted"
    labctl("fault", "drop-port", "spark1", 18080)
    labctl("fault", "drop-port", "spark1", 18080)  # idempotent
    try:
        assert connect("spark2", fabric_ip(1), 18080, timeout=1.5) == "timeout"
        assert connect("spark2", fabric_ip(1), 18081) == "accepted"
        # Only inbound to the fabric address: the node's own loopback is unaffected.
        ruleset = node_exec("spark1", "nft", "list", "ruleset").stdout
        assert "table inet lab_fault" in ruleset and "18080" in ruleset
    finally:
        labctl("fault", "undrop-port", "spark1", 18080)
    assert connect("spark2", fabric_ip(1), 18080) == "accepted"
    labctl("fault", "undrop-port", "spark1", 18080)  # idempotent


def test_fault_reboot(lab):
    pids = sshd_pids()
    hostkey = (SSH_DIR / "hostkeys" / "spark1_ed25519_key.pub").read_text()
    node_exec("spark1", "sh", "-c", "echo x > /tmp/reboot-marker && "
              "echo x > /var/lib/multinode-vllm/reboot-survivor")
    proc = subprocess.Popen([str(LABCTL), "exec", "spark1", "--", "sleep", "600"])
    time.sleep(0.3)
    assert proc.poll() is None
    labctl("fault", "reboot", "spark1")
    assert proc.wait(timeout=10) == -9
    new = sshd_pids()
    assert new["spark1"] != pids["spark1"] and new["spark2"] == pids["spark2"]
    assert node_exec("spark1", "test", "-e", "/tmp/reboot-marker", check=False).returncode == 1
    assert node_exec("spark1", "cat", "/var/lib/multinode-vllm/reboot-survivor").stdout == "x\n"
    p = ssh(1, "ip -4 -o addr show enp1s0f1np1")
    assert p.returncode == 0 and fabric_ip(1) in p.stdout, p.stderr
    assert (SSH_DIR / "hostkeys" / "spark1_ed25519_key.pub").read_text() == hostkey


def test_fault_clear(lab):
    labctl("fault", "link-down", "spark1")
    labctl("fault", "mtu", "spark2", 1500)
    labctl("fault", "drop-port", "spark2", 22)
    faults = {n["name"]: n for n in status()["nodes"]}
    assert faults["spark1"]["fabric_port_up"] is False
    assert faults["spark2"]["fabric_mtu"] == 1500 and faults["spark2"]["dropped_ports"] == [22]
    labctl("fault", "clear")
    for n in status()["nodes"]:
        assert n["fabric_port_up"] and n["fabric_mtu"] == 9000 and n["dropped_ports"] == []
    assert "lab_fault" not in node_exec("spark2", "nft", "list", "ruleset").stdout
    deadline = time.monotonic() + 10
    while connect("spark2", fabric_ip(1), 22) != "refused":
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_up_twice_is_noop(lab):
    pids = sshd_pids()
    t0 = time.monotonic()
    out = labctl("up", 2).stdout
    assert time.monotonic() - t0 < 3
    assert "already up" in out
    assert sshd_pids() == pids


def _ansible():
    for cand in (REPO / ".venv" / "bin" / "ansible", Path("/tmp/cvenv/bin/ansible")):
        if cand.exists():
            return str(cand)
    return shutil.which("ansible")


def test_ansible_ping(lab):
    ansible = _ansible()
    if not ansible:
        pytest.skip("ansible not installed (make setup)")
    p = subprocess.run([ansible, "-i", str(STATIC_INVENTORY), "all", "-m", "ansible.builtin.ping",
                        "-o"], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") == 2


def test_static_inventory_matches_generator(tmp_path):
    out = tmp_path / "inv"
    labctl("inventory", "--write", out, "--nodes", 2)

    def files(root):
        return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(out) == files(STATIC_INVENTORY)


def test_reconcile_node_count(lab):
    out = labctl("up", 3).stdout
    gen = RUN / "inventory"
    assert f"inventory: {gen}" in out
    assert "spark3:" in (gen / "hosts.yml").read_text()
    assert (gen / "host_vars" / "spark3.yml").read_text() == \
        "---\nansible_host: 198.19.3.10\nfabric_ip: 198.18.200.14\n"
    p = ssh(3, "ip -4 -o addr show enp1s0f1np1")
    assert p.returncode == 0 and fabric_ip(3) in p.stdout, p.stderr
    assert connect("spark3", fabric_ip(1), 22) == "refused"
    labctl("up", 2)
    assert "spark3" not in lab_netns() and "mg-spark3" not in root_links()
    assert not gen.exists()
    assert labctl("inventory").stdout.strip() == str(STATIC_INVENTORY)


def _lab_processes():
    """Live (non-zombie) processes that refer to the lab's run dir or netns."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and str(RUN) in cmd:
            found.append((d, cmd))
    return found


def assert_nothing_left():
    assert lab_netns() == []
    assert [x for x in root_links() if x.startswith(("mg-spark", "fb-spark"))] == []
    assert _lab_processes() == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(RUN) not in mounts
    assert not RUN.exists()
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert "198.18." not in routes and "198.19." not in routes
    assert isolation_table() is None


def test_down_leaves_nothing(lab):
    labctl("down")
    assert_nothing_left()
    labctl("down")  # idempotent
    assert_nothing_left()
    assert status()["state"] == "down"


def test_down_after_partial_up(lab):
    """A half-built lab (netns, veth, a process, run dir, no state file) is removed."""
    subprocess.run(["ip", "netns", "add", "spark1"], check=True)
    subprocess.run(["ip", "link", "add", "mg-spark1", "type", "veth", "peer", "name", "eth0",
                    "netns", "spark1"], check=True)
    subprocess.run(["ip", "netns", "add", "fabric"], check=True)
    proc = subprocess.Popen(["ip", "netns", "exec", "spark1", "sleep", "600"])
    (RUN / "nodes" / "spark1").mkdir(parents=True)
    time.sleep(0.2)
    labctl("down")
    assert proc.wait(timeout=10) == -9
    assert_nothing_left()


def test_not_root_is_refused():
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("setpriv missing")
    p = subprocess.run([setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        str(LABCTL), "up"], capture_output=True, text=True, check=False)
    assert p.returncode != 0 and "must run as root" in p.stderr
