# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inventory checks that need no host: the groups, Ray's port layout, the API's port and address.

Pure and typed: no Ansible imports, no I/O. The fabric role runs them on the controller in the first gate of
deploy.yml (filter ``_inventory_errors``), before any host is touched, and lists every host's problems at once,
each as "host: variable = value: what is expected; how to fix".

The roles that own these variables (cluster, ray, serve) are not loaded in that gate, so their defaults are repeated here;
``tests/unit/plugins/module_utils/test__inventory.py`` keeps them equal to the roles' defaults/main.yml.

``api_reach_error`` words the verdict of the controller's TCP connect to the API address (action ``api_reach``).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import port_number
from ansible_collections.multinode.vllm.plugins.module_utils._ray_start import RAY_HEAD_ONLY_PORT_FLAGS, RAY_PORT_FLAGS

# roles/cluster/defaults/main.yml
RAY_GCS_PORT = 6379
# roles/ray/defaults/main.yml
RAY_PINNED_PORTS: Mapping[str, int] = {
    "node_manager_port": 6380,
    "object_manager_port": 6381,
    "runtime_env_agent_port": 6382,
    "dashboard_agent_grpc_port": 6383,
    "dashboard_agent_listen_port": 6384,
    "metrics_export_port": 6385,
    "ray_client_server_port": 10001,
    "min_worker_port": 10002,
    "max_worker_port": 19999,
    "dashboard_port": 8265,
}
# Ray's own range when min_worker_port / max_worker_port are not pinned (`ray start --help`).
RAY_DEFAULT_WORKER_RANGE = (10002, 19999)
# roles/serve/defaults/main.yml
VLLM_API_PORT = 8000
# roles/cluster/defaults/main.yml
VLLM_BACKEND = "ray"

# The hostvars each check reads (the filter passes these only).
VARIABLES = (
    "ansible_host", "fabric_ip", "ray_gcs_port", "ray_pinned_ports", "ray_ports", "ray_include_dashboard",
    "vllm_backend", "vllm_api_port", "vllm_api_host",
)

