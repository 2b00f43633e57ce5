# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a short-lived server detached from the module process.

The fabric probe listener and the model sender both bind their sockets in the
module (so errors surface as task failures), then serve from a grandchild that
has its own session and /dev/null as stdio, so Ansible's connection can close.
"""

from __future__ import annotations

import os
import socket
from typing import Callable, Sequence


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
