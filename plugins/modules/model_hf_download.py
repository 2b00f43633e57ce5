#!/usr/bin/python
# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
module: model_hf_download
short_description: Download a Hugging Face model snapshot once, on the head, showing its progress
version_added: 0.1.0
description:
  - Runs C(huggingface_hub.snapshot_download) of O(repo_id) with the node runtime's python O(python). A snapshot
    already complete in the cache is reported unchanged, without a download.
  - The token reaches the download only from O(token_file), a file of C(HF_TOKEN='...') lines (mode 0600) that the
    download's shell sources when it starts. It is in no argument and no environment of the task, so the task
    need not be C(no_log). Every text the module returns is redacted of the token's value and of anything shaped
    like a token.
  - Before downloading, the revision's file list and sizes are asked from the Hub (honouring O(allow_patterns) and
    O(revision)); a cache without room for what is missing fails the task before a byte is downloaded.
  - The action plugin of the same name starts the download in the background (O(job=start)) and runs the module
    again every O(progress_interval) seconds (O(job=status)), printing a line with the bytes and files in the
    cache, the rate and an ETA, then a summary line. A failure names its cause (gated repo, bad or missing token,
    unknown repo or revision, offline mode, no network, disk full) and the variable that fixes it.
  - A download still running from an interrupted play is watched, not started again.
author:
  - multinode.vllm maintainers (@multinode)
extends_documentation_fragment:
  - multinode.vllm.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the snapshot is in the cache and, if not, how many files and bytes would be
      downloaded (the Hub is asked for the file list); downloads nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A snapshot complete in the cache is not downloaded again.
options:
  host:
    description: This host's inventory name (used in messages and progress lines).
    type: str
    required: true
  repo_id:
    description: The Hugging Face repo id, C(owner/name).
    type: str
    required: true
  revision:
    description: Branch, tag or commit; empty for the repo's default branch.
    type: str
    default: ""
  cache_dir:
    description: The Hugging Face cache directory; empty for huggingface_hub's default (C(HF_HUB_CACHE)).
    type: str
    default: ""
  allow_patterns:
    description: Only files matching one of these glob patterns; empty for every file.
    type: list
    elements: str
    default: []
  offline:
    description: Set C(HF_HUB_OFFLINE=1); only a snapshot already in the cache is used.
    type: bool
    default: false
  endpoint:
    description: The Hub's address (C(HF_ENDPOINT)), for a mirror; empty for huggingface_hub's default.
    type: str
    default: ""
  token_file:
    description:
      - A file of C(HF_TOKEN='...') lines, mode 0600, that the download sources when it starts (omit for no
        token). The module reads it too, to redact the token from what it returns.
    type: path
  python:
    description: The node runtime's python, the one with huggingface_hub.
    type: str
    required: true
  state_dir:
    description: Where the download job keeps its state (C(<state_dir>/hf-download), mode 0700).
    type: path
    default: /var/lib/multinode-vllm/model-transfer
  job:
    description:
      - V(run) downloads and returns when done. V(start) starts the download in a detached process and returns
        at once; V(status) returns its progress (C(job_state=running)) or, once it ended, its result. The action
        plugin of the same name uses V(start) and V(status) when O(progress_interval) is above 0.
    type: str
    choices: [run, start, status]
    default: run
  progress_interval:
    description: Seconds between two progress lines on the controller (the action plugin); 0 runs the download
      in one module run, without progress lines.
    type: float
    default: 5
"""

EXAMPLES = r"""
- name: Download the model once on the head, with progress lines every 10 s
  multinode.vllm.model_hf_download:
    host: "{{ inventory_hostname }}"
    repo_id: Qwen/Qwen2.5-0.5B-Instruct
    python: /opt/multinode-vllm/venv/bin/python
    token_file: /etc/multinode-vllm/hf-token.env
    progress_interval: 10
  register: snapshot
"""

RETURN = r"""
snapshot:
  description: The snapshot directory in the cache (links into its C(blobs/)).
  returned: success, not check mode, or check mode when cached
  type: str
cached:
  description: Whether the snapshot was complete in the cache already (nothing was downloaded).
  returned: success
  type: bool
token:
  description: Whether a token reached the download (never the token itself).
  returned: success
  type: bool
commit:
  description: The commit the revision resolved to (when the Hub was asked).
  returned: success, when not cached
  type: str
bytes:
  description: Bytes downloaded by this run.
  returned: success, when downloaded
  type: int
files:
  description: Files downloaded by this run.
  returned: success, when downloaded
  type: int
seconds:
  description: How long the download took.
  returned: success, when downloaded
  type: float
would_download:
  description: Check mode; C(files) and C(bytes) missing from the cache.
  returned: check mode, when not cached
  type: dict
kind:
  description: The cause of a failure (C(gated), C(repo), C(revision), C(auth), C(forbidden), C(rate_limit),
    C(hub_error), C(offline), C(network), C(proxy), C(disk), C(permission), C(no_hub), C(no_python), C(crashed),
    C(error)).
  returned: failure
  type: str
job_state:
  description: V(job=start) C(started); V(job=status) C(running) (with C(progress)), C(done) or C(lost).
  returned: job is start or status
  type: str
