# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model_hf_download action: what it prints while a download runs and after, and what it returns.

The node side is scripted here (``_execute_module`` answers as the module does); the module against the real
huggingface_hub is tested in tests/unit/plugins/modules/test_model_hf_download.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.action import model_hf_download as action_module
from ansible_collections.multinode.vllm.plugins.action.model_hf_download import ActionModule

MIB = 1024 * 1024
ARGS = {"host": "spark1", "repo_id": "org/tiny", "python": "/opt/venv/bin/python",
        "token_file": "/etc/multinode-vllm/hf-token.env", "progress_interval": 0.01}


@pytest.fixture
def said(monkeypatch):
    lines = []
    monkeypatch.setattr(action_module.display, "display", lambda msg, *args, **kwargs: lines.append(msg))
    return lines


def _run(monkeypatch, args, answers, check_mode=False):
    calls = []
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    action = object.__new__(ActionModule)
    action._task = SimpleNamespace(args=args, check_mode=check_mode)

    def execute(module_name=None, module_args=None, task_vars=None, **kwargs):
        calls.append(dict(module_args, _name=module_name))
        return answers[module_args["job"]].pop(0)

    action._execute_module = execute
    return action.run(task_vars={}), calls


def test_a_download_is_watched_from_the_listing_to_the_summary(monkeypatch, said):
    done = {"job_state": "done", "changed": True, "cached": False, "token": True, "snapshot": "/c/s",
            "commit": "0123456789abcdef0123", "bytes": 24 * MIB, "files": 3, "seconds": 2.0}
    result, calls = _run(monkeypatch, dict(ARGS), {
        "start": [{"job_state": "started", "pid": 9, "adopted": False}],
        "status": [{"job_state": "running", "progress": {"t": 1.0, "phase": "asking the Hub for the files of org/tiny"}},
                   {"job_state": "running", "progress": {"t": 2.0, "bytes_done": 0, "bytes_total": 24 * MIB,
                                                         "files_done": 0, "files_total": 3, "phase": "downloading"}},
                   {"job_state": "running", "progress": {"t": 3.0, "bytes_done": 10 * MIB, "bytes_total": 24 * MIB,
                                                         "files_done": 2, "files_total": 3, "phase": "downloading"}},
                   done]})
    assert [c["job"] for c in calls] == ["start", "status", "status", "status", "status"]
    assert all(c["_name"] == "multinode.vllm.model_hf_download" for c in calls)
    assert said == ["spark1: model download asking the Hub for the files of org/tiny",
                    "spark1: model download 0.0/24.0 MiB, 0/3 files, rate -, ETA -",
                    "spark1: model download 10.0/24.0 MiB, 2/3 files, 10.0 MiB/s, ETA -",
                    "spark1: model download done: 24.0 MiB in 3 files, 2 s, mean 12.0 MiB/s; org/tiny at 0123456789ab"]
    assert result == {k: v for k, v in done.items() if k != "job_state"}


def test_an_adopted_download_is_said_and_a_cached_one_is_one_line(monkeypatch, said):
    _run(monkeypatch, dict(ARGS), {"start": [{"job_state": "started", "pid": 9, "adopted": True}],
                                   "status": [{"job_state": "done", "changed": False, "cached": True}]})
    assert said == ["spark1: a model download started before (pid 9) is still running: watching it",
                    "spark1: model download: org/tiny is in the cache already, nothing to download"]


def test_a_failure_is_returned_as_the_module_worded_it(monkeypatch, said):
    failed = {"job_state": "done", "failed": True, "kind": "gated", "msg": "spark1: org/tiny is a gated repo ..."}
    result, _calls = _run(monkeypatch, dict(ARGS), {"start": [{"job_state": "started", "pid": 9}],
                                                    "status": [failed]})
    assert result == {"failed": True, "kind": "gated", "msg": "spark1: org/tiny is a gated repo ..."} and said == []
    result, _calls = _run(monkeypatch, dict(ARGS), {"start": [{"failed": True, "msg": "spark1: the token file ..."}]})
    assert result == {"failed": True, "msg": "spark1: the token file ..."}


@pytest.mark.parametrize("args, check_mode, answer, line", [
    (dict(ARGS), True, {"changed": True, "cached": False, "would_download": {"files": 3, "bytes": 24 * MIB}},
     "spark1: model download (check mode) would fetch 3 files, 24.0 MiB of org/tiny"),
    (dict(ARGS), True, {"changed": False, "cached": True, "snapshot": "/c/s"},
     "spark1: model download: org/tiny is in the cache already, nothing to download"),
    (dict(ARGS, progress_interval=0), False, {"changed": True, "bytes": MIB, "files": 1, "seconds": 1.0},
     "spark1: model download done: 1.0 MiB in 1 file, 1 s, mean 1.0 MiB/s; org/tiny"),
])
def test_check_mode_and_no_progress_run_the_module_once(monkeypatch, said, args, check_mode, answer, line):
    result, calls = _run(monkeypatch, args, {"run": [dict(answer)]}, check_mode=check_mode)
    assert [c["job"] for c in calls] == ["run"] and said == [line]
    assert result == answer
