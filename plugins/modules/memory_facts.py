#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: memory_facts
short_description: This node's memory, and whether its GPU shares it (unified memory, as on a DGX Spark's GB10)
version_added: 0.1.0
description:
  - Reads C(/proc/meminfo) (MemTotal, MemAvailable, MemFree) and asks C(nvidia-smi --query-gpu=index,name,memory.total
    --format=csv,noheader,nounits) for the GPUs. The node is unified memory when a GPU is an NVIDIA GB10 (whose
    C(nvidia-smi) reports its memory as C([N/A])) or reports a total equal to MemTotal (within 2%). Without
    C(nvidia-smi) (no NVIDIA GPU) it is not, and the module says so; it never fails for that.
  - Also reports the C(--gpu-memory-utilization) of the vllm serve running on this node, if any, and with
    O(model_path) the bytes of the model directory (the files the model manifest lists).
  - Sets the fact C(multinode_memory). The C(multinode.vllm.node_env) role reads C(unified) (Ray's memory monitor
    is turned off there), the C(multinode.vllm.serve) role the rest (C(docs/serve.md), "Unified memory").
  - With O(drop_caches), on a unified-memory node only, writes dirty pages back and drops the page cache
    (C(sync; echo 3 > /proc/sys/vm/drop_caches)) before reading, and reports a change.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reads the same; the page cache is not dropped (the result says it would be).
  diff_mode:
    support: none
  idempotent:
    support: partial
    details: Read-only unless O(drop_caches) is set on a unified-memory node, which drops the page cache every run.
options:
  host:
    description: This host's inventory name (used in messages); default the node's hostname.
    type: str
  unified:
    description: Whether the node is unified memory; unset detects it.
    type: bool
  model_path:
    description: A model directory whose size to report (RV(ansible_facts.multinode_memory.model_bytes)); unset or
      missing reports none.
    type: path
  drop_caches:
    description: On a unified-memory node, drop the page cache before reading (needs root).
    type: bool
    default: false
  nvidia_smi:
    description: The C(nvidia-smi) program, a name looked up in C(PATH) or a path.
    type: str
    default: nvidia-smi
  meminfo:
    description: The file to read the memory figures from.
    type: path
    default: /proc/meminfo
"""

EXAMPLES = r"""
- name: Read this node's memory and whether the GPU shares it
  multinode.vllm.memory_facts:
    host: "{{ inventory_hostname }}"

- name: Drop the page cache first on a unified-memory node, and size the model
  multinode.vllm.memory_facts:
    host: "{{ inventory_hostname }}"
    drop_caches: true
    model_path: /var/lib/multinode-vllm/models/Qwen3-8B
  become: true

