#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: doctor_collect
short_description: Read everything doctor diagnoses on this node in one run, each part on its own
version_added: 0.1.0
description:
  - One run per node reads every part C(playbooks/doctor.yml) needs, in the shape C(_diagnosis) reads
    (C(docs/doctor.md)) - C(system) (kernel, OS); C(network) (interfaces, addresses, MTU, link state and speed, RDMA
    ports with their GID tables), C(routes) and C(fabric) (the fabric selection, with the GID index the fabric address
    maps to); C(env_file) (the NCCL, Gloo, UCX, TP and MASTER keys of the node's env files); C(ray_node) (the raylet,
    its C(VLLM_HOST_IP), vllm serve); C(ray_table) (Ray's node table, with O(ray_address) only, normally on the
    head); C(stack) (Python, Ray, vLLM, torch, NCCL, CUDA runtime, driver, image IDs); C(listeners) (judged as the
    bind audit judges them); C(firewall) (C(nft list ruleset)); C(processes); C(memory) (MemAvailable, page cache,
    GPUs and unified memory where C(nvidia-smi) answers); C(disk) (free space of O(model_dir)); C(logs) (the last
    O(lines) lines of each of O(logs)); C(nccl) (the NCCL transport lines the last distributed preflight recorded).
  - A part that fails records its error under C(errors) and the others still run; the module itself never fails
    the host, so a node where Ray or vLLM is absent, nft is missing or the runtime's interpreter cannot start still
    reports everything else.
  - Secrets never leave the node in clear - every value of O(secret_files) (read here, never returned), every value
    held under a secret-looking key and every token-shaped string is replaced by C(<redacted>) before the result is
    returned; command lines come with secret flags masked.
  - Read-only.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
  - multinode.vllm.attributes.READ_ONLY
