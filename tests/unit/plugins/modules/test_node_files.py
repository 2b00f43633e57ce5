# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_files: writes only on difference, honours check mode, reports a diff."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.multinode.vllm.plugins.modules import node_files


@pytest.fixture
def run(run_main):
    return lambda args: run_main(node_files.main, args)


def _args(tmp_path, content="A=1\n", mode="0600", **extra):
    args = {
        "directories": [{"path": str(tmp_path / "etc"), "mode": "0755"}],
        "files": [{"path": str(tmp_path / "etc" / "node.env"), "content": content, "mode": mode}],
    }
    args.update(extra)
    return args


def test_writes_then_is_idempotent(run, tmp_path):
    code, result = run(_args(tmp_path))
    assert code == 0 and result["changed"] and len(result["changed_paths"]) == 2
    path = tmp_path / "etc" / "node.env"
    assert path.read_text() == "A=1\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    code, result = run(_args(tmp_path))
    assert code == 0 and not result["changed"] and result["changed_paths"] == []


@pytest.mark.parametrize("change", [{"content": "A=2\n"}, {"mode": "0644"}])
def test_a_change_is_written(run, tmp_path, change):
    run(_args(tmp_path))
    code, result = run(_args(tmp_path, **change))
    assert code == 0 and result["changed_paths"] == [str(tmp_path / "etc" / "node.env")]


def test_check_mode_writes_nothing_and_diffs(run, tmp_path):
    run(_args(tmp_path))
    code, result = run(dict(_args(tmp_path, content="A=2\n"), _ansible_check_mode=True, _ansible_diff=True))
    assert code == 0 and result["changed"]
    assert result["diff"] == [{"before_header": str(tmp_path / "etc" / "node.env"),
                               "after_header": str(tmp_path / "etc" / "node.env"), "before": "A=1\n", "after": "A=2\n"}]
    assert (tmp_path / "etc" / "node.env").read_text() == "A=1\n"


def test_bad_mode_fails_naming_the_path(run, tmp_path):
    code, result = run(_args(tmp_path, mode="rw"))
    assert code == 1 and "node.env: mode must be octal" in result["msg"]


def test_secret_files_are_written_but_never_shown(run, tmp_path, capsys):
    secret = "s3cr3t-token-" + "x" * 40
    args = _args(tmp_path, secret_files=[{"path": str(tmp_path / "etc" / "token"), "content": secret + "\n",
                                          "mode": "0600"}])
    code, result = run(dict(args, _ansible_diff=True))
    # Ansible masks every value of a no_log option in the output, the path included.
    assert code == 0 and result["changed"] and "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in result["changed_paths"]
    assert (tmp_path / "etc" / "token").read_text() == secret + "\n"
    assert stat.S_IMODE(os.stat(tmp_path / "etc" / "token").st_mode) == 0o600
    # A change in diff mode: the env file's diff is shown, the secret's is not; the value is nowhere in the output.
    args["secret_files"][0]["content"] = secret + "-new\n"
    args["files"][0]["content"] = "A=2\n"
    code, result = run(dict(args, _ansible_diff=True))
    assert code == 0 and [d["after_header"] for d in result["diff"]] == [str(tmp_path / "etc" / "node.env")]
    assert secret not in json.dumps(result)


def test_absent_removes_once_and_check_mode_keeps_it(run, tmp_path):
    run(_args(tmp_path))
    old = tmp_path / "etc" / "ray.conf"
    old.write_text("[program:ray]\n")
    code, result = run(dict(_args(tmp_path, absent=[str(old)]), _ansible_check_mode=True))
    assert code == 0 and result["changed_paths"] == [str(old)] and old.exists()
    code, result = run(_args(tmp_path, absent=[str(old)]))
    assert code == 0 and result["changed_paths"] == [str(old)] and not old.exists()
    code, result = run(_args(tmp_path, absent=[str(old)]))
    assert code == 0 and not result["changed"]
