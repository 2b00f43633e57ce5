# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shared checks: an environment variable name, a whole number, a TCP port."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key, port_number, whole_number


@pytest.mark.parametrize("key", ["A", "_", "NCCL_DEBUG", "a1", "_9"])
def test_env_keys(key):
    assert is_env_key(key)


# "K\n": `re.match` with `$` accepted a trailing newline, which would add a line to an env file.
@pytest.mark.parametrize("key", ["", "1A", "A-B", "A=B", "-x", "A B", "K\n", "É", None, 1, b"A"])
def test_not_env_keys(key):
    assert not is_env_key(key)


@pytest.mark.parametrize("value, number", [(0, 0), (-3, -3), (8000, 8000), ("8000", 8000), (" 22 ", 22),
                                           (True, None), (8000.0, None), ("+80", None), ("-1", None), ("0x50", None),
                                           ("²", None), ("", None), (None, None), ([80], None)])
def test_whole_number(value, number):
    assert whole_number(value) == number


@pytest.mark.parametrize("value, port", [(1, 1), (65535, 65535), ("8000", 8000), (0, None), (65536, None),
                                         (-1, None), (True, None), ("ssh", None)])
def test_port_number(value, port):
    assert port_number(value) == port
