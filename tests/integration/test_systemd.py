# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd runtime, really run: lab nodes booted by systemd (`labctl up --kind systemd`: each node a container of
the lab's node image with systemd as PID 1, in the node's network namespace, reached over SSH by its own sshd), the
collection deploying Ray and vLLM as units with the lab inventory unchanged except ``multinode_runtime``, and a
node's reboot (its systemd halted and booted again, its nftables state gone) survived with no operator action.

The tests run in file order and share one lab; the module ends with a fresh process lab, as the session's other
modules expect (lab2 is session-scoped)."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from conftest import (FABRIC, LABCTL, WATCHDOG_ON, assert_verify_names_the_incident, completion, first_completion_after,
                      hang_a_rank, labctl, molecule_destroyed, molecule_scenario_kept, ray_pids, raylet_node_ip, recap,
                      record_timing, run_playbook, serve_pids, wait_for)

SYSTEMD = ("-e", "multinode_runtime=systemd")
UNITS = ("multinode-ray.service", "multinode-vllm.service", "multinode-vllm-firewall.service",
         "multinode-watchdog.service")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (network namespaces, sshd, dockerd)"),
]


def node_run(node: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(LABCTL), "exec", node, "--", *cmd], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError("%s on %s failed: %s" % (" ".join(cmd), node, result.stderr))
    return result


def units(node: str) -> dict[str, dict[str, str]]:
    """unit -> its systemd properties of interest; a unit systemd does not know has LoadState not-found."""
    props = "Id,LoadState,ActiveState,UnitFileState,MainPID,ActiveEnterTimestampMonotonic,NRestarts"
    text = node_run(node, "systemctl", "show", "-p", props, *UNITS).stdout
    found = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        found[fields["Id"]] = fields
    return found


def running(node: str) -> dict[str, str]:
    """unit -> main pid of the collection's units active on the node."""
    return {name: u["MainPID"] for name, u in units(node).items() if u["ActiveState"] == "active"}


@pytest.fixture(scope="module")
def lab():
    try:
        # extensions/molecule/systemd, all of it but its last destroy: lab down, syntax, lab up 2 --kind systemd,
        # deploy.yml, deploy.yml again with nothing changed (molecule's idempotence), verify.yml with the units active
        # and enabled and a completion. The tests below start from the cluster it leaves serving.
        yield molecule_scenario_kept("systemd")
        result = run_playbook("playbooks/teardown.yml", *SYSTEMD)
        assert result.rc == 0, result.why
        # Teardown leaves no unit (file, enabled or active) and no Ray or vLLM process on any node.
        for node in ("spark1", "spark2"):
            left = {name: u for name, u in units(node).items()
                    if u["LoadState"] != "not-found" and name != "multinode-vllm-firewall.service"}
            assert left == {}, (node, left)
            assert ray_pids(node) == {} and serve_pids(node) == [], node
    finally:
        # Back to a fresh process lab for the session's other modules (the scenario's destroy, lab down, removes the
        # node containers).
        molecule_destroyed("systemd")
        labctl("up", "2", "--kind", "process")


def test_the_nodes_are_booted_by_systemd_and_reached_over_ssh(lab):
    for node, fabric_ip in FABRIC.items():
        assert node_run(node, "systemctl", "is-system-running").stdout.strip() == "running"
        assert node_run(node, "cat", "/proc/1/comm").stdout.strip() == "systemd"
        # The node's own network: its fabric address, not the other node's.
        addresses = node_run(node, "ip", "-o", "-4", "addr").stdout
        assert fabric_ip + "/" in addresses and [ip for n, ip in FABRIC.items() if n != node][0] not in addresses
    ping = subprocess.run([str(LABCTL), "ssh", "spark2", "--", "cat", "/proc/1/comm"], capture_output=True,
                          text=True, check=False)
    assert ping.stdout.strip() == "systemd", ping.stderr


def test_the_scenario_runs_ray_and_vllm_as_units_and_serves_a_completion(lab):
    # The converge's readiness printed a completion and its tokens/s (molecule's output holds the playbook's).
    assert "completion:" in lab.output and "tokens/s" in lab.output, lab.output[-5000:]
    # Readiness read vLLM's journal for its progress lines (not a log file, which a unit does not write).
    assert "cannot read" not in lab.output, lab.output[-5000:]
    head, worker = units("spark1"), units("spark2")
    for node, found in (("spark1", head), ("spark2", worker)):
        assert found["multinode-ray.service"]["ActiveState"] == "active", (node, found)
        assert found["multinode-ray.service"]["UnitFileState"] == "enabled", (node, found)
        # The firewall's boot unit: enabled for the next boot (it loaded nothing yet: the table came from the role).
        assert found["multinode-vllm-firewall.service"]["UnitFileState"] == "enabled", (node, found)
    assert head["multinode-vllm.service"]["ActiveState"] == "active", head
    assert worker["multinode-vllm.service"]["LoadState"] == "not-found", worker
    assert raylet_node_ip("spark1") == FABRIC["spark1"] and raylet_node_ip("spark2") == FABRIC["spark2"]
    assert serve_pids("spark1") and completion()


