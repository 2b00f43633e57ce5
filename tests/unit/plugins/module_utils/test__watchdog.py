# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The watchdog's pure core: policy checks, causes, decide's actions, the budget, backoff, pause, status line."""

from __future__ import annotations

import json
import random

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._watchdog import (
    CAUSES,
    Policy,
    WatchdogError,
    backoff_delay,
    check_config,
    check_policy,
    decide,
    detection_bound_s,
    finish_recovery,
    health_cause,
    new_state,
    ray_table,
    status_line,
    watchdog_config,
)

NODES = ["198.18.200.11", "198.18.200.12"]


def ray_ok(nodes=None):
    return ray_table({"nodes": [{"node_manager_address": a, "alive": True} for a in (nodes or NODES)]}, NODES)


def healthy(**extra):
    obs = {"completion": {"result": "ok", "status": 200}, "ray": ray_ok()}
    obs.update(extra)
    return obs


def hung(**extra):
    obs = {"completion": {"result": "timeout", "timeout_s": 10}, "ray": ray_ok()}
    obs.update(extra)
    return obs


def zero():
    return 0.0


def one():
    return 0.999999


# --- policy -------------------------------------------------------------------------------------------------------


def test_the_default_policy_detects_a_hung_api_within_30_s():
    policy = check_policy({})
    assert policy == Policy()
    assert detection_bound_s(policy) <= 30
    # The bound is the worst case of the loop: the hang starts just after a passing check.
    assert detection_bound_s(policy) == policy.interval_s + (policy.failure_threshold - 1) * max(
        policy.interval_s, policy.completion_timeout_s) + policy.completion_timeout_s


def test_a_hung_api_is_acted_on_by_the_check_the_bound_allows():
    """Simulate the loop: checks every interval_s, each failing check lasting completion_timeout_s."""
    policy = Policy()
    hang_at = 0.001        # just after the check that started at 0 passed
    state, clock, acted = new_state(), 0.0, None
    while acted is None and clock < 120:
        failing = clock >= hang_at
        end = clock + (policy.completion_timeout_s if failing else 0.05)
        decision = decide(state, hung() if failing else healthy(), end, policy, zero)
        state = decision.state
        if decision.action == "recover":
            acted = end
        clock = max(clock + policy.interval_s, end)
    assert acted is not None and acted - hang_at <= detection_bound_s(policy) <= 30


@pytest.mark.parametrize("values, words", [
    ({"interval_s": 0}, ["policy.interval_s", "above 0", "0"]),
    ({"interval_s": -3}, ["policy.interval_s", "-3"]),
    ({"failure_threshold": 1.5}, ["policy.failure_threshold", "whole number", "1.5"]),
    ({"failure_threshold": 0}, ["policy.failure_threshold", "at least 1"]),
    ({"max_recoveries": True}, ["policy.max_recoveries", "True"]),
    ({"window_s": "soon"}, ["policy.window_s", "'soon'"]),
    ({"jitter": 1}, ["policy.jitter", "fraction", "1"]),
    ({"backoff_base_s": 60, "backoff_cap_s": 30}, ["backoff_cap_s (30.0)", "backoff_base_s (60.0)"]),
    ({"interval": 5}, ["unknown key interval", "interval_s"]),
    ([1, 2], ["policy must be a dict"]),
])
def test_a_bad_policy_names_the_key_the_value_and_what_is_expected(values, words):
    with pytest.raises(WatchdogError) as info:
        check_policy(values, "policy")
    assert isinstance(info.value, MultinodeError) and isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_policy_values_from_jinja_strings_are_read():
    policy = check_policy({"interval_s": "2.5", "failure_threshold": "3", "max_recoveries": 0})
    assert (policy.interval_s, policy.failure_threshold, policy.max_recoveries) == (2.5, 3, 0)


# --- causes -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("obs, cause", [
    (healthy(), None),
    (hung(), "completion_hung"),
    ({"completion": {"result": "refused"}, "ray": ray_ok()}, "api_refused"),
    ({"completion": {"result": "http_error", "status": 500}, "ray": ray_ok()}, "api_error"),
    ({"completion": {"result": "invalid"}, "ray": ray_ok()}, "api_error"),
    ({"completion": {"result": "ok"}, "ray": ray_ok(NODES[:1])}, "node_left"),
    # a node that left Ray hangs the completion too: the node is the cause
    ({"completion": {"result": "timeout"}, "ray": ray_ok(NODES[:1])}, "node_left"),
    ({"completion": {"result": "ok"}, "ray": ray_ok([NODES[0], "198.19.1.12"])}, "node_wrong_address"),
    ({"completion": {"result": "ok"}, "ray": ray_table({"error": "connect", "detail": "refused"}, NODES)},
     "ray_unreachable"),
])
def test_each_failure_has_its_own_cause(obs, cause):
    found = health_cause(obs)
    assert (found[0] if found else None) == cause
    assert cause is None or cause in CAUSES


