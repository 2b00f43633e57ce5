# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The readiness loop of the vllm_ready action against a real HTTP server on loopback.

The node side (a module run over SSH in a play) is replaced by a recorder: what is under test is how often the
controller asks the API and the node, and what it concludes.
"""
from __future__ import annotations

import http.server
import json
import threading
import time
from types import SimpleNamespace

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.action.vllm_ready import ActionModule


class FakeVllm(http.server.BaseHTTPRequestHandler):
    ready_at = 0.0
    requests: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        FakeVllm.requests.append(self.path)
        if time.monotonic() < FakeVllm.ready_at:
            self._send(503, {"error": "loading"})
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(200, {"data": [{"id": "tiny"}]})

    def do_POST(self):
        FakeVllm.requests.append(self.path)
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(200, {"choices": [{"text": " world"}], "usage": {"completion_tokens": 2}})


@pytest.fixture
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeVllm.requests = []
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()


def _action(monkeypatch, args, node_reads):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    action = object.__new__(ActionModule)
    action._task = SimpleNamespace(args=args, check_mode=False)

    def node(task_vars, _args):
        node_reads.append(time.monotonic())
        return {"pid": 4242, "tails": {"/var/log/multinode-vllm/vllm.log": ["INFO loading weights"]},
                "latest": "INFO loading weights"}

    action._node = node
    return action


def test_the_api_is_asked_every_api_interval_and_the_node_every_interval(api, monkeypatch):
    FakeVllm.ready_at = time.monotonic() + 0.5
    reads: list[float] = []
    action = _action(monkeypatch, {"url": api, "served_model_name": "tiny", "interval": 30, "api_interval": 0.1,
                                   "burst_requests": 0, "timeout": 20}, reads)
    result = action.run(task_vars={"inventory_hostname": "spark1"})
    assert result.get("failed") is not True, result
    assert result["stage"] == "ready" and result["text"] == " world"
    # Ready well inside one node interval: the API was asked several times, the node once.
    assert FakeVllm.requests.count("/health") >= 3
    assert len(reads) == 1
    assert FakeVllm.requests[-1] == "/v1/completions"


def test_the_node_is_still_read_every_interval_while_waiting(api, monkeypatch):
    FakeVllm.ready_at = time.monotonic() + 1.0
    reads: list[float] = []
    action = _action(monkeypatch, {"url": api, "served_model_name": "tiny", "interval": 0.3, "api_interval": 0.1,
                                   "burst_requests": 0, "timeout": 20}, reads)
    assert action.run(task_vars={"inventory_hostname": "spark1"})["stage"] == "ready"
    assert len(reads) >= 2
    assert all(b - a >= 0.29 for a, b in zip(reads, reads[1:]))


def test_a_serve_process_that_exits_fails_at_the_next_node_read(api, monkeypatch):
    FakeVllm.ready_at = time.monotonic() + 60
    reads: list[float] = []
    action = _action(monkeypatch, {"url": api, "served_model_name": "tiny", "interval": 0.2, "api_interval": 0.05,
                                   "burst_requests": 0, "timeout": 20}, reads)
    pids = iter([4242, None])
    base = action._node
    asked = []

    def node(tv, a):
        asked.append(bool(a.get("first_errors")))
        out = dict(base(tv, a), pid=next(pids, None))
        if a.get("first_errors"):
            out["first_errors"] = {"/var/log/multinode-vllm/vllm.log": {"who": "Worker_TP1 pid=7",
                                                                        "line": "KeyError: 'rope_theta'"}}
        return out

    action._node = node
    result = action.run(task_vars={"inventory_hostname": "spark1"})
    assert result["failed"] is True
    assert result["reason"] == "the serve process on spark1 exited (pid 4242)"
    # Two reads while waiting; on the failure one more, for each log's first exception, named in the cause.
    assert len(reads) == 3 and asked == [False, False, True]
    assert "its first error: KeyError: 'rope_theta' (in Worker_TP1 pid=7)" in result["msg"]
