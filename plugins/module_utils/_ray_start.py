# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The ``ray start`` command line of a head or a worker, always with ``--node-ip-address``.

Every runtime runs ``ray`` with these arguments and the node's env file (``_env.py``); the Ray ports named here are
the ones the inventory check (``_inventory.py``) validates before any host is touched. Pure: no Ansible imports,
no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import port_number, whole_number
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._text import one_line_error


class RayStartError(MultinodeError):
    """A ``ray start`` setting that cannot be rendered (a port, the role, an argument); the message names it."""


# ray start flag for each pinned port setting (Ray 2.60 `ray start --help`).
RAY_PORT_FLAGS = {
    "node_manager_port": "--node-manager-port",
    "object_manager_port": "--object-manager-port",
    "runtime_env_agent_port": "--runtime-env-agent-port",
    "dashboard_agent_grpc_port": "--dashboard-agent-grpc-port",
    "dashboard_agent_listen_port": "--dashboard-agent-listen-port",
    "metrics_export_port": "--metrics-export-port",
    "min_worker_port": "--min-worker-port",
    "max_worker_port": "--max-worker-port",
}
RAY_HEAD_ONLY_PORT_FLAGS = {
    "ray_client_server_port": "--ray-client-server-port",
    "dashboard_port": "--dashboard-port",
}


@dataclass(frozen=True)
class RaySettings:
    gcs_port: int = 6379
    ports: Mapping[str, int] = field(default_factory=dict)
    include_dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    num_gpus: Optional[int] = None
    num_cpus: Optional[int] = None
    block: bool = True
    extra_args: Sequence[str] = ()


def _port(value: Any, what: str) -> str:
    number = whole_number(value)
    if number is None:
        raise RayStartError("%s must be a TCP port number; got %r" % (what, value))
    if port_number(number) is None:
        raise RayStartError("%s must be between 1 and 65535; got %d" % (what, number))
    return str(number)


def _check_line(variable: str, value: Any) -> None:
    # Each argument becomes a word of a supervisor section or a systemd unit: one line, no NUL (_text.py says why).
    error = one_line_error(variable, value)
    if error:
        raise RayStartError(error)


def ray_start_args(
    role: str,
    node_ip: str,
    head_ip: str,
    settings: RaySettings,
) -> list[str]:
    """Arguments after ``ray`` for a head or worker, always with --node-ip-address."""
    if role not in ("head", "worker"):
        raise RayStartError("role must be 'head' or 'worker'; got %r" % (role,))
    args = ["start"]
    if role == "head":
        if node_ip != head_ip:
            raise RayStartError("head node_ip %s differs from head_ip %s" % (node_ip, head_ip))
        args += ["--head", "--node-ip-address", node_ip, "--port", _port(settings.gcs_port, "gcs_port")]
        if settings.include_dashboard:
            _check_line("dashboard_host", settings.dashboard_host)
            args += ["--include-dashboard=true", "--dashboard-host", settings.dashboard_host]
        else:
            args += ["--include-dashboard=false"]
    else:
        args += [
            "--address",
            "%s:%s" % (head_ip, _port(settings.gcs_port, "gcs_port")),
            "--node-ip-address",
            node_ip,
        ]
    flags = dict(RAY_PORT_FLAGS)
    if role == "head":
        flags.update(RAY_HEAD_ONLY_PORT_FLAGS)
    for name in sorted(settings.ports):
        if name not in RAY_PORT_FLAGS and name not in RAY_HEAD_ONLY_PORT_FLAGS:
            raise RayStartError(
                "unknown Ray port setting %r; known: %s"
                % (name, ", ".join(sorted(list(RAY_PORT_FLAGS) + list(RAY_HEAD_ONLY_PORT_FLAGS))))
            )
        if name in flags and settings.ports[name] is not None:
            args += [flags[name], _port(settings.ports[name], name)]
    if settings.num_gpus is not None:
        args += ["--num-gpus", str(int(settings.num_gpus))]
    if settings.num_cpus is not None:
        args += ["--num-cpus", str(int(settings.num_cpus))]
    for index, arg in enumerate(settings.extra_args):
        _check_line("ray_extra_args[%d]" % index, arg)
    args += [str(a) for a in settings.extra_args]
    if settings.block:
        args.append("--block")
    return args
