# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read a host's interfaces and RDMA ports into the plain data the fabric model takes.

I/O only, no decisions: ``_fabric.parse_network`` consumes the result. The
sysfs root is a parameter so tests can point it at a fake tree.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Optional

Runner = Callable[[list], str]


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        # carrier/speed raise EINVAL on a down link; unused GID slots too.
        return None


def _read_int(path: str) -> Optional[int]:
    value = _read(path)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _pci_slot(net_dir: str) -> Optional[str]:
    """The PCI address of a netdev's device (``PCI_SLOT_NAME`` in device/uevent), None when it has none."""
    uevent = _read(os.path.join(net_dir, "device", "uevent")) or ""
    for line in uevent.splitlines():
        key, _sep, value = line.partition("=")
        if key.strip() == "PCI_SLOT_NAME" and value.strip():
            return value.strip()
    return None


def run_ip(args: list) -> str:
    """Run ``ip -j ...`` and return stdout (raises OSError/CalledProcessError)."""
    return subprocess.run(["ip", "-j"] + list(args), check=True, capture_output=True, text=True).stdout


def read_interfaces(sys_root: str = "/sys", ip: Runner = run_ip) -> list[dict[str, Any]]:
    """Interfaces with IPv4 addresses, MTU, state, whether they hold the default route, and their PCI function."""
    addr_data = json.loads(ip(["-4", "addr", "show"]) or "[]")
    routes = json.loads(ip(["-4", "route", "show", "default"]) or "[]")
    default_devs = {r.get("dev") for r in routes if r.get("dst", "default") == "default"}
    net_dir = os.path.join(sys_root, "class", "net")
    by_name: dict[str, dict[str, Any]] = {}
    for entry in addr_data:
        name = entry.get("ifname")
        if not name:
            continue
        by_name[name] = {
            "name": name,
            "addresses": [
                "%s/%s" % (a["local"], a["prefixlen"])
                for a in entry.get("addr_info", [])
                if a.get("family") == "inet" and "local" in a
            ],
            "mtu": entry.get("mtu"),
            "operstate": str(entry.get("operstate", "unknown")).lower(),
        }
    names = set(by_name)
    if os.path.isdir(net_dir):
        # Interfaces are directories; bonding_masters is a plain file beside them.
        names.update(n for n in os.listdir(net_dir) if os.path.isdir(os.path.join(net_dir, n)))
    result = []
    for name in sorted(names):
        base = os.path.join(net_dir, name)
        info = by_name.get(name, {"name": name, "addresses": [], "mtu": None, "operstate": "unknown"})
        operstate = _read(os.path.join(base, "operstate"))
        carrier = _read_int(os.path.join(base, "carrier"))
        speed = _read_int(os.path.join(base, "speed"))
        mtu = _read_int(os.path.join(base, "mtu"))
        result.append(
            {
                "name": name,
                "addresses": info["addresses"],
                "mtu": mtu if mtu is not None else info["mtu"],
                "operstate": operstate or info["operstate"],
                "carrier": None if carrier is None else carrier == 1,
                "speed": speed if speed is not None and speed > 0 else None,
                "default_route": name in default_devs,
                # Which physical port: the PCI function and the switchdev port name (EOPNOTSUPP where the driver
                # has none: None). _fabric.port_siblings pairs a Spark's two endpoints of one port by them.
                "pci_slot": _pci_slot(base),
                "phys_port_name": _read(os.path.join(base, "phys_port_name")) or None,
            }
        )
    return result


def read_rdma(sys_root: str = "/sys") -> list[dict[str, Any]]:
    """RDMA ports from /sys/class/infiniband with their netdev and GID table."""
    ib_dir = os.path.join(sys_root, "class", "infiniband")
    if not os.path.isdir(ib_dir):
        return []
    ports = []
    for hca in sorted(os.listdir(ib_dir)):
        hca_dir = os.path.join(ib_dir, hca)
        ports_dir = os.path.join(hca_dir, "ports")
        if not os.path.isdir(ports_dir):
            continue
        sys_image_guid = _read(os.path.join(hca_dir, "sys_image_guid")) or None
        device_net = os.path.join(hca_dir, "device", "net")
        hca_netdevs = sorted(os.listdir(device_net)) if os.path.isdir(device_net) else []
        for port in sorted(os.listdir(ports_dir), key=lambda p: int(p) if p.isdigit() else 0):
            pdir = os.path.join(ports_dir, port)
            gids = []
            gid_dir = os.path.join(pdir, "gids")
            if os.path.isdir(gid_dir):
                for index in sorted(os.listdir(gid_dir), key=lambda i: int(i) if i.isdigit() else 0):
                    gid = _read(os.path.join(gid_dir, index))
                    if not gid or set(gid.replace(":", "")) == {"0"}:
                        continue
                    gids.append(
                        {
                            "index": int(index),
                            "gid": gid,
                            "type": _read(os.path.join(pdir, "gid_attrs", "types", index)) or "",
                            "netdev": _read(os.path.join(pdir, "gid_attrs", "ndevs", index)),
                        }
                    )
            gid_netdevs = sorted({g["netdev"] for g in gids if g["netdev"]})
            netdev = gid_netdevs[0] if gid_netdevs else (hca_netdevs[0] if len(hca_netdevs) == 1 else None)
            ports.append(
                {
                    "hca": hca,
                    "port": int(port),
                    "state": _read(os.path.join(pdir, "state")) or "",
                    "link_layer": _read(os.path.join(pdir, "link_layer")) or "",
                    "netdev": netdev,
                    "sys_image_guid": sys_image_guid,
                    "gids": gids,
                }
            )
    return ports


def read_network(sys_root: str = "/sys", ip: Runner = run_ip) -> dict[str, Any]:
    return {"interfaces": read_interfaces(sys_root, ip), "rdma": read_rdma(sys_root)}
