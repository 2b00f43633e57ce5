# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Render one node process (Ray now, vLLM later) for each runtime.

Every function takes what ``_env.py`` builds (the node's environment and the
argument list after the program name) and renders it for one runtime:

- ``process``: a supervisord program section (the lab, CI, hosts without init);
- ``systemd``: a unit file using ``EnvironmentFile=`` (bare metal with a venv);
- ``docker``: ``community.docker.docker_container`` parameters.

No runtime writes its own copy of the environment: the env file rendered by
``_env.env_file`` is read by all three (supervisord through the launcher,
``_node_env_exec``; systemd through ``EnvironmentFile=``; docker through
``env_file``). A process with env files of its own (``env_files``: vllm serve's
environment and its 0600 secret file) runs through the launcher under every
runtime, which reads the node env file and then those, in one layer: systemd
would read their values differently, and docker's ``env_file`` would show a
secret in ``docker inspect``.

``config_hash`` is the restart trigger: it changes exactly when the
environment, the arguments or the runtime settings change, and is carried in
the running process's environment (``MULTINODE_VLLM_CONFIG_HASH``) or the
container's label, so a deploy compares what runs with what it would render.
Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import hashlib
import posixpath
import json
import re
import shlex
from typing import Any, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import MORE as LAUNCHER_MORE
from ansible_collections.multinode.vllm.plugins.module_utils._text import one_line_error

RUNTIMES = ("process", "systemd", "docker")
# Under docker, the Ray and vLLM containers of a node share one /tmp, as processes of one host do: Ray's session
# directory (a driver reaches its raylet's sockets there) and vLLM's IPC sockets (shm_broadcast's local readers in
# the Ray container connect to the EngineCore's ipc:// path under /tmp) live in it.
CONTAINER_TMP = "/var/lib/multinode-vllm/container-tmp"

# Name of the variable that carries the config hash into the running process.
HASH_ENV = "MULTINODE_VLLM_CONFIG_HASH"
# Docker label with the same value.
HASH_LABEL = "multinode.vllm.config-hash"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RuntimeConfigError(MultinodeError):
    """A process that cannot be rendered for its runtime (a name, a path, a word, the image); the message names it."""


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name or ""):
        raise RuntimeConfigError("%s %r must be letters, digits, '.', '_' or '-' (and not start with a punctuation)"
                                 % (what, name))


def _command_words(command: Sequence[Any]) -> list[tuple[str, str]]:
    return [("word %d of the command" % index, str(word)) for index, word in enumerate(command)]


def _check_lines(where: str, named: Sequence[tuple[str, str]]) -> None:
    # The last line of defence: the roles' filters refuse these earlier, naming the inventory variable.
    for what, value in named:
        error = one_line_error("%s, %s" % (where, what), value)
        if error:
            raise RuntimeConfigError(error + "; it comes from vllm_model, vllm_served_model_name, vllm_extra_args, "
                                     "ray_extra_args or a path variable of the role")


