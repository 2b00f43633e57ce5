# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unified memory (NVIDIA GB10, the DGX Spark): detection, vLLM's memory budget, and whether the model fits.

On a unified-memory host the CPU and the GPU share one pool (a Spark's 121.69 GiB of LPDDR5X). Four consequences,
each from a public report (docs/serve.md, "Unified memory", lists them):

- NVML and ``nvidia-smi`` report no framebuffer: ``memory.total`` is ``[N/A]`` (``Not Supported`` in the table), so
  ``/proc/meminfo`` is the only figure (NVIDIA's DGX Spark known issues; XuehaiPan/nvitop#208).
- vLLM's budget is ``gpu_memory_utilization`` x the device total, and the device total is MemTotal: the budget
  counts against all of RAM, page cache and the OS included (``Desired GPU memory utilization is (0.87, 105.87
  GiB)`` of ``121.69 GiB``, MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47), and an over-budget start can freeze the
  host (vllm-project/vllm#46307).
- vLLM's startup check reads free device memory, which on unified memory is MemFree, not MemAvailable: page cache
  left by a copy of the model makes it refuse (vllm-project/vllm#48140); dropping the page cache clears it.
- Ray's memory monitor counts the same pool and kills workers at 95% of node memory while weights stream in: a
  load that stalls at 40-80% with no error (MiaAI-Lab/GLM-5.3-Flash-NVFP4-Dual-DGX-Spark#2); the fix is
  ``RAY_memory_monitor_refresh_ms=0`` (``_env.node_environment``).

Pure: parsers of ``/proc/meminfo`` and of ``nvidia-smi --query-gpu`` CSV, the detection, and the plan that the serve
role applies (one ``gpu_memory_utilization`` for the cluster, the errors, the notes). ``memory_facts`` does the I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError

GIB = 1024 ** 3
MIB = 1024 ** 2

# What memory_facts asks nvidia-smi (one line per GPU; no header, no units: memory in MiB).
NVIDIA_SMI_QUERY = ("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
# GPU names that are unified memory whatever nvidia-smi says about their memory.
UNIFIED_GPU_NAMES = ("GB10",)
# A GPU whose total memory is within this fraction of MemTotal is the same pool (the CUDA device total of a
# unified-memory GPU is MemTotal; a discrete GPU's is its own framebuffer).
SAME_POOL_TOLERANCE = 0.02
# The step a derived gpu_memory_utilization is rounded down to.
UTILIZATION_STEP = 0.01


class MemoryPlanError(MultinodeError):
    """A memory reading or setting the unified-memory guard cannot use; the message names host, value and fix."""


def human(value: float) -> str:
    """Bytes as GiB with one decimal (``121.7 GiB``): the unit vLLM's own memory lines use."""
    return "%.1f GiB" % (value / GIB)


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per field (``kB`` is KiB; fields without a unit, the HugePages counts, as is)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        words = rest.split()
        if not sep or not words or not words[0].isdigit():
            continue
        value = int(words[0])
        out[name.strip()] = value * 1024 if words[1:2] == ["kB"] else value
    return out


def _mib(field: str) -> Optional[int]:
    """A memory field of nvidia-smi's CSV in bytes; None for ``[N/A]``, ``[Not Supported]`` or anything not a number."""
    text = field.strip()
    if text.endswith("MiB"):
        text = text[:-3].strip()
    try:
        return int(float(text) * MIB)
    except ValueError:
        return None


def parse_gpu_query(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`` as a list of GPUs.

    Each is ``{"index": 0, "name": "NVIDIA GB10", "memory_total": None}``: memory in bytes, None where the driver
    reports none (``[N/A]`` on a GB10). A line that is not three fields is skipped.
    """
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue
        gpus.append({"index": int(fields[0]), "name": fields[1], "memory_total": _mib(fields[2])})
    return gpus


def detect_unified(gpus: Sequence[Mapping[str, Any]], mem_total: Optional[int]) -> tuple[bool, str]:
    """(unified, why): a GB10, or a GPU whose total memory is MemTotal (within ``SAME_POOL_TOLERANCE``)."""
    if not gpus:
        return False, "no NVIDIA GPU"
    for gpu in gpus:
        name = str(gpu.get("name") or "")
        if any(model in name.upper() for model in UNIFIED_GPU_NAMES):
            return True, "GPU %s is %s (unified memory)" % (gpu.get("index"), name)
    for gpu in gpus:
        total = gpu.get("memory_total")
        if total and mem_total and abs(int(total) - mem_total) <= SAME_POOL_TOLERANCE * mem_total:
            return True, "GPU %s (%s) reports %s, the system's MemTotal %s (one pool)" % (
                gpu.get("index"), gpu.get("name"), human(int(total)), human(mem_total))
    names = ", ".join(str(g.get("name")) for g in gpus)
    return False, "discrete GPU memory (%s)" % names


def derive_utilization(host: str, mem_available: int, mem_total: int, reserve: int, ranks: int = 1) -> float:
    """(MemAvailable - reserve) / MemTotal / ranks, rounded down to ``UTILIZATION_STEP``; MemoryPlanError when
    nothing is left (``ranks``: the GPUs of this host vLLM uses, each taking the fraction of the one pool)."""
    if mem_total <= 0:
        raise MemoryPlanError("%s: MemTotal is %d bytes in /proc/meminfo: expected the host's memory; check that "
                              "/proc is mounted on the node" % (host, mem_total))
    steps = math.floor((mem_available - reserve) / mem_total / max(ranks, 1) / UTILIZATION_STEP + 1e-9)
    if steps <= 0:
        raise MemoryPlanError(
            "%s: MemAvailable %s minus serve_memory_reserve_bytes %s leaves nothing for vLLM on this unified-memory "
            "host (MemTotal %s); stop what else holds memory there (or set serve_drop_caches: true), or lower "
            "serve_memory_reserve_bytes" % (host, human(mem_available), human(reserve), human(mem_total)))
    return round(steps * UTILIZATION_STEP, 2)


def _ranks_here(world_size: int, gpus_per_node: int) -> int:
    return max(1, min(world_size, gpus_per_node))


def memory_plan(
    nodes: Mapping[str, Mapping[str, Any]],
    utilization: Optional[float],
    reserve: int,
    kv_reserve: int,
    model_bytes: Optional[int],
    world_size: int,
    gpus_per_node: int,
    running_utilization: Optional[float] = None,
    model_path: str = "",
    serve_running: Optional[bool] = None,
) -> dict[str, Any]:
    """The cluster's ``gpu_memory_utilization``, and why a start would not fit, from every node's memory reading.

    ``nodes`` maps each host to its ``multinode_memory`` fact (``unified``, ``mem_total``, ``mem_available``,
    ``mem_free``). Nothing changes unless a node is unified: then, unless ``utilization`` (the user's) is set, the
    value is the smallest ``(MemAvailable - reserve) / MemTotal`` of the unified nodes (vllm serve takes one value
    for every rank under Ray), or ``running_utilization``, the value the cluster's running vllm serve was started
    with (its memory is not in MemAvailable while it runs, so a re-run keeps it instead of restarting vLLM with a
    smaller one). ``serve_running`` says that one runs (by default: when ``running_utilization`` is set); one that
    runs without the flag keeps vLLM's default. Each unified node must then hold its share of the weights
    (``model_bytes`` x its ranks / the world size) plus ``kv_reserve`` per rank within the budget ``utilization x
    MemTotal``, and (when vLLM is not running) the budget must leave ``reserve`` of MemAvailable. Returns
    ``gpu_memory_utilization`` (None: vLLM's default), ``derived``, ``unified_hosts``, ``errors`` and ``warnings``
    (one message each) and ``lines`` (what was decided).
    """
    unified = sorted(host for host, facts in nodes.items() if facts.get("unified"))
    plan: dict[str, Any] = {"gpu_memory_utilization": utilization, "derived": False, "unified_hosts": unified,
                            "errors": [], "warnings": [], "lines": []}
    if not unified:
        return plan
    errors: list[str] = plan["errors"]
    running = running_utilization is not None if serve_running is None else bool(serve_running)
    value = utilization
    if value is None and running and running_utilization is None:
        # Started without the flag (before this check existed, say): what runs keeps vLLM's default, not a value
        # derived while vLLM holds the memory.
        plan["lines"].append("gpu_memory_utilization: vLLM's default, as the running vllm serve was started (its "
                             "memory is not available while it runs; stop it to derive a value)")
        return plan
    if value is None and running:
        value = running_utilization
        plan["lines"].append("gpu_memory_utilization %.2f: kept from the running vllm serve (its memory is not "
                             "available while it runs; stop it to derive the value again)" % value)
    elif value is None:
        derived = {}
        ranks = _ranks_here(world_size, gpus_per_node)
        for host in unified:
            facts = nodes[host]
            try:
                derived[host] = derive_utilization(host, int(facts["mem_available"]), int(facts["mem_total"]), reserve,
                                                   ranks)
            except MemoryPlanError as exc:
                errors.append(str(exc))
        if errors:
            return plan
        low = min(derived, key=lambda h: (derived[h], h))
        value = derived[low]
        plan["derived"] = True
        plan["lines"].append(
            "gpu_memory_utilization %.2f: derived on %s from MemAvailable %s minus serve_memory_reserve_bytes %s "
            "over MemTotal %s (unified memory; the smallest of %s)" % (
                value, low, human(int(nodes[low]["mem_available"])), human(reserve),
                human(int(nodes[low]["mem_total"])), ", ".join("%s %.2f" % (h, derived[h]) for h in unified)))
    plan["gpu_memory_utilization"] = value
    if value is None or not 0 < float(value) <= 1:
        errors.append("vllm_gpu_memory_utilization = %r: expected a fraction above 0 and at most 1; set it so, or "
                      "leave it unset to derive it on unified-memory hosts" % (value,))
        return plan
    value = float(value)
    ranks = _ranks_here(world_size, gpus_per_node)
    for host in unified:
        facts = nodes[host]
        total = int(facts["mem_total"])
        available = int(facts["mem_available"])
        budget = value * total * ranks
        room = available - reserve
        if not running and utilization is not None and budget > room:
            errors.append(
                "%s: vllm_gpu_memory_utilization = %.2f asks for %s of this host's unified memory (x MemTotal %s), "
                "but MemAvailable %s minus serve_memory_reserve_bytes %s leaves %s, and an over-budget start can "
                "freeze the host; set it to at most %.2f, or leave it unset to derive it" % (
                    host, value, human(budget), human(total), human(available), human(reserve), human(room),
                    max(0.0, math.floor(room / total / ranks / UTILIZATION_STEP) * UTILIZATION_STEP)))
        if model_bytes is None:
            continue
        weights = model_bytes * ranks / max(world_size, 1)
        need = weights + kv_reserve * ranks
        if need > budget:
            errors.append(
                "%s: the model needs %s here (%s of weights: %s in %s over %d rank(s), %d on this host, and "
                "serve_kv_cache_reserve_bytes %s per rank), more than vLLM's budget of %s (gpu_memory_utilization "
                "%.2f x MemTotal %s) on this unified-memory host; free memory on it, spread the model over more "
                "nodes (tensor or pipeline parallel), use a smaller or quantized model, or lower "
                "serve_kv_cache_reserve_bytes" % (
                    host, human(need), human(weights), human(model_bytes), model_path or "the model", world_size,
                    ranks, human(kv_reserve), human(budget), value, human(total)))
        else:
            plan["lines"].append("%s: %s of weights and %s of KV reserve within a budget of %s" % (
                host, human(weights), human(kv_reserve * ranks), human(budget)))
        free = facts.get("mem_free")
        if not running and free is not None and int(free) < budget:
            plan["warnings"].append(
                "%s: MemFree %s is below vLLM's budget %s (the rest of MemAvailable %s is page cache); vLLM's "
                "startup check reads MemFree on unified memory (vllm-project/vllm#48140) and may refuse to start; "
                "set serve_drop_caches: true to drop the page cache before the start" % (
                    host, human(int(free)), human(budget), human(available)))
    if model_bytes is None:
        plan["lines"].append("the model's size is unknown (vllm_model is not a directory on the head): the fit "
                             "check is skipped")
    return plan
