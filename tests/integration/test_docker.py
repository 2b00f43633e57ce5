# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The docker runtime, really run: lab nodes with a Docker daemon each (`labctl up --kind docker`) holding the
lab's node image (lab/build-node-image.py), and the collection deploying Ray and vLLM as containers on them with
the lab inventory unchanged except ``multinode_runtime``."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from conftest import (FABRIC, LABCTL, assert_verify_names_the_incident, first_completion_after, labctl,
                      molecule_destroyed, molecule_scenario_kept, ray_pids, raylet_node_ip, recap, record_timing,
                      run_playbook, serve_pids, wait_for)

IMAGE = "multinode-vllm-lab/node:current"
DOCKER = ("-e", "multinode_runtime=docker")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd, dockerd)"),
]


def docker(node: str, *args: str, check: bool = True) -> str:
    result = subprocess.run([str(LABCTL), "exec", node, "--", "docker", *args], capture_output=True, text=True,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError("docker %s on %s failed: %s" % (" ".join(args), node, result.stderr))
    return result.stdout


def containers(node: str) -> dict[str, dict]:
    """name -> {id, image (ID), started, running} of every container of the node's daemon."""
    ids = docker(node, "ps", "-aq").split()
    if not ids:
        return {}
    found = {}
    for item in json.loads(docker(node, "inspect", *ids)):
        found[item["Name"].lstrip("/")] = {"id": item["Id"], "image": item["Image"],
                                           "started": item["State"]["StartedAt"],
                                           "running": item["State"]["Running"]}
    return found


@pytest.fixture(scope="module")
def lab():
    try:
        # extensions/molecule/docker, all of it but its last destroy: lab down, syntax, lab up 2 --kind docker,
        # deploy.yml, deploy.yml again with nothing changed (molecule's idempotence), verify.yml with the containers on
        # one image ID and a completion. The tests below start from the cluster it leaves serving.
        yield molecule_scenario_kept("docker")
        result = run_playbook("playbooks/teardown.yml", *DOCKER)
        left = {node: containers(node) for node in ("spark1", "spark2")}
        assert result.rc == 0, result.why
        # Teardown leaves no container of the collection behind.
        assert left == {"spark1": {}, "spark2": {}}, left
    finally:
        # Back to a fresh process lab, as the session's other modules expect it (lab2 is session-scoped and brought
        # the lab up once): the scenario's destroy (lab down) removes the containers and every node, with the
        # firewall table the docker deploy left in spark1's and spark2's namespaces (it would drop a 16-node probe
        # from the new nodes).
        molecule_destroyed("docker")
        labctl("up", "2", "--kind", "process")


def test_each_node_daemon_holds_the_same_image_and_its_host_network_is_the_node(lab):
    ids = {node: docker(node, "image", "inspect", "--format", "{{.Id}}", IMAGE).strip() for node in ("spark1", "spark2")}
    assert ids["spark1"] == ids["spark2"] and ids["spark1"].startswith("sha256:"), ids
    # A host-network container of spark2's daemon sees spark2's fabric address and not spark1's.
    seen = docker("spark2", "run", "--rm", "--network", "host", "--entrypoint", "ip", IMAGE, "-o", "-4", "addr")
    assert "198.18.200.13/" in seen and "198.18.200.12/" not in seen, seen


def test_the_scenario_runs_ray_and_vllm_as_containers_and_serves_a_completion(lab):
    # The converge's readiness printed a completion and its tokens/s (molecule's output holds the playbook's).
    assert "completion:" in lab.output and "tokens/s" in lab.output, lab.output[-5000:]
    head, worker = containers("spark1"), containers("spark2")
    assert head["multinode-ray"]["running"] and head["multinode-vllm"]["running"], head
    assert worker["multinode-ray"]["running"] and "multinode-vllm" not in worker, worker
    # One image ID everywhere (the archive's ID, loaded into both daemons).
    image_ids = {c["image"] for c in [*head.values(), *worker.values()]}
    assert len(image_ids) == 1, image_ids
    # The processes are the containers' (host network: in the node's network namespace), from the image's venv.
    assert ray_pids("spark1").get("raylet") and ray_pids("spark2").get("raylet")
    assert serve_pids("spark1")


def _reboot_and_come_back(node: str) -> None:
    """`labctl fault reboot` on a docker node: every process of the node killed, its Docker daemon started again as
    docker.service would be at boot; the containers come back by their restart policy, nothing else."""
    before = containers(node)
    start = time.monotonic()
    labctl("fault", "reboot", node)
    record_timing("docker: reboot %s -> first completion" % node, first_completion_after(start, limit=600))
    after = containers(node)
    assert sorted(after) == sorted(before) and all(c["running"] for c in after.values()), after
    assert all(after[name]["started"] != before[name]["started"] for name in after), (before, after)
    assert raylet_node_ip("spark1") == FABRIC["spark1"] and raylet_node_ip("spark2") == FABRIC["spark2"]
    verify = run_playbook("playbooks/verify.yml", *DOCKER)
    assert verify.rc == 0, verify.why


def test_a_worker_reboot_is_survived_by_the_restart_policy(lab):
    _reboot_and_come_back("spark2")


def test_a_head_reboot_is_survived_by_the_restart_policy(lab):
    _reboot_and_come_back("spark1")


def test_a_node_whose_image_differs_is_refused_naming_it_and_both_ids(lab):
    original = docker("spark2", "image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
    # A real second image: the same rootfs plus one file, committed in spark2's daemon under the tag in use.
    docker("spark2", "rm", "-f", "skew", check=False)
    docker("spark2", "run", "--name", "skew", "--entrypoint", "touch", IMAGE, "/skew")
    docker("spark2", "commit", "skew", IMAGE)
    docker("spark2", "rm", "-f", "skew")
    skewed = docker("spark2", "image", "inspect", "--format", "{{.Id}}", IMAGE).strip()
    assert skewed != original
    before = {node: containers(node) for node in ("spark1", "spark2")}
    try:
        run = run_playbook("playbooks/deploy.yml", *DOCKER, timeout=900)
    finally:
        docker("spark2", "tag", original, IMAGE)
        docker("spark2", "rmi", skewed, check=False)
    assert run.rc != 0
    assert "image_id differs between nodes" in run.output, run.output[-4000:]
    assert original in run.output and skewed in run.output
    assert all(counts["changed"] == 0 for counts in recap(run.output).values()), recap(run.output)
    assert {node: containers(node) for node in ("spark1", "spark2")} == before


def test_switching_backends_leaves_nothing_of_the_other_running(lab):
    # One way only, ray to native, and after the reboots (they need Ray): the way back (native to ray, spark2's native
    # rank and its container removed) is the same removal of a program no longer wanted, proved for the process
    # runtime in test_serve.py; the incident below starts with teardown.yml, so nothing needs Ray back. That saves a
    # deploy (about 2 minutes of make test on 2 cores).
    native = run_playbook("playbooks/deploy.yml", *DOCKER, "-e", "vllm_backend=native", timeout=900)
    assert native.rc == 0, native.why
    assert "completion:" in native.output
    # Backend native runs no Ray: the Ray containers (restart policy always) are gone from both nodes, and with them
    # every Ray process; vllm serve runs in a container on each node.
    for node in FABRIC:
        found = containers(node)
        assert sorted(found) == ["multinode-vllm"] and found["multinode-vllm"]["running"], (node, found)
        assert wait_for(lambda node=node: ray_pids(node) == {}, 30), (node, ray_pids(node))
        assert serve_pids(node), node


def test_the_incident_in_hand_started_containers_is_caught_by_verify_and_repaired_by_deploy(lab):
    torn = run_playbook("playbooks/teardown.yml", *DOCKER)
    assert torn.rc == 0, torn.why
    # The incident as users start it under docker: the head's container without --node-ip-address.
    hand = ("run", "-d", "--network", "host", "--ipc", "host", "--restart", "unless-stopped", "--entrypoint", "ray")
    docker("spark1", *hand, "--name", "ray-head", IMAGE, "start", "--block", "--head", "--port", "6379",
           "--num-gpus", "1")
    docker("spark2", *hand, "--name", "ray-worker", IMAGE, "start", "--block", "--address",
           FABRIC["spark1"] + ":6379", "--node-ip-address", FABRIC["spark2"], "--num-gpus", "1")
    assert_verify_names_the_incident(*DOCKER)
    # The deploy names the container, takes its restart policy off and stops it (ray stop alone would be undone by
    # the policy, and a daemon restart would bring it back), then starts the managed Ray on the fabric address.
    repair = run_playbook("playbooks/deploy.yml", *DOCKER, "-e", '{"serve_enabled": false, "ray_stop_foreign": true}',
                          timeout=900)
    assert repair.rc == 0, repair.why
    assert "run by the container" in repair.output, repair.output[-5000:]
    for node, name in (("spark1", "ray-head"), ("spark2", "ray-worker")):
        state = docker(node, "inspect", "--format", "{{.State.Running}} {{.HostConfig.RestartPolicy.Name}}", name)
        assert state.split() == ["false", "no"], (node, state)
        docker(node, "rm", name)
    assert raylet_node_ip("spark1") == FABRIC["spark1"] and raylet_node_ip("spark2") == FABRIC["spark2"]
    assert run_playbook("playbooks/verify.yml", *DOCKER, "-e", '{"serve_enabled": false}').rc == 0
