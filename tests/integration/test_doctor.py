# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/doctor.yml on the 2-node process lab (docs/doctor.md).

After a full deploy (Ray, vllm serve, the firewall): a healthy cluster yields no finding, within the issue's 30 s for
2 nodes; for each of labctl's faults (mtu, drop-port, link-down, reboot), for a node SSH cannot reach, and for the
faults made here by hand (a wrong interface in spark2's env file, the incident's head on its management address, a
vllm serve that crash-loops because another server holds its port, a full filesystem under spark2's model
directory), doctor's first diagnosis line names the cause; the bundle of every run holds neither the lab's real API
key nor its Ray token, even where a log line carries both. Each fault is undone before the next (labctl fault clear;
the programs started again from the deployed sections where a process was touched or the API stopped completing, and
deploy.yml only if that does not bring a completion back; the file or mount put back where nothing ran differently).
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import (API_KEY, LAB_INVENTORY, completion, labctl, molecule_destroyed, molecule_scenario_kept,
                      netns_processes, ray_pids, record_timing, require_root, run_playbook, serve_pids, wait_for)

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")
RAY = str(VENV / "bin" / "ray")
SUPERVISORCTL = [str(VENV / "bin" / "supervisorctl"), "-c", "/etc/multinode-vllm/supervisord.conf"]
ENV_FILE = "/etc/multinode-vllm/node.env"
MODEL_DIR = "/var/lib/multinode-vllm-lab/cache/models"
SERVE_LOG = "/var/log/multinode-vllm/vllm.log"
HEAD_MGMT, HEAD_FABRIC = "198.19.1.10", "198.18.200.12"
TOKEN_FILE = "/etc/multinode-vllm/ray-auth-token"
FABRIC_IF = "enp1s0f1np1"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd)"),
    pytest.mark.skipif(not (VENV / "bin" / "ray").exists(),
                       reason="node venv with Ray missing; build it with `make lab-venv`"),
]


def deploy() -> None:
    result = run_playbook("playbooks/deploy.yml")
    assert result.rc == 0, result.why


@pytest.fixture(scope="module")
def served():
    """The 2-node process lab, deployed and serving; the lab's real secrets (the API key, the Ray token).

    The cluster is extensions/molecule/default's, all of it but its last destroy: lab down, syntax, lab up, deploy.yml,
    deploy.yml again with nothing changed (molecule's idempotence), verify.yml and a completion. make test runs that
    scenario here, once, instead of deploying the same cluster twice (TEST_LAB_PARTS in the Makefile)."""
    require_root()
    labctl("fault", "clear")
    try:
        molecule_scenario_kept("default")
        secrets = {"api key": API_KEY.read_text().strip(),
                   "ray token": labctl("exec", "spark1", "--", "cat", TOKEN_FILE).strip().splitlines()[-1]}
        assert all(len(value) >= 16 for value in secrets.values()), "the lab's secrets were not read"
        yield secrets
        labctl("fault", "clear")
        result = run_playbook("playbooks/teardown.yml")
        assert result.rc == 0, result.why
    finally:
        # The scenario's destroy (lab down), then a fresh 2-node process lab, as the session's later modules expect.
        labctl("fault", "clear")
        molecule_destroyed("default")
        labctl("up", "2", "--kind", "process")


def cluster_processes() -> dict:
    """Per node, the pids of what a deploy starts and a fault may kill: the raylet, GCS, vllm serve and its engine."""
    return {host: (ray_pids(host).get("raylet"), ray_pids(host).get("gcs_server"), serve_pids(host))
            for host in ("spark1", "spark2")}


def serves() -> bool:
    try:
        return bool(completion())
    except (OSError, ValueError, KeyError):
        return False


def supervisord_runs(host: str) -> bool:
    return any("bin/supervisord" in text for _pid, _name, text in netns_processes(host))


