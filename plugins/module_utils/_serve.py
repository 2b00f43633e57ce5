# Copyright (c) multinode.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM serve: command lines, sizing checks, readiness evaluation, failure causes.

- ``serve_args``: the ``vllm serve`` argument list for backend ``ray`` (head
  only, Ray executor) or ``native`` (every node, ``--nnodes``/``--node-rank``,
  ranks above 0 ``--headless``).
- ``check_parallel``: tensor * pipeline parallel size against nodes and GPUs.
- ``serve_env_words``: the ``/usr/bin/env KEY=VALUE`` words of vllm serve
  (its settings, then ``vllm_env``), every key and value checked.
- ``health_ok`` / ``models_list`` / ``completion_result``: readiness stages.
- ``meaningful_line`` / ``likely_cause``: what a log tail says, mapped to the
  failure table of the networking reference (signature -> cause -> fix).
- ``first_exception``: the root-cause exception of a log (the first traceback's
  exception line: a worker's traceback comes before the engine's summary).
- ``rendezvous_check``: native backend, did every rank connect to the head's
  fabric address (the connections: ``_proc_net.parse_proc_net_tcp``).

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from ansible_collections.multinode.vllm.plugins.module_utils._checks import is_env_key, port_number
from ansible_collections.multinode.vllm.plugins.module_utils._errors import MultinodeError
from ansible_collections.multinode.vllm.plugins.module_utils._text import one_line_error

BACKENDS = ("ray", "native")


class ServeError(MultinodeError):
    """A serve setting or state that is wrong; the message is what the user sees."""


@dataclass(frozen=True)
class ServeSettings:
    model: str
    served_model_name: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    api_host: str = ""
    api_port: int = 8000
    max_model_len: Optional[int] = None
    dtype: str = ""
    gpu_memory_utilization: Optional[float] = None
    extra_args: Sequence[str] = field(default_factory=tuple)
    master_port: int = 29500


