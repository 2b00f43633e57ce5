# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""This node's Ray processes, from a fake /proc laid out like the lab (nodes share one PID namespace)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._procs import (
    Proc,
    flag_value,
    is_ray_process,
    node_state,
    owner_from_cgroup,
)

VENV = "/venv"
SP = VENV + "/lib/python3.11/site-packages/ray"
MINE = "net:[100]"
OTHER = "net:[200]"


def write_proc(root, pid, ppid, name, cmdline, netns, environ=None):
    base = os.path.join(root, str(pid))
    os.makedirs(os.path.join(base, "ns"))
    with open(os.path.join(base, "stat"), "w") as handle:
        handle.write("%d (%s) S %d 1 1 0 -1\n" % (pid, name, ppid))
    with open(os.path.join(base, "cmdline"), "wb") as handle:
        handle.write(b"\0".join(part.encode() for part in cmdline) + b"\0")
    with open(os.path.join(base, "environ"), "wb") as handle:
        handle.write(b"\0".join(("%s=%s" % kv).encode() for kv in (environ or {}).items()))
    os.symlink(netns, os.path.join(base, "ns", "net"))


@pytest.fixture
def proc_root(tmp_path):
    root = str(tmp_path / "proc")
    os.makedirs(os.path.join(root, "self", "ns"))
    os.symlink(MINE, os.path.join(root, "self", "ns", "net"))
    return root


