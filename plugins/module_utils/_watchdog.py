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
  ``MultinodeError``) for a role or filter to report before anything is installed;
- ``watchdog_config``: the head's config for a runtime and backend (the recovery's commands), checked.

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
    "ray_table", "status_line", "watchdog_config",
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


# The program names the serve and ray roles give their node programs (node_process_name).
SERVE_PROGRAM, RAY_PROGRAM = "vllm", "ray"
WATCHDOG_RUNTIMES = ("process", "systemd")


def watchdog_config(
    runtime: str,
    backend: str,
    api_url: str,
    model: str,
    python: str,
    script: str,
    config_file: str,
    state_file: str,
    lock_file: str,
    operator_stop_file: str,
    api_key_file: str = "",
    expected_nodes: Optional[list] = None,
    ray_reader: str = "",
    gcs_address: str = "",
    supervisorctl: Optional[list] = None,
    units: Optional[Mapping[str, str]] = None,
    generation: str = "",
    policy: Optional[Mapping[str, Any]] = None,
    check_timeout_s: float = 120.0,
) -> dict:
    """The head's watchdog config (the JSON the node script reads), checked as the node will check it.

    The recovery's steps, per runtime: stop vllm serve; check that every node is in Ray's node table on its fabric
    address (``--check-ray``: a recovery stops there, before vLLM restarts into a group that cannot form); start the
    Ray head (a no-op where it runs: a dead one is restarted by its supervisor); start vllm serve. ``start_workers``
    is empty: each worker's Ray is its own node's program, restarted there by its supervisor (supervisord's
    autorestart, the unit's ``Restart=``); stopping vllm serve, the Ray driver, ends its ranks on every node, a hung
    one too (Ray kills the workers of a driver that is gone). Backend native: no Ray to check or start.
    """
    if runtime not in WATCHDOG_RUNTIMES:
        raise WatchdogError(
            "serve_watchdog_enabled: the watchdog runs under multinode_runtime %s; got %r (under docker the "
            "containers' restart policy restarts a dead vllm serve, a hung one is not recovered yet: set "
            "serve_watchdog_enabled false)" % (" or ".join(WATCHDOG_RUNTIMES), runtime))
    if backend not in ("ray", "native"):
        raise WatchdogError("vllm_backend must be ray or native; got %r" % (backend,))
    if runtime == "process":
        ctl = list(supervisorctl or [])
        if not ctl:
            raise WatchdogError("the process runtime's watchdog needs the supervisorctl command line")

        def control(action: str, program: str) -> list:
            return ctl + [action, program]
    else:
        names = dict(units or {})
        missing = [p for p in [SERVE_PROGRAM] + ([RAY_PROGRAM] if backend == "ray" else []) if not names.get(p)]
        if missing:
            raise WatchdogError("the systemd runtime's watchdog needs the unit name of %s" % ", ".join(missing))

        def control(action: str, program: str) -> list:
            return ["systemctl", action, names[program]]
    ray = backend == "ray"
    if ray and not (ray_reader and gcs_address and expected_nodes):
        raise WatchdogError("backend ray: the watchdog needs the node table reader, the GCS address and every node's "
                            "fabric address")
    values = {
        "api_url": api_url,
        "api_key_file": api_key_file or None,
        "model": model,
        "expected_nodes": list(expected_nodes or []) if ray else [],
        "ray_nodes_command": [python, ray_reader, gcs_address, "5"] if ray else None,
        "steps": {
            "stop": [control("stop", SERVE_PROGRAM)],
            "check": [[python, script, "--config", config_file, "--check-ray", "%g" % check_timeout_s]] if ray else [],
            "start_head": [control("start", RAY_PROGRAM)] if ray else [],
            "start_workers": [],
            "start_vllm": [control("start", SERVE_PROGRAM)],
        },
        "state_file": state_file,
        "lock_file": lock_file,
        "operator_stop_file": operator_stop_file,
        "generation": generation or None,
        "policy": dict(policy or {}),
    }
    checked = check_config(values, "the watchdog config")
    values["policy"] = checked["policy"]._asdict()
    values["api_url"] = checked["api_url"]
    return values
