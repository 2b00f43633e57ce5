# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fabric_facts against this machine: it must report the real interfaces `ip` sees."""
from __future__ import annotations

import ipaddress
import json
import subprocess

from conftest import BIN, ROOT, ansible_env


def test_fabric_facts_reports_this_machines_interfaces():
    addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                                      check=True).stdout)
    route = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "default"], capture_output=True,
                                      text=True, check=True).stdout)
    default_dev = route[0]["dev"]
    info = next(a for a in addrs if a["ifname"] == default_dev)["addr_info"][0]
    cidr = str(ipaddress.IPv4Interface("%s/%s" % (info["local"], info["prefixlen"])).network)
    result = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-m", "multinode.vllm.fabric_facts", "-a",
         "fabric_cidr=%s host=control" % cidr, "-o"],
        capture_output=True, text=True, env=ansible_env(), cwd=str(ROOT), check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    payload = json.loads(result.stdout.split("=>", 1)[1])
    fabric = payload["ansible_facts"]["multinode_fabric"]
    network = payload["ansible_facts"]["multinode_network"]
    assert fabric["interface"] == default_dev
    assert fabric["ip"] == info["local"]
    assert fabric["mgmt_interface"] == default_dev  # a single-NIC machine: fabric and mgmt share it
    seen = {i["name"]: i["addresses"] for i in network["interfaces"]}
    for entry in addrs:
        expected = ["%s/%s" % (a["local"], a["prefixlen"]) for a in entry["addr_info"] if a["family"] == "inet"]
        assert seen[entry["ifname"]] == expected
