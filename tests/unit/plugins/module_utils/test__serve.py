# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm serve command lines and sizing checks (_serve.py)."""

from __future__ import annotations

import dataclasses

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._runtime import render
from ansible_collections.multinode.vllm.plugins.module_utils._serve import (
    ServeError,
    ServeSettings,
    check_parallel,
    checked_env,
    serve_args,
    serve_env_file,
)

MODEL = "/var/lib/multinode-vllm-lab/cache/models/tiny-qwen2"
BASE = ServeSettings(model=MODEL, served_model_name="tiny", tensor_parallel_size=2, api_host="198.19.1.10",
                     max_model_len=512, dtype="bfloat16")
HEAD = "198.18.200.12"


# --- command lines -------------------------------------------------------------


@pytest.mark.parametrize(
    "backend, rank, expected",
    [
        ("ray", 0, ["serve", MODEL, "--served-model-name", "tiny", "--tensor-parallel-size", "2",
                    "--pipeline-parallel-size", "1", "--distributed-executor-backend", "ray",
                    "--host", "198.19.1.10", "--port", "8000", "--max-model-len", "512", "--dtype", "bfloat16"]),
        ("native", 0, ["serve", MODEL, "--served-model-name", "tiny", "--tensor-parallel-size", "2",
                       "--pipeline-parallel-size", "1", "--nnodes", "2", "--node-rank", "0",
                       "--master-addr", HEAD, "--master-port", "29500",
                       "--host", "198.19.1.10", "--port", "8000", "--max-model-len", "512", "--dtype", "bfloat16"]),
        ("native", 1, ["serve", MODEL, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                       "--nnodes", "2", "--node-rank", "1", "--master-addr", HEAD, "--master-port", "29500",
                       "--headless", "--max-model-len", "512", "--dtype", "bfloat16"]),
    ],
)
def test_serve_args(backend, rank, expected):
    assert serve_args(backend, BASE, nnodes=2, node_rank=rank, head_fabric_ip=HEAD) == expected


@pytest.mark.parametrize(
    "changes, tail",
    [
        ({"gpu_memory_utilization": 0.5}, ["--gpu-memory-utilization", "0.5"]),
        ({"extra_args": ["--enforce-eager", "--seed=3"]}, ["--enforce-eager", "--seed=3"]),
        ({"max_model_len": None, "dtype": ""}, ["--port", "8000"]),
    ],
)
def test_serve_args_optional_settings(changes, tail):
    settings = ServeSettings(**dict(BASE.__dict__, **changes))
    assert serve_args("ray", settings)[-len(tail):] == tail


@pytest.mark.parametrize(
    "backend, changes, kwargs, message",
    [
        ("ray", {"model": ""}, {}, "no model given"),
        ("ray", {"extra_args": ["--tensor-parallel-size", "4"]}, {}, "vllm_extra_args sets --tensor-parallel-size"),
        ("ray", {"extra_args": ["--host=0.0.0.0"]}, {}, "vllm_extra_args sets --host"),
        ("ray", {"api_host": ""}, {}, "no API address"),
        ("ray", {"api_port": 70000}, {}, "between 1 and 65535"),
        ("ray", {"gpu_memory_utilization": 1.5}, {}, "gpu_memory_utilization must be in"),
        ("native", {}, {"nnodes": 2, "node_rank": 2, "head_fabric_ip": HEAD}, "node rank 2 is outside 0..1"),
        ("native", {}, {"nnodes": 2, "node_rank": 1}, "needs the head's fabric address"),
        ("grpc", {}, {}, "vllm_backend 'grpc' is not one of ray, native"),
        ("ray", {"tensor_parallel_size": 0}, {}, "tensor_parallel_size must be at least 1"),
    ],
)
def test_serve_args_errors(backend, changes, kwargs, message):
    settings = ServeSettings(**dict(BASE.__dict__, **changes))
    with pytest.raises(ServeError, match=message):
        serve_args(backend, settings, **kwargs)


# --- sizing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "backend, tp, pp, gpus, world",
    [
        ("ray", 2, 1, {"spark1": 1, "spark2": 1}, 2),
        ("ray", 1, 1, {"spark1": 1, "spark2": 1}, 1),
        ("ray", 4, 2, {"a": 4, "b": 4}, 8),
        ("native", 2, 1, {"spark1": 1, "spark2": 1}, 2),
        ("native", 4, 1, {"a": 2, "b": 2}, 4),
    ],
)
def test_check_parallel_fits(backend, tp, pp, gpus, world):
    assert check_parallel(backend, tp, pp, len(gpus), gpus) == world