def managed_node(root, pidfile):
    """supervisord -> ray start --block -> raylet/gcs_server, in this node; another node's raylet beside it."""
    write_proc(root, 10, 1, "supervisord", [VENV + "/bin/python", VENV + "/bin/supervisord", "-c", "/etc/x"], MINE)
    write_proc(root, 11, 10, "ray", [VENV + "/bin/python", VENV + "/bin/ray", "start", "--head",
                                     "--node-ip-address", "198.18.200.12", "--block"], MINE)
    write_proc(root, 12, 11, "gcs_server", [SP + "/core/src/ray/gcs/gcs_server", "--node-ip-address=198.18.200.12"],
               MINE)
    write_proc(root, 13, 11, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.18.200.12"], MINE,
               {"VLLM_HOST_IP": "198.18.200.12", "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "PATH": "/bin",
                "MULTINODE_VLLM_CONFIG_HASH": "abc"})
    write_proc(root, 14, 13, "ray::IDLE", ["ray::IDLE"], MINE)
    write_proc(root, 20, 1, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.18.200.13"], OTHER)
    write_proc(root, 30, 1, "sshd", ["sshd: /usr/sbin/sshd -D"], MINE)
    with open(pidfile, "w") as handle:
        handle.write("10\n")


def test_managed_node(proc_root, tmp_path):
    pidfile = str(tmp_path / "supervisord.pid")
    managed_node(proc_root, pidfile)
    state = node_state(pidfile, proc_root)
    assert state["running"] and state["raylet_pid"] == 13 and state["managed"]
    assert state["node_ip_address"] == "198.18.200.12"
    assert state["start_node_ip_address"] == "198.18.200.12"
    assert state["env"] == {"GLOO_SOCKET_IFNAME": "enp1s0f1np1", "VLLM_HOST_IP": "198.18.200.12"}
    assert state["config_hash"] == "abc"
    assert state["gcs_server"] and state["supervisord_pid"] == 10
    assert [p["pid"] for p in state["processes"]] == [11, 12, 13, 14]  # never spark2's raylet (pid 20), nor sshd
    assert state["foreign_pids"] == []


def test_hand_started_incident_head(proc_root, tmp_path):
    # ray start --head without --node-ip-address daemonizes: raylet's parent is 1, no VLLM_HOST_IP.
    write_proc(proc_root, 40, 1, "gcs_server", [SP + "/core/src/ray/gcs/gcs_server"], MINE)
    write_proc(proc_root, 41, 1, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.19.1.10"],
               MINE, {"PATH": "/bin"})
    write_proc(proc_root, 42, 1, "python", [VENV + "/bin/python", "-m", "ray.util.client.server"], MINE)
    state = node_state(str(tmp_path / "none.pid"), proc_root)
    assert state["running"] and not state["managed"]
    assert state["node_ip_address"] == "198.19.1.10" and state["start_node_ip_address"] is None
    assert state["env"] == {} and state["config_hash"] is None and state["supervisord_pid"] is None
    assert state["foreign_pids"] == [40, 41, 42]


def test_stale_pidfile_is_not_our_supervisord(proc_root, tmp_path):
    pidfile = str(tmp_path / "supervisord.pid")
    write_proc(proc_root, 10, 1, "sleep", ["sleep", "100"], MINE)  # pid reused by something else
    with open(pidfile, "w") as handle:
        handle.write("10")
    assert node_state(pidfile, proc_root)["supervisord_pid"] is None


def test_nothing_running(proc_root, tmp_path):
    state = node_state(str(tmp_path / "x.pid"), proc_root)
    assert not state["running"] and state["processes"] == [] and state["foreign_pids"] == []


@pytest.mark.parametrize(
    "name, cmdline, expected",
    [
        ("raylet", (SP + "/raylet",), True),
        ("gcs_server", (), True),
        ("ray::IDLE", ("ray::IDLE",), True),
        ("python", (VENV + "/bin/python", VENV + "/bin/ray", "start", "--head"), True),
        ("ray", ("ray", "start"), True),
        ("python", (VENV + "/bin/python", "-u", SP + "/dashboard/agent.py"), True),
        ("python", (VENV + "/bin/python", "-m", "ray.util.client.server"), True),
        ("python", (VENV + "/bin/python", VENV + "/bin/ray", "status"), False),
        ("python", (VENV + "/bin/python", "-m", "vllm.entrypoints.openai.api_server"), False),
        ("sshd", ("sshd: root",), False),
    ],
)
def test_is_ray_process(name, cmdline, expected):
    assert is_ray_process(Proc(pid=1, ppid=0, name=name, cmdline=cmdline, netns=MINE)) is expected


@pytest.mark.parametrize(
    "cmdline, value",
    [
        (("ray", "start", "--node-ip-address", "1.2.3.4"), "1.2.3.4"),
        (("ray", "start", "--node-ip-address=1.2.3.4"), "1.2.3.4"),
        (("ray", "start", "--head"), None),
    ],
)
def test_flag_value(cmdline, value):
    assert flag_value(cmdline, "--node-ip-address") == value


def test_auth_state_digests_the_token_file_through_the_process_root(tmp_path):
    from ansible_collections.multinode.vllm.plugins.module_utils._procs import auth_state

    root = tmp_path / "proc" / "42" / "root" / "etc"
    root.mkdir(parents=True)
    (root / "token").write_text("secret-token\n")
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/etc/token"}
    out = auth_state(env, str(tmp_path / "proc"), 42)
    import hashlib
    assert out == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/etc/token",
                   "auth_token_sha256": hashlib.sha256(b"secret-token").hexdigest()}
    assert "secret-token" not in repr(out)
    assert auth_state(dict(env, RAY_AUTH_TOKEN_PATH="/etc/missing"), str(tmp_path / "proc"), 42)["auth_token_sha256"] is None
    assert auth_state({}, str(tmp_path / "proc"), 42) == {}


def test_token_file_state_reports_digest_mode_and_owner_never_the_token(tmp_path):
    from ansible_collections.multinode.vllm.plugins.module_utils._procs import token_file_state
    import hashlib
    token = tmp_path / "ray-auth-token"
    token.write_text("secret-token\n")  # too short for Ray
    token.chmod(0o644)
    state = token_file_state(str(token))
    assert state == {"path": str(token), "exists": True, "sha256": hashlib.sha256(b"secret-token").hexdigest(),
                     "valid": False, "mode": "0644", "uid": os.getuid()}
    assert "secret-token" not in repr(state)
    token.chmod(0o600)
    assert token_file_state(str(token))["mode"] == "0600"
    token.write_text("a" * 64 + "\n")
    assert token_file_state(str(token))["valid"] is True
    token.write_text("a" * 32 + " " + "b" * 32 + "\n")
    assert token_file_state(str(token))["valid"] is False
    assert token_file_state(str(tmp_path / "missing")) == {
        "path": str(tmp_path / "missing"), "exists": False, "sha256": None, "valid": False, "mode": None, "uid": None}


