# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which sockets this node listens on, who owns them, and whether each is allowed.

Cluster control traffic (Ray, torch.distributed, vLLM internals) must listen
only on the node's fabric address or loopback. The sockets come from
/proc/self/net/{tcp,tcp6,udp,udp6} (read by ``_proc_net``), i.e. the caller's network namespace; the
owners from /proc/<pid>/fd of the processes in that same network namespace
(the lab's nodes share one PID namespace, see _procs.py).

Reads /proc (``proc_root`` is a parameter for tests); no Ansible imports.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem
from ansible_collections.multinode.vllm.plugins.module_utils._proc_net import TCP_LISTEN, UDP_UNCONNECTED, net_sockets
from ansible_collections.multinode.vllm.plugins.module_utils._procs import own_netns, read_process

DOC = "docs/security.md"

# Searched (re.search) in the process name and in its command line joined by spaces.
DEFAULT_PATTERNS = (
    # Ray's native daemons and vLLM/torch entry points, by process name (comm, at most 15 characters).
    r"^(raylet|gcs_server|plasma_store|ray|vllm|torchrun)$",
    # Ray workers and agents rename themselves ray::<Actor>; vLLM's engine and worker processes
    # VLLM::EngineCore, VLLM::Worker_TP0 (VLLM_PROCESS_NAME_PREFIX; the EngineCore, a Ray driver, listens on a
    # wildcard port of the Ray worker range).
    r"^(ray|VLLM)::",
    # Python processes running Ray, vLLM, torch or this collection: site-packages/ray/..., -m vllm.entrypoints...,
    # torch.distributed.run, /opt/multinode-vllm/...
    r"(^|[\s/])(ray|vllm|torch|multinode[\w.-]*)([\s/.]|$)",
    r"plasma_store|dashboard/(dashboard|agent)\.py",
)

# Command-line values never returned (vLLM's --api-key, tokens passed on the command line).
_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|secret|password|passwd)$", re.IGNORECASE)
CMDLINE_MAX = 200


class AuditError(MultinodeError, ValueError):
    """A bad argument (address, pattern, allow rule); the message names it."""


@dataclass(frozen=True)
class Socket:
    proto: str  # tcp, tcp6, udp, udp6
    address: str  # normalized: an IPv4-mapped IPv6 address is given as IPv4
    port: int
    inode: int


def parse_net(text: str, proto: str) -> list[Socket]:
    """Listening (TCP) or bound-and-unconnected (UDP) sockets in the text of /proc/net/<proto>."""
    wanted = TCP_LISTEN if proto.startswith("tcp") else UDP_UNCONNECTED
    # A connected UDP socket is ESTABLISHED (01); an unconnected one never bound has port 0.
    return [Socket(proto=proto, address=row.local, port=row.local_port, inode=row.inode)
            for row in net_sockets(text) if row.state == wanted and row.local_port != 0]


def read_sockets(include_udp: bool = False, proc_root: str = "/proc") -> list[Socket]:
    protos = ("tcp", "tcp6", "udp", "udp6") if include_udp else ("tcp", "tcp6")
    sockets = []
    for proto in protos:
        try:
            with open(os.path.join(proc_root, "self", "net", proto)) as handle:
                sockets += parse_net(handle.read(), proto)
        except FileNotFoundError:
            # No IPv6 in this kernel or namespace: nothing can listen there.
            continue
    return sockets


def socket_owners(inodes: Iterable[int], proc_root: str = "/proc") -> dict[int, list[int]]:
    """inode -> pids holding it, among the processes of the caller's network namespace."""
    wanted = {"socket:[%d]" % inode: inode for inode in inodes}
    netns = own_netns(proc_root)
    owners: dict[int, list[int]] = {}
    for entry in sorted(os.listdir(proc_root), key=lambda e: int(e) if e.isdigit() else 0):
        if not entry.isdigit():
            continue
        base = os.path.join(proc_root, entry)
        try:
            if os.readlink(os.path.join(base, "ns", "net")) != netns:
                continue
            fds = os.listdir(os.path.join(base, "fd"))
        except OSError:
            # Gone, or not ours to read (not root): its sockets stay unattributed.
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(base, "fd", fd))
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], []).append(int(entry))
    return owners


