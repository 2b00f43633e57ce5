# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Distributed preflight: env/JSON parsing, interface selection as Gloo and NCCL do it, the cluster's messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _rendezvous as rv
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import (
    MARKER,
    RendezvousError,
    assemble_report,
    carry_over_problems,
    cluster_problems,
    parse_env_file,
    parse_non_carry_over,
    parse_rank_output,
    rank_environment,
    rank_problems,
    returned_env,
)
from ansible_collections.multinode.vllm.plugins.module_utils._node_rendezvous_rank import (
    gloo_selection,
    nccl_selection,
)

HEAD_IP = "198.18.200.12"
FABRIC = "enp1s0f1np1"
NCO = "/etc/multinode-vllm/vllm/ray_non_carry_over_env_vars.json"


def _ifaces(mgmt, fabric, extra=()):
    rows = [
        {"name": "lo", "ipv4": ["127.0.0.1"], "up": True, "running": True, "loopback": True},
        {"name": "eth0", "ipv4": [mgmt], "up": True, "running": True, "loopback": False},
        {"name": FABRIC, "ipv4": [fabric], "up": True, "running": True, "loopback": False},
    ]
    return rows + list(extra)


SPARK2 = _ifaces("198.19.2.10", "198.18.200.13")


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A=1\nB=2\n", {"A": "1", "B": "2"}),
        ("# comment\n\nNCCL_SOCKET_IFNAME==enp1s0f1np1\n", {"NCCL_SOCKET_IFNAME": "=enp1s0f1np1"}),
        ("X=a b 'c'\n", {"X": "a b 'c'"}),  # raw values, no quote processing
        ("EMPTY=\n", {"EMPTY": ""}),
        ("", {}),
    ],
)
def test_parse_env_file(text, expected):
    assert parse_env_file(text) == expected


@pytest.mark.parametrize("text, line", [("A=1\nnot a pair\n", 2), ("=x\n", 1), ("1A=x\n", 1), ("A-B=x\n", 1)])
def test_parse_env_file_names_the_bad_line(text, line):
    with pytest.raises(RendezvousError, match="node.env line %d is not KEY=VALUE" % line):
        parse_env_file(text, "node.env")


@pytest.mark.parametrize(
    "text, expected, error",
    [
        ('["NCCL_SOCKET_IFNAME", "VLLM_HOST_IP"]', ["NCCL_SOCKET_IFNAME", "VLLM_HOST_IP"], None),
        ("[]", [], None),
        ('{"a": 1}', None, "must be a JSON list"),
        ("[1]", None, "must be a JSON list"),
        ("[", None, "is not valid JSON"),
    ],
)
def test_parse_non_carry_over(text, expected, error):
    if error:
        with pytest.raises(RendezvousError, match=error):
            parse_non_carry_over(text, NCO)
    else:
        assert parse_non_carry_over(text, NCO) == expected


@pytest.mark.parametrize(
    "stdout, expected",
    [
        ("", None),
        ("noise\n", None),
        (MARKER + '{"phase": "import"}\n' + MARKER + '{"phase": "init"}\nwarning\n', {"phase": "init"}),
        (MARKER + '{"phase": "import"}\n' + MARKER + '{"phase": "in', {"phase": "import"}),  # cut by a kill
    ],
)
def test_parse_rank_output_keeps_the_last_complete_line(stdout, expected):
    assert parse_rank_output(stdout) == expected


def test_returned_env_keeps_only_what_the_cluster_checks_need():
    env = {"VLLM_HOST_IP": "x", "NCCL_IB_HCA": "=a", "UCX_NET_DEVICES": "b", "HF_TOKEN": "secret",
           "GLOO_SOCKET_IFNAME": "c", "PATH": "/bin", "VLLM_CONFIG_ROOT": "/etc/v", "VLLM_OTHER": "y"}
    assert returned_env(env) == {"VLLM_HOST_IP": "x", "NCCL_IB_HCA": "=a", "UCX_NET_DEVICES": "b",
                                 "GLOO_SOCKET_IFNAME": "c", "VLLM_CONFIG_ROOT": "/etc/v"}


