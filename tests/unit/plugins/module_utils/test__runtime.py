# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What each runtime renders from the one env and argument list (_env.py output)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess

import pytest

from ansible_collections.multinode.vllm.plugins.module_utils._env import env_file
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError
from ansible_collections.multinode.vllm.plugins.module_utils._ray_start import RaySettings, ray_start_args
from ansible_collections.multinode.vllm.plugins.module_utils._runtime import (
    RuntimeConfigError,
    HASH_ENV,
    HASH_LABEL,
    config_hash,
    docker_container_params,
    render,
    supervisor_program,
    supervisord_config,
    systemd_unit,
)

ENV = {
    "VLLM_HOST_IP": "198.18.200.13",
    "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_SOCKET_IFNAME": "=enp1s0f1np1",
    "NCCL_IB_HCA": "=rocep1s0f1:1",
}
VENV = "/opt/multinode-vllm/venv"
ARGS = ray_start_args("worker", "198.18.200.13", "198.18.200.12", RaySettings(num_gpus=1))
HEAD_ARGS = ray_start_args("head", "198.18.200.12", "198.18.200.12", RaySettings())


def _process(**kw):
    return render("process", "ray", ENV, VENV + "/bin/ray", ARGS, "/etc/multinode-vllm/node.env",
                  python=VENV + "/bin/python", launcher="/var/lib/multinode-vllm/bin/multinode-env-exec", **kw)


# --- config hash -------------------------------------------------------------


@pytest.mark.parametrize(
    "env, args, extra, same",
    [
        (dict(reversed(list(ENV.items()))), ARGS, None, True),  # key order is irrelevant
        (dict(ENV, VLLM_HOST_IP="198.19.2.10"), ARGS, None, False),  # an env value
        (dict(ENV, NEW="1"), ARGS, None, False),  # an added key
        (ENV, ARGS + ["--num-cpus", "4"], None, False),  # a flag
        (ENV, list(reversed(ARGS)), None, False),  # argument order matters
        (ENV, ARGS, {"image": "other"}, False),  # runtime setting
    ],
)
def test_config_hash_changes_exactly_on_change(env, args, extra, same):
    assert (config_hash(env, args, extra) == config_hash(ENV, ARGS)) is same


def test_config_hash_is_short_and_stable():
    digest = config_hash(ENV, ARGS)
    assert len(digest) == 16 and digest == config_hash(dict(ENV), list(ARGS))


# --- process runtime (supervisord) -------------------------------------------


def _ini(text):
    parser = configparser.RawConfigParser()
    parser.read_string(text)
    return parser


def test_supervisor_program_runs_the_env_file_through_the_launcher():
    out = _process()
    section = _ini(out["supervisor_program"])["program:ray"]
    command = shlex.split(section["command"])
    assert command[:4] == [VENV + "/bin/python", "/var/lib/multinode-vllm/bin/multinode-env-exec",
                           "/etc/multinode-vllm/node.env", VENV + "/bin/ray"]
    assert command[4:] == ARGS
    assert "--node-ip-address" in command and command[-1] == "--block"
    # The env is not copied into the supervisor config: only the hash is.
    assert section["environment"] == '%s="%s"' % (HASH_ENV, out["hash"])
    assert "198.18.200.13" not in section["environment"]
    assert section["autorestart"] == "true" and section["stopasgroup"] == "true" and section["killasgroup"] == "true"
    assert section["stdout_logfile"] == "/var/log/multinode-vllm/ray.log"


def test_supervisor_escapes_percent():
    text = supervisor_program("ray", ["/bin/echo", "50%"], "abc", "/var/log/x")
    assert "50%%" in text


def test_supervisord_config_is_per_node():
    conf = _ini(supervisord_config("/run/multinode-vllm", "/var/log/multinode-vllm", "/etc/multinode-vllm/supervisor.d"))
    assert conf["supervisord"]["pidfile"] == "/run/multinode-vllm/supervisord.pid"
    assert conf["unix_http_server"]["file"] == "/run/multinode-vllm/supervisor.sock"
    assert conf["supervisorctl"]["serverurl"] == "unix:///run/multinode-vllm/supervisor.sock"
    assert conf["include"]["files"] == "/etc/multinode-vllm/supervisor.d/*.conf"


@pytest.mark.parametrize("name", ["", "ray prog", "-x", "a/b"])
def test_bad_program_names_are_refused(name):
    with pytest.raises(RuntimeConfigError):
        supervisor_program(name, ["/bin/true"], "abc", "/var/log")


