# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""NCCL's log read for its transport, the NET/IB gate and the busbw floor's causes, on real NCCL lines
(tests/unit/fixtures/logs/nccl, provenance in each file and in ../README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._nccl_log import (
    busbw_causes,
    busbw_problem,
    kept_lines,
    parse_nccl_log,
    transport,
    transport_line,
    transport_problems,
)
from ansible_collections.multinode.vllm.plugins.module_utils._node_rendezvous_rank import (
    nccl_debug_settings,
    read_nccl_log,
)

NCCL_LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "nccl"
SPARK_HCAS = ["rocep1s0f1:1", "roceP2p1s0f1:1"]


def _log(name: str) -> list[str]:
    lines = (NCCL_LOGS / name).read_text().splitlines()
    assert lines[0].startswith("# Provenance: "), name  # every fixture says where it comes from
    return kept_lines(lines[1:])


def _parsed(name: str) -> dict:
    return parse_nccl_log(_log(name))


def test_every_fixture_says_where_it_comes_from():
    names = sorted(p.name for p in NCCL_LOGS.glob("*.log"))
    assert len(names) >= 8
    for name in names:
        first = (NCCL_LOGS / name).read_text().splitlines()[0]
        assert first.startswith("# Provenance: ")
        if name.endswith(".from-source.log"):
            assert "NOT recorded" in first
        else:
            assert "verbatim" in first or "copied unchanged" in first


# --- parsing ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("h200-socket.spark1.log", {"network": "Socket", "socket_devices": ["fabric0:198.18.210.1<0>"],
                                    "channels": {"NET/Socket/0": 1}, "ib_devices": [], "version": None}),
        ("h200-socket.spark2.log", {"network": None, "socket_devices": ["fabric0:198.18.210.2<0>"],
                                    "channels": {"NET/Socket/0": 1}}),
        ("h200-socket-mgmt.spark2.log", {"socket_devices": ["mgmt0:10.251.0.2<0>"], "channels": {}}),
        ("nccl-tests-185.roce.log", {"network": "IB", "ib_devices": ["mlx5_10:1", "mlx5_11:1"],
                                     "ib_links": ["RoCE", "RoCE"], "version": "2.19.3+cuda12.3", "channels": {}}),
        ("nccl-1412.ib-channels.log", {"channels": {"NET/IB/3": 4}, "gdr": False}),
        ("nccl-952.socket-fallback.log", {"channels": {"NET/Socket/3": 2}}),
        ("nccl-tests-29.old-format.log", {"socket_devices": ["enp41s0f1:<0>", "virbr0:<0>"],
                                          "ib_devices": ["mlx5_0:1"], "ib_links": ["IB"]}),
        ("vllm-dgx-spark-1.ibext.log", {"channels": {"NET/IBext_v10/1": 1, "NET/IBext_v10/0": 1},
                                        "ib_devices": []}),
        ("spark-two-hcas.from-source.log", {"network": "IB", "ib_devices": SPARK_HCAS, "version": "2.28.9+cuda13.0",
                                            "channels": {"NET/IB/0": 1, "NET/IB/1": 1},
                                            "qps": [{"ibdev": 0, "port": 1, "mtu": 4096, "gid": 3},
                                                    {"ibdev": 1, "port": 1, "mtu": 4096, "gid": 3}]}),
        ("spark-one-hca-mtu1500.from-source.log", {"ib_devices": ["rocep1s0f1:1"],
                                                   "qps": [{"ibdev": 0, "port": 1, "mtu": 1024, "gid": 0}]}),
    ],
)
def test_parse_nccl_log(name, expected):
    parsed = _parsed(name)
    for key, value in expected.items():
        assert parsed[key] == value, (key, parsed)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("h200-socket.spark1.log", "Socket"),
        ("h200-socket.spark2.log", "Socket"),
        ("h200-socket-mgmt.spark2.log", None),  # NCCL hung before its first channel: the log does not say
        ("nccl-tests-185.roce.log", "IB"),  # no channel line kept: "Using network IB" decides
        ("nccl-1412.ib-channels.log", "IB"),  # P2P channels are intra-node and do not count
        ("nccl-952.socket-fallback.log", "Socket"),
        ("vllm-dgx-spark-1.ibext.log", "IB"),  # an external IB plugin is NET/IB too
        ("spark-two-hcas.from-source.log", "IB"),
    ],
)
def test_transport(name, kind):
    assert transport(_parsed(name)) == kind


