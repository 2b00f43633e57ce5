# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bind_replacing / listen_error on real sockets of the loopback."""

from __future__ import annotations

import errno
import socket
import threading

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._detach import bind_replacing, listen_error

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
