# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Distributed preflight, NCCL path: what NCCL's own log says about the transport, and why an all-reduce is slow.

Pure: no Ansible imports, no I/O. The rank (``_node_rendezvous_rank``) runs NCCL with ``NCCL_DEBUG=INFO`` and
``NCCL_DEBUG_SUBSYS=INIT,NET`` and returns the lines of its log that name the network (``NCCL_LOG_KEYS``);
``parse_nccl_log`` reads them, ``transport_problems`` checks them against what the fabric has (NET/IB on the fabric
port's HCAs, when ``multinode_fabric`` lists RDMA ports), and ``busbw_problem`` words the failure of the
all-reduce bandwidth floor, naming the likely causes in order.

The lines are read as NCCL prints them (``<host>:<pid>:<tid> [<cuda dev>] NCCL INFO <message>``, src/debug.cc;
anything before ``NCCL INFO`` is ignored, so Ray's and vLLM's prefixes do not matter). The messages, from NCCL's
source (NVIDIA/nccl, read at 5067397, 2026-06):

- ``NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:198.18.200.12<0>``
  (src/transport/net_ib/init.cc, ``"NET/IB : Using%s %s; OOB %s:%s"``, one `` [d]<dev>:<port>/<IB|RoCE>`` per
  device); ``NET/IB : No device found.`` when there is none;
- ``NET/Socket : Using [0]fabric0:198.18.210.1<0>`` (src/transport/net_socket.cc);
- ``Using network IB`` (src/init.cc, ``"Using network %s"``; an external plugin names itself, e.g. ``IBext_v10``);
- ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0`` (src/transport/net.cc: channel, connection index, rank and
  device of each end, ``[send]`` or ``[receive]``, the network's name, the NIC index, ``/GDRDMA`` with GPUDirect);
- ``NCCL version 2.28.9+cuda13.0`` (src/init.cc ``VERSION_STRING``; bare, without the prefix, at NCCL_DEBUG=VERSION);
- ``NET/IB: ncclIbConnectImpl: NCCL Dev 0 IbDev 0 Port 1 qp_num 1234 mtu 5 GID 3 (...)`` (src/transport/net_ib/
  connect.cc, RoCE; ``mtu`` is the verbs MTU enum: 3 = 1024 bytes, what a 1500-byte netdev gives, 5 = 4096).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

# The substrings of the log lines the rank keeps: the node script defines them, the parser imports them.
from ansible_collections.multinode.vllm.plugins.module_utils._node_rendezvous_rank import NCCL_LOG_KEYS

# The transports the preflight can expect (distributed_preflight_nccl_expect_transport, resolved).
EXPECT_CHOICES = ("ib", "none")

# Verbs MTU enum (ibv_mtu) -> bytes.
IBV_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}

# The published two-Spark figures the busbw message cites (docs/distributed-preflight.md).
SPARK_FIGURES = ("a release NCCL reached 23.74 GB/s busbw where a development build gave 3.04 GB/s on the same "
                 "Spark pair (NVIDIA/dgx-spark-playbooks PR 103)")

_INFO = re.compile(r"NCCL (?:INFO|WARN) (.*)$")
_VERSION = re.compile(r"NCCL version (\S+)")
_IB_USING = re.compile(r"^NET/IB : Using(.*)$")
_IB_DEVICE = re.compile(r"\[(\d+)\]([^\s:\[\]]+):(\d+)\S*?/(IB|RoCE)\b")
_SOCKET_USING = re.compile(r"^NET/Socket : Using(.*)$")
_SOCKET_DEVICE = re.compile(r"\[(\d+)\]([^\s:]+):(\S+)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_CHANNEL = re.compile(r"^Channel (\d+)/(\d+) : (\d+)\[\d+\] -> (\d+)\[\d+\] \[(send|receive)\] via NET/([^/\s]+)/(\d+)(\S*)")
_QP = re.compile(r"^NET/IB: \w+: NCCL (?:Merged)?Dev \d+ IbDev (\d+) Port (\d+) qp_num \d+ mtu (\d+) GID (-?\d+)")


def kept_lines(lines: Sequence[str]) -> list[str]:
    """The lines of a whole NCCL log that the rank returns (``NCCL_LOG_KEYS``): what ``parse_nccl_log`` sees."""
    return [str(line).rstrip("\n") for line in lines if any(key in str(line) for key in NCCL_LOG_KEYS)]


def _is_ib(name: Optional[str]) -> bool:
    """NCCL's own IB transport (``IB``) or an external IB plugin (``IBext_v8``, ``IBext_v10``)."""
    return bool(name) and str(name).upper().startswith("IB")


def parse_nccl_log(lines: Sequence[str]) -> dict[str, Any]:
    """NCCL's log lines -> what they say about the network.

    Returns ``lines`` (how many NCCL lines were read), ``version``, ``network`` (``Using network``), ``ib_devices``
    (``hca:port`` in NCCL's order), ``ib_links`` (IB or RoCE per device), ``ib_no_device``, ``socket_devices``
    (``interface:address``), ``channels`` (``{"NET/IB/0": count, ...}``), ``gdr`` (a channel via GPUDirect RDMA),
    ``qps`` (RoCE connections: IB device index, port, MTU in bytes, GID index) and ``warnings`` (NCCL WARN lines).
    """
    out: dict[str, Any] = {"lines": 0, "version": None, "network": None, "ib_devices": [], "ib_links": [],
                           "ib_no_device": False, "socket_devices": [], "channels": {}, "gdr": False, "qps": [],
                           "warnings": []}
    for raw in lines:
        line = str(raw).rstrip()
        version = _VERSION.search(line)
        if version and out["version"] is None:
            out["version"] = version.group(1)
        match = _INFO.search(line)
        if not match:
            if version:
                out["lines"] += 1
            continue
        out["lines"] += 1
        message = match.group(1).strip()
        if " NCCL WARN " in " " + line and len(out["warnings"]) < 5:
            out["warnings"].append(message)
        using = _IB_USING.match(message)
        if using:
            devices = _IB_DEVICE.findall(using.group(1).split(";")[0])
            out["ib_devices"] = ["%s:%s" % (dev, port) for _i, dev, port, _link in devices]
            out["ib_links"] = [link for _i, _dev, _port, link in devices]
            continue
        if message.startswith("NET/IB : No device found"):
            out["ib_no_device"] = True
            continue
        using = _SOCKET_USING.match(message)
        if using:
            out["socket_devices"] = ["%s:%s" % (name, addr) for _i, name, addr in _SOCKET_DEVICE.findall(using.group(1))]
            continue
        network = _NETWORK.match(message)
        if network:
            out["network"] = network.group(1)
            continue
        channel = _CHANNEL.match(message)
        if channel:
            key = "NET/%s/%s" % (channel.group(6), channel.group(7))
            out["channels"][key] = out["channels"].get(key, 0) + 1
            out["gdr"] = out["gdr"] or "GDRDMA" in channel.group(8)
            continue
        qp = _QP.match(message)
        if qp:
            out["qps"].append({"ibdev": int(qp.group(1)), "port": int(qp.group(2)),
                               "mtu": IBV_MTU.get(int(qp.group(3)), int(qp.group(3))), "gid": int(qp.group(4))})
    return out


def transport(parsed: Mapping[str, Any]) -> Optional[str]:
    """The network NCCL carried this rank's inter-node traffic over: ``IB``, ``Socket``, another plugin's name, or
    None when the log does not say. The channel lines decide; ``Using network`` where there are none."""
    names = sorted({key.split("/")[1] for key in parsed.get("channels") or {}})
    if names:
        ib = [n for n in names if _is_ib(n)]
        return "IB" if ib and len(ib) == len(names) else ("Socket" if "Socket" in names else names[0])
    network = parsed.get("network")
    if network:
        return "IB" if _is_ib(network) else network
    return None


def transport_line(parsed: Mapping[str, Any]) -> str:
    """One phrase for the summary: ``NET/IB on rocep1s0f1:1, roceP2p1s0f1:1 (16 channels)``."""
    kind = transport(parsed)
    if kind is None:
        return "no NCCL transport line" if parsed.get("lines") else "no NCCL log"
    channels = sum((parsed.get("channels") or {}).values())
    if kind == "IB":
        where = ", ".join(parsed.get("ib_devices") or []) or "?"
    elif kind == "Socket":
        where = ", ".join(parsed.get("socket_devices") or []) or "?"
    else:
        where = "plugin %s" % parsed.get("network")
    return "NET/%s on %s%s%s" % (kind, where, " (%d channel%s)" % (channels, "" if channels == 1 else "s")
                                 if channels else "",
                                 ", GPUDirect RDMA" if parsed.get("gdr") else "")


def transport_problems(host: str, parsed: Mapping[str, Any], expect: str, hcas: Sequence[str]) -> list[str]:
    """Whether this rank's NCCL ran over NET/IB on exactly the fabric port's HCAs (``expect == "ib"``).

    ``hcas`` are the ``hca:port`` names NCCL_IB_HCA lists (``multinode_fabric.hca_ports``). A rank whose log shows
    no transport at all is a problem too: the gate cannot pass on silence.
    """
    if expect != "ib":
        return []
    want = ", ".join(hcas) or "the fabric's RDMA ports"
    kind = transport(parsed)
    if kind is None:
        return ["%s: NCCL's log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, %d lines kept) names no network, so "
                "NET/IB on %s cannot be confirmed; NCCL logs its transport when it connects, at the first all-reduce: "
                "check that the rank's environment does not set NCCL_DEBUG_SUBSYS or NCCL_DEBUG_FILE for itself "
                "(an image's /etc/nccl.conf included)" % (host, parsed.get("lines") or 0, want)]
    if kind != "IB":
        used = ", ".join(parsed.get("socket_devices") or []) if kind == "Socket" else "plugin %s" % parsed.get("network")
        why = []
        if parsed.get("ib_no_device"):
            why.append("NCCL found no RDMA device ('NET/IB : No device found.')")
        why.extend("NCCL WARN %s" % w for w in (parsed.get("warnings") or [])[:2])
        return ["%s: NCCL carried the all-reduce over NET/%s (%s), not NET/IB on %s, the fabric port's RDMA ports%s; "
                "the rank's runtime must see the RDMA devices (under docker /dev/infiniband, IPC_LOCK and an unlimited "
                "memlock; rdma-core's libibverbs in the image), and NCCL_IB_DISABLE=1, NCCL_NET=Socket or an "
                "NCCL_IB_HCA that matches no device must not be in its environment" % (
                    host, kind, used or "?", want, ": " + "; ".join(why) if why else "")]
    used = list(parsed.get("ib_devices") or [])
    if not used:
        return []  # The channels say NET/IB; without NCCL's device line there is nothing more to compare.
    missing = [h for h in hcas if h not in used]
    extra = [u for u in used if u not in hcas]
    problems = []
    if missing:
        problems.append("%s: NCCL's NET/IB uses %s, not %s of the fabric port (NCCL_IB_HCA lists %s); with one HCA a "
                        "DGX Spark's port reaches about half its bandwidth: check that %s is ACTIVE on this host and "
                        "that nothing in the rank's environment (an image's /etc/nccl.conf, a launcher) overrides "
                        "NCCL_IB_HCA" % (host, ", ".join(used), ", ".join(missing), want,
                                         ", ".join(m.split(":")[0] for m in missing)))
    if extra:
        problems.append("%s: NCCL's NET/IB also uses %s, which is not on the fabric port (expected %s); NCCL_IB_HCA in "
                        "the rank's environment does not restrict NCCL to the fabric port's HCAs: render the node "
                        "environment again (fabric_node_env writes NCCL_IB_HCA==%s)" % (
                            host, ", ".join(extra), want, ",".join(hcas)))
    return problems


def _seen(rows: Sequence[str]) -> str:
    return "; ".join(rows)


def busbw_causes(
    parsed: Mapping[str, Mapping[str, Any]],
    fabrics: Mapping[str, Mapping[str, Any]],
    envs: Mapping[str, Mapping[str, str]],
) -> list[str]:
    """The likely causes of a slow all-reduce, in order (one HCA only, MTU 1500, GID type, NCCL build), each with
    what this run shows for it (``parsed``: each host's ``parse_nccl_log``; ``fabrics``: each host's
    ``multinode_fabric``; ``envs``: each host's NCCL_* values)."""
    hosts = sorted(set(parsed) | set(fabrics))
    # 1. One HCA only.
    one = []
    for host in hosts:
        fabric = fabrics.get(host) or {}
        used = (parsed.get(host) or {}).get("ib_devices") or []
        port = fabric.get("fabric_port") or []
        left_out = [m for m in port if not m.get("used")]
        if len(port) > 1 and (len(used) == 1 or left_out):
            one.append("%s: NCCL used %s of a fabric port with %d endpoints%s" % (
                host, ", ".join(used) or ", ".join(fabric.get("hca_ports") or []) or "one HCA", len(port),
                " (%s left out: %s)" % (", ".join(m.get("netdev") or "?" for m in left_out),
                                        "; ".join(m.get("problem") or "not used" for m in left_out))
                if left_out else ""))
        elif len(used) == 1 and not port:
            one.append("%s: NCCL used %s alone" % (host, used[0]))
    causes = ["1. one HCA only: %s; list both halves of a DGX Spark's port in NCCL_IB_HCA, each up, addressed and at "
              "the same MTU (docs/fabric.md)" % (_seen(one) if one else "not seen (NCCL used every HCA of the fabric "
                                                                        "port that this run knows of)")]
    # 2. MTU 1500.
    mtu = []
    for host in hosts:
        fabric = fabrics.get(host) or {}
        rows = [(m.get("netdev"), m.get("mtu")) for m in fabric.get("fabric_port") or []]
        rows = rows or [(fabric.get("interface"), fabric.get("mtu"))]
        small = ["%s MTU %s" % (name, value) for name, value in rows if value is not None and int(value) < 9000]
        qps = sorted({q["mtu"] for q in (parsed.get(host) or {}).get("qps") or [] if q.get("mtu") and q["mtu"] < 4096})
        if qps:
            small.append("RoCE path MTU %s in NCCL's log" % "/".join(str(q) for q in qps))
        if small:
            mtu.append("%s: %s" % (host, ", ".join(small)))
    causes.append("2. MTU 1500: %s; set MTU 9000 on both halves of the port at both ends of every link (and "
                  "fabric_expected_mtu: 9000 so the fabric preflight holds it)" % (
                      _seen(mtu) if mtu else "not seen (MTU 9000 or more on every endpoint this run knows of)"))
    # 3. GID type.
    gid = []
    for host in hosts:
        env = envs.get(host) or {}
        if env.get("NCCL_IB_GID_INDEX") not in (None, "", "-1"):
            gid.append("%s: NCCL_IB_GID_INDEX=%s pins one index for every HCA" % (host, env["NCCL_IB_GID_INDEX"]))
        fabric = fabrics.get(host) or {}
        held = {m.get("hca"): m.get("gid_index") for m in fabric.get("fabric_port") or []}
        names = list((parsed.get(host) or {}).get("ib_devices") or [])
        for qp in (parsed.get(host) or {}).get("qps") or []:
            name = names[qp["ibdev"]].split(":")[0] if qp["ibdev"] < len(names) else None
            if name in held and held[name] is not None and qp["gid"] != held[name]:
                gid.append("%s: NCCL connected %s with GID %d, the RoCE v2 GID of its address is %d" % (
                    host, name, qp["gid"], held[name]))
    causes.append("3. GID type: %s; let NCCL choose each HCA's RoCE v2 GID by address (node_env_gid_selection: "
                  "addr_range writes NCCL_IB_ADDR_RANGE), not a fixed NCCL_IB_GID_INDEX, which can name a RoCE v1 or "
                  "link-local GID and shifts after link or firmware events" % (
                      _seen(sorted(set(gid))) if gid else "not seen in this run's environment or NCCL log"))
    # 4. NCCL build.
    versions = {host: (parsed.get(host) or {}).get("version") for host in hosts}
    known = sorted({v for v in versions.values() if v})
    if len(known) > 1:
        build = "different NCCL builds: %s" % ", ".join("%s %s" % (h, v or "?") for h, v in sorted(versions.items()))
    elif known:
        build = "NCCL %s on %s" % (known[0], ", ".join(h for h, v in sorted(versions.items()) if v))
    else:
        build = "NCCL's version is not in the log"
    causes.append("4. NCCL build: %s; %s: use one release NCCL (the one the runtime's torch or vLLM ships) on "
                  "every node" % (build, SPARK_FIGURES))
    return causes


def busbw_problem(
    bandwidth: Optional[Mapping[str, Any]],
    floor: Optional[float],
    parsed: Mapping[str, Mapping[str, Any]],
    fabrics: Mapping[str, Mapping[str, Any]],
    envs: Mapping[str, Mapping[str, str]],
    size_mib: Optional[float] = None,
) -> Optional[str]:
    """The message when the slowest rank's all-reduce busbw is below ``floor`` GB/s (None or 0: no floor)."""
    if not floor or float(floor) <= 0:
        return None
    if not bandwidth:
        return ("distributed_preflight_min_busbw_gbps is %g GB/s but no all-reduce was timed (distributed_preflight_"
                "size_mib is %s); set a size of at least 256 MiB, or the floor to 0" % (float(floor), size_mib))
    busbw = float(bandwidth.get("busbw_GBps") or 0.0)
    if busbw >= float(floor):
        return None
    return ("all-reduce busbw %.2f GB/s (%s, the slowest rank: %.1f MiB %s over %s ranks) is below "
            "distributed_preflight_min_busbw_gbps %g GB/s. Likely causes, most likely first:\n%s" % (
                busbw, bandwidth.get("host") or "?", float(bandwidth.get("bytes") or 0) / 1048576.0,
                bandwidth.get("dtype") or "float32", bandwidth.get("ranks") or "?", float(floor),
                "\n".join("  " + c for c in busbw_causes(parsed, fabrics, envs))))
