# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm serve command lines, sizing checks, readiness parsing and failure causes (_serve.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._runtime import render
from ansible_collections.multinode.vllm.plugins.module_utils._serve import (
    CAUSES,
    ServeError,
    ServeSettings,
    check_parallel,
    completion_result,
    env_prefix,
    fatal_line,
    failure_message,
    first_exception,
    health_ok,
    likely_cause,
    meaningful_line,
    models_list,
    rendezvous_check,
    serve_args,
    tokens_per_second,
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


def test_env_prefix_sorted_and_checked():
    assert env_prefix({"B": 1, "A": "x y", "C": None}) == ["A=x y", "B=1"]
    with pytest.raises(ServeError, match="not a valid environment variable name"):
        env_prefix({"1A": "x"})


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


# --- readiness parsing ------------------------------------------------------------


@pytest.mark.parametrize("status, ok", [(200, True), (503, False), (None, False), (404, False)])
def test_health(status, ok):
    assert health_ok(status) is ok


@pytest.mark.parametrize(
    "body, ids",
    [
        ('{"object":"list","data":[{"id":"tiny","object":"model"}]}', ["tiny"]),
        ({"data": [{"id": "a"}, {"id": "b"}]}, ["a", "b"]),
        ('{"data": []}', []),
        ("not json", []),
        ('{"error": "x"}', []),
        (b'{"data":[{"id":"tiny"}]}', ["tiny"]),
    ],
)
def test_models_list(body, ids):
    assert models_list(body) == ids


COMPLETION = json.dumps({
    "choices": [{"index": 0, "text": " world world", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
})


def test_completion_result():
    assert completion_result(COMPLETION) == {"text": " world world", "finish_reason": "length",
                                             "completion_tokens": 16, "prompt_tokens": 3}


@pytest.mark.parametrize(
    "body, message",
    [
        ("<html>", "not JSON"),
        ('{"error": {"message": "model not found"}}', "the completion failed: .*model not found"),
        ('{"choices": []}', "no choices\\[0\\].text"),
    ],
)
def test_completion_result_errors(body, message):
    with pytest.raises(ServeError, match=message):
        completion_result(body)


@pytest.mark.parametrize("tokens, seconds, tps", [(192, 6.88, 27.91), (0, 1.0, 0.0), (10, 0, 0.0)])
def test_tokens_per_second(tokens, seconds, tps):
    assert tokens_per_second(tokens, seconds) == tps


# --- log lines and causes -----------------------------------------------------------


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["INFO loading model", "", "   "], "INFO loading model"),
        (["INFO a", "WARNING Triton is installed, but doesn't include CPU backend. Disabling Triton."], "INFO a"),
        (["INFO a", "\x1b[36m(RayWorkerProc pid=14160)\x1b[0m "], "INFO a"),
        (["INFO a", "(pid=14226, ip=198.18.200.13) "], "INFO a"),
        (["INFO b", "Loading safetensors:  50%|#####     | 1/2 [00:01<00:01,  1.00it/s]"], "INFO b"),
        (["\x1b[36m(EngineCore pid=1)\x1b[0m INFO ready"], "(EngineCore pid=1) INFO ready"),
        ([], ""),
    ],
)
def test_meaningful_line(lines, expected):
    assert meaningful_line(lines) == expected