options:
  host:
    description: This host's inventory name (used in messages); default the node's hostname.
    type: str
  fabric_cidr:
    description: The fabric subnet; without it C(fabric) is not chosen (the raw C(network) is still read).
    type: str
  fabric_ip:
    description: The address this host must carry on the fabric (from host_vars).
    type: str
  fabric_interface:
    description: The interface to use when several carry fabric addresses.
    type: str
  interpreter:
    description:
      - The runtime's python as an argument list (C(/opt/venv/bin/python), or C(docker exec <container> python)),
        which reads C(stack) and, with O(ray_address), Ray's node table. Empty skips both.
    type: list
    elements: str
    default: []
  env_files:
    description: The node's env files, a later one winning (the C(node_env) role's C(node.env)).
    type: list
    elements: path
    default: []
  logs:
    description:
      - Log sources by kind (V(ray), V(vllm)); a path, V(docker:NAME) (C(docker logs) of a container) or
        V(journal:UNIT) (this boot's journal of a systemd unit).
    type: dict
    default: {}
  lines:
    description: Lines kept from the end of each log.
    type: int
    default: 200
  ray_address:
    description: The GCS address (C(<head fabric ip>:<port>)) whose node table to read; unset on every node but the head.
    type: str
  ray_timeout:
    description: Seconds the read of Ray's node table may take (connect included).
    type: float
    default: 5
  auth_token_file:
    description:
      - Ray's token file. Its state (exists, sha256, mode; never the token) is reported, the table is read with it,
        and its content is redacted from everything returned.
    type: path
  supervisord_pidfile:
    description: Pidfile of this node's supervisord (the C(process) runtime).
    type: path
    default: /run/multinode-vllm/supervisord.pid
  bind_allow:
    description: Listeners allowed off the fabric and loopback, as the bind audit's C(allow) (port, address, process).
    type: list
    elements: dict
    default: [{port: 22}]
  api_port:
    description:
      - The vLLM API port, allowed on O(api_host) (the head only; unset elsewhere), as the bind audit allows it.
    type: int
  api_host:
    description: The API's address; empty means this node's management address (the API host is the head).
    type: str
    default: ""
  nft_path:
    description: The nft program.
    type: str
    default: /usr/sbin/nft
  model_dir:
    description: The model directory whose filesystem's free space to report (its nearest existing parent when missing).
    type: path
  images:
    description: Images whose ID to add to C(stack) (the docker runtime; the first one is C(stack.image_id)).
    type: list
    elements: str
    default: []
  nccl_file:
    description: The distributed preflight's proof file, whose C(nccl_log) holds the NCCL lines of the last pass.
    type: path
  secret_files:
    description:
      - Files holding secrets (vllm serve's secret env file, Ray's token file). Read on the node only, to redact their
        values from what is returned; missing ones are skipped.
    type: list
    elements: path
    default: []
  nvidia_smi:
    description: The C(nvidia-smi) program (a name looked up in C(PATH), or a path).
    type: str
    default: nvidia-smi
  timeout:
    description: Seconds each command (the runtime's interpreter, nft, docker, journalctl) may take.
    type: float
    default: 15
  skip:
    description: Parts not to read.
    type: list
    elements: str
    default: []
    choices: [system, network, env_file, ray_node, ray_table, stack, listeners, firewall, processes, memory, disk, logs,
              nccl]
"""

EXAMPLES = r"""
- name: Read everything doctor needs on this node (one run)
  multinode.vllm.doctor_collect:
    host: "{{ inventory_hostname }}"
    fabric_cidr: 198.18.200.0/24
    fabric_ip: "{{ fabric_ip }}"
    interpreter: [/opt/multinode-vllm/venv/bin/python]
    env_files: [/etc/multinode-vllm/node.env]
    logs: {ray: /var/log/multinode-vllm/ray.log, vllm: /var/log/multinode-vllm/vllm.log}
    ray_address: "{{ '198.18.200.12:6379' if inventory_hostname in groups['ray_head'] else omit }}"
    auth_token_file: /etc/multinode-vllm/ray-auth-token
    model_dir: /var/lib/multinode-vllm/models
    secret_files: [/etc/multinode-vllm/vllm-api.env, /etc/multinode-vllm/ray-auth-token]
  register: collected
  ignore_unreachable: true
"""

RETURN = r"""
node:
  description: This node's part of doctor's collected facts (C(docs/doctor.md)), redacted; a part that could not be
    read is absent and named in C(errors).
  returned: always
  type: dict
  contains:
    system: {description: "Kernel, OS, hostname.", type: dict}
    network: {description: "Interfaces and RDMA ports with their GID tables (C(fabric_facts)' C(multinode_network)).", type: dict}
    routes: {description: "The IPv4 routes (C(ip -j -4 route show))", type: list, elements: dict}
    fabric: {description: "The fabric selection (C(fabric_facts)' C(multinode_fabric)); null with C(fabric_error) when none.", type: dict}
    env_file: {description: "The env files' NCCL, Gloo, UCX, TP and MASTER keys and VLLM_HOST_IP.", type: dict}
    ray_node: {description: "C(ray_node_facts)' C(multinode_ray_node).", type: dict}
    ray_table: {description: "With O(ray_address) - Ray's node table, C(nodes) (null when unread) and C(error).", type: dict}
    stack: {description: "C(stack_facts)' C(multinode_stack), with C(image_id) and C(images) under docker.", type: dict}
    listeners: {description: "The bind audit's listeners, judged (verdict, reason, message).", type: list, elements: dict}
    firewall: {description: "C(ruleset) (C(nft list ruleset); null with C(error) when unreadable).", type: dict}
    processes: {description: "This network namespace's processes (pid, ppid, name, cmdline with secrets masked).", type: list, elements: dict}
    memory: {description: "MemTotal, MemAvailable, MemFree, Cached, Buffers (bytes), GPUs, unified.", type: dict}
    disk: {description: "path, measured, free_bytes, total_bytes of the model directory's filesystem.", type: dict}
    logs: {description: "The last lines of each log, by kind.", type: dict}
    nccl: {description: "The NCCL transport lines of the last distributed preflight.", type: list, elements: str}
    errors: {description: "Part -> why it could not be read.", type: dict}
errors:
  description: Part -> why it could not be read (also in RV(node.errors)).
  returned: always
  type: dict
"""

import json
import os
import platform
import shutil
import socket
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_ray_reader, _node_versions
from ansible_collections.multinode.vllm.plugins.module_utils._bind_audit import audit, listeners, short_cmdline
from ansible_collections.multinode.vllm.plugins.module_utils._doctor import (
    MAX_PROCESSES,
    fabric_env,
    run_parts,
    secret_file_values,
)
from ansible_collections.multinode.vllm.plugins.module_utils._fabric import FabricError, parse_network, select_fabric
from ansible_collections.multinode.vllm.plugins.module_utils._log_tail import tail
from ansible_collections.multinode.vllm.plugins.module_utils._memory import (
    NVIDIA_SMI_QUERY,
    detect_unified,
    parse_gpu_query,
    parse_meminfo,
)
from ansible_collections.multinode.vllm.plugins.module_utils._nccl_log import kept_lines
from ansible_collections.multinode.vllm.plugins.module_utils._node_env_exec import parse_env_file
from ansible_collections.multinode.vllm.plugins.module_utils._procs import (
    node_state,
    own_netns,
    read_processes,
    token_file_state,
)
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import redact_data
from ansible_collections.multinode.vllm.plugins.module_utils._sysfs import read_network, run_ip

PARTS = ("system", "network", "env_file", "ray_node", "ray_table", "stack", "listeners", "firewall", "processes",
         "memory", "disk", "logs", "nccl")
# Parts run together once the fabric and Ray's state are known (each waits on a command or the runtime's Python).
WORKERS = 4


def run(argv: list[str], timeout: float, env: dict | None = None) -> str:
    """stdout of a command; raises naming the command when it cannot start, times out or fails."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env=dict(os.environ, **env) if env else None)
    except FileNotFoundError:
        raise OSError("%s: not found" % argv[0])
    except subprocess.TimeoutExpired:
        raise OSError("%s did not answer within %s s" % (" ".join(argv[:4]), timeout))
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip()[-400:]
        raise OSError("%s exited %d: %s" % (" ".join(argv[:4]), proc.returncode, why))
    return proc.stdout


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


class Collector:
    """The parts of one node, each a method returning node keys (``_doctor.run_parts`` isolates them)."""

    def __init__(self, params: dict, host: str):
        self.p = params
        self.host = host
        self.fabric: dict = {}

    def system(self) -> dict:
        uname = platform.uname()
        os_name = None
        try:
            for line in read_text("/etc/os-release").splitlines():
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
        except OSError:
            pass
        return {"system": {"kernel": uname.release, "os": os_name, "hostname": uname.node, "machine": uname.machine}}

    def network(self) -> dict:
        raw = read_network()
        out: dict = {"network": raw}
        try:
            out["routes"] = json.loads(run_ip(["-4", "route", "show"]) or "[]")
        except (OSError, ValueError, subprocess.CalledProcessError) as exc:
            out["routes_error"] = str(exc)
        if self.p["fabric_cidr"]:
            try:
                selection = select_fabric(self.host, parse_network(raw), self.p["fabric_cidr"],
                                          fabric_ip=self.p["fabric_ip"], fabric_interface=self.p["fabric_interface"],
                                          allow_link_down=True)
                out["fabric"] = self.fabric = selection.as_dict()
            except FabricError as exc:
                out["fabric"], out["fabric_error"] = None, str(exc)
        return out

    def env_file(self) -> dict:
        env: dict = {}
        missing = []
        for path in self.p["env_files"]:
            try:
                env.update(parse_env_file(read_text(path), path))
            except FileNotFoundError:
                missing.append(path)
        if missing and len(missing) == len(self.p["env_files"]):
            raise OSError("no env file: %s missing (the node environment was not rendered: playbooks/deploy.yml)"
                          % ", ".join(missing))
        return {"env_file": fabric_env(env), "env_file_missing": missing}

    def ray_node(self) -> dict:
        state = node_state(self.p["supervisord_pidfile"])
        if self.p["auth_token_file"]:
            state["auth_token_file"] = token_file_state(self.p["auth_token_file"])
        return {"ray_node": state}

    def ray_table(self, ray_node: dict | None) -> dict:
        if not self.p["ray_address"]:
            return {}
        if ray_node is not None and not ray_node.get("running"):
            # No raylet here: no GCS to read (a connect would only wait for the timeout).
            return {"ray_table": {"nodes": None, "error": "not read: no raylet runs on this node"}}
        if not self.p["interpreter"]:
            return {"ray_table": {"nodes": None, "error": "not read: no runtime interpreter"}}
        env = {}
        token = self.p["auth_token_file"]
        if token and os.path.isfile(token):
            env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token}
        timeout = float(self.p["ray_timeout"])
        out = run(script_argv(self.p["interpreter"], _node_ray_reader, self.p["ray_address"], str(timeout), "0", "0"),
                  timeout + 15, env)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            return {"ray_table": {"nodes": None, "error": "the reader printed nothing"}}
        data = json.loads(lines[-1])
        if data.get("error"):
            return {"ray_table": {"nodes": None, "ray_version": data.get("ray_version"),
                                  "error": "%s: %s" % (data["error"], data.get("detail"))}}
        return {"ray_table": {"nodes": data.get("nodes") or [], "ray_version": data.get("ray_version"),
                              "error": None}}

    def stack(self) -> dict:
        stack: dict = {}
        if self.p["interpreter"]:
            out = run(script_argv(self.p["interpreter"], _node_versions, "stack"), self.p["timeout"])
            stack = json.loads(out.strip().splitlines()[-1])
        images = {}
        for image in self.p["images"]:
            images[image] = run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                                self.p["timeout"]).strip()
        if images:
            stack["images"] = images
            stack["image_id"] = images[self.p["images"][0]]
        return {"stack": stack} if stack else {}

    def listeners(self) -> dict:
        fabric_ip = self.fabric.get("ip") or self.p["fabric_ip"]
        if not fabric_ip:
            found = listeners()
            for item in found:
                for proc in item["processes"]:
                    proc.pop("full_cmdline", None)
            return {"listeners": found}
        allow = list(self.p["bind_allow"])
        api_host = self.p["api_host"] or self.fabric.get("mgmt_ip")
        if self.p["api_port"] and api_host:
            allow.append({"address": api_host, "port": self.p["api_port"]})
        result = audit(fabric_ip, allow=allow, management_ip=self.fabric.get("mgmt_ip"), host=self.host)
        return {"listeners": result["listeners"]}

    def firewall(self) -> dict:
        try:
            return {"firewall": {"ruleset": run([self.p["nft_path"], "list", "ruleset"], self.p["timeout"]),
                                 "error": None}}
        except OSError as exc:
            return {"firewall": {"ruleset": None, "error": str(exc)}}

    def processes(self) -> dict:
        netns = own_netns()
        procs = sorted((p for p in read_processes() if p.netns == netns), key=lambda p: p.pid)
        return {"processes": [{"pid": p.pid, "ppid": p.ppid, "name": p.name, "cmdline": short_cmdline(p.cmdline)}
                              for p in procs[:MAX_PROCESSES]],
                "processes_total": len(procs)}

    def memory(self) -> dict:
        info = parse_meminfo(read_text("/proc/meminfo"))
        memory = {key: info.get(name) for key, name in (
            ("mem_total", "MemTotal"), ("mem_available", "MemAvailable"), ("mem_free", "MemFree"),
            ("cached", "Cached"), ("buffers", "Buffers"), ("swap_free", "SwapFree"))}
        program = self.p["nvidia_smi"]
        path = program if os.path.isabs(program) else shutil.which(program)
        if not path or not os.path.exists(path):
            memory.update(gpus=[], unified=False, unified_reason="no NVIDIA GPU (%s not found)" % program)
            return {"memory": memory}
        memory["gpus"] = parse_gpu_query(run([path] + list(NVIDIA_SMI_QUERY), self.p["timeout"]))
        memory["unified"], memory["unified_reason"] = detect_unified(memory["gpus"], memory["mem_total"])
        return {"memory": memory}

    def disk(self) -> dict:
        path = self.p["model_dir"]
        if not path:
            return {}
        measured = path
        while not os.path.exists(measured) and os.path.dirname(measured) != measured:
            measured = os.path.dirname(measured)
        stat = os.statvfs(measured)
        return {"disk": {"path": path, "measured": measured, "free_bytes": stat.f_bavail * stat.f_frsize,
                         "total_bytes": stat.f_blocks * stat.f_frsize}}

    def logs(self) -> dict:
        sources = {str(k): str(v) for k, v in self.p["logs"].items() if v}
        if not sources:
            return {}
        logs, unread = {}, {}
        for kind, source in sorted(sources.items()):
            lines = tail(source, self.p["lines"], self.p["timeout"])
            if len(lines) == 1 and lines[0].startswith("(cannot read "):
                # Not a log line: the diagnosis must not quote it as the program's last words.
                unread[kind], lines = lines[0].strip("()"), []
            logs[kind] = lines
        return {"logs": logs, "log_sources": sources, "logs_unread": unread}

    def nccl(self) -> dict:
        path = self.p["nccl_file"]
        if not path:
            return {}
        try:
            proof = json.loads(read_text(path))
        except FileNotFoundError:
            return {"nccl": [], "nccl_source": "%s: none (no distributed preflight passed with a proof here)" % path}
        lines = proof.get("nccl_log") if isinstance(proof, dict) else None
        return {"nccl": kept_lines(lines or []), "nccl_source": path}


