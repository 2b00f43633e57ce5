# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Serving over the lab, beyond the molecule scenarios (which prove deploy, idempotence and a completion for each
backend): a serve that crashes at start fails the deploy at once with every node's logs, and switching backends
leaves nothing of the other one running."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import ray_pids, recap, run_playbook, serve_pids, torn_down_lab

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd)"),
    pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                       reason="node venv with vLLM missing; build it with `make lab-venv`"),
]


@pytest.fixture(scope="module")
def lab():
    yield from torn_down_lab()


def test_a_serve_that_crashes_at_start_fails_the_deploy_at_once_with_every_nodes_logs(lab):
    # A max_model_len beyond the tiny model's 2048 positions: vLLM refuses it after its imports, before loading.
    run = run_playbook("playbooks/deploy.yml", "-e", '{"vllm_max_model_len": 1000000}')
    assert run.rc != 0
    out = run.output
    # Seen as a crash at a node read (the fatal log line, or the process gone), not by waiting out the timeout.
    assert ("vllm serve on spark1 failed while starting" in out or "the serve process on spark1 exited" in out), out[-4000:]
    assert "was not ready after" not in out
    assert "most likely cause: vLLM rejected a setting while building its configuration" in out
    for name in ("spark1:/var/log/multinode-vllm/vllm.log", "spark1:/var/log/multinode-vllm/ray.log",
                 "spark2:/var/log/multinode-vllm/ray.log"):
        assert "--- %s (last" % name in out, name
    assert "max_model_len" in out
    # Nothing was restarted in a loop afterwards by the failure report itself; Ray stays up for the next try.
    assert ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")


def _completion_ok(run) -> None:
    assert run.rc == 0, run.output[-4000:]
    assert "completion:" in run.output and "tokens/s" in run.output


def test_switching_backends_leaves_nothing_of_the_other_running(lab):
    ray = run_playbook("playbooks/deploy.yml")
    _completion_ok(ray)
    assert ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")
    assert serve_pids("spark1") and not serve_pids("spark2")

    native = run_playbook("playbooks/deploy.yml", "-e", "vllm_backend=native")
    _completion_ok(native)
    # Backend native runs no Ray: the Ray programs the ray deploy left are gone from both nodes.
    deadline = time.monotonic() + 30
    while (ray_pids("spark1") or ray_pids("spark2")) and time.monotonic() < deadline:
        time.sleep(1)
    assert ray_pids("spark1") == {} and ray_pids("spark2") == {}
    assert serve_pids("spark1") and serve_pids("spark2")
    assert "Backend native, stop the Ray program" in native.output

    back = run_playbook("playbooks/deploy.yml")
    _completion_ok(back)
    # Backend ray serves from the head only: spark2's native rank was stopped.
    assert serve_pids("spark2") == []
    assert serve_pids("spark1") and ray_pids("spark2").get("raylet")
    assert recap(back.output)["spark2"]["failed"] == 0
