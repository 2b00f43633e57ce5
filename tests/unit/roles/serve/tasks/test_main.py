# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/serve/tasks/main.yml: vllm serve's own env file comes from the validated builder, templated as the role does,
and the launcher reads it (with the node env file and the secret file) under every runtime."""

from __future__ import annotations

import inspect
import os
import sys

import pytest
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
TASKS = os.path.join(ROOT, "roles", "serve", "tasks", "main.yml")
# The serve role's variables as ansible-playbook layers them: its dependency's defaults (the cluster role's shared
# settings), its own defaults, its vars.
ROLE_VARS = [os.path.join(ROOT, "roles", "cluster", "defaults", "main.yml"),
             os.path.join(ROOT, "roles", "serve", "defaults", "main.yml"),
             os.path.join(ROOT, "roles", "serve", "vars", "main.yml")]
HEAD = "198.18.200.12"
# The fabric role's fact for spark1 (filter _cluster_identity).
CLUSTER = {"head": "spark1", "workers": ["spark2"], "hosts": ["spark1", "spark2"], "role": "head", "node_rank": 0,
           "head_fabric_ip": HEAD, "ray_address": HEAD + ":6379", "backend": "ray", "runtime": "process",
           "serve": True}


def _collection_modules():
    return {name: module for name, module in sys.modules.items()
            if name == "ansible_collections" or name.startswith("ansible_collections.")}


@pytest.fixture(scope="module", autouse=True)
def _collections():
    """The role's filters, found the way ansible-playbook finds them (ansible.cfg's collections_path).

    Ansible's collection finder cannot load a package the other tests already imported from PYTHONPATH, so those
    modules step aside for this module's tests and come back after.
    """
    from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

    saved = _collection_modules()
    for name in saved:
        del sys.modules[name]
    _AnsibleCollectionFinder(paths=[os.path.join(ROOT, ".cache", "collections")])._install()
    yield
    _AnsibleCollectionFinder._remove()
    for name in _collection_modules():
        del sys.modules[name]
    sys.modules.update(saved)


def _load(path):
    """A YAML file of the role as ansible-playbook loads it: its strings are templates."""
    if "trusted_as_template" in inspect.signature(DataLoader.load_from_file).parameters:  # ansible-core >= 2.19
        return DataLoader().load_from_file(path, trusted_as_template=True)
    return DataLoader().load_from_file(path)  # 2.17, 2.18: every string may be templated


def _role_vars():
    variables = {}
    for path in ROLE_VARS:
        variables.update(_load(path))
    return variables


def _task_setting(name):
    """(expression, task vars) of the set_fact task that sets ``name``."""
    for task in _load(TASKS):
        facts = task.get("ansible.builtin.set_fact") or {}
        if name in facts:
            return facts[name], dict(task.get("vars") or {})
    raise AssertionError("no set_fact task of %s sets %s" % (TASKS, name))


def _env_text(vllm_env, **overrides):
    expression, task_vars = _task_setting("__serve_env_text")
    variables = _role_vars()
    variables.update(task_vars)
    variables.update({
        "inventory_hostname": "spark1",
        "groups": {"ray_head": ["spark1"], "ray_workers": ["spark2"]},
        "hostvars": {"spark1": {"multinode_fabric": {"ip": HEAD, "mgmt_ip": "198.19.1.10"}}},
        "multinode_cluster": CLUSTER,
        "vllm_env": vllm_env,
    })
    variables.update(overrides)
    return Templar(loader=DataLoader(), variables=variables).template(expression)


def test_the_env_file_of_the_lab_inventory():
    text = _env_text({"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONDONTWRITEBYTECODE": "1"}, vllm_hf_offline=True)
    assert text.splitlines() == ["HF_HUB_OFFLINE=1", "PYTHONDONTWRITEBYTECODE=1", "RAY_ADDRESS=%s:6379" % HEAD,
                                 "TRANSFORMERS_OFFLINE=1", "VLLM_CACHE_ROOT=/var/lib/multinode-vllm/cache/vllm",
                                 "VLLM_CPU_KVCACHE_SPACE=1"]


@pytest.mark.parametrize("key", ["--split-string", "-S", "-i", "A=B", "1A", ""])
def test_a_key_that_is_no_variable_name_is_refused_naming_vllm_env(key):
    with pytest.raises(AnsibleError) as caught:
        _env_text({key: "sh -c id"})
    message = str(caught.value)
    assert "vllm_env" in message and repr(key) in message and "not a valid environment variable name" in message


def test_a_value_with_a_line_break_is_refused_naming_vllm_env():
    with pytest.raises(AnsibleError, match=r"vllm_env\[EVIL\] = 'x\\n\[program:evil\]"):
        _env_text({"EVIL": "x\n[program:evil]"})


def test_the_render_runs_vllm_itself_and_the_launcher_reads_the_env_files():
    expression, task_vars = _task_setting("__serve_render")
    assert "env_files=[serve_vllm_env_file]" in expression and "args=__serve_args," in expression
    assert "__serve_program" not in task_vars and "__serve_env_text | hash('sha256')" in expression
    # No task of the role joins KEY=VALUE words or sources a file through a shell.
    with open(TASKS) as handle:
        text = handle.read()
    assert "map('join', '=')" not in text and "/usr/bin/env" not in text and "/bin/sh" not in text


@pytest.mark.parametrize("runtime", ["process", "systemd", "docker"])
def test_a_secret_is_in_no_rendered_artefact_of_any_runtime(runtime):
    """issue 17: vllm_secret_env reaches vllm serve through its 0600 file only. The role's own render expression,
    templated for each runtime with a secret and the API key set: neither value is in the supervisor section, the
    unit, the container parameters or the config hash inputs; the file that holds them is what the program reads."""
    secret, api_key = "s3cret-value-of-the-test", "api-key-of-the-test-0123456789"
    expression, task_vars = _task_setting("__serve_render")
    variables = _role_vars()
    variables.update(task_vars)
    variables.update({
        "inventory_hostname": "spark1",
        "groups": {"ray_head": ["spark1"], "ray_workers": ["spark2"]},
        "multinode_cluster": CLUSTER,
        "multinode_runtime": runtime,
        "multinode_venv": "/opt/venv",
        "multinode_model_dir": "/models",
        "serve_docker_image": "vllm/vllm-openai:test",
        "node_env_vars": {"VLLM_HOST_IP": HEAD, "GLOO_SOCKET_IFNAME": "enp1s0f1np1"},
        "vllm_api_key_enabled": True,
        "__serve_api_key": api_key,
        "vllm_secret_env": {"MY_SECRET": secret},
        "__serve_secret_env": {"VLLM_API_KEY": api_key, "MY_SECRET": secret},
        "__serve_env_text": "PYTHONDONTWRITEBYTECODE=1\n",
        "__serve_args": ["serve", "/models/tiny", "--port", "8000"],
    })
    rendered = Templar(loader=DataLoader(), variables=variables).template(expression)
    text = repr(rendered)
    assert secret not in text and api_key not in text
    assert variables["serve_api_env_file"] in text  # the launcher reads the 0600 file
    assert rendered["runtime"] == runtime and ("docker" in rendered or "systemd_unit" in rendered
                                               or "supervisor_program" in rendered)
