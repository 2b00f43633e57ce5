# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""memory_facts as Ansible runs it: a real /proc/meminfo file and an nvidia-smi that prints the fixtures' output."""

from __future__ import annotations

import os

import pytest
from ansible.module_utils.common import warnings as ansible_warnings

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import build_manifest
from ansible_collections.multinode.vllm.plugins.modules import memory_facts

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "memory")


@pytest.fixture(autouse=True)
def own_warnings(monkeypatch):
    # AnsibleModule.warn collects into a module-level container that would outlive one run (test_fabric_facts.py).
    monkeypatch.setattr(ansible_warnings, "_global_warnings", type(ansible_warnings._global_warnings)())


def warnings(result):
    # ansible-core 2.19 wraps module warnings as {"event": {"msg": ...}}; older cores send the string.
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


def fake_nvidia_smi(tmp_path, fixture: str = "", rc: int = 0, message: str = "") -> str:
    """An nvidia-smi that prints a fixture for the module's query (and refuses any other)."""
    program = tmp_path / "nvidia-smi"
    body = 'cat "%s"' % os.path.join(FIXTURES, fixture) if fixture else 'echo "%s"' % message
    program.write_text('#!/bin/sh\n[ "$1 $2" = "%s" ] || { echo "unexpected: $*" >&2; exit 9; }\n%s\nexit %d\n'
                       % (" ".join(memory_facts.NVIDIA_SMI_QUERY), body, rc))
    program.chmod(0o755)
    return str(program)


def meminfo(name: str) -> str:
    return os.path.join(FIXTURES, name)


def test_gb10_is_unified(run_main, tmp_path):
    code, result = run_main(memory_facts.main, {"host": "spark1",
                                                "nvidia_smi": fake_nvidia_smi(tmp_path, "gb10-query.csv"),
                                                "meminfo": meminfo("gb10-meminfo.txt")})
    assert code == 0 and result["changed"] is False
    facts = result["ansible_facts"]["multinode_memory"]
    assert facts["unified"] is True and facts["reason"] == "GPU 0 is NVIDIA GB10 (unified memory)"
    assert facts["gpus"] == [{"index": 0, "name": "NVIDIA GB10", "memory_total": None}]
    assert (facts["mem_total"], facts["mem_available"]) == (127600748 * 1024, 118566368 * 1024)
    assert facts["model_bytes"] is None and facts["caches_dropped"] is False


def test_h200_is_not(run_main, tmp_path):
    _code, result = run_main(memory_facts.main, {"host": "gpu1",
                                                 "nvidia_smi": fake_nvidia_smi(tmp_path, "h200-query.csv"),
                                                 "meminfo": meminfo("h200-meminfo.txt")})
    facts = result["ansible_facts"]["multinode_memory"]
    assert (facts["unified"], facts["reason"]) == (False, "discrete GPU memory (NVIDIA H200)")


def test_no_nvidia_smi_is_no_gpu_not_an_error(run_main, tmp_path):
    # The lab: no GPU, no nvidia-smi. Detection says so and fails nothing.
    missing = str(tmp_path / "bin" / "nvidia-smi")
    _code, result = run_main(memory_facts.main, {"host": "spark2", "nvidia_smi": missing,
                                                 "meminfo": meminfo("lab-meminfo.txt")})
    assert "failed" not in result and not warnings(result)
    facts = result["ansible_facts"]["multinode_memory"]
    assert (facts["unified"], facts["reason"], facts["gpus"]) == (False, "no NVIDIA GPU (%s not found)" % missing, [])
    _code, result = run_main(memory_facts.main, {"host": "spark2", "nvidia_smi": "no-such-nvidia-smi-here"})
    assert result["ansible_facts"]["multinode_memory"]["reason"] == "no NVIDIA GPU (no-such-nvidia-smi-here not found)"


def test_failing_nvidia_smi_warns_and_is_not_unified(run_main, tmp_path):
    program = fake_nvidia_smi(tmp_path, rc=9, message="NVIDIA-SMI has failed because it couldn't communicate with "
                              "the NVIDIA driver.")
    _code, result = run_main(memory_facts.main, {"host": "spark1", "nvidia_smi": program,
                                                 "meminfo": meminfo("gb10-meminfo.txt")})
    facts = result["ansible_facts"]["multinode_memory"]
    assert facts["unified"] is False and facts["reason"].startswith("%s failed (rc 9): NVIDIA-SMI has failed" % program)
    assert warnings(result) == ["spark1: %s; unified memory not detected, set multinode_unified_memory if this node "
                                "has it" % facts["reason"]]


