# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The head's whole-group recovery watchdog on the 2-node process lab (docs/watchdog.md), backend ray, TP=2.

deploy.yml with serve_watchdog_enabled installs it as a program of spark1's supervisord, after readiness; a second
deploy changes and restarts nothing (its pause and the pause's end are bookkeeping); playbooks/status.yml reports the
group healthy. Then the fault nothing else recovers: spark2's Ray worker rank stopped with SIGSTOP (it hangs without
dying, so no supervisor and no vLLM timeout acts for minutes). The watchdog must see it within 30 s, restart the
group with no operator action (vllm serve stopped, so Ray ends its ranks, the stopped one too; Ray's node table
checked; vllm serve started), and the API must answer again within 1.5x the deploy's own cold start of vLLM;
status.yml then names the recovery. teardown.yml removes the watchdog first, so it starts nothing again.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import (completion, first_completion_after, labctl, netns_processes, recap, record_timing, require_root,
                      run_playbook, serve_pids, torn_down_lab, wait_for)

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")
STATE = "/var/lib/multinode-vllm/watchdog/state.json"
WATCHDOG_LOG = "/var/log/multinode-vllm/watchdog.log"
# Detection bound: interval 5 s, two failed checks, a 10 s completion timeout (25 s, inside the 30 s).
# A budget of 10 within the hour: the module's faults follow one another on one cluster.
POLICY = {"interval_s": 5, "completion_timeout_s": 10, "failure_threshold": 2, "grace_s": 60, "max_recoveries": 10}
WATCHDOG = ("-e", json.dumps({"serve_watchdog_enabled": True, "serve_watchdog_policy": POLICY}))

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd)"),
    pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                       reason="node venv with vLLM missing; build it with `make lab-venv`"),
]


def watchdog_pids(node: str) -> list[int]:
    return [pid for pid, _name, text in netns_processes(node) if "multinode-watchdog --config" in text]


def state() -> dict:
    return json.loads(labctl("exec", "spark1", "--", "cat", STATE))


@pytest.fixture(scope="module")
def served():
    """The 2-node process lab deployed with the watchdog; the deploy's cold start of vLLM (readiness's seconds)."""
    require_root()
    lab = torn_down_lab()
    next(lab)
    try:
        run = run_playbook("playbooks/deploy.yml", *WATCHDOG)
        assert run.rc == 0, run.why
        ready = re.search(r"spark1: ready after ([0-9.]+) s", run.output)
        assert ready, run.output[-3000:]
        yield {"cold_start_s": float(ready.group(1))}
    finally:
        next(lab, None)


def test_deploy_runs_the_watchdog_under_the_heads_supervisord_and_a_second_deploy_changes_nothing(served):
    assert len(watchdog_pids("spark1")) == 1 and watchdog_pids("spark2") == []
    assert wait_for(lambda: (state().get("last_check") or {}).get("ok") is True, 30), state()
    before = (watchdog_pids("spark1"), serve_pids("spark1"))
    again = run_playbook("playbooks/deploy.yml", *WATCHDOG)
    assert again.rc == 0, again.why
    assert {host: counts["changed"] for host, counts in recap(again.output).items()} == {
        "localhost": 0, "spark1": 0, "spark2": 0}, again.output[-3000:]
    assert (watchdog_pids("spark1"), serve_pids("spark1")) == before
    # The deploy paused it and ended the pause: no lease left behind.
    assert labctl("exec", "spark1", "--", "cat", "/var/lib/multinode-vllm/watchdog/deploy.lock").strip() == ""
    status = run_playbook("playbooks/status.yml")
    assert status.rc == 0, status.why
    assert "serving: healthy (a completion in" in status.output, status.output[-3000:]
    assert "Ray: every node of 198.18.200.12, 198.18.200.13 alive on its fabric address" in status.output


def recoveries() -> list[dict]:
    return state().get("recoveries") or []


def pids_named(node: str, prefix: str) -> list[int]:
    return [pid for pid, name, _text in netns_processes(node) if name.startswith(prefix)]


