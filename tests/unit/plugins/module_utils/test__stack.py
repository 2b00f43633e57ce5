# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stack fingerprint gate: differences named and grouped by value, the allow-list, the table."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._stack import (
    COMPONENTS,
    StackError,
    manifest_digest,
    parse_allow,
    stack_errors,
    stack_table,
    table_lines,
)

STACK = {"python": "3.12.3", "ray": "2.52.0", "vllm": "0.11.0", "torch": "2.8.0+cu128",
         "nccl": "pip nvidia-nccl-cu12 2.27.3", "cuda_runtime": "pip nvidia-cuda-runtime-cu12 12.8.90",
         "driver": "580.95.05"}


def cluster(**changes):
    """spark1..spark3 on STACK; changes: host -> {component: value}."""
    return {host: {**STACK, **changes.get(host, {})} for host in ("spark1", "spark2", "spark3")}


def test_identical_stacks_have_no_errors():
    assert stack_errors(cluster()) == []


def test_a_difference_names_the_component_every_host_with_its_value_and_the_fix():
    errors = stack_errors(cluster(spark3={"torch": "2.9.0"}))
    assert errors == [
        "torch differs between nodes (spark1, spark2: 2.8.0+cu128; spark3: 2.9.0); install the same torch version on "
        "every node (or run the same image), or, if the difference is known to be harmless, add "
        "{component: torch, reason: <why>} to ray_stack_allow_skew"]


def test_every_differing_component_is_reported_in_component_order():
    errors = stack_errors(cluster(spark1={"driver": "575.51.03"}, spark2={"nccl": "system libnccl 2.21.5"}))
    assert [e.split(" ", maxsplit=1)[0] for e in errors] == ["nccl", "driver"]
    assert "spark1, spark3: pip nvidia-nccl-cu12 2.27.3; spark2: system libnccl 2.21.5" in errors[0]
    assert "spark1: 575.51.03; spark2, spark3: 580.95.05" in errors[1]
    assert "install the same NVIDIA driver version on every node" in errors[1]


@pytest.mark.parametrize("absent", [None, ""])
def test_not_installed_is_a_value(absent):
    errors = stack_errors(cluster(spark2={"vllm": absent}))
    assert len(errors) == 1
    assert "(spark1, spark3: 0.11.0; spark2: not installed)" in errors[0]


def test_not_installed_everywhere_is_equal():
    assert stack_errors(cluster(**{h: {"cuda_runtime": None} for h in ("spark1", "spark2", "spark3")})) == []


@pytest.mark.parametrize("allow", [
    ["torch"],
    [{"component": "torch", "reason": "2.8.0 and 2.9.0 tested together"}],
    [{"component": "torch"}],
    ("driver", {"component": "torch", "reason": "patch release"}),
])
def test_allowed_component_is_not_compared(allow):
    assert stack_errors(cluster(spark3={"torch": "2.9.0"}), allow) == []


def test_allowing_one_component_still_reports_the_others():
    errors = stack_errors(cluster(spark3={"torch": "2.9.0", "ray": "2.51.0"}), ["torch"])
    assert len(errors) == 1 and errors[0].startswith("ray differs between nodes")


@pytest.mark.parametrize("allow, message", [
    (["tourch"], "ray_stack_allow_skew[0] = 'tourch': not a stack component; expected one of "
                 + ", ".join(COMPONENTS)),
    ([{"component": "nvcc", "reason": "x"}], "ray_stack_allow_skew[0] = 'nvcc': not a stack component"),
    (["torch", 3], "ray_stack_allow_skew[1] = 3: not a stack component"),
    ([{"component": "torch", "why": "x"}], "unknown key(s) why; an entry has only component and reason"),
    ([{"component": "torch", "reason": 5}], "ray_stack_allow_skew[0]: reason = 5: expected text"),
    ("torch", "ray_stack_allow_skew = 'torch': expected a list of component names"),
    ({"component": "torch"}, "ray_stack_allow_skew = {'component': 'torch'}: expected a list"),
])
def test_bad_allow_list_entry_names_the_value_and_the_valid_names(allow, message):
    with pytest.raises(StackError) as caught:
        stack_errors(cluster(), allow)
    assert message in str(caught.value)
    assert isinstance(caught.value, MultinodeError)


def test_every_bad_entry_is_reported_at_once():
    with pytest.raises(StackError) as caught:
        parse_allow(["a", "torch", "b"])
    assert "[0] = 'a'" in str(caught.value) and "[2] = 'b'" in str(caught.value)


def test_allow_list_reasons_are_kept():
    assert parse_allow(["nccl", {"component": "driver", "reason": "r"}]) == {"nccl": "", "driver": "r"}
    assert parse_allow(None) == {}


def test_a_host_without_the_fact_is_named():
    stacks = cluster()
    stacks["spark2"] = None
    assert stack_errors(stacks) == [
        "spark2: no multinode_stack fact; run multinode.vllm.stack_facts on every host first (the role's "
        "stack_check.yml does)"]


def test_image_id_and_model_are_compared_when_reported():
    config = {"path": "config.json", "size": 10, "sha256": "aa"}
    manifest = {"files": [config, {"path": "w.bin", "size": 5, "sha256": "bb"}]}
    other = {"files": [config, {"path": "w.bin", "size": 5, "sha256": "cc"}]}
    stacks = cluster(spark1={"image_id": "sha256:1", "model_manifest": manifest},
                     spark2={"image_id": "sha256:1", "model_manifest": manifest},
                     spark3={"image_id": "sha256:2", "model_manifest": other})
    errors = stack_errors(stacks)
    assert [e.split(" ", maxsplit=1)[0] for e in errors] == ["image_id", "model"]
    assert "spark1, spark2: sha256:1; spark3: sha256:2" in errors[0] and "pull or rebuild the same image" in errors[0]
    assert "spark1, spark2: %s; spark3: %s" % (manifest_digest(manifest), manifest_digest(other)) in errors[1]


def test_manifest_digest_ignores_file_order_and_empty_is_none():
    files = [{"path": "a", "size": 1, "sha256": "x"}, {"path": "b", "size": 2, "sha256": "y"}]
    digest = manifest_digest({"files": files})
    assert digest == manifest_digest({"files": list(reversed(files))})
    assert digest.startswith("sha256:") and digest.endswith("(2 file(s))")
    assert manifest_digest({"files": [{"path": "a", "size": 1, "sha256": "z"}, files[1]]}) != digest
    assert manifest_digest({"files": []}) is None and manifest_digest(None) is None


def test_table_rows_node_by_component():
    rows = stack_table(cluster(spark2={"vllm": None}), ["spark2", "spark1"])
    assert rows[0] == ["node", "python", "ray", "vllm", "torch", "nccl", "cuda_runtime", "driver"]
    assert rows[1] == ["spark2", "3.12.3", "2.52.0", "not installed", "2.8.0+cu128", "pip nvidia-nccl-cu12 2.27.3",
                       "pip nvidia-cuda-runtime-cu12 12.8.90", "580.95.05"]
    assert rows[2][0] == "spark1" and len(rows) == 3


def test_table_shows_image_id_only_when_a_node_reports_it():
    rows = stack_table(cluster(spark1={"image_id": "sha256:1"}), ["spark1", "spark2"])
    assert rows[0][-1] == "image_id" and rows[1][-1] == "sha256:1" and rows[2][-1] == "not installed"


def test_table_lines_are_aligned():
    lines = table_lines([["node", "torch"], ["spark1", "2.8.0"], ["s2", "2.9.0"]])
    assert lines == ["node    torch", "spark1  2.8.0", "s2      2.9.0"]
