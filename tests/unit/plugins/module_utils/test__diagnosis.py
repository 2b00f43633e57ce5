# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Doctor's diagnosis: one test per rule, every lab fault named in the first line, a healthy cluster silent.

The fixture is what the collector gathers on the lab's two nodes, in the shapes of this repo's own modules:
``network`` is ``fabric_facts``' ``multinode_network`` (``_fabric.parse_network``'s input), ``ray_node``
``ray_node_facts``' ``multinode_ray_node`` (``_procs.node_state``), ``ray_table`` ``ray_verify``'s ``nodes``
(``_node_ray_reader``), ``listeners`` ``bind_audit``'s judged listeners, ``stack`` ``stack_facts``'
``multinode_stack``, ``firewall.ruleset`` the collection's own table as ``_firewall.render_ruleset`` writes it
(what ``nft list ruleset`` lists, counters aside), ``nccl`` the lines ``_nccl_log.kept_lines`` keeps.
"""

from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._diagnosis import (
    WEIGHTS,
    diagnose,
    format_findings,
    nft_rules,
    report,
)
from ansible_collections.multinode.vllm.plugins.module_utils._firewall import build_spec, render_ruleset
from ansible_collections.multinode.vllm.plugins.module_utils._memory import GIB

CIDR = "198.18.200.0/24"
FABRIC_IF = "enp1s0f1np1"
HOSTS = {
    "spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
    "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"},
}
STACK = {"python": "3.12.3", "ray": "2.52.0", "vllm": "0.11.0", "torch": "2.8.0+cu128",
         "nccl": "pip nvidia-nccl-cu12 2.27.3", "cuda_runtime": None, "driver": None}
API_KEY = "sk-lab-0123456789abcdef"
RAY_TOKEN = "raytoken-9f8e7d6c5b4a39281706"
HF_TOKEN = "hf_" + "A1b2C3d4" * 5


def network(host, mtu=9000, operstate="up", carrier=True):
    """multinode_network of a lab node: eth0 on mgmt with the default route, the fabric interface, no RDMA."""
    return {
        "interfaces": [
            {"name": "lo", "addresses": ["127.0.0.1/8"], "mtu": 65536, "operstate": "unknown", "carrier": True},
            {"name": "eth0", "addresses": [HOSTS[host]["mgmt_ip"] + "/24"], "mtu": 1500, "operstate": "up",
             "carrier": True, "speed": 10000, "default_route": True},
            {"name": FABRIC_IF, "addresses": [HOSTS[host]["fabric_ip"] + "/24"], "mtu": mtu,
             "operstate": operstate, "carrier": carrier, "speed": 10000},
        ],
        "rdma": [],
    }


def ray_node(host, running=True, serve=False):
    """multinode_ray_node (ray_node_facts)."""
    return {
        "running": running, "raylet_pid": 4100 if running else None,
        "node_ip_address": HOSTS[host]["fabric_ip"] if running else None, "gcs_server": running and host == "spark1",
        "env": {"VLLM_HOST_IP": HOSTS[host]["fabric_ip"], "GLOO_SOCKET_IFNAME": FABRIC_IF,
                "NCCL_SOCKET_IFNAME": "=" + FABRIC_IF, "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": "/etc/multinode-vllm/ray-auth-token", "auth_token_sha256": "ab" * 32}
        if running else {},
        "serve_pid": 5200 if serve else None, "serve_pids": [5200] if serve else [], "managed": running,
    }


def ray_table(head_address="198.18.200.12", worker_alive=True):
    """ray_verify's nodes: Ray's node table read on the head."""
    return {"nodes": [
        {"node_id": "a" * 32, "node_manager_address": head_address, "alive": True, "resources": {"CPU": 4.0},
         "is_head": True},
        {"node_id": "b" * 32, "node_manager_address": "198.18.200.13", "alive": worker_alive,
         "resources": {"CPU": 4.0}, "is_head": False},
    ], "error": None}


def ruleset(host):
    """The collection's nft table on a node (render_ruleset of the firewall role's spec)."""
    return render_ruleset(build_spec({
        "host": host, "fabric_interface": FABRIC_IF, "fabric_cidr": CIDR,
        "cluster": {h: v["fabric_ip"] for h, v in HOSTS.items()}, "mgmt_interface": "eth0",
        "mgmt_allow_tcp": [22, 8000] if host == "spark1" else [22], "controller_port": 22,
    }))


def listeners(host):
    """bind_audit's judged listeners: Ray's GCS on the fabric, sshd allowed, the API on mgmt by an allow rule."""
    fabric = HOSTS[host]["fabric_ip"]
    out = [
        {"proto": "tcp", "address": fabric, "port": 6380, "inode": 11,
         "processes": [{"pid": 4100, "name": "raylet", "cmdline": "raylet"}], "verdict": "allowed",
         "reason": "fabric address"},
        {"proto": "tcp", "address": "0.0.0.0", "port": 22, "inode": 12,
         "processes": [{"pid": 1, "name": "sshd", "cmdline": "sshd"}], "verdict": "allowed",
         "reason": "allow rule port=22"},
    ]
    if host == "spark1":
        out.append({"proto": "tcp", "address": HOSTS[host]["mgmt_ip"], "port": 8000, "inode": 13,
                    "processes": [{"pid": 5200, "name": "vllm", "cmdline": "vllm serve /models/m --api-key ********"}],
                    "verdict": "allowed", "reason": "allow rule address=198.19.1.10 port=8000"})
    return out


def healthy():
    nodes = {}
    for host in HOSTS:
        nodes[host] = {
            "ssh_unreachable": False,
            "system": {"kernel": "6.8.0-1015-nvidia", "os": "Ubuntu 24.04"},
            "stack": dict(STACK),
            "network": network(host),
            "env_file": {"NCCL_SOCKET_IFNAME": "=" + FABRIC_IF, "GLOO_SOCKET_IFNAME": FABRIC_IF,
                         "TP_SOCKET_IFNAME": FABRIC_IF, "UCX_NET_DEVICES": FABRIC_IF,
                         "VLLM_HOST_IP": HOSTS[host]["fabric_ip"]},
            "ray_node": ray_node(host, serve=host == "spark1"),
            "listeners": listeners(host),
            "firewall": {"ruleset": ruleset(host)},
            "processes": [{"pid": 4100, "name": "raylet"}],
            "memory": {"mem_total": 128 * GIB, "mem_available": 100 * GIB},
            "disk": {"path": "/models", "free_bytes": 200 * GIB, "total_bytes": 900 * GIB},
            "logs": {"ray": ["INFO raylet started"], "vllm": ["INFO: Application startup complete."]},
            "nccl": [],
        }
    nodes["spark1"]["ray_table"] = ray_table()
    return {
        "cluster": {"fabric_cidr": CIDR, "head": "spark1", "hosts": copy.deepcopy(HOSTS), "backend": "ray",
                    "serve": True, "firewall_enabled": True, "required_gpus": 0,
                    "ports": {"ray_gcs_port": 6379, "vllm_api_port": 8000, "node_manager_port": 6380,
                              "min_worker_port": 10002, "max_worker_port": 19999}},
        "nodes": nodes,
    }


def first(collected):
    findings = diagnose(collected)
    assert findings, "expected a finding"
    return findings[0]


def test_a_healthy_cluster_yields_no_findings():
    assert diagnose(healthy()) == []
    assert format_findings([]) == ["no problem found in what was collected"]


def test_ssh_unreachable():
    data = healthy()
    data["nodes"]["spark2"] = {"ssh_unreachable": True, "ssh_error": "ssh: connect to host 198.19.1.11 port 22: "
                                                                     "Connection timed out"}
    top = first(data)
    assert (top.rule, top.host) == ("ssh_unreachable", "spark2")
    assert "Connection timed out" in top.symptom


def test_link_down_is_named_first_before_its_dead_ray_node():
    data = healthy()
    data["nodes"]["spark2"]["network"] = network("spark2", operstate="lowerlayerdown", carrier=False)
    data["nodes"]["spark1"]["ray_table"] = ray_table(worker_alive=False)
    findings = diagnose(data)
    assert (findings[0].rule, findings[0].host) == ("fabric_link_down", "spark2")
    assert "ray_node_dead" in [f.rule for f in findings[1:]]
    assert format_findings(findings)[0].startswith("spark2: fabric interface %s (198.18.200.13) is lowerlayerdown -> "
                                                   % FABRIC_IF)


def test_mtu_mismatch_names_the_odd_host():
    data = healthy()
    data["nodes"]["spark2"]["network"] = network("spark2", mtu=1500)
    top = first(data)
    assert top.rule == "fabric_mtu_mismatch"
    assert "spark2 is not at the MTU of the others (9000)" in top.cause
    assert "spark1 %s=9000, spark2 %s=1500" % (FABRIC_IF, FABRIC_IF) in top.symptom


def test_a_fabric_address_no_interface_carries():
    data = healthy()
    data["nodes"]["spark2"]["network"]["interfaces"][2]["addresses"] = []
    top = first(data)
    assert (top.rule, top.host) == ("fabric_unusable", "spark2")


LAB_FAULT_RULESET = """table inet lab_fault {
\tset drop_tcp_ports {
\t\ttype inet_service
\t\telements = { 6379 }
\t}

\tchain input {
\t\ttype filter hook input priority filter - 10; policy accept;
\t\tip daddr 198.18.200.12 tcp dport @drop_tcp_ports drop
\t}
}
"""


def test_dropped_port_is_named_first():
    """labctl fault drop-port: its own table drops TCP to the fabric address on the port; workers then die."""
    data = healthy()
    data["nodes"]["spark1"]["firewall"]["ruleset"] += LAB_FAULT_RULESET
    data["nodes"]["spark1"]["ray_table"] = ray_table(worker_alive=False)
    top = first(data)
    assert (top.rule, top.host) == ("firewall_port_dropped", "spark1")
    assert "nft table inet lab_fault drops TCP port 6379 (ray_gcs_port) to 198.18.200.12" == top.symptom
    assert "nft delete table inet lab_fault" in top.fix


def test_nft_rules_reads_sets_lists_and_ranges():
    rules = nft_rules(LAB_FAULT_RULESET + "table ip other {\n\tchain c {\n\t\ttcp dport { 8000, 10002-10004 } "
                                          "reject\n\t}\n}\n")
    assert [r["table"] for r in rules if "rule" not in r] == ["inet lab_fault", "ip other"]
    drops = [(r["table"], r["ports"], r["daddr"]) for r in rules if "rule" in r]
    assert drops == [("inet lab_fault", [6379], "198.18.200.12"), ("ip other", [8000, 10002, 10003, 10004], None)]


def test_firewall_table_absent():
    data = healthy()
    data["nodes"]["spark2"]["firewall"]["ruleset"] = ""
    top = first(data)
    assert (top.rule, top.host) == ("firewall_table_absent", "spark2")


def test_firewall_table_not_expected_when_the_firewall_is_external():
    data = healthy()
    data["cluster"]["firewall_enabled"] = False
    data["nodes"]["spark2"]["firewall"]["ruleset"] = ""
    assert diagnose(data) == []


def test_api_port_closed_on_the_head():
    data = healthy()
    data["nodes"]["spark1"]["firewall"]["ruleset"] = ruleset("spark2").replace("spark2", "spark1")
    top = first(data)
    assert (top.rule, top.host) == ("firewall_api_port_closed", "spark1")


@pytest.mark.parametrize("key, value", [
    ("NCCL_SOCKET_IFNAME", "=eth0"),
    ("NCCL_SOCKET_IFNAME", "e"),
    ("GLOO_SOCKET_IFNAME", "eth0"),
    ("TP_SOCKET_IFNAME", "eth0"),
])
def test_env_file_naming_the_management_interface(key, value):
    data = healthy()
    data["nodes"]["spark2"]["env_file"][key] = value
    top = first(data)
    assert (top.rule, top.host) == ("env_ifname_not_fabric", "spark2")
    assert top.symptom == "%s=%s in the env file" % (key, value)
    assert "the management interface, not the fabric interface %s" % FABRIC_IF in top.cause


@pytest.mark.parametrize("value, found", [
    ("=" + FABRIC_IF, False), ("enp1s0f1", False), ("^lo,docker", False), ("^enp", True), ("eth1", True),
])
def test_nccl_ifname_syntax(value, found):
    data = healthy()
    data["nodes"]["spark1"]["env_file"]["NCCL_SOCKET_IFNAME"] = value
    assert bool([f for f in diagnose(data) if f.rule == "env_ifname_not_fabric"]) is found


def test_the_running_raylets_environment_is_checked_too():
    data = healthy()
    data["nodes"]["spark1"]["ray_node"]["env"]["GLOO_SOCKET_IFNAME"] = "eth0"
    top = first(data)
    assert top.symptom == "GLOO_SOCKET_IFNAME=eth0 in the running raylet's environment"


def test_the_incident_head_on_the_management_address():
    data = healthy()
    data["nodes"]["spark1"]["ray_table"] = ray_table(head_address="198.19.1.10")
    data["nodes"]["spark1"]["listeners"].append(
        {"proto": "tcp", "address": "198.19.1.10", "port": 6379, "inode": 14,
         "processes": [{"pid": 4090, "name": "gcs_server", "cmdline": "gcs_server"}], "verdict": "violation",
         "reason": "the management address",
         "message": "spark1: gcs_server (pid 4090) listens on 198.19.1.10:6379, the management address; bind it to "
                    "the fabric address 198.18.200.12 (see docs/security.md) or firewall it"})
    findings = diagnose(data)
    assert (findings[0].rule, findings[0].host) == ("ray_not_on_fabric", "spark1")
    assert "--node-ip-address 198.18.200.12" in findings[0].fix
    assert "management" in findings[0].cause
    assert [f.rule for f in findings][-1] == "bind_not_fabric"


@pytest.mark.parametrize("envs, rule", [
    ({"spark2": {}}, "vllm_host_ip_missing"),
    ({"spark2": {"VLLM_HOST_IP": "198.19.1.11"}}, "vllm_host_ip_wrong"),
    ({"spark1": {"VLLM_HOST_IP": "198.18.200.99"}}, "vllm_host_ip_wrong"),
])
def test_vllm_host_ip_of_each_raylet(envs, rule):
    data = healthy()
    for host, env in envs.items():
        data["nodes"][host]["ray_node"]["env"] = dict(data["nodes"][host]["ray_node"]["env"], **env)
        if not env:
            del data["nodes"][host]["ray_node"]["env"]["VLLM_HOST_IP"]
    assert first(data).rule == rule


def test_shared_vllm_host_ip():
    data = healthy()
    data["nodes"]["spark2"]["ray_node"]["env"]["VLLM_HOST_IP"] = "198.18.200.12"
    assert {"vllm_host_ip_wrong", "vllm_host_ip_shared"} <= {f.rule for f in diagnose(data)}


@pytest.mark.parametrize("host", ["spark1", "spark2"])
def test_a_stopped_raylet_is_named_first(host):
    data = healthy()
    data["nodes"][host]["ray_node"] = ray_node(host, running=False)
    data["nodes"][host]["logs"]["ray"] = ["INFO scripts.py:1 Stopped all 5 Ray processes."]
    if host == "spark1":
        data["nodes"]["spark1"]["ray_table"] = {
            "nodes": None, "error": "connect: Could not find any running Ray instance"}
    else:
        data["nodes"]["spark1"]["ray_table"] = ray_table(worker_alive=False)
    findings = diagnose(data)
    assert (findings[0].rule, findings[0].host) == ("raylet_stopped", host)
    assert "Stopped all 5 Ray processes" in findings[0].cause
    if host == "spark1":  # vllm serve went with the head's Ray: named after it
        assert "vllm_crashed" in [f.rule for f in findings[1:]]


def test_ray_table_unreadable_while_the_raylet_runs():
    data = healthy()
    data["nodes"]["spark1"]["ray_table"] = {"nodes": None, "error": "timed out"}
    assert first(data).rule == "ray_table_unreadable"


def test_a_crashed_vllm_is_named_by_its_log():
    data = healthy()
    data["nodes"]["spark1"]["ray_node"]["serve_pid"] = None
    data["nodes"]["spark1"]["logs"]["vllm"] = [
        "ERROR 12-03 14:00:01 [core.py:708] EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "RuntimeError: Gloo connectFullMesh failed with ...",
    ]
    top = first(data)
    assert (top.rule, top.host) == ("vllm_gloo_interface", "spark1")
    assert top.symptom.startswith("vllm serve is not running on spark1; its log says: ")


# Recorded on the lab (vllm 0.32.0+cpu, /var/log/multinode-vllm/vllm.log): the logo line of the start banner.
START = "(APIServer pid=26550) INFO 12-06 04:21:51 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"
EADDRINUSE = "OSError: [Errno 98] Address already in use"


def test_the_plain_start_banner_counts_too():
    data = healthy()
    plain = "INFO 12-06 04:00:01 [api_utils.py:327] vLLM server version 0.32.0, serving model /models/tiny"
    data["nodes"]["spark1"]["logs"]["vllm"] = [plain, EADDRINUSE, plain]
    assert first(data).rule == "vllm_address_in_use"


def test_a_crash_looping_vllm_is_named_while_its_restart_runs():
    # supervisord restarted it (startsecs passed before it failed): a process is there, its log holds the loop.
    data = healthy()
    data["nodes"]["spark1"]["logs"]["vllm"] = [START, "Traceback (most recent call last):", EADDRINUSE, START]
    top = first(data)
    assert (top.rule, top.host) == ("vllm_address_in_use", "spark1")
    assert top.symptom.startswith("vllm serve failed on spark1 and runs again (its supervisor restarts it; 2 "
                                  "start(s) in spark1's log tail); its log says: ")


def test_a_tail_holding_only_the_failed_start_is_named_too():
    # vLLM's failing start logs more than the tail keeps: one banner, the failure, the process not yet gone.
    data = healthy()
    data["nodes"]["spark1"]["logs"]["vllm"] = [START, "Traceback (most recent call last):", EADDRINUSE]
    assert first(data).rule == "vllm_address_in_use"


@pytest.mark.parametrize("tail", [
    [START, "INFO: Application startup complete."],           # one start, healthy
    [START, "INFO: Application startup complete.", START],    # restarted on purpose, no failure logged
])
def test_a_running_vllm_whose_log_holds_no_failure_is_no_finding(tail):
    data = healthy()
    data["nodes"]["spark1"]["logs"]["vllm"] = tail
    assert not [p for p in diagnose(data) if p.rule.startswith("vllm_")]


# PG_WAIT recorded on the lab (a CI run's test_doctor, 2026-12-07: the head's start waited for its placement group
# while spark2's Ray came back after a reboot, then served); READY and the EngineDeadError line modelled on the lab's
# vllm.log of vLLM 0.32.0 (the pid and time changed).
PG_WAIT = ("(EngineCore pid=3231) INFO 12-07 12:30:10 [ray_utils.py:467] Waiting for creating a placement group of "
           "specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}].")
READY = "(APIServer pid=3180) INFO 12-07 12:30:31 [entry.py:140] Starting vLLM server on http://198.19.1.10:8000"


def test_a_start_that_waited_for_its_placement_group_then_served_is_no_finding():
    data = healthy()
    data["nodes"]["spark1"]["logs"]["vllm"] = [
        START, "ERROR 12-07 12:29:40 [core.py:708] EngineDeadError: the engine core died", START, PG_WAIT, READY]
    assert not [p for p in diagnose(data) if p.rule.startswith("vllm_")]


def test_a_crash_loop_after_a_start_that_waited_is_named_by_the_loop_not_the_wait():
    # The same log, then the API port taken and supervisord's restarts failing on it: the wait is not the cause.
    data = healthy()
    data["nodes"]["spark1"]["logs"]["vllm"] = [START, PG_WAIT, READY, START, EADDRINUSE, START]
    top = first(data)
    assert (top.rule, top.host) == ("vllm_address_in_use", "spark1")
    assert "3 start(s) in spark1's log tail" in top.symptom


def test_a_killed_vllm_without_a_cause_in_its_log():
    data = healthy()
    data["nodes"]["spark1"]["ray_node"]["serve_pid"] = None
    data["nodes"]["spark1"]["logs"]["vllm"] = ["INFO: Application startup complete.", "Killed"]
    top = first(data)
    assert (top.rule, top.host) == ("vllm_crashed", "spark1")
    assert "Killed" in top.symptom


def test_a_full_model_disk_is_named_before_the_vllm_crash_it_caused():
    data = healthy()
    data["nodes"]["spark2"]["disk"] = {"path": "/models", "free_bytes": 0, "total_bytes": 20 * GIB}
    data["nodes"]["spark1"]["ray_node"]["serve_pid"] = None
    data["nodes"]["spark2"]["logs"]["vllm"] = ["OSError: [Errno 28] No space left on device: '/models/m/x'"]
    findings = diagnose(data)
    assert (findings[0].rule, findings[0].host) == ("model_disk_full", "spark2")
    assert findings[0].symptom == "the model directory /models has 0 B free of 20.0 GiB"
    assert findings[1].rule == "vllm_disk_full"


def test_disk_threshold_is_small_on_a_small_disk():
    data = healthy()
    data["nodes"]["spark2"]["disk"] = {"path": "/models", "free_bytes": 300 * 1024 ** 2, "total_bytes": 2 * GIB}
    assert diagnose(data) == []
    data["cluster"]["disk_min_free_bytes"] = GIB
    assert first(data).rule == "model_disk_full"


def test_stack_skew():
    data = healthy()
    data["nodes"]["spark2"]["stack"]["torch"] = "2.9.0"
    top = first(data)
    assert top.rule == "stack_skew"
    assert top.symptom == "torch differs between nodes (spark1: 2.8.0+cu128; spark2: 2.9.0)"


def test_stack_skew_allowed():
    data = healthy()
    data["nodes"]["spark2"]["stack"]["torch"] = "2.9.0"
    data["cluster"]["stack_allow_skew"] = [{"component": "torch", "reason": "tested"}]
    assert diagnose(data) == []


def test_api_bound_off_the_fabric_judged_here_when_the_collector_gave_no_verdict():
    data = healthy()
    data["nodes"]["spark2"]["listeners"] = [
        {"proto": "tcp", "address": "0.0.0.0", "port": 6380, "inode": 21,
         "processes": [{"pid": 4100, "name": "raylet", "cmdline": "raylet --node_ip_address=198.18.200.13"}]}]
    top = first(data)
    assert (top.rule, top.host) == ("bind_not_fabric", "spark2")
    assert top.symptom == "raylet (pid 4100) listens on 0.0.0.0:6380"


def test_nccl_over_sockets_where_the_fabric_has_rdma():
    data = healthy()
    net = data["nodes"]["spark1"]["network"]
    net["rdma"] = [{"hca": "rocep1s0f1", "port": 1, "state": "4: ACTIVE", "link_layer": "Ethernet",
                    "netdev": FABRIC_IF, "gids": [{"index": 3, "gid": "::ffff:198.18.200.12", "type": "RoCE v2",
                                                  "netdev": FABRIC_IF}]}]
    data["nodes"]["spark1"]["nccl"] = [
        "spark1:1:1 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:198.18.200.12<0>",
        "spark1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    ]
    top = first(data)
    assert (top.rule, top.host) == ("nccl_transport", "spark1")


def test_every_rule_id_of_the_lab_faults_has_a_weight():
    for rule in ("ssh_unreachable", "fabric_link_down", "fabric_mtu_mismatch", "firewall_port_dropped",
                 "env_ifname_not_fabric", "ray_not_on_fabric", "raylet_stopped", "vllm_crashed", "model_disk_full"):
        assert rule in WEIGHTS


def test_findings_are_formatted_symptom_cause_fix():
    data = healthy()
    data["nodes"]["spark2"]["network"] = network("spark2", mtu=1500)
    line = format_findings(diagnose(data))[0]
    assert line.count(" -> ") == 2
    assert line.startswith("fabric MTU differs between hosts")


def plant_secrets(data):
    """The API key, the Ray token, the HF token and a vllm_secret_env value, where a collector would meet them."""
    spark1 = data["nodes"]["spark1"]
    spark1["env_file"].update({"VLLM_API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN, "MY_DB_PASSWORD": "pw-planted-123"})
    spark1["processes"].append({"pid": 5200, "name": "vllm",
                                "cmdline": ["vllm", "serve", "/models/m", "--api-key", API_KEY]})
    spark1["processes"].append({"pid": 5300, "name": "sh", "cmdline": "env RAY_AUTH_TOKEN=%s ray status" % RAY_TOKEN})
    spark1["logs"]["vllm"] = [
        "INFO args: Namespace(api_key='%s', model='/models/m')" % API_KEY,
        "INFO Authorization: Bearer %s" % API_KEY,
        "WARNING token %s used for the hub" % HF_TOKEN,
        "OSError: [Errno 28] No space left on device (while saving with key %s)" % API_KEY,
    ]
    spark1["ray_node"]["serve_pid"] = None
    spark1["ray_token_file"] = {"RAY_AUTH_TOKEN": RAY_TOKEN}
    return data


def test_report_diagnoses_before_redacting_and_no_planted_secret_survives():
    data = plant_secrets(healthy())
    out = report(data, secrets=[API_KEY, RAY_TOKEN, HF_TOKEN])
    dumped = json.dumps(out)
    for secret in (API_KEY, RAY_TOKEN, HF_TOKEN, "pw-planted-123"):
        assert secret not in dumped
    # The cause was read from the unredacted log, and its line is redacted in the report.
    assert out["findings"][0]["rule"] == "vllm_disk_full"
    assert "No space left on device" in out["lines"][0]
    assert "<redacted>" in out["lines"][0]
    # What the diagnosis needs to compare is kept: the token's digest and path, the interface names.
    assert out["bundle"]["nodes"]["spark1"]["ray_node"]["env"]["auth_token_sha256"] == "ab" * 32
    assert out["bundle"]["nodes"]["spark1"]["env_file"]["NCCL_SOCKET_IFNAME"] == "=" + FABRIC_IF
    assert data["nodes"]["spark1"]["env_file"]["VLLM_API_KEY"] == API_KEY  # the input is not changed
