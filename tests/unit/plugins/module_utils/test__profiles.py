# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory profiles: the table, the defaults the roles read from it, and the docs that print it."""

from __future__ import annotations

import pathlib

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._profiles import (
    ProfileError,
    check_profile,
    profile_default,
    profile_table,
)

ROOT = pathlib.Path(__file__).resolve().parents[4]


def test_no_profile_keeps_each_default():
    assert profile_default("", "fabric_expected_mtu", None) is None
    assert profile_default(None, "distributed_preflight_min_busbw_gbps", 0) == 0


def test_the_spark_profile_sets_its_values():
    assert profile_default("dgx_spark", "fabric_expected_mtu") == 9000
    assert profile_default("dgx_spark", "distributed_preflight_min_busbw_gbps", 0) == 15
    assert profile_default("dgx_spark", "multinode_unified_memory") is True
    # A variable the profile does not set keeps the role's default.
    assert profile_default("dgx_spark", "vllm_max_model_len", 4096) == 4096


def test_an_unknown_profile_fails_naming_the_known_ones():
    with pytest.raises(ProfileError, match=r"multinode_profile is 'dgx-spark', which is not a profile; known: dgx_spark"):
        check_profile("dgx-spark")


def test_docs_print_the_spark_profile_as_the_code_has_it():
    text = (ROOT / "docs" / "dgx-spark.md").read_text()
    for row in profile_table("dgx_spark"):
        assert row in text, row