@pytest.mark.parametrize(
    "line, key",
    [
        ("torch.distributed.DistNetworkError: The client socket has failed to connect to any network address of "
         "(198.19.1.10, 29500)", "rendezvous_unreachable"),
        ("RuntimeError: Every node should have a unique IP address. Got 2 nodes with node ids [...] and 1 unique IP "
         "addresses {'198.19.1.10'}", "duplicate_ip"),
        ("INFO ray_utils.py:200 Waiting for creating a placement group of specs for 30 seconds. specs=[{'GPU': 1.0}]",
         "placement_group"),
        ("RuntimeError: current platform cpu does not support ray.", "platform_no_ray"),
        ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig", "engine_setting"),
        ("OSError: [Errno 98] Address already in use", "address_in_use"),
        ("RuntimeError: [enforce fail at device.cc:84] ifa != nullptr. Unable to find address for: ^lo",
         "gloo_interface"),
        ("ConnectionError: Could not find any running Ray instance. Please specify the one to connect to",
         "gcs_unreachable"),
        ("WARNING Failed to get the IP address, using 0.0.0.0 by default", "no_ip"),
        ("OSError: /models/x does not appear to have a file named config.json", "model_missing"),
        ("torch.OutOfMemoryError: out of memory", "memory"),
        ("RuntimeError: Engine core initialization failed. See root cause above.", "engine_failed"),
    ],
)
def test_likely_cause_maps_failure_table_signatures(line, key):
    cause = likely_cause({"spark2:/var/log/multinode-vllm/vllm.log": ["INFO starting", line, "INFO more"]})
    assert cause is not None and cause["key"] == key
    assert cause["host"] == "spark2:/var/log/multinode-vllm/vllm.log" and cause["fix"]


def test_likely_cause_prefers_the_specific_signature_over_the_traceback():
    tails = {
        "spark1:vllm.log": ["Traceback (most recent call last):", "RuntimeError: Engine core initialization failed."],
        "spark2:ray.log": ["torch.distributed.DistNetworkError: The client socket has failed to connect"],
    }
    cause = likely_cause(tails)
    assert cause["key"] == "rendezvous_unreachable" and cause["host"] == "spark2:ray.log"


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
# Gzipped as recorded: Ray's progress output holds carriage returns, which ansible-test's line-endings check refuses.
SHM_LOG = gzip.decompress((FIXTURES / "ray-shm-across-nodes.spark1.vllm.log.gz").read_bytes()).decode().splitlines()


def test_first_exception_of_a_real_worker_failure_is_the_workers_own():
    """issue 16: the worker's exception is far above the tail, wrapped by Ray, before the engine's summary."""
    first = first_exception(SHM_LOG)
    assert first == {"line": "RuntimeError: open shm in SHMManager failed. errno: 2",
                     "who": "ray::RayWorkerProc.initialize_worker() on pid=15066, ip=198.18.200.13"}
    assert "open shm" not in "\n".join(SHM_LOG[-40:])  # the 40-line tail readiness reads does not show it


def test_likely_cause_names_the_root_cause_of_a_real_worker_failure():
    name = "spark1:/var/log/multinode-vllm/vllm.log"
    tails = {name: SHM_LOG[-40:]}
    assert likely_cause(tails)["key"] == "engine_failed"  # the tail alone: the symptom only
    cause = likely_cause(tails, {name: first_exception(SHM_LOG)})
    assert cause["key"] == "shm_across_nodes"
    assert cause["line"] == ("RuntimeError: open shm in SHMManager failed. errno: 2 "
                             "(in ray::RayWorkerProc.initialize_worker() on pid=15066, ip=198.18.200.13)")
    text = failure_message("vllm serve on spark1 failed while starting", tails, cause)
    assert text.splitlines()[1].startswith("most likely cause: vLLM's CPU shared-memory communicator")
    assert "ip=198.18.200.13" in text.splitlines()[1]


def test_an_unknown_first_error_is_named_in_the_generic_cause():
    log = ["(EngineCore pid=9) ERROR 12-03 14:08:44 [core.py:1510] Traceback (most recent call last):",
           '(EngineCore pid=9) ERROR 12-03 14:08:44 [core.py:1510]   File "x.py", line 1, in f',
           "(APIServer pid=8) INFO 12-03 14:08:44 [api.py:1] ValueError: not this one (another process)",
           "(EngineCore pid=9) ERROR 12-03 14:08:44 [core.py:1510]     ^^^^^",
           "(EngineCore pid=9) ERROR 12-03 14:08:44 [core.py:1510] KeyError: 'rope_theta'",
           "",
           "The above exception was the direct cause of the following exception:",
           "Traceback (most recent call last):",
           "RuntimeError: Engine core initialization failed. See root cause above."]
    first = first_exception(log)
    assert first == {"who": "EngineCore pid=9", "line": "KeyError: 'rope_theta'"}
    cause = likely_cause({"spark1:vllm.log": log[-2:]}, {"spark1:vllm.log": first})
    assert cause["key"] == "engine_failed"
    assert cause["cause"] == "the engine failed while starting; its first error: KeyError: 'rope_theta' (in EngineCore pid=9)"


