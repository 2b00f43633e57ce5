# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""`ray start` arguments of a head and a worker."""

from __future__ import annotations

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError
from ansible_collections.multinode.vllm.plugins.module_utils._ray_start import (
    RaySettings,
    RayStartError,
    ray_start_args,
)

HEAD = "198.18.200.12"

PORTS = {
    "node_manager_port": 6380,
    "object_manager_port": 6381,
    "metrics_export_port": None,
    "dashboard_port": 8265,
    "ray_client_server_port": 10001,
    "min_worker_port": 20000,
    "max_worker_port": 20100,
}

RAY_CASES = [
    # id, role, node_ip, settings, expected args
    ("head-default", "head", HEAD, RaySettings(),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6379", "--include-dashboard=false", "--block"]),
    ("worker-default", "worker", "198.18.200.13", RaySettings(),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--block"]),
    ("head-pinned-ports", "head", HEAD, RaySettings(gcs_port=6400, ports=PORTS),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6400", "--include-dashboard=false",
      "--dashboard-port", "8265", "--max-worker-port", "20100", "--min-worker-port", "20000",
      "--node-manager-port", "6380", "--object-manager-port", "6381", "--ray-client-server-port", "10001",
      "--block"]),
    ("worker-skips-head-only-ports", "worker", "198.18.200.13", RaySettings(gcs_port=6400, ports=PORTS),
     ["start", "--address", HEAD + ":6400", "--node-ip-address", "198.18.200.13",
      "--max-worker-port", "20100", "--min-worker-port", "20000",
      "--node-manager-port", "6380", "--object-manager-port", "6381", "--block"]),
    ("head-dashboard", "head", HEAD, RaySettings(include_dashboard=True, dashboard_host="0.0.0.0"),
     ["start", "--head", "--node-ip-address", HEAD, "--port", "6379", "--include-dashboard=true",
      "--dashboard-host", "0.0.0.0", "--block"]),
    ("worker-resources-extra-no-block", "worker", "198.18.200.13",
     RaySettings(num_gpus=1, num_cpus=20, extra_args=("--labels", '{"fabric":"roce"}'), block=False),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--num-gpus", "1",
      "--num-cpus", "20", "--labels", '{"fabric":"roce"}']),
    ("port-given-as-string", "worker", "198.18.200.13", RaySettings(gcs_port="6379", ports={"node_manager_port": "6380"}),
     ["start", "--address", HEAD + ":6379", "--node-ip-address", "198.18.200.13", "--node-manager-port", "6380",
      "--block"]),
]


@pytest.mark.parametrize(
    "role, node_ip, settings, expected", [case[1:] for case in RAY_CASES], ids=[case[0] for case in RAY_CASES]
)
def test_ray_start_args(role, node_ip, settings, expected):
    assert ray_start_args(role, node_ip, HEAD, settings) == expected


RAY_ERROR_CASES = [
    ("unknown-port-name", "worker", "198.18.200.13", RaySettings(ports={"gcs_server_port": 6379}),
     ["unknown Ray port setting 'gcs_server_port'", "known: dashboard_agent_grpc_port", "node_manager_port"]),
    ("port-zero", "worker", "198.18.200.13", RaySettings(ports={"node_manager_port": 0}),
     ["node_manager_port must be between 1 and 65535; got 0"]),
    ("port-too-high", "head", HEAD, RaySettings(ports={"dashboard_port": 70000}),
     ["dashboard_port must be between 1 and 65535; got 70000"]),
    ("port-not-a-number", "worker", "198.18.200.13", RaySettings(ports={"min_worker_port": "low"}),
     ["min_worker_port must be a TCP port number; got 'low'"]),
    ("gcs-port-out-of-range", "worker", "198.18.200.13", RaySettings(gcs_port=65536),
     ["gcs_port must be between 1 and 65535; got 65536"]),
    ("unknown-head-only-port-on-worker", "worker", "198.18.200.13", RaySettings(ports={"dashbord_port": 8265}),
     ["unknown Ray port setting 'dashbord_port'"]),
    ("bad-role", "driver", HEAD, RaySettings(), ["role must be 'head' or 'worker'; got 'driver'"]),
    ("head-ip-differs", "head", "198.18.200.13", RaySettings(),
     ["head node_ip 198.18.200.13 differs from head_ip " + HEAD]),
]


@pytest.mark.parametrize(
    "role, node_ip, settings, substrings",
    [case[1:] for case in RAY_ERROR_CASES],
    ids=[case[0] for case in RAY_ERROR_CASES],
)
def test_ray_start_args_errors(role, node_ip, settings, substrings):
    with pytest.raises(RayStartError) as caught:
        ray_start_args(role, node_ip, HEAD, settings)
    assert all(s in str(caught.value) for s in substrings), str(caught.value)


def test_a_bad_setting_is_a_ray_start_error_not_a_fabric_error():
    """Issue 18: a `ray start` setting refused is a RayStartError, not the fabric's FabricError."""
    with pytest.raises(RayStartError) as caught:
        ray_start_args("worker", "198.18.200.13", HEAD, RaySettings(gcs_port="redis"))
    assert not isinstance(caught.value, FabricError)
