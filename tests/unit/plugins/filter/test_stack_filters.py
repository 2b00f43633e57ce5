# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stack gate's filters, called as Jinja calls them: plain dicts for hostvars."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._stack_errors import FilterModule as ErrorsFilters
from ansible_collections.multinode.vllm.plugins.filter._stack_errors import stack_errors
from ansible_collections.multinode.vllm.plugins.filter._stack_table import FilterModule as TableFilters
from ansible_collections.multinode.vllm.plugins.filter._stack_table import stack_table_lines

STACK = {"python": "3.12.3", "ray": "2.52.0", "vllm": "0.11.0", "torch": "2.8.0", "nccl": "system libnccl 2.27.7",
         "cuda_runtime": None, "driver": "580.95.05"}


def hostvars(**changes):
    return {host: {"multinode_stack": {**STACK, **changes.get(host, {})}, "fabric_ip": "x"}
            for host in ("spark1", "spark2")}


def test_registered_names():
    assert list(ErrorsFilters().filters()) == ["_stack_errors"]
    assert list(TableFilters().filters()) == ["_stack_table"]


def test_no_errors_for_one_stack():
    assert stack_errors(hostvars(), ["spark1", "spark2"], []) == []


def test_difference_and_allow_list():
    hv = hostvars(spark2={"driver": "575.51.03"})
    errors = stack_errors(hv, ["spark1", "spark2"], [])
    assert len(errors) == 1 and "driver differs between nodes (spark1: 580.95.05; spark2: 575.51.03)" in errors[0]
    assert stack_errors(hv, ["spark1", "spark2"], [{"component": "driver", "reason": "tested"}]) == []


def test_host_without_facts_is_named():
    hv = hostvars()
    del hv["spark2"]["multinode_stack"]
    assert stack_errors(hv, ["spark1", "spark2"], None)[0].startswith("spark2: no multinode_stack fact")


def test_bad_allow_list_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="ray_stack_allow_skew\\[0\\] = 'gpu': not a stack component"):
        stack_errors(hostvars(), ["spark1", "spark2"], ["gpu"])


def test_table_lines():
    lines = stack_table_lines(hostvars(spark2={"image_id": "sha256:abc"}), ["spark1", "spark2"])
    assert lines[0].split() == ["node", "python", "ray", "vllm", "torch", "nccl", "cuda_runtime", "driver", "image_id"]
    assert lines[1].startswith("spark1 ") and lines[1].endswith("580.95.05  not installed")
    assert lines[2].startswith("spark2 ") and lines[2].endswith("580.95.05  sha256:abc")
    assert {line.index(" 3.12.3") for line in lines[1:]} == {lines[0].index(" python")}