# The three kills measured before the watchdog (issue 21): vLLM fails fast, the node's supervisor restarts what died,
# Ray places the rank again. Kept as regression tests with the watchdog on: each ends in a completion with no operator
# action, and the watchdog restarts the group at most once for it (no storm).
KILLS = [("spark1", "VLLM::EngineCor"), ("spark2", "ray::RayWorker"), ("spark2", "raylet")]


@pytest.mark.parametrize("node, prefix", KILLS, ids=["engine-core", "worker-rank", "worker-raylet"])
def test_a_killed_process_comes_back_to_a_completion(served, node, prefix):
    victims = pids_named(node, prefix)
    assert victims, netns_processes(node)
    completion()
    before = len(recoveries())
    killed = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    back = first_completion_after(killed, 600)
    record_timing("watchdog_kill_%s_to_completion" % prefix.strip(":").lower(), back)
    # Whatever restarted it, it stays up: a minute later it still answers, and the watchdog acted at most once.
    time.sleep(30)
    completion()
    assert len(recoveries()) - before <= 1, recoveries()[before:]


def test_a_hung_rank_is_detected_and_the_group_restarted_with_no_operator_action(served):
    ranks = pids_named("spark2", "ray::RayWorker")
    assert len(ranks) == 1, netns_processes("spark2")
    completion()
    before = len(recoveries())
    hung = time.monotonic()
    os.kill(ranks[0], signal.SIGSTOP)
    try:
        assert wait_for(lambda: len(recoveries()) > before, 60, every=1), state()
        detected = time.monotonic() - hung
        back = first_completion_after(hung, 600)
    finally:
        # Ray ends a stopped rank with SIGKILL once its driver is gone; one still here is let go.
        if os.path.exists("/proc/%d" % ranks[0]):
            os.kill(ranks[0], signal.SIGCONT)
    record_timing("watchdog_hung_rank_detected", detected)
    record_timing("watchdog_hung_rank_to_completion", back)
    record_timing("watchdog_cold_start", served["cold_start_s"])
    rec = recoveries()[before]
    assert rec["cause"] == "completion_hung", rec
    assert detected <= 30, "the hung rank was acted on after %.1f s (bound 30 s)" % detected
    assert wait_for(lambda: recoveries()[before].get("outcome") == "recovered", 120), state()
    assert back <= 1.5 * served["cold_start_s"] + detected, (back, served["cold_start_s"], detected)
    assert not os.path.exists("/proc/%d" % ranks[0]), "the stopped rank outlived the recovery"
    log = labctl("exec", "spark1", "--", "cat", WATCHDOG_LOG)
    steps = re.findall(r" recovery-step step=(\w+) cause=completion_hung program=(\S+) rc=0", log)
    assert [s for s, _program in steps][-4:] == ["stop", "check", "start_head", "start_vllm"], log[-3000:]
    status = run_playbook("playbooks/status.yml")
    assert "last recovery" in status.output and "for completion_hung: recovered in" in status.output, \
        status.output[-3000:]


def test_a_fabric_link_down_for_20_s_causes_no_restart_storm(served):
    completion()
    before = len(recoveries())
    down = time.monotonic()
    labctl("fault", "link-down", "spark2")
    try:
        time.sleep(20)
    finally:
        labctl("fault", "clear")
    back = first_completion_after(down, 600)
    record_timing("watchdog_link_down_20s_to_completion", back)
    time.sleep(30)
    completion()
    made = recoveries()[before:]
    assert len(made) <= 2, made
    assert all(r.get("outcome") in ("recovered", None) for r in made[-1:]), made


def test_teardown_removes_the_watchdog_first(served):
    result = run_playbook("playbooks/teardown.yml")
    assert result.rc == 0, result.why
    assert watchdog_pids("spark1") == [] and serve_pids("spark1") == []
    assert "No such file" in labctl("exec", "spark1", "--", "ls", "/etc/multinode-vllm/watchdog.json", check=False)