@pytest.fixture
def restore():
    """Undo the test's fault, so the next test starts from a healthy cluster. The fabric faults (mtu, drop-port,
    link-down) leave every process as it was: labctl fault clear alone undoes them, and the completion proves it.
    Where a process went (the process lab's reboot kills every process of the node, supervisord too) or the API
    stopped completing (a crash loop), the programs are started again from the sections the deploy left, as an
    operator would (supervisord where it is gone, its run directory made again; `supervisorctl start` where it
    runs), and the cluster must complete again: the head's vllm serve, restarted by supervisord, waits for its
    placement group until the worker's raylet is back. Only if it does not complete within 240 s is deploy.yml run
    (docs/benchmarks.md, "What make test costs": this restore against a deploy)."""
    before = cluster_processes()
    yield
    labctl("fault", "clear")
    if cluster_processes() == before and serves():
        return
    for host in ("spark1", "spark2"):
        if supervisord_runs(host):
            labctl("exec", host, "--", *SUPERVISORCTL, "start", "all", check=False)
        else:
            # The reboot emptied /run, where the deploy made supervisord's run directory.
            labctl("exec", host, "--", "install", "-d", "-m", "0700", "/run/multinode-vllm")
            labctl("exec", host, "--", str(VENV / "bin" / "supervisord"), "-c", "/etc/multinode-vllm/supervisord.conf")
    if not wait_for(serves, 240, every=3):
        deploy()


def doctor(tmp_path: Path, secrets: dict, *args: str, inventory: Path | str = LAB_INVENTORY):
    """Run doctor.yml into tmp_path; return (its diagnosis as data: findings and lines, the extracted bundle's
    directory, the run). Every file of the bundle, and the run's output, is checked for the lab's secrets first."""
    out = tmp_path / "doctor"
    run = run_playbook("playbooks/doctor.yml", "-e", "doctor_dir=%s" % out, *args, inventory=inventory)
    assert run.rc == 0, run.why
    bundles = sorted(out.glob("doctor-spark1-*.tar.gz"))
    assert len(bundles) == 1, bundles
    extracted = tmp_path / "extracted"
    with tarfile.open(bundles[0]) as tar:
        tar.extractall(extracted)  # noqa: S202  # the bundle this run wrote
    (root,) = list(extracted.iterdir())
    for file in (p for p in root.rglob("*") if p.is_file()):
        text = file.read_text(errors="replace")
        for what, value in secrets.items():
            assert value not in text, "%s holds the lab's %s" % (file.relative_to(extracted), what)
    for what, value in secrets.items():
        assert value not in run.output, "doctor.yml printed the lab's %s" % what
    return json.loads((root / "diagnosis.json").read_text()), root, run


def test_a_healthy_cluster_has_no_finding(served, tmp_path):
    # A log line carrying both secrets, as a crashing process that echoes its environment would leave.
    labctl("exec", "spark1", "--", "sh", "-c",
           "printf 'planted VLLM_API_KEY %s RAY_TOKEN %s\\n' \"$0\" \"$1\" >> /var/log/multinode-vllm/vllm.log",
           served["api key"], served["ray token"])
    diagnosis, root, run = doctor(tmp_path, served)
    lines = diagnosis["lines"]
    record_timing("doctor_2_nodes", run.seconds)
    assert lines == ["no problem found in what was collected"], lines
    # Issue 23's 30 s is a benchmark target (recorded here, reported in docs/benchmarks.md); the test fails only on a
    # run that waited out timeouts (3x the target), which a noisy 2-core machine does not explain.
    assert run.seconds <= 90, "doctor took %.1f s on 2 nodes (target 30 s)" % run.seconds
    assert "<redacted>" in (root / "logs" / "spark1" / "vllm.log").read_text()
    head = json.loads((root / "nodes" / "spark1.json").read_text())
    assert head["ray_node"]["running"] and head["ray_table"]["nodes"], head.get("errors")
    assert head["stack"]["ray"] and head["firewall"]["ruleset"] and head["env_file"]["NCCL_SOCKET_IFNAME"]
    assert head["errors"] == {}, head["errors"]