def short_cmdline(cmdline: Sequence[str], limit: int = CMDLINE_MAX) -> str:
    """The command line for a report: secret-looking flag values masked, cut at ``limit`` characters."""
    parts = []
    mask_next = False
    for part in cmdline:
        if mask_next:
            parts.append("********")
            mask_next = False
            continue
        flag, eq, _value = part.partition("=")
        if _SECRET_FLAG.match(flag):
            if eq:
                part = flag + "=********"
            else:
                mask_next = True
        parts.append(part)
    text = " ".join(parts)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def listeners(include_udp: bool = False, proc_root: str = "/proc") -> list[dict[str, Any]]:
    """Every listener of this network namespace with its owning processes (pid, name, short cmdline)."""
    sockets = read_sockets(include_udp, proc_root)
    owners = socket_owners({s.inode for s in sockets}, proc_root)
    procs: dict[int, Any] = {}
    found = []
    for sock in sockets:
        processes = []
        for pid in owners.get(sock.inode, []):
            if pid not in procs:
                procs[pid] = read_process(pid, proc_root)
            proc = procs[pid]
            if proc is not None:
                # Patterns see the whole command line (Ray's run past any cut); audit() drops it from the result.
                processes.append(dict(pid=pid, name=proc.name, cmdline=short_cmdline(proc.cmdline),
                                      full_cmdline=" ".join(proc.cmdline)))
        found.append(dict(proto=sock.proto, address=sock.address, port=sock.port, inode=sock.inode,
                          processes=processes))
    found.sort(key=lambda item: (item["proto"], item["port"], item["address"]))
    return found


def _ip(value: str, what: str) -> Any:
    try:
        addr = ipaddress.ip_address(str(value).strip("[]"))
    except ValueError:
        raise AuditError("%s %r is not an IP address; give an IPv4 or IPv6 address" % (what, value)) from None
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped if mapped is not None else addr


def compile_patterns(patterns: Optional[Sequence[str]]) -> list[re.Pattern]:
    compiled = []
    for pattern in DEFAULT_PATTERNS if patterns is None else patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise AuditError("pattern %r is not a regular expression (%s); fix it or leave patterns unset"
                             % (pattern, exc)) from None
    return compiled