def test_unified_set_by_the_user(run_main, tmp_path):
    _code, result = run_main(memory_facts.main, {"host": "spark1", "unified": True,
                                                 "nvidia_smi": str(tmp_path / "none"),
                                                 "meminfo": meminfo("gb10-meminfo.txt")})
    facts = result["ansible_facts"]["multinode_memory"]
    assert (facts["unified"], facts["reason"]) == (True, "set by multinode_unified_memory")


def test_drop_caches_in_check_mode_changes_nothing(run_main, tmp_path, monkeypatch):
    target = tmp_path / "drop_caches"
    monkeypatch.setattr(memory_facts, "DROP_CACHES", str(target))
    args = {"host": "spark1", "drop_caches": True, "nvidia_smi": fake_nvidia_smi(tmp_path, "gb10-query.csv"),
            "meminfo": meminfo("gb10-meminfo.txt")}
    _code, result = run_main(memory_facts.main, dict(args, _ansible_check_mode=True))
    assert result["changed"] is True and result["ansible_facts"]["multinode_memory"]["caches_dropped"] is True
    assert not target.exists()
    # Not unified: nothing to drop.
    _code, result = run_main(memory_facts.main, dict(args, nvidia_smi=fake_nvidia_smi(tmp_path, "h200-query.csv")))
    assert result["changed"] is False and not target.exists()


def test_drop_caches_writes_3(run_main, tmp_path, monkeypatch):
    target = tmp_path / "drop_caches"
    monkeypatch.setattr(memory_facts, "DROP_CACHES", str(target))
    monkeypatch.setattr(memory_facts.os, "sync", lambda: None)
    _code, result = run_main(memory_facts.main, {"host": "spark1", "drop_caches": True, "unified": True,
                                                 "nvidia_smi": str(tmp_path / "none"),
                                                 "meminfo": meminfo("gb10-meminfo.txt")})
    assert result["changed"] is True and target.read_text() == "3\n"


def test_drop_caches_not_writable_names_the_fix(run_main, tmp_path, monkeypatch):
    target = tmp_path / "missing" / "drop_caches"
    monkeypatch.setattr(memory_facts, "DROP_CACHES", str(target))
    monkeypatch.setattr(memory_facts.os, "sync", lambda: None)
    _code, result = run_main(memory_facts.main, {"host": "spark1", "drop_caches": True, "unified": True,
                                                 "nvidia_smi": str(tmp_path / "none"),
                                                 "meminfo": meminfo("gb10-meminfo.txt")})
    assert result["failed"] is True
    assert result["msg"].startswith("spark1: serve_drop_caches is true but %s cannot be written (" % target)
    assert result["msg"].endswith("run the play as root (become: true), or set serve_drop_caches: false")


def test_model_bytes_is_the_manifest_total(run_main, tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "model-00001.safetensors").write_bytes(b"x" * 5000)
    (model / "interrupted.partial").write_bytes(b"y" * 100)
    _code, result = run_main(memory_facts.main, {"host": "spark1", "model_path": str(model),
                                                 "nvidia_smi": str(tmp_path / "none")})
    manifest, _cache, _counts = build_manifest(str(model), {})
    assert result["ansible_facts"]["multinode_memory"]["model_bytes"] == manifest["total_size"] == 5002
    _code, result = run_main(memory_facts.main, {"host": "spark1", "model_path": str(tmp_path / "absent"),
                                                 "nvidia_smi": str(tmp_path / "none")})
    assert result["ansible_facts"]["multinode_memory"]["model_bytes"] is None


def test_unreadable_meminfo_names_host_and_fix(run_main, tmp_path):
    _code, result = run_main(memory_facts.main, {"host": "spark1", "meminfo": str(tmp_path / "meminfo")})
    assert result["failed"] is True and result["msg"].startswith("spark1: cannot read %s (" % (tmp_path / "meminfo"))
    short = tmp_path / "short"
    short.write_text("MemTotal: 1 kB\n")
    _code, result = run_main(memory_facts.main, {"host": "spark1", "meminfo": str(short)})
    assert result["msg"] == ("spark1: %s has no MemAvailable, MemFree: expected a Linux 3.14 or later /proc/meminfo"
                             % short)


def test_running_serve_and_its_setting(run_main, tmp_path, monkeypatch):
    monkeypatch.setattr(memory_facts, "serve_processes", lambda: (4242, [4242]))
    monkeypatch.setattr(memory_facts, "read_process", lambda pid: type("P", (), {"cmdline": (
        "/opt/venv/bin/python", "/opt/venv/bin/vllm", "serve", "/models/m", "--gpu-memory-utilization=0.82")})())
    _code, result = run_main(memory_facts.main, {"host": "spark1", "nvidia_smi": str(tmp_path / "none")})
    facts = result["ansible_facts"]["multinode_memory"]
    assert (facts["serve_running"], facts["serve_gpu_memory_utilization"]) == (True, 0.82)
