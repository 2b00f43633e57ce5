# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""distributed_preflight's NCCL gate in the module: a stand-in interpreter prints what a rank prints (no torch
here), and the module judges the transport from the NCCL lines and the busbw against its floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._node_rendezvous_rank import MARKER
from ansible_collections.multinode.vllm.plugins.modules import distributed_preflight

NCCL_LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "nccl"
SPARK_HCAS = ["rocep1s0f1:1", "roceP2p1s0f1:1"]


def _rank_result(log, busbw, expect):
    return {"host": "spark1", "rank": 0, "world_size": 2, "ok": True, "final": True, "phase": "done",
            "error": None, "error_phase": None, "fabric_ip": "198.18.200.12", "fabric_interface": "enp1s0f1np1",
            "head_ip": "198.18.200.12", "port": 29600, "backend": "nccl", "backends": ["nccl", "gloo"],
            "route_to_head": {"source_ip": "198.18.200.12", "interface": "enp1s0f1np1", "error": None},
            "nccl_log": (NCCL_LOGS / log).read_text().splitlines()[1:], "nccl_expect": expect,
            "bandwidth": {"bytes": 1 << 30, "dtype": "float32", "iterations": 5, "seconds_per_op": 0.05,
                          "algbw_GBps": busbw, "busbw_GBps": busbw}}


@pytest.fixture
def module_run(run_main, tmp_path):
    env_file = tmp_path / "node.env"
    env_file.write_text("VLLM_HOST_IP=198.18.200.12\nNCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1\n")

    def run(log, busbw, **params):
        expect = {"transport": params.get("nccl_expect_transport", "none"),
                  "hcas": params.get("nccl_expect_hcas", [])}
        printed = tmp_path / "printed.txt"
        printed.write_text(MARKER + json.dumps(_rank_result(log, busbw, expect)) + "\n")
        fake = tmp_path / "python"
        fake.write_text("#!/bin/sh\ncat %s\n" % printed)
        fake.chmod(0o755)
        args = {"host": "spark1", "rank": 0, "world_size": 2, "head_host": "spark1",
                "head_fabric_ip": "198.18.200.12", "fabric_ip": "198.18.200.12", "fabric_interface": "enp1s0f1np1",
                "env_file": str(env_file), "interpreter": [str(fake)], "timeout": 10,
                "non_carry_over_file": str(tmp_path / "absent.json")}
        args.update(params)
        return run_main(distributed_preflight.main, args)

    return run


def test_ib_on_both_halves_above_the_floor_passes(module_run):
    code, result = module_run("spark-two-hcas.from-source.log", 23.7, nccl_expect_transport="ib",
                              nccl_expect_hcas=SPARK_HCAS, min_busbw_gbps=15)
    assert code == 0, result
    assert result["problems"] == []


def test_sockets_where_ib_is_expected_fail_the_module(module_run):
    code, result = module_run("h200-socket.spark1.log", 1.85, nccl_expect_transport="ib", nccl_expect_hcas=SPARK_HCAS)
    assert code == 1
    assert result["msg"].startswith("spark1: NCCL carried the all-reduce over NET/Socket (fabric0:198.18.210.1<0>), "
                                    "not NET/IB on rocep1s0f1:1, roceP2p1s0f1:1")


def test_the_floor_fails_the_module_unless_report_only(module_run):
    code, result = module_run("spark-one-hca-mtu1500.from-source.log", 3.04, min_busbw_gbps=15)
    assert code == 1
    assert result["msg"].startswith("all-reduce busbw 3.04 GB/s (spark1, the slowest rank: 1024.0 MiB float32 over 2 "
                                    "ranks) is below distributed_preflight_min_busbw_gbps 15 GB/s.")
    assert "1. one HCA only: spark1: NCCL used rocep1s0f1:1 alone" in result["msg"]
    code, result = module_run("spark-one-hca-mtu1500.from-source.log", 3.04, min_busbw_gbps=15, report_only=True)
    assert code == 0 and result["problems"] == []  # the role judges the cluster's slowest rank


def test_ib_without_hcas_is_refused(module_run):
    code, result = module_run("spark-two-hcas.from-source.log", 23.7, nccl_expect_transport="ib")
    assert code == 1
    assert result["msg"].startswith("spark1: nccl_expect_transport is ib but nccl_expect_hcas is empty;")
