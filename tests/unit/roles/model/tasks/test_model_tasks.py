# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/model/tasks/main.yml: the Hugging Face download task carries no token, so it need not be no_log.

The task's own arguments, templated as the role does with a token set: the token is in none of them and in no
environment; the download gets the 0600 file's path instead. And the role's defaults are its argument_specs'.
"""

from __future__ import annotations

import inspect
import json
import os
import sys

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
ROLE = os.path.join(ROOT, "roles", "model")
TASKS = os.path.join(ROLE, "tasks", "main.yml")
TOKEN = "hf_PlantedTokenOfTheRoleTest0123456789"


def _collection_modules():
    return {name: module for name, module in sys.modules.items()
            if name == "ansible_collections" or name.startswith("ansible_collections.")}


@pytest.fixture(scope="module", autouse=True)
def _collections():
    """The role's filters, found as ansible-playbook finds them (see tests/unit/roles/serve/tasks/test_main.py)."""
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
    if "trusted_as_template" in inspect.signature(DataLoader.load_from_file).parameters:  # ansible-core >= 2.19
        return DataLoader().load_from_file(path, trusted_as_template=True)
    return DataLoader().load_from_file(path)


def _tasks(items):
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def _task(name):
    for task in _tasks(_load(TASKS)):
        if task.get("name") == name:
            return task
    raise AssertionError("no task %r in %s" % (name, TASKS))


def _variables(**overrides):
    variables = dict(_load(os.path.join(ROLE, "defaults", "main.yml")))
    variables.update(_load(os.path.join(ROLE, "vars", "main.yml")))
    variables.update({
        "inventory_hostname": "spark1", "groups": {"ray_head": ["spark1"], "ray_workers": ["spark2"]},
        "ansible_play_hosts_all": ["spark1", "spark2"], "multinode_venv": "/opt/multinode-vllm/venv",
        "model_name": "llama", "model_source": "hf", "model_hf_repo_id": "meta-llama/Llama-3.1-8B",
        "model_hf_token": TOKEN, "omit": "__omit_place_holder__",
    })
    variables.update(overrides)
    return variables


DOWNLOAD = "Download the model once on the head (Hugging Face)"


@pytest.mark.parametrize("offline", [False, True])
def test_the_download_task_carries_the_token_file_never_the_token(offline):
    task = _task(DOWNLOAD)
    assert "no_log" not in task and "environment" not in task
    rendered = Templar(loader=DataLoader(), variables=_variables(model_hf_offline=offline)).template(
        task["multinode.vllm.model_hf_download"])
    assert TOKEN not in json.dumps(rendered)
    assert rendered["token_file"] == "/etc/multinode-vllm/hf-token.env"
    assert rendered["repo_id"] == "meta-llama/Llama-3.1-8B" and rendered["offline"] is offline
    assert rendered["python"] == "/opt/multinode-vllm/venv/bin/python"
    assert rendered["progress_interval"] == 5


def test_without_a_token_no_token_file_is_passed():
    task = _task(DOWNLOAD)
    rendered = Templar(loader=DataLoader(), variables=_variables(model_hf_token="")).template(
        task["multinode.vllm.model_hf_download"])
    assert rendered["token_file"] == "__omit_place_holder__"


def test_the_token_is_only_in_the_no_log_file_writer():
    """Every task whose text names model_hf_token: the 0600 writer (node_files' secret_files, never printed) and
    conditions on its length; nothing else templates the value."""
    writer = _task("Write the Hugging Face token for the download (mode 0600)")
    assert "model_hf_token}" in json.dumps(writer["multinode.vllm.node_files"]["secret_files"])
    for task in _tasks(_load(TASKS)):
        if task.get("name") == writer["name"] or "block" in task:
            continue
        body = json.dumps({k: v for k, v in task.items() if k != "when"})
        assert "model_hf_token}" not in body and "model_hf_token |" not in body.replace("model_hf_token | length", ""), \
            task.get("name")


def test_each_pull_and_the_download_get_the_progress_interval():
    pull = _task("Pull the missing files from the head over the fabric (every worker at once)")
    assert pull["multinode.vllm.model_transfer"]["progress_interval"] == "{{ model_progress_interval }}"
    assert pull["multinode.vllm.model_transfer"]["state_dir"] == "{{ model_state_dir }}"
    assert _task(DOWNLOAD)["multinode.vllm.model_hf_download"]["progress_interval"] == "{{ model_progress_interval }}"


def test_the_defaults_are_the_argument_specs():
    with open(os.path.join(ROLE, "meta", "argument_specs.yml")) as handle:
        options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    with open(os.path.join(ROLE, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    assert defaults == {name: spec["default"] for name, spec in options.items()}
