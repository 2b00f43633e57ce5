#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: ray_stop
short_description: Stop the Ray processes of this node (only this node's network namespace)
version_added: 0.1.0
description:
  - The equivalent of C(ray stop --force) limited to this host's network namespace. C(ray stop) matches processes by
    name across the whole PID namespace; where nodes share one (the lab) it would also kill the other nodes' Ray.
  - O(scope=foreign) stops only Ray processes that this node's supervisord did not start (a hand-started Ray, as in
    the incident); O(scope=ours) only those this collection started (under any runtime, since their environment holds
    its config hash; found again after supervisord is stopped); O(scope=strays) only those of its processes that
    are not under this node's supervisord (orphans of the process runtime); O(scope=all) every Ray process here.
  - Sends SIGTERM, waits up to O(timeout) seconds, then SIGKILLs what is left.
  - In check mode reports what it would stop and stops nothing.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
options:
  scope:
    description: Which Ray processes to stop.
    type: str
    choices: [foreign, strays, ours, all]
    default: foreign
  supervisord_pidfile:
    description: Pidfile of this node's supervisord (its descendants are not foreign).
    type: path
    default: /run/multinode-vllm/supervisord.pid
  timeout:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 10
  stop_supervisord:
    description:
      - First stop this node's supervisord (the C(process) runtime) with SIGTERM and wait up to O(supervisord_timeout)
        seconds; supervisord stops its programs (Ray) on the way out.
    type: bool
    default: false
  supervisord_timeout:
    description: Seconds to wait for supervisord to exit before it is killed.
    type: float
    default: 60
"""

EXAMPLES = r"""
- name: Stop a Ray that multinode.vllm did not start
  multinode.vllm.ray_stop:
    scope: foreign
"""

RETURN = r"""
supervisord:
  description: Pid of the supervisord stopped (or that would be); null when none ran.
  returned: always
  type: int
stopped:
  description: The processes stopped (or that would be), with pid, name and the address the raylet had registered.
  returned: always
  type: list
  elements: dict
killed:
  description: Pids that needed SIGKILL.
  returned: always
  type: list
  elements: int
left:
  description: Ray processes left running here because the scope excludes them (with O(scope=ours), not ours).
  returned: always
  type: list
  elements: dict
"""

import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._procs import node_state


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            scope=dict(type="str", choices=["foreign", "strays", "ours", "all"], default="foreign"),
            supervisord_pidfile=dict(type="path", default="/run/multinode-vllm/supervisord.pid"),
            timeout=dict(type="float", default=10),
            stop_supervisord=dict(type="bool", default=False),
            supervisord_timeout=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    state = node_state(module.params["supervisord_pidfile"])
    sup = state["supervisord_pid"] if module.params["stop_supervisord"] else None
    if sup is not None and not module.check_mode:
        try:
            os.kill(sup, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + module.params["supervisord_timeout"]
        while time.monotonic() < deadline and _alive(sup):
            time.sleep(0.2)
        if _alive(sup):
            os.kill(sup, signal.SIGKILL)
        state = node_state(module.params["supervisord_pidfile"])
    scope = module.params["scope"]
    if scope == "all":
        pids = [p["pid"] for p in state["processes"]]
    else:
        pids = list(state["%s_pids" % scope])
    names = {p["pid"]: p["name"] for p in state["processes"]}
    stopped = [
        dict(pid=pid, name=names.get(pid), node_ip_address=state["node_ip_address"] if pid == state["raylet_pid"] else None)
        for pid in pids
    ]
    result = dict(changed=bool(pids) or sup is not None, supervisord=sup, stopped=stopped, killed=[], node=state,
                  left=[dict(pid=p["pid"], name=p["name"]) for p in state["processes"] if p["pid"] not in pids])
    if not pids or module.check_mode:
        module.exit_json(**result)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + module.params["timeout"]
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                result["killed"].append(pid)
            except ProcessLookupError:
                pass
    # Ray may have spawned workers meanwhile: one more sweep.
    again = node_state(module.params["supervisord_pidfile"])
    rest = [p["pid"] for p in again["processes"]] if scope == "all" else again["%s_pids" % scope]
    for pid in rest:
        try:
            os.kill(pid, signal.SIGKILL)
            result["killed"].append(pid)
        except ProcessLookupError:
            pass
    result["left"] = [dict(pid=p["pid"], name=p["name"])
                      for p in node_state(module.params["supervisord_pidfile"])["processes"]]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
