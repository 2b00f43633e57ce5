# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a short-lived server detached from the module process, and guard what it reads before authenticating.

The fabric probe listener and the model sender both bind their sockets in the
module (so errors surface as task failures), replacing a stale server of their
own kind on the same port, then serve from a grandchild that has its own
session and /dev/null as stdio, so Ansible's connection can close.

Both listen on the fabric, where any host can connect: ``ConnectionGate`` admits
only the expected peers' addresses, a bounded number each, before a byte is
read or a thread started; ``LineReader`` reads each line within a size and a
time bound.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from typing import Callable, Iterable, Optional, Sequence, TypeVar

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

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


class LineTooLong(MultinodeError, ValueError):
    """A peer sent more than the bound without a newline."""


class LineReader:
    """Newline-terminated lines from a socket, each within ``limit`` bytes and ``seconds``.

    The time bound is for the whole line, not each recv: a peer that trickles one byte at a time is cut off
    as surely as one that sends nothing. Never holds more than ``limit`` bytes.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def readline(self, limit: int, seconds: float) -> bytes:
        """The next line, newline included; b"" when the peer closed (a partial last line is dropped).

        Raises LineTooLong past ``limit`` bytes, socket.timeout (an OSError) past ``seconds``.
        """
        deadline = time.monotonic() + seconds
        while b"\n" not in self.buffer:
            if len(self.buffer) >= limit:
                raise LineTooLong("no newline within %d bytes" % limit)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("no complete line within %g s" % seconds)
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(limit - len(self.buffer))
            if not chunk:
                return b""
            self.buffer += chunk
        line, _newline, self.buffer = self.buffer.partition(b"\n")
        if len(line) >= limit:
            raise LineTooLong("no newline within %d bytes" % limit)
        return line + b"\n"


class ConnectionGate:
    """Admit a connection only from an allowed address that holds fewer than ``per_address`` open ones.

    Decided on accept, from the peer address alone: a refused peer costs no read and no thread, and the
    expected peers' budgets are separate, so idle connections from one cannot lock another out.
    """

    def __init__(self, allowed: Iterable[str], per_address: int) -> None:
        self.allowed = frozenset(allowed)
        self.per_address = per_address
        self.open: dict[str, int] = {}
        self.lock = threading.Lock()

    def admit(self, address: str) -> Optional[str]:
        """None, counting the connection (``release`` it when done); else why it is refused."""
        if address not in self.allowed:
            return "not allowed"
        with self.lock:
            count = self.open.get(address, 0)
            if count >= self.per_address:
                return "busy"
            self.open[address] = count + 1
        return None

    def release(self, address: str) -> None:
        with self.lock:
            self.open[address] -= 1

    def total(self) -> int:
        with self.lock:
            return sum(self.open.values())


def refuse(conn: socket.socket, answer: bytes = b"") -> None:
    """Send a short answer without blocking and close, reading nothing (the accept loop calls this)."""
    try:
        conn.setblocking(False)
        if answer:
            conn.send(answer)  # a fresh socket's send buffer takes a short line at once
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()