def test_the_cause_detail_names_the_node_and_the_other_failures():
    cause, detail = health_cause({"completion": {"result": "http_error", "status": 503},
                                  "ray": ray_ok(NODES[:1])})
    assert cause == "node_left"
    assert "198.18.200.12 is not alive in Ray's node table" in detail and "HTTP 503" in detail
    cause, detail = health_cause({"completion": {"result": "ok"}, "ray": ray_ok([NODES[0], "198.19.1.12"])})
    assert "198.19.1.12" in detail and "198.18.200.12" in detail


def test_a_dead_ray_node_is_missing():
    table = ray_table({"nodes": [{"node_manager_address": NODES[0], "alive": True},
                                 {"node_manager_address": NODES[1], "alive": False}]}, NODES)
    assert table["missing"] == [NODES[1]] and table["alive"] == [NODES[0]]


# --- decide ---------------------------------------------------------------------------------------------------------


def test_decide_does_not_change_its_input_and_the_state_is_json():
    state = new_state()
    before = json.dumps(state, sort_keys=True)
    decision = decide(state, hung(), 100.0, Policy(), zero)
    assert json.dumps(state, sort_keys=True) == before
    assert json.loads(json.dumps(decision.state)) == decision.state


def test_below_the_threshold_it_waits_then_recovers_with_the_cause():
    policy = Policy(failure_threshold=3)
    state = new_state()
    actions = []
    for at in (0, 10, 20):
        decision = decide(state, hung(), at, policy, zero)
        state = decision.state
        actions.append(decision.action)
    assert actions == ["wait", "wait", "recover"]
    assert decision.cause == "completion_hung"
    assert state["recoveries"][-1]["started"] == 20 and state["recoveries"][-1]["finished"] is None
    first = decide(new_state(), hung(), 0, policy, zero)
    assert first.reason.endswith("failed check 1 of 3 before a recovery")


def test_one_success_starts_the_count_over():
    policy = Policy(failure_threshold=2)
    state = decide(new_state(), hung(), 0, policy, zero).state
    state = decide(state, healthy(), 5, policy, zero).state
    assert state["consecutive_failures"] == 0
    assert decide(state, hung(), 10, policy, zero).action == "wait"


def _recover(state, at, policy, outcome="recovered", obs=None):
    decision = decide(state, obs or hung(), at, policy, zero)
    assert decision.action == "recover", decision
    return finish_recovery(decision.state, outcome, at + 30, "" if outcome == "recovered" else "no completion",
                           policy)


def test_after_a_restart_the_grace_period_holds_back_the_next():
    policy = Policy(failure_threshold=1, grace_s=60)
    state = _recover(new_state(), 0, policy)
    assert state["recoveries"][-1]["duration_s"] == 30.0 and state["recoveries"][-1]["outcome"] == "recovered"
    decision = decide(state, hung(), 50, policy, zero)
    assert decision.action == "wait" and "grace period" in decision.reason


def test_backoff_grows_is_capped_and_its_jitter_is_bounded():
    policy = Policy(backoff_base_s=30, backoff_cap_s=200, jitter=0.25)
    delays = [backoff_delay(policy, n, zero) for n in range(1, 7)]
    assert delays == [30, 60, 120, 200, 200, 200]
    rng = random.Random(7)
    for n in range(1, 10):
        full = min(200, 30 * 2 ** (n - 1))
        for _i in range(50):
            delay = backoff_delay(policy, n, rng.random)
            assert full * 0.75 <= delay <= full <= policy.backoff_cap_s
    assert backoff_delay(policy, 3, one) == pytest.approx(120 * 0.75, rel=1e-5)