def check_allow(rules: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate allow rules; each needs at least one of port, address, process."""
    checked = []
    for rule in rules:
        rule = {k: v for k, v in dict(rule).items() if v is not None}
        if not rule or set(rule) - {"port", "address", "process"}:
            raise AuditError("allow rule %r: give port, address and/or process (e.g. {port: 22}), nothing else"
                             % (dict(rule),))
        if "address" in rule:
            rule["address"] = _ip(rule["address"], "allow rule address")
        if "port" in rule:
            rule["port"] = int(rule["port"])
        if "process" in rule:
            rule["process"] = compile_patterns([rule["process"]])[0]
        checked.append(rule)
    return checked


def _rule_matches(rule: Mapping[str, Any], addr: Any, port: int, names: Sequence[str]) -> bool:
    if "port" in rule and rule["port"] != port:
        return False
    if "address" in rule and rule["address"] != addr:
        return False
    if "process" in rule and not any(rule["process"].search(name) for name in names):
        return False
    return True


def is_cluster_internal(processes: Sequence[Mapping[str, Any]], patterns: Sequence[re.Pattern]) -> bool:
    return any(p.search(proc["name"]) or p.search(proc.get("full_cmdline", proc["cmdline"]))
               for proc in processes for p in patterns)


def endpoint(address: str, port: int) -> str:
    return "[%s]:%d" % (address, port) if ":" in address else "%s:%d" % (address, port)


def classify(listener: Mapping[str, Any], fabric_ip: str, allow: Sequence[Mapping[str, Any]] = (),
             patterns: Sequence[re.Pattern] = (), scope: str = "cluster", management_ip: Optional[str] = None,
             host: str = "") -> dict[str, Any]:
    """verdict (allowed, ignored, unattributed or violation), reason, and for a violation the message.

    ``allow`` is check_allow()'s output; ``patterns`` compile_patterns()'s.
    """
    addr = _ip(listener["address"], "listener address")
    fabric = _ip(fabric_ip, "fabric_ip")
    mgmt = _ip(management_ip, "management_ip") if management_ip else None
    port = listener["port"]
    processes = listener["processes"]
    if addr.is_loopback:
        return dict(verdict="allowed", reason="loopback")
    if addr == fabric:
        return dict(verdict="allowed", reason="fabric address")
    # A rule's process pattern is searched in each owner's name and in its full command line.
    names = [p["name"] for p in processes] + [p.get("full_cmdline", p["cmdline"]) for p in processes]
    for rule in allow:
        if _rule_matches(rule, addr, port, names):
            return dict(verdict="allowed", reason="allow rule %s" % _rule_text(rule))
    if scope != "all":
        if not processes:
            # No readable owner (another user's process without root, or a kernel socket): cannot tell.
            return dict(verdict="unattributed", reason="no process found for socket inode %d" % listener["inode"])
        if not is_cluster_internal(processes, patterns):
            return dict(verdict="ignored", reason="not a cluster process (scope=cluster)")
    if addr.is_unspecified:
        why = "a wildcard reachable from the management network"
    elif mgmt is not None and addr == mgmt:
        why = "the management address"
    else:
        why = "not the fabric address, so reachable off the fabric"
    where = endpoint(listener["address"], port)
    if listener["proto"].startswith("udp"):
        where = "udp " + where
    if processes:
        owner = processes[0]
        who = "%s (pid %d)" % (owner["name"], owner["pid"])
        if len(processes) > 1:
            who += " and %d more (pids %s)" % (len(processes) - 1, ", ".join(str(p["pid"]) for p in processes[1:]))
    else:
        who = "an unknown process (socket inode %d)" % listener["inode"]
    message = "%s%s listens on %s, %s; bind it to the fabric address %s (see %s) or firewall it" % (
        host + ": " if host else "", who, where, why, fabric_ip, DOC)
    return dict(verdict="violation", reason=why, message=message)


def _rule_text(rule: Mapping[str, Any]) -> str:
    parts = ["%s=%s" % (k, rule[k].pattern if k == "process" else rule[k]) for k in ("address", "port", "process")
             if k in rule]
    return " ".join(parts)


def audit(fabric_ip: str, allow: Sequence[Mapping[str, Any]] = (), scope: str = "cluster",
          patterns: Optional[Sequence[str]] = None, include_udp: bool = False, management_ip: Optional[str] = None,
          host: str = "", proc_root: str = "/proc") -> dict[str, Any]:
    """Read this namespace's listeners and judge each; returns listeners (with verdict) and violation messages."""
    _ip(fabric_ip, "fabric_ip")
    if management_ip:
        _ip(management_ip, "management_ip")
    if scope not in ("cluster", "all"):
        raise AuditError("scope %r: expected cluster or all" % (scope,))
    rules = check_allow(allow)
    compiled = compile_patterns(patterns)
    seen = listeners(include_udp, proc_root)
    for item in seen:
        item.update(classify(item, fabric_ip, rules, compiled, scope, management_ip, host))
        for proc in item["processes"]:
            proc.pop("full_cmdline", None)
    return dict(listeners=seen, violations=[i["message"] for i in seen if i["verdict"] == "violation"])


def listener_problems(listeners: Sequence[Mapping[str, Any]], fabric_ip: str, host: str = "") -> list[Problem]:
    """The violations among judged listeners (``audit``'s ``listeners``, each with ``verdict``, ``reason`` and
    ``message``) as Problems, rule ``bind_not_fabric``; the message is ``audit``'s own."""
    problems = []
    for item in listeners:
        if item.get("verdict") != "violation":
            continue
        where = endpoint(str(item.get("address")), int(item.get("port") or 0))
        owners = ", ".join("%s (pid %s)" % (p.get("name"), p.get("pid")) for p in item.get("processes") or []) \
            or "an unknown process"
        problems.append(Problem(
            "bind_not_fabric", "%s listens on %s%s" % (
                owners, "udp " if str(item.get("proto", "")).startswith("udp") else "", where),
            "%s: a cluster process is reachable off the fabric" % (item.get("reason") or "not the fabric address"),
            "bind it to the fabric address %s (see %s) or firewall it" % (fabric_ip, DOC), host=host or None,
            message=str(item.get("message") or "")))
    return problems
