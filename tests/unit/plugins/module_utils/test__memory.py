# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unified memory: the parsers on recorded and modelled outputs (fixtures/memory/README.md), detection, the plan."""

from __future__ import annotations

import os

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._memory import (
    GIB,
    MemoryPlanError,
    derive_utilization,
    detect_unified,
    memory_plan,
    parse_gpu_query,
    parse_meminfo,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "memory")


def fixture(name: str) -> str:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return handle.read()


def node(meminfo: str, query: str = "") -> dict:
    info = parse_meminfo(fixture(meminfo))
    gpus = parse_gpu_query(fixture(query)) if query else []
    unified, reason = detect_unified(gpus, info["MemTotal"])
    return {"unified": unified, "reason": reason, "gpus": gpus, "mem_total": info["MemTotal"],
            "mem_available": info["MemAvailable"], "mem_free": info["MemFree"]}


SPARK = "gb10-meminfo.txt"
SPARK_CACHED = "gb10-meminfo-page-cache.txt"
RESERVE = 8 * GIB
KV = 4 * GIB


def test_parse_meminfo_in_bytes():
    info = parse_meminfo(fixture(SPARK))
    assert info["MemTotal"] == 127600748 * 1024
    assert info["MemAvailable"] == 118566368 * 1024
    assert info["HugePages_Total"] == 0  # no unit: as is
    lab = parse_meminfo(fixture("lab-meminfo.txt"))
    assert {"MemTotal", "MemFree", "MemAvailable"} <= set(lab)


@pytest.mark.parametrize("name, expected", [
    ("gb10-query.csv", [{"index": 0, "name": "NVIDIA GB10", "memory_total": None}]),
    ("gb10-query-reported.csv", [{"index": 0, "name": "NVIDIA GB10", "memory_total": 124610 * 1024 ** 2}]),
    ("h200-query.csv", [{"index": 0, "name": "NVIDIA H200", "memory_total": 143771 * 1024 ** 2}]),
])
def test_parse_gpu_query(name, expected):
    assert parse_gpu_query(fixture(name)) == expected


@pytest.mark.parametrize("text", ["", "No devices were found\n", "0, NVIDIA GB10\n", "index, name, memory.total\n"])
def test_parse_gpu_query_skips_what_is_no_gpu_line(text):
    assert parse_gpu_query(text) == []


@pytest.mark.parametrize("field", ["[N/A]", "[Not Supported]", "N/A", " [N/A] MiB"])
def test_memory_not_reported_is_none(field):
    assert parse_gpu_query("1, NVIDIA GB10, %s\n" % field)[0]["memory_total"] is None


@pytest.mark.parametrize("meminfo, query, unified, reason", [
    (SPARK, "gb10-query.csv", True, "GPU 0 is NVIDIA GB10 (unified memory)"),
    (SPARK, "gb10-query-reported.csv", True, "GPU 0 is NVIDIA GB10 (unified memory)"),
    ("h200-meminfo.txt", "h200-query.csv", False, "discrete GPU memory (NVIDIA H200)"),
    ("lab-meminfo.txt", "", False, "no NVIDIA GPU"),
])
def test_detect_on_fixtures(meminfo, query, unified, reason):
    facts = node(meminfo, query)
    assert (facts["unified"], facts["reason"]) == (unified, reason)


def test_detect_by_total_equal_to_memtotal():
    # A GPU not named GB10 whose total is MemTotal (gb10-query-reported.csv's figure under another name).
    mem_total = parse_meminfo(fixture(SPARK))["MemTotal"]
    gpus = [{"index": 0, "name": "NVIDIA Thor", "memory_total": 124610 * 1024 ** 2}]
    assert detect_unified(gpus, mem_total) == (
        True, "GPU 0 (NVIDIA Thor) reports 121.7 GiB, the system's MemTotal 121.7 GiB (one pool)")
    gpus[0]["memory_total"] = None
    assert detect_unified(gpus, mem_total) == (False, "discrete GPU memory (NVIDIA Thor)")


def test_derive_utilization_on_a_spark_at_rest():
    info = parse_meminfo(fixture(SPARK))
    # (113.07 - 8) / 121.69 = 0.863...
    assert derive_utilization("spark1", info["MemAvailable"], info["MemTotal"], RESERVE) == 0.86
    assert derive_utilization("spark1", info["MemAvailable"], info["MemTotal"], RESERVE, ranks=2) == 0.43