def test_the_second_recovery_waits_for_the_backoff():
    policy = Policy(failure_threshold=1, grace_s=0, backoff_base_s=100, backoff_cap_s=1000, jitter=0.5)
    state = _recover(new_state(), 0, policy)           # finished at 30
    decision = decide(state, hung(), 40, policy, one)
    assert decision.action == "wait" and "backing off" in decision.reason
    until = decision.state["backoff_until"]
    assert 30 + 50 <= until <= 30 + 100
    # The jitter is drawn once: a later check keeps the same deadline.
    again = decide(decision.state, hung(), 45, policy, zero)
    assert again.state["backoff_until"] == until and again.action == "wait"
    assert decide(again.state, hung(), until + 0.1, policy, zero).action == "recover"


def test_a_watchdog_that_cannot_recover_gives_up_after_its_budget_and_says_why():
    policy = Policy(failure_threshold=1, grace_s=0, max_recoveries=3, window_s=3600, backoff_base_s=10,
                    backoff_cap_s=40, jitter=0)
    state, at, recoveries = new_state(), 0.0, 0
    for _i in range(200):
        decision = decide(state, hung(), at, policy, zero)
        state = decision.state
        if decision.action == "recover":
            recoveries += 1
            state = finish_recovery(state, "failed", at + 20, "step start_vllm (sh) exited 1", policy)
        at += 5
    assert recoveries == 3
    assert decision.action == "gave_up"
    reason = state["gave_up"]["reason"]
    assert "3 recoveries within 3600 s" in reason and "max_recoveries 3" in reason
    assert "step start_vllm (sh) exited 1" in reason and "until a deploy resets" in reason
    line = status_line(state)
    assert line.startswith("GAVE UP at ") and "max_recoveries 3" in line
    # Gave up stays, even once the window has passed and the group answers again.
    later = decide(state, hung(), at + 7200, policy, zero)
    assert later.action == "gave_up"


def test_a_new_deploy_generation_resets_a_watchdog_that_gave_up():
    policy = Policy(failure_threshold=1, grace_s=30, max_recoveries=0)
    state = decide(dict(new_state(), generation="g1"), hung(generation="g1"), 0, policy, zero).state
    assert state["gave_up"] and "max_recoveries is 0" in state["gave_up"]["reason"]
    decision = decide(state, hung(generation="g2"), 100, policy, zero)
    assert decision.state["gave_up"] is None and decision.state["generation"] == "g2"
    assert decision.action == "wait" and "grace period" in decision.reason


def test_a_flapping_link_does_not_cause_a_restart_storm():
    """Failures coming and going for two hours (a node drops out of Ray for 20 s of every 45 s, each recovery
    'succeeds'): never more recoveries than the budget, and never two closer than the backoff."""
    policy = Policy()
    state, at, started = new_state(), 0.0, []
    rng = random.Random(21)
    while at < 7200:
        down = (at % 45) < 20
        obs = {"completion": {"result": "timeout" if down else "ok", "timeout_s": 10},
               "ray": ray_ok(NODES[:1] if down else NODES)}
        decision = decide(state, obs, at, policy, rng.random)
        state = decision.state
        if decision.action == "recover":
            started.append(at)
            state = finish_recovery(state, "recovered", at + 40, "", policy)
            at += 40
        at += policy.interval_s + (policy.completion_timeout_s if down else 0)
    assert 1 <= len(started) <= policy.max_recoveries
    gaps = [b - a for a, b in zip(started, started[1:])]
    assert all(gap >= 40 + policy.backoff_base_s * (1 - policy.jitter) for gap in gaps), gaps
    assert state["gave_up"] is not None


def test_single_failed_checks_between_successes_never_recover():
    policy = Policy()
    state = new_state()
    for at in range(0, 3600, 5):
        decision = decide(state, hung() if at % 10 == 0 else healthy(), float(at), policy, zero)
        state = decision.state
        assert decision.action in ("ok", "wait")
    assert state["recoveries"] == []


@pytest.mark.parametrize("key, by, words", [
    ("deploy_lock", "deploy", "a deploy or teardown holds the lock"),
    ("operator_stop", "operator", "the operator stopped the service on purpose"),
])
def test_paused_by_the_deploy_lock_and_by_the_operator(key, by, words):
    policy = Policy(failure_threshold=1)
    state = new_state()
    for at in (0, 5, 10):
        decision = decide(state, hung(**{key: "/run/multinode-vllm/x"}), at, policy, zero)
        state = decision.state
        assert decision.action == "paused" and words in decision.reason
    assert state["paused"]["by"] == by and state["paused"]["since"] == 0 and state["recoveries"] == []
    assert status_line(state).startswith("paused since ")
    resumed = decide(state, hung(), 20, policy, zero)
    assert resumed.state["paused"] is None
    assert resumed.action == "wait" and "grace period" in resumed.reason