def test_process_runtime_needs_the_launcher():
    with pytest.raises(RuntimeConfigError, match="launcher"):
        render("process", "ray", ENV, VENV + "/bin/ray", ARGS, "/etc/multinode-vllm/node.env")


# --- systemd ------------------------------------------------------------------


def test_systemd_unit_uses_the_env_file_and_the_args():
    out = render("systemd", "ray", ENV, VENV + "/bin/ray", HEAD_ARGS, "/etc/multinode-vllm/node.env")
    unit = out["systemd_unit"]
    lines = unit.splitlines()
    assert "EnvironmentFile=/etc/multinode-vllm/node.env" in lines
    assert "Environment=%s=%s" % (HASH_ENV, out["hash"]) in lines
    exec_start = [line for line in lines if line.startswith("ExecStart=")]
    assert exec_start == ["ExecStart=" + " ".join([VENV + "/bin/ray"] + HEAD_ARGS)]
    assert "LimitMEMLOCK=infinity" in lines and "KillMode=control-group" in lines
    # Restarted whatever its exit status, as under supervisord and docker (vllm serve exits 0 on a dead engine).
    assert "Restart=always" in lines
    # No environment value is duplicated into the unit.
    assert "VLLM_HOST_IP" not in unit


@pytest.mark.parametrize(
    "arg, word",
    [
        ("plain", "plain"),
        ("with space", '"with space"'),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ('a"b', '"a\\"b"'),
    ],
)
def test_systemd_quoting(arg, word):
    unit = systemd_unit("x", "/etc/env", "/bin/prog", [arg], "h")
    assert "ExecStart=/bin/prog %s\n" % word in unit


@pytest.mark.parametrize("program, env_path", [("ray", "/etc/env"), ("/bin/ray", "node.env")])
def test_systemd_needs_absolute_paths(program, env_path):
    with pytest.raises(RuntimeConfigError, match="absolute"):
        systemd_unit("x", env_path, program, [], "h")


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify(tmp_path):
    out = render("systemd", "ray", ENV, "/bin/true", HEAD_ARGS, str(tmp_path / "node.env"))
    (tmp_path / "node.env").write_text(env_file(ENV))
    unit = tmp_path / "multinode-ray.service"
    unit.write_text(out["systemd_unit"])
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    # An unknown key or a bad value is only a warning naming the file (the exit status stays 0).
    assert str(unit) not in proc.stderr, proc.stderr


# --- docker -------------------------------------------------------------------