def config_hash(env: Mapping[str, str], args: Sequence[str], extra: Optional[Mapping[str, Any]] = None) -> str:
    """A short, stable digest of what a process runs with.

    Key order of ``env`` does not matter; argument order does. ``extra`` holds
    runtime settings that also need a restart when changed (image, program path).
    """
    payload = json.dumps(
        {"env": {str(k): str(v) for k, v in env.items()}, "args": [str(a) for a in args], "extra": extra or {}},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------------------
# process runtime: supervisord
# ---------------------------------------------------------------------------


def launcher_command(python: str, launcher: str, env_file_path: str, program: str, args: Sequence[str],
                     env_files: Sequence[str] = ()) -> list[str]:
    """The command the runtime runs: the launcher loads the env file (then each of ``env_files``, a later file
    winning), then execs the program."""
    more = [word for path in env_files for word in (LAUNCHER_MORE, str(path))]
    return [python, launcher, env_file_path, *more, program] + [str(a) for a in args]


def _supervisor_value(value: str) -> str:
    # supervisord expands %(name)s in values: a literal % is written %%.
    return value.replace("%", "%%")


def _supervisor_command(command: Sequence[str]) -> str:
    """The ``command=`` value: supervisor reads it back with ``shlex.split`` after its config parser.

    Two things of that parser reach inside shell quotes: a ';' or '#' after whitespace starts an inline comment
    (the rest of the line is dropped), and '%(here)s' is replaced before '%%' is expanded. Closing and reopening
    the quote ('' is nothing to shlex) keeps both pairs apart; either only occurs in a word shlex.quote quoted.
    """
    words = []
    for part in command:
        word = shlex.quote(str(part))
        if word.startswith("'"):
            word = word.replace(";", "'';").replace("#", "''#").replace("%(", "%''(")
        words.append(word)
    return _supervisor_value(" ".join(words))


def supervisor_program(
    name: str,
    command: Sequence[str],
    digest: str,
    log_dir: str,
    stop_wait_secs: int = 30,
) -> str:
    """The ``[program:<name>]`` section (an include file of the node's supervisord).

    The environment is NOT copied here: the launcher in ``command`` reads the
    env file. Only the config hash is set, so the running process shows which
    configuration it was started with.
    """
    _check_name(name, "program name")
    if not command:
        raise RuntimeConfigError("program %s: the command is empty" % name)
    _check_lines("program %s" % name, _command_words(command) + [("log_dir", log_dir)])
    lines = [
        "[program:%s]" % name,
        "command=%s" % _supervisor_command(command),
        'environment=%s="%s"' % (HASH_ENV, digest),
        "autostart=true",
        "autorestart=true",
        "startsecs=5",
        "startretries=3",
        # ray start --block stops its node processes on SIGTERM; the group
        # signal catches anything it leaves behind.
        "stopsignal=TERM",
        "stopwaitsecs=%d" % int(stop_wait_secs),
        "stopasgroup=true",
        "killasgroup=true",
        "redirect_stderr=true",
        "stdout_logfile=%s" % _supervisor_value("%s/%s.log" % (log_dir.rstrip("/"), name)),
        "stdout_logfile_maxbytes=50MB",
        "stdout_logfile_backups=3",
    ]
    return "\n".join(lines) + "\n"


def supervisord_config(run_dir: str, log_dir: str, include_dir: str) -> str:
    """The node's own supervisord (one per node, not the distribution's)."""
    run_dir = run_dir.rstrip("/")
    log_dir = log_dir.rstrip("/")
    lines = [
        "[unix_http_server]",
        "file=%s/supervisor.sock" % run_dir,
        "chmod=0700",
        "",
        "[supervisord]",
        "pidfile=%s/supervisord.pid" % run_dir,
        "logfile=%s/supervisord.log" % log_dir,
        "logfile_maxbytes=10MB",
        "logfile_backups=3",
        "childlogdir=%s" % log_dir,
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        "serverurl=unix://%s/supervisor.sock" % run_dir,
        "",
        "[include]",
        "files = %s/*.conf" % include_dir.rstrip("/"),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# systemd runtime
# ---------------------------------------------------------------------------


def _systemd_quote(arg: str) -> str:
    """One ExecStart= word: specifiers (%) and variables ($) escaped, quoted when needed."""
    value = str(arg).replace("%", "%%").replace("$", "$$")
    if value and not re.search(r"[\s\"'\\;]", value):
        return value
    return '"%s"' % value.replace("\\", "\\\\").replace('"', '\\"')


def systemd_unit(
    description: str,
    env_file_path: str,
    program: str,
    args: Sequence[str],
    digest: str,
    after: Sequence[str] = ("network-online.target",),
    stop_timeout: int = 30,
) -> str:
    """A unit that runs ``program args`` with the env file as its environment."""
    if not program.startswith("/"):
        raise RuntimeConfigError("systemd needs an absolute program path; got %r" % program)
    if not env_file_path.startswith("/"):
        raise RuntimeConfigError("systemd needs an absolute EnvironmentFile path; got %r" % env_file_path)
    _check_lines("unit %r" % description,
                 [*_command_words([program, *args]), ("EnvironmentFile", env_file_path), ("Description", description)])
    exec_start = " ".join(_systemd_quote(a) for a in [program] + [str(a) for a in args])
    after_line = " ".join(after)
    lines = [
        "[Unit]",
        "Description=%s" % description.replace("%", "%%"),
        "Wants=%s" % after_line,
        "After=%s" % after_line,
        "",
        "[Service]",
        "Type=simple",
        "EnvironmentFile=%s" % env_file_path,
        "Environment=%s=%s" % (HASH_ENV, digest),
        "ExecStart=%s" % exec_start,
        # always, as supervisord's autorestart=true and docker's unless-stopped: vllm serve exits 0 when its engine
        # died (a rank lost with a rebooted node: EngineDeadError, then a clean uvicorn shutdown), and on-failure
        # left the head without an API after a worker's reboot. `systemctl stop` is never restarted.
        "Restart=always",
        "RestartSec=5",
        "KillMode=control-group",
        "TimeoutStopSec=%d" % int(stop_timeout),
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# docker runtime
# ---------------------------------------------------------------------------


def docker_container_params(
    name: str,
    image: str,
    env_file_path: str,
    program: str,
    args: Sequence[str],
    digest: str,
    model_dir: Optional[str] = None,
    shm_size: str = "16g",
    gpus: str = "all",
    infiniband: bool = True,
    role: Optional[str] = None,
    command: Optional[Sequence[str]] = None,
    read_dirs: Sequence[str] = (),
    pid_container: str = "",
) -> dict[str, Any]:
    """Parameters of ``community.docker.docker_container`` for one node process.

    Host network and IPC (Ray and NCCL see the real fabric interface), all
    GPUs through a device request, ``/dev/infiniband`` and ``IPC_LOCK`` with
    unlimited memlock for RDMA, a sized ``/dev/shm``, the model directory read
    only, the env file, and ``--restart unless-stopped``.

    ``command`` replaces ``program args`` (the launcher's command, which reads env files inside the container);
    ``read_dirs`` are more host directories it needs, bind-mounted read only at the same paths.
    """
    _check_name(name, "container name")
    # Docker passes argv as a list, but NUL ends a word in execve and the env file is line based.
    _check_lines("container %s" % name,
                 [*_command_words(command or [program, *args]), ("env_file", env_file_path), ("image", image)])
    if not image:
        raise RuntimeConfigError("container %s: no image given; set the image variable" % name)
    # "none": no GPU request at all (a host without the NVIDIA container toolkit, such as the lab's CPU nodes).
    device_requests: list[dict[str, Any]] = []
    if gpus == "all":
        device_requests = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    elif gpus != "none":
        try:
            count = int(gpus)
        except ValueError:
            raise RuntimeConfigError("container %s: gpus must be 'all', 'none' or a number; got %r" % (name, gpus))
        device_requests = [{"driver": "nvidia", "count": count, "capabilities": [["gpu"]]}]
    labels = {HASH_LABEL: digest, "multinode.vllm.program": program}
    if role:
        labels["multinode.vllm.role"] = role
    params: dict[str, Any] = {
        "name": name,
        "image": image,
        "state": "started",
        "command": [str(word) for word in command] if command else [program] + [str(a) for a in args],
        "env_file": env_file_path,
        "env": {HASH_ENV: digest},
        "network_mode": "host",
        "ipc_mode": "host",
        # Each container its own process namespace, so stopping it ends every process it started (with the
        # host's, `ray start --block`'s gcs_server and raylet outlive a stopped container); vllm serve under backend
        # ray joins the Ray container's (pid_container): its Ray driver finds the raylet by scanning processes, and
        # it ends with Ray.
        "pid_mode": "container:%s" % pid_container if pid_container else "",
        "device_requests": device_requests,
        "shm_size": shm_size,
        "restart_policy": "unless-stopped",
        "labels": labels,
    }
    # RDMA needs the devices, and pinned memory: IPC_LOCK and an unlimited memlock. Without RDMA none of them (a
    # daemon without CAP_SYS_RESOURCE cannot raise the memlock limit, and the container would not start).
    params["devices"] = ["/dev/infiniband:/dev/infiniband:rwm"] if infiniband else []
    params["capabilities"] = ["IPC_LOCK"] if infiniband else []
    params["ulimits"] = ["memlock:-1:-1"] if infiniband else []
    # The env file's directory, read only: vLLM's non-carry-over list and Ray's token file live there, at the
    # paths the env file names.
    mounts = []
    for folder in [posixpath.dirname(env_file_path), *read_dirs]:
        if folder not in [mount["source"] for mount in mounts]:
            mounts.append({"type": "bind", "source": folder, "target": folder, "read_only": True})
    if model_dir:
        mounts.append({"type": "bind", "source": model_dir, "target": model_dir, "read_only": True})
    mounts.append({"type": "bind", "source": CONTAINER_TMP, "target": "/tmp", "read_only": False})
    params["mounts"] = mounts
    return params


def render(
    runtime: str,
    name: str,
    env: Mapping[str, str],
    program: str,
    args: Sequence[str],
    env_file_path: str,
    python: str = "",
    launcher: str = "",
    log_dir: str = "/var/log/multinode-vllm",
    run_dir: str = "/run/multinode-vllm",
    include_dir: str = "/etc/multinode-vllm/supervisor.d",
    image: str = "",
    model_dir: Optional[str] = None,
    shm_size: str = "16g",
    gpus: str = "all",
    role: Optional[str] = None,
    restart_on: Optional[Mapping[str, Any]] = None,
    image_var: str = "",
    env_files: Sequence[str] = (),
    rdma: bool = True,
    pid_container: str = "",
) -> dict[str, Any]:
    """Everything a role needs for one process under ``runtime``, with its config hash.

    ``image_var`` names the inventory variable the image comes from, for the error when it is empty.

    ``rdma`` passes ``/dev/infiniband`` into a container with ``IPC_LOCK`` and an unlimited memlock (docker only; a
    host without RDMA devices sets it false). ``pid_container`` names a container whose process namespace this one
    joins (docker only).

    ``restart_on`` holds values that are not in the env or the arguments but must restart the process when they
    change, such as the digest of a secret file the process reads at start (never the secret itself).

    ``env_files`` are the process's own env files, read after ``env_file_path`` by the launcher under every runtime
    (``python`` is then the interpreter that runs it: the node venv's, or the container's ``python3``).
    """
    if runtime not in RUNTIMES:
        raise RuntimeConfigError("runtime %r is not one of %s" % (runtime, ", ".join(RUNTIMES)))
    extra: dict[str, Any] = {"runtime": runtime, "program": program}
    env_files = [str(path) for path in env_files]
    if env_files:
        extra["env_files"] = env_files
        if not python or not launcher:
            raise RuntimeConfigError("%s: env files of its own need the launcher and the python that runs it" % name)
        for path in env_files:
            if not path.startswith("/"):
                raise RuntimeConfigError("%s: an env file needs an absolute path; got %r" % (name, path))
    if restart_on:
        extra["restart_on"] = {str(k): str(v) for k, v in restart_on.items()}
    if runtime == "docker":
        if not image:
            var = image_var or "the image variable"
            raise RuntimeConfigError(
                "%s: multinode_runtime is docker (the default) but %s is empty; set %s to an image that holds Ray and "
                "vLLM (docs/install.md lists what each runtime needs on a node), or set multinode_runtime to process "
                "or systemd" % (name, var, var))
        extra["image"] = image
        # The container's device and resource settings too: a change must recreate it, and docker_container's own
        # comparison lets a container keep more ulimits or devices than asked for.
        extra["container"] = {"gpus": gpus, "rdma": bool(rdma), "shm_size": shm_size, "model_dir": model_dir or "",
                              "pid_container": pid_container}
    digest = config_hash(env, args, extra)
    result: dict[str, Any] = {"runtime": runtime, "hash": digest, "args": [str(a) for a in args]}
    if runtime == "process":
        if not python or not launcher:
            raise RuntimeConfigError("runtime process needs the launcher and the python that runs it")
        command = launcher_command(python, launcher, env_file_path, program, args, env_files)
        result["command"] = command
        result["supervisor_program"] = supervisor_program(name, command, digest, log_dir)
        result["supervisord_config"] = supervisord_config(run_dir, log_dir, include_dir)
    elif runtime == "systemd":
        if env_files:
            command = launcher_command(python, launcher, env_file_path, program, args, env_files)
            program, args = command[0], command[1:]
        result["systemd_unit"] = systemd_unit("multinode.vllm %s" % name, env_file_path, program, args, digest)
    else:
        launched = launcher_command(python, launcher, env_file_path, program, args, env_files) if env_files else None
        read_dirs = [posixpath.dirname(path) for path in [launcher, *env_files]] if env_files else []
        result["docker"] = docker_container_params(
            name, image, env_file_path, program, args, digest, model_dir=model_dir, shm_size=shm_size, gpus=gpus,
            infiniband=rdma, role=role, command=launched, read_dirs=read_dirs, pid_container=pid_container,
        )
    return result