def _positive(value: Any, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ServeError("%s must be a positive integer; got %r" % (what, value))
    if number < 1:
        raise ServeError("%s must be at least 1; got %d" % (what, number))
    return number


def _port(value: Any, what: str) -> str:
    number = _positive(value, what)
    if port_number(number) is None:
        raise ServeError("%s must be between 1 and 65535; got %d" % (what, number))
    return str(number)


# Flags the collection sets itself; extra args may not repeat them.
_OWNED_FLAGS = (
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--distributed-executor-backend",
    "--host", "--port", "--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless",
    "--served-model-name",
)


def check_parallel(backend: str, tensor_parallel_size: Any, pipeline_parallel_size: Any, nodes: Any,
                   gpus_per_node: Mapping[str, Any]) -> int:
    """Validate T*P against the nodes and their GPUs; returns the world size.

    ``gpus_per_node`` maps host -> GPUs it offers (for Ray: what it advertises).
    """
    if backend not in BACKENDS:
        raise ServeError("vllm_backend %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    tp = _positive(tensor_parallel_size, "tensor_parallel_size")
    pp = _positive(pipeline_parallel_size, "pipeline_parallel_size")
    n = _positive(nodes, "the number of nodes")
    world = tp * pp
    gpus = {h: _positive(g, "GPUs of %s" % h) for h, g in sorted(gpus_per_node.items())}
    total = sum(gpus.values())
    shown = ", ".join("%s=%d" % (h, g) for h, g in gpus.items())
    if world > total:
        raise ServeError(
            "tensor_parallel_size * pipeline_parallel_size = %d * %d = %d, but the %d nodes have %d GPUs (%s); "
            "lower the parallel sizes or add nodes" % (tp, pp, world, n, total, shown)
        )
    if backend == "native":
        if world % n:
            raise ServeError(
                "backend native runs one vllm serve per node and needs the world size (tensor * pipeline = %d) "
                "to be a multiple of the number of nodes (%d); change the sizes or the inventory" % (world, n)
            )
        per_node = world // n
        short = ["%s=%d" % (h, g) for h, g in gpus.items() if g < per_node]
        if short:
            raise ServeError(
                "backend native places %d ranks on each of the %d nodes, but these have fewer GPUs: %s; "
                "lower the parallel sizes" % (per_node, n, ", ".join(short))
            )
    elif world < total and world < n:
        # Not an error: Ray places the ranks where the GPUs are. Said by the caller if wanted.
        pass
    return world


def serve_args(
    backend: str,
    settings: ServeSettings,
    nnodes: int = 1,
    node_rank: int = 0,
    head_fabric_ip: str = "",
) -> list[str]:
    """Arguments after ``vllm`` for this node (``serve <model> ...``)."""
    if backend not in BACKENDS:
        raise ServeError("vllm_backend %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    if not settings.model:
        raise ServeError("no model given; set vllm_model to a path on every node or a model id")
    # Every value below becomes a word of a supervisor section or a systemd unit: one line, no NUL.
    named = [("vllm_model", settings.model), ("vllm_served_model_name", settings.served_model_name),
             ("vllm_api_host", settings.api_host), ("vllm_dtype", settings.dtype)]
    named += [("vllm_extra_args[%d]" % i, arg) for i, arg in enumerate(settings.extra_args)]
    for variable, value in named:
        error = one_line_error(variable, value)
        if error:
            raise ServeError(error)
    for arg in settings.extra_args:
        name = str(arg).split("=", 1)[0]
        if name in _OWNED_FLAGS:
            raise ServeError(
                "vllm_extra_args sets %s, which the collection sets itself from the inventory and the serve "
                "variables; use the matching vllm_* variable instead" % name
            )
    tp = _positive(settings.tensor_parallel_size, "tensor_parallel_size")
    pp = _positive(settings.pipeline_parallel_size, "pipeline_parallel_size")
    args = ["serve", settings.model]
    rank = int(node_rank)
    headless = backend == "native" and rank > 0
    if settings.served_model_name and not headless:
        args += ["--served-model-name", settings.served_model_name]
    args += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if backend == "ray":
        args += ["--distributed-executor-backend", "ray"]
    else:
        n = _positive(nnodes, "nnodes")
        if not 0 <= rank < n:
            raise ServeError("node rank %d is outside 0..%d" % (rank, n - 1))
        if not head_fabric_ip:
            raise ServeError("backend native needs the head's fabric address for --master-addr")
        args += [
            "--nnodes", str(n), "--node-rank", str(rank),
            "--master-addr", head_fabric_ip, "--master-port", _port(settings.master_port, "master_port"),
        ]
    if headless:
        args.append("--headless")
    else:
        if not settings.api_host:
            raise ServeError("no API address given for the head (vllm_api_host)")
        args += ["--host", settings.api_host, "--port", _port(settings.api_port, "api_port")]
    if settings.max_model_len:
        args += ["--max-model-len", str(_positive(settings.max_model_len, "max_model_len"))]
    if settings.dtype:
        args += ["--dtype", settings.dtype]
    if settings.gpu_memory_utilization is not None:
        value = float(settings.gpu_memory_utilization)
        if not 0 < value <= 1:
            raise ServeError("gpu_memory_utilization must be in (0, 1]; got %s" % value)
        args += ["--gpu-memory-utilization", "%g" % value]
    args += [str(a) for a in settings.extra_args]
    return args


def env_prefix(env: Mapping[str, Any], variable: str = "the serve environment") -> list[str]:
    """``KEY=VALUE`` words for ``/usr/bin/env`` (serve-only settings), sorted; a None value leaves its key out.

    GNU env reads a word starting with '-' before the first ``KEY=VALUE`` as an option (``--split-string``
    runs a shell) and splits a word at its first '=', so a key must be a plain variable name.
    """
    words = []
    for key in sorted(env, key=str):
        if not is_env_key(str(key)):
            raise ServeError(
                "%s has the key %r, which is not a valid environment variable name: expected letters, digits and '_', "
                "not starting with a digit (/usr/bin/env would read a key starting with '-' as an option and a "
                "key holding '=' as part of its value); rename or remove it" % (variable, key)
            )
        value = env[key]
        if value is None:
            continue
        error = one_line_error("%s[%s]" % (variable, key), value)
        if error:
            raise ServeError(error)
        words.append("%s=%s" % (key, value))
    return words


def serve_env_words(
    cache_root: str,
    ray_address: str = "",
    hf_home: str = "",
    hf_offline: bool = False,
    extra: Optional[Mapping[str, Any]] = None,
) -> list[str]:
    """The ``/usr/bin/env`` words of vllm serve: its own settings, then ``vllm_env`` (which may replace them).

    The only builder of these words: each key and value is checked and the message names its variable.
    """
    for variable, value in (("vllm_cache_root", cache_root), ("vllm_hf_home", hf_home)):
        error = one_line_error(variable, value)
        if error:
            raise ServeError(error)
    env: dict[str, Any] = {"VLLM_CACHE_ROOT": cache_root}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    if hf_home:
        env["HF_HOME"] = hf_home
    if hf_offline:
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    extra = dict(extra or {})
    env_prefix(extra, "vllm_env")  # checked under its own name before the merge
    env.update(extra)
    return env_prefix(env)


# ---------------------------------------------------------------------------
# readiness
# ---------------------------------------------------------------------------

STAGES = ("starting", "health", "models", "completion", "ready")


def _json(body: Any) -> Any:
    if isinstance(body, (dict, list)):
        return body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        return json.loads(body or "")
    except ValueError:
        return None


def health_ok(status: Optional[int]) -> bool:
    return status == 200


def models_list(body: Any) -> list[str]:
    """Model ids that /v1/models lists (an empty list for anything else)."""
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return []
    return [str(m.get("id")) for m in data["data"] if isinstance(m, dict) and m.get("id") is not None]


def completion_result(body: Any) -> dict[str, Any]:
    """Text and token counts of a /v1/completions answer; raises ServeError if it has none."""
    data = _json(body)
    if not isinstance(data, dict):
        raise ServeError("the completion answer is not JSON: %r" % (str(body)[:200],))
    if "error" in data and not data.get("choices"):
        raise ServeError("the completion failed: %s" % json.dumps(data["error"])[:300])
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict) or "text" not in choices[0]:
        raise ServeError("the completion answer has no choices[0].text: %s" % json.dumps(data)[:300])
    usage = data.get("usage") or {}
    text = str(choices[0]["text"])
    return {
        "text": text,
        "finish_reason": choices[0].get("finish_reason"),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
    }


def tokens_per_second(tokens: int, seconds: float) -> float:
    return round(tokens / seconds, 2) if seconds > 0 else 0.0


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


# ---------------------------------------------------------------------------
# native backend: did each rank reach the rendezvous over the fabric?
# ---------------------------------------------------------------------------


def rendezvous_check(host: str, rank: int, conns: Sequence[Mapping[str, Any]], own_fabric_ip: str,
                     head_fabric_ip: str, head_mgmt_ip: str = "", master_port: Optional[int] = None) -> Optional[str]:
    """None if this rank is connected to the head over the fabric; else what is wrong.

    Rank 0 (the head) must accept connections on its fabric address from the
    other ranks; a rank above 0 must hold established connections from its
    fabric address to the head's fabric address, and none to the head's
    management address. ``conns`` are the serve processes' sockets.
    """
    est = [c for c in conns if c.get("state") == "ESTABLISHED"]
    if rank == 0:
        inbound = [c for c in est if c["local"] == own_fabric_ip and c["remote"] != own_fabric_ip]
        if not inbound:
            return ("%s (rank 0): no other rank is connected to the head's fabric address %s"
                    % (host, own_fabric_ip))
        return None
    wrong = [c for c in est if head_mgmt_ip and c["remote"] == head_mgmt_ip]
    if wrong:
        return ("%s (rank %d): connected to the head's management address %s (port %d), not the fabric; "
                "set --master-addr and VLLM_HOST_IP to the head's fabric address %s"
                % (host, rank, head_mgmt_ip, wrong[0]["remote_port"], head_fabric_ip))
    to_head = [c for c in est if c["remote"] == head_fabric_ip]
    if not to_head:
        return ("%s (rank %d): no established connection to the head's fabric address %s; the rank did not "
                "reach the rendezvous" % (host, rank, head_fabric_ip))
    off = [c for c in to_head if c["local"] != own_fabric_ip]
    if off:
        return ("%s (rank %d): connects to %s from %s, not from its fabric address %s"
                % (host, rank, head_fabric_ip, off[0]["local"], own_fabric_ip))
    if master_port is not None and not any(c["remote_port"] == int(master_port) for c in to_head):
        return ("%s (rank %d): connected to the head's fabric address but not to the rendezvous port %d"
                % (host, rank, int(master_port)))
    return None