def test_rank_environment_env_file_wins_over_base():
    assert rank_environment({"PATH": "/venv/bin", "A": "1"}, {"PATH": "/bin", "HOME": "/root"}) == {
        "PATH": "/venv/bin", "HOME": "/root", "A": "1"}


# ---------------------------------------------------------------------------
# Interface selection (the rank's own view, as Gloo and NCCL choose)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, hostname_addrs, carries, problem",
    [
        (FABRIC, (), True, None),
        ("eth0", (), False, "GLOO_SOCKET_IFNAME=eth0 selects interface eth0 (198.19.2.10), not the fabric address "
                            "198.18.200.13: Gloo binds its sockets there, off the fabric"),
        ("^lo", (), False, "not NCCL's ^/= syntax"),
        ("=enp1s0f1np1", (), False, "not NCCL's ^/= syntax"),
        ("ib0", (), False, "interface ib0 does not exist on this node"),
        (None, ("198.18.200.13",), True, None),
        (None, ("127.0.0.1",), False, "GLOO_SOCKET_IFNAME is unset; Gloo binds to the address the host name "
                                      "resolves to (127.0.0.1)"),
        ("e", ("198.19.2.10",), False, "is unset"),  # length <= 1: Gloo ignores it
    ],
)
def test_gloo_selection(value, hostname_addrs, carries, problem):
    sel = gloo_selection(value, SPARK2, "198.18.200.13", hostname_addrs)
    assert sel["carries_fabric"] is carries
    if problem:
        assert problem in sel["problem"]
    else:
        assert sel["problem"] is None


@pytest.mark.parametrize(
    "value, interfaces, chosen, carries",
    [
        ("=" + FABRIC, SPARK2, FABRIC, True),
        ("enp", SPARK2, FABRIC, True),  # prefix
        ("=enp", SPARK2, None, False),  # exact: no interface is called "enp"
        ("eth", SPARK2, "eth0", False),
        ("^eth0,lo", SPARK2, FABRIC, True),
        ("^=eth0", SPARK2, "lo", False),  # first not excluded, in kernel order
        ("=eth0:1234", SPARK2, "eth0", False),  # ':' separates a port
        (None, SPARK2, "eth0", False),  # unset: first non-ib, non-lo interface, the incident's trap
        ("e", SPARK2, "eth0", False),  # length <= 1 is ignored
        (None, _ifaces("198.19.2.10", "198.18.200.13", [
            {"name": "ibp1", "ipv4": ["198.18.200.13"], "up": True, "running": True, "loopback": False}]),
         "ibp1", True),  # ib* first
        ("=" + FABRIC, [dict(i, running=i["name"] != FABRIC) for i in SPARK2], None, False),  # link down
    ],
)
def test_nccl_selection(value, interfaces, chosen, carries):
    sel = nccl_selection(value, interfaces, "198.18.200.13")
    assert sel["interface"] == chosen
    assert sel["carries_fabric"] is carries
    assert (sel["problem"] is None) is carries


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------


def _rank(host, rank, fabric_ip, ok=True, **changes):
    gloo_if = changes.pop("gloo_if", FABRIC)
    mgmt = {"spark1": "198.19.1.10", "spark2": "198.19.2.10"}[host]
    ifaces = _ifaces(mgmt, fabric_ip)
    result = {
        "host": host, "rank": rank, "world_size": 2, "ok": ok, "final": True, "phase": "done" if ok else "init",
        "error": None, "error_phase": None, "fabric_ip": fabric_ip, "fabric_interface": FABRIC,
        "head_ip": HEAD_IP, "port": 29600, "backend": "gloo", "backends": ["gloo"], "timeout_s": 55.0,
        "gloo": gloo_selection(gloo_if, ifaces, fabric_ip),
        "nccl": nccl_selection("=" + gloo_if, ifaces, fabric_ip),
        "route_to_head": {"source_ip": fabric_ip, "interface": FABRIC, "error": None},
        "get_ip": {"source": "vllm.utils.network_utils.get_ip", "value": fabric_ip, "matches": True, "error": None},
        "bandwidth": {"bytes": 64 << 20, "dtype": "float32", "iterations": 5, "seconds_per_op": 0.2,
                      "algbw_GBps": 0.3355, "busbw_GBps": 0.3355} if ok else None,
    }
    result.update(changes)
    return result


