# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bind_replacing / listen_error on real sockets of the loopback."""

from __future__ import annotations

import errno
import socket
import threading
import time

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._detach import (
    ConnectionGate,
    LineReader,
    LineTooLong,
    bind_replacing,
    listen_error,
)

LO = "127.0.0.1"


def _held_port():
    """A listening socket on a free loopback port (the 'stale owner')."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind((LO, 0))
    holder.listen(1)
    return holder, holder.getsockname()[1]


def _binder(port, opened):
    def bind():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        opened.append(sock)
        try:
            sock.bind((LO, port))
        except OSError:
            sock.close()
            raise
        return sock
    return bind


def test_a_stale_owner_that_quits_is_replaced():
    holder, port = _held_port()
    quits, opened = [], []

    def quit_stale():
        quits.append(port)
        # frees the port a little later, as a stale server does when its serve loop ends
        threading.Timer(0.3, holder.close).start()

    sock = bind_replacing(_binder(port, opened), quit_stale, wait=3.0, tick=0.05)
    try:
        assert sock.getsockname() == (LO, port)
        assert quits == [port]  # asked once, not on every retry
        assert len(opened) > 1 and all(s.fileno() == -1 for s in opened[:-1])  # failed tries closed their sockets
    finally:
        sock.close()


def test_an_owner_that_stays_raises_address_in_use_after_the_wait():
    holder, port = _held_port()
    quits = []
    try:
        with pytest.raises(OSError) as err:
            bind_replacing(_binder(port, []), lambda: quits.append(1), wait=0.3, tick=0.05)
        assert err.value.errno == errno.EADDRINUSE
        assert quits == [1]
        assert "choose another fabric_probe_port" in listen_error(err.value, LO, port, "fabric_probe_port")
    finally:
        holder.close()


def test_other_errors_are_raised_at_once_without_asking_anyone_to_quit():
    quits = []
    with pytest.raises(OSError) as err:
        bind_replacing(_bind_foreign, lambda: quits.append(1), wait=5.0)
    assert err.value.errno == errno.EADDRNOTAVAIL
    assert quits == []
    assert listen_error(err.value, "192.0.2.1", 9, "x") == "cannot listen on 192.0.2.1:9: this host does not carry 192.0.2.1"


def _bind_foreign():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("192.0.2.1", 0))  # TEST-NET-1: no interface here carries it


def test_listen_error_passes_other_errors_through():
    exc = OSError(errno.EACCES, "Permission denied")
    assert listen_error(exc, LO, 80, "x") == "cannot listen on 127.0.0.1:80: Permission denied"


# ---------------------------------------------------------------------------
# LineReader and ConnectionGate: what a server reads before it knows who is talking
# ---------------------------------------------------------------------------


def test_line_reader_returns_lines_and_keeps_what_follows():
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b"one\ntwo\nthr")
        reader = LineReader(left)
        assert reader.readline(16, 1.0) == b"one\n"
        assert reader.readline(16, 1.0) == b"two\n"
        right.sendall(b"ee\n")
        assert reader.readline(16, 1.0) == b"three\n"
        right.close()
        assert reader.readline(16, 1.0) == b""


def test_line_reader_stops_at_the_bound_having_read_no_more():
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b"x" * 100)
        reader = LineReader(left)
        with pytest.raises(LineTooLong):
            reader.readline(16, 1.0)
        assert len(reader.buffer) == 16
        assert len(left.recv(1000)) == 84  # the rest was never taken from the socket


def test_line_reader_bounds_the_whole_line_in_time_not_each_recv():
    """A peer that trickles a byte every 0.1 s never lets one recv time out; the line's deadline still holds."""
    left, right = socket.socketpair()
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.1):
            try:
                right.send(b"x")
            except OSError:
                return

    thread = threading.Thread(target=trickle)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(socket.timeout):
            LineReader(left).readline(4096, 0.5)
    finally:
        stop.set()
        thread.join(2)
        left.close()
        right.close()
    assert 0.5 <= time.monotonic() - started < 1.5


def test_gate_admits_only_allowed_addresses_each_up_to_its_cap():
    gate = ConnectionGate(["198.18.200.13", "198.18.200.14"], per_address=2)
    assert gate.admit("192.168.1.5") == "not allowed"
    assert [gate.admit("198.18.200.13") for _conn in range(3)] == [None, None, "busy"]
    assert gate.admit("198.18.200.14") is None  # one peer's connections never use another's budget
    gate.release("198.18.200.13")
    assert gate.admit("198.18.200.13") is None
    assert gate.total() == 3