FAULTS = [
    # (labctl fault arguments, the rule, host and words of doctor's first finding)
    (("mtu", "spark2", "1500"), "fabric_mtu_mismatch", None, "spark2 is not at the MTU of the others (9000)"),
    (("drop-port", "spark1", "6379"), "firewall_port_dropped", "spark1",
     "spark1: nft table inet lab_fault drops TCP port 6379 (ray_gcs_port) to 198.18.200.12 -> "),
    (("link-down", "spark2"), "fabric_link_down", "spark2", "spark2: fabric interface %s (198.18.200.13) is " % FABRIC_IF),
    # The process lab's reboot kills every process of the node (Ray and its share of vLLM) and starts sshd only.
    (("reboot", "spark2"), "raylet_stopped", "spark2", "spark2: no raylet runs on this node -> "),
]


@pytest.mark.parametrize("fault, rule, host, words", FAULTS, ids=[f[0][0] for f in FAULTS])
def test_the_first_line_names_the_fault(served, restore, tmp_path, fault, rule, host, words):
    labctl("fault", *fault)
    diagnosis, _root, _run = doctor(tmp_path, served)
    top = diagnosis["findings"][0]
    assert (top["rule"], top["host"] if host else None) == (rule, host), diagnosis["lines"]
    assert words in diagnosis["lines"][0], diagnosis["lines"]


def test_a_node_ssh_cannot_reach_is_reported_and_the_other_still_read(served, tmp_path):
    inventory = tmp_path / "inventory"
    shutil.copytree(LAB_INVENTORY, inventory)
    spark2 = inventory / "host_vars" / "spark2.yml"
    data = yaml.safe_load(spark2.read_text())
    data["ansible_port"] = 1  # nothing listens there: SSH is refused at once
    spark2.write_text(yaml.safe_dump(data))
    diagnosis, root, _run = doctor(tmp_path, served, inventory=inventory)
    assert diagnosis["lines"][0].startswith("spark2: SSH to the node failed ("), diagnosis["lines"]
    assert json.loads((root / "nodes" / "spark2.json").read_text())["ssh_unreachable"] is True
    head = json.loads((root / "nodes" / "spark1.json").read_text())
    assert head["ray_node"]["running"] and head["system"]["kernel"], head.get("errors")


def node(host: str, *argv: str) -> str:
    return labctl("exec", host, "--", *argv)


def test_a_wrong_interface_in_the_env_file(served, tmp_path):
    # What a hand edit (or another tool's template) leaves: NCCL pinned to the management NIC. Nothing restarts, so
    # only the file says it; putting the file back undoes the fault.
    saved = "/etc/multinode-vllm/node.env.doctor-test"
    node("spark2", "cp", "-p", ENV_FILE, saved)
    try:
        node("spark2", "sed", "-i", "s/^NCCL_SOCKET_IFNAME=.*/NCCL_SOCKET_IFNAME=eth0/", ENV_FILE)
        assert "NCCL_SOCKET_IFNAME=eth0" in node("spark2", "cat", ENV_FILE)
        diagnosis, _root, _run = doctor(tmp_path, served)
    finally:
        node("spark2", "mv", "-f", saved, ENV_FILE)
    top = diagnosis["findings"][0]
    assert (top["rule"], top["host"]) == ("env_ifname_not_fabric", "spark2"), diagnosis["lines"]
    assert diagnosis["lines"][0].startswith("spark2: NCCL_SOCKET_IFNAME=eth0 in the env file -> it names eth0, the "
                                            "management interface, not the fabric interface %s" % FABRIC_IF), \
        diagnosis["lines"]