def _reboot_and_come_back(node: str) -> float:
    start = time.monotonic()
    labctl("fault", "reboot", node)
    seconds = first_completion_after(start, limit=600)
    record_timing("systemd: reboot %s -> first completion" % node, seconds)
    # The table was put back by the boot unit, before Ray started (systemd's own record of the order).
    after = units(node)
    firewall, ray = after["multinode-vllm-firewall.service"], after["multinode-ray.service"]
    assert firewall["ActiveState"] == "active", firewall
    assert 0 < int(firewall["ActiveEnterTimestampMonotonic"]) <= int(ray["ActiveEnterTimestampMonotonic"]), after
    tables = node_run(node, "nft", "list", "tables").stdout
    assert "multinode_vllm" in tables, tables
    # Every node back on its fabric address, and the cluster passes verify with nobody touching it.
    assert raylet_node_ip("spark1") == FABRIC["spark1"] and raylet_node_ip("spark2") == FABRIC["spark2"]
    verify = run_playbook("playbooks/verify.yml", *SYSTEMD)
    assert verify.rc == 0, verify.why
    return seconds


def test_a_worker_reboot_is_survived_with_no_operator_action(lab):
    _reboot_and_come_back("spark2")


def test_a_head_reboot_is_survived_with_no_operator_action(lab):
    _reboot_and_come_back("spark1")


def test_the_watchdog_unit_recovers_a_hung_rank_with_no_operator_action(lab):
    # The deploy only adds the watchdog's unit (Ray and vLLM keep running); the switch below removes it again
    # (serve_watchdog_enabled is false in the lab inventory).
    run = run_playbook("playbooks/deploy.yml", *SYSTEMD, *WATCHDOG_ON, timeout=900)
    assert run.rc == 0, run.why
    assert {host: counts["changed"] for host, counts in recap(run.output).items()}["spark2"] == 0, recap(run.output)
    assert units("spark1")["multinode-watchdog.service"]["ActiveState"] == "active", units("spark1")
    hung = hang_a_rank("spark2")
    record_timing("systemd: watchdog, hung rank detected", hung["detected"])
    record_timing("systemd: watchdog, hung rank to first completion", hung["back"])
    assert (hung["recovery"]["cause"], hung["recovery"]["outcome"]) == ("completion_hung", "recovered"), hung
    assert hung["detected"] <= 30, hung
    journal = node_run("spark1", "journalctl", "-u", "multinode-watchdog.service", "--no-pager").stdout
    assert "recovery-step step=start_vllm cause=completion_hung program=systemctl rc=0" in journal, journal[-3000:]


def test_switching_backends_leaves_nothing_of_the_other_running(lab):
    # One way only, ray to native, and after the reboots (they need Ray): the way back (native to ray, spark2's native
    # rank and its unit removed) is the same removal of a program no longer wanted, proved for the process
    # runtime in test_serve.py; the incident below starts with teardown.yml, so nothing needs Ray back. That saves a
    # deploy (about 2 minutes of make test on 2 cores).
    native = run_playbook("playbooks/deploy.yml", *SYSTEMD, "-e", "vllm_backend=native", timeout=900)
    assert native.rc == 0, native.why
    assert "completion:" in native.output
    # Backend native runs no Ray: the Ray units (Restart=always, enabled for boot) are stopped and removed from both
    # nodes, and with them every Ray process; vllm serve runs as a unit on each node.
    for node in FABRIC:
        found = units(node)
        assert found["multinode-ray.service"]["LoadState"] == "not-found", (node, found)
        assert found["multinode-vllm.service"]["ActiveState"] == "active", (node, found)
        assert wait_for(lambda node=node: ray_pids(node) == {}, 30), (node, ray_pids(node))
        assert serve_pids(node), node


RAY = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/ray"


def _hand_unit(node: str, name: str, *args: str) -> None:
    """A unit written by hand, as a user would run Ray on a systemd host (restarted whatever its exit)."""
    unit = "[Service]\nExecStart=%s start --block %s\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n" % (
        RAY, " ".join(args))
    subprocess.run([str(LABCTL), "exec", node, "--", "sh", "-c", "cat > /etc/systemd/system/%s" % name],
                   input=unit, text=True, check=True)
    node_run(node, "systemctl", "daemon-reload")
    node_run(node, "systemctl", "enable", "--now", name)


def test_the_incident_in_hand_written_units_is_caught_by_verify_and_repaired_by_deploy(lab):
    torn = run_playbook("playbooks/teardown.yml", *SYSTEMD)
    assert torn.rc == 0, torn.why
    # The incident: the head's unit without --node-ip-address (Ray takes the default route's, management, address).
    _hand_unit("spark1", "ray-head.service", "--head", "--port", "6379", "--num-gpus", "1")
    _hand_unit("spark2", "ray-worker.service", "--address", FABRIC["spark1"] + ":6379",
               "--node-ip-address", FABRIC["spark2"], "--num-gpus", "1")
    assert_verify_names_the_incident(*SYSTEMD)
    # The deploy names the unit, stops and disables it (Restart=always would start it again after ray stop, and
    # enabled it would come back at the next boot), and starts the managed Ray on the fabric address.
    repair = run_playbook("playbooks/deploy.yml", *SYSTEMD, "-e", '{"serve_enabled": false, "ray_stop_foreign": true}',
                          timeout=900)
    assert repair.rc == 0, repair.why
    assert "run by the systemd unit ray-head.service" in repair.output, repair.output[-5000:]
    for node, unit in (("spark1", "ray-head.service"), ("spark2", "ray-worker.service")):
        state = node_run(node, "systemctl", "show", "-p", "ActiveState,UnitFileState", unit).stdout
        # Stopped (failed: ray start --block exits non-zero on SIGTERM) and disabled.
        assert "ActiveState=active" not in state and "UnitFileState=disabled" in state, (node, state)
        node_run(node, "rm", "/etc/systemd/system/" + unit)
    assert raylet_node_ip("spark1") == FABRIC["spark1"] and raylet_node_ip("spark2") == FABRIC["spark2"]
    assert run_playbook("playbooks/verify.yml", *SYSTEMD, "-e", '{"serve_enabled": false}').rc == 0
