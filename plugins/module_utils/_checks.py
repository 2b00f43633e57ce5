# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The checks several parts share: an environment variable name, a whole number, a TCP port.

They only decide; each caller words its own message, naming the inventory variable and the fix, and raises its own
error (or collects the message). Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Optional

# What every reader of the collection's environments takes as a plain name: /usr/bin/env (a key with '=' would
# split, one starting with '-' is an option), sh's `set -a; .`, systemd's EnvironmentFile and docker's --env-file.
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGITS = re.compile(r"\s*[0-9]+\s*")

PORT_MIN = 1
PORT_MAX = 65535


def is_env_key(key: Any) -> bool:
    """Whether ``key`` is an environment variable name: letters, digits and '_', not starting with a digit."""
    return isinstance(key, str) and _ENV_KEY.fullmatch(key) is not None


def whole_number(value: Any) -> Optional[int]:
    """``value`` as an int when it is one (not a bool: True is an int in Python) or a string of digits (Jinja hands
    over "8000"); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    return None


def port_number(value: Any) -> Optional[int]:
    """``value`` as a TCP port (a whole number from 1 to 65535, see ``whole_number``); else None."""
    number = whole_number(value)
    return number if number is not None and PORT_MIN <= number <= PORT_MAX else None