def _ok():
    return {"spark1": _rank("spark1", 0, HEAD_IP), "spark2": _rank("spark2", 1, "198.18.200.13")}


TIMEOUT = "RuntimeError: Timed out after 56 seconds waiting for clients. 1/2 clients joined."


@pytest.mark.parametrize(
    "name, changes, expected_first, expected_also",
    [
        ("passes", {}, None, []),
        (
            "worker's interface variables on its management NIC",
            {"spark2": dict(ok=False, gloo_if="eth0", error="RuntimeError: Gloo connectFullMesh failed",
                            error_phase="init"),
             "spark1": dict(ok=False, error=TIMEOUT, error_phase="init")},
            "spark2 could not reach the rendezvous at 198.18.200.12:29600 from interface eth0 (GLOO_SOCKET_IFNAME); "
            "the fabric interface is enp1s0f1np1",
            ["spark2: GLOO_SOCKET_IFNAME=eth0 selects interface eth0 (198.19.2.10), not the fabric address",
             "spark1 (rank 0, the rendezvous at 198.18.200.12:29600) failed in phase init waiting for spark2"],
        ),
        (
            "blocked port on the head",
            {"spark2": dict(ok=False, error="DistNetworkError: The client socket has timed out after 55000ms while "
                                            "trying to connect to (198.18.200.12, 29600).", error_phase="init"),
             "spark1": dict(ok=False, error=TIMEOUT, error_phase="init")},
            "spark2 could not reach the rendezvous at 198.18.200.12:29600 from interface enp1s0f1np1 within 55.0 s: "
            "port 29600 on spark1's fabric address does not answer (a firewall dropping it?)",
            [],
        ),
        (
            "nothing listens",
            {"spark2": dict(ok=False, error="DistNetworkError: Connection refused", error_phase="init"),
             "spark1": dict(ok=False, error="ModuleNotFoundError: No module named 'torch'", error_phase="import",
                            phase="import")},
            "spark2 could not reach the rendezvous at 198.18.200.12:29600 from interface enp1s0f1np1: connection "
            "refused (nothing listens on port 29600 on spark1; did spark1's rank start?)",
            ["spark1: torch is not importable by the runtime's interpreter"],
        ),
        (
            "get_ip off the fabric",
            {"spark2": dict(get_ip={"source": "vllm.utils.network_utils.get_ip", "value": "198.19.2.10",
                                    "matches": False, "error": None})},
            "spark2: vLLM's get_ip() (vllm.utils.network_utils.get_ip) returns 198.19.2.10 under this node's "
            "environment, not the fabric address 198.18.200.13; set VLLM_HOST_IP=198.18.200.13",
            [],
        ),
        (
            "wrong sum",
            # As the rank reports it: the checked sums, then the error.
            {"spark2": dict(ok=False, error="all-reduce returned a wrong sum", error_phase="verify", phase="verify",
                            verify={"ok": False, "groups": [{"group": "default", "expected": 3.0, "min": 2.0,
                                                             "max": 2.0, "ok": False}]})},
            "spark2 failed the rendezvous at 198.18.200.12:29600 from interface enp1s0f1np1 in phase verify",
            ["spark2: all-reduce returned a wrong sum"],
        ),
    ],
)
def test_cluster_problems(name, changes, expected_first, expected_also):
    results = _ok()
    for host, change in changes.items():
        results[host] = _rank(host, results[host]["rank"], results[host]["fabric_ip"], **change)
    problems = cluster_problems(results, "spark1", {"spark1": FABRIC, "spark2": FABRIC}, 60)
    if expected_first is None:
        assert problems == []
        return
    assert problems[0].startswith(expected_first), problems
    for fragment in expected_also:
        assert any(fragment in p for p in problems), (fragment, problems)