_HOSTNAME = re.compile(r"^(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


def _true(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def check_groups(head_hosts: Sequence[str], worker_hosts: Sequence[str]) -> list[str]:
    """The head must not also be a worker: its worker `ray start` would replace the head's Ray."""
    return [
        "%s: in ray_head and in ray_workers: expected the head in group ray_head only (as a worker too, the worker "
        "play would run `ray start --address` on it and replace the head's Ray); remove %s from group ray_workers "
        "in the inventory" % (host, host)
        for host in sorted(set(head_hosts) & set(worker_hosts))
    ]


def _ray_ports(host: str, hv: Mapping[str, Any], is_head: bool,
               errors: list[str]) -> tuple[Optional[tuple[int, int]], dict[str, int]]:
    """(worker port range or None, {variable label: port} of Ray's listening ports on this host)."""
    pinned = hv.get("ray_pinned_ports", RAY_PINNED_PORTS)
    overrides = hv.get("ray_ports") or {}
    for var, value in (("ray_pinned_ports", pinned), ("ray_ports", overrides)):
        if not isinstance(value, Mapping):
            errors.append(
                "%s: %s = %r: expected a mapping of Ray port settings to ports, e.g. {min_worker_port: 20000}; "
                "fix %s" % (host, var, value, var)
            )
            return None, {}
    known = set(RAY_PORT_FLAGS) | set(RAY_HEAD_ONLY_PORT_FLAGS)
    ports: dict[str, tuple[str, Any]] = {}
    for var, mapping in (("ray_pinned_ports", pinned), ("ray_ports", overrides)):
        for name, value in mapping.items():
            if name not in known:
                errors.append(
                    "%s: %s.%s = %r: expected one of Ray's port settings (%s); fix the name in %s"
                    % (host, var, name, value, ", ".join(sorted(known)), var)
                )
                continue
            ports[str(name)] = ("%s.%s" % (var, name), value)

    valid: dict[str, int] = {}
    for name, (label, value) in sorted(ports.items()):
        if value is None:
            continue  # not pinned: Ray chooses (ray_start_args passes no flag)
        port = port_number(value)
        if port is None:
            errors.append("%s: %s = %r: expected a TCP port 1-65535; fix %s" % (host, label, value, label.split(".")[0]))
            continue
        valid[name] = port

    def bound(name: str, default: int) -> tuple[Optional[int], str]:
        if name in valid:
            return valid[name], ports[name][0]
        if name not in ports or ports[name][1] is None:
            return default, "%s (Ray's default)" % name
        return None, name  # not a port: reported above

    (low, low_label), (high, high_label) = (bound("min_worker_port", RAY_DEFAULT_WORKER_RANGE[0]),
                                            bound("max_worker_port", RAY_DEFAULT_WORKER_RANGE[1]))
    worker_range: Optional[tuple[int, int]] = None
    if low is not None and high is not None:
        if low > high:
            errors.append(
                "%s: %s = %d > %s = %d: expected min_worker_port <= max_worker_port (the range Ray hands to its "
                "worker processes); fix ray_ports, e.g. {min_worker_port: 10002, max_worker_port: 19999}"
                % (host, low_label, low, high_label, high)
            )
        else:
            worker_range = (low, high)

    listening: dict[str, int] = {}
    if is_head:
        gcs = hv.get("ray_gcs_port", RAY_GCS_PORT)
        port = port_number(gcs)
        if port is None:
            errors.append("%s: ray_gcs_port = %r: expected a TCP port 1-65535; fix ray_gcs_port" % (host, gcs))
        else:
            listening["ray_gcs_port"] = port
    for name, port in valid.items():
        if name in ("min_worker_port", "max_worker_port"):
            continue
        if name in RAY_HEAD_ONLY_PORT_FLAGS and not is_head:
            continue  # ray_start_args passes them to the head only
        if name == "dashboard_port" and not _true(hv.get("ray_include_dashboard", False)):
            continue  # no dashboard, nothing listens there
        listening[ports[name][0]] = port
    return worker_range, listening


def _in_range(host: str, label: str, port: int, worker_range: tuple[int, int], what: str, default: str) -> str:
    return (
        "%s: %s = %d: inside Ray's worker port range %d-%d (min_worker_port-max_worker_port), which Ray hands to its "
        "worker processes, so a worker may hold it when %s; choose a port outside the range%s, or move the range "
        "with ray_ports {min_worker_port, max_worker_port}" % (host, label, port, worker_range[0], worker_range[1], what,
                                                               default)
    )


def _check_api_host(host: str, value: Any) -> list[str]:
    if value is None or value == "":
        return []
    text = str(value)
    fix = ("leave vllm_api_host empty for the head's management address, or set an address of the head that the "
           "controller reaches")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        if _HOSTNAME.match(text):
            return []
        return ["%s: vllm_api_host = %r: expected an IP address or a host name of the head; %s" % (host, value, fix)]
    if address.is_unspecified or address.is_loopback or address.is_multicast:
        why = ("a multicast address takes no TCP connection" if address.is_multicast else
               "where this %s address is the controller itself, not the head"
               % ("unspecified" if address.is_unspecified else "loopback"))
        return [
            "%s: vllm_api_host = %s: expected one address of the head that the controller reaches (readiness "
            "connects to it from the controller, %s); %s" % (host, text, why, fix)
        ]
    return []


def check_host(host: str, hv: Mapping[str, Any], is_head: bool) -> list[str]:
    """Every problem of one host's variables (``hv``: its hostvars, any subset of VARIABLES)."""
    errors: list[str] = []
    backend = str(hv.get("vllm_backend") or VLLM_BACKEND)
    worker_range: Optional[tuple[int, int]] = None
    listening: dict[str, int] = {}
    if backend == "ray":  # native: no Ray runs, its ports are unused
        worker_range, listening = _ray_ports(host, hv, is_head, errors)

    if is_head:
        raw = hv.get("vllm_api_port", VLLM_API_PORT)
        api_port = port_number(raw)
        if api_port is None:
            errors.append("%s: vllm_api_port = %r: expected a TCP port 1-65535; fix vllm_api_port" % (host, raw))
        elif backend == "ray":
            listening["vllm_api_port"] = api_port
        errors += _check_api_host(host, hv.get("vllm_api_host"))

    if worker_range is not None:
        for label, port in sorted(listening.items(), key=lambda item: (item[1], item[0])):
            if worker_range[0] <= port <= worker_range[1]:
                if label == "vllm_api_port":
                    errors.append(_in_range(host, label, port, worker_range, "vLLM binds the API on the head",
                                            " (default %d)" % VLLM_API_PORT))
                else:
                    errors.append(_in_range(host, label, port, worker_range, "Ray starts this server", ""))
    by_port: dict[int, list[str]] = {}
    for label, port in listening.items():
        by_port.setdefault(port, []).append(label)
    for port, labels in sorted(by_port.items()):
        if len(labels) > 1:
            errors.append(
                "%s: %s = %d: expected a different port for each of Ray's servers and the API (each binds it); "
                "change all but one of them" % (host, " = ".join(sorted(labels)), port)
            )

    fabric_ip, ansible_host = hv.get("fabric_ip"), hv.get("ansible_host")
    if fabric_ip and ansible_host:
        try:
            same = ipaddress.ip_address(str(fabric_ip)) == ipaddress.ip_address(str(ansible_host))
        except ValueError:
            same = False  # a name, or a bad fabric_ip (check_inventory in _fabric.py names that)
        if same:
            errors.append(
                "%s: fabric_ip = %s = ansible_host, the management address Ansible connects to: expected a fabric "
                "address apart from management (the firewall opens the fabric to cluster nodes only, and cluster "
                "traffic would share the management link); set fabric_ip in host_vars/%s.yml to the host's address "
                "on the fabric subnet" % (host, fabric_ip, host)
            )
    return errors


def check_inventory(
    hosts: Mapping[str, Mapping[str, Any]],
    head_hosts: Sequence[str],
    worker_hosts: Sequence[str],
) -> list[str]:
    """Every host's problems, groups first. ``hosts`` maps each cluster host to its variables."""
    errors = check_groups(head_hosts, worker_hosts)
    for host in sorted(hosts):
        errors += check_host(host, hosts[host], host in head_hosts)
    return errors


# ---------------------------------------------------------------------------
# The controller's TCP connect to the API address (action api_reach does the I/O)
# ---------------------------------------------------------------------------

REACHED = ("connected", "refused")


def connect_outcome(error: Optional[BaseException]) -> tuple[str, str]:
    """(outcome, detail) of one TCP connect: connected, refused, timeout, unreachable, unresolved or error.

    connected and refused both prove that the address answers (a refusal is the host's own RST, or a reject by a
    firewall next to it); timeout and unreachable mean no answer came back at all.
    """
    if error is None:
        return "connected", "connected"
    if isinstance(error, socket.gaierror):
        return "unresolved", "does not resolve on the controller (%s)" % (error.strerror or error)
    if isinstance(error, ConnectionRefusedError):
        return "refused", "connection refused"
    if isinstance(error, (socket.timeout, TimeoutError)):
        return "timeout", "timed out"
    if isinstance(error, OSError) and error.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return "unreachable", "%s (the controller has no way there)" % (error.strerror or error)
    return "error", str(error)


def api_reach_error(
    head: str,
    address: str,
    address_var: str,
    port: int,
    outcome: str,
    detail: str,
    timeout: float,
    ssh_port: Optional[int] = None,
    ssh_outcome: Optional[str] = None,
) -> Optional[str]:
    """The message when the controller cannot connect to the API address; None when it can."""
    if outcome in REACHED:
        return None
    if not address:
        return (
            "%s: %s is empty: expected an address of the head that the controller reaches, and the head has no "
            "management address (no default route) to take instead; set vllm_api_host" % (head, address_var)
        )
    if outcome == "timeout":
        detail = "timed out after %g s" % timeout
    if ssh_outcome in REACHED:
        beyond = ("; the address answers on port %d (SSH), so a firewall between the controller and the head drops "
                  "port %d" % (ssh_port or 22, port))
    elif ssh_port is not None and ssh_outcome is not None:
        beyond = "; port %d (SSH) does not answer either" % ssh_port
    else:
        beyond = ""
    return (
        "%s: %s = %s: the controller cannot connect to port %d (vllm_api_port): %s%s: expected an address of the "
        "head that the controller reaches (readiness polls the API from the controller, and would wait "
        "serve_ready_timeout for nothing); set vllm_api_host to the head's address on the controller's network "
        "(empty: its management address), or let port %d through to the head" % (
            head, address_var, address, port, detail, beyond, port)
    )
