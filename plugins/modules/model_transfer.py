#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: model_transfer
short_description: Copy model files from the head to the workers over the fabric, verified and resumable
version_added: 0.1.0
description:
  - Mode V(serve) (head) binds a short-lived sender to the head's fabric address O(fabric_ip) and O(port) and
    serves from a detached process. It serves only the files in O(files), only to the fabric addresses in
    O(peers) (any other address is refused before a byte is read), only to a client that presents O(token)
    (random per run), a bounded number of connections per peer. It exits once every peer is done and none of
    their connections is open, when stopped, or after O(lifetime) seconds.
  - Mode V(pull) (worker) connects from this host's fabric address O(fabric_ip) to the sender at O(server_ip),
    fetches each file in O(files) into C(<file>.partial) (resuming from the bytes already there; a link, a
    non-regular file or a partial locked by another puller there is refused, naming it), hashes the
    bytes as they arrive, and renames the file into place only when its sha256 matches the manifest. The hash
    cache of M(multinode.vllm.model_manifest) is updated for the received files, so the next comparison does not
    read them again.
  - Mode V(stop) (head) stops the sender through a unix socket private to the host's network namespace and
    returns what it served to which peer address. Nothing listens afterwards.
  - Mode V(local) materialises O(src) (symlinks resolved to real files; a Hugging Face snapshot) into O(path) on
    the same host, hard-linking where both are on one filesystem.
  - No node-to-node credentials are created; the token is the only secret and lives as long as the sender.
  - "The action plugin of the same name shows a V(pull)'s progress while it runs, every O(progress_interval)
    seconds, on the controller; for example C(spark2: model pull 37.2/119.0 GiB, 12/41 files, 1.9 GiB/s, ETA 43 s),
    then a summary line. It starts the pull in a detached process on the worker (O(job=start)) and runs the
    module again with O(job=status), which measures the files renamed into place and the bytes in their
    C(.partial) files."
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
    details: V(pull) and V(local) report the files they would write and write nothing; V(serve) starts nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: V(pull) is given only the files a host lacks; V(local) skips files already in place.
