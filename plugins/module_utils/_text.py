# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Characters no argument or environment value may carry, and the message that says so.

Every runtime writes arguments and environment values into line-based text:
a supervisord section (a line break starts a new key or a new
``[program:...]``), a systemd unit (a line break or NUL ends ``ExecStart=``),
an env file (one ``KEY=VALUE`` per line); and argv itself ends a word at NUL.
None of those readers shares an escape for them, so they are refused, not
escaped, with a message naming the inventory variable the value came from.
Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

from typing import Any, Optional

# What str.splitlines() breaks on (a superset of what configparser's file reading, systemd and
# docker's env-file reader break on), and NUL.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
REFUSED = LINE_BREAKS + "\x00"

_SHOWN = 120


def refused_char(value: str) -> Optional[str]:
    """The first character of ``value`` that may not be rendered, or None."""
    for char in value:
        if char in REFUSED:
            return char
    return None


def shown(value: str) -> str:
    """``repr`` of a value, cut so that a long JSON argument does not flood the message."""
    return repr(value) if len(value) <= _SHOWN else repr(value[:_SHOWN]) + "..."


def one_line_error(variable: str, value: Any) -> Optional[str]:
    """None when ``value`` may be rendered; else the message: which variable, which value, what, how to fix."""
    text = str(value)
    char = refused_char(text)
    if char is None:
        return None
    what = "a NUL character" if char == "\x00" else "a line break (newline) %r" % char
    return (
        "%s = %s contains %s at position %d; arguments and environment values are written one per line into "
        "supervisor sections, systemd units and env files, so a line break could add a key or a section there. "
        "Expected a single line without NUL: remove the character (write a JSON value, such as --hf-overrides, "
        "on one line: to_json, not to_nice_json)" % (variable, shown(text), what, text.index(char))
    )