def test_kept_lines_are_what_the_parser_needs():
    lines = (NCCL_LOGS / "vllm-dgx-spark-1.ibext.log").read_text().splitlines()[1:]
    kept = kept_lines(lines)
    assert not any("Connected to proxy" in line for line in kept)
    everything = parse_nccl_log(lines)
    assert dict(parse_nccl_log(kept), lines=None) == dict(everything, lines=None)  # only the count differs


def test_transport_line():
    assert transport_line(_parsed("h200-socket.spark1.log")) == "NET/Socket on fabric0:198.18.210.1<0> (1 channel)"
    assert transport_line(_parsed("spark-two-hcas.from-source.log")) == (
        "NET/IB on rocep1s0f1:1, roceP2p1s0f1:1 (2 channels)")
    assert transport_line(parse_nccl_log([])) == "no NCCL log"


# --- the gate ---------------------------------------------------------------------------------------------------


def test_two_hcas_on_ib_pass():
    assert transport_problems("spark1", _parsed("spark-two-hcas.from-source.log"), "ib", SPARK_HCAS) == []


def test_nothing_is_expected_without_rdma():
    assert transport_problems("spark1", _parsed("h200-socket.spark1.log"), "none", []) == []


def test_socket_where_ib_is_expected_names_host_transport_and_hcas():
    problems = transport_problems("spark1", _parsed("h200-socket.spark1.log"), "ib", SPARK_HCAS)
    assert problems == [
        "spark1: NCCL carried the all-reduce over NET/Socket (fabric0:198.18.210.1<0>), not NET/IB on rocep1s0f1:1, "
        "roceP2p1s0f1:1, the fabric port's RDMA ports; the rank's runtime must see the RDMA devices (under docker "
        "/dev/infiniband, IPC_LOCK and an unlimited memlock; rdma-core's libibverbs in the image), and "
        "NCCL_IB_DISABLE=1, NCCL_NET=Socket or an NCCL_IB_HCA that matches no device must not be in its environment"]


def test_socket_fallback_says_no_device_when_nccl_did():
    parsed = parse_nccl_log(_log("nccl-952.socket-fallback.log") + ["host:1:1 [0] NCCL INFO NET/IB : No device found."])
    (problem,) = transport_problems("gpu1", parsed, "ib", ["mlx5_0:1"])
    assert "over NET/Socket (?)" in problem and "NCCL found no RDMA device ('NET/IB : No device found.')" in problem


def test_one_hca_of_two_names_the_missing_half():
    (problem,) = transport_problems("spark2", _parsed("spark-one-hca-mtu1500.from-source.log"), "ib", SPARK_HCAS)
    assert problem == (
        "spark2: NCCL's NET/IB uses rocep1s0f1:1, not roceP2p1s0f1:1 of the fabric port (NCCL_IB_HCA lists "
        "rocep1s0f1:1, roceP2p1s0f1:1); with one HCA a DGX Spark's port reaches about half its bandwidth: check that "
        "roceP2p1s0f1 is ACTIVE on this host and that nothing in the rank's environment (an image's /etc/nccl.conf, "
        "a launcher) overrides NCCL_IB_HCA")


