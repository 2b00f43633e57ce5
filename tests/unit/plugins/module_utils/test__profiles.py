# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory profiles: the table, the defaults the roles read from it, and the docs that print it."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._profile_default import FilterModule
from ansible_collections.multinode.vllm.plugins.module_utils._profiles import (
    PROFILES,
    ProfileError,
    check_profile,
    profile_default,
    profile_table,
)

ROOT = pathlib.Path(__file__).resolve().parents[4]
CALL = re.compile(r"_profile_default\('([a-z_]+)',")


def role_defaults_using_profiles():
    """(role, variable, the variable the template asks the profile for) for every default that reads a profile."""
    found = []
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for variable, value in (yaml.safe_load(path.read_text()) or {}).items():
            if isinstance(value, str) and "_profile_default(" in value:
                found.append((path.parts[-3], variable, CALL.search(value).group(1)))
    return found


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
    with pytest.raises(AnsibleFilterError, match="known: dgx_spark"):
        FilterModule().filters()["_profile_default"]("spark", "fabric_expected_mtu", None)


def test_every_profile_value_has_a_role_default_that_reads_it_and_each_reads_its_own_name():
    used = role_defaults_using_profiles()
    # Each default asks the profile for its own variable (a copy-paste slip would hand one variable another's value).
    assert [(role, var) for role, var, asked in used if var != asked] == []
    read = {var for _role, var, _asked in used}
    for name, values in PROFILES.items():
        assert set(values) <= read, "%s sets variables no role default reads: %s" % (name, set(values) - read)


def test_docs_print_the_spark_profile_as_the_code_has_it():
    text = (ROOT / "docs" / "dgx-spark.md").read_text()
    for row in profile_table("dgx_spark"):
        assert row in text, row
