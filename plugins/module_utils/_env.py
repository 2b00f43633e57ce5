# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One source of truth for a node's environment: its cluster variables, vLLM's non-carry-over list, the env file.

Every runtime (docker, systemd, the lab's process runtime) renders what these
functions return, so what the lab proves is what a container gets. The
``ray start`` command line is ``_ray_start.py``'s. Pure: no Ansible imports,
no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError, FabricSelection, parse_cidr
from ansible_collections.multinode.vllm.plugins.module_utils._text import one_line_error, shown

# Keys whose value is specific to one node. vLLM's Ray executor copies the
# driver's (head's) NCCL_*/UCX_* values to every worker unless the key is in
# ray_non_carry_over_env_vars.json, so these are always listed there.
PER_HOST_KEYS = (
    "VLLM_HOST_IP",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "UCX_NET_DEVICES",
)

# Prefixes vLLM 0.32 copies from the driver to Ray workers
# (vllm/ray/ray_env.py DEFAULT_ENV_VAR_PREFIXES).
CARRIED_PREFIXES = ("VLLM_", "FLASH_ATTENTION_", "LMCACHE_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_")

NON_CARRY_OVER_FILE = "ray_non_carry_over_env_vars.json"

# Set to 0 for Ray on unified-memory nodes.
RAY_MEMORY_MONITOR = "RAY_memory_monitor_refresh_ms"
# Set to 0 for every Ray node (node_environment says why).
RAY_DRAIN_TIMEOUT = "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"

GID_SELECTIONS = ("addr_range", "index")
BACKENDS = ("ray", "native")


class EnvError(MultinodeError):
    """A node environment or env file that cannot be rendered (a key, a value, a setting); the message names it."""


@dataclass(frozen=True)
class EnvSettings:
    """Cluster-wide settings that shape a node's environment."""

    fabric_cidr: str
    head_fabric_ip: str
    backend: str = "ray"
    master_port: int = 29500
    gid_selection: str = "addr_range"
    vllm_config_root: Optional[str] = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The node's GPU shares the system's memory (a DGX Spark's GB10: memory_facts' multinode_memory.unified).
    unified_memory: bool = False


def _check_key(key: str, where: str) -> None:
    if not is_env_key(key):
        raise EnvError("%s: %r is not a valid environment variable name" % (where, key))


def _check_line(variable: str, value: Any, where: str = "") -> None:
    # Values end up in the env file and argv: one line, no NUL (_text.py says why).
    error = one_line_error(variable, value)
    if error:
        raise EnvError("%s: %s" % (where, error) if where else error)


def _one_gid_index(selection: FabricSelection) -> int:
    """The one NCCL_IB_GID_INDEX for every listed HCA (NCCL applies it to all of them), or FabricError."""
    host = selection.host
    members = selection.used_members
    if not members:
        if selection.gid_index is None:
            raise FabricError(
                "%s: gid_selection is 'index' but no RoCE v2 GID on %s carries %s; use gid_selection "
                "'addr_range' or fix the RoCE configuration" % (host, ",".join(selection.hca_ports), selection.ip)
            )
        return selection.gid_index
    missing = [m for m in members if m.gid_index is None]
    if missing:
        raise FabricError(
            "%s: gid_selection is 'index' but no RoCE v2 GID on %s carries %s; use gid_selection "
            "'addr_range' or fix the RoCE configuration" % (
                host, ",".join(m.hca_port or m.netdev for m in missing), ", ".join(str(m.ip) for m in missing))
        )
    indexes = sorted({int(m.gid_index) for m in members if m.gid_index is not None})
    if len(indexes) > 1:
        listing = ", ".join("%s holds %s at GID %s" % (m.hca_port, m.ip, m.gid_index) for m in members)
        raise FabricError(
            "%s: gid_selection is 'index' but NCCL_IB_GID_INDEX is one value for every HCA in NCCL_IB_HCA, and the "
            "RoCE v2 GIDs differ (%s); use gid_selection 'addr_range' (NCCL_IB_ADDR_RANGE: NCCL then picks each "
            "HCA's GID by address)" % (host, listing)
        )
    return indexes[0]


def node_environment(
    selection: FabricSelection,
    settings: EnvSettings,
    overrides: Optional[Mapping[str, Any]] = None,
) -> dict[str, str]:
    """The environment of every cluster process on one node (ray start, vllm serve, preflight).

    ``settings.extra`` adds keys cluster-wide but may not replace a computed
    key; ``overrides`` (per host, an escape hatch) may, and is applied last.
    """
    host = selection.host
    if settings.backend not in BACKENDS:
        raise EnvError("backend %r is not one of %s" % (settings.backend, ", ".join(BACKENDS)))
    if settings.gid_selection not in GID_SELECTIONS:
        raise EnvError(
            "gid_selection %r is not one of %s" % (settings.gid_selection, ", ".join(GID_SELECTIONS))
        )
    cidr = parse_cidr(settings.fabric_cidr, host)
    iface = selection.interface
    env: dict[str, str] = {
        # vLLM's get_ip() returns this; each node its own fabric address.
        "VLLM_HOST_IP": selection.ip,
        # Gloo and TensorPipe take a concrete interface name (no ^ or = syntax).
        "GLOO_SOCKET_IFNAME": iface,
        "TP_SOCKET_IFNAME": iface,
        # '=' makes NCCL match the name exactly, not as a prefix that could
        # also match the mgmt NIC.
        "NCCL_SOCKET_IFNAME": "=" + iface,
    }
    hcas = selection.hca_ports
    if hcas:
        # '=' makes NCCL match each name exactly (mlx5_1 would also take mlx5_10); every used endpoint of the
        # fabric port is listed: a DGX Spark's QSFP port is two PCIe x4 endpoints, and one HCA reaches about half
        # of it.
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
        if len(hcas) > 1:
            # NCCL's default, written out: a node's /etc/nccl.conf or an image may set 0, and the environment wins.
            env["NCCL_IB_MERGE_NICS"] = "1"
        if settings.gid_selection == "index":
            env["NCCL_IB_GID_INDEX"] = str(_one_gid_index(selection))
        else:
            # NCCL picks each HCA's GID by address in this range (its index may differ per HCA and per host).
            env["NCCL_IB_ADDR_RANGE"] = selection.addr_range or str(cidr)
        env["UCX_NET_DEVICES"] = ",".join(hcas)
    else:
        env["UCX_NET_DEVICES"] = iface
    if settings.backend == "native":
        env["MASTER_ADDR"] = settings.head_fabric_ip
        env["MASTER_PORT"] = str(settings.master_port)
    if settings.unified_memory and settings.backend == "ray" and RAY_MEMORY_MONITOR not in (settings.extra or {}):
        # Ray's memory monitor counts the one pool (page cache included) and kills workers at 95% of it while the
        # weights stream in: a load that stalls at 40-80% with no error (_memory.py gives the sources). 0 turns it
        # off; node_env_extra may set another value instead.
        env[RAY_MEMORY_MONITOR] = "0"
    if settings.backend == "ray" and RAY_DRAIN_TIMEOUT not in (settings.extra or {}):
        # ray start --block (Ray 2.60) drains its node on SIGTERM for up to 30 s before stopping anything, as long as
        # every stop timeout the runtimes give it (supervisord, systemd): they then SIGKILL it, the head's GCS outlives
        # it on the port, and the restarted head exits "already running at <fabric ip>:6379" until its supervisor
        # gives up (found growing the lab from 2 to 4 nodes). Draining lets Ray Serve move replicas; a vLLM TP group
        # cannot move and restarts whole, so 0 stops Ray at once. node_env_extra may set another value.
        env[RAY_DRAIN_TIMEOUT] = "0"
    if settings.vllm_config_root:
        _check_line("node_env_vllm_config_root", settings.vllm_config_root, host)
        env["VLLM_CONFIG_ROOT"] = settings.vllm_config_root

    for key, value in (settings.extra or {}).items():
        _check_key(key, host)
        _check_line("node_env_extra[%s]" % key, value, host)
        if key in env:
            raise EnvError(
                "%s: extra environment sets %s, which the collection computes from the fabric (%s=%s); "
                "use the per-host override variable if you really mean to replace it" % (host, key, key, env[key])
            )
        env[key] = str(value)
    for key, value in (overrides or {}).items():
        _check_key(key, host)
        _check_line("node_env_overrides[%s]" % key, value, host)
        env[key] = str(value)
    return env


def non_carry_over_keys(envs_by_host: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Keys vLLM must not copy from the head to the workers.

    The per-host keys present anywhere, plus every carried key whose value
    differs between hosts (or is missing on some).
    """
    keys: set[str] = set()
    all_keys: set[str] = set()
    for env in envs_by_host.values():
        all_keys.update(env)
    for key in all_keys:
        values = {env.get(key) for env in envs_by_host.values()}
        if key in PER_HOST_KEYS:
            keys.add(key)
        elif key.startswith(CARRIED_PREFIXES) and len(values) > 1:
            keys.add(key)
    return sorted(keys)


def carry_over_hazards(
    envs_by_host: Mapping[str, Mapping[str, str]], listed: Sequence[str]
) -> list[str]:
    """NCCL_*/UCX_* keys whose values differ between hosts and are not in ``listed``."""
    errors = []
    listed_set = set(listed)
    all_keys = sorted({k for env in envs_by_host.values() for k in env})
    for key in all_keys:
        if not key.startswith(("NCCL_", "UCX_")) or key in listed_set:
            continue
        values = {host: env.get(key) for host, env in sorted(envs_by_host.items())}
        if len(set(values.values())) > 1:
            shown = ", ".join("%s=%s" % (h, v if v is not None else "<unset>") for h, v in values.items())
            errors.append(
                "%s differs between hosts (%s) but is not in %s on the head: vLLM would overwrite the workers' "
                "values with the head's; add it to the list or make the values equal" % (key, shown, NON_CARRY_OVER_FILE)
            )
    return errors


# What systemd's EnvironmentFile reads differently from docker's --env-file and the launcher (both take the value
# raw), per systemd 252's src/basic/env-file.c: a backslash anywhere escapes the next character; a quote that opens
# the value starts a quoted string (quotes later in an unquoted value are kept); blanks around an unquoted value are
# stripped.
_BLANKS = " \t"


def env_file_value_error(key: str, value: str) -> Optional[str]:
    """Why ``value`` would not read back identically under all three env-file readers, or None."""
    reason = ""
    if "\\" in value:
        reason = "contains a backslash at position %d, which systemd's EnvironmentFile reads as an escape" % (
            value.index("\\"))
    elif value.startswith(("'", '"')):
        reason = "starts with a quote, which systemd's EnvironmentFile removes (it reads a quoted string)"
    elif value and (value[0] in _BLANKS or value[-1] in _BLANKS):
        reason = "starts or ends with a blank, which systemd's EnvironmentFile strips"
    if reason:
        return ("env file value of %s = %s %s, while docker --env-file and the process runtime's launcher keep it as "
                "is, so the runtimes would see different values. Change the value (a value for vllm serve alone can "
                "go in vllm_env, a secret in vllm_secret_env)" % (key, shown(value), reason))
    return None


def env_file(env: Mapping[str, Any], systemd: bool = True) -> str:
    """KEY=VALUE lines, sorted, read identically by docker --env-file, systemd EnvironmentFile and the launcher.

    Values are written raw (no quotes) because docker's env-file format takes them literally; a value that is not
    one line (a line break, NUL) is refused, and so, unless ``systemd`` is false, is a value the three readers would
    not read alike (a quote, a backslash, a leading or trailing blank). ``systemd=False`` is for a file only the
    launcher reads (``_node_env_exec``: vllm serve's own env file), which keeps such values as they are.
    """
    lines = []
    for key in sorted(env):
        _check_key(key, "env file")
        value = str(env[key])
        _check_line("env file value of %s" % key, value)
        error = env_file_value_error(key, value) if systemd else None
        if error:
            raise EnvError(error)
        lines.append("%s=%s" % (key, value))
    return "\n".join(lines) + "\n"