def test_serve_processes_under_our_supervisord_and_left_over(proc_root, tmp_path):
    pidfile = str(tmp_path / "supervisord.pid")
    managed_node(proc_root, pidfile)
    state = node_state(pidfile, proc_root)
    assert (state["serve_pid"], state["serve_pids"], state["serve_managed"]) == (None, [], False)
    # The launcher (sh -c ... exec) became vllm serve under supervisord; its engine core is a child.
    write_proc(proc_root, 50, 10, "vllm", [VENV + "/bin/python", VENV + "/bin/vllm", "serve", "/m"], MINE)
    write_proc(proc_root, 51, 50, "VLLM::EngineCor", ["VLLM::EngineCore"], MINE)
    write_proc(proc_root, 60, 1, "vllm", [VENV + "/bin/vllm", "serve", "/m", "--headless"], OTHER)
    state = node_state(pidfile, proc_root)
    assert (state["serve_pid"], state["serve_pids"], state["serve_managed"]) == (50, [50, 51], True)


def test_the_watchdog_loop_under_our_supervisord_and_its_one_off_runs(proc_root, tmp_path):
    pidfile = str(tmp_path / "supervisord.pid")
    managed_node(proc_root, pidfile)
    script = "/var/lib/multinode-vllm/bin/multinode-watchdog"
    # The recovery's check step (a child of the loop) and a --once run are not the loop.
    write_proc(proc_root, 80, 1, "python", [VENV + "/bin/python", script, "--config", "/c.json", "--check-ray", "120"],
               MINE)
    write_proc(proc_root, 81, 1, "python", [VENV + "/bin/python", script, "--config", "/c.json", "--once"], MINE)
    state = node_state(pidfile, proc_root)
    assert (state["watchdog_pid"], state["watchdog_managed"]) == (None, False)
    write_proc(proc_root, 82, 1, "python", [VENV + "/bin/python", script, "--config", "/c.json"], MINE)
    assert (node_state(pidfile, proc_root)["watchdog_pid"], node_state(pidfile, proc_root)["watchdog_managed"]) == \
        (82, False)
    write_proc(proc_root, 83, 10, "python", [VENV + "/bin/python", script, "--config", "/c.json"], MINE)
    state = node_state(pidfile, proc_root)
    assert state["watchdog_managed"] is True


def test_a_serve_process_started_by_hand_is_not_managed(proc_root, tmp_path):
    write_proc(proc_root, 70, 1, "vllm", [VENV + "/bin/vllm", "serve", "/m", "--headless"], MINE)
    state = node_state(str(tmp_path / "none.pid"), proc_root)
    assert (state["serve_pid"], state["serve_pids"], state["serve_managed"]) == (70, [70], False)