@pytest.mark.parametrize(
    "backend, tp, pp, gpus, message",
    [
        ("ray", 4, 1, {"spark1": 1, "spark2": 1},
         r"tensor_parallel_size \* pipeline_parallel_size = 4 \* 1 = 4, but the 2 nodes have 2 GPUs \(spark1=1, spark2=1\)"),
        ("ray", 2, 2, {"spark1": 1, "spark2": 1}, "= 2 \\* 2 = 4"),
        ("native", 3, 1, {"a": 2, "b": 2}, "multiple of the number of nodes \\(2\\)"),
        ("native", 1, 1, {"a": 1, "b": 1}, "multiple of the number of nodes"),
        ("native", 4, 1, {"a": 3, "b": 1}, "places 2 ranks on each of the 2 nodes, but these have fewer GPUs: b=1"),
        ("ray", "x", 1, {"a": 1}, "tensor_parallel_size must be a positive integer; got 'x'"),
    ],
)
def test_check_parallel_errors(backend, tp, pp, gpus, message):
    with pytest.raises(ServeError, match=message):
        check_parallel(backend, tp, pp, len(gpus), gpus)


def test_checked_env_sorted_and_checked():
    assert list(checked_env({"B": 1, "A": "x y", "C": None}).items()) == [("A", "x y"), ("B", "1")]
    with pytest.raises(ServeError, match="not a valid environment variable name"):
        checked_env({"1A": "x"})


def test_the_serve_env_file_keeps_values_systemd_would_read_differently():
    # Only the launcher reads it (docker --env-file rules), so vllm_env keeps what /usr/bin/env words kept.
    text = serve_env_file("/c", extra={"Q": '"quoted"', "B": "a\\b", "S": " lead"})
    assert text == 'B=a\\b\nQ="quoted"\nS= lead\nVLLM_CACHE_ROOT=/c\n'


def test_serve_runs_through_the_launcher_with_its_env_files_under_every_runtime():
    env = {"VLLM_HOST_IP": HEAD}
    args = serve_args("ray", BASE)
    files = ["/etc/multinode-vllm/vllm.env", "/etc/multinode-vllm/vllm-api.env"]
    launcher = "/var/lib/multinode-vllm/bin/multinode-env-exec"
    tail = ["/etc/multinode-vllm/node.env", "--env-file", files[0], "--env-file", files[1]]
    proc = render("process", "vllm", env, "/v/bin/vllm", args, "/etc/multinode-vllm/node.env", python="/v/bin/python",
                  launcher=launcher, env_files=files)
    assert proc["command"] == ["/v/bin/python", launcher, *tail, "/v/bin/vllm", *args]
    unit = render("systemd", "vllm", env, "/v/bin/vllm", args, "/etc/multinode-vllm/node.env", python="/v/bin/python",
                  launcher=launcher, env_files=files)["systemd_unit"]
    assert "ExecStart=/v/bin/python %s %s /v/bin/vllm serve" % (launcher, " ".join(tail)) in unit
    docker = render("docker", "vllm", env, "vllm", args, "/etc/multinode-vllm/node.env", image="img", python="python3",
                    launcher=launcher, env_files=files)["docker"]
    assert docker["command"] == ["python3", launcher, *tail, "vllm", *args]
    # The env files' and the launcher's directories read only; the node's shared container /tmp the only writable one.
    assert {m["source"] for m in docker["mounts"] if m["read_only"]} == {"/etc/multinode-vllm",
                                                                         "/var/lib/multinode-vllm/bin"}
    assert [m["target"] for m in docker["mounts"] if not m["read_only"]] == ["/tmp"]
    # Another env file (a secret added) restarts it.
    fewer = render("process", "vllm", env, "/v/bin/vllm", args, "/etc/multinode-vllm/node.env",
                   python="/v/bin/python", launcher=launcher, env_files=files[:1])
    assert fewer["hash"] != proc["hash"]


def test_serve_renders_into_the_same_runtime_and_hash_changes_only_with_settings():
    env = {"VLLM_HOST_IP": HEAD}
    args = serve_args("ray", BASE)

    def proc(a):
        return render("process", "vllm", env, "/usr/bin/env", a, "/etc/multinode-vllm/node.env",
                      python="/v/bin/python", launcher="/var/lib/multinode-vllm/bin/multinode-env-exec")

    first, again = proc(args), proc(list(args))
    assert first["hash"] == again["hash"]
    assert "[program:vllm]" in first["supervisor_program"]
    assert "multinode-env-exec /etc/multinode-vllm/node.env /usr/bin/env" in first["supervisor_program"]
    changed = proc(serve_args("ray", dataclasses.replace(BASE, model="/models/other")))
    assert changed["hash"] != first["hash"]
    unit = render("systemd", "vllm", env, "/usr/bin/env", args, "/etc/multinode-vllm/node.env")["systemd_unit"]
    assert "EnvironmentFile=/etc/multinode-vllm/node.env" in unit
    assert "--distributed-executor-backend ray" in unit
    docker = render("docker", "vllm", env, "vllm", args, "/etc/multinode-vllm/node.env", image="img")["docker"]
    assert docker["command"][:2] == ["vllm", "serve"] and docker["network_mode"] == "host"
