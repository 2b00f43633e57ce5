#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: ray_verify
short_description: Prove that a running Ray cluster is the one the inventory describes, on the fabric
version_added: 0.1.0
description:
  - Reads Ray's node table from GCS at O(address) with a small reader run by O(python) (the node venv's
    interpreter, or C(docker exec <container> python) under the docker runtime), using
    C(ray._raylet.GcsClient.get_all_node_info). That is a private Ray API, tested against Ray 2.60; when it is
    missing the module fails saying so.
  - Checks that the alive node count equals the inventory's host count with no dead node holding a fabric address;
    that every alive node's NodeManagerAddress is inside O(fabric_cidr); that each host's fabric address is registered
    exactly once; that the GPUs Ray sees cover O(required_gpus); and that each raylet's C(VLLM_HOST_IP) (from
    O(raylet_env), gathered by M(multinode.vllm.ray_node_facts)) is that node's own fabric address and unique.
  - Every error names the host, the registered value, the expected value and the fix.
  - With O(wait_for_nodes), first waits until that many nodes are alive, recording progress (C(1/2 nodes joined)).
  - Read-only; starts no driver and registers no job.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  address:
    description: GCS address, C(<head fabric ip>:<gcs port>).
    type: str
    required: true
  python:
    description:
      - The command that runs a Python with Ray importable, as a list, for example V([/opt/venv/bin/python]) or
        V([docker, exec, multinode-ray, python]).
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds one read of the node table may take (connect included).
    type: float
    default: 10
  hosts:
    description: "The inventory, C({host: {fabric_ip: ..., mgmt_ip: ...}}); each host's C(multinode_fabric) facts fit as they are (C(ip) for C(fabric_ip))."
    type: dict
    default: {}
  fabric_cidr:
    description: The fabric subnet. Required when O(evaluate=true).
    type: str
  required_gpus:
    description: C(tensor_parallel_size * pipeline_parallel_size); V(0) skips the GPU checks.
    type: int
    default: 0
  raylet_env:
    description: "Per host, the environment of its running raylet (C(VLLM_HOST_IP)), or its C(multinode_ray_node) facts; null for a host with no raylet."
    type: dict
    default: {}
  wait_for_nodes:
    description: Wait until at least this many nodes are alive before evaluating; V(0) reads once.
    type: int
    default: 0
  wait_timeout:
    description: Seconds to wait for O(wait_for_nodes).
    type: float
    default: 120
  evaluate:
    description: Run the checks. V(false) only reads (and waits).
    type: bool
    default: true
  fail_on_errors:
    description: Fail when a check fails. V(false) returns the errors for the play to print and assert.
    type: bool
    default: true
  environment:
    description: Extra environment of the reader.
    type: dict
    default: {}
  head:
    description:
      - The head's inventory name. When its raylet requires a token (C(RAY_AUTH_MODE=token)), every other raylet must
        too, with a token file whose sha256 equals the head's (read from O(raylet_env); the token never leaves a node).
    type: str
  auth_token_file:
    description:
      - Ray's token file on this host. When it exists, the reader runs with C(RAY_AUTH_MODE=token) and
        C(RAY_AUTH_TOKEN_PATH) set to it (a cluster with token authentication rejects a reader without the token);
        when it does not (a cluster started by hand), the reader runs without token authentication.
    type: path
"""

EXAMPLES = r"""
- name: Verify the cluster from the head
  multinode.vllm.ray_verify:
    address: 198.18.200.12:6379
    python: [/var/lib/multinode-vllm-lab/cache/node-venv/bin/python]
    fabric_cidr: 198.18.200.0/24
    hosts:
      spark1: {fabric_ip: 198.18.200.12, mgmt_ip: 198.19.1.10}
      spark2: {fabric_ip: 198.18.200.13, mgmt_ip: 198.19.2.10}
    required_gpus: 2
    raylet_env:
      spark1: {VLLM_HOST_IP: 198.18.200.12}
      spark2: {VLLM_HOST_IP: 198.18.200.13}
"""

RETURN = r"""
nodes:
  description: Ray's node table as read.
  returned: always
  type: list
  elements: dict
  sample: [{node_id: 53d9bb..., node_manager_address: 198.18.200.12, alive: true, resources: {GPU: 1.0}, is_head: true}]
rows:
  description: One row per node and per inventory host Ray does not know (host, mgmt_ip, ray_address, alive, gpus, head).
  returned: always
  type: list
  elements: dict
table:
  description: The rows as fixed-width lines for printing.
  returned: always
  type: list
  elements: str
errors:
  description: Every failed check, one message each.
  returned: always
  type: list
  elements: str
alive:
  description: Number of alive nodes.
  returned: always
  type: int
progress:
  description: Join progress lines while waiting (C(1/2 nodes joined)).
  returned: always
  type: list
  elements: str
ray_version:
  description: Version of the Ray the reader imported.
  returned: when read
  type: str
