# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""doctor_collect: one run reads every part on this machine (where Ray and vLLM are absent: a broken node), a part
that fails is recorded while the others run, the module never fails, and the secret files' values never leave."""

from __future__ import annotations

import json
import sys

import pytest

from ansible_collections.multinode.vllm.plugins.modules import doctor_collect
from ansible_collections.multinode.vllm.plugins.modules.doctor_collect import PARTS, Collector, collect

RAY_TOKEN = "raytoken-9f8e7d6c5b4a39281706"
API_KEY = "sk-lab-0123456789abcdef"


@pytest.fixture
def params(tmp_path):
    """This machine as a node with nothing of the cluster on it; nft is never run (a path that does not exist)."""
    return dict(host="spark1", fabric_cidr="198.18.200.0/24", fabric_ip=None, fabric_interface=None,
                interpreter=[sys.executable], env_files=[str(tmp_path / "node.env")],
                logs={"ray": str(tmp_path / "ray.log"), "vllm": str(tmp_path / "vllm.log")}, lines=3,
                ray_address=None, ray_timeout=2.0, auth_token_file=None,
                supervisord_pidfile=str(tmp_path / "supervisord.pid"), bind_allow=[{"port": 22}], api_port=8000,
                api_host="",
                nft_path=str(tmp_path / "no-nft"), model_dir=str(tmp_path / "models" / "m"), images=[],
                nccl_file=str(tmp_path / "distributed.json"), secret_files=[], nvidia_smi=str(tmp_path / "no-smi"),
                timeout=20.0, skip=[])


def test_every_part_is_read_on_a_node_without_the_cluster(params, tmp_path):
    (tmp_path / "node.env").write_text("NCCL_SOCKET_IFNAME==fabric0\nGLOO_SOCKET_IFNAME=fabric0\nHF_TOKEN=hf_x\n")
    (tmp_path / "vllm.log").write_text("".join("line %d\n" % i for i in range(10)))
    (tmp_path / "distributed.json").write_text(json.dumps({"nccl_log": [
        "h:1:1 [0] NCCL INFO NET/Socket : Using [0]fabric0:198.18.200.12<0>", "h:1:1 [0] NCCL INFO unrelated"]}))
    node, errors = collect(params, "spark1")
    assert set(node) >= {"system", "network", "env_file", "ray_node", "stack", "listeners", "firewall", "processes",
                         "memory", "disk", "logs", "nccl", "errors"}
    assert node["env_file"] == {"GLOO_SOCKET_IFNAME": "fabric0", "NCCL_SOCKET_IFNAME": "=fabric0"}
    assert node["stack"]["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert node["logs"]["vllm"] == ["line 7", "line 8", "line 9"]
    assert node["nccl"] == ["h:1:1 [0] NCCL INFO NET/Socket : Using [0]fabric0:198.18.200.12<0>"]
    assert node["firewall"]["ruleset"] is None and "not found" in node["firewall"]["error"]
    assert node["disk"]["measured"] == str(tmp_path) and node["disk"]["free_bytes"] > 0
    assert node["memory"]["mem_available"] > 0 and node["memory"]["unified"] is False
    assert node["ray_node"]["running"] in (True, False)
    # The Ray log does not exist: named as a part that could not be read, never quoted as a log line.
    assert node["logs"]["ray"] == [] and errors["logs.ray"].startswith("cannot read ")
    assert node["errors"] == errors


@pytest.mark.parametrize("broken", ["system", "network", "ray_node", "stack", "firewall", "memory", "logs"])
def test_a_part_that_raises_is_recorded_and_the_others_still_run(params, monkeypatch, broken):
    def boom(self, *args):
        raise OSError("%s exploded" % broken)

    monkeypatch.setattr(Collector, broken, boom)
    node, errors = collect(params, "spark1")
    assert errors[broken] == "OSError: %s exploded" % broken
    expected = {"system", "network", "ray_node", "stack", "firewall", "memory", "disk", "processes"} - {broken}
    assert expected <= set(node), sorted(expected - set(node))


def test_the_head_reads_rays_table_only_where_a_raylet_runs(params, monkeypatch):
    params["ray_address"] = "198.18.200.12:6379"
    monkeypatch.setattr(Collector, "ray_node", lambda self: {"ray_node": {"running": False}})
    node, _errors = collect(params, "spark1")
    assert node["ray_table"] == {"nodes": None, "error": "not read: no raylet runs on this node"}


def test_a_runtime_interpreter_that_does_not_start_is_the_stack_parts_error(params, tmp_path):
    params["interpreter"] = [str(tmp_path / "venv" / "bin" / "python")]
    node, errors = collect(params, "spark1")
    assert "stack" not in node and errors["stack"].endswith("python: not found")


def test_skipped_parts_are_not_read(params):
    params["skip"] = [p for p in PARTS if p != "system"]
    node, errors = collect(params, "spark1")
    assert sorted(node) == ["errors", "system"] and errors == {}


def test_the_secret_files_values_never_leave_the_node(params, tmp_path, monkeypatch):
    token = tmp_path / "ray-auth-token"
    token.write_text(RAY_TOKEN + "\n")
    api_env = tmp_path / "vllm-api.env"
    api_env.write_text("VLLM_API_KEY=%s\nMY_SECRET=horse-battery-staple\n" % API_KEY)
    params["secret_files"] = [str(token), str(api_env), str(tmp_path / "missing")]
    (tmp_path / "vllm.log").write_text("started with %s\nkey %s then horse-battery-staple\n" % (RAY_TOKEN, API_KEY))
    monkeypatch.setattr(Collector, "processes", lambda self: {"processes": [
        {"pid": 1, "name": "x", "cmdline": "x --token-file %s %s" % (token, RAY_TOKEN)}]})
    node, _errors = collect(params, "spark1")
    text = json.dumps(node)
    for secret in (RAY_TOKEN, API_KEY, "horse-battery-staple"):
        assert secret not in text
    assert node["logs"]["vllm"] == ["started with <redacted>", "key <redacted> then <redacted>"]


def test_main_never_fails_the_host(params, run_main, monkeypatch):
    monkeypatch.setattr(Collector, "network", lambda self: 1 / 0)
    params["skip"] = ["processes", "listeners", "stack"]
    code, result = run_main(doctor_collect.main, params)
    assert code == 0 and not result.get("failed") and result["changed"] is False
    assert result["errors"]["network"] == "ZeroDivisionError: division by zero"
    assert result["node"]["system"]["kernel"]
