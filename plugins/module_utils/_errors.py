# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one base of the collection's errors.

Every error a pure module raises derives from ``MultinodeError``, and its message is what the user sees: it names
the host or variable, the value, and the fix. A module turns it into ``fail_json(msg=str(exc))``, a filter into
``AnsibleFilterError(str(exc))``, an action into a failed result. Each subclass lives next to the code that
raises it and names the part that refused the input:

- ``_fabric.FabricError``: the fabric (interface, address, subnet, RDMA port) of a host or of the cluster;
- ``_probe.ProbeError``: the fabric probe could not run;
- ``_env.EnvError``: a node's environment or its env file (a key, a value, a setting);
- ``_ray_start.RayStartError``: the ``ray start`` command line;
- ``_runtime.RuntimeConfigError``: a process rendered for the process, systemd or docker runtime;
- ``_firewall.FirewallError``: the firewall's input or its boot unit;
- ``_serve.ServeError``: vLLM serve's command line, environment or readiness answer;
- ``_manifest.ManifestError``, ``_transfer.TransferError``: model staging;
- ``_rendezvous.RendezvousError``: the distributed preflight's input;
- ``_cluster.ClusterError``: the cluster's identity (head, groups, Ray address);
- ``_stack.StackError``: the stack fingerprint gate's input (the allow-list ``ray_stack_allow_skew``);
- ``_memory.MemoryPlanError``: a unified-memory node's reading or vLLM memory setting (``gpu_memory_utilization``);
- ``_doctor.DoctorError``: doctor's bundle (its directory, the cluster's name);
- ``_watchdog.WatchdogError``: the recovery watchdog's policy or config (also a ``ValueError``);
- ``_bind_audit.AuditError``, ``_secrets.SecretError``, ``_detach.LineTooLong``, ``_cluster.ClusterError``: also
  ``ValueError``s, as they were (``model_transfer`` catches a peer's over-long line among its ``ValueError``s).

Callers catch the subclass they expect; ``MultinodeError`` catches any of them.
"""

from __future__ import annotations


class MultinodeError(Exception):
    """An input or state the collection refuses; the message says what, where, and how to fix it."""
