# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Running a node script: its source under an interpreter, as the modules run it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

from ansible_collections.multinode.vllm.plugins.module_utils import _node_versions
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv


def test_script_argv_is_the_interpreter_then_the_source_then_the_arguments():
    argv = script_argv(["docker", "exec", "vllm", "python"], _node_versions, "a", "b")
    assert argv[:5] == ["docker", "exec", "vllm", "python", "-c"] and argv[6:] == ["a", "b"]
    assert argv[5] == inspect.getsource(_node_versions)


def test_a_node_script_runs_from_its_source_alone():
    """The versions script under this interpreter, as distributed_preflight runs it: one JSON object."""
    proc = subprocess.run(script_argv([sys.executable, "-I"], _node_versions), capture_output=True, text=True,
                          timeout=60, check=True)
    versions = json.loads(proc.stdout)
    assert sorted(versions) == ["ray", "torch", "vllm"] and versions == _node_versions.versions()