def test_the_end_of_a_deploy_resets_the_budget_and_the_operator_does_not():
    policy = Policy(failure_threshold=1, max_recoveries=1, grace_s=0)
    gave_up = decide(_recover(new_state(), 0, policy, "failed"), hung(), 100, policy, zero).state
    assert gave_up["gave_up"]
    by_deploy = decide(decide(gave_up, hung(deploy_lock="x"), 200, policy, zero).state, hung(), 300, policy, zero)
    assert by_deploy.state["gave_up"] is None
    by_operator = decide(decide(gave_up, hung(operator_stop="x"), 200, policy, zero).state, hung(), 300, policy, zero)
    assert by_operator.state["gave_up"] is not None


def test_a_recovery_left_unfinished_is_closed_as_interrupted():
    policy = Policy(failure_threshold=1)
    state = decide(new_state(), hung(), 0, policy, zero).state
    state = decide(state, healthy(), 500, policy, zero).state
    assert state["recoveries"][-1]["outcome"] == "interrupted" and state["recoveries"][-1]["duration_s"] == 500


def test_finish_recovery_refuses_a_bad_outcome_and_no_open_recovery():
    with pytest.raises(ValueError, match="outcome must be one of recovered, failed, interrupted"):
        finish_recovery(new_state(), "fine", 0)
    with pytest.raises(ValueError, match="no recovery is in progress"):
        finish_recovery(new_state(), "recovered", 0)


def test_status_line_says_health_and_the_last_recovery():
    policy = Policy(failure_threshold=1, grace_s=0)
    assert status_line(None) == "no check yet; no recovery yet"
    state = decide(new_state(), healthy(), 0, policy, zero).state
    assert status_line(state) == "healthy (checked 1970-01-01T00:00:00Z); no recovery yet"
    state = decide(state, hung(ray=ray_ok(NODES[:1])), 60, policy, zero).state
    assert "recovering since 1970-01-01T00:01:00Z for node_left" in status_line(state)
    state = finish_recovery(state, "recovered", 155.5, "", policy)
    line = status_line(state)
    assert "last recovery 1970-01-01T00:01:00Z for node_left: recovered in 95.5 s" in line
    state = decide(state, hung(), 200, policy, zero).state
    assert status_line(state).startswith("failing since 1970-01-01T00:03:20Z, 1 failed check: completion_hung")


# --- config -------------------------------------------------------------------------------------------------------


def _config(**extra):
    config = {
        "api_url": "http://198.19.1.10:8000/", "api_key_file": "/etc/multinode-vllm/vllm.secret", "model": "tiny",
        "expected_nodes": NODES, "ray_nodes_command": ["/opt/venv/bin/python", "/x/reader", "198.18.200.11:6379", "5"],
        "steps": {"stop": [["systemctl", "stop", "vllm"]], "check": [], "start_head": [["systemctl", "start", "ray"]],
                  "start_workers": [], "start_vllm": [["systemctl", "start", "vllm"]]},
        "state_file": "/var/lib/multinode-vllm/watchdog/state.json", "lock_file": "/run/multinode-vllm/deploy.lock",
        "operator_stop_file": "/var/lib/multinode-vllm/watchdog/operator-stop",
    }
    config.update(extra)
    return config


def test_a_good_config_is_read_with_its_defaults():
    config = check_config(_config(policy={"interval_s": 3}))
    assert config["api_url"] == "http://198.19.1.10:8000" and config["max_tokens"] == 4
    assert config["policy"] == Policy(interval_s=3.0) and config["generation"] is None


@pytest.mark.parametrize("extra, words", [
    ({"api_url": "198.19.1.10:8000"}, ["api_url", "http://HOST:PORT", "'198.19.1.10:8000'"]),
    ({"state_file": "state.json"}, ["state_file must be an absolute path", "'state.json'"]),
    ({"expected_nodes": ["spark2"]}, ["expected_nodes[0] must be a fabric IP address", "'spark2'"]),
    ({"ray_nodes_command": "ray status"}, ["ray_nodes_command must be a command as a list of strings"]),
    ({"steps": {"stop": []}}, ["steps must have exactly the keys stop, check, start_head"]),
    ({"steps": {"stop": [], "check": [], "start_head": [], "start_workers": [], "start_vllm": []}},
     ["start_head and start_vllm are both empty"]),
    ({"steps": {"stop": ["systemctl stop vllm"], "check": [], "start_head": [], "start_workers": [],
                "start_vllm": [["x"]]}}, ["steps.stop[0] must be a command", "'systemctl stop vllm'"]),
    ({"max_tokens": 500}, ["max_tokens must be a whole number from 1 to 64", "500"]),
    ({"policy": {"grace_s": -1}}, ["watchdog config.policy.grace_s", "-1"]),
    ({"api_key": "sekrit"}, ["unknown key api_key"]),
    ({"model": None}, ["model missing"]),
])
def test_a_bad_config_names_the_key_and_the_value(extra, words):
    with pytest.raises(WatchdogError) as info:
        check_config(_config(**extra))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --- the head's config, per runtime and backend -------------------------------------------------------------------------

