"""LAB TEST FIXTURE -- NEVER FOR REAL HOSTS. See the package docstring.

Which ranks can share memory: the rule the lab's CPU communicator uses to keep
vLLM's shared-memory (SHM) TP path inside one node. Standard library only, so
that it can be tested without vLLM or torch.

vLLM 0.32.0 (vllm/v1/worker/cpu_worker.py) sets ``VLLM_DIST_IDENT`` to the
rendezvous port, the same on every node, and CpuCommunicator takes the SHM
path when every rank of a TP/PP group computes the same group name from it
(``_all_group_ranks_share_shm_group_name``), on CPUs whose kernels have
``init_shm_manager`` (vllm._C, loaded on AVX-512 BF16). Ranks on two lab
nodes then agree on one name, but each node has its own /dev/shm, and
``join_shm_manager`` fails ("open shm in SHMManager failed. errno: 2").
Appending the identity of the /dev/shm the process sees makes the name
differ exactly where the memory is not shared, so vLLM's own check falls back
to torch.distributed between nodes and keeps SHM within a node.
"""

import hashlib
import os

SHM_DIR = "/dev/shm"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SEPARATOR = "@"


def shm_domain(shm_dir=SHM_DIR, boot_id_path=BOOT_ID):
    """A short id that is equal for two processes exactly when they see the same /dev/shm.

    The kernel's boot id tells machines apart; the device number of /dev/shm
    tells apart the tmpfs mounts of one kernel (one per lab node, one per
    container with its own /dev/shm).
    """
    try:
        with open(boot_id_path, encoding="ascii") as handle:
            boot_id = handle.read().strip()
    except OSError:
        boot_id = "no-boot-id"
    device = os.stat(shm_dir).st_dev
    return hashlib.sha256(("%s:%d" % (boot_id, device)).encode()).hexdigest()[:12]


def node_aware_ident(ident, domain):
    """``VLLM_DIST_IDENT`` with the shared-memory domain appended once (idempotent)."""
    suffix = SEPARATOR + domain
    return ident if ident.endswith(suffix) else ident + suffix
