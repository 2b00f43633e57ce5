# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm serve failures: the meaningful log line, the first exception, the likely cause (_serve_failure.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import (
    CAUSES,
    failure_message,
    fatal_line,
    first_exception,
    likely_cause,
    meaningful_line,
    serve_starts,
    this_start,
)


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


# The logo line of vllm serve's start banner, recorded on the lab (vllm 0.32.0+cpu, /var/log/multinode-vllm/vllm.log).
BANNER = "(APIServer pid=26550) INFO 12-06 04:21:51 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"


def test_an_earlier_failed_start_in_the_same_log_is_not_this_starts():
    # supervisord appends every restart to one file: the port was taken at the first start, not at this one.
    log = [BANNER, "OSError: [Errno 98] Address already in use", BANNER, "INFO: Waiting for application startup."]
    assert serve_starts(log) == 2
    assert this_start(log) == log[2:]
    assert fatal_line(this_start(log)) == ""
    assert fatal_line(log) == "OSError: [Errno 98] Address already in use"


def test_a_tail_without_a_banner_is_read_whole():
    ray = ["2026-12-06 04:27:37,437 INFO scripts.py:1092 -- To add another node", "Address already in use"]
    assert this_start(ray) == ray and serve_starts(ray) == 0
