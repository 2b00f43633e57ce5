# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The whole-group recovery watchdog's decisions (issue 21), as the collection sees them.

The watchdog runs on the head as the node script ``_node_watchdog.py`` (installed as one file, under every runtime),
which imports nothing of the collection (docs/architecture.md, "Python on a node"). So its pure core lives there,
as ``_node_env_exec.parse_env_file`` does, and this module is its face for the roles, filters and the status play:

- ``Policy``, ``policy_from_dict``: when the watchdog acts (probe interval, failure threshold, grace period after a
  restart, the budget of recoveries in a window, backoff with jitter, timeouts); ``detection_bound_s``;
- ``new_state``, ``decide(state, observation, now, policy, rnd) -> Decision``, ``finish_recovery``: the state record
  (JSON) and the one decision after each check (ok, wait, recover, paused, gave_up);
- ``ray_table``, ``health_cause``: what a check saw, and its cause (a node that left Ray, a hung completion...);
- ``status_line``: one line for a human, from a state file;
- ``check_policy``, ``check_config``: the same checks as the node's, raising ``WatchdogError`` (a
  ``MultinodeError``) for a role or filter to report before anything is installed.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._node_watchdog import (
    ACTIONS,
    CAUSES,
    COMPLETION_RESULTS,
    OUTCOMES,
    STEPS,
    Decision,
    Policy,
    PolicyError,
    backoff_delay,
    completion_cause,
    config_from_dict,
    decide,
    detection_bound_s,
    finish_recovery,
    health_cause,
    new_state,
    policy_from_dict,
    ray_cause,
    ray_table,
    status_line,
)

__all__ = [
    "ACTIONS", "CAUSES", "COMPLETION_RESULTS", "OUTCOMES", "STEPS", "Decision", "Policy", "PolicyError",
    "WatchdogError", "backoff_delay", "check_config", "check_policy", "completion_cause", "decide",
    "detection_bound_s", "finish_recovery", "health_cause", "new_state", "policy_from_dict", "ray_cause",
    "ray_table", "status_line",
]


class WatchdogError(MultinodeError, ValueError):
    """A watchdog policy or config the collection refuses; the message names the key, the value and the fix."""


def check_policy(values: Optional[Mapping[str, Any]], what: str = "serve_watchdog_policy") -> Policy:
    """``policy_from_dict``, its refusal as a ``WatchdogError`` (``what`` names the variable)."""
    try:
        return policy_from_dict(values, what)
    except PolicyError as exc:
        raise WatchdogError(str(exc)) from None


def check_config(values: Any, what: str = "watchdog config") -> dict:
    """``config_from_dict`` (the node's own check of its config file), its refusal as a ``WatchdogError``; the
    result's ``policy`` is a ``Policy`` (``policy._asdict()`` for JSON)."""
    try:
        return config_from_dict(values, what)
    except PolicyError as exc:
        raise WatchdogError(str(exc)) from None
