#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: vllm_ready
short_description: Wait until vLLM serves a real completion, showing progress; or read a node's serve state
version_added: 0.1.0
description:
  - As a task, the action plugin of the same name polls the API from the controller through the stages
    C(/health) = 200, C(/v1/models) lists O(served_model_name), a completion returns text; then it times a short
    generation burst and reports tokens per second. While waiting it prints the elapsed time, the stage and the
    latest meaningful line of the serve log on the task's host.
  - On a timeout, or when the serve process on the task's host exits, it fails with the log tails and the most likely
    cause from the failure table (C(docs/serve.md)).
  - This module is the node side the action plugin runs on the task's host at every poll (and that a play may run on
    any node with O(url) unset); it finds this node's C(vllm serve) processes (this network namespace only), reads
    the last lines of O(logs) and, with O(connections), the TCP sockets of the serve processes from
    C(/proc/net/tcp).
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  api_key:
    description:
      - "The API key (sent as C(Authorization: Bearer <key>)); used by the controller side only, never logged. When
        set, readiness also checks that C(GET /v1/models) without the key is refused with 401."
    type: str
    default: ""
  url:
    description: Base URL of the API as the controller reaches it (action plugin); empty to only read the node.
    type: str
    default: ""
  served_model_name:
    description: The name /v1/models must list and the completion uses.
    type: str
    default: ""
  timeout:
    description: Seconds to wait for the whole readiness sequence.
    type: int
    default: 600
  interval:
    description: Seconds between reads of the node (serve process, log tail; a module run on the head).
    type: float
    default: 5
  api_interval:
    description: Seconds between requests to the API from the controller (at most O(interval)).
    type: float
    default: 1
  progress_every:
    description: Print a progress line at least this often (seconds), and whenever the stage or log line changes.
    type: float
    default: 15
  prompt:
    description: Prompt of the readiness completion.
    type: str
    default: Hello, world
  max_tokens:
    description: Tokens of the readiness completion.
    type: int
    default: 16
  burst_requests:
    description: Requests of the tokens-per-second burst (sent one after another, 0 to skip).
    type: int
    default: 3
  burst_tokens:
    description: Tokens generated per burst request (C(ignore_eos) is set, so each yields exactly this many).
    type: int
    default: 64
  logs:
    description:
      - Log files of this node to tail (the serve log first).
      - V(docker:NAME) reads the log of container NAME (C(docker logs), its output and error streams) instead.
      - V(journal:UNIT) reads this boot's journal of systemd unit UNIT (C(journalctl -u UNIT -o cat)) instead.
    type: list
    elements: str
    default: [/var/log/multinode-vllm/vllm.log]
  lines:
    description: Lines kept from the end of each log.
    type: int
    default: 40
  connections:
    description: Also return the TCP sockets held by this node's serve processes.
    type: bool
    default: false
  first_errors:
    description:
      - Also return each log's first exception (the root cause of a failed start, often far above the tail).
      - Reads at most the last 32 MiB of each log.
    type: bool
    default: false
  expect_pid:
    description: The serve pid seen at the start; a different or missing pid means the process exited.
    type: int
notes:
  - The controller's HTTP requests ignore proxy variables; the API must be reachable directly.
"""

EXAMPLES = r"""
- name: Wait for the API and a real completion
  multinode.vllm.vllm_ready:
    url: http://198.19.1.10:8000
    served_model_name: tiny
    timeout: 600
  register: ready

- name: Read this node's serve processes and their fabric connections
  multinode.vllm.vllm_ready:
    connections: true
"""

RETURN = r"""
running:
  description: A vllm serve process runs in this node's network namespace.
  returned: always
  type: bool
pid:
  description: Pid of the main vllm serve process (null when none).
  returned: always
  type: int
pids:
  description: Every process of the serve tree.
  returned: always
  type: list
  elements: int
tails:
  description: Last lines of each log, by path.
  returned: always
  type: dict
latest:
  description: The latest meaningful line of the first log.
  returned: always
  type: str
first_errors:
  description: Each log's first traceback exception, by path (C(who) is the process prefix, C(line) the exception).
  returned: when O(first_errors=true)
  type: dict
connections:
  description: TCP sockets of the serve processes (local, local_port, remote, remote_port, state).
  returned: when connections is true
  type: list
  elements: dict
stage:
  description: Last stage reached (action plugin).
  returned: action plugin
  type: str
  sample: ready
text:
  description: Text of the readiness completion (action plugin).
  returned: success of the action plugin
  type: str
tokens_per_second:
  description: Generated tokens per second over the burst (action plugin).
  returned: success of the action plugin
  type: float
seconds:
  description: Seconds until ready (action plugin).
  returned: action plugin
  type: float
cause:
  description: The most likely cause of a failure (key, cause, fix, host, line).
  returned: failure of the action plugin
  type: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._log_tail import first_error, tail
from ansible_collections.multinode.vllm.plugins.module_utils._proc_net import parse_proc_net_tcp
from ansible_collections.multinode.vllm.plugins.module_utils._procs import serve_processes
from ansible_collections.multinode.vllm.plugins.module_utils._serve_failure import meaningful_line


def socket_inodes(pids) -> set:
    inodes = set()
    for pid in pids:
        base = "/proc/%d/fd" % pid
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(os.path.join(base, name))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default=""),
            served_model_name=dict(type="str", default=""),
            timeout=dict(type="int", default=600),
            interval=dict(type="float", default=5),
            api_interval=dict(type="float", default=1),
            progress_every=dict(type="float", default=15),
            prompt=dict(type="str", default="Hello, world"),
            max_tokens=dict(type="int", default=16, no_log=False),
            burst_requests=dict(type="int", default=3),
            burst_tokens=dict(type="int", default=64, no_log=False),
            logs=dict(type="list", elements="str", default=["/var/log/multinode-vllm/vllm.log"]),
            lines=dict(type="int", default=40),
            connections=dict(type="bool", default=False),
            first_errors=dict(type="bool", default=False),
            expect_pid=dict(type="int"),
            api_key=dict(type="str", default="", no_log=True),
        ),
        supports_check_mode=True,
    )
    pid, pids = serve_processes()
    tails = {path: tail(path, module.params["lines"]) for path in module.params["logs"]}
    first = module.params["logs"][0] if module.params["logs"] else None
    result = dict(
        changed=False,
        running=pid is not None,
        pid=pid,
        pids=pids,
        tails=tails,
        latest=meaningful_line(tails[first]) if first else "",
    )
    if module.params["first_errors"]:
        result["first_errors"] = {path: first_error(path) for path in module.params["logs"]}
    if module.params["connections"]:
        inodes = socket_inodes(pids)
        conns = []
        for name in ("/proc/net/tcp",):
            try:
                with open(name) as handle:
                    conns += parse_proc_net_tcp(handle.read())
            except OSError:
                pass
        result["connections"] = [c for c in conns if c["inode"] in inodes]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
