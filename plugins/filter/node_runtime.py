# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
name: node_runtime
short_description: Render one node process for the process, systemd or docker runtime, with its config hash
version_added: 0.1.0
description:
  - Takes the node's environment (P(multinode.vllm.fabric_node_env#filter)) and the program's arguments
    (P(multinode.vllm.ray_start_args#filter)) and returns what the runtime needs, all from those two inputs.
  - V(process), a supervisord program section that runs the env file through the launcher;
    V(systemd), a unit with C(EnvironmentFile=); V(docker), C(community.docker.docker_container) parameters.
  - C(hash) changes exactly when the environment, the arguments or the runtime settings change; the running
    process carries it (C(MULTINODE_VLLM_CONFIG_HASH)), which is how a deploy knows whether to restart.
author: multinode.vllm maintainers (@multinode)
options:
  _input:
    description: The node's environment.
    type: dict
    required: true
  runtime:
    description: The runtime.
    type: str
    required: true
    choices: [process, systemd, docker]
  name:
    description: Program, unit or container name.
    type: str
    required: true
  program:
    description: The program (absolute path for process and systemd; in the image's PATH for docker).
    type: str
    required: true
  args:
    description: Its arguments.
    type: list
    elements: str
    required: true
  env_file:
    description: Path of the rendered env file.
    type: str
    required: true
  env_files:
    description:
      - The process's own env files (vllm serve's environment, its 0600 secret file), read after O(env_file), a
        later file winning. When set, the process runs through the launcher under every runtime (with
        O(python) and O(launcher); under docker the launcher's and the files' directories are mounted read only),
        so neither systemd nor docker reads them and no value reaches a unit, C(docker inspect) or a command line.
    type: list
    elements: str
    default: []
  python:
    description: Interpreter that runs the launcher (process runtime, or any runtime with O(env_files)).
    type: str
    default: ""
  launcher:
    description: Path of the launcher (process runtime, or any runtime with O(env_files)).
    type: str
    default: ""
  log_dir:
    description: Log directory (process runtime).
    type: str
    default: /var/log/multinode-vllm
  run_dir:
    description: Directory of supervisord's pidfile and socket (process runtime).
    type: str
    default: /run/multinode-vllm
  include_dir:
    description: Directory of the program sections supervisord includes (process runtime).
    type: str
    default: /etc/multinode-vllm/supervisor.d
  image:
    description: Container image (docker runtime).
    type: str
    default: ""
  image_var:
    description: The inventory variable O(image) comes from, named in the error when it is empty.
    type: str
    default: ""
  model_dir:
    description: Model directory mounted read-only (docker runtime).
    type: str
  shm_size:
    description: Size of C(/dev/shm) (docker runtime).
    type: str
    default: 16g
  gpus:
    description: V(all), a count, or V(none) for no GPU request (docker runtime).
    type: str
    default: all
  rdma:
    description: Pass C(/dev/infiniband) into the container (docker runtime); false on hosts without RDMA devices.
    type: bool
    default: true
  pid_container:
    description: A container whose process namespace this one joins (docker runtime), for example the Ray container.
    type: str
    default: ""
  role:
    description: Label value, for example V(head) (docker runtime).
    type: str
  restart_on:
    description:
      - Values outside the env and the arguments whose change must restart the process, for example the sha256 of
        a token file the process reads at start (never the secret itself). Part of the config hash.
    type: dict
"""

EXAMPLES = r"""
- name: Render the Ray program
  ansible.builtin.set_fact:
    ray_render: >-
      {{ node_env | multinode.vllm.node_runtime(runtime='process', name='ray', program=venv ~ '/bin/ray',
         args=ray_args, env_file='/etc/multinode-vllm/node.env', python=venv ~ '/bin/python',
         launcher='/etc/multinode-vllm/bin/env-exec') }}
"""

RETURN = r"""
_value:
  description: C(runtime), C(hash), C(args) and one of C(supervisor_program) (with C(command) and C(supervisord_config)), C(systemd_unit), C(docker).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.multinode.vllm.plugins.module_utils._runtime import RuntimeConfigError, render


def node_runtime(env, runtime, name, program, args, env_file, python="", launcher="", log_dir="/var/log/multinode-vllm",
                 run_dir="/run/multinode-vllm", include_dir="/etc/multinode-vllm/supervisor.d",
                 image="", model_dir=None, shm_size="16g", gpus="all", role=None, restart_on=None,
                 image_var="", env_files=(), rdma=True, pid_container=""):
    try:
        return render(
            str(runtime), str(name), {str(k): str(v) for k, v in dict(env).items()}, str(program),
            [str(a) for a in args], str(env_file), python=str(python), launcher=str(launcher), log_dir=str(log_dir),
            run_dir=str(run_dir), include_dir=str(include_dir), image=str(image or ""), model_dir=model_dir, shm_size=str(shm_size), gpus=str(gpus), role=role,
            restart_on=dict(restart_on) if restart_on else None, image_var=str(image_var or ""),
            env_files=[str(path) for path in (env_files or [])], rdma=boolean(rdma, strict=True),
            pid_container=str(pid_container or ""),
        )
    except RuntimeConfigError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"node_runtime": node_runtime}
