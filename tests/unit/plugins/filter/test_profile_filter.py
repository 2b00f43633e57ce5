# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The _profile_default filter and the role defaults that read profiles through it."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._profile_default import FilterModule
from ansible_collections.multinode.vllm.plugins.module_utils._profiles import PROFILES

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


def test_the_filter_returns_the_profile_value_or_the_default():
    profile_default = FilterModule().filters()["_profile_default"]
    assert profile_default("dgx_spark", "fabric_expected_mtu", None) == 9000
    assert profile_default("", "fabric_expected_mtu", None) is None


def test_an_unknown_profile_fails_the_filter_naming_the_known_ones():
    with pytest.raises(AnsibleFilterError, match="known: dgx_spark"):
        FilterModule().filters()["_profile_default"]("spark", "fabric_expected_mtu", None)


def test_every_profile_value_has_a_role_default_that_reads_it_and_each_reads_its_own_name():
    used = role_defaults_using_profiles()
    assert used, "no role default reads a profile"
    # Each default asks the profile for its own variable (a copy-paste slip would hand one variable another's value).
    assert [(role, var) for role, var, asked in used if var != asked] == []
    read = {var for _role, var, _asked in used}
    for name, values in PROFILES.items():
        assert set(values) <= read, "%s sets variables no role default reads: %s" % (name, set(values) - read)