def test_an_hca_off_the_fabric_port_is_named():
    (problem,) = transport_problems("dgxh100-4", _parsed("nccl-tests-185.roce.log"), "ib", ["mlx5_10:1"])
    assert problem.startswith("dgxh100-4: NCCL's NET/IB also uses mlx5_11:1, which is not on the fabric port "
                              "(expected mlx5_10:1)")
    assert "NCCL_IB_HCA==mlx5_10:1" in problem
    assert transport_problems("dgxh100-4", _parsed("nccl-tests-185.roce.log"), "ib", ["mlx5_10:1", "mlx5_11:1"]) == []


def test_ib_channels_without_the_device_line_pass():
    # An external plugin's channels (IBext_v10) are NET/IB; the excerpt has no "NET/IB : Using" line to compare.
    assert transport_problems("spark-3995", _parsed("vllm-dgx-spark-1.ibext.log"), "ib", SPARK_HCAS) == []


def test_silence_does_not_pass_the_gate():
    (problem,) = transport_problems("spark2", _parsed("h200-socket-mgmt.spark2.log"), "ib", SPARK_HCAS)
    assert problem.startswith("spark2: NCCL's log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, 1 lines kept) names "
                              "no network, so NET/IB on rocep1s0f1:1, roceP2p1s0f1:1 cannot be confirmed")


# --- the busbw floor --------------------------------------------------------------------------------------------

FABRIC_OK = {"interface": "enp1s0f1np1", "mtu": 9000, "hca_ports": SPARK_HCAS, "fabric_port": [
    {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "mtu": 9000, "gid_index": 3, "used": True, "problem": None},
    {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "mtu": 9000, "gid_index": 3, "used": True, "problem": None},
]}
FABRIC_BAD = {"interface": "enp1s0f1np1", "mtu": 1500, "hca_ports": ["rocep1s0f1:1"], "fabric_port": [
    {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "mtu": 1500, "gid_index": 3, "used": True, "problem": None},
    {"netdev": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "mtu": 1500, "gid_index": None, "used": False,
     "problem": "enP2p1s0f1np1 has no IPv4 address"},
]}
# The slowest rank of the misconfigured pair, at the figure issue 102 reports.
SLOW = {"host": "spark2", "bytes": 1 << 30, "dtype": "float32", "iterations": 5, "seconds_per_op": 0.353,
        "algbw_GBps": 3.04, "busbw_GBps": 3.04, "ranks": 2}


def test_busbw_above_the_floor_or_no_floor_passes():
    assert busbw_problem(dict(SLOW, busbw_GBps=23.74), 15, {}, {}, {}) is None
    assert busbw_problem(SLOW, 0, {}, {}, {}) is None
    assert busbw_problem(SLOW, None, {}, {}, {}) is None


def test_busbw_below_the_floor_names_the_causes_in_order_with_what_was_seen():
    parsed = {"spark1": _parsed("spark-two-hcas.from-source.log"),
              "spark2": _parsed("spark-one-hca-mtu1500.from-source.log")}
    message = busbw_problem(SLOW, 15, parsed, {"spark1": FABRIC_OK, "spark2": FABRIC_BAD},
                            {"spark1": {}, "spark2": {"NCCL_IB_GID_INDEX": "0"}})
    head, *causes = message.split("\n")
    assert head == ("all-reduce busbw 3.04 GB/s (spark2, the slowest rank: 1024.0 MiB float32 over 2 ranks) is below "
                    "distributed_preflight_min_busbw_gbps 15 GB/s. Likely causes, most likely first:")
    assert [c.strip()[:3] for c in causes] == ["1. ", "2. ", "3. ", "4. "]
    assert causes[0].strip() == (
        "1. one HCA only: spark2: NCCL used rocep1s0f1:1 of a fabric port with 2 endpoints (enP2p1s0f1np1 left out: "
        "enP2p1s0f1np1 has no IPv4 address); list both halves of a DGX Spark's port in NCCL_IB_HCA, each up, "
        "addressed and at the same MTU (docs/fabric.md)")
    assert causes[1].strip().startswith(
        "2. MTU 1500: spark2: enp1s0f1np1 MTU 1500, enP2p1s0f1np1 MTU 1500, RoCE path MTU 1024 in NCCL's log; set MTU "
        "9000 on both halves")
    assert causes[2].strip().startswith(
        "3. GID type: spark2: NCCL connected rocep1s0f1 with GID 0, the RoCE v2 GID of its address is 3; spark2: "
        "NCCL_IB_GID_INDEX=0 pins one index for every HCA; let NCCL choose")
    assert causes[3].strip().startswith("4. NCCL build: NCCL 2.28.9+cuda13.0 on spark1, spark2; a release NCCL "
                                        "reached 23.74 GB/s busbw where a development build gave 3.04 GB/s")
    # docs/distributed-preflight.md shows this very message.
    docs = (Path(__file__).resolve().parents[4] / "docs" / "distributed-preflight.md").read_text()
    assert "```text\n%s\n```" % message in docs