def test_nccl_off_the_fabric_after_the_group_formed_is_one_cause_not_three_deadlines():
    # The shape seen on an H200 (NCCL 2.28.9, two namespaces, tests/gpu/preflight_two_namespaces.py): the worker's
    # NCCL_SOCKET_IFNAME on its management NIC; the TCPStore and Gloo group formed over the fabric, the first NCCL
    # all-reduce hung until both ranks' deadline.
    deadline = "the rank did not finish before its deadline (30 s) in phase verify"
    results = _ok()
    for host in results:
        results[host] = _rank(host, results[host]["rank"], results[host]["fabric_ip"], ok=False, backend="nccl",
                              backends=["nccl", "gloo"], phase="verify", error=deadline, error_phase="verify")
    results["spark2"]["nccl"] = nccl_selection("=eth0", SPARK2, "198.18.200.13")
    problems = cluster_problems(results, "spark1", {"spark1": FABRIC, "spark2": FABRIC}, 30)
    assert problems == [
        "spark2 joined the rendezvous at 198.18.200.12:29600, but NCCL's connections from interface eth0 "
        "(NCCL_SOCKET_IFNAME) did not reach the other ranks (phase verify: %s); the fabric interface is "
        "enp1s0f1np1" % deadline,
        "spark2: NCCL_SOCKET_IFNAME==eth0 selects interface eth0 (198.19.2.10), not the fabric address "
        "198.18.200.13; the fabric interface is enp1s0f1np1 (198.18.200.13)",
        "spark1 (rank 0, the rendezvous at 198.18.200.12:29600) failed in phase verify waiting for spark2: "
        + deadline,
    ]


def test_interface_off_the_fabric_fails_even_when_the_two_rank_rendezvous_passed():
    # Measured in the lab: with only the worker's Gloo on eth0, a 2-rank group
    # still forms (the worker dials the head's fabric address); the
    # configuration is wrong all the same and the preflight says so.
    results = _ok()
    results["spark2"] = _rank("spark2", 1, "198.18.200.13", gloo_if="eth0")
    assert cluster_problems(results, "spark1") == [
        "spark2: GLOO_SOCKET_IFNAME=eth0 selects interface eth0 (198.19.2.10), not the fabric address 198.18.200.13: "
        "Gloo binds its sockets there, off the fabric; the fabric interface is enp1s0f1np1 (198.18.200.13)"]


def test_a_rank_with_no_output_is_named_with_the_deadline():
    results = _ok()
    results["spark2"] = None
    problems = cluster_problems(results, "spark1", timeout=60)
    assert problems == ["spark2: the preflight rank printed no result (killed at the 60 s deadline before it "
                        "started?)"]


def test_rank_problems_route_off_the_fabric():
    result = _rank("spark2", 1, "198.18.200.13",
                   route_to_head={"source_ip": "198.19.2.10", "interface": "eth0", "error": None})
    assert rank_problems(result, "spark2") == [
        "spark2: the route to the rendezvous 198.18.200.12 leaves through eth0 (source 198.19.2.10), not the "
        "fabric interface enp1s0f1np1"]


def test_nccl_problem_counts_only_where_nccl_is_used():
    result = _rank("spark2", 1, "198.18.200.13")
    result["nccl"] = nccl_selection(None, SPARK2, "198.18.200.13")  # would pick eth0
    assert rank_problems(result, "spark2") == []
    result["backends"] = ["nccl", "gloo"]
    assert rank_problems(result, "spark2") == [
        "spark2: NCCL_SOCKET_IFNAME=<unset> selects interface eth0 (198.19.2.10), not the fabric address "
        "198.18.200.13; the fabric interface is enp1s0f1np1 (198.18.200.13)"]


# ---------------------------------------------------------------------------
# Carry-over and the report
# ---------------------------------------------------------------------------

