"""LAB TEST FIXTURE -- NEVER INSTALL OR ACTIVATE ON A REAL HOST.

This package exists only so that the multinode-vllm lab (two simulated
"DGX Spark" nodes in network namespaces on one CPU-only machine) can run
vLLM's real Ray executor. It is NOT part of the collection's product
runtime: no role installs it, no real node venv contains it, and a real
GPU host must never load it (it would make vLLM treat the machine as a
CPU-only host that pretends to own one Ray "GPU").

What it does
------------
It registers a vLLM platform plugin (entry point group
``vllm.platform_plugins``). vLLM 0.32's CPU platform has an empty
``ray_device_key``, so every Ray code path refuses it with
"current platform cpu does not support ray". The platform class returned
here (:class:`vllm_lab_platform.ray_cpu.LabRayCpuPlatform`) is vLLM's
``CpuPlatform`` with ``ray_device_key = "GPU"`` and
``device_control_env_var = "CUDA_VISIBLE_DEVICES"``; each lab node runs
``ray start ... --num-gpus 1`` so that Ray places one TP rank per node.
Its device communicator keeps vLLM's CPU shared-memory path inside one node
(vllm_lab_platform.shm_domain says why): each lab node has its own /dev/shm,
as separate hosts do, and the lab must not hide that by sharing it.

Activation
----------
The plugin is inert unless the environment variable
``MULTINODE_VLLM_LAB_PLATFORM`` is exactly ``1`` in every vLLM process
(API server, engine core, Ray workers). Otherwise :func:`register` returns
``None`` and vLLM picks its built-in CPU platform as usual. Ray workers get
the environment of the raylet, so the variable must be exported for
``ray start`` on EVERY lab node, not only for ``vllm serve``: vLLM's
RayExecutorV2 copies the driver's environment into a worker only after the
worker has already resolved its platform.
``VLLM_TARGET_DEVICE=cpu`` bypasses all platform plugins in vLLM 0.32, so
do not set it together with this plugin.
"""

import os

ENV_VAR = "MULTINODE_VLLM_LAB_PLATFORM"
PLATFORM_QUALNAME = "vllm_lab_platform.ray_cpu.LabRayCpuPlatform"


def register():
    """vLLM platform plugin entry point (LAB TEST FIXTURE, never for real hosts).

    Returns the qualified name of the lab platform class when
    ``MULTINODE_VLLM_LAB_PLATFORM=1``, otherwise ``None`` (plugin inert).
    Must not import vLLM or torch: vLLM calls it while it resolves its
    current platform.
    """
    if os.environ.get(ENV_VAR) != "1":
        return None
    return PLATFORM_QUALNAME
