# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The whole-group recovery watchdog (issue 21): a node script that runs on the head, under every runtime.

It is installed as one file (as ``multinode-env-exec`` is) and run as

    <python> multinode-watchdog --config CONFIG.json [--once]

``--once`` makes one check (a systemd timer's oneshot unit); without it the program checks every
``policy.interval_s`` seconds until stopped (a supervisord program, a container). Each check:

1. takes the run lock (``<state_file>.lock``, fcntl): two watchdog runs never overlap; a second one exits at once;
2. looks at the **deploy lock** (``lock_file``, fcntl; a deploy or teardown holds it, or writes a lease
   ``{"holder": ..., "until": <epoch>}`` into it) and the **operator stop marker** (``operator_stop_file``): either
   one pauses the watchdog, which then neither judges nor recovers; it holds the deploy lock itself while it
   recovers, so a deploy that takes it waits for the recovery to end;
3. probes the serving group: a real ``POST /v1/completions`` (a few tokens, ``policy.completion_timeout_s``, the API
   key read from a file, never on a command line, never logged) and Ray's node table (``ray_nodes_command``, whose
   standard output is ``_node_ray_reader``'s JSON object: every expected fabric address must be alive), both at
   once, so one check takes at most the longer of the two timeouts;
4. ``decide``: ok, wait (below the failure threshold, in the backoff, in the grace period after a restart),
   recover (with the cause), paused, or gave_up (the budget of recoveries is spent: it says why and stops trying
   until a deploy resets it);
5. recovers in order: stop the group, check (the fabric between the nodes), start the Ray head, the workers, vLLM,
   then waits for a completion (``policy.settle_timeout_s``); each step a list of argv lists from the config, run
   with ``policy.step_timeout_s``, each logged on one line with the cause;
6. writes the state file atomically (temporary file, then rename): the status play reads it.

The first part of this file is pure (no I/O): the policy, the state record, ``decide``, ``finish_recovery``,
``status_line``. ``_watchdog.py`` is their face inside the collection (a node script imports nothing of the
collection: tests/unit/plugins/module_utils/test_conventions.py); the rest is the runner.

Self-contained (standard library only), as every node script is.
"""

from __future__ import annotations

import argparse
import copy
import errno
import fcntl
import ipaddress
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

# ---------------------------------------------------------------------------
# The pure core: policy, state, decide
# ---------------------------------------------------------------------------

STATE_VERSION = 1
ACTIONS = ("ok", "wait", "recover", "paused", "gave_up")
# What a check can find wrong, most telling first (a node that left Ray also hangs the completion).
CAUSES = ("ray_unreachable", "node_wrong_address", "node_left", "completion_hung", "api_refused", "api_error")
# What a completion request can end in.
COMPLETION_RESULTS = ("ok", "timeout", "refused", "http_error", "unreachable", "invalid")
# The recovery, in order; then a completion is awaited.
STEPS = ("stop", "check", "start_head", "start_workers", "start_vllm")
OUTCOMES = ("recovered", "failed", "interrupted")
# Recoveries kept in the state file (the budget counts only those inside the window).
KEEP_RECOVERIES = 20


class PolicyError(ValueError):
    """A policy or config value the watchdog refuses; the message names the key, the value and what is expected."""


class Policy(NamedTuple):
    """When the watchdog acts. Times in seconds."""

    interval_s: float = 5.0              # between the starts of two checks
    completion_timeout_s: float = 10.0   # one completion request (a hung API fails after this)
    ray_timeout_s: float = 5.0           # one read of Ray's node table
    failure_threshold: int = 2           # consecutive failed checks before acting
    grace_s: float = 60.0                # after a restart or a deploy: failures are recorded, not acted on
    settle_timeout_s: float = 900.0      # after the restart, how long to wait for a completion (the model loads)
    step_timeout_s: float = 300.0        # one recovery command
    max_recoveries: int = 3              # the budget: recoveries within window_s; then the watchdog gives up
    window_s: float = 3600.0
    backoff_base_s: float = 30.0         # before the 2nd recovery in the window; doubles each time
    backoff_cap_s: float = 600.0
    jitter: float = 0.2                  # a backoff is shortened by up to this fraction, at random


# key: (kind, smallest, smallest allowed exclusive?)
_POLICY_RULES = {
    "interval_s": ("number", 0, True),
    "completion_timeout_s": ("number", 0, True),
    "ray_timeout_s": ("number", 0, True),
    "failure_threshold": ("int", 1, False),
    "grace_s": ("number", 0, False),
    "settle_timeout_s": ("number", 0, True),
    "step_timeout_s": ("number", 0, True),
    "max_recoveries": ("int", 0, False),
    "window_s": ("number", 0, True),
    "backoff_base_s": ("number", 0, True),
    "backoff_cap_s": ("number", 0, True),
    "jitter": ("number", 0, False),
}


def _number(key: str, value: Any, kind: str, smallest: float, exclusive: bool, what: str) -> Any:
    expected = "%s %s %s" % ("a whole number" if kind == "int" else "a number",
                             "above" if exclusive else "of at least", smallest)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PolicyError("%s.%s must be %s; got %r" % (what, key, expected, value))
    try:
        number = int(value) if kind == "int" else float(value)
    except ValueError:
        raise PolicyError("%s.%s must be %s; got %r" % (what, key, expected, value)) from None
    if kind == "int" and isinstance(value, float) and value != number:
        raise PolicyError("%s.%s must be %s; got %r" % (what, key, expected, value))
    if math.isnan(number) or number in (float("inf"), float("-inf")) or number < smallest or (
            exclusive and number == smallest):
        raise PolicyError("%s.%s must be %s; got %r" % (what, key, expected, value))
    return number


def policy_from_dict(values: Optional[Mapping[str, Any]], what: str = "policy") -> Policy:
    """A ``Policy`` from a dict of some of its keys (the rest default); ``PolicyError`` names the key, the value
    and what is expected."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise PolicyError("%s must be a dict of %s; got %r" % (what, ", ".join(Policy._fields), values))
    unknown = sorted(str(k) for k in values if k not in _POLICY_RULES)
    if unknown:
        raise PolicyError("%s: unknown key%s %s; the keys are %s" % (
            what, "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(Policy._fields)))
    fields = {}
    for key, value in values.items():
        kind, smallest, exclusive = _POLICY_RULES[key]
        fields[key] = _number(key, value, kind, smallest, exclusive, what)
    policy = Policy(**fields)
    if policy.jitter >= 1:
        raise PolicyError("%s.jitter must be a fraction from 0 up to (not including) 1; got %r" % (what, policy.jitter))
    if policy.backoff_cap_s < policy.backoff_base_s:
        raise PolicyError("%s.backoff_cap_s (%r) must be at least backoff_base_s (%r)" % (
            what, policy.backoff_cap_s, policy.backoff_base_s))
    return policy


def detection_bound_s(policy: Policy) -> float:
    """The longest time from the moment the API hangs to the check that acts on it, in loop mode.

    A check starts every ``interval_s`` (at once if the previous one overran) and ends within the longer of the two
    probe timeouts; the hang can begin just after a check passed, so the first failing check starts up to
    ``interval_s`` later, and ``failure_threshold`` failing checks are needed.
    """
    probe = max(policy.completion_timeout_s, policy.ray_timeout_s)
    return policy.interval_s + (policy.failure_threshold - 1) * max(policy.interval_s, probe) + probe


def backoff_delay(policy: Policy, recoveries: int, rnd: Callable[[], float]) -> float:
    """The wait before the next recovery, after ``recoveries`` (>= 1) in the window: ``backoff_base_s`` doubled per
    recovery after the first, at most ``backoff_cap_s``, then shortened by up to ``jitter`` of it (``rnd()`` in
    [0, 1)), so it stays within ``[d * (1 - jitter), d]``."""
    delay = min(policy.backoff_cap_s, policy.backoff_base_s * (2.0 ** max(0, recoveries - 1)))
    draw = min(max(float(rnd()), 0.0), 1.0)
    return delay * (1.0 - policy.jitter * draw)


def new_state() -> dict:
    """The state record before the first check (JSON-serialisable, as every state is)."""
    return {
        "version": STATE_VERSION,
        "generation": None,           # the deploy's generation the config carries; a new one resets the budget
        "budget_since": None,         # recoveries before this time are not counted (a deploy reset the budget)
        "consecutive_failures": 0,
        "first_failure": None,        # when the current run of failures began
        "last_check": None,           # {"at", "ok", "cause", "detail"}
        "last_action": None,          # {"at", "action", "cause", "reason"}
        # each {"started", "finished", "cause", "detail", "outcome", "outcome_detail", "duration_s"}
        "recoveries": [],
        "backoff_until": None,
        "grace_until": None,
        "gave_up": None,              # {"at", "reason"}
        "paused": None,               # {"by": "deploy"|"operator", "since", "reason"}
    }


def _normal(state: Optional[Mapping[str, Any]]) -> dict:
    base = new_state()
    if isinstance(state, Mapping) and state.get("version") == STATE_VERSION:
        for key in base:
            if key in state:
                base[key] = copy.deepcopy(state[key])
    if not isinstance(base["recoveries"], list):
        base["recoveries"] = []
    return base


def completion_cause(completion: Optional[Mapping[str, Any]]) -> Optional[tuple]:
    """(cause, detail) for a completion that failed, None for one that answered."""
    if not completion:
        return ("api_error", "no completion was attempted")
    result = completion.get("result")
    detail = str(completion.get("detail") or "")
    if result == "ok":
        return None
    if result == "timeout":
        return ("completion_hung", "no completion within %s s%s" % (
            completion.get("timeout_s", "?"), ": " + detail if detail else ""))
    if result == "refused":
        return ("api_refused", "the API refused the connection%s" % (": " + detail if detail else ""))
    if result == "http_error":
        return ("api_error", "the API answered HTTP %s%s" % (completion.get("status"), ": " + detail if detail else ""))
    return ("api_error", "the completion failed (%s)%s" % (result, ": " + detail if detail else ""))


def ray_table(reader: Any, expected: Sequence[str]) -> dict:
    """What Ray's node table (``_node_ray_reader``'s JSON object) says of the expected fabric addresses:
    ``{"result": "ok"|"error", "detail", "alive", "missing", "unexpected"}``."""
    if not isinstance(reader, Mapping):
        return {"result": "error", "detail": "the node table reader printed no JSON object: %r" % (str(reader)[:200],),
                "alive": [], "missing": list(expected), "unexpected": []}
    if reader.get("error"):
        return {"result": "error", "detail": "%s: %s" % (reader.get("error"), reader.get("detail", "")),
                "alive": [], "missing": list(expected), "unexpected": []}
    nodes = reader.get("nodes")
    if not isinstance(nodes, list):
        return {"result": "error", "detail": "the node table has no list of nodes", "alive": [],
                "missing": list(expected), "unexpected": []}
    alive = sorted({str(n.get("node_manager_address")) for n in nodes if isinstance(n, Mapping) and n.get("alive")})
    return {"result": "ok", "detail": "", "alive": alive,
            "missing": [a for a in expected if a not in alive],
            "unexpected": [a for a in alive if a not in expected]}


def ray_cause(table: Optional[Mapping[str, Any]]) -> Optional[tuple]:
    """(cause, detail) for a node table that lacks an expected node, None for a complete one."""
    if not table:
        return None
    if table.get("result") != "ok":
        return ("ray_unreachable", "Ray's node table could not be read (%s)" % table.get("detail", ""))
    missing, unexpected = list(table.get("missing") or []), list(table.get("unexpected") or [])
    if missing and unexpected:
        return ("node_wrong_address", "Ray has %s alive, not on the expected fabric address%s %s" % (
            ", ".join(unexpected), "es" if len(missing) > 1 else "", ", ".join(missing)))
    if missing:
        return ("node_left", "%s %s not alive in Ray's node table" % (
            ", ".join(missing), "is" if len(missing) == 1 else "are"))
    return None


def health_cause(observation: Mapping[str, Any]) -> Optional[tuple]:
    """(cause, detail) of a failed check, the most telling cause first, the others appended; None if healthy."""
    found = [c for c in (ray_cause(observation.get("ray")), completion_cause(observation.get("completion"))) if c]
    if not found:
        return None
    found.sort(key=lambda c: CAUSES.index(c[0]))
    return (found[0][0], "; ".join(c[1] for c in found))


class Decision(NamedTuple):
    action: str              # one of ACTIONS
    cause: Optional[str]     # one of CAUSES, or None
    reason: str              # one line, for the log and the status
    state: dict              # the new state record


def _started(rec: Mapping[str, Any], default: float) -> float:
    return default if rec.get("started") is None else float(rec["started"])


def _in_budget(state: Mapping[str, Any], now: float, policy: Policy) -> list:
    since = now - policy.window_s
    if state.get("budget_since") is not None:
        since = max(since, float(state["budget_since"]))
    return [r for r in state["recoveries"] if _started(r, 0.0) >= since]


def _reset_budget(state: dict, now: float, policy: Policy) -> None:
    state["gave_up"] = None
    state["backoff_until"] = None
    state["budget_since"] = now
    state["consecutive_failures"] = 0
    state["first_failure"] = None
    state["grace_until"] = now + policy.grace_s


def _ts(epoch: Optional[float]) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))


def _done(state: dict, now: float, action: str, cause: Optional[str], reason: str) -> Decision:
    state["last_action"] = {"at": now, "action": action, "cause": cause, "reason": reason}
    return Decision(action, cause, reason, state)


def decide(state: Optional[Mapping[str, Any]], observation: Mapping[str, Any], now: float, policy: Policy,
           rnd: Callable[[], float]) -> Decision:
    """What to do after one check. Pure: returns a new state, never changes ``state``.

    ``observation``: ``completion`` (``{"result": one of COMPLETION_RESULTS, "status", "detail", "timeout_s"}``),
    ``ray`` (``ray_table``'s dict), ``deploy_lock`` (None, or who holds it), ``operator_stop`` (None, or the
    operator's marker), ``generation`` (the deploy's, from the config). ``rnd()`` draws the backoff's jitter.
    """
    state = _normal(state)
    # A recovery the previous run did not finish (the watchdog was killed in it).
    for rec in state["recoveries"]:
        if rec.get("finished") is None:
            rec.update(finished=now, outcome="interrupted", outcome_detail="the watchdog stopped during it",
                       duration_s=round(now - _started(rec, now), 1))
    generation = observation.get("generation")
    if generation is not None and generation != state["generation"]:
        if state["generation"] is not None:
            _reset_budget(state, now, policy)
        state["generation"] = generation

    for by, key in (("deploy", "deploy_lock"), ("operator", "operator_stop")):
        if observation.get(key):
            reason = ("a deploy or teardown holds the lock (%s)" % observation[key] if by == "deploy"
                      else "the operator stopped the service on purpose (%s)" % observation[key])
            if not state["paused"] or state["paused"].get("by") != by:
                state["paused"] = {"by": by, "since": now, "reason": reason}
            else:
                state["paused"]["reason"] = reason
            state["consecutive_failures"] = 0
            state["first_failure"] = None
            return _done(state, now, "paused", None, reason)
    if state["paused"]:
        # Resumed: what was paused for restarted the group; give it the grace period. A deploy resets the budget.
        if state["paused"].get("by") == "deploy":
            _reset_budget(state, now, policy)
        else:
            state["consecutive_failures"] = 0
            state["first_failure"] = None
            state["grace_until"] = now + policy.grace_s
        state["paused"] = None

    found = health_cause(observation)
    if found is None:
        state["last_check"] = {"at": now, "ok": True, "cause": None, "detail": ""}
        state["consecutive_failures"] = 0
        state["first_failure"] = None
        state["backoff_until"] = None
        return _done(state, now, "ok", None, "healthy")
    cause, detail = found
    state["last_check"] = {"at": now, "ok": False, "cause": cause, "detail": detail}
    state["consecutive_failures"] = int(state["consecutive_failures"] or 0) + 1
    if state["first_failure"] is None:
        state["first_failure"] = now
    if state["gave_up"]:
        return _done(state, now, "gave_up", cause, state["gave_up"]["reason"])
    if state["grace_until"] is not None and now < float(state["grace_until"]):
        return _done(state, now, "wait", cause, "%s; in the grace period after a restart until %s" % (
            detail, _ts(state["grace_until"])))
    if state["consecutive_failures"] < policy.failure_threshold:
        return _done(state, now, "wait", cause, "%s; failed check %d of %d before a recovery" % (
            detail, state["consecutive_failures"], policy.failure_threshold))
    recent = _in_budget(state, now, policy)
    if len(recent) >= policy.max_recoveries:
        if recent:
            last = recent[-1]
            reason = ("%d recover%s within %d s (the budget, max_recoveries %d) did not keep the group "
                      "healthy; the last, for %s, %s%s; still failing: %s. No more recoveries until a deploy resets "
                      "the watchdog" % (len(recent), "y" if len(recent) == 1 else "ies", policy.window_s,
                                        policy.max_recoveries, last.get("cause"), last.get("outcome"),
                                        " (%s)" % last["outcome_detail"] if last.get("outcome_detail") else "",
                                        detail))
        else:
            reason = ("max_recoveries is 0, so the watchdog only reports; failing: %s" % detail)
        state["gave_up"] = {"at": now, "reason": reason}
        return _done(state, now, "gave_up", cause, reason)
    if recent:
        if state["backoff_until"] is None:
            finished = max(_started(r, now) if r.get("finished") is None else float(r["finished"]) for r in recent)
            state["backoff_until"] = finished + backoff_delay(policy, len(recent), rnd)
        if now < float(state["backoff_until"]):
            return _done(state, now, "wait", cause, "%s; backing off after %d recover%s until %s" % (
                detail, len(recent), "y" if len(recent) == 1 else "ies", _ts(state["backoff_until"])))
    state["backoff_until"] = None
    state["recoveries"].append({"started": now, "finished": None, "cause": cause, "detail": detail,
                                "outcome": None, "outcome_detail": "", "duration_s": None})
    state["recoveries"] = state["recoveries"][-KEEP_RECOVERIES:]
    return _done(state, now, "recover", cause, detail)


def finish_recovery(state: Mapping[str, Any], outcome: str, now: float, detail: str = "",
                    policy: Optional[Policy] = None) -> dict:
    """The state after the recovery ``decide`` started: its outcome (one of OUTCOMES), when it finished, how long it
    took; the failure count starts over and the grace period (``policy.grace_s``) begins. ``recovered`` means the
    group answered a completion with every node in Ray's table, so it is also the last check."""
    if outcome not in OUTCOMES:
        raise PolicyError("outcome must be one of %s; got %r" % (", ".join(OUTCOMES), outcome))
    state = _normal(state)
    open_ones = [r for r in state["recoveries"] if r.get("finished") is None]
    if not open_ones:
        raise PolicyError("no recovery is in progress in this state, so none can finish")
    rec = open_ones[-1]
    rec.update(finished=now, outcome=outcome, outcome_detail=detail,
               duration_s=round(now - _started(rec, now), 1))
    state["consecutive_failures"] = 0
    state["first_failure"] = None
    state["grace_until"] = now + (policy or Policy()).grace_s
    if outcome == "recovered":
        # The recovery ended on a completion and a full node table: that is the last check.
        state["last_check"] = {"at": now, "ok": True, "cause": None, "detail": "answered after the recovery"}
    return state


def status_line(state: Optional[Mapping[str, Any]]) -> str:
    """One line for a human: health, pause or gave-up reason, and the last recovery (when, why, how long)."""
    state = _normal(state)
    if state["gave_up"]:
        head = "GAVE UP at %s: %s" % (_ts(state["gave_up"].get("at")), state["gave_up"].get("reason"))
    elif state["paused"]:
        head = "paused since %s: %s" % (_ts(state["paused"].get("since")), state["paused"].get("reason"))
    elif not state["last_check"]:
        head = "no check yet"
    elif state["last_check"].get("ok"):
        head = "healthy (checked %s)" % _ts(state["last_check"].get("at"))
    else:
        head = "failing since %s, %d failed check%s: %s: %s" % (
            _ts(state["first_failure"]), state["consecutive_failures"],
            "" if state["consecutive_failures"] == 1 else "s", state["last_check"].get("cause"),
            state["last_check"].get("detail"))
    if not state["recoveries"]:
        return head + "; no recovery yet"
    rec = state["recoveries"][-1]
    if rec.get("finished") is None:
        return head + "; recovering since %s for %s" % (_ts(rec.get("started")), rec.get("cause"))
    return head + "; last recovery %s for %s: %s in %s s%s (%d kept)" % (
        _ts(rec.get("started")), rec.get("cause"), rec.get("outcome"), rec.get("duration_s"),
        " (%s)" % rec["outcome_detail"] if rec.get("outcome_detail") else "", len(state["recoveries"]))


# ---------------------------------------------------------------------------
# The config (pure)
# ---------------------------------------------------------------------------

CONFIG_KEYS = ("api_url", "api_key_file", "model", "expected_nodes", "ray_nodes_command", "steps", "state_file",
               "lock_file", "operator_stop_file", "generation", "max_tokens", "prompt", "policy")
# expected_nodes and ray_nodes_command go together: backend native runs no Ray, so its watchdog leaves both out and
# judges the completion alone.
_REQUIRED = ("api_url", "model", "steps", "state_file", "lock_file", "operator_stop_file")


def _argv(value: Any, what: str) -> list:
    if not isinstance(value, list) or not value or not all(isinstance(w, str) for w in value) or not value[0]:
        raise PolicyError("%s must be a command as a list of strings (argv, no shell), the first one the program; "
                          "got %r" % (what, value))
    return list(value)


def config_from_dict(values: Any, what: str = "watchdog config") -> dict:
    """The checked config, ``policy`` a ``Policy``; ``PolicyError`` names the key, the value and what is expected."""
    if not isinstance(values, Mapping):
        raise PolicyError("%s must be a JSON object; got %r" % (what, values))
    unknown = sorted(str(k) for k in values if k not in CONFIG_KEYS)
    if unknown:
        raise PolicyError("%s: unknown key%s %s; the keys are %s" % (
            what, "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(CONFIG_KEYS)))
    missing = [k for k in _REQUIRED if values.get(k) in (None, "")]
    if missing:
        raise PolicyError("%s: %s missing; set %s" % (what, ", ".join(missing), "them" if len(missing) > 1 else "it"))
    config = dict(values)
    url = config["api_url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise PolicyError("%s.api_url must be the API's base URL, http://HOST:PORT; got %r" % (what, url))
    config["api_url"] = url.rstrip("/")
    for key in ("state_file", "lock_file", "operator_stop_file", "api_key_file"):
        path = config.get(key)
        if key == "api_key_file" and path in (None, ""):
            config[key] = None
            continue
        if not isinstance(path, str) or not os.path.isabs(path):
            raise PolicyError("%s.%s must be an absolute path; got %r" % (what, key, path))
    if not isinstance(config["model"], str):
        raise PolicyError("%s.model must be the served model's name; got %r" % (what, config["model"]))
    nodes, reader = config.get("expected_nodes"), config.get("ray_nodes_command")
    if reader in (None, "", []) and nodes in (None, []):
        config["expected_nodes"], config["ray_nodes_command"] = [], None
    else:
        if not isinstance(nodes, list) or not nodes:
            raise PolicyError("%s.expected_nodes must be the list of every node's fabric address (with "
                              "ray_nodes_command; leave both out where no Ray runs); got %r" % (what, nodes))
        for index, addr in enumerate(nodes):
            try:
                ipaddress.ip_address(addr)
            except (ValueError, TypeError):
                raise PolicyError("%s.expected_nodes[%d] must be a fabric IP address; got %r" % (
                    what, index, addr)) from None
        config["ray_nodes_command"] = _argv(reader, what + ".ray_nodes_command")
    steps = config["steps"]
    if not isinstance(steps, Mapping) or sorted(steps) != sorted(STEPS):
        raise PolicyError("%s.steps must have exactly the keys %s (each a list of commands, [] for none); got %r" % (
            what, ", ".join(STEPS), sorted(steps) if isinstance(steps, Mapping) else steps))
    checked = {}
    for step in STEPS:
        cmds = steps[step]
        if not isinstance(cmds, list):
            raise PolicyError("%s.steps.%s must be a list of commands (each a list of strings); got %r" % (
                what, step, cmds))
        checked[step] = [_argv(cmd, "%s.steps.%s[%d]" % (what, step, i)) for i, cmd in enumerate(cmds)]
    if not any(checked[s] for s in ("start_head", "start_vllm")):
        raise PolicyError("%s.steps: start_head and start_vllm are both empty, so a recovery could not start the "
                          "group again; give their commands" % what)
    config["steps"] = checked
    tokens = config.get("max_tokens", 4)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 64:
        raise PolicyError("%s.max_tokens must be a whole number from 1 to 64 (a few tokens); got %r" % (what, tokens))
    config["max_tokens"] = tokens
    config["prompt"] = str(config.get("prompt") or "Hello")
    generation = config.get("generation")
    config["generation"] = None if generation in (None, "") else str(generation)
    config["policy"] = policy_from_dict(config.get("policy"), what + ".policy")
    return config


# ---------------------------------------------------------------------------
# The runner (I/O)
# ---------------------------------------------------------------------------

REDACTED = "<redacted>"


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` without any secret value (and no ``Bearer`` value); what a log line or the state file may hold."""
    text = str(text)
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    out, word = [], "Bearer "
    start = 0
    while True:
        found = text.find(word, start)
        if found < 0:
            out.append(text[start:])
            break
        out.append(text[start:found + len(word)] + REDACTED)
        end = found + len(word)
        while end < len(text) and not text[end].isspace() and text[end] not in "'\"\\,;":
            end += 1
        start = end
    return "".join(out)


def redact_tree(value: Any, secrets: Sequence[str] = ()) -> Any:
    """``value`` (JSON-like) with ``redact`` applied to every string in it: redacted before it is serialised, so
    the JSON stays valid."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, Mapping):
        return {k: redact_tree(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(v, secrets) for v in value]
    return value


class Logger:
    """One line per event on stdout: ``<UTC time> <event> key=value ...``, secrets redacted."""

    def __init__(self, secrets: Sequence[str] = (), stream: Any = None) -> None:
        self.secrets = [s for s in secrets if s]
        self.stream = stream

    def __call__(self, event: str, **fields: Any) -> None:
        words = ["%s=%s" % (k, json.dumps(v) if isinstance(v, str) and (" " in v or not v) else v)
                 for k, v in fields.items() if v is not None]
        line = "%s %s%s" % (_ts(time.time()), event, (" " + " ".join(words)) if words else "")
        line = redact(line.replace("\n", " "), self.secrets)
        stream = self.stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()


def read_api_key(path: Optional[str]) -> Optional[str]:
    """The API key from its file (mode 0600 or stricter): a line ``VLLM_API_KEY=...`` (vllm serve's secret file,
    the launcher's format, or sh-quoted) or the file's one line. Raises ``PolicyError`` without the value."""
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError as exc:
        raise PolicyError("api_key_file %s cannot be read: %s" % (path, exc.strerror)) from None
    if info.st_mode & 0o077:
        raise PolicyError("api_key_file %s has mode %04o; the key must be readable by its owner only: chmod 600 %s"
                          % (path, info.st_mode & 0o777, path))
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    key = None
    for line in text.splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name.strip() == "VLLM_API_KEY":
            key = value.strip()
            if len(key) >= 2 and key[0] == key[-1] and key[0] in "'\"":
                key = key[1:-1]
    if key is None:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) != 1:
            raise PolicyError("api_key_file %s must hold the key on one line, or a line VLLM_API_KEY=...; it has %d "
                              "non-empty lines" % (path, len(lines)))
        key = lines[0]
    if not key:
        raise PolicyError("api_key_file %s holds an empty key" % path)
    return key


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def completion_probe(api_url: str, api_key: Optional[str], model: str, timeout: float, max_tokens: int = 4,
                     prompt: str = "Hello") -> dict:
    """One real ``POST /v1/completions`` (no proxy): ``{"result": one of COMPLETION_RESULTS, "status", "detail",
    "seconds", "timeout_s"}``. The answer's text is not kept; no detail holds the key."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = urllib.request.Request(api_url + "/v1/completions", data=body, headers=headers, method="POST")
    started = time.monotonic()

    def result(kind: str, status: Optional[int] = None, detail: str = "") -> dict:
        return {"result": kind, "status": status, "detail": redact(detail, [api_key or ""])[:300],
                "seconds": round(time.monotonic() - started, 2), "timeout_s": timeout}

    try:
        with _NO_PROXY.open(request, timeout=timeout) as answer:
            raw = answer.read(1 << 20)
            status = answer.status
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(300).decode("utf-8", "replace")
        except Exception:
            text = ""
        return result("http_error", exc.code, text.strip())
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, socket.timeout) or "timed out" in str(reason):
            return result("timeout", detail=str(reason))
        if isinstance(reason, ConnectionRefusedError):
            return result("refused", detail=str(reason))
        return result("unreachable", detail="%s: %s" % (type(reason).__name__, reason))
    except socket.timeout as exc:
        return result("timeout", detail=str(exc) or "timed out")
    except ConnectionRefusedError as exc:
        return result("refused", detail=str(exc))
    except (OSError, ValueError) as exc:
        return result("unreachable", detail="%s: %s" % (type(exc).__name__, exc))
    if time.monotonic() - started > timeout:
        return result("timeout", status, "the answer took longer than the timeout")
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict) or "text" not in choices[0]:
            raise ValueError("no choices[0].text")
    except (ValueError, AttributeError) as exc:
        return result("invalid", status, "the answer is not a completion: %s" % exc)
    return result("ok", status)


def read_ray_table(command: Sequence[str], expected: Sequence[str], timeout: float) -> dict:
    """``ray_table`` of what ``command`` prints (``_node_ray_reader``'s JSON object, its last line)."""
    try:
        proc = subprocess.run(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ray_table({"error": "timeout", "detail": "the node table reader did not answer within %s s" % timeout},
                         expected)
    except OSError as exc:
        return ray_table({"error": "run", "detail": "%s: %s" % (command[0], exc.strerror)}, expected)
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        reader = json.loads(lines[-1]) if lines else None
    except ValueError:
        reader = None
    if reader is None:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        return ray_table({"error": "output", "detail": "exit %d, %s" % (
            proc.returncode, tail[-1][:200] if tail else "no output")}, expected)
    return ray_table(reader, expected)


def probe(config: Mapping[str, Any], api_key: Optional[str]) -> dict:
    """The completion and the node table, read at once (one check takes the longer of the two timeouts)."""
    policy = config["policy"]
    box: dict = {}

    def ask() -> None:
        box["completion"] = completion_probe(config["api_url"], api_key, config["model"],
                                             policy.completion_timeout_s, config["max_tokens"], config["prompt"])

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    ray = None
    if config.get("ray_nodes_command"):
        ray = read_ray_table(config["ray_nodes_command"], config["expected_nodes"], policy.ray_timeout_s)
    worker.join(policy.completion_timeout_s + 5)
    completion = box.get("completion") or {"result": "timeout", "status": None, "timeout_s":
                                           policy.completion_timeout_s, "detail": "the request did not end"}
    return {"completion": completion, "ray": ray}


def wait_for_nodes(config: Mapping[str, Any], seconds: float, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> Optional[str]:
    """The recovery's check: read Ray's node table until every expected node is alive on its fabric address, for up
    to ``seconds``. None when it is (or no Ray runs: no ``ray_nodes_command``), else what is wrong (``ray_cause``'s
    detail), so a recovery stops before it restarts vLLM into a group that cannot form."""
    if not config.get("ray_nodes_command"):
        return None
    deadline = clock() + seconds
    while True:
        found = ray_cause(read_ray_table(config["ray_nodes_command"], config["expected_nodes"],
                                         config["policy"].ray_timeout_s))
        if found is None:
            return None
        if clock() >= deadline:
            return "%s: %s (waited %s s)" % (found[0], found[1], seconds)
        sleep(min(1.0, max(0.0, deadline - clock())))


def load_state(path: str) -> dict:
    """The state file, or a new state if it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return _normal(json.load(handle))
    except (OSError, ValueError):
        return new_state()


def write_state(path: str, state: Mapping[str, Any], secrets: Sequence[str] = ()) -> None:
    """Write the state file atomically (a temporary file in its folder, then rename), mode 0644, no secret."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    text = json.dumps(redact_tree(state, secrets), indent=1, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".watchdog-state.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _try_flock(path: str) -> Optional[int]:
    """An fd holding an exclusive fcntl lock on ``path`` (created 0600 if missing), or None if another holds it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd


def _release(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _lock_holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(500).strip()
    except OSError:
        return path
    return "%s: %s" % (path, text) if text else path


def take_deploy_lock(path: str, now: float) -> tuple:
    """(fd, None) with the deploy lock held by this run, or (None, who holds it): a deploy or teardown holding the
    fcntl lock, or a lease ``{"holder": ..., "until": <epoch>}`` written in the file that has not expired."""
    fd = _try_flock(path)
    if fd is None:
        return None, "held: " + _lock_holder(path)
    try:
        with open(path, encoding="utf-8") as handle:
            lease = json.loads(handle.read(2000) or "null")
    except (OSError, ValueError):
        lease = None
    if isinstance(lease, dict) and isinstance(lease.get("until"), (int, float)) and lease["until"] > now:
        _release(fd)
        return None, "lease of %s until %s" % (lease.get("holder", "?"), _ts(lease["until"]))
    return fd, None


def write_lease(path: str, seconds: float, holder: str, wait_s: float = 900.0, now: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> Optional[str]:
    """What a deploy or teardown does to pause the watchdog: take the deploy lock (waiting up to ``wait_s`` for a
    recovery in progress, which holds it), write a lease ``{"holder", "until"}`` for ``seconds`` (0: clear it, the
    run is over) and let go. None when written, else why not (the lock stayed held)."""
    deadline = now() + wait_s
    while True:
        fd = _try_flock(path)
        if fd is not None:
            break
        if now() >= deadline:
            return "the deploy lock %s stayed held for %s s (a recovery in progress?): %s" % (
                path, wait_s, _lock_holder(path))
        sleep(0.5)
    try:
        text = json.dumps({"holder": holder, "until": now() + seconds}) + "\n" if seconds > 0 else ""
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode("utf-8"), 0)
    finally:
        _release(fd)
    return None


def operator_stop(path: str) -> Optional[str]:
    """What the operator's stop marker says (or its path), None if there is none."""
    if not os.path.lexists(path):
        return None
    return _lock_holder(path)


def run_recovery(config: Mapping[str, Any], cause: str, log: Logger, api_key: Optional[str],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> tuple:
    """Stop, check, start the head, the workers, vLLM (each step's commands in order), then wait for a completion
    and a full node table. (outcome, detail); a failed ``stop`` command is logged and the recovery goes on."""
    policy = config["policy"]
    for step in STEPS:
        for argv in config["steps"][step]:
            started = clock()
            try:
                proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=policy.step_timeout_s, check=False)
                rc, out = proc.returncode, proc.stdout.decode("utf-8", "replace").strip().splitlines()
                tail = out[-1][:300] if out else ""
            except subprocess.TimeoutExpired:
                rc, tail = None, "did not end within %s s" % policy.step_timeout_s
            except OSError as exc:
                rc, tail = None, "%s: %s" % (argv[0], exc.strerror)
            seconds = round(clock() - started, 1)
            log("recovery-step", step=step, cause=cause, program=os.path.basename(argv[0]),
                rc=rc if rc is not None else "none", seconds=seconds, output=tail or None)
            if rc != 0 and step != "stop":
                return "failed", "step %s (%s) %s%s" % (
                    step, os.path.basename(argv[0]), "exited %d" % rc if rc is not None else "failed",
                    ": " + redact(tail, [api_key or ""]) if tail else "")
    deadline = clock() + policy.settle_timeout_s
    last = "no check yet"
    while True:
        seen = probe(config, api_key)
        found = health_cause(seen)
        if found is None:
            log("recovery-ready", cause=cause, completion="ok", nodes=len(config["expected_nodes"]))
            return "recovered", ""
        last = "%s: %s" % found
        if clock() >= deadline:
            return "failed", "no completion and full node table within settle_timeout_s %s s after the restart " \
                             "(last: %s)" % (policy.settle_timeout_s, last)
        sleep(min(policy.interval_s, max(0.0, deadline - clock())))


def run_once(config: Mapping[str, Any], log: Optional[Logger] = None, now: Callable[[], float] = time.time,
             rnd: Callable[[], float] = random.random) -> Decision:
    """One check (and a recovery, if decided), with the run lock held; returns the decision. A run that finds
    another one holding the run lock returns a ``wait`` decision without touching the state."""
    api_key = read_api_key(config.get("api_key_file"))
    log = log or Logger([api_key or ""])
    if api_key and api_key not in log.secrets:
        log.secrets.append(api_key)
    run_fd = _try_flock(config["state_file"] + ".lock")
    if run_fd is None:
        log("skipped", reason="another watchdog run holds %s.lock" % config["state_file"])
        return Decision("wait", None, "another watchdog run is in progress", load_state(config["state_file"]))
    deploy_fd = None
    try:
        state = load_state(config["state_file"])
        at = now()
        stop = operator_stop(config["operator_stop_file"])
        deploy_fd, holder = take_deploy_lock(config["lock_file"], at)
        observation: dict = {"generation": config.get("generation"), "deploy_lock": holder, "operator_stop": stop}
        if not holder and not stop:
            observation.update(probe(config, api_key))
        decision = decide(state, observation, at, config["policy"], rnd)
        log("check", action=decision.action, cause=decision.cause, reason=decision.reason,
            failures=decision.state["consecutive_failures"])
        write_state(config["state_file"], decision.state, [api_key or ""])
        if decision.action != "recover":
            return decision
        log("recovery-start", cause=decision.cause, reason=decision.reason)
        outcome, detail = run_recovery(config, decision.cause or "", log, api_key)
        state = finish_recovery(decision.state, outcome, now(), detail, config["policy"])
        rec = state["recoveries"][-1]
        log("recovery-end", cause=decision.cause, outcome=outcome, seconds=rec["duration_s"], detail=detail or None)
        write_state(config["state_file"], state, [api_key or ""])
        return Decision("recover", decision.cause, decision.reason, state)
    finally:
        _release(deploy_fd)
        _release(run_fd)


def load_config(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
    except OSError as exc:
        raise PolicyError("the watchdog config %s cannot be read: %s" % (path, exc.strerror)) from None
    except ValueError as exc:
        raise PolicyError("the watchdog config %s is not JSON: %s" % (path, exc)) from None
    return config_from_dict(values, "watchdog config %s" % path)


def run_loop(config: Mapping[str, Any], log: Optional[Logger] = None,
             stop: Callable[[Decision], bool] = lambda decision: False) -> Decision:
    """Check every ``policy.interval_s`` (from the start of one check to the next; at once after one that overran)
    until ``stop(decision)``; a state or lock file that cannot be written is logged and tried again."""
    log = log or Logger()
    while True:
        started = time.monotonic()
        try:
            decision = run_once(config, log)
        except OSError as exc:
            log("error", reason="%s: %s" % (getattr(exc, "filename", None) or type(exc).__name__, exc.strerror))
            decision = Decision("wait", None, "error: %s" % exc.strerror, new_state())
        if stop(decision):
            return decision
        time.sleep(max(0.0, config["policy"].interval_s - (time.monotonic() - started)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="multinode-watchdog", description="Whole-group recovery watchdog.")
    parser.add_argument("--config", required=True, help="the JSON config file")
    parser.add_argument("--once", action="store_true", help="one check (for a timer), then exit")
    parser.add_argument("--check-ray", type=float, metavar="SECONDS",
                        help="the recovery's check step: wait up to SECONDS for every expected node in Ray's node "
                             "table, exit 1 naming what is missing")
    parser.add_argument("--lease", type=float, metavar="SECONDS",
                        help="pause the watchdog for SECONDS (a deploy's lease in the lock file; 0 clears it), "
                             "waiting for a recovery in progress first")
    parser.add_argument("--holder", default="a deploy", help="who holds the lease (with --lease)")
    parser.add_argument("--probe", action="store_true",
                        help="one probe, printed as JSON (the completion, Ray's node table, the state file), acting "
                             "on nothing (playbooks/status.yml)")
    args = parser.parse_args(argv)
    log = Logger()
    try:
        config = load_config(args.config)
        if args.probe:
            api_key = read_api_key(config.get("api_key_file"))
            seen = probe(config, api_key)
            found = health_cause(seen)
            report = {"healthy": found is None, "cause": found[0] if found else None,
                      "detail": found[1] if found else "", "completion": seen["completion"], "ray": seen["ray"],
                      "state": load_state(config["state_file"]),
                      "status": status_line(load_state(config["state_file"]))}
            sys.stdout.write(json.dumps(redact_tree(report, [api_key or ""])) + "\n")
            return 0
        if args.lease is not None:
            problem = write_lease(config["lock_file"], args.lease, args.holder,
                                  wait_s=config["policy"].step_timeout_s * len(STEPS) + config["policy"].settle_timeout_s)
            log("lease", holder=args.holder, seconds=args.lease, result="ok" if problem is None else "failed",
                detail=problem)
            return 0 if problem is None else 1
        if args.check_ray is not None:
            problem = wait_for_nodes(config, args.check_ray)
            log("check-ray", result="ok" if problem is None else "failed", detail=problem)
            return 0 if problem is None else 1
        if args.once:
            try:
                run_once(config, log)
            except OSError as exc:
                log("error", reason="%s: %s" % (getattr(exc, "filename", None) or type(exc).__name__, exc.strerror))
                return 1
            return 0
        run_loop(config, log)
    except PolicyError as exc:
        log("error", reason=str(exc))
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