def test_busbw_causes_say_not_seen_when_the_run_shows_none():
    causes = busbw_causes({"spark1": _parsed("spark-two-hcas.from-source.log")}, {"spark1": FABRIC_OK}, {})
    assert causes[0].startswith("1. one HCA only: not seen")
    assert causes[1].startswith("2. MTU 1500: not seen")
    assert causes[2].startswith("3. GID type: not seen")
    assert causes[3].startswith("4. NCCL build: NCCL 2.28.9+cuda13.0 on spark1;")


def test_busbw_causes_name_different_nccl_builds():
    parsed = {"a": _parsed("nccl-tests-185.roce.log"), "b": _parsed("spark-two-hcas.from-source.log")}
    assert busbw_causes(parsed, {}, {})[3].startswith(
        "4. NCCL build: different NCCL builds: a 2.19.3+cuda12.3, b 2.28.9+cuda13.0;")


def test_a_floor_without_a_measurement_fails():
    assert busbw_problem(None, 15, {}, {}, {}, size_mib=0) == (
        "distributed_preflight_min_busbw_gbps is 15 GB/s but no all-reduce was timed (distributed_preflight_size_mib "
        "is 0); set a size of at least 256 MiB, or the floor to 0")


# --- the rank's side (node script) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "/w/nccl.log"}),
        ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                                  "NCCL_DEBUG_FILE": "/w/nccl.log"}),
        # The H200 harness's own settings are kept (its file is read instead).
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV", "NCCL_DEBUG_FILE": "/n/nccl.%p.log"}, {}),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL", "NCCL_DEBUG_FILE": "/n/x"}, {}),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^NET", "NCCL_DEBUG_FILE": "/n/x"},
         {"NCCL_DEBUG_SUBSYS": "INIT,NET"}),
        ({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "COLL"}, {"NCCL_DEBUG_SUBSYS": "INIT,NET",
                                                               "NCCL_DEBUG_FILE": "/w/nccl.log"}),
    ],
)
def test_nccl_debug_settings(environ, expected):
    settings, pattern = nccl_debug_settings(environ, "/w")
    assert settings == expected
    assert pattern == environ.get("NCCL_DEBUG_FILE", "/w/nccl.log")


def test_read_nccl_log_substitutes_host_and_pid_and_keeps_the_network_lines(tmp_path):
    full = (NCCL_LOGS / "vllm-dgx-spark-1.ibext.log").read_text().splitlines()[1:]
    (tmp_path / "nccl.node7.4242.log").write_text("\n".join(full) + "\n")
    lines = read_nccl_log(str(tmp_path / "nccl.%h.%p.log"), pid=4242, hostname="node7.example")
    assert lines == kept_lines(full)
    # A host name NCCL wrote differently still finds the rank's own file by its pid.
    assert read_nccl_log(str(tmp_path / "nccl.%h.%p.log"), pid=4242, hostname="other") == lines
    assert read_nccl_log(str(tmp_path / "nccl.%h.%p.log"), pid=1, hostname="node7") == []
