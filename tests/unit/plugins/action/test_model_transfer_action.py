# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model_transfer action: when it watches a pull, what it prints, what it returns.

The module runs on a node over SSH in a play; here ``_execute_module`` runs the real module's main() in this
process (the pull itself is detached, as on a node), or answers from a script where the test is about the
loop's decisions.
"""

from __future__ import annotations

import os
import re
import socket
import time
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.action import model_transfer as action_module
from ansible_collections.multinode.vllm.plugins.action.model_transfer import ActionModule
from ansible_collections.multinode.vllm.plugins.module_utils import _transfer
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import spawn_sender, stop_sender
from ansible_collections.multinode.vllm.plugins.modules import model_transfer

LO = "127.0.0.1"
TOKEN = "one-time-token-of-the-action-test-0123"
MIB = 1024 * 1024
LINE = re.compile(r"^spark2: model pull \d+\.\d/\d+\.\d MiB, \d/2 files, (rate -|[\d.]+ [KMG]?i?B/s), ETA (-|\d+ s)$")


@pytest.fixture
def said(monkeypatch):
    lines = []
    monkeypatch.setattr(action_module.display, "display", lambda msg, *args, **kwargs: lines.append(msg))
    return lines


def _action(monkeypatch, args, execute, check_mode=False):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    action = object.__new__(ActionModule)
    action._task = SimpleNamespace(args=args, check_mode=check_mode)
    action._execute_module = execute
    return action


def _scripted(answers, calls):
    def execute(module_name=None, module_args=None, task_vars=None, **kwargs):
        calls.append((module_name, dict(module_args)))
        answer = answers[module_args["job"]].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return execute


PULL = {"mode": "pull", "host": "spark2", "path": "/m", "fabric_ip": "198.18.200.13", "server_ip": "198.18.200.12",
        "token": TOKEN, "files": [{"path": "a", "size": 3 * MIB, "sha256": "0" * 64}], "progress_interval": 0.01}


def _running(t, done):
    return {"job_state": "running", "progress": {"t": t, "bytes_done": done, "bytes_total": 3 * MIB, "files_done": 0,
                                                 "files_total": 1}}


def test_a_pull_is_started_watched_and_summarised(monkeypatch, said):
    calls = []
    final = {"job_state": "done", "changed": True, "received": [{"path": "a"}], "bytes": 3 * MIB, "seconds": 2.0,
             "server": "198.18.200.12:29510"}
    answers = {"start": [{"job_state": "started", "pid": 7}],
               "status": [_running(1.0, 0), AnsibleConnectionFailure("ssh: timeout"), _running(2.0, MIB), final]}
    result = _action(monkeypatch, dict(PULL), _scripted(answers, calls)).run(task_vars={})
    assert [c[1]["job"] for c in calls] == ["start", "status", "status", "status", "status"]
    assert all(c[0] == "multinode.vllm.model_transfer" and c[1]["token"] == TOKEN for c in calls)
    assert result == {"changed": True, "received": [{"path": "a"}], "bytes": 3 * MIB, "seconds": 2.0,
                      "server": "198.18.200.12:29510"}
    assert said == ["spark2: model pull 0.0/3.0 MiB, 0/1 files, rate -, ETA -",
                    "spark2: model pull 1.0/3.0 MiB, 0/1 files, 1.0 MiB/s, ETA -",
                    "spark2: model pull done: 3.0 MiB in 1 file, 2 s, mean 1.5 MiB/s; from 198.18.200.12:29510"]


def test_a_failed_pull_is_returned_failed_without_a_summary(monkeypatch, said):
    answers = {"start": [{"job_state": "started", "pid": 7}],
               "status": [{"job_state": "done", "failed": True, "msg": "spark2: no space left for /m/a"}]}
    result = _action(monkeypatch, dict(PULL), _scripted(answers, [])).run(task_vars={})
    assert result == {"failed": True, "msg": "spark2: no space left for /m/a"} and said == []


@pytest.mark.parametrize("args, check_mode, line", [
    (dict(PULL), True, "spark2: model pull (check mode) would receive 1 file, 3.0 MiB"),
    (dict(PULL, progress_interval=0), False, "spark2: model pull done: 3.0 MiB in 1 file, 2 s, mean 1.5 MiB/s"),
    (dict(PULL, mode="serve"), False, None),
    (dict(PULL, job="status"), False, None),
])
def test_one_module_run_without_watching(monkeypatch, said, args, check_mode, line):
    calls = []
    answer = {"changed": True, "received": [{"path": "a"}], "bytes": 3 * MIB, "seconds": 2.0}
    answers = {job: [dict(answer)] for job in ("run", "status")}
    result = _action(monkeypatch, args, _scripted(answers, calls), check_mode=check_mode).run(task_vars={})
    assert [c[1]["job"] for c in calls] == [args.get("job", "run")] and result["changed"] is True
    assert said == ([line] if line else [])


def _free_port():
    with socket.socket() as sock:
        sock.bind((LO, 0))
        return sock.getsockname()[1]


def test_real_progress_lines_of_a_real_pull(monkeypatch, said, run_main, tmp_path):
    """The real module (its main(), as a node runs it), a real detached sender and puller on loopback; the network
    is stood in by a receive that delivers the large file in four steps of 1 MiB, one per released flag."""
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(os.urandom(4 * MIB))
    (head / "config.json").write_bytes(b"{}")
    entries = build_manifest(str(head))[0]["files"]
    port = _free_port()
    spawn_sender(LO, port, str(head), [e["path"] for e in entries], TOKEN, {LO: "spark2"}, 60, str(tmp_path / "hs"))
    original = _transfer.receive_stream

    def stepped(sock, fd, digest, count, **kwargs):
        got = 0
        while got < count:
            step = tmp_path / ("step-%d" % (got // MIB))
            while count > MIB and not step.exists():
                time.sleep(0.005)
            got += original(sock, fd, digest, min(MIB, count - got), **kwargs)
        return got

    monkeypatch.setattr(_transfer, "receive_stream", stepped)

    def execute(module_name=None, module_args=None, task_vars=None, **kwargs):
        assert module_name == "multinode.vllm.model_transfer"
        result = run_main(model_transfer.main, module_args)[1]
        if module_args["job"] == "status" and result.get("job_state") == "running":
            done = result["progress"]["bytes_done"]
            flag = tmp_path / ("step-%d" % (done // MIB))
            if done >= (len(said) - 1) * MIB and not flag.exists():
                flag.touch()  # one more MiB after each line
        return result

    args = {"mode": "pull", "host": "spark2", "path": str(tmp_path / "worker"), "fabric_ip": LO, "server_ip": LO,
            "port": port, "token": TOKEN, "files": entries, "fsync": False, "cache_dir": str(tmp_path / "cache"),
            "state_dir": str(tmp_path / "ws"), "progress_interval": 0.05}
    try:
        result = _action(monkeypatch, args, execute).run(task_vars={"inventory_hostname": "spark2"})
    finally:
        stop_sender(port, None)
    assert result["changed"] is True and "job_state" not in result, result
    assert sorted(r["path"] for r in result["received"]) == ["config.json", "model.safetensors"]
    assert build_manifest(str(tmp_path / "worker"))[0]["files"] == entries
    progress, summary = said[:-1], said[-1]
    assert len(progress) >= 4 and all(LINE.match(line) for line in progress), said
    shown = [float(line.split()[3].split("/")[0]) for line in progress]
    assert shown == sorted(shown) and shown[0] < 4.0 and 1.0 <= max(shown) <= 4.0
    assert summary.startswith("spark2: model pull done: 4.0 MiB in 2 files, ")
    assert summary.endswith("; from %s:%d" % (LO, port))