options:
  mode:
    description: V(serve), V(pull), V(stop) or V(local).
    type: str
    choices: [serve, pull, stop, local]
    required: true
  host:
    description: This host's inventory name (used in messages).
    type: str
    required: true
  path:
    description: The model directory (served from, or written to).
    type: path
  src:
    description: V(local) only; the directory to materialise into O(path).
    type: path
  fabric_ip:
    description: This host's fabric address (V(serve) binds to it; V(pull) connects from it).
    type: str
  server_ip:
    description: V(pull) only; the head's fabric address.
    type: str
  port:
    description: TCP port of the sender on the head's fabric address.
    type: int
    default: 29510
  token:
    description: The one-time secret the sender requires (V(serve), V(pull)). Never logged.
    type: str
  files:
    description: The manifest entries to serve (V(serve)) or fetch (V(pull)).
    type: list
    elements: dict
    default: []
  peers:
    description: V(serve) only; the workers allowed to connect, each C(host) and C(fabric_ip).
    type: list
    elements: dict
    default: []
  lifetime:
    description: V(serve) only; upper bound on the sender's life in seconds.
    type: float
    default: 7200
  state_dir:
    description: Where the sender leaves its summary for V(stop), and a background V(pull) its job
      (C(<state_dir>/pull-<port>), mode 0700).
    type: path
    default: /var/lib/multinode-vllm/model-transfer
  cache_dir:
    description: V(pull) only; the hash cache of M(multinode.vllm.model_manifest), updated for received files.
    type: path
    default: /var/lib/multinode-vllm/manifest-cache
  streams:
    description: V(pull) only; parallel connections per worker, 1 to 16 (the sender's limit per worker).
    type: int
    default: 1
  timeout:
    description: Seconds a connection may stall before the transfer fails (it resumes on the next run).
    type: float
    default: 60
  fsync:
    description: V(pull) only; flush each file to disk before renaming it into place.
    type: bool
    default: true
  job:
    description:
      - V(pull) only. V(run) pulls and returns when done. V(start) starts the pull in a detached process on this
        host and returns at once; V(status) returns its progress (C(job_state=running)) or, once it ended, its result.
        The action plugin of the same name uses V(start) and V(status) when O(progress_interval) is above 0 (not in
        check mode).
    type: str
    choices: [run, start, status]
    default: run
  progress_interval:
    description: V(pull) only; seconds between two progress lines on the controller (the action plugin); 0 pulls
      in one module run, without progress lines.
    type: float
    default: 5
"""

EXAMPLES = r"""
- name: Start the sender on the head's fabric address
  multinode.vllm.model_transfer:
    mode: serve
    host: "{{ inventory_hostname }}"
    path: /var/lib/multinode-vllm/models/llama
    fabric_ip: "{{ multinode_fabric.ip }}"
    token: "{{ token }}"
    files: "{{ needed_entries }}"
    peers: [{host: spark2, fabric_ip: 198.18.200.13}]
  no_log: true

- name: Pull from the head over the fabric, a progress line every 10 s
  multinode.vllm.model_transfer:
    mode: pull
    host: "{{ inventory_hostname }}"
    path: /var/lib/multinode-vllm/models/llama
    fabric_ip: "{{ multinode_fabric.ip }}"
    server_ip: 198.18.200.12
    token: "{{ token }}"
    files: "{{ needed_entries }}"
    progress_interval: 10
  no_log: true
"""

RETURN = r"""
pid:
  description: V(serve); pid of the detached sender.
  returned: mode is serve and not check mode
  type: int
received:
  description: V(pull); per file C(path), C(offset) (resumed from), C(bytes), C(seconds), C(sha256).
  returned: mode is pull
  type: list
  elements: dict
would_receive:
  description: V(pull) in check mode; the paths that would be fetched.
  returned: mode is pull and check mode
  type: list
  elements: str
bytes:
  description: V(pull); bytes received this run.
  returned: mode is pull
  type: int
mib_per_s:
  description: V(pull); throughput of this host's transfer.
  returned: mode is pull
  type: float
local_address:
  description: V(pull); the address this host's connections came from (its fabric address).
  returned: mode is pull
  type: str
server:
  description: V(pull); the sender's address and port.
  returned: mode is pull
  type: str
stopped:
  description: V(stop); whether a sender was running.
  returned: mode is stop
  type: bool
summary:
  description: "V(stop); what the sender served: C(served) (C(peer), C(host), C(path), C(offset), C(bytes)),
    C(peers) (the addresses it served), C(denied) (addresses refused), C(busy) (connections refused over a peer's
    limit), C(errors) (connection errors, at most 20), C(done), C(bytes), C(reason)."
  returned: mode is stop
  type: dict
written:
  description: V(local); the paths written (or that would be).
  returned: mode is local
  type: list
  elements: str
job_state:
  description: V(pull) with V(job=start) C(started); with V(job=status) C(running) (with C(progress)), C(done)
    (with the pull's result) or C(lost).
  returned: mode is pull and job is start or status
  type: str
progress:
  description: V(pull) with V(job=status) while it runs; C(t) (the node's monotonic clock), C(bytes_done),
    C(bytes_total), C(files_done), C(files_total).
  returned: mode is pull, job is status and the pull runs
  type: dict
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils._jobs import JobError, job_state, start_job
from ansible_collections.multinode.vllm.plugins.module_utils._manifest import (
    ManifestError,
    check_manifest,
    load_cache,
    save_cache,
)
from ansible_collections.multinode.vllm.plugins.module_utils._transfer import (
    TransferError,
    copy_tree,
    final_inodes,
    pull_files,
    pull_progress,
    spawn_sender,
    stop_sender,
)

WHAT = "model pull"


def _message(host: str, exc: BaseException) -> str:
    message = str(exc)
    return message if message.startswith(host + ":") else "%s: %s" % (host, message)


def pull(p: dict, entries: list) -> dict:
    """Pull ``entries`` and record their hashes in the cache; the module's result."""
    result = pull_files(p["server_ip"], p["port"], p["token"], p["fabric_ip"], p["host"], p["path"], entries,
                        streams=p["streams"], timeout=p["timeout"], fsync=p["fsync"])
    cache = load_cache(p["cache_dir"], p["path"])
    for item in result["received"]:
        cache[item["path"]] = dict(item.pop("stat"), sha256=item["sha256"])
    save_cache(p["cache_dir"], p["path"], cache)
    result["changed"] = bool(result["received"])
    return result


def pull_job_dir(p: dict) -> str:
    return os.path.join(p["state_dir"], "pull-%d" % p["port"])


def start_pull(p: dict, entries: list) -> dict:
    """Start the pull in a detached process (``_jobs.start_job``); what the status runs measure is recorded."""
    def work() -> dict:
        try:
            return pull(p, entries)
        except (TransferError, ManifestError, OSError, ValueError) as exc:
            return {"failed": True, "msg": _message(p["host"], exc)}

    sizes = [{"path": str(e["path"]), "size": int(e["size"])} for e in entries]
    record = {"root": p["path"], "entries": sizes, "inodes": final_inodes(p["path"], [e["path"] for e in sizes])}
    job = start_job(pull_job_dir(p), WHAT, record, work)
    return {"changed": False, "job_state": "started", "pid": job["pid"], "started": job["started"]}


def pull_status(p: dict) -> dict:
    job_dir = pull_job_dir(p)
    state, job = job_state(job_dir)
    if state == "none":
        return {"failed": True, "job_state": "none", "msg": "%s: no %s was started in %s" % (p["host"], WHAT, job_dir)}
    if state == "done":
        return dict(job["result"], job_state="done")
    if state == "lost":
        return {"failed": True, "job_state": "lost",
                "msg": "%s: the %s (pid %s) ended without a result (killed? out of memory?); the bytes received so far "
                       "stay in the .partial files: run again to resume" % (p["host"], WHAT, job.get("pid"))}
    record = job["record"]
    progress = dict(pull_progress(record["root"], record["entries"], record["inodes"]), t=time.monotonic())
    return {"changed": False, "job_state": "running", "progress": progress, "pid": job.get("pid")}


def run(module: AnsibleModule) -> dict:
    p = module.params
    mode = p["mode"]
    if mode == "stop":
        stopped, summary = stop_sender(p["port"], p["state_dir"])
        return {"changed": False, "stopped": stopped, "summary": summary}
    if mode == "local":
        written = copy_tree(p["src"], p["path"], dry_run=module.check_mode)
        return {"changed": bool(written), "written": written}
    entries = check_manifest({"files": p["files"]})
    if mode == "serve":
        if module.check_mode:
            return {"changed": False, "msg": "check mode: the sender is not started"}
        peers = {str(peer["fabric_ip"]): str(peer["host"]) for peer in p["peers"]}
        pid = spawn_sender(p["fabric_ip"], p["port"], p["path"], [str(e["path"]) for e in entries], p["token"],
                           peers, p["lifetime"], p["state_dir"])
        return {"changed": False, "pid": pid}
    # pull
    if module.check_mode:
        return {"changed": bool(entries), "would_receive": [str(e["path"]) for e in entries], "received": [],
                "bytes": 0}
    if p["job"] == "status":
        return pull_status(p)
    if not entries:
        return {"changed": False, "received": [], "bytes": 0}
    if p["job"] == "start":
        return start_pull(p, entries)
    return pull(p, entries)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["serve", "pull", "stop", "local"], required=True),
            host=dict(type="str", required=True),
            path=dict(type="path"),
            src=dict(type="path"),
            fabric_ip=dict(type="str"),
            server_ip=dict(type="str"),
            port=dict(type="int", default=29510),
            token=dict(type="str", no_log=True),
            files=dict(type="list", elements="dict", default=[]),
            peers=dict(type="list", elements="dict", default=[]),
            lifetime=dict(type="float", default=7200),
            state_dir=dict(type="path", default="/var/lib/multinode-vllm/model-transfer"),
            cache_dir=dict(type="path", default="/var/lib/multinode-vllm/manifest-cache"),
            streams=dict(type="int", default=1),
            timeout=dict(type="float", default=60),
            fsync=dict(type="bool", default=True),
            job=dict(type="str", choices=["run", "start", "status"], default="run"),
            progress_interval=dict(type="float", default=5),
        ),
        required_if=[
            ("mode", "serve", ("path", "fabric_ip", "token")),
            ("mode", "pull", ("path", "fabric_ip", "server_ip", "token")),
            ("mode", "local", ("path", "src")),
        ],
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except (TransferError, ManifestError, JobError, OSError, ValueError) as exc:
        module.fail_json(msg=_message(module.params["host"], exc))
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