def test_derive_utilization_refuses_when_nothing_is_left():
    with pytest.raises(MemoryPlanError) as err:
        derive_utilization("spark2", 6 * GIB, 121 * GIB, RESERVE)
    assert str(err.value) == (
        "spark2: MemAvailable 6.0 GiB minus serve_memory_reserve_bytes 8.0 GiB leaves nothing for vLLM on this "
        "unified-memory host (MemTotal 121.0 GiB); stop what else holds memory there (or set serve_drop_caches: "
        "true), or lower serve_memory_reserve_bytes")


def plan(nodes, utilization=None, model_bytes=None, world_size=2, running=None, **kw):
    return memory_plan(nodes, utilization, kw.pop("reserve", RESERVE), kw.pop("kv_reserve", KV), model_bytes,
                       world_size, kw.pop("gpus_per_node", 1), running_utilization=running,
                       model_path="/models/m", **kw)


def test_no_unified_node_changes_nothing():
    nodes = {"spark1": node("lab-meminfo.txt"), "spark2": node("h200-meminfo.txt", "h200-query.csv")}
    for utilization in (None, 0.9):
        result = plan(nodes, utilization=utilization, model_bytes=10 ** 15)
        assert result == {"gpu_memory_utilization": utilization, "derived": False, "unified_hosts": [],
                          "errors": [], "warnings": [], "lines": []}


def test_derived_is_the_smallest_of_the_unified_nodes():
    nodes = {"spark1": node(SPARK, "gb10-query.csv"), "spark2": node(SPARK_CACHED, "gb10-query.csv")}
    result = plan(nodes, model_bytes=120 * GIB)
    assert result["derived"] is True and result["errors"] == [] and result["unified_hosts"] == ["spark1", "spark2"]
    # spark2: (112.0 - 8) / 121.69 = 0.854
    assert result["gpu_memory_utilization"] == 0.85
    assert result["lines"][0] == (
        "gpu_memory_utilization 0.85: derived on spark2 from MemAvailable 112.0 GiB minus serve_memory_reserve_bytes "
        "8.0 GiB over MemTotal 121.7 GiB (unified memory; the smallest of spark1 0.86, spark2 0.85)")
    assert result["lines"][1:] == ["spark1: 60.0 GiB of weights and 4.0 GiB of KV reserve within a budget of 103.4 GiB",
                                   "spark2: 60.0 GiB of weights and 4.0 GiB of KV reserve within a budget of 103.4 GiB"]
    # The page cache on spark2 leaves MemFree (71.4 GiB) below the budget: vLLM's startup check may refuse.
    assert result["warnings"] == [
        "spark2: MemFree 71.4 GiB is below vLLM's budget 103.4 GiB (the rest of MemAvailable 112.0 GiB is page "
        "cache); vLLM's startup check reads MemFree on unified memory (vllm-project/vllm#48140) and may refuse to "
        "start; set serve_drop_caches: true to drop the page cache before the start"]


def test_model_that_does_not_fit_fails_before_load():
    nodes = {"spark1": node(SPARK, "gb10-query.csv"), "spark2": node(SPARK, "gb10-query.csv")}
    result = plan(nodes, model_bytes=230 * GIB)
    assert result["gpu_memory_utilization"] == 0.86
    assert result["errors"][0] == (
        "spark1: the model needs 119.0 GiB here (115.0 GiB of weights: 230.0 GiB in /models/m over 2 rank(s), 1 on "
        "this host, and serve_kv_cache_reserve_bytes 4.0 GiB per rank), more than vLLM's budget of 104.7 GiB "
        "(gpu_memory_utilization 0.86 x MemTotal 121.7 GiB) on this unified-memory host; free memory on it, spread "
        "the model over more nodes (tensor or pipeline parallel), use a smaller or quantized model, or lower "
        "serve_kv_cache_reserve_bytes")
    assert len(result["errors"]) == 2 and result["errors"][1].startswith("spark2: the model needs 119.0 GiB")
    # Over four nodes it fits.
    assert plan(dict(nodes, spark3=nodes["spark1"], spark4=nodes["spark1"]), model_bytes=230 * GIB,
                world_size=4)["errors"] == []


def test_kv_reserve_counts():
    nodes = {"spark1": node(SPARK, "gb10-query.csv")}
    assert plan(nodes, model_bytes=100 * GIB, world_size=1)["errors"] == []
    assert plan(nodes, model_bytes=100 * GIB, world_size=1, kv_reserve=5 * GIB)["errors"][0].startswith(
        "spark1: the model needs 105.0 GiB here")