@pytest.mark.parametrize("log", [
    [],
    ["INFO all good", "RuntimeError: not inside a traceback"],
    ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "    raise"],
])
def test_first_exception_none(log):
    assert first_exception(log) is None


def test_likely_cause_none_and_keys_unique():
    assert likely_cause({"a": ["INFO all good"]}) is None
    assert len({c.key for c in CAUSES}) == len(CAUSES)
    assert CAUSES[-1].key == "engine_failed"  # likely_cause falls back to the last entry, the generic one


def test_failure_message_lists_reason_cause_and_every_tail():
    tails = {"spark1:vllm.log": ["INFO a", "OSError: [Errno 98] Address already in use"], "spark2:ray.log": []}
    text = failure_message("the serve process on spark1 exited (pid 7)", tails, likely_cause(tails), lines=1)
    lines = text.splitlines()
    assert lines[0] == "the serve process on spark1 exited (pid 7)"
    assert lines[1].startswith("most likely cause: a port vLLM binds")
    assert "--- spark1:vllm.log (last 1 lines) ---" in lines and "(empty)" in lines
    assert "not recognised" in failure_message("x", {"a": ["ok"]}, None)


# --- native rendezvous over the fabric ------------------------------------------------

def _c(local, remote, rport=29500, state="ESTABLISHED"):
    return {"local": local, "local_port": 40000, "remote": remote, "remote_port": rport, "state": state, "inode": "1"}


@pytest.mark.parametrize(
    "rank, conns, master_port, error",
    [
        (1, [_c("198.18.200.13", HEAD)], 29500, None),
        (1, [_c("198.18.200.13", HEAD, 40111)], None, None),
        (1, [], None, "spark2 \\(rank 1\\): no established connection to the head's fabric address 198.18.200.12"),
        (1, [_c("198.18.200.13", HEAD, state="SYN_SENT")], None, "no established connection"),
        (1, [_c("198.19.2.10", "198.19.1.10")], None, "connected to the head's management address 198.19.1.10"),
        (1, [_c("10.0.0.5", HEAD)], None, "from 10.0.0.5, not from its fabric address 198.18.200.13"),
        (1, [_c("198.18.200.13", HEAD, 40111)], 29500, "not to the rendezvous port 29500"),
        (0, [_c(HEAD, "198.18.200.13")], None, None),
        (0, [], None, "rank 0\\): no other rank is connected"),
    ],
)
def test_rendezvous_check(rank, conns, master_port, error):
    own = HEAD if rank == 0 else "198.18.200.13"
    host = "spark1" if rank == 0 else "spark2"
    result = rendezvous_check(host, rank, conns, own, HEAD, "198.19.1.10", master_port)
    if error is None:
        assert result is None
    else:
        assert result is not None
        import re
        assert re.search(error, result), result


@pytest.mark.parametrize(
    "lines, expected",
    [
        (["INFO a", "Exception: WorkerProc initialization failed due to an exception"],
         "Exception: WorkerProc initialization failed due to an exception"),
        (["RuntimeError: Engine core initialization failed. See root cause above."],
         "RuntimeError: Engine core initialization failed. See root cause above."),
        (["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"],
         "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"),
        (["INFO Waiting for creating a placement group of specs for 10 seconds"], ""),
        (["WARNING Found ulimit of 20000 ... OSError: [Errno 24] Too many open files"], ""),
    ],
)
def test_fatal_line(lines, expected):
    assert fatal_line(lines) == expected
