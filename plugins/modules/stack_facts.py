#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: stack_facts
short_description: The software stack of this node's runtime (Python, Ray, vLLM, torch, NCCL, CUDA runtime, driver)
version_added: 0.1.0
description:
  - Runs a short node script under the runtime's interpreter (the node's venv, or C(docker run) of the image) that
    reads, without importing torch, the versions of Python, Ray, vLLM and torch, the NCCL torch would load (a pip
    C(nvidia-nccl-*) distribution, else a system C(libnccl.so.*)), the pip CUDA runtime and the NVIDIA driver.
  - Sets the fact C(multinode_stack). The role C(multinode.vllm.ray) (C(stack_check.yml)) compares it across nodes
    and fails on any difference not in C(ray_stack_allow_skew).
  - Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  interpreter:
    description:
      - The runtime's python as an argument list, for example V([/opt/venv/bin/python]), or under docker
        V([docker, run, --rm, --entrypoint, python, <image>]).
    type: list
    elements: str
    required: true
  env:
    description: Environment variables for the interpreter (on top of the module's own).
    type: dict
    default: {}
  host:
    description: This host's inventory name (used in messages); default the node's hostname.
    type: str
"""

EXAMPLES = r"""
- name: Read the stack in the node's venv
  multinode.vllm.stack_facts:
    interpreter: [/opt/multinode-vllm/venv/bin/python]
    host: "{{ inventory_hostname }}"

- name: Read the stack inside the image (docker runtime)
  multinode.vllm.stack_facts:
    interpreter: [docker, run, --rm, --entrypoint, python3, "vllm/vllm-openai:v0.11.0"]
    host: "{{ inventory_hostname }}"

- name: Show the NCCL torch would load
  ansible.builtin.debug:
    msg: "{{ multinode_stack.nccl | default('none', true) }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts set on the host.
  returned: success
  type: dict
  contains:
    multinode_stack:
      description: The runtime's stack; each value is null when not installed (or, for the driver, without a GPU).
      type: dict
      contains:
        python: {description: The interpreter's version., type: str, sample: 3.12.3}
        ray: {description: Ray's version., type: str, sample: 2.52.0}
        vllm: {description: vLLM's version., type: str, sample: 0.11.0}
        torch: {description: torch's version., type: str, sample: 2.8.0+cu128}
        nccl:
          description: The NCCL torch would load, a pip distribution or else a system library.
          type: str
          sample: pip nvidia-nccl-cu12 2.27.3
        cuda_runtime: {description: The pip CUDA runtime., type: str, sample: pip nvidia-cuda-runtime-cu12 12.8.90}
        driver: {description: The NVIDIA kernel driver (/proc/driver/nvidia/version)., type: str, sample: 580.95.05}
"""

import json
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_versions
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv

KEYS = ("python", "ray", "vllm", "torch", "nccl", "cuda_runtime", "driver")


def read_stack(module: AnsibleModule, host: str, interpreter: list[str], env: dict[str, str]) -> dict:
    """Run the node script under ``interpreter``; fail_json naming the host and the interpreter when it cannot."""
    command = " ".join(interpreter)
    try:
        rc, out, err = module.run_command(script_argv(interpreter, _node_versions, "stack"), environ_update=env,
                                          handle_exceptions=False)
    except OSError as exc:
        module.fail_json(msg="%s: the runtime interpreter %s cannot start (%s); set the interpreter to the runtime's "
                         "python (the venv's bin/python, or docker run of the image)" % (host, command, exc))
    if rc != 0:
        module.fail_json(msg="%s: the runtime interpreter %s cannot start (rc %d): %s; set the interpreter to the "
                         "runtime's python (the venv's bin/python, or docker run of the image)"
                         % (host, command, rc, (err or out).strip()[-400:]))
    try:
        stack = json.loads(out.strip().splitlines()[-1])
        return {key: stack[key] for key in KEYS}
    except (ValueError, IndexError, KeyError, TypeError):
        module.fail_json(msg="%s: unexpected output from %s: %r; expected one JSON object with %s"
                         % (host, command, out[-400:], ", ".join(KEYS)))
        raise  # unreachable; fail_json exits


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            interpreter=dict(type="list", elements="str", required=True),
            env=dict(type="dict", default={}),
            host=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not p["interpreter"]:
        module.fail_json(msg="interpreter = []: expected the runtime's python as an argument list")
    host = p["host"] or socket.gethostname()
    env = {str(k): str(v) for k, v in p["env"].items()}
    module.exit_json(changed=False, ansible_facts=dict(multinode_stack=read_stack(module, host, p["interpreter"], env)))


if __name__ == "__main__":
    main()