def test_a_crash_looping_vllm(served, restore, tmp_path):
    # Another server took the API port while vllm serve was down: every start fails with EADDRINUSE after vLLM's
    # imports, later than supervisord's startsecs, so supervisord restarts it again and again (a process is there at
    # most moments, the API never answers): the crash loop a user finds in the morning.
    node("spark1", *SUPERVISORCTL, "stop", "vllm")
    # SO_REUSEADDR: the completions of the deploy left connections of port 8000 in TIME_WAIT.
    holder = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('%s', 8000)); s.listen(); time.sleep(600)  # doctor-test port holder" % HEAD_MGMT)
    node("spark1", "sh", "-c", "setsid python3 -c \"$0\" </dev/null >/dev/null 2>&1 &", holder)
    try:
        assert wait_for(lambda: "python3" in labctl("exec", "spark1", "--", "ss", "-ltnp", "sport = :8000"), 10), \
            "the port holder did not start"
        labctl("exec", "spark1", "--", *SUPERVISORCTL, "start", "vllm", check=False)
        deadline = time.monotonic() + 180
        while "Address already in use" not in labctl("exec", "spark1", "--", "cat", SERVE_LOG, check=False):
            assert time.monotonic() < deadline, "vllm serve did not fail on the held port within 180 s"
            time.sleep(3)
        diagnosis, _root, _run = doctor(tmp_path, served)
    finally:
        labctl("exec", "spark1", "--", "pkill", "-f", "doctor-test port holder", check=False)
    top = diagnosis["findings"][0]
    assert (top["rule"], top["host"]) == ("vllm_address_in_use", "spark1"), diagnosis["lines"]
    assert diagnosis["lines"][0].startswith(("spark1: vllm serve is not running on spark1; its log says: ",
                                             "spark1: vllm serve failed on spark1 and runs again (")), \
        diagnosis["lines"]
    assert "Address already in use" in diagnosis["lines"][0], diagnosis["lines"]


def test_a_full_model_disk(served, tmp_path):
    # A real full filesystem where spark2 reads multinode_model_dir: a 1 MiB tmpfs filled to the last block, mounted
    # over the model directory in spark2's own mount namespace only (the running ranks keep their open files).
    node("spark2", "mount", "-t", "tmpfs", "-o", "size=1m", "doctor-test-full", MODEL_DIR)
    try:
        labctl("exec", "spark2", "--", "dd", "if=/dev/zero", "of=%s/fill" % MODEL_DIR, "bs=64k", check=False)
        assert " 0 " in node("spark2", "df", "-B1", "--output=avail", MODEL_DIR).replace("\n", " ") + " "
        diagnosis, _root, _run = doctor(tmp_path, served)
    finally:
        node("spark2", "umount", MODEL_DIR)
    top = diagnosis["findings"][0]
    assert (top["rule"], top["host"]) == ("model_disk_full", "spark2"), diagnosis["lines"]
    assert diagnosis["lines"][0].startswith("spark2: the model directory %s has 0 B free of 1.0 MiB" % MODEL_DIR), \
        diagnosis["lines"]


def test_the_incident_head_on_its_management_address(served, tmp_path):
    # The incident as users start it by hand: the head without --node-ip-address (Ray picks the default route's
    # address), the worker joined over the fabric. The collection's Ray and vLLM are torn down first. Last in the
    # module, with no restore: nothing after it needs the cluster (the module ends with teardown.yml), which saves a
    # deploy (about 2 minutes of make test on 2 cores).
    result = run_playbook("playbooks/teardown.yml")
    assert result.rc == 0, result.why
    try:
        node("spark1", RAY, "start", "--head", "--port", "6379", "--num-gpus", "1")
        node("spark2", RAY, "start", "--address", "%s:6379" % HEAD_FABRIC, "--node-ip-address", "198.18.200.13",
             "--num-gpus", "1")
        diagnosis, _root, _run = doctor(tmp_path, served)
    finally:
        for host in ("spark2", "spark1"):
            labctl("exec", host, "--", RAY, "stop", "--force", check=False)
    top = diagnosis["findings"][0]
    assert (top["rule"], top["host"]) == ("ray_not_on_fabric", "spark1"), diagnosis["lines"]
    assert "spark1: Ray registered this node as %s, outside the fabric 198.18.200.0/24" % HEAD_MGMT \
        in diagnosis["lines"][0], diagnosis["lines"]
