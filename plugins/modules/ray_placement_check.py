#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: ray_placement_check
short_description: Place one Ray task per node as vLLM does and check vLLM's get_ip() there equals the Ray address
version_added: 0.1.0
description:
  - Runs a short Ray driver on the head with the runtime's interpreter (O(interpreter)) and exactly the environment
    of O(env_file) (Ray's token-auth variables included). It places one zero-CPU task on each node through the
    C(node:<fabric ip>) resource, as vLLM's placement group pins its workers, and in that Ray worker (whose
    environment is the raylet's, as for vLLM's workers) records Ray's node address, C(VLLM_HOST_IP) and vLLM's own
    C(get_ip()).
  - Fails naming the host when no Ray node offers C(node:<fabric ip>) (Ray registered the node under another
    address, as in the incident), or when vLLM's C(get_ip()) in the worker differs from the node's Ray address.
  - The driver is killed at O(timeout). Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  address:
    description: The GCS address, C(<head fabric ip>:<port>).
    type: str
    required: true
  hosts:
    description: "Each inventory host's fabric address, C({host: fabric_ip})."
    type: dict
    required: true
  env_file:
    description: The head's node environment file (C(KEY=VALUE) lines), the driver's environment.
    type: path
    default: /etc/multinode-vllm/node.env
  interpreter:
    description: The runtime's Python as an argument list (the node venv's, or C(docker exec ... python)).
    type: list
    elements: str
    required: true
  base_env:
    description: Variables under the env file's. C(PATH), C(HOME) and C(LANG) are always set.
    type: dict
    default: {}
  timeout:
    description: Deadline in seconds for the whole check.
    type: float
    default: 60
  report_only:
    description: Return the problems without failing.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Check vLLM's address choice in a Ray worker on every node
  multinode.vllm.ray_placement_check:
    address: 198.18.200.12:6379
    hosts: {spark1: 198.18.200.12, spark2: 198.18.200.13}
    interpreter: [/opt/multinode-vllm/venv/bin/python]
  run_once: true
"""

RETURN = r"""
nodes:
  description: Per fabric address, what the placed task saw (ray_node_ip, VLLM_HOST_IP, get_ip, get_ip_source, error).
  returned: always
  type: dict
rows:
  description: One line per host.
  returned: always
  type: list
  elements: str
problems:
  description: One message per problem, naming the host.
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds the check took.
  returned: always
  type: float
"""

import json
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_ray_placement
from ansible_collections.multinode.vllm.plugins.module_utils._ray_placement import (
    parse_output,
    placement_problems,
    placement_rows,
)
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import (
    MINIMAL_BASE,
    RendezvousError,
    parse_env_file,
    rank_environment,
)
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            address=dict(type="str", required=True),
            hosts=dict(type="dict", required=True),
            env_file=dict(type="path", default="/etc/multinode-vllm/node.env"),
            interpreter=dict(type="list", elements="str", required=True),
            base_env=dict(type="dict", default={}),
            timeout=dict(type="float", default=60.0),
            report_only=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["env_file"]) as handle:
            env = parse_env_file(handle.read(), p["env_file"])
    except (OSError, RendezvousError) as exc:
        module.fail_json(msg="cannot read the head's env file %s: %s" % (p["env_file"], exc))
    base = dict(MINIMAL_BASE)
    base.update({str(k): str(v) for k, v in p["base_env"].items()})
    hosts = {str(h): str(ip) for h, ip in p["hosts"].items()}
    started = time.time()
    config = {"address": p["address"], "fabric_ips": sorted(hosts.values()), "deadline": started + p["timeout"]}
    argv = script_argv(p["interpreter"], _node_ray_placement, json.dumps(config))
    stderr = ""
    try:
        proc = subprocess.run(argv, env=rank_environment(env, base), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=p["timeout"] + 15, check=False)
        result = parse_output(proc.stdout)
        stderr = proc.stderr
    except subprocess.TimeoutExpired:
        result = {"error": "the Ray driver did not finish within %g s" % (p["timeout"] + 15)}
    except OSError as exc:
        module.fail_json(msg="cannot start the runtime interpreter %s: %s" % (p["interpreter"], exc))
    problems = placement_problems(result, hosts, p["timeout"])
    if result is None and stderr:
        problems.append("stderr: " + stderr.strip().splitlines()[-1])
    out = dict(changed=False, nodes=(result or {}).get("nodes") or {}, rows=placement_rows(result, hosts),
               problems=problems, elapsed=round(time.time() - started, 3))
    if problems and not p["report_only"]:
        module.fail_json(msg="\n".join(problems), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