progress:
  description: V(job=status) while running; C(t) (the node's monotonic clock), C(bytes_done), C(bytes_total),
    C(files_done), C(files_total), or C(phase) before the file list is known.
  returned: job is status and the download runs
  type: dict
"""

import os
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.vllm.plugins.module_utils import _node_hf_download
from ansible_collections.multinode.vllm.plugins.module_utils._hf import download_result, redact_all
from ansible_collections.multinode.vllm.plugins.module_utils._jobs import JobError, claim, job_state, start_job, write_json
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv
from ansible_collections.multinode.vllm.plugins.module_utils._secrets import SOURCE_ARGV, parse_secret_env, redact

WHAT = "Hugging Face download"
STDERR_KEPT = 16384


def _request(p: dict) -> dict:
    """What is downloaded; a running job with the same request is adopted. No secret in it."""
    return {"repo_id": p["repo_id"], "revision": p["revision"], "cache_dir": p["cache_dir"],
            "allow_patterns": list(p["allow_patterns"]), "endpoint": p["endpoint"], "offline": p["offline"],
            "python": p["python"], "token": bool(p["token_file"])}


def _secrets(p: dict) -> list:
    """The token file's values, to redact them from what is returned (the file is root's, mode 0600)."""
    if not p["token_file"]:
        return []
    try:
        with open(p["token_file"]) as handle:
            return [v for v in parse_secret_env(handle.read()).values() if v]
    except OSError:
        return []


def _command(p: dict, job_dir: str) -> list:
    """The download's argv: no secret in it (the token file's path only)."""
    program = script_argv([p["python"]], _node_hf_download, job_dir)
    return list(SOURCE_ARGV) + [p["token_file"]] + program if p["token_file"] else program


def _environment(p: dict) -> dict:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1" if p["offline"] else "0"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # the progress is measured from the cache; bars only fill the log
    if p["endpoint"]:
        env["HF_ENDPOINT"] = p["endpoint"]
    return env


def download(p: dict, job_dir: str, check: bool, secrets: list) -> dict:
    """Run the download (or only its plan, ``check``) to its end; the module's result, redacted."""
    request = _request(p)
    write_json(os.path.join(job_dir, _node_hf_download.REQUEST), dict(request, check=check))
    log = os.path.join(job_dir, "output.log")
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as output:
        try:
            returncode = subprocess.run(_command(p, job_dir), env=_environment(p), stdin=subprocess.DEVNULL,
                                        stdout=output, stderr=subprocess.STDOUT, cwd="/", check=False).returncode
        except OSError as exc:  # the python (no token file: exec'd directly) is missing
            output.write(str(exc).encode())
            returncode = 127
    with open(log, "rb") as handle:  # the tail only, and nothing left on disk afterwards
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - STDERR_KEPT))
        printed = handle.read().decode("utf-8", "replace")
    os.unlink(log)
    outcome = _node_hf_download.read_json(os.path.join(job_dir, _node_hf_download.OUTCOME))
    result = download_result(p["host"], request, outcome, returncode, printed, secrets)
    if outcome is not None:
        os.unlink(os.path.join(job_dir, _node_hf_download.OUTCOME))
    return result


def status(p: dict, job_dir: str) -> dict:
    state, job = job_state(job_dir)
    if state == "none":
        return {"failed": True, "job_state": "none",
                "msg": "%s: no %s was started in %s" % (p["host"], WHAT, job_dir)}
    if state == "done":  # redacted by the job already; again, with the token file as it is now
        return redact_all(dict(job["result"], job_state="done"), _secrets(p))
    if state == "lost":
        return {"failed": True, "job_state": "lost", "kind": "crashed",
                "msg": "%s: the %s (pid %s) ended without a result (killed? out of memory?); run again (files "
                       "already in the cache are kept)" % (p["host"], WHAT, job.get("pid"))}
    plan = _node_hf_download.read_json(os.path.join(job_dir, _node_hf_download.PLAN))
    if not isinstance(plan, dict):
        progress = {"phase": "checking the cache and asking the Hub for the files of %s" % p["repo_id"]}
    else:
        progress = dict(_node_hf_download.measure(plan, plan.get("ignore", [])), phase="downloading")
    progress["t"] = time.monotonic()
    return {"changed": False, "job_state": "running", "progress": progress, "pid": job.get("pid")}


def run(module: AnsibleModule) -> dict:
    p = module.params
    job_dir = os.path.join(p["state_dir"], "hf-download")
    if p["job"] == "status":
        return status(p, job_dir)
    if p["token_file"] and not os.path.isfile(p["token_file"]):
        return {"failed": True, "msg": "%s: the token file %s is missing; the role writes it from model_hf_token "
                                       "before the download" % (p["host"], p["token_file"])}
    secrets = _secrets(p)
    if module.check_mode:  # the plan only, in a directory of its own: nothing is left in state_dir
        with tempfile.TemporaryDirectory(prefix="multinode-vllm-hf-check-") as scratch:
            return download(p, scratch, True, secrets)
    if p["job"] == "run":
        claim(job_dir, WHAT)
        return download(p, job_dir, False, secrets)
    job = start_job(job_dir, WHAT, {"request": _request(p)}, lambda: download(p, job_dir, False, secrets), adopt=True)
    return {"changed": False, "job_state": "started", "pid": job["pid"], "adopted": job["adopted"],
            "started": job["started"]}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", default=""),
            cache_dir=dict(type="str", default=""),
            allow_patterns=dict(type="list", elements="str", default=[]),
            offline=dict(type="bool", default=False),
            endpoint=dict(type="str", default=""),
            token_file=dict(type="path"),
            python=dict(type="str", required=True),
            state_dir=dict(type="path", default="/var/lib/multinode-vllm/model-transfer"),
            job=dict(type="str", choices=["run", "start", "status"], default="run"),
            progress_interval=dict(type="float", default=5),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except (JobError, OSError, ValueError) as exc:
        module.fail_json(msg=redact("%s: %s" % (module.params["host"], exc), _secrets(module.params)))
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
