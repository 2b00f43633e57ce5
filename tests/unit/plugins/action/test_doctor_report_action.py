# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""doctor_report on the controller: every host's registered result -> the lines, most likely first, and the bundle."""
from __future__ import annotations

import tarfile
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.multinode.vllm.plugins.action.doctor_report import ActionModule

CLUSTER = {"head": "spark1", "fabric_cidr": "198.18.200.0/24", "backend": "ray", "serve": False,
           "firewall_enabled": False, "hosts": {"spark1": {"fabric_ip": "198.18.200.12", "mgmt_ip": "198.19.1.10"},
                                                "spark2": {"fabric_ip": "198.18.200.13", "mgmt_ip": "198.19.1.11"}}}


def _action(monkeypatch, args):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    action = object.__new__(ActionModule)
    action._task = SimpleNamespace(args=args, check_mode=False)
    return action


def test_an_unreachable_host_is_the_first_line_and_the_bundle_is_written(monkeypatch, tmp_path):
    results = {
        "spark1": {"changed": False, "node": {"system": {"kernel": "6.8"}, "logs": {"vllm": ["key sk-lab-0123456789"]},
                                              "errors": {"stack": "OSError: python: not found"}}},
        "spark2": {"unreachable": True, "msg": "Failed to connect to the host via ssh: Connection timed out"},
    }
    result = _action(monkeypatch, {"cluster": CLUSTER, "results": results, "secrets": ["sk-lab-0123456789", ""],
                                   "dir": str(tmp_path), "cluster_name": "spark1"}).run(task_vars={})
    assert result["lines"][0].startswith("spark2: SSH to the node failed (Failed to connect to the host via ssh")
    assert result["errors"] == ["spark1: stack: OSError: python: not found"]
    assert result["path"].startswith(str(tmp_path / "doctor-spark1-")) and result["path"].endswith("Z.tar.gz")
    with tarfile.open(result["path"]) as tar:
        names = tar.getnames()
        vllm = [n for n in names if n.endswith("logs/spark1/vllm.log")]
        assert vllm and tar.extractfile(vllm[0]).read() == b"key <redacted>\n"


@pytest.mark.parametrize("args, message", [
    ({"cluster": [], "results": {}, "dir": "/tmp", "cluster_name": "x"}, "cluster and results must be dicts"),
    ({"cluster": {}, "results": {}, "dir": " ", "cluster_name": "x"}, "set doctor_dir"),
    ({"cluster": {}, "results": {}, "dir": "/tmp", "cluster_name": ""}, "doctor_cluster_name is empty"),
])
def test_bad_input_fails_naming_the_variable(monkeypatch, args, message):
    with pytest.raises(AnsibleActionFail, match=message):
        _action(monkeypatch, args).run(task_vars={})