CTL = ["/opt/venv/bin/supervisorctl", "-c", "/etc/multinode-vllm/supervisord.conf"]


def head_config(runtime="process", backend="ray", **changes):
    values = dict(api_url="http://198.19.1.10:8000/", model="tiny", python="/opt/venv/bin/python",
                  script="/var/lib/multinode-vllm/bin/multinode-watchdog", config_file="/etc/multinode-vllm/watchdog.json",
                  state_file="/var/lib/multinode-vllm/watchdog/state.json",
                  lock_file="/var/lib/multinode-vllm/watchdog/deploy.lock",
                  operator_stop_file="/etc/multinode-vllm/watchdog.stop", api_key_file="/etc/multinode-vllm/vllm-api.env",
                  expected_nodes=NODES, ray_reader="/var/lib/multinode-vllm/bin/multinode-ray-reader",
                  gcs_address="198.18.200.11:6379", supervisorctl=CTL,
                  units={"vllm": "multinode-vllm.service", "ray": "multinode-ray.service"}, generation="abc",
                  policy={"interval_s": 10})
    values.update(changes)
    return watchdog_config(runtime, backend, **values)


def test_the_process_config_restarts_vllm_after_the_check_through_supervisorctl():
    config = head_config()
    assert config["steps"] == {
        "stop": [CTL + ["stop", "vllm"]],
        "check": [["/opt/venv/bin/python", "/var/lib/multinode-vllm/bin/multinode-watchdog", "--config",
                   "/etc/multinode-vllm/watchdog.json", "--check-ray", "120"]],
        "start_head": [CTL + ["start", "ray"]],
        "start_workers": [],
        "start_vllm": [CTL + ["start", "vllm"]],
    }
    assert config["ray_nodes_command"] == ["/opt/venv/bin/python", "/var/lib/multinode-vllm/bin/multinode-ray-reader",
                                           "198.18.200.11:6379", "5"]
    assert config["api_url"] == "http://198.19.1.10:8000" and config["policy"]["interval_s"] == 10.0
    # What the node script reads back is the same config (JSON round trip, the node's own check).
    assert check_config(json.loads(json.dumps(config)))["steps"] == config["steps"]


def test_the_systemd_config_uses_the_units_and_native_has_no_ray():
    config = head_config("systemd", "native")
    assert config["steps"]["stop"] == [["systemctl", "stop", "multinode-vllm.service"]]
    assert config["steps"]["start_vllm"] == [["systemctl", "start", "multinode-vllm.service"]]
    assert config["steps"]["check"] == [] and config["steps"]["start_head"] == []
    assert config["ray_nodes_command"] is None and config["expected_nodes"] == []
    ray = head_config("systemd", "ray")
    assert ray["steps"]["start_head"] == [["systemctl", "start", "multinode-ray.service"]]


@pytest.mark.parametrize("runtime, backend, changes, words", [
    ("docker", "ray", {}, "the watchdog runs under multinode_runtime process or systemd; got 'docker'"),
    ("process", "ray", {"supervisorctl": []}, "needs the supervisorctl command line"),
    ("systemd", "ray", {"units": {"vllm": "multinode-vllm.service"}}, "needs the unit name of ray"),
    ("process", "ray", {"gcs_address": ""}, "backend ray: the watchdog needs the node table reader"),
    ("process", "ray", {"policy": {"interval": 5}}, "unknown key interval"),
    ("process", "ray", {"state_file": "state.json"}, "state_file must be an absolute path; got 'state.json'"),
])
def test_a_config_the_node_would_refuse_is_refused_here_naming_it(runtime, backend, changes, words):
    with pytest.raises(WatchdogError, match=None) as info:
        head_config(runtime, backend, **changes)
    assert words in str(info.value)