def secrets_of(paths: list[str]) -> tuple[list[str], dict]:
    """(the values the secret files hold, errors of those that exist but cannot be read)."""
    values: list[str] = []
    errors = {}
    for path in paths:
        try:
            values.extend(secret_file_values(read_text(path)))
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors["secret_files"] = "%s: %s (its values may be left in the result; run as root)" % (
                path, exc.strerror or exc)
    return values, errors


def collect(params: dict, host: str) -> tuple[dict, dict]:
    """(the redacted node, errors): the fast parts first (the fabric and Ray's state, which others read), then the
    rest together."""
    skip = set(params["skip"])
    collector = Collector(params, host)
    first = [(name, getattr(collector, name)) for name in ("system", "network", "ray_node") if name not in skip]
    node, errors = run_parts(first)
    rest = [(name, getattr(collector, name)) for name in PARTS
            if name not in skip and name not in ("system", "network", "ray_node", "ray_table")]
    if "ray_table" not in skip:
        rest.insert(0, ("ray_table", lambda: collector.ray_table(node.get("ray_node"))))
    more, more_errors = run_parts(rest, workers=WORKERS)
    node.update(more)
    errors.update(more_errors)
    errors.update(("logs.%s" % kind, why) for kind, why in (node.pop("logs_unread", None) or {}).items())
    secrets, secret_errors = secrets_of(params["secret_files"])
    errors.update(secret_errors)
    node["errors"] = errors
    redacted = redact_data(node, secrets)
    return dict(redacted) if isinstance(redacted, dict) else {}, dict(redacted.get("errors") or {})


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str"),
            fabric_cidr=dict(type="str"),
            fabric_ip=dict(type="str"),
            fabric_interface=dict(type="str"),
            interpreter=dict(type="list", elements="str", default=[]),
            env_files=dict(type="list", elements="path", default=[]),
            logs=dict(type="dict", default={}),
            lines=dict(type="int", default=200),
            ray_address=dict(type="str"),
            ray_timeout=dict(type="float", default=5),
            auth_token_file=dict(type="path", no_log=False),
            supervisord_pidfile=dict(type="path", default="/run/multinode-vllm/supervisord.pid"),
            bind_allow=dict(type="list", elements="dict", default=[{"port": 22}]),
            api_port=dict(type="int"),
            api_host=dict(type="str", default=""),
            nft_path=dict(type="str", default="/usr/sbin/nft"),
            model_dir=dict(type="path"),
            images=dict(type="list", elements="str", default=[]),
            nccl_file=dict(type="path"),
            secret_files=dict(type="list", elements="path", default=[], no_log=False),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            timeout=dict(type="float", default=15),
            skip=dict(type="list", elements="str", default=[], choices=list(PARTS)),
        ),
        supports_check_mode=True,
    )
    host = module.params["host"] or socket.gethostname()
    node, errors = collect(module.params, host)
    module.exit_json(changed=False, node=node, errors=errors)


if __name__ == "__main__":
    main()
