"""The lab's vLLM platform fixture against vLLM's real CpuCommunicator check (issue 16).

Two gloo ranks on this machine stand for two lab nodes when the second one runs in its own mount namespace with
its own /dev/shm (as every lab node does), or for two ranks of one node when both see the same /dev/shm. Each rank
builds the communicator and reports the path vLLM chose (tests/lab/shm_rank.py says which part is a stand-in).
Needs root (unshare, mount) and the lab node venv (`make lab-venv`).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_PYTHON = Path(os.environ.get("LAB_ROOT") or "/var/lib/multinode-vllm-lab") / "cache" / "node-venv" / "bin" / "python"
RANK = Path(__file__).resolve().parent / "shm_rank.py"
sys.path.insert(0, str(REPO / "tests" / "lab_fixtures" / "vllm_lab_platform"))
from vllm_lab_platform.shm_domain import node_aware_ident, shm_domain  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a mount namespace with its own /dev/shm)"),
    pytest.mark.skipif(not NODE_PYTHON.exists(), reason="lab node venv missing; build it with `make lab-venv`"),
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(tmp_path, which, split_shm):
    """Start ranks 0 and 1; rank 1 in a private /dev/shm when split_shm. Returns both reports."""
    port = str(_free_port())
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONDONTWRITEBYTECODE="1", VLLM_TARGET_DEVICE="cpu")
    env.pop("MULTINODE_VLLM_LAB_PLATFORM", None)
    procs = []
    for rank in (0, 1):
        argv = [str(NODE_PYTHON), str(RANK), str(rank), "2", port, which, str(tmp_path / ("%d.json" % rank))]
        if rank == 1 and split_shm:
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "rank1", *argv]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return [json.loads((tmp_path / ("%d.json" % rank)).read_text()) for rank in (0, 1)]


def test_shm_domain_tells_mount_namespaces_apart():
    here = shm_domain()
    assert here == shm_domain()
    other = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "x", sys.executable, "-c",
         "import sys; sys.path.insert(0, %r); from vllm_lab_platform.shm_domain import shm_domain; print(shm_domain())"
         % str(REPO / "tests" / "lab_fixtures" / "vllm_lab_platform")],
        capture_output=True, text=True, check=True).stdout.strip()
    assert other and other != here
    assert node_aware_ident("29500", here) == node_aware_ident(node_aware_ident("29500", here), here)


def test_ranks_on_two_nodes_fall_back_to_torch_distributed(tmp_path):
    reports = _run_pair(tmp_path, "lab", split_shm=True)
    for report in reports:
        assert report["shared"] is False and report["path"] == "torch.distributed", report
        assert report["sum"] == 3.0, report  # the all-reduce really went through gloo
        assert report["opened"] == []
    assert reports[0]["ident"] != reports[1]["ident"]


def test_ranks_of_one_node_keep_the_shared_memory_path(tmp_path):
    reports = _run_pair(tmp_path, "lab", split_shm=False)
    for report in reports:
        assert report["shared"] is True and report["path"] == "_CPUSHMDistributed", report
    # One node-aware name, the one both ranks opened.
    assert reports[0]["ident"] == reports[1]["ident"] == node_aware_ident(reports[0]["ident"].split("@")[0],
                                                                          shm_domain())
    if reports[0]["stand_in"]:
        assert reports[0]["opened"] == reports[1]["opened"] and reports[0]["ident"] in reports[0]["opened"][0]


def test_vllms_own_communicator_takes_the_shm_path_across_nodes(tmp_path):
    """What the fixture fixes (issue 16): without it, ranks on two nodes agree on one SHM name."""
    reports = _run_pair(tmp_path, "vllm", split_shm=True)
    for report in reports:
        if report["stand_in"]:
            assert report["shared"] is True and report["path"] == "_CPUSHMDistributed", report
        else:  # a CPU with vLLM's real SHM kernels fails here, as in issue 16
            assert "open shm in SHMManager failed" in report.get("error", ""), report


def test_the_lab_platform_selects_the_node_aware_communicator():
    env = dict(os.environ, MULTINODE_VLLM_LAB_PLATFORM="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("VLLM_TARGET_DEVICE", None)
    out = subprocess.run([str(NODE_PYTHON), "-c", "from vllm.platforms import current_platform as p; "
                          "print(p.get_device_communicator_cls())"], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "vllm_lab_platform.communicator.LabCpuCommunicator"


@pytest.mark.skipif(not shutil.which("unshare"), reason="unshare missing")
def test_stand_in_is_used_only_without_the_real_ops():
    # The rank script's stand-in never replaces real kernels: on this CPU, does vLLM's build have SHM ops?
    code = ("from vllm.platforms import current_platform; current_platform.import_kernels(); import torch; "
            "print(hasattr(torch.ops._C, 'init_shm_manager'))")
    out = subprocess.run([str(NODE_PYTHON), "-c", code], env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())
    if "avx512_bf16" in flags:
        assert out == "True"  # vllm._C: the real ops run, no stand-in
    elif "avx512f" not in flags:
        assert out == "False"  # vllm._C_AVX2: no SHM ops, the stand-in is what reaches the check
