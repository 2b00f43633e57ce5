# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/node_process: the container task passes on every parameter the one renderer gives, and nothing else.

The docker runtime's container settings are rendered by ``_runtime.docker_container_params`` and written out key
by key in one task (Ansible cannot splat a dict into module arguments): a key added to the renderer but not to the
task would silently never reach the container.
"""

from __future__ import annotations

import os

import yaml

from ansible_collections.multinode.vllm.plugins.module_utils._runtime import docker_container_params

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
TASKS = os.path.join(ROOT, "roles", "node_process", "tasks")


def _task(path, module):
    """The one task of ``module`` acting on a named unit or container (a bare daemon-reload names none)."""
    with open(path) as handle:
        tasks = yaml.safe_load(handle)
    found = [task for task in tasks if module in task and "name" in task[module]]
    assert len(found) == 1, "%s: expected one %s task" % (path, module)
    return found[0][module]


def test_the_container_task_passes_every_rendered_parameter_from_the_rendering():
    rendered = docker_container_params("ray", "img:1", "/etc/multinode-vllm/node.env", "ray", ["start", "--block"],
                                       "abc", model_dir="/models", role="head")
    task = _task(os.path.join(TASKS, "docker.yml"), "community.docker.docker_container")
    # name and state are the layer's own (the container variable, started); recreate is the layer's reason.
    assert set(rendered) - {"name", "state"} == set(task) - {"name", "state", "recreate"}
    for key in set(rendered) - {"name", "state"}:
        # pid_mode "" (a namespace of its own) is left out of the call: the module has no value for "private".
        suffix = " | default('', true) or omit" if key == "pid_mode" else ""
        assert task[key] == "{{ node_process_render.docker.%s%s }}" % (key, suffix), key


def test_stop_and_start_act_on_the_same_unit_container_and_section():
    start = _task(os.path.join(TASKS, "systemd.yml"), "ansible.builtin.systemd_service")
    stop = _task(os.path.join(TASKS, "stop.yml"), "ansible.builtin.systemd_service")
    assert start["name"] == stop["name"] == "{{ node_process_unit }}"
    container_start = _task(os.path.join(TASKS, "docker.yml"), "community.docker.docker_container")
    container_stop = _task(os.path.join(TASKS, "stop.yml"), "community.docker.docker_container")
    assert container_start["name"] == container_stop["name"] == "{{ node_process_container }}"
    assert container_stop["state"] == "absent"
    # Under systemd the stop also removes the unit file it stopped, as docker removes the container.
    with open(os.path.join(TASKS, "stop.yml")) as handle:
        removed = [t["ansible.builtin.file"] for t in yaml.safe_load(handle) if "ansible.builtin.file" in t]
    assert {"path": "/etc/systemd/system/{{ node_process_unit }}", "state": "absent"} in removed
