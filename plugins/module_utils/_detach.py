# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a short-lived server detached from the module process.

The fabric probe listener and the model sender both bind their sockets in the
module (so errors surface as task failures), replacing a stale server of their
own kind on the same port, then serve from a grandchild that has its own
session and /dev/null as stdio, so Ansible's connection can close.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def bind_replacing(bind: Callable[[], T], quit_stale: Callable[[], object], wait: float = 3.0,
                   tick: float = 0.1) -> T:
    """Return ``bind()``; while its address is in use, ask the stale owner to quit (once) and retry.

    ``bind`` closes whatever it opened before it raises. A stale server answers its quit at once but
    frees the address only when its serve loop ends (up to one select tick later), hence the retries.
    Raises the OSError: any other than EADDRINUSE at once, EADDRINUSE still there after ``wait`` s
    (another program holds the address).
    """
    deadline = time.monotonic() + wait
    asked = False
    while True:
        try:
            return bind()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if not asked:
                quit_stale()
                asked = True
            if time.monotonic() > deadline:
                raise
        time.sleep(tick)


def listen_error(exc: OSError, ip: str, port: int, option: str) -> str:
    """What a failed bind on ip:port means for the user, and which variable fixes it."""
    if exc.errno == errno.EADDRNOTAVAIL:
        return "cannot listen on %s:%d: this host does not carry %s" % (ip, port, ip)
    if exc.errno == errno.EADDRINUSE:
        return "cannot listen on %s:%d: the port is in use by another program; choose another %s" % (ip, port, option)
    return "cannot listen on %s:%d: %s" % (ip, port, exc.strerror)


def run_detached(work: Callable[[], None], handed_over: Sequence[socket.socket]) -> int:
    """Run ``work`` in a detached grandchild and return its pid (0 if unknown).

    ``handed_over`` are the sockets ``work`` serves: the grandchild keeps them,
    this process closes its copies.
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the detached process
        try:
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                os.write(write_end, str(grandchild).encode())
                os._exit(0)
            os.close(read_end)
            os.close(write_end)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            work()
        finally:
            os._exit(0)
    os.close(write_end)
    for sock in handed_over:
        sock.close()
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as handle:
        pid_text = handle.read().decode()
    return int(pid_text) if pid_text.isdigit() else 0