- name: Say why
  ansible.builtin.debug:
    msg: "{{ multinode_memory.unified }}: {{ multinode_memory.reason }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: dict
  contains:
    multinode_memory:
      description: This node's memory.
      type: dict
      contains:
        unified: {description: The GPU shares the system's memory., type: bool, sample: true}
        reason:
          description: Why it is unified or not (or that O(unified) said so).
          type: str
          sample: GPU 0 is NVIDIA GB10 (unified memory)
        gpus:
          description: C(index), C(name), C(memory_total) (bytes; null where the driver reports none) of each GPU.
          type: list
          elements: dict
          sample: [{index: 0, name: NVIDIA GB10, memory_total: null}]
        mem_total: {description: MemTotal in bytes., type: int, sample: 130663165952}
        mem_available: {description: MemAvailable in bytes., type: int, sample: 121411960832}
        mem_free: {description: MemFree in bytes (what vLLM's startup check reads on unified memory)., type: int}
        serve_running: {description: A vllm serve runs on this node., type: bool}
        serve_gpu_memory_utilization:
          description: The C(--gpu-memory-utilization) of the vllm serve running on this node; null when none runs
            or it runs without one.
          type: float
          sample: 0.82
        model_bytes: {description: Bytes of O(model_path) (null without it)., type: int}
        caches_dropped:
          description: The page cache was dropped (or would be, in check mode).
          type: bool
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._manifest import ManifestError, walk_model
from ansible_collections.multinode.vllm.plugins.module_utils._memory import (
    NVIDIA_SMI_QUERY,
    detect_unified,
    parse_gpu_query,
    parse_meminfo,
)
from ansible_collections.multinode.vllm.plugins.module_utils._procs import flag_value, read_process, serve_processes

DROP_CACHES = "/proc/sys/vm/drop_caches"


def read_gpus(module: AnsibleModule, host: str, program: str) -> tuple[list, str]:
    """(GPUs, '') from nvidia-smi, or ([], why there are none)."""
    path = program if os.path.isabs(program) else module.get_bin_path(program)
    if not path or not os.path.exists(path):
        return [], "no NVIDIA GPU (%s not found)" % program
    rc, out, err = module.run_command([path] + list(NVIDIA_SMI_QUERY))
    if rc != 0:
        why = "%s failed (rc %d): %s" % (program, rc, (err or out).strip()[-300:])
        module.warn("%s: %s; unified memory not detected, set multinode_unified_memory if this node has it"
                    % (host, why))
        return [], why
    return parse_gpu_query(out), ""


def read_meminfo(module: AnsibleModule, host: str, path: str) -> dict:
    info: dict = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            info = parse_meminfo(handle.read())
    except OSError as exc:
        module.fail_json(msg="%s: cannot read %s (%s): expected the kernel's memory figures; check that /proc is "
                         "mounted on the node" % (host, path, exc))
    missing = [k for k in ("MemTotal", "MemAvailable", "MemFree") if k not in info]
    if missing:
        module.fail_json(msg="%s: %s has no %s: expected a Linux 3.14 or later /proc/meminfo" % (
            host, path, ", ".join(missing)))
    return info


def running_serve() -> tuple[bool, float | None]:
    """(a vllm serve runs on this node, its --gpu-memory-utilization or None)."""
    main, _pids = serve_processes()
    proc = read_process(main) if main else None
    value = flag_value(proc.cmdline, "--gpu-memory-utilization") if proc else None
    try:
        return proc is not None, (float(value) if value is not None else None)
    except ValueError:
        return True, None


def model_size(module: AnsibleModule, host: str, path: str | None) -> int | None:
    if not path or not os.path.isdir(path):
        return None
    try:
        return sum(os.path.getsize(real) for real in walk_model(path).values())
    except (ManifestError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (host, exc))
        raise  # unreachable; fail_json exits


def drop_page_cache(module: AnsibleModule, host: str) -> None:
    os.sync()
    try:
        with open(DROP_CACHES, "w", encoding="ascii") as handle:
            handle.write("3\n")
    except OSError as exc:
        module.fail_json(msg="%s: serve_drop_caches is true but %s cannot be written (%s); run the play as root "
                         "(become: true), or set serve_drop_caches: false" % (host, DROP_CACHES, exc))


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str"),
            unified=dict(type="bool"),
            model_path=dict(type="path"),
            drop_caches=dict(type="bool", default=False),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            meminfo=dict(type="path", default="/proc/meminfo"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = p["host"] or socket.gethostname()
    info = read_meminfo(module, host, p["meminfo"])
    gpus, why = read_gpus(module, host, p["nvidia_smi"])
    if p["unified"] is not None:
        unified, reason = p["unified"], "set by multinode_unified_memory"
    elif why:
        unified, reason = False, why
    else:
        unified, reason = detect_unified(gpus, info["MemTotal"])
    dropped = bool(unified and p["drop_caches"])
    if dropped and not module.check_mode:
        drop_page_cache(module, host)
        info = read_meminfo(module, host, p["meminfo"])
    serve_running, serve_utilization = running_serve()
    facts = {
        "unified": unified,
        "reason": reason,
        "gpus": gpus,
        "mem_total": info["MemTotal"],
        "mem_available": info["MemAvailable"],
        "mem_free": info["MemFree"],
        "serve_running": serve_running,
        "serve_gpu_memory_utilization": serve_utilization,
        "model_bytes": model_size(module, host, p["model_path"]),
        "caches_dropped": dropped,
    }
    module.exit_json(changed=dropped, ansible_facts=dict(multinode_memory=facts))


if __name__ == "__main__":
    main()
