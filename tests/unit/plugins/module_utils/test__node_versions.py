# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The versions node script: its stack output, run from its source as stack_facts runs it, and its file readers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils import _node_versions
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv

KEYS = ["cuda_runtime", "driver", "nccl", "python", "ray", "torch", "vllm"]


def test_stack_from_its_source_alone():
    proc = subprocess.run(script_argv([sys.executable, "-I"], _node_versions, "stack"), capture_output=True,
                          text=True, timeout=60, check=True)
    stack = json.loads(proc.stdout)
    assert sorted(stack) == KEYS
    assert stack["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_without_argument_the_output_stays_the_three_versions():
    proc = subprocess.run(script_argv([sys.executable, "-I"], _node_versions), capture_output=True, text=True,
                          timeout=60, check=True)
    assert sorted(json.loads(proc.stdout)) == ["ray", "torch", "vllm"]


def test_system_nccl_from_the_most_precise_file_name(tmp_path):
    first, second = tmp_path / "lib1", tmp_path / "lib2"
    first.mkdir()
    second.mkdir()
    (first / "libnccl.so.2").write_text("")
    (second / "libnccl.so.2.21.5").write_text("")
    (second / "libnccl.so").write_text("")
    assert _node_versions.system_nccl([str(first), str(second)]) == "system libnccl 2.21.5"
    assert _node_versions.system_nccl([str(first)]) == "system libnccl 2"
    assert _node_versions.system_nccl([str(tmp_path / "absent")]) is None


def test_stack_without_a_pip_nccl_reads_the_system_library(tmp_path, monkeypatch):
    (tmp_path / "libnccl.so.2.27.7").write_text("")
    monkeypatch.setattr(_node_versions, "NCCL_DISTS", ("multinode-vllm-no-such-dist",))
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build\n")
    stack = _node_versions.stack(lib_dirs=[str(tmp_path)], driver_file=str(driver))
    assert stack["nccl"] == "system libnccl 2.27.7" and stack["driver"] == "580.95.05"
    assert _node_versions.stack(lib_dirs=[], driver_file=str(tmp_path / "absent"))["driver"] is None


@pytest.mark.parametrize("text, version", [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@U22)  "
     "Tue Sep 23 09:12:39 UTC 2025\nGCC version:  gcc version 13.3.0\n", "580.95.05"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023\n", "535.129.03"),
    ("garbage\n", None),
])
def test_driver_version(tmp_path, text, version):
    path = tmp_path / "version"
    path.write_text(text)
    assert _node_versions.driver_version(str(path)) == version


def test_no_driver_is_none(tmp_path):
    assert _node_versions.driver_version(str(tmp_path / "absent")) is None