def test_ours_is_what_carries_the_config_hash_even_after_a_reparent(proc_root, tmp_path):
    """issue 17: a stop without the opt-in touches only what this collection started (under any runtime)."""
    pidfile = str(tmp_path / "supervisord.pid")
    managed_node(proc_root, pidfile)
    # A Ray started by hand beside ours (no hash), and one of our workers reparented to init (hash inherited).
    write_proc(proc_root, 40, 1, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.19.1.10"], MINE)
    write_proc(proc_root, 41, 1, "ray::IDLE", ["ray::IDLE"], MINE, {"MULTINODE_VLLM_CONFIG_HASH": "abc"})
    state = node_state(pidfile, proc_root)
    assert state["ours_pids"] == [11, 12, 13, 14, 41] and 40 not in state["ours_pids"]
    assert state["foreign_pids"] == [40] and state["stray_pids"] == [41]
    # Without our supervisord (stopped first), only the hash tells: the reparented worker and the raylet.
    state = node_state(str(tmp_path / "none.pid"), proc_root)
    assert state["ours_pids"] == [13, 41]
    write_proc(proc_root, 70, 1, "vllm", [VENV + "/bin/vllm", "serve", "/m"], MINE)
    write_proc(proc_root, 71, 70, "VLLM::EngineCor", ["VLLM::EngineCore"], MINE, {"MULTINODE_VLLM_CONFIG_HASH": "x"})
    assert node_state(pidfile, proc_root)["serve_ours_pids"] == [71]  # the hand-started server itself is not ours


CID = "4f" * 32


@pytest.mark.parametrize("text, owner", [
    # Modelled on the lab's systemd node (cgroup v1, --cgroupns host: the node container's path, then its unit);
    # test_systemd.py's incident test reads the real one.
    ("12:pids:/multinode-vllm-lab-spark1/docker/%s/system.slice/ray-head.service\n"
     "1:name=systemd:/multinode-vllm-lab-spark1/docker/%s/system.slice/ray-head.service\n" % (CID, CID),
     {"unit": "ray-head.service"}),
    # A container of a node's own dockerd (cgroupfs driver, the lab's docker nodes).
    ("1:name=systemd:/multinode-vllm-lab-spark2/docker/%s\n" % CID, {"container": CID}),
    # Docker with the systemd cgroup driver on cgroup v2 (a stock Debian 12 or DGX OS host).
    ("0::/system.slice/docker-%s.scope\n" % CID, {"container": CID}),
    ("0::/system.slice/ray.service\n", {"unit": "ray.service"}),
    # An SSH login session's `ray start`: nothing restarts it, ray stop is enough.
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("1:name=systemd:/\n", None),
    ("", None),
])
def test_owner_from_cgroup(text, owner):
    assert owner_from_cgroup(text) == owner


def _cgroup(root, pid, path):
    with open(os.path.join(root, str(pid), "cgroup"), "w") as handle:
        handle.write("0::%s\n" % path)


def test_a_foreign_raylet_names_the_unit_that_runs_ray(proc_root, tmp_path):
    # systemd (its own cgroup) -> ray start --block (the unit's main process) -> raylet.
    write_proc(proc_root, 1, 0, "systemd", ["/lib/systemd/systemd"], MINE)
    write_proc(proc_root, 40, 1, "ray", [VENV + "/bin/python", VENV + "/bin/ray", "start", "--head", "--block"], MINE)
    write_proc(proc_root, 50, 40, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.19.1.10"],
               MINE)
    _cgroup(proc_root, 1, "/init.scope")
    for pid in (40, 50):
        _cgroup(proc_root, pid, "/system.slice/ray-head.service")
    assert node_state(str(tmp_path / "none.pid"), proc_root)["foreign_owner"] == {"unit": "ray-head.service"}


def test_a_ray_started_from_a_shell_of_another_service_is_not_that_services_to_stop(proc_root, tmp_path):
    # A CI runner's unit -> sh -> ray start -> raylet: stopping the runner's unit would be wrong; ray stop is enough.
    write_proc(proc_root, 30, 1, "runner", ["/usr/bin/runner"], MINE)
    write_proc(proc_root, 31, 30, "sh", ["/bin/sh", "-c", "ray start --head"], MINE)
    write_proc(proc_root, 40, 31, "ray", [VENV + "/bin/python", VENV + "/bin/ray", "start", "--head"], MINE)
    write_proc(proc_root, 50, 40, "raylet", [SP + "/core/src/ray/raylet/raylet", "--node_ip_address=198.19.1.10"],
               MINE)
    for pid in (30, 31, 40, 50):
        _cgroup(proc_root, pid, "/system.slice/ci-runner.service")
    assert node_state(str(tmp_path / "none.pid"), proc_root)["foreign_owner"] is None


def test_our_raylet_has_no_foreign_owner(proc_root, tmp_path):
    pidfile = str(tmp_path / "supervisord.pid")
    managed_node(proc_root, pidfile)
    with open(os.path.join(proc_root, "13", "cgroup"), "w") as handle:
        handle.write("0::/system.slice/multinode-ray.service\n")
    assert node_state(pidfile, proc_root)["foreign_owner"] is None
