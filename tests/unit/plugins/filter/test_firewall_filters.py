# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The firewall filters (controller side): hosts resolved from hostvars, bad input raised as a filter error.

The model itself is tested in tests/unit/plugins/module_utils/test_firewall.py, which must not import
controller code (ansible-test units runs module_utils tests with only ansible.module_utils on the path).
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.vllm.plugins.filter._firewall_boot_unit import firewall_boot_unit
from ansible_collections.multinode.vllm.plugins.filter._firewall_errors import firewall_errors
from ansible_collections.multinode.vllm.plugins.filter.firewall_ruleset import firewall_ruleset


def _data(**changes):
    data = dict(
        host="spark1",
        fabric_interface="enp1s0f1np1",
        fabric_cidr="198.18.200.0/24",
        mgmt_interface="eth0",
        mgmt_allow_tcp=[22, 8000],
        controller_port=22,
        allow_sources=[],
        allow_icmp=True,
        log_drops=False,
    )
    data.update(changes)
    return data


def test_filters_resolve_cluster_hosts_and_raise_on_bad_input():
    hostvars = {"spark1": {"multinode_fabric": {"ip": "198.18.200.12"}}, "spark2": {"fabric_ip": "198.18.200.13"}}
    spec = _data(cluster_hosts=["spark1", "spark2"])
    assert firewall_errors(spec, hostvars) == []
    assert "{ 198.18.200.12, 198.18.200.13 }" in firewall_ruleset(spec, hostvars)
    spec["cluster_hosts"] = ["spark1", "spark3"]
    assert any("spark3" in e for e in firewall_errors(spec, hostvars))
    with pytest.raises(AnsibleFilterError, match="spark3"):
        firewall_ruleset(spec, hostvars)


@pytest.mark.parametrize("path, nft", [("relative.nft", "/usr/sbin/nft"), ("/etc/a b.nft", "/usr/sbin/nft"),
                                       ("/etc/50%.nft", "/usr/sbin/nft"), ("/etc/x.nft", "nft")])
def test_boot_unit_filter_refuses_paths_systemd_would_read_otherwise(path, nft):
    with pytest.raises(AnsibleFilterError, match="absolute path"):
        firewall_boot_unit(path, nft)
