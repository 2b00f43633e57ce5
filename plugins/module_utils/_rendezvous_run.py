# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Distributed preflight: run one rank on this node (the module's I/O side).

``run_rank`` starts the node's runtime interpreter on the node script
``_node_rendezvous_rank`` (``_scripts.script_argv``) in a new session, waits
for it until the deadline plus a grace period, and kills the rank's whole
process group when it overruns (hence
``subprocess.Popen`` with ``start_new_session``: ``run_command`` cannot kill a
process group at a deadline). ``default_non_carry_over_file`` is where vLLM
reads ``ray_non_carry_over_env_vars.json`` under the node's environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Mapping

from ansible_collections.multinode.vllm.plugins.module_utils import _node_rendezvous_rank
from ansible_collections.multinode.vllm.plugins.module_utils._env import NON_CARRY_OVER_FILE
from ansible_collections.multinode.vllm.plugins.module_utils._rendezvous import RendezvousError, parse_rank_output
from ansible_collections.multinode.vllm.plugins.module_utils._scripts import script_argv

# Time the module gives the rank after the deadline to print its last line and exit.
GRACE = 3.0


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_rank(params: dict, env: dict[str, str]) -> dict:
    size = int(float(params["size_mib"]) * 1024 * 1024)
    started = time.time()
    config = {
        "host": params["host"],
        "rank": params["rank"],
        "world_size": params["world_size"],
        "head_ip": params["head_fabric_ip"],
        "port": params["port"],
        "fabric_ip": params["fabric_ip"],
        "fabric_interface": params["fabric_interface"],
        "backend": params["backend"],
        "local_rank": params["local_rank"],
        "deadline": started + params["timeout"],
        "timeout": params["timeout"],
        "size_bytes": size,
        "iterations": params["iterations"],
        "warmup": 1,
        "check_get_ip": params["check_get_ip"],
        "nccl_expect": {"transport": params.get("nccl_expect_transport") or "none",
                        "hcas": list(params.get("nccl_expect_hcas") or [])},
    }
    argv = script_argv(params["interpreter"], _node_rendezvous_rank, json.dumps(config))
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        raise RendezvousError("%s: cannot start the runtime interpreter %s: %s" % (
            params["host"], params["interpreter"], exc))
    killed = False
    try:
        stdout, stderr = proc.communicate(timeout=params["timeout"] + GRACE)
    except subprocess.TimeoutExpired:
        killed = True
        _kill_group(proc)
        stdout, stderr = proc.communicate()
    finally:
        # The rank's own children (none expected) go with its session.
        if proc.poll() is None:
            _kill_group(proc)
    result = parse_rank_output(stdout or "")
    if result is not None and killed and not result.get("final"):
        result["error"] = "killed at the %g s deadline in phase %s" % (params["timeout"], result.get("phase"))
        result["error_phase"] = result.get("phase")
    return {
        "result": result,
        "killed": killed,
        "exit_code": proc.returncode,
        "elapsed": round(time.time() - started, 3),
        "stderr_tail": "\n".join((stderr or "").splitlines()[-30:]),
    }


def default_non_carry_over_file(env: Mapping[str, str]) -> str:
    """$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json from the node environment, else ~/.config/vllm/..."""
    return os.path.join(env.get("VLLM_CONFIG_ROOT") or os.path.expanduser("~/.config/vllm"), NON_CARRY_OVER_FILE)
