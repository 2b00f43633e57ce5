# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_serve_args (controller side): sizes checked, unknown settings named, raised as a filter error.

Kept out of tests/unit/plugins/modules/test_vllm_ready.py: ansible-test units runs module tests with
only ansible.module_utils on the path, and this filter (like the test) needs ansible.errors.
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._serve_memory_plan import serve_memory_plan
from ansible_collections.multinode.vllm.plugins.filter.vllm_serve_args import vllm_serve_args


def test_serve_args_filter_checks_sizes_and_names_unknown_settings():
    settings = {"model": "/m", "tensor_parallel_size": 2, "api_host": "198.19.1.10"}
    args = vllm_serve_args(settings, backend="ray", gpus_per_node={"spark1": 1, "spark2": 1})
    assert args[:2] == ["serve", "/m"] and "--distributed-executor-backend" in args
    with pytest.raises(AnsibleFilterError, match="but the 1 nodes have 1 GPUs"):
        vllm_serve_args(settings, backend="ray", gpus_per_node={"spark1": 1})
    with pytest.raises(AnsibleFilterError, match="unknown settings colour"):
        vllm_serve_args(dict(settings, colour="red"), backend="ray", gpus_per_node={"a": 2})


# _serve_memory_plan: the serve role's memory.yml (docs/serve.md, "Unified memory")

GIB = 1024 ** 3
SPARK_MEMORY = {"unified": True, "mem_total": 127600748 * 1024, "mem_available": 118566368 * 1024,
                "mem_free": 116812340 * 1024}  # fixtures/memory/gb10-meminfo.txt
LAB_MEMORY = {"unified": False, "mem_total": 24 * GIB, "mem_available": 20 * GIB, "mem_free": 4 * GIB}


def test_serve_memory_plan_lab_passes_the_user_value_through():
    hostvars = {"spark1": {"multinode_memory": LAB_MEMORY}, "spark2": {"multinode_memory": LAB_MEMORY}}
    for value in (None, "", 0.5, "0.5"):
        plan = serve_memory_plan(hostvars, ["spark1", "spark2"], utilization=value, reserve=8 * GIB,
                                 kv_reserve=4 * GIB, model_bytes=None, world_size=2)
        assert plan["gpu_memory_utilization"] == (None if value in (None, "") else 0.5)
        assert plan["unified_hosts"] == [] and plan["errors"] == [] and plan["lines"] == []


def test_serve_memory_plan_derives_on_sparks_and_refuses_a_model_too_big():
    hostvars = {"spark1": {"multinode_memory": SPARK_MEMORY}, "spark2": {"multinode_memory": SPARK_MEMORY}}
    args = dict(reserve=str(8 * GIB), kv_reserve=4 * GIB, model_path="/models/m", world_size="2", gpus_per_node="1")
    plan = serve_memory_plan(hostvars, ["spark1", "spark2"], model_bytes=str(100 * GIB), **args)
    assert (plan["gpu_memory_utilization"], plan["derived"], plan["errors"]) == (0.86, True, [])
    plan = serve_memory_plan(hostvars, ["spark1", "spark2"], model_bytes=230 * GIB, **args)
    assert [e.split(":")[0] for e in plan["errors"]] == ["spark1", "spark2"]


def test_serve_memory_plan_needs_every_host_read():
    with pytest.raises(AnsibleFilterError, match="^spark2: no multinode_memory fact; run multinode.vllm.memory_facts"):
        serve_memory_plan({"spark1": {"multinode_memory": SPARK_MEMORY}, "spark2": {}}, ["spark1", "spark2"],
                          reserve=0, kv_reserve=0, world_size=2)


def test_serve_memory_plan_running_serve_from_jinja():
    busy = dict(SPARK_MEMORY, mem_available=9 * GIB)
    hostvars = {"spark1": {"multinode_memory": busy}}
    plan = serve_memory_plan(hostvars, ["spark1"], reserve=8 * GIB, kv_reserve=4 * GIB, world_size=1,
                             running="0.8", serve_running="True")
    assert (plan["gpu_memory_utilization"], plan["errors"]) == (0.8, [])
    plan = serve_memory_plan(hostvars, ["spark1"], reserve=8 * GIB, kv_reserve=4 * GIB, world_size=1,
                             running=None, serve_running=True)
    assert (plan["gpu_memory_utilization"], plan["errors"]) == (None, [])