"""

import json
import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_ray_reader
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError
from ansible_collections.multinode.vllm.plugins.module_utils._ray_state import (
    RayNode,
    alive_count,
    evaluate,
    format_table,
    rows as build_rows,
)
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv

TESTED_RAY = "2.60.0"


class ReadError(Exception):
    pass


def read_nodes(python, address, timeout, environment, wait_for_nodes=0, wait_timeout=0.0):
    """(ray version, nodes, alive counts seen): one reader process, which waits for wait_for_nodes alive nodes."""
    cmd = script_argv(python, _node_ray_reader, address, str(timeout), str(int(wait_for_nodes)),
                      str(float(wait_timeout)))
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (environment or {}).items()})
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + wait_timeout + 15, env=env,
                              check=False)
    except FileNotFoundError:
        raise ReadError("cannot run %s: not found; set python to the node venv's interpreter (or docker exec ...)"
                        % " ".join(python))
    except subprocess.TimeoutExpired:
        raise ReadError("reading Ray's node table from %s took longer than %s s; is GCS running and reachable on "
                        "that address?" % (address, timeout + wait_timeout + 15))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise ReadError("the node table reader (%s) exited %d without output: %s"
                        % (" ".join(python), proc.returncode, proc.stderr.strip()[-2000:]))
    data = json.loads(lines[-1])
    error = data.get("error")
    if error == "import":
        raise ReadError("%s cannot import ray._raylet.GcsClient (%s); point python at an interpreter with Ray %s"
                        % (" ".join(python), data.get("detail"), TESTED_RAY))
    if error == "api":
        raise ReadError("Ray %s has no GcsClient.get_all_node_info (a private API this module is tested with on Ray "
                        "%s); pin Ray %s or update ray_verify" % (data.get("ray_version"), TESTED_RAY, TESTED_RAY))
    if error == "connect":
        raise ReadError("nothing answers at GCS address %s (%s); is the Ray head running there? (start it with "
                        "playbooks/deploy.yml, or give the address of a running cluster with -e ray_verify_address=...)"
                        % (address, data.get("detail")))
    if error == "read":
        raise ReadError("could not read Ray's node table from GCS at %s within %s s (%s); is the head running with "
                        "--node-ip-address on that address?" % (address, timeout, data.get("detail")))
    return data.get("ray_version"), data.get("nodes") or [], data.get("alive_seen") or []


def run(module):
    p = module.params
    environment = dict(p["environment"])
    if p["auth_token_file"] and os.path.isfile(p["auth_token_file"]):
        environment.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=p["auth_token_file"])
    version, nodes, alive_seen = read_nodes(p["python"], p["address"], p["timeout"], environment,
                                            p["wait_for_nodes"], p["wait_timeout"] if p["wait_for_nodes"] else 0.0)
    alive = alive_count(nodes)
    progress = (["%d/%d nodes joined" % (min(seen, p["wait_for_nodes"]), p["wait_for_nodes"]) for seen in alive_seen]
                if p["wait_for_nodes"] else [])
    result = dict(changed=False, nodes=nodes, ray_version=version, alive=alive, progress=progress, errors=[])
    # hosts: {host: {fabric_ip|ip, mgmt_ip}} (multinode_fabric facts fit as they are).
    inventory = {}
    for host, values in p["hosts"].items():
        values = dict(values or {})
        inventory[str(host)] = {"fabric_ip": values.get("fabric_ip") or values.get("ip"), "mgmt_ip": values.get("mgmt_ip")}
    # raylet_env: {host: env} or {host: multinode_ray_node facts}; a host without a raylet is None.
    raylet_env = {}
    for host, values in p["raylet_env"].items():
        if values is None:
            raylet_env[str(host)] = None
        elif "running" in values:
            raylet_env[str(host)] = dict(values.get("env") or {}) if values.get("running") else None
        else:
            raylet_env[str(host)] = dict(values)
    if p["wait_for_nodes"] and alive < p["wait_for_nodes"]:
        registered = ", ".join(sorted(n["node_manager_address"] for n in nodes if n.get("alive"))) or "none"
        result["errors"].append(
            "only %d/%d Ray nodes joined within %s s (alive: %s); check the workers' Ray logs under "
            "/var/log/multinode-vllm and that they reach %s over the fabric"
            % (alive, p["wait_for_nodes"], p["wait_timeout"], registered, p["address"])
        )
    if p["evaluate"]:
        if not p["fabric_cidr"]:
            raise FabricError("fabric_cidr is required to evaluate the cluster")
        table_rows, errors = evaluate(nodes, inventory, p["fabric_cidr"], p["required_gpus"], raylet_env,
                                      head=p["head"])
        result["errors"].extend(errors)
    else:
        by_addr = {}
        for host, values in inventory.items():
            for key in ("mgmt_ip", "fabric_ip"):
                if values.get(key):
                    by_addr[str(values[key])] = host
        table_rows = build_rows([RayNode.from_dict(n) for n in nodes], inventory, by_addr.get)
    result["rows"] = table_rows
    result["table"] = format_table(table_rows)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            address=dict(type="str", required=True),
            python=dict(type="list", elements="str", required=True),
            timeout=dict(type="float", default=10),
            hosts=dict(type="dict", default={}),
            fabric_cidr=dict(type="str"),
            required_gpus=dict(type="int", default=0),
            raylet_env=dict(type="dict", default={}),
            wait_for_nodes=dict(type="int", default=0),
            wait_timeout=dict(type="float", default=120),
            evaluate=dict(type="bool", default=True),
            fail_on_errors=dict(type="bool", default=True),
            environment=dict(type="dict", default={}),
            auth_token_file=dict(type="path"),
            head=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except (ReadError, FabricError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    if result["errors"] and module.params["fail_on_errors"]:
        module.fail_json(msg="\n".join(result["errors"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
