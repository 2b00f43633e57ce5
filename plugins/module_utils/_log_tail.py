# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The last lines of a node's log, whatever the runtime writes it to: a file, a container, a systemd unit.

A source is a path (the process runtime's ``/var/log/multinode-vllm/vllm.log``), ``docker:NAME`` (``docker logs`` of
container NAME, both streams) or ``journal:UNIT`` (this boot's journal of the unit, message text only). Readiness
(``vllm_ready``) and doctor (``doctor_collect``) read logs through it. I/O only, no decisions.
"""

from __future__ import annotations

import os
import subprocess
from collections import deque
from typing import Optional, Union

from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import first_exception

DOCKER_PREFIX = "docker:"
JOURNAL_PREFIX = "journal:"
# Lines of a container's or unit's log scanned for its first exception (neither has a byte offset).
FIRST_ERROR_LINES = 200000
FIRST_ERROR_SCAN = 32 * 1024 * 1024


def _log_command(source: str, lines: int) -> Optional[tuple[str, list[str]]]:
    """(what, argv) reading the last ``lines`` lines of a docker: or journal: source; None for a file."""
    if source.startswith(DOCKER_PREFIX):
        name = source[len(DOCKER_PREFIX):]
        return "container %s" % name, ["docker", "logs", "--tail", str(lines), name]
    if source.startswith(JOURNAL_PREFIX):
        unit = source[len(JOURNAL_PREFIX):]
        # This boot's lines of the unit, message text only (what the program wrote), oldest first.
        return "unit %s" % unit, ["journalctl", "--unit", unit, "--boot", "--lines", str(lines), "--output", "cat",
                                  "--no-pager", "--quiet"]
    return None


def command_log(source: str, lines: int, timeout: float = 60) -> Union[None, str, list[str]]:
    """The last ``lines`` lines of a container's log (both streams) or a unit's journal, an error string, or None
    when ``source`` is a file."""
    command = _log_command(source, lines)
    if command is None:
        return None
    what, argv = command
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "(cannot read the log of %s: %s)" % (what, exc)
    text = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        return "(cannot read the log of %s: %s)" % (what, text.strip()[-300:])
    return text.splitlines()[-lines:]


def tail(path: str, lines: int, timeout: float = 60) -> list[str]:
    """The last ``lines`` lines of a log source; one ``(cannot read ...)`` line when it cannot be read."""
    got = command_log(path, lines, timeout)
    if got is not None:
        return [got] if isinstance(got, str) else got
    try:
        with open(path, "r", errors="replace") as handle:
            return [line.rstrip("\n") for line in deque(handle, maxlen=lines)]
    except OSError as exc:
        return ["(cannot read %s: %s)" % (path, exc.strerror)]


def first_error(path: str) -> Optional[dict]:
    """The first traceback's exception in the log's last FIRST_ERROR_SCAN bytes (None: none, or unreadable)."""
    got = command_log(path, FIRST_ERROR_LINES)
    if got is not None:
        return None if isinstance(got, str) else first_exception(got)
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - FIRST_ERROR_SCAN))
            lines = (raw.decode("utf-8", "replace").rstrip("\n") for raw in handle)
            return first_exception(lines)
    except OSError:
        return None
