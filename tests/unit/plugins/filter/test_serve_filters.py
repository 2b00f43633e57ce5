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

from ansible_collections.multinode.vllm.plugins.filter.vllm_serve_args import vllm_serve_args


def test_serve_args_filter_checks_sizes_and_names_unknown_settings():
    settings = {"model": "/m", "tensor_parallel_size": 2, "api_host": "198.19.1.10"}
    args = vllm_serve_args(settings, backend="ray", gpus_per_node={"spark1": 1, "spark2": 1})
    assert args[:2] == ["serve", "/m"] and "--distributed-executor-backend" in args
    with pytest.raises(AnsibleFilterError, match="but the 1 nodes have 1 GPUs"):
        vllm_serve_args(settings, backend="ray", gpus_per_node={"spark1": 1})
    with pytest.raises(AnsibleFilterError, match="unknown settings colour"):
        vllm_serve_args(dict(settings, colour="red"), backend="ray", gpus_per_node={"a": 2})
