# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one parser of /proc/net/{tcp,tcp6,udp,udp6}.

Two parts read these tables: the bind audit (``_bind_audit``: every socket this node listens on) and readiness
(``parse_proc_net_tcp``: the IPv4 TCP connections of the serve processes, native backend). Both read the rows
``net_sockets`` returns. Pure: parses text; no Ansible imports, no I/O.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Any

# The "st" column: TCP_ESTABLISHED, TCP_SYN_SENT, TCP_LISTEN; an unconnected UDP socket is TCP_CLOSE (07).
TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"
TCP_STATES = {TCP_ESTABLISHED: "ESTABLISHED", "02": "SYN_SENT", TCP_LISTEN: "LISTEN"}


@dataclass(frozen=True)
class NetSocket:
    """One row of a /proc/net table."""

    local: str  # an IPv4-mapped IPv6 address is given as IPv4
    local_port: int
    remote: str
    remote_port: int
    state: str  # the "st" column: two upper-case hex digits
    inode: int
    ipv6: bool  # from a tcp6/udp6 table (32 hex digits), even when the address is IPv4-mapped


def decode_address(text: str) -> str:
    """``0100007F`` or 32 hex digits (four host-order 32-bit words, as the kernel prints them) -> address."""
    if len(text) == 8:
        raw = struct.pack("=I", int(text, 16))
        return socket.inet_ntop(socket.AF_INET, raw)
    if len(text) == 32:
        raw = b"".join(struct.pack("=I", int(text[i:i + 8], 16)) for i in range(0, 32, 8))
        addr = ipaddress.IPv6Address(raw)
        return str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)
    raise ValueError("not a /proc/net address: %r" % text)


def net_sockets(text: str) -> list[NetSocket]:
    """Every socket row of the text of /proc/net/<tcp|tcp6|udp|udp6> (the header line and short lines skipped)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1] or ":" not in fields[2]:
            continue
        local, _sep, local_port = fields[1].partition(":")
        remote, _sep, remote_port = fields[2].partition(":")
        found.append(NetSocket(local=decode_address(local), local_port=int(local_port, 16),
                               remote=decode_address(remote), remote_port=int(remote_port, 16),
                               state=fields[3].upper(), inode=int(fields[9]), ipv6=len(local) == 32))
    return found


def parse_proc_net_tcp(text: str) -> list[dict[str, Any]]:
    """IPv4 sockets of /proc/net/tcp: local/remote address and port, state name, inode (a string)."""
    return [{"local": s.local, "local_port": s.local_port, "remote": s.remote, "remote_port": s.remote_port,
             "state": TCP_STATES.get(s.state, s.state), "inode": str(s.inode)}
            for s in net_sockets(text) if not s.ipv6]
