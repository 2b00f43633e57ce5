# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model role's progress lines, for real, on this machine alone: the example in docs/model-staging.md.

From the repo root (after ``make setup``): ``.venv/bin/python tests/bench/model_progress_local.py [--mib 768]
[--interval 2] [--hf-mib 96] [--hf-rate 24]``.

It runs ``ansible-playbook`` with the role ``multinode.vllm.model`` on three inventory hosts that are all this
machine (``ansible_connection: local``), each with its own model directory and state: spark1 the head on
127.0.0.1, spark2 and spark3 workers on 127.0.0.2 and 127.0.0.3 (loopback stands in for the fabric). Two plays:

1. ``model_source: head``: ``--mib`` MiB of random files on spark1, pulled by spark2 and spark3 in parallel;
2. ``model_source: hf`` (only where the lab's node venv has huggingface_hub): the real huggingface_hub downloads
   a ``--hf-mib`` MiB repo onto spark1 from ``tests/unit/plugins/modules/hf_fake_hub.py`` (a local stand-in for
   the Hub, serving ``--hf-rate`` MiB/s, a token required and read from the role's 0600 file), then the workers
   pull it.

Everything else is the collection's code as a play runs it. Prints the play's output; removes its files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NODE_PYTHON = "/var/lib/multinode-vllm-lab/cache/node-venv/bin/python"
HOSTS = {"spark1": "127.0.0.1", "spark2": "127.0.0.2", "spark3": "127.0.0.3"}
TOKEN = "hf_DemoTokenNeverPrinted0123456789abcdef"

PLAYBOOK = """---
- name: Stage the model on every node (three hosts, all this machine)
  hosts: ray_head:ray_workers
  gather_facts: false
  any_errors_fatal: true
  roles:
    - role: multinode.vllm.model
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inventory(work: str, port: int) -> str:
    """hosts.ini and host_vars/ (next to it, so ansible-playbook reads them): each host its own directories."""
    host_vars = os.path.join(work, "host_vars")
    os.makedirs(host_vars)
    for host, ip in HOSTS.items():
        base = os.path.join(work, host)
        with open(os.path.join(host_vars, host + ".yml"), "w") as handle:
            handle.write("multinode_fabric: {ip: %s}\nmodel_dir: %s/models/demo\nmodel_cache_dir: %s/manifest-cache\n"
                         "model_state_dir: %s/state\nmodel_hf_cache_dir: %s/hf-cache\nmodel_hf_token_file: %s/hf.env\n"
                         % (ip, base, base, base, base, base))
    path = os.path.join(work, "hosts.ini")
    with open(path, "w") as handle:
        handle.write("[ray_head]\nspark1\n\n[ray_workers]\nspark2\nspark3\n\n[all:vars]\nansible_connection=local\n"
                     "ansible_python_interpreter=%s\nmodel_transfer_port=%d\nmodel_fsync=false\n" % (sys.executable, port))
    return path


def play(work: str, hosts: str, interval: float, *extra: str) -> int:
    playbook = os.path.join(work, "model.yml")
    with open(playbook, "w") as handle:
        handle.write(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               PYTHONPATH=os.path.join(ROOT, ".cache", "collections"), PYTHONDONTWRITEBYTECODE="1",
               HF_HOME=os.path.join(work, "hf-home"), NO_PROXY="127.0.0.1,localhost", ANSIBLE_NOCOLOR="1")
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(key, None)
    command = [os.path.join(ROOT, ".venv", "bin", "ansible-playbook"), "-i", hosts, playbook,
               "-e", "model_name=demo", "-e", "model_progress_interval=%g" % interval, *extra]
    print("$ " + " ".join(command[1:]).replace(TOKEN, "<the token>"), flush=True)
    return subprocess.call(command, env=env, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=768, help="size of the model pulled from the head")
    parser.add_argument("--interval", type=float, default=2.0, help="model_progress_interval")
    parser.add_argument("--hf-mib", type=int, default=96, help="size of the repo the fake Hub serves")
    parser.add_argument("--hf-rate", type=float, default=24.0, help="MiB/s the fake Hub serves")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="mv-progress-")
    try:
        hosts = inventory(work, free_port())
        head = os.path.join(work, "spark1", "models", "demo")
        os.makedirs(head)
        with open(os.path.join(head, "config.json"), "w") as handle:
            handle.write('{"architectures": ["Demo"]}')
        shards = 6
        for index in range(shards):
            with open(os.path.join(head, "model-%05d-of-%05d.safetensors" % (index + 1, shards)), "wb") as handle:
                for _mib in range(args.mib // shards):
                    handle.write(os.urandom(1024 * 1024))
        code = play(work, hosts, args.interval)
        if code:
            return code
        probe = subprocess.run([NODE_PYTHON, "-B", "-c", "import huggingface_hub"], capture_output=True,
                               check=False) if os.access(NODE_PYTHON, os.X_OK) else None
        if probe is None or probe.returncode:
            print("(no huggingface_hub in %s: the Hugging Face play is skipped)" % NODE_PYTHON)
            return 0
        sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "plugins", "modules"))
        from hf_fake_hub import FakeHub  # pylint: disable=import-outside-toplevel

        files = {"config.json": b'{"architectures": ["Demo"]}', "tokenizer.json": b"{}" * 1000}
        for index in range(3):
            files["model-%05d-of-00003.safetensors" % (index + 1)] = os.urandom(args.hf_mib // 3 * 1024 * 1024)
        for host in HOSTS:
            shutil.rmtree(os.path.join(work, host, "models"), ignore_errors=True)
        with FakeHub(files, lfs=[name for name in files if name.endswith(".safetensors")], repo="demo/model",
                     token=TOKEN, rate=args.hf_rate * 1024 * 1024) as hub:
            code = play(work, hosts, args.interval, "-e", "model_source=hf", "-e", "model_hf_repo_id=demo/model",
                        "-e", "model_hf_endpoint=%s" % hub.url, "-e", "model_python=%s" % NODE_PYTHON,
                        "-e", "model_hf_token=%s" % TOKEN)
        return code
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
