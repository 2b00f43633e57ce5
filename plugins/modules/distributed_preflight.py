#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: distributed_preflight
short_description: Prove the torch.distributed rendezvous vLLM will perform, over the fabric, before the model loads
version_added: 0.1.0
description:
  - Runs one short-lived rank process on this node with the node runtime's interpreter (O(interpreter)) and
    exactly the environment in O(env_file) (over a minimal base), as vLLM's ranks will get it.
  - The rank joins C(torch.distributed.init_process_group(init_method=tcp://<head fabric ip>:<port>)) as vLLM does,
    all-reduces a known tensor and checks the sum, then times an all-reduce of O(size_mib) MiB and reports algbw
    and busbw. Backend Gloo without a GPU; NCCL plus a Gloo group (vLLM uses both) with CUDA.
  - It also records which interface C(GLOO_SOCKET_IFNAME) and C(NCCL_SOCKET_IFNAME) select and whether that
    interface carries the node's fabric address, the route to the head, and what vLLM's own C(get_ip()) returns
    under this environment (emulated, and said so, where vLLM is not installed in the runtime).
  - Every rank must run at the same time. Run the task on every node in one play with C(forks) at least the
    number of nodes and no C(serial); the M(multinode.vllm.distributed_preflight) role checks that first.
  - The rank is killed at O(timeout) seconds (it also exits by itself at that deadline, for runtimes such as
    C(docker exec) where killing the client does not reach it). No rank process is left behind.
  - With NCCL it keeps NCCL's own log lines that name the network and reports the transport NCCL chose; with
    O(nccl_expect_transport=ib) it fails unless that is C(NET/IB) on exactly O(nccl_expect_hcas) (not
    C(NET/Socket), not one HCA of two), and with O(min_busbw_gbps) unless the all-reduce busbw reaches it.
  - torch comes from the runtime; the module never installs anything.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  host:
    description: This node's inventory name (used in messages).
    type: str
    required: true
  rank:
    description: This node's rank; the head is rank 0 and hosts the rendezvous.
    type: int
    required: true
  world_size:
    description: Number of ranks (nodes).
    type: int
    required: true
  head_host:
    description: The head's inventory name (used in messages).
    type: str
    required: true
  head_fabric_ip:
    description: The head's fabric address, the rendezvous address.
    type: str
    required: true
  fabric_ip:
    description: This node's fabric address.
    type: str
    required: true
  fabric_interface:
    description: This node's fabric interface.
    type: str
    required: true
  port:
    description: TCP port of the rendezvous (the TCPStore) on the head's fabric address.
    type: int
    default: 29600
  env_file:
    description: The node environment file (C(KEY=VALUE) lines, values raw) the vLLM ranks get.
    type: path
    default: /etc/multinode-vllm/node.env
  interpreter:
    description:
      - The runtime's Python as an argument list, for example C([/opt/venv/bin/python]) or
        C([docker, exec, --env-file, /etc/multinode-vllm/node.env, vllm-node, python]).
    type: list
    elements: str
    required: true
  base_env:
    description:
      - Variables under the env file's (the env file wins). C(PATH), C(HOME) and C(LANG) are always set.
    type: dict
    default: {}
  backend:
    description: V(auto) picks V(nccl) when CUDA is available, else V(gloo).
    type: str
    choices: [auto, gloo, nccl]
    default: auto
  local_rank:
    description: CUDA device index of this rank (NCCL only).
    type: int
    default: 0
  timeout:
    description: Hard deadline of the rank in seconds, from the task's start on this node.
    type: float
    default: 60
  size_mib:
    description: Size of the timed all-reduce in MiB (float32). V(0) skips the bandwidth measurement.
    type: float
    default: 64
  iterations:
    description: Timed all-reduce iterations (after one warm-up).
    type: int
    default: 5
  check_get_ip:
    description: Call vLLM's C(get_ip()) in the rank and compare it with O(fabric_ip).
    type: bool
    default: true
  nccl_expect_transport:
    description:
      - What NCCL's own log must show when the rank runs NCCL (the NCCL transport gate).
      - V(ib) fails unless NCCL carried the all-reduce over C(NET/IB) (NCCL's IB/RoCE transport, or an IB
        plugin such as C(IBext_v10)) on exactly the HCAs in O(nccl_expect_hcas), not C(NET/Socket).
      - V(none) checks nothing; the transport is still reported. A Gloo rank is never checked.
      - The rank runs NCCL with C(NCCL_DEBUG=INFO) and C(NCCL_DEBUG_SUBSYS=INIT,NET) (where the environment does
        not already log those), into C(NCCL_DEBUG_FILE) (the environment's, else a file of its own).
    type: str
    choices: [ib, none]
    default: none
  nccl_expect_hcas:
    description:
      - The RDMA ports, as C(hca:port), NCCL must use with O(nccl_expect_transport=ib) (C(multinode_fabric.hca_ports),
        what C(NCCL_IB_HCA) lists).
    type: list
    elements: str
    default: []
  min_busbw_gbps:
    description:
      - This rank's all-reduce busbw (GB/s, the nccl-tests definition) must reach it; V(0) is off.
      - The role judges the cluster's slowest rank against it instead (the module runs with O(report_only)).
    type: float
    default: 0
  non_carry_over_file:
    description:
      - vLLM's C(ray_non_carry_over_env_vars.json) to read and return (on the head). Default
        C($VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json) from the env file, else C(~/.config/vllm/...).
    type: path
  report_only:
    description: Return the results without failing; the role fails once, with the cluster's messages.
    type: bool
    default: false
  action:
    description:
      - V(run) runs the rank.
      - V(fingerprint) runs no rank; it returns RV(fingerprint), a hash of everything this node's rank outcome
        depends on (the env file, the non-carry-over list, the runtime's torch/vLLM/Ray versions, the addresses,
        interface, port, interpreter and backend), and the proof a previous pass left in O(proof_file). The role
        reuses a pass only when every node holds a proof of the same cluster fingerprint (O(action=fingerprint)
        costs a Python start-up, not a torch import).
    type: str
    choices: [run, fingerprint]
    default: run
  proof_file:
    description: Where the role records a pass on each node (read by O(action=fingerprint)).
    type: path
    default: /var/lib/multinode-vllm/preflight/distributed.json
"""

EXAMPLES = r"""
- name: Run the distributed preflight on every node at once
  multinode.vllm.distributed_preflight:
    host: "{{ inventory_hostname }}"
    rank: "{{ 0 if inventory_hostname == groups['ray_head'][0] else 1 }}"
    world_size: 2
    head_host: "{{ groups['ray_head'][0] }}"
    head_fabric_ip: "{{ hostvars[groups['ray_head'][0]].multinode_fabric.ip }}"
    fabric_ip: "{{ multinode_fabric.ip }}"
    fabric_interface: "{{ multinode_fabric.interface }}"
    interpreter: ["{{ multinode_venv }}/bin/python"]
  register: preflight
"""

RETURN = r"""
result:
  description: The rank's result (the last line it printed); null when it printed none.
  returned: always
  type: dict
  contains:
    ok: {description: "The rank joined, verified the sum and finished.", type: bool}
    phase: {description: "Last phase reached: interfaces, import, get_ip, init, verify, bandwidth, barrier, done.", type: str}
    error: {description: What failed., type: str}
    gloo: {description: "GLOO_SOCKET_IFNAME, the interfaces and addresses it selects, carries_fabric.", type: dict}
    nccl: {description: "NCCL_SOCKET_IFNAME, the interface NCCL's rules select, carries_fabric.", type: dict}
    route_to_head: {description: Source address and interface towards the rendezvous., type: dict}
    get_ip: {description: "vLLM's get_ip() value, where it came from, matches (the fabric address).", type: dict}
    bandwidth: {description: "bytes, seconds_per_op, algbw_GBps, busbw_GBps of the timed all-reduce.", type: dict}
    nccl_log: {description: "NCCL's log lines that name the network (NCCL ranks only).", type: list, elements: str}
    nccl_expect: {description: "What the gate expects, transport (ib, none) and hcas.", type: dict}
    timings: {description: Seconds per phase., type: dict}
env:
  description: The node environment's NCCL_*, UCX_*, VLLM_HOST_IP, GLOO/TP_SOCKET_IFNAME and VLLM_CONFIG_ROOT.
  returned: always
  type: dict
non_carry_over:
  description: The names listed in O(non_carry_over_file); null when the file does not exist.
  returned: always
  type: list
  elements: str
non_carry_over_file:
  description: The file read.
  returned: always
  type: str
problems:
  description: This rank's own messages (the cluster's come from the role).
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds from the rank's start to its exit.
  returned: always
  type: float
exit_code:
  description: The rank's exit status (negative, a signal; 124, its own deadline).
  returned: always
  type: int
killed:
  description: The module killed the rank at the deadline.
  returned: always
  type: bool
stderr_tail:
  description: The last lines the rank wrote to stderr.
  returned: always
  type: str
fingerprint:
  description: This node's fingerprint (O(action=fingerprint)).
  returned: when O(action=fingerprint)
  type: str
versions:
  description: The runtime's torch, vLLM and Ray versions (null when not installed) (O(action=fingerprint)).
  returned: when O(action=fingerprint)
  type: dict
proof:
  description:
    - The proof in O(proof_file) with its age in seconds (C(age_s), from the file's modification time); null
      when there is none (O(action=fingerprint)).
  returned: when O(action=fingerprint)
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_versions
from ansible_collections.multinode.vllm.plugins.module_utils._nccl_log import busbw_problem
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import (
    MINIMAL_BASE,
    RendezvousError,
    nccl_transport,
    node_fingerprint,
    parse_env_file,
    parse_proof,
    parse_non_carry_over,
    rank_environment,
    rank_problems,
    returned_env,
)
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous_run import (
    default_non_carry_over_file,
    run_rank,
)
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _runtime_versions(module: AnsibleModule, interpreter: list[str], env: dict[str, str]) -> dict:
    rc, out, err = module.run_command(script_argv(interpreter, _node_versions), environ_update=env)
    if rc != 0:
        module.fail_json(msg="%s: the runtime interpreter %s cannot start (rc %d): %s" % (
            module.params["host"], " ".join(interpreter), rc, (err or out).strip()[-400:]))
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        module.fail_json(msg="%s: unexpected output from %s: %r" % (module.params["host"], interpreter, out[-400:]))
        raise  # unreachable; fail_json exits


def _fingerprint(module: AnsibleModule, env_text: str, nco_text, env: dict[str, str]) -> None:
    p = module.params
    versions = _runtime_versions(module, p["interpreter"], env)
    proof = None
    try:
        proof = parse_proof(_read(p["proof_file"]))
        if proof is not None:
            proof["age_s"] = round(time.time() - os.stat(p["proof_file"]).st_mtime, 1)
    except OSError:
        proof = None
    module.exit_json(changed=False, fingerprint=node_fingerprint(p, env_text, nco_text, versions),
                     versions=versions, proof=proof)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            rank=dict(type="int", required=True),
            world_size=dict(type="int", required=True),
            head_host=dict(type="str", required=True),
            head_fabric_ip=dict(type="str", required=True),
            fabric_ip=dict(type="str", required=True),
            fabric_interface=dict(type="str", required=True),
            port=dict(type="int", default=29600),
            env_file=dict(type="path", default="/etc/multinode-vllm/node.env"),
            interpreter=dict(type="list", elements="str", required=True),
            base_env=dict(type="dict", default={}),
            backend=dict(type="str", choices=["auto", "gloo", "nccl"], default="auto"),
            local_rank=dict(type="int", default=0),
            timeout=dict(type="float", default=60.0),
            size_mib=dict(type="float", default=64.0),
            iterations=dict(type="int", default=5),
            check_get_ip=dict(type="bool", default=True),
            nccl_expect_transport=dict(type="str", choices=["ib", "none"], default="none"),
            nccl_expect_hcas=dict(type="list", elements="str", default=[]),
            min_busbw_gbps=dict(type="float", default=0.0),
            non_carry_over_file=dict(type="path"),
            report_only=dict(type="bool", default=False),
            action=dict(type="str", choices=["run", "fingerprint"], default="run"),
            proof_file=dict(type="path", default="/var/lib/multinode-vllm/preflight/distributed.json"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    host = p["host"]
    if not 0 <= p["rank"] < p["world_size"]:
        module.fail_json(msg="%s: rank %d is outside 0..%d (world_size %d)" % (
            host, p["rank"], p["world_size"] - 1, p["world_size"]))
    if not p["interpreter"]:
        module.fail_json(msg="%s: interpreter must name the runtime's python; got []" % host)
    if p["timeout"] <= 0:
        module.fail_json(msg="%s: timeout must be positive; got %s" % (host, p["timeout"]))
    if p["min_busbw_gbps"] < 0:
        module.fail_json(msg="%s: min_busbw_gbps must be 0 (off) or a bandwidth in GB/s; got %s" % (
            host, p["min_busbw_gbps"]))
    if p["nccl_expect_transport"] == "ib" and not p["nccl_expect_hcas"]:
        module.fail_json(msg="%s: nccl_expect_transport is ib but nccl_expect_hcas is empty; give the fabric port's "
                             "RDMA ports (multinode_fabric.hca_ports, e.g. [rocep1s0f1:1, roceP2p1s0f1:1]) or set "
                             "nccl_expect_transport to none" % host)
    try:
        env_text = _read(p["env_file"])
        env = parse_env_file(env_text, p["env_file"])
    except FileNotFoundError:
        module.fail_json(msg="%s: the node environment file %s does not exist; the runtime role renders it "
                             "(multinode.vllm.fabric_node_env) before the preflight runs" % (host, p["env_file"]))
    except (OSError, RendezvousError) as exc:
        module.fail_json(msg="%s: cannot read the node environment file %s: %s" % (host, p["env_file"], exc))

    nco_path = p["non_carry_over_file"] or default_non_carry_over_file(env)
    nco_text = None
    try:
        nco_text = _read(nco_path)
        non_carry_over = parse_non_carry_over(nco_text, nco_path)
    except FileNotFoundError:
        non_carry_over = None
    except (OSError, RendezvousError) as exc:
        module.fail_json(msg="%s: %s" % (host, exc))

    base = dict(MINIMAL_BASE)
    base.update({str(k): str(v) for k, v in p["base_env"].items()})
    if p["action"] == "fingerprint":
        _fingerprint(module, env_text, nco_text, rank_environment(env, base))
    try:
        run = run_rank(p, rank_environment(env, base))
    except RendezvousError as exc:
        module.fail_json(msg=str(exc))
    problems = rank_problems(run["result"], host, p["fabric_interface"], p["timeout"])
    if run["result"] is not None and not run["result"].get("ok") and run["result"].get("error"):
        problems.append("%s: rank %d failed in phase %s: %s" % (
            host, p["rank"], run["result"].get("error_phase"), run["result"]["error"]))
    elif run["result"] is None and run["stderr_tail"]:
        problems.append("%s: %s" % (host, run["stderr_tail"].splitlines()[-1]))
    if run["result"] is not None and run["result"].get("ok") and not p["report_only"]:
        parsed = nccl_transport(run["result"])
        slow = busbw_problem(dict(run["result"].get("bandwidth") or {}, host=host, ranks=p["world_size"])
                             if run["result"].get("bandwidth") else None, p["min_busbw_gbps"],
                             {host: parsed} if parsed is not None else {}, {}, {host: env}, p["size_mib"])
        if slow:
            problems.append(slow)
    out = dict(
        changed=False,
        env=returned_env(env),
        non_carry_over=non_carry_over,
        non_carry_over_file=nco_path,
        problems=problems,
        **run,
    )
    ok = run["result"] is not None and run["result"].get("ok") and not problems
    if not ok and not p["report_only"]:
        module.fail_json(msg="\n".join(problems) or "%s: the preflight rank failed" % host, **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