def test_user_value_over_available_memory_is_refused():
    nodes = {"spark1": node(SPARK, "gb10-query.csv")}
    result = plan(nodes, utilization=0.95, model_bytes=10 * GIB)
    assert result["gpu_memory_utilization"] == 0.95 and result["derived"] is False
    assert result["errors"] == [
        "spark1: vllm_gpu_memory_utilization = 0.95 asks for 115.6 GiB of this host's unified memory (x MemTotal "
        "121.7 GiB), but MemAvailable 113.1 GiB minus serve_memory_reserve_bytes 8.0 GiB leaves 105.1 GiB, and an "
        "over-budget start can freeze the host; set it to at most 0.86, or leave it unset to derive it"]
    assert plan(nodes, utilization=0.8, model_bytes=10 * GIB)["errors"] == []


def test_running_serve_keeps_its_value_and_skips_the_available_check():
    # While vLLM runs its memory is not in MemAvailable: nothing is derived again (no restart with a smaller value),
    # and a user value is not compared with MemAvailable; the model must still fit the budget.
    busy = node(SPARK, "gb10-query.csv")
    busy["mem_available"] = busy["mem_free"] = 9 * GIB
    nodes = {"spark1": busy}
    result = plan(nodes, running=0.86, model_bytes=60 * GIB, world_size=1)
    assert (result["gpu_memory_utilization"], result["derived"], result["errors"], result["warnings"]) == (
        0.86, False, [], [])
    assert result["lines"][0].startswith("gpu_memory_utilization 0.86: kept from the running vllm serve")
    assert plan(nodes, utilization=0.9, running=0.86, model_bytes=60 * GIB, world_size=1)["errors"] == []
    assert plan(nodes, running=0.3, model_bytes=60 * GIB, world_size=1)["errors"][0].startswith(
        "spark1: the model needs 64.0 GiB here")


def test_running_serve_without_the_flag_keeps_vllm_default():
    busy = node(SPARK, "gb10-query.csv")
    busy["mem_available"] = 9 * GIB
    result = memory_plan({"spark1": busy}, None, RESERVE, KV, 60 * GIB, 1, 1, serve_running=True)
    assert (result["gpu_memory_utilization"], result["errors"]) == (None, [])
    assert result["lines"] == ["gpu_memory_utilization: vLLM's default, as the running vllm serve was started (its "
                               "memory is not available while it runs; stop it to derive a value)"]
    # Not running: derived (and here refused: 9 GiB available, 8 GiB reserve).
    result = memory_plan({"spark1": busy}, None, RESERVE, KV, 60 * GIB, 1, 1, running_utilization=0.5,
                         serve_running=False)
    assert result["errors"][0].startswith("spark1: MemAvailable 9.0 GiB minus serve_memory_reserve_bytes 8.0 GiB")


def test_unknown_model_size_skips_the_fit_check():
    result = plan({"spark1": node(SPARK, "gb10-query.csv")})
    assert result["errors"] == [] and result["lines"][-1] == (
        "the model's size is unknown (vllm_model is not a directory on the head): the fit check is skipped")


def test_derivation_failure_names_each_host():
    low = node(SPARK, "gb10-query.csv")
    low["mem_available"] = 7 * GIB
    result = plan({"spark1": node(SPARK, "gb10-query.csv"), "spark2": low}, model_bytes=GIB)
    assert result["gpu_memory_utilization"] is None
    assert [e.split(":")[0] for e in result["errors"]] == ["spark2"]


@pytest.mark.parametrize("value", [0, 1.5, -0.1])
def test_utilization_out_of_range(value):
    result = plan({"spark1": node(SPARK, "gb10-query.csv")}, utilization=value)
    assert result["errors"] == ["vllm_gpu_memory_utilization = %r: expected a fraction above 0 and at most 1; set it "
                                "so, or leave it unset to derive it on unified-memory hosts" % (value,)]


def test_docs_show_what_the_plan_says():
    # docs/serve.md, "Unified memory": its example lines are the plan's own, on the fixtures.
    doc = os.path.join(FIXTURES, "..", "..", "..", "..", "docs", "serve.md")
    if not os.path.exists(doc):
        pytest.skip("docs/ is not part of this copy of the collection")
    with open(doc, encoding="utf-8") as handle:
        docs = handle.read()
    spark = node(SPARK, "gb10-query.csv")
    shown = plan({"spark1": spark, "spark2": spark}, model_bytes=120 * GIB)["lines"][:2]
    shown += plan({"spark1": spark, "spark2": spark}, model_bytes=230 * GIB)["errors"][:1]
    shown += plan({"spark1": spark}, utilization=0.95, model_bytes=10 * GIB)["errors"]
    shown += plan({"spark1": spark, "spark2": node(SPARK_CACHED, "gb10-query.csv")}, model_bytes=120 * GIB)["warnings"]
    for line in shown:
        assert line in docs, line