ENVS = {
    "spark1": {"NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "NCCL_IB_TIMEOUT": "20"},
    "spark2": {"NCCL_SOCKET_IFNAME": "=enp1s0f1np1", "NCCL_IB_TIMEOUT": "22"},
}


@pytest.mark.parametrize(
    "envs, listed, expected",
    [
        (ENVS, ["NCCL_IB_TIMEOUT"], []),
        (ENVS, ["NCCL_SOCKET_IFNAME"], ["NCCL_IB_TIMEOUT differs between hosts (spark1=20, spark2=22)"]),
        (ENVS, None, ["spark1: " + NCO + " does not exist"]),
        ({"spark1": {"UCX_TLS": "rc"}, "spark2": {}}, [], ["UCX_TLS differs between hosts (spark1=rc, "
                                                           "spark2=<unset>)"]),
        ({"spark1": {"NCCL_DEBUG": "WARN"}, "spark2": {"NCCL_DEBUG": "WARN"}}, None, []),
    ],
)
def test_carry_over_problems(envs, listed, expected):
    problems = carry_over_problems(envs, listed, "spark1", NCO)
    assert len(problems) == len(expected)
    for problem, fragment in zip(problems, expected):
        assert fragment in problem


def _return(result, env, nco=None):
    return {"result": result, "env": env, "non_carry_over": nco, "non_carry_over_file": NCO,
            "elapsed": 12.5, "killed": False}


def test_assemble_report_passes_with_the_slowest_bandwidth():
    results = _ok()
    results["spark2"]["bandwidth"] = dict(results["spark2"]["bandwidth"], algbw_GBps=0.2, busbw_GBps=0.2)
    report = assemble_report({"spark1": _return(results["spark1"], ENVS["spark1"], ["NCCL_IB_TIMEOUT"]),
                              "spark2": _return(results["spark2"], ENVS["spark2"])}, "spark1")
    assert report["ok"] is True
    assert report["bandwidth"]["algbw_GBps"] == 0.2 and report["bandwidth"]["ranks"] == 2
    assert [r["host"] for r in report["ranks"]] == ["spark1", "spark2"]
    assert report["summary"][0].startswith("spark1 rank 0 ok (phase done) backends gloo gloo enp1s0f1np1")
    assert report["summary"][-1] == ("all-reduce of 64.0 MiB float32 over 2 ranks: 200.0 ms per op, "
                                     "algbw 0.200 GB/s, busbw 0.200 GB/s")


def test_assemble_report_fails_on_the_carry_over_hazard_after_a_good_rendezvous():
    results = _ok()
    report = assemble_report({"spark1": _return(results["spark1"], ENVS["spark1"], ["NCCL_SOCKET_IFNAME"]),
                              "spark2": _return(results["spark2"], ENVS["spark2"])}, "spark1")
    assert report["ok"] is False
    assert len(report["problems"]) == 1 and report["problems"][0].startswith("NCCL_IB_TIMEOUT differs")


def test_assemble_report_with_an_unreachable_host():
    results = _ok()
    report = assemble_report({"spark1": _return(copy.deepcopy(results["spark1"]), {}), "spark2": None}, "spark1")
    assert report["ok"] is False
    assert "spark2: the preflight rank printed no result" in report["problems"][0]
    assert json.dumps(report)  # plain data for Ansible


# --- reusing a proof -------------------------------------------------------------------------------------------

FP_PARAMS = {"rank": 0, "world_size": 2, "head_fabric_ip": "198.18.200.12", "fabric_ip": "198.18.200.12",
             "fabric_interface": "enp1s0f1np1", "port": 29600, "interpreter": ["/opt/venv/bin/python"],
             "base_env": {}, "backend": "auto", "local_rank": 0, "check_get_ip": True, "timeout": 60,
             "size_mib": 64, "iterations": 5}
FP_ENV = "VLLM_HOST_IP=198.18.200.12\nGLOO_SOCKET_IFNAME=enp1s0f1np1\n"
FP_VERSIONS = {"torch": "2.13.0", "vllm": "0.32.0", "ray": "2.60.0"}


def test_node_fingerprint_changes_with_what_the_rank_depends_on():
    base = rv.node_fingerprint(FP_PARAMS, FP_ENV, None, FP_VERSIONS)
    assert base == rv.node_fingerprint(dict(FP_PARAMS), FP_ENV, None, dict(FP_VERSIONS))
    changed = [
        rv.node_fingerprint(FP_PARAMS, FP_ENV.replace("enp1s0f1np1", "eth0"), None, FP_VERSIONS),
        rv.node_fingerprint(FP_PARAMS, FP_ENV, '["NCCL_IB_HCA"]', FP_VERSIONS),
        rv.node_fingerprint(FP_PARAMS, FP_ENV, None, dict(FP_VERSIONS, vllm="0.33.0")),
        rv.node_fingerprint(dict(FP_PARAMS, port=29601), FP_ENV, None, FP_VERSIONS),
        rv.node_fingerprint(dict(FP_PARAMS, world_size=3), FP_ENV, None, FP_VERSIONS),
        rv.node_fingerprint(dict(FP_PARAMS, interpreter=["/other/python"]), FP_ENV, None, FP_VERSIONS),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_node_fingerprint_ignores_the_measurement_settings():
    base = rv.node_fingerprint(FP_PARAMS, FP_ENV, None, FP_VERSIONS)
    assert rv.node_fingerprint(dict(FP_PARAMS, timeout=5, size_mib=1, iterations=1), FP_ENV, None, FP_VERSIONS) == base


def test_proof_reusable_only_when_every_node_proves_this_cluster():
    fps = {"spark1": "a" * 64, "spark2": "b" * 64}
    cluster = rv.cluster_fingerprint(fps)
    good = {"cluster_fingerprint": cluster, "age_s": 10.0}
    assert rv.proof_reusable({"spark1": good, "spark2": good}, fps, 86400)[0]

    ok, reason = rv.proof_reusable({"spark1": good, "spark2": None}, fps, 86400)
    assert not ok and reason.startswith("spark2 holds no proof")

    other = dict(good, cluster_fingerprint=rv.cluster_fingerprint({"spark1": "a" * 64, "spark2": "c" * 64}))
    ok, reason = rv.proof_reusable({"spark1": good, "spark2": other}, fps, 86400)
    assert not ok and reason.startswith("spark2: something the rendezvous depends on changed")

    ok, reason = rv.proof_reusable({"spark1": good, "spark2": dict(good, age_s=90000.0)}, fps, 86400)
    assert not ok and "older than 86400 s" in reason

    # A third node joining changes the cluster fingerprint even when the first two are unchanged.
    fps3 = dict(fps, spark3="d" * 64)
    assert not rv.proof_reusable({"spark1": good, "spark2": good, "spark3": good}, fps3, 86400)[0]


def test_parse_proof_rejects_broken_files():
    assert rv.parse_proof(None) is None
    assert rv.parse_proof("{not json") is None
    assert rv.parse_proof('{"hosts": []}') is None
    assert rv.parse_proof('{"cluster_fingerprint": "x"}') == {"cluster_fingerprint": "x"}


# --- the NCCL transport gate and the busbw floor (issue 22; log parsing in test__nccl_log.py) ---------------------

NCCL_LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "nccl"
SPARK_HCAS = ("rocep1s0f1:1", "roceP2p1s0f1:1")


def _nccl_lines(name):
    return (NCCL_LOGS / name).read_text().splitlines()[1:]  # the first line is the fixture's provenance


def _nccl_rank(host, rank, fabric_ip, log, expect="ib", hcas=SPARK_HCAS, **changes):
    return _rank(host, rank, fabric_ip, backend="nccl", backends=["nccl", "gloo"], nccl_log=_nccl_lines(log),
                 nccl_expect={"transport": expect, "hcas": list(hcas)}, **changes)


def test_gloo_ranks_are_never_held_to_the_nccl_gate():
    result = _rank("spark2", 1, "198.18.200.13", nccl_expect={"transport": "ib", "hcas": SPARK_HCAS})
    assert rank_problems(result, "spark2") == []


def test_nccl_over_sockets_where_the_fabric_has_rdma_fails_the_rank():
    result = _nccl_rank("spark1", 0, HEAD_IP, "h200-socket.spark1.log")
    (problem,) = rank_problems(result, "spark1")
    assert problem.startswith("spark1: NCCL carried the all-reduce over NET/Socket (fabric0:198.18.210.1<0>), not "
                              "NET/IB on rocep1s0f1:1, roceP2p1s0f1:1")
    assert rank_problems(_nccl_rank("spark1", 0, HEAD_IP, "h200-socket.spark1.log", expect="none"), "spark1") == []


def test_the_gate_waits_for_a_rank_that_finished():
    # A rank that hung (the H200's misconfigured worker) is the rendezvous messages' to explain, not the gate's.
    result = _nccl_rank("spark2", 1, "198.18.200.13", "h200-socket-mgmt.spark2.log", ok=False, phase="verify",
                        error_phase="verify", error="the rank did not finish before its deadline (30 s) in phase verify")
    assert not any("NCCL carried" in p or "names no network" in p for p in rank_problems(result, "spark2"))


def test_report_shows_each_rank_s_transport_and_passes_both_halves():
    results = {"spark1": _nccl_rank("spark1", 0, HEAD_IP, "spark-two-hcas.from-source.log"),
               "spark2": _nccl_rank("spark2", 1, "198.18.200.13", "spark-two-hcas.from-source.log")}
    report = assemble_report({h: _return(r, ENVS[h], ["NCCL_IB_TIMEOUT"]) for h, r in results.items()}, "spark1",
                             min_busbw_gbps=0.3)
    assert report["ok"] is True, report["problems"]
    assert report["ranks"][0]["nccl_transport"] == "NET/IB on rocep1s0f1:1, roceP2p1s0f1:1 (2 channels)"
    assert report["summary"][0].endswith("; NCCL NET/IB on rocep1s0f1:1, roceP2p1s0f1:1 (2 channels) "
                                         "(NCCL 2.28.9+cuda13.0)")
    assert report["bandwidth"]["host"] == "spark1"


def test_report_fails_below_the_busbw_floor_with_the_causes_in_order():
    results = {"spark1": _nccl_rank("spark1", 0, HEAD_IP, "spark-two-hcas.from-source.log"),
               "spark2": _nccl_rank("spark2", 1, "198.18.200.13", "spark-one-hca-mtu1500.from-source.log",
                                    hcas=["rocep1s0f1:1"])}
    results["spark2"]["bandwidth"] = dict(results["spark2"]["bandwidth"], algbw_GBps=0.2, busbw_GBps=0.2)
    fabrics = {"spark1": {"interface": FABRIC, "mtu": 9000}, "spark2": {"interface": FABRIC, "mtu": 1500}}
    report = assemble_report({h: _return(r, ENVS[h], ["NCCL_IB_TIMEOUT"]) for h, r in results.items()}, "spark1",
                             min_busbw_gbps=15, fabrics=fabrics, size_mib=64)
    assert report["ok"] is False
    (problem,) = report["problems"]
    lines = problem.split("\n")
    assert lines[0] == ("all-reduce busbw 0.20 GB/s (spark2, the slowest rank: 64.0 MiB float32 over 2 ranks) is below "
                        "distributed_preflight_min_busbw_gbps 15 GB/s. Likely causes, most likely first:")
    assert lines[1].strip().startswith("1. one HCA only: spark2: NCCL used rocep1s0f1:1 alone;")
    assert lines[2].strip().startswith("2. MTU 1500: spark2: enp1s0f1np1 MTU 1500, RoCE path MTU 1024 in NCCL's log;")
    assert lines[3].strip().startswith("3. GID type:")
    assert lines[4].strip().startswith("4. NCCL build: NCCL 2.28.9+cuda13.0 on spark1, spark2;")


def test_the_floor_is_not_judged_while_a_rank_failed():
    results = _ok()
    results["spark2"] = _rank("spark2", 1, "198.18.200.13", ok=False, error=TIMEOUT, error_phase="init")
    report = assemble_report({h: _return(r, ENVS[h], ["NCCL_IB_TIMEOUT"]) for h, r in results.items()}, "spark1",
                             min_busbw_gbps=15)
    assert not any("busbw" in p for p in report["problems"])


def test_node_fingerprint_changes_with_what_the_gate_expects():
    base = rv.node_fingerprint(FP_PARAMS, FP_ENV, None, FP_VERSIONS)
    changed = [
        rv.node_fingerprint(dict(FP_PARAMS, nccl_expect_transport="ib"), FP_ENV, None, FP_VERSIONS),
        rv.node_fingerprint(dict(FP_PARAMS, nccl_expect_hcas=SPARK_HCAS), FP_ENV, None, FP_VERSIONS),
        rv.node_fingerprint(dict(FP_PARAMS, min_busbw_gbps=15.0), FP_ENV, None, FP_VERSIONS),
    ]
    assert base not in changed and len(set(changed)) == len(changed)
