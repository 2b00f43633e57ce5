# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one /proc/net parser: addresses in the kernel's word order, every row, the IPv4 TCP view readiness uses.

The bind audit's filters over it (listeners only) are tested in test__bind_audit.py.
"""

from __future__ import annotations

import sys

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._proc_net import (
    NetSocket,
    decode_address,
    net_sockets,
    parse_proc_net_tcp,
)

little_endian = pytest.mark.skipif(sys.byteorder != "little", reason="the recorded /proc text is from a little-endian host")


@little_endian
@pytest.mark.parametrize("text, address", [
    ("0CC812C6", "198.18.200.12"),
    ("B80D0120000000000000000001000000", "2001:db8::1"),
    ("000080FE00000000FF101A8E03A0DDFE", "fe80::8e1a:10ff:fedd:a003"),
    ("0000000000000000FFFF00000CC812C6", "198.18.200.12"),
])
def test_decode_address_word_order(text, address):
    assert decode_address(text) == address


def test_decode_address_rejects_other_lengths():
    with pytest.raises(ValueError):
        decode_address("0100007F00")


# Native backend: the connections of a rank (spark2, 198.18.200.13) to the head's fabric address.
PROC_NET_TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0DC812C6:A1B2 0CC812C6:7530 01 00000000:00000000 00:00000000 00000000     0        0 111 1 0
   1: 0DC812C6:A1B3 0CC812C6:1F90 01 00000000:00000000 00:00000000 00000000     0        0 112 1 0
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 113 1 0
   3: 0A0213C6:0016 010213C6:C350 01 00000000:00000000 00:00000000 00000000     0        0 114 1 0
"""


@little_endian
def test_parse_proc_net_tcp():
    conns = parse_proc_net_tcp(PROC_NET_TCP)
    assert conns[0] == {"local": "198.18.200.13", "local_port": 0xA1B2, "remote": "198.18.200.12",
                        "remote_port": 30000, "state": "ESTABLISHED", "inode": "111"}
    assert conns[2]["state"] == "LISTEN" and conns[2]["local"] == "0.0.0.0"
    assert conns[3]["local"] == "198.19.2.10" and conns[3]["local_port"] == 22


@little_endian
def test_every_row_with_both_ends():
    """One parser for both readers: listening and connected rows alike, both ends, IPv6 tables flagged."""
    rows = net_sockets(PROC_NET_TCP)
    assert len(rows) == 4 and rows[0] == NetSocket(local="198.18.200.13", local_port=0xA1B2, remote="198.18.200.12",
                                                   remote_port=30000, state="01", inode=111, ipv6=False)
    tcp6 = ("  sl local_address remote_address st tx_queue rx_queue tr tm->when retrnsmt uid timeout inode\n"
            "   0: 0000000000000000FFFF00000100007F:9E6B 00000000000000000000000000000000:0000 0A 00000000:00000000 "
            "00:00000000 00000000 0 0 1109710 1 0000 100 0 0 10 0\n")
    assert net_sockets(tcp6) == [NetSocket(local="127.0.0.1", local_port=40555, remote="::", remote_port=0, state="0A",
                                           inode=1109710, ipv6=True)]
    assert parse_proc_net_tcp(tcp6) == []  # readiness reads /proc/net/tcp only: IPv4