def test_docker_params():
    out = render("docker", "multinode-ray", ENV, "ray", ARGS, "/etc/multinode-vllm/node.env",
                 image="example/vllm:gb10", model_dir="/models", shm_size="32g", role="worker")
    params = out["docker"]
    assert params["command"] == ["ray"] + ARGS and params["command"][-1] == "--block"
    assert params["env_file"] == "/etc/multinode-vllm/node.env"
    assert params["env"] == {HASH_ENV: out["hash"]}
    assert params["network_mode"] == "host" and params["ipc_mode"] == "host"
    assert params["device_requests"] == [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    assert params["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert params["capabilities"] == ["IPC_LOCK"]
    assert params["ulimits"] == ["memlock:-1:-1"]
    assert params["shm_size"] == "32g"
    assert params["restart_policy"] == "unless-stopped"
    # The env file's directory (Ray's token, vLLM's non-carry-over list) and the model, both read only; Ray's
    # session directory and vLLM's IPC sockets in one /tmp shared by the node's containers (with the host's process
    # table), so vllm serve's Ray driver finds the raylet and the Ray workers reach the EngineCore.
    assert params["mounts"] == [
        {"type": "bind", "source": "/etc/multinode-vllm", "target": "/etc/multinode-vllm", "read_only": True},
        {"type": "bind", "source": "/models", "target": "/models", "read_only": True},
        {"type": "bind", "source": "/var/lib/multinode-vllm/container-tmp", "target": "/tmp", "read_only": False},
    ]
    assert params["pid_mode"] == ""
    assert params["labels"][HASH_LABEL] == out["hash"] and params["labels"]["multinode.vllm.role"] == "worker"
    assert "VLLM_HOST_IP" not in params["env"]


def test_docker_image_change_changes_the_hash():
    a = render("docker", "c", ENV, "ray", ARGS, "/e", image="a:1")["hash"]
    b = render("docker", "c", ENV, "ray", ARGS, "/e", image="a:2")["hash"]
    assert a != b


@pytest.mark.parametrize("gpus, count", [("all", -1), ("2", 2)])
def test_docker_gpu_count(gpus, count):
    params = docker_container_params("c", "img", "/e", "ray", [], "h", gpus=gpus)
    assert params["device_requests"][0]["count"] == count


def test_a_container_can_join_another_ones_process_namespace():
    # vllm serve under backend ray joins the Ray container's: its driver finds the raylet, and it ends with Ray.
    params = render("docker", "vllm", ENV, "vllm", ARGS, "/e", image="img", pid_container="multinode-ray")
    assert params["docker"]["pid_mode"] == "container:multinode-ray"
    assert params["hash"] != render("docker", "vllm", ENV, "vllm", ARGS, "/e", image="img")["hash"]


def test_docker_no_gpu_request_and_no_rdma_devices_when_switched_off():
    # The lab's CPU nodes: a device request for the nvidia driver, or /dev/infiniband, would fail the container.
    params = render("docker", "c", ENV, "ray", ARGS, "/e", image="img", gpus="none", rdma=False)["docker"]
    assert params["device_requests"] == []
    assert params["devices"] == [] and params["capabilities"] == [] and params["ulimits"] == []
    default = render("docker", "c", ENV, "ray", ARGS, "/e", image="img")["docker"]
    assert default["devices"] == ["/dev/infiniband:/dev/infiniband:rwm"]
    assert default["capabilities"] == ["IPC_LOCK"] and default["ulimits"] == ["memlock:-1:-1"]
    assert default["device_requests"][0]["driver"] == "nvidia"


@pytest.mark.parametrize("kw", [{"gpus": "none"}, {"rdma": False}, {"shm_size": "1g"}, {"model_dir": "/m"}])
def test_a_container_setting_changes_the_hash(kw):
    # The hash is the container's env and label: a changed setting recreates the container.
    assert render("docker", "c", ENV, "ray", ARGS, "/e", image="img", **kw)["hash"] != \
        render("docker", "c", ENV, "ray", ARGS, "/e", image="img")["hash"]


@pytest.mark.parametrize("kw, match", [({"image": ""}, "no image"), ({"image": "i", "gpus": "some"}, "gpus")])
def test_docker_bad_input(kw, match):
    with pytest.raises(RuntimeConfigError, match=match):
        docker_container_params("c", env_file_path="/e", program="ray", args=[], digest="h", **kw)


def test_same_inputs_same_hash_across_runtimes_differ_by_runtime():
    # One truth: the env and args are the same; the runtime is part of the hash.
    hashes = {rt: render(rt, "ray", ENV, VENV + "/bin/ray", ARGS, "/etc/env", python="p", launcher="l",
                         image="img")["hash"] for rt in ("process", "systemd", "docker")}
    assert len(set(hashes.values())) == 3


def test_unknown_runtime():
    with pytest.raises(RuntimeConfigError, match="runtime 'k8s'"):
        render("k8s", "ray", ENV, "ray", ARGS, "/e")


def test_restart_on_changes_the_hash_and_never_carries_the_value():
    def rendered(restart_on):
        return render("systemd", "ray", ENV, VENV + "/bin/ray", HEAD_ARGS, "/etc/multinode-vllm/node.env",
                      restart_on=restart_on)

    plain = rendered(None)
    one = rendered({"auth_token_sha256": "a" * 64})
    assert one["hash"] != plain["hash"]
    assert one["hash"] == rendered({"auth_token_sha256": "a" * 64})["hash"]
    assert one["hash"] != rendered({"auth_token_sha256": "b" * 64})["hash"]
    # Only the config hash reaches the unit; the digest itself does not.
    assert "a" * 64 not in one["systemd_unit"]


def test_docker_without_an_image_names_the_variable_to_set():
    """issue 20: the default runtime is docker; an empty image must name the inventory variable, not 'the image'."""
    with pytest.raises(RuntimeConfigError, match="ray: multinode_runtime is docker .* but ray_docker_image is empty; "
                                                 "set ray_docker_image"):
        render("docker", "ray", {"A": "1"}, "ray", ["start"], "/etc/multinode-vllm/node.env", image="",
               image_var="ray_docker_image")


def test_a_bad_setting_is_a_runtime_config_error_not_a_fabric_error():
    """Issue 18: a process the runtime cannot render is a RuntimeConfigError, not the fabric's FabricError."""
    with pytest.raises(RuntimeConfigError) as caught:
        render("k8s", "ray", ENV, "ray", ARGS, "/e")
    assert not isinstance(caught.value, FabricError)
