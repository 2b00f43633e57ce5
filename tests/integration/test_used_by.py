# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection as an infra team uses it (issue 20): an existing repo with its own ansible.cfg, an inventory in
group_vars/host_vars layout with its own group and host names, the built tarball installed into ./collections as
docs/install.md says (offline: --no-deps, community.docker from the `ansible` package), then the FQCN playbooks
against the lab: deploy to a completion, teardown. Nothing of this repo is on the path (no ANSIBLE_CONFIG, no
PYTHONPATH link to the working tree)."""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import BIN, LAB_INVENTORY, ROOT, labctl, require_root, serve_pids

VENV = Path("/var/lib/multinode-vllm-lab/cache/node-venv")

pytestmark = pytest.mark.skipif(not (VENV / "bin" / "vllm").exists(),
                                reason="node venv with vLLM missing; build it with `make lab-venv`")


def _run(repo: Path, *cmd: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PYTHONPATH"))}
    env.update(PATH="%s:%s" % (BIN, env.get("PATH", "")), ANSIBLE_NOCOLOR="1")
    return subprocess.run(list(cmd), cwd=str(repo), env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def infra_repo(tmp_path_factory):
    require_root()
    labctl("up", "2")
    repo = tmp_path_factory.mktemp("infra-repo")
    built = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(repo / "dist"), str(ROOT)], capture_output=True, text=True, check=True)
    tarball = next((repo / "dist").glob("multinode-vllm-*.tar.gz"), None)
    assert tarball is not None and tarball.exists(), built.stdout
    (repo / "ansible.cfg").write_text("[defaults]\ncollections_path = ./collections\ninventory = ./inventory\n"
                                      "forks = 10\n[ssh_connection]\npipelining = true\n")
    (repo / "requirements.yml").write_text(yaml.safe_dump(
        {"collections": [{"name": str(tarball), "type": "file"}]}))
    lab_vars = yaml.safe_load((LAB_INVENTORY / "group_vars" / "all.yml").read_text())
    lab_vars.update(multinode_head_group="gpu_head", multinode_worker_group="gpu_workers")
    inventory = repo / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "host_vars").mkdir()
    (inventory / "hosts.yml").write_text(textwrap.dedent("""\
        all:
          children:
            gpu_nodes:
              children:
                gpu_head:
                  hosts: {gpu-a: {}}
                gpu_workers:
                  hosts: {gpu-b: {}}
        """))
    (inventory / "group_vars" / "all.yml").write_text(yaml.safe_dump(lab_vars))
    for name, n in (("gpu-a", 1), ("gpu-b", 2)):
        (inventory / "host_vars" / ("%s.yml" % name)).write_text(
            yaml.safe_dump({"ansible_host": "198.19.%d.10" % n, "fabric_ip": "198.18.200.%d" % (11 + n)}))
    installed = _run(repo, str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-r",
                     "requirements.yml", "-p", "./collections")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (repo / "collections" / "ansible_collections" / "multinode" / "vllm" / "MANIFEST.json").exists()
    yield repo
    _run(repo, str(BIN / "ansible-playbook"), "multinode.vllm.teardown")


def test_only_the_installed_copy_is_visible(infra_repo):
    listed = _run(infra_repo, str(BIN / "ansible-galaxy"), "collection", "list", "multinode.vllm", timeout=60)
    paths = [line[2:] for line in listed.stdout.splitlines() if line.startswith("# ")]
    assert paths == [str(infra_repo / "collections" / "ansible_collections")], listed.stdout


def test_an_inventory_whose_groups_are_not_mapped_stops_before_any_change(infra_repo):
    run = _run(infra_repo, str(BIN / "ansible-playbook"), "multinode.vllm.deploy", "-e",
               '{"multinode_head_group": "no_such_group"}', timeout=120)
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "No cluster to act on: the head group 'no_such_group' has 0 hosts" in out, out[-3000:]
    assert "gpu_head" in out and "multinode_head_group" in out
    assert "TASK [multinode.vllm.fabric" not in out  # stopped before the first gate touched a node


def test_deploy_serves_and_teardown_stops_from_an_installed_tarball(infra_repo):
    run = _run(infra_repo, str(BIN / "ansible-playbook"), "multinode.vllm.deploy")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert "completion:" in out and "tokens/s" in out
    assert "gpu-a" in out and "gpu-b" in out
    assert serve_pids("spark1")
    down = _run(infra_repo, str(BIN / "ansible-playbook"), "multinode.vllm.teardown")
    assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    assert serve_pids("spark1") == []
